//! Reports of SIP capacity sweeps: CSV and JSON of every run, Markdown
//! tables shaped like the papers' Tables I–III, a two-configuration
//! comparison, the C = T × C₁,₁ model fit, SVG plots and an index.html.

pub mod svg;

use crate::siplab::sweep::Capacity;
use crate::siplab::RunRecord;
use crate::stats::{fit_line, fit_through_origin, mean_ci, MeanCi};
use serde::Serialize;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// A table rendered to Markdown and HTML.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Table {
    /// Caption.
    pub title: String,
    /// Column headers.
    pub header: Vec<String>,
    /// Rows of cells.
    pub rows: Vec<Vec<String>>,
}

impl Table {
    /// Markdown rendering.
    pub fn markdown(&self) -> String {
        let mut s = format!("**{}**\n\n| {} |\n|", self.title, self.header.join(" | "));
        for _ in &self.header {
            s += "---|";
        }
        s += "\n";
        for r in &self.rows {
            s += &format!("| {} |\n", r.join(" | "));
        }
        s
    }
    /// HTML rendering.
    pub fn html(&self) -> String {
        let esc = |t: &str| {
            t.replace('&', "&amp;")
                .replace('<', "&lt;")
                .replace('>', "&gt;")
        };
        let mut s = format!("<table>\n<caption>{}</caption>\n<tr>", esc(&self.title));
        for h in &self.header {
            let _ = write!(s, "<th>{}</th>", esc(h));
        }
        s += "</tr>\n";
        for r in &self.rows {
            s += "<tr>";
            for c in r {
                let _ = write!(s, "<td>{}</td>", esc(c));
            }
            s += "</tr>\n";
        }
        s + "</table>\n"
    }
}

/// Repetitions of one (configuration, workers, rate) point, aggregated.
#[derive(Clone, Debug, Serialize)]
pub struct Point {
    /// Configuration label.
    pub config: String,
    /// Workers.
    pub workers: usize,
    /// Offered call rate.
    pub rate: f64,
    /// Successful repetitions.
    pub reps: usize,
    /// Failed repetitions (errors).
    pub errors: usize,
    /// PDR.
    pub pdr: MeanCi,
    /// Failed-call ratio.
    pub failed_ratio: MeanCi,
    /// Arrival rate at the proxy (packets/s).
    pub arrival_pps: MeanCi,
    /// T_sip over all messages (µs), if reported.
    pub t_sip_us: Option<MeanCi>,
    /// K_rcv over all messages (µs), if reported.
    pub k_rcv_us: Option<MeanCi>,
    /// K_snd over all messages (µs), if reported.
    pub k_snd_us: Option<MeanCi>,
    /// RcvbufErrors per run.
    pub rcv_errors: MeanCi,
    /// Messages offered per run.
    pub total_msgs: MeanCi,
    /// Proxy CPU µs per call.
    pub cpu_us_per_call: MeanCi,
}

/// Group records into points (successful runs only count in the means).
pub fn points(records: &[RunRecord]) -> Vec<Point> {
    let mut g: BTreeMap<(String, usize, u64), Vec<&RunRecord>> = BTreeMap::new();
    for r in records {
        g.entry((
            r.spec.config_label(),
            r.spec.workers,
            (r.spec.rate * 1000.0) as u64,
        ))
        .or_default()
        .push(r);
    }
    g.into_iter()
        .map(|((config, workers, _), rs)| {
            let ok: Vec<&&RunRecord> = rs.iter().filter(|r| r.error.is_none()).collect();
            let m = |f: &dyn Fn(&RunRecord) -> f64| {
                mean_ci(&ok.iter().map(|r| f(r)).collect::<Vec<_>>())
            };
            let lat = |f: &dyn Fn(&crate::siplab::TypeLat) -> f64| {
                let xs: Vec<f64> = ok
                    .iter()
                    .filter_map(|r| r.all.as_ref())
                    .filter(|a| a.count > 0)
                    .map(f)
                    .collect();
                (!xs.is_empty()).then(|| mean_ci(&xs))
            };
            Point {
                config,
                workers,
                rate: rs[0].spec.rate,
                reps: ok.len(),
                errors: rs.len() - ok.len(),
                pdr: m(&|r| r.pdr),
                failed_ratio: m(&|r| r.failed_ratio),
                arrival_pps: m(&|r| r.arrival_pps),
                t_sip_us: lat(&|a| a.t_sip.mean_us),
                k_rcv_us: lat(&|a| a.k_rcv.mean_us),
                k_snd_us: lat(&|a| a.k_snd.mean_us),
                rcv_errors: m(&|r| r.rcvbuf_errors as f64),
                total_msgs: m(&|r| r.total_msgs as f64),
                cpu_us_per_call: m(&|r| 1e6 * r.proxy_cpu_s / (r.attempted.max(1) as f64)),
            }
        })
        .collect()
}

fn ci(m: &MeanCi, digits: usize) -> String {
    if m.n == 0 || m.mean.is_nan() {
        return "n/a".into();
    }
    if m.n < 2 {
        return format!("{:.*}", digits, m.mean);
    }
    format!("{:.*} ± {:.*}", digits, m.mean, digits, m.ci95)
}

fn opt_ci(m: &Option<MeanCi>, digits: usize) -> String {
    m.as_ref().map_or("n/a".into(), |m| ci(m, digits))
}

/// Fit of the capacity model C = T × C₁,₁ for one configuration.
#[derive(Clone, Debug, Serialize)]
pub struct ModelFit {
    /// Configuration label.
    pub config: String,
    /// Capacity per effective thread, C₁,₁ (calls/s); None when every
    /// capacity of the configuration is only a lower bound.
    pub c11: Option<f64>,
    /// R² of the through-origin fit (None with fewer than two distinct
    /// capacities, where it is undefined).
    pub r2: Option<f64>,
    /// Cores assumed (T = min(workers, cores + 2)).
    pub cores: usize,
    /// Points (T, capacity).
    pub points: Vec<(f64, f64)>,
    /// Ordinary line fit (intercept, slope) for comparison.
    pub line: Option<(f64, f64)>,
    /// Worker counts left out because their capacity is only a lower bound
    /// (the highest rate tried stayed under the threshold).
    pub censored_workers: Vec<usize>,
}

/// Fit C = T × C₁,₁ per configuration, with T = min(workers, cores + 2)
/// (threads beyond cores + 2 add no capacity on one socket).
pub fn fit_model(caps: &[Capacity], cores: usize) -> Vec<ModelFit> {
    // Per configuration: fitted points (T, C) and censored worker counts.
    type Group = (Vec<(f64, f64)>, Vec<usize>);
    let mut by: BTreeMap<&str, Group> = BTreeMap::new();
    for c in caps {
        let e = by.entry(&c.config).or_default();
        match c.capacity_cps {
            // A censored capacity is a lower bound, not a measurement: fitting
            // it would pull C₁,₁ towards the rate limit of the sweep.
            Some(_) if c.censored => e.1.push(c.workers),
            Some(cap) => e.0.push((c.workers.min(cores + 2) as f64, cap)),
            None => {}
        }
    }
    by.into_iter()
        .filter(|(_, (pts, censored))| !pts.is_empty() || !censored.is_empty())
        .map(|(config, (pts, censored_workers))| {
            let c11 = fit_through_origin(&pts);
            let r2 = c11.and_then(|c11| {
                let my = pts.iter().map(|p| p.1).sum::<f64>() / pts.len() as f64;
                let ss_tot: f64 = pts.iter().map(|p| (p.1 - my).powi(2)).sum();
                let ss_res: f64 = pts.iter().map(|p| (p.1 - c11 * p.0).powi(2)).sum();
                (ss_tot > 0.0).then(|| 1.0 - ss_res / ss_tot)
            });
            ModelFit {
                config: config.to_string(),
                c11,
                r2,
                cores,
                line: fit_line(&pts).map(|f| (f.intercept, f.slope)),
                points: pts,
                censored_workers,
            }
        })
        .collect()
}

/// Tables I–III: per configuration and worker count, the two probed rates
/// around the PDR crossing.
pub fn crossing_tables(caps: &[Capacity], pts: &[Point], threshold: f64) -> Vec<Table> {
    let mut tables = Vec::new();
    let mut configs: Vec<&str> = caps.iter().map(|c| c.config.as_str()).collect();
    configs.dedup();
    for cfg in configs {
        let mut t = Table {
            title: format!(
                "{cfg}: rates around the {:.2}% PDR crossing",
                100.0 * threshold
            ),
            header: [
                "Workers",
                "Call rate (calls/s)",
                "Arrival rate (packets/s)",
                "T_sip (µs)",
                "K_rcv (µs)",
                "RCV errors",
                "Total messages",
                "Drop rate (%)",
                "Failed calls (%)",
            ]
            .iter()
            .map(|s| s.to_string())
            .collect(),
            rows: Vec::new(),
        };
        for c in caps.iter().filter(|c| c.config == cfg) {
            for (rate, _) in [c.below, c.above].into_iter().flatten() {
                let Some(p) = pts
                    .iter()
                    .find(|p| p.config == cfg && p.workers == c.workers && p.rate == rate)
                else {
                    continue;
                };
                let pct = |m: &MeanCi| MeanCi {
                    mean: 100.0 * m.mean,
                    ci95: 100.0 * m.ci95,
                    n: m.n,
                };
                t.rows.push(vec![
                    c.workers.to_string(),
                    format!("{rate:.0}"),
                    ci(&p.arrival_pps, 0),
                    opt_ci(&p.t_sip_us, 2),
                    opt_ci(&p.k_rcv_us, 2),
                    ci(&p.rcv_errors, 0),
                    ci(&p.total_msgs, 0),
                    ci(&pct(&p.pdr), 3),
                    ci(&pct(&p.failed_ratio), 3),
                ]);
            }
            if c.below.is_none() && c.above.is_none() {
                t.rows.push(vec![
                    c.workers.to_string(),
                    "no successful run".into(),
                    String::new(),
                    String::new(),
                    String::new(),
                    String::new(),
                    String::new(),
                    String::new(),
                    String::new(),
                ]);
            }
        }
        tables.push(t);
    }
    tables
}

/// Capacity per configuration and workers.
pub fn capacity_table(caps: &[Capacity]) -> Table {
    let mut t = Table {
        title: "Capacity (highest call rate with mean PDR under the threshold)".into(),
        header: [
            "Configuration",
            "Workers",
            "Capacity (calls/s)",
            "Bracket",
            "Probes",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect(),
        rows: Vec::new(),
    };
    for c in caps {
        let cap = match c.capacity_cps {
            Some(v) if c.censored => format!("≥ {v:.0} (never crossed)"),
            Some(v) => format!("{v:.0}"),
            None => match c.above {
                Some((r, _)) => format!("< {r:.0}"),
                None => "n/a (all runs failed)".into(),
            },
        };
        let br = format!(
            "{} .. {}",
            c.below
                .map_or("-".into(), |b| format!("{:.0} ({:.3}%)", b.0, 100.0 * b.1)),
            c.above
                .map_or("-".into(), |b| format!("{:.0} ({:.3}%)", b.0, 100.0 * b.1))
        );
        t.rows.push(vec![
            c.config.clone(),
            c.workers.to_string(),
            cap,
            br,
            c.probes.len().to_string(),
        ]);
    }
    t
}

/// Compare configuration `b` with `a`: capacity and proxy CPU per call,
/// with "% lower" of b relative to a.
pub fn comparison_table(caps: &[Capacity], pts: &[Point], a: &str, b: &str) -> Table {
    let mut t = Table {
        title: format!("{b} compared with {a}"),
        header: vec![
            "Workers".into(),
            format!("Capacity {a}"),
            format!("Capacity {b}"),
            "% lower".into(),
            format!("CPU µs/call {a}"),
            format!("CPU µs/call {b}"),
            "% lower".into(),
        ],
        rows: Vec::new(),
    };
    let pct = |x: f64, y: f64| {
        if x > 0.0 {
            format!("{:.1}", 100.0 * (x - y) / x)
        } else {
            "n/a".into()
        }
    };
    // CPU per call over the points under the threshold that both measured.
    let cpu = |cfg: &str, w: usize, rates: &[f64]| -> Option<f64> {
        let xs: Vec<f64> = pts
            .iter()
            .filter(|p| p.config == cfg && p.workers == w && rates.contains(&p.rate) && p.reps > 0)
            .map(|p| p.cpu_us_per_call.mean)
            .collect();
        (!xs.is_empty()).then(|| xs.iter().sum::<f64>() / xs.len() as f64)
    };
    let mut ws: Vec<usize> = caps.iter().map(|c| c.workers).collect();
    ws.sort();
    ws.dedup();
    for w in ws {
        let ca = caps.iter().find(|c| c.config == a && c.workers == w);
        let cb = caps.iter().find(|c| c.config == b && c.workers == w);
        let (Some(ca), Some(cb)) = (ca, cb) else {
            continue;
        };
        let fmt_cap = |c: &Capacity| {
            c.capacity_cps
                .map_or("n/a".to_string(), |v| format!("{v:.0}"))
        };
        let cap_pct = match (ca.capacity_cps, cb.capacity_cps) {
            (Some(x), Some(y)) => pct(x, y),
            _ => "n/a".into(),
        };
        let under = |c: &Capacity| -> Vec<f64> {
            c.probes
                .iter()
                .filter(|(r, p)| {
                    p.is_some_and(|p| p < 1.0) && c.capacity_cps.is_some_and(|cap| *r <= cap)
                })
                .map(|(r, _)| *r)
                .collect()
        };
        let ra = under(ca);
        let common: Vec<f64> = under(cb).into_iter().filter(|r| ra.contains(r)).collect();
        let (xa, xb) = (cpu(a, w, &common), cpu(b, w, &common));
        t.rows.push(vec![
            w.to_string(),
            fmt_cap(ca),
            fmt_cap(cb),
            cap_pct,
            xa.map_or("n/a".into(), |v| format!("{v:.1}")),
            xb.map_or("n/a".into(), |v| format!("{v:.1}")),
            match (xa, xb) {
                (Some(x), Some(y)) => pct(x, y),
                _ => "n/a".into(),
            },
        ]);
    }
    t
}

const CSV_HEADER: &str = "config,proxy,mode,backend,profile,workers,cpus,rate_cps,rep,duration_s,error,pdr,pdr_proxy,rcvbuf_errors,socket_drops,total_msgs,arrival_pps,attempted,succeeded,failed_ratio,achieved_cps,invite_200_ms,t_sip_us,t_sip_ci95_us,k_rcv_us,k_rcv_ci95_us,k_snd_us,k_snd_ci95_us,proxy_cpu_user_s,proxy_cpu_sys_s,gen_cpu_s,wall_s";

fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

/// CSV of every run (one row per run).
pub fn runs_csv(records: &[RunRecord]) -> String {
    let mut s = String::from(CSV_HEADER);
    s.push('\n');
    for r in records {
        let p = &r.spec;
        let lat = |f: &dyn Fn(&crate::siplab::TypeLat) -> (f64, f64)| match &r.all {
            Some(a) if a.count > 0 => {
                let (m, c) = f(a);
                (format!("{m:.3}"), format!("{c:.3}"))
            }
            _ => ("".into(), "".into()),
        };
        let (ts, tsc) = lat(&|a| (a.t_sip.mean_us, a.t_sip.ci95_us));
        let (kr, krc) = lat(&|a| (a.k_rcv.mean_us, a.k_rcv.ci95_us));
        let (ks, ksc) = lat(&|a| (a.k_snd.mean_us, a.k_snd.ci95_us));
        let row = [
            csv_field(&p.config_label()),
            p.proxy.name().into(),
            p.mode.clone(),
            p.backend.name().into(),
            p.profile.name.clone(),
            p.workers.to_string(),
            csv_field(p.cpus.as_deref().unwrap_or("")),
            p.rate.to_string(),
            p.rep.to_string(),
            p.duration_s.to_string(),
            csv_field(r.error.as_deref().unwrap_or("")),
            format!("{:.6}", r.pdr),
            r.pdr_proxy.map_or(String::new(), |v| format!("{v:.6}")),
            r.rcvbuf_errors.to_string(),
            r.socket_drops.map_or(String::new(), |v| v.to_string()),
            r.total_msgs.to_string(),
            format!("{:.1}", r.arrival_pps),
            r.attempted.to_string(),
            r.succeeded.to_string(),
            format!("{:.6}", r.failed_ratio),
            format!("{:.1}", r.achieved_cps),
            format!("{:.3}", r.invite_200_ms),
            ts,
            tsc,
            kr,
            krc,
            ks,
            ksc,
            format!("{:.3}", r.proxy_cpu_user_s),
            format!("{:.3}", r.proxy_cpu_sys_s),
            format!("{:.3}", r.gen_cpu_s),
            format!("{:.2}", r.wall_s),
        ];
        s += &row.join(",");
        s.push('\n');
    }
    s
}

/// Everything a report needs.
pub struct ReportInput<'a> {
    /// Every run.
    pub records: &'a [RunRecord],
    /// Capacities.
    pub caps: &'a [Capacity],
    /// PDR threshold.
    pub threshold: f64,
    /// Cores for the model fit.
    pub cores: usize,
    /// Command line that produced the data (shown in the report).
    pub command: String,
    /// Extra notes (knobs applied/refused, generator CPU ratio, ...).
    pub notes: Vec<String>,
}

/// Write runs.csv, runs.json, capacity.json, report.md, pdr.svg,
/// krcv.svg and index.html into `dir`; returns the written paths.
pub fn write_report(dir: &Path, inp: &ReportInput<'_>) -> anyhow::Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir)?;
    let mut recs: Vec<RunRecord> = inp.records.to_vec();
    recs.sort_by(|a, b| {
        (
            a.spec.config_label(),
            a.spec.workers,
            a.spec.rate,
            a.spec.rep,
        )
            .partial_cmp(&(
                b.spec.config_label(),
                b.spec.workers,
                b.spec.rate,
                b.spec.rep,
            ))
            .unwrap_or(std::cmp::Ordering::Equal)
    });
    let pts = points(&recs);
    let fits = fit_model(inp.caps, inp.cores);
    let mut written = Vec::new();
    let mut put = |name: &str, data: &[u8]| -> anyhow::Result<()> {
        let p = dir.join(name);
        std::fs::write(&p, data)?;
        written.push(p);
        Ok(())
    };
    put("runs.csv", runs_csv(&recs).as_bytes())?;
    put("runs.json", &serde_json::to_vec_pretty(&recs)?)?;
    put(
        "capacity.json",
        &serde_json::to_vec_pretty(&serde_json::json!({
            "threshold": inp.threshold,
            "capacities": inp.caps,
            "model": fits,
            "points": pts,
        }))?,
    )?;
    let mut tables = vec![capacity_table(inp.caps)];
    tables.extend(crossing_tables(inp.caps, &pts, inp.threshold));
    let mut configs: Vec<String> = inp.caps.iter().map(|c| c.config.clone()).collect();
    configs.dedup();
    if configs.len() >= 2 {
        tables.push(comparison_table(inp.caps, &pts, &configs[0], &configs[1]));
    }
    let mut model = Table {
        title: format!(
            "Capacity model C = T × C₁,₁ (T = min(workers, cores + 2), cores = {})",
            inp.cores
        ),
        header: [
            "Configuration",
            "C₁,₁ (calls/s per thread)",
            "R²",
            "Points (T, C)",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect(),
        rows: Vec::new(),
    };
    for f in &fits {
        let pts: Vec<String> = f
            .points
            .iter()
            .map(|(t, c)| format!("({t:.0}, {c:.0})"))
            .collect();
        let mut pts = pts.join(" ");
        if !f.censored_workers.is_empty() {
            pts.push_str(&format!(
                "; left out (lower bounds only): workers {:?}",
                f.censored_workers
            ));
        }
        model.rows.push(vec![
            f.config.clone(),
            f.c11.map_or("n/a".into(), |c| format!("{c:.1}")),
            f.r2.map_or("n/a".into(), |r| format!("{r:.3}")),
            pts,
        ]);
    }
    tables.push(model);
    let pdr_svg = svg::line_plot(
        "PDR vs call rate",
        "call rate (calls/s)",
        "PDR (%)",
        &series(&pts, |p| Some((100.0 * p.pdr.mean, 100.0 * p.pdr.ci95))),
        Some(100.0 * inp.threshold),
    );
    let krcv_svg = svg::line_plot(
        "K_rcv vs call rate",
        "call rate (calls/s)",
        "K_rcv mean (µs)",
        &series(&pts, |p| p.k_rcv_us.map(|m| (m.mean, m.ci95))),
        None,
    );
    put("pdr.svg", pdr_svg.as_bytes())?;
    put("krcv.svg", krcv_svg.as_bytes())?;
    let mut md = String::from("# SIP proxy capacity report\n\n");
    let _ = writeln!(md, "Command: `{}`\n", inp.command);
    let _ = writeln!(
        md,
        "{} runs ({} failed). PDR = UDP RcvbufErrors delta in the run's private network namespace / messages offered to the proxy; capacity = highest rate whose mean PDR over the repetitions stays under {:.2}%. Values are means ± 95% CI (Student t) over repetitions. Kamailio does not report per-message K_rcv/T_sip (n/a).\n",
        recs.len(),
        recs.iter().filter(|r| r.error.is_some()).count(),
        100.0 * inp.threshold
    );
    for n in &inp.notes {
        let _ = writeln!(md, "- {n}");
    }
    md.push('\n');
    for t in &tables {
        md += &t.markdown();
        md.push('\n');
    }
    md += "![PDR vs call rate](pdr.svg)\n\n![K_rcv vs call rate](krcv.svg)\n";
    let errs: Vec<&RunRecord> = recs.iter().filter(|r| r.error.is_some()).collect();
    if !errs.is_empty() {
        md += "\n## Failed runs\n\n";
        for r in errs {
            let _ = writeln!(md, "- `{}`: {}", r.key, r.error.as_deref().unwrap_or(""));
        }
    }
    put("report.md", md.as_bytes())?;
    let mut html = String::from(
        "<!doctype html>\n<html><head><meta charset=\"utf-8\"><title>SIP proxy capacity</title>\n<style>body{font-family:sans-serif;max-width:1100px;margin:auto}table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #999;padding:2px 6px;text-align:right}caption{font-weight:bold;text-align:left}</style></head><body>\n<h1>SIP proxy capacity report</h1>\n",
    );
    let _ = writeln!(
        html,
        "<p>Command: <code>{}</code></p>",
        inp.command.replace('&', "&amp;").replace('<', "&lt;")
    );
    for n in &inp.notes {
        let _ = writeln!(
            html,
            "<p>{}</p>",
            n.replace('&', "&amp;").replace('<', "&lt;")
        );
    }
    for t in &tables {
        html += &t.html();
    }
    html += "<p><img src=\"pdr.svg\" alt=\"PDR vs call rate\"></p>\n<p><img src=\"krcv.svg\" alt=\"K_rcv vs call rate\"></p>\n<p>Data: <a href=\"runs.csv\">runs.csv</a>, <a href=\"runs.json\">runs.json</a>, <a href=\"capacity.json\">capacity.json</a>, <a href=\"report.md\">report.md</a></p>\n</body></html>\n";
    put("index.html", html.as_bytes())?;
    Ok(written)
}

/// One plot series per (configuration, workers): (x, y, ci) points.
fn series(pts: &[Point], f: impl Fn(&Point) -> Option<(f64, f64)>) -> Vec<svg::Series> {
    type Key = (String, usize);
    let mut by: BTreeMap<Key, Vec<(f64, f64, f64)>> = BTreeMap::new();
    for p in pts.iter().filter(|p| p.reps > 0) {
        if let Some((y, c)) = f(p) {
            if y.is_finite() {
                by.entry((p.config.clone(), p.workers)).or_default().push((
                    p.rate,
                    y,
                    if c.is_finite() { c } else { 0.0 },
                ));
            }
        }
    }
    by.into_iter()
        .map(|((c, w), mut pts)| {
            pts.sort_by(|a, b| a.0.partial_cmp(&b.0).unwrap_or(std::cmp::Ordering::Equal));
            svg::Series {
                label: format!("{c} w={w}"),
                points: pts,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::siplab::ProxyKind;

    fn cap(workers: usize, c: f64, censored: bool) -> Capacity {
        Capacity {
            config: "x".into(),
            proxy: ProxyKind::Ringway,
            profile: "default".into(),
            workers,
            capacity_cps: Some(c),
            below: None,
            above: None,
            probes: Vec::new(),
            censored,
        }
    }

    #[test]
    fn model_fit_leaves_out_lower_bounds() {
        // T = min(workers, 4): (1, 1000), (2, 2000) fit exactly with C₁,₁ = 1000;
        // the censored 4-worker point would pull it down if it were used.
        let f = fit_model(
            &[
                cap(1, 1000.0, false),
                cap(2, 2000.0, false),
                cap(4, 2500.0, true),
            ],
            2,
        );
        assert_eq!(f.len(), 1);
        assert!((f[0].c11.unwrap() - 1000.0).abs() < 1e-9);
        assert!((f[0].r2.unwrap() - 1.0).abs() < 1e-9);
        assert_eq!(f[0].censored_workers, vec![4]);
        // Equal capacities: R² is undefined, not 1.
        let f = fit_model(&[cap(1, 500.0, false), cap(2, 500.0, false)], 2);
        assert!(f[0].r2.is_none());
        // Only lower bounds: no fit, but the configuration is still listed.
        let f = fit_model(&[cap(1, 500.0, true)], 2);
        assert_eq!(f.len(), 1);
        assert!(f[0].c11.is_none() && f[0].r2.is_none());
        assert_eq!(f[0].censored_workers, vec![1]);
    }
}
