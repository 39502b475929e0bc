//! SIP over WebSocket (RFC 7118) through `ringway sip proxy`, in a private
//! network namespace (only `lo`), with a small Python client that does the
//! upgrade and the masked frames a browser sends (`ws_client.py`):
//!
//! - the upgrade's rules: sub-protocol `sip` required (400), the Origin
//!   list (403), an unmasked client frame closed with 1002; each counted;
//! - a browser-like UA registers over ws: and over wss: (the test's CA),
//!   answers a ping, and receives a call from SIPp (UDP) through the proxy.
//!
//! Left for a real browser (JsSIP in headless Chromium): see
//! docs/sip-proxy.md, "WebSocket".

mod sip_proxy_support;

use sip_proxy_support::*;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn ws_client() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/sip_proxy_support/ws_client.py")
}

fn start(procs: &mut Procs, d: &Path, extra: &[&str]) -> ProxyProc {
    let mut args = strings(&[
        "--listen",
        "127.0.0.1:5060",
        "--listen",
        "ws:127.0.0.1:5066",
        "--listen",
        "wss:127.0.0.1:5067",
    ]);
    args.extend(proxy_cert_args(d));
    args.extend(strings(extra));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    start_proxy(procs, d, &args)
}

/// Run the client to its end (bounded): its output lines.
fn client(d: &Path, args: &[&str]) -> Vec<String> {
    let out = Command::new("timeout")
        .arg("30")
        .arg("python3")
        .arg(ws_client())
        .args(args)
        .current_dir(d)
        .output()
        .expect("run python3");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    eprintln!(
        "ws_client {args:?}: {text} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    text.lines().map(str::to_string).collect()
}

/// The browser-like UA (`ws_client.py ARGS`) in the background, its
/// output in `d/ua.out`; returns its PID once it says it registered
/// (bounded).
fn start_ua(procs: &mut Procs, d: &Path, args: &[&str]) -> u32 {
    let out = d.join("ua.out");
    let ua = Command::new("python3")
        .arg(ws_client())
        .args(args)
        .current_dir(d)
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out).unwrap())
        .spawn()
        .expect("run python3");
    let ua_pid = procs.add("ua", ua);
    let end = Instant::now() + Duration::from_secs(20);
    while !std::fs::read_to_string(&out)
        .unwrap_or_default()
        .contains("registered")
    {
        assert!(Instant::now() < end, "the UA never registered");
        std::thread::sleep(Duration::from_millis(50));
    }
    ua_pid
}

/// SIPp (UDP, 127.0.0.1:5062) calls bob@ringway.test once through
/// `proxy`; then the UA `ua_pid` ends (bounded). SIPp's statistics and
/// the UA's output lines.
fn call_ua(procs: &mut Procs, d: &Path, proxy: &str, ua_pid: u32) -> (SippStats, Vec<String>) {
    let uac = uac_args(
        proxy.parse().unwrap(),
        "127.0.0.1:5062".parse().unwrap(),
        "bob",
        "ringway.test",
        1,
        1,
    );
    let (_, stats) = run_sipp(procs, d, "uac", &uac, Duration::from_secs(60));
    let mut ua = procs.take(ua_pid).unwrap();
    let _ = wait_bounded(&mut ua, Duration::from_secs(20));
    let lines = std::fs::read_to_string(d.join("ua.out"))
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect();
    (stats, lines)
}

#[test]
fn upgrade_rules_origins_and_masking() {
    let (lines, s) = in_bed(|procs, dir| {
        let d = dir;
        let p = start(procs, d, &["--ws-origin", "https://phone.test"]);
        let lines = [
            client(d, &["127.0.0.1", "5066", "upgrade"]),
            client(
                d,
                &[
                    "127.0.0.1",
                    "5066",
                    "--origin",
                    "https://evil.test",
                    "upgrade",
                ],
            ),
            client(d, &["127.0.0.1", "5066", "--protocol", "chat", "upgrade"]),
            client(d, &["127.0.0.1", "5066", "unmasked"]),
            client(d, &["127.0.0.1", "5067", "--ca", "ca.pem", "upgrade"]),
        ];
        (lines, stop_proxy(procs, &p))
    });
    assert_eq!(lines[0], ["http 101"]);
    assert_eq!(lines[1], ["http 403"], "an Origin not listed");
    assert_eq!(lines[2], ["http 400"], "no sip sub-protocol");
    assert_eq!(lines[3], ["close 1002"], "an unmasked client frame");
    assert_eq!(lines[4], ["http 101"], "wss");
    assert_eq!(tcp_closed(&s, "ws_handshake"), 2, "{}", s["tcp"]);
    assert_eq!(tcp_closed(&s, "ws_error"), 1, "{}", s["tcp"]);
    assert_eq!(s["tcp"]["messages_in"], 0, "{}", s["tcp"]);
}

/// A WebSocket UA (`ws:` or `wss:`) registers bob@ringway.test, then SIPp
/// calls bob over UDP through the proxy; the UA answers.
fn call_to_websocket_ua(
    port: &'static str,
    tls: bool,
) -> (Vec<String>, SippStats, serde_json::Value, String) {
    in_bed(move |procs, dir| {
        let d = dir.to_path_buf();
        let p = start(
            procs,
            &d,
            &[
                "--registrar",
                "--domain",
                "ringway.test",
                "--relay",
                "127.0.0.0/8",
                "--metrics",
                "127.0.0.1:9377",
            ],
        );
        let mut args = vec!["127.0.0.1", port];
        if tls {
            args.extend(["--ca", "ca.pem"]);
        }
        args.extend(["ua", "bob", "ringway.test"]);
        // Registered: the binding is there before SIPp calls.
        let ua_pid = start_ua(procs, &d, &args);
        let (stats, lines) = call_ua(procs, &d, "127.0.0.1:5060", ua_pid);
        let metrics = scrape("127.0.0.1:9377".parse().unwrap());
        let summary = stop_proxy(procs, &p);
        (lines, stats, summary, metrics)
    })
}

/// The WebSocket UA's connection counted under its own transport
/// (`ws` or `wss`), in the summary and in /metrics, and nothing under the
/// others (TCP, TLS and WebSocket used to share `transport="tcp"`).
fn check_transport_rows(s: &serde_json::Value, metrics: &str, transport: &str) {
    let rows = &s["tcp"]["by_transport"];
    assert_eq!(rows[transport]["accepted"], 1, "{rows}");
    assert_eq!(rows[transport]["messages_in"], 3, "{rows}");
    assert_eq!(rows[transport]["messages_out"], 4, "{rows}");
    // The other rows: 0, or absent for a transport neither listened on
    // nor used (no data, not 0).
    for other in ["tcp", "tls", "ws", "wss"] {
        if other != transport {
            assert_eq!(
                rows[other]["accepted"].as_u64().unwrap_or(0),
                0,
                "{other}: {rows}"
            );
            let sample = format!("ringway_sip_connections_accepted_total{{transport=\"{other}\"}}");
            assert_eq!(prom_value(metrics, &sample).unwrap_or(0.0), 0.0, "{other}");
        }
    }
    assert!(
        rows["ws"].is_object() && rows["wss"].is_object(),
        "listened on: {rows}"
    );
    assert_eq!(
        prom_value(
            metrics,
            &format!("ringway_sip_connections_accepted_total{{transport=\"{transport}\"}}")
        ),
        Some(1.0),
        "{metrics}"
    );
    assert!(
        prom_value(
            metrics,
            &format!(
                "ringway_sip_transport_bytes_total{{transport=\"{transport}\",direction=\"in\"}}"
            )
        )
        .is_some_and(|v| v > 0.0),
        "{metrics}"
    );
    assert_promtool_accepts(metrics);
}

fn check_call(lines: &[String], stats: &SippStats, s: &serde_json::Value) {
    assert_eq!(
        lines,
        ["pong", "registered 200", "invite", "ack", "bye"],
        "the UA's view"
    );
    assert_eq!(stats.successful, 1, "{stats:?}");
    assert_eq!(stats.failed, 0, "{stats:?}");
    // REGISTER, 200 to INVITE, 200 to BYE in; 200 to REGISTER, INVITE,
    // ACK, BYE out: all over the WebSocket connection.
    assert_eq!(s["tcp"]["messages_in"], 3, "{}", s["tcp"]);
    assert_eq!(s["tcp"]["messages_out"], 4, "{}", s["tcp"]);
    assert_eq!(s["tcp"]["pings"], 1, "{}", s["tcp"]);
}

#[test]
fn websocket_ua_registers_and_receives_a_call_from_sipp() {
    let (lines, stats, s, metrics) = call_to_websocket_ua("5066", false);
    check_call(&lines, &stats, &s);
    check_transport_rows(&s, &metrics, "ws");
}

#[test]
fn secure_websocket_ua_registers_and_receives_a_call_from_sipp() {
    let (lines, stats, s, metrics) = call_to_websocket_ua("5067", true);
    check_call(&lines, &stats, &s);
    check_transport_rows(&s, &metrics, "wss");
    assert!(
        s["tls"]["handshakes"].as_u64().unwrap() >= 1,
        "{}",
        s["tls"]
    );
    // The TLS handshake is the WSS connection's, not a SIP-over-TLS one.
    let rows = &s["tls"]["by_transport"];
    assert_eq!(rows["wss"]["handshakes"], s["tls"]["handshakes"], "{rows}");
    assert_eq!(rows["tls"]["handshakes"], 0, "{rows}");
    assert_eq!(
        prom_value(
            &metrics,
            "ringway_sip_tls_handshakes_total{transport=\"wss\"}"
        ),
        s["tls"]["handshakes"].as_f64()
    );
    assert_eq!(
        prom_value(
            &metrics,
            "ringway_sip_tls_handshakes_total{transport=\"tls\"}"
        ),
        Some(0.0)
    );
}

/// An edge proxy (WebSocket side) in front of a registrar (another
/// ringway): a UA registers through the edge with a `.invalid` Contact and
/// `Supported: path, outbound`; the edge puts its Path with the flow token
/// (`<sip:TOKEN@edge;lr;ob>`, RFC 5626 5.1), the registrar stores it, and a
/// call SIPp sends to the registrar comes back through the edge and goes
/// out over the UA's connection (INVITE by the Path token; ACK and BYE by
/// the edge's Record-Route token). Nothing resolves the `.invalid` host.
#[test]
fn a_registrar_behind_an_edge_proxy_reaches_a_websocket_ua_through_its_path() {
    let (lines, stats, edge, registrar) = in_bed(|procs, d| {
        let (registrar, edge) = registrar_behind_edge(procs, d, "ws:127.0.0.1:5066", &[], &[]);
        let ua_pid = start_ua(
            procs,
            d,
            &[
                "127.0.0.1",
                "5066",
                "--invalid",
                "--supported",
                "path, outbound",
                "ua",
                "bob",
                "ringway.test",
            ],
        );
        let (stats, lines) = call_ua(procs, d, "127.0.0.1:5080", ua_pid);
        let edge = stop_proxy(procs, &edge);
        let registrar = stop_proxy(procs, &registrar);
        (lines, stats, edge, registrar)
    });
    assert_eq!(lines.len(), 6, "{lines:?}");
    assert_eq!(lines[..2], ["pong", "registered 200"], "{lines:?}");
    // The registrar echoes the Path it stored: the edge's, with the token.
    let path = lines[2]
        .strip_prefix("path <sip:")
        .and_then(|rest| rest.strip_suffix("@127.0.0.1:5060;lr;ob>"))
        .unwrap_or_else(|| panic!("{lines:?}"));
    assert!(path.len() >= 20, "{lines:?}");
    assert_eq!(lines[3..], ["invite", "ack", "bye"], "{lines:?}");
    assert_eq!(stats.successful, 1, "{stats:?}");
    assert_eq!(stats.failed, 0, "{stats:?}");
    // 200 to REGISTER, INVITE, ACK, BYE out over the WebSocket; REGISTER,
    // 200 to INVITE, 200 to BYE in.
    assert_eq!(edge["tcp"]["messages_out"], 4, "{}", edge["tcp"]);
    assert_eq!(edge["tcp"]["messages_in"], 3, "{}", edge["tcp"]);
    assert_eq!(edge["tcp"]["no_connection"], 0, "{}", edge["tcp"]);
    // The registrar has no connection transport: it reached the UA only
    // through the edge.
    assert!(registrar["tcp"].is_null(), "{}", registrar["tcp"]);
}
