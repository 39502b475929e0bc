//! Fuzz the parser, every accessor, and the forwarding editor
//! (invariants in `ringway_sip::invariants::parse_and_edit`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    ringway_sip::invariants::parse_and_edit(data);
});
