//! Call arrival process: Poisson (exponential gaps) or constant spacing,
//! driven by a seeded RNG so a run's schedule is reproducible.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// How call start times are spaced.
#[derive(Copy, Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ArrivalKind {
    /// Exponential inter-arrival times (a Poisson process).
    Poisson,
    /// Equal spacing of 1/rate.
    Constant,
}

impl std::str::FromStr for ArrivalKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "poisson" | "exp" => Ok(ArrivalKind::Poisson),
            "constant" | "const" | "uniform" => Ok(ArrivalKind::Constant),
            _ => Err(format!("unknown arrival process {s:?} (poisson, constant)")),
        }
    }
}

/// Generator of inter-arrival gaps in nanoseconds for a given rate.
#[derive(Debug)]
pub struct Arrivals {
    kind: ArrivalKind,
    mean_ns: f64,
    rng: StdRng,
}

impl Arrivals {
    /// `rate` calls per second (must be > 0), seeded RNG.
    pub fn new(kind: ArrivalKind, rate: f64, seed: u64) -> Self {
        assert!(rate > 0.0 && rate.is_finite(), "rate must be positive");
        Arrivals {
            kind,
            mean_ns: 1e9 / rate,
            rng: StdRng::seed_from_u64(seed),
        }
    }

    /// The next gap in nanoseconds (at least 1).
    pub fn next_gap_ns(&mut self) -> u64 {
        let gap = match self.kind {
            ArrivalKind::Constant => self.mean_ns,
            ArrivalKind::Poisson => {
                // Inverse transform: -ln(U) * mean with U in (0, 1].
                let uniform: f64 = 1.0 - self.rng.gen::<f64>();
                -uniform.ln() * self.mean_ns
            }
        };
        (gap.round() as u64).max(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stats(kind: ArrivalKind, rate: f64, seed: u64, n: usize) -> (f64, f64) {
        let mut a = Arrivals::new(kind, rate, seed);
        let xs: Vec<f64> = (0..n).map(|_| a.next_gap_ns() as f64).collect();
        let mean = xs.iter().sum::<f64>() / n as f64;
        let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1) as f64;
        (mean, var.sqrt() / mean)
    }

    #[test]
    fn poisson_gaps_have_mean_1_over_rate_and_cv_1() {
        for seed in [1u64, 7, 12345] {
            let (mean, cv) = stats(ArrivalKind::Poisson, 1000.0, seed, 200_000);
            assert!((mean / 1e6 - 1.0).abs() < 0.01, "mean {mean} ns");
            assert!((cv - 1.0).abs() < 0.02, "cv {cv}");
        }
    }

    #[test]
    fn poisson_counts_per_window_are_poisson() {
        // Count arrivals in 1 s windows at 50/s: mean ≈ variance ≈ 50.
        let mut a = Arrivals::new(ArrivalKind::Poisson, 50.0, 99);
        let mut t = 0u64;
        let mut counts = vec![0u32; 2000];
        loop {
            t += a.next_gap_ns();
            let w = (t / 1_000_000_000) as usize;
            if w >= counts.len() {
                break;
            }
            counts[w] += 1;
        }
        let n = counts.len() as f64;
        let m = counts.iter().map(|&c| c as f64).sum::<f64>() / n;
        let v = counts.iter().map(|&c| (c as f64 - m).powi(2)).sum::<f64>() / (n - 1.0);
        assert!((m - 50.0).abs() < 1.0, "mean count {m}");
        assert!((v / m - 1.0).abs() < 0.1, "dispersion {}", v / m);
    }

    #[test]
    fn constant_gaps_are_exact_and_seed_reproducible() {
        let (mean, cv) = stats(ArrivalKind::Constant, 400.0, 3, 1000);
        assert_eq!(mean, 2_500_000.0);
        assert_eq!(cv, 0.0);
        let mut a = Arrivals::new(ArrivalKind::Poisson, 10.0, 42);
        let mut b = Arrivals::new(ArrivalKind::Poisson, 10.0, 42);
        let mut c = Arrivals::new(ArrivalKind::Poisson, 10.0, 43);
        let va: Vec<u64> = (0..100).map(|_| a.next_gap_ns()).collect();
        let vb: Vec<u64> = (0..100).map(|_| b.next_gap_ns()).collect();
        let vc: Vec<u64> = (0..100).map(|_| c.next_gap_ns()).collect();
        assert_eq!(va, vb);
        assert_ne!(va, vc);
    }
}
