//! The location store a SIP server uses: in process memory, or shared in
//! Redis by several proxies ([`RedisStore`]).
//!
//! A shared store is never called on a worker's datagram loop. The core
//! hands each request that needs it to a [`LocationQueue`] (bounded
//! channels, one per store thread, chosen by the AOR so one AOR's
//! operations keep their order; a full channel refuses at once and the
//! core fails closed: `500` + `Retry-After` or `480`). Each store thread
//! ([`StoreThread`]) owns one Redis connection, runs one query at a time
//! with a timeout, resumes the request in the core with the answer
//! ([`ringway_sip::ProxyWorker::resume`]) and sends what that produced.
//! A request that waited in the channel longer than the timeout is
//! answered as unavailable without asking (its UA has retransmitted or
//! given up by then). In flight at most: one query per store thread, and
//! `queue` requests waiting.

#[cfg(not(feature = "redis"))]
#[path = "no_redis.rs"]
mod redis;
#[cfg(feature = "redis")]
mod redis;

#[cfg(feature = "redis")]
pub(crate) use self::redis::parse_resp_reply;
pub use self::redis::RedisStore;
#[cfg(feature = "redis")]
pub use self::redis::{bindings_key, expiry_key};

use crate::metrics::{latency_histogram, LatencySummary};
use crate::sip::{WorkerMetrics, TX_FRAME};
use hdrhistogram::Histogram;
use ringway_io::{BatchIo, Nanos, TxBatch};
use ringway_sip::proxy::{DeferredRequest, QueueFull, StoreQueue};
use ringway_sip::registrar::{LocationStore, StoreError, StoreQuery};
use ringway_sip::{Proxy, ProxyWorker};
use serde::Serialize;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

/// Which location store a SIP server uses, parsed once from its text form
/// (`memory`, or `redis://HOST[:PORT][/DB]` checked by [`parse_redis_url`]).
///
/// A Redis URL may hold a password: `Display`, `Debug` and `Serialize`
/// print it redacted ([`redact_location`]); only the store itself reads
/// [`Location::Redis`]'s URL.
#[derive(Clone, Default, PartialEq, Eq)]
pub enum Location {
    /// This process's memory ([`ringway_sip::MemoryStore`]).
    #[default]
    Memory,
    /// Shared by several proxies in Redis or Valkey at this (checked) URL.
    Redis(String),
}

impl std::str::FromStr for Location {
    type Err = String;

    /// `memory` or a Redis URL; the error never repeats a password.
    fn from_str(text: &str) -> Result<Location, String> {
        if text == "memory" {
            return Ok(Location::Memory);
        }
        parse_redis_url(text).map(Location::Redis)
    }
}

impl std::fmt::Display for Location {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Location::Memory => f.write_str("memory"),
            Location::Redis(url) => f.write_str(&redact_location(url)),
        }
    }
}

impl std::fmt::Debug for Location {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Location({self})")
    }
}

impl Serialize for Location {
    /// Redacted: a dumped configuration never holds the password.
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for Location {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Location, D::Error> {
        let text = String::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

/// `text` with any `USER:PASSWORD@` of a Redis URL replaced by `***@`, for
/// printing (logs, errors, the JSON summary).
pub fn redact_location(text: &str) -> String {
    let Some((scheme, rest)) = text.split_once("://") else {
        return text.to_string();
    };
    let authority_end = rest.find('/').unwrap_or(rest.len());
    match rest[..authority_end].rfind('@') {
        Some(at) => format!("{scheme}://***@{}", &rest[at + 1..]),
        None => text.to_string(),
    }
}

/// `text` (an error message about the store at `url`) with `url`'s
/// password and `USER:PASSWORD` replaced by `***` wherever they occur, and
/// `url` itself redacted: no error path prints the secret (review S22).
pub fn redact_error(url: &str, text: &str) -> String {
    let mut out = text.replace(url, &redact_location(url));
    if let Some(userinfo) = userinfo(url) {
        if !userinfo.is_empty() {
            out = out.replace(userinfo, "***");
        }
        let password = userinfo.split_once(':').map_or(userinfo, |(_, p)| p);
        if password.len() >= 3 {
            out = out.replace(password, "***");
        }
    }
    out
}

/// The `USER:PASSWORD` (or `:PASSWORD`) part of a URL, if any.
fn userinfo(url: &str) -> Option<&str> {
    let rest = url.split_once("://")?.1;
    let authority = &rest[..rest.find('/').unwrap_or(rest.len())];
    Some(&authority[..authority.rfind('@')?])
}

/// Check a Redis URL: `redis://[[USER]:PASSWORD@]HOST[:PORT][/DB]` (HOST
/// an IP address or a name, PORT 1..=65535, DB a number). Returns it as
/// given. Anything else is refused with the reason (TLS, `rediss://`, and
/// Unix sockets are not built in).
pub fn parse_redis_url(url: &str) -> Result<String, String> {
    let fail = |why: &str| {
        Err(format!(
            "location {:?}: {why} (expected redis://HOST:PORT/DB)",
            redact_location(url)
        ))
    };
    #[cfg(not(feature = "redis"))]
    if url.starts_with("redis://") {
        return fail(self::redis::NOT_BUILT);
    }
    let Some(rest) = url.strip_prefix("redis://") else {
        if url.starts_with("rediss://") {
            return fail("TLS (rediss://) is not built in");
        }
        return fail("not memory nor a redis:// URL");
    };
    if rest.contains(['?', '#', ' ']) {
        return fail("query, fragment or space in the URL");
    }
    let (authority, db) = match rest.split_once('/') {
        Some((authority, db)) => (authority, Some(db)),
        None => (rest, None),
    };
    if let Some(db) = db.filter(|db| !db.is_empty()) {
        if db.parse::<u32>().is_err() {
            return fail("the database is not a number");
        }
    }
    let host_port = authority.rsplit_once('@').map_or(authority, |(_, hp)| hp);
    let (host, port) = if let Some(v6) = host_port.strip_prefix('[') {
        let Some((host, after)) = v6.split_once(']') else {
            return fail("unclosed [IPv6 address]");
        };
        if host.parse::<std::net::Ipv6Addr>().is_err() {
            return fail("bad IPv6 address");
        }
        (host, after.strip_prefix(':'))
    } else {
        match host_port.split_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (host_port, None),
        }
    };
    let host_ok = !host.is_empty()
        && host
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | ':' | '_'));
    if !host_ok {
        return fail("no host or a bad host");
    }
    if let Some(port) = port {
        if !port.parse::<u16>().is_ok_and(|p| p > 0) {
            return fail("the port is not 1..=65535");
        }
    }
    #[cfg(feature = "redis")]
    ::redis::Client::open(url)
        .map_err(|e| redact_error(url, &format!("location {:?}: {e}", redact_location(url))))?;
    Ok(url.to_string())
}

/// What the location driver counts (shared by its threads and stores).
#[derive(Default)]
pub struct LocationCounters {
    /// REGISTER scripts sent.
    pub registers: AtomicU64,
    /// Removals of a failed flow's bindings run (RFC 5626 7: a `430`
    /// from an edge proxy).
    pub removals: AtomicU64,
    /// Lookup scripts sent.
    pub lookups: AtomicU64,
    /// Connect attempts that failed.
    pub connect_failures: AtomicU64,
    /// Connections made after the first (after a failure).
    pub reconnects: AtomicU64,
    /// Queries failed at once because a reconnect was not due yet.
    pub skipped_backoff: AtomicU64,
    /// Commands whose reply did not come within the timeout.
    pub timeouts: AtomicU64,
    /// Commands failed by a broken connection.
    pub io_errors: AtomicU64,
    /// Error replies from the server (e.g. LOADING, OOM, script errors).
    pub server_errors: AtomicU64,
    /// Replies of the wrong shape (treated as an unavailable store).
    pub bad_replies: AtomicU64,
    /// Requests that waited in the queue beyond the timeout (answered as
    /// unavailable without asking).
    pub expired_in_queue: AtomicU64,
    /// Whether the last connection attempt or command succeeded.
    pub up: AtomicBool,
    last_error: Mutex<String>,
}

impl LocationCounters {
    /// Count one event.
    pub fn add(&self, counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// The last failure, for logs.
    pub fn last_error(&self) -> String {
        self.last_error
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    #[cfg_attr(not(feature = "redis"), allow(dead_code))] // only the Redis store fails
    fn set_last_error(&self, error: String) {
        *self
            .last_error
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = error;
    }

    /// The counters now.
    pub fn snapshot(&self) -> LocationCounts {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        LocationCounts {
            registers: get(&self.registers),
            removals: get(&self.removals),
            lookups: get(&self.lookups),
            connect_failures: get(&self.connect_failures),
            reconnects: get(&self.reconnects),
            skipped_backoff: get(&self.skipped_backoff),
            timeouts: get(&self.timeouts),
            io_errors: get(&self.io_errors),
            server_errors: get(&self.server_errors),
            bad_replies: get(&self.bad_replies),
            expired_in_queue: get(&self.expired_in_queue),
            up: self.up.load(Ordering::Relaxed),
        }
    }
}

/// [`LocationCounters`] at one moment (JSON in the summary).
#[derive(Clone, Debug, Default, Serialize)]
pub struct LocationCounts {
    /// REGISTER scripts sent.
    pub registers: u64,
    /// Removals of a failed flow's bindings run.
    pub removals: u64,
    /// Lookup scripts sent.
    pub lookups: u64,
    /// Connect attempts that failed.
    pub connect_failures: u64,
    /// Connections made after the first.
    pub reconnects: u64,
    /// Queries failed at once while waiting to reconnect (backoff).
    pub skipped_backoff: u64,
    /// Replies that did not come in time.
    pub timeouts: u64,
    /// Commands failed by a broken connection.
    pub io_errors: u64,
    /// Error replies from the server.
    pub server_errors: u64,
    /// Replies of the wrong shape.
    pub bad_replies: u64,
    /// Requests that waited in the queue beyond the timeout.
    pub expired_in_queue: u64,
    /// Connected after the last attempt.
    pub up: bool,
}

/// The kinds of query, for latency histograms.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QueryKind {
    /// A REGISTER applied.
    Register,
    /// A lookup for a request to an AOR.
    Lookup,
}

impl QueryKind {
    /// Label text.
    pub fn as_str(self) -> &'static str {
        match self {
            QueryKind::Register => "register",
            QueryKind::Lookup => "lookup",
        }
    }

    /// The kind of a query a request waits for (`None`: a removal, which
    /// no request waits for).
    fn of(query: &StoreQuery) -> Option<QueryKind> {
        match query {
            StoreQuery::Register(_) => Some(QueryKind::Register),
            StoreQuery::Lookup { .. } => Some(QueryKind::Lookup),
            StoreQuery::RemovePath { .. } => None,
        }
    }
}

/// Latency histograms of one kind of query (ns).
#[derive(Clone, Debug)]
pub struct QueryLatency {
    /// Received by a worker → taken by a store thread.
    pub queued: Histogram<u64>,
    /// The store call (one round trip to Redis, reconnect included).
    pub store: Histogram<u64>,
    /// Received by a worker → resumed and sent: what the store adds to
    /// the request (the in-memory store answers on the worker instead).
    pub added: Histogram<u64>,
}

impl Default for QueryLatency {
    fn default() -> Self {
        QueryLatency {
            queued: latency_histogram(),
            store: latency_histogram(),
            added: latency_histogram(),
        }
    }
}

impl QueryLatency {
    fn merge(&mut self, other: &QueryLatency) {
        let _ = self.queued.add(&other.queued);
        let _ = self.store.add(&other.store);
        let _ = self.added.add(&other.added);
    }
}

/// Latencies of the store threads, per kind of query.
#[derive(Clone, Debug, Default)]
pub struct LocationLatency {
    /// REGISTERs.
    pub register: QueryLatency,
    /// Lookups.
    pub lookup: QueryLatency,
}

impl LocationLatency {
    fn of_mut(&mut self, kind: QueryKind) -> &mut QueryLatency {
        match kind {
            QueryKind::Register => &mut self.register,
            QueryKind::Lookup => &mut self.lookup,
        }
    }

    /// Add `other` into `self`.
    pub fn merge(&mut self, other: &LocationLatency) {
        self.register.merge(&other.register);
        self.lookup.merge(&other.lookup);
    }
}

/// JSON summary of one kind's latencies (µs).
#[derive(Clone, Debug, Serialize)]
pub struct QueryLatencySummary {
    /// Worker → store thread.
    pub queued: LatencySummary,
    /// The store call.
    pub store: LatencySummary,
    /// Receive → resumed and sent.
    pub added: LatencySummary,
}

impl QueryLatencySummary {
    /// Summarise `latency`.
    pub fn of(latency: &QueryLatency) -> QueryLatencySummary {
        QueryLatencySummary {
            queued: LatencySummary::of_ns(&latency.queued),
            store: LatencySummary::of_ns(&latency.store),
            added: LatencySummary::of_ns(&latency.added),
        }
    }
}

/// The bounded queue between the workers and the store threads: one
/// channel per thread, chosen by a keyed hash of the AOR (one AOR's
/// queries stay in order). The key is random per process (review S13):
/// nobody outside can pick AORs that share a victim AOR's channel to fill
/// it.
pub struct LocationQueue {
    channels: Vec<SyncSender<DeferredRequest>>,
    seed: u64,
}

impl LocationQueue {
    /// A queue of `threads` channels holding `capacity` requests in all,
    /// spread by a hash keyed with `seed` (random in production); returns
    /// it and the receiving ends (one per store thread).
    pub fn new(
        threads: usize,
        capacity: usize,
        seed: u64,
    ) -> (LocationQueue, Vec<Receiver<DeferredRequest>>) {
        let per_thread = capacity.div_ceil(threads.max(1)).max(1);
        let (channels, receivers) = (0..threads.max(1))
            .map(|_| std::sync::mpsc::sync_channel(per_thread))
            .unzip();
        (LocationQueue { channels, seed }, receivers)
    }
}

impl StoreQueue for LocationQueue {
    fn submit(&self, request: DeferredRequest) -> Result<(), QueueFull> {
        let hash = ringway_sip::hash::Hash64::new(self.seed)
            .str(request.query.aor())
            .finish();
        let channel = &self.channels[(hash % self.channels.len() as u64) as usize];
        channel.try_send(request).map_err(|e| match e {
            TrySendError::Full(_) | TrySendError::Disconnected(_) => QueueFull,
        })
    }
}

/// Requests one store thread finishes per batch (then sends once).
const STORE_BATCH: usize = 32;

/// One store thread's state: its proxy handle, its store (own
/// connection), its channel, a send batch and what it measured.
pub struct StoreThread<'p> {
    worker: ProxyWorker<'p>,
    store: Arc<dyn LocationStore>,
    requests: Receiver<DeferredRequest>,
    tx: TxBatch,
    max_wait: Duration,
    metrics: WorkerMetrics,
    latency: Arc<Mutex<LocationLatency>>,
    counters: Arc<LocationCounters>,
    /// Connections (when there is a TCP listener): what a resumed request
    /// sends over a connection goes there, not over UDP.
    connections: Option<Arc<crate::sip::Connections>>,
}

impl<'p> StoreThread<'p> {
    /// Send over connections too (a request that came over TCP is
    /// answered over its connection; a binding's connection is used).
    pub fn with_connections(&mut self, connections: Option<Arc<crate::sip::Connections>>) {
        self.connections = connections;
    }

    /// A store thread for `proxy` taking requests from `requests` and
    /// asking `store`; a request older than `max_wait` when taken is
    /// answered as unavailable. Latencies go to `latency`.
    pub fn new(
        proxy: &'p Proxy,
        store: Arc<dyn LocationStore>,
        requests: Receiver<DeferredRequest>,
        max_wait: Duration,
        latency: Arc<Mutex<LocationLatency>>,
        counters: Arc<LocationCounters>,
    ) -> StoreThread<'p> {
        StoreThread {
            worker: proxy.worker(),
            store,
            requests,
            tx: TxBatch::new(STORE_BATCH * 4, TX_FRAME),
            max_wait,
            metrics: WorkerMetrics::default(),
            latency,
            counters,
            connections: None,
        }
    }

    /// What the thread sent and how the requests it finished ended.
    pub fn metrics(&self) -> &WorkerMetrics {
        &self.metrics
    }

    /// Wait up to `wait` for requests, finish up to a batch of them and
    /// send their output through `io`. Returns how many were finished, or
    /// `None` when every worker side is gone.
    pub fn run_batch(
        &mut self,
        io: &mut dyn BatchIo,
        wait: Duration,
        mut clock: impl FnMut() -> Nanos,
    ) -> Option<usize> {
        let first = match self.requests.recv_timeout(wait) {
            Ok(request) => request,
            Err(RecvTimeoutError::Timeout) => return Some(0),
            Err(RecvTimeoutError::Disconnected) => return None,
        };
        self.tx.clear();
        let mut done = 0;
        let mut next = Some(first);
        while let Some(request) = next.take() {
            self.finish(io, &request, &mut clock);
            done += 1;
            if done < STORE_BATCH {
                next = self.requests.try_recv().ok();
            }
        }
        if !self.tx.is_empty() {
            if io.send_batch(&self.tx).is_err() {
                self.metrics.tx_errors += self.tx.len() as u64;
            }
            self.tx.clear();
        }
        let io_stats = io.stats();
        self.metrics.msgs_out = io_stats.tx_packets;
        self.metrics.tx_errors = self.metrics.tx_errors.max(io_stats.tx_errors);
        Some(done)
    }

    /// Ask the store, resume the request, record what happened.
    fn finish(
        &mut self,
        io: &mut dyn BatchIo,
        request: &DeferredRequest,
        clock: &mut impl FnMut() -> Nanos,
    ) {
        let taken = clock().0;
        if request.query.is_removal() {
            // Nothing waits for it: run it, resume nothing. (A late one
            // still runs: the bindings are as dead as when it was queued.)
            let _ = request.query.run(self.store.as_ref(), taken);
            self.counters.add(&self.counters.removals);
            return;
        }
        let queued = taken.saturating_sub(request.received);
        let answer = if queued > self.max_wait.as_nanos() as u64 {
            self.counters.add(&self.counters.expired_in_queue);
            Err(StoreError::Unavailable)
        } else {
            request.query.run(self.store.as_ref(), taken)
        };
        let answered = clock().0;
        let StoreThread {
            worker,
            tx,
            metrics,
            connections,
            ..
        } = self;
        let mut oversize = 0;
        let mut send_errors = 0;
        let outcome = worker.resume_hops(request, answer, answered, &mut |hop, bytes| {
            if hop.transport != ringway_sip::Transport::Udp {
                // Over its connection (before: over UDP to the address,
                // which a TCP client never reads).
                match connections.as_deref() {
                    Some(connections) => {
                        connections.send(hop, bytes, answered);
                    }
                    None => oversize += 1,
                }
                return;
            }
            let dst = hop.addr;
            if tx.is_full() {
                if io.send_batch(tx).is_err() {
                    send_errors += tx.len() as u64;
                }
                tx.clear();
            }
            if tx.push(dst, bytes).is_err() {
                oversize += 1;
            }
        });
        let sent = clock().0;
        metrics.tx_oversize += oversize;
        metrics.tx_errors += send_errors;
        // Its arrival was counted by the worker that deferred it.
        metrics
            .slot_mut(outcome.label.slot())
            .count_action(outcome.action);
        let mut latency = self.latency.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(kind) = QueryKind::of(&request.query) else {
            return;
        };
        let kind = latency.of_mut(kind);
        let record = |h: &mut Histogram<u64>, ns: u64| {
            h.saturating_record(ns.clamp(1, crate::metrics::LATENCY_MAX_NS));
        };
        record(&mut kind.queued, queued);
        record(&mut kind.store, answered.saturating_sub(taken));
        record(&mut kind.added, sent.saturating_sub(request.received));
    }
}

#[cfg(test)]
mod tests {
    use super::redact_location;

    #[test]
    fn passwords_are_not_printed() {
        assert_eq!(
            redact_location("redis://:secret@127.0.0.1:6379/0"),
            "redis://***@127.0.0.1:6379/0"
        );
        assert_eq!(
            redact_location("redis://user:p@ss@[::1]:6379"),
            "redis://***@[::1]:6379"
        );
        assert_eq!(
            redact_location("redis://127.0.0.1:6379/0"),
            "redis://127.0.0.1:6379/0"
        );
        assert_eq!(redact_location("memory"), "memory");
        let error = "redis://:secret@127.0.0.1:0/x"
            .parse::<super::Location>()
            .unwrap_err();
        assert!(!error.contains("secret"), "{error}");
        let location: super::Location = "redis://:secret@127.0.0.1:6379/0".parse().unwrap();
        for printed in [
            location.to_string(),
            format!("{location:?}"),
            serde_json::to_string(&location).unwrap(),
        ] {
            assert!(!printed.contains("secret"), "{printed}");
            assert!(
                printed.contains("redis://***@127.0.0.1:6379/0"),
                "{printed}"
            );
        }
    }

    /// The channels each of `aors` lands on with `seed`.
    fn channels_of(seed: u64, aors: &[String]) -> Vec<usize> {
        let (queue, receivers) = LocationQueue::new(8, 8 * aors.len(), seed);
        aors.iter()
            .map(|aor| {
                let request = DeferredRequest {
                    query: StoreQuery::Lookup { aor: aor.clone() },
                    received: 0,
                    src: ringway_sip::Hop::udp("192.0.2.1:5060".parse().unwrap()),
                    datagram: Vec::new(),
                };
                queue.submit(request).unwrap();
                receivers.iter().position(|r| r.try_recv().is_ok()).unwrap()
            })
            .collect()
    }

    #[test]
    fn store_channels_depend_on_the_per_process_seed() {
        // Review S13: which AORs share a channel is not computable from
        // outside; with another seed the same AORs spread differently.
        let aors: Vec<String> = (0..64).map(|i| format!("user{i}")).collect();
        let a = channels_of(1, &aors);
        assert_eq!(a, channels_of(1, &aors), "one seed, one spread");
        assert_ne!(a, channels_of(2, &aors));
        assert!(a.iter().collect::<std::collections::BTreeSet<_>>().len() > 4);
    }

    #[test]
    fn error_texts_lose_the_password() {
        let url = "redis://admin:hunter2@127.0.0.1:6379/0";
        let scrubbed = super::redact_error(
            url,
            &format!("location {url}: refused by admin:hunter2 (hunter2)"),
        );
        assert!(!scrubbed.contains("hunter2"), "{scrubbed}");
        assert!(
            scrubbed.contains("redis://***@127.0.0.1:6379/0"),
            "{scrubbed}"
        );
        // A store that cannot connect says why, without the password.
        let store = RedisStore::new(
            "redis://:hunter2@127.0.0.1:1/0",
            Duration::from_millis(200),
            Arc::new(LocationCounters::default()),
        )
        .unwrap();
        let error = store.ping().unwrap_err();
        assert!(!error.is_empty() && !error.contains("hunter2"), "{error}");
    }

    use super::*;

    #[test]
    fn urls_are_checked_at_start_up() {
        let parse_location = |text: &str| text.parse::<Location>();
        assert_eq!(parse_location("memory"), Ok(Location::Memory));
        for good in [
            "redis://127.0.0.1:6379/0",
            "redis://127.0.0.1:6390",
            "redis://localhost/3",
            "redis://:secret@127.0.0.1:6379/1",
            "redis://[::1]:6379/0",
        ] {
            assert!(parse_location(good).is_ok(), "{good}");
        }
        for bad in [
            "",
            "mem",
            "redis://",
            "redis://:6379/0",
            "redis://127.0.0.1:0/0",
            "redis://127.0.0.1:70000/0",
            "redis://127.0.0.1:port/0",
            "redis://127.0.0.1:6379/zero",
            "redis://127.0.0.1:6379/0?x=1",
            "redis://[::1/0",
            "rediss://127.0.0.1:6379/0",
            "http://127.0.0.1:6379/0",
            "redis://bad host:1/0",
        ] {
            let e = parse_location(bad).expect_err(bad);
            assert!(
                e.contains("expected redis://HOST:PORT/DB") || e.contains(bad),
                "{e}"
            );
        }
    }
}
