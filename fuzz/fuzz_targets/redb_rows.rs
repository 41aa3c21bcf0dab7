//! libFuzzer's entry for [`awareness_fuzz::redb_rows`].
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let _ = awareness_fuzz::redb_rows::run(data);
});
