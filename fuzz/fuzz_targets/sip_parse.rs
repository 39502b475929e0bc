//! libFuzzer entry of the `sip_parse` target (see `ringway_fuzz::sip_parse`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ringway_fuzz::sip_parse(data));
