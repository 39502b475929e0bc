//! SRPIC in the SFU: a sender's RTP goes through the seeded impairment
//! relay (the paper's Normal delay model at an emulated link rate, the
//! receiver's interrupt coalescing) to the SFU with and without SRPIC (all
//! in this process, same seed); subscribers count late packets.

use ringway_lab::srpiclab::{run_once, SrpicLabConfig};

#[test]
fn srpic_in_sfu_reduces_reordering_seen_by_subscribers() {
    let cfg = SrpicLabConfig {
        duration_s: 1.5,
        interval_ms: 0.5,
        subscribers: 1,
        rate_mbps: 100.0,
        delay_ms: 2.5,
        beta: 0.02,
        coalesce: true,
        batch: 64,
        block: 32,
        reps: 1,
        seed: 3,
    };
    let off = run_once(&cfg, false, 0).unwrap();
    let on = run_once(&cfg, true, 0).unwrap();
    eprintln!("{off:?}\n{on:?}");
    for r in [&off, &on] {
        assert!(r.sent > 1000, "{r:?}");
        assert!(r.relay_reordered > 50, "{r:?}");
        assert_eq!(r.sub_lost, 0, "loopback, no loss configured: {r:?}");
        assert!(r.sub_packets + 10 >= r.sent, "{r:?}");
    }
    // Without sorting the SFU forwards the relay's reordering unchanged.
    assert!(off.sub_reordered > 50, "{off:?}");
    assert_eq!(off.sorter_to_after, None, "no sorter runs with SRPIC off");
    // With sorting the sorter found the gaps and most are repaired.
    assert!(on.sorter_to_after.is_some_and(|n| n > 50), "{on:?}");
    // (Under the paper's model SRPIC repairs intra-block reordering only:
    // about half of it at this rate and β; see docs/srpic.md.)
    assert!(
        on.sub_reordered * 4 < off.sub_reordered * 3,
        "{on:?} vs {off:?}"
    );
    // Same seed, same receiver model: the blocks are the same function of
    // the arrival times (a live sender's times differ by scheduling
    // jitter, so the histograms agree closely rather than exactly).
    assert!(
        (on.relay_mean_block - off.relay_mean_block).abs() < 0.05 * off.relay_mean_block,
        "{on:?} vs {off:?}"
    );
}
