//! RFC 3261 retransmissions of `ringway sip load`, against scripted UDP
//! peers in the test (private network namespace): Timer A (INVITE), Timer E
//! (BYE), and the built-in UAS's 200 retransmission until ACK.

use ringway_io::netns::in_private_netns;
use std::net::{SocketAddr, UdpSocket};
use std::process::Command;
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_ringway");

fn header<'a>(msg: &'a str, name: &str) -> Option<&'a str> {
    msg.split("\r\n").find(|l| {
        l.len() > name.len()
            && l[..name.len()].eq_ignore_ascii_case(name)
            && l.as_bytes()[name.len()] == b':'
    })
}

fn response(req: &str, code: &str, to_tag: bool, extra: &str) -> String {
    let mut s = format!("SIP/2.0 {code}\r\n");
    for h in ["Via", "From", "To", "Call-ID", "CSeq"] {
        let l = header(req, h).unwrap_or_else(|| panic!("{h} missing in {req}"));
        s += l;
        if h == "To" && to_tag && !l.contains("tag=") {
            s += ";tag=scripted";
        }
        s += "\r\n";
    }
    s + extra + "Content-Length: 0\r\n\r\n"
}

fn recv(sock: &UdpSocket, buf: &mut [u8]) -> Option<(String, SocketAddr)> {
    match sock.recv_from(buf) {
        Ok((n, from)) => Some((String::from_utf8_lossy(&buf[..n]).into_owned(), from)),
        Err(_) => None,
    }
}

/// A UAS that ignores the first INVITE and the first BYE it sees.
fn lossy_uas(sock: UdpSocket) -> (Vec<(Instant, String)>, u32, u32) {
    sock.set_read_timeout(Some(Duration::from_millis(100)))
        .unwrap();
    let local = sock.local_addr().unwrap();
    let mut buf = [0u8; 4096];
    let mut log = Vec::new();
    let (mut invites, mut byes) = (0u32, 0u32);
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(20) {
        let Some((m, from)) = recv(&sock, &mut buf) else {
            continue;
        };
        log.push((Instant::now(), m.clone()));
        if m.starts_with("INVITE ") {
            invites += 1;
            if invites == 1 {
                continue; // lost
            }
            let contact = format!("Contact: <sip:uas@{local}>\r\n");
            sock.send_to(response(&m, "180 Ringing", true, &contact).as_bytes(), from)
                .unwrap();
            sock.send_to(response(&m, "200 OK", true, &contact).as_bytes(), from)
                .unwrap();
        } else if m.starts_with("BYE ") {
            byes += 1;
            if byes == 1 {
                continue; // lost
            }
            sock.send_to(response(&m, "200 OK", false, "").as_bytes(), from)
                .unwrap();
            break;
        }
    }
    (log, invites, byes)
}

#[test]
fn invite_and_bye_are_retransmitted_when_lost() {
    let (s, log, invites, byes) = in_private_netns(|| {
        let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
        let uas = sock.local_addr().unwrap();
        let peer = std::thread::spawn(move || lossy_uas(sock));
        let out = Command::new("timeout")
            .args(["30", BIN, "sip", "load", "--quiet", "--json", "-", "--uas"])
            .arg(uas.to_string())
            .args([
                "--calls",
                "1",
                "--rate",
                "10",
                "--duration",
                "1",
                "--t1-ms",
                "100",
            ])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let s: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let (log, invites, byes) = peer.join().unwrap();
        (s, log, invites, byes)
    })
    .unwrap();
    assert_eq!(s["succeeded"], 1, "{s:#}");
    assert_eq!(s["failed_total"], 0);
    assert_eq!(s["retrans_invite"], 1, "{s:#}");
    assert_eq!(s["retrans_bye"], 1, "{s:#}");
    assert_eq!((invites, byes), (2, 2));
    // The retransmission is the same transaction (same branch), about T1 later.
    let inv: Vec<&(Instant, String)> = log
        .iter()
        .filter(|(_, m)| m.starts_with("INVITE"))
        .collect();
    assert_eq!(header(&inv[0].1, "Via"), header(&inv[1].1, "Via"));
    let gap = inv[1].0 - inv[0].0;
    assert!(
        gap >= Duration::from_millis(90),
        "INVITE retransmitted after {gap:?}"
    );
    // ACK for the 2xx is its own transaction: a different branch.
    let ack = log
        .iter()
        .find(|(_, m)| m.starts_with("ACK"))
        .expect("ACK sent");
    assert_ne!(header(&ack.1, "Via"), header(&inv[0].1, "Via"));
    assert!(ack.1.contains("To: <sip:service@") && ack.1.contains("tag=scripted"));
}

#[test]
fn builtin_uas_retransmits_200_until_ack() {
    let (s, got_200s, after_ack) = in_private_netns(|| {
        let port = 20000 + (std::process::id() % 20000) as u16;
        let gen = Command::new(BIN)
            .args(["sip", "load", "--quiet", "--json", "-", "--port"])
            .arg(port.to_string())
            .args(["--calls", "1", "--rate", "10", "--duration", "1", "--t1-ms", "100"])
            .args(["--hold-ms", "1500"])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(300));
        let uas: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
        let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
        sock.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
        let me = sock.local_addr().unwrap();
        let invite = format!(
            "INVITE sip:svc@{uas} SIP/2.0\r\nVia: SIP/2.0/UDP {me};branch=z9hG4bKscript1\r\nMax-Forwards: 70\r\nFrom: <sip:t@{me}>;tag=t1\r\nTo: <sip:svc@{uas}>\r\nCall-ID: scripted-call\r\nCSeq: 1 INVITE\r\nContact: <sip:t@{me}>\r\nContent-Length: 0\r\n\r\n"
        );
        sock.send_to(invite.as_bytes(), uas).unwrap();
        let mut buf = [0u8; 4096];
        let mut got_200s = 0;
        let mut to = String::new();
        let t0 = Instant::now();
        // Do not ACK for 1 s: 200s keep coming at T1, 2T1, 4T1 (100/200/400 ms).
        while t0.elapsed() < Duration::from_millis(1000) {
            if let Some((m, _)) = recv(&sock, &mut buf) {
                if m.starts_with("SIP/2.0 200") {
                    got_200s += 1;
                    to = header(&m, "To").unwrap().to_string();
                }
            }
        }
        let ack = format!(
            "ACK sip:svc@{uas} SIP/2.0\r\nVia: SIP/2.0/UDP {me};branch=z9hG4bKscript2\r\nMax-Forwards: 70\r\nFrom: <sip:t@{me}>;tag=t1\r\n{to}\r\nCall-ID: scripted-call\r\nCSeq: 1 ACK\r\nContent-Length: 0\r\n\r\n"
        );
        sock.send_to(ack.as_bytes(), uas).unwrap();
        let t1 = Instant::now();
        let mut after_ack = 0;
        while t1.elapsed() < Duration::from_millis(900) {
            if let Some((m, _)) = recv(&sock, &mut buf) {
                if m.starts_with("SIP/2.0 200") {
                    after_ack += 1;
                }
            }
        }
        let out = gen.wait_with_output().unwrap();
        let s: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        (s, got_200s, after_ack)
    })
    .unwrap();
    assert!(got_200s >= 3, "only {got_200s} 200 OK before ACK");
    assert_eq!(after_ack, 0, "200 OK still retransmitted after ACK");
    assert_eq!(s["uas_calls"], 2, "{s:#}"); // own call + scripted call
    assert!(s["retrans_200"].as_u64().unwrap() >= 2, "{s:#}");
    assert_eq!(s["uas_ack_timeouts"], 0);
    assert_eq!(s["succeeded"], 1);
}
