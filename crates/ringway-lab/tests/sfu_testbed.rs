//! The SFU testbed keeps the SFU host alone on its CPUs: its interface's
//! NAPI thread on the SFU's CPUs, the switch's (the wire's) on the load's
//! (needs root and network namespaces, as the lab itself).

use ringway_io::testing::skip;
use ringway_io::thread::{affinity, affinity_of};
use ringway_lab::sfulab::testbed::{napi_snapshot, Testbed};

#[test]
fn the_sfu_hosts_and_the_switchs_napi_threads_are_pinned_to_their_cpus() {
    let cpus = affinity().expect("the test's CPUs");
    if cpus.len() < 2 {
        skip("one CPU: the SFU and the load cannot be told apart");
        return;
    }
    if let Err(why) = ringway_io::backend::xdp_veth_probe() {
        skip(format!("no native XDP on veth here: {why}"));
        return;
    }
    let (sfu_cpu, load_cpu) = (cpus[0], cpus[cpus.len() - 1]);
    let before = napi_snapshot();
    let bed = Testbed::build(2, true, false).expect("the namespace testbed (needs root)");
    let pass = bed
        .sfu_pass_program()
        .expect("native XDP on the SFU's veth");
    let sfu_napi = bed
        .sfu_threaded_napi(&before)
        .expect("the SFU's NAPI thread");
    assert!(!sfu_napi.is_empty(), "no NAPI thread for the SFU's veth");
    // One per switch port: the SFU's and the two clients'.
    assert_eq!(bed.switch_napi.len(), 3, "{:?}", bed.switch_napi);
    let refused = bed.pin_napi_threads(&sfu_napi, &[sfu_cpu], &[load_cpu]);
    assert!(refused.is_empty(), "{refused:?}");
    for &pid in &sfu_napi {
        assert_eq!(
            affinity_of(pid as i32).unwrap(),
            vec![sfu_cpu],
            "SFU thread {pid}"
        );
    }
    for &pid in &bed.switch_napi {
        assert_eq!(
            affinity_of(pid as i32).unwrap(),
            vec![load_cpu],
            "switch thread {pid}"
        );
    }
    // No CPUs given: nothing is pinned (and nothing refused).
    assert!(bed.pin_napi_threads(&sfu_napi, &[], &[]).is_empty());
    assert_eq!(affinity_of(sfu_napi[0] as i32).unwrap(), vec![sfu_cpu]);
    // The SFU's CPUs given but no SFU thread found: a refusal, so the
    // lab leaves such a run out instead of measuring it unpinned.
    let refused = bed.pin_napi_threads(&[], &[sfu_cpu], &[]);
    assert_eq!(refused.len(), 1, "{refused:?}");
    assert!(refused[0].contains("not found"), "{refused:?}");
    drop(pass);
}
