//! libFuzzer's entry for [`awareness_fuzz::transcript_line`].
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let _ = awareness_fuzz::transcript_line::run(data);
});
