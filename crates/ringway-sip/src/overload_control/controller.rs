//! The server side's controller of the advertised reduction (RFC 7339
//! §5.10 leaves the algorithm to the server): one per worker, sans-IO.
//!
//! The first version advertised the admission controller's own refused
//! share (`1 − f`, [`crate::overload::Shedder`]). Conforming senders then
//! passed `f` of their calls and the proxy admitted `f` of those: two
//! multiplicative stages driven by the same queue, an integrator behind an
//! integrator. When the shedder cut, the arrivals fell by `f²`, the queue
//! emptied, the shedder opened up (×2 with no queue at all), and the senders'
//! load came back at once: on the quiet machine the admitted fraction swung
//! 0.37–0.76 and the advertised reduction 24–62 % from second to second
//! (docs/sip-proxy.md).
//!
//! [`OcController`] instead advertises what the measured capacity asks
//! for, and lets the shedder deal only with the excess:
//!
//! - **Capacity** `C` (new calls per second the worker completes): measured
//!   only while the CPU is saturated — the shedder's standing queue (the
//!   smallest delay of its last interval) at least half its target — as the
//!   admitted rate corrected by the queue's growth over the period
//!   (`admitted · T / (T + Δq)`: a queue that grew by `Δq` seconds of work
//!   took that much more than was served), smoothed (weight ¼ per 100 ms
//!   period, ~0.4 s). A period without a standing queue says only that the
//!   capacity is at least what was admitted: then `C` may only grow, towards
//!   the admitted rate plus 10 % (a probe, so that an estimate taken while
//!   refusals still ate CPU climbs back once they stop).
//! - **The advertised share kept** `k` (reduction `1 − k`): each period
//!   `k ← k · (C / A)^g`, where `A` is the rate of new calls that *arrived*
//!   (after the senders' throttles), with gain `g` = 0.35 and at most ×1.25
//!   or ÷1.25 per period. `A = O·k` for conforming senders offering `O`, so
//!   the fixed point is `k = C / O` whatever `O` is; senders without `oc`
//!   count in `A` too, so the conforming ones are asked to make room for
//!   them (`k = (C − O_other) / O_oc`). No estimate of the senders' own
//!   offered load is needed. With the senders reacting one period late the
//!   loop is `x' = x − g·(x₋₁ − x*)` in `x = ln k`, whose roots
//!   (`z² − z + g = 0`) are real and under 1 for `g` ≤ ¼ and complex of
//!   modulus √g ≈ 0.59 at 0.35: it settles within a few periods and does
//!   not swing (`tests/overload_control_sim.rs`). In a period without a
//!   standing queue `k` never falls: the CPU had room, so more throttling
//!   would only starve it (arrivals over `C` there mean `C` is low, and the
//!   probe raises it); at an overload's start the retransmissions of
//!   INVITEs dropped in its first moments otherwise pushed `k` well under
//!   `C / O`.
//! - **A floor for the shedder** ([`OcController::overrides_refusal`]):
//!   while `C` is known and the queue is under the shedder's target, the
//!   shedder may refuse a new call only once this worker admitted 90 % of
//!   `C` (a token bucket filled at `0.9·C`, one token per admitted call).
//!   That is exactly where the two stages fought: after one of the
//!   shedder's cuts the conforming senders' load dipped too, the queue
//!   emptied, and the shedder went on refusing calls the CPU had room for.
//!   A queue over the target is the shedder's alone: a flood from senders
//!   that ignore the advertisement, or claim `oc` and do not throttle, is
//!   shed as before (with the floor there, a fluid model of such a flood
//!   kept the queue at the drop bound and lost a third of the goodput).
//!
//! No standing queue ever seen: no capacity, `k` = 1, `oc=0`. When the
//! overload ends `A` falls under `C` and `k` grows back to 1 by ×1.25 per
//! period (from ⅓: five periods).

use super::OcAdvert;

/// The knobs of [`OcController`]; [`OcControllerConfig::default`] is what
/// the proxy runs.
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
        }
    }
}

/// The smallest share kept that is advertised (a reduction of 98 %): a
/// trickle of new calls still arrives, which is how the proxy sees the
/// capacity come back. Also the shedder's floor.
const MIN_KEEP: f64 = 1.0 / 64.0;
/// The floor's bucket holds at most this much time of the floor's rate
/// (ns): idle time does not store up admissions.
const FLOOR_BURST_NS: f64 = 5e6;

/// The advertisement's controller of one worker; see the module
/// documentation.
#[derive(Clone, Debug)]
pub struct OcController {
    config: OcControllerConfig,
    /// Start of the current period (`None` before the first tick).
    period_start: Option<u64>,
    /// New calls that arrived and were admitted in the current period.
    arrived: u64,
    admitted: u64,
    /// Capacity estimate (new calls per second); `None` until a standing
    /// queue was seen.
    capacity: Option<f64>,
    /// The shedder's standing delay at the last period's end (ns).
    last_standing: Option<u64>,
    /// The advertised share kept (1: `oc=0`).
    keep: f64,
    /// Pinned share (lab knob): periods change nothing.
    pinned: bool,
    /// The floor's token bucket (calls) and when it was last filled (ns).
    tokens: f64,
    filled_at: u64,
    /// The shedder's set point (ns), from the last tick.
    target: u64,
}

impl OcController {
    /// A controller advertising nothing (`oc=0`) until it sees overload.
    /// Out-of-range knobs are clamped to the nearest sensible value.
    pub fn new(config: OcControllerConfig) -> OcController {
        let unit = |x: f64, default: f64| {
            if x.is_finite() {
                x.clamp(0.0, 1.0)
            } else {
                default
            }
        };
        let defaults = OcControllerConfig::default();
        OcController {
            config: OcControllerConfig {
                period: config.period.max(1),
                validity_ms: config.validity_ms.min(super::MAX_VALIDITY_MS),
                capacity_weight: unit(config.capacity_weight, defaults.capacity_weight),
                gain: unit(config.gain, defaults.gain),
                max_step: if config.max_step.is_finite() {
                    config.max_step.clamp(1.0, 4.0)
                } else {
                    defaults.max_step
                },
                probe: unit(config.probe, defaults.probe),
                floor: unit(config.floor, defaults.floor),
            },
            period_start: None,
            arrived: 0,
            admitted: 0,
            capacity: None,
            last_standing: None,
            keep: 1.0,
            pinned: false,
            tokens: 0.0,
            filled_at: 0,
            target: 0,
        }
    }

    /// Lab and test knob: advertise keeping `ppm` millionths of the new
    /// calls whatever the load (at least 1/64), with no floor: what a
    /// shedder pinned with [`crate::overload::Shedder::pin`] refuses.
    pub fn pin(&mut self, ppm: u32) {
        self.keep = (f64::from(ppm.min(1_000_000)) / 1e6).max(MIN_KEEP);
        self.pinned = true;
    }

    /// The knobs.
    pub fn config(&self) -> OcControllerConfig {
        self.config
    }

    /// One new call (a new INVITE) arrived at `now` (ns): `admitted` if
    /// the proxy took it on, `false` if it was refused or dropped.
    pub fn count_new_call(&mut self, now: u64, admitted: bool) {
        self.arrived += 1;
        if admitted {
            self.admitted += 1;
            self.fill(now);
            self.tokens = (self.tokens - 1.0).max(0.0);
        }
    }

    /// Whether a new call the shedder refuses at `now`, after waiting
    /// `delay` ns in the queue, is to be admitted anyway: the wait is under
    /// the shedder's target and this worker admitted less than the floor
    /// (`floor · C`) so far. Counting it ([`OcController::count_new_call`])
    /// takes its token.
    pub fn overrides_refusal(&mut self, now: u64, delay: u64) -> bool {
        self.fill(now);
        delay < self.target && self.tokens >= 1.0
    }

    /// Fill the floor's bucket up to `now`.
    fn fill(&mut self, now: u64) {
        let elapsed = now.saturating_sub(self.filled_at);
        self.filled_at = self.filled_at.max(now);
        let Some(capacity) = self.capacity.filter(|_| !self.pinned) else {
            self.tokens = 0.0;
            return;
        };
        let rate = capacity * self.config.floor / 1e9;
        let burst = (rate * FLOOR_BURST_NS).max(1.0);
        self.tokens = (self.tokens + elapsed as f64 * rate).min(burst);
    }

    /// Call with every datagram (or at least once a period): at the end of
    /// a period, a new capacity sample and a new advertisement. `standing`
    /// is the admission controller's standing delay (ns: the smallest
    /// delay of its last interval; `None`: no sample yet) and `target` its
    /// set point ([`crate::overload::Shedder::standing_delay`],
    /// [`crate::overload::ShedConfig::target`]).
    pub fn tick(&mut self, now: u64, standing: Option<u64>, target: u64) {
        self.target = target;
        let start = *self.period_start.get_or_insert(now);
        let elapsed = now.saturating_sub(start);
        if elapsed < self.config.period {
            return;
        }
        self.period_start = Some(now);
        let (arrived, admitted) = (self.arrived, self.admitted);
        self.arrived = 0;
        self.admitted = 0;
        if self.pinned {
            return;
        }
        let secs = elapsed as f64 / 1e9;
        let arrival_rate = arrived as f64 / secs;
        let admitted_rate = admitted as f64 / secs;
        let growth = match (standing, self.last_standing) {
            (Some(current), Some(before)) => (current as f64 - before as f64) / 1e9,
            _ => 0.0,
        };
        self.last_standing = standing;
        let OcControllerConfig {
            capacity_weight: weight,
            gain,
            max_step,
            probe,
            ..
        } = self.config;
        // A period much longer than the knob was mostly silence: its
        // standing delay is older than its few arrivals.
        let recent = elapsed <= 2 * self.config.period;
        let saturated = recent && standing.is_some_and(|q| q >= target / 2);
        if saturated {
            // Saturated: what was served is the capacity.
            let served = admitted_rate * (secs / (secs + growth).max(secs / 2.0)).clamp(0.5, 2.0);
            self.capacity = Some(match self.capacity {
                None => served,
                Some(c) => c + weight * (served - c),
            });
        } else if let Some(c) = self.capacity {
            // Not saturated: at least what was admitted (and a probe).
            let at_least = admitted_rate * (1.0 + probe);
            if at_least > c {
                self.capacity = Some(c + weight * (at_least - c));
            }
        }
        let Some(capacity) = self.capacity else {
            return;
        };
        let factor = if arrived == 0 {
            max_step
        } else {
            (capacity / arrival_rate).powf(gain)
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
    }

    /// The capacity estimate (new calls per second; `None`: no overload
    /// seen yet).
    pub fn capacity(&self) -> Option<f64> {
        self.capacity.filter(|_| !self.pinned)
    }

    /// The advertised share of new calls kept, in millionths (1 000 000:
    /// no reduction).
    pub fn kept_ppm(&self) -> u32 {
        (self.keep * 1e6).round() as u32
    }

    /// The advertisement at `now_ns` (realtime, for `oc-seq`).
    pub fn advert(&self, now_ns: u64) -> OcAdvert {
        OcAdvert::from_admitted_ppm(self.kept_ppm(), self.config.validity_ms, now_ns)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;
    const TARGET: u64 = 10 * MS;

    /// One 100 ms period at `start` with `arrived` new calls of which
    /// `admitted` were taken, ending with standing delay `standing`.
    fn period(c: &mut OcController, start: u64, arrived: u64, admitted: u64, standing: u64) {
        c.tick(start, Some(standing), TARGET);
        for i in 0..arrived {
            c.count_new_call(start + i, i < admitted);
        }
    }

    #[test]
    fn without_a_standing_queue_nothing_is_advertised() {
        let mut c = OcController::new(OcControllerConfig::default());
        for k in 0..50 {
            period(&mut c, k * 100 * MS, 5_000, 5_000, 4 * MS);
        }
        assert_eq!(c.capacity(), None);
        assert_eq!(c.advert(0).reduction(), 0);
        assert!(!c.overrides_refusal(5_000 * MS, 0));
    }

    #[test]
    fn a_saturated_period_measures_the_capacity_and_the_reduction_follows_it() {
        let mut c = OcController::new(OcControllerConfig::default());
        period(&mut c, 0, 3_000, 1_000, 10 * MS);
        // Saturated, queue steady: 1 000 calls in 100 ms = 10 000/s.
        period(&mut c, 100 * MS, 3_000, 1_000, 10 * MS);
        c.tick(200 * MS, Some(10 * MS), TARGET);
        let capacity = c.capacity().unwrap();
        assert!((capacity - 10_000.0).abs() < 1.0, "{capacity}");
        // Twice 30 000/s arrived for 10 000/s: (1/3)^0.35 = 0.68 each time,
        // bounded by 1/1.25.
        assert_eq!(c.kept_ppm(), 640_000);
        // 15 000 admitted in a period in which the queue grew by 50 ms of
        // work: 2/3 of it served, the estimate stays.
        period(&mut c, 200 * MS, 1_500, 1_500, 10 * MS);
        c.tick(300 * MS, Some(60 * MS), TARGET);
        let capacity = c.capacity().unwrap();
        assert!((capacity - 10_000.0).abs() < 1.0, "{capacity}");
        // A period without a standing queue does not lower it; one that
        // admitted more raises it towards that plus 10 %.
        period(&mut c, 300 * MS, 500, 500, 60 * MS);
        c.tick(400 * MS, Some(MS), TARGET);
        assert!((c.capacity().unwrap() - 10_000.0).abs() < 1.0);
        period(&mut c, 400 * MS, 1_200, 1_200, MS);
        c.tick(500 * MS, Some(MS), TARGET);
        let capacity = c.capacity().unwrap();
        assert!((capacity - 10_800.0).abs() < 1.0, "{capacity}");
    }

    #[test]
    fn the_share_kept_settles_where_the_arrivals_meet_the_capacity_and_returns_to_one() {
        let mut c = OcController::new(OcControllerConfig::default());
        // Senders offering 30 000/s obey at once; the proxy serves
        // 10 000/s with a standing queue while it is offered more.
        let mut t = 0;
        let mut reductions = Vec::new();
        for _ in 0..50 {
            let arrived = (3_000.0 * c.keep) as u64;
            let admitted = arrived.min(1_000);
            let standing = if arrived >= 1_000 { 10 * MS } else { 0 };
            period(&mut c, t, arrived, admitted, standing);
            t += 100 * MS;
            reductions.push(c.advert(0).reduction());
        }
        let last = &reductions[30..];
        assert!(
            last.iter().all(|&r| (64..=67).contains(&r)),
            "{reductions:?}"
        );
        // The offered load falls to 5 000/s: no reduction within 6 periods.
        for _ in 0..6 {
            let arrived = (500.0 * c.keep) as u64;
            period(&mut c, t, arrived, arrived, 0);
            t += 100 * MS;
        }
        assert_eq!(c.advert(0).reduction(), 0);
    }

    #[test]
    fn the_floor_admits_up_to_nine_tenths_of_the_capacity_and_no_more() {
        let mut c = OcController::new(OcControllerConfig::default());
        period(&mut c, 0, 3_000, 1_000, 10 * MS);
        period(&mut c, 100 * MS, 3_000, 1_000, 10 * MS);
        c.tick(200 * MS, Some(10 * MS), TARGET);
        // 10 000/s: 9 000/s of floor. A shedder refusing everything for
        // 100 ms, one new call every 10 µs (100 000/s): 900 overridden, and
        // the bucket's 5 ms (45) it starts with.
        let mut admitted = 0;
        for i in 0..10_000u64 {
            let now = 200 * MS + i * 10_000;
            let take = c.overrides_refusal(now, MS);
            c.count_new_call(now, take);
            admitted += u64::from(take);
        }
        assert!((943..=946).contains(&admitted), "{admitted}");
        // Not once the queue is at the target: that is the shedder's.
        assert!(!c.overrides_refusal(300 * MS, TARGET));
        // A shedder admitting 10 000/s itself: the floor adds nothing.
        let mut overridden = 0;
        for i in 0..10_000u64 {
            let now = 300 * MS + i * 10_000;
            let shedder_admits = i % 10 == 0;
            let take = !shedder_admits && c.overrides_refusal(now, MS);
            c.count_new_call(now, shedder_admits || take);
            overridden += u64::from(take);
        }
        assert_eq!(overridden, 0);
    }

    #[test]
    fn a_pinned_share_is_advertised_without_a_floor_and_bad_knobs_are_clamped() {
        let mut c = OcController::new(OcControllerConfig::default());
        c.pin(250_000);
        period(&mut c, 0, 3_000, 1_000, 10 * MS);
        period(&mut c, 100 * MS, 3_000, 1_000, 10 * MS);
        assert_eq!(c.advert(0).reduction(), 75);
        assert!(!c.overrides_refusal(300 * MS, 0));
        let c = OcController::new(OcControllerConfig {
            period: 0,
            validity_ms: u32::MAX,
            capacity_weight: f64::NAN,
            gain: 7.0,
            max_step: f64::INFINITY,
            probe: -1.0,
            floor: 2.0,
        });
        let k = c.config();
        assert_eq!(k.period, 1);
        assert_eq!(k.validity_ms, crate::overload_control::MAX_VALIDITY_MS);
        assert_eq!(k.capacity_weight, 0.25);
        assert_eq!(
            (k.gain, k.max_step, k.probe, k.floor),
            (1.0, 1.25, 0.0, 1.0)
        );
    }
}
