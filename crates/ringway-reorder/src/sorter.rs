//! The SRPIC sorter (Wu, DeMar, Crawford: "Sorting reordered packets with
//! interrupt coalescing", Listing 1), allocation-free in steady state.
//!
//! One *packet manager* per flow sorts, as Listing 1: the first packet of a
//! sorting block goes to `CurrPacketList` and sets `NextExp` to the
//! sequence number that follows it; a later packet equal to `NextExp` is
//! appended to `CurrPacketList` (and moves `NextExp` on), one below it is
//! inserted in order into `PrevPacketList`, one above it in order into
//! `AfterPacketList`. A manager flushes its lists in the order Prev, Curr,
//! After when it holds `block_size` packets and is then reinitialised (the
//! next packet starts a new block and sets `NextExp` again: "stateless
//! across sorting blocks"); every manager flushes when `ring_size`
//! suitable packets were accepted since the last global flush, and at the
//! end of each receive batch (the caller calls [`Srpic::flush_all`]). See
//! `docs/srpic.md`.
//!
//! One departure from the pseudo code, for Table 1's baseline: the block
//! size is checked after every packet, the first included, so
//! `block_size` 1 delivers every packet at once (no sorting); Listing 1's
//! first-packet branch skips the check, which would make blocks of 2.
//!
//! **How it is fast and still Listing 1.** The output is defined by
//! Listing 1; [`crate::reference::ReferenceSrpic`] is that pseudo code with
//! linked lists, and the property test `tests/oracle.rs` holds this sorter
//! to the same emitted order and the same counters. What differs is where
//! the work is done:
//!
//! * *Slots by arrival.* A packet accepted since the last global flush is
//!   stored at index `global_cnt` (the paper's global counter), which is
//!   below `ring_size`: no free list, no node pool. A manager chains its
//!   slots in arrival order (`head`, `tail`, one link per slot).
//! * *Lists decided on arrival, built at the flush.* On arrival only the
//!   list (Prev, Curr or After) is decided, by Listing 1's `NextExp` rule,
//!   and recorded in the slot. A block with nothing on Prev or After (the
//!   common, in-order case) is emitted in arrival order: a run of
//!   consecutive slots without even following the links. Otherwise the
//!   flush builds Prev and After in a scratch array by the same sorted
//!   insertion, in the same arrival order, as the linked lists (tail
//!   first, then the first larger element from the head), so even equal
//!   and wrapping sequence numbers land where Listing 1 puts them.
//! * *Flow lookup.* A last-flow cache (one key compare) in front of an
//!   open-addressing table whose entries carry 32 bits of a keyed hash, so
//!   the full key is compared only on a tag match (full-key confirmation:
//!   colliding flows never share a manager).
//! * *Counters per block.* The per-packet path updates only the manager and
//!   the global counter; the statistics are derived (`to_curr` = accepted
//!   − `to_prev` − `to_after`, `held` from the global counter and the
//!   packets flushed since, `held_max` at each flush).
//!
//! All storage (slots, managers, keys, the flow hash table, the active
//! list, the flush scratch) is allocated in [`Srpic::new`]; `push` and
//! `flush_all` never allocate.

use crate::key::{FlowKey, HashSeed};
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
    /// evicted to make room for new flows (at most 2^31 − 1; larger values
    /// are lowered to it).
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

/// Counters of a sorter.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
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

/// The list a packet was put on (Listing 1).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum ListTag {
    Prev,
    Curr,
    After,
}

/// One accepted packet, at its arrival index since the last global flush.
#[derive(Debug)]
struct Slot<T> {
    seq: u32,
    /// The manager's next slot in arrival order (NIL at its tail).
    link: u32,
    tag: ListTag,
    /// The packet, until it is emitted.
    item: Option<T>,
}

/// A manager in use (its key is in the table).
const IN_USE: u8 = 1;
/// The current block has a packet on PrevPacketList.
const HAS_PREV: u8 = 2;
/// The current block has a packet on AfterPacketList.
const HAS_AFTER: u8 = 4;

/// One flow's packet manager: one 64-byte cache line (the first slot of
/// its block is kept in the active list).
#[derive(Clone, Debug)]
#[repr(C, align(64))]
struct Manager {
    /// The flow's whole key (compared on every lookup: full-key confirmation).
    key: FlowKey,
    /// `IN_USE`, `HAS_PREV`, `HAS_AFTER` (neither list: the block leaves
    /// in arrival order).
    flags: u8,
    next_exp: u32,
    /// `PacketCnt`: packets in the current block, valid only while
    /// `epoch` is the sorter's epoch (a global flush reinitialises every
    /// manager without touching it); see [`Srpic::packet_cnt`].
    cnt: u32,
    /// Last slot of the block, in arrival order.
    tail: u32,
    /// Position in the active list (meaningful while `cnt > 0`).
    active_pos: u32,
    /// Low 32 bits of the epoch (global flush count) of the current
    /// block's packets, which is also the epoch of the manager's last
    /// packet (a block never outlives its epoch). 32 bits are exact: an
    /// idle manager is evicted long before its stamp could wrap (see
    /// [`Srpic::sweep`]).
    epoch: u32,
}

const _: () = assert!(std::mem::size_of::<Manager>() == 64);

impl Manager {
    const EMPTY: Manager = Manager {
        key: FlowKey::NONE,
        flags: 0,
        next_exp: 0,
        cnt: 0,
        tail: NIL,
        active_pos: NIL,
        epoch: 0,
    };
}

/// A flow-table entry: the manager index in the low 32 bits (NIL: empty),
/// the hash's high 32 bits above it.
const EMPTY_ENTRY: u64 = NIL as u64;

/// Scratch of one flush: (sequence number, slot) per list.
#[derive(Debug)]
struct Scratch {
    prev: Vec<(u32, u32)>,
    curr: Vec<u32>,
    after: Vec<(u32, u32)>,
}

/// The SRPIC sorter over items of type `T` (packet handles, buffers, indices).
#[derive(Debug)]
pub struct Srpic<T> {
    cfg: SrpicConfig,
    space: SeqSpace,
    /// `0xffff` (RTP) or `u32::MAX` (TCP).
    seq_mask: u32,
    /// Serial order in the space: `a < b` iff `((a - b) << shift) as i32 < 0`.
    shift: u32,
    block: u32,
    ring: u32,
    /// Suitable packets accepted since the last global flush (the paper's
    /// global counter); also the next free slot.
    global_cnt: u32,
    /// Of those, packets already emitted by manager flushes.
    flushed_in_epoch: u32,
    /// The last-flow cache: the manager of the last flow looked up (NIL:
    /// none); a hit is confirmed by the manager's whole key.
    last: u32,
    slots: Vec<Slot<T>>,
    managers: Vec<Manager>,
    free_mgr: Vec<u32>,
    table: Vec<u64>,
    mask: usize,
    seed: HashSeed,
    /// Managers holding packets, in the order they got their first one,
    /// with the slot of their block's first packet; the first `n_active`
    /// entries are in use.
    active: Vec<(u32, u32)>,
    n_active: u32,
    scratch: Scratch,
    epoch: u64,
    sweep_hand: usize,
    /// Suitable packets accepted before the current epoch.
    accepted_before: u64,
    passed_through: u64,
    table_full: u64,
    to_prev: u64,
    to_after: u64,
    block_flushes: u64,
    ring_flushes: u64,
    batch_flushes: u64,
    bypass_flushes: u64,
    flows_created: u64,
    flows_evicted: u64,
    flows: usize,
    held_max: usize,
}

/// `a < b` in serial order (see [`Srpic::shift`]).
#[inline(always)]
fn serial_lt(a: u32, b: u32, shift: u32) -> bool {
    ((a.wrapping_sub(b) << shift) as i32) < 0
}

/// Listing 1's `Add_packet_to_list_and_sort`, on an array: the tail is
/// checked first; otherwise the packet goes before the first element
/// (from the head) it precedes. Equal numbers keep arrival order.
#[inline]
fn insert_sorted(list: &mut Vec<(u32, u32)>, seq: u32, slot: u32, shift: u32) {
    match list.last() {
        Some(&(tail, _)) if serial_lt(seq, tail, shift) => {
            let position = list
                .iter()
                .position(|&(q, _)| serial_lt(seq, q, shift))
                .unwrap_or(list.len());
            list.insert(position, (seq, slot));
        }
        _ => list.push((seq, slot)),
    }
}

impl<T> Srpic<T> {
    /// Allocate a sorter for sequence space `space`. Zero sizes are raised
    /// to 1 (`max_flows` may be 0: everything passes through).
    pub fn new(cfg: SrpicConfig, space: SeqSpace) -> Self {
        Self::with_hash_seed(cfg, space, HashSeed::random())
    }

    /// A sorter whose flow-table hash uses `keys` instead of random keys.
    /// For tests only: keys chosen to make every flow collide exercise the
    /// full-key confirmation and the table's probing and deletion.
    #[doc(hidden)]
    pub fn with_hash_keys(cfg: SrpicConfig, space: SeqSpace, keys: [u64; 6]) -> Self {
        Self::with_hash_seed(cfg, space, HashSeed(keys))
    }

    fn with_hash_seed(cfg: SrpicConfig, space: SeqSpace, seed: HashSeed) -> Self {
        let cfg = SrpicConfig {
            block_size: cfg.block_size.clamp(1, u32::MAX as usize / 2),
            ring_size: cfg.ring_size.clamp(1, u32::MAX as usize / 2),
            max_flows: cfg.max_flows.min(u32::MAX as usize / 4),
            idle_flushes: cfg.idle_flushes.min(u32::MAX / 2),
        };
        // At most half full: 1.5 probes per lookup on average, 8 per line.
        let table_len = (cfg.max_flows * 2).next_power_of_two().max(2);
        let per_block = cfg.block_size.min(cfg.ring_size);
        let (seq_mask, shift) = match space {
            SeqSpace::U16 => (0xffff, 16),
            SeqSpace::U32 => (u32::MAX, 0),
        };
        Srpic {
            cfg,
            space,
            seq_mask,
            shift,
            block: cfg.block_size as u32,
            ring: cfg.ring_size as u32,
            global_cnt: 0,
            flushed_in_epoch: 0,
            last: NIL,
            slots: (0..cfg.ring_size)
                .map(|_| Slot {
                    seq: 0,
                    link: NIL,
                    tag: ListTag::Curr,
                    item: None,
                })
                .collect(),
            managers: vec![Manager::EMPTY; cfg.max_flows],
            free_mgr: (0..cfg.max_flows as u32).rev().collect(),
            table: vec![EMPTY_ENTRY; table_len],
            mask: table_len - 1,
            seed,
            active: vec![(NIL, NIL); cfg.max_flows],
            n_active: 0,
            scratch: Scratch {
                prev: Vec::with_capacity(per_block),
                curr: Vec::with_capacity(per_block),
                after: Vec::with_capacity(per_block),
            },
            epoch: 0,
            sweep_hand: 0,
            accepted_before: 0,
            passed_through: 0,
            table_full: 0,
            to_prev: 0,
            to_after: 0,
            block_flushes: 0,
            ring_flushes: 0,
            batch_flushes: 0,
            bypass_flushes: 0,
            flows_created: 0,
            flows_evicted: 0,
            flows: 0,
            held_max: 0,
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
        let held = self.held();
        let accepted = self.accepted_before + u64::from(self.global_cnt);
        SrpicStats {
            packets: accepted + self.passed_through,
            emitted: self.passed_through + accepted - held as u64,
            passed_through: self.passed_through,
            table_full: self.table_full,
            to_prev: self.to_prev,
            to_curr: accepted - self.to_prev - self.to_after,
            to_after: self.to_after,
            block_flushes: self.block_flushes,
            ring_flushes: self.ring_flushes,
            batch_flushes: self.batch_flushes,
            bypass_flushes: self.bypass_flushes,
            flows_created: self.flows_created,
            flows_evicted: self.flows_evicted,
            flows: self.flows,
            held,
            held_max: self.held_max.max(held),
        }
    }

    /// Packets held now.
    pub fn held(&self) -> usize {
        (self.global_cnt - self.flushed_in_epoch) as usize
    }

    /// Offer one packet. Emits, through `out`, zero or more packets in their
    /// final order (possibly including this one).
    #[inline]
    pub fn push(&mut self, class: Class, item: T, out: &mut impl FnMut(T)) {
        match class {
            Class::Flow { key, seq, len } => match self.find_or_insert(&key) {
                Some(manager) => self.place(manager, seq, len, item, out),
                None => {
                    self.table_full += 1;
                    self.pass(item, out)
                }
            },
            Class::Bypass { key } => {
                if let Some(manager) = self.find(&key) {
                    if self.packet_cnt(manager) > 0 {
                        self.bypass_flushes += 1;
                        self.flush_manager(manager, out);
                    }
                }
                self.pass(item, out)
            }
            Class::PassThrough => self.pass(item, out),
        }
    }

    /// Flush every manager (call at the end of each receive batch).
    pub fn flush_all(&mut self, out: &mut impl FnMut(T)) {
        self.batch_flushes += 1;
        self.flush_everything(out);
    }

    /// State of flow `key`, if it has a manager (allocates; for tests/debugging).
    pub fn snapshot(&self, key: impl Into<FlowKey>) -> Option<FlowSnapshot> {
        let key = key.into();
        let manager = self.lookup(&key, key.hash_seeded(&self.seed))?;
        let mgr = &self.managers[manager as usize];
        if self.packet_cnt(manager) == 0 {
            // Reinitialised: the paper zeroes every field.
            return Some(FlowSnapshot {
                next_exp: 0,
                packet_cnt: 0,
                prev: Vec::new(),
                curr: Vec::new(),
                after: Vec::new(),
            });
        }
        let mut scratch = Scratch {
            prev: Vec::new(),
            curr: Vec::new(),
            after: Vec::new(),
        };
        let head = self.active[mgr.active_pos as usize].1;
        self.build_lists(head, mgr.cnt, &mut scratch);
        let seqs = |v: &[(u32, u32)]| v.iter().map(|&(q, _)| q).collect::<Vec<u32>>();
        Some(FlowSnapshot {
            next_exp: mgr.next_exp,
            packet_cnt: mgr.cnt as usize,
            prev: seqs(&scratch.prev),
            curr: scratch
                .curr
                .iter()
                .map(|&s| self.slots[s as usize].seq)
                .collect(),
            after: seqs(&scratch.after),
        })
    }

    fn pass(&mut self, item: T, out: &mut impl FnMut(T)) {
        self.passed_through += 1;
        out(item);
    }

    /// Listing 1's core: decide the list of a packet of manager `m` by
    /// `NextExp`, store it in the next slot, and flush what is full.
    #[inline]
    fn place(&mut self, m: u32, seq: u32, len: u32, item: T, out: &mut impl FnMut(T)) {
        let global = self.global_cnt;
        let seq = seq & self.seq_mask;
        let mgr = &mut self.managers[m as usize];
        let epoch = self.epoch as u32;
        if mgr.epoch != epoch {
            mgr.cnt = 0;
        }
        let tag = if mgr.cnt == 0 {
            // First packet of a sorting block: it anchors NextExp (the
            // manager was reinitialised: only `cnt` was zeroed at the
            // flush, the rest is set here).
            mgr.next_exp = seq.wrapping_add(len) & self.seq_mask;
            mgr.flags &= IN_USE;
            mgr.active_pos = self.n_active;
            mgr.epoch = epoch;
            self.active[self.n_active as usize] = (m, global);
            self.n_active += 1;
            ListTag::Curr
        } else {
            self.slots[mgr.tail as usize].link = global;
            let distance = seq.wrapping_sub(mgr.next_exp) << self.shift;
            if distance == 0 {
                mgr.next_exp = seq.wrapping_add(len) & self.seq_mask;
                ListTag::Curr
            } else if (distance as i32) < 0 {
                mgr.flags |= HAS_PREV;
                self.to_prev += 1;
                ListTag::Prev
            } else {
                mgr.flags |= HAS_AFTER;
                self.to_after += 1;
                ListTag::After
            }
        };
        mgr.tail = global;
        mgr.cnt += 1;
        let full = mgr.cnt >= self.block;
        self.slots[global as usize] = Slot {
            seq,
            link: NIL,
            tag,
            item: Some(item),
        };
        self.global_cnt = global + 1;
        if full {
            self.block_flushes += 1;
            self.flush_manager(m, out);
        }
        if self.global_cnt >= self.ring {
            self.ring_flushes += 1;
            self.flush_everything(out);
        }
    }

    /// Prev, Curr and After of a block (first slot `head`, `cnt` packets),
    /// built as Listing 1 builds them: in arrival order, Prev and After by
    /// sorted insertion.
    fn build_lists(&self, head: u32, cnt: u32, scratch: &mut Scratch) {
        scratch.prev.clear();
        scratch.curr.clear();
        scratch.after.clear();
        let mut cursor = head;
        for _ in 0..cnt {
            let slot = &self.slots[cursor as usize];
            match slot.tag {
                ListTag::Curr => scratch.curr.push(cursor),
                ListTag::Prev => insert_sorted(&mut scratch.prev, slot.seq, cursor, self.shift),
                ListTag::After => insert_sorted(&mut scratch.after, slot.seq, cursor, self.shift),
            }
            cursor = slot.link;
        }
    }

    #[inline]
    fn emit(&mut self, s: u32, out: &mut impl FnMut(T)) {
        if let Some(item) = self.slots[s as usize].item.take() {
            out(item);
        }
    }

    /// Deliver Prev, Curr, After of manager `m`, whose block starts at
    /// slot `head`, and reinitialise it (without touching the active list
    /// or the held count); returns the number of packets emitted.
    #[inline]
    fn flush_lists(&mut self, m: u32, head: u32, out: &mut impl FnMut(T)) -> u32 {
        let mgr = &mut self.managers[m as usize];
        let (tail, cnt) = (mgr.tail, mgr.cnt);
        let (prevs, afters) = (mgr.flags & HAS_PREV != 0, mgr.flags & HAS_AFTER != 0);
        mgr.cnt = 0;
        if cnt == 1 {
            // One packet (many flows, one packet each per batch).
            self.emit(head, out);
            return 1;
        }
        if !prevs && !afters {
            if tail.wrapping_sub(head) == cnt - 1 {
                // In order and no other flow in between: consecutive slots.
                for cursor in head..=tail {
                    self.emit(cursor, out);
                }
            } else {
                let mut cursor = head;
                for _ in 0..cnt {
                    let slot = &mut self.slots[cursor as usize];
                    cursor = slot.link;
                    if let Some(item) = slot.item.take() {
                        out(item);
                    }
                }
            }
            return cnt;
        }
        if !prevs {
            // Nothing precedes Curr: Curr leaves during the walk, After is
            // built (the mild-reordering case: a late first packet sends
            // the rest of its block to After, mostly in order).
            let mut after = std::mem::take(&mut self.scratch.after);
            after.clear();
            let mut cursor = head;
            for _ in 0..cnt {
                let slot = &mut self.slots[cursor as usize];
                let this = cursor;
                cursor = slot.link;
                if slot.tag == ListTag::Curr {
                    if let Some(item) = slot.item.take() {
                        out(item);
                    }
                } else {
                    insert_sorted(&mut after, slot.seq, this, self.shift);
                }
            }
            for &(_, cursor) in &after {
                self.emit(cursor, out);
            }
            self.scratch.after = after;
            return cnt;
        }
        let mut scratch = std::mem::replace(
            &mut self.scratch,
            Scratch {
                prev: Vec::new(),
                curr: Vec::new(),
                after: Vec::new(),
            },
        );
        self.build_lists(head, cnt, &mut scratch);
        for &(_, cursor) in &scratch.prev {
            self.emit(cursor, out);
        }
        for &cursor in &scratch.curr {
            self.emit(cursor, out);
        }
        for &(_, cursor) in &scratch.after {
            self.emit(cursor, out);
        }
        self.scratch = scratch;
        cnt
    }

    /// Flush one manager that holds packets; the last active manager takes
    /// its place in the active list (as `Vec::swap_remove`).
    fn flush_manager(&mut self, m: u32, out: &mut impl FnMut(T)) {
        let pos = self.managers[m as usize].active_pos;
        let head = self.active[pos as usize].1;
        self.n_active -= 1;
        let last = self.active[self.n_active as usize];
        self.active[pos as usize] = last;
        self.managers[last.0 as usize].active_pos = pos;
        self.held_max = self.held_max.max(self.held());
        self.flushed_in_epoch += self.flush_lists(m, head, out);
    }

    /// The global flush (ring full or end of batch; the caller counts it).
    fn flush_everything(&mut self, out: &mut impl FnMut(T)) {
        self.held_max = self.held_max.max(self.held());
        for i in 0..self.n_active as usize {
            let (manager, head) = self.active[i];
            if self.slots[head as usize].link == NIL {
                // A block of one packet: emitted without touching its
                // manager, which the new epoch reinitialises.
                self.emit(head, out);
            } else {
                self.flush_lists(manager, head, out);
            }
        }
        self.n_active = 0;
        self.accepted_before += u64::from(self.global_cnt);
        self.global_cnt = 0;
        self.flushed_in_epoch = 0;
        self.epoch += 1;
        self.sweep();
    }

    /// Evict a few managers that stayed empty for `idle_flushes` global
    /// flushes. Every manager is examined once per `max_flows / 4` global
    /// flushes (at most 2^28), and `idle_flushes` is at most 2^31 − 1, so
    /// an idle manager is evicted before the difference of 32-bit epoch
    /// stamps could wrap: comparing stamps is the same as comparing epochs.
    fn sweep(&mut self) {
        let managers = self.managers.len();
        if managers == 0 || self.free_mgr.len() == managers {
            return;
        }
        for _ in 0..SWEEP_PER_FLUSH.min(managers) {
            let hand = self.sweep_hand;
            self.sweep_hand = if hand + 1 == managers { 0 } else { hand + 1 };
            let mgr = &self.managers[hand];
            if mgr.flags & IN_USE != 0
                && self.packet_cnt(hand as u32) == 0
                && (self.epoch as u32).wrapping_sub(mgr.epoch) > self.cfg.idle_flushes
            {
                self.remove(hand as u32);
            }
        }
    }

    /// `PacketCnt` of manager `m` (0 if its block ended with an epoch).
    #[inline]
    fn packet_cnt(&self, m: u32) -> u32 {
        let mgr = &self.managers[m as usize];
        if mgr.epoch == self.epoch as u32 {
            mgr.cnt
        } else {
            0
        }
    }

    /// The last-flow cache: the manager of the last flow if `key` is its key.
    #[inline(always)]
    fn cached(&self, key: &FlowKey) -> Option<u32> {
        let mgr = self.managers.get(self.last as usize)?;
        (mgr.key == *key).then_some(self.last)
    }

    /// The manager of `key`: the last flow's, or from the table.
    #[inline]
    fn find(&mut self, key: &FlowKey) -> Option<u32> {
        if let Some(manager) = self.cached(key) {
            return Some(manager);
        }
        let manager = self.lookup(key, key.hash_seeded(&self.seed))?;
        self.last = manager;
        Some(manager)
    }

    /// As [`Srpic::find`], creating a manager for a new flow if one is free.
    #[inline]
    fn find_or_insert(&mut self, key: &FlowKey) -> Option<u32> {
        if let Some(manager) = self.cached(key) {
            return Some(manager);
        }
        let hash = key.hash_seeded(&self.seed);
        let manager = match self.lookup(key, hash) {
            Some(manager) => manager,
            None => self.insert(*key, hash)?,
        };
        self.last = manager;
        Some(manager)
    }

    /// Probe the table: an entry whose tag (the hash's high 32 bits)
    /// matches is confirmed by comparing the manager's whole key.
    #[inline]
    fn lookup(&self, key: &FlowKey, hash: u64) -> Option<u32> {
        let tag = hash >> 32;
        let mut slot = hash as usize & self.mask;
        loop {
            let entry = self.table[slot];
            let manager = entry as u32;
            if manager == NIL {
                return None;
            }
            if entry >> 32 == tag && self.managers[manager as usize].key == *key {
                return Some(manager);
            }
            slot = (slot + 1) & self.mask;
        }
    }

    fn insert(&mut self, key: FlowKey, hash: u64) -> Option<u32> {
        let manager = self.free_mgr.pop()?;
        let mut slot = hash as usize & self.mask;
        while self.table[slot] as u32 != NIL {
            slot = (slot + 1) & self.mask;
        }
        self.table[slot] = (hash >> 32) << 32 | u64::from(manager);
        let mgr = &mut self.managers[manager as usize];
        *mgr = Manager::EMPTY;
        mgr.key = key;
        mgr.flags = IN_USE;
        self.flows_created += 1;
        self.flows += 1;
        Some(manager)
    }

    /// Home slot of manager `m` in the table.
    fn home(&self, m: u32) -> usize {
        self.managers[m as usize].key.hash_seeded(&self.seed) as usize & self.mask
    }

    /// Remove an empty manager from the table (linear probing, backward-shift delete).
    fn remove(&mut self, m: u32) {
        let mut slot = self.home(m);
        while self.table[slot] as u32 != m {
            if self.table[slot] as u32 == NIL {
                return;
            }
            slot = (slot + 1) & self.mask;
        }
        let mut probe = slot;
        loop {
            probe = (probe + 1) & self.mask;
            let occupant = self.table[probe] as u32;
            if occupant == NIL {
                break;
            }
            let home = self.home(occupant);
            let stays = if slot <= probe {
                slot < home && home <= probe
            } else {
                slot < home || home <= probe
            };
            if !stays {
                self.table[slot] = self.table[probe];
                slot = probe;
            }
        }
        self.table[slot] = EMPTY_ENTRY;
        if self.last == m {
            self.last = NIL;
        }
        self.managers[m as usize].flags = 0;
        self.free_mgr.push(m);
        self.flows_evicted += 1;
        self.flows -= 1;
    }
}
