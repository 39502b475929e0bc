//! The in-memory network of the deterministic simulations (`sim.rs`,
//! `dispatch_sim.rs`): a seeded link that loses, duplicates, reorders and
//! delays datagrams, a trace of what it delivered, and the node wrappers
//! (in the style of smoltcp's `tests/netsim.rs`). Addresses are from the
//! documentation range 192.0.2.0/24; nothing touches a network.

// Each simulation uses a part of this module.
#![allow(dead_code)]

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use ringway_load::sip::MessageKind;
use ringway_sip::Proxy;
use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};
use std::net::SocketAddr;

pub(crate) const MS: u64 = 1_000_000;
/// Bounds of one run: simulated time and loop steps.
pub(crate) const MAX_SIM_TIME: u64 = 600_000 * MS;
pub(crate) const MAX_STEPS: u64 = 1_000_000;

pub(crate) fn addr(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

/// Datagrams a node sent while handling an event: (destination, bytes).
pub(crate) type Sent = Vec<(SocketAddr, Vec<u8>)>;

/// The proxy under test, driven only through these three calls (a fresh
/// worker handle per call: any worker sees every transaction).
pub(crate) struct ProxyNode(pub(crate) Proxy);

impl ProxyNode {
    pub(crate) fn handle(&self, now: u64, src: SocketAddr, data: &[u8], out: &mut Sent) {
        self.0
            .worker()
            .handle(now, src, data, &mut |to, b| out.push((to, b.to_vec())));
    }
    pub(crate) fn on_timer(&self, now: u64, out: &mut Sent) {
        self.0
            .worker()
            .on_timer(now, &mut |to, b| out.push((to, b.to_vec())));
    }
    pub(crate) fn next_deadline(&self) -> Option<u64> {
        self.0.next_deadline()
    }
}

/// The message kind a generator reports matches the datagram's start line.
pub(crate) fn kind_matches(kind: MessageKind, b: &[u8]) -> bool {
    match kind {
        MessageKind::Invite => b.starts_with(b"INVITE "),
        MessageKind::Provisional => b.starts_with(b"SIP/2.0 1"),
        MessageKind::InviteOk => b.starts_with(b"SIP/2.0 200 "),
        MessageKind::Ack => b.starts_with(b"ACK "),
        MessageKind::Bye => b.starts_with(b"BYE "),
        MessageKind::Final => b.starts_with(b"SIP/2.0 "),
    }
}

/// A generator's output sink collecting into `out`.
pub(crate) fn collect(out: &mut Sent) -> impl FnMut(SocketAddr, MessageKind, &[u8]) + '_ {
    |dst, kind, b| {
        assert!(
            kind_matches(kind, b),
            "{kind:?}: {}",
            String::from_utf8_lossy(b)
        );
        out.push((dst, b.to_vec()));
    }
}

/// Impairments applied to each datagram, in this order: loss; duplication
/// (the copy is impaired on its own from here); reordering (extra delay,
/// so later datagrams overtake it); delay plus uniform jitter (jitter
/// reorders datagrams sent close together too).
#[derive(Copy, Clone, Debug)]
pub(crate) struct LinkConfig {
    pub(crate) loss: f64,
    pub(crate) duplicate: f64,
    pub(crate) reorder: f64,
    /// Extra delay of a reordered datagram: uniform in this range (ns).
    pub(crate) reorder_delay: (u64, u64),
    pub(crate) delay: u64,
    pub(crate) jitter: u64,
}

/// Moderate impairments: every call still completes.
pub(crate) const MODERATE: LinkConfig = LinkConfig {
    loss: 0.05,
    duplicate: 0.03,
    reorder: 0.05,
    reorder_delay: (2 * MS, 20 * MS),
    delay: MS,
    jitter: 2 * MS,
};

/// A datagram in flight.
pub(crate) struct Packet {
    pub(crate) src: SocketAddr,
    pub(crate) dst: SocketAddr,
    /// Send order on its (src, dst) path (a duplicate keeps the original's).
    index: u64,
    pub(crate) data: Vec<u8>,
}

/// What the link did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct LinkCounts {
    pub(crate) sent: u64,
    pub(crate) lost: u64,
    pub(crate) duplicated: u64,
    /// Datagrams delivered after one sent later on the same path.
    pub(crate) reordered: u64,
    pub(crate) delivered: u64,
}

/// The in-memory network: every node's datagrams go through it.
pub(crate) struct Link {
    cfg: LinkConfig,
    rng: StdRng,
    /// (delivery time, queueing number) → packet.
    queue: BinaryHeap<Reverse<(u64, u64)>>,
    packets: BTreeMap<u64, Packet>,
    next_number: u64,
    /// Per path: datagrams sent, highest send index delivered.
    sent_on: BTreeMap<(SocketAddr, SocketAddr), u64>,
    delivered_on: BTreeMap<(SocketAddr, SocketAddr), u64>,
    pub(crate) counts: LinkCounts,
}

impl Link {
    pub(crate) fn new(cfg: LinkConfig, seed: u64) -> Link {
        Link {
            cfg,
            rng: StdRng::seed_from_u64(seed),
            queue: BinaryHeap::new(),
            packets: BTreeMap::new(),
            next_number: 0,
            sent_on: BTreeMap::new(),
            delivered_on: BTreeMap::new(),
            counts: LinkCounts::default(),
        }
    }

    /// Send everything node `from` emitted at `now`.
    pub(crate) fn send_all(&mut self, now: u64, from: SocketAddr, sent: Sent) {
        for (dst, data) in sent {
            self.send(now, from, dst, data);
        }
    }

    pub(crate) fn send(&mut self, now: u64, src: SocketAddr, dst: SocketAddr, data: Vec<u8>) {
        self.counts.sent += 1;
        let index = self.sent_on.entry((src, dst)).or_default();
        *index += 1;
        let index = *index;
        if self.rng.gen_bool(self.cfg.loss) {
            self.counts.lost += 1;
            return;
        }
        let copies = if self.rng.gen_bool(self.cfg.duplicate) {
            self.counts.duplicated += 1;
            2
        } else {
            1
        };
        for _ in 0..copies {
            let mut at = now + self.cfg.delay + self.rng.gen_range(0..=self.cfg.jitter);
            if self.rng.gen_bool(self.cfg.reorder) {
                let (lo, hi) = self.cfg.reorder_delay;
                at += self.rng.gen_range(lo..=hi);
            }
            let n = self.next_number;
            self.next_number += 1;
            self.queue.push(Reverse((at, n)));
            let data = data.clone();
            self.packets.insert(
                n,
                Packet {
                    src,
                    dst,
                    index,
                    data,
                },
            );
        }
    }

    pub(crate) fn next_at(&self) -> Option<u64> {
        self.queue.peek().map(|Reverse((at, _))| *at)
    }

    /// The next datagram due at `now`.
    pub(crate) fn pop_due(&mut self, now: u64) -> Option<Packet> {
        let &Reverse((at, n)) = self.queue.peek()?;
        if at > now {
            return None;
        }
        self.queue.pop();
        let p = self.packets.remove(&n).expect("queued packet");
        let highest = self.delivered_on.entry((p.src, p.dst)).or_default();
        if p.index < *highest {
            self.counts.reordered += 1;
        }
        *highest = (*highest).max(p.index);
        self.counts.delivered += 1;
        Some(p)
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }
}

/// FNV-1a over every delivered datagram with its time and addresses.
pub(crate) struct Trace(pub(crate) u64);

impl Trace {
    pub(crate) fn add(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 ^ u64::from(b)).wrapping_mul(0x100_0000_01b3);
        }
    }
    pub(crate) fn delivered(&mut self, now: u64, p: &Packet) {
        self.add(&now.to_le_bytes());
        self.add(p.src.to_string().as_bytes());
        self.add(p.dst.to_string().as_bytes());
        self.add(&p.data);
    }
}

/// Call starts in bursts: one to three calls at once, then a gap of up to
/// 10 ms, until `total` calls have started (seeded).
pub(crate) struct Starts {
    rng: StdRng,
    next: u64,
    started: u64,
    total: u64,
}

impl Starts {
    pub(crate) fn new(seed: u64, total: u64) -> Starts {
        Starts {
            rng: StdRng::seed_from_u64(seed),
            next: 0,
            started: 0,
            total,
        }
    }

    /// When the next burst is due (`None`: every call has started).
    pub(crate) fn next_at(&self) -> Option<u64> {
        (self.started < self.total).then_some(self.next)
    }

    /// How many calls to start at `now` (0 when no burst is due).
    pub(crate) fn due(&mut self, now: u64) -> u64 {
        if self.next_at().is_none_or(|at| at > now) {
            return 0;
        }
        let count = self.rng.gen_range(1..=3).min(self.total - self.started);
        self.started += count;
        self.next = now + self.rng.gen_range(0..=10 * MS);
        count
    }

    pub(crate) fn all_started(&self) -> bool {
        self.started == self.total
    }
}
