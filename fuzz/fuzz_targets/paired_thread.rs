//! libFuzzer's entry for [`awareness_fuzz::paired_thread`].
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let _ = awareness_fuzz::paired_thread::run(data);
});
