//! Prometheus text exposition (format 0.0.4).

use hdrhistogram::Histogram;
use std::fmt::Write as _;

/// Escape a Prometheus label value.
fn esc(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// Upper bounds (seconds) of the Prometheus latency histogram buckets.
pub const BUCKETS_S: [f64; 16] = [
    1e-6, 2e-6, 5e-6, 1e-5, 2e-5, 5e-5, 1e-4, 2e-4, 5e-4, 1e-3, 2e-3, 5e-3, 1e-2, 5e-2, 1e-1, 1.0,
];

/// Builder of Prometheus text exposition (format 0.0.4).
#[derive(Default)]
pub struct PromText {
    out: String,
    declared: std::collections::BTreeSet<String>,
}

impl PromText {
    /// Write `# HELP`/`# TYPE` once per metric name.
    fn head(&mut self, name: &str, kind: &str, help: &str) {
        if self.declared.insert(name.to_string()) {
            let _ = writeln!(self.out, "# HELP {name} {help}");
            let _ = writeln!(self.out, "# TYPE {name} {kind}");
        }
    }

    fn labels(labels: &[(&str, &str)]) -> String {
        if labels.is_empty() {
            return String::new();
        }
        let inner: Vec<String> = labels
            .iter()
            .map(|(k, v)| format!("{k}=\"{}\"", esc(v)))
            .collect();
        format!("{{{}}}", inner.join(","))
    }

    /// One counter sample.
    pub fn counter(&mut self, name: &str, help: &str, labels: &[(&str, &str)], v: u64) {
        self.head(name, "counter", help);
        let _ = writeln!(self.out, "{name}{} {v}", Self::labels(labels));
    }

    /// One counter sample with a fractional value (seconds).
    pub fn counter_f64(&mut self, name: &str, help: &str, labels: &[(&str, &str)], v: f64) {
        self.head(name, "counter", help);
        let _ = writeln!(self.out, "{name}{} {v}", Self::labels(labels));
    }

    /// One gauge sample.
    pub fn gauge(&mut self, name: &str, help: &str, labels: &[(&str, &str)], v: f64) {
        self.head(name, "gauge", help);
        let _ = writeln!(self.out, "{name}{} {v}", Self::labels(labels));
    }

    /// An I/O backend's counters (every whole-number field of
    /// [`ringway_io::IoStats`]), each as `{prefix}_io_{field}_total`,
    /// labelled with the backend's name.
    pub fn io_counters(&mut self, prefix: &str, backend: &str, io: &ringway_io::IoStats) {
        if let serde_json::Value::Object(fields) = serde_json::to_value(io).unwrap_or_default() {
            for (field, value) in fields {
                if let Some(value) = value.as_u64() {
                    self.counter(
                        &format!("{prefix}_io_{field}_total"),
                        "Backend counter (see ringway_io::IoStats).",
                        &[("backend", backend)],
                        value,
                    );
                }
            }
        }
    }

    /// A histogram (seconds) from a nanosecond HDR histogram.
    pub fn histogram(
        &mut self,
        name: &str,
        help: &str,
        labels: &[(&str, &str)],
        h: &Histogram<u64>,
    ) {
        self.head(name, "histogram", help);
        let mut cum = 0u64;
        let mut low = 0u64;
        for b in BUCKETS_S {
            let high = (b * 1e9).round() as u64;
            cum += count_in(h, low, high);
            low = high + 1;
            let bound = format!("{b:e}");
            let mut bucket_labels = labels.to_vec();
            bucket_labels.push(("le", &bound));
            let _ = writeln!(
                self.out,
                "{name}_bucket{} {cum}",
                Self::labels(&bucket_labels)
            );
        }
        let mut bucket_labels = labels.to_vec();
        bucket_labels.push(("le", "+Inf"));
        let _ = writeln!(
            self.out,
            "{name}_bucket{} {}",
            Self::labels(&bucket_labels),
            h.len()
        );
        let sum_s = h.mean() * h.len() as f64 / 1e9;
        let _ = writeln!(self.out, "{name}_sum{} {sum_s}", Self::labels(labels));
        let _ = writeln!(self.out, "{name}_count{} {}", Self::labels(labels), h.len());
    }

    /// The finished text.
    pub fn finish(self) -> String {
        self.out
    }
}

/// Samples with value in `[lo, hi]` (ns), by walking recorded values.
fn count_in(h: &Histogram<u64>, lo: u64, hi: u64) -> u64 {
    if h.is_empty() || lo > h.max() {
        return 0;
    }
    h.iter_recorded()
        .filter(|v| {
            let value = v.value_iterated_to();
            value >= lo && value <= hi
        })
        .map(|v| v.count_at_value())
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::latency_histogram;

    #[test]
    fn prometheus_histogram_is_cumulative() {
        let mut h = latency_histogram();
        h.record(500).unwrap(); // 0.5 µs -> first bucket
        h.record(3_000).unwrap(); // 3 µs -> 5e-6 bucket
        h.record(2_000_000_000).unwrap(); // 2 s -> only +Inf
        let mut p = PromText::default();
        p.histogram("x_seconds", "test", &[("type", "INVITE")], &h);
        let t = p.finish();
        assert!(t.contains("# TYPE x_seconds histogram"));
        assert!(
            t.contains("x_seconds_bucket{type=\"INVITE\",le=\"1e-6\"} 1"),
            "{t}"
        );
        assert!(t.contains("x_seconds_bucket{type=\"INVITE\",le=\"2e-6\"} 1"));
        assert!(t.contains("x_seconds_bucket{type=\"INVITE\",le=\"5e-6\"} 2"));
        assert!(t.contains("x_seconds_bucket{type=\"INVITE\",le=\"1e0\"} 2"));
        assert!(t.contains("x_seconds_bucket{type=\"INVITE\",le=\"+Inf\"} 3"));
        assert!(t.contains("x_seconds_count{type=\"INVITE\"} 3"));
    }
}
