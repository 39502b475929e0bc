//! Standard RTP tools through the static room: one GStreamer pipeline sends
//! L16 audio (rtpL16pay ! udpsink), another receives it through the SFU
//! (udpsrc ! rtpjitterbuffer ! rtpL16depay ! filesink).

mod sfu_common;

use sfu_common::*;
use std::net::UdpSocket;
use std::process::{Command, Stdio};
use std::time::Duration;

fn static_room(backend: &'static str) {
    in_netns(move || {
        let srv = Server::start(
            backend,
            &["--static-room", "--no-echo", "--idle-timeout", "30"],
        );
        let out = srv.dir.path().join("received.raw");
        // The receiver's address joins the room by sending one RTP packet
        // from its port (latching); the port is then handed to udpsrc.
        let port = {
            let s = UdpSocket::bind("127.0.0.1:0").unwrap();
            let mut hello = vec![0x80u8, 96, 0, 1, 0, 0, 0, 0, 0, 0, 0, 42];
            hello.extend_from_slice(&[0; 4]);
            s.send_to(&hello, srv.addr).unwrap();
            s.local_addr().unwrap().port()
        };
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
        // Two members; every sender packet went to the receiver exactly once.
        assert_eq!(s["room_members"], 2);
        let accepted = s["media_accepted"].as_u64().unwrap();
        assert!(accepted > 1, "{r}");
        assert_eq!(s["copies"].as_u64().unwrap(), accepted - 1);
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
