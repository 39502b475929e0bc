//! The dialogs set up through a stateful proxy, kept as ids only (a hash
//! of the Call-ID and both tags, the same whichever side sends), so that a
//! drain can wait for the calls in progress to end: a dialog is added when
//! the first 2xx to an INVITE outside a dialog goes upstream, and removed
//! when a BYE for it is forwarded. Bounded by count; a dialog older than
//! [`MAX_AGE`] is forgotten when room is needed (its BYE went another way,
//! or never came).

use crate::hash::MacKey;
use crate::msg::SipMsg;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

/// A dialog tracked longer than this (ns) may be forgotten when the set
/// is full.
pub(super) const MAX_AGE: u64 = 4 * 3600 * 1_000_000_000;
/// The full set is swept for old dialogs at most this often (ns).
const SWEEP_EVERY: u64 = 1_000_000_000;
const SHARDS: usize = 16;

/// Dialog ids and when each was set up, sharded.
pub(super) struct DialogSet {
    shards: Box<[Mutex<HashMap<u64, u64>>]>,
    per_shard: usize,
    /// Keys the ids (secret: nobody can make a BYE of theirs end another's
    /// dialog here).
    key: MacKey,
    len: AtomicUsize,
    last_sweep: AtomicU64,
}

impl DialogSet {
    /// A set of about `capacity` dialogs, their ids keyed by `key`.
    pub(super) fn new(capacity: usize, key: MacKey) -> DialogSet {
        DialogSet {
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            per_shard: capacity.div_ceil(SHARDS).max(1),
            key,
            len: AtomicUsize::new(0),
            last_sweep: AtomicU64::new(0),
        }
    }

    /// The dialog `msg` (a 2xx or an in-dialog request) belongs to.
    fn id(&self, msg: &SipMsg<'_>) -> Option<u64> {
        let call_id = msg.call_id()?;
        // The same whichever side sends: the two tags in a fixed order.
        let (from, to) = (msg.from_tag().unwrap_or(""), msg.to_tag().unwrap_or(""));
        let (low, high) = if from <= to { (from, to) } else { (to, from) };
        Some(self.key.mac().str(call_id).str(low).str(high).finish())
    }

    fn shard(&self, id: u64) -> MutexGuard<'_, HashMap<u64, u64>> {
        self.shards[(id % SHARDS as u64) as usize]
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// The 2xx `response` to an INVITE outside a dialog went upstream at
    /// `now`: its dialog is set up. `false` if it was known already or
    /// there is no room.
    pub(super) fn confirmed(&self, now: u64, response: &SipMsg<'_>) -> bool {
        let Some(id) = self.id(response) else {
            return false;
        };
        let mut shard = self.shard(id);
        if shard.contains_key(&id) {
            return false;
        }
        if shard.len() >= self.per_shard {
            let last = self.last_sweep.load(Ordering::Relaxed);
            if now.saturating_sub(last) < SWEEP_EVERY
                || self
                    .last_sweep
                    .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                    .is_err()
            {
                return false;
            }
            let before = shard.len();
            shard.retain(|_, since| now.saturating_sub(*since) < MAX_AGE);
            self.len.fetch_sub(before - shard.len(), Ordering::Relaxed);
            if shard.len() >= self.per_shard {
                return false;
            }
        }
        shard.insert(id, now);
        self.len.fetch_add(1, Ordering::Relaxed);
        true
    }

    /// A BYE (`request`) was forwarded: its dialog ends. `false` if it was
    /// not tracked.
    pub(super) fn ended(&self, request: &SipMsg<'_>) -> bool {
        let Some(id) = self.id(request) else {
            return false;
        };
        if self.shard(id).remove(&id).is_some() {
            self.len.fetch_sub(1, Ordering::Relaxed);
            return true;
        }
        false
    }

    /// Dialogs tracked now.
    pub(super) fn len(&self) -> usize {
        self.len.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(text: &str) -> Vec<u8> {
        text.replace('\n', "\r\n").into_bytes()
    }

    #[test]
    fn a_bye_from_either_side_ends_the_dialog_its_2xx_set_up() {
        let set = DialogSet::new(64, MacKey::new([7; 16]));
        let ok = msg("SIP/2.0 200 OK\nVia: SIP/2.0/UDP 192.0.2.1;branch=z9hG4bKa\nFrom: <sip:a@x>;tag=aa\nTo: <sip:b@x>;tag=bb\nCall-ID: c1\nCSeq: 1 INVITE\nContent-Length: 0\n\n");
        let ok = SipMsg::parse(&ok).unwrap();
        assert!(set.confirmed(1, &ok));
        assert!(
            !set.confirmed(2, &ok),
            "a retransmitted 2xx is the same dialog"
        );
        assert_eq!(set.len(), 1);
        // The callee's BYE: the tags swapped.
        let bye = msg("BYE sip:a@192.0.2.1 SIP/2.0\nVia: SIP/2.0/UDP 192.0.2.2;branch=z9hG4bKb\nFrom: <sip:b@x>;tag=bb\nTo: <sip:a@x>;tag=aa\nCall-ID: c1\nCSeq: 1 BYE\nMax-Forwards: 70\nContent-Length: 0\n\n");
        let bye = SipMsg::parse(&bye).unwrap();
        assert!(set.ended(&bye));
        assert!(!set.ended(&bye), "ended once");
        assert_eq!(set.len(), 0);
    }

    #[test]
    fn a_full_set_forgets_old_dialogs_only() {
        // One dialog per shard at most.
        let set = DialogSet::new(SHARDS, MacKey::new([7; 16]));
        let ok = |call: usize| {
            msg(&format!("SIP/2.0 200 OK\nVia: SIP/2.0/UDP 192.0.2.1;branch=z9hG4bKa\nFrom: <sip:a@x>;tag=aa\nTo: <sip:b@x>;tag=bb\nCall-ID: c{call}\nCSeq: 1 INVITE\nContent-Length: 0\n\n"))
        };
        let mut tracked = 0;
        for call in 0..200 {
            let text = ok(call);
            tracked += usize::from(set.confirmed(1, &SipMsg::parse(&text).unwrap()));
        }
        assert_eq!(set.len(), tracked);
        assert!(tracked <= SHARDS);
        // Not old yet: nothing forgotten, nothing new tracked.
        let late = (200..400).filter(|call| {
            let text = ok(*call);
            set.confirmed(2 * SWEEP_EVERY, &SipMsg::parse(&text).unwrap())
        });
        assert_eq!(late.count(), 0);
        // Past MAX_AGE: room is made for new dialogs.
        let text = ok(1000);
        let mut now = MAX_AGE + 10 * SWEEP_EVERY;
        let mut added = false;
        for _ in 0..SHARDS * 4 {
            now += SWEEP_EVERY;
            added |= set.confirmed(now, &SipMsg::parse(&text).unwrap());
        }
        assert!(added);
        assert!(set.len() <= tracked);
    }
}
