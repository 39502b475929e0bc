//! `ringway lab sip` (the papers' scheduler study: modes × cores × threads
//! × rates × repetitions) and `ringway lab sip tune` (the tuner).

use ringway_lab::siplab::campaign::{self, Campaign, GenCpus};
use ringway_lab::siplab::compare;
use ringway_lab::siplab::report;
use ringway_lab::siplab::sweep::{SweepConfig, SweepProgress, TUNED};
use ringway_lab::siplab::topology::parse_cpu_list;
use ringway_lab::siplab::{ProxyKind, RunRecord, RunSpec};
use std::path::PathBuf;
use std::time::Instant;

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
    /// Compare the modes (and proxies) at fixed loads in randomised,
    /// interleaved blocks with an A/A arm (the first mode run twice): every
    /// "% lower" with its 95 % CI beside the A/A noise floor and the
    /// minimum detectable effect. --reps is the number of blocks.
    Compare(CompareArgs),
}

/// Arguments of `ringway lab sip compare`.
#[derive(clap::Args, Debug)]
pub(crate) struct CompareArgs {
    /// The fixed loads (calls/s, comma-separated), e.g. around the crossing
    /// a capacity sweep found (chosen before, not from the comparison's data).
    #[arg(long, value_delimiter = ',', required = true)]
    pub at_rates: Vec<f64>,
    #[command(flatten)]
    pub sweep: Box<SweepArgs>,
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
    /// Flag (and leave out) runs whose proxy CPUs carried more other load
    /// (other tasks and steal) than this share of their time (%).
    #[arg(long, default_value_t = ringway_lab::siplab::background::DEFAULT_MAX_FOREIGN_CPU_PCT)]
    pub max_foreign_cpu: f64,
    /// Base RNG seed.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Lab emulation (ringway only, off by default): CPU work per message
    /// the proxy handles, µs: N or const:N, or exp:N (exponential, mean N).
    /// Puts T_sip in the papers' OpenSIPS range (77–540 µs).
    #[arg(long, value_name = "DIST")]
    pub emulated_service_us: Option<ringway_server::sip::service::ServiceTime>,
    /// Output directory (runs.jsonl is appended there; the sweep resumes from it).
    #[arg(long, default_value = "results/sip-lab")]
    pub out: PathBuf,
    /// Kamailio binary.
    #[arg(long, default_value = "/usr/sbin/kamailio")]
    pub kamailio: PathBuf,
    /// Kamailio config (default: the shipped bench/kamailio/stateless.cfg, or
    /// bench/kamailio/stateful.cfg with --mode stateful; shared memory sized
    /// from the rate there).
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
    /// The papers' grid, one message at a time: --batch 1, --rx-model
    /// shared, --workers 2,4,6,8,16, 200-cps steps from 200 with the grid
    /// pair (--refine 0), capacity at 1 % PDR, --profiles baseline,enhanced.
    /// --cores, --reps (the papers: 30), --duration and --rate-max stay
    /// yours; the settings are printed before the runs.
    #[arg(
        long,
        conflicts_with_all = ["batch", "rx_model", "workers", "rate_start", "rate_step", "refine", "threshold", "profiles"]
    )]
    pub paper: bool,
    /// The veth testbed: the generator (with its UAS) and the proxy each in
    /// a network namespace of their own, joined by a veth pair; every arm
    /// (--proxy × --backends) at every --rates point, interleaved, with the
    /// same drop rate and CPU figures; writes veth.md and veth.json. Needs root.
    #[arg(
        long,
        requires = "rates",
        conflicts_with_all = ["paper", "rate_start", "rate_step", "rate_max", "refine", "profiles"]
    )]
    pub netns: bool,
    /// With --netns: the hosts talk IPv6 (unique local addresses).
    #[arg(long, requires = "netns")]
    pub ipv6: bool,
    /// With --netns: ringway's backends, one arm each (comma-separated:
    /// mmsg, socket, uring, xdp; xdp attaches to the proxy host's veth).
    /// Default: --backend.
    #[arg(
        long,
        value_delimiter = ',',
        requires = "netns",
        conflicts_with = "backend"
    )]
    pub backends: Vec<ringway_io::BackendKind>,
    /// With --netns: the offered call rates (calls/s, comma-separated).
    #[arg(long, value_delimiter = ',', requires = "netns")]
    pub rates: Vec<f64>,
    /// With --netns: ringway's receive-coalescing windows (µs,
    /// comma-separated; 0: off), one arm per backend and window, e.g.
    /// `0,200` runs ringway/xdp and ringway/xdp+rx200us side by side
    /// (`sip proxy --rx-coalesce-us`). Default: off.
    #[arg(long, value_delimiter = ',', requires = "netns", value_name = "US")]
    pub rx_coalesce_us: Vec<u64>,
}

/// Run it.
pub(crate) fn run(a: LabSipArgs) -> anyhow::Result<()> {
    if a.cmd.is_some() && a.sweep.netns {
        anyhow::bail!("--netns is a run of `ringway lab sip` itself, not of tune or compare");
    }
    if a.sweep.netns {
        return veth_and_report(*a.sweep);
    }
    match a.cmd {
        Some(LabSipCmd::Tune(t)) => {
            let mut sweep = t.sweep;
            sweep.profiles = vec!["baseline".into(), TUNED.into()];
            sweep_and_report(*sweep, true)
        }
        Some(LabSipCmd::Compare(c)) => compare_and_report(*c.sweep, c.at_rates),
        None => sweep_and_report(*a.sweep, false),
    }
}

fn compare_and_report(a: SweepArgs, rates: Vec<f64>) -> anyhow::Result<()> {
    let stop = ringway_server::host::stop_flag()?;
    let result = campaign::run_compare(
        campaign(a)?,
        rates,
        &stop,
        &mut BarProgress::default(),
        || std::process::exit(130),
    )?;
    println!("{}", compare::table(&result.rows).text());
    let left_out = result.outcome.records.iter().filter(|r| !r.valid()).count();
    println!(
        "{} run(s), {left_out} left out (flagged or failed); block orders and reasons in the report",
        result.outcome.records.len()
    );
    for path in result.files {
        eprintln!("wrote {}", path.display());
    }
    Ok(())
}

fn veth_and_report(a: SweepArgs) -> anyhow::Result<()> {
    let stop = ringway_server::host::stop_flag()?;
    let backends = if a.backends.is_empty() {
        vec![a.backend]
    } else {
        a.backends.clone()
    };
    let plan = ringway_lab::siplab::veth::VethPlan {
        backends,
        rates: a.rates.clone(),
        ipv6: a.ipv6,
        rx_coalesce_us: a.rx_coalesce_us.clone(),
    };
    let result = campaign::run_veth(
        campaign(a)?,
        plan,
        &stop,
        &mut BarProgress::default(),
        || std::process::exit(130),
    )?;
    println!("{}", result.text);
    for path in result.files {
        eprintln!("wrote {}", path.display());
    }
    Ok(())
}

fn cpus_arg(what: &str, v: &str) -> anyhow::Result<Vec<usize>> {
    parse_cpu_list(v).map_err(|e| anyhow::anyhow!("{what}: {e}"))
}

/// The campaign the flags describe (checked by the lab before it starts).
fn campaign(a: SweepArgs) -> anyhow::Result<Campaign> {
    let gen_cpus = match a.gen_cpus.as_deref() {
        Some("none") => GenCpus::Unpinned,
        Some(v) => GenCpus::List(cpus_arg("--gen-cpus", v)?),
        None => GenCpus::Auto,
    };
    let proxy_cpus = match a.proxy_cpus.as_deref() {
        Some(v) => cpus_arg("--proxy-cpus", v)?,
        None => Vec::new(),
    };
    let paper = a.paper;
    let sweep = SweepConfig {
        proxies: a.proxy,
        workers: a.workers,
        modes: a.profiles,
        mode: a.mode,
        backend: a.backend,
        rate_start: a.rate_start,
        rate_step: a.rate_step,
        rate_max: a.rate_max,
        refine: a.refine,
        reps: a.reps,
        duration_s: a.duration,
        threshold: a.threshold,
        gen_threads: a.gen_threads,
        cores: a.cores,
        proxy_cpus,
        gen_cpus: Vec::new(),
        rx_model: a.rx_model,
        batch: a.batch,
        rcvbuf: a.rcvbuf,
        seed: a.seed,
        tune_reps: a.tune_reps,
        service: a.emulated_service_us,
        globals: Vec::new(),
    };
    let sweep = if paper {
        let sweep = sweep.paper();
        println!("--paper: {}", sweep.describe());
        sweep
    } else {
        sweep
    };
    Ok(Campaign {
        sweep,
        gen_cpus,
        out: a.out,
        ringway: std::env::current_exe()?,
        kamailio: a.kamailio,
        kamailio_cfg: a.kamailio_cfg,
        rmem_max: a.rmem_max,
        knobs: a.knobs,
        state_file: a.state_file,
        command: std::env::args().collect::<Vec<_>>().join(" "),
        max_foreign_cpu_pct: a.max_foreign_cpu,
    })
}

fn sweep_and_report(a: SweepArgs, tune_only: bool) -> anyhow::Result<()> {
    let stop = ringway_server::host::stop_flag()?;
    let threshold = a.threshold;
    let result = campaign::run(campaign(a)?, &stop, &mut BarProgress::default(), || {
        std::process::exit(130)
    })?;
    for path in &result.tuned_files {
        eprintln!("wrote {}", path.display());
    }
    println!(
        "{}",
        report::capacity_table(&result.outcome.caps, threshold).markdown()
    );
    if tune_only {
        for tune in &result.outcome.tunes {
            println!("{}", report::tune_table(tune).markdown());
        }
    }
    for path in result.files {
        eprintln!("wrote {}", path.display());
    }
    Ok(())
}

/// Text progress bar with ETA on stderr.
struct BarProgress {
    started: Instant,
}

impl Default for BarProgress {
    fn default() -> Self {
        BarProgress {
            started: Instant::now(),
        }
    }
}

impl SweepProgress for BarProgress {
    fn starting(&mut self, spec: &RunSpec, done: usize, planned: usize, eta_s: Option<f64>) {
        const WIDTH: usize = 24;
        let fraction = done as f64 / planned.max(1) as f64;
        let fill = ((fraction * WIDTH as f64) as usize).min(WIDTH);
        let eta = eta_s.map_or("?".to_string(), |s| format!("≤{:.0}s", s));
        eprintln!(
            "[{}{}] {done}/{planned} max  elapsed {:.0}s ETA {eta}  {} w={} rate={} rep={}{}",
            "#".repeat(fill),
            "-".repeat(WIDTH - fill),
            self.started.elapsed().as_secs_f64(),
            spec.config_label(),
            spec.workers,
            spec.rate,
            spec.rep,
            if spec.knobs.is_empty() {
                String::new()
            } else {
                format!(" [{}]", spec.knobs.describe())
            }
        );
    }

    fn finished(&mut self, record: &RunRecord, resumed: bool) {
        let tag = if resumed { " (from runs.jsonl)" } else { "" };
        match &record.error {
            Some(e) => eprintln!("    run failed{tag}: {e}"),
            None => eprintln!(
                "    PDR {:.4}% failed calls {:.3}% calls {}/{} proxy cpu {:.2}s{}{tag}",
                100.0 * record.pdr,
                100.0 * record.failed_ratio,
                record.succeeded,
                record.attempted,
                record.proxy_cpu_s,
                if record.flags.is_empty() {
                    String::new()
                } else {
                    format!(" FLAGGED: {}", record.flags.join("; "))
                }
            ),
        }
    }
}
