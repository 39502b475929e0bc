//! Idle connections (issue 21): `ringway sip idle` opens many TCP and TLS
//! connections to the proxy, each answered one CRLF CRLF keep-alive, and
//! reads the proxy's memory before and after. The proxy holds them all
//! (none refused, none closed while idle) and each costs at most the
//! issue's goals: 10 KiB per idle TCP connection, 40 KiB per idle TLS
//! connection (PSS of the proxy process; memory, not a timing). In a
//! private network namespace, from four loopback source addresses.

mod sip_proxy_support;

use sip_proxy_support::*;
use std::path::Path;
use std::process::Command;

/// `ringway sip idle` against `to` with `extra` options; its JSON summary.
fn idle(dir: &Path, pid: u32, to: &str, connections: usize, extra: &[&str]) -> serde_json::Value {
    let json = dir.join(format!("idle-{}.json", to.replace([':', '.'], "-")));
    let out = Command::new(ringway())
        .args(["sip", "idle", "--to", to])
        .args(["--connections", &connections.to_string()])
        .args(["--source", "127.0.0.2", "--source", "127.0.0.3"])
        .args(["--source", "127.0.0.4", "--source", "127.0.0.5"])
        .args(["--settle-s", "1", "--server-pid", &pid.to_string()])
        .args(extra)
        .arg("--json")
        .arg(&json)
        .output()
        .expect("run ringway sip idle");
    let text = String::from_utf8_lossy(&out.stdout);
    eprintln!("{text}{}", String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "ringway sip idle failed");
    serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap()
}

/// All `connections` open, none failed or closed; the proxy's PSS per
/// connection (bytes).
fn held(s: &serde_json::Value, connections: u64) -> f64 {
    assert_eq!(s["open"], connections, "{s}");
    assert_eq!(s["failed"], serde_json::json!({}), "{s}");
    assert_eq!(s["closed_while_idle"], 0, "{s}");
    s["server"]["pss_per_connection_bytes"]
        .as_f64()
        .unwrap_or_else(|| panic!("no memory reading: {s}"))
}

const TCP: u64 = 3000;
const TLS: u64 = 1500;

/// A fresh proxy (memory freed by earlier connections would be reused and
/// hide the cost) with TCP and TLS listeners takes `connections` idle
/// connections over `transport`: the proxy's summary and the client's.
fn held_by_a_fresh_proxy(
    transport: &'static str,
    connections: u64,
) -> (serde_json::Value, serde_json::Value) {
    in_bed(move |procs, d| {
        make_proxy_certs(d);
        let file = |name: &str| d.join(name).display().to_string();
        let (cert, key, ca) = (file("proxy.pem"), file("proxy.key"), file("ca.pem"));
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
                &cert,
                "--tls-key",
                &key,
                "--relay",
                "127.0.0.0/8",
                "--tcp-max-connections-per-ip",
                "10000",
            ],
        );
        let client = match transport {
            "tls" => idle(
                d,
                p.pid,
                "tls:127.0.0.1:5061",
                connections as usize,
                &["--tls-ca", &ca],
            ),
            _ => idle(d, p.pid, "tcp:127.0.0.1:5060", connections as usize, &[]),
        };
        (stop_proxy(procs, &p), client)
    })
}

/// The proxy saw them: accepted, each ping answered, none refused.
fn seen_by_the_proxy(summary: &serde_json::Value, connections: u64) {
    let t = &summary["tcp"];
    assert!(t["accepted"].as_u64().unwrap() >= connections, "{t}");
    assert!(t["pings"].as_u64().unwrap() >= connections, "{t}");
    assert_eq!(t["refused_limit"], 0, "{t}");
    assert_eq!(t["refused_per_ip"], 0, "{t}");
}

#[test]
fn idle_tcp_connections_are_held_within_10_kib_each() {
    let (summary, client) = held_by_a_fresh_proxy("tcp", TCP);
    let bytes = held(&client, TCP);
    eprintln!("PSS per idle TCP connection: {bytes:.0} B");
    assert!(bytes <= 10.0 * 1024.0, "TCP: {bytes:.0} B per connection");
    seen_by_the_proxy(&summary, TCP);
}

#[test]
fn idle_tls_connections_are_held_within_40_kib_each() {
    let (summary, client) = held_by_a_fresh_proxy("tls", TLS);
    let bytes = held(&client, TLS);
    eprintln!("PSS per idle TLS connection: {bytes:.0} B");
    assert!(bytes <= 40.0 * 1024.0, "TLS: {bytes:.0} B per connection");
    seen_by_the_proxy(&summary, TLS);
    assert!(
        tls_counter(&summary, "handshakes") >= TLS,
        "{}",
        summary["tls"]
    );
}
