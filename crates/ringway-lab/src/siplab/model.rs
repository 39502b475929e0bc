//! The papers' capacity model, a queueing check, paired comparisons and
//! per-repetition capacities (pure functions).
//!
//! Capacity model (paper B, section V): C_{p,c} = T_{p,c} × C_{1,1}, with
//! T_{1,c} = c + 2 on one processor and T_{p,c} = c for p ≥ 2; C_{1,1} is
//! the measured capacity of one core and one thread.
//!
//! Queueing check: K_rcv (the papers' waiting time) predicted from the
//! arrival rate λ and a mean service time S by M/M/1, W_q = ρS/(1−ρ), and
//! M/D/1, W_q = ρS/(2(1−ρ)), with ρ = λS (per core, λ split evenly).

use crate::stats::{mean_ci, MeanCi};
use serde::Serialize;

/// The papers' best thread count on `sockets` processors with `cores` cores.
pub fn model_threads(sockets: usize, cores: usize) -> usize {
    if sockets >= 2 {
        cores
    } else {
        cores + 2
    }
}

/// Predicted capacity C_{p,c} = T_{p,c} × C_{1,1} (calls/s).
pub fn predicted_capacity(c11: f64, sockets: usize, cores: usize) -> f64 {
    model_threads(sockets, cores) as f64 * c11
}

/// Error of a prediction against a measurement, in % of the measurement.
pub fn error_pct(predicted: f64, measured: f64) -> Option<f64> {
    (measured > 0.0).then(|| 100.0 * (predicted - measured) / measured)
}

/// Queueing predictions for one point.
#[derive(Copy, Clone, Debug, PartialEq, Serialize)]
pub struct QueuePrediction {
    /// Utilisation ρ = λ S / servers.
    pub rho: f64,
    /// M/M/1 mean wait (µs); `None` when ρ ≥ 1 (no steady state).
    pub mm1_wait_us: Option<f64>,
    /// M/D/1 mean wait (µs); `None` when ρ ≥ 1.
    pub md1_wait_us: Option<f64>,
}

/// Predict the mean wait for `arrival_pps` messages/s served in
/// `service_us` each, by `servers` cores sharing the arrivals evenly.
pub fn queue_prediction(arrival_pps: f64, service_us: f64, servers: usize) -> QueuePrediction {
    let lambda = arrival_pps / servers.max(1) as f64;
    let service_s = service_us * 1e-6;
    let rho = lambda * service_s;
    let stable = (0.0..1.0).contains(&rho);
    QueuePrediction {
        rho,
        mm1_wait_us: stable.then(|| 1e6 * rho * service_s / (1.0 - rho)),
        md1_wait_us: stable.then(|| 1e6 * rho * service_s / (2.0 * (1.0 - rho))),
    }
}

/// "% lower" of `other` against `base`, paired by repetition (runs share
/// seeds across modes): 100 × mean(base − other) / mean(base), with the 95%
/// CI of the paired differences on the same scale. `None` without pairs or
/// with a zero baseline.
pub fn paired_lower(base: &[f64], other: &[f64]) -> Option<(f64, f64)> {
    let count = base.len().min(other.len());
    if count == 0 {
        return None;
    }
    let mean_base = base[..count].iter().sum::<f64>() / count as f64;
    if mean_base <= 0.0 {
        return None;
    }
    let diffs: Vec<f64> = (0..count).map(|i| base[i] - other[i]).collect();
    let diff = mean_ci(&diffs);
    Some((100.0 * diff.mean / mean_base, 100.0 * diff.ci95 / mean_base))
}

/// Capacity of each repetition: walking the probed rates upwards, the
/// highest rate whose PDR in that repetition stayed under `threshold`
/// before its first crossing (`None`: crossed at the first rate or no
/// data). `probes` holds (rate, PDR per repetition or `None` when that
/// repetition is missing or invalid).
pub fn capacity_per_rep(
    probes: &[(f64, Vec<Option<f64>>)],
    reps: usize,
    threshold: f64,
) -> Vec<Option<f64>> {
    let mut sorted: Vec<&(f64, Vec<Option<f64>>)> = probes.iter().collect();
    sorted.sort_by(|a, b| a.0.total_cmp(&b.0));
    (0..reps)
        .map(|r| {
            let mut cap = None;
            for (rate, pdrs) in &sorted {
                match pdrs.get(r).copied().flatten() {
                    Some(p) if p < threshold => cap = Some(*rate),
                    Some(_) => break,
                    None => {}
                }
            }
            cap
        })
        .collect()
}

/// Mean and CI of the per-repetition capacities that exist.
pub fn capacity_ci(per_rep: &[Option<f64>]) -> Option<MeanCi> {
    let values: Vec<f64> = per_rep.iter().flatten().copied().collect();
    (!values.is_empty()).then(|| mean_ci(&values))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capacity_model_matches_the_papers_numbers() {
        // Paper B: C_{1,1} = 1000 cps; 2 and 4 cores on one processor ->
        // 4 and 6 threads, 4000 and 6000 cps; 6 cores on two -> 6000 cps.
        assert_eq!(model_threads(1, 2), 4);
        assert_eq!(model_threads(1, 4), 6);
        assert_eq!(model_threads(2, 6), 6);
        assert_eq!(predicted_capacity(1000.0, 1, 2), 4000.0);
        assert_eq!(predicted_capacity(1000.0, 1, 4), 6000.0);
        assert_eq!(predicted_capacity(1000.0, 2, 6), 6000.0);
        assert_eq!(model_threads(1, 1), 3);
        // Against the measured best (4400, 5400, 6600): -9.1 %, +11.1 %, -9.1 %.
        assert!((error_pct(4000.0, 4400.0).unwrap() + 9.0909).abs() < 1e-3);
        assert!((error_pct(6000.0, 5400.0).unwrap() - 11.1111).abs() < 1e-3);
        assert_eq!(error_pct(1.0, 0.0), None);
    }

    #[test]
    fn queueing_check_by_hand() {
        // λ = 100 000 msg/s, S = 5 µs: ρ = 0.5; M/M/1 W = 0.5·5/0.5 = 5 µs,
        // M/D/1 W = 2.5 µs.
        let q = queue_prediction(100_000.0, 5.0, 1);
        assert!((q.rho - 0.5).abs() < 1e-12);
        assert!((q.mm1_wait_us.unwrap() - 5.0).abs() < 1e-9);
        assert!((q.md1_wait_us.unwrap() - 2.5).abs() < 1e-9);
        // λ = 180 000, S = 5 µs: ρ = 0.9, M/M/1 = 45 µs, M/D/1 = 22.5 µs.
        let q = queue_prediction(180_000.0, 5.0, 1);
        assert!((q.mm1_wait_us.unwrap() - 45.0).abs() < 1e-6);
        assert!((q.md1_wait_us.unwrap() - 22.5).abs() < 1e-6);
        // Two cores halve λ per core.
        let q = queue_prediction(180_000.0, 5.0, 2);
        assert!((q.rho - 0.45).abs() < 1e-12);
        // Overload: no steady state.
        let q = queue_prediction(300_000.0, 5.0, 1);
        assert!(q.rho > 1.0 && q.mm1_wait_us.is_none() && q.md1_wait_us.is_none());
    }

    #[test]
    fn paired_percent_lower() {
        // Paper A Table III, 2 threads: 0.0133 -> 0.0098 is 26.3 % lower.
        let (p, ci) = paired_lower(&[0.0133], &[0.0098]).unwrap();
        assert!((p - 26.3158).abs() < 1e-3);
        assert_eq!(ci, 0.0);
        // Pairs: differences 1, 3 on a mean baseline of 10 -> 20 % ± t(1)·1/10·100.
        let (p, ci) = paired_lower(&[10.0, 10.0], &[9.0, 7.0]).unwrap();
        assert!((p - 20.0).abs() < 1e-9);
        assert!((ci - 12.706 * 1.0 / 10.0 * 100.0).abs() < 1.0, "{ci}");
        assert_eq!(paired_lower(&[0.0], &[0.0]), None);
        assert_eq!(paired_lower(&[], &[]), None);
    }

    #[test]
    fn capacities_per_repetition() {
        let probes = vec![
            (200.0, vec![Some(0.0), Some(0.0)]),
            (400.0, vec![Some(0.005), Some(0.02)]),
            (600.0, vec![Some(0.03), Some(0.0)]),
        ];
        // Rep 0 crosses at 600 -> 400; rep 1 crosses at 400 -> 200 (its
        // 600 point below the threshold comes after its first crossing).
        let caps = capacity_per_rep(&probes, 2, 0.01);
        assert_eq!(caps, vec![Some(400.0), Some(200.0)]);
        let c = capacity_ci(&caps).unwrap();
        assert_eq!(c.mean, 300.0);
        assert_eq!(
            capacity_per_rep(&[(200.0, vec![Some(0.5)])], 1, 0.01),
            vec![None]
        );
        assert!(capacity_ci(&[None]).is_none());
    }
}
