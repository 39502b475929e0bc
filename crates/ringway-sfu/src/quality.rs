//! Per-stream reception statistics at the SFU, for the operator: packets,
//! loss and reordering (extended sequence numbers, RFC 3550 A.1/A.3),
//! interarrival jitter (RFC 3550 A.8, in RTP timestamp units, reported in
//! ms), and late packets.
//!
//! **Late** is what a fixed playout buffer of `late_after_ns` would have
//! dropped: a packet whose transit (arrival minus its RTP timestamp, both
//! in the stream's clock) exceeds the smallest transit seen so far by more
//! than `late_after_ns`. The sender's clock and the SFU's are not
//! synchronised, so only differences of transits mean anything; a sender
//! clock running slow or fast drifts this baseline (by 1 ms per 1000 s at
//! 1 ppm).

use crate::client::SeqTracker;

/// Reception statistics of one RTP stream (one source, one media type).
#[derive(Clone, Debug, Default)]
pub struct StreamQuality {
    seq: SeqTracker,
    /// Packets whose transit exceeded the smallest by more than the bound.
    late: u64,
    /// RFC 3550 jitter estimate, in RTP timestamp units.
    jitter: f64,
    last_transit: Option<i64>,
    first_transit: Option<i32>,
    min_relative: i64,
    bytes: u64,
}

/// A snapshot of a [`StreamQuality`] for the admin API.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct QualitySnapshot {
    /// Packets received (duplicates included).
    pub packets: u64,
    /// Bytes received.
    pub bytes: u64,
    /// Packets expected minus received (RFC 3550 cumulative loss, never
    /// negative).
    pub lost: u64,
    /// Loss as a fraction of the packets expected.
    pub loss_fraction: f64,
    /// Packets that arrived after a higher sequence number.
    pub reordered: u64,
    /// Exact repeats of the highest sequence number.
    pub duplicates: u64,
    /// Packets later than the late bound (see the module docs).
    pub late: u64,
    /// RFC 3550 interarrival jitter (ms).
    pub jitter_ms: f64,
}

impl StreamQuality {
    /// Record a packet of `len` bytes with `seq` and RTP timestamp `ts`
    /// arriving at `now_ns`, in a stream clocked at `clock_rate` Hz.
    pub fn record(
        &mut self,
        now_ns: u64,
        seq: u16,
        ts: u32,
        len: usize,
        clock_rate: u32,
        late_after_ns: u64,
    ) {
        self.seq.record(seq);
        self.bytes += len as u64;
        let rate = u128::from(clock_rate.max(1));
        let arrival = (u128::from(now_ns) * rate / 1_000_000_000) as u32;
        let transit = arrival.wrapping_sub(ts) as i32;
        if let Some(last) = self.last_transit {
            let delta = (i64::from(transit) - last).abs() as f64;
            self.jitter += (delta - self.jitter) / 16.0;
        }
        self.last_transit = Some(i64::from(transit));
        let first = *self.first_transit.get_or_insert(transit);
        let rel = i64::from(transit.wrapping_sub(first));
        if rel < self.min_relative {
            self.min_relative = rel;
        }
        let excess_ns = (rel - self.min_relative) as u128 * 1_000_000_000 / rate;
        if excess_ns > u128::from(late_after_ns) {
            self.late += 1;
        }
    }

    /// The statistics now, the jitter converted with `clock_rate`.
    pub fn snapshot(&self, clock_rate: u32) -> QualitySnapshot {
        let expected = self.seq.expected();
        let lost = self.seq.lost();
        QualitySnapshot {
            packets: self.seq.received,
            bytes: self.bytes,
            lost,
            loss_fraction: if expected > 0 {
                lost as f64 / expected as f64
            } else {
                0.0
            },
            reordered: self.seq.reordered,
            duplicates: self.seq.duplicates,
            late: self.late,
            jitter_ms: self.jitter * 1000.0 / f64::from(clock_rate.max(1)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    /// 20 ms packets at 48 kHz (960 ticks): arriving exactly on time gives
    /// zero jitter; one packet 4 ms late gives the RFC 3550 estimator's
    /// value (|D| = 192 ticks twice: 192/16, then 12 + (192-12)/16).
    #[test]
    fn jitter_loss_reorder_and_late() {
        let mut q = StreamQuality::default();
        for i in 0..10u64 {
            q.record(
                1000 * MS + i * 20 * MS,
                i as u16,
                (i * 960) as u32,
                100,
                48_000,
                3 * MS,
            );
        }
        let s = q.snapshot(48_000);
        assert_eq!((s.packets, s.lost, s.reordered, s.late), (10, 0, 0, 0));
        assert!(s.jitter_ms.abs() < 1e-9);
        // seq 10 arrives 4 ms late, 11 on time.
        q.record(
            1000 * MS + 10 * 20 * MS + 4 * MS,
            10,
            9600,
            100,
            48_000,
            3 * MS,
        );
        q.record(1000 * MS + 11 * 20 * MS, 11, 10560, 100, 48_000, 3 * MS);
        let s = q.snapshot(48_000);
        let j = 12.0 + (192.0 - 12.0) / 16.0;
        assert!((s.jitter_ms - j / 48.0).abs() < 1e-9, "{}", s.jitter_ms);
        assert_eq!(s.late, 1);
        // 13 before 12, 14 lost.
        q.record(1000 * MS + 13 * 20 * MS, 13, 13 * 960, 100, 48_000, 3 * MS);
        q.record(1000 * MS + 13 * 20 * MS, 12, 12 * 960, 100, 48_000, 3 * MS);
        q.record(1000 * MS + 15 * 20 * MS, 15, 15 * 960, 100, 48_000, 3 * MS);
        let s = q.snapshot(48_000);
        assert_eq!((s.packets, s.lost, s.reordered), (15, 1, 1));
        assert_eq!(s.bytes, 1500);
    }
}
