//! Background load on the proxy's CPUs during a run: what other tasks and
//! the hypervisor took of them while the load ran. Busy = the CPUs' wall
//! time less their idle and iowait time (`/proc/stat`; steal counts as
//! taken), minus the proxy's own CPU time over the same window, as a share
//! of the proxy CPUs' time. A run above the threshold shared its CPUs and
//! is flagged (left out of capacities and comparisons).
//!
//! Idle time is measured exactly (NO_HZ idle accounting); the busy fields
//! (user, system, softirq …) are tick samples, biased for a load in step
//! with the 4 ms tick (docs/pktswitch.md, issue 25), so they are not used.

use serde::{Deserialize, Serialize};

/// Default largest foreign share of the proxy's CPUs (%).
pub const DEFAULT_MAX_FOREIGN_CPU_PCT: f64 = 20.0;

/// Ticks of a set of CPUs, summed (`/proc/stat`, USER_HZ).
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct CpuTicks {
    /// All time (as the ticks sampled it).
    pub total: u64,
    /// Busy (user, nice, system, irq, softirq) as the ticks sampled it,
    /// steal not included.
    pub busy: u64,
    /// Idle and iowait (exact).
    pub idle: u64,
    /// Taken by the hypervisor.
    pub steal: u64,
    /// How many CPUs.
    pub cpus: u64,
    /// CLOCK_MONOTONIC when read, ns (0 from a text).
    pub at_ns: u64,
}

/// The ticks of `cpus` in a `/proc/stat` text (`None`: a CPU is missing).
pub fn parse_proc_stat(text: &str, cpus: &[usize]) -> Option<CpuTicks> {
    let mut sum = CpuTicks::default();
    for &cpu in cpus {
        let name = format!("cpu{cpu}");
        let line = text
            .lines()
            .find(|l| l.split_whitespace().next() == Some(name.as_str()))?;
        let fields: Vec<u64> = line
            .split_whitespace()
            .skip(1)
            .filter_map(|x| x.parse().ok())
            .collect();
        if fields.len() < 8 {
            return None;
        }
        // user nice system idle iowait irq softirq steal (guest is in user).
        sum.total += fields[..8].iter().sum::<u64>();
        sum.busy += fields[0] + fields[1] + fields[2] + fields[5] + fields[6];
        sum.idle += fields[3] + fields[4];
        sum.steal += fields[7];
        sum.cpus += 1;
    }
    Some(sum)
}

/// The ticks of `cpus` now.
pub fn read(cpus: &[usize]) -> Option<CpuTicks> {
    let at_ns = ringway_io::time::monotonic_now().0;
    let ticks = parse_proc_stat(&std::fs::read_to_string("/proc/stat").ok()?, cpus)?;
    Some(CpuTicks { at_ns, ..ticks })
}

/// The 1-minute load average now.
pub fn loadavg1() -> Option<f64> {
    std::fs::read_to_string("/proc/loadavg")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// Background load of one run.
#[derive(Copy, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Background {
    /// CPU time of the proxy's CPUs not used by the proxy (other tasks and
    /// steal), % of those CPUs' time over the load.
    pub foreign_cpu_pct: f64,
    /// Of which steal (%).
    pub steal_pct: f64,
    /// 1-minute load average when the load started.
    pub loadavg1: f64,
}

/// The background of a window: `before`/`after` the ticks of the proxy's
/// CPUs, `proxy_ns` the proxy's CPU time in between, `tick_ns` per tick.
/// The window's length is the clock between the two reads (`at_ns`), or
/// the ticks' total where a read has no time (parsed from a text).
pub fn background(
    before: CpuTicks,
    after: CpuTicks,
    proxy_ns: u64,
    tick_ns: u64,
    loadavg1: f64,
) -> Option<Background> {
    if before.cpus != after.cpus {
        return None;
    }
    let total = if before.at_ns > 0 && after.at_ns > before.at_ns {
        (after.at_ns - before.at_ns) * after.cpus
    } else {
        after.total.checked_sub(before.total)? * tick_ns
    };
    if total == 0 {
        return None;
    }
    let idle = after.idle.checked_sub(before.idle)? * tick_ns;
    let steal = after.steal.checked_sub(before.steal)? * tick_ns;
    // Busy including steal: everything the CPUs did not idle.
    let busy = total.saturating_sub(idle);
    let foreign = busy.saturating_sub(proxy_ns);
    Some(Background {
        foreign_cpu_pct: 100.0 * foreign as f64 / total as f64,
        steal_pct: 100.0 * steal as f64 / total as f64,
        loadavg1,
    })
}

/// The flag of a run whose proxy CPUs carried more than `max_pct` of other load.
pub fn flag(bg: &Background, max_pct: f64) -> Option<String> {
    (bg.foreign_cpu_pct > max_pct).then(|| {
        format!(
            "shared CPUs: other load took {:.0}% of the proxy's CPUs (steal {:.0}% and load average {:.1}; limit {max_pct:.0}%)",
            bg.foreign_cpu_pct, bg.steal_pct, bg.loadavg1
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const STAT0: &str = "cpu  10 0 10 100 0 0 0 0 0 0\n\
        cpu0 100 0 50 1000 10 0 5 0 0 0\n\
        cpu1 200 0 20 900 0 0 0 3 0 0\nintr 1\n";
    const STAT1: &str = "cpu  10 0 10 100 0 0 0 0 0 0\n\
        cpu0 160 0 80 1040 10 0 10 10 0 0\n\
        cpu1 300 0 20 900 0 0 0 3 0 0\nintr 1\n";

    #[test]
    fn foreign_load_is_the_busy_and_stolen_time_the_proxy_did_not_use() {
        let a = parse_proc_stat(STAT0, &[0]).unwrap();
        assert_eq!(
            a,
            CpuTicks {
                total: 1165,
                busy: 155,
                idle: 1010,
                steal: 0,
                cpus: 1,
                at_ns: 0,
            }
        );
        // A CPU without a line gives nothing ("cpu1" never matches "cpu10").
        assert!(parse_proc_stat(STAT0, &[10]).is_none());
        let b = parse_proc_stat(STAT1, &[0]).unwrap();
        // Window: 145 ticks; busy +95, steal +10; the proxy used 50 ticks.
        let bg = background(a, b, 50 * 10_000_000, 10_000_000, 1.5).unwrap();
        assert!(
            (bg.foreign_cpu_pct - 100.0 * 55.0 / 145.0).abs() < 1e-9,
            "{bg:?}"
        );
        assert!((bg.steal_pct - 100.0 * 10.0 / 145.0).abs() < 1e-9);
        assert!(flag(&bg, 20.0).unwrap().contains("38%"));
        assert!(flag(&bg, 40.0).is_none());
        // The proxy used all the busy time: nothing foreign.
        let bg = background(a, b, 200 * 10_000_000, 10_000_000, 0.0).unwrap();
        assert_eq!(bg.foreign_cpu_pct, 0.0);
        // Sets sum over their CPUs.
        let both = parse_proc_stat(STAT0, &[0, 1]).unwrap();
        assert_eq!(both.total, 1165 + 1123);
        assert!(background(b, a, 0, 1, 0.0).is_none(), "counters went back");
    }

    /// The busy time is the window less the exact idle time, not the
    /// tick-sampled busy fields: a CPU whose ticks all fell into idle
    /// moments (busy +0) that idled only 600 of 1 000 ms was busy 400 ms.
    #[test]
    fn busy_time_is_the_window_less_the_exact_idle_time() {
        let tick = 10_000_000;
        let before = CpuTicks {
            total: 1000,
            busy: 100,
            idle: 900,
            steal: 0,
            cpus: 1,
            at_ns: 5_000_000_000,
        };
        let after = CpuTicks {
            total: 1100,
            busy: 100,
            idle: 960,
            at_ns: 6_000_000_000,
            ..before
        };
        // The proxy used 100 ms of the 400 ms busy: 300 ms = 30 % foreign.
        let bg = background(before, after, 100_000_000, tick, 0.0).unwrap();
        assert!((bg.foreign_cpu_pct - 30.0).abs() < 1e-9, "{bg:?}");
        // Two CPUs: the window counts twice.
        let (b2, a2) = (
            CpuTicks { cpus: 2, ..before },
            CpuTicks { cpus: 2, ..after },
        );
        let bg = background(b2, a2, 100_000_000, tick, 0.0).unwrap();
        assert!(
            (bg.foreign_cpu_pct - 100.0 * 1.3 / 2.0).abs() < 1e-9,
            "{bg:?}"
        );
        // A set of CPUs that changed between the reads gives nothing.
        assert!(background(before, a2, 0, tick, 0.0).is_none());
    }
}
