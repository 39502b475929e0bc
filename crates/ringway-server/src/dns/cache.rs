//! The answer cache: records per question until their TTL runs out, and
//! negative answers (no such name, no data) for the SOA's negative TTL
//! (RFC 2308), within configured floors and ceilings. Bounded by entries
//! and by bytes: a full cache first drops what has expired, then the entry
//! closest to expiry.

use super::rfc3263::Question;
use super::wire::Record;
use std::collections::HashMap;

/// What is cached for a question.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Cached {
    /// The records (possibly empty after filtering is left to the reader).
    Records(Vec<Record>),
    /// The name or the type does not exist.
    Negative,
}

impl Cached {
    fn footprint(&self) -> usize {
        match self {
            Cached::Records(records) => records
                .iter()
                .map(|r| r.name.len() + r.data.footprint() + 8)
                .sum(),
            Cached::Negative => 0,
        }
    }
}

#[derive(Debug)]
struct Entry {
    expires: u64,
    value: Cached,
    footprint: usize,
}

/// Limits of a [`Cache`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CacheLimits {
    /// Entries at most.
    pub max_entries: usize,
    /// Bytes of names and records at most (approximate: the data, not the
    /// table's own overhead).
    pub max_bytes: usize,
    /// Longest time a positive answer is kept (s), whatever its TTL.
    pub max_ttl_s: u32,
    /// Time a negative answer is kept (s) when no SOA says (and the cap
    /// of what an SOA says).
    pub negative_ttl_s: u32,
}

impl Default for CacheLimits {
    fn default() -> CacheLimits {
        CacheLimits {
            max_entries: 4096,
            max_bytes: 4 << 20,
            max_ttl_s: 86_400,
            negative_ttl_s: 30,
        }
    }
}

/// A bounded TTL cache of DNS answers (not thread-safe: the resolver holds
/// it behind a mutex).
#[derive(Debug)]
pub struct Cache {
    limits: CacheLimits,
    entries: HashMap<Question, Entry>,
    bytes: usize,
}

const ENTRY_OVERHEAD: usize = 64;

impl Cache {
    /// An empty cache.
    pub fn new(limits: CacheLimits) -> Cache {
        Cache {
            limits,
            entries: HashMap::new(),
            bytes: 0,
        }
    }

    /// The cached answer to `question` at `now` (ns), if not expired.
    pub fn get(&mut self, question: &Question, now: u64) -> Option<&Cached> {
        let expired = self.entries.get(question)?.expires <= now;
        if expired {
            self.remove(question);
            return None;
        }
        self.entries.get(question).map(|e| &e.value)
    }

    /// Keep `value` for `question` from `now` (ns) for `ttl_s` seconds
    /// (capped by the limits; a negative answer without a TTL gets the
    /// configured one). A TTL of 0 is not cached.
    pub fn put(&mut self, question: Question, value: Cached, ttl_s: Option<u32>, now: u64) {
        let ttl = match value {
            Cached::Records(_) => ttl_s.unwrap_or(0).min(self.limits.max_ttl_s),
            Cached::Negative => ttl_s
                .unwrap_or(self.limits.negative_ttl_s)
                .min(self.limits.negative_ttl_s),
        };
        if ttl == 0 {
            return;
        }
        let footprint = question.name.len() + value.footprint() + ENTRY_OVERHEAD;
        if footprint > self.limits.max_bytes || self.limits.max_entries == 0 {
            return;
        }
        self.remove(&question);
        while self.entries.len() >= self.limits.max_entries
            || self.bytes + footprint > self.limits.max_bytes
        {
            if !self.evict(now) {
                return;
            }
        }
        self.bytes += footprint;
        let expires = now.saturating_add(u64::from(ttl) * 1_000_000_000);
        self.entries.insert(
            question,
            Entry {
                expires,
                value,
                footprint,
            },
        );
    }

    /// The limits it was built with.
    pub fn limits(&self) -> CacheLimits {
        self.limits
    }

    /// Entries held.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether nothing is held.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Bytes held (as counted against `max_bytes`).
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    fn remove(&mut self, question: &Question) {
        if let Some(entry) = self.entries.remove(question) {
            self.bytes -= entry.footprint;
        }
    }

    /// Drop every expired entry, or else the one closest to expiry; `false`
    /// if the cache is empty.
    fn evict(&mut self, now: u64) -> bool {
        let before = self.entries.len();
        let mut freed = 0;
        self.entries.retain(|_, e| {
            let keep = e.expires > now;
            if !keep {
                freed += e.footprint;
            }
            keep
        });
        self.bytes -= freed;
        if self.entries.len() < before {
            return true;
        }
        let Some(oldest) = self
            .entries
            .iter()
            .min_by_key(|(_, e)| e.expires)
            .map(|(q, _)| q.clone())
        else {
            return false;
        };
        self.remove(&oldest);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dns::wire::{RecordData, RecordType};
    use std::net::Ipv4Addr;

    const S: u64 = 1_000_000_000;

    fn q(name: &str) -> Question {
        Question {
            name: name.into(),
            record_type: RecordType::A,
        }
    }

    fn a(name: &str) -> Cached {
        Cached::Records(vec![Record {
            name: name.into(),
            ttl: 10,
            data: RecordData::A(Ipv4Addr::LOCALHOST),
        }])
    }

    #[test]
    fn entries_expire_with_their_ttl_and_negatives_with_theirs() {
        let mut cache = Cache::new(CacheLimits::default());
        cache.put(q("a"), a("a"), Some(10), 0);
        cache.put(q("n"), Cached::Negative, Some(5), 0);
        cache.put(q("zero"), a("zero"), Some(0), 0);
        assert!(cache.get(&q("a"), 9 * S).is_some());
        assert_eq!(cache.get(&q("n"), 4 * S), Some(&Cached::Negative));
        assert!(cache.get(&q("n"), 5 * S).is_none());
        assert!(cache.get(&q("a"), 10 * S).is_none());
        assert!(cache.get(&q("zero"), 0).is_none());
        assert!(cache.is_empty());
        assert_eq!(cache.bytes(), 0);
        // A negative without an SOA: the configured time; a long SOA
        // negative TTL is capped; a long positive TTL too.
        let limits = CacheLimits {
            max_ttl_s: 100,
            negative_ttl_s: 30,
            ..CacheLimits::default()
        };
        let mut cache = Cache::new(limits);
        cache.put(q("n"), Cached::Negative, None, 0);
        cache.put(q("m"), Cached::Negative, Some(3600), 0);
        cache.put(q("a"), a("a"), Some(1_000_000), 0);
        assert!(cache.get(&q("n"), 29 * S).is_some());
        assert!(cache.get(&q("m"), 30 * S).is_none());
        assert!(cache.get(&q("a"), 100 * S).is_none());
    }

    #[test]
    fn bounded_by_entries_and_bytes() {
        let mut cache = Cache::new(CacheLimits {
            max_entries: 3,
            ..CacheLimits::default()
        });
        for i in 0..10u64 {
            cache.put(q(&format!("n{i}")), a("x"), Some(10 + i as u32), 0);
        }
        assert_eq!(cache.len(), 3);
        // The ones closest to expiry went first.
        assert!(cache.get(&q("n9"), 0).is_some());
        assert!(cache.get(&q("n0"), 0).is_none());
        let mut cache = Cache::new(CacheLimits {
            max_bytes: 1000,
            ..CacheLimits::default()
        });
        for i in 0..100 {
            cache.put(q(&format!("name-{i}")), a("x"), Some(60), 0);
            assert!(cache.bytes() <= 1000);
        }
        assert!(cache.len() < 10);
        // Larger than the whole cache: not kept.
        let big = Cached::Records(
            (0..50)
                .map(|_| Record {
                    name: "x".repeat(100),
                    ttl: 1,
                    data: RecordData::A(Ipv4Addr::LOCALHOST),
                })
                .collect(),
        );
        cache.put(q("big"), big, Some(60), 0);
        assert!(cache.get(&q("big"), 0).is_none());
    }
}
