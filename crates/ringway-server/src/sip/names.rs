//! The proxy's DNS ([`ProxyNames`]): the core's
//! [`NameResolver`](ringway_sip::proxy::NameResolver) over the resolver
//! threads of [`crate::dns`].
//!
//! - A name whose every question is cached and fresh is answered on the
//!   worker from the cache (no thread switch; the TTLs decide when a name
//!   is looked up again, so a target set changed in DNS is picked up
//!   without a reload once the old records expire).
//! - Otherwise the request is parked here: a pending entry (its datagram),
//!   bounded by count and by bytes, and a lookup queued for a resolver
//!   thread. The resolver thread puts the answer on a result list; the
//!   timer thread ([`super::SipTimer`]) takes the answers and the entries
//!   that waited longer than `wait` (answered as unavailable: `503`) and
//!   resumes each request in the core. No worker ever waits for DNS.

use crate::dns::rfc3263::Service;
use crate::dns::{DnsError, Resolver};
use ringway_sip::proxy::{
    NameAnswer, NameError, NameQuery, NameResolver, QueueFull, ResolvingRequest,
};
use ringway_sip::Transport;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

/// Bounds of the requests parked on names.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PendingLimits {
    /// Requests parked at most.
    pub count: usize,
    /// Bytes of parked datagrams at most.
    pub bytes: usize,
    /// Longest a request stays parked (then `503`).
    pub wait: Duration,
}

impl Default for PendingLimits {
    fn default() -> PendingLimits {
        PendingLimits {
            count: 1024,
            bytes: 4 << 20,
            wait: Duration::from_secs(3),
        }
    }
}

/// What the parked side counts.
#[derive(Debug, Default)]
pub struct NameCounters {
    /// Requests refused because the pending set was full (count or bytes)
    /// or the resolver's queue was.
    pub refused: AtomicU64,
    /// Parked requests given up after `wait`.
    pub expired: AtomicU64,
}

struct Parked {
    request: ResolvingRequest,
    deadline: u64,
}

#[derive(Default)]
struct Pending {
    parked: HashMap<u64, Parked>,
    bytes: usize,
    next_id: u64,
}

/// The proxy's DNS: cache on the worker, lookups on resolver threads,
/// resumption on the timer thread.
pub struct ProxyNames {
    resolver: Resolver,
    /// Our UDP address (its family decides A or AAAA).
    local: SocketAddr,
    limits: PendingLimits,
    pending: Mutex<Pending>,
    answers: Arc<Mutex<Vec<(u64, NameAnswer)>>>,
    counters: NameCounters,
    /// The clock the core stamps requests with (monotonic ns).
    clock: fn() -> u64,
}

impl ProxyNames {
    /// Names resolved by `resolver` for a proxy on `local`.
    pub fn new(resolver: Resolver, local: SocketAddr, limits: PendingLimits) -> ProxyNames {
        ProxyNames {
            resolver,
            local,
            limits,
            pending: Mutex::new(Pending::default()),
            answers: Arc::new(Mutex::new(Vec::new())),
            counters: NameCounters::default(),
            clock: || ringway_io::monotonic_now().0,
        }
    }

    /// The resolver (its counters).
    pub fn resolver(&self) -> &Resolver {
        &self.resolver
    }

    /// The parked side's counters.
    pub fn counters(&self) -> &NameCounters {
        &self.counters
    }

    /// Requests parked now.
    pub fn parked(&self) -> usize {
        self.lock().parked.len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Pending> {
        self.pending.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The requests to resume at `now`: those whose name was resolved, with
    /// the answer, and those parked longer than `wait`, as unavailable.
    pub fn take_ready(&self, now: u64) -> Vec<(ResolvingRequest, NameAnswer)> {
        let answers =
            std::mem::take(&mut *self.answers.lock().unwrap_or_else(PoisonError::into_inner));
        let mut pending = self.lock();
        if answers.is_empty() && pending.parked.is_empty() {
            return Vec::new();
        }
        let mut ready = Vec::new();
        for (id, answer) in answers {
            if let Some(parked) = pending.parked.remove(&id) {
                pending.bytes -= parked.request.datagram.len();
                ready.push((parked.request, answer));
            }
        }
        let expired: Vec<u64> = pending
            .parked
            .iter()
            .filter(|(_, p)| p.deadline <= now)
            .map(|(id, _)| *id)
            .collect();
        for id in expired {
            if let Some(parked) = pending.parked.remove(&id) {
                pending.bytes -= parked.request.datagram.len();
                self.counters.expired.fetch_add(1, Ordering::Relaxed);
                ready.push((parked.request, Err(NameError::Unavailable)));
            }
        }
        ready
    }
}

/// The RFC 3263 service of a transport (WebSocket next hops are reached
/// as their stream transport).
fn service(transport: Transport) -> Service {
    Service::of(transport)
}

fn answer(result: Result<Vec<SocketAddr>, DnsError>) -> NameAnswer {
    match result {
        Ok(addresses) => Ok(addresses),
        Err(DnsError::NoTargets(_)) => Err(NameError::NoAddress),
        Err(_) => Err(NameError::Unavailable),
    }
}

impl NameResolver for ProxyNames {
    fn cached(&self, query: &NameQuery) -> Option<NameAnswer> {
        self.resolver
            .cached(
                &query.host,
                query.port,
                service(query.transport),
                self.local.is_ipv6(),
            )
            .map(answer)
    }

    fn submit(&self, request: ResolvingRequest) -> Result<(), QueueFull> {
        let size = request.datagram.len();
        let id = {
            let mut pending = self.lock();
            if pending.parked.len() >= self.limits.count || pending.bytes + size > self.limits.bytes
            {
                self.counters.refused.fetch_add(1, Ordering::Relaxed);
                return Err(QueueFull);
            }
            let id = pending.next_id;
            pending.next_id += 1;
            pending.bytes += size;
            let deadline = (self.clock)() + self.limits.wait.as_nanos() as u64;
            let query = request.query.clone();
            pending.parked.insert(id, Parked { request, deadline });
            (id, query)
        };
        let (id, query) = id;
        let answers = self.answers.clone();
        let done = Box::new(move |result: Result<Vec<SocketAddr>, DnsError>| {
            answers
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push((id, answer(result)));
        });
        let queued = self.resolver.submit_for(
            &query.host,
            query.port,
            service(query.transport),
            self.local,
            done,
        );
        if queued.is_err() {
            let mut pending = self.lock();
            if let Some(parked) = pending.parked.remove(&id) {
                pending.bytes -= parked.request.datagram.len();
            }
            self.counters.refused.fetch_add(1, Ordering::Relaxed);
            return Err(QueueFull);
        }
        Ok(())
    }
}
