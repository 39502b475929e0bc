//! The multi-threaded SIP proxy/registrar server.
//!
//! N worker threads receive batches of datagrams (one shared socket whose
//! fd every worker dups, or one SO_REUSEPORT socket per worker), pass each
//! datagram to the shared sans-IO [`ringway_sip::Proxy`] and send what it
//! produced with one `send_batch` per received batch
//! ([`SipWorker::drive_batch`]). A timer thread drives the core's
//! retransmission/timeout timers ([`SipTimer`]). Per message type the
//! workers measure K_rcv, T_sip and (sampled) K_snd in HDR histograms.
//!
//! Each thread keeps its metrics to itself; [`SipServer::snapshot`] asks
//! every thread to publish a copy (a thread does so between batches, so
//! the caller never waits on a lock held across a batch) and merges them.
//!
//! ```no_run
//! use ringway_server::sip::{SipServer, SipServerConfig};
//! let server = SipServer::start(SipServerConfig {
//!     listen: "127.0.0.1:0".parse().unwrap(),
//!     route_to: Some("127.0.0.1:5080".parse().unwrap()),
//!     ..Default::default()
//! })?;
//! println!("listening on {}", server.local_addr());
//! let summary = server.shutdown();
//! println!("{} messages in", summary.messages.in_);
//! # Ok::<(), ringway_server::ServerError>(())
//! ```

mod backend;
mod config;
mod control;
pub mod keepalive;
pub mod location;
mod names;
mod prometheus;
pub(crate) use prometheus::{render_tls, render_transport};
pub mod service;
mod snapshot;
mod sockets;
mod stats;
mod summary;
pub mod tcp;
mod threads;
mod timer;
pub mod tls;
mod worker;
pub mod ws;

pub use backend::IoInUse;
pub(crate) use config::check_flood;
pub use config::{
    RxModel, SipServerConfig, DEFAULT_FLOW_TIMER_S, DEFAULT_OVERLOAD_QUEUE_DELAY_MS,
    MAX_RX_COALESCE, MIN_RX_COALESCE,
};
pub use control::{
    AorBindings, BindingError, ContactInfo, ReloadReport, SipControl, Status, MAX_LISTED_AORS,
    RELOADABLE,
};
pub use names::{PendingLimits, ProxyNames};
pub use snapshot::{Bounds, DnsSnapshot, LocationSnapshot, Snapshot};
pub use stats::{Latency, TypeStats, WorkerMetrics};
pub use summary::{
    Actions, ConfigView, Cpu, Drops, Messages, Summary, ThreadCpu, TypeSummary, SCHEMA,
};
pub use timer::{SipTimer, TIMER_TICK_MAX};
pub use worker::{SipWorker, TX_FRAME};

use crate::host::{self, CpuTime};
use crate::ServerError;
use location::{Location, LocationCounters, LocationLatency, LocationQueue, RedisStore};
use ringway_io::counters::UdpSnmp;
use ringway_io::open_backend;
use ringway_sip::auth::NonceKey;
use ringway_sip::MemoryStore;
use ringway_sip::{Proxy, ProxyConfig, TransportAddr};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::Receiver;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;
pub use tcp::{Connections, TcpConfig, TcpSnapshot};
pub use tls::{SniCertificate, TlsConfig, TlsContext, TlsSnapshot};

use snapshot::{snapshot, MetricsSlot};
use sockets::open_listeners;
pub(crate) use sockets::{open_stream_listeners, StreamListeners, StreamSettings};
use threads::{keepalive_thread, store_thread, tcp_thread, timer_thread, worker_thread};

/// Bytes per receive frame: larger datagrams are cut and counted as dropped.
pub const RX_FRAME: usize = 16 * 1024;

/// Everything the threads share.
struct Shared {
    config: SipServerConfig,
    /// Runtime control: the configuration in force, reloads, drain.
    control: control::ControlState,
    local: SocketAddr,
    proxy: Proxy,
    stop: AtomicBool,
    /// One per worker, one for the timer thread, then one per store thread.
    slots: Vec<MetricsSlot>,
    /// The shared location store's driver, when there is one.
    location: Option<LocationShared>,
    /// TCP connections, when there is a TCP listener.
    connections: Option<Arc<Connections>>,
    /// The registrar's flows, their keepalives and removal.
    monitor: Option<Arc<keepalive::FlowMonitor>>,
    /// The connection transports' bound listening addresses.
    stream_addresses: Vec<TransportAddr>,
    generation: AtomicU64,
    threads_cpu: Mutex<Vec<ThreadCpu>>,
    placement: Mutex<Vec<String>>,
    udp_start: Option<UdpSnmp>,
    cpu_start: CpuTime,
    started: Instant,
    rcvbuf_granted: Vec<usize>,
    /// The workers' backend as opened (after a fallback, mmsg).
    io_in_use: IoInUse,
    /// Worker, timer and store threads running now.
    threads_alive: AtomicUsize,
    /// Threads that panicked (their names). Any panic stops every thread:
    /// the process does not go on with a socket nobody reads.
    panicked: Mutex<Vec<String>>,
    /// Test hook (`RINGWAY_TEST_PANIC=<thread name>`): that thread panics
    /// on its first datagram (worker) or loop (timer, store thread).
    inject_panic: Option<String>,
    /// DNS for next hops given by name (`None`: names are not resolved).
    names: Option<Arc<names::ProxyNames>>,
    /// The overload controllers' shared estimate, for workers that read one
    /// socket (`--rx-model shared`: one queue, the same senders); `None`:
    /// every worker its own (its own socket and senders).
    overload_pool: Option<Arc<ringway_sip::overload_control::OcPool>>,
}

impl Shared {
    /// A thread ended by a panic: remember it and stop every thread.
    fn thread_panicked(&self, name: &str) {
        lock(&self.panicked).push(name.to_string());
        self.stop.store(true, Ordering::Relaxed);
    }

    /// Panic here if the test hook names this thread.
    fn injected_panic(&self, name: &str) {
        if self.inject_panic.as_deref() == Some(name) {
            panic!("{name}: panic injected by RINGWAY_TEST_PANIC");
        }
    }
}

/// What the threads share about a shared location store.
struct LocationShared {
    counters: Arc<LocationCounters>,
    /// One per store thread.
    latency: Vec<Arc<Mutex<LocationLatency>>>,
}

/// The store threads' ends: their channels and stores (each with its own
/// connection, watched by the flow monitor).
struct StoreEnds {
    receivers: Vec<Receiver<ringway_sip::proxy::DeferredRequest>>,
    stores: Vec<Arc<dyn ringway_sip::LocationStore>>,
}

/// A running SIP server.
pub struct SipServer {
    shared: Arc<Shared>,
    threads: host::ThreadGroup,
}

impl SipServer {
    /// Open the sockets, start the worker and timer threads, and return.
    pub fn start(config: SipServerConfig) -> Result<SipServer, ServerError> {
        config.validate()?;
        let credentials = config.load_credentials()?;
        let opened = backend::open(&config)?;
        let local = opened.workers[0].local_addr()?;
        let streams = open_listeners(&config, local)?;
        let key = match config.load_nonce_key()? {
            Some(shared) => shared,
            None => random_key()?,
        };
        let proxy_config = config.proxy_config(
            local,
            streams.addresses.clone(),
            key,
            u64::from_le_bytes(host::random_bytes()?),
        );
        let keepalive_key = host::random_bytes()?;
        let (mut proxy, location, store_ends, monitor) =
            build_proxy(&config, proxy_config, local, keepalive_key)?;
        // Behind a swap a reload replaces (SIGHUP, `ringway ctl reload`).
        let swappable = credentials.map(|credentials| {
            let swap = Arc::new(control::SwappableCredentials::default());
            swap.set(Arc::new(credentials));
            swap
        });
        if let Some(swap) = &swappable {
            proxy.set_credentials(swap.clone());
        }
        // Hashes and MACs we put on the wire: unpredictable (S19).
        proxy.set_secret(host::random_bytes()?);
        let names = start_names(&config, local)?;
        if let Some(names) = &names {
            proxy.set_name_resolver(names.clone());
        }
        let store_threads = store_ends.as_ref().map_or(0, |ends| ends.stores.len());
        let StreamListeners {
            addresses: stream_addresses,
            listeners: tcp_listeners,
            polls: tcp_polls,
            connections,
        } = streams;
        if let Some(connections) = &connections {
            // RFC 5626: a request for a flow whose connection is gone
            // gets 430 from the core.
            proxy.set_flow_state(connections.clone());
        }
        if let (Some(connections), Some(monitor)) = (&connections, &monitor) {
            let monitor = monitor.clone();
            connections.set_on_close(Box::new(move |flow, now| {
                monitor.connection_closed(flow, now)
            }));
        }
        let shared = Arc::new(Shared {
            connections,
            monitor,
            stream_addresses,
            slots: (0..config.workers + 1 + store_threads)
                .map(|_| MetricsSlot::default())
                .collect(),
            location,
            generation: AtomicU64::new(0),
            local,
            proxy,
            stop: AtomicBool::new(false),
            threads_cpu: Mutex::new(Vec::new()),
            placement: Mutex::new(Vec::new()),
            udp_start: host::udp_totals(),
            cpu_start: host::process_cpu_time().unwrap_or_default(),
            started: Instant::now(),
            rcvbuf_granted: opened.rcvbuf_granted.clone(),
            io_in_use: opened.in_use.clone(),
            threads_alive: AtomicUsize::new(0),
            panicked: Mutex::new(Vec::new()),
            inject_panic: std::env::var("RINGWAY_TEST_PANIC").ok(),
            names,
            overload_pool: (config.rx_model == RxModel::Shared).then(|| {
                Arc::new(ringway_sip::overload_control::OcPool::new(
                    ringway_sip::overload_control::OcControllerConfig::default(),
                ))
            }),
            control: control::ControlState::new(config.clone(), swappable),
            config,
        });
        let mut server = SipServer {
            shared,
            threads: host::ThreadGroup::default(),
        };
        server.spawn_threads(opened, store_ends, (tcp_listeners, tcp_polls))?;
        Ok(server)
    }

    /// Start the worker threads on their backends, and the timer, TCP
    /// event loop and store threads on the kernel socket.
    fn spawn_threads(
        &mut self,
        opened: backend::OpenedIo,
        store_ends: Option<StoreEnds>,
        (tcp_listeners, tcp_polls): (
            Vec<(mio::net::TcpListener, ringway_sip::Transport)>,
            Vec<mio::Poll>,
        ),
    ) -> Result<(), ServerError> {
        let backend = opened.kernel_backend();
        let backend::OpenedIo {
            workers: ios,
            kernel_socket: timer_socket,
            ..
        } = opened;
        let open = |socket| {
            open_backend(backend, socket).map_err(|source| ServerError::Backend {
                backend: backend.to_string(),
                source,
            })
        };
        let mut store_ios = Vec::new();
        for _ in 0..store_ends.as_ref().map_or(0, |ends| ends.stores.len()) {
            store_ios.push(open(timer_socket.try_clone()?)?);
        }
        let mut tcp_listeners = Some(tcp_listeners);
        for (i, poll) in tcp_polls.into_iter().enumerate() {
            let shared = self.shared.clone();
            let udp = timer_socket.try_clone()?;
            let listeners = if i == 0 {
                tcp_listeners.take().unwrap_or_default()
            } else {
                Vec::new()
            };
            self.spawn(format!("sip-tcp{i}"), move || {
                tcp_thread(&shared, i, poll, listeners, udp)
            })?;
        }
        if self
            .shared
            .monitor
            .as_ref()
            .is_some_and(|m| m.needs_thread())
        {
            let shared = self.shared.clone();
            let udp = timer_socket.try_clone()?;
            self.spawn("sip-keepalive".into(), move || {
                keepalive_thread(&shared, udp)
            })?;
        }
        let timer_io = open(timer_socket)?;
        for (index, io) in ios.into_iter().enumerate() {
            let shared = self.shared.clone();
            self.spawn(format!("sip-w{index}"), move || {
                worker_thread(&shared, index, io)
            })?;
        }
        let shared = self.shared.clone();
        self.spawn("sip-timer".into(), move || timer_thread(&shared, timer_io))?;
        if let Some(ends) = store_ends {
            let threads = ends.receivers.into_iter().zip(ends.stores).zip(store_ios);
            for (index, ((requests, store), io)) in threads.enumerate() {
                let shared = self.shared.clone();
                self.spawn(format!("sip-store{index}"), move || {
                    store_thread(&shared, index, store, requests, io)
                })?;
            }
        }
        Ok(())
    }

    fn spawn(
        &mut self,
        name: String,
        body: impl FnOnce() + Send + 'static,
    ) -> Result<(), ServerError> {
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

    /// The bound listening addresses of connection transports (TCP).
    pub fn stream_addresses(&self) -> &[TransportAddr] {
        &self.shared.stream_addresses
    }

    /// The TCP transport's connection table (`None`: no TCP listener).
    pub fn connections(&self) -> Option<&Connections> {
        self.shared.connections.as_deref()
    }

    /// Names of the threads that panicked (empty while all is well). A
    /// panic in any worker, timer or store thread stops them all; the
    /// front end should then exit with an error (a supervisor restarts it).
    pub fn panicked_threads(&self) -> Vec<String> {
        lock(&self.shared.panicked).clone()
    }

    /// A handle for runtime control (status, bindings, drain, reload).
    pub fn control(&self) -> SipControl {
        SipControl {
            shared: self.shared.clone(),
        }
    }

    /// The configuration it started with (reloads change what
    /// [`SipControl`] says is in force, never this).
    pub fn config(&self) -> &SipServerConfig {
        &self.shared.config
    }

    /// The workers' backend as opened: xdp, or mmsg after a fallback
    /// (with the reason), or the configured socket backend.
    pub fn io_in_use(&self) -> &IoInUse {
        &self.shared.io_in_use
    }

    /// Receive buffer granted per socket (bytes).
    pub fn rcvbuf_granted(&self) -> &[usize] {
        &self.shared.rcvbuf_granted
    }

    /// The proxy core (its statistics, its location store).
    pub fn proxy(&self) -> &Proxy {
        &self.shared.proxy
    }

    /// Thread placement results so far, one line per knob and thread.
    pub fn placement(&self) -> Vec<String> {
        lock(&self.shared.placement).clone()
    }

    /// Merged measurements now (waits up to 250 ms for the threads to publish).
    pub fn snapshot(&self) -> Snapshot {
        snapshot(&self.shared)
    }

    /// A function rendering the current Prometheus text, for a metrics
    /// server thread (see [`crate::metrics::http::serve`]).
    pub fn prometheus(&self) -> impl Fn() -> String + Send + Sync + 'static {
        let shared = self.shared.clone();
        move || prometheus::render(&snapshot(&shared))
    }

    fn stop_threads(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        self.threads.join_all("sip server");
        if let Some(names) = &self.shared.names {
            names.resolver().stop();
        }
    }

    /// Stop every thread, wait for them, and return the summary.
    pub fn shutdown(mut self) -> Summary {
        self.stop_threads();
        let snap = snapshot(&self.shared);
        let s = &self.shared;
        let mut summary = summary::build(
            &s.config,
            s.local,
            (&s.rcvbuf_granted, &s.io_in_use),
            &snap,
            lock(&s.threads_cpu).clone(),
            lock(&s.placement).clone(),
            lock(&s.panicked).clone(),
        );
        summary.overload_control_trace = s
            .overload_pool
            .as_ref()
            .map_or_else(Vec::new, |pool| pool.trace());
        summary
    }
}

impl Drop for SipServer {
    fn drop(&mut self) {
        self.stop_threads();
    }
}

/// The proxy core over its location store: this process's memory, or a
/// shared store reached through a queue by store threads (then also what
/// the threads share about it and the store threads' ends).
#[allow(clippy::type_complexity)]
fn build_proxy(
    config: &SipServerConfig,
    proxy_config: ProxyConfig,
    local: SocketAddr,
    keepalive_key: [u8; 16],
) -> Result<
    (
        Proxy,
        Option<LocationShared>,
        Option<StoreEnds>,
        Option<Arc<keepalive::FlowMonitor>>,
    ),
    ServerError,
> {
    Ok(match &config.location {
        Location::Memory => {
            let store: Arc<dyn ringway_sip::LocationStore> = Arc::new(MemoryStore::with_limits(
                config.max_bindings,
                config.max_binding_bytes,
            ));
            let monitor = Arc::new(keepalive::FlowMonitor::new(
                store.clone(),
                keepalive_config(config),
                local,
                keepalive_key,
            ));
            let watched = keepalive::WatchedStore::new(store, monitor.clone());
            (
                Proxy::with_store(proxy_config, Arc::new(watched)),
                None,
                None,
                Some(monitor),
            )
        }
        Location::Redis(url) => {
            let counters = Arc::new(LocationCounters::default());
            let timeout = config.location_timeout;
            // One node for the whole process: a binding's connection is
            // used (and removed when it closes) by the proxy that holds it.
            let node = u64::from_le_bytes(host::random_bytes()?);
            let open = || {
                RedisStore::new(url, timeout, counters.clone())
                    .map(|store| Arc::new(store.with_node(node)))
                    .map_err(ServerError::Config)
            };
            let mut stores = Vec::new();
            for _ in 0..config.location_threads {
                stores.push(open()?);
            }
            // The monitor's own connection (the keepalive thread's): it
            // removes the bindings of dead flows and looks up contacts to
            // ping; the store threads report what REGISTERs stored.
            let monitor = Arc::new(
                keepalive::FlowMonitor::new(
                    open()?,
                    keepalive_config(config),
                    local,
                    keepalive_key,
                )
                .deferring_removals(),
            );
            // Every store thread's connection is made now (which AORs
            // a thread serves depends on the random channel seed, so
            // none may be left to connect on its first query).
            if let Some(e) = stores.iter().find_map(|store| store.ping().err()) {
                log::warn!(
                    "sip server: location store {} unreachable now ({e}); \
                     REGISTERs get 500 and calls 480 until it answers",
                    config.location
                );
            }
            let (queue, receivers) = LocationQueue::new(
                config.location_threads,
                config.location_queue,
                u64::from_le_bytes(host::random_bytes()?),
            );
            let shared = LocationShared {
                counters,
                latency: (0..config.location_threads)
                    .map(|_| Arc::new(Mutex::new(LocationLatency::default())))
                    .collect(),
            };
            let proxy = Proxy::with_store_queue(proxy_config, Arc::new(queue));
            let stores = stores
                .into_iter()
                .map(|store| {
                    Arc::new(keepalive::WatchedStore::new(store, monitor.clone()))
                        as Arc<dyn ringway_sip::LocationStore>
                })
                .collect();
            (
                proxy,
                Some(shared),
                Some(StoreEnds { receivers, stores }),
                Some(monitor),
            )
        }
    })
}

/// The flow monitor's settings from the server's.
fn keepalive_config(config: &SipServerConfig) -> keepalive::KeepaliveConfig {
    keepalive::KeepaliveConfig {
        interval: config.keepalive_interval.map(config::duration_ns),
        failures: config.keepalive_failures,
        rate: config.keepalive_rate,
        capacity: config.max_bindings,
    }
}

/// The proxy's DNS, when a next hop is a name (`route_to_name`) or a
/// nameserver is configured (`dns_server`: Request-URI and Route names
/// are resolved too, where the relay policy allows them).
fn start_names(
    config: &SipServerConfig,
    local: SocketAddr,
) -> Result<Option<Arc<names::ProxyNames>>, ServerError> {
    if config.route_to_name.is_none() && config.dns_server.is_none() {
        return Ok(None);
    }
    let resolver = crate::dns::Resolver::start(crate::dns::DnsConfig {
        server: config.dns_server,
        ..crate::dns::DnsConfig::default()
    })
    .map_err(|e| ServerError::Config(format!("dns: {e}")))?;
    if let Some(name) = &config.route_to_name {
        log::info!(
            "sip server: route_to {name} resolved per request (cache with TTLs), nameserver {}",
            resolver.nameserver()
        );
    }
    Ok(Some(Arc::new(names::ProxyNames::new(
        resolver,
        local,
        config.dns_pending,
    ))))
}

/// A random nonce key (the kernel's random source).
pub(super) fn random_key() -> Result<NonceKey, ServerError> {
    Ok(NonceKey(host::random_bytes()?))
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}
