//! TCP quantities counted on the wire by the relay, in the paper's terms
//! (Web100 counters of the sender, Section 4): `PktsRetrans` (segments
//! carrying at least some retransmitted data), `DupAcksIn` (duplicate ACKs
//! the sender receives) and `SackBlocksRcvd` (SACK blocks the sender
//! receives), plus RFC 4737 reordering of the data as the receiver's
//! stack is handed it.
//!
//! Duplicate ACK, as Wireshark's TCP analysis defines it (so the count can
//! be checked against `tshark`'s `tcp.analysis.duplicate_ack`): a segment
//! without payload, with a nonzero window equal to the previous segment's
//! window in the same direction, a sequence number equal to that
//! direction's next expected one, the same acknowledgement number as the
//! previous segment, and none of SYN, FIN, RST. (RFC 5681 additionally
//! requires outstanding data; during bulk transfer there always is.)
//!
//! State is per direction of a connection, bounded: at most `max_flows`
//! directions are followed, later ones are counted as `untracked`.

use ringway_reorder::classify::{inspect_ip, tcp_flags, Inspect, TcpSeg};
use ringway_reorder::metrics::ReorderMeter;
use ringway_reorder::{FlowKey, SeqSpace};
use std::collections::HashMap;

/// What was counted.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct WireCounts {
    /// TCP segments seen.
    pub segments: u64,
    /// Segments with payload.
    pub data_segments: u64,
    /// Payload bytes.
    pub payload_bytes: u64,
    /// Data segments whose first byte was sent before (PktsRetrans).
    pub retransmitted: u64,
    /// Duplicate ACKs (DupAcksIn when counted toward the sender).
    pub dup_acks: u64,
    /// SACK blocks, DSACK included (SackBlocksRcvd toward the sender).
    pub sack_blocks: u64,
    /// Packets that were not well-formed IP/TCP.
    pub malformed: u64,
    /// Well-formed packets that were not TCP.
    pub not_tcp: u64,
    /// Segments of directions beyond the table bound.
    pub untracked: u64,
}

#[derive(Copy, Clone, Debug, Default)]
struct Direction {
    /// Window of the previous segment.
    window: u16,
    /// Acknowledgement number of the previous segment.
    last_ack: u32,
    /// Next expected sequence number (end of the furthest data, SYN or FIN).
    next_seq: Option<u32>,
    /// End of the furthest data sent (for retransmissions).
    max_end: Option<u32>,
}

/// Counts over one direction of travel (e.g. everything the relay hands
/// the sender), per connection direction.
#[derive(Debug)]
pub struct WireCounter {
    flows: HashMap<FlowKey, Direction>,
    max_flows: usize,
    counts: WireCounts,
}

impl WireCounter {
    /// A counter following at most `max_flows` connection directions.
    pub fn new(max_flows: usize) -> Self {
        WireCounter {
            flows: HashMap::new(),
            max_flows,
            counts: WireCounts::default(),
        }
    }

    /// The counts so far.
    pub fn counts(&self) -> WireCounts {
        self.counts
    }

    /// Count one IP packet.
    /// Returns whether `ip` was a retransmission (a data segment starting
    /// below the furthest data its flow sent before).
    pub fn observe(&mut self, ip: &[u8]) -> bool {
        match inspect_ip(ip) {
            Inspect::Malformed => self.counts.malformed += 1,
            Inspect::NotTcp => self.counts.not_tcp += 1,
            Inspect::Tcp(s) => return self.segment(&s),
        }
        false
    }

    fn segment(&mut self, s: &TcpSeg) -> bool {
        let space = SeqSpace::U32;
        self.counts.segments += 1;
        let dir = match self.flows.get_mut(&s.key) {
            Some(dir) => dir,
            None => {
                if self.flows.len() >= self.max_flows {
                    self.counts.untracked += 1;
                    return false;
                }
                self.flows.entry(s.key).or_default()
            }
        };
        let syn = s.flags & tcp_flags::SYN != 0;
        let fin = s.flags & tcp_flags::FIN != 0;
        let rst = s.flags & tcp_flags::RST != 0;
        let ack = s.flags & tcp_flags::ACK != 0;
        let mut retransmission = false;
        if s.payload_len > 0 {
            self.counts.data_segments += 1;
            self.counts.payload_bytes += s.payload_len as u64;
            if dir.max_end.is_some_and(|m| space.lt(s.seq, m)) {
                self.counts.retransmitted += 1;
                retransmission = true;
            }
            let end = space.add(s.seq, s.payload_len);
            if dir.max_end.is_none_or(|m| space.lt(m, end)) {
                dir.max_end = Some(end);
            }
        }
        if s.payload_len == 0
            && s.window != 0
            && s.window == dir.window
            && Some(s.seq) == dir.next_seq
            && ack
            && s.ack == dir.last_ack
            && !(syn || fin || rst)
        {
            self.counts.dup_acks += 1;
        }
        self.counts.sack_blocks += s.sack_blocks as u64;
        dir.window = s.window;
        if ack {
            dir.last_ack = s.ack;
        }
        let end = space.add(s.seq, s.payload_len + syn as u32 + fin as u32);
        if s.payload_len > 0 || syn || fin {
            if dir.next_seq.is_none_or(|n| space.lt(n, end)) {
                dir.next_seq = Some(end);
            }
        } else if dir.next_seq.is_none() {
            dir.next_seq = Some(s.seq);
        }
        retransmission
    }
}

/// RFC 4737 reordering of data segments at one point of the path.
#[derive(Debug)]
pub struct DataOrder {
    meter: ReorderMeter,
}

impl DataOrder {
    /// Follow at most `max_flows` connections.
    pub fn new(max_flows: usize) -> Self {
        DataOrder {
            meter: ReorderMeter::new(SeqSpace::U32, max_flows),
        }
    }

    /// Observe one IP packet (only data segments count).
    pub fn observe(&mut self, ip: &[u8]) {
        if let Inspect::Tcp(s) = inspect_ip(ip) {
            if s.payload_len > 0 {
                self.meter.observe(s.key, s.seq, s.payload_len);
            }
        }
    }

    /// (segments, reordered, ratio).
    pub fn summary(&self) -> (u64, u64, f64) {
        (
            self.meter.received,
            self.meter.reordered,
            self.meter.ratio(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An IPv4/TCP packet 10.0.0.2:5201 → 10.0.0.1:40000 (or reversed).
    pub(crate) fn seg(
        fwd: bool,
        seq: u32,
        ack: u32,
        win: u16,
        flags: u8,
        payload: usize,
        sack: u8,
    ) -> Vec<u8> {
        let opt_len = if sack > 0 { 4 + 8 * sack as usize } else { 0 };
        let doff = 20 + opt_len;
        let total = 20 + doff + payload;
        let mut p = vec![0u8; total];
        p[0] = 0x45;
        p[2..4].copy_from_slice(&(total as u16).to_be_bytes());
        p[8] = 64;
        p[9] = 6;
        let (a, b) = ([10, 0, 0, 1], [10, 0, 0, 2]);
        let (src, dst, sp, dp) = if fwd {
            (a, b, 40000u16, 5201u16)
        } else {
            (b, a, 5201, 40000)
        };
        p[12..16].copy_from_slice(&src);
        p[16..20].copy_from_slice(&dst);
        let t = &mut p[20..];
        t[0..2].copy_from_slice(&sp.to_be_bytes());
        t[2..4].copy_from_slice(&dp.to_be_bytes());
        t[4..8].copy_from_slice(&seq.to_be_bytes());
        t[8..12].copy_from_slice(&ack.to_be_bytes());
        t[12] = ((doff / 4) as u8) << 4;
        t[13] = flags;
        t[14..16].copy_from_slice(&win.to_be_bytes());
        if sack > 0 {
            t[20] = 1;
            t[21] = 1;
            t[22] = 5;
            t[23] = 2 + 8 * sack;
        }
        p
    }

    #[test]
    fn dup_acks_and_sack_blocks_follow_wireshark_rules() {
        use tcp_flags::{ACK, FIN, SYN};
        let mut c = WireCounter::new(16);
        // Receiver's SYN-ACK (seq 100) then pure ACKs with seq 101.
        c.observe(&seg(false, 100, 1, 500, SYN | ACK, 0, 0));
        c.observe(&seg(false, 101, 1000, 500, ACK, 0, 0));
        c.observe(&seg(false, 101, 1000, 500, ACK, 0, 1)); // dup, 1 block
        c.observe(&seg(false, 101, 1000, 500, ACK, 0, 2)); // dup, 2 blocks
        c.observe(&seg(false, 101, 1000, 600, ACK, 0, 0)); // window update: no
        c.observe(&seg(false, 101, 1000, 600, ACK, 0, 0)); // dup
        c.observe(&seg(false, 101, 2000, 600, ACK, 0, 0)); // new ack: no
        c.observe(&seg(false, 101, 2000, 600, ACK, 10, 0)); // data: no
        c.observe(&seg(false, 101, 2000, 600, ACK, 0, 0)); // seq != next (111): no
        c.observe(&seg(false, 111, 2000, 600, ACK, 0, 0)); // dup
        c.observe(&seg(false, 111, 2000, 600, ACK | FIN, 0, 0)); // FIN: no
        c.observe(&seg(false, 112, 2000, 0, ACK, 0, 0));
        c.observe(&seg(false, 112, 2000, 0, ACK, 0, 0)); // zero window: no
        let k = c.counts();
        assert_eq!(k.dup_acks, 4);
        assert_eq!(k.sack_blocks, 3);
        assert_eq!((k.segments, k.data_segments, k.payload_bytes), (13, 1, 10));
    }

    #[test]
    fn retransmissions_are_data_sent_before() {
        let mut c = WireCounter::new(16);
        for (s, len) in [
            (1000, 100),
            (1100, 100),
            (1200, 100),
            (1100, 100),
            (1300, 100),
            (1250, 100),
        ] {
            c.observe(&seg(true, s, 1, 500, tcp_flags::ACK, len, 0));
        }
        assert_eq!(c.counts().retransmitted, 2);
        c.observe(&[0x45, 0, 0]);
        let mut udp = seg(true, 1, 1, 1, 0, 0, 0);
        udp[9] = 17;
        c.observe(&udp);
        assert_eq!((c.counts().malformed, c.counts().not_tcp), (1, 1));
    }

    #[test]
    fn tables_are_bounded() {
        let mut c = WireCounter::new(1);
        c.observe(&seg(true, 1, 1, 1, tcp_flags::ACK, 10, 0));
        c.observe(&seg(false, 1, 1, 1, tcp_flags::ACK, 10, 0));
        assert_eq!(c.counts().untracked, 1);
        let mut o = DataOrder::new(1);
        o.observe(&seg(true, 1, 1, 1, tcp_flags::ACK, 10, 0));
        o.observe(&seg(false, 1, 1, 1, tcp_flags::ACK, 10, 0));
        assert_eq!(o.summary().0, 1);
    }
}
