//! libFuzzer entry of the `sfu_wire` target (see `ringway_fuzz::sfu_wire`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ringway_fuzz::sfu_wire(data));
