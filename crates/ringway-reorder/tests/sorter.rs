//! The SRPIC sorter as specified: the paper's Table 2 walk-through, properties,
//! wrap-around, and the Table 1 effect of block size on reordering.

use proptest::prelude::*;
use ringway_reorder::{Class, FlowKey, FlowSnapshot, SeqSpace, Srpic, SrpicConfig};

fn cfg(block: usize, ring: usize) -> SrpicConfig {
    SrpicConfig {
        block_size: block,
        ring_size: ring,
        max_flows: 64,
        idle_flushes: 4,
    }
}

fn flow(key: u64, seq: u32) -> Class {
    Class::Flow {
        key: key.into(),
        seq,
        len: 1,
    }
}

fn snap(prev: &[u32], curr: &[u32], after: &[u32], next_exp: u32) -> FlowSnapshot {
    FlowSnapshot {
        next_exp,
        packet_cnt: prev.len() + curr.len() + after.len(),
        prev: prev.to_vec(),
        curr: curr.to_vec(),
        after: after.to_vec(),
    }
}

/// Paper, Table 2 (block size 7, arrivals 2,3,1,4,6,7,5): the state
/// after every step as printed in the paper, and the flush output.
/// One step: arrival, Prev, Curr, After, NextExp.
type Step = (u32, &'static [u32], &'static [u32], &'static [u32], u32);

const TABLE2: [Step; 7] = [
    // arrival, Prev, Curr, After, NextExp (paper: Steps 1-7)
    (2, &[], &[2], &[], 3),
    (3, &[], &[2, 3], &[], 4),
    (1, &[1], &[2, 3], &[], 4),
    (4, &[1], &[2, 3, 4], &[], 5),
    (6, &[1], &[2, 3, 4], &[6], 5),
    (7, &[1], &[2, 3, 4], &[6, 7], 5),
    (5, &[1], &[2, 3, 4, 5], &[6, 7], 6),
];

#[test]
fn table2_walkthrough() {
    // Steps 1-7 with a block one larger, so the state after Step 7 (just
    // before the paper's flush) can be looked at.
    let mut s: Srpic<u32> = Srpic::new(cfg(8, 1024), SeqSpace::U32);
    let mut out = Vec::new();
    for (seq, prev, curr, after, next_exp) in TABLE2 {
        s.push(flow(9, seq), seq, &mut |x| out.push(x));
        assert_eq!(
            s.snapshot(9).unwrap(),
            snap(prev, curr, after, next_exp),
            "after arrival of {seq}"
        );
    }
    assert!(out.is_empty());
    // With the paper's block size 7, Step 7 fills the block: the flush
    // delivers Prev, Curr, After and reinitialises the manager (zeroed).
    let mut s: Srpic<u32> = Srpic::new(cfg(7, 1024), SeqSpace::U32);
    for (seq, ..) in &TABLE2[..6] {
        s.push(flow(9, *seq), *seq, &mut |x| out.push(x));
        assert!(out.is_empty(), "nothing emitted before the block is full");
    }
    s.push(flow(9, 5), 5, &mut |x| out.push(x));
    assert_eq!(out, vec![1, 2, 3, 4, 5, 6, 7]);
    assert_eq!(s.snapshot(9).unwrap(), snap(&[], &[], &[], 0));
    let st = s.stats();
    assert_eq!((st.to_prev, st.to_curr, st.to_after), (1, 4, 2));
    assert_eq!((st.block_flushes, st.held), (1, 0));
}

/// The next block is anchored by its own first packet ("stateless across
/// sorting blocks"), not by the previous block's NextExp.
#[test]
fn next_block_sets_nextexp_again() {
    let mut s: Srpic<u32> = Srpic::new(cfg(3, 1024), SeqSpace::U32);
    let mut out = Vec::new();
    for q in [10, 12, 11] {
        s.push(flow(1, q), q, &mut |x| out.push(x));
    }
    assert_eq!(out, vec![10, 11, 12]);
    // 20 starts the next block although 13 was expected.
    s.push(flow(1, 20), 20, &mut |x| out.push(x));
    assert_eq!(s.snapshot(1).unwrap(), snap(&[], &[20], &[], 21));
    s.push(flow(1, 13), 13, &mut |x| out.push(x));
    assert_eq!(s.snapshot(1).unwrap(), snap(&[13], &[20], &[], 21));
}

/// Prev and After are both kept sorted (`Add_packet_to_list_and_sort`).
#[test]
fn flush_order_is_prev_curr_after_each_sorted() {
    let mut s: Srpic<u32> = Srpic::new(cfg(32, 1024), SeqSpace::U32);
    let mut out = Vec::new();
    for q in [10, 11, 5, 15, 13, 4] {
        s.push(flow(1, q), q, &mut |x| out.push(x));
    }
    assert_eq!(
        s.snapshot(1).unwrap(),
        snap(&[4, 5], &[10, 11], &[13, 15], 12)
    );
    s.flush_all(&mut |x| out.push(x));
    assert_eq!(out, vec![4, 5, 10, 11, 13, 15]);
    assert_eq!(s.snapshot(1).unwrap(), snap(&[], &[], &[], 0));
}

/// One receive batch arriving 3,2,1,4,5 leaves sorted (an unsorted Prev
/// list gave 2,1,3,4,5).
#[test]
fn one_batch_321_leaves_sorted() {
    let mut s: Srpic<u32> = Srpic::new(cfg(32, 1024), SeqSpace::U32);
    let mut out = Vec::new();
    for q in [3, 2, 1, 4, 5] {
        s.push(flow(1, q), q, &mut |x| out.push(x));
    }
    s.flush_all(&mut |x| out.push(x));
    assert_eq!(out, vec![1, 2, 3, 4, 5]);
}

/// Block size 1 is Table 1's baseline: no sorting, arrival order out.
#[test]
fn block_size_one_does_not_sort() {
    let mut s: Srpic<u32> = Srpic::new(cfg(1, 1024), SeqSpace::U32);
    let mut out = Vec::new();
    for q in [3, 2, 1, 5, 4] {
        s.push(flow(1, q), q, &mut |x| out.push(x));
        assert_eq!(s.held(), 0);
    }
    assert_eq!(out, vec![3, 2, 1, 5, 4]);
}

/// Two TCP flows that differ in one port byte keep separate managers: a
/// manager stores its flow's whole key and lookups compare all of it.
#[test]
fn flows_are_found_by_their_full_key() {
    let a = FlowKey::from_parts(&[&[10, 0, 0, 1], &[10, 0, 0, 2], &[0, 80], &[4, 210]]).unwrap();
    let b = FlowKey::from_parts(&[&[10, 0, 0, 1], &[10, 0, 0, 2], &[0, 80], &[4, 211]]).unwrap();
    let mut s: Srpic<(u8, u32)> = Srpic::new(cfg(32, 1024), SeqSpace::U32);
    let mut out = Vec::new();
    for (k, key, q) in [(0, a, 5), (1, b, 1), (0, a, 4), (1, b, 3), (1, b, 2)] {
        s.push(
            Class::Flow {
                key,
                seq: q,
                len: 1,
            },
            (k, q),
            &mut |x| out.push(x),
        );
    }
    assert_eq!(s.stats().flows, 2);
    assert_eq!(s.snapshot(a).unwrap(), snap(&[4], &[5], &[], 6));
    assert_eq!(s.snapshot(b).unwrap(), snap(&[], &[1, 2], &[3], 3));
    s.flush_all(&mut |x| out.push(x));
    let of = |k| {
        out.iter()
            .filter(|x| x.0 == k)
            .map(|x| x.1)
            .collect::<Vec<_>>()
    };
    assert_eq!((of(0), of(1)), (vec![4, 5], vec![1, 2, 3]));
}

#[test]
fn tcp_byte_lengths_advance_nextexp() {
    let mut s: Srpic<u32> = Srpic::new(cfg(32, 1024), SeqSpace::U32);
    let mut out = Vec::new();
    // segments of 100 bytes starting at 1000: arrive 1000, 1200, 1100, 1300
    for q in [1000, 1200, 1100, 1300] {
        s.push(
            Class::Flow {
                key: 7.into(),
                seq: q,
                len: 100,
            },
            q,
            &mut |x| out.push(x),
        );
    }
    assert_eq!(
        s.snapshot(7).unwrap(),
        // Listing 1: once 1100 fills the gap NextExp is 1200, the head of
        // After; packets are not moved from After to Curr.
        snap(&[], &[1000, 1100], &[1200, 1300], 1200)
    );
    s.flush_all(&mut |x| out.push(x));
    assert_eq!(out, vec![1000, 1100, 1200, 1300]);
}

#[test]
fn ring_size_flushes_all_managers() {
    let mut s: Srpic<(u64, u32)> = Srpic::new(cfg(32, 4), SeqSpace::U32);
    let mut out = Vec::new();
    for (k, q) in [(1, 5), (2, 7), (1, 6)] {
        s.push(flow(k, q), (k, q), &mut |x| out.push(x));
    }
    assert!(out.is_empty());
    s.push(flow(2, 9), (2, 9), &mut |x| out.push(x));
    assert_eq!(out.len(), 4, "4th suitable packet reaches the ring size");
    assert_eq!(s.stats().ring_flushes, 1);
    assert_eq!(s.held(), 0);
}

#[test]
fn passthrough_and_bypass_are_emitted_immediately() {
    let mut s: Srpic<u32> = Srpic::new(cfg(32, 1024), SeqSpace::U32);
    let mut out = Vec::new();
    s.push(flow(3, 10), 10, &mut |x| out.push(x));
    s.push(flow(3, 12), 12, &mut |x| out.push(x));
    s.push(Class::PassThrough, 99, &mut |x| out.push(x));
    assert_eq!(out, vec![99]);
    // A FIN of flow 3 flushes the flow's held packets first, then goes.
    s.push(Class::Bypass { key: 3.into() }, 77, &mut |x| out.push(x));
    assert_eq!(out, vec![99, 10, 12, 77]);
    assert_eq!(s.held(), 0);
}

#[test]
fn rtp_wraparound_sorts_across_zero() {
    let mut s: Srpic<u32> = Srpic::new(cfg(32, 1024), SeqSpace::U16);
    let mut out = Vec::new();
    for q in [65533u32, 65535, 1, 65534, 0, 2] {
        s.push(flow(5, q), q, &mut |x| out.push(x));
    }
    assert_eq!(
        s.snapshot(5).unwrap(),
        snap(&[], &[65533, 65534], &[65535, 0, 1, 2], 65535)
    );
    s.flush_all(&mut |x| out.push(x));
    assert_eq!(out, vec![65533, 65534, 65535, 0, 1, 2]);
}

#[test]
fn tcp_wraparound_sorts_across_zero() {
    let mut s: Srpic<u32> = Srpic::new(cfg(32, 1024), SeqSpace::U32);
    let mut out = Vec::new();
    let a = u32::MAX - 199; // segments of 100 bytes: a, a+100, 0x..., wrapping
    let segs = [
        a,
        a.wrapping_add(200),
        a.wrapping_add(100),
        a.wrapping_add(300),
    ];
    for q in segs {
        s.push(
            Class::Flow {
                key: 1.into(),
                seq: q,
                len: 100,
            },
            q,
            &mut |x| out.push(x),
        );
    }
    s.flush_all(&mut |x| out.push(x));
    assert_eq!(
        out,
        vec![
            a,
            a.wrapping_add(100),
            a.wrapping_add(200),
            a.wrapping_add(300)
        ]
    );
}

#[test]
fn flow_table_is_bounded_and_idle_flows_are_evicted() {
    let c = SrpicConfig {
        block_size: 8,
        ring_size: 64,
        max_flows: 2,
        idle_flushes: 1,
    };
    let mut s: Srpic<u32> = Srpic::new(c, SeqSpace::U16);
    let mut out = Vec::new();
    s.push(flow(1, 1), 1, &mut |x| out.push(x));
    s.push(flow(2, 1), 2, &mut |x| out.push(x));
    s.push(flow(3, 1), 3, &mut |x| out.push(x));
    assert_eq!(out, vec![3], "third flow passes through");
    assert_eq!(s.stats().table_full, 1);
    for _ in 0..4 {
        s.flush_all(&mut |x| out.push(x));
    }
    assert_eq!(s.stats().flows_evicted, 2);
    assert_eq!(s.stats().flows, 0);
    s.push(flow(3, 1), 4, &mut |x| out.push(x));
    assert_eq!(s.held(), 1, "a freed manager is reused");
}

/// Many flows with removals exercise the hash table's backward-shift delete.
#[test]
fn many_flows_churn() {
    let c = SrpicConfig {
        block_size: 4,
        ring_size: 256,
        max_flows: 100,
        idle_flushes: 0,
    };
    let mut s: Srpic<u64> = Srpic::new(c, SeqSpace::U16);
    let mut n = 0u64;
    for round in 0..200u64 {
        for k in 0..60u64 {
            let key = round * 37 + k;
            s.push(flow(key, 0), key, &mut |_| n += 1);
        }
        s.flush_all(&mut |_| n += 1);
        for _ in 0..50 {
            s.flush_all(&mut |_| n += 1);
        }
    }
    assert_eq!(n + s.stats().held as u64, 200 * 60);
    assert!(s.stats().flows <= 100);
}

// ---------- properties ----------

/// One event of a generated run: a packet of `flow`, displaced by `late`
/// positions from where its sender put it (`kind` 0 = pass-through, 1 =
/// bypass, else suitable), or the end of a receive batch.
#[derive(Clone, Debug)]
enum Ev {
    Pkt { flow: u8, late: u8, kind: u8 },
    EndBatch,
}

fn ev() -> impl Strategy<Value = Ev> {
    prop_oneof![
        8 => (0u8..4, 0u8..12, 0u8..10).prop_map(|(flow, late, kind)| Ev::Pkt { flow, late, kind }),
        1 => Just(Ev::EndBatch),
    ]
}

/// An item the sorter carries: (push id, flow if suitable, sequence number).
type Item = (usize, Option<u8>, u16);

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    /// Each flow numbers its packets 0, 1, 2, ... (from a random start,
    /// across the 16-bit wrap); arrivals are displaced by up to 11 places.
    /// In whatever a `push` or `flush_all` call emits, every flow's
    /// packets leave in sequence order; everything pushed comes out once;
    /// unsuitable packets are never held; the sorter holds at most a ring.
    #[test]
    fn every_flushed_block_leaves_each_flow_in_sequence_order(
        evs in prop::collection::vec(ev(), 0..400),
        block in 1usize..40,
        ring in 1usize..100,
        start in any::<u16>(),
    ) {
        let sp = SeqSpace::U16;
        // Sender order: each flow's packets numbered consecutively; then
        // arrival order by (position + lateness), stable.
        let mut next = [start; 4];
        let mut arrivals: Vec<(usize, Ev, u16)> = evs
            .iter()
            .enumerate()
            .map(|(i, e)| match *e {
                Ev::Pkt { flow, late, .. } => {
                    let q = next[flow as usize];
                    next[flow as usize] = q.wrapping_add(1);
                    (i + late as usize, e.clone(), q)
                }
                Ev::EndBatch => (i, e.clone(), 0),
            })
            .collect();
        arrivals.sort_by_key(|a| a.0);
        let mut s: Srpic<Item> = Srpic::new(
            SrpicConfig { block_size: block, ring_size: ring, max_flows: 3, idle_flushes: 2 },
            SeqSpace::U16,
        );
        let mut out: Vec<Item> = Vec::new();
        let mut pushed = 0usize;
        let check_call = |emitted: &[Item]| -> Result<(), TestCaseError> {
            for f in 0..4u8 {
                let seqs: Vec<u32> = emitted.iter().filter(|x| x.1 == Some(f)).map(|x| x.2 as u32).collect();
                for w in seqs.windows(2) {
                    prop_assert!(sp.lt(w[0], w[1]), "flow {} left out of order: {:?}", f, seqs);
                }
            }
            Ok(())
        };
        for (_, e, seq) in &arrivals {
            let before = out.len();
            match *e {
                Ev::Pkt { flow: f, kind, .. } => {
                    let id = pushed;
                    pushed += 1;
                    if kind == 0 {
                        s.push(Class::PassThrough, (id, None, *seq), &mut |x| out.push(x));
                        prop_assert_eq!(out.last().map(|x| x.0), Some(id), "pass-through emitted at once");
                    } else if kind == 1 {
                        s.push(Class::Bypass { key: (f as u64).into() }, (id, None, *seq), &mut |x| out.push(x));
                        prop_assert_eq!(out.last().map(|x| x.0), Some(id), "bypass emitted at once");
                        prop_assert!(out[before..].iter().all(|x| x.0 == id || x.1 == Some(f)));
                    } else {
                        s.push(flow(f as u64, *seq as u32), (id, Some(f), *seq), &mut |x| out.push(x));
                    }
                    prop_assert!(s.held() <= ring);
                }
                Ev::EndBatch => {
                    s.flush_all(&mut |x| out.push(x));
                    prop_assert_eq!(s.held(), 0);
                }
            }
            check_call(&out[before..])?;
        }
        let before = out.len();
        s.flush_all(&mut |x| out.push(x));
        check_call(&out[before..])?;
        let mut ids: Vec<usize> = out.iter().map(|x| x.0).collect();
        ids.sort_unstable();
        prop_assert_eq!(ids, (0..pushed).collect::<Vec<_>>());
        prop_assert_eq!(s.stats().emitted as usize, pushed);
    }

    /// The lists as Listing 1 keeps them, after every arrival (duplicates
    /// allowed): Prev and After each sorted, Curr contiguous up to NextExp,
    /// Prev below NextExp, PacketCnt counting all three.
    #[test]
    fn lists_keep_listing1_invariants(
        seqs in prop::collection::vec(0u16..64, 1..200),
        start in any::<u16>(),
    ) {
        let mut s: Srpic<u16> = Srpic::new(
            SrpicConfig { block_size: 1000, ring_size: 1000, max_flows: 1, idle_flushes: 2 },
            SeqSpace::U16,
        );
        let sp = SeqSpace::U16;
        for (i, &q) in seqs.iter().enumerate() {
            let q = start.wrapping_add(q);
            s.push(flow(0, q as u32), q, &mut |_| {});
            let f = s.snapshot(0).unwrap();
            for l in [&f.prev, &f.after] {
                for w in l.windows(2) {
                    prop_assert!(!sp.lt(w[1], w[0]), "not sorted at {}: {:?}", i, l);
                }
            }
            prop_assert_eq!(f.curr[0], start.wrapping_add(seqs[0]) as u32, "first packet anchors Curr");
            for w in f.curr.windows(2) {
                prop_assert!(w[1] == sp.add(w[0], 1));
            }
            prop_assert_eq!(sp.add(*f.curr.last().unwrap(), 1), f.next_exp);
            for &p in &f.prev { prop_assert!(sp.lt(p, f.next_exp)); }
            prop_assert_eq!(f.packet_cnt, i + 1);
            prop_assert_eq!(f.prev.len() + f.curr.len() + f.after.len(), i + 1);
        }
        let mut out = Vec::new();
        s.flush_all(&mut |x| out.push(x));
        prop_assert_eq!(out.len(), seqs.len());
    }

    /// Any order of one block is delivered fully sorted, across the 16-bit
    /// wrap, with another flow's packets interleaved.
    #[test]
    fn one_block_in_any_order_is_delivered_sorted(
        perm in Just((0u32..40).collect::<Vec<u32>>()).prop_shuffle(),
        start in any::<u16>(),
        other in prop::collection::vec(0u32..40, 0..20),
    ) {
        let mut s: Srpic<(u8, u32)> = Srpic::new(
            SrpicConfig { block_size: 1000, ring_size: 1000, max_flows: 4, idle_flushes: 2 },
            SeqSpace::U16,
        );
        let sp = SeqSpace::U16;
        let mut out = Vec::new();
        let mut o = other.iter();
        for &q in &perm {
            let q = sp.add(start as u32, q);
            s.push(flow(1, q), (1, q), &mut |x| out.push(x));
            if let Some(&x) = o.next() {
                s.push(flow(2, x), (2, x), &mut |x| out.push(x));
            }
        }
        s.flush_all(&mut |x| out.push(x));
        let mine: Vec<u32> = out.iter().filter(|x| x.0 == 1).map(|x| x.1).collect();
        let want: Vec<u32> = (0..40).map(|k| sp.add(start as u32, k)).collect();
        prop_assert_eq!(mine, want);
        prop_assert_eq!(out.len(), 40 + other.len().min(40));
    }
}

/// A duplicate inside a block extends Curr past an After packet, as the
/// pseudo code does (documented in docs/srpic.md).
#[test]
fn duplicate_in_a_block_follows_the_pseudo_code() {
    let mut s: Srpic<u32> = Srpic::new(cfg(32, 1024), SeqSpace::U32);
    let mut out = Vec::new();
    for q in [1, 3, 2, 3, 4] {
        s.push(flow(1, q), q, &mut |x| out.push(x));
    }
    assert_eq!(s.snapshot(1).unwrap(), snap(&[], &[1, 2, 3, 4], &[3], 5));
    s.flush_all(&mut |x| out.push(x));
    assert_eq!(out, vec![1, 2, 3, 4, 3]);
}
