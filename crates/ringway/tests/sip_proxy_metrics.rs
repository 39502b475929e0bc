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
    // Wake-ups of the receive loop: at least one per batch, at most one
    // per datagram (coalescing off: no windows), as in the summary.
    let wakeups = prom_value(&text, "ringway_sip_wakeups_total").unwrap();
    assert!(wakeups >= 1.0 && wakeups <= n_in, "{wakeups} for {n_in}");
    assert_eq!(
        wakeups as u64,
        summary["messages"]["wakeups"].as_u64().unwrap()
    );
    assert_eq!(
        prom_value(&text, "ringway_sip_rx_coalesce_windows_total"),
        Some(0.0)
    );
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

/// PromQL words that are not metric names: keywords, set operators and
/// the aggregation operators (which may be followed by `by (…)` before
/// their parenthesis).
const PROMQL_KEYWORDS: [&str; 28] = [
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "bool",
    "and",
    "or",
    "unless",
    "offset",
    "atan2",
    "inf",
    "nan",
    "sum",
    "min",
    "max",
    "avg",
    "group",
    "stddev",
    "stdvar",
    "count",
    "count_values",
    "bottomk",
    "topk",
    "quantile",
    "limitk",
    "limit_ratio",
];

/// The metric names a PromQL expression selects: string literals, label
/// matchers (`{…}`), ranges (`[…]`) and the label lists of `by`,
/// `without`, `on`, `ignoring`, `group_left` and `group_right` are left
/// out, and so are function names (a word followed by `(`), keywords and
/// numbers. A name is a series name as Prometheus stores it: a histogram
/// is only its `_bucket`, `_sum` and `_count` series.
fn promql_metric_names(expr: &str) -> Vec<String> {
    // Strings, matchers and ranges out (nothing nests across them here).
    let mut plain = String::new();
    let mut chars = expr.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '"' | '\'' | '`' => {
                while let Some(d) = chars.next() {
                    if d == '\\' && c != '`' {
                        chars.next();
                    } else if d == c {
                        break;
                    }
                }
                plain.push(' ');
            }
            '{' | '[' => {
                let close = if c == '{' { '}' } else { ']' };
                let mut quote = None;
                for d in chars.by_ref() {
                    match quote {
                        Some(q) if d == q => quote = None,
                        Some(_) => {}
                        None if d == '"' || d == '\'' || d == '`' => quote = Some(d),
                        None if d == close => break,
                        None => {}
                    }
                }
                plain.push(' ');
            }
            _ => plain.push(c),
        }
    }
    let bytes = plain.as_bytes();
    let mut names = Vec::new();
    let mut i = 0;
    let mut skip_label_list = false;
    while i < bytes.len() {
        let c = bytes[i];
        if c.is_ascii_alphabetic() || c == b'_' || c == b':' {
            let start = i;
            while i < bytes.len()
                && (bytes[i].is_ascii_alphanumeric() || bytes[i] == b'_' || bytes[i] == b':')
            {
                i += 1;
            }
            let word = &plain[start..i];
            let next = plain[i..].trim_start().chars().next();
            let lower = word.to_ascii_lowercase();
            if PROMQL_KEYWORDS.contains(&lower.as_str()) {
                skip_label_list = matches!(
                    lower.as_str(),
                    "by" | "without" | "on" | "ignoring" | "group_left" | "group_right"
                );
                continue;
            }
            if next != Some('(') {
                names.push(word.to_string());
            }
        } else if c.is_ascii_digit() || c == b'.' {
            // A number or a duration (1e3, 0.99, 5m).
            while i < bytes.len() && (bytes[i].is_ascii_alphanumeric() || bytes[i] == b'.') {
                i += 1;
            }
        } else if c == b'(' && skip_label_list {
            // The label list after by/without/on/ignoring/group_*.
            while i < bytes.len() && bytes[i] != b')' {
                i += 1;
            }
            i += 1;
            skip_label_list = false;
        } else {
            if !c.is_ascii_whitespace() {
                skip_label_list = false;
            }
            i += 1;
        }
    }
    names
}

#[test]
fn promql_names_are_extracted() {
    let names = |e: &str| promql_metric_names(e);
    assert_eq!(
        names(
            r#"histogram_quantile(0.99, sum by (instance, le) (rate(a_bucket{instance=~"$instance",x="y}"}[$__rate_interval])))"#
        ),
        ["a_bucket"]
    );
    assert_eq!(
        names("sum(rate(a_sum[5m])) by (le) / ignoring(mode) group_left(x) b_count offset 5m"),
        ["a_sum", "b_count"]
    );
    assert_eq!(
        names("time() - max by (instance) (process_start_time_seconds)"),
        ["process_start_time_seconds"]
    );
    assert_eq!(
        names("job:rule:rate5m > bool 0.5 and on () up"),
        ["job:rule:rate5m", "up"]
    );
}

/// Every expression of a Grafana dashboard (panels, rows' panels, and the
/// templating queries' `label_values(METRIC, label)`).
fn dashboard_exprs(dashboard: &serde_json::Value) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut panels: Vec<&serde_json::Value> =
        dashboard["panels"].as_array().unwrap().iter().collect();
    while let Some(panel) = panels.pop() {
        if let Some(inner) = panel["panels"].as_array() {
            panels.extend(inner);
        }
        for target in panel["targets"].as_array().into_iter().flatten() {
            let expr = target["expr"].as_str().unwrap_or_default();
            assert!(!expr.trim().is_empty(), "empty query in {}", panel["title"]);
            out.push((
                panel["title"].as_str().unwrap().to_string(),
                expr.to_string(),
            ));
        }
    }
    for var in dashboard["templating"]["list"]
        .as_array()
        .into_iter()
        .flatten()
    {
        let query = var["query"]["query"].as_str().or(var["query"].as_str());
        if var["type"] == "query" {
            let query = query.unwrap_or_default();
            let inner = query
                .strip_prefix("label_values(")
                .and_then(|q| q.strip_suffix(')'))
                .unwrap_or_else(|| panic!("templating query {query:?}"));
            let (metric, _label) = inner
                .rsplit_once(',')
                .unwrap_or_else(|| panic!("{query:?} names no metric"));
            out.push((
                format!("variable {}", var["name"]),
                metric.trim().to_string(),
            ));
        }
    }
    out
}

/// GET http://addr/metrics; `None` while nothing answers 200.
fn try_scrape(addr: SocketAddr) -> Option<String> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(
        s,
        "GET /metrics HTTP/1.0\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut r = String::new();
    s.read_to_string(&mut r).ok()?;
    let (head, body) = r.split_once("\r\n\r\n")?;
    (head.starts_with("HTTP/1.") && head.split_whitespace().nth(1) == Some("200"))
        .then(|| body.to_string())
}

/// The series names in Prometheus text.
fn series_names(text: &str) -> std::collections::BTreeSet<String> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .filter_map(|l| l.split(['{', ' ']).next())
        .map(str::to_string)
        .collect()
}

/// contrib/grafana/ringway.json: every metric name its queries select is
/// one a live `ringway sip proxy` (UDP, TCP and TLS, registrar), `sip
/// dispatch` or `sfu serve` exports at `/metrics` after a few calls and a
/// malformed datagram each; every query parses (`promtool check rules`);
/// and the panels the operator needs are there.
#[test]
fn grafana_dashboard_queries_name_exported_metrics() {
    let path =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../contrib/grafana/ringway.json");
    let dashboard: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap())
            .expect("the dashboard is JSON");
    let exprs = dashboard_exprs(&dashboard);
    let mut wanted = std::collections::BTreeMap::<String, String>::new();
    for (panel, expr) in &exprs {
        for name in promql_metric_names(expr) {
            assert!(
                !name.contains(':'),
                "{panel}: {name} is a recording rule's name; ringway ships no rules"
            );
            wanted.entry(name).or_insert_with(|| panel.clone());
        }
    }
    // What the issue asks the dashboard to show.
    for needed in [
        "ringway_sip_messages_by_type_total",
        "ringway_sip_core_drops_total",
        "ringway_sip_k_rcv_seconds_bucket",
        "ringway_sip_t_sip_seconds_bucket",
        "ringway_sip_k_snd_seconds_bucket",
        "ringway_sip_transactions_active",
        "ringway_sip_registrar_bindings",
        "ringway_sip_connections_open",
        "ringway_sip_tls_handshakes_total",
        "ringway_sip_overload_sheds_total",
        "process_resident_memory_bytes",
        "process_open_fds",
        "ringway_dispatch_proxy_up",
        "ringway_sfu_engine_cpu_per_datagram_seconds",
        "ringway_sfu_drops_total",
        "ringway_sfu_clients",
        "ringway_sfu_rooms",
    ] {
        assert!(wanted.contains_key(needed), "no panel shows {needed}");
    }
    let wanted_names: Vec<String> = wanted.keys().cloned().collect();
    let (exported, missing) = in_bed(move |procs, d| {
        let openssl = std::process::Command::new("openssl")
            .args([
                "req",
                "-x509",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:prime256v1",
            ])
            .args(["-nodes", "-days", "2", "-subj", "/CN=127.0.0.1"])
            .args(["-keyout", "key.pem", "-out", "cert.pem"])
            .current_dir(d)
            .output()
            .expect("openssl (Debian package openssl)");
        assert!(openssl.status.success(), "{openssl:?}");
        let token = d.join("admin.token");
        std::fs::write(&token, "dashboard-test-token-0123\n").unwrap();
        let p = start_proxy(
            procs,
            d,
            &[
                "--listen",
                "127.0.0.1:5060",
                "--listen",
                "tcp:127.0.0.1:5060",
                "--listen",
                "tls:127.0.0.1:5061",
                "--tls-cert",
                d.join("cert.pem").to_str().unwrap(),
                "--tls-key",
                d.join("key.pem").to_str().unwrap(),
                "--relay",
                "127.0.0.0/8",
                "--mode",
                "stateful",
                "--registrar",
                "--domain",
                "ringway.test",
                "--metrics",
                "127.0.0.1:9464",
                "--tx-stamp-every",
                "2",
            ],
        );
        let dispatcher = start_dispatcher(
            procs,
            d,
            &[
                "--listen",
                "127.0.0.1:5080",
                "--proxy",
                "127.0.0.1:5060",
                "--relay",
                "127.0.0.0/8",
                "--metrics",
                "127.0.0.1:9465",
            ],
        );
        let sfu = std::process::Command::new(ringway())
            .args([
                "sfu",
                "serve",
                "--listen",
                "127.0.0.1:5004",
                "--stats-interval",
                "0",
            ])
            .args([
                "--admin",
                "127.0.0.1:9466",
                "--duration",
                "60",
                "--admin-token-file",
            ])
            .arg(&token)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("spawn ringway sfu serve");
        procs.add("sfu", sfu);
        start_loopback_uas(procs, d);
        // Five calls through the dispatcher and the proxy.
        let uac = uac_args(
            a("127.0.0.1:5080"),
            a("127.0.0.1:5061"),
            "bob",
            "127.0.0.1:5070",
            5,
            10,
        );
        let (_, calls) = run_sipp(procs, d, "uac", &uac, Duration::from_secs(60));
        assert_eq!(calls.successful, 5, "{calls:?}");
        // A malformed datagram to each: a drop by reason.
        let udp = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        for to in ["127.0.0.1:5060", "127.0.0.1:5080", "127.0.0.1:5004"] {
            udp.send_to(b"not SIP at all\r\n\r\n", to).unwrap();
        }
        // Poll (bounded): the threads publish their counters in turn.
        let end = std::time::Instant::now() + Duration::from_secs(20);
        let (exported, missing) = loop {
            let mut exported = std::collections::BTreeSet::new();
            for port in [9464, 9465, 9466] {
                if let Some(text) = try_scrape(a(&format!("127.0.0.1:{port}"))) {
                    exported.extend(series_names(&text));
                }
            }
            let missing: Vec<String> = wanted_names
                .iter()
                .filter(|n| !exported.contains(*n))
                .cloned()
                .collect();
            if missing.is_empty() || std::time::Instant::now() > end {
                break (exported, missing);
            }
            std::thread::sleep(Duration::from_millis(200));
        };
        stop_proxy(procs, &dispatcher);
        stop_proxy(procs, &p);
        (exported, missing)
    });
    let missing: Vec<String> = missing
        .iter()
        .map(|n| format!("{n} (panel {:?})", wanted[n]))
        .collect();
    assert!(
        missing.is_empty(),
        "the dashboard asks for series no ringway exports: {missing:?}\nexported: {exported:?}"
    );
    // Every query parses: promtool checks them as recording rules (JSON is YAML).
    let dir = tempfile::tempdir().unwrap();
    let rules: Vec<serde_json::Value> = exprs
        .iter()
        .enumerate()
        .filter(|(_, (panel, _))| !panel.starts_with("variable "))
        .map(|(i, (_, expr))| {
            serde_json::json!({
                "record": format!("ringway_dashboard_check_{i}"),
                "expr": expr.replace("$__rate_interval", "1m").replace("$instance", ".*"),
            })
        })
        .collect();
    let file = dir.path().join("rules.yml");
    std::fs::write(
        &file,
        serde_json::json!({ "groups": [{ "name": "dashboard", "rules": rules }] }).to_string(),
    )
    .unwrap();
    let out = std::process::Command::new("promtool")
        .args(["check", "rules"])
        .arg(&file)
        .output()
        .expect("promtool (Debian package prometheus)");
    assert!(
        out.status.success(),
        "promtool: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
