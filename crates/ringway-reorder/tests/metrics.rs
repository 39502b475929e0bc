//! RFC 4737 and RFC 5236 metrics on sequences worked by hand.
//!
//! The sequences below are small examples in the style of the RFCs'
//! illustrations; each expected value is derived step by step in the
//! comments directly from the definitions.

use ringway_reorder::metrics::{ranks, rfc4737, rfc5236};

#[test]
fn rfc4737_single_late_packet() {
    // Sent 1..6, arrived 1,2,4,5,3,6.
    // NextExp: 1→2 (1), →3 (2), →5 (4), →6 (5); 3 < 6 ⇒ reordered; 6 → 7.
    // Ratio = 1/6.
    // Extent of 3 (position 5, 1-based): the earliest earlier arrival with a
    // larger number is 4 at position 3 ⇒ e = 5 − 3 = 2.
    // n-reordering: the arrivals just before 3 are 5, 4 (> 3), then 2 (< 3) ⇒ n = 2.
    let m = rfc4737(&[1, 2, 4, 5, 3, 6]);
    assert_eq!((m.received, m.reordered), (6, 1));
    assert!((m.ratio() - 1.0 / 6.0).abs() < 1e-12);
    assert_eq!(m.extent_hist.into_iter().collect::<Vec<_>>(), vec![(2, 1)]);
    assert_eq!(m.n_hist.into_iter().collect::<Vec<_>>(), vec![(2, 1)]);
}

#[test]
fn rfc4737_several_late_packets() {
    // Sent 1..10, arrived 1,2,3,5,6,7,8,4,10,9 (a late 4 and a swap 9/10).
    // NextExp after 1,2,3 = 4; 5 → 6; 6 → 7; 7 → 8; 8 → 9; 4 < 9 ⇒ reordered;
    // 10 → 11; 9 < 11 ⇒ reordered. Ratio = 2/10.
    // Extent of 4 (position 8): earliest larger is 5 at position 4 ⇒ e = 4.
    //   n: before 4 come 8,7,6,5 (all > 4) then 3 ⇒ n = 4.
    // Extent of 9 (position 10): earliest larger is 10 at position 9 ⇒ e = 1; n = 1.
    let m = rfc4737(&[1, 2, 3, 5, 6, 7, 8, 4, 10, 9]);
    assert_eq!(m.reordered, 2);
    assert!((m.ratio() - 0.2).abs() < 1e-12);
    assert_eq!(m.extent_max(), 4);
    assert!((m.extent_mean() - 2.5).abs() < 1e-12);
    assert_eq!(
        m.n_hist.clone().into_iter().collect::<Vec<_>>(),
        vec![(1, 1), (4, 1)]
    );
    // 3-reordering ratio (what would trigger TCP fast retransmit): only 4 ⇒ 1/10.
    assert!((m.n_ratio(3) - 0.1).abs() < 1e-12);
    assert!((m.n_ratio(1) - 0.2).abs() < 1e-12);
}

#[test]
fn rfc4737_early_packet_makes_followers_reordered() {
    // Arrived 1,5,2,3,4,6: 5 sets NextExp to 6, so 2,3,4 are all reordered.
    // Extents: 2 at pos 3 → earliest larger is 5 at pos 2 ⇒ 1; 3 at pos 4 ⇒ 2; 4 at pos 5 ⇒ 3.
    // n: 2 is preceded by 5 ⇒ 1; 3 by 2 (< 3) ⇒ 0; 4 by 3 ⇒ 0.
    let m = rfc4737(&[1, 5, 2, 3, 4, 6]);
    assert_eq!(m.reordered, 3);
    assert_eq!(
        m.extent_hist.clone().into_iter().collect::<Vec<_>>(),
        vec![(1, 1), (2, 1), (3, 1)]
    );
    assert_eq!(
        m.n_hist.clone().into_iter().collect::<Vec<_>>(),
        vec![(0, 2), (1, 1)]
    );
    // Duplicates are discarded and counted.
    let d = rfc4737(&[1, 2, 2, 3]);
    assert_eq!((d.received, d.duplicates, d.reordered), (3, 1, 0));
    // In-order and empty input.
    assert_eq!(rfc4737(&[7, 8, 9]).reordered, 0);
    assert_eq!(rfc4737(&[]).ratio(), 0.0);
}

#[test]
fn rfc5236_rd_and_rbd_single_late_packet() {
    // Arrived 1,2,4,5,3,6 (receive index RI = 1..6).
    // D = RI − S: 0, 0, 3−4 = −1, 4−5 = −1, 5−3 = 2, 0.
    // FD = {−1: 2, 0: 3, 2: 1} ⇒ RD = {−1: 1/3, 0: 1/2, 2: 1/6}.
    // Buffer (in-order release): after 1: 0; 2: 0; 4: {4} ⇒ 1; 5: {4,5} ⇒ 2;
    // 3 releases 3,4,5 ⇒ 0; 6 ⇒ 0. FB = {0: 4, 1: 1, 2: 1}.
    let m = rfc5236(&[1, 2, 4, 5, 3, 6], 10);
    assert_eq!(
        m.fd.clone().into_iter().collect::<Vec<_>>(),
        vec![(-1, 2), (0, 3), (2, 1)]
    );
    let rd = m.rd();
    assert!((rd[&-1] - 1.0 / 3.0).abs() < 1e-12 && (rd[&2] - 1.0 / 6.0).abs() < 1e-12);
    assert!((m.rd0() - 0.5).abs() < 1e-12);
    assert_eq!(
        m.fb.clone().into_iter().collect::<Vec<_>>(),
        vec![(0, 4), (1, 1), (2, 1)]
    );
    assert!((m.rbd_mean() - (1.0 + 2.0) / 6.0).abs() < 1e-12);
}

#[test]
fn rfc5236_threshold_and_duplicates() {
    // Arrived 2,3,4,5,1 with DT = 2.
    // D: 1−2 = −1, 2−3 = −1, 3−4 = −1, 4−5 = −1, 5−1 = 4 (> DT ⇒ beyond threshold).
    // Buffer: 2 ⇒ {2} 1; 3 ⇒ {2,3} 2; 4 ⇒ {2,3,4} = 3 > DT ⇒ 1 declared lost,
    // 2,3,4 released ⇒ 0; 5 ⇒ in order ⇒ 0; 1 (already declared lost) ⇒ 0.
    let m = rfc5236(&[2, 3, 4, 5, 1], 2);
    assert_eq!(m.fd.clone().into_iter().collect::<Vec<_>>(), vec![(-1, 4)]);
    assert_eq!(m.beyond_dt, 1);
    assert_eq!(m.declared_lost, 1);
    assert_eq!(
        m.fb.clone().into_iter().collect::<Vec<_>>(),
        vec![(0, 3), (1, 1), (2, 1)]
    );
    let d = rfc5236(&[1, 1, 2], 3);
    assert_eq!((d.received, d.duplicates), (2, 1));
    assert_eq!(d.rd0(), 1.0);
}

#[test]
fn ranks_turn_byte_offsets_into_packet_order() {
    // TCP segments of 100 bytes at 1000.., one retransmitted (duplicate).
    assert_eq!(ranks(&[1000, 1200, 1100, 1300, 1100]), vec![1, 3, 2, 4, 2]);
    // Lost packet 3: ranks close the gap so RD does not see it as displacement.
    let r = ranks(&[1, 2, 4, 5]);
    assert_eq!(rfc5236(&r, 4).rd0(), 1.0);
}
