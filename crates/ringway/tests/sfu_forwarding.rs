//! Exact forwarding behaviour of `ringway sfu serve` over real sockets, in a
//! private network namespace, on every backend (socket, mmsg, uring).

mod sfu_common;

use ringway_sfu::client::Reply;
use ringway_sfu::wire::{ErrorCode, MsgType};
use ringway_sfu::MediaType::{Asq, Vhq, Vsq};
use sfu_common::*;
use std::time::Duration;

const QUIET: Duration = Duration::from_millis(300);

fn exact_forwarding(backend: &'static str) {
    in_netns(move || {
        let srv = Server::start(backend, &[]);
        let (mut a, mut b, mut c) = (
            Peer::new(srv.addr),
            Peer::new(srv.addr),
            Peer::new(srv.addr),
        );
        let (sa, sb, sc) = (a.register(), b.register(), c.register());
        assert!(sa.ssid != sb.ssid && sb.ssid != sc.ssid && sa.ssid != sc.ssid);
        // Re-REGISTER from the same address: same identity.
        let again = a.register_reply();
        assert_eq!(again, Reply::Ack(4, sa));
        assert!(matches!(
            a.subscribe(&format!("{}:asq", sb.ssid), false),
            Reply::Ack(..)
        ));

        let mut sent_b = Vec::new();
        for i in 0..10u16 {
            sent_b.push(b.send_rtp(sb.ssid, Asq, i));
            sent_b.push(b.send_rtp(sb.ssid, Vsq, 100 + i));
        }
        let mut sent_c = Vec::new();
        for i in 0..10u16 {
            sent_c.push(c.send_rtp(sc.ssid, Asq, i));
        }
        let got_a = a.drain(QUIET);
        let got_b = b.drain(QUIET);
        let got_c = c.drain(QUIET);
        // A: exactly B's ASQ packets, byte-identical, nothing of B's VSQ or C.
        let want_a: Vec<Vec<u8>> = sent_b
            .iter()
            .filter(|p| p[1] & 0x7f == Asq.payload_type())
            .cloned()
            .collect();
        assert_eq!(got_a, want_a);
        // B and C: exactly their own packets echoed.
        assert_eq!(got_b, sent_b);
        assert_eq!(got_c, sent_c);

        // Unsubscribe stops delivery; the echo continues.
        assert!(matches!(
            a.subscribe(&format!("{}:asq", sb.ssid), true),
            Reply::Ack(..)
        ));
        let p = b.send_rtp(sb.ssid, Asq, 50);
        assert!(a.drain(QUIET).is_empty());
        assert_eq!(b.drain(QUIET), vec![p]);

        // "all" subscription: C gets every type of A and B, never its own twice.
        assert!(matches!(c.subscribe("all", false), Reply::Ack(..)));
        let pa = a.send_rtp(sa.ssid, Vhq, 7);
        let pb = b.send_rtp(sb.ssid, Vsq, 8);
        let pc = c.send_rtp(sc.ssid, Asq, 9);
        let mut got = c.drain(QUIET);
        got.sort();
        let mut want = vec![pa.clone(), pb.clone(), pc];
        want.sort();
        assert_eq!(got, want);
        assert_eq!(a.drain(QUIET), vec![pa]);
        assert_eq!(b.drain(QUIET), vec![pb]);

        // LEAVE removes C: B's packets go nowhere but back to B.
        assert!(matches!(c.simple(MsgType::Leave), Reply::Ack(..)));
        let pb = b.send_rtp(sb.ssid, Asq, 9);
        assert!(c.drain(QUIET).is_empty());
        assert_eq!(b.drain(QUIET), vec![pb]);

        let r = srv.stop();
        let s = &r["sfu"];
        assert_eq!(r["backend"], backend);
        assert_eq!(s["media_accepted"], 20 + 10 + 1 + 3 + 1);
        assert_eq!(s["copies"], 10 + 2);
        assert_eq!(s["echoes"], 35);
        assert_eq!(s["leaves"], 1);
        assert_eq!(s["drop_malformed"], 0);
        assert_eq!(r["delay"]["count"], 35);
        // Kernel software RX stamps arrive with every datagram.
        assert_eq!(r["delay_from_kernel"]["count"], 35);
    });
}

#[test]
fn exact_forwarding_socket() {
    exact_forwarding("socket");
}

#[test]
fn exact_forwarding_mmsg() {
    exact_forwarding("mmsg");
}

fn bad_input(backend: &'static str) {
    in_netns(move || {
        let srv = Server::start(backend, &["--max-clients", "3", "--max-subs", "2"]);
        let (mut a, mut b) = (Peer::new(srv.addr), Peer::new(srv.addr));
        let (sa, sb) = (a.register(), b.register());
        assert!(matches!(a.subscribe("all", false), Reply::Ack(..)));
        let evil = Peer::new(srv.addr);

        // Spoofed source: B's SSID from another address → neither forwarded nor echoed.
        for i in 0..5 {
            evil.send_rtp(sb.ssid, Asq, i);
        }
        // A registered client using someone else's SSID.
        for i in 0..3 {
            a.send_rtp(sb.ssid, Vsq, i);
        }
        // Unregistered SSRC.
        for i in 0..4 {
            evil.send_rtp(999, Asq, i);
        }
        // Unknown payload type from a verified source.
        let mut odd = rtp(sb.ssid, Asq, 1);
        odd[1] = 0;
        b.sock.send_to(&odd, srv.addr).unwrap();
        // Malformed: garbage, truncated RTP, bad control magic, wrong length, empty.
        for junk in [
            &b"hello"[..],
            &[0x80, 96, 0, 1, 0][..],
            &[0x50, 0x58, 1, 1, 0, 0, 0, 1][..],
            &[0x50, 0x53, 1, 4, 0, 0, 0, 1, 0, 0][..],
            &[][..],
        ] {
            evil.sock.send_to(junk, srv.addr).unwrap();
        }
        assert!(a.drain(QUIET).is_empty());
        assert!(evil.drain(QUIET).is_empty());
        assert!(b.drain(QUIET).is_empty());

        // Bad token and wrong address in control.
        let mut forged = Peer::new(srv.addr);
        forged.session = Some(ringway_sfu::client::Session {
            ssid: sa.ssid,
            token: sa.token,
        });
        match forged.subscribe("all", true) {
            Reply::Error(_, Some(ErrorCode::WrongAddress), _) => {}
            r => panic!("{r:?}"),
        }
        a.session = Some(ringway_sfu::client::Session {
            ssid: sa.ssid,
            token: sa.token ^ 1,
        });
        match a.subscribe("all", true) {
            Reply::Error(_, Some(ErrorCode::BadToken), _) => {}
            r => panic!("{r:?}"),
        }
        a.session = Some(sa);
        // The subscription survived both attempts.
        let p = b.send_rtp(sb.ssid, Vhq, 3);
        assert_eq!(a.drain(QUIET), vec![p.clone()]);
        assert_eq!(b.drain(QUIET), vec![p]);

        // Tables are bounded.
        match a.subscribe("1:asq,2:asq", false) {
            Reply::Error(_, Some(ErrorCode::TooManySubs), _) => {}
            r => panic!("{r:?}"),
        }
        let _c = Peer::new(srv.addr).register();
        let mut d = Peer::new(srv.addr);
        match d.register_reply() {
            Reply::Error(_, Some(ErrorCode::TooManyClients), _) => {}
            r => panic!("{r:?}"),
        }

        let r = srv.stop();
        let s = &r["sfu"];
        assert_eq!(s["drop_unverified"], 5 + 3);
        assert_eq!(s["drop_unregistered"], 4);
        assert_eq!(s["drop_unknown_pt"], 1);
        assert_eq!(s["drop_malformed"], 5);
        assert_eq!(s["drop_bad_token"], 1);
        assert_eq!(s["drop_wrong_address"], 1);
        assert_eq!(s["rejected_subscribe"], 1);
        assert_eq!(s["rejected_register"], 1);
        assert_eq!(s["media_accepted"], 1);
        assert_eq!(s["copies"], 1);
        assert_eq!(s["echoes"], 1);
    });
}

#[test]
fn exact_forwarding_uring() {
    exact_forwarding("uring");
}

#[test]
fn bad_input_socket() {
    bad_input("socket");
}

#[test]
fn bad_input_mmsg() {
    bad_input("mmsg");
}

#[test]
fn bad_input_uring() {
    bad_input("uring");
}

/// The real server reports the four per-packet delays for every forwarded
/// packet, and `--spin-us` spins (its time reported) without changing
/// what is forwarded.
fn delays_and_spin(backend: &'static str) {
    in_netns(move || {
        let srv = Server::start(backend, &["--spin-us", "300"]);
        let (mut a, mut b) = (Peer::new(srv.addr), Peer::new(srv.addr));
        let (_sa, sb) = (a.register(), b.register());
        assert!(matches!(a.subscribe("all", false), Reply::Ack(..)));
        let mut sent = Vec::new();
        for i in 0..20u16 {
            sent.push(b.send_rtp(sb.ssid, Vsq, i));
            std::thread::sleep(Duration::from_millis(2));
        }
        assert_eq!(a.drain(QUIET), sent);
        assert_eq!(b.drain(QUIET), sent);
        let r = srv.stop();
        assert_eq!(r["flush"], "packet");
        for k in ["delay", "delay_handoff", "delay_wait", "delay_from_kernel"] {
            assert_eq!(r[k]["count"], 20, "{k}: {r}");
            assert!(r[k]["p50_us"].as_f64().unwrap() > 0.0, "{k}");
        }
        // (a) = (b) for a socket backend: the send call both schedules and hands over.
        assert_eq!(r["delay"]["p50_us"], r["delay_handoff"]["p50_us"]);
        assert!(r["spin_s"].as_f64().unwrap() > 0.0, "{r}");
    });
}

#[test]
fn delays_and_spin_socket() {
    delays_and_spin("socket");
}

#[test]
fn delays_and_spin_mmsg() {
    delays_and_spin("mmsg");
}

#[test]
fn idle_client_times_out() {
    in_netns(|| {
        let srv = Server::start("mmsg", &["--idle-timeout", "1"]);
        let (mut a, mut b) = (Peer::new(srv.addr), Peer::new(srv.addr));
        let (_sa, sb) = (a.register(), b.register());
        assert!(matches!(a.subscribe("all", false), Reply::Ack(..)));
        let p = b.send_rtp(sb.ssid, Asq, 1);
        assert_eq!(a.drain(QUIET), vec![p]);
        b.drain(QUIET);
        // A goes silent; B keeps itself alive with keepalives.
        for _ in 0..12 {
            assert!(matches!(b.simple(MsgType::Keepalive), Reply::Ack(..)));
            std::thread::sleep(Duration::from_millis(200));
        }
        let p = b.send_rtp(sb.ssid, Asq, 2);
        assert_eq!(b.drain(QUIET), vec![p]);
        assert!(a.drain(QUIET).is_empty());
        match a.simple(MsgType::Keepalive) {
            Reply::Error(_, Some(ErrorCode::UnknownSsid), _) => {}
            r => panic!("{r:?}"),
        }
        let r = srv.stop();
        assert_eq!(r["sfu"]["timeouts"], 1);
        assert_eq!(r["sfu"]["clients"], 1);
    });
}

/// A subscriber that vanishes (its port closed: ICMP port unreachable comes
/// back) does not disturb forwarding to the others.
#[test]
fn vanished_subscriber_is_harmless() {
    for backend in ["socket", "mmsg", "uring"] {
        in_netns(move || {
            let srv = Server::start(backend, &[]);
            let (mut a, mut b, mut c) = (
                Peer::new(srv.addr),
                Peer::new(srv.addr),
                Peer::new(srv.addr),
            );
            let sb = b.register();
            a.register();
            c.register();
            assert!(matches!(a.subscribe("all", false), Reply::Ack(..)));
            assert!(matches!(c.subscribe("all", false), Reply::Ack(..)));
            drop(a);
            let mut sent = Vec::new();
            for i in 0..20 {
                sent.push(b.send_rtp(sb.ssid, Asq, i));
                std::thread::sleep(Duration::from_millis(2));
            }
            assert_eq!(c.drain(QUIET), sent);
            assert_eq!(b.drain(QUIET), sent);
            let r = srv.stop();
            assert_eq!(r["sfu"]["copies"], 40);
        });
    }
}

/// `--srpic`: every datagram goes through the sorter; forwarding stays exact.
#[test]
fn srpic_option_keeps_forwarding_exact() {
    in_netns(|| {
        let srv = Server::start("mmsg", &["--srpic", "--srpic-block", "8"]);
        let (mut a, mut b) = (Peer::new(srv.addr), Peer::new(srv.addr));
        a.register();
        let sb = b.register();
        assert!(matches!(a.subscribe("all", false), Reply::Ack(..)));
        let mut sent = Vec::new();
        for i in 0..30u16 {
            sent.push(b.send_rtp(sb.ssid, Vsq, i));
        }
        let got = a.drain(QUIET);
        assert_eq!(got.len(), 30);
        // Sent in order: still in order (the sorter never reorders a sorted stream).
        assert_eq!(got, sent);
        assert_eq!(b.drain(QUIET), sent);
        let r = srv.stop();
        let rx = r["sfu"]["rx_datagrams"].as_u64().unwrap();
        assert_eq!(r["srpic"]["packets"].as_u64().unwrap(), rx);
        assert_eq!(r["sfu"]["copies"], 30);
    });
}
