//! libFuzzer's entry for [`awareness_fuzz::sqlite_rows`].
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let _ = awareness_fuzz::sqlite_rows::run(data);
});
