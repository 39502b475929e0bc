//! `ringway lab sip compare`: modes compared at fixed loads in randomised,
//! interleaved blocks with an A/A arm (the design is [`super::design`]).
//!
//! At each (cores, threads, rate), block `b` runs every arm once — every
//! proxy under every mode, plus the A/A copy of each proxy's reference
//! mode — back to back in the order [`design::block_order`] draws from the
//! block's seed, all arms with that same generator seed. The loads are
//! given (`--at-rates`, e.g. around the crossing a capacity sweep found),
//! not selected from the comparison's own data, so Table III's selection
//! at the baseline crossing (D1) cannot bias them. Flagged runs (generator
//! behind, shared CPUs, foreign load) drop their pair.

use super::design::{self, Arm, Effect, Verdict};
use super::mode::{mode_by_name, Mode};
use super::sweep::{seed_for, spec_for, Runs, Store, SweepConfig, SweepProgress, TUNED};
use super::{ProxyKind, RunRecord, RunSpec, Tools};
use crate::render::Table;
use serde::Serialize;

/// Most runs one comparison may plan.
pub const MAX_COMPARE_RUNS: usize = 20_000;

/// The effect size the report says how many blocks it would need (%):
/// the papers' smallest PDR gain (Paper A, 26 %).
pub const PAPER_EFFECT_PCT: f64 = 26.0;

/// A comparison: the sweep's settings (proxies, modes, cores, threads,
/// duration, seed, …; `reps` is the number of blocks) at fixed rates.
#[derive(Clone, Debug)]
pub struct CompareConfig {
    /// Settings shared with the sweep; its rate range is unused.
    pub sweep: SweepConfig,
    /// The fixed loads (calls/s).
    pub rates: Vec<f64>,
}

impl CompareConfig {
    /// Check everything before any run; returns the modes in order.
    pub fn validate(&self, tools: &Tools) -> Result<Vec<Mode>, String> {
        if self.rates.is_empty() {
            return Err("--at-rates: give at least one rate".into());
        }
        if let Some(rate) = self
            .rates
            .iter()
            .find(|rate| !(rate.is_finite() && **rate > 0.0))
        {
            return Err(format!("--at-rates: {rate} is not a rate > 0"));
        }
        if self.sweep.modes.iter().any(|m| m == TUNED) {
            return Err("--profiles: tuned runs the tuner; compare its mode file instead".into());
        }
        if self.sweep.reps < 2 {
            return Err("--reps: a paired comparison needs at least 2 blocks".into());
        }
        // The sweep's own checks, over the range of the fixed rates.
        let mut sweep = self.sweep.clone();
        sweep.rate_start = self.rates.iter().copied().fold(f64::INFINITY, f64::min);
        sweep.rate_max = self.rates.iter().copied().fold(0.0, f64::max);
        sweep.rate_step = sweep.rate_max.max(1.0);
        sweep.validate(tools)?;
        let planned = self.planned();
        if planned > MAX_COMPARE_RUNS {
            return Err(format!(
                "the comparison would take {planned} runs (limit {MAX_COMPARE_RUNS})"
            ));
        }
        self.sweep.modes.iter().map(|m| mode_by_name(m)).collect()
    }

    /// Runs the comparison makes.
    pub fn planned(&self) -> usize {
        let sweep = &self.sweep;
        (sweep.modes.len() + 1)
            * sweep.proxies.len()
            * sweep.cores.len()
            * sweep.workers.len()
            * self.rates.len()
            * sweep.reps as usize
    }
}

/// The order one block ran its arms in, reproducible from its seed.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct BlockOrder {
    /// Cores of the block.
    pub cores: usize,
    /// Threads of the block.
    pub workers: usize,
    /// Load (calls/s).
    pub rate: f64,
    /// Block index (the runs' `rep`).
    pub block: u32,
    /// The block's seed: generator seed of every arm, and the order's.
    pub seed: u64,
    /// Arms in the order run (`proxy/label`).
    pub order: Vec<String>,
}

/// What a comparison ran.
#[derive(Clone, Debug, Default, Serialize)]
pub struct CompareOutcome {
    /// The arms.
    pub arms: Vec<Arm>,
    /// Every block's order.
    pub orders: Vec<BlockOrder>,
    /// Every run, in the order made.
    pub records: Vec<RunRecord>,
}

/// The spec of `arm`'s run in block `block` at (cores, workers, rate).
fn arm_spec(
    cfg: &CompareConfig,
    modes: &[Mode],
    arm: &Arm,
    point: (usize, usize, f64),
    block: u32,
) -> RunSpec {
    let (cores, workers, rate) = point;
    let mode = modes
        .iter()
        .zip(&cfg.sweep.modes)
        .find(|(m, arg)| m.name == arm.mode || **arg == arm.mode)
        .map(|(m, _)| m)
        .expect("every arm's mode is one of the modes");
    let seed = seed_for(cfg.sweep.seed, workers, cores, rate, block);
    spec_for(
        &cfg.sweep,
        arm.proxy,
        cores,
        workers,
        &arm.label,
        mode.resolve(cores, workers),
        rate,
        block,
        seed,
    )
}

/// Run (or resume) the comparison.
pub fn run_compare(
    cfg: &CompareConfig,
    tools: &Tools,
    store: &mut Store,
    progress: &mut dyn SweepProgress,
    mut runner: impl FnMut(&RunSpec, &Tools) -> RunRecord,
) -> anyhow::Result<CompareOutcome> {
    let modes = cfg.validate(tools).map_err(anyhow::Error::msg)?;
    let names: Vec<String> = modes.iter().map(|m| m.name.clone()).collect();
    let arms = design::arms(&cfg.sweep.proxies, &names);
    let mut runs = Runs::new(store, progress, &mut runner, cfg.planned());
    let mut out = CompareOutcome {
        arms: arms.clone(),
        ..CompareOutcome::default()
    };
    for &cores in &cfg.sweep.cores {
        for &workers in &cfg.sweep.workers {
            for &rate in &cfg.rates {
                for block in 0..cfg.sweep.reps {
                    let seed = seed_for(cfg.sweep.seed, workers, cores, rate, block);
                    let order = design::block_order(seed, u64::from(block), arms.len());
                    out.orders.push(BlockOrder {
                        cores,
                        workers,
                        rate,
                        block,
                        seed,
                        order: order
                            .iter()
                            .map(|&i| format!("{}/{}", arms[i].proxy.name(), arms[i].label))
                            .collect(),
                    });
                    for i in order {
                        let spec = arm_spec(cfg, &modes, &arms[i], (cores, workers, rate), block);
                        out.records.push(runs.get(&spec, tools));
                    }
                    if let Some(error) = runs.err.take() {
                        return Err(error.context("cannot append to runs.jsonl"));
                    }
                }
            }
        }
    }
    Ok(out)
}

/// A measure compared between arms.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Serialize)]
pub enum Metric {
    /// The papers' packet drop rate (%).
    Pdr,
    /// Mean K_rcv over all messages (µs; ringway only).
    KRcv,
    /// Mean T_sip over all messages (µs; ringway only).
    TSip,
    /// Failed calls (% of attempted).
    FailedCalls,
}

impl Metric {
    /// Every metric, in report order.
    pub const ALL: [Metric; 4] = [Metric::Pdr, Metric::KRcv, Metric::TSip, Metric::FailedCalls];

    /// Name in tables.
    pub fn name(self) -> &'static str {
        match self {
            Metric::Pdr => "PDR %",
            Metric::KRcv => "K_rcv µs",
            Metric::TSip => "T_sip µs",
            Metric::FailedCalls => "failed calls %",
        }
    }

    /// Its value in a valid run (`None`: flagged, failed or not measured).
    pub fn of(self, r: &RunRecord) -> Option<f64> {
        if !r.valid() {
            return None;
        }
        let lat = |f: fn(&super::TypeLat) -> &super::Lat| {
            r.all
                .as_ref()
                .map(f)
                .filter(|l| l.count > 0)
                .map(|l| l.mean_us)
        };
        match self {
            Metric::Pdr => Some(100.0 * r.pdr),
            Metric::KRcv => lat(|t| &t.k_rcv),
            Metric::TSip => lat(|t| &t.t_sip),
            Metric::FailedCalls => Some(100.0 * r.failed_ratio),
        }
    }
}

/// One comparison of an arm against its proxy's reference arm.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Row {
    /// Proxy.
    pub proxy: ProxyKind,
    /// Cores.
    pub cores: usize,
    /// Threads.
    pub workers: usize,
    /// Load (calls/s).
    pub rate: f64,
    /// What is compared.
    pub metric: Metric,
    /// The arm (the A/A copy's row is the noise floor itself).
    pub arm: String,
    /// The reference arm.
    pub reference: String,
    /// Mean of the reference over the arm's valid runs.
    pub ref_mean: Option<f64>,
    /// Mean of the arm over its valid runs.
    pub arm_mean: Option<f64>,
    /// Paired effect (`None`: fewer than two pairs, or a reference of 0).
    pub effect: Option<Effect>,
    /// The A/A noise floor at this point and metric (%).
    pub floor: Option<f64>,
    /// The judgement (`None` on the A/A row).
    pub verdict: Option<Verdict>,
    /// Blocks needed to detect [`PAPER_EFFECT_PCT`] with this spread.
    pub blocks_for_paper_effect: Option<usize>,
}

fn mean(xs: impl Iterator<Item = f64>) -> Option<f64> {
    let values: Vec<f64> = xs.collect();
    (!values.is_empty()).then(|| values.iter().sum::<f64>() / values.len() as f64)
}

/// The comparison rows of one point (proxy, cores, workers, rate) for
/// `blocks` blocks: `run(arm, block)` is that arm's run, if any. Per
/// metric, the A/A row first (its effect is the floor), then every other
/// arm against the reference, judged against that floor.
pub fn analyse_point(
    arms: &[Arm],
    point: (ProxyKind, usize, usize, f64),
    blocks: u32,
    run: &dyn Fn(&Arm, u32) -> Option<RunRecord>,
) -> Vec<Row> {
    let (proxy, cores, workers, rate) = point;
    let mine: Vec<&Arm> = arms.iter().filter(|a| a.proxy == proxy).collect();
    let Some(reference) = mine.first() else {
        return Vec::new();
    };
    let all_alone = mine.iter().find(|a| a.is_aa());
    let mut rows = Vec::new();
    for metric in Metric::ALL {
        let values = |arm: &Arm| -> Vec<Option<f64>> {
            (0..blocks)
                .map(|b| run(arm, b).and_then(|r| metric.of(&r)))
                .collect()
        };
        let ref_values = values(reference);
        if ref_values.iter().all(Option::is_none) {
            continue; // not measured for this proxy (K_rcv of Kamailio)
        }
        let floor = all_alone
            .and_then(|all_alone| design::paired_effect(&ref_values, &values(all_alone)))
            .map(|e| design::noise_floor(&e));
        // The A/A row first, then the others.
        let ordered = all_alone
            .into_iter()
            .chain(mine.iter().filter(|a| !a.is_aa()).skip(1));
        for arm in ordered {
            let arm_values = values(arm);
            let effect = design::paired_effect(&ref_values, &arm_values);
            let paired = |v: &[Option<f64>], other: &[Option<f64>]| {
                mean(v.iter().zip(other).filter_map(|(x, o)| o.and(*x)))
            };
            rows.push(Row {
                proxy,
                cores,
                workers,
                rate,
                metric,
                arm: arm.label.clone(),
                reference: reference.label.clone(),
                ref_mean: paired(&ref_values, &arm_values),
                arm_mean: paired(&arm_values, &ref_values),
                effect,
                floor,
                verdict: (!arm.is_aa())
                    .then(|| effect.map(|e| design::verdict(&e, floor)))
                    .flatten(),
                blocks_for_paper_effect: effect
                    .and_then(|e| design::pairs_needed(e.sd_pct, PAPER_EFFECT_PCT)),
            });
        }
    }
    rows
}

/// Every row of a finished comparison.
pub fn analyse(cfg: &CompareConfig, out: &CompareOutcome) -> Vec<Row> {
    let modes: Vec<Mode> = cfg
        .sweep
        .modes
        .iter()
        .filter_map(|m| mode_by_name(m).ok())
        .collect();
    let by_key: std::collections::HashMap<&str, &RunRecord> =
        out.records.iter().map(|r| (r.key.as_str(), r)).collect();
    let mut rows = Vec::new();
    for &proxy in &cfg.sweep.proxies {
        for &cores in &cfg.sweep.cores {
            for &workers in &cfg.sweep.workers {
                for &rate in &cfg.rates {
                    let run = |arm: &Arm, block: u32| {
                        let spec = arm_spec(cfg, &modes, arm, (cores, workers, rate), block);
                        by_key.get(spec.key().as_str()).map(|r| (*r).clone())
                    };
                    rows.extend(analyse_point(
                        &out.arms,
                        (proxy, cores, workers, rate),
                        cfg.sweep.reps,
                        &run,
                    ));
                }
            }
        }
    }
    rows
}

fn num(v: Option<f64>, digits: usize) -> String {
    v.filter(|x| x.is_finite())
        .map_or("n/a".into(), |x| format!("{x:.digits$}"))
}

/// The comparison table: every "% lower" with its CI, the A/A floor
/// beside it, the MDE and the verdict.
pub fn table(rows: &[Row]) -> Table {
    let mut out = Table::new(
        "Paired comparisons at fixed loads (% lower than the reference; A/A = the reference run twice)",
        &[
            "proxy",
            "cores",
            "threads",
            "rate",
            "metric",
            "arm",
            "reference",
            "ref mean",
            "arm mean",
            "% lower (95% CI)",
            "A/A floor %",
            "MDE %",
            "pairs",
            "verdict",
            "blocks for 26 %",
        ],
    );
    for r in rows {
        let (lower, mde, pairs) = match &r.effect {
            Some(e) => (
                format!("{:.1} ± {:.1}", e.lower_pct, e.ci_pct),
                format!("{:.1}", e.mde_pct),
                e.pairs.to_string(),
            ),
            None => (
                "n/a (< 2 pairs or reference 0)".into(),
                "n/a".into(),
                "<2".into(),
            ),
        };
        let is_aa = r.arm.ends_with(design::AA_SUFFIX);
        out.rows.push(vec![
            r.proxy.name().into(),
            r.cores.to_string(),
            r.workers.to_string(),
            format!("{:.0}", r.rate),
            r.metric.name().into(),
            r.arm.clone(),
            r.reference.clone(),
            num(r.ref_mean, 3),
            num(r.arm_mean, 3),
            lower,
            num(r.floor, 1),
            mde,
            pairs,
            match (&r.verdict, is_aa) {
                (_, true) => "A/A: the noise floor".into(),
                (Some(v), false) => v.to_string(),
                (None, false) => "n/a".into(),
            },
            r.blocks_for_paper_effect
                .map_or("n/a".into(), |n| n.to_string()),
        ]);
    }
    out
}

/// The comparison report: the design (seed, arms, every block's order),
/// the runs left out and why, and the table.
pub fn report_markdown(
    cfg: &CompareConfig,
    out: &CompareOutcome,
    rows: &[Row],
    command: &str,
    notes: &[String],
) -> String {
    use std::fmt::Write as _;
    let sweep = &cfg.sweep;
    let mut markdown = String::from("# SIP lab: paired comparison at fixed loads\n\n");
    let _ = writeln!(markdown, "Command: `{command}`\n");
    let _ = writeln!(
        markdown,
        "Design: {} block(s) per point; each block runs every arm once, back to back, in an order drawn from the block's seed (base seed {}), every arm with that generator seed. \
         The A/A arm runs the reference mode a second time under its own label: its difference from the reference is the noise floor. \
         Effects are paired per block: % lower = 100 · mean(ref − arm) / mean(ref), 95 % CI (Student t), MDE at 80 % power. \
         A result whose CI includes 0 or lies within the A/A floor is not distinguishable from noise. \
         Runs {} s each; emulated service time: {}.\n",
        sweep.reps,
        sweep.seed,
        sweep.duration_s,
        sweep.service.map_or("off".to_string(), |t| format!("{t} µs (ringway only)")),
    );
    for n in notes {
        let _ = writeln!(markdown, "- {n}");
    }
    let _ = writeln!(markdown, "\n{}", table(rows).markdown());
    let left_out: Vec<&RunRecord> = out.records.iter().filter(|r| !r.valid()).collect();
    let _ = writeln!(
        markdown,
        "\n## Runs left out ({} of {})\n",
        left_out.len(),
        out.records.len()
    );
    for r in left_out {
        let why = r.error.clone().unwrap_or_else(|| r.flags.join("; "));
        let _ = writeln!(
            markdown,
            "- {} {} c{} w{} {:.0} cps block {}: {why}",
            r.spec.proxy.name(),
            r.spec.sched,
            r.spec.cores,
            r.spec.workers,
            r.spec.rate,
            r.spec.rep
        );
    }
    let _ = writeln!(
        markdown,
        "\n## Block orders (reproducible from the seeds)\n"
    );
    for o in &out.orders {
        let _ = writeln!(
            markdown,
            "- c{} w{} {:.0} cps block {} seed {}: {}",
            o.cores,
            o.workers,
            o.rate,
            o.block,
            o.seed,
            o.order.join(", ")
        );
    }
    markdown
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::siplab::sweep::tests_support::{quiet, test_cfg, test_tools};

    fn cfg() -> CompareConfig {
        let mut sweep = test_cfg();
        sweep.modes = vec!["baseline".into(), "enhanced".into()];
        sweep.reps = 6;
        CompareConfig {
            sweep,
            rates: vec![400.0, 800.0],
        }
    }

    /// Synthetic runs: PDR 2 % for the reference mode (either label),
    /// 1 % for enhanced, plus a per-block drift every arm shares and a
    /// small per-run jitter.
    fn synthetic(s: &RunSpec, _: &Tools) -> RunRecord {
        let mut r = RunRecord::empty(s);
        let drift = 0.004 * f64::from(s.rep % 3);
        let jitter = 0.0005 * ((s.seed ^ s.sched.len() as u64) % 3) as f64;
        let base = if s.sched.starts_with("baseline") {
            0.02
        } else {
            0.01
        };
        r.pdr = base + drift + jitter;
        r.failed_ratio = 0.0;
        r
    }

    #[test]
    fn every_block_runs_every_arm_with_its_aa_copy_in_a_recorded_random_order() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = Store::open(dir.path()).unwrap();
        let c = cfg();
        let out = run_compare(&c, &test_tools(), &mut store, &mut quiet(), synthetic).unwrap();
        // 3 arms (baseline, baseline#aa, enhanced) × 2 rates × 6 blocks.
        assert_eq!(out.records.len(), 36);
        assert_eq!(out.orders.len(), 12);
        for (i, o) in out.orders.iter().enumerate() {
            let mut arms = o.order.clone();
            arms.sort();
            assert_eq!(
                arms,
                [
                    "ringway/baseline",
                    "ringway/baseline#aa",
                    "ringway/enhanced"
                ]
            );
            // Every arm of a block shares the block's seed; the runs
            // follow the recorded order.
            let runs = &out.records[3 * i..3 * i + 3];
            assert!(runs
                .iter()
                .all(|r| r.spec.seed == o.seed && r.spec.rep == o.block));
            let labels: Vec<String> = runs
                .iter()
                .map(|r| format!("ringway/{}", r.spec.sched))
                .collect();
            assert_eq!(labels, o.order);
            // The A/A copy applies the reference's knobs.
            let knobs = |l: &str| {
                runs.iter()
                    .find(|r| r.spec.sched == l)
                    .unwrap()
                    .spec
                    .knobs
                    .clone()
            };
            assert_eq!(knobs("baseline"), knobs("baseline#aa"));
        }
        // Interleaved and randomised: not the same order in every block.
        assert!(out.orders.windows(2).any(|w| w[0].order != w[1].order));
        // Reproducible: a second comparison on a new store runs the same orders.
        let dir2 = tempfile::tempdir().unwrap();
        let mut store2 = Store::open(dir2.path()).unwrap();
        let again = run_compare(&c, &test_tools(), &mut store2, &mut quiet(), synthetic).unwrap();
        assert_eq!(again.orders, out.orders);
        // Rows: per rate, PDR and failed calls (K_rcv/T_sip not measured
        // here), each with the A/A row and enhanced judged against it.
        let rows = analyse(&c, &out);
        let pdr: Vec<&Row> = rows.iter().filter(|r| r.metric == Metric::Pdr).collect();
        assert_eq!(pdr.len(), 4, "{rows:#?}");
        let aa = pdr
            .iter()
            .find(|r| r.arm == "baseline#aa" && r.rate == 400.0)
            .unwrap();
        let floor = aa.floor.unwrap();
        assert!(floor > 0.0 && floor < 10.0, "{floor}");
        let enh = pdr
            .iter()
            .find(|r| r.arm == "enhanced" && r.rate == 400.0)
            .unwrap();
        assert_eq!(enh.floor, Some(floor));
        // 2 % vs 1 % plus drift: about 40 % lower, clearly above the floor.
        let e = enh.effect.unwrap();
        assert!(e.lower_pct > 30.0 && e.lower_pct < 50.0, "{e:?}");
        assert_eq!(enh.verdict, Some(Verdict::Lower));
        let text = table(&rows).text();
        assert!(
            text.contains("A/A: the noise floor") && text.contains("lower"),
            "{text}"
        );
    }

    #[test]
    fn flagged_runs_drop_their_pair_and_without_the_aa_arm_nothing_is_judged() {
        let arms = design::arms(
            &[ProxyKind::Ringway],
            &["baseline".into(), "enhanced".into()],
        );
        let spec = {
            let c = cfg();
            spec_for(
                &c.sweep,
                ProxyKind::Ringway,
                1,
                2,
                "x",
                Default::default(),
                400.0,
                0,
                1,
            )
        };
        let run = |arm: &Arm, block: u32| {
            let mut r = RunRecord::empty(&spec);
            r.pdr = if arm.label == "enhanced" { 0.01 } else { 0.02 } + 0.001 * f64::from(block);
            if arm.label == "enhanced" && block == 0 {
                r.flags.push("generator fell behind".into());
            }
            Some(r)
        };
        let rows = analyse_point(&arms, (ProxyKind::Ringway, 1, 2, 400.0), 4, &run);
        let enh = rows
            .iter()
            .find(|r| r.arm == "enhanced" && r.metric == Metric::Pdr)
            .unwrap();
        assert_eq!(
            enh.effect.unwrap().pairs,
            3,
            "the flagged block is left out"
        );
        // The identical A/A copies give a floor of 0: any CI off 0 is beyond it.
        assert_eq!(enh.floor, Some(0.0));
        // The same data without the A/A arm: no floor, no verdict.
        let no_aa: Vec<Arm> = arms.iter().filter(|a| !a.is_aa()).cloned().collect();
        let rows = analyse_point(&no_aa, (ProxyKind::Ringway, 1, 2, 400.0), 4, &run);
        let enh = rows
            .iter()
            .find(|r| r.arm == "enhanced" && r.metric == Metric::Pdr)
            .unwrap();
        assert_eq!(enh.floor, None);
        assert_eq!(enh.verdict, Some(Verdict::NoFloor));
    }

    #[test]
    fn bad_comparisons_are_refused() {
        let mut c = cfg();
        c.rates.clear();
        assert!(c
            .validate(&test_tools())
            .unwrap_err()
            .contains("--at-rates"));
        let mut c = cfg();
        c.sweep.reps = 1;
        assert!(c.validate(&test_tools()).unwrap_err().contains("2 blocks"));
        let mut c = cfg();
        c.sweep.modes.push(TUNED.into());
        assert!(c.validate(&test_tools()).unwrap_err().contains("tuned"));
        let mut c = cfg();
        c.rates = vec![-1.0];
        assert!(c.validate(&test_tools()).is_err());
    }
}
