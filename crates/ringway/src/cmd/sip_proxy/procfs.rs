//! Small /proc readers: CPU time of this process and its threads.

use serde::Serialize;

/// Clock ticks per second of /proc CPU times (USER_HZ, 100 on every Linux ABI we run on).
const USER_HZ: f64 = 100.0;

/// User and system CPU seconds.
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq)]
pub struct CpuTime {
    /// User-mode seconds.
    pub user_s: f64,
    /// Kernel-mode seconds.
    pub sys_s: f64,
}

impl CpuTime {
    /// `self - earlier`.
    pub fn since(self, earlier: CpuTime) -> CpuTime {
        CpuTime {
            user_s: (self.user_s - earlier.user_s).max(0.0),
            sys_s: (self.sys_s - earlier.sys_s).max(0.0),
        }
    }
}

/// Parse utime/stime out of a /proc `stat` line (fields 14 and 15, after the `(comm)`).
pub fn parse_stat_cpu(stat: &str) -> Option<CpuTime> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // rest starts at field 3 (state); utime is field 14 -> index 11.
    let ut: u64 = f.get(11)?.parse().ok()?;
    let st: u64 = f.get(12)?.parse().ok()?;
    Some(CpuTime {
        user_s: ut as f64 / USER_HZ,
        sys_s: st as f64 / USER_HZ,
    })
}

/// CPU time of the whole process.
pub fn process_cpu() -> Option<CpuTime> {
    parse_stat_cpu(&std::fs::read_to_string("/proc/self/stat").ok()?)
}

/// The kernel thread id of the calling thread (from /proc/thread-self).
pub fn current_tid() -> Option<u32> {
    let link = std::fs::read_link("/proc/thread-self").ok()?;
    link.file_name()?.to_str()?.parse().ok()
}

/// CPU time of thread `tid` of this process.
pub fn thread_cpu(tid: u32) -> Option<CpuTime> {
    parse_stat_cpu(&std::fs::read_to_string(format!("/proc/self/task/{tid}/stat")).ok()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_stat_with_spaces_in_comm() {
        let s = "123 (a b) c) S 1 2 3 4 5 6 7 8 9 10 250 75 0 0 20 0 1 0";
        let c = parse_stat_cpu(s).unwrap();
        assert!((c.user_s - 2.5).abs() < 1e-9);
        assert!((c.sys_s - 0.75).abs() < 1e-9);
        assert!(process_cpu().is_some());
        assert!(thread_cpu(current_tid().unwrap()).is_some());
    }
}
