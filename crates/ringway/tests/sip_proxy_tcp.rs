//! SIP over TCP through `ringway sip proxy`, against real peers in a
//! private network namespace (only `lo`): SIPp UAC → proxy → SIPp UAS over
//! TCP in both modes, UDP in / TCP out (transport switching with a double
//! Record-Route), sipsak over TCP, and bad input on connections (oversize
//! header, garbage, slowloris, too many connections from one address),
//! each bounded and counted by reason in the summary.

mod sip_proxy_support;

use sip_proxy_support::*;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::Command;
use std::time::Duration;

const CALLS: u32 = 30;

fn a(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

fn with_transport(args: Vec<String>, transport: &str) -> Vec<String> {
    let mut args = args;
    args.extend(["-t".to_string(), transport.to_string()]);
    args
}

/// The proxy on UDP and TCP 127.0.0.1:5060.
const UDP_AND_TCP: [&str; 4] = [
    "--listen",
    "127.0.0.1:5060",
    "--listen",
    "tcp:127.0.0.1:5060",
];

/// `CALLS` calls from a SIPp UAC (`uac_transport`: `u1` or `t1`) through
/// the proxy to a SIPp UAS over TCP on 127.0.0.1:5070, addressed by a
/// Request-URI with `transport=tcp`. Returns the proxy summary and SIPp's
/// statistics.
fn calls_over_tcp(
    mode: &'static str,
    uac_transport: &'static str,
) -> (serde_json::Value, SippStats) {
    in_bed(move |procs, dir| {
        let p = start_loopback_proxy(
            procs,
            dir,
            &["--listen", "tcp:127.0.0.1:5060", "--mode", mode],
        );
        assert!(
            p.startup.iter().any(|l| l.contains("tcp:127.0.0.1:5060")),
            "{:?}",
            p.startup
        );
        spawn_sipp(
            procs,
            dir,
            &with_transport(uas_args(a("127.0.0.1:5070")), "t1"),
        );
        std::thread::sleep(Duration::from_millis(300));
        let uac = uac_args(
            a("127.0.0.1:5060"),
            a("127.0.0.1:5061"),
            "bob",
            "127.0.0.1:5070;transport=tcp",
            CALLS,
            30,
        );
        let (st, stats) = run_sipp(
            procs,
            dir,
            "uac",
            &with_transport(uac, uac_transport),
            Duration::from_secs(60),
        );
        let summary = stop_proxy(procs, &p);
        eprintln!("sipp: {stats:?} exit {st:?}");
        (summary, stats)
    })
}

fn tcp_counter(s: &serde_json::Value, name: &str) -> u64 {
    s["tcp"][name]
        .as_u64()
        .unwrap_or_else(|| panic!("tcp.{name} in {}", s["tcp"]))
}

fn check_calls(s: &serde_json::Value, stats: &SippStats) {
    assert_eq!(stats.failed, 0, "{stats:?}");
    assert_eq!(stats.successful, CALLS as u64, "{stats:?}");
    let n = CALLS as u64;
    // INVITE, ACK and BYE reached the UAS and 200s came back: all of it
    // over connections, counted by the transport.
    assert!(tcp_counter(s, "messages_out") >= 3 * n, "{}", s["tcp"]);
    assert!(tcp_counter(s, "messages_in") >= 2 * n, "{}", s["tcp"]);
    assert!(tcp_counter(s, "bytes_in") > 0 && tcp_counter(s, "bytes_out") > 0);
    assert!(
        tcp_counter(s, "connected") >= 1,
        "the proxy opened the UAS connection"
    );
    assert_eq!(tcp_counter(s, "no_connection"), 0, "{}", s["tcp"]);
    let core = &s["proxy"];
    assert!(
        core["requests_forwarded"].as_u64().unwrap() >= 3 * n,
        "{core}"
    );
}

#[test]
fn sipp_calls_over_tcp_stateless() {
    let (s, stats) = calls_over_tcp("stateless", "t1");
    check_calls(&s, &stats);
    assert!(tcp_counter(&s, "accepted") >= 1);
}

#[test]
fn sipp_calls_over_tcp_stateful() {
    let (s, stats) = calls_over_tcp("stateful", "t1");
    check_calls(&s, &stats);
    // Nothing is retransmitted over a reliable transport.
    assert_eq!(s["proxy"]["retransmissions_sent"], 0, "{}", s["proxy"]);
}

#[test]
fn sipp_calls_udp_in_tcp_out() {
    let (s, stats) = calls_over_tcp("stateful", "u1");
    check_calls(&s, &stats);
    // The UAC spoke UDP only: no connection was accepted.
    assert_eq!(tcp_counter(&s, "accepted"), 0);
    assert!(s["messages"]["in"].as_u64().unwrap() >= 3 * CALLS as u64);
}

#[test]
fn sipsak_options_over_tcp() {
    let (s, out) = with_proxy(&UDP_AND_TCP, |_, _| {
        Command::new("sipsak")
            .args(["-vv", "-E", "tcp", "-s", "sip:127.0.0.1:5060"])
            .output()
            .expect("run sipsak (Debian package sipsak)")
    });
    let text = String::from_utf8_lossy(&out.stdout);
    eprintln!("sipsak: {text}");
    assert!(out.status.success(), "sipsak exit {:?}: {text}", out.status);
    assert!(text.contains("200 OK"), "{text}");
    assert_eq!(tcp_counter(&s, "accepted"), 1, "{}", s["tcp"]);
    assert_eq!(tcp_counter(&s, "messages_out"), 1, "{}", s["tcp"]);
}

/// Write `bytes` on a new connection to the proxy, then read until it
/// closes (bounded); what came back.
fn exchange(bytes: &[u8], wait: Duration) -> Vec<u8> {
    let mut s = TcpStream::connect("127.0.0.1:5060").expect("connect");
    s.set_read_timeout(Some(wait)).unwrap();
    let _ = s.write_all(bytes);
    let mut got = Vec::new();
    let _ = s.read_to_end(&mut got);
    got
}

#[test]
fn bad_input_on_connections_is_bounded_and_counted() {
    let mut args = UDP_AND_TCP.to_vec();
    args.extend([
        "--tcp-max-header-bytes",
        "2048",
        "--tcp-message-timeout-ms",
        "500",
        "--tcp-max-connections-per-ip",
        "8",
    ]);
    let (s, ()) = with_proxy(&args, |_, _| {
        let long = Duration::from_secs(5);
        // A header that never ends: closed at 2 KiB, whatever follows.
        let mut big = b"OPTIONS sip:127.0.0.1 SIP/2.0\r\nX: ".to_vec();
        big.extend(std::iter::repeat_n(b'x', 64 * 1024));
        exchange(&big, long);
        // Bytes that are not SIP.
        exchange(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", long);
        // A message without Content-Length.
        exchange(
            b"OPTIONS sip:127.0.0.1 SIP/2.0\r\nVia: SIP/2.0/TCP 127.0.0.1:1;branch=z9hG4bK1\r\n\r\n",
            long,
        );
        // Slowloris: a header begun and never finished.
        exchange(b"OPTIONS sip:127.0.0.1 SIP/2.0\r\nVia: SIP", long);
        // A keep-alive ping gets a pong; the connection stays open.
        let mut ping = TcpStream::connect("127.0.0.1:5060").unwrap();
        ping.set_read_timeout(Some(long)).unwrap();
        ping.write_all(b"\r\n\r\n").unwrap();
        let mut pong = [0u8; 2];
        ping.read_exact(&mut pong).expect("a pong");
        assert_eq!(&pong, b"\r\n");
        // Idle connections from one address: beyond 8, closed at once.
        let idle: Vec<TcpStream> = (0..12)
            .map(|_| TcpStream::connect("127.0.0.1:5060").unwrap())
            .collect();
        std::thread::sleep(Duration::from_millis(300));
        // A good request still gets its answer on a new connection once
        // the idle ones are gone.
        drop(idle);
        drop(ping);
        std::thread::sleep(Duration::from_millis(300));
        let answer = {
            let mut s = TcpStream::connect("127.0.0.1:5060").unwrap();
            s.set_read_timeout(Some(long)).unwrap();
            s.write_all(
                b"OPTIONS sip:127.0.0.1:5060 SIP/2.0\r\nVia: SIP/2.0/TCP 127.0.0.1:1;branch=z9hG4bKok\r\n\
From: <sip:a@127.0.0.1>;tag=1\r\nTo: <sip:127.0.0.1>\r\nCall-ID: ok\r\nCSeq: 1 OPTIONS\r\n\
Max-Forwards: 70\r\nContent-Length: 0\r\n\r\n",
            )
            .unwrap();
            let mut buf = [0u8; 512];
            let n = s.read(&mut buf).unwrap_or(0);
            String::from_utf8_lossy(&buf[..n]).into_owned()
        };
        assert!(answer.starts_with("SIP/2.0 200 OK\r\n"), "{answer}");
    });
    eprintln!("tcp: {}", s["tcp"]);
    assert_eq!(tcp_closed(&s, "header_too_large"), 1);
    assert_eq!(tcp_closed(&s, "garbage"), 1);
    assert_eq!(tcp_closed(&s, "bad_content_length"), 1);
    assert_eq!(tcp_closed(&s, "message_timeout"), 1);
    assert_eq!(tcp_counter(&s, "pings"), 1);
    // 13 connections at once (the ping's and 12 idle): 8 allowed.
    assert_eq!(tcp_counter(&s, "refused_per_ip"), 5);
    assert_eq!(tcp_counter(&s, "open"), 0);
}
