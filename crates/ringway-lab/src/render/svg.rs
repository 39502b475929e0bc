//! Minimal SVG line plots (no plotting crate).

use super::esc;
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
    /// Draw the points only, not a line through them (e.g. single runs).
    pub markers_only: bool,
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
    let normalized = raw / mag;
    mag * if normalized < 1.5 {
        1.0
    } else if normalized < 3.5 {
        2.0
    } else if normalized < 7.5 {
        5.0
    } else {
        10.0
    }
}

/// The plot area and its scales.
struct Frame {
    /// Left margin (the y axis).
    left: f64,
    /// Top margin.
    top: f64,
    /// Plot width and height.
    width: f64,
    height: f64,
    xmax: f64,
    ymax: f64,
}

impl Frame {
    /// The frame for `points`, the y axis reaching at least 1.5 × `hline`
    /// and at most `ycap`.
    fn new(points: &[&(f64, f64, f64)], hline: Option<f64>, ycap: Option<f64>) -> Frame {
        let xmax = points
            .iter()
            .map(|p| p.0)
            .fold(f64::MIN, f64::max)
            .max(1e-9);
        let mut ymax = points.iter().map(|p| p.1 + p.2).fold(f64::MIN, f64::max);
        if let Some(line) = hline {
            ymax = ymax.max(line * 1.5);
        }
        let ymax = if ymax <= 0.0 { 1.0 } else { ymax * 1.05 };
        let ymax = match ycap {
            Some(cap) if ymax > cap => cap,
            _ => ymax,
        };
        Frame {
            left: 70.0,
            top: 40.0,
            width: 760.0 - 70.0 - 20.0,
            height: 340.0,
            xmax,
            ymax,
        }
    }

    /// Both axes start at 0.
    fn x(&self, x: f64) -> f64 {
        self.left + x / self.xmax * self.width
    }

    fn y(&self, y: f64) -> f64 {
        self.top + self.height - y / self.ymax * self.height
    }

    fn bottom(&self) -> f64 {
        self.top + self.height
    }

    fn right(&self) -> f64 {
        self.left + self.width
    }

    /// Axes, grid lines with tick labels, and the axis labels.
    fn axes(&self, s: &mut String, xlabel: &str, ylabel: &str) {
        let (left, top, bottom, right) = (self.left, self.top, self.bottom(), self.right());
        let _ = writeln!(
            s,
            "<path d=\"M{left},{top} V{bottom} H{right}\" fill=\"none\" stroke=\"black\"/>"
        );
        let step = tick_step(self.xmax);
        let mut x_pos = 0.0;
        while x_pos <= self.xmax + 1e-9 {
            let _ = writeln!(
                s,
                "<line x1=\"{0:.1}\" y1=\"{1}\" x2=\"{0:.1}\" y2=\"{2}\" stroke=\"#ddd\"/><text x=\"{0:.1}\" y=\"{3}\" text-anchor=\"middle\">{4}</text>",
                self.x(x_pos),
                top,
                bottom,
                bottom + 16.0,
                x_pos
            );
            x_pos += step;
        }
        let step = tick_step(self.ymax);
        let mut y_pos = 0.0;
        while y_pos <= self.ymax + 1e-9 {
            let _ = writeln!(
                s,
                "<line x1=\"{1}\" y1=\"{0:.1}\" x2=\"{2}\" y2=\"{0:.1}\" stroke=\"#ddd\"/><text x=\"{3}\" y=\"{4:.1}\" text-anchor=\"end\">{5}</text>",
                self.y(y_pos),
                left,
                right,
                left - 6.0,
                self.y(y_pos) + 4.0,
                // Tick labels without binary-fraction noise (0.30000000000000004).
                (y_pos * 1e6).round() / 1e6
            );
            y_pos += step;
        }
        let _ = writeln!(
            s,
            "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>",
            left + self.width / 2.0,
            bottom + 36.0,
            esc(xlabel)
        );
        let _ = writeln!(
            s,
            "<text transform=\"translate(16,{}) rotate(-90)\" text-anchor=\"middle\">{}</text>",
            top + self.height / 2.0,
            esc(ylabel)
        );
    }

    /// A dashed horizontal reference line at `level`.
    fn reference_line(&self, s: &mut String, level: f64) {
        let left = self.left;
        let _ = writeln!(
            s,
            "<line x1=\"{left}\" y1=\"{0:.1}\" x2=\"{1}\" y2=\"{0:.1}\" stroke=\"black\" stroke-dasharray=\"4 3\"/><text x=\"{2}\" y=\"{3:.1}\">threshold {level}</text>",
            self.y(level),
            self.right(),
            left + 4.0,
            self.y(level) - 4.0
        );
    }

    /// Series `index`: its CI band (clipped to the axis range), its line
    /// (unless markers only), its markers and its legend entry.
    fn series(&self, s: &mut String, index: usize, series: &Series) {
        let color = COLORS[series.color.unwrap_or(index) % COLORS.len()];
        let dash = match DASHES[series.dash % DASHES.len()] {
            "" => String::new(),
            pattern => format!(" stroke-dasharray=\"{pattern}\""),
        };
        let point = |x: f64, y: f64| format!("{:.1},{:.1}", self.x(x), self.y(y));
        if series.points.iter().any(|p| p.2 > 0.0) {
            let upper: Vec<String> = series
                .points
                .iter()
                .map(|p| point(p.0, (p.1 + p.2).min(self.ymax)))
                .collect();
            let lower: Vec<String> = series
                .points
                .iter()
                .rev()
                .map(|p| point(p.0, (p.1 - p.2).max(0.0)))
                .collect();
            let _ = writeln!(
                s,
                "<polygon points=\"{} {}\" fill=\"{color}\" fill-opacity=\"0.10\" stroke=\"none\"/>",
                upper.join(" "),
                lower.join(" ")
            );
        }
        if !series.markers_only {
            let line: Vec<String> = series
                .points
                .iter()
                .map(|p| point(p.0, p.1.min(self.ymax)))
                .collect();
            let _ = writeln!(
                s,
                "<polyline points=\"{}\" fill=\"none\" stroke=\"{color}\" stroke-width=\"2\"{dash}/>",
                line.join(" ")
            );
        }
        for p in &series.points {
            let _ = writeln!(
                s,
                "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"3\" fill=\"{color}\"/>",
                self.x(p.0),
                self.y(p.1.min(self.ymax))
            );
        }
        let legend_y = self.bottom() + 50.0 + 10.0 + 18.0 * index as f64;
        let _ = writeln!(
            s,
            "<line x1=\"{0}\" y1=\"{1}\" x2=\"{2}\" y2=\"{1}\" stroke=\"{color}\" stroke-width=\"2\"{dash}/><text x=\"{3}\" y=\"{4}\">{5}</text>",
            self.left,
            legend_y,
            self.left + 30.0,
            self.left + 35.0,
            legend_y + 4.0,
            esc(&series.label)
        );
    }
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
    let points: Vec<&(f64, f64, f64)> = series.iter().flat_map(|out| &out.points).collect();
    let frame = Frame::new(&points, hline, ycap);
    let width = 760.0;
    let legend_height = 18.0 * series.len() as f64 + 10.0;
    let height = frame.top + frame.height + 50.0 + legend_height;
    let mut out = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{width}\" height=\"{height}\" viewBox=\"0 0 {width} {height}\" font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n<text x=\"{}\" y=\"20\" text-anchor=\"middle\" font-size=\"15\">{}</text>\n",
        frame.left + frame.width / 2.0,
        esc(title)
    );
    if points.is_empty() {
        out += &format!(
            "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">no data</text>\n</svg>\n",
            frame.left + frame.width / 2.0,
            frame.top + frame.height / 2.0
        );
        return out;
    }
    frame.axes(&mut out, xlabel, ylabel);
    if let Some(level) = hline {
        frame.reference_line(&mut out, level);
    }
    for (index, one) in series.iter().enumerate() {
        frame.series(&mut out, index, one);
    }
    out += "</svg>\n";
    out
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
                    markers_only: false,
                },
                Series {
                    label: "c".into(),
                    points: vec![(200.0, 1.0, 0.0)],
                    color: Some(0),
                    dash: 1,
                    markers_only: false,
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
                markers_only: false,
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
