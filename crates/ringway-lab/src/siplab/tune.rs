//! The papers' method as a tool: at the baseline crossing load, try the
//! scheduler knobs this kernel lets the lab change, one dimension at a time
//! on top of the baseline mode (per-thread slice, policy, nice, affinity
//! model, migration cost and sched features where writable), and pick the
//! setting with the lowest drop rate (then the lowest K_rcv). The search
//! uses its own seeds; the pick is measured again with the sweep's seeds
//! before it enters any comparison.

use super::kernel::KernelVersion;
use super::mode::{Knobs, Mode, Rule};
use super::sweep::{spec_for, Runs, SweepConfig};
use super::{ProxyKind, RunRecord, Tools};
use crate::stats::{mean_ci, MeanCi};
use serde::Serialize;

/// Most candidates one search tries (for run-count bounds).
pub const MAX_CANDIDATES: usize = 16;

/// Seeds of the search differ from the sweep's (fresh seeds for the pick).
const SEARCH_SEED: u64 = 0x5EA2_C4ED_0000_0000;

/// One setting to try.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Candidate {
    /// Label in the search table.
    pub label: String,
    /// The knob values changed on top of the baseline mode.
    pub change: Knobs,
    /// The dimension searched (`slice`, `policy`, `migration_cost`, ...).
    pub dimension: String,
    /// The value on that dimension (for the Fig. 2 analogue), if numeric.
    pub x: Option<f64>,
}

impl Candidate {
    fn new(label: impl Into<String>, dimension: &str, x: Option<f64>, change: Knobs) -> Candidate {
        Candidate {
            label: label.into(),
            change,
            dimension: dimension.into(),
            x,
        }
    }
}

/// The candidates on a kernel: `writable(path)` as in [`super::kernel::map_knobs`];
/// returns them and the dimensions not searched, with the reason.
pub fn candidates(
    cores: usize,
    kernel: Option<KernelVersion>,
    writable: &dyn Fn(&str) -> Result<(), String>,
) -> (Vec<Candidate>, Vec<String>) {
    let mut list = vec![Candidate::new(
        "baseline",
        "baseline",
        None,
        Knobs::default(),
    )];
    let mut skipped = Vec::new();
    let slice_ok = kernel.is_some_and(|k| k.per_thread_slice());
    if slice_ok {
        for us in [100u64, 200, 400, 1000, 3000] {
            list.push(Candidate::new(
                format!("slice {us} µs"),
                "slice",
                Some(us as f64),
                Knobs {
                    slice_us: Some(us),
                    ..Knobs::default()
                },
            ));
        }
    } else {
        skipped.push("per-thread slice: needs kernel 6.12+".into());
    }
    list.push(Candidate::new(
        "policy batch",
        "policy",
        None,
        Knobs {
            policy: Some("batch".into()),
            ..Knobs::default()
        },
    ));
    list.push(Candidate::new(
        "policy fifo:10",
        "policy",
        None,
        Knobs {
            policy: Some("fifo".into()),
            priority: Some(10),
            min_granularity_ns: None,
            ..Knobs::default()
        },
    ));
    list.push(Candidate::new(
        "nice -10",
        "nice",
        None,
        Knobs {
            nice: Some(-10),
            ..Knobs::default()
        },
    ));
    if cores >= 2 {
        list.push(Candidate::new(
            "affinity thread",
            "affinity",
            None,
            Knobs {
                affinity: Some("thread".into()),
                ..Knobs::default()
            },
        ));
    } else {
        skipped
            .push("affinity model: one core, process-wide and per-thread sets are the same".into());
    }
    list.extend(scheduler_knob_candidates(kernel, writable, &mut skipped));
    list.truncate(MAX_CANDIDATES);
    (list, skipped)
}

/// The candidates of the scheduler's own knobs (migration cost, EEVDF
/// features) where this kernel lets them be written; why not, in
/// `skipped`.
fn scheduler_knob_candidates(
    kernel: Option<KernelVersion>,
    writable: &dyn Fn(&str) -> Result<(), String>,
    skipped: &mut Vec<String>,
) -> Vec<Candidate> {
    let mut list = Vec::new();
    let debugfs = "/sys/kernel/debug/sched";
    let gen_cfs = kernel.map(|k| k.generation());
    let mc_path = match gen_cfs {
        Some(super::kernel::Generation::Sysctl) => {
            "/proc/sys/kernel/sched_migration_cost_ns".to_string()
        }
        _ => format!("{debugfs}/migration_cost_ns"),
    };
    match writable(&mc_path) {
        Ok(()) => {
            for ns in [0u64, 250_000, 500_000, 5_000_000] {
                list.push(Candidate::new(
                    format!("migration cost {} µs", ns / 1000),
                    "migration_cost",
                    Some(ns as f64 / 1000.0),
                    Knobs {
                        migration_cost_ns: Some(ns),
                        ..Knobs::default()
                    },
                ));
            }
        }
        Err(why) => skipped.push(format!("migration cost ({mc_path}): {why}")),
    }
    let feat = format!("{debugfs}/features");
    match (gen_cfs, writable(&feat)) {
        (Some(super::kernel::Generation::Eevdf), Ok(())) => {
            for f in ["NO_RUN_TO_PARITY", "NO_PREEMPT_SHORT"] {
                list.push(Candidate::new(
                    format!("feature {f}"),
                    "features",
                    None,
                    Knobs {
                        features: Some(vec![f.into()]),
                        ..Knobs::default()
                    },
                ));
            }
        }
        (Some(super::kernel::Generation::Eevdf), Err(why)) => {
            skipped.push(format!("sched features ({feat}): {why}"))
        }
        _ => skipped.push("sched features: EEVDF features are searched on 6.6+ only".into()),
    }
    list
}

/// One row of the search table.
#[derive(Clone, Debug, Serialize)]
pub struct TuneRow {
    /// The candidate.
    pub candidate: Candidate,
    /// Knobs tried (baseline with the change).
    pub knobs: Knobs,
    /// PDR over the valid runs.
    pub pdr: Option<MeanCi>,
    /// K_rcv (µs) over the valid runs (ringway only).
    pub k_rcv_us: Option<MeanCi>,
    /// Valid runs / runs.
    pub valid_runs: usize,
    /// Runs.
    pub runs: usize,
    /// What was actually applied (canonical), from the first run.
    pub effective: String,
    /// Refusals of the first run.
    pub refused: Vec<String>,
}

/// One search: at (proxy, cores, workers, rate).
#[derive(Clone, Debug, Serialize)]
pub struct TuneResult {
    /// Proxy.
    pub proxy: ProxyKind,
    /// Cores.
    pub cores: usize,
    /// Workers.
    pub workers: usize,
    /// The baseline crossing load searched at (calls/s).
    pub rate: f64,
    /// Every candidate.
    pub rows: Vec<TuneRow>,
    /// Index of the pick in `rows`.
    pub pick: Option<usize>,
    /// Dimensions not searched, with the reason.
    pub not_searched: Vec<String>,
}

impl TuneResult {
    /// The picked knobs.
    pub fn pick_knobs(&self) -> Option<Knobs> {
        self.pick.map(|i| self.rows[i].knobs.clone())
    }

    /// The pick as a mode file (`name = "tuned"`, one rule for this point).
    pub fn pick_mode(&self) -> Option<Mode> {
        let chosen = self.pick_knobs()?;
        Some(Mode {
            name: "tuned".into(),
            description: format!(
                "tuner's pick for {} at {} cores, {} workers, {:.0} calls/s: {}",
                self.proxy.name(),
                self.cores,
                self.workers,
                self.rate,
                self.rows[self.pick.unwrap_or(0)].candidate.label
            ),
            knobs: Knobs::default(),
            rules: vec![Rule {
                cores_min: Some(self.cores),
                cores_max: Some(self.cores),
                threads_min: Some(self.workers),
                threads_max: Some(self.workers),
                knobs: chosen,
            }],
        })
    }
}

/// Index of the best row: lowest mean PDR, then lowest K_rcv; rows without
/// a valid run are never picked.
pub fn pick(rows: &[(Option<f64>, Option<f64>)]) -> Option<usize> {
    let mut best: Option<usize> = None;
    for (i, (pdr, k)) in rows.iter().enumerate() {
        let Some(pdr_value) = pdr else { continue };
        let better = match best {
            None => true,
            Some(b) => {
                let (best_pdr, best_knobs) = (rows[b].0.unwrap_or(f64::INFINITY), rows[b].1);
                if (pdr_value - best_pdr).abs() > 1e-12 {
                    *pdr_value < best_pdr
                } else {
                    matches!((k, best_knobs), (Some(k), Some(best_knobs)) if k < &best_knobs)
                }
            }
        };
        if better {
            best = Some(i);
        }
    }
    best
}

/// Search at `rate` for (proxy, cores, workers) on top of `baseline` knobs.
#[allow(clippy::too_many_arguments)]
pub fn search(
    cfg: &SweepConfig,
    tools: &Tools,
    runs: &mut Runs<'_>,
    proxy: ProxyKind,
    cores: usize,
    workers: usize,
    rate: f64,
    baseline: &Knobs,
) -> TuneResult {
    let access = ringway_io::doctor::sched_knob_access();
    let writable = |p: &str| -> Result<(), String> {
        match access.iter().find(|a| a.path == p) {
            Some(a) => a.writable.clone(),
            None => Err("not probed".into()),
        }
    };
    let (cands, not_searched) = candidates(cores, KernelVersion::running(), &writable);
    let mut rows = Vec::new();
    for cand in cands {
        let mut knobs = baseline.overlay(&cand.change);
        if knobs
            .policy
            .as_deref()
            .is_some_and(|p| p == "fifo" || p == "rr")
        {
            // A real-time thread has no slice: drop the baseline's.
            knobs.min_granularity_ns = None;
            knobs.slice_us = None;
        }
        let recs: Vec<RunRecord> = (0..cfg.tune_reps)
            .map(|rep| {
                let seed =
                    super::sweep::seed_for(cfg.seed ^ SEARCH_SEED, workers, cores, rate, rep);
                let spec = spec_for(
                    cfg,
                    proxy,
                    cores,
                    workers,
                    &format!("tune:{}", cand.label),
                    knobs.clone(),
                    rate,
                    rep,
                    seed,
                );
                runs.get(&spec, tools)
            })
            .collect();
        let valid: Vec<&RunRecord> = recs.iter().filter(|r| r.valid()).collect();
        let pdr =
            (!valid.is_empty()).then(|| mean_ci(&valid.iter().map(|r| r.pdr).collect::<Vec<_>>()));
        let capacities: Vec<f64> = valid
            .iter()
            .filter_map(|r| r.all.as_ref())
            .filter(|a| a.k_rcv.count > 0)
            .map(|a| a.k_rcv.mean_us)
            .collect();
        rows.push(TuneRow {
            candidate: cand,
            knobs,
            pdr,
            k_rcv_us: (!capacities.is_empty()).then(|| mean_ci(&capacities)),
            valid_runs: valid.len(),
            runs: recs.len(),
            effective: recs
                .first()
                .map(|r| r.effective.clone())
                .unwrap_or_default(),
            refused: recs.first().map(|r| r.refused.clone()).unwrap_or_default(),
        });
    }
    let scores: Vec<(Option<f64>, Option<f64>)> = rows
        .iter()
        .map(|r| (r.pdr.map(|m| m.mean), r.k_rcv_us.map(|m| m.mean)))
        .collect();
    TuneResult {
        proxy,
        cores,
        workers,
        rate,
        pick: pick(&scores),
        rows,
        not_searched,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn candidates_follow_what_the_kernel_lets_the_lab_write() {
        let locked = |p: &str| -> Result<(), String> {
            if p.starts_with("/sys/kernel/debug") {
                Err("debugfs is not mounted".into())
            } else {
                Ok(())
            }
        };
        let k = Some(KernelVersion {
            major: 6,
            minor: 18,
        });
        let (c, skipped) = candidates(1, k, &locked);
        let dims: Vec<&str> = c.iter().map(|c| c.dimension.as_str()).collect();
        assert!(dims.contains(&"slice") && dims.contains(&"policy") && dims.contains(&"nice"));
        assert!(!dims.contains(&"migration_cost") && !dims.contains(&"affinity"));
        assert!(skipped
            .iter()
            .any(|s| s.contains("migration cost") && s.contains("not mounted")));
        assert!(skipped.iter().any(|s| s.contains("features")));
        let open = |_: &str| -> Result<(), String> { Ok(()) };
        let (c, _) = candidates(4, k, &open);
        let dims: Vec<&str> = c.iter().map(|c| c.dimension.as_str()).collect();
        assert!(
            dims.contains(&"migration_cost")
                && dims.contains(&"affinity")
                && dims.contains(&"features")
        );
        assert!(c.len() <= MAX_CANDIDATES);
        // No per-thread slice before 6.12.
        let (c, skipped) = candidates(1, Some(KernelVersion { major: 6, minor: 6 }), &locked);
        assert!(c.iter().all(|c| c.dimension != "slice"));
        assert!(skipped.iter().any(|s| s.contains("6.12")));
    }

    #[test]
    fn pick_prefers_lowest_drop_rate_then_k_rcv() {
        let rows = [
            (Some(0.02), Some(100.0)),
            (Some(0.01), Some(300.0)),
            (Some(0.01), Some(200.0)),
            (None, Some(1.0)),
        ];
        assert_eq!(pick(&rows), Some(2));
        assert_eq!(pick(&[(None, None)]), None);
        assert_eq!(pick(&[(Some(0.0), None), (Some(0.0), None)]), Some(0));
    }
}
