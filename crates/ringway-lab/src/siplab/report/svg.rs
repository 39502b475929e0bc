//! Minimal SVG line plots (no plotting crate).

use std::fmt::Write as _;

/// One line: label and (x, y, ci95) points sorted by x.
#[derive(Clone, Debug)]
pub struct Series {
    /// Legend text.
    pub label: String,
    /// Points (x, y, half-width of the error bar).
    pub points: Vec<(f64, f64, f64)>,
    /// Colour index (None: the series' position).
    pub color: Option<usize>,
    /// Dash pattern index (0: solid).
    pub dash: usize,
}

/// Dash patterns, by [`Series::dash`].
const DASHES: [&str; 6] = ["", "7 3", "2 3", "10 3 2 3", "1 4", "12 6"];

const COLORS: [&str; 10] = [
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
    "#bcbd22", "#17becf",
];

/// A "nice" tick step for a span.
fn tick_step(span: f64) -> f64 {
    let raw = span / 5.0;
    let mag = 10f64.powf(raw.log10().floor());
    let n = raw / mag;
    mag * if n < 1.5 {
        1.0
    } else if n < 3.5 {
        2.0
    } else if n < 7.5 {
        5.0
    } else {
        10.0
    }
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// Render a line plot with 95% CI bands, axes, ticks, a legend under the
/// plot (one line per series, never cut) and an optional horizontal
/// reference line (e.g. the PDR threshold). `ycap` bounds the y axis and
/// the bands (e.g. 100 for a percentage).
pub fn line_plot(
    title: &str,
    xlabel: &str,
    ylabel: &str,
    series: &[Series],
    hline: Option<f64>,
    ycap: Option<f64>,
) -> String {
    let w = 760.0;
    let (ml, mr, mt, mb) = (70.0, 20.0, 40.0, 50.0);
    let ph = 340.0;
    let legend_h = 18.0 * series.len() as f64 + 10.0;
    let h = mt + ph + mb + legend_h;
    let pw = w - ml - mr;
    let all: Vec<&(f64, f64, f64)> = series.iter().flat_map(|s| &s.points).collect();
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" viewBox=\"0 0 {w} {h}\" font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n<text x=\"{}\" y=\"20\" text-anchor=\"middle\" font-size=\"15\">{}</text>\n",
        ml + pw / 2.0,
        esc(title)
    );
    if all.is_empty() {
        s += &format!(
            "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">no data</text>\n</svg>\n",
            ml + pw / 2.0,
            mt + ph / 2.0
        );
        return s;
    }
    let xmin = 0.0f64;
    let xmax = all.iter().map(|p| p.0).fold(f64::MIN, f64::max).max(1e-9);
    let ymin = 0.0f64;
    let mut ymax = all.iter().map(|p| p.1 + p.2).fold(f64::MIN, f64::max);
    if let Some(hl) = hline {
        ymax = ymax.max(hl * 1.5);
    }
    let ymax = if ymax <= 0.0 { 1.0 } else { ymax * 1.05 };
    let ymax = match ycap {
        Some(c) if ymax > c => c,
        _ => ymax,
    };
    let xs = |x: f64| ml + (x - xmin) / (xmax - xmin) * pw;
    let ys = |y: f64| mt + ph - (y - ymin) / (ymax - ymin) * ph;
    // Axes and ticks.
    let _ = writeln!(
        s,
        "<path d=\"M{ml},{mt} V{} H{}\" fill=\"none\" stroke=\"black\"/>",
        mt + ph,
        ml + pw
    );
    let xt = tick_step(xmax - xmin);
    let mut x = 0.0;
    while x <= xmax + 1e-9 {
        let _ = writeln!(
            s,
            "<line x1=\"{0:.1}\" y1=\"{1}\" x2=\"{0:.1}\" y2=\"{2}\" stroke=\"#ddd\"/><text x=\"{0:.1}\" y=\"{3}\" text-anchor=\"middle\">{4}</text>",
            xs(x),
            mt,
            mt + ph,
            mt + ph + 16.0,
            x
        );
        x += xt;
    }
    let yt = tick_step(ymax - ymin);
    let mut y = 0.0;
    while y <= ymax + 1e-9 {
        let _ = writeln!(
            s,
            "<line x1=\"{1}\" y1=\"{0:.1}\" x2=\"{2}\" y2=\"{0:.1}\" stroke=\"#ddd\"/><text x=\"{3}\" y=\"{4:.1}\" text-anchor=\"end\">{5}</text>",
            ys(y),
            ml,
            ml + pw,
            ml - 6.0,
            ys(y) + 4.0,
            (y * 1e6).round() / 1e6
        );
        y += yt;
    }
    let _ = writeln!(
        s,
        "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>",
        ml + pw / 2.0,
        mt + ph + 36.0,
        esc(xlabel)
    );
    let _ = writeln!(
        s,
        "<text transform=\"translate(16,{}) rotate(-90)\" text-anchor=\"middle\">{}</text>",
        mt + ph / 2.0,
        esc(ylabel)
    );
    if let Some(hl) = hline {
        let _ = writeln!(
            s,
            "<line x1=\"{ml}\" y1=\"{0:.1}\" x2=\"{1}\" y2=\"{0:.1}\" stroke=\"black\" stroke-dasharray=\"4 3\"/><text x=\"{2}\" y=\"{3:.1}\">threshold {hl}</text>",
            ys(hl),
            ml + pw,
            ml + 4.0,
            ys(hl) - 4.0
        );
    }
    for (i, se) in series.iter().enumerate() {
        let c = COLORS[se.color.unwrap_or(i) % COLORS.len()];
        let dash = match DASHES[se.dash % DASHES.len()] {
            "" => String::new(),
            d => format!(" stroke-dasharray=\"{d}\""),
        };
        // The 95% CI band, clipped to the axis range.
        if se.points.iter().any(|p| p.2 > 0.0) {
            let up: Vec<String> = se
                .points
                .iter()
                .map(|p| format!("{:.1},{:.1}", xs(p.0), ys((p.1 + p.2).min(ymax))))
                .collect();
            let down: Vec<String> = se
                .points
                .iter()
                .rev()
                .map(|p| format!("{:.1},{:.1}", xs(p.0), ys((p.1 - p.2).max(ymin))))
                .collect();
            let _ = writeln!(
                s,
                "<polygon points=\"{} {}\" fill=\"{c}\" fill-opacity=\"0.10\" stroke=\"none\"/>",
                up.join(" "),
                down.join(" ")
            );
        }
        let pts: Vec<String> = se
            .points
            .iter()
            .map(|p| format!("{:.1},{:.1}", xs(p.0), ys(p.1.min(ymax))))
            .collect();
        let _ = writeln!(
            s,
            "<polyline points=\"{}\" fill=\"none\" stroke=\"{c}\" stroke-width=\"2\"{dash}/>",
            pts.join(" ")
        );
        for p in &se.points {
            let _ = writeln!(
                s,
                "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"3\" fill=\"{c}\"/>",
                xs(p.0),
                ys(p.1.min(ymax))
            );
        }
        let ly = mt + ph + mb + 10.0 + 18.0 * i as f64;
        let _ = writeln!(
            s,
            "<line x1=\"{0}\" y1=\"{1}\" x2=\"{2}\" y2=\"{1}\" stroke=\"{c}\" stroke-width=\"2\"{dash}/><text x=\"{3}\" y=\"{4}\">{5}</text>",
            ml,
            ly,
            ml + 30.0,
            ml + 35.0,
            ly + 4.0,
            esc(&se.label)
        );
    }
    s += "</svg>\n";
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plot_has_one_polyline_per_series_and_is_well_formed() {
        let s = line_plot(
            "t",
            "x",
            "y",
            &[
                Series {
                    label: "a<b".into(),
                    points: vec![(200.0, 0.0, 0.0), (400.0, 2.0, 0.5)],
                    color: None,
                    dash: 0,
                },
                Series {
                    label: "c".into(),
                    points: vec![(200.0, 1.0, 0.0)],
                    color: Some(0),
                    dash: 1,
                },
            ],
            Some(1.0),
            Some(100.0),
        );
        assert!(s.starts_with("<svg") && s.trim_end().ends_with("</svg>"));
        assert_eq!(s.matches("<polyline").count(), 2);
        assert!(s.contains("a&lt;b"));
        // The second series shares the first's colour but is dashed.
        assert_eq!(
            s.matches("stroke=\"#1f77b4\" stroke-width=\"2\"").count(),
            4
        );
        assert_eq!(s.matches("stroke-dasharray=\"7 3\"").count(), 2);
        assert!(!s.contains("NaN"));
        assert!(line_plot("t", "x", "y", &[], None, None).contains("no data"));
        // A CI reaching past 100% is clipped at the cap: no point above the
        // plot's top edge (y = 40).
        let s = line_plot(
            "t",
            "x",
            "PDR (%)",
            &[Series {
                label: "wide".into(),
                points: vec![(100.0, 90.0, 50.0), (200.0, 95.0, 40.0)],
                color: None,
                dash: 0,
            }],
            None,
            Some(100.0),
        );
        let band = s.lines().find(|l| l.starts_with("<polygon")).unwrap();
        let ys: Vec<f64> = band
            .split('"')
            .nth(1)
            .unwrap()
            .split(' ')
            .map(|p| p.split(',').nth(1).unwrap().parse().unwrap())
            .collect();
        assert!(ys.iter().all(|&y| y >= 40.0 - 1e-9), "{band}");
    }
}
