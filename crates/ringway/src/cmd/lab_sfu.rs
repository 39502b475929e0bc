//! `ringway lab sfu`: SFU experiments (pktswitch Fig. 3-5). For every
//! repetition, client count, per-client packet rate and backend it starts
//! `ringway sfu serve` and `ringway sfu load` (every client subscribes to
//! all, so each packet is copied to clients − 1 subscribers plus the echo),
//! collects the SFU engine's CPU user/kernel time and per-packet delay, and
//! prints a table with 95% CIs, ratios to the socket baseline and the
//! fitted delay model d(n) = k_rcv + n·k_snd.
//!
//! Everything runs inside a private network namespace with only `lo`
//! (default), or with `--netns` in a veth topology: the SFU in one namespace
//! host and the load in another (`ip netns`, names carry the PID, removed
//! afterwards).

use anyhow::{bail, Context};
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
    /// Backends to compare (the first `socket` is the baseline).
    #[arg(long, default_value = "socket,mmsg", value_delimiter = ',')]
    pub backends: Vec<BackendKind>,
    /// Repetitions of every cell.
    #[arg(long, default_value_t = 3)]
    pub reps: usize,
    /// Seconds of load per run.
    #[arg(long, default_value_t = 5.0)]
    pub duration: f64,
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
    /// In named namespaces: (sfu ns, sfu ip, load ns).
    Hosts(String, String, String),
}

impl Place {
    fn command(&self, host_is_sfu: bool) -> Command {
        match self {
            Place::Loopback => Command::new(std::env::current_exe().expect("own path")),
            Place::Hosts(sfu, _, load) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", if host_is_sfu { sfu } else { load }])
                    .arg(std::env::current_exe().expect("own path"));
                c
            }
        }
    }
    fn listen(&self) -> String {
        match self {
            Place::Loopback => "127.0.0.1:0".into(),
            Place::Hosts(_, ip, _) => format!("{ip}:0"),
        }
    }
}

/// Two namespace hosts joined by a veth pair; removed on drop.
struct Topology {
    sfu: String,
    load: String,
}

impl Topology {
    fn create() -> anyhow::Result<Topology> {
        let id = std::process::id();
        let t = Topology {
            sfu: format!("rw-sfu-{id}"),
            load: format!("rw-load-{id}"),
        };
        let (va, vb) = (format!("rws{id}"), format!("rwl{id}"));
        let steps: Vec<Vec<String>> = vec![
            vec!["netns".into(), "add".into(), t.sfu.clone()],
            vec!["netns".into(), "add".into(), t.load.clone()],
            vec![
                "link".into(),
                "add".into(),
                va.clone(),
                "netns".into(),
                t.sfu.clone(),
                "type".into(),
                "veth".into(),
                "peer".into(),
                "name".into(),
                vb.clone(),
                "netns".into(),
                t.load.clone(),
            ],
        ];
        for s in &steps {
            run_ip(None, s)?;
        }
        for (ns, dev, ip) in [
            (&t.sfu, &va, "10.201.0.1/24"),
            (&t.load, &vb, "10.201.0.2/24"),
        ] {
            run_ip(Some(ns), &["addr", "add", ip, "dev", dev])?;
            run_ip(Some(ns), &["link", "set", dev, "up"])?;
            run_ip(Some(ns), &["link", "set", "lo", "up"])?;
        }
        Ok(t)
    }
}

impl Drop for Topology {
    fn drop(&mut self) {
        for ns in [&self.sfu, &self.load] {
            let _ = Command::new("ip").args(["netns", "del", ns]).status();
        }
    }
}

fn run_ip<S: AsRef<str>>(ns: Option<&str>, args: &[S]) -> anyhow::Result<()> {
    let mut c = Command::new("ip");
    if let Some(n) = ns {
        c.args(["-n", n]);
    }
    c.args(args.iter().map(|a| a.as_ref()));
    let st = c.status().context("running ip")?;
    if !st.success() {
        bail!(
            "ip {:?} failed",
            args.iter().map(|a| a.as_ref()).collect::<Vec<_>>()
        );
    }
    Ok(())
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
    let mut srv = place.command(true);
    srv.args(["sfu", "serve", "--listen", &place.listen()])
        .args(["--backend", backend.name(), "--stats-interval", "0"])
        .args(["--duration", &format!("{}", a.duration + 60.0)])
        .arg("--json")
        .arg(&sj)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    if let Some(c) = &a.cpus {
        srv.args(["--cpus", c]);
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
    let mut load = place.command(false);
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
        copies_per_packet: f(&s["copies_per_packet"]),
        media: s["sfu"]["media_accepted"].as_u64().unwrap_or(0),
        client_lost: l["lost"].as_u64().unwrap_or(0),
        client_rtt_p50_us: f(&l["rtt"]["p50_us"]),
    })
}

fn experiment(a: LabSfuArgs) -> anyhow::Result<()> {
    let dir = TempDir::new()?;
    let topo = if a.netns {
        Some(Topology::create()?)
    } else {
        None
    };
    let place = match &topo {
        Some(t) => Place::Hosts(t.sfu.clone(), "10.201.0.1".into(), t.load.clone()),
        None => Place::Loopback,
    };
    let total = a.reps * a.clients.len() * a.pps.len() * a.backends.len();
    println!(
        "ringway lab sfu: {total} runs of {:.0}s ({}), clients {:?}, pps/client {:?}, backends {:?}",
        a.duration,
        if a.netns { "veth hosts" } else { "private netns, lo" },
        a.clients,
        a.pps,
        a.backends.iter().map(|b| b.name()).collect::<Vec<_>>()
    );
    let mut runs = Vec::new();
    for rep in 0..a.reps {
        for &n in &a.clients {
            for &pps in &a.pps {
                for &b in &a.backends {
                    let r = run_one(&place, &a, dir.path(), b, n, pps, rep)?;
                    println!(
                        "run rep={rep} clients={n} pps={pps} backend={b}: cpu user={:.1}% kern={:.1}% \
                         delay p50={:.1}us p99={:.1}us copies={:.1} media={} client_lost={}",
                        r.cpu_user_pct,
                        r.cpu_system_pct,
                        r.delay_p50_us,
                        r.delay_p99_us,
                        r.copies_per_packet,
                        r.media,
                        r.client_lost
                    );
                    runs.push(r);
                }
            }
        }
    }
    drop(topo);
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
    if a.netns {
        // Named namespaces are created by `ip`; the processes run via `ip netns exec`.
        return experiment(a);
    }
    ringway_io::netns::in_private_netns(move || experiment(a))?
}
