//! The server side's controller of the advertised reduction, one handle
//! per worker, sans-IO: it counts the worker's new calls, reports them and
//! the worker's CPU time to its [`OcPool`] a few times per period (the
//! capacity and the share kept are computed there: see [`OcPool`]),
//! and runs the shedder's floor.
//!
//! The first version advertised the admission controller's own refused
//! share (`1 − f`, [`crate::overload::Shedder`]). Conforming senders then
//! passed `f` of their calls and the proxy admitted `f` of those: two
//! multiplicative stages driven by the same queue, an integrator behind an
//! integrator. When the shedder cut, the arrivals fell by `f²`, the queue
//! emptied, the shedder opened up (×2 with no queue at all), and the senders'
//! load came back at once: on the quiet machine the admitted fraction swung
//! 0.37–0.76 and the advertised reduction 24–62 % from second to second
//! (docs/sip-proxy.md). The advertisement now follows the measured
//! capacity, and the shedder deals only with the excess:
//!
//! **A floor for the shedder** ([`OcController::overrides_refusal`]): while
//! `C` is known and the queue is under the shedder's target, the shedder
//! may refuse a new call only once this worker admitted 90 % of its part of
//! `C` (a token bucket filled at `0.9·C` times the worker's share of the
//! pool's arrivals, one token per admitted call). That is exactly where the
//! two stages fought: after one of the shedder's cuts the conforming
//! senders' load dipped too, the queue emptied, and the shedder went on
//! refusing calls the CPU had room for. A queue over the target is the
//! shedder's alone: a flood from senders that ignore the advertisement, or
//! claim `oc` and do not throttle, is shed as before (with the floor there,
//! a fluid model of such a flood kept the queue at the drop bound and lost
//! a third of the goodput).
//!
//! No standing queue ever seen: no capacity, `k` = 1, `oc=0`. When the
//! overload ends `A` falls under `C` and `k` grows back to 1 by ×1.25 per
//! period (from ⅓: five periods).

use super::pool::{OcControllerConfig, OcPool, Published, Report, MIN_KEEP};
use super::OcAdvert;
use std::sync::Arc;

/// The floor's bucket holds at most this much time of the floor's rate
/// (ns): idle time does not store up admissions.
const FLOOR_BURST_NS: f64 = 5e6;
/// Reports per period: enough that every worker's counts reach each
/// period however the workers' phases fall.
const REPORTS_PER_PERIOD: u64 = 4;

/// The new calls a controller counted since it was made (what its worker
/// took up), for the driver's tests and diagnostics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NewCallCounts {
    /// New calls that arrived (not counting resends).
    pub arrived: u64,
    /// Resends of new INVITEs dropped unanswered.
    pub resent: u64,
    /// New calls and resends admitted.
    pub admitted: u64,
}

/// The advertisement's controller of one worker; see the module
/// documentation.
#[derive(Debug)]
pub struct OcController {
    pool: Arc<OcPool>,
    slot: usize,
    config: OcControllerConfig,
    /// Start of the current report (`None` before the first tick) and the
    /// worker's CPU time then (ns).
    report_start: Option<u64>,
    cpu_at_start: Option<u64>,
    /// New calls that arrived and were admitted since the last report,
    /// and the datagrams (ticks) seen.
    arrived: u64,
    admitted: u64,
    datagrams: u64,
    /// Resends of INVITEs dropped unanswered since the last report.
    resent: u64,
    /// Every count since the controller was made.
    counted: NewCallCounts,
    /// What the pool published at the last report.
    published: Published,
    /// Pinned share (lab knob): reports change nothing here.
    pinned: Option<f64>,
    /// The floor's token bucket (calls) and when it was last filled (ns).
    tokens: f64,
    filled_at: u64,
    /// The shedder's set point (ns), from the last tick.
    target: u64,
}

impl OcController {
    /// A controller with a pool of its own, advertising nothing (`oc=0`)
    /// until it sees overload. Out-of-range knobs are clamped to the
    /// nearest sensible value.
    pub fn new(config: OcControllerConfig) -> OcController {
        OcController::join(&Arc::new(OcPool::new(config)))
    }

    /// A controller of one more worker of `pool` (workers sharing a queue:
    /// see [`OcPool`]).
    pub fn join(pool: &Arc<OcPool>) -> OcController {
        OcController::at(pool.clone(), pool.join())
    }

    /// A fresh controller (no counts, no pin) in the same worker's place of
    /// the same pool: what a worker whose settings changed takes instead
    /// of joining again.
    pub fn fresh(self) -> OcController {
        OcController::at(self.pool, self.slot)
    }

    fn at(pool: Arc<OcPool>, slot: usize) -> OcController {
        OcController {
            config: pool.config(),
            pool,
            slot,
            report_start: None,
            cpu_at_start: None,
            arrived: 0,
            admitted: 0,
            datagrams: 0,
            resent: 0,
            counted: NewCallCounts::default(),
            published: Published {
                keep: 1.0,
                capacity: None,
                share: 1.0,
            },
            pinned: None,
            tokens: 0.0,
            filled_at: 0,
            target: 0,
        }
    }

    /// Lab and test knob: advertise keeping `ppm` millionths of the new
    /// calls whatever the load (at least 1/64), with no floor: what a
    /// shedder pinned with [`crate::overload::Shedder::pin`] refuses.
    pub fn pin(&mut self, ppm: u32) {
        self.pinned = Some((f64::from(ppm.min(1_000_000)) / 1e6).max(MIN_KEEP));
    }

    /// The knobs (clamped).
    pub fn config(&self) -> OcControllerConfig {
        self.config
    }

    /// One new call (a new INVITE) arrived at `now` (ns): `admitted` if
    /// the proxy took it on, `false` if it was refused or dropped.
    pub fn count_new_call(&mut self, now: u64, admitted: bool) {
        self.arrived += 1;
        self.counted.arrived += 1;
        self.count_admitted(now, admitted);
    }

    /// The resend of a new INVITE dropped unanswered ([`Self::is_resend`])
    /// arrived at `now`: counted like a new call, but not in the arrivals
    /// the advertisement is computed against (see [`super::resends`]).
    pub fn count_resend(&mut self, now: u64, admitted: bool) {
        self.resent += 1;
        self.counted.resent += 1;
        self.count_admitted(now, admitted);
    }

    /// A new INVITE with `call_id` was dropped unanswered at `now` (it
    /// waited beyond the drop bound): remembered, so that its sender's
    /// resend is told apart ([`Self::is_resend`]). Count it as well
    /// ([`Self::count_new_call`] or [`Self::count_resend`]).
    pub fn remember_dropped(&self, now: u64, call_id: &[u8]) {
        self.pool.dropped().remember(now, call_id);
    }

    /// Whether any new INVITE was dropped unanswered in the pool in the
    /// last 32 s (timer B): only then may a new INVITE be a resend, and its
    /// Call-ID worth a peek.
    pub fn expects_resends(&self, now: u64) -> bool {
        self.pool.dropped().expected(now)
    }

    /// Whether a new INVITE with `call_id` arriving at `now` is the resend
    /// of one the pool dropped unanswered (each drop matches once).
    pub fn is_resend(&self, now: u64, call_id: &[u8]) -> bool {
        self.expects_resends(now) && self.pool.dropped().take(call_id)
    }

    /// What it counted since it was made.
    pub fn counted(&self) -> NewCallCounts {
        self.counted
    }

    fn count_admitted(&mut self, now: u64, admitted: bool) {
        if admitted {
            self.counted.admitted += 1;
            self.admitted += 1;
            self.fill(now);
            self.tokens = (self.tokens - 1.0).max(0.0);
        }
    }

    /// Whether a new call the shedder refuses at `now`, after waiting
    /// `delay` ns in the queue, is to be admitted anyway: the wait is under
    /// the shedder's target and this worker admitted less than the floor
    /// (`floor · C` times its share) so far. Counting it
    /// ([`OcController::count_new_call`]) takes its token.
    pub fn overrides_refusal(&mut self, now: u64, delay: u64) -> bool {
        self.fill(now);
        delay < self.target && self.tokens >= 1.0
    }

    /// Fill the floor's bucket up to `now`.
    fn fill(&mut self, now: u64) {
        let elapsed = now.saturating_sub(self.filled_at);
        self.filled_at = self.filled_at.max(now);
        let Some(capacity) = self.capacity() else {
            self.tokens = 0.0;
            return;
        };
        let rate = capacity * self.config.floor / 1e9;
        let burst = (rate * FLOOR_BURST_NS).max(1.0);
        self.tokens = (self.tokens + elapsed as f64 * rate).min(burst);
    }

    /// Call with every datagram taken from the queue (each call counts one
    /// in the pool's trace): now and then this worker's counts go to the pool, which closes a period
    /// when one ended (a new capacity sample, a new advertisement).
    /// `standing` is the admission controller's standing delay (ns: the
    /// smallest delay of its last interval; `None`: no sample yet) and
    /// `target` its set point ([`crate::overload::Shedder::standing_delay`],
    /// [`crate::overload::ShedConfig::target`]); `cpu` reads the CPU time
    /// the worker's thread used so far (ns; `None`: not known, then the
    /// capacity is the admitted rate, see [`OcPool`]), called only
    /// when a report is due.
    pub fn tick(
        &mut self,
        now: u64,
        standing: Option<u64>,
        target: u64,
        cpu: impl FnOnce() -> Option<u64>,
    ) {
        self.target = target;
        self.datagrams += 1;
        let Some(start) = self.report_start else {
            self.report_start = Some(now);
            self.cpu_at_start = cpu();
            return;
        };
        let elapsed = now.saturating_sub(start);
        if elapsed < self.config.period / REPORTS_PER_PERIOD {
            return;
        }
        let cpu_now = cpu();
        let report = Report {
            elapsed,
            arrived: self.arrived,
            resent: self.resent,
            admitted: self.admitted,
            datagrams: self.datagrams,
            cpu: cpu_now
                .zip(self.cpu_at_start)
                .map(|(now, before)| now.saturating_sub(before)),
            standing,
            target,
        };
        let Some(published) = self.pool.report(self.slot, now, report) else {
            // Another worker holds the pool: report with a later datagram.
            return;
        };
        self.published = published;
        self.report_start = Some(now);
        self.cpu_at_start = cpu_now;
        self.arrived = 0;
        self.resent = 0;
        self.admitted = 0;
        self.datagrams = 0;
    }

    /// This worker's part of the capacity estimate (new calls per second:
    /// the pool's times its share of the arrivals; summed over the pool's
    /// workers, the proxy's; `None`: no overload seen yet, or pinned).
    pub fn capacity(&self) -> Option<f64> {
        if self.pinned.is_some() {
            return None;
        }
        self.published
            .capacity
            .map(|capacity| capacity * self.published.share)
    }

    /// The advertised share of new calls kept, in millionths (1 000 000:
    /// no reduction).
    pub fn kept_ppm(&self) -> u32 {
        (self.pinned.unwrap_or(self.published.keep) * 1e6).round() as u32
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
        c.tick(start, Some(standing), TARGET, || None);
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
        c.tick(200 * MS, Some(10 * MS), TARGET, || None);
        let capacity = c.capacity().unwrap();
        assert!((capacity - 10_000.0).abs() < 1.0, "{capacity}");
        // Twice 30 000/s arrived for 10 000/s: (1/3)^0.35 = 0.68 each time,
        // bounded by 1/1.25.
        assert_eq!(c.kept_ppm(), 640_000);
        // 15 000 admitted in a period in which the queue grew by 50 ms of
        // work: 2/3 of it served, the estimate stays.
        period(&mut c, 200 * MS, 1_500, 1_500, 10 * MS);
        c.tick(300 * MS, Some(60 * MS), TARGET, || None);
        let capacity = c.capacity().unwrap();
        assert!((capacity - 10_000.0).abs() < 1.0, "{capacity}");
        // A period without a standing queue does not lower it; one that
        // admitted more raises it towards that plus 10 %.
        period(&mut c, 300 * MS, 500, 500, 60 * MS);
        c.tick(400 * MS, Some(MS), TARGET, || None);
        assert!((c.capacity().unwrap() - 10_000.0).abs() < 1.0);
        period(&mut c, 400 * MS, 1_200, 1_200, MS);
        c.tick(500 * MS, Some(MS), TARGET, || None);
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
            let arrived = (3_000.0 * c.published.keep) as u64;
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
            let arrived = (500.0 * c.published.keep) as u64;
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
        c.tick(200 * MS, Some(10 * MS), TARGET, || None);
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
        // The controller runs on its pool's clamped knobs
        // (`pool::tests::knobs_are_clamped_once`).
        let knobs = crate::overload_control::pool::tests::out_of_range();
        let c = OcController::new(knobs);
        assert_eq!(c.config(), OcPool::new(knobs).config());
        assert_eq!(c.config().period, 1);
    }
}
