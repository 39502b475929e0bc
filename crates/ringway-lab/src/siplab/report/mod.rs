//! Reports of SIP lab sweeps, shaped like the papers: Tables I/II per mode
//! (threads × the two loads around the 1% crossing), Tables III/VI/IX
//! (drop rate and K_rcv at the baseline crossing load, baseline vs enhanced
//! vs tuned, % lower with paired CIs), the best thread count per core
//! count, the capacity model C_{p,c} = T_{p,c} × C_{1,1} with C_{1,1}
//! measured, a queueing check, the six message types, per-thread
//! scheduling statistics, what each mode applied or was refused, the
//! tuner's search and a Fig. 2 analogue; CSV/JSON of every run, SVG plots
//! and an index.html.

use crate::render::{self, esc, svg, Digits, Table};
use crate::siplab::analysis::{
    best_threads, capacity_model, comparisons, model_applies, per_rep_capacity, point_at, points,
    queueing_check, Comparison, ComparisonRow, Lower, MeasuredCapacity, Point, SIX_TYPES,
};
use crate::siplab::model::QueuePrediction;
use crate::siplab::sweep::{Capacity, SweepOutcome};
use crate::siplab::tune::TuneResult;
use crate::siplab::{ProxyKind, RunRecord};
use crate::stats::MeanCi;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

fn ci(m: &MeanCi, digits: usize) -> String {
    render::mean_ci(m, Digits::Fixed(digits))
}

fn opt_ci(m: &Option<MeanCi>, digits: usize) -> String {
    render::opt_mean_ci(m.as_ref(), Digits::Fixed(digits))
}

fn opt(v: Option<f64>, digits: usize) -> String {
    render::opt(v, digits)
}

fn pct(m: &MeanCi) -> MeanCi {
    MeanCi {
        mean: 100.0 * m.mean,
        ci95: 100.0 * m.ci95,
        n: m.n,
    }
}

/// Tables I/II: per (proxy, mode, cores) the two loads around the PDR
/// crossing for every thread count, as columns; rows as in the papers.
pub fn crossing_tables(caps: &[Capacity], pts: &[Point], threshold: f64) -> Vec<Table> {
    let mut groups: BTreeMap<(ProxyKind, usize, String), Vec<&Capacity>> = BTreeMap::new();
    for c in caps {
        groups
            .entry((c.proxy, c.cores, c.profile.clone()))
            .or_default()
            .push(c);
    }
    let mut tables = Vec::new();
    for ((proxy, cores, sched), cs) in groups {
        let mut cols: Vec<(&Capacity, f64, Option<&Point>)> = Vec::new();
        for c in &cs {
            for (rate, _) in [c.below, c.above].into_iter().flatten() {
                cols.push((c, rate, point_at(pts, c, rate)));
            }
        }
        let mut header = vec!["".to_string()];
        header.extend(
            cols.iter()
                .map(|(c, cells, _)| format!("{} thr {:.0} cps", c.workers, cells)),
        );
        let mut table = Table {
            title: format!(
                "Measured performance, {} / {sched} mode, {cores} core(s): loads around the {:.0}% PDR crossing (means ± 95% CI over valid repetitions)",
                proxy.name(),
                100.0 * threshold
            ),
            header,
            rows: Vec::new(),
        };
        let row = |name: &str, f: &dyn Fn(&Point) -> String| -> Vec<String> {
            let mut cells = vec![name.to_string()];
            cells.extend(cols.iter().map(|(_, _, p)| p.map_or("n/a".into(), f)));
            cells
        };
        table
            .rows
            .push(row("Arrival rate (packets/s)", &|p| ci(&p.arrival_pps, 0)));
        table
            .rows
            .push(row("T_sip (µs)", &|p| opt_ci(&p.t_sip_us, 2)));
        table
            .rows
            .push(row("K_rcv (µs)", &|p| opt_ci(&p.k_rcv_us, 2)));
        table
            .rows
            .push(row("Wait after processing (µs; eq. 1: in K_snd)", &|p| {
                opt_ci(&p.wait_us, 2)
            }));
        table
            .rows
            .push(row("K_snd (µs, sampled)", &|p| opt_ci(&p.k_snd_us, 2)));
        table
            .rows
            .push(row("RCV errors (proxy socket drops)", &|p| {
                ci(&p.rcv_errors, 0)
            }));
        table
            .rows
            .push(row("Call-setup drops", &|p| opt_ci(&p.setup_drops, 0)));
        table
            .rows
            .push(row("Call-setup messages", &|p| ci(&p.setup_msgs, 0)));
        table
            .rows
            .push(row("Total messages", &|p| ci(&p.total_msgs, 0)));
        table.rows.push(row("PDR (%)", &|p| ci(&pct(&p.pdr), 3)));
        table
            .rows
            .push(row("Failed calls (%)", &|p| ci(&pct(&p.failed_ratio), 3)));
        table.rows.push(row("Valid / flagged / failed runs", &|p| {
            format!("{} / {} / {}", p.reps, p.flagged, p.errors)
        }));
        if cols.is_empty() {
            table.rows.push(vec!["no successful run".into()]);
        }
        tables.push(table);
    }
    tables
}

/// One repetition of a point: (rep, PDR, K_rcv µs).
/// Plot points (x, y, ci) per (configuration, workers).
type SeriesMap = BTreeMap<(String, usize), Vec<(f64, f64, f64)>>;

/// A "% lower" cell.
fn lower_cell(lower: &Lower) -> String {
    match lower {
        Lower::SameSettings => "same settings applied on this kernel".into(),
        Lower::Paired { pct, ci95, pairs } if *pairs >= 2 => format!("{pct:.1}% ± {ci95:.1}"),
        Lower::Paired { pct, .. } => format!("{pct:.1}% (1 pair)"),
        Lower::NoData => "n/a".into(),
    }
}

/// Tables III/VI/IX: PDR and K_rcv at the baseline crossing load, baseline
/// vs the other modes, % lower paired by repetition.
pub fn comparison_tables(caps: &[Capacity], pts: &[Point]) -> Vec<Table> {
    comparisons(caps, pts)
        .iter()
        .map(comparison_table)
        .collect()
}

fn comparison_table(comparison: &Comparison) -> Table {
    let others = &comparison.others;
    let mut header = vec![
        "Threads and CPS".to_string(),
        "PDR baseline (%)".to_string(),
    ];
    for o in others {
        header.push(format!("PDR {o} (%)"));
        header.push(format!("% lower ({o})"));
    }
    header.push("K_rcv baseline (µs)".into());
    for o in others {
        header.push(format!("K_rcv {o} (µs)"));
        header.push(format!("% lower ({o})"));
    }
    let mut table = Table {
        title: format!(
            "Drop rate and kernel time (K_rcv) comparison at the baseline crossing load, {} on {} core(s) (paired by repetition: same seeds)",
            comparison.proxy.name(),
            comparison.cores
        ),
        header,
        rows: Vec::new(),
    };
    for row in &comparison.rows {
        let (workers, rate, pdr, k_rcv, modes) = match row {
            ComparisonRow::NeverCrossed { workers } => {
                table.rows.push(vec![format!(
                    "{workers} threads: baseline never crossed the threshold"
                )]);
                continue;
            }
            ComparisonRow::At {
                workers,
                rate,
                pdr,
                k_rcv,
                others,
            } => (workers, rate, pdr, k_rcv, others),
        };
        let mut cells = vec![
            format!("{workers} threads, {rate:.0} cps"),
            ci(&pct(pdr), 3),
        ];
        for mode in modes {
            match mode {
                Some(m) => {
                    cells.push(ci(&pct(&m.pdr), 3));
                    cells.push(lower_cell(&m.pdr_lower));
                }
                None => {
                    cells.push("not measured at this load".into());
                    cells.push("n/a".into());
                }
            }
        }
        cells.push(opt_ci(k_rcv, 1));
        for mode in modes {
            match mode {
                Some(m) => {
                    cells.push(opt_ci(&m.k_rcv, 1));
                    cells.push(lower_cell(&m.k_rcv_lower));
                }
                None => {
                    cells.push("n/a".into());
                    cells.push("n/a".into());
                }
            }
        }
        table.rows.push(cells);
    }
    table
}

/// Capacity per configuration with the per-repetition uncertainty.
pub fn capacity_table(caps: &[Capacity], threshold: f64) -> Table {
    let mut table = Table::new(
        "Capacity (highest call rate whose mean PDR over the valid repetitions stays under the threshold; ± from the per-repetition capacities)",
        &["Configuration", "Cores", "Threads", "Capacity (calls/s)", "Per-repetition capacity", "Bracket", "Probes"],
    );
    for c in caps {
        let no_data_above = c
            .probes
            .iter()
            .any(|(r, p)| p.is_none() && c.capacity_cps.is_some_and(|v| *r > v));
        let cap = match c.capacity_cps {
            Some(v) if c.censored && no_data_above => {
                format!("≥ {v:.0} (no valid run above: generator behind or runs failed)")
            }
            Some(v) if c.censored => format!("≥ {v:.0} (never crossed)"),
            Some(v) => format!("{v:.0}"),
            None => match c.above {
                Some((r, _)) => format!("< {r:.0}"),
                None => "n/a (no valid run)".into(),
            },
        };
        let per = per_rep_capacity(c, threshold);
        let best_row = format!(
            "{} .. {}",
            c.below
                .map_or("-".into(), |b| format!("{:.0} ({:.3}%)", b.0, 100.0 * b.1)),
            c.above
                .map_or("-".into(), |b| format!("{:.0} ({:.3}%)", b.0, 100.0 * b.1))
        );
        table.rows.push(vec![
            c.config.clone(),
            c.cores.to_string(),
            c.workers.to_string(),
            cap,
            opt_ci(&per, 0),
            best_row,
            c.probes.len().to_string(),
        ]);
    }
    table
}

/// "capacity (per rep mean ± CI)" of a measured capacity.
fn capacity_cell(m: &MeasuredCapacity) -> String {
    match &m.per_rep {
        Some(per_rep) if per_rep.n >= 2 => format!("{:.0} (per rep {})", m.cps, ci(per_rep, 0)),
        _ => format!("{:.0}", m.cps),
    }
}

/// The best thread count per core count (per proxy and mode).
pub fn best_threads_table(caps: &[Capacity], threshold: f64) -> Table {
    let mut table = Table::new(
        "Best thread count per core count (highest capacity; the model's T_{p,c} for comparison)",
        &[
            "Proxy / mode",
            "Cores",
            "Sockets p",
            "Best threads",
            "Capacity (calls/s)",
            "Model T_{p,c}",
        ],
    );
    for row in best_threads(caps, threshold) {
        table.rows.push(vec![
            format!("{}/{}", row.proxy.name(), row.sched),
            row.cores.to_string(),
            row.sockets.to_string(),
            row.best.as_ref().map_or("n/a".into(), |b| {
                format!(
                    "{}{}",
                    b.workers,
                    if b.censored { " (lower bound)" } else { "" }
                )
            }),
            row.best.as_ref().map_or("n/a".into(), capacity_cell),
            row.model_threads.to_string(),
        ]);
    }
    table
}

/// The capacity model: C_{1,1} measured (1 core, 1 thread), predicted
/// C_{p,c} = T_{p,c} × C_{1,1} against the best measured per core count.
pub fn model_table(caps: &[Capacity], threshold: f64) -> Table {
    let mut table = Table::new(
        "Capacity model C_{p,c} = T_{p,c} × C_{1,1} (T_{1,c} = c + 2, T_{p≥2,c} = c; C_{1,1} measured at 1 core, 1 thread); at c = 1 the model gives 3 × C_{1,1}, contradicting its own definition: it is meant for c ≥ 2",
        &["Proxy / mode", "C_{1,1} (calls/s)", "Cores c", "Sockets p", "T_{p,c}", "Predicted (calls/s)", "Measured best (calls/s)", "Error (%)"],
    );
    for row in capacity_model(caps, threshold) {
        table.rows.push(vec![
            format!("{}/{}", row.proxy.name(), row.sched),
            row.c11.as_ref().map_or_else(
                || "n/a (needs --cores 1 and --workers 1, crossed)".into(),
                capacity_cell,
            ),
            row.cores.to_string(),
            row.sockets.to_string(),
            row.threads.to_string(),
            if model_applies(row.cores) {
                opt(row.predicted, 0)
            } else {
                NOT_MODELLED.into()
            },
            row.best.as_ref().map_or("n/a".into(), |b| {
                format!(
                    "{} ({} thr{})",
                    capacity_cell(b),
                    b.workers,
                    if b.censored { ", lower bound" } else { "" }
                )
            }),
            if model_applies(row.cores) {
                opt(row.error_pct, 1)
            } else {
                NOT_MODELLED.into()
            },
        ]);
    }
    table
}

/// What the model table says where the model does not apply.
const NOT_MODELLED: &str = "n/a (model for c ≥ 2)";

/// Queueing check at the highest load under the threshold: K_rcv predicted
/// by M/M/1 and M/D/1 from λ and the measured service time, vs measured.
pub fn queueing_table(caps: &[Capacity], pts: &[Point]) -> Table {
    let mut table = Table::new(
        "Queueing check at the highest load under the threshold (λ = arrival rate per core; S = T_sip, or S = proxy CPU per message)",
        &["Configuration", "Threads", "λ (msg/s)", "S = T_sip (µs)", "ρ", "M/M/1 W (µs)", "M/D/1 W (µs)", "S = CPU/msg (µs)", "ρ'", "M/M/1 W' (µs)", "M/D/1 W' (µs)", "Measured K_rcv (µs)", "Measured K_rcv + wait (µs)"],
    );
    // (S, ρ, M/M/1 W, M/D/1 W) cells; "∞" where ρ ≥ 1 has no steady state.
    let cells = |by: &Option<(f64, QueuePrediction)>| -> [String; 4] {
        let wait = |v: Option<f64>| v.map_or("∞ (ρ ≥ 1)".into(), |v| format!("{v:.2}"));
        match by {
            Some((service, q)) => [
                format!("{service:.2}"),
                format!("{:.3}", q.rho),
                wait(q.mm1_wait_us),
                wait(q.md1_wait_us),
            ],
            None => ["n/a".into(), "n/a".into(), "n/a".into(), "n/a".into()],
        }
    };
    for row in queueing_check(caps, pts) {
        let mut cells_row = vec![
            row.config.clone(),
            row.workers.to_string(),
            format!("{:.0}", row.arrival_pps),
        ];
        cells_row.extend(cells(&row.by_t_sip));
        cells_row.extend(cells(&row.by_cpu));
        cells_row.push(opt_ci(&row.k_rcv, 2));
        cells_row.push(opt(row.k_rcv_plus_wait, 2));
        table.rows.push(cells_row);
    }
    table
}

/// The six message types at the highest load under the threshold, and E[x].
pub fn types_table(caps: &[Capacity], pts: &[Point]) -> Table {
    let mut header = vec![
        "Configuration".to_string(),
        "Threads".to_string(),
        "Quantity (µs)".to_string(),
    ];
    header.extend(SIX_TYPES.iter().map(|table| table.1.to_string()));
    header.push("E[x] = K_stack + K^s_sockq + K_copy + T_sip + K_snd".into());
    let mut table = Table {
        title: "Per message type at the highest load under the threshold (ringway; Kamailio reports none); E[x] needs kernel stamps ringway does not take".into(),
        header,
        rows: Vec::new(),
    };
    for c in caps.iter().filter(|c| c.proxy == ProxyKind::Ringway) {
        let Some((rate, _)) = c.below else { continue };
        let Some(point) = point_at(pts, c, rate) else {
            continue;
        };
        for (i, q) in ["K_rcv", "wait after", "T_sip", "K_snd"].iter().enumerate() {
            let mut row = vec![c.config.clone(), c.workers.to_string(), q.to_string()];
            row.extend(
                SIX_TYPES
                    .iter()
                    .map(|(l, _)| opt(point.by_type.get(*l).and_then(|v| v[i]), 2)),
            );
            row.push(if i == 0 {
                format!(
                    "n/a (K_stack, K^s_sockq, K_copy not measured); T_sip + K_snd = {}",
                    match (point.t_sip_us, point.k_snd_us) {
                        (Some(a), Some(b)) => format!("{:.2}", a.mean + b.mean),
                        _ => "n/a".into(),
                    }
                )
            } else {
                String::new()
            });
            table.rows.push(row);
        }
    }
    table
}

/// Per-thread scheduling statistics and the per-worker message share.
pub fn threads_table(caps: &[Capacity], pts: &[Point]) -> Table {
    let mut table = Table::new(
        "Proxy threads during the load, per thread and run (/proc/<pid>/task/<tid>/sched and status), and the per-worker message share",
        &["Configuration", "Threads", "Call rate", "Migrations", "Voluntary ctx switches", "Involuntary ctx switches", "Worker share min..max (%)"],
    );
    for c in caps {
        for (rate, _) in [c.below, c.above].into_iter().flatten() {
            let Some(point) = point_at(pts, c, rate) else {
                continue;
            };
            table.rows.push(vec![
                c.config.clone(),
                c.workers.to_string(),
                format!("{rate:.0}"),
                ci(&point.migrations, 1),
                ci(&point.voluntary, 0),
                ci(&point.involuntary, 0),
                point
                    .share_pct
                    .map_or("n/a".into(), |(a, b)| format!("{a:.1} .. {b:.1}")),
            ]);
        }
    }
    table
}

/// What each mode applied and what was refused, per (proxy, mode, cores, threads).
pub fn knobs_table(pts: &[Point]) -> Table {
    let mut table = Table::new(
        "Scheduler knobs per mode: applied here, refused with the reason, and the effective settings",
        &["Proxy / mode", "Cores", "Threads", "Applied", "Refused", "Effective settings"],
    );
    let mut seen = BTreeSet::new();
    for p in pts {
        if p.sched.starts_with("tune:")
            || !seen.insert((p.proxy, p.sched.clone(), p.cores, p.workers))
        {
            continue;
        }
        let same: Vec<&Point> = pts
            .iter()
            .filter(|q| {
                q.proxy == p.proxy
                    && q.sched == p.sched
                    && q.cores == p.cores
                    && q.workers == p.workers
            })
            .collect();
        let applied: BTreeSet<&String> = same
            .iter()
            .flat_map(|q| q.applied.iter())
            .filter(|a| !a.starts_with("placement: "))
            .collect();
        let refused: BTreeSet<&String> = same.iter().flat_map(|q| q.refused.iter()).collect();
        let eff: BTreeSet<&String> = same.iter().flat_map(|q| q.effective.iter()).collect();
        let join = |s: &BTreeSet<&String>| {
            if s.is_empty() {
                "none".to_string()
            } else {
                s.iter().map(|x| x.as_str()).collect::<Vec<_>>().join("; ")
            }
        };
        table.rows.push(vec![
            format!("{}/{}", p.proxy.name(), p.sched),
            p.cores.to_string(),
            p.workers.to_string(),
            join(&applied),
            join(&refused),
            join(&eff),
        ]);
    }
    table
}

/// Notes on modes that applied the same settings as another on this kernel.
pub fn same_settings_notes(pts: &[Point]) -> Vec<String> {
    let mut groups: BTreeMap<(ProxyKind, usize, usize), BTreeMap<String, BTreeSet<String>>> =
        BTreeMap::new();
    for p in pts.iter().filter(|p| !p.sched.starts_with("tune:")) {
        for e in &p.effective {
            groups
                .entry((p.proxy, p.cores, p.workers))
                .or_default()
                .entry(e.clone())
                .or_default()
                .insert(p.sched.clone());
        }
    }
    let mut notes = Vec::new();
    for ((proxy, cores, workers), m) in groups {
        for (eff, modes) in m {
            if modes.len() > 1 {
                notes.push(format!(
                    "{} at {cores} core(s), {workers} threads: modes {} applied the same settings on this kernel ({eff}); no % lower is printed between them",
                    proxy.name(),
                    modes.into_iter().collect::<Vec<_>>().join(", ")
                ));
            }
        }
    }
    notes
}

/// The tuner's search table.
pub fn tune_table(t: &TuneResult) -> Table {
    let mut tab = Table::new(
        format!(
            "Tuner search, {} on {} core(s), {} threads at the baseline crossing load {:.0} calls/s (search seeds; the pick is re-measured with the sweep's seeds)",
            t.proxy.name(),
            t.cores,
            t.workers,
            t.rate
        ),
        &["Candidate", "Knobs", "PDR (%)", "K_rcv (µs)", "Valid runs", "Effective settings", "Pick"],
    );
    for (i, r) in t.rows.iter().enumerate() {
        tab.rows.push(vec![
            r.candidate.label.clone(),
            r.knobs.describe(),
            r.pdr.map_or("n/a".into(), |m| ci(&pct(&m), 3)),
            opt_ci(&r.k_rcv_us, 1),
            format!("{}/{}", r.valid_runs, r.runs),
            r.effective.clone(),
            if r.refused.is_empty() {
                "none".into()
            } else {
                r.refused.join("; ")
            },
            if t.pick == Some(i) {
                "◀ pick".into()
            } else {
                String::new()
            },
        ]);
    }
    if !t.not_searched.is_empty() {
        tab.rows.push(vec![
            "not searched".into(),
            t.not_searched.join("; "),
            String::new(),
            String::new(),
            String::new(),
            String::new(),
            String::new(),
        ]);
    }
    tab
}

/// Fig. 2 analogue: K_rcv and PDR against migration_cost_ns at a fixed
/// (rate, threads), or against the nearest writable knob (the per-thread
/// slice) when it is not writable. Returns (dimension, PDR plot, K_rcv plot).
pub fn fig2(tunes: &[TuneResult]) -> Option<(String, String, String)> {
    let dim = if tunes.iter().any(|t| {
        t.rows
            .iter()
            .any(|r| r.candidate.dimension == "migration_cost")
    }) {
        "migration_cost"
    } else {
        "slice"
    };
    let xlabel = if dim == "migration_cost" {
        "sched migration_cost (µs)"
    } else {
        "per-thread slice (µs) — migration_cost_ns not writable here"
    };
    let mut pdr = Vec::new();
    let mut krcv = Vec::new();
    for t in tunes {
        let rows: Vec<_> = t
            .rows
            .iter()
            .filter(|r| r.candidate.dimension == dim && r.candidate.x.is_some())
            .collect();
        if rows.is_empty() {
            continue;
        }
        let label = format!(
            "{} c{} {} thr @ {:.0} cps",
            t.proxy.name(),
            t.cores,
            t.workers,
            t.rate
        );
        let mut proxy_points: Vec<(f64, f64, f64)> = rows
            .iter()
            .filter_map(|r| {
                r.pdr.map(|m| {
                    (
                        r.candidate.x.unwrap_or(0.0),
                        100.0 * m.mean,
                        100.0 * m.ci95.max(0.0),
                    )
                })
            })
            .collect();
        proxy_points.sort_by(|a, b| a.0.total_cmp(&b.0));
        let mut kamailio_points: Vec<(f64, f64, f64)> = rows
            .iter()
            .filter_map(|r| {
                r.k_rcv_us
                    .map(|m| (r.candidate.x.unwrap_or(0.0), m.mean, m.ci95.max(0.0)))
            })
            .collect();
        kamailio_points.sort_by(|a, b| a.0.total_cmp(&b.0));
        pdr.push(svg::Series {
            label: label.clone(),
            points: proxy_points,
            color: None,
            dash: 0,
            markers_only: false,
        });
        if !kamailio_points.is_empty() {
            krcv.push(svg::Series {
                label,
                points: kamailio_points,
                color: None,
                dash: 0,
                markers_only: false,
            });
        }
    }
    if pdr.is_empty() {
        return None;
    }
    Some((
        dim.to_string(),
        svg::line_plot(
            "Fig. 2 analogue (b): PDR",
            xlabel,
            "PDR (%)",
            &pdr,
            None,
            Some(100.0),
        ),
        svg::line_plot(
            "Fig. 2 analogue (a): K_rcv",
            xlabel,
            "K_rcv mean (µs)",
            &krcv,
            None,
            None,
        ),
    ))
}

const CSV_HEADER: &str = "config,proxy,mode,backend,sched,knobs,cores,proxy_cpus,gen_cpus,rx_model,batch,workers,rate_cps,rep,seed,duration_s,gen_threads,rcvbuf,error,flags,pdr,proxy_socket_drops,other_socket_drops,udp_rcvbuf_errors,udp_mem_errors,total_msgs,setup_msgs,setup_drops,arrival_pps,attempted,succeeded,failed_ratio,achieved_cps,invite_200_ms,t_sip_us,k_rcv_us,wait_batch_us,k_snd_us,proxy_cpu_user_s,proxy_cpu_sys_s,gen_cpu_s,migrations,voluntary_ctxt,involuntary_ctxt,per_worker_in,sockets,phys_cores,smt,kernel,effective,refused,wall_s";

fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

/// CSV of every run (one row per run; empty cells where not measured).
pub fn runs_csv(records: &[RunRecord]) -> String {
    let mut out = String::from(CSV_HEADER);
    out.push('\n');
    for r in records {
        let spec = &r.spec;
        let lat = |f: &dyn Fn(&crate::siplab::TypeLat) -> &crate::siplab::Lat| match &r.all {
            Some(a) if f(a).count > 0 => format!("{:.3}", f(a).mean_us),
            _ => String::new(),
        };
        let cpus = |v: &[usize]| crate::siplab::topology::cpu_list_text(v);
        let sum = |f: fn(&crate::siplab::topology::ThreadSched) -> u64| {
            r.threads.iter().map(f).sum::<u64>().to_string()
        };
        let row = [
            csv_field(&spec.config_label()),
            spec.proxy.name().into(),
            spec.mode.clone(),
            spec.backend.name().into(),
            csv_field(&spec.sched),
            csv_field(&spec.knobs.describe()),
            spec.cores.to_string(),
            csv_field(&cpus(&spec.proxy_cpus)),
            csv_field(&cpus(&spec.gen_cpus)),
            spec.rx_model.clone(),
            spec.batch.to_string(),
            spec.workers.to_string(),
            spec.rate.to_string(),
            spec.rep.to_string(),
            spec.seed.to_string(),
            spec.duration_s.to_string(),
            spec.gen_threads.to_string(),
            spec.rcvbuf.map_or(String::new(), |v| v.to_string()),
            csv_field(r.error.as_deref().unwrap_or("")),
            csv_field(&r.flags.join("; ")),
            format!("{:.6}", r.pdr),
            r.proxy_socket_drops.to_string(),
            r.other_socket_drops.to_string(),
            r.udp_rcvbuf_errors.to_string(),
            r.udp_mem_errors.to_string(),
            r.total_msgs.to_string(),
            r.setup_msgs.to_string(),
            r.setup_drops.map_or(String::new(), |v| v.to_string()),
            format!("{:.1}", r.arrival_pps),
            r.attempted.to_string(),
            r.succeeded.to_string(),
            format!("{:.6}", r.failed_ratio),
            format!("{:.1}", r.achieved_cps),
            format!("{:.3}", r.invite_200_ms),
            lat(&|a| &a.t_sip),
            lat(&|a| &a.k_rcv),
            lat(&|a| &a.wait),
            lat(&|a| &a.k_snd),
            format!("{:.3}", r.proxy_cpu_user_s),
            format!("{:.3}", r.proxy_cpu_sys_s),
            format!("{:.3}", r.gen_cpu_s),
            sum(|t| t.migrations),
            sum(|t| t.voluntary),
            sum(|t| t.involuntary),
            csv_field(
                &r.per_worker_in
                    .iter()
                    .map(|v| v.to_string())
                    .collect::<Vec<_>>()
                    .join(" "),
            ),
            r.topology.sockets.to_string(),
            r.topology.cores.to_string(),
            r.topology.smt.to_string(),
            csv_field(&r.kernel),
            csv_field(&r.effective),
            csv_field(&r.refused.join("; ")),
            format!("{:.2}", r.wall_s),
        ];
        out += &row.join(",");
        out.push('\n');
    }
    out
}

/// Everything a report needs.
pub struct ReportInput<'a> {
    /// Every run.
    pub records: &'a [RunRecord],
    /// Capacities and tuner searches.
    pub outcome: &'a SweepOutcome,
    /// PDR threshold.
    pub threshold: f64,
    /// Command line that produced the data (shown in the report).
    pub command: String,
    /// Extra notes (machine, CPUs, state file, ...).
    pub notes: Vec<String>,
}

/// The report's sections: a heading and its tables.
type Sections = Vec<(String, Vec<Table>)>;

/// The records in report order: proxy, cores, mode, threads, repetition, rate.
fn sorted_records(records: &[RunRecord]) -> Vec<RunRecord> {
    let mut sorted = records.to_vec();
    sorted.sort_by(|a, b| {
        let key = |r: &RunRecord| {
            (
                r.spec.proxy,
                r.spec.cores,
                r.spec.sched.clone(),
                r.spec.workers,
                r.spec.rep,
            )
        };
        key(a)
            .cmp(&key(b))
            .then(a.spec.rate.total_cmp(&b.spec.rate))
    });
    sorted
}

/// Every table of the report, by section.
fn sections(inp: &ReportInput<'_>, pts: &[Point]) -> Sections {
    let caps = &inp.outcome.caps;
    let mut sections: Sections = vec![
        ("Capacity".into(), vec![capacity_table(caps, inp.threshold)]),
        (
            "Tables I/II: measured performance per mode".into(),
            crossing_tables(caps, pts, inp.threshold),
        ),
        (
            "Tables III/VI/IX: baseline vs the other modes".into(),
            comparison_tables(caps, pts),
        ),
        (
            "Threads, cores and the capacity model".into(),
            vec![
                best_threads_table(caps, inp.threshold),
                model_table(caps, inp.threshold),
            ],
        ),
        ("Queueing check".into(), vec![queueing_table(caps, pts)]),
        (
            "Message types and E[x]".into(),
            vec![types_table(caps, pts)],
        ),
        (
            "Scheduling of the proxy's threads".into(),
            vec![threads_table(caps, pts)],
        ),
        ("Scheduler knobs".into(), vec![knobs_table(pts)]),
    ];
    if !inp.outcome.tunes.is_empty() {
        sections.push((
            "Tuner".into(),
            inp.outcome.tunes.iter().map(tune_table).collect(),
        ));
    }
    sections
}

/// One PDR and one K_rcv plot per proxy (colour = mode, dash = threads):
/// (file name, alt text, SVG).
fn proxy_plots(pts: &[Point], threshold: f64) -> Vec<(String, String, String)> {
    // The tuner's candidates are in its own Fig. 2, not here.
    let main: Vec<Point> = pts
        .iter()
        .filter(|p| !p.sched.starts_with("tune:"))
        .cloned()
        .collect();
    let proxies: BTreeSet<ProxyKind> = main.iter().map(|p| p.proxy).collect();
    let mut plots = Vec::new();
    for proxy in proxies {
        let mine: Vec<Point> = main.iter().filter(|p| p.proxy == proxy).cloned().collect();
        let name = proxy.name();
        plots.push((
            format!("pdr-{name}.svg"),
            format!("{name} PDR vs call rate"),
            svg::line_plot(
                &format!("{name}: PDR vs call rate (valid runs; band: 95% CI)"),
                "call rate (calls/s)",
                "PDR (%)",
                &series(&mine, |p| Some((100.0 * p.pdr.mean, 100.0 * p.pdr.ci95))),
                Some(100.0 * threshold),
                Some(100.0),
            ),
        ));
        let k_rcv = series(&mine, |p| p.k_rcv_us.map(|m| (m.mean, m.ci95)));
        if !k_rcv.is_empty() {
            plots.push((
                format!("krcv-{name}.svg"),
                format!("{name} K_rcv vs call rate"),
                svg::line_plot(
                    &format!("{name}: K_rcv vs call rate (valid runs; band: 95% CI)"),
                    "call rate (calls/s)",
                    "K_rcv mean (µs)",
                    &k_rcv,
                    None,
                    None,
                ),
            ));
        }
    }
    plots
}

/// The notes at the top of the report: run counts, definitions, then the
/// campaign's own.
fn notes(inp: &ReportInput<'_>, records: &[RunRecord], pts: &[Point]) -> Vec<String> {
    let flagged = records
        .iter()
        .filter(|r| r.error.is_none() && !r.flags.is_empty())
        .count();
    let failed = records.iter().filter(|r| r.error.is_some()).count();
    let mut notes = vec![
        format!(
            "{} runs: {} valid, {} flagged (left out of every mean and capacity), {} failed.",
            records.len(),
            records.iter().filter(|r| r.valid()).count(),
            flagged,
            failed
        ),
        "PDR (the papers' definition) = drops counted by the proxy's own sockets (per-socket counters of /proc/net/udp, which count receive-buffer and UDP-memory drops; read after the last message of the run, before the proxy stops) / all messages the generator sent to the proxy in the run (retransmissions and the end of the run included). Namespace RcvbufErrors and MemErrors are recorded in runs.csv as a cross-check.".into(),
        format!(
            "Capacity = highest rate whose mean PDR over the valid repetitions stays under {:.2}%; a run is flagged (not used) when the generator started < 95% of the calls its Poisson schedule had due (or started them > 5 ms late on average) or may share CPUs with the proxy. Values are means ± 95% CI (Student t) over repetitions; n/a = not measured.",
            100.0 * inp.threshold
        ),
        "K_rcv (eq. 1) = kernel RX stamp → start of this message's processing (its wait behind earlier messages of the receive batch included); wait after = end of processing → send call (eq. 1 counts it in K_snd); T_sip = processing; K_snd = send call → kernel TX stamp (sampled 1/64). Runs before this split (2026-11-25) recorded K_rcv up to the receive call's return and the wait before and after as one. Kamailio reports none of them (n/a).".into(),
    ];
    notes.extend(same_settings_notes(pts));
    notes.extend(inp.notes.iter().cloned());
    notes
}

/// What the Markdown and HTML pages show.
struct Page<'p> {
    command: &'p str,
    notes: &'p [String],
    sections: &'p Sections,
    /// (file, alt text) of the per-proxy plots.
    plots: Vec<(&'p str, &'p str)>,
    /// The dimension of the Fig. 2 analogue, when the tuner ran.
    fig2: Option<&'p str>,
    records: &'p [RunRecord],
}

/// "- config threads rate rep: why" lines of flagged or failed runs.
fn run_lines(md: &mut String, runs: &[&RunRecord], why: impl Fn(&RunRecord) -> String) {
    for r in runs {
        let _ = writeln!(
            md,
            "- {} {} thr {:.0} cps rep {}: {}",
            r.spec.config_label(),
            r.spec.workers,
            r.spec.rate,
            r.spec.rep,
            why(r)
        );
    }
}

fn markdown(page: &Page<'_>) -> String {
    let mut out = String::from("# SIP proxy scheduler study\n\n");
    let _ = writeln!(out, "Command: `{}`\n", page.command);
    for note in page.notes {
        let _ = writeln!(out, "- {note}");
    }
    out.push('\n');
    for (heading, tables) in page.sections {
        let _ = writeln!(out, "## {heading}\n");
        for table in tables {
            out += &table.markdown();
            out.push('\n');
        }
    }
    out += "## Plots\n\n";
    for (file, alt) in &page.plots {
        let _ = writeln!(out, "![{alt}]({file})\n");
    }
    if let Some(dimension) = page.fig2 {
        let _ = writeln!(out, "\nFig. 2 analogue over `{dimension}`:\n\n![Fig. 2 (a) K_rcv](fig2-krcv.svg)\n\n![Fig. 2 (b) PDR](fig2-pdr.svg)");
    }
    let flagged: Vec<&RunRecord> = page
        .records
        .iter()
        .filter(|r| r.error.is_none() && !r.flags.is_empty())
        .collect();
    if !flagged.is_empty() {
        out += "\n## Flagged runs (not used)\n\n";
        run_lines(&mut out, &flagged, |r| r.flags.join("; "));
    }
    let failed: Vec<&RunRecord> = page.records.iter().filter(|r| r.error.is_some()).collect();
    if !failed.is_empty() {
        out += "\n## Failed runs\n\n";
        run_lines(&mut out, &failed, |r| r.error.clone().unwrap_or_default());
    }
    out
}

fn html(page: &Page<'_>) -> String {
    let mut html = String::from(
        "<!doctype html>\n<html><head><meta charset=\"utf-8\"><title>SIP proxy scheduler study</title>\n<style>body{font-family:sans-serif;margin:1em 2em;max-width:1400px}table{border-collapse:collapse;margin:1em 0;font-size:13px}td,th{border:1px solid #999;padding:2px 6px;text-align:right;vertical-align:top}td:first-child,th:first-child{text-align:left}caption{font-weight:bold;text-align:left;padding:4px 0}.wide{overflow-x:auto}img{max-width:100%;height:auto}li{margin:2px 0}</style></head><body>\n<h1>SIP proxy scheduler study</h1>\n",
    );
    let _ = writeln!(
        html,
        "<p>Command: <code>{}</code></p>\n<ul>",
        esc(page.command)
    );
    for note in page.notes {
        let _ = writeln!(html, "<li>{}</li>", esc(note));
    }
    html += "</ul>\n";
    for (heading, tables) in page.sections {
        let _ = writeln!(html, "<h2>{}</h2>", esc(heading));
        for table in tables {
            html += "<div class=\"wide\">";
            html += &table.html();
            html += "</div>\n";
        }
    }
    html += "<h2>Plots</h2>\n";
    for (file, alt) in &page.plots {
        let _ = writeln!(html, "<p><img src=\"{file}\" alt=\"{}\"></p>", esc(alt));
    }
    if page.fig2.is_some() {
        html += "<p><img src=\"fig2-krcv.svg\" alt=\"Fig. 2 analogue K_rcv\"></p>\n<p><img src=\"fig2-pdr.svg\" alt=\"Fig. 2 analogue PDR\"></p>\n";
    }
    html += "<p>Data: <a href=\"runs.csv\">runs.csv</a>, <a href=\"runs.json\">runs.json</a>, <a href=\"capacity.json\">capacity.json</a>, <a href=\"report.md\">report.md</a></p>\n</body></html>\n";
    html
}

/// Write runs.csv, runs.json, capacity.json, report.md, pdr-<proxy>.svg,
/// krcv-<proxy>.svg, fig2-*.svg (with a tuner search) and index.html into
/// `dir`; returns the files written.
pub fn write_report(dir: &Path, inp: &ReportInput<'_>) -> anyhow::Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir)?;
    let records = sorted_records(inp.records);
    let pts = points(&records);
    let mut written = Vec::new();
    let mut put = |name: &str, data: &[u8]| -> anyhow::Result<()> {
        let path = dir.join(name);
        std::fs::write(&path, data)?;
        written.push(path);
        Ok(())
    };
    put("runs.csv", runs_csv(&records).as_bytes())?;
    put("runs.json", &serde_json::to_vec_pretty(&records)?)?;
    put(
        "capacity.json",
        &serde_json::to_vec_pretty(&serde_json::json!({
            "threshold": inp.threshold,
            "capacities": inp.outcome.caps,
            "tuner": inp.outcome.tunes,
            "points": pts,
        }))?,
    )?;
    let sections = sections(inp, &pts);
    let fig = fig2(&inp.outcome.tunes);
    if let Some((_, pdr, k_rcv)) = &fig {
        put("fig2-pdr.svg", pdr.as_bytes())?;
        put("fig2-krcv.svg", k_rcv.as_bytes())?;
    }
    let plots = proxy_plots(&pts, inp.threshold);
    for (file, _, svg) in &plots {
        put(file, svg.as_bytes())?;
    }
    let notes = notes(inp, &records, &pts);
    let page = Page {
        command: &inp.command,
        notes: &notes,
        sections: &sections,
        plots: plots
            .iter()
            .map(|(file, alt, _)| (file.as_str(), alt.as_str()))
            .collect(),
        fig2: fig.as_ref().map(|(dimension, _, _)| dimension.as_str()),
        records: &records,
    };
    put("report.md", markdown(&page).as_bytes())?;
    put("index.html", html(&page).as_bytes())?;
    Ok(written)
}

/// One plot series per (configuration, workers) of one proxy: (x, y, ci)
/// points; colour by mode, dash pattern by thread count.
fn series(pts: &[Point], f: impl Fn(&Point) -> Option<(f64, f64)>) -> Vec<svg::Series> {
    let modes: Vec<&str> = pts
        .iter()
        .map(|p| p.sched.as_str())
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    let workers: Vec<usize> = pts
        .iter()
        .map(|p| p.workers)
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    let style: BTreeMap<String, (usize, usize)> = pts
        .iter()
        .map(|p| {
            (
                p.config.clone(),
                (
                    modes.iter().position(|m| *m == p.sched).unwrap_or(0),
                    workers.iter().position(|w| *w == p.workers).unwrap_or(0),
                ),
            )
        })
        .collect();
    let mut grouped: SeriesMap = BTreeMap::new();
    for p in pts.iter().filter(|p| p.reps > 0) {
        if let Some((value, interval)) = f(p) {
            if value.is_finite() {
                grouped
                    .entry((p.config.clone(), p.workers))
                    .or_default()
                    .push((
                        p.rate,
                        value,
                        if interval.is_finite() { interval } else { 0.0 },
                    ));
            }
        }
    }
    grouped
        .into_iter()
        .map(|((interval, w), mut pts)| {
            pts.sort_by(|a, b| a.0.total_cmp(&b.0));
            let color = style.get(&interval).map(|s| s.0);
            let dash = workers.iter().position(|x| *x == w).unwrap_or(0);
            svg::Series {
                label: format!("{interval}, {w} threads"),
                points: pts,
                color,
                dash,
                markers_only: false,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::siplab::mode::Knobs;
    use crate::siplab::{Lat, RunSpec, TypeLat};

    fn rec(
        sched: &str,
        workers: usize,
        rate: f64,
        rep: u32,
        pdr: f64,
        k_rcv: f64,
        eff: &str,
    ) -> RunRecord {
        let spec = RunSpec {
            proxy: ProxyKind::Ringway,
            mode: "stateless".into(),
            workers,
            backend: ringway_io::BackendKind::Mmsg,
            sched: sched.into(),
            knobs: Knobs::default(),
            cores: 1,
            proxy_cpus: vec![0],
            gen_cpus: vec![1],
            rx_model: "shared".into(),
            batch: 32,
            rate,
            duration_s: 2.0,
            rep,
            seed: rep as u64,
            gen_threads: 2,
            rcvbuf: None,
            service: None,
            globals: Vec::new(),
            wire: None,
            rx_coalesce_us: None,
        };
        let mut r = RunRecord::empty(&spec);
        r.pdr = pdr;
        r.effective = eff.into();
        r.all = Some(TypeLat {
            count: 100,
            k_rcv: Lat {
                count: 100,
                mean_us: k_rcv,
                ci95_us: 0.0,
            },
            t_sip: Lat {
                count: 100,
                mean_us: 3.0,
                ci95_us: 0.0,
            },
            ..TypeLat::default()
        });
        r
    }

    fn cap(sched: &str, workers: usize, below: f64, above: f64) -> Capacity {
        Capacity {
            config: format!("ringway/shared/b32/{sched} c1"),
            proxy: ProxyKind::Ringway,
            profile: sched.into(),
            cores: 1,
            sockets: 1,
            workers,
            capacity_cps: Some(below),
            below: Some((below, 0.005)),
            above: Some((above, 0.02)),
            probes: Vec::new(),
            rep_pdrs: vec![
                (below, vec![Some(0.005), Some(0.004)]),
                (above, vec![Some(0.02), Some(0.03)]),
            ],
            censored: false,
        }
    }

    #[test]
    fn table_three_pairs_repetitions_and_says_when_settings_are_the_same() {
        let mut recs = Vec::new();
        for rep in 0..2 {
            // 2 threads: baseline and enhanced apply the same settings here.
            recs.push(rec("baseline", 2, 400.0, rep, 0.02, 100.0, "slice 100"));
            recs.push(rec("enhanced", 2, 400.0, rep, 0.019, 99.0, "slice 100"));
            // 4 threads: they differ; enhanced is 25% lower in PDR (0.02 -> 0.015
            // in both reps) and K_rcv 200 -> 150 / 100 -> 80 (27.8 %).
            recs.push(rec(
                "baseline",
                4,
                400.0,
                rep,
                0.02,
                [200.0, 100.0][rep as usize],
                "slice 100",
            ));
            recs.push(rec(
                "enhanced",
                4,
                400.0,
                rep,
                0.015,
                [150.0, 80.0][rep as usize],
                "slice 150",
            ));
        }
        let pts = points(&recs);
        let caps = vec![
            cap("baseline", 2, 200.0, 400.0),
            cap("enhanced", 2, 200.0, 400.0),
            cap("baseline", 4, 200.0, 400.0),
            cap("enhanced", 4, 200.0, 400.0),
        ];
        let t = &comparison_tables(&caps, &pts)[0];
        let two = t
            .rows
            .iter()
            .find(|r| r[0].starts_with("2 threads"))
            .unwrap();
        assert!(two[3].contains("same settings"), "{two:?}");
        assert!(two[6].contains("same settings"), "{two:?}");
        let four = t
            .rows
            .iter()
            .find(|r| r[0].starts_with("4 threads"))
            .unwrap();
        assert_eq!(four[3], "25.0% ± 0.0", "{four:?}");
        assert!(four[6].starts_with("23.3% ±"), "{four:?}");
        let notes = same_settings_notes(&pts);
        assert_eq!(notes.len(), 1);
        assert!(notes[0].contains("2 threads") && notes[0].contains("baseline, enhanced"));
    }

    #[test]
    fn model_table_predicts_from_measured_c11() {
        // C11 = 1000 (1 core, 1 thread); best at 1 core = 2800 with 2
        // threads; T_{1,1} = 3 -> predicted 3000, error +7.1 %.
        let mut c11 = cap("enhanced", 1, 1000.0, 1200.0);
        c11.rep_pdrs = vec![(1000.0, vec![Some(0.0)]), (1200.0, vec![Some(0.5)])];
        let mut c2 = cap("enhanced", 2, 2800.0, 3000.0);
        c2.rep_pdrs = vec![(2800.0, vec![Some(0.0)]), (3000.0, vec![Some(0.5)])];
        let t = model_table(&[c11.clone(), c2.clone()], 0.01);
        assert_eq!(t.rows.len(), 1);
        let r = &t.rows[0];
        assert_eq!(r[1], "1000");
        assert_eq!(r[4], "3");
        // At c = 1 the model does not apply: n/a, never "error 200 %".
        assert_eq!(r[5], "n/a (model for c ≥ 2)");
        assert!(r[6].starts_with("2800 (2 thr"), "{r:?}");
        assert_eq!(r[7], "n/a (model for c ≥ 2)");
        // At c = 2 (one processor): T = 4, predicted 4000 against the best
        // 2800 measured there: error +42.9 %.
        c2.cores = 2;
        let t = model_table(&[c11, c2], 0.01);
        let r = &t.rows[1];
        assert_eq!(
            (r[2].as_str(), r[4].as_str(), r[5].as_str()),
            ("2", "4", "4000")
        );
        assert_eq!(r[7], "42.9");
        // Without a 1-core, 1-thread run there is no C11.
        let t = model_table(&[cap("enhanced", 2, 2800.0, 3000.0)], 0.01);
        assert!(t.rows[0][1].starts_with("n/a"));
        assert!(t.rows[0][7].starts_with("n/a"));
    }

    #[test]
    fn crossing_tables_have_the_papers_rows_and_flagged_runs_stay_out() {
        let mut recs = vec![
            rec("baseline", 2, 200.0, 0, 0.005, 50.0, "x"),
            rec("baseline", 2, 400.0, 0, 0.02, 90.0, "x"),
        ];
        let mut flagged = rec("baseline", 2, 400.0, 1, 0.9, 9000.0, "x");
        flagged.flags.push("generator fell behind".into());
        recs.push(flagged);
        let pts = points(&recs);
        let p400 = pts.iter().find(|p| p.rate == 400.0).unwrap();
        assert_eq!((p400.reps, p400.flagged), (1, 1));
        assert!((p400.pdr.mean - 0.02).abs() < 1e-12, "flagged run left out");
        let t = &crossing_tables(&[cap("baseline", 2, 200.0, 400.0)], &pts, 0.01)[0];
        assert_eq!(
            t.header[1..],
            ["2 thr 200 cps".to_string(), "2 thr 400 cps".to_string()]
        );
        let names: Vec<&str> = t.rows.iter().map(|r| r[0].as_str()).collect();
        for want in [
            "Arrival rate (packets/s)",
            "T_sip (µs)",
            "K_rcv (µs)",
            "RCV errors (proxy socket drops)",
            "Call-setup drops",
            "Total messages",
            "PDR (%)",
        ] {
            assert!(names.contains(&want), "{want} missing: {names:?}");
        }
        let pdr = t.rows.iter().find(|r| r[0] == "PDR (%)").unwrap();
        // One valid repetition: its value, marked, with no interval.
        assert_eq!(pdr[2], "2.000 (n=1)");
        let setup = t.rows.iter().find(|r| r[0] == "Call-setup drops").unwrap();
        assert_eq!(setup[1], "n/a", "not measured: n/a, never 0");
    }
}
