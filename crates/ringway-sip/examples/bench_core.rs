//! Single-thread throughput of the sans-IO core (no sockets): parse only,
//! stateless proxy (INVITE + 180 + 200 path) and stateful proxy.
//! `cargo run --release -p ringway-sip --example bench_core [iterations] [parse|stateless|stateful|all]`
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
