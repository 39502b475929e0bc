//! ringway-load: the traffic generators, in the role of quinn's `perf` crate.
//!
//! * [`sip`]: `ringway sip load`, a SIP call generator whose user agent
//!   ([`sip::CallGen`]) is sans-IO, driven by socket workers; the seeded
//!   whole-system simulation in `tests/sim.rs` runs it against the proxy core.
//! * [`sfu`]: `ringway sfu client` / `ringway sfu load`, N registered RTP
//!   sources with their receivers, measuring loss, reordering and delay.
//!
//! The generators are products (they have their own commands) and the
//! lab's experiments use them; they depend on the cores and on
//! `ringway-server` (host helpers, latency summaries), never on the lab.

#![forbid(unsafe_code)]

pub mod sfu;
pub mod sip;
