//! The proxy core: stateless and transaction-stateful forwarding, loose
//! routing with Record-Route, registrar, and RFC 3261 request validation.
//!
//! One [`Proxy`] is shared (`Arc`) by all worker threads; every method takes
//! `&self`. Transactions live in hash-sharded tables behind mutexes. No I/O:
//! [`Proxy::handle`] and [`Proxy::on_timer`] emit datagrams through the `out`
//! callback (destination always an IP literal), and the caller drives timers
//! with [`Proxy::next_deadline`]. The `out` callback must not call back into
//! the same `Proxy` (it may run while a shard lock is held).
//!
//! Routing choices (no DNS is ever done):
//! - next hop = first remaining Route (if its host is an IP literal), else
//!   the Request-URI host if it is an IP literal and not ours, else the
//!   registrar binding for a Request-URI at our domain, else `route_to`;
//! - if none applies the request gets `404 Not Found` (RFC 3261 21.4.5: the
//!   domain is not one we handle and we cannot resolve it);
//! - responses go to the next Via's `received`/`rport`/sent-by; a Via whose
//!   host is a name without `received` cannot be routed and is dropped;
//! - never sends to unspecified, broadcast or multicast addresses or port 0.
//! - Responses we generate go to the request's source address (port from
//!   the source when the top Via has `rport`, else the sent-by port).

use crate::edit::{
    build_response, forward_request, forward_response, EditError, RequestEdits, ViaEdit,
};
use crate::hash::Hash64;
use crate::msg::{HeaderKind, Method, ParseError, SipMsg, Via};
use crate::registrar::{LocationStore, MemoryStore};
use crate::uri::{host_ip, scheme, SipUri};
use serde::Serialize;
use std::cell::RefCell;
use std::cmp::Reverse;
use std::collections::BTreeMap;
use std::io::Write as _;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

mod branch;
mod config;
mod forward;
mod outcome;
mod register;
mod routing;
mod stateful;
mod stats;
mod timers;
mod transaction;

use branch::*;
pub use config::*;
pub use outcome::*;
pub use register::{DEFAULT_EXPIRES, MAX_EXPIRES};
pub use routing::sendable;
use routing::*;
use stateful::*;
pub use stats::ProxyStats;
use stats::*;
pub use timers::{T1, T2, T4, TIMER_64T1, TIMER_C};
use transaction::*;

/// The SIP proxy/registrar core.
pub struct Proxy {
    cfg: ProxyConfig,
    sent_by: String,
    rr_uri: String,
    secret: u64,
    store: Arc<dyn LocationStore>,
    shards: Box<[Mutex<Shard>]>,
    active: AtomicUsize,
    counters: Counters,
    last_expire: AtomicU64,
}

impl Proxy {
    /// A proxy with an in-memory location store of 100 000 bindings.
    pub fn new(cfg: ProxyConfig) -> Self {
        Self::with_store(cfg, Arc::new(MemoryStore::new(100_000)))
    }

    /// A proxy using `store` as location service.
    pub fn with_store(cfg: ProxyConfig, store: Arc<dyn LocationStore>) -> Self {
        let sent_by = cfg.local.to_string();
        let rr_uri = format!("sip:{sent_by};lr");
        let secret = Hash64::new(0x5EC2E7)
            .str(&sent_by)
            .str(&format!("{:?}", cfg.mode))
            .finish();
        Proxy {
            cfg,
            sent_by,
            rr_uri,
            secret,
            store,
            shards: (0..SHARDS).map(|_| Mutex::new(Shard::default())).collect(),
            active: AtomicUsize::new(0),
            counters: Counters::new(),
            last_expire: AtomicU64::new(0),
        }
    }

    /// Replace the branch-hash secret (e.g. random at start-up).
    pub fn set_secret(&mut self, secret: u64) {
        self.secret = secret;
    }

    /// The configuration.
    pub fn config(&self) -> &ProxyConfig {
        &self.cfg
    }

    /// The location store.
    pub fn store(&self) -> &Arc<dyn LocationStore> {
        &self.store
    }

    fn shard(&self, h: u64) -> &Mutex<Shard> {
        &self.shards[(h >> 58) as usize % SHARDS]
    }

    // ---------------------------------------------------------------- helpers
    /// (transaction hash, loop hash) for a request (RFC 3261 16.11, 16.6/8).
    fn keys(&self, msg: &SipMsg<'_>) -> (u64, u32) {
        let top = msg.top_via();
        let ruri = msg.request_uri().unwrap_or("");
        let from_tag = msg.from_tag().unwrap_or("");
        let call_id = msg.call_id().unwrap_or("");
        let cseq = msg.cseq().map_or(0, |c| c.0);
        let h = match top {
            Some(v) if v.has_cookie() => Hash64::new(self.secret)
                .str(v.branch.unwrap_or(""))
                .str(v.host)
                .u64(u64::from(v.port.unwrap_or(5060)))
                .finish(),
            _ => Hash64::new(self.secret)
                .str(ruri)
                .str(from_tag)
                .str(call_id)
                .u64(u64::from(cseq))
                .str(top.map_or("", |v| v.raw))
                .finish(),
        };
        let mut lh = Hash64::new(self.secret ^ 0x100F);
        lh.str(ruri)
            .str(from_tag)
            .str(msg.to_tag().unwrap_or(""))
            .str(call_id)
            .u64(u64::from(cseq));
        for p in msg.proxy_require() {
            lh.str(p);
        }
        (h, lh.finish() as u32)
    }

    fn respond(
        &self,
        req: &SipMsg<'_>,
        to: SocketAddr,
        code: u16,
        reason: &str,
        extra: &[(&str, &str)],
        out: &mut dyn FnMut(SocketAddr, &[u8]),
    ) -> Action {
        if req.method() == Some(Method::Ack) {
            self.counters.drop(DropReason::AckNotRoutable);
            return Action::Dropped(DropReason::AckNotRoutable);
        }
        if !sendable(&to) {
            self.counters.drop(DropReason::ForbiddenDestination);
            return Action::Dropped(DropReason::ForbiddenDestination);
        }
        let tag = Branch::new(
            Hash64::new(self.secret)
                .str(req.call_id().unwrap_or(""))
                .finish(),
            0,
        );
        let tag = &tag.as_str()[9..25];
        with_scratch(|buf| {
            build_response(req, code, reason, extra, Some(tag), buf);
            send(out, to, buf);
        });
        self.counters.code(code);
        Action::Responded(code)
    }

    // ---------------------------------------------------------------- entry

    /// Process one received datagram from `src` at time `now` (ns).
    pub fn handle(
        &self,
        now: u64,
        src: SocketAddr,
        datagram: &[u8],
        out: &mut dyn FnMut(SocketAddr, &[u8]),
    ) -> Outcome {
        match SipMsg::parse(datagram) {
            Ok(msg) if msg.is_request() => self.on_request(now, src, &msg, out),
            Ok(msg) => self.on_response(now, src, &msg, out),
            Err(e) => self.on_parse_error(src, datagram, e, out),
        }
    }

    fn on_parse_error(
        &self,
        src: SocketAddr,
        datagram: &[u8],
        e: ParseError,
        out: &mut dyn FnMut(SocketAddr, &[u8]),
    ) -> Outcome {
        let d = datagram
            .iter()
            .position(|&b| b != b'\r' && b != b'\n')
            .map_or(&[][..], |p| &datagram[p..]);
        if e == ParseError::Empty {
            self.counters.drop(DropReason::KeepAlive);
            return Outcome {
                label: MsgLabel::Malformed,
                action: Action::Dropped(DropReason::KeepAlive),
            };
        }
        if d.len() >= 4 && d[..4].eq_ignore_ascii_case(b"SIP/") {
            self.counters.drop(DropReason::MalformedResponse);
            return Outcome {
                label: MsgLabel::Malformed,
                action: Action::Dropped(DropReason::MalformedResponse),
            };
        }
        let loose = match SipMsg::parse_loose(datagram) {
            Ok(m) if m.raw_values(HeaderKind::Via).next().is_some() => m,
            _ => {
                self.counters.drop(DropReason::MalformedRequest);
                return Outcome {
                    label: MsgLabel::Malformed,
                    action: Action::Dropped(DropReason::MalformedRequest),
                };
            }
        };
        let label = loose
            .method()
            .map_or(MsgLabel::Malformed, MsgLabel::of_method);
        self.counters.inc(C::ReqIn);
        let reason = e.to_string();
        let to = Self::upstream_addr(src, loose.top_via().as_ref());
        if loose.method() == Some(Method::Ack) {
            // Never answer an ACK.
            self.counters.drop(DropReason::MalformedRequest);
            return Outcome {
                label,
                action: Action::Dropped(DropReason::MalformedRequest),
            };
        }
        // A forbidden reply address is counted as a drop inside `respond`.
        let action = self.respond(&loose, to, e.status(), &reason, &[], out);
        Outcome { label, action }
    }

    // ---------------------------------------------------------------- requests

    fn on_request(
        &self,
        now: u64,
        src: SocketAddr,
        msg: &SipMsg<'_>,
        out: &mut dyn FnMut(SocketAddr, &[u8]),
    ) -> Outcome {
        self.counters.inc(C::ReqIn);
        let method = msg.method().unwrap_or(Method::Other(""));
        let label = MsgLabel::of_method(method);
        let top = msg.top_via();
        let upstream = Self::upstream_addr(src, top.as_ref());
        let keys = self.keys(msg);
        if self.cfg.mode == Mode::Stateful {
            if let Some(a) = self.stateful_existing(now, msg, method, keys, upstream, out) {
                return Outcome { label, action: a };
            }
        }
        let action = self.new_request(now, src, upstream, msg, method, keys, out);
        Outcome { label, action }
    }
}

/// Hand a datagram to the caller unless the destination is forbidden
/// (port 0, unspecified, broadcast, multicast) or there is nothing to send.
fn send(out: &mut dyn FnMut(SocketAddr, &[u8]), to: SocketAddr, bytes: &[u8]) -> bool {
    if bytes.is_empty() || !sendable(&to) {
        return false;
    }
    out(to, bytes);
    true
}
