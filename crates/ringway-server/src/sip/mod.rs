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
mod control;
pub mod location;
mod prometheus;
pub mod service;
mod stats;
mod summary;
pub mod tcp;
mod timer;
mod worker;

pub use backend::IoInUse;
pub use control::{
    AorBindings, BindingError, ContactInfo, ReloadReport, SipControl, Status, MAX_LISTED_AORS,
    RELOADABLE,
};
pub use stats::{Latency, TypeStats, WorkerMetrics};
pub use summary::{
    Actions, ConfigView, Cpu, Drops, Messages, Summary, ThreadCpu, TypeSummary, SCHEMA,
};
pub use timer::{SipTimer, TIMER_TICK_MAX};
pub use worker::{SipWorker, TX_FRAME};

use crate::host::{self, CpuTime};
use crate::ServerError;
use location::{
    Location, LocationCounters, LocationCounts, LocationLatency, LocationQueue, RedisStore,
    StoreThread,
};
use ringway_io::counters::UdpSnmp;
use ringway_io::thread::Placement;
use ringway_io::{monotonic_now, open_backend, BatchIo, Io, RxBatch};
use ringway_sip::auth::{Algorithm, HtdigestCredentials, NonceKey};
use ringway_sip::MemoryStore;
use ringway_sip::{
    AuthConfig, FloodConfig, Mode, Proxy, ProxyConfig, ProxyStats, RegistrarPolicy, RelayNets,
    Transport, TransportAddr,
};
use serde::{Deserialize, Serialize};
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::Receiver;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};
pub use tcp::{Connections, TcpConfig, TcpSnapshot};

/// Bytes per receive frame: larger datagrams are cut and counted as dropped.
pub const RX_FRAME: usize = 16 * 1024;
/// Receive wait before a worker re-checks the stop flag and publication requests.
const POLL: Duration = Duration::from_millis(50);
/// How long [`SipServer::snapshot`] waits for the threads to publish.
const SNAPSHOT_WAIT: Duration = Duration::from_millis(250);

/// How the workers receive.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
#[serde(rename_all = "lowercase")]
pub enum RxModel {
    /// One socket; every worker receives on a dup of its fd (like Kamailio children).
    Shared,
    /// One SO_REUSEPORT socket per worker; the kernel spreads flows over them.
    Reuseport,
}

/// Everything a SIP server needs to start (plain data; front ends build it).
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SipServerConfig {
    /// UDP address to listen on (port 0: any). Must be a concrete address:
    /// it goes into Via and Record-Route.
    pub listen: SocketAddr,
    /// Stateless or transaction-stateful proxying.
    pub mode: Mode,
    /// Worker threads (1..=256).
    pub workers: usize,
    /// Send every request not addressed elsewhere to this next hop, over
    /// its transport (`tcp:ADDR` needs a TCP listener; a bare address is
    /// UDP).
    pub route_to: Option<TransportAddr>,
    /// Listening addresses of connection transports (`tcp:ADDR`), beyond
    /// the UDP `listen`. Port 0: the UDP port.
    pub listeners: Vec<TransportAddr>,
    /// Bounds of the TCP transport.
    pub tcp: TcpConfig,
    /// Destinations any request may be relayed to, authenticated or not
    /// (`none`: only `route_to`, bindings, signed dialogs and
    /// authenticated users' targets; `any`; or networks). Loopback,
    /// link-local and our own IP only when a network names them.
    pub relay: RelayNets,
    /// Act as registrar for the served domains.
    pub registrar: bool,
    /// Insert Record-Route (otherwise in-dialog requests bypass the proxy).
    pub record_route: bool,
    /// I/O backend of the workers: a socket backend (`Socket`, `Mmsg` or
    /// `Uring`), or `Xdp` on an interface (one worker; the timer and store
    /// threads send through the companion kernel socket with mmsg; falls
    /// back to mmsg, with the reason, where the kernel cannot run it).
    pub io: Io,
    /// Receive model.
    pub rx_model: RxModel,
    /// Requested SO_RCVBUF per socket (bytes).
    pub rcvbuf: Option<usize>,
    /// Placement of every worker thread; with a CPU list, worker `i` is
    /// pinned to the `i`-th CPU of it (round robin).
    pub placement: Placement,
    /// Request a kernel TX timestamp for every Nth sent datagram (0: never).
    pub tx_stamp_every: u64,
    /// Transaction table bound; beyond it new requests get 503 Retry-After.
    pub max_transactions: usize,
    /// Bytes the transaction table may hold (kept requests and responses
    /// included); beyond it new requests are refused as beyond
    /// `max_transactions`.
    pub max_transaction_bytes: usize,
    /// Registrar (in-memory store): most bindings held.
    pub max_bindings: usize,
    /// Registrar (in-memory store): most bytes of bindings held (contacts,
    /// Call-IDs, Path values); beyond it REGISTERs that add get 503.
    pub max_binding_bytes: usize,
    /// Registrar: most bytes of Path values in one REGISTER (more: 400).
    pub max_path_bytes: usize,
    /// Domains served by this proxy/registrar.
    pub domains: Vec<String>,
    /// Datagrams per receive batch (1..=1024).
    pub batch: usize,
    /// Registrar: shortest registration accepted (s); shorter ones get 423.
    pub min_expires: u32,
    /// Registrar: longest registration granted (s).
    pub max_expires: u32,
    /// Registrar: lifetime of a registration that asks for none (s).
    pub default_expires: u32,
    /// Registrar: most contacts bound to one AOR.
    pub max_contacts: usize,
    /// Digest authentication: REGISTERs to the registrar get 401, other
    /// requests from the served domains 407 (needs `auth_file`).
    pub auth: bool,
    /// Credentials: htdigest-style `user:realm:HA1` lines (32 hex digits:
    /// MD5, 64: SHA-256).
    pub auth_file: Option<PathBuf>,
    /// Realm of every challenge (default: the AOR's domain).
    pub auth_realm: Option<String>,
    /// Algorithms offered, most preferred first.
    pub auth_algorithms: Vec<Algorithm>,
    /// How long a nonce may be used (whole seconds, at least one).
    pub nonce_lifetime: Duration,
    /// Requests per window allowed from one source address (`None`: no
    /// flood limit).
    pub flood_limit: Option<u32>,
    /// Flood limit window (at least 1 ms).
    pub flood_window: Duration,
    /// Sources the flood limiter tracks at most.
    pub flood_table_size: usize,
    /// Sources never flood-limited.
    pub flood_exempt: Vec<IpAddr>,
    /// IPv6 sources are flood-limited per prefix of this length (bits).
    pub flood_ipv6_prefix: u8,
    /// Location store: this process's memory, or Redis shared by several
    /// proxies (reached by store threads, never by the workers; see
    /// [`crate::sip::location`]).
    pub location: Location,
    /// Longest wait for the shared store, per command and in its queue
    /// (1 ms..=60 s).
    pub location_timeout: Duration,
    /// Store threads (each with one connection, one query at a time).
    pub location_threads: usize,
    /// Requests waiting for the shared store at most (beyond: refused at
    /// once, `500` + `Retry-After` / `480`).
    pub location_queue: usize,
    /// Overload shedding (RFC 6357/7339 in spirit): a new INVITE that
    /// waited longer than this (at most 10 s) between its kernel receive
    /// stamp and its processing is answered `503` + `Retry-After` before
    /// any state (`None`: off). Needs kernel RX stamps (always requested).
    pub overload_queue_delay: Option<Duration>,
    /// Lab emulation, off by default: CPU work added to every message the
    /// core handles (T_sip includes it), to bring T_sip into the range of
    /// the papers' OpenSIPS. Never for service.
    pub emulated_service: Option<service::ServiceTime>,
}

impl Default for SipServerConfig {
    fn default() -> Self {
        SipServerConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], 5060)),
            mode: Mode::Stateless,
            workers: 1,
            route_to: None,
            listeners: Vec::new(),
            tcp: TcpConfig::default(),
            relay: RelayNets::None,
            registrar: false,
            record_route: true,
            io: Io::Mmsg,
            rx_model: RxModel::Reuseport,
            rcvbuf: None,
            placement: Placement::default(),
            tx_stamp_every: 64,
            max_transactions: 100_000,
            max_transaction_bytes: ringway_sip::DEFAULT_MAX_TRANSACTION_BYTES,
            max_bindings: 100_000,
            max_binding_bytes: 64 << 20,
            max_path_bytes: ringway_sip::DEFAULT_MAX_PATH_BYTES,
            domains: Vec::new(),
            batch: 32,
            min_expires: RegistrarPolicy::default().min_expires,
            max_expires: RegistrarPolicy::default().max_expires,
            default_expires: RegistrarPolicy::default().default_expires,
            max_contacts: RegistrarPolicy::default().max_contacts,
            auth: false,
            auth_file: None,
            auth_realm: None,
            auth_algorithms: AuthConfig::default().algorithms,
            nonce_lifetime: Duration::from_secs(300),
            flood_limit: None,
            flood_window: Duration::from_millis(2000),
            flood_table_size: FloodConfig::default().table_size,
            flood_exempt: Vec::new(),
            flood_ipv6_prefix: 64,
            location: Location::Memory,
            location_timeout: Duration::from_millis(200),
            location_threads: 2,
            location_queue: 1024,
            overload_queue_delay: None,
            emulated_service: None,
        }
    }
}

/// Default of `--overload-queue-delay-ms` (0: off), i.e. of
/// [`SipServerConfig::overload_queue_delay`].
pub const DEFAULT_OVERLOAD_QUEUE_DELAY_MS: u64 = 0;

impl SipServerConfig {
    /// Reject inconsistent settings, naming the field.
    pub fn validate(&self) -> Result<(), ServerError> {
        self.validate_threads_and_bounds()?;
        self.validate_registrar()?;
        self.validate_auth_and_flood()?;
        self.validate_location_and_overload()
    }

    /// Threads, batches, sockets and the state bounds.
    fn validate_threads_and_bounds(&self) -> Result<(), ServerError> {
        let fail = |m: String| Err(ServerError::Config(m));
        if !(1..=256).contains(&self.workers) {
            return fail(format!("workers must be 1..=256, not {}", self.workers));
        }
        if !(1..=1024).contains(&self.batch) {
            return fail(format!("batch must be 1..=1024, not {}", self.batch));
        }
        if self.max_transactions == 0 {
            return fail("max_transactions must be above 0".into());
        }
        if self.max_transaction_bytes < 1 << 20 {
            return fail(format!(
                "max_transaction_bytes must be at least 1048576 (1 MiB), not {}",
                self.max_transaction_bytes
            ));
        }
        if self.max_bindings == 0 || self.max_binding_bytes < 1 << 16 {
            return fail(format!(
                "max_bindings must be above 0 and max_binding_bytes at least 65536, not {} and {}",
                self.max_bindings, self.max_binding_bytes
            ));
        }
        if self.listen.ip().is_unspecified() {
            return fail(format!(
                "listen {}: use a concrete address (it goes into Via and Record-Route)",
                self.listen
            ));
        }
        for listener in &self.listeners {
            if listener.transport != Transport::Tcp {
                return fail(format!(
                    "listen {listener}: only udp and tcp are built so far (tls and ws: issue 21)"
                ));
            }
            if listener.addr.ip().is_unspecified() {
                return fail(format!(
                    "listen {listener}: use a concrete address (it goes into Via and Record-Route)"
                ));
            }
        }
        if let Some(to) = self.route_to.filter(|to| to.transport != Transport::Udp) {
            if !self.listeners.iter().any(|l| l.transport == to.transport) {
                return fail(format!(
                    "route_to {to} needs a {} listen address",
                    to.transport
                ));
            }
        }
        self.tcp.validate().map_err(ServerError::Config)?;
        if let Io::Xdp(interface) = &self.io {
            if self.workers != 1 {
                return fail(format!(
                    "the xdp backend runs one worker (one AF_XDP socket on {} queue 0), not {}",
                    interface.iface, self.workers
                ));
            }
            if self.listen.ip().is_loopback() {
                return fail(format!(
                    "listen {}: the xdp backend needs an address of interface {}",
                    self.listen, interface.iface
                ));
            }
            if !(16..=65536).contains(&interface.frames) || !interface.frames.is_power_of_two() {
                return fail(format!(
                    "xdp frames must be a power of two in 16..=65536, not {}",
                    interface.frames
                ));
            }
        }
        if let Some(n) = self.placement.nice {
            if !(-20..=19).contains(&n) {
                return fail(format!("nice must be -20..=19, not {n}"));
            }
        }
        if self.placement.cpus.as_ref().is_some_and(|c| c.is_empty()) {
            return fail("the worker CPU list is empty".into());
        }
        Ok(())
    }

    /// The registrar's expiry and contact rules.
    fn validate_registrar(&self) -> Result<(), ServerError> {
        let fail = |m: String| Err(ServerError::Config(m));
        if self.min_expires == 0 || self.min_expires > self.max_expires {
            return fail(format!(
                "min_expires must be 1..=max_expires ({}), not {}",
                self.max_expires, self.min_expires
            ));
        }
        if !(self.min_expires..=self.max_expires).contains(&self.default_expires) {
            return fail(format!(
                "default_expires must be min_expires..=max_expires ({}..={}), not {}",
                self.min_expires, self.max_expires, self.default_expires
            ));
        }
        if self.max_contacts == 0 {
            return fail("max_contacts must be above 0".into());
        }
        Ok(())
    }

    /// Digest authentication and the flood limiter.
    fn validate_auth_and_flood(&self) -> Result<(), ServerError> {
        let fail = |m: String| Err(ServerError::Config(m));
        if self.auth && self.auth_file.is_none() {
            return fail("auth needs auth_file (the user:realm:HA1 credentials)".into());
        }
        if self.auth_algorithms.is_empty() {
            return fail("auth_algorithms is empty".into());
        }
        if self.nonce_lifetime.as_secs() == 0 {
            return fail("nonce_lifetime must be at least 1 s".into());
        }
        if self.flood_limit == Some(0) {
            return fail("flood_limit must be above 0 (leave it out for no limit)".into());
        }
        if !(16..=128).contains(&self.flood_ipv6_prefix) {
            return fail(format!(
                "flood_ipv6_prefix must be 16..=128, not {}",
                self.flood_ipv6_prefix
            ));
        }
        if self.flood_window < Duration::from_millis(1) || self.flood_table_size == 0 {
            return fail(
                "flood_window (at least 1 ms) and flood_table_size must be above 0".into(),
            );
        }
        Ok(())
    }

    /// The shared location store and overload shedding.
    fn validate_location_and_overload(&self) -> Result<(), ServerError> {
        let fail = |m: String| Err(ServerError::Config(m));
        if !(Duration::from_millis(1)..=Duration::from_secs(60)).contains(&self.location_timeout) {
            return fail(format!(
                "location_timeout must be 1 ms..=60 s, not {:?}",
                self.location_timeout
            ));
        }
        if !(1..=64).contains(&self.location_threads) {
            return fail(format!(
                "location_threads must be 1..=64, not {}",
                self.location_threads
            ));
        }
        if self.location_queue == 0 {
            return fail("location_queue must be above 0".into());
        }
        if let Some(delay) = self.overload_queue_delay {
            if delay.is_zero() || delay > Duration::from_secs(10) {
                return fail(format!(
                    "overload_queue_delay must be above 0 and at most 10 s (None: off), not {delay:?}"
                ));
            }
        }
        if let Some(service) = self.emulated_service {
            service
                .validate()
                .map_err(|e| ServerError::Config(format!("emulated_service: {e}")))?;
        }
        Ok(())
    }

    /// The placement of worker `index`.
    fn worker_placement(&self, index: usize) -> Placement {
        let mut placement = self.placement.clone();
        placement.cpus = placement.cpus.map(|list| vec![list[index % list.len()]]);
        placement
    }

    fn proxy_config(
        &self,
        local: SocketAddr,
        listeners: Vec<TransportAddr>,
        key: NonceKey,
        seed: u64,
    ) -> ProxyConfig {
        ProxyConfig {
            mode: self.mode,
            local,
            route_to: self.route_to.map(|to| to.addr),
            route_to_transport: self.route_to.map_or(Transport::Udp, |to| to.transport),
            listeners,
            registrar: self.registrar,
            record_route: self.record_route,
            max_transactions: self.max_transactions,
            max_transaction_bytes: self.max_transaction_bytes,
            domains: self.domains.clone(),
            registrar_policy: RegistrarPolicy {
                min_expires: self.min_expires,
                max_expires: self.max_expires,
                default_expires: self.default_expires,
                max_contacts: self.max_contacts,
                max_path_bytes: self.max_path_bytes,
            },
            auth: self.auth.then(|| AuthConfig {
                realm: self.auth_realm.clone(),
                algorithms: self.auth_algorithms.clone(),
                nonce_lifetime: duration_ns(self.nonce_lifetime),
                key,
                ..AuthConfig::default()
            }),
            flood: self.flood_limit.map(|limit| FloodConfig {
                limit,
                window: duration_ns(self.flood_window),
                table_size: self.flood_table_size,
                exempt: self.flood_exempt.clone(),
                ipv6_prefix: self.flood_ipv6_prefix,
                seed,
            }),
            relay: self.relay.clone(),
        }
    }

    /// The credentials of `auth_file` (when `auth` is on).
    fn load_credentials(&self) -> Result<Option<HtdigestCredentials>, ServerError> {
        let Some(path) = self.auth_file.as_ref().filter(|_| self.auth) else {
            return Ok(None);
        };
        let text = std::fs::read_to_string(path)
            .map_err(|e| ServerError::Config(format!("auth_file {}: {e}", path.display())))?;
        let credentials = HtdigestCredentials::parse(&text).map_err(|e| {
            ServerError::Config(format!(
                "auth_file {}:{}: {}",
                path.display(),
                e.line,
                e.message
            ))
        })?;
        Ok(Some(credentials))
    }
}

/// One thread's published metrics.
#[derive(Default)]
struct Published {
    generation: u64,
    metrics: WorkerMetrics,
}

/// Where a thread publishes a copy of its metrics when asked.
#[derive(Default)]
struct MetricsSlot {
    wanted: AtomicU64,
    published: Mutex<Published>,
}

/// Generation meaning "the thread has ended; this copy is final".
const FINAL: u64 = u64::MAX;

impl MetricsSlot {
    /// Publish `metrics` if a newer copy was asked for than `*last`.
    fn offer(&self, metrics: &WorkerMetrics, last: &mut u64) {
        let wanted = self.wanted.load(Ordering::Acquire);
        if wanted > *last {
            let mut published = lock(&self.published);
            published.metrics.clone_from(metrics);
            published.generation = published.generation.max(wanted);
            *last = wanted;
        }
    }

    /// Publish the final copy (the thread ends).
    fn finish(&self, metrics: &WorkerMetrics) {
        let mut published = lock(&self.published);
        published.metrics.clone_from(metrics);
        published.generation = FINAL;
    }

    fn generation(&self) -> u64 {
        lock(&self.published).generation
    }
}

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

/// Counts a thread alive from its start to its end (also by unwinding).
struct AliveGuard<'a>(&'a AtomicUsize);

impl<'a> AliveGuard<'a> {
    fn new(count: &'a AtomicUsize) -> Self {
        count.fetch_add(1, Ordering::Relaxed);
        AliveGuard(count)
    }
}

impl Drop for AliveGuard<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// What the threads share about a shared location store.
struct LocationShared {
    counters: Arc<LocationCounters>,
    /// One per store thread.
    latency: Vec<Arc<Mutex<LocationLatency>>>,
}

/// The store threads' ends: their channels and stores.
struct StoreEnds {
    receivers: Vec<Receiver<ringway_sip::proxy::DeferredRequest>>,
    stores: Vec<Arc<RedisStore>>,
}

/// The shared location store's state at one moment.
#[derive(Debug, Clone)]
pub struct LocationSnapshot {
    /// Counters of the store threads and connections.
    pub counts: LocationCounts,
    /// Their latencies, per kind of query.
    pub latency: LocationLatency,
}

/// The configured state bounds, exported next to what they bound.
#[derive(Debug, Clone, Copy)]
pub struct Bounds {
    /// [`SipServerConfig::max_transactions`].
    pub max_transactions: usize,
    /// [`SipServerConfig::max_transaction_bytes`].
    pub max_transaction_bytes: usize,
    /// [`SipServerConfig::max_bindings`].
    pub max_bindings: usize,
    /// [`SipServerConfig::max_binding_bytes`].
    pub max_binding_bytes: usize,
}

/// Merged measurements at one moment (what `/metrics` renders).
#[derive(Debug, Clone)]
pub struct Snapshot {
    /// All workers' and the timer's metrics; `socket_rx_dropped` counts each
    /// socket once (shared model: one socket seen by every worker).
    pub metrics: WorkerMetrics,
    /// UDP counters of this network namespace, delta since start.
    pub udp: UdpSnmp,
    /// The core's own statistics.
    pub proxy: ProxyStats,
    /// Process CPU since start.
    pub process_cpu: CpuTime,
    /// Time since start.
    pub elapsed: Duration,
    /// Threads that did not publish in time (their previous copy was used).
    pub stale_threads: usize,
    /// The configured state bounds.
    pub config: Bounds,
    /// Worker, timer and store threads running.
    pub threads_alive: usize,
    /// Worker, timer and store threads started.
    pub threads_started: usize,
    /// Threads that panicked (each stops the server).
    pub threads_panicked: usize,
    /// The shared location store (`None`: in memory).
    pub location: Option<LocationSnapshot>,
    /// Datagrams received per worker (index = worker).
    pub per_worker_in: Vec<u64>,
    /// The TCP transport (`None`: no TCP listener).
    pub tcp: Option<TcpSnapshot>,
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
        let proxy_config = config.proxy_config(
            local,
            streams.addresses.clone(),
            random_key()?,
            u64::from_le_bytes(host::random_bytes()?),
        );
        let (mut proxy, location, store_ends) = build_proxy(&config, proxy_config)?;
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
        let store_threads = store_ends.as_ref().map_or(0, |ends| ends.stores.len());
        let StreamListeners {
            addresses: stream_addresses,
            listeners: tcp_listeners,
            polls: tcp_polls,
            connections,
        } = streams;
        let shared = Arc::new(Shared {
            connections,
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
        (tcp_listeners, tcp_polls): (Vec<mio::net::TcpListener>, Vec<mio::Poll>),
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
    }

    /// Stop every thread, wait for them, and return the summary.
    pub fn shutdown(mut self) -> Summary {
        self.stop_threads();
        let snap = snapshot(&self.shared);
        let s = &self.shared;
        summary::build(
            &s.config,
            s.local,
            (&s.rcvbuf_granted, &s.io_in_use),
            &snap,
            lock(&s.threads_cpu).clone(),
            lock(&s.placement).clone(),
            lock(&s.panicked).clone(),
        )
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
fn build_proxy(
    config: &SipServerConfig,
    proxy_config: ProxyConfig,
) -> Result<(Proxy, Option<LocationShared>, Option<StoreEnds>), ServerError> {
    Ok(match &config.location {
        Location::Memory => {
            let store = MemoryStore::with_limits(config.max_bindings, config.max_binding_bytes);
            (Proxy::with_store(proxy_config, Arc::new(store)), None, None)
        }
        Location::Redis(url) => {
            let counters = Arc::new(LocationCounters::default());
            let timeout = config.location_timeout;
            let mut stores = Vec::new();
            for _ in 0..config.location_threads {
                let store =
                    RedisStore::new(url, timeout, counters.clone()).map_err(ServerError::Config)?;
                stores.push(Arc::new(store));
            }
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
            (proxy, Some(shared), Some(StoreEnds { receivers, stores }))
        }
    })
}

/// `duration` in the cores' unit (ns), saturating.
fn duration_ns(duration: Duration) -> u64 {
    u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX)
}

/// A random nonce key (the kernel's random source).
fn random_key() -> Result<NonceKey, ServerError> {
    Ok(NonceKey(host::random_bytes()?))
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The connection transports' listeners, polls and table.
struct StreamListeners {
    /// The bound addresses (port 0 replaced).
    addresses: Vec<TransportAddr>,
    /// Every listener (accepted on by event loop 0).
    listeners: Vec<mio::net::TcpListener>,
    /// One poll per event loop.
    polls: Vec<mio::Poll>,
    connections: Option<Arc<Connections>>,
}

/// Bind the TCP listeners (port 0: the UDP port `local` got) and make the
/// event loops' polls and the connection table.
fn open_listeners(
    config: &SipServerConfig,
    local: SocketAddr,
) -> Result<StreamListeners, ServerError> {
    let mut streams = StreamListeners {
        addresses: Vec::new(),
        listeners: Vec::new(),
        polls: Vec::new(),
        connections: None,
    };
    if config.listeners.is_empty() {
        return Ok(streams);
    }
    for listener in &config.listeners {
        let mut addr = listener.addr;
        if addr.port() == 0 {
            addr.set_port(local.port());
        }
        let bound = mio::net::TcpListener::bind(addr)
            .map_err(|source| ServerError::Socket { addr, source })?;
        streams.addresses.push(TransportAddr {
            transport: listener.transport,
            addr: bound.local_addr()?,
        });
        streams.listeners.push(bound);
    }
    let threads = match config.tcp.threads {
        0 => config.workers,
        n => n,
    };
    let mut registries = Vec::with_capacity(threads);
    for _ in 0..threads {
        let poll = mio::Poll::new()?;
        registries.push(poll.registry().try_clone()?);
        streams.polls.push(poll);
    }
    streams.connections = Some(Arc::new(Connections::new(config.tcp.clone(), registries)));
    for a in &streams.addresses {
        log::info!("sip server: listening on {a} ({threads} event loops)");
    }
    Ok(streams)
}

/// One TCP event loop thread ([`tcp::run_loop`]).
fn tcp_thread(
    shared: &Shared,
    index: usize,
    poll: mio::Poll,
    listeners: Vec<mio::net::TcpListener>,
    udp: UdpSocket,
) {
    let Some(connections) = shared.connections.as_deref() else {
        return;
    };
    let name = format!("sip-tcp{index}");
    let _alive = AliveGuard::new(&shared.threads_alive);
    let run = catch_unwind(AssertUnwindSafe(|| {
        tcp::run_loop(tcp::LoopContext {
            poll,
            listeners,
            connections,
            proxy: &shared.proxy,
            udp,
            stop: &shared.stop,
        })
    }));
    record_thread_cpu(shared, &name);
    if let Err(panic) = run {
        shared.thread_panicked(&name);
        log::error!("sip server: thread {name} panicked: stopping every thread");
        resume_unwind(panic);
    }
}

/// Record the calling thread's CPU time when it ends.
fn record_thread_cpu(shared: &Shared, name: &str) {
    if let Ok(cpu) = host::thread_cpu_time() {
        lock(&shared.threads_cpu).push(ThreadCpu {
            name: name.to_string(),
            tid: ringway_io::thread::current_tid(),
            cpu,
        });
    }
}

/// One worker thread: receive a batch, drive it through the core, repeat.
fn worker_thread(shared: &Shared, index: usize, mut io: Box<dyn BatchIo>) {
    let name = format!("sip-w{index}");
    let lines = host::place_this_thread(&name, &shared.config.worker_placement(index));
    for line in &lines {
        log::info!("sip server: placement {line}");
    }
    lock(&shared.placement).extend(lines);
    let config = &shared.config;
    let mut rx = RxBatch::new(config.batch, RX_FRAME);
    let mut worker = SipWorker::new(&shared.proxy, config.batch, config.tx_stamp_every);
    worker.with_connections(shared.connections.clone());
    worker.shed_after(config.overload_queue_delay.map(duration_ns));
    worker.emulate_service(config.emulated_service, index as u64 + 1);
    let slot = &shared.slots[index];
    let mut published = 0u64;
    let _alive = AliveGuard::new(&shared.threads_alive);
    let run = catch_unwind(AssertUnwindSafe(|| {
        while !shared.stop.load(Ordering::Relaxed) {
            match io.recv_batch(&mut rx, Some(POLL)) {
                Ok(0) => {}
                Ok(_) => {
                    shared.injected_panic(&name);
                    worker.drive_batch(io.as_mut(), &rx, monotonic_now)
                }
                Err(e) => {
                    worker.count_rx_error();
                    log::warn!("sip server: worker {index}: receive error: {e}");
                    std::thread::sleep(Duration::from_millis(10));
                }
            }
            slot.offer(worker.metrics(), &mut published);
        }
    }));
    finish_thread(shared, slot, worker.metrics(), &name, run);
}

/// Publish a thread's final metrics and CPU time, also when its loop
/// panicked: then every thread is told to stop (review S11: no worker
/// goes on alone with a dead one's socket still bound, no timer-less
/// proxy), and the panic is passed on, so `join` reports it.
fn finish_thread(
    shared: &Shared,
    slot: &MetricsSlot,
    metrics: &WorkerMetrics,
    name: &str,
    run: std::thread::Result<()>,
) {
    slot.finish(metrics);
    record_thread_cpu(shared, name);
    if let Err(panic) = run {
        shared.thread_panicked(name);
        log::error!("sip server: thread {name} panicked: stopping every thread");
        resume_unwind(panic);
    }
}

/// The timer thread: run the core's timers at their deadlines.
fn timer_thread(shared: &Shared, mut io: Box<dyn BatchIo>) {
    let mut timer = SipTimer::new(&shared.proxy);
    timer.with_connections(shared.connections.clone());
    let slot = &shared.slots[shared.config.workers];
    let mut published = 0u64;
    let _alive = AliveGuard::new(&shared.threads_alive);
    let run = catch_unwind(AssertUnwindSafe(|| {
        while !shared.stop.load(Ordering::Relaxed) {
            shared.injected_panic("sip-timer");
            let wait = timer.wait(monotonic_now().0);
            if wait.is_zero() {
                timer.fire(io.as_mut(), monotonic_now().0);
            } else {
                std::thread::sleep(wait);
            }
            slot.offer(timer.metrics(), &mut published);
        }
    }));
    finish_thread(shared, slot, timer.metrics(), "sip-timer", run);
}

/// A store thread: take deferred requests, ask the shared store, resume
/// them in the core and send what they produce.
fn store_thread(
    shared: &Shared,
    index: usize,
    store: Arc<RedisStore>,
    requests: Receiver<ringway_sip::proxy::DeferredRequest>,
    mut io: Box<dyn BatchIo>,
) {
    let Some(location) = shared.location.as_ref() else {
        return;
    };
    let mut thread = StoreThread::new(
        &shared.proxy,
        store,
        requests,
        shared.config.location_timeout,
        location.latency[index].clone(),
        location.counters.clone(),
    );
    let slot = &shared.slots[shared.config.workers + 1 + index];
    let mut published = 0u64;
    let name = format!("sip-store{index}");
    let _alive = AliveGuard::new(&shared.threads_alive);
    let run = catch_unwind(AssertUnwindSafe(|| {
        while !shared.stop.load(Ordering::Relaxed) {
            shared.injected_panic(&name);
            if thread.run_batch(io.as_mut(), POLL, monotonic_now).is_none() {
                break;
            }
            slot.offer(thread.metrics(), &mut published);
        }
    }));
    finish_thread(shared, slot, thread.metrics(), &name, run);
}

/// Ask every thread for a copy of its metrics, wait (bounded) and merge.
fn snapshot(shared: &Shared) -> Snapshot {
    let generation = shared.generation.fetch_add(1, Ordering::Relaxed) + 1;
    for slot in &shared.slots {
        slot.wanted.fetch_max(generation, Ordering::Release);
    }
    let until = Instant::now() + SNAPSHOT_WAIT;
    while shared.slots.iter().any(|s| s.generation() < generation) && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(1));
    }
    let mut merged = WorkerMetrics::default();
    let mut socket_drops = 0u64;
    let mut stale_threads = 0;
    let workers = shared.config.workers;
    let mut per_worker_in = Vec::with_capacity(workers);
    for (index, slot) in shared.slots.iter().enumerate() {
        let published = lock(&slot.published);
        stale_threads += usize::from(published.generation < generation);
        merged.merge(&published.metrics);
        if index < workers {
            let metrics = &published.metrics;
            per_worker_in.push(metrics.msgs_in);
            // Shared model: every worker sees the one socket's counter.
            socket_drops = match shared.config.rx_model {
                RxModel::Shared => socket_drops.max(metrics.socket_rx_dropped),
                RxModel::Reuseport => socket_drops + metrics.socket_rx_dropped,
            };
        }
    }
    merged.socket_rx_dropped = socket_drops;
    Snapshot {
        metrics: merged,
        udp: match (&shared.udp_start, host::udp_totals()) {
            (Some(start), Some(now)) => now.since(start),
            _ => UdpSnmp::default(),
        },
        proxy: shared.proxy.stats(),
        process_cpu: host::process_cpu_time()
            .unwrap_or_default()
            .since(&shared.cpu_start),
        elapsed: shared.started.elapsed(),
        stale_threads,
        config: Bounds {
            max_transactions: shared.config.max_transactions,
            max_transaction_bytes: shared.config.max_transaction_bytes,
            max_bindings: shared.config.max_bindings,
            max_binding_bytes: shared.config.max_binding_bytes,
        },
        threads_alive: shared.threads_alive.load(Ordering::Relaxed),
        threads_started: shared.slots.len(),
        threads_panicked: lock(&shared.panicked).len(),
        location: shared.location.as_ref().map(|location| {
            let mut latency = LocationLatency::default();
            for thread in &location.latency {
                latency.merge(&lock(thread));
            }
            LocationSnapshot {
                counts: location.counters.snapshot(),
                latency,
            }
        }),
        per_worker_in,
        tcp: shared.connections.as_ref().map(|c| c.snapshot()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_msgs(n: u64) -> WorkerMetrics {
        let mut m = WorkerMetrics::default();
        m.msgs_in = n;
        m
    }

    #[test]
    fn metrics_slot_publishes_only_when_asked_and_final_wins() {
        let slot = MetricsSlot::default();
        let mut last = 0u64;
        slot.offer(&with_msgs(1), &mut last);
        assert_eq!(slot.generation(), 0, "nobody asked: nothing published");
        assert_eq!(lock(&slot.published).metrics.msgs_in, 0);
        slot.wanted.store(3, Ordering::Release);
        slot.offer(&with_msgs(2), &mut last);
        assert_eq!((slot.generation(), last), (3, 3));
        assert_eq!(lock(&slot.published).metrics.msgs_in, 2);
        // Asked once, published once: a later offer does not copy again.
        slot.offer(&with_msgs(5), &mut last);
        assert_eq!(lock(&slot.published).metrics.msgs_in, 2);
        slot.finish(&with_msgs(7));
        assert_eq!(slot.generation(), FINAL);
        assert_eq!(lock(&slot.published).metrics.msgs_in, 7);
    }
}
