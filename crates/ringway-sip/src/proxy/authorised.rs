//! Where a stateless proxy sent authenticated INVITEs, so that their
//! CANCEL and the ACK of their non-2xx final response (same branch, same
//! source, never authenticated themselves: RFC 3261 22.1) may follow them
//! there (RFC 3261 16.10, 16.11) and nowhere else. A fixed table
//! (allocated once, direct-mapped, the oldest entry of a slot overwritten):
//! bounded in bytes whatever the traffic; a forgotten entry only means
//! that CANCEL or ACK is refused like any unauthenticated request.

use crate::hash::MacKey;
use std::net::SocketAddr;
use std::sync::Mutex;

/// Slots in all (a few hundred seconds of authenticated calls at the
/// rates a stateless proxy sees; each slot 40 bytes).
const SLOTS: usize = 8192;
const SHARDS: usize = 32;

/// One slot: the key of a (transaction, source) and where it went.
type Slot = (u64, Option<SocketAddr>);

/// The table (see the module documentation).
pub(super) struct AuthorisedHops {
    shards: Box<[Mutex<Box<[Slot]>>]>,
    /// Keys the slots (secret: nobody can aim at another's slot).
    key: MacKey,
}

impl AuthorisedHops {
    pub(super) fn new(key: MacKey) -> AuthorisedHops {
        AuthorisedHops {
            shards: (0..SHARDS)
                .map(|_| Mutex::new(vec![(0, None); SLOTS / SHARDS].into_boxed_slice()))
                .collect(),
            key,
        }
    }

    fn key(&self, transaction: u64, upstream: SocketAddr) -> u64 {
        self.key.mac().u64(transaction).addr(upstream).finish() | 1
    }

    fn slot<R>(&self, key: u64, f: impl FnOnce(&mut Slot) -> R) -> R {
        let shard = &self.shards[(key >> 59) as usize % SHARDS];
        let mut slots = shard.lock().unwrap_or_else(|e| e.into_inner());
        let len = slots.len();
        f(&mut slots[(key as usize) % len])
    }

    /// The INVITE of transaction `transaction` from `upstream`,
    /// authenticated, went to `to`.
    pub(super) fn remember(&self, transaction: u64, upstream: SocketAddr, to: SocketAddr) {
        let key = self.key(transaction, upstream);
        self.slot(key, |slot| *slot = (key, Some(to)));
    }

    /// Whether the INVITE of `transaction` from `upstream` went to `to`.
    pub(super) fn went_to(&self, transaction: u64, upstream: SocketAddr, to: SocketAddr) -> bool {
        let key = self.key(transaction, upstream);
        self.slot(key, |slot| *slot == (key, Some(to)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remembers_by_transaction_and_source_and_forgets_by_overwrite() {
        let table = AuthorisedHops::new(MacKey::new([7; 16]));
        let uac: SocketAddr = "192.0.2.1:5060".parse().unwrap();
        let far: SocketAddr = "203.0.113.7:5060".parse().unwrap();
        table.remember(42, uac, far);
        assert!(table.went_to(42, uac, far));
        assert!(!table.went_to(42, "192.0.2.9:5060".parse().unwrap(), far));
        assert!(!table.went_to(43, uac, far));
        assert!(!table.went_to(42, uac, "203.0.113.8:5060".parse().unwrap()));
        // Bounded: many more entries than slots, memory unchanged.
        for t in 0..(4 * SLOTS as u64) {
            table.remember(1000 + t, uac, far);
        }
        assert_eq!(
            table.shards.len() * table.shards[0].lock().unwrap().len(),
            SLOTS
        );
    }
}
