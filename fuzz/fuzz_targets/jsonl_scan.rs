//! libFuzzer's entry for [`awareness_fuzz::jsonl_scan`].
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let _ = awareness_fuzz::jsonl_scan::run(data);
});
