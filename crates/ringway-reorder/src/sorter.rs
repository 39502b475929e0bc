//! The SRPIC sorter (Wu, DeMar, Crawford: "Sorting reordered packets with
//! interrupt coalescing", Listing 1), allocation-free in steady state.
//!
//! One *packet manager* per flow keeps three lists, as Listing 1:
//! the first packet of a sorting block goes to `CurrPacketList` and sets
//! `NextExp` to the sequence number that follows it; a later packet equal
//! to `NextExp` is appended to `CurrPacketList` (and moves `NextExp` on),
//! one below it is inserted in order into `PrevPacketList`, one above it in
//! order into `AfterPacketList`. A manager flushes its lists in the order
//! Prev, Curr, After when it holds `block_size` packets and is then
//! reinitialised (the next packet starts a new block and sets `NextExp`
//! again: "stateless across sorting blocks"); every manager flushes when
//! `ring_size` suitable packets were accepted since the last global flush,
//! and at the end of each receive batch (the caller calls
//! [`Srpic::flush_all`]). See `docs/srpic.md`.
//!
//! One departure from the pseudo code, for Table 1's baseline: the block
//! size is checked after every packet, the first included, so
//! `block_size` 1 delivers every packet at once (no sorting); Listing 1's
//! first-packet branch skips the check, which would make blocks of 2.
//!
//! All storage (packet nodes, managers, the flow hash table, the active
//! list) is allocated in [`Srpic::new`]; `push` and `flush_all` never
//! allocate.

use crate::key::FlowKey;
use crate::seq::SeqSpace;

const NIL: u32 = u32::MAX;
/// Idle managers examined per global flush by the eviction sweep.
const SWEEP_PER_FLUSH: usize = 4;

/// Sorter configuration.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct SrpicConfig {
    /// Packets a manager may hold before it flushes (paper: `BlockSize`, default 32).
    pub block_size: usize,
    /// Suitable packets accepted between two global flushes (the NIC ring
    /// size in the paper); also the number of packets the sorter can hold.
    pub ring_size: usize,
    /// Maximum number of flow managers; packets of further flows pass through (counted).
    pub max_flows: usize,
    /// A manager that held nothing for this many global flushes may be
    /// evicted to make room for new flows.
    pub idle_flushes: u32,
}

impl Default for SrpicConfig {
    fn default() -> Self {
        SrpicConfig {
            block_size: 32,
            ring_size: 1024,
            max_flows: 4096,
            idle_flushes: 64,
        }
    }
}

/// How the sorter should treat one packet (see [`crate::classify`]).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Class {
    /// A suitable packet of flow `key` with sequence number `seq`; after it
    /// the next expected sequence number is `seq + len` (TCP: payload bytes,
    /// RTP: 1).
    Flow {
        /// Flow identity (e.g. the TCP 5-tuple, or source, SSRC and payload type).
        key: FlowKey,
        /// Sequence number (in the sorter's [`SeqSpace`]).
        seq: u32,
        /// Sequence-space length of the packet.
        len: u32,
    },
    /// An unsuitable packet of a recognisable flow (e.g. a TCP FIN): the
    /// flow's held packets are flushed first, then this packet is emitted.
    /// It is never held.
    Bypass {
        /// Flow identity, as for [`Class::Flow`].
        key: FlowKey,
    },
    /// Not sortable at all: emitted immediately, never held.
    PassThrough,
}

/// Why lists were flushed.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum Why {
    Block,
    Ring,
    Batch,
    Bypass,
}

/// Counters of a sorter.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct SrpicStats {
    /// Packets given to `push`.
    pub packets: u64,
    /// Packets emitted (held and passed through).
    pub emitted: u64,
    /// Packets emitted immediately (PassThrough, Bypass, or no manager free).
    pub passed_through: u64,
    /// Of those, packets of new flows refused because the flow table was full.
    pub table_full: u64,
    /// Suitable packets put on PrevPacketList / CurrPacketList / AfterPacketList.
    pub to_prev: u64,
    /// See `to_prev`.
    pub to_curr: u64,
    /// See `to_prev`.
    pub to_after: u64,
    /// Manager flushes because a manager reached `block_size`.
    pub block_flushes: u64,
    /// Global flushes because `ring_size` packets were accepted.
    pub ring_flushes: u64,
    /// Global flushes requested by the caller (end of receive batch).
    pub batch_flushes: u64,
    /// Manager flushes caused by a Bypass packet of the flow.
    pub bypass_flushes: u64,
    /// Flow managers created / evicted.
    pub flows_created: u64,
    /// See `flows_created`.
    pub flows_evicted: u64,
    /// Flow managers in use now.
    pub flows: usize,
    /// Packets held now.
    pub held: usize,
    /// Most packets ever held at once.
    pub held_max: usize,
}

/// A copy of one manager's state, for tests and debugging (allocates).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FlowSnapshot {
    /// `NextExp` (0 in a reinitialised manager, as the paper zeroes it).
    pub next_exp: u32,
    /// `PacketCnt`: packets held by this manager.
    pub packet_cnt: usize,
    /// Sequence numbers on PrevPacketList, list order.
    pub prev: Vec<u32>,
    /// Sequence numbers on CurrPacketList, list order.
    pub curr: Vec<u32>,
    /// Sequence numbers on AfterPacketList, list order.
    pub after: Vec<u32>,
}

#[derive(Debug)]
struct Node<T> {
    item: Option<T>,
    seq: u32,
    len: u32,
    next: u32,
}

#[derive(Copy, Clone, Debug)]
struct List {
    head: u32,
    tail: u32,
}

impl List {
    const EMPTY: List = List {
        head: NIL,
        tail: NIL,
    };
}

#[derive(Clone, Debug)]
struct Manager {
    key: FlowKey,
    hash: u64,
    in_use: bool,
    next_exp: u32,
    cnt: u32,
    prev: List,
    curr: List,
    after: List,
    /// Position in the active list, or NIL.
    active_pos: u32,
    /// Epoch (global flush count) of the last packet.
    last_epoch: u64,
}

impl Manager {
    fn empty() -> Self {
        Manager {
            key: FlowKey::from_u64(0),
            hash: 0,
            in_use: false,
            next_exp: 0,
            cnt: 0,
            prev: List::EMPTY,
            curr: List::EMPTY,
            after: List::EMPTY,
            active_pos: NIL,
            last_epoch: 0,
        }
    }
}

/// The SRPIC sorter over items of type `T` (packet handles, buffers, indices).
#[derive(Debug)]
pub struct Srpic<T> {
    cfg: SrpicConfig,
    space: SeqSpace,
    nodes: Vec<Node<T>>,
    free_node: u32,
    managers: Vec<Manager>,
    free_mgr: Vec<u32>,
    table: Vec<u32>,
    mask: usize,
    active: Vec<u32>,
    /// Suitable packets accepted since the last global flush (the paper's global counter).
    global_cnt: usize,
    epoch: u64,
    sweep_hand: usize,
    stats: SrpicStats,
}

impl<T> Srpic<T> {
    /// Allocate a sorter for sequence space `space`. Zero sizes are raised
    /// to 1 (`max_flows` may be 0: everything passes through).
    pub fn new(cfg: SrpicConfig, space: SeqSpace) -> Self {
        let cfg = SrpicConfig {
            block_size: cfg.block_size.clamp(1, u32::MAX as usize / 2),
            ring_size: cfg.ring_size.clamp(1, u32::MAX as usize / 2),
            max_flows: cfg.max_flows.min(u32::MAX as usize / 4),
            idle_flushes: cfg.idle_flushes,
        };
        let mut nodes = Vec::with_capacity(cfg.ring_size);
        for i in 0..cfg.ring_size {
            nodes.push(Node {
                item: None,
                seq: 0,
                len: 0,
                next: if i + 1 < cfg.ring_size {
                    (i + 1) as u32
                } else {
                    NIL
                },
            });
        }
        let table_len = (cfg.max_flows * 2).next_power_of_two().max(2);
        Srpic {
            cfg,
            space,
            nodes,
            free_node: 0,
            managers: vec![Manager::empty(); cfg.max_flows],
            free_mgr: (0..cfg.max_flows as u32).rev().collect(),
            table: vec![NIL; table_len],
            mask: table_len - 1,
            active: Vec::with_capacity(cfg.max_flows),
            global_cnt: 0,
            epoch: 0,
            sweep_hand: 0,
            stats: SrpicStats::default(),
        }
    }

    /// The configuration in use (after clamping).
    pub fn config(&self) -> &SrpicConfig {
        &self.cfg
    }

    /// The sequence space in use.
    pub fn space(&self) -> SeqSpace {
        self.space
    }

    /// Counters.
    pub fn stats(&self) -> SrpicStats {
        self.stats
    }

    /// Packets held now.
    pub fn held(&self) -> usize {
        self.stats.held
    }

    /// Offer one packet. Emits, through `out`, zero or more packets in their
    /// final order (possibly including this one).
    pub fn push(&mut self, class: Class, item: T, out: &mut impl FnMut(T)) {
        self.stats.packets += 1;
        let (key, seq, len) = match class {
            Class::PassThrough => return self.pass(item, out),
            Class::Bypass { key } => {
                if let Some(m) = self.lookup(&key) {
                    if self.managers[m as usize].cnt > 0 {
                        self.stats.bypass_flushes += 1;
                        self.flush_manager(m, Why::Bypass, out);
                    }
                }
                return self.pass(item, out);
            }
            Class::Flow { key, seq, len } => (key, self.space.norm(seq), len),
        };
        let m = match self.lookup(&key) {
            Some(m) => m,
            None => match self.insert(key) {
                Some(m) => m,
                None => {
                    self.stats.table_full += 1;
                    return self.pass(item, out);
                }
            },
        };
        if self.free_node == NIL {
            // Cannot happen (global_cnt bounds what is held), but stay safe.
            self.flush_all_why(Why::Ring, out);
        }
        let n = self.free_node;
        {
            let node = &mut self.nodes[n as usize];
            self.free_node = node.next;
            node.item = Some(item);
            node.seq = seq;
            node.len = len;
            node.next = NIL;
        }
        self.place(m, n);
        let epoch = self.epoch;
        let mgr = &mut self.managers[m as usize];
        mgr.last_epoch = epoch;
        mgr.cnt += 1;
        let cnt = mgr.cnt;
        if cnt == 1 {
            mgr.active_pos = self.active.len() as u32;
            self.active.push(m);
        }
        self.stats.held += 1;
        self.stats.held_max = self.stats.held_max.max(self.stats.held);
        self.global_cnt += 1;
        if cnt as usize >= self.cfg.block_size {
            self.stats.block_flushes += 1;
            self.flush_manager(m, Why::Block, out);
        }
        if self.global_cnt >= self.cfg.ring_size {
            self.flush_all_why(Why::Ring, out);
        }
    }

    /// Flush every manager (call at the end of each receive batch).
    pub fn flush_all(&mut self, out: &mut impl FnMut(T)) {
        self.flush_all_why(Why::Batch, out);
    }

    /// State of flow `key`, if it has a manager (allocates; for tests/debugging).
    pub fn snapshot(&self, key: impl Into<FlowKey>) -> Option<FlowSnapshot> {
        let m = &self.managers[self.lookup(&key.into())? as usize];
        let walk = |l: List| {
            let mut v = Vec::new();
            let mut i = l.head;
            while i != NIL {
                v.push(self.nodes[i as usize].seq);
                i = self.nodes[i as usize].next;
            }
            v
        };
        Some(FlowSnapshot {
            next_exp: m.next_exp,
            packet_cnt: m.cnt as usize,
            prev: walk(m.prev),
            curr: walk(m.curr),
            after: walk(m.after),
        })
    }

    fn pass(&mut self, item: T, out: &mut impl FnMut(T)) {
        self.stats.passed_through += 1;
        self.stats.emitted += 1;
        out(item);
    }

    /// Put node `n` on the right list of manager `m` (Listing 1's core).
    fn place(&mut self, m: u32, n: u32) {
        let sp = self.space;
        let (seq, len) = {
            let node = &self.nodes[n as usize];
            (node.seq, node.len)
        };
        let mgr = &self.managers[m as usize];
        let (mut prev, mut curr, mut after) = (mgr.prev, mgr.curr, mgr.after);
        let mut next_exp = mgr.next_exp;
        if mgr.cnt == 0 {
            // First packet of a sorting block: it anchors NextExp.
            self.append(&mut curr, n);
            self.stats.to_curr += 1;
            next_exp = sp.add(seq, len);
        } else if sp.lt(seq, next_exp) {
            self.insert_sorted(&mut prev, n, seq);
            self.stats.to_prev += 1;
        } else if seq == next_exp {
            self.append(&mut curr, n);
            self.stats.to_curr += 1;
            next_exp = sp.add(seq, len);
        } else {
            self.insert_sorted(&mut after, n, seq);
            self.stats.to_after += 1;
        }
        let mgr = &mut self.managers[m as usize];
        (mgr.prev, mgr.curr, mgr.after, mgr.next_exp) = (prev, curr, after, next_exp);
    }

    fn append(&mut self, l: &mut List, n: u32) {
        if l.tail == NIL {
            l.head = n;
        } else {
            self.nodes[l.tail as usize].next = n;
        }
        l.tail = n;
    }

    /// Insert keeping ascending serial order; equal numbers keep arrival order.
    fn insert_sorted(&mut self, l: &mut List, n: u32, seq: u32) {
        let sp = self.space;
        if l.tail == NIL || !sp.lt(seq, self.nodes[l.tail as usize].seq) {
            return self.append(l, n);
        }
        let mut prev = NIL;
        let mut cur = l.head;
        while cur != NIL && !sp.lt(seq, self.nodes[cur as usize].seq) {
            prev = cur;
            cur = self.nodes[cur as usize].next;
        }
        self.nodes[n as usize].next = cur;
        if prev == NIL {
            l.head = n;
        } else {
            self.nodes[prev as usize].next = n;
        }
    }

    fn emit_list(&mut self, head: u32, out: &mut impl FnMut(T)) {
        let mut i = head;
        while i != NIL {
            let node = &mut self.nodes[i as usize];
            let next = node.next;
            if let Some(it) = node.item.take() {
                out(it);
                self.stats.emitted += 1;
            }
            node.next = self.free_node;
            self.free_node = i;
            self.stats.held -= 1;
            i = next;
        }
    }

    /// Deliver Prev, Curr, After of manager `m` and reinitialise it
    /// (without touching the active list).
    fn flush_lists(&mut self, m: u32, out: &mut impl FnMut(T)) {
        let (prev, curr, after) = {
            let mgr = &mut self.managers[m as usize];
            let lists = (mgr.prev.head, mgr.curr.head, mgr.after.head);
            mgr.prev = List::EMPTY;
            mgr.curr = List::EMPTY;
            mgr.after = List::EMPTY;
            mgr.cnt = 0;
            mgr.next_exp = 0;
            mgr.active_pos = NIL;
            lists
        };
        self.emit_list(prev, out);
        self.emit_list(curr, out);
        self.emit_list(after, out);
    }

    fn flush_manager(&mut self, m: u32, why: Why, out: &mut impl FnMut(T)) {
        debug_assert!(matches!(why, Why::Block | Why::Bypass));
        let pos = self.managers[m as usize].active_pos;
        if pos != NIL {
            let last = *self.active.last().expect("active list holds m");
            self.active.swap_remove(pos as usize);
            if last != m {
                self.managers[last as usize].active_pos = pos;
            }
        }
        self.flush_lists(m, out);
    }

    fn flush_all_why(&mut self, why: Why, out: &mut impl FnMut(T)) {
        match why {
            Why::Ring => self.stats.ring_flushes += 1,
            _ => self.stats.batch_flushes += 1,
        }
        for i in 0..self.active.len() {
            let m = self.active[i];
            self.flush_lists(m, out);
        }
        self.active.clear();
        self.global_cnt = 0;
        self.epoch += 1;
        self.sweep();
    }

    /// Evict a few managers that stayed empty for `idle_flushes` global flushes.
    fn sweep(&mut self) {
        let n = self.managers.len();
        if n == 0 || self.free_mgr.len() == n {
            return;
        }
        for _ in 0..SWEEP_PER_FLUSH.min(n) {
            let m = self.sweep_hand;
            self.sweep_hand = if m + 1 == n { 0 } else { m + 1 };
            let mgr = &self.managers[m];
            if mgr.in_use
                && mgr.cnt == 0
                && self.epoch.saturating_sub(mgr.last_epoch) > self.cfg.idle_flushes as u64
            {
                self.remove(m as u32);
            }
        }
    }

    fn lookup(&self, key: &FlowKey) -> Option<u32> {
        if self.managers.is_empty() {
            return None;
        }
        let mut i = key.hash64() as usize & self.mask;
        loop {
            let m = self.table[i];
            if m == NIL {
                return None;
            }
            if self.managers[m as usize].key == *key {
                return Some(m);
            }
            i = (i + 1) & self.mask;
        }
    }

    fn insert(&mut self, key: FlowKey) -> Option<u32> {
        let m = self.free_mgr.pop()?;
        let hash = key.hash64();
        let mut i = hash as usize & self.mask;
        while self.table[i] != NIL {
            i = (i + 1) & self.mask;
        }
        self.table[i] = m;
        let mgr = &mut self.managers[m as usize];
        *mgr = Manager::empty();
        mgr.key = key;
        mgr.hash = hash;
        mgr.in_use = true;
        self.stats.flows_created += 1;
        self.stats.flows += 1;
        Some(m)
    }

    /// Remove an empty manager from the table (linear probing, backward-shift delete).
    fn remove(&mut self, m: u32) {
        let key = self.managers[m as usize].key;
        let mut i = self.managers[m as usize].hash as usize & self.mask;
        while self.table[i] != m {
            if self.table[i] == NIL {
                return;
            }
            i = (i + 1) & self.mask;
        }
        let mut j = i;
        loop {
            j = (j + 1) & self.mask;
            let t = self.table[j];
            if t == NIL {
                break;
            }
            let k = self.managers[t as usize].hash as usize & self.mask;
            let stays = if i <= j {
                i < k && k <= j
            } else {
                i < k || k <= j
            };
            if !stays {
                self.table[i] = t;
                i = j;
            }
        }
        self.table[i] = NIL;
        let mgr = &mut self.managers[m as usize];
        debug_assert_eq!(mgr.key, key);
        mgr.in_use = false;
        self.free_mgr.push(m);
        self.stats.flows_evicted += 1;
        self.stats.flows -= 1;
    }
}
