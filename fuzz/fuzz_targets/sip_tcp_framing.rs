//! libFuzzer entry of the `sip_tcp_framing` target (see `ringway_fuzz::sip_tcp_framing`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ringway_fuzz::sip_tcp_framing(data));
