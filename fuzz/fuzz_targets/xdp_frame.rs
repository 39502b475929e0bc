//! libFuzzer entry of the `xdp_frame` target (see `ringway_fuzz::xdp_frame`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ringway_fuzz::xdp_frame(data));
