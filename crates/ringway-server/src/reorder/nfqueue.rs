//! SRPIC in front of a host's own TCP: `ringway reorder nfqueue`.
//!
//! The kernel queues packets matched by an xtables rule such as
//! `iptables -t raw -A PREROUTING -p tcp -j NFQUEUE --queue-num N --queue-bypass`
//! (`--queue-bypass`: when no program is bound to queue N the packets
//! pass, so the host fails open when ringway is not running). Every drain
//! of the queue (all packets waiting when the program wakes, optionally
//! topped up for `coalesce_us` after the first one, the role of a NIC's
//! interrupt coalescing delay) is one SRPIC block: each packet goes
//! through the sorter (`classify` on its IP/TCP headers; malformed and
//! unsuitable packets pass through at once and are counted), then
//! `flush_all`; the verdicts (NF_ACCEPT, never a drop) are issued one per
//! packet in the sorter's output order, several per `send`. The kernel
//! reinjects packets in verdict order, so TCP sees the sorted order.
//!
//! Bounded: the sorter holds at most `ring` packets and `max_flows`
//! flows (further flows pass through); the kernel queue holds at most
//! `max_len` packets and accepts beyond that (fail-open flag).

use ringway_io::nfqueue::{NfQueue, NfQueueConfig, NfQueueStats, Verdict};
use ringway_reorder::metrics::ReorderMeter;
use ringway_reorder::{inspect_ip, Class, Inspect, SeqSpace, Srpic, SrpicConfig, SrpicStats};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// Settings of the NFQUEUE sorter.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct NfqSortConfig {
    /// Queue number of the rule.
    pub queue: u16,
    /// SRPIC BlockSize.
    pub block: usize,
    /// SRPIC Ringbuffer_Size (also the most packets taken per drain).
    pub ring: usize,
    /// Most flows sorted at once.
    pub max_flows: usize,
    /// Keep receiving for this long after the first packet of a drain (µs; 0: no wait).
    pub coalesce_us: u64,
    /// Sort (false: verdicts in arrival order, for comparison).
    pub sort: bool,
    /// Stop after this long (`None`: until the stop flag).
    pub duration: Option<Duration>,
    /// Kernel queue length.
    pub max_len: u32,
}

impl Default for NfqSortConfig {
    fn default() -> Self {
        NfqSortConfig {
            queue: 0,
            block: 32,
            ring: 512,
            max_flows: 4096,
            coalesce_us: 0,
            sort: true,
            duration: None,
            max_len: 4096,
        }
    }
}

/// RFC 4737 reordering of data segments at one point.
#[derive(Copy, Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct OrderSummary {
    /// Data segments seen.
    pub segments: u64,
    /// Reordered singletons.
    pub reordered: u64,
    /// reordered / segments.
    pub ratio: f64,
}

/// What a run did.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct NfqSortReport {
    /// Packets received from the queue.
    pub packets: u64,
    /// Drains (blocks).
    pub batches: u64,
    /// Packets the sorter held (not released by the call that gave it
    /// the packet: they waited for their block to fill or end).
    pub held: u64,
    /// Packets released in a different position than they arrived.
    pub sorted: u64,
    /// Packets released at once (malformed, not TCP, unsuitable, table full).
    pub passed_through: u64,
    /// Of those: not well-formed IP/TCP.
    pub malformed: u64,
    /// Of those: well-formed but not TCP.
    pub not_tcp: u64,
    /// Of those: TCP but unsuitable (SYN/FIN/RST, options, pure ACKs, ...).
    pub unsuitable: u64,
    /// Most packets the sorter held at once.
    pub held_max: usize,
    /// Data order as queued (before the verdicts).
    pub before: OrderSummary,
    /// Data order as released (verdict order).
    pub after: OrderSummary,
    /// Sorter counters.
    pub srpic: SrpicStats,
    /// Queue and verdict counters.
    pub queue: NfQueueStats,
}

/// An item the sorter carries: the packet id and what the meters need.
#[derive(Copy, Clone, Debug)]
struct Item {
    id: u32,
    pos: u32,
    seg: Option<(ringway_reorder::FlowKey, u32, u32)>,
}

fn summary(m: &ReorderMeter) -> OrderSummary {
    OrderSummary {
        segments: m.received,
        reordered: m.reordered,
        ratio: m.ratio(),
    }
}

/// The order of the segments before and after the sorter.
struct Meters {
    before: ReorderMeter,
    after: ReorderMeter,
}

/// Receive up to `ring - batch.len()` packets into `batch`, waiting at most
/// `timeout`, and count those the sorter cannot order.
fn receive_into(
    queue: &mut NfQueue,
    timeout: Duration,
    ring: usize,
    batch: &mut Vec<(Class, Item)>,
    report: &mut NfqSortReport,
) -> std::io::Result<usize> {
    let room = ring - batch.len();
    queue.recv_batch(Some(timeout), room, |packet| {
        let inspected = inspect_ip(packet.payload);
        let seg = match inspected {
            Inspect::Tcp(segment) if segment.payload_len > 0 => {
                Some((segment.key, segment.seq, segment.payload_len))
            }
            _ => None,
        };
        match inspected {
            Inspect::Malformed => report.malformed += 1,
            Inspect::NotTcp => report.not_tcp += 1,
            Inspect::Tcp(_) => {
                if !matches!(inspected.class(), Class::Flow { .. }) {
                    report.unsuitable += 1;
                }
            }
        }
        let item = Item {
            id: packet.id,
            pos: batch.len() as u32,
            seg,
        };
        batch.push((inspected.class(), item));
    })
}

/// Put `batch` through the sorter and accept every packet it lets out, in
/// its order; the first failed verdict send, to retry.
fn sort_and_accept(
    batch: &[(Class, Item)],
    sorter: &mut Srpic<Item>,
    out: &mut Vec<Item>,
    meters: &mut Meters,
    report: &mut NfqSortReport,
    queue: &mut NfQueue,
) -> Option<std::io::Error> {
    out.clear();
    for &(class, item) in batch {
        if let Some((key, seq, len)) = item.seg {
            meters.before.observe(key, seq, len);
        }
        let released = out.len();
        sorter.push(class, item, &mut |sorted| out.push(sorted));
        // Not among what this push released: the sorter holds it back.
        if !out[released..].iter().any(|sorted| sorted.pos == item.pos) {
            report.held += 1;
        }
    }
    sorter.flush_all(&mut |sorted| out.push(sorted));
    let mut send_error = None;
    for (index, item) in out.iter().enumerate() {
        if item.pos as usize != index {
            report.sorted += 1;
        }
        if let Some((key, seq, len)) = item.seg {
            meters.after.observe(key, seq, len);
        }
        // A failed send keeps its verdicts queued: go on giving every
        // held packet its verdict, then retry (review S24).
        if let Err(err) = queue.verdict(item.id, Verdict::Accept) {
            send_error.get_or_insert(err);
        }
    }
    send_error
}

/// Bind the queue (so that packets stop bypassing it), then call
/// `bound`, then sort until `stop` is set or the duration passes.
/// `progress` gets the report every second.
pub fn run(
    cfg: &NfqSortConfig,
    stop: &AtomicBool,
    bound: impl FnOnce(),
    mut progress: impl FnMut(&NfqSortReport),
) -> std::io::Result<NfqSortReport> {
    let mut queue = NfQueue::open(NfQueueConfig {
        max_len: cfg.max_len,
        ..NfQueueConfig::new(cfg.queue)
    })?;
    bound();
    let ring = cfg.ring.max(1);
    let mut sorter: Srpic<Item> = Srpic::new(
        SrpicConfig {
            block_size: if cfg.sort { cfg.block } else { 1 },
            ring_size: ring,
            max_flows: cfg.max_flows,
            idle_flushes: 64,
        },
        SeqSpace::U32,
    );
    let mut meters = Meters {
        before: ReorderMeter::new(SeqSpace::U32, cfg.max_flows),
        after: ReorderMeter::new(SeqSpace::U32, cfg.max_flows),
    };
    let mut report = NfqSortReport::default();
    let start = Instant::now();
    let mut last_progress = start;
    let mut batch: Vec<(Class, Item)> = Vec::with_capacity(ring);
    let mut out: Vec<Item> = Vec::with_capacity(ring);
    loop {
        if stop.load(Ordering::Relaxed)
            || cfg.duration.is_some_and(|limit| start.elapsed() >= limit)
        {
            break;
        }
        batch.clear();
        receive_into(
            &mut queue,
            Duration::from_millis(50),
            ring,
            &mut batch,
            &mut report,
        )?;
        if batch.is_empty() {
            continue;
        }
        if cfg.coalesce_us > 0 {
            let until = Instant::now() + Duration::from_micros(cfg.coalesce_us);
            while batch.len() < ring {
                let left = until.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    break;
                }
                receive_into(&mut queue, left, ring, &mut batch, &mut report)?;
            }
        }
        report.batches += 1;
        report.packets += batch.len() as u64;
        let send_error = sort_and_accept(
            &batch,
            &mut sorter,
            &mut out,
            &mut meters,
            &mut report,
            &mut queue,
        );
        flush_with_retries(&mut queue, send_error)?;
        if last_progress.elapsed() >= Duration::from_secs(1) {
            last_progress = Instant::now();
            fill(&mut report, &sorter, &queue, &meters.before, &meters.after);
            progress(&report);
        }
    }
    let mut rest = Vec::new();
    sorter.flush_all(&mut |item| rest.push(item));
    let mut send_error = None;
    for item in rest {
        if let Err(err) = queue.verdict(item.id, Verdict::Accept) {
            send_error.get_or_insert(err);
        }
    }
    flush_with_retries(&mut queue, send_error)?;
    fill(&mut report, &sorter, &queue, &meters.before, &meters.after);
    Ok(report)
}

/// Send the queued verdicts, retrying a failed send a few times (1, 2, 4,
/// 8 ms apart) before giving up: a packet without a verdict is dropped when
/// the queue closes, even with `--queue-bypass` (which only lets *new*
/// packets pass). `earlier`: a send that already failed on this batch.
fn flush_with_retries(q: &mut NfQueue, earlier: Option<std::io::Error>) -> std::io::Result<()> {
    let mut last = earlier;
    for attempt in 0..5u32 {
        if attempt > 0 {
            std::thread::sleep(Duration::from_millis(1 << (attempt - 1)));
        }
        match q.flush_verdicts() {
            Ok(()) => return Ok(()),
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| std::io::Error::other("verdict send failed")))
}

fn fill(
    rep: &mut NfqSortReport,
    sorter: &Srpic<Item>,
    q: &NfQueue,
    before: &ReorderMeter,
    after: &ReorderMeter,
) {
    let st = sorter.stats();
    rep.srpic = st;
    rep.held_max = st.held_max;
    rep.passed_through = st.passed_through;
    rep.queue = q.stats();
    rep.before = summary(before);
    rep.after = summary(after);
}
