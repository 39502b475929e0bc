//! The fast sorter against the oracle: [`ReferenceSrpic`] is Listing 1
//! with linked lists (the sorter as it was until issue 23); [`Srpic`] must
//! emit the same items in the same order from every `push` and
//! `flush_all` call, and report the same counters and the same lists, on
//! random runs: many flows, reordering, duplicates, arbitrary and wrapping
//! sequence numbers, packets that are not TCP/RTP (pass-through) or not
//! suitable (bypass), block and ring boundaries, a full flow table and
//! idle eviction; and with hash keys that make every short key collide
//! (same table slot, same tag), so only the full-key confirmation tells
//! those flows apart.

use proptest::prelude::*;
use ringway_reorder::reference::ReferenceSrpic;
use ringway_reorder::workload::synth;
use ringway_reorder::{Class, FlowKey, SeqSpace, Srpic, SrpicConfig};

/// One step of a generated run.
#[derive(Clone, Debug)]
enum Ev {
    /// A packet of flow `flow`: `kind` 0 = pass-through, 1 = bypass, else
    /// suitable; its sequence number is chosen by `pick` (see `seq_of`).
    Pkt {
        flow: u8,
        kind: u8,
        pick: u8,
        jump: u32,
        len: u16,
    },
    EndBatch,
}

fn ev(flows: u8) -> impl Strategy<Value = Ev> {
    prop_oneof![
        12 => (0..flows, 0u8..12, 0u8..16, any::<u32>(), 0u16..3000)
            .prop_map(|(flow, kind, pick, jump, len)| Ev::Pkt { flow, kind, pick, jump, len }),
        1 => Just(Ev::EndBatch),
    ]
}

/// Keys of different shapes: short numbers and TCP-like 5-tuples that
/// differ in one byte (so equal hashes are not enough to share a manager).
fn key_of(flow: u8) -> FlowKey {
    if flow.is_multiple_of(2) {
        FlowKey::from_u64(u64::from(flow))
    } else {
        FlowKey::from_parts(&[&[6], &[10, 0, 0, 1], &[10, 0, 0, 2], &[0, 80], &[4, flow]])
            .expect("13 bytes")
    }
}

/// The flow's next sequence number: mostly in order (the sender's
/// counter), sometimes a step back or ahead (reordering), a repeat
/// (duplicate), or anywhere in the space.
fn seq_of(next: &mut [u32], flow: u8, pick: u8, jump: u32, len: u32) -> u32 {
    let n = &mut next[flow as usize];
    let q = match pick {
        0..=6 => *n,
        7 | 8 => n.wrapping_sub(len.max(1) * (1 + jump % 6)),
        9 | 10 => n.wrapping_add(len.max(1) * (1 + jump % 6)),
        11 | 12 => n.wrapping_sub(len), // a duplicate of the last one
        13 => n.wrapping_add(0x8000),   // half the 16-bit space away
        14 => n.wrapping_add(0x8000_0000),
        _ => jump,
    };
    if pick <= 6 || pick >= 14 {
        *n = q.wrapping_add(len);
    }
    q
}

/// Hash keys under which every 8-byte key (the even flows of `key_of`)
/// hashes to 0: the short-key hash is `fold(w0 ^ k0, w1 ^ k1 ^ len)` and
/// `w1 ^ k1 ^ len` is then 0.
const COLLIDING: [u64; 6] = [0x1234, 8, 0, 0, 0, 0];

/// One run through both sorters, comparing after every call.
fn compare(
    evs: &[Ev],
    cfg: SrpicConfig,
    space: SeqSpace,
    start: u32,
    tcp_lengths: bool,
    collide: bool,
) -> Result<(), TestCaseError> {
    let mut fast: Srpic<usize> = if collide {
        Srpic::with_hash_keys(cfg, space, COLLIDING)
    } else {
        Srpic::new(cfg, space)
    };
    let mut oracle: ReferenceSrpic<usize> = ReferenceSrpic::new(cfg, space);
    let mut next = [start; 256];
    let (mut a, mut b) = (Vec::new(), Vec::new());
    for (id, e) in evs.iter().enumerate() {
        a.clear();
        b.clear();
        match *e {
            Ev::Pkt {
                flow,
                kind,
                pick,
                jump,
                len,
            } => {
                let key = key_of(flow);
                let len = if tcp_lengths { u32::from(len) } else { 1 };
                let class = match kind {
                    0 => Class::PassThrough,
                    1 => Class::Bypass { key },
                    _ => Class::Flow {
                        key,
                        seq: seq_of(&mut next, flow, pick, jump, len),
                        len,
                    },
                };
                fast.push(class, id, &mut |x| a.push(x));
                oracle.push(class, id, &mut |x| b.push(x));
                if id % 7 == 0 {
                    prop_assert_eq!(fast.snapshot(key), oracle.snapshot(key), "lists at {}", id);
                }
            }
            Ev::EndBatch => {
                fast.flush_all(&mut |x| a.push(x));
                oracle.flush_all(&mut |x| b.push(x));
            }
        }
        prop_assert_eq!(&a, &b, "emitted at step {}: {:?}", id, e);
        prop_assert_eq!(fast.stats(), oracle.stats(), "counters at step {}", id);
    }
    a.clear();
    b.clear();
    fast.flush_all(&mut |x| a.push(x));
    oracle.flush_all(&mut |x| b.push(x));
    prop_assert_eq!(&a, &b, "final flush");
    prop_assert_eq!(fast.stats(), oracle.stats());
    Ok(())
}

fn config() -> impl Strategy<Value = SrpicConfig> {
    (1usize..40, 1usize..120, 0usize..10, 0u32..4).prop_map(
        |(block_size, ring_size, max_flows, idle_flushes)| SrpicConfig {
            block_size,
            ring_size,
            max_flows,
            idle_flushes,
        },
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    /// RTP-like flows (16-bit space, length 1).
    #[test]
    fn same_output_as_listing1_rtp(
        evs in prop::collection::vec(ev(12), 0..500),
        cfg in config(),
        start in any::<u16>(),
        collide in any::<bool>(),
    ) {
        compare(&evs, cfg, SeqSpace::U16, u32::from(start), false, collide)?;
    }

    /// TCP-like flows (32-bit space, byte lengths, zero-length included).
    #[test]
    fn same_output_as_listing1_tcp(
        evs in prop::collection::vec(ev(12), 0..500),
        cfg in config(),
        start in any::<u32>(),
        collide in any::<bool>(),
    ) {
        compare(&evs, cfg, SeqSpace::U32, start, true, collide)?;
    }

    /// Few flows, big blocks: long Prev and After lists.
    #[test]
    fn same_output_as_listing1_long_blocks(
        evs in prop::collection::vec(ev(3), 0..600),
        block in 20usize..300,
        start in any::<u16>(),
    ) {
        let cfg = SrpicConfig { block_size: block, ring_size: 1000, max_flows: 4, idle_flushes: 2 };
        compare(&evs, cfg, SeqSpace::U16, u32::from(start), false, false)?;
    }
}

/// The colliding hash keys do make the even flows collide: without the
/// full-key confirmation they would share one manager.
#[test]
fn colliding_keys_collide_and_stay_apart() {
    let cfg = SrpicConfig {
        block_size: 32,
        ring_size: 64,
        max_flows: 8,
        idle_flushes: 1,
    };
    let mut s: Srpic<u32> = Srpic::with_hash_keys(cfg, SeqSpace::U16, COLLIDING);
    let mut out = Vec::new();
    for (flow, seq) in [(0u8, 5u32), (2, 9), (4, 1), (2, 8), (0, 4)] {
        let class = Class::Flow {
            key: key_of(flow),
            seq,
            len: 1,
        };
        s.push(class, flow as u32 * 100 + seq, &mut |x| out.push(x));
    }
    assert_eq!(s.stats().flows, 3);
    assert_eq!(s.snapshot(key_of(2)).unwrap().prev, vec![8]);
    s.flush_all(&mut |x| out.push(x));
    assert_eq!(out, vec![4, 5, 208, 209, 401]);
}

/// The bench's workloads (1 and 1000 flows; in order, mild, heavy): the
/// same emitted order and counters over 200 000 packets each.
#[test]
fn same_output_as_listing1_on_the_bench_workloads() {
    for (flows, p, d) in [
        (1, 0.0, 0),
        (1, 0.05, 3),
        (1, 0.4, 16),
        (1000, 0.0, 0),
        (1000, 0.05, 3),
        (1000, 0.4, 16),
    ] {
        let classes = synth(flows, 200_000, p, d * flows, 42);
        let cfg = SrpicConfig {
            block_size: 32,
            ring_size: 1024,
            max_flows: 1024,
            idle_flushes: 64,
        };
        let mut fast: Srpic<u32> = Srpic::new(cfg, SeqSpace::U16);
        let mut oracle: ReferenceSrpic<u32> = ReferenceSrpic::new(cfg, SeqSpace::U16);
        let (mut a, mut b) = (Vec::new(), Vec::new());
        for (ci, chunk) in classes.chunks(64).enumerate() {
            for (i, c) in chunk.iter().enumerate() {
                let id = (ci * 64 + i) as u32;
                fast.push(*c, id, &mut |x| a.push(x));
                oracle.push(*c, id, &mut |x| b.push(x));
            }
            fast.flush_all(&mut |x| a.push(x));
            oracle.flush_all(&mut |x| b.push(x));
        }
        assert_eq!(a.len(), classes.len());
        assert!(a == b, "{flows} flows, p {p}: emitted order differs");
        assert_eq!(fast.stats(), oracle.stats(), "{flows} flows, p {p}");
    }
}
