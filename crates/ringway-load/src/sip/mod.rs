//! SIP call load generator (UAC and UAS in one process).
//!
//! Each worker thread owns one UDP socket (through a `ringway_io` batch
//! backend) that plays both roles: as UAC it starts calls at its share of
//! the target rate (Poisson or constant spacing, seeded), sending INVITE to
//! the proxy with the Request-URI naming the UAS; as UAS it answers INVITE
//! with 180 and 200 (Record-Route copied), retransmits the 200 until ACK,
//! and answers BYE with 200. The UAC follows the route set of the 200
//! (RFC 3261 12.1.2, loose or strict routing) for ACK and BYE, and
//! retransmits INVITE (Timer A/B) and BYE (Timer E/F).
//!
//! That logic is [`CallGen`] ([`callgen`]): no socket, no clock. A worker
//! thread drives one with its socket (GSO trains out, GRO trains in) and
//! the clock, on the arrival schedule.
//!
//! Starting stops at whichever of the call count and the duration comes
//! first; calls in flight are then given at most hold + 64·T1 to finish.

pub mod arrival;
pub mod callgen;
pub mod idle;
mod sendqueue;
mod template;
mod timers;
pub mod view;
mod worker;

pub use arrival::{ArrivalKind, Arrivals};
pub use callgen::{CallGen, CallGenConfig, CallStats, MessageKind, Sink};

use ringway_io::thread::CpuTime;
use ringway_io::BackendKind;
use ringway_server::metrics::LatencySummary;
use serde::Serialize;
use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Upper bound on `calls` (keeps memory and run time bounded).
pub const MAX_CALLS: u64 = 50_000_000;
/// Upper bound on the duration.
pub const MAX_DURATION: Duration = Duration::from_secs(24 * 3600);
/// Upper bound on threads.
pub const MAX_THREADS: usize = 256;

/// What the generator does.
#[derive(Clone, Debug)]
pub struct LoadConfig {
    /// Where requests outside a dialog go (the proxy); `None`: straight to the UAS.
    pub proxy: Option<SocketAddr>,
    /// External UAS named in the Request-URI; `None`: each worker's own socket is the UAS.
    pub uas: Option<SocketAddr>,
    /// Local address of the workers' sockets.
    pub bind_ip: IpAddr,
    /// First local port (worker i binds `base_port + i`); 0: ephemeral ports.
    pub base_port: u16,
    /// Target call rate (calls per second, all threads together).
    pub rate: f64,
    /// Spacing of call starts.
    pub arrival: ArrivalKind,
    /// RNG seed (worker i uses `seed + i`).
    pub seed: u64,
    /// Maximum number of calls to start.
    pub calls: u64,
    /// Maximum time during which calls are started.
    pub duration: Duration,
    /// Worker threads.
    pub threads: usize,
    /// I/O backend of the sockets.
    pub backend: BackendKind,
    /// RFC 3261 T1 (retransmission base, default 500 ms).
    pub t1: Duration,
    /// RFC 3261 T2 (retransmission cap, default 4 s).
    pub t2: Duration,
    /// Time between the ACK and the BYE.
    pub hold: Duration,
    /// Requested socket receive buffer.
    pub rcvbuf: Option<usize>,
    /// Wakeup coalescing while calls are in flight: sleep this long, then
    /// take everything that arrived (zero: wake for every datagram and call
    /// start). Response times use kernel RX stamps, so they stay exact;
    /// call starts due within a tick go out together. `None` (auto): see
    /// [`LoadConfig::effective_tick`].
    pub tick: Option<Duration>,
    /// UDP GSO: send runs of equal-length messages to one destination as
    /// one datagram train (the receiver still sees separate datagrams).
    pub gso: GsoMode,
    /// UDP GRO: let the kernel hand a received datagram train (a GSO train
    /// on loopback, GRO-merged datagrams elsewhere) over as one message,
    /// split into its datagrams by the backend.
    pub gro: GsoMode,
    /// RFC 7339 overload control (loss-based, default on): `;oc` in the
    /// Via, and the share of new calls the proxy advertises is refused
    /// locally for the advertised validity (counted as `throttled`, never
    /// sent); off models a sender that does not support it.
    pub overload_control: bool,
}

/// Whether the workers' sockets coalesce sends with UDP GSO (or receives
/// with UDP GRO).
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum GsoMode {
    /// Use it where the backend and kernel support it (mmsg backend).
    #[default]
    Auto,
    /// Require it: starting fails where it is not available.
    On,
    /// Never coalesce (one datagram per message, the original path).
    Off,
}

impl std::str::FromStr for GsoMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(GsoMode::Auto),
            "on" => Ok(GsoMode::On),
            "off" => Ok(GsoMode::Off),
            _ => Err(format!("unknown GSO mode {s:?} (auto, on, off)")),
        }
    }
}

impl GsoMode {
    /// Name used on the command line and in summaries.
    pub fn name(self) -> &'static str {
        match self {
            GsoMode::Auto => "auto",
            GsoMode::On => "on",
            GsoMode::Off => "off",
        }
    }
}

/// What UDP GSO did during a run.
#[derive(Clone, Debug, Default, Serialize, serde::Deserialize, PartialEq)]
pub struct GsoSummary {
    /// Mode asked for (auto, on, off).
    pub mode: String,
    /// Coalescing was on in every worker at the start.
    pub used: bool,
    /// Datagram trains sent (one sendmmsg entry with UDP_SEGMENT, >= 2 datagrams each).
    pub trains: u64,
    /// Datagrams sent inside trains (the rest of `msgs_sent` went one by one).
    pub segments: u64,
    /// Trains the kernel refused (sent one by one instead; coalescing then off).
    pub fallbacks: u64,
    /// GRO mode asked for (auto, on, off).
    #[serde(default)]
    pub gro_mode: String,
    /// Receive coalescing (UDP_GRO) was on in every worker.
    #[serde(default)]
    pub gro_used: bool,
    /// Received messages that held a train of two or more datagrams.
    #[serde(default)]
    pub gro_trains: u64,
    /// Datagrams received inside those trains.
    #[serde(default)]
    pub gro_segments: u64,
}

impl Default for LoadConfig {
    fn default() -> Self {
        LoadConfig {
            proxy: None,
            uas: None,
            bind_ip: IpAddr::V4(Ipv4Addr::LOCALHOST),
            base_port: 0,
            rate: 100.0,
            arrival: ArrivalKind::Poisson,
            seed: 1,
            calls: 1000,
            duration: Duration::from_secs(10),
            threads: 1,
            backend: BackendKind::Mmsg,
            t1: Duration::from_millis(500),
            t2: Duration::from_secs(4),
            hold: Duration::ZERO,
            rcvbuf: Some(4 << 20),
            tick: None,
            gso: GsoMode::Auto,
            gro: GsoMode::Auto,
            overload_control: true,
        }
    }
}

/// Call starts per wakeup the automatic tick aims at.
pub const AUTO_TICK_CALLS: f64 = 8.0;
/// Bounds of the automatic tick: 1 ms, and 10 ms (SIPp's default timer resolution).
pub const AUTO_TICK_RANGE: (Duration, Duration) =
    (Duration::from_millis(1), Duration::from_millis(10));

impl LoadConfig {
    /// The tick in use: the one set, or (auto) the time in which
    /// [`AUTO_TICK_CALLS`] calls start in one thread at the target rate,
    /// kept within [`AUTO_TICK_RANGE`]. A timer wakeup costs tens of µs of
    /// CPU on a VM, so at low rates per-call cost would be mostly wakeups;
    /// at 8000 calls/s per thread and above the tick is 1 ms. With the
    /// built-in UAS, response times include its answer delay of up to one
    /// tick (an external UAS, `uas`, keeps them exact).
    pub fn effective_tick(&self) -> Duration {
        if let Some(tick) = self.tick {
            return tick;
        }
        let per_thread = self.rate / self.threads.max(1) as f64;
        let (low, high) = AUTO_TICK_RANGE;
        if !(per_thread.is_finite() && per_thread > 0.0) {
            return high;
        }
        let secs = (AUTO_TICK_CALLS / per_thread).min(high.as_secs_f64());
        Duration::from_secs_f64(secs).clamp(low, high)
    }

    /// Check the parameters; the message says what is wrong.
    pub fn validate(&self) -> Result<(), String> {
        if !(self.rate.is_finite() && self.rate > 0.0) {
            return Err(format!("rate must be > 0 calls/s (got {})", self.rate));
        }
        if self.rate > 1e6 {
            return Err(format!("rate {} calls/s is above the 1e6 limit", self.rate));
        }
        if self.calls == 0 || self.calls > MAX_CALLS {
            return Err(format!(
                "calls must be in 1..={MAX_CALLS} (got {})",
                self.calls
            ));
        }
        if self.duration.is_zero() || self.duration > MAX_DURATION {
            return Err(format!(
                "duration must be in (0, {} s] (got {:?})",
                MAX_DURATION.as_secs(),
                self.duration
            ));
        }
        if self.threads == 0 || self.threads > MAX_THREADS {
            return Err(format!(
                "threads must be in 1..={MAX_THREADS} (got {})",
                self.threads
            ));
        }
        if self.t1.is_zero() || self.t2 < self.t1 {
            return Err("need 0 < T1 <= T2".into());
        }
        if self.tick.is_some_and(|t| t > Duration::from_millis(100)) {
            return Err("tick must be at most 100 ms".into());
        }
        if self.hold > Duration::from_secs(3600) {
            return Err("hold must be at most 1 h".into());
        }
        if self.base_port != 0 && self.base_port as usize + self.threads > 65536 {
            return Err("base port + threads exceeds 65535".into());
        }
        if self.rate * self.duration.as_secs_f64() < 1.0 {
            return Err(format!(
                "rate {} calls/s for {:?} starts no call",
                self.rate, self.duration
            ));
        }
        Ok(())
    }
}

/// Live counters shared with the progress printer.
#[derive(Debug, Default)]
pub struct Live {
    /// Calls started.
    pub attempted: AtomicU64,
    /// Calls completed successfully.
    pub succeeded: AtomicU64,
    /// Calls failed (error response or timeout).
    pub failed: AtomicU64,
    /// Calls refused locally by overload control (RFC 7339).
    pub throttled: AtomicU64,
    /// Retransmissions sent.
    pub retransmissions: AtomicU64,
    /// Set to stop starting calls early (in-flight calls still finish);
    /// shared so that a signal handler can set it
    /// (`ringway_server::host::stop_flag`).
    pub stop: Arc<AtomicBool>,
    /// Set to end at once (in-flight calls count as failed, `aborted`).
    pub abort: AtomicBool,
}

/// Final result of a load run.
#[derive(Clone, Debug, Default, Serialize, serde::Deserialize, PartialEq)]
pub struct LoadSummary {
    /// Target rate (calls/s).
    pub target_cps: f64,
    /// Calls started.
    pub attempted: u64,
    /// Calls that completed INVITE/200/ACK/BYE/200.
    pub succeeded: u64,
    /// Failed calls by reason (`"486"`, `"timeout_invite"`, `"bye_481"`, `"unfinished"`, ...).
    pub failed: BTreeMap<String, u64>,
    /// Total failed calls.
    pub failed_total: u64,
    /// Calls refused locally by RFC 7339 overload control, as the proxy
    /// advertised (in `attempted`; neither succeeded nor failed; never sent).
    #[serde(default)]
    pub throttled: u64,
    /// failed_total / attempted.
    pub failed_ratio: f64,
    /// INVITE retransmissions (Timer A).
    pub retrans_invite: u64,
    /// BYE retransmissions (Timer E).
    pub retrans_bye: u64,
    /// 200 OK retransmissions by the UAS (waiting for ACK).
    pub retrans_200: u64,
    /// ACKs re-sent for retransmitted 200s.
    pub retrans_ack: u64,
    /// Calls answered by the built-in UAS.
    pub uas_calls: u64,
    /// UAS calls whose ACK never came.
    pub uas_ack_timeouts: u64,
    /// INVITE → 180 (µs).
    pub invite_to_180: LatencySummary,
    /// INVITE → 200 (µs).
    pub invite_to_200: LatencySummary,
    /// BYE → 200 (µs).
    pub bye_to_200: LatencySummary,
    /// Wall time from the first call start to the last call end (s).
    pub elapsed_s: f64,
    /// Time during which calls were started (s).
    pub start_phase_s: f64,
    /// Calls the arrival schedule had due during the start phase (started
    /// or not): attempted / scheduled < 1 means the generator fell behind.
    #[serde(default)]
    pub scheduled: u64,
    /// Mean delay of a call start behind its scheduled time (µs).
    #[serde(default)]
    pub start_lag_mean_us: f64,
    /// attempted / start_phase_s.
    pub achieved_cps: f64,
    /// Datagrams sent (all).
    pub msgs_sent: u64,
    /// Datagrams sent to the proxy address.
    pub msgs_to_proxy: u64,
    /// Of those, call-setup messages (INVITE, 180, 200 to INVITE, ACK).
    pub setup_to_proxy: u64,
    /// Datagrams received.
    pub msgs_received: u64,
    /// Received datagrams that were not understood (or not ours).
    pub msgs_ignored: u64,
    /// Datagrams the kernel refused to send.
    pub send_errors: u64,
    /// Datagrams dropped by the generator's own sockets (SO_RXQ_OVFL).
    pub rx_dropped: u64,
    /// CPU used by the worker threads (`user_s`, `sys_s`).
    #[serde(with = "ringway_server::host::cpu_seconds")]
    pub cpu: CpuTime,
    /// CPU seconds per attempted call.
    pub cpu_s_per_call: f64,
    /// Backend used.
    pub backend: String,
    /// Worker threads.
    pub threads: usize,
    /// Wakeup coalescing tick used, in µs (0: wake per event).
    #[serde(default)]
    pub tick_us: u64,
    /// UDP GSO use.
    #[serde(default)]
    pub gso: GsoSummary,
}

impl LoadSummary {
    /// Short multi-line human summary.
    pub fn text(&self) -> String {
        let mut out = format!(
            "calls: attempted {} succeeded {} failed {} ({:.3}%)\n",
            self.attempted,
            self.succeeded,
            self.failed_total,
            100.0 * self.failed_ratio
        );
        if self.throttled > 0 {
            out += &format!(
                "throttled (RFC 7339 overload control, never sent): {}\n",
                self.throttled
            );
        }
        if !self.failed.is_empty() {
            let failures: Vec<String> = self
                .failed
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect();
            out += &format!("failed by reason: {}\n", failures.join(" "));
        }
        out += &format!(
            "rate: target {:.1} achieved {:.1} calls/s over {:.2} s (total {:.2} s)\n",
            self.target_cps, self.achieved_cps, self.start_phase_s, self.elapsed_s
        );
        out += &format!(
            "retransmissions: INVITE {} BYE {} 200 {} ACK {}\n",
            self.retrans_invite, self.retrans_bye, self.retrans_200, self.retrans_ack
        );
        for (name, p) in [
            ("INVITE->180", &self.invite_to_180),
            ("INVITE->200", &self.invite_to_200),
            ("BYE->200", &self.bye_to_200),
        ] {
            let to_ms = |us: f64| us / 1000.0;
            out += &format!(
                "{name:12} n={} mean {:.3} p50 {:.3} p90 {:.3} p99 {:.3} max {:.3} ms\n",
                p.count,
                to_ms(p.mean_us),
                to_ms(p.p50_us),
                to_ms(p.p90_us),
                to_ms(p.p99_us),
                to_ms(p.max_us)
            );
        }
        out += &format!(
            "messages: sent {} (to proxy {}) received {} ignored {} send errors {} rx dropped {}\n",
            self.msgs_sent,
            self.msgs_to_proxy,
            self.msgs_received,
            self.msgs_ignored,
            self.send_errors,
            self.rx_dropped
        );
        out += &format!(
            "cpu: user {:.2} s sys {:.2} s = {:.1} µs per call ({} threads, {} backend, tick {} µs)\n",
            self.cpu.user_ns as f64 / 1e9,
            self.cpu.system_ns as f64 / 1e9,
            self.cpu_s_per_call * 1e6,
            self.threads,
            self.backend,
            self.tick_us
        );
        out += &format!(
            "gso: {} ({}): {} trains with {} datagrams, {} fallbacks\n",
            if self.gso.used { "used" } else { "not used" },
            self.gso.mode,
            self.gso.trains,
            self.gso.segments,
            self.gso.fallbacks
        );
        out += &format!(
            "gro: {} ({}): {} trains with {} datagrams received\n",
            if self.gso.gro_used {
                "used"
            } else {
                "not used"
            },
            self.gso.gro_mode,
            self.gso.gro_trains,
            self.gso.gro_segments
        );
        out
    }
}

/// Per-worker result, merged into the summary.
pub(crate) struct WorkerResult {
    pub calls: CallStats,
    pub msgs_sent: u64,
    pub msgs_to_proxy: u64,
    pub setup_to_proxy: u64,
    pub scheduled: u64,
    pub start_lag_sum_ns: u64,
    pub msgs_received: u64,
    pub send_errors: u64,
    pub rx_dropped: u64,
    pub cpu: CpuTime,
    pub gso_used: bool,
    pub gso: ringway_io::GsoStats,
    pub last_start: Instant,
    pub finished: Instant,
}

/// Progress callback: live counters and time since start.
pub type ProgressFn<'a> = &'a mut dyn FnMut(&Live, Duration);

/// Run the generator until it stops by itself; `progress` (if any) is
/// called about once a second from the calling thread.
pub fn run(
    cfg: &LoadConfig,
    live: Arc<Live>,
    progress: Option<ProgressFn<'_>>,
) -> anyhow::Result<LoadSummary> {
    cfg.validate().map_err(anyhow::Error::msg)?;
    let run_id = format!(
        "{:08x}",
        (std::process::id() as u64)
            .wrapping_mul(0x9E37_79B9)
            .wrapping_add(ringway_io::monotonic_now().0 / 1000) as u32
    );
    let mut workers = Vec::with_capacity(cfg.threads);
    for i in 0..cfg.threads {
        workers.push(worker::Worker::new(cfg, i, &run_id, live.clone())?);
    }
    let started = Instant::now();
    let results = run_workers(workers, started, &live, progress);
    let mut sum = LoadSummary {
        target_cps: cfg.rate,
        backend: cfg.backend.name().into(),
        threads: cfg.threads,
        tick_us: cfg.effective_tick().as_micros() as u64,
        gso: GsoSummary {
            mode: cfg.gso.name().into(),
            used: true,
            gro_mode: cfg.gro.name().into(),
            gro_used: true,
            ..Default::default()
        },
        ..Default::default()
    };
    let mut calls = CallStats::default();
    let mut last_start = started;
    let mut finished = started;
    let mut lag_sum_ns = 0u64;
    for result in results {
        let result = result?;
        calls.merge(&result.calls);
        sum.msgs_sent += result.msgs_sent;
        sum.msgs_to_proxy += result.msgs_to_proxy;
        sum.setup_to_proxy += result.setup_to_proxy;
        sum.scheduled += result.scheduled;
        lag_sum_ns += result.start_lag_sum_ns;
        sum.msgs_received += result.msgs_received;
        sum.send_errors += result.send_errors;
        sum.rx_dropped += result.rx_dropped;
        sum.cpu = sum.cpu + result.cpu;
        sum.gso.used &= result.gso_used;
        sum.gso.trains += result.gso.trains;
        sum.gso.segments += result.gso.segments;
        sum.gso.fallbacks += result.gso.fallbacks;
        sum.gso.gro_used &= result.gso.gro_enabled;
        sum.gso.gro_trains += result.gso.gro_trains;
        sum.gso.gro_segments += result.gso.gro_segments;
        last_start = last_start.max(result.last_start);
        finished = finished.max(result.finished);
    }
    set_calls(&mut sum, calls);
    sum.start_lag_mean_us = if sum.attempted > 0 {
        lag_sum_ns as f64 / 1e3 / sum.attempted as f64
    } else {
        0.0
    };
    sum.elapsed_s = (finished - started).as_secs_f64();
    // Starting lasted until the last start, rounded up to the planned span
    // of the calls (so one fast burst does not inflate the rate).
    let planned = (sum.attempted as f64 / cfg.rate).min(cfg.duration.as_secs_f64());
    sum.start_phase_s = (last_start - started).as_secs_f64().max(planned).max(1e-9);
    sum.achieved_cps = sum.attempted as f64 / sum.start_phase_s;
    sum.cpu_s_per_call = if sum.attempted > 0 {
        sum.cpu.total_s() / sum.attempted as f64
    } else {
        0.0
    };
    Ok(sum)
}

/// Run `workers` to their end, each on a thread of its own, calling
/// `progress` about once a second meanwhile; their results in order.
fn run_workers(
    workers: Vec<worker::Worker>,
    started: Instant,
    live: &Live,
    mut progress: Option<ProgressFn<'_>>,
) -> Vec<anyhow::Result<WorkerResult>> {
    std::thread::scope(|s| {
        let handles: Vec<_> = workers
            .into_iter()
            .map(|w| s.spawn(move || w.run(started)))
            .collect();
        let mut last = Instant::now();
        while !handles.iter().all(|h| h.is_finished()) {
            std::thread::sleep(Duration::from_millis(50));
            if last.elapsed() >= Duration::from_secs(1) {
                last = Instant::now();
                if let Some(progress_line) = progress.as_mut() {
                    progress_line(live, started.elapsed());
                }
            }
        }
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(anyhow::anyhow!("worker panicked")))
            })
            .collect()
    })
}

/// The calls' outcomes, retransmissions and latencies into the summary.
fn set_calls(sum: &mut LoadSummary, calls: CallStats) {
    sum.attempted = calls.attempted;
    sum.succeeded = calls.succeeded;
    sum.failed_total = calls.failed_total();
    sum.throttled = calls.throttled;
    sum.failed = calls.failed;
    sum.retrans_invite = calls.retrans_invite;
    sum.retrans_bye = calls.retrans_bye;
    sum.retrans_200 = calls.retrans_200;
    sum.retrans_ack = calls.retrans_ack;
    sum.uas_calls = calls.uas_calls;
    sum.uas_ack_timeouts = calls.uas_ack_timeouts;
    sum.msgs_ignored = calls.msgs_ignored;
    sum.failed_ratio = if sum.attempted > 0 {
        sum.failed_total as f64 / sum.attempted as f64
    } else {
        0.0
    };
    sum.invite_to_180 = LatencySummary::of_us(&calls.invite_to_180);
    sum.invite_to_200 = LatencySummary::of_us(&calls.invite_to_200);
    sum.bye_to_200 = LatencySummary::of_us(&calls.bye_to_200);
}

/// One-line progress text.
pub fn progress_line(live: &Live, elapsed: Duration, target_calls: u64) -> String {
    let attempted = live.attempted.load(Ordering::Relaxed);
    let succeeded = live.succeeded.load(Ordering::Relaxed);
    let failed = live.failed.load(Ordering::Relaxed);
    let throttled = live.throttled.load(Ordering::Relaxed);
    let retransmissions = live.retransmissions.load(Ordering::Relaxed);
    let secs = elapsed.as_secs_f64().max(1e-9);
    format!(
        "{:7.1}s started {attempted}/{target_calls} ({:.0}/s) ok {succeeded} failed {failed} throttled {throttled} in-flight {} retrans {retransmissions}",
        secs,
        attempted as f64 / secs,
        attempted.saturating_sub(succeeded + failed + throttled)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_tick_follows_the_rate_per_thread_within_bounds() {
        let tick = |rate: f64, threads: usize, tick: Option<Duration>| {
            LoadConfig {
                rate,
                threads,
                tick,
                ..LoadConfig::default()
            }
            .effective_tick()
        };
        let ms = Duration::from_millis;
        assert_eq!(tick(4000.0, 1, None), ms(2));
        assert_eq!(tick(8000.0, 2, None), ms(2));
        assert_eq!(tick(2000.0, 1, None), ms(4));
        assert_eq!(tick(100_000.0, 1, None), ms(1));
        assert_eq!(tick(10.0, 1, None), ms(10));
        assert_eq!(tick(1e-300, 1, None), ms(10));
        assert_eq!(tick(4000.0, 1, Some(Duration::ZERO)), Duration::ZERO);
        assert_eq!(tick(4000.0, 1, Some(ms(1))), ms(1));
    }
}
