//! An emulated service time: CPU work added to every message the proxy
//! core handles, so that the lab can put T_sip in the range of the
//! papers' OpenSIPS (77–540 µs) where ringway's own is a few µs. It is an
//! emulation for experiments, off by default, and never a feature: the
//! work is a spin on the thread's own CPU clock, so preemption stretches
//! T_sip as real work would, and the CPU spent is the service demand.

use serde::{Deserialize, Serialize};
use std::time::Duration;

/// Longest mean service time accepted (µs).
pub const MAX_SERVICE_US: u32 = 100_000;
/// An exponential draw is capped at this many means (bounded work).
const EXP_CAP: f64 = 20.0;

/// The distribution of the emulated service time per message.
#[derive(Copy, Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "dist", rename_all = "lowercase")]
pub enum ServiceTime {
    /// Every message costs `us` µs of CPU.
    Constant {
        /// CPU per message (µs).
        us: u32,
    },
    /// Exponentially distributed CPU per message with this mean (µs),
    /// capped at 20 means.
    Exponential {
        /// Mean CPU per message (µs).
        mean_us: u32,
    },
}

impl ServiceTime {
    /// The mean (µs).
    pub fn mean_us(self) -> u32 {
        match self {
            ServiceTime::Constant { us } => us,
            ServiceTime::Exponential { mean_us } => mean_us,
        }
    }

    /// Checked: a mean in 1..=[`MAX_SERVICE_US`].
    pub fn validate(self) -> Result<(), String> {
        let mean = self.mean_us();
        if mean == 0 || mean > MAX_SERVICE_US {
            return Err(format!(
                "emulated service time must be 1..={MAX_SERVICE_US} µs, not {mean}"
            ));
        }
        Ok(())
    }

    /// The CPU one message costs, drawn with `rng` (a splitmix64 state).
    pub fn draw(self, rng: &mut u64) -> Duration {
        match self {
            ServiceTime::Constant { us } => Duration::from_micros(u64::from(us)),
            ServiceTime::Exponential { mean_us } => {
                // Uniform in (0, 1]: never ln(0).
                let u = ((next(rng) >> 11) as f64 + 1.0) / (1u64 << 53) as f64;
                let x = (-u.ln()).min(EXP_CAP);
                Duration::from_nanos((x * f64::from(mean_us) * 1000.0) as u64)
            }
        }
    }

    /// Burn one message's service time on the calling thread's CPU clock.
    pub fn burn(self, rng: &mut u64) {
        burn_cpu(self.draw(rng));
    }
}

impl std::fmt::Display for ServiceTime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ServiceTime::Constant { us } => write!(f, "{us}"),
            ServiceTime::Exponential { mean_us } => write!(f, "exp:{mean_us}"),
        }
    }
}

impl std::str::FromStr for ServiceTime {
    type Err = String;
    /// `N` or `const:N` (µs each), `exp:N` (exponential, mean N µs).
    fn from_str(s: &str) -> Result<Self, String> {
        let (kind, value) = s.split_once(':').unwrap_or(("const", s));
        let us: u32 = value.trim().parse().map_err(|_| {
            format!("emulated service time {s:?}: expected N, const:N or exp:N (µs)")
        })?;
        let t = match kind {
            "const" => ServiceTime::Constant { us },
            "exp" => ServiceTime::Exponential { mean_us: us },
            _ => {
                return Err(format!(
                    "emulated service time {s:?}: distribution must be const or exp"
                ))
            }
        };
        t.validate()?;
        Ok(t)
    }
}

/// splitmix64 step.
fn next(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Spin until the calling thread has used `cpu` more CPU time.
pub fn burn_cpu(cpu: Duration) {
    if cpu.is_zero() {
        return;
    }
    let start = ringway_io::thread::thread_cpu_total();
    let mut x = 0u64;
    while ringway_io::thread::thread_cpu_total().saturating_sub(start) < cpu {
        // Some arithmetic between clock reads, kept from being optimised away.
        for i in 0..64u64 {
            x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(i));
        }
    }
    std::hint::black_box(x);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_checks_the_distribution() {
        assert_eq!("200".parse(), Ok(ServiceTime::Constant { us: 200 }));
        assert_eq!("const:77".parse(), Ok(ServiceTime::Constant { us: 77 }));
        assert_eq!(
            "exp:540".parse(),
            Ok(ServiceTime::Exponential { mean_us: 540 })
        );
        assert_eq!(
            ServiceTime::Exponential { mean_us: 540 }.to_string(),
            "exp:540"
        );
        for bad in ["", "0", "exp:0", "uniform:5", "exp:x", "100001", "-5"] {
            assert!(bad.parse::<ServiceTime>().is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn exponential_draws_have_the_mean_and_constant_draws_do_not_vary() {
        let mut rng = 1;
        let exp = ServiceTime::Exponential { mean_us: 200 };
        let n = 200_000;
        let draws: Vec<f64> = (0..n)
            .map(|_| exp.draw(&mut rng).as_nanos() as f64 / 1000.0)
            .collect();
        let mean = draws.iter().sum::<f64>() / n as f64;
        // Standard error 200/√200000 ≈ 0.45 µs; the 20-mean cap removes e^-20.
        assert!((mean - 200.0).abs() < 3.0, "mean {mean}");
        // An exponential's median is ln 2 · mean ≈ 138.6 µs.
        let below = draws.iter().filter(|&&d| d < 138.63).count() as f64 / n as f64;
        assert!((below - 0.5).abs() < 0.01, "{below}");
        assert!(draws.iter().all(|&d| d <= 4000.0 + 1e-6));
        let c = ServiceTime::Constant { us: 120 };
        assert!((0..10).all(|_| c.draw(&mut rng) == Duration::from_micros(120)));
    }

    #[test]
    fn a_burn_costs_at_least_its_cpu() {
        // A lower bound only (the spin stops once the thread's own CPU
        // clock has advanced that far); how long it takes is not tested.
        let before = ringway_io::thread::thread_cpu_total();
        let mut rng = 0;
        for _ in 0..3 {
            ServiceTime::Constant { us: 2000 }.burn(&mut rng);
        }
        let used = ringway_io::thread::thread_cpu_total() - before;
        assert!(used >= Duration::from_millis(6), "{used:?}");
    }
}
