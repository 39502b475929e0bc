//! Worker, timer and metrics threads of `ringway sip proxy`, and the summary.

use super::metrics::{Lat, PromText, TypeSummary, WorkerMetrics};
use super::{http, ModeArg, ProxyArgs, RxModel};
use ringway_io::counters::{self, UdpSnmp};
use ringway_io::thread::{self as rthread, CpuTime};
use ringway_io::{
    monotonic_now, open_backend, open_udp, BatchIo, RxBatch, SocketConfig, TxBatch, TxStamp,
};
use ringway_sip::proxy::{Action, Mode, Proxy, ProxyConfig};
use serde::Serialize;
use std::collections::BTreeMap;
use std::net::{SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Bytes per receive frame: larger datagrams are cut and counted as dropped.
const RX_FRAME: usize = 16 * 1024;
/// Bytes per send frame (a forwarded message grows by Via/Record-Route).
const TX_FRAME: usize = RX_FRAME + 2048;
/// Receive wait before re-checking the stop flag.
const POLL: Duration = Duration::from_millis(50);
/// Longest sleep of the timer thread (new transactions may bring earlier deadlines).
const TIMER_TICK_MAX: Duration = Duration::from_millis(5);
/// Bits of a TX stamp tag that carry the sequence number; the type index is above.
const TAG_SHIFT: u32 = 40;

/// CPU time one thread used, taken when it ends.
#[derive(Debug, Clone, Serialize)]
pub struct ThreadCpu {
    /// Thread name.
    pub name: String,
    /// Kernel thread id.
    pub tid: i32,
    /// User seconds.
    pub user_s: f64,
    /// System seconds.
    pub sys_s: f64,
}

/// Everything the threads share.
struct State {
    args: ProxyArgs,
    local: SocketAddr,
    proxy: Proxy,
    stop: AtomicBool,
    workers: Vec<Arc<Mutex<WorkerMetrics>>>,
    timer: Arc<Mutex<WorkerMetrics>>,
    thread_cpu: Mutex<Vec<ThreadCpu>>,
    snmp_start: Option<UdpSnmp>,
    cpu_start: CpuTime,
    started: Instant,
    rcvbuf_granted: Vec<usize>,
    placement: Mutex<Vec<String>>,
}

/// Open the sockets of the chosen receive model; returns one socket per worker
/// plus one for the timer thread, and the granted receive buffer sizes.
fn open_sockets(a: &ProxyArgs) -> anyhow::Result<(Vec<UdpSocket>, UdpSocket, Vec<usize>)> {
    let mut cfg = SocketConfig::new(a.listen);
    cfg.rcvbuf = a.rcvbuf;
    cfg.tx_timestamps = a.tx_stamp_every > 0;
    cfg.rx_timestamps = true;
    cfg.rxq_ovfl = true;
    let mut socks = Vec::with_capacity(a.workers);
    let mut granted = Vec::new();
    match a.rx_model {
        RxModel::Shared => {
            let (s, rep) = open_udp(&cfg)
                .map_err(|e| anyhow::anyhow!("cannot open UDP socket on {}: {e}", a.listen))?;
            for w in &rep.warnings {
                eprintln!("sip proxy: socket: {w}");
            }
            granted.push(rep.rcvbuf_granted);
            for _ in 1..a.workers {
                socks.push(s.try_clone()?);
            }
            socks.insert(0, s);
        }
        RxModel::Reuseport => {
            cfg.reuseport = true;
            for i in 0..a.workers {
                let (s, rep) = open_udp(&cfg).map_err(|e| {
                    anyhow::anyhow!("cannot open SO_REUSEPORT socket {i} on {}: {e}", cfg.bind)
                })?;
                if i == 0 {
                    for w in &rep.warnings {
                        eprintln!("sip proxy: socket: {w}");
                    }
                    // With port 0 the first bind picks the port the others share.
                    cfg.bind = s.local_addr()?;
                }
                granted.push(rep.rcvbuf_granted);
                socks.push(s);
            }
        }
    }
    let timer = socks[0].try_clone()?;
    Ok((socks, timer, granted))
}

/// Run the proxy until stopped, then print/write the summary.
pub fn run(a: ProxyArgs) -> anyhow::Result<()> {
    let (socks, timer_sock, granted) = open_sockets(&a)?;
    let local = socks[0].local_addr()?;
    let cfg = ProxyConfig {
        mode: match a.mode {
            ModeArg::Stateless => Mode::Stateless,
            ModeArg::Stateful => Mode::Stateful,
        },
        local,
        route_to: a.route_to,
        registrar: a.registrar,
        record_route: !a.no_record_route,
        max_transactions: a.max_transactions,
        domains: a.domains.clone(),
    };
    let proxy = Proxy::new(cfg);
    let state = Arc::new(State {
        workers: (0..a.workers).map(|_| Default::default()).collect(),
        timer: Default::default(),
        args: a.clone(),
        local,
        proxy,
        stop: AtomicBool::new(false),
        thread_cpu: Mutex::new(Vec::new()),
        snmp_start: udp_totals(),
        cpu_start: rthread::process_cpu_time().unwrap_or_default(),
        started: Instant::now(),
        rcvbuf_granted: granted,
        placement: Mutex::new(Vec::new()),
    });

    // SIGINT/SIGTERM set a flag the main thread polls.
    let sig = Arc::new(AtomicBool::new(false));
    for s in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(s, sig.clone())?;
    }

    let mut handles = Vec::new();
    for (i, s) in socks.into_iter().enumerate() {
        let io = open_backend(a.backend, s)?;
        let st = state.clone();
        handles.push(
            std::thread::Builder::new()
                .name(format!("sip-w{i}"))
                .spawn(move || worker(st, i, io))?,
        );
    }
    {
        let io = open_backend(a.backend, timer_sock)?;
        let st = state.clone();
        handles.push(
            std::thread::Builder::new()
                .name("sip-timer".into())
                .spawn(move || timer(st, io))?,
        );
    }
    let metrics_thread = match a.metrics {
        Some(addr) => {
            let l = std::net::TcpListener::bind(addr)
                .map_err(|e| anyhow::anyhow!("cannot bind metrics on {addr}: {e}"))?;
            eprintln!("sip proxy: metrics on http://{}/metrics", l.local_addr()?);
            let st = state.clone();
            let stop = Arc::new(AtomicBool::new(false));
            let h = http::serve(l, stop.clone(), move || render_prometheus(&st))?;
            Some((stop, h))
        }
        None => None,
    };

    eprintln!(
        "sip proxy: listening on udp {local} mode={:?} workers={} rx-model={:?} backend={} rcvbuf={:?}",
        a.mode, a.workers, a.rx_model, a.backend, state.rcvbuf_granted
    );

    let deadline = a
        .duration
        .map(|d| Instant::now() + Duration::from_secs_f64(d));
    while !sig.load(Ordering::Relaxed) && deadline.is_none_or(|d| Instant::now() < d) {
        std::thread::sleep(Duration::from_millis(20));
    }
    state.stop.store(true, Ordering::Relaxed);
    for h in handles {
        if h.join().is_err() {
            eprintln!("sip proxy: a worker thread panicked");
        }
    }
    if let Some((stop, h)) = metrics_thread {
        stop.store(true, Ordering::Relaxed);
        let _ = h.join();
    }
    let summary = build_summary(&state);
    let text = serde_json::to_string_pretty(&summary)?;
    if let Some(p) = &a.summary {
        std::fs::write(p, &text)
            .map_err(|e| anyhow::anyhow!("cannot write summary {}: {e}", p.display()))?;
    }
    if !a.quiet {
        println!("{text}");
    }
    Ok(())
}

/// Record the calling thread's CPU time in the state when it ends.
fn record_thread_cpu(st: &State, name: String) {
    if let Ok(c) = rthread::thread_cpu_time() {
        st.thread_cpu.lock().unwrap().push(ThreadCpu {
            name,
            tid: rthread::current_tid(),
            user_s: c.user_ns as f64 / 1e9,
            sys_s: c.system_ns as f64 / 1e9,
        });
    }
}

/// Apply the requested placement to the calling thread; report each result.
fn place(st: &State, name: &str, i: usize) {
    for item in st.args.placement(i).apply() {
        let line = format!(
            "{name}: {} {} -> {}",
            item.what, item.requested, item.result
        );
        eprintln!("sip proxy: placement {line}");
        st.placement.lock().unwrap().push(line);
    }
}

/// One worker: receive a batch, run each datagram through the core, send once.
fn worker(st: Arc<State>, idx: usize, mut io: Box<dyn BatchIo>) {
    place(&st, &format!("sip-w{idx}"), idx);
    let a = &st.args;
    let mut rx = RxBatch::new(a.batch, RX_FRAME);
    let mut tx = TxBatch::new(a.batch * 4, TX_FRAME);
    let mut stamps: Vec<TxStamp> = Vec::with_capacity(64);
    let metrics = st.workers[idx].clone();
    let mut sent_seq: u64 = 0;
    let mut stamps_seen: u64 = 0;
    while !st.stop.load(Ordering::Relaxed) {
        let n = match io.recv_batch(&mut rx, Some(POLL)) {
            Ok(n) => n,
            Err(e) => {
                metrics.lock().unwrap().rx_errors += 1;
                eprintln!("sip proxy: worker {idx}: receive error: {e}");
                std::thread::sleep(Duration::from_millis(10));
                continue;
            }
        };
        if n == 0 {
            continue;
        }
        let mut m = metrics.lock().unwrap();
        tx.clear();
        for d in rx.iter() {
            m.msgs_in += 1;
            if d.meta.truncated {
                m.rx_truncated += 1;
                continue;
            }
            let before = tx.len();
            let mut oversize = 0u64;
            let mut flushed = 0usize;
            let t0 = monotonic_now();
            let outcome = st
                .proxy
                .handle(t0.0, d.meta.peer, d.data, &mut |dst, bytes| {
                    if tx.is_full() {
                        // More output than the batch holds: flush early (rare).
                        if io.send_batch(&tx).is_ok() {
                            flushed += tx.len();
                        }
                        tx.clear();
                    }
                    if tx.push(dst, bytes).is_err() {
                        oversize += 1;
                    }
                });
            let t1 = monotonic_now();
            m.tx_oversize += oversize;
            let ti = m.type_index(outcome.label.as_str());
            let ts = &mut m.types[ti].1;
            ts.count += 1;
            ts.record(Lat::TSip, t1.saturating_since(t0));
            match d.meta.kernel_rx {
                Some(k) => ts.record(Lat::KRcv, d.meta.app_rx.saturating_since(k)),
                None => m.k_rcv_missing += 1,
            }
            let ts = &mut m.types[ti].1;
            match &outcome.action {
                Action::Forwarded { copies } => {
                    ts.forwarded += 1;
                    ts.copies += *copies as u64;
                }
                Action::Responded(code) => *ts.responded.entry(*code).or_default() += 1,
                Action::Absorbed => ts.absorbed += 1,
                Action::Dropped(reason) => match ts.dropped.get_mut(reason.as_str()) {
                    Some(c) => *c += 1,
                    None => {
                        ts.dropped.insert(reason.as_str().to_string(), 1);
                    }
                },
            }
            // Sample K_snd: every Nth datagram this worker sends gets a TX stamp.
            let start = if flushed > 0 { 0 } else { before };
            if a.tx_stamp_every > 0 {
                for i in start..tx.len() {
                    sent_seq += 1;
                    if sent_seq.is_multiple_of(a.tx_stamp_every) {
                        tx.request_stamp(
                            i,
                            ((ti as u64) << TAG_SHIFT) | (sent_seq & ((1 << TAG_SHIFT) - 1)),
                        );
                        m.k_snd_requested += 1;
                    }
                }
            }
        }
        if !tx.is_empty() {
            if let Err(e) = io.send_batch(&tx) {
                m.tx_errors += tx.len() as u64;
                eprintln!("sip proxy: worker {idx}: send error: {e}");
            }
            tx.clear();
        }
        // Collect TX stamps only while some are outstanding (each poll is a syscall).
        if m.k_snd_requested > stamps_seen + io.stats().tx_stamps_lost {
            stamps.clear();
            if io.poll_tx_stamps(&mut stamps).is_ok() {
                stamps_seen += stamps.len() as u64;
                for s in &stamps {
                    let ti = (s.tag >> TAG_SHIFT) as usize;
                    if let Some((_, ts)) = m.types.get_mut(ti) {
                        ts.record(Lat::KSnd, s.kernel_tx.saturating_since(s.app_tx));
                    }
                }
            }
        }
        let ios = io.stats();
        m.msgs_out = ios.tx_packets;
        m.tx_errors = m.tx_errors.max(ios.tx_errors);
        m.socket_rx_dropped = ios.rx_dropped;
    }
    record_thread_cpu(&st, format!("sip-w{idx}"));
}

/// The timer thread: run the core's timers at their deadlines and send what they produce.
fn timer(st: Arc<State>, mut io: Box<dyn BatchIo>) {
    let mut tx = TxBatch::new(256, TX_FRAME);
    while !st.stop.load(Ordering::Relaxed) {
        let now = monotonic_now().0;
        let wait = match st.proxy.next_deadline() {
            Some(d) if d <= now => Duration::ZERO,
            Some(d) => Duration::from_nanos(d - now).min(TIMER_TICK_MAX),
            None => TIMER_TICK_MAX,
        };
        if !wait.is_zero() {
            std::thread::sleep(wait);
            continue;
        }
        tx.clear();
        let mut oversize = 0u64;
        let mut sent = 0u64;
        st.proxy.on_timer(monotonic_now().0, &mut |dst, bytes| {
            if tx.is_full() {
                if let Ok(n) = io.send_batch(&tx) {
                    sent += n as u64;
                }
                tx.clear();
            }
            if tx.push(dst, bytes).is_err() {
                oversize += 1;
            }
        });
        if !tx.is_empty() {
            if let Ok(n) = io.send_batch(&tx) {
                sent += n as u64;
            }
        }
        let mut m = st.timer.lock().unwrap();
        m.timer_out += sent;
        m.tx_oversize += oversize;
        let ios = io.stats();
        m.msgs_out = ios.tx_packets;
        m.tx_errors = ios.tx_errors;
    }
    record_thread_cpu(&st, "sip-timer".into());
}

/// All workers' and the timer's metrics merged, plus socket drops counted
/// once per socket (shared model: one socket seen by every worker).
fn merged(st: &State) -> (WorkerMetrics, u64) {
    let mut all = WorkerMetrics::default();
    let mut sock_drops = 0u64;
    for w in &st.workers {
        let w = w.lock().unwrap();
        all.merge(&w);
        sock_drops = match st.args.rx_model {
            RxModel::Shared => sock_drops.max(w.socket_rx_dropped),
            RxModel::Reuseport => sock_drops + w.socket_rx_dropped,
        };
    }
    all.merge(&st.timer.lock().unwrap());
    all.socket_rx_dropped = sock_drops;
    (all, sock_drops)
}

/// IPv4 + IPv6 UDP totals of this network namespace (/proc/net/snmp, snmp6).
fn udp_totals() -> Option<UdpSnmp> {
    let v4 = counters::udp_snmp().ok()?;
    let v6 = counters::udp6_snmp().unwrap_or_default();
    Some(UdpSnmp {
        in_datagrams: v4.in_datagrams + v6.in_datagrams,
        no_ports: v4.no_ports + v6.no_ports,
        in_errors: v4.in_errors + v6.in_errors,
        out_datagrams: v4.out_datagrams + v6.out_datagrams,
        rcvbuf_errors: v4.rcvbuf_errors + v6.rcvbuf_errors,
        sndbuf_errors: v4.sndbuf_errors + v6.sndbuf_errors,
        in_csum_errors: v4.in_csum_errors + v6.in_csum_errors,
    })
}

/// UDP counters (v4+v6) minus their values at start.
fn snmp_delta(st: &State) -> UdpSnmp {
    match (&st.snmp_start, udp_totals()) {
        (Some(start), Some(now)) => now.since(start),
        _ => UdpSnmp::default(),
    }
}

/// Message counters of the summary.
#[derive(Debug, Serialize)]
pub struct Messages {
    /// Datagrams received by the workers.
    #[serde(rename = "in")]
    pub in_: u64,
    /// Datagrams sent (workers and timer).
    pub out: u64,
    /// Datagrams sent by timer processing (retransmissions, timeouts).
    pub timer_out: u64,
    /// Datagrams larger than a receive frame (dropped).
    pub rx_truncated: u64,
    /// Receive syscall errors.
    pub rx_errors: u64,
    /// Datagrams the kernel refused to send.
    pub tx_errors: u64,
    /// Core output larger than a send frame (dropped).
    pub tx_oversize: u64,
    /// Received datagrams without a kernel RX stamp.
    pub k_rcv_missing: u64,
    /// Kernel TX stamps requested.
    pub k_snd_requested: u64,
}

/// Drop counters of the summary.
#[derive(Debug, Serialize)]
pub struct Drops {
    /// SO_RXQ_OVFL: datagrams the proxy's socket(s) dropped for lack of buffer.
    pub socket_rxq_ovfl: u64,
    /// /proc/net/snmp Udp RcvbufErrors delta since start (whole namespace).
    pub udp_rcvbuf_errors: u64,
    /// /proc/net/snmp Udp InErrors delta since start (whole namespace).
    pub udp_in_errors: u64,
    /// Messages dropped by the proxy core (all reasons).
    pub core_dropped: u64,
    /// Packet drop rate: udp_rcvbuf_errors / (messages.in + udp_rcvbuf_errors).
    pub pdr: f64,
}

/// Proxy actions, over all types.
#[derive(Debug, Serialize)]
pub struct Actions {
    /// Messages forwarded.
    pub forwarded: u64,
    /// Copies sent by forwarding.
    pub copies: u64,
    /// Responses generated by the proxy, by status code.
    pub responded: BTreeMap<u16, u64>,
    /// Messages absorbed.
    pub absorbed: u64,
    /// Messages dropped by the core, by reason.
    pub dropped: BTreeMap<String, u64>,
}

/// User and system CPU seconds.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct CpuSecs {
    /// User-mode seconds.
    pub user_s: f64,
    /// Kernel-mode seconds.
    pub sys_s: f64,
}

impl CpuSecs {
    fn of(c: CpuTime) -> Self {
        CpuSecs {
            user_s: c.user_ns as f64 / 1e9,
            sys_s: c.system_ns as f64 / 1e9,
        }
    }
}

/// CPU use of the proxy.
#[derive(Debug, Serialize)]
pub struct Cpu {
    /// Whole process since start.
    pub process: CpuSecs,
    /// Worker and timer threads (at their end).
    pub threads: Vec<ThreadCpu>,
    /// Process CPU (user+sys) µs per received message.
    pub us_per_message: f64,
}

/// Configuration echoed in the summary.
#[derive(Debug, Serialize)]
pub struct ConfigView {
    /// Bound address.
    pub listen: SocketAddr,
    /// Mode.
    pub mode: ModeArg,
    /// Worker threads.
    pub workers: usize,
    /// Backend name.
    pub backend: String,
    /// Receive model.
    pub rx_model: RxModel,
    /// Next hop.
    pub route_to: Option<SocketAddr>,
    /// Registrar on.
    pub registrar: bool,
    /// Record-Route on.
    pub record_route: bool,
    /// Datagrams per batch.
    pub batch: usize,
    /// Requested receive buffer.
    pub rcvbuf_requested: Option<usize>,
    /// Receive buffer granted per socket.
    pub rcvbuf_granted: Vec<usize>,
    /// TX stamp sampling period.
    pub tx_stamp_every: u64,
    /// Transaction bound.
    pub max_transactions: usize,
    /// Served domains.
    pub domains: Vec<String>,
}

/// The JSON summary (schema documented in docs/sip-proxy.md).
#[derive(Debug, Serialize)]
pub struct Summary {
    /// Schema id; bumped on incompatible changes.
    pub schema: &'static str,
    /// Configuration.
    pub config: ConfigView,
    /// Seconds the proxy ran.
    pub duration_s: f64,
    /// Message counters.
    pub messages: Messages,
    /// Actions over all types.
    pub actions: Actions,
    /// Drop counters and PDR.
    pub drops: Drops,
    /// UDP counters of /proc/net/snmp + snmp6 (this namespace), delta since start.
    pub udp_snmp_delta: UdpSnmp,
    /// Per message type (label from the core).
    pub by_type: BTreeMap<String, TypeSummary>,
    /// All types together.
    pub all: TypeSummary,
    /// The core's own statistics (`Proxy::stats()`).
    pub proxy: serde_json::Value,
    /// CPU use.
    pub cpu: Cpu,
    /// Thread placement/priority results, one line each.
    pub placement: Vec<String>,
}

/// Schema id of [`Summary`].
pub const SCHEMA: &str = "ringway.sip-proxy.summary/1";

fn build_summary(st: &State) -> Summary {
    let (m, sock_drops) = merged(st);
    let all = m.all_types();
    let snmp = snmp_delta(st);
    let rcvbuf = snmp.rcvbuf_errors;
    let in_errors = snmp.in_errors;
    let core_dropped: u64 = all.dropped.values().sum();
    let offered = m.msgs_in + rcvbuf;
    let cpu = CpuSecs::of(
        rthread::process_cpu_time()
            .unwrap_or_default()
            .since(&st.cpu_start),
    );
    let a = &st.args;
    Summary {
        schema: SCHEMA,
        config: ConfigView {
            listen: st.local,
            mode: a.mode,
            workers: a.workers,
            backend: a.backend.to_string(),
            rx_model: a.rx_model,
            route_to: a.route_to,
            registrar: a.registrar,
            record_route: !a.no_record_route,
            batch: a.batch,
            rcvbuf_requested: a.rcvbuf,
            rcvbuf_granted: st.rcvbuf_granted.clone(),
            tx_stamp_every: a.tx_stamp_every,
            max_transactions: a.max_transactions,
            domains: a.domains.clone(),
        },
        duration_s: st.started.elapsed().as_secs_f64(),
        messages: Messages {
            in_: m.msgs_in,
            out: m.msgs_out,
            timer_out: m.timer_out,
            rx_truncated: m.rx_truncated,
            rx_errors: m.rx_errors,
            tx_errors: m.tx_errors,
            tx_oversize: m.tx_oversize,
            k_rcv_missing: m.k_rcv_missing,
            k_snd_requested: m.k_snd_requested,
        },
        actions: Actions {
            forwarded: all.forwarded,
            copies: all.copies,
            responded: all.responded.clone(),
            absorbed: all.absorbed,
            dropped: all.dropped.clone(),
        },
        drops: Drops {
            socket_rxq_ovfl: sock_drops,
            udp_rcvbuf_errors: rcvbuf,
            udp_in_errors: in_errors,
            core_dropped,
            pdr: if offered > 0 {
                rcvbuf as f64 / offered as f64
            } else {
                0.0
            },
        },
        udp_snmp_delta: snmp,
        by_type: m
            .types
            .iter()
            .map(|(l, t)| (l.clone(), TypeSummary::of(t)))
            .collect(),
        all: TypeSummary::of(&all),
        proxy: serde_json::to_value(st.proxy.stats()).unwrap_or(serde_json::Value::Null),
        cpu: Cpu {
            process: cpu,
            threads: st.thread_cpu.lock().unwrap().clone(),
            us_per_message: if m.msgs_in > 0 {
                (cpu.user_s + cpu.sys_s) * 1e6 / m.msgs_in as f64
            } else {
                0.0
            },
        },
        placement: st.placement.lock().unwrap().clone(),
    }
}

/// Flatten numeric fields of the core's stats into `prefix_field` gauges.
fn flatten_numbers(prefix: &str, v: &serde_json::Value, out: &mut Vec<(String, f64)>) {
    match v {
        serde_json::Value::Number(n) => {
            if let Some(x) = n.as_f64() {
                out.push((prefix.to_string(), x));
            }
        }
        serde_json::Value::Object(o) => {
            for (k, v) in o {
                let k: String = k
                    .chars()
                    .map(|c| {
                        if c.is_ascii_alphanumeric() {
                            c.to_ascii_lowercase()
                        } else {
                            '_'
                        }
                    })
                    .collect();
                flatten_numbers(&format!("{prefix}_{k}"), v, out);
            }
        }
        _ => {}
    }
}

/// Prometheus text of the current state.
fn render_prometheus(st: &State) -> String {
    let (m, sock_drops) = merged(st);
    let snmp = snmp_delta(st);
    let mut p = PromText::default();
    p.counter(
        "ringway_sip_messages_in_total",
        "Datagrams received.",
        &[],
        m.msgs_in,
    );
    p.counter(
        "ringway_sip_messages_out_total",
        "Datagrams sent.",
        &[],
        m.msgs_out,
    );
    p.counter(
        "ringway_sip_timer_out_total",
        "Datagrams sent by timers.",
        &[],
        m.timer_out,
    );
    p.counter(
        "ringway_sip_tx_errors_total",
        "Datagrams the kernel refused.",
        &[],
        m.tx_errors,
    );
    p.counter(
        "ringway_sip_rx_errors_total",
        "Receive syscall errors.",
        &[],
        m.rx_errors,
    );
    p.counter(
        "ringway_sip_rx_truncated_total",
        "Datagrams larger than a frame (dropped).",
        &[],
        m.rx_truncated,
    );
    p.counter(
        "ringway_sip_socket_drops_total",
        "SO_RXQ_OVFL drops of the proxy sockets.",
        &[],
        sock_drops,
    );
    for (v, name) in [
        (snmp.rcvbuf_errors, "rcvbuf_errors"),
        (snmp.in_errors, "in_errors"),
    ] {
        p.counter(
            &format!("ringway_sip_udp_{name}_total"),
            "/proc/net/snmp Udp counter delta since start.",
            &[],
            v,
        );
    }
    for (label, t) in &m.types {
        let l = [("type", label.as_str())];
        p.counter(
            "ringway_sip_messages_by_type_total",
            "Messages received by type.",
            &l,
            t.count,
        );
        p.counter(
            "ringway_sip_forwarded_total",
            "Messages forwarded by type.",
            &l,
            t.forwarded,
        );
        p.counter(
            "ringway_sip_absorbed_total",
            "Messages absorbed by type.",
            &l,
            t.absorbed,
        );
        for (code, n) in &t.responded {
            let c = code.to_string();
            p.counter(
                "ringway_sip_responded_total",
                "Responses generated by the proxy.",
                &[("type", label), ("code", &c)],
                *n,
            );
        }
        for (reason, n) in &t.dropped {
            p.counter(
                "ringway_sip_core_drops_total",
                "Messages dropped by the core.",
                &[("type", label), ("reason", reason)],
                *n,
            );
        }
    }
    for lat in Lat::ALL {
        let name = format!("ringway_sip_{}_seconds", lat.name());
        let help = match lat {
            Lat::KRcv => "Kernel RX timestamp to application receive.",
            Lat::TSip => "Processing time inside the proxy core.",
            Lat::KSnd => "Application send to kernel TX timestamp (sampled).",
        };
        for (label, t) in &m.types {
            p.histogram(&name, help, &[("type", label)], t.hist(lat));
        }
    }
    let mut nums = Vec::new();
    if let Ok(v) = serde_json::to_value(st.proxy.stats()) {
        flatten_numbers("ringway_sip_proxy", &v, &mut nums);
    }
    for (k, v) in nums {
        p.gauge(&k, "Proxy core statistic.", &[], v);
    }
    let cpu = CpuSecs::of(
        rthread::process_cpu_time()
            .unwrap_or_default()
            .since(&st.cpu_start),
    );
    p.gauge(
        "ringway_sip_cpu_seconds",
        "Process CPU since start.",
        &[("mode", "user")],
        cpu.user_s,
    );
    p.gauge(
        "ringway_sip_cpu_seconds",
        "Process CPU since start.",
        &[("mode", "system")],
        cpu.sys_s,
    );
    p.finish()
}
