//! Location service: the [`LocationStore`] trait and a bounded in-memory
//! implementation ([`MemoryStore`]). Times are monotonic nanoseconds.

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
}

/// Why a binding could not be stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StoreError {
    /// The store is at capacity.
    Full,
    /// Too many contacts for this AOR.
    TooManyContacts,
}

impl std::fmt::Display for StoreError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            StoreError::Full => "location store full",
            StoreError::TooManyContacts => "too many contacts for AOR",
        })
    }
}

impl std::error::Error for StoreError {}

/// A location service shared by all proxy worker threads.
pub trait LocationStore: Send + Sync {
    /// Add or refresh `contact` for `aor` until `expires_at` (ns).
    fn put(&self, aor: &str, contact: &str, expires_at: u64) -> Result<(), StoreError>;
    /// Unexpired bindings of `aor` at `now`, most recently refreshed first.
    fn lookup(&self, aor: &str, now: u64) -> Vec<Binding>;
    /// Remove one contact (`Some`) or all contacts (`None`) of `aor`.
    fn remove(&self, aor: &str, contact: Option<&str>);
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
        MemoryStore {
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            count: AtomicUsize::new(0),
            capacity,
            max_per_aor: 16,
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
    fn put(&self, aor: &str, contact: &str, expires_at: u64) -> Result<(), StoreError> {
        let mut map = lock(self.shard(aor));
        if let Some(v) = map.get_mut(aor) {
            if let Some(pos) = v.iter().position(|b| b.contact == contact) {
                let mut b = v.remove(pos);
                b.expires_at = expires_at;
                v.insert(0, b);
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
        map.entry(aor.to_owned()).or_default().insert(
            0,
            Binding {
                contact: contact.to_owned(),
                expires_at,
            },
        );
        Ok(())
    }

    fn lookup(&self, aor: &str, now: u64) -> Vec<Binding> {
        let map = lock(self.shard(aor));
        map.get(aor)
            .map(|v| v.iter().filter(|b| b.expires_at > now).cloned().collect())
            .unwrap_or_default()
    }

    fn remove(&self, aor: &str, contact: Option<&str>) {
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

    #[test]
    fn put_lookup_expire_remove_and_bounds() {
        let s = MemoryStore::new(2);
        s.put("alice", "sip:alice@192.0.2.1", 100).unwrap();
        s.put("alice", "sip:alice@192.0.2.2", 200).unwrap();
        assert_eq!(
            s.put("bob", "sip:bob@192.0.2.3", 100),
            Err(StoreError::Full)
        );
        // refresh does not count twice
        s.put("alice", "sip:alice@192.0.2.1", 300).unwrap();
        assert_eq!(s.len(), 2);
        let l = s.lookup("alice", 150);
        assert_eq!(l.len(), 2);
        assert_eq!(l[0].contact, "sip:alice@192.0.2.1");
        assert_eq!(s.lookup("alice", 250).len(), 1);
        assert_eq!(s.expire(250), 1);
        assert_eq!(s.len(), 1);
        s.remove("alice", None);
        assert!(s.is_empty());
        assert!(s.lookup("alice", 0).is_empty());
    }
}
