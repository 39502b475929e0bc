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

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("run openssl");
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A CA and a proxy certificate for 127.0.0.1 in `dir`.
fn make_certs(dir: &Path) {
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-days",
            "2",
            "-subj",
            "/CN=ws-test-ca",
            "-keyout",
            "ca.key",
            "-out",
            "ca.pem",
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign",
        ],
    );
    openssl(
        dir,
        &[
            "req",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-subj",
            "/CN=proxy",
            "-keyout",
            "proxy.key",
            "-out",
            "proxy.csr",
        ],
    );
    std::fs::write(
        dir.join("proxy.ext"),
        "subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\n",
    )
    .unwrap();
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            "proxy.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "2",
            "-extfile",
            "proxy.ext",
            "-out",
            "proxy.pem",
        ],
    );
}

fn start(procs: &mut Procs, d: &Path, extra: &[&str]) -> ProxyProc {
    make_certs(d);
    let cert = d.join("proxy.pem").display().to_string();
    let key = d.join("proxy.key").display().to_string();
    let mut args = vec![
        "--listen",
        "127.0.0.1:5060",
        "--listen",
        "ws:127.0.0.1:5066",
        "--listen",
        "wss:127.0.0.1:5067",
        "--tls-cert",
        &cert,
        "--tls-key",
        &key,
    ];
    args.extend_from_slice(extra);
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

fn closed(s: &serde_json::Value, reason: &str) -> u64 {
    s["tcp"]["closed"]
        .as_array()
        .expect("tcp.closed")
        .iter()
        .find(|pair| pair[0] == reason)
        .and_then(|pair| pair[1].as_u64())
        .unwrap_or(0)
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
    assert_eq!(closed(&s, "ws_handshake"), 2, "{}", s["tcp"]);
    assert_eq!(closed(&s, "ws_error"), 1, "{}", s["tcp"]);
    assert_eq!(s["tcp"]["messages_in"], 0, "{}", s["tcp"]);
}

/// A WebSocket UA (`ws:` or `wss:`) registers bob@ringway.test, then SIPp
/// calls bob over UDP through the proxy; the UA answers.
fn call_to_websocket_ua(
    port: &'static str,
    tls: bool,
) -> (Vec<String>, SippStats, serde_json::Value) {
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
            ],
        );
        let mut args = vec![
            ws_client().display().to_string(),
            "127.0.0.1".into(),
            port.into(),
        ];
        if tls {
            args.extend(["--ca".into(), "ca.pem".into()]);
        }
        args.extend(["ua".into(), "bob".into(), "ringway.test".into()]);
        let out = d.join("ua.out");
        let ua = Command::new("python3")
            .args(&args)
            .current_dir(&d)
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&out).unwrap())
            .spawn()
            .expect("run python3");
        let ua_pid = procs.add("ua", ua);
        // Registered: the binding is there before SIPp calls.
        let end = Instant::now() + Duration::from_secs(20);
        while !std::fs::read_to_string(&out)
            .unwrap_or_default()
            .contains("registered")
        {
            assert!(Instant::now() < end, "the UA never registered");
            std::thread::sleep(Duration::from_millis(50));
        }
        let uac = uac_args(
            "127.0.0.1:5060".parse().unwrap(),
            "127.0.0.1:5062".parse().unwrap(),
            "bob",
            "ringway.test",
            1,
            1,
        );
        let (_, stats) = run_sipp(procs, &d, "uac", &uac, Duration::from_secs(60));
        let mut ua = procs.take(ua_pid).unwrap();
        let _ = wait_bounded(&mut ua, Duration::from_secs(20));
        let summary = stop_proxy(procs, &p);
        let lines = std::fs::read_to_string(&out)
            .unwrap_or_default()
            .lines()
            .map(str::to_string)
            .collect();
        (lines, stats, summary)
    })
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
    let (lines, stats, s) = call_to_websocket_ua("5066", false);
    check_call(&lines, &stats, &s);
}

#[test]
fn secure_websocket_ua_registers_and_receives_a_call_from_sipp() {
    let (lines, stats, s) = call_to_websocket_ua("5067", true);
    check_call(&lines, &stats, &s);
    assert!(
        s["tls"]["handshakes"].as_u64().unwrap() >= 1,
        "{}",
        s["tls"]
    );
}
