//! Connections as flows, against small TCP and UDP peers of the test in a
//! private network namespace (only `lo`):
//!
//! - RFC 5923 `alias`: a request whose top Via says
//!   `SIP/2.0/TCP 127.0.0.1:5099;alias` makes its connection carry the
//!   requests the proxy sends to 127.0.0.1:5099 over TCP (no new
//!   connection to the peer's listener); an alias at another IP than the
//!   connection's is not taken (a new connection goes there).
//! - RFC 5626 `430 Flow Failed`: an edge proxy in front of a registrar; a
//!   UA registers over TCP through the edge (Path with the flow token),
//!   is called through it, then closes its connection: the next call gets
//!   `430` from the edge (relayed by the registrar) instead of silence.
//! - RFC 5626 7, the registrar acting on that `430`: a UA registers two
//!   flows (two connections, reg-id 1 and 2) through the edge; the newer
//!   one closes; a call to it gets `430` from the edge, the registrar
//!   removes that Path's binding and sends the call over the other flow,
//!   and the next call goes there at once.

mod sip_proxy_support;

use sip_proxy_support::*;
use std::io::{ErrorKind, Write};
use std::net::{TcpListener, TcpStream, UdpSocket};
use std::time::{Duration, Instant};

/// An OPTIONS for the proxy itself (answered 200) with this top Via.
fn options_to_proxy(via: &str, call_id: &str) -> Vec<u8> {
    format!(
        "OPTIONS sip:127.0.0.1:5060 SIP/2.0\r\nVia: {via}\r\nMax-Forwards: 70\r\n\
From: <sip:peer@127.0.0.1>;tag={call_id}\r\nTo: <sip:127.0.0.1:5060>\r\n\
Call-ID: {call_id}\r\nCSeq: 1 OPTIONS\r\nContent-Length: 0\r\n\r\n"
    )
    .into_bytes()
}

/// An OPTIONS from the UDP client on 127.0.0.1:5098 to `peer` over TCP.
fn options_to_peer(peer: &str, branch: &str) -> Vec<u8> {
    format!(
        "OPTIONS sip:peer@{peer};transport=tcp SIP/2.0\r\n\
Via: SIP/2.0/UDP 127.0.0.1:5098;branch=z9hG4bK{branch}\r\nMax-Forwards: 70\r\n\
From: <sip:client@127.0.0.1:5098>;tag={branch}\r\nTo: <sip:peer@{peer}>\r\n\
Call-ID: {branch}\r\nCSeq: 1 OPTIONS\r\nContent-Length: 0\r\n\r\n"
    )
    .into_bytes()
}

/// Accept one connection on the non-blocking `listener` within `limit`.
fn accept_within(listener: &TcpListener, limit: Duration) -> Option<TcpStream> {
    let end = Instant::now() + limit;
    loop {
        match listener.accept() {
            Ok((stream, _)) => {
                stream.set_nonblocking(false).unwrap();
                return Some(stream);
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock && Instant::now() < end => {
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(_) => return None,
        }
    }
}

#[test]
fn a_via_alias_makes_its_connection_carry_requests_to_that_sent_by() {
    let long = Duration::from_secs(10);
    let (s, ()) = with_loopback_proxy(&["--listen", "tcp:127.0.0.1:5060"], move |_, _| {
        // The peer's listening side: where requests to 127.0.0.1:5099
        // would go without the alias (and to 127.0.0.2:5099 in any case).
        let listener = TcpListener::bind("127.0.0.1:5099").unwrap();
        listener.set_nonblocking(true).unwrap();
        let other = TcpListener::bind("127.0.0.2:5099").unwrap();
        other.set_nonblocking(true).unwrap();
        // The peer's connection to the proxy, with an alias at its own IP.
        let mut peer = TcpStream::connect("127.0.0.1:5060").unwrap();
        peer.write_all(&options_to_proxy(
            "SIP/2.0/TCP 127.0.0.1:5099;branch=z9hG4bKal1;alias",
            "al1",
        ))
        .unwrap();
        let mut seen = String::new();
        assert!(
            read_until(&mut peer, &mut seen, "SIP/2.0 200 OK", long),
            "{seen}"
        );
        // Another connection from 127.0.0.1 claiming 127.0.0.2:5099: not
        // taken (an alias never redirects traffic meant for another host).
        let mut liar = TcpStream::connect("127.0.0.1:5060").unwrap();
        liar.write_all(&options_to_proxy(
            "SIP/2.0/TCP 127.0.0.2:5099;branch=z9hG4bKal2;alias",
            "al2",
        ))
        .unwrap();
        let mut liar_seen = String::new();
        assert!(
            read_until(&mut liar, &mut liar_seen, "SIP/2.0 200 OK", long),
            "{liar_seen}"
        );
        // A request over UDP to the alias goes over the peer's connection.
        let udp = UdpSocket::bind("127.0.0.1:5098").unwrap();
        udp.send_to(&options_to_peer("127.0.0.1:5099", "to1"), "127.0.0.1:5060")
            .unwrap();
        assert!(
            read_until(
                &mut peer,
                &mut seen,
                "OPTIONS sip:peer@127.0.0.1:5099;transport=tcp SIP/2.0",
                long
            ),
            "not over the aliased connection: {seen}"
        );
        assert!(
            accept_within(&listener, Duration::from_millis(300)).is_none(),
            "a new connection was opened to the alias"
        );
        // The other address: a connection of its own, and not the liar's.
        udp.send_to(&options_to_peer("127.0.0.2:5099", "to2"), "127.0.0.1:5060")
            .unwrap();
        let mut opened = accept_within(&other, long).expect("a connection to 127.0.0.2:5099");
        let mut got = String::new();
        assert!(
            read_until(
                &mut opened,
                &mut got,
                "OPTIONS sip:peer@127.0.0.2:5099;transport=tcp SIP/2.0",
                long
            ),
            "{got}"
        );
        assert!(
            !read_until(
                &mut liar,
                &mut liar_seen,
                "OPTIONS sip:peer@",
                Duration::from_millis(300)
            ),
            "{liar_seen}"
        );
    });
    eprintln!("tcp: {}", s["tcp"]);
    assert_eq!(s["tcp"]["aliases"], 1, "{}", s["tcp"]);
    assert_eq!(
        s["tcp"]["by_transport"]["tcp"]["aliases"], 1,
        "{}",
        s["tcp"]
    );
    // Only the connection to 127.0.0.2:5099 was opened by the proxy.
    assert_eq!(s["tcp"]["connected"], 1, "{}", s["tcp"]);
}

#[test]
fn a_call_over_a_flow_whose_connection_closed_gets_430_flow_failed() {
    let (answer, edge) = in_bed(|procs, dir| {
        let (registrar, edge) = registrar_behind_edge(procs, dir, "tcp:127.0.0.1:5060", &[], &[]);
        let long = Duration::from_secs(10);
        let mut ua = TcpStream::connect("127.0.0.1:5060").unwrap();
        ua.write_all(REGISTER.as_bytes()).unwrap();
        let mut seen = String::new();
        assert!(
            read_until(&mut ua, &mut seen, "SIP/2.0 200 OK", long),
            "{seen}"
        );
        // Called through the edge's Path: over the UA's connection.
        let caller = UdpSocket::bind("127.0.0.1:5071").unwrap();
        caller.send_to(&invite_alice(1), "127.0.0.1:5080").unwrap();
        assert!(
            read_until(
                &mut ua,
                &mut seen,
                "INVITE sip:alice@10.0.0.7:5060;transport=tcp SIP/2.0",
                long
            ),
            "{seen}"
        );
        // The UA goes; the next call finds its flow gone: 430 at once
        // (tried until the edge has seen the connection close).
        drop(ua);
        let end = Instant::now() + long;
        let mut n = 2;
        let answer = loop {
            caller.send_to(&invite_alice(n), "127.0.0.1:5080").unwrap();
            match final_response(&caller, Duration::from_secs(1)) {
                Some(line) => break Some(line),
                None if Instant::now() < end => n += 1,
                None => break None,
            }
        };
        let edge = stop_proxy(procs, &edge);
        stop_proxy(procs, &registrar);
        (answer, edge)
    });
    assert_eq!(
        answer.as_deref(),
        Some("SIP/2.0 430 Flow Failed"),
        "{answer:?}"
    );
    assert!(
        edge["proxy"]["flows_failed"].as_u64().unwrap_or(0) >= 1,
        "{}",
        edge["proxy"]
    );
}

#[test]
fn a_registrar_that_gets_430_removes_the_flows_binding_and_tries_the_next() {
    let (registrar, calls) = in_bed(|procs, dir| registrar_acting_on_430(procs, dir, &[]));
    assert_eq!(calls, [true, true], "calls 2 and 3 over flow 2");
    // One 430 (call 2): call 3 found flow 1's binding gone.
    let proxy = &registrar["proxy"];
    assert_eq!(proxy["flow_failures_received"], 1, "{proxy}");
    assert_eq!(proxy["flow_retries"], 1, "{proxy}");
    assert_eq!(proxy["bindings"], 1, "{proxy}");
}
