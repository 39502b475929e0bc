//! The TCP relay between the sender's and the receiver's TUN devices: the
//! network emulator and the receiver's "driver" of the SRPIC paper.
//!
//! Forward (sender → receiver): [`Path`] (link rate, loss, Normal delay,
//! output in due order) → [`Coalescer`] (the receiver's interrupt
//! coalescing: arrival times → blocks) → with SRPIC on, every block goes
//! through the sorter (`Srpic::push` per packet with
//! `classify_ipv4_tcp`, `flush_all` at the end of the block, BlockSize
//! and ring-size flushes inside), with SRPIC off it is delivered in
//! arrival order → written to the receiver's TUN device, whose write
//! hands each packet to the receiver's TCP at once. Reverse (receiver →
//! sender): its own [`Path`], then the sender's TUN device.
//!
//! On and off differ in nothing but the sorter: the same seed gives the
//! n-th packet of each direction the same delay and loss draw, and the
//! blocks are the same function of the arrival times (see
//! `tests/srpic_tcp.rs`). The relay counts on the wire what the paper read
//! from Web100 (retransmitted segments sent, duplicate ACKs and SACK
//! blocks handed to the sender) and the RFC 4737 reordering of the data
//! as it arrives at the receiver and as the receiver's stack gets it.
//!
//! [`RelayCore`] is sans-IO (time and packets passed in);
//! [`run_tun_relay`] drives it with two TUN devices.

use super::wire::{DataOrder, WireCounter, WireCounts};
use crate::impair::{BlockHistogram, CoalesceConfig, Coalescer, Path, PathConfig, PathStats};
use ringway_io::tun::{wait_readable, Tun};
use ringway_reorder::{classify_ipv4_tcp, Class, FlowKey, SeqSpace, Srpic, SrpicConfig};
use std::collections::HashMap;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// Relay settings.
#[derive(Copy, Clone, Debug, PartialEq)]
pub struct RelayCoreConfig {
    /// Sender → receiver.
    pub forward: PathConfig,
    /// Receiver → sender.
    pub reverse: PathConfig,
    /// The receiver's interrupt coalescing.
    pub receiver: CoalesceConfig,
    /// SRPIC in the receiver's driver (`None`: off).
    pub srpic: Option<SrpicConfig>,
    /// Connection directions followed by the counters.
    pub max_flows: usize,
    /// Diagnostic, not Listing 1 (off: Listing 1): hand a retransmitted
    /// segment to the sorter as unsuitable ([`Class::Bypass`]: its flow's
    /// held packets first, then the segment), so it keeps its transmission
    /// position instead of going to PrevPacketList ahead of new segments
    /// sent before it. The relay knows a retransmission from what the
    /// sender sent (data below the furthest sent); a receiver's driver
    /// would not (see docs/srpic.md, "Loss with SRPIC: the cause").
    pub retransmissions_in_place: bool,
}

/// What the relay saw and did.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct RelayReport {
    /// Forward path counters.
    pub forward: PathStats,
    /// Reverse path counters.
    pub reverse: PathStats,
    /// Receive blocks of the receiver's coalescing.
    pub blocks: BlockHistogram,
    /// Sorter counters (`None` with SRPIC off).
    pub srpic: Option<ringway_reorder::SrpicStats>,
    /// Counted on what the sender sent (retransmissions).
    pub sent_by_sender: WireCounts,
    /// Counted on what the relay handed the sender (DupAcksIn, SackBlocksRcvd).
    pub to_sender: WireCounts,
    /// Data segments as they arrived at the receiver (before SRPIC):
    /// (segments, RFC 4737 reordered, ratio).
    pub arrival_order: (u64, u64, f64),
    /// Data segments as the receiver's stack got them (after SRPIC).
    pub delivery_order: (u64, u64, f64),
    /// Thread CPU time spent handing blocks to the receiver (sorting and
    /// the receiver kernel's receive path, which runs in the writer's
    /// context), seconds.
    pub receiver_path_cpu_s: f64,
    /// Thread CPU time spent handing ACKs to the sender (the sender
    /// kernel's ACK processing and the transmissions it triggers), seconds.
    pub sender_path_cpu_s: f64,
    /// Lateness of block deliveries against the model's times: p50, p99, max (µs).
    pub late_us: (f64, f64, f64),
    /// Write errors on the TUN devices.
    pub write_errors: u64,
    /// Reads that returned an error.
    pub read_errors: u64,
}

/// The sans-IO relay.
#[derive(Debug)]
pub struct RelayCore {
    fwd: Path<Vec<u8>>,
    rev: Path<Vec<u8>>,
    coal: Coalescer<Vec<u8>>,
    srpic: Option<Srpic<Vec<u8>>>,
    sent_by_sender: WireCounter,
    to_sender: WireCounter,
    arrival_order: DataOrder,
    delivery_order: DataOrder,
    /// With `retransmissions_in_place`: retransmitted segments on the
    /// forward path, (flow, sequence number) → copies (bounded).
    retransmissions: Option<HashMap<(FlowKey, u32), u32>>,
}

/// Most retransmissions tracked at once (beyond, the table is cleared:
/// lost retransmissions never leave it otherwise).
const MAX_TRACKED_RETRANSMISSIONS: usize = 65_536;

/// One delivery decided by [`RelayCore::poll`].
#[derive(Debug)]
pub enum Delivery {
    /// A receive block for the receiver, in arrival order; the driver
    /// passes it through [`RelayCore::receive_block`] (the receiver's
    /// driver: SRPIC or not) and writes the result. `due_ns` is when the
    /// model's drain ended.
    ToReceiver {
        /// When the block is due.
        due_ns: u64,
        /// The packets, in arrival order.
        packets: Vec<Vec<u8>>,
    },
    /// A packet for the sender.
    ToSender(Vec<u8>),
}

impl RelayCore {
    /// A relay with `cfg`.
    pub fn new(cfg: &RelayCoreConfig) -> Self {
        RelayCore {
            fwd: Path::new(cfg.forward),
            rev: Path::new(cfg.reverse),
            coal: Coalescer::new(cfg.receiver),
            srpic: cfg.srpic.map(|c| Srpic::new(c, SeqSpace::U32)),
            sent_by_sender: WireCounter::new(cfg.max_flows),
            to_sender: WireCounter::new(cfg.max_flows),
            arrival_order: DataOrder::new(cfg.max_flows),
            delivery_order: DataOrder::new(cfg.max_flows),
            retransmissions: (cfg.retransmissions_in_place && cfg.srpic.is_some())
                .then(HashMap::new),
        }
    }

    /// A packet the sender sent, read at `now`.
    pub fn from_sender(&mut self, now: u64, pkt: Vec<u8>) {
        let retransmission = self.sent_by_sender.observe(&pkt);
        if let (true, Some(retransmissions)) = (retransmission, self.retransmissions.as_mut()) {
            if let Class::Flow { key, seq, .. } = classify_ipv4_tcp(&pkt) {
                if retransmissions.len() >= MAX_TRACKED_RETRANSMISSIONS {
                    retransmissions.clear();
                }
                *retransmissions.entry((key, seq)).or_default() += 1;
            }
        }
        self.fwd.push(now, pkt.len(), pkt);
    }

    /// A packet the receiver sent, read at `now`.
    pub fn from_receiver(&mut self, now: u64, pkt: Vec<u8>) {
        self.rev.push(now, pkt.len(), pkt);
    }

    /// The receiver's driver: the packets of one receive block in the
    /// order the receiver's stack gets them (sorted by SRPIC when on).
    pub fn receive_block(&mut self, packets: Vec<Vec<u8>>) -> Vec<Vec<u8>> {
        for p in &packets {
            self.arrival_order.observe(p);
        }
        let packets = match &mut self.srpic {
            None => packets,
            Some(s) => {
                let mut sorted = Vec::with_capacity(packets.len());
                for p in packets {
                    let mut class = classify_ipv4_tcp(&p);
                    if let (Class::Flow { key, seq, .. }, Some(retransmissions)) =
                        (class, self.retransmissions.as_mut())
                    {
                        if let Some(count) = retransmissions.get_mut(&(key, seq)) {
                            *count -= 1;
                            if *count == 0 {
                                retransmissions.remove(&(key, seq));
                            }
                            class = Class::Bypass { key };
                        }
                    }
                    s.push(class, p, &mut |x| sorted.push(x));
                }
                s.flush_all(&mut |x| sorted.push(x));
                sorted
            }
        };
        for p in &packets {
            self.delivery_order.observe(p);
        }
        packets
    }

    /// Everything due at `now`: receive blocks whose drain ended and ACKs
    /// that arrived, in that order.
    pub fn poll(&mut self, now: u64, out: &mut impl FnMut(Delivery)) {
        let mut arrived = Vec::new();
        self.fwd.poll(now, &mut |a, p| arrived.push((a, p)));
        let mut blocks = Vec::new();
        for (a, p) in arrived {
            self.coal.push(a, p, &mut |b| blocks.push(b));
        }
        let next = self.fwd.earliest_arrival().map_or(now, |a| a.min(now));
        self.coal.poll(now, Some(next), &mut |b| blocks.push(b));
        for b in blocks {
            out(Delivery::ToReceiver {
                due_ns: b.end_ns,
                packets: b.packets,
            });
        }
        let mut acks = Vec::new();
        self.rev.poll(now, &mut |_, p| acks.push(p));
        for p in acks {
            self.to_sender.observe(&p);
            out(Delivery::ToSender(p));
        }
    }

    /// Deliver everything still inside (end of a run).
    pub fn drain(&mut self, out: &mut impl FnMut(Delivery)) {
        let mut arrived = Vec::new();
        self.fwd.drain(&mut |a, p| arrived.push((a, p)));
        let mut blocks = Vec::new();
        for (a, p) in arrived {
            self.coal.push(a, p, &mut |b| blocks.push(b));
        }
        self.coal.drain(&mut |b| blocks.push(b));
        for b in blocks {
            out(Delivery::ToReceiver {
                due_ns: b.end_ns,
                packets: b.packets,
            });
        }
        let mut acks = Vec::new();
        self.rev.drain(&mut |_, p| acks.push(p));
        for p in acks {
            self.to_sender.observe(&p);
            out(Delivery::ToSender(p));
        }
    }

    /// When `poll` next has something to do.
    pub fn next_deadline(&self) -> Option<u64> {
        [
            self.fwd.next_deadline(),
            self.rev.next_deadline(),
            self.coal.pending_end().map(|e| e + 1),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// The report so far (CPU, lateness and I/O errors are the driver's).
    pub fn report(&self) -> RelayReport {
        RelayReport {
            forward: self.fwd.stats(),
            reverse: self.rev.stats(),
            blocks: self.coal.histogram().clone(),
            srpic: self.srpic.as_ref().map(|s| s.stats()),
            sent_by_sender: self.sent_by_sender.counts(),
            to_sender: self.to_sender.counts(),
            arrival_order: self.arrival_order.summary(),
            delivery_order: self.delivery_order.summary(),
            ..Default::default()
        }
    }
}

/// Drive `core` between the sender's TUN device `sender` and the
/// receiver's `receiver` until `stop` is set or `limit` passes; then
/// deliver what is still inside. One thread does both directions, so the
/// two write paths' CPU times can be told apart.
pub fn run_tun_relay(
    core: &mut RelayCore,
    sender: &Tun,
    receiver: &Tun,
    stop: &AtomicBool,
    limit: Duration,
) -> std::io::Result<RelayReport> {
    let start = Instant::now();
    let now_ns = || start.elapsed().as_nanos() as u64;
    let mut buf = vec![0u8; 65536];
    let fds = [sender.as_raw_fd(), receiver.as_raw_fd()];
    let mut late: Vec<u64> = Vec::new();
    let (mut rx_cpu, mut tx_cpu) = (Duration::ZERO, Duration::ZERO);
    let (mut write_errors, mut read_errors) = (0u64, 0u64);
    let mut deliver = |core: &mut RelayCore,
                       d: Delivery,
                       now: u64,
                       late: &mut Vec<u64>,
                       rx_cpu: &mut Duration,
                       tx_cpu: &mut Duration| {
        match d {
            Delivery::ToReceiver { due_ns, packets } => {
                if late.len() < 1 << 20 {
                    late.push(now.saturating_sub(due_ns));
                }
                // The receiver's share: its driver (sorting or not) and its
                // kernel's receive path (run by the write).
                let cpu_start = ringway_io::thread::thread_cpu_total();
                let packets = core.receive_block(packets);
                for p in &packets {
                    if receiver.write(p).is_err() {
                        write_errors += 1;
                    }
                }
                *rx_cpu += ringway_io::thread::thread_cpu_total().saturating_sub(cpu_start);
            }
            Delivery::ToSender(p) => {
                let cpu_start = ringway_io::thread::thread_cpu_total();
                if sender.write(&p).is_err() {
                    write_errors += 1;
                }
                *tx_cpu += ringway_io::thread::thread_cpu_total().saturating_sub(cpu_start);
            }
        }
    };
    loop {
        if stop.load(Ordering::Relaxed) || start.elapsed() >= limit {
            break;
        }
        // Read what is waiting (bounded per pass), each packet with its own stamp.
        for (i, tun) in [sender, receiver].into_iter().enumerate() {
            for _ in 0..512 {
                match tun.read(&mut buf) {
                    Ok(Some(n)) => {
                        let now_nanos = now_ns();
                        let pkt = buf[..n].to_vec();
                        if i == 0 {
                            core.from_sender(now_nanos, pkt);
                        } else {
                            core.from_receiver(now_nanos, pkt);
                        }
                    }
                    Ok(None) => break,
                    Err(_) => {
                        read_errors += 1;
                        break;
                    }
                }
            }
        }
        let now = now_ns();
        let mut delays = Vec::new();
        core.poll(now, &mut |d| delays.push(d));
        for d in delays {
            deliver(core, d, now, &mut late, &mut rx_cpu, &mut tx_cpu);
        }
        let wait = match core.next_deadline() {
            Some(dl) => {
                Duration::from_nanos(dl.saturating_sub(now_ns())).min(Duration::from_millis(5))
            }
            None => Duration::from_millis(5),
        };
        if !wait.is_zero() {
            wait_readable(&fds, Some(wait))?;
        }
    }
    let mut delays = Vec::new();
    core.drain(&mut |d| delays.push(d));
    let now = now_ns();
    for d in delays {
        deliver(core, d, now, &mut late, &mut rx_cpu, &mut tx_cpu);
    }
    let mut report = core.report();
    late.sort_unstable();
    let quantile = |f: f64| {
        if late.is_empty() {
            f64::NAN
        } else {
            late[((late.len() - 1) as f64 * f) as usize] as f64 / 1e3
        }
    };
    report.late_us = (quantile(0.5), quantile(0.99), quantile(1.0));
    report.receiver_path_cpu_s = rx_cpu.as_secs_f64();
    report.sender_path_cpu_s = tx_cpu.as_secs_f64();
    report.write_errors = write_errors;
    report.read_errors = read_errors;
    Ok(report)
}
