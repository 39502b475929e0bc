//! The load sender's clock: each source ticks every packet interval at its
//! own phase, and ticks that start late are counted; the same schedule run
//! alone measures the generator's own lateness on a machine.

use super::pin;
use ringway_io::thread::Policy;
use std::time::{Duration, Instant};

/// A tick is late when it starts more than this after it was due.
pub const LATE_TICK: Duration = Duration::from_millis(1);

/// The sender's clock: source k ticks every interval at its own phase
/// (ns after the start); counts the ticks and those that started more
/// than [`LATE_TICK`] late.
pub(super) struct TickSchedule {
    start: Instant,
    next: Vec<u64>,
    interval_ns: u64,
    /// Ticks so far.
    pub(super) ticks: u64,
    /// Ticks that started late.
    pub(super) late: u64,
}

impl TickSchedule {
    pub(super) fn new(phases: Vec<u64>, interval_ns: u64) -> TickSchedule {
        TickSchedule {
            start: Instant::now(),
            next: phases,
            interval_ns,
            ticks: 0,
            late: 0,
        }
    }

    /// The source whose tick is next, and when it is due.
    fn next_due(&self) -> (usize, Instant) {
        let (source, due_ns) = self
            .next
            .iter()
            .copied()
            .enumerate()
            .min_by_key(|x| x.1)
            .expect("a source");
        (source, self.start + Duration::from_nanos(due_ns))
    }

    /// Sleep until the next tick is due; the source whose tick it is.
    pub(super) fn wait_next(&mut self) -> usize {
        let (source, due) = self.next_due();
        self.take(source, due)
    }

    /// As [`TickSchedule::wait_next`] when the next tick is due within
    /// `at_most`; otherwise sleep `at_most` and return `None`.
    pub(super) fn wait_next_within(&mut self, at_most: Duration) -> Option<usize> {
        let (source, due) = self.next_due();
        if due > Instant::now() + at_most {
            std::thread::sleep(at_most);
            return None;
        }
        Some(self.take(source, due))
    }

    /// Sleep until `due`, then count `source`'s tick, late when it starts
    /// more than [`LATE_TICK`] after `due` (an overrun of the sleep
    /// itself included).
    fn take(&mut self, source: usize, due: Instant) -> usize {
        let now = Instant::now();
        if due > now {
            std::thread::sleep(due - now);
        }
        if Instant::now().saturating_duration_since(due) > LATE_TICK {
            self.late += 1;
        }
        self.next[source] += self.interval_ns;
        self.ticks += 1;
        source
    }
}

/// The generator's own lateness on this machine: the sender's schedule for
/// `sources` sources every `interval_ms` (phases from `seed`, as
/// [`super::run`] draws them) run for `duration` on a thread pinned to `cpus`
/// with the sender's scheduling `policy`,
/// sleeping to each tick as the sender does but sending nothing. Returns
/// (ticks, ticks more than [`LATE_TICK`] late): what the machine's timer
/// and scheduler cost the generator before any load is added.
pub fn tick_lateness(
    sources: usize,
    interval_ms: f64,
    seed: u64,
    duration: Duration,
    cpus: Option<Vec<usize>>,
    policy: Option<Policy>,
) -> anyhow::Result<(u64, u64)> {
    anyhow::ensure!(sources > 0, "no sources to schedule");
    let interval_ns = (interval_ms * 1e6).max(1.0) as u64;
    let thread = std::thread::Builder::new()
        .name("sfu-calibrate".into())
        .spawn(move || {
            let refused = pin("sfu-calibrate", cpus, policy);
            let mut schedule =
                TickSchedule::new(phases(sources, interval_ns, true, seed), interval_ns);
            let start = Instant::now();
            while start.elapsed() < duration {
                schedule.wait_next();
            }
            (schedule.ticks, schedule.late, refused)
        })?;
    let (ticks, late, refused) = thread
        .join()
        .map_err(|_| anyhow::anyhow!("the calibration thread panicked"))?;
    anyhow::ensure!(refused.is_empty(), "placement refused: {}", refused[0]);
    Ok((ticks, late))
}

/// Phase of each of `n` sources within `interval_ns`: uniform from a
/// seeded generator (independent clients), or all 0 (one burst per tick).
pub fn phases(n: usize, interval_ns: u64, desync: bool, seed: u64) -> Vec<u64> {
    let mut state = seed ^ 0x9e37_79b9_7f4a_7c15;
    (0..n)
        .map(|_| {
            // splitmix64
            state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut mixed = state;
            mixed = (mixed ^ (mixed >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            mixed = (mixed ^ (mixed >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            mixed ^= mixed >> 31;
            if desync {
                mixed % interval_ns.max(1)
            } else {
                0
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The AF_XDP client thread's wait: a tick due later than the bound
    /// is not taken (the thread only pauses), one due within it is, at its
    /// time, and the skipped pause does not count as a tick.
    #[test]
    fn a_bounded_wait_takes_only_a_tick_due_within_it() {
        // Source 0 due at once, source 1 at 50 ms, source 2 at 20 ms.
        let mut schedule = TickSchedule::new(vec![0, 50_000_000, 20_000_000], 1_000_000_000);
        let start = schedule.start;
        assert_eq!(schedule.wait_next_within(Duration::from_millis(1)), Some(0));
        let before = Instant::now();
        assert_eq!(schedule.wait_next_within(Duration::from_millis(1)), None);
        assert!(before.elapsed() >= Duration::from_millis(1));
        assert_eq!(schedule.ticks, 1);
        // Source 2 is due within a 40 ms bound: taken, not before its time.
        assert_eq!(
            schedule.wait_next_within(Duration::from_millis(40)),
            Some(2)
        );
        assert!(start.elapsed() >= Duration::from_millis(20));
        assert_eq!(schedule.ticks, 2);
    }
}
