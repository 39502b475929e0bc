//! One engine per receive queue: the AF_XDP backend on an interface with
//! K receive queues opens K AF_XDP sockets (one per queue, one XSKMAP), and
//! each gets an engine thread of its own. The core ([`Sfu`]: clients,
//! rooms, subscriptions) belongs to a **control thread**; the engines never
//! touch it and take no lock per packet:
//!
//! * The control thread publishes the routes as an immutable
//!   [`RouteSnapshot`] (per registered publishing source: its address and
//!   its subscribers per media type) whenever they may have changed (an
//!   ACK to anything but a KEEPALIVE, clients timed out, an admin
//!   operation). An engine compares the published version with its own
//!   (one atomic load per receive batch) and takes the lock only to pick up
//!   a newer snapshot.
//! * An engine forwards media from a verified source (RTP whose SSRC is a
//!   source of the snapshot, from that source's address, with a media
//!   payload type) itself, in a fan-out order that rotates per packet
//!   (each list's start moves on by one; no subscriber is always last).
//! * Everything else (control messages, media of unknown or unverified
//!   sources, static-room members, media that raced a route change) is
//!   handed to the control thread on a bounded channel (full: counted,
//!   dropped), which runs it through the core and sends the replies — and
//!   the copies of such media — through the kernel (a handle of the
//!   companion UDP socket bound to the listen address).
//! * Every tick each engine publishes its counters and tells the control
//!   thread which sources it forwarded media for (their idle timers), and
//!   the control thread sums the engines' counters with the core's.
//! * The engines' next hops (the kernel's routes and neighbour entries:
//!   which MAC each copy goes to) are read by the control thread, not by
//!   the engines: it polls the backends' [`NextHopRefresher`] every round
//!   (a full read every second, so a changed neighbour is picked up within
//!   about a second; at once, within a budget, for an address an engine
//!   asked for or a client that just registered, before its ACK leaves),
//!   and each engine takes the newest table at its next receive call.

use super::admin::{self, AdminRequest};
use super::engine::{Engine, Forwarding, Measured};
use super::recorder::RecordTx;
use super::{place_engine, EngineEnd, EngineSettings, LiveStats, Window, TICK_NS};
use crate::host::{self, cpu_seconds, CpuTime};
use crate::ServerError;
use ringway_io::{monotonic_now, realtime_now, BatchIo, IoStats, NextHopRefresher};
use ringway_reorder::{Srpic, SrpicStats};
use ringway_sfu::{Action, MediaType, MsgType, RtpPacket, Sfu, SfuStats};
use serde::Serialize;
use std::collections::{HashMap, HashSet};
use std::net::{SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, RecvTimeoutError, SyncSender};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Datagrams queued from the engines to the control thread at most
/// (at most 8 MiB of 2 KiB frames).
const HANDOFF_QUEUE: usize = 4096;
/// Datagrams the control thread handles before it looks at its timers.
const HANDOFF_ROUND: usize = 256;
/// Longest the control thread waits for a handed-off datagram.
const CONTROL_WAIT: Duration = Duration::from_millis(5);

/// One subscriber list of a snapshot, and where its next fan-out starts.
#[derive(Debug, Default)]
struct Route {
    subscribers: Vec<SocketAddr>,
    /// Moves on by one per packet (shared by the engines: relaxed atomic
    /// adds, no lock; a stream's packets come in on one queue).
    first: AtomicUsize,
}

/// A registered publishing source in a snapshot.
#[derive(Debug)]
struct Source {
    addr: SocketAddr,
    routes: [Route; MediaType::COUNT],
}

/// The routes as the control thread published them: immutable once
/// published (but for the rotating starts).
#[derive(Debug, Default)]
pub(super) struct RouteSnapshot {
    version: u64,
    sources: HashMap<u32, Source>,
    echo: bool,
}

impl RouteSnapshot {
    /// The core's routes now, as version `version`.
    fn of(sfu: &Sfu, version: u64) -> RouteSnapshot {
        let mut sources: HashMap<u32, Source> = HashMap::new();
        for (ssid, media, addr, subscribers) in sfu.routes() {
            let source = sources.entry(ssid).or_insert_with(|| Source {
                addr,
                routes: Default::default(),
            });
            source.routes[media as usize].subscribers = subscribers.to_vec();
        }
        RouteSnapshot {
            version,
            sources,
            echo: sfu.config().echo,
        }
    }
}

/// Where the control thread publishes snapshots.
#[derive(Debug)]
pub(super) struct Published {
    version: AtomicU64,
    current: Mutex<Arc<RouteSnapshot>>,
}

impl Published {
    fn new(first: RouteSnapshot) -> Published {
        Published {
            version: AtomicU64::new(first.version),
            current: Mutex::new(Arc::new(first)),
        }
    }

    fn publish(&self, snapshot: RouteSnapshot) {
        let version = snapshot.version;
        *self.current.lock().unwrap_or_else(PoisonError::into_inner) = Arc::new(snapshot);
        self.version.store(version, Ordering::Release);
    }

    /// Replace `have` with the published snapshot if that is newer (the
    /// lock is taken only then).
    fn refresh(&self, have: &mut Arc<RouteSnapshot>) {
        if self.version.load(Ordering::Acquire) != have.version {
            *have = self
                .current
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .clone();
        }
    }
}

/// A datagram an engine hands to the control thread.
pub(super) struct Handoff {
    peer: SocketAddr,
    data: Vec<u8>,
}

/// One engine's counters (whole run).
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct QueueCounters {
    /// Datagrams the engine received (forwarded or handed on).
    pub datagrams: u64,
    /// Media packets it forwarded itself.
    pub media: u64,
    /// Their copies to subscribers.
    pub copies: u64,
    /// Their echoes.
    pub echoes: u64,
    /// Datagrams handed to the control thread.
    pub to_control: u64,
    /// Datagrams dropped because the control thread's queue was full.
    pub to_control_dropped: u64,
    /// Route snapshots it picked up.
    pub snapshots: u64,
}

/// A receive queue's view of the core: forwards verified media from the
/// latest snapshot, hands everything else to the control thread.
pub(super) struct QueueCore {
    published: Arc<Published>,
    snapshot: Arc<RouteSnapshot>,
    to_control: SyncSender<Handoff>,
    seen_tx: SyncSender<Vec<u32>>,
    /// Sources forwarded since the last report to the control thread.
    seen: HashSet<u32>,
    scratch: Vec<SocketAddr>,
    counters: QueueCounters,
}

impl QueueCore {
    /// Pick up a newer snapshot, if one was published.
    fn refresh(&mut self) {
        let before = self.snapshot.version;
        self.published.refresh(&mut self.snapshot);
        if self.snapshot.version != before {
            self.counters.snapshots += 1;
        }
    }

    /// Tell the control thread which sources sent media (never blocks: a
    /// full queue loses this report, the next tick sends another).
    fn report_seen(&mut self) {
        if !self.seen.is_empty() {
            let ssids: Vec<u32> = self.seen.drain().collect();
            let _ = self.seen_tx.try_send(ssids);
        }
    }

    /// The source and media type of `data` from `peer` if it is media from
    /// a verified source of the snapshot.
    fn verified(&self, peer: SocketAddr, data: &[u8]) -> Option<(u32, MediaType)> {
        let packet = RtpPacket::new_checked(data).ok()?;
        let source = self.snapshot.sources.get(&packet.ssrc())?;
        if source.addr != peer {
            return None;
        }
        let media = MediaType::from_payload_type(packet.payload_type())?;
        Some((packet.ssrc(), media))
    }
}

impl Forwarding for QueueCore {
    fn forward(&mut self, _now: u64, peer: SocketAddr, data: &[u8]) -> Option<Action<'_>> {
        self.counters.datagrams += 1;
        if let Some((ssid, media)) = self.verified(peer, data) {
            let route = &self.snapshot.sources[&ssid].routes[media as usize];
            let count = route.subscribers.len();
            self.scratch.clear();
            if count > 0 {
                let start = route.first.fetch_add(1, Ordering::Relaxed) % count;
                self.scratch.extend_from_slice(&route.subscribers[start..]);
                self.scratch.extend_from_slice(&route.subscribers[..start]);
            }
            let echo = self.snapshot.echo.then_some(peer);
            self.counters.media += 1;
            self.counters.copies += count as u64;
            self.counters.echoes += u64::from(echo.is_some());
            self.seen.insert(ssid);
            return Some(Action::Forward {
                ssid,
                media: Some(media),
                targets: &self.scratch,
                echo,
            });
        }
        let handoff = Handoff {
            peer,
            data: data.to_vec(),
        };
        match self.to_control.try_send(handoff) {
            Ok(()) => self.counters.to_control += 1,
            Err(_) => self.counters.to_control_dropped += 1,
        }
        None
    }

    fn is_verified_media(&self, peer: SocketAddr, data: &[u8]) -> bool {
        self.verified(peer, data).is_some()
    }
}

/// One engine's live counters, published every tick.
#[derive(Clone, Debug, Default, Serialize)]
pub struct EngineLive {
    /// The receive queue it serves.
    pub queue: u32,
    /// Its counters.
    pub counters: QueueCounters,
    /// Its backend's counters.
    pub io: IoStats,
    /// Bytes received and sent by it.
    pub rx_bytes: u64,
    /// See `rx_bytes`.
    pub tx_bytes: u64,
    /// Truncated datagrams it dropped.
    pub truncated: u64,
    /// Its thread's CPU time since start (s); `None`: unknown.
    pub cpu_s: Option<f64>,
}

/// One engine in the final report.
#[derive(Clone, Debug, Serialize)]
pub struct EngineReport {
    /// The receive queue it served.
    pub queue: u32,
    /// The backend and its modes.
    pub io_mode: String,
    /// Its counters (whole run).
    pub counters: QueueCounters,
    /// Its backend's counters over the measured window.
    pub io: IoStats,
    /// Packets it forwarded over the measured window.
    pub forwarded: u64,
    /// Its thread's CPU time over the measured window (null: unknown).
    #[serde(with = "cpu_seconds::option")]
    pub cpu: Option<CpuTime>,
    /// Its sorter's counters, when SRPIC was on.
    pub srpic: Option<SrpicStats>,
}

/// What the control thread did with handed-off datagrams (whole run).
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ControlCounters {
    /// Datagrams it ran through the core.
    pub handled: u64,
    /// Replies (ACK, ERROR, CHALLENGE) it sent.
    pub replies: u64,
    /// Copies of media it forwarded (static room, media that raced a
    /// route change).
    pub copies: u64,
    /// Sends the kernel refused.
    pub send_errors: u64,
    /// Route snapshots it published.
    pub snapshots: u64,
    /// Reads of the kernel's routes and neighbour tables it made for the
    /// engines (0 when the engines read their own).
    pub next_hop_reads: u64,
    /// Next-hop tables it published to the engines (each a changed next
    /// hop or MAC).
    pub next_hop_tables: u64,
}

/// Everything one queue's engine thread owns.
pub(super) struct QueueRun {
    pub(super) io: Box<dyn BatchIo>,
    pub(super) queue: u32,
    pub(super) srpic: Option<Srpic<usize>>,
    pub(super) settings: EngineSettings,
    /// Pin it to this CPU.
    pub(super) cpu: Option<usize>,
    pub(super) record: Option<RecordTx>,
}

/// What a queue's engine hands back when it stops.
struct QueueEnd {
    report: EngineReport,
    measured: Measured,
    wall: f64,
    spin_s: f64,
    placement: Vec<String>,
    placement_refused: Vec<String>,
}

/// An engine thread and its live counters.
type EngineThread = (
    JoinHandle<Result<QueueEnd, ServerError>>,
    Arc<Mutex<EngineLive>>,
);

/// What the control thread owns besides the engines.
pub(super) struct ControlRun {
    pub(super) sfu: Sfu,
    /// Sends replies and slow-path copies through the kernel.
    pub(super) socket: UdpSocket,
    /// The engines' next hops, refreshed here (xdp on several queues).
    pub(super) next_hops: Option<NextHopRefresher>,
    pub(super) admin: Receiver<AdminRequest>,
    pub(super) record: Option<RecordTx>,
    pub(super) stop: Arc<AtomicBool>,
    pub(super) live: Arc<Mutex<LiveStats>>,
    pub(super) warmup: Duration,
}

/// Start one engine thread per entry of `queues` and the control thread
/// (which owns `control.sfu`); the handle is the control thread's, which
/// joins the engines and sums their reports.
pub(super) fn start(
    control: ControlRun,
    queues: Vec<QueueRun>,
) -> Result<JoinHandle<Result<EngineEnd, ServerError>>, ServerError> {
    let published = Arc::new(Published::new(RouteSnapshot::of(&control.sfu, 1)));
    let (to_control, from_engines) = sync_channel(HANDOFF_QUEUE);
    let (seen_tx, seen_rx) = sync_channel(64);
    let stop = control.stop.clone();
    let mut engines: Vec<EngineThread> = Vec::with_capacity(queues.len());
    for run in queues {
        let live = Arc::new(Mutex::new(EngineLive {
            queue: run.queue,
            ..EngineLive::default()
        }));
        let core = QueueCore {
            published: published.clone(),
            snapshot: published
                .current
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .clone(),
            to_control: to_control.clone(),
            seen_tx: seen_tx.clone(),
            seen: HashSet::new(),
            scratch: Vec::new(),
            counters: QueueCounters::default(),
        };
        let (engine_live, engine_stop) = (live.clone(), stop.clone());
        let name = format!("sfu-engine-{}", run.queue);
        let spawned = std::thread::Builder::new()
            .name(name.clone())
            .spawn(move || {
                let end = queue_engine(run, core, &engine_stop, &engine_live);
                if end.is_err() {
                    // One engine failed: the server stops.
                    engine_stop.store(true, Ordering::Relaxed);
                }
                end
            });
        match spawned {
            Ok(handle) => engines.push((handle, live)),
            Err(source) => {
                stop.store(true, Ordering::Relaxed);
                for (handle, _) in engines {
                    let _ = handle.join();
                }
                return Err(ServerError::Thread { name, source });
            }
        }
    }
    // The engines hold the only senders: the channel closes when they end.
    drop((to_control, seen_tx));
    let channels = Channels {
        published,
        from_engines,
        seen: seen_rx,
    };
    std::thread::Builder::new()
        .name("sfu-control".into())
        .spawn(move || control_thread(control, channels, engines))
        .map_err(|source| {
            stop.store(true, Ordering::Relaxed);
            ServerError::Thread {
                name: "sfu-control".into(),
                source,
            }
        })
}

/// One queue's engine: receive, forward (or hand on), flush, tick.
fn queue_engine(
    run: QueueRun,
    core: QueueCore,
    stop: &AtomicBool,
    live: &Mutex<EngineLive>,
) -> Result<QueueEnd, ServerError> {
    let QueueRun {
        mut io,
        queue,
        srpic,
        settings,
        cpu,
        record,
    } = run;
    let started = Instant::now();
    let cpus = cpu.map(|c| vec![c]);
    let (placement, placement_refused) = place_engine(cpus.as_deref());
    let mut engine = settings.engine(core, srpic);
    engine.record = record;
    let mut window = Window::new(&settings, started);
    let mut next_tick = 0u64;
    while window.running(stop) {
        window.warm_up_ended(&mut engine, io.as_ref(), None);
        let received = window.receive(io.as_mut(), &mut engine)?;
        let now = monotonic_now().0;
        if received > 0 {
            engine.sfu.refresh();
            engine.handle_batch(io.as_mut(), now)?;
        }
        if now >= next_tick {
            engine.sfu.report_seen();
            publish_engine(live, &engine, io.stats());
            next_tick = now + TICK_NS;
        }
    }
    let (wall, cpu) = window.end(io.as_mut(), &mut engine)?;
    engine.sfu.report_seen();
    publish_engine(live, &engine, io.stats());
    let measured = engine.measured(&window.baseline);
    Ok(QueueEnd {
        report: EngineReport {
            queue,
            io_mode: io.describe(),
            counters: engine.sfu.counters,
            io: io.stats().since(&window.baseline.io),
            forwarded: measured.forwarded,
            cpu,
            srpic: engine.srpic.as_ref().map(Srpic::stats),
        },
        measured,
        wall,
        spin_s: window.spin_ns as f64 / 1e9,
        placement,
        placement_refused,
    })
}

/// Publish one engine's counters.
fn publish_engine(live: &Mutex<EngineLive>, engine: &Engine<QueueCore>, io: IoStats) {
    let cpu = host::thread_cpu_time()
        .ok()
        .map(|c| (c.user_ns + c.system_ns) as f64 / 1e9);
    let mut stats = live.lock().unwrap_or_else(PoisonError::into_inner);
    stats.counters = engine.sfu.counters;
    stats.io = io;
    stats.rx_bytes = engine.rx_bytes;
    stats.tx_bytes = engine.tx_bytes;
    stats.truncated = engine.truncated;
    stats.cpu_s = cpu;
}

/// The control thread's ends of the engines' channels.
struct Channels {
    published: Arc<Published>,
    from_engines: Receiver<Handoff>,
    seen: Receiver<Vec<u32>>,
}

/// The control thread: the core, its timers and admin requests, what the
/// engines hand on, the snapshots; at the end the engines' reports summed.
fn control_thread(
    run: ControlRun,
    channels: Channels,
    engines: Vec<EngineThread>,
) -> Result<EngineEnd, ServerError> {
    let ControlRun {
        mut sfu,
        socket,
        next_hops,
        admin,
        record,
        stop,
        live,
        warmup,
    } = run;
    let Channels {
        published,
        from_engines,
        seen,
    } = channels;
    let started = Instant::now();
    let lives: Vec<Arc<Mutex<EngineLive>>> = engines.iter().map(|(_, l)| l.clone()).collect();
    let mut counters = ControlCounters::default();
    let mut version = 1u64;
    let mut next_tick = 0u64;
    let mut out = Outbound {
        socket: &socket,
        record: record.as_ref(),
        replies: Vec::new(),
        next_hops,
    };
    loop {
        let mut changed = false;
        match from_engines.recv_timeout(CONTROL_WAIT) {
            Ok(first) => {
                changed |= out.handle(&mut sfu, first, &mut counters);
                for handoff in from_engines.try_iter().take(HANDOFF_ROUND) {
                    changed |= out.handle(&mut sfu, handoff, &mut counters);
                }
            }
            Err(RecvTimeoutError::Timeout) => {}
            // Every engine has ended.
            Err(RecvTimeoutError::Disconnected) => break,
        }
        if engines.iter().any(|(handle, _)| handle.is_finished()) {
            // One ended (duration over, stopped, or failed): all are ending.
            stop.store(true, Ordering::Relaxed);
        }
        let now = monotonic_now().0;
        for ssids in seen.try_iter() {
            for ssid in ssids {
                sfu.media_seen(now, ssid);
            }
        }
        while let Ok(request) = admin.try_recv() {
            // Every operation but the listing may remove clients or rooms.
            changed |= !matches!(request.op, admin::AdminOp::Rooms);
            let _ = request.reply.send(admin::apply(&mut sfu, now, request.op));
        }
        if now >= next_tick {
            sfu.set_unix_time(now, realtime_now().0);
            changed |= sfu.tick(now) > 0;
            let measuring = started.elapsed() >= warmup;
            publish_live(&live, &sfu, &lives, record.as_ref(), measuring);
            next_tick = now + TICK_NS;
        }
        // Before the snapshot: a client that just registered has its next
        // hop read (within the budget) before its ACK leaves.
        out.refresh_next_hops();
        if changed {
            version += 1;
            counters.snapshots += 1;
            published.publish(RouteSnapshot::of(&sfu, version));
        }
        // After the snapshot: a client that has its ACK finds its routes
        // in the engines.
        out.send_replies(&mut counters);
    }
    let ends = join_engines(engines)?;
    // What the engines handed on before they ended.
    for handoff in from_engines.try_iter() {
        out.handle(&mut sfu, handoff, &mut counters);
    }
    out.send_replies(&mut counters);
    if let Some(next_hops) = &out.next_hops {
        counters.next_hop_reads = next_hops.reads();
        counters.next_hop_tables = next_hops.generation();
    }
    publish_live(&live, &sfu, &lives, record.as_ref(), true);
    Ok(merge(ends, sfu.stats(), counters))
}

/// Wait for every engine thread; their ends, or the first error (a panic
/// included) once all have ended.
fn join_engines(engines: Vec<EngineThread>) -> Result<Vec<QueueEnd>, ServerError> {
    let mut ends = Vec::with_capacity(engines.len());
    let mut failed = None;
    for (handle, _) in engines {
        match handle.join() {
            Ok(Ok(end)) => ends.push(end),
            Ok(Err(err)) => {
                failed.get_or_insert(err);
            }
            Err(_) => {
                failed.get_or_insert(ServerError::Panicked("sfu-engine".into()));
            }
        }
    }
    match failed {
        Some(err) => Err(err),
        None => Ok(ends),
    }
}

/// The control thread's way out: the kernel socket, the recorder, and the
/// next hops of the engines' way out.
struct Outbound<'a> {
    socket: &'a UdpSocket,
    record: Option<&'a RecordTx>,
    /// Replies of this round, sent once the routes they announce are
    /// published.
    replies: Vec<(SocketAddr, Vec<u8>)>,
    next_hops: Option<NextHopRefresher>,
}

impl Outbound<'_> {
    /// Run a handed-off datagram through the core: copies of media go out
    /// at once, replies wait for [`Outbound::send_replies`]. Returns
    /// whether the routes may have changed (an ACK to anything but a
    /// KEEPALIVE: REGISTER, SUBSCRIBE, UNSUBSCRIBE, LEAVE, JOIN, REBIND).
    fn handle(&mut self, sfu: &mut Sfu, handoff: Handoff, counters: &mut ControlCounters) -> bool {
        counters.handled += 1;
        let now = monotonic_now().0;
        let data = handoff.data.as_slice();
        let keepalive =
            data.len() >= 4 && data[..2] == *b"PS" && data[3] == MsgType::Keepalive as u8;
        match sfu.handle(now, handoff.peer, data) {
            Action::Reply { dst, msg } => {
                let ack = msg.len() >= 4 && msg[3] == MsgType::Ack as u8;
                self.replies.push((dst, msg.to_vec()));
                let changed = ack && !keepalive;
                if let Some(next_hops) = self.next_hops.as_mut().filter(|_| changed) {
                    // A client registered (or changed): the engines will
                    // send to it.
                    next_hops.note(dst.ip());
                }
                changed
            }
            Action::Forward {
                ssid,
                targets,
                echo,
                ..
            } => {
                if let Some(recorder) = self.record {
                    recorder.offer(ssid, realtime_now().0, data);
                }
                for &dst in targets.iter().chain(echo.iter()) {
                    self.send(data, dst, counters);
                    counters.copies += 1;
                }
                false
            }
            Action::Drop(_) => false,
        }
    }

    /// Read the kernel's routes and neighbours for the engines when due
    /// (they take the table at their next receive call).
    fn refresh_next_hops(&mut self) {
        if let Some(next_hops) = &mut self.next_hops {
            next_hops.poll();
        }
    }

    /// Send the replies held back.
    fn send_replies(&mut self, counters: &mut ControlCounters) {
        let replies = std::mem::take(&mut self.replies);
        for (dst, msg) in &replies {
            self.send(msg, *dst, counters);
            counters.replies += 1;
        }
        // Keep the allocation for the next round.
        self.replies = replies;
        self.replies.clear();
    }

    fn send(&self, bytes: &[u8], dst: SocketAddr, counters: &mut ControlCounters) {
        if self.socket.send_to(bytes, dst).is_err() {
            counters.send_errors += 1;
        }
    }
}

/// The engines' counters added to the core's: datagrams an engine handed
/// on are counted by the core when the control thread handles them.
fn add_engine_counters(stats: &mut SfuStats, counters: &QueueCounters) {
    stats.rx_datagrams += counters.datagrams - counters.to_control;
    stats.rx_rtp += counters.media;
    stats.media_accepted += counters.media;
    stats.copies += counters.copies;
    stats.echoes += counters.echoes;
}

/// Publish the sums (core + engines) and each engine's counters.
fn publish_live(
    live: &Mutex<LiveStats>,
    sfu: &Sfu,
    lives: &[Arc<Mutex<EngineLive>>],
    record: Option<&RecordTx>,
    measuring: bool,
) {
    let engines: Vec<EngineLive> = lives
        .iter()
        .map(|l| l.lock().unwrap_or_else(PoisonError::into_inner).clone())
        .collect();
    let mut core = sfu.stats();
    let mut io = IoStats::default();
    let (mut rx_bytes, mut tx_bytes, mut truncated) = (0, 0, 0);
    let mut cpu = Some(0.0);
    for engine in &engines {
        add_engine_counters(&mut core, &engine.counters);
        io.add(&engine.io);
        rx_bytes += engine.rx_bytes;
        tx_bytes += engine.tx_bytes;
        truncated += engine.truncated;
        cpu = cpu.zip(engine.cpu_s).map(|(a, b)| a + b);
    }
    let rooms: Vec<(String, usize)> = sfu
        .room_sizes()
        .map(|(room, n)| (room.to_string(), n))
        .collect();
    let mut stats = live.lock().unwrap_or_else(PoisonError::into_inner);
    stats.sfu = core;
    stats.rx_bytes = rx_bytes;
    stats.tx_bytes = tx_bytes;
    stats.truncated = truncated;
    stats.rooms = rooms;
    stats.io = io;
    stats.engine_cpu_s = cpu;
    stats.record_queue_drops = record.map(RecordTx::dropped);
    stats.measuring = measuring;
    stats.engines = engines;
    stats.ticks += 1;
}

/// The engines' reports as one: delays and counters summed, CPU summed
/// (null if any is unknown), the longest measured wall time.
fn merge(ends: Vec<QueueEnd>, core: SfuStats, control: ControlCounters) -> EngineEnd {
    let mut measured = Measured::empty();
    let mut io = IoStats::default();
    let mut sfu = core;
    let mut cpu = Some(CpuTime::default());
    let (mut wall, mut spin_s) = (0.0f64, 0.0);
    let (mut placement, mut placement_refused) = (Vec::new(), Vec::new());
    let mut engines = Vec::with_capacity(ends.len());
    let mut mode = String::new();
    for end in ends {
        measured.add(&end.measured);
        io.add(&end.report.io);
        add_engine_counters(&mut sfu, &end.report.counters);
        cpu = cpu.zip(end.report.cpu).map(|(a, b)| a + b);
        wall = wall.max(end.wall);
        spin_s += end.spin_s;
        placement.extend(end.placement);
        placement_refused.extend(end.placement_refused);
        if mode.is_empty() {
            mode = end.report.io_mode.clone();
        }
        engines.push(end.report);
    }
    let mode = format!(
        "{mode}; {} engines, one per RX queue, and a control thread",
        engines.len()
    );
    EngineEnd {
        measured,
        io,
        fanout: None,
        sfu,
        srpic: None,
        mode,
        cpu,
        wall,
        spin_s,
        placement,
        placement_refused,
        engines,
        control: Some(control),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ringway_sfu::client::{parse_reply, Reply, Requests};
    use ringway_sfu::wire::{write_rtp, RtpHeader};
    use ringway_sfu::{Selector, SfuConfig};

    fn addr(port: u16) -> SocketAddr {
        SocketAddr::from(([10, 0, 0, 1], port))
    }

    fn rtp(ssrc: u32, seq: u16) -> Vec<u8> {
        let mut b = vec![0u8; 64];
        let header = RtpHeader {
            payload_type: MediaType::Asq.payload_type(),
            marker: false,
            seq,
            timestamp: 0,
            ssrc,
        };
        let n = write_rtp(&mut b, &header, None, 20).unwrap();
        b.truncate(n);
        b
    }

    /// A core with `n` registered clients, each subscribed to all.
    fn core_with(n: u16) -> (Sfu, Vec<u32>) {
        let mut sfu = Sfu::new(SfuConfig::default());
        let mut reqs = Requests::default();
        let mut ssids = Vec::new();
        let ask = |sfu: &mut Sfu, from: SocketAddr, msg: &[u8]| -> Reply {
            match sfu.handle(0, from, msg) {
                Action::Reply { msg, .. } => parse_reply(msg).unwrap(),
                other => panic!("{other:?}"),
            }
        };
        for k in 0..n {
            let from = addr(1000 + k);
            let Reply::Challenge(_, cookie) = ask(&mut sfu, from, &reqs.register().1) else {
                panic!("no challenge")
            };
            let Reply::Ack(_, session) = ask(&mut sfu, from, &reqs.register_with(&cookie).1) else {
                panic!("not registered")
            };
            let subscribe = reqs.subscribe(session, &[Selector::ALL], false).1;
            assert!(matches!(ask(&mut sfu, from, &subscribe), Reply::Ack(..)));
            ssids.push(session.ssid);
        }
        (sfu, ssids)
    }

    fn queue_core(sfu: &Sfu) -> (QueueCore, Receiver<Handoff>) {
        let published = Arc::new(Published::new(RouteSnapshot::of(sfu, 1)));
        let (to_control, from_engines) = sync_channel(4);
        let (seen_tx, _) = sync_channel(4);
        let snapshot = published.current.lock().unwrap().clone();
        let core = QueueCore {
            published,
            snapshot,
            to_control,
            seen_tx,
            seen: HashSet::new(),
            scratch: Vec::new(),
            counters: QueueCounters::default(),
        };
        (core, from_engines)
    }

    /// The snapshot forwards what the core forwards (same subscribers and
    /// echo), rotating the order per packet so that each subscriber is
    /// first and last once over n packets; everything else is handed on.
    #[test]
    fn snapshot_forwards_like_the_core_and_hands_on_the_rest() {
        let (mut sfu, ssids) = core_with(4);
        let (mut core, from_engines) = queue_core(&sfu);
        let mut firsts = HashSet::new();
        let mut lasts = HashSet::new();
        for seq in 0..3u16 {
            let packet = rtp(ssids[0], seq);
            let Some(Action::Forward { targets, echo, .. }) = core.forward(0, addr(1000), &packet)
            else {
                panic!("not forwarded")
            };
            let mut mine = targets.to_vec();
            assert_eq!(echo, Some(addr(1000)));
            firsts.insert(mine[0]);
            lasts.insert(*mine.last().unwrap());
            let Action::Forward { targets, .. } = sfu.handle(0, addr(1000), &packet) else {
                panic!("the core does not forward it")
            };
            let mut theirs = targets.to_vec();
            mine.sort();
            theirs.sort();
            assert_eq!(mine, theirs);
        }
        assert_eq!(firsts.len(), 3, "each subscriber first once");
        assert_eq!(lasts.len(), 3, "each subscriber last once");
        // Spoofed (right SSRC, wrong address), control, junk: handed on.
        assert!(core.forward(0, addr(2000), &rtp(ssids[0], 9)).is_none());
        assert!(core.forward(0, addr(1000), b"PS\x01\x04junk").is_none());
        assert!(core.forward(0, addr(1000), b"x").is_none());
        assert_eq!(from_engines.try_iter().count(), 3);
        assert_eq!(core.counters.media, 3);
        assert_eq!(core.counters.copies, 9);
        assert_eq!(core.counters.to_control, 3);
        // The queue is full (4): the next one is counted and dropped.
        for _ in 0..5 {
            core.forward(0, addr(2000), b"x");
        }
        assert_eq!(core.counters.to_control_dropped, 1);
    }

    /// A newer snapshot is picked up at the next refresh; before it, media
    /// of a source that left is still forwarded by the old one.
    #[test]
    fn engines_pick_up_published_snapshots() {
        let (mut sfu, ssids) = core_with(3);
        let (mut core, _from_engines) = queue_core(&sfu);
        let published = core.published.clone();
        // The third source is removed from the core.
        assert!(sfu.kick(ssids[2]));
        let packet = rtp(ssids[2], 1);
        assert!(core.forward(0, addr(1002), &packet).is_some());
        published.publish(RouteSnapshot::of(&sfu, 2));
        assert!(core.forward(0, addr(1002), &packet).is_some(), "not yet");
        core.refresh();
        assert!(core.forward(0, addr(1002), &packet).is_none());
        assert_eq!(core.counters.snapshots, 1);
    }
}
