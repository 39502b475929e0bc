//! SRPIC in the SFU: a sender's RTP goes through the seeded impairment
//! relay (held-back packets, released in 2 ms bursts) to the SFU with and
//! without SRPIC (all in this process); subscribers count late packets.

use ringway_lab::srpiclab::{run_once, SrpicLabConfig};

#[test]
fn srpic_in_sfu_reduces_reordering_seen_by_subscribers() {
    let cfg = SrpicLabConfig {
        duration_s: 1.5,
        interval_ms: 0.5,
        subscribers: 1,
        reorder: 0.1,
        reorder_gap: 3,
        burst_us: 2000.0,
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
    assert!(
        on.sub_reordered * 2 < off.sub_reordered,
        "{on:?} vs {off:?}"
    );
}
