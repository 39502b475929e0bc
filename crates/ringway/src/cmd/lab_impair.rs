//! `ringway lab impair`: UDP impairment relay after the SRPIC paper's netem
//! setup (Normal delay per packet at a link rate, loss, receiver interrupt
//! coalescing; forward and reverse paths set separately), since netem is
//! absent from this kernel.

use ringway_lab::impair::relay::{Relay, RelayConfig};
use ringway_lab::impair::{CoalesceConfig, LossModel, PathConfig};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

/// Arguments of `ringway lab impair`.
#[derive(clap::Args, Debug)]
pub(crate) struct ImpairArgs {
    /// Address to receive client datagrams on.
    #[arg(long)]
    pub listen: std::net::SocketAddr,
    /// Address to relay them to (replies are relayed back to the last client).
    #[arg(long)]
    pub to: std::net::SocketAddr,
    /// Emulated link rate in Mb/s, both directions (0: no link, no queue).
    #[arg(long, default_value_t = 0.0)]
    pub rate_mbps: f64,
    /// Link queue limit in milliseconds of link time (drop-tail; 0: unlimited).
    #[arg(long, default_value_t = 0.0)]
    pub queue_ms: f64,
    /// Forward delay: mean α in milliseconds.
    #[arg(long, default_value_t = 0.0)]
    pub delay_ms: f64,
    /// Forward delay: standard deviation σ = β·α in milliseconds (Normal).
    #[arg(long, default_value_t = 0.0)]
    pub sigma_ms: f64,
    /// Forward loss probability δ (uniform).
    #[arg(long, default_value_t = 0.0)]
    pub loss: f64,
    /// Forward bursty loss instead: "P_GB,P_BG,LOSS_BAD" (Gilbert-Elliott;
    /// no loss in the good state).
    #[arg(long)]
    pub burst_loss: Option<String>,
    /// Reverse delay: mean in milliseconds.
    #[arg(long, default_value_t = 0.0)]
    pub rev_delay_ms: f64,
    /// Reverse delay: standard deviation in milliseconds.
    #[arg(long, default_value_t = 0.0)]
    pub rev_sigma_ms: f64,
    /// Reverse loss probability (uniform).
    #[arg(long, default_value_t = 0.0)]
    pub rev_loss: f64,
    /// Receiver interrupt coalescing delay T_intr in µs on the forward path
    /// (each block leaves in one sendmmsg when its drain ends; 0: off).
    #[arg(long, default_value_t = 0.0)]
    pub t_intr_us: f64,
    /// Receiver softirq service rate R_sn in packets per second.
    #[arg(long, default_value_t = 2.9e6)]
    pub rsn_pps: f64,
    /// Receiver ring (most packets in one block).
    #[arg(long, default_value_t = 512)]
    pub ring: usize,
    /// Seed of the forward decisions (the reverse path uses seed + 1).
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Seconds to run.
    #[arg(long, default_value_t = 30.0)]
    pub duration: f64,
}

fn ns(x: f64, scale: f64, what: &str) -> anyhow::Result<u64> {
    if !(x.is_finite() && x >= 0.0) {
        anyhow::bail!("--{what} must be a non-negative number");
    }
    Ok((x * scale) as u64)
}

fn prob(p: f64, what: &str) -> anyhow::Result<f64> {
    if !(0.0..=1.0).contains(&p) {
        anyhow::bail!("--{what} must be a probability in [0, 1]");
    }
    Ok(p)
}

/// `P_GB,P_BG,LOSS_BAD` → a Gilbert-Elliott model.
fn burst_loss(s: &str) -> anyhow::Result<LossModel> {
    let values: Vec<f64> = s
        .split(',')
        .map(|x| x.trim().parse::<f64>())
        .collect::<Result<_, _>>()
        .map_err(|_| anyhow::anyhow!("--burst-loss wants three numbers P_GB,P_BG,LOSS_BAD"))?;
    let [p_gb, p_bg, loss_bad] = values[..] else {
        anyhow::bail!("--burst-loss wants three numbers P_GB,P_BG,LOSS_BAD");
    };
    Ok(LossModel::GilbertElliott {
        p_gb: prob(p_gb, "burst-loss P_GB")?,
        p_bg: prob(p_bg, "burst-loss P_BG")?,
        loss_good: 0.0,
        loss_bad: prob(loss_bad, "burst-loss LOSS_BAD")?,
    })
}

/// Run the relay until `--duration` passes; print its counters as JSON.
pub(crate) fn run(a: ImpairArgs) -> anyhow::Result<()> {
    if !(a.duration.is_finite() && a.duration > 0.0) {
        anyhow::bail!("--duration must be positive");
    }
    let rate_bps = ns(a.rate_mbps, 1e6, "rate-mbps")?;
    let queue_ns = ns(a.queue_ms, 1e6, "queue-ms")?;
    let forward = PathConfig {
        rate_bps,
        delay_ns: ns(a.delay_ms, 1e6, "delay-ms")?,
        sigma_ns: ns(a.sigma_ms, 1e6, "sigma-ms")?,
        loss: match &a.burst_loss {
            Some(s) => burst_loss(s)?,
            None if a.loss > 0.0 => LossModel::Uniform(prob(a.loss, "loss")?),
            None => LossModel::None,
        },
        seed: a.seed,
        queue_ns,
        ..Default::default()
    };
    let reverse = PathConfig {
        rate_bps,
        delay_ns: ns(a.rev_delay_ms, 1e6, "rev-delay-ms")?,
        sigma_ns: ns(a.rev_sigma_ms, 1e6, "rev-sigma-ms")?,
        loss: if a.rev_loss > 0.0 {
            LossModel::Uniform(prob(a.rev_loss, "rev-loss")?)
        } else {
            LossModel::None
        },
        seed: a.seed.wrapping_add(1),
        queue_ns,
        ..Default::default()
    };
    let coalesce = (a.t_intr_us > 0.0)
        .then(|| -> anyhow::Result<CoalesceConfig> {
            if !(a.rsn_pps.is_finite() && a.rsn_pps > 0.0) {
                anyhow::bail!("--rsn-pps must be positive");
            }
            Ok(CoalesceConfig {
                t_intr_ns: ns(a.t_intr_us, 1e3, "t-intr-us")?,
                rsn_pps: a.rsn_pps,
                ring: a.ring.max(1),
            })
        })
        .transpose()?;
    let relay = Relay::bind(RelayConfig {
        listen: a.listen,
        to: a.to,
        forward,
        reverse,
        coalesce,
        duration: Duration::from_secs_f64(a.duration),
    })?;
    eprintln!(
        "impair relay on {} -> {} for {:.1}s",
        relay.local_addr()?,
        a.to,
        a.duration
    );
    let report = relay.run(Arc::new(AtomicBool::new(false)))?;
    println!("{}", serde_json::to_string_pretty(&report)?);
    Ok(())
}
