//! IPv6 end to end on `[::1]`, in a private network namespace: SIPp UAC →
//! proxy → SIPp UAS over UDP and over TCP, every address IPv6. The calls
//! complete only if our Via and Record-Route carry the bracketed address
//! (SIPp's UAS answers by the Via, its ACK and BYE follow the
//! Record-Route), the relay policy lets `::1/128` through, and the flood
//! limiter (per /64) counts IPv6 sources without refusing them.

mod sip_proxy_support;

use sip_proxy_support::*;
use std::net::SocketAddr;
use std::time::Duration;

const CALLS: u32 = 10;

fn a(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

/// `CALLS` calls over `transport` (`u1` or `t1`) between SIPp on `[::1]`,
/// through the proxy on `[::1]:5060`.
fn calls_over_ipv6(transport: &'static str) -> (serde_json::Value, SippStats) {
    netns(move || {
        let dir = tempfile::tempdir().unwrap();
        let mut procs = Procs::default();
        let p = start_proxy(
            &mut procs,
            dir.path(),
            &[
                "--listen",
                "[::1]:5060",
                "--listen",
                "tcp:[::1]:5060",
                "--relay",
                "::1/128",
                "--mode",
                "stateful",
                "--flood-limit",
                "100000",
            ],
        );
        let mut uas = uas_args(a("[::1]:5070"));
        uas.extend(["-t".to_string(), transport.to_string()]);
        spawn_sipp(&mut procs, dir.path(), &uas);
        std::thread::sleep(Duration::from_millis(300));
        let dest = match transport {
            "t1" => "[::1]:5070;transport=tcp",
            _ => "[::1]:5070",
        };
        let mut uac = uac_args(a("[::1]:5060"), a("[::1]:5061"), "bob", dest, CALLS, 20);
        uac.extend(["-t".to_string(), transport.to_string()]);
        let (st, stats) = run_sipp(&mut procs, dir.path(), "uac", &uac, Duration::from_secs(60));
        let summary = stop_proxy(&mut procs, &p);
        eprintln!("sipp: {stats:?} exit {st:?}");
        (summary, stats)
    })
}

fn check(summary: &serde_json::Value, stats: &SippStats) {
    assert_eq!(stats.failed, 0, "{stats:?}");
    assert_eq!(stats.successful, CALLS as u64, "{stats:?}");
    let core = &summary["proxy"];
    assert!(
        core["requests_forwarded"].as_u64().unwrap() >= 3 * CALLS as u64,
        "{core}"
    );
}

#[test]
fn sipp_calls_over_udp_on_ipv6_loopback() {
    let (summary, stats) = calls_over_ipv6("u1");
    check(&summary, &stats);
}

#[test]
fn sipp_calls_over_tcp_on_ipv6_loopback() {
    let (summary, stats) = calls_over_ipv6("t1");
    check(&summary, &stats);
    assert!(
        summary["tcp"]["accepted"].as_u64().unwrap() >= 1,
        "{}",
        summary["tcp"]
    );
    assert!(
        summary["tcp"]["connected"].as_u64().unwrap() >= 1,
        "{}",
        summary["tcp"]
    );
}
