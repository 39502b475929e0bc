//! The analysis between a sweep's records and its report: records grouped
//! into points (means and CIs over the valid repetitions), and the rows of
//! the computed tables — the capacity model, the queueing check, the
//! baseline comparisons — as data (serialised into capacity.json too).
//! [`super::report`] only formats them.

use super::model::{
    capacity_ci, capacity_per_rep, error_pct, model_threads, paired_lower, predicted_capacity,
    queue_prediction, QueuePrediction,
};
use super::sweep::Capacity;
use super::topology::ThreadSched;
use super::{Lat, ProxyKind, RunRecord, TypeLat};
use crate::stats::{mean_ci, MeanCi};
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};

/// (repetition, PDR, K_rcv mean) of one valid run, for pairing runs of
/// two modes that share seeds.
pub type RepValues = (u32, f64, Option<f64>);

/// The papers' six message types (summary labels, table names).
pub const SIX_TYPES: [(&str, &str); 6] = [
    ("INVITE", "INVITE"),
    ("180", "180"),
    ("200", "200 (INVITE)"),
    ("ACK", "ACK"),
    ("BYE", "BYE"),
    ("200-BYE", "200 (BYE)"),
];

/// Repetitions of one point (every setting but rep and seed), aggregated
/// over its valid runs.
#[derive(Clone, Debug, Serialize)]
pub struct Point {
    /// Configuration label.
    pub config: String,
    /// Proxy.
    pub proxy: ProxyKind,
    /// Scheduler mode.
    pub sched: String,
    /// Cores.
    pub cores: usize,
    /// Workers.
    pub workers: usize,
    /// Offered call rate.
    pub rate: f64,
    /// Valid repetitions (used in the means).
    pub reps: usize,
    /// Flagged repetitions (left out).
    pub flagged: usize,
    /// Failed repetitions (errors).
    pub errors: usize,
    /// PDR.
    pub pdr: MeanCi,
    /// Failed-call ratio.
    pub failed_ratio: MeanCi,
    /// Arrival rate at the proxy (packets/s).
    pub arrival_pps: MeanCi,
    /// T_sip over all messages (µs).
    pub t_sip_us: Option<MeanCi>,
    /// K_rcv over all messages (µs).
    pub k_rcv_us: Option<MeanCi>,
    /// K_snd over all messages (µs, sampled).
    pub k_snd_us: Option<MeanCi>,
    /// Wait in the batch (µs).
    pub wait_us: Option<MeanCi>,
    /// Proxy socket drops per run.
    pub rcv_errors: MeanCi,
    /// Call-setup drops per run (ringway).
    pub setup_drops: Option<MeanCi>,
    /// Call-setup messages per run.
    pub setup_msgs: MeanCi,
    /// Messages offered per run.
    pub total_msgs: MeanCi,
    /// Proxy CPU µs per call.
    pub cpu_us_per_call: MeanCi,
    /// Proxy CPU µs per received message (ringway).
    pub cpu_us_per_msg: Option<MeanCi>,
    /// Migrations per proxy thread per run.
    pub migrations: MeanCi,
    /// Voluntary context switches per proxy thread per run.
    pub voluntary: MeanCi,
    /// Involuntary context switches per proxy thread per run.
    pub involuntary: MeanCi,
    /// Smallest and largest per-worker message share (%), ringway.
    pub share_pct: Option<(f64, f64)>,
    /// Per-type (K_rcv, wait, T_sip, K_snd) means (µs) over reps.
    pub by_type: BTreeMap<String, [Option<f64>; 4]>,
    /// Per rep (rep, PDR, K_rcv) of the valid runs, for pairing.
    pub per_rep: Vec<RepValues>,
    /// Effective settings (canonical text) of the runs.
    pub effective: BTreeSet<String>,
    /// Settings applied (union over runs).
    pub applied: BTreeSet<String>,
    /// Refusals (union over runs).
    pub refused: BTreeSet<String>,
    /// Kernel.
    pub kernel: String,
}

/// Group records into points by every setting but rep and seed.
pub fn points(records: &[RunRecord]) -> Vec<Point> {
    let mut groups: BTreeMap<String, Vec<&RunRecord>> = BTreeMap::new();
    for record in records {
        groups
            .entry(record.spec.point_key())
            .or_default()
            .push(record);
    }
    let mut out: Vec<Point> = groups.into_values().map(|runs| point(&runs)).collect();
    out.sort_by(|a, b| {
        (a.proxy, a.cores, &a.sched, a.workers)
            .cmp(&(b.proxy, b.cores, &b.sched, b.workers))
            .then(a.rate.total_cmp(&b.rate))
    });
    out
}

/// Mean of a latency over the valid runs that measured any (`None`: none did).
fn latency(valid: &[&RunRecord], of: impl Fn(&TypeLat) -> Option<f64>) -> Option<MeanCi> {
    let values: Vec<f64> = valid
        .iter()
        .filter_map(|r| r.all.as_ref())
        .filter(|all| all.count > 0)
        .filter_map(of)
        .collect();
    (!values.is_empty()).then(|| mean_ci(&values))
}

/// A latency's mean when it has samples.
fn measured(latency: &Lat) -> Option<f64> {
    (latency.count > 0).then_some(latency.mean_us)
}

/// Per proxy thread and run, a scheduling counter's mean.
fn per_thread(valid: &[&RunRecord], of: impl Fn(&ThreadSched) -> u64) -> MeanCi {
    let values: Vec<f64> = valid
        .iter()
        .filter(|r| !r.threads.is_empty())
        .map(|r| r.threads.iter().map(&of).sum::<u64>() as f64 / r.threads.len() as f64)
        .collect();
    mean_ci(&values)
}

/// The smallest and the largest share of the messages one worker got (%).
fn worker_shares(valid: &[&RunRecord]) -> Option<(f64, f64)> {
    let shares: Vec<(f64, f64)> = valid
        .iter()
        .filter_map(|r| {
            let total: u64 = r.per_worker_in.iter().sum();
            let min = *r.per_worker_in.iter().min()? as f64;
            let max = *r.per_worker_in.iter().max()? as f64;
            (total > 0).then(|| (100.0 * min / total as f64, 100.0 * max / total as f64))
        })
        .collect();
    (!shares.is_empty()).then(|| {
        (
            shares.iter().map(|s| s.0).fold(f64::MAX, f64::min),
            shares.iter().map(|s| s.1).fold(0.0, f64::max),
        )
    })
}

/// Per message type, the means of (K_rcv, wait, T_sip, K_snd) over the runs.
fn by_type(valid: &[&RunRecord]) -> BTreeMap<String, [Option<f64>; 4]> {
    let mut out = BTreeMap::new();
    for (label, _) in SIX_TYPES {
        let column = |of: &dyn Fn(&TypeLat) -> Option<f64>| {
            let values: Vec<f64> = valid
                .iter()
                .filter_map(|r| r.by_type.get(label))
                .filter_map(of)
                .collect();
            (!values.is_empty()).then(|| values.iter().sum::<f64>() / values.len() as f64)
        };
        let means = [
            column(&|t| measured(&t.k_rcv)),
            column(&|t| measured(&t.wait)),
            column(&|t| measured(&t.t_sip)),
            column(&|t| measured(&t.k_snd)),
        ];
        if means.iter().any(Option::is_some) {
            out.insert(label.to_string(), means);
        }
    }
    out
}

/// Proxy CPU per message handled (µs): ringway counts what it received;
/// for Kamailio, offered minus what its sockets dropped.
fn cpu_per_message(valid: &[&RunRecord]) -> Option<MeanCi> {
    let values: Vec<f64> = valid
        .iter()
        .filter_map(|r| {
            let handled = r
                .proxy_msgs_in
                .unwrap_or(r.total_msgs.saturating_sub(r.proxy_socket_drops));
            (handled > 0 && r.proxy_cpu_s > 0.0).then(|| 1e6 * r.proxy_cpu_s / handled as f64)
        })
        .collect();
    (!values.is_empty()).then(|| mean_ci(&values))
}

/// One point from its runs (all with the same point key).
fn point(runs: &[&RunRecord]) -> Point {
    let valid: Vec<&RunRecord> = runs.iter().copied().filter(|r| r.valid()).collect();
    let mean =
        |of: &dyn Fn(&RunRecord) -> f64| mean_ci(&valid.iter().map(|r| of(r)).collect::<Vec<_>>());
    let setup: Vec<f64> = valid
        .iter()
        .filter_map(|r| r.setup_drops)
        .map(|d| d as f64)
        .collect();
    let spec = &runs[0].spec;
    Point {
        config: spec.config_label(),
        proxy: spec.proxy,
        sched: spec.sched.clone(),
        cores: spec.cores,
        workers: spec.workers,
        rate: spec.rate,
        reps: valid.len(),
        flagged: runs
            .iter()
            .filter(|r| r.error.is_none() && !r.flags.is_empty())
            .count(),
        errors: runs.iter().filter(|r| r.error.is_some()).count(),
        pdr: mean(&|r| r.pdr),
        failed_ratio: mean(&|r| r.failed_ratio),
        arrival_pps: mean(&|r| r.arrival_pps),
        t_sip_us: latency(&valid, |all| measured(&all.t_sip)),
        k_rcv_us: latency(&valid, |all| measured(&all.k_rcv)),
        k_snd_us: latency(&valid, |all| measured(&all.k_snd)),
        wait_us: latency(&valid, |all| measured(&all.wait)),
        rcv_errors: mean(&|r| r.proxy_socket_drops as f64),
        setup_drops: (!setup.is_empty()).then(|| mean_ci(&setup)),
        setup_msgs: mean(&|r| r.setup_msgs as f64),
        total_msgs: mean(&|r| r.total_msgs as f64),
        cpu_us_per_call: mean(&|r| 1e6 * r.proxy_cpu_s / (r.attempted.max(1) as f64)),
        cpu_us_per_msg: cpu_per_message(&valid),
        migrations: per_thread(&valid, |t| t.migrations),
        voluntary: per_thread(&valid, |t| t.voluntary),
        involuntary: per_thread(&valid, |t| t.involuntary),
        share_pct: worker_shares(&valid),
        by_type: by_type(&valid),
        per_rep: valid
            .iter()
            .map(|r| {
                let k_rcv = r
                    .all
                    .as_ref()
                    .filter(|a| a.k_rcv.count > 0)
                    .map(|a| a.k_rcv.mean_us);
                (r.spec.rep, r.pdr, k_rcv)
            })
            .collect(),
        effective: runs
            .iter()
            .filter(|r| r.error.is_none())
            .map(|r| r.effective.clone())
            .collect(),
        applied: runs
            .iter()
            .flat_map(|r| r.applied.iter().cloned())
            .collect(),
        refused: runs
            .iter()
            .flat_map(|r| r.refused.iter().cloned())
            .collect(),
        kernel: runs[0].kernel.clone(),
    }
}

/// The point of a capacity's configuration at `rate`.
pub fn point_at<'a>(pts: &'a [Point], c: &Capacity, rate: f64) -> Option<&'a Point> {
    pts.iter().find(|p| {
        p.proxy == c.proxy
            && p.cores == c.cores
            && p.workers == c.workers
            && p.sched == c.profile
            && p.rate == rate
    })
}

/// A measured capacity with the CI of its per-repetition capacities.
#[derive(Clone, Debug, PartialEq)]
pub struct MeasuredCapacity {
    /// Capacity (calls/s).
    pub cps: f64,
    /// Per-repetition capacities (mean ± CI), when there are repetitions.
    pub per_rep: Option<MeanCi>,
    /// Threads of the configuration.
    pub workers: usize,
    /// The sweep never crossed the threshold: a lower bound.
    pub censored: bool,
}

/// The per-repetition capacities of `c` (mean ± CI).
pub fn per_rep_capacity(c: &Capacity, threshold: f64) -> Option<MeanCi> {
    let reps = c.rep_pdrs.first().map_or(0, |p| p.1.len());
    capacity_ci(&capacity_per_rep(&c.rep_pdrs, reps, threshold))
}

fn measured_capacity(c: &Capacity, threshold: f64) -> Option<MeasuredCapacity> {
    Some(MeasuredCapacity {
        cps: c.capacity_cps?,
        per_rep: per_rep_capacity(c, threshold),
        workers: c.workers,
        censored: c.censored,
    })
}

/// The highest capacity among `caps`.
fn best<'c>(caps: impl Iterator<Item = &'c Capacity>) -> Option<&'c Capacity> {
    caps.filter(|c| c.capacity_cps.is_some()).max_by(|a, b| {
        a.capacity_cps
            .unwrap_or(0.0)
            .total_cmp(&b.capacity_cps.unwrap_or(0.0))
    })
}

/// The best thread count of one (proxy, mode, core count).
#[derive(Clone, Debug, PartialEq)]
pub struct BestThreads {
    /// Proxy.
    pub proxy: ProxyKind,
    /// Scheduler mode.
    pub sched: String,
    /// Cores.
    pub cores: usize,
    /// Processors (sockets).
    pub sockets: usize,
    /// The configuration with the highest capacity (`None`: none measured).
    pub best: Option<MeasuredCapacity>,
    /// The model's thread count T_{p,c}.
    pub model_threads: usize,
}

/// The best thread count per core count, per proxy and mode.
pub fn best_threads(caps: &[Capacity], threshold: f64) -> Vec<BestThreads> {
    let mut groups: BTreeMap<(ProxyKind, String, usize), Vec<&Capacity>> = BTreeMap::new();
    for c in caps {
        groups
            .entry((c.proxy, c.profile.clone(), c.cores))
            .or_default()
            .push(c);
    }
    groups
        .into_iter()
        .map(|((proxy, sched, cores), group)| {
            let sockets = group[0].sockets;
            BestThreads {
                proxy,
                sched,
                cores,
                sockets,
                best: best(group.iter().copied()).and_then(|b| measured_capacity(b, threshold)),
                model_threads: model_threads(sockets, cores),
            }
        })
        .collect()
}

/// One row of the capacity model C_{p,c} = T_{p,c} × C_{1,1}.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelRow {
    /// Proxy.
    pub proxy: ProxyKind,
    /// Scheduler mode.
    pub sched: String,
    /// C_{1,1}: the capacity at 1 core, 1 thread, when measured and crossed.
    pub c11: Option<MeasuredCapacity>,
    /// Cores c.
    pub cores: usize,
    /// Processors p.
    pub sockets: usize,
    /// T_{p,c}.
    pub threads: usize,
    /// Predicted C_{p,c} (calls/s).
    pub predicted: Option<f64>,
    /// The best measured capacity at c cores.
    pub best: Option<MeasuredCapacity>,
    /// Error of the prediction (% of the measurement).
    pub error_pct: Option<f64>,
}

/// Whether the papers' capacity model applies at `cores` cores (c >= 2).
pub fn model_applies(cores: usize) -> bool {
    cores >= 2
}

/// The capacity model per proxy, mode and core count: predicted from the
/// measured C_{1,1}, against the best measured.
pub fn capacity_model(caps: &[Capacity], threshold: f64) -> Vec<ModelRow> {
    let mut groups: BTreeMap<(ProxyKind, String), Vec<&Capacity>> = BTreeMap::new();
    for c in caps {
        groups
            .entry((c.proxy, c.profile.clone()))
            .or_default()
            .push(c);
    }
    let mut rows = Vec::new();
    for ((proxy, sched), group) in groups {
        let c11 = group
            .iter()
            .find(|c| c.cores == 1 && c.workers == 1 && !c.censored)
            .and_then(|c| measured_capacity(c, threshold));
        let core_counts: BTreeSet<usize> = group.iter().map(|c| c.cores).collect();
        for cores in core_counts {
            let best = best(group.iter().copied().filter(|c| c.cores == cores))
                .and_then(|b| measured_capacity(b, threshold));
            let sockets = group
                .iter()
                .find(|c| c.cores == cores)
                .map_or(1, |c| c.sockets);
            // The model is meant for c >= 2: at c = 1 it gives 3 x C_{1,1},
            // contradicting its own definition (no prediction, no error).
            let predicted = c11
                .as_ref()
                .filter(|_| model_applies(cores))
                .map(|c11| predicted_capacity(c11.cps, sockets, cores));
            let error_pct = match (predicted, &best) {
                (Some(p), Some(b)) => error_pct(p, b.cps),
                _ => None,
            };
            rows.push(ModelRow {
                proxy,
                sched: sched.clone(),
                c11: c11.clone(),
                cores,
                sockets,
                threads: model_threads(sockets, cores),
                predicted,
                best,
                error_pct,
            });
        }
    }
    rows
}

/// The queueing check of one configuration at its highest load under the
/// threshold.
#[derive(Clone, Debug, PartialEq)]
pub struct QueueRow {
    /// Configuration label.
    pub config: String,
    /// Threads.
    pub workers: usize,
    /// λ: arrival rate (messages/s).
    pub arrival_pps: f64,
    /// With S = T_sip: (S in µs, the predictions).
    pub by_t_sip: Option<(f64, QueuePrediction)>,
    /// With S = proxy CPU per message: (S in µs, the predictions).
    pub by_cpu: Option<(f64, QueuePrediction)>,
    /// Measured K_rcv (µs).
    pub k_rcv: Option<MeanCi>,
    /// Measured K_rcv plus the wait in the batch (µs).
    pub k_rcv_plus_wait: Option<f64>,
}

/// K_rcv predicted by M/M/1 and M/D/1 from λ and a measured service time,
/// against the measurement, for every configuration with a load under the
/// threshold.
pub fn queueing_check(caps: &[Capacity], pts: &[Point]) -> Vec<QueueRow> {
    let mut rows = Vec::new();
    for c in caps {
        let Some((rate, _)) = c.below else { continue };
        let Some(point) = point_at(pts, c, rate).filter(|point| point.reps > 0) else {
            continue;
        };
        let lambda = point.arrival_pps.mean;
        let predict = |service: Option<MeanCi>| {
            service.map(|s| (s.mean, queue_prediction(lambda, s.mean, c.cores)))
        };
        rows.push(QueueRow {
            config: c.config.clone(),
            workers: c.workers,
            arrival_pps: lambda,
            by_t_sip: predict(point.t_sip_us),
            by_cpu: predict(point.cpu_us_per_msg),
            k_rcv: point.k_rcv_us,
            k_rcv_plus_wait: match (point.k_rcv_us, point.wait_us) {
                (Some(k), Some(w)) => Some(k.mean + w.mean),
                _ => None,
            },
        });
    }
    rows
}

/// How much lower another mode's value is than the baseline's, paired by
/// repetition.
#[derive(Clone, Debug, PartialEq)]
pub enum Lower {
    /// Both modes applied the same settings on this kernel: no comparison.
    SameSettings,
    /// % lower, its 95% CI half-width and the number of pairs.
    Paired {
        /// % lower (negative: higher).
        pct: f64,
        /// CI half-width (meaningful from 2 pairs).
        ci95: f64,
        /// Repetitions paired.
        pairs: usize,
    },
    /// No pair with data.
    NoData,
}

/// `other` against `base`, paired by repetition, on the value `of`.
fn lower(base: &Point, other: &Point, of: fn(&RepValues) -> Option<f64>) -> Lower {
    if !base.effective.is_empty() && base.effective == other.effective {
        return Lower::SameSettings;
    }
    let mut base_values = Vec::new();
    let mut other_values = Vec::new();
    for b in &base.per_rep {
        if let Some(other_rep) = other.per_rep.iter().find(|other_rep| other_rep.0 == b.0) {
            if let (Some(base_value), Some(other_value)) = (of(b), of(other_rep)) {
                base_values.push(base_value);
                other_values.push(other_value);
            }
        }
    }
    match paired_lower(&base_values, &other_values) {
        Some((pct, ci95)) => Lower::Paired {
            pct,
            ci95,
            pairs: base_values.len(),
        },
        None => Lower::NoData,
    }
}

/// Another mode at the baseline crossing load.
#[derive(Clone, Debug, PartialEq)]
pub struct OtherMode {
    /// PDR (fraction).
    pub pdr: MeanCi,
    /// PDR lower than the baseline's.
    pub pdr_lower: Lower,
    /// K_rcv (µs).
    pub k_rcv: Option<MeanCi>,
    /// K_rcv lower than the baseline's.
    pub k_rcv_lower: Lower,
}

/// One thread count of a comparison.
#[derive(Clone, Debug, PartialEq)]
pub enum ComparisonRow {
    /// The baseline never crossed the threshold: no load to compare at.
    NeverCrossed {
        /// Threads.
        workers: usize,
    },
    /// At the baseline's crossing load.
    At {
        /// Threads.
        workers: usize,
        /// The load (calls/s).
        rate: f64,
        /// Baseline PDR (fraction).
        pdr: MeanCi,
        /// Baseline K_rcv (µs).
        k_rcv: Option<MeanCi>,
        /// The other modes, in [`Comparison::others`] order (`None`: not
        /// measured at this load).
        others: Vec<Option<OtherMode>>,
    },
}

/// Baseline against the other modes of one proxy and core count.
#[derive(Clone, Debug, PartialEq)]
pub struct Comparison {
    /// Proxy.
    pub proxy: ProxyKind,
    /// Cores.
    pub cores: usize,
    /// The other modes (not baseline, not default).
    pub others: Vec<String>,
    /// Per baseline thread count.
    pub rows: Vec<ComparisonRow>,
}

/// Tables III/VI/IX's data: PDR and K_rcv at the baseline crossing load,
/// baseline against the other modes.
pub fn comparisons(caps: &[Capacity], pts: &[Point]) -> Vec<Comparison> {
    let keys: BTreeSet<(ProxyKind, usize)> = caps
        .iter()
        .filter(|c| c.profile == "baseline")
        .map(|c| (c.proxy, c.cores))
        .collect();
    let mut out = Vec::new();
    for (proxy, cores) in keys {
        let mine = |c: &&Capacity| c.proxy == proxy && c.cores == cores;
        let mut others: Vec<String> = Vec::new();
        for c in caps.iter().filter(mine) {
            if c.profile != "baseline" && c.profile != "default" && !others.contains(&c.profile) {
                others.push(c.profile.clone());
            }
        }
        let mut rows = Vec::new();
        for b in caps.iter().filter(mine).filter(|c| c.profile == "baseline") {
            let Some(rate) = b.above.map(|a| a.0) else {
                rows.push(ComparisonRow::NeverCrossed { workers: b.workers });
                continue;
            };
            let Some(base) = point_at(pts, b, rate) else {
                continue;
            };
            let label_at = |mode: &String| {
                pts.iter().find(|p| {
                    p.proxy == proxy
                        && p.cores == cores
                        && p.workers == b.workers
                        && &p.sched == mode
                        && p.rate == rate
                })
            };
            rows.push(ComparisonRow::At {
                workers: b.workers,
                rate,
                pdr: base.pdr,
                k_rcv: base.k_rcv_us,
                others: others
                    .iter()
                    .map(|mode| {
                        label_at(mode).map(|p| OtherMode {
                            pdr: p.pdr,
                            pdr_lower: lower(base, p, |x| Some(x.1)),
                            k_rcv: p.k_rcv_us,
                            k_rcv_lower: lower(base, p, |x| x.2),
                        })
                    })
                    .collect(),
            });
        }
        out.push(Comparison {
            proxy,
            cores,
            others,
            rows,
        });
    }
    out
}
