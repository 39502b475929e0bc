//! SFU experiment analysis (pktswitch Figs. 3-5): per-run measurements of
//! the SFU (engine CPU user/kernel %, CPU per emulated host, the four
//! per-packet delays (a) scheduled, (b) handoff, (c) wait, (d) kdelay) are
//! grouped by (backend, clients, packet rate), summarised with 95%
//! confidence intervals, compared with the `socket` baseline of the same
//! cell, and fitted to the paper's delay models on delay (a):
//! d_s(n) = k_rcv + n · k_snd (socket) and d_n(n) = u_rx + n · u_tx (the
//! others), n = copies per packet. Runs flagged as unreliable (the AF_XDP
//! TX ring congested, the load generator fell behind, other load on the
//! machine) are reported and left out, as the paper left out runs with
//! congested TX rings.

pub mod experiment;
pub mod testbed;

use crate::render::{self, svg, Digits, Table};
use crate::siplab::design::{self, Effect, Verdict, AA_SUFFIX};
use crate::stats::{fit_line, mean_ci, LineFit, MeanCi};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt::Write;

/// One measured run.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Run {
    /// Backend name (`socket`, `mmsg`, `uring`, `xdp`).
    pub backend: String,
    /// The backend's modes (e.g. xdp native/generic).
    pub io_mode: String,
    /// Flush policy of the SFU.
    pub flush: String,
    /// Number of clients.
    pub clients: usize,
    /// Packets per second sent by each client.
    pub pps: u32,
    /// Repetition index.
    pub rep: usize,
    /// Block of the run (one (repetition, clients, pps), every arm once).
    #[serde(default)]
    pub block: usize,
    /// Position of the run in its block (the randomised order, recorded).
    #[serde(default)]
    pub order: usize,
    /// 1-minute load average when the run started (NaN: unknown).
    #[serde(deserialize_with = "crate::stats::nan_or_f64")]
    pub loadavg1: f64,
    /// Time the hypervisor took from the machine's CPUs over the measured
    /// window (steal, % of one core; NaN: unknown).
    #[serde(deserialize_with = "crate::stats::nan_or_f64")]
    pub steal_pct: f64,
    /// Measured seconds (after the warm-up).
    #[serde(deserialize_with = "crate::stats::nan_or_f64")]
    pub seconds: f64,
    /// SFU engine thread user CPU (% of one core; spinning included).
    #[serde(deserialize_with = "crate::stats::nan_or_f64")]
    pub cpu_user_pct: f64,
    /// SFU engine thread kernel CPU (% of one core).
    #[serde(deserialize_with = "crate::stats::nan_or_f64")]
    pub cpu_system_pct: f64,
    /// Of the engine's CPU, spinning for datagrams (% of one core).
    #[serde(deserialize_with = "crate::stats::nan_or_f64")]
    pub spin_pct: f64,
    /// Engine CPU per forwarded packet (µs).
    #[serde(deserialize_with = "crate::stats::nan_or_f64")]
    pub cpu_per_packet_us: f64,
    /// The SFU host: engine thread plus the NAPI thread of its interface
    /// (% of one core; NaN on loopback).
    #[serde(deserialize_with = "crate::stats::nan_or_f64")]
    pub sfu_host_pct: f64,
    /// That per packet offered (µs): the SFU host's CPU over clients × pps
    /// (the measure that also covers the in-kernel fan-out, whose work runs
    /// in the NAPI thread).
    #[serde(deserialize_with = "crate::stats::nan_or_f64")]
    pub sfu_host_per_packet_us: f64,
    /// The switch: NAPI threads of the bridge ports (bridging and the
    /// clients' receive path; NaN without threaded NAPI).
    #[serde(deserialize_with = "crate::stats::nan_or_f64")]
    pub switch_pct: f64,
    /// The clients' load threads.
    #[serde(deserialize_with = "crate::stats::nan_or_f64")]
    pub clients_pct: f64,
    /// Busy CPU of the machine not accounted to any of the above (other
    /// jobs; % of one core; NaN when unknown): the CPUs' time less their
    /// exact idle time, less the hosts' CPU. Signed: below 0 when the hosts
    /// were charged more than the machine was busy (until 2026-11-26 the
    /// busy time was the tick-sampled `/proc/stat` fields and the value was
    /// clamped at 0).
    #[serde(deserialize_with = "crate::stats::nan_or_f64")]
    pub foreign_pct: f64,
    /// (a) pickup → last copy scheduled, median (µs; NaN without samples).
    #[serde(deserialize_with = "crate::stats::nan_or_f64")]
    pub delay_p50_us: f64,
    /// (a) 99th percentile.
    #[serde(deserialize_with = "crate::stats::nan_or_f64")]
    pub delay_p99_us: f64,
    /// (a) mean.
    #[serde(deserialize_with = "crate::stats::nan_or_f64")]
    pub delay_mean_us: f64,
    /// (b) pickup → last copy taken by the kernel, median.
    #[serde(deserialize_with = "crate::stats::nan_or_f64")]
    pub handoff_p50_us: f64,
    /// (b) 99th percentile.
    #[serde(deserialize_with = "crate::stats::nan_or_f64")]
    pub handoff_p99_us: f64,
    /// (c) application receive → pickup, median.
    #[serde(deserialize_with = "crate::stats::nan_or_f64")]
    pub wait_p50_us: f64,
    /// (c) 99th percentile.
    #[serde(deserialize_with = "crate::stats::nan_or_f64")]
    pub wait_p99_us: f64,
    /// (d) kernel RX stamp → last copy taken by the kernel, median.
    #[serde(deserialize_with = "crate::stats::nan_or_f64")]
    pub kdelay_p50_us: f64,
    /// (d) 99th percentile.
    #[serde(deserialize_with = "crate::stats::nan_or_f64")]
    pub kdelay_p99_us: f64,
    /// Mean copies per forwarded packet (subscribers + echo).
    #[serde(deserialize_with = "crate::stats::nan_or_f64")]
    pub copies_per_packet: f64,
    /// Media packets forwarded in the measured part.
    pub media: u64,
    /// Packets the clients counted as lost (whole run).
    pub client_lost: u64,
    /// Those in % of the media packets the clients should have received.
    #[serde(deserialize_with = "crate::stats::nan_or_f64")]
    pub client_loss_pct: f64,
    /// Median RTT the clients measured through the echo (µs).
    #[serde(deserialize_with = "crate::stats::nan_or_f64")]
    pub client_rtt_p50_us: f64,
    /// How the clients received (`socket`, `mmsg`, `xdp`).
    #[serde(default)]
    pub client_rx: String,
    /// Datagrams the clients' AF_XDP receive path got through its companion
    /// sockets instead of its rings (`None`, null: socket receive).
    #[serde(default)]
    pub client_rx_via_kernel: Option<u64>,
    /// Frames the clients' AF_XDP receive path dropped as invalid or with a
    /// bad UDP checksum (`None`, null: socket receive).
    #[serde(default)]
    pub client_rx_rejected: Option<u64>,
    /// Frames the kernel dropped at the clients' AF_XDP sockets (no fill
    /// frame, RX ring full; `None`, null: socket receive).
    #[serde(default)]
    pub client_rx_ring_drops: Option<u64>,
    /// How the clients sent their media (`mmsg`, `xdp`, …; empty in state
    /// files from before it was recorded).
    #[serde(default)]
    pub client_tx: String,
    /// Media datagrams the clients' AF_XDP send path put through its
    /// companion sockets instead of its TX rings (`None`, null: socket
    /// sends).
    #[serde(default)]
    pub client_tx_via_kernel: Option<u64>,
    /// Media datagrams the clients' AF_XDP send path dropped (TX ring full
    /// after the bounded wait, send errors; `None`, null: socket sends).
    #[serde(default)]
    pub client_tx_drops: Option<u64>,
    /// The load's sender thread's scheduling policy as the kernel reported
    /// it at the end of the run (`fifo:10`, `other`; `None`: not read, or
    /// a run recorded before it was).
    #[serde(default)]
    pub load_sender_policy: Option<String>,
    /// The AF_XDP TX ring was congested (the send path waited for room).
    pub tx_congested: bool,
    /// Datagrams the SFU's receive path dropped over the whole run (its
    /// socket's buffer full: `SO_RXQ_OVFL`; AF_XDP: no fill frame or RX
    /// ring full); `None`: state files from before it was recorded.
    #[serde(default)]
    pub sfu_rx_drops: Option<u64>,
    /// Sender ticks more than 1 ms late, in % of all ticks.
    #[serde(deserialize_with = "crate::stats::nan_or_f64")]
    pub load_late_pct: f64,
    /// Why the run is left out of the summary (`None`: it is not).
    pub excluded: Option<String>,
    /// Why only the run's delays are left out, its CPU kept (the paper
    /// left runs with a congested TX path out of the delay results only).
    pub delay_excluded: Option<String>,
}

impl Run {
    /// This run as the summaries use it: with its delays blanked (n/a)
    /// when they are left out.
    fn for_summary(&self) -> Run {
        let mut copy = self.clone();
        if copy.delay_excluded.is_some() {
            for v in [
                &mut copy.delay_p50_us,
                &mut copy.delay_p99_us,
                &mut copy.delay_mean_us,
                &mut copy.handoff_p50_us,
                &mut copy.handoff_p99_us,
                &mut copy.wait_p50_us,
                &mut copy.wait_p99_us,
                &mut copy.kdelay_p50_us,
                &mut copy.kdelay_p99_us,
            ] {
                *v = f64::NAN;
            }
        }
        copy
    }
}

/// Summary of one (backend, clients, pps) cell.
#[derive(Clone, Debug, Serialize)]
pub struct Row {
    /// Backend.
    pub backend: String,
    /// Clients.
    pub clients: usize,
    /// Packets per second per client.
    pub pps: u32,
    /// Runs summarised.
    pub runs: usize,
    /// Engine user CPU %.
    pub cpu_user: MeanCi,
    /// Engine kernel CPU %.
    pub cpu_system: MeanCi,
    /// Engine CPU per packet (µs).
    pub cpu_per_packet: MeanCi,
    /// SFU host CPU % (engine + its NAPI thread).
    pub sfu_host: MeanCi,
    /// SFU host CPU per packet offered (µs).
    pub sfu_host_per_packet: MeanCi,
    /// The load clients' CPU % (their send and receive threads), beside
    /// the SFU's: the testbed measures the SFU only while they cost less.
    pub clients_cpu: MeanCi,
    /// The switch's CPU % (bridging and the clients' receive path).
    pub switch_cpu: MeanCi,
    /// (a) p50 (µs).
    pub delay_p50: MeanCi,
    /// (a) p99 (µs).
    pub delay_p99: MeanCi,
    /// (a) mean (µs).
    pub delay_mean: MeanCi,
    /// (b) p50 (µs).
    pub handoff_p50: MeanCi,
    /// (c) p50 (µs).
    pub wait_p50: MeanCi,
    /// (d) p50 (µs).
    pub kdelay_p50: MeanCi,
    /// Copies per packet.
    pub copies: f64,
    /// Client loss (%).
    pub loss_pct: MeanCi,
    /// Engine CPU per packet relative to the socket baseline of the same
    /// cell.
    pub cpu_ratio: Option<f64>,
    /// (a) p50 relative to socket.
    pub delay_p50_ratio: Option<f64>,
    /// (b) p50 relative to socket.
    pub handoff_p50_ratio: Option<f64>,
    /// (c) p50 relative to socket.
    pub wait_p50_ratio: Option<f64>,
    /// (d) p50 relative to socket.
    pub kdelay_p50_ratio: Option<f64>,
    /// SFU host CPU per packet relative to socket.
    pub sfu_host_ratio: Option<f64>,
    /// Mean delay (a) relative to socket (the in-kernel fan-out has means
    /// only).
    pub delay_mean_ratio: Option<f64>,
    /// The ratios to socket paired per repetition (each repetition's run
    /// over socket's of the same block), mean ± 95 % CI, one per
    /// [`RATIO_METRICS`] entry in its order (n = 0: no pair, n/a).
    pub ratio_ci: Vec<MeanCi>,
}

/// A metric compared with the socket baseline: its name and its value in
/// a run.
pub type RatioMetric = (&'static str, fn(&Run) -> f64);

/// The metrics every backend's ratio to socket is given for, with CIs.
pub const RATIO_METRICS: [RatioMetric; 7] = [
    ("cpu/pkt", |r| r.cpu_per_packet_us),
    ("sfu host/pkt", |r| r.sfu_host_per_packet_us),
    ("delay (a) p50", |r| r.delay_p50_us),
    ("delay (b) p50", |r| r.handoff_p50_us),
    ("delay (c) p50", |r| r.wait_p50_us),
    ("delay (d) p50", |r| r.kdelay_p50_us),
    ("delay (a) mean", |r| r.delay_mean_us),
];

/// Effect size the report says the repetitions needed for (a ratio of
/// 0.90 or 1.10 to socket).
pub const TARGET_EFFECT_PCT: f64 = 10.0;

/// One backend's ratio to socket on one metric over the whole grid, paired
/// per (clients, pps, repetition), judged against the A/A arm's.
#[derive(Clone, Debug, Serialize)]
pub struct RatioEffect {
    /// Backend (`socket#aa`: the A/A row, the noise floor itself).
    pub backend: String,
    /// [`RATIO_METRICS`] name.
    pub metric: String,
    /// The paired effect: `lower_pct` = 100 · (1 − mean ratio), with its
    /// CI, MDE and pairs (`None`: fewer than two pairs).
    pub effect: Option<Effect>,
    /// The A/A floor for this metric (%): |1 − ratio| of socket#aa plus
    /// its CI half-width (`None`: no A/A arm or < 2 pairs).
    pub floor_pct: Option<f64>,
    /// The judgement (`None` on the A/A row).
    pub verdict: Option<Verdict>,
    /// Repetitions per cell a ±[`TARGET_EFFECT_PCT`] % ratio would need
    /// with this spread (80 % power, α = 0.05).
    pub reps_for_target: Option<usize>,
}

impl RatioEffect {
    /// The mean ratio to socket and its CI half-width.
    pub fn ratio(&self) -> Option<(f64, f64)> {
        self.effect
            .map(|e| (1.0 - e.lower_pct / 100.0, e.ci_pct / 100.0))
    }
}

/// Fitted delay model of one backend, on the median of delay (a).
#[derive(Clone, Debug, Serialize)]
pub struct DelayModel {
    /// Backend.
    pub backend: String,
    /// The paper's names of the terms: (k_rcv, k_snd) for socket, (u_rx,
    /// u_tx) for the others.
    pub terms: (String, String),
    /// Intercept (µs).
    pub intercept_us: f64,
    /// Slope (µs per copy).
    pub per_copy_us: f64,
    /// R² of the fit.
    pub r2: f64,
    /// Points used.
    pub points: usize,
}

/// One backend over the whole experiment: mean over cells of its ratios to
/// socket (each cell against socket in the same cell), and its absolute
/// values averaged over cells.
#[derive(Clone, Debug, Serialize)]
pub struct BackendSummary {
    /// Backend.
    pub backend: String,
    /// Engine CPU per packet (all SFU threads, spinning included) to socket.
    pub cpu_ratio: Option<f64>,
    /// Delay (a) p50 to socket.
    pub delay_p50_ratio: Option<f64>,
    /// Delay (b) p50 to socket.
    pub handoff_p50_ratio: Option<f64>,
    /// Delay (c) p50 to socket.
    pub wait_p50_ratio: Option<f64>,
    /// Delay (d) p50 to socket.
    pub kdelay_p50_ratio: Option<f64>,
    /// SFU host CPU per packet (engine + its NAPI thread) to socket.
    pub sfu_host_ratio: Option<f64>,
    /// Mean delay (a) to socket.
    pub delay_mean_ratio: Option<f64>,
    /// Engine CPU (% of one core).
    pub cpu_pct: f64,
    /// Engine CPU per packet (µs).
    pub cpu_per_packet_us: f64,
    /// SFU host CPU (% of one core).
    pub sfu_host_pct: f64,
    /// (a) p50 (µs).
    pub delay_p50_us: f64,
    /// (b) p50 (µs).
    pub handoff_p50_us: f64,
    /// (c) p50 (µs).
    pub wait_p50_us: f64,
    /// (d) p50 (µs).
    pub kdelay_p50_us: f64,
    /// Runs summarised.
    pub runs: usize,
    /// Runs left out.
    pub excluded: usize,
}

/// Whole-experiment summary.
#[derive(Clone, Debug, Serialize)]
pub struct Summary {
    /// Per-cell rows.
    pub rows: Vec<Row>,
    /// Delay models per backend (every run's median delay (a) against its
    /// copies per packet).
    pub models: Vec<DelayModel>,
    /// One entry per backend.
    pub backends: Vec<BackendSummary>,
    /// Runs left out and why.
    pub excluded: Vec<LeftOut>,
    /// Runs whose delays alone are left out (CPU kept) and why.
    pub delay_excluded: Vec<LeftOut>,
    /// Every backend's ratios to socket with CIs, the A/A floor, the MDE
    /// and a verdict (the A/A rows first).
    pub effects: Vec<RatioEffect>,
}

fn col(runs: &[&Run], f: impl Fn(&Run) -> f64) -> Vec<f64> {
    runs.iter()
        .map(|r| f(r))
        .filter(|v| v.is_finite())
        .collect()
}

fn ratio(a: f64, b: f64) -> Option<f64> {
    (a.is_finite() && b.is_finite() && b > 0.0).then(|| a / b)
}

/// A run left out of the summary: its backend, clients, pps, repetition
/// and why.
pub type LeftOut = (String, usize, u32, usize, String);

/// The valid runs by cell: (clients, pps, backend).
type Cells<'a> = BTreeMap<(usize, u32, String), Vec<&'a Run>>;

/// Group, summarise, compare with `socket`, fit models.
pub fn summarize(runs: &[Run]) -> Summary {
    let runs: Vec<Run> = runs.iter().map(Run::for_summary).collect();
    let runs = &runs[..];
    let delay_excluded: Vec<LeftOut> = runs
        .iter()
        .filter(|r| r.excluded.is_none())
        .filter_map(|r| {
            let why = r.delay_excluded.clone()?;
            Some((r.backend.clone(), r.clients, r.pps, r.rep, why))
        })
        .collect();
    let (cells, excluded) = cells(runs);
    let mut rows: Vec<Row> = cells.iter().map(|(key, rs)| row(&cells, key, rs)).collect();
    ratios_to_socket(&mut rows);
    let mut names: Vec<String> = runs.iter().map(|r| r.backend.clone()).collect();
    names.sort();
    names.dedup();
    let models = names.iter().filter_map(|b| delay_model(runs, b)).collect();
    let backends = names
        .iter()
        .map(|b| backend_summary(b, &rows, &excluded))
        .collect();
    let effects = ratio_effects(runs, &names);
    Summary {
        rows,
        models,
        backends,
        excluded,
        delay_excluded,
        effects,
    }
}

/// The valid runs by cell, and the runs left out.
fn cells(runs: &[Run]) -> (Cells<'_>, Vec<LeftOut>) {
    let mut cells: Cells<'_> = BTreeMap::new();
    let mut excluded = Vec::new();
    for r in runs {
        if let Some(why) = &r.excluded {
            excluded.push((r.backend.clone(), r.clients, r.pps, r.rep, why.clone()));
            continue;
        }
        cells
            .entry((r.clients, r.pps, r.backend.clone()))
            .or_default()
            .push(r);
    }
    (cells, excluded)
}

/// One cell's row: every metric's mean with its CI, and the paired ratios
/// to socket's runs of the same cell (the ratios of the means are set by
/// [`ratios_to_socket`]).
fn row(cells: &Cells<'_>, (clients, pps, backend): &(usize, u32, String), rs: &[&Run]) -> Row {
    Row {
        backend: backend.clone(),
        clients: *clients,
        pps: *pps,
        runs: rs.len(),
        cpu_user: mean_ci(&col(rs, |r| r.cpu_user_pct)),
        cpu_system: mean_ci(&col(rs, |r| r.cpu_system_pct)),
        cpu_per_packet: mean_ci(&col(rs, |r| r.cpu_per_packet_us)),
        sfu_host: mean_ci(&col(rs, |r| r.sfu_host_pct)),
        sfu_host_per_packet: mean_ci(&col(rs, |r| r.sfu_host_per_packet_us)),
        clients_cpu: mean_ci(&col(rs, |r| r.clients_pct)),
        switch_cpu: mean_ci(&col(rs, |r| r.switch_pct)),
        delay_p50: mean_ci(&col(rs, |r| r.delay_p50_us)),
        delay_p99: mean_ci(&col(rs, |r| r.delay_p99_us)),
        handoff_p50: mean_ci(&col(rs, |r| r.handoff_p50_us)),
        wait_p50: mean_ci(&col(rs, |r| r.wait_p50_us)),
        kdelay_p50: mean_ci(&col(rs, |r| r.kdelay_p50_us)),
        copies: mean_ci(&col(rs, |r| r.copies_per_packet)).mean,
        loss_pct: mean_ci(&col(rs, |r| r.client_loss_pct)),
        cpu_ratio: None,
        delay_p50_ratio: None,
        handoff_p50_ratio: None,
        wait_p50_ratio: None,
        kdelay_p50_ratio: None,
        sfu_host_ratio: None,
        delay_mean_ratio: None,
        delay_mean: mean_ci(&col(rs, |r| r.delay_mean_us)),
        ratio_ci: RATIO_METRICS
            .iter()
            .map(|(_, f)| {
                let socket = cells.get(&(*clients, *pps, "socket".to_string()));
                let ratios: Vec<f64> = rs
                    .iter()
                    .filter_map(|r| {
                        let base = socket?.iter().find(|s| s.rep == r.rep)?;
                        ratio(f(r), f(base)).filter(|v| v.is_finite())
                    })
                    .collect();
                mean_ci(&ratios)
            })
            .collect(),
    }
}

/// Each row's means over socket's row of the same cell.
fn ratios_to_socket(rows: &mut [Row]) {
    let base: BTreeMap<(usize, u32), Row> = rows
        .iter()
        .filter(|r| r.backend == "socket")
        .map(|r| ((r.clients, r.pps), r.clone()))
        .collect();
    for r in rows.iter_mut() {
        if let Some(baseline) = base.get(&(r.clients, r.pps)) {
            r.cpu_ratio = ratio(r.cpu_per_packet.mean, baseline.cpu_per_packet.mean);
            r.delay_p50_ratio = ratio(r.delay_p50.mean, baseline.delay_p50.mean);
            r.handoff_p50_ratio = ratio(r.handoff_p50.mean, baseline.handoff_p50.mean);
            r.wait_p50_ratio = ratio(r.wait_p50.mean, baseline.wait_p50.mean);
            r.kdelay_p50_ratio = ratio(r.kdelay_p50.mean, baseline.kdelay_p50.mean);
            r.sfu_host_ratio = ratio(
                r.sfu_host_per_packet.mean,
                baseline.sfu_host_per_packet.mean,
            );
            r.delay_mean_ratio = ratio(r.delay_mean.mean, baseline.delay_mean.mean);
        }
    }
}

/// The paper's delay model of `backend`: its valid runs' median delay (a)
/// against their copies per packet, fitted with a line (none without
/// enough points).
fn delay_model(runs: &[Run], backend: &str) -> Option<DelayModel> {
    let pts: Vec<(f64, f64)> = runs
        .iter()
        .filter(|r| r.backend == backend && r.excluded.is_none())
        .filter(|r| r.copies_per_packet.is_finite() && r.delay_p50_us.is_finite())
        .map(|r| (r.copies_per_packet, r.delay_p50_us))
        .collect();
    let LineFit {
        intercept,
        slope,
        r2: r_squared,
    } = fit_line(&pts)?;
    let terms = if backend.starts_with("socket") {
        ("k_rcv", "k_snd")
    } else {
        ("u_rx", "u_tx")
    };
    Some(DelayModel {
        backend: backend.to_string(),
        terms: (terms.0.into(), terms.1.into()),
        intercept_us: intercept,
        per_copy_us: slope,
        r2: r_squared,
        points: pts.len(),
    })
}

/// One backend over its rows: the mean of each ratio and metric over the
/// cells that have it, its runs and those left out.
fn backend_summary(backend: &str, rows: &[Row], excluded: &[LeftOut]) -> BackendSummary {
    let mine: Vec<&Row> = rows.iter().filter(|r| r.backend == backend).collect();
    let avg_opt = |f: &dyn Fn(&Row) -> Option<f64>| {
        let values: Vec<f64> = mine.iter().filter_map(|r| f(r)).collect();
        (!values.is_empty()).then(|| values.iter().sum::<f64>() / values.len() as f64)
    };
    let avg = |f: &dyn Fn(&Row) -> f64| {
        avg_opt(&|r| Some(f(r)).filter(|values| values.is_finite())).unwrap_or(f64::NAN)
    };
    BackendSummary {
        backend: backend.to_string(),
        cpu_ratio: avg_opt(&|r| r.cpu_ratio),
        delay_p50_ratio: avg_opt(&|r| r.delay_p50_ratio),
        handoff_p50_ratio: avg_opt(&|r| r.handoff_p50_ratio),
        wait_p50_ratio: avg_opt(&|r| r.wait_p50_ratio),
        kdelay_p50_ratio: avg_opt(&|r| r.kdelay_p50_ratio),
        sfu_host_ratio: avg_opt(&|r| r.sfu_host_ratio),
        delay_mean_ratio: avg_opt(&|r| r.delay_mean_ratio),
        cpu_pct: avg(&|r| r.cpu_user.mean + r.cpu_system.mean),
        cpu_per_packet_us: avg(&|r| r.cpu_per_packet.mean),
        sfu_host_pct: avg(&|r| r.sfu_host.mean),
        delay_p50_us: avg(&|r| r.delay_p50.mean),
        handoff_p50_us: avg(&|r| r.handoff_p50.mean),
        wait_p50_us: avg(&|r| r.wait_p50.mean),
        kdelay_p50_us: avg(&|r| r.kdelay_p50.mean),
        runs: mine.iter().map(|r| r.runs).sum(),
        excluded: excluded.iter().filter(|e| e.0 == backend).count(),
    }
}

/// Every backend's ratio to socket per [`RATIO_METRICS`] entry, over the
/// valid runs paired by (clients, pps, repetition): the A/A arm's rows
/// first (their effect is the floor), then the others judged against it.
fn ratio_effects(runs: &[Run], names: &[String]) -> Vec<RatioEffect> {
    let valid: Vec<&Run> = runs.iter().filter(|r| r.excluded.is_none()).collect();
    let mut keys: Vec<(usize, u32, usize)> = valid
        .iter()
        .filter(|r| r.backend == "socket")
        .map(|r| (r.clients, r.pps, r.rep))
        .collect();
    keys.sort();
    keys.dedup();
    let cells = {
        let mut cells: Vec<(usize, u32)> = keys.iter().map(|k| (k.0, k.1)).collect();
        cells.dedup();
        cells.len().max(1)
    };
    let values = |backend: &str, f: fn(&Run) -> f64| -> Vec<Option<f64>> {
        keys.iter()
            .map(|&(clients, pps, rep)| {
                valid
                    .iter()
                    .find(|r| {
                        r.backend == backend && r.clients == clients && r.pps == pps && r.rep == rep
                    })
                    .map(|r| f(r))
                    .filter(|v| v.is_finite())
            })
            .collect()
    };
    let aa_name = format!("socket{AA_SUFFIX}");
    let ordered: Vec<&String> = names
        .iter()
        .filter(|n| **n == aa_name)
        .chain(names.iter().filter(|n| **n != aa_name && *n != "socket"))
        .collect();
    let mut out = Vec::new();
    for (metric, f) in RATIO_METRICS {
        let reference = values("socket", f);
        let floor =
            design::ratio_effect(&reference, &values(&aa_name, f)).map(|e| design::noise_floor(&e));
        for name in &ordered {
            let effect = design::ratio_effect(&reference, &values(name, f));
            let is_aa = **name == aa_name;
            out.push(RatioEffect {
                backend: (*name).clone(),
                metric: metric.into(),
                effect,
                floor_pct: floor,
                verdict: (!is_aa)
                    .then(|| effect.map(|e| design::verdict(&e, floor)))
                    .flatten(),
                reps_for_target: effect
                    .and_then(|e| design::pairs_needed(e.sd_pct, TARGET_EFFECT_PCT))
                    .map(|pairs| pairs.div_ceil(cells)),
            });
        }
    }
    out
}

/// The ratios to socket with their CIs, the A/A floor, the MDE and the
/// verdict, one row per backend and metric.
pub fn effects_table(s: &Summary) -> Table {
    let mut table = Table::new(
        "Ratios to socket, paired per (clients, pps, repetition): mean of the per-pair ratios, 95 % CI; A/A = socket run twice",
        &[
            "backend",
            "metric",
            "ratio (95% CI)",
            "pairs",
            "A/A floor %",
            "MDE %",
            "verdict",
            "reps for ±10 %",
        ],
    );
    for e in &s.effects {
        let is_aa = e.backend.ends_with(AA_SUFFIX);
        table.rows.push(vec![
            e.backend.clone(),
            e.metric.clone(),
            e.ratio()
                .map_or("n/a".into(), |(r, ci)| format!("{r:.3} ± {ci:.3}")),
            e.effect.map_or("<2".into(), |e| e.pairs.to_string()),
            render::opt(e.floor_pct, 1),
            render::opt(e.effect.map(|e| e.mde_pct), 1),
            match (&e.verdict, is_aa) {
                (_, true) => "A/A: the noise floor".into(),
                (Some(Verdict::Lower), false) => "lower than socket".into(),
                (Some(Verdict::Higher), false) => "higher than socket".into(),
                // The effect is 1 − ratio: its CI including 0 is the
                // ratio's including 1.
                (Some(v), false) => v.to_string().replace("includes 0", "includes a ratio of 1"),
                (None, false) => "n/a".into(),
            },
            e.reps_for_target.map_or("n/a".into(), |n| n.to_string()),
        ]);
    }
    table
}

fn ci(m: &MeanCi) -> String {
    render::mean_ci(m, Digits::Fixed(1))
}

/// The row's paired ratio to socket on [`RATIO_METRICS`]`[metric]`:
/// "mean ± CI", "n/a" without pairs ("-" for socket itself).
fn ratio_ci(r: &Row, metric: usize) -> String {
    if r.backend == "socket" {
        return "-".into();
    }
    r.ratio_ci
        .get(metric)
        .map_or("n/a".into(), |m| render::mean_ci(m, Digits::Fixed(2)))
}

fn x(r: Option<f64>) -> String {
    r.filter(|v| v.is_finite())
        .map_or_else(|| "n/a".into(), |v| format!("{v:.2}x"))
}

fn us(v: f64) -> String {
    render::opt(Some(v), 1)
}

/// The per-cell table: CPU, delays (a)-(d) with their CIs and the ratios
/// to the socket backend.
fn cells_table(s: &Summary) -> Table {
    let mut table = Table::new(
        "",
        &[
            "clients",
            "pps",
            "backend",
            "copies",
            "cpu_user%",
            "cpu_kern%",
            "cpu/pkt",
            "a_sched_us",
            "b_handoff",
            "c_wait_us",
            "d_kdelay",
            "sfuhost%",
            "clients%",
            "switch%",
            "cpu/s",
            "a/s",
            "b/s",
            "c/s",
            "d/s",
        ],
    );
    for r in &s.rows {
        table.rows.push(vec![
            r.clients.to_string(),
            r.pps.to_string(),
            r.backend.clone(),
            format!("{:.1}", r.copies),
            ci(&r.cpu_user),
            ci(&r.cpu_system),
            ci(&r.cpu_per_packet),
            ci(&r.delay_p50),
            ci(&r.handoff_p50),
            ci(&r.wait_p50),
            ci(&r.kdelay_p50),
            ci(&r.sfu_host),
            ci(&r.clients_cpu),
            ci(&r.switch_cpu),
            ratio_ci(r, 0),
            ratio_ci(r, 2),
            ratio_ci(r, 3),
            ratio_ci(r, 4),
            ratio_ci(r, 5),
        ]);
    }
    table
}

/// Render the summary as text: the per-cell table, Figs. 3-5 shaped
/// tables, the ratios per backend and the delay models.
pub fn render(s: &Summary) -> String {
    let mut out = cells_table(s).text();
    let _ = writeln!(
        out,
        "(±: 95% CI over repetitions; delays are per-packet medians in µs: (a) pickup -> last copy \
         scheduled (the paper's delay), (b) pickup -> last copy taken by the kernel, (c) app receive \
         -> pickup, (d) kernel RX stamp -> last copy taken; cpu: SFU engine thread, % of one core; \
         x/s: ratio to the socket backend in the same cell (cpu: per packet), each repetition over \
         socket's of the same block, mean ± 95% CI; n/a: no data)"
    );
    out.push_str(&effects_table(s).text());
    for table in figure_tables(s) {
        out.push_str(&table.text());
    }
    for b in s.backends.iter().filter(|b| b.backend != "socket") {
        let _ = writeln!(
            out,
            "overall {} vs socket: cpu {}, delay(a) {}, handoff(b) {}, wait(c) {}, kdelay(d) {}; sfu host cpu {}, mean delay(a) {}",
            b.backend,
            x(b.cpu_ratio),
            x(b.delay_p50_ratio),
            x(b.handoff_p50_ratio),
            x(b.wait_p50_ratio),
            x(b.kdelay_p50_ratio),
            x(b.sfu_host_ratio),
            x(b.delay_mean_ratio)
        );
    }
    for m in &s.models {
        let _ = writeln!(
            out,
            "delay model {}: d(n) = {} + n * {} = {:.2} us + n * {:.2} us  (median delay (a), R2 {:.3}, {} runs; n = copies/packet; paper: {})",
            m.backend,
            m.terms.0,
            m.terms.1,
            m.intercept_us,
            m.per_copy_us,
            m.r2,
            m.points,
            if m.backend == "socket" {
                "0.7 + n * 2.3 us"
            } else {
                "netmap 0.3 + n * 0.2 us"
            }
        );
    }
    write_left_out(&mut out, s, ("left out: ", "delay left out (CPU kept): "));
    out
}

/// The summary as Markdown for docs/pktswitch.md: the ratios with CIs
/// and the A/A floor, the per-cell table, Figs. 3-5 shaped tables, the
/// delay models and the runs left out.
pub fn markdown(s: &Summary) -> String {
    let mut out = effects_table(s).markdown();
    out.push('\n');
    let mut cells = cells_table(s);
    cells.title = "Per cell (mean ± 95 % CI over repetitions; x/s: paired ratio to socket)".into();
    out.push_str(&cells.markdown());
    for table in figure_tables(s) {
        out.push('\n');
        out.push_str(&table.markdown());
    }
    out.push('\n');
    for m in &s.models {
        let _ = writeln!(
            out,
            "- delay model {}: d(n) = {:.2} µs + n · {:.2} µs (R² {:.3}, {} runs)",
            m.backend, m.intercept_us, m.per_copy_us, m.r2, m.points
        );
    }
    let _ = writeln!(out, "- runs left out: {}", s.excluded.len());
    write_left_out(&mut out, s, ("  - ", "- delay left out (CPU kept): "));
    out
}

/// The runs left out, a line each after the first prefix, then the runs
/// whose delays alone were left out after the second.
fn write_left_out(out: &mut String, s: &Summary, (runs, delays): (&str, &str)) {
    for (prefix, left_out) in [(runs, &s.excluded), (delays, &s.delay_excluded)] {
        for (backend, clients, pps, rep, why) in left_out {
            let _ = writeln!(
                out,
                "{prefix}{backend} clients={clients} pps={pps} rep={rep}: {why}"
            );
        }
    }
}

/// Figs. 3 and 4 (CPU user/kernel per client count, one table per rate)
/// and Fig. 5 (delay (a) per client count, one table per rate).
fn figure_tables(s: &Summary) -> Vec<Table> {
    let sorted = |mut v: Vec<String>| {
        v.sort();
        v.dedup();
        v
    };
    let backends = sorted(s.rows.iter().map(|r| r.backend.clone()).collect());
    let mut rates: Vec<u32> = s.rows.iter().map(|r| r.pps).collect();
    rates.sort();
    rates.dedup();
    let mut clients: Vec<usize> = s.rows.iter().map(|r| r.clients).collect();
    clients.sort();
    clients.dedup();
    let header: Vec<&str> = std::iter::once("clients")
        .chain(backends.iter().map(String::as_str))
        .collect();
    let mut tables = Vec::new();
    for &pps in &rates {
        let figure = |title: String, cell: &dyn Fn(&Row) -> String| {
            let mut table = Table::new(title, &header);
            for &n in &clients {
                let mut row = vec![n.to_string()];
                for b in &backends {
                    let found = s
                        .rows
                        .iter()
                        .find(|r| &r.backend == b && r.clients == n && r.pps == pps);
                    row.push(found.map_or_else(|| "-".into(), cell));
                }
                table.rows.push(row);
            }
            table
        };
        tables.push(figure(
            format!("Fig. 3/4 shape, {pps} pps per client: SFU engine CPU % user/kernel"),
            &|r| format!("{}/{}", us(r.cpu_user.mean), us(r.cpu_system.mean)),
        ));
        tables.push(figure(
            format!("Fig. 5 shape, {pps} pps per client: delay (a) p50 us"),
            &|r| us(r.delay_p50.mean),
        ));
    }
    tables
}

/// The JSON `lab sfu --json` writes: one object per backend (ratios and
/// absolute values), then the rows, models, runs and (with `--capacity`)
/// the capacity curve.
pub fn json(
    runs: &[Run],
    s: &Summary,
    capacity: Option<&experiment::Capacity>,
) -> serde_json::Value {
    serde_json::json!({
        "backends": s.backends,
        "rows": s.rows,
        "effects": s.effects,
        "ratio_metrics": RATIO_METRICS.iter().map(|m| m.0).collect::<Vec<_>>(),
        "models": s.models,
        "excluded": s.excluded,
        "delay_excluded": s.delay_excluded,
        "runs": runs,
        "capacity": capacity,
    })
}

/// An SVG plot of median delay (a) versus copies per packet: each
/// backend's runs as markers and its fitted model as a dashed line.
pub fn svg(runs: &[Run], s: &Summary) -> String {
    let kept =
        |r: &&Run| r.excluded.is_none() && r.delay_excluded.is_none() && r.delay_p50_us.is_finite();
    let xmax = runs
        .iter()
        .filter(kept)
        .map(|r| r.copies_per_packet)
        .fold(1.0f64, f64::max);
    let mut series = Vec::new();
    for (index, model) in s.models.iter().enumerate() {
        let mut points: Vec<(f64, f64, f64)> = runs
            .iter()
            .filter(kept)
            .filter(|r| r.backend == model.backend)
            .map(|r| (r.copies_per_packet, r.delay_p50_us, 0.0))
            .collect();
        points.sort_by(|a, b| a.0.total_cmp(&b.0));
        series.push(svg::Series {
            label: format!("{} (runs)", model.backend),
            points,
            color: Some(index),
            dash: 0,
            markers_only: true,
        });
        let latency_at = |n: f64| (model.intercept_us + model.per_copy_us * n).max(0.0);
        series.push(svg::Series {
            label: format!(
                "{}: {:.1} + n*{:.2} us",
                model.backend, model.intercept_us, model.per_copy_us
            ),
            points: vec![(0.0, latency_at(0.0), 0.0), (xmax, latency_at(xmax), 0.0)],
            color: Some(index),
            dash: 1,
            markers_only: false,
        });
    }
    svg::line_plot(
        "SFU delay (a) vs copies per packet",
        "copies per packet (n)",
        "delay (a) p50 (us)",
        &series,
        None,
        None,
    )
}

/// Keys of the runs a resumed grid need not make again
/// ([`crate::checkpoint::settled_keys`]: a run left out is made again).
pub fn settled_keys(runs: &[Run]) -> std::collections::HashSet<String> {
    crate::checkpoint::settled_keys(runs.iter().map(|r| (r.key(), r.excluded.is_none())))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A capacity step that ends on loss names where the run saw it: the
    /// SFU's AF_XDP transmit waiting for room, the clients' sockets
    /// dropping frames; nothing when the run saw neither.
    #[test]
    fn a_capacity_limit_says_where_the_loss_happened() {
        let mut r = run("xdp", 16, 0, 40.0, 1.0);
        assert_eq!(experiment::loss_causes(&r), "");
        r.client_rx_ring_drops = Some(0);
        assert_eq!(experiment::loss_causes(&r), "");
        r.sfu_rx_drops = Some(0);
        assert_eq!(experiment::loss_causes(&r), "");
        r.tx_congested = true;
        r.client_rx_ring_drops = Some(7);
        r.sfu_rx_drops = Some(5);
        r.client_tx_drops = Some(3);
        assert_eq!(
            experiment::loss_causes(&r),
            ": the SFU's receive dropped 5, the SFU's AF_XDP transmit congested, \
             the clients' AF_XDP sockets dropped 7, the clients' AF_XDP sends dropped 3"
        );
    }

    #[test]
    fn runs_left_out_are_made_again_up_to_the_attempt_limit() {
        let kept = run("socket", 6, 0, 10.0, 40.0);
        let mut left_out = run("mmsg", 6, 0, 10.0, 40.0);
        left_out.excluded = Some("other load on the machine (55% of a core)".into());
        let mut remade = left_out.clone();
        remade.excluded = None;
        let mut stubborn = run("xdp", 6, 0, 10.0, 40.0);
        stubborn.excluded = Some("load generator late".into());
        let settled = settled_keys(&[kept.clone(), left_out.clone()]);
        assert!(settled.contains(&kept.key()));
        assert!(!settled.contains(&left_out.key()), "made again on --resume");
        let settled = settled_keys(&[left_out.clone(), remade]);
        assert!(
            settled.contains(&left_out.key()),
            "a kept attempt settles it"
        );
        let tries: Vec<Run> = (0..crate::checkpoint::MAX_ATTEMPTS)
            .map(|_| stubborn.clone())
            .collect();
        assert!(
            !settled_keys(&tries[..crate::checkpoint::MAX_ATTEMPTS - 1]).contains(&stubborn.key())
        );
        assert!(settled_keys(&tries).contains(&stubborn.key()), "bounded");
    }

    fn run(backend: &str, clients: usize, rep: usize, cpu: f64, d: f64) -> Run {
        Run {
            backend: backend.into(),
            io_mode: backend.into(),
            flush: "packet".into(),
            clients,
            pps: 750,
            rep,
            block: rep,
            order: 0,
            loadavg1: 0.1,
            steal_pct: 0.0,
            seconds: 10.0,
            cpu_user_pct: cpu,
            cpu_system_pct: cpu,
            spin_pct: 0.0,
            cpu_per_packet_us: cpu,
            sfu_host_pct: 2.0 * cpu,
            sfu_host_per_packet_us: 2.0 * cpu,
            switch_pct: f64::NAN,
            clients_pct: 1.0,
            foreign_pct: 0.0,
            delay_p50_us: d,
            delay_p99_us: 2.0 * d,
            delay_mean_us: d,
            handoff_p50_us: d + 1.0,
            handoff_p99_us: d + 2.0,
            wait_p50_us: 0.5,
            wait_p99_us: 1.0,
            kdelay_p50_us: if backend == "xdp" { f64::NAN } else { d + 3.0 },
            kdelay_p99_us: d + 4.0,
            copies_per_packet: clients as f64,
            media: 1,
            client_lost: 0,
            client_loss_pct: 0.0,
            client_rtt_p50_us: 0.0,
            client_rx: "mmsg".into(),
            client_rx_via_kernel: None,
            client_rx_rejected: None,
            client_rx_ring_drops: None,
            client_tx: "mmsg".into(),
            client_tx_via_kernel: None,
            client_tx_drops: None,
            load_sender_policy: None,
            tx_congested: false,
            sfu_rx_drops: None,
            load_late_pct: 0.0,
            excluded: None,
            delay_excluded: None,
        }
    }

    #[test]
    fn ratios_models_and_exclusions() {
        let mut runs = Vec::new();
        for rep in 0..3 {
            for n in [6, 8, 10] {
                // socket: d = 5 + 2n; xdp: d = 10 + 1n, half the CPU
                runs.push(run("socket", n, rep, 10.0, 5.0 + 2.0 * n as f64));
                runs.push(run("xdp", n, rep, 5.0, 10.0 + n as f64));
            }
        }
        // A congested run with absurd values is left out.
        let mut bad = run("xdp", 6, 3, 1000.0, 1e6);
        bad.excluded = Some("TX ring congested".into());
        runs.push(bad);
        let s = summarize(&runs);
        assert_eq!(s.rows.len(), 6);
        assert_eq!(s.excluded.len(), 1);
        let m = s.models.iter().find(|m| m.backend == "socket").unwrap();
        assert!((m.intercept_us - 5.0).abs() < 1e-9 && (m.per_copy_us - 2.0).abs() < 1e-9);
        assert_eq!(m.terms.0, "k_rcv");
        let mx = s.models.iter().find(|m| m.backend == "xdp").unwrap();
        assert_eq!(mx.terms.1, "u_tx");
        assert!((mx.per_copy_us - 1.0).abs() < 1e-9);
        let r = s
            .rows
            .iter()
            .find(|r| r.backend == "xdp" && r.clients == 6)
            .unwrap();
        assert_eq!(r.runs, 3);
        assert_eq!(r.cpu_ratio, Some(0.5));
        assert!((r.delay_p50_ratio.unwrap() - 16.0 / 17.0).abs() < 1e-9);
        // No kernel stamps for this xdp: n/a, never 0.
        assert_eq!(r.kdelay_p50_ratio, None);
        // The clients' CPU beside the SFU's; no switch threads: n/a.
        assert_eq!((r.clients_cpu.n, r.clients_cpu.mean), (3, 1.0));
        assert_eq!(r.switch_cpu.n, 0);
        let header = cells_table(&s).text();
        assert!(
            header.contains("clients%") && header.contains("switch%"),
            "{header}"
        );
        let b = s.backends.iter().find(|b| b.backend == "xdp").unwrap();
        assert!((b.cpu_ratio.unwrap() - 0.5).abs() < 1e-9);
        assert_eq!(b.kdelay_p50_ratio, None);
        assert_eq!(b.excluded, 1);
        let t = render(&s);
        assert!(t.contains("delay model socket: d(n) = k_rcv + n * k_snd"));
        assert!(t.contains("kdelay(d) n/a"), "{t}");
        assert!(!t.contains("0.00x"));
        assert!(t.contains("Fig. 5 shape"));
        assert!(t.contains("left out: xdp clients=6"));
        assert!(svg(&runs, &s).starts_with("<svg"));
        // A congested run keeps its CPU and loses its delays only.
        let mut congested = run("xdp", 6, 4, 5.0, 1e6);
        congested.delay_excluded = Some("AF_XDP TX ring congested".into());
        let mut with = runs.clone();
        with.push(congested);
        let s2 = summarize(&with);
        let r2 = s2
            .rows
            .iter()
            .find(|r| r.backend == "xdp" && r.clients == 6)
            .unwrap();
        assert_eq!(r2.runs, 4, "counted for CPU");
        assert_eq!(r2.cpu_per_packet.n, 4);
        assert_eq!(r2.delay_p50.n, 3, "its delay left out");
        assert!((r2.delay_p50.mean - 16.0).abs() < 1e-9);
        assert_eq!(s2.delay_excluded.len(), 1);
        assert!(render(&s2).contains("delay left out (CPU kept): xdp clients=6"));
        let j = json(&runs, &s, None);
        let xb = j["backends"]
            .as_array()
            .unwrap()
            .iter()
            .find(|b| b["backend"] == "xdp")
            .unwrap();
        for k in [
            "cpu_ratio",
            "delay_p50_ratio",
            "handoff_p50_ratio",
            "wait_p50_ratio",
            "kdelay_p50_ratio",
            "delay_p50_us",
            "cpu_pct",
        ] {
            assert!(xb.get(k).is_some(), "{k} missing");
        }
        assert!(xb["kdelay_p50_ratio"].is_null());
    }

    #[test]
    fn ratios_carry_cis_and_are_judged_against_the_aa_floor() {
        let mut runs = Vec::new();
        // Per repetition the machine drifts (socket's CPU 10, 12, 14); the
        // A/A copy wobbles ±2 %; mmsg costs 0.5× socket ±1 %; uring 0.97×
        // ±4 %: within the floor.
        for (rep, w) in [1.0, -1.0, 0.5].into_iter().enumerate() {
            for n in [6, 8] {
                let base = 10.0 + 2.0 * rep as f64 + n as f64;
                runs.push(run("socket", n, rep, base, 20.0));
                runs.push(run("socket#aa", n, rep, base * (1.0 + 0.02 * w), 20.0));
                runs.push(run("mmsg", n, rep, base * (0.5 + 0.005 * w), 10.0));
                runs.push(run("uring", n, rep, base * (0.97 + 0.04 * w), 20.0));
            }
        }
        let s = summarize(&runs);
        let effect = |backend: &str, metric: &str| {
            s.effects
                .iter()
                .find(|e| e.backend == backend && e.metric == metric)
                .unwrap()
                .clone()
        };
        let aa = effect("socket#aa", "cpu/pkt");
        assert!(aa.verdict.is_none(), "the A/A row is the floor itself");
        let floor = aa.floor_pct.unwrap();
        assert!(floor > 0.5 && floor < 10.0, "{floor}");
        let mmsg = effect("mmsg", "cpu/pkt");
        let (ratio, ci) = mmsg.ratio().unwrap();
        assert!(
            (ratio - 0.5).abs() < 0.01 && ci > 0.0 && ci < 0.05,
            "{ratio} ± {ci}"
        );
        assert_eq!(mmsg.effect.unwrap().pairs, 6);
        assert_eq!(mmsg.verdict, Some(Verdict::Lower));
        assert_eq!(mmsg.floor_pct, Some(floor));
        let uring = effect("uring", "cpu/pkt");
        assert!(
            matches!(uring.verdict, Some(Verdict::Noise(_))),
            "{:?}",
            uring.verdict
        );
        assert!(effects_table(&s)
            .text()
            .contains("CI includes a ratio of 1"));
        assert!(uring.reps_for_target.is_some());
        // Per cell: the paired ratio with its CI over the repetitions.
        let row = s
            .rows
            .iter()
            .find(|r| r.backend == "mmsg" && r.clients == 6)
            .unwrap();
        assert_eq!(row.ratio_ci[0].n, 3);
        assert!((row.ratio_ci[0].mean - 0.5).abs() < 0.01);
        let text = render(&s);
        assert!(text.contains("A/A: the noise floor"), "{text}");
        assert!(text.contains("0.50 ±"), "{text}");
        let md = markdown(&s);
        assert!(md.contains("| mmsg | cpu/pkt | 0.50"), "{md}");
        // Without the A/A arm nothing is judged: the floor is gone.
        let without: Vec<Run> = runs
            .iter()
            .filter(|r| r.backend != "socket#aa")
            .cloned()
            .collect();
        let s = summarize(&without);
        let mmsg = s
            .effects
            .iter()
            .find(|e| e.backend == "mmsg" && e.metric == "cpu/pkt")
            .unwrap();
        assert_eq!(mmsg.floor_pct, None);
        assert_eq!(mmsg.verdict, Some(Verdict::NoFloor));
        // A run round-trips through a state file with its n/a columns.
        let line = serde_json::to_string(&runs[0]).unwrap();
        let back: Run = serde_json::from_str(&line).unwrap();
        assert!(back.switch_pct.is_nan() && back.key() == runs[0].key());
    }
}
