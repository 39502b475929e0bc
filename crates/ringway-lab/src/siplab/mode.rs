//! Scheduler modes as data: the papers' `default`, `baseline` and
//! `enhanced` modes (bench/siplab/modes/*.toml, built in) and mode files a
//! user writes in the same TOML form. A mode holds the papers' knobs (CFS
//! names, values in ns) and the knobs of today's kernels (per-thread slice,
//! policy, nice, affinity model, sched features), with rules that override
//! them per core count and thread count. [`Mode::resolve`] gives the knobs
//! of one (cores, threads) point; [`super::kernel`] maps them to this kernel.

use serde::{Deserialize, Serialize};
use std::path::Path;

/// Built-in mode names, as `--profiles` takes them.
pub const BUILTIN: &[&str] = &["default", "baseline", "enhanced"];

const DEFAULT_TOML: &str = include_str!("../../../../bench/siplab/modes/default.toml");
const BASELINE_TOML: &str = include_str!("../../../../bench/siplab/modes/baseline.toml");
const ENHANCED_TOML: &str = include_str!("../../../../bench/siplab/modes/enhanced.toml");

/// Scheduler knobs; `None` leaves a knob as the kernel has it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Knobs {
    /// CFS `sched_latency_ns` (papers).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latency_ns: Option<u64>,
    /// `sched_latency_ns` = this × core count (paper B's 800 µs × ncpus).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latency_per_core_ns: Option<u64>,
    /// CFS `sched_min_granularity_ns` (papers).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_granularity_ns: Option<u64>,
    /// CFS `sched_wakeup_granularity_ns` (papers).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wakeup_granularity_ns: Option<u64>,
    /// `sched_migration_cost_ns` (paper B).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub migration_cost_ns: Option<u64>,
    /// `sched_tunable_scaling`: `none`, `log` or `linear` (paper B).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tunable_scaling: Option<String>,
    /// EEVDF `base_slice_ns` (debugfs, global).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base_slice_ns: Option<u64>,
    /// Scheduler features to set, e.g. `NO_RUN_TO_PARITY`, `PREEMPT_SHORT`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub features: Option<Vec<String>>,
    /// Per-thread EEVDF slice request (µs; sched_setattr, 100..=100000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slice_us: Option<u64>,
    /// Per-thread policy: `other`, `batch`, `fifo`, `rr`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<String>,
    /// Real-time priority (fifo/rr), 1..=99.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<i32>,
    /// Nice value, -20..=19.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nice: Option<i32>,
    /// Affinity model: `process` (one CPU set for the whole proxy, the
    /// scheduler balances and migrates inside it; the default) or `thread`
    /// (each worker pinned to one CPU of the set, round robin).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub affinity: Option<String>,
}

impl Knobs {
    /// `self` with every knob `over` sets replaced.
    pub fn overlay(&self, over: &Knobs) -> Knobs {
        fn pick<T: Clone>(a: &Option<T>, b: &Option<T>) -> Option<T> {
            b.clone().or_else(|| a.clone())
        }
        Knobs {
            latency_ns: pick(&self.latency_ns, &over.latency_ns),
            latency_per_core_ns: pick(&self.latency_per_core_ns, &over.latency_per_core_ns),
            min_granularity_ns: pick(&self.min_granularity_ns, &over.min_granularity_ns),
            wakeup_granularity_ns: pick(&self.wakeup_granularity_ns, &over.wakeup_granularity_ns),
            migration_cost_ns: pick(&self.migration_cost_ns, &over.migration_cost_ns),
            tunable_scaling: pick(&self.tunable_scaling, &over.tunable_scaling),
            base_slice_ns: pick(&self.base_slice_ns, &over.base_slice_ns),
            features: pick(&self.features, &over.features),
            slice_us: pick(&self.slice_us, &over.slice_us),
            policy: pick(&self.policy, &over.policy),
            priority: pick(&self.priority, &over.priority),
            nice: pick(&self.nice, &over.nice),
            affinity: pick(&self.affinity, &over.affinity),
        }
    }

    /// True when no knob is set.
    pub fn is_empty(&self) -> bool {
        *self == Knobs::default()
    }

    /// One-line text (`key=value` pairs, TOML names), `-` when empty.
    pub fn describe(&self) -> String {
        let value = serde_json::to_value(self).unwrap_or_default();
        let parts: Vec<String> = value
            .as_object()
            .map(|m| {
                m.iter()
                    .map(|(k, value)| match value {
                        serde_json::Value::String(s) => format!("{k}={s}"),
                        other => format!("{k}={other}"),
                    })
                    .collect()
            })
            .unwrap_or_default();
        if parts.is_empty() {
            "-".into()
        } else {
            parts.join(" ")
        }
    }

    /// Check every value's range; the error names the knob.
    pub fn validate(&self) -> Result<(), String> {
        if let Some(scaling) = &self.tunable_scaling {
            if !["none", "log", "linear"].contains(&scaling.as_str()) {
                return Err(format!(
                    "tunable_scaling = {scaling:?}: expected \"none\", \"log\" or \"linear\""
                ));
            }
        }
        if let Some(policy) = &self.policy {
            if !["other", "batch", "fifo", "rr"].contains(&policy.as_str()) {
                return Err(format!(
                    "policy = {policy:?}: expected \"other\", \"batch\", \"fifo\" or \"rr\""
                ));
            }
        }
        let realtime = matches!(self.policy.as_deref(), Some("fifo" | "rr"));
        match (realtime, self.priority) {
            (true, Some(policy)) if !(1..=99).contains(&policy) => {
                return Err(format!("priority = {policy}: expected 1..=99"))
            }
            (false, Some(_)) => {
                return Err("priority is only for policy = \"fifo\" or \"rr\"".into())
            }
            _ => {}
        }
        if let Some(nice) = self.nice {
            if !(-20..=19).contains(&nice) {
                return Err(format!("nice = {nice}: expected -20..=19"));
            }
        }
        if let Some(scaling) = self.slice_us {
            if !(100..=100_000).contains(&scaling) {
                return Err(format!(
                    "slice_us = {scaling}: EEVDF slices are 100..=100000 µs"
                ));
            }
            if realtime {
                return Err("slice_us applies to fair-class threads, not fifo/rr".into());
            }
        }
        if let Some(affinity) = &self.affinity {
            if !["process", "thread"].contains(&affinity.as_str()) {
                return Err(format!(
                    "affinity = {affinity:?}: expected \"process\" or \"thread\""
                ));
            }
        }
        for f in self.features.iter().flatten() {
            if f.is_empty() || !f.chars().all(|c| c.is_ascii_uppercase() || c == '_') {
                return Err(format!(
                    "feature {f:?}: expected an upper-case sched feature name such as NO_RUN_TO_PARITY"
                ));
            }
        }
        for (name, v, max) in [
            ("latency_ns", self.latency_ns, 1_000_000_000),
            (
                "latency_per_core_ns",
                self.latency_per_core_ns,
                1_000_000_000,
            ),
            ("min_granularity_ns", self.min_granularity_ns, 1_000_000_000),
            (
                "wakeup_granularity_ns",
                self.wakeup_granularity_ns,
                1_000_000_000,
            ),
            ("migration_cost_ns", self.migration_cost_ns, 1_000_000_000),
            ("base_slice_ns", self.base_slice_ns, 1_000_000_000),
        ] {
            if v.is_some_and(|v| v > max) {
                return Err(format!("{name} = {}: at most 1 s", v.unwrap_or(0)));
            }
        }
        Ok(())
    }
}

/// Knobs that apply only at some core and thread counts (all given bounds
/// must hold; later rules override earlier ones).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rule {
    /// Smallest core count the rule applies to.
    #[serde(default)]
    pub cores_min: Option<usize>,
    /// Largest core count.
    #[serde(default)]
    pub cores_max: Option<usize>,
    /// Smallest thread (worker) count.
    #[serde(default)]
    pub threads_min: Option<usize>,
    /// Largest thread count.
    #[serde(default)]
    pub threads_max: Option<usize>,
    /// The knobs.
    #[serde(default)]
    pub knobs: Knobs,
}

impl Rule {
    fn matches(&self, cores: usize, threads: usize) -> bool {
        self.cores_min.is_none_or(|m| cores >= m)
            && self.cores_max.is_none_or(|m| cores <= m)
            && self.threads_min.is_none_or(|m| threads >= m)
            && self.threads_max.is_none_or(|m| threads <= m)
    }
}

/// A scheduler mode: knobs for all points plus per (cores, threads) rules.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Mode {
    /// Name in reports (`--profiles` takes it for built-in modes).
    pub name: String,
    /// What the mode is.
    #[serde(default)]
    pub description: String,
    /// Knobs for every point.
    #[serde(default)]
    pub knobs: Knobs,
    /// Overrides per core and thread count, in order.
    #[serde(default, rename = "rule")]
    pub rules: Vec<Rule>,
}

impl Mode {
    /// Parse a mode from TOML text; `origin` names it in errors.
    pub fn from_toml(text: &str, origin: &str) -> Result<Mode, String> {
        let mode: Mode = toml::from_str(text).map_err(|e| {
            format!(
                "mode file {origin}: {}",
                e.to_string().trim_end().replace('\n', " ")
            )
        })?;
        if mode.name.is_empty()
            || !mode
                .name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
        {
            return Err(format!(
                "mode file {origin}: name {:?} must be non-empty letters, digits, '-', '_' or '.'",
                mode.name
            ));
        }
        mode.knobs
            .validate()
            .map_err(|e| format!("mode file {origin}: [knobs] {e}"))?;
        for (i, r) in mode.rules.iter().enumerate() {
            r.knobs
                .validate()
                .map_err(|e| format!("mode file {origin}: rule {}: {e}", i + 1))?;
            if let (Some(min), Some(max)) = (r.cores_min, r.cores_max) {
                if min > max {
                    return Err(format!(
                        "mode file {origin}: rule {}: cores_min {min} > cores_max {max}",
                        i + 1
                    ));
                }
            }
            if let (Some(min), Some(max)) = (r.threads_min, r.threads_max) {
                if min > max {
                    return Err(format!(
                        "mode file {origin}: rule {}: threads_min {min} > threads_max {max}",
                        i + 1
                    ));
                }
            }
        }
        Ok(mode)
    }

    /// TOML text of this mode (what `lab sip tune` writes as `tuned.toml`).
    pub fn to_toml(&self) -> String {
        toml::to_string(self).unwrap_or_default()
    }

    /// The knobs of one point: `knobs`, then every matching rule in order;
    /// `latency_per_core_ns` becomes `latency_ns` = it × `cores`.
    pub fn resolve(&self, cores: usize, threads: usize) -> Knobs {
        let mut knobs = self.knobs.clone();
        for r in self.rules.iter().filter(|r| r.matches(cores, threads)) {
            knobs = knobs.overlay(&r.knobs);
        }
        if let Some(per) = knobs.latency_per_core_ns.take() {
            knobs.latency_ns = Some(per * cores as u64);
        }
        knobs
    }
}

/// A built-in mode, a mode file (a name ending in `.toml`), or one of the
/// older per-thread profile names (`fifo`, `rr`, `slice-300us`, `nice-10`,
/// ...; see [`crate::sched::profile`]).
pub fn mode_by_name(name: &str) -> Result<Mode, String> {
    let text = match name {
        "default" => DEFAULT_TOML,
        "baseline" => BASELINE_TOML,
        "enhanced" => ENHANCED_TOML,
        _ if name.ends_with(".toml") => {
            let mode_text = std::fs::read_to_string(Path::new(name))
                .map_err(|e| format!("mode file {name}: {e}"))?;
            return Mode::from_toml(&mode_text, name);
        }
        _ => {
            let sched_profile = crate::sched::profile(name).map_err(|e| {
                format!(
                    "{e}; scheduler modes: {} or a mode file NAME.toml",
                    BUILTIN.join(", ")
                )
            })?;
            return Ok(Mode {
                name: name.to_string(),
                description: "per-thread profile".into(),
                knobs: Knobs {
                    policy: sched_profile.policy,
                    priority: sched_profile.priority,
                    nice: sched_profile.nice,
                    slice_us: sched_profile.slice_us,
                    ..Knobs::default()
                },
                rules: Vec::new(),
            });
        }
    };
    Mode::from_toml(text, &format!("(built-in {name})"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtin_modes_carry_the_papers_values_per_threads_and_cores() {
        let base = mode_by_name("baseline").unwrap();
        let k = base.resolve(1, 4);
        assert_eq!(k.latency_ns, Some(1_000_000));
        assert_eq!(k.min_granularity_ns, Some(100_000));
        assert_eq!(k.wakeup_granularity_ns, Some(25_000));
        assert_eq!(k.migration_cost_ns, None, "paper A has no migration cost");
        let k = base.resolve(4, 4);
        assert_eq!(k.migration_cost_ns, Some(5_000_000));
        assert_eq!(k.tunable_scaling.as_deref(), Some("log"));

        let enh = mode_by_name("enhanced").unwrap();
        // Paper A: 2/4/6/8/16 threads -> 100/150/200/250/400 µs, latency 800 µs.
        for (t, g) in [(1, 100), (2, 100), (4, 150), (6, 200), (8, 250), (16, 400)] {
            let k = enh.resolve(1, t);
            assert_eq!(k.min_granularity_ns, Some(g * 1000), "1 core, {t} threads");
            assert_eq!(k.latency_ns, Some(800_000));
            assert_eq!(k.wakeup_granularity_ns, Some(0));
            assert_eq!(k.migration_cost_ns, None);
        }
        // Paper B, 2 cores: 100 µs up to 6 threads, 150 at 8, 200 at 16.
        for (t, g) in [(2, 100), (4, 100), (6, 100), (8, 150), (16, 200)] {
            assert_eq!(
                enh.resolve(2, t).min_granularity_ns,
                Some(g * 1000),
                "2 cores {t}"
            );
        }
        // 4 and 6 cores: 100 µs up to 8 threads, 200 at 16.
        for c in [4, 6] {
            for (t, g) in [(2, 100), (8, 100), (16, 200)] {
                assert_eq!(
                    enh.resolve(c, t).min_granularity_ns,
                    Some(g * 1000),
                    "{c} cores {t}"
                );
            }
        }
        assert_eq!(enh.resolve(2, 4).latency_ns, Some(1_600_000));
        assert_eq!(enh.resolve(6, 4).latency_ns, Some(4_800_000));
        assert_eq!(enh.resolve(2, 4).migration_cost_ns, Some(0));
        assert_eq!(enh.resolve(4, 4).migration_cost_ns, Some(0));
        assert_eq!(enh.resolve(6, 8).migration_cost_ns, Some(500_000));
        assert_eq!(enh.resolve(6, 8).tunable_scaling.as_deref(), Some("none"));
        assert!(mode_by_name("default").unwrap().resolve(1, 2).is_empty());
    }

    #[test]
    fn mode_files_parse_and_unknown_keys_are_clear_errors() {
        let m = Mode::from_toml(
            "name = \"mine\"\n[knobs]\nslice_us = 300\nnice = -5\n[[rule]]\nthreads_min = 8\n[rule.knobs]\nslice_us = 1000\n",
            "mine.toml",
        )
        .unwrap();
        assert_eq!(m.resolve(1, 2).slice_us, Some(300));
        assert_eq!(m.resolve(1, 8).slice_us, Some(1000));
        assert_eq!(m.resolve(1, 8).nice, Some(-5));
        // Round trip through the TOML the tuner writes.
        assert_eq!(Mode::from_toml(&m.to_toml(), "rt").unwrap(), m);

        let e =
            Mode::from_toml("name = \"x\"\n[knobs]\nsched_latency = 5\n", "x.toml").unwrap_err();
        assert!(e.contains("x.toml") && e.contains("sched_latency"), "{e}");
        let e = Mode::from_toml("name = \"x\"\ncolour = 1\n", "x.toml").unwrap_err();
        assert!(e.contains("colour"), "{e}");
        let e = Mode::from_toml("name = \"x\"\n[[rule]]\ncores = 2\n", "x.toml").unwrap_err();
        assert!(e.contains("cores"), "{e}");
        let e = Mode::from_toml("name = \"x\"\n[knobs]\nslice_us = 5\n", "x.toml").unwrap_err();
        assert!(e.contains("slice_us"), "{e}");
        let e = Mode::from_toml(
            "name = \"x\"\n[knobs]\ntunable_scaling = \"cubic\"\n",
            "x.toml",
        )
        .unwrap_err();
        assert!(e.contains("tunable_scaling"), "{e}");
        assert!(Mode::from_toml("[knobs]\n", "x.toml")
            .unwrap_err()
            .contains("name"));
        assert!(mode_by_name("turbo").unwrap_err().contains("baseline"));
        assert_eq!(
            mode_by_name("slice-300us").unwrap().knobs.slice_us,
            Some(300)
        );
        assert!(mode_by_name("/nonexistent/m.toml")
            .unwrap_err()
            .contains("/nonexistent/m.toml"));
    }
}
