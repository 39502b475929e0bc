//! `ringway sip proxy`: command-line front end of
//! [`ringway_server::sip::SipServer`] (the multi-threaded SIP
//! proxy/registrar): options → [`SipServerConfig`], Prometheus text on
//! `--metrics`, the JSON summary on exit (schema in docs/sip-proxy.md).

use super::{manage, serving};
use anyhow::Context;
use ringway_io::thread::{Placement, Policy};
use ringway_io::{Io, IoChoiceError, XdpInterface};
use ringway_server::host;
use ringway_server::sip::location::Location;
pub(crate) use ringway_server::sip::RxModel;
use ringway_server::sip::{SipServer, SipServerConfig};
use ringway_sip::auth::Algorithm;
use ringway_sip::TransportAddr;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

/// Proxy operating mode.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ModeArg {
    /// Forward without transaction state.
    Stateless,
    /// Transaction-stateful (100 Trying, retransmissions, timers).
    Stateful,
}

/// A feature switched on or off.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum OnOff {
    /// On.
    On,
    /// Off.
    Off,
}

/// Scheduling policy of the worker threads.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum PolicyArg {
    /// SCHED_OTHER (CFS/EEVDF).
    Other,
    /// SCHED_BATCH (fair class, no wakeup preemption of others).
    Batch,
    /// SCHED_FIFO (real time).
    Fifo,
    /// SCHED_RR (real time, round robin).
    Rr,
}

/// Digest algorithm offered in challenges.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum AlgorithmArg {
    /// SHA-256 (RFC 7616, RFC 8760).
    #[value(name = "sha-256")]
    Sha256,
    /// MD5 (what Debian's SIPp and sipsak speak).
    #[value(name = "md5")]
    Md5,
}

/// Arguments of `ringway sip proxy`.
#[derive(clap::Args, Debug, Clone)]
pub struct ProxyArgs {
    /// Read options from this TOML file (table [sip.proxy]; see
    /// docs/ringway.toml); options on the command line override it.
    #[arg(long, value_hint = clap::ValueHint::FilePath)]
    pub config: Option<PathBuf>,
    /// Address to listen on, with its transport: `udp:ADDR` (or a bare ADDR), `tcp:ADDR`, `tls:ADDR`,
    /// `ws:ADDR` or `wss:ADDR` (port 0: the UDP port). Repeatable: one UDP address (the last given wins) and others.
    #[arg(long, default_value = "127.0.0.1:5060", value_parser = parse_transport_addr)]
    pub listen: Vec<TransportAddr>,
    /// Stateless or transaction-stateful proxying.
    #[arg(long, value_enum, default_value_t = ModeArg::Stateless)]
    pub mode: ModeArg,
    /// Worker threads.
    #[arg(long, default_value_t = 1)]
    pub workers: usize,
    /// Send every request not addressed elsewhere to this next hop: ADDR (UDP), `tcp:ADDR`, `tls:ADDR`,
    /// `ws:ADDR[/path]` or `wss:ADDR[/path]` (a WebSocket client connection, RFC 7118), or a name:
    /// `[tcp:|tls:]HOST` (NAPTR/SRV) or `HOST:PORT` (A/AAAA), resolved per request from the DNS cache
    /// (RFC 3263; stateful mode fails over to the next target).
    #[arg(long)]
    pub route_to: Option<ringway_server::dns::TransportNextHop>,
    /// Nameserver for names, IP:PORT (default: the first of /etc/resolv.conf). Given, Request-URI and
    /// Route hosts that are names are resolved too, where the relay policy allows them.
    #[arg(long)]
    pub dns_server: Option<std::net::SocketAddr>,
    /// Connection transports: TCP bounds, TLS, WebSocket origins.
    #[command(flatten)]
    pub connections: super::sip_connections::ConnectionArgs,
    /// Relay requests to these destinations without authentication: `none`, `any`, or networks
    /// `CIDR,...` (loopback, link-local and our own IP only when named, e.g. 127.0.0.0/8).
    #[arg(long, default_value = "none", value_parser = parse_relay)]
    pub relay: ringway_sip::RelayNets,
    /// Act as registrar for the served domains (REGISTER → location service).
    #[arg(long)]
    pub registrar: bool,
    /// Do not insert Record-Route (in-dialog requests then bypass the proxy).
    #[arg(long)]
    pub no_record_route: bool,
    /// NAT handling: `on` binds a UDP registration to the address and port it came from (its
    /// flow) and routes calls and in-dialog requests there; `off` uses the Contact address only.
    #[arg(long, value_enum, default_value_t = OnOff::On)]
    pub nat: OnOff,
    /// Flow-Timer (s) in the 200 to a REGISTER asking for outbound (RFC 5626): the keepalive
    /// interval asked of the phone (0: none).
    #[arg(long, default_value_t = ringway_server::sip::DEFAULT_FLOW_TIMER_S)]
    pub flow_timer: u32,
    /// Keepalives towards UDP bindings behind NAT: an OPTIONS to each binding's flow every N
    /// seconds (0: off); a flow that leaves --keepalive-failures in a row unanswered is dead and
    /// its bindings are removed (TCP/TLS/WS bindings go when their connection closes).
    #[arg(long, default_value_t = 0)]
    pub keepalive_interval: u64,
    /// Unanswered keepalives in a row after which a UDP flow is dead.
    #[arg(long, default_value_t = 3)]
    pub keepalive_failures: u32,
    /// Keepalives sent per second at most (all bindings together).
    #[arg(long, default_value_t = 500)]
    pub keepalive_rate: u32,
    /// Serve Prometheus text on http://ADDR/metrics (loopback only unless --metrics-public).
    #[arg(long)]
    pub metrics: Option<SocketAddr>,
    /// Allow --metrics on a non-loopback address.
    #[arg(long)]
    pub metrics_public: bool,
    /// I/O backend: socket (one syscall per datagram), mmsg (recvmmsg/sendmmsg), uring (io_uring)
    /// or xdp (AF_XDP on `--interface`, one of whose addresses, IPv4 or IPv6, `--listen` must be; one worker; falls
    /// back to mmsg, saying why, where the kernel cannot run it).
    #[arg(long, default_value = "mmsg")]
    pub backend: ringway_io::BackendKind,
    /// With `--backend xdp`: the interface to attach the XDP program and the AF_XDP socket to
    /// (queue 0). Everything on it that is not UDP for the listen address and port goes on to
    /// the kernel.
    #[arg(long, visible_alias = "xdp-iface")]
    pub interface: Option<String>,
    /// With `--backend xdp`: attach the XDP program in `native` (driver) mode, `generic` (SKB)
    /// mode, or `auto` (native, else generic).
    #[arg(long, default_value = "auto", value_parser = super::sfu::serve::parse_xdp_mode)]
    pub xdp_mode: ringway_io::XdpMode,
    /// With `--backend xdp`: UMEM frames, a power of two (half on the fill ring).
    #[arg(long, default_value_t = 4096)]
    pub xdp_frames: u32,
    /// Receive model.
    #[arg(long, value_enum, default_value_t = RxModel::Reuseport)]
    pub rx_model: RxModel,
    /// Requested SO_RCVBUF per socket (bytes).
    #[arg(long)]
    pub rcvbuf: Option<usize>,
    /// CPUs for the workers, e.g. "0,1" or "0-3" (worker i gets the i-th, round robin).
    #[arg(long)]
    pub cpus: Option<String>,
    /// Scheduling policy of the workers.
    #[arg(long, value_enum)]
    pub policy: Option<PolicyArg>,
    /// Real-time priority (with --policy fifo|rr).
    #[arg(long)]
    pub priority: Option<i32>,
    /// Nice value of the workers (SCHED_OTHER).
    #[arg(long, allow_hyphen_values = true)]
    pub nice: Option<i32>,
    /// EEVDF time slice request in µs (sched_attr.sched_runtime).
    #[arg(long)]
    pub slice_us: Option<u64>,
    /// Request a kernel TX timestamp for every Nth sent datagram (0 = never).
    #[arg(long, default_value_t = 64)]
    pub tx_stamp_every: u64,
    /// Stop after this many seconds (otherwise on SIGINT/SIGTERM).
    #[arg(long)]
    pub duration: Option<f64>,
    /// Also write the JSON summary to this file.
    #[arg(long)]
    pub summary: Option<PathBuf>,
    /// Do not print the JSON summary to stdout.
    #[arg(long)]
    pub quiet: bool,
    /// Transaction table bound; beyond it new requests get 503 Retry-After.
    #[arg(long, default_value_t = 100_000)]
    pub max_transactions: usize,
    /// Bytes the transaction table may hold (kept requests and responses included); beyond it as beyond --max-transactions.
    #[arg(long, default_value_t = ringway_sip::DEFAULT_MAX_TRANSACTION_BYTES)]
    pub max_transaction_bytes: usize,
    /// Registrar (memory store): most bindings held (more: 503).
    #[arg(long, default_value_t = 100_000)]
    pub max_bindings: usize,
    /// Registrar (memory store): most bytes of bindings held, Path values included (more: 503).
    #[arg(long, default_value_t = 64 << 20)]
    pub max_binding_bytes: usize,
    /// Registrar: most bytes of Path values in one REGISTER (more: 400).
    #[arg(long, default_value_t = ringway_sip::DEFAULT_MAX_PATH_BYTES)]
    pub max_path_bytes: usize,
    /// Domain served by this proxy/registrar (repeatable).
    #[arg(long = "domain")]
    pub domains: Vec<String>,
    /// Datagrams per receive batch.
    #[arg(long, default_value_t = 32)]
    pub batch: usize,
    /// Receive coalescing (as a NIC's rx-usecs; 0: off): after a receive that brought less than a batch while datagrams come at two or more per window, a worker sleeps this many µs before receiving again, so one wake-up handles several; each datagram may wait that much longer (K_rcv). 1..=100000.
    #[arg(long, default_value_t = 0, value_name = "US")]
    pub rx_coalesce_us: u64,
    /// Registrar: shortest registration accepted (s); shorter ones get 423 Interval Too Brief.
    #[arg(long, default_value_t = 60)]
    pub min_expires: u32,
    /// Registrar: longest registration granted (s); longer requests are shortened.
    #[arg(long, default_value_t = 86400)]
    pub max_expires: u32,
    /// Registrar: lifetime of a registration that asks for none (s).
    #[arg(long, default_value_t = 3600)]
    pub default_expires: u32,
    /// Registrar: most contacts bound to one address-of-record (more: 403).
    #[arg(long, default_value_t = 16)]
    pub max_contacts: usize,
    /// Digest authentication: REGISTER challenged with 401, other requests from the served domains with 407.
    #[arg(long)]
    pub auth: bool,
    /// Credentials for --auth: `user:realm:HA1` lines (htdigest; 32 hex digits MD5, 64 SHA-256).
    #[arg(long, value_hint = clap::ValueHint::FilePath)]
    pub auth_file: Option<PathBuf>,
    /// A file with the secret nonces are signed with (≥ 16 bytes), the same for every proxy behind a dispatcher: a challenge from one is answered at another (default: a random key per process; re-read on reload; never logged).
    #[arg(long, value_hint = clap::ValueHint::FilePath)]
    pub auth_secret_file: Option<PathBuf>,
    /// Realm of every challenge (default: the domain of the AOR / From).
    #[arg(long)]
    pub auth_realm: Option<String>,
    /// Algorithms offered, most preferred first (repeatable; SIPp needs md5 first).
    #[arg(long = "auth-algorithm", value_enum, default_values_t = [AlgorithmArg::Sha256, AlgorithmArg::Md5])]
    pub auth_algorithms: Vec<AlgorithmArg>,
    /// How long a nonce may be used (s); then stale=true.
    #[arg(long, default_value_t = 300)]
    pub nonce_lifetime: u64,
    /// Flood limit: requests per window from one source address (default: no limit).
    #[arg(long)]
    pub flood_limit: Option<u32>,
    /// Flood limit window (ms).
    #[arg(long, default_value_t = 2000)]
    pub flood_window_ms: u64,
    /// Sources the flood limiter tracks at most.
    #[arg(long, default_value_t = 16384)]
    pub flood_table_size: usize,
    /// Source address never flood-limited (repeatable).
    #[arg(long = "flood-exempt")]
    pub flood_exempt: Vec<std::net::IpAddr>,
    /// Flood limit: IPv6 sources are counted per prefix of this many bits (a host owns a /64).
    #[arg(long, default_value_t = 64)]
    pub flood_ipv6_prefix: u8,
    /// Location store: `memory`, or `redis://HOST:PORT/DB` shared by several proxies (Redis or Valkey).
    #[arg(long, default_value = "memory", value_parser = LocationParser)]
    pub location: Location,
    /// Longest wait for the shared location store, per command and in its queue (ms).
    #[arg(long, default_value_t = 200)]
    pub location_timeout_ms: u64,
    /// Store threads (one connection each) for a shared location store.
    #[arg(long, default_value_t = 2)]
    pub location_threads: usize,
    /// Requests waiting for the shared location store at most (more: 500 / 480 at once).
    #[arg(long, default_value_t = 1024)]
    pub location_queue: usize,
    /// Overload: a new INVITE that waited longer than this in the receive queue gets 503 + Retry-After before any state (0: off).
    #[arg(long, default_value_t = ringway_server::sip::DEFAULT_OVERLOAD_QUEUE_DELAY_MS)]
    pub overload_queue_delay_ms: u64,
    /// RFC 7339 overload control (loss-based) while shedding: a client whose Via carries `oc` is told the share of new calls to refuse itself (on, off).
    #[arg(long, default_value = "on", value_parser = ["on", "off"])]
    pub overload_control: String,
    /// Lab and test knob, not for service: pin the overload controller's admitted fraction (millionths) instead of following the queue.
    #[arg(long, hide = true, value_name = "PPM")]
    pub overload_pinned_admit_ppm: Option<u32>,
    /// Management API (docs/operations.md).
    #[command(flatten)]
    pub manage: super::manage::ManageArgs,
    /// Graceful drain on SIGTERM (docs/operations.md).
    #[command(flatten)]
    pub drain: super::manage::DrainArgs,
    /// Log format and levels.
    #[command(flatten)]
    pub log: crate::logging::LogArgs,
    /// Lab emulation, off by default: CPU work per handled message (µs):
    /// N or const:N, or exp:N (exponential, mean N). Brings T_sip into the
    /// papers' OpenSIPS range (77–540 µs); not for service.
    #[arg(long, value_name = "DIST")]
    pub emulated_service_us: Option<ringway_server::sip::service::ServiceTime>,
}

/// `--location`: parsed once, here (a malformed URL stops the start). Its
/// errors never repeat the value (it may hold the Redis password; clap's
/// own "invalid value" message would print it).
#[derive(Clone)]
struct LocationParser;

impl clap::builder::TypedValueParser for LocationParser {
    type Value = Location;

    fn parse_ref(
        &self,
        cmd: &clap::Command,
        _arg: Option<&clap::Arg>,
        value: &std::ffi::OsStr,
    ) -> Result<Location, clap::Error> {
        let refuse = |message: String| {
            clap::Error::raw(
                clap::error::ErrorKind::ValueValidation,
                format!("--location: {message}\n"),
            )
            .with_cmd(cmd)
        };
        let text = value.to_str().ok_or_else(|| refuse("not UTF-8".into()))?;
        text.parse().map_err(refuse)
    }
}

/// `--listen`, `--route-to`: `[udp:|tcp:]ADDR`.
pub(crate) fn parse_transport_addr(text: &str) -> Result<TransportAddr, String> {
    text.parse()
}

/// `--relay`: `none`, `any` or `CIDR,...`.
pub(crate) fn parse_relay(text: &str) -> Result<ringway_sip::RelayNets, String> {
    text.parse()
}

/// The configuration a command line describes, with the checks only the
/// front end can make (options that need each other, `--metrics`). The
/// server validates the rest once, when it starts ([`SipServer::start`]),
/// or `ringway config check` calls [`SipServerConfig::validate`].
impl TryFrom<&ProxyArgs> for SipServerConfig {
    type Error = anyhow::Error;

    fn try_from(args: &ProxyArgs) -> anyhow::Result<SipServerConfig> {
        serving::check_common_options(args.duration, args.metrics, args.metrics_public)?;
        // The one place "xdp needs an interface" is checked: from here on
        // the backend carries its interface.
        let interface = args.interface.as_ref().map(|iface| XdpInterface {
            mode: args.xdp_mode,
            frames: args.xdp_frames,
            ..XdpInterface::new(iface)
        });
        let io = Io::new(args.backend, interface).map_err(|e| match e {
            IoChoiceError::NeedsInterface => {
                anyhow::anyhow!("--backend xdp needs an interface: use --interface")
            }
            IoChoiceError::InterfaceWithoutXdp(_) => {
                anyhow::anyhow!("--interface needs --backend xdp")
            }
        })?;
        let (udp, listeners) = super::sip_connections::split_listen(&args.listen, "proxy")?;
        Ok(SipServerConfig {
            listen: udp,
            listeners,
            tcp: args.connections.tcp_config(),
            tls: args.connections.tls_config(),
            ws_origins: args.connections.ws_origins.clone(),
            mode: match args.mode {
                ModeArg::Stateless => ringway_sip::Mode::Stateless,
                ModeArg::Stateful => ringway_sip::Mode::Stateful,
            },
            workers: args.workers,
            route_to: args.route_to.as_ref().and_then(|to| match to.hop {
                ringway_server::dns::NextHop::Addr(addr) => Some(TransportAddr {
                    transport: to.transport,
                    addr,
                }),
                ringway_server::dns::NextHop::Name { .. } => None,
            }),
            route_to_path: args.route_to.as_ref().and_then(|to| to.path.clone()),
            route_to_name: args
                .route_to
                .clone()
                .filter(|to| matches!(to.hop, ringway_server::dns::NextHop::Name { .. })),
            dns_server: args.dns_server,
            dns_pending: ringway_server::sip::PendingLimits::default(),
            relay: args.relay.clone(),
            registrar: args.registrar,
            record_route: !args.no_record_route,
            nat: args.nat == OnOff::On,
            flow_timer_s: args.flow_timer,
            keepalive_interval: (args.keepalive_interval > 0)
                .then(|| Duration::from_secs(args.keepalive_interval)),
            keepalive_failures: args.keepalive_failures,
            keepalive_rate: args.keepalive_rate,
            io,
            rx_model: args.rx_model,
            rcvbuf: args.rcvbuf,
            placement: placement(args)?,
            tx_stamp_every: args.tx_stamp_every,
            max_transactions: args.max_transactions,
            max_transaction_bytes: args.max_transaction_bytes,
            max_bindings: args.max_bindings,
            max_binding_bytes: args.max_binding_bytes,
            max_path_bytes: args.max_path_bytes,
            domains: args.domains.clone(),
            batch: args.batch,
            rx_coalesce: (args.rx_coalesce_us > 0)
                .then(|| Duration::from_micros(args.rx_coalesce_us)),
            min_expires: args.min_expires,
            max_expires: args.max_expires,
            default_expires: args.default_expires,
            max_contacts: args.max_contacts,
            auth: args.auth,
            auth_file: args.auth_file.clone(),
            auth_secret_file: args.auth_secret_file.clone(),
            auth_realm: args.auth_realm.clone(),
            auth_algorithms: args
                .auth_algorithms
                .iter()
                .map(|algorithm| match algorithm {
                    AlgorithmArg::Sha256 => Algorithm::Sha256,
                    AlgorithmArg::Md5 => Algorithm::Md5,
                })
                .collect(),
            nonce_lifetime: Duration::from_secs(args.nonce_lifetime),
            flood_limit: args.flood_limit,
            flood_window: Duration::from_millis(args.flood_window_ms),
            flood_table_size: args.flood_table_size,
            flood_exempt: args.flood_exempt.clone(),
            flood_ipv6_prefix: args.flood_ipv6_prefix,
            location: args.location.clone(),
            location_timeout: Duration::from_millis(args.location_timeout_ms),
            location_threads: args.location_threads,
            location_queue: args.location_queue,
            overload_queue_delay: (args.overload_queue_delay_ms > 0)
                .then(|| Duration::from_millis(args.overload_queue_delay_ms)),
            overload_control: args.overload_control == "on",
            overload_pinned_admit_ppm: args.overload_pinned_admit_ppm,
            emulated_service: args.emulated_service_us,
        })
    }
}

/// The workers' placement: `--cpus`, `--policy` with `--priority`,
/// `--nice`, `--slice-us`.
fn placement(args: &ProxyArgs) -> anyhow::Result<Placement> {
    if let Some(priority) = args.priority {
        anyhow::ensure!(
            matches!(args.policy, Some(PolicyArg::Fifo | PolicyArg::Rr)),
            "--priority needs --policy fifo or rr"
        );
        anyhow::ensure!((1..=99).contains(&priority), "--priority must be 1..=99");
    }
    let priority = args.priority.unwrap_or(1).clamp(1, 99) as u8;
    let cpus = match &args.cpus {
        Some(list) => Some(host::parse_cpu_list(list).context("--cpus")?),
        None => None,
    };
    Ok(Placement {
        cpus,
        policy: args.policy.map(|policy| match policy {
            PolicyArg::Other => Policy::Other,
            PolicyArg::Batch => Policy::Batch,
            PolicyArg::Fifo => Policy::Fifo(priority),
            PolicyArg::Rr => Policy::Rr(priority),
        }),
        nice: args.nice,
        slice: args.slice_us.map(Duration::from_micros),
    })
}

/// The configuration of `args`, validated (what `ringway config check`
/// asks); errors point at `--help`.
pub(crate) fn checked_config(args: &ProxyArgs) -> anyhow::Result<SipServerConfig> {
    let config = SipServerConfig::try_from(args)?;
    config
        .validate()
        .map_err(|e| serving::with_help("sip proxy", e))?;
    Ok(config)
}

/// Run the proxy until SIGINT, `--duration`, or the end of a drain
/// (SIGTERM, `ringway ctl drain`), reloading on SIGHUP; then print the
/// summary.
pub(crate) fn run(a: ProxyArgs) -> anyhow::Result<()> {
    a.log.apply();
    a.manage.validate()?;
    a.drain.validate()?;
    anyhow::ensure!(
        !a.drain.drain_dialogs || matches!(a.mode, ModeArg::Stateful),
        "--drain-dialogs needs --mode stateful (a stateless proxy keeps no dialogs)"
    );
    let config = SipServerConfig::try_from(&a)?;
    let signals = host::control_signals()?;
    // Validated once, here.
    let server = SipServer::start(config).map_err(|e| serving::with_help("sip proxy", e))?;
    let control = server.control();
    let reload = manage::proxy_reloader(control.clone());
    let endpoints = serving::Endpoints::start(
        "sip proxy",
        "sip-metrics",
        a.metrics,
        server.prometheus(),
        &a.manage,
        ringway_server::manage::Managed::Proxy(control.clone(), reload.clone()),
    )?;
    log::info!(
        "sip proxy: listening on udp {}{} mode={:?} workers={} rx-model={:?} backend={} rcvbuf={:?} auth={} relay={} flood-limit={} location={}",
        server.local_addr(),
        server
            .stream_addresses()
            .iter()
            .map(|a| format!(" {a}"))
            .collect::<String>(),
        a.mode,
        a.workers,
        a.rx_model,
        server.io_in_use().description,
        server.rcvbuf_granted(),
        if a.auth { "on" } else { "off" },
        a.relay,
        a.flood_limit.map_or("off".to_string(), |l| format!("{l}/{}ms", a.flood_window_ms)),
        a.location,
    );
    let ending = manage::run_proxy(&signals, &control, &reload, &a.drain, a.duration, || {
        !server.panicked_threads().is_empty()
    });
    let summary = endpoints.stop_around(|| server.shutdown());
    serving::conclude(
        &summary,
        &summary.threads_panicked,
        a.summary.as_deref(),
        a.quiet,
        "proxy",
    )?;
    if let manage::Ending::DrainTimedOut(left) = ending {
        anyhow::bail!("drain deadline passed with {left} transaction(s) in flight");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_bad_arguments() {
        let parse = crate::cmd::parse_args::<ProxyArgs>;
        let valid = |args: &[&str]| checked_config(&parse(args).unwrap()).is_ok();
        assert!(valid(&[]));
        for bad in [
            &["--listen", "0.0.0.0:5060"][..],
            &["--workers", "0"],
            &["--priority", "5"],
            &["--policy", "fifo", "--priority", "100"],
            &["--metrics", "192.0.2.1:9000"],
            &["--cpus", "3-1"],
            &["--duration", "0"],
            &["--nice", "25"],
            &["--location-threads", "0"],
            &["--location-timeout-ms", "0"],
            &["--backend", "xdp"],
            &["--interface", "veth0"],
            &["--backend", "xdp", "--interface", "veth0", "--workers", "2"],
            &[
                "--backend",
                "xdp",
                "--interface",
                "veth0",
                "--xdp-frames",
                "100",
            ],
            &["--flood-window-ms", "0"],
            &["--overload-queue-delay-ms", "10001"],
            &["--rx-coalesce-us", "100001"],
            &[
                "--rx-coalesce-us",
                "30000",
                "--overload-queue-delay-ms",
                "100",
            ],
        ] {
            assert!(!valid(bad), "{bad:?} accepted");
        }
        assert_eq!(
            checked_config(&parse(&["--rx-coalesce-us", "200"]).unwrap())
                .unwrap()
                .rx_coalesce,
            Some(Duration::from_micros(200))
        );
        assert!(valid(&[
            "--rx-coalesce-us",
            "25000",
            "--overload-queue-delay-ms",
            "100"
        ]));
        // 0 is "off", not a zero delay.
        assert_eq!(
            checked_config(&parse(&["--overload-queue-delay-ms", "0"]).unwrap())
                .unwrap()
                .overload_queue_delay,
            None
        );
        assert!(parse(&["--relay", "127.0.0.0/33"]).is_err());
        assert!(valid(&["--relay", "any"]));
        assert_eq!(
            parse(&["--relay", "127.0.0.0/8,192.0.2.7"])
                .unwrap()
                .relay
                .to_string(),
            "127.0.0.0/8,192.0.2.7/32"
        );
        for malformed in [
            "redis://",
            "redis://127.0.0.1:0/0",
            "redis://127.0.0.1:6379/x",
            "rediss://127.0.0.1:6379/0",
            "postgres://127.0.0.1/0",
        ] {
            assert!(
                parse(&["--location", malformed]).is_err(),
                "{malformed} accepted"
            );
        }
        // Review S22: the error names the option, never the password.
        let error = parse(&["--location", "redis://:hunter2@127.0.0.1:0/0"])
            .unwrap_err()
            .to_string();
        assert!(error.contains("--location"), "{error}");
        assert!(!error.contains("hunter2"), "{error}");
        assert!(valid(&["--location", "redis://127.0.0.1:6379/0"]));
        assert!(valid(&["--metrics", "192.0.2.1:9000", "--metrics-public"]));
    }

    #[test]
    fn a_websocket_next_hop_needs_its_listener() {
        let parse = crate::cmd::parse_args::<ProxyArgs>;
        let check = |args: &[&str]| checked_config(&parse(args).unwrap());
        let ws = [
            "--listen",
            "127.0.0.1:5060",
            "--listen",
            "ws:127.0.0.1:8080",
        ];
        let with = |extra: &[&'static str]| -> Vec<&'static str> {
            ws.iter().chain(extra).copied().collect()
        };
        let config = check(&with(&["--route-to", "ws:127.0.0.5:8080/sip"])).unwrap();
        assert_eq!(config.route_to.unwrap().to_string(), "ws:127.0.0.5:8080");
        assert_eq!(config.route_to_path.as_deref(), Some("/sip"));
        assert!(check(&with(&["--route-to", "ws:127.0.0.5:8080"])).is_ok());
        // The core's Via and Record-Route name our ws listen address: one
        // line saying what is missing.
        let error = format!(
            "{:#}",
            check(&["--route-to", "ws:127.0.0.5:8080"]).unwrap_err()
        );
        assert!(
            error.contains("route_to ws:127.0.0.5:8080 needs a ws listen address"),
            "{error}"
        );
        for bad in [
            // wss: its listener and a CA to verify the upstream.
            with(&["--route-to", "wss:127.0.0.5:443"]),
            // No DNS for WebSocket next hops.
            with(&["--route-to", "ws:gw.example.net:8080"]),
        ] {
            assert!(check(&bad).is_err(), "{bad:?} accepted");
        }
        // A path only after ws: or wss:, and only visible ASCII.
        assert!(parse(&["--route-to", "tcp:127.0.0.5:5060/sip"]).is_err());
        assert!(parse(&["--route-to", "ws:127.0.0.5:80/a\r\nX: y"]).is_err());
    }
}
