//! Flows of the registrar's bindings, and their death: keepalives towards
//! UDP bindings behind NAT, and bindings removed when their flow dies.
//!
//! - The registrar's store is wrapped ([`WatchedStore`]): a REGISTER that
//!   stored a binding with a flow (the source address of a UDP REGISTER
//!   from behind a NAT, or the connection of a TCP/TLS/WS one) enters that
//!   flow here. Nothing else does: keepalives go only to addresses the
//!   registrar accepted as a binding's flow, never to one a sender wrote.
//! - UDP: every `interval` an OPTIONS (like Kamailio's nathelper
//!   `sipping`) goes to the flow's address from the proxy's own port, so
//!   the NAT mapping stays open. Its answer (any status) comes back to a
//!   UDP worker, which hands it here ([`FlowMonitor::is_keepalive_reply`]
//!   then [`FlowMonitor::on_reply`]) instead of to the core; the branch
//!   carries a MAC (SipHash under a random key) of the flow's address and
//!   the ping's sequence number, and the answer must come from that
//!   address: a UA that sees its own pings learns nothing that answers
//!   another flow's. `failures` pings in a row unanswered: the flow is
//!   dead and its bindings are removed (counted). A UA that keeps its flow
//!   alive itself with RFC 5626 STUN keepalives (outbound) is answered by
//!   the worker, and each keepalive counts as an answer.
//! - Connections: when a connection closes, the bindings registered over
//!   it are removed (counted): requests to them could only be dropped (we
//!   never open a connection towards a flow).
//! - In memory and in Redis alike: over Redis the store threads report
//!   what REGISTERs stored, and the removals of closed connections wait
//!   for the keepalive thread ([`FlowMonitor::deferring_removals`]), so an
//!   event loop never waits for a round trip.
//! - Bounded: at most `capacity` flows of each kind (the store's binding
//!   bound), at most [`MAX_AORS_PER_FLOW`] AORs per flow, pings at most
//!   `rate` per second (what is not sent waits for the next tick).

use ringway_sip::hash::MacKey;
use ringway_sip::registrar::{Binding, LocationStore, Registration, StoreAnswer};
use ringway_sip::{FlowId, Hop, Transport};
use serde::{Deserialize, Serialize};
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

/// AORs one flow may carry (a PBX registering many lines over one trunk).
pub const MAX_AORS_PER_FLOW: usize = 64;
/// The branch prefix of our keepalive OPTIONS.
const BRANCH_PREFIX: &[u8] = b"branch=z9hG4bK-rwka-";

/// How the monitor runs (from the server's configuration).
#[derive(Clone, Copy, Debug)]
pub struct KeepaliveConfig {
    /// Ping interval for UDP flows (ns; `None`: no pings, connections are
    /// still watched).
    pub interval: Option<u64>,
    /// Unanswered pings in a row after which a UDP flow is dead.
    pub failures: u32,
    /// Pings per second at most.
    pub rate: u32,
    /// Flows of each kind tracked at most.
    pub capacity: usize,
}

/// One UDP flow and its keepalive state.
struct UdpFlow {
    aors: Vec<String>,
    /// Latest expiry of a binding over it (ns).
    expires_at: u64,
    /// When the next ping is due (ns); the heap entry with this time is
    /// the live one.
    next_due: u64,
    /// Sequence number of the last ping.
    seq: u32,
    /// The last ping is not answered yet.
    outstanding: bool,
    /// Pings in a row unanswered.
    failures: u32,
}

#[derive(Default)]
struct State {
    udp: HashMap<SocketAddr, UdpFlow>,
    due: BinaryHeap<Reverse<(u64, SocketAddr)>>,
    connections: HashMap<u64, (Hop, Vec<String>)>,
    /// Closed connections whose bindings wait for [`FlowMonitor::run_removals`]
    /// (a shared store is not called from the event loop that saw the close).
    closed: Vec<(Hop, Vec<String>)>,
    /// Rate limiter: pings that may still go (refilled per tick).
    budget: f64,
    last_refill: u64,
}

#[derive(Default)]
struct Counters {
    sent: AtomicU64,
    replies: AtomicU64,
    stun: AtomicU64,
    send_errors: AtomicU64,
    rate_limited: AtomicU64,
    untracked: AtomicU64,
    dead_udp: AtomicU64,
    removed_keepalive: AtomicU64,
    removed_closed: AtomicU64,
}

/// The monitor's counters at one moment (summary `keepalive`, metrics).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeepaliveSnapshot {
    /// UDP flows with bindings tracked now.
    pub udp_flows: u64,
    /// Connections with bindings tracked now.
    pub connection_flows: u64,
    /// Keepalive OPTIONS sent.
    pub sent: u64,
    /// Answers to them (any status, from the flow's address).
    pub replies: u64,
    /// RFC 5626 STUN keepalives answered.
    pub stun: u64,
    /// Pings the kernel refused.
    pub send_errors: u64,
    /// Ticks that left due pings for later (the rate bound).
    pub rate_limited: u64,
    /// Flows not tracked (beyond the capacity or the AORs per flow).
    pub untracked: u64,
    /// UDP flows found dead (keepalives unanswered).
    pub dead_udp_flows: u64,
    /// Bindings removed because their UDP flow left keepalives unanswered.
    pub removed_keepalive: u64,
    /// Bindings removed because their connection closed.
    pub removed_connection_closed: u64,
}

/// Flows of the bindings, their keepalives and their removal.
pub struct FlowMonitor {
    store: Arc<dyn LocationStore>,
    config: KeepaliveConfig,
    /// Our UDP address (Via sent-by, From).
    local: SocketAddr,
    /// Random per process: every ping's branch carries a MAC under it.
    key: MacKey,
    state: Mutex<State>,
    counters: Counters,
    reply_finder: memchr::memmem::Finder<'static>,
    /// Removals after a connection closes wait for the keepalive thread
    /// (a shared store: a round trip the event loop must not wait for).
    deferred: bool,
}

impl FlowMonitor {
    /// A monitor of the bindings of `store` (the store itself, not the
    /// [`WatchedStore`] around it).
    pub fn new(
        store: Arc<dyn LocationStore>,
        config: KeepaliveConfig,
        local: SocketAddr,
        key: [u8; 16],
    ) -> FlowMonitor {
        FlowMonitor {
            store,
            config,
            local,
            key: MacKey::new(key),
            state: Mutex::new(State::default()),
            counters: Counters::default(),
            reply_finder: memchr::memmem::Finder::new(BRANCH_PREFIX),
            deferred: false,
        }
    }

    /// The same monitor over a shared store (Redis): the bindings of a
    /// closed connection are removed by the keepalive thread
    /// ([`FlowMonitor::run_removals`]), not by the event loop that saw it
    /// close.
    pub fn deferring_removals(mut self) -> FlowMonitor {
        self.deferred = true;
        self
    }

    /// Whether the keepalive thread has work: pings, or deferred removals.
    pub fn needs_thread(&self) -> bool {
        self.pings() || self.deferred
    }

    /// Whether UDP flows are pinged.
    pub fn pings(&self) -> bool {
        self.config.interval.is_some()
    }

    /// A REGISTER stored `bindings` for `aor` with `flow`: track the flow.
    fn track(&self, aor: &str, flow: Hop, bindings: &[Binding], now: u64) {
        let Some(expires_at) = bindings
            .iter()
            .filter(|b| b.flow == Some(flow))
            .map(|b| b.expires_at)
            .max()
        else {
            return;
        };
        let mut state = lock(&self.state);
        let capacity = self.config.capacity;
        let add_aor = |aors: &mut Vec<String>| {
            if aors.iter().any(|a| a == aor) {
                true
            } else if aors.len() < MAX_AORS_PER_FLOW {
                aors.push(aor.to_string());
                true
            } else {
                false
            }
        };
        let tracked = match (flow.flow, flow.transport) {
            (Some(id), _) => {
                let full = state.connections.len() >= capacity;
                match state.connections.get_mut(&id.0) {
                    Some((_, aors)) => add_aor(aors),
                    None if full => false,
                    None => {
                        state
                            .connections
                            .insert(id.0, (flow, vec![aor.to_string()]));
                        true
                    }
                }
            }
            (None, Transport::Udp) => {
                let Some(interval) = self.config.interval else {
                    return;
                };
                let full = state.udp.len() >= capacity;
                match state.udp.get_mut(&flow.addr) {
                    Some(entry) => {
                        entry.expires_at = entry.expires_at.max(expires_at);
                        add_aor(&mut entry.aors)
                    }
                    None if full => false,
                    None => {
                        let due = now.saturating_add(interval);
                        state.udp.insert(
                            flow.addr,
                            UdpFlow {
                                aors: vec![aor.to_string()],
                                expires_at,
                                next_due: due,
                                seq: 0,
                                outstanding: false,
                                failures: 0,
                            },
                        );
                        state.due.push(Reverse((due, flow.addr)));
                        true
                    }
                }
            }
            // A connection transport without a connection: not ours.
            (None, _) => true,
        };
        if !tracked {
            add(&self.counters.untracked);
        }
    }

    /// The connection `id` closed: remove the bindings registered over it.
    pub fn connection_closed(&self, id: FlowId, now: u64) {
        let mut state = lock(&self.state);
        let Some((hop, aors)) = state.connections.remove(&id.0) else {
            return;
        };
        if self.deferred {
            // Bounded like the flows themselves.
            if state.closed.len() < self.config.capacity {
                state.closed.push((hop, aors));
            } else {
                add(&self.counters.untracked);
            }
            return;
        }
        drop(state);
        self.remove_closed(hop, &aors, now);
    }

    /// Remove the bindings of the connections that closed since the last
    /// call (deferred mode; the keepalive thread calls it every tick).
    pub fn run_removals(&self, now: u64) {
        let closed = std::mem::take(&mut lock(&self.state).closed);
        for (hop, aors) in closed {
            self.remove_closed(hop, &aors, now);
        }
    }

    /// The bindings of `aors` registered over the closed connection `hop`
    /// go (counted).
    fn remove_closed(&self, hop: Hop, aors: &[String], now: u64) {
        let removed: usize = aors
            .iter()
            .map(|aor| self.store.remove_flow(aor, &hop, now))
            .sum();
        if removed > 0 {
            log::info!(
                "sip keepalive: {removed} binding(s) removed: their {} connection from {} closed",
                hop.transport,
                hop.addr
            );
        }
        add_n(&self.counters.removed_closed, removed as u64);
    }

    /// Whether `datagram` is an answer to one of our keepalives (a cheap
    /// look for our branch in a response; [`FlowMonitor::on_reply`] checks
    /// the rest).
    pub fn is_keepalive_reply(&self, datagram: &[u8]) -> bool {
        self.pings()
            && datagram.starts_with(b"SIP/2.0 ")
            && self.reply_finder.find(datagram).is_some()
    }

    /// An answer from `peer` to a keepalive: the flow at `peer` is alive
    /// if it answers its last ping (its sequence number, with our MAC of
    /// `peer` and that number).
    pub fn on_reply(&self, peer: SocketAddr, datagram: &[u8]) {
        let Some(at) = self.reply_finder.find(datagram) else {
            return;
        };
        let rest = &datagram[at + BRANCH_PREFIX.len()..];
        let end = rest
            .iter()
            .position(|b| !(b.is_ascii_hexdigit() || *b == b'-'))
            .unwrap_or(rest.len());
        let Some((mac, seq)) = std::str::from_utf8(&rest[..end])
            .ok()
            .and_then(|s| s.split_once('-'))
        else {
            return;
        };
        let (Ok(mac), Ok(seq)) = (u64::from_str_radix(mac, 16), u32::from_str_radix(seq, 16))
        else {
            return;
        };
        if mac != self.ping_mac(peer, seq) {
            return;
        }
        let mut state = lock(&self.state);
        if let Some(flow) = state.udp.get_mut(&peer) {
            if flow.outstanding && flow.seq == seq {
                flow.outstanding = false;
                flow.failures = 0;
                add(&self.counters.replies);
            }
        }
    }

    /// An RFC 5626 STUN keepalive (a Binding request) came from `peer`:
    /// the answer to send back, if `peer` is a tracked flow or the answer
    /// is no larger than the request (no amplification towards an address
    /// a sender merely claims). The flow is alive, as if it had answered
    /// its last ping.
    pub fn on_stun(&self, peer: SocketAddr, request: &[u8]) -> Option<StunAnswer> {
        let answer = stun_binding_answer(request, peer)?;
        let known = {
            let mut state = lock(&self.state);
            match state.udp.get_mut(&peer) {
                Some(flow) => {
                    flow.outstanding = false;
                    flow.failures = 0;
                    true
                }
                None => false,
            }
        };
        if !known && answer.len > request.len() {
            return None;
        }
        add(&self.counters.stun);
        Some(answer)
    }

    /// Send the pings due at `now` (within the rate bound) through `send`,
    /// and remove the bindings of flows that left `failures` pings in a row
    /// unanswered.
    pub fn run_due(&self, now: u64, send: &mut dyn FnMut(SocketAddr, &[u8]) -> bool) {
        let Some(interval) = self.config.interval else {
            return;
        };
        let mut dead = Vec::new();
        let mut due_pings = Vec::new();
        {
            let mut state = lock(&self.state);
            let rate = f64::from(self.config.rate);
            let elapsed = now.saturating_sub(state.last_refill) as f64 / 1e9;
            state.budget = (state.budget + elapsed * rate).min(rate.max(1.0));
            state.last_refill = now;
            while let Some(&Reverse((due, addr))) = state.due.peek() {
                if due > now {
                    break;
                }
                if state.budget < 1.0 {
                    add(&self.counters.rate_limited);
                    break;
                }
                state.due.pop();
                let Some(flow) = state.udp.get_mut(&addr) else {
                    continue;
                };
                if flow.next_due != due {
                    continue;
                }
                if flow.expires_at <= now {
                    state.udp.remove(&addr);
                    continue;
                }
                if flow.outstanding {
                    flow.failures += 1;
                    if flow.failures >= self.config.failures {
                        if let Some(flow) = state.udp.remove(&addr) {
                            dead.push((addr, flow.aors));
                        }
                        continue;
                    }
                }
                flow.seq = flow.seq.wrapping_add(1);
                flow.outstanding = true;
                flow.next_due = now.saturating_add(interval);
                let (seq, next, aors) = (flow.seq, flow.next_due, flow.aors.clone());
                state.due.push(Reverse((next, addr)));
                state.budget -= 1.0;
                due_pings.push((addr, aors, seq));
            }
        }
        // Outside the lock: the store may be remote (Redis), and the store
        // threads report REGISTERs through the same lock.
        let mut message = String::new();
        for (addr, aors, seq) in due_pings {
            // The flow's binding still there? (An unregistered one is no
            // longer pinged.) Its Contact is the Request-URI.
            let hop = Hop::udp(addr);
            let mut unavailable = false;
            let contact = aors
                .iter()
                .find_map(|aor| match self.store.lookup(aor, now) {
                    Ok(bindings) => bindings
                        .into_iter()
                        .find(|b| b.flow == Some(hop))
                        .map(|b| b.contact),
                    Err(_) => {
                        unavailable = true;
                        None
                    }
                });
            let Some(contact) = contact else {
                let mut state = lock(&self.state);
                if state.udp.get(&addr).is_some_and(|flow| flow.seq == seq) {
                    if !unavailable {
                        state.udp.remove(&addr);
                    } else if let Some(flow) = state.udp.get_mut(&addr) {
                        // The store did not answer: no ping this time, and
                        // no failure counted for it.
                        flow.outstanding = false;
                    }
                }
                continue;
            };
            message.clear();
            self.write_options(&mut message, addr, &contact, seq);
            if send(addr, message.as_bytes()) {
                add(&self.counters.sent);
            } else {
                add(&self.counters.send_errors);
            }
        }
        for (addr, aors) in dead {
            add(&self.counters.dead_udp);
            let hop = Hop::udp(addr);
            let removed: usize = aors
                .iter()
                .map(|aor| self.store.remove_flow(aor, &hop, now))
                .sum();
            log::info!(
                "sip keepalive: udp flow {addr} left {} keepalives unanswered: \
                 {removed} binding(s) removed",
                self.config.failures
            );
            add_n(&self.counters.removed_keepalive, removed as u64);
        }
    }

    /// The MAC in ping `seq`'s branch to the flow at `flow`.
    fn ping_mac(&self, flow: SocketAddr, seq: u32) -> u64 {
        self.key.mac().addr(flow).u64(u64::from(seq)).finish()
    }

    /// Keepalive OPTIONS `seq` to `contact` (an URI the registrar stored)
    /// over the flow at `flow`.
    fn write_options(&self, out: &mut String, flow: SocketAddr, contact: &str, seq: u32) {
        let local = self.local;
        let mac = self.ping_mac(flow, seq);
        let _ = write!(
            out,
            "OPTIONS {contact} SIP/2.0\r\n\
             Via: SIP/2.0/UDP {local};branch=z9hG4bK-rwka-{mac:016x}-{seq:x};rport\r\n\
             Max-Forwards: 70\r\n\
             From: <sip:keepalive@{local}>;tag=rwka{mac:016x}\r\n\
             To: <{contact}>\r\n\
             Call-ID: rwka-{mac:016x}-{seq:x}@{local}\r\n\
             CSeq: {seq} OPTIONS\r\n\
             Content-Length: 0\r\n\r\n"
        );
    }

    /// The counters now.
    pub fn snapshot(&self) -> KeepaliveSnapshot {
        let (udp, connections) = {
            let state = lock(&self.state);
            (state.udp.len() as u64, state.connections.len() as u64)
        };
        let c = &self.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        KeepaliveSnapshot {
            udp_flows: udp,
            connection_flows: connections,
            sent: get(&c.sent),
            replies: get(&c.replies),
            stun: get(&c.stun),
            send_errors: get(&c.send_errors),
            rate_limited: get(&c.rate_limited),
            untracked: get(&c.untracked),
            dead_udp_flows: get(&c.dead_udp),
            removed_keepalive: get(&c.removed_keepalive),
            removed_connection_closed: get(&c.removed_closed),
        }
    }
}

/// The STUN magic cookie (RFC 5389 6).
const STUN_COOKIE: [u8; 4] = [0x21, 0x12, 0xa4, 0x42];

/// Whether `datagram` looks like a STUN message (RFC 5389 6: the two top
/// bits zero, the magic cookie); SIP starts with a letter.
pub fn is_stun(datagram: &[u8]) -> bool {
    datagram.len() >= 20 && datagram[0] & 0xc0 == 0 && datagram[4..8] == STUN_COOKIE
}

/// A STUN Binding success response (at most 44 bytes).
pub struct StunAnswer {
    bytes: [u8; 44],
    len: usize,
}

impl StunAnswer {
    /// The bytes to send.
    pub fn bytes(&self) -> &[u8] {
        &self.bytes[..self.len]
    }
}

/// The Binding success response to a Binding `request` from `peer`, with
/// its XOR-MAPPED-ADDRESS (RFC 5389 15.2); `None` for anything else or a
/// malformed request (attributes are not read: a keepalive needs none).
fn stun_binding_answer(request: &[u8], peer: SocketAddr) -> Option<StunAnswer> {
    if !is_stun(request) || request[0..2] != [0x00, 0x01] {
        return None;
    }
    let length = usize::from(u16::from_be_bytes([request[2], request[3]]));
    if length != request.len() - 20 || length % 4 != 0 {
        return None;
    }
    let mut bytes = [0u8; 44];
    bytes[0..2].copy_from_slice(&[0x01, 0x01]);
    bytes[4..20].copy_from_slice(&request[4..20]);
    let port = peer.port() ^ 0x2112;
    let value_len: usize = match peer.ip() {
        std::net::IpAddr::V4(ip) => {
            bytes[24..28].copy_from_slice(&[0, 1, (port >> 8) as u8, port as u8]);
            for (i, b) in ip.octets().iter().enumerate() {
                bytes[28 + i] = b ^ STUN_COOKIE[i];
            }
            8
        }
        std::net::IpAddr::V6(ip) => {
            bytes[24..28].copy_from_slice(&[0, 2, (port >> 8) as u8, port as u8]);
            for (i, b) in ip.octets().iter().enumerate() {
                bytes[28 + i] = b ^ request[4 + i];
            }
            20
        }
    };
    bytes[20..22].copy_from_slice(&[0x00, 0x20]);
    bytes[22..24].copy_from_slice(&(value_len as u16).to_be_bytes());
    let len = 24 + value_len;
    bytes[2..4].copy_from_slice(&((len - 20) as u16).to_be_bytes());
    Some(StunAnswer { bytes, len })
}

/// The registrar's store with its flows watched by a [`FlowMonitor`].
pub struct WatchedStore {
    inner: Arc<dyn LocationStore>,
    monitor: Arc<FlowMonitor>,
}

impl WatchedStore {
    /// `inner`, with what REGISTERs store over a flow reported to `monitor`.
    pub fn new(inner: Arc<dyn LocationStore>, monitor: Arc<FlowMonitor>) -> WatchedStore {
        WatchedStore { inner, monitor }
    }
}

impl LocationStore for WatchedStore {
    fn register(&self, registration: &Registration, now: u64) -> StoreAnswer {
        let answer = self.inner.register(registration, now);
        if let (Ok(bindings), Some(flow)) = (&answer, registration.flow) {
            self.monitor.track(&registration.aor, flow, bindings, now);
        }
        answer
    }

    fn lookup(&self, aor: &str, now: u64) -> StoreAnswer {
        self.inner.lookup(aor, now)
    }

    fn expire(&self, now: u64) -> usize {
        self.inner.expire(now)
    }

    fn len(&self) -> Option<usize> {
        self.inner.len()
    }

    fn bytes(&self) -> Option<usize> {
        self.inner.bytes()
    }

    fn aors(&self, max: usize) -> Option<Vec<String>> {
        self.inner.aors(max)
    }

    fn remove_flow(&self, aor: &str, flow: &Hop, now: u64) -> usize {
        self.inner.remove_flow(aor, flow, now)
    }

    fn remove_path(&self, aor: &str, path: &[String], now: u64) -> usize {
        self.inner.remove_path(aor, path, now)
    }
}

fn add(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

fn add_n(counter: &AtomicU64, n: u64) {
    counter.fetch_add(n, Ordering::Relaxed);
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ringway_sip::registrar::{BindingChange, MemoryStore};

    const S: u64 = 1_000_000_000;

    fn monitor(store: Arc<dyn LocationStore>) -> Arc<FlowMonitor> {
        Arc::new(FlowMonitor::new(
            store,
            KeepaliveConfig {
                interval: Some(S),
                failures: 2,
                rate: 1000,
                capacity: 100,
            },
            "192.0.2.10:5060".parse().unwrap(),
            [0xab; 16],
        ))
    }

    fn register(store: &WatchedStore, aor: &str, flow: Hop, now: u64) {
        store
            .register(
                &Registration {
                    aor: aor.into(),
                    call_id: format!("c-{aor}"),
                    cseq: 1,
                    path: Vec::new(),
                    flow: Some(flow),
                    changes: vec![BindingChange::Bind {
                        contact: format!("sip:{aor}@10.0.0.1:5060"),
                        expires: 3600,
                        outbound: None,
                    }],
                    max_contacts: 4,
                },
                now,
            )
            .unwrap();
    }

    fn sent_to(monitor: &FlowMonitor, now: u64) -> Vec<(SocketAddr, String)> {
        let mut sent = Vec::new();
        monitor.run_due(now, &mut |addr, bytes| {
            sent.push((addr, String::from_utf8_lossy(bytes).into_owned()));
            true
        });
        sent
    }

    fn answer(ping: &str) -> Vec<u8> {
        let via = ping.lines().find(|l| l.starts_with("Via:")).unwrap();
        format!("SIP/2.0 200 OK\r\n{via}\r\nContent-Length: 0\r\n\r\n").into_bytes()
    }

    #[test]
    fn answered_pings_keep_a_flow_and_unanswered_ones_remove_its_bindings() {
        let inner: Arc<dyn LocationStore> = Arc::new(MemoryStore::new(100));
        let monitor = monitor(inner.clone());
        let store = WatchedStore::new(inner.clone(), monitor.clone());
        let nat: SocketAddr = "192.0.2.7:40000".parse().unwrap();
        register(&store, "alice", Hop::udp(nat), 0);
        assert!(sent_to(&monitor, S / 2).is_empty(), "not due yet");
        let mut now = S;
        for _ in 0..5 {
            let sent = sent_to(&monitor, now);
            assert_eq!(sent.len(), 1);
            assert_eq!(sent[0].0, nat);
            assert!(sent[0]
                .1
                .starts_with("OPTIONS sip:alice@10.0.0.1:5060 SIP/2.0\r\n"));
            let reply = answer(&sent[0].1);
            assert!(monitor.is_keepalive_reply(&reply));
            // From elsewhere: not an answer.
            monitor.on_reply("192.0.2.99:40000".parse().unwrap(), &reply);
            monitor.on_reply(nat, &reply);
            now += S;
        }
        assert_eq!(monitor.snapshot().replies, 5);
        assert_eq!(inner.len(), Some(1));
        // Silence: the first unanswered ping, then the second, then dead.
        for _ in 0..2 {
            assert_eq!(sent_to(&monitor, now).len(), 1);
            now += S;
        }
        assert!(sent_to(&monitor, now).is_empty());
        let snap = monitor.snapshot();
        assert_eq!((snap.dead_udp_flows, snap.removed_keepalive), (1, 1));
        assert_eq!(snap.udp_flows, 0);
        assert_eq!(inner.len(), Some(0));
    }

    #[test]
    fn a_forged_mac_or_another_flows_is_no_answer_and_the_rate_bound_holds() {
        let inner: Arc<dyn LocationStore> = Arc::new(MemoryStore::new(10_000));
        let monitor = Arc::new(FlowMonitor::new(
            inner.clone(),
            KeepaliveConfig {
                interval: Some(S),
                failures: 3,
                rate: 10,
                capacity: 10_000,
            },
            "[2001:db8::1]:5060".parse().unwrap(),
            [7; 16],
        ));
        let store = WatchedStore::new(inner, monitor.clone());
        for n in 0..50u16 {
            let addr = SocketAddr::from(([192, 0, 2, 7], 40000 + n));
            register(&store, &format!("u{n}"), Hop::udp(addr), 0);
        }
        let sent = sent_to(&monitor, S);
        assert_eq!(sent.len(), 10, "the rate bound: 10 per second");
        assert!(sent[0].1.contains("Via: SIP/2.0/UDP [2001:db8::1]:5060;"));
        // A forged MAC is no answer; nor is another flow's ping answered
        // from this flow's address (the MAC binds the flow: a UA that
        // sees its own pings cannot answer another's). Seen failing with
        // one token for every flow.
        let reply = String::from_utf8(answer(&sent[0].1)).unwrap();
        let at = reply.find("rwka-").unwrap() + 5;
        let digit = if &reply[at..at + 1] == "0" { "1" } else { "0" };
        let forged = format!("{}{digit}{}", &reply[..at], &reply[at + 1..]);
        monitor.on_reply(sent[0].0, forged.as_bytes());
        assert_eq!(monitor.snapshot().replies, 0);
        monitor.on_reply(sent[1].0, &answer(&sent[0].1));
        assert_eq!(monitor.snapshot().replies, 0);
        monitor.on_reply(sent[0].0, &answer(&sent[0].1));
        assert_eq!(monitor.snapshot().replies, 1);
        assert!(monitor.snapshot().rate_limited > 0);
        // Half a second later: five more.
        assert_eq!(sent_to(&monitor, S + S / 2).len(), 5);
    }

    #[test]
    fn stun_keepalives_are_answered_with_the_mapped_address_without_amplification() {
        let inner: Arc<dyn LocationStore> = Arc::new(MemoryStore::new(100));
        let monitor = monitor(inner.clone());
        let store = WatchedStore::new(inner, monitor.clone());
        let mut request = vec![0x00, 0x01, 0x00, 0x00, 0x21, 0x12, 0xa4, 0x42];
        request.extend_from_slice(&[9; 12]);
        assert!(is_stun(&request));
        assert!(!is_stun(b"OPTIONS sip:x SIP/2.0\r\n\r\n"));
        let nat: SocketAddr = "192.0.2.7:40000".parse().unwrap();
        // Not a flow: a 32-byte answer to a 20-byte request is refused.
        assert!(monitor.on_stun(nat, &request).is_none());
        register(&store, "alice", Hop::udp(nat), 0);
        let answer = monitor.on_stun(nat, &request).unwrap();
        let b = answer.bytes();
        assert_eq!(b.len(), 32);
        assert_eq!(&b[0..4], &[0x01, 0x01, 0x00, 12]);
        assert_eq!(&b[8..20], &[9; 12]);
        assert_eq!(&b[20..26], &[0x00, 0x20, 0x00, 0x08, 0x00, 0x01]);
        assert_eq!(u16::from_be_bytes([b[26], b[27]]) ^ 0x2112, 40000);
        assert_eq!(
            [b[28] ^ 0x21, b[29] ^ 0x12, b[30] ^ 0xa4, b[31] ^ 0x42],
            [192, 0, 2, 7]
        );
        // A Binding response, or a length that lies: not answered.
        let mut response = request.clone();
        response[0] = 0x01;
        assert!(monitor.on_stun(nat, &response).is_none());
        let mut lying = request.clone();
        lying[3] = 4;
        assert!(monitor.on_stun(nat, &lying).is_none());
        assert_eq!(monitor.snapshot().stun, 1);
    }

    #[test]
    fn a_closed_connection_removes_its_bindings_only() {
        let inner: Arc<dyn LocationStore> = Arc::new(MemoryStore::new(100));
        let monitor = monitor(inner.clone());
        let store = WatchedStore::new(inner.clone(), monitor.clone());
        let conn = |id| Hop {
            addr: "192.0.2.7:40000".parse().unwrap(),
            transport: Transport::Tcp,
            flow: Some(FlowId(id)),
        };
        register(&store, "bob", conn(1), 0);
        register(&store, "carol", conn(2), 0);
        monitor.connection_closed(FlowId(1), S);
        monitor.connection_closed(FlowId(1), S);
        assert_eq!(monitor.snapshot().removed_connection_closed, 1);
        assert!(inner.lookup("bob", S).unwrap().is_empty());
        assert_eq!(inner.lookup("carol", S).unwrap().len(), 1);
        assert!(sent_to(&monitor, 10 * S).is_empty(), "no pings on TCP");
    }
}
