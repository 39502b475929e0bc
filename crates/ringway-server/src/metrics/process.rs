//! The series every ringway `/metrics` starts with, after Prometheus'
//! conventions (prometheus.io/docs/instrumenting/writing_clientlibs):
//! `ringway_build_info{version,commit} 1`, `process_start_time_seconds`,
//! `process_resident_memory_bytes`, `process_open_fds`, and
//! `ringway_log_suppressed_total` (rate-limited log lines left out). Read from
//! `/proc/self`; a value that cannot be read is left out (never 0).

use super::PromText;

/// Clock ticks per second of `/proc/<pid>/stat` times: the kernel's
/// USER_HZ, 100 on every architecture Linux reports it for (the ABI).
const USER_HZ: f64 = 100.0;

/// Append the build and process series to `p`.
pub fn process_metrics(p: &mut PromText) {
    p.gauge(
        "ringway_build_info",
        "The version and git commit of this build (value 1).",
        &[
            ("version", crate::build::VERSION),
            ("commit", crate::build::COMMIT),
        ],
        1.0,
    );
    p.counter(
        "ringway_log_suppressed_total",
        "Log lines the data path's rate limits left out.",
        &[],
        crate::log_limit::suppressed_total(),
    );
    if let Some(start) = start_time_seconds() {
        p.gauge(
            "process_start_time_seconds",
            "Start time of the process since the Unix epoch (s).",
            &[],
            start,
        );
    }
    if let Some(rss) = resident_bytes() {
        p.gauge(
            "process_resident_memory_bytes",
            "Resident memory size (bytes).",
            &[],
            rss as f64,
        );
    }
    if let Ok(dir) = std::fs::read_dir("/proc/self/fd") {
        p.gauge(
            "process_open_fds",
            "Open file descriptors.",
            &[],
            dir.count() as f64,
        );
    }
}

/// Boot time (`btime` of /proc/stat) plus the process' start in ticks.
fn start_time_seconds() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Field 22 (starttime); fields counted after the `)` that ends comm.
    let after = &stat[stat.rfind(')')? + 2..];
    let ticks: f64 = after.split(' ').nth(19)?.parse().ok()?;
    let boot: f64 = std::fs::read_to_string("/proc/stat")
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("btime "))?
        .trim()
        .parse()
        .ok()?;
    Some(boot + ticks / USER_HZ)
}

/// `VmRSS` of /proc/self/status in bytes.
fn resident_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .trim()
        .strip_suffix("kB")?
        .trim()
        .parse()
        .ok()?;
    Some(kb * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn process_series_are_read_and_plausible() {
        let mut p = PromText::default();
        process_metrics(&mut p);
        let text = p.finish();
        assert!(text.contains("ringway_build_info{version=\""), "{text}");
        let value = |name: &str| -> f64 {
            text.lines()
                .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
                .unwrap_or_else(|| panic!("{name} missing: {text}"))
        };
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64();
        let start = value("process_start_time_seconds");
        assert!(
            start <= now + 1.0 && start > now - 86_400.0,
            "{start} vs {now}"
        );
        assert!(value("process_resident_memory_bytes") > 1e5);
        assert!(value("process_open_fds") >= 3.0);
    }
}
