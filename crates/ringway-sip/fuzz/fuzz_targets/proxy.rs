//! Fuzz the proxy core: a sequence of datagrams (split on 0xFF) through a
//! stateful and a stateless proxy with timers between them
//! (invariants in `ringway_sip::invariants::proxy_sequence`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    ringway_sip::invariants::proxy_sequence(data);
});
