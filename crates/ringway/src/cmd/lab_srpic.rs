//! `ringway lab srpic`: SRPIC in the SFU, reordering seen by subscribers and
//! delay added, with sorting on and off (see `ringway_lab::srpic_sfu`).

use ringway_lab::srpic_sfu::{run_all, summarize, SrpicLabConfig};

/// Arguments of `ringway lab srpic`.
#[derive(clap::Args, Debug)]
pub(crate) struct LabSrpicArgs {
    /// Seconds the sender sends per run.
    #[arg(long, default_value_t = 5.0)]
    pub duration: f64,
    /// Sender packet interval per media type (ms; 3 types).
    #[arg(long, default_value_t = 0.5)]
    pub interval_ms: f64,
    /// Subscribers.
    #[arg(long, default_value_t = 2)]
    pub subscribers: usize,
    /// Relay: emulated link rate in Mb/s (σ and the receiver's coalescing
    /// are scaled by 1000 / rate).
    #[arg(long, default_value_t = 100.0)]
    pub rate_mbps: f64,
    /// Relay: mean forward delay α in ms.
    #[arg(long, default_value_t = 2.5)]
    pub delay_ms: f64,
    /// Relay: relative delay variation β in percent (σ = β·α, scaled).
    #[arg(long, default_value_t = 2.0)]
    pub beta_pct: f64,
    /// Relay: no receiver coalescing (each packet leaves when it arrives).
    #[arg(long)]
    pub no_coalesce: bool,
    /// SFU receive batch (recvmmsg).
    #[arg(long, default_value_t = 64)]
    pub batch: usize,
    /// SRPIC block size.
    #[arg(long, default_value_t = 32)]
    pub block: usize,
    /// Repetitions per mode.
    #[arg(long, default_value_t = 3)]
    pub reps: usize,
    /// Relay seed of the first repetition.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Write all runs and the summary as JSON here.
    #[arg(long)]
    pub json: Option<std::path::PathBuf>,
}

/// Run the experiment and print a table.
pub(crate) fn run(a: LabSrpicArgs) -> anyhow::Result<()> {
    if !(a.rate_mbps.is_finite() && a.rate_mbps > 0.0) {
        anyhow::bail!("--rate-mbps must be positive");
    }
    if !(a.beta_pct.is_finite() && a.beta_pct >= 0.0 && a.delay_ms.is_finite() && a.delay_ms >= 0.0)
    {
        anyhow::bail!("--beta-pct and --delay-ms must be non-negative");
    }
    if !(a.duration.is_finite() && a.duration > 0.0 && a.duration <= 600.0) {
        anyhow::bail!("--duration must be in (0, 600] seconds");
    }
    let cfg = SrpicLabConfig {
        duration_s: a.duration,
        interval_ms: a.interval_ms,
        subscribers: a.subscribers.max(1),
        rate_mbps: a.rate_mbps,
        delay_ms: a.delay_ms,
        beta: a.beta_pct / 100.0,
        coalesce: !a.no_coalesce,
        batch: a.batch.max(1),
        block: a.block.max(1),
        reps: a.reps.max(1),
        seed: a.seed,
    };
    println!(
        "lab srpic: sender -> impair relay ({} Mb/s, delay N({} ms, sigma {:.1} us) = beta {} % scaled by 1000/rate, receiver coalescing {}) -> SFU (mmsg, batch {}) -> {} subscribers; {} s x {} reps per mode, same seeds on and off",
        cfg.rate_mbps,
        cfg.delay_ms,
        cfg.beta * cfg.delay_ms * 1e3 * 1000.0 / cfg.rate_mbps,
        a.beta_pct,
        if cfg.coalesce { "on (paper receiver scaled)" } else { "off" },
        cfg.batch,
        cfg.subscribers,
        cfg.duration_s,
        cfg.reps
    );
    println!(
        "{:<6} {:>3} {:>8} {:>9} {:>7} {:>9} {:>9} {:>8} {:>9} {:>9} {:>9} {:>8} {:>8}",
        "srpic",
        "rep",
        "sent",
        "relay_re",
        "rblock",
        "sub_pkts",
        "sub_reord",
        "ratio",
        "dly_p50",
        "dly_p99",
        "rtt_p50",
        "batch",
        "after"
    );
    let results = run_all(&cfg, |r| {
        println!(
            "{:<6} {:>3} {:>8} {:>9} {:>7} {:>9} {:>9} {:>8.4} {:>9.1} {:>9.1} {:>9.1} {:>8.2} {:>8}",
            if r.srpic { "on" } else { "off" },
            r.rep,
            r.sent,
            r.relay_reordered,
            if r.relay_mean_block.is_finite() {
                format!("{:.2}", r.relay_mean_block)
            } else {
                "n/a".to_string()
            },
            r.sub_packets,
            r.sub_reordered,
            r.sub_reordered_ratio,
            r.sfu_delay_p50_us,
            r.sfu_delay_p99_us,
            r.rtt_p50_us,
            r.sfu_mean_batch,
            r.sorter_to_after
                .map_or_else(|| "n/a".to_string(), |n| n.to_string())
        );
    })?;
    let sum = summarize(&results);
    println!("summary (mean ± 95% CI over runs):");
    for s in &sum {
        println!(
            "  srpic {:<3}: reordered ratio {}  loss {}  SFU delay p50 {} us p99 {} us  RTT p50 {} us p99 {} us  batch {}",
            if s.srpic { "on" } else { "off" },
            s.reordered_ratio,
            s.lost_ratio,
            s.delay_p50_us,
            s.delay_p99_us,
            s.rtt_p50_us,
            s.rtt_p99_us,
            s.mean_batch
        );
    }
    if let Some(path) = &a.json {
        let report = serde_json::json!({ "runs": results, "summary": sum });
        std::fs::write(path, serde_json::to_vec_pretty(&report)?)?;
    }
    Ok(())
}
