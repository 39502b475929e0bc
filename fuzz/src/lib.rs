//! ringway's fuzz targets: one function per target, taking the fuzzer's
//! bytes and panicking when the code under test breaks an invariant.
//!
//! The same functions run in two ways:
//! - coverage-guided, as libFuzzer targets (`fuzz_targets/*.rs`, built by
//!   `cargo fuzz` on the stable toolchain with `--sanitizer none`; see
//!   `scripts/fuzz.sh` and DEVELOPERS.md "Fuzzing");
//! - as ordinary tests (`tests/corpus.rs`), replaying every saved input of
//!   `fuzz/corpus/<target>/`, crash reproducers included.
//!
//! Targets reach the code through public APIs (and a few
//! `#[doc(hidden)]` entry points for private parsers), so moving a file
//! inside a crate does not break them.

mod capture;
mod sfu;
mod sip;

pub use capture::{nfqueue, pcap};
pub use sfu::{sfu_core, sfu_jacktrip, sfu_recording, sfu_token, sfu_wire};
pub use sip::{sip_digest, sip_dispatch, sip_parse, sip_proxy};

/// A Redis reply (RESP bytes) through the location store's reply parser.
pub fn redis_reply(data: &[u8]) {
    ringway_server::fuzzing::redis_reply(data);
}

/// A `/metrics` HTTP request head through its router.
pub fn metrics_http(data: &[u8]) {
    ringway_server::fuzzing::metrics_request(data);
}

/// A fuzz target's function.
pub type Target = fn(&[u8]);

/// Every target: name (the `fuzz_targets/` binary and the `corpus/`
/// directory) and function.
pub const TARGETS: [(&str, Target); 13] = [
    ("sip_parse", sip_parse),
    ("sip_digest", sip_digest),
    ("sip_proxy", sip_proxy),
    ("sip_dispatch", sip_dispatch),
    ("sfu_wire", sfu_wire),
    ("sfu_core", sfu_core),
    ("sfu_jacktrip", sfu_jacktrip),
    ("sfu_token", sfu_token),
    ("sfu_recording", sfu_recording),
    ("pcap", pcap),
    ("nfqueue", nfqueue),
    ("redis_reply", redis_reply),
    ("metrics_http", metrics_http),
];
