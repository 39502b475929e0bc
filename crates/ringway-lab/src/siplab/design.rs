//! Comparison designs that measure their own noise (pure functions; the
//! runs are made by [`super::compare`]).
//!
//! - **Arms.** Every proxy is measured under every mode, and its reference
//!   mode (the first listed) a second time under the label `MODE#aa`: the
//!   A/A arm. The two copies apply identical settings, so their difference
//!   is what noise alone produces: the *noise floor*.
//! - **Blocks.** At each fixed load, block `b` runs every arm once, back to
//!   back, in an order drawn from the recorded seed ([`block_order`]), all
//!   with the same generator seed. Arms are compared within a block
//!   (paired), so slow drifts of the machine fall on every arm alike.
//! - **Effects.** "% lower" = 100 · mean(ref − other) / mean(ref) over the
//!   blocks where both arms have a valid run, with a Student-t 95 % CI of
//!   the paired differences ([`paired_effect`]). A result is labelled "not
//!   distinguishable from noise" when its CI includes 0 or its size lies
//!   within the A/A floor ([`verdict`]).
//! - **Power.** The minimum detectable effect for the blocks run
//!   ([`Effect::mde_pct`]) and the blocks a given effect would need
//!   ([`pairs_needed`]) come from the spread of the paired differences.

use super::ProxyKind;
use crate::stats::t975;
use serde::Serialize;

/// Suffix of the A/A copy of a proxy's reference mode.
pub const AA_SUFFIX: &str = "#aa";

/// z for 80 % power (one-sided 0.8 quantile of the normal).
const Z_POWER: f64 = 0.841_621_234;

/// One arm of a comparison: a proxy under a mode, measured under `label`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Arm {
    /// The proxy.
    pub proxy: ProxyKind,
    /// The mode whose knobs the arm applies.
    pub mode: String,
    /// The label its runs carry (the mode, or `MODE#aa` for the A/A copy).
    pub label: String,
}

impl Arm {
    /// True for the A/A copy of the reference mode.
    pub fn is_aa(&self) -> bool {
        self.label.ends_with(AA_SUFFIX)
    }
}

/// The arms of a comparison: per proxy, the reference mode (`modes[0]`),
/// its A/A copy, then the other modes. Mode names are the short names the
/// caller resolved (file stems for mode files).
pub fn arms(proxies: &[ProxyKind], modes: &[String]) -> Vec<Arm> {
    let mut out = Vec::new();
    for &proxy in proxies {
        for (i, mode) in modes.iter().enumerate() {
            out.push(Arm {
                proxy,
                mode: mode.clone(),
                label: mode.clone(),
            });
            if i == 0 {
                out.push(Arm {
                    proxy,
                    mode: mode.clone(),
                    label: format!("{mode}{AA_SUFFIX}"),
                });
            }
        }
    }
    out
}

/// splitmix64: the generator behind [`block_order`].
fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut mixed = *state;
    mixed = (mixed ^ (mixed >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    mixed = (mixed ^ (mixed >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    mixed ^ (mixed >> 31)
}

/// The order in which block `block` runs `n` arms: a uniformly random
/// permutation of `0..n` (Fisher–Yates), fixed by `(seed, block)` so the
/// order can be recorded as the seed and reproduced.
pub fn block_order(seed: u64, block: u64, n: usize) -> Vec<usize> {
    let mut state = seed ^ block.wrapping_mul(0xD6E8_FEB8_6659_FD93);
    let mut order: Vec<usize> = (0..n).collect();
    for i in (1..n).rev() {
        // Multiply-shift: unbiased enough for n ≪ 2^32.
        let swap_with = ((u128::from(splitmix64(&mut state)) * (i as u128 + 1)) >> 64) as usize;
        order.swap(i, swap_with);
    }
    order
}

/// A paired effect of one arm against the reference, in % of the
/// reference's mean (positive: the other arm is lower).
#[derive(Copy, Clone, Debug, PartialEq, Serialize)]
pub struct Effect {
    /// 100 · mean(ref − other) / mean(ref).
    pub lower_pct: f64,
    /// Half-width of its 95 % CI (Student t over the paired differences,
    /// scaled by the same 1/mean(ref): the denominator is taken as known).
    pub ci_pct: f64,
    /// Standard deviation of the paired differences, in % of mean(ref).
    pub sd_pct: f64,
    /// Pairs (blocks with a valid run in both arms).
    pub pairs: usize,
    /// Minimum detectable effect at α = 0.05 (two-sided) and 80 % power
    /// for these pairs: (t₀.₉₇₅,ₙ₋₁ + z₀.₈) · sd / √n.
    pub mde_pct: f64,
}

impl Effect {
    /// Lower and upper ends of the CI.
    pub fn ci(&self) -> (f64, f64) {
        (self.lower_pct - self.ci_pct, self.lower_pct + self.ci_pct)
    }
}

/// The paired effect of `other` against `reference` (the same blocks, in
/// the same order; `None` entries are invalid runs and drop their pair).
/// `None` with fewer than two pairs or a reference mean of 0.
pub fn paired_effect(reference: &[Option<f64>], other: &[Option<f64>]) -> Option<Effect> {
    let pairs: Vec<(f64, f64)> = reference
        .iter()
        .zip(other)
        .filter_map(|(r, o)| Some(((*r)?, (*o)?)))
        .collect();
    let count = pairs.len();
    if count < 2 {
        return None;
    }
    let mean_ref = pairs.iter().map(|p| p.0).sum::<f64>() / count as f64;
    if mean_ref == 0.0 || !mean_ref.is_finite() {
        return None;
    }
    let diffs: Vec<f64> = pairs.iter().map(|(r, o)| r - o).collect();
    let mean_d = diffs.iter().sum::<f64>() / count as f64;
    let var = diffs.iter().map(|x| (x - mean_d).powi(2)).sum::<f64>() / (count - 1) as f64;
    let scale = 100.0 / mean_ref.abs();
    let sd_pct = var.sqrt() * scale;
    let t_quantile = t975(count - 1);
    Some(Effect {
        lower_pct: mean_d * scale,
        ci_pct: t_quantile * sd_pct / (count as f64).sqrt(),
        sd_pct,
        pairs: count,
        mde_pct: (t_quantile + Z_POWER) * sd_pct / (count as f64).sqrt(),
    })
}

/// The effect of `other` against `reference` as the mean of per-pair
/// ratios other/reference (pairs whose reference is not positive, or with
/// a side missing, are dropped): 100 · (1 − mean ratio) % lower, with the
/// Student-t 95 % CI and the MDE of that mean. Used where pairs differ in
/// size (the SFU's cells: delays grow with the clients), so that every
/// pair weighs alike. `None` with fewer than two pairs.
pub fn ratio_effect(reference: &[Option<f64>], other: &[Option<f64>]) -> Option<Effect> {
    let ratios: Vec<f64> = reference
        .iter()
        .zip(other)
        .filter_map(|(r, o)| {
            let (r, o) = ((*r)?, (*o)?);
            (r > 0.0 && r.is_finite() && o.is_finite()).then(|| o / r)
        })
        .collect();
    let count = ratios.len();
    if count < 2 {
        return None;
    }
    let mean = ratios.iter().sum::<f64>() / count as f64;
    let var = ratios.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (count - 1) as f64;
    let sd_pct = 100.0 * var.sqrt();
    let t_quantile = t975(count - 1);
    Some(Effect {
        lower_pct: 100.0 * (1.0 - mean),
        ci_pct: t_quantile * sd_pct / (count as f64).sqrt(),
        sd_pct,
        pairs: count,
        mde_pct: (t_quantile + Z_POWER) * sd_pct / (count as f64).sqrt(),
    })
}

/// The noise floor an A/A effect sets: the largest difference its CI
/// admits, |mean| + half-width (%).
pub fn noise_floor(aa: &Effect) -> f64 {
    aa.lower_pct.abs() + aa.ci_pct
}

/// What a comparison shows.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub enum Verdict {
    /// Lower than the reference, beyond noise.
    Lower,
    /// Higher than the reference, beyond noise.
    Higher,
    /// Not distinguishable from noise, with the reason.
    Noise(String),
    /// No A/A floor was measured: the effect cannot be judged.
    NoFloor,
}

impl std::fmt::Display for Verdict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Verdict::Lower => f.write_str("lower"),
            Verdict::Higher => f.write_str("higher"),
            Verdict::Noise(why) => write!(f, "not distinguishable from noise ({why})"),
            Verdict::NoFloor => f.write_str("no A/A floor: not judged"),
        }
    }
}

/// Judge `effect` against the A/A noise floor `floor` (%, `None`: none
/// measured): noise when its CI includes 0 or |effect| ≤ floor.
pub fn verdict(effect: &Effect, floor: Option<f64>) -> Verdict {
    let Some(floor) = floor.filter(|f| f.is_finite()) else {
        return Verdict::NoFloor;
    };
    let (low, high) = effect.ci();
    if low <= 0.0 && high >= 0.0 {
        Verdict::Noise("95 % CI includes 0".into())
    } else if effect.lower_pct.abs() <= floor {
        Verdict::Noise(format!("within the A/A floor of {floor:.1} %"))
    } else if effect.lower_pct > 0.0 {
        Verdict::Lower
    } else {
        Verdict::Higher
    }
}

/// Most pairs [`pairs_needed`] will suggest.
pub const MAX_PAIRS: usize = 100_000;

/// Pairs needed to detect an effect of `delta_pct` at α = 0.05 two-sided
/// and 80 % power when the paired differences spread by `sd_pct`: the
/// smallest n ≥ 2 with (t₀.₉₇₅,ₙ₋₁ + z₀.₈) · sd / √n ≤ δ (`None` beyond
/// [`MAX_PAIRS`] or for δ ≤ 0).
pub fn pairs_needed(sd_pct: f64, delta_pct: f64) -> Option<usize> {
    if !(delta_pct > 0.0 && sd_pct.is_finite() && sd_pct >= 0.0) {
        return None;
    }
    (2..=MAX_PAIRS).find(|&n| (t975(n - 1) + Z_POWER) * sd_pct / (n as f64).sqrt() <= delta_pct)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn some(xs: &[f64]) -> Vec<Option<f64>> {
        xs.iter().map(|&x| Some(x)).collect()
    }

    #[test]
    fn every_proxy_gets_an_aa_copy_of_its_reference_mode() {
        let modes = vec!["baseline".to_string(), "enhanced".to_string()];
        let a = arms(&[ProxyKind::Ringway, ProxyKind::Kamailio], &modes);
        let labels: Vec<(ProxyKind, &str)> =
            a.iter().map(|x| (x.proxy, x.label.as_str())).collect();
        assert_eq!(
            labels,
            vec![
                (ProxyKind::Ringway, "baseline"),
                (ProxyKind::Ringway, "baseline#aa"),
                (ProxyKind::Ringway, "enhanced"),
                (ProxyKind::Kamailio, "baseline"),
                (ProxyKind::Kamailio, "baseline#aa"),
                (ProxyKind::Kamailio, "enhanced"),
            ]
        );
        // The A/A copy applies the reference's mode under its own label.
        assert!(a[1].is_aa() && a[1].mode == "baseline" && !a[0].is_aa());
        // One mode alone still gets its A/A arm.
        assert_eq!(arms(&[ProxyKind::Ringway], &modes[..1]).len(), 2);
    }

    #[test]
    fn block_orders_are_permutations_reproducible_from_the_seed() {
        for block in 0..50 {
            let o = block_order(42, block, 6);
            let mut sorted = o.clone();
            sorted.sort();
            assert_eq!(sorted, (0..6).collect::<Vec<_>>(), "block {block}: {o:?}");
            assert_eq!(o, block_order(42, block, 6), "same seed, same order");
        }
        // Orders differ between blocks and between seeds.
        let a: Vec<Vec<usize>> = (0..20).map(|b| block_order(42, b, 6)).collect();
        let b: Vec<Vec<usize>> = (0..20).map(|b| block_order(43, b, 6)).collect();
        assert_ne!(a, b);
        assert!(a.windows(2).any(|w| w[0] != w[1]));
        // Randomised, not rotated: over 600 blocks every arm runs first
        // about 100 times (a fixed or cyclic order fails one way or the
        // other: counts of 600/0 or exactly 100 each with a pattern).
        let mut first = [0usize; 6];
        for block in 0..600 {
            first[block_order(7, block, 6)[0]] += 1;
        }
        assert!(first.iter().all(|&c| (60..=140).contains(&c)), "{first:?}");
        // The first position is not a function of the block's residue.
        let firsts: Vec<usize> = (0..12).map(|b| block_order(7, b, 6)[0]).collect();
        assert_ne!(firsts[..6], firsts[6..], "{firsts:?}");
        assert!(block_order(1, 0, 0).is_empty());
        assert_eq!(block_order(1, 0, 1), vec![0]);
    }

    #[test]
    fn paired_effect_against_known_values() {
        // ref 10 each, other 9..5: differences 1..5, mean 3 (30 % lower),
        // s = 1.5811, t(4) = 2.776 → half-width 1.963 → 19.63 %.
        let e = paired_effect(&some(&[10.0; 5]), &some(&[9.0, 8.0, 7.0, 6.0, 5.0])).unwrap();
        assert!((e.lower_pct - 30.0).abs() < 1e-9, "{e:?}");
        assert!((e.ci_pct - 19.63).abs() < 0.01, "{e:?}");
        assert!((e.sd_pct - 15.811).abs() < 0.001, "{e:?}");
        assert_eq!(e.pairs, 5);
        // MDE: (2.776 + 0.8416) · 15.811 / √5 = 25.58 %.
        assert!((e.mde_pct - 25.58).abs() < 0.01, "{e:?}");
        // Pairs, not pooled samples: a constant offset has no spread.
        let e = paired_effect(&some(&[1.0, 5.0, 9.0]), &some(&[0.5, 4.5, 8.5])).unwrap();
        assert!(
            (e.lower_pct - 10.0).abs() < 1e-9 && e.ci_pct.abs() < 1e-9,
            "{e:?}"
        );
        // An invalid run drops its pair only.
        let e = paired_effect(
            &[Some(10.0), None, Some(10.0), Some(10.0)],
            &[Some(8.0), Some(1.0), Some(8.0), None],
        )
        .unwrap();
        assert_eq!(e.pairs, 2);
        assert!((e.lower_pct - 20.0).abs() < 1e-9);
        // Too few pairs, or nothing to scale by.
        assert!(paired_effect(&some(&[1.0]), &some(&[2.0])).is_none());
        assert!(paired_effect(&some(&[0.0, 0.0]), &some(&[1.0, 1.0])).is_none());
    }

    #[test]
    fn floor_and_labels() {
        let effect = |lower_pct: f64, ci_pct: f64| Effect {
            lower_pct,
            ci_pct,
            sd_pct: 0.0,
            pairs: 5,
            mde_pct: 0.0,
        };
        let aa = effect(-3.0, 4.0);
        assert!((noise_floor(&aa) - 7.0).abs() < 1e-12);
        let floor = Some(noise_floor(&aa));
        assert_eq!(verdict(&effect(30.0, 10.0), floor), Verdict::Lower);
        assert_eq!(verdict(&effect(-30.0, 10.0), floor), Verdict::Higher);
        // CI includes 0.
        let v = verdict(&effect(30.0, 31.0), floor);
        assert!(
            matches!(&v, Verdict::Noise(w) if w.contains("includes 0")),
            "{v}"
        );
        // CI excludes 0 but the effect is within the A/A floor.
        let v = verdict(&effect(6.0, 1.0), floor);
        assert!(
            matches!(&v, Verdict::Noise(w) if w.contains("A/A floor of 7.0")),
            "{v}"
        );
        assert!(v.to_string().starts_with("not distinguishable from noise"));
        // Exactly at the floor is still noise.
        assert!(matches!(
            verdict(&effect(7.0, 1.0), floor),
            Verdict::Noise(_)
        ));
        // Without the A/A arm nothing is judged.
        assert_eq!(verdict(&effect(30.0, 1.0), None), Verdict::NoFloor);
    }

    #[test]
    fn pairs_needed_for_known_spreads() {
        // sd = δ: n = 9 gives (2.306 + 0.842)/3 = 1.049 > 1, n = 10 gives
        // (2.262 + 0.842)/3.162 = 0.982 ≤ 1.
        assert_eq!(pairs_needed(10.0, 10.0), Some(10));
        // No spread: the fewest pairs a CI needs.
        assert_eq!(pairs_needed(0.0, 5.0), Some(2));
        // The review's case: sd 60 %, δ 26 % → about (2.8 · 60/26)² ≈ 42.
        let n = pairs_needed(60.0, 26.0).unwrap();
        assert!((42..=46).contains(&n), "{n}");
        assert_eq!(pairs_needed(10.0, 0.0), None);
        assert_eq!(pairs_needed(1e6, 1.0), None);
    }

    #[test]
    fn ratio_effect_against_known_values() {
        // Ratios 0.5, 0.6, 0.7 (cells of different size): mean 0.6 → 40 %
        // lower; sd 0.1, t(2) = 4.303 → half-width 24.84 %; MDE
        // (4.303 + 0.8416) · 10 / √3 = 29.70 %.
        let e = ratio_effect(&some(&[10.0, 100.0, 1000.0]), &some(&[5.0, 60.0, 700.0])).unwrap();
        assert!((e.lower_pct - 40.0).abs() < 1e-9, "{e:?}");
        assert!((e.sd_pct - 10.0).abs() < 1e-9, "{e:?}");
        assert!((e.ci_pct - 24.84).abs() < 0.01, "{e:?}");
        assert!((e.mde_pct - 29.70).abs() < 0.01, "{e:?}");
        // Not the ratio of the means (755/1110 = 0.68: 32 % lower).
        let pooled =
            paired_effect(&some(&[10.0, 100.0, 1000.0]), &some(&[5.0, 60.0, 700.0])).unwrap();
        assert!((pooled.lower_pct - e.lower_pct).abs() > 5.0);
        // A missing side or a zero reference drops the pair only.
        let e = ratio_effect(
            &[Some(2.0), Some(0.0), None, Some(4.0)],
            &[Some(3.0), Some(1.0), Some(1.0), Some(6.0)],
        )
        .unwrap();
        assert_eq!(e.pairs, 2);
        assert!(
            (e.lower_pct + 50.0).abs() < 1e-9,
            "1.5× is 50 % higher: {e:?}"
        );
        assert!(ratio_effect(&some(&[1.0]), &some(&[2.0])).is_none());
    }
}
