//! Latency histograms (HDR, nanoseconds) and their summary.

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

/// Largest latency a histogram of [`latency_histogram`] holds (100 s, in
/// ns); record with `saturating_record` or clamp to it.
pub const LATENCY_MAX_NS: u64 = 100_000_000_000;

/// A latency histogram in nanoseconds: 1 ns .. 100 s, 3 significant digits.
pub fn latency_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, LATENCY_MAX_NS, 3).expect("valid histogram bounds")
}

/// A latency histogram for a per-packet or per-message hot path: 1 ns ..
/// 100 s, 2 significant digits (1 % resolution, ~30 KiB of counters
/// instead of ~220 KiB). Recording is one load and store of a counter; at
/// 3 digits, with several histograms recorded per datagram, that load
/// missed the cache and showed in the profiles (the SFU engine's; the SIP
/// worker's, docs/sip-lab.md, issue 23).
pub fn compact_latency_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, LATENCY_MAX_NS, 2).expect("valid histogram bounds")
}

/// Two-sided 97.5% quantile of Student's t with `df` degrees of freedom
/// (NaN for 0): the table up to 30, then the Cornish–Fisher expansion
/// around the normal quantile (within 1e-4 of the exact value from 31 on).
pub fn t975(df: usize) -> f64 {
    const T: [f64; 30] = [
        12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160,
        2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056,
        2.052, 2.048, 2.045, 2.042,
    ];
    match df {
        0 => f64::NAN,
        1..=30 => T[df - 1],
        _ => {
            const Z: f64 = 1.959_963_985;
            let degrees = df as f64;
            let (z3, z5, z7) = (Z.powi(3), Z.powi(5), Z.powi(7));
            Z + (z3 + Z) / (4.0 * degrees)
                + (5.0 * z5 + 16.0 * z3 + 3.0 * Z) / (96.0 * degrees * degrees)
                + (3.0 * z7 + 19.0 * z5 + 17.0 * z3 - 15.0 * Z)
                    / (384.0 * degrees * degrees * degrees)
        }
    }
}

/// Summary of one latency histogram, in microseconds; all zero without
/// samples (`count` says whether there were any).
#[derive(Copy, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct LatencySummary {
    /// Samples.
    pub count: u64,
    /// Mean (µs).
    pub mean_us: f64,
    /// Half-width of the 95% confidence interval of the mean (µs, Student
    /// t over the samples; 0 for fewer than two).
    pub ci95_us: f64,
    /// Median (µs).
    pub p50_us: f64,
    /// 90th percentile (µs).
    pub p90_us: f64,
    /// 99th percentile (µs).
    pub p99_us: f64,
    /// Maximum (µs).
    pub max_us: f64,
}

impl LatencySummary {
    /// Summarise a histogram of nanoseconds.
    pub fn of_ns(h: &Histogram<u64>) -> LatencySummary {
        Self::of(h, 1e-3)
    }

    /// Summarise a histogram of microseconds.
    pub fn of_us(h: &Histogram<u64>) -> LatencySummary {
        Self::of(h, 1.0)
    }

    fn of(h: &Histogram<u64>, to_us: f64) -> LatencySummary {
        let samples = h.len();
        if samples == 0 {
            return LatencySummary::default();
        }
        let half_width = if samples >= 2 {
            t975(samples as usize - 1) * h.stdev() / (samples as f64).sqrt()
        } else {
            0.0
        };
        let quantile_us = |q: f64| h.value_at_quantile(q) as f64 * to_us;
        LatencySummary {
            count: samples,
            mean_us: h.mean() * to_us,
            ci95_us: half_width * to_us,
            p50_us: quantile_us(0.50),
            p90_us: quantile_us(0.90),
            p99_us: quantile_us(0.99),
            max_us: h.max() as f64 * to_us,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compact_histogram_is_within_one_percent_with_a_seventh_of_the_counters() {
        let mut compact = compact_latency_histogram();
        let full = latency_histogram();
        assert!(
            compact.distinct_values() * 7 <= full.distinct_values(),
            "{} counters against {}",
            compact.distinct_values(),
            full.distinct_values()
        );
        for ns in [1, 999, 1_900, 57_000, 3_000_000, 99_000_000_000] {
            compact.reset();
            compact.record(ns).unwrap();
            let seen = compact.value_at_quantile(0.5) as f64;
            assert!(
                (seen - ns as f64).abs() <= ns as f64 * 0.01,
                "{ns} ns read back as {seen}"
            );
        }
    }

    #[test]
    fn summary_in_microseconds() {
        let mut h = latency_histogram();
        for ns in [1_000, 2_000, 3_000] {
            h.record(ns).unwrap();
        }
        let s = LatencySummary::of_ns(&h);
        assert_eq!(s.count, 3);
        assert!((s.mean_us - 2.0).abs() < 0.01, "{s:?}");
        assert!(s.ci95_us > 0.0);
        assert!((s.p50_us - 2.0).abs() < 0.01);
        assert!((s.max_us - 3.0).abs() < 0.01);
        let mut us = Histogram::<u64>::new_with_bounds(1, 1_000_000, 3).unwrap();
        us.record(1500).unwrap();
        let s = LatencySummary::of_us(&us);
        assert!((s.p50_us - 1500.0).abs() < 2.0, "{s:?}");
        assert_eq!(s.ci95_us, 0.0, "one sample has no interval");
        assert_eq!(
            LatencySummary::of_ns(&latency_histogram()),
            LatencySummary::default()
        );
        assert!(t975(0).is_nan());
        assert_eq!(t975(4), 2.776);
        // Beyond the table (exact values: R's qt(0.975, df)); the old
        // steps gave 2.000 at 31 and 1.980 at 61.
        for (df, exact) in [
            (31, 2.039513),
            (45, 2.014103),
            (61, 1.999624),
            (120, 1.979930),
            (1000, 1.962339),
        ] {
            assert!((t975(df) - exact).abs() < 1e-4, "t975({df}) = {}", t975(df));
        }
    }
}
