//! One SIP experiment run and capacity sweeps.
//!
//! A run starts the proxy under test as a child process (`ringway sip
//! proxy` or Kamailio) inside the caller's network namespace, drives it
//! with the in-process generator ([`crate::sipload`]) at one rate for a
//! duration, stops the proxy by PID and collects PDR, failed calls, CPU
//! and (for ringway) the per-message-type K_rcv / T_sip / K_snd means and
//! 95% CIs from the proxy's JSON summary.

pub mod sweep;

use crate::sched::Profile;
use crate::sipload::{self, ArrivalKind, LoadConfig};
use ringway_io::thread::{parse_stat_cpu, CpuTime};
use ringway_io::BackendKind;
use ringway_server::host::{process_cpu_time_of, USER_HZ};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Which proxy is under test.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ProxyKind {
    /// `ringway sip proxy`.
    Ringway,
    /// Kamailio with bench/kamailio/stateless.cfg.
    Kamailio,
}

impl ProxyKind {
    /// Name on the command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            ProxyKind::Ringway => "ringway",
            ProxyKind::Kamailio => "kamailio",
        }
    }
}

impl std::str::FromStr for ProxyKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "ringway" => Ok(ProxyKind::Ringway),
            "kamailio" => Ok(ProxyKind::Kamailio),
            _ => Err(format!("unknown proxy {s:?} (ringway, kamailio)")),
        }
    }
}

/// Everything that defines one run.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct RunSpec {
    /// Proxy under test.
    pub proxy: ProxyKind,
    /// Proxy mode (`stateless`/`stateful`; Kamailio: always stateless).
    pub mode: String,
    /// Proxy worker threads/processes.
    pub workers: usize,
    /// Proxy socket backend (ringway only).
    pub backend: BackendKind,
    /// Scheduler profile of the proxy threads.
    pub profile: Profile,
    /// CPU list for the proxy (`0-1`), if pinned.
    pub cpus: Option<String>,
    /// Offered call rate (calls/s).
    pub rate: f64,
    /// Seconds of call starts.
    pub duration_s: f64,
    /// Repetition index.
    pub rep: u32,
    /// Generator RNG seed.
    pub seed: u64,
    /// Generator threads.
    pub gen_threads: usize,
    /// Proxy receive buffer request (bytes).
    pub rcvbuf: Option<usize>,
}

impl RunSpec {
    /// Label of the configuration (everything but rate and rep).
    pub fn config_label(&self) -> String {
        config_label(self.proxy, &self.mode, self.backend, &self.profile.name)
    }
    /// Key identifying the run in a results file.
    pub fn key(&self) -> String {
        format!(
            "{}|w{}|r{}|d{}|rep{}|cpus{}|g{}",
            self.config_label(),
            self.workers,
            self.rate,
            self.duration_s,
            self.rep,
            self.cpus.as_deref().unwrap_or("-"),
            self.gen_threads
        )
    }
}

/// Label of a configuration (`ringway/stateless/mmsg/default`, `kamailio/default`).
pub fn config_label(proxy: ProxyKind, mode: &str, backend: BackendKind, profile: &str) -> String {
    match proxy {
        ProxyKind::Ringway => format!("ringway/{mode}/{}/{profile}", backend.name()),
        ProxyKind::Kamailio => format!("kamailio/{profile}"),
    }
}

/// Where to find the programs and configs a run starts.
#[derive(Clone, Debug)]
pub struct Tools {
    /// The `ringway` binary (usually `std::env::current_exe()`).
    pub ringway: PathBuf,
    /// The `kamailio` binary.
    pub kamailio: PathBuf,
    /// Kamailio config (bench/kamailio/stateless.cfg).
    pub kamailio_cfg: PathBuf,
    /// Directory for per-run files (summaries, pid files, logs).
    pub work_dir: PathBuf,
}

/// Mean and 95% CI (µs) of one latency, `None` where not available.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Lat {
    /// Samples.
    pub count: u64,
    /// Mean (µs).
    pub mean_us: f64,
    /// 95% CI half-width (µs).
    pub ci95_us: f64,
}

/// Per message type latencies from the proxy summary.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct TypeLat {
    /// Messages of this type.
    pub count: u64,
    /// Kernel RX → application.
    pub k_rcv: Lat,
    /// Processing in the proxy core.
    pub t_sip: Lat,
    /// Application → kernel TX.
    pub k_snd: Lat,
}

/// Result of one run (one line of `runs.jsonl`).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct RunRecord {
    /// The run's parameters.
    pub spec: RunSpec,
    /// Key (see [`RunSpec::key`]).
    pub key: String,
    /// Error that spoiled the run (proxy died, did not start, ...).
    pub error: Option<String>,
    /// Packet drop rate: UDP RcvbufErrors delta / messages offered to the proxy.
    pub pdr: f64,
    /// PDR as the proxy reported it (ringway only).
    pub pdr_proxy: Option<f64>,
    /// UDP RcvbufErrors delta of the run's namespace.
    pub rcvbuf_errors: u64,
    /// Datagrams the proxy's sockets reported dropped (SO_RXQ_OVFL; ringway only).
    pub socket_drops: Option<u64>,
    /// Messages offered to the proxy (sent to its address by UAC and UAS).
    pub total_msgs: u64,
    /// total_msgs / duration: arrival rate at the proxy (packets/s).
    pub arrival_pps: f64,
    /// Calls attempted.
    pub attempted: u64,
    /// Calls succeeded.
    pub succeeded: u64,
    /// Failed calls / attempted.
    pub failed_ratio: f64,
    /// Failed calls by reason.
    pub failed: BTreeMap<String, u64>,
    /// Achieved call rate.
    pub achieved_cps: f64,
    /// INVITE → 200 mean (ms).
    pub invite_200_ms: f64,
    /// Proxy CPU seconds (user + sys, all threads/processes).
    pub proxy_cpu_s: f64,
    /// Proxy CPU user seconds.
    pub proxy_cpu_user_s: f64,
    /// Proxy CPU sys seconds.
    pub proxy_cpu_sys_s: f64,
    /// Generator CPU seconds.
    pub gen_cpu_s: f64,
    /// Latencies over all message types (ringway only).
    pub all: Option<TypeLat>,
    /// Latencies per message type (ringway only).
    pub by_type: BTreeMap<String, TypeLat>,
    /// Notes (profile not applicable, placement refused, ...).
    pub notes: Vec<String>,
    /// Wall-clock seconds the run took.
    pub wall_s: f64,
}

impl RunRecord {
    fn empty(spec: &RunSpec) -> RunRecord {
        RunRecord {
            key: spec.key(),
            spec: spec.clone(),
            error: None,
            pdr: 0.0,
            pdr_proxy: None,
            rcvbuf_errors: 0,
            socket_drops: None,
            total_msgs: 0,
            arrival_pps: 0.0,
            attempted: 0,
            succeeded: 0,
            failed_ratio: 0.0,
            failed: BTreeMap::new(),
            achieved_cps: 0.0,
            invite_200_ms: 0.0,
            proxy_cpu_s: 0.0,
            proxy_cpu_user_s: 0.0,
            proxy_cpu_sys_s: 0.0,
            gen_cpu_s: 0.0,
            all: None,
            by_type: BTreeMap::new(),
            notes: Vec::new(),
            wall_s: 0.0,
        }
    }
}

const PROXY_ADDR: &str = "127.0.0.1:5060";

/// A started proxy process.
struct ProxyProc {
    child: Child,
    summary: Option<PathBuf>,
    log: PathBuf,
}

fn udp_port_bound(port: u16) -> bool {
    ringway_io::counters::udp_sockets()
        .map(|rows| rows.iter().any(|r| r.local.port() == port))
        .unwrap_or(false)
}

/// The error line of a log (`Error: ...`, as anyhow prints it), else its last `n` lines.
fn tail(path: &Path, n: usize) -> String {
    let t = std::fs::read_to_string(path).unwrap_or_default();
    if let Some(l) = t
        .lines()
        .find(|l| l.starts_with("Error") || l.contains("ERROR:"))
    {
        return l.trim().to_string();
    }
    let lines: Vec<&str> = t.lines().collect();
    lines[lines.len().saturating_sub(n)..].join(" | ")
}

fn start_proxy(
    spec: &RunSpec,
    tools: &Tools,
    dir: &Path,
    notes: &mut Vec<String>,
) -> anyhow::Result<ProxyProc> {
    let log = dir.join("proxy.log");
    let logf = std::fs::File::create(&log)?;
    let mut cmd;
    let mut summary = None;
    match spec.proxy {
        ProxyKind::Ringway => {
            let sum = dir.join("proxy-summary.json");
            let _ = std::fs::remove_file(&sum);
            cmd = Command::new(&tools.ringway);
            cmd.args(["sip", "proxy", "--listen", PROXY_ADDR, "--mode", &spec.mode])
                .args(["--workers", &spec.workers.to_string()])
                .args(["--backend", spec.backend.name()])
                .args(["--duration", &format!("{}", spec.duration_s + 120.0)])
                .arg("--summary")
                .arg(&sum)
                .arg("--quiet")
                .args(spec.profile.proxy_args());
            if let Some(c) = &spec.cpus {
                cmd.args(["--cpus", c]);
            }
            if let Some(b) = spec.rcvbuf {
                cmd.args(["--rcvbuf", &b.to_string()]);
            }
            summary = Some(sum);
        }
        ProxyKind::Kamailio => {
            let mut prefix = match spec.profile.external_prefix() {
                Ok(p) => p,
                Err(e) => {
                    notes.push(e);
                    Vec::new()
                }
            };
            if let Some(c) = &spec.cpus {
                prefix.splice(0..0, ["taskset".to_string(), "-c".into(), c.clone()]);
            }
            let rundir = dir.join("kamailio-run");
            std::fs::create_dir_all(&rundir)?;
            let mut args: Vec<String> = prefix;
            args.push(tools.kamailio.display().to_string());
            args.extend(
                [
                    "-DD",
                    "-E",
                    "-f",
                    &tools.kamailio_cfg.display().to_string(),
                    "-l",
                    &format!("udp:{PROXY_ADDR}"),
                    "-n",
                    &spec.workers.to_string(),
                    "-P",
                    &dir.join("kamailio.pid").display().to_string(),
                    "-Y",
                    &rundir.display().to_string(),
                    "-w",
                    &rundir.display().to_string(),
                    "-m",
                    "64",
                    "-M",
                    "8",
                ]
                .iter()
                .map(|s| s.to_string()),
            );
            if spec.rcvbuf.is_some() {
                notes.push("kamailio: --rcvbuf not applied (kernel default buffer)".into());
            }
            cmd = Command::new(&args[0]);
            cmd.args(&args[1..]);
        }
    }
    // Its own process group, so that stopping it reaches every process it
    // forked (Kamailio's children) even when the parent has to be killed.
    cmd.process_group(0);
    cmd.stdin(Stdio::null())
        .stdout(logf.try_clone()?)
        .stderr(logf);
    let mut child = cmd
        .spawn()
        .map_err(|e| anyhow::anyhow!("cannot start {:?}: {e}", cmd.get_program()))?;
    // Ready when something listens on the proxy port (bounded wait).
    let t0 = Instant::now();
    let port: SocketAddr = PROXY_ADDR.parse().expect("valid");
    loop {
        if let Some(st) = child.try_wait()? {
            anyhow::bail!(
                "{} exited during start-up ({st}): {}",
                spec.proxy.name(),
                tail(&log, 5)
            );
        }
        if udp_port_bound(port.port()) {
            break;
        }
        if t0.elapsed() > Duration::from_secs(10) {
            kill_group(child.id(), "KILL");
            let _ = child.wait();
            anyhow::bail!(
                "{} did not bind {PROXY_ADDR} within 10 s",
                spec.proxy.name()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    // Kamailio forks its workers after binding; give them a moment.
    if spec.proxy == ProxyKind::Kamailio {
        std::thread::sleep(Duration::from_millis(300));
    }
    Ok(ProxyProc {
        child,
        summary,
        log,
    })
}

/// True while `pid` exists and is not a zombie.
fn pid_alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(st) => st
            .rfind(')')
            .and_then(|i| st[i + 1..].split_whitespace().next())
            .is_some_and(|state| state != "Z" && state != "X"),
        Err(_) => false,
    }
}

/// CPU of `pid` and all its descendants (Kamailio forks worker processes).
fn tree_cpu(pid: u32) -> CpuTime {
    let mut total = process_cpu_time_of(pid).unwrap_or_default();
    let mut frontier = vec![pid];
    let mut seen = 0;
    while let Some(p) = frontier.pop() {
        seen += 1;
        if seen > 4096 {
            break;
        }
        let Ok(rd) = std::fs::read_dir("/proc") else {
            break;
        };
        for e in rd.flatten() {
            let Some(cpid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
                continue;
            };
            let Ok(stat) = std::fs::read_to_string(format!("/proc/{cpid}/stat")) else {
                continue;
            };
            let ppid = stat
                .rfind(')')
                .and_then(|i| stat[i + 1..].split_whitespace().nth(1))
                .and_then(|s| s.parse::<u32>().ok());
            if ppid == Some(p) {
                if let Ok(c) = parse_stat_cpu(&stat, USER_HZ) {
                    total = total + c;
                }
                frontier.push(cpid);
            }
        }
    }
    total
}

fn stop_proxy(p: &mut ProxyProc) -> anyhow::Result<Option<std::process::ExitStatus>> {
    let pid = p.child.id();
    if let Some(st) = p.child.try_wait()? {
        return Ok(Some(st));
    }
    kill_group(pid, "TERM");
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(10) {
        if p.child.try_wait()?.is_some() {
            // Anything of the group still alive (a child the proxy did not
            // take down with it) goes too.
            kill_group(pid, "KILL");
            return Ok(None);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    kill_group(pid, "KILL");
    let _ = p.child.wait();
    anyhow::bail!("proxy pid {pid} ignored SIGTERM for 10 s; killed")
}

fn lat(v: &serde_json::Value) -> Lat {
    Lat {
        count: v["count"].as_u64().unwrap_or(0),
        mean_us: v["mean_us"].as_f64().unwrap_or(0.0),
        ci95_us: v["ci95_us"].as_f64().unwrap_or(0.0),
    }
}

fn type_lat(v: &serde_json::Value) -> TypeLat {
    TypeLat {
        count: v["count"].as_u64().unwrap_or(0),
        k_rcv: lat(&v["k_rcv"]),
        t_sip: lat(&v["t_sip"]),
        k_snd: lat(&v["k_snd"]),
    }
}

/// Run one experiment point. Call it inside a private network namespace
/// (see [`run_isolated`]): the proxy binds 127.0.0.1:5060 and the UDP
/// counters of the namespace are taken as the proxy's.
pub fn run_one(spec: &RunSpec, tools: &Tools) -> RunRecord {
    let t0 = Instant::now();
    let mut rec = RunRecord::empty(spec);
    if let Err(e) = run_inner(spec, tools, &mut rec) {
        rec.error = Some(format!("{e:#}"));
    }
    rec.wall_s = t0.elapsed().as_secs_f64();
    rec
}

fn run_inner(spec: &RunSpec, tools: &Tools, rec: &mut RunRecord) -> anyhow::Result<()> {
    let dir = tools.work_dir.join(format!("run-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let mut notes = Vec::new();
    let mut proxy = start_proxy(spec, tools, &dir, &mut notes)?;
    let pid = proxy.child.id();
    let snmp0 = ringway_io::counters::udp_snmp().unwrap_or_default();
    let cpu0 = tree_cpu(pid);
    let cfg = LoadConfig {
        proxy: Some(PROXY_ADDR.parse().expect("valid")),
        uas: None,
        rate: spec.rate,
        arrival: ArrivalKind::Poisson,
        seed: spec.seed,
        calls: ((spec.rate * spec.duration_s).ceil() as u64).max(1),
        duration: Duration::from_secs_f64(spec.duration_s),
        threads: spec.gen_threads,
        backend: BackendKind::Mmsg,
        // Short T1 keeps overloaded runs bounded; retransmissions are rare below capacity.
        t1: Duration::from_millis(500),
        t2: Duration::from_secs(4),
        // A fixed 1 ms tick keeps the Poisson arrivals fine-grained at low
        // rates too (the automatic tick would batch up to 10 ms there, and
        // K_rcv would show the bursts); from 8000 calls/s per generator
        // thread up the automatic tick is 1 ms anyway.
        tick: Some(Duration::from_millis(1)),
        ..LoadConfig::default()
    };
    let live = std::sync::Arc::new(sipload::Live::default());
    // If the proxy dies, end the generator at once instead of waiting for
    // every call to time out.
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let watcher = {
        let (live, done) = (live.clone(), done.clone());
        std::thread::spawn(move || {
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                if !pid_alive(pid) {
                    live.abort.store(true, std::sync::atomic::Ordering::Relaxed);
                    return;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        })
    };
    let gen = sipload::run(&cfg, live, None);
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    let _ = watcher.join();
    let cpu1 = tree_cpu(pid);
    let snmp1 = ringway_io::counters::udp_snmp().unwrap_or_default();
    let alive = proxy.child.try_wait()?.is_none();
    let stopped = stop_proxy(&mut proxy);
    let gen = gen?;
    rec.attempted = gen.attempted;
    rec.succeeded = gen.succeeded;
    rec.failed_ratio = gen.failed_ratio;
    rec.failed = gen.failed.clone();
    rec.achieved_cps = gen.achieved_cps;
    rec.invite_200_ms = gen.invite_to_200.mean_us / 1000.0;
    rec.gen_cpu_s = gen.cpu.total_s();
    rec.total_msgs = gen.msgs_to_proxy;
    rec.arrival_pps = gen.msgs_to_proxy as f64 / gen.start_phase_s.max(1e-9);
    let d = snmp1.since(&snmp0);
    // The generator's own sockets are in the namespace too: take their
    // reported drops out of the namespace total.
    rec.rcvbuf_errors = d.rcvbuf_errors.saturating_sub(gen.rx_dropped);
    rec.pdr = if gen.msgs_to_proxy > 0 {
        rec.rcvbuf_errors as f64 / gen.msgs_to_proxy as f64
    } else {
        0.0
    };
    let cpu = cpu1.since(&cpu0);
    rec.proxy_cpu_user_s = cpu.user_ns as f64 / 1e9;
    rec.proxy_cpu_sys_s = cpu.system_ns as f64 / 1e9;
    rec.proxy_cpu_s = cpu.total_s();
    if !alive {
        anyhow::bail!(
            "{} died during the run: {}",
            spec.proxy.name(),
            tail(&proxy.log, 5)
        );
    }
    match stopped {
        Ok(Some(st)) => notes.push(format!("proxy had already exited: {st}")),
        Ok(None) => {}
        Err(e) => notes.push(e.to_string()),
    }
    if let Some(sum) = &proxy.summary {
        match std::fs::read_to_string(sum)
            .map_err(anyhow::Error::from)
            .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).map_err(Into::into))
        {
            Ok(v) => {
                rec.pdr_proxy = v["drops"]["pdr"].as_f64();
                rec.socket_drops = v["drops"]["socket_rxq_ovfl"].as_u64();
                if let Some(m) = v["by_type"].as_object() {
                    for (k, t) in m {
                        rec.by_type.insert(k.clone(), type_lat(t));
                    }
                }
                rec.all = Some(type_lat(&v["all"]));
                if let (Some(u), Some(s)) = (
                    v["cpu"]["process"]["user_s"].as_f64(),
                    v["cpu"]["process"]["sys_s"].as_f64(),
                ) {
                    // The proxy's own whole-run figure is more precise than ticks.
                    rec.proxy_cpu_user_s = u;
                    rec.proxy_cpu_sys_s = s;
                    rec.proxy_cpu_s = u + s;
                }
                if let Some(pl) = v["placement"].as_array() {
                    for p in pl.iter().filter_map(|x| x.as_str()) {
                        if p.contains("refused")
                            || p.contains("not applied")
                            || p.contains("failed")
                        {
                            notes.push(format!("placement: {p}"));
                        }
                    }
                }
            }
            Err(e) => notes.push(format!("proxy summary unreadable: {e}")),
        }
    }
    rec.notes = notes;
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

/// [`run_one`] inside a fresh private network namespace (only `lo`).
pub fn run_isolated(spec: &RunSpec, tools: &Tools) -> RunRecord {
    let (s, t) = (spec.clone(), tools.clone());
    match ringway_io::netns::in_private_netns(move || run_one(&s, &t)) {
        Ok(r) => r,
        Err(e) => {
            let mut r = RunRecord::empty(spec);
            r.error = Some(format!("cannot create a private network namespace: {e}"));
            r
        }
    }
}

/// Send `SIG<sig>` to the process group led by `pid` (the proxy and all it
/// forked; spawned with `process_group(0)`). Errors (group gone) are ignored.
fn kill_group(pid: u32, sig: &str) {
    let _ = Command::new("kill")
        .args([&format!("-{sig}"), "--", &format!("-{pid}")])
        .stderr(Stdio::null())
        .status();
}
