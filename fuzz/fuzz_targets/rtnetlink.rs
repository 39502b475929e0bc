//! libFuzzer entry of the `rtnetlink` target (see `ringway_fuzz::rtnetlink`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ringway_fuzz::rtnetlink(data));
