//! libFuzzer entry of the `redis_reply` target (see `ringway_fuzz::redis_reply`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ringway_fuzz::redis_reply(data));
