//! The SFU on the AF_XDP backend over an interface with two receive queues
//! (a veth pair made with `numrxqueues 2 numtxqueues 2`): one AF_XDP socket
//! and one engine per queue, and a control thread that owns the core and
//! publishes the routes. Sixteen clients on sockets of their own (the
//! sender's flow hash picks the veth queue, as RSS does on a NIC), each
//! subscribed to all: every packet reaches every other client exactly
//! once, byte for byte, and comes back to its sender; both engines carried
//! media; nothing took the kernel path.

use ringway_io::netns::Topology;
use ringway_io::{open_udp, Io, SocketConfig, XdpInterface};
use ringway_server::sfu::{SfuServer, SfuServerConfig};
use ringway_sfu::client::{parse_reply, Reply, Requests, Session};
use ringway_sfu::wire::{write_rtp, RtpHeader};
use ringway_sfu::{MediaType, RtpPacket, Selector};
use std::collections::HashMap;
use std::net::{SocketAddr, UdpSocket};
use std::time::{Duration, Instant};

/// Clients: with 16 flows the chance that the hash puts all of them on one
/// of two queues is 2 × 2⁻¹⁶.
const CLIENTS: usize = 16;
/// Media packets per client.
const PACKETS: u16 = 20;

/// RTP packet `seq` of `ssrc` (audio), 60 bytes of payload.
fn rtp(ssrc: u32, seq: u16) -> Vec<u8> {
    let mut buf = vec![0u8; 200];
    let header = RtpHeader {
        payload_type: MediaType::Asq.payload_type(),
        marker: false,
        seq,
        timestamp: u32::from(seq) * 160,
        ssrc,
    };
    let len = write_rtp(&mut buf, &header, None, 60).expect("fits");
    buf.truncate(len);
    buf
}

/// Send `msg` and wait (bounded) for the reply to request `id`.
fn request(sock: &UdpSocket, server: SocketAddr, id: u32, msg: &[u8]) -> Reply {
    let mut buf = [0u8; 2048];
    let until = Instant::now() + Duration::from_secs(10);
    let mut next_send = Instant::now();
    while Instant::now() < until {
        if Instant::now() >= next_send {
            // Control is retried as the client does (a reply may be lost).
            sock.send_to(msg, server).expect("send");
            next_send = Instant::now() + Duration::from_millis(500);
        }
        if let Ok((len, from)) = sock.recv_from(&mut buf) {
            let reply = parse_reply(&buf[..len]).filter(|_| from == server);
            let Some(reply) = reply else { continue };
            let rid = match reply {
                Reply::Ack(rid, _) | Reply::Error(rid, _, _) | Reply::Challenge(rid, _) => rid,
            };
            if rid == id {
                return reply;
            }
        }
    }
    panic!("no reply to request {id} from {server}")
}

/// Register (cookie exchange) and subscribe to all.
fn join(sock: &UdpSocket, server: SocketAddr) -> Session {
    let mut reqs = Requests::default();
    let (id, msg) = reqs.register();
    let Reply::Challenge(_, cookie) = request(sock, server, id, &msg) else {
        panic!("a first REGISTER earns a CHALLENGE")
    };
    let (id, msg) = reqs.register_with(&cookie);
    let Reply::Ack(_, session) = request(sock, server, id, &msg) else {
        panic!("REGISTER refused")
    };
    let (id, msg) = reqs.subscribe(session, &[Selector::ALL], false);
    assert!(matches!(request(sock, server, id, &msg), Reply::Ack(..)));
    session
}

/// Every client's media as received by each client: (client index) →
/// the RTP datagrams it got.
fn run_clients(server: SocketAddr, local: std::net::Ipv4Addr) -> (Vec<u32>, Vec<Vec<Vec<u8>>>) {
    ringway_io::backend::disable_tx_checksum_offload("eth0").expect("checksum offload off");
    let mut config = SocketConfig::new(SocketAddr::from((local, 0)));
    config.rcvbuf = Some(4 << 20);
    let socks: Vec<UdpSocket> = (0..CLIENTS)
        .map(|_| {
            let (sock, _) = open_udp(&config).expect("client socket");
            sock.set_read_timeout(Some(Duration::from_millis(20)))
                .unwrap();
            sock
        })
        .collect();
    let ssids: Vec<u32> = socks.iter().map(|s| join(s, server).ssid).collect();
    for seq in 0..PACKETS {
        for (sock, &ssid) in socks.iter().zip(&ssids) {
            sock.send_to(&rtp(ssid, seq), server).expect("send media");
        }
        // Paced: a round of 16 packets every millisecond.
        std::thread::sleep(Duration::from_millis(1));
    }
    let want = CLIENTS * PACKETS as usize; // the others' and the echoes
    let until = Instant::now() + Duration::from_secs(10);
    let mut received = vec![Vec::new(); CLIENTS];
    let mut buf = [0u8; 2048];
    for (k, sock) in socks.iter().enumerate() {
        while received[k].len() < want && Instant::now() < until {
            if let Ok((len, from)) = sock.recv_from(&mut buf) {
                if from == server && RtpPacket::new_checked(&buf[..len]).is_ok() {
                    received[k].push(buf[..len].to_vec());
                }
            }
        }
    }
    // Anything beyond what was expected (a duplicate) shows up here.
    let quiet = Instant::now() + Duration::from_millis(200);
    while Instant::now() < quiet {
        for (k, sock) in socks.iter().enumerate() {
            if let Ok((len, from)) = sock.recv_from(&mut buf) {
                if from == server && RtpPacket::new_checked(&buf[..len]).is_ok() {
                    received[k].push(buf[..len].to_vec());
                }
            }
        }
    }
    (ssids, received)
}

#[test]
fn one_engine_per_rx_queue_forwards_exact_copies() {
    if let Err(why) = ringway_io::BackendKind::Xdp.availability() {
        ringway_io::testing::skip(format!("the kernel refuses AF_XDP: {why}"));
        return;
    }
    let topo = Topology::builder()
        .host("sfu")
        .host("peers")
        .link("sfu", "peers")
        .queues(2)
        .build()
        .expect("two namespaces joined by a two-queue veth pair (needs root)");
    let sfu_host = topo.host("sfu").expect("built").clone();
    let peers = topo.host("peers").expect("built").clone();
    let listen = SocketAddr::from((sfu_host.addr(), 5004));
    let server = sfu_host
        .run(move || {
            SfuServer::start(SfuServerConfig {
                listen,
                io: Io::Xdp(XdpInterface::new("eth0")),
                duration_s: Some(60.0),
                ..SfuServerConfig::default()
            })
        })
        .expect("enter the namespace")
        .expect("the SFU starts on the xdp backend");
    let local = peers.addr();
    let (ssids, received) = peers
        .run(move || run_clients(listen, local))
        .expect("enter the namespace");
    let report = server.shutdown().expect("report");
    eprintln!("engines: {:?}", report.engines);
    eprintln!("control: {:?}", report.control);

    // Exact copies: each client got every other client's packets and its
    // own echoes, each exactly once, byte for byte, and nothing else.
    let mut want: HashMap<Vec<u8>, usize> = HashMap::new();
    for &ssid in &ssids {
        for seq in 0..PACKETS {
            want.insert(rtp(ssid, seq), 1);
        }
    }
    for (k, got) in received.iter().enumerate() {
        let mut counts: HashMap<Vec<u8>, usize> = HashMap::new();
        for datagram in got {
            *counts.entry(datagram.clone()).or_default() += 1;
        }
        assert_eq!(
            counts,
            want,
            "client {k} (SSID {}): {} datagrams for {} expected",
            ssids[k],
            got.len(),
            want.len()
        );
    }

    // One engine per queue, both carried media, and together all of it.
    let total = (CLIENTS * PACKETS as usize) as u64;
    assert_eq!(report.engines.len(), 2, "{:?}", report.io_mode);
    for engine in &report.engines {
        assert!(
            engine.counters.media > 0,
            "queue {} carried no media: {:?}",
            engine.queue,
            report.engines
        );
        assert_eq!(engine.counters.to_control_dropped, 0);
    }
    let media: u64 = report.engines.iter().map(|e| e.counters.media).sum();
    assert_eq!(media, total, "{:?}", report.engines);
    assert_eq!(report.sfu.media_accepted, total);
    assert_eq!(report.sfu.copies, total * (CLIENTS as u64 - 1));
    assert_eq!(report.sfu.echoes, total);
    // Control went through the control thread; no media had to.
    let control = report.control.expect("control thread counters");
    assert_eq!(control.copies, 0, "{control:?}");
    assert!(control.replies >= 3 * CLIENTS as u64, "{control:?}");
    // Every datagram came through an XSK: none took the kernel path.
    assert_eq!(report.io.rx_via_socket, 0, "{:?}", report.io);
    assert_eq!(report.io.rx_invalid, 0, "{:?}", report.io);
    assert!(report.io_mode.contains("2 engines"), "{}", report.io_mode);
}
