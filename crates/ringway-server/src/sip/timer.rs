//! The timer side of the proxy: run the core's transaction timers at their
//! deadlines and send what they produce.

use super::stats::WorkerMetrics;
use super::worker::TX_FRAME;
use ringway_io::{BatchIo, TxBatch};
use ringway_sip::{Proxy, ProxyWorker};
use std::time::Duration;

/// Longest sleep of the timer thread (new transactions may bring earlier
/// deadlines than the one it waits for).
pub const TIMER_TICK_MAX: Duration = Duration::from_millis(5);

/// Runs the core's timers and counts what they send.
pub struct SipTimer<'p> {
    proxy: ProxyWorker<'p>,
    tx: TxBatch,
    metrics: WorkerMetrics,
}

impl<'p> SipTimer<'p> {
    /// A timer driver for `proxy`.
    pub fn new(proxy: &'p Proxy) -> SipTimer<'p> {
        SipTimer {
            proxy: proxy.worker(),
            tx: TxBatch::new(256, TX_FRAME),
            metrics: WorkerMetrics::default(),
        }
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

    /// Fire the timers due at `now` and send their output through `io`.
    pub fn fire(&mut self, io: &mut dyn BatchIo, now: u64) {
        let SipTimer { proxy, tx, metrics } = self;
        tx.clear();
        let mut oversize = 0u64;
        let mut sent = 0u64;
        proxy.on_timer(now, &mut |dst, bytes| {
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
