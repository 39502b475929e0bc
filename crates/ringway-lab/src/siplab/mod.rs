//! One SIP experiment run and capacity sweeps.
//!
//! A run starts the proxy under test as a child process (`ringway sip
//! proxy` or Kamailio) inside the caller's network namespace, on its own
//! process-wide CPU set, under one scheduler mode (knobs mapped to this
//! kernel by [`kernel`], global ones recorded and restored through the state
//! file), drives it with the in-process generator ([`ringway_load::sip`]) on
//! the generator's CPUs at one rate for a duration, and collects the
//! papers' drop rate, per-message-type K_rcv / wait / T_sip / K_snd,
//! per-thread migrations and context switches, CPU and validity flags.

pub mod analysis;
pub mod background;
pub mod campaign;
pub mod compare;
pub mod design;
pub mod kernel;
pub mod mode;
pub mod model;
pub mod report;
pub mod sweep;
pub mod topology;
pub mod tune;
pub mod veth;

use crate::sched::SysState;
use kernel::{map_knobs, KernelVersion, Plan};
use mode::Knobs;
use ringway_io::thread::{parse_stat_cpu, CpuTime};
use ringway_io::BackendKind;
use ringway_load::sip::{ArrivalKind, LoadConfig};
use ringway_server::host::{process_cpu_time_of, USER_HZ};
use ringway_server::sip::service::ServiceTime;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use topology::{ThreadSched, Topology};

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

/// Everything that defines one run (all of it is in the resume key).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct RunSpec {
    /// Proxy under test.
    pub proxy: ProxyKind,
    /// Proxy mode (`stateless`/`stateful`; Kamailio: the shipped config of that mode unless `--kamailio-cfg`).
    pub mode: String,
    /// Proxy worker threads/processes (the papers' threads).
    pub workers: usize,
    /// Proxy socket backend (ringway only).
    pub backend: BackendKind,
    /// Scheduler mode name (`default`, `baseline`, `enhanced`, `tuned`, a file's name).
    pub sched: String,
    /// The mode's knobs resolved for this (cores, workers).
    pub knobs: Knobs,
    /// Cores given to the proxy (size of `proxy_cpus`).
    pub cores: usize,
    /// The proxy's CPU set (process-wide; the scheduler balances inside it).
    pub proxy_cpus: Vec<usize>,
    /// The generator's CPUs (empty: not pinned).
    pub gen_cpus: Vec<usize>,
    /// Receive model: `shared` (one socket read by all workers) or `reuseport`.
    pub rx_model: String,
    /// Datagrams per receive batch (1 = per-packet semantics; ringway only).
    pub batch: usize,
    /// Offered call rate (calls/s).
    pub rate: f64,
    /// Seconds of call starts.
    pub duration_s: f64,
    /// Repetition index.
    pub rep: u32,
    /// Generator RNG seed (differs per point and rep, shared across modes and proxies).
    pub seed: u64,
    /// Generator threads (each its own socket: a flow).
    pub gen_threads: usize,
    /// Proxy receive buffer request (bytes).
    pub rcvbuf: Option<usize>,
    /// Emulated service time per message (ringway only; `None`: off). Not
    /// serialised when off, so keys of earlier runs stay valid.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service: Option<ServiceTime>,
    /// Sweep-wide global settings in force (`--rmem-max`, `--knob`), as
    /// `PATH=VALUE` (empty: none; not serialised then).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub globals: Vec<String>,
    /// The wire between generator and proxy: `None` is loopback in one
    /// private namespace; `veth` / `veth-ipv6` the two-namespace testbed
    /// of `--netns` ([`veth`]). Not serialised for loopback, so keys of
    /// earlier runs stay valid.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wire: Option<String>,
    /// ringway's receive-coalescing window (µs, `--rx-coalesce-us`;
    /// `None`: off). Not serialised when off, so keys of earlier runs stay
    /// valid.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rx_coalesce_us: Option<u64>,
}

impl RunSpec {
    /// Label of the configuration for tables (proxy, receive model, batch, mode, cores).
    pub fn config_label(&self) -> String {
        if self.wire.is_some() {
            return veth::Arm::of(self).name();
        }
        match self.proxy {
            ProxyKind::Ringway => format!(
                "ringway/{}/b{}/{} c{}",
                self.rx_model, self.batch, self.sched, self.cores
            ),
            ProxyKind::Kamailio => format!("kamailio/{} c{}", self.sched, self.cores),
        }
    }
    /// Key identifying the run in a results file: every setting.
    pub fn key(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }
    /// Key of the point the run belongs to: every setting but rep and seed.
    pub fn point_key(&self) -> String {
        let mut key = self.clone();
        key.rep = 0;
        key.seed = 0;
        key.key()
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
    /// State file for global scheduler settings (recorded before, restored after).
    pub state_file: PathBuf,
    /// A run whose proxy CPUs carried more other load than this (% of
    /// their time) is flagged when it runs.
    pub max_foreign_cpu_pct: f64,
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
    /// Wait after processing until the send call (eq. 1: part of K_snd).
    #[serde(default)]
    pub wait: Lat,
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
    /// Validity flags (generator fell behind, shared CPUs): a flagged run
    /// is reported but not used for capacity.
    pub flags: Vec<String>,
    /// Packet drop rate, the papers' definition: drops of the proxy's own
    /// sockets / all messages offered to it (see [`drop_rate`]).
    pub pdr: f64,
    /// Drops of the proxy's sockets (per-socket counters, read after the
    /// last message of the run: receive-buffer and memory drops).
    pub proxy_socket_drops: u64,
    /// Drops of every other socket of the namespace (the generator's).
    pub other_socket_drops: u64,
    /// UDP RcvbufErrors delta of the run's namespace (cross-check).
    pub udp_rcvbuf_errors: u64,
    /// UDP MemErrors delta of the run's namespace (cross-check).
    pub udp_mem_errors: u64,
    /// Messages offered to the proxy (sent to its address by UAC and UAS,
    /// retransmissions and the end of the run included).
    pub total_msgs: u64,
    /// Call-setup messages offered (INVITE, 180, 200 to INVITE, ACK).
    pub setup_msgs: u64,
    /// Call-setup messages dropped (offered − received by the proxy; ringway only).
    pub setup_drops: Option<u64>,
    /// total_msgs / start phase: arrival rate at the proxy (packets/s).
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
    /// Calls the arrival schedule had due during the run.
    pub scheduled: u64,
    /// Mean delay of call starts behind the schedule (µs).
    pub start_lag_mean_us: f64,
    /// INVITE → 200 mean (ms).
    pub invite_200_ms: f64,
    /// Proxy CPU seconds (user + sys, all threads/processes).
    pub proxy_cpu_s: f64,
    /// Proxy CPU user seconds.
    pub proxy_cpu_user_s: f64,
    /// Proxy CPU sys seconds.
    pub proxy_cpu_sys_s: f64,
    /// Messages the proxy received (ringway only).
    pub proxy_msgs_in: Option<u64>,
    /// Wake-ups of the proxy's receive loops (ringway only; `None`: a
    /// summary without them): `proxy_msgs_in / proxy_wakeups` datagrams
    /// per wake-up.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proxy_wakeups: Option<u64>,
    /// Generator CPU seconds.
    pub gen_cpu_s: f64,
    /// Latencies over all message types (ringway only).
    pub all: Option<TypeLat>,
    /// Latencies per message type (ringway only).
    pub by_type: BTreeMap<String, TypeLat>,
    /// Messages received per worker (ringway only): the message share.
    pub per_worker_in: Vec<u64>,
    /// Topology of the proxy's CPU set.
    pub topology: Topology,
    /// Per-thread scheduler statistics of the proxy during the load.
    pub threads: Vec<ThreadSched>,
    /// Kernel version the run used.
    pub kernel: String,
    /// What the mode's knobs became here: applied settings.
    pub applied: Vec<String>,
    /// Knobs refused (gone or not writable) with the reason.
    pub refused: Vec<String>,
    /// Canonical text of the settings actually applied (modes with equal
    /// text applied the same settings).
    pub effective: String,
    /// Notes (placement refused, ...).
    pub notes: Vec<String>,
    /// Wall-clock seconds the run took.
    pub wall_s: f64,
    /// Other load on the proxy's CPUs during the load (`None`: unreadable,
    /// or a record from before it was measured).
    #[serde(default)]
    pub background: Option<background::Background>,
    /// Veth testbed: datagrams the veth pair dropped towards the proxy
    /// (the generator's end's TX drops and the proxy's end's RX drops),
    /// included in `proxy_socket_drops` and the PDR (`None`: loopback).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wire_drops: Option<u64>,
    /// Veth testbed, xdp backend: datagrams the AF_XDP socket dropped
    /// (no fill buffer, RX ring full), included in `proxy_socket_drops`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub xsk_drops: Option<u64>,
    /// Veth testbed: CPU seconds of the NAPI thread of the proxy's veth
    /// (its receive path in the kernel; `None`: loopback or unreadable).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proxy_napi_cpu_s: Option<f64>,
    /// Veth testbed: CPU seconds of the NAPI thread of the generator's veth.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gen_napi_cpu_s: Option<f64>,
}

impl RunRecord {
    /// A record with nothing measured yet.
    pub fn empty(spec: &RunSpec) -> RunRecord {
        RunRecord {
            key: spec.key(),
            spec: spec.clone(),
            error: None,
            flags: Vec::new(),
            pdr: 0.0,
            proxy_socket_drops: 0,
            other_socket_drops: 0,
            udp_rcvbuf_errors: 0,
            udp_mem_errors: 0,
            total_msgs: 0,
            setup_msgs: 0,
            setup_drops: None,
            arrival_pps: 0.0,
            attempted: 0,
            succeeded: 0,
            failed_ratio: 0.0,
            failed: BTreeMap::new(),
            achieved_cps: 0.0,
            scheduled: 0,
            start_lag_mean_us: 0.0,
            invite_200_ms: 0.0,
            proxy_cpu_s: 0.0,
            proxy_cpu_user_s: 0.0,
            proxy_cpu_sys_s: 0.0,
            proxy_msgs_in: None,
            proxy_wakeups: None,
            gen_cpu_s: 0.0,
            all: None,
            by_type: BTreeMap::new(),
            per_worker_in: Vec::new(),
            topology: Topology::default(),
            threads: Vec::new(),
            kernel: String::new(),
            applied: Vec::new(),
            refused: Vec::new(),
            effective: String::new(),
            notes: Vec::new(),
            wall_s: 0.0,
            background: None,
            wire_drops: None,
            xsk_drops: None,
            proxy_napi_cpu_s: None,
            gen_napi_cpu_s: None,
        }
    }

    /// Usable for capacity: no error and no validity flag.
    pub fn valid(&self) -> bool {
        self.error.is_none() && self.flags.is_empty()
    }
}

/// The failed-call share above which a run whose proxy dropped (almost)
/// nothing is noted: the calls failed for another reason (a proxy out of
/// memory answering 500, timeouts), which the PDR does not see.
pub const FAILED_CALLS_LIMIT: f64 = 0.01;

/// The note for a run whose calls failed while its proxy dropped less
/// than [`FAILED_CALLS_LIMIT`] of the messages (`None`: nothing to note).
pub fn failed_without_drops(pdr: f64, failed_ratio: f64) -> Option<String> {
    (failed_ratio >= FAILED_CALLS_LIMIT && pdr < FAILED_CALLS_LIMIT).then(|| {
        format!(
            "calls failed without drops: {:.1} % of calls failed at PDR {:.2} % (the proxy answered \
             errors or lost state: see its log); capacity also requires failed calls < {} %",
            100.0 * failed_ratio,
            100.0 * pdr,
            100.0 * FAILED_CALLS_LIMIT
        )
    })
}

/// Kamailio's shared memory (`-m`, MB) for `rate` calls/s in proxy `mode`:
/// stateless needs little (64 MB); stateful keeps every transaction (two
/// per call: INVITE and BYE) in shared memory until its wait timer ends
/// (fr_timer and wait_timer, about 10 s of transactions in all under load)
/// at some 4 KiB each, plus 64 MB for the rest; at most 4096 MB.
pub fn kamailio_shm_mb(rate: f64, mode: &str) -> u64 {
    const BASE_MB: u64 = 64;
    if mode != "stateful" {
        return BASE_MB;
    }
    let transactions = rate.max(0.0) * 2.0 * 10.0;
    let mb = (transactions * 4096.0 / (1024.0 * 1024.0)).ceil() as u64;
    (BASE_MB + mb).min(4096)
}

/// The papers' drop rate: drops of the proxy's sockets over all messages
/// offered to the proxy in the run; `None` when nothing was offered.
pub fn drop_rate(proxy_socket_drops: u64, offered: u64) -> Option<f64> {
    (offered > 0).then(|| proxy_socket_drops as f64 / offered as f64)
}

/// Least share of the scheduled calls the generator must start.
pub const MIN_ACHIEVED: f64 = 0.95;
/// Largest mean delay of call starts behind the schedule (µs).
pub const MAX_START_LAG_US: f64 = 5_000.0;

/// What the generator did, for the validity check.
#[derive(Copy, Clone, Debug, PartialEq)]
pub struct GenAchieved {
    /// Calls the Poisson schedule had due during the run.
    pub scheduled: u64,
    /// Calls started.
    pub attempted: u64,
    /// Mean delay of a start behind its scheduled time (µs).
    pub start_lag_mean_us: f64,
}

/// Validity flags of a run: the generator achieved less than 95% of the
/// offered (scheduled) calls or started them late on average, or the
/// generator and the proxy may share CPUs (generator not pinned, the sets
/// overlap, or a proxy thread may run on a generator CPU).
pub fn validity_flags(
    gen: GenAchieved,
    gen_cpus: &[usize],
    proxy_cpus: &[usize],
    proxy_threads_allowed: &[Vec<usize>],
) -> Vec<String> {
    let mut flags = Vec::new();
    if (gen.attempted as f64) < MIN_ACHIEVED * gen.scheduled as f64 {
        flags.push(format!(
            "generator fell behind: started {} of {} scheduled calls ({:.1}% < {:.0}%)",
            gen.attempted,
            gen.scheduled,
            100.0 * gen.attempted as f64 / (gen.scheduled.max(1)) as f64,
            100.0 * MIN_ACHIEVED
        ));
    } else if gen.start_lag_mean_us > MAX_START_LAG_US {
        flags.push(format!(
            "generator fell behind: call starts {:.0} µs late on average (> {:.0} µs)",
            gen.start_lag_mean_us, MAX_START_LAG_US
        ));
    }
    if gen_cpus.is_empty() {
        flags.push("shared CPUs: the generator is not pinned (--gen-cpus)".into());
    } else if let Some(shared_cpu) = gen_cpus
        .iter()
        .find(|shared_cpu| proxy_cpus.contains(shared_cpu))
    {
        flags.push(format!(
            "shared CPUs: CPU {shared_cpu} is in both the proxy's and the generator's sets"
        ));
    } else if let Some(shared_cpu) = proxy_threads_allowed
        .iter()
        .flatten()
        .find(|shared_cpu| gen_cpus.contains(shared_cpu))
    {
        flags.push(format!(
            "shared CPUs: a proxy thread may run on generator CPU {shared_cpu}"
        ));
    }
    flags
}

const PROXY_ADDR: &str = "127.0.0.1:5060";

/// Where the proxy listens and whom it may relay to.
struct ProxyWire {
    /// The proxy's address.
    listen: SocketAddr,
    /// `--relay` of ringway (the generator's UAS addresses).
    relay: String,
    /// `--interface` of ringway's xdp backend.
    interface: Option<String>,
}

impl ProxyWire {
    /// Loopback in one private namespace (the default lab).
    fn loopback() -> ProxyWire {
        ProxyWire {
            listen: PROXY_ADDR.parse().expect("valid"),
            relay: "127.0.0.0/8".into(),
            interface: None,
        }
    }
}

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
    let text = std::fs::read_to_string(path).unwrap_or_default();
    if let Some(last) = text
        .lines()
        .find(|last| last.starts_with("Error") || last.contains("ERROR:"))
    {
        return last.trim().to_string();
    }
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join(" | ")
}

/// Start the proxy of `spec` on `wire` (its log and summary in `dir`) and
/// wait until it listens.
fn start_proxy(
    spec: &RunSpec,
    plan: &Plan,
    tools: &Tools,
    dir: &Path,
    wire: &ProxyWire,
    notes: &mut Vec<String>,
) -> anyhow::Result<ProxyProc> {
    let log = dir.join("proxy.log");
    let logf = std::fs::File::create(&log)?;
    let (mut cmd, summary) = match spec.proxy {
        ProxyKind::Ringway => {
            let sum = dir.join("proxy-summary.json");
            let _ = std::fs::remove_file(&sum);
            (ringway_command(spec, plan, tools, wire, &sum), Some(sum))
        }
        ProxyKind::Kamailio => (kamailio_command(spec, plan, tools, dir, wire, notes)?, None),
    };
    // Its own process group, so that stopping it reaches every process it
    // forked (Kamailio's children) even when the parent has to be killed.
    cmd.process_group(0);
    cmd.stdin(Stdio::null())
        .stdout(logf.try_clone()?)
        .stderr(logf);
    let mut child = cmd
        .spawn()
        .map_err(|e| anyhow::anyhow!("cannot start {:?}: {e}", cmd.get_program()))?;
    wait_until_bound(&mut child, spec, wire, &log)?;
    Ok(ProxyProc {
        child,
        summary,
        log,
    })
}

/// `ringway sip proxy` as the run `spec` asks for it, writing its summary
/// to `summary`.
fn ringway_command(
    spec: &RunSpec,
    plan: &Plan,
    tools: &Tools,
    wire: &ProxyWire,
    summary: &Path,
) -> Command {
    let cpus = topology::cpu_list_text(&spec.proxy_cpus);
    let mut cmd;
    if plan.pin_threads {
        cmd = Command::new(&tools.ringway);
        cmd.args(["sip", "proxy", "--cpus", &cpus]);
    } else {
        // One process-wide CPU set: the scheduler balances and
        // migrates the threads inside it.
        cmd = Command::new("taskset");
        cmd.args(["-c", &cpus])
            .arg(&tools.ringway)
            .args(["sip", "proxy"]);
    }
    // The generator's UAS is on loopback: relayed to explicitly.
    cmd.args(["--listen", &wire.listen.to_string(), "--mode", &spec.mode])
        .args(["--relay", &wire.relay])
        .args(["--workers", &spec.workers.to_string()])
        .args(["--backend", spec.backend.name()])
        .args(["--duration", &format!("{}", spec.duration_s + 120.0)])
        .arg("--summary")
        .arg(summary)
        .arg("--quiet")
        .args(["--rx-model", &spec.rx_model])
        .args(["--batch", &spec.batch.to_string()])
        // The papers measure raw forwarding under overload (and
        // Kamailio next to it sheds nothing): no 503 shedding.
        .args(["--overload-queue-delay-ms", "0"])
        .args(plan.thread.proxy_args());
    if let Some(rcvbuf) = spec.rcvbuf {
        cmd.args(["--rcvbuf", &rcvbuf.to_string()]);
    }
    if let Some(interface) = &wire.interface {
        // Native only: a generic-mode program would be another path.
        cmd.args(["--interface", interface, "--xdp-mode", "native"]);
    }
    if let Some(service) = spec.service {
        cmd.args(["--emulated-service-us", &service.to_string()]);
    }
    if let Some(window) = spec.rx_coalesce_us {
        cmd.args(["--rx-coalesce-us", &window.to_string()]);
    }
    cmd
}

/// Kamailio as the run `spec` asks for it (its run directory in `dir`);
/// what it cannot apply goes to `notes`.
fn kamailio_command(
    spec: &RunSpec,
    plan: &Plan,
    tools: &Tools,
    dir: &Path,
    wire: &ProxyWire,
    notes: &mut Vec<String>,
) -> anyhow::Result<Command> {
    let cpus = topology::cpu_list_text(&spec.proxy_cpus);
    let mut prefix = match plan.thread.external_prefix() {
        Ok(p) => p,
        Err(e) => {
            notes.push(e);
            Vec::new()
        }
    };
    if plan.pin_threads {
        notes.push(
            "kamailio: affinity = thread not applied (its children are processes; one process-wide set used)"
                .into(),
        );
    }
    prefix.splice(0..0, ["taskset".to_string(), "-c".into(), cpus]);
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
            &format!("udp:{}", wire.listen),
            "-n",
            &spec.workers.to_string(),
            "-P",
            &dir.join("kamailio.pid").display().to_string(),
            "-Y",
            &rundir.display().to_string(),
            "-w",
            &rundir.display().to_string(),
            "-m",
            &kamailio_shm_mb(spec.rate, &spec.mode).to_string(),
            "-M",
            "8",
        ]
        .iter()
        .map(|s| s.to_string()),
    );
    if spec.rcvbuf.is_some() {
        notes.push("kamailio: --rcvbuf not applied (kernel default buffer)".into());
    }
    if spec.service.is_some() {
        notes.push("kamailio: no emulated service time (its own T_sip, not measured)".into());
    }
    let mut cmd = Command::new(&args[0]);
    cmd.args(&args[1..]);
    Ok(cmd)
}

/// Wait (at most 10 s) until something listens on the proxy's port; a
/// proxy that exits or does not bind in time is an error (and killed).
fn wait_until_bound(
    child: &mut Child,
    spec: &RunSpec,
    wire: &ProxyWire,
    log: &Path,
) -> anyhow::Result<()> {
    let started = Instant::now();
    loop {
        if let Some(status) = child.try_wait()? {
            anyhow::bail!(
                "{} exited during start-up ({status}): {}",
                spec.proxy.name(),
                tail(log, 5)
            );
        }
        if udp_port_bound(wire.listen.port()) {
            break;
        }
        if started.elapsed() > Duration::from_secs(10) {
            kill_group(child.id(), "KILL");
            let _ = child.wait();
            anyhow::bail!(
                "{} did not bind {} within 10 s",
                spec.proxy.name(),
                wire.listen
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    // Kamailio forks its workers after binding; give them a moment.
    if spec.proxy == ProxyKind::Kamailio {
        std::thread::sleep(Duration::from_millis(300));
    }
    Ok(())
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
    while let Some(parent) = frontier.pop() {
        seen += 1;
        if seen > 4096 {
            break;
        }
        let Ok(dir) = std::fs::read_dir("/proc") else {
            break;
        };
        for e in dir.flatten() {
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
            if ppid == Some(parent) {
                if let Ok(cpu) = parse_stat_cpu(&stat, USER_HZ) {
                    total = total + cpu;
                }
                frontier.push(cpid);
            }
        }
    }
    total
}

fn stop_proxy(p: &mut ProxyProc) -> anyhow::Result<Option<std::process::ExitStatus>> {
    let pid = p.child.id();
    if let Some(status) = p.child.try_wait()? {
        return Ok(Some(status));
    }
    // SIGINT: stop now (SIGTERM makes `ringway sip proxy` drain first,
    // up to its --drain-timeout; Kamailio stops on either).
    kill_group(pid, "INT");
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(10) {
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
    anyhow::bail!("proxy pid {pid} ignored SIGINT for 10 s; killed")
}

/// How a run's proxy ended: an error if it was gone before the end of the
/// run (with its log's error line), else a note if it had exited by
/// itself or had to be killed ([`stop_proxy`]'s answer).
fn proxy_ended(
    spec: &RunSpec,
    proxy: &ProxyProc,
    alive: bool,
    stopped: anyhow::Result<Option<std::process::ExitStatus>>,
    notes: &mut Vec<String>,
) -> anyhow::Result<()> {
    if !alive {
        anyhow::bail!(
            "{} died during the run: {}",
            spec.proxy.name(),
            tail(&proxy.log, 5)
        );
    }
    match stopped {
        Ok(Some(status)) => notes.push(format!("proxy had already exited: {status}")),
        Ok(None) => {}
        Err(e) => notes.push(e.to_string()),
    }
    Ok(())
}

/// The stopped proxy's JSON summary, if it writes one; a note says why it
/// could not be read.
fn proxy_summary(proxy: &ProxyProc, notes: &mut Vec<String>) -> Option<serde_json::Value> {
    let path = proxy.summary.as_ref()?;
    let summary = std::fs::read_to_string(path)
        .map_err(anyhow::Error::from)
        .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).map_err(Into::into));
    match summary {
        Ok(summary) => Some(summary),
        Err(e) => {
            notes.push(format!("proxy summary unreadable: {e}"));
            None
        }
    }
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
        wait: lat(&v["wait_batch"]),
    }
}

/// The scheduler plan of a spec on this kernel, from what the lab can
/// write here (`ringway_io::doctor::sched_knob_access`).
pub fn plan_for(knobs: &Knobs) -> (Plan, String) {
    let access = ringway_io::doctor::sched_knob_access();
    let writable = |plan: &str| -> Result<(), String> {
        match access.iter().find(|a| a.path == plan) {
            Some(a) => a.writable.clone(),
            None => Err("not probed".into()),
        }
    };
    match KernelVersion::running() {
        Some(v) => (map_knobs(knobs, v, &writable), v.to_string()),
        None => {
            let mut plan = Plan::default();
            if !knobs.is_empty() {
                plan.refused
                    .push("kernel version unreadable: no knob mapped".into());
            }
            (plan, "unknown".into())
        }
    }
}

/// Messages of one call-setup type received by the proxy (summary label).
const SETUP_LABELS: [&str; 4] = ["INVITE", "180", "200", "ACK"];

/// Run one experiment point. Call it inside a private network namespace
/// (see [`run_isolated`]): the proxy binds 127.0.0.1:5060 and the UDP
/// counters and sockets of the namespace are the run's.
pub fn run_one(spec: &RunSpec, tools: &Tools) -> RunRecord {
    let started = Instant::now();
    let mut rec = RunRecord::empty(spec);
    let (plan, kernel) = plan_for(&spec.knobs);
    rec.kernel = kernel;
    rec.effective = plan.effective();
    rec.refused = plan.refused.clone();
    rec.applied = plan.mapped.clone();
    rec.topology = topology::detect(&spec.proxy_cpus);
    // Global knobs: recorded in the state file before they change,
    // restored when the run ends (a crash is recovered at the next start).
    let (state, msgs) = SysState::apply(&tools.state_file, &plan.globals);
    for m in msgs {
        if m.starts_with("not applied") {
            rec.refused.push(m);
        } else {
            rec.applied.push(m);
        }
    }
    if let Err(error) = run_inner(spec, &plan, tools, &mut rec) {
        rec.error = Some(format!("{error:#}"));
    }
    for m in state.restore() {
        if m.starts_with("could not") {
            rec.notes.push(m);
        }
    }
    rec.wall_s = started.elapsed().as_secs_f64();
    rec
}

/// The generator's threads start from this thread: they inherit its CPUs.
fn pin_generator(spec: &RunSpec) -> anyhow::Result<()> {
    if !spec.gen_cpus.is_empty() {
        let outcome = ringway_io::thread::set_affinity(&spec.gen_cpus);
        if !outcome.is_applied() {
            anyhow::bail!(
                "cannot pin the generator to CPUs {:?}: {outcome}",
                spec.gen_cpus
            );
        }
    }
    Ok(())
}

/// An external proxy's threads get the mode's slice from here
/// (sched_setattr); ringway sets its own.
fn slice_kamailio_threads(spec: &RunSpec, plan: &Plan, pid: u32, rec: &mut RunRecord) {
    let (ProxyKind::Kamailio, Some(slice_us)) = (spec.proxy, plan.thread.slice_us) else {
        return;
    };
    let threads = topology::tree_threads(pid);
    let mut applied = 0;
    for thread in &threads {
        let outcome =
            ringway_io::thread::set_slice_of(thread.tid as i32, Duration::from_micros(slice_us));
        if outcome.is_applied() {
            applied += 1;
        } else {
            rec.refused.push(format!(
                "slice {slice_us} µs on kamailio thread {}: {outcome}",
                thread.tid
            ));
        }
    }
    rec.applied.push(format!(
        "slice {slice_us} µs set on {applied} of {} kamailio threads",
        threads.len()
    ));
}

/// The proxy's port.
const PROXY_PORT: u16 = 5060;

/// The counters a run reads before and after its load.
struct Counters {
    /// Drops of the proxy's sockets.
    proxy_drops: u64,
    /// Drops of every socket of the namespace.
    all_drops: u64,
    snmp: ringway_io::counters::UdpSnmp,
    threads: Vec<topology::ThreadSched>,
    cpu: CpuTime,
    /// Ticks of the proxy's CPUs.
    ticks: Option<background::CpuTicks>,
}

impl Counters {
    fn read(pid: u32, proxy_cpus: &[usize]) -> Counters {
        Counters {
            ticks: background::read(proxy_cpus),
            proxy_drops: ringway_io::counters::socket_drops_by_port(PROXY_PORT).unwrap_or(0),
            all_drops: ringway_io::counters::udp_sockets()
                .map(|sockets| sockets.iter().map(|s| s.drops).sum())
                .unwrap_or(0),
            snmp: ringway_server::host::udp_totals().unwrap_or_default(),
            threads: topology::tree_threads(pid),
            cpu: tree_cpu(pid),
        }
    }
}

/// The generator's configuration for `spec`.
fn generator_config(spec: &RunSpec) -> LoadConfig {
    LoadConfig {
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
        // K_rcv would show the bursts).
        tick: Some(Duration::from_millis(1)),
        ..LoadConfig::default()
    }
}

/// Run the generator against the proxy `pid`; if the proxy dies (or
/// `stop` is set: SIGINT), the generator ends at once instead of waiting
/// for every call to time out.
fn run_generator(
    cfg: &LoadConfig,
    pid: u32,
    stop: Option<std::sync::Arc<std::sync::atomic::AtomicBool>>,
) -> anyhow::Result<ringway_load::sip::LoadSummary> {
    use std::sync::atomic::{AtomicBool, Ordering};
    let live = std::sync::Arc::new(ringway_load::sip::Live::default());
    let done = std::sync::Arc::new(AtomicBool::new(false));
    let watcher = {
        let (live, done) = (live.clone(), done.clone());
        std::thread::spawn(move || {
            while !done.load(Ordering::Relaxed) {
                let stopped = stop.as_ref().is_some_and(|s| s.load(Ordering::Relaxed));
                if stopped || !pid_alive(pid) {
                    live.abort.store(true, Ordering::Relaxed);
                    return;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        })
    };
    let summary = ringway_load::sip::run(cfg, live, None);
    done.store(true, Ordering::Relaxed);
    let _ = watcher.join();
    summary
}

/// What the generator saw, the drop counters' differences (the PDR), the
/// threads' scheduling and CPU, and the validity flags.
fn record_load(
    spec: &RunSpec,
    load: &ringway_load::sip::LoadSummary,
    (before, after): (&Counters, &Counters),
    rec: &mut RunRecord,
    notes: &mut Vec<String>,
) {
    rec.attempted = load.attempted;
    rec.succeeded = load.succeeded;
    rec.failed_ratio = load.failed_ratio;
    rec.failed = load.failed.clone();
    rec.achieved_cps = load.achieved_cps;
    rec.invite_200_ms = load.invite_to_200.mean_us / 1000.0;
    rec.gen_cpu_s = load.cpu.total_s();
    rec.total_msgs = load.msgs_to_proxy;
    rec.setup_msgs = load.setup_to_proxy;
    rec.arrival_pps = load.msgs_to_proxy as f64 / load.start_phase_s.max(1e-9);
    rec.proxy_socket_drops = after.proxy_drops.saturating_sub(before.proxy_drops);
    rec.other_socket_drops = after
        .all_drops
        .saturating_sub(before.all_drops)
        .saturating_sub(rec.proxy_socket_drops);
    let snmp = after.snmp.since(&before.snmp);
    rec.udp_rcvbuf_errors = snmp.rcvbuf_errors;
    rec.udp_mem_errors = snmp.mem_errors;
    rec.pdr = drop_rate(rec.proxy_socket_drops, load.msgs_to_proxy).unwrap_or(0.0);
    notes.extend(failed_without_drops(rec.pdr, rec.failed_ratio));
    let namespace_drops = snmp.rcvbuf_errors + snmp.mem_errors;
    if namespace_drops > rec.proxy_socket_drops + rec.other_socket_drops {
        notes.push(format!(
            "namespace counted {namespace_drops} receive drops (RcvbufErrors {} + MemErrors {}) but its sockets {}: a socket closed early?",
            snmp.rcvbuf_errors,
            snmp.mem_errors,
            rec.proxy_socket_drops + rec.other_socket_drops
        ));
    }
    rec.threads = topology::since(&after.threads, &before.threads);
    let allowed: Vec<Vec<usize>> = rec
        .threads
        .iter()
        .filter_map(|t| topology::parse_cpu_list(&t.cpus_allowed).ok())
        .collect();
    rec.scheduled = load.scheduled;
    rec.start_lag_mean_us = load.start_lag_mean_us;
    rec.flags = validity_flags(
        GenAchieved {
            scheduled: load.scheduled,
            attempted: load.attempted,
            start_lag_mean_us: load.start_lag_mean_us,
        },
        &spec.gen_cpus,
        &spec.proxy_cpus,
        &allowed,
    );
    let cpu = after.cpu.since(&before.cpu);
    rec.proxy_cpu_user_s = cpu.user_ns as f64 / 1e9;
    rec.proxy_cpu_sys_s = cpu.system_ns as f64 / 1e9;
    rec.proxy_cpu_s = cpu.total_s();
}

/// Other load on the proxy's CPUs over the load window, and its flag.
/// `extra_ns`: CPU of the proxy's host outside its processes (the veth
/// testbed's NAPI thread), not counted as other load.
fn record_background(
    (before, after): (&Counters, &Counters),
    extra_ns: u64,
    loadavg: f64,
    max_pct: f64,
    rec: &mut RunRecord,
) {
    let (Some(ticks_before), Some(ticks_after)) = (before.ticks, after.ticks) else {
        return;
    };
    let proxy_ns = after.cpu.since(&before.cpu).total_ns() + extra_ns;
    rec.background = background::background(
        ticks_before,
        ticks_after,
        proxy_ns,
        1_000_000_000 / USER_HZ,
        loadavg,
    );
    if let Some(flag) = rec
        .background
        .as_ref()
        .and_then(|b| background::flag(b, max_pct))
    {
        rec.flags.push(flag);
    }
}

/// The ringway proxy's JSON summary: per-type latencies, messages per
/// worker, call-setup drops, its own CPU figure and its placement.
fn record_proxy_summary(
    spec: &RunSpec,
    summary: &serde_json::Value,
    rec: &mut RunRecord,
    notes: &mut Vec<String>,
) {
    if let Some(by_type) = summary["by_type"].as_object() {
        for (label, value) in by_type {
            rec.by_type.insert(label.clone(), type_lat(value));
        }
    }
    rec.all = Some(type_lat(&summary["all"]));
    rec.proxy_msgs_in = summary["messages"]["in"].as_u64();
    rec.proxy_wakeups = summary["messages"]["wakeups"].as_u64();
    let asked = spec.rx_coalesce_us.unwrap_or(0);
    let ran = summary["config"]["rx_coalesce_us"].as_u64().unwrap_or(0);
    if spec.proxy == ProxyKind::Ringway && ran != asked {
        rec.flags.push(format!(
            "the proxy ran with receive coalescing {ran} µs, not the {asked} µs asked"
        ));
    }
    rec.per_worker_in = summary["messages"]["per_worker_in"]
        .as_array()
        .map(|a| a.iter().filter_map(|x| x.as_u64()).collect())
        .unwrap_or_default();
    let reuseport = spec.rx_model == "reuseport" && spec.proxy == ProxyKind::Ringway;
    if reuseport && rec.per_worker_in.contains(&0) {
        notes.push(format!(
            "reuseport: a worker got no message (share {:?}; {} generator flows)",
            rec.per_worker_in, spec.gen_threads
        ));
    }
    let received: u64 = SETUP_LABELS
        .iter()
        .map(|label| rec.by_type.get(*label).map_or(0, |t| t.count))
        .sum();
    rec.setup_drops = Some(rec.setup_msgs.saturating_sub(received));
    if let (Some(user), Some(sys)) = (
        summary["cpu"]["process"]["user_s"].as_f64(),
        summary["cpu"]["process"]["sys_s"].as_f64(),
    ) {
        // The proxy's own whole-run figure is more precise than ticks.
        rec.proxy_cpu_user_s = user;
        rec.proxy_cpu_sys_s = sys;
        rec.proxy_cpu_s = user + sys;
    }
    if let Some(placement) = summary["placement"].as_array() {
        for line in placement.iter().filter_map(|x| x.as_str()) {
            if line.contains("refused") || line.contains("not applied") || line.contains("failed") {
                rec.refused.push(format!("placement: {line}"));
            } else {
                rec.applied.push(format!("placement: {line}"));
            }
        }
    }
}

fn run_inner(
    spec: &RunSpec,
    plan: &Plan,
    tools: &Tools,
    rec: &mut RunRecord,
) -> anyhow::Result<()> {
    let dir = tools.work_dir.join(format!("run-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    pin_generator(spec)?;
    let mut notes = Vec::new();
    let mut proxy = start_proxy(spec, plan, tools, &dir, &ProxyWire::loopback(), &mut notes)?;
    let pid = proxy.child.id();
    slice_kamailio_threads(spec, plan, pid, rec);
    let loadavg = background::loadavg1().unwrap_or(f64::NAN);
    let before = Counters::read(pid, &spec.proxy_cpus);
    let load = run_generator(&generator_config(spec), pid, None);
    // Every message of the run has arrived or timed out: read the drop
    // counters of the proxy's sockets now, while they still exist.
    let after = Counters::read(pid, &spec.proxy_cpus);
    let alive = proxy.child.try_wait()?.is_none();
    let stopped = stop_proxy(&mut proxy);
    record_load(spec, &load?, (&before, &after), rec, &mut notes);
    record_background(
        (&before, &after),
        0,
        loadavg,
        tools.max_foreign_cpu_pct,
        rec,
    );
    proxy_ended(spec, &proxy, alive, stopped, &mut notes)?;
    if spec.proxy == ProxyKind::Kamailio && spec.rx_model == "reuseport" {
        notes.push(
            "kamailio: its UDP children share one socket (rx-model reuseport does not apply)"
                .into(),
        );
    }
    if let Some(summary) = proxy_summary(&proxy, &mut notes) {
        record_proxy_summary(spec, &summary, rec, &mut notes);
    }
    rec.notes.extend(notes);
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

/// [`run_one`] inside a fresh private network namespace (only `lo`).
pub fn run_isolated(spec: &RunSpec, tools: &Tools) -> RunRecord {
    let (spec_copy, tools_copy) = (spec.clone(), tools.clone());
    match ringway_io::netns::in_private_netns(move || run_one(&spec_copy, &tools_copy)) {
        Ok(record) => record,
        Err(e) => {
            let mut record = RunRecord::empty(spec);
            record.error = Some(format!("cannot create a private network namespace: {e}"));
            record
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drop_rate_is_proxy_socket_drops_over_all_offered_messages() {
        // Paper A Table I, 2 threads at 2200 cps: 3926 / 633487 = 0.0062.
        assert!((drop_rate(3926, 633_487).unwrap() - 0.006197).abs() < 1e-6);
        assert_eq!(drop_rate(0, 1000), Some(0.0));
        assert_eq!(drop_rate(5, 0), None);
        assert_eq!(drop_rate(10, 10), Some(1.0));
    }

    fn gen(scheduled: u64, attempted: u64, lag: f64) -> GenAchieved {
        GenAchieved {
            scheduled,
            attempted,
            start_lag_mean_us: lag,
        }
    }

    #[test]
    fn failed_calls_without_drops_are_noted() {
        // 5 % of calls failed, 0.1 % of messages dropped: noted.
        let n = failed_without_drops(0.001, 0.05).expect("a note");
        assert!(n.contains("5.0 % of calls failed at PDR 0.10 %"), "{n}");
        // Failures that follow drops, or few failures: nothing to note.
        assert_eq!(failed_without_drops(0.02, 0.05), None);
        assert_eq!(failed_without_drops(0.0, 0.009), None);
        assert!(failed_without_drops(0.0, 0.01).is_some());
    }

    #[test]
    fn kamailio_memory_follows_the_rate_when_stateful() {
        assert_eq!(kamailio_shm_mb(4000.0, "stateless"), 64);
        // 4000 calls/s: 80,000 transactions x 4 KiB = 312.5 MiB -> 313 + 64.
        assert_eq!(kamailio_shm_mb(4000.0, "stateful"), 377);
        assert_eq!(kamailio_shm_mb(0.0, "stateful"), 64);
        assert_eq!(kamailio_shm_mb(1e9, "stateful"), 4096);
    }

    #[test]
    fn validity_flags_catch_a_slow_generator_and_shared_cpus() {
        assert!(validity_flags(gen(1000, 1000, 300.0), &[1], &[0], &[vec![0]]).is_empty());
        // 95% is the limit: 950 of 1000 passes, 949 does not.
        assert!(validity_flags(gen(1000, 950, 0.0), &[1], &[0], &[]).is_empty());
        let f = validity_flags(gen(1000, 949, 0.0), &[1], &[0], &[]);
        assert_eq!(f.len(), 1);
        assert!(f[0].contains("generator fell behind"), "{f:?}");
        let f = validity_flags(gen(1000, 1000, 6000.0), &[1], &[0], &[]);
        assert!(f[0].contains("late"), "{f:?}");
        let f = validity_flags(gen(10, 10, 0.0), &[], &[0], &[]);
        assert!(f[0].contains("not pinned"), "{f:?}");
        let f = validity_flags(gen(10, 10, 0.0), &[0], &[0, 1], &[]);
        assert!(f[0].contains("CPU 0 is in both"), "{f:?}");
        let f = validity_flags(gen(10, 10, 0.0), &[1], &[0], &[vec![0], vec![0, 1]]);
        assert!(f[0].contains("generator CPU 1"), "{f:?}");
        let mut r = RunRecord::empty(&test_spec());
        assert!(r.valid());
        r.flags = f;
        assert!(!r.valid());
    }

    fn test_spec() -> RunSpec {
        RunSpec {
            proxy: ProxyKind::Ringway,
            mode: "stateless".into(),
            workers: 2,
            backend: BackendKind::Mmsg,
            sched: "baseline".into(),
            knobs: Knobs::default(),
            cores: 1,
            proxy_cpus: vec![0],
            gen_cpus: vec![1],
            rx_model: "shared".into(),
            batch: 32,
            rate: 200.0,
            duration_s: 2.0,
            rep: 0,
            seed: 7,
            gen_threads: 2,
            rcvbuf: None,
            service: None,
            globals: Vec::new(),
            wire: None,
            rx_coalesce_us: None,
        }
    }

    #[test]
    fn the_resume_key_holds_every_setting_and_the_point_key_all_but_rep_and_seed() {
        let a = test_spec();
        type Change = Box<dyn Fn(&mut RunSpec)>;
        let variants: Vec<Change> = vec![
            Box::new(|s| s.knobs.slice_us = Some(300)),
            Box::new(|s| s.rcvbuf = Some(1 << 20)),
            Box::new(|s| s.rx_model = "reuseport".into()),
            Box::new(|s| s.batch = 1),
            Box::new(|s| s.cores = 2),
            Box::new(|s| s.proxy_cpus = vec![2]),
            Box::new(|s| s.gen_cpus = vec![3]),
            Box::new(|s| s.seed = 8),
            Box::new(|s| s.duration_s = 3.0),
            Box::new(|s| s.gen_threads = 4),
            Box::new(|s| s.service = Some(ServiceTime::Constant { us: 200 })),
            Box::new(|s| s.globals = vec!["/proc/sys/net/core/rmem_max=8388608".into()]),
            Box::new(|s| s.wire = Some("veth".into())),
        ];
        for (i, v) in variants.iter().enumerate() {
            let mut b = a.clone();
            v(&mut b);
            assert_ne!(a.key(), b.key(), "variant {i} not in the key");
            if i != 7 {
                assert_ne!(
                    a.point_key(),
                    b.point_key(),
                    "variant {i} not in the point key"
                );
            }
        }
        let mut b = a.clone();
        b.rep = 1;
        b.seed = 99;
        assert_ne!(a.key(), b.key());
        assert_eq!(a.point_key(), b.point_key());
    }
}
