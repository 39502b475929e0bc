//! The new INVITEs a pool's workers dropped unanswered (they waited past
//! the drop bound), remembered by Call-ID so that their senders' resends
//! are told apart from new calls.
//!
//! Why: a sender resends an INVITE that got no answer on timer A (0.5 s,
//! then 1.5 s, 3.5 s, … after the first send: RFC 3261 §17.1.1.2) whatever
//! the advertisement asks of its *new* calls. At the onset of an overload
//! the queue passes the drop bound before the shedder and the senders'
//! throttles catch up, so thousands of INVITEs are dropped and come back
//! half a second later, and again a second after that. Counted as arrivals,
//! they made the controller ask the conforming senders to make room for a
//! wave that was already over: in `tests/overload_control_sim.rs` the
//! reduction rose to 85–88 % against a fixed point of 67 % and the second
//! after the onset admitted 81 % of the capacity; measured on the quiet
//! machine (bench/sip/overload.sh) the share kept fell to 0.17 against
//! 0.29 and the second after the onset completed 78 % of the capacity.
//! Resends still count as work served when admitted (the capacity is what
//! the proxy completes); they only stay out of the arrivals the
//! advertisement is computed against, and the shedder deals with them.
//!
//! A fixed table of [`SLOTS`] keyed 64-bit hashes (256 KB, allocated at the
//! first drop), one per slot, shared by the pool's workers without a lock:
//! a newer drop overwrites an older one in its slot, a false match (another
//! Call-ID with the same hash) only counts one new call as a resend. The
//! hash is SipHash under a key random per pool ([`crate::hash::MacKey`];
//! seeded only in simulations), so a sender cannot aim Call-IDs at one
//! slot. Nothing here grows with what a sender sends.

use crate::hash::MacKey;
use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

/// Slots of the table: more than the drops of one onset's first 0.5 s at
/// several times the capacity measured here (about 10 000).
pub(super) const SLOTS: usize = 1 << 15;
/// How long after a drop a resend is still expected (ns): timer B, 64·T1.
pub(super) const RESEND_WINDOW_NS: u64 = 32_000_000_000;

/// See the module documentation.
pub(super) struct DroppedInvites {
    key: MacKey,
    /// Keyed hashes (never 0: 0 is an empty slot), allocated at the first
    /// drop.
    slots: OnceLock<Box<[AtomicU64]>>,
    /// When the last drop was remembered (the driver's clock, ns; 0: never).
    /// The driver's clock is the wall clock: if it steps back, resends are
    /// expected (peeked for) until it has caught up — extra peeks, no more.
    last_drop: AtomicU64,
}

impl std::fmt::Debug for DroppedInvites {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DroppedInvites")
            .field("slots", &self.slots.get().map_or(0, |slots| slots.len()))
            .field("last_drop", &self.last_drop.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl DroppedInvites {
    /// A table keyed at random (the operating system's entropy, through
    /// the standard library's hash-map keys).
    pub(super) fn new() -> DroppedInvites {
        let random = RandomState::new();
        let mut key = [0u8; 16];
        key[..8].copy_from_slice(&random.hash_one(0u8).to_le_bytes());
        key[8..].copy_from_slice(&random.hash_one(1u8).to_le_bytes());
        DroppedInvites::keyed(MacKey::new(key))
    }

    /// A table under `key` (a seeded one makes a simulation repeat).
    pub(super) fn keyed(key: MacKey) -> DroppedInvites {
        DroppedInvites {
            key,
            slots: OnceLock::new(),
            last_drop: AtomicU64::new(0),
        }
    }

    /// The slot and the stored value of `call_id`.
    fn place(&self, call_id: &[u8]) -> (usize, u64) {
        let hash = self.key.mac().raw(call_id).finish();
        ((hash >> 32) as usize % SLOTS, hash | 1)
    }

    /// A new INVITE with `call_id` was dropped unanswered at `now` (ns).
    pub(super) fn remember(&self, now: u64, call_id: &[u8]) {
        let slots = self
            .slots
            .get_or_init(|| (0..SLOTS).map(|_| AtomicU64::new(0)).collect());
        let (slot, value) = self.place(call_id);
        slots[slot].store(value, Ordering::Relaxed);
        self.last_drop.fetch_max(now.max(1), Ordering::Relaxed);
    }

    /// Whether a new INVITE with `call_id` is the resend of one dropped
    /// unanswered; a match is forgotten (the next copy of an INVITE that
    /// is admitted is the transaction's, of one dropped again it is
    /// remembered again).
    pub(super) fn take(&self, call_id: &[u8]) -> bool {
        let Some(slots) = self.slots.get() else {
            return false;
        };
        let (slot, value) = self.place(call_id);
        slots[slot]
            .compare_exchange(value, 0, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
    }

    /// Whether a drop was remembered within [`RESEND_WINDOW_NS`] before
    /// `now`: only then is a new INVITE's Call-ID worth a look.
    pub(super) fn expected(&self, now: u64) -> bool {
        let last = self.last_drop.load(Ordering::Relaxed);
        last != 0 && now.saturating_sub(last) <= RESEND_WINDOW_NS
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;

    #[test]
    fn a_dropped_invite_is_recognised_once_when_it_comes_back() {
        let dropped = DroppedInvites::new();
        assert!(!dropped.expected(S));
        assert!(!dropped.take(b"c1@host"), "nothing dropped yet");
        dropped.remember(S, b"c1@host");
        assert!(dropped.expected(S + S / 2));
        assert!(!dropped.take(b"c2@host"), "another call");
        assert!(dropped.take(b"c1@host"), "its resend");
        assert!(!dropped.take(b"c1@host"), "counted once");
        // Expected for timer B's 32 s after the last drop, not after.
        assert!(dropped.expected(S + RESEND_WINDOW_NS));
        assert!(!dropped.expected(2 * S + RESEND_WINDOW_NS));
    }

    #[test]
    fn the_table_stays_fixed_however_many_invites_are_dropped() {
        let dropped = DroppedInvites::new();
        let many = 4 * SLOTS;
        for i in 0..many {
            dropped.remember(S, format!("call-{i}").as_bytes());
        }
        assert_eq!(dropped.slots.get().map(|slots| slots.len()), Some(SLOTS));
        // The newest drops are still there (a slot keeps the last one
        // written to it); most of the oldest were overwritten.
        let recent = (many - 1_000..many)
            .filter(|i| dropped.take(format!("call-{i}").as_bytes()))
            .count();
        assert!(recent >= 950, "{recent} of the last 1 000");
        let oldest = (0..1_000)
            .filter(|i| dropped.take(format!("call-{i}").as_bytes()))
            .count();
        assert!(oldest <= 100, "{oldest} of the first 1 000");
    }
}
