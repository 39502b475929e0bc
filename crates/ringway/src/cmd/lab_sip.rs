//! `ringway lab sip` (the papers' scheduler study: modes × cores × threads
//! × rates × repetitions) and `ringway lab sip tune` (the tuner).

use ringway_lab::siplab::report::{self, ReportInput};
use ringway_lab::sched::{Knob, SysState};
use ringway_lab::siplab::sweep::{self, BarProgress, Store, SweepConfig, TUNED};
use ringway_lab::siplab::topology::{cpu_list_text, parse_cpu_list};
use ringway_lab::siplab::{ProxyKind, Tools};
use std::path::PathBuf;
use std::sync::atomic::Ordering;

/// The Kamailio config shipped in bench/kamailio/, used unless --kamailio-cfg is given.
const KAMAILIO_CFG: &str = include_str!("../../../../bench/kamailio/stateless.cfg");

/// Arguments of `ringway lab sip`.
#[derive(clap::Args, Debug)]
#[command(args_conflicts_with_subcommands = true)]
pub(crate) struct LabSipArgs {
    /// `tune`: the tuner alone.
    #[command(subcommand)]
    pub cmd: Option<LabSipCmd>,
    #[command(flatten)]
    pub sweep: Box<SweepArgs>,
}

/// `ringway lab sip` subcommands.
#[derive(clap::Subcommand, Debug)]
pub(crate) enum LabSipCmd {
    /// Search the scheduler knobs this kernel lets the lab change at the
    /// baseline crossing load (per proxy, core count and thread count), pick
    /// the lowest drop rate (then K_rcv), re-measure the pick with fresh
    /// seeds against baseline, and write the search table and tuned.toml.
    Tune(TuneArgs),
}

/// Arguments of `ringway lab sip tune`.
#[derive(clap::Args, Debug)]
pub(crate) struct TuneArgs {
    #[command(flatten)]
    pub sweep: Box<SweepArgs>,
}

/// Sweep arguments shared by `lab sip` and `lab sip tune`.
#[derive(clap::Args, Debug)]
pub(crate) struct SweepArgs {
    /// Proxies to measure (comma-separated): ringway, kamailio (OpenSIPS is not packaged here).
    #[arg(long, value_delimiter = ',', default_value = "ringway")]
    pub proxy: Vec<ProxyKind>,
    /// Thread counts: ringway worker threads, Kamailio UDP children (comma-separated).
    #[arg(long, value_delimiter = ',', default_value = "2,4,6,8,16")]
    pub workers: Vec<usize>,
    /// Scheduler modes (comma-separated). Built in: default (kernel as is),
    /// baseline and enhanced (the papers' modes, values per thread and core
    /// count), tuned (runs the tuner at the baseline crossing load; list
    /// baseline first). Also a mode file PATH.toml (see docs/sip-lab.md) or
    /// a per-thread profile: fifo, rr, fifo-N, nice<N>, slice-<N>us|ms.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "default,baseline,enhanced"
    )]
    pub profiles: Vec<String>,
    /// Core counts for the proxy (comma-separated); each is a process-wide
    /// CPU set (the scheduler balances and migrates the threads inside it).
    #[arg(long, value_delimiter = ',', default_value = "1")]
    pub cores: Vec<usize>,
    /// CPUs the proxy's sets are taken from, in order (default: every
    /// usable CPU not in --gen-cpus).
    #[arg(long)]
    pub proxy_cpus: Option<String>,
    /// CPU ids of the load generator, disjoint from the proxy's (default:
    /// the last usable CPU when there are two or more; `none`: not pinned,
    /// every run is then flagged for shared CPUs).
    #[arg(long)]
    pub gen_cpus: Option<String>,
    /// ringway receive model: shared (one socket read by all workers, as
    /// OpenSIPS/Kamailio children) or reuseport (a socket per worker).
    #[arg(long, default_value = "shared")]
    pub rx_model: String,
    /// Datagrams per receive batch (1 = the papers' one message at a time).
    #[arg(long, default_value_t = 32)]
    pub batch: usize,
    /// ringway proxy mode: stateless or stateful.
    #[arg(long, default_value = "stateless")]
    pub mode: String,
    /// ringway proxy socket backend.
    #[arg(long, default_value = "mmsg")]
    pub backend: ringway_io::BackendKind,
    /// First call rate (calls/s).
    #[arg(long, default_value_t = 200.0)]
    pub rate_start: f64,
    /// Rate step (calls/s; the papers: 200).
    #[arg(long, default_value_t = 200.0)]
    pub rate_step: f64,
    /// Highest rate tried (calls/s).
    #[arg(long, default_value_t = 20_000.0)]
    pub rate_max: f64,
    /// Bisection steps after the crossing (0: the papers' 200-cps grid pair).
    #[arg(long, default_value_t = 0)]
    pub refine: u32,
    /// Repetitions per point (runs share seeds across modes and proxies).
    #[arg(long, default_value_t = 3)]
    pub reps: u32,
    /// Repetitions per tuner candidate.
    #[arg(long, default_value_t = 2)]
    pub tune_reps: u32,
    /// Seconds of call starts per run.
    #[arg(long, default_value_t = 10.0)]
    pub duration: f64,
    /// PDR threshold defining capacity (fraction: 0.01 = 1%).
    #[arg(long, default_value_t = 0.01)]
    pub threshold: f64,
    /// Generator threads, each its own socket (0: 2 for shared, 4 per worker for reuseport).
    #[arg(long, default_value_t = 0)]
    pub gen_threads: usize,
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
    /// Set net.core.rmem_max for the whole sweep (recorded and restored).
    #[arg(long)]
    pub rmem_max: Option<u64>,
    /// Other global knobs PATH=VALUE under /proc/sys or /sys for the whole
    /// sweep (recorded and restored), e.g. /sys/kernel/debug/sched/base_slice_ns=3000000.
    #[arg(long = "knob")]
    pub knobs: Vec<String>,
    /// State file recording original values of changed global settings.
    #[arg(long, default_value = "results/.ringway-state.json")]
    pub state_file: PathBuf,
}

/// Run it.
pub(crate) fn run(a: LabSipArgs) -> anyhow::Result<()> {
    match a.cmd {
        Some(LabSipCmd::Tune(t)) => {
            let mut s = t.sweep;
            s.profiles = vec!["baseline".into(), TUNED.into()];
            sweep_and_report(*s, true)
        }
        None => sweep_and_report(*a.sweep, false),
    }
}

fn cpus_arg(what: &str, v: &str) -> anyhow::Result<Vec<usize>> {
    parse_cpu_list(v).map_err(|e| anyhow::anyhow!("{what}: {e}"))
}

fn sweep_and_report(a: SweepArgs, tune_only: bool) -> anyhow::Result<()> {
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
    let usable = sweep::usable_cpus();
    let gen_cpus = match a.gen_cpus.as_deref() {
        Some("none") => Vec::new(),
        Some(v) => cpus_arg("--gen-cpus", v)?,
        None if usable.len() >= 2 => vec![*usable.last().unwrap_or(&0)],
        None => Vec::new(),
    };
    let proxy_cpus = match a.proxy_cpus.as_deref() {
        Some(v) => cpus_arg("--proxy-cpus", v)?,
        None => Vec::new(),
    };
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
    let state_file = {
        let p = &a.state_file;
        if let Some(d) = p.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(d)?;
        }
        std::path::absolute(p)?
    };
    let tools = Tools {
        ringway: std::env::current_exe()?,
        kamailio: a.kamailio.clone(),
        kamailio_cfg: std::fs::canonicalize(&kamailio_cfg)
            .map_err(|e| anyhow::anyhow!("kamailio config {}: {e}", kamailio_cfg.display()))?,
        work_dir: out.join("work"),
        state_file: state_file.with_extension("runs.json"),
    };
    let cfg = SweepConfig {
        proxies: a.proxy.clone(),
        workers: a.workers.clone(),
        modes: a.profiles.clone(),
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
        cores: a.cores.clone(),
        proxy_cpus,
        gen_cpus: gen_cpus.clone(),
        rx_model: a.rx_model.clone(),
        batch: a.batch,
        rcvbuf: a.rcvbuf,
        seed: a.seed,
        tune_reps: a.tune_reps,
    };
    cfg.validate(&tools).map_err(anyhow::Error::msg)?;
    // A leftover per-run state file (kill -9 during a run) is restored too.
    for m in SysState::recover(&tools.state_file) {
        eprintln!("{m}");
    }
    let mut store = Store::open(&out)?;
    let pool = cfg.pool(&usable);
    let mut notes = vec![format!(
        "Machine: {} usable CPU(s) ({}); generator on CPU(s) {}; proxy sets taken from {} (cores {:?}); kernel {}.",
        usable.len(),
        cpu_list_text(&usable),
        if gen_cpus.is_empty() {
            "none (not pinned: runs flagged)".to_string()
        } else {
            cpu_list_text(&gen_cpus)
        },
        cpu_list_text(&pool),
        cfg.cores,
        std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .map(|s| s.trim().to_string())
            .unwrap_or_default()
    )];
    if gen_cpus.is_empty() {
        eprintln!("warning: the generator is not pinned (--gen-cpus): every run will be flagged for shared CPUs and left out of capacities");
    }
    eprintln!(
        "sweep: {} proxy(ies) × modes {:?} × cores {:?} × threads {:?}, rates {}..{} step {} (+{} bisection), {} reps, {} s each: at most {} runs; {} already in {}",
        cfg.proxies.len(),
        cfg.modes,
        cfg.cores,
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
    // 3. Sweep-wide global knobs: recorded before, restored after (also on Ctrl-C).
    let (state, msgs) = SysState::apply(&a.state_file, &knobs);
    for m in msgs {
        eprintln!("{m}");
        notes.push(m);
    }
    let stop = ringway_server::host::stop_flag()?;
    let mut progress = BarProgress::default();
    let mut state = Some(state);
    let outcome = sweep::run_sweep(&cfg, &tools, &mut store, &mut progress, |spec, tools| {
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
    let outcome = outcome?;
    let _ = std::fs::remove_dir_all(out.join("work"));
    // 4. Report over this sweep's runs (every setting is in the key).
    let records: Vec<_> = store
        .records()
        .filter(|r| {
            cfg.proxies.contains(&r.spec.proxy)
                && cfg.cores.contains(&r.spec.cores)
                && cfg.workers.contains(&r.spec.workers)
                && r.spec.duration_s == cfg.duration_s
                && r.spec.rx_model == cfg.rx_model
                && r.spec.batch == cfg.batch
                && r.spec.gen_cpus == cfg.gen_cpus
                && r.spec.rcvbuf == cfg.rcvbuf
        })
        .cloned()
        .collect();
    let command = std::env::args().collect::<Vec<_>>().join(" ");
    let files = report::write_report(
        &out,
        &ReportInput {
            records: &records,
            outcome: &outcome,
            threshold: cfg.threshold,
            command,
            notes,
        },
    )?;
    for t in &outcome.tunes {
        if let Some(m) = t.pick_mode() {
            let p = out.join(format!(
                "tuned-{}-c{}-w{}.toml",
                t.proxy.name(),
                t.cores,
                t.workers
            ));
            std::fs::write(&p, m.to_toml())?;
            eprintln!("wrote {}", p.display());
        }
    }
    println!(
        "{}",
        report::capacity_table(&outcome.caps, cfg.threshold).markdown()
    );
    if tune_only {
        for t in &outcome.tunes {
            println!("{}", report::tune_table(t).markdown());
        }
    }
    for f in files {
        eprintln!("wrote {}", f.display());
    }
    Ok(())
}
