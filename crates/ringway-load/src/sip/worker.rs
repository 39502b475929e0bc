//! One generator thread: drives a [`CallGen`] with a UDP socket and the
//! clock. It owns the batch backend, starts calls on the arrival schedule,
//! stages sends for UDP GSO trains, receives (UDP GRO trains split by the
//! backend), coalesces wakeups, and publishes live counters.

use super::arrival::Arrivals;
use super::callgen::{CallGen, CallGenConfig, CallStats};
use super::sendqueue::SendQueue;
use super::{GsoMode, Live, LoadConfig, WorkerResult};
use ringway_io::thread::thread_cpu_time;
use ringway_io::{open_backend, open_udp, BatchIo, RxBatch, SocketConfig};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const RX_FRAMES: usize = 64;
const RX_FRAME: usize = 8192;
/// Receive frames with UDP GRO: each may hold a train of up to 64 KiB.
const RX_FRAMES_GRO: usize = 16;
const RX_FRAME_GRO: usize = 65_536;
/// Most received batches handled in one loop pass.
const DRAIN_PASSES: usize = 16;
/// Most calls started in one loop pass (keeps receiving responsive when late).
const START_BURST: u64 = 64;

/// Counts of a [`CallStats`] already added to the shared [`Live`] counters.
#[derive(Default)]
struct Published {
    attempted: u64,
    succeeded: u64,
    failed: u64,
    throttled: u64,
    retransmissions: u64,
}

/// One generator thread: its socket, its [`CallGen`] and its share of the calls.
pub(crate) struct Worker {
    io: Box<dyn BatchIo>,
    gen: CallGen,
    /// Datagrams the generator emitted, sent once per loop pass.
    queue: SendQueue,
    rx: RxBatch,
    /// T1, T2, hold and the starting period (ns).
    t1: u64,
    t2: u64,
    hold: u64,
    duration: u64,
    arrivals: Arrivals,
    /// Calls this worker starts at most.
    quota: u64,
    live: Arc<Live>,
    published: Published,
    msgs_received: u64,
    /// Wakeup coalescing tick (ns; 0: wake per event).
    tick: u64,
}

/// Add to `counter` what `total` grew by since `seen`, and remember it.
fn add_new(counter: &AtomicU64, seen: &mut u64, total: u64) {
    if total > *seen {
        counter.fetch_add(total - *seen, Ordering::Relaxed);
        *seen = total;
    }
}

fn now_ns() -> u64 {
    ringway_io::monotonic_now().0
}

impl Worker {
    pub(crate) fn new(
        cfg: &LoadConfig,
        i: usize,
        run_id: &str,
        live: Arc<Live>,
    ) -> anyhow::Result<Worker> {
        let port = if cfg.base_port == 0 {
            0
        } else {
            cfg.base_port + i as u16
        };
        let mut socket_config = SocketConfig::new(std::net::SocketAddr::new(cfg.bind_ip, port));
        socket_config.rcvbuf = cfg.rcvbuf;
        socket_config.sndbuf = cfg.rcvbuf;
        // Kernel RX stamps make response times exact even when wakeups are coalesced.
        socket_config.rx_timestamps = true;
        let (sock, _rep) = open_udp(&socket_config)
            .map_err(|e| anyhow::anyhow!("bind {}: {e}", socket_config.bind))?;
        let mut backend = open_backend(cfg.backend, sock)?;
        let gso = cfg.gso != GsoMode::Off && backend.set_gso(true);
        if cfg.gso == GsoMode::On && !gso {
            anyhow::bail!(
                "UDP GSO not available with the {} backend on this kernel (use --gso auto or off)",
                cfg.backend
            );
        }
        let gro = cfg.gro != GsoMode::Off && backend.set_gro(true);
        if cfg.gro == GsoMode::On && !gro {
            anyhow::bail!(
                "UDP GRO not available with the {} backend on this kernel (use --gro auto or off)",
                cfg.backend
            );
        }
        let local = backend.local_addr()?;
        let threads = cfg.threads as u64;
        let quota = cfg.calls / threads + u64::from((i as u64) < cfg.calls % threads);
        Ok(Worker {
            io: backend,
            gen: CallGen::new(&CallGenConfig {
                local,
                uas: cfg.uas,
                proxy: cfg.proxy,
                run_id: run_id.to_string(),
                index: i,
                t1: cfg.t1,
                t2: cfg.t2,
                hold: cfg.hold,
                overload_control: cfg.overload_control,
            }),
            queue: SendQueue::new(gso, cfg.proxy),
            // A GRO train can fill 64 KiB: fewer, larger frames.
            rx: if gro {
                RxBatch::new(RX_FRAMES_GRO, RX_FRAME_GRO)
            } else {
                RxBatch::new(RX_FRAMES, RX_FRAME)
            },
            t1: cfg.t1.as_nanos() as u64,
            t2: cfg.t2.as_nanos() as u64,
            hold: cfg.hold.as_nanos() as u64,
            duration: cfg.duration.as_nanos() as u64,
            arrivals: Arrivals::new(
                cfg.arrival,
                cfg.rate / cfg.threads as f64,
                cfg.seed.wrapping_add(i as u64),
            ),
            quota,
            live,
            published: Published::default(),
            msgs_received: 0,
            tick: cfg.effective_tick().as_nanos() as u64,
        })
    }

    pub(crate) fn run(mut self, t0: Instant) -> anyhow::Result<WorkerResult> {
        let cpu0 = thread_cpu_time().unwrap_or_default();
        let start = now_ns() - t0.elapsed().as_nanos() as u64;
        let end_start = start + self.duration;
        let mut next_start = start + self.arrivals.next_gap_ns();
        let mut started = 0u64;
        let mut last_start = t0;
        let mut starting = self.quota > 0;
        let mut hard_deadline = u64::MAX;
        // Calls the schedule had due by the end of the start phase, and how
        // late the started ones went out (the generator falling behind).
        let mut scheduled = 0u64;
        let mut lag_sum_ns = 0u64;
        loop {
            let now = now_ns();
            // Received datagrams carry CLOCK_REALTIME stamps; this offset
            // puts them on the monotonic clock the generator runs on.
            let realtime_to_mono = now.wrapping_sub(ringway_io::realtime_now().0);
            if starting
                && (started >= self.quota
                    || now >= end_start
                    || self.live.stop.load(Ordering::Relaxed))
            {
                starting = false;
                // Arrivals scheduled before the end that never started.
                let stop_at = now.min(end_start);
                let mut missed = 0u64;
                while next_start < stop_at && started + missed < self.quota {
                    missed += 1;
                    next_start += self.arrivals.next_gap_ns();
                }
                scheduled = started + missed;
            }
            if !starting && hard_deadline == u64::MAX {
                hard_deadline = now + self.hold + 64 * self.t1 + 2 * self.t2;
            }
            let mut due = 0u64;
            while starting && next_start <= now && started + due < self.quota && due < START_BURST {
                due += 1;
                lag_sum_ns += now - next_start;
                next_start += self.arrivals.next_gap_ns();
            }
            let (gen, queue, io) = (&mut self.gen, &mut self.queue, &mut *self.io);
            if due > 0 {
                gen.start_calls(now, due, &mut |dst, kind, bytes| {
                    queue.push(io, dst, kind, bytes)
                });
                started += due;
                last_start = Instant::now();
            }
            gen.on_timer(now, &mut |dst, kind, bytes| {
                queue.push(io, dst, kind, bytes)
            });
            queue.flush(io);
            if !starting && gen.is_idle() {
                break;
            }
            let abort = self.live.abort.load(Ordering::Relaxed);
            if now >= hard_deadline || abort {
                gen.abandon_calls(if abort { "aborted" } else { "unfinished" });
                break;
            }
            self.publish();
            let busy = !self.gen.is_idle();
            let mut wake = now + 50_000_000;
            if starting {
                // Coalesced wakeups: call starts due within the next tick go
                // out together at its end (one batch, GSO trains).
                let coalesce = if self.tick > 0 && busy {
                    now + self.tick
                } else {
                    0
                };
                wake = wake.min(next_start.max(coalesce));
            }
            if let Some(deadline) = self.gen.next_deadline() {
                wake = wake.min(deadline);
            }
            let budget = if self.tick > 0 && busy {
                // Coalesced wakeups: sleep one tick (or less, to the next
                // event), then take everything that arrived meanwhile.
                let nap = wake.saturating_sub(now).min(self.tick);
                if nap > 0 {
                    std::thread::sleep(Duration::from_nanos(nap));
                }
                self.io.recv_batch(&mut self.rx, Some(Duration::ZERO))?
            } else {
                let timeout = Duration::from_nanos(wake.saturating_sub(now));
                self.io.recv_batch(&mut self.rx, Some(timeout))?
            };
            if budget > 0 {
                self.drain_rx(budget, realtime_to_mono)?;
            }
        }
        self.queue.flush(&mut *self.io);
        self.publish();
        let cpu = thread_cpu_time().unwrap_or_default().since(&cpu0);
        let io_stats = self.io.stats();
        Ok(WorkerResult {
            calls: self.gen.into_stats(),
            msgs_sent: self.queue.msgs_sent,
            msgs_to_proxy: self.queue.msgs_to_proxy,
            setup_to_proxy: self.queue.setup_to_proxy,
            scheduled: scheduled.max(started),
            start_lag_sum_ns: lag_sum_ns,
            msgs_received: self.msgs_received,
            send_errors: io_stats.tx_errors,
            rx_dropped: io_stats.rx_dropped,
            cpu,
            gso_used: self.queue.gso(),
            gso: self.io.gso_stats(),
            last_start,
            finished: Instant::now(),
        })
    }

    /// Add what changed in the generator's counts since the last call to
    /// the shared live counters (read by the progress line).
    fn publish(&mut self) {
        let stats: &CallStats = self.gen.stats();
        let (published, live) = (&mut self.published, &self.live);
        add_new(&live.attempted, &mut published.attempted, stats.attempted);
        add_new(&live.succeeded, &mut published.succeeded, stats.succeeded);
        add_new(&live.failed, &mut published.failed, stats.failed_total());
        add_new(&live.throttled, &mut published.throttled, stats.throttled);
        add_new(
            &live.retransmissions,
            &mut published.retransmissions,
            stats.retransmissions(),
        );
    }

    /// Handle a received batch of `n`, then keep receiving without waiting
    /// while full batches come in (bounded passes). Replies are queued (a
    /// full queue is sent on the way) and sent by the caller's next flush.
    fn drain_rx(&mut self, mut n: usize, realtime_to_mono: u64) -> anyhow::Result<()> {
        for pass in 1..=DRAIN_PASSES {
            let now = now_ns();
            self.msgs_received += n as u64;
            let (gen, queue, io) = (&mut self.gen, &mut self.queue, &mut *self.io);
            for d in self.rx.iter() {
                let rx_realtime = d.meta.kernel_rx.unwrap_or(d.meta.app_rx).0;
                let received = rx_realtime.wrapping_add(realtime_to_mono).min(now);
                gen.handle(
                    now,
                    received,
                    d.meta.peer,
                    d.data,
                    &mut |dst, kind, bytes| queue.push(io, dst, kind, bytes),
                );
            }
            // No flush here: what the handlers queued goes out with the call
            // starts and timer messages of the next loop pass (it follows at
            // once), in one send call.
            // The last pass receives nothing more: a batch received then
            // would be cleared, unhandled, by the next receive.
            if self.rx.free_frames() > 0 || pass == DRAIN_PASSES {
                break;
            }
            n = self.io.recv_batch(&mut self.rx, Some(Duration::ZERO))?;
            if n == 0 {
                break;
            }
        }
        Ok(())
    }
}
