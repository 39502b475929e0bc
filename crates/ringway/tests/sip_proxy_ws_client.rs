//! `ringway sip proxy --route-to ws:`/`wss:`: the proxy as a WebSocket
//! client (RFC 7118, RFC 6455) towards another proxy, in a private network
//! namespace (only `lo`):
//!
//! - Kamailio (modules xhttp and websocket) as the upstream over `ws:`:
//!   SIPp UAC (UDP) → ringway → WebSocket → Kamailio → SIPp UAS (UDP);
//!   every call's INVITE, ACK and BYE cross one reused connection, in both
//!   modes. Kamailio refuses unmasked client frames and a wrong path.
//! - A second ringway as the upstream over `wss:` (the test's CA).
//! - Servers that break the rules, written here byte by byte: a wrong
//!   `Sec-WebSocket-Accept`, a masked server frame, a frame longer than a
//!   message may be, and no server at all: each refused and counted, a
//!   wrong accept and no server with `500` to the caller at once (a
//!   transport error, RFC 3261 16.9, as over `tcp:`), every frame the
//!   proxy sends masked (RFC 6455 5.3), nothing sent before the answer.

mod sip_proxy_support;

use sip_proxy_support::*;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const CALLS: u32 = 10;
const WEBSOCKET_MODULE: &str = "/usr/lib/x86_64-linux-gnu/kamailio/modules/websocket.so";

fn a(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

/// Kamailio in its own process group: dropping it ends the group
/// (Kamailio forks workers that would outlive a killed parent).
struct Kamailio(Child);

impl Drop for Kamailio {
    fn drop(&mut self) {
        let group = format!("-{}", self.0.id());
        let _ = Command::new("kill").args(["-TERM", "--", &group]).status();
        let end = Instant::now() + Duration::from_secs(5);
        while Instant::now() < end && !matches!(self.0.try_wait(), Ok(Some(_))) {
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = Command::new("kill")
            .args(["-KILL", "--", &group])
            .stderr(Stdio::null())
            .status();
        let _ = self.0.wait();
    }
}

/// Kamailio with bench/kamailio/ws.cfg: UDP 127.0.0.1:5080, WebSocket on
/// TCP 127.0.0.1:8080 (path `/sip`), forwarding to the UAS on
/// 127.0.0.1:5070. `None` after a visible skip when its websocket module
/// is not installed (a failure under `CI=true`).
fn start_kamailio(dir: &Path) -> Option<Kamailio> {
    if !Path::new(WEBSOCKET_MODULE).exists() {
        ringway_io::testing::data_missing(
            "Kamailio's websocket module is not installed (Debian package \
             kamailio-websocket-modules; scripts/install-deps.sh)",
        );
        return None;
    }
    let cfg = concat!(env!("CARGO_MANIFEST_DIR"), "/../../bench/kamailio/ws.cfg");
    let log = std::fs::File::create(dir.join("kamailio.log")).unwrap();
    let child = Command::new("/usr/sbin/kamailio")
        .args(["-DD", "-E", "-f", cfg])
        .args(["-l", "udp:127.0.0.1:5080", "-l", "tcp:127.0.0.1:8080"])
        .args(["-A", "UAS=\"sip:127.0.0.1:5070\""])
        .arg("-P")
        .arg(dir.join("kamailio.pid"))
        .arg("-Y")
        .arg(dir)
        .args(["-m", "32", "-M", "8"])
        .process_group(0)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("kamailio installed (scripts/install-deps.sh)");
    let kamailio = Kamailio(child);
    wait_listening("127.0.0.1:8080");
    Some(kamailio)
}

fn kamailio_log(dir: &Path) -> String {
    std::fs::read_to_string(dir.join("kamailio.log")).unwrap_or_default()
}

/// `CALLS` SIPp calls (UDP, 127.0.0.1:5061) through the proxy on
/// 127.0.0.1:5060 to bob@ringway.test, which the proxy routes to its
/// `--route-to`; the SIPp UAS listens on 127.0.0.1:5070.
fn calls(procs: &mut Procs, dir: &Path, name: &str) -> SippStats {
    let uac = uac_args(
        a("127.0.0.1:5060"),
        a("127.0.0.1:5061"),
        "bob",
        "ringway.test",
        CALLS,
        20,
    );
    run_sipp(procs, dir, name, &uac, Duration::from_secs(60)).1
}

/// The summary's connection counters of one transport.
fn row<'a>(s: &'a serde_json::Value, transport: &str) -> &'a serde_json::Value {
    &s["tcp"]["by_transport"][transport]
}

/// The proxy under test: UDP 127.0.0.1:5060 and a WebSocket listener
/// (`scheme`: `ws:` or `wss:`) on 127.0.0.1:5066, routing to `upstream`
/// in `mode`, then `extra`.
fn start_edge(
    procs: &mut Procs,
    dir: &Path,
    scheme: &str,
    upstream: &str,
    mode: &str,
    extra: &[&str],
) -> ProxyProc {
    let listen = format!("{scheme}127.0.0.1:5066");
    let args = ["--listen", &listen, "--route-to", upstream, "--mode", mode];
    start_loopback_proxy(procs, dir, &[&args[..], extra].concat())
}

/// Every call (`stats`) crossed one connection on `transport` that the
/// summary `ours` opened (its INVITE, ACK and BYE out on it) and `theirs`
/// accepted, which refused no frame.
fn assert_calls_crossed_one_connection(
    stats: &SippStats,
    ours: &serde_json::Value,
    theirs: &serde_json::Value,
    transport: &str,
) {
    assert_eq!(stats.successful, u64::from(CALLS), "{stats:?}");
    assert_eq!(stats.failed, 0, "{stats:?}");
    let ours = row(ours, transport);
    assert_eq!(ours["connected"], 1, "{ours}");
    assert!(
        ours["messages_out"].as_u64().unwrap() >= 3 * u64::from(CALLS),
        "{ours}"
    );
    let theirs = row(theirs, transport);
    assert_eq!(theirs["accepted"], 1, "{theirs}");
    assert_eq!(closed(theirs, "ws_error"), 0, "{theirs}");
}

fn closed(row: &serde_json::Value, reason: &str) -> u64 {
    row["closed"]
        .as_array()
        .unwrap_or_else(|| panic!("closed in {row}"))
        .iter()
        .find(|pair| pair[0] == reason)
        .and_then(|pair| pair[1].as_u64())
        .unwrap_or(0)
}

#[test]
fn calls_cross_kamailio_over_one_websocket_connection_in_both_modes() {
    let runs = in_bed(|procs, dir| {
        let kamailio = start_kamailio(dir)?;
        spawn_sipp(procs, dir, &uas_args(a("127.0.0.1:5070")));
        wait_udp(5070);
        let mut runs = Vec::new();
        for mode in ["stateful", "stateless"] {
            let p = start_edge(procs, dir, "ws:", "ws:127.0.0.1:8080/sip", mode, &[]);
            let stats = calls(procs, dir, mode);
            runs.push((mode, stats, stop_proxy(procs, &p)));
        }
        drop(kamailio);
        eprintln!("kamailio:\n{}", kamailio_log(dir));
        Some(runs)
    });
    let Some(runs) = runs else { return };
    for (mode, stats, s) in runs {
        let ws = row(&s, "ws");
        assert_eq!(stats.successful, u64::from(CALLS), "{mode}: {stats:?} {ws}");
        assert_eq!(stats.failed, 0, "{mode}: {stats:?}");
        // One connection, opened by us, carried every call.
        assert_eq!(ws["connected"], 1, "{mode}: {ws}");
        assert_eq!(ws["accepted"], 0, "{mode}: {ws}");
        // INVITE, ACK and BYE of each call out; at least the 200s to
        // INVITE and BYE in.
        let out = ws["messages_out"].as_u64().unwrap();
        assert!(out >= 3 * u64::from(CALLS), "{mode}: {ws}");
        let back = ws["messages_in"].as_u64().unwrap();
        assert!(back >= 2 * u64::from(CALLS), "{mode}: {ws}");
        for reason in ["ws_handshake", "ws_error", "connect_failed"] {
            assert_eq!(closed(ws, reason), 0, "{mode} {reason}: {ws}");
        }
        assert_eq!(ws["no_connection"], 0, "{mode}: {ws}");
    }
}

/// Wait until something has UDP `port` bound (bounded).
fn wait_udp(port: u16) {
    let end = Instant::now() + Duration::from_secs(20);
    while !ringway_io::counters::udp_sockets()
        .unwrap_or_default()
        .iter()
        .any(|r| r.local.port() == port)
    {
        assert!(Instant::now() < end, "nothing bound UDP port {port}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn calls_cross_a_second_ringway_over_wss() {
    let (stats, edge, upstream) = in_bed(|procs, dir| {
        let certs = proxy_cert_args(dir);
        let certs: Vec<&str> = certs.iter().map(String::as_str).collect();
        let ca = dir.join("ca.pem").display().to_string();
        let mut upstream_args = vec![
            "--listen",
            "127.0.0.1:5080",
            "--listen",
            "wss:127.0.0.1:5067",
            "--route-to",
            "127.0.0.1:5070",
            "--relay",
            "127.0.0.0/8",
        ];
        upstream_args.extend(&certs);
        let upstream = start_proxy(procs, dir, &upstream_args);
        let edge_args = [&["--tls-ca", &ca][..], &certs[..]].concat();
        let edge = start_edge(
            procs,
            dir,
            "wss:",
            "wss:127.0.0.1:5067/sip",
            "stateful",
            &edge_args,
        );
        spawn_sipp(procs, dir, &uas_args(a("127.0.0.1:5070")));
        wait_udp(5070);
        let stats = calls(procs, dir, "wss");
        (
            stats,
            stop_proxy(procs, &edge),
            stop_proxy(procs, &upstream),
        )
    });
    // The upstream's server side refuses unmasked client frames (1002,
    // ws_error): none here.
    assert_calls_crossed_one_connection(&stats, &edge, &upstream, "wss");
    assert_eq!(
        edge["tls"]["by_transport"]["wss"]["handshakes"], 1,
        "{edge}"
    );
    let theirs = row(&upstream, "wss");
    assert_eq!(closed(theirs, "ws_handshake"), 0, "{theirs}");
}

/// What a hand-written server breaks.
#[derive(Clone, Copy, Debug)]
enum Breaks {
    /// Its `Sec-WebSocket-Accept` is not the one the key asks for.
    Accept,
    /// Its frame is masked (only clients mask).
    MaskedFrame,
    /// Its frame claims 2^40 bytes.
    TooBig,
}

/// Read from `stream` into `buf` until `done(buf)`; `false` if the
/// stream ended or timed out first.
fn read_more(stream: &mut TcpStream, buf: &mut Vec<u8>, done: impl Fn(&[u8]) -> bool) -> bool {
    let mut chunk = [0u8; 4096];
    while !done(buf) {
        match stream.read(&mut chunk) {
            Ok(0) | Err(_) => return false,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
    true
}

/// One client frame at the start of `buf` once whole: (opcode, masked,
/// unmasked payload, its length in `buf`).
fn client_frame(buf: &[u8]) -> Option<(u8, bool, Vec<u8>, usize)> {
    let (b0, b1) = (*buf.first()?, *buf.get(1)?);
    let masked = b1 & 0x80 != 0;
    let (len, mut at) = match b1 & 0x7f {
        126 => (
            usize::from(u16::from_be_bytes([*buf.get(2)?, *buf.get(3)?])),
            4,
        ),
        127 => return None,
        n => (usize::from(n), 2),
    };
    let mask = if masked {
        let m = buf.get(at..at + 4)?;
        at += 4;
        [m[0], m[1], m[2], m[3]]
    } else {
        [0; 4]
    };
    let payload = buf.get(at..at + len)?;
    let payload = payload
        .iter()
        .enumerate()
        .map(|(i, b)| b ^ mask[i % 4])
        .collect();
    Some((b0 & 0x0f, masked, payload, at + len))
}

/// Serve one connection from `listener` breaking `breaks`; what it saw,
/// as lines.
fn serve_badly(listener: &TcpListener, breaks: Breaks) -> Vec<String> {
    let end = Instant::now() + Duration::from_secs(20);
    let mut stream = loop {
        match listener.accept() {
            Ok((stream, _)) => break stream,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if Instant::now() > end {
                    return vec!["no connection".into()];
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(e) => return vec![format!("accept: {e}")],
        }
    };
    stream.set_nonblocking(false).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut seen = Vec::new();
    let mut buf = Vec::new();
    let ends_head = |b: &[u8]| b.windows(4).any(|w| w == b"\r\n\r\n");
    if !read_more(&mut stream, &mut buf, ends_head) {
        return vec!["no upgrade request".into()];
    }
    let head_len = buf.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
    let head = String::from_utf8_lossy(&buf[..head_len]).to_string();
    seen.push(head.lines().next().unwrap_or_default().to_string());
    if !head.contains("\r\nSec-WebSocket-Protocol: sip\r\n") {
        seen.push("no sip sub-protocol".into());
    }
    // RFC 6455 4.1: nothing after the request until our answer.
    if buf.len() > head_len {
        seen.push("bytes before the answer".into());
    }
    let key = head
        .lines()
        .find_map(|l| l.strip_prefix("Sec-WebSocket-Key: "))
        .unwrap_or_default();
    let accept = match breaks {
        Breaks::Accept => ringway_server::sip::ws::accept_key("dGhlIHNhbXBsZSBub25jZQ=="),
        _ => ringway_server::sip::ws::accept_key(key),
    };
    let answer = format!(
        "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Accept: {accept}\r\nSec-WebSocket-Protocol: sip\r\n\r\n"
    );
    stream.write_all(answer.as_bytes()).unwrap();
    buf.drain(..head_len);
    let whole = |b: &[u8]| client_frame(b).is_some();
    if let Breaks::Accept = breaks {
        // The proxy closes without a frame.
        let got = read_more(&mut stream, &mut buf, whole);
        seen.push(if got { "a frame" } else { "closed" }.into());
        return seen;
    }
    if !read_more(&mut stream, &mut buf, whole) {
        seen.push("no frame".into());
        return seen;
    }
    let (opcode, masked, payload, used) = client_frame(&buf).unwrap();
    buf.drain(..used);
    let text = String::from_utf8_lossy(&payload);
    seen.push(format!(
        "opcode {opcode} masked {masked} {}",
        text.lines().next().unwrap_or_default()
    ));
    let bad: Vec<u8> = match breaks {
        Breaks::MaskedFrame => {
            let mut f = vec![0x81, 0x80 | 2, 9, 9, 9, 9];
            f.extend(b"hi".iter().map(|b| b ^ 9));
            f
        }
        _ => {
            let mut f = vec![0x81, 127];
            f.extend_from_slice(&(1u64 << 40).to_be_bytes());
            f
        }
    };
    stream.write_all(&bad).unwrap();
    if !read_more(&mut stream, &mut buf, whole) {
        seen.push("no close frame".into());
        return seen;
    }
    let (opcode, masked, payload, _) = client_frame(&buf).unwrap();
    let code = payload
        .get(..2)
        .map_or(0, |c| u16::from_be_bytes([c[0], c[1]]));
    seen.push(format!("opcode {opcode} masked {masked} code {code}"));
    seen
}

fn invite(call: &str) -> String {
    format!(
        "INVITE sip:bob@ringway.test SIP/2.0\r\n\
         Via: SIP/2.0/UDP 127.0.0.1:5061;branch=z9hG4bK-{call}\r\n\
         Max-Forwards: 70\r\nFrom: <sip:alice@ringway.test>;tag=a-{call}\r\n\
         To: <sip:bob@ringway.test>\r\nCall-ID: {call}@ringway.test\r\nCSeq: 1 INVITE\r\n\
         Contact: <sip:alice@127.0.0.1:5061>\r\nContent-Length: 0\r\n\r\n"
    )
}

/// Send an INVITE for `call` and wait (bounded) for its final status.
fn final_status(socket: &UdpSocket, call: &str) -> Option<String> {
    socket
        .send_to(invite(call).as_bytes(), "127.0.0.1:5060")
        .unwrap();
    let call_id = format!("Call-ID: {call}@");
    receive_matching(socket, Duration::from_secs(15), |text| {
        text.contains(&call_id) && !status_line(text).starts_with("SIP/2.0 1")
    })
    .map(|text| status_line(&text).to_string())
}

#[test]
fn bad_servers_are_refused_and_counted() {
    let (statuses, seen, s) = in_bed(|procs, dir| {
        let p = start_edge(procs, dir, "ws:", "ws:127.0.0.1:8090/sip", "stateful", &[]);
        let ua = UdpSocket::bind("127.0.0.1:5061").unwrap();
        // Nobody listens yet: the connection is refused.
        let down = final_status(&ua, "down");
        let listener = TcpListener::bind("127.0.0.1:8090").unwrap();
        listener.set_nonblocking(true).unwrap();
        let (tx, rx) = mpsc::channel();
        let server = std::thread::spawn(move || {
            for breaks in [Breaks::Accept, Breaks::MaskedFrame, Breaks::TooBig] {
                let _ = tx.send(serve_badly(&listener, breaks));
            }
        });
        let accept = final_status(&ua, "accept");
        let mut seen = vec![rx.recv_timeout(Duration::from_secs(30)).unwrap()];
        for call in ["masked", "too-big"] {
            ua.send_to(invite(call).as_bytes(), "127.0.0.1:5060")
                .unwrap();
            seen.push(rx.recv_timeout(Duration::from_secs(30)).unwrap());
        }
        server.join().unwrap();
        let s = stop_proxy(procs, &p);
        ((down, accept), seen, s)
    });
    eprintln!("{statuses:?} {seen:?}");
    let upgrade = "GET /sip HTTP/1.1";
    assert_eq!(seen[0], [upgrade, "closed"], "wrong Sec-WebSocket-Accept");
    let invite = "INVITE sip:bob@ringway.test SIP/2.0";
    assert_eq!(
        seen[1],
        [
            upgrade.to_string(),
            format!("opcode 1 masked true {invite}"),
            "opcode 8 masked true code 1002".to_string()
        ],
        "a masked server frame"
    );
    assert_eq!(
        seen[2],
        [
            upgrade.to_string(),
            format!("opcode 1 masked true {invite}"),
            "opcode 8 masked true code 1009".to_string()
        ],
        "a server frame beyond the message bound"
    );
    // A transport error (RFC 3261 16.9) with no target left, as over
    // tcp: and tls: (transport_error.rs).
    let unreachable = "SIP/2.0 500 Server Internal Error - Next Hop Unreachable";
    assert_eq!(statuses.0.as_deref(), Some(unreachable), "no server");
    assert_eq!(statuses.1.as_deref(), Some(unreachable), "wrong accept");
    let ws = row(&s, "ws");
    // Four attempts; a refused connect may fail at once (not counted as
    // connected) or once it completes.
    assert!(ws["connected"].as_u64().unwrap() >= 3, "{ws}");
    assert_eq!(closed(ws, "connect_failed"), 1, "{ws}");
    assert_eq!(closed(ws, "ws_handshake"), 1, "{ws}");
    assert_eq!(closed(ws, "ws_error"), 2, "{ws}");
    assert!(
        s["tcp"]["undelivered"].as_u64().unwrap() >= 2,
        "{}",
        s["tcp"]
    );
}

/// The dispatcher's `--proxy ws:`: SIPp UAC (UDP) → dispatcher → one
/// WebSocket connection → a ringway proxy (its `ws:` listener, which
/// refuses unmasked client frames) → SIPp UAS (UDP); the OPTIONS probes
/// go over the same connection.
#[test]
fn the_dispatcher_reaches_a_proxy_over_ws() {
    let (stats, dispatch, member) = in_bed(|procs, dir| {
        let member = start_proxy(
            procs,
            dir,
            &[
                "--listen",
                "127.0.0.11:5060",
                "--listen",
                "ws:127.0.0.11:5086",
                "--relay",
                "127.0.0.0/8",
                "--mode",
                "stateful",
            ],
        );
        let d = start_dispatcher(
            procs,
            dir,
            &[
                "--listen",
                "127.0.0.1:5060",
                "--listen",
                "ws:127.0.0.1:5066",
                "--proxy",
                "ws:127.0.0.11:5086",
                "--probe-interval-ms",
                "100",
            ],
        );
        spawn_sipp(procs, dir, &uas_args(a("127.0.0.1:5070")));
        wait_udp(5070);
        let uac = uac_args(
            a("127.0.0.1:5060"),
            a("127.0.0.1:5061"),
            "bob",
            "127.0.0.1:5070",
            CALLS,
            20,
        );
        let (_, stats) = run_sipp(procs, dir, "uac", &uac, Duration::from_secs(60));
        (stats, stop_proxy(procs, &d), stop_proxy(procs, &member))
    });
    assert_calls_crossed_one_connection(&stats, &dispatch, &member, "ws");
    assert!(
        dispatch["dispatch"]["probe_answers"].as_u64().unwrap() >= 2,
        "{}",
        dispatch["dispatch"]
    );
}
