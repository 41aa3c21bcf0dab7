//! libFuzzer's entry for [`awareness_fuzz::upstream_markers`].
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let _ = awareness_fuzz::upstream_markers::run(data);
});
