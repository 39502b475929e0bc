//! CANCEL through `ringway sip proxy` with real SIPp UACs and UASs
//! (bench/sip/cancel_*.xml), stateless and stateful, each run inside a
//! private network namespace with only `lo`: cancel while ringing with a
//! CANCEL that matches the INVITE's transaction, one with a branch of its
//! own (matched the RFC 2543 way by the stateful proxy), one that matches
//! nothing (forwarded statelessly, its 200 comes back from the UAS), and a
//! CANCEL racing the UAS's 200. The 200 to the CANCEL and the 487 are
//! mandatory steps of the UAC; the UAS fails a call whose CANCEL it never
//! saw.

mod sip_proxy_support;

use sip_proxy_support::*;
use std::time::Duration;

const CALLS: u32 = 10;

/// One run: proxy in `mode`, UAS `uas_xml` on 5070, UAC `uac_xml` with
/// `keys`. Returns the proxy summary, UAC and UAS statistics.
fn run(
    mode: &'static str,
    uac_xml: &'static str,
    uas_xml: &'static str,
    keys: &'static [(&'static str, &'static str)],
) -> (serde_json::Value, SippStats, SippStats) {
    let (summary, (uac_status, uac, uas_status, uas)) =
        with_loopback_proxy(&["--mode", mode, "--workers", "2"], move |procs, dir| {
            let uas_args = Sipp::server(uas_xml)
                .local("127.0.0.1", 5070)
                .calls(CALLS)
                .timeout(40)
                .build();
            let uas = spawn_sipp_with_stats(procs, dir, "uas", &uas_args);
            std::thread::sleep(Duration::from_millis(300));
            let mut uac_args = Sipp::client("127.0.0.1:5060", uac_xml)
                .service("bob")
                .key("dest", "127.0.0.1:5070")
                .local("127.0.0.1", 5061)
                .calls(CALLS)
                .rate(20)
                .timeout(40);
            for (key, value) in keys {
                uac_args = uac_args.key(key, value);
            }
            let (uac_status, uac) = run_sipp(
                procs,
                dir,
                "uac",
                &uac_args.build(),
                Duration::from_secs(50),
            );
            let (uas_status, uas) = finish_sipp(procs, dir, "uas", uas, Duration::from_secs(20));
            (uac_status, uac, uas_status, uas)
        });
    eprintln!("{mode} {uac_xml} {keys:?}: uac {uac:?} {uac_status:?}, uas {uas:?} {uas_status:?}");
    assert!(
        uac_status.is_some_and(|s| s.success()),
        "{mode}: UAC failed: {uac:?}"
    );
    assert!(
        uas_status.is_some_and(|s| s.success()),
        "{mode}: UAS failed: {uas:?}"
    );
    (summary, uac, uas)
}

fn all_calls_completed(mode: &str, uac: &SippStats, uas: &SippStats) {
    let n = u64::from(CALLS);
    assert_eq!((uac.successful, uac.failed), (n, 0), "{mode}: UAC {uac:?}");
    assert_eq!((uas.successful, uas.failed), (n, 0), "{mode}: UAS {uas:?}");
}

/// `summary.proxy.<field>`.
fn core(summary: &serde_json::Value, field: &str) -> u64 {
    summary["proxy"][field].as_u64().unwrap_or(0)
}

/// `summary.by_type.CANCEL.responded.200`: CANCELs the proxy answered itself.
fn cancels_answered(summary: &serde_json::Value) -> u64 {
    summary["by_type"]["CANCEL"]["responded"]["200"]
        .as_u64()
        .unwrap_or(0)
}

const SAME_BRANCH: &[(&str, &str)] = &[("cancel_branch", ""), ("cancel_uri", "")];
const OWN_BRANCH: &[(&str, &str)] = &[("cancel_branch", "-own"), ("cancel_uri", "")];
const MATCHES_NOTHING: &[(&str, &str)] = &[("cancel_branch", "-own"), ("cancel_uri", ";x=1")];

#[test]
fn sipp_cancel_while_ringing_through_both_modes() {
    let n = u64::from(CALLS);
    for mode in ["stateless", "stateful"] {
        let (s, uac, uas) = run(mode, "cancel_uac.xml", "cancel_uas.xml", SAME_BRANCH);
        all_calls_completed(mode, &uac, &uas);
        assert!(type_count(&s, "CANCEL", "count") >= n);
        assert!(type_count(&s, "487", "count") >= n);
        if mode == "stateful" {
            // Answered at once by the proxy, which sends its own CANCEL.
            assert_eq!(cancels_answered(&s), n, "{}", s["by_type"]);
            assert_eq!(core(&s, "cancels_matched_2543"), 0);
        } else {
            assert_eq!(
                type_count(&s, "CANCEL", "forwarded"),
                type_count(&s, "CANCEL", "count")
            );
        }
    }
}

#[test]
fn sipp_cancel_with_its_own_branch_through_both_modes() {
    let n = u64::from(CALLS);
    for mode in ["stateless", "stateful"] {
        let (s, uac, uas) = run(mode, "cancel_uac.xml", "cancel_uas.xml", OWN_BRANCH);
        all_calls_completed(mode, &uac, &uas);
        if mode == "stateful" {
            // The RFC 2543 match: the proxy's own 200 and CANCEL.
            assert_eq!(core(&s, "cancels_matched_2543"), n, "{}", s["proxy"]);
            assert_eq!(cancels_answered(&s), n);
        } else {
            assert_eq!(
                type_count(&s, "CANCEL", "forwarded"),
                type_count(&s, "CANCEL", "count")
            );
        }
    }
}

#[test]
fn sipp_cancel_that_matches_nothing_through_both_modes() {
    let n = u64::from(CALLS);
    for mode in ["stateless", "stateful"] {
        let (s, uac, uas) = run(mode, "cancel_uac.xml", "cancel_uas.xml", MATCHES_NOTHING);
        all_calls_completed(mode, &uac, &uas);
        // Forwarded statelessly (RFC 3261 16.10), and the UAS's 200 to it
        // forwarded back (16.7): the UAC's mandatory 200 came from the UAS.
        assert_eq!(cancels_answered(&s), 0, "{mode}: {}", s["by_type"]);
        assert_eq!(core(&s, "cancels_matched_2543"), 0);
        assert!(type_count(&s, "CANCEL", "forwarded") >= n);
        assert!(
            type_count(&s, "200", "forwarded") >= n,
            "{mode}: {}",
            s["by_type"]["200"]
        );
    }
}

#[test]
fn sipp_cancel_racing_a_200_through_both_modes() {
    let n = u64::from(CALLS);
    for mode in ["stateless", "stateful"] {
        let (s, uac, uas) = run(mode, "cancel_race_uac.xml", "cancel_race_uas.xml", &[]);
        all_calls_completed(mode, &uac, &uas);
        // The 200 to the cancelled INVITE went through: the call was set
        // up and ended with a BYE.
        assert!(
            type_count(&s, "BYE", "forwarded") >= n,
            "{mode}: {}",
            s["by_type"]
        );
        assert_eq!(type_count(&s, "487", "count"), 0);
    }
}
