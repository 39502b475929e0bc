//! The reference SRPIC sorter: Listing 1 of the paper transcribed with
//! linked lists (one node pool, three lists per manager, sorted insertion
//! on arrival). It is the oracle for [`crate::Srpic`]: the property test
//! `tests/oracle.rs` asserts that both emit the same packets in the same
//! order with the same counters, and `ringway reorder bench` runs both on
//! the same input. It is slower (a node per packet, a full-key hash per
//! packet, counters per packet) and is not used on any data path.
//!
//! The semantics, departures included, are the ones documented on
//! [`crate::sorter`] and in `docs/srpic.md`.

use crate::key::FlowKey;
use crate::seq::SeqSpace;
use crate::sorter::{Class, FlowSnapshot, SrpicConfig, SrpicStats};

const NIL: u32 = u32::MAX;
/// Idle managers examined per global flush by the eviction sweep.
const SWEEP_PER_FLUSH: usize = 4;

/// Why lists were flushed.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum Why {
    Block,
    Ring,
    Batch,
    Bypass,
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

/// The reference (linked-list) SRPIC sorter over items of type `T`; same
/// API and output as [`crate::Srpic`].
#[derive(Debug)]
pub struct ReferenceSrpic<T> {
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

impl<T> ReferenceSrpic<T> {
    /// Allocate a sorter for sequence space `space`. Zero sizes are raised
    /// to 1 (`max_flows` may be 0: everything passes through).
    pub fn new(cfg: SrpicConfig, space: SeqSpace) -> Self {
        let cfg = SrpicConfig {
            block_size: cfg.block_size.clamp(1, u32::MAX as usize / 2),
            ring_size: cfg.ring_size.clamp(1, u32::MAX as usize / 2),
            max_flows: cfg.max_flows.min(u32::MAX as usize / 4),
            idle_flushes: cfg.idle_flushes.min(u32::MAX / 2),
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
        ReferenceSrpic {
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
                if let Some(manager) = self.lookup(&key) {
                    if self.managers[manager as usize].cnt > 0 {
                        self.stats.bypass_flushes += 1;
                        self.flush_manager(manager, Why::Bypass, out);
                    }
                }
                return self.pass(item, out);
            }
            Class::Flow { key, seq, len } => (key, self.space.norm(seq), len),
        };
        let manager = match self.lookup(&key) {
            Some(manager) => manager,
            None => match self.insert(key) {
                Some(manager) => manager,
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
        let free = self.free_node;
        {
            let node = &mut self.nodes[free as usize];
            self.free_node = node.next;
            node.item = Some(item);
            node.seq = seq;
            node.len = len;
            node.next = NIL;
        }
        self.place(manager, free);
        let epoch = self.epoch;
        let mgr = &mut self.managers[manager as usize];
        mgr.last_epoch = epoch;
        mgr.cnt += 1;
        let cnt = mgr.cnt;
        if cnt == 1 {
            mgr.active_pos = self.active.len() as u32;
            self.active.push(manager);
        }
        self.stats.held += 1;
        self.stats.held_max = self.stats.held_max.max(self.stats.held);
        self.global_cnt += 1;
        if cnt as usize >= self.cfg.block_size {
            self.stats.block_flushes += 1;
            self.flush_manager(manager, Why::Block, out);
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
        let manager = &self.managers[self.lookup(&key.into())? as usize];
        let walk = |l: List| {
            let mut items = Vec::new();
            let mut node = l.head;
            while node != NIL {
                items.push(self.nodes[node as usize].seq);
                node = self.nodes[node as usize].next;
            }
            items
        };
        Some(FlowSnapshot {
            next_exp: manager.next_exp,
            packet_cnt: manager.cnt as usize,
            prev: walk(manager.prev),
            curr: walk(manager.curr),
            after: walk(manager.after),
        })
    }

    fn pass(&mut self, item: T, out: &mut impl FnMut(T)) {
        self.stats.passed_through += 1;
        self.stats.emitted += 1;
        out(item);
    }

    /// Put node `n` on the right list of manager `m` (Listing 1's core).
    fn place(&mut self, m: u32, n: u32) {
        let space = self.space;
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
            next_exp = space.add(seq, len);
        } else if space.lt(seq, next_exp) {
            self.insert_sorted(&mut prev, n, seq);
            self.stats.to_prev += 1;
        } else if seq == next_exp {
            self.append(&mut curr, n);
            self.stats.to_curr += 1;
            next_exp = space.add(seq, len);
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
        let space = self.space;
        if l.tail == NIL || !space.lt(seq, self.nodes[l.tail as usize].seq) {
            return self.append(l, n);
        }
        let mut prev = NIL;
        let mut cur = l.head;
        while cur != NIL && !space.lt(seq, self.nodes[cur as usize].seq) {
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
        let mut cursor = head;
        while cursor != NIL {
            let node = &mut self.nodes[cursor as usize];
            let next = node.next;
            if let Some(item) = node.item.take() {
                out(item);
                self.stats.emitted += 1;
            }
            node.next = self.free_node;
            self.free_node = cursor;
            self.stats.held -= 1;
            cursor = next;
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
            let manager = self.active[i];
            self.flush_lists(manager, out);
        }
        self.active.clear();
        self.global_cnt = 0;
        self.epoch += 1;
        self.sweep();
    }

    /// Evict a few managers that stayed empty for `idle_flushes` global flushes.
    fn sweep(&mut self) {
        let managers = self.managers.len();
        if managers == 0 || self.free_mgr.len() == managers {
            return;
        }
        for _ in 0..SWEEP_PER_FLUSH.min(managers) {
            let hand = self.sweep_hand;
            self.sweep_hand = if hand + 1 == managers { 0 } else { hand + 1 };
            let mgr = &self.managers[hand];
            if mgr.in_use
                && mgr.cnt == 0
                && self.epoch.saturating_sub(mgr.last_epoch) > self.cfg.idle_flushes as u64
            {
                self.remove(hand as u32);
            }
        }
    }

    fn lookup(&self, key: &FlowKey) -> Option<u32> {
        if self.managers.is_empty() {
            return None;
        }
        let mut slot = key.hash64() as usize & self.mask;
        loop {
            let manager = self.table[slot];
            if manager == NIL {
                return None;
            }
            if self.managers[manager as usize].key == *key {
                return Some(manager);
            }
            slot = (slot + 1) & self.mask;
        }
    }

    fn insert(&mut self, key: FlowKey) -> Option<u32> {
        let manager = self.free_mgr.pop()?;
        let hash = key.hash64();
        let mut slot = hash as usize & self.mask;
        while self.table[slot] != NIL {
            slot = (slot + 1) & self.mask;
        }
        self.table[slot] = manager;
        let mgr = &mut self.managers[manager as usize];
        *mgr = Manager::empty();
        mgr.key = key;
        mgr.hash = hash;
        mgr.in_use = true;
        self.stats.flows_created += 1;
        self.stats.flows += 1;
        Some(manager)
    }

    /// Remove an empty manager from the table (linear probing, backward-shift delete).
    fn remove(&mut self, m: u32) {
        let key = self.managers[m as usize].key;
        let mut slot = self.managers[m as usize].hash as usize & self.mask;
        while self.table[slot] != m {
            if self.table[slot] == NIL {
                return;
            }
            slot = (slot + 1) & self.mask;
        }
        let mut probe = slot;
        loop {
            probe = (probe + 1) & self.mask;
            let occupant = self.table[probe];
            if occupant == NIL {
                break;
            }
            let home = self.managers[occupant as usize].hash as usize & self.mask;
            let stays = if slot <= probe {
                slot < home && home <= probe
            } else {
                slot < home || home <= probe
            };
            if !stays {
                self.table[slot] = occupant;
                slot = probe;
            }
        }
        self.table[slot] = NIL;
        let mgr = &mut self.managers[m as usize];
        debug_assert_eq!(mgr.key, key);
        mgr.in_use = false;
        self.free_mgr.push(m);
        self.stats.flows_evicted += 1;
        self.stats.flows -= 1;
    }
}
