//! The SFU's forwarding engine: one receive batch through the sans-IO core
//! ([`ringway_sfu::Sfu`]), verified media optionally sorted by SRPIC first,
//! every packet's copies handed to the backend as soon as it is handled,
//! and the paper's delay measured per packet.
//!
//! **Delay, per packet** (all from application-side CLOCK_MONOTONIC stamps
//! except (d)):
//! * pickup: the engine starts handling the packet (one stamp per packet);
//! * (a) *scheduled*: pickup → its last copy is queued for transmission
//!   where the kernel will send it without more work by the application
//!   (the paper's "scheduled": AF_XDP — descriptor published in the TX
//!   ring; socket/mmsg/io_uring — the send call carrying it returned);
//! * (b) *handoff*: pickup → the kernel took its last copy (AF_XDP: consumed
//!   from the TX ring after the kick; others: the same moment as (a));
//! * (c) *wait*: application receive (the backend's per-datagram stamp) →
//!   pickup, the time the packet waited behind others of its batch;
//! * (d) *kdelay*: kernel RX stamp (SO_TIMESTAMPING, or the XDP program's
//!   `bpf_ktime_get_ns`) → the kernel took its last copy, on the kernel
//!   stamp's clock (CLOCK_REALTIME).
//!
//! **Flushing.** A packet's copies are never held behind later packets for
//! longer than the policy allows: [`Flush::Packet`] hands them over after
//! every packet (one kernel crossing per packet for AF_XDP and mmsg, the
//! paper's Table I), [`Flush::Adaptive`] when the receive batch is done or
//! the oldest unsent copy is older than a bound (tens of µs), [`Flush::Batch`] once per
//! receive batch (the old behaviour).

use super::{Flush, FRAME};
use crate::metrics::compact_latency_histogram;
use hdrhistogram::Histogram;
use ringway_io::{monotonic_now, realtime_now, BatchIo, Nanos, RxBatch, TxBatch, TxProgress};
use ringway_reorder::{Class, Srpic};
use ringway_sfu::{Action, Sfu, SfuStats};
use std::collections::VecDeque;
use std::io;
use std::net::SocketAddr;

/// Counters the engine publishes while it runs (for live statistics and
/// `/metrics`), every tick (50 ms).
#[derive(Clone, Debug, Default)]
pub struct LiveStats {
    /// Core counters.
    pub sfu: SfuStats,
    /// Bytes received by the engine.
    pub rx_bytes: u64,
    /// Bytes sent by the engine.
    pub tx_bytes: u64,
    /// Truncated datagrams dropped.
    pub truncated: u64,
    /// Rooms and their client counts.
    pub rooms: Vec<(String, usize)>,
    /// Backend counters.
    pub io: ringway_io::IoStats,
    /// Backend name.
    pub backend: String,
    /// Engine thread CPU time since start (s); `None` if the kernel did not tell.
    pub engine_cpu_s: Option<f64>,
    /// Packets the recorder's full channel dropped so far (`None`: not
    /// recording).
    pub record_queue_drops: Option<u64>,
    /// The warm-up is over: the final report counts from here (these live
    /// counters stay cumulative).
    pub measuring: bool,
    /// Times the engine loop published (once per tick): it moves while the
    /// loop turns, what the systemd watchdog checks.
    pub ticks: u64,
    /// Per engine, when there is one per receive queue (empty with one
    /// engine); the fields above are their sums plus the control thread's.
    pub engines: Vec<super::queues::EngineLive>,
}

/// The engine's and the backend's counters at the end of the warm-up: the
/// report subtracts them, so that every counter it uses covers the
/// measured window only (review B4). The live counters stay cumulative.
#[derive(Clone, Debug, Default)]
pub(super) struct Baseline {
    pub(super) io: ringway_io::IoStats,
    pub(super) fanout: Option<ringway_io::backend::FanoutStats>,
    pub(super) rx_bytes: u64,
    pub(super) tx_bytes: u64,
    pub(super) truncated: u64,
    pub(super) rx_errors: u64,
    pub(super) flushes: u64,
}

/// What an engine asks per datagram: the whole core ([`Sfu`], one engine)
/// or a receive queue's view of the routes ([`super::queues::QueueCore`],
/// one engine per queue).
pub(super) trait Forwarding {
    /// What to do with `data` from `peer` at `now`; `None`: handed to
    /// another thread (the control thread), nothing to send here.
    fn forward(&mut self, now: u64, peer: SocketAddr, data: &[u8]) -> Option<Action<'_>>;
    /// Whether `data` from `peer` is media from a verified source (what
    /// SRPIC may give a flow slot).
    fn is_verified_media(&self, peer: SocketAddr, data: &[u8]) -> bool;
}

impl Forwarding for Sfu {
    fn forward(&mut self, now: u64, peer: SocketAddr, data: &[u8]) -> Option<Action<'_>> {
        Some(self.handle(now, peer, data))
    }
    fn is_verified_media(&self, peer: SocketAddr, data: &[u8]) -> bool {
        Sfu::is_verified_media(self, peer, data)
    }
}

/// What an engine measured over the measured window (the warm-up's
/// counters subtracted), for the report; several engines' add up.
pub(super) struct Measured {
    pub(super) delays: Delays,
    pub(super) rx_bytes: u64,
    pub(super) tx_bytes: u64,
    pub(super) truncated: u64,
    pub(super) rx_errors: u64,
    pub(super) forwarded: u64,
    pub(super) copies: u64,
    pub(super) flushes: u64,
}

impl Measured {
    /// Nothing measured yet.
    pub(super) fn empty() -> Measured {
        Measured {
            delays: Delays::new(),
            rx_bytes: 0,
            tx_bytes: 0,
            truncated: 0,
            rx_errors: 0,
            forwarded: 0,
            copies: 0,
            flushes: 0,
        }
    }

    /// Add another engine's measurements (histograms merged).
    pub(super) fn add(&mut self, other: &Measured) {
        let delays = &mut self.delays;
        // Same bounds and precision on both sides: adding cannot fail.
        let _ = delays.scheduled.add(&other.delays.scheduled);
        let _ = delays.handoff.add(&other.delays.handoff);
        let _ = delays.wait.add(&other.delays.wait);
        let _ = delays.kernel.add(&other.delays.kernel);
        self.rx_bytes += other.rx_bytes;
        self.tx_bytes += other.tx_bytes;
        self.truncated += other.truncated;
        self.rx_errors += other.rx_errors;
        self.forwarded += other.forwarded;
        self.copies += other.copies;
        self.flushes += other.flushes;
    }
}

/// The engine's clocks; tests give it a fake one.
pub(super) trait Clock: Send {
    /// CLOCK_MONOTONIC now (application-side stamps).
    fn monotonic(&self) -> Nanos;
    /// CLOCK_REALTIME now (the kernel RX stamps' clock).
    fn realtime(&self) -> Nanos;
}

/// The system clocks.
pub(super) struct SystemClock;

impl Clock for SystemClock {
    fn monotonic(&self) -> Nanos {
        monotonic_now()
    }
    fn realtime(&self) -> Nanos {
        realtime_now()
    }
}

/// The four per-packet delays (ns histograms).
pub(super) struct Delays {
    /// (a) pickup → last copy queued for transmission.
    pub(super) scheduled: Histogram<u64>,
    /// (b) pickup → last copy taken by the kernel.
    pub(super) handoff: Histogram<u64>,
    /// (c) application receive → pickup.
    pub(super) wait: Histogram<u64>,
    /// (d) kernel RX stamp → last copy taken by the kernel.
    pub(super) kernel: Histogram<u64>,
}

impl Delays {
    fn new() -> Delays {
        // Four are recorded per packet: compact ones (cache misses of
        // recording into 3-digit histograms showed in the engine's profile).
        Delays {
            scheduled: compact_latency_histogram(),
            handoff: compact_latency_histogram(),
            wait: compact_latency_histogram(),
            kernel: compact_latency_histogram(),
        }
    }
}

/// A forwarded packet whose last copy the kernel has not taken yet.
#[derive(Copy, Clone, Debug)]
struct InFlight {
    /// Copies given to the backend up to and including this packet's last.
    seq: u64,
    /// Monotonic pickup stamp.
    pickup: u64,
    /// When its last copy was queued (a), once it was.
    queued_at: Option<u64>,
    /// Kernel RX stamp (CLOCK_REALTIME).
    kernel_rx: Option<Nanos>,
}

/// The forwarding engine: one receive batch in, the copies out.
pub(super) struct Engine<F: Forwarding = Sfu> {
    pub(super) sfu: F,
    pub(super) rx: RxBatch,
    tx: TxBatch,
    order: Vec<usize>,
    dsts: Vec<SocketAddr>,
    pub(super) srpic: Option<Srpic<usize>>,
    flush: Flush,
    /// Adaptive flush: longest a copy may wait unsent (ns).
    max_age_ns: u64,
    clock: Box<dyn Clock>,
    /// Copies given to the backend so far (replies included).
    pushed: u64,
    /// Copies given to the backend up to the last flush.
    flushed: u64,
    /// Pickup stamp of the oldest packet with copies not yet flushed.
    oldest_unflushed: Option<u64>,
    in_flight: VecDeque<InFlight>,
    /// Highest sequence number already marked queued: `resolve` starts
    /// after it, so a long in-flight list (a stalled AF_XDP TX ring) is not
    /// walked again for every packet.
    marked_queued: u64,
    pub(super) delays: Delays,
    pub(super) rx_bytes: u64,
    pub(super) tx_bytes: u64,
    pub(super) truncated: u64,
    pub(super) rx_errors: u64,
    pub(super) forwarded: u64,
    pub(super) copies: u64,
    /// Flushes (hand-overs to the kernel) made.
    pub(super) flushes: u64,
    /// The recorder's channel, when recording.
    pub(super) record: Option<super::recorder::RecordTx>,
}

impl<F: Forwarding> Engine<F> {
    pub(super) fn new(
        sfu: F,
        batch: usize,
        srpic: Option<Srpic<usize>>,
        flush: Flush,
        max_age_ns: u64,
        clock: Box<dyn Clock>,
    ) -> Engine<F> {
        Engine {
            sfu,
            rx: RxBatch::new(batch, FRAME),
            tx: TxBatch::new(256, FRAME),
            order: Vec::with_capacity(batch),
            dsts: Vec::new(),
            srpic,
            flush,
            max_age_ns,
            clock,
            pushed: 0,
            flushed: 0,
            oldest_unflushed: None,
            in_flight: VecDeque::new(),
            marked_queued: 0,
            delays: Delays::new(),
            rx_bytes: 0,
            tx_bytes: 0,
            truncated: 0,
            rx_errors: 0,
            forwarded: 0,
            copies: 0,
            flushes: 0,
            record: None,
        }
    }

    /// Forget the delays measured so far (end of the warm-up) and return
    /// the counters to subtract at the end (`io` and `fanout`: the
    /// backend's and the in-kernel fan-out's now).
    pub(super) fn reset_measurements(
        &mut self,
        io: ringway_io::IoStats,
        fanout: Option<ringway_io::backend::FanoutStats>,
    ) -> Baseline {
        self.delays = Delays::new();
        self.forwarded = 0;
        self.copies = 0;
        Baseline {
            io,
            fanout,
            rx_bytes: self.rx_bytes,
            tx_bytes: self.tx_bytes,
            truncated: self.truncated,
            rx_errors: self.rx_errors,
            flushes: self.flushes,
        }
    }

    /// What it measured since the end of the warm-up (`base`); the delays
    /// move out (the engine keeps empty histograms).
    pub(super) fn measured(&mut self, base: &Baseline) -> Measured {
        Measured {
            delays: std::mem::replace(&mut self.delays, Delays::new()),
            rx_bytes: self.rx_bytes - base.rx_bytes,
            tx_bytes: self.tx_bytes - base.tx_bytes,
            truncated: self.truncated - base.truncated,
            rx_errors: self.rx_errors - base.rx_errors,
            forwarded: self.forwarded,
            copies: self.copies,
            flushes: self.flushes - base.flushes,
        }
    }

    /// Handle the datagrams of the current receive batch.
    pub(super) fn handle_batch(&mut self, io: &mut dyn BatchIo, now: u64) -> io::Result<()> {
        let count = self.rx.len();
        self.order.clear();
        if let Some(sorter) = self.srpic.as_mut() {
            // Only media from a verified source takes a flow slot of the
            // sorter; everything else passes through in place (and is then
            // dropped or answered by the core).
            let order = &mut self.order;
            let mut out = |index: usize| order.push(index);
            for index in 0..count {
                let datagram = self.rx.get(index).expect("held");
                let class = if self
                    .sfu
                    .is_verified_media(datagram.meta.peer, datagram.data)
                {
                    classify(datagram.meta.peer, datagram.data)
                } else {
                    Class::PassThrough
                };
                sorter.push(class, index, &mut out);
            }
            sorter.flush_all(&mut out);
        } else {
            self.order.extend(0..count);
        }
        for position in 0..self.order.len() {
            let index = self.order[position];
            self.handle_one(io, now, index)?;
        }
        if self.pushed > self.flushed {
            self.flush_now(io)?;
        }
        Ok(())
    }

    /// Handle datagram `i` of the batch: pickup, core, copies, flush policy.
    fn handle_one(&mut self, io: &mut dyn BatchIo, now: u64, index: usize) -> io::Result<()> {
        let pickup = self.clock.monotonic().0;
        let datagram = self.rx.get(index).expect("held");
        self.rx_bytes += datagram.meta.len as u64;
        if datagram.meta.truncated {
            self.truncated += 1;
            return Ok(());
        }
        let (peer, kernel_rx) = (datagram.meta.peer, datagram.meta.kernel_rx);
        let received = self.rx.received_at(index).0;
        let Engine {
            sfu,
            rx,
            tx,
            dsts,
            record,
            clock,
            ..
        } = self;
        let data = rx.get(index).expect("held").data;
        match sfu.forward(now, peer, data) {
            Some(Action::Forward {
                ssid,
                targets,
                echo,
                ..
            }) => {
                if let Some(recorder) = record {
                    recorder.offer(ssid, clock.realtime().0, data);
                }
                dsts.clear();
                dsts.extend_from_slice(targets);
                dsts.extend(echo);
                if dsts.is_empty() {
                    return Ok(());
                }
                io.replicate(Some(index), data, dsts, tx)?;
            }
            Some(Action::Reply { dst, msg }) => {
                io.replicate(None, msg, &[dst], tx)?;
                self.pushed += 1;
                self.tx_bytes += msg.len() as u64;
                self.oldest_unflushed.get_or_insert(pickup);
                return self.after_queue(io);
            }
            // Dropped (counted by the core), or handed to the control thread.
            Some(Action::Drop(_)) | None => return Ok(()),
        }
        let count = self.dsts.len();
        self.forwarded += 1;
        self.copies += count as u64;
        self.pushed += count as u64;
        self.tx_bytes += (count * data_len(&self.rx, index)) as u64;
        let _ = self
            .delays
            .wait
            .record(pickup.saturating_sub(received).max(1));
        self.in_flight.push_back(InFlight {
            seq: self.pushed,
            pickup,
            queued_at: None,
            kernel_rx,
        });
        self.oldest_unflushed.get_or_insert(pickup);
        self.after_queue(io)
    }

    /// After copies were queued: note what the backend scheduled, and
    /// flush if the policy says so.
    fn after_queue(&mut self, io: &mut dyn BatchIo) -> io::Result<()> {
        if let Some(progress) = io.tx_progress() {
            let now = self.clock.monotonic().0;
            self.resolve(now, Some(progress));
        }
        let flush = match self.flush {
            Flush::Batch => false,
            Flush::Packet => true,
            Flush::Adaptive => self
                .oldest_unflushed
                .is_some_and(|o| self.clock.monotonic().0.saturating_sub(o) >= self.max_age_ns),
        };
        if flush || self.tx.is_full() {
            self.flush_now(io)?;
        }
        Ok(())
    }

    /// Hand what is queued to the kernel and record what it took.
    pub(super) fn flush_now(&mut self, io: &mut dyn BatchIo) -> io::Result<()> {
        io.flush(&mut self.tx)?;
        self.flushes += 1;
        self.flushed = self.pushed;
        self.oldest_unflushed = None;
        let now = self.clock.monotonic().0;
        self.resolve(now, io.tx_progress());
        Ok(())
    }

    /// Packets whose last copy is now queued (a) and taken by the kernel
    /// (b, d), as of monotonic time `t`; `progress` `None`: everything
    /// flushed is both.
    fn resolve(&mut self, t: u64, progress: Option<TxProgress>) {
        let (queued, handed) = match progress {
            Some(p) => (p.queued, p.handed),
            None => (self.flushed, self.flushed),
        };
        let start = self
            .in_flight
            .partition_point(|packet| packet.seq <= self.marked_queued);
        for packet in self.in_flight.range_mut(start..) {
            if packet.seq > queued {
                break;
            }
            packet.queued_at.get_or_insert(t);
            self.marked_queued = packet.seq;
        }
        let mut real = None;
        while let Some(packet) = self.in_flight.front().copied() {
            if packet.seq > handed {
                break;
            }
            self.in_flight.pop_front();
            let queued_at = packet.queued_at.unwrap_or(t);
            let _ = self
                .delays
                .scheduled
                .record(queued_at.saturating_sub(packet.pickup).max(1));
            let _ = self
                .delays
                .handoff
                .record(t.saturating_sub(packet.pickup).max(1));
            if let Some(kernel_rx_at) = packet.kernel_rx {
                let now = *real.get_or_insert_with(|| self.clock.realtime());
                let _ = self
                    .delays
                    .kernel
                    .record(now.saturating_since(kernel_rx_at).max(1));
            }
        }
    }

    /// Copies the kernel has not taken yet.
    pub(super) fn pending(&self) -> bool {
        !self.in_flight.is_empty() || self.pushed > self.flushed
    }
}

fn data_len(rx: &RxBatch, i: usize) -> usize {
    rx.get(i).map_or(0, |d| d.data.len())
}

/// SRPIC classification of a datagram: RTP flows keyed by (source address,
/// SSRC, payload type), so a sender cannot join another's flow by its SSRC.
fn classify(src: SocketAddr, data: &[u8]) -> Class {
    let addr = match src.ip() {
        std::net::IpAddr::V4(a) => a.to_ipv6_mapped().octets(),
        std::net::IpAddr::V6(a) => a.octets(),
    };
    match ringway_sfu::RtpPacket::new_checked(data) {
        Ok(p) => Class::Flow {
            key: ringway_reorder::FlowKey::from_parts(&[
                &addr,
                &src.port().to_be_bytes(),
                &p.ssrc().to_be_bytes(),
                &[p.payload_type()],
            ])
            .expect("23 bytes fit a flow key"),
            seq: p.seq() as u32,
            len: 1,
        },
        Err(_) => Class::PassThrough,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ringway_io::testing::MemIo;
    use ringway_io::{BackendKind, RxMeta};
    use ringway_reorder::{SeqSpace, SrpicConfig};
    use ringway_sfu::client::{parse_reply, Reply, Requests, Session};
    use ringway_sfu::wire::{write_rtp, RtpHeader};
    use ringway_sfu::SfuConfig;
    use ringway_sfu::{MediaType, RtpPacket, Selector};
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;

    /// Realtime = monotonic + this (the fake clocks' offset).
    const REAL_OFFSET: u64 = 1_000_000_000_000;

    /// A clock that moves only when the fake backend says so.
    #[derive(Clone, Default)]
    struct FakeClock(Arc<AtomicU64>);

    impl FakeClock {
        fn advance(&self, ns: u64) {
            self.0.fetch_add(ns, Ordering::SeqCst);
        }
        fn now(&self) -> u64 {
            self.0.load(Ordering::SeqCst)
        }
    }

    impl Clock for FakeClock {
        fn monotonic(&self) -> Nanos {
            Nanos(self.now())
        }
        fn realtime(&self) -> Nanos {
            Nanos(self.now() + REAL_OFFSET)
        }
    }

    /// A backend with known costs on the fake clock. `ring: false`: a
    /// socket-like backend (copies go with the send call, 2 µs each).
    /// `ring: true`: an AF_XDP-like one — `replicate` writes each copy into
    /// a ring (0.1 µs each) and publishes it, `flush` kicks and the kernel
    /// takes at most `take_per_kick` copies (2 µs each).
    fn mem_io(clock: &FakeClock, ring: bool) -> MemIo {
        let kind = if ring {
            BackendKind::Xdp
        } else {
            BackendKind::Socket
        };
        let mut io =
            MemIo::new(kind, SocketAddr::from(([127, 0, 0, 1], 5004))).charging(clock.0.clone());
        io.queue_ns = 100;
        io.send_ns = 2000;
        io
    }

    fn put(e: &mut Engine, peer: SocketAddr, data: &[u8], received: u64, kernel: Option<u64>) {
        let f = e.rx.next_frame_mut().expect("room");
        f[..data.len()].copy_from_slice(data);
        e.rx.commit_received(
            RxMeta {
                peer,
                len: data.len(),
                truncated: false,
                kernel_rx: kernel.map(|k| Nanos(k + REAL_OFFSET)),
                app_rx: Nanos(received + REAL_OFFSET),
            },
            Nanos(received),
        );
    }

    fn rtp(ssrc: u32, m: MediaType, seq: u16) -> Vec<u8> {
        let mut b = vec![0u8; 64];
        let h = RtpHeader {
            payload_type: m.payload_type(),
            marker: false,
            seq,
            timestamp: 0,
            ssrc,
        };
        let n = write_rtp(&mut b, &h, None, 40).unwrap();
        b.truncate(n);
        b
    }

    fn addr(p: u16) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], p))
    }

    /// One control exchange through the engine; the reply.
    fn control(e: &mut Engine, io: &mut MemIo, from: SocketAddr, msg: &[u8]) -> Reply {
        e.rx.clear();
        put(e, from, msg, io.now(), None);
        e.handle_batch(io, 0).unwrap();
        let reply = io.sent().last().expect("a reply");
        assert_eq!(reply.dst, from);
        parse_reply(&reply.bytes).expect("a control reply")
    }

    /// Register `peers` (cookie exchange included) and subscribe each to all.
    fn setup(e: &mut Engine, io: &mut MemIo, peers: &[SocketAddr]) -> Vec<Session> {
        let mut reqs = Requests::default();
        let mut out = Vec::new();
        for &a in peers {
            let Reply::Challenge(_, cookie) = control(e, io, a, &reqs.register().1) else {
                panic!("no challenge")
            };
            let Reply::Ack(_, s) = control(e, io, a, &reqs.register_with(&cookie).1) else {
                panic!("register failed")
            };
            out.push(s);
        }
        for (&a, &s) in peers.iter().zip(&out) {
            let r = control(e, io, a, &reqs.subscribe(s, &[Selector::ALL], false).1);
            assert!(matches!(r, Reply::Ack(..)));
        }
        io.take_sent();
        io.hand_all_to_kernel();
        out
    }

    fn engine(flush: Flush, clock: &FakeClock) -> Engine {
        let sfu = Sfu::new(SfuConfig::default());
        let mut e = Engine::new(sfu, 64, None, flush, 20_000, Box::new(clock.clone()));
        e.reset_measurements(Default::default(), None);
        e
    }

    /// An engine flushing by `flush` with three peers on `io`, each
    /// registered and subscribed to all; its receive batch is empty.
    fn engine_with_three_peers(
        flush: Flush,
        clock: &FakeClock,
        io: &mut MemIo,
    ) -> (Engine, [SocketAddr; 3], Vec<Session>) {
        let mut e = engine(flush, clock);
        let peers = [addr(1), addr(2), addr(3)];
        let sessions = setup(&mut e, io, &peers);
        e.rx.clear();
        (e, peers, sessions)
    }

    /// Audio packets `seqs` of stream `ssrc` from `peer` into the receive
    /// batch, received at `received` (kernel stamp `kernel`).
    fn put_audio(
        e: &mut Engine,
        peer: SocketAddr,
        ssrc: u32,
        seqs: std::ops::Range<u16>,
        received: u64,
        kernel: Option<u64>,
    ) {
        for seq in seqs {
            let packet = rtp(ssrc, MediaType::Asq, seq);
            put(e, peer, &packet, received, kernel);
        }
    }

    /// Every sample of `h` is `want` (within the histogram's resolution).
    fn assert_all(h: &Histogram<u64>, want: u64, what: &str) {
        assert!(!h.is_empty(), "{what}: no samples");
        assert!(
            h.equivalent(h.min(), want) && h.equivalent(h.max(), want),
            "{what}: samples {}..{}, want {want}",
            h.min(),
            h.max()
        );
    }

    /// Three packets received together by one receive call (app receive
    /// stamp 1000, kernel stamp 400), each copied to 2 subscribers and
    /// echoed (3 copies), on a socket-like backend (2 µs per copy in the
    /// send call): with per-packet flush each packet's (a) = (b) = its own
    /// 3 copies, and (c) grows by the packets before it.
    #[test]
    fn per_packet_delays_with_known_stamps() {
        let clock = FakeClock::default();
        clock.advance(5000);
        let mut io = mem_io(&clock, false);
        let (mut e, peers, s) = engine_with_three_peers(Flush::Packet, &clock, &mut io);
        let t0 = clock.now();
        put_audio(
            &mut e,
            peers[0],
            s[0].ssid,
            0..3,
            t0 - 4000,
            Some(t0 - 4600),
        );
        e.handle_batch(&mut io, 1).unwrap();
        assert_eq!(io.sent().len(), 9);
        let d = &e.delays;
        assert_eq!(d.scheduled.len(), 3);
        assert_all(&d.scheduled, 6000, "3 copies × 2 µs");
        assert_all(&d.handoff, 6000, "d.handoff");
        // (c): 4000, 10000, 16000 — each waits for the ones before it.
        assert!(d.wait.equivalent(d.wait.min(), 4000));
        assert!(d.wait.equivalent(d.wait.max(), 16000));
        assert!(d.wait.equivalent(d.wait.value_at_quantile(0.5), 10000));
        // (d): kernel stamp 4600 before t0 → handed 6, 12, 18 µs after t0.
        assert!(d.kernel.equivalent(d.kernel.min(), 10600));
        assert!(d.kernel.equivalent(d.kernel.max(), 22600));
    }

    /// The same batch flushed once per batch: every packet is charged the
    /// whole batch's copies (the old measurement's effect, now only when
    /// asked for).
    #[test]
    fn batch_flush_charges_the_whole_batch() {
        let clock = FakeClock::default();
        let mut io = mem_io(&clock, false);
        let (mut e, peers, s) = engine_with_three_peers(Flush::Batch, &clock, &mut io);
        let t0 = clock.now();
        put_audio(&mut e, peers[0], s[0].ssid, 0..3, t0, None);
        e.handle_batch(&mut io, 1).unwrap();
        assert_all(&e.delays.scheduled, 18000, "e.delays.scheduled");
        assert_all(&e.delays.wait, 1, "no time passed before any pickup");
        assert_eq!(e.delays.kernel.len(), 0, "no kernel stamps: no samples");
    }

    /// A ring backend: (a) ends when the copies are in the ring (0.1 µs
    /// each), (b) when the kernel took them after the kick (2 µs each); a
    /// packet whose copies the kernel did not take yet is not recorded
    /// until it does.
    #[test]
    fn ring_backend_scheduled_before_handoff() {
        let clock = FakeClock::default();
        let mut io = mem_io(&clock, true);
        let (mut e, peers, s) = engine_with_three_peers(Flush::Packet, &clock, &mut io);
        let t0 = clock.now();
        put(
            &mut e,
            peers[1],
            &rtp(s[1].ssid, MediaType::Vsq, 7),
            t0,
            Some(t0),
        );
        e.handle_batch(&mut io, 1).unwrap();
        assert_all(&e.delays.scheduled, 300, "e.delays.scheduled");
        assert_all(&e.delays.handoff, 300 + 6000, "e.delays.handoff");
        assert_all(&e.delays.kernel, 6300, "e.delays.kernel");
        // The kernel takes one copy per kick: the packet stays in flight
        // (not counted) until a later flush hands its last copy over.
        io.take_per_kick = 1;
        e.rx.clear();
        put(
            &mut e,
            peers[1],
            &rtp(s[1].ssid, MediaType::Vsq, 8),
            clock.now(),
            None,
        );
        e.handle_batch(&mut io, 1).unwrap();
        assert_eq!(e.delays.scheduled.len(), 1, "not handed over yet");
        assert!(e.pending());
        clock.advance(10_000); // the engine was busy elsewhere
        e.flush_now(&mut io).unwrap();
        assert_eq!(e.delays.scheduled.len(), 1);
        e.flush_now(&mut io).unwrap();
        assert_eq!(e.delays.scheduled.len(), 2);
        assert!(!e.pending());
        // (a) still 300 ns: it was scheduled long before it was handed over.
        assert_all(&e.delays.scheduled, 300, "e.delays.scheduled");
        assert!(e
            .delays
            .handoff
            .equivalent(e.delays.handoff.max(), 300 + 3 * 2000 + 10_000));
    }

    /// Adaptive flush: copies wait for later packets of the batch at most
    /// the bound (20 µs), then go.
    #[test]
    fn adaptive_flush_bounds_the_wait() {
        let clock = FakeClock::default();
        let mut io = mem_io(&clock, false);
        io.send_ns = 0;
        let (mut e, peers, s) = engine_with_three_peers(Flush::Adaptive, &clock, &mut io);
        let t0 = clock.now();
        put_audio(&mut e, peers[0], s[0].ssid, 0..6, t0, None);
        // Every packet's replicate costs 8 µs here.
        let before = e.flushes;
        io.replicate_call_ns = 8000;
        e.handle_batch(&mut io, 1).unwrap();
        // Flushed when the oldest unsent copy reached 20 µs: after packets
        // 3 (24 µs) and 6 (48 µs, also the end of the batch).
        assert_eq!(e.flushes - before, 2);
        assert_eq!(io.sent().len(), 18);
        assert!(e
            .delays
            .scheduled
            .equivalent(e.delays.scheduled.max(), 24_000));
        assert!(e
            .delays
            .scheduled
            .equivalent(e.delays.scheduled.min(), 8_000));
    }

    /// Register a sender and a subscriber, then forward one batch of
    /// out-of-order packets of two streams; returns the subscriber's seqs per type.
    fn forward_shuffled(srpic: bool) -> Vec<(u8, u16)> {
        let sorter = srpic.then(|| {
            Srpic::new(
                SrpicConfig {
                    block_size: 32,
                    ring_size: 64,
                    ..Default::default()
                },
                SeqSpace::U16,
            )
        });
        let sfu = Sfu::new(SfuConfig {
            echo: false,
            ..Default::default()
        });
        let clock = FakeClock::default();
        let mut e = Engine::new(
            sfu,
            64,
            sorter,
            Flush::Batch,
            20_000,
            Box::new(clock.clone()),
        );
        let mut io = mem_io(&clock, false);
        let (tx_addr, rx_addr) = (addr(1000), addr(2000));
        let sessions = setup(&mut e, &mut io, &[tx_addr, rx_addr]);
        e.rx.clear();
        let ssid = sessions[0].ssid;
        for (m, s) in [
            (MediaType::Asq, 3),
            (MediaType::Vsq, 11),
            (MediaType::Asq, 1),
            (MediaType::Asq, 2),
            (MediaType::Vsq, 10),
            (MediaType::Asq, 4),
        ] {
            put(&mut e, tx_addr, &rtp(ssid, m, s), 0, None);
        }
        // Spoofed packets (other address, other SSRCs) in the same batch.
        for k in 0..8u16 {
            put(
                &mut e,
                addr(3000 + k),
                &rtp(0xdead + u32::from(k), MediaType::Asq, k),
                0,
                None,
            );
        }
        e.handle_batch(&mut io, 1).unwrap();
        if let Some(s) = &e.srpic {
            // Only the verified sender's two streams took flow slots.
            assert_eq!(s.stats().flows, 2);
        }
        let sent = io.sent();
        assert!(sent.iter().all(|datagram| datagram.dst == rx_addr));
        sent.iter()
            .map(|datagram| {
                let p = RtpPacket::new_checked(&datagram.bytes).unwrap();
                (p.payload_type(), p.seq())
            })
            .collect()
    }

    #[test]
    fn srpic_sorts_each_verified_stream_within_a_batch() {
        let per_type = |v: &[(u8, u16)], pt: u8| -> Vec<u16> {
            v.iter().filter(|x| x.0 == pt).map(|x| x.1).collect()
        };
        let plain = forward_shuffled(false);
        assert_eq!(per_type(&plain, 96), vec![3, 1, 2, 4]);
        assert_eq!(per_type(&plain, 97), vec![11, 10]);
        let sorted = forward_shuffled(true);
        assert_eq!(sorted.len(), 6);
        assert_eq!(per_type(&sorted, 96), vec![1, 2, 3, 4]);
        assert_eq!(per_type(&sorted, 97), vec![10, 11]);
    }
}
