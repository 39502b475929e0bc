//! `ringway sip dispatch` over connection transports, against real peers
//! in a private network namespace (only `lo`):
//!
//! - SIPp UAC over TCP → dispatcher (`tcp:`) → two proxies over TCP (one
//!   stateful, one stateless) → SIPp UAS over TCP: no failed call, both
//!   proxies carry calls, the OPTIONS probes go over the connections too,
//!   and no datagram is sent or received on the way.
//! - A 20 000-byte request over TCP through the dispatcher and a proxy to
//!   a TCP endpoint of the test, answered back over the same connections;
//!   the same request as a UDP datagram is dropped and counted.
//! - SIPp (Debian's has no TLS) through stunnel: SIPp UAC → stunnel → TLS
//!   → dispatcher (`tls:`) → TLS → two proxies → TCP → SIPp UAS.
//! - RFC 5923 the other way: the dispatcher's Via towards a TCP proxy
//!   carries `alias`, so the proxy's call to a user registered through the
//!   dispatcher (its Path) comes back over the dispatcher's own
//!   connection: no connection is opened from the proxy to the dispatcher.

mod sip_proxy_support;

use sip_proxy_support::*;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::path::Path;
use std::time::{Duration, Instant};

const CALLS: u32 = 40;
const PROXIES: [&str; 2] = ["127.0.0.11", "127.0.0.12"];
/// The size of the body of the large request (above the UDP receive
/// frame of 16 KiB).
const LARGE_BODY: usize = 20_000;

fn a(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

/// A proxy on `ip` (UDP and TCP port 5060, with `tls` also TLS port 5061
/// presenting `proxy.pem` of `dir`) relaying to the loopback UAs, then
/// `extra`.
fn start_member(
    procs: &mut Procs,
    dir: &Path,
    ip: &str,
    mode: &str,
    tls: bool,
    extra: &[&str],
) -> ProxyProc {
    let mut args = strings(&[
        "--listen",
        &format!("{ip}:5060"),
        "--listen",
        &format!("tcp:{ip}:5060"),
        "--relay",
        "127.0.0.0/8",
        "--mode",
        mode,
    ]);
    if tls {
        args.extend(strings(&["--listen", &format!("tls:{ip}:5061")]));
        args.extend(cert_args(dir, false));
    }
    args.extend(strings(extra));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    start_proxy(procs, dir, &args)
}

/// The dispatcher on UDP and TCP 127.0.0.1:5060, probing every 100 ms,
/// then `extra`.
fn start_tcp_dispatcher(procs: &mut Procs, dir: &Path, extra: &[&str]) -> ProxyProc {
    let args = [
        "--listen",
        "127.0.0.1:5060",
        "--listen",
        "tcp:127.0.0.1:5060",
        "--probe-interval-ms",
        "100",
    ];
    start_dispatcher(procs, dir, &[&args[..], extra].concat())
}

/// `--tls-cert`/`--tls-key` (the certificate for every test IP), and with
/// `ca` the CA to verify peers with.
fn cert_args(dir: &Path, ca: bool) -> Vec<String> {
    let path = |name: &str| dir.join(name).display().to_string();
    let mut args = vec![
        "--tls-cert".to_string(),
        path("proxy.pem"),
        "--tls-key".to_string(),
        path("proxy.key"),
    ];
    if ca {
        args.extend(["--tls-ca".to_string(), path("ca.pem")]);
    }
    args
}

fn counter(s: &serde_json::Value, section: &str, name: &str) -> u64 {
    s[section][name]
        .as_u64()
        .unwrap_or_else(|| panic!("{section}.{name} in {}", s[section]))
}

/// Both proxies got new requests from the dispatcher and forwarded them;
/// the probes went out and were answered (over the proxies' transport).
fn check_both_proxies_carried(dispatch: &serde_json::Value, members: &[serde_json::Value]) {
    let per_proxy = dispatch["dispatch"]["proxies"].as_array().expect("proxies");
    assert_eq!(per_proxy.len(), 2, "{per_proxy:?}");
    for proxy in per_proxy {
        assert!(proxy["requests"].as_u64().unwrap() > 0, "{proxy}");
        assert_eq!(proxy["alive"], true, "{proxy}");
    }
    for member in members {
        assert!(
            counter(member, "proxy", "requests_forwarded") > 0,
            "{}",
            member["proxy"]
        );
        assert!(counter(member, "tcp", "accepted") >= 1, "{}", member["tcp"]);
    }
    assert!(counter(dispatch, "dispatch", "probes_sent") >= 2);
    assert!(
        counter(dispatch, "dispatch", "probe_answers") >= 2,
        "{}",
        dispatch["dispatch"]
    );
}

/// Over connections only: no datagram in or out at the dispatcher, no
/// message lost for want of a connection, and one connection to each
/// proxy, opened once and reused by every request and probe.
fn check_connections_only(dispatch: &serde_json::Value) {
    assert_eq!(dispatch["messages_in"], 0, "datagrams received");
    assert_eq!(dispatch["messages_out"], 0, "datagrams sent");
    check_connections(dispatch);
}

fn check_connections(dispatch: &serde_json::Value) {
    assert_eq!(
        counter(dispatch, "tcp", "udp_out"),
        0,
        "{}",
        dispatch["tcp"]
    );
    assert_eq!(
        counter(dispatch, "tcp", "no_connection"),
        0,
        "{}",
        dispatch["tcp"]
    );
    assert!(
        counter(dispatch, "tcp", "accepted") >= 1,
        "{}",
        dispatch["tcp"]
    );
    assert_eq!(
        counter(dispatch, "tcp", "connected"),
        2,
        "{}",
        dispatch["tcp"]
    );
}

/// SIPp UAC over TCP → dispatcher → two proxies over TCP → SIPp UAS over
/// TCP; then the large request over TCP and over UDP.
#[test]
fn sipp_over_tcp_through_the_dispatcher_to_two_proxies_over_tcp() {
    let (dispatch, members, stats, large) = in_bed(|procs, dir| {
        let members = [
            start_member(procs, dir, PROXIES[0], "stateful", false, &[]),
            start_member(procs, dir, PROXIES[1], "stateless", false, &[]),
        ];
        let d = start_tcp_dispatcher(
            procs,
            dir,
            &[
                "--proxy",
                "tcp:127.0.0.11:5060",
                "--proxy",
                "tcp:127.0.0.12:5060",
                "--metrics",
                "127.0.0.1:9091",
            ],
        );
        assert!(
            d.startup.iter().any(|l| l.contains("tcp:127.0.0.1:5060")),
            "{:?}",
            d.startup
        );
        let mut uas = uas_args(a("127.0.0.1:5070"));
        uas.extend(strings(&["-t", "t1"]));
        spawn_sipp(procs, dir, &uas);
        wait_listening("127.0.0.1:5070");
        let mut uac = uac_args(
            a("127.0.0.1:5060"),
            a("127.0.0.1:5061"),
            "bob",
            "127.0.0.1:5070;transport=tcp",
            CALLS,
            20,
        );
        uac.extend(strings(&["-t", "t1"]));
        let (st, stats) = run_sipp(procs, dir, "uac", &uac, Duration::from_secs(60));
        eprintln!("sipp: {stats:?} exit {st:?}");
        let large = large_request_over_tcp();
        // The same request as one datagram: longer than a receive frame.
        let udp = UdpSocket::bind("127.0.0.1:0").unwrap();
        let datagram = large_message(udp.local_addr().unwrap(), "UDP");
        udp.send_to(&datagram, "127.0.0.1:5060").unwrap();
        // Counted before the summary is written (bounded wait).
        let end = Instant::now() + Duration::from_secs(10);
        let truncated = r#"ringway_dispatch_datagrams_dropped_total{reason="rx_truncated"}"#;
        while prom_value(&scrape(a("127.0.0.1:9091")), truncated) != Some(1.0) {
            assert!(Instant::now() < end, "the datagram was not counted");
            std::thread::sleep(Duration::from_millis(50));
        }
        let dispatch = stop_proxy(procs, &d);
        let members: Vec<serde_json::Value> =
            members.iter().map(|m| stop_proxy(procs, m)).collect();
        (dispatch, members, stats, large)
    });
    assert_eq!(stats.failed, 0, "{stats:?}");
    assert_eq!(stats.successful, CALLS as u64, "{stats:?}");
    check_both_proxies_carried(&dispatch, &members);
    // INVITE, ACK, BYE per call and the large request; their answers.
    let n = CALLS as u64;
    assert!(
        counter(&dispatch, "tcp", "messages_in") >= 3 * n,
        "{}",
        dispatch["tcp"]
    );
    assert!(
        counter(&dispatch, "tcp", "messages_out") >= 3 * n,
        "{}",
        dispatch["tcp"]
    );
    assert!(counter(&dispatch, "dispatch", "responses_forwarded") >= 2 * n);
    // The large request: answered over the connections, delivered whole.
    let (status, delivered) = large;
    assert!(status.starts_with("SIP/2.0 200"), "{status}");
    assert_eq!(delivered, LARGE_BODY);
    // The datagram: dropped and counted (UDP has its frame; TCP does not).
    // It is the only datagram: calls, probes and answers went over TCP.
    assert_eq!(dispatch["rx_truncated"], 1, "{dispatch}");
    assert_eq!(dispatch["messages_in"], 1, "datagrams received");
    assert_eq!(dispatch["messages_out"], 0, "datagrams sent");
    check_connections(&dispatch);
}

/// A MESSAGE of `LARGE_BODY` bytes from `from` over `transport`, to a
/// user at the test's TCP endpoint (127.0.0.1:5080).
fn large_message(from: SocketAddr, transport: &str) -> Vec<u8> {
    let body = "x".repeat(LARGE_BODY);
    format!(
        "MESSAGE sip:carol@127.0.0.1:5080;transport=tcp SIP/2.0\r\n\
Via: SIP/2.0/{transport} {from};branch=z9hG4bKlarge{transport};rport\r\n\
Max-Forwards: 70\r\nFrom: <sip:alice@127.0.0.1>;tag=large\r\nTo: <sip:carol@127.0.0.1:5080>\r\n\
Call-ID: large-{transport}@127.0.0.1\r\nCSeq: 1 MESSAGE\r\nContent-Type: text/plain\r\n\
Content-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// Read one SIP message off `stream` (bounded by its read timeout):
/// its text and its body's length.
fn read_message(stream: &mut TcpStream) -> (String, usize) {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).to_string();
            let length = head
                .lines()
                .find_map(|l| {
                    let (name, value) = l.split_once(':')?;
                    let name = name.trim().to_ascii_lowercase();
                    (name == "content-length" || name == "l").then(|| value.trim().parse().ok())?
                })
                .unwrap_or(0usize);
            if buf.len() >= end + 4 + length {
                return (head, length);
            }
        }
        let n = stream.read(&mut chunk).expect("read a SIP message");
        assert!(n > 0, "connection closed mid-message");
        buf.extend_from_slice(&chunk[..n]);
    }
}

/// The large request over TCP through the dispatcher: a TCP endpoint of
/// the test on 127.0.0.1:5080 answers it 200 over the connection it came
/// in on. Returns the status line the client got and the body length the
/// endpoint got.
fn large_request_over_tcp() -> (String, usize) {
    let listener = TcpListener::bind("127.0.0.1:5080").unwrap();
    listener.set_nonblocking(true).unwrap();
    let endpoint = std::thread::spawn(move || {
        let end = Instant::now() + Duration::from_secs(10);
        let mut stream = loop {
            match listener.accept() {
                Ok((stream, _)) => break stream,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    assert!(Instant::now() < end, "no proxy connected");
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(e) => panic!("accept: {e}"),
            }
        };
        stream.set_nonblocking(false).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let (head, length) = read_message(&mut stream);
        // Its Vias, From, To, Call-ID and CSeq, as a UAS answers.
        let copied: String = head
            .lines()
            .filter(|l| {
                let name = l
                    .split(':')
                    .next()
                    .unwrap_or("")
                    .trim()
                    .to_ascii_lowercase();
                ["via", "v", "from", "f", "call-id", "i", "cseq"].contains(&name.as_str())
            })
            .map(|l| format!("{l}\r\n"))
            .collect();
        let reply = format!(
            "SIP/2.0 200 OK\r\n{copied}To: <sip:carol@127.0.0.1:5080>;tag=endpoint\r\nContent-Length: 0\r\n\r\n"
        );
        stream.write_all(reply.as_bytes()).unwrap();
        // The connection stays open until the client has its answer.
        (length, stream)
    });
    let mut client = TcpStream::connect("127.0.0.1:5060").unwrap();
    client
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let from = client.local_addr().unwrap();
    client.write_all(&large_message(from, "TCP")).unwrap();
    let (head, _) = read_message(&mut client);
    let status = head.lines().next().unwrap_or("").to_string();
    let (length, _stream) = endpoint.join().expect("the endpoint got the request");
    (status, length)
}

/// SIPp UAC → stunnel → TLS → dispatcher → TLS → two proxies → TCP →
/// SIPp UAS.
#[test]
fn sipp_through_stunnel_over_tls_through_the_dispatcher_to_two_proxies_over_tls() {
    let (dispatch, members, stats) = in_bed(|procs, dir| {
        make_certs_for_ips(dir, &["127.0.0.1", PROXIES[0], PROXIES[1]]);
        let members = [
            start_member(procs, dir, PROXIES[0], "stateful", true, &[]),
            start_member(procs, dir, PROXIES[1], "stateless", true, &[]),
        ];
        let mut args = strings(&[
            "--listen",
            "127.0.0.1:5060",
            "--listen",
            "tls:127.0.0.1:5061",
            "--proxy",
            "tls:127.0.0.11:5061",
            "--proxy",
            "tls:127.0.0.12:5061",
            "--probe-interval-ms",
            "100",
        ]);
        args.extend(cert_args(dir, true));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let d = start_dispatcher(procs, dir, &args);
        spawn_stunnel(
            procs,
            dir,
            "stunnel-uac",
            "[uac]\nclient = yes\naccept = 127.0.0.1:6060\nconnect = 127.0.0.1:5061\n\
             CAfile = ca.pem\nverifyChain = yes\ncheckIP = 127.0.0.1\n",
        );
        let mut uas = uas_args(a("127.0.0.1:5070"));
        uas.extend(strings(&["-t", "t1"]));
        spawn_sipp(procs, dir, &uas);
        wait_listening("127.0.0.1:6060");
        wait_listening("127.0.0.1:5070");
        let mut uac = uac_args(
            a("127.0.0.1:6060"),
            a("127.0.0.1:5062"),
            "bob",
            "127.0.0.1:5070;transport=tcp",
            CALLS,
            20,
        );
        uac.extend(strings(&["-t", "t1"]));
        // SIPp speaks TCP to stunnel but writes its Via as a TLS client
        // would.
        let scenario = std::fs::read_to_string(scenarios().join("uac_rr.xml"))
            .unwrap()
            .replace("SIP/2.0/[transport]", "SIP/2.0/TLS");
        std::fs::write(dir.join("uac_tls.xml"), scenario).unwrap();
        let sf = uac.iter().position(|arg| arg == "-sf").unwrap() + 1;
        uac[sf] = dir.join("uac_tls.xml").display().to_string();
        let (st, stats) = run_sipp(procs, dir, "uac", &uac, Duration::from_secs(60));
        eprintln!("sipp: {stats:?} exit {st:?}");
        let text = std::fs::read_to_string(dir.join("stunnel-uac.log")).unwrap_or_default();
        eprintln!("--- stunnel-uac.log\n{text}");
        let dispatch = stop_proxy(procs, &d);
        let members: Vec<serde_json::Value> =
            members.iter().map(|m| stop_proxy(procs, m)).collect();
        (dispatch, members, stats)
    });
    assert_eq!(stats.failed, 0, "{stats:?}");
    assert_eq!(stats.successful, CALLS as u64, "{stats:?}");
    check_both_proxies_carried(&dispatch, &members);
    check_connections_only(&dispatch);
    // One handshake with stunnel, one with each proxy; none failed.
    assert!(
        counter(&dispatch, "tls", "handshakes") >= 3,
        "{}",
        dispatch["tls"]
    );
    assert_eq!(
        counter(&dispatch, "tls", "handshake_failures"),
        0,
        "{}",
        dispatch["tls"]
    );
    for member in &members {
        assert!(
            counter(member, "tls", "handshakes") >= 1,
            "{}",
            member["tls"]
        );
    }
}

/// A REGISTER of alice@ringway.test from the UDP UA on 127.0.0.1:5070.
fn register_alice(n: u32) -> String {
    format!(
        "REGISTER sip:ringway.test SIP/2.0\r\n\
Via: SIP/2.0/UDP 127.0.0.1:5070;branch=z9hG4bKreg{n};rport\r\nMax-Forwards: 70\r\n\
From: <sip:alice@ringway.test>;tag=r{n}\r\nTo: <sip:alice@ringway.test>\r\n\
Call-ID: reg-alice\r\nCSeq: {n} REGISTER\r\nSupported: path\r\n\
Contact: <sip:alice@127.0.0.1:5070>\r\nExpires: 600\r\nContent-Length: 0\r\n\r\n"
    )
}

/// Datagrams on `socket` until one starts with `prefix` (bounded).
fn receive_starting(socket: &UdpSocket, prefix: &str, limit: Duration) -> Option<String> {
    receive_matching(socket, limit, |text| text.starts_with(prefix))
}

/// RFC 5923: a user registered through the dispatcher (Path) is called at
/// its proxy; the proxy's INVITE to the dispatcher takes the connection
/// the dispatcher opened (its Via `alias`): the dispatcher accepts no
/// connection and the proxy opens none.
#[test]
fn a_proxy_reaches_the_dispatcher_over_the_dispatchers_own_connection() {
    let (dispatch, member, invite) = in_bed(|procs, dir| {
        let registrar = ["--registrar", "--domain", "ringway.test"];
        let member = start_member(procs, dir, PROXIES[0], "stateless", false, &registrar);
        let d = start_tcp_dispatcher(
            procs,
            dir,
            &["--proxy", "tcp:127.0.0.11:5060", "--relay", "127.0.0.0/8"],
        );
        let ua = UdpSocket::bind("127.0.0.1:5070").unwrap();
        // Through the dispatcher: the binding's Path is the dispatcher's
        // TCP address.
        let end = Instant::now() + Duration::from_secs(10);
        let mut n = 1;
        loop {
            ua.send_to(register_alice(n).as_bytes(), "127.0.0.1:5060")
                .unwrap();
            match receive_starting(&ua, "SIP/2.0 ", Duration::from_secs(1)) {
                Some(line) if line.starts_with("SIP/2.0 200") => break,
                other => {
                    assert!(Instant::now() < end, "REGISTER: {other:?}");
                    n += 1;
                }
            }
        }
        let caller = UdpSocket::bind("127.0.0.1:5071").unwrap();
        let call = "INVITE sip:alice@ringway.test SIP/2.0\r\n\
Via: SIP/2.0/UDP 127.0.0.1:5071;branch=z9hG4bKcall1\r\nMax-Forwards: 70\r\n\
From: <sip:bob@127.0.0.1:5071>;tag=b1\r\nTo: <sip:alice@ringway.test>\r\n\
Call-ID: alias-call1\r\nCSeq: 1 INVITE\r\nContact: <sip:bob@127.0.0.1:5071>\r\n\
Content-Length: 0\r\n\r\n";
        caller.send_to(call.as_bytes(), "127.0.0.11:5060").unwrap();
        let invite = receive_starting(
            &ua,
            "INVITE sip:alice@127.0.0.1:5070 SIP/2.0",
            Duration::from_secs(10),
        );
        let dispatch = stop_proxy(procs, &d);
        let member = stop_proxy(procs, &member);
        (dispatch, member, invite)
    });
    let invite = invite.unwrap_or_else(|| {
        panic!(
            "the call did not reach the UA through the dispatcher: proxy {} {}, dispatcher {} {}",
            member["proxy"], member["tcp"], dispatch["dispatch"], dispatch["tcp"]
        )
    });
    assert!(invite.contains("Call-ID: alias-call1"), "{invite}");
    // The proxy took the dispatcher's alias and opened no connection; the
    // dispatcher opened one (to the proxy) and accepted none.
    assert_eq!(counter(&member, "tcp", "aliases"), 1, "{}", member["tcp"]);
    assert_eq!(counter(&member, "tcp", "connected"), 0, "{}", member["tcp"]);
    assert_eq!(
        counter(&dispatch, "tcp", "accepted"),
        0,
        "{}",
        dispatch["tcp"]
    );
    assert_eq!(
        counter(&dispatch, "tcp", "connected"),
        1,
        "{}",
        dispatch["tcp"]
    );
}
