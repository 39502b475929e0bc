//! One direction of an emulated network path, the way the SRPIC paper's
//! netem router shaped it (Section 4): packets cross an input link at
//! `rate_bps`, are dropped with the loss model, are delayed by a Normal
//! draw `d ~ N(α, σ²)` (σ = β·α; negative draws are cut to 0), and leave
//! through an output link at `rate_bps` in order of their due times, so a
//! packet whose draw is smaller overtakes the ones before it (netem's
//! time-ordered queue). Reordering therefore comes from the packet spacing
//! on the link against σ, as in the paper, not from a "hold back N"
//! process.
//!
//! Time is passed in: `push(now, …)` with the packet's own arrival stamp
//! (one stamp per packet, not per receive batch), `poll(now, …)` hands out
//! every packet whose arrival at the far end of the output link is ≤ `now`
//! together with that arrival time (exact, even when `poll` runs late).
//! The input link turns a burst of packets read late into the spacing the
//! link would have given them: the link time of a packet is
//! `max(arrival, previous link time) + size/rate`.
//!
//! Determinism: every packet consumes exactly four draws of the seeded
//! generator (loss, burst-loss state, two for the Normal delay) whatever
//! the configuration, so the n-th packet of a direction gets the same
//! delay and loss decision in every run with the same seed.

use ringway_reorder::workload::XorShift;
use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};

/// Loss process of a direction.
#[derive(Copy, Clone, Debug, PartialEq)]
pub enum LossModel {
    /// No loss.
    None,
    /// Each packet dropped with probability `p` (the paper's uniform δ).
    Uniform(f64),
    /// Gilbert-Elliott: a good and a bad state with their own loss
    /// probabilities; per packet the state moves good→bad with `p_gb` and
    /// bad→good with `p_bg` (bursty loss; mean burst 1/`p_bg` packets).
    GilbertElliott {
        /// Probability to enter the bad state (per packet in the good state).
        p_gb: f64,
        /// Probability to leave the bad state (per packet in the bad state).
        p_bg: f64,
        /// Loss probability in the good state.
        loss_good: f64,
        /// Loss probability in the bad state.
        loss_bad: f64,
    },
}

impl LossModel {
    /// Long-run loss probability.
    pub fn mean_loss(&self) -> f64 {
        match *self {
            LossModel::None => 0.0,
            LossModel::Uniform(p) => p,
            LossModel::GilbertElliott {
                p_gb,
                p_bg,
                loss_good,
                loss_bad,
            } => {
                let bad = if p_gb + p_bg > 0.0 {
                    p_gb / (p_gb + p_bg)
                } else {
                    0.0
                };
                (1.0 - bad) * loss_good + bad * loss_bad
            }
        }
    }
}

/// Settings of one direction.
#[derive(Copy, Clone, Debug, PartialEq)]
pub struct PathConfig {
    /// Link rate in bits per second (input and output link); 0: no link
    /// (no serialisation, no queue).
    pub rate_bps: u64,
    /// Mean delay α in nanoseconds.
    pub delay_ns: u64,
    /// Standard deviation σ of the delay in nanoseconds (σ = β·α).
    pub sigma_ns: u64,
    /// Loss process.
    pub loss: LossModel,
    /// Seed of the generator.
    pub seed: u64,
    /// Longest the input-link queue may be, in nanoseconds of link time
    /// (drop-tail beyond; the router's buffer). 0: unlimited.
    pub queue_ns: u64,
    /// Most packets inside the path at once (memory bound); beyond,
    /// packets are dropped and counted.
    pub max_packets: usize,
    /// The emulator router's own receive batching (an assumption, not the
    /// paper's stated model; `None`: off). See [`RouterBatching`].
    pub router: Option<RouterBatching>,
}

/// **Assumption, not the SRPIC paper's stated model** (the review's
/// hypothesis, reviews/srpic-paper.md §3.4): the emulator router's NIC
/// coalesces its own receive interrupts, so its netem stamps every packet
/// of one router poll at (nearly) one time: a packet that reached the
/// router at `t` gets the base time of the first poll at or after `t`
/// (polls every `poll_ns` on a fixed grid) plus `per_packet_ns` for each
/// packet the router forwarded before it in that poll (serially: a poll
/// that overruns pushes the next one back). The Normal delay draw is added
/// to that base time instead of the arrival time, so packets of one poll
/// are shuffled by their draws alone. This is what makes the paper's small-β
/// reordering about 8× heavier than its stated model predicts.
#[derive(Copy, Clone, Debug, PartialEq, serde::Serialize)]
pub struct RouterBatching {
    /// Poll period of the router's receive path, ns.
    pub poll_ns: u64,
    /// The router's forwarding cost per packet, ns.
    pub per_packet_ns: u64,
}

impl RouterBatching {
    /// The base time of a packet that reached the router at `arrival`,
    /// given when the router's forwarding is next free (`free`, updated).
    pub fn base(&self, arrival: u64, free: &mut u64) -> u64 {
        let poll = if self.poll_ns == 0 {
            arrival
        } else {
            arrival.div_ceil(self.poll_ns) * self.poll_ns
        };
        let base = poll.max(*free);
        *free = base + self.per_packet_ns;
        base
    }
}

impl Default for PathConfig {
    fn default() -> Self {
        PathConfig {
            rate_bps: 0,
            delay_ns: 0,
            sigma_ns: 0,
            loss: LossModel::None,
            seed: 1,
            queue_ns: 0,
            max_packets: 100_000,
            router: None,
        }
    }
}

impl PathConfig {
    /// Link time of `bytes` bytes at the configured rate (0 without a link).
    pub fn tx_ns(&self, bytes: usize) -> u64 {
        if self.rate_bps == 0 {
            0
        } else {
            (bytes as u128 * 8 * 1_000_000_000 / self.rate_bps as u128) as u64
        }
    }
}

/// Counters of a direction.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PathStats {
    /// Packets offered.
    pub packets: u64,
    /// Dropped by the loss model.
    pub lost: u64,
    /// Dropped because the input-link queue was longer than `queue_ns`.
    pub queue_drops: u64,
    /// Dropped because `max_packets` were inside the path.
    pub overflow: u64,
    /// Packets handed out by `poll`.
    pub delivered: u64,
    /// Packets whose delay draw was negative and was cut to 0.
    pub delay_clipped: u64,
}

/// A standard Normal draw from two uniform draws (Box–Muller).
pub fn standard_normal(rng: &mut XorShift) -> f64 {
    let uniform1 = ((rng.next_u64() >> 11) + 1) as f64 / (1u64 << 53) as f64; // (0, 1]
    let uniform2 = (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
    (-2.0 * uniform1.ln()).sqrt() * (2.0 * std::f64::consts::PI * uniform2).cos()
}

fn uniform(rng: &mut XorShift) -> f64 {
    (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64
}

/// One direction of the emulated path; `T` is the packet (bytes, handle).
#[derive(Debug)]
pub struct Path<T> {
    cfg: PathConfig,
    rng: XorShift,
    bad_state: bool,
    /// When the input link is free again.
    in_free: u64,
    /// When the output link is free again.
    out_free: u64,
    /// When the router's forwarding (batching stage) is free again.
    router_free: u64,
    /// (due time, push order) → slot; packets in the delay stage.
    delayed: BinaryHeap<Reverse<(u64, u64, usize)>>,
    slots: Vec<Option<(T, usize)>>,
    free: Vec<usize>,
    order: u64,
    /// Packets on the output link: (arrival at the far end, packet), FIFO.
    wire: VecDeque<(u64, T)>,
    stats: PathStats,
}

impl<T> Path<T> {
    /// A path with `cfg`.
    pub fn new(cfg: PathConfig) -> Self {
        let cfg = PathConfig {
            max_packets: cfg.max_packets.max(1),
            ..cfg
        };
        Path {
            rng: XorShift::new(cfg.seed),
            cfg,
            bad_state: false,
            in_free: 0,
            out_free: 0,
            router_free: 0,
            delayed: BinaryHeap::new(),
            slots: Vec::new(),
            free: Vec::new(),
            order: 0,
            wire: VecDeque::new(),
            stats: PathStats::default(),
        }
    }

    /// The configuration.
    pub fn config(&self) -> &PathConfig {
        &self.cfg
    }

    /// Counters.
    pub fn stats(&self) -> PathStats {
        self.stats
    }

    /// Packets inside the path.
    pub fn queued(&self) -> usize {
        self.delayed.len() + self.wire.len()
    }

    /// Offer a packet of `bytes` bytes that arrived at `now` (ns).
    pub fn push(&mut self, now: u64, bytes: usize, item: T) {
        self.stats.packets += 1;
        // The four draws of this packet, taken whatever happens to it.
        let u_loss = uniform(&mut self.rng);
        let u_state = uniform(&mut self.rng);
        let normal = standard_normal(&mut self.rng);
        let lost = match self.cfg.loss {
            LossModel::None => false,
            LossModel::Uniform(p) => u_loss < p,
            LossModel::GilbertElliott {
                p_gb,
                p_bg,
                loss_good,
                loss_bad,
            } => {
                self.bad_state = if self.bad_state {
                    u_state >= p_bg
                } else {
                    u_state < p_gb
                };
                u_loss < if self.bad_state { loss_bad } else { loss_good }
            }
        };
        let tx_ns = self.cfg.tx_ns(bytes);
        let start = now.max(self.in_free);
        if self.cfg.rate_bps > 0 && self.cfg.queue_ns > 0 && start - now > self.cfg.queue_ns {
            self.stats.queue_drops += 1;
            return;
        }
        if self.queued() >= self.cfg.max_packets {
            self.stats.overflow += 1;
            return;
        }
        self.in_free = start + tx_ns;
        // The router's receive batching (when modelled) also forwards the
        // packets its netem then drops.
        let base = match self.cfg.router {
            Some(router) => router.base(self.in_free, &mut self.router_free),
            None => self.in_free,
        };
        if lost {
            self.stats.lost += 1;
            return;
        }
        let delay = self.cfg.delay_ns as f64 + self.cfg.sigma_ns as f64 * normal;
        if delay < 0.0 {
            self.stats.delay_clipped += 1;
        }
        let due = base + delay.max(0.0) as u64;
        let slot = match self.free.pop() {
            Some(s) => {
                self.slots[s] = Some((item, bytes));
                s
            }
            None => {
                self.slots.push(Some((item, bytes)));
                self.slots.len() - 1
            }
        };
        self.order += 1;
        self.delayed.push(Reverse((due, self.order, slot)));
    }

    /// Move packets due by `now` onto the output link (in due order).
    fn advance(&mut self, now: u64) {
        while let Some(Reverse((due, _, slot))) = self.delayed.peek().copied() {
            if due > now {
                break;
            }
            self.delayed.pop();
            let (item, bytes) = self.slots[slot].take().expect("slot holds a packet");
            self.free.push(slot);
            let arrive = due.max(self.out_free) + self.cfg.tx_ns(bytes);
            self.out_free = arrive;
            self.wire.push_back((arrive, item));
        }
    }

    /// Hand out, in order, every packet that has arrived at the far end by
    /// `now`, with its arrival time.
    pub fn poll(&mut self, now: u64, out: &mut impl FnMut(u64, T)) {
        self.advance(now);
        while let Some(&(arrive, _)) = self.wire.front() {
            if arrive > now {
                break;
            }
            let (arrive, item) = self.wire.pop_front().expect("front exists");
            self.stats.delivered += 1;
            out(arrive, item);
        }
    }

    /// When `poll` next has something to hand out (or to put on the link).
    pub fn next_deadline(&self) -> Option<u64> {
        let delayed = self.delayed.peek().map(|Reverse((t, _, _))| *t);
        let wire = self.wire.front().map(|(t, _)| *t);
        match (delayed, wire) {
            (Some(delayed), Some(wire)) => Some(delayed.min(wire)),
            (delayed, wire) => delayed.or(wire),
        }
    }

    /// Earliest time a packet not yet handed out can arrive at the far end:
    /// packets in the path arrive no earlier than their due time, packets
    /// pushed later no earlier than their push time. `None` when empty.
    pub fn earliest_arrival(&self) -> Option<u64> {
        self.next_deadline()
    }

    /// Hand out everything (end of a run), in order.
    pub fn drain(&mut self, out: &mut impl FnMut(u64, T)) {
        self.poll(u64::MAX, out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn router_batching_gives_a_poll_one_base_time_plus_its_forwarding_cost() {
        let router = RouterBatching {
            poll_ns: 250,
            per_packet_ns: 3,
        };
        let mut free = 0;
        // Arrivals 10, 20, 250 share the poll at 250; 251 waits for 500.
        let bases: Vec<u64> = [10, 20, 250, 251, 499, 500]
            .iter()
            .map(|&a| router.base(a, &mut free))
            .collect();
        assert_eq!(bases, [250, 253, 256, 500, 503, 506]);
        // A poll that overruns pushes the next one back (serial forwarding).
        let slow = RouterBatching {
            poll_ns: 10,
            per_packet_ns: 8,
        };
        let mut free = 0;
        let bases: Vec<u64> = [1, 2, 11]
            .iter()
            .map(|&a| slow.base(a, &mut free))
            .collect();
        assert_eq!(bases, [10, 18, 26]);
    }

    #[test]
    fn with_router_batching_no_delay_spread_one_poll_leaves_together() {
        // σ = 0: without the stage packets leave at their link spacing;
        // with it every packet of one poll is due at the poll's time (+ cost).
        let cfg = PathConfig {
            rate_bps: 0,
            delay_ns: 1_000,
            ..Default::default()
        };
        let run = |cfg: PathConfig| {
            let mut p = Path::new(cfg);
            for i in 0..4u64 {
                p.push(i * 100 + 1, 100, i);
            }
            let mut out = Vec::new();
            p.drain(&mut |a, x| out.push((a, x)));
            out
        };
        assert_eq!(run(cfg), [(1_001, 0), (1_101, 1), (1_201, 2), (1_301, 3)]);
        let batched = PathConfig {
            router: Some(RouterBatching {
                poll_ns: 1_000,
                per_packet_ns: 2,
            }),
            ..cfg
        };
        assert_eq!(
            run(batched),
            [(2_000, 0), (2_002, 1), (2_004, 2), (2_006, 3)]
        );
    }

    #[test]
    fn normal_draws_have_the_right_moments() {
        let mut r = XorShift::new(3);
        let n = 200_000;
        let xs: Vec<f64> = (0..n).map(|_| standard_normal(&mut r)).collect();
        let mean = xs.iter().sum::<f64>() / n as f64;
        let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n as f64;
        assert!(mean.abs() < 0.01, "{mean}");
        assert!((var - 1.0).abs() < 0.02, "{var}");
        let within1 = xs.iter().filter(|x| x.abs() < 1.0).count() as f64 / n as f64;
        assert!((within1 - 0.6827).abs() < 0.01, "{within1}");
    }
}
