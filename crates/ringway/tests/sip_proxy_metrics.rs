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
    let (text, summary) = in_bed(|procs, dir| {
        let p = start_loopback_proxy(
            procs,
            dir,
            &["--metrics", "127.0.0.1:9464", "--tx-stamp-every", "2"],
        );
        // Empty but valid before any traffic.
        let before = scrape(a("127.0.0.1:9464"));
        assert_eq!(
            prom_value(&before, "ringway_sip_messages_in_total"),
            Some(0.0),
            "{before}"
        );
        start_loopback_uas(procs, dir);
        let (st, stats) = run_loopback_calls(procs, dir, "uac", 10, 20);
        assert!(st.is_some_and(|s| s.success()), "calls failed: {stats:?}");
        let text = scrape(a("127.0.0.1:9464"));
        (text, stop_proxy(procs, &p))
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
    // Shedding off: no admitted-fraction gauge and null in the summary
    // (n/a, not a made-up 1).
    assert!(!text.contains("ringway_sip_overload_admitted"), "{text}");
    assert!(summary["messages"]["overload_admitted_ratio"].is_null());
    assert!(summary["messages"]["overload_admitted_min_ratio"].is_null());
}

/// The exposition passes `promtool check metrics` (Prometheus's own lint:
/// HELP/TYPE, `_total` counters, base units, naming), with every family
/// populated: calls answering 407, and a flood from another source address
/// that the flood limit cuts off after exactly `limit` answered requests.
#[test]
fn metrics_pass_promtool_with_auth_and_flood() {
    let users = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../docs/ringway-users.htdigest")
        .display()
        .to_string();
    let (text, answered) = in_bed(move |procs, dir| {
        let p = start_loopback_proxy(
            procs,
            dir,
            &[
                "--mode",
                "stateful",
                "--metrics",
                "127.0.0.1:9465",
                "--domain",
                "ringway.test",
                "--auth",
                "--auth-file",
                &users,
                "--auth-algorithm",
                "md5",
                "--flood-limit",
                "100",
                "--flood-window-ms",
                "20000",
                // The admission controller's gauges (a 2 s set point:
                // nothing is shed here, the fraction stays 1).
                "--overload-queue-delay-ms",
                "2000",
            ],
        );
        start_loopback_uas(procs, dir);
        let args = uac_auth_args(10, 20, None);
        let (st, calls) = run_sipp(procs, dir, "uac", &args, Duration::from_secs(40));
        assert!(st.is_some_and(|s| s.success()), "{calls:?}");
        // 300 OPTIONS from 127.0.0.2 (neither from nor to our domain: 403
        // until the limit, then dropped without an answer).
        let socket = std::net::UdpSocket::bind("127.0.0.2:5090").unwrap();
        socket
            .set_read_timeout(Some(Duration::from_millis(500)))
            .unwrap();
        for n in 0..300 {
            let options = format!(
                "OPTIONS sip:bob@127.0.0.1:5070 SIP/2.0\r\nVia: SIP/2.0/UDP 127.0.0.2:5090;branch=z9hG4bKfl{n}\r\n\
                 Max-Forwards: 70\r\nFrom: <sip:eve@example.org>;tag=f\r\nTo: <sip:bob@example.org>\r\n\
                 Call-ID: flood{n}\r\nCSeq: 1 OPTIONS\r\nContent-Length: 0\r\n\r\n"
            );
            socket
                .send_to(options.as_bytes(), "127.0.0.1:5060")
                .unwrap();
            if n % 50 == 49 {
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        let mut answered = 0;
        let mut buf = [0u8; 2048];
        while socket.recv_from(&mut buf).is_ok() {
            answered += 1;
        }
        let text = scrape(a("127.0.0.1:9465"));
        stop_proxy(procs, &p);
        (text, answered)
    });
    assert_eq!(answered, 100, "answers before the flood limit");
    assert_eq!(
        prom_value(&text, "ringway_sip_flood_blocks_total"),
        Some(1.0),
        "{text}"
    );
    assert_eq!(
        prom_value(
            &text,
            "ringway_sip_core_drops_total{type=\"OPTIONS\",reason=\"flood\"}"
        ),
        Some(200.0)
    );
    assert_eq!(
        prom_value(&text, "ringway_sip_auth_accepted_total"),
        Some(10.0)
    );
    for gauge in [
        "ringway_sip_overload_admitted_ratio",
        "ringway_sip_overload_admitted_min_ratio",
    ] {
        let value = prom_value(&text, gauge).unwrap_or_else(|| panic!("{gauge} in\n{text}"));
        assert!(value > 0.0 && value <= 1.0, "{gauge} {value}");
    }
    assert_promtool_accepts(&text);
}
