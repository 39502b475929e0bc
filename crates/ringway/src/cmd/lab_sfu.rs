//! `ringway lab sfu`: SFU experiments (pktswitch Figs. 3-5), the command-line
//! front end of [`ringway_lab::sfulab`]: for every repetition, client
//! count, per-client packet rate and backend it runs the SFU and its load
//! clients in this process, measures (after a warm-up) the SFU engine's CPU
//! user/kernel time, CPU per emulated host and the four per-packet delays,
//! and prints a table with 95% CIs, ratios to the socket baseline, Figs.
//! 3-5 shaped tables and the paper's delay models fitted on delay (a).
//! `--capacity` raises the clients per backend until the clients lose more
//! than 1% or the engine saturates: the paper's "~4× the load" as a curve.
//!
//! Everything runs inside a private network namespace with only `lo`
//! (default), or with `--netns` in the paper's testbed shape: the SFU in one
//! namespace host and each client in its own host, joined by veth to one
//! bridge with threaded NAPI at its ports (names carry the PID, removed
//! afterwards).

use anyhow::Context;
use ringway_io::thread::Policy;
use ringway_io::BackendKind;
use ringway_lab::checkpoint::Checkpoint;
use ringway_lab::sfulab::experiment::{
    calibrate_lateness, render_capacity, run_capacity, run_grid, CapacityPoint, LateCalibration,
    Placement, PlannedRun, SfuLabConfig,
};
use ringway_lab::sfulab::{json, markdown, render, summarize, svg, Run};
use ringway_server::sfu::Flush;
use std::path::PathBuf;

/// `ringway lab sfu` options.
#[derive(clap::Args, Debug, Clone)]
pub(crate) struct LabSfuArgs {
    /// Client counts.
    #[arg(long, default_value = "6,8,10", value_delimiter = ',')]
    pub clients: Vec<usize>,
    /// Packets per second sent by each client (3 streams: ASQ, VSQ, VHQ).
    #[arg(long, default_value = "750,1500", value_delimiter = ',')]
    pub pps: Vec<u32>,
    /// Backends to compare (`socket` is the baseline). Default: socket,
    /// mmsg, uring, and xdp with `--netns` (it attaches to the SFU host's
    /// veth, so it needs the testbed).
    #[arg(long, value_delimiter = ',')]
    pub backends: Option<Vec<BackendKind>>,
    /// Repetitions of every cell.
    #[arg(long, default_value_t = 1)]
    pub reps: usize,
    /// Seconds measured per run (the paper: 60).
    #[arg(long, default_value_t = 60.0)]
    pub duration: f64,
    /// Seconds of load before each run's measurement starts.
    #[arg(long, default_value_t = 2.0)]
    pub warmup: f64,
    /// SFU flush policy: `packet` (after each packet's copies), `adaptive`
    /// (end of the receive batch or `--flush-age-us`), `batch` (once per
    /// receive batch). Default: packet.
    #[arg(long)]
    pub flush: Option<Flush>,
    /// Adaptive flush: longest a copy may wait unsent (µs).
    #[arg(long, default_value_t = 20)]
    pub flush_age_us: u32,
    /// SFU receive batch (default: 1 for socket, 64 otherwise).
    #[arg(long)]
    pub batch: Option<usize>,
    /// SFU: spin this long (µs) before sleeping for datagrams (its CPU is
    /// in the engine's CPU and in the `spin` figure).
    #[arg(long, default_value_t = 0)]
    pub spin_us: u32,
    /// Pin the SFU engine thread to these CPUs (in the testbed its
    /// interface's NAPI thread too: the SFU host alone on them).
    #[arg(long)]
    pub cpus: Option<String>,
    /// Pin the load threads to these CPUs (in the testbed the switch's
    /// NAPI threads too: the wire beside the clients).
    #[arg(long)]
    pub load_cpus: Option<String>,
    /// Scheduling policy of the load's sender thread: `other`, `batch`,
    /// `idle`, `fifo:N`, `rr:N` (default: `fifo:10` with `--netns`, which
    /// runs as root anyway; inherited otherwise). Real-time keeps the
    /// receive work the load causes on its CPUs from making the sender
    /// late (runs with a late sender are left out); the receiver stays
    /// fair-class and its figures come from kernel stamps (with
    /// `--client-io xdp` one thread sends and receives, with this policy).
    /// A policy the
    /// kernel refuses stops the lab at the calibration (or, with
    /// `--calibrate 0`, flags every run).
    #[arg(long)]
    pub load_sender_policy: Option<Policy>,
    /// Run the SFU and the load in separate namespace hosts joined by veth.
    #[arg(long)]
    pub netns: bool,
    /// With `--netns`: no threaded NAPI at the switch (or router) ports
    /// (client delivery then runs inside the SFU's send calls and is
    /// charged to it).
    #[arg(long)]
    pub no_napi: bool,
    /// With `--netns`: every client behind a router host (the SFU's next
    /// hop is the router, whose ports get threaded NAPI as a switch's do,
    /// unless `--no-napi`), to compare the
    /// fast paths beyond the first link.
    #[arg(long)]
    pub routed: bool,
    /// With `--netns`: the hosts talk IPv6 (unique local addresses beside
    /// their IPv4 ones; the SFU listens on its own).
    #[arg(long)]
    pub ipv6: bool,
    /// How the load clients receive and send: `socket` (their UDP
    /// sockets) or, with `--netns`, `xdp` (AF_XDP on each client's own
    /// veth: one thread reads the RX rings without a system call and sends
    /// each tick through a TX ring, so the clients cost less than the SFU
    /// they load; the SFU host's veth sends full checksums, which AF_XDP
    /// verifies). Until 2026-11-27 this was `--client-rx xdp`, with the
    /// sends through the sockets.
    #[arg(long, value_enum, default_value_t = ClientIo::Socket)]
    pub client_io: ClientIo,
    /// Leave out runs with more other load on the machine than this (% of
    /// one core).
    #[arg(long, default_value_t = 50.0)]
    pub max_foreign_cpu: f64,
    /// Leave out runs whose load generator was more than 1 ms late on more
    /// than this share of its ticks (%) above what it is alone on this
    /// machine (measured first for `--calibrate` seconds).
    #[arg(long, default_value_t = 1.0)]
    pub max_late: f64,
    /// Seconds to measure the load generator's own lateness before the
    /// runs (its schedule for the busiest cell, nothing sent); the late
    /// limit is that share plus 3 standard errors plus `--max-late`.
    /// 0: no calibration, `--max-late` is the limit itself.
    #[arg(long, default_value_t = 5.0)]
    pub calibrate: f64,
    /// The paper's grid (pktswitch Figs. 3-5): clients 6,8,10, pps
    /// 750,1500, 3 repetitions of 60 s (printed before the runs).
    #[arg(long, conflicts_with_all = ["clients", "pps", "reps", "duration", "capacity"])]
    pub paper: bool,
    /// Also run a `tc` column (with `--netns`): the socket SFU with the
    /// in-kernel fan-out (a tcx ingress program on its veth replicating
    /// verified media with bpf_clone_redirect; the engine keeps the control
    /// plane). Compare it by the SFU host's CPU and the mean delay (a).
    #[arg(long)]
    pub kernel_fanout: bool,
    /// Measure the capacity curve instead of the grid: per backend, raise
    /// the clients through `--capacity-clients` at `--capacity-pps` until
    /// loss > `--capacity-loss` % or engine CPU >= `--capacity-cpu` %.
    #[arg(long)]
    pub capacity: bool,
    /// Capacity: client counts to step through.
    #[arg(long, default_value = "2,4,6,8,10,12,16,20,24", value_delimiter = ',')]
    pub capacity_clients: Vec<usize>,
    /// Capacity: packets per second per client.
    #[arg(long, default_value_t = 1500)]
    pub capacity_pps: u32,
    /// Capacity: client loss limit (%).
    #[arg(long, default_value_t = 1.0)]
    pub capacity_loss: f64,
    /// Capacity: engine CPU limit (% of one core).
    #[arg(long, default_value_t = 95.0)]
    pub capacity_cpu: f64,
    /// Write one object per backend (ratios and absolute values), the rows,
    /// models, runs and capacity curve as JSON.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Write an SVG plot of delay (a) versus copies per packet.
    #[arg(long)]
    pub svg: Option<PathBuf>,
    /// Write the summary as Markdown (the ratios with CIs and the A/A
    /// floor, the per-cell table, Figs. 3-5) for docs/pktswitch.md.
    #[arg(long)]
    pub markdown: Option<PathBuf>,
    /// Leave out the A/A arm (the socket baseline run a second time in
    /// every block as `socket#aa`, whose ratio to socket is the noise
    /// floor every ratio is judged against).
    #[arg(long)]
    pub no_aa: bool,
    /// Seed of the blocks' randomised run orders (recorded in every run).
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Append every finished run to this state file (JSON lines, synced as
    /// each run ends), so an interrupted grid can be resumed.
    #[arg(long, conflicts_with = "capacity")]
    pub state: Option<PathBuf>,
    /// With `--state`: keep the runs already in the state file and make
    /// only the missing ones (refused if the file was written with other
    /// settings); with every run there, only the report is made.
    #[arg(long, requires = "state")]
    pub resume: bool,
}

/// How the load clients receive and send (`--client-io`).
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ClientIo {
    /// Through their UDP sockets.
    Socket,
    /// Through AF_XDP on their own veths (`--netns`): RX and TX rings.
    Xdp,
}

impl LabSfuArgs {
    fn backends(&self) -> Vec<BackendKind> {
        self.backends.clone().unwrap_or_else(|| {
            let mut backends_list =
                vec![BackendKind::Socket, BackendKind::Mmsg, BackendKind::Uring];
            if self.netns {
                backends_list.push(BackendKind::Xdp);
            }
            backends_list
        })
    }
}

impl TryFrom<&LabSfuArgs> for SfuLabConfig {
    type Error = anyhow::Error;

    fn try_from(a: &LabSfuArgs) -> anyhow::Result<SfuLabConfig> {
        let list = |s: &Option<String>, what: &str| -> anyhow::Result<Option<Vec<usize>>> {
            s.as_deref()
                .map(|l| ringway_server::host::parse_cpu_list(l).with_context(|| what.to_string()))
                .transpose()
        };
        anyhow::ensure!(
            a.duration.is_finite() && a.duration >= 1.0,
            "--duration must be at least 1 s"
        );
        anyhow::ensure!(
            a.warmup.is_finite() && a.warmup >= 0.0,
            "--warmup must not be negative"
        );
        anyhow::ensure!(
            a.calibrate.is_finite() && a.calibrate >= 0.0,
            "--calibrate must not be negative"
        );
        anyhow::ensure!(
            a.client_io == ClientIo::Socket || a.netns,
            "--client-io xdp needs --netns (AF_XDP on each client's veth)"
        );
        let config = SfuLabConfig {
            clients: a.clients.clone(),
            pps: a.pps.clone(),
            backends: a.backends(),
            reps: a.reps,
            duration_s: a.duration,
            warmup_s: a.warmup,
            flush: a.flush,
            flush_age_us: a.flush_age_us,
            batch: a.batch,
            spin_us: a.spin_us,
            cpus: list(&a.cpus, "--cpus")?,
            load_cpus: list(&a.load_cpus, "--load-cpus")?,
            load_sender_policy: match a.load_sender_policy {
                Some(policy) => Some(policy),
                None if a.netns => Some(Policy::Fifo(10)),
                None => None,
            },
            max_foreign_pct: a.max_foreign_cpu,
            max_late_pct: a.max_late,
            late_calibration: None,
            kernel_fanout: a.kernel_fanout,
            aa: !a.no_aa,
            seed: a.seed,
            xdp_clients: a.client_io == ClientIo::Xdp,
        };
        Ok(if a.paper { config.paper() } else { config })
    }
}

/// Where the runs happen, in words (also part of the state file's
/// fingerprint).
fn shape(a: &LabSfuArgs) -> String {
    if a.netns {
        let shape = if a.routed && a.no_napi {
            "veth hosts, every client behind a router host"
        } else if a.routed {
            "veth hosts, every client behind a router host with threaded NAPI at its ports"
        } else if a.no_napi {
            "veth hosts, no threaded NAPI"
        } else {
            "veth hosts, threaded NAPI at the switch ports"
        };
        let family = if a.ipv6 { ", IPv6" } else { "" };
        let clients = match a.client_io {
            ClientIo::Socket => "",
            ClientIo::Xdp => ", clients receive and send through AF_XDP",
        };
        format!("{shape}{family}{clients}")
    } else {
        "private netns, lo".to_string()
    }
}

/// The state file (`--state`) and the runs already in it.
type State = (Option<Checkpoint>, Vec<Run>);

/// The experiment on `place`: the calibration if asked, then the capacity
/// curve or the grid.
fn experiment(
    a: LabSfuArgs,
    mut config: SfuLabConfig,
    place: Placement,
    state: State,
) -> anyhow::Result<()> {
    if a.calibrate > 0.0 {
        config.late_calibration = Some(calibrate(&a, &config)?);
    }
    if a.capacity {
        capacity(&a, &config, place)
    } else {
        grid(&a, &config, place, state)
    }
}

/// `--calibrate`: the load generator's lateness alone at the busiest cell
/// (the grid's, or the capacity curve's last step), printed.
fn calibrate(a: &LabSfuArgs, config: &SfuLabConfig) -> anyhow::Result<LateCalibration> {
    let busiest = if a.capacity {
        SfuLabConfig {
            clients: a.capacity_clients.clone(),
            pps: vec![a.capacity_pps],
            ..config.clone()
        }
    } else {
        config.clone()
    };
    let cal = calibrate_lateness(&busiest, std::time::Duration::from_secs_f64(a.calibrate))
        .context("calibrating the load generator's lateness")?;
    println!(
        "load generator alone ({:.0}s, {} ticks): {:.2}% of ticks > 1 ms late; runs above {:.2}% are left out",
        a.calibrate, cal.ticks, cal.late_pct, cal.limit_pct
    );
    Ok(cal)
}

/// The backends' names, as the headers print them.
fn backend_names(config: &SfuLabConfig) -> Vec<&'static str> {
    config.backends.iter().map(|b| b.name()).collect()
}

/// `--capacity`: the clients rise per backend until a limit; each step and
/// then the curve are printed (and written as JSON with `--json`).
fn capacity(a: &LabSfuArgs, config: &SfuLabConfig, place: Placement) -> anyhow::Result<()> {
    println!(
        "ringway lab sfu --capacity: {:.0}s (+{:.0}s warm-up) per step ({}), clients {:?} at {} pps each, backends {:?}",
        a.duration,
        a.warmup,
        shape(a),
        a.capacity_clients,
        a.capacity_pps,
        backend_names(config)
    );
    let cap = run_capacity(
        &place,
        config,
        a.capacity_pps,
        &a.capacity_clients,
        (a.capacity_loss, a.capacity_cpu),
        print_step,
    )?;
    drop(place);
    print!("{}", render_capacity(&cap));
    if let Some(path) = &a.json {
        let report = json(&[], &summarize(&[]), Some(&cap));
        std::fs::write(path, serde_json::to_vec_pretty(&report)?)?;
    }
    Ok(())
}

/// One step of the capacity curve, as it ends.
fn print_step(step: &CapacityPoint) {
    println!(
        "step {} clients={} ({} pps in): cpu={} loss={} delay(a) p50={}{}",
        step.backend,
        step.clients,
        step.load_pps,
        unit(step.cpu_pct, 1, "%"),
        unit(step.loss_pct, 2, "%"),
        unit(step.delay_p50_us, 1, "us"),
        labelled(" -> limit: ", step.limit.as_deref())
    )
}

/// The grid: every run not already in the state file, each printed as it
/// ends and appended to the state file; then the summary over all runs.
/// Fails when a run failed (after the summary over the rest).
fn grid(
    a: &LabSfuArgs,
    config: &SfuLabConfig,
    place: Placement,
    (mut state, mut runs): State,
) -> anyhow::Result<()> {
    let total = config.plan().len();
    let done = ringway_lab::sfulab::settled_keys(&runs);
    let left = config
        .plan()
        .iter()
        .filter(|p| !done.contains(&p.key()))
        .count();
    print_grid_header(a, config, left);
    if let Some(state) = &state {
        println!(
            "state file {}: {} runs already there, {left} to make",
            state.path().display(),
            total - left
        );
    }
    let (new_runs, failed) = run_grid(
        &place,
        config,
        &|p| done.contains(&p.key()),
        |run| Checkpoint::append_to(&mut state, run),
        print_run,
    )?;
    drop(place);
    runs.extend(new_runs);
    anyhow::ensure!(!runs.is_empty(), "every run failed");
    if failed > 0 {
        println!(
            "{failed} of {total} runs failed (see stderr); summary over the rest{}",
            if state.is_some() {
                " (run the same command with --resume to make them)"
            } else {
                ""
            }
        );
    }
    write_summary(a, &runs)?;
    anyhow::ensure!(
        failed == 0,
        "{failed} of {total} runs failed: the summary above is over the rest"
    );
    Ok(())
}

/// What the grid will do: its size, shape and order, and the time the
/// `left` runs still to make will take.
fn print_grid_header(a: &LabSfuArgs, config: &SfuLabConfig, left: usize) {
    let total = config.plan().len();
    if a.paper {
        println!(
            "--paper (pktswitch Figs. 3-5): clients {:?}, pps/client {:?}, {} repetitions of {:.0}s",
            config.clients, config.pps, config.reps, config.duration_s
        );
    }
    println!(
        "ringway lab sfu: {total} runs of {:.0}s (+{:.0}s warm-up) ({}), clients {:?}, pps/client {:?}, backends {:?}{}, blocks in random order (seed {}), about {:.0} min",
        config.duration_s,
        config.warmup_s,
        shape(a),
        config.clients,
        config.pps,
        backend_names(config),
        if config.aa { " + socket#aa (A/A)" } else { "" },
        config.seed,
        config.planned_seconds() / 60.0 * left as f64 / total.max(1) as f64,
    );
}

/// One run of the grid, as it ends (a failed one on stderr: one failed run
/// on an overloaded machine must not lose the sweep).
fn print_run(r: &anyhow::Result<Run>, p: &PlannedRun) {
    let name = p.label();
    let (rep, n, pps) = (p.rep, p.clients, p.pps);
    match r {
        Err(e) => eprintln!("run rep={rep} clients={n} pps={pps} backend={name} failed: {e:#}"),
        Ok(r) => println!(
            "run rep={rep} clients={n} pps={pps} backend={name} (block {} #{}) [{}; flush {}]: cpu user={} \
             kern={} ({}/pkt) delay(a) p50={} mean={} (b)={} (c)={} (d)={} copies={:.1} \
             media={} client_loss={} sfu_host={} ({}/pkt) clients={} switch={} other={} steal={} load={}{}",
            p.block,
            p.order,
            r.io_mode,
            r.flush,
            unit(r.cpu_user_pct, 1, "%"),
            unit(r.cpu_system_pct, 1, "%"),
            unit(r.cpu_per_packet_us, 2, "us"),
            unit(r.delay_p50_us, 1, "us"),
            unit(r.delay_mean_us, 1, "us"),
            unit(r.handoff_p50_us, 1, "us"),
            unit(r.wait_p50_us, 1, "us"),
            unit(r.kdelay_p50_us, 1, "us"),
            r.copies_per_packet,
            r.media,
            unit(r.client_loss_pct, 2, "%"),
            unit(r.sfu_host_pct, 1, "%"),
            unit(r.sfu_host_per_packet_us, 2, "us"),
            unit(r.clients_pct, 1, "%"),
            unit(r.switch_pct, 1, "%"),
            unit(r.foreign_pct, 0, "%"),
            unit(r.steal_pct, 1, "%"),
            unit(r.loadavg1, 2, ""),
            labelled(" LEFT OUT: ", r.excluded.as_deref())
        ),
    }
}

/// The summary over `runs`: printed, and written as JSON, SVG and Markdown
/// where asked.
fn write_summary(a: &LabSfuArgs, runs: &[Run]) -> anyhow::Result<()> {
    let summary = summarize(runs);
    print!("{}", render(&summary));
    if let Some(path) = &a.json {
        std::fs::write(
            path,
            serde_json::to_vec_pretty(&json(runs, &summary, None))?,
        )?;
    }
    if let Some(path) = &a.svg {
        std::fs::write(path, svg(runs, &summary))?;
    }
    if let Some(path) = &a.markdown {
        std::fs::write(path, markdown(&summary))?;
    }
    Ok(())
}

/// Run `ringway lab sfu`.
pub(crate) fn run(a: LabSfuArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        a.reps >= 1 && !a.clients.is_empty() && !a.pps.is_empty() && !a.backends().is_empty(),
        "need at least one repetition, client count, rate and backend"
    );
    anyhow::ensure!(a.pps.iter().all(|&p| p > 0), "--pps must be positive");
    anyhow::ensure!(
        a.netns || !a.backends().contains(&BackendKind::Xdp),
        "the xdp backend needs --netns (it attaches to the SFU host's veth)"
    );
    anyhow::ensure!(
        a.netns || !a.kernel_fanout,
        "--kernel-fanout needs --netns (it attaches to the SFU host's veth)"
    );
    anyhow::ensure!(
        a.netns || !(a.routed || a.ipv6),
        "--routed and --ipv6 need --netns"
    );
    let config = SfuLabConfig::try_from(&a)?;
    // Opened before the testbed and the calibration: a refused state file
    // costs nothing.
    let fingerprint = format!("{} placement {}", config.fingerprint(), shape(&a));
    let state: State = Checkpoint::open_optional(a.state.as_deref(), &fingerprint, a.resume)?;
    if a.netns {
        let max = if a.capacity {
            a.capacity_clients.iter().copied().max().unwrap_or(1)
        } else {
            config.clients.iter().copied().max().unwrap_or(1)
        };
        let place = if a.routed {
            Placement::routed(max, !a.no_napi, a.ipv6)?
        } else {
            Placement::hosts(max, !a.no_napi, a.ipv6)?
        };
        return experiment(a, config, place, state);
    }
    ringway_io::netns::in_private_netns(move || experiment(a, config, Placement::Loopback, state))?
}

/// `v` with `decimals` and its unit, or `n/a` when there is no data (NaN).
fn unit(v: f64, decimals: usize, unit: &str) -> String {
    if v.is_finite() {
        format!("{v:.decimals$}{unit}")
    } else {
        "n/a".into()
    }
}

/// `label` and `text`, or nothing without a text.
fn labelled(label: &str, text: Option<&str>) -> String {
    text.map(|t| format!("{label}{t}")).unwrap_or_default()
}
