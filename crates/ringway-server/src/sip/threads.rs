//! The server's threads: workers, the timer, TCP event loops and location
//! store threads, each publishing its metrics and CPU time when it ends and
//! stopping every thread when it panics.

use super::config::duration_ns;
use super::location::StoreThread;
use super::snapshot::MetricsSlot;
use super::{lock, tcp, Shared, SipTimer, SipWorker, ThreadCpu, WorkerMetrics, RX_FRAME};
use crate::host;
use ringway_io::{monotonic_now, BackendKind, BatchIo, RxBatch};
use std::net::UdpSocket;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::Receiver;
use std::sync::Arc;
use std::time::Duration;

/// Receive wait before a worker re-checks the stop flag and publication requests.
const POLL: Duration = Duration::from_millis(50);

/// Counts a thread alive from its start to its end (also by unwinding).
struct AliveGuard<'a>(&'a AtomicUsize);

impl<'a> AliveGuard<'a> {
    fn new(count: &'a AtomicUsize) -> Self {
        count.fetch_add(1, Ordering::Relaxed);
        AliveGuard(count)
    }
}

impl Drop for AliveGuard<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// One TCP event loop thread ([`tcp::run_loop`]).
pub(super) fn tcp_thread(
    shared: &Shared,
    index: usize,
    poll: mio::Poll,
    listeners: Vec<(mio::net::TcpListener, ringway_sip::Transport)>,
    udp: UdpSocket,
) {
    let Some(connections) = shared.connections.as_deref() else {
        return;
    };
    let name = format!("sip-tcp{index}");
    let _alive = AliveGuard::new(&shared.threads_alive);
    let run = catch_unwind(AssertUnwindSafe(|| {
        tcp::run_loop(tcp::LoopContext {
            poll,
            listeners,
            connections,
            handler: &mut shared.proxy.worker(),
            udp,
            stop: &shared.stop,
        })
    }));
    record_thread_cpu(shared, &name);
    if let Err(panic) = run {
        shared.thread_panicked(&name);
        log::error!("sip server: thread {name} panicked: stopping every thread");
        resume_unwind(panic);
    }
}

/// Record the calling thread's CPU time when it ends.
fn record_thread_cpu(shared: &Shared, name: &str) {
    if let Ok(cpu) = host::thread_cpu_time() {
        lock(&shared.threads_cpu).push(ThreadCpu {
            name: name.to_string(),
            tid: ringway_io::thread::current_tid(),
            cpu,
        });
    }
}

/// One worker thread: receive a batch, drive it through the core, repeat.
pub(super) fn worker_thread(shared: &Shared, index: usize, mut io: Box<dyn BatchIo>) {
    let name = format!("sip-w{index}");
    let lines = host::place_this_thread(&name, &shared.config.worker_placement(index));
    for line in &lines {
        log::info!("sip server: placement {line}");
    }
    lock(&shared.placement).extend(lines);
    let config = &shared.config;
    let mut rx = RxBatch::new(config.batch, RX_FRAME);
    // AF_XDP has no kernel TX stamps (K_snd is n/a): asking for them would
    // only count them lost, and read the backend's counters per batch.
    let tx_stamp_every = match io.kind() {
        BackendKind::Xdp => 0,
        _ => config.tx_stamp_every,
    };
    let mut worker = SipWorker::new(&shared.proxy, config.batch, tx_stamp_every);
    worker.with_connections(shared.connections.clone());
    worker.with_monitor(shared.monitor.clone());
    worker.overload_control_pool(shared.overload_pool.clone());
    worker.shed_after(config.overload_queue_delay.map(duration_ns));
    worker.pin_admitted(config.overload_pinned_admit_ppm);
    worker.overload_control(config.overload_control);
    worker.emulate_service(config.emulated_service, index as u64 + 1);
    let mut coalescing = config.rx_coalesce.map(Coalescing::new);
    if let Some(window) = config.rx_coalesce {
        // A short window is mostly timer slack (50 µs by default) otherwise.
        let slack = ringway_io::thread::set_timer_slack(window / 8);
        log::info!("sip server: worker {index}: receive coalescing {window:?}, {slack}");
    }
    let slot = &shared.slots[index];
    let mut published = 0u64;
    let _alive = AliveGuard::new(&shared.threads_alive);
    let run = catch_unwind(AssertUnwindSafe(|| {
        while !shared.stop.load(Ordering::Relaxed) {
            // Right after a coalescing window: take what came, no wait.
            let after_window = coalescing.as_ref().is_some_and(|c| c.slept);
            let timeout = if after_window { Duration::ZERO } else { POLL };
            let received = io.recv_batch(&mut rx, Some(timeout));
            let got = *received.as_ref().unwrap_or(&0);
            match received {
                Ok(0) if after_window => worker.count_wakeup(),
                Ok(0) => worker.refresh_io(&*io),
                Ok(_) => {
                    worker.count_wakeup();
                    shared.injected_panic(&name);
                    worker.drive_batch(io.as_mut(), &rx, monotonic_now)
                }
                Err(e) => {
                    worker.count_rx_error();
                    crate::warn_limited!("sip server: worker {index}: receive error: {e}");
                    std::thread::sleep(Duration::from_millis(10));
                }
            }
            worker.report_unreachable(io.as_mut(), monotonic_now().0);
            slot.offer(worker.metrics(), &mut published);
            if let Some(coalescing) = coalescing.as_mut() {
                if coalescing.after(monotonic_now().0, got, rx.capacity()) {
                    worker.count_coalesce_window();
                }
            }
        }
        worker.refresh_io(&*io);
    }));
    finish_thread(shared, slot, worker.metrics(), &name, run);
}

/// Receive coalescing of one worker ([`super::SipServerConfig::rx_coalesce`]):
/// after a receive that brought fewer datagrams than a batch, sleep the
/// window before receiving again, so that what arrives meanwhile is
/// handled by one wake-up, as a NIC's interrupt moderation (`rx-usecs`)
/// does. Only while datagrams come at two or more per window (counted
/// over the last [`PERIOD_WINDOWS`] windows): a window that finds nothing
/// is a wake-up more, and at rates that leave most windows empty the
/// loop waits for datagrams as without coalescing. A full batch never
/// sleeps (more is probably queued): the high-rate path is unchanged.
struct Coalescing {
    window: Duration,
    /// The last round ended with a window slept.
    slept: bool,
    /// Length of a counting period (ns): [`PERIOD_WINDOWS`] windows.
    period: u64,
    /// Start of the current period (monotonic ns).
    period_start: u64,
    /// Datagrams received in the current period and in the one before it.
    this_period: u64,
    last_period: u64,
}

/// Windows per counting period of [`Coalescing`].
const PERIOD_WINDOWS: u64 = 16;
/// Datagrams per window (on average over a period) from which windows are
/// slept: with Poisson arrivals one window in e² ≈ 7 is then empty.
const DENSE_PER_WINDOW: u64 = 2;

impl Coalescing {
    fn new(window: Duration) -> Coalescing {
        let window_ns = u64::try_from(window.as_nanos()).unwrap_or(u64::MAX);
        Coalescing {
            window,
            slept: false,
            period: window_ns.saturating_mul(PERIOD_WINDOWS),
            period_start: 0,
            this_period: 0,
            last_period: 0,
        }
    }

    /// After a receive that brought `got` datagrams of a `capacity` batch
    /// at `now` (monotonic ns): sleep the window if datagrams come densely
    /// and the batch was not full. Returns whether it slept.
    fn after(&mut self, now: u64, got: usize, capacity: usize) -> bool {
        let elapsed = now.saturating_sub(self.period_start);
        if elapsed >= self.period {
            // A period with nothing in between: the last one counted 0.
            self.last_period = if elapsed < 2 * self.period {
                self.this_period
            } else {
                0
            };
            self.this_period = 0;
            self.period_start = now;
        }
        self.this_period += got as u64;
        let dense = self.this_period.max(self.last_period) >= DENSE_PER_WINDOW * PERIOD_WINDOWS;
        self.slept = dense && got > 0 && got < capacity;
        if self.slept {
            std::thread::sleep(self.window);
        }
        self.slept
    }
}

/// Publish a thread's final metrics and CPU time, also when its loop
/// panicked: then every thread is told to stop (review S11: no worker
/// goes on alone with a dead one's socket still bound, no timer-less
/// proxy), and the panic is passed on, so `join` reports it.
fn finish_thread(
    shared: &Shared,
    slot: &MetricsSlot,
    metrics: &WorkerMetrics,
    name: &str,
    run: std::thread::Result<()>,
) {
    slot.finish(metrics);
    record_thread_cpu(shared, name);
    if let Err(panic) = run {
        shared.thread_panicked(name);
        log::error!("sip server: thread {name} panicked: stopping every thread");
        resume_unwind(panic);
    }
}

/// The timer thread: run the core's timers at their deadlines.
pub(super) fn timer_thread(shared: &Shared, mut io: Box<dyn BatchIo>) {
    // On the workers' CPUs (affinity only): the timer thread takes the
    // transaction shards' locks the workers take, so it runs where they
    // run. Elsewhere (on a load generator's CPU, say) it can be preempted
    // while it holds one, and every worker needing that shard sleeps until
    // it runs again: the workers' CPU idles while their queue grows.
    if let Some(cpus) = shared.config.placement.cpus.clone() {
        let placement = ringway_io::thread::Placement {
            cpus: Some(cpus),
            ..Default::default()
        };
        let lines = host::place_this_thread("sip-timer", &placement);
        for line in &lines {
            log::info!("sip server: placement {line}");
        }
        lock(&shared.placement).extend(lines);
    }
    let mut timer = SipTimer::new(&shared.proxy);
    timer.with_connections(shared.connections.clone());
    let slot = &shared.slots[shared.config.workers];
    let mut published = 0u64;
    let _alive = AliveGuard::new(&shared.threads_alive);
    let run = catch_unwind(AssertUnwindSafe(|| {
        while !shared.stop.load(Ordering::Relaxed) {
            shared.injected_panic("sip-timer");
            if let Some(names) = shared.names.as_deref() {
                timer.resume_names(io.as_mut(), names, monotonic_now().0);
            }
            timer.report_undelivered(io.as_mut(), monotonic_now().0);
            timer.report_unreachable(io.as_mut(), monotonic_now().0);
            let wait = timer.wait(monotonic_now().0);
            if wait.is_zero() {
                timer.fire(io.as_mut(), monotonic_now().0);
            } else {
                std::thread::sleep(wait);
            }
            slot.offer(timer.metrics(), &mut published);
        }
    }));
    finish_thread(shared, slot, timer.metrics(), "sip-timer", run);
}

/// A store thread: take deferred requests, ask the shared store, resume
/// them in the core and send what they produce.
pub(super) fn store_thread(
    shared: &Shared,
    index: usize,
    store: Arc<dyn ringway_sip::LocationStore>,
    requests: Receiver<ringway_sip::proxy::DeferredRequest>,
    mut io: Box<dyn BatchIo>,
) {
    let Some(location) = shared.location.as_ref() else {
        return;
    };
    let mut thread = StoreThread::new(
        &shared.proxy,
        store,
        requests,
        shared.config.location_timeout,
        location.latency[index].clone(),
        location.counters.clone(),
    );
    thread.with_connections(shared.connections.clone());
    let slot = &shared.slots[shared.config.workers + 1 + index];
    let mut published = 0u64;
    let name = format!("sip-store{index}");
    let _alive = AliveGuard::new(&shared.threads_alive);
    let run = catch_unwind(AssertUnwindSafe(|| {
        while !shared.stop.load(Ordering::Relaxed) {
            shared.injected_panic(&name);
            if thread.run_batch(io.as_mut(), POLL, monotonic_now).is_none() {
                break;
            }
            slot.offer(thread.metrics(), &mut published);
        }
    }));
    finish_thread(shared, slot, thread.metrics(), &name, run);
}

/// How often the keepalive thread looks for due pings.
const KEEPALIVE_TICK: Duration = Duration::from_millis(50);

/// The keepalive thread: ping the UDP flows of the bindings when due
/// (from the proxy's own port, so the NAT mapping is the flow's) and
/// remove those that stopped answering ([`super::keepalive`]).
pub(super) fn keepalive_thread(shared: &Shared, udp: UdpSocket) {
    let Some(monitor) = shared.monitor.as_deref() else {
        return;
    };
    let run = catch_unwind(AssertUnwindSafe(|| {
        while !shared.stop.load(Ordering::Relaxed) {
            shared.injected_panic("sip-keepalive");
            let now = monotonic_now().0;
            monitor.run_removals(now);
            monitor.run_due(now, &mut |addr, bytes| {
                ringway_io::sock::send_to(&udp, bytes, addr).is_ok()
            });
            std::thread::sleep(KEEPALIVE_TICK);
        }
    }));
    record_thread_cpu(shared, "sip-keepalive");
    if let Err(panic) = run {
        shared.thread_panicked("sip-keepalive");
        log::error!("sip server: thread sip-keepalive panicked: stopping every thread");
        resume_unwind(panic);
    }
}

#[cfg(test)]
mod tests {
    use super::Coalescing;
    use std::time::Duration;

    /// The window is slept only after a partial batch while datagrams come
    /// at two or more per window (32 over the last 16 windows): not after
    /// nothing, not after a full batch (high rate: more is queued), not at
    /// rates that would leave most windows empty, and no longer once the
    /// rate has fallen for a period.
    #[test]
    fn coalescing_sleeps_only_after_a_partial_batch_of_dense_traffic() {
        let us = 1_000;
        let mut c = Coalescing::new(Duration::from_micros(50));
        let start = 1_000_000 * us;
        // 31 datagrams in the first 16 windows (800 µs): too sparse yet.
        for k in 0..31 {
            assert!(!c.after(start + k * 20 * us, 1, 32), "datagram {k}");
        }
        assert!(c.after(start + 700 * us, 1, 32), "the 32nd in 800 µs");
        assert!(c.slept);
        assert!(!c.after(start + 760 * us, 0, 32), "nothing came");
        assert!(!c.slept);
        assert!(!c.after(start + 770 * us, 32, 32), "a full batch");
        // The next period: dense by the last one's count.
        assert!(c.after(start + 900 * us, 1, 32));
        // The period after that one, which had 1 datagram: sparse again.
        assert!(!c.after(start + 1_800 * us, 1, 32));
        // A long pause: the count starts over.
        assert!(!c.after(start + 100_000 * us, 5, 32));
    }
}
