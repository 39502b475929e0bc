//! `ringway sip dispatch`: command-line front end of
//! [`ringway_server::dispatch::DispatchServer`], a stateless dispatcher
//! spreading new requests over several `ringway sip proxy` instances
//! (rendezvous hashing on Call-ID, on the AOR for REGISTER; OPTIONS
//! probes; Path on REGISTER). See docs/scaleout.md.

use super::serving;
use ringway_io::Io;
use ringway_server::dispatch::{DispatchServer, DispatchServerConfig};
use ringway_server::dns::{NextHop, TransportNextHop};
use ringway_server::host;
use ringway_sip::TransportAddr;
use std::net::SocketAddr;
use std::path::PathBuf;

/// Arguments of `ringway sip dispatch`.
#[derive(clap::Args, Debug, Clone)]
pub struct DispatchArgs {
    /// Read options from this TOML file (table [sip.dispatch]; see
    /// docs/ringway.toml); options on the command line override it.
    #[arg(long, value_hint = clap::ValueHint::FilePath)]
    pub config: Option<PathBuf>,
    /// Address to listen on, with its transport: `udp:ADDR` (or a bare ADDR), `tcp:ADDR`, `tls:ADDR`,
    /// `ws:ADDR` or `wss:ADDR` (port 0: the UDP port); goes into Via, Record-Route and Path.
    /// Repeatable: one UDP address (the last given wins) and others.
    #[arg(long, default_value = "127.0.0.1:5060", value_parser = super::sip_proxy::parse_transport_addr)]
    pub listen: Vec<TransportAddr>,
    /// A proxy behind the dispatcher: IP:PORT (UDP), `tcp:IP:PORT`, `tls:IP:PORT`, `ws:IP:PORT` or
    /// `wss:IP:PORT` (needs a listen address of that transport; tls and wss also --tls-ca; ws and wss
    /// open a WebSocket connection to the path `/`), or a name: `[tcp:|tls:]HOST`
    /// (NAPTR/SRV) or HOST:PORT (A/AAAA), resolved at start, every target a proxy (repeatable,
    /// at least one).
    #[arg(long = "proxy")]
    pub proxies: Vec<TransportNextHop>,
    /// Nameserver for proxy names, IP:PORT (default: the first of /etc/resolv.conf).
    #[arg(long)]
    pub dns_server: Option<SocketAddr>,
    /// Worker threads (one SO_REUSEPORT socket each).
    #[arg(long, default_value_t = 1)]
    pub workers: usize,
    /// I/O backend: socket, mmsg or uring.
    #[arg(long, default_value = "mmsg")]
    pub backend: ringway_io::BackendKind,
    /// Datagrams per receive batch.
    #[arg(long, default_value_t = 32)]
    pub batch: usize,
    /// OPTIONS probe interval (ms).
    #[arg(long, default_value_t = 500)]
    pub probe_interval_ms: u64,
    /// Probes unanswered in a row before a proxy is out (back in with one answer).
    #[arg(long, default_value_t = 3)]
    pub probe_failures: u32,
    /// Do not Record-Route (in-dialog requests then bypass the dispatcher).
    #[arg(long)]
    pub no_record_route: bool,
    /// Destinations beyond the proxies: `none`, `any`, or networks `CIDR,...` (loopback,
    /// link-local and our own IP only when named, e.g. 127.0.0.0/8 for UAs on this host).
    #[arg(long, default_value = "none", value_parser = super::sip_proxy::parse_relay)]
    pub relay: ringway_sip::RelayNets,
    /// Flood limit: requests per window from one source address (default: no limit;
    /// the proxies are never limited).
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
    /// Connection transports: TCP bounds, TLS, WebSocket origins (as `sip proxy`).
    #[command(flatten)]
    pub connections: super::sip_connections::ConnectionArgs,
    /// Serve Prometheus text on http://ADDR/metrics (loopback only unless --metrics-public).
    #[arg(long)]
    pub metrics: Option<SocketAddr>,
    /// Allow --metrics on a non-loopback address.
    #[arg(long)]
    pub metrics_public: bool,
    /// Stop after this many seconds (otherwise on SIGINT/SIGTERM).
    #[arg(long)]
    pub duration: Option<f64>,
    /// Also write the JSON summary to this file.
    #[arg(long)]
    pub summary: Option<PathBuf>,
    /// Do not print the JSON summary to stdout.
    #[arg(long)]
    pub quiet: bool,
    /// Management API (docs/operations.md).
    #[command(flatten)]
    pub manage: super::manage::ManageArgs,
    /// Log format and levels.
    #[command(flatten)]
    pub log: crate::logging::LogArgs,
}

/// The configuration a command line describes, with the checks only the
/// front end can make (`--duration`, `--metrics`). The server validates
/// the rest once, when it starts, or `ringway config check` calls
/// [`DispatchServerConfig::validate`].
impl TryFrom<&DispatchArgs> for DispatchServerConfig {
    type Error = anyhow::Error;

    fn try_from(args: &DispatchArgs) -> anyhow::Result<DispatchServerConfig> {
        serving::check_common_options(args.duration, args.metrics, args.metrics_public)?;
        if let Some(proxy) = args.proxies.iter().find(|p| p.path.is_some()) {
            anyhow::bail!(
                "--proxy {proxy}: the dispatcher's WebSocket connections take the path / (give none)"
            );
        }
        let io = Io::new(args.backend, None).map_err(|_| {
            anyhow::anyhow!(
                "--backend {}: the dispatcher runs on sockets (socket, mmsg or uring)",
                args.backend
            )
        })?;
        let (udp, listeners) = super::sip_connections::split_listen(&args.listen, "dispatcher")?;
        Ok(DispatchServerConfig {
            listen: udp,
            listeners,
            proxies: args
                .proxies
                .iter()
                .filter_map(|p| match p.hop {
                    NextHop::Addr(addr) => Some(TransportAddr {
                        transport: p.transport,
                        addr,
                    }),
                    NextHop::Name { .. } => None,
                })
                .collect(),
            proxy_names: args
                .proxies
                .iter()
                .filter(|p| matches!(p.hop, NextHop::Name { .. }))
                .cloned()
                .collect(),
            dns_server: args.dns_server,
            workers: args.workers,
            io,
            batch: args.batch,
            probe_interval_ms: args.probe_interval_ms,
            probe_failures: args.probe_failures,
            record_route: !args.no_record_route,
            relay: args.relay.clone(),
            flood_limit: args.flood_limit,
            flood_window: std::time::Duration::from_millis(args.flood_window_ms),
            flood_table_size: args.flood_table_size,
            flood_exempt: args.flood_exempt.clone(),
            flood_ipv6_prefix: args.flood_ipv6_prefix,
            tcp: args.connections.tcp_config(),
            tls: args.connections.tls_config(),
            ws_origins: args.connections.ws_origins.clone(),
        })
    }
}

/// The configuration of `args`, validated (what `ringway config check`
/// asks); errors point at `--help`.
pub(crate) fn checked_config(args: &DispatchArgs) -> anyhow::Result<DispatchServerConfig> {
    let config = DispatchServerConfig::try_from(args)?;
    config
        .validate()
        .map_err(|e| serving::with_help("sip dispatch", e))?;
    Ok(config)
}

/// Run the dispatcher until SIGINT/SIGTERM or `--duration`.
pub(crate) fn run(a: DispatchArgs) -> anyhow::Result<()> {
    a.log.apply();
    a.manage.validate()?;
    let config = DispatchServerConfig::try_from(&a)?;
    // SIGINT and SIGTERM stop (the dispatcher keeps no transactions to
    // drain), SIGHUP reloads.
    let signals = host::control_signals()?;
    // Validated once, here.
    let server =
        DispatchServer::start(config).map_err(|e| serving::with_help("sip dispatch", e))?;
    let reload = super::manage::dispatch_reloader(server.control());
    let endpoints = serving::Endpoints::start(
        "sip dispatch",
        "dispatch-metrics",
        a.metrics,
        server.prometheus(),
        &a.manage,
        ringway_server::manage::Managed::Dispatch(server.control(), reload.clone()),
    )?;
    let proxies: Vec<String> = a.proxies.iter().map(ToString::to_string).collect();
    let streams: String = server
        .stream_addresses()
        .iter()
        .map(|a| format!(" {a}"))
        .collect();
    log::info!(
        "sip dispatch: listening on udp {}{streams} proxies={} workers={} probe={}ms x{} relay={} flood-limit={}",
        server.local_addr(),
        proxies.join(","),
        a.workers,
        a.probe_interval_ms,
        a.probe_failures,
        a.relay,
        a.flood_limit
            .map_or("off".to_string(), |l| format!("{l}/{}ms", a.flood_window_ms)),
    );
    serving::wait_for_stop_or(
        &signals,
        a.duration,
        || !server.panicked_threads().is_empty(),
        || {
            log::info!("sip dispatch: SIGHUP: reloading");
            let _ = reload();
        },
    );
    let summary = endpoints.stop_around(|| server.shutdown());
    serving::conclude(
        &summary,
        &summary.threads_panicked,
        a.summary.as_deref(),
        a.quiet,
        "dispatcher",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_bad_arguments() {
        let parse = crate::cmd::parse_args::<DispatchArgs>;
        let valid = |args: &[&str]| checked_config(&parse(args).unwrap()).is_ok();
        assert!(!valid(&[]), "--proxy is required");
        let ok = ["--proxy", "127.0.0.11:5060", "--proxy", "127.0.0.12:5060"];
        assert!(valid(&ok));
        assert!(valid(&[
            "--listen",
            "127.0.0.1:5060",
            "--listen",
            "tcp:127.0.0.1:5060",
            "--proxy",
            "tcp:127.0.0.11:5060",
            "--proxy",
            "127.0.0.12:5060",
        ]));
        assert!(valid(&[
            "--listen",
            "127.0.0.1:5060",
            "--listen",
            "ws:127.0.0.1:8080",
            "--proxy",
            "ws:127.0.0.11:80",
        ]));
        for bad in [
            &["--proxy", "127.0.0.11:5060", "--proxy", "127.0.0.11:5060"][..],
            // A connection transport needs a listen address of it.
            &["--proxy", "tcp:127.0.0.11:5060"],
            // TLS needs a CA to verify the proxy with.
            &[
                "--listen",
                "127.0.0.1:5060",
                "--listen",
                "tls:127.0.0.1:5061",
                "--proxy",
                "tls:127.0.0.11:5061",
            ],
            // WebSocket proxies: a ws listen address, no path, no name.
            &["--proxy", "ws:127.0.0.11:80"],
            &[
                "--listen",
                "127.0.0.1:5060",
                "--listen",
                "ws:127.0.0.1:8080",
                "--proxy",
                "ws:127.0.0.11:80/sip",
            ],
            &[
                "--listen",
                "127.0.0.1:5060",
                "--listen",
                "ws:127.0.0.1:8080",
                "--proxy",
                "ws:proxy.example.net:80",
            ],
            // WSS needs a CA to verify the proxy with.
            &[
                "--listen",
                "127.0.0.1:5060",
                "--listen",
                "ws:127.0.0.1:8080",
                "--listen",
                "wss:127.0.0.1:8443",
                "--tls-cert",
                "c.pem",
                "--tls-key",
                "k.pem",
                "--proxy",
                "wss:127.0.0.11:443",
            ],
            // No UDP address.
            &[
                "--listen",
                "tcp:127.0.0.1:5060",
                "--proxy",
                "127.0.0.11:5060",
            ],
            &[
                "--listen",
                "127.0.0.1:5060",
                "--listen",
                "tcp:0.0.0.0:5060",
                "--proxy",
                "127.0.0.11:5060",
            ],
            &["--proxy", "127.0.0.11:0"],
            &["--proxy", "127.0.0.1:5060"],
            &["--proxy", "127.0.0.11:5060", "--listen", "0.0.0.0:5060"],
            &["--proxy", "127.0.0.11:5060", "--probe-interval-ms", "1"],
            &["--proxy", "127.0.0.11:5060", "--probe-failures", "0"],
            &["--proxy", "127.0.0.11:5060", "--workers", "0"],
            &["--proxy", "127.0.0.11:5060", "--flood-limit", "0"],
            &["--proxy", "127.0.0.11:5060", "--flood-ipv6-prefix", "8"],
            &["--proxy", "127.0.0.11:5060", "--backend", "xdp"],
            &["--proxy", "127.0.0.11:5060", "--duration", "0"],
            &["--proxy", "127.0.0.11:5060", "--metrics", "192.0.2.1:9000"],
        ] {
            assert!(!valid(bad), "{bad:?} accepted");
        }
        assert!(
            valid(&["--proxy", "proxy.example.net:5060"]),
            "names resolve at start"
        );
        assert!(parse(&["--proxy", "not a name"]).is_err());
    }
}
