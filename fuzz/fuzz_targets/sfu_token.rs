//! libFuzzer entry of the `sfu_token` target (see `ringway_fuzz::sfu_token`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ringway_fuzz::sfu_token(data));
