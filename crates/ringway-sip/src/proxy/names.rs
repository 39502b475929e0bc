//! Next hops that are names (RFC 3263), as the core reaches DNS: through
//! the driver's [`NameResolver`]. The core never waits for DNS:
//!
//! - a name whose every question is cached and fresh is answered at once
//!   ([`NameResolver::cached`], no thread switch);
//! - otherwise the request is parked: its datagram goes into a
//!   [`ResolvingRequest`] handed to [`NameResolver::submit`], which must not
//!   block (a full pending set refuses it: `503`, counted). The driver
//!   resolves it off the workers and calls [`ProxyWorker::resume_resolved`]
//!   with the answer (or a failure when it took too long): the request is
//!   handled again from the transaction match on, and the name step takes
//!   the answer instead of asking.
//!
//! What a name resolves to is a destination like any other: every address
//! is checked by the relay policy with the request's grant (a configured
//! `route_to` name is granted like an authenticated request's target, so
//! loopback, link-local and our own IP stay refused unless the relay
//! networks name them). The allowed addresses are the targets in RFC 3263
//! order: the first is tried, the next ones ([`MAX_TRIES`] in all) are the
//! stateful failover's ([`super::transaction`]).
//!
//! Request-URI and Route hosts that are names are resolved only when the
//! request could go to what they resolve to at all: the relay networks are
//! not `none`, or the request has a grant (authenticated, a signed route).
//! Otherwise the request goes to `route_to` as before (or 404): an
//! unauthenticated stranger cannot make us look names up.

use super::request_context::Request;
use super::stats::Counter;
use super::worker::ProxyWorker;
use super::{Outcome, QueueFull};
use crate::msg::SipMsg;
use crate::transport::{Hop, Transport};
use std::net::SocketAddr;

/// Targets of one name tried per request at most (the first and the
/// failovers).
pub const MAX_TRIES: usize = 4;

/// A name to resolve: a host with the port if one was given (then A/AAAA
/// only, RFC 3263 4.2), for a transport (its NAPTR service and SRV prefix).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct NameQuery {
    /// The host name (lower case, no trailing dot).
    pub host: String,
    /// The port, if given.
    pub port: Option<u16>,
    /// The transport the request goes over.
    pub transport: Transport,
}

impl NameQuery {
    /// A query for `host` (any case, a trailing dot allowed).
    pub fn new(host: &str, port: Option<u16>, transport: Transport) -> NameQuery {
        NameQuery {
            host: host.trim_end_matches('.').to_ascii_lowercase(),
            port,
            transport,
        }
    }
}

/// Why a name gave no address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NameError {
    /// The name has no address (NXDOMAIN, no records): `404`.
    NoAddress,
    /// The lookup failed, timed out, or the resolver was overloaded: `503`.
    Unavailable,
}

/// What a lookup gave: the addresses in the order to try them.
pub type NameAnswer = Result<Vec<SocketAddr>, NameError>;

/// A request parked until its next hop's name is resolved.
#[derive(Clone, Debug)]
pub struct ResolvingRequest {
    /// The name.
    pub query: NameQuery,
    /// When the request was received (monotonic ns, the worker's clock).
    pub received: u64,
    /// Where it came from.
    pub src: Hop,
    /// The datagram (parsed again on resumption).
    pub datagram: Vec<u8>,
}

/// The driver's DNS.
pub trait NameResolver: Send + Sync {
    /// The answer from the cache alone, now, or `None` when the name must
    /// be looked up. Must not block.
    fn cached(&self, query: &NameQuery) -> Option<NameAnswer>;
    /// Park `request` until its name is resolved, then have it resumed
    /// ([`ProxyWorker::resume_resolved`]); refuse it when the pending set
    /// is full (by count or bytes). Must not block.
    fn submit(&self, request: ResolvingRequest) -> Result<(), QueueFull>;
}

/// The name step's result.
pub(super) enum NameCall {
    /// The answer, now.
    Answered(NameAnswer),
    /// Parked: the request is resumed later.
    Parked,
}

impl ProxyWorker<'_> {
    /// Resolve `query` for `request`: from the resumption's answer, the
    /// cache, or by parking the request with the driver.
    pub(super) fn name_call(&mut self, request: &Request<'_>, query: NameQuery) -> NameCall {
        if let Some((asked, answer)) = self.resolved_name.take() {
            // Resumed: never park twice; the same datagram asks the same.
            return NameCall::Answered(if asked == query {
                answer
            } else {
                Err(NameError::Unavailable)
            });
        }
        if self.resuming_name {
            return NameCall::Answered(Err(NameError::Unavailable));
        }
        let Some(resolver) = self.proxy().names.as_ref() else {
            return NameCall::Answered(Err(NameError::Unavailable));
        };
        if let Some(answer) = resolver.cached(&query) {
            return NameCall::Answered(answer);
        }
        let parked = ResolvingRequest {
            query,
            received: request.now,
            src: request.from,
            datagram: request.msg.datagram().to_vec(),
        };
        match resolver.submit(parked) {
            Ok(()) => {
                self.stripe.add(Counter::NamesParked);
                NameCall::Parked
            }
            Err(QueueFull) => NameCall::Answered(Err(NameError::Unavailable)),
        }
    }

    /// Finish a request parked on a name: `answer` is what the name
    /// resolved to (or [`NameError::Unavailable`] when the lookup failed or
    /// took too long), `now` the current time. Output goes to `out` as
    /// with [`ProxyWorker::handle_from`].
    pub fn resume_resolved(
        &mut self,
        request: &ResolvingRequest,
        answer: NameAnswer,
        now: u64,
        out: &mut dyn FnMut(Hop, &[u8]),
    ) -> Outcome {
        self.resolved_name = Some((request.query.clone(), answer));
        self.resuming_name = true;
        let outcome = match SipMsg::parse(&request.datagram) {
            Ok(msg) if msg.is_request() => self.request_outcome(now, request.src, &msg, out),
            _ => Outcome {
                label: super::MsgLabel::Malformed,
                action: self.drop_datagram(super::DropReason::MalformedRequest),
            },
        };
        self.resolved_name = None;
        self.resuming_name = false;
        outcome
    }
}

/// The answer a failed name gets, and the counter it goes to.
pub(super) fn failure_status(error: NameError) -> (u16, &'static str, Counter) {
    match error {
        NameError::NoAddress => (404, "Not Found - No Address For Name", Counter::NamesFailed),
        NameError::Unavailable => (
            503,
            "Service Unavailable - Name Not Resolved",
            Counter::NamesUnavailable,
        ),
    }
}
