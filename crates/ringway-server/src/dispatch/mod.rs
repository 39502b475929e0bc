//! The SIP dispatcher server: worker threads (one SO_REUSEPORT socket
//! each) drive the sans-IO [`ringway_sip::dispatch::Dispatcher`] over
//! batches of datagrams, and a probe thread sends its OPTIONS probes at
//! their deadlines and logs proxies going out and coming back.
//!
//! With `tcp:`, `tls:`, `ws:` or `wss:` listen addresses the proxy's
//! connection driver (`crate::sip::tcp`: event loops, the connection
//! table, framing, TLS and WebSocket, with the same bounds and counters)
//! carries the dispatcher too: its event loops hand each framed message
//! to a dispatcher worker, and every thread sends a message whose hop is a
//! connection transport through the one connection table (a reply over
//! its request's connection, a request to a `tcp:`/`tls:` proxy over the
//! connection to it, opened once and reused).
//!
//! ```no_run
//! use ringway_server::dispatch::{DispatchServer, DispatchServerConfig};
//! let server = DispatchServer::start(DispatchServerConfig {
//!     listen: "127.0.0.1:5060".parse().unwrap(),
//!     proxies: vec!["127.0.0.11:5060".parse().unwrap(), "127.0.0.12:5060".parse().unwrap()],
//!     ..Default::default()
//! })?;
//! let summary = server.shutdown();
//! println!("{} requests dispatched", summary.dispatch.requests_dispatched);
//! # Ok::<(), ringway_server::ServerError>(())
//! ```

mod config;

use crate::dns::{NextHop, TransportNextHop};
use crate::host;
use crate::metrics::PromText;
use crate::sip::{Connections, TcpSnapshot, TlsConfig, TlsSnapshot, TX_FRAME};
use crate::ServerError;
use config::named;
pub use config::DispatchServerConfig;
use ringway_io::SocketConfig;
use ringway_io::{monotonic_now, open_backend, open_udp, BatchIo, RxBatch, TxBatch};
use ringway_sip::dispatch::{DispatchConfig, DispatchStats, Dispatcher};
use ringway_sip::{FloodConfig, Hop, Transport, TransportAddr};
use serde::Serialize;
use std::net::SocketAddr;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// Receive wait before a worker re-checks the stop flag.
const POLL: Duration = Duration::from_millis(50);
/// Longest sleep of the probe thread.
const PROBE_TICK_MAX: Duration = Duration::from_millis(20);

/// How often the proxies' names are looked at again: from the DNS cache
/// while their TTLs last (no query), from the nameserver once expired.
const RERESOLVE_EVERY: Duration = Duration::from_secs(1);

/// Resolve the proxies given by name (at start on the starting thread, no
/// worker runs yet; on a reload on the management thread; later on the
/// re-resolution thread): the literal proxies, then every target of the
/// names the relay policy allows (at most 64 in all). A name that gives no
/// allowed target is an error.
fn resolve_proxy_names(
    listen: SocketAddr,
    wanted: &Wanted,
    resolver: &crate::dns::Resolver,
) -> Result<Vec<TransportAddr>, ServerError> {
    let literal = &wanted.proxies;
    let mut proxies = literal.clone();
    let policy = ringway_sip::RelayPolicy::new(
        listen,
        literal.iter().map(|p| p.addr).collect(),
        wanted.relay.clone(),
    );
    for name in &wanted.proxy_names {
        let NextHop::Name { host, port } = &name.hop else {
            continue;
        };
        let transport = name.transport;
        let targets = resolver
            .lookup_over(host, *port, transport, listen)
            .map_err(|e| ServerError::Config(format!("proxy {name}: {e}")))?;
        let allowed = crate::dns::policy_filter(&policy, targets);
        let added: Vec<TransportAddr> = allowed
            .into_iter()
            .filter(|to| *to != listen)
            .map(|addr| TransportAddr { transport, addr })
            .collect();
        if added.is_empty() {
            return Err(ServerError::Config(format!(
                "proxy {name}: no resolved address the relay policy allows (loopback, link-local and our own IP need `relay` to name them)"
            )));
        }
        log::info!(
            "sip dispatch: proxy {name} resolved to {}",
            added
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        );
        for to in added {
            if !proxies.iter().any(|p| p.addr == to.addr) && proxies.len() < 64 {
                proxies.push(to);
            }
        }
    }
    Ok(proxies)
}

/// The proxies as configured (at start, then by each reload): what the
/// periodic re-resolution of the names starts from, so that it never
/// undoes a reload.
#[derive(Clone)]
struct Wanted {
    /// The proxies given as IP literals.
    proxies: Vec<TransportAddr>,
    /// The proxies given by name.
    proxy_names: Vec<TransportNextHop>,
    /// The relay networks in force.
    relay: ringway_sip::RelayNets,
    /// The proxies in force that came from DNS (their going out counts as
    /// a failover).
    resolved: Vec<TransportAddr>,
    /// Bumped by every reload: a re-resolution started before it is
    /// dropped.
    generation: u64,
}

impl Wanted {
    fn of(config: &DispatchServerConfig) -> Wanted {
        Wanted {
            proxies: config.proxies.clone(),
            proxy_names: config.proxy_names.clone(),
            relay: config.relay.clone(),
            resolved: Vec::new(),
            generation: 0,
        }
    }
}

/// What the threads share.
struct Shared {
    config: DispatchServerConfig,
    local: SocketAddr,
    /// The one dispatcher: a reload or a name resolving to other targets
    /// swaps its proxy set ([`Dispatcher::set_proxies`]), workers take the
    /// new set at their next datagram.
    dispatcher: Dispatcher,
    /// The proxies as configured, and which came from DNS. Held while a
    /// new proxy set is applied (reload and re-resolution do not cross).
    wanted: Mutex<Wanted>,
    stop: AtomicBool,
    messages_in: AtomicU64,
    messages_out: AtomicU64,
    tx_errors: AtomicU64,
    /// Received datagrams cut at the frame size (dropped).
    rx_truncated: AtomicU64,
    /// Produced datagrams too large for a send frame (dropped).
    tx_oversize: AtomicU64,
    started: Instant,
    /// Threads that panicked (each stops every thread: review S11).
    panicked: Mutex<Vec<String>>,
    /// Test hook (`RINGWAY_TEST_PANIC=dispatch-w0`): that worker panics on
    /// its first datagram.
    inject_panic: Option<String>,
    /// The resolver of `proxy_names` (its counters), if any.
    resolver: Option<crate::dns::Resolver>,
    /// The connection table (`None`: UDP only).
    connections: Option<Arc<Connections>>,
    /// The connection-transport listen addresses, bound.
    stream_addresses: Vec<TransportAddr>,
    /// Reloads applied and refused.
    reloads: AtomicU64,
    reloads_refused: AtomicU64,
}

/// The JSON summary of a dispatcher run (`ringway.sip-dispatch.summary/1`).
#[derive(Debug, Serialize)]
pub struct DispatchSummary {
    /// Schema id.
    pub schema: &'static str,
    /// Bound address.
    pub listen: SocketAddr,
    /// Bound connection-transport addresses.
    pub listeners: Vec<TransportAddr>,
    /// The configuration.
    pub config: DispatchServerConfig,
    /// Seconds it ran.
    pub duration_s: f64,
    /// Datagrams received.
    pub messages_in: u64,
    /// Datagrams sent.
    pub messages_out: u64,
    /// Datagrams the kernel refused.
    pub tx_errors: u64,
    /// Received datagrams longer than a receive frame (dropped).
    pub rx_truncated: u64,
    /// Datagrams produced that did not fit a send frame (dropped).
    pub tx_oversize: u64,
    /// The dispatcher's counters, per proxy too.
    pub dispatch: DispatchStats,
    /// The connection transports' counters (all of TCP, TLS, WS, WSS;
    /// `None`: UDP only).
    pub tcp: Option<TcpSnapshot>,
    /// The TLS layer's counters (`None`: no TLS).
    pub tls: Option<TlsSnapshot>,
    /// Threads that panicked (each stops the dispatcher; the command then
    /// exits with an error). Empty on a clean run.
    pub threads_panicked: Vec<String>,
}

/// A handle on a running dispatcher for the management API.
#[derive(Clone)]
pub struct DispatchControl {
    shared: Arc<Shared>,
}

impl DispatchControl {
    /// Counters, with every proxy's state.
    pub fn stats(&self) -> DispatchStats {
        self.shared.dispatcher.stats()
    }

    /// The address it listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.shared.local
    }

    /// Seconds since start.
    pub fn uptime_s(&self) -> f64 {
        self.shared.started.elapsed().as_secs_f64()
    }

    /// Reloads applied and refused so far.
    pub fn reloads(&self) -> (u64, u64) {
        (
            self.shared.reloads.load(Ordering::Relaxed),
            self.shared.reloads_refused.load(Ordering::Relaxed),
        )
    }

    /// Apply a new configuration (a reload): the proxies (`proxies`, and
    /// `proxy_names` resolved again on this thread) and `relay` at once,
    /// swapped into the running dispatcher; they are also what the
    /// periodic re-resolution of the names starts from from now on. Every
    /// other key needs a restart and is listed in `restart_needed` when it
    /// changed. An invalid configuration, or a name that resolves to
    /// nothing allowed, is refused and nothing changes.
    pub fn reload(
        &self,
        mut config: DispatchServerConfig,
    ) -> Result<crate::sip::ReloadReport, ServerError> {
        let shared = &self.shared;
        let mut wanted = Wanted::of(&config);
        let checked = config.validate().and_then(|()| {
            // Names resolved again, here (a management thread, not a
            // worker): by the running resolver (its cache, its counters),
            // or, when the dispatcher started without names, by one for
            // this reload only (those names are not looked at again until
            // the next reload or a restart).
            let listen = shared.config.listen;
            config.proxies = match (&shared.resolver, wanted.proxy_names.is_empty()) {
                (_, true) => wanted.proxies.clone(),
                (Some(resolver), false) => resolve_proxy_names(listen, &wanted, resolver)?,
                (None, false) => {
                    let resolver = crate::dns::Resolver::start(crate::dns::DnsConfig {
                        server: config.dns_server,
                        threads: 1,
                        ..crate::dns::DnsConfig::default()
                    })
                    .map_err(|e| ServerError::Config(format!("proxy_names: {e}")))?;
                    let resolved = resolve_proxy_names(listen, &wanted, &resolver);
                    resolver.stop();
                    resolved?
                }
            };
            Ok(())
        });
        if let Err(e) = checked {
            self.reload_refused(&e.to_string());
            return Err(e);
        }
        let running = &shared.config;
        let mut restart_needed = Vec::new();
        let mut differs = |key: &str, changed: bool| {
            if changed {
                restart_needed.push(key.to_string());
            }
        };
        differs(
            "listen",
            config.listen != running.listen || config.listeners != running.listeners,
        );
        differs("tcp-*", config.tcp != running.tcp);
        differs("ws-origin", config.ws_origins != running.ws_origins);
        differs("workers", config.workers != running.workers);
        differs("backend", config.io.kind() != running.io.kind());
        differs("batch", config.batch != running.batch);
        differs(
            "probe-interval-ms",
            config.probe_interval_ms != running.probe_interval_ms,
        );
        differs(
            "probe-failures",
            config.probe_failures != running.probe_failures,
        );
        differs("record-route", config.record_route != running.record_route);
        differs("dns-server", config.dns_server != running.dns_server);
        differs(
            "flood-*",
            config.flood_limit != running.flood_limit
                || config.flood_window != running.flood_window
                || config.flood_table_size != running.flood_table_size
                || config.flood_exempt != running.flood_exempt
                || config.flood_ipv6_prefix != running.flood_ipv6_prefix,
        );
        // Held while applying: a re-resolution in flight is dropped.
        let mut in_force = shared.wanted.lock().unwrap_or_else(PoisonError::into_inner);
        let before = shared.dispatcher.proxies();
        let mut applied = Vec::new();
        if before != config.proxies {
            applied.push("proxy".to_string());
        }
        if in_force.relay != config.relay {
            applied.push("relay".to_string());
        }
        let targets_changed = !applied.is_empty();
        // The certificates are read again (as by the proxy): connections
        // open keep their sessions. Other TLS settings need a restart.
        if let Some(tls) = shared.connections.as_ref().and_then(|c| c.tls()) {
            let files =
                |c: &TlsConfig| (c.cert.clone(), c.key.clone(), c.ca.clone(), c.sni.clone());
            if files(&config.tls) == files(&running.tls) {
                if let Err(e) = tls.reload() {
                    drop(in_force);
                    self.reload_refused(&e);
                    return Err(ServerError::Config(e));
                }
                applied.push("tls certificates".to_string());
            } else {
                restart_needed.push("tls-*".to_string());
            }
        }
        if targets_changed {
            shared
                .dispatcher
                .set_proxies(&config.proxies, config.relay.clone());
        }
        wanted.resolved = config.proxies[wanted.proxies.len()..].to_vec();
        wanted.generation = in_force.generation + 1;
        *in_force = wanted;
        drop(in_force);
        let list = |v: Vec<&TransportAddr>| v.into_iter().map(named).collect::<Vec<_>>().join(", ");
        let added = list(
            config
                .proxies
                .iter()
                .filter(|p| !before.contains(p))
                .collect(),
        );
        let removed = list(
            before
                .iter()
                .filter(|p| !config.proxies.contains(p))
                .collect(),
        );
        log::info!(
            "sip dispatch: reloaded: proxies {} (added [{added}], removed [{removed}]), relay {}{}",
            list(config.proxies.iter().collect()),
            config.relay,
            if restart_needed.is_empty() {
                String::new()
            } else {
                format!(
                    "; not applied, need a restart: {}",
                    restart_needed.join(", ")
                )
            }
        );
        shared.reloads.fetch_add(1, Ordering::Relaxed);
        Ok(crate::sip::ReloadReport {
            applied,
            restart_needed,
            credentials: None,
        })
    }

    /// Count a reload refused before it reached [`DispatchControl::reload`]
    /// (the file could not be read or parsed), and log why.
    pub fn reload_refused(&self, reason: &str) {
        self.shared.reloads_refused.fetch_add(1, Ordering::Relaxed);
        log::warn!("sip dispatch: reload refused, the running configuration stays: {reason}");
    }

    /// Set proxy `address`'s state (`false`: no such proxy).
    pub fn set_admin_state(
        &self,
        address: SocketAddr,
        state: ringway_sip::dispatch::AdminState,
    ) -> bool {
        let done = self.shared.dispatcher.set_admin_state(address, state);
        if done {
            log::info!(
                "sip dispatch: management: proxy {address} set {}",
                state.as_str()
            );
        }
        done
    }
}

/// A running dispatcher.
pub struct DispatchServer {
    shared: Arc<Shared>,
    threads: host::ThreadGroup,
}

impl DispatchServer {
    /// Open the sockets and start the worker and probe threads.
    pub fn start(mut config: DispatchServerConfig) -> Result<DispatchServer, ServerError> {
        config.validate()?;
        let mut wanted = Wanted::of(&config);
        let resolver = if config.proxy_names.is_empty() {
            None
        } else {
            let resolver = crate::dns::Resolver::start(crate::dns::DnsConfig {
                server: config.dns_server,
                threads: 1,
                ..crate::dns::DnsConfig::default()
            })
            .map_err(|e| ServerError::Config(format!("proxy_names: {e}")))?;
            match resolve_proxy_names(config.listen, &wanted, &resolver) {
                Ok(proxies) => config.proxies = proxies,
                Err(e) => {
                    resolver.stop();
                    return Err(e);
                }
            }
            Some(resolver)
        };
        wanted.resolved = config.proxies[wanted.proxies.len()..].to_vec();
        let mut socket_config = SocketConfig::new(config.listen);
        socket_config.reuseport = true;
        socket_config.rx_timestamps = false;
        let mut sockets = Vec::new();
        for _ in 0..config.workers {
            let (socket, report) =
                open_udp(&socket_config).map_err(|source| ServerError::Socket {
                    addr: socket_config.bind,
                    source,
                })?;
            for w in &report.warnings {
                log::warn!("sip dispatch: socket {}: {w}", socket_config.bind);
            }
            socket_config.bind = socket.local_addr()?;
            sockets.push(socket);
        }
        let local = sockets[0].local_addr()?;
        let probe_socket = sockets[0].try_clone()?;
        let streams = crate::sip::open_stream_listeners(
            &crate::sip::StreamSettings {
                listeners: &config.listeners,
                tcp: &config.tcp,
                tls: &config.tls,
                ws_origins: &config.ws_origins,
                ws_paths: Vec::new(),
                workers: config.workers,
                who: "sip dispatch",
            },
            local,
        );
        let streams = match streams {
            Ok(streams) => streams,
            Err(e) => {
                if let Some(resolver) = &resolver {
                    resolver.stop();
                }
                return Err(e);
            }
        };
        // Which sources share a flood-table set cannot be aimed at.
        let flood_seed: [u8; 8] = host::random_bytes()?;
        let dispatcher = Dispatcher::new(DispatchConfig {
            local,
            listeners: streams.addresses.clone(),
            proxies: config.proxies.clone(),
            probe_interval: config.probe_interval_ms.saturating_mul(1_000_000),
            probe_failures: config.probe_failures,
            record_route: config.record_route,
            secret: host::random_bytes()?,
            relay: config.relay.clone(),
            flood: config.flood_limit.map(|limit| FloodConfig {
                limit,
                window: u64::try_from(config.flood_window.as_nanos()).unwrap_or(u64::MAX),
                table_size: config.flood_table_size,
                exempt: config.flood_exempt.clone(),
                ipv6_prefix: config.flood_ipv6_prefix,
                seed: u64::from_le_bytes(flood_seed),
            }),
        });
        let backend = config.io.kind();
        let shared = Arc::new(Shared {
            config,
            local,
            dispatcher,
            wanted: Mutex::new(wanted),
            stop: AtomicBool::new(false),
            messages_in: AtomicU64::new(0),
            messages_out: AtomicU64::new(0),
            tx_errors: AtomicU64::new(0),
            rx_truncated: AtomicU64::new(0),
            tx_oversize: AtomicU64::new(0),
            started: Instant::now(),
            panicked: Mutex::new(Vec::new()),
            inject_panic: std::env::var("RINGWAY_TEST_PANIC").ok(),
            resolver,
            reloads: AtomicU64::new(0),
            reloads_refused: AtomicU64::new(0),
            connections: streams.connections,
            stream_addresses: streams.addresses,
        });
        let open = |socket| {
            open_backend(backend, socket).map_err(|source| ServerError::Backend {
                backend: backend.to_string(),
                source,
            })
        };
        let mut server = DispatchServer {
            shared,
            threads: host::ThreadGroup::default(),
        };
        let mut ios = Vec::new();
        for socket in sockets {
            ios.push(open(socket)?);
        }
        let mut stream_listeners = Some(streams.listeners);
        for (i, poll) in streams.polls.into_iter().enumerate() {
            let shared = server.shared.clone();
            // For what the loop sends over UDP (to a UDP proxy, to a UDP
            // client).
            let udp = probe_socket.try_clone()?;
            let listeners = match i {
                0 => stream_listeners.take().unwrap_or_default(),
                _ => Vec::new(),
            };
            server.spawn(format!("dispatch-tcp{i}"), move || {
                stream_thread(&shared, poll, listeners, udp)
            })?;
        }
        let probe_io = open(probe_socket)?;
        for (i, io) in ios.into_iter().enumerate() {
            let shared = server.shared.clone();
            let name = format!("dispatch-w{i}");
            let thread = name.clone();
            server.spawn(name, move || worker_thread(&shared, &thread, io))?;
        }
        let shared = server.shared.clone();
        server.spawn("dispatch-probe".into(), move || {
            probe_thread(&shared, probe_io)
        })?;
        if server.shared.resolver.is_some() {
            let shared = server.shared.clone();
            server.spawn("dispatch-dns".into(), move || reresolve_thread(&shared))?;
        }
        Ok(server)
    }

    /// Start `body` on a thread; if it panics, every thread is told to
    /// stop (no socket stays bound with nobody reading it) and the panic is
    /// passed on to `join`.
    fn spawn(
        &mut self,
        name: String,
        body: impl FnOnce() + Send + 'static,
    ) -> Result<(), ServerError> {
        let shared = self.shared.clone();
        let thread = name.clone();
        let body = move || {
            if let Err(panic) = catch_unwind(AssertUnwindSafe(body)) {
                shared
                    .panicked
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .push(thread.clone());
                shared.stop.store(true, Ordering::Relaxed);
                log::error!("sip dispatch: thread {thread} panicked: stopping every thread");
                resume_unwind(panic);
            }
        };
        let spawned = self.threads.spawn(name, body);
        if spawned.is_err() {
            self.stop_threads();
        }
        spawned
    }

    /// The bound address.
    pub fn local_addr(&self) -> SocketAddr {
        self.shared.local
    }

    /// The bound connection-transport addresses (`tcp:…`, `tls:…`, …).
    pub fn stream_addresses(&self) -> &[TransportAddr] {
        &self.shared.stream_addresses
    }

    /// The connection table (`None`: UDP only).
    pub fn connections(&self) -> Option<&Connections> {
        self.shared.connections.as_deref()
    }

    /// Names of the threads that panicked (empty while all is well).
    pub fn panicked_threads(&self) -> Vec<String> {
        self.shared
            .panicked
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The dispatcher's counters now.
    pub fn stats(&self) -> DispatchStats {
        self.shared.dispatcher.stats()
    }

    /// A handle for the management API (targets, their states).
    pub fn control(&self) -> DispatchControl {
        DispatchControl {
            shared: self.shared.clone(),
        }
    }

    /// A function rendering the Prometheus text, for a metrics thread.
    pub fn prometheus(&self) -> impl Fn() -> String + Send + Sync + 'static {
        let shared = self.shared.clone();
        move || render(&shared)
    }

    fn stop_threads(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        self.threads.join_all("sip dispatch");
        if let Some(resolver) = &self.shared.resolver {
            resolver.stop();
        }
    }

    /// Stop every thread and return the summary.
    pub fn shutdown(mut self) -> DispatchSummary {
        self.stop_threads();
        summary(&self.shared)
    }
}

impl Drop for DispatchServer {
    fn drop(&mut self) {
        self.stop_threads();
    }
}

fn summary(shared: &Shared) -> DispatchSummary {
    DispatchSummary {
        schema: "ringway.sip-dispatch.summary/1",
        listen: shared.local,
        listeners: shared.stream_addresses.clone(),
        tcp: shared.connections.as_ref().map(|c| c.snapshot()),
        tls: shared
            .connections
            .as_ref()
            .and_then(|c| c.tls())
            .map(|tls| tls.snapshot()),
        config: shared.config.clone(),
        duration_s: shared.started.elapsed().as_secs_f64(),
        messages_in: shared.messages_in.load(Ordering::Relaxed),
        messages_out: shared.messages_out.load(Ordering::Relaxed),
        tx_errors: shared.tx_errors.load(Ordering::Relaxed),
        rx_truncated: shared.rx_truncated.load(Ordering::Relaxed),
        tx_oversize: shared.tx_oversize.load(Ordering::Relaxed),
        dispatch: shared.dispatcher.stats(),
        threads_panicked: shared
            .panicked
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone(),
    }
}

/// Send `tx` and count.
fn flush(shared: &Shared, io: &mut dyn BatchIo, tx: &mut TxBatch) {
    if tx.is_empty() {
        return;
    }
    match io.send_batch(tx) {
        Ok(n) => {
            shared.messages_out.fetch_add(n as u64, Ordering::Relaxed);
            let refused = tx.len().saturating_sub(n) as u64;
            shared.tx_errors.fetch_add(refused, Ordering::Relaxed);
        }
        Err(_) => {
            shared
                .tx_errors
                .fetch_add(tx.len() as u64, Ordering::Relaxed);
        }
    }
    tx.clear();
}

/// One event loop of the connection driver (`crate::sip::tcp`), its
/// framed messages handed to a dispatcher worker.
fn stream_thread(
    shared: &Shared,
    poll: mio::Poll,
    listeners: Vec<(mio::net::TcpListener, Transport)>,
    udp: std::net::UdpSocket,
) {
    let Some(connections) = shared.connections.as_deref() else {
        return;
    };
    crate::sip::tcp::run_loop(crate::sip::tcp::LoopContext {
        poll,
        listeners,
        connections,
        handler: &mut shared.dispatcher.worker(),
        udp,
        stop: &shared.stop,
    });
}

/// Send `bytes` over a connection transport's `hop` (a UDP hop goes
/// through the caller's batch); `false`: no connection (counted by the
/// connection table).
fn send_stream(shared: &Shared, hop: Hop, bytes: &[u8], now: u64) -> bool {
    match &shared.connections {
        Some(connections) => connections.send(hop, bytes, now),
        // The core names only transports we listen on.
        None => false,
    }
}

/// One worker: receive a batch, dispatch every datagram, send once (its
/// dispatcher worker takes a new proxy set at its next datagram).
fn worker_thread(shared: &Shared, name: &str, mut io: Box<dyn BatchIo>) {
    let mut rx = RxBatch::new(shared.config.batch, crate::sip::RX_FRAME);
    let mut tx = TxBatch::new(shared.config.batch * 2, TX_FRAME);
    let mut worker = shared.dispatcher.worker();
    while !shared.stop.load(Ordering::Relaxed) {
        match io.recv_batch(&mut rx, Some(POLL)) {
            Ok(0) => continue,
            Ok(n) => {
                shared.messages_in.fetch_add(n as u64, Ordering::Relaxed);
                if shared.inject_panic.as_deref() == Some(name) {
                    panic!("{name}: panic injected by RINGWAY_TEST_PANIC");
                }
            }
            Err(e) => {
                crate::warn_limited!("sip dispatch: receive error: {e}");
                std::thread::sleep(Duration::from_millis(10));
                continue;
            }
        }
        tx.clear();
        for d in rx.iter() {
            if d.meta.truncated {
                shared.rx_truncated.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            let now = monotonic_now().0;
            let mut full = Vec::new();
            let from = Hop::udp(d.meta.peer);
            worker.handle_from(now, from, d.data, &mut |hop, bytes| {
                if hop.transport != Transport::Udp {
                    send_stream(shared, hop, bytes, now);
                } else if tx.push(hop.addr, bytes).is_err() {
                    full.push((hop.addr, bytes.to_vec()));
                }
            });
            if !full.is_empty() {
                flush(shared, io.as_mut(), &mut tx);
                for (to, bytes) in full {
                    if tx.push(to, &bytes).is_err() {
                        shared.tx_oversize.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        }
        flush(shared, io.as_mut(), &mut tx);
    }
}

/// The probe thread: probes at their deadline; logs proxies going out and
/// coming back in.
fn probe_thread(shared: &Shared, mut io: Box<dyn BatchIo>) {
    let dispatcher = &shared.dispatcher;
    let mut worker = dispatcher.worker();
    // One probe per proxy: at most 64 (a reload may add some).
    let mut tx = TxBatch::new(64, TX_FRAME);
    let mut alive: Vec<(TransportAddr, bool)> = dispatcher.proxy_states();
    while !shared.stop.load(Ordering::Relaxed) {
        let now = monotonic_now().0;
        let due = dispatcher.next_deadline();
        if now < due {
            std::thread::sleep(Duration::from_nanos(due - now).min(PROBE_TICK_MAX));
            continue;
        }
        worker.on_timer_hops(now, &mut |hop, bytes| {
            if hop.transport == Transport::Udp {
                let _ = tx.push(hop.addr, bytes);
            } else {
                send_stream(shared, hop, bytes, now);
            }
        });
        flush(shared, io.as_mut(), &mut tx);
        let now_alive = dispatcher.proxy_states();
        for &(address, is) in &now_alive {
            // A proxy a reload added starts in, as at start.
            let was = alive
                .iter()
                .find(|(a, _)| *a == address)
                .is_none_or(|(_, was)| *was);
            if is != was {
                log::warn!(
                    "sip dispatch: proxy {} {}",
                    named(&address),
                    if is {
                        "back in"
                    } else {
                        "out (probes unanswered)"
                    }
                );
                let resolved = shared
                    .wanted
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .resolved
                    .contains(&address);
                if let (false, true, Some(resolver)) = (is, resolved, &shared.resolver) {
                    // Its share moves to the other targets.
                    resolver.stats().add_failover();
                }
            }
        }
        alive = now_alive;
    }
}

/// The re-resolution thread: every [`RERESOLVE_EVERY`], the proxies'
/// names again (from the cache while their TTLs last), starting from the
/// proxies as configured now (a reload changes them); a changed set of
/// targets is swapped into the running dispatcher (proxies in both keep
/// their state; removed ones stay routable for their dialogs). A failed
/// lookup keeps the set in force.
fn reresolve_thread(shared: &Shared) {
    let Some(resolver) = &shared.resolver else {
        return;
    };
    let mut next = Instant::now() + RERESOLVE_EVERY;
    while !shared.stop.load(Ordering::Relaxed) {
        let now = Instant::now();
        if now < next {
            std::thread::sleep((next - now).min(PROBE_TICK_MAX * 5));
            continue;
        }
        next = now + RERESOLVE_EVERY;
        let wanted = shared
            .wanted
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        if wanted.proxy_names.is_empty() {
            continue;
        }
        let proxies = match resolve_proxy_names(shared.config.listen, &wanted, resolver) {
            Ok(proxies) => proxies,
            Err(e) => {
                crate::warn_limited!("sip dispatch: re-resolving proxy names: {e}; targets kept");
                continue;
            }
        };
        let mut now_wanted = shared.wanted.lock().unwrap_or_else(PoisonError::into_inner);
        if now_wanted.generation != wanted.generation {
            // A reload came in meanwhile: its set stands, looked at again
            // next round.
            continue;
        }
        let before = shared.dispatcher.proxies();
        if proxies == before {
            continue;
        }
        log::warn!(
            "sip dispatch: proxies now {} (were {}): a name resolved to other targets",
            list(&proxies),
            list(&before)
        );
        now_wanted.resolved = proxies[wanted.proxies.len()..].to_vec();
        shared
            .dispatcher
            .set_proxies(&proxies, now_wanted.relay.clone());
    }
}

fn list(addresses: &[TransportAddr]) -> String {
    addresses.iter().map(named).collect::<Vec<_>>().join(", ")
}

/// Prometheus text of the dispatcher.
fn render(shared: &Shared) -> String {
    let stats = shared.dispatcher.stats();
    let mut text = PromText::default();
    crate::metrics::process_metrics(&mut text);
    driver_counters(&mut text, shared);
    core_counters(&mut text, &stats);
    proxy_metrics(&mut text, &stats);
    if let Some(resolver) = &shared.resolver {
        resolver.stats().snapshot().prometheus(&mut text);
    }
    if let Some(connections) = &shared.connections {
        crate::sip::render_transport(&mut text, "ringway_dispatch", &connections.snapshot());
        if let Some(tls) = connections.tls() {
            crate::sip::render_tls(&mut text, "ringway_dispatch", &tls.snapshot());
        }
    }
    text.finish()
}

/// The driver's own counters: datagrams in and out, thread panics, drops.
fn driver_counters(text: &mut PromText, shared: &Shared) {
    text.counter(
        "ringway_dispatch_messages_in_total",
        "Datagrams received.",
        &[],
        shared.messages_in.load(Ordering::Relaxed),
    );
    text.counter(
        "ringway_dispatch_messages_out_total",
        "Datagrams sent.",
        &[],
        shared.messages_out.load(Ordering::Relaxed),
    );
    text.counter(
        "ringway_dispatch_thread_panics_total",
        "Threads ended by a panic (each stops the dispatcher).",
        &[],
        shared
            .panicked
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len() as u64,
    );
    for (reason, count) in [
        ("rx_truncated", &shared.rx_truncated),
        ("tx_oversize", &shared.tx_oversize),
    ] {
        text.counter(
            "ringway_dispatch_datagrams_dropped_total",
            "Datagrams dropped by the driver, by reason (too long to receive or to send).",
            &[("reason", reason)],
            count.load(Ordering::Relaxed),
        );
    }
}

/// The dispatcher core's counters.
fn core_counters(text: &mut PromText, stats: &DispatchStats) {
    for (how, count) in [
        ("hash", stats.requests_dispatched),
        ("route", stats.requests_routed),
        ("request_uri", stats.requests_to_uri),
    ] {
        text.counter(
            "ringway_dispatch_requests_forwarded_total",
            "Requests forwarded, by how the next hop was chosen.",
            &[("by", how)],
            count,
        );
    }
    for (name, help, count) in [
        (
            "ringway_dispatch_responses_forwarded_total",
            "Responses forwarded to the next Via.",
            stats.responses_forwarded,
        ),
        (
            "ringway_dispatch_probes_sent_total",
            "OPTIONS probes sent.",
            stats.probes_sent,
        ),
        (
            "ringway_dispatch_no_proxy_total",
            "Requests answered 503 because no proxy was in.",
            stats.no_proxy,
        ),
        (
            "ringway_dispatch_relay_refused_total",
            "Requests whose next hop the relay policy refused (403/482; ACK, CANCEL dropped).",
            stats.relay_refused,
        ),
        (
            "ringway_dispatch_flood_blocks_total",
            "Times a source went over the flood limit.",
            stats.flood_blocks,
        ),
        (
            "ringway_dispatch_flood_untracked_total",
            "Datagrams let through because the flood table had no room for their source.",
            stats.flood_untracked,
        ),
    ] {
        text.counter(name, help, &[], count);
    }
    text.gauge(
        "ringway_dispatch_flood_sources_tracked",
        "Sources the flood limiter tracks now.",
        &[],
        stats.flood_sources_tracked as f64,
    );
    for (reason, count) in &stats.drops {
        text.counter(
            "ringway_dispatch_drops_total",
            "Datagrams dropped, by reason.",
            &[("reason", reason)],
            *count,
        );
    }
}

/// Per proxy behind the dispatcher: in or out, requests sent, times out.
fn proxy_metrics(text: &mut PromText, stats: &DispatchStats) {
    for member in &stats.proxies {
        let proxy = [("proxy", member.address.as_str())];
        text.gauge(
            "ringway_dispatch_proxy_up",
            "1 while the proxy answers its probes.",
            &proxy,
            if member.alive { 1.0 } else { 0.0 },
        );
        text.counter(
            "ringway_dispatch_proxy_requests_total",
            "New requests sent to the proxy.",
            &proxy,
            member.requests,
        );
        text.counter(
            "ringway_dispatch_proxy_downs_total",
            "Times the proxy went out.",
            &proxy,
            member.downs,
        );
    }
}
