//! CPU time of threads and processes from procfs.

use serde::{Deserialize, Serialize};

/// User and system CPU seconds.
#[derive(Copy, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct CpuTimes {
    /// User-mode CPU seconds.
    pub user_s: f64,
    /// Kernel-mode CPU seconds.
    pub sys_s: f64,
}

impl CpuTimes {
    /// user + sys.
    pub fn total(&self) -> f64 {
        self.user_s + self.sys_s
    }
    /// Component-wise difference `self - earlier` (never negative).
    pub fn since(&self, earlier: &CpuTimes) -> CpuTimes {
        CpuTimes {
            user_s: (self.user_s - earlier.user_s).max(0.0),
            sys_s: (self.sys_s - earlier.sys_s).max(0.0),
        }
    }
    /// Component-wise sum.
    pub fn add(&self, o: &CpuTimes) -> CpuTimes {
        CpuTimes {
            user_s: self.user_s + o.user_s,
            sys_s: self.sys_s + o.sys_s,
        }
    }
}

/// Clock ticks per second of `/proc/*/stat` times (USER_HZ, 100 on Linux).
const USER_HZ: f64 = 100.0;

/// Parse utime/stime (fields 14 and 15) of a `/proc/.../stat` line.
pub fn parse_stat(line: &str) -> Option<CpuTimes> {
    // The command name (field 2) may contain spaces: skip past its ')'.
    let rest = &line[line.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // rest starts at field 3 (state) → utime is index 14-3 = 11.
    let ut: f64 = f.get(11)?.parse().ok()?;
    let st: f64 = f.get(12)?.parse().ok()?;
    Some(CpuTimes {
        user_s: ut / USER_HZ,
        sys_s: st / USER_HZ,
    })
}

/// CPU time of the calling thread.
pub fn thread_cpu() -> Option<CpuTimes> {
    parse_stat(&std::fs::read_to_string("/proc/thread-self/stat").ok()?)
}

/// CPU time of the calling process (all threads).
pub fn self_cpu() -> Option<CpuTimes> {
    parse_stat(&std::fs::read_to_string("/proc/self/stat").ok()?)
}

/// CPU time of process `pid` (all threads; children not included).
pub fn pid_cpu(pid: u32) -> Option<CpuTimes> {
    parse_stat(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_stat_with_spaces_in_name() {
        let l = "123 (a b) S 1 2 3 4 5 6 7 8 9 10 250 50 0 0 20 0 1 0";
        let c = parse_stat(l).unwrap();
        assert_eq!(c.user_s, 2.5);
        assert_eq!(c.sys_s, 0.5);
        assert!(thread_cpu().is_some());
        assert!(self_cpu().is_some());
    }
}
