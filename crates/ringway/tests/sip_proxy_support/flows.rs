//! Connections as flows (RFC 5626 outbound, RFC 5923 alias): small TCP
//! and UDP peers written in the tests, and the edge proxy / registrar
//! scenario `sip_proxy_flows.rs` and `sip_scaleout.rs` (over Redis) share.

use super::*;
use std::io::{ErrorKind, Read, Write};
use std::net::{TcpStream, UdpSocket};
use std::path::Path;
use std::time::{Duration, Instant};

/// Read from `stream` into `seen` until it holds `want` or `limit` passes.
pub(crate) fn read_until(
    stream: &mut TcpStream,
    seen: &mut String,
    want: &str,
    limit: Duration,
) -> bool {
    stream
        .set_read_timeout(Some(Duration::from_millis(100)))
        .unwrap();
    let end = Instant::now() + limit;
    let mut buf = [0u8; 4096];
    while !seen.contains(want) {
        if Instant::now() >= end {
            return false;
        }
        match stream.read(&mut buf) {
            Ok(0) => return seen.contains(want),
            Ok(n) => seen.push_str(&String::from_utf8_lossy(&buf[..n])),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(_) => return seen.contains(want),
        }
    }
    true
}

/// The UA's REGISTER through the edge (Path and outbound supported).
pub(crate) const REGISTER: &str = "REGISTER sip:ringway.test SIP/2.0\r\n\
Via: SIP/2.0/TCP 10.0.0.7:5060;branch=z9hG4bKuareg1;rport\r\nMax-Forwards: 70\r\n\
From: <sip:alice@ringway.test>;tag=u1\r\nTo: <sip:alice@ringway.test>\r\n\
Call-ID: ua-reg-1\r\nCSeq: 1 REGISTER\r\nSupported: path, outbound\r\n\
Contact: <sip:alice@10.0.0.7:5060;transport=tcp>;+sip.instance=\"<urn:uuid:1>\";reg-id=1\r\n\
Expires: 600\r\nContent-Length: 0\r\n\r\n";

/// A call to alice from the UDP caller on 127.0.0.1:5071.
pub(crate) fn invite_alice(n: u32) -> Vec<u8> {
    format!(
        "INVITE sip:alice@ringway.test SIP/2.0\r\n\
Via: SIP/2.0/UDP 127.0.0.1:5071;branch=z9hG4bKcall{n}\r\nMax-Forwards: 70\r\n\
From: <sip:bob@127.0.0.1:5071>;tag=b{n}\r\nTo: <sip:alice@ringway.test>\r\n\
Call-ID: call{n}\r\nCSeq: 1 INVITE\r\nContact: <sip:bob@127.0.0.1:5071>\r\n\
Content-Length: 0\r\n\r\n"
    )
    .into_bytes()
}

/// The first final response `udp` receives within `limit` (its status line).
pub(crate) fn final_response(udp: &UdpSocket, limit: Duration) -> Option<String> {
    receive_matching(udp, limit, |text| {
        let line = status_line(text);
        line.starts_with("SIP/2.0 ") && !line.starts_with("SIP/2.0 1")
    })
    .map(|text| status_line(&text).to_string())
}

/// The first line of a message.
pub(crate) fn status_line(text: &str) -> &str {
    text.lines().next().unwrap_or_default()
}

/// The first datagram `udp` receives within `limit` that `wanted` takes
/// (as text); the others are dropped.
pub(crate) fn receive_matching(
    udp: &UdpSocket,
    limit: Duration,
    wanted: impl Fn(&str) -> bool,
) -> Option<String> {
    udp.set_read_timeout(Some(Duration::from_millis(100)))
        .unwrap();
    let end = Instant::now() + limit;
    let mut buf = vec![0u8; 65_535];
    while Instant::now() < end {
        if let Ok(n) = udp.recv(&mut buf) {
            let text = String::from_utf8_lossy(&buf[..n]).into_owned();
            if wanted(&text) {
                return Some(text);
            }
        }
    }
    None
}

/// The UA's REGISTER of one flow (`reg`: its reg-id, its contact's port
/// `5060 + reg`) through the edge.
pub(crate) fn register_flow(reg: u32) -> String {
    REGISTER
        .replace("ua-reg-1", &format!("ua-reg-flow{reg}"))
        .replace("z9hG4bKuareg1", &format!("z9hG4bKuaflow{reg}"))
        .replace(
            "10.0.0.7:5060;transport=tcp",
            &format!("10.0.0.7:{};transport=tcp", 5060 + reg),
        )
        .replace("reg-id=1", &format!("reg-id={reg}"))
}

/// The UA's `486 Busy Here` to the INVITE at the end of `seen` (its Vias,
/// From, Call-ID and CSeq copied, a To tag added).
pub(crate) fn busy_here(seen: &str) -> Vec<u8> {
    let invite = &seen[seen.rfind("INVITE ").expect("an INVITE")..];
    let head = invite.split("\r\n\r\n").next().unwrap_or("");
    let mut reply = String::from("SIP/2.0 486 Busy Here\r\n");
    for line in head.lines().skip(1) {
        let name = header_name(line);
        if ["via", "v", "from", "f", "call-id", "i", "cseq"].contains(&name.as_str()) {
            reply.push_str(line);
            reply.push_str("\r\n");
        } else if name == "to" || name == "t" {
            reply.push_str(&format!("{line};tag=ua\r\n"));
        }
    }
    reply.push_str("Content-Length: 0\r\n\r\n");
    reply.into_bytes()
}

/// Poll `metrics` until `sample` reads `want` (bounded).
pub(crate) fn wait_metric(metrics: &str, sample: &str, want: f64) -> bool {
    let end = Instant::now() + Duration::from_secs(10);
    while Instant::now() < end {
        if prom_value(&scrape(metrics.parse().unwrap()), sample) == Some(want) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

/// A registrar for `ringway.test` on 127.0.0.1:5080 (UDP; then
/// `registrar_args`) and an edge proxy on UDP 127.0.0.1:5060 and
/// `edge_listen` (`tcp:127.0.0.1:5060`, `ws:127.0.0.1:5066`) routing to it
/// (then `edge_args`), both relaying to 127.0.0.0/8.
pub(crate) fn registrar_behind_edge(
    procs: &mut Procs,
    dir: &Path,
    edge_listen: &str,
    registrar_args: &[&str],
    edge_args: &[&str],
) -> (ProxyProc, ProxyProc) {
    let registrar = [
        "--listen",
        "127.0.0.1:5080",
        "--registrar",
        "--domain",
        "ringway.test",
        "--relay",
        "127.0.0.0/8",
    ];
    let registrar = start_proxy(procs, dir, &[&registrar[..], registrar_args].concat());
    let edge = [
        "--listen",
        "127.0.0.1:5060",
        "--listen",
        edge_listen,
        "--route-to",
        "127.0.0.1:5080",
        "--relay",
        "127.0.0.0/8",
    ];
    let edge = start_proxy(procs, dir, &[&edge[..], edge_args].concat());
    (registrar, edge)
}

/// RFC 5626 7, the registrar acting on a `430` it receives, on the wire:
/// a registrar on 127.0.0.1:5080 (stateful, then `registrar_args`) and an
/// edge proxy on 127.0.0.1:5060 (UDP and TCP, metrics on 127.0.0.1:9091)
/// in front of it. A UA registers two flows through the edge (reg-id 2,
/// then reg-id 1: the newer is tried first) and answers a first call over
/// flow 1 with 486; flow 1 closes; two more calls. Returns the registrar's
/// summary and, for calls 2 and 3, whether they reached the UA over flow 2.
pub(crate) fn registrar_acting_on_430(
    procs: &mut Procs,
    dir: &Path,
    registrar_args: &[&str],
) -> (serde_json::Value, Vec<bool>) {
    let registrar_args = [&["--mode", "stateful"][..], registrar_args].concat();
    let (registrar, edge) = registrar_behind_edge(
        procs,
        dir,
        "tcp:127.0.0.1:5060",
        &registrar_args,
        &["--metrics", "127.0.0.1:9091"],
    );
    let long = Duration::from_secs(10);
    let mut flows = Vec::new();
    for reg in [2, 1] {
        let mut ua = TcpStream::connect("127.0.0.1:5060").unwrap();
        ua.write_all(register_flow(reg).as_bytes()).unwrap();
        let mut seen = String::new();
        assert!(
            read_until(&mut ua, &mut seen, "SIP/2.0 200 OK", long),
            "{seen}"
        );
        flows.push((ua, seen));
    }
    let (mut second, mut second_seen) = flows.remove(0);
    let (mut first, mut first_seen) = flows.remove(0);
    let caller = UdpSocket::bind("127.0.0.1:5071").unwrap();
    caller.send_to(&invite_alice(1), "127.0.0.1:5080").unwrap();
    assert!(
        read_until(
            &mut first,
            &mut first_seen,
            "INVITE sip:alice@10.0.0.7:5061;transport=tcp SIP/2.0",
            long
        ),
        "the newest flow first: {first_seen}"
    );
    // Answered (once the whole INVITE is in): the registrar retransmits
    // call 1 no more.
    assert!(read_until(
        &mut first,
        &mut first_seen,
        "Contact: <sip:bob@127.0.0.1:5071>",
        long
    ));
    first.write_all(&busy_here(&first_seen)).unwrap();
    assert_eq!(
        final_response(&caller, long).as_deref(),
        Some("SIP/2.0 486 Busy Here")
    );
    // Flow 1 goes; once the edge has seen it close, a call finds it gone:
    // 430 from the edge, and the registrar moves on to flow 2.
    drop(first);
    assert!(
        wait_metric(
            "127.0.0.1:9091",
            r#"ringway_sip_connections_open{transport="tcp"}"#,
            1.0
        ),
        "the edge did not see the connection close"
    );
    let mut calls = Vec::new();
    for n in [2, 3] {
        caller.send_to(&invite_alice(n), "127.0.0.1:5080").unwrap();
        let want = format!("Call-ID: call{n}\r\n");
        calls.push(read_until(&mut second, &mut second_seen, &want, long));
    }
    let answer = final_response(&caller, Duration::from_millis(300));
    stop_proxy(procs, &edge);
    let registrar = stop_proxy(procs, &registrar);
    assert_eq!(answer, None, "the caller got a final answer: {second_seen}");
    (registrar, calls)
}
