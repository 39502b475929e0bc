//! The timer side of the proxy: run the core's transaction timers at their
//! deadlines and send what they produce.

use super::stats::WorkerMetrics;
use super::tcp::Connections;
use super::worker::TX_FRAME;
use ringway_io::{BatchIo, IcmpUnreachable, TxBatch};
use ringway_sip::{Hop, Proxy, ProxyWorker, Transport};
use std::sync::Arc;
use std::time::Duration;

/// Longest sleep of the timer thread (new transactions may bring earlier
/// deadlines than the one it waits for).
pub const TIMER_TICK_MAX: Duration = Duration::from_millis(5);

/// Runs the core's timers and counts what they send.
pub struct SipTimer<'p> {
    proxy: ProxyWorker<'p>,
    tx: TxBatch,
    metrics: WorkerMetrics,
    /// Where messages for connection transports go.
    connections: Option<Arc<Connections>>,
    /// ICMP unreachable reports taken from the socket, for the core.
    unreachable: Vec<IcmpUnreachable>,
}

impl<'p> SipTimer<'p> {
    /// A timer driver for `proxy`.
    pub fn new(proxy: &'p Proxy) -> SipTimer<'p> {
        SipTimer {
            proxy: proxy.worker(),
            tx: TxBatch::new(256, TX_FRAME),
            metrics: WorkerMetrics::default(),
            connections: None,
            unreachable: Vec::new(),
        }
    }

    /// Send what the timers address to a connection transport through
    /// `connections`.
    pub fn with_connections(&mut self, connections: Option<Arc<Connections>>) {
        self.connections = connections;
    }

    /// What the timer sent so far.
    pub fn metrics(&self) -> &WorkerMetrics {
        &self.metrics
    }

    /// How long to wait at `now` (ns) before the next [`SipTimer::fire`]:
    /// zero when a deadline has passed, else until the next deadline, at
    /// most [`TIMER_TICK_MAX`].
    pub fn wait(&self, now: u64) -> Duration {
        match self.proxy.proxy().next_deadline() {
            Some(d) if d <= now => Duration::ZERO,
            Some(d) => Duration::from_nanos(d - now).min(TIMER_TICK_MAX),
            None => TIMER_TICK_MAX,
        }
    }

    /// Resume the requests parked on names that `names` has ready at `now`
    /// (resolved, or waited too long) and send their output through `io`.
    pub fn resume_names(&mut self, io: &mut dyn BatchIo, names: &super::ProxyNames, now: u64) {
        let ready = names.take_ready(now);
        if ready.is_empty() {
            return;
        }
        self.drive(io, now, |proxy, metrics, out| {
            for (request, answer) in ready {
                let outcome = proxy.resume_resolved(&request, answer, now, out);
                // Its arrival was counted by the worker that parked it.
                metrics
                    .slot_mut(outcome.label.slot())
                    .count_action(outcome.action);
            }
        });
    }

    /// Hand the core the messages the connections could not deliver since
    /// the last call (transport errors: the next target at once) and send
    /// what it answers through `io`.
    pub fn report_undelivered(&mut self, io: &mut dyn BatchIo, now: u64) {
        let Some(connections) = self.connections.clone() else {
            return;
        };
        let undelivered = connections.take_undelivered();
        if undelivered.is_empty() {
            return;
        }
        self.drive(io, now, |proxy, _, out| {
            for (hop, message) in undelivered {
                proxy.on_transport_error(now, hop, &message, out);
            }
        });
    }

    /// Hand the core the ICMP unreachable errors the timer's socket handle
    /// read (its sends meet them too: a pending error fails the next send
    /// on the socket once), each destination once, and send what it
    /// answers ([`super::SipWorker::report_unreachable`]).
    pub fn report_unreachable(&mut self, io: &mut dyn BatchIo, now: u64) {
        let mut reports = std::mem::take(&mut self.unreachable);
        reports.clear();
        if matches!(io.poll_unreachable(&mut reports), Ok(1..)) {
            reports.sort_unstable_by_key(|report| report.destination);
            reports.dedup_by_key(|report| report.destination);
            self.drive(io, now, |proxy, _, out| {
                for report in &reports {
                    proxy.on_unreachable(now, Hop::udp(report.destination), out);
                }
            });
            let io_stats = io.stats();
            let counted = &mut self.metrics.io;
            counted.icmp_unreachable = io_stats.icmp_unreachable;
            counted.icmp_ignored = io_stats.icmp_ignored;
            counted.icmp_lost = io_stats.icmp_lost;
        }
        self.unreachable = reports;
    }

    /// Run `step` on the core with an `out` that batches UDP datagrams
    /// into `io` and writes other hops to their connections.
    fn drive(
        &mut self,
        io: &mut dyn BatchIo,
        now: u64,
        step: impl FnOnce(&mut ProxyWorker<'p>, &mut WorkerMetrics, &mut dyn FnMut(Hop, &[u8])),
    ) {
        let SipTimer {
            proxy,
            tx,
            metrics,
            connections,
            ..
        } = self;
        tx.clear();
        let mut oversize = 0u64;
        let mut sent = 0u64;
        step(proxy, metrics, &mut |hop, bytes| {
            if hop.transport != Transport::Udp {
                match connections.as_deref() {
                    Some(connections) => {
                        connections.send(hop, bytes, now);
                    }
                    None => oversize += 1,
                }
                return;
            }
            if tx.is_full() {
                if let Ok(n) = io.send_batch(tx) {
                    sent += n as u64;
                }
                tx.clear();
            }
            if tx.push(hop.addr, bytes).is_err() {
                oversize += 1;
            }
        });
        if !tx.is_empty() {
            if let Ok(n) = io.send_batch(tx) {
                sent += n as u64;
            }
            tx.clear();
        }
        metrics.timer_out += sent;
        metrics.tx_oversize += oversize;
    }

    /// Fire the timers due at `now` and send their output through `io`.
    pub fn fire(&mut self, io: &mut dyn BatchIo, now: u64) {
        let SipTimer {
            proxy,
            tx,
            metrics,
            connections,
            ..
        } = self;
        tx.clear();
        let mut oversize = 0u64;
        let mut sent = 0u64;
        proxy.on_timer_hops(now, &mut |hop, bytes| {
            if hop.transport != Transport::Udp {
                if let Some(connections) = connections.as_deref() {
                    connections.send(hop, bytes, now);
                } else {
                    oversize += 1;
                }
                return;
            }
            let dst = hop.addr;
            if tx.is_full() {
                if let Ok(n) = io.send_batch(tx) {
                    sent += n as u64;
                }
                tx.clear();
            }
            if tx.push(dst, bytes).is_err() {
                oversize += 1;
            }
        });
        if !tx.is_empty() {
            if let Ok(n) = io.send_batch(tx) {
                sent += n as u64;
            }
        }
        metrics.timer_out += sent;
        metrics.tx_oversize += oversize;
        let io_stats = io.stats();
        metrics.msgs_out = io_stats.tx_packets;
        metrics.tx_errors = io_stats.tx_errors;
    }
}
