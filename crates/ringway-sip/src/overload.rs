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
//! interval (100 ms by default) from the interval's *smallest* delay —
//! CoDel's estimate of the standing queue, which a transient burst or
//! stall does not move (its own datagrams are late, the others are not):
//!
//! - smallest delay over the target: a standing queue, more arrives than
//!   is served; the fraction is scaled by `target / delay` (at most
//!   halved per interval);
//! - largest delay under half the target: no queue at all (the overload
//!   has ended); the fraction doubles (plus a step), so service is back in
//!   a few intervals;
//! - smallest delay under half the target: the queue empties; the
//!   fraction grows by a step (1/32 per interval) to probe for capacity;
//! - otherwise it holds.
//!
//! The admitted INVITEs are spread evenly over the refused ones (a credit
//! accumulator, no randomness): at a fraction of 1/3 exactly every third
//! new INVITE passes, so the admitted calls' later messages arrive as
//! evenly as the load does. The fraction never falls under 1/64: the
//! proxy keeps admitting a trickle, which is how it sees capacity return
//! when the queue is dominated by traffic it cannot shed.

/// The fraction 1 in the fixed-point arithmetic of [`Shedder`].
const ONE: u32 = 1 << 16;
/// The admitted fraction never goes under this (1/64).
const MIN_ADMIT: u32 = ONE / 64;
/// What the fraction grows by per interval while the queue empties.
const STEP: u32 = ONE / 32;

/// The controller's knobs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ShedConfig {
    /// Queueing delay (ns) that counts as a standing queue when even the
    /// interval's least delayed datagram waited longer.
    pub target: u64,
    /// How often (ns) the admitted fraction is updated.
    pub interval: u64,
}

impl ShedConfig {
    /// The default interval: 100 ms (CoDel's).
    pub const DEFAULT_INTERVAL: u64 = 100_000_000;

    /// `target` (ns) with the default interval.
    pub fn with_target(target: u64) -> ShedConfig {
        ShedConfig {
            target,
            interval: Self::DEFAULT_INTERVAL,
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
    /// The admitted fraction of new INVITEs, in 1/`ONE`.
    admit: u32,
    /// Credit accumulator spreading the admitted INVITEs.
    credit: u32,
    /// New INVITEs admitted and refused so far.
    admitted: u64,
    refused: u64,
}

impl Shedder {
    /// A controller admitting everything until it sees a standing queue.
    pub fn new(config: ShedConfig) -> Shedder {
        Shedder {
            config: ShedConfig {
                target: config.target.max(1),
                interval: config.interval.max(1),
            },
            interval_start: None,
            min_delay: u64::MAX,
            max_delay: 0,
            samples: 0,
            admit: ONE,
            credit: 0,
            admitted: 0,
            refused: 0,
        }
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
        if self.samples > 0 {
            let target = self.config.target;
            let admit = u64::from(self.admit);
            let next = if self.min_delay > target {
                // A standing queue: admit fewer, in proportion to the
                // excess, at most half as many.
                (admit * target / self.min_delay).max(admit / 2)
            } else if self.max_delay < target / 2 {
                // No queue at all: the overload is over (or never began).
                admit * 2 + u64::from(STEP)
            } else if self.min_delay < target / 2 {
                // The queue empties within the interval: probe upwards.
                admit + u64::from(STEP)
            } else {
                admit
            };
            self.admit = next.clamp(u64::from(MIN_ADMIT), u64::from(ONE)) as u32;
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
            target: 20 * MS,
            interval: 100 * MS,
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
    fn a_standing_queue_lowers_the_fraction_in_proportion_at_most_by_half() {
        let mut s = shedder();
        interval(&mut s, 0, &[32 * MS, 35 * MS]);
        // The update happens with the first sample of the next interval.
        assert!(!s.is_shedding());
        interval(&mut s, 100 * MS, &[400 * MS]);
        // min 32 ms over a 20 ms target: × 20/32.
        assert_eq!(s.admitted_ppm(), 625_000);
        interval(&mut s, 200 * MS, &[400 * MS]);
        // min 400 ms: × 20/400 would be 1/20; at most halved per interval.
        assert_eq!(s.admitted_ppm(), 312_500);
        // Never under 1/64, however long it lasts.
        for k in 3..40u64 {
            interval(&mut s, k * 100 * MS, &[400 * MS]);
        }
        assert_eq!(s.admitted_ppm(), 1_000_000 / 64);
        assert_eq!(admitted_of(&mut s, 640), 10);
    }

    #[test]
    fn a_queue_between_half_and_the_target_holds_the_fraction() {
        let mut s = shedder();
        interval(&mut s, 0, &[40 * MS]);
        interval(&mut s, 100 * MS, &[12 * MS, 30 * MS]);
        assert_eq!(s.admitted_ppm(), 500_000);
        for k in 2..20u64 {
            interval(&mut s, k * 100 * MS, &[12 * MS, 30 * MS]);
            assert_eq!(s.admitted_ppm(), 500_000, "interval {k}");
        }
    }

    #[test]
    fn an_emptying_queue_probes_upwards_by_steps_and_no_queue_recovers_fast() {
        let mut s = shedder();
        interval(&mut s, 0, &[80 * MS]);
        interval(&mut s, 100 * MS, &[80 * MS]);
        interval(&mut s, 200 * MS, &[MS, 15 * MS]);
        assert_eq!(s.admitted_ppm(), 250_000);
        // The queue empties (min under 10 ms) but still builds (max 15 ms):
        // one step (1/32) per interval.
        interval(&mut s, 300 * MS, &[MS, 15 * MS]);
        assert_eq!(s.admitted_ppm(), 250_000 + 31_250);
        interval(&mut s, 400 * MS, &[MS]);
        assert_eq!(s.admitted_ppm(), 250_000 + 2 * 31_250);
        // No queue at all (max under 10 ms): doubling, all admitted again
        // within three intervals.
        interval(&mut s, 500 * MS, &[MS]);
        assert_eq!(s.admitted_ppm(), 2 * 312_500 + 31_250);
        interval(&mut s, 600 * MS, &[MS]);
        assert_eq!(s.admitted_ppm(), 1_000_000);
        assert!(!s.is_shedding());
    }

    #[test]
    fn admissions_are_spread_evenly_and_exactly() {
        let mut s = shedder();
        interval(&mut s, 0, &[40 * MS]);
        interval(&mut s, 100 * MS, &[40 * MS]);
        interval(&mut s, 200 * MS, &[MS, 15 * MS]);
        assert_eq!(s.admitted_ppm(), 250_000);
        // A quarter: exactly every fourth call, never two in a row.
        let pattern: Vec<bool> = (0..16).map(|_| s.admit_new_call()).collect();
        assert_eq!(pattern.iter().filter(|&&a| a).count(), 4);
        assert!(pattern.windows(2).all(|w| !(w[0] && w[1])));
        assert_eq!(s.decisions(), (4, 12));
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
        interval(&mut s, 0, &[40 * MS]);
        interval(&mut s, 100 * MS, &[40 * MS]);
        let before = s.admitted_ppm();
        // A sample from before the interval's start (another thread's
        // clock read): counted in the current interval, no update.
        s.observe(50 * MS, 40 * MS);
        assert_eq!(s.admitted_ppm(), before);
        // No datagrams for a second: the next sample closes one interval
        // (with the samples it had), not ten.
        s.observe(1200 * MS, MS);
        assert_eq!(s.admitted_ppm(), before / 2);
    }
}
