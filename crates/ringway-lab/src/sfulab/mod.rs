//! SFU experiment analysis (pktswitch Fig. 3-5): per-run measurements of
//! the SFU engine (CPU user/kernel %, per-packet processing delay) are
//! grouped by (backend, clients, packet rate), summarised with 95%
//! confidence intervals, compared with the `socket` baseline, and fitted to
//! the delay model d(n) = k_rcv + n · k_snd (n = copies per packet).

pub mod experiment;

use crate::stats::{fit_line, mean_ci, LineFit, MeanCi};
use serde::Serialize;
use std::collections::BTreeMap;
use std::fmt::Write;

/// One measured run.
#[derive(Clone, Debug, Serialize)]
pub struct Run {
    /// Backend name (`socket`, `mmsg`).
    pub backend: String,
    /// Number of clients.
    pub clients: usize,
    /// Packets per second sent by each client.
    pub pps: u32,
    /// Repetition index.
    pub rep: usize,
    /// Engine user CPU (% of one core).
    pub cpu_user_pct: f64,
    /// Engine kernel CPU (% of one core).
    pub cpu_system_pct: f64,
    /// Processing delay median (µs).
    pub delay_p50_us: f64,
    /// Processing delay 99th percentile (µs).
    pub delay_p99_us: f64,
    /// Processing delay mean (µs).
    pub delay_mean_us: f64,
    /// Delay from the kernel RX stamp (socket-queue wait included), median (µs; NaN if unavailable).
    pub kdelay_p50_us: f64,
    /// Same, 99th percentile (µs).
    pub kdelay_p99_us: f64,
    /// Mean copies per forwarded packet (subscribers + echo).
    pub copies_per_packet: f64,
    /// Media packets the SFU accepted.
    pub media: u64,
    /// Packets the clients counted as lost.
    pub client_lost: u64,
    /// Median RTT the clients measured through the echo (µs).
    pub client_rtt_p50_us: f64,
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
    /// User CPU %.
    pub cpu_user: MeanCi,
    /// Kernel CPU %.
    pub cpu_system: MeanCi,
    /// Delay p50 (µs).
    pub delay_p50: MeanCi,
    /// Delay p99 (µs).
    pub delay_p99: MeanCi,
    /// Delay mean (µs).
    pub delay_mean: MeanCi,
    /// Delay from the kernel RX stamp, p50 (µs).
    pub kdelay_p50: MeanCi,
    /// Delay from the kernel RX stamp, p99 (µs).
    pub kdelay_p99: MeanCi,
    /// Copies per packet.
    pub copies: f64,
    /// Total CPU relative to the socket baseline of the same cell.
    pub cpu_ratio: Option<f64>,
    /// Delay p50 relative to the socket baseline.
    pub delay_p50_ratio: Option<f64>,
    /// Delay p99 relative to the socket baseline.
    pub delay_p99_ratio: Option<f64>,
    /// Kernel-stamped delay p50 relative to the socket baseline.
    pub kdelay_p50_ratio: Option<f64>,
}

/// Fitted delay model of one backend.
#[derive(Clone, Debug, Serialize)]
pub struct DelayModel {
    /// Backend.
    pub backend: String,
    /// k_rcv (µs): intercept.
    pub k_rcv_us: f64,
    /// k_snd (µs per copy): slope.
    pub k_snd_us: f64,
    /// R² of the fit.
    pub r2: f64,
    /// Points used.
    pub points: usize,
}

/// Whole-experiment summary.
#[derive(Clone, Debug, Serialize)]
pub struct Summary {
    /// Per-cell rows.
    pub rows: Vec<Row>,
    /// Delay model per backend (fitted on every run's median delay vs copies;
    /// the median is robust to scheduling outliers on shared machines).
    pub models: Vec<DelayModel>,
    /// Mean ratio over cells of each backend to socket: (backend, cpu,
    /// delay p50, delay p99, kernel-stamped delay p50).
    pub overall: Vec<(String, f64, f64, f64, f64)>,
}

fn col(runs: &[&Run], f: impl Fn(&Run) -> f64) -> Vec<f64> {
    runs.iter().map(|r| f(r)).collect()
}

/// Group, summarise, compare with `socket`, fit models.
pub fn summarize(runs: &[Run]) -> Summary {
    let mut cells: BTreeMap<(usize, u32, String), Vec<&Run>> = BTreeMap::new();
    for r in runs {
        cells
            .entry((r.clients, r.pps, r.backend.clone()))
            .or_default()
            .push(r);
    }
    let mut rows = Vec::new();
    for ((clients, pps, backend), rs) in &cells {
        rows.push(Row {
            backend: backend.clone(),
            clients: *clients,
            pps: *pps,
            cpu_user: mean_ci(&col(rs, |r| r.cpu_user_pct)),
            cpu_system: mean_ci(&col(rs, |r| r.cpu_system_pct)),
            delay_p50: mean_ci(&col(rs, |r| r.delay_p50_us)),
            delay_p99: mean_ci(&col(rs, |r| r.delay_p99_us)),
            delay_mean: mean_ci(&col(rs, |r| r.delay_mean_us)),
            kdelay_p50: mean_ci(&col(rs, |r| r.kdelay_p50_us)),
            kdelay_p99: mean_ci(&col(rs, |r| r.kdelay_p99_us)),
            copies: mean_ci(&col(rs, |r| r.copies_per_packet)).mean,
            cpu_ratio: None,
            delay_p50_ratio: None,
            delay_p99_ratio: None,
            kdelay_p50_ratio: None,
        });
    }
    let base: BTreeMap<(usize, u32), (f64, f64, f64, f64)> = rows
        .iter()
        .filter(|r| r.backend == "socket")
        .map(|r| {
            (
                (r.clients, r.pps),
                (
                    r.cpu_user.mean + r.cpu_system.mean,
                    r.delay_p50.mean,
                    r.delay_p99.mean,
                    r.kdelay_p50.mean,
                ),
            )
        })
        .collect();
    let ratio = |a: f64, b: f64| (b > 0.0 && a.is_finite()).then(|| a / b);
    for r in rows.iter_mut() {
        if let Some(&(cpu, p50, p99, k50)) = base.get(&(r.clients, r.pps)) {
            r.kdelay_p50_ratio = ratio(r.kdelay_p50.mean, k50);
            r.cpu_ratio = ratio(r.cpu_user.mean + r.cpu_system.mean, cpu);
            r.delay_p50_ratio = ratio(r.delay_p50.mean, p50);
            r.delay_p99_ratio = ratio(r.delay_p99.mean, p99);
        }
    }
    let mut backends: Vec<String> = rows.iter().map(|r| r.backend.clone()).collect();
    backends.sort();
    backends.dedup();
    let mut models = Vec::new();
    let mut overall = Vec::new();
    for b in &backends {
        let pts: Vec<(f64, f64)> = runs
            .iter()
            .filter(|r| &r.backend == b && r.copies_per_packet > 0.0)
            .map(|r| (r.copies_per_packet, r.delay_p50_us))
            .collect();
        if let Some(LineFit {
            intercept,
            slope,
            r2,
        }) = fit_line(&pts)
        {
            models.push(DelayModel {
                backend: b.clone(),
                k_rcv_us: intercept,
                k_snd_us: slope,
                r2,
                points: pts.len(),
            });
        }
        let mine: Vec<&Row> = rows.iter().filter(|r| &r.backend == b).collect();
        let avg = |f: &dyn Fn(&Row) -> Option<f64>| {
            let v: Vec<f64> = mine.iter().filter_map(|r| f(r)).collect();
            if v.is_empty() {
                f64::NAN
            } else {
                v.iter().sum::<f64>() / v.len() as f64
            }
        };
        overall.push((
            b.clone(),
            avg(&|r| r.cpu_ratio),
            avg(&|r| r.delay_p50_ratio),
            avg(&|r| r.delay_p99_ratio),
            avg(&|r| r.kdelay_p50_ratio),
        ));
    }
    Summary {
        rows,
        models,
        overall,
    }
}

fn ci(m: &MeanCi) -> String {
    if m.mean.is_finite() {
        format!("{:.1}±{:.1}", m.mean, m.ci95)
    } else {
        "n/a".into()
    }
}

fn opt(r: Option<f64>) -> String {
    r.map(|v| format!("{v:.2}")).unwrap_or_else(|| "-".into())
}

/// Render the summary as a text table.
pub fn render(s: &Summary) -> String {
    let mut o = String::new();
    let _ = writeln!(
        o,
        "{:>7} {:>5} {:>7} {:>6} {:>12} {:>12} {:>12} {:>12} {:>12} {:>7} {:>7} {:>7} {:>7}",
        "clients",
        "pps",
        "backend",
        "copies",
        "cpu_user%",
        "cpu_kern%",
        "delay_p50us",
        "delay_p99us",
        "kdelay_p50us",
        "cpu/s",
        "p50/s",
        "p99/s",
        "kp50/s"
    );
    for r in &s.rows {
        let _ = writeln!(
            o,
            "{:>7} {:>5} {:>7} {:>6.1} {:>12} {:>12} {:>12} {:>12} {:>12} {:>7} {:>7} {:>7} {:>7}",
            r.clients,
            r.pps,
            r.backend,
            r.copies,
            ci(&r.cpu_user),
            ci(&r.cpu_system),
            ci(&r.delay_p50),
            ci(&r.delay_p99),
            ci(&r.kdelay_p50),
            opt(r.cpu_ratio),
            opt(r.delay_p50_ratio),
            opt(r.delay_p99_ratio),
            opt(r.kdelay_p50_ratio)
        );
    }
    let _ = writeln!(
        o,
        "(±: 95% CI over repetitions; x/s: ratio to the socket backend; delay: app receive -> \
         last copy to the kernel; kdelay: kernel RX stamp -> last copy, socket-queue wait included)"
    );
    let x = |v: f64| {
        if v.is_finite() {
            format!("{v:.2}x")
        } else {
            "n/a".into()
        }
    };
    for (b, cpu, p50, p99, k50) in s.overall.iter().filter(|o| o.0 != "socket") {
        let _ = writeln!(
            o,
            "overall {b} vs socket: cpu {}, delay p50 {}, delay p99 {}, kdelay p50 {}",
            x(*cpu),
            x(*p50),
            x(*p99),
            x(*k50)
        );
    }
    for m in &s.models {
        let _ = writeln!(
            o,
            "delay model {}: d(n) = {:.2} us + n * {:.2} us  (median delay, R2 {:.3}, {} runs; n = copies/packet)",
            m.backend, m.k_rcv_us, m.k_snd_us, m.r2, m.points
        );
    }
    o
}

/// An SVG plot of median delay versus copies per packet, one series per backend,
/// with the fitted model lines.
pub fn svg(runs: &[Run], s: &Summary) -> String {
    let (w, h, m) = (640.0, 400.0, 50.0);
    let xmax = runs
        .iter()
        .map(|r| r.copies_per_packet)
        .fold(1.0f64, f64::max)
        * 1.1;
    let ymax = runs.iter().map(|r| r.delay_p50_us).fold(1.0f64, f64::max) * 1.1;
    let px = |x: f64| m + x / xmax * (w - 2.0 * m);
    let py = |y: f64| h - m - y / ymax * (h - 2.0 * m);
    let colors = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd"];
    let mut o = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\">\n\
         <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n\
         <line x1=\"{m}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"black\"/>\n\
         <line x1=\"{m}\" y1=\"{m}\" x2=\"{m}\" y2=\"{}\" stroke=\"black\"/>\n\
         <text x=\"{}\" y=\"{}\" font-size=\"12\">copies per packet (n)</text>\n\
         <text x=\"5\" y=\"{}\" font-size=\"12\">delay (us, max {ymax:.0})</text>\n",
        h - m,
        w - m,
        h - m,
        h - m,
        w / 2.0 - 50.0,
        h - 15.0,
        m - 10.0
    );
    for (i, mdl) in s.models.iter().enumerate() {
        let c = colors[i % colors.len()];
        for r in runs.iter().filter(|r| r.backend == mdl.backend) {
            let _ = writeln!(
                o,
                "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"3\" fill=\"{c}\"/>",
                px(r.copies_per_packet),
                py(r.delay_p50_us)
            );
        }
        let y0 = mdl.k_rcv_us;
        let y1 = mdl.k_rcv_us + mdl.k_snd_us * xmax;
        let _ = writeln!(
            o,
            "<line x1=\"{:.1}\" y1=\"{:.1}\" x2=\"{:.1}\" y2=\"{:.1}\" stroke=\"{c}\"/>\n\
             <text x=\"{:.1}\" y=\"{:.1}\" font-size=\"12\" fill=\"{c}\">{}: {:.1} + n*{:.2} us</text>",
            px(0.0),
            py(y0.max(0.0)),
            px(xmax),
            py(y1.max(0.0)),
            m + 10.0,
            m + 15.0 * (i as f64 + 1.0),
            mdl.backend,
            mdl.k_rcv_us,
            mdl.k_snd_us
        );
    }
    o.push_str("</svg>\n");
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(backend: &str, clients: usize, rep: usize, cpu: f64, d: f64) -> Run {
        Run {
            backend: backend.into(),
            clients,
            pps: 750,
            rep,
            cpu_user_pct: cpu,
            cpu_system_pct: cpu,
            delay_p50_us: d,
            delay_p99_us: 2.0 * d,
            delay_mean_us: d,
            kdelay_p50_us: d + 1.0,
            kdelay_p99_us: d + 2.0,
            copies_per_packet: clients as f64,
            media: 1,
            client_lost: 0,
            client_rtt_p50_us: 0.0,
        }
    }

    #[test]
    fn ratios_and_model() {
        let mut runs = Vec::new();
        for rep in 0..3 {
            for n in [6, 8, 10] {
                // socket: d = 5 + 2n; mmsg: d = 10 + 1n, half the CPU
                runs.push(run("socket", n, rep, 10.0, 5.0 + 2.0 * n as f64));
                runs.push(run("mmsg", n, rep, 5.0, 10.0 + n as f64));
            }
        }
        let s = summarize(&runs);
        assert_eq!(s.rows.len(), 6);
        let m = s.models.iter().find(|m| m.backend == "socket").unwrap();
        assert!((m.k_rcv_us - 5.0).abs() < 1e-9 && (m.k_snd_us - 2.0).abs() < 1e-9);
        let r = s
            .rows
            .iter()
            .find(|r| r.backend == "mmsg" && r.clients == 6)
            .unwrap();
        assert_eq!(r.cpu_ratio, Some(0.5));
        assert!((r.delay_p50_ratio.unwrap() - 16.0 / 17.0).abs() < 1e-9);
        let o = s.overall.iter().find(|o| o.0 == "mmsg").unwrap();
        assert!((o.1 - 0.5).abs() < 1e-9);
        let t = render(&s);
        assert!(t.contains("delay model socket"));
        assert!(svg(&runs, &s).starts_with("<svg"));
    }
}
