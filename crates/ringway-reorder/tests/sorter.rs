//! The SRPIC sorter as specified: the paper's Table 2 walk-through, properties,
//! wrap-around, and the Table 1 effect of block size on reordering.

use proptest::prelude::*;
use ringway_reorder::{Class, FlowSnapshot, SeqSpace, Srpic, SrpicConfig};

fn cfg(block: usize, ring: usize) -> SrpicConfig {
    SrpicConfig {
        block_size: block,
        ring_size: ring,
        max_flows: 64,
        idle_flushes: 4,
    }
}

fn flow(key: u64, seq: u32) -> Class {
    Class::Flow { key, seq, len: 1 }
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

/// Paper, Table 2: one flow, block size 7, packets arrive 2,3,1,4,6,7,5.
#[test]
fn table2_walkthrough() {
    let mut s: Srpic<u32> = Srpic::new(cfg(7, 1024), SeqSpace::U32);
    let mut out = Vec::new();
    let expect = [
        // arrival, Prev, Curr, After, NextExp after the arrival
        (2, snap(&[], &[2], &[], 3)), // manager created, NextExp = 2, 2 → Curr
        (3, snap(&[], &[2, 3], &[], 4)),
        (1, snap(&[1], &[2, 3], &[], 4)), // 1 < NextExp → Prev
        (4, snap(&[1], &[2, 3, 4], &[], 5)),
        (6, snap(&[1], &[2, 3, 4], &[6], 5)), // 6 > NextExp → After
        (7, snap(&[1], &[2, 3, 4], &[6, 7], 5)),
    ];
    for (seq, want) in expect {
        s.push(flow(9, seq), seq, &mut |x| out.push(x));
        assert_eq!(s.snapshot(9).unwrap(), want, "after arrival of {seq}");
        assert!(out.is_empty(), "nothing emitted before the block is full");
    }
    // 5 fills the gap: 6 and 7 move to Curr, NextExp = 8, PacketCnt = 7 = BlockSize → flush.
    s.push(flow(9, 5), 5, &mut |x| out.push(x));
    assert_eq!(out, vec![1, 2, 3, 4, 5, 6, 7]);
    assert_eq!(s.snapshot(9).unwrap(), snap(&[], &[], &[], 8));
    let st = s.stats();
    assert_eq!(
        (st.to_prev, st.to_curr, st.to_after, st.after_to_curr),
        (1, 4, 2, 2)
    );
    assert_eq!(st.block_flushes, 1);
    assert_eq!(st.held, 0);
}

#[test]
fn flush_order_is_prev_curr_after_and_nextexp_moves_past_after() {
    let mut s: Srpic<u32> = Srpic::new(cfg(32, 1024), SeqSpace::U32);
    let mut out = Vec::new();
    for q in [10, 11, 5, 15, 13, 4] {
        s.push(flow(1, q), q, &mut |x| out.push(x));
    }
    assert_eq!(
        s.snapshot(1).unwrap(),
        snap(&[5, 4], &[10, 11], &[13, 15], 12)
    );
    s.flush_all(&mut |x| out.push(x));
    assert_eq!(out, vec![5, 4, 10, 11, 13, 15]);
    // After the flush NextExp follows the highest delivered packet.
    assert_eq!(s.snapshot(1).unwrap().next_exp, 16);
}

#[test]
fn tcp_byte_lengths_advance_nextexp() {
    let mut s: Srpic<u32> = Srpic::new(cfg(32, 1024), SeqSpace::U32);
    let mut out = Vec::new();
    // segments of 100 bytes starting at 1000: arrive 1000, 1200, 1100, 1300
    for q in [1000, 1200, 1100, 1300] {
        s.push(
            Class::Flow {
                key: 7,
                seq: q,
                len: 100,
            },
            q,
            &mut |x| out.push(x),
        );
    }
    assert_eq!(
        s.snapshot(7).unwrap(),
        snap(&[], &[1000, 1100, 1200, 1300], &[], 1400)
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
    s.push(Class::Bypass { key: 3 }, 77, &mut |x| out.push(x));
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
        snap(&[], &[65533, 65534, 65535, 0, 1, 2], &[], 3)
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
                key: 1,
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

#[derive(Clone, Debug)]
enum Ev {
    Pkt { flow: u8, seq: u16, kind: u8 },
    EndBatch,
}

fn ev() -> impl Strategy<Value = Ev> {
    prop_oneof![
        8 => (0u8..4, any::<u16>(), 0u8..10).prop_map(|(flow, seq, kind)| Ev::Pkt { flow, seq, kind }),
        1 => Just(Ev::EndBatch),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn output_is_permutation_blocks_sorted_unsuitable_never_held(
        evs in prop::collection::vec(ev(), 0..400),
        block in 1usize..40,
        ring in 1usize..100,
        near in any::<bool>(),
    ) {
        let mut s: Srpic<(usize, Option<u8>, u16)> = Srpic::new(
            SrpicConfig { block_size: block, ring_size: ring, max_flows: 3, idle_flushes: 2 },
            SeqSpace::U16,
        );
        let mut out: Vec<(usize, Option<u8>, u16)> = Vec::new();
        let mut base = [0u16; 4];
        let mut pushed = 0usize;
        for e in &evs {
            match *e {
                Ev::Pkt { flow, seq, kind } => {
                    // "near" keeps sequence numbers within a small window so
                    // that sorting actually happens; otherwise anything goes.
                    let seq = if near {
                        base[flow as usize] = base[flow as usize].wrapping_add(1);
                        base[flow as usize].wrapping_add(seq % 16)
                    } else { seq };
                    let id = pushed;
                    pushed += 1;
                    let before = out.len();
                    if kind == 0 {
                        s.push(Class::PassThrough, (id, None, seq), &mut |x| out.push(x));
                        prop_assert_eq!(out.last().map(|x| x.0), Some(id), "pass-through emitted at once");
                    } else if kind == 1 {
                        s.push(Class::Bypass { key: flow as u64 }, (id, None, seq), &mut |x| out.push(x));
                        prop_assert_eq!(out.last().map(|x| x.0), Some(id), "bypass emitted at once");
                        prop_assert!(out[before..].iter().all(|x| x.0 == id || x.1 == Some(flow)));
                    } else {
                        s.push(Class::Flow { key: flow as u64, seq: seq as u32, len: 1 }, (id, Some(flow), seq), &mut |x| out.push(x));
                    }
                    prop_assert!(s.held() <= ring);
                }
                Ev::EndBatch => {
                    s.flush_all(&mut |x| out.push(x));
                    prop_assert_eq!(s.held(), 0);
                }
            }
        }
        s.flush_all(&mut |x| out.push(x));
        // Permutation: every id exactly once.
        let mut ids: Vec<usize> = out.iter().map(|x| x.0).collect();
        ids.sort_unstable();
        prop_assert_eq!(ids, (0..pushed).collect::<Vec<_>>());
        prop_assert_eq!(s.stats().emitted as usize, pushed);
    }

    /// Within one flushed block the Curr+After part of a flow is in serial
    /// order. We check it through the sorter's own lists just before a flush.
    #[test]
    fn curr_and_after_lists_are_sorted(
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
            let ca: Vec<u32> = f.curr.iter().chain(f.after.iter()).copied().collect();
            for w in ca.windows(2) {
                prop_assert!(!sp.lt(w[1], w[0]), "not sorted at {}: {:?}", i, ca);
            }
            // Curr is contiguous and ends just before NextExp.
            for w in f.curr.windows(2) {
                prop_assert!(w[1] == w[0] || w[1] == sp.add(w[0], 1));
            }
            if let Some(&l) = f.curr.last() { prop_assert_eq!(sp.add(l, 1), f.next_exp); }
            for &p in &f.after { prop_assert!(sp.lt(f.next_exp, p)); }
            prop_assert_eq!(f.packet_cnt, i + 1);
        }
        let mut out = Vec::new();
        s.flush_all(&mut |x| out.push(x));
        prop_assert_eq!(out.len(), seqs.len());
    }

    /// A block that starts with its lowest sequence number (nothing goes to
    /// PrevPacketList) is delivered fully sorted, across the 16-bit wrap.
    #[test]
    fn block_starting_at_its_minimum_is_delivered_sorted(
        mut perm in Just((0u32..40).collect::<Vec<u32>>()).prop_shuffle(),
        start in any::<u16>(),
        other in prop::collection::vec(0u32..40, 0..20),
    ) {
        let pos = perm.iter().position(|&x| x == 0).unwrap();
        perm.swap(0, pos);
        let mut s: Srpic<(u8, u32)> = Srpic::new(
            SrpicConfig { block_size: 1000, ring_size: 1000, max_flows: 4, idle_flushes: 2 },
            SeqSpace::U16,
        );
        let sp = SeqSpace::U16;
        let mut out = Vec::new();
        // Interleave another flow's packets; they must not disturb flow 1.
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
