//! Flood protection like Kamailio's `pike`: per source IP address, the
//! requests of the current and the previous window (`window` ns) are
//! counted; while either count is over `limit`, the source's requests are
//! dropped and counted (`DropReason::Flood`) without an answer (a reply
//! to a spoofed source would make us the flood). Responses are never
//! limited (they come from servers we sent requests to).
//!
//! The table is bounded and allocated once: a set-associative array of
//! `table_size` slots (4 ways per set, sets behind their own mutex). A new
//! source takes a free slot of its set, else the least recently seen slot
//! whose source is not blocked. If every slot of its set holds a blocked
//! source, the new source is not tracked and passes (counted as
//! `flood_untracked`): a spoofed flood of many addresses cannot evict the
//! sources it is blocked for, and legitimate new sources are not dropped
//! for the table being full.

use super::config::FloodConfig;
use crate::hash::Hash64;
use std::net::IpAddr;
use std::sync::Mutex;

/// Slots per set.
const WAYS: usize = 4;

/// One tracked source.
#[derive(Clone, Copy, Debug, Default)]
struct Slot {
    source: Option<IpAddr>,
    /// Start of the current window (ns).
    window_start: u64,
    /// Requests in the current window.
    count: u32,
    /// Requests in the previous window (0 if it was not the one before).
    previous: u32,
    /// Last request seen (ns).
    last_seen: u64,
}

impl Slot {
    /// Move the window forward to `now` if it ended.
    fn roll(&mut self, now: u64, window: u64) {
        let elapsed = now.saturating_sub(self.window_start);
        if elapsed >= window {
            self.previous = if elapsed < 2 * window { self.count } else { 0 };
            self.count = 0;
            self.window_start = now - elapsed % window;
        }
    }

    fn blocked(&self, limit: u32) -> bool {
        self.count > limit || self.previous > limit
    }
}

/// What the limiter says about one request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum FloodVerdict {
    /// Within the limit (or not tracked, see `untracked`).
    Pass {
        /// The table had no room for this source.
        untracked: bool,
    },
    /// Over the limit: drop. `newly`: this request crossed it.
    Drop {
        /// The source was not blocked before this request.
        newly: bool,
    },
}

/// The per-source request counters.
pub(super) struct FloodLimiter {
    config: FloodConfig,
    sets: Box<[Mutex<[Slot; WAYS]>]>,
}

impl FloodLimiter {
    pub(super) fn new(config: FloodConfig) -> FloodLimiter {
        let sets = config.table_size.div_ceil(WAYS).max(1);
        FloodLimiter {
            sets: (0..sets)
                .map(|_| Mutex::new([Slot::default(); WAYS]))
                .collect(),
            config,
        }
    }

    /// Count a request from `source` at `now`.
    pub(super) fn check(&self, source: IpAddr, now: u64) -> FloodVerdict {
        if self.config.exempt.contains(&source) {
            return FloodVerdict::Pass { untracked: false };
        }
        let mut hash = Hash64::new(0xF100D);
        match source {
            IpAddr::V4(v4) => hash.bytes(&v4.octets()),
            IpAddr::V6(v6) => hash.bytes(&v6.octets()),
        };
        let index = (hash.finish() % self.sets.len() as u64) as usize;
        let mut set = self.sets[index].lock().unwrap_or_else(|e| e.into_inner());
        let (limit, window) = (self.config.limit, self.config.window);
        let way = match set.iter().position(|slot| slot.source == Some(source)) {
            Some(way) => way,
            None => {
                let free = set.iter().position(|slot| slot.source.is_none());
                let victim = free.or_else(|| {
                    (0..WAYS)
                        .filter(|&w| {
                            let mut slot = set[w];
                            slot.roll(now, window);
                            !slot.blocked(limit)
                        })
                        .min_by_key(|&w| set[w].last_seen)
                });
                let Some(way) = victim else {
                    return FloodVerdict::Pass { untracked: true };
                };
                set[way] = Slot {
                    source: Some(source),
                    window_start: now,
                    ..Slot::default()
                };
                way
            }
        };
        let slot = &mut set[way];
        slot.roll(now, window);
        let was_blocked = slot.blocked(limit);
        slot.count = slot.count.saturating_add(1);
        slot.last_seen = now;
        if slot.blocked(limit) {
            FloodVerdict::Drop {
                newly: !was_blocked,
            }
        } else {
            FloodVerdict::Pass { untracked: false }
        }
    }

    /// Sources tracked now.
    pub(super) fn tracked(&self) -> usize {
        self.sets
            .iter()
            .map(|set| {
                set.lock()
                    .map_or(0, |s| s.iter().filter(|slot| slot.source.is_some()).count())
            })
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    fn limiter(limit: u32, table_size: usize) -> FloodLimiter {
        FloodLimiter::new(FloodConfig {
            limit,
            window: 1000 * MS,
            table_size,
            exempt: vec!["192.0.2.99".parse().unwrap()],
        })
    }

    fn ip(n: u32) -> IpAddr {
        IpAddr::from(std::net::Ipv4Addr::from(0xC000_0200 + n))
    }

    #[test]
    fn over_limit_is_dropped_until_two_quiet_windows() {
        let l = limiter(3, 64);
        for i in 0..3 {
            assert_eq!(
                l.check(ip(1), i * MS),
                FloodVerdict::Pass { untracked: false }
            );
        }
        assert_eq!(l.check(ip(1), 4 * MS), FloodVerdict::Drop { newly: true });
        assert_eq!(l.check(ip(1), 5 * MS), FloodVerdict::Drop { newly: false });
        // Another source is not affected.
        assert_eq!(
            l.check(ip(2), 5 * MS),
            FloodVerdict::Pass { untracked: false }
        );
        // The next window: still blocked (the previous one was over).
        assert_eq!(
            l.check(ip(1), 1500 * MS),
            FloodVerdict::Drop { newly: false }
        );
        // After a window with one request: let through again.
        assert_eq!(
            l.check(ip(1), 2500 * MS),
            FloodVerdict::Pass { untracked: false }
        );
        // Exempt sources are never limited.
        for i in 0..100 {
            assert_eq!(l.check(ip(99), i), FloodVerdict::Pass { untracked: false });
        }
    }

    #[test]
    fn table_is_bounded_and_keeps_blocked_sources() {
        let l = limiter(2, 4); // one set of four ways
        for i in 0..3 {
            l.check(ip(1), i);
        }
        assert!(matches!(l.check(ip(1), 3), FloodVerdict::Drop { .. }));
        // Thousands of other sources (a spoofed flood) cycle through the
        // other ways without evicting the blocked one.
        for n in 10..5000 {
            assert!(matches!(
                l.check(ip(n), 10 + u64::from(n)),
                FloodVerdict::Pass { .. }
            ));
        }
        assert_eq!(l.tracked(), 4);
        assert!(matches!(l.check(ip(1), 6000), FloodVerdict::Drop { .. }));
        // Every way blocked: a new source passes untracked.
        let l = limiter(0, 4);
        for n in 1..=4 {
            assert!(matches!(
                l.check(ip(n), 0),
                FloodVerdict::Drop { newly: true }
            ));
        }
        assert_eq!(l.check(ip(5), 1), FloodVerdict::Pass { untracked: true });
    }
}
