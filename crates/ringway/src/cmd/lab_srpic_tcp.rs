//! `ringway lab srpic-tcp`: SRPIC in front of a real TCP receiver (iperf3
//! through the TUN relay), the SRPIC paper's Tables 4–8 and Fig. 2 (see
//! `ringway_lab::srpic_tcp` and docs/srpic.md).

use ringway_lab::checkpoint::Checkpoint;
use ringway_lab::impair::RouterBatching;
use ringway_lab::srpic_tcp::calibrate::{self, ROUTER_FIT};
use ringway_lab::srpic_tcp::hosts::SenderProfile;
use ringway_lab::srpic_tcp::relay::Placement;
use ringway_lab::srpic_tcp::{compare, report, run_grid, RunResult, Table, TcpLabConfig};

/// Arguments of `ringway lab srpic-tcp`.
#[derive(clap::Args, Debug)]
pub(crate) struct LabSrpicTcpArgs {
    /// A named set of defaults (flags given explicitly win). `table4`:
    /// Table 4's throughput cell where today's TCP can still show it:
    /// S-Sender (dupthresh fixed at 3), SACK off, TCP timestamps off (no
    /// Eifel undo), β 0.3,0.4,0.5,0.7 %, 1 stream, --scale-alpha on (the
    /// paper's RTT and window at 100 Mb/s), 50 s × 5 repetitions.
    #[arg(long, value_parser = ["table4"])]
    pub preset: Option<String>,
    /// Experiments: 4, 5 (with 7's CPU), 6, 8, sweep [default: 4,5,6,8,sweep].
    #[arg(long, value_delimiter = ',')]
    pub tables: Option<Vec<String>>,
    /// Emulated link rate in Mb/s (σ and the receiver model are scaled by
    /// 1000 / rate so the reordering structure matches the paper's 1 Gb/s)
    /// [default: 200; table4: 100].
    #[arg(long)]
    pub rate_mbps: Option<f64>,
    /// Mean one-way delay α in ms (both paths).
    #[arg(long, default_value_t = 2.5)]
    pub alpha_ms: f64,
    /// Scale α by k = 1000 / rate too (on: α' = k·α, σ = β·α', the
    /// paper's bandwidth-delay product and σ/RTT) [default: off; table4: on].
    #[arg(long, num_args = 0..=1, default_missing_value = "on", value_parser = ["on", "off"])]
    pub scale_alpha: Option<String>,
    /// iperf3 seconds per run (the paper: 50) [default: 50].
    #[arg(long)]
    pub duration: Option<f64>,
    /// Repetitions per cell and mode [default: 3; table4: 5].
    #[arg(long)]
    pub reps: Option<usize>,
    /// Table 4's β values in percent [default: 10,2,1,0.2; table4: 0.3,0.4,0.5,0.7].
    #[arg(long, value_delimiter = ',')]
    pub betas: Option<Vec<f64>>,
    /// Tables 5, 6, 8's δ values in percent.
    #[arg(long, value_delimiter = ',', default_value = "0.1,0.01,0.001")]
    pub deltas: Vec<f64>,
    /// β of Tables 6 and 8 in percent.
    #[arg(long, default_value_t = 0.4)]
    pub beta_loss: f64,
    /// Parallel streams (Tables 4, 6) [default: 1,5,10; table4: 1].
    #[arg(long, value_delimiter = ',')]
    pub streams: Option<Vec<usize>>,
    /// Sender profiles: S (dupthresh 3), A (adaptive) [default: S,A; table4: S].
    #[arg(long, value_delimiter = ',')]
    pub senders: Option<Vec<String>>,
    /// Block-size sweep: link rates as fractions of --rate-mbps.
    #[arg(long, value_delimiter = ',', default_value = "0.1,0.5,1")]
    pub sweep: Vec<f64>,
    /// SRPIC BlockSize.
    #[arg(long, default_value_t = 32)]
    pub block: usize,
    /// SRPIC Ringbuffer_Size and the receiver's ring.
    #[arg(long, default_value_t = 512)]
    pub ring: usize,
    /// Seed of the first repetition.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Leave out runs whose relay delivered blocks or ACKs later than this
    /// (p99, µs).
    #[arg(long, default_value_t = 1000.0)]
    pub max_late_us: f64,
    /// TCP timestamps in both namespaces: on (the kernel's default) or off
    /// [default: on; table4: off].
    #[arg(long, value_parser = ["on", "off"])]
    pub tcp_timestamps: Option<String>,
    /// Where SRPIC puts a segment sent after data it would overtake:
    /// sorted (Listing 1: on PrevPacketList), in-place (the relay's oracle
    /// of retransmissions: a diagnostic, not the paper) or tsval (a
    /// departure from Listing 1 a receiver can implement: a segment with a
    /// newer TSval than the data it would overtake keeps its place).
    /// Several (comma-separated) run side by side as arms of every block,
    /// each against the same SRPIC-off runs; the paper-shaped tables show
    /// the first.
    #[arg(long, default_value = "sorted", value_delimiter = ',', value_parser = ["sorted", "in-place", "tsval"])]
    pub srpic_retransmissions: Vec<String>,
    /// ASSUMPTION, not the paper's stated model: the emulator router's
    /// receive batching, "POLL_US,COST_US" at the paper's 1 Gb/s (scaled by
    /// k), "fit" for the values calibrated on Table 4's duplicate ACKs
    /// (`--calibrate-router`), or "off".
    #[arg(long, default_value = "off")]
    pub router_batching: String,
    /// Print the calibration of --router-batching against Table 4's
    /// duplicate ACKs per segment (a simulation of the relay's own stages,
    /// seconds of CPU, no namespaces) and exit.
    #[arg(long)]
    pub calibrate_router: bool,
    /// Write every run and the tables as JSON here.
    #[arg(long)]
    pub json: Option<std::path::PathBuf>,
    /// Write the comparison (SRPIC on vs off with CIs, the A/A floor, the
    /// MDE, collapses) and the tables as Markdown for docs/srpic.md.
    #[arg(long)]
    pub markdown: Option<std::path::PathBuf>,
    /// The A/A arm: SRPIC off run a second time in every block as
    /// `off#aa`; its difference from off is the noise floor the SRPIC
    /// effect is judged against.
    #[arg(long, default_value = "on", value_parser = ["on", "off"])]
    pub aa: String,
    /// A run collapsed when its throughput stayed below this % of the link
    /// rate (collapse counts per arm, Fisher's exact test off vs on).
    #[arg(long, default_value_t = 50.0)]
    pub collapse_below: f64,
    /// Append every finished run to this state file (JSON lines, synced as
    /// each run ends), so an interrupted grid can be resumed.
    #[arg(long)]
    pub state: Option<std::path::PathBuf>,
    /// With `--state`: keep the runs already in the state file and make
    /// only the missing ones (refused if the file was written with other
    /// settings); with every run there, only the report is made.
    #[arg(long, requires = "state")]
    pub resume: bool,
}

fn positive(x: f64, what: &str) -> anyhow::Result<f64> {
    if !(x.is_finite() && x > 0.0) {
        anyhow::bail!("--{what} must be positive");
    }
    Ok(x)
}

/// The `--router-batching` value.
fn router_batching(s: &str) -> anyhow::Result<Option<RouterBatching>> {
    match s.trim() {
        "off" => Ok(None),
        "fit" => Ok(Some(ROUTER_FIT)),
        x => {
            let parts: Vec<&str> = x.split(',').collect();
            let us = |v: &str| -> Option<f64> {
                v.trim()
                    .parse::<f64>()
                    .ok()
                    .filter(|u| u.is_finite() && *u >= 0.0 && *u <= 1e6)
            };
            match parts.as_slice() {
                [poll, cost] => match (us(poll), us(cost)) {
                    (Some(poll), Some(cost)) if poll > 0.0 => Ok(Some(RouterBatching {
                        poll_ns: (poll * 1e3) as u64,
                        per_packet_ns: (cost * 1e3) as u64,
                    })),
                    _ => anyhow::bail!(
                        "--router-batching: POLL_US,COST_US with 0 < POLL_US ≤ 10⁶ and 0 ≤ COST_US ≤ 10⁶"
                    ),
                },
                _ => anyhow::bail!("--router-batching: off, fit or POLL_US,COST_US (got {x:?})"),
            }
        }
    }
}

impl TryFrom<LabSrpicTcpArgs> for TcpLabConfig {
    type Error = anyhow::Error;

    fn try_from(a: LabSrpicTcpArgs) -> anyhow::Result<TcpLabConfig> {
        let table4 = a.preset.as_deref() == Some("table4");
        let pick = |given: Option<Vec<String>>, default: &str, preset: &str| -> Vec<String> {
            given.unwrap_or_else(|| {
                let v = if table4 { preset } else { default };
                v.split(',').map(str::to_string).collect()
            })
        };
        let tables = pick(a.tables, "4,5,6,8,sweep", "4")
            .iter()
            .map(|t| {
                Table::parse(t).ok_or_else(|| {
                    anyhow::anyhow!("--tables: unknown {t:?} (4, 5, 6, 7, 8, sweep)")
                })
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        let senders = pick(a.senders, "S,A", "S")
            .iter()
            .map(|s| match s.trim() {
                "S" | "s" => Ok(SenderProfile::S),
                "A" | "a" => Ok(SenderProfile::A),
                x => anyhow::bail!("--senders: unknown {x:?} (S, A)"),
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        let frac = |v: &[f64], what: &str| -> anyhow::Result<Vec<f64>> {
            v.iter()
                .map(|x| {
                    if x.is_finite() && (0.0..=100.0).contains(x) {
                        Ok(x / 100.0)
                    } else {
                        anyhow::bail!("--{what} values are percentages in [0, 100]")
                    }
                })
                .collect()
        };
        let betas = a.betas.unwrap_or_else(|| {
            if table4 {
                vec![0.3, 0.4, 0.5, 0.7]
            } else {
                vec![10.0, 2.0, 1.0, 0.2]
            }
        });
        let streams = a
            .streams
            .unwrap_or_else(|| if table4 { vec![1] } else { vec![1, 5, 10] });
        if streams.iter().any(|&s| s == 0 || s > 128) {
            anyhow::bail!("--streams values must be 1..=128");
        }
        if a.sweep
            .iter()
            .any(|&f| !(f.is_finite() && f > 0.0 && f <= 1.0))
        {
            anyhow::bail!("--sweep values are fractions in (0, 1]");
        }
        let duration = positive(a.duration.unwrap_or(50.0), "duration")?;
        if !(a.collapse_below.is_finite() && (0.0..=100.0).contains(&a.collapse_below)) {
            anyhow::bail!("--collapse-below is a percentage in [0, 100]");
        }
        if duration > 600.0 {
            anyhow::bail!("--duration is at most 600 s");
        }
        let on_off = |given: Option<String>, preset: bool, default: bool| {
            given.map_or(if table4 { preset } else { default }, |v| v == "on")
        };
        Ok(TcpLabConfig {
            rate_mbps: positive(
                a.rate_mbps.unwrap_or(if table4 { 100.0 } else { 200.0 }),
                "rate-mbps",
            )?,
            alpha_ms: positive(a.alpha_ms, "alpha-ms")?,
            duration_s: duration,
            reps: a.reps.unwrap_or(if table4 { 5 } else { 3 }).max(1),
            block: a.block.max(1),
            ring: a.ring.max(1),
            seed: a.seed,
            tables,
            betas: frac(&betas, "betas")?,
            deltas: frac(&a.deltas, "deltas")?,
            streams,
            senders,
            beta_loss: frac(&[a.beta_loss], "beta-loss")?[0],
            sweep: a.sweep,
            max_late_us: positive(a.max_late_us, "max-late-us")?,
            timestamps: on_off(a.tcp_timestamps, false, true),
            placements: {
                let mut placements: Vec<Placement> = Vec::new();
                for p in &a.srpic_retransmissions {
                    let placement = match p.as_str() {
                        "in-place" => Placement::InPlaceOracle,
                        "tsval" => Placement::TsvalGated,
                        _ => Placement::Listing1,
                    };
                    if placements.contains(&placement) {
                        anyhow::bail!("--srpic-retransmissions: {p} given twice");
                    }
                    placements.push(placement);
                }
                placements
            },
            scale_alpha: on_off(a.scale_alpha, true, false),
            router: router_batching(&a.router_batching)?,
            aa: a.aa == "on",
            collapse_below_pct: a.collapse_below,
        })
    }
}

/// `--calibrate-router`: the grid, best first, against Table 4.
fn print_calibration() {
    let polls = [100.0, 150.0, 200.0, 250.0, 300.0, 400.0];
    let costs = [1.0, 2.0, 2.5, 3.0, 3.5, 4.0, 6.0];
    println!(
        "Router receive batching (an ASSUMPTION, not the paper's stated model), calibrated on Table 4's duplicate ACKs per data segment (A-Sender, 1 stream: DupAcksIn/Mbps ÷ {:.0}); one flow at 1 Gb/s through the lab's path, the paper's receiver and SRPIC (BlockSize 32); 40 000 segments per point; fitted: β ≤ 2 %, β 10 % out of sample.",
        calibrate::SEGMENTS_PER_MBPS_50S
    );
    let fits = calibrate::calibrate(&polls, &costs, 40_000, 1);
    print!("{:>14} {:>7}", "poll/cost µs", "worst");
    for t in &calibrate::TABLE4_TARGETS {
        print!(
            "   β {:>4}% N-SRPIC → SRPIC{}",
            t.beta * 100.0,
            if t.fitted { "" } else { " (out)" }
        );
    }
    println!();
    print!("{:>14} {:>7}", "paper", "");
    for t in &calibrate::TABLE4_TARGETS {
        print!("   {:>11.3} → {:<11.3}", t.off, t.on);
        if !t.fitted {
            print!("      ");
        }
    }
    println!();
    for f in fits
        .iter()
        .take(8)
        .chain(fits.iter().filter(|f| f.router.is_none()))
    {
        let name = f.router.map_or("stated model".to_string(), |r| {
            format!("{}/{}", r.poll_ns / 1000, r.per_packet_ns as f64 / 1e3)
        });
        print!("{name:>14} {:>7.3}", f.worst);
        for (m, t) in f.model.iter().zip(&calibrate::TABLE4_TARGETS) {
            print!("   {:>11.3} → {:<11.3}", m.1, m.2);
            if !t.fitted {
                print!("      ");
            }
        }
        println!();
    }
    println!(
        "--router-batching fit = {}/{} µs",
        ROUTER_FIT.poll_ns / 1000,
        ROUTER_FIT.per_packet_ns as f64 / 1e3
    );
}

fn timestamps_note(c: &TcpLabConfig) -> &'static str {
    if c.timestamps {
        "on (kernel default)"
    } else {
        "off (net.ipv4.tcp_timestamps=0)"
    }
}

/// Run the grid, print one line per run and then the tables.
pub(crate) fn run(a: LabSrpicTcpArgs) -> anyhow::Result<()> {
    if a.calibrate_router {
        print_calibration();
        return Ok(());
    }
    let (json, markdown) = (a.json.clone(), a.markdown.clone());
    let (state_path, resume) = (a.state.clone(), a.resume);
    let config = TcpLabConfig::try_from(a)?;
    let cells = config.cells();
    let plan = config.plan();
    let (mut state, mut runs) = match &state_path {
        Some(path) => {
            let (state, runs) = Checkpoint::open::<RunResult>(path, &config.fingerprint(), resume)?;
            (Some(state), runs)
        }
        None => (None, Vec::new()),
    };
    // Runs flagged (left out) are made again on --resume, a bounded number of times.
    let done =
        ringway_lab::checkpoint::settled_keys(runs.iter().map(|r| (r.key(), r.flagged.is_none())));
    let left = plan.iter().filter(|p| !done.contains(&p.key())).count();
    println!(
        "lab srpic-tcp: {} cells, {} runs of {} s ({left} to make, about {:.0} min; arms {}, each block in random order, seed {}); sender profiles: S-Sender = {:?}, A-Sender = kernel defaults; TCP timestamps {} in both namespaces; SRPIC placement {}; α {} ms{}; router batching {}; collapse below {} % of the link rate",
        cells.len(),
        plan.len(),
        config.duration_s,
        left as f64 * (config.duration_s + 3.0) / 60.0,
        cells
            .first()
            .map(|x| config.arms(x).join(", "))
            .unwrap_or_default(),
        config.seed,
        SenderProfile::S.sysctls(),
        timestamps_note(&config),
        config
            .placements
            .iter()
            .map(|p| format!("{} ({})", p.label(), p.arm()))
            .collect::<Vec<_>>()
            .join(", "),
        config.alpha_run_ms(),
        if config.scale_alpha { " (scaled by k)" } else { "" },
        config.router_scaled().map_or("off (the paper's stated model)".to_string(), |r| format!(
            "ASSUMPTION: polls every {:.0} µs, {:.1} µs per packet (scaled by k)",
            r.poll_ns as f64 / 1e3,
            r.per_packet_ns as f64 / 1e3
        )),
        config.collapse_below_pct
    );
    if let Some(state) = &state {
        println!(
            "state file {}: {} runs already there",
            state.path().display(),
            plan.len() - left
        );
    }
    println!(
        "{:<6} {:<8} {:>3} {:>6} {:>7} {:>11} {:>3} {:>9} {:>7} {:>7} {:>7} {:>7} {:>8} {:>8} {:>6} {:>6} {:>7} {:>7} {:>5}",
        "table",
        "sender",
        "st",
        "beta%",
        "delta%",
        "arm",
        "rep",
        "Mb/s",
        "retr",
        "dupack",
        "sack",
        "block",
        "reord_in",
        "reord_up",
        "recov",
        "kept",
        "late99",
        "ack99",
        "load"
    );
    let (new_runs, failed) = run_grid(
        &config,
        &|p| done.contains(&p.key()),
        |run| match &mut state {
            Some(state) => state.append(run),
            None => Ok(()),
        },
        |p, r| {
            let cell = &p.cell;
            match r {
                Ok(r) => println!(
                    "{:<6} {:<8} {:>3} {:>6} {:>7} {:>11} {:>3} {:>9.1} {:>7} {:>7} {:>7} {:>7.2} {:>8.4} {:>8.4} {:>6} {:>6} {:>7.0} {:>7.0} {:>5.2}{}",
                    format!("{:?}", cell.table),
                    cell.sender.name(),
                    cell.streams,
                    cell.beta * 100.0,
                    cell.delta * 100.0,
                    p.arm,
                    p.rep,
                    r.iperf.mbps,
                    r.pkts_retrans(),
                    r.relay.to_sender.dup_acks,
                    r.relay.to_sender.sack_blocks,
                    r.relay.blocks.mean(),
                    r.relay.arrival_order.2,
                    r.relay.delivery_order.2,
                    r.recovery.recoveries(),
                    r.recovery.kept(),
                    r.relay.late_us.1,
                    r.relay.ack_late_us.1,
                    r.loadavg1,
                    r.flagged
                        .as_ref()
                        .map_or(String::new(), |f| format!("  [left out: {f}]"))
                ),
                Err(e) => println!(
                    "{:<6} {:<8} {:>3} {:>6} {:>7} {:>11} {:>3} failed: {e:#}",
                    format!("{:?}", cell.table),
                    cell.sender.name(),
                    cell.streams,
                    cell.beta * 100.0,
                    cell.delta * 100.0,
                    p.arm,
                    p.rep
                ),
            }
        },
    )?;
    runs.extend(new_runs);
    let text = report::tables(&config, &runs);
    println!("{text}");
    if let Some(path) = json {
        let comparison = compare::compare(&config, &runs);
        let v = serde_json::json!({ "config": config, "runs": runs, "comparison": comparison, "tables": text });
        std::fs::write(&path, serde_json::to_vec_pretty(&v)?)?;
    }
    if let Some(path) = markdown {
        let comparison = compare::compare(&config, &runs);
        let md = format!(
            "{}\n{}\n```text\n{text}```\n",
            compare::table(&comparison).markdown(),
            compare::LEGEND
        );
        std::fs::write(&path, md)?;
    }
    anyhow::ensure!(
        failed == 0,
        "{failed} of {} runs failed: the tables above are over the rest{}",
        plan.len(),
        if state.is_some() {
            " (run the same command with --resume to make them)"
        } else {
            ""
        }
    );
    Ok(())
}
