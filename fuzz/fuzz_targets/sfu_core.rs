//! libFuzzer entry of the `sfu_core` target (see `ringway_fuzz::sfu_core`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ringway_fuzz::sfu_core(data));
