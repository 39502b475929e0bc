//! Offline analysis of a capture: reordering metrics per flow before and
//! after SRPIC sorting, with receive batches formed from capture timestamps
//! (packets whose timestamps fall within `batch_ns` of the batch's first
//! packet form one batch; the sorter flushes all managers at each batch end).

use crate::classify::{ipv4_tcp, ipv6_tcp, rtp_seq};
use crate::key::FlowKey;
use crate::metrics::{ranks, rfc4737, rfc5236, Rfc4737, Rfc5236};
use crate::pcap::{ip_of, udp_of, Frame};
use crate::seq::{SeqSpace, Unwrapper};
use crate::sorter::{Class, Srpic, SrpicConfig};
use std::collections::HashMap;
use std::fmt::Write as _;

/// One packet of a trace.
#[derive(Copy, Clone, Debug)]
pub struct Rec {
    /// Capture time in nanoseconds.
    pub ts_ns: u64,
    /// Index into [`Trace::flows`].
    pub flow: u32,
    /// Sorter class (a `Flow` class carries the sequence number).
    pub class: Class,
    /// Sequence number unwrapped in capture order (for `Flow` packets).
    pub ext_seq: i64,
}

/// A flow of a trace.
#[derive(Clone, Debug)]
pub struct FlowInfo {
    /// Human-readable identity, e.g. `tcp 10.0.0.1:5001 > 10.0.0.2:80`.
    pub name: String,
    /// Sequence space (TCP: U32, RTP: U16).
    pub space: SeqSpace,
}

/// Packets of a capture reduced to what the sorter and the metrics need.
#[derive(Clone, Debug, Default)]
pub struct Trace {
    /// Flows in order of first appearance.
    pub flows: Vec<FlowInfo>,
    /// Packets in capture order.
    pub recs: Vec<Rec>,
    /// Frames that were neither TCP nor RTP-over-UDP (or undecodable).
    pub skipped: u64,
}

fn addr_str(a: &[u8]) -> String {
    match a.len() {
        4 => std::net::Ipv4Addr::new(a[0], a[1], a[2], a[3]).to_string(),
        16 => {
            let mut octets = [0u8; 16];
            octets.copy_from_slice(a);
            format!("[{}]", std::net::Ipv6Addr::from(octets))
        }
        _ => "?".into(),
    }
}

impl Trace {
    /// Build a trace from captured frames: TCP segments (IPv4/IPv6) and
    /// UDP datagrams whose payload looks like RTP v2.
    pub fn from_frames(frames: &[Frame<'_>]) -> Trace {
        let mut trace = Trace::default();
        let mut index: HashMap<(bool, FlowKey), (u32, Unwrapper)> = HashMap::new();
        for f in frames {
            let Some((ver, ip)) = ip_of(f) else {
                trace.skipped += 1;
                continue;
            };
            let tcp = if ver == 4 { ipv4_tcp(ip) } else { ipv6_tcp(ip) };
            let (is_tcp, key, class, name) = if let Some(seg) = tcp {
                let (src, dst, header_len) = if ver == 4 {
                    (&ip[12..16], &ip[16..20], (ip[0] & 0x0f) as usize * 4)
                } else {
                    (&ip[8..24], &ip[24..40], 40)
                };
                let ports = (
                    u16::from_be_bytes([ip[header_len], ip[header_len + 1]]),
                    u16::from_be_bytes([ip[header_len + 2], ip[header_len + 3]]),
                );
                let name = format!(
                    "tcp {}:{} > {}:{}",
                    addr_str(src),
                    ports.0,
                    addr_str(dst),
                    ports.1
                );
                (true, seg.key, seg.class(), name)
            } else if let Some(udp) = udp_of(ver, ip) {
                let Some((ssrc, seq)) = rtp_seq(udp.payload) else {
                    trace.skipped += 1;
                    continue;
                };
                let Some(key) = FlowKey::from_parts(&[
                    udp.src,
                    udp.dst,
                    &udp.sport.to_be_bytes(),
                    &udp.dport.to_be_bytes(),
                    &ssrc.to_be_bytes(),
                ]) else {
                    trace.skipped += 1;
                    continue;
                };
                let name = format!(
                    "rtp ssrc={ssrc:#010x} {}:{} > {}:{}",
                    addr_str(udp.src),
                    udp.sport,
                    addr_str(udp.dst),
                    udp.dport
                );
                let class = Class::Flow {
                    key,
                    seq: seq as u32,
                    len: 1,
                };
                (false, key, class, name)
            } else {
                trace.skipped += 1;
                continue;
            };
            let flow_id = trace.flows.len() as u32;
            let space = if is_tcp { SeqSpace::U32 } else { SeqSpace::U16 };
            let (flow, unwrapper) = index.entry((is_tcp, key)).or_insert_with(|| {
                trace.flows.push(FlowInfo { name, space });
                (flow_id, Unwrapper::new(space))
            });
            let ext_seq = match class {
                Class::Flow { seq, .. } => unwrapper.unwrap(seq),
                _ => 0,
            };
            trace.recs.push(Rec {
                ts_ns: f.ts_ns,
                flow: *flow,
                class,
                ext_seq,
            });
        }
        trace
    }

    /// The delivery order (indices into `recs`) after SRPIC with `cfg`,
    /// flushing at the end of every `batch_ns` receive batch.
    pub fn srpic_order(&self, cfg: SrpicConfig, batch_ns: u64) -> Vec<u32> {
        let mut tcp: Srpic<u32> = Srpic::new(cfg, SeqSpace::U32);
        let mut rtp: Srpic<u32> = Srpic::new(cfg, SeqSpace::U16);
        let mut out = Vec::with_capacity(self.recs.len());
        let mut batch_start: Option<u64> = None;
        for (i, r) in self.recs.iter().enumerate() {
            if let Some(start) = batch_start {
                if r.ts_ns.saturating_sub(start) > batch_ns {
                    tcp.flush_all(&mut |x| out.push(x));
                    rtp.flush_all(&mut |x| out.push(x));
                    batch_start = None;
                }
            }
            batch_start.get_or_insert(r.ts_ns);
            let space = match self.flows[r.flow as usize].space {
                SeqSpace::U32 => &mut tcp,
                SeqSpace::U16 => &mut rtp,
            };
            space.push(r.class, i as u32, &mut |x| out.push(x));
        }
        tcp.flush_all(&mut |x| out.push(x));
        rtp.flush_all(&mut |x| out.push(x));
        out
    }

    /// Metrics per flow (index = flow) for the delivery order `order`.
    pub fn metrics(&self, order: &[u32], dt: u64) -> Vec<(Rfc4737, Rfc5236)> {
        let mut per: Vec<Vec<i64>> = vec![Vec::new(); self.flows.len()];
        for &i in order {
            let record = &self.recs[i as usize];
            if matches!(record.class, Class::Flow { .. }) {
                per[record.flow as usize].push(record.ext_seq);
            }
        }
        per.iter()
            .map(|s| {
                let rank = ranks(s);
                (rfc4737(&rank), rfc5236(&rank, dt))
            })
            .collect()
    }
}

/// Options of [`report`].
#[derive(Clone, Debug)]
pub struct AnalyzeOpts {
    /// Block sizes to evaluate.
    pub blocks: Vec<usize>,
    /// Receive-batch window in nanoseconds.
    pub batch_ns: u64,
    /// Ring size (global flush threshold).
    pub ring_size: usize,
    /// RFC 5236 displacement threshold.
    pub dt: u64,
}

/// Metrics of one configuration (capture order, or SRPIC with a block size).
#[derive(Clone, Debug)]
pub struct Variant {
    /// `None` for the capture order, else the SRPIC block size.
    pub block: Option<usize>,
    /// Per-flow metrics.
    pub flows: Vec<(Rfc4737, Rfc5236)>,
    /// All flows merged.
    pub total: (Rfc4737, Rfc5236),
}

/// Compute the capture-order metrics and the SRPIC metrics for each block size.
pub fn analyze(t: &Trace, o: &AnalyzeOpts) -> Vec<Variant> {
    let mut variants = Vec::new();
    let capture: Vec<u32> = (0..t.recs.len() as u32).collect();
    let mut blocks: Vec<Option<usize>> = vec![None];
    blocks.extend(o.blocks.iter().map(|b| Some(*b)));
    for b in blocks {
        let order = match b {
            None => capture.clone(),
            Some(bs) => t.srpic_order(
                SrpicConfig {
                    block_size: bs,
                    ring_size: o.ring_size,
                    max_flows: t.flows.len().max(1),
                    idle_flushes: u32::MAX,
                },
                o.batch_ns,
            ),
        };
        let flows = t.metrics(&order, o.dt);
        let mut total = (Rfc4737::default(), Rfc5236::default());
        for (a, b) in &flows {
            total.0.merge(a);
            total.1.merge(b);
        }
        variants.push(Variant {
            block: b,
            flows,
            total,
        });
    }
    variants
}

fn row(out: &mut String, label: &str, a: &Rfc4737, b: &Rfc5236) {
    let _ = writeln!(
        out,
        "  {:<12} {:>8} {:>9.5} {:>8.2} {:>6} {:>9.5} {:>8.4} {:>8.3}",
        label,
        a.received,
        a.ratio(),
        a.extent_mean(),
        a.extent_max(),
        a.n_ratio(3),
        b.rd0(),
        b.rbd_mean()
    );
}

/// Human-readable report of [`analyze`].
pub fn report(t: &Trace, o: &AnalyzeOpts, v: &[Variant]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{} packets, {} flows, {} frames skipped (not TCP or RTP/UDP)",
        t.recs.len(),
        t.flows.len(),
        t.skipped
    );
    let _ = writeln!(
        out,
        "SRPIC batches: packets whose capture timestamps fall within {} us of a batch's first packet form one receive batch (flush all at its end); ring size {}; RFC 5236 DT = {}",
        o.batch_ns as f64 / 1000.0,
        o.ring_size,
        o.dt
    );
    let hdr = format!(
        "  {:<12} {:>8} {:>9} {:>8} {:>6} {:>9} {:>8} {:>8}",
        "order", "pkts", "reord", "ext_avg", "ext_mx", "3-reord", "RD[0]", "RBD_avg"
    );
    let label = |block: Option<usize>| match block {
        None => "capture".to_string(),
        Some(block) => format!("srpic b={block}"),
    };
    for (fi, f) in t.flows.iter().enumerate() {
        let _ = writeln!(out, "flow {}: {}", fi, f.name);
        let _ = writeln!(out, "{hdr}");
        for var in v {
            let (rfc4737, rfc5236) = &var.flows[fi];
            row(&mut out, &label(var.block), rfc4737, rfc5236);
        }
    }
    let _ = writeln!(out, "all flows:");
    let _ = writeln!(out, "{hdr}");
    for var in v {
        row(&mut out, &label(var.block), &var.total.0, &var.total.1);
    }
    let _ = writeln!(
        out,
        "(reord: RFC 4737 reordered ratio; ext: reordering extent; 3-reord: 3-reordering ratio; RD[0]: RFC 5236 share of packets in place; RBD_avg: mean reorder-buffer occupancy)"
    );
    out
}
