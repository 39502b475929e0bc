//! The TCP relay's sans-IO core: SRPIC on and off see the same receive
//! blocks (same seed, same arrivals) and differ only in the order inside a
//! block; malformed packets pass through unsorted and are counted; the
//! tables are bounded.

use ringway_lab::impair::{scaled_receiver, LossModel, PathConfig};
use ringway_lab::srpic_tcp::relay::{Delivery, Placement, RelayCore, RelayCoreConfig};
use ringway_reorder::SrpicConfig;

/// An IPv4/TCP data segment of flow `f` (source port 40000 + f).
fn seg(f: u16, seq: u32, payload: usize) -> Vec<u8> {
    let total = 40 + payload;
    let mut p = vec![0u8; total];
    p[0] = 0x45;
    p[2..4].copy_from_slice(&(total as u16).to_be_bytes());
    p[8] = 64;
    p[9] = 6;
    p[12..16].copy_from_slice(&[10, 77, 250, 1]);
    p[16..20].copy_from_slice(&[10, 77, 250, 2]);
    p[20..22].copy_from_slice(&(40000 + f).to_be_bytes());
    p[22..24].copy_from_slice(&5201u16.to_be_bytes());
    p[24..28].copy_from_slice(&seq.to_be_bytes());
    p[32] = 5 << 4;
    p[33] = 0x10;
    p
}

fn flow_seq(p: &[u8]) -> Option<(u16, u32)> {
    (p.len() >= 40 && p[9] == 6).then(|| {
        (
            u16::from_be_bytes([p[20], p[21]]) - 40000,
            u32::from_be_bytes([p[24], p[25], p[26], p[27]]),
        )
    })
}

fn config(srpic: bool, max_flows: usize) -> RelayCoreConfig {
    let k = 5.0; // 200 Mb/s
    RelayCoreConfig {
        forward: PathConfig {
            rate_bps: 200_000_000,
            delay_ns: 2_500_000,
            sigma_ns: (0.02 * 2.5e6 * k) as u64, // β = 2 %
            loss: LossModel::Uniform(0.001),
            seed: 11,
            ..Default::default()
        },
        reverse: PathConfig {
            delay_ns: 2_500_000,
            seed: 12,
            ..Default::default()
        },
        receiver: scaled_receiver(k),
        srpic: srpic.then_some(SrpicConfig {
            block_size: 32,
            ring_size: 512,
            max_flows,
            idle_flushes: 64,
        }),
        max_flows,
        placement: Placement::Listing1,
    }
}

/// Blocks handed to the receiver: (due time, packets in delivery order).
type Blocks = Vec<(u64, Vec<Vec<u8>>)>;

/// A compact name of a packet for comparisons: (flow, seq), garbage (9, len).
fn id(p: &[u8]) -> (u16, u32) {
    flow_seq(p).unwrap_or((9, p.len() as u32))
}

fn ids(b: &Blocks) -> Vec<(u64, Vec<(u16, u32)>)> {
    b.iter()
        .map(|(d, p)| (*d, p.iter().map(|x| id(x)).collect()))
        .collect()
}

/// 3 flows sending bursts of 1448-byte segments (20 every 400 µs, round
/// robin; TCP is bursty) plus a malformed packet now and then; the relay
/// reads each packet at its send time and is polled every `step` ns.
fn drive(core: &mut RelayCore, step: u64) -> Blocks {
    let mut schedule: Vec<(u64, Vec<u8>)> = Vec::new();
    let mut next = [1000u32; 3];
    let mut sent = 0u64;
    let mut t = 0u64;
    while t < 50_000_000 {
        for i in 0..20u64 {
            let f = ((sent + i) % 3) as usize;
            schedule.push((t + i * 1_000, seg(f as u16, next[f], 1448)));
            next[f] = next[f].wrapping_add(1448);
        }
        sent += 20;
        if sent.is_multiple_of(400) {
            schedule.push((t + 30_000, vec![0x45, 0x00, 0x00])); // malformed
        }
        t += 400_000;
    }
    let mut blocks = Vec::new();
    let take = |core: &mut RelayCore, d: Delivery, blocks: &mut Blocks| {
        if let Delivery::ToReceiver { due_ns, packets } = d {
            let out = core.receive_block(packets);
            blocks.push((due_ns, out));
        }
    };
    let mut pending = schedule.into_iter().peekable();
    let mut t = 0u64;
    while t < 60_000_000 {
        while let Some((at, _)) = pending.peek() {
            if *at > t {
                break;
            }
            let (at, p) = pending.next().expect("peeked");
            core.from_sender(at, p);
        }
        let mut ds = Vec::new();
        core.poll(t, &mut |d| ds.push(d));
        for d in ds {
            take(core, d, &mut blocks);
        }
        t += step;
    }
    let mut ds = Vec::new();
    core.drain(&mut |d| ds.push(d));
    for d in ds {
        take(core, d, &mut blocks);
    }
    blocks
}

fn sorted_ids(b: &[Vec<u8>]) -> Vec<(u16, u32)> {
    let mut v: Vec<(u16, u32)> = b.iter().map(|x| id(x)).collect();
    v.sort();
    v
}

#[test]
fn srpic_on_and_off_see_the_same_blocks() {
    let mut off = RelayCore::new(&config(false, 64));
    let mut on = RelayCore::new(&config(true, 64));
    let b_off = drive(&mut off, 50_000);
    let b_on = drive(&mut on, 50_000);
    assert_eq!(b_off.len(), b_on.len());
    assert!(b_off.len() > 100);
    let mut moved = 0;
    for ((d0, p0), (d1, p1)) in b_off.iter().zip(&b_on) {
        assert_eq!(d0, d1, "same drain end");
        assert_eq!(sorted_ids(p0), sorted_ids(p1), "same packets in the block");
        moved += p0.iter().zip(p1).filter(|(a, b)| a != b).count();
        // With SRPIC on, each flow leaves its block in sequence order.
        for f in 0..3 {
            let seqs: Vec<u32> = p1
                .iter()
                .filter_map(|p| flow_seq(p))
                .filter(|x| x.0 == f)
                .map(|x| x.1)
                .collect();
            assert!(seqs.windows(2).all(|w| w[0] < w[1]), "flow {f}: {seqs:?}");
        }
    }
    assert!(
        moved > 100,
        "sorting changed the order inside blocks: {moved}"
    );
    let (r_off, r_on) = (off.report(), on.report());
    assert_eq!(r_off.blocks, r_on.blocks);
    assert_eq!(r_off.arrival_order, r_on.arrival_order);
    assert_eq!(
        r_off.arrival_order, r_off.delivery_order,
        "off: delivered as arrived"
    );
    // Sorting repairs the reordering inside blocks (here about half of
    // it: σ is large against the spacing, much is between blocks).
    assert!(
        r_on.delivery_order.1 * 10 < r_on.arrival_order.1 * 7,
        "{r_on:?}"
    );
    assert!(r_off.srpic.is_none());
    assert!(r_on.srpic.unwrap().to_after > 0);
    // Polling more coarsely changes nothing (blocks are virtual-time).
    let mut off2 = RelayCore::new(&config(false, 64));
    assert!(ids(&drive(&mut off2, 730_000)) == ids(&b_off));
}

#[test]
fn malformed_packets_pass_through_and_are_counted() {
    let mut on = RelayCore::new(&config(true, 64));
    let blocks = drive(&mut on, 50_000);
    let garbage = blocks
        .iter()
        .flat_map(|b| &b.1)
        .filter(|p| p.len() == 3)
        .count();
    let r = on.report();
    assert_eq!(garbage as u64, r.sent_by_sender.malformed);
    assert!(garbage >= 5, "{garbage}");
    let delivered: usize = blocks.iter().map(|b| b.1.len()).sum();
    assert_eq!(
        delivered as u64, r.forward.delivered,
        "everything delivered once"
    );
    assert_eq!(r.forward.delivered + r.forward.lost, r.forward.packets);
}

#[test]
fn flow_tables_are_bounded() {
    // One flow may be sorted and followed; the other two pass unsorted and
    // are counted, and the sorter never holds more than its ring.
    let mut on = RelayCore::new(&config(true, 1));
    drive(&mut on, 50_000);
    let r = on.report();
    let s = r.srpic.unwrap();
    assert!(s.table_full > 0, "{s:?}");
    assert!(s.held_max <= 512);
    assert!(r.sent_by_sender.untracked > 0, "{:?}", r.sent_by_sender);
}

/// The mechanism behind SRPIC's extra retransmissions under loss
/// (docs/srpic.md, "Loss with SRPIC"), from a traced recovery: the sender
/// sent two new segments and then retransmitted the lost ones; all arrive
/// in one receive block in that order. Listing 1 anchors `NextExp` on the
/// first new segment, puts the retransmissions (below `NextExp`) on
/// PrevPacketList and flushes Prev first, so the receiver's TCP gets the
/// retransmissions before the new segments that were sent before them.
/// With SRPIC off the block keeps the sender's transmission order.
#[test]
fn a_retransmission_is_delivered_before_new_segments_sent_earlier() {
    let mss = 1448;
    // Transmission (and arrival) order: new data, then two retransmissions.
    let block = [1_077_350, 1_078_798, 987_574, 989_022];
    let deliver = |srpic: bool| {
        let mut core = RelayCore::new(&config(srpic, 64));
        let out = core.receive_block(block.iter().map(|&s| seg(0, s, mss)).collect());
        out.iter().map(|p| id(p).1).collect::<Vec<_>>()
    };
    assert_eq!(deliver(false), block, "SRPIC off: arrival order");
    assert_eq!(
        deliver(true),
        [987_574, 989_022, 1_077_350, 1_078_798],
        "SRPIC on: sequence order, the later-sent retransmissions first"
    );
}

/// The diagnostic `Placement::InPlaceOracle`: the relay knows from what
/// the sender sent which segments are retransmissions and hands them to
/// the sorter as unsuitable, so the traced block keeps its transmission
/// order; segments the sender sent once are still sorted.
#[test]
fn retransmissions_in_place_keep_their_transmission_position() {
    let mss = 1448;
    let deliver = |in_place: bool, block: &[u32]| {
        let mut core = RelayCore::new(&RelayCoreConfig {
            placement: if in_place {
                Placement::InPlaceOracle
            } else {
                Placement::Listing1
            },
            ..config(true, 64)
        });
        // The sender's transmissions: 987574 … 1078798 once, then the
        // first two again (fast retransmissions).
        let mut t = 0;
        for s in (987_574..=1_078_798).step_by(mss).chain([987_574, 989_022]) {
            t += 1_000;
            core.from_sender(t, seg(0, s, mss));
        }
        let out = core.receive_block(block.iter().map(|&s| seg(0, s, mss)).collect());
        out.iter().map(|p| id(p).1).collect::<Vec<_>>()
    };
    let traced = [1_077_350, 1_078_798, 987_574, 989_022];
    assert_eq!(deliver(true, &traced), traced);
    assert_eq!(
        deliver(false, &traced),
        [987_574, 989_022, 1_077_350, 1_078_798]
    );
    // Reordering of segments sent once is still repaired.
    let late = [1_077_350, 1_074_454, 1_075_902, 1_078_798];
    assert_eq!(
        deliver(true, &late),
        [1_074_454, 1_075_902, 1_077_350, 1_078_798]
    );
}

/// A data segment of flow 0 with a timestamps option (NOP NOP TS) carrying `tsval`.
fn seg_ts(seq: u32, payload: usize, tsval: u32) -> Vec<u8> {
    let total = 52 + payload;
    let mut p = seg(0, seq, payload + 12);
    p.truncate(total);
    p[2..4].copy_from_slice(&(total as u16).to_be_bytes());
    p[32] = 8 << 4;
    p[40..44].copy_from_slice(&[1, 1, 8, 10]);
    p[44..48].copy_from_slice(&tsval.to_be_bytes());
    p[48..52].copy_from_slice(&7u32.to_be_bytes());
    p
}

/// The TSval-gated departure from Listing 1: a segment that would sort
/// ahead of data already in the block but carries a newer TSval was sent
/// after that data (a retransmission) and keeps its arrival position; late
/// originals (older or equal TSval) are sorted as Listing 1; without
/// timestamps the rule never fires.
#[test]
fn tsval_gated_placement_keeps_retransmissions_and_sorts_late_originals() {
    let mss = 1448;
    let deliver = |placement: Placement, block: Vec<Vec<u8>>| {
        let mut core = RelayCore::new(&RelayCoreConfig {
            placement,
            ..config(true, 64)
        });
        let out = core.receive_block(block);
        let kept = core.report().kept_in_place;
        (out.iter().map(|p| id(p).1).collect::<Vec<_>>(), kept)
    };
    let with_ts = |list: &[(u32, u32)]| -> Vec<Vec<u8>> {
        list.iter().map(|&(s, ts)| seg_ts(s, mss, ts)).collect()
    };
    // New data at TSval 200, then two retransmissions sent at 205.
    let retransmitted = [
        (1_077_350, 200),
        (1_078_798, 200),
        (987_574, 205),
        (989_022, 205),
    ];
    assert_eq!(
        deliver(Placement::TsvalGated, with_ts(&retransmitted)),
        (vec![1_077_350, 1_078_798, 987_574, 989_022], 1),
        "the first retransmission is kept in place (its flow's held data first), the second follows it"
    );
    assert_eq!(
        deliver(Placement::Listing1, with_ts(&retransmitted)),
        (vec![987_574, 989_022, 1_077_350, 1_078_798], 0),
        "Listing 1 sorts the retransmissions first"
    );
    // Late originals: their TSval is older than the data they would overtake.
    let late = [
        (1_077_350, 200),
        (1_074_454, 199),
        (1_075_902, 199),
        (1_078_798, 200),
    ];
    assert_eq!(
        deliver(Placement::TsvalGated, with_ts(&late)),
        (vec![1_074_454, 1_075_902, 1_077_350, 1_078_798], 0)
    );
    // Within one TSval tick a retransmission cannot be told apart: sorted.
    let same_tick = [(1_077_350, 200), (1_078_798, 200), (987_574, 200)];
    assert_eq!(
        deliver(Placement::TsvalGated, with_ts(&same_tick)).0,
        [987_574, 1_077_350, 1_078_798]
    );
    // Timestamps off: no TSval, Listing 1.
    let plain: Vec<Vec<u8>> = [1_077_350, 1_078_798, 987_574]
        .iter()
        .map(|&s| seg(0, s, mss))
        .collect();
    assert_eq!(
        deliver(Placement::TsvalGated, plain),
        (vec![987_574, 1_077_350, 1_078_798], 0)
    );
}
