//! libFuzzer entry of the `sip_proxy` target (see `ringway_fuzz::sip_proxy`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ringway_fuzz::sip_proxy(data));
