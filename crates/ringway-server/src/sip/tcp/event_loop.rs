//! One TCP event loop: accept (loop 0), read and frame the connections it
//! owns, run their messages through the core (the proxy's or the
//! dispatcher's worker: a [`MessageHandler`]), flush what waits, and close
//! what broke a bound.

use super::framing::{Framed, Framer};
use super::{add, flow_hop, CloseReason, Conn, Connections, ReadOutcome};
use mio::net::TcpListener;
use mio::{Events, Interest, Poll, Token};
use ringway_io::monotonic_now;
use ringway_sip::dispatch::DispatchWorker;
use ringway_sip::{Hop, ProxyWorker, Transport};
use std::collections::HashMap;
use std::io::ErrorKind;
use std::net::UdpSocket;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Longest wait for events before the loop re-checks the stop flag and
/// its connections' timers.
const POLL: Duration = Duration::from_millis(50);
/// How often the idle and message timers are checked (ns).
const SWEEP_EVERY: u64 = 200_000_000;
/// Bytes read per read call.
const READ_CHUNK: usize = 16 * 1024;

/// A sans-IO core's per-thread worker, as an event loop drives it: one
/// message from a hop in, the messages to send out with their hops.
pub(crate) trait MessageHandler {
    /// Handle `message` that came from `from` at `now` (monotonic ns).
    fn handle_message(
        &mut self,
        now: u64,
        from: Hop,
        message: &[u8],
        out: &mut dyn FnMut(Hop, &[u8]),
    );
}

impl MessageHandler for ProxyWorker<'_> {
    fn handle_message(
        &mut self,
        now: u64,
        from: Hop,
        message: &[u8],
        out: &mut dyn FnMut(Hop, &[u8]),
    ) {
        self.handle_from(now, from, message, out);
    }
}

impl MessageHandler for DispatchWorker<'_> {
    fn handle_message(
        &mut self,
        now: u64,
        from: Hop,
        message: &[u8],
        out: &mut dyn FnMut(Hop, &[u8]),
    ) {
        self.handle_from(now, from, message, out);
    }
}

/// What one event loop runs with.
pub(crate) struct LoopContext<'a> {
    /// This loop's poll (its registry is in `connections`).
    pub(crate) poll: Poll,
    /// Listening sockets and their transports (loop 0 only), token = index.
    pub(crate) listeners: Vec<(TcpListener, Transport)>,
    pub(crate) connections: &'a Connections,
    /// The core's worker every framed message goes to.
    pub(crate) handler: &'a mut dyn MessageHandler,
    /// For messages the core sends over UDP.
    pub(crate) udp: UdpSocket,
    pub(crate) stop: &'a AtomicBool,
}

/// A connection as its owner loop sees it.
struct Owned {
    conn: Arc<Conn>,
    framer: Framer,
    /// When the message now buffered began (ns).
    message_started: u64,
    messages: u64,
    /// Opened by us and its connect completed.
    connected: bool,
}

/// Run until `stop`: every connection is closed on the way out.
pub(crate) fn run_loop(mut ctx: LoopContext<'_>) {
    let connections = ctx.connections;
    let config = connections.config().clone();
    let limits = config.frame_limits();
    let mut events = Events::with_capacity(256);
    let mut owned: HashMap<u64, Owned> = HashMap::new();
    let mut read_buf = vec![0u8; READ_CHUNK];
    let mut last_sweep = 0u64;
    // A descriptor held in reserve by the accepting loop: out of
    // descriptors, it is given up to take a pending connection and close
    // it (see `accept_all`).
    let mut spare = if ctx.listeners.is_empty() {
        None
    } else {
        spare_descriptor()
    };
    register_listeners(&mut ctx);
    while !ctx.stop.load(Ordering::Relaxed) {
        if let Err(e) = ctx.poll.poll(&mut events, Some(POLL)) {
            if e.kind() != ErrorKind::Interrupted {
                crate::warn_limited!("sip tcp: poll: {e}");
                std::thread::sleep(Duration::from_millis(10));
            }
            continue;
        }
        for event in events.iter() {
            let token = event.token().0 as u64;
            if token < super::FIRST_CONNECTION {
                if let Some((listener, transport)) = ctx.listeners.get(token as usize) {
                    accept_all(listener, *transport, connections, &mut spare);
                }
                continue;
            }
            let now = monotonic_now().0;
            let entry = match owned.entry(token) {
                std::collections::hash_map::Entry::Occupied(entry) => entry.into_mut(),
                std::collections::hash_map::Entry::Vacant(slot) => {
                    // A connection handed to us (accepted by loop 0, or
                    // opened by a sender): its first event.
                    let Some(conn) = connections.get(token) else {
                        continue;
                    };
                    slot.insert(Owned {
                        conn,
                        framer: Framer::default(),
                        message_started: now,
                        messages: 0,
                        connected: false,
                    })
                }
            };
            let mut close = entry.conn.closing();
            if close.is_none() && event.is_writable() {
                if !entry.conn.inbound && entry.messages == 0 {
                    match entry.conn.stream.take_error() {
                        // Writable with no error: the connect completed.
                        Ok(None) => entry.connected |= entry.conn.stream.peer_addr().is_ok(),
                        Ok(Some(_)) | Err(_) => close = Some(CloseReason::ConnectFailed),
                    }
                }
                if close.is_none() && entry.conn.flush().is_err() {
                    close = Some(CloseReason::IoError);
                }
            }
            if close.is_none() && (event.is_readable() || event.is_read_closed()) {
                close = read_ready(
                    entry,
                    &mut read_buf,
                    &mut ReadContext {
                        connections,
                        handler: &mut *ctx.handler,
                        udp: &ctx.udp,
                        limits,
                        max_messages: config.max_messages_per_connection,
                    },
                );
            }
            if close.is_none() && event.is_error() {
                close = Some(CloseReason::IoError);
            }
            if close == Some(CloseReason::IoError)
                && !entry.conn.inbound
                && !entry.connected
                && entry.messages == 0
            {
                // A connection of ours that failed before its connect
                // completed (refused: the error comes as a read).
                close = Some(CloseReason::ConnectFailed);
            }
            if close.is_none() {
                // Up (TLS: its handshake done too): no longer a transport
                // error if it closes.
                entry
                    .conn
                    .confirm_if_up(entry.connected || entry.messages > 0);
            }
            if let Some(reason) = close {
                if let Some(entry) = owned.remove(&token) {
                    connections.close(&entry.conn, reason);
                }
            }
        }
        let now = monotonic_now().0;
        if now >= last_sweep + SWEEP_EVERY {
            last_sweep = now;
            let idle = config.idle_timeout_s.saturating_mul(1_000_000_000);
            let message = config.message_timeout_ms.saturating_mul(1_000_000);
            let tls = connections.tls();
            let handshake = tls.map_or(u64::MAX, |tls| {
                tls.config().handshake_timeout_ms.saturating_mul(1_000_000)
            });
            if let (Some(tls), false) = (tls, ctx.listeners.is_empty()) {
                tls.reload_if_changed(now);
            }
            owned.retain(|_, entry| {
                let reason = entry.conn.closing().or_else(|| {
                    let active = entry.conn.last_active.load(Ordering::Relaxed);
                    if entry.conn.handshake_expired(now, handshake) {
                        Some(CloseReason::TlsHandshake)
                    } else if entry.conn.upgrade_expired(now, message) {
                        // The WebSocket upgrade (request or answer) is
                        // the first message: bounded like any other.
                        Some(CloseReason::WsHandshake)
                    } else if entry.framer.in_message()
                        && now.saturating_sub(entry.message_started) > message
                    {
                        Some(CloseReason::MessageTimeout)
                    } else if now.saturating_sub(active) > idle {
                        Some(CloseReason::Idle)
                    } else {
                        None
                    }
                });
                match reason {
                    Some(reason) => {
                        connections.close(&entry.conn, reason);
                        false
                    }
                    None => true,
                }
            });
        }
    }
    for (_, entry) in owned.drain() {
        connections.close(&entry.conn, CloseReason::Shutdown);
    }
}

/// Poll the loop's listeners (token = their index).
fn register_listeners(ctx: &mut LoopContext<'_>) {
    for (i, (listener, _)) in ctx.listeners.iter_mut().enumerate() {
        if let Err(e) = ctx
            .poll
            .registry()
            .register(listener, Token(i), Interest::READABLE)
        {
            log::error!("sip tcp: cannot poll listener: {e}");
        }
    }
}

/// The spare descriptor (`/dev/null` opened), `None` if even that fails.
fn spare_descriptor() -> Option<std::fs::File> {
    std::fs::File::open("/dev/null").ok()
}

/// Accept every pending connection (edge-triggered: until WouldBlock).
///
/// Out of descriptors, a connection stays in the kernel's backlog, its
/// client waiting for an answer that never comes, and (edge-triggered) the
/// listener reports nothing more until another connection arrives: the
/// backlog fills and every client, wanted or not, times out. So the loop
/// gives up its spare descriptor, takes the connection, closes it at once
/// (refused, counted as `descriptors`: the client learns at once) and
/// takes the spare back, until the backlog is empty.
fn accept_all(
    listener: &TcpListener,
    transport: Transport,
    connections: &Connections,
    spare: &mut Option<std::fs::File>,
) {
    loop {
        match listener.accept() {
            Ok((stream, peer)) => connections.adopt(stream, peer, transport, monotonic_now().0),
            Err(e) if e.kind() == ErrorKind::WouldBlock => return,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) if ringway_io::limits::is_out_of_descriptors(&e) && spare.is_some() => {
                crate::warn_limited!(
                    "sip tcp: accept: {e}: refusing connections until descriptors free up \
                     (the open files limit is below tcp.max_connections)"
                );
                *spare = None;
                let taken = listener.accept();
                let done = match taken {
                    // Closed at once (dropped here, before the spare is
                    // taken back: it needs that descriptor).
                    Ok(refused) => {
                        drop(refused);
                        connections.refused_for_descriptors(transport);
                        false
                    }
                    Err(e) => e.kind() == ErrorKind::WouldBlock,
                };
                *spare = spare_descriptor();
                if done {
                    return;
                }
                if spare.is_none() {
                    // Another thread took the descriptor: try again on the
                    // next event.
                    return;
                }
            }
            Err(e) => {
                // Out of descriptors with no spare, and the like: try
                // again on the next event.
                crate::warn_limited!("sip tcp: accept: {e}");
                return;
            }
        }
    }
}

struct ReadContext<'a> {
    connections: &'a Connections,
    handler: &'a mut dyn MessageHandler,
    udp: &'a UdpSocket,
    limits: super::framing::FrameLimits,
    max_messages: u64,
}

/// Read until the kernel has nothing more, handing each framed message to
/// the core. `Some(reason)`: close the connection.
fn read_ready(entry: &mut Owned, buf: &mut [u8], ctx: &mut ReadContext<'_>) -> Option<CloseReason> {
    let counters = ctx.connections.counters.of(entry.conn.transport);
    loop {
        let n = match entry.conn.read(buf) {
            ReadOutcome::Bytes(n) => n,
            ReadOutcome::Again => return None,
            ReadOutcome::Interrupted => continue,
            ReadOutcome::Close(reason) => return Some(reason),
        };
        let now = monotonic_now().0;
        add(&counters.bytes_in, n as u64);
        entry
            .conn
            .last_active
            .store(now, std::sync::atomic::Ordering::Relaxed);
        if entry.conn.ws.is_some() {
            match ws_input(entry, &buf[..n], ctx, now) {
                Some(reason) => return Some(reason),
                None => continue,
            }
        }
        if !entry.framer.in_message() {
            entry.message_started = now;
        }
        if let Err(e) = entry.framer.extend(&buf[..n], ctx.limits) {
            return Some(CloseReason::of_frame_error(e));
        }
        loop {
            match entry.framer.next(ctx.limits) {
                Err(e) => return Some(CloseReason::of_frame_error(e)),
                Ok(None) => break,
                Ok(Some(Framed::Ping)) => {
                    add(&counters.pings, 1);
                    // RFC 5626 4.4.1: a CRLF pong.
                    let _ = entry.conn.write(
                        b"\r\n",
                        ctx.connections.config.max_send_buffer_bytes,
                        now,
                    );
                }
                Ok(Some(Framed::Pong)) => {}
                Ok(Some(Framed::Message(len))) => {
                    add(&counters.messages_in, 1);
                    entry.messages += 1;
                    let message = &entry.framer.buffered()[..len];
                    take_alias(ctx.connections, &entry.conn, message);
                    deliver(ctx, flow_hop(&entry.conn), message, now);
                    entry.framer.consume(len);
                    entry.message_started = now;
                    if ctx.max_messages > 0 && entry.messages >= ctx.max_messages {
                        return Some(CloseReason::MessageLimit);
                    }
                }
            }
        }
    }
}

/// Bytes of a WebSocket connection (RFC 7118): the upgrade request (an
/// accepted connection) or the server's answer to ours (one we opened)
/// until it is whole and checked, then frames; each data message is one
/// SIP message for the core. `Some(reason)`: close the connection.
fn ws_input(
    entry: &mut Owned,
    bytes: &[u8],
    ctx: &mut ReadContext<'_>,
    now: u64,
) -> Option<CloseReason> {
    use crate::sip::ws::{self, WsEvent, WsLimits};
    let connections = ctx.connections;
    let config = &connections.config;
    let send_limit = config.max_send_buffer_bytes;
    let limits = WsLimits {
        max_handshake_bytes: config.max_header_bytes,
        max_message_bytes: config.max_header_bytes + config.max_body_bytes,
    };
    let session = entry.conn.ws.as_ref()?;
    let mut events = Vec::new();
    let mut close = None;
    {
        let mut state = session.state();
        let fresh: Vec<u8>;
        let input: &[u8] = if session.upgraded() {
            bytes
        } else {
            state.head.extend_from_slice(bytes);
            let consumed = match session.role() {
                ws::Role::Server => {
                    match ws::parse_handshake(&state.head, limits, &connections.ws.origins) {
                        Ok(None) => None,
                        Err(e) => {
                            let _ = entry.conn.write_raw(e.response(), send_limit, now);
                            return Some(CloseReason::WsHandshake);
                        }
                        Ok(Some(upgrade)) => {
                            if !entry.conn.write_raw(&upgrade.response, send_limit, now) {
                                return Some(CloseReason::IoError);
                            }
                            Some(upgrade.consumed)
                        }
                    }
                }
                ws::Role::Client => {
                    match ws::parse_handshake_response(&state.head, limits, session.accept()) {
                        Ok(None) => None,
                        Err(e) => {
                            crate::warn_limited!(
                                "sip {}: {} refused our WebSocket upgrade: {}",
                                entry.conn.transport,
                                entry.conn.peer,
                                e.label()
                            );
                            return Some(CloseReason::WsHandshake);
                        }
                        Ok(Some(consumed)) => {
                            // What was sent meanwhile goes first, then
                            // the connection counts as upgraded (under
                            // the state lock: see `WsSession::outgoing`).
                            for message in std::mem::take(&mut state.pending) {
                                if !entry
                                    .conn
                                    .write_raw(&session.text(&message), send_limit, now)
                                {
                                    return Some(
                                        entry.conn.closing().unwrap_or(CloseReason::IoError),
                                    );
                                }
                            }
                            state.pending_bytes = 0;
                            Some(consumed)
                        }
                    }
                }
            };
            let Some(consumed) = consumed else {
                if state.head.len() > limits.max_handshake_bytes {
                    return Some(CloseReason::WsHandshake);
                }
                return None;
            };
            session.set_upgraded();
            fresh = state.head.split_off(consumed);
            state.head = Vec::new();
            &fresh
        };
        'chunks: for chunk in input.chunks(ws::MAX_READ) {
            if let Err(e) = state.decoder.extend(chunk, limits) {
                close = Some(e);
                break;
            }
            loop {
                match state.decoder.next(limits) {
                    Ok(Some(event)) => events.push(event),
                    Ok(None) => break,
                    Err(e) => {
                        close = Some(e);
                        break 'chunks;
                    }
                }
            }
        }
    }
    for event in events {
        match event {
            WsEvent::Message(message) => {
                add(
                    &connections.counters.of(entry.conn.transport).messages_in,
                    1,
                );
                entry.messages += 1;
                deliver(ctx, flow_hop(&entry.conn), &message, now);
                if ctx.max_messages > 0 && entry.messages >= ctx.max_messages {
                    return Some(CloseReason::MessageLimit);
                }
            }
            WsEvent::Ping(payload) => {
                add(&connections.counters.of(entry.conn.transport).pings, 1);
                let _ = entry
                    .conn
                    .write_raw(&session.pong(&payload), send_limit, now);
            }
            WsEvent::Pong => {}
            WsEvent::Close(_) => {
                let _ = entry.conn.write_raw(&session.close(1000), send_limit, now);
                return Some(CloseReason::PeerClosed);
            }
        }
    }
    let e = close?;
    let _ = entry
        .conn
        .write_raw(&session.close(e.close_code()), send_limit, now);
    Some(CloseReason::WsError)
}

/// RFC 5923: a request on a TCP or TLS connection whose top Via asks for
/// an `alias` makes the connection serve requests to that sent-by
/// ([`Connections::alias`] says when it is taken). Only until the
/// connection has one: later messages are not looked at.
fn take_alias(connections: &Connections, conn: &Conn, message: &[u8]) {
    if conn.alias.get().is_some() || !matches!(conn.transport, Transport::Tcp | Transport::Tls) {
        return;
    }
    if let Some((transport, sent_by)) = ringway_sip::transport::alias_of(message) {
        connections.alias(conn, transport, sent_by);
    }
}

/// Hand one message from `from` to the core and send what it answers.
fn deliver(ctx: &mut ReadContext<'_>, from: Hop, message: &[u8], now: u64) {
    let connections = ctx.connections;
    let udp = ctx.udp;
    ctx.handler.handle_message(
        now,
        from,
        message,
        &mut |hop: Hop, bytes: &[u8]| match hop.transport {
            Transport::Udp => {
                if ringway_io::sock::send_to(udp, bytes, hop.addr).is_ok() {
                    add(&connections.counters.udp_out, 1);
                }
            }
            _ => {
                connections.send(hop, bytes, now);
            }
        },
    );
}
