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
use std::collections::{BTreeMap, BinaryHeap, HashMap};
use std::io::Write as _;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

/// RFC 3261 T1 (RTT estimate), ns.
pub const T1: u64 = 500_000_000;
/// RFC 3261 T2 (max non-INVITE retransmit interval), ns.
pub const T2: u64 = 4_000_000_000;
/// RFC 3261 T4 (max message lifetime), ns.
pub const T4: u64 = 5_000_000_000;
/// Timer B/F/H/J: 64*T1.
pub const TIMER_64T1: u64 = 64 * T1;
/// Timer C (proxy INVITE transaction after a provisional), ns.
pub const TIMER_C: u64 = 180_000_000_000;
/// Default registration lifetime when none is requested (s).
pub const DEFAULT_EXPIRES: u32 = 3600;
/// Longest registration accepted (s); longer requests are shortened.
pub const MAX_EXPIRES: u32 = 86400;

/// Forwarding mode (`stateless` / `stateful` in configuration files).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// RFC 3261 16.11 stateless proxy.
    Stateless,
    /// Transaction-stateful proxy (100 Trying, retransmissions, CANCEL, 408).
    Stateful,
}

/// Proxy configuration.
#[derive(Clone, Debug)]
pub struct ProxyConfig {
    /// Stateless or stateful.
    pub mode: Mode,
    /// Our address as put in Via and Record-Route and used for loop
    /// detection. Must be a concrete address (not 0.0.0.0).
    pub local: SocketAddr,
    /// Default next hop for requests with no IP-literal target.
    pub route_to: Option<SocketAddr>,
    /// Act as registrar (REGISTER to our domain, location lookup).
    pub registrar: bool,
    /// Insert Record-Route into dialog-creating requests.
    pub record_route: bool,
    /// Bound on the transaction table (stateful mode).
    pub max_transactions: usize,
    /// Host names we are authoritative for (the local IP is always ours).
    pub domains: Vec<String>,
}

impl Default for ProxyConfig {
    fn default() -> Self {
        ProxyConfig {
            mode: Mode::Stateless,
            local: SocketAddr::from(([127, 0, 0, 1], 5060)),
            route_to: None,
            registrar: false,
            record_route: false,
            max_transactions: 65536,
            domains: Vec::new(),
        }
    }
}

/// Message type for metrics labels.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MsgLabel {
    /// INVITE request.
    Invite,
    /// ACK request.
    Ack,
    /// BYE request.
    Bye,
    /// CANCEL request.
    Cancel,
    /// REGISTER request.
    Register,
    /// OPTIONS request.
    Options,
    /// Any other request method.
    OtherRequest,
    /// A response with this exact code.
    Response(u16),
    /// Unparseable datagram.
    Malformed,
}

static CODE_TEXT: [[u8; 3]; 600] = {
    let mut t = [[0u8; 3]; 600];
    let mut i = 0;
    while i < 600 {
        let c = i + 100;
        t[i] = [
            b'0' + (c / 100) as u8,
            b'0' + ((c / 10) % 10) as u8,
            b'0' + (c % 10) as u8,
        ];
        i += 1;
    }
    t
};

impl MsgLabel {
    fn of_method(m: Method<'_>) -> MsgLabel {
        match m {
            Method::Invite => MsgLabel::Invite,
            Method::Ack => MsgLabel::Ack,
            Method::Bye => MsgLabel::Bye,
            Method::Cancel => MsgLabel::Cancel,
            Method::Register => MsgLabel::Register,
            Method::Options => MsgLabel::Options,
            _ => MsgLabel::OtherRequest,
        }
    }

    /// Label text: `INVITE`, `ACK`, ..., `other`, the 3-digit code for
    /// responses, `malformed`.
    pub fn as_str(&self) -> &'static str {
        match self {
            MsgLabel::Invite => "INVITE",
            MsgLabel::Ack => "ACK",
            MsgLabel::Bye => "BYE",
            MsgLabel::Cancel => "CANCEL",
            MsgLabel::Register => "REGISTER",
            MsgLabel::Options => "OPTIONS",
            MsgLabel::OtherRequest => "other",
            MsgLabel::Response(c) if (100..700).contains(c) => {
                std::str::from_utf8(&CODE_TEXT[(*c - 100) as usize]).unwrap_or("response")
            }
            MsgLabel::Response(_) => "response",
            MsgLabel::Malformed => "malformed",
        }
    }
}

impl std::fmt::Display for MsgLabel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a datagram was dropped.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DropReason {
    /// A response that does not parse.
    MalformedResponse,
    /// A request that does not parse well enough to answer (or an ACK).
    MalformedRequest,
    /// Response whose top Via is not ours.
    ResponseNotOurs,
    /// Response with no usable next Via (name without `received`).
    UnroutableResponse,
    /// Destination is broadcast/multicast/unspecified/port 0.
    ForbiddenDestination,
    /// Transaction table full (non-INVITE requests).
    Overload,
    /// An ACK we could not route or that failed validation.
    AckNotRoutable,
    /// Forwarded message would exceed the datagram limit.
    TooLarge,
    /// Empty datagram / keep-alive.
    KeepAlive,
}

const DROP_REASONS: [DropReason; 9] = [
    DropReason::MalformedResponse,
    DropReason::MalformedRequest,
    DropReason::ResponseNotOurs,
    DropReason::UnroutableResponse,
    DropReason::ForbiddenDestination,
    DropReason::Overload,
    DropReason::AckNotRoutable,
    DropReason::TooLarge,
    DropReason::KeepAlive,
];

impl DropReason {
    /// Metrics label.
    pub fn as_str(&self) -> &'static str {
        match self {
            DropReason::MalformedResponse => "malformed_response",
            DropReason::MalformedRequest => "malformed_request",
            DropReason::ResponseNotOurs => "response_via_not_ours",
            DropReason::UnroutableResponse => "unroutable_response",
            DropReason::ForbiddenDestination => "forbidden_destination",
            DropReason::Overload => "overload",
            DropReason::AckNotRoutable => "ack_not_routable",
            DropReason::TooLarge => "too_large",
            DropReason::KeepAlive => "keepalive",
        }
    }

    fn index(&self) -> usize {
        DROP_REASONS.iter().position(|d| d == self).unwrap_or(0)
    }
}

/// What happened to a datagram.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// Sent on to the next hop (`copies` datagrams).
    Forwarded {
        /// Number of copies sent downstream/upstream.
        copies: u32,
    },
    /// We answered with this final (or 200 to CANCEL) status code.
    Responded(u16),
    /// A retransmission (or hop-by-hop message) consumed by a transaction.
    Absorbed,
    /// Dropped and counted.
    Dropped(DropReason),
}

/// Result of [`Proxy::handle`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Outcome {
    /// Message type.
    pub label: MsgLabel,
    /// What was done.
    pub action: Action,
}

/// Counters snapshot.
#[derive(Clone, Debug, Default, Serialize)]
pub struct ProxyStats {
    /// Requests received (parsed).
    pub requests_received: u64,
    /// Responses received (parsed).
    pub responses_received: u64,
    /// Requests forwarded (including CANCEL/ACK we generated).
    pub requests_forwarded: u64,
    /// Responses forwarded upstream.
    pub responses_forwarded: u64,
    /// Transactions currently in the table.
    pub transactions_active: u64,
    /// Transactions created.
    pub transactions_created: u64,
    /// Transactions ended by timer B/F/C.
    pub transactions_timed_out: u64,
    /// Request/response retransmissions absorbed.
    pub retransmissions_absorbed: u64,
    /// Retransmissions we sent (timers A/E/G).
    pub retransmissions_sent: u64,
    /// Requests refused because the table was full (503 or drop).
    pub overload_sheds: u64,
    /// In-dialog requests forwarded statelessly because the table was full
    /// (calls already set up are completed, new ones are shed).
    pub overload_stateless: u64,
    /// Responses we generated, by code.
    pub responses_generated: BTreeMap<u16, u64>,
    /// Drops by reason.
    pub drops: BTreeMap<&'static str, u64>,
    /// Registrar bindings.
    pub bindings: u64,
}

#[derive(Clone, Copy)]
enum C {
    ReqIn,
    RespIn,
    ReqFwd,
    RespFwd,
    TxCreated,
    TxTimedOut,
    RetransAbsorbed,
    RetransSent,
    Overload,
    OverloadStateless,
}
const NC: usize = 10;
const STRIPES: usize = 8;

#[repr(align(128))]
struct Stripe {
    c: [AtomicU64; NC],
    codes: [AtomicU64; 600],
    drops: [AtomicU64; DROP_REASONS.len()],
}

impl Stripe {
    fn new() -> Self {
        Stripe {
            c: std::array::from_fn(|_| AtomicU64::new(0)),
            codes: std::array::from_fn(|_| AtomicU64::new(0)),
            drops: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }
}

struct Counters {
    stripes: Box<[Stripe]>,
}

thread_local! {
    static STRIPE: usize = {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        NEXT.fetch_add(1, Ordering::Relaxed) % STRIPES
    };
    static SCRATCH: RefCell<Vec<u8>> = RefCell::new(Vec::with_capacity(4096));
}

impl Counters {
    fn new() -> Self {
        Counters {
            stripes: (0..STRIPES).map(|_| Stripe::new()).collect(),
        }
    }
    #[inline]
    fn stripe(&self) -> &Stripe {
        &self.stripes[STRIPE.with(|s| *s)]
    }
    #[inline]
    fn inc(&self, c: C) {
        self.stripe().c[c as usize].fetch_add(1, Ordering::Relaxed);
    }
    fn code(&self, code: u16) {
        if (100..700).contains(&code) {
            self.stripe().codes[(code - 100) as usize].fetch_add(1, Ordering::Relaxed);
        }
    }
    fn drop(&self, d: DropReason) {
        self.stripe().drops[d.index()].fetch_add(1, Ordering::Relaxed);
    }
    fn sum(&self, c: C) -> u64 {
        self.stripes
            .iter()
            .map(|s| s.c[c as usize].load(Ordering::Relaxed))
            .sum()
    }
}

/// Take the thread-local scratch buffer (reentrancy-safe).
fn with_scratch<R>(f: impl FnOnce(&mut Vec<u8>) -> R) -> R {
    let mut v = SCRATCH.with(|s| std::mem::take(&mut *s.borrow_mut()));
    let r = f(&mut v);
    SCRATCH.with(|s| *s.borrow_mut() = v);
    r
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Class {
    Invite,
    NonInvite,
    Cancel,
}

impl Class {
    fn of(m: Method<'_>) -> Class {
        match m {
            Method::Invite | Method::Ack => Class::Invite,
            Method::Cancel => Class::Cancel,
            _ => Class::NonInvite,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ClientState {
    /// Nothing sent downstream (answered locally).
    None,
    /// Waiting for any response.
    Calling,
    /// Provisional received.
    Proceeding,
    /// Final received (or timed out).
    Done,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ServerState {
    /// No final response sent upstream yet.
    Proceeding,
    /// Final non-2xx sent (INVITE: waiting for ACK, timer G/H).
    Completed,
    /// 2xx forwarded (INVITE).
    Accepted,
    /// ACK received (INVITE), timer I.
    Confirmed,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Retrans {
    None,
    Downstream,
    Upstream,
}

struct Tx {
    class: Class,
    upstream: Option<SocketAddr>,
    downstream: Option<SocketAddr>,
    /// Request as forwarded downstream (for retransmission, CANCEL, ACK).
    request: Vec<u8>,
    /// Last response sent upstream (for retransmission).
    last_resp: Vec<u8>,
    client: ClientState,
    server: ServerState,
    retrans: Retrans,
    retrans_at: u64,
    retrans_iv: u64,
    timeout_at: u64,
    expire_at: u64,
    cancel_pending: bool,
    cancelled: bool,
    gen: u32,
}

impl Tx {
    fn new(class: Class, upstream: Option<SocketAddr>) -> Tx {
        Tx {
            class,
            upstream,
            downstream: None,
            request: Vec::new(),
            last_resp: Vec::new(),
            client: ClientState::None,
            server: ServerState::Proceeding,
            retrans: Retrans::None,
            retrans_at: 0,
            retrans_iv: T1,
            timeout_at: 0,
            expire_at: 0,
            cancel_pending: false,
            cancelled: false,
            gen: 0,
        }
    }

    fn deadline(&self) -> Option<u64> {
        let r = (self.retrans != Retrans::None).then_some(self.retrans_at);
        [r, nz(self.timeout_at), nz(self.expire_at)]
            .into_iter()
            .flatten()
            .min()
    }
}

fn nz(v: u64) -> Option<u64> {
    (v != 0).then_some(v)
}

type Key = (u64, Class);

#[derive(Default)]
struct Shard {
    txs: HashMap<Key, Tx>,
    timers: BinaryHeap<Reverse<(u64, u64, Class, u32)>>,
}

impl Shard {
    fn schedule(&mut self, key: Key) {
        if let Some(tx) = self.txs.get_mut(&key) {
            tx.gen = tx.gen.wrapping_add(1);
            if let Some(d) = tx.deadline() {
                self.timers.push(Reverse((d, key.0, key.1, tx.gen)));
            }
        }
    }
}

const SHARDS: usize = 64;
const BRANCH_PREFIX: &str = "z9hG4bKrw";

/// Stack-formatted branch `z9hG4bKrw<16 hex>.<8 hex>`.
struct Branch {
    buf: [u8; 34],
}

impl Branch {
    fn new(h: u64, l: u32) -> Branch {
        const HEX: &[u8; 16] = b"0123456789abcdef";
        let mut buf = [0u8; 34];
        buf[..9].copy_from_slice(BRANCH_PREFIX.as_bytes());
        for i in 0..16 {
            buf[9 + i] = HEX[((h >> (60 - 4 * i)) & 0xF) as usize];
        }
        buf[25] = b'.';
        for i in 0..8 {
            buf[26 + i] = HEX[((l >> (28 - 4 * i)) & 0xF) as usize];
        }
        Branch { buf }
    }
    fn as_str(&self) -> &str {
        std::str::from_utf8(&self.buf).unwrap_or(BRANCH_PREFIX)
    }
}

/// Parse one of our branches back into (tx hash, loop hash).
fn parse_branch(b: &str) -> Option<(u64, u32)> {
    let rest = b.strip_prefix(BRANCH_PREFIX)?;
    if rest.len() != 25 || rest.as_bytes()[16] != b'.' {
        return None;
    }
    let h = u64::from_str_radix(&rest[..16], 16).ok()?;
    let l = u32::from_str_radix(&rest[17..], 16).ok()?;
    Some((h, l))
}

/// Whether we may send to `a`.
pub fn sendable(a: &SocketAddr) -> bool {
    a.port() != 0
        && match a.ip() {
            IpAddr::V4(v) => !v.is_unspecified() && !v.is_broadcast() && !v.is_multicast(),
            IpAddr::V6(v) => {
                !v.is_unspecified()
                    && !v.is_multicast()
                    && v.to_ipv4_mapped()
                        .is_none_or(|m| !m.is_broadcast() && !m.is_multicast())
            }
        }
}

/// Where to send a request.
enum Target<'a> {
    Send {
        to: SocketAddr,
        ruri: Option<std::borrow::Cow<'a, str>>,
    },
    Respond(u16, &'static str),
    Register,
    OptionsToUs,
}

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

fn lock(m: &Mutex<Shard>) -> MutexGuard<'_, Shard> {
    m.lock().unwrap_or_else(|e| e.into_inner())
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

    fn host_is_ours(&self, host: &str, port: Option<u16>) -> bool {
        let port_ok = port.is_none_or(|p| p == self.cfg.local.port());
        if let Some(ip) = host_ip(host) {
            return ip == self.cfg.local.ip() && port_ok;
        }
        port_ok
            && self
                .cfg
                .domains
                .iter()
                .any(|d| d.eq_ignore_ascii_case(host))
    }

    fn is_our_via(&self, v: &Via<'_>) -> bool {
        host_ip(v.host) == Some(self.cfg.local.ip())
            && v.port.unwrap_or(5060) == self.cfg.local.port()
    }

    fn uri_is_us(&self, uri: &str) -> bool {
        SipUri::parse(uri).is_some_and(|u| self.host_is_ours(u.host, u.port))
    }

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

    fn upstream_addr(src: SocketAddr, top: Option<&Via<'_>>) -> SocketAddr {
        match top {
            Some(v) if !v.rport_flag => SocketAddr::new(src.ip(), v.port.unwrap_or(5060)),
            _ => src,
        }
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

    /// RFC 3261 16.3 validation; `Some((code, reason))` to reject.
    fn validate(&self, msg: &SipMsg<'_>, keys: (u64, u32)) -> Option<(u16, &'static str)> {
        let ruri = msg.request_uri().unwrap_or("");
        match scheme(ruri) {
            Some(s) if s.eq_ignore_ascii_case("sip") || s.eq_ignore_ascii_case("sips") => {}
            _ => return Some((416, "Unsupported URI Scheme")),
        }
        if msg.max_forwards() == Some(0) {
            return Some((483, "Too Many Hops"));
        }
        // Only requests that already passed a ringway proxy can loop here.
        static FINDER: std::sync::OnceLock<memchr::memmem::Finder<'static>> =
            std::sync::OnceLock::new();
        let finder = FINDER.get_or_init(|| memchr::memmem::Finder::new(BRANCH_PREFIX.as_bytes()));
        let seen_us = finder.find(msg.head().as_bytes()).is_some();
        for v in msg.vias().filter(|_| seen_us) {
            if self.is_our_via(&v) {
                if let Some((_, l)) = v.branch.and_then(parse_branch) {
                    if l == keys.1 {
                        return Some((482, "Loop Detected"));
                    }
                }
            }
        }
        if msg.proxy_require().next().is_some() {
            return Some((420, "Bad Extension"));
        }
        None
    }

    #[allow(clippy::too_many_arguments)]
    fn new_request(
        &self,
        now: u64,
        src: SocketAddr,
        upstream: SocketAddr,
        msg: &SipMsg<'_>,
        method: Method<'_>,
        keys: (u64, u32),
        out: &mut dyn FnMut(SocketAddr, &[u8]),
    ) -> Action {
        // ACK for a 2xx and a CANCEL that matched no transaction (RFC 3261
        // 16.10) are forwarded statelessly; the responses to such a CANCEL
        // then match no client transaction and follow the Via stack (16.7).
        // A client transaction of class CANCEL is only ever one we generated.
        let mut stateful =
            self.cfg.mode == Mode::Stateful && method != Method::Ack && method != Method::Cancel;
        if stateful
            && matches!(
                method,
                Method::Bye | Method::Prack | Method::Update | Method::Info | Method::Notify
            )
            && msg.to_tag().is_some()
            && self.active.load(Ordering::Relaxed) >= self.cfg.max_transactions
        {
            // Overload control sheds new work first: a mid-dialog request
            // that ends or continues a call already set up (BYE, PRACK,
            // UPDATE, INFO, NOTIFY with a To tag; never REGISTER, OPTIONS,
            // CANCEL or a re-INVITE) is forwarded statelessly (RFC 3261
            // 16.11; its responses then follow the Via stack without a
            // transaction), so that calls can end and the table can drain.
            self.counters.inc(C::OverloadStateless);
            stateful = false;
        }
        if stateful && self.active.load(Ordering::Relaxed) >= self.cfg.max_transactions {
            self.counters.inc(C::Overload);
            if method == Method::Invite {
                return self.respond(
                    msg,
                    upstream,
                    503,
                    "Service Unavailable",
                    &[("Retry-After", "5")],
                    out,
                );
            }
            self.counters.drop(DropReason::Overload);
            return Action::Dropped(DropReason::Overload);
        }
        if let Some((code, reason)) = self.validate(msg, keys) {
            if code == 420 {
                let unsupported: Vec<&str> = msg.proxy_require().collect();
                let list = unsupported.join(", ");
                return self.local_final(
                    now,
                    msg,
                    keys,
                    upstream,
                    code,
                    reason,
                    &[("Unsupported", &list)],
                    out,
                );
            }
            return self.local_final(now, msg, keys, upstream, code, reason, &[], out);
        }

        // 16.4 route information preprocessing.
        let route_count = msg.routes().count();
        let ruri = msg.request_uri().unwrap_or("");
        let rsu = msg.request_sip_uri();
        let strict = route_count > 0
            && rsu.is_some_and(|u| {
                u.user.is_none() && u.param("lr").is_some() && self.host_is_ours(u.host, u.port)
            });
        let mut routes_left = route_count - usize::from(strict);
        let eff_ruri: &str = if strict {
            msg.routes().last().map_or(ruri, |r| r.uri)
        } else {
            ruri
        };
        let first_route = msg.routes().next();
        let pop_route = routes_left > 0 && first_route.is_some_and(|r| self.uri_is_us(r.uri));
        if pop_route {
            routes_left -= 1;
        }
        let next_route = if routes_left > 0 {
            msg.routes().nth(usize::from(pop_route))
        } else {
            None
        };

        let target = match next_route {
            Some(r) => match r.sip_uri().and_then(|u| {
                u.host_ip()
                    .map(|ip| SocketAddr::new(ip, u.port.unwrap_or(5060)))
            }) {
                Some(to) => Target::Send { to, ruri: None },
                None => match self.cfg.route_to {
                    Some(to) => Target::Send { to, ruri: None },
                    None => Target::Respond(404, "Not Found"),
                },
            },
            None => {
                let eu = if strict { SipUri::parse(eff_ruri) } else { rsu };
                self.route_by_uri(now, eu, method)
            }
        };
        let ruri_edit: Option<std::borrow::Cow<'_, str>> = if strict {
            Some(std::borrow::Cow::Borrowed(eff_ruri))
        } else {
            None
        };
        // RFC 3261 16.6 step 6: a next hop without `lr` is a strict router;
        // it becomes the Request-URI and the old one goes to the Route end.
        let strict_next = next_route
            .filter(|r| !strict && r.sip_uri().is_some_and(|u| u.param("lr").is_none()))
            .map(|r| r.uri);
        let ruri_edit = match strict_next {
            Some(u) => Some(std::borrow::Cow::Borrowed(u)),
            None => ruri_edit,
        };
        match target {
            Target::Respond(code, reason) => {
                self.local_final(now, msg, keys, upstream, code, reason, &[], out)
            }
            Target::OptionsToUs => self.local_final(
                now,
                msg,
                keys,
                upstream,
                200,
                "OK",
                &[
                    ("Allow", "INVITE, ACK, CANCEL, BYE, OPTIONS, REGISTER"),
                    ("Accept", "application/sdp"),
                ],
                out,
            ),
            Target::Register => self.register(now, msg, keys, upstream, out),
            Target::Send { to, ruri } => {
                if !sendable(&to) {
                    self.counters.drop(DropReason::ForbiddenDestination);
                    return Action::Dropped(DropReason::ForbiddenDestination);
                }
                let new_ruri = ruri.or(ruri_edit);
                let dialog_creating = matches!(
                    method,
                    Method::Invite | Method::Subscribe | Method::Refer | Method::Notify
                ) && msg.to_tag().is_none();
                let branch = Branch::new(keys.0, keys.1);
                let mut ipbuf = [0u8; 48];
                let received = match top_host_differs(msg, src) {
                    true => fmt_ip(&mut ipbuf, src.ip()),
                    false => None,
                };
                let rport = msg
                    .top_via()
                    .filter(|v| v.rport_flag && v.rport.is_none())
                    .map(|_| src.port());
                let edits = RequestEdits {
                    via: Some(ViaEdit {
                        transport: "UDP",
                        sent_by: &self.sent_by,
                        branch: branch.as_str(),
                    }),
                    max_forwards: true,
                    record_route: (self.cfg.record_route && dialog_creating)
                        .then_some(self.rr_uri.as_str()),
                    pop_route,
                    request_uri: new_ruri.as_deref(),
                    pop_last_route: strict,
                    received,
                    rport,
                    strict_next_hop: strict_next.map(|_| eff_ruri),
                };
                if stateful {
                    self.forward_stateful(now, msg, method, keys, upstream, to, &edits, out)
                } else {
                    with_scratch(|buf| match forward_request(msg, &edits, buf) {
                        Ok(_) => {
                            send(out, to, buf);
                            self.counters.inc(C::ReqFwd);
                            Action::Forwarded { copies: 1 }
                        }
                        Err(e) => self.edit_failed(e),
                    })
                }
            }
        }
    }

    fn edit_failed(&self, e: EditError) -> Action {
        let d = match e {
            EditError::TooLarge => DropReason::TooLarge,
            _ => DropReason::MalformedRequest,
        };
        self.counters.drop(d);
        Action::Dropped(d)
    }

    fn route_by_uri<'m>(&self, now: u64, u: Option<SipUri<'_>>, method: Method<'_>) -> Target<'m> {
        let Some(u) = u else {
            return Target::Respond(416, "Unsupported URI Scheme");
        };
        if self.host_is_ours(u.host, u.port) {
            if method == Method::Register && self.cfg.registrar {
                return Target::Register;
            }
            if u.user.is_none() && method == Method::Options {
                return Target::OptionsToUs;
            }
            if self.cfg.registrar {
                if let Some(user) = u.user {
                    if let Some(b) = self.store.lookup(user, now).into_iter().next() {
                        let to = SipUri::parse(&b.contact).and_then(|c| {
                            c.host_ip()
                                .map(|ip| SocketAddr::new(ip, c.port.unwrap_or(5060)))
                        });
                        return match to.or(self.cfg.route_to) {
                            Some(to) => Target::Send {
                                to,
                                ruri: Some(std::borrow::Cow::Owned(b.contact)),
                            },
                            None => Target::Respond(480, "Temporarily Unavailable"),
                        };
                    }
                }
            }
            return match self.cfg.route_to {
                Some(to) => Target::Send { to, ruri: None },
                None => Target::Respond(404, "Not Found"),
            };
        }
        if let Some(ip) = u.host_ip() {
            return Target::Send {
                to: SocketAddr::new(ip, u.port.unwrap_or(5060)),
                ruri: None,
            };
        }
        match self.cfg.route_to {
            Some(to) => Target::Send { to, ruri: None },
            None => Target::Respond(404, "Not Found"),
        }
    }

    /// Answer locally with a final response; in stateful mode keep a
    /// transaction so retransmissions and the ACK are absorbed.
    #[allow(clippy::too_many_arguments)]
    fn local_final(
        &self,
        now: u64,
        msg: &SipMsg<'_>,
        keys: (u64, u32),
        upstream: SocketAddr,
        code: u16,
        reason: &str,
        extra: &[(&str, &str)],
        out: &mut dyn FnMut(SocketAddr, &[u8]),
    ) -> Action {
        let method = msg.method().unwrap_or(Method::Other(""));
        let a = self.respond(msg, upstream, code, reason, extra, out);
        if self.cfg.mode == Mode::Stateful
            && method != Method::Ack
            && matches!(a, Action::Responded(_))
            && self.active.load(Ordering::Relaxed) < self.cfg.max_transactions
        {
            let class = Class::of(method);
            let mut tx = Tx::new(class, Some(upstream));
            let tag = Branch::new(
                Hash64::new(self.secret)
                    .str(msg.call_id().unwrap_or(""))
                    .finish(),
                0,
            );
            build_response(
                msg,
                code,
                reason,
                extra,
                Some(&tag.as_str()[9..25]),
                &mut tx.last_resp,
            );
            tx.server = ServerState::Completed;
            if class == Class::Invite && code >= 300 {
                tx.retrans = Retrans::Upstream;
                tx.retrans_at = now + T1;
                tx.retrans_iv = T1;
            }
            tx.expire_at = now + TIMER_64T1;
            self.insert_tx((keys.0, class), tx);
        }
        a
    }

    fn insert_tx(&self, key: Key, tx: Tx) {
        let mut sh = lock(self.shard(key.0));
        if sh.txs.insert(key, tx).is_none() {
            self.active.fetch_add(1, Ordering::Relaxed);
            self.counters.inc(C::TxCreated);
        }
        sh.schedule(key);
    }

    // ---------------------------------------------------------------- registrar

    fn register(
        &self,
        now: u64,
        msg: &SipMsg<'_>,
        keys: (u64, u32),
        upstream: SocketAddr,
        out: &mut dyn FnMut(SocketAddr, &[u8]),
    ) -> Action {
        let Some(to) = msg.to() else {
            return self.local_final(now, msg, keys, upstream, 400, "Bad Request - To", &[], out);
        };
        let Some(tu) = to.sip_uri() else {
            return self.local_final(
                now,
                msg,
                keys,
                upstream,
                404,
                "Not Found - AOR Not SIP",
                &[],
                out,
            );
        };
        let Some(user) = tu.user else {
            return self.local_final(
                now,
                msg,
                keys,
                upstream,
                404,
                "Not Found - AOR Has No User",
                &[],
                out,
            );
        };
        let aor: String = if self.host_is_ours(tu.host, None) {
            user.to_owned()
        } else {
            format!("{user}@{}", tu.host.to_ascii_lowercase())
        };
        let hdr_exp = msg.expires();
        if msg.contact_star() {
            if hdr_exp != Some(0) || msg.contact().next().is_some() {
                return self.local_final(
                    now,
                    msg,
                    keys,
                    upstream,
                    400,
                    "Bad Request - Contact * Needs Expires 0",
                    &[],
                    out,
                );
            }
            self.store.remove(&aor, None);
        } else {
            for c in msg.contact() {
                let exp = c
                    .param("expires")
                    .flatten()
                    .and_then(crate::msg::parse_delta)
                    .or(hdr_exp)
                    .unwrap_or(DEFAULT_EXPIRES)
                    .min(MAX_EXPIRES);
                if exp == 0 {
                    self.store.remove(&aor, Some(c.uri));
                } else if self
                    .store
                    .put(&aor, c.uri, now + u64::from(exp) * 1_000_000_000)
                    .is_err()
                {
                    return self.local_final(
                        now,
                        msg,
                        keys,
                        upstream,
                        503,
                        "Service Unavailable - Location Store Full",
                        &[("Retry-After", "60")],
                        out,
                    );
                }
            }
        }
        let bindings = self.store.lookup(&aor, now);
        let contacts: Vec<String> = bindings
            .iter()
            .map(|b| {
                let left = b.expires_at.saturating_sub(now).div_ceil(1_000_000_000);
                format!("<{}>;expires={left}", b.contact)
            })
            .collect();
        let extra: Vec<(&str, &str)> = contacts.iter().map(|c| ("Contact", c.as_str())).collect();
        self.local_final(now, msg, keys, upstream, 200, "OK", &extra, out)
    }

    // ---------------------------------------------------------------- stateful

    /// Handle a request that matches an existing transaction (or a CANCEL).
    fn stateful_existing(
        &self,
        now: u64,
        msg: &SipMsg<'_>,
        method: Method<'_>,
        keys: (u64, u32),
        upstream: SocketAddr,
        out: &mut dyn FnMut(SocketAddr, &[u8]),
    ) -> Option<Action> {
        let class = Class::of(method);
        let key = (keys.0, class);
        let mut sh = lock(self.shard(keys.0));
        if let Some(tx) = sh.txs.get_mut(&key) {
            if method == Method::Cancel && tx.last_resp.is_empty() {
                // Our own CANCEL (timer C) is in flight; still answer the
                // UAC's CANCEL with 200 and absorb its retransmissions.
                let tag = Branch::new(
                    Hash64::new(self.secret)
                        .str(msg.call_id().unwrap_or(""))
                        .finish(),
                    0,
                );
                build_response(
                    msg,
                    200,
                    "OK",
                    &[],
                    Some(&tag.as_str()[9..25]),
                    &mut tx.last_resp,
                );
                tx.upstream = Some(upstream);
                send(out, upstream, &tx.last_resp);
                self.counters.code(200);
                return Some(Action::Responded(200));
            }
            if method == Method::Ack {
                if tx.server == ServerState::Completed {
                    tx.server = ServerState::Confirmed;
                    tx.retrans = Retrans::None;
                    tx.timeout_at = 0;
                    tx.expire_at = now + T4;
                    sh.schedule(key);
                    return Some(Action::Absorbed);
                }
                if tx.server == ServerState::Confirmed {
                    self.counters.inc(C::RetransAbsorbed);
                    return Some(Action::Absorbed);
                }
                return None; // end-to-end ACK (2543-style match): forward
            }
            if !tx.last_resp.is_empty() {
                if let Some(up) = tx.upstream {
                    send(out, up, &tx.last_resp);
                }
            }
            self.counters.inc(C::RetransAbsorbed);
            return Some(Action::Absorbed);
        }
        if method != Method::Cancel {
            return None;
        }
        // CANCEL: find the INVITE it cancels (same branch => same hash).
        let ikey = (keys.0, Class::Invite);
        let (invite_pending, invite_calling) = match sh.txs.get(&ikey) {
            Some(i) => (
                i.client == ClientState::Calling || i.client == ClientState::Proceeding,
                i.client == ClientState::Calling,
            ),
            None => return None, // no context: forward statelessly (16.10)
        };
        drop(sh);
        let a = self.respond(msg, upstream, 200, "OK", &[], out);
        let mut ctx = Tx::new(Class::Cancel, Some(upstream));
        let tag = Branch::new(
            Hash64::new(self.secret)
                .str(msg.call_id().unwrap_or(""))
                .finish(),
            0,
        );
        build_response(
            msg,
            200,
            "OK",
            &[],
            Some(&tag.as_str()[9..25]),
            &mut ctx.last_resp,
        );
        ctx.server = ServerState::Completed;
        ctx.expire_at = now + TIMER_64T1;
        let mut sh = lock(self.shard(keys.0));
        if let Some(inv) = sh.txs.get_mut(&ikey) {
            if invite_pending {
                inv.cancelled = true;
                if invite_calling {
                    inv.cancel_pending = true;
                }
            }
        }
        if let Some(inv) = sh
            .txs
            .get(&ikey)
            .filter(|_| invite_pending && !invite_calling)
        {
            self.start_cancel(now, inv, &mut ctx, out);
        }
        if sh.txs.insert((keys.0, Class::Cancel), ctx).is_none() {
            self.active.fetch_add(1, Ordering::Relaxed);
            self.counters.inc(C::TxCreated);
        }
        sh.schedule((keys.0, Class::Cancel));
        Some(a)
    }

    /// Build and send a CANCEL for `inv` downstream, making `ctx` its client
    /// transaction. Returns whether one was sent.
    fn start_cancel(
        &self,
        now: u64,
        inv: &Tx,
        ctx: &mut Tx,
        out: &mut dyn FnMut(SocketAddr, &[u8]),
    ) -> bool {
        let (Some(down), Ok(req)) = (inv.downstream, SipMsg::parse(&inv.request)) else {
            return false;
        };
        build_hop_request(&req, "CANCEL", None, &mut ctx.request);
        ctx.downstream = Some(down);
        ctx.client = ClientState::Calling;
        ctx.retrans = Retrans::Downstream;
        ctx.retrans_at = now + T1;
        ctx.retrans_iv = T1;
        ctx.timeout_at = now + TIMER_64T1;
        send(out, down, &ctx.request);
        self.counters.inc(C::ReqFwd);
        true
    }

    #[allow(clippy::too_many_arguments)]
    fn forward_stateful(
        &self,
        now: u64,
        msg: &SipMsg<'_>,
        method: Method<'_>,
        keys: (u64, u32),
        upstream: SocketAddr,
        to: SocketAddr,
        edits: &RequestEdits<'_>,
        out: &mut dyn FnMut(SocketAddr, &[u8]),
    ) -> Action {
        let class = Class::of(method);
        let mut tx = Tx::new(class, Some(upstream));
        // One right-sized allocation each instead of repeated growth.
        tx.request = Vec::with_capacity(msg.as_bytes().len() + 256);
        tx.last_resp = Vec::with_capacity(512);
        if let Err(e) = forward_request(msg, edits, &mut tx.request) {
            return self.edit_failed(e);
        }
        if class == Class::Invite {
            build_response(msg, 100, "Trying", &[], None, &mut tx.last_resp);
            send(out, upstream, &tx.last_resp);
            self.counters.code(100);
        }
        tx.downstream = Some(to);
        tx.client = ClientState::Calling;
        tx.retrans = Retrans::Downstream;
        tx.retrans_at = now + T1;
        tx.retrans_iv = T1;
        tx.timeout_at = now + TIMER_64T1;
        send(out, to, &tx.request);
        self.counters.inc(C::ReqFwd);
        self.insert_tx((keys.0, class), tx);
        Action::Forwarded { copies: 1 }
    }

    // ---------------------------------------------------------------- responses

    fn on_response(
        &self,
        now: u64,
        _src: SocketAddr,
        msg: &SipMsg<'_>,
        out: &mut dyn FnMut(SocketAddr, &[u8]),
    ) -> Outcome {
        self.counters.inc(C::RespIn);
        let code = msg.status().unwrap_or(0);
        let label = MsgLabel::Response(code);
        let drop = |d: DropReason| {
            self.counters.drop(d);
            Outcome {
                label,
                action: Action::Dropped(d),
            }
        };
        let Some(top) = msg.top_via() else {
            return drop(DropReason::MalformedResponse);
        };
        if !self.is_our_via(&top) {
            return drop(DropReason::ResponseNotOurs);
        }
        if self.cfg.mode == Mode::Stateful {
            if let Some((h, _)) = top.branch.and_then(parse_branch) {
                let method = msg.cseq().map_or(Method::Other(""), |c| c.1);
                if let Some(a) = self.stateful_response(now, msg, h, Class::of(method), out) {
                    return Outcome { label, action: a };
                }
            }
        }
        let Some(next) = msg.vias().nth(1) else {
            return drop(DropReason::UnroutableResponse);
        };
        let Some(to) = next.response_target() else {
            return drop(DropReason::UnroutableResponse);
        };
        if !sendable(&to) {
            return drop(DropReason::ForbiddenDestination);
        }
        with_scratch(|buf| match forward_response(msg, buf) {
            Ok(_) => {
                send(out, to, buf);
                self.counters.inc(C::RespFwd);
                Outcome {
                    label,
                    action: Action::Forwarded { copies: 1 },
                }
            }
            Err(_) => drop(DropReason::MalformedResponse),
        })
    }

    fn stateful_response(
        &self,
        now: u64,
        msg: &SipMsg<'_>,
        h: u64,
        class: Class,
        out: &mut dyn FnMut(SocketAddr, &[u8]),
    ) -> Option<Action> {
        let key = (h, class);
        let code = msg.status().unwrap_or(0);
        let mut sh = lock(self.shard(h));
        let mut start_cancel = false;
        let action = {
            let tx = sh.txs.get_mut(&key)?;
            if class == Class::Cancel {
                // Response to our CANCEL: hop-by-hop, never forwarded.
                if code >= 200 && tx.client != ClientState::Done {
                    tx.client = ClientState::Done;
                    tx.retrans = Retrans::None;
                    tx.timeout_at = 0;
                    if tx.expire_at == 0 {
                        tx.expire_at = now + T4;
                    }
                }
                Action::Absorbed
            } else if code < 200 {
                if tx.client == ClientState::Calling {
                    tx.client = ClientState::Proceeding;
                    if class == Class::Invite {
                        tx.retrans = Retrans::None;
                        tx.timeout_at = now + TIMER_C;
                        start_cancel = tx.cancel_pending;
                        tx.cancel_pending = false;
                    } else {
                        tx.retrans_iv = T2;
                    }
                }
                if code == 100 || tx.server != ServerState::Proceeding {
                    // 100 is hop-by-hop (RFC 3261 16.7): consumed, not a
                    // retransmission.
                    if code != 100 {
                        self.counters.inc(C::RetransAbsorbed);
                    }
                    Action::Absorbed
                } else {
                    match (tx.upstream, forward_response(msg, &mut tx.last_resp)) {
                        (Some(up), Ok(_)) if sendable(&up) => {
                            send(out, up, &tx.last_resp);
                            self.counters.inc(C::RespFwd);
                            Action::Forwarded { copies: 1 }
                        }
                        _ => Action::Dropped(DropReason::UnroutableResponse),
                    }
                }
            } else if tx.client == ClientState::Done {
                // Retransmitted final response.
                if class == Class::Invite && code >= 300 {
                    if let (Some(d), Ok(req)) = (tx.downstream, SipMsg::parse(&tx.request)) {
                        with_scratch(|buf| {
                            build_hop_request(&req, "ACK", Some(msg), buf);
                            send(out, d, buf);
                        });
                    }
                    self.counters.inc(C::RetransAbsorbed);
                    Action::Absorbed
                } else if class == Class::Invite {
                    self.forward_up(tx.upstream, msg, out)
                } else {
                    self.counters.inc(C::RetransAbsorbed);
                    Action::Absorbed
                }
            } else {
                tx.client = ClientState::Done;
                tx.retrans = Retrans::None;
                tx.timeout_at = 0;
                tx.cancel_pending = false;
                if class == Class::Invite && code >= 300 {
                    if let (Some(d), Ok(req)) = (tx.downstream, SipMsg::parse(&tx.request)) {
                        with_scratch(|buf| {
                            build_hop_request(&req, "ACK", Some(msg), buf);
                            send(out, d, buf);
                        });
                    }
                }
                if tx.server != ServerState::Proceeding {
                    if class == Class::Invite && code < 300 {
                        self.forward_up(tx.upstream, msg, out)
                    } else {
                        Action::Absorbed
                    }
                } else {
                    let a = match (tx.upstream, forward_response(msg, &mut tx.last_resp)) {
                        (Some(up), Ok(_)) if sendable(&up) => {
                            send(out, up, &tx.last_resp);
                            self.counters.inc(C::RespFwd);
                            Action::Forwarded { copies: 1 }
                        }
                        _ => Action::Dropped(DropReason::UnroutableResponse),
                    };
                    if class == Class::Invite && code >= 300 {
                        tx.server = ServerState::Completed;
                        tx.retrans = Retrans::Upstream;
                        tx.retrans_at = now + T1;
                        tx.retrans_iv = T1;
                        tx.expire_at = now + TIMER_64T1;
                    } else if class == Class::Invite {
                        tx.server = ServerState::Accepted;
                        tx.expire_at = now + TIMER_64T1;
                    } else {
                        tx.server = ServerState::Completed;
                        tx.expire_at = now + TIMER_64T1;
                    }
                    a
                }
            }
        };
        if let Action::Dropped(d) = action {
            self.counters.drop(d);
        }
        if start_cancel {
            self.spawn_cancel(&mut sh, now, h, None, out);
        }
        sh.schedule(key);
        Some(action)
    }

    fn forward_up(
        &self,
        up: Option<SocketAddr>,
        msg: &SipMsg<'_>,
        out: &mut dyn FnMut(SocketAddr, &[u8]),
    ) -> Action {
        match up {
            Some(up) if sendable(&up) => with_scratch(|buf| match forward_response(msg, buf) {
                Ok(_) => {
                    send(out, up, buf);
                    self.counters.inc(C::RespFwd);
                    Action::Forwarded { copies: 1 }
                }
                Err(_) => Action::Dropped(DropReason::MalformedResponse),
            }),
            _ => Action::Dropped(DropReason::UnroutableResponse),
        }
    }

    /// Send a CANCEL for the INVITE transaction `h` (creating or updating
    /// the CANCEL transaction entry).
    fn spawn_cancel(
        &self,
        sh: &mut Shard,
        now: u64,
        h: u64,
        upstream: Option<SocketAddr>,
        out: &mut dyn FnMut(SocketAddr, &[u8]),
    ) {
        let ckey = (h, Class::Cancel);
        let mut ctx = sh.txs.remove(&ckey).unwrap_or_else(|| {
            self.active.fetch_add(1, Ordering::Relaxed);
            self.counters.inc(C::TxCreated);
            let mut t = Tx::new(Class::Cancel, upstream);
            t.server = ServerState::Completed;
            t.expire_at = now + TIMER_64T1;
            t
        });
        if let Some(inv) = sh.txs.get(&(h, Class::Invite)) {
            self.start_cancel(now, inv, &mut ctx, out);
        }
        sh.txs.insert(ckey, ctx);
        sh.schedule(ckey);
    }

    // ---------------------------------------------------------------- timers

    /// Run due timers: retransmissions (A/E/G), timeouts with 408 or 487
    /// upstream (B/F/C, CANCEL downstream on C), cleanup (D/H/I/J/K) and
    /// registrar expiry (once per second). Returns the number of timer
    /// events processed. Call it at (or after) [`Self::next_deadline`].
    pub fn on_timer(&self, now: u64, out: &mut dyn FnMut(SocketAddr, &[u8])) -> usize {
        let mut n = 0;
        let last = self.last_expire.load(Ordering::Relaxed);
        if now >= last.saturating_add(1_000_000_000)
            && self
                .last_expire
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            n += self.store.expire(now);
        }
        for shard in self.shards.iter() {
            let mut sh = lock(shard);
            while let Some(&Reverse((d, h, class, gen))) = sh.timers.peek() {
                if d > now {
                    break;
                }
                sh.timers.pop();
                let key = (h, class);
                let live = sh.txs.get(&key).is_some_and(|t| t.gen == gen);
                if !live {
                    continue;
                }
                n += 1;
                self.fire(&mut sh, now, key, out);
            }
        }
        n
    }

    fn fire(&self, sh: &mut Shard, now: u64, key: Key, out: &mut dyn FnMut(SocketAddr, &[u8])) {
        let mut remove = false;
        let mut cancel = false;
        if let Some(tx) = sh.txs.get_mut(&key) {
            if tx.retrans != Retrans::None && tx.retrans_at <= now {
                let (to, bytes) = match tx.retrans {
                    Retrans::Downstream => (tx.downstream, &tx.request),
                    _ => (tx.upstream, &tx.last_resp),
                };
                if let Some(to) = to {
                    send(out, to, bytes);
                    self.counters.inc(C::RetransSent);
                }
                let cap = if tx.class == Class::Invite && tx.retrans == Retrans::Downstream {
                    u64::MAX
                } else {
                    T2
                };
                tx.retrans_iv = (tx.retrans_iv * 2).min(cap);
                tx.retrans_at = now + tx.retrans_iv;
            }
            if tx.timeout_at != 0 && tx.timeout_at <= now {
                tx.timeout_at = 0;
                tx.retrans = Retrans::None;
                self.counters.inc(C::TxTimedOut);
                if tx.class == Class::Invite && tx.client == ClientState::Proceeding {
                    cancel = true;
                }
                tx.client = ClientState::Done;
                if tx.class != Class::Cancel && tx.server == ServerState::Proceeding {
                    let (code, reason) = if tx.cancelled {
                        (487, "Request Terminated")
                    } else {
                        (408, "Request Timeout")
                    };
                    if let (Some(up), Ok(req)) = (tx.upstream, SipMsg::parse(&tx.request)) {
                        let mut resp = Vec::new();
                        build_response_below_top_via(&req, code, reason, &mut resp);
                        send(out, up, &resp);
                        self.counters.code(code);
                        tx.last_resp = resp;
                    }
                    tx.server = ServerState::Completed;
                    if tx.class == Class::Invite {
                        tx.retrans = Retrans::Upstream;
                        tx.retrans_iv = T1;
                        tx.retrans_at = now + T1;
                        tx.expire_at = now + TIMER_64T1;
                    } else {
                        tx.expire_at = now + T4;
                    }
                } else if tx.expire_at == 0 || tx.class == Class::Cancel {
                    tx.expire_at = now;
                }
            }
            if tx.expire_at != 0 && tx.expire_at <= now {
                remove = true;
            }
        }
        if cancel {
            self.spawn_cancel(sh, now, key.0, None, out);
        }
        if remove {
            if sh.txs.remove(&key).is_some() {
                self.active.fetch_sub(1, Ordering::Relaxed);
            }
        } else {
            sh.schedule(key);
        }
    }

    /// Earliest pending timer (ns), if any: transaction timers and, while
    /// the registrar holds bindings, the next once-a-second expiry sweep.
    pub fn next_deadline(&self) -> Option<u64> {
        let mut best: Option<u64> = None;
        if self.cfg.registrar && !self.store.is_empty() {
            best = Some(
                self.last_expire
                    .load(Ordering::Relaxed)
                    .saturating_add(1_000_000_000),
            );
        }
        for shard in self.shards.iter() {
            let mut sh = lock(shard);
            // Drop stale heap entries so the answer is exact.
            while let Some(&Reverse((d, h, class, gen))) = sh.timers.peek() {
                if sh.txs.get(&(h, class)).is_some_and(|t| t.gen == gen) {
                    best = Some(best.map_or(d, |b| b.min(d)));
                    break;
                }
                sh.timers.pop();
            }
        }
        best
    }

    /// Counter snapshot.
    pub fn stats(&self) -> ProxyStats {
        let c = &self.counters;
        let mut codes = BTreeMap::new();
        for i in 0..600 {
            let v: u64 = c
                .stripes
                .iter()
                .map(|s| s.codes[i].load(Ordering::Relaxed))
                .sum();
            if v > 0 {
                codes.insert(i as u16 + 100, v);
            }
        }
        let mut drops = BTreeMap::new();
        for (i, d) in DROP_REASONS.iter().enumerate() {
            let v: u64 = c
                .stripes
                .iter()
                .map(|s| s.drops[i].load(Ordering::Relaxed))
                .sum();
            if v > 0 {
                drops.insert(d.as_str(), v);
            }
        }
        ProxyStats {
            requests_received: c.sum(C::ReqIn),
            responses_received: c.sum(C::RespIn),
            requests_forwarded: c.sum(C::ReqFwd),
            responses_forwarded: c.sum(C::RespFwd),
            transactions_active: self.active.load(Ordering::Relaxed) as u64,
            transactions_created: c.sum(C::TxCreated),
            transactions_timed_out: c.sum(C::TxTimedOut),
            retransmissions_absorbed: c.sum(C::RetransAbsorbed),
            retransmissions_sent: c.sum(C::RetransSent),
            overload_sheds: c.sum(C::Overload),
            overload_stateless: c.sum(C::OverloadStateless),
            responses_generated: codes,
            drops,
            bindings: self.store.len() as u64,
        }
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

fn top_host_differs(msg: &SipMsg<'_>, src: SocketAddr) -> bool {
    msg.top_via()
        .is_some_and(|v| host_ip(v.host) != Some(src.ip()))
}

fn fmt_ip(buf: &mut [u8; 48], ip: IpAddr) -> Option<&str> {
    let mut c = std::io::Cursor::new(&mut buf[..]);
    write!(c, "{ip}").ok()?;
    let n = c.position() as usize;
    std::str::from_utf8(&buf[..n]).ok()
}

/// Build a hop-by-hop CANCEL or ACK from the request we forwarded (RFC 3261
/// 9.1 / 17.1.1.3): same Request-URI, top Via, Route, Call-ID, From, CSeq
/// number; To from `resp` for ACK.
fn build_hop_request(req: &SipMsg<'_>, method: &str, resp: Option<&SipMsg<'_>>, out: &mut Vec<u8>) {
    out.clear();
    let head = req.head();
    out.extend_from_slice(method.as_bytes());
    out.push(b' ');
    out.extend_from_slice(req.request_uri().unwrap_or("").as_bytes());
    out.extend_from_slice(b" SIP/2.0\r\n");
    if let Some(v) = req.top_via() {
        out.extend_from_slice(b"Via: ");
        out.extend_from_slice(v.raw.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    for h in req.header_positions() {
        let line = &head[h.line_start as usize..h.value_end as usize];
        match h.kind {
            HeaderKind::Route | HeaderKind::From | HeaderKind::CallId => {
                out.extend_from_slice(line.as_bytes());
                out.extend_from_slice(b"\r\n");
            }
            HeaderKind::To => {
                let to_line = resp
                    .and_then(|r| {
                        r.header_positions()
                            .iter()
                            .find(|x| x.kind == HeaderKind::To)
                            .map(|x| &r.head()[x.line_start as usize..x.value_end as usize])
                    })
                    .unwrap_or(line);
                out.extend_from_slice(to_line.as_bytes());
                out.extend_from_slice(b"\r\n");
            }
            _ => {}
        }
    }
    let _ = write!(
        out,
        "CSeq: {} {method}\r\nMax-Forwards: 70\r\nContent-Length: 0\r\n\r\n",
        req.cseq().map_or(0, |c| c.0)
    );
}

/// A response to the original request, built from our forwarded copy by
/// leaving out our own (top) Via.
fn build_response_below_top_via(req: &SipMsg<'_>, code: u16, reason: &str, out: &mut Vec<u8>) {
    let mut tmp = Vec::new();
    build_response(req, code, reason, &[], Some("rw-timeout"), &mut tmp);
    match SipMsg::parse(&tmp) {
        Ok(m) => {
            if forward_response(&m, out).is_err() {
                out.clear();
            }
        }
        Err(_) => out.clear(),
    }
}
