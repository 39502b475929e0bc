//! Replay protection: the highest `nc` seen per nonce, in a bounded table
//! shared by all workers (RFC 7616 3.4: a server that tracks nc can refuse
//! a request whose nc it has seen).
//!
//! A repeated (nonce, nc) is a replay unless it comes with the same
//! transaction as the first use: then it is a retransmission of the same
//! request (a stateless proxy cannot absorb those, and a retransmission is
//! not a new request). The table is bounded: when full, the oldest entry is
//! evicted, and a nonce that may have been evicted (its id is at most the
//! highest id evicted from its shard) is never trusted again: it gets a
//! new challenge instead of a chance at being replayed.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

const SHARDS: usize = 16;

/// The verdict on a (nonce, nc) pair.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReplayCheck {
    /// A higher nc than any seen with this nonce (recorded).
    New,
    /// The same nc again with the same transaction: a retransmission.
    Retransmission,
    /// An nc already used by another request: a replay.
    Replay,
    /// The nonce's entry may have been evicted: use a new nonce.
    Forgotten,
}

#[derive(Clone, Copy)]
struct Seen {
    nc: u32,
    transaction: u64,
}

#[derive(Default)]
struct Shard {
    seen: HashMap<u64, Seen>,
    order: VecDeque<u64>,
    /// Highest nonce id evicted from this shard (0: none).
    evicted_up_to: u64,
}

/// Seen (nonce id, nc) pairs, bounded.
pub struct ReplayTable {
    shards: Box<[Mutex<Shard>]>,
    per_shard: usize,
}

impl ReplayTable {
    /// A table of about `capacity` nonces (at least one per shard).
    pub fn new(capacity: usize) -> ReplayTable {
        ReplayTable {
            shards: (0..SHARDS).map(|_| Mutex::new(Shard::default())).collect(),
            per_shard: capacity.div_ceil(SHARDS).max(1),
        }
    }

    /// Check the use of nonce `id` with `nc` by the request of
    /// `transaction` (its transaction hash), and record it if new.
    pub fn check(&self, id: u64, nc: u32, transaction: u64) -> ReplayCheck {
        let mut shard = self.shards[(id % SHARDS as u64) as usize]
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if let Some(seen) = shard.seen.get_mut(&id) {
            return if nc > seen.nc {
                *seen = Seen { nc, transaction };
                ReplayCheck::New
            } else if nc == seen.nc && transaction == seen.transaction {
                ReplayCheck::Retransmission
            } else {
                ReplayCheck::Replay
            };
        }
        if id <= shard.evicted_up_to {
            return ReplayCheck::Forgotten;
        }
        if shard.seen.len() >= self.per_shard {
            while let Some(oldest) = shard.order.pop_front() {
                if shard.seen.remove(&oldest).is_some() {
                    shard.evicted_up_to = shard.evicted_up_to.max(oldest);
                    break;
                }
            }
        }
        shard.seen.insert(id, Seen { nc, transaction });
        shard.order.push_back(id);
        ReplayCheck::New
    }

    /// Number of nonces tracked.
    pub fn len(&self) -> usize {
        self.shards
            .iter()
            .map(|s| s.lock().map_or(0, |s| s.seen.len()))
            .sum()
    }

    /// Whether no nonce is tracked.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replays_refused_retransmissions_allowed() {
        let table = ReplayTable::new(64);
        assert_eq!(table.check(1, 1, 100), ReplayCheck::New);
        assert_eq!(table.check(1, 1, 100), ReplayCheck::Retransmission);
        assert_eq!(table.check(1, 1, 101), ReplayCheck::Replay);
        assert_eq!(table.check(1, 2, 102), ReplayCheck::New);
        assert_eq!(table.check(1, 1, 100), ReplayCheck::Replay, "older nc");
        assert_eq!(table.check(2, 1, 101), ReplayCheck::New, "another nonce");
    }

    #[test]
    fn bounded_and_evicted_nonces_are_not_trusted() {
        // One entry per shard: ids 16 and 32 share shard 0.
        let table = ReplayTable::new(SHARDS);
        assert_eq!(table.check(16, 1, 1), ReplayCheck::New);
        assert_eq!(table.check(32, 1, 2), ReplayCheck::New);
        assert_eq!(table.len(), 1);
        // 16 was evicted: its nc history is gone, so it is not trusted.
        assert_eq!(table.check(16, 1, 1), ReplayCheck::Forgotten);
        assert_eq!(table.check(16, 5, 3), ReplayCheck::Forgotten);
        // Newer nonces are still tracked.
        assert_eq!(table.check(48, 1, 4), ReplayCheck::New);
        for id in 0..10_000u64 {
            table.check(id * 7 + 1000, 1, id);
        }
        assert!(table.len() <= SHARDS);
    }
}
