//! Capacity sweeps: for each proxy, core count, worker count and scheduler
//! mode, step the call rate up until the mean PDR of the valid runs
//! crosses the threshold (refining by bisection if asked), and record every
//! run (JSONL, appended as they finish, so an interrupted sweep resumes
//! where it stopped). The `tuned` mode runs the tuner at the baseline
//! crossing load first and then sweeps its pick with the sweep's seeds
//! (fresh: the search used other seeds).

use super::mode::{mode_by_name, Mode};
use super::tune::{self, TuneResult};
use super::{run_isolated, ProxyKind, RunRecord, RunSpec, Tools};
use crate::stats::mean_ci;
use ringway_io::BackendKind;
use ringway_server::sip::service::ServiceTime;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};

/// Most runs one sweep may plan (bounded everything).
pub const MAX_RUNS: usize = 20_000;
/// Consecutive rates without a valid run after which the step-up stops.
pub const MAX_POINTS_WITHOUT_DATA: usize = 2;
/// Most calls one run may start.
pub const MAX_CALLS_PER_RUN: f64 = 2_000_000.0;
/// The mode name that runs the tuner.
pub const TUNED: &str = "tuned";

/// Sweep parameters.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct SweepConfig {
    /// Proxies to measure.
    pub proxies: Vec<ProxyKind>,
    /// Worker counts (the papers' threads).
    pub workers: Vec<usize>,
    /// Scheduler modes: built-in names, mode files, per-thread profile names, `tuned`.
    pub modes: Vec<String>,
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
    /// Bisection steps after the crossing is bracketed (0: the papers' grid pair).
    pub refine: u32,
    /// Repetitions per point.
    pub reps: u32,
    /// Seconds of call starts per run.
    pub duration_s: f64,
    /// PDR threshold defining capacity (0.01 = 1%).
    pub threshold: f64,
    /// Generator threads (0: automatic; reuseport: 4 per worker, 8..=64).
    pub gen_threads: usize,
    /// Core counts for the proxy (each a process-wide CPU set).
    pub cores: Vec<usize>,
    /// CPUs the proxy's sets are taken from, in order (empty: every CPU the
    /// lab may use that is not a generator CPU).
    pub proxy_cpus: Vec<usize>,
    /// The generator's CPUs (empty: not pinned; runs are then flagged).
    pub gen_cpus: Vec<usize>,
    /// Receive model of ringway: `shared` or `reuseport`.
    pub rx_model: String,
    /// Datagrams per receive batch (ringway).
    pub batch: usize,
    /// Proxy receive buffer request.
    pub rcvbuf: Option<usize>,
    /// Base RNG seed.
    pub seed: u64,
    /// Repetitions per tuner candidate.
    pub tune_reps: u32,
    /// Emulated service time per message of the ringway proxy (`None`: off).
    #[serde(default)]
    pub service: Option<ServiceTime>,
    /// Sweep-wide global settings (`PATH=VALUE`), recorded in every run's key.
    #[serde(default)]
    pub globals: Vec<String>,
}

/// The CPUs the lab may use (its affinity), or 0..online.
pub fn usable_cpus() -> Vec<usize> {
    ringway_io::thread::affinity()
        .unwrap_or_else(|_| (0..ringway_io::thread::online_cpus()).collect())
}

impl SweepConfig {
    /// Check everything that can be checked before any run starts; returns
    /// the modes (`tuned` as `None`).
    pub fn validate(&self, tools: &Tools) -> Result<Vec<Option<Mode>>, String> {
        self.validate_on(tools, &usable_cpus())
    }

    /// [`SweepConfig::validate`] for a machine whose usable CPUs are `usable`.
    /// The checks run in this order, so the first problem is the one named.
    pub fn validate_on(
        &self,
        tools: &Tools,
        usable: &[usize],
    ) -> Result<Vec<Option<Mode>>, String> {
        let modes = self.checked_lists()?;
        self.check_numbers()?;
        self.check_cpus(usable)?;
        self.check_size()?;
        self.check_tools(tools)?;
        Ok(modes)
    }

    /// Proxies, workers and modes (parsed; `tuned` as `None`, after baseline).
    fn checked_lists(&self) -> Result<Vec<Option<Mode>>, String> {
        if self.proxies.is_empty() {
            return Err("no proxy given (--proxy ringway,kamailio)".into());
        }
        if self.workers.is_empty() {
            return Err("empty worker list (--workers)".into());
        }
        if let Some(workers) = self
            .workers
            .iter()
            .find(|&&workers| workers == 0 || workers > 256)
        {
            return Err(format!("worker count {workers} out of range 1..=256"));
        }
        if self.modes.is_empty() {
            return Err("empty scheduler mode list (--profiles)".into());
        }
        let mut modes = Vec::new();
        for (i, m) in self.modes.iter().enumerate() {
            if m == TUNED {
                if !self.modes[..i].iter().any(|b| b == "baseline") {
                    return Err(
                        "--profiles: tuned searches at the baseline crossing load: list baseline before tuned"
                            .into(),
                    );
                }
                modes.push(None);
            } else {
                modes.push(Some(mode_by_name(m)?));
            }
        }
        let mut names: Vec<&str> = self
            .modes
            .iter()
            .map(|m| m.rsplit('/').next().unwrap_or(m).trim_end_matches(".toml"))
            .collect();
        names.sort();
        if names.windows(2).any(|workers| workers[0] == workers[1]) {
            return Err("--profiles: a mode is listed twice".into());
        }
        Ok(modes)
    }

    /// Rates, repetitions, durations and the other numbers are in range.
    fn check_numbers(&self) -> Result<(), String> {
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
        if self.tune_reps == 0 || self.tune_reps > 100 {
            return Err(format!(
                "--tune-reps must be in 1..=100 (got {})",
                self.tune_reps
            ));
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
            return Err("--gen-threads must be in 0..=64 (0: automatic)".into());
        }
        if !["shared", "reuseport"].contains(&self.rx_model.as_str()) {
            return Err(format!(
                "--rx-model must be shared or reuseport (got {})",
                self.rx_model
            ));
        }
        if !(1..=1024).contains(&self.batch) {
            return Err(format!("--batch must be in 1..=1024 (got {})", self.batch));
        }
        Ok(())
    }

    /// Generator CPUs exist and are usable, the proxy pool is disjoint
    /// from them, every core count fits.
    fn check_cpus(&self, usable: &[usize]) -> Result<(), String> {
        if let Some(cpu) = self.gen_cpus.iter().find(|cpu| !usable.contains(cpu)) {
            return Err(format!(
                "--gen-cpus: CPU {cpu} is not one this machine lets the lab use ({})",
                super::topology::cpu_list_text(usable)
            ));
        }
        if let Some(cpu) = self.proxy_cpus.iter().find(|cpu| !usable.contains(cpu)) {
            return Err(format!(
                "--proxy-cpus: CPU {cpu} is not one this machine lets the lab use ({})",
                super::topology::cpu_list_text(usable)
            ));
        }
        if let Some(cpu) = self
            .proxy_cpus
            .iter()
            .find(|cpu| self.gen_cpus.contains(cpu))
        {
            return Err(format!(
                "--gen-cpus overlaps the proxy's CPUs (CPU {cpu}): the generator must run on other CPUs"
            ));
        }
        if self.cores.is_empty() {
            return Err("empty core list (--cores)".into());
        }
        let pool = self.pool(usable);
        if let Some(&cpu) = self.cores.iter().find(|&&cpu| cpu == 0 || cpu > pool.len()) {
            return Err(format!(
                "--cores {cpu}: the proxy can have 1..={} CPUs here ({} usable CPU(s){}); larger core counts need a larger machine",
                pool.len(),
                usable.len(),
                if self.gen_cpus.is_empty() {
                    String::new()
                } else {
                    format!(", {} kept for the generator by --gen-cpus", self.gen_cpus.len())
                }
            ));
        }
        Ok(())
    }

    /// Every run starts a call, no run starts too many, the sweep is bounded.
    fn check_size(&self) -> Result<(), String> {
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
                "sweep could take up to {runs} runs (limit {MAX_RUNS}): fewer rates, workers, cores or reps"
            ));
        }
        Ok(())
    }

    /// The proxies' binaries and configuration exist; the proxy mode is known.
    fn check_tools(&self, tools: &Tools) -> Result<(), String> {
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
        Ok(())
    }

    /// The CPUs proxy sets are taken from, in order.
    pub fn pool(&self, usable: &[usize]) -> Vec<usize> {
        if self.proxy_cpus.is_empty() {
            usable
                .iter()
                .copied()
                .filter(|c| !self.gen_cpus.contains(c))
                .collect()
        } else {
            self.proxy_cpus.clone()
        }
    }

    /// Generator threads for `workers` proxy workers.
    pub fn gen_threads_for(&self, workers: usize) -> usize {
        if self.gen_threads > 0 {
            self.gen_threads
        } else if self.rx_model == "reuseport" {
            // Enough flows that every SO_REUSEPORT socket is hashed some
            // traffic (expected idle workers N·e^-4 ≈ 2% of N).
            (4 * workers).clamp(8, 64)
        } else {
            2
        }
    }

    /// The papers' grid, one message at a time (`--paper`; review D4):
    /// receive batch 1, the shared socket (children reading one socket),
    /// threads 2, 4, 6, 8 and 16, 200-calls/s steps from 200 with the grid
    /// pair (no bisection), capacity at 1 % PDR, and the papers' two modes
    /// baseline and enhanced (unless the tuner is asked for: `tuned` listed
    /// keeps the modes as given). Cores, repetitions (the papers: 30), run
    /// length, proxies and the emulated service time stay as `self` has
    /// them.
    pub fn paper(self) -> SweepConfig {
        let modes = if self.modes.iter().any(|m| m == TUNED) {
            self.modes.clone()
        } else {
            vec!["baseline".into(), "enhanced".into()]
        };
        SweepConfig {
            batch: 1,
            rx_model: "shared".into(),
            workers: vec![2, 4, 6, 8, 16],
            rate_start: 200.0,
            rate_step: 200.0,
            refine: 0,
            threshold: 0.01,
            modes,
            ..self
        }
    }

    /// The settings as one line (what `--paper` prints before a sweep).
    pub fn describe(&self) -> String {
        let list = |v: &[usize]| {
            v.iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(",")
        };
        format!(
            "batch {}, rx-model {}, threads {}, cores {}, modes {}, rates {}..{} step {} (refine {}), \
             capacity at PDR {} %, {} repetitions of {} s, at most {} runs",
            self.batch,
            self.rx_model,
            list(&self.workers),
            list(&self.cores),
            self.modes.join(","),
            self.rate_start,
            self.rate_max,
            self.rate_step,
            self.refine,
            self.threshold * 100.0,
            self.reps,
            self.duration_s,
            self.max_runs()
        )
    }

    /// Upper bound of the number of runs (the tuner's counted per tuned point).
    pub fn max_runs(&self) -> usize {
        let steps = ((self.rate_max - self.rate_start) / self.rate_step).floor() as usize + 1;
        let per_mode = (steps + self.refine as usize) * self.reps as usize;
        let tuned = self.modes.iter().filter(|m| *m == TUNED).count();
        // Per mode: its search, and its repetitions at the baseline
        // crossing load when its own search did not reach it.
        let per_point = (per_mode + self.reps as usize) * self.modes.len()
            + tuned * tune::MAX_CANDIDATES * self.tune_reps as usize;
        per_point * self.workers.len() * self.proxies.len() * self.cores.len()
    }
}

/// The seed of a run: differs per point (workers, cores, rate) and rep,
/// is the same for every mode and proxy (paired comparisons).
pub fn seed_for(base: u64, workers: usize, cores: usize, rate: f64, rep: u32) -> u64 {
    let mut seed = base
        ^ (workers as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15)
        ^ (cores as u64).wrapping_mul(0xC2B2_AE3D_27D4_EB4F)
        ^ ((rate * 1000.0) as u64).wrapping_mul(0x1656_67B1_9E37_79F9)
        ^ (rep as u64).wrapping_mul(0x27D4_EB2F_1656_67C5);
    // splitmix64 finaliser.
    seed = (seed ^ (seed >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    seed = (seed ^ (seed >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    seed ^ (seed >> 31)
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// Result of the capacity search of one (proxy, cores, workers, mode).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Capacity {
    /// Configuration label (as [`RunSpec::config_label`]).
    pub config: String,
    /// Proxy.
    pub proxy: ProxyKind,
    /// Scheduler mode.
    pub profile: String,
    /// Cores.
    pub cores: usize,
    /// Sockets of the proxy's CPU set.
    pub sockets: usize,
    /// Workers.
    pub workers: usize,
    /// Highest rate (calls/s) whose mean PDR stayed under the threshold; None if none did.
    pub capacity_cps: Option<f64>,
    /// The probe just under the crossing (rate, the larger of mean PDR and
    /// mean failed-call ratio: [`point_criterion`]).
    pub below: Option<(f64, f64)>,
    /// The probe just over the crossing (rate, [`point_criterion`]).
    pub above: Option<(f64, f64)>,
    /// Every probe (rate, [`point_criterion`]; None when no valid run).
    pub probes: Vec<(f64, Option<f64>)>,
    /// Every probe with each repetition's larger of PDR and failed-call
    /// ratio (None: that run failed or was flagged).
    pub rep_pdrs: Vec<(f64, Vec<Option<f64>>)>,
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
    let mut step_index = 0u64;
    let mut without_data = 0;
    loop {
        let rate = start + step * step_index as f64;
        if rate > max + 1e-9 {
            break;
        }
        step_index += 1;
        let pdr = probe(rate);
        probes.push((rate, pdr));
        match pdr {
            Some(pdr) if pdr < threshold => {
                below = Some((rate, pdr));
                without_data = 0;
            }
            Some(pdr) => {
                above = Some((rate, pdr));
                break;
            }
            None => {
                // Two rates in a row without a valid run (the generator
                // cannot offer more, or the proxy does not start): higher
                // rates will not do better.
                without_data += 1;
                if without_data >= MAX_POINTS_WITHOUT_DATA {
                    break;
                }
            }
        }
    }
    if let Some(mut high) = above {
        let mut lo_rate = below.map_or(0.0, |b| b.0);
        for _ in 0..refine {
            let mid = ((lo_rate + high.0) / 2.0).round();
            if mid <= lo_rate || mid >= high.0 || mid < 1.0 {
                break;
            }
            let pdr = probe(mid);
            probes.push((mid, pdr));
            match pdr {
                Some(pdr) if pdr < threshold => {
                    below = Some((mid, pdr));
                    lo_rate = mid;
                }
                Some(pdr) => {
                    high = (mid, pdr);
                    above = Some(high);
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
        if let Ok(text) = std::fs::read_to_string(&path) {
            if !text.is_empty() && !text.ends_with('\n') {
                // A line cut by a crash: end it so the next record starts clean.
                std::fs::OpenOptions::new()
                    .append(true)
                    .open(&path)?
                    .write_all(b"\n")?;
            }
            for l in text.lines() {
                if let Ok(record) = serde_json::from_str::<RunRecord>(l) {
                    done.insert(record.key.clone(), record);
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
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.path)?;
        let mut line = serde_json::to_vec(&r)?;
        line.push(b'\n');
        file.write_all(&line)?;
        file.flush()?;
        self.done.insert(r.key.clone(), r);
        Ok(())
    }
}

/// How a sweep reports progress.
pub trait SweepProgress {
    /// A run is about to start (`done` of at most `planned`).
    fn starting(&mut self, spec: &RunSpec, done: usize, planned: usize, eta_s: Option<f64>);
    /// A run finished (or was taken from the results file).
    fn finished(&mut self, rec: &RunRecord, resumed: bool);
}

/// What a capacity search compares with the threshold at a point: the
/// larger of the mean PDR and the mean failed-call ratio of its valid
/// runs (capacity also requires failed calls under the threshold: a proxy
/// that answers errors or loses state fails calls without dropping);
/// `None` if no run is valid.
pub fn point_criterion(runs: &[&RunRecord]) -> Option<f64> {
    let ok: Vec<&&RunRecord> = runs.iter().filter(|r| r.valid()).collect();
    if ok.is_empty() {
        return None;
    }
    let pdr = mean_ci(&ok.iter().map(|r| r.pdr).collect::<Vec<_>>()).mean;
    let failed = mean_ci(&ok.iter().map(|r| r.failed_ratio).collect::<Vec<_>>()).mean;
    Some(pdr.max(failed))
}

/// Mean PDR of the valid runs of a point; `None` if none is valid.
pub fn point_pdr(runs: &[&RunRecord]) -> Option<f64> {
    let valid_pdr: Vec<f64> = runs.iter().filter(|r| r.valid()).map(|r| r.pdr).collect();
    (!valid_pdr.is_empty()).then(|| mean_ci(&valid_pdr).mean)
}

/// Everything a sweep produced.
#[derive(Clone, Debug, Default, Serialize)]
pub struct SweepOutcome {
    /// Capacities, one per (proxy, cores, workers, mode).
    pub caps: Vec<Capacity>,
    /// Tuner searches (one per tuned point).
    pub tunes: Vec<TuneResult>,
}

/// Runs of one sweep: the store, the runner, progress and accounting.
pub struct Runs<'a> {
    /// Results file.
    pub store: &'a mut Store,
    /// Progress output.
    pub progress: &'a mut dyn SweepProgress,
    /// Runs one spec.
    pub runner: &'a mut dyn FnMut(&RunSpec, &Tools) -> RunRecord,
    /// Planned runs (upper bound).
    pub planned: usize,
    done: usize,
    run_time: f64,
    run_count: usize,
    /// First error appending to the store.
    pub err: Option<anyhow::Error>,
}

impl<'a> Runs<'a> {
    /// Runs against `store`.
    pub fn new(
        store: &'a mut Store,
        progress: &'a mut dyn SweepProgress,
        runner: &'a mut dyn FnMut(&RunSpec, &Tools) -> RunRecord,
        planned: usize,
    ) -> Self {
        Runs {
            store,
            progress,
            runner,
            planned,
            done: 0,
            run_time: 0.0,
            run_count: 0,
            err: None,
        }
    }

    /// The record of `spec`: from the store if it is there, else run now.
    pub fn get(&mut self, spec: &RunSpec, tools: &Tools) -> RunRecord {
        if let Some(record) = self.store.get(&spec.key()) {
            self.progress.finished(record, true);
            self.done += 1;
            return record.clone();
        }
        let eta = (self.run_count > 0).then(|| {
            self.run_time / self.run_count as f64 * self.planned.saturating_sub(self.done) as f64
        });
        self.progress.starting(spec, self.done, self.planned, eta);
        let record = (self.runner)(spec, tools);
        self.run_time += record.wall_s;
        self.run_count += 1;
        self.done += 1;
        self.progress.finished(&record, false);
        if let Err(error) = self.store.add(record.clone()) {
            self.err.get_or_insert(error);
        }
        record
    }
}

/// The spec of one run of the sweep.
#[allow(clippy::too_many_arguments)]
pub fn spec_for(
    cfg: &SweepConfig,
    proxy: ProxyKind,
    cores: usize,
    workers: usize,
    sched: &str,
    knobs: super::mode::Knobs,
    rate: f64,
    rep: u32,
    seed: u64,
) -> RunSpec {
    let pool = cfg.pool(&usable_cpus());
    RunSpec {
        proxy,
        // Kamailio runs the shipped config of the same mode (stateful:
        // tm and t_relay) unless --kamailio-cfg names another.
        mode: cfg.mode.clone(),
        workers,
        backend: cfg.backend,
        sched: sched.to_string(),
        knobs,
        cores,
        proxy_cpus: pool.iter().take(cores).copied().collect(),
        gen_cpus: cfg.gen_cpus.clone(),
        rx_model: cfg.rx_model.clone(),
        batch: cfg.batch,
        rate,
        duration_s: cfg.duration_s,
        rep,
        seed,
        gen_threads: cfg.gen_threads_for(workers),
        rcvbuf: cfg.rcvbuf,
        service: if proxy == ProxyKind::Ringway {
            cfg.service
        } else {
            None
        },
        globals: cfg.globals.clone(),
        wire: None,
        rx_coalesce_us: None,
    }
}

/// Capacity search of one (proxy, cores, workers, mode).
#[allow(clippy::too_many_arguments)]
pub fn capacity_of(
    cfg: &SweepConfig,
    tools: &Tools,
    runs: &mut Runs<'_>,
    proxy: ProxyKind,
    cores: usize,
    workers: usize,
    sched: &str,
    knobs: &super::mode::Knobs,
) -> Capacity {
    let mut rep_pdrs = Vec::new();
    let mut label = String::new();
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
                let seed = seed_for(cfg.seed, workers, cores, rate, rep);
                let spec = spec_for(
                    cfg,
                    proxy,
                    cores,
                    workers,
                    sched,
                    knobs.clone(),
                    rate,
                    rep,
                    seed,
                );
                label = spec.config_label();
                recs.push(runs.get(&spec, tools));
            }
            rep_pdrs.push((
                rate,
                recs.iter()
                    .map(|r| r.valid().then_some(r.pdr.max(r.failed_ratio)))
                    .collect(),
            ));
            let refs: Vec<&RunRecord> = recs.iter().collect();
            point_criterion(&refs)
        },
    );
    Capacity {
        config: label,
        proxy,
        profile: sched.to_string(),
        cores,
        sockets: super::topology::detect(&cfg.pool(&usable_cpus())[..cores]).sockets,
        workers,
        capacity_cps: below.map(|b| b.0),
        below,
        above,
        censored: above.is_none() && below.is_some(),
        probes,
        rep_pdrs,
    }
}

/// Run (or resume) the sweep: capacities per (proxy, cores, workers, mode)
/// and the tuner searches of the `tuned` mode.
pub fn run_sweep(
    cfg: &SweepConfig,
    tools: &Tools,
    store: &mut Store,
    progress: &mut dyn SweepProgress,
    mut runner: impl FnMut(&RunSpec, &Tools) -> RunRecord,
) -> anyhow::Result<SweepOutcome> {
    let modes = cfg.validate(tools).map_err(anyhow::Error::msg)?;
    let mut runs = Runs::new(store, progress, &mut runner, cfg.max_runs());
    let mut out = SweepOutcome::default();
    for &proxy in &cfg.proxies {
        for &cores in &cfg.cores {
            for &workers in &cfg.workers {
                let mut baseline: Option<(Capacity, super::mode::Knobs)> = None;
                for (name, mode) in cfg.modes.iter().zip(&modes) {
                    let (sched, knobs) = match mode {
                        Some(m) => (m.name.clone(), m.resolve(cores, workers)),
                        None => {
                            let Some((bcap, bknobs)) = &baseline else {
                                continue;
                            };
                            // The baseline crossing load: the first rate over
                            // the threshold (else the highest under it).
                            let Some(rate) = bcap.above.or(bcap.below).map(|p| p.0) else {
                                log::warn!("tuned: no baseline run succeeded for {proxy:?} c{cores} w{workers}; skipped");
                                continue;
                            };
                            let tuned = tune::search(
                                cfg, tools, &mut runs, proxy, cores, workers, rate, bknobs,
                            );
                            let knobs = tuned.pick_knobs();
                            out.tunes.push(tuned);
                            match knobs {
                                Some(k) => (TUNED.to_string(), k),
                                None => continue,
                            }
                        }
                    };
                    let cap =
                        capacity_of(cfg, tools, &mut runs, proxy, cores, workers, &sched, &knobs);
                    if name == "baseline" {
                        baseline = Some((cap.clone(), knobs.clone()));
                    } else if let Some(rate) = baseline.as_ref().and_then(|b| b.0.above) {
                        // Tables III/VI/IX compare at the baseline crossing
                        // load: measure this mode there too if its own
                        // search did not.
                        let rate = rate.0;
                        if !cap.probes.iter().any(|p| p.0 == rate) {
                            for rep in 0..cfg.reps {
                                let seed = seed_for(cfg.seed, workers, cores, rate, rep);
                                let spec = spec_for(
                                    cfg,
                                    proxy,
                                    cores,
                                    workers,
                                    &sched,
                                    knobs.clone(),
                                    rate,
                                    rep,
                                    seed,
                                );
                                runs.get(&spec, tools);
                            }
                        }
                    }
                    out.caps.push(cap);
                    if let Some(error) = runs.err.take() {
                        return Err(error.context("cannot append to runs.jsonl"));
                    }
                }
            }
        }
    }
    Ok(out)
}

/// Runner used by the real sweep: every run in its own private namespace.
pub fn isolated_runner(spec: &RunSpec, tools: &Tools) -> RunRecord {
    run_isolated(spec, tools)
}

/// Fixtures the lab's sweep-driven tests share.
#[cfg(test)]
pub(crate) mod tests_support {
    use super::*;

    /// Tools that exist on any machine (nothing is started with them).
    pub(crate) fn test_tools() -> Tools {
        Tools {
            ringway: "/bin/sh".into(),
            kamailio: "/bin/sh".into(),
            kamailio_cfg: "/etc/hostname".into(),
            work_dir: "/tmp".into(),
            state_file: "/tmp/x.json".into(),
            max_foreign_cpu_pct: crate::siplab::background::DEFAULT_MAX_FOREIGN_CPU_PCT,
        }
    }

    /// A small valid sweep, the generator on the last usable CPU.
    pub(crate) fn test_cfg() -> SweepConfig {
        SweepConfig {
            proxies: vec![ProxyKind::Ringway],
            workers: vec![2],
            modes: vec!["default".into(), "baseline".into(), "enhanced".into()],
            mode: "stateless".into(),
            backend: BackendKind::Mmsg,
            rate_start: 200.0,
            rate_step: 200.0,
            rate_max: 1000.0,
            refine: 0,
            reps: 2,
            duration_s: 2.0,
            threshold: 0.01,
            gen_threads: 0,
            cores: vec![1],
            proxy_cpus: Vec::new(),
            gen_cpus: vec![*usable_cpus().last().unwrap_or(&1)],
            rx_model: "shared".into(),
            batch: 32,
            rcvbuf: None,
            seed: 1,
            tune_reps: 2,
            service: None,
            globals: Vec::new(),
        }
    }

    /// Progress that prints nothing.
    pub(crate) struct Quiet;
    impl SweepProgress for Quiet {
        fn starting(&mut self, _: &RunSpec, _: usize, _: usize, _: Option<f64>) {}
        fn finished(&mut self, _: &RunRecord, _: bool) {}
    }

    /// [`Quiet`].
    pub(crate) fn quiet() -> Quiet {
        Quiet
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tools() -> Tools {
        tests_support::test_tools()
    }

    #[test]
    fn paper_preset_plans_the_papers_grid() {
        let base = SweepConfig {
            batch: 32,
            rx_model: "reuseport".into(),
            rate_step: 1000.0,
            refine: 3,
            reps: 5,
            rate_max: 2000.0,
            ..cfg()
        };
        let c = base.paper();
        assert_eq!(c.batch, 1);
        assert_eq!(c.rx_model, "shared");
        assert_eq!(c.workers, vec![2, 4, 6, 8, 16]);
        assert_eq!((c.rate_start, c.rate_step, c.refine), (200.0, 200.0, 0));
        assert_eq!(c.modes, vec!["baseline", "enhanced"]);
        assert_eq!(c.threshold, 0.01);
        // The caller's: repetitions, highest rate, cores, proxies.
        assert_eq!((c.reps, c.rate_max, c.cores.clone()), (5, 2000.0, vec![1]));
        // The plan: 10 rates x 5 reps per mode search, plus 5 reps at the
        // baseline crossing, x 2 modes x 5 thread counts x 1 proxy x 1 core.
        assert_eq!(c.max_runs(), (10 * 5 + 5) * 2 * 5);
        let line = c.describe();
        assert!(
            line.contains("batch 1, rx-model shared, threads 2,4,6,8,16"),
            "{line}"
        );
        assert!(line.contains("at most 550 runs"), "{line}");
        c.validate_on(&tools(), &[0, 1, 2, 3])
            .expect("a valid sweep");
    }

    /// [`tests_support::test_cfg`] with the generator on CPU 1 (the
    /// validation tests pass their own CPU lists).
    fn cfg() -> SweepConfig {
        SweepConfig {
            gen_cpus: vec![1],
            ..tests_support::test_cfg()
        }
    }

    #[test]
    fn impossible_combinations_are_rejected_before_anything_runs() {
        let two = [0, 1];
        let ok = cfg();
        assert_eq!(ok.validate_on(&tools(), &two).unwrap().len(), 3);
        assert_eq!(ok.pool(&two), vec![0]);
        let bad = |f: &dyn Fn(&mut SweepConfig), want: &str, usable: &[usize]| {
            let mut c = cfg();
            f(&mut c);
            let e = c.validate_on(&tools(), usable).unwrap_err();
            assert!(e.contains(want), "expected {want:?} in {e:?}");
        };
        // With the generator on CPU 1 a 2-CPU machine leaves the proxy one.
        bad(
            &|c| c.cores = vec![1, 2],
            "--cores 2: the proxy can have 1..=1",
            &two,
        );
        bad(&|c| c.cores = vec![0], "--cores 0", &two);
        bad(&|c| c.gen_cpus = vec![5], "--gen-cpus: CPU 5", &two);
        bad(
            &|c| c.proxy_cpus = vec![1],
            "--gen-cpus overlaps the proxy's CPUs (CPU 1)",
            &two,
        );
        bad(
            &|c| c.modes = vec!["tuned".into()],
            "list baseline before tuned",
            &two,
        );
        bad(
            &|c| c.modes = vec!["default".into(), "default".into()],
            "listed twice",
            &two,
        );
        bad(
            &|c| c.modes = vec!["turbo".into()],
            "unknown scheduler profile",
            &two,
        );
        bad(&|c| c.rx_model = "mmap".into(), "--rx-model", &two);
        bad(&|c| c.batch = 0, "--batch", &two);
        bad(&|c| c.tune_reps = 0, "--tune-reps", &two);
        // A mode file with an unknown key.
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("m.toml");
        std::fs::write(&f, "name = \"m\"\n[knobs]\nsched_latency_ns = 1\n").unwrap();
        let name = f.display().to_string();
        bad(&|c| c.modes = vec![name.clone()], "sched_latency_ns", &two);
        // On a 6-CPU machine 4 cores fit next to one generator CPU.
        let mut c = cfg();
        c.cores = vec![1, 2, 4];
        c.gen_cpus = vec![5];
        assert!(c.validate_on(&tools(), &[0, 1, 2, 3, 4, 5]).is_ok());
        assert_eq!(c.pool(&[0, 1, 2, 3, 4, 5]), vec![0, 1, 2, 3, 4]);
    }

    struct Quiet;
    impl SweepProgress for Quiet {
        fn starting(&mut self, _: &RunSpec, _: usize, _: usize, _: Option<f64>) {}
        fn finished(&mut self, _: &RunRecord, _: bool) {}
    }

    #[test]
    fn every_mode_is_measured_at_the_baseline_crossing_and_the_tuner_uses_its_own_seeds() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = Store::open(dir.path()).unwrap();
        let mut c = cfg();
        c.modes = vec!["baseline".into(), "enhanced".into(), TUNED.into()];
        c.rate_max = 2000.0;
        c.gen_cpus = vec![*usable_cpus().last().unwrap()];
        // Synthetic PDR: baseline crosses at 800, enhanced already at 400;
        // tuner candidates with a larger slice do better.
        let mut runner = |s: &RunSpec, _: &Tools| {
            let cap = match s.sched.as_str() {
                "baseline" => 700.0,
                "enhanced" => 300.0,
                _ => 300.0 + s.knobs.slice_us.unwrap_or(0) as f64,
            };
            let mut r = RunRecord::empty(s);
            r.pdr = if s.rate <= cap { 0.0 } else { 0.05 };
            r
        };
        let out = run_sweep(&c, &tools(), &mut store, &mut Quiet, &mut runner).unwrap();
        let cap = |m: &str| out.caps.iter().find(|c| c.profile == m).unwrap();
        assert_eq!(cap("baseline").above.unwrap().0, 800.0);
        assert_eq!(cap("enhanced").above.unwrap().0, 400.0);
        let recs: Vec<&RunRecord> = store.records().collect();
        // Enhanced also ran (both reps) at baseline's crossing load, 800.
        let at = |m: &str, rate: f64| {
            recs.iter()
                .filter(|r| r.spec.sched == m && r.spec.rate == rate)
                .count()
        };
        assert_eq!(at("enhanced", 800.0), 2);
        // The tuner searched at 800 with seeds of its own, picked the first
        // candidate without drops (slice 1000 µs; 3000 ties, K_rcv unknown),
        // and the pick was swept with the sweep's seeds.
        let t = &out.tunes[0];
        assert_eq!(t.rate, 800.0);
        let pick = &t.rows[t.pick.unwrap()];
        assert_eq!(pick.knobs.slice_us, Some(1000));
        let sweep_seeds: Vec<u64> = recs
            .iter()
            .filter(|r| r.spec.sched == "baseline")
            .map(|r| r.spec.seed)
            .collect();
        assert!(recs
            .iter()
            .filter(|r| r.spec.sched.starts_with("tune:"))
            .all(|r| !sweep_seeds.contains(&r.spec.seed)));
        let tuned_800: Vec<u64> = recs
            .iter()
            .filter(|r| r.spec.sched == TUNED && r.spec.rate == 800.0)
            .map(|r| r.spec.seed)
            .collect();
        let base_800: Vec<u64> = recs
            .iter()
            .filter(|r| r.spec.sched == "baseline" && r.spec.rate == 800.0)
            .map(|r| r.spec.seed)
            .collect();
        assert_eq!(tuned_800.len(), 2);
        assert!(
            tuned_800.iter().all(|s| base_800.contains(s)),
            "paired seeds"
        );
        assert!(cap(TUNED).capacity_cps.unwrap() > cap("baseline").capacity_cps.unwrap());
    }

    #[test]
    fn seeds_differ_per_point_and_rep_and_not_per_mode() {
        let s = seed_for(1, 2, 1, 400.0, 0);
        assert_eq!(s, seed_for(1, 2, 1, 400.0, 0));
        let others = [
            seed_for(1, 4, 1, 400.0, 0),
            seed_for(1, 2, 2, 400.0, 0),
            seed_for(1, 2, 1, 600.0, 0),
            seed_for(1, 2, 1, 400.0, 1),
            seed_for(2, 2, 1, 400.0, 0),
        ];
        assert!(others.iter().all(|&o| o != s));
        // The old rule base + rep·1000 + rate made rep 1 at 200 cps equal to
        // rep 0 at 1200 cps.
        assert_ne!(seed_for(1, 2, 1, 200.0, 1), seed_for(1, 2, 1, 1200.0, 0));
        // The spec of every mode at a point gets the same seed.
        let c = cfg();
        let a = spec_for(
            &c,
            ProxyKind::Ringway,
            1,
            2,
            "baseline",
            Default::default(),
            400.0,
            0,
            s,
        );
        let b = spec_for(
            &c,
            ProxyKind::Kamailio,
            1,
            2,
            "enhanced",
            Default::default(),
            400.0,
            0,
            s,
        );
        assert_eq!(a.seed, b.seed);
        assert_eq!(a.gen_threads, 2);
        let mut r = cfg();
        r.rx_model = "reuseport".into();
        assert_eq!(r.gen_threads_for(2), 8);
        assert_eq!(r.gen_threads_for(16), 64);
    }

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
        // Two rates in a row without data end the step-up.
        let Search {
            below,
            above,
            probes,
        } = find_capacity(200.0, 200.0, 2000.0, 0, 0.01, |r| {
            (r < 500.0).then_some(0.0)
        });
        assert_eq!(below.unwrap().0, 400.0);
        assert!(above.is_none());
        assert_eq!(probes.len(), 4, "{probes:?}");
    }

    /// Capacity also requires failed calls under the threshold: a proxy
    /// that drops nothing but fails calls from 600 calls/s on (Kamailio's
    /// tm out of memory) crosses there, not at the top of the grid.
    #[test]
    fn capacity_stops_where_calls_fail_without_drops() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = Store::open(dir.path()).unwrap();
        let mut c = cfg();
        c.modes = vec!["baseline".into()];
        c.rate_max = 2000.0;
        c.gen_cpus = vec![*usable_cpus().last().unwrap()];
        let mut runner = |s: &RunSpec, _: &Tools| {
            let mut r = RunRecord::empty(s);
            r.pdr = 0.0;
            r.failed_ratio = if s.rate < 600.0 { 0.002 } else { 0.6 };
            r
        };
        let out = run_sweep(&c, &tools(), &mut store, &mut Quiet, &mut runner).unwrap();
        let cap = &out.caps[0];
        assert_eq!(cap.above, Some((600.0, 0.6)));
        assert_eq!(cap.below.map(|b| b.0), Some(400.0));
        assert!(!cap.censored);
    }

    #[test]
    fn point_criterion_is_the_larger_of_pdr_and_failed_calls() {
        let spec = spec_for(
            &cfg(),
            ProxyKind::Ringway,
            1,
            2,
            "baseline",
            Default::default(),
            1000.0,
            0,
            1,
        );
        let rec = |pdr: f64, failed: f64| {
            let mut r = RunRecord::empty(&spec);
            r.pdr = pdr;
            r.failed_ratio = failed;
            r
        };
        let (a, b) = (rec(0.01, 0.0), rec(0.03, 0.1));
        // Mean PDR 2 %, mean failed 5 %: 5 %.
        assert!((point_criterion(&[&a, &b]).unwrap() - 0.05).abs() < 1e-12);
        let (a, b) = (rec(0.04, 0.0), rec(0.02, 0.02));
        assert!((point_criterion(&[&a, &b]).unwrap() - 0.03).abs() < 1e-12);
        // A flagged run is left out; none valid: no value.
        let mut flagged = rec(0.5, 0.5);
        flagged.flags.push("generator fell behind".into());
        assert!((point_criterion(&[&a, &flagged]).unwrap() - 0.04).abs() < 1e-12);
        assert_eq!(point_criterion(&[&flagged]), None);
    }
}
