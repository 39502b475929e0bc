//! `ringway lab sfu`: SFU experiments (pktswitch Fig. 3-5). For every
//! repetition, client count, per-client packet rate and backend it starts
//! `ringway sfu serve` and `ringway sfu load` (every client subscribes to
//! all, so each packet is copied to clients − 1 subscribers plus the echo),
//! collects the SFU engine's CPU user/kernel time and per-packet delay, and
//! prints a table with 95% CIs, ratios to the socket baseline and the
//! fitted delay model d(n) = k_rcv + n·k_snd.
//!
//! Everything runs inside a private network namespace with only `lo`
//! (default), or with `--netns` in the paper's testbed shape: the SFU in one
//! namespace host and each client in its own host, joined by veth to one
//! bridge (ringway-io's `Topology`, names carry the PID, removed afterwards).

use anyhow::{bail, Context};
use ringway_io::netns::Topology;
use ringway_io::BackendKind;
use ringway_lab::sfulab::{render, summarize, svg, Run};
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// `ringway lab sfu` options.
#[derive(clap::Args, Debug, Clone)]
pub struct LabSfuArgs {
    /// Client counts.
    #[arg(long, default_value = "6,8,10", value_delimiter = ',')]
    pub clients: Vec<usize>,
    /// Packets per second sent by each client (3 streams: ASQ, VSQ, VHQ).
    #[arg(long, default_value = "750,1500", value_delimiter = ',')]
    pub pps: Vec<u32>,
    /// Backends to compare (the first `socket` is the baseline). `xdp`
    /// needs `--netns` (it attaches to the SFU host's veth).
    #[arg(long, default_value = "socket,mmsg", value_delimiter = ',')]
    pub backends: Vec<BackendKind>,
    /// Repetitions of every cell.
    #[arg(long, default_value_t = 3)]
    pub reps: usize,
    /// Seconds of load per run.
    #[arg(long, default_value_t = 5.0)]
    pub duration: f64,
    /// SFU send flush policy (`batch`: one send call per receive batch;
    /// `packet`: after each packet's copies).
    #[arg(long, default_value = "batch")]
    pub flush: super::sfu::serve::Flush,
    /// Pin the SFU engine thread to these CPUs.
    #[arg(long)]
    pub cpus: Option<String>,
    /// Run the SFU and the load in separate namespace hosts joined by veth.
    #[arg(long)]
    pub netns: bool,
    /// Write runs and summary as JSON.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Write an SVG plot of delay versus copies per packet.
    #[arg(long)]
    pub svg: Option<PathBuf>,
}

/// Where the SFU and the load run.
enum Place {
    /// Both on `lo` of the current (private) namespace.
    Loopback,
    /// SFU in namespace host `sfu`, client i in host `c<i>`, all on one bridge.
    Hosts(Topology),
}

impl Place {
    fn server_command(&self) -> Command {
        let exe = std::env::current_exe().expect("own path");
        match self {
            Place::Loopback => Command::new(exe),
            Place::Hosts(t) => t
                .host("sfu")
                .expect("built")
                .command(exe.to_str().expect("utf-8 path")),
        }
    }
    /// Interface of the SFU host (for `--xdp-iface`).
    fn sfu_iface(&self) -> Option<String> {
        match self {
            Place::Loopback => None,
            Place::Hosts(t) => t
                .host("sfu")
                .and_then(|h| h.ifaces.first())
                .map(|i| i.0.clone()),
        }
    }
    fn listen(&self) -> String {
        match self {
            Place::Loopback => "127.0.0.1:0".into(),
            Place::Hosts(t) => format!("{}:0", t.host("sfu").expect("built").addr()),
        }
    }
    /// `--in-netns` list for `n` clients (empty on loopback).
    fn client_netns(&self, n: usize) -> Vec<String> {
        match self {
            Place::Loopback => Vec::new(),
            Place::Hosts(t) => (0..n)
                .map(|i| t.host(&format!("c{i}")).expect("built").netns.clone())
                .collect(),
        }
    }
}

fn terminate(child: &mut Child) {
    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    let until = Instant::now() + Duration::from_secs(10);
    while Instant::now() < until {
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// A scratch directory removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new() -> anyhow::Result<TempDir> {
        let p = std::env::temp_dir().join(format!("ringway-lab-sfu-{}", std::process::id()));
        std::fs::create_dir_all(&p)?;
        Ok(TempDir(p))
    }
    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Kills the child by PID when dropped (error paths).
struct Guard(Child);

impl Drop for Guard {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

fn read_json(p: &Path) -> anyhow::Result<serde_json::Value> {
    let t = std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?;
    Ok(serde_json::from_str(&t)?)
}

fn f(v: &serde_json::Value) -> f64 {
    v.as_f64().unwrap_or(f64::NAN)
}

#[allow(clippy::too_many_arguments)]
fn run_one(
    place: &Place,
    a: &LabSfuArgs,
    dir: &Path,
    backend: BackendKind,
    clients: usize,
    pps: u32,
    rep: usize,
) -> anyhow::Result<Run> {
    let sj = dir.join(format!("serve-{backend}-{clients}-{pps}-{rep}.json"));
    let lj = dir.join(format!("load-{backend}-{clients}-{pps}-{rep}.json"));
    let mut srv = place.server_command();
    srv.args(["sfu", "serve", "--listen", &place.listen()])
        .args(["--backend", backend.name(), "--stats-interval", "0"])
        .args([
            "--flush",
            match a.flush {
                super::sfu::serve::Flush::Batch => "batch",
                super::sfu::serve::Flush::Packet => "packet",
            },
        ])
        .args(["--duration", &format!("{}", a.duration + 60.0)])
        .arg("--json")
        .arg(&sj)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    if let Some(c) = &a.cpus {
        srv.args(["--cpus", c]);
    }
    if backend == BackendKind::Xdp {
        let iface = place
            .sfu_iface()
            .context("xdp backend needs --netns (veth hosts)")?;
        srv.args(["--xdp-iface", &iface]);
    }
    let mut srv = Guard(srv.spawn().context("starting ringway sfu serve")?);
    let mut line = String::new();
    BufReader::new(srv.0.stdout.as_mut().expect("piped")).read_line(&mut line)?;
    let addr: SocketAddr = line
        .split_whitespace()
        .find_map(|w| w.parse().ok())
        .with_context(|| format!("no address in {line:?}"))?;
    // 3 streams per client: interval = 3 / pps seconds.
    let interval_ms = 3000.0 / pps as f64;
    let mut load = Command::new(std::env::current_exe()?);
    load.args(["sfu", "load", "--clients", &clients.to_string()])
        .args(["--server", &addr.to_string()])
        .args(["--interval-ms", &format!("{interval_ms}")])
        .args(["--duration", &format!("{}", a.duration)])
        .args([
            "--stats-interval",
            "0",
            "--drain",
            "0.3",
            "--backend",
            "mmsg",
        ])
        .arg("--json")
        .arg(&lj)
        .args(
            Some(place.client_netns(clients).join(","))
                .filter(|h| !h.is_empty())
                .map(|h| ["--in-netns".to_string(), h])
                .into_iter()
                .flatten(),
        )
        .stdout(Stdio::null())
        .stderr(Stdio::inherit());
    let mut load = Guard(load.spawn().context("starting ringway sfu load")?);
    let until = Instant::now() + Duration::from_secs_f64(a.duration + 60.0);
    loop {
        if let Some(st) = load.0.try_wait()? {
            if !st.success() {
                bail!("ringway sfu load failed: {st}");
            }
            break;
        }
        if Instant::now() > until {
            bail!("ringway sfu load did not finish in time");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    terminate(&mut srv.0);
    let s = read_json(&sj)?;
    let l = read_json(&lj)?;
    let dur = f(&l["duration_s"]).max(1e-3);
    Ok(Run {
        backend: backend.name().into(),
        clients,
        pps,
        rep,
        cpu_user_pct: 100.0 * f(&s["cpu"]["user_s"]) / dur,
        cpu_system_pct: 100.0 * f(&s["cpu"]["system_s"]) / dur,
        delay_p50_us: f(&s["delay"]["p50_us"]),
        delay_p99_us: f(&s["delay"]["p99_us"]),
        delay_mean_us: f(&s["delay_mean_us"]),
        kdelay_p50_us: f(&s["delay_from_kernel"]["p50_us"]),
        kdelay_p99_us: f(&s["delay_from_kernel"]["p99_us"]),
        copies_per_packet: f(&s["copies_per_packet"]),
        media: s["sfu"]["media_accepted"].as_u64().unwrap_or(0),
        client_lost: l["lost"].as_u64().unwrap_or(0),
        client_rtt_p50_us: f(&l["rtt"]["p50_us"]),
    })
}

fn experiment(a: LabSfuArgs) -> anyhow::Result<()> {
    let dir = TempDir::new()?;
    let place = if a.netns {
        let max = a.clients.iter().copied().max().unwrap_or(1);
        let mut b = Topology::builder().host("sfu");
        for i in 0..max {
            b = b.host(&format!("c{i}"));
        }
        Place::Hosts(
            b.bridge()
                .build()
                .context("building the namespace topology")?,
        )
    } else {
        Place::Loopback
    };
    let total = a.reps * a.clients.len() * a.pps.len() * a.backends.len();
    println!(
        "ringway lab sfu: {total} runs of {:.0}s ({}), clients {:?}, pps/client {:?}, backends {:?}, flush {:?}",
        a.duration,
        if a.netns { "veth hosts" } else { "private netns, lo" },
        a.clients,
        a.pps,
        a.backends.iter().map(|b| b.name()).collect::<Vec<_>>(),
        a.flush
    );
    let mut runs = Vec::new();
    let mut failed = 0usize;
    for rep in 0..a.reps {
        for &n in &a.clients {
            for &pps in &a.pps {
                for &b in &a.backends {
                    let r = match run_one(&place, &a, dir.path(), b, n, pps, rep) {
                        Ok(r) => r,
                        Err(e) => {
                            // One failed run (overloaded machine) must not lose the sweep.
                            eprintln!(
                                "run rep={rep} clients={n} pps={pps} backend={b} failed: {e:#}"
                            );
                            failed += 1;
                            continue;
                        }
                    };
                    println!(
                        "run rep={rep} clients={n} pps={pps} backend={b}: cpu user={:.1}% kern={:.1}% \
                         delay p50={:.1}us p99={:.1}us kdelay p50={:.1}us copies={:.1} media={} \
                         client_lost={}",
                        r.cpu_user_pct,
                        r.cpu_system_pct,
                        r.delay_p50_us,
                        r.delay_p99_us,
                        r.kdelay_p50_us,
                        r.copies_per_packet,
                        r.media,
                        r.client_lost
                    );
                    runs.push(r);
                }
            }
        }
    }
    drop(place);
    anyhow::ensure!(!runs.is_empty(), "every run failed");
    if failed > 0 {
        println!("{failed} of {total} runs failed (see stderr); summary over the rest");
    }
    let s = summarize(&runs);
    print!("{}", render(&s));
    if let Some(p) = &a.json {
        let v = serde_json::json!({ "runs": runs, "summary": s });
        std::fs::write(p, serde_json::to_vec_pretty(&v)?)?;
    }
    if let Some(p) = &a.svg {
        std::fs::write(p, svg(&runs, &s))?;
    }
    Ok(())
}

/// Run `ringway lab sfu`.
pub fn run(a: LabSfuArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        a.reps >= 1 && !a.clients.is_empty() && !a.pps.is_empty() && !a.backends.is_empty(),
        "need at least one repetition, client count, rate and backend"
    );
    anyhow::ensure!(a.pps.iter().all(|&p| p > 0), "--pps must be positive");
    anyhow::ensure!(
        a.netns || !a.backends.contains(&BackendKind::Xdp),
        "the xdp backend needs --netns (it attaches to the SFU host's veth)"
    );
    if a.netns {
        // Named namespaces are created by `ip`; the processes run via `ip netns exec`.
        return experiment(a);
    }
    ringway_io::netns::in_private_netns(move || experiment(a))?
}
