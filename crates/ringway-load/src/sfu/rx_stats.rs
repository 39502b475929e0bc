//! What a load client receives: per-stream loss and reordering, the RTT
//! of its own echoed packets and the one-way delay of others' packets.

use hdrhistogram::Histogram;
use ringway_server::metrics::compact_latency_histogram;
use ringway_sfu::client::SeqTracker;
use ringway_sfu::wire::{self, Control, MediaType, MsgType, RtpPacket};
use std::collections::BTreeMap;

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

/// Receive-side statistics of a client (all its sockets together).
#[derive(Debug)]
pub struct RxStats {
    own: Vec<u32>,
    streams: BTreeMap<(u32, u8), (SeqTracker, u64)>,
    merged: BTreeMap<(u32, u8), [u64; 4]>,
    merged_media: (u64, u64, u64),
    /// RTT of echoed own packets (ns; 2 significant digits: recorded per
    /// datagram, and a client's two 3-digit histograms, ~220 KiB each, made
    /// a cache miss of most records on the load thread).
    pub rtt: Histogram<u64>,
    /// One-way delay of other sources' packets (ns; same-host clocks only;
    /// 2 significant digits).
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
            rtt: compact_latency_histogram(),
            owd: compact_latency_histogram(),
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
                if let Ok(control) = Control::new_checked(data) {
                    if control.msg_type() == MsgType::Error {
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
        let Ok(packet) = RtpPacket::new_checked(data) else {
            self.malformed += 1;
            return;
        };
        let own = self.own.contains(&packet.ssrc());
        let entry = self
            .streams
            .entry((packet.ssrc(), packet.payload_type()))
            .or_default();
        entry.0.record(packet.seq());
        entry.1 += data.len() as u64;
        if let Some(sent_at) = packet.send_time() {
            let delay = now.saturating_sub(sent_at).max(1);
            if own {
                self.echoes += 1;
                let _ = self.rtt.record(delay);
            } else {
                let _ = self.owd.record(delay);
            }
        } else if own {
            self.echoes += 1;
        }
    }
    fn counts(&self) -> BTreeMap<(u32, u8), [u64; 4]> {
        let mut merged = self.merged.clone();
        for (k, (t, bytes)) in &self.streams {
            let entry = merged.entry(*k).or_default();
            entry[0] += t.received;
            entry[1] += bytes;
            entry[2] += t.lost();
            entry[3] += t.reordered;
        }
        merged
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
        let totals = o.media_totals();
        self.merged_media = (
            self.merged_media.0 + totals.0,
            self.merged_media.1 + totals.1,
            self.merged_media.2 + totals.2,
        );
        for (k, c) in o.counts() {
            let entry = self.merged.entry(k).or_default();
            for i in 0..4 {
                entry[i] += c[i];
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

#[cfg(test)]
mod tests {
    use super::*;
    use ringway_server::metrics::LatencySummary;
    use ringway_sfu::client::StreamGen;

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
        // 500 ns, within the compact histogram's 1 % resolution.
        let p50 = LatencySummary::of_ns(&rx.rtt).p50_us;
        assert!((p50 - 0.5).abs() <= 0.005, "{p50}");
        assert_eq!(rx.media_totals(), (3, 1, 0));
        let s = rx.streams();
        assert_eq!(s.len(), 2);
        assert_eq!(
            (s[0].ssrc, s[0].media.as_str(), s[0].packets),
            (5, "vsq", 4)
        );
    }
}
