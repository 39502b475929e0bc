//! Small statistics used by every experiment: means with Student-t 95%
//! confidence intervals, and least-squares line fits.

use serde::Serialize;

/// Mean and 95% confidence half-width of a sample.
#[derive(Copy, Clone, Debug, Default, PartialEq, Serialize)]
pub struct MeanCi {
    /// Sample mean.
    pub mean: f64,
    /// Half-width of the 95% confidence interval (0 for n < 2).
    pub ci95: f64,
    /// Sample size.
    pub n: usize,
}

impl std::fmt::Display for MeanCi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&crate::render::mean_ci(
            self,
            crate::render::Digits::Fixed(3),
        ))
    }
}

pub use ringway_server::metrics::t975;

/// Mean and 95% CI (Student t) of `xs`; NaN-free input expected.
pub fn mean_ci(xs: &[f64]) -> MeanCi {
    let count = xs.len();
    if count == 0 {
        return MeanCi {
            mean: f64::NAN,
            ci95: f64::NAN,
            n: count,
        };
    }
    let mean = xs.iter().sum::<f64>() / count as f64;
    if count < 2 {
        return MeanCi {
            mean,
            ci95: 0.0,
            n: count,
        };
    }
    let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (count - 1) as f64;
    MeanCi {
        mean,
        ci95: t975(count - 1) * (var / count as f64).sqrt(),
        n: count,
    }
}

/// A fitted line y = intercept + slope·x with its coefficient of determination.
#[derive(Copy, Clone, Debug, Default, PartialEq, Serialize)]
pub struct LineFit {
    /// Value at x = 0.
    pub intercept: f64,
    /// Change of y per unit of x.
    pub slope: f64,
    /// R² of the fit (1 = perfect).
    pub r2: f64,
}

/// Ordinary least squares through the points; `None` with fewer than two distinct x.
pub fn fit_line(points: &[(f64, f64)]) -> Option<LineFit> {
    let count = points.len() as f64;
    if points.len() < 2 {
        return None;
    }
    let mean_x = points.iter().map(|p| p.0).sum::<f64>() / count;
    let mean_y = points.iter().map(|p| p.1).sum::<f64>() / count;
    let sxx: f64 = points.iter().map(|p| (p.0 - mean_x).powi(2)).sum();
    if sxx == 0.0 {
        return None;
    }
    let sxy: f64 = points.iter().map(|p| (p.0 - mean_x) * (p.1 - mean_y)).sum();
    let slope = sxy / sxx;
    let intercept = mean_y - slope * mean_x;
    let ss_tot: f64 = points.iter().map(|p| (p.1 - mean_y).powi(2)).sum();
    let ss_res: f64 = points
        .iter()
        .map(|p| (p.1 - intercept - slope * p.0).powi(2))
        .sum();
    let r_squared = if ss_tot == 0.0 {
        1.0
    } else {
        1.0 - ss_res / ss_tot
    };
    Some(LineFit {
        intercept,
        slope,
        r2: r_squared,
    })
}

/// Least squares through the origin y = slope·x (for C = T × C₁,₁ style models).
pub fn fit_through_origin(points: &[(f64, f64)]) -> Option<f64> {
    let sxx: f64 = points.iter().map(|p| p.0 * p.0).sum();
    if sxx == 0.0 {
        return None;
    }
    Some(points.iter().map(|p| p.0 * p.1).sum::<f64>() / sxx)
}

/// Wilson score 95 % interval of a proportion: `k` events in `n` trials
/// (`None` for `n` = 0). Unlike the normal approximation it stays inside
/// [0, 1] and is not empty at 0 or `n` events (0 of 15 → 0 … 20.4 %).
pub fn wilson(k: usize, n: usize) -> Option<(f64, f64)> {
    if n == 0 {
        return None;
    }
    const Z: f64 = 1.959_963_984_540_054;
    let (k, n) = (k.min(n) as f64, n as f64);
    let p = k / n;
    let denominator = 1.0 + Z * Z / n;
    let centre = (p + Z * Z / (2.0 * n)) / denominator;
    let half = Z * (p * (1.0 - p) / n + Z * Z / (4.0 * n * n)).sqrt() / denominator;
    Some(((centre - half).max(0.0), (centre + half).min(1.0)))
}

/// ln(n!) by summation (exact enough for the run counts of a lab, n ≤ 10⁵).
fn ln_factorial(n: usize) -> f64 {
    (2..=n).map(|i| (i as f64).ln()).sum()
}

/// Fisher's exact test, two-sided, of the 2×2 table `[[a, b], [c, d]]`
/// (rows: the two arms; columns: event, no event): the probability, with
/// the margins fixed, of a table at most as likely as the one observed
/// (the convention of R's `fisher.test`). 1 for an empty table.
pub fn fisher_exact(a: usize, b: usize, c: usize, d: usize) -> f64 {
    let (row1, col1, n) = (a + b, a + c, a + b + c + d);
    if n == 0 {
        return 1.0;
    }
    let fixed =
        ln_factorial(row1) + ln_factorial(n - row1) + ln_factorial(col1) + ln_factorial(n - col1)
            - ln_factorial(n);
    // P(X = x) for x events in the first row.
    let p = |x: usize| {
        (fixed
            - ln_factorial(x)
            - ln_factorial(row1 - x)
            - ln_factorial(col1 - x)
            - ln_factorial(n + x - row1 - col1))
        .exp()
    };
    let observed = p(a);
    let low = col1.saturating_sub(n - row1);
    let high = row1.min(col1);
    (low..=high)
        .map(p)
        .filter(|&q| q <= observed * (1.0 + 1e-7))
        .sum::<f64>()
        .min(1.0)
}

/// Serde: an `f64` written as `null` (how `serde_json` writes NaN, "no
/// data") reads back as NaN, so a run saved to a state file reads back
/// with its n/a columns intact.
pub fn nan_or_f64<'de, D: serde::Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    use serde::Deserialize;
    Ok(Option::<f64>::deserialize(d)?.unwrap_or(f64::NAN))
}

/// [`nan_or_f64`] for a triple of `f64` (p50, p99, max).
pub fn nan_or_f64x3<'de, D: serde::Deserializer<'de>>(d: D) -> Result<(f64, f64, f64), D::Error> {
    use serde::Deserialize;
    let (a, b, c) = <(Option<f64>, Option<f64>, Option<f64>)>::deserialize(d)?;
    let nan = |v: Option<f64>| v.unwrap_or(f64::NAN);
    Ok((nan(a), nan(b), nan(c)))
}

/// [`nan_or_f64`] for a (count, count, ratio) triple.
pub fn nan_or_ratio3<'de, D: serde::Deserializer<'de>>(d: D) -> Result<(u64, u64, f64), D::Error> {
    use serde::Deserialize;
    let (a, b, c) = <(u64, u64, Option<f64>)>::deserialize(d)?;
    Ok((a, b, c.unwrap_or(f64::NAN)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ci_of_known_sample() {
        // 1..=5: mean 3, s = 1.5811, t(4) = 2.776 → half-width 1.963
        let m = mean_ci(&[1.0, 2.0, 3.0, 4.0, 5.0]);
        assert!((m.mean - 3.0).abs() < 1e-12);
        assert!((m.ci95 - 1.963).abs() < 1e-3, "{}", m.ci95);
    }

    #[test]
    fn line_fit_exact() {
        let f = fit_line(&[(1.0, 5.0), (2.0, 7.0), (4.0, 11.0)]).unwrap();
        assert!((f.slope - 2.0).abs() < 1e-12 && (f.intercept - 3.0).abs() < 1e-12);
        assert!((f.r2 - 1.0).abs() < 1e-12);
        assert!(fit_line(&[(1.0, 1.0), (1.0, 2.0)]).is_none());
        assert!((fit_through_origin(&[(1.0, 2.0), (2.0, 4.0)]).unwrap() - 2.0).abs() < 1e-12);
    }

    #[test]
    fn wilson_interval_of_known_proportions() {
        // 3 of 15: 7.05 … 45.19 %; 0 of 15: 0 … 20.39 %; 10 of 20: 29.93 … 70.07 %.
        let close = |got: (f64, f64), want: (f64, f64)| {
            (got.0 - want.0).abs() < 1e-4 && (got.1 - want.1).abs() < 1e-4
        };
        assert!(
            close(wilson(3, 15).unwrap(), (0.070475, 0.451854)),
            "{:?}",
            wilson(3, 15)
        );
        assert!(
            close(wilson(0, 15).unwrap(), (0.0, 0.203883)),
            "{:?}",
            wilson(0, 15)
        );
        assert!(
            close(wilson(15, 15).unwrap(), (0.796117, 1.0)),
            "{:?}",
            wilson(15, 15)
        );
        assert!(
            close(wilson(10, 20).unwrap(), (0.299298, 0.700702)),
            "{:?}",
            wilson(10, 20)
        );
        assert_eq!(wilson(0, 0), None);
    }

    #[test]
    fn fisher_exact_against_known_tables() {
        // The closing note's cell: 3 of 15 N-SRPIC runs collapsed, 0 of 15
        // SRPIC runs: p = 0.2241 (R: fisher.test(matrix(c(3,0,12,15),2))).
        assert!((fisher_exact(3, 12, 0, 15) - 0.224_138).abs() < 1e-5);
        // Symmetric in the rows.
        assert!((fisher_exact(0, 15, 3, 12) - 0.224_138).abs() < 1e-5);
        // R's classic 1 9 / 11 3: p = 0.002759.
        assert!((fisher_exact(1, 9, 11, 3) - 0.002_759_456).abs() < 1e-8);
        assert!((fisher_exact(5, 0, 0, 5) - 0.007_936_508).abs() < 1e-8);
        assert!((fisher_exact(0, 20, 8, 12) - 0.003_276_003).abs() < 1e-8);
        // Most runs collapsed in both arms (margins above half the runs).
        assert!((fisher_exact(4, 1, 5, 0) - 1.0).abs() < 1e-9);
        assert!((fisher_exact(18, 2, 20, 0) - 0.487_179_487).abs() < 1e-8);
        // No difference at all: p = 1.
        assert!((fisher_exact(2, 3, 2, 3) - 1.0).abs() < 1e-9);
        assert_eq!(fisher_exact(0, 0, 0, 0), 1.0);
    }

    #[test]
    fn nan_reads_back_from_null() {
        #[derive(serde::Serialize, serde::Deserialize)]
        struct Row {
            #[serde(deserialize_with = "nan_or_f64")]
            x: f64,
            #[serde(deserialize_with = "nan_or_f64x3")]
            late: (f64, f64, f64),
            #[serde(deserialize_with = "nan_or_ratio3")]
            order: (u64, u64, f64),
        }
        let text = serde_json::to_string(&Row {
            x: f64::NAN,
            late: (1.5, f64::NAN, 3.0),
            order: (4, 2, f64::NAN),
        })
        .unwrap();
        assert_eq!(
            text,
            r#"{"x":null,"late":[1.5,null,3.0],"order":[4,2,null]}"#
        );
        let back: Row = serde_json::from_str(&text).unwrap();
        assert!(back.x.is_nan() && back.late.1.is_nan() && back.order.2.is_nan());
        assert_eq!((back.late.0, back.late.2, back.order.0), (1.5, 3.0, 4));
        let back: Row =
            serde_json::from_str(r#"{"x":2.5,"late":[1,2,3],"order":[1,1,0.5]}"#).unwrap();
        assert_eq!(back.x, 2.5);
    }
}
