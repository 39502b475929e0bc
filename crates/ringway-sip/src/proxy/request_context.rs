//! The per-request context: a received request and what every handling
//! step (routing, authentication, registrar, stateful forwarding) needs
//! to know about it, built once when a request arrives (`request.rs`).

use super::branch::RequestKeys;
use crate::msg::{Method, SipMsg};
use crate::transport::Hop;
use std::net::SocketAddr;

/// A received request and what every handling step needs to know about it.
pub(super) struct Request<'m> {
    /// Receive time (ns).
    pub(super) now: u64,
    /// The datagram's source address.
    pub(super) src: SocketAddr,
    /// Where it came from (`src` with its transport and connection).
    pub(super) from: Hop,
    /// Where our responses go ([`super::routing::upstream_address`]): the
    /// address that identifies the upstream client (MACs, CANCEL matching).
    pub(super) upstream: SocketAddr,
    /// The hop our responses go over ([`super::worker::reply_hop`]).
    pub(super) reply: Hop,
    pub(super) msg: &'m SipMsg<'m>,
    /// Its method (`Other("")` only if the parser let one through without).
    pub(super) method: Method<'m>,
    pub(super) keys: RequestKeys,
}
