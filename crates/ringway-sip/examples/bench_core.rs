//! Single-thread throughput of the sans-IO core (no sockets): parse only,
//! stateless proxy (INVITE + 180 + 200 path) and stateful proxy, and whole
//! Record-Routed calls (INVITE, 180, 200, ACK, BYE, 200: `call-stateless`,
//! `call-stateful`; the ACK and BYE carry the Route the proxy recorded).
//! `cargo run --release -p ringway-sip --example bench_core [iterations] [parse|stateless|stateful|call-stateless|call-stateful|all]`
//! Wall-clock numbers; on a shared machine run it under `perf stat -e
//! task-clock` per phase to get CPU time instead.

use ringway_sip::{Mode, Proxy, ProxyConfig, SipMsg};
use std::net::SocketAddr;
use std::time::Instant;

fn main() {
    let n: u64 = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(1_000_000);
    let phase = std::env::args().nth(2).unwrap_or_else(|| "all".into());
    let uac: SocketAddr = "192.0.2.1:5060".parse().unwrap();
    let uas: SocketAddr = "192.0.2.2:5060".parse().unwrap();
    let invite = |i: u64| {
        format!(
            "INVITE sip:service@192.0.2.10:5060 SIP/2.0\r\n\
Via: SIP/2.0/UDP 192.0.2.1:5060;branch=z9hG4bK-{i}-1-0\r\n\
From: sipp <sip:sipp@192.0.2.1:5060>;tag={i}SIPpTag001\r\n\
To: service <sip:service@192.0.2.10:5060>\r\n\
Call-ID: {i}-1@192.0.2.1\r\n\
CSeq: 1 INVITE\r\n\
Contact: sip:sipp@192.0.2.1:5060\r\n\
Max-Forwards: 70\r\n\
Subject: Performance Test\r\n\
Content-Type: application/sdp\r\n\
Content-Length: 129\r\n\r\n\
v=0\r\no=user1 53655765 2353687637 IN IP4 192.0.2.1\r\ns=-\r\nc=IN IP4 192.0.2.1\r\nt=0 0\r\nm=audio 6000 RTP/AVP 0\r\na=rtpmap:0 PCMU/8000\r\n"
        )
        .into_bytes()
    };
    let msgs: Vec<Vec<u8>> = (0..1024).map(invite).collect();

    // Parse only.
    if phase == "parse" || phase == "all" {
        let t = Instant::now();
        let mut ok = 0u64;
        for i in 0..n {
            if SipMsg::parse(&msgs[(i % 1024) as usize]).is_ok() {
                ok += 1;
            }
        }
        let dt = t.elapsed().as_secs_f64();
        println!(
            "parse INVITE ({} B): {:.0} ns/msg, {:.2} Mmsg/s (ok {ok})",
            msgs[0].len(),
            dt * 1e9 / n as f64,
            n as f64 / dt / 1e6
        );
    }

    for mode in [Mode::Stateless, Mode::Stateful] {
        let name = if mode == Mode::Stateless {
            "call-stateless"
        } else {
            "call-stateful"
        };
        if phase == name || phase == "all" {
            calls(mode, n / 6);
        }
    }

    for mode in [Mode::Stateless, Mode::Stateful] {
        let name = if mode == Mode::Stateless {
            "stateless"
        } else {
            "stateful"
        };
        if phase != name && phase != "all" {
            continue;
        }
        let p = Proxy::new(ProxyConfig {
            mode,
            local: "192.0.2.10:5060".parse().unwrap(),
            route_to: Some(uas),
            registrar: false,
            record_route: true,
            max_transactions: 1 << 20,
            domains: vec![],
            ..ProxyConfig::default()
        });
        // One worker, held for the whole run, as an I/O thread would.
        let mut worker = p.worker();
        // Forwarded INVITEs, and the UAS's 200 built from one of them.
        let mut fwd = Vec::new();
        worker.handle(0, uac, &msgs[0], &mut |a, b| {
            if a == uas {
                fwd = b.to_vec()
            }
        });
        let m = SipMsg::parse(&fwd).unwrap();
        let mut resp = String::from("SIP/2.0 200 OK\r\n");
        for (name, v) in m.headers() {
            if ["Via", "From", "Call-ID", "CSeq", "Record-Route"].contains(&name) {
                resp.push_str(&format!("{name}: {v}\r\n"));
            } else if name == "To" {
                resp.push_str(&format!("{name}: {v};tag=uas1\r\n"));
            }
        }
        resp.push_str("Contact: <sip:service@192.0.2.2:5060>\r\nContent-Length: 0\r\n\r\n");
        let resp = resp.into_bytes();

        let mut bytes = 0usize;
        let t = Instant::now();
        for i in 0..n {
            let msg = &msgs[(i % 1024) as usize];
            worker.handle(i, uac, msg, &mut |_, b| bytes += b.len());
            if mode == Mode::Stateful && i % 1024 == 1023 {
                // keep the table bounded: let everything time out
                worker.on_timer(i + 1_000_000_000_000, &mut |_, _| {});
                worker.on_timer(i + 2_000_000_000_000, &mut |_, _| {});
            }
        }
        let dt = t.elapsed().as_secs_f64();
        println!(
            "{mode:?} INVITE: {:.0} ns/msg, {:.2} Mmsg/s",
            dt * 1e9 / n as f64,
            n as f64 / dt / 1e6
        );
        let t = Instant::now();
        for i in 0..n {
            worker.handle(i, uas, &resp, &mut |_, b| bytes += b.len());
        }
        let dt = t.elapsed().as_secs_f64();
        println!(
            "{mode:?} 200 OK response: {:.0} ns/msg, {:.2} Mmsg/s (out {bytes} B)",
            dt * 1e9 / n as f64,
            n as f64 / dt / 1e6
        );
    }
}

/// `n` whole calls through a proxy in `mode`: the messages of 1024 calls are
/// built once by a twin proxy (same configuration, so the same branches and
/// Record-Route), then replayed.
fn calls(mode: Mode, n: u64) {
    let uac: SocketAddr = "192.0.2.1:5060".parse().unwrap();
    let uas: SocketAddr = "192.0.2.2:5060".parse().unwrap();
    let config = || ProxyConfig {
        mode,
        local: "192.0.2.10:5060".parse().unwrap(),
        route_to: Some(uas),
        record_route: true,
        max_transactions: 1 << 20,
        ..ProxyConfig::default()
    };
    let header = |msg: &SipMsg<'_>, names: &[&str]| -> String {
        msg.headers()
            .filter(|(name, _)| names.contains(name))
            .map(|(name, value)| format!("{name}: {value}\r\n"))
            .collect()
    };
    let twin = Proxy::new(config());
    let mut twin_worker = twin.worker();
    let mut flows: Vec<[(SocketAddr, Vec<u8>); 6]> = Vec::new();
    for i in 0..1024u64 {
        let invite = format!(
            "INVITE sip:service@192.0.2.10:5060 SIP/2.0\r\n\
Via: SIP/2.0/UDP 192.0.2.1:5060;branch=z9hG4bK-c{i}-1;rport\r\n\
From: sipp <sip:sipp@192.0.2.1:5060>;tag={i}SIPpTag001\r\n\
To: service <sip:service@192.0.2.10:5060>\r\nCall-ID: c{i}-1@192.0.2.1\r\n\
CSeq: 1 INVITE\r\nContact: sip:sipp@192.0.2.1:5060\r\nMax-Forwards: 70\r\n\
Content-Type: application/sdp\r\nContent-Length: 129\r\n\r\n\
v=0\r\no=user1 53655765 2353687637 IN IP4 192.0.2.1\r\ns=-\r\nc=IN IP4 192.0.2.1\r\nt=0 0\r\nm=audio 6000 RTP/AVP 0\r\na=rtpmap:0 PCMU/8000\r\n"
        )
        .into_bytes();
        let mut forwarded = Vec::new();
        twin_worker.handle(0, uac, &invite, &mut |to, b| {
            if to == uas {
                forwarded = b.to_vec();
            }
        });
        let fwd = SipMsg::parse(&forwarded).unwrap();
        let record_route = fwd.record_routes().next().unwrap().uri.to_string();
        let common = header(&fwd, &["Via", "From", "Call-ID", "CSeq", "Record-Route"]);
        let to = format!("To: service <sip:service@192.0.2.10:5060>;tag=uas{i}\r\n");
        let response = |code: &str| {
            format!("SIP/2.0 {code}\r\n{common}{to}Contact: <sip:service@192.0.2.2:5060>\r\nContent-Length: 0\r\n\r\n")
                .into_bytes()
        };
        let in_dialog = |method: &str, branch: &str, cseq: u32| {
            format!(
                "{method} sip:service@192.0.2.2:5060 SIP/2.0\r\n\
Via: SIP/2.0/UDP 192.0.2.1:5060;branch=z9hG4bK-c{i}-{branch};rport\r\nRoute: <{record_route}>\r\n\
From: sipp <sip:sipp@192.0.2.1:5060>;tag={i}SIPpTag001\r\n{to}Call-ID: c{i}-1@192.0.2.1\r\n\
CSeq: {cseq} {method}\r\nMax-Forwards: 70\r\nContent-Length: 0\r\n\r\n"
            )
            .into_bytes()
        };
        let bye = in_dialog("BYE", "3", 2);
        let mut bye_forwarded = Vec::new();
        twin_worker.handle(0, uac, &bye, &mut |to, b| {
            if to == uas {
                bye_forwarded = b.to_vec();
            }
        });
        let bye_fwd = SipMsg::parse(&bye_forwarded).expect("the BYE is forwarded");
        let bye_ok = format!(
            "SIP/2.0 200 OK\r\n{}{to}Content-Length: 0\r\n\r\n",
            header(&bye_fwd, &["Via", "From", "Call-ID", "CSeq"])
        )
        .into_bytes();
        flows.push([
            (uac, invite),
            (uas, response("180 Ringing")),
            (uas, response("200 OK")),
            (uac, in_dialog("ACK", "2", 1)),
            (uac, bye),
            (uas, bye_ok),
        ]);
    }
    let p = Proxy::new(config());
    let mut worker = p.worker();
    let mut bytes = 0usize;
    let t = Instant::now();
    for i in 0..n {
        for (src, msg) in &flows[(i % 1024) as usize] {
            worker.handle(i, *src, msg, &mut |_, b| bytes += b.len());
        }
        if mode == Mode::Stateful && i % 1024 == 1023 {
            worker.on_timer(i + 1_000_000_000_000, &mut |_, _| {});
            worker.on_timer(i + 2_000_000_000_000, &mut |_, _| {});
        }
    }
    let dt = t.elapsed().as_secs_f64();
    let stats = p.stats();
    println!(
        "{mode:?} call (6 messages): {:.0} ns/call wall, forwarded {} requests {} responses, out {bytes} B",
        dt * 1e9 / n as f64,
        stats.requests_forwarded,
        stats.responses_forwarded
    );
}
