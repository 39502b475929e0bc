//! A stateless dispatcher in front of several proxies (sans-IO): new
//! requests are spread over the proxies by rendezvous hashing
//! ([`rendezvous`]) of their Call-ID (a REGISTER: its AOR), the proxies are
//! probed with OPTIONS and one that stops answering gets no new requests
//! (only its share moves), and a REGISTER gets our Path (RFC 3327) so that
//! whichever proxy later looks the user up sends the call back through us.
//!
//! Per request, after popping our own Route values (we Record-Route; all
//! of them in one pass):
//! - an initial request (no To tag) from outside loses its preloaded
//!   Routes and goes to a proxy, whatever they said;
//! - a Route left: forward to it (an IP literal; a proxy that
//!   Record-Routed, or us again later);
//! - no Route left and the request comes from one of our proxies: forward
//!   by Request-URI (an IP literal: a registered contact reached through
//!   our Path, or a UA's contact in a dialog);
//! - otherwise (a new request from outside): to the proxy chosen by
//!   rendezvous hashing among those in, with our Record-Route on
//!   dialog-creating requests and our Path on REGISTER; `503` with
//!   `Retry-After` when none is in.
//!
//! The relay policy ([`crate::relay`]) has the last word on every next
//! hop: from outside, only our proxies (and the relay networks); from a
//! proxy (which applied its own policy), anywhere but loopback, link-local
//! and our own addresses unless the relay networks name them. A request
//! from a proxy's address is trusted: the network between the dispatcher
//! and its proxies must not let others use those addresses (anti-spoofing
//! at the edge, docs/security.md).
//!
//! An OPTIONS for us gets `200` (health checks of the dispatcher itself).
//! Responses lose our Via and go to the next one (RFC 3261 16.11) if our
//! branch's MAC says the request came from there (a forged response is
//! not reflected); the answers to our probes are absorbed, counted only if
//! they echo the probe's unguessable nonce. The dispatcher keeps no transaction
//! or dialog: a proxy's in-flight transactions and dialogs die with it
//! (every system surveyed accepts that); a retransmission after it went
//! out is hashed to a live proxy. Nothing is resolved by DNS.
//!
//! Every message comes in and goes out with its [`Hop`], as in the proxy
//! core: a request over a connection (TCP, TLS, WebSocket) is answered
//! over that connection, proxies are reached over their configured
//! transport (UDP, TCP or TLS: the driver reuses its connection to them),
//! our Via names the transport it goes out on and our Record-Route is
//! doubled when the two sides' transports differ (Kamailio's rr module
//! does the same), so each side reaches us over its own transport.

mod health;
pub use health::AdminState;
pub mod rendezvous;
mod targets;

use crate::edit::{build_response, forward_request, forward_response, RequestEdits, ViaEdit};
use crate::hash::{KeyRing, Purpose};
use crate::msg::{Method, SipMsg};
use crate::proxy::flood::{FloodCheck, FloodLimiter};
use crate::proxy::{
    sendable, Action, DropReason, FloodConfig, MsgLabel, Outcome, AMPLIFICATION_LIMIT,
};
use crate::relay::{Grant, Refusal, RelayNets};
use crate::transport::{Hop, Transport, TransportAddr};
use crate::uri::{host_ip, SipUri};
use health::{parse_probe_id, PROBE_TAG};
use serde::Serialize;
use std::io::Write as _;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use targets::Targets;

/// Configuration of a [`Dispatcher`].
#[derive(Clone, Debug)]
pub struct DispatchConfig {
    /// Our UDP address (Via, Record-Route, Path). A concrete address.
    pub local: SocketAddr,
    /// Where we listen on connection transports (TCP, TLS, WS, WSS),
    /// beyond `local`: concrete addresses, at most one per transport is
    /// used for our Via and Record-Route.
    pub listeners: Vec<TransportAddr>,
    /// The proxies behind us, each with the transport we reach it over
    /// (UDP, TCP or TLS; a connection transport needs a listener of it).
    pub proxies: Vec<TransportAddr>,
    /// OPTIONS probe interval (ns).
    pub probe_interval: u64,
    /// Probes unanswered in a row before a proxy is out.
    pub probe_failures: u32,
    /// Record-Route dialog-creating requests (in-dialog requests then come
    /// through us: the UA only ever talks to the dispatcher).
    pub record_route: bool,
    /// Key of our branches, To tags, branch MACs and probe nonces (a
    /// driver passes random bytes, so they cannot be predicted or forged).
    pub secret: [u8; 32],
    /// Destinations beyond our proxies requests may go to
    /// ([`crate::relay`]): from outside, a request goes to a proxy unless
    /// these say otherwise; a proxy's request may go anywhere but
    /// loopback, link-local and our own IP unless these name them.
    pub relay: RelayNets,
    /// Per-source flood limit, as the proxy's (`None`: off): a source
    /// over it has its datagrams dropped and counted, unanswered. Our
    /// proxies and our own address are exempt (added by
    /// [`Dispatcher::new`]).
    pub flood: Option<FloodConfig>,
}

impl Default for DispatchConfig {
    fn default() -> Self {
        DispatchConfig {
            local: SocketAddr::from(([127, 0, 0, 1], 5060)),
            listeners: Vec::new(),
            proxies: Vec::new(),
            probe_interval: 500_000_000,
            probe_failures: 3,
            record_route: true,
            secret: [0xD1; 32],
            relay: RelayNets::None,
            flood: None,
        }
    }
}

/// Counters of a dispatcher.
#[derive(Clone, Debug, Default, Serialize)]
pub struct DispatchStats {
    /// Requests received (parsed).
    pub requests_received: u64,
    /// Responses received (parsed), probe answers included.
    pub responses_received: u64,
    /// New requests sent to the proxy chosen by rendezvous hashing.
    pub requests_dispatched: u64,
    /// Requests forwarded to their next Route.
    pub requests_routed: u64,
    /// Requests from a proxy forwarded by Request-URI.
    pub requests_to_uri: u64,
    /// Responses forwarded to the next Via.
    pub responses_forwarded: u64,
    /// OPTIONS probes sent.
    pub probes_sent: u64,
    /// Probe answers received.
    pub probe_answers: u64,
    /// Requests answered `503` because no proxy was in.
    pub no_proxy: u64,
    /// Requests whose next hop the relay policy refused (403/482, an ACK
    /// or CANCEL dropped).
    pub relay_refused: u64,
    /// Sources that went over the flood limit (each time they crossed it).
    pub flood_blocks: u64,
    /// Datagrams let through because the flood table had no room for
    /// their source.
    pub flood_untracked: u64,
    /// Sources the flood limiter tracks now.
    pub flood_sources_tracked: usize,
    /// Responses we generated, by code.
    pub responses_generated: std::collections::BTreeMap<u16, u64>,
    /// Drops by reason.
    pub drops: std::collections::BTreeMap<&'static str, u64>,
    /// Per proxy.
    pub proxies: Vec<MemberStats>,
}

/// One proxy's counters.
#[derive(Clone, Debug, Default, Serialize)]
pub struct MemberStats {
    /// Its address.
    pub address: String,
    /// In now (answers its probes).
    pub alive: bool,
    /// What the operator set: `active`, `disabled` or `draining` (only
    /// `active` proxies get new requests).
    pub state: &'static str,
    /// New requests sent to it.
    pub requests: u64,
    /// Times it went out.
    pub downs: u64,
}

#[derive(Default)]
struct Counters {
    requests_received: AtomicU64,
    responses_received: AtomicU64,
    requests_dispatched: AtomicU64,
    requests_routed: AtomicU64,
    requests_to_uri: AtomicU64,
    responses_forwarded: AtomicU64,
    probes_sent: AtomicU64,
    probe_answers: AtomicU64,
    no_proxy: AtomicU64,
    relay_refused: AtomicU64,
    flood_blocks: AtomicU64,
    flood_untracked: AtomicU64,
    responses_generated: Mutex<std::collections::BTreeMap<u16, u64>>,
    drops: Mutex<std::collections::BTreeMap<&'static str, u64>>,
}

fn add(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

/// The dispatcher, shared by its worker threads (`Send + Sync`); each
/// thread drives it through a [`DispatchWorker`].
pub struct Dispatcher {
    config: DispatchConfig,
    /// The proxies now (replaced whole by [`Dispatcher::set_proxies`]).
    targets: RwLock<Arc<Targets>>,
    /// Bumped with every new [`Targets`]: workers refresh their copy.
    generation: AtomicU64,
    /// Our address per transport: UDP (`local`) first, then the listeners.
    own: Vec<OwnAddress>,
    /// The keys of our branches, their MACs, our To-tags and probe
    /// nonces, one per purpose (from `config.secret`).
    keys: KeyRing,
    /// Per-source flood limiter (`None`: off).
    flood: Option<FloodLimiter>,
    /// Next probe round (ns; 0: at once).
    next_probe: AtomicU64,
    counters: Counters,
}

/// One of our listening addresses with the texts we write for it.
struct OwnAddress {
    at: TransportAddr,
    /// `host:port` for Via.
    sent_by: String,
    /// `sip:host:port;lr` (`;transport=tcp;lr` and so on beyond UDP):
    /// Record-Route and Path.
    uri: String,
}

impl OwnAddress {
    fn new(at: TransportAddr) -> OwnAddress {
        let sent_by = at.addr.to_string();
        let uri = match at.transport {
            Transport::Udp => format!("sip:{sent_by};lr"),
            other => format!("sip:{sent_by};transport={};lr", other.name()),
        };
        OwnAddress { at, sent_by, uri }
    }
}

/// Where a request goes.
enum Next {
    /// To a proxy chosen by rendezvous hashing (index).
    Proxy(usize),
    /// To its next Route.
    Route(Hop),
    /// By its Request-URI.
    RequestUri(Hop),
}

impl Dispatcher {
    /// A dispatcher in front of `config.proxies`.
    pub fn new(config: DispatchConfig) -> Dispatcher {
        let mut own: Vec<OwnAddress> = vec![OwnAddress::new(TransportAddr::udp(config.local))];
        for listener in &config.listeners {
            if !own.iter().any(|o| o.at.transport == listener.transport) {
                own.push(OwnAddress::new(*listener));
            }
        }
        Dispatcher {
            targets: RwLock::new(Arc::new(Targets::new(
                config.local,
                &config.proxies,
                None,
                config.relay.clone(),
            ))),
            generation: AtomicU64::new(0),
            own,
            keys: KeyRing::new(&config.secret),
            flood: config.flood.clone().map(|mut flood| {
                // Our proxies carry everyone's traffic back: never limited.
                flood.exempt.push(config.local.ip());
                flood
                    .exempt
                    .extend(config.proxies.iter().map(|p| p.addr.ip()));
                FloodLimiter::new(flood)
            }),
            next_probe: AtomicU64::new(0),
            counters: Counters::default(),
            config,
        }
    }

    /// A handle for one thread (its scratch buffer).
    pub fn worker(&self) -> DispatchWorker<'_> {
        let (targets, generation) = self.current();
        DispatchWorker {
            dispatcher: self,
            scratch: Vec::with_capacity(4096),
            targets,
            generation,
        }
    }

    /// The configuration it started with (the proxies now:
    /// [`Dispatcher::proxies`]).
    pub fn config(&self) -> &DispatchConfig {
        &self.config
    }

    /// The proxy set now and its generation.
    fn current(&self) -> (Arc<Targets>, u64) {
        let targets = self.targets.read().unwrap_or_else(PoisonError::into_inner);
        (targets.clone(), self.generation.load(Ordering::Acquire))
    }

    /// The proxies new requests are spread over now.
    pub fn proxies(&self) -> Vec<TransportAddr> {
        self.current().0.members.iter().map(|m| m.at()).collect()
    }

    /// Each proxy now and whether it is in (answers probes and is `Active`).
    pub fn proxy_states(&self) -> Vec<(TransportAddr, bool)> {
        self.current()
            .0
            .members
            .iter()
            .map(|m| (m.at(), m.takes_new()))
            .collect()
    }

    /// Replace the proxies behind us (a reload) and the relay networks.
    /// A proxy that stays keeps its state (alive, the operator's state,
    /// counters); a new one starts in, `Active`; a removed one gets no new
    /// request, but the in-dialog requests of the calls it carries still
    /// go to it and come from it as from a proxy (it stays trusted by the
    /// relay policy until a restart; the last 64 removed are kept).
    /// Rendezvous hashing moves only the shares of the proxies that came
    /// or went. Workers take the new set at their next datagram.
    pub fn set_proxies(&self, proxies: &[TransportAddr], relay: RelayNets) {
        let mut targets = self.targets.write().unwrap_or_else(PoisonError::into_inner);
        let next = Targets::new(self.config.local, proxies, Some(&targets), relay);
        *targets = Arc::new(next);
        self.generation.fetch_add(1, Ordering::Release);
    }

    /// When the next probe round is due (ns).
    pub fn next_deadline(&self) -> u64 {
        self.next_probe.load(Ordering::Relaxed)
    }

    /// The proxy a new request with this key goes to now (index into
    /// `config.proxies`), `None` when none is in.
    pub fn choose(&self, key: &[u8]) -> Option<usize> {
        Self::choose_in(&self.current().0, key)
    }

    fn choose_in(targets: &Targets, key: &[u8]) -> Option<usize> {
        rendezvous::choose(
            key,
            targets
                .members
                .iter()
                .map(|m| (m.identity.as_str(), m.takes_new())),
        )
    }

    /// Set the operator's state of the proxy at `address` (the management
    /// API): only `Active` proxies get new requests; in-dialog requests
    /// follow their Route whatever the state. Rendezvous hashing moves
    /// only that proxy's share. `false`: no such proxy.
    pub fn set_admin_state(&self, address: SocketAddr, state: AdminState) -> bool {
        let (targets, _) = self.current();
        match targets.member_at(address) {
            Some(index) => {
                targets.members[index].set_admin_state(state);
                true
            }
            None => false,
        }
    }

    /// Whether proxy `index` is in (answers probes and is `Active`).
    pub fn is_alive(&self, index: usize) -> bool {
        self.current()
            .0
            .members
            .get(index)
            .is_some_and(|m| m.takes_new())
    }

    /// Counters now.
    pub fn stats(&self) -> DispatchStats {
        let c = &self.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        DispatchStats {
            requests_received: get(&c.requests_received),
            responses_received: get(&c.responses_received),
            requests_dispatched: get(&c.requests_dispatched),
            requests_routed: get(&c.requests_routed),
            requests_to_uri: get(&c.requests_to_uri),
            responses_forwarded: get(&c.responses_forwarded),
            probes_sent: get(&c.probes_sent),
            probe_answers: get(&c.probe_answers),
            no_proxy: get(&c.no_proxy),
            relay_refused: get(&c.relay_refused),
            flood_blocks: get(&c.flood_blocks),
            flood_untracked: get(&c.flood_untracked),
            flood_sources_tracked: self.flood.as_ref().map_or(0, FloodLimiter::tracked),
            responses_generated: c
                .responses_generated
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone(),
            drops: c.drops.lock().unwrap_or_else(|e| e.into_inner()).clone(),
            proxies: self
                .current()
                .0
                .members
                .iter()
                .map(|m| MemberStats {
                    address: m.identity.clone(),
                    alive: m.is_alive(),
                    state: m.admin_state().as_str(),
                    requests: get(&m.requests),
                    downs: get(&m.downs),
                })
                .collect(),
        }
    }

    fn is_us(&self, uri: &str) -> bool {
        SipUri::parse(uri).is_some_and(|u| self.is_our_host(u.host, u.port))
    }

    /// Whether `host:port` (port 5060 if none) is one of our addresses.
    fn is_our_host(&self, host: &str, port: Option<u16>) -> bool {
        let ip = host_ip(host);
        let port = port.unwrap_or(5060);
        self.own
            .iter()
            .any(|own| ip == Some(own.at.addr.ip()) && port == own.at.addr.port())
    }

    /// Our address on `transport`, if we listen on it.
    fn own_address(&self, transport: Transport) -> Option<&OwnAddress> {
        self.own.iter().find(|own| own.at.transport == transport)
    }

    /// A hop to `addr` over `transport` if we speak it, else over UDP (a
    /// dispatcher that listens only on UDP sends everything over UDP).
    fn hop_over(&self, transport: Transport, addr: SocketAddr) -> Hop {
        match self.own_address(transport) {
            Some(_) => Hop::new(transport, addr),
            None => Hop::udp(addr),
        }
    }

    /// The hashing key of a new request: the AOR (To URI `user@host`) of
    /// a REGISTER, else the Call-ID.
    fn key<'m>(msg: &SipMsg<'m>, method: Method<'_>) -> Option<std::borrow::Cow<'m, str>> {
        if method == Method::Register {
            let to = msg.to()?.sip_uri()?;
            return Some(std::borrow::Cow::Owned(format!(
                "{}@{}",
                to.user.unwrap_or(""),
                to.host.to_ascii_lowercase()
            )));
        }
        msg.call_id().map(std::borrow::Cow::Borrowed)
    }

    /// Where `msg` (from `from`) goes, after popping `popped` Route values
    /// of ours.
    fn next_hop(
        &self,
        targets: &Targets,
        msg: &SipMsg<'_>,
        method: Method<'_>,
        from: Hop,
        popped: usize,
    ) -> Result<Next, (u16, &'static str)> {
        // The transport a URI names, else `default`; over UDP when we do
        // not listen on it.
        let uri_hop = |uri: &str, default: Transport| {
            SipUri::parse(uri).and_then(|u| {
                let transport = Transport::of_uri(&u).unwrap_or(default);
                u.host_ip()
                    .map(|ip| self.hop_over(transport, SocketAddr::new(ip, u.port.unwrap_or(5060))))
            })
        };
        let from_member = targets.is_proxy(from);
        // Preloaded Routes of an initial request from outside are ignored
        // (and removed): a proxy routes it.
        let preloaded = !from_member && msg.to_tag().is_none();
        if let Some(route) = msg.routes().nth(popped).filter(|_| !preloaded) {
            return uri_hop(route.uri, Transport::Udp)
                .map(Next::Route)
                .ok_or((404, "Not Found - Route Not An Address"));
        }
        if from_member {
            // A Request-URI naming no transport is reached over the one
            // named by the last of our Route values popped (a double
            // Record-Route names the far side's last).
            let own_route_transport = msg
                .routes()
                .take(popped)
                .last()
                .and_then(|r| r.sip_uri())
                .and_then(|u| Transport::of_uri(&u))
                .unwrap_or_default();
            return msg
                .request_uri()
                .and_then(|uri| uri_hop(uri, own_route_transport))
                .map(Next::RequestUri)
                .ok_or((404, "Not Found"));
        }
        let key = Self::key(msg, method).ok_or((400, "Bad Request - No Key"))?;
        Self::choose_in(targets, key.as_bytes())
            .map(Next::Proxy)
            .ok_or((503, "Service Unavailable - No Proxy"))
    }

    /// The MAC in our branch of a request with branch hash `hash` whose
    /// responses go to `upstream`.
    fn upstream_mac(&self, hash: u64, upstream: SocketAddr) -> u64 {
        self.keys
            .mac(Purpose::Upstream)
            .u64(hash)
            .addr(upstream)
            .finish()
    }

    /// The nonce of probe `seq` to proxy `index`.
    fn probe_nonce(&self, index: usize, seq: u64) -> u64 {
        self.keys
            .mac(Purpose::ProbeNonce)
            .u64(index as u64)
            .u64(seq)
            .finish()
    }

    /// Our branch for a request whose top Via is `top` (the same for its
    /// retransmissions, its CANCEL and the ACK of a non-2xx: RFC 3261
    /// 16.11 asks a stateless proxy for exactly that), with the MAC of
    /// where its responses go (`upstream`): `z9hG4bKrwd<16 hex>.<16 hex>`.
    fn branch(&self, msg: &SipMsg<'_>, upstream: SocketAddr, buf: &mut [u8; 48]) -> usize {
        let mut h = self.keys.mac(Purpose::Transaction);
        match msg.top_via() {
            Some(via) if via.has_cookie() => {
                h.str(via.branch.unwrap_or("")).str(via.host);
            }
            _ => {
                // RFC 2543 peers: what identifies the transaction.
                h.str(msg.call_id().unwrap_or(""))
                    .str(msg.request_uri().unwrap_or(""))
                    .u64(u64::from(msg.cseq().map_or(0, |c| c.0)));
            }
        }
        let hash = h.finish();
        let mut cursor = std::io::Cursor::new(&mut buf[..]);
        let _ = write!(
            cursor,
            "{BRANCH_PREFIX}{hash:016x}.{:016x}",
            self.upstream_mac(hash, upstream)
        );
        cursor.position() as usize
    }

    /// `(hash, mac)` of one of our branches.
    fn parse_branch(branch: &str) -> Option<(u64, u64)> {
        let rest = branch.strip_prefix(BRANCH_PREFIX)?;
        let (hash, mac) = rest.split_once('.')?;
        let hex = |s: &str| {
            (s.len() == 16 && s.bytes().all(|b| b.is_ascii_hexdigit()))
                .then(|| u64::from_str_radix(s, 16).ok())
                .flatten()
        };
        Some((hex(hash)?, hex(mac)?))
    }
}

/// Our branches start with this.
const BRANCH_PREFIX: &str = "z9hG4bKrwd";

/// Our own Vias in one request at most: a request routed through us and
/// back again this often is a loop (a legitimate spiral passes a
/// dispatcher once or twice).
const MAX_OWN_VIAS: usize = 3;

impl Dispatcher {
    /// Whether `to` is one of our own addresses (responses never go there).
    fn is_own_address(&self, to: SocketAddr) -> bool {
        self.own.iter().any(|own| own.at.addr == to)
    }

    /// Whether `msg` already passed us more than [`MAX_OWN_VIAS`] times (a
    /// Via with our sent-by and our branch prefix each time): a loop
    /// through us and a proxy (or two proxies), whatever its Request-URI
    /// and Route say, ended here instead of by Max-Forwards (70 passes).
    fn looped(&self, msg: &SipMsg<'_>) -> bool {
        // Only a request that already passed us can loop here.
        if memchr::memmem::find(msg.head().as_bytes(), BRANCH_PREFIX.as_bytes()).is_none() {
            return false;
        }
        msg.vias()
            .filter(|via| {
                via.branch.is_some_and(|b| b.starts_with(BRANCH_PREFIX))
                    && self.is_our_host(via.host, via.port)
            })
            .nth(MAX_OWN_VIAS)
            .is_some()
    }
}

/// One thread's handle on a [`Dispatcher`].
pub struct DispatchWorker<'d> {
    dispatcher: &'d Dispatcher,
    scratch: Vec<u8>,
    /// This thread's copy of the proxy set.
    targets: Arc<Targets>,
    /// Its generation.
    generation: u64,
}

impl DispatchWorker<'_> {
    /// Take the dispatcher's proxy set if a reload replaced it.
    fn refresh(&mut self) {
        let dispatcher = self.dispatcher;
        if dispatcher.generation.load(Ordering::Acquire) != self.generation {
            (self.targets, self.generation) = dispatcher.current();
        }
    }

    /// Handle one UDP datagram from `src` at `now` (ns); datagrams to send
    /// go to `out` (UDP only: a dispatcher with connection transports is
    /// driven with [`DispatchWorker::handle_from`]).
    pub fn handle(
        &mut self,
        now: u64,
        src: SocketAddr,
        datagram: &[u8],
        out: &mut dyn FnMut(SocketAddr, &[u8]),
    ) -> Outcome {
        self.handle_from(now, Hop::udp(src), datagram, &mut |hop, bytes| {
            out(hop.addr, bytes)
        })
    }

    /// Handle one message (a datagram, or one message framed off a
    /// connection) that came from `from` at `now` (ns); messages to send go
    /// to `out` with the hop they go over (a reply to a request that came
    /// over a connection names that connection).
    /// (The dispatcher keeps no timers per request: `now` is for the
    /// flood limiter's windows.)
    pub fn handle_from(
        &mut self,
        now: u64,
        from: Hop,
        datagram: &[u8],
        out: &mut dyn FnMut(Hop, &[u8]),
    ) -> Outcome {
        self.refresh();
        if let Some(dropped) = self.flood_check(now, from, datagram) {
            return dropped;
        }
        let msg = match SipMsg::parse(datagram) {
            Ok(msg) => msg,
            Err(crate::msg::ParseError::Empty) => {
                return self.dropped(MsgLabel::Malformed, DropReason::KeepAlive)
            }
            Err(_) => return self.dropped(MsgLabel::Malformed, DropReason::MalformedRequest),
        };
        if msg.is_request() {
            self.on_request(from, &msg, out)
        } else {
            self.on_response(from, &msg, out)
        }
    }

    /// Send the probes due at `now` (UDP proxies only: see
    /// [`DispatchWorker::on_timer_hops`]); returns how many.
    pub fn on_timer(&mut self, now: u64, out: &mut dyn FnMut(SocketAddr, &[u8])) -> usize {
        self.on_timer_hops(now, &mut |hop, bytes| out(hop.addr, bytes))
    }

    /// Send the probes due at `now`, each over its proxy's transport;
    /// returns how many.
    pub fn on_timer_hops(&mut self, now: u64, out: &mut dyn FnMut(Hop, &[u8])) -> usize {
        self.refresh();
        let dispatcher = self.dispatcher;
        let due = dispatcher.next_probe.load(Ordering::Relaxed);
        if now < due
            || dispatcher
                .next_probe
                .compare_exchange(
                    due,
                    now + dispatcher.config.probe_interval,
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                )
                .is_err()
        {
            return 0;
        }
        let mut sent = 0;
        for (index, member) in self.targets.members.iter().enumerate() {
            // Over the proxy's transport, from our address on it (the
            // driver refuses a proxy over a transport we do not listen on).
            let Some(via) = dispatcher.own_address(member.transport) else {
                continue;
            };
            let seq = member.next_probe(dispatcher.config.probe_failures);
            // Unguessable without our key: a spoofed answer cannot name it.
            let nonce = dispatcher.probe_nonce(index, seq);
            let to = match member.transport {
                Transport::Udp => member.address.to_string(),
                other => format!("{};transport={}", member.address, other.name()),
            };
            // RFC 5923 `alias` over TCP and TLS, as on requests: the
            // proxy takes it from the first probe on.
            let alias = if matches!(member.transport, Transport::Tcp | Transport::Tls) {
                ";alias"
            } else {
                ""
            };
            let probe = format!(
                "OPTIONS sip:{to} SIP/2.0\r\nVia: SIP/2.0/{token} {via};branch=z9hG4bK{PROBE_TAG}-{index}-{seq}-{nonce:016x}{alias}\r\n\
Max-Forwards: 70\r\nFrom: <sip:dispatch@{us}>;tag={PROBE_TAG}\r\nTo: <sip:{to}>\r\n\
Call-ID: {PROBE_TAG}-{index}-{seq}-{nonce:016x}@{us}\r\nCSeq: {seq} OPTIONS\r\nContent-Length: 0\r\n\r\n",
                token = member.transport.via_token(),
                via = via.sent_by,
                us = dispatcher.own[0].sent_by,
            );
            if sendable(&member.address) {
                out(member.hop(), probe.as_bytes());
                add(&dispatcher.counters.probes_sent);
                sent += 1;
            }
        }
        sent
    }

    /// Count a datagram against its source's flood limit (a response a
    /// quarter of a request, keep-alives not at all), before any parse;
    /// the outcome if it is dropped (unanswered: a reply to a spoofed
    /// source would make us the flood).
    fn flood_check(&self, now: u64, from: Hop, datagram: &[u8]) -> Option<Outcome> {
        let d = self.dispatcher;
        let flood = d.flood.as_ref()?;
        // Proxies a reload added are exempt like those at start.
        if self.targets.is_proxy(from) {
            return None;
        }
        match flood.check_datagram(from.addr.ip(), datagram, now) {
            FloodCheck::Pass => None,
            FloodCheck::Untracked => {
                add(&d.counters.flood_untracked);
                None
            }
            FloodCheck::Drop { newly, label } => {
                if newly {
                    add(&d.counters.flood_blocks);
                }
                Some(self.dropped(label, DropReason::Flood))
            }
        }
    }

    fn dropped(&self, label: MsgLabel, reason: DropReason) -> Outcome {
        *self
            .dispatcher
            .counters
            .drops
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(reason.as_str())
            .or_default() += 1;
        Outcome {
            label,
            action: Action::Dropped(reason),
        }
    }

    fn on_response(
        &mut self,
        from: Hop,
        msg: &SipMsg<'_>,
        out: &mut dyn FnMut(Hop, &[u8]),
    ) -> Outcome {
        let dispatcher = self.dispatcher;
        add(&dispatcher.counters.responses_received);
        let code = msg.status().unwrap_or(0);
        let label = MsgLabel::Response(code);
        let Some(top) = msg.top_via() else {
            return self.dropped(label, DropReason::MalformedResponse);
        };
        let ours = dispatcher.is_our_host(top.host, top.port);
        // Not sent by us: relaying it would make us a reflector for
        // whatever address its next Via names.
        if !ours {
            return self.dropped(label, DropReason::ResponseNotOurs);
        }
        // Answers to our own OPTIONS probes feed the health state and go
        // no further.
        if let Some(probe) = top
            .branch
            .and_then(|b| b.get(7..))
            .filter(|b| b.starts_with(PROBE_TAG))
        {
            if let Some((index, seq, nonce)) = parse_probe_id(probe) {
                let member = self
                    .targets
                    .members
                    .get(index)
                    .filter(|m| m.address == from.addr);
                let genuine = nonce == dispatcher.probe_nonce(index, seq);
                // Only the probed member's final answer with our nonce: a
                // spoofed 200 must not revive a member that is down.
                if let Some(member) = member.filter(|_| genuine && code >= 200) {
                    member.probe_answered(seq, code, dispatcher.config.probe_failures);
                    add(&dispatcher.counters.probe_answers);
                }
            }
            return Outcome {
                label,
                action: Action::Absorbed,
            };
        }
        let Some((hash, mac)) = top.branch.and_then(Dispatcher::parse_branch) else {
            return self.dropped(label, DropReason::ResponseNotOurs);
        };
        let Some((to, transport)) = msg.second_via().and_then(|next| {
            let transport = Transport::from_via_token(next.transport).unwrap_or_default();
            Some((next.response_target()?, transport))
        }) else {
            return self.dropped(label, DropReason::UnroutableResponse);
        };
        // The MAC binds our branch to where its responses go: a response
        // with a second Via rewritten to a victim's address fails here.
        if dispatcher.upstream_mac(hash, to) != mac {
            return self.dropped(label, DropReason::ResponseNotOurs);
        }
        if !sendable(&to) || dispatcher.is_own_address(to) {
            return self.dropped(label, DropReason::ForbiddenDestination);
        }
        self.scratch.clear();
        match forward_response(msg, &mut self.scratch) {
            Ok(_) => {
                // Over the connection the request came in on (the driver
                // finds it by the address: its source, in `received` and
                // `rport`), else as the Via says.
                out(dispatcher.hop_over(transport, to), &self.scratch);
                add(&dispatcher.counters.responses_forwarded);
                Outcome {
                    label,
                    action: Action::Forwarded { copies: 1 },
                }
            }
            Err(_) => self.dropped(label, DropReason::MalformedResponse),
        }
    }

    fn on_request(
        &mut self,
        from: Hop,
        msg: &SipMsg<'_>,
        out: &mut dyn FnMut(Hop, &[u8]),
    ) -> Outcome {
        let dispatcher = self.dispatcher;
        add(&dispatcher.counters.requests_received);
        let method = msg.method().unwrap_or(Method::Other(""));
        // RFC 3261 18.2.2 / RFC 3581: the source IP always; the Via's port
        // unless the client asked for rport (NAT: the source port) or it
        // came over a connection (whose peer the responses follow).
        let upstream = crate::proxy::upstream_address(from, msg.top_via().as_ref());
        let request = Incoming {
            from,
            msg,
            method,
            label: MsgLabel::of_method(method),
            upstream,
            reply: crate::proxy::reply_hop(from, upstream),
        };
        if msg.max_forwards() == Some(0) {
            return self.respond(&request, 483, "Too Many Hops", out);
        }
        if dispatcher.looped(msg) {
            return self.respond(&request, 482, "Loop Detected", out);
        }
        // Our own Route values on top (we Record-Routed, maybe twice).
        let popped = msg.routes().take_while(|r| dispatcher.is_us(r.uri)).count();
        let to_us = msg.request_uri().is_some_and(|u| dispatcher.is_us(u));
        if method == Method::Options
            && to_us
            && msg.routes().nth(popped).is_none()
            && msg.request_sip_uri().is_some_and(|u| u.user.is_none())
        {
            return self.respond(&request, 200, "OK", out);
        }
        let next = match dispatcher.next_hop(&self.targets, msg, method, from, popped) {
            Ok(next) => next,
            Err((code, reason)) => {
                if code == 503 {
                    add(&dispatcher.counters.no_proxy);
                }
                return self.respond(&request, code, reason, out);
            }
        };
        let to = match next {
            Next::Proxy(index) => self.targets.members[index].hop(),
            Next::Route(to) | Next::RequestUri(to) => to,
        };
        // A proxy applied its own policy to what it sends us.
        let from_member = self.targets.is_proxy(from);
        if let Some(refused) = self.refuse_relay(&request, to.addr, from_member, out) {
            return refused;
        }
        dispatcher.count_next_hop(&self.targets, &next);
        // Pop our Route values (all at once), and an initial request's
        // preloaded ones from outside.
        let pop_routes = if !from_member && msg.to_tag().is_none() {
            msg.routes().count()
        } else {
            popped
        };
        self.forward(&request, &next, to, pop_routes, out)
    }

    /// Answer `request` ourselves with `code` (never an ACK, never to a
    /// destination we may not send to); a 503 says when to retry.
    fn respond(
        &mut self,
        request: &Incoming<'_, '_>,
        code: u16,
        reason: &str,
        out: &mut dyn FnMut(Hop, &[u8]),
    ) -> Outcome {
        let dispatcher = self.dispatcher;
        let label = request.label;
        // An ACK is never answered (RFC 3261 17): one we cannot route ends here.
        if request.method == Method::Ack {
            return self.dropped(label, DropReason::AckNotRoutable);
        }
        if !sendable(&request.upstream) {
            return self.dropped(label, DropReason::ForbiddenDestination);
        }
        // Stateless, yet a retransmission gets the same To-tag: a keyed
        // MAC of its Call-ID (neither guessable nor telling of our key).
        let tag = dispatcher.keys.tag(
            Purpose::LocalTag,
            request.msg.call_id().unwrap_or("").as_bytes(),
        );
        let retry = [("Retry-After", "5")];
        let extra: &[(&str, &str)] = if code == 503 { &retry } else { &[] };
        self.scratch.clear();
        build_response(
            request.msg,
            code,
            reason,
            extra,
            Some(tag.as_str()),
            &mut self.scratch,
        );
        // The proxy's bound towards an unverified source (threat model,
        // point 3): a generated answer is at most 4 times the request it
        // answers, else not sent.
        if self.scratch.len() > AMPLIFICATION_LIMIT * request.msg.as_bytes().len() {
            return self.dropped(label, DropReason::ReplyTooLarge);
        }
        out(request.reply, &self.scratch);
        *dispatcher
            .counters
            .responses_generated
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(code)
            .or_default() += 1;
        Outcome {
            label,
            action: Action::Responded(code),
        }
    }

    /// What the relay policy says about sending `request` to `to`: `None`
    /// when it may go, else the drop or the 403/482 answer.
    fn refuse_relay(
        &mut self,
        request: &Incoming<'_, '_>,
        to: SocketAddr,
        from_member: bool,
        out: &mut dyn FnMut(Hop, &[u8]),
    ) -> Option<Outcome> {
        let dispatcher = self.dispatcher;
        let grant = if from_member {
            Grant::Authenticated
        } else {
            Grant::None
        };
        let refusal = self.targets.relay.check(to, grant).err()?;
        if refusal == Refusal::Unsendable {
            return Some(self.dropped(request.label, DropReason::ForbiddenDestination));
        }
        add(&dispatcher.counters.relay_refused);
        if matches!(request.method, Method::Ack | Method::Cancel) {
            return Some(self.dropped(request.label, DropReason::NotRelayed));
        }
        Some(match refusal {
            Refusal::OwnAddress => self.respond(request, 482, "Loop Detected", out),
            _ => self.respond(request, 403, "Forbidden - Not Relaying", out),
        })
    }

    /// Forward `request` to `to` with our Via (received/rport from its real
    /// source), Record-Route on dialog-creating requests (one per side when
    /// the transports differ), Path on a REGISTER to a proxy, and
    /// `pop_routes` Route values removed.
    fn forward(
        &mut self,
        request: &Incoming<'_, '_>,
        next: &Next,
        to: Hop,
        pop_routes: usize,
        out: &mut dyn FnMut(Hop, &[u8]),
    ) -> Outcome {
        let dispatcher = self.dispatcher;
        let (msg, method, src) = (request.msg, request.method, request.from.addr);
        // Our address on the way out, and on the way in.
        let (Some(egress), Some(ingress)) = (
            dispatcher.own_address(to.transport),
            dispatcher.own_address(request.from.transport),
        ) else {
            // Only a driver that hands us a transport we do not listen on.
            return self.dropped(request.label, DropReason::ForbiddenDestination);
        };
        let over_connection = request.from.transport.is_reliable();
        let dialog_creating = matches!(
            method,
            Method::Invite | Method::Subscribe | Method::Refer | Method::Notify
        ) && msg.to_tag().is_none();
        let mut branch = [0u8; 48];
        let branch_len = dispatcher.branch(msg, request.upstream, &mut branch);
        let branch = std::str::from_utf8(&branch[..branch_len]).unwrap_or("z9hG4bKrwd");
        // received/rport from the real source, replacing the sender's.
        let ip_text = msg
            .top_via()
            .filter(|via| via.received.is_some() || host_ip(via.host) != Some(src.ip()))
            .map(|_| src.ip().to_string());
        let record_route = dispatcher.config.record_route && dialog_creating;
        let edits = RequestEdits {
            via: Some(ViaEdit {
                transport: to.transport.via_token(),
                sent_by: &egress.sent_by,
                branch,
                // RFC 5923: the proxy may send its requests for us (a
                // registered user's calls through our Path, the far side's
                // in-dialog requests) over the connection we opened.
                alias: matches!(to.transport, Transport::Tcp | Transport::Tls),
            }),
            max_forwards: true,
            record_route: record_route.then_some(egress.uri.as_str()),
            // Two transports: a Record-Route for each side, the far side's
            // on top, so each side reaches us over its own transport.
            record_route_inner: (record_route && !std::ptr::eq(egress, ingress))
                .then_some(ingress.uri.as_str()),
            path: (method == Method::Register && matches!(next, Next::Proxy(_)))
                .then_some(egress.uri.as_str()),
            received: ip_text.as_deref(),
            // Over a connection always (RFC 3261 18.2.2: its responses
            // follow the connection's peer port).
            rport: msg
                .top_via()
                .filter(|via| via.rport_flag || over_connection)
                .map(|_| src.port()),
            add_rport: over_connection,
            pop_routes,
            ..RequestEdits::default()
        };
        self.scratch.clear();
        match forward_request(msg, &edits, &mut self.scratch) {
            Ok(_) => {
                out(to, &self.scratch);
                Outcome {
                    label: request.label,
                    action: Action::Forwarded { copies: 1 },
                }
            }
            Err(crate::edit::EditError::TooLarge) => {
                self.dropped(request.label, DropReason::TooLarge)
            }
            Err(_) => self.dropped(request.label, DropReason::MalformedRequest),
        }
    }
}

/// A received request and what answering or forwarding it needs.
struct Incoming<'a, 'm> {
    /// Where it came from (a connection: its peer and flow).
    from: Hop,
    msg: &'a SipMsg<'m>,
    method: Method<'m>,
    label: MsgLabel,
    /// Where responses to it go: the top Via's sent-by port at the
    /// source's address, or the source itself with rport or over a
    /// connection.
    upstream: SocketAddr,
    /// The hop our own answers go over: the request's connection, or
    /// `upstream` over UDP.
    reply: Hop,
}

impl Dispatcher {
    /// Count a request by where it goes.
    fn count_next_hop(&self, targets: &Targets, next: &Next) {
        match next {
            Next::Proxy(index) => {
                add(&targets.members[*index].requests);
                add(&self.counters.requests_dispatched);
            }
            Next::Route(_) => add(&self.counters.requests_routed),
            Next::RequestUri(_) => add(&self.counters.requests_to_uri),
        }
    }
}
