//! The JackTrip hub server (`HubServer`) over loopback, with peers that
//! speak JackTrip's TCP handshake and UDP header (written with
//! `ringway_sfu::jacktrip`). The real-JackTrip sessions are in the
//! `ringway` crate's `jacktrip_hub` test; this one drives what those
//! cannot time: bursts of exactly one receive batch arriving while the
//! `clocked` hub sleeps.

use ringway_server::sfu::hub::{HubServer, HubServerConfig};
use ringway_sfu::jacktrip::{encode_sample, parse, Header, HubConfig, Packet, HEADER_LEN};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream, UdpSocket};
use std::time::Duration;

/// JackTrip's hub handshake: our UDP port out, the hub's UDP port back.
fn handshake(tcp: SocketAddr, udp_port: u16) -> u16 {
    let mut s = TcpStream::connect(tcp).unwrap();
    s.write_all(&i32::from(udp_port).to_le_bytes()).unwrap();
    s.write_all(&[b'x'; 64]).unwrap();
    let mut b = [0u8; 4];
    s.read_exact(&mut b).unwrap();
    i32::from_le_bytes(b) as u16
}

/// A 16-bit mono packet of 128 frames, every sample `v`.
fn packet(seq: u16, v: f32) -> Vec<u8> {
    let mut d = vec![0u8; HEADER_LEN + 128 * 2];
    Header {
        timestamp_us: 0,
        seq,
        frames: 128,
        rate_code: 3,
        bits: 16,
        channels_in: 1,
        channels_out_field: 0,
    }
    .write(&mut d);
    for s in d[HEADER_LEN..].chunks_exact_mut(2) {
        encode_sample(v, s, 16);
    }
    d
}

/// Bursts of 32 datagrams (one receive batch: 31 from one client, 1 from
/// the other) while the
/// clocked hub sleeps between period wakes: every one is taken, the other
/// client gets them, and the hub's thread survives (a wake whose second
/// receive found the socket empty once read the first datagram's time
/// from the emptied batch and panicked).
#[test]
fn clocked_hub_takes_bursts_of_a_whole_batch() {
    let server = HubServer::start(HubServerConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        udp_port: 0,
        hub: HubConfig::default(),
        duration_s: Some(60.0),
        clocked: true,
        admin_listen: None,
        admin_token_file: None,
    })
    .unwrap();
    let a = UdpSocket::bind("127.0.0.1:0").unwrap();
    let b = UdpSocket::bind("127.0.0.1:0").unwrap();
    for s in [&a, &b] {
        let port = handshake(server.tcp_addr(), s.local_addr().unwrap().port());
        assert_eq!(port, server.udp_addr().port());
    }
    let hub = server.udp_addr();
    // Both join; then bursts of 31 from a and 1 from b.
    b.send_to(&packet(0, 0.0), hub).unwrap();
    a.send_to(&packet(0, 0.25), hub).unwrap();
    let (mut sent_a, mut seq_a, mut seq_b) = (1u64, 1u16, 1u16);
    for _ in 0..40 {
        for _ in 0..31 {
            a.send_to(&packet(seq_a, 0.25), hub).unwrap();
            seq_a += 1;
            sent_a += 1;
        }
        b.send_to(&packet(seq_b, 0.0), hub).unwrap();
        seq_b += 1;
        std::thread::sleep(Duration::from_millis(7));
    }
    b.set_read_timeout(Some(Duration::from_millis(500)))
        .unwrap();
    let mut got = 0u64;
    let mut buf = [0u8; 2048];
    let sent_audio = packet(0, 0.25);
    while let Ok((n, from)) = b.recv_from(&mut buf) {
        assert_eq!(from, hub);
        match parse(&buf[..n]) {
            Ok(Packet::Audio(h, audio)) => {
                assert_eq!((h.frames, h.bits), (128, 16));
                assert_eq!(audio, &sent_audio[HEADER_LEN..], "a's audio, forwarded");
                got += 1;
            }
            other => panic!("not audio: {other:?}"),
        }
    }
    assert!(!server.is_finished(), "the hub's UDP thread stopped");
    let report = server
        .shutdown()
        .expect("the hub's UDP thread did not panic");
    // Every datagram reached the hub unless its socket buffer overflowed
    // while the machine stalled it (loopback drops nothing else).
    let sent = sent_a + u64::from(seq_b);
    assert!(
        report.hub.rx_audio > sent / 2 && report.hub.rx_audio <= sent,
        "{report:?}"
    );
    assert!(got > 0 && got <= sent_a, "client b got {got} of {sent_a}");
}
