//! Flows of the registrar's bindings (docs/sip-proxy.md, "NAT: flows,
//! outbound, rport"), in a private network namespace: a phone registered
//! over UDP from behind a NAT (a private Contact) gets keepalive OPTIONS at
//! `--keepalive-interval`; while it answers its binding stays, once it
//! stops its binding is removed and counted. A binding registered over TCP
//! goes when its connection closes. An RFC 5626 STUN keepalive is answered
//! with the address it came from.

mod sip_proxy_support;

use sip_proxy_support::*;
use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{ChildStdin, ChildStdout, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

fn ua_script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/sip_proxy_support/keepalive_ua.py")
}

/// The UA's stdout lines, read by a thread (so waits have deadlines).
fn lines(out: ChildStdout) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            eprintln!("[ua] {line}");
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

fn wait_line(rx: &mpsc::Receiver<String>, want: &str, limit: Duration) {
    let end = Instant::now() + limit;
    loop {
        let left = end.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(line) if line == want => return,
            Ok(_) => {}
            Err(_) => panic!("the UA never said {want:?}"),
        }
    }
}

/// Start the UA (killed by the guard): its stdout lines and its stdin.
fn spawn_ua(procs: &mut Procs, args: &[&str]) -> (mpsc::Receiver<String>, ChildStdin) {
    let mut child = Command::new("python3")
        .arg(ua_script())
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("run python3");
    let rx = lines(child.stdout.take().unwrap());
    let stdin = child.stdin.take().unwrap();
    procs.add("ua", child);
    (rx, stdin)
}

/// Poll the metrics until `name` reaches `value` (deadline 30 s).
fn wait_metric(metrics: SocketAddr, name: &str, value: f64) -> String {
    let end = Instant::now() + Duration::from_secs(30);
    loop {
        let text = scrape(metrics);
        if prom_value(&text, name) == Some(value) {
            return text;
        }
        assert!(
            Instant::now() < end,
            "{name} never reached {value}: {:?}",
            prom_value(&text, name)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

const REMOVED_KEEPALIVE: &str = "ringway_sip_bindings_removed_total{reason=\"keepalive\"}";
const REMOVED_CLOSED: &str = "ringway_sip_bindings_removed_total{reason=\"connection_closed\"}";
const BINDINGS: &str = "ringway_sip_registrar_bindings";

#[test]
fn a_silent_udp_flow_and_a_closed_connection_lose_their_bindings() {
    let summary = netns(|| {
        let dir = tempfile::tempdir().unwrap();
        let mut procs = Procs::default();
        let metrics: SocketAddr = "127.0.0.1:9377".parse().unwrap();
        let proxy = start_proxy(
            &mut procs,
            dir.path(),
            &[
                "--listen",
                "127.0.0.1:5060",
                "--listen",
                "tcp:127.0.0.1:5060",
                "--registrar",
                "--domain",
                "ringway.test",
                "--keepalive-interval",
                "1",
                "--keepalive-failures",
                "3",
                "--metrics",
                "127.0.0.1:9377",
            ],
        );
        // UDP: three keepalives answered, then silence.
        let (udp, _udp_stdin) = spawn_ua(&mut procs, &["udp", "127.0.0.1", "5060", "5090", "3"]);
        wait_line(&udp, "registered", Duration::from_secs(10));
        wait_line(&udp, "answered 3", Duration::from_secs(30));
        let text = wait_metric(metrics, "ringway_sip_keepalive_replies_total", 3.0);
        assert_eq!(prom_value(&text, REMOVED_KEEPALIVE), Some(0.0), "{text}");
        assert_eq!(prom_value(&text, BINDINGS), Some(1.0));
        // A STUN keepalive (RFC 5626 4.4.2): answered with the address it
        // came from (not from a flow: only as the request is no smaller).
        let stun = Command::new("python3")
            .arg(ua_script())
            .args(["stun", "127.0.0.1", "5060", "5091"])
            .output()
            .expect("run python3");
        assert!(stun.status.success(), "{stun:?}");
        assert_eq!(
            String::from_utf8_lossy(&stun.stdout).trim(),
            "mapped 127.0.0.1:5091"
        );
        // Silent from now on: removed after three unanswered keepalives.
        let text = wait_metric(metrics, REMOVED_KEEPALIVE, 1.0);
        assert_eq!(prom_value(&text, BINDINGS), Some(0.0), "{text}");
        assert_eq!(
            prom_value(&text, "ringway_sip_keepalive_dead_flows_total"),
            Some(1.0)
        );
        wait_line(&udp, "ignored 3", Duration::from_secs(5));
        // TCP: the binding lives as long as its connection.
        let (tcp, mut tcp_stdin) = spawn_ua(&mut procs, &["tcp", "127.0.0.1", "5060"]);
        wait_line(&tcp, "registered", Duration::from_secs(10));
        let text = wait_metric(metrics, BINDINGS, 1.0);
        assert_eq!(
            prom_value(&text, "ringway_sip_binding_flows{kind=\"connection\"}"),
            Some(1.0),
            "{text}"
        );
        assert_eq!(prom_value(&text, REMOVED_CLOSED), Some(0.0));
        writeln!(tcp_stdin, "close").unwrap();
        wait_line(&tcp, "closed", Duration::from_secs(10));
        let text = wait_metric(metrics, REMOVED_CLOSED, 1.0);
        assert_eq!(prom_value(&text, BINDINGS), Some(0.0), "{text}");
        stop_proxy(&mut procs, &proxy)
    });
    let keepalive = &summary["keepalive"];
    assert_eq!(keepalive["removed_keepalive"], 1, "{keepalive}");
    assert_eq!(keepalive["removed_connection_closed"], 1, "{keepalive}");
    assert_eq!(keepalive["replies"], 3, "{keepalive}");
    assert_eq!(keepalive["stun"], 1, "{keepalive}");
    assert!(keepalive["sent"].as_u64().unwrap() >= 6, "{keepalive}");
}
