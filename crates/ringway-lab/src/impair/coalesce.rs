//! The receiver's interrupt coalescing (SRPIC paper, Section 3.1, eq. 1–3),
//! as a model that turns packet arrival times into receive blocks.
//!
//! A cycle starts when a packet arrives at an idle receiver (time `a0`):
//! the NIC raises its interrupt after the coalescing delay `T_intr`, the
//! softirq then drains the ring at `R_sn` packets per second, one packet
//! every `1/R_sn`; it keeps going while the next packet has arrived by
//! the time the previous one is done, and the block ends when the ring is
//! empty: `Block = T_sn · R_sn` packets with
//! `1 + ∫[a0, a0 + T_intr + T_sn] P(t) dt = T_sn · R_sn` (eq. 1, 2). For a
//! steady rate P this is eq. 3, [`eq3_block`]. A block also ends once it
//! holds `ring` packets (the NAPI budget/ring: the next packet starts a
//! new block at once, with no new interrupt delay).
//!
//! Blocks are a pure function of the arrival times, so two runs that see
//! the same arrivals see the same blocks, whatever the receiver later does
//! with a block (sort it with SRPIC or not).

/// Receiver parameters.
#[derive(Copy, Clone, Debug, PartialEq)]
pub struct CoalesceConfig {
    /// Interrupt coalescing delay `T_intr` in nanoseconds.
    pub t_intr_ns: u64,
    /// Softirq service rate `R_sn` in packets per second.
    pub rsn_pps: f64,
    /// Most packets in one block (ring / budget).
    pub ring: usize,
}

impl CoalesceConfig {
    /// Time the softirq spends on one packet, in nanoseconds (at least 1).
    pub fn per_packet_ns(&self) -> u64 {
        if self.rsn_pps > 0.0 {
            ((1e9 / self.rsn_pps) as u64).max(1)
        } else {
            1
        }
    }
}

/// Eq. 3: the block size at a steady arrival rate `p_pps`,
/// `⌊(1 + P·T_intr) / (1 − P/R_sn)⌋`; `None` when `P ≥ R_sn` (the drain
/// never empties the ring: blocks are limited by the ring only).
pub fn eq3_block(p_pps: f64, t_intr_s: f64, rsn_pps: f64) -> Option<f64> {
    if p_pps >= rsn_pps {
        return None;
    }
    Some(((1.0 + p_pps * t_intr_s) / (1.0 - p_pps / rsn_pps)).floor())
}

/// A finished block: its packets in arrival order and when it was handed up.
#[derive(Debug)]
pub struct Block<T> {
    /// Arrival time of the first packet.
    pub start_ns: u64,
    /// When the drain finished (the block is handed to the stack then).
    pub end_ns: u64,
    /// The packets, in arrival order.
    pub packets: Vec<T>,
}

/// Histogram of block sizes (index = size; the last bin counts larger ones).
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct BlockHistogram {
    /// `bins[n]` = blocks of n packets (`bins[MAX]` = blocks of MAX or more).
    pub bins: Vec<u64>,
}

impl BlockHistogram {
    /// Largest size with its own bin.
    pub const MAX: usize = 256;

    /// Count one block of `n` packets.
    pub fn add(&mut self, n: usize) {
        if self.bins.is_empty() {
            self.bins = vec![0; Self::MAX + 1];
        }
        self.bins[n.min(Self::MAX)] += 1;
    }

    /// Merge another histogram.
    pub fn merge(&mut self, o: &BlockHistogram) {
        for (n, c) in o.bins.iter().enumerate() {
            for _ in 0..*c {
                self.add(n);
            }
        }
    }

    /// Blocks counted.
    pub fn blocks(&self) -> u64 {
        self.bins.iter().sum()
    }

    /// Packets counted.
    pub fn packets(&self) -> u64 {
        self.bins
            .iter()
            .enumerate()
            .map(|(n, c)| n as u64 * c)
            .sum()
    }

    /// Mean block size (NaN without blocks).
    pub fn mean(&self) -> f64 {
        self.packets() as f64 / self.blocks() as f64
    }

    /// The `q`-quantile of the block size over blocks (q in [0, 1]).
    pub fn quantile(&self, q: f64) -> Option<usize> {
        let total = self.blocks();
        if total == 0 {
            return None;
        }
        let want = ((q * total as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for (n, c) in self.bins.iter().enumerate() {
            seen += c;
            if seen >= want {
                return Some(n);
            }
        }
        None
    }

    /// Share of packets that arrived in blocks of at least `n` packets.
    pub fn packet_share_at_least(&self, n: usize) -> f64 {
        let packets: u64 = self
            .bins
            .iter()
            .enumerate()
            .skip(n)
            .map(|(k, c)| k as u64 * c)
            .sum();
        packets as f64 / self.packets().max(1) as f64
    }
}

/// The coalescing model; packets are pushed in arrival order.
#[derive(Debug)]
pub struct Coalescer<T> {
    cfg: CoalesceConfig,
    /// The block being drained: (first arrival, drain start, packets).
    open: Option<(u64, u64, Vec<T>)>,
    hist: BlockHistogram,
}

impl<T> Coalescer<T> {
    /// A receiver with `cfg` (`ring` at least 1).
    pub fn new(cfg: CoalesceConfig) -> Self {
        Coalescer {
            cfg: CoalesceConfig {
                ring: cfg.ring.max(1),
                ..cfg
            },
            open: None,
            hist: BlockHistogram::default(),
        }
    }

    /// The configuration.
    pub fn config(&self) -> &CoalesceConfig {
        &self.cfg
    }

    /// Block sizes so far.
    pub fn histogram(&self) -> &BlockHistogram {
        &self.hist
    }

    /// When the open block's drain ends if nothing else arrives.
    fn open_end(&self) -> Option<u64> {
        self.open
            .as_ref()
            .map(|(_, s, v)| s + v.len() as u64 * self.cfg.per_packet_ns())
    }

    /// When the open block ends if no packet arrives before then (`None`
    /// when no block is open).
    pub fn pending_end(&self) -> Option<u64> {
        self.open_end()
    }

    /// A packet arrived at `arrival` (not earlier than any packet before
    /// it). A block it cannot join is finished and handed to `done`.
    pub fn push(&mut self, arrival: u64, item: T, done: &mut impl FnMut(Block<T>)) {
        let per = self.cfg.per_packet_ns();
        if let Some((first_at, size, block_packets)) = &mut self.open {
            // The drain of the packets so far ends at s + len/R_sn; this
            // packet joins if it arrived by then and the ring has room.
            let end = *size + block_packets.len() as u64 * per;
            if arrival <= end && block_packets.len() < self.cfg.ring {
                block_packets.push(item);
                return;
            }
            let full = block_packets.len() >= self.cfg.ring;
            let (first_at, packets) = (*first_at, std::mem::take(block_packets));
            self.open = None;
            self.hist.add(packets.len());
            done(Block {
                start_ns: first_at,
                end_ns: end,
                packets,
            });
            if full && arrival <= end {
                // Budget exhausted while packets wait: the poll goes on
                // without a new interrupt delay.
                self.open = Some((arrival, end, vec![item]));
                return;
            }
        }
        self.open = Some((arrival, arrival + self.cfg.t_intr_ns, vec![item]));
    }

    /// Finish the open block if its drain ended before `now` and no packet
    /// can still join it: `next_arrival` is the earliest time a packet not
    /// yet pushed can arrive (`None`: none can; packets pushed after this
    /// call must arrive after `now`). Hands it to `done`.
    pub fn poll(&mut self, now: u64, next_arrival: Option<u64>, done: &mut impl FnMut(Block<T>)) {
        let Some(end) = self.open_end() else {
            return;
        };
        if now <= end || next_arrival.is_some_and(|a| a <= end) {
            return;
        }
        let (first_at, _, packets) = self.open.take().expect("open block");
        self.hist.add(packets.len());
        done(Block {
            start_ns: first_at,
            end_ns: end,
            packets,
        });
    }

    /// Finish the open block now (end of a run).
    pub fn drain(&mut self, done: &mut impl FnMut(Block<T>)) {
        self.poll(u64::MAX, None, done);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The numbers in docs/srpic.md: T_intr 75 µs and R_sn 2.9 Mpps give
    /// Fig. 2's block sizes at 95 Mb/s, 938 Mb/s and 5.89 Gb/s (1, ~7,
    /// 30–60 packets of 1500 bytes).
    #[test]
    fn eq3_reproduces_fig2_with_the_chosen_receiver() {
        let pps = |mbps: f64| mbps * 1e6 / 12_000.0;
        assert_eq!(eq3_block(pps(95.3), 75e-6, 2.9e6), Some(1.0));
        let b = eq3_block(pps(938.0), 75e-6, 2.9e6).unwrap();
        assert!((6.0..=8.0).contains(&b), "{b}");
        let b = eq3_block(pps(5890.0), 75e-6, 2.9e6).unwrap();
        assert!((30.0..=60.0).contains(&b), "{b}");
        assert_eq!(eq3_block(3e6, 75e-6, 2.9e6), None);
    }

    fn blocks(cfg: CoalesceConfig, arrivals: &[u64]) -> Vec<(u64, Vec<u64>)> {
        let mut c = Coalescer::new(cfg);
        let mut out = Vec::new();
        for &a in arrivals {
            c.push(a, a, &mut |b| out.push((b.end_ns, b.packets)));
        }
        c.drain(&mut |b| out.push((b.end_ns, b.packets)));
        out
    }

    #[test]
    fn drain_takes_what_arrived_while_it_ran() {
        let cfg = CoalesceConfig {
            t_intr_ns: 100,
            rsn_pps: 1e8, // 10 ns per packet
            ring: 64,
        };
        // 0 opens a block: interrupt at 100, drain of 1 packet ends at 110;
        // 50 and 105 have arrived by then (drain end 120, 130); 125 too
        // (ends 140); 200 is after the ring emptied at 140: a new block,
        // drained from 300.
        let b = blocks(cfg, &[0, 50, 105, 125, 200, 301]);
        assert_eq!(b, vec![(140, vec![0, 50, 105, 125]), (320, vec![200, 301])]);
    }

    #[test]
    fn a_full_ring_ends_the_block_and_the_poll_goes_on() {
        let cfg = CoalesceConfig {
            t_intr_ns: 1_000,
            rsn_pps: 1e8,
            ring: 3,
        };
        let b = blocks(cfg, &[0, 1, 2, 3, 4, 5000]);
        // Block 1 ends at 1000 + 3·10; 3 waits: block 2 drains from 1030.
        assert_eq!(
            b,
            vec![
                (1030, vec![0, 1, 2]),
                (1050, vec![3, 4]),
                (6010, vec![5000])
            ]
        );
    }

    #[test]
    fn a_block_is_not_finished_while_a_packet_can_still_join() {
        let cfg = CoalesceConfig {
            t_intr_ns: 100,
            rsn_pps: 1e8,
            ring: 64,
        };
        let mut c = Coalescer::new(cfg);
        let mut out = Vec::new();
        c.push(0, 0u64, &mut |b| out.push(b.packets));
        c.poll(105, Some(108), &mut |b| out.push(b.packets));
        assert!(
            out.is_empty(),
            "drain ends at 110; a packet may arrive at 108"
        );
        c.poll(111, Some(500), &mut |b| out.push(b.packets));
        assert_eq!(out, vec![vec![0]]);
        assert_eq!(c.histogram().blocks(), 1);
    }

    #[test]
    fn histogram_statistics() {
        let mut h = BlockHistogram::default();
        for n in [1, 1, 2, 7, 300] {
            h.add(n);
        }
        assert_eq!(h.blocks(), 5);
        assert_eq!(h.packets(), 1 + 1 + 2 + 7 + 256);
        assert_eq!(h.quantile(0.5), Some(2));
        assert_eq!(h.quantile(1.0), Some(256));
        assert!((h.packet_share_at_least(7) - 263.0 / 267.0).abs() < 1e-12);
    }
}
