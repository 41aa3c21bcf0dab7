//! libFuzzer's entry for [`awareness_fuzz::core_fit`].
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let _ = awareness_fuzz::core_fit::run(data);
});
