//! Client-side logic without I/O: RTP stream generation, control requests
//! and replies, and receive statistics (loss, reordering, RTT, one-way delay).

use crate::wire::{
    self, Control, ErrorCode, MediaType, MsgType, RtpHeader, RtpPacket, Selector, RTP_HEADER_LEN,
    SEND_TIME_EXT_LEN,
};
use hdrhistogram::Histogram;
use std::collections::BTreeMap;

/// Generates one RTP stream (one source SSID, one media type).
#[derive(Clone, Debug)]
pub struct StreamGen {
    /// Source SSID (the SSRC).
    pub ssid: u32,
    /// Media type.
    pub media: MediaType,
    /// Packet size in bytes (at least header + send-time extension).
    pub size: usize,
    /// Sending interval (ns).
    pub interval_ns: u64,
    seq: u16,
    ts: u32,
}

impl StreamGen {
    /// A stream starting at sequence number `first_seq`.
    pub fn new(ssid: u32, media: MediaType, size: usize, interval_ns: u64, first_seq: u16) -> Self {
        StreamGen {
            ssid,
            media,
            size: size.max(RTP_HEADER_LEN + SEND_TIME_EXT_LEN),
            interval_ns,
            seq: first_seq,
            ts: 0,
        }
    }
    /// Write the next packet into `buf` stamped with `send_time` (ns);
    /// returns its length (`None` if `buf` is too small).
    pub fn next_packet(&mut self, buf: &mut [u8], send_time: u64) -> Option<usize> {
        let h = RtpHeader {
            payload_type: self.media.payload_type(),
            marker: false,
            seq: self.seq,
            timestamp: self.ts,
            ssrc: self.ssid,
        };
        let n = wire::write_rtp(buf, &h, Some(send_time), self.size)?;
        self.seq = self.seq.wrapping_add(1);
        let step = self.media.clock_rate() as u64 * self.interval_ns / 1_000_000_000;
        self.ts = self.ts.wrapping_add(step as u32);
        Some(n)
    }
    /// Packets generated so far modulo 2^16 (the next sequence number).
    pub fn next_seq(&self) -> u16 {
        self.seq
    }
}

/// Tracks one received stream's sequence numbers.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct SeqTracker {
    /// Packets received (duplicates included).
    pub received: u64,
    /// Packets that arrived after a higher sequence number (late/out of order).
    pub reordered: u64,
    /// Packets whose sequence number was already seen as the highest (exact repeats of the max).
    pub duplicates: u64,
    first: i64,
    max: i64,
    started: bool,
}

impl SeqTracker {
    /// Record sequence number `seq`.
    pub fn record(&mut self, seq: u16) {
        self.received += 1;
        if !self.started {
            self.started = true;
            self.first = seq as i64;
            self.max = seq as i64;
            return;
        }
        // Extend to the value nearest to the current maximum.
        let base = self.max & !0xffff;
        let mut ext = base | seq as i64;
        if ext - self.max > 0x8000 {
            ext -= 0x1_0000;
        } else if self.max - ext > 0x8000 {
            ext += 0x1_0000;
        }
        match ext.cmp(&self.max) {
            std::cmp::Ordering::Greater => self.max = ext,
            std::cmp::Ordering::Less => {
                self.reordered += 1;
                if ext < self.first {
                    self.first = ext;
                }
            }
            std::cmp::Ordering::Equal => self.duplicates += 1,
        }
    }
    /// Packets expected from first to highest sequence number seen.
    pub fn expected(&self) -> u64 {
        if self.started {
            (self.max - self.first + 1) as u64
        } else {
            0
        }
    }
    /// Expected minus received (never negative).
    pub fn lost(&self) -> u64 {
        self.expected()
            .saturating_sub(self.received - self.duplicates)
    }
}

/// Summary of one received stream.
#[derive(Clone, Debug, serde::Serialize)]
pub struct StreamSummary {
    /// Source SSID.
    pub ssrc: u32,
    /// Media type name (or `pt<N>`).
    pub media: String,
    /// Packets received.
    pub packets: u64,
    /// Bytes received.
    pub bytes: u64,
    /// Lost (expected − received).
    pub lost: u64,
    /// Late / out-of-order packets.
    pub reordered: u64,
}

/// Percentiles of a latency histogram, in microseconds.
#[derive(Copy, Clone, Debug, Default, serde::Serialize)]
pub struct Percentiles {
    /// Samples.
    pub count: u64,
    /// Median (µs).
    pub p50_us: f64,
    /// 90th percentile (µs).
    pub p90_us: f64,
    /// 99th percentile (µs).
    pub p99_us: f64,
    /// Maximum (µs).
    pub max_us: f64,
}

impl Percentiles {
    /// From a histogram of nanoseconds.
    pub fn of(h: &Histogram<u64>) -> Self {
        if h.is_empty() {
            return Percentiles::default();
        }
        let us = |v: u64| v as f64 / 1000.0;
        Percentiles {
            count: h.len(),
            p50_us: us(h.value_at_quantile(0.50)),
            p90_us: us(h.value_at_quantile(0.90)),
            p99_us: us(h.value_at_quantile(0.99)),
            max_us: us(h.max()),
        }
    }
}

/// A latency histogram in ns (1 ns .. 100 s, 3 significant digits).
pub fn latency_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 100_000_000_000, 3).expect("valid histogram bounds")
}

/// Receive-side statistics of a client (all its sockets together).
#[derive(Debug)]
pub struct RxStats {
    own: Vec<u32>,
    streams: BTreeMap<(u32, u8), (SeqTracker, u64)>,
    merged: BTreeMap<(u32, u8), [u64; 4]>,
    merged_media: (u64, u64, u64),
    /// RTT of echoed own packets (ns).
    pub rtt: Histogram<u64>,
    /// One-way delay of other sources' packets (ns; same-host clocks only).
    pub owd: Histogram<u64>,
    /// Datagrams received.
    pub rx_packets: u64,
    /// Bytes received.
    pub rx_bytes: u64,
    /// Echoes of own packets.
    pub echoes: u64,
    /// Control replies received.
    pub control: u64,
    /// Control ERROR replies received.
    pub control_errors: u64,
    /// Datagrams that were neither valid RTP nor control.
    pub malformed: u64,
}

impl Default for RxStats {
    fn default() -> Self {
        RxStats {
            own: Vec::new(),
            streams: BTreeMap::new(),
            merged: BTreeMap::new(),
            merged_media: (0, 0, 0),
            rtt: latency_histogram(),
            owd: latency_histogram(),
            rx_packets: 0,
            rx_bytes: 0,
            echoes: 0,
            control: 0,
            control_errors: 0,
            malformed: 0,
        }
    }
}

impl RxStats {
    /// Statistics for a client whose own sources are `own` (echoes of those count as RTT samples).
    pub fn new(own: Vec<u32>) -> Self {
        RxStats {
            own,
            ..Default::default()
        }
    }
    /// Record a datagram received at `now` (same clock as the send times).
    pub fn record(&mut self, now: u64, data: &[u8]) {
        self.rx_packets += 1;
        self.rx_bytes += data.len() as u64;
        match wire::classify(data) {
            wire::Kind::Control => {
                self.control += 1;
                if let Ok(c) = Control::new_checked(data) {
                    if c.msg_type() == MsgType::Error {
                        self.control_errors += 1;
                    }
                }
                return;
            }
            wire::Kind::Unknown => {
                self.malformed += 1;
                return;
            }
            wire::Kind::Rtp => {}
        }
        let Ok(p) = RtpPacket::new_checked(data) else {
            self.malformed += 1;
            return;
        };
        let own = self.own.contains(&p.ssrc());
        let e = self
            .streams
            .entry((p.ssrc(), p.payload_type()))
            .or_default();
        e.0.record(p.seq());
        e.1 += data.len() as u64;
        if let Some(t) = p.send_time() {
            let d = now.saturating_sub(t).max(1);
            if own {
                self.echoes += 1;
                let _ = self.rtt.record(d);
            } else {
                let _ = self.owd.record(d);
            }
        } else if own {
            self.echoes += 1;
        }
    }
    fn counts(&self) -> BTreeMap<(u32, u8), [u64; 4]> {
        let mut m = self.merged.clone();
        for (k, (t, bytes)) in &self.streams {
            let e = m.entry(*k).or_default();
            e[0] += t.received;
            e[1] += bytes;
            e[2] += t.lost();
            e[3] += t.reordered;
        }
        m
    }
    /// Per-stream summaries, own echoes included (ordered by SSRC, type);
    /// after [`Self::merge`] the counters are sums over the merged receivers.
    pub fn streams(&self) -> Vec<StreamSummary> {
        self.counts()
            .into_iter()
            .map(|((ssrc, pt), c)| StreamSummary {
                ssrc,
                media: MediaType::from_payload_type(pt)
                    .map(|m| m.name().to_string())
                    .unwrap_or_else(|| format!("pt{pt}")),
                packets: c[0],
                bytes: c[1],
                lost: c[2],
                reordered: c[3],
            })
            .collect()
    }
    /// Totals over streams from other sources: (packets, lost, reordered);
    /// merged receivers contribute their own totals.
    pub fn media_totals(&self) -> (u64, u64, u64) {
        self.streams
            .iter()
            .filter(|((s, _), _)| !self.own.contains(s))
            .fold(self.merged_media, |a, (_, (t, _))| {
                (a.0 + t.received, a.1 + t.lost(), a.2 + t.reordered)
            })
    }
    /// Add another receiver's statistics to this one (stream counters are summed).
    pub fn merge(&mut self, o: &RxStats) {
        let m = o.media_totals();
        self.merged_media = (
            self.merged_media.0 + m.0,
            self.merged_media.1 + m.1,
            self.merged_media.2 + m.2,
        );
        for (k, c) in o.counts() {
            let e = self.merged.entry(k).or_default();
            for i in 0..4 {
                e[i] += c[i];
            }
        }
        let _ = self.rtt.add(&o.rtt);
        let _ = self.owd.add(&o.owd);
        self.rx_packets += o.rx_packets;
        self.rx_bytes += o.rx_bytes;
        self.echoes += o.echoes;
        self.control += o.control;
        self.control_errors += o.control_errors;
        self.malformed += o.malformed;
    }
}

/// Identity of a registered client.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Session {
    /// Assigned SSID.
    pub ssid: u32,
    /// Token proving ownership of the SSID in control requests.
    pub token: u64,
}

/// A parsed control reply.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Reply {
    /// ACK with (request id, session).
    Ack(u32, Session),
    /// ERROR with (request id, code, ssid).
    Error(u32, Option<ErrorCode>, u32),
}

/// Parse an SFU reply; `None` for anything else.
pub fn parse_reply(data: &[u8]) -> Option<Reply> {
    let c = Control::new_checked(data).ok()?;
    match c.msg_type() {
        MsgType::Ack => Some(Reply::Ack(
            c.request_id(),
            Session {
                ssid: c.ssid(),
                token: c.token(),
            },
        )),
        MsgType::Error => Some(Reply::Error(c.request_id(), c.error_code(), c.ssid())),
        _ => None,
    }
}

/// Builds control requests with increasing request ids.
#[derive(Clone, Debug, Default)]
pub struct Requests {
    next: u32,
}

impl Requests {
    fn id(&mut self) -> u32 {
        self.next = self.next.wrapping_add(1);
        self.next
    }
    /// REGISTER; returns (request id, bytes).
    pub fn register(&mut self) -> (u32, Vec<u8>) {
        let id = self.id();
        let mut b = vec![0u8; wire::CTRL_AUTH_LEN];
        wire::write_register(&mut b, id).expect("sized");
        (id, b)
    }
    /// KEEPALIVE or LEAVE.
    pub fn simple(&mut self, ty: MsgType, s: Session) -> (u32, Vec<u8>) {
        let id = self.id();
        let mut b = vec![0u8; wire::CTRL_AUTH_LEN];
        wire::write_auth(&mut b, ty, id, s.ssid, s.token).expect("sized");
        (id, b)
    }
    /// SUBSCRIBE (or UNSUBSCRIBE when `unsub`) with `sels` (at most 256).
    pub fn subscribe(&mut self, s: Session, sels: &[Selector], unsub: bool) -> (u32, Vec<u8>) {
        let id = self.id();
        let ty = if unsub {
            MsgType::Unsubscribe
        } else {
            MsgType::Subscribe
        };
        let mut b = vec![0u8; wire::CTRL_AUTH_LEN + 2 + sels.len() * wire::SELECTOR_LEN];
        let n = wire::write_subscribe(&mut b, ty, id, s.ssid, s.token, sels)
            .expect("at most MAX_SELECTORS selectors");
        b.truncate(n);
        (id, b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seq_tracker_counts_loss_and_reordering() {
        let mut t = SeqTracker::default();
        for s in [65530u16, 65531, 65533, 65532, 65535, 0, 2, 1] {
            t.record(s);
        }
        // 65530..=2 (across the wrap) is 9 expected, 8 received
        assert_eq!(t.expected(), 9);
        assert_eq!(t.reordered, 2); // 65532 after 65533, 1 after 2
        assert_eq!(t.received, 8);
        assert_eq!(t.lost(), 1); // 65534 missing
        t.record(2);
        assert_eq!((t.duplicates, t.lost()), (1, 1));
    }

    #[test]
    fn rx_stats_rtt_and_streams() {
        let mut g = StreamGen::new(5, MediaType::Vsq, 200, 4_000_000, 10);
        let mut other = StreamGen::new(6, MediaType::Asq, 80, 4_000_000, 0);
        let mut rx = RxStats::new(vec![5]);
        let mut b = [0u8; 300];
        for i in 0..4u64 {
            let n = g.next_packet(&mut b, 1000 * i).unwrap();
            assert_eq!(n, 200);
            rx.record(1000 * i + 500, &b[..n]);
            let n = other.next_packet(&mut b, 1000 * i).unwrap();
            if i != 2 {
                rx.record(1000 * i + 700, &b[..n]);
            }
        }
        assert_eq!(rx.echoes, 4);
        assert_eq!(Percentiles::of(&rx.rtt).p50_us, 0.5);
        assert_eq!(rx.media_totals(), (3, 1, 0));
        let s = rx.streams();
        assert_eq!(s.len(), 2);
        assert_eq!(
            (s[0].ssrc, s[0].media.as_str(), s[0].packets),
            (5, "vsq", 4)
        );
    }

    #[test]
    fn requests_and_replies() {
        let mut r = Requests::default();
        let (id, b) = r.register();
        let c = Control::new_checked(&b).unwrap();
        assert_eq!((c.msg_type(), c.request_id()), (MsgType::Register, id));
        let s = Session { ssid: 3, token: 9 };
        let (_, b) = r.subscribe(s, &[Selector::ALL], true);
        assert_eq!(
            Control::new_checked(&b).unwrap().msg_type(),
            MsgType::Unsubscribe
        );
        let mut a = [0u8; 20];
        wire::write_auth(&mut a, MsgType::Ack, 4, 3, 9).unwrap();
        assert_eq!(parse_reply(&a), Some(Reply::Ack(4, s)));
    }
}
