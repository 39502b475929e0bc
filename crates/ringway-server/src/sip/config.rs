//! The server's configuration: [`SipServerConfig`] (plain data, built by
//! the front ends), its one validation and its one conversion into the
//! core's [`ProxyConfig`].

use super::location::Location;
use super::service;
use super::tcp::TcpConfig;
use super::tls::TlsConfig;
use crate::ServerError;
use ringway_io::thread::Placement;
use ringway_io::Io;
use ringway_sip::auth::{Algorithm, HtdigestCredentials, NonceKey};
use ringway_sip::{
    AuthConfig, FloodConfig, Mode, ProxyConfig, RegistrarPolicy, RelayNets, Transport,
    TransportAddr,
};
use serde::{Deserialize, Serialize};
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

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
    /// its transport (`tcp:ADDR` needs a TCP listener, `ws:ADDR` a ws
    /// listener; a bare address is UDP).
    pub route_to: Option<TransportAddr>,
    /// The resource name (`/sip`) of the WebSocket connection to a `ws:`
    /// or `wss:` `route_to` (default `/`).
    pub route_to_path: Option<String>,
    /// The next hop of `route_to` given by name instead (`[tcp:|tls:]NAME`
    /// or `NAME:PORT`): resolved per request (RFC 3263, from the DNS cache
    /// while its TTLs last), each address checked by the relay policy, the
    /// next ones tried on failure (stateful). Not with `route_to`.
    pub route_to_name: Option<crate::dns::TransportNextHop>,
    /// The nameserver (default: the first of /etc/resolv.conf). Given, it
    /// also turns on resolving Request-URI and Route hosts that are names
    /// where the relay policy allows them.
    pub dns_server: Option<SocketAddr>,
    /// Bounds of the requests parked on names (count, bytes, wait).
    pub dns_pending: super::PendingLimits,
    /// Listening addresses of connection transports (`tcp:ADDR`), beyond
    /// the UDP `listen`. Port 0: the UDP port.
    pub listeners: Vec<TransportAddr>,
    /// Bounds of the TCP transport.
    pub tcp: TcpConfig,
    /// Certificates and bounds of the TLS transport.
    pub tls: TlsConfig,
    /// Origins WebSocket clients may connect from (`Origin`, compared
    /// without case); empty: any.
    pub ws_origins: Vec<String>,
    /// Destinations any request may be relayed to, authenticated or not
    /// (`none`: only `route_to`, bindings, signed dialogs and
    /// authenticated users' targets; `any`; or networks). Loopback,
    /// link-local and our own IP only when a network names them.
    pub relay: RelayNets,
    /// Act as registrar for the served domains.
    pub registrar: bool,
    /// Insert Record-Route (otherwise in-dialog requests bypass the proxy).
    pub record_route: bool,
    /// NAT handling (RFC 5626 flows, RFC 3581 rport): a UDP registration
    /// that came through a NAT keeps the address and port it came from,
    /// and requests to it go there (with a flow token in our
    /// Record-Route); off: to its Contact.
    pub nat: bool,
    /// `Flow-Timer` (s) in the `200` to a REGISTER that asks for outbound
    /// (RFC 5626 5.4): the keepalive interval the UA should use (0: none).
    pub flow_timer_s: u32,
    /// Keepalives towards UDP bindings behind NAT (their flows): an
    /// OPTIONS to each flow every this often (`None`: off). A flow that
    /// leaves `keepalive_failures` in a row unanswered is dead: its
    /// bindings are removed. TCP, TLS and WebSocket bindings are removed
    /// when their connection closes, keepalives or not.
    pub keepalive_interval: Option<Duration>,
    /// Unanswered keepalives in a row after which a UDP flow is dead.
    pub keepalive_failures: u32,
    /// Keepalives sent per second at most (all flows together).
    pub keepalive_rate: u32,
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
    /// Receive coalescing (as a NIC's `rx-usecs`), `None`: off. A worker
    /// whose receive brought fewer datagrams than a batch, while datagrams
    /// come at two or more per window (over the last 16 windows), sleeps
    /// this long before receiving again, so that one wake-up
    /// handles several datagrams: fewer wake-ups and send calls per
    /// message at low and middle rates, each datagram waiting up to this
    /// much longer (K_rcv). A full batch never waits. 1 µs..=100 ms, and at
    /// most a quarter of `overload_queue_delay` (the wait counts there).
    pub rx_coalesce: Option<Duration>,
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
    /// A file holding the secret digest nonces are signed with, shared by
    /// the proxies behind one dispatcher so that a challenge issued by one
    /// is answered at another (Kamailio's auth `secret`); `None`: a random
    /// key per process. At least 16 bytes (surrounding whitespace
    /// ignored); never logged; re-read on a reload.
    pub auth_secret_file: Option<PathBuf>,
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
    /// RFC 7339 overload control (loss-based): with shedding on, clients
    /// whose Via carries `oc` are told the share of new calls to refuse
    /// themselves (the controller's refused share). Default on.
    pub overload_control: bool,
    /// Lab and test knob, off by default: the admission controller's
    /// fraction pinned to this many millionths (1..=1 000 000) instead of
    /// following the queue (needs shedding on). Never for service.
    pub overload_pinned_admit_ppm: Option<u32>,
    /// Lab emulation, off by default: CPU work added to every message the
    /// core handles (T_sip includes it), to bring T_sip into the range of
    /// the papers' OpenSIPS. Never for service.
    pub emulated_service: Option<service::ServiceTime>,
}

/// Default [`SipServerConfig::flow_timer_s`]: under the 30 s many NATs
/// keep an idle UDP mapping (RFC 5626 4.4.1 asks UAs for 24-29 s on UDP).
pub const DEFAULT_FLOW_TIMER_S: u32 = 29;

impl Default for SipServerConfig {
    fn default() -> Self {
        SipServerConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], 5060)),
            mode: Mode::Stateless,
            workers: 1,
            route_to: None,
            route_to_path: None,
            route_to_name: None,
            dns_server: None,
            dns_pending: super::PendingLimits::default(),
            listeners: Vec::new(),
            tcp: TcpConfig::default(),
            tls: TlsConfig::default(),
            ws_origins: Vec::new(),
            relay: RelayNets::None,
            registrar: false,
            record_route: true,
            nat: true,
            flow_timer_s: DEFAULT_FLOW_TIMER_S,
            keepalive_interval: None,
            keepalive_failures: 3,
            keepalive_rate: 500,
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
            rx_coalesce: None,
            min_expires: RegistrarPolicy::default().min_expires,
            max_expires: RegistrarPolicy::default().max_expires,
            default_expires: RegistrarPolicy::default().default_expires,
            max_contacts: RegistrarPolicy::default().max_contacts,
            auth: false,
            auth_file: None,
            auth_secret_file: None,
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
            overload_control: true,
            overload_pinned_admit_ppm: None,
            emulated_service: None,
        }
    }
}

/// Shortest and longest receive-coalescing window
/// ([`SipServerConfig::rx_coalesce`]).
pub const MIN_RX_COALESCE: Duration = Duration::from_micros(1);
/// See [`MIN_RX_COALESCE`].
pub const MAX_RX_COALESCE: Duration = Duration::from_millis(100);

/// Default of `--overload-queue-delay-ms` (0: off), i.e. of
/// [`SipServerConfig::overload_queue_delay`].
pub const DEFAULT_OVERLOAD_QUEUE_DELAY_MS: u64 = 0;

impl SipServerConfig {
    /// Reject inconsistent settings, naming the field.
    pub fn validate(&self) -> Result<(), ServerError> {
        self.validate_threads_and_bounds()?;
        self.validate_next_hop()?;
        self.validate_backend_and_placement()?;
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
        if let Some(window) = self.rx_coalesce {
            if !(MIN_RX_COALESCE..=MAX_RX_COALESCE).contains(&window) {
                return fail(format!(
                    "rx_coalesce must be 1 µs..=100 ms (None: off), not {window:?}"
                ));
            }
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
            if listener.addr.ip().is_unspecified() {
                return fail(format!(
                    "listen {listener}: use a concrete address (it goes into Via and Record-Route)"
                ));
            }
        }
        Ok(())
    }

    /// The configured next hop (address or name), its transport and the
    /// listeners and TLS settings it needs; the DNS wait bounds.
    fn validate_next_hop(&self) -> Result<(), ServerError> {
        let fail = |message: String| Err(ServerError::Config(message));
        if let Some(name) = &self.route_to_name {
            let crate::dns::NextHop::Name { .. } = name.hop else {
                return fail(format!("route_to_name {name}: not a name"));
            };
            if self.route_to.is_some() {
                return fail("route_to and route_to_name: give one".into());
            }
            if name.transport != Transport::Udp
                && !self.listeners.iter().any(|l| l.transport == name.transport)
            {
                return fail(format!(
                    "route_to {name} needs a {} listen address",
                    name.transport
                ));
            }
            if matches!(name.transport, Transport::Ws | Transport::Wss) {
                return fail(format!(
                    "route_to {name}: a WebSocket next hop takes IP:PORT[/path] (no DNS for ws)"
                ));
            }
            if name.transport == Transport::Tls && self.tls.ca.is_none() {
                return fail("route_to over tls needs tls.ca (to verify the next hop)".into());
            }
        }
        let pending = &self.dns_pending;
        if pending.count == 0 || pending.bytes < 65_536 || pending.wait.is_zero() {
            return fail("dns_pending: count above 0, bytes at least 65536, wait above 0".into());
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
        let tls_listen = self
            .listeners
            .iter()
            .any(|l| matches!(l.transport, Transport::Tls | Transport::Wss));
        if let Some(path) = &self.route_to_path {
            let ws = self
                .route_to
                .is_some_and(|to| matches!(to.transport, Transport::Ws | Transport::Wss));
            if !ws {
                return fail(format!(
                    "route_to_path {path:?}: only for a ws: or wss: route_to"
                ));
            }
            if !super::ws::valid_path(path) {
                return fail(format!(
                    "route_to_path {path:?}: a path is / then at most 255 visible ASCII characters"
                ));
            }
        }
        self.tls.validate(tls_listen).map_err(ServerError::Config)?;
        if let Some(to) = self.route_to.filter(|to| {
            matches!(to.transport, Transport::Tls | Transport::Wss) && self.tls.ca.is_none()
        }) {
            return fail(format!(
                "route_to {to} over tls needs tls.ca (to verify the next hop)"
            ));
        }
        Ok(())
    }

    /// The backend's own limits (XDP) and the workers' placement.
    fn validate_backend_and_placement(&self) -> Result<(), ServerError> {
        let fail = |message: String| Err(ServerError::Config(message));
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
        if let Some(nice) = self.placement.nice {
            if !(-20..=19).contains(&nice) {
                return fail(format!("nice must be -20..=19, not {nice}"));
            }
        }
        if self
            .placement
            .cpus
            .as_ref()
            .is_some_and(|cpus| cpus.is_empty())
        {
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
        if self.flow_timer_s > 3600 {
            return fail(format!(
                "flow_timer_s must be 0..=3600 (0: no Flow-Timer), not {}",
                self.flow_timer_s
            ));
        }
        if let Some(interval) = self.keepalive_interval {
            if !(Duration::from_secs(1)..=Duration::from_secs(3600)).contains(&interval) {
                return fail(format!(
                    "keepalive_interval must be 1 s..=3600 s (None: off), not {interval:?}"
                ));
            }
        }
        if !(1..=100).contains(&self.keepalive_failures) {
            return fail(format!(
                "keepalive_failures must be 1..=100, not {}",
                self.keepalive_failures
            ));
        }
        if !(1..=100_000).contains(&self.keepalive_rate) {
            return fail(format!(
                "keepalive_rate must be 1..=100000 per second, not {}",
                self.keepalive_rate
            ));
        }
        Ok(())
    }

    /// Digest authentication and the flood limiter.
    fn validate_auth_and_flood(&self) -> Result<(), ServerError> {
        let fail = |m: String| Err(ServerError::Config(m));
        if self.auth && self.auth_file.is_none() {
            return fail("auth needs auth_file (the user:realm:HA1 credentials)".into());
        }
        if !self.auth && self.auth_secret_file.is_some() {
            return fail("auth_secret_file needs auth (it signs digest nonces)".into());
        }
        if self.auth_algorithms.is_empty() {
            return fail("auth_algorithms is empty".into());
        }
        if self.nonce_lifetime.as_secs() == 0 {
            return fail("nonce_lifetime must be at least 1 s".into());
        }
        check_flood(
            self.flood_limit,
            self.flood_ipv6_prefix,
            self.flood_window,
            self.flood_table_size,
        )
        .or_else(fail)?;
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
        if let (Some(window), Some(delay)) = (self.rx_coalesce, self.overload_queue_delay) {
            if window.saturating_mul(4) > delay {
                return fail(format!(
                    "rx_coalesce ({window:?}) must be at most a quarter of overload_queue_delay \
                     ({delay:?}): every datagram's wait in the window counts as queueing delay"
                ));
            }
        }
        if let Some(ppm) = self.overload_pinned_admit_ppm {
            if ppm == 0 || ppm > 1_000_000 || self.overload_queue_delay.is_none() {
                return fail(format!(
                    "overload_pinned_admit_ppm must be 1..=1000000 with overload_queue_delay set, not {ppm}"
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
    pub(super) fn worker_placement(&self, index: usize) -> Placement {
        let mut placement = self.placement.clone();
        placement.cpus = placement.cpus.map(|list| vec![list[index % list.len()]]);
        placement
    }

    pub(super) fn proxy_config(
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
            route_to_name: self
                .route_to_name
                .as_ref()
                .and_then(|name| match &name.hop {
                    crate::dns::NextHop::Name { host, port } => Some(
                        ringway_sip::proxy::NameQuery::new(host, *port, name.transport),
                    ),
                    crate::dns::NextHop::Addr(_) => None,
                }),
            listeners,
            registrar: self.registrar,
            nat: self.nat,
            flow_timer: (self.flow_timer_s > 0).then_some(self.flow_timer_s),
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
                nonce_clock_offset: wall_clock_offset(),
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
    pub(super) fn load_credentials(&self) -> Result<Option<HtdigestCredentials>, ServerError> {
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

/// Bytes a shared nonce secret has at least.
const MIN_SECRET_BYTES: usize = 16;

impl SipServerConfig {
    /// The nonce key of `auth_secret_file` (when `auth` is on and it is
    /// set). Errors name the file and what is wrong, never its contents.
    pub(super) fn load_nonce_key(&self) -> Result<Option<NonceKey>, ServerError> {
        let Some(path) = self.auth_secret_file.as_ref().filter(|_| self.auth) else {
            return Ok(None);
        };
        let fail = |why: String| {
            ServerError::Config(format!("auth_secret_file {}: {why}", path.display()))
        };
        let bytes = std::fs::read(path).map_err(|e| fail(e.to_string()))?;
        let secret = bytes.trim_ascii();
        if secret.len() < MIN_SECRET_BYTES {
            return Err(fail(format!(
                "the secret must be at least {MIN_SECRET_BYTES} bytes"
            )));
        }
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            if let Ok(meta) = std::fs::metadata(path) {
                if meta.permissions().mode() & 0o077 != 0 {
                    log::warn!(
                        "sip server: auth_secret_file {} can be read by group or others (chmod 600)",
                        path.display()
                    );
                }
            }
        }
        Ok(Some(NonceKey::derive(secret)))
    }
}

/// The wall clock minus the monotonic clock now (ns): added to the
/// monotonic `now` of the core, nonce times are wall-clock times, which
/// proxies on several hosts sharing a nonce key agree on.
fn wall_clock_offset() -> u64 {
    let wall = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, duration_ns);
    wall.saturating_sub(ringway_io::monotonic_now().0)
}

/// `duration` in the cores' unit (ns), saturating.
pub(super) fn duration_ns(duration: Duration) -> u64 {
    u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX)
}

/// The flood limiter's settings, as the proxy and the dispatcher both take
/// them: a limit above 0 when given, an IPv6 prefix of 16 to 128 bits, a
/// window of at least 1 ms and a table of at least one entry.
pub(crate) fn check_flood(
    limit: Option<u32>,
    ipv6_prefix: u8,
    window: Duration,
    table_size: usize,
) -> Result<(), String> {
    if limit == Some(0) {
        return Err("flood_limit must be above 0 (leave it out for no limit)".into());
    }
    if !(16..=128).contains(&ipv6_prefix) {
        return Err(format!(
            "flood_ipv6_prefix must be 16..=128, not {ipv6_prefix}"
        ));
    }
    if window < Duration::from_millis(1) || table_size == 0 {
        return Err("flood_window (at least 1 ms) and flood_table_size must be above 0".into());
    }
    Ok(())
}
