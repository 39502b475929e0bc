//! The server's threads: workers, the timer, TCP event loops and location
//! store threads, each publishing its metrics and CPU time when it ends and
//! stopping every thread when it panics.

use super::config::duration_ns;
use super::location::StoreThread;
use super::snapshot::MetricsSlot;
use super::{lock, tcp, Shared, SipTimer, SipWorker, ThreadCpu, WorkerMetrics, RX_FRAME};
use crate::host;
use ringway_io::{monotonic_now, BatchIo, RxBatch};
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
    let mut worker = SipWorker::new(&shared.proxy, config.batch, config.tx_stamp_every);
    worker.with_connections(shared.connections.clone());
    worker.with_monitor(shared.monitor.clone());
    worker.overload_control_pool(shared.overload_pool.clone());
    worker.shed_after(config.overload_queue_delay.map(duration_ns));
    worker.pin_admitted(config.overload_pinned_admit_ppm);
    worker.overload_control(config.overload_control);
    worker.emulate_service(config.emulated_service, index as u64 + 1);
    let slot = &shared.slots[index];
    let mut published = 0u64;
    let _alive = AliveGuard::new(&shared.threads_alive);
    let run = catch_unwind(AssertUnwindSafe(|| {
        while !shared.stop.load(Ordering::Relaxed) {
            match io.recv_batch(&mut rx, Some(POLL)) {
                Ok(0) => {}
                Ok(_) => {
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
        }
    }));
    finish_thread(shared, slot, worker.metrics(), &name, run);
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
