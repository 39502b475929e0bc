//! `ringway lab srpic-tcp`: SRPIC in front of a real TCP receiver (iperf3
//! through the TUN relay), the SRPIC paper's Tables 4–8 and Fig. 2 (see
//! `ringway_lab::srpic_tcp` and docs/srpic.md).

use ringway_lab::srpic_tcp::hosts::SenderProfile;
use ringway_lab::srpic_tcp::{report, run_grid, Table, TcpLabConfig};

/// Arguments of `ringway lab srpic-tcp`.
#[derive(clap::Args, Debug)]
pub(crate) struct LabSrpicTcpArgs {
    /// Experiments: 4, 5 (with 7's CPU), 6, 8, sweep.
    #[arg(long, value_delimiter = ',', default_value = "4,5,6,8,sweep")]
    pub tables: Vec<String>,
    /// Emulated link rate in Mb/s (σ and the receiver model are scaled by
    /// 1000 / rate so the reordering structure matches the paper's 1 Gb/s).
    #[arg(long, default_value_t = 200.0)]
    pub rate_mbps: f64,
    /// Mean one-way delay α in ms (both paths).
    #[arg(long, default_value_t = 2.5)]
    pub alpha_ms: f64,
    /// iperf3 seconds per run (the paper: 50).
    #[arg(long, default_value_t = 50.0)]
    pub duration: f64,
    /// Repetitions per cell and mode.
    #[arg(long, default_value_t = 3)]
    pub reps: usize,
    /// Table 4's β values in percent.
    #[arg(long, value_delimiter = ',', default_value = "10,2,1,0.2")]
    pub betas: Vec<f64>,
    /// Tables 5, 6, 8's δ values in percent.
    #[arg(long, value_delimiter = ',', default_value = "0.1,0.01,0.001")]
    pub deltas: Vec<f64>,
    /// β of Tables 6 and 8 in percent.
    #[arg(long, default_value_t = 0.4)]
    pub beta_loss: f64,
    /// Parallel streams (Tables 4, 6).
    #[arg(long, value_delimiter = ',', default_value = "1,5,10")]
    pub streams: Vec<usize>,
    /// Sender profiles: S (dupthresh 3), A (adaptive).
    #[arg(long, value_delimiter = ',', default_value = "S,A")]
    pub senders: Vec<String>,
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
    /// Leave out runs whose relay delivered blocks later than this (p99, µs).
    #[arg(long, default_value_t = 1000.0)]
    pub max_late_us: f64,
    /// TCP timestamps in both namespaces: on (the kernel's default) or off.
    #[arg(long, default_value = "on", value_parser = ["on", "off"])]
    pub tcp_timestamps: String,
    /// Where SRPIC puts a retransmitted segment: sorted (Listing 1: on
    /// PrevPacketList, ahead of new segments sent before it) or in-place
    /// (a diagnostic, not the paper: it keeps its transmission position).
    #[arg(long, default_value = "sorted", value_parser = ["sorted", "in-place"])]
    pub srpic_retransmissions: String,
    /// Write every run and the tables as JSON here.
    #[arg(long)]
    pub json: Option<std::path::PathBuf>,
}

fn positive(x: f64, what: &str) -> anyhow::Result<f64> {
    if !(x.is_finite() && x > 0.0) {
        anyhow::bail!("--{what} must be positive");
    }
    Ok(x)
}

impl TryFrom<LabSrpicTcpArgs> for TcpLabConfig {
    type Error = anyhow::Error;

    fn try_from(a: LabSrpicTcpArgs) -> anyhow::Result<TcpLabConfig> {
        let tables = a
            .tables
            .iter()
            .map(|t| {
                Table::parse(t).ok_or_else(|| {
                    anyhow::anyhow!("--tables: unknown {t:?} (4, 5, 6, 7, 8, sweep)")
                })
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        let senders = a
            .senders
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
        if a.streams.iter().any(|&s| s == 0 || s > 128) {
            anyhow::bail!("--streams values must be 1..=128");
        }
        if a.sweep
            .iter()
            .any(|&f| !(f.is_finite() && f > 0.0 && f <= 1.0))
        {
            anyhow::bail!("--sweep values are fractions in (0, 1]");
        }
        let duration = positive(a.duration, "duration")?;
        if duration > 600.0 {
            anyhow::bail!("--duration is at most 600 s");
        }
        Ok(TcpLabConfig {
            rate_mbps: positive(a.rate_mbps, "rate-mbps")?,
            alpha_ms: positive(a.alpha_ms, "alpha-ms")?,
            duration_s: duration,
            reps: a.reps.max(1),
            block: a.block.max(1),
            ring: a.ring.max(1),
            seed: a.seed,
            tables,
            betas: frac(&a.betas, "betas")?,
            deltas: frac(&a.deltas, "deltas")?,
            streams: a.streams,
            senders,
            beta_loss: frac(&[a.beta_loss], "beta-loss")?[0],
            sweep: a.sweep,
            max_late_us: positive(a.max_late_us, "max-late-us")?,
            timestamps: a.tcp_timestamps == "on",
            retransmissions_in_place: a.srpic_retransmissions == "in-place",
        })
    }
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
    let json = a.json.clone();
    let config = TcpLabConfig::try_from(a)?;
    let cells = config.cells();
    let runs_total: usize = cells
        .iter()
        .map(|x| if x.table == Table::Sweep { 1 } else { 2 } * config.reps)
        .sum();
    println!(
        "lab srpic-tcp: {} cells, {} runs of {} s (about {:.0} min); sender profiles: S-Sender = {:?}, A-Sender = kernel defaults; TCP timestamps {} in both namespaces; SRPIC retransmissions {}",
        cells.len(),
        runs_total,
        config.duration_s,
        runs_total as f64 * (config.duration_s + 3.0) / 60.0,
        SenderProfile::S.sysctls(),
        timestamps_note(&config),
        if config.retransmissions_in_place {
            "in place (diagnostic, not Listing 1)"
        } else {
            "sorted (Listing 1)"
        }
    );
    println!(
        "{:<6} {:<8} {:>3} {:>6} {:>7} {:>5} {:>3} {:>9} {:>7} {:>7} {:>7} {:>7} {:>8} {:>8} {:>7}",
        "table",
        "sender",
        "st",
        "beta%",
        "delta%",
        "srpic",
        "rep",
        "Mb/s",
        "retr",
        "dupack",
        "sack",
        "block",
        "reord_in",
        "reord_up",
        "late99"
    );
    let runs = run_grid(&config, |cell, on, rep, r| {
        match r {
        Ok(r) => println!(
            "{:<6} {:<8} {:>3} {:>6} {:>7} {:>5} {:>3} {:>9.1} {:>7} {:>7} {:>7} {:>7.2} {:>8.4} {:>8.4} {:>7.0}{}",
            format!("{:?}", cell.table),
            cell.sender.name(),
            cell.streams,
            cell.beta * 100.0,
            cell.delta * 100.0,
            if on { "on" } else { "off" },
            rep,
            r.iperf.mbps,
            r.pkts_retrans(),
            r.relay.to_sender.dup_acks,
            r.relay.to_sender.sack_blocks,
            r.relay.blocks.mean(),
            r.relay.arrival_order.2,
            r.relay.delivery_order.2,
            r.relay.late_us.1,
            r.flagged.as_ref().map_or(String::new(), |f| format!("  [left out: {f}]"))
        ),
        Err(e) => println!(
            "{:<6} {:<8} {:>3} {:>6} {:>7} {:>5} {:>3} failed: {e:#}",
            format!("{:?}", cell.table),
            cell.sender.name(),
            cell.streams,
            cell.beta * 100.0,
            cell.delta * 100.0,
            if on { "on" } else { "off" },
            rep
        ),
    }
    });
    let text = report::tables(&config, &runs);
    println!("{text}");
    if let Some(path) = json {
        let v = serde_json::json!({ "config": config, "runs": runs, "tables": text });
        std::fs::write(&path, serde_json::to_vec_pretty(&v)?)?;
    }
    Ok(())
}
