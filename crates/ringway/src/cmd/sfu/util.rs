//! Helpers shared by the SFU commands: per-thread CPU time, thread pinning,
//! stop flags.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

/// User and kernel CPU time of one thread, in seconds.
#[derive(Copy, Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct CpuTime {
    /// Seconds in user mode.
    pub user_s: f64,
    /// Seconds in kernel mode.
    pub system_s: f64,
}

impl CpuTime {
    /// CPU time of the calling thread: `getrusage(RUSAGE_THREAD)` via
    /// ringway-io, else `/proc/thread-self/stat` (1/100 s ticks).
    pub fn this_thread() -> CpuTime {
        if let Ok(c) = ringway_io::thread::thread_cpu_time() {
            return CpuTime {
                user_s: c.user_ns as f64 / 1e9,
                system_s: c.system_ns as f64 / 1e9,
            };
        }
        std::fs::read_to_string("/proc/thread-self/stat")
            .ok()
            .and_then(|s| parse_stat(&s))
            .unwrap_or_default()
    }
    /// `self - earlier`.
    pub fn since(self, earlier: CpuTime) -> CpuTime {
        CpuTime {
            user_s: self.user_s - earlier.user_s,
            system_s: self.system_s - earlier.system_s,
        }
    }
}

/// Parse utime and stime (fields 14 and 15) of a `/proc/.../stat` line.
pub fn parse_stat(s: &str) -> Option<CpuTime> {
    let rest = &s[s.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // rest starts at field 3 (state): utime is field 14 → index 11.
    let ticks = |i: usize| f.get(i)?.parse::<u64>().ok();
    const HZ: f64 = 100.0;
    Some(CpuTime {
        user_s: ticks(11)? as f64 / HZ,
        system_s: ticks(12)? as f64 / HZ,
    })
}

/// Parse a CPU list such as `1`, `0,2` or `0-3`.
pub fn parse_cpus(s: &str) -> anyhow::Result<Vec<usize>> {
    let mut v = Vec::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b): (usize, usize) = (a.parse()?, b.parse()?);
                anyhow::ensure!(a <= b && b < 4096, "bad CPU range {part}");
                v.extend(a..=b);
            }
            None => v.push(part.parse()?),
        }
    }
    anyhow::ensure!(!v.is_empty(), "empty CPU list");
    Ok(v)
}

/// Pin the calling thread to `cpus` (list syntax, e.g. `1` or `0-1`).
pub fn pin_this_thread(cpus: &str) -> anyhow::Result<()> {
    let list = parse_cpus(cpus)?;
    match ringway_io::thread::set_affinity(&list) {
        ringway_io::thread::Outcome::Applied(_) => Ok(()),
        other => anyhow::bail!("pinning to CPUs {list:?}: {other:?}"),
    }
}

/// Receive errors that concern one peer (an ICMP error reported on the
/// socket), not the socket itself: count them and keep going.
pub fn transient(e: &std::io::Error) -> bool {
    use std::io::ErrorKind::*;
    matches!(
        e.kind(),
        ConnectionRefused
            | ConnectionReset
            | HostUnreachable
            | NetworkUnreachable
            | Interrupted
            | WouldBlock
            | TimedOut
    )
}

/// A flag set on SIGINT/SIGTERM.
pub fn stop_flag() -> anyhow::Result<Arc<AtomicBool>> {
    let f = Arc::new(AtomicBool::new(false));
    signal_hook::flag::register(signal_hook::consts::SIGINT, f.clone())?;
    signal_hook::flag::register(signal_hook::consts::SIGTERM, f.clone())?;
    Ok(f)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_proc_stat() {
        let s = "20253 (a b) c) R 20250 20250 5489 0 -1 4194304 125 0 0 0 250 37 0 0 20 0 1 0";
        let c = parse_stat(s).unwrap();
        assert_eq!((c.user_s, c.system_s), (2.5, 0.37));
        assert_eq!(parse_cpus("0,2-3").unwrap(), vec![0, 2, 3]);
        assert!(parse_cpus("3-1").is_err());
    }
}
