//! The dispatcher server's configuration (plain data) and its
//! validation.

use crate::dns::{NextHop, TransportNextHop};
use crate::sip::{check_flood, TcpConfig, TlsConfig};
use crate::ServerError;
use ringway_io::Io;
use ringway_sip::{FloodConfig, Transport, TransportAddr};
use serde::{Deserialize, Serialize};
use std::net::SocketAddr;
use std::time::Duration;

/// Everything a dispatcher needs to start (plain data).
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DispatchServerConfig {
    /// UDP address (a concrete one: it goes into Via, Record-Route, Path).
    pub listen: SocketAddr,
    /// Connection-transport listen addresses (`tcp:`, `tls:`, `ws:`,
    /// `wss:`; port 0: the UDP port), concrete: they go into Via,
    /// Record-Route and Path. Served by the proxy's connection driver.
    pub listeners: Vec<TransportAddr>,
    /// The proxies behind it (1..=64 with `proxy_names`), IP literals,
    /// each with the transport it is reached over (`IP:PORT` for UDP,
    /// `tcp:IP:PORT`, `tls:IP:PORT`, `ws:IP:PORT`, `wss:IP:PORT`; a
    /// connection transport needs a listen address of it, TLS and WSS also
    /// `tls.ca`; a WebSocket connection we open asks for the path `/`).
    #[serde(with = "proxy_list")]
    pub proxies: Vec<TransportAddr>,
    /// Proxies given by name: each resolved at start (RFC 3263: `host`
    /// by NAPTR/SRV, `host:port` by A/AAAA; `tcp:host` by `_sip._tcp`,
    /// `tls:host` by `_sips._tcp`), every target a proxy behind us, its
    /// address checked by the relay policy (`crate::dns`).
    pub proxy_names: Vec<TransportNextHop>,
    /// The nameserver for `proxy_names` (default: /etc/resolv.conf's).
    pub dns_server: Option<SocketAddr>,
    /// Worker threads (1..=64).
    pub workers: usize,
    /// I/O backend: a socket backend (the dispatcher refuses `Xdp`).
    /// Named `backend` in the JSON summary.
    #[serde(rename = "backend")]
    pub io: Io,
    /// Datagrams per receive batch (1..=1024).
    pub batch: usize,
    /// OPTIONS probe interval (ms).
    pub probe_interval_ms: u64,
    /// Unanswered probes in a row before a proxy is out.
    pub probe_failures: u32,
    /// Record-Route dialog-creating requests.
    pub record_route: bool,
    /// Destinations beyond the proxies requests may go to (`none`, `any`
    /// or networks; see `ringway_sip::relay`): loopback, link-local and
    /// our own IP only when a network names them.
    pub relay: ringway_sip::RelayNets,
    /// Flood limit, as the proxy's: requests per window from one source
    /// (a response counts a quarter); `None`: no limit. The proxies and
    /// our own address are never limited.
    pub flood_limit: Option<u32>,
    /// Flood limit window (at least 1 ms).
    pub flood_window: Duration,
    /// Sources the flood limiter tracks at most.
    pub flood_table_size: usize,
    /// Sources never flood-limited.
    pub flood_exempt: Vec<std::net::IpAddr>,
    /// IPv6 sources are flood-limited per prefix of this length (bits).
    pub flood_ipv6_prefix: u8,
    /// Bounds of the connection transports, as the proxy's.
    pub tcp: TcpConfig,
    /// TLS certificates (for `tls:`/`wss:` listen addresses) and the CA
    /// `tls:` proxies are verified with, as the proxy's.
    pub tls: TlsConfig,
    /// Origins WebSocket clients may come from (none: any).
    pub ws_origins: Vec<String>,
}

/// `proxies` in files and summaries: `IP:PORT` over UDP (as before other
/// transports existed), `tcp:IP:PORT` or `tls:IP:PORT` otherwise.
mod proxy_list {
    use ringway_sip::TransportAddr;
    use serde::ser::SerializeSeq;
    use serde::{Deserialize, Deserializer, Serializer};

    pub(super) fn serialize<S: Serializer>(
        proxies: &[TransportAddr],
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        let mut seq = serializer.serialize_seq(Some(proxies.len()))?;
        for proxy in proxies {
            seq.serialize_element(&super::named(proxy))?;
        }
        seq.end()
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Vec<TransportAddr>, D::Error> {
        Vec::<TransportAddr>::deserialize(deserializer)
    }
}

impl Default for DispatchServerConfig {
    fn default() -> Self {
        DispatchServerConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], 5060)),
            proxies: Vec::new(),
            proxy_names: Vec::new(),
            dns_server: None,
            workers: 1,
            io: Io::Mmsg,
            batch: 32,
            probe_interval_ms: 500,
            probe_failures: 3,
            record_route: true,
            relay: ringway_sip::RelayNets::None,
            flood_limit: None,
            flood_window: Duration::from_millis(2000),
            flood_table_size: FloodConfig::default().table_size,
            flood_exempt: Vec::new(),
            flood_ipv6_prefix: 64,
            listeners: Vec::new(),
            tcp: TcpConfig::default(),
            tls: TlsConfig::default(),
            ws_origins: Vec::new(),
        }
    }
}

impl DispatchServerConfig {
    /// Reject inconsistent settings, naming the field.
    pub fn validate(&self) -> Result<(), ServerError> {
        let fail = |m: String| Err(ServerError::Config(m));
        if self.listen.ip().is_unspecified() {
            return fail(format!(
                "listen {}: use a concrete address (it goes into Via, Record-Route and Path)",
                self.listen
            ));
        }
        let given = self.proxies.len() + self.proxy_names.len();
        if !(1..=64).contains(&given) {
            return fail(format!("proxies: give 1..=64 proxies, not {given}"));
        }
        if let Some(name) = self
            .proxy_names
            .iter()
            .find(|n| !matches!(n.hop, NextHop::Name { .. }))
        {
            return fail(format!("proxy_names: {name} is not a name"));
        }
        for (i, p) in self.proxies.iter().enumerate() {
            let own = p.addr == self.listen || self.listeners.iter().any(|l| l.addr == p.addr);
            if !ringway_sip::proxy::sendable(&p.addr) || own {
                return fail(format!("proxy {p}: not an address to send to"));
            }
            if self.proxies[..i].iter().any(|q| q.addr == p.addr) {
                return fail(format!("proxy {p} given twice"));
            }
        }
        self.validate_transports()?;
        if !(1..=64).contains(&self.workers) {
            return fail(format!("workers must be 1..=64, not {}", self.workers));
        }
        if !(1..=1024).contains(&self.batch) {
            return fail(format!("batch must be 1..=1024, not {}", self.batch));
        }
        if !(10..=60_000).contains(&self.probe_interval_ms) {
            return fail(format!(
                "probe_interval_ms must be 10..=60000, not {}",
                self.probe_interval_ms
            ));
        }
        if !(1..=100).contains(&self.probe_failures) {
            return fail(format!(
                "probe_failures must be 1..=100, not {}",
                self.probe_failures
            ));
        }
        check_flood(
            self.flood_limit,
            self.flood_ipv6_prefix,
            self.flood_window,
            self.flood_table_size,
        )
        .or_else(fail)?;
        if let Io::Xdp(_) = self.io {
            return fail("the dispatcher runs on sockets (socket, mmsg or uring backend)".into());
        }
        Ok(())
    }
}

impl DispatchServerConfig {
    /// The listen addresses, the transports the proxies are reached over
    /// (each needs a listen address of it: our Via and Record-Route name
    /// it), and the TCP and TLS settings.
    fn validate_transports(&self) -> Result<(), ServerError> {
        let fail = |m: String| Err(ServerError::Config(m));
        for listener in &self.listeners {
            if listener.addr.ip().is_unspecified() {
                return fail(format!(
                    "listen {listener}: use a concrete address (it goes into Via, Record-Route and Path)"
                ));
            }
        }
        let transports = self
            .proxies
            .iter()
            .map(|p| (p.to_string(), p.transport))
            .chain(
                self.proxy_names
                    .iter()
                    .map(|n| (n.to_string(), n.transport)),
            );
        for (proxy, transport) in transports {
            if transport != Transport::Udp
                && !self.listeners.iter().any(|l| l.transport == transport)
            {
                return fail(format!("proxy {proxy} needs a {transport} listen address"));
            }
            if matches!(transport, Transport::Tls | Transport::Wss) && self.tls.ca.is_none() {
                return fail(format!(
                    "proxy {proxy} over {transport} needs tls.ca (to verify the proxy)"
                ));
            }
        }
        if let Some(name) = self
            .proxy_names
            .iter()
            .find(|n| matches!(n.transport, Transport::Ws | Transport::Wss))
        {
            return fail(format!(
                "proxy {name}: a WebSocket proxy takes IP:PORT (no DNS for ws)"
            ));
        }
        self.tcp.validate().map_err(ServerError::Config)?;
        let tls_listen = self
            .listeners
            .iter()
            .any(|l| matches!(l.transport, Transport::Tls | Transport::Wss));
        self.tls.validate(tls_listen).map_err(ServerError::Config)
    }
}

/// A proxy as operators wrote it: `IP:PORT` over UDP, else
/// `tcp:IP:PORT` / `tls:IP:PORT`.
pub(super) fn named(proxy: &TransportAddr) -> String {
    match proxy.transport {
        Transport::Udp => proxy.addr.to_string(),
        _ => proxy.to_string(),
    }
}
