//! One `ringway lab sip` campaign, from a validated configuration to the
//! written report: recover settings a crashed campaign left changed,
//! validate everything before anything starts, apply the sweep-wide knobs
//! (recorded first, restored afterwards, also on interruption), sweep, and
//! write the report over this sweep's runs. The binary only turns its
//! flags into a [`Campaign`] and prints the result.

use super::compare::{self, CompareConfig, CompareOutcome};
use super::report::{self, ReportInput};
use super::sweep::{self, Store, SweepConfig, SweepOutcome, SweepProgress};
use super::topology::cpu_list_text;
use super::{RunRecord, Tools};
use crate::sched::{Knob, SysState};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

/// The Kamailio config shipped in bench/kamailio/, used unless the
/// campaign names another.
pub const KAMAILIO_CFG: &str = include_str!("../../../../bench/kamailio/stateless.cfg");
/// The shipped transaction-stateful Kamailio config (`--mode stateful`):
/// the stateless one plus tm and `t_relay()`.
pub const KAMAILIO_STATEFUL_CFG: &str = include_str!("../../../../bench/kamailio/stateful.cfg");

/// Which CPUs the load generator runs on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GenCpus {
    /// The last usable CPU when there are two or more, else not pinned.
    Auto,
    /// Not pinned: every run is then flagged for shared CPUs.
    Unpinned,
    /// These CPU ids (disjoint from the proxy's).
    List(Vec<usize>),
}

/// Everything one campaign needs.
#[derive(Clone, Debug)]
pub struct Campaign {
    /// The sweep; its `gen_cpus` is filled in from [`Campaign::gen_cpus`].
    pub sweep: SweepConfig,
    /// The generator's CPUs.
    pub gen_cpus: GenCpus,
    /// Output directory (runs.jsonl is appended there; the sweep resumes from it).
    pub out: PathBuf,
    /// The `ringway` binary the proxy runs from.
    pub ringway: PathBuf,
    /// Kamailio binary.
    pub kamailio: PathBuf,
    /// Kamailio config (`None`: [`KAMAILIO_CFG`], or
    /// [`KAMAILIO_STATEFUL_CFG`] for `--mode stateful`, written into `out`).
    pub kamailio_cfg: Option<PathBuf>,
    /// net.core.rmem_max for the whole sweep.
    pub rmem_max: Option<u64>,
    /// Other global knobs `PATH=VALUE` under /proc/sys or /sys for the whole sweep.
    pub knobs: Vec<String>,
    /// State file recording the original values of changed global settings.
    pub state_file: PathBuf,
    /// The command line, for the report.
    pub command: String,
    /// Runs whose proxy CPUs carried more other load than this (%) are flagged.
    pub max_foreign_cpu_pct: f64,
}

/// What a campaign produced.
#[derive(Debug)]
pub struct CampaignResult {
    /// Capacities and tuner searches.
    pub outcome: SweepOutcome,
    /// Report files written.
    pub files: Vec<PathBuf>,
    /// Tuned mode files written (`tuned-PROXY-cC-wW.toml`).
    pub tuned_files: Vec<PathBuf>,
}

/// The sweep-wide knobs of `c`, checked: `--rmem-max` at least 4096,
/// `--knob` paths under /proc/sys or /sys only.
fn global_knobs(c: &Campaign) -> anyhow::Result<Vec<Knob>> {
    let mut knobs = Vec::new();
    if let Some(value) = c.rmem_max {
        if value < 4096 {
            anyhow::bail!("--rmem-max {value} is too small (at least 4096)");
        }
        knobs.push(Knob::sysctl("net.core.rmem_max", value));
    }
    for knob in &c.knobs {
        let (path, value) = knob
            .split_once('=')
            .ok_or_else(|| anyhow::anyhow!("--knob {knob:?}: expected PATH=VALUE"))?;
        // The knobs are written as root: nothing outside the kernel's tunables.
        if !(path.starts_with("/proc/sys/") || path.starts_with("/sys/")) || path.contains("..") {
            anyhow::bail!("--knob {path:?}: only files under /proc/sys/ or /sys/ are allowed");
        }
        knobs.push(Knob {
            path: path.into(),
            value: value.into(),
        });
    }
    Ok(knobs)
}

/// The tools of a campaign writing into the canonical directory `out`.
fn tools(c: &Campaign, out: &Path) -> anyhow::Result<Tools> {
    let kamailio_cfg = match &c.kamailio_cfg {
        Some(path) => path.clone(),
        None => {
            let (name, text) = if c.sweep.mode == "stateful" {
                ("kamailio-stateful.cfg", KAMAILIO_STATEFUL_CFG)
            } else {
                ("kamailio-stateless.cfg", KAMAILIO_CFG)
            };
            let path = c.out.join(name);
            std::fs::write(&path, text)?;
            path
        }
    };
    let state_file = {
        let path = &c.state_file;
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)?;
        }
        // Absolute: the runs' processes start in other directories.
        std::path::absolute(path)?
    };
    Ok(Tools {
        ringway: c.ringway.clone(),
        kamailio: c.kamailio.clone(),
        kamailio_cfg: std::fs::canonicalize(&kamailio_cfg)
            .map_err(|e| anyhow::anyhow!("kamailio config {}: {e}", kamailio_cfg.display()))?,
        work_dir: out.join("work"),
        state_file: state_file.with_extension("runs.json"),
        max_foreign_cpu_pct: c.max_foreign_cpu_pct,
    })
}

/// The machine line at the top of the report's notes.
fn machine_note(cfg: &SweepConfig, usable: &[usize]) -> String {
    format!(
        "Machine: {} usable CPU(s) ({}); generator on CPU(s) {}; proxy sets taken from {} (cores {:?}); kernel {}.",
        usable.len(),
        cpu_list_text(usable),
        if cfg.gen_cpus.is_empty() {
            "none (not pinned: runs flagged)".to_string()
        } else {
            cpu_list_text(&cfg.gen_cpus)
        },
        cpu_list_text(&cfg.pool(usable)),
        cfg.cores,
        std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .map(|s| s.trim().to_string())
            .unwrap_or_default()
    )
}

/// The records of this sweep among those in the store (every setting that
/// changes a result is in the key, but the store may hold other sweeps').
fn sweep_records(store: &Store, cfg: &SweepConfig) -> Vec<RunRecord> {
    store
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
                && r.spec.globals == cfg.globals
                && (r.spec.proxy != super::ProxyKind::Ringway || r.spec.service == cfg.service)
        })
        .cloned()
        .collect()
}

fn log_all(messages: Vec<String>) {
    for message in messages {
        log::info!("{message}");
    }
}

/// What [`run`] and [`run_compare`] prepare alike.
struct Prepared {
    knobs: Vec<Knob>,
    usable: Vec<usize>,
    out: PathBuf,
    tools: Tools,
}

/// Restore what a crashed earlier run left changed, then check the
/// sweep-wide knobs (recorded in the sweep), place the generator, create
/// the output directory and find the tools: all before any run starts.
fn prepare(c: &mut Campaign) -> anyhow::Result<Prepared> {
    log_all(SysState::recover(&c.state_file));
    let knobs = global_knobs(c)?;
    c.sweep.globals = knobs
        .iter()
        .map(|k| format!("{}={}", k.path, k.value))
        .collect();
    let usable = sweep::usable_cpus();
    c.sweep.gen_cpus = match &c.gen_cpus {
        GenCpus::List(cpus) => cpus.clone(),
        GenCpus::Unpinned => Vec::new(),
        GenCpus::Auto if usable.len() >= 2 => vec![*usable.last().unwrap_or(&0)],
        GenCpus::Auto => Vec::new(),
    };
    std::fs::create_dir_all(&c.out)?;
    let out = std::fs::canonicalize(&c.out)?;
    let tools = tools(c, &out)?;
    Ok(Prepared {
        knobs,
        usable,
        out,
        tools,
    })
}

/// Run the campaign `c`. `stop` is polled before every run; when it is set
/// the global settings are restored and `on_interrupt` ends the process
/// (finished runs are already in runs.jsonl; a run cut in half must not be
/// recorded, so the sweep cannot just go on).
pub fn run(
    mut c: Campaign,
    stop: &AtomicBool,
    progress: &mut dyn SweepProgress,
    on_interrupt: fn() -> !,
) -> anyhow::Result<CampaignResult> {
    // A crashed earlier run may have left global settings changed; then
    // everything is validated before anything starts.
    let Prepared {
        knobs,
        usable,
        out,
        tools,
    } = prepare(&mut c)?;
    let cfg = &c.sweep;
    cfg.validate(&tools).map_err(anyhow::Error::msg)?;
    // A leftover per-run state file (kill -9 during a run) is restored too.
    log_all(SysState::recover(&tools.state_file));
    let mut store = Store::open(&out)?;
    let mut notes = vec![machine_note(cfg, &usable)];
    if cfg.gen_cpus.is_empty() {
        log::warn!("the generator is not pinned (--gen-cpus): every run will be flagged for shared CPUs and left out of capacities");
    }
    log::info!(
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
    // 3. Sweep-wide global knobs: recorded before, restored after (also on interruption).
    let (state, messages) = SysState::apply(&c.state_file, &knobs);
    for message in messages {
        log::info!("{message}");
        notes.push(message);
    }
    let mut state = Some(state);
    let outcome = sweep::run_sweep(cfg, &tools, &mut store, progress, |spec, tools| {
        if stop.load(Ordering::Relaxed) {
            log::warn!(
                "interrupted: finished runs are in {}; run the same command again to resume",
                out.join("runs.jsonl").display()
            );
            if let Some(state) = state.take() {
                log_all(state.restore());
            }
            on_interrupt();
        }
        sweep::isolated_runner(spec, tools)
    });
    if let Some(state) = state.take() {
        log_all(state.restore());
    }
    let outcome = outcome?;
    let _ = std::fs::remove_dir_all(out.join("work"));
    // 4. Report over this sweep's runs.
    let records = sweep_records(&store, cfg);
    let files = report::write_report(
        &out,
        &ReportInput {
            records: &records,
            outcome: &outcome,
            threshold: cfg.threshold,
            command: c.command.clone(),
            notes,
        },
    )?;
    let mut tuned_files = Vec::new();
    for tune in &outcome.tunes {
        if let Some(mode) = tune.pick_mode() {
            let path = out.join(format!(
                "tuned-{}-c{}-w{}.toml",
                tune.proxy.name(),
                tune.cores,
                tune.workers
            ));
            std::fs::write(&path, mode.to_toml())?;
            tuned_files.push(path);
        }
    }
    Ok(CampaignResult {
        outcome,
        files,
        tuned_files,
    })
}

/// What a comparison campaign produced.
#[derive(Debug)]
pub struct CompareResult {
    /// The runs and block orders.
    pub outcome: CompareOutcome,
    /// The comparison rows.
    pub rows: Vec<compare::Row>,
    /// Report files written.
    pub files: Vec<PathBuf>,
}

/// Run the comparison of `c`'s modes at the fixed loads `rates` (blocks:
/// `c.sweep.reps`), with the same preparation as [`run`] (crash recovery,
/// validation, sweep-wide knobs recorded and restored), and write
/// `compare.md` and `compare.json` into `out`.
pub fn run_compare(
    mut c: Campaign,
    rates: Vec<f64>,
    stop: &AtomicBool,
    progress: &mut dyn SweepProgress,
    on_interrupt: fn() -> !,
) -> anyhow::Result<CompareResult> {
    let Prepared {
        knobs,
        usable,
        out,
        tools,
    } = prepare(&mut c)?;
    let cfg = CompareConfig {
        sweep: c.sweep.clone(),
        rates,
    };
    cfg.validate(&tools).map_err(anyhow::Error::msg)?;
    log_all(SysState::recover(&tools.state_file));
    let mut store = Store::open(&out)?;
    let mut notes = vec![machine_note(&cfg.sweep, &usable)];
    log::info!(
        "compare: {} run(s) in {} randomised block(s) per point, seed {}",
        cfg.planned(),
        cfg.sweep.reps,
        cfg.sweep.seed
    );
    let (state, messages) = SysState::apply(&c.state_file, &knobs);
    notes.extend(messages);
    let mut state = Some(state);
    let outcome = compare::run_compare(&cfg, &tools, &mut store, progress, |spec, tools| {
        if stop.load(Ordering::Relaxed) {
            if let Some(state) = state.take() {
                log_all(state.restore());
            }
            on_interrupt();
        }
        sweep::isolated_runner(spec, tools)
    });
    if let Some(state) = state.take() {
        log_all(state.restore());
    }
    let outcome = outcome?;
    let _ = std::fs::remove_dir_all(out.join("work"));
    let rows = compare::analyse(&cfg, &outcome);
    let markdown = compare::report_markdown(&cfg, &outcome, &rows, &c.command, &notes);
    let md_path = out.join("compare.md");
    std::fs::write(&md_path, markdown)?;
    let json_path = out.join("compare.json");
    std::fs::write(
        &json_path,
        serde_json::to_vec_pretty(&serde_json::json!({
            "seed": cfg.sweep.seed,
            "rates": cfg.rates,
            "blocks": cfg.sweep.reps,
            "arms": outcome.arms,
            "orders": outcome.orders,
            "rows": rows,
        }))?,
    )?;
    Ok(CompareResult {
        outcome,
        rows,
        files: vec![md_path, json_path],
    })
}

/// What a `--netns` campaign produced.
#[derive(Debug)]
pub struct VethResult {
    /// The report's tables (Markdown).
    pub text: String,
    /// The runs.
    pub outcome: super::veth::VethOutcome,
    /// Report files written.
    pub files: Vec<PathBuf>,
}

/// Run `c` on the veth testbed (`ringway lab sip --netns`): the same
/// preparation as [`run`] (crash recovery, validation, sweep-wide knobs
/// recorded and restored), then the testbed, every arm at every rate
/// interleaved, and `veth.md` / `veth.json` in `out` (runs in
/// `out/veth/runs.jsonl`, resumed from there). On `stop` (SIGINT) the
/// run in progress is discarded, the proxy stopped, the namespaces and
/// the global settings restored, and then `on_interrupt` ends the process.
pub fn run_veth(
    mut c: Campaign,
    plan: super::veth::VethPlan,
    stop: &std::sync::Arc<AtomicBool>,
    progress: &mut dyn SweepProgress,
    on_interrupt: fn() -> !,
) -> anyhow::Result<VethResult> {
    use super::veth::{run_all, write_report, SipTestbed, VethConfig};
    let Prepared {
        knobs, out, tools, ..
    } = prepare(&mut c)?;
    c.sweep.modes = vec!["default".into()];
    let cfg = VethConfig {
        sweep: c.sweep.clone(),
        backends: plan.backends,
        rates: plan.rates,
        ipv6: plan.ipv6,
        rx_coalesce_us: plan.rx_coalesce_us,
    };
    cfg.validate(&tools).map_err(anyhow::Error::msg)?;
    log_all(SysState::recover(&tools.state_file));
    let mut store = Store::open(&out.join("veth"))?;
    log::info!(
        "netns: arms {:?} × rates {:?} × workers {:?}, {} reps of {} s: {} runs",
        cfg.arms().iter().map(|a| a.name()).collect::<Vec<_>>(),
        cfg.rates,
        cfg.sweep.workers,
        cfg.sweep.reps,
        cfg.sweep.duration_s,
        cfg.planned()
    );
    let (state, messages) = SysState::apply(&c.state_file, &knobs);
    log_all(messages);
    let outcome = SipTestbed::build(cfg.ipv6)
        .and_then(|bed| run_all(&cfg, &bed, &tools, &mut store, progress, stop));
    // The testbed is gone here (dropped inside), whatever happened.
    log_all(state.restore());
    let _ = std::fs::remove_dir_all(out.join("work"));
    let Some(outcome) = outcome? else {
        log::warn!(
            "interrupted: finished runs are in {}; run the same command again to resume",
            out.join("veth").join("runs.jsonl").display()
        );
        on_interrupt();
    };
    let (text, files) = write_report(&out, &cfg, &outcome, &c.command)?;
    Ok(VethResult {
        text,
        outcome,
        files,
    })
}
