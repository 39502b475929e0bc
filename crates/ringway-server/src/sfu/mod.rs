//! The pktswitch SFU server: one engine thread receives batches, runs them
//! through the sans-IO core ([`ringway_sfu::Sfu`], verified media
//! optionally SRPIC-sorted first) and sends every packet's copies as it is
//! handled; [`serve`] runs it until stopped and returns a [`ServeReport`]
//! with the paper's per-packet delay (the engine module's docs define the four
//! delays (a)-(d)). With the xdp backend on an interface with several
//! receive queues there is one engine per queue, each with its own AF_XDP
//! socket, and a control thread that owns the core and publishes route
//! snapshots to them (the `queues` module).

pub mod admin;
mod engine;
pub mod hub;
pub mod hub_admin;
mod queues;
pub mod recorder;

pub use engine::LiveStats;
pub use queues::{ControlCounters, EngineLive, EngineReport, QueueCounters};
pub use recorder::RecordReport;

use crate::host::{self, cpu_seconds, CpuTime};
use crate::metrics::LatencySummary;
use crate::ServerError;
use engine::Engine;
use ringway_io::{monotonic_now, BackendKind, BatchIo, Io, IoStats, OpenError, SocketConfig};
use ringway_reorder::{SeqSpace, Srpic, SrpicConfig, SrpicStats};
use ringway_sfu::{Sfu, SfuConfig, SfuStats};
use serde::{Deserialize, Serialize};
use std::net::{SocketAddr, TcpListener, UdpSocket};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Datagram frame size of the receive and send batches.
pub const FRAME: usize = 2048;
/// How often the engine runs the core's timers and publishes live counters.
const TICK_NS: u64 = 50_000_000;
/// Receive wait before the engine re-checks the stop flag.
const POLL: Duration = Duration::from_millis(20);
/// Receive wait while copies still wait for the kernel (kick again soon).
const POLL_PENDING: Duration = Duration::from_micros(200);

/// When the engine hands queued copies to the kernel.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
#[serde(rename_all = "lowercase")]
pub enum Flush {
    /// Once per receive batch (and when the send batch is full): every
    /// packet of a batch waits for the copies of the whole batch.
    Batch,
    /// After the copies of every packet: one kernel crossing per packet
    /// (AF_XDP: one kick for its n copies, the paper's Table I).
    Packet,
    /// When the receive batch is done, or when the oldest unsent copy is
    /// older than `flush_age_us`, whichever comes first.
    Adaptive,
}

/// Everything an SFU needs to start (plain data; front ends build it).
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SfuServerConfig {
    /// Address to listen on (port 0: any).
    pub listen: SocketAddr,
    /// I/O backend (xdp with its interface, whose address, IPv4 or IPv6, is `listen`).
    pub io: Io,
    /// Datagrams per receive batch (default: 1 for the socket backend, as
    /// in the paper's baseline; 64 otherwise).
    pub batch: Option<usize>,
    /// When copies are handed to the kernel (default: `packet`).
    pub flush: Option<Flush>,
    /// With `adaptive`: longest a copy may wait unsent (µs).
    pub flush_age_us: u32,
    /// Spin (poll without sleeping) this long before a blocking receive
    /// (µs; 0: never). The CPU it burns is in the report (`spin_s`).
    pub spin_us: u32,
    /// Seconds at the start that are not measured (delays, CPU).
    pub warmup_s: f64,
    /// Replicate verified media in the kernel: a tcx ingress program on
    /// this interface (whose address, IPv4 or IPv6, is `listen`) with the routes the
    /// core holds, kept in line every tick; packets it does not cover come
    /// to the engine as before.
    pub kernel_fanout: Option<String>,
    /// Echo media packets back to their senders.
    pub echo: bool,
    /// Admit plain RTP senders by address into one static room (latching).
    pub static_room: bool,
    /// Most registered clients (and static-room members).
    pub max_clients: usize,
    /// Most clients (and, separately, static-room members) per source
    /// prefix: one host cannot fill `max_clients`.
    pub max_clients_per_prefix: usize,
    /// IPv4 prefix length (bits) of that cap.
    pub client_prefix_v4: u8,
    /// IPv6 prefix length (bits) of that cap.
    pub client_prefix_v6: u8,
    /// Most subscription selectors per client.
    pub max_subs: usize,
    /// Remove clients silent for this long (seconds).
    pub idle_timeout_s: f64,
    /// Pin the engine thread to these CPUs.
    pub cpus: Option<Vec<usize>>,
    /// Stop after this many seconds (otherwise when the stop flag is set).
    pub duration_s: Option<f64>,
    /// Sort each RTP stream with SRPIC within each receive batch, with this
    /// block size.
    pub srpic_block: Option<usize>,
    /// File holding the join-token key (HMAC-SHA256, at least 32 bytes;
    /// trailing whitespace ignored). With it, joining needs a valid token.
    pub token_key_file: Option<PathBuf>,
    /// Most rooms at once.
    pub max_rooms: usize,
    /// Most clients per room.
    pub max_clients_per_room: usize,
    /// Create rooms when a client first names them (otherwise only through
    /// the admin API).
    pub auto_create_rooms: bool,
    /// A media packet more than this (ms) later than its stream's earliest
    /// counts as late in the per-peer statistics.
    pub late_after_ms: f64,
    /// Serve the admin API (and `/metrics`) on this loopback address.
    pub admin_listen: Option<SocketAddr>,
    /// File holding the admin API's bearer token (at least 16 bytes;
    /// trailing whitespace ignored). Required with `admin_listen`.
    pub admin_token_file: Option<PathBuf>,
    /// Record forwarded media to this directory (one file per source,
    /// written by a recorder thread off the data path; created if needed).
    pub record_dir: Option<PathBuf>,
    /// Most bytes a recording may write (file and record headers
    /// included); the recording stops, counting drops, when it is reached.
    pub record_max_bytes: u64,
}

impl Default for SfuServerConfig {
    fn default() -> Self {
        SfuServerConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], 5004)),
            io: Io::Socket,
            batch: None,
            flush: None,
            flush_age_us: 20,
            spin_us: 0,
            warmup_s: 0.0,
            kernel_fanout: None,
            echo: true,
            static_room: false,
            max_clients: 1024,
            max_clients_per_prefix: SfuConfig::default().max_clients_per_prefix,
            client_prefix_v4: SfuConfig::default().client_prefix_v4,
            client_prefix_v6: SfuConfig::default().client_prefix_v6,
            max_subs: 64,
            idle_timeout_s: 10.0,
            cpus: None,
            duration_s: None,
            srpic_block: None,
            token_key_file: None,
            max_rooms: 256,
            max_clients_per_room: 1024,
            auto_create_rooms: true,
            late_after_ms: 20.0,
            admin_listen: None,
            admin_token_file: None,
            record_dir: None,
            record_max_bytes: 1 << 30,
        }
    }
}

impl SfuServerConfig {
    /// The receive batch size in use.
    pub fn batch_size(&self) -> usize {
        self.batch.unwrap_or(match self.io.kind() {
            BackendKind::Socket => 1,
            _ => 64,
        })
    }

    /// The flush policy in use: `packet` unless set. (Measured on the veth
    /// testbed, 8 clients × 1500 pps: `adaptive` at 20 µs gave mmsg and
    /// io_uring about the same CPU per packet as `packet` and 5× its delay
    /// (a): one `sendmmsg` carrying a batch's copies returns only when the
    /// last of them is sent.)
    pub fn flush_policy(&self) -> Flush {
        self.flush.unwrap_or(Flush::Packet)
    }

    /// Reject inconsistent settings, naming the field.
    pub fn validate(&self) -> Result<(), ServerError> {
        let fail = |m: &str| Err(ServerError::Config(m.to_string()));
        if self.batch_size() == 0 {
            return fail("batch must be at least 1");
        }
        if self.max_clients_per_prefix == 0
            || !(8..=32).contains(&self.client_prefix_v4)
            || !(16..=128).contains(&self.client_prefix_v6)
        {
            return fail(
                "max_clients_per_prefix must be above 0, client_prefix_v4 8..=32, client_prefix_v6 16..=128",
            );
        }
        let xdp = matches!(self.io, Io::Xdp(_));
        if self.kernel_fanout.is_some() {
            if self.listen.ip().is_unspecified() {
                return fail(
                    "kernel_fanout matches packets by destination address: listen must be a concrete address",
                );
            }
            if xdp {
                return fail(
                    "kernel_fanout cannot run with the xdp backend (the XDP program hands media to AF_XDP before tc sees it)",
                );
            }
        }
        if !(self.idle_timeout_s.is_finite() && self.idle_timeout_s > 0.0) {
            return fail("idle_timeout_s must be a positive number of seconds");
        }
        if self.duration_s.is_some_and(|d| !(d.is_finite() && d > 0.0)) {
            return fail("duration_s must be a positive number of seconds");
        }
        if !(self.warmup_s.is_finite() && self.warmup_s >= 0.0) {
            return fail("warmup_s must be zero or a positive number of seconds");
        }
        if self.flush_age_us == 0 {
            return fail("flush_age_us must be at least 1");
        }
        if self.max_rooms == 0 || self.max_clients_per_room == 0 {
            return fail("max_rooms and max_clients_per_room must be at least 1");
        }
        if !(self.late_after_ms.is_finite() && self.late_after_ms > 0.0) {
            return fail("late_after_ms must be a positive number of milliseconds");
        }
        if self.record_dir.is_some() {
            if self.kernel_fanout.is_some() {
                return fail(
                    "record_dir cannot run with kernel_fanout (media replicated in the kernel never reaches the recorder)",
                );
            }
            if self.record_max_bytes == 0 {
                return fail("record_max_bytes must be at least 1");
            }
        }
        match (self.admin_listen, &self.admin_token_file) {
            (Some(a), Some(_)) => crate::metrics::http::validate_addr(a, false)?,
            (Some(_), None) => return fail("admin_listen needs admin_token_file"),
            (None, Some(_)) => return fail("admin_token_file is only for admin_listen"),
            (None, None) => {}
        }
        Ok(())
    }
}

/// Final report of an SFU run.
#[derive(Clone, Debug, Serialize)]
pub struct ServeReport {
    /// Backend name.
    pub backend: String,
    /// The backend and its modes (e.g. "xdp (native XDP, copy mode, ...)").
    pub io_mode: String,
    /// Receive batch size.
    pub batch: usize,
    /// Send flush policy.
    pub flush: Flush,
    /// Address served.
    pub listen: String,
    /// Seconds at the start left out of the measurement.
    pub warmup_s: f64,
    /// Wall time of the measured part of the engine loop (s).
    pub wall_s: f64,
    /// Engine thread CPU time over `wall_s` (`user_s`, `sys_s`), spinning
    /// included; `None` (null) when the kernel did not tell it.
    #[serde(with = "cpu_seconds::option")]
    pub cpu: Option<CpuTime>,
    /// User CPU in % of one core over `wall_s` (NaN, null in JSON: unknown).
    pub cpu_user_pct: f64,
    /// Kernel CPU in % of one core over `wall_s` (NaN: unknown).
    pub cpu_system_pct: f64,
    /// Seconds the engine spent spinning for datagrams (all of it CPU).
    pub spin_s: f64,
    /// Placement of the engine thread (`cpus`): one line per knob, what
    /// was asked and what the kernel did.
    pub placement: Vec<String>,
    /// The lines of `placement` the kernel refused (empty: all applied).
    pub placement_refused: Vec<String>,
    /// (a) Per-packet delay as the paper defines it: pickup → last copy
    /// queued for transmission ("scheduled").
    pub delay: LatencySummary,
    /// Mean of (a) (µs).
    pub delay_mean_us: f64,
    /// (b) Pickup → last copy taken by the kernel.
    pub delay_handoff: LatencySummary,
    /// (c) Application receive → pickup: waiting behind earlier packets.
    pub delay_wait: LatencySummary,
    /// (d) Kernel RX stamp → last copy taken by the kernel (the kernel
    /// queue's wait included; empty without kernel stamps).
    pub delay_from_kernel: LatencySummary,
    /// Hand-overs to the kernel (flushes) made.
    pub flushes: u64,
    /// The in-kernel fan-out's counters, when it ran (packets replicated in
    /// the kernel never reach the engine: they are not in the delays above).
    pub kernel_fanout: Option<ringway_io::backend::FanoutStats>,
    /// The AF_XDP TX ring was congested: copies were dropped after the
    /// bounded wait, or the send path waited for room for more than 0.1% of
    /// the packets (the paper left such runs out of its delay results).
    pub tx_congested: bool,
    /// Mean number of copies (subscribers + echo) per forwarded packet.
    pub copies_per_packet: f64,
    /// Core counters.
    pub sfu: SfuStats,
    /// Backend counters.
    pub io: IoStats,
    /// Bytes received / sent by the engine.
    pub rx_bytes: u64,
    /// See `rx_bytes`.
    pub tx_bytes: u64,
    /// Receive frames that were truncated (dropped).
    pub truncated: u64,
    /// Per-peer receive errors (ICMP errors reported on the socket), skipped.
    pub rx_errors: u64,
    /// SRPIC counters, when sorting was on.
    pub srpic: Option<SrpicStats>,
    /// The recorder's counters, when recording was on.
    pub recording: Option<RecordReport>,
    /// Per engine, with one engine per receive queue (the xdp backend on an
    /// interface with several): the fields above are their sums (CPU: the
    /// engines' threads; `srpic` is then per engine only). Empty with one
    /// engine.
    pub engines: Vec<EngineReport>,
    /// The control thread's work, with one engine per receive queue: the
    /// datagrams the engines handed on (control, unverified media), the
    /// replies and copies it sent through the kernel.
    pub control: Option<ControlCounters>,
}

/// Read a secret from `path`: its bytes with trailing whitespace removed.
/// Errors name the file, never its contents.
fn read_secret(path: &std::path::Path, what: &str) -> Result<Vec<u8>, ServerError> {
    let mut bytes = std::fs::read(path).map_err(|e| {
        ServerError::Config(format!("reading the {what} file {}: {e}", path.display()))
    })?;
    while bytes.last().is_some_and(|c| c.is_ascii_whitespace()) {
        bytes.pop();
    }
    Ok(bytes)
}

/// The admin API's bearer token from file `p`: text, at least 16
/// characters, no spaces (trailing whitespace ignored).
fn read_admin_token(path: &std::path::Path) -> Result<String, ServerError> {
    let token = String::from_utf8(read_secret(path, "admin token")?).map_err(|_| {
        ServerError::Config(format!("{}: the admin token must be text", path.display()))
    })?;
    if token.len() < 16 || token.contains(char::is_whitespace) {
        return Err(ServerError::Config(format!(
            "{}: the admin token must be at least 16 characters without spaces",
            path.display()
        )));
    }
    Ok(token)
}

/// The backends `config` asks for.
struct OpenedIo {
    /// One; with the xdp backend, one per receive queue of the interface.
    backends: Vec<Box<dyn BatchIo>>,
    /// The receive queue of each xdp backend (empty for the others).
    queues: Vec<u32>,
    /// xdp: a handle of the companion UDP socket, for the control thread.
    socket: Option<UdpSocket>,
    /// xdp on several queues: the engines' next hops, for the control
    /// thread to refresh.
    next_hops: Option<ringway_io::NextHopRefresher>,
}

/// Open the backend `config` asks for (8 MiB socket buffers); xdp on every
/// receive queue of its interface.
fn open_io(config: &SfuServerConfig) -> Result<OpenedIo, ServerError> {
    if let Io::Xdp(interface) = &config.io {
        let opened =
            ringway_io::open_xdp_queues(interface.config(config.listen)).map_err(|source| {
                ServerError::Backend {
                    backend: BackendKind::Xdp.to_string(),
                    source,
                }
            })?;
        return Ok(OpenedIo {
            backends: opened.backends,
            queues: opened.queues,
            socket: Some(opened.socket),
            next_hops: opened.next_hops,
        });
    }
    let mut socket_config = SocketConfig::new(config.listen);
    socket_config.rcvbuf = Some(8 << 20);
    socket_config.sndbuf = Some(8 << 20);
    match config.io.open(&socket_config) {
        Ok((io, _)) => Ok(OpenedIo {
            backends: vec![io],
            queues: Vec::new(),
            socket: None,
            next_hops: None,
        }),
        Err(OpenError::Socket { addr, source }) => Err(ServerError::Socket { addr, source }),
        Err(OpenError::Backend { kind, source }) => Err(ServerError::Backend {
            backend: kind.to_string(),
            source,
        }),
    }
}

/// A running SFU: the engine thread and its socket (or AF_XDP socket).
/// [`SfuServer::shutdown`] stops it and returns the report; dropping the
/// handle stops it too (and waits for the engine thread).
pub struct SfuServer {
    config: SfuServerConfig,
    local: SocketAddr,
    batch: usize,
    stop: Arc<AtomicBool>,
    live: Arc<Mutex<LiveStats>>,
    engine: Option<JoinHandle<Result<EngineEnd, ServerError>>>,
    admin: Option<AdminThread>,
    recorder: Option<recorder::Recorder>,
}

/// The admin API's thread: its bound address, stop flag and handle.
type AdminThread = (SocketAddr, Arc<AtomicBool>, JoinHandle<()>);

/// The token key of `config.token_key_file`, when there is one.
fn read_token_key(
    config: &SfuServerConfig,
) -> Result<Option<ringway_sfu::token::TokenKey>, ServerError> {
    Ok(match &config.token_key_file {
        Some(path) => Some(
            ringway_sfu::token::TokenKey::new(read_secret(path, "token key")?)
                .map_err(|err| ServerError::Config(format!("{}: {err}", path.display())))?,
        ),
        None => None,
    })
}

/// The forwarding core `config` asks for, with its token key.
fn sfu_core(
    config: &SfuServerConfig,
    token_key: Option<ringway_sfu::token::TokenKey>,
) -> Result<Sfu, ServerError> {
    let mut sfu = Sfu::new(SfuConfig {
        echo: config.echo,
        static_room: config.static_room,
        max_clients: config.max_clients,
        max_clients_per_prefix: config.max_clients_per_prefix,
        client_prefix_v4: config.client_prefix_v4,
        client_prefix_v6: config.client_prefix_v6,
        max_subs: config.max_subs,
        idle_timeout_ns: (config.idle_timeout_s * 1e9) as u64,
        seed: random_seed()?,
        token_key,
        max_rooms: config.max_rooms,
        max_clients_per_room: config.max_clients_per_room,
        auto_create_rooms: config.auto_create_rooms,
        late_after_ns: (config.late_after_ms * 1e6) as u64,
        ..SfuConfig::default()
    });
    sfu.set_unix_time(monotonic_now().0, ringway_io::realtime_now().0);
    Ok(sfu)
}

/// The SRPIC sorter of `--srpic-block`, its ring at least one batch.
fn srpic_sorter(config: &SfuServerConfig, batch: usize) -> Option<Srpic<usize>> {
    config.srpic_block.map(|block| {
        Srpic::new(
            SrpicConfig {
                block_size: block.max(1),
                ring_size: batch.max(block).max(1),
                ..Default::default()
            },
            SeqSpace::U16,
        )
    })
}

/// One engine per receive queue: each with its backend, its own sorter
/// and, with `cpus`, pinned to the next CPU of the list (round robin).
fn queue_runs(
    config: &SfuServerConfig,
    backends: Vec<Box<dyn BatchIo>>,
    queues: Vec<u32>,
    record: Option<recorder::RecordTx>,
) -> Vec<queues::QueueRun> {
    let settings = EngineSettings::of(config);
    backends
        .into_iter()
        .zip(queues)
        .enumerate()
        .map(|(k, (io, queue))| queues::QueueRun {
            io,
            queue,
            srpic: srpic_sorter(config, settings.batch),
            settings: settings.clone(),
            cpu: config
                .cpus
                .as_ref()
                .filter(|cpus| !cpus.is_empty())
                .map(|cpus| cpus[k % cpus.len()]),
            record: record.clone(),
        })
        .collect()
}

/// The admin API's thread when an address and a token are configured:
/// its bound address, stop flag and handle.
fn start_admin(
    listen: Option<SocketAddr>,
    token: Option<String>,
    admin_tx: std::sync::mpsc::SyncSender<admin::AdminRequest>,
    live: &Arc<Mutex<LiveStats>>,
) -> Result<Option<AdminThread>, ServerError> {
    Ok(match (listen, token) {
        (Some(addr), Some(token)) => {
            let listener =
                TcpListener::bind(addr).map_err(|source| ServerError::Socket { addr, source })?;
            let bound = listener.local_addr()?;
            let admin_stop = Arc::new(AtomicBool::new(false));
            let handle = crate::admin_http::serve(
                "sfu-admin",
                listener,
                admin_stop.clone(),
                admin::handler(token, admin_tx, live.clone()),
            )
            .map_err(|source| ServerError::Thread {
                name: "sfu-admin".into(),
                source,
            })?;
            Some((bound, admin_stop, handle))
        }
        _ => None,
    })
}

impl SfuServer {
    /// Validate `config`, open the backend on the calling thread (inside
    /// its network namespace) and start the engine thread (which inherits
    /// that namespace). The engine stops by itself after
    /// `config.duration_s`, or on [`SfuServer::shutdown`] / drop.
    pub fn start(config: SfuServerConfig) -> Result<SfuServer, ServerError> {
        config.validate()?;
        let token_key = read_token_key(&config)?;
        let admin_token = match &config.admin_token_file {
            Some(path) => Some(read_admin_token(path)?),
            None => None,
        };
        let OpenedIo {
            mut backends,
            queues,
            socket,
            next_hops,
        } = open_io(&config)?;
        let local = backends[0].local_addr()?;
        let batch = config.batch_size();
        let sfu = sfu_core(&config, token_key)?;
        let stop = Arc::new(AtomicBool::new(false));
        let live = Arc::new(Mutex::new(LiveStats {
            backend: config.io.kind().name().into(),
            ..LiveStats::default()
        }));
        let (admin_tx, admin_rx) = admin::channel();
        let admin = start_admin(config.admin_listen, admin_token, admin_tx, &live)?;
        let (recorder, record_tx) = match &config.record_dir {
            Some(dir) => {
                let (recorder, record_tx) =
                    recorder::Recorder::start(dir, config.record_max_bytes)?;
                (Some(recorder), Some(record_tx))
            }
            None => (None, None),
        };
        let engine = match socket {
            Some(socket) if backends.len() > 1 => {
                let control = queues::ControlRun {
                    sfu,
                    socket,
                    next_hops,
                    admin: admin_rx,
                    record: record_tx.clone(),
                    stop: stop.clone(),
                    live: live.clone(),
                    warmup: Duration::from_secs_f64(config.warmup_s),
                };
                let runs = queue_runs(&config, backends, queues, record_tx);
                queues::start(control, runs)?
            }
            _ => Self::start_engine(
                &config,
                backends.remove(0),
                sfu,
                admin_rx,
                record_tx,
                &stop,
                &live,
            )?,
        };
        Ok(SfuServer {
            config,
            local,
            batch,
            stop,
            live,
            engine: Some(engine),
            admin,
            recorder,
        })
    }

    /// The one engine thread, owning the core and the backend.
    fn start_engine(
        config: &SfuServerConfig,
        io: Box<dyn BatchIo>,
        sfu: Sfu,
        admin_rx: std::sync::mpsc::Receiver<admin::AdminRequest>,
        record_tx: Option<recorder::RecordTx>,
        stop: &Arc<AtomicBool>,
        live: &Arc<Mutex<LiveStats>>,
    ) -> Result<JoinHandle<Result<EngineEnd, ServerError>>, ServerError> {
        let settings = EngineSettings::of(config);
        let local = io.local_addr()?;
        let run = EngineRun {
            record: record_tx,
            admin: admin_rx,
            io,
            sfu,
            srpic: srpic_sorter(config, settings.batch),
            settings,
            local,
            cpus: config.cpus.clone(),
            fanout_at: config.kernel_fanout.clone(),
            stop: stop.clone(),
            live: live.clone(),
        };
        std::thread::Builder::new()
            .name("sfu-engine".into())
            .spawn(move || engine_thread(run))
            .map_err(|source| ServerError::Thread {
                name: "sfu-engine".into(),
                source,
            })
    }

    /// The admin API's bound address, when it runs.
    pub fn admin_addr(&self) -> Option<SocketAddr> {
        self.admin.as_ref().map(|a| a.0)
    }

    /// The bound address.
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// The configuration it runs with.
    pub fn config(&self) -> &SfuServerConfig {
        &self.config
    }

    /// The engine's counters as last published (every tick, 50 ms).
    pub fn live(&self) -> LiveStats {
        self.live
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The engine thread has ended (its duration is over, or it failed).
    pub fn is_finished(&self) -> bool {
        self.engine.as_ref().is_none_or(|h| h.is_finished())
    }

    fn stop_engine(&mut self) -> Option<Result<EngineEnd, ServerError>> {
        self.stop.store(true, Ordering::Relaxed);
        if let Some((_, stop, handle)) = self.admin.take() {
            stop.store(true, Ordering::Relaxed);
            let _ = handle.join();
        }
        let handle = self.engine.take()?;
        Some(
            handle
                .join()
                .map_err(|_| ServerError::Panicked("sfu-engine".into()))
                .and_then(|r| r),
        )
    }

    /// Stop the engine, wait for it, and return its report (or the error
    /// it stopped with).
    pub fn shutdown(mut self) -> Result<ServeReport, ServerError> {
        let end = self.stop_engine();
        // The engine thread has ended and dropped its sender: the recorder
        // drains what is queued, flushes and ends.
        let recording = self.recorder.take().map(recorder::Recorder::finish);
        match end {
            Some(end) => {
                let mut report_out = report(&self.config, self.local, self.batch, end?);
                report_out.recording = recording;
                Ok(report_out)
            }
            None => Err(ServerError::Panicked("sfu-engine".into())),
        }
    }
}

impl Drop for SfuServer {
    fn drop(&mut self) {
        if let Some(Err(err)) = self.stop_engine() {
            log::error!("sfu: engine: {err}");
        }
        if let Some(recorder) = self.recorder.take() {
            recorder.finish();
        }
    }
}

/// Run the SFU until `stop` is set or the configured duration ends;
/// `on_bound` is called with the bound address once the socket is open.
pub fn serve(
    config: &SfuServerConfig,
    stop: Arc<AtomicBool>,
    on_bound: impl FnOnce(SocketAddr),
) -> Result<ServeReport, ServerError> {
    serve_with_live(config, stop, on_bound, None, |_| {})
}

/// [`serve`], and call `on_live` with the engine's counters every `every`.
pub fn serve_with_live(
    config: &SfuServerConfig,
    stop: Arc<AtomicBool>,
    on_bound: impl FnOnce(SocketAddr),
    every: Option<Duration>,
    mut on_live: impl FnMut(&LiveStats),
) -> Result<ServeReport, ServerError> {
    let server = SfuServer::start(config.clone())?;
    on_bound(server.local_addr());
    let mut last_live = Instant::now();
    while !server.is_finished() && !stop.load(Ordering::Relaxed) {
        std::thread::sleep(Duration::from_millis(20));
        if let Some(every) = every.filter(|e| !e.is_zero()) {
            if last_live.elapsed() >= every {
                on_live(&server.live());
                last_live = Instant::now();
            }
        }
    }
    server.shutdown()
}

/// Everything the engine thread owns.
struct EngineRun {
    io: Box<dyn BatchIo>,
    sfu: Sfu,
    srpic: Option<Srpic<usize>>,
    settings: EngineSettings,
    local: SocketAddr,
    cpus: Option<Vec<usize>>,
    fanout_at: Option<String>,
    stop: Arc<AtomicBool>,
    live: Arc<Mutex<LiveStats>>,
    admin: std::sync::mpsc::Receiver<admin::AdminRequest>,
    record: Option<recorder::RecordTx>,
}

/// What every engine takes from the configuration (the one engine, or
/// each of one per receive queue).
#[derive(Clone, Debug)]
struct EngineSettings {
    batch: usize,
    flush: Flush,
    max_age_ns: u64,
    spin: Duration,
    warmup: Duration,
    duration: Option<Duration>,
}

impl EngineSettings {
    fn of(config: &SfuServerConfig) -> EngineSettings {
        EngineSettings {
            batch: config.batch_size(),
            flush: config.flush_policy(),
            max_age_ns: u64::from(config.flush_age_us) * 1000,
            spin: Duration::from_micros(u64::from(config.spin_us)),
            warmup: Duration::from_secs_f64(config.warmup_s),
            duration: config.duration_s.map(Duration::from_secs_f64),
        }
    }

    /// An engine forwarding with `core` (and the sorter `srpic`).
    fn engine<F: engine::Forwarding>(&self, core: F, srpic: Option<Srpic<usize>>) -> Engine<F> {
        Engine::new(
            core,
            self.batch,
            srpic,
            self.flush,
            self.max_age_ns,
            Box::new(engine::SystemClock),
        )
    }
}

/// An engine thread's run: until stopped or its duration is over, measured
/// from the end of its warm-up.
struct Window {
    started: Instant,
    warmup: Duration,
    duration: Option<Duration>,
    spin: Duration,
    warm: bool,
    baseline: engine::Baseline,
    cpu0: Option<CpuTime>,
    measured_from: Instant,
    spin_ns: u64,
}

impl Window {
    /// A run that started at `started`, measured from now (the thread's
    /// CPU counted from here) or from the end of its warm-up.
    fn new(settings: &EngineSettings, started: Instant) -> Window {
        Window {
            started,
            warmup: settings.warmup,
            duration: settings.duration,
            spin: settings.spin,
            warm: settings.warmup.is_zero(),
            baseline: engine::Baseline::default(),
            cpu0: host::thread_cpu_time().ok(),
            measured_from: Instant::now(),
            spin_ns: 0,
        }
    }

    /// Not stopped, and the duration is not over.
    fn running(&self, stop: &AtomicBool) -> bool {
        !stop.load(Ordering::Relaxed)
            && self
                .duration
                .is_none_or(|limit| self.started.elapsed() < limit)
    }

    /// At the end of the warm-up (true once): measure from here, with the
    /// backend's and the fan-out's counters now as the baseline.
    fn warm_up_ended<F: engine::Forwarding>(
        &mut self,
        engine: &mut Engine<F>,
        io: &dyn BatchIo,
        fanout: Option<&ringway_io::backend::KernelFanout>,
    ) -> bool {
        if self.warm || self.started.elapsed() < self.warmup {
            return false;
        }
        self.warm = true;
        self.baseline = engine.reset_measurements(io.stats(), fanout.map(|f| f.stats()));
        self.cpu0 = host::thread_cpu_time().ok();
        self.measured_from = Instant::now();
        self.spin_ns = 0;
        true
    }

    /// One turn of the loop: copies the kernel has not taken handed over,
    /// then a batch received (spinning first, then waiting: briefly while
    /// copies are pending). Returns the datagrams received.
    fn receive<F: engine::Forwarding>(
        &mut self,
        io: &mut dyn BatchIo,
        engine: &mut Engine<F>,
    ) -> Result<usize, ServerError> {
        if engine.pending() {
            engine.flush_now(io)?;
        }
        let wait = if engine.pending() { POLL_PENDING } else { POLL };
        receive_spinning(io, engine, self.spin, wait, &mut self.spin_ns)
    }

    /// The end: the recorder's channel closed, the last copies handed
    /// over; the measured wall time (s) and the thread's CPU over it.
    fn end<F: engine::Forwarding>(
        &self,
        io: &mut dyn BatchIo,
        engine: &mut Engine<F>,
    ) -> Result<(f64, Option<CpuTime>), ServerError> {
        engine.record = None;
        if engine.pending() {
            engine.flush_now(io)?;
        }
        Ok((
            self.measured_from.elapsed().as_secs_f64(),
            cpu_since(self.cpu0),
        ))
    }
}

/// Pin the engine thread to `cpus`: (every placement line, the refused ones).
fn place_engine(cpus: Option<&[usize]>) -> (Vec<String>, Vec<String>) {
    let mut placement = Vec::new();
    let mut refused = Vec::new();
    let Some(list) = cpus else {
        return (placement, refused);
    };
    let asked = ringway_io::thread::Placement {
        cpus: Some(list.to_vec()),
        ..Default::default()
    };
    for item in asked.apply() {
        let line = format!(
            "sfu-engine: {} {} -> {}",
            item.what, item.requested, item.result
        );
        if !item.result.is_applied() {
            log::warn!("sfu: placement {line}");
            refused.push(line.clone());
        }
        placement.push(line);
    }
    (placement, refused)
}

/// Receive a batch: first polling without sleeping for up to `spin` (its
/// time added to `spin_ns`), then waiting at most `wait`.
fn receive_spinning<F: engine::Forwarding>(
    io: &mut dyn BatchIo,
    engine: &mut Engine<F>,
    spin: Duration,
    wait: Duration,
    spin_ns: &mut u64,
) -> Result<usize, ServerError> {
    if !spin.is_zero() {
        let spinning = Instant::now();
        let received = loop {
            let received = receive(io, engine, Some(Duration::ZERO))?;
            if received > 0 || spinning.elapsed() >= spin {
                break received;
            }
        };
        *spin_ns += spinning.elapsed().as_nanos() as u64;
        if received > 0 {
            return Ok(received);
        }
    }
    receive(io, engine, Some(wait))
}

/// Keep the in-kernel fan-out's map in line with the core's routes.
fn sync_fanout(fanout: &mut ringway_io::backend::KernelFanout, e: &Engine) {
    let echo = e.sfu.config().echo;
    let routes: Vec<ringway_io::backend::FanoutRoute> = e
        .sfu
        .routes()
        .map(|(ssrc, m, src, dsts)| ringway_io::backend::FanoutRoute {
            ssrc,
            pt: m.payload_type(),
            src,
            dsts: dsts.to_vec(),
            echo,
        })
        .collect();
    if let Err(err) = fanout.sync(&routes) {
        log::warn!("sfu: kernel fan-out sync: {err}");
    }
}

/// Publish the live counters (rooms, bytes, backend, engine CPU).
fn publish_live(live: &Mutex<LiveStats>, engine: &Engine, io_stats: IoStats) {
    let rooms: Vec<(String, usize)> = engine
        .sfu
        .room_sizes()
        .map(|(room, n)| (room.to_string(), n))
        .collect();
    let cpu = host::thread_cpu_time()
        .ok()
        .map(|c| (c.user_ns + c.system_ns) as f64 / 1e9);
    let mut stats = live.lock().unwrap_or_else(PoisonError::into_inner);
    stats.sfu = engine.sfu.stats();
    stats.rx_bytes = engine.rx_bytes;
    stats.tx_bytes = engine.tx_bytes;
    stats.truncated = engine.truncated;
    stats.rooms = rooms;
    stats.io = io_stats;
    stats.engine_cpu_s = cpu;
    stats.record_queue_drops = engine.record.as_ref().map(|r| r.dropped());
    stats.ticks += 1;
}

/// The in-kernel fan-out (tcx) on `fanout_at`, for the family of `local`.
fn attach_fanout(
    fanout_at: Option<&str>,
    local: SocketAddr,
) -> Result<Option<ringway_io::backend::KernelFanout>, ServerError> {
    fanout_at
        .map(|iface| {
            ringway_io::backend::KernelFanout::attach(iface, local)
                .map_err(|err| ServerError::Config(format!("kernel fan-out: {err}")))
        })
        .transpose()
}

/// The periodic work: the core's clock and timers, the fan-out's map, the
/// live counters.
fn tick(
    engine: &mut Engine,
    fanout: Option<&mut ringway_io::backend::KernelFanout>,
    live: &Mutex<LiveStats>,
    io_stats: IoStats,
    now: u64,
) {
    engine.sfu.set_unix_time(now, ringway_io::realtime_now().0);
    engine.sfu.tick(now);
    if let Some(fanout) = fanout {
        sync_fanout(fanout, engine);
    }
    publish_live(live, engine, io_stats);
}

/// The engine thread: receive, handle, flush, tick, until stopped or the
/// duration is over.
fn engine_thread(run: EngineRun) -> Result<EngineEnd, ServerError> {
    let EngineRun {
        mut io,
        sfu,
        srpic,
        settings,
        local,
        cpus,
        fanout_at,
        stop,
        live,
        admin,
        record,
    } = run;
    let started = Instant::now();
    let (placement, placement_refused) = place_engine(cpus.as_deref());
    let mut engine = settings.engine(sfu, srpic);
    engine.record = record;
    let mut fanout = attach_fanout(fanout_at.as_deref(), local)?;
    let mut window = Window::new(&settings, started);
    live.lock()
        .unwrap_or_else(PoisonError::into_inner)
        .measuring = window.warm;
    let mut next_tick = 0u64;
    let mut next_feedback = 0u64;
    while window.running(&stop) {
        if window.warm_up_ended(&mut engine, io.as_ref(), fanout.as_ref()) {
            // End of the warm-up: measure from here.
            live.lock()
                .unwrap_or_else(PoisonError::into_inner)
                .measuring = true;
        }
        let received = window.receive(io.as_mut(), &mut engine)?;
        let now = monotonic_now().0;
        if received > 0 {
            engine.handle_batch(io.as_mut(), now)?;
        }
        while let Ok(request) = admin.try_recv() {
            let _ = request
                .reply
                .send(admin::apply(&mut engine.sfu, now, request.op));
        }
        if now >= next_tick {
            if let Some(f) = fanout.as_mut().filter(|_| now >= next_feedback) {
                // Media the kernel replicated keeps its source alive (read
                // a few times per idle timeout, at most once a second).
                for ssid in f.active_sources() {
                    engine.sfu.media_seen(now, ssid);
                }
                next_feedback =
                    now + (engine.sfu.config().idle_timeout_ns / 4).clamp(TICK_NS, 1_000_000_000);
            }
            tick(&mut engine, fanout.as_mut(), &live, io.stats(), now);
            next_tick = now + TICK_NS;
        }
    }
    // Closes the recorder's channel: it drains what is queued and ends.
    let (wall, cpu) = window.end(io.as_mut(), &mut engine)?;
    let mode = match &fanout {
        Some(_) => format!("{} + in-kernel fan-out (tcx)", io.describe()),
        None => io.describe(),
    };
    let baseline = &window.baseline;
    // Every counter over the measured window only (review B4).
    let fanout = match (
        fanout.as_ref().map(|fanout| fanout.stats()),
        baseline.fanout,
    ) {
        (Some(end), Some(start)) => Some(end.since(&start)),
        (end, _) => end,
    };
    Ok(EngineEnd {
        measured: engine.measured(baseline),
        io: io.stats().since(&baseline.io),
        fanout,
        sfu: engine.sfu.stats(),
        srpic: engine.srpic.as_ref().map(Srpic::stats),
        mode,
        cpu,
        wall,
        spin_s: window.spin_ns as f64 / 1e9,
        placement,
        placement_refused,
        engines: Vec::new(),
        control: None,
    })
}

/// This thread's CPU time since `start`.
fn cpu_since(start: Option<CpuTime>) -> Option<CpuTime> {
    // CPU time unknown (getrusage failed at either end): n/a, never 0.
    match (start, host::thread_cpu_time().ok()) {
        (Some(start), Some(end)) => Some(end.since(&start)),
        _ => None,
    }
}

/// What the engine thread (or the control thread, summing the engines')
/// hands back when it stops: every counter over the measured window, but
/// the core's (`sfu`), which stays whole-run.
struct EngineEnd {
    measured: engine::Measured,
    io: IoStats,
    fanout: Option<ringway_io::backend::FanoutStats>,
    sfu: SfuStats,
    srpic: Option<SrpicStats>,
    mode: String,
    cpu: Option<CpuTime>,
    wall: f64,
    spin_s: f64,
    placement: Vec<String>,
    placement_refused: Vec<String>,
    engines: Vec<EngineReport>,
    control: Option<ControlCounters>,
}

/// One receive call; per-peer errors are counted and skipped.
fn receive<F: engine::Forwarding>(
    io: &mut dyn BatchIo,
    e: &mut Engine<F>,
    timeout: Option<Duration>,
) -> Result<usize, ServerError> {
    match io.recv_batch(&mut e.rx, timeout) {
        Ok(n) => Ok(n),
        Err(err) if host::transient(&err) => {
            e.rx_errors += 1;
            Ok(0)
        }
        Err(err) => Err(err.into()),
    }
}

/// 128 bits from the operating system's random source (the core's key for
/// tokens and cookie secrets).
fn random_seed() -> Result<u128, ServerError> {
    let bytes = crate::host::random_bytes()
        .map_err(|e| ServerError::Config(format!("reading /dev/urandom for the SFU's key: {e}")))?;
    Ok(u128::from_ne_bytes(bytes))
}

fn report(
    config: &SfuServerConfig,
    bound: SocketAddr,
    batch: usize,
    end: EngineEnd,
) -> ServeReport {
    let EngineEnd {
        measured,
        io,
        fanout,
        sfu,
        srpic,
        mode,
        cpu,
        wall,
        spin_s,
        placement,
        placement_refused,
        engines,
        control,
    } = end;
    let pct = |ns: Option<u64>| match ns {
        Some(ns) if wall > 0.0 => 100.0 * ns as f64 / 1e9 / wall,
        _ => f64::NAN,
    };
    let delays = &measured.delays;
    ServeReport {
        backend: config.io.kind().name().into(),
        io_mode: mode,
        batch,
        flush: config.flush_policy(),
        listen: bound.to_string(),
        warmup_s: config.warmup_s,
        wall_s: wall,
        cpu,
        cpu_user_pct: pct(cpu.map(|c| c.user_ns)),
        cpu_system_pct: pct(cpu.map(|c| c.system_ns)),
        spin_s,
        placement,
        placement_refused,
        delay: LatencySummary::of_ns(&delays.scheduled),
        delay_mean_us: if delays.scheduled.is_empty() {
            f64::NAN
        } else {
            delays.scheduled.mean() / 1000.0
        },
        delay_handoff: LatencySummary::of_ns(&delays.handoff),
        delay_wait: LatencySummary::of_ns(&delays.wait),
        delay_from_kernel: LatencySummary::of_ns(&delays.kernel),
        flushes: measured.flushes,
        kernel_fanout: fanout,
        tx_congested: io.tx_ring_full_drops > 0
            || io.tx_ring_full_waits as f64 > 0.001 * measured.forwarded.max(1) as f64,
        copies_per_packet: if measured.forwarded > 0 {
            measured.copies as f64 / measured.forwarded as f64
        } else {
            f64::NAN
        },
        sfu,
        io,
        rx_bytes: measured.rx_bytes,
        tx_bytes: measured.tx_bytes,
        truncated: measured.truncated,
        rx_errors: measured.rx_errors,
        srpic,
        recording: None,
        engines,
        control,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ringway_io::XdpInterface;
    use std::net::UdpSocket;

    fn loopback() -> SfuServerConfig {
        SfuServerConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            ..SfuServerConfig::default()
        }
    }

    /// Wait (bounded) until `f` holds.
    fn until(what: &str, mut f: impl FnMut() -> bool) {
        let t = Instant::now();
        while !f() {
            assert!(t.elapsed() < Duration::from_secs(10), "{what}");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    #[test]
    fn kernel_fanout_only_where_it_can_work() {
        let fanout = |listen: &str, backend| SfuServerConfig {
            listen: listen.parse().unwrap(),
            io: Io::new(
                backend,
                (backend == BackendKind::Xdp).then(|| XdpInterface::new("veth0")),
            )
            .unwrap(),
            kernel_fanout: Some("veth0".into()),
            ..SfuServerConfig::default()
        };
        for listen in ["10.0.0.1:5000", "[fd77::1]:5000"] {
            assert!(fanout(listen, BackendKind::Socket).validate().is_ok());
        }
        for (config, why) in [
            (
                fanout("0.0.0.0:5000", BackendKind::Socket),
                "concrete address",
            ),
            (fanout("[::]:5000", BackendKind::Socket), "concrete address"),
            (fanout("10.0.0.1:5000", BackendKind::Xdp), "xdp backend"),
        ] {
            let error = config.validate().unwrap_err().to_string();
            assert!(error.contains(why), "{error}");
        }
    }

    #[test]
    fn handle_serves_reports_and_releases_its_socket() {
        let server = SfuServer::start(loopback()).unwrap();
        let addr = server.local_addr();
        assert_ne!(addr.port(), 0);
        // The port is held while the engine runs.
        assert!(UdpSocket::bind(addr).is_err());
        let peer = UdpSocket::bind("127.0.0.1:0").unwrap();
        for _ in 0..3 {
            peer.send_to(b"not pktswitch", addr).unwrap();
        }
        until("3 datagrams seen", || server.live().sfu.rx_datagrams == 3);
        assert!(!server.is_finished());
        let r = server.shutdown().unwrap();
        assert_eq!(r.sfu.rx_datagrams, 3);
        assert_eq!(r.sfu.drop_malformed, 3);
        assert_eq!(r.listen, addr.to_string());
        assert!(r.cpu.is_some() && r.cpu_user_pct.is_finite());
        assert!(r.placement.is_empty() && r.placement_refused.is_empty());
        UdpSocket::bind(addr).expect("the port is free after shutdown");
    }

    /// Review B4: what arrived during the warm-up is not in the report's
    /// counters (bytes, backend counters), only what came after it; the
    /// live counters stay cumulative.
    #[test]
    fn report_counters_start_at_the_end_of_the_warm_up() {
        let server = SfuServer::start(SfuServerConfig {
            warmup_s: 0.3,
            ..loopback()
        })
        .unwrap();
        let addr = server.local_addr();
        let peer = UdpSocket::bind("127.0.0.1:0").unwrap();
        // Before the warm-up ends (it cannot have: nothing was measured yet).
        for _ in 0..5 {
            peer.send_to(b"warm-up datagram", addr).unwrap();
        }
        until("5 datagrams seen", || server.live().io.rx_packets == 5);
        let warm_up_ended = server.live().measuring;
        until("the warm-up over", || server.live().measuring);
        for _ in 0..2 {
            peer.send_to(b"measured", addr).unwrap();
        }
        until("7 datagrams seen", || server.live().io.rx_packets == 7);
        let live = server.live();
        let r = server.shutdown().unwrap();
        if warm_up_ended {
            // The engine was descheduled for the whole warm-up: the first
            // five may have been counted after it.
            ringway_io::testing::skip("the warm-up ended before its datagrams were seen");
            return;
        }
        assert_eq!(
            live.rx_bytes,
            5 * 16 + 2 * 8,
            "live counters are cumulative"
        );
        assert_eq!(r.io.rx_packets, 2);
        assert_eq!(r.rx_bytes, 2 * 8);
        assert!(r.io.tx_packets <= r.sfu.acks + r.sfu.errors_sent + r.sfu.challenges);
    }

    #[test]
    fn dropping_the_handle_stops_the_engine() {
        let server = SfuServer::start(loopback()).unwrap();
        let addr = server.local_addr();
        assert!(UdpSocket::bind(addr).is_err());
        drop(server);
        // The engine thread owned the socket: it is closed once it ended.
        UdpSocket::bind(addr).expect("the port is free after drop");
    }

    #[test]
    fn the_engine_stops_after_its_duration() {
        let server = SfuServer::start(SfuServerConfig {
            duration_s: Some(0.2),
            ..loopback()
        })
        .unwrap();
        until("engine ended after 0.2 s", || server.is_finished());
        let r = server.shutdown().unwrap();
        assert!(r.wall_s >= 0.15, "{}", r.wall_s);
    }

    #[test]
    fn refused_pinning_is_reported() {
        // CPU 1023 does not exist here: the kernel refuses the affinity.
        let server = SfuServer::start(SfuServerConfig {
            cpus: Some(vec![1023]),
            ..loopback()
        })
        .unwrap();
        let r = server.shutdown().unwrap();
        assert_eq!(r.placement.len(), 1, "{:?}", r.placement);
        assert_eq!(r.placement_refused, r.placement);
    }
}
