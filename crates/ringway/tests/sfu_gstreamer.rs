//! Standard RTP tools through the static room: one GStreamer pipeline sends
//! L16 audio (rtpL16pay ! udpsink), another receives it through the SFU
//! (udpsrc ! rtpjitterbuffer ! rtpL16depay ! filesink). Each address first
//! passes the room's return-routability check from the same port (a small
//! helper socket: first RTP packet → CHALLENGE → JOIN with its cookie),
//! then the GStreamer element binds that port.

mod sfu_common;

use ringway_sfu::client::{parse_reply, Reply, Requests};
use sfu_common::*;
use std::net::{SocketAddr, UdpSocket};
use std::process::{Command, Stdio};
use std::time::Duration;

/// Join the static room of `server` from a fresh local port (RTP packet,
/// CHALLENGE, JOIN with the cookie, ACK); returns the port, now free again.
fn join_room(server: SocketAddr) -> u16 {
    let s = UdpSocket::bind("127.0.0.1:0").unwrap();
    s.set_read_timeout(Some(std::time::Duration::from_secs(3)))
        .unwrap();
    let mut hello = vec![0x80u8, 96, 0, 1, 0, 0, 0, 0, 0, 0, 0, 42];
    hello.extend_from_slice(&[0; 12]); // at least as long as the CHALLENGE
    s.send_to(&hello, server).unwrap();
    let mut b = [0u8; 64];
    let (n, _) = s.recv_from(&mut b).expect("a CHALLENGE");
    let Some(Reply::Challenge(_, cookie)) = parse_reply(&b[..n]) else {
        panic!("expected a CHALLENGE")
    };
    let (_, join) = Requests::default().join(&cookie);
    s.send_to(&join, server).unwrap();
    let (n, _) = s.recv_from(&mut b).expect("an ACK");
    assert!(matches!(parse_reply(&b[..n]), Some(Reply::Ack(..))));
    s.local_addr().unwrap().port()
}

fn static_room(backend: &'static str) {
    in_netns(move || {
        let srv = Server::start(
            backend,
            &["--static-room", "--no-echo", "--idle-timeout", "30"],
        );
        let out = srv.dir.path().join("received.raw");
        // Both addresses join the room first; the ports are then handed
        // to udpsrc and udpsink (bind-port).
        let port = join_room(srv.addr);
        let tx_port = join_room(srv.addr);
        let caps = "application/x-rtp,media=audio,clock-rate=44100,encoding-name=L16,\
                    channels=1,payload=96";
        let mut rx = Command::new("gst-launch-1.0")
            .args(["-e", "-q", "udpsrc", &format!("port={port}")])
            .arg(format!("caps={caps}"))
            .args(["!", "rtpjitterbuffer", "latency=50", "!", "rtpL16depay"])
            .args(["!", "filesink"])
            .arg(format!("location={}", out.display()))
            .stdout(Stdio::null())
            .spawn()
            .expect("gst-launch-1.0 installed");
        std::thread::sleep(Duration::from_millis(700));
        // 50 buffers × 441 samples × 2 bytes = 44100 bytes of audio.
        let tx = Command::new("gst-launch-1.0")
            .args(["-q", "audiotestsrc", "is-live=true", "num-buffers=50"])
            .args(["samplesperbuffer=441", "!"])
            .arg("audio/x-raw,format=S16BE,rate=44100,channels=1")
            .args(["!", "rtpL16pay", "!", "udpsink", "host=127.0.0.1"])
            .arg(format!("port={}", srv.addr.port()))
            .arg("bind-address=127.0.0.1")
            .arg(format!("bind-port={tx_port}"))
            .status()
            .expect("gst-launch-1.0 sender");
        assert!(tx.success());
        std::thread::sleep(Duration::from_millis(500));
        // SIGINT with -e: EOS, filesink flushes, then the pipeline exits.
        let _ = Command::new("kill")
            .args(["-INT", &rx.id().to_string()])
            .status();
        let mut ok = false;
        for _ in 0..100 {
            if let Ok(Some(_)) = rx.try_wait() {
                ok = true;
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        if !ok {
            let _ = rx.kill();
            let _ = rx.wait();
        }
        let got = std::fs::metadata(&out).map(|m| m.len()).unwrap_or(0);
        let r = srv.stop();
        let s = &r["sfu"];
        // Two members, admitted through their cookies; every sender packet
        // went to the receiver exactly once.
        assert_eq!(s["room_members"], 2);
        assert_eq!(s["joins"], 2);
        assert_eq!(
            s["drop_not_admitted"], 2,
            "the two first packets only earned CHALLENGEs"
        );
        let accepted = s["media_accepted"].as_u64().unwrap();
        assert!(accepted > 1, "{r}");
        assert_eq!(s["copies"].as_u64().unwrap(), accepted);
        assert_eq!(s["echoes"], 0);
        assert_eq!(s["drop_unregistered"], 0);
        // The receiver decoded the audio that went through the SFU.
        assert!(got >= 44100 / 2, "received {got} bytes of 44100");
        assert_eq!(got % 2, 0);
    });
}

#[test]
fn gstreamer_through_static_room_socket() {
    static_room("socket");
}

#[test]
fn gstreamer_through_static_room_mmsg() {
    static_room("mmsg");
}

#[test]
fn static_room_is_closed_without_flag() {
    in_netns(|| {
        let srv = Server::start("socket", &[]);
        let a = Peer::new(srv.addr);
        let b = Peer::new(srv.addr);
        a.send_rtp(7, ringway_sfu::MediaType::Asq, 1);
        b.send_rtp(8, ringway_sfu::MediaType::Asq, 1);
        assert!(a.drain(Duration::from_millis(300)).is_empty());
        assert!(b.drain(Duration::from_millis(300)).is_empty());
        let r = srv.stop();
        assert_eq!(r["sfu"]["drop_unregistered"], 2);
        assert_eq!(r["sfu"]["room_members"], 0);
    });
}
