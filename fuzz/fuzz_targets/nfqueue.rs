//! libFuzzer entry of the `nfqueue` target (see `ringway_fuzz::nfqueue`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ringway_fuzz::nfqueue(data));
