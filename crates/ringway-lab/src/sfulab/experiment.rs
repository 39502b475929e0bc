//! Running the SFU experiment: for every repetition, client count,
//! per-client packet rate and backend, an SFU ([`ringway_server::sfu`]) and
//! its load clients ([`crate::sfuload`], every client subscribed to all, so
//! each packet is copied to clients − 1 subscribers plus the echo) run in
//! this process; the SFU engine thread's CPU time and per-packet delays
//! make one [`Run`].
//!
//! Everything runs inside a private network namespace with only `lo`
//! ([`Placement::Loopback`], the caller enters it), or in the paper's
//! testbed shape ([`Placement::Hosts`]): the SFU in one namespace host and
//! each client in its own host, joined by veth to one bridge (ringway-io's
//! [`Topology`], names carry the PID, removed when dropped).

use super::Run;
use crate::sfuload::{self, SfuLoadConfig};
use anyhow::Context;
use ringway_io::netns::Topology;
use ringway_io::BackendKind;
use ringway_server::sfu::{Flush, ServeReport, SfuServerConfig};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// What to run.
#[derive(Clone, Debug)]
pub struct SfuLabConfig {
    /// Client counts.
    pub clients: Vec<usize>,
    /// Packets per second sent by each client (3 streams: ASQ, VSQ, VHQ).
    pub pps: Vec<u32>,
    /// Backends to compare (`socket` is the baseline).
    pub backends: Vec<BackendKind>,
    /// Repetitions of every cell.
    pub reps: usize,
    /// Seconds of load per run.
    pub duration_s: f64,
    /// SFU send flush policy.
    pub flush: Flush,
    /// Pin the SFU engine thread to these CPUs.
    pub cpus: Option<Vec<usize>>,
}

/// Where the SFU and the load run.
pub enum Placement {
    /// Both on `lo` of the current (private) namespace.
    Loopback,
    /// SFU in namespace host `sfu`, client i in host `c<i>`, all on one bridge.
    Hosts(Topology),
}

impl Placement {
    /// The testbed for up to `clients` clients.
    pub fn hosts(clients: usize) -> anyhow::Result<Placement> {
        let mut b = Topology::builder().host("sfu");
        for i in 0..clients {
            b = b.host(&format!("c{i}"));
        }
        let topology = b
            .bridge()
            .build()
            .context("building the namespace topology")?;
        Ok(Placement::Hosts(topology))
    }

    /// The SFU's configuration for `backend` in this placement.
    fn sfu_config(
        &self,
        c: &SfuLabConfig,
        backend: BackendKind,
    ) -> anyhow::Result<SfuServerConfig> {
        let (listen, xdp_iface) = match self {
            Placement::Loopback => ("127.0.0.1:0".parse().expect("literal"), None),
            Placement::Hosts(t) => {
                let sfu = t.host("sfu").expect("built");
                (
                    SocketAddr::new(sfu.addr().into(), 0),
                    sfu.ifaces.first().map(|i| i.0.clone()),
                )
            }
        };
        anyhow::ensure!(
            backend != BackendKind::Xdp || xdp_iface.is_some(),
            "the xdp backend needs the namespace testbed (it attaches to the SFU host's veth)"
        );
        Ok(SfuServerConfig {
            listen,
            backend,
            xdp_iface: xdp_iface.filter(|_| backend == BackendKind::Xdp),
            flush: c.flush,
            cpus: c.cpus.clone(),
            duration_s: Some(c.duration_s + 60.0),
            ..SfuServerConfig::default()
        })
    }

    /// Namespaces of the first `n` clients (empty on loopback).
    fn client_netns(&self, n: usize) -> Vec<String> {
        match self {
            Placement::Loopback => Vec::new(),
            Placement::Hosts(t) => (0..n)
                .map(|i| t.host(&format!("c{i}")).expect("built").netns.clone())
                .collect(),
        }
    }

    /// Start the SFU (inside its host, if any) on a thread.
    fn start_sfu(
        &self,
        config: SfuServerConfig,
        stop: Arc<AtomicBool>,
    ) -> anyhow::Result<(
        SocketAddr,
        std::thread::JoinHandle<anyhow::Result<ServeReport>>,
    )> {
        let (bound_tx, bound_rx) = std::sync::mpsc::channel();
        let serve = move || {
            ringway_server::sfu::serve(&config, stop, |a| {
                let _ = bound_tx.send(a);
            })
            .map_err(anyhow::Error::from)
        };
        let handle = match self {
            Placement::Loopback => std::thread::spawn(serve),
            Placement::Hosts(t) => {
                let host = t.host("sfu").expect("built").clone();
                std::thread::spawn(move || host.run(serve)?)
            }
        };
        match bound_rx.recv_timeout(Duration::from_secs(10)) {
            Ok(addr) => Ok((addr, handle)),
            Err(_) => {
                let why = match handle.join() {
                    Ok(Err(e)) => format!("{e:#}"),
                    _ => "no address within 10 s".into(),
                };
                anyhow::bail!("the SFU did not start: {why}")
            }
        }
    }
}

/// One run: the SFU with `backend`, `clients` clients at `pps` each.
pub fn run_one(
    place: &Placement,
    c: &SfuLabConfig,
    backend: BackendKind,
    clients: usize,
    pps: u32,
    rep: usize,
) -> anyhow::Result<Run> {
    let stop = Arc::new(AtomicBool::new(false));
    let (addr, sfu) = place.start_sfu(place.sfu_config(c, backend)?, stop.clone())?;
    // 3 streams per client: interval = 3 / pps seconds.
    let load = SfuLoadConfig {
        interval_ms: 3000.0 / pps as f64,
        duration_s: c.duration_s,
        drain_s: 0.3,
        backend: BackendKind::Mmsg,
        in_netns: place.client_netns(clients),
        ..SfuLoadConfig::new(addr, clients)
    };
    let never = AtomicBool::new(false);
    let load = sfuload::run(&load, &never, None, |_| {});
    stop.store(true, Ordering::Relaxed);
    let served = sfu
        .join()
        .map_err(|_| anyhow::anyhow!("the SFU thread panicked"))?;
    let load = load.context("the load clients")?;
    let s = served?;
    let dur = load.duration_s.max(1e-3);
    let pct = |ns: u64| 100.0 * ns as f64 / 1e9 / dur;
    let or_nan = |count: u64, v: f64| if count > 0 { v } else { f64::NAN };
    Ok(Run {
        backend: backend.name().into(),
        clients,
        pps,
        rep,
        cpu_user_pct: pct(s.cpu.user_ns),
        cpu_system_pct: pct(s.cpu.system_ns),
        delay_p50_us: or_nan(s.delay.count, s.delay.p50_us),
        delay_p99_us: or_nan(s.delay.count, s.delay.p99_us),
        delay_mean_us: or_nan(s.delay.count, s.delay_mean_us),
        kdelay_p50_us: or_nan(s.delay_from_kernel.count, s.delay_from_kernel.p50_us),
        kdelay_p99_us: or_nan(s.delay_from_kernel.count, s.delay_from_kernel.p99_us),
        copies_per_packet: s.copies_per_packet,
        media: s.sfu.media_accepted,
        client_lost: load.lost,
        client_rtt_p50_us: or_nan(load.rtt.count, load.rtt.p50_us),
    })
}

/// Every run of the grid, in repetition-major order; a failed run is
/// reported through `progress` and left out. Returns the runs and the
/// number that failed.
pub fn run_grid(
    place: &Placement,
    c: &SfuLabConfig,
    mut progress: impl FnMut(&anyhow::Result<Run>, (usize, usize, u32, BackendKind)),
) -> (Vec<Run>, usize) {
    let mut runs = Vec::new();
    let mut failed = 0;
    for rep in 0..c.reps {
        for &n in &c.clients {
            for &pps in &c.pps {
                for &b in &c.backends {
                    let r = run_one(place, c, b, n, pps, rep);
                    progress(&r, (rep, n, pps, b));
                    match r {
                        Ok(r) => runs.push(r),
                        Err(_) => failed += 1,
                    }
                }
            }
        }
    }
    (runs, failed)
}
