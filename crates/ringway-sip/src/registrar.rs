//! Location service: the [`LocationStore`] trait, the registrar's
//! state-dependent rules ([`apply_registration`]) and a bounded in-memory
//! store ([`MemoryStore`]). Times are monotonic nanoseconds of the caller.
//!
//! The proxy core checks what a REGISTER may ask (owner of the AOR,
//! Expires bounds, `Contact: *`) and turns it into one [`Registration`];
//! a store applies it atomically together with the rules that depend on
//! the bindings already stored (Call-ID/CSeq ordering, contacts per AOR,
//! RFC 3261 10.3 steps 7 and 8), so two proxies sharing one store cannot
//! interleave a check and a write. A store may fail
//! ([`StoreError::Unavailable`]): the core then answers `500` with
//! `Retry-After` to a REGISTER and `480` to a call, and never loses a
//! binding silently.
//!
//! A store that has to wait (a network database) is not called by the
//! workers at all: the core hands a [`StoreQuery`] to the driver (see
//! [`crate::proxy::StoreQueue`]), which runs it elsewhere and resumes the
//! request with the answer.

use crate::transport::Hop;
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

/// Nanoseconds per second.
const NS_PER_SECOND: u64 = 1_000_000_000;

/// One contact bound to an address-of-record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Binding {
    /// Contact URI (without `<>` and header parameters).
    pub contact: String,
    /// Expiry time, monotonic ns (the caller's clock).
    pub expires_at: u64,
    /// Call-ID of the REGISTER that last set it (RFC 3261 10.3 step 7).
    pub call_id: String,
    /// CSeq number of that REGISTER.
    pub cseq: u32,
    /// The REGISTER's Path values, topmost first (RFC 3327): the route
    /// set that requests to this contact are sent through.
    pub path: Vec<String>,
    /// The flow the REGISTER came in on: its source address, transport
    /// and (TCP, TLS) connection. Requests to this contact go over it
    /// rather than to the Contact's address (a phone behind NAT is
    /// reachable only so): over the same connection, or for UDP to the
    /// observed source address and port. `None` with NAT handling off
    /// (UDP then goes to the Contact). A shared store keeps the address
    /// and transport; the connection only for the proxy that holds it.
    pub flow: Option<Hop>,
    /// RFC 5626 instance and reg-id of the contact, when the REGISTER
    /// asked for outbound.
    pub outbound: Option<Outbound>,
}

/// RFC 5626 flow identity of a contact: its `+sip.instance` and `reg-id`
/// parameters. A REGISTER binding a contact with the same instance and
/// reg-id as a stored binding replaces that binding (RFC 5626 6, the
/// registrar's step 4): one binding per flow.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outbound {
    /// `+sip.instance` (the quoted URN, quotes removed).
    pub instance: String,
    /// `reg-id`.
    pub reg_id: u32,
}

/// One change a REGISTER asks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BindingChange {
    /// Bind (or refresh) this contact for this many seconds.
    Bind {
        /// Contact URI.
        contact: String,
        /// Lifetime (s), already within the registrar's bounds.
        expires: u32,
        /// RFC 5626 instance and reg-id (the REGISTER supports outbound).
        outbound: Option<Outbound>,
    },
    /// Remove this contact.
    Unbind {
        /// Contact URI.
        contact: String,
    },
    /// Remove every contact of the AOR (`Contact: *`).
    UnbindAll,
}

/// Everything one REGISTER asks of the store, applied atomically.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Registration {
    /// The address-of-record.
    pub aor: String,
    /// Call-ID of the REGISTER.
    pub call_id: String,
    /// CSeq number of the REGISTER.
    pub cseq: u32,
    /// Its Path values, topmost first (stored with every binding it sets).
    pub path: Vec<String>,
    /// The connection it came in on, stored with every binding it sets
    /// ([`Binding::flow`]).
    pub flow: Option<Hop>,
    /// The changes, in the order of the Contact headers (empty: a query).
    pub changes: Vec<BindingChange>,
    /// Most bindings the AOR may have afterwards.
    pub max_contacts: usize,
}

/// Why a store operation failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StoreError {
    /// The store is at capacity.
    Full,
    /// The AOR would have more than `max_contacts` bindings.
    TooManyContacts,
    /// A change is out of order: a binding of the same Call-ID has a
    /// higher CSeq (RFC 3261 10.3 step 7). Nothing was changed.
    OutOfOrder,
    /// The store cannot be reached, did not answer in time, or answered
    /// something we cannot read (a shared store down).
    Unavailable,
}

impl std::fmt::Display for StoreError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            StoreError::Full => "location store full",
            StoreError::TooManyContacts => "too many contacts for AOR",
            StoreError::OutOfOrder => "REGISTER out of order (CSeq)",
            StoreError::Unavailable => "location store unavailable",
        })
    }
}

impl std::error::Error for StoreError {}

/// What a store answers: the AOR's live bindings, most recently refreshed
/// first, or why not.
pub type StoreAnswer = Result<Vec<Binding>, StoreError>;

/// A location service shared by all proxy worker threads.
pub trait LocationStore: Send + Sync {
    /// Apply `registration` atomically under [`apply_registration`]'s
    /// rules at `now`; returns the AOR's bindings afterwards.
    fn register(&self, registration: &Registration, now: u64) -> StoreAnswer;
    /// Unexpired bindings of `aor` at `now`, most recently refreshed first.
    fn lookup(&self, aor: &str, now: u64) -> StoreAnswer;
    /// Drop expired bindings; returns how many were removed (a store that
    /// expires bindings by itself returns 0).
    fn expire(&self, now: u64) -> usize;
    /// Number of live bindings (approximate under concurrency); `None`
    /// when the store cannot tell without a round trip (a shared store).
    fn len(&self) -> Option<usize>;
    /// Bytes the bindings take in this process (`None`: not held here).
    fn bytes(&self) -> Option<usize> {
        None
    }
    /// Up to `max` AORs with bindings, in no particular order (an
    /// operator's listing); `None` when the store cannot list them here
    /// (a shared store).
    fn aors(&self, max: usize) -> Option<Vec<String>> {
        let _ = max;
        None
    }
    /// Remove the bindings of `aor` registered over `flow` (its flow died:
    /// keepalives unanswered, or its connection closed); returns how many.
    /// A store that cannot do it here (a shared store) removes none.
    fn remove_flow(&self, aor: &str, flow: &Hop, now: u64) -> usize {
        let _ = (aor, flow, now);
        0
    }
    /// Remove the bindings of `aor` registered through the Path `path`
    /// (an edge proxy on that Path answered `430 Flow Failed`: the flow
    /// its token names is gone, RFC 5626 7); returns how many. Expired
    /// ones may go too. A store that cannot do it removes none.
    fn remove_path(&self, aor: &str, path: &[String], now: u64) -> usize {
        let _ = (aor, path, now);
        0
    }
    /// `true` when the store knows it holds no bindings.
    fn is_empty(&self) -> bool {
        self.len() == Some(0)
    }
}

/// A question for the location store, as the core hands it to a driver
/// when the store is remote (owned: it outlives the datagram buffer).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StoreQuery {
    /// Apply a REGISTER.
    Register(Registration),
    /// The bindings of an AOR (routing a request to it).
    Lookup {
        /// The address-of-record.
        aor: String,
    },
    /// Remove the bindings of an AOR registered through a Path whose flow
    /// failed ([`LocationStore::remove_path`]). Nothing waits for it: a
    /// driver runs it and resumes no request.
    RemovePath {
        /// The address-of-record.
        aor: String,
        /// The Path the bindings were registered with.
        path: Vec<String>,
    },
}

impl StoreQuery {
    /// The AOR the query is about.
    pub fn aor(&self) -> &str {
        match self {
            StoreQuery::Register(registration) => &registration.aor,
            StoreQuery::Lookup { aor } | StoreQuery::RemovePath { aor, .. } => aor,
        }
    }

    /// Whether nothing waits for the answer (a removal).
    pub fn is_removal(&self) -> bool {
        matches!(self, StoreQuery::RemovePath { .. })
    }

    /// Run the query against `store` at `now`.
    pub fn run(&self, store: &dyn LocationStore, now: u64) -> StoreAnswer {
        match self {
            StoreQuery::Register(registration) => store.register(registration, now),
            StoreQuery::Lookup { aor } => store.lookup(aor, now),
            StoreQuery::RemovePath { aor, path } => {
                store.remove_path(aor, path, now);
                Ok(Vec::new())
            }
        }
    }
}

/// The registrar's rules that depend on what is stored, applied to one
/// AOR's `bindings` (most recently refreshed first) at `now`: expired
/// bindings go; if a change touches a binding set by the same Call-ID with
/// a higher CSeq the whole registration is refused ([`StoreError::OutOfOrder`];
/// the same CSeq again is a retransmission and applies again); if the AOR
/// would end with more than `max_contacts` bindings it is refused
/// ([`StoreError::TooManyContacts`]). On an error nothing is changed.
/// Every store applies these rules (the Redis store runs the same rules in
/// its Lua script; tests run the same cases against both).
pub fn apply_registration(
    bindings: &mut Vec<Binding>,
    registration: &Registration,
    now: u64,
) -> Result<(), StoreError> {
    bindings.retain(|binding| binding.expires_at > now);
    let out_of_order = |contact: Option<&str>| {
        bindings.iter().any(|binding| {
            contact.is_none_or(|c| c == binding.contact)
                && binding.call_id == registration.call_id
                && binding.cseq > registration.cseq
        })
    };
    // First pass: check every change and count what the AOR would hold,
    // without touching `bindings`, so that a refusal changes nothing.
    let mut after = bindings.len();
    let mut known: Vec<&str> = bindings.iter().map(|b| b.contact.as_str()).collect();
    for change in &registration.changes {
        match change {
            BindingChange::Bind {
                contact, outbound, ..
            } => {
                if out_of_order(Some(contact)) {
                    return Err(StoreError::OutOfOrder);
                }
                // The same flow (instance and reg-id) with a new contact
                // replaces the old binding.
                if let Some(outbound) = outbound {
                    for old in bindings
                        .iter()
                        .filter(|b| b.outbound.as_ref() == Some(outbound) && b.contact != *contact)
                    {
                        if let Some(i) = known.iter().position(|c| *c == old.contact) {
                            known.remove(i);
                            after -= 1;
                        }
                    }
                }
                if !known.contains(&contact.as_str()) {
                    known.push(contact);
                    after += 1;
                }
            }
            BindingChange::Unbind { contact } => {
                if out_of_order(Some(contact)) {
                    return Err(StoreError::OutOfOrder);
                }
                if let Some(i) = known.iter().position(|c| *c == contact) {
                    known.remove(i);
                    after -= 1;
                }
            }
            BindingChange::UnbindAll => {
                if out_of_order(None) {
                    return Err(StoreError::OutOfOrder);
                }
                known.clear();
                after = 0;
            }
        }
    }
    if after > registration.max_contacts {
        return Err(StoreError::TooManyContacts);
    }
    for change in &registration.changes {
        match change {
            BindingChange::UnbindAll => bindings.clear(),
            BindingChange::Unbind { contact } => bindings.retain(|b| b.contact != *contact),
            BindingChange::Bind {
                contact,
                expires,
                outbound,
            } => {
                bindings.retain(|b| {
                    b.contact != *contact && (outbound.is_none() || b.outbound != *outbound)
                });
                // At the front: lookups answer the most recently
                // refreshed contact first.
                bindings.insert(
                    0,
                    Binding {
                        contact: contact.clone(),
                        expires_at: now.saturating_add(u64::from(*expires) * NS_PER_SECOND),
                        call_id: registration.call_id.clone(),
                        cseq: registration.cseq,
                        path: registration.path.clone(),
                        flow: registration.flow,
                        outbound: outbound.clone(),
                    },
                );
            }
        }
    }
    Ok(())
}

const SHARDS: usize = 16;

/// Bytes of one stored AOR besides its strings (map entry, vector).
const AOR_ENTRY_BYTES: usize =
    std::mem::size_of::<String>() + std::mem::size_of::<Vec<Binding>>() + 16;

/// Bytes one AOR's entry holds: its key, and each binding with its strings
/// (contact, Call-ID and every Path value).
fn entry_bytes(aor: &str, bindings: &[Binding]) -> usize {
    if bindings.is_empty() {
        return 0;
    }
    let strings = |b: &Binding| {
        b.contact.len()
            + b.call_id.len()
            + b.outbound.as_ref().map_or(0, |o| o.instance.len())
            + b.path
                .iter()
                .map(|p| p.len() + std::mem::size_of::<String>())
                .sum::<usize>()
    };
    AOR_ENTRY_BYTES
        + aor.len()
        + bindings
            .iter()
            .map(|b| std::mem::size_of::<Binding>() + strings(b))
            .sum::<usize>()
}

/// Bounded, sharded in-memory location store (one process): at most
/// `capacity` bindings and `max_bytes` bytes of them (review S9: a
/// REGISTER with many contacts and a long Path costs what it stores).
pub struct MemoryStore {
    shards: Vec<Mutex<HashMap<String, Vec<Binding>>>>,
    count: AtomicUsize,
    bytes: AtomicUsize,
    capacity: usize,
    max_bytes: usize,
}

impl MemoryStore {
    /// A store holding at most `capacity` bindings (of any size).
    pub fn new(capacity: usize) -> Self {
        Self::with_limits(capacity, usize::MAX)
    }

    /// A store holding at most `capacity` bindings and `max_bytes` bytes
    /// of them ([`LocationStore::bytes`]); beyond either a REGISTER that
    /// adds gets [`StoreError::Full`].
    pub fn with_limits(capacity: usize, max_bytes: usize) -> Self {
        MemoryStore {
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            count: AtomicUsize::new(0),
            bytes: AtomicUsize::new(0),
            capacity,
            max_bytes,
        }
    }

    fn shard(&self, aor: &str) -> &Mutex<HashMap<String, Vec<Binding>>> {
        // Lock striping only: the maps inside hash with their own random
        // keys, so a fixed seed here lets no one pile AORs into a bucket.
        let h = crate::hash::Hash64::new(7).str(aor).finish();
        &self.shards[(h as usize) % SHARDS]
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A panic elsewhere must not take the registrar down with it.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl LocationStore for MemoryStore {
    fn register(&self, registration: &Registration, now: u64) -> StoreAnswer {
        let mut map = lock(self.shard(&registration.aor));
        // A copy: a registration refused below (rules, capacity, bytes)
        // leaves the stored bindings as they were.
        let mut bindings = map.get(&registration.aor).cloned().unwrap_or_default();
        let before = bindings.len();
        let bytes_before = entry_bytes(&registration.aor, &bindings);
        apply_registration(&mut bindings, registration, now)?;
        let after = bindings.len();
        // Checked under this shard's lock only: registrations on other
        // shards may pass at the same time, so the bound can be overshot
        // by what those concurrent REGISTERs add (a few, bounded by workers).
        if after > before && self.count.load(Ordering::Relaxed) + (after - before) > self.capacity {
            return Err(StoreError::Full);
        }
        let bytes_after = entry_bytes(&registration.aor, &bindings);
        if bytes_after > bytes_before
            && self.bytes.load(Ordering::Relaxed) + (bytes_after - bytes_before) > self.max_bytes
        {
            return Err(StoreError::Full);
        }
        // Add before subtracting: the unsigned total never dips below zero
        // (and wraps) when another shard reads it in between.
        self.bytes.fetch_add(bytes_after, Ordering::Relaxed);
        self.bytes.fetch_sub(bytes_before, Ordering::Relaxed);
        // `before` counted expired bindings too: they are gone now.
        if after >= before {
            self.count.fetch_add(after - before, Ordering::Relaxed);
        } else {
            self.count.fetch_sub(before - after, Ordering::Relaxed);
        }
        if bindings.is_empty() {
            map.remove(&registration.aor);
        } else {
            map.insert(registration.aor.clone(), bindings.clone());
        }
        Ok(bindings)
    }

    fn lookup(&self, aor: &str, now: u64) -> StoreAnswer {
        let map = lock(self.shard(aor));
        Ok(map
            .get(aor)
            .map(|v| v.iter().filter(|b| b.expires_at > now).cloned().collect())
            .unwrap_or_default())
    }

    fn expire(&self, now: u64) -> usize {
        let mut total = 0;
        for s in &self.shards {
            let mut map = lock(s);
            map.retain(|aor, v| {
                let before = v.len();
                let bytes_before = entry_bytes(aor, v);
                v.retain(|b| b.expires_at > now);
                total += before - v.len();
                self.bytes.fetch_add(entry_bytes(aor, v), Ordering::Relaxed);
                self.bytes.fetch_sub(bytes_before, Ordering::Relaxed);
                !v.is_empty()
            });
        }
        self.count.fetch_sub(total, Ordering::Relaxed);
        total
    }

    fn remove_flow(&self, aor: &str, flow: &Hop, now: u64) -> usize {
        self.remove_where(aor, now, |b| b.flow.as_ref() == Some(flow))
    }

    fn remove_path(&self, aor: &str, path: &[String], now: u64) -> usize {
        self.remove_where(aor, now, |b| b.path == path)
    }

    fn len(&self) -> Option<usize> {
        Some(self.count.load(Ordering::Relaxed))
    }

    fn bytes(&self) -> Option<usize> {
        Some(self.bytes.load(Ordering::Relaxed))
    }

    fn aors(&self, max: usize) -> Option<Vec<String>> {
        let mut aors = Vec::new();
        for shard in &self.shards {
            let map = lock(shard);
            aors.extend(map.keys().take(max - aors.len()).cloned());
            if aors.len() >= max {
                break;
            }
        }
        Some(aors)
    }
}

impl MemoryStore {
    /// Remove the bindings of `aor` that `doomed` picks, and the expired
    /// ones (as a REGISTER would take them); returns how many went.
    fn remove_where(&self, aor: &str, now: u64, doomed: impl Fn(&Binding) -> bool) -> usize {
        let mut map = lock(self.shard(aor));
        let Some(bindings) = map.get_mut(aor) else {
            return 0;
        };
        let before = bindings.len();
        let bytes_before = entry_bytes(aor, bindings);
        bindings.retain(|b| !doomed(b) && b.expires_at > now);
        let removed = before - bindings.len();
        self.bytes
            .fetch_add(entry_bytes(aor, bindings), Ordering::Relaxed);
        self.bytes.fetch_sub(bytes_before, Ordering::Relaxed);
        self.count.fetch_sub(removed, Ordering::Relaxed);
        if bindings.is_empty() {
            map.remove(aor);
        }
        removed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = NS_PER_SECOND;

    fn bind(aor: &str, contact: &str, expires: u32, call_id: &str, cseq: u32) -> Registration {
        Registration {
            aor: aor.into(),
            call_id: call_id.into(),
            cseq,
            path: Vec::new(),
            flow: None,
            changes: vec![BindingChange::Bind {
                contact: contact.into(),
                expires,
                outbound: None,
            }],
            max_contacts: 16,
        }
    }

    #[test]
    fn register_lookup_expire_and_capacity() {
        let s = MemoryStore::new(2);
        s.register(&bind("alice", "sip:alice@192.0.2.1", 100, "a", 1), 0)
            .unwrap();
        s.register(&bind("alice", "sip:alice@192.0.2.2", 200, "b", 1), 0)
            .unwrap();
        assert_eq!(
            s.register(&bind("bob", "sip:bob@192.0.2.3", 100, "c", 1), 0),
            Err(StoreError::Full)
        );
        // A refresh does not count twice and moves to the front.
        let after = s
            .register(&bind("alice", "sip:alice@192.0.2.1", 300, "a", 2), 0)
            .unwrap();
        assert_eq!(after[0].contact, "sip:alice@192.0.2.1");
        assert_eq!(s.len(), Some(2));
        assert_eq!(s.lookup("alice", 150 * S).unwrap().len(), 2);
        assert_eq!(s.lookup("alice", 250 * S).unwrap().len(), 1);
        assert_eq!(s.expire(250 * S), 1);
        assert_eq!(s.len(), Some(1));
        let mut all = bind("alice", "", 0, "z", 1);
        all.changes = vec![BindingChange::UnbindAll];
        assert_eq!(s.register(&all, 250 * S), Ok(Vec::new()));
        assert!(s.is_empty());
    }

    #[test]
    fn ordering_and_contact_bound_change_nothing_when_refused() {
        let s = MemoryStore::new(100);
        s.register(&bind("carol", "sip:carol@192.0.2.1", 60, "x", 5), 0)
            .unwrap();
        // Same Call-ID, lower CSeq: refused, binding unchanged.
        assert_eq!(
            s.register(&bind("carol", "sip:carol@192.0.2.1", 600, "x", 4), 0),
            Err(StoreError::OutOfOrder)
        );
        let l = s.lookup("carol", 0).unwrap();
        assert_eq!((l[0].cseq, l[0].expires_at), (5, 60 * S));
        // The same CSeq again (a retransmission) applies; another Call-ID too.
        s.register(&bind("carol", "sip:carol@192.0.2.1", 60, "x", 5), 0)
            .unwrap();
        s.register(&bind("carol", "sip:carol@192.0.2.1", 90, "y", 1), 0)
            .unwrap();
        // Unbinding with an old CSeq of the new Call-ID's predecessor is fine
        // (different Call-ID), an out-of-order `*` is not.
        let mut all = bind("carol", "", 0, "y", 0);
        all.changes = vec![BindingChange::UnbindAll];
        assert_eq!(s.register(&all, 0), Err(StoreError::OutOfOrder));
        // Bound on contacts: the second contact is one too many.
        let mut two = bind("carol", "sip:carol@192.0.2.2", 60, "y", 2);
        two.max_contacts = 1;
        assert_eq!(s.register(&two, 0), Err(StoreError::TooManyContacts));
        assert_eq!(s.lookup("carol", 0).unwrap().len(), 1);
        // Replacing the contact in one request stays within the bound.
        two.changes.insert(
            0,
            BindingChange::Unbind {
                contact: "sip:carol@192.0.2.1".into(),
            },
        );
        let after = s.register(&two, 0).unwrap();
        assert_eq!(after.len(), 1);
        assert_eq!(after[0].contact, "sip:carol@192.0.2.2");
        assert_eq!(s.len(), Some(1));
    }

    #[test]
    fn bytes_are_bounded_and_given_back() {
        // Review S9: 16 contacts × a long Path are refused once the bytes
        // run out, even far below the count bound.
        let s = MemoryStore::with_limits(100_000, 64 * 1024);
        let path = vec![format!("<sip:{};lr>", "p".repeat(900))];
        let mut stored = 0;
        for n in 0..1000 {
            let mut r = bind(&format!("u{n}"), &format!("sip:u{n}@192.0.2.1"), 60, "c", 1);
            r.path = path.clone();
            match s.register(&r, 0) {
                Ok(_) => stored += 1,
                Err(e) => {
                    assert_eq!(e, StoreError::Full);
                    break;
                }
            }
        }
        let used = s.bytes().unwrap();
        assert!((30..70).contains(&stored), "{stored} stored");
        assert!(used <= 64 * 1024 && used > 60 * 900, "{used}");
        // After expiry every byte comes back.
        assert_eq!(s.expire(61 * S), stored);
        assert_eq!(s.bytes(), Some(0));
        assert_eq!(s.len(), Some(0));
        // Unregistering gives the bytes back too.
        let r = bind("x", "sip:x@192.0.2.1", 60, "c", 1);
        s.register(&r, 0).unwrap();
        assert!(s.bytes().unwrap() > 0);
        let mut un = bind("x", "sip:x@192.0.2.1", 0, "c", 2);
        un.changes = vec![BindingChange::Unbind {
            contact: "sip:x@192.0.2.1".into(),
        }];
        s.register(&un, 0).unwrap();
        assert_eq!(s.bytes(), Some(0));
    }

    #[test]
    fn remove_flow_takes_only_that_flows_bindings_and_gives_bytes_back() {
        let s = MemoryStore::new(10);
        let dead = Hop::udp("192.0.2.7:40000".parse().unwrap());
        let alive = Hop::udp("192.0.2.8:40000".parse().unwrap());
        let mut r = bind("erin", "sip:erin@10.0.0.7", 60, "e", 1);
        r.flow = Some(dead);
        s.register(&r, 0).unwrap();
        let mut r = bind("erin", "sip:erin@10.0.0.8", 60, "f", 1);
        r.flow = Some(alive);
        s.register(&r, 0).unwrap();
        assert_eq!(s.remove_flow("erin", &dead, 0), 1);
        assert_eq!(s.remove_flow("erin", &dead, 0), 0);
        let left = s.lookup("erin", 0).unwrap();
        assert_eq!(left.len(), 1);
        assert_eq!(left[0].flow, Some(alive));
        assert_eq!(s.len(), Some(1));
        assert_eq!(s.remove_flow("erin", &alive, 0), 1);
        assert_eq!((s.len(), s.bytes()), (Some(0), Some(0)));
        assert_eq!(s.remove_flow("nobody", &alive, 0), 0);
    }

    #[test]
    fn remove_path_takes_only_the_bindings_of_that_path() {
        let s = MemoryStore::new(10);
        let dead = vec!["<sip:dead@192.0.2.30;lr;ob>".to_string()];
        let alive = vec!["<sip:alive@192.0.2.30;lr;ob>".to_string()];
        for (n, path) in [(1, &dead), (2, &dead), (3, &alive)] {
            let mut r = bind("gus", &format!("sip:gus@10.0.0.{n}"), 60, "g", n);
            r.path = path.clone();
            s.register(&r, 0).unwrap();
        }
        assert_eq!(s.remove_path("gus", &dead, 0), 2);
        assert_eq!(s.remove_path("gus", &dead, 0), 0);
        let left = s.lookup("gus", 0).unwrap();
        assert_eq!(left.len(), 1);
        assert_eq!(left[0].path, alive);
        assert_eq!(s.len(), Some(1));
        // A shorter or longer Path is another Path.
        assert_eq!(s.remove_path("gus", &[], 0), 0);
        let mut longer = alive.clone();
        longer.push("<sip:192.0.2.31;lr>".into());
        assert_eq!(s.remove_path("gus", &longer, 0), 0);
        assert_eq!(s.remove_path("gus", &alive, 0), 1);
        assert_eq!((s.len(), s.bytes()), (Some(0), Some(0)));
    }

    #[test]
    fn path_is_stored_with_the_binding() {
        let s = MemoryStore::new(10);
        let mut r = bind("dave", "sip:dave@192.0.2.9", 60, "p", 1);
        r.path = vec!["<sip:192.0.2.50;lr>".into()];
        s.register(&r, 0).unwrap();
        assert_eq!(s.lookup("dave", 0).unwrap()[0].path, r.path);
    }
}
