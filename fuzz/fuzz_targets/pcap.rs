//! libFuzzer entry of the `pcap` target (see `ringway_fuzz::pcap`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ringway_fuzz::pcap(data));
