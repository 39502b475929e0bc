//! libFuzzer entry of the `sip_dispatch` target (see `ringway_fuzz::sip_dispatch`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ringway_fuzz::sip_dispatch(data));
