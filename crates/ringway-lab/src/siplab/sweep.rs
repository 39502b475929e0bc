//! Capacity sweeps: for each configuration and worker count, step the call
//! rate up until the mean PDR crosses the threshold, refine by bisection,
//! and record every run (JSONL, appended as they finish, so an interrupted
//! sweep resumes where it stopped).

use super::{config_label, run_isolated, ProxyKind, RunRecord, RunSpec, Tools};
use crate::sched::{profile, Profile};
use crate::stats::mean_ci;
use ringway_io::BackendKind;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// Most runs one sweep may plan (bounded everything).
pub const MAX_RUNS: usize = 20_000;
/// Most calls one run may start.
pub const MAX_CALLS_PER_RUN: f64 = 2_000_000.0;

/// Sweep parameters.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct SweepConfig {
    /// Proxies to measure.
    pub proxies: Vec<ProxyKind>,
    /// Worker counts.
    pub workers: Vec<usize>,
    /// Scheduler profile names.
    pub profiles: Vec<String>,
    /// ringway proxy mode.
    pub mode: String,
    /// ringway proxy backend.
    pub backend: BackendKind,
    /// First rate (calls/s).
    pub rate_start: f64,
    /// Rate step (calls/s).
    pub rate_step: f64,
    /// Highest rate tried.
    pub rate_max: f64,
    /// Bisection steps after the crossing is bracketed.
    pub refine: u32,
    /// Repetitions per point.
    pub reps: u32,
    /// Seconds of call starts per run.
    pub duration_s: f64,
    /// PDR threshold defining capacity (0.01 = 1%).
    pub threshold: f64,
    /// Generator threads (0: as many as proxy workers, at most 8, so that
    /// SO_REUSEPORT proxies see as many flows as they have sockets).
    pub gen_threads: usize,
    /// CPU list for the proxy.
    pub cpus: Option<String>,
    /// Proxy receive buffer request.
    pub rcvbuf: Option<usize>,
    /// Base RNG seed.
    pub seed: u64,
}

impl SweepConfig {
    /// Check everything that can be checked before any run starts.
    pub fn validate(&self, tools: &Tools) -> Result<Vec<Profile>, String> {
        if self.proxies.is_empty() {
            return Err("no proxy given (--proxy ringway,kamailio)".into());
        }
        if self.workers.is_empty() {
            return Err("empty worker list (--workers)".into());
        }
        if let Some(w) = self.workers.iter().find(|&&w| w == 0 || w > 256) {
            return Err(format!("worker count {w} out of range 1..=256"));
        }
        if self.profiles.is_empty() {
            return Err("empty scheduler profile list (--profiles)".into());
        }
        let profiles = self
            .profiles
            .iter()
            .map(|p| profile(p))
            .collect::<Result<Vec<_>, _>>()?;
        for (what, v) in [
            ("--rate-start", self.rate_start),
            ("--rate-step", self.rate_step),
            ("--rate-max", self.rate_max),
        ] {
            if !(v.is_finite() && v > 0.0) {
                return Err(format!("{what} must be > 0 (got {v})"));
            }
        }
        if self.rate_max < self.rate_start {
            return Err(format!(
                "--rate-max {} is below --rate-start {}",
                self.rate_max, self.rate_start
            ));
        }
        if self.reps == 0 || self.reps > 100 {
            return Err(format!("--reps must be in 1..=100 (got {})", self.reps));
        }
        if self.refine > 20 {
            return Err("--refine must be at most 20".into());
        }
        if !(self.duration_s.is_finite() && self.duration_s > 0.0 && self.duration_s <= 3600.0) {
            return Err(format!(
                "--duration must be in (0, 3600] s (got {})",
                self.duration_s
            ));
        }
        if !(self.threshold > 0.0 && self.threshold < 1.0) {
            return Err(format!(
                "--threshold must be in (0, 1) (got {})",
                self.threshold
            ));
        }
        if self.gen_threads > 64 {
            return Err("--gen-threads must be in 0..=64 (0: one per proxy worker)".into());
        }
        if self.rate_start * self.duration_s < 1.0 {
            return Err(format!(
                "rate {} calls/s for {} s starts no call: raise the rate or the duration",
                self.rate_start, self.duration_s
            ));
        }
        if self.rate_max * self.duration_s > MAX_CALLS_PER_RUN {
            return Err(format!(
                "rate {} calls/s for {} s would start {} calls per run (limit {}): lower --rate-max or --duration",
                self.rate_max,
                self.duration_s,
                self.rate_max * self.duration_s,
                MAX_CALLS_PER_RUN
            ));
        }
        let runs = self.max_runs();
        if runs > MAX_RUNS {
            return Err(format!(
                "sweep could take up to {runs} runs (limit {MAX_RUNS}): fewer rates, workers or reps"
            ));
        }
        if self.proxies.contains(&ProxyKind::Kamailio) && !is_executable(&tools.kamailio) {
            return Err(format!(
                "kamailio binary {} not found or not executable (install kamailio or pass --kamailio PATH)",
                tools.kamailio.display()
            ));
        }
        if self.proxies.contains(&ProxyKind::Kamailio) && !tools.kamailio_cfg.is_file() {
            return Err(format!(
                "kamailio config {} not found (--kamailio-cfg)",
                tools.kamailio_cfg.display()
            ));
        }
        if self.proxies.contains(&ProxyKind::Ringway) && !is_executable(&tools.ringway) {
            return Err(format!(
                "ringway binary {} not found",
                tools.ringway.display()
            ));
        }
        if !["stateless", "stateful"].contains(&self.mode.as_str()) {
            return Err(format!(
                "--mode must be stateless or stateful (got {})",
                self.mode
            ));
        }
        Ok(profiles)
    }

    /// Upper bound of the number of runs.
    pub fn max_runs(&self) -> usize {
        let steps = ((self.rate_max - self.rate_start) / self.rate_step).floor() as usize + 1;
        (steps + self.refine as usize)
            * self.reps as usize
            * self.workers.len()
            * self.proxies.len()
            * self.profiles.len()
    }
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// Result of the capacity search of one configuration.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Capacity {
    /// Configuration label.
    pub config: String,
    /// Proxy.
    pub proxy: ProxyKind,
    /// Scheduler profile.
    pub profile: String,
    /// Workers.
    pub workers: usize,
    /// Highest rate (calls/s) whose mean PDR stayed under the threshold; None if none did.
    pub capacity_cps: Option<f64>,
    /// The probe just under the crossing (rate, mean PDR).
    pub below: Option<(f64, f64)>,
    /// The probe just over the crossing (rate, mean PDR).
    pub above: Option<(f64, f64)>,
    /// Every probe (rate, mean PDR; None when all reps failed).
    pub probes: Vec<(f64, Option<f64>)>,
    /// True when the highest rate tried stayed under the threshold (capacity is a lower bound).
    pub censored: bool,
}

/// Outcome of [`find_capacity`].
#[derive(Clone, Debug, PartialEq)]
pub struct Search {
    /// Highest probed rate under the threshold (rate, mean PDR).
    pub below: Option<(f64, f64)>,
    /// Lowest probed rate at or over the threshold (rate, mean PDR).
    pub above: Option<(f64, f64)>,
    /// Every probe in order (rate, mean PDR or None for a failed point).
    pub probes: Vec<(f64, Option<f64>)>,
}

/// Find the highest rate with PDR under `threshold`: step from `start` by
/// `step` up to `max` until `probe(rate)` (mean PDR; `None` = the point
/// failed, skipped) crosses, then bisect `refine` times between the last
/// rate under and the first over (rates rounded to whole calls/s).
pub fn find_capacity(
    start: f64,
    step: f64,
    max: f64,
    refine: u32,
    threshold: f64,
    mut probe: impl FnMut(f64) -> Option<f64>,
) -> Search {
    let mut probes = Vec::new();
    let mut below: Option<(f64, f64)> = None;
    let mut above: Option<(f64, f64)> = None;
    let mut i = 0u64;
    loop {
        let r = start + step * i as f64;
        if r > max + 1e-9 {
            break;
        }
        i += 1;
        let p = probe(r);
        probes.push((r, p));
        match p {
            Some(p) if p < threshold => below = Some((r, p)),
            Some(p) => {
                above = Some((r, p));
                break;
            }
            None => {}
        }
    }
    if let Some(mut hi) = above {
        let mut lo_rate = below.map_or(0.0, |b| b.0);
        for _ in 0..refine {
            let mid = ((lo_rate + hi.0) / 2.0).round();
            if mid <= lo_rate || mid >= hi.0 || mid < 1.0 {
                break;
            }
            let p = probe(mid);
            probes.push((mid, p));
            match p {
                Some(p) if p < threshold => {
                    below = Some((mid, p));
                    lo_rate = mid;
                }
                Some(p) => {
                    hi = (mid, p);
                    above = Some(hi);
                }
                // A failed point gives no information: stop refining.
                None => break,
            }
        }
    }
    Search {
        below,
        above,
        probes,
    }
}

/// Append-only JSONL store of run records, keyed for resuming.
pub struct Store {
    path: PathBuf,
    done: HashMap<String, RunRecord>,
}

impl Store {
    /// Open (or create) `dir/runs.jsonl`, loading records already there.
    /// Unreadable lines (e.g. cut by a crash) are skipped.
    pub fn open(dir: &Path) -> anyhow::Result<Store> {
        std::fs::create_dir_all(dir)?;
        let path = dir.join("runs.jsonl");
        let mut done = HashMap::new();
        if let Ok(t) = std::fs::read_to_string(&path) {
            if !t.is_empty() && !t.ends_with('\n') {
                // A line cut by a crash: end it so the next record starts clean.
                std::fs::OpenOptions::new()
                    .append(true)
                    .open(&path)?
                    .write_all(b"\n")?;
            }
            for l in t.lines() {
                if let Ok(r) = serde_json::from_str::<RunRecord>(l) {
                    done.insert(r.key.clone(), r);
                }
            }
        }
        Ok(Store { path, done })
    }
    /// A finished run with this key.
    pub fn get(&self, key: &str) -> Option<&RunRecord> {
        self.done.get(key)
    }
    /// Records loaded or added.
    pub fn records(&self) -> impl Iterator<Item = &RunRecord> {
        self.done.values()
    }
    /// Append a record (flushed immediately).
    pub fn add(&mut self, r: RunRecord) -> anyhow::Result<()> {
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.path)?;
        let mut line = serde_json::to_vec(&r)?;
        line.push(b'\n');
        f.write_all(&line)?;
        f.flush()?;
        self.done.insert(r.key.clone(), r);
        Ok(())
    }
}

/// Mean PDR of the successful runs of a point; `None` if all failed.
pub fn point_pdr(runs: &[&RunRecord]) -> Option<f64> {
    let ok: Vec<f64> = runs
        .iter()
        .filter(|r| r.error.is_none())
        .map(|r| r.pdr)
        .collect();
    (!ok.is_empty()).then(|| mean_ci(&ok).mean)
}

/// How a sweep reports progress.
pub trait SweepProgress {
    /// A run is about to start (`done` of at most `planned`).
    fn starting(&mut self, spec: &RunSpec, done: usize, planned: usize, eta_s: Option<f64>);
    /// A run finished (or was taken from the results file).
    fn finished(&mut self, rec: &RunRecord, resumed: bool);
}

/// Run (or resume) the sweep; returns the capacities, one per configuration × workers.
pub fn run_sweep(
    cfg: &SweepConfig,
    tools: &Tools,
    store: &mut Store,
    progress: &mut dyn SweepProgress,
    mut runner: impl FnMut(&RunSpec, &Tools) -> RunRecord,
) -> anyhow::Result<Vec<Capacity>> {
    let profiles = cfg.validate(tools).map_err(anyhow::Error::msg)?;
    let planned = cfg.max_runs();
    let mut done = 0usize;
    let mut run_time = 0.0f64;
    let mut run_count = 0usize;
    let mut caps = Vec::new();
    for &proxy in &cfg.proxies {
        for prof in &profiles {
            for &workers in &cfg.workers {
                let label = config_label(proxy, &cfg.mode, cfg.backend, &prof.name);
                let mut err: Option<anyhow::Error> = None;
                let Search {
                    below,
                    above,
                    probes,
                } = find_capacity(
                    cfg.rate_start,
                    cfg.rate_step,
                    cfg.rate_max,
                    cfg.refine,
                    cfg.threshold,
                    |rate| {
                        let mut recs = Vec::new();
                        for rep in 0..cfg.reps {
                            let spec = RunSpec {
                                proxy,
                                mode: if proxy == ProxyKind::Kamailio {
                                    "stateless".into()
                                } else {
                                    cfg.mode.clone()
                                },
                                workers,
                                backend: cfg.backend,
                                profile: prof.clone(),
                                cpus: cfg.cpus.clone(),
                                rate,
                                duration_s: cfg.duration_s,
                                rep,
                                seed: cfg.seed.wrapping_add(rep as u64 * 1000 + rate as u64),
                                gen_threads: if cfg.gen_threads == 0 {
                                    workers.clamp(1, 8)
                                } else {
                                    cfg.gen_threads
                                },
                                rcvbuf: cfg.rcvbuf,
                            };
                            let key = spec.key();
                            if let Some(r) = store.get(&key) {
                                progress.finished(r, true);
                                recs.push(r.clone());
                                done += 1;
                                continue;
                            }
                            let eta = (run_count > 0)
                                .then(|| run_time / run_count as f64 * (planned - done) as f64);
                            progress.starting(&spec, done, planned, eta);
                            let r = runner(&spec, tools);
                            run_time += r.wall_s;
                            run_count += 1;
                            done += 1;
                            progress.finished(&r, false);
                            if let Err(e) = store.add(r.clone()) {
                                err.get_or_insert(e);
                            }
                            recs.push(r);
                        }
                        let refs: Vec<&RunRecord> = recs.iter().collect();
                        point_pdr(&refs)
                    },
                );
                if let Some(e) = err {
                    return Err(e.context("cannot append to runs.jsonl"));
                }
                caps.push(Capacity {
                    config: label,
                    proxy,
                    profile: prof.name.clone(),
                    workers,
                    capacity_cps: below.map(|b| b.0),
                    below,
                    above,
                    censored: above.is_none() && below.is_some(),
                    probes,
                });
            }
        }
    }
    Ok(caps)
}

/// Text progress bar with ETA for stderr.
pub struct BarProgress {
    t0: Instant,
}

impl Default for BarProgress {
    fn default() -> Self {
        BarProgress { t0: Instant::now() }
    }
}

impl SweepProgress for BarProgress {
    fn starting(&mut self, spec: &RunSpec, done: usize, planned: usize, eta_s: Option<f64>) {
        let frac = done as f64 / planned.max(1) as f64;
        let w = 24usize;
        let fill = ((frac * w as f64) as usize).min(w);
        let eta = eta_s.map_or("?".to_string(), |s| format!("≤{:.0}s", s));
        eprintln!(
            "[{}{}] {done}/{planned} max  elapsed {:.0}s ETA {eta}  {} w={} rate={} rep={}",
            "#".repeat(fill),
            "-".repeat(w - fill),
            self.t0.elapsed().as_secs_f64(),
            spec.config_label(),
            spec.workers,
            spec.rate,
            spec.rep
        );
    }
    fn finished(&mut self, r: &RunRecord, resumed: bool) {
        let tag = if resumed { " (from runs.jsonl)" } else { "" };
        match &r.error {
            Some(e) => eprintln!("    run failed{tag}: {e}"),
            None => eprintln!(
                "    PDR {:.4}% failed calls {:.3}% calls {}/{} proxy cpu {:.2}s{tag}",
                100.0 * r.pdr,
                100.0 * r.failed_ratio,
                r.succeeded,
                r.attempted,
                r.proxy_cpu_s
            ),
        }
    }
}

/// Runner used by the real sweep: every run in its own private namespace.
pub fn isolated_runner(spec: &RunSpec, tools: &Tools) -> RunRecord {
    run_isolated(spec, tools)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn synthetic(cap: f64) -> impl FnMut(f64) -> Option<f64> {
        // PDR 0 below capacity, growing linearly above it.
        move |r| Some(if r <= cap { 0.0 } else { (r - cap) / r })
    }

    #[test]
    fn finds_capacity_on_synthetic_curves() {
        for cap in [350.0, 999.0, 1500.0, 4321.0] {
            let Search {
                below,
                above,
                probes,
            } = find_capacity(200.0, 200.0, 10_000.0, 8, 0.01, synthetic(cap));
            let b = below.unwrap().0;
            let a = above.unwrap().0;
            // True crossing is where (r-cap)/r = 0.01, i.e. r = cap/0.99.
            let cross = cap / 0.99;
            assert!(b < cross && a >= cross, "cap {cap}: {b} .. {a}");
            assert!(a - b <= 2.0, "cap {cap}: bracket {b}..{a} not refined");
            assert!(probes.len() <= 50);
        }
    }

    #[test]
    fn capacity_below_first_rate_and_censored_top() {
        let Search { below, above, .. } =
            find_capacity(200.0, 200.0, 1000.0, 0, 0.01, synthetic(50.0));
        assert!(below.is_none());
        assert_eq!(above.unwrap().0, 200.0);
        let Search {
            below,
            above,
            probes,
        } = find_capacity(200.0, 200.0, 1000.0, 3, 0.01, synthetic(5000.0));
        assert_eq!(below.unwrap().0, 1000.0);
        assert!(above.is_none());
        assert_eq!(probes.len(), 5);
    }

    #[test]
    fn failed_points_are_skipped() {
        let mut calls = 0;
        let Search {
            below,
            above,
            probes,
        } = find_capacity(200.0, 200.0, 2000.0, 0, 0.01, |r| {
            calls += 1;
            if r == 400.0 {
                None
            } else {
                synthetic(700.0)(r)
            }
        });
        assert_eq!(below.unwrap().0, 600.0);
        assert_eq!(above.unwrap().0, 800.0);
        assert_eq!(probes[1], (400.0, None));
        assert_eq!(calls, 4);
    }
}
