//! Real SIPp UAC and UAS through `ringway sip proxy` (stateless, stateful,
//! registrar), each inside a private network namespace with only `lo`.

mod sip_proxy_support;

use sip_proxy_support::*;
use std::net::SocketAddr;
use std::time::Duration;

const CALLS: u32 = 40;

fn a(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

/// Calls from a UAC through the proxy to a UAS addressed by the Request-URI;
/// ACK/BYE follow the Record-Route set. Returns the proxy summary and SIPp stats.
fn calls_through(proxy_args: &'static [&'static str]) -> (serde_json::Value, SippStats) {
    let (summary, (st, stats)) = with_loopback_proxy(proxy_args, |procs, dir| {
        start_loopback_uas(procs, dir);
        run_loopback_calls(procs, dir, "uac", CALLS, 40)
    });
    eprintln!("sipp: {stats:?} exit {st:?}");
    assert!(
        st.is_some_and(|s| s.success()),
        "SIPp UAC failed: {stats:?}"
    );
    (summary, stats)
}

/// Counts of the proxy summary against what the call flow must produce:
/// exactly (when SIPp did not retransmit) or at least (when it did).
fn check_counts(s: &serde_json::Value, sipp: &SippStats) {
    let n = CALLS as u64;
    let exact = sipp.retransmissions == 0;
    let check = |t: &str, want: u64| {
        let got = type_count(s, t, "count");
        if exact {
            assert_eq!(got, want, "{t} count in summary: {}", s["by_type"]);
        } else {
            assert!(got >= want, "{t} count {got} < {want}");
        }
    };
    check("INVITE", n);
    check("ACK", n);
    check("BYE", n);
    // 200 OK to INVITE and to BYE pass through the proxy, labelled apart.
    check("200", n);
    check("200-BYE", n);
    assert!(type_count(s, "INVITE", "forwarded") >= n);
    assert!(type_count(s, "ACK", "forwarded") >= n);
    assert!(type_count(s, "BYE", "forwarded") >= n);
    assert!(s["messages"]["in"].as_u64().unwrap() >= 5 * n);
    assert!(s["messages"]["out"].as_u64().unwrap() >= 5 * n);
    assert_eq!(s["drops"]["socket_rxq_ovfl"], 0);
    // Latency histograms were filled for every received message.
    assert_eq!(
        s["all"]["t_sip"]["count"].as_u64().unwrap(),
        s["all"]["count"].as_u64().unwrap()
    );
    assert!(s["all"]["t_sip"]["mean_us"].as_f64().unwrap() > 0.0);
}

#[test]
fn sipp_calls_through_stateless_proxy_shared_socket() {
    let (s, sipp) = calls_through(&[
        "--mode",
        "stateless",
        "--workers",
        "2",
        "--rx-model",
        "shared",
        "--backend",
        "socket",
    ]);
    assert_eq!(sipp.failed, 0, "{sipp:?}");
    assert_eq!(sipp.successful, CALLS as u64, "{sipp:?}");
    check_counts(&s, &sipp);
    assert_eq!(s["config"]["mode"], "stateless");
}

#[test]
fn sipp_calls_through_stateful_proxy_reuseport() {
    let (s, sipp) = calls_through(&[
        "--mode",
        "stateful",
        "--workers",
        "2",
        "--rx-model",
        "reuseport",
        "--backend",
        "mmsg",
        "--tx-stamp-every",
        "1",
    ]);
    assert_eq!(sipp.failed, 0, "{sipp:?}");
    assert_eq!(sipp.successful, CALLS as u64, "{sipp:?}");
    check_counts(&s, &sipp);
    assert_eq!(s["config"]["mode"], "stateful");
    // Every sent datagram asked for a TX stamp; the kernel delivers them on lo.
    assert!(
        s["all"]["k_snd"]["count"].as_u64().unwrap() > 0,
        "{}",
        s["all"]
    );
    assert!(
        s["all"]["k_rcv"]["count"].as_u64().unwrap() > 0,
        "{}",
        s["all"]
    );
}

#[test]
fn sipp_register_then_invite_via_registrar() {
    let (s, (reg, calls)) = with_loopback_proxy(
        &[
            "--mode",
            "stateful",
            "--registrar",
            "--domain",
            "ringway.test",
            "--workers",
            "2",
        ],
        |procs, dir| {
            spawn_sipp(procs, dir, &uas_args(a("127.0.0.1:5070")));
            // The UAS's contact is registered for sip:alice@ringway.test.
            let reg_args = register_sipp("register.xml", "alice", "127.0.0.1:5070", "5062")
                .timeout(20)
                .build();
            let (rst, reg) = run_sipp(procs, dir, "register", &reg_args, Duration::from_secs(30));
            assert!(rst.is_some_and(|s| s.success()), "REGISTER failed: {reg:?}");
            // Calls to the AOR reach the registered UAS.
            let (st, calls) = run_sipp(
                procs,
                dir,
                "uac",
                &uac_args(
                    a("127.0.0.1:5060"),
                    a("127.0.0.1:5061"),
                    "alice",
                    "ringway.test",
                    10,
                    20,
                ),
                Duration::from_secs(60),
            );
            assert!(st.is_some_and(|s| s.success()), "calls failed: {calls:?}");
            (reg, calls)
        },
    );
    assert_eq!(reg.successful, 1);
    assert_eq!(reg.failed, 0);
    assert_eq!(calls.successful, 10, "{calls:?}");
    assert_eq!(calls.failed, 0);
    assert_eq!(type_count(&s, "REGISTER", "count"), 1);
    assert_eq!(s["by_type"]["REGISTER"]["responded"]["200"], 1);
    assert!(type_count(&s, "INVITE", "forwarded") >= 10);
}
