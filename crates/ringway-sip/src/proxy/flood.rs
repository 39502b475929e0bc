//! Flood protection like Kamailio's `pike`: per source (an IPv4 address,
//! or an IPv6 prefix of `ipv6_prefix` bits, /64 by default: one host holds
//! a whole /64), the datagrams of the current and the previous window
//! (`window` ns) are counted; while either count is over `limit`, the
//! source's datagrams are dropped and counted (`DropReason::Flood`) without
//! an answer (a reply to a spoofed source would make us the flood). A
//! response counts a quarter of a request (a UAS sends a few per call it
//! answers): a peer flooding responses is limited too (review S12).
//!
//! The table is bounded and allocated once: a set-associative array of
//! `table_size` slots (4 ways per set, sets behind their own mutex). A new
//! source takes a free slot of its set, else the least recently seen slot
//! whose source is not blocked. If every slot of its set holds a blocked
//! source, the new source is not tracked and passes (counted as
//! `flood_untracked`): a spoofed flood of many addresses cannot evict the
//! sources it is blocked for, and legitimate new sources are not dropped
//! for the table being full. The set of a source is chosen by a hash
//! keyed with `seed` (random per process): which sources share a set
//! cannot be computed from outside.

use super::config::FloodConfig;
use super::outcome::MsgLabel;
use crate::hash::Hash64;
use crate::msg::Method;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Mutex;

/// Slots per set.
const WAYS: usize = 4;
/// Units one request counts; a response counts one unit.
const REQUEST_UNITS: u32 = 4;

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
pub(crate) enum FloodVerdict {
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

/// What a datagram is, for the limiter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum FloodKind {
    /// A request: [`REQUEST_UNITS`] units.
    Request,
    /// A response: one unit.
    Response,
}

/// What the limiter says about one datagram ([`FloodLimiter::check_datagram`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum FloodCheck {
    /// Within the limit, not limited (exempt) or a keep-alive.
    Pass,
    /// Let through because the table had no room for its source.
    Untracked,
    /// Over the limit: drop it unanswered (a reply to a spoofed source
    /// would make us the flood).
    Drop {
        /// This datagram took its source over the limit.
        newly: bool,
        /// The dropped datagram's label for the metrics, from a peek.
        label: MsgLabel,
    },
}

/// Where the message starts in `datagram` (after leading CR/LF) and what
/// it is for the limiter, from its first bytes only (no parse: a flooded
/// datagram costs a peek). `None` for a keep-alive (CR/LF only), which is
/// not counted.
fn kind(datagram: &[u8]) -> Option<(FloodKind, &[u8])> {
    let start = datagram.iter().position(|&b| b != b'\r' && b != b'\n')?;
    let message = &datagram[start..];
    let kind = match message.starts_with(b"SIP/") {
        true => FloodKind::Response,
        false => FloodKind::Request,
    };
    Some((kind, message))
}

/// The metrics label of a message the limiter drops, from a peek: a
/// response by its code (a fixed table, S2), a request by its method token.
fn label(kind: FloodKind, message: &[u8]) -> MsgLabel {
    match kind {
        FloodKind::Response => {
            let code = message
                .get(8..12)
                .and_then(|t| std::str::from_utf8(t).ok())
                .and_then(|t| t.trim().parse().ok())
                .unwrap_or(0);
            MsgLabel::Response(code)
        }
        FloodKind::Request => {
            let method = message
                .split(|&b| b == b' ')
                .next()
                .and_then(|token| std::str::from_utf8(token).ok())
                .map_or(Method::Other(""), Method::from_token);
            MsgLabel::of_method(method)
        }
    }
}

/// The per-source datagram counters.
pub(crate) struct FloodLimiter {
    config: FloodConfig,
    sets: Box<[Mutex<[Slot; WAYS]>]>,
    /// Over this many units per window a source is blocked (a reload may
    /// change it).
    limit_units: AtomicU32,
    /// Window length (ns; a reload may change it).
    window: AtomicU64,
}

/// The key of `source`: an IPv4 address (also IPv4-mapped IPv6), or the
/// IPv6 address cut to its first `ipv6_prefix` bits.
pub(super) fn flood_key(source: IpAddr, ipv6_prefix: u8) -> IpAddr {
    match source.to_canonical() {
        IpAddr::V6(v6) => {
            let bits = u32::from(ipv6_prefix.min(128));
            let mask = u128::MAX.checked_shl(128 - bits).unwrap_or(0);
            IpAddr::V6((u128::from(v6) & mask).into())
        }
        v4 => v4,
    }
}

impl FloodLimiter {
    pub(crate) fn new(config: FloodConfig) -> FloodLimiter {
        let sets = config.table_size.div_ceil(WAYS).max(1);
        FloodLimiter {
            sets: (0..sets)
                .map(|_| Mutex::new([Slot::default(); WAYS]))
                .collect(),
            limit_units: AtomicU32::new(config.limit.saturating_mul(REQUEST_UNITS)),
            window: AtomicU64::new(config.window),
            config,
        }
    }

    /// The set `key` lives in.
    fn set_index(&self, key: IpAddr) -> usize {
        let mut hash = Hash64::new(self.config.seed ^ 0xF100D);
        match key {
            IpAddr::V4(v4) => hash.bytes(&v4.octets()),
            IpAddr::V6(v6) => hash.bytes(&v6.octets()),
        };
        (hash.finish() % self.sets.len() as u64) as usize
    }

    /// Count a request from `source` at `now`.
    #[cfg(test)]
    pub(super) fn check(&self, source: IpAddr, now: u64) -> FloodVerdict {
        self.count(source, FloodKind::Request, now)
    }

    /// Count a datagram of `kind` from `source` at `now`.
    pub(crate) fn count(&self, source: IpAddr, kind: FloodKind, now: u64) -> FloodVerdict {
        if self.config.exempt.contains(&source) {
            return FloodVerdict::Pass { untracked: false };
        }
        let source = flood_key(source, self.config.ipv6_prefix);
        let units = match kind {
            FloodKind::Request => REQUEST_UNITS,
            FloodKind::Response => 1,
        };
        let index = self.set_index(source);
        let mut set = self.sets[index].lock().unwrap_or_else(|e| e.into_inner());
        let limit = self.limit_units.load(Ordering::Relaxed);
        let window = self.window.load(Ordering::Relaxed);
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
        slot.count = slot.count.saturating_add(units);
        slot.last_seen = now;
        if slot.blocked(limit) {
            FloodVerdict::Drop {
                newly: !was_blocked,
            }
        } else {
            FloodVerdict::Pass { untracked: false }
        }
    }

    /// Count `datagram` from `source` at `now` against its source's limit
    /// (a response a quarter of a request, keep-alives not at all), before
    /// any parse: the one flood check of the proxy and the dispatcher.
    pub(crate) fn check_datagram(&self, source: IpAddr, datagram: &[u8], now: u64) -> FloodCheck {
        let Some((kind, message)) = kind(datagram) else {
            return FloodCheck::Pass;
        };
        match self.count(source, kind, now) {
            FloodVerdict::Pass { untracked: false } => FloodCheck::Pass,
            FloodVerdict::Pass { untracked: true } => FloodCheck::Untracked,
            FloodVerdict::Drop { newly } => FloodCheck::Drop {
                newly,
                label: label(kind, message),
            },
        }
    }

    /// New limit (requests per window) and window (ns), from the next
    /// datagram on; what the table tracks stays (a reload).
    pub(super) fn set_limits(&self, limit: u32, window: u64) {
        self.limit_units
            .store(limit.saturating_mul(REQUEST_UNITS), Ordering::Relaxed);
        self.window.store(window.max(1), Ordering::Relaxed);
    }

    /// Sources tracked now.
    pub(crate) fn tracked(&self) -> usize {
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
            ..FloodConfig::default()
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

    fn v6(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    #[test]
    fn ipv6_sources_are_keyed_by_prefix() {
        // Review S12: one host owns a whole /64; rotating addresses in it
        // is one source.
        let l = limiter(3, 64);
        for i in 0..3u64 {
            let a = v6(&format!("2001:db8:1:2::{:x}", i + 1));
            assert_eq!(l.check(a, i), FloodVerdict::Pass { untracked: false });
        }
        assert_eq!(
            l.check(v6("2001:db8:1:2:ffff::9"), 4),
            FloodVerdict::Drop { newly: true }
        );
        // Another /64 is another source.
        assert_eq!(
            l.check(v6("2001:db8:1:3::1"), 5),
            FloodVerdict::Pass { untracked: false }
        );
        assert_eq!(
            flood_key(v6("2001:db8:1:2:3:4:5:6"), 48),
            v6("2001:db8:1::")
        );
        assert_eq!(flood_key(v6("2001:db8::1"), 128), v6("2001:db8::1"));
        assert_eq!(flood_key(v6("2001:db8::1"), 0), v6("::"));
        // IPv4 (also mapped) stays a whole address.
        assert_eq!(flood_key(v6("::ffff:192.0.2.7"), 64), ip(7));
    }

    #[test]
    fn responses_count_a_quarter_of_a_request() {
        // Review S12: responses were never counted.
        let l = limiter(2, 64);
        for i in 0..8 {
            assert_eq!(
                l.count(ip(1), FloodKind::Response, i),
                FloodVerdict::Pass { untracked: false },
                "response {i}"
            );
        }
        assert_eq!(
            l.count(ip(1), FloodKind::Response, 9),
            FloodVerdict::Drop { newly: true }
        );
        // A blocked source's requests are dropped too.
        assert!(matches!(l.check(ip(1), 10), FloodVerdict::Drop { .. }));
    }

    #[test]
    fn datagrams_are_told_apart_by_a_peek_and_labelled_when_dropped() {
        // The one check of the proxy and the dispatcher: keep-alives are
        // not counted, a response counts a quarter, a drop carries the
        // label of a peek (method token, or the code's fixed slot).
        let l = limiter(1, 64);
        for i in 0..10 {
            assert_eq!(l.check_datagram(ip(1), b"\r\n\r\n", i), FloodCheck::Pass);
        }
        let response = b"\r\nSIP/2.0 486 Busy Here\r\nVia: x\r\n\r\n";
        for i in 0..4 {
            assert_eq!(l.check_datagram(ip(1), response, i), FloodCheck::Pass);
        }
        assert_eq!(
            l.check_datagram(ip(1), response, 5),
            FloodCheck::Drop {
                newly: true,
                label: MsgLabel::Response(486)
            }
        );
        assert_eq!(
            l.check_datagram(ip(1), b"BYE sip:b@x SIP/2.0\r\n\r\n", 6),
            FloodCheck::Drop {
                newly: false,
                label: MsgLabel::of_method(Method::Bye)
            }
        );
        // A request counts four units: the second one from a fresh source
        // is over a limit of one.
        let invite = b"INVITE sip:b@x SIP/2.0\r\n\r\n";
        assert_eq!(l.check_datagram(ip(2), invite, 7), FloodCheck::Pass);
        assert!(matches!(
            l.check_datagram(ip(2), invite, 8),
            FloodCheck::Drop { newly: true, label } if label == MsgLabel::of_method(Method::Invite)
        ));
        // A table with no room: untracked.
        let l = limiter(0, 4);
        for n in 1..=4 {
            l.check_datagram(ip(n), invite, 0);
        }
        assert_eq!(l.check_datagram(ip(5), invite, 1), FloodCheck::Untracked);
    }

    #[test]
    fn the_set_of_a_source_depends_on_the_seed() {
        let with_seed = |seed| {
            FloodLimiter::new(FloodConfig {
                table_size: 4096,
                seed,
                ..FloodConfig::default()
            })
        };
        let (a, b) = (with_seed(1), with_seed(2));
        let sets = |l: &FloodLimiter| (0..64).map(|n| l.set_index(ip(n))).collect::<Vec<_>>();
        assert_eq!(sets(&a), sets(&with_seed(1)));
        assert_ne!(sets(&a), sets(&b));
    }
}
