//! The per-request context: a received request and what every handling
//! step (routing, authentication, registrar, stateful forwarding) needs
//! to know about it, built once when a request arrives (`request.rs`).

use super::branch::RequestKeys;
use crate::msg::{Method, SipMsg};
use std::net::SocketAddr;

/// A received request and what every handling step needs to know about it.
pub(super) struct Request<'m> {
    /// Receive time (ns).
    pub(super) now: u64,
    /// The datagram's source address.
    pub(super) src: SocketAddr,
    /// Where our responses go ([`super::routing::upstream_address`]).
    pub(super) upstream: SocketAddr,
    pub(super) msg: &'m SipMsg<'m>,
    /// Its method (`Other("")` only if the parser let one through without).
    pub(super) method: Method<'m>,
    pub(super) keys: RequestKeys,
}
