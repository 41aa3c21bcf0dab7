//! libFuzzer's entry for [`awareness_fuzz::jsonl_scan`].
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| awareness_fuzz::jsonl_scan::run(data));
