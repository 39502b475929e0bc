//! SIP over TCP: connections live here, in the driver tier; the core sees
//! each framed message as `(hop, bytes)` with the connection as the hop's
//! [`FlowId`] and names the hop of everything it sends.
//!
//! - One event loop per TCP worker thread (mio, epoll, edge-triggered), no
//!   thread per connection and no async runtime. Loop 0 accepts and hands
//!   connections round robin to every loop's poll; each loop reads and
//!   frames ([`framing`]) the connections it owns and runs their messages
//!   through its own [`ProxyWorker`](ringway_sip::ProxyWorker).
//! - Any thread sends ([`Connections::send`]): UDP workers and the timer
//!   thread write to a connection directly (a non-blocking write under the
//!   connection's send lock); what the kernel does not take waits in the
//!   connection's bounded send buffer until its owner sees it writable. A
//!   hop with no connection opens one (non-blocking connect, owned by the
//!   next loop round robin) and reuses it for every later message to that
//!   address.
//! - Bounds: connections in all and per source IP (beyond them an accepted
//!   connection is closed at once, counted as refused), header and body
//!   bytes per message, messages per connection, idle time, time to finish
//!   a message once begun (slowloris), send buffer bytes. Each close is
//!   counted by reason.
//! - UDP workers are not slowed by connection work: the event loops are
//!   threads of their own.
//! - Transport errors reach the core (RFC 3261 16.9, RFC 3263 4.3): a
//!   connection we open keeps a copy of the messages sent on it until it
//!   is up (TCP connected, TLS handshake done). If it closes before
//!   (refused, reset, handshake failed), or cannot be opened at all, those
//!   messages are queued as undelivered ([`Connections::take_undelivered`])
//!   and the timer thread hands each to the core
//!   (`ProxyWorker::on_transport_error`), which fails over at once instead
//!   of at timer B/F.

mod event_loop;
pub mod framing;

pub(crate) use event_loop::{run_loop, LoopContext};

use super::tls::{TlsContext, TlsSession};
use super::ws::{Outgoing, WsSession, WsSettings};
use framing::FrameLimits;
use mio::net::TcpStream;
use mio::{Interest, Registry, Token};
use ringway_sip::{FlowId, Hop, Transport};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};
use std::io::{ErrorKind, Read, Write};
use std::net::{IpAddr, Shutdown, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};

/// Bounds of the TCP transport (plain data; `[tcp]` in the configuration).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TcpConfig {
    /// Event loop threads (0: as many as UDP workers).
    pub threads: usize,
    /// Connections open at most (accepted and opened by us).
    pub max_connections: usize,
    /// Accepted connections from one IP address at most.
    pub max_connections_per_ip: usize,
    /// Longest start line and header of one message (bytes).
    pub max_header_bytes: usize,
    /// Longest body of one message (bytes).
    pub max_body_bytes: usize,
    /// Messages one connection may carry (0: no limit); then it is closed.
    pub max_messages_per_connection: u64,
    /// A connection with no traffic for this long is closed (s).
    pub idle_timeout_s: u64,
    /// A message begun must be complete within this (ms; slowloris).
    pub message_timeout_ms: u64,
    /// Bytes waiting to be sent on one connection at most; beyond, the
    /// connection is closed.
    pub max_send_buffer_bytes: usize,
}

impl Default for TcpConfig {
    fn default() -> Self {
        TcpConfig {
            threads: 0,
            max_connections: 16_384,
            max_connections_per_ip: 256,
            max_header_bytes: 16 * 1024,
            max_body_bytes: 64 * 1024,
            max_messages_per_connection: 0,
            idle_timeout_s: 600,
            message_timeout_ms: 5_000,
            max_send_buffer_bytes: 256 * 1024,
        }
    }
}

impl TcpConfig {
    /// Reject inconsistent settings, naming the field.
    pub fn validate(&self) -> Result<(), String> {
        if self.threads > 256 {
            return Err(format!("tcp.threads must be 0..=256, not {}", self.threads));
        }
        if self.max_connections == 0 || self.max_connections_per_ip == 0 {
            return Err(
                "tcp.max_connections and tcp.max_connections_per_ip must be above 0".into(),
            );
        }
        if !(1024..=1 << 20).contains(&self.max_header_bytes) {
            return Err(format!(
                "tcp.max_header_bytes must be 1024..=1048576, not {}",
                self.max_header_bytes
            ));
        }
        if self.max_body_bytes > 16 << 20 {
            return Err(format!(
                "tcp.max_body_bytes must be at most 16777216, not {}",
                self.max_body_bytes
            ));
        }
        if self.idle_timeout_s == 0 || self.message_timeout_ms == 0 {
            return Err("tcp.idle_timeout_s and tcp.message_timeout_ms must be above 0".into());
        }
        if self.max_send_buffer_bytes < self.max_header_bytes + self.max_body_bytes {
            return Err(
                "tcp.max_send_buffer_bytes must hold one message (max_header_bytes + max_body_bytes)"
                    .into(),
            );
        }
        Ok(())
    }

    fn frame_limits(&self) -> FrameLimits {
        FrameLimits {
            max_header_bytes: self.max_header_bytes,
            max_body_bytes: self.max_body_bytes,
        }
    }
}

/// Why a connection was closed (a metrics label each).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum CloseReason {
    /// The peer closed it.
    PeerClosed = 1,
    /// No traffic for `idle_timeout_s`.
    Idle,
    /// A message begun was not complete within `message_timeout_ms`.
    MessageTimeout,
    /// A header longer than `max_header_bytes`.
    HeaderTooLarge,
    /// A body longer than `max_body_bytes`.
    BodyTooLarge,
    /// A message without a usable Content-Length.
    BadContentLength,
    /// Bytes that are not SIP.
    Garbage,
    /// `max_messages_per_connection` reached.
    MessageLimit,
    /// More than `max_send_buffer_bytes` waiting to be sent.
    SendBufferFull,
    /// A read or write failed.
    IoError,
    /// Our connection attempt failed.
    ConnectFailed,
    /// The server stopped.
    Shutdown,
    /// A TLS handshake failed (or did not finish in time).
    TlsHandshake,
    /// A TLS protocol error after the handshake.
    TlsError,
    /// A WebSocket upgrade refused (answered with its HTTP error).
    WsHandshake,
    /// A WebSocket frame broke the rules or a bound (closed with 1002/1009).
    WsError,
}

impl CloseReason {
    /// Every reason, in label order.
    pub const ALL: [CloseReason; 16] = [
        CloseReason::PeerClosed,
        CloseReason::Idle,
        CloseReason::MessageTimeout,
        CloseReason::HeaderTooLarge,
        CloseReason::BodyTooLarge,
        CloseReason::BadContentLength,
        CloseReason::Garbage,
        CloseReason::MessageLimit,
        CloseReason::SendBufferFull,
        CloseReason::IoError,
        CloseReason::ConnectFailed,
        CloseReason::Shutdown,
        CloseReason::TlsHandshake,
        CloseReason::TlsError,
        CloseReason::WsHandshake,
        CloseReason::WsError,
    ];

    /// Metrics label.
    pub fn label(self) -> &'static str {
        match self {
            CloseReason::PeerClosed => "peer_closed",
            CloseReason::Idle => "idle",
            CloseReason::MessageTimeout => "message_timeout",
            CloseReason::HeaderTooLarge => "header_too_large",
            CloseReason::BodyTooLarge => "body_too_large",
            CloseReason::BadContentLength => "bad_content_length",
            CloseReason::Garbage => "garbage",
            CloseReason::MessageLimit => "message_limit",
            CloseReason::SendBufferFull => "send_buffer_full",
            CloseReason::IoError => "io_error",
            CloseReason::ConnectFailed => "connect_failed",
            CloseReason::Shutdown => "shutdown",
            CloseReason::TlsHandshake => "tls_handshake",
            CloseReason::TlsError => "tls_error",
            CloseReason::WsHandshake => "ws_handshake",
            CloseReason::WsError => "ws_error",
        }
    }

    fn index(self) -> usize {
        self as usize - 1
    }

    fn from_u8(v: u8) -> Option<CloseReason> {
        CloseReason::ALL
            .get(usize::from(v).checked_sub(1)?)
            .copied()
    }

    fn of_frame_error(e: framing::FrameError) -> CloseReason {
        match e {
            framing::FrameError::HeaderTooLarge => CloseReason::HeaderTooLarge,
            framing::FrameError::BodyTooLarge => CloseReason::BodyTooLarge,
            framing::FrameError::BadContentLength => CloseReason::BadContentLength,
            framing::FrameError::Garbage => CloseReason::Garbage,
        }
    }
}

/// Counters of one connection transport (all threads).
#[derive(Default)]
pub(crate) struct TransportCounters {
    open: AtomicU64,
    accepted: AtomicU64,
    connected: AtomicU64,
    refused_limit: AtomicU64,
    refused_per_ip: AtomicU64,
    refused_descriptors: AtomicU64,
    closed: [AtomicU64; CloseReason::ALL.len()],
    bytes_in: AtomicU64,
    bytes_out: AtomicU64,
    messages_in: AtomicU64,
    messages_out: AtomicU64,
    pings: AtomicU64,
    no_connection: AtomicU64,
    aliases: AtomicU64,
}

/// The connection transports, in metrics order (UDP has no connections).
pub const CONNECTION_TRANSPORTS: [Transport; 4] = [
    Transport::Tcp,
    Transport::Tls,
    Transport::Ws,
    Transport::Wss,
];

/// Counters of the connection transports (all threads), one row each.
#[derive(Default)]
pub struct TcpCounters {
    rows: [TransportCounters; 4],
    udp_out: AtomicU64,
    undelivered: AtomicU64,
    undelivered_dropped: AtomicU64,
}

impl TcpCounters {
    /// The row of `transport` (UDP, which has no connections, counts
    /// with TCP: nothing sends it here).
    pub(crate) fn of(&self, transport: Transport) -> &TransportCounters {
        let row = match transport {
            Transport::Udp | Transport::Tcp => 0,
            Transport::Tls => 1,
            Transport::Ws => 2,
            Transport::Wss => 3,
        };
        &self.rows[row]
    }
}

fn add(counter: &AtomicU64, n: u64) {
    counter.fetch_add(n, Ordering::Relaxed);
}

/// The connection transports' counters at one moment: the sums over
/// TCP, TLS, WS and WSS, and each of them in `by_transport`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TcpSnapshot {
    /// Connections open now.
    pub open: u64,
    /// Connections accepted.
    pub accepted: u64,
    /// Connections we opened.
    pub connected: u64,
    /// Accepted connections closed at once: `max_connections` reached.
    pub refused_limit: u64,
    /// Accepted connections closed at once: `max_connections_per_ip` reached.
    pub refused_per_ip: u64,
    /// Connections closed at once because the process was out of file
    /// descriptors (its open files limit is below `max_connections`).
    #[serde(default)]
    pub refused_descriptors: u64,
    /// Connections closed, by reason ([`CloseReason::label`]).
    pub closed: Vec<(String, u64)>,
    /// Bytes read.
    pub bytes_in: u64,
    /// Bytes written (or queued to be).
    pub bytes_out: u64,
    /// Messages framed off connections.
    pub messages_in: u64,
    /// Messages sent over connections.
    pub messages_out: u64,
    /// CRLF CRLF keep-alive pings answered with a pong.
    pub pings: u64,
    /// Messages for a connection that is gone (a response whose request's
    /// connection closed): dropped.
    pub no_connection: u64,
    /// Connections that took an RFC 5923 alias (a Via `alias`).
    #[serde(default)]
    pub aliases: u64,
    /// Datagrams the TCP threads sent over UDP (transport switching; in
    /// the sums only).
    pub udp_out: u64,
    /// Messages sent on a connection we opened that closed before it was
    /// up, or that could not be opened: handed back to the core as
    /// transport errors.
    #[serde(default)]
    pub undelivered: u64,
    /// Such messages not handed back (the queue was full): their
    /// transactions time out instead.
    #[serde(default)]
    pub undelivered_dropped: u64,
    /// The same counters per transport (`tcp`, `tls`, `ws`, `wss`): those
    /// listened on or used, in the sums only.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub by_transport: BTreeMap<String, TcpSnapshot>,
}

impl TcpSnapshot {
    /// Connections closed for `reason`.
    pub fn closed(&self, reason: CloseReason) -> u64 {
        self.closed
            .iter()
            .find(|(label, _)| label == reason.label())
            .map_or(0, |(_, n)| *n)
    }

    /// One transport's row.
    fn of_row(row: &TransportCounters) -> TcpSnapshot {
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        TcpSnapshot {
            open: get(&row.open),
            accepted: get(&row.accepted),
            connected: get(&row.connected),
            refused_limit: get(&row.refused_limit),
            refused_per_ip: get(&row.refused_per_ip),
            refused_descriptors: get(&row.refused_descriptors),
            closed: CloseReason::ALL
                .iter()
                .map(|r| (r.label().to_string(), get(&row.closed[r.index()])))
                .collect(),
            bytes_in: get(&row.bytes_in),
            bytes_out: get(&row.bytes_out),
            messages_in: get(&row.messages_in),
            messages_out: get(&row.messages_out),
            pings: get(&row.pings),
            no_connection: get(&row.no_connection),
            aliases: get(&row.aliases),
            udp_out: 0,
            undelivered: 0,
            undelivered_dropped: 0,
            by_transport: BTreeMap::new(),
        }
    }

    /// Whether any counter of the row moved.
    fn used(&self) -> bool {
        self.open
            + self.accepted
            + self.connected
            + self.refused_limit
            + self.refused_per_ip
            + self.refused_descriptors
            + self.bytes_in
            + self.no_connection
            > 0
    }

    /// Add `row` into these sums.
    fn add(&mut self, row: &TcpSnapshot) {
        self.open += row.open;
        self.accepted += row.accepted;
        self.connected += row.connected;
        self.refused_limit += row.refused_limit;
        self.refused_per_ip += row.refused_per_ip;
        self.refused_descriptors += row.refused_descriptors;
        if self.closed.is_empty() {
            self.closed = row.closed.clone();
        } else {
            for ((_, sum), (_, n)) in self.closed.iter_mut().zip(&row.closed) {
                *sum += n;
            }
        }
        self.bytes_in += row.bytes_in;
        self.bytes_out += row.bytes_out;
        self.messages_in += row.messages_in;
        self.messages_out += row.messages_out;
        self.pings += row.pings;
        self.no_connection += row.no_connection;
        self.aliases += row.aliases;
    }
}

/// One connection, shared by its owner loop (which reads) and every
/// thread that sends on it.
pub(crate) struct Conn {
    id: u64,
    peer: SocketAddr,
    stream: TcpStream,
    /// Bytes the kernel did not take yet (bounded).
    out: Mutex<Vec<u8>>,
    /// 0 while open, else the [`CloseReason`] another thread decided.
    closing: AtomicU8,
    /// Last traffic either way (monotonic ns).
    last_active: AtomicU64,
    /// Accepted (else opened by us).
    inbound: bool,
    /// TCP or TLS.
    transport: Transport,
    /// The TLS session (TLS and WSS only).
    tls: Option<TlsSession>,
    /// The WebSocket state (WS and WSS only).
    ws: Option<WsSession>,
    /// When it was accepted or opened (monotonic ns).
    opened: u64,
    /// The RFC 5923 alias it took (a Via `alias` on it): requests to this
    /// address over its transport go over it. Set once.
    alias: OnceLock<SocketAddr>,
    /// Opened by us and not up yet: copies of the messages sent on it
    /// (bounded), handed back to the core if it closes before it is up.
    /// `None` once up, once closed, and for accepted connections.
    unconfirmed: Mutex<Option<Vec<Vec<u8>>>>,
    /// Opened by us and up (TCP connected, TLS handshake done).
    established: AtomicBool,
}

/// Bytes of message copies an unconfirmed connection keeps at most
/// (beyond, a message is only handed back if writing it fails).
const UNCONFIRMED_BYTES: usize = 64 * 1024;
/// Messages waiting to be handed back to the core as transport errors, at
/// most (count and bytes).
const UNDELIVERED_MESSAGES: usize = 1024;
const UNDELIVERED_BYTES: usize = 4 << 20;

/// Messages the transport could not deliver, for the core.
#[derive(Default)]
struct Undelivered {
    messages: Vec<(Hop, Vec<u8>)>,
    bytes: usize,
}

impl Conn {
    /// Write `bytes` (or queue what the kernel does not take); `false` if
    /// the connection is closing or failed now.
    fn write(&self, bytes: &[u8], limit: usize, now: u64) -> bool {
        match &self.ws {
            // One SIP message per WebSocket message (RFC 7118 5.2); nothing
            // before the upgrade is answered (ours: kept until then).
            Some(ws) => match ws.outgoing(bytes, limit) {
                Outgoing::Frame(frame) => self.write_raw(&frame, limit, now),
                Outgoing::Queued => self.closing.load(Ordering::Relaxed) == 0,
                Outgoing::Refused => false,
            },
            None => self.write_raw(bytes, limit, now),
        }
    }

    /// Write bytes of the stream as they are (TLS-encrypted on TLS).
    fn write_raw(&self, bytes: &[u8], limit: usize, now: u64) -> bool {
        if let Some(tls) = &self.tls {
            if self.closing.load(Ordering::Relaxed) != 0 {
                return false;
            }
            return match tls.write(&self.stream, bytes) {
                Ok(true) => {
                    self.last_active.store(now, Ordering::Relaxed);
                    true
                }
                Ok(false) => {
                    self.close_soon(CloseReason::SendBufferFull);
                    false
                }
                Err(_) => {
                    self.close_soon(CloseReason::TlsError);
                    false
                }
            };
        }
        let mut out = lock(&self.out);
        if self.closing.load(Ordering::Relaxed) != 0 {
            return false;
        }
        let mut rest = bytes;
        if out.is_empty() {
            while !rest.is_empty() {
                match (&self.stream).write(rest) {
                    Ok(0) => break,
                    Ok(n) => rest = &rest[n..],
                    Err(e) if e.kind() == ErrorKind::Interrupted => {}
                    Err(e)
                        if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::NotConnected) =>
                    {
                        break
                    }
                    Err(_) => {
                        self.close_soon(CloseReason::IoError);
                        return false;
                    }
                }
            }
        }
        if !rest.is_empty() {
            if out.len() + rest.len() > limit {
                self.close_soon(CloseReason::SendBufferFull);
                return false;
            }
            out.extend_from_slice(rest);
        }
        self.last_active.store(now, Ordering::Relaxed);
        true
    }

    /// Write what waits (the owner, on a writable event).
    fn flush(&self) -> std::io::Result<()> {
        if let Some(tls) = &self.tls {
            return tls.flush(&self.stream);
        }
        let mut out = lock(&self.out);
        let mut done = 0;
        while done < out.len() {
            match (&self.stream).write(&out[done..]) {
                Ok(0) => break,
                Ok(n) => done += n,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::NotConnected) => {
                    break
                }
                Err(e) => return Err(e),
            }
        }
        out.drain(..done);
        if out.is_empty() && out.capacity() > 4096 {
            *out = Vec::new();
        }
        Ok(())
    }

    /// Ask the owner to close it (it sees the shutdown as an event).
    fn close_soon(&self, reason: CloseReason) {
        let _ =
            self.closing
                .compare_exchange(0, reason as u8, Ordering::Relaxed, Ordering::Relaxed);
        let _ = self.stream.shutdown(Shutdown::Both);
    }

    fn closing(&self) -> Option<CloseReason> {
        CloseReason::from_u8(self.closing.load(Ordering::Relaxed))
    }

    /// Read the stream's bytes (plaintext, over TLS): `Ok(0)` at its end,
    /// `Err(reason)` to close, `WouldBlock` as [`ReadOutcome::Again`].
    fn read(&self, buf: &mut [u8]) -> ReadOutcome {
        let result = match &self.tls {
            None => (&self.stream).read(buf),
            Some(tls) => match tls.read(&self.stream, buf) {
                Ok(n) => Ok(n),
                Err(super::tls::ReadError::Io(e)) => Err(e),
                Err(super::tls::ReadError::Tls(super::tls::TlsFailure::Handshake)) => {
                    return ReadOutcome::Close(CloseReason::TlsHandshake)
                }
                Err(super::tls::ReadError::Tls(super::tls::TlsFailure::Broken)) => {
                    return ReadOutcome::Close(CloseReason::TlsError)
                }
            },
        };
        match result {
            Ok(0) => ReadOutcome::Close(CloseReason::PeerClosed),
            Ok(n) => ReadOutcome::Bytes(n),
            Err(e) if e.kind() == ErrorKind::WouldBlock => ReadOutcome::Again,
            Err(e) if e.kind() == ErrorKind::Interrupted => ReadOutcome::Interrupted,
            Err(_) => ReadOutcome::Close(CloseReason::IoError),
        }
    }

    /// A WebSocket upgrade (the client's request, or the server's answer
    /// to ours) not done `timeout_ns` after the connection opened.
    fn upgrade_expired(&self, now: u64, timeout_ns: u64) -> bool {
        self.ws.as_ref().is_some_and(|ws| !ws.upgraded())
            && now.saturating_sub(self.opened) > timeout_ns
    }

    /// A TLS handshake begun before `deadline` (ns) and not finished: it
    /// is counted as timed out and the connection is to be closed.
    fn handshake_expired(&self, now: u64, timeout_ns: u64) -> bool {
        match &self.tls {
            Some(tls) if tls.handshaking() && now.saturating_sub(self.opened) > timeout_ns => {
                tls.timed_out();
                true
            }
            _ => false,
        }
    }

    /// Keep a copy of `bytes` while the connection is not up (within
    /// [`UNCONFIRMED_BYTES`]).
    fn remember_unconfirmed(&self, bytes: &[u8]) {
        let mut unconfirmed = lock(&self.unconfirmed);
        if let Some(messages) = unconfirmed.as_mut() {
            let kept: usize = messages.iter().map(Vec::len).sum();
            if kept + bytes.len() <= UNCONFIRMED_BYTES {
                messages.push(bytes.to_vec());
            }
        }
    }

    /// The owner saw the TCP connection complete (`connected`): once the
    /// TLS handshake and the WebSocket upgrade (if any) are done too, it
    /// is up and the copies go.
    fn confirm_if_up(&self, connected: bool) {
        if self.inbound || self.established.load(Ordering::Relaxed) || !connected {
            return;
        }
        if self.tls.as_ref().is_some_and(TlsSession::handshaking) {
            return;
        }
        if self.ws.as_ref().is_some_and(|ws| !ws.upgraded()) {
            return;
        }
        self.established.store(true, Ordering::Relaxed);
        *lock(&self.unconfirmed) = None;
    }

    /// The hop the core addressed a message to this connection by.
    fn target_hop(&self) -> Hop {
        Hop {
            addr: self.peer,
            transport: self.transport,
            flow: None,
        }
    }
}

/// What one [`Conn::read`] got.
enum ReadOutcome {
    /// Bytes of the message stream.
    Bytes(usize),
    /// Nothing more now.
    Again,
    /// A signal came: read again.
    Interrupted,
    /// Close the connection.
    Close(CloseReason),
}

/// The connections to one peer address: the one messages to the address
/// take, then any others (rare: a second connection to one address), so
/// that closing one finds its successor without a scan of the table.
struct PeerConns {
    first: u64,
    others: Vec<u64>,
}

impl PeerConns {
    /// Take connection `id` out; `false` when none is left.
    fn remove(&mut self, id: u64) -> bool {
        if self.first == id {
            if self.others.is_empty() {
                return false;
            }
            // The oldest of the others takes its place.
            self.first = self.others.remove(0);
        } else {
            self.others.retain(|other| *other != id);
        }
        true
    }
}

/// The connection table, indexed so that every operation on one
/// connection (insert, look-up by id, peer or alias, close) costs the
/// same however many connections are open.
#[derive(Default)]
struct Table {
    by_id: HashMap<u64, Arc<Conn>>,
    /// The connections to each peer address.
    by_peer: HashMap<SocketAddr, PeerConns>,
    /// Accepted connections per source IP.
    per_ip: HashMap<IpAddr, usize>,
    /// RFC 5923 aliases: a transport and address a connection serves
    /// besides its peer address (at most one per connection).
    by_alias: HashMap<(Transport, SocketAddr), u64>,
}

/// Every connection of the server, shared by all threads.
pub struct Connections {
    table: Mutex<Table>,
    /// Each event loop's registry (connections are registered with their
    /// owner's poll from any thread).
    registries: Vec<Registry>,
    next_id: AtomicU64,
    next_owner: AtomicUsize,
    config: TcpConfig,
    counters: TcpCounters,
    /// TLS certificates and sessions (`None`: no TLS configured).
    tls: Option<Arc<TlsContext>>,
    /// Origins WebSocket clients may come from; paths of those we open.
    ws: WsSettings,
    /// Told of every connection that closes (the registrar's flows).
    on_close: OnceLock<CloseHook>,
    /// The transports we listen on (their metrics rows are shown even
    /// while 0).
    listening: Vec<Transport>,
    /// Messages the transport could not deliver, for the core.
    undelivered: Mutex<Undelivered>,
}

/// What [`Connections::set_on_close`] calls: the connection and `now`.
pub type CloseHook = Box<dyn Fn(FlowId, u64) + Send + Sync>;

/// Tokens below this are listeners; connection ids start here.
pub(crate) const FIRST_CONNECTION: u64 = 1 << 16;

impl Connections {
    /// A table for event loops with these registries.
    pub(crate) fn new(
        config: TcpConfig,
        registries: Vec<Registry>,
        tls: Option<Arc<TlsContext>>,
        ws: WsSettings,
        listening: Vec<Transport>,
    ) -> Connections {
        Connections {
            table: Mutex::new(Table::default()),
            registries,
            next_id: AtomicU64::new(FIRST_CONNECTION),
            next_owner: AtomicUsize::new(0),
            config,
            counters: TcpCounters::default(),
            tls,
            ws,
            on_close: OnceLock::new(),
            listening,
            undelivered: Mutex::new(Undelivered::default()),
        }
    }

    /// Call `hook` with each connection that closes, after it left the
    /// table (once; a second hook is ignored). It must not call back into
    /// the connections.
    pub fn set_on_close(&self, hook: CloseHook) {
        let _ = self.on_close.set(hook);
    }

    /// The TLS layer (`None`: no TLS configured).
    pub fn tls(&self) -> Option<&Arc<TlsContext>> {
        self.tls.as_ref()
    }

    /// The bounds it runs with.
    pub fn config(&self) -> &TcpConfig {
        &self.config
    }

    /// Send one message over the hop's connection: its flow if that is
    /// open, else an open connection to its address, else (for a hop that
    /// names no flow) a new connection to its address. `false`: dropped
    /// (counted).
    pub fn send(&self, hop: Hop, bytes: &[u8], now: u64) -> bool {
        let conn = {
            let mut table = lock(&self.table);
            let found = hop
                .flow
                .and_then(|flow| table.by_id.get(&flow.0))
                .or_else(|| {
                    table
                        .by_peer
                        .get(&hop.addr)
                        .and_then(|peer| table.by_id.get(&peer.first))
                })
                .or_else(|| {
                    // RFC 5923: a connection that took this address as
                    // its alias (only for a hop naming no flow).
                    hop.flow.is_none().then_some(())?;
                    table
                        .by_alias
                        .get(&(hop.transport, hop.addr))
                        .and_then(|id| table.by_id.get(id))
                })
                .cloned();
            match found {
                Some(conn) => Some(conn),
                // A flow that is gone is not re-opened towards its address
                // (a phone behind NAT cannot be connected to).
                None if hop.flow.is_some() => None,
                None => {
                    let opened = self.connect(&mut table, hop.addr, hop.transport, now);
                    if opened.is_none() && hop.transport.is_reliable() {
                        drop(table);
                        // Could not be opened at all: a transport error now.
                        self.undeliverable(hop, bytes);
                    }
                    opened
                }
            }
        };
        let Some(conn) = conn else {
            add(&self.counters.of(hop.transport).no_connection, 1);
            return false;
        };
        let row = self.counters.of(conn.transport);
        if !conn.inbound && !conn.established.load(Ordering::Relaxed) {
            conn.remember_unconfirmed(bytes);
        }
        if !conn.write(bytes, self.config.max_send_buffer_bytes, now) {
            add(&row.no_connection, 1);
            if !conn.inbound && !conn.established.load(Ordering::Relaxed) {
                // Failed before it was up (a duplicate of a copy handed
                // back at its close is ignored by the core: that try is
                // over by then).
                self.undeliverable(conn.target_hop(), bytes);
            }
            return false;
        }
        add(&row.bytes_out, bytes.len() as u64);
        add(&row.messages_out, 1);
        true
    }

    /// Whether the connection `flow` is open (a registered flow, RFC 5626:
    /// the core answers `430 Flow Failed` for one that is gone).
    pub fn is_open(&self, flow: FlowId) -> bool {
        lock(&self.table)
            .by_id
            .get(&flow.0)
            .is_some_and(|conn| conn.closing().is_none())
    }

    /// RFC 5923: let `conn` serve requests to `sent_by` over
    /// `transport` (a Via `alias` that came on it) for its lifetime. Taken
    /// only when `transport` is the connection's, `sent_by` is at the
    /// connection's own source IP (so only the port is new: an alias never
    /// redirects traffic meant for another host), the connection has no
    /// alias yet (one per connection: the table stays bounded by the
    /// connections), and no other open connection holds that alias.
    /// Whether it was taken.
    pub(crate) fn alias(&self, conn: &Conn, transport: Transport, sent_by: SocketAddr) -> bool {
        if transport != conn.transport
            || sent_by.ip() != conn.peer.ip()
            || conn.alias.get().is_some()
        {
            return false;
        }
        let mut table = lock(&self.table);
        if !table.by_id.contains_key(&conn.id) {
            return false;
        }
        match table.by_alias.entry((transport, sent_by)) {
            std::collections::hash_map::Entry::Occupied(_) => false,
            std::collections::hash_map::Entry::Vacant(slot) => {
                if conn.alias.set(sent_by).is_err() {
                    return false;
                }
                slot.insert(conn.id);
                add(&self.counters.of(transport).aliases, 1);
                true
            }
        }
    }

    /// Open a connection to `addr` (non-blocking) owned by the next loop.
    fn connect(
        &self,
        table: &mut Table,
        addr: SocketAddr,
        transport: Transport,
        now: u64,
    ) -> Option<Arc<Conn>> {
        if table.by_id.len() >= self.config.max_connections {
            add(&self.counters.of(transport).refused_limit, 1);
            return None;
        }
        let limit = self.config.max_send_buffer_bytes;
        let tls = match transport {
            Transport::Tls | Transport::Wss => {
                Some(self.tls.as_ref()?.connect(addr, limit, transport)?)
            }
            _ => None,
        };
        // RFC 7118 as a client: our upgrade request goes first.
        let ws = matches!(transport, Transport::Ws | Transport::Wss).then(|| {
            let host = match (&tls, &self.tls) {
                (Some(_), Some(context)) => context.config().server_name.clone(),
                _ => None,
            };
            let path = self.ws.paths.get(&addr).map_or("/", String::as_str);
            WsSession::client(&host.unwrap_or_else(|| addr.to_string()), path)
        });
        let (ws, request) = match ws {
            Some((session, request)) => (Some(session), Some(request)),
            None => (None, None),
        };
        let row = self.counters.of(transport);
        let Ok(stream) = TcpStream::connect(addr) else {
            add(&row.closed[CloseReason::ConnectFailed.index()], 1);
            return None;
        };
        add(&row.connected, 1);
        let conn = self.insert(table, stream, addr, (false, transport, tls, ws), now)?;
        if let Some(request) = request {
            // Queued until the connect completes (or, over TLS, until its
            // handshake has).
            if !conn.write_raw(&request, limit, now) {
                return None;
            }
        }
        Some(conn)
    }

    /// Take an accepted connection, or close it at once beyond a bound
    /// (counted as refused).
    pub(crate) fn adopt(
        &self,
        stream: TcpStream,
        peer: SocketAddr,
        transport: Transport,
        now: u64,
    ) {
        let mut table = lock(&self.table);
        let row = self.counters.of(transport);
        if table.by_id.len() >= self.config.max_connections {
            add(&row.refused_limit, 1);
            return;
        }
        if table.per_ip.get(&peer.ip()).copied().unwrap_or(0) >= self.config.max_connections_per_ip
        {
            add(&row.refused_per_ip, 1);
            return;
        }
        let ws = matches!(transport, Transport::Ws | Transport::Wss).then(WsSession::server);
        let tls = match transport {
            Transport::Tls | Transport::Wss => {
                let Some(session) = self
                    .tls
                    .as_ref()
                    .and_then(|tls| tls.accept(self.config.max_send_buffer_bytes, transport))
                else {
                    // A flood of handshakes: counted by the TLS layer.
                    return;
                };
                Some(session)
            }
            _ => None,
        };
        add(&row.accepted, 1);
        *table.per_ip.entry(peer.ip()).or_default() += 1;
        if self
            .insert(&mut table, stream, peer, (true, transport, tls, ws), now)
            .is_none()
        {
            release_ip(&mut table, peer.ip());
        }
    }

    /// A connection the process had no descriptor for: taken with the
    /// spare descriptor and closed at once (counted as refused).
    pub(crate) fn refused_for_descriptors(&self, transport: Transport) {
        add(&self.counters.of(transport).refused_descriptors, 1);
    }

    /// Register `stream` with its owner's poll and enter it in the table
    /// (under the table lock: the owner finds it by its first event).
    fn insert(
        &self,
        table: &mut Table,
        mut stream: TcpStream,
        peer: SocketAddr,
        (inbound, transport, tls, ws): (bool, Transport, Option<TlsSession>, Option<WsSession>),
        now: u64,
    ) -> Option<Arc<Conn>> {
        let _ = stream.set_nodelay(true);
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let owner = self.next_owner.fetch_add(1, Ordering::Relaxed) % self.registries.len();
        let interest = Interest::READABLE | Interest::WRITABLE;
        if self.registries[owner]
            .register(&mut stream, Token(id as usize), interest)
            .is_err()
        {
            add(
                &self.counters.of(transport).closed[CloseReason::IoError.index()],
                1,
            );
            return None;
        }
        let conn = Arc::new(Conn {
            id,
            peer,
            stream,
            out: Mutex::new(Vec::new()),
            closing: AtomicU8::new(0),
            last_active: AtomicU64::new(now),
            inbound,
            transport,
            tls,
            ws,
            opened: now,
            alias: OnceLock::new(),
            unconfirmed: Mutex::new((!inbound).then(Vec::new)),
            established: AtomicBool::new(false),
        });
        add(&self.counters.of(transport).open, 1);
        table.by_id.insert(id, conn.clone());
        match table.by_peer.entry(peer) {
            std::collections::hash_map::Entry::Occupied(mut slot) => slot.get_mut().others.push(id),
            std::collections::hash_map::Entry::Vacant(slot) => {
                slot.insert(PeerConns {
                    first: id,
                    others: Vec::new(),
                });
            }
        }
        Some(conn)
    }

    /// The connection `id`, if open.
    fn get(&self, id: u64) -> Option<Arc<Conn>> {
        lock(&self.table).by_id.get(&id).cloned()
    }

    /// Close `conn` (its owner, once): out of the table and its poll,
    /// counted by `reason`.
    fn close(&self, conn: &Conn, reason: CloseReason) {
        let mut table = lock(&self.table);
        if table.by_id.remove(&conn.id).is_none() {
            return;
        }
        // Another connection to the same address takes its place (no
        // scan: the peer's own list).
        let left = table
            .by_peer
            .get_mut(&conn.peer)
            .is_some_and(|peer| peer.remove(conn.id));
        if !left {
            table.by_peer.remove(&conn.peer);
        }
        if conn.inbound {
            release_ip(&mut table, conn.peer.ip());
        }
        if let Some(alias) = conn.alias.get() {
            let key = (conn.transport, *alias);
            if table.by_alias.get(&key) == Some(&conn.id) {
                table.by_alias.remove(&key);
            }
        }
        drop(table);
        // Out of the poll when its fd closes (the last holder drops it);
        // events until then find no connection and are ignored.
        let _ = conn.stream.shutdown(Shutdown::Both);
        let row = self.counters.of(conn.transport);
        row.open.fetch_sub(1, Ordering::Relaxed);
        add(&row.closed[reason.index()], 1);
        // Closed before it was up: what was sent on it never arrived.
        let unconfirmed = lock(&conn.unconfirmed).take().unwrap_or_default();
        for message in unconfirmed {
            self.undeliverable(conn.target_hop(), &message);
        }
        if let Some(hook) = self.on_close.get() {
            hook(FlowId(conn.id), ringway_io::monotonic_now().0);
        }
    }

    /// Queue `message`, which could not be delivered to `hop`, for the
    /// core (bounded: beyond, counted and left to time out).
    fn undeliverable(&self, hop: Hop, message: &[u8]) {
        let mut undelivered = lock(&self.undelivered);
        if undelivered.messages.len() >= UNDELIVERED_MESSAGES
            || undelivered.bytes + message.len() > UNDELIVERED_BYTES
        {
            add(&self.counters.undelivered_dropped, 1);
            return;
        }
        undelivered.bytes += message.len();
        undelivered.messages.push((hop, message.to_vec()));
        add(&self.counters.undelivered, 1);
    }

    /// The messages the transport could not deliver since the last call,
    /// each with the hop the core sent it to (for
    /// `ProxyWorker::on_transport_error`).
    pub fn take_undelivered(&self) -> Vec<(Hop, Vec<u8>)> {
        let mut undelivered = lock(&self.undelivered);
        if undelivered.messages.is_empty() {
            return Vec::new();
        }
        undelivered.bytes = 0;
        std::mem::take(&mut undelivered.messages)
    }

    /// Connections open now.
    pub fn open(&self) -> usize {
        lock(&self.table).by_id.len()
    }

    /// The counters now: the sums, and a row per transport listened on
    /// or used.
    pub fn snapshot(&self) -> TcpSnapshot {
        let mut sums = TcpSnapshot::default();
        for transport in CONNECTION_TRANSPORTS {
            let row = TcpSnapshot::of_row(self.counters.of(transport));
            sums.add(&row);
            if row.used() || self.listening.contains(&transport) {
                sums.by_transport.insert(transport.name().to_string(), row);
            }
        }
        sums.open = self.open() as u64;
        sums.udp_out = self.counters.udp_out.load(Ordering::Relaxed);
        sums.undelivered = self.counters.undelivered.load(Ordering::Relaxed);
        sums.undelivered_dropped = self.counters.undelivered_dropped.load(Ordering::Relaxed);
        sums
    }
}

impl ringway_sip::FlowState for Connections {
    fn is_open(&self, flow: FlowId) -> bool {
        Connections::is_open(self, flow)
    }
}

fn release_ip(table: &mut Table, ip: IpAddr) {
    if let Some(n) = table.per_ip.get_mut(&ip) {
        *n -= 1;
        if *n == 0 {
            table.per_ip.remove(&ip);
        }
    }
}

/// The flow of connection `id` as the core sees it.
fn flow_hop(conn: &Conn) -> Hop {
    Hop {
        addr: conn.peer,
        transport: conn.transport,
        flow: Some(FlowId(conn.id)),
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests;
