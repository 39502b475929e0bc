//! libFuzzer entry of the `dns_response` target (see `ringway_fuzz::dns_response`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ringway_fuzz::dns_response(data));
