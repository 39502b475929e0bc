//! The Prometheus endpoint of `ringway sip proxy` during and after SIPp calls.

mod sip_proxy_support;

use sip_proxy_support::*;
use std::net::SocketAddr;
use std::time::Duration;

fn a(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

#[test]
fn metrics_endpoint_serves_histograms_and_counters() {
    let (text, summary) = netns(|| {
        let dir = tempfile::tempdir().unwrap();
        let mut procs = Procs::default();
        let p = start_proxy(
            &mut procs,
            dir.path(),
            &[
                "--listen",
                "127.0.0.1:5060",
                "--metrics",
                "127.0.0.1:9464",
                "--tx-stamp-every",
                "2",
            ],
        );
        // Empty but valid before any traffic.
        let before = scrape(a("127.0.0.1:9464"));
        assert_eq!(
            prom_value(&before, "ringway_sip_messages_in_total"),
            Some(0.0),
            "{before}"
        );
        spawn_sipp(&mut procs, dir.path(), &uas_args(a("127.0.0.1:5070")));
        std::thread::sleep(Duration::from_millis(300));
        let (st, stats) = run_sipp(
            &mut procs,
            dir.path(),
            "uac",
            &uac_args(
                a("127.0.0.1:5060"),
                a("127.0.0.1:5061"),
                "bob",
                "127.0.0.1:5070",
                10,
                20,
            ),
            Duration::from_secs(60),
        );
        assert!(st.is_some_and(|s| s.success()), "calls failed: {stats:?}");
        let text = scrape(a("127.0.0.1:9464"));
        (text, stop_proxy(&mut procs, &p))
    });
    for needle in [
        "# TYPE ringway_sip_messages_in_total counter",
        "# TYPE ringway_sip_t_sip_seconds histogram",
        "# TYPE ringway_sip_k_rcv_seconds histogram",
        "# TYPE ringway_sip_k_snd_seconds histogram",
        "ringway_sip_t_sip_seconds_bucket{type=\"INVITE\",le=\"+Inf\"}",
        "ringway_sip_udp_rcvbuf_errors_total",
        "ringway_sip_socket_drops_total",
        "ringway_sip_cpu_seconds_total{mode=\"user\"}",
    ] {
        assert!(text.contains(needle), "missing {needle:?} in\n{text}");
    }
    // The scrape after the calls agrees with the final summary (no traffic in between).
    let n_in = prom_value(&text, "ringway_sip_messages_in_total").unwrap();
    assert_eq!(n_in as u64, summary["messages"]["in"].as_u64().unwrap());
    assert!(n_in >= 50.0, "{n_in}");
    let invites = prom_value(&text, "ringway_sip_messages_by_type_total{type=\"INVITE\"}").unwrap();
    assert_eq!(
        invites as u64,
        summary["by_type"]["INVITE"]["count"].as_u64().unwrap()
    );
    assert_eq!(
        prom_value(&text, "ringway_sip_t_sip_seconds_count{type=\"INVITE\"}").unwrap(),
        invites
    );
    assert!(prom_sum(&text, "ringway_sip_k_snd_seconds_count") > 0.0);
    assert!(prom_sum(&text, "ringway_sip_forwarded_total") >= 50.0);
}
