//! Metrics publication and the merged [`Snapshot`]: each thread keeps its
//! metrics to itself and publishes a copy into its [`MetricsSlot`] between
//! batches when asked; [`snapshot`] asks every thread, waits (bounded) and
//! merges.

use super::location::{LocationCounts, LocationLatency};
use super::tcp::TcpSnapshot;
use super::tls::TlsSnapshot;
use super::{lock, RxModel, Shared, WorkerMetrics};
use crate::host::{self, CpuTime};
use ringway_io::counters::UdpSnmp;
use ringway_sip::ProxyStats;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long [`SipServer::snapshot`](super::SipServer::snapshot) waits for the threads to publish.
const SNAPSHOT_WAIT: Duration = Duration::from_millis(250);

/// One thread's published metrics.
#[derive(Default)]
struct Published {
    generation: u64,
    metrics: WorkerMetrics,
}

/// Where a thread publishes a copy of its metrics when asked.
#[derive(Default)]
pub(super) struct MetricsSlot {
    wanted: AtomicU64,
    /// Turns of the thread's loop (the watchdog's proof of life).
    beats: AtomicU64,
    published: Mutex<Published>,
}

/// Generation meaning "the thread has ended; this copy is final".
const FINAL: u64 = u64::MAX;

impl MetricsSlot {
    /// Publish `metrics` if a newer copy was asked for than `*last`.
    pub(super) fn offer(&self, metrics: &WorkerMetrics, last: &mut u64) {
        self.beats.fetch_add(1, Ordering::Relaxed);
        let wanted = self.wanted.load(Ordering::Acquire);
        if wanted > *last {
            let mut published = lock(&self.published);
            published.metrics.clone_from(metrics);
            published.generation = published.generation.max(wanted);
            *last = wanted;
        }
    }

    /// Publish the final copy (the thread ends).
    pub(super) fn finish(&self, metrics: &WorkerMetrics) {
        let mut published = lock(&self.published);
        published.metrics.clone_from(metrics);
        published.generation = FINAL;
    }

    /// Turns of the thread's loop so far.
    pub(super) fn beats(&self) -> u64 {
        self.beats.load(Ordering::Relaxed)
    }

    fn generation(&self) -> u64 {
        lock(&self.published).generation
    }
}

/// The shared location store's state at one moment.
#[derive(Debug, Clone)]
pub struct LocationSnapshot {
    /// Counters of the store threads and connections.
    pub counts: LocationCounts,
    /// Their latencies, per kind of query.
    pub latency: LocationLatency,
}

/// The configured state bounds, exported next to what they bound.
#[derive(Debug, Clone, Copy)]
pub struct Bounds {
    /// [`SipServerConfig::max_transactions`](super::SipServerConfig::max_transactions).
    pub max_transactions: usize,
    /// [`SipServerConfig::max_transaction_bytes`](super::SipServerConfig::max_transaction_bytes).
    pub max_transaction_bytes: usize,
    /// [`SipServerConfig::max_bindings`](super::SipServerConfig::max_bindings).
    pub max_bindings: usize,
    /// [`SipServerConfig::max_binding_bytes`](super::SipServerConfig::max_binding_bytes).
    pub max_binding_bytes: usize,
}

/// Merged measurements at one moment (what `/metrics` renders).
#[derive(Debug, Clone)]
pub struct Snapshot {
    /// All workers' and the timer's metrics; `socket_rx_dropped` counts each
    /// socket once (shared model: one socket seen by every worker).
    pub metrics: WorkerMetrics,
    /// UDP counters of this network namespace, delta since start.
    pub udp: UdpSnmp,
    /// The core's own statistics.
    pub proxy: ProxyStats,
    /// Process CPU since start.
    pub process_cpu: CpuTime,
    /// Time since start.
    pub elapsed: Duration,
    /// Threads that did not publish in time (their previous copy was used).
    pub stale_threads: usize,
    /// The configured state bounds.
    pub config: Bounds,
    /// Worker, timer and store threads running.
    pub threads_alive: usize,
    /// Worker, timer and store threads started.
    pub threads_started: usize,
    /// Threads that panicked (each stops the server).
    pub threads_panicked: usize,
    /// The shared location store (`None`: in memory).
    pub location: Option<LocationSnapshot>,
    /// Datagrams received per worker (index = worker).
    pub per_worker_in: Vec<u64>,
    /// The TCP transport (`None`: no TCP listener).
    pub tcp: Option<TcpSnapshot>,
    /// The TLS layer (`None`: no TLS configured).
    pub tls: Option<TlsSnapshot>,
    /// DNS for next hops given by name (`None`: no resolver).
    pub dns: Option<DnsSnapshot>,
}

/// The proxy's DNS: the resolver's counters and the parked requests'.
#[derive(Clone, Copy, Debug, Default, serde::Serialize)]
pub struct DnsSnapshot {
    /// The resolver (lookups, cache, queries).
    pub resolver: crate::dns::DnsStatsSnapshot,
    /// Requests refused because the pending set or the resolver queue was full.
    pub parked_refused: u64,
    /// Parked requests given up after the wait bound (answered 503).
    pub parked_expired: u64,
    /// Requests parked now.
    pub parked: u64,
}

/// Ask every thread for a copy of its metrics, wait (bounded) and merge.
pub(super) fn snapshot(shared: &Shared) -> Snapshot {
    let generation = shared.generation.fetch_add(1, Ordering::Relaxed) + 1;
    for slot in &shared.slots {
        slot.wanted.fetch_max(generation, Ordering::Release);
    }
    let until = Instant::now() + SNAPSHOT_WAIT;
    while shared.slots.iter().any(|s| s.generation() < generation) && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(1));
    }
    let mut merged = WorkerMetrics::default();
    let mut socket_drops = 0u64;
    let mut stale_threads = 0;
    let workers = shared.config.workers;
    let mut per_worker_in = Vec::with_capacity(workers);
    for (index, slot) in shared.slots.iter().enumerate() {
        let published = lock(&slot.published);
        stale_threads += usize::from(published.generation < generation);
        merged.merge(&published.metrics);
        if index < workers {
            let metrics = &published.metrics;
            per_worker_in.push(metrics.msgs_in);
            // Shared model: every worker sees the one socket's counter.
            socket_drops = match shared.config.rx_model {
                RxModel::Shared => socket_drops.max(metrics.socket_rx_dropped),
                RxModel::Reuseport => socket_drops + metrics.socket_rx_dropped,
            };
        }
    }
    merged.socket_rx_dropped = socket_drops;
    Snapshot {
        metrics: merged,
        udp: match (&shared.udp_start, host::udp_totals()) {
            (Some(start), Some(now)) => now.since(start),
            _ => UdpSnmp::default(),
        },
        proxy: shared.proxy.stats(),
        process_cpu: host::process_cpu_time()
            .unwrap_or_default()
            .since(&shared.cpu_start),
        elapsed: shared.started.elapsed(),
        stale_threads,
        config: Bounds {
            max_transactions: shared.config.max_transactions,
            max_transaction_bytes: shared.config.max_transaction_bytes,
            max_bindings: shared.config.max_bindings,
            max_binding_bytes: shared.config.max_binding_bytes,
        },
        threads_alive: shared.threads_alive.load(Ordering::Relaxed),
        threads_started: shared.slots.len(),
        threads_panicked: lock(&shared.panicked).len(),
        location: shared.location.as_ref().map(|location| {
            let mut latency = LocationLatency::default();
            for thread in &location.latency {
                latency.merge(&lock(thread));
            }
            LocationSnapshot {
                counts: location.counters.snapshot(),
                latency,
            }
        }),
        per_worker_in,
        tcp: shared.connections.as_ref().map(|c| c.snapshot()),
        tls: shared
            .connections
            .as_ref()
            .and_then(|c| c.tls())
            .map(|tls| tls.snapshot()),
        dns: shared.names.as_ref().map(|names| DnsSnapshot {
            resolver: names.resolver().stats().snapshot(),
            parked_refused: names.counters().refused.load(Ordering::Relaxed),
            parked_expired: names.counters().expired.load(Ordering::Relaxed),
            parked: names.parked() as u64,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_msgs(n: u64) -> WorkerMetrics {
        let mut m = WorkerMetrics::default();
        m.msgs_in = n;
        m
    }

    #[test]
    fn metrics_slot_publishes_only_when_asked_and_final_wins() {
        let slot = MetricsSlot::default();
        let mut last = 0u64;
        slot.offer(&with_msgs(1), &mut last);
        assert_eq!(slot.generation(), 0, "nobody asked: nothing published");
        assert_eq!(lock(&slot.published).metrics.msgs_in, 0);
        slot.wanted.store(3, Ordering::Release);
        slot.offer(&with_msgs(2), &mut last);
        assert_eq!((slot.generation(), last), (3, 3));
        assert_eq!(lock(&slot.published).metrics.msgs_in, 2);
        // Asked once, published once: a later offer does not copy again.
        slot.offer(&with_msgs(5), &mut last);
        assert_eq!(lock(&slot.published).metrics.msgs_in, 2);
        slot.finish(&with_msgs(7));
        assert_eq!(slot.generation(), FINAL);
        assert_eq!(lock(&slot.published).metrics.msgs_in, 7);
    }
}
