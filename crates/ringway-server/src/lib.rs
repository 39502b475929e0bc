//! ringway-server: the drivers that run ringway's sans-IO protocol cores
//! over its batch datagram I/O — the glue tier, as the `quinn` crate is for
//! `quinn-proto` and `quinn-udp`, or `Interface::poll` for smoltcp.
//!
//! - [`sip`]: the multi-threaded SIP proxy/registrar server
//!   ([`sip::SipServer`]: worker threads over a shared or SO_REUSEPORT
//!   socket, a timer thread, per-message K_rcv / T_sip / K_snd metrics) and
//!   its per-batch seam [`sip::SipWorker::drive_batch`]; [`sip::location`]
//!   is the registrar's location store when several proxies share it
//!   ([`sip::location::RedisStore`]) and the store threads that keep its
//!   waits off the workers.
//! - [`dispatch`]: the SIP dispatcher in front of several proxies
//!   ([`dispatch::DispatchServer`]: workers and a probe thread).
//! - [`dns`]: next hops given as names (RFC 3263 NAPTR/SRV/A/AAAA on
//!   resolver threads, a TTL cache).
//! - [`sfu`]: the pktswitch SFU engine ([`sfu::serve`]).
//! - [`reorder`]: SRPIC in front of the host's TCP over NFQUEUE
//!   ([`reorder::nfqueue::run`], `ringway reorder nfqueue`).
//! - [`metrics`]: latency histograms and percentiles, Prometheus text, a
//!   tiny HTTP server for `/metrics`.
//! - [`admin_http`]: bounded HTTP/1.x for management APIs (bearer token,
//!   deadline and size per connection); the SFU's admin API uses it.
//! - [`host`]: what the servers need from the host: CPU time, CPU lists,
//!   thread placement, the SIGINT/SIGTERM stop flag.
//!
//! Protocol logic stays in `ringway-sip`, `ringway-sfu` and
//! `ringway-reorder`; sockets and `unsafe` stay in `ringway-io`. Nothing
//! here parses command lines: front ends build the configuration structs
//! (they are plain data with `serde::Deserialize`).

#![forbid(unsafe_code)]

pub mod admin_http;
pub mod build;
pub mod dispatch;
pub mod dns;
pub mod error;
#[doc(hidden)]
pub mod fuzzing;
pub mod host;
pub mod manage;
pub mod metrics;
pub mod reorder;
pub mod sfu;
pub mod sip;

pub use error::ServerError;
