//! libFuzzer entry of the `sip_digest` target (see `ringway_fuzz::sip_digest`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ringway_fuzz::sip_digest(data));
