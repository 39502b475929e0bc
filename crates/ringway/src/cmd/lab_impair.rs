//! `ringway lab impair`: UDP impairment relay (reorder, delay, loss), since netem is absent.

use ringway_lab::impair::relay::{Relay, RelayConfig};
use ringway_lab::impair::ImpairConfig;
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
    /// Probability that a datagram is held back (reordered).
    #[arg(long, default_value_t = 0.0)]
    pub reorder: f64,
    /// How many later datagrams overtake a held-back one.
    #[arg(long, default_value_t = 3)]
    pub reorder_gap: u32,
    /// Fixed delay in milliseconds.
    #[arg(long, default_value_t = 0.0)]
    pub delay_ms: f64,
    /// Uniform jitter ± in milliseconds (reorders when larger than the spacing).
    #[arg(long, default_value_t = 0.0)]
    pub jitter_ms: f64,
    /// Loss probability.
    #[arg(long, default_value_t = 0.0)]
    pub loss: f64,
    /// Seed of the impairment decisions.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Seconds to run.
    #[arg(long, default_value_t = 30.0)]
    pub duration: f64,
    /// Longest a held-back datagram waits for followers, in milliseconds.
    #[arg(long, default_value_t = 50.0)]
    pub hold_timeout_ms: f64,
    /// Release packets in bursts every this many microseconds (emulated
    /// interrupt coalescing at the receiver; 0: off).
    #[arg(long, default_value_t = 0.0)]
    pub burst_us: f64,
    /// Impair replies too (with the same settings, seed + 1).
    #[arg(long)]
    pub impair_replies: bool,
}

fn ms(x: f64, what: &str) -> anyhow::Result<u64> {
    if !(x.is_finite() && x >= 0.0) {
        anyhow::bail!("--{what} must be a non-negative number");
    }
    Ok((x * 1e6) as u64)
}

/// Run the relay until `--duration` passes; print its counters as JSON.
pub(crate) fn run(a: ImpairArgs) -> anyhow::Result<()> {
    for (p, n) in [(a.reorder, "reorder"), (a.loss, "loss")] {
        if !(0.0..=1.0).contains(&p) {
            anyhow::bail!("--{n} must be a probability in [0, 1]");
        }
    }
    if !(a.duration.is_finite() && a.duration > 0.0) {
        anyhow::bail!("--duration must be positive");
    }
    let fwd = ImpairConfig {
        reorder: a.reorder,
        reorder_gap: a.reorder_gap.max(1),
        delay_ns: ms(a.delay_ms, "delay-ms")?,
        jitter_ns: ms(a.jitter_ms, "jitter-ms")?,
        loss: a.loss,
        seed: a.seed,
        hold_timeout_ns: ms(a.hold_timeout_ms, "hold-timeout-ms")?,
        burst_ns: ms(a.burst_us / 1000.0, "burst-us")?,
        ..Default::default()
    };
    let rev = a.impair_replies.then_some(ImpairConfig {
        seed: a.seed.wrapping_add(1),
        ..fwd
    });
    let relay = Relay::bind(RelayConfig {
        listen: a.listen,
        to: a.to,
        forward: fwd,
        reverse: rev,
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
