//! The papers' CFS knobs mapped to the running kernel's generation (pure
//! functions: the kernel version and the set of writable files are inputs).
//!
//! | generation | where the knobs are |
//! |---|---|
//! | before 5.13 | sysctls `/proc/sys/kernel/sched_*` |
//! | 5.13 – 6.5 | debugfs `/sys/kernel/debug/sched/*` (CFS names) |
//! | 6.6 and later | EEVDF: no latency or wakeup granularity; `base_slice_ns`, `migration_cost_ns`, `tunable_scaling`, `features` in debugfs; per-thread slice by `sched_setattr` from 6.12 |
//!
//! A knob that is gone or not writable becomes a refusal with its reason;
//! nothing is skipped silently.

use super::mode::Knobs;
use crate::sched::{Knob, Profile};
use serde::{Deserialize, Serialize};

/// Kernel version (major, minor).
#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct KernelVersion {
    /// Major.
    pub major: u32,
    /// Minor.
    pub minor: u32,
}

/// Where the scheduler knobs live.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Generation {
    /// CFS, knobs as sysctls (before 5.13).
    Sysctl,
    /// CFS, knobs in debugfs (5.13 – 6.5).
    DebugfsCfs,
    /// EEVDF (6.6 and later).
    Eevdf,
}

impl KernelVersion {
    /// Parse `uname -r` text such as `6.18.44-fc-v669`.
    pub fn parse(release: &str) -> Option<KernelVersion> {
        let mut parts = release.split(|c: char| !c.is_ascii_digit());
        let major = parts.next()?.parse().ok()?;
        let minor = parts.next()?.parse().ok()?;
        Some(KernelVersion { major, minor })
    }

    /// The running kernel (from /proc/sys/kernel/osrelease).
    pub fn running() -> Option<KernelVersion> {
        KernelVersion::parse(
            std::fs::read_to_string("/proc/sys/kernel/osrelease")
                .ok()?
                .trim(),
        )
    }

    /// Which generation of knobs this kernel has.
    pub fn generation(self) -> Generation {
        if self
            < (KernelVersion {
                major: 5,
                minor: 13,
            })
        {
            Generation::Sysctl
        } else if self < (KernelVersion { major: 6, minor: 6 }) {
            Generation::DebugfsCfs
        } else {
            Generation::Eevdf
        }
    }

    /// Whether a fair-class thread can ask for its own slice (6.12+).
    pub fn per_thread_slice(self) -> bool {
        self >= KernelVersion {
            major: 6,
            minor: 12,
        }
    }
}

impl std::fmt::Display for KernelVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

/// What one mode's knobs become on one kernel.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Plan {
    /// Global files to write (recorded and restored through the state file).
    pub globals: Vec<Knob>,
    /// Per-thread settings for the proxy's threads.
    pub thread: Profile,
    /// Pin each worker to one CPU of the set (instead of a process-wide set).
    pub pin_threads: bool,
    /// How each knob was mapped (`knob = value -> where`).
    pub mapped: Vec<String>,
    /// Knobs that are gone or not writable, with the reason.
    pub refused: Vec<String>,
}

impl Plan {
    /// Canonical text of what would actually be applied: two modes with the
    /// same text apply the same settings on this kernel.
    pub fn effective(&self) -> String {
        let mut groups: Vec<String> = self
            .globals
            .iter()
            .map(|k| format!("{}={}", k.path, k.value))
            .collect();
        groups.sort();
        let thread_args = self.thread.proxy_args().join(" ");
        format!(
            "globals[{}] threads[{}] affinity[{}]",
            groups.join(" "),
            thread_args,
            if self.pin_threads {
                "thread"
            } else {
                "process"
            }
        )
    }
}

const DEBUGFS: &str = "/sys/kernel/debug/sched";
const SYSCTL: &str = "/proc/sys/kernel";

/// The plan being built for one kernel.
struct Mapper<'w> {
    plan: Plan,
    kernel: KernelVersion,
    generation: Generation,
    writable: &'w dyn Fn(&str) -> Result<(), String>,
    /// The per-thread slice asked for: (the knob that asked, µs).
    slice_wanted: Option<(String, u64)>,
}

impl Mapper<'_> {
    /// A global setting: planned when the lab can write `path`, else refused with why.
    fn global(&mut self, knob: &str, value: String, path: String) {
        match (self.writable)(&path) {
            Ok(()) => {
                self.plan.mapped.push(format!("{knob} = {value} -> {path}"));
                self.plan.globals.push(Knob { path, value });
            }
            Err(why) => self
                .plan
                .refused
                .push(format!("{knob} = {value}: {path} not writable: {why}")),
        }
    }

    /// Where a CFS knob lives: a sysctl before 5.13, debugfs after.
    fn cfs_path(&self, sysctl: &str, debugfs: &str) -> String {
        match self.generation {
            Generation::Sysctl => format!("{SYSCTL}/{sysctl}"),
            _ => format!("{DEBUGFS}/{debugfs}"),
        }
    }

    fn latency(&mut self, ns: u64) {
        match self.generation {
            Generation::Eevdf => self.plan.refused.push(format!(
                "latency_ns = {ns}: gone under EEVDF (kernel {}, 6.6+): there is no scheduling period",
                self.kernel
            )),
            _ => {
                let path = self.cfs_path("sched_latency_ns", "latency_ns");
                self.global("latency_ns", ns.to_string(), path);
            }
        }
    }

    fn min_granularity(&mut self, ns: u64) {
        match self.generation {
            Generation::Eevdf => {
                // The nearest knobs: the global base slice, and the proxy
                // threads' own slice request.
                self.global(
                    "min_granularity_ns",
                    ns.to_string(),
                    format!("{DEBUGFS}/base_slice_ns"),
                );
                self.slice_wanted = Some(("min_granularity_ns".into(), ns.div_ceil(1000)));
            }
            _ => {
                let path = self.cfs_path("sched_min_granularity_ns", "min_granularity_ns");
                self.global("min_granularity_ns", ns.to_string(), path);
            }
        }
    }

    fn wakeup_granularity(&mut self, ns: u64) {
        match self.generation {
            Generation::Eevdf => {
                // Gone; the nearest lever is whether a waking task may
                // preempt before the current one used its slice.
                let feature = if ns == 0 {
                    "NO_RUN_TO_PARITY"
                } else {
                    "RUN_TO_PARITY"
                };
                self.plan.mapped.push(format!(
                    "wakeup_granularity_ns = {ns}: gone under EEVDF (kernel {}); nearest: sched feature {feature}",
                    self.kernel
                ));
                self.global(
                    "wakeup_granularity_ns (as feature)",
                    feature.to_string(),
                    format!("{DEBUGFS}/features"),
                );
            }
            _ => {
                let path = self.cfs_path("sched_wakeup_granularity_ns", "wakeup_granularity_ns");
                self.global("wakeup_granularity_ns", ns.to_string(), path);
            }
        }
    }

    fn tunable_scaling(&mut self, scaling: &str) {
        let number = match scaling {
            "none" => "0",
            "log" => "1",
            _ => "2",
        };
        let path = self.cfs_path("sched_tunable_scaling", "tunable_scaling");
        self.global("tunable_scaling", format!("{number} ({scaling})"), path);
        // The file takes the number alone; the name is for the reader.
        if let Some(last) = self.plan.globals.last_mut() {
            if last.path.ends_with("tunable_scaling") {
                last.value = number.to_string();
            }
        }
    }

    fn base_slice(&mut self, ns: u64) {
        match self.generation {
            Generation::Eevdf => self.global(
                "base_slice_ns",
                ns.to_string(),
                format!("{DEBUGFS}/base_slice_ns"),
            ),
            _ => self.plan.refused.push(format!(
                "base_slice_ns = {ns}: EEVDF only (kernel {}); use min_granularity_ns",
                self.kernel
            )),
        }
    }

    fn feature(&mut self, feature: &str) {
        match self.generation {
            Generation::Sysctl => self.plan.refused.push(format!(
                "feature {feature}: sched features are in debugfs from 5.13 (kernel {})",
                self.kernel
            )),
            _ => self.global(
                "feature",
                feature.to_string(),
                format!("{DEBUGFS}/features"),
            ),
        }
    }

    /// The per-thread slice (sched_setattr, 6.12+), never for real-time
    /// threads, clamped to 100 µs..100 ms.
    fn thread_slice(&mut self, knob: &str, us: u64, policy: Option<&str>) {
        if !self.kernel.per_thread_slice() {
            self.plan.refused.push(format!(
                "{knob}: per-thread slice needs kernel 6.12+ (kernel {})",
                self.kernel
            ));
        } else if matches!(policy, Some("fifo" | "rr")) {
            self.plan.refused.push(format!(
                "{knob}: no slice for real-time threads (policy {:?})",
                policy
            ));
        } else {
            let clamped = us.clamp(100, 100_000);
            self.plan.mapped.push(format!(
                "{knob} -> per-thread slice {clamped} µs (sched_setattr{})",
                if clamped != us {
                    format!(", clamped from {us} µs")
                } else {
                    String::new()
                }
            ));
            self.plan.thread.slice_us = Some(clamped);
            if self.plan.thread.policy.is_none() {
                self.plan.thread.policy = Some("other".into());
            }
        }
    }
}

/// Map `k` to kernel `v`; `writable(path)` says whether the lab can write a
/// file (Err: why not; see `ringway_io::doctor::sched_knob_access`).
pub fn map_knobs(
    k: &Knobs,
    v: KernelVersion,
    writable: &dyn Fn(&str) -> Result<(), String>,
) -> Plan {
    let mut mapper = Mapper {
        plan: Plan {
            thread: Profile {
                name: String::new(),
                policy: k.policy.clone(),
                priority: k.priority,
                nice: k.nice,
                slice_us: None,
            },
            pin_threads: k.affinity.as_deref() == Some("thread"),
            ..Plan::default()
        },
        kernel: v,
        generation: v.generation(),
        writable,
        slice_wanted: None,
    };
    if let Some(latency_ns) = k.latency_ns {
        mapper.latency(latency_ns);
    }
    if let Some(latency_ns) = k.min_granularity_ns {
        mapper.min_granularity(latency_ns);
    }
    if let Some(latency_ns) = k.wakeup_granularity_ns {
        mapper.wakeup_granularity(latency_ns);
    }
    if let Some(latency_ns) = k.migration_cost_ns {
        let path = mapper.cfs_path("sched_migration_cost_ns", "migration_cost_ns");
        mapper.global("migration_cost_ns", latency_ns.to_string(), path);
    }
    if let Some(scaling) = &k.tunable_scaling {
        mapper.tunable_scaling(scaling);
    }
    if let Some(latency_ns) = k.base_slice_ns {
        mapper.base_slice(latency_ns);
    }
    for feature in k.features.iter().flatten() {
        mapper.feature(feature);
    }
    if let Some(slice) = k.slice_us {
        mapper.slice_wanted = Some(("slice_us".into(), slice));
    }
    if let Some((knob, slice)) = mapper.slice_wanted.take() {
        mapper.thread_slice(&knob, slice, k.policy.as_deref());
    }
    let mut plan = mapper.plan;
    if plan.pin_threads {
        plan.mapped
            .push("affinity = thread -> each worker pinned to one CPU of the set".into());
    }
    plan
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::siplab::mode::mode_by_name;

    fn v(major: u32, minor: u32) -> KernelVersion {
        KernelVersion { major, minor }
    }
    fn all_writable(_: &str) -> Result<(), String> {
        Ok(())
    }
    fn locked(p: &str) -> Result<(), String> {
        if p.starts_with("/sys/kernel/debug") {
            Err("refused by the kernel (lockdown)".into())
        } else {
            Ok(())
        }
    }
    fn paths(p: &Plan) -> Vec<(&str, &str)> {
        p.globals
            .iter()
            .map(|k| (k.path.as_str(), k.value.as_str()))
            .collect()
    }

    #[test]
    fn versions_and_generations() {
        assert_eq!(KernelVersion::parse("6.18.44-fc-v669"), Some(v(6, 18)));
        assert_eq!(KernelVersion::parse("5.4.0-150-generic"), Some(v(5, 4)));
        assert_eq!(KernelVersion::parse("x"), None);
        assert_eq!(v(2, 6).generation(), Generation::Sysctl);
        assert_eq!(v(5, 12).generation(), Generation::Sysctl);
        assert_eq!(v(5, 13).generation(), Generation::DebugfsCfs);
        assert_eq!(v(6, 5).generation(), Generation::DebugfsCfs);
        assert_eq!(v(6, 6).generation(), Generation::Eevdf);
        assert!(!v(6, 11).per_thread_slice() && v(6, 12).per_thread_slice());
    }

    #[test]
    fn baseline_per_generation() {
        let k = mode_by_name("baseline").unwrap().resolve(2, 4);
        let p = map_knobs(&k, v(3, 2), &all_writable);
        assert_eq!(
            paths(&p),
            vec![
                ("/proc/sys/kernel/sched_latency_ns", "1000000"),
                ("/proc/sys/kernel/sched_min_granularity_ns", "100000"),
                ("/proc/sys/kernel/sched_wakeup_granularity_ns", "25000"),
                ("/proc/sys/kernel/sched_migration_cost_ns", "5000000"),
                ("/proc/sys/kernel/sched_tunable_scaling", "1"),
            ]
        );
        assert!(p.refused.is_empty() && p.thread.slice_us.is_none());
        let p = map_knobs(&k, v(6, 1), &all_writable);
        assert_eq!(p.globals[0].path, "/sys/kernel/debug/sched/latency_ns");
        assert_eq!(p.globals.len(), 5);
        // EEVDF, debugfs writable: latency gone, min_granularity -> base
        // slice and per-thread slice, wakeup -> RUN_TO_PARITY feature.
        let p = map_knobs(&k, v(6, 18), &all_writable);
        assert_eq!(
            paths(&p),
            vec![
                ("/sys/kernel/debug/sched/base_slice_ns", "100000"),
                ("/sys/kernel/debug/sched/features", "RUN_TO_PARITY"),
                ("/sys/kernel/debug/sched/migration_cost_ns", "5000000"),
                ("/sys/kernel/debug/sched/tunable_scaling", "1"),
            ]
        );
        assert_eq!(p.thread.slice_us, Some(100));
        assert_eq!(p.refused.len(), 1);
        assert!(p.refused[0].contains("latency_ns") && p.refused[0].contains("EEVDF"));
        // Enhanced's wakeup granularity 0 is the opposite feature.
        let e = mode_by_name("enhanced").unwrap().resolve(2, 4);
        let p = map_knobs(&e, v(6, 18), &all_writable);
        assert!(paths(&p).contains(&("/sys/kernel/debug/sched/features", "NO_RUN_TO_PARITY")));
        assert!(paths(&p).contains(&("/sys/kernel/debug/sched/migration_cost_ns", "0")));
        assert!(paths(&p).contains(&("/sys/kernel/debug/sched/tunable_scaling", "0")));
        // 6.8: EEVDF but no per-thread slice yet.
        let p = map_knobs(&k, v(6, 8), &all_writable);
        assert!(p.thread.slice_us.is_none());
        assert!(p.refused.iter().any(|r| r.contains("6.12")));
    }

    #[test]
    fn locked_debugfs_leaves_only_the_thread_slice_and_says_why() {
        let base = map_knobs(
            &mode_by_name("baseline").unwrap().resolve(1, 2),
            v(6, 18),
            &locked,
        );
        let enh = map_knobs(
            &mode_by_name("enhanced").unwrap().resolve(1, 2),
            v(6, 18),
            &locked,
        );
        assert!(base.globals.is_empty() && enh.globals.is_empty());
        assert!(base
            .refused
            .iter()
            .all(|r| r.contains("lockdown") || r.contains("EEVDF")));
        assert_eq!(base.refused.len(), 3, "{:?}", base.refused);
        // At 2 threads both ask for 100 µs: the same settings on this kernel.
        assert_eq!(base.effective(), enh.effective());
        // At 4 threads enhanced asks for 150 µs: they differ only there.
        let enh4 = map_knobs(
            &mode_by_name("enhanced").unwrap().resolve(1, 4),
            v(6, 18),
            &locked,
        );
        let base4 = map_knobs(
            &mode_by_name("baseline").unwrap().resolve(1, 4),
            v(6, 18),
            &locked,
        );
        assert_ne!(base4.effective(), enh4.effective());
        assert_eq!(enh4.thread.slice_us, Some(150));
        // The default mode applies nothing anywhere.
        let d = map_knobs(&Knobs::default(), v(6, 18), &all_writable);
        assert!(d.globals.is_empty() && d.refused.is_empty() && d.thread.proxy_args().is_empty());
    }

    #[test]
    fn slices_are_clamped_and_refused_for_real_time_threads() {
        let k = Knobs {
            min_granularity_ns: Some(50_000),
            ..Knobs::default()
        };
        let p = map_knobs(&k, v(6, 18), &locked);
        assert_eq!(p.thread.slice_us, Some(100));
        assert!(p.mapped.iter().any(|m| m.contains("clamped from 50")));
        let k = Knobs {
            slice_us: Some(300),
            policy: Some("fifo".into()),
            priority: Some(5),
            ..Knobs::default()
        };
        let p = map_knobs(&k, v(6, 18), &locked);
        assert!(p.thread.slice_us.is_none());
        assert!(p.refused.iter().any(|r| r.contains("real-time")));
        let k = Knobs {
            features: Some(vec!["NO_RUN_TO_PARITY".into()]),
            ..Knobs::default()
        };
        assert!(map_knobs(&k, v(4, 19), &all_writable).refused[0].contains("5.13"));
    }
}
