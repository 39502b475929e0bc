//! The estimate behind the advertisement: the proxy's capacity and the
//! share of new calls it asks conforming senders to keep, computed once per
//! period from what every worker of the pool counted (RFC 7339 §5.10 leaves
//! the algorithm to the server). Sans-IO: times and CPU times are passed in.
//!
//! - **Capacity** `C = c · s` (new calls per second the proxy completes),
//!   measured only while the CPU is saturated — the shedder's standing
//!   queue (the smallest delay of its last interval) at least half its
//!   target:
//!   - `c`, new calls per *CPU-second*: the admitted rate, corrected by the
//!     queue's growth over the period (`admitted · T / (T + Δq)`: a queue
//!     that grew by `Δq` seconds of work took that much more than was
//!     served), divided by the CPU-seconds per second the workers got in
//!     that period, smoothed (weight ¼ per 100 ms period, ~0.4 s). A period
//!     in which the workers were descheduled (another thread, the
//!     hypervisor, the timer thread's burst) served fewer calls with less
//!     CPU: `c` does not move.
//!   - `s`, the CPU-seconds per second the workers get while saturated:
//!     a hold that follows any rise at once and falls by at most the
//!     period's *fall* (below) per saturated period. A stall of 300 ms
//!     whose backlog grows takes at most 14 % off `C` for its own duration
//!     and none afterwards; a lasting loss of CPU (another process on the
//!     core) is followed within a second (0.95⁷ ≈ 0.7).
//!   - `C` itself falls by at most the same fall per saturated period
//!     (any rise at once): what the CPU normalisation cannot see — the
//!     refusals and drops of a stall's backlog eat CPU too, so fewer calls
//!     per CPU-second are admitted while it drains — is held through too.
//!   - **A fall is trusted only when the queue grows.** The fall of a
//!     saturated period is `max_fall` (5 %) when the pool's standing delay
//!     (the largest of its workers') rose since the last period by more
//!     than a tenth of the shedder's target, or stands at the target —
//!     within a quarter of it (7.5 ms of 10) or over: the shedder holds
//!     the standing delay, a minimum, just under its target while it sheds.
//!     Otherwise it is `slow_fall` (0.5 %: about 5 % a second). Fewer
//!     completions while the queue stays under the target and does not
//!     grow say that the proxy was slow (a stall of the whole machine, its
//!     senders with it) or was sent less — not that it could serve no
//!     more. With the bounded fall alone the estimate fell ~30 % within a
//!     second on the quiet machine and the three seconds under 80 % of
//!     capacity followed (docs/sip-proxy.md; that the queue did not grow
//!     then is the diagnosis, which `tests/overload_control_sim.rs`'s
//!     machine stalls reproduce). A capacity really lost makes the queue
//!     grow (the same arrivals, less served) and then stand at the target
//!     (the shedder holds it there), so the fast fall follows it.
//!
//!   Before this, `C` was the smoothed admitted rate itself: every stall of
//!   the proxy pulled it down, the advertisement over-throttled the senders
//!   for the periods the estimate took to climb back, and the goodput dipped
//!   to 70 % of the capacity in single seconds on the quiet machine
//!   (docs/sip-proxy.md). Without CPU times (a driver that passes none)
//!   `s` is 1 and `C` is that smoothed admitted rate, as before.
//!
//!   A period without a standing queue says only that the capacity is at
//!   least what was admitted: then `C` may only grow, towards the admitted
//!   rate plus 10 % (a probe, so that an estimate taken while refusals still
//!   ate CPU climbs back once they stop).
//! - **The advertised share kept** `k` (reduction `1 − k`): each period
//!   `k ← k · (C / A)^g`, where `A` is the rate of new calls that *arrived*
//!   (after the senders' throttles; not the resends of INVITEs dropped
//!   unanswered, [`super::resends`]), with gain `g` = 0.35 and at most ×1.25
//!   or ÷1.25 per period. `A = O·k` for conforming senders offering `O`, so
//!   the fixed point is `k = C / O` whatever `O` is; senders without `oc`
//!   count in `A` too, so the conforming ones are asked to make room for
//!   them (`k = (C − O_other) / O_oc`). With the senders reacting one period
//!   late the loop is `x' = x − g·(x₋₁ − x*)` in `x = ln k`, whose roots
//!   (`z² − z + g = 0`) are complex of modulus √g ≈ 0.59 at 0.35: it settles
//!   within a few periods and does not swing (`tests/overload_control_sim.rs`).
//!   In a period without a standing queue `k` never falls: the CPU had room,
//!   so more throttling would only starve it.
//!
//! **One pool per set of workers that share a queue.** Workers reading one
//! socket (`--rx-model shared`) serve one queue and the same senders, and
//! usually share cores: a sender's requests land on whichever worker reads
//! them, so it would hear each worker's advertisement in turn, and each
//! worker alone sees a capacity that swings with how the scheduler splits
//! the core between them. Their controllers therefore join one
//! [`OcPool`]: each reports its counts and its CPU time a few times per
//! period, the first report after a period's end closes it for all, and
//! every worker advertises the one `k`. Rates are summed per worker (each
//! over its own reports), so how the reports fall across a period's
//! boundary does not matter. Workers on sockets of their own
//! (`SO_REUSEPORT`) see the senders the kernel's hash sends them, each
//! its own queue: one pool each, so every sender hears the worker it
//! talks to.

use super::resends::DroppedInvites;
use crate::hash::{KeyRing, Purpose};
use serde::Serialize;
use std::collections::VecDeque;
use std::sync::{Mutex, TryLockError};

/// The knobs of the overload controller; [`OcControllerConfig::default`] is
/// what the proxy runs. Out-of-range values are clamped once, when a pool
/// is made ([`OcPool::new`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct OcControllerConfig {
    /// How often (ns) the advertisement is recomputed.
    pub period: u64,
    /// The `oc-validity` advertised (ms).
    pub validity_ms: u32,
    /// Weight of a new capacity sample (0–1).
    pub capacity_weight: f64,
    /// Gain `g` of the kept share on `ln(C / A)` per period (0–1).
    pub gain: f64,
    /// The largest factor the kept share changes by in one period (> 1).
    pub max_step: f64,
    /// How far over the admitted rate a period without a standing queue
    /// lets the capacity estimate grow (0.1: 10 %).
    pub probe: f64,
    /// Share of the capacity under which the shedder may not refuse (0–1;
    /// 0: the shedder alone decides, as before).
    pub floor: f64,
    /// The largest relative fall of the capacity estimate, and of the CPU
    /// supply behind it, per saturated period in which the queue grows or
    /// stands at the shedder's target (0–1; 1: no hold).
    pub max_fall: f64,
    /// The same while the queue stands under the target and does not grow
    /// (0–`max_fall`; `max_fall`: the rule before): the proxy completed
    /// fewer calls but nothing says it could not have served more.
    pub slow_fall: f64,
}

impl Default for OcControllerConfig {
    fn default() -> OcControllerConfig {
        OcControllerConfig {
            period: 100_000_000,
            validity_ms: super::ADVERTISED_VALIDITY_MS,
            capacity_weight: 0.25,
            gain: 0.35,
            max_step: 1.25,
            probe: 0.1,
            floor: 0.9,
            max_fall: 0.05,
            slow_fall: 0.005,
        }
    }
}

impl OcControllerConfig {
    /// Every knob in its range (the nearest sensible value; a non-finite
    /// one gets its default).
    fn clamped(self) -> OcControllerConfig {
        let defaults = OcControllerConfig::default();
        let unit = |x: f64, default: f64| {
            if x.is_finite() {
                x.clamp(0.0, 1.0)
            } else {
                default
            }
        };
        let max_fall = unit(self.max_fall, defaults.max_fall);
        OcControllerConfig {
            period: self.period.max(1),
            validity_ms: self.validity_ms.min(super::MAX_VALIDITY_MS),
            capacity_weight: unit(self.capacity_weight, defaults.capacity_weight),
            gain: unit(self.gain, defaults.gain),
            max_step: if self.max_step.is_finite() {
                self.max_step.clamp(1.0, 4.0)
            } else {
                defaults.max_step
            },
            probe: unit(self.probe, defaults.probe),
            floor: unit(self.floor, defaults.floor),
            max_fall,
            slow_fall: unit(self.slow_fall, defaults.slow_fall).min(max_fall),
        }
    }
}

/// The smallest share kept that is advertised (a reduction of 98 %): a
/// trickle of new calls still arrives, which is how the proxy sees the
/// capacity come back. Also the shedder's floor.
pub(super) const MIN_KEEP: f64 = 1.0 / 64.0;
/// The queue "grows" in a period when its standing delay rose by more than
/// the shedder's target divided by this (a tenth: 1 ms at 10 ms), not by
/// the jitter of its minimum.
const GROWTH_TOLERANCE: u64 = 10;
/// The queue stands "at the target" when its standing delay is within the
/// target divided by this of it (a quarter: 7.5 ms at 10 ms): the shedder
/// holds the standing delay, a minimum, just under its target while it
/// sheds.
const NEAR_TARGET: u64 = 4;
/// A period whose workers got less CPU than this (CPU-seconds per second)
/// gives no sample of the calls per CPU-second: too little to divide by.
const MIN_SUPPLY_SAMPLE: f64 = 0.05;

/// Periods kept in a pool's trace ([`OcPool::trace`]): five minutes of
/// 100 ms periods, about 400 KB.
pub const TRACE_PERIODS: usize = 3_000;

/// One period of a pool's estimate, as it was computed: what went in and
/// what came out ([`OcPool::trace`]; rates per second, times in ms).
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct PeriodRecord {
    /// End of the period (the driver's clock, ns).
    pub at_ns: u64,
    /// Its length (ms).
    pub elapsed_ms: f64,
    /// New calls that arrived, per second (the pool's), not counting the
    /// resends of INVITEs dropped unanswered.
    pub arrived: f64,
    /// Those resends, per second ([`super::resends`]): admitted or refused
    /// like new calls, but not counted in `arrived`.
    pub resent: f64,
    /// New calls and resends admitted, per second (may exceed `arrived`
    /// while resends come back).
    pub admitted: f64,
    /// Datagrams the workers took from their queue, per second: the work
    /// (a call is several; a refusal one or two).
    pub datagrams: f64,
    /// CPU-seconds per second the workers got (`None`: not known).
    pub supply: Option<f64>,
    /// The pool's standing delay (ms; `None`: no sample).
    pub standing_ms: Option<f64>,
    /// The shedders' target (ms).
    pub target_ms: f64,
    /// Whether the period counted as saturated.
    pub saturated: bool,
    /// Whether the queue grew or stood at the target (the fast fall).
    pub queue_grows: bool,
    /// Its sample of the new calls per CPU-second (saturated periods only).
    pub sample: Option<f64>,
    /// The smoothed calls per CPU-second after the period.
    pub per_cpu: Option<f64>,
    /// The held CPU supply (CPU-seconds per second) after it.
    pub held_supply: f64,
    /// The capacity estimate after it (calls per second).
    pub capacity: Option<f64>,
    /// The share of new calls kept after it.
    pub keep: f64,
}

/// What one worker counted since its last report.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(super) struct Report {
    /// Wall time covered (ns).
    pub elapsed: u64,
    /// New calls that arrived (not counting resends), resends of INVITEs
    /// dropped unanswered, and of both those admitted.
    pub arrived: u64,
    pub resent: u64,
    pub admitted: u64,
    /// Datagrams taken from the queue.
    pub datagrams: u64,
    /// CPU time the worker used (ns; `None`: not known).
    pub cpu: Option<u64>,
    /// The worker's shedder's standing delay (ns) and target (ns).
    pub standing: Option<u64>,
    pub target: u64,
}

/// A worker's rates over a period.
#[derive(Clone, Copy, Debug, Default)]
struct Rates {
    arrived: f64,
    resent: f64,
    admitted: f64,
    datagrams: f64,
    /// CPU-seconds per second (`None`: not known).
    supply: Option<f64>,
}

/// One worker's place in the pool.
#[derive(Clone, Debug, Default)]
struct Slot {
    /// Its reports since the pool's period began, summed.
    sum: Report,
    /// Its rates in the last period closed (used again when it sent no
    /// report in a period but is not gone).
    last: Option<Rates>,
    /// When it last reported (ns) and its last standing delay.
    reported_at: u64,
    standing: Option<u64>,
    /// Its share of the pool's arrivals in the last period (0–1).
    share: f64,
}

/// What every worker of a pool reads after its report.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct Published {
    /// The share of new calls kept (1: `oc=0`).
    pub keep: f64,
    /// The pool's capacity estimate (new calls per second).
    pub capacity: Option<f64>,
    /// The reporting worker's share of the arrivals (0–1).
    pub share: f64,
}

#[derive(Debug)]
struct Estimate {
    config: OcControllerConfig,
    slots: Vec<Slot>,
    /// Start of the current period (`None` before the first report).
    period_start: Option<u64>,
    /// New calls per CPU-second while saturated (`None`: no standing queue
    /// seen yet).
    per_cpu: Option<f64>,
    /// CPU-seconds per second the workers get while saturated (held).
    supply: f64,
    /// The capacity estimate (held: `per_cpu · supply` or, after a fall,
    /// at most `max_fall` less than the period before).
    capacity: Option<f64>,
    /// The pool's standing delay at the last period's end (ns).
    last_standing: Option<u64>,
    keep: f64,
    /// The last [`TRACE_PERIODS`] periods.
    trace: VecDeque<PeriodRecord>,
}

/// The shared estimate of a set of workers' controllers (see the module
/// documentation): one capacity, one advertised share.
#[derive(Debug)]
pub struct OcPool {
    estimate: Mutex<Estimate>,
    /// The new INVITEs the pool's workers dropped unanswered.
    dropped: DroppedInvites,
}

impl OcPool {
    /// A pool advertising nothing (`oc=0`) until it sees overload; the
    /// knobs clamped to their ranges.
    pub fn new(config: OcControllerConfig) -> OcPool {
        OcPool::with_dropped(config, DroppedInvites::new())
    }

    /// The same, with the key of its table of dropped INVITEs
    /// ([`super::resends`]) spread from `seed` instead of random: a
    /// simulation that repeats exactly.
    pub fn seeded(config: OcControllerConfig, seed: u64) -> OcPool {
        let key = KeyRing::from_seed(seed).key(Purpose::DroppedInvite);
        OcPool::with_dropped(config, DroppedInvites::keyed(key))
    }

    fn with_dropped(config: OcControllerConfig, dropped: DroppedInvites) -> OcPool {
        OcPool {
            estimate: Mutex::new(Estimate {
                config: config.clamped(),
                slots: Vec::new(),
                period_start: None,
                per_cpu: None,
                supply: 1.0,
                capacity: None,
                last_standing: None,
                keep: 1.0,
                trace: VecDeque::new(),
            }),
            dropped,
        }
    }

    /// The new INVITEs its workers dropped unanswered.
    pub(super) fn dropped(&self) -> &DroppedInvites {
        &self.dropped
    }

    /// The knobs (clamped).
    pub fn config(&self) -> OcControllerConfig {
        self.lock().config
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Estimate> {
        // A worker that panicked while reporting left counts, not broken
        // invariants: go on with them.
        self.estimate
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The last periods' estimates, oldest first (at most
    /// [`TRACE_PERIODS`]): what a benchmark reads to see why the capacity
    /// estimate moved.
    pub fn trace(&self) -> Vec<PeriodRecord> {
        self.lock().trace.iter().copied().collect()
    }

    /// A place for one more worker.
    pub(super) fn join(&self) -> usize {
        let mut estimate = self.lock();
        estimate.slots.push(Slot {
            share: 1.0,
            ..Slot::default()
        });
        estimate.slots.len() - 1
    }

    /// Worker `slot`'s counts at `now` (ns), and what it is to advertise;
    /// `None` if another worker holds the pool right now (report again
    /// later: nothing is lost).
    pub(super) fn report(&self, slot: usize, now: u64, report: Report) -> Option<Published> {
        let mut estimate = match self.estimate.try_lock() {
            Ok(estimate) => estimate,
            Err(TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
            Err(TryLockError::WouldBlock) => return None,
        };
        Some(estimate.report(slot, now, report))
    }
}

impl Estimate {
    fn report(&mut self, index: usize, now: u64, report: Report) -> Published {
        let period = self.config.period;
        let start = *self
            .period_start
            .get_or_insert(now.saturating_sub(report.elapsed));
        if let Some(slot) = self.slots.get_mut(index) {
            let sum = &mut slot.sum;
            sum.elapsed += report.elapsed;
            sum.arrived += report.arrived;
            sum.resent += report.resent;
            sum.admitted += report.admitted;
            sum.datagrams += report.datagrams;
            sum.cpu = match (sum.cpu, report.cpu) {
                (Some(a), Some(b)) => Some(a + b),
                // Unknown in any report: unknown for the period.
                _ if sum.elapsed > report.elapsed => None,
                (_, b) => b,
            };
            sum.target = report.target;
            slot.reported_at = now;
            slot.standing = report.standing;
        }
        if now.saturating_sub(start) >= period {
            self.close(now, now.saturating_sub(start));
        }
        Published {
            keep: self.keep,
            capacity: self.capacity(),
            share: self.slots.get(index).map_or(1.0, |slot| slot.share),
        }
    }

    fn capacity(&self) -> Option<f64> {
        self.capacity
    }

    /// The end of a period of `elapsed` ns at `now`: the pool's rates from
    /// every worker's, a new capacity sample and a new share kept.
    fn close(&mut self, now: u64, elapsed: u64) {
        self.period_start = Some(now);
        let period = self.config.period;
        let mut total = Rates {
            supply: Some(0.0),
            ..Rates::default()
        };
        let mut standing: Option<u64> = None;
        let mut target = 0;
        let mut per_worker = Vec::with_capacity(self.slots.len());
        for slot in &mut self.slots {
            let alive = now.saturating_sub(slot.reported_at) <= 2 * period;
            let rates = if slot.sum.elapsed > 0 {
                let secs = slot.sum.elapsed as f64 / 1e9;
                let rates = Rates {
                    arrived: slot.sum.arrived as f64 / secs,
                    resent: slot.sum.resent as f64 / secs,
                    admitted: slot.sum.admitted as f64 / secs,
                    datagrams: slot.sum.datagrams as f64 / secs,
                    supply: slot.sum.cpu.map(|cpu| cpu as f64 / 1e9 / secs),
                };
                slot.last = Some(rates);
                Some(rates)
            } else if alive {
                slot.last
            } else {
                slot.last = None;
                None
            };
            target = target.max(slot.sum.target);
            slot.sum = Report::default();
            // Its share of the new INVITEs it took up, resends included
            // (its floor counts admitted resends too).
            per_worker.push(rates.map_or(0.0, |r| r.arrived + r.resent));
            if let Some(rates) = rates {
                total.arrived += rates.arrived;
                total.resent += rates.resent;
                total.admitted += rates.admitted;
                total.datagrams += rates.datagrams;
                total.supply = total.supply.zip(rates.supply).map(|(a, b)| a + b);
            }
            if alive {
                standing = standing.max(slot.standing);
            }
        }
        for (slot, arrived) in self.slots.iter_mut().zip(per_worker) {
            let pool_arrived = total.arrived + total.resent;
            slot.share = if pool_arrived > 0.0 {
                arrived / pool_arrived
            } else {
                1.0
            };
        }
        self.update(now, elapsed, total, standing, target);
    }

    /// The estimate and the share kept after a period of `elapsed` ns
    /// ending at `now` with the pool's `rates`, its standing delay
    /// `standing` and the shedders' `target`, recorded in the trace.
    fn update(&mut self, now: u64, elapsed: u64, rates: Rates, standing: Option<u64>, target: u64) {
        let (saturated, queue_grows, sample) = self.estimate(elapsed, rates, standing, target);
        if self.trace.len() == TRACE_PERIODS {
            self.trace.pop_front();
        }
        let ms = |ns: u64| ns as f64 / 1e6;
        self.trace.push_back(PeriodRecord {
            at_ns: now,
            elapsed_ms: ms(elapsed),
            arrived: rates.arrived,
            resent: rates.resent,
            admitted: rates.admitted,
            datagrams: rates.datagrams,
            supply: rates.supply,
            standing_ms: standing.map(ms),
            target_ms: ms(target),
            saturated,
            queue_grows,
            sample,
            per_cpu: self.per_cpu,
            held_supply: self.supply,
            capacity: self.capacity,
            keep: self.keep,
        });
    }

    /// [`Estimate::update`]'s computation; returns whether the period was
    /// saturated, whether the queue grew, and its sample of the calls per
    /// CPU-second.
    fn estimate(
        &mut self,
        elapsed: u64,
        rates: Rates,
        standing: Option<u64>,
        target: u64,
    ) -> (bool, bool, Option<f64>) {
        let OcControllerConfig {
            period,
            capacity_weight: weight,
            gain,
            max_step,
            probe,
            max_fall,
            slow_fall,
            ..
        } = self.config;
        let secs = elapsed as f64 / 1e9;
        let growth = match (standing, self.last_standing) {
            (Some(current), Some(before)) => (current as f64 - before as f64) / 1e9,
            _ => 0.0,
        };
        // A fall is trusted only when the queue says the proxy could not
        // keep up: it grew, or it stands at the target (within a quarter
        // of it: the shedder holds it just under).
        let grew = standing
            .zip(self.last_standing)
            .is_some_and(|(current, before)| {
                current.saturating_sub(before) > target / GROWTH_TOLERANCE
            });
        let queue_grows = grew || standing.is_some_and(|q| q >= target - target / NEAR_TARGET);
        self.last_standing = standing;
        // A period much longer than the knob was mostly silence: its
        // standing delay is older than its few arrivals.
        let recent = elapsed <= 2 * period;
        let saturated = recent && standing.is_some_and(|q| q >= target / 2);
        let fall = if queue_grows { max_fall } else { slow_fall };
        let mut sample = None;
        if saturated {
            // Saturated: what was served is the capacity, per CPU-second
            // the workers had.
            let served = rates.admitted * (secs / (secs + growth).max(secs / 2.0)).clamp(0.5, 2.0);
            let supply = rates.supply.unwrap_or(1.0);
            if supply >= MIN_SUPPLY_SAMPLE {
                let per_cpu = served / supply;
                sample = Some(per_cpu);
                self.per_cpu = Some(match self.per_cpu {
                    None => {
                        self.supply = supply;
                        per_cpu
                    }
                    Some(c) => c + weight * (per_cpu - c),
                });
                self.supply = supply.max(self.supply * (1.0 - fall));
            }
        } else if let Some(held) = self.capacity {
            // Not saturated: at least what was admitted (and a probe).
            let at_least = rates.admitted * (1.0 + probe);
            if at_least > held {
                self.per_cpu = Some((held + weight * (at_least - held)) / self.supply);
            }
        }
        // The estimate: any rise at once; a fall (saturated periods only)
        // by at most `fall` per period, so a dip of the smoothed rate
        // shorter than a few periods (refusals eating CPU in a stall) is
        // held through, and one the queue does not confirm barely moves it.
        let Some(measured) = self.per_cpu.map(|c| c * self.supply) else {
            return (saturated, queue_grows, sample);
        };
        let capacity = match self.capacity {
            Some(held) if saturated => measured.max(held * (1.0 - fall)),
            Some(held) => measured.max(held),
            None => measured,
        };
        self.capacity = Some(capacity);
        let factor = if rates.arrived <= 0.0 {
            max_step
        } else {
            (capacity / rates.arrived).powf(gain)
        };
        let factor = if factor.is_finite() {
            factor.clamp(1.0 / max_step, max_step)
        } else {
            max_step
        };
        // The CPU had room: asking the senders for more would only starve
        // it (the capacity estimate grows instead, by the probe).
        let factor = if saturated { factor } else { factor.max(1.0) };
        self.keep = (self.keep * factor).clamp(MIN_KEEP, 1.0);
        (saturated, queue_grows, sample)
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    const MS: u64 = 1_000_000;
    const TARGET: u64 = 10 * MS;

    fn report(arrived: u64, admitted: u64, cpu_ms: Option<u64>, standing: u64) -> Report {
        Report {
            elapsed: 100 * MS,
            arrived,
            resent: 0,
            admitted,
            datagrams: 6 * admitted + arrived.saturating_sub(admitted),
            cpu: cpu_ms.map(|ms| ms * MS),
            standing: Some(standing),
            target: TARGET,
        }
    }

    /// A worker descheduled for 30 % of a period serves 30 % fewer calls
    /// with 30 % less CPU, its queue at the target: the capacity falls by
    /// the bounded 5 % only, and
    /// is back at once. Without CPU times the same period pulls the
    /// smoothed rate down by a quarter of the dip (the estimate before
    /// this change), held at the same 5 %, but it stays down afterwards.
    #[test]
    fn a_stall_lowers_the_capacity_by_the_bounded_fall_only() {
        for cpu in [true, false] {
            let pool = OcPool::new(OcControllerConfig::default());
            let w = pool.join();
            let cpu_ms = |ms| cpu.then_some(ms);
            let mut now = 0;
            for _ in 0..10 {
                now += 100 * MS;
                pool.report(w, now, report(3_000, 2_000, cpu_ms(100), 10 * MS));
            }
            let before = pool.lock().capacity().unwrap();
            assert!((before - 20_000.0).abs() < 1.0, "{before}");
            // One more period: its capacity estimate.
            let mut period = |admitted, cpu| {
                now += 100 * MS;
                let published = pool.report(w, now, report(3_000, admitted, cpu, 10 * MS));
                published.unwrap().capacity.unwrap()
            };
            let during = period(1_400, cpu_ms(70));
            let after = period(2_000, cpu_ms(100));
            if cpu {
                assert!((during - 19_000.0).abs() < 1.0, "{during}");
                assert!((after - 20_000.0).abs() < 1.0, "{after}");
            } else {
                assert!((during - 19_000.0).abs() < 1.0, "{during}");
                assert!((after - 18_875.0).abs() < 1.0, "{after}");
            }
        }
    }

    /// The capacity after ten saturated periods of 2 000 calls admitted in
    /// 100 ms with the whole CPU (20 000/s), then one period per standing
    /// delay in `standing` (ms) with 1 400 admitted and `cpu_ms` of CPU.
    fn capacity_after(cpu_ms: Option<u64>, standing: &[f64]) -> f64 {
        let pool = OcPool::new(OcControllerConfig::default());
        let w = pool.join();
        let mut now = 0;
        let before = cpu_ms.map(|_| 100);
        for _ in 0..10 {
            now += 100 * MS;
            pool.report(w, now, report(3_000, 2_000, before, 6 * MS));
        }
        let mut capacity = None;
        for &delay in standing {
            now += 100 * MS;
            let standing = (delay * MS as f64) as u64;
            let published = pool.report(w, now, report(3_000, 1_400, cpu_ms, standing));
            capacity = published.unwrap().capacity;
        }
        capacity.unwrap()
    }

    /// 30 % fewer calls completed for 400 ms, with or without CPU times
    /// that see it: while the queue stands under ¾ of the target and grows
    /// by no more than a tenth of it per period, the estimate falls by
    /// 0.5 % a period; a period in which the queue grows, or stands within
    /// a quarter of the target or over it, lets it fall by the bounded 5 %.
    #[test]
    fn the_capacity_falls_fast_only_when_the_queue_grows() {
        const SLOW: f64 = 0.995;
        const FAST: f64 = 0.95;
        for cpu_ms in [Some(70), Some(100), None] {
            for (standing, falls) in [
                // Steady, or growing by 1 ms a period or less, under ¾ of
                // the target.
                ([6.0, 6.0, 6.0, 6.0], [SLOW; 4]),
                ([6.0, 6.9, 7.0, 7.4], [SLOW; 4]),
                ([7.0, 7.4, 7.4, 7.4], [SLOW; 4]),
                // Growing by 1.2 ms in one period.
                ([6.0, 7.2, 7.4, 7.4], [SLOW, FAST, SLOW, SLOW]),
                // Within a quarter of the target, or at it.
                ([7.0, 7.4, 7.9, 7.9], [SLOW, SLOW, FAST, FAST]),
                ([6.0, 10.0, 10.0, 10.0], [SLOW, FAST, FAST, FAST]),
            ] {
                let expected = 20_000.0 * falls.iter().product::<f64>();
                let capacity = capacity_after(cpu_ms, &standing);
                assert!(
                    (capacity - expected).abs() < 1.0,
                    "CPU {cpu_ms:?}, standing {standing:?}: {capacity}"
                );
            }
        }
    }

    /// A lasting loss of CPU is followed: 30 % less for a second brings
    /// the estimate within 5 % of the new capacity.
    #[test]
    fn a_lasting_loss_of_cpu_is_followed_within_a_second() {
        let pool = OcPool::new(OcControllerConfig::default());
        let w = pool.join();
        let mut now = 0;
        for _ in 0..10 {
            now += 100 * MS;
            pool.report(w, now, report(3_000, 2_000, Some(100), 10 * MS));
        }
        let mut capacity = Vec::new();
        for _ in 0..10 {
            now += 100 * MS;
            let published = pool.report(w, now, report(3_000, 1_400, Some(70), 10 * MS));
            capacity.push(published.unwrap().capacity.unwrap() as u64);
        }
        assert!(capacity[9] <= 14_700, "{capacity:?}");
        assert!(capacity[2] >= 17_000, "{capacity:?}");
    }

    /// Two workers on one core reading one socket: however the scheduler
    /// splits the core between them, the pool's capacity is the sum, both
    /// advertise the same share, and each one's share of the arrivals is
    /// its part.
    #[test]
    fn two_workers_sharing_a_core_have_one_capacity_and_one_advertisement() {
        let pool = OcPool::new(OcControllerConfig::default());
        let (a, b) = (pool.join(), pool.join());
        let mut now = 0;
        let mut keep = 1.0;
        let mut published = Vec::new();
        // 45 000 new calls/s offered, the kept share arrives (split as the
        // CPU is); 20 000/s served with the whole core, 70/30 one period
        // and 30/70 the next. Worker b reports 50 ms after a.
        let one = |share: u64, keep: f64| {
            let arrived = (45.0 * share as f64 * keep) as u64;
            report(arrived, (20 * share).min(arrived), Some(share), 10 * MS)
        };
        for i in 0..40u64 {
            let (share_a, share_b) = if i % 2 == 0 { (70, 30) } else { (30, 70) };
            for (worker, share) in [(a, share_a), (b, share_b)] {
                now += 50 * MS;
                let p = pool.report(worker, now, one(share, keep)).unwrap();
                keep = p.keep;
                published.push(p);
            }
        }
        let last = &published[published.len() - 10..];
        for p in last {
            let capacity = p.capacity.unwrap();
            assert!((capacity - 20_000.0).abs() < 200.0, "{p:?}");
            assert!((p.keep - 2.0 / 4.5).abs() < 0.02, "{p:?}");
        }
        // Each one's part of the arrivals follows its part of the core.
        let share = pool.lock().slots[a].share;
        assert!(
            (share - 0.3).abs() < 0.02 || (share - 0.7).abs() < 0.02,
            "{share}"
        );
    }

    /// The trace holds each period's inputs and results, oldest first, and
    /// at most [`TRACE_PERIODS`] of them.
    #[test]
    fn the_trace_records_every_period_and_is_bounded() {
        let pool = OcPool::new(OcControllerConfig::default());
        let w = pool.join();
        let mut now = 0;
        let mut next = |pool: &OcPool, standing| {
            now += 100 * MS;
            pool.report(w, now, report(3_000, 2_000, Some(100), standing));
        };
        next(&pool, 10 * MS);
        next(&pool, MS);
        let trace = pool.trace();
        assert_eq!(trace.len(), 2, "{trace:?}");
        let close = |a: f64, b: f64| (a - b).abs() < 1e-6 * b.abs().max(1.0);
        let first = trace[0];
        assert_eq!(first.at_ns, 100 * MS);
        assert!(close(first.elapsed_ms, 100.0), "{first:?}");
        assert!(close(first.arrived, 30_000.0) && close(first.admitted, 20_000.0));
        assert!(close(first.datagrams, 130_000.0), "{first:?}");
        assert!(close(first.supply.unwrap(), 1.0), "{first:?}");
        assert_eq!((first.standing_ms, first.target_ms), (Some(10.0), 10.0));
        assert!(first.saturated && first.queue_grows, "{first:?}");
        assert!(close(first.sample.unwrap(), 20_000.0), "{first:?}");
        assert!(close(first.capacity.unwrap(), 20_000.0), "{first:?}");
        // (2/3)^0.35
        assert!((first.keep - 0.867_697).abs() < 1e-5, "{first:?}");
        // A period without a standing queue: no sample; the estimate moves
        // a quarter of the way to the admitted rate plus 10 %, the share
        // kept does not fall.
        let second = trace[1];
        assert!(!second.saturated && second.sample.is_none(), "{second:?}");
        assert_eq!(second.at_ns, 200 * MS);
        assert!(close(second.capacity.unwrap(), 20_500.0), "{second:?}");
        assert_eq!(second.keep, first.keep);
        for _ in 0..TRACE_PERIODS + 5 {
            next(&pool, 10 * MS);
        }
        let trace = pool.trace();
        assert_eq!(trace.len(), TRACE_PERIODS);
        assert_eq!(trace[0].at_ns, 8 * 100 * MS);
        assert_eq!(
            trace[TRACE_PERIODS - 1].at_ns,
            (TRACE_PERIODS as u64 + 7) * 100 * MS
        );
    }

    /// Every knob out of its range (the controller's tests use it too).
    pub(in crate::overload_control) fn out_of_range() -> OcControllerConfig {
        OcControllerConfig {
            period: 0,
            validity_ms: u32::MAX,
            capacity_weight: f64::NAN,
            gain: 7.0,
            max_step: f64::INFINITY,
            probe: -1.0,
            floor: 2.0,
            max_fall: 0.5,
            slow_fall: f64::NAN,
        }
    }

    #[test]
    fn knobs_are_clamped_once() {
        let k = OcPool::new(out_of_range()).config();
        assert_eq!(k.period, 1);
        assert_eq!(k.validity_ms, crate::overload_control::MAX_VALIDITY_MS);
        assert_eq!(k.capacity_weight, 0.25);
        assert_eq!(
            (k.gain, k.max_step, k.probe, k.floor),
            (1.0, 1.25, 0.0, 1.0)
        );
        // The slow fall: its default, and never faster than the bounded one.
        assert_eq!((k.max_fall, k.slow_fall), (0.5, 0.005));
        let defaults = OcControllerConfig::default();
        let k = OcPool::new(OcControllerConfig {
            max_fall: f64::NAN,
            slow_fall: 0.2,
            ..defaults
        })
        .config();
        assert_eq!((k.max_fall, k.slow_fall), (0.05, 0.05));
        assert_eq!(OcPool::new(defaults).config(), defaults);
    }
}
