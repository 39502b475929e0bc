//! libFuzzer entry of the `sip_ws` target (see `ringway_fuzz::sip_ws`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ringway_fuzz::sip_ws(data));
