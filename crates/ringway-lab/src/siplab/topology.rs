//! CPU topology of a CPU set (sockets p, cores c, SMT) and per-thread
//! scheduler statistics of a process tree (migrations, voluntary and
//! involuntary context switches from /proc/<pid>/task/<tid>/{sched,status}).

use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;

/// Topology of the CPUs a proxy runs on.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Topology {
    /// The CPU ids.
    pub cpus: Vec<usize>,
    /// Distinct physical packages (the papers' p).
    pub sockets: usize,
    /// Distinct physical cores (the papers' c).
    pub cores: usize,
    /// Hardware threads per core (1: no SMT in the set).
    pub smt: usize,
}

/// Topology of `cpus` from (package id, core id) pairs, one per CPU.
pub fn topology_of(cpus: &[usize], ids: &[(u32, u32)]) -> Topology {
    let sockets: BTreeSet<u32> = ids.iter().map(|i| i.0).collect();
    let cores: BTreeSet<(u32, u32)> = ids.iter().copied().collect();
    Topology {
        cpus: cpus.to_vec(),
        sockets: sockets.len(),
        cores: cores.len(),
        smt: if cores.is_empty() {
            1
        } else {
            ids.len().div_ceil(cores.len())
        },
    }
}

/// Read the topology of `cpus` from /sys/devices/system/cpu (a CPU whose
/// files are missing counts as its own core on package 0).
pub fn detect(cpus: &[usize]) -> Topology {
    let read = |cpu: usize, f: &str| -> Option<u32> {
        std::fs::read_to_string(format!("/sys/devices/system/cpu/cpu{cpu}/topology/{f}"))
            .ok()?
            .trim()
            .parse()
            .ok()
    };
    let ids: Vec<(u32, u32)> = cpus
        .iter()
        .map(|&c| {
            (
                read(c, "physical_package_id").unwrap_or(0),
                read(c, "core_id").unwrap_or(c as u32),
            )
        })
        .collect();
    topology_of(cpus, &ids)
}

/// Parse a CPU list such as `0-2,5` (as in Cpus_allowed_list).
pub fn parse_cpu_list(s: &str) -> Result<Vec<usize>, String> {
    let mut out = BTreeSet::new();
    for part in s.trim().split(',').filter(|p| !p.is_empty()) {
        let (first, last) = match part.split_once('-') {
            Some((first, last)) => (first, last),
            None => (part, part),
        };
        let first: usize = first
            .trim()
            .parse()
            .map_err(|_| format!("bad CPU list {s:?}"))?;
        let last: usize = last
            .trim()
            .parse()
            .map_err(|_| format!("bad CPU list {s:?}"))?;
        if first > last || last > 4095 {
            return Err(format!("bad CPU range {part:?} in {s:?}"));
        }
        out.extend(first..=last);
    }
    if out.is_empty() {
        return Err(format!("empty CPU list {s:?}"));
    }
    Ok(out.into_iter().collect())
}

/// CPU list text (`0-2,5`).
pub fn cpu_list_text(cpus: &[usize]) -> String {
    let mut parts = Vec::new();
    let mut start = 0;
    while start < cpus.len() {
        let mut end = start;
        while end + 1 < cpus.len() && cpus[end + 1] == cpus[end] + 1 {
            end += 1;
        }
        parts.push(if start == end {
            cpus[start].to_string()
        } else {
            format!("{}-{}", cpus[start], cpus[end])
        });
        start = end + 1;
    }
    parts.join(",")
}

/// Scheduler statistics of one thread.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ThreadSched {
    /// Process id.
    pub pid: u32,
    /// Thread id.
    pub tid: u32,
    /// Thread name (comm).
    pub name: String,
    /// `se.nr_migrations`.
    pub migrations: u64,
    /// `voluntary_ctxt_switches`.
    pub voluntary: u64,
    /// `nonvoluntary_ctxt_switches`.
    pub involuntary: u64,
    /// Allowed CPUs (`Cpus_allowed_list`).
    pub cpus_allowed: String,
    /// The thread's slice (`se.slice`, ns) when the kernel shows it.
    pub slice_ns: Option<u64>,
}

/// Parse `/proc/<pid>/task/<tid>/sched` and `status` texts.
pub fn parse_thread(pid: u32, tid: u32, sched: &str, status: &str) -> ThreadSched {
    let field = |text: &str, key: &str, sep: char| -> Option<String> {
        text.lines().find_map(|l| {
            let (k, value) = l.split_once(sep)?;
            (k.trim() == key).then(|| value.trim().to_string())
        })
    };
    let num = |value: Option<String>| value.and_then(|s| s.split('.').next()?.trim().parse().ok());
    ThreadSched {
        pid,
        tid,
        name: field(status, "Name", ':').unwrap_or_default(),
        migrations: num(field(sched, "se.nr_migrations", ':')).unwrap_or(0),
        voluntary: num(field(status, "voluntary_ctxt_switches", ':')).unwrap_or(0),
        involuntary: num(field(status, "nonvoluntary_ctxt_switches", ':')).unwrap_or(0),
        cpus_allowed: field(status, "Cpus_allowed_list", ':').unwrap_or_default(),
        slice_ns: num(field(sched, "se.slice", ':')),
    }
}

/// Every thread of `pid` and of its descendants.
pub fn tree_threads(pid: u32) -> Vec<ThreadSched> {
    let mut pids = vec![pid];
    let mut next = 0;
    while next < pids.len() && pids.len() < 4096 {
        let parent = pids[next];
        next += 1;
        let Ok(dir) = std::fs::read_dir("/proc") else {
            break;
        };
        for e in dir.flatten() {
            let Some(child) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
                continue;
            };
            let Ok(stat) = std::fs::read_to_string(format!("/proc/{child}/stat")) else {
                continue;
            };
            let ppid = stat
                .rfind(')')
                .and_then(|next| stat[next + 1..].split_whitespace().nth(1))
                .and_then(|s| s.parse::<u32>().ok());
            if ppid == Some(parent) && !pids.contains(&child) {
                pids.push(child);
            }
        }
    }
    let mut out = Vec::new();
    for parent in pids {
        let Ok(dir) = std::fs::read_dir(format!("/proc/{parent}/task")) else {
            continue;
        };
        for e in dir.flatten() {
            let Some(tid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
                continue;
            };
            let sched = std::fs::read_to_string(format!("/proc/{parent}/task/{tid}/sched"))
                .unwrap_or_default();
            let status = std::fs::read_to_string(format!("/proc/{parent}/task/{tid}/status"))
                .unwrap_or_default();
            if !status.is_empty() {
                out.push(parse_thread(parent, tid, &sched, &status));
            }
        }
    }
    out.sort_by_key(|tid| tid.tid);
    out
}

/// Growth of each thread's counters from `before` to `after` (threads that
/// appeared meanwhile count from zero).
pub fn since(after: &[ThreadSched], before: &[ThreadSched]) -> Vec<ThreadSched> {
    after
        .iter()
        .map(|a| {
            let prior = before.iter().find(|prior| prior.tid == a.tid);
            let delta = |f: fn(&ThreadSched) -> u64| f(a).saturating_sub(prior.map_or(0, f));
            ThreadSched {
                migrations: delta(|t| t.migrations),
                voluntary: delta(|t| t.voluntary),
                involuntary: delta(|t| t.involuntary),
                ..a.clone()
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topology_counts_sockets_cores_and_smt() {
        // Paper B's machine: two quad-core packages, 6 CPUs used over both.
        let t = topology_of(
            &[0, 1, 2, 3, 4, 5],
            &[(0, 0), (0, 1), (0, 2), (0, 3), (1, 0), (1, 1)],
        );
        assert_eq!((t.sockets, t.cores, t.smt), (2, 6, 1));
        // Two SMT siblings of one core.
        let t = topology_of(&[0, 4], &[(0, 0), (0, 0)]);
        assert_eq!((t.sockets, t.cores, t.smt), (1, 1, 2));
        let live = detect(&[0]);
        assert_eq!(live.cores, 1);
    }

    #[test]
    fn cpu_lists_round_trip() {
        assert_eq!(parse_cpu_list("0-2,5").unwrap(), vec![0, 1, 2, 5]);
        assert_eq!(cpu_list_text(&[0, 1, 2, 5]), "0-2,5");
        assert!(parse_cpu_list("3-1").is_err());
        assert!(parse_cpu_list("x").is_err());
        assert!(parse_cpu_list("").is_err());
    }

    #[test]
    fn thread_stats_parse_and_difference() {
        let sched = "sip-w0 (1234, #threads: 3)\n---------\nse.exec_start : 1.5\nse.nr_migrations                             :                   17\nse.slice : 100000\nnr_switches : 40\n";
        let status = "Name:\tsip-w0\nCpus_allowed_list:\t0\nvoluntary_ctxt_switches:\t30\nnonvoluntary_ctxt_switches:\t10\n";
        let t = parse_thread(1, 1234, sched, status);
        assert_eq!((t.migrations, t.voluntary, t.involuntary), (17, 30, 10));
        assert_eq!(t.cpus_allowed, "0");
        assert_eq!(t.slice_ns, Some(100_000));
        let mut later = t.clone();
        later.migrations = 20;
        later.voluntary = 35;
        let d = since(&[later], &[t]);
        assert_eq!(
            (d[0].migrations, d[0].voluntary, d[0].involuntary),
            (3, 5, 0)
        );
        // This process's own threads are found.
        let me = tree_threads(std::process::id());
        assert!(!me.is_empty());
    }
}
