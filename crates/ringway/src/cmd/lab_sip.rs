//! `ringway lab sip`: SIP capacity sweeps and reports.

use ringway_lab::report::{self, ReportInput};
use ringway_lab::sched::{Knob, SysState};
use ringway_lab::siplab::sweep::{self, BarProgress, Store, SweepConfig};
use ringway_lab::siplab::{ProxyKind, Tools};
use std::path::PathBuf;
use std::sync::atomic::Ordering;

/// The Kamailio config shipped in bench/kamailio/, used unless --kamailio-cfg is given.
const KAMAILIO_CFG: &str = include_str!("../../../../bench/kamailio/stateless.cfg");

/// Arguments of `ringway lab sip`.
#[derive(clap::Args, Debug)]
pub(crate) struct LabSipArgs {
    /// Proxies to measure (comma-separated): ringway, kamailio.
    #[arg(long, value_delimiter = ',', default_value = "ringway")]
    pub proxy: Vec<ProxyKind>,
    /// Worker counts (comma-separated).
    #[arg(long, value_delimiter = ',', default_value = "2,4,6,8,16")]
    pub workers: Vec<usize>,
    /// Scheduler profiles (comma-separated): default, fifo, rr, slice-100us, slice-3ms, nice-10, ...
    #[arg(long, value_delimiter = ',', default_value = "default")]
    pub profiles: Vec<String>,
    /// ringway proxy mode: stateless or stateful.
    #[arg(long, default_value = "stateless")]
    pub mode: String,
    /// ringway proxy socket backend.
    #[arg(long, default_value = "mmsg")]
    pub backend: ringway_io::BackendKind,
    /// First call rate (calls/s).
    #[arg(long, default_value_t = 200.0)]
    pub rate_start: f64,
    /// Rate step (calls/s).
    #[arg(long, default_value_t = 200.0)]
    pub rate_step: f64,
    /// Highest rate tried (calls/s).
    #[arg(long, default_value_t = 20_000.0)]
    pub rate_max: f64,
    /// Bisection steps after bracketing the crossing.
    #[arg(long, default_value_t = 3)]
    pub refine: u32,
    /// Repetitions per point.
    #[arg(long, default_value_t = 3)]
    pub reps: u32,
    /// Seconds of call starts per run.
    #[arg(long, default_value_t = 10.0)]
    pub duration: f64,
    /// PDR threshold defining capacity (fraction: 0.01 = 1%).
    #[arg(long, default_value_t = 0.01)]
    pub threshold: f64,
    /// Generator threads (0: one per proxy worker, at most 8; each has its own
    /// socket, so a SO_REUSEPORT proxy sees that many flows).
    #[arg(long, default_value_t = 0)]
    pub gen_threads: usize,
    /// Pin the proxy to these CPUs (e.g. 0-1).
    #[arg(long)]
    pub cpus: Option<String>,
    /// Proxy receive buffer request (bytes; ringway only).
    #[arg(long)]
    pub rcvbuf: Option<usize>,
    /// Base RNG seed.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Output directory (runs.jsonl is appended there; the sweep resumes from it).
    #[arg(long, default_value = "results/sip-lab")]
    pub out: PathBuf,
    /// Kamailio binary.
    #[arg(long, default_value = "/usr/sbin/kamailio")]
    pub kamailio: PathBuf,
    /// Kamailio config (default: the shipped bench/kamailio/stateless.cfg).
    #[arg(long)]
    pub kamailio_cfg: Option<PathBuf>,
    /// Set net.core.rmem_max (global; recorded and restored).
    #[arg(long)]
    pub rmem_max: Option<u64>,
    /// Other global knobs PATH=VALUE under /proc/sys or /sys (recorded and restored), e.g.
    /// /sys/kernel/debug/sched/base_slice_ns=3000000.
    #[arg(long = "knob")]
    pub knobs: Vec<String>,
    /// State file recording original values of changed global settings.
    #[arg(long, default_value = "results/.ringway-state.json")]
    pub state_file: PathBuf,
}

/// Run it.
pub(crate) fn run(a: LabSipArgs) -> anyhow::Result<()> {
    // 1. A crashed earlier run may have left global settings changed.
    for m in SysState::recover(&a.state_file) {
        eprintln!("{m}");
    }
    // 2. Validate everything before anything starts.
    let mut knobs = Vec::new();
    if let Some(v) = a.rmem_max {
        if v < 4096 {
            anyhow::bail!("--rmem-max {v} is too small (at least 4096)");
        }
        knobs.push(Knob::sysctl("net.core.rmem_max", v));
    }
    for k in &a.knobs {
        let (p, v) = k
            .split_once('=')
            .ok_or_else(|| anyhow::anyhow!("--knob {k:?}: expected PATH=VALUE"))?;
        if !(p.starts_with("/proc/sys/") || p.starts_with("/sys/")) || p.contains("..") {
            anyhow::bail!("--knob {p:?}: only files under /proc/sys/ or /sys/ are allowed");
        }
        knobs.push(Knob {
            path: p.into(),
            value: v.into(),
        });
    }
    std::fs::create_dir_all(&a.out)?;
    let kamailio_cfg = match &a.kamailio_cfg {
        Some(p) => p.clone(),
        None => {
            let p = a.out.join("kamailio-stateless.cfg");
            std::fs::write(&p, KAMAILIO_CFG)?;
            p
        }
    };
    let out = std::fs::canonicalize(&a.out)?;
    let tools = Tools {
        ringway: std::env::current_exe()?,
        kamailio: a.kamailio.clone(),
        kamailio_cfg: std::fs::canonicalize(&kamailio_cfg)
            .map_err(|e| anyhow::anyhow!("kamailio config {}: {e}", kamailio_cfg.display()))?,
        work_dir: out.join("work"),
    };
    let cfg = SweepConfig {
        proxies: a.proxy.clone(),
        workers: a.workers.clone(),
        profiles: a.profiles.clone(),
        mode: a.mode.clone(),
        backend: a.backend,
        rate_start: a.rate_start,
        rate_step: a.rate_step,
        rate_max: a.rate_max,
        refine: a.refine,
        reps: a.reps,
        duration_s: a.duration,
        threshold: a.threshold,
        gen_threads: a.gen_threads,
        cpus: a.cpus.clone(),
        rcvbuf: a.rcvbuf,
        seed: a.seed,
    };
    cfg.validate(&tools).map_err(anyhow::Error::msg)?;
    let mut store = Store::open(&out)?;
    eprintln!(
        "sweep: {} configuration(s) × workers {:?}, rates {}..{} step {} (+{} bisection), {} reps, {} s each: at most {} runs; {} already in {}",
        cfg.proxies.len() * cfg.profiles.len(),
        cfg.workers,
        cfg.rate_start,
        cfg.rate_max,
        cfg.rate_step,
        cfg.refine,
        cfg.reps,
        cfg.duration_s,
        cfg.max_runs(),
        store.records().count(),
        out.join("runs.jsonl").display()
    );
    // 3. Global knobs: recorded before, restored after (also on Ctrl-C).
    let mut notes = Vec::new();
    let (state, msgs) = SysState::apply(&a.state_file, &knobs);
    for m in msgs {
        eprintln!("{m}");
        notes.push(m);
    }
    let stop = ringway_server::host::stop_flag()?;
    let mut progress = BarProgress::default();
    let mut state = Some(state);
    let caps = sweep::run_sweep(&cfg, &tools, &mut store, &mut progress, |spec, tools| {
        if stop.load(Ordering::Relaxed) {
            eprintln!(
                "interrupted: finished runs are in {}; run the same command again to resume",
                out.join("runs.jsonl").display()
            );
            if let Some(s) = state.take() {
                for m in s.restore() {
                    eprintln!("{m}");
                }
            }
            std::process::exit(130);
        }
        sweep::isolated_runner(spec, tools)
    });
    if let Some(s) = state.take() {
        for m in s.restore() {
            eprintln!("{m}");
        }
    }
    let caps = caps?;
    let _ = std::fs::remove_dir_all(out.join("work"));
    // 4. Report over the runs of this sweep's configurations.
    let records: Vec<_> = store.records().cloned().collect();
    let command = std::env::args().collect::<Vec<_>>().join(" ");
    let files = report::write_report(
        &out,
        &ReportInput {
            records: &records,
            caps: &caps,
            threshold: cfg.threshold,
            cores: ringway_io::thread::online_cpus(),
            command,
            notes,
        },
    )?;
    println!("{}", report::capacity_table(&caps).markdown());
    for f in files {
        eprintln!("wrote {}", f.display());
    }
    Ok(())
}
