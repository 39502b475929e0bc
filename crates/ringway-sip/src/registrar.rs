//! Location service: the [`LocationStore`] trait and a bounded in-memory
//! implementation ([`MemoryStore`]). Times are monotonic nanoseconds.
//!
//! The store only stores: the registrar's rules (who may change an AOR,
//! Expires bounds, contacts per AOR, Call-ID/CSeq ordering) are applied by
//! the proxy core before it calls the store, so a shared store that can
//! fail ([`StoreError::Unavailable`]) can back the same rules.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

/// One contact bound to an address-of-record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Binding {
    /// Contact URI (without `<>` and header parameters).
    pub contact: String,
    /// Expiry time, monotonic ns.
    pub expires_at: u64,
    /// Call-ID of the REGISTER that last set it (RFC 3261 10.3 step 7).
    pub call_id: String,
    /// CSeq number of that REGISTER.
    pub cseq: u32,
}

/// Why a binding could not be stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StoreError {
    /// The store is at capacity.
    Full,
    /// Too many contacts for this AOR.
    TooManyContacts,
    /// The store cannot be reached (a shared store down).
    Unavailable,
}

impl std::fmt::Display for StoreError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            StoreError::Full => "location store full",
            StoreError::TooManyContacts => "too many contacts for AOR",
            StoreError::Unavailable => "location store unavailable",
        })
    }
}

impl std::error::Error for StoreError {}

/// A location service shared by all proxy worker threads.
pub trait LocationStore: Send + Sync {
    /// Add `binding` to `aor`, or replace the binding of the same contact.
    fn put(&self, aor: &str, binding: Binding) -> Result<(), StoreError>;
    /// Unexpired bindings of `aor` at `now`, most recently refreshed first.
    fn lookup(&self, aor: &str, now: u64) -> Result<Vec<Binding>, StoreError>;
    /// Remove one contact (`Some`) or all contacts (`None`) of `aor`.
    fn remove(&self, aor: &str, contact: Option<&str>) -> Result<(), StoreError>;
    /// Drop expired bindings; returns how many were removed.
    fn expire(&self, now: u64) -> usize;
    /// Number of live bindings (approximate under concurrency).
    fn len(&self) -> usize;
    /// `true` when no bindings are stored.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

const SHARDS: usize = 16;

/// Bounded, sharded in-memory location store.
pub struct MemoryStore {
    shards: Vec<Mutex<HashMap<String, Vec<Binding>>>>,
    count: AtomicUsize,
    capacity: usize,
    max_per_aor: usize,
}

impl MemoryStore {
    /// A store holding at most `capacity` bindings, 16 per AOR.
    pub fn new(capacity: usize) -> Self {
        Self::with_limits(capacity, 16)
    }

    /// A store holding at most `capacity` bindings, `max_per_aor` per AOR
    /// (a backstop: the registrar enforces its own bound first).
    pub fn with_limits(capacity: usize, max_per_aor: usize) -> Self {
        MemoryStore {
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            count: AtomicUsize::new(0),
            capacity,
            max_per_aor,
        }
    }

    fn shard(&self, aor: &str) -> &Mutex<HashMap<String, Vec<Binding>>> {
        let h = crate::hash::Hash64::new(7).str(aor).finish();
        &self.shards[(h as usize) % SHARDS]
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A panic elsewhere must not take the registrar down with it.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl LocationStore for MemoryStore {
    fn put(&self, aor: &str, binding: Binding) -> Result<(), StoreError> {
        let mut map = lock(self.shard(aor));
        if let Some(v) = map.get_mut(aor) {
            if let Some(pos) = v.iter().position(|b| b.contact == binding.contact) {
                v.remove(pos);
                v.insert(0, binding);
                return Ok(());
            }
            if v.len() >= self.max_per_aor {
                return Err(StoreError::TooManyContacts);
            }
        }
        if self.count.load(Ordering::Relaxed) >= self.capacity {
            return Err(StoreError::Full);
        }
        self.count.fetch_add(1, Ordering::Relaxed);
        map.entry(aor.to_owned()).or_default().insert(0, binding);
        Ok(())
    }

    fn lookup(&self, aor: &str, now: u64) -> Result<Vec<Binding>, StoreError> {
        let map = lock(self.shard(aor));
        Ok(map
            .get(aor)
            .map(|v| v.iter().filter(|b| b.expires_at > now).cloned().collect())
            .unwrap_or_default())
    }

    fn remove(&self, aor: &str, contact: Option<&str>) -> Result<(), StoreError> {
        let mut map = lock(self.shard(aor));
        let mut removed = 0;
        if let Some(v) = map.get_mut(aor) {
            let before = v.len();
            match contact {
                Some(c) => v.retain(|b| b.contact != c),
                None => v.clear(),
            }
            removed = before - v.len();
            if v.is_empty() {
                map.remove(aor);
            }
        }
        self.count.fetch_sub(removed, Ordering::Relaxed);
        Ok(())
    }

    fn expire(&self, now: u64) -> usize {
        let mut total = 0;
        for s in &self.shards {
            let mut map = lock(s);
            map.retain(|_, v| {
                let before = v.len();
                v.retain(|b| b.expires_at > now);
                total += before - v.len();
                !v.is_empty()
            });
        }
        self.count.fetch_sub(total, Ordering::Relaxed);
        total
    }

    fn len(&self) -> usize {
        self.count.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn binding(contact: &str, expires_at: u64) -> Binding {
        Binding {
            contact: contact.into(),
            expires_at,
            call_id: "c".into(),
            cseq: 1,
        }
    }

    #[test]
    fn put_lookup_expire_remove_and_bounds() {
        let s = MemoryStore::new(2);
        s.put("alice", binding("sip:alice@192.0.2.1", 100)).unwrap();
        s.put("alice", binding("sip:alice@192.0.2.2", 200)).unwrap();
        assert_eq!(
            s.put("bob", binding("sip:bob@192.0.2.3", 100)),
            Err(StoreError::Full)
        );
        // refresh does not count twice
        s.put("alice", binding("sip:alice@192.0.2.1", 300)).unwrap();
        assert_eq!(s.len(), 2);
        let l = s.lookup("alice", 150).unwrap();
        assert_eq!(l.len(), 2);
        assert_eq!(l[0].contact, "sip:alice@192.0.2.1");
        assert_eq!(s.lookup("alice", 250).unwrap().len(), 1);
        assert_eq!(s.expire(250), 1);
        assert_eq!(s.len(), 1);
        s.remove("alice", None).unwrap();
        assert!(s.is_empty());
        assert!(s.lookup("alice", 0).unwrap().is_empty());
        let s = MemoryStore::with_limits(10, 1);
        s.put("carol", binding("sip:carol@192.0.2.1", 100)).unwrap();
        assert_eq!(
            s.put("carol", binding("sip:carol@192.0.2.2", 100)),
            Err(StoreError::TooManyContacts)
        );
    }
}
