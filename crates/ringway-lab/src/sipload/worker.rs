//! One generator thread: a UDP socket acting as UAC and UAS.

use super::arrival::Arrivals;
use super::cpu::{thread_cpu, CpuTimes};
use super::view::{name_addr_uri, uri_addr, Hdr, View};
use super::{GsoMode, Live, LoadConfig, WorkerResult};
use hdrhistogram::Histogram;
use ringway_io::{open_backend, open_udp, BatchIo, RxBatch, SocketConfig, TxBatch};
use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

const SDP: &str = "v=0\r\no=ringway 1 1 IN IP4 127.0.0.1\r\ns=-\r\nc=IN IP4 127.0.0.1\r\nt=0 0\r\nm=audio 6000 RTP/AVP 0\r\na=rtpmap:0 PCMU/8000\r\n";
const TX_FRAMES: usize = 128;
const TX_FRAME: usize = 2048;
const RX_FRAMES: usize = 64;
const RX_FRAME: usize = 8192;
/// Receive frames with UDP GRO: each may hold a train of up to 64 KiB.
const RX_FRAMES_GRO: usize = 16;
const RX_FRAME_GRO: usize = 65_536;
/// Most calls started in one loop pass (keeps receiving responsive when late).
const START_BURST: u32 = 64;

pub(crate) fn new_hist() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 3_600_000_000, 3).expect("valid histogram bounds")
}

#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum UacState {
    /// INVITE sent, nothing heard (Timer A running).
    Calling,
    /// Provisional response heard.
    Proceeding,
    /// 200 ACKed, waiting to send BYE.
    Confirmed,
    /// BYE sent.
    Terminating,
}

struct UacCall {
    state: UacState,
    t_invite: u64,
    t_bye: u64,
    got_180: bool,
    interval: u64,
    bye_prov: bool,
    to_tag: Vec<u8>,
    /// Route set (name-addr values as received, already reversed for the UAC).
    route: Vec<Vec<u8>>,
    /// Remote target (Contact URI of the 200).
    target: Vec<u8>,
}

struct UasCall {
    resp200: Vec<u8>,
    dst: SocketAddr,
    interval: u64,
}

/// What a queued message is, in the order one call's messages can follow
/// each other within one flush. With GSO each flush is sorted by (kind,
/// destination, length) so equal messages sit together and form one train,
/// and the messages of one call keep their order (a 180 goes before its 200).
#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    Invite,
    Provisional,
    InviteOk,
    Ack,
    Bye,
    /// Final responses to non-INVITE requests (BYE, OPTIONS, ...).
    Final,
}

/// A message waiting in the GSO staging area: bytes at `off..off+len` of `Worker::stage`.
#[derive(Copy, Clone, Debug)]
struct Staged {
    kind: Kind,
    dst: SocketAddr,
    off: u32,
    len: u32,
}

/// Constant pieces of the generator's messages, rendered once per worker
/// (formatting every message with `write!` was a visible share of the user
/// time). Call numbers go in fixed width (`{n:08}`), so every message of a
/// kind has one length across calls and GSO can send them as one train.
struct Tmpl {
    /// `INVITE sip:service@{ruri} SIP/2.0\r\n`.
    invite_line: Vec<u8>,
    /// `ACK sip:service@{ruri} SIP/2.0\r\n`.
    ack_line: Vec<u8>,
    /// `Via: SIP/2.0/UDP {local};branch=z9hG4bK-{run}-{tid:03}-` (call number follows).
    via: Vec<u8>,
    /// `From: <sip:ringway@{local}>;tag={tid:03}x` (call number follows).
    from: Vec<u8>,
    /// `To: <sip:service@{ruri}>`.
    to: Vec<u8>,
    /// `-{tid:03}-{run}@ringway`: the Call-ID after the call number.
    cid_tail: Vec<u8>,
    /// The INVITE from its CSeq to the end of the SDP body.
    invite_tail: Vec<u8>,
    /// `Contact: <sip:service@{local}>\r\n` of the UAS.
    uas_contact: Vec<u8>,
    /// `Content-Type: application/sdp\r\nContent-Length: ..\r\n\r\n{SDP}`.
    sdp_tail: Vec<u8>,
}

impl Tmpl {
    fn new(local: &str, ruri: &str, run: &str, tid: usize) -> Tmpl {
        let sdp_tail = format!(
            "Content-Type: application/sdp\r\nContent-Length: {}\r\n\r\n{SDP}",
            SDP.len()
        );
        Tmpl {
            invite_line: format!("INVITE sip:service@{ruri} SIP/2.0\r\n").into_bytes(),
            ack_line: format!("ACK sip:service@{ruri} SIP/2.0\r\n").into_bytes(),
            via: format!("Via: SIP/2.0/UDP {local};branch=z9hG4bK-{run}-{tid:03}-").into_bytes(),
            from: format!("From: <sip:ringway@{local}>;tag={tid:03}x").into_bytes(),
            to: format!("To: <sip:service@{ruri}>").into_bytes(),
            cid_tail: format!("-{tid:03}-{run}@ringway").into_bytes(),
            invite_tail: format!("CSeq: 1 INVITE\r\nContact: <sip:ringway@{local}>\r\n{sdp_tail}")
                .into_bytes(),
            uas_contact: format!("Contact: <sip:service@{local}>\r\n").into_bytes(),
            sdp_tail: sdp_tail.into_bytes(),
        }
    }

    /// `Via: ...-{n:08}-{kind};rport\r\nMax-Forwards: 70\r\n`.
    fn push_via(&self, out: &mut Vec<u8>, n: u64, kind: u8) {
        out.extend_from_slice(&self.via);
        push_dec(out, n, 8);
        out.push(b'-');
        out.push(kind);
        out.extend_from_slice(b";rport\r\nMax-Forwards: 70\r\n");
    }

    /// `From: ...x{n:08}\r\n`.
    fn push_from(&self, out: &mut Vec<u8>, n: u64) {
        out.extend_from_slice(&self.from);
        push_dec(out, n, 8);
        out.extend_from_slice(b"\r\n");
    }

    /// `Call-ID: {n:08}-{tid:03}-{run}@ringway\r\n`.
    fn push_call_id(&self, out: &mut Vec<u8>, n: u64) {
        out.extend_from_slice(b"Call-ID: ");
        push_dec(out, n, 8);
        out.extend_from_slice(&self.cid_tail);
        out.extend_from_slice(b"\r\n");
    }
}

/// Append `n` in decimal, zero-padded to at least `width` digits.
fn push_dec(out: &mut Vec<u8>, mut n: u64, width: usize) {
    let mut buf = [b'0'; 20];
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    let start = i.min(buf.len() - width.min(buf.len()));
    out.extend_from_slice(&buf[start..]);
}

/// Append `n` as 16 lowercase hex digits.
fn push_hex16(out: &mut Vec<u8>, n: u64) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    for k in (0..16).rev() {
        out.push(HEX[((n >> (4 * k)) & 0xf) as usize]);
    }
}

/// The last URI looked up and its address (every call of a run has the
/// same Contact and Record-Route, so parsing them once is enough).
#[derive(Default)]
struct UriMemo {
    uri: Vec<u8>,
    addr: Option<(SocketAddr, bool)>,
}

impl UriMemo {
    /// [`uri_addr`] of `uri`, remembered for the next identical `uri`.
    fn get(&mut self, uri: &[u8]) -> Option<(SocketAddr, bool)> {
        if self.uri != uri || self.uri.is_empty() {
            self.uri.clear();
            self.uri.extend_from_slice(uri);
            self.addr = uri_addr(uri);
        }
        self.addr
    }
}

#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum TKind {
    InviteRetx,
    InviteTimeout,
    ByeStart,
    ByeRetx,
    ByeTimeout,
    UasRetx,
    UasTimeout,
}

#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Timer {
    at: u64,
    key: u64,
    kind: TKind,
}

/// Which constant offset a first-time timer uses (its FIFO).
#[derive(Copy, Clone, Debug)]
enum Fifo {
    /// now + T1 (first retransmissions).
    T1,
    /// now + 64·T1 (transaction timeouts).
    Long,
    /// now + hold (BYE start).
    Hold,
}

/// Timers: most have a constant offset from "now" (T1, 64·T1, hold), so
/// for each offset insertion order is deadline order and a FIFO suffices
/// (O(1), and the many long timeouts never bloat a heap). Back-off
/// retransmissions (2·T1, 4·T1, ...) go to a small heap.
#[derive(Default)]
struct Timers {
    fifos: [VecDeque<Timer>; 3],
    heap: BinaryHeap<Reverse<Timer>>,
}

impl Timers {
    fn push_fifo(&mut self, q: Fifo, t: Timer) {
        self.fifos[q as usize].push_back(t);
    }
    fn push(&mut self, t: Timer) {
        self.heap.push(Reverse(t));
    }
    fn next_at(&self) -> Option<u64> {
        let f = self
            .fifos
            .iter()
            .filter_map(|q| q.front().map(|t| t.at))
            .min();
        let h = self.heap.peek().map(|Reverse(t)| t.at);
        match (f, h) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
    fn pop_due(&mut self, now: u64) -> Option<Timer> {
        let mut best: Option<(usize, u64)> = None;
        for (i, q) in self.fifos.iter().enumerate() {
            if let Some(t) = q.front() {
                if t.at <= now && best.is_none_or(|(_, at)| t.at < at) {
                    best = Some((i, t.at));
                }
            }
        }
        if let Some(Reverse(t)) = self.heap.peek() {
            if t.at <= now && best.is_none_or(|(_, at)| t.at < at) {
                return self.heap.pop().map(|Reverse(t)| t);
            }
        }
        best.and_then(|(i, _)| self.fifos[i].pop_front())
    }
}

/// Multiply-rotate hasher for the generator's own keys (call numbers and
/// Call-IDs it mostly made itself); SipHash is not needed here.
#[derive(Default, Clone, Copy)]
struct FastHash(u64);

impl Hasher for FastHash {
    fn write(&mut self, bytes: &[u8]) {
        for c in bytes.chunks(8) {
            let mut w = [0u8; 8];
            w[..c.len()].copy_from_slice(c);
            self.write_u64(u64::from_le_bytes(w));
        }
    }
    fn write_u64(&mut self, x: u64) {
        self.0 = (self.0.rotate_left(5) ^ x).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
    fn finish(&self) -> u64 {
        self.0
    }
}

type FastMap<K, V> = HashMap<K, V, BuildHasherDefault<FastHash>>;

pub(crate) struct Worker {
    io: Box<dyn BatchIo>,
    /// Constant message pieces.
    tm: Tmpl,
    /// Remote target and first-route lookups.
    target_memo: UriMemo,
    route_memo: UriMemo,
    next_hop: SocketAddr,
    proxy: Option<SocketAddr>,
    ruri: SocketAddr,
    t1: u64,
    t2: u64,
    hold: u64,
    duration: u64,
    arrivals: Arrivals,
    quota: u64,
    live: Arc<Live>,
    calls: FastMap<u64, UacCall>,
    uas_ids: FastMap<Vec<u8>, u64>,
    uas: FastMap<u64, (Vec<u8>, UasCall)>,
    next_uas: u64,
    timers: Timers,
    tx: TxBatch,
    rx: RxBatch,
    /// Stand-in for `rx` while a received batch is handled.
    rx_idle: Option<RxBatch>,
    /// GSO is on: messages are staged and sorted before each flush.
    gso: bool,
    staged: Vec<Staged>,
    stage: Vec<u8>,
    scratch: Vec<u8>,
    r: WorkerCounts,
    /// CLOCK_REALTIME of the current loop pass (send stamps for response times).
    rt_now: u64,
    tick: u64,
}

#[derive(Default)]
struct WorkerCounts {
    attempted: u64,
    succeeded: u64,
    failed: BTreeMap<String, u64>,
    retrans_invite: u64,
    retrans_bye: u64,
    retrans_200: u64,
    retrans_ack: u64,
    uas_calls: u64,
    uas_ack_timeouts: u64,
    msgs_sent: u64,
    msgs_to_proxy: u64,
    msgs_received: u64,
    msgs_ignored: u64,
}

fn now_ns() -> u64 {
    ringway_io::monotonic_now().0
}

/// FNV-1a of the Call-ID: the UAS's To tag.
fn tag_of(call_id: &[u8]) -> u64 {
    call_id.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
    })
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
        let mut sc = SocketConfig::new(SocketAddr::new(cfg.bind_ip, port));
        sc.rcvbuf = cfg.rcvbuf;
        sc.sndbuf = cfg.rcvbuf;
        // Kernel RX stamps make response times exact even when wakeups are coalesced.
        sc.rx_timestamps = true;
        let (sock, _rep) = open_udp(&sc).map_err(|e| anyhow::anyhow!("bind {}: {e}", sc.bind))?;
        let mut io = open_backend(cfg.backend, sock)?;
        let gso = cfg.gso != GsoMode::Off && io.set_gso(true);
        if cfg.gso == GsoMode::On && !gso {
            anyhow::bail!(
                "UDP GSO not available with the {} backend on this kernel (use --gso auto or off)",
                cfg.backend
            );
        }
        let gro = cfg.gro != GsoMode::Off && io.set_gro(true);
        if cfg.gro == GsoMode::On && !gro {
            anyhow::bail!(
                "UDP GRO not available with the {} backend on this kernel (use --gro auto or off)",
                cfg.backend
            );
        }
        let local = io.local_addr()?;
        let ruri = cfg.uas.unwrap_or(local);
        let next_hop = cfg.proxy.unwrap_or(ruri);
        let n = cfg.threads as u64;
        let quota = cfg.calls / n + u64::from((i as u64) < cfg.calls % n);
        Ok(Worker {
            io,
            tm: Tmpl::new(&local.to_string(), &ruri.to_string(), run_id, i),
            target_memo: UriMemo::default(),
            route_memo: UriMemo::default(),
            next_hop,
            proxy: cfg.proxy,
            ruri,
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
            calls: FastMap::default(),
            uas_ids: FastMap::default(),
            uas: FastMap::default(),
            next_uas: 0,
            timers: Timers::default(),
            tx: TxBatch::new(TX_FRAMES, TX_FRAME),
            // A GRO train can fill 64 KiB: fewer, larger frames.
            rx: if gro {
                RxBatch::new(RX_FRAMES_GRO, RX_FRAME_GRO)
            } else {
                RxBatch::new(RX_FRAMES, RX_FRAME)
            },
            rx_idle: Some(RxBatch::new(1, 1)),
            gso,
            staged: Vec::with_capacity(TX_FRAMES),
            stage: Vec::with_capacity(TX_FRAMES * 1024),
            scratch: Vec::with_capacity(2048),
            r: WorkerCounts::default(),
            rt_now: 0,
            tick: cfg.effective_tick().as_nanos() as u64,
        })
    }

    pub(crate) fn run(mut self, t0: Instant) -> anyhow::Result<WorkerResult> {
        let cpu0 = thread_cpu().unwrap_or_default();
        let mut h180 = new_hist();
        let mut h200 = new_hist();
        let mut hbye = new_hist();
        let start = now_ns() - t0.elapsed().as_nanos() as u64;
        let end_start = start + self.duration;
        let mut next_start = start + self.arrivals.next_gap_ns();
        let mut started = 0u64;
        let mut last_start = t0;
        let mut starting = self.quota > 0;
        let mut hard_deadline = u64::MAX;
        loop {
            let now = now_ns();
            self.rt_now = ringway_io::realtime_now().0;
            if starting
                && (started >= self.quota
                    || now >= end_start
                    || self.live.stop.load(Ordering::Relaxed))
            {
                starting = false;
            }
            if !starting && hard_deadline == u64::MAX {
                hard_deadline = now + self.hold + 64 * self.t1 + 2 * self.t2;
            }
            let mut burst = 0;
            while starting && next_start <= now && started < self.quota && burst < START_BURST {
                self.start_call(started, now);
                started += 1;
                burst += 1;
                next_start += self.arrivals.next_gap_ns();
                last_start = Instant::now();
            }
            self.fire_timers(now);
            self.flush();
            if !starting && self.calls.is_empty() && self.uas.is_empty() {
                break;
            }
            let abort = self.live.abort.load(Ordering::Relaxed);
            if now >= hard_deadline || abort {
                let left = self.calls.len() as u64;
                if left > 0 {
                    let why = if abort { "aborted" } else { "unfinished" };
                    *self.r.failed.entry(why.into()).or_default() += left;
                    self.live.failed.fetch_add(left, Ordering::Relaxed);
                }
                break;
            }
            let busy = !self.calls.is_empty() || !self.uas.is_empty();
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
            if let Some(at) = self.timers.next_at() {
                wake = wake.min(at);
            }
            let n = if self.tick > 0 && busy {
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
            if n > 0 {
                self.drain_rx(n, &mut h180, &mut h200, &mut hbye)?;
            }
        }
        self.flush();
        let cpu = thread_cpu().unwrap_or_default().since(&cpu0);
        let st = self.io.stats();
        let r = self.r;
        Ok(WorkerResult {
            attempted: r.attempted,
            succeeded: r.succeeded,
            failed: r.failed,
            retrans_invite: r.retrans_invite,
            retrans_bye: r.retrans_bye,
            retrans_200: r.retrans_200,
            retrans_ack: r.retrans_ack,
            uas_calls: r.uas_calls,
            uas_ack_timeouts: r.uas_ack_timeouts,
            h180,
            h200,
            hbye,
            msgs_sent: r.msgs_sent,
            msgs_to_proxy: r.msgs_to_proxy,
            msgs_received: r.msgs_received,
            msgs_ignored: r.msgs_ignored,
            send_errors: st.tx_errors,
            rx_dropped: st.rx_dropped,
            cpu: CpuTimes {
                user_s: cpu.user_s,
                sys_s: cpu.sys_s,
            },
            gso_used: self.gso,
            gso: self.io.gso_stats(),
            last_start,
            finished: Instant::now(),
        })
    }

    /// Handle a received batch of `n`, then keep receiving without waiting
    /// while full batches come in (bounded passes). Replies are queued (a
    /// full queue is sent on the way) and sent by the caller's next flush.
    fn drain_rx(
        &mut self,
        mut n: usize,
        h180: &mut Histogram<u64>,
        h200: &mut Histogram<u64>,
        hbye: &mut Histogram<u64>,
    ) -> anyhow::Result<()> {
        for _ in 0..16 {
            let now = now_ns();
            self.r.msgs_received += n as u64;
            // Borrow the batch out (a one-frame stand-in, allocated once)
            // so handlers can use `self`.
            let idle = self.rx_idle.take().unwrap_or_else(|| RxBatch::new(1, 1));
            let rx = std::mem::replace(&mut self.rx, idle);
            for d in rx.iter() {
                let rx_rt = d.meta.kernel_rx.unwrap_or(d.meta.app_rx).0;
                self.on_datagram(d.data, d.meta.peer, now, rx_rt, h180, h200, hbye);
            }
            self.rx_idle = Some(std::mem::replace(&mut self.rx, rx));
            // No flush here: what the handlers queued goes out with the call
            // starts and timer messages of the next loop pass (it follows at
            // once), in one send call.
            if self.rx.free_frames() > 0 {
                break;
            }
            n = self.io.recv_batch(&mut self.rx, Some(Duration::ZERO))?;
            if n == 0 {
                break;
            }
        }
        Ok(())
    }

    fn flush(&mut self) {
        if !self.staged.is_empty() {
            // Equal (kind, destination, length) side by side; `off` grows in
            // queueing order, so ties keep it (a stable sort without allocating).
            self.staged
                .sort_unstable_by_key(|m| (m.kind, m.dst, m.len, m.off));
            for m in &self.staged {
                let bytes = &self.stage[m.off as usize..(m.off + m.len) as usize];
                // Fits: at most TX_FRAMES staged, each at most TX_FRAME bytes.
                let _ = self.tx.push(m.dst, bytes);
            }
            self.staged.clear();
            self.stage.clear();
        }
        if self.tx.is_empty() {
            return;
        }
        let _ = self.io.send_batch(&self.tx);
        self.tx.clear();
    }

    /// Queue `scratch` for `dst`.
    fn send_scratch(&mut self, dst: SocketAddr, kind: Kind) {
        if self.gso {
            if self.scratch.len() > TX_FRAME {
                return; // as `TxBatch::push` refuses it without GSO
            }
            if self.staged.len() >= TX_FRAMES {
                self.flush();
            }
            self.staged.push(Staged {
                kind,
                dst,
                off: self.stage.len() as u32,
                len: self.scratch.len() as u32,
            });
            self.stage.extend_from_slice(&self.scratch);
        } else {
            if self.tx.is_full() {
                self.flush();
            }
            if self.tx.push(dst, &self.scratch).is_err() {
                return;
            }
        }
        self.r.msgs_sent += 1;
        if Some(dst) == self.proxy {
            self.r.msgs_to_proxy += 1;
        }
    }

    fn fail(&mut self, reason: &str) {
        *self.r.failed.entry(reason.to_string()).or_default() += 1;
        self.live.failed.fetch_add(1, Ordering::Relaxed);
    }

    fn schedule(&mut self, at: u64, key: u64, kind: TKind) {
        self.timers.push(Timer { at, key, kind });
    }

    fn schedule_fifo(&mut self, q: Fifo, now: u64, key: u64, kind: TKind) {
        let at = now
            + match q {
                Fifo::T1 => self.t1,
                Fifo::Long => 64 * self.t1,
                Fifo::Hold => self.hold,
            };
        self.timers.push_fifo(q, Timer { at, key, kind });
    }

    /// Parse our own Call-ID back to the call number.
    fn our_call(&self, cid: &[u8]) -> Option<u64> {
        let digits = cid.strip_suffix(self.tm.cid_tail.as_slice())?;
        if digits.is_empty() || digits.len() > 19 || !digits.iter().all(u8::is_ascii_digit) {
            return None;
        }
        Some(
            digits
                .iter()
                .fold(0u64, |a, &d| a * 10 + u64::from(d - b'0')),
        )
    }

    fn build_invite(&mut self, n: u64) {
        let (out, tm) = (&mut self.scratch, &self.tm);
        out.clear();
        out.extend_from_slice(&tm.invite_line);
        tm.push_via(out, n, b'i');
        tm.push_from(out, n);
        out.extend_from_slice(&tm.to);
        out.extend_from_slice(b"\r\n");
        tm.push_call_id(out, n);
        out.extend_from_slice(&tm.invite_tail);
    }

    fn start_call(&mut self, n: u64, now: u64) {
        self.build_invite(n);
        self.send_scratch(self.next_hop, Kind::Invite);
        self.r.attempted += 1;
        self.live.attempted.fetch_add(1, Ordering::Relaxed);
        self.calls.insert(
            n,
            UacCall {
                state: UacState::Calling,
                t_invite: self.rt_now,
                t_bye: 0,
                got_180: false,
                interval: self.t1,
                bye_prov: false,
                to_tag: Vec::new(),
                route: Vec::new(),
                target: Vec::new(),
            },
        );
        self.schedule_fifo(Fifo::T1, now, n, TKind::InviteRetx);
        self.schedule_fifo(Fifo::Long, now, n, TKind::InviteTimeout);
    }

    /// Build an in-dialog request (ACK or BYE) for call `n`; returns where to send it.
    fn build_in_dialog(&mut self, n: u64, method: &str, cseq: u32) -> Option<SocketAddr> {
        let c = self.calls.get(&n)?;
        // RFC 3261 12.2.1.1: loose routing keeps the remote target in the
        // Request-URI; a strict first route becomes the Request-URI and the
        // remote target goes last in the Route header.
        let (dst, strict) = match c.route.first() {
            // No route set: an outbound proxy, when configured, still gets
            // the request (RFC 3261 8.1.2); else the remote target does.
            None => {
                let target = self.target_memo.get(&c.target)?.0;
                (self.proxy.unwrap_or(target), false)
            }
            Some(r) => {
                let (addr, lr) = self.route_memo.get(name_addr_uri(r))?;
                (addr, !lr)
            }
        };
        let (out, tm) = (&mut self.scratch, &self.tm);
        out.clear();
        out.extend_from_slice(method.as_bytes());
        out.push(b' ');
        if strict {
            let f = name_addr_uri(&c.route[0]);
            let strip = f.iter().position(|&b| b == b';').unwrap_or(f.len());
            out.extend_from_slice(&f[..strip]);
        } else {
            out.extend_from_slice(&c.target);
        }
        out.extend_from_slice(b" SIP/2.0\r\n");
        tm.push_via(out, n, if method == "ACK" { b'a' } else { b'b' });
        let routes = if strict { &c.route[1..] } else { &c.route[..] };
        if !routes.is_empty() || strict {
            out.extend_from_slice(b"Route: ");
            for (i, r) in routes.iter().enumerate() {
                if i > 0 {
                    out.extend_from_slice(b", ");
                }
                out.extend_from_slice(r);
            }
            if strict {
                if !routes.is_empty() {
                    out.extend_from_slice(b", ");
                }
                out.push(b'<');
                out.extend_from_slice(&c.target);
                out.push(b'>');
            }
            out.extend_from_slice(b"\r\n");
        }
        tm.push_from(out, n);
        out.extend_from_slice(&tm.to);
        out.extend_from_slice(b";tag=");
        out.extend_from_slice(&c.to_tag);
        out.extend_from_slice(b"\r\n");
        tm.push_call_id(out, n);
        out.extend_from_slice(b"CSeq: ");
        push_dec(out, u64::from(cseq), 1);
        out.push(b' ');
        out.extend_from_slice(method.as_bytes());
        out.extend_from_slice(b"\r\nContent-Length: 0\r\n\r\n");
        Some(dst)
    }

    fn send_in_dialog(&mut self, n: u64, method: &str, cseq: u32) -> bool {
        let kind = if method == "ACK" {
            Kind::Ack
        } else {
            Kind::Bye
        };
        match self.build_in_dialog(n, method, cseq) {
            Some(dst) => {
                self.send_scratch(dst, kind);
                true
            }
            None => false,
        }
    }

    fn fire_timers(&mut self, now: u64) {
        while let Some(t) = self.timers.pop_due(now) {
            match t.kind {
                TKind::InviteRetx => {
                    let Some(c) = self.calls.get_mut(&t.key) else {
                        continue;
                    };
                    if c.state != UacState::Calling {
                        continue;
                    }
                    c.interval *= 2;
                    let next = now + c.interval;
                    self.build_invite(t.key);
                    self.send_scratch(self.next_hop, Kind::Invite);
                    self.r.retrans_invite += 1;
                    self.live.retransmissions.fetch_add(1, Ordering::Relaxed);
                    self.schedule(next, t.key, TKind::InviteRetx);
                }
                TKind::InviteTimeout => {
                    let timed_out = matches!(
                        self.calls.get(&t.key).map(|c| c.state),
                        Some(UacState::Calling | UacState::Proceeding)
                    );
                    if timed_out {
                        self.calls.remove(&t.key);
                        self.fail("timeout_invite");
                    }
                }
                TKind::ByeStart => {
                    let Some(c) = self.calls.get_mut(&t.key) else {
                        continue;
                    };
                    if c.state != UacState::Confirmed {
                        continue;
                    }
                    c.state = UacState::Terminating;
                    c.t_bye = self.rt_now;
                    c.interval = self.t1;
                    if self.send_in_dialog(t.key, "BYE", 2) {
                        self.schedule_fifo(Fifo::T1, now, t.key, TKind::ByeRetx);
                        self.schedule_fifo(Fifo::Long, now, t.key, TKind::ByeTimeout);
                    } else {
                        self.calls.remove(&t.key);
                        self.fail("bad_route");
                    }
                }
                TKind::ByeRetx => {
                    let t2 = self.t2;
                    let Some(c) = self.calls.get_mut(&t.key) else {
                        continue;
                    };
                    if c.state != UacState::Terminating {
                        continue;
                    }
                    c.interval = if c.bye_prov {
                        t2
                    } else {
                        (c.interval * 2).min(t2)
                    };
                    let next = now + c.interval;
                    self.send_in_dialog(t.key, "BYE", 2);
                    self.r.retrans_bye += 1;
                    self.live.retransmissions.fetch_add(1, Ordering::Relaxed);
                    self.schedule(next, t.key, TKind::ByeRetx);
                }
                TKind::ByeTimeout => {
                    if self.calls.get(&t.key).map(|c| c.state) == Some(UacState::Terminating) {
                        self.calls.remove(&t.key);
                        self.fail("timeout_bye");
                    }
                }
                TKind::UasRetx => {
                    let t2 = self.t2;
                    let Some((_, u)) = self.uas.get_mut(&t.key) else {
                        continue;
                    };
                    u.interval = (u.interval * 2).min(t2);
                    let next = now + u.interval;
                    let dst = u.dst;
                    std::mem::swap(&mut self.scratch, &mut u.resp200);
                    self.send_scratch(dst, Kind::InviteOk);
                    let (_, u) = self.uas.get_mut(&t.key).expect("present");
                    std::mem::swap(&mut self.scratch, &mut u.resp200);
                    self.r.retrans_200 += 1;
                    self.live.retransmissions.fetch_add(1, Ordering::Relaxed);
                    self.schedule(next, t.key, TKind::UasRetx);
                }
                TKind::UasTimeout => {
                    if let Some((cid, _)) = self.uas.remove(&t.key) {
                        self.uas_ids.remove(&cid);
                        self.r.uas_ack_timeouts += 1;
                    }
                }
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn on_datagram(
        &mut self,
        data: &[u8],
        peer: SocketAddr,
        now: u64,
        rx_rt: u64,
        h180: &mut Histogram<u64>,
        h200: &mut Histogram<u64>,
        hbye: &mut Histogram<u64>,
    ) {
        let Some(v) = View::parse(data) else {
            self.r.msgs_ignored += 1;
            return;
        };
        if v.is_request() {
            self.on_request(&v, peer, now);
        } else if !self.on_response(&v, now, rx_rt, h180, h200, hbye) {
            self.r.msgs_ignored += 1;
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn on_response(
        &mut self,
        v: &View<'_>,
        now: u64,
        rx_rt: u64,
        h180: &mut Histogram<u64>,
        h200: &mut Histogram<u64>,
        hbye: &mut Histogram<u64>,
    ) -> bool {
        let (Some(code), Some((_, method)), Some(cid)) = (v.status(), v.cseq(), v.call_id()) else {
            return false;
        };
        let Some(n) = self.our_call(cid) else {
            return false;
        };
        // Response times: kernel RX stamp (realtime) minus the send stamp.
        let us = |t0: u64| (rx_rt.saturating_sub(t0) / 1000).max(1);
        if method == b"INVITE" {
            if (300..700).contains(&code) {
                // Non-2xx final: ACK hop-by-hop (same branch), from the response alone.
                self.ack_non2xx(v, n);
                if self
                    .calls
                    .get(&n)
                    .is_some_and(|c| matches!(c.state, UacState::Calling | UacState::Proceeding))
                {
                    self.calls.remove(&n);
                    self.fail(&code.to_string());
                }
                return true;
            }
            let Some(c) = self.calls.get_mut(&n) else {
                return true; // late response of a finished call
            };
            if (100..200).contains(&code) {
                if c.state == UacState::Calling {
                    c.state = UacState::Proceeding;
                }
                if code == 180 && !c.got_180 {
                    c.got_180 = true;
                    let _ = h180.record(us(c.t_invite));
                }
                return true;
            }
            if (200..300).contains(&code) {
                if matches!(c.state, UacState::Calling | UacState::Proceeding) {
                    let _ = h200.record(us(c.t_invite));
                    let (Some(route), Ok(target)) = (v.record_routes(), v.contact_uri()) else {
                        // A route set or target that does not parse: the
                        // dialog cannot be followed.
                        self.calls.remove(&n);
                        self.fail("bad_route");
                        return true;
                    };
                    c.state = UacState::Confirmed;
                    c.to_tag = v.to_tag().unwrap_or_default().to_vec();
                    c.route = route.into_iter().rev().collect();
                    c.target = match target {
                        Some(t) => t.to_vec(),
                        None => format!("sip:service@{}", self.ruri).into_bytes(),
                    };
                    if self.send_in_dialog(n, "ACK", 1) {
                        self.schedule_fifo(Fifo::Hold, now, n, TKind::ByeStart);
                    } else {
                        self.calls.remove(&n);
                        self.fail("bad_route");
                    }
                } else {
                    // Retransmitted 200: the UAS did not see our ACK.
                    self.send_in_dialog(n, "ACK", 1);
                    self.r.retrans_ack += 1;
                }
                return true;
            }
            return false;
        }
        if method == b"BYE" {
            let Some(c) = self.calls.get_mut(&n) else {
                return true;
            };
            if c.state != UacState::Terminating {
                return true;
            }
            if (100..200).contains(&code) {
                c.bye_prov = true;
                return true;
            }
            let t_bye = c.t_bye;
            self.calls.remove(&n);
            if (200..300).contains(&code) {
                let _ = hbye.record(us(t_bye));
                self.r.succeeded += 1;
                self.live.succeeded.fetch_add(1, Ordering::Relaxed);
            } else {
                self.fail(&format!("bye_{code}"));
            }
            return true;
        }
        false
    }

    /// ACK for a non-2xx final response (RFC 3261 17.1.1.3): same branch as
    /// the INVITE, To from the response, sent where the INVITE went.
    fn ack_non2xx(&mut self, v: &View<'_>, n: u64) {
        let Some(to) = v.lines(Hdr::To).next() else {
            return;
        };
        let (out, tm) = (&mut self.scratch, &self.tm);
        out.clear();
        out.extend_from_slice(&tm.ack_line);
        tm.push_via(out, n, b'i');
        tm.push_from(out, n);
        out.extend_from_slice(to);
        out.extend_from_slice(b"\r\n");
        tm.push_call_id(out, n);
        out.extend_from_slice(b"CSeq: 1 ACK\r\nContent-Length: 0\r\n\r\n");
        self.send_scratch(self.next_hop, Kind::Ack);
    }

    /// Build a response to request `v` into `scratch`.
    fn build_response(&mut self, v: &View<'_>, code: u16, reason: &str, dialog: bool) {
        let cid = v.call_id().unwrap_or_default();
        let (s, tm) = (&mut self.scratch, &self.tm);
        s.clear();
        s.extend_from_slice(b"SIP/2.0 ");
        push_dec(s, u64::from(code), 3);
        s.push(b' ');
        s.extend_from_slice(reason.as_bytes());
        s.extend_from_slice(b"\r\n");
        for l in v.lines(Hdr::Via) {
            s.extend_from_slice(l);
            s.extend_from_slice(b"\r\n");
        }
        if dialog {
            for l in v.lines(Hdr::RecordRoute) {
                s.extend_from_slice(l);
                s.extend_from_slice(b"\r\n");
            }
        }
        for h in [Hdr::From, Hdr::To, Hdr::CallId, Hdr::CSeq] {
            if let Some(l) = v.lines(h).next() {
                s.extend_from_slice(l);
                if h == Hdr::To && v.to_tag().is_none() {
                    s.extend_from_slice(b";tag=");
                    push_hex16(s, tag_of(cid));
                }
                s.extend_from_slice(b"\r\n");
            }
        }
        if dialog {
            s.extend_from_slice(&tm.uas_contact);
        }
        if dialog && code == 200 {
            s.extend_from_slice(&tm.sdp_tail);
        } else {
            s.extend_from_slice(b"Content-Length: 0\r\n\r\n");
        }
    }

    fn on_request(&mut self, v: &View<'_>, peer: SocketAddr, now: u64) {
        let (Some(method), Some(cid), Some(_)) = (v.method(), v.call_id(), v.cseq()) else {
            self.r.msgs_ignored += 1;
            return;
        };
        let Some(dst) = v.response_target(peer) else {
            self.r.msgs_ignored += 1;
            return;
        };
        match method {
            b"INVITE" => {
                if let Some(id) = self.uas_ids.get(cid).copied() {
                    // Retransmitted INVITE: repeat the last response.
                    let (_, u) = self.uas.get_mut(&id).expect("ids and calls in step");
                    std::mem::swap(&mut self.scratch, &mut u.resp200);
                    self.send_scratch(dst, Kind::InviteOk);
                    let (_, u) = self.uas.get_mut(&id).expect("present");
                    std::mem::swap(&mut self.scratch, &mut u.resp200);
                    return;
                }
                self.build_response(v, 180, "Ringing", true);
                self.send_scratch(dst, Kind::Provisional);
                self.build_response(v, 200, "OK", true);
                self.send_scratch(dst, Kind::InviteOk);
                let id = self.next_uas;
                self.next_uas += 1;
                self.uas_ids.insert(cid.to_vec(), id);
                self.uas.insert(
                    id,
                    (
                        cid.to_vec(),
                        UasCall {
                            resp200: self.scratch.clone(),
                            dst,
                            interval: self.t1,
                        },
                    ),
                );
                self.r.uas_calls += 1;
                self.schedule_fifo(Fifo::T1, now, id, TKind::UasRetx);
                self.schedule_fifo(Fifo::Long, now, id, TKind::UasTimeout);
            }
            b"ACK" => {
                if let Some(id) = self.uas_ids.remove(cid) {
                    self.uas.remove(&id);
                }
            }
            b"BYE" => {
                if let Some(id) = self.uas_ids.remove(cid) {
                    self.uas.remove(&id);
                }
                self.build_response(v, 200, "OK", false);
                self.send_scratch(dst, Kind::Final);
            }
            b"OPTIONS" | b"CANCEL" => {
                self.build_response(v, 200, "OK", false);
                self.send_scratch(dst, Kind::Final);
            }
            _ => {
                self.build_response(v, 501, "Not Implemented", false);
                self.send_scratch(dst, Kind::Final);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A UAC dialog confirmed by the 200 `r`, with route set `route`.
    fn confirmed(r: &View<'_>, route: Vec<Vec<u8>>) -> UacCall {
        UacCall {
            state: UacState::Confirmed,
            t_invite: 0,
            t_bye: 0,
            got_180: true,
            interval: 0,
            bye_prov: false,
            to_tag: r.to_tag().unwrap().to_vec(),
            route,
            target: r.contact_uri().unwrap().unwrap().to_vec(),
        }
    }

    fn worker() -> Worker {
        let cfg = LoadConfig {
            proxy: Some("127.0.0.1:5060".parse().unwrap()),
            ..LoadConfig::default()
        };
        Worker::new(&cfg, 0, "abcd1234", Arc::new(Live::default())).unwrap()
    }

    #[test]
    fn own_messages_parse_with_ringway_sip() {
        let mut w = worker();
        w.build_invite(7);
        let inv = w.scratch.clone();
        let m = ringway_sip::SipMsg::parse(&inv);
        assert!(
            m.is_ok(),
            "{:?}\n{}",
            m.err(),
            String::from_utf8_lossy(&inv)
        );
        let v = View::parse(&inv).unwrap();
        assert_eq!(w.our_call(v.call_id().unwrap()), Some(7));
        w.build_response(&v, 200, "OK", true);
        let resp = w.scratch.clone();
        let m = ringway_sip::SipMsg::parse(&resp);
        assert!(
            m.is_ok(),
            "{:?}\n{}",
            m.err(),
            String::from_utf8_lossy(&resp)
        );
        let r = View::parse(&resp).unwrap();
        assert_eq!(r.status(), Some(200));
        assert!(r.to_tag().is_some());
        // Dialog state from the 200, then the in-dialog BYE.
        w.calls
            .insert(7, confirmed(&r, vec![b"<sip:127.0.0.1:5060;lr>".to_vec()]));
        let dst = w.build_in_dialog(7, "BYE", 2).unwrap();
        assert_eq!(dst, "127.0.0.1:5060".parse().unwrap());
        let bye = w.scratch.clone();
        let m = ringway_sip::SipMsg::parse(&bye);
        assert!(
            m.is_ok(),
            "{:?}\n{}",
            m.err(),
            String::from_utf8_lossy(&bye)
        );
        let b = View::parse(&bye).unwrap();
        assert_eq!(b.method(), Some(&b"BYE"[..]));
        assert!(String::from_utf8_lossy(&bye).contains("Route: <sip:127.0.0.1:5060;lr>\r\n"));
        assert!(String::from_utf8_lossy(&bye).starts_with("BYE sip:service@"));
        // Strict first route: it becomes the Request-URI, the remote target the last Route.
        let target = w.calls[&7].target.clone();
        w.calls.get_mut(&7).unwrap().route = vec![
            b"<sip:127.0.0.9:5080;transport=udp>".to_vec(),
            b"<sip:127.0.0.8;lr>".to_vec(),
        ];
        let dst = w.build_in_dialog(7, "ACK", 1).unwrap();
        assert_eq!(dst, "127.0.0.9:5080".parse().unwrap());
        let ack = String::from_utf8(w.scratch.clone()).unwrap();
        assert!(
            ack.starts_with("ACK sip:127.0.0.9:5080 SIP/2.0\r\n"),
            "{ack}"
        );
        let want = format!(
            "Route: <sip:127.0.0.8;lr>, <{}>\r\n",
            String::from_utf8_lossy(&target)
        );
        assert!(ack.contains(&want), "{ack}");
        assert!(ringway_sip::SipMsg::parse(ack.as_bytes()).is_ok());
        // No route set: the outbound proxy gets it, Request-URI = remote target.
        w.calls.get_mut(&7).unwrap().route.clear();
        assert_eq!(
            w.build_in_dialog(7, "BYE", 2),
            Some("127.0.0.1:5060".parse().unwrap())
        );
        assert!(!String::from_utf8_lossy(&w.scratch).contains("Route:"));
    }

    #[test]
    fn templates_render_the_documented_messages() {
        let mut w = worker();
        let l = w.io.local_addr().unwrap();
        let r = l; // no --uas: the built-in UAS is the Request-URI
        let (run, t, n) = ("abcd1234", 0usize, 4242u64);
        w.build_invite(n);
        let want = format!(
            "INVITE sip:service@{r} SIP/2.0\r\n\
             Via: SIP/2.0/UDP {l};branch=z9hG4bK-{run}-{t:03}-{n:08}-i;rport\r\n\
             Max-Forwards: 70\r\n\
             From: <sip:ringway@{l}>;tag={t:03}x{n:08}\r\n\
             To: <sip:service@{r}>\r\n\
             Call-ID: {n:08}-{t:03}-{run}@ringway\r\n\
             CSeq: 1 INVITE\r\n\
             Contact: <sip:ringway@{l}>\r\n\
             Content-Type: application/sdp\r\n\
             Content-Length: {len}\r\n\r\n{SDP}",
            len = SDP.len()
        );
        assert_eq!(String::from_utf8_lossy(&w.scratch), want);
        let inv = w.scratch.clone();
        let v = View::parse(&inv).unwrap();
        w.build_response(&v, 180, "Ringing", true);
        let tag = format!("{:016x}", tag_of(v.call_id().unwrap()));
        let want = format!(
            "SIP/2.0 180 Ringing\r\n\
             Via: SIP/2.0/UDP {l};branch=z9hG4bK-{run}-{t:03}-{n:08}-i;rport\r\n\
             From: <sip:ringway@{l}>;tag={t:03}x{n:08}\r\n\
             To: <sip:service@{r}>;tag={tag}\r\n\
             Call-ID: {n:08}-{t:03}-{run}@ringway\r\n\
             CSeq: 1 INVITE\r\n\
             Contact: <sip:service@{l}>\r\n\
             Content-Length: 0\r\n\r\n"
        );
        assert_eq!(String::from_utf8_lossy(&w.scratch), want);
        w.build_response(&v, 200, "OK", true);
        let resp = w.scratch.clone();
        assert!(String::from_utf8_lossy(&resp).ends_with(&format!(
            "Content-Type: application/sdp\r\nContent-Length: {}\r\n\r\n{SDP}",
            SDP.len()
        )));
        let rv = View::parse(&resp).unwrap();
        w.calls.insert(n, confirmed(&rv, Vec::new()));
        w.build_in_dialog(n, "BYE", 2).unwrap();
        let want = format!(
            "BYE sip:service@{l} SIP/2.0\r\n\
             Via: SIP/2.0/UDP {l};branch=z9hG4bK-{run}-{t:03}-{n:08}-b;rport\r\n\
             Max-Forwards: 70\r\n\
             From: <sip:ringway@{l}>;tag={t:03}x{n:08}\r\n\
             To: <sip:service@{r}>;tag={tag}\r\n\
             Call-ID: {n:08}-{t:03}-{run}@ringway\r\n\
             CSeq: 2 BYE\r\n\
             Content-Length: 0\r\n\r\n"
        );
        assert_eq!(String::from_utf8_lossy(&w.scratch), want);
        // Call-IDs: ours map back to the call number, others do not.
        let cid = |s: &str| w.our_call(s.as_bytes());
        assert_eq!(cid(&format!("{n:08}-000-{run}@ringway")), Some(n));
        assert_eq!(
            cid("123456789012-000-abcd1234@ringway"),
            Some(123_456_789_012)
        );
        for other in [
            "00004242-001-abcd1234@ringway",
            "00004242-000-abcd1235@ringway",
            "-000-abcd1234@ringway",
            "12a4-000-abcd1234@ringway",
            "99999999999999999999-000-abcd1234@ringway",
            "x",
        ] {
            assert_eq!(cid(other), None, "{other}");
        }
        let mut d = Vec::new();
        push_dec(&mut d, 0, 3);
        push_dec(&mut d, 7, 1);
        push_dec(&mut d, 123_456, 3);
        push_dec(&mut d, u64::MAX, 8);
        assert_eq!(
            String::from_utf8(d).unwrap(),
            format!("0007123456{}", u64::MAX)
        );
    }

    #[test]
    fn messages_of_a_kind_have_one_length() {
        let mut w = worker();
        let mut lens: Vec<[usize; 5]> = Vec::new();
        for n in [0u64, 7, 4242, 12_345_678] {
            w.build_invite(n);
            let inv = w.scratch.clone();
            let v = View::parse(&inv).unwrap();
            w.build_response(&v, 180, "Ringing", true);
            let l180 = w.scratch.len();
            w.build_response(&v, 200, "OK", true);
            let resp = w.scratch.clone();
            let r = View::parse(&resp).unwrap();
            w.calls.insert(n, confirmed(&r, Vec::new()));
            w.build_in_dialog(n, "ACK", 1).unwrap();
            let ack = w.scratch.len();
            w.build_in_dialog(n, "BYE", 2).unwrap();
            lens.push([inv.len(), l180, resp.len(), ack, w.scratch.len()]);
            assert_eq!(w.our_call(v.call_id().unwrap()), Some(n));
        }
        assert!(lens.iter().all(|l| *l == lens[0]), "{lens:?}");
    }

    #[test]
    fn gso_flush_groups_kinds_in_call_order() {
        let cfg = LoadConfig {
            gso: GsoMode::On,
            ..LoadConfig::default()
        };
        let mut w = Worker::new(&cfg, 0, "abcd1234", Arc::new(Live::default())).unwrap();
        let dst = w.io.local_addr().unwrap();
        // Queued interleaved, as answering two INVITEs and a BYE does.
        for (kind, body) in [
            (Kind::Provisional, "180a"),
            (Kind::InviteOk, "200-a"),
            (Kind::Final, "bye-ok"),
            (Kind::Provisional, "180b"),
            (Kind::InviteOk, "200-b"),
        ] {
            w.scratch = body.as_bytes().to_vec();
            w.send_scratch(dst, kind);
        }
        w.flush();
        let mut rx = RxBatch::new(8, 64);
        let mut got = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(5);
        while got.len() < 5 && Instant::now() < deadline {
            w.io.recv_batch(&mut rx, Some(Duration::from_millis(100)))
                .unwrap();
            got.extend(
                rx.iter()
                    .map(|d| String::from_utf8_lossy(d.data).into_owned()),
            );
        }
        assert_eq!(got, ["180a", "180b", "200-a", "200-b", "bye-ok"]);
        assert_eq!(w.r.msgs_sent, 5);
        let g = w.io.gso_stats();
        assert!(g.enabled);
        assert_eq!((g.trains, g.segments), (2, 4), "{g:?}");
    }
}
