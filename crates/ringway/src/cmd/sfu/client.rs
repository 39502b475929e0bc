//! `ringway sfu client` and `ringway sfu load`: command-line front ends of
//! the load clients in [`ringway_load::sfu`] (options → config, live
//! statistics, the final report). `load --netns` also runs the SFU itself
//! ([`ringway_server::sfu`]) in a namespace host of its own.

use anyhow::Context;
use ringway_io::{BackendKind, Io, XdpInterface};
use ringway_lab::sfulab::testbed::Testbed;
use ringway_load::sfu::{ClientReport, LiveLoad, SfuLoadConfig};
use ringway_server::sfu::{SfuServer, SfuServerConfig};
use ringway_sfu::MediaType;
use std::io::Write;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

/// Options shared by `client` and `load`.
#[derive(clap::Args, Debug, Clone)]
pub(crate) struct CommonArgs {
    /// SFU address.
    #[arg(long)]
    pub server: SocketAddr,
    /// Media types each source sends.
    #[arg(long, default_value = "asq,vsq,vhq", value_delimiter = ',')]
    pub types: Vec<MediaType>,
    /// Interval between packets of one stream (ms); 4 ms × 3 types = 750 pps per source.
    #[arg(long, default_value_t = 4.0)]
    pub interval_ms: f64,
    /// Packet sizes (bytes) per type, in `--types` order (the last one repeats).
    #[arg(long, default_value = "80,160,320", value_delimiter = ',')]
    pub sizes: Vec<usize>,
    /// What to subscribe to: `all`, `none`, or a list of `SSID:TYPE` / `SSID` / `all:TYPE`.
    #[arg(long, default_value = "all")]
    pub subscribe: String,
    /// Seconds of sending.
    #[arg(long, default_value_t = 10.0)]
    pub duration: f64,
    /// Seconds to keep receiving after sending stops.
    #[arg(long, default_value_t = 0.5)]
    pub drain: f64,
    /// Write the final report as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// I/O backend of the engine and generator.
    #[arg(long)]
    pub backend: Option<BackendKind>,
    /// Local IP to bind (default: the server's IP when loopback, else any).
    #[arg(long)]
    pub bind: Option<IpAddr>,
    /// Print live statistics every S seconds (0: never).
    #[arg(long, default_value_t = 1.0)]
    pub stats_interval: f64,
    /// Do not send keepalives (lets the SFU time the client out).
    #[arg(long)]
    pub no_keepalive: bool,
    /// Do not send LEAVE at the end.
    #[arg(long)]
    pub no_leave: bool,
    /// Only register and subscribe; send no media.
    #[arg(long)]
    pub no_send: bool,
    /// Pin the engine thread to these CPUs (list, e.g. `1` or `0-1`).
    #[arg(long)]
    pub cpus: Option<String>,
    /// Open source i's socket inside named network namespace i (mod the
    /// list length): one namespace host per client.
    #[arg(long, value_delimiter = ',')]
    pub in_netns: Vec<String>,
    /// Every source sends at the same tick (one burst per interval) instead
    /// of at its own phase.
    #[arg(long)]
    pub sync: bool,
}

/// `ringway sfu client` options.
#[derive(clap::Args, Debug, Clone)]
pub(crate) struct ClientArgs {
    /// Number of sources (each its own socket and SSID).
    #[arg(long, default_value_t = 1)]
    pub streams: usize,
    #[command(flatten)]
    pub common: CommonArgs,
}

/// `ringway sfu load` options.
#[derive(clap::Args, Debug, Clone)]
pub(crate) struct LoadArgs {
    /// Number of clients (each its own socket and SSID, all in this process).
    #[arg(long)]
    pub clients: usize,
    /// Build a namespace topology (one bridge): the SFU (`ringway sfu serve`,
    /// started here) in host `sfu` at 10.77.0.1 on the port of `--server`,
    /// and each client in its own host; removed at the end.
    #[arg(long)]
    pub netns: bool,
    /// With `--netns`: backend of the SFU started in the `sfu` host (`xdp`
    /// attaches to that host's veth, `eth0`).
    #[arg(long, default_value = "socket")]
    pub sfu_backend: BackendKind,
    /// With `--netns`: every client behind a router host instead of on the
    /// SFU's bridge (the SFU's next hop is the router's MAC: the fast paths
    /// resolve it from the kernel's routes).
    #[arg(long)]
    pub routed: bool,
    /// With `--netns`: the hosts talk IPv6 (unique local addresses in
    /// fd77::/48 beside their IPv4 ones): the SFU listens on its own.
    #[arg(long)]
    pub ipv6: bool,
    /// With `--netns`: the SFU also replicates media in the kernel (the
    /// `tc` fan-out on its veth; not with `--sfu-backend xdp`).
    #[arg(long)]
    pub sfu_kernel_fanout: bool,
    /// With `--netns`: the started SFU's idle timeout (seconds).
    #[arg(long, default_value_t = 10.0)]
    pub sfu_idle_timeout: f64,
    /// With `--netns`: where the started SFU writes its JSON report.
    #[arg(long)]
    pub sfu_json: Option<PathBuf>,
    #[command(flatten)]
    pub common: CommonArgs,
}

impl CommonArgs {
    /// The load configuration for `sources` sources.
    fn config(
        &self,
        sources: usize,
        default_backend: BackendKind,
    ) -> anyhow::Result<SfuLoadConfig> {
        let cpus = match &self.cpus {
            Some(list) => Some(ringway_server::host::parse_cpu_list(list).context("--cpus")?),
            None => None,
        };
        anyhow::ensure!(self.interval_ms > 0.0, "--interval-ms must be positive");
        anyhow::ensure!(
            !self.types.is_empty() && !self.sizes.is_empty(),
            "--types and --sizes must not be empty"
        );
        Ok(SfuLoadConfig {
            server: self.server,
            sources,
            types: self.types.clone(),
            interval_ms: self.interval_ms,
            sizes: self.sizes.clone(),
            subscribe: ringway_load::sfu::parse_subscribe(&self.subscribe)
                .context("--subscribe")?,
            duration_s: self.duration,
            drain_s: self.drain,
            backend: self.backend.unwrap_or(default_backend),
            bind: self.bind,
            keepalive: !self.no_keepalive,
            leave: !self.no_leave,
            send: !self.no_send,
            cpus,
            sender_policy: None,
            in_netns: self.in_netns.clone(),
            xdp_receive: Vec::new(),
            desync: !self.sync,
            seed: 1,
        })
    }
}

/// Run the load described by `c` with `sources` sources, printing live
/// statistics every `--stats-interval`.
fn run_sources(c: &CommonArgs, config: &SfuLoadConfig) -> anyhow::Result<ClientReport> {
    let stop = ringway_server::host::stop_flag()?;
    let mut last = LiveLoad::default();
    let every = Duration::from_secs_f64(c.stats_interval.max(0.0));
    let report = ringway_load::sfu::run(config, &stop, Some(every), |l| {
        print_live(&last, l);
        last = *l;
    })?;
    println!("ringway sfu client: registered SSIDs {:?}", report.ssids);
    if report.late_ticks > 0 {
        eprintln!("generator: {} ticks more than 1 ms late", report.late_ticks);
    }
    Ok(report)
}

fn print_live(last: &LiveLoad, l: &LiveLoad) {
    let interval = (l.elapsed_s - last.elapsed_s).max(1e-9);
    println!(
        "[{:6.1}s] out {:.0}pps {:.2}Mbps  in {:.0}pps {:.2}Mbps  lost={} reordered={}",
        l.elapsed_s,
        (l.tx_packets - last.tx_packets) as f64 / interval,
        (l.tx_bytes - last.tx_bytes) as f64 * 8.0 / interval / 1e6,
        (l.rx_packets - last.rx_packets) as f64 / interval,
        (l.rx_bytes - last.rx_bytes) as f64 * 8.0 / interval / 1e6,
        l.lost,
        l.reordered
    );
    let _ = std::io::stdout().flush();
}

/// Run `ringway sfu client`.
pub(crate) fn run(a: ClientArgs) -> anyhow::Result<()> {
    let config = a.common.config(a.streams, BackendKind::Socket)?;
    let report = run_sources(&a.common, &config)?;
    finish(&a.common, &report)
}

/// Run `ringway sfu load`.
pub(crate) fn run_load(a: LoadArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        a.netns || !(a.routed || a.sfu_kernel_fanout || a.ipv6),
        "--routed, --ipv6 and --sfu-kernel-fanout need --netns"
    );
    if !a.netns {
        let config = a.common.config(a.clients, BackendKind::Mmsg)?;
        let report = run_sources(&a.common, &config)?;
        return finish(&a.common, &report);
    }
    // Testbed: SFU host + one host per client on one bridge (clients send
    // full UDP checksums, which the xdp backend verifies).
    anyhow::ensure!(
        !a.sfu_kernel_fanout || a.sfu_backend != BackendKind::Xdp,
        "--sfu-kernel-fanout cannot run with --sfu-backend xdp"
    );
    let topo = if a.routed {
        Testbed::routed(a.clients, false, a.ipv6)?
    } else {
        Testbed::build(a.clients, false, a.ipv6)?
    };
    let sfu_host = topo.sfu();
    let listen = SocketAddr::new(topo.sfu_addr(), a.common.server.port());
    let sfu_config = SfuServerConfig {
        listen,
        io: Io::new(
            a.sfu_backend,
            (a.sfu_backend == BackendKind::Xdp)
                .then(|| sfu_host.ifaces.first().map(|i| XdpInterface::new(&i.0)))
                .flatten(),
        )?,
        kernel_fanout: sfu_host
            .ifaces
            .first()
            .map(|i| i.0.clone())
            .filter(|_| a.sfu_kernel_fanout),
        idle_timeout_s: a.sfu_idle_timeout,
        ..SfuServerConfig::default()
    };
    // The SFU starts inside its host (its engine thread inherits the
    // namespace); the handle stops it on every way out of this function.
    let sfu = sfu_host
        .run(move || SfuServer::start(sfu_config))
        .context("entering the SFU host")
        .and_then(|report| report.context("the SFU in its host did not start"));
    let result = sfu
        .as_ref()
        .map_err(|e| anyhow::anyhow!("{e:#}"))
        .and_then(|sfu| {
            let mut common = a.common.clone();
            common.server = sfu.local_addr();
            common.in_netns = topo.client_netns(a.clients);
            common
                .config(a.clients, BackendKind::Mmsg)
                .and_then(|config| run_sources(&common, &config))
                .map(|report| (common, report))
        });
    let sfu_report = sfu.and_then(|s| s.shutdown().context("the SFU"));
    drop(topo);
    if let Some(path) = &a.sfu_json {
        // Written on failure too: the report if the SFU ran, and the error
        // that ended the run.
        let mut v = match &sfu_report {
            Ok(report) => serde_json::to_value(report)?,
            Err(_) => serde_json::json!({}),
        };
        let error = match (&sfu_report, &result) {
            (Err(e), _) => Some(format!("{e:#}")),
            (_, Err(e)) => Some(format!("{e:#}")),
            _ => None,
        };
        if let (Some(e), Some(object)) = (error, v.as_object_mut()) {
            object.insert("error".into(), e.into());
        }
        std::fs::write(path, serde_json::to_vec_pretty(&v)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    let (common, report) = result?;
    sfu_report?;
    finish(&common, &report)
}

fn finish(c: &CommonArgs, r: &ClientReport) -> anyhow::Result<()> {
    println!(
        "final: {:.1}s sources={} out={} pkts {:.2}Mbps in={} pkts {:.2}Mbps media={} lost={} \
         reordered={} echoes={} rtt p50={:.1}us p90={:.1}us p99={:.1}us errors={}",
        r.duration_s,
        r.ssids.len(),
        r.tx_packets,
        r.out_mbps,
        r.rx_packets,
        r.in_mbps,
        r.media_packets,
        r.lost,
        r.reordered,
        r.echoes,
        r.rtt.p50_us,
        r.rtt.p90_us,
        r.rtt.p99_us,
        r.control_errors
    );
    if let Some(path) = &c.json {
        std::fs::write(path, serde_json::to_vec_pretty(r)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}
