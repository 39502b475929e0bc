//! The labs' one rendering module: every experiment computes its rows
//! first and formats them here, so the four labs print alike.
//!
//! * [`Table`]: a titled table to fixed-width text, Markdown or HTML;
//! * [`mean_ci`]: "mean ± 95% CI" with one rule for missing data ("n/a")
//!   and a single run ("(n=1)": no interval);
//! * [`svg::line_plot`]: an SVG plot of series with CI bands, lines or
//!   markers only, and a legend.

pub mod svg;

use crate::stats::MeanCi;
use serde::Serialize;
use std::fmt::Write as _;

/// A table rendered to text, Markdown and HTML.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Table {
    /// Caption.
    pub title: String,
    /// Column headers.
    pub header: Vec<String>,
    /// Rows of cells.
    pub rows: Vec<Vec<String>>,
}

/// `text` with `&`, `<` and `>` escaped for HTML and SVG.
pub fn esc(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

impl Table {
    /// An empty table.
    pub fn new(title: impl Into<String>, header: &[&str]) -> Table {
        Table {
            title: title.into(),
            header: header.iter().map(|s| s.to_string()).collect(),
            rows: Vec::new(),
        }
    }

    /// Fixed-width text: the title (when there is one), then the header
    /// and the rows, every column right-aligned to its widest cell.
    pub fn text(&self) -> String {
        let columns = self
            .rows
            .iter()
            .map(Vec::len)
            .chain([self.header.len()])
            .max()
            .unwrap_or(0);
        let mut widths = vec![0; columns];
        for row in std::iter::once(&self.header).chain(&self.rows) {
            for (width, cell) in widths.iter_mut().zip(row) {
                *width = (*width).max(cell.chars().count());
            }
        }
        let mut out = String::new();
        if !self.title.is_empty() {
            out.push_str(&self.title);
            out.push('\n');
        }
        for row in std::iter::once(&self.header).chain(&self.rows) {
            let cells: Vec<String> = row
                .iter()
                .zip(&widths)
                .map(|(cell, &width)| format!("{cell:>width$}"))
                .collect();
            out.push_str(&cells.join(" "));
            out.push('\n');
        }
        out
    }

    /// Markdown rendering.
    pub fn markdown(&self) -> String {
        let mut out = format!("**{}**\n\n| {} |\n|", self.title, self.header.join(" | "));
        for _ in &self.header {
            out += "---|";
        }
        out += "\n";
        for row in &self.rows {
            out += &format!("| {} |\n", row.join(" | "));
        }
        out
    }

    /// HTML rendering.
    pub fn html(&self) -> String {
        let mut out = format!("<table>\n<caption>{}</caption>\n<tr>", esc(&self.title));
        for cell in &self.header {
            let _ = write!(out, "<th>{}</th>", esc(cell));
        }
        out += "</tr>\n";
        for row in &self.rows {
            out += "<tr>";
            for cell in row {
                let _ = write!(out, "<td>{}</td>", esc(cell));
            }
            out += "</tr>\n";
        }
        out + "</table>\n"
    }
}

/// Decimals of a [`mean_ci`].
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Digits {
    /// This many.
    Fixed(usize),
    /// By the mean's magnitude: 1 from 100, 2 from 1, else 3.
    ByMagnitude,
}

/// "mean ± ci95"; "n/a" without data; "mean (n=1)" for a single value,
/// which has no interval.
pub fn mean_ci(m: &MeanCi, digits: Digits) -> String {
    if m.n == 0 || !m.mean.is_finite() {
        return "n/a".into();
    }
    let digits = match digits {
        Digits::Fixed(digits) => digits,
        Digits::ByMagnitude if m.mean.abs() >= 100.0 => 1,
        Digits::ByMagnitude if m.mean.abs() >= 1.0 => 2,
        Digits::ByMagnitude => 3,
    };
    if m.n == 1 {
        return format!("{:.*} (n=1)", digits, m.mean);
    }
    format!("{:.*} ± {:.*}", digits, m.mean, digits, m.ci95)
}

/// [`mean_ci`] of a value that may be absent ("n/a").
pub fn opt_mean_ci(m: Option<&MeanCi>, digits: Digits) -> String {
    m.map_or("n/a".into(), |m| mean_ci(m, digits))
}

/// A number with `digits` decimals, or "n/a".
pub fn opt(v: Option<f64>, digits: usize) -> String {
    v.filter(|v| v.is_finite())
        .map_or("n/a".into(), |v| format!("{v:.digits$}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stats::mean_ci as stat;

    #[test]
    fn mean_ci_says_n_a_single_or_interval() {
        assert_eq!(mean_ci(&stat(&[]), Digits::Fixed(1)), "n/a");
        assert_eq!(mean_ci(&stat(&[2.0]), Digits::Fixed(1)), "2.0 (n=1)");
        assert_eq!(
            mean_ci(&stat(&[0.5, 0.5]), Digits::ByMagnitude),
            "0.500 ± 0.000"
        );
        assert_eq!(
            mean_ci(&stat(&[120.0, 140.0]), Digits::ByMagnitude),
            "130.0 ± 127.1"
        );
        assert_eq!(opt(None, 2), "n/a");
        assert_eq!(opt(Some(f64::NAN), 2), "n/a");
    }

    #[test]
    fn text_aligns_columns_to_the_widest_cell() {
        let mut t = Table::new("", &["a", "bbb"]);
        t.rows.push(vec!["1234".into(), "5".into()]);
        assert_eq!(t.text(), "   a bbb\n1234   5\n");
        let mut t = Table::new("T", &["x"]);
        t.rows.push(vec!["<y>".into()]);
        assert!(t.markdown().starts_with("**T**"));
        assert!(t.html().contains("<td>&lt;y&gt;</td>"));
    }
}
