//! `ringway lab srpic`: SRPIC in the SFU's receive path, on versus off.
//!
//! Topology (all on loopback, all in this process): a sender
//! ([`ringway_load::sfu`]) sends RTP through the impairment relay
//! ([`crate::impair::relay`]: the paper's netem model — a link at
//! `rate_mbps`, forward delay `N(α, σ²)` per packet with σ = β·α scaled by
//! 1 Gb/s ÷ rate, and the paper's receiver coalescing scaled the same way,
//! each block released in one `sendmmsg` when its drain ends; the same
//! seed for SRPIC on and off) to the SFU
//! ([`ringway_server::sfu`], mmsg backend, with or without SRPIC);
//! subscribers (subscribed to everything) receive the copies directly. We read reordering as the subscribers see
//! it (packets of the sender's SSRC that arrive below the highest sequence
//! number seen: RFC 4737 reordered singletons), the SFU's per-packet
//! processing delay (app receive → last copy handed to the kernel), the
//! sorter's counters, and the sender's echo RTT.

use crate::impair::relay::{Relay, RelayConfig, RelayReport};
use crate::impair::{scaled_receiver, PathConfig};
use crate::stats::{mean_ci, MeanCi};
use anyhow::Context;
use ringway_io::{BackendKind, Io};
use ringway_load::sfu::{ClientReport, SfuLoadConfig};
use ringway_server::sfu::{SfuServer, SfuServerConfig};
use ringway_sfu::MediaType;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Experiment settings.
#[derive(Clone, Debug)]
pub struct SrpicLabConfig {
    /// Seconds the sender sends.
    pub duration_s: f64,
    /// Sender packet interval per media type (ms); 3 types.
    pub interval_ms: f64,
    /// Number of subscribers.
    pub subscribers: usize,
    /// Relay: emulated link rate (Mb/s).
    pub rate_mbps: f64,
    /// Relay: mean forward delay α (ms).
    pub delay_ms: f64,
    /// Relay: relative delay variation β (σ = β·α·1000/rate_mbps).
    pub beta: f64,
    /// Relay: emulate the receiver's interrupt coalescing (the paper's
    /// receiver scaled to the rate); off: each packet leaves when it arrives.
    pub coalesce: bool,
    /// SFU receive batch (recvmmsg).
    pub batch: usize,
    /// SRPIC block size.
    pub block: usize,
    /// Repetitions per mode.
    pub reps: usize,
    /// Relay seed of the first repetition (+ rep index).
    pub seed: u64,
}

/// What one run measured.
#[derive(Clone, Debug, serde::Serialize)]
pub struct RunResult {
    /// SRPIC on in the SFU.
    pub srpic: bool,
    /// Repetition index.
    pub rep: usize,
    /// Media packets sent.
    pub sent: u64,
    /// Packets the relay delivered after a packet that arrived later
    /// (RFC 4737 reordered singletons of the relay's output).
    pub relay_reordered: u64,
    /// Mean block size of the relay's emulated receiver (NaN without).
    pub relay_mean_block: f64,
    /// Media packets the relay dropped: its path's loss, queue and
    /// overflow drops (none configured here, but counted) and failed sends.
    pub relay_dropped: u64,
    /// Sender's packets received by subscribers (sum).
    pub sub_packets: u64,
    /// Of those lost.
    pub sub_lost: u64,
    /// Of those reordered (arrived below the highest sequence number seen).
    pub sub_reordered: u64,
    /// sub_reordered / sub_packets.
    pub sub_reordered_ratio: f64,
    /// SFU processing delay p50 / p99 (µs).
    pub sfu_delay_p50_us: f64,
    /// See `sfu_delay_p50_us`.
    pub sfu_delay_p99_us: f64,
    /// Mean datagrams per receive syscall at the SFU.
    pub sfu_mean_batch: f64,
    /// Sorter: packets put on AfterPacketList / PrevPacketList (`None`:
    /// the SFU ran no sorter and reported none).
    pub sorter_to_after: Option<u64>,
    /// See `sorter_to_after`.
    pub sorter_to_prev: Option<u64>,
    /// Sender's echo RTT p50 / p99 (µs), through the relay.
    pub rtt_p50_us: f64,
    /// See `rtt_p50_us`.
    pub rtt_p99_us: f64,
}

/// One run with SRPIC `on` or off: the SFU, the relay, the subscribers and
/// the sender all run in this process, on loopback.
pub fn run_once(c: &SrpicLabConfig, on: bool, rep: usize) -> anyhow::Result<RunResult> {
    let duration = c.duration_s;
    let sfu_config = SfuServerConfig {
        listen: "127.0.0.1:0".parse().expect("literal"),
        io: Io::Mmsg,
        batch: Some(c.batch),
        duration_s: Some(duration + 4.0),
        srpic_block: on.then_some(c.block),
        ..SfuServerConfig::default()
    };
    // The handle stops the SFU on every way out (also when the clients fail).
    let sfu = SfuServer::start(sfu_config).context("the SFU did not start")?;
    let result = clients_through_relay(c, rep, sfu.local_addr());
    let sfu_report = sfu.shutdown()?;
    let (sender, subscribers, relay) = result?;
    let ssid = *sender.ssids.first().context("sender SSID")?;
    let (mut packets, mut lost, mut reordered) = (0u64, 0u64, 0u64);
    for s in subscribers.iter().flat_map(|r| &r.received) {
        if s.ssrc == ssid {
            packets += s.packets;
            lost += s.lost;
            reordered += s.reordered;
        }
    }
    let io_report = &sfu_report.io;
    Ok(RunResult {
        srpic: on,
        rep,
        sent: sender.tx_packets,
        relay_reordered: relay.forward_reordered,
        relay_mean_block: relay.blocks.mean(),
        relay_dropped: relay.forward.lost
            + relay.forward.queue_drops
            + relay.forward.overflow
            + relay.send_errors,
        sub_packets: packets,
        sub_lost: lost,
        sub_reordered: reordered,
        sub_reordered_ratio: if packets > 0 {
            reordered as f64 / packets as f64
        } else {
            0.0
        },
        sfu_delay_p50_us: sfu_report.delay.p50_us,
        sfu_delay_p99_us: sfu_report.delay.p99_us,
        sfu_mean_batch: if io_report.rx_syscalls > 0 {
            io_report.rx_packets as f64 / io_report.rx_syscalls as f64
        } else {
            0.0
        },
        sorter_to_after: sfu_report.srpic.as_ref().map(|s| s.to_after),
        sorter_to_prev: sfu_report.srpic.as_ref().map(|s| s.to_prev),
        rtt_p50_us: sender.rtt.p50_us,
        rtt_p99_us: sender.rtt.p99_us,
    })
}

/// The relay's forward path and receiver model for `c` (repetition `rep`).
pub fn relay_config(
    c: &SrpicLabConfig,
    rep: usize,
    to: SocketAddr,
    duration: Duration,
) -> RelayConfig {
    let ms_per_mbit = 1000.0 / c.rate_mbps.max(1e-3);
    let alpha_ns = c.delay_ms * 1e6;
    RelayConfig {
        listen: "127.0.0.1:0".parse().expect("literal"),
        to,
        forward: PathConfig {
            rate_bps: (c.rate_mbps * 1e6) as u64,
            delay_ns: alpha_ns as u64,
            sigma_ns: (c.beta * alpha_ns * ms_per_mbit) as u64,
            seed: c.seed + rep as u64,
            ..Default::default()
        },
        reverse: PathConfig::default(),
        coalesce: c.coalesce.then(|| scaled_receiver(ms_per_mbit)),
        duration,
    }
}

/// The relay in front of the SFU at `sfu_addr`, the subscribers and the
/// sender; returns the sender's and the subscribers' reports and the
/// relay's report.
fn clients_through_relay(
    c: &SrpicLabConfig,
    rep: usize,
    sfu_addr: SocketAddr,
) -> anyhow::Result<(ClientReport, Vec<ClientReport>, RelayReport)> {
    let duration = c.duration_s;
    let relay = Relay::bind(relay_config(
        c,
        rep,
        sfu_addr,
        Duration::from_secs_f64(duration + 3.0),
    ))?;
    let relay_addr = relay.local_addr()?;
    let relay_stop = Arc::new(AtomicBool::new(false));
    let relay_thread = {
        let stop = relay_stop.clone();
        std::thread::spawn(move || relay.run(stop))
    };
    let never = Arc::new(AtomicBool::new(false));
    // Subscribers: they send a 20 pps audio stream of their own (only the
    // sender's SSRC is counted) and subscribe to everything.
    let subscribers: Vec<_> = (0..c.subscribers)
        .map(|_| {
            let config = SfuLoadConfig {
                types: vec![MediaType::Asq],
                sizes: vec![40],
                interval_ms: 50.0,
                duration_s: duration + 1.5,
                backend: BackendKind::Socket,
                ..SfuLoadConfig::new(sfu_addr, 1)
            };
            let never = never.clone();
            std::thread::spawn(move || ringway_load::sfu::run(&config, &never, None, |_| {}))
        })
        .collect();
    std::thread::sleep(Duration::from_millis(700));
    let sender = SfuLoadConfig {
        interval_ms: c.interval_ms,
        subscribe: Vec::new(),
        duration_s: duration,
        backend: BackendKind::Socket,
        ..SfuLoadConfig::new(relay_addr, 1)
    };
    let sender = ringway_load::sfu::run(&sender, &never, None, |_| {});
    let subscribers: anyhow::Result<Vec<ClientReport>> = subscribers
        .into_iter()
        .map(|h| {
            h.join()
                .map_err(|_| anyhow::anyhow!("a subscriber thread panicked"))?
        })
        .collect();
    relay_stop.store(true, Ordering::Relaxed);
    let relay_report = relay_thread
        .join()
        .map_err(|_| anyhow::anyhow!("relay thread panicked"))??;
    Ok((sender?, subscribers?, relay_report))
}

/// Mean ± 95% CI of each measure, per mode.
#[derive(Clone, Debug, serde::Serialize)]
pub struct ModeSummary {
    /// SRPIC on.
    pub srpic: bool,
    /// Runs.
    pub runs: usize,
    /// Subscriber-side reordered ratio.
    pub reordered_ratio: MeanCi,
    /// Subscriber-side loss ratio.
    pub lost_ratio: MeanCi,
    /// SFU processing delay p50 (µs).
    pub delay_p50_us: MeanCi,
    /// SFU processing delay p99 (µs).
    pub delay_p99_us: MeanCi,
    /// Sender RTT p50 (µs).
    pub rtt_p50_us: MeanCi,
    /// Sender RTT p99 (µs).
    pub rtt_p99_us: MeanCi,
    /// Datagrams per receive syscall at the SFU.
    pub mean_batch: MeanCi,
}

/// Summaries of `results` for off and on.
pub fn summarize(results: &[RunResult]) -> Vec<ModeSummary> {
    [false, true]
        .iter()
        .filter_map(|&on| {
            let selected: Vec<&RunResult> = results.iter().filter(|x| x.srpic == on).collect();
            if selected.is_empty() {
                return None;
            }
            let mean_of = |g: &dyn Fn(&RunResult) -> f64| {
                mean_ci(&selected.iter().map(|x| g(x)).collect::<Vec<_>>())
            };
            Some(ModeSummary {
                srpic: on,
                runs: selected.len(),
                reordered_ratio: mean_of(&|x| x.sub_reordered_ratio),
                lost_ratio: mean_of(&|x| {
                    let total = x.sub_packets + x.sub_lost;
                    if total == 0 {
                        0.0
                    } else {
                        x.sub_lost as f64 / total as f64
                    }
                }),
                delay_p50_us: mean_of(&|x| x.sfu_delay_p50_us),
                delay_p99_us: mean_of(&|x| x.sfu_delay_p99_us),
                rtt_p50_us: mean_of(&|x| x.rtt_p50_us),
                rtt_p99_us: mean_of(&|x| x.rtt_p99_us),
                mean_batch: mean_of(&|x| x.sfu_mean_batch),
            })
        })
        .collect()
}

/// Run every repetition, alternating off and on so drift hits both alike.
pub fn run_all(
    c: &SrpicLabConfig,
    mut progress: impl FnMut(&RunResult),
) -> anyhow::Result<Vec<RunResult>> {
    let mut results = Vec::new();
    for rep in 0..c.reps.max(1) {
        for on in [false, true] {
            let result = run_once(c, on, rep)?;
            progress(&result);
            results.push(result);
        }
    }
    Ok(results)
}
