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
//! [`RelayCore`] is sans-IO (time and packets passed in): a
//! [`ForwardCore`] and a [`ReverseCore`] that share nothing, so
//! [`run_tun_relay`] drives each direction on its own thread (one read and
//! one write per packet; the thread CPU clock is read once per pass, not
//! per packet) and reports the lateness of both against the model.

use super::wire::{DataOrder, WireCounter, WireCounts};
use crate::impair::{BlockHistogram, CoalesceConfig, Coalescer, Path, PathConfig, PathStats};
use ringway_io::tun::{wait_readable, Tun};
use ringway_reorder::classify::{inspect_ip, Inspect};
use ringway_reorder::{classify_ipv4_tcp, Class, FlowKey, SeqSpace, Srpic, SrpicConfig};
use std::collections::HashMap;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// Where SRPIC puts a data segment that would sort ahead of segments that
/// reached the receiver before it in the same receive block.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub enum Placement {
    /// Listing 1: by sequence number (a retransmission goes to
    /// PrevPacketList, ahead of new segments sent before it).
    #[default]
    Listing1,
    /// Diagnostic oracle, not Listing 1: the relay knows a retransmission
    /// from what the sender sent (data below the furthest sent) and hands
    /// it to the sorter as unsuitable ([`Class::Bypass`]: its flow's held
    /// packets first, then the segment), so it keeps its transmission
    /// position. A receiver's driver could not know this.
    InPlaceOracle,
    /// **A departure from Listing 1** (the review's proposal for RACK-era
    /// senders): TSval-gated Prev placement, implementable in a receiver's
    /// driver. A segment whose sequence number is below the end of data
    /// its flow already brought in this receive block, and whose TCP
    /// timestamp (TSval) is newer than all of those segments', was sent
    /// after them: a retransmission, not a late original. It is handed to
    /// the sorter as unsuitable ([`Class::Bypass`]) and so keeps its
    /// arrival position. Segments without a timestamps option (TCP
    /// timestamps off), and retransmissions sent within the same TSval
    /// tick as the segments they would overtake, are sorted as Listing 1.
    TsvalGated,
}

impl Placement {
    /// The lab's arm label of SRPIC on with this placement: `on` for
    /// Listing 1 (the paper's), `on-tsval`, `on-in-place`.
    pub fn arm(self) -> &'static str {
        match self {
            Placement::Listing1 => "on",
            Placement::InPlaceOracle => "on-in-place",
            Placement::TsvalGated => "on-tsval",
        }
    }

    /// Every placement.
    pub const ALL: [Placement; 3] = [
        Placement::Listing1,
        Placement::TsvalGated,
        Placement::InPlaceOracle,
    ];

    /// A short label for reports.
    pub fn label(self) -> &'static str {
        match self {
            Placement::Listing1 => "sorted (Listing 1)",
            Placement::InPlaceOracle => "in place (relay's oracle; diagnostic, not Listing 1)",
            Placement::TsvalGated => "TSval-gated (departure from Listing 1)",
        }
    }
}

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
    /// Where SRPIC puts a segment sent after those it would overtake
    /// ([`Placement::Listing1`] is the paper's).
    pub placement: Placement,
}

/// What the relay saw and did.
#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct RelayReport {
    /// Forward path counters.
    pub forward: PathStats,
    /// Reverse path counters.
    pub reverse: PathStats,
    /// Receive blocks of the receiver's coalescing.
    pub blocks: BlockHistogram,
    /// Sorter counters (`None` with SRPIC off).
    pub srpic: Option<ringway_reorder::SrpicStats>,
    /// Segments [`Placement::InPlaceOracle`] or [`Placement::TsvalGated`]
    /// kept in their arrival position instead of sorting them.
    pub kept_in_place: u64,
    /// Counted on what the sender sent (retransmissions).
    pub sent_by_sender: WireCounts,
    /// Counted on what the relay handed the sender (DupAcksIn, SackBlocksRcvd).
    pub to_sender: WireCounts,
    /// Data segments as they arrived at the receiver (before SRPIC):
    /// (segments, RFC 4737 reordered, ratio).
    #[serde(deserialize_with = "crate::stats::nan_or_ratio3")]
    pub arrival_order: (u64, u64, f64),
    /// Data segments as the receiver's stack got them (after SRPIC).
    #[serde(deserialize_with = "crate::stats::nan_or_ratio3")]
    pub delivery_order: (u64, u64, f64),
    /// Thread CPU time spent handing blocks to the receiver (sorting and
    /// the receiver kernel's receive path, which runs in the writer's
    /// context), seconds.
    #[serde(deserialize_with = "crate::stats::nan_or_f64")]
    pub receiver_path_cpu_s: f64,
    /// Thread CPU time spent handing ACKs to the sender (the sender
    /// kernel's ACK processing and the transmissions it triggers), seconds.
    #[serde(deserialize_with = "crate::stats::nan_or_f64")]
    pub sender_path_cpu_s: f64,
    /// Lateness of block deliveries against the model's times: p50, p99, max (µs).
    #[serde(deserialize_with = "crate::stats::nan_or_f64x3")]
    pub late_us: (f64, f64, f64),
    /// Lateness of ACK deliveries to the sender against the model's
    /// arrival times: p50, p99, max (µs).
    #[serde(deserialize_with = "crate::stats::nan_or_f64x3")]
    pub ack_late_us: (f64, f64, f64),
    /// Write errors on the TUN devices.
    pub write_errors: u64,
    /// Reads that returned an error.
    pub read_errors: u64,
}

impl RelayReport {
    /// The worse of the two directions' p99 lateness (µs; NaN when neither
    /// delivered anything).
    pub fn late_p99_us(&self) -> f64 {
        match (self.late_us.1.is_nan(), self.ack_late_us.1.is_nan()) {
            (true, true) => f64::NAN,
            (true, false) => self.ack_late_us.1,
            (false, true) => self.late_us.1,
            (false, false) => self.late_us.1.max(self.ack_late_us.1),
        }
    }
}

/// The forward direction, sans-IO: the emulated path, the receiver's
/// coalescing and its driver (SRPIC or not), with the counters of what
/// the sender sent and of the data order at the receiver.
#[derive(Debug)]
pub struct ForwardCore {
    path: Path<Vec<u8>>,
    coal: Coalescer<Vec<u8>>,
    srpic: Option<Srpic<Vec<u8>>>,
    placement: Placement,
    sent_by_sender: WireCounter,
    arrival_order: DataOrder,
    delivery_order: DataOrder,
    /// With [`Placement::InPlaceOracle`]: retransmitted segments on the
    /// forward path, (flow, sequence number) → copies (bounded).
    retransmissions: HashMap<(FlowKey, u32), u32>,
    /// With [`Placement::TsvalGated`]: per flow, over the receive block so
    /// far, the end of the furthest data and the newest TSval (cleared per
    /// block, so bounded by the ring).
    block_flows: HashMap<FlowKey, (u32, u32)>,
    kept_in_place: u64,
    arrived: Vec<(u64, Vec<u8>)>,
}

/// The reverse direction, sans-IO: the emulated path of the ACKs and the
/// counters of what the sender is handed.
#[derive(Debug)]
pub struct ReverseCore {
    path: Path<Vec<u8>>,
    to_sender: WireCounter,
}

/// The sans-IO relay: both directions.
#[derive(Debug)]
pub struct RelayCore {
    /// Sender → receiver.
    pub forward: ForwardCore,
    /// Receiver → sender.
    pub reverse: ReverseCore,
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

impl ForwardCore {
    /// The forward direction of `cfg`.
    pub fn new(cfg: &RelayCoreConfig) -> Self {
        ForwardCore {
            path: Path::new(cfg.forward),
            coal: Coalescer::new(cfg.receiver),
            srpic: cfg.srpic.map(|c| Srpic::new(c, SeqSpace::U32)),
            placement: if cfg.srpic.is_some() {
                cfg.placement
            } else {
                Placement::Listing1
            },
            sent_by_sender: WireCounter::new(cfg.max_flows),
            arrival_order: DataOrder::new(cfg.max_flows),
            delivery_order: DataOrder::new(cfg.max_flows),
            retransmissions: HashMap::new(),
            block_flows: HashMap::new(),
            kept_in_place: 0,
            arrived: Vec::new(),
        }
    }

    /// A packet the sender sent, read at `now`.
    pub fn from_sender(&mut self, now: u64, pkt: Vec<u8>) {
        let retransmission = self.sent_by_sender.observe(&pkt);
        if retransmission && self.placement == Placement::InPlaceOracle {
            if let Class::Flow { key, seq, .. } = classify_ipv4_tcp(&pkt) {
                if self.retransmissions.len() >= MAX_TRACKED_RETRANSMISSIONS {
                    self.retransmissions.clear();
                }
                *self.retransmissions.entry((key, seq)).or_default() += 1;
            }
        }
        self.path.push(now, pkt.len(), pkt);
    }

    /// The class the sorter is given for `p` under the placement rule.
    fn class_of(&mut self, p: &[u8]) -> Class {
        let class = classify_ipv4_tcp(p);
        let Class::Flow { key, seq, len } = class else {
            return class;
        };
        match self.placement {
            Placement::Listing1 => class,
            Placement::InPlaceOracle => match self.retransmissions.get_mut(&(key, seq)) {
                Some(count) => {
                    *count -= 1;
                    if *count == 0 {
                        self.retransmissions.remove(&(key, seq));
                    }
                    self.kept_in_place += 1;
                    Class::Bypass { key }
                }
                None => class,
            },
            Placement::TsvalGated => {
                let Some(tsval) = tcp_tsval(p) else {
                    return class;
                };
                let space = SeqSpace::U32;
                let end = space.add(seq, len);
                match self.block_flows.get_mut(&key) {
                    None => {
                        self.block_flows.insert(key, (end, tsval));
                        class
                    }
                    Some((max_end, max_tsval)) => {
                        let gated = space.lt(seq, *max_end) && space.lt(*max_tsval, tsval);
                        if space.lt(*max_end, end) {
                            *max_end = end;
                        }
                        if space.lt(*max_tsval, tsval) {
                            *max_tsval = tsval;
                        }
                        if gated {
                            self.kept_in_place += 1;
                            Class::Bypass { key }
                        } else {
                            class
                        }
                    }
                }
            }
        }
    }

    /// The receiver's driver: the packets of one receive block in the
    /// order the receiver's stack gets them (sorted by SRPIC when on).
    pub fn receive_block(&mut self, packets: Vec<Vec<u8>>) -> Vec<Vec<u8>> {
        for p in &packets {
            self.arrival_order.observe(p);
        }
        let packets = if self.srpic.is_none() {
            packets
        } else {
            self.block_flows.clear();
            let mut sorted = Vec::with_capacity(packets.len());
            for p in packets {
                let class = self.class_of(&p);
                let s = self.srpic.as_mut().expect("checked above");
                s.push(class, p, &mut |x| sorted.push(x));
            }
            let s = self.srpic.as_mut().expect("checked above");
            s.flush_all(&mut |x| sorted.push(x));
            sorted
        };
        for p in &packets {
            self.delivery_order.observe(p);
        }
        packets
    }

    /// Receive blocks whose drain ended by `now`, in arrival order, with
    /// the time each was due.
    pub fn poll(&mut self, now: u64, out: &mut impl FnMut(u64, Vec<Vec<u8>>)) {
        let mut arrived = std::mem::take(&mut self.arrived);
        self.path.poll(now, &mut |a, p| arrived.push((a, p)));
        for (a, p) in arrived.drain(..) {
            self.coal.push(a, p, &mut |b| out(b.end_ns, b.packets));
        }
        self.arrived = arrived;
        let next = self.path.earliest_arrival().map_or(now, |a| a.min(now));
        self.coal
            .poll(now, Some(next), &mut |b| out(b.end_ns, b.packets));
    }

    /// Every block still inside (end of a run).
    pub fn drain(&mut self, out: &mut impl FnMut(u64, Vec<Vec<u8>>)) {
        let mut arrived = Vec::new();
        self.path.drain(&mut |a, p| arrived.push((a, p)));
        for (a, p) in arrived {
            self.coal.push(a, p, &mut |b| out(b.end_ns, b.packets));
        }
        self.coal.drain(&mut |b| out(b.end_ns, b.packets));
    }

    /// When `poll` next has something to do.
    pub fn next_deadline(&self) -> Option<u64> {
        [
            self.path.next_deadline(),
            self.coal.pending_end().map(|e| e + 1),
        ]
        .into_iter()
        .flatten()
        .min()
    }
}

impl ReverseCore {
    /// The reverse direction of `cfg`.
    pub fn new(cfg: &RelayCoreConfig) -> Self {
        ReverseCore {
            path: Path::new(cfg.reverse),
            to_sender: WireCounter::new(cfg.max_flows),
        }
    }

    /// A packet the receiver sent, read at `now`.
    pub fn from_receiver(&mut self, now: u64, pkt: Vec<u8>) {
        self.path.push(now, pkt.len(), pkt);
    }

    /// Packets for the sender that arrived by `now`, with their arrival time.
    pub fn poll(&mut self, now: u64, out: &mut impl FnMut(u64, Vec<u8>)) {
        let counter = &mut self.to_sender;
        self.path.poll(now, &mut |a, p| {
            counter.observe(&p);
            out(a, p)
        });
    }

    /// Every packet still inside (end of a run).
    pub fn drain(&mut self, out: &mut impl FnMut(u64, Vec<u8>)) {
        self.poll(u64::MAX, out);
    }

    /// When `poll` next has something to do.
    pub fn next_deadline(&self) -> Option<u64> {
        self.path.next_deadline()
    }
}

impl RelayCore {
    /// A relay with `cfg`.
    pub fn new(cfg: &RelayCoreConfig) -> Self {
        RelayCore {
            forward: ForwardCore::new(cfg),
            reverse: ReverseCore::new(cfg),
        }
    }

    /// A packet the sender sent, read at `now`.
    pub fn from_sender(&mut self, now: u64, pkt: Vec<u8>) {
        self.forward.from_sender(now, pkt);
    }

    /// A packet the receiver sent, read at `now`.
    pub fn from_receiver(&mut self, now: u64, pkt: Vec<u8>) {
        self.reverse.from_receiver(now, pkt);
    }

    /// The receiver's driver (see [`ForwardCore::receive_block`]).
    pub fn receive_block(&mut self, packets: Vec<Vec<u8>>) -> Vec<Vec<u8>> {
        self.forward.receive_block(packets)
    }

    /// Everything due at `now`: receive blocks whose drain ended and ACKs
    /// that arrived, in that order.
    pub fn poll(&mut self, now: u64, out: &mut impl FnMut(Delivery)) {
        self.forward.poll(now, &mut |due_ns, packets| {
            out(Delivery::ToReceiver { due_ns, packets })
        });
        self.reverse
            .poll(now, &mut |_, p| out(Delivery::ToSender(p)));
    }

    /// Deliver everything still inside (end of a run).
    pub fn drain(&mut self, out: &mut impl FnMut(Delivery)) {
        self.forward
            .drain(&mut |due_ns, packets| out(Delivery::ToReceiver { due_ns, packets }));
        self.reverse.drain(&mut |_, p| out(Delivery::ToSender(p)));
    }

    /// When `poll` next has something to do.
    pub fn next_deadline(&self) -> Option<u64> {
        [self.forward.next_deadline(), self.reverse.next_deadline()]
            .into_iter()
            .flatten()
            .min()
    }

    /// The report so far (CPU, lateness and I/O errors are the driver's).
    pub fn report(&self) -> RelayReport {
        let f = &self.forward;
        RelayReport {
            forward: f.path.stats(),
            reverse: self.reverse.path.stats(),
            blocks: f.coal.histogram().clone(),
            srpic: f.srpic.as_ref().map(|s| s.stats()),
            kept_in_place: f.kept_in_place,
            sent_by_sender: f.sent_by_sender.counts(),
            to_sender: self.reverse.to_sender.counts(),
            arrival_order: f.arrival_order.summary(),
            delivery_order: f.delivery_order.summary(),
            ..Default::default()
        }
    }
}

/// The TSval of an IPv4/TCP packet's timestamps option, if it has one.
pub fn tcp_tsval(ip: &[u8]) -> Option<u32> {
    match inspect_ip(ip) {
        Inspect::Tcp(s) => s.tsval,
        _ => None,
    }
}

/// p50, p99 and max of `samples` (ns) in µs, NaN when empty; sorts them.
pub fn lateness_quantiles(samples: &mut [u64]) -> (f64, f64, f64) {
    if samples.is_empty() {
        return (f64::NAN, f64::NAN, f64::NAN);
    }
    samples.sort_unstable();
    let q = |f: f64| samples[((samples.len() - 1) as f64 * f).round() as usize] as f64 / 1e3;
    (q(0.5), q(0.99), q(1.0))
}

/// Most lateness samples kept per direction and run.
const MAX_LATENESS_SAMPLES: usize = 1 << 20;

/// What one direction's thread measured.
#[derive(Default)]
struct DirectionTotals {
    late: Vec<u64>,
    write_cpu: Duration,
    write_errors: u64,
    read_errors: u64,
}

/// Read every packet waiting on `tun` (bounded per pass), each with its
/// own stamp, into `take`.
fn read_pending(
    tun: &Tun,
    buf: &mut [u8],
    now_ns: &impl Fn() -> u64,
    read_errors: &mut u64,
    take: &mut impl FnMut(u64, Vec<u8>),
) {
    for _ in 0..512 {
        match tun.read(buf) {
            Ok(Some(n)) => take(now_ns(), buf[..n].to_vec()),
            Ok(None) => break,
            Err(_) => {
                *read_errors += 1;
                break;
            }
        }
    }
}

/// Sleep on `tun` until it is readable or `deadline` (ns) comes, at most 5 ms.
fn wait_for(tun: &Tun, deadline: Option<u64>, now: u64) -> std::io::Result<()> {
    let wait = deadline.map_or(Duration::from_millis(5), |dl| {
        Duration::from_nanos(dl.saturating_sub(now)).min(Duration::from_millis(5))
    });
    if !wait.is_zero() {
        wait_readable(&[tun.as_raw_fd()], Some(wait))?;
    }
    Ok(())
}

/// One direction of the relay as its thread drives it: the packets it
/// reads go in with [`DirectionCore::take`], what comes due goes out with
/// [`DirectionCore::write_due`].
trait DirectionCore {
    /// What comes due: a receive block (forward) or one ACK (reverse).
    type Due;
    /// A packet read at `now`.
    fn take(&mut self, now: u64, pkt: Vec<u8>);
    /// What is due at `now`, each with the time it was due.
    fn poll_due(&mut self, now: u64, due: &mut Vec<(u64, Self::Due)>);
    /// Everything still inside (end of a run).
    fn drain_due(&mut self, due: &mut Vec<(u64, Self::Due)>);
    /// When `poll_due` next has something to do.
    fn next_deadline(&self) -> Option<u64>;
    /// Write `item` into `to`; the failed writes.
    fn write_due(&mut self, item: Self::Due, to: &Tun) -> u64;
}

/// Forward: blocks into the receiver's device, through the receiver's
/// driver (SRPIC or not), one write per packet (a TUN device takes one
/// packet per write).
impl DirectionCore for ForwardCore {
    type Due = Vec<Vec<u8>>;
    fn take(&mut self, now: u64, pkt: Vec<u8>) {
        self.from_sender(now, pkt);
    }
    fn poll_due(&mut self, now: u64, due: &mut Vec<(u64, Self::Due)>) {
        self.poll(now, &mut |due_ns, packets| due.push((due_ns, packets)));
    }
    fn drain_due(&mut self, due: &mut Vec<(u64, Self::Due)>) {
        self.drain(&mut |due_ns, packets| due.push((due_ns, packets)));
    }
    fn next_deadline(&self) -> Option<u64> {
        ForwardCore::next_deadline(self)
    }
    fn write_due(&mut self, packets: Self::Due, to: &Tun) -> u64 {
        let mut errors = 0;
        for p in self.receive_block(packets) {
            if to.write(&p).is_err() {
                errors += 1;
            }
        }
        errors
    }
}

/// Reverse: ACKs into the sender's device (whose kernel processes them
/// and sends in that write).
impl DirectionCore for ReverseCore {
    type Due = Vec<u8>;
    fn take(&mut self, now: u64, pkt: Vec<u8>) {
        self.from_receiver(now, pkt);
    }
    fn poll_due(&mut self, now: u64, due: &mut Vec<(u64, Self::Due)>) {
        self.poll(now, &mut |arrival, p| due.push((arrival, p)));
    }
    fn drain_due(&mut self, due: &mut Vec<(u64, Self::Due)>) {
        self.drain(&mut |arrival, p| due.push((arrival, p)));
    }
    fn next_deadline(&self) -> Option<u64> {
        ReverseCore::next_deadline(self)
    }
    fn write_due(&mut self, packet: Self::Due, to: &Tun) -> u64 {
        u64::from(to.write(&packet).is_err())
    }
}

/// Write what is due into `to`, with each item's lateness against the
/// model at `now`. The thread CPU clock is read once per pass with
/// deliveries.
fn deliver<C: DirectionCore>(
    core: &mut C,
    to: &Tun,
    due: &mut Vec<(u64, C::Due)>,
    now: u64,
    totals: &mut DirectionTotals,
) {
    if due.is_empty() {
        return;
    }
    let cpu_start = ringway_io::thread::thread_cpu_total();
    for (due_ns, item) in due.drain(..) {
        if totals.late.len() < MAX_LATENESS_SAMPLES {
            totals.late.push(now.saturating_sub(due_ns));
        }
        totals.write_errors += core.write_due(item, to);
    }
    totals.write_cpu += ringway_io::thread::thread_cpu_total().saturating_sub(cpu_start);
}

/// One direction's thread: reads `from`, writes what comes due into `to`
/// (forward: the sender's device to the receiver's; reverse: the other
/// way), until `running` says stop; then delivers what is still inside.
fn direction_loop<C: DirectionCore>(
    core: &mut C,
    from: &Tun,
    to: &Tun,
    running: &impl Fn() -> bool,
    now_ns: &impl Fn() -> u64,
) -> std::io::Result<DirectionTotals> {
    let mut totals = DirectionTotals::default();
    let mut buf = vec![0u8; 65536];
    let mut due = Vec::new();
    let mut read_errors = 0;
    while running() {
        read_pending(from, &mut buf, now_ns, &mut read_errors, &mut |t, p| {
            core.take(t, p)
        });
        let now = now_ns();
        core.poll_due(now, &mut due);
        deliver(core, to, &mut due, now, &mut totals);
        wait_for(from, core.next_deadline(), now_ns())?;
    }
    core.drain_due(&mut due);
    deliver(core, to, &mut due, now_ns(), &mut totals);
    totals.read_errors = read_errors;
    Ok(totals)
}

/// Drive `core` between the sender's TUN device `sender` and the
/// receiver's `receiver` until `stop` is set or `limit` passes; then
/// deliver what is still inside. One thread per direction (the forward
/// thread's write CPU is the receiver's path, the reverse thread's the
/// sender's); each reports its lateness against the model.
pub fn run_tun_relay(
    core: &mut RelayCore,
    sender: &Tun,
    receiver: &Tun,
    stop: &AtomicBool,
    limit: Duration,
) -> std::io::Result<RelayReport> {
    let start = Instant::now();
    let now_ns = || start.elapsed().as_nanos() as u64;
    let running = || !stop.load(Ordering::Relaxed) && start.elapsed() < limit;
    let (forward, reverse) = (&mut core.forward, &mut core.reverse);
    let (fwd, rev) = std::thread::scope(|s| {
        let fwd = s.spawn(|| direction_loop(forward, sender, receiver, &running, &now_ns));
        let rev = direction_loop(reverse, receiver, sender, &running, &now_ns);
        let fwd = fwd
            .join()
            .unwrap_or_else(|_| Err(std::io::Error::other("the forward relay thread panicked")));
        (fwd, rev)
    });
    let (mut fwd, mut rev) = (fwd?, rev?);
    let mut report = core.report();
    report.late_us = lateness_quantiles(&mut fwd.late);
    report.ack_late_us = lateness_quantiles(&mut rev.late);
    report.receiver_path_cpu_s = fwd.write_cpu.as_secs_f64();
    report.sender_path_cpu_s = rev.write_cpu.as_secs_f64();
    report.write_errors = fwd.write_errors + rev.write_errors;
    report.read_errors = fwd.read_errors + rev.read_errors;
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lateness_quantiles_of_known_samples() {
        // 1..=100 µs: p50 is the 50th/51st sample (index 49.5 rounds to 50 → 51 µs),
        // p99 index 98.01 → 99 µs, max 100 µs.
        let mut samples: Vec<u64> = (1..=100).rev().map(|us| us * 1000).collect();
        assert_eq!(lateness_quantiles(&mut samples), (51.0, 99.0, 100.0));
        let mut one = vec![2500u64];
        assert_eq!(lateness_quantiles(&mut one), (2.5, 2.5, 2.5));
        let (a, b, c) = lateness_quantiles(&mut []);
        assert!(a.is_nan() && b.is_nan() && c.is_nan());
        let report = RelayReport {
            late_us: (1.0, 700.0, 900.0),
            ack_late_us: (1.0, 1200.0, 1300.0),
            ..Default::default()
        };
        assert_eq!(report.late_p99_us(), 1200.0);
        let acks_only = RelayReport {
            late_us: (f64::NAN, f64::NAN, f64::NAN),
            ack_late_us: (1.0, 30.0, 40.0),
            ..Default::default()
        };
        assert_eq!(acks_only.late_p99_us(), 30.0);
    }
}
