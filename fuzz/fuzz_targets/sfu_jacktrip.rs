//! libFuzzer entry of the `sfu_jacktrip` target (see `ringway_fuzz::sfu_jacktrip`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ringway_fuzz::sfu_jacktrip(data));
