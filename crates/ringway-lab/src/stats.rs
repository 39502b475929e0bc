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
}
