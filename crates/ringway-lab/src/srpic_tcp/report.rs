//! Tables shaped like the SRPIC paper's Tables 4–8 and Fig. 2, from the
//! runs of a grid: mean ± 95 % CI over repetitions (Student t), SRPIC off
//! ("N-SRPIC") beside on. Counts are per Mb/s of throughput over a 50 s
//! run, as the paper's (`count · 50 s / duration / Mb/s`). A cell without
//! runs reads n/a. Flagged runs are left out and listed.

use super::{Cell, RunResult, Table, TcpLabConfig};
use crate::impair::eq3_block;
use crate::render::{self, Digits};
use crate::stats::{mean_ci, MeanCi};
use std::fmt::Write as _;

fn fmt(m: &MeanCi) -> String {
    render::mean_ci(m, Digits::ByMagnitude)
}

fn same_cell(a: &Cell, b: &Cell) -> bool {
    a == b
}

/// Runs of `cell` with SRPIC `on` (any arm with SRPIC on, or the `off`
/// arm: the A/A copy of off is only in the comparison), not flagged.
/// [`tables`] passes the primary placement's runs only.
fn runs<'a>(all: &'a [RunResult], cell: &Cell, on: bool) -> Vec<&'a RunResult> {
    all.iter()
        .filter(|r| same_cell(&r.cell, cell) && r.flagged.is_none())
        .filter(|r| if on { r.srpic } else { r.arm == super::OFF })
        .collect()
}

fn stat(rs: &[&RunResult], f: impl Fn(&RunResult) -> f64) -> MeanCi {
    let values: Vec<f64> = rs.iter().map(|r| f(r)).filter(|x| x.is_finite()).collect();
    if values.is_empty() {
        return MeanCi {
            mean: f64::NAN,
            ci95: f64::NAN,
            n: 0,
        };
    }
    mean_ci(&values)
}

/// A metric of a table: header and value of one run.
type Metric = (&'static str, fn(&RunResult) -> f64);

const THROUGHPUT: Metric = ("Throughput (Mbps)", |r| r.iperf.mbps);
const RETRANS: Metric = ("PktsRetrans/Mbps", |r| r.per_mbps(r.pkts_retrans()));
const DUPACKS: Metric = ("DupAcksIn/Mbps", |r| r.per_mbps(r.relay.to_sender.dup_acks));
const SACKS: Metric = ("SackBlocksRcvd/Mbps", |r| {
    r.per_mbps(r.relay.to_sender.sack_blocks)
});

const W: usize = 17;

fn header(s: &mut String, lead: &str, metrics: &[Metric]) {
    let _ = write!(s, "{lead:<26}");
    for (h, _) in metrics {
        let _ = write!(s, " {:^w$}", h, w = 2 * W + 1);
    }
    let _ = writeln!(s);
    let _ = write!(s, "{:<26}", "");
    for _ in metrics {
        let _ = write!(s, " {:>W$} {:>W$}", "N-SRPIC", "SRPIC");
    }
    let _ = writeln!(s);
}

fn row(s: &mut String, label: &str, all: &[RunResult], cell: &Cell, metrics: &[Metric]) {
    let (off, on) = (runs(all, cell, false), runs(all, cell, true));
    let _ = write!(s, "{label:<26}");
    for (_, f) in metrics {
        let _ = write!(s, " {:>W$} {:>W$}", fmt(&stat(&off, f)), fmt(&stat(&on, f)));
    }
    let _ = writeln!(s);
}

/// A fraction in percent, trailing zeros cut (0.005 → "0.5").
pub(super) fn pct(x: f64) -> String {
    let text = format!("{:.3}", x * 100.0);
    let text = text.trim_end_matches('0').trim_end_matches('.');
    text.to_string()
}

fn cells_of(c: &TcpLabConfig, t: Table) -> Vec<Cell> {
    c.cells().into_iter().filter(|x| x.table == t).collect()
}

/// All requested tables as text.
pub fn tables(c: &TcpLabConfig, every: &[RunResult]) -> String {
    let mut out = String::new();
    preamble(&mut out, c);
    // The paper-shaped tables: SRPIC off and on with the first placement.
    let primary: Vec<RunResult> = every
        .iter()
        .filter(|r| r.arm == super::OFF || r.arm == c.primary_arm())
        .cloned()
        .collect();
    let all = &primary[..];
    for &t in &c.tables {
        let cells = cells_of(c, t);
        match t {
            Table::T4 => table4(&mut out, c, all, &cells),
            Table::T5 => table5(&mut out, c, all, &cells),
            Table::T6 => table6(&mut out, c, all, &cells),
            Table::T8 => table8(&mut out, c, all, &cells),
            Table::Sweep => sweep(&mut out, c, all, &cells),
        }
    }
    let comparison = super::compare::compare(c, every);
    if !comparison.is_empty() {
        let _ = writeln!(out);
        out.push_str(&super::compare::table(&comparison).text());
        out.push_str(super::compare::LEGEND);
    }
    left_out(&mut out, every);
    out
}

/// The run settings every table shares (link, delays, receiver, assumptions).
fn preamble(out: &mut String, c: &TcpLabConfig) {
    let window = c.k();
    let _ = writeln!(
        out,
        "Link {} Mb/s (k = 1 Gb/s / rate = {:.1}); α = {} ms both ways{}; σ = β·α·k; {}; SRPIC placement {}; receiver: T_intr {:.0} µs, R_sn {:.0} packets/s, ring {} (the paper's receiver scaled by k); BlockSize {}; {} s per run, {} repetitions; TCP timestamps {}; counts per Mbps over 50 s.",
        c.rate_mbps,
        window,
        c.alpha_run_ms(),
        if c.scale_alpha { " (--scale-alpha: k·α)" } else { "" },
        match c.router_scaled() {
            Some(r) => format!(
                "ASSUMPTION router receive batching: polls every {:.0} µs, {:.1} µs per packet (the paper's scale × k; not the paper's stated model)",
                r.poll_ns as f64 / 1e3,
                r.per_packet_ns as f64 / 1e3
            ),
            None => "no router batching (the paper's stated model)".to_string(),
        },
        c.placements
            .iter()
            .map(|p| format!("{} ({})", p.label(), p.arm()))
            .collect::<Vec<_>>()
            .join(", "),
        c.receiver().t_intr_ns as f64 / 1e3,
        c.receiver().rsn_pps,
        c.receiver().ring,
        c.block,
        c.duration_s,
        c.reps,
        if c.timestamps { "on" } else { "off" }
    );
}

/// Table 4: reordering, β varied, SACK off.
fn table4(out: &mut String, c: &TcpLabConfig, all: &[RunResult], cells: &[Cell]) {
    let _ = writeln!(
        out,
        "\nTable 4. Reordering: α = {} ms, β varied, no loss, SACK off.",
        c.alpha_run_ms()
    );
    header(
        out,
        "                      β (%)",
        &[THROUGHPUT, RETRANS, DUPACKS],
    );
    for x in cells {
        let label = format!(
            "{} {:>2} stream{} {:>5}",
            x.sender.name(),
            x.streams,
            if x.streams == 1 { " " } else { "s" },
            pct(x.beta)
        );
        row(out, &label, all, x, &[THROUGHPUT, RETRANS, DUPACKS]);
    }
    let label = |x: &Cell| {
        format!(
            "{} {:>2} st β {:>5}%",
            x.sender.name(),
            x.streams,
            pct(x.beta)
        )
    };
    receiver_view(out, all, cells, label);
    recovery_view(out, all, cells, label);
}

/// Table 5: packet drops, δ varied, with Table 7's CPU.
fn table5(out: &mut String, c: &TcpLabConfig, all: &[RunResult], cells: &[Cell]) {
    let _ = writeln!(
        out,
        "\nTable 5. Packet drops: α = {} ms both ways, δ varied, 1 stream, SACK on.",
        c.alpha_run_ms()
    );
    rows_with_sacks(out, all, cells, "                  δ (%)", |x| {
        format!("{} {:>13}", x.sender.name(), pct(x.delta))
    });
    table7(out, all, cells);
    recovery_view(out, all, cells, |x| {
        format!("{} δ {:>5}%", x.sender.name(), pct(x.delta))
    });
}

/// Table 6: reordering and drops together.
fn table6(out: &mut String, c: &TcpLabConfig, all: &[RunResult], cells: &[Cell]) {
    let _ = writeln!(
        out,
        "\nTable 6. Reordering and drops: α = {} ms, β = {} %, δ varied, SACK on.",
        c.alpha_run_ms(),
        pct(c.beta_loss)
    );
    rows_with_sacks(out, all, cells, "                 streams δ (%)", |x| {
        format!("{} {:>7} {:>5}", x.sender.name(), x.streams, pct(x.delta))
    });
    let label = |x: &Cell| {
        format!(
            "{} {:>2} st δ {:>5}%",
            x.sender.name(),
            x.streams,
            pct(x.delta)
        )
    };
    receiver_view(out, all, cells, label);
    recovery_view(out, all, cells, label);
}

/// Table 8: impairments on the forward and the reverse path.
fn table8(out: &mut String, c: &TcpLabConfig, all: &[RunResult], cells: &[Cell]) {
    let _ = writeln!(
        out,
        "\nTable 8. Forward and reverse paths: β = {} % and δ on both, 1 stream, SACK on.",
        pct(c.beta_loss)
    );
    rows_with_sacks(out, all, cells, "                  δ (%)", |x| {
        format!("{} {:>13}", x.sender.name(), pct(x.delta))
    });
}

/// The header and one row per cell of the tables with SACK columns (5, 6, 8).
fn rows_with_sacks(
    out: &mut String,
    all: &[RunResult],
    cells: &[Cell],
    heading: &str,
    label: impl Fn(&Cell) -> String,
) {
    let columns = [THROUGHPUT, RETRANS, DUPACKS, SACKS];
    header(out, heading, &columns);
    for x in cells {
        row(out, &label(x), all, x, &columns);
    }
}

/// The runs the exclusion rules left out, with the reason.
fn left_out(out: &mut String, all: &[RunResult]) {
    let flagged: Vec<&RunResult> = all.iter().filter(|r| r.flagged.is_some()).collect();
    if !flagged.is_empty() {
        let _ = writeln!(out, "\nLeft out ({} runs):", flagged.len());
        for r in flagged {
            let _ = writeln!(
                out,
                "  {:?} {} {} st β {} δ {} srpic {} rep {}: {}",
                r.cell.table,
                r.cell.sender.name(),
                r.cell.streams,
                pct(r.cell.beta),
                pct(r.cell.delta),
                r.arm,
                r.rep,
                r.flagged.as_deref().unwrap_or("")
            );
        }
    }
}

/// Table 7: CPU of the drop experiments (the paper's oprofile event counts
/// are not available on this VM: CPU seconds instead).
fn table7(s: &mut String, all: &[RunResult], cells: &[Cell]) {
    let _ = writeln!(
        s,
        "\nTable 7. CPU of the packet drop runs (CPU seconds per run: sender = iperf3 -c + its kernel's ACK path; receiver = iperf3 -s + driver/sorting + kernel receive path; µs per Mbit in brackets)."
    );
    let _ = writeln!(
        s,
        "{:<26} {:<8} {:>W$} {:>12} {:>W$} {:>12}",
        "                  δ (%)", "", "Sender", "µs/Mbit", "Receiver", "µs/Mbit"
    );
    for x in cells {
        for on in [true, false] {
            let runs_on = runs(all, x, on);
            let per = |f: fn(&RunResult) -> f64| {
                stat(&runs_on, move |r| {
                    f(r) * 1e6 / (r.iperf.mbps * r.iperf.seconds)
                })
            };
            let _ = writeln!(
                s,
                "{:<26} {:<8} {:>W$} {:>12} {:>W$} {:>12}",
                format!("{} {:>13}", x.sender.name(), pct(x.delta)),
                if on { "SRPIC" } else { "NSRPIC" },
                fmt(&stat(&runs_on, |r| r.sender_cpu_s)),
                fmt(&per(|r| r.sender_cpu_s)),
                fmt(&stat(&runs_on, |r| r.receiver_cpu_s)),
                fmt(&per(|r| r.receiver_cpu_s)),
            );
        }
    }
}

/// What the receiver saw: RFC 4737 reordered ratio of the data as it
/// arrived and as its stack got it, the receiver kernel's out-of-order
/// queueing (TcpExtTCPOFOQueue) per Mbps, and the receive blocks.
fn receiver_view(
    s: &mut String,
    all: &[RunResult],
    cells: &[Cell],
    label: impl Fn(&Cell) -> String,
) {
    let _ = writeln!(
        s,
        "  receiver: RFC 4737 reordered ratio of the data (arrival → after the driver), TcpExtTCPOFOQueue/Mbps and TcpExtTCPHPHits per data segment (fast path), N-SRPIC | SRPIC; mean block"
    );
    for x in cells {
        let (off, on) = (runs(all, x, false), runs(all, x, true));
        let ofo =
            |r: &RunResult| r.per_mbps(*r.receiver_nstat.get("TcpExtTCPOFOQueue").unwrap_or(&0));
        let hol_percent = |r: &RunResult| {
            *r.receiver_nstat.get("TcpExtTCPHPHits").unwrap_or(&0) as f64
                / r.relay.delivery_order.0.max(1) as f64
        };
        let _ = writeln!(
            s,
            "  {:<26} reord {} → {} | {} → {}   OFO/Mbps {} | {}   HPHits {} | {}   block {}",
            label(x),
            fmt(&stat(&off, |r| r.relay.arrival_order.2)),
            fmt(&stat(&off, |r| r.relay.delivery_order.2)),
            fmt(&stat(&on, |r| r.relay.arrival_order.2)),
            fmt(&stat(&on, |r| r.relay.delivery_order.2)),
            fmt(&stat(&off, ofo)),
            fmt(&stat(&on, ofo)),
            fmt(&stat(&off, hol_percent)),
            fmt(&stat(&on, hol_percent)),
            fmt(&stat(&on, |r| r.relay.blocks.mean())),
        );
    }
}

/// The sender's recoveries and undos (nstat, per 50 s of run) and the
/// relay's p99 lateness (blocks | ACKs) of the runs in the table.
fn recovery_view(
    s: &mut String,
    all: &[RunResult],
    cells: &[Cell],
    label: impl Fn(&Cell) -> String,
) {
    let _ = writeln!(
        s,
        "  sender (nstat, per 50 s): fast recoveries entered (Reno + SACK), undone (full + partial + DSACK), kept (entered − undone), spurious RTOs (F-RTO), RTO undos, timeouts, N-SRPIC | SRPIC; relay lateness p99 µs (blocks / ACKs)"
    );
    for x in cells {
        let (off, on) = (runs(all, x, false), runs(all, x, true));
        let both =
            |f: fn(&RunResult) -> f64| format!("{} | {}", fmt(&stat(&off, f)), fmt(&stat(&on, f)));
        let _ = writeln!(
            s,
            "  {:<26} recoveries {}   undone {}   kept {}   spurious RTOs {}   RTO undos {}   timeouts {}   late p99 {} / {}",
            label(x),
            both(|r| r.per_50s(r.recovery.recoveries())),
            both(|r| r.per_50s(r.recovery.undone())),
            both(|r| r.per_50s(r.recovery.kept())),
            both(|r| r.per_50s(r.recovery.spurious_rtos)),
            both(|r| r.per_50s(r.recovery.loss_undo)),
            both(|r| r.per_50s(r.recovery.timeouts)),
            fmt(&stat(&off.iter().chain(&on).copied().collect::<Vec<_>>(), |r| r.relay.late_us.1)),
            fmt(&stat(&off.iter().chain(&on).copied().collect::<Vec<_>>(), |r| r.relay.ack_late_us.1)),
        );
    }
}

/// Fig. 2 / eq. 1–3: block sizes against the incoming rate, the same
/// receiver throughout; eq. 3's prediction at the measured packet rate.
fn sweep(s: &mut String, c: &TcpLabConfig, all: &[RunResult], cells: &[Cell]) {
    let receiver = c.receiver();
    let _ = writeln!(
        s,
        "\nFig. 2 / eq. 1–3. Block sizes vs rate (no impairment but α, SRPIC off, 1 stream); eq. 3 at the measured rate P (packets of {} bytes).",
        super::hosts::MTU
    );
    let _ = writeln!(
        s,
        "{:>10} {:>W$} {:>12} {:>W$} {:>6} {:>6} {:>6} {:>10}",
        "link Mb/s", "throughput Mb/s", "P (pps)", "mean block", "p50", "p90", "max", "eq. 3"
    );
    for x in cells {
        let runs_off = runs(all, x, false);
        let mut histogram = crate::impair::BlockHistogram::default();
        for r in &runs_off {
            histogram.merge(&r.relay.blocks);
        }
        let tput = stat(&runs_off, |r| r.iperf.mbps);
        let pps = tput.mean * 1e6 / (super::hosts::MTU as f64 * 8.0);
        let eq3 = eq3_block(pps, receiver.t_intr_ns as f64 / 1e9, receiver.rsn_pps)
            .map_or("ring".to_string(), |b| format!("{b:.0}"));
        let quantile = |f: f64| {
            histogram
                .quantile(f)
                .map_or("n/a".to_string(), |v| v.to_string())
        };
        let _ = writeln!(
            s,
            "{:>10.1} {:>W$} {:>12.0} {:>W$} {:>6} {:>6} {:>6} {:>10}",
            x.rate_mbps,
            fmt(&tput),
            pps,
            fmt(&stat(&runs_off, |r| r.relay.blocks.mean())),
            quantile(0.5),
            quantile(0.9),
            quantile(1.0),
            eq3
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cells_without_runs_read_na_and_single_runs_say_so() {
        assert_eq!(fmt(&mean_ci(&[])), "n/a");
        assert_eq!(fmt(&mean_ci(&[95.94])), "95.94 (n=1)");
        assert_eq!(fmt(&mean_ci(&[0.5, 0.5])), "0.500 ± 0.000");
        assert_eq!(fmt(&mean_ci(&[120.0, 140.0])), "130.0 ± 127.1");
    }
}
