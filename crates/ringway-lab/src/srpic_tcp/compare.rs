//! SRPIC on against off, per cell and placement, judged against its own
//! noise: the runs of one block (a cell and a repetition: off, its A/A
//! copy `off#aa` and on with every placement asked for, in a random
//! recorded order, the same relay seed) are paired.
//!
//! - **Throughput effect**: % change = 100 · mean(on − off) / mean(off)
//!   over the blocks where both have a valid run, 95 % CI (Student t),
//!   minimum detectable effect at 80 % power, and the repetitions the
//!   observed effect would need ([`crate::siplab::design`]).
//! - **A/A floor**: the same for `off#aa` against `off`; an effect within
//!   it, or whose CI includes 0, is "not distinguishable from noise", and
//!   the report then says which effect the data rule out ("no effect above
//!   X %", X the farther end of the CI).
//! - **Collapse**: a run collapsed when its throughput stayed below
//!   `--collapse-below` % of the link rate (N-SRPIC on Linux 6.18 is
//!   bistable: at line rate, or at 15-21 % of it once a recovery is kept).
//!   Per arm the share with its Wilson 95 % interval, and Fisher's exact
//!   test of off against on.

use super::relay::Placement;
use super::{Cell, RunResult, TcpLabConfig, OFF, OFF_AA};
use crate::render::{self, Digits, Table};
use crate::siplab::design::{self, Effect, Verdict};
use crate::stats::{fisher_exact, mean_ci, wilson, MeanCi};
use serde::Serialize;

/// Collapsed runs of one arm of a cell.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Collapse {
    /// Runs that collapsed.
    pub collapsed: usize,
    /// Valid runs.
    pub runs: usize,
    /// Wilson 95 % interval of the share (`None` without runs).
    pub interval: Option<(f64, f64)>,
}

/// One cell's comparison.
#[derive(Clone, Debug, Serialize)]
pub struct Comparison {
    /// The cell.
    pub cell: Cell,
    /// SRPIC's placement in the `on` arm compared.
    pub placement: Placement,
    /// That arm's label ([`Placement::arm`]).
    pub arm: String,
    /// Throughput of SRPIC off (Mb/s; valid runs).
    pub off: MeanCi,
    /// Throughput of the A/A copy of off.
    pub aa: MeanCi,
    /// Throughput of SRPIC on.
    pub on: MeanCi,
    /// On against off, paired per block (`lower_pct` > 0: SRPIC slower).
    pub effect: Option<Effect>,
    /// The A/A floor (%): |off#aa − off| plus its CI half-width.
    pub floor_pct: Option<f64>,
    /// The judgement of `effect` against the floor.
    pub verdict: Option<Verdict>,
    /// The 95 % CIs of off and on overlap (the goal: they do not).
    pub cis_overlap: Option<bool>,
    /// Repetitions the observed effect would need to be detected (80 %
    /// power, α = 0.05).
    pub reps_for_observed: Option<usize>,
    /// Collapsed runs: off, off#aa, on.
    pub collapse: [Collapse; 3],
    /// Fisher's exact test (two-sided) of collapses off against on.
    pub collapse_p: Option<f64>,
    /// [`judgement`] in words (for the report).
    pub judgement: String,
}

fn valid<'a>(all: &'a [RunResult], cell: &Cell, arm: &str) -> Vec<&'a RunResult> {
    all.iter()
        .filter(|r| r.cell == *cell && r.arm == arm && r.flagged.is_none())
        .collect()
}

/// Per repetition 0..reps, the arm's throughput (None: no valid run).
fn by_rep(runs: &[&RunResult], reps: usize) -> Vec<Option<f64>> {
    (0..reps)
        .map(|rep| {
            runs.iter()
                .find(|r| r.rep == rep)
                .map(|r| r.iperf.mbps)
                .filter(|v| v.is_finite())
        })
        .collect()
}

fn collapse(runs: &[&RunResult], below_pct: f64) -> Collapse {
    let collapsed = runs.iter().filter(|r| r.collapsed(below_pct)).count();
    Collapse {
        collapsed,
        runs: runs.len(),
        interval: wilson(collapsed, runs.len()),
    }
}

/// The comparison of every cell run with SRPIC on and off, one row per
/// placement.
pub fn compare(c: &TcpLabConfig, all: &[RunResult]) -> Vec<Comparison> {
    let reps = all.iter().map(|r| r.rep + 1).max().unwrap_or(0);
    let mut out = Vec::new();
    for cell in c.cells() {
        let arms = c.arms(&cell);
        for &placement in &c.placements {
            if arms.contains(&placement.arm()) {
                out.push(compare_arm(c, all, cell, placement, reps));
            }
        }
    }
    out
}

/// One cell's SRPIC arm with `placement` against off.
fn compare_arm(
    c: &TcpLabConfig,
    all: &[RunResult],
    cell: Cell,
    placement: Placement,
    reps: usize,
) -> Comparison {
    let (off, aa, on) = (
        valid(all, &cell, OFF),
        valid(all, &cell, OFF_AA),
        valid(all, &cell, placement.arm()),
    );
    let throughput = |runs: &[&RunResult]| {
        mean_ci(
            &runs
                .iter()
                .map(|r| r.iperf.mbps)
                .filter(|v| v.is_finite())
                .collect::<Vec<_>>(),
        )
    };
    let reference = by_rep(&off, reps);
    let effect = design::paired_effect(&reference, &by_rep(&on, reps));
    let floor =
        design::paired_effect(&reference, &by_rep(&aa, reps)).map(|e| design::noise_floor(&e));
    let (m_off, m_on) = (throughput(&off), throughput(&on));
    let cis_overlap = (m_off.n >= 2 && m_on.n >= 2).then_some(
        m_off.mean - m_off.ci95 <= m_on.mean + m_on.ci95
            && m_on.mean - m_on.ci95 <= m_off.mean + m_off.ci95,
    );
    let collapse = [
        collapse(&off, c.collapse_below_pct),
        collapse(&aa, c.collapse_below_pct),
        collapse(&on, c.collapse_below_pct),
    ];
    let collapse_p = (collapse[0].runs > 0 && collapse[2].runs > 0).then(|| {
        fisher_exact(
            collapse[0].collapsed,
            collapse[0].runs - collapse[0].collapsed,
            collapse[2].collapsed,
            collapse[2].runs - collapse[2].collapsed,
        )
    });
    let mut row = Comparison {
        cell,
        placement,
        arm: placement.arm().into(),
        aa: throughput(&aa),
        off: m_off,
        on: m_on,
        effect,
        floor_pct: floor,
        verdict: effect.map(|e| design::verdict(&e, floor)),
        cis_overlap,
        reps_for_observed: effect.and_then(|e| design::pairs_needed(e.sd_pct, e.lower_pct.abs())),
        collapse,
        collapse_p,
        judgement: String::new(),
    };
    row.judgement = judgement(&row);
    row
}

/// "k/n (lo-hi %)" of a [`Collapse`].
fn share(c: &Collapse) -> String {
    match c.interval {
        Some((low, high)) => format!(
            "{}/{} ({:.0}-{:.0} %)",
            c.collapsed,
            c.runs,
            100.0 * low,
            100.0 * high
        ),
        None => "n/a".into(),
    }
}

/// What the comparison says about SRPIC, in words.
pub fn judgement(row: &Comparison) -> String {
    match (&row.verdict, &row.effect) {
        (Some(Verdict::Lower), _) => "SRPIC slower (beyond noise)".into(),
        (Some(Verdict::Higher), _) => "SRPIC faster (beyond noise)".into(),
        (Some(Verdict::Noise(why)), Some(e)) => {
            let (low, high) = e.ci();
            format!(
                "not distinguishable from noise ({why}): no effect above {:.1} %",
                low.abs().max(high.abs())
            )
        }
        (Some(Verdict::NoFloor), _) => "no A/A floor: not judged".into(),
        _ => "n/a (< 2 pairs)".into(),
    }
}

/// The comparison table (text, Markdown).
pub fn table(rows: &[Comparison]) -> Table {
    let mut table = Table::new(
        "SRPIC on vs off, paired per block (same seed); A/A = SRPIC off run twice",
        &[
            "table",
            "SRPIC arm",
            "sender",
            "streams",
            "β %",
            "δ %",
            "N-SRPIC Mb/s",
            "A/A Mb/s",
            "SRPIC Mb/s",
            "change % (95% CI)",
            "A/A floor %",
            "MDE %",
            "pairs",
            "CIs overlap",
            "verdict",
            "reps for this effect",
            "collapsed N-SRPIC",
            "A/A",
            "SRPIC",
            "Fisher p",
        ],
    );
    for r in rows {
        let mbps = |m: &MeanCi| render::mean_ci(m, Digits::Fixed(2));
        table.rows.push(vec![
            format!("{:?}", r.cell.table),
            r.arm.clone(),
            r.cell.sender.name().to_string(),
            r.cell.streams.to_string(),
            super::report::pct(r.cell.beta),
            super::report::pct(r.cell.delta),
            mbps(&r.off),
            mbps(&r.aa),
            mbps(&r.on),
            r.effect.map_or("n/a".into(), |e| {
                format!("{:+.1} ± {:.1}", -e.lower_pct, e.ci_pct)
            }),
            render::opt(r.floor_pct, 1),
            render::opt(r.effect.map(|e| e.mde_pct), 1),
            r.effect.map_or("<2".into(), |e| e.pairs.to_string()),
            r.cis_overlap
                .map_or("n/a".into(), |o| if o { "yes" } else { "no" }.to_string()),
            judgement(r),
            r.reps_for_observed.map_or("n/a".into(), |n| n.to_string()),
            share(&r.collapse[0]),
            share(&r.collapse[1]),
            share(&r.collapse[2]),
            render::opt(r.collapse_p, 3),
        ]);
    }
    table
}

/// What the comparison table's columns mean.
pub const LEGEND: &str = "(change: 100 · mean(on − off) / mean(off) over blocks with both runs valid, + = SRPIC faster; \
A/A floor: the same for off#aa against off, |mean| + CI half-width; MDE: smallest effect these pairs detect at 80 % power; \
collapsed: runs below --collapse-below % of the link rate, with the Wilson 95 % interval; Fisher p: exact test of the \
collapses off vs on; n/a: no data)\n";

#[cfg(test)]
mod tests {
    use super::super::hosts::{IperfResult, SenderProfile};
    use super::super::Table as Experiment;
    use super::super::ON;
    use super::*;

    fn config(aa: bool) -> TcpLabConfig {
        TcpLabConfig {
            rate_mbps: 100.0,
            alpha_ms: 2.5,
            duration_s: 50.0,
            reps: 5,
            block: 32,
            ring: 512,
            seed: 1,
            tables: vec![Experiment::T4],
            betas: vec![0.005],
            deltas: vec![],
            streams: vec![1],
            senders: vec![SenderProfile::S],
            beta_loss: 0.004,
            sweep: vec![],
            max_late_us: 1000.0,
            timestamps: false,
            placements: vec![Placement::Listing1],
            scale_alpha: true,
            router: None,
            aa,
            collapse_below_pct: 50.0,
        }
    }

    fn run(c: &TcpLabConfig, arm: &str, rep: usize, mbps: f64) -> RunResult {
        RunResult {
            cell: c.cells()[0],
            srpic: arm == ON,
            arm: arm.into(),
            rep,
            block: rep,
            order: 0,
            iperf: IperfResult {
                mbps,
                seconds: 50.0,
                congestion: "cubic".into(),
                ..IperfResult::default()
            },
            relay: Default::default(),
            sender_nstat: Default::default(),
            recovery: Default::default(),
            receiver_nstat: Default::default(),
            sender_cpu_s: 1.0,
            receiver_cpu_s: 1.0,
            flagged: None,
            loadavg1: 0.2,
            sender_sysctls: Default::default(),
        }
    }

    /// The closing note's β 0.5 % cell: N-SRPIC bistable, SRPIC at line rate.
    fn note_cell(c: &TcpLabConfig) -> Vec<RunResult> {
        let off = [96.6, 96.6, 18.3, 17.6, 96.7];
        let aa = [96.7, 17.9, 96.6, 96.6, 96.5];
        let on = [96.7, 96.7, 96.7, 96.6, 96.7];
        let mut runs = Vec::new();
        for rep in 0..5 {
            runs.push(run(c, OFF, rep, off[rep]));
            runs.push(run(c, OFF_AA, rep, aa[rep]));
            runs.push(run(c, ON, rep, on[rep]));
        }
        runs
    }

    #[test]
    fn a_bistable_cell_is_judged_against_its_aa_floor() {
        let c = config(true);
        let runs = note_cell(&c);
        let rows = compare(&c, &runs);
        assert_eq!(rows.len(), 1);
        let r = &rows[0];
        // Paired change: mean(on − off) = (0.1 + 0.1 + 78.4 + 79 + 0)/5 =
        // 31.52 over mean(off) 65.16: +48.4 %.
        let e = r.effect.unwrap();
        assert!((-e.lower_pct - 48.37).abs() < 0.05, "{e:?}");
        assert_eq!(e.pairs, 5);
        // The A/A copy collapsed once too: its floor is wide, the CI of
        // the effect includes 0, and the table says what is ruled out.
        let floor = r.floor_pct.unwrap();
        assert!(floor > 20.0, "{floor}");
        assert!(
            matches!(r.verdict, Some(Verdict::Noise(_))),
            "{:?}",
            r.verdict
        );
        assert!(judgement(r).contains("no effect above"), "{}", judgement(r));
        assert_eq!(r.cis_overlap, Some(true));
        // Collapses: 2/5 off, 1/5 A/A, 0/5 on; Fisher p = 0.444.
        assert_eq!((r.collapse[0].collapsed, r.collapse[0].runs), (2, 5));
        assert_eq!(r.collapse[1].collapsed, 1);
        assert_eq!(r.collapse[2].collapsed, 0);
        assert!((r.collapse_p.unwrap() - 0.444_444).abs() < 1e-5);
        let text = table(&rows).text();
        assert!(text.contains("2/5 (") && text.contains("0/5 ("), "{text}");
        assert!(table(&rows)
            .markdown()
            .contains("| T4 | on | S-Sender | 1 | 0.5 |"));
    }

    #[test]
    fn without_the_aa_arm_nothing_is_judged() {
        let c = config(true);
        let runs: Vec<RunResult> = note_cell(&c)
            .into_iter()
            .filter(|r| r.arm != OFF_AA)
            .collect();
        let r = &compare(&c, &runs)[0];
        assert_eq!(r.floor_pct, None);
        assert_eq!(r.verdict, Some(Verdict::NoFloor));
        assert_eq!(r.collapse[1].interval, None);
        assert!(table(std::slice::from_ref(r)).text().contains("n/a"));
    }

    #[test]
    fn a_clear_effect_beyond_the_floor_and_flagged_runs_left_out() {
        let c = config(true);
        let mut runs = Vec::new();
        for rep in 0..5 {
            let wobble = [0.2, -0.1, 0.0, 0.1, -0.2][rep];
            runs.push(run(&c, OFF, rep, 40.0 + wobble));
            runs.push(run(&c, OFF_AA, rep, 40.0 - wobble));
            runs.push(run(&c, ON, rep, 90.0 + wobble));
        }
        // A flagged run (the relay fell behind) drops its pair only.
        let mut late = run(&c, ON, 4, 5.0);
        late.flagged = Some("relay fell behind".into());
        runs.retain(|r| !(r.arm == ON && r.rep == 4));
        runs.push(late);
        let r = &compare(&c, &runs)[0];
        assert_eq!(r.effect.unwrap().pairs, 4);
        assert!((-r.effect.unwrap().lower_pct - 125.0).abs() < 1.0);
        assert_eq!(r.verdict, Some(Verdict::Higher));
        assert_eq!(judgement(r), "SRPIC faster (beyond noise)");
        assert_eq!(r.cis_overlap, Some(false));
        // 40 Mb/s of 100 is a collapse at 50 %, 90 is not.
        assert_eq!(r.collapse[0].collapsed, 5);
        assert_eq!(
            r.collapse[2],
            Collapse {
                collapsed: 0,
                runs: 4,
                interval: wilson(0, 4)
            }
        );
    }

    #[test]
    fn the_plan_interleaves_off_its_aa_copy_and_on_in_random_recorded_order() {
        let c = config(true);
        let plan = c.plan();
        assert_eq!(plan.len(), 5 * 3);
        for (block, runs) in plan.chunks(3).enumerate() {
            let mut arms: Vec<&str> = runs.iter().map(|r| r.arm).collect();
            arms.sort();
            assert_eq!(arms, [OFF, OFF_AA, ON]);
            assert!(runs.iter().all(|r| r.block == block && r.rep == block));
        }
        let firsts: std::collections::BTreeSet<&str> = plan.chunks(3).map(|b| b[0].arm).collect();
        assert!(firsts.len() > 1, "{firsts:?}");
        assert_eq!(plan, c.plan());
        assert_eq!(config(false).plan().len(), 5 * 2);
        // The state file's fingerprint ignores the repetitions only.
        let more = TcpLabConfig {
            reps: 20,
            ..config(true)
        };
        assert_eq!(more.fingerprint(), c.fingerprint());
        let other = TcpLabConfig {
            collapse_below_pct: 40.0,
            ..config(true)
        };
        assert_ne!(other.fingerprint(), c.fingerprint());
        // A run reads back from a state file (NaN lateness and all).
        let mut r = run(&c, ON, 0, 96.7);
        r.relay.late_us = (f64::NAN, f64::NAN, f64::NAN);
        let back: RunResult = serde_json::from_str(&serde_json::to_string(&r).unwrap()).unwrap();
        assert!(back.relay.late_us.1.is_nan());
        assert_eq!(
            back.key(),
            plan.iter()
                .find(|p| p.arm == ON && p.rep == 0)
                .unwrap()
                .key()
        );
    }
}
