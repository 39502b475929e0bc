//! libFuzzer entry of the `sfu_recording` target (see `ringway_fuzz::sfu_recording`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ringway_fuzz::sfu_recording(data));
