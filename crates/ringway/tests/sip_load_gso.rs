//! `ringway sip load --gso on`: messages of a kind have one length, so the
//! generator sends them as UDP GSO trains, and receivers still get every
//! message as its own datagram. Checked with a scripted UAS on a plain UDP
//! socket and with the built-in UAS (with and without UDP GRO, which hands
//! the UAS each train as one message), in a private network namespace.

use ringway_io::netns::in_private_netns;
use std::collections::BTreeMap;
use std::net::{SocketAddr, UdpSocket};
use std::process::Command;
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_ringway");
const CALLS: usize = 600;

fn header<'a>(msg: &'a str, name: &str) -> Option<&'a str> {
    msg.split("\r\n").find(|l| {
        l.len() > name.len()
            && l[..name.len()].eq_ignore_ascii_case(name)
            && l.as_bytes()[name.len()] == b':'
    })
}

/// Exactly one SIP message: headers, blank line, then a body of Content-Length bytes.
fn one_message(d: &str) -> bool {
    let Some(end) = d.find("\r\n\r\n") else {
        return false;
    };
    let Some(cl) = header(d, "Content-Length") else {
        return false;
    };
    let Ok(n) = cl["Content-Length:".len()..].trim().parse::<usize>() else {
        return false;
    };
    d.len() == end + 4 + n && d.matches(" SIP/2.0\r\n").count() == 1
}

fn response(req: &str, code: &str, local: SocketAddr) -> String {
    let mut s = format!("SIP/2.0 {code}\r\n");
    for h in ["Via", "From", "To", "Call-ID", "CSeq"] {
        let l = header(req, h).unwrap_or_else(|| panic!("{h} missing in {req}"));
        s += l;
        if h == "To" && !l.contains("tag=") {
            s += ";tag=scripted";
        }
        s += "\r\n";
    }
    s + &format!("Contact: <sip:uas@{local}>\r\nContent-Length: 0\r\n\r\n")
}

/// Answer INVITE (180, 200) and BYE (200) until nothing came for 2 s after
/// `done` was seen; returns the length of every request by method, and the
/// datagrams that were not exactly one SIP message.
fn scripted_uas(sock: UdpSocket, done: impl Fn() -> bool) -> (BTreeMap<String, Vec<usize>>, u32) {
    sock.set_read_timeout(Some(Duration::from_millis(100)))
        .unwrap();
    let local = sock.local_addr().unwrap();
    let mut lens: BTreeMap<String, Vec<usize>> = BTreeMap::new();
    let mut bad = 0;
    let mut buf = vec![0u8; 65536];
    let mut last = Instant::now();
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(60) {
        let (n, from) = match sock.recv_from(&mut buf) {
            Ok(x) => x,
            Err(_) => {
                if done() && last.elapsed() > Duration::from_secs(2) {
                    break;
                }
                continue;
            }
        };
        last = Instant::now();
        let d = String::from_utf8_lossy(&buf[..n]).into_owned();
        if !one_message(&d) {
            bad += 1;
            continue;
        }
        let method = d.split(' ').next().unwrap_or("").to_string();
        lens.entry(method.clone()).or_default().push(n);
        let replies: Vec<String> = match method.as_str() {
            "INVITE" => vec![
                response(&d, "180 Ringing", local),
                response(&d, "200 OK", local),
            ],
            "BYE" => vec![response(&d, "200 OK", local)],
            _ => vec![],
        };
        for r in replies {
            sock.send_to(r.as_bytes(), from).unwrap();
        }
    }
    (lens, bad)
}

fn summary(path: &std::path::Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

#[test]
fn scripted_uas_gets_each_message_alone_and_kinds_have_one_length() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("s.json");
    let json2 = json.clone();
    let (s, lens, bad) = in_private_netns(move || {
        let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
        let uas = sock.local_addr().unwrap();
        let mut gen = Command::new("timeout")
            .args(["60", BIN, "sip", "load", "--quiet", "--gso", "on"])
            .args(["--uas", &uas.to_string(), "--rate", "3000"])
            .args(["--calls", &CALLS.to_string(), "--duration", "10"])
            .args(["--json", json2.to_str().unwrap()])
            .spawn()
            .unwrap();
        let finished = std::sync::atomic::AtomicBool::new(false);
        let (lens, bad) = std::thread::scope(|sc| {
            let h = sc.spawn(|| {
                scripted_uas(sock, || finished.load(std::sync::atomic::Ordering::Relaxed))
            });
            let st = gen.wait().unwrap();
            assert!(st.success(), "generator exit {st:?}");
            finished.store(true, std::sync::atomic::Ordering::Relaxed);
            h.join().unwrap()
        });
        (summary(&json2), lens, bad)
    })
    .unwrap();
    assert_eq!(bad, 0, "datagrams that were not exactly one SIP message");
    assert_eq!(s["succeeded"], CALLS, "{s}");
    for m in ["INVITE", "ACK", "BYE"] {
        let l = &lens[m];
        assert!(l.len() >= CALLS, "{m}: {} received", l.len());
        // The scripted UAS's To tag and Contact are the same for every call,
        // so the generator's messages of one kind all have one length.
        assert!(l.iter().all(|&x| x == l[0]), "{m} lengths differ: {l:?}");
    }
    assert_eq!(s["gso"]["used"], true, "{s}");
    assert!(s["gso"]["trains"].as_u64().unwrap() > 0, "{s}");
    assert_eq!(s["gso"]["fallbacks"], 0, "{s}");
    // GRO is on (auto) but the scripted UAS sends datagram by datagram:
    // nothing arrives coalesced.
    assert_eq!(s["gso"]["gro_used"], true, "{s}");
    assert_eq!(s["gso"]["gro_trains"], 0, "{s}");
}

#[test]
fn builtin_uas_sees_every_datagram_with_gso() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("s.json");
    let run = |gso: &str, gro: &str| {
        let json = json.clone();
        let (gso, gro) = (gso.to_string(), gro.to_string());
        in_private_netns(move || {
            let st = Command::new("timeout")
                .args([
                    "60", BIN, "sip", "load", "--quiet", "--gso", &gso, "--gro", &gro,
                ])
                .args(["--rate", "3000", "--calls", &CALLS.to_string()])
                .args(["--duration", "10", "--json", json.to_str().unwrap()])
                .status()
                .unwrap();
            assert!(st.success(), "generator exit {st:?}");
            summary(&json)
        })
        .unwrap()
    };
    let on = run("on", "off");
    assert_eq!(on["succeeded"], CALLS, "{on}");
    // One socket plays both roles: everything it sent it received, one
    // datagram per message, and understood all of it.
    assert!(
        on["msgs_sent"].as_u64().unwrap() >= 6 * CALLS as u64,
        "{on}"
    );
    assert_eq!(on["msgs_received"], on["msgs_sent"], "{on}");
    assert_eq!(on["msgs_ignored"], 0, "{on}");
    assert_eq!(on["gso"]["used"], true, "{on}");
    let segs = on["gso"]["segments"].as_u64().unwrap();
    let trains = on["gso"]["trains"].as_u64().unwrap();
    assert!(trains > 0 && segs >= 2 * trains, "{on}");
    assert_eq!(on["gso"]["gro_used"], false, "{on}");
    assert_eq!(on["gso"]["gro_trains"], 0, "{on}");
    // With GRO the socket receives each of its own trains as one message
    // (loopback does not segment for a GRO socket) and splits it again:
    // still every datagram, each understood.
    let gro = run("on", "on");
    assert_eq!(gro["succeeded"], CALLS, "{gro}");
    assert_eq!(gro["msgs_received"], gro["msgs_sent"], "{gro}");
    assert_eq!(gro["msgs_ignored"], 0, "{gro}");
    assert_eq!(gro["gso"]["gro_used"], true, "{gro}");
    assert_eq!(gro["gso"]["gro_trains"], gro["gso"]["trains"], "{gro}");
    assert_eq!(gro["gso"]["gro_segments"], gro["gso"]["segments"], "{gro}");
    let off = run("off", "auto");
    assert_eq!(off["succeeded"], CALLS, "{off}");
    assert_eq!(off["gso"]["used"], false, "{off}");
    assert_eq!(off["gso"]["trains"], 0, "{off}");
    assert_eq!(off["msgs_received"], off["msgs_sent"], "{off}");
}
