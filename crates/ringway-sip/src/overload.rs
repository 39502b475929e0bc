//! Overload control for new calls (RFC 6357 / RFC 7339 in spirit): how
//! many of the new INVITEs a worker admits, from how long datagrams wait
//! in its receive queue. Sans-IO: the driver passes each datagram's
//! queueing delay with the time it measured it, and asks for every new
//! INVITE (a [`crate::peek::is_new_invite`]) whether to admit it; the ones
//! refused get `503` + `Retry-After` before any transaction exists.
//!
//! Why a fraction and not a per-datagram threshold: deciding each INVITE
//! by its own wait is a bang-bang controller. A stall of a few
//! milliseconds (the proxy descheduled, a lock holder preempted, a burst)
//! puts every datagram queued behind it over the threshold, so a whole
//! backlog of new calls is refused although the proxy would have served
//! them a moment later; then the queue is empty and every new call is
//! admitted at once, whose later messages (180, 200, ACK, BYE) come back
//! together. Measured on a quiet machine (bench/sip/overload.sh, 3× the
//! capacity): mean goodput 81 % of capacity but single seconds at 48 %.
//!
//! [`Shedder`] instead keeps one admitted fraction, changed once per
//! interval (100 ms by default) from the interval's *smallest* delay `q`
//! — CoDel's estimate of the standing queue, which a transient burst or
//! stall does not move (its own datagrams are late, the others are not).
//! The law is a proportional-integral controller on `q` with the
//! configured target as its set point, acting on the fraction
//! *multiplicatively*:
//!
//! ```text
//! fraction ×= 1 − ki·(q − target) − kp·(q − q_previous)      (q in s)
//! ```
//!
//! clamped to a change of at most `max_step` per interval (¼), and never
//! under 1/64. The integral term (`ki` = 20/s: 10 ms over the target cuts
//! 20 %) drives the standing queue to the target and holds it there — a
//! small queue that never empties, so the CPU never idles while calls are
//! refused, and far enough under the socket's capacity that no datagram is
//! lost. The proportional term (`kp` = 10/s) reacts to a queue that grows
//! or drains before it is far from the target, which damps the
//! oscillation. Multiplicative, because the loop gain then does not depend
//! on the offered load: at 3× the capacity the fraction settles near 1/3,
//! and a change of 1 % of it changes the load by 1 % of the capacity at
//! any overload factor. One exception: when even the interval's largest
//! delay is under half the target (no queue at all: the overload is over)
//! the fraction doubles (plus 1/32), so service is back in a few
//! intervals.
//!
//! The first version changed the fraction by fixed steps (halving over
//! the target, +1/32 under half of it, holding in between): each cut
//! emptied the queue and idled the CPU, each step up overshot; in
//! `tests/overload_sim.rs` it keeps 75–82 % of the capacity and, measured,
//! 57–69 %.
//!
//! The admitted INVITEs are spread evenly over the refused ones (a credit
//! accumulator, no randomness): at a fraction of 1/3 exactly every third
//! new INVITE passes, so the admitted calls' later messages arrive as
//! evenly as the load does. The fraction never falls under 1/64: the
//! proxy keeps admitting a trickle, which is how it sees capacity return
//! when the queue is dominated by traffic it cannot shed.

/// The fraction 1 in the fixed-point arithmetic of [`Shedder`] and
/// [`ShedConfig`].
pub const ONE: u32 = 1 << 16;
/// The admitted fraction never goes under this (1/64).
const MIN_ADMIT: u32 = ONE / 64;
/// What the fraction grows by, after doubling, per interval without any
/// queue.
const RECOVERY_STEP: u32 = ONE / 32;

/// The controller's knobs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ShedConfig {
    /// The set point (ns): the standing queueing delay (the smallest delay
    /// of an interval) the controller holds while it sheds.
    pub target: u64,
    /// How often (ns) the admitted fraction is updated.
    pub interval: u64,
    /// Integral gain: relative change of the fraction per interval per
    /// second of standing delay over the target, in 1/[`ONE`].
    pub ki: u32,
    /// Proportional gain: relative change per interval per second the
    /// standing delay grew since the last interval, in 1/[`ONE`].
    pub kp: u32,
    /// The largest relative change of one interval, in 1/[`ONE`].
    pub max_step: u32,
}

impl ShedConfig {
    /// The default interval: 100 ms (CoDel's).
    pub const DEFAULT_INTERVAL: u64 = 100_000_000;
    /// The default integral gain: 20 per second of excess delay.
    pub const DEFAULT_KI: u32 = 20 * ONE;
    /// The default proportional gain: 10 per second of delay growth.
    pub const DEFAULT_KP: u32 = 10 * ONE;
    /// The default largest change per interval: a quarter.
    pub const DEFAULT_MAX_STEP: u32 = ONE / 4;

    /// `target` (ns) with the default interval and gains.
    pub fn with_target(target: u64) -> ShedConfig {
        ShedConfig {
            target,
            interval: Self::DEFAULT_INTERVAL,
            ki: Self::DEFAULT_KI,
            kp: Self::DEFAULT_KP,
            max_step: Self::DEFAULT_MAX_STEP,
        }
    }
}

/// The admission controller of one worker; see the module documentation.
#[derive(Clone, Debug)]
pub struct Shedder {
    config: ShedConfig,
    /// Start of the current interval (`None` before the first sample).
    interval_start: Option<u64>,
    /// Smallest and largest delay seen in the current interval.
    min_delay: u64,
    max_delay: u64,
    /// Samples in the current interval.
    samples: u64,
    /// The smallest delay of the last interval that had samples.
    previous_min: Option<u64>,
    /// The admitted fraction of new INVITEs, in 1/`ONE`.
    admit: u32,
    /// Credit accumulator spreading the admitted INVITEs.
    credit: u32,
    /// New INVITEs admitted and refused so far.
    admitted: u64,
    refused: u64,
    /// The fraction is fixed ([`Shedder::pin`]): intervals change nothing.
    pinned: bool,
}

impl Shedder {
    /// A controller admitting everything until it sees a standing queue.
    pub fn new(config: ShedConfig) -> Shedder {
        Shedder {
            config: ShedConfig {
                target: config.target.max(1),
                interval: config.interval.max(1),
                max_step: config.max_step.min(ONE - 1),
                ..config
            },
            interval_start: None,
            min_delay: u64::MAX,
            max_delay: 0,
            samples: 0,
            previous_min: None,
            admit: ONE,
            credit: 0,
            admitted: 0,
            refused: 0,
            pinned: false,
        }
    }

    /// Lab and test knob: hold the admitted fraction at `ppm` millionths
    /// (at least 1/64; 1 000 000 or more: everything) whatever the queue.
    pub fn pin(&mut self, ppm: u32) {
        let admit = u64::from(ppm.min(1_000_000)) * u64::from(ONE) / 1_000_000;
        self.admit = (admit as u32).max(MIN_ADMIT);
        self.pinned = true;
    }

    /// The knobs.
    pub fn config(&self) -> ShedConfig {
        self.config
    }

    /// One datagram waited `delay` ns in the queue; `now` (ns, any clock
    /// that does not run backwards by much) is when that was measured. An
    /// interval that ended before `now` updates the fraction first.
    pub fn observe(&mut self, now: u64, delay: u64) {
        let start = *self.interval_start.get_or_insert(now);
        if now.saturating_sub(start) >= self.config.interval {
            self.update();
            self.interval_start = Some(now);
        }
        self.min_delay = self.min_delay.min(delay);
        self.max_delay = self.max_delay.max(delay);
        self.samples += 1;
    }

    /// The end of an interval: the new fraction from its delays.
    fn update(&mut self) {
        if self.samples > 0 && !self.pinned {
            let ShedConfig {
                target,
                ki,
                kp,
                max_step,
                ..
            } = self.config;
            let standing = self.min_delay;
            let previous = self.previous_min.replace(standing).unwrap_or(standing);
            let admit = i128::from(self.admit);
            let next = if self.max_delay < target / 2 {
                // No queue at all: the overload is over (or never began).
                admit * 2 + i128::from(RECOVERY_STEP)
            } else {
                // Relative change in 1/ONE: delays in ns, gains per second.
                let excess = i128::from(standing) - i128::from(target);
                let growth = i128::from(standing) - i128::from(previous);
                let change = -(i128::from(ki) * excess + i128::from(kp) * growth) / 1_000_000_000;
                let bound = i128::from(max_step);
                admit + admit * change.clamp(-bound, bound) / i128::from(ONE)
            };
            self.admit = next.clamp(i128::from(MIN_ADMIT), i128::from(ONE)) as u32;
        }
        self.min_delay = u64::MAX;
        self.max_delay = 0;
        self.samples = 0;
    }

    /// Whether any new INVITE may be refused now (the fraction is under 1):
    /// the driver needs to peek at datagrams only then.
    pub fn is_shedding(&self) -> bool {
        self.admit < ONE
    }

    /// Decide one new INVITE: `true` to admit it, `false` to refuse it
    /// (`503` + `Retry-After`). Exactly `fraction` of a long run of calls
    /// is admitted, evenly spread.
    pub fn admit_new_call(&mut self) -> bool {
        self.credit += self.admit;
        if self.credit >= ONE {
            self.credit -= ONE;
            self.admitted += 1;
            true
        } else {
            self.refused += 1;
            false
        }
    }

    /// The admitted fraction of new INVITEs, in millionths (1 000 000:
    /// everything).
    pub fn admitted_ppm(&self) -> u32 {
        (u64::from(self.admit) * 1_000_000 / u64::from(ONE)) as u32
    }

    /// The standing queueing delay (ns): the smallest delay of the last
    /// interval that had samples (`None`: none yet). What
    /// [`crate::overload_control::OcController`] reads the CPU's saturation
    /// from.
    pub fn standing_delay(&self) -> Option<u64> {
        self.previous_min
    }

    /// New INVITEs admitted and refused by [`Shedder::admit_new_call`].
    pub fn decisions(&self) -> (u64, u64) {
        (self.admitted, self.refused)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    fn shedder() -> Shedder {
        Shedder::new(ShedConfig {
            interval: 100 * MS,
            ..ShedConfig::with_target(20 * MS)
        })
    }

    /// One interval starting at `start` whose datagrams waited `delays`.
    fn interval(s: &mut Shedder, start: u64, delays: &[u64]) {
        for (i, &d) in delays.iter().enumerate() {
            s.observe(start + i as u64, d);
        }
    }

    /// Admissions out of `n` consecutive decisions.
    fn admitted_of(s: &mut Shedder, n: usize) -> usize {
        (0..n).filter(|_| s.admit_new_call()).count()
    }

    /// The admitted fraction is `ppm` to within 0.01 % (fixed point).
    fn assert_ppm(s: &Shedder, ppm: u32) {
        let got = s.admitted_ppm();
        assert!(
            got.abs_diff(ppm) <= 100,
            "admitted {got} ppm, expected {ppm}"
        );
    }

    #[test]
    fn without_a_standing_queue_everything_is_admitted() {
        let mut s = shedder();
        // Bursts and stalls: single datagrams wait long, but every interval
        // also has datagrams that did not wait (the minimum stays low).
        for k in 0..50u64 {
            interval(&mut s, k * 100 * MS, &[0, 150 * MS, 2 * MS, 80 * MS]);
            assert!(!s.is_shedding(), "interval {k}");
        }
        assert_eq!(admitted_of(&mut s, 1000), 1000);
        assert_eq!(s.admitted_ppm(), 1_000_000);
    }

    #[test]
    fn a_standing_queue_over_the_target_cuts_in_proportion_at_most_a_quarter() {
        let mut s = shedder();
        interval(&mut s, 0, &[25 * MS, 35 * MS]);
        // The update happens with the first sample of the next interval.
        assert!(!s.is_shedding());
        interval(&mut s, 100 * MS, &[25 * MS, 60 * MS]);
        // 5 ms over the target, steady: × (1 − 20/s · 5 ms) = × 0.9.
        assert_ppm(&s, 900_000);
        interval(&mut s, 200 * MS, &[400 * MS]);
        // Still 25 ms (the interval that just ended): another × 0.9.
        assert_ppm(&s, 810_000);
        interval(&mut s, 300 * MS, &[400 * MS]);
        // 400 ms: far over, and grown by 375 ms: at most a quarter less.
        assert_ppm(&s, 607_500);
        // Never under 1/64, however long it lasts.
        for k in 4..40u64 {
            interval(&mut s, k * 100 * MS, &[400 * MS]);
        }
        assert_eq!(s.admitted_ppm(), 1_000_000 / 64);
        assert_eq!(admitted_of(&mut s, 640), 10);
    }

    #[test]
    fn a_queue_held_at_the_target_holds_the_fraction() {
        let mut s = shedder();
        interval(&mut s, 0, &[40 * MS]);
        interval(&mut s, 100 * MS, &[20 * MS, 30 * MS]);
        assert_ppm(&s, 750_000);
        // At the target, 20 ms less than before: × (1 + 10/s · 20 ms).
        interval(&mut s, 200 * MS, &[20 * MS, 30 * MS]);
        assert_ppm(&s, 900_000);
        // Exactly the target, not growing: no change.
        for k in 3..20u64 {
            interval(&mut s, k * 100 * MS, &[20 * MS, 30 * MS]);
            assert_ppm(&s, 900_000);
        }
    }

    #[test]
    fn a_growing_queue_is_cut_before_it_reaches_the_target_and_a_draining_one_less() {
        let mut s = shedder();
        interval(&mut s, 0, &[40 * MS]);
        interval(&mut s, 100 * MS, &[10 * MS, 30 * MS]);
        assert_ppm(&s, 750_000);
        // 10 ms under the target: × (1 + 0.2); it fell by 30 ms: + 0.3,
        // at most a quarter up: × 1.25.
        interval(&mut s, 200 * MS, &[16 * MS, 30 * MS]);
        assert_ppm(&s, 937_500);
        // 16 ms: 4 ms under the target (+ 8 %) but 6 ms more than before
        // (− 6 %): + 2 %.
        interval(&mut s, 300 * MS, &[16 * MS, 30 * MS]);
        assert_ppm(&s, 956_250);
        // Over the target by 10 ms (− 20 %) but 10 ms less than before
        // (+ 10 %): − 10 % only.
        let mut s = shedder();
        interval(&mut s, 0, &[40 * MS]);
        interval(&mut s, 100 * MS, &[30 * MS, 40 * MS]);
        assert_ppm(&s, 750_000);
        interval(&mut s, 200 * MS, &[30 * MS]);
        assert_ppm(&s, 675_000);
    }

    #[test]
    fn a_queue_under_the_target_grows_the_fraction_and_no_queue_recovers_fast() {
        let mut s = shedder();
        interval(&mut s, 0, &[80 * MS]);
        interval(&mut s, 100 * MS, &[80 * MS]);
        interval(&mut s, 200 * MS, &[15 * MS, 25 * MS]);
        assert_ppm(&s, 562_500);
        // Standing 15 ms (5 under the target), dropped by 65 ms: + a quarter.
        interval(&mut s, 300 * MS, &[15 * MS, 25 * MS]);
        assert_ppm(&s, 703_125);
        // Steady 5 ms under the target: + 10 % per interval.
        interval(&mut s, 400 * MS, &[MS]);
        assert_ppm(&s, 773_437);
        // No queue at all (largest delay under 10 ms): doubling, all
        // admitted again at once.
        interval(&mut s, 500 * MS, &[MS]);
        assert_eq!(s.admitted_ppm(), 1_000_000);
        assert!(!s.is_shedding());
    }

    #[test]
    fn admissions_are_spread_evenly_and_exactly() {
        let mut s = shedder();
        interval(&mut s, 0, &[60 * MS]);
        interval(&mut s, 100 * MS, &[60 * MS]);
        interval(&mut s, 200 * MS, &[60 * MS]);
        interval(&mut s, 300 * MS, &[60 * MS]);
        interval(&mut s, 400 * MS, &[60 * MS]);
        // Four cuts by a quarter: (3/4)^4 = 81/256, about a third.
        assert_ppm(&s, 316_406);
        // Never two admitted in a row, and the count is exact.
        let pattern: Vec<bool> = (0..256).map(|_| s.admit_new_call()).collect();
        assert_eq!(pattern.iter().filter(|&&a| a).count(), 81);
        assert!(pattern.windows(2).all(|w| !(w[0] && w[1])));
        assert_eq!(s.decisions(), (81, 175));
    }

    #[test]
    fn a_stall_alone_does_not_shed_but_a_standing_queue_does() {
        // The bang-bang failure: a 30 ms stall delays everything behind it
        // over a 20 ms target. Within one interval the datagrams received
        // before and after it waited little, so nothing is shed.
        let mut s = shedder();
        let mut delays = vec![MS; 10];
        delays.extend((0..30).map(|i| (30 - i) * MS));
        delays.extend([MS; 10]);
        interval(&mut s, 0, &delays);
        interval(&mut s, 100 * MS, &[MS]);
        assert!(!s.is_shedding());
        // A queue that never drains below the target within an interval
        // is overload.
        interval(&mut s, 200 * MS, &[21 * MS, 60 * MS, 45 * MS]);
        interval(&mut s, 300 * MS, &[MS]);
        assert!(s.is_shedding());
    }

    #[test]
    fn silence_and_a_clock_that_steps_back_change_nothing() {
        let mut s = shedder();
        interval(&mut s, 0, &[30 * MS]);
        interval(&mut s, 100 * MS, &[30 * MS]);
        assert_ppm(&s, 800_000);
        // A sample from before the interval's start (another thread's
        // clock read): counted in the current interval, no update.
        s.observe(50 * MS, 30 * MS);
        assert_ppm(&s, 800_000);
        // No datagrams for a second: the next sample closes one interval
        // (with the samples it had), not ten.
        s.observe(1200 * MS, MS);
        assert_ppm(&s, 640_000);
    }
}
