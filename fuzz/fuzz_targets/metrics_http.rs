//! libFuzzer entry of the `metrics_http` target (see `ringway_fuzz::metrics_http`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ringway_fuzz::metrics_http(data));
