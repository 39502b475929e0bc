//! libFuzzer entry of the `sip_ws_client` target (see `ringway_fuzz::sip_ws_client`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ringway_fuzz::sip_ws_client(data));
