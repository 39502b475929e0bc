//! The SFU on the AF_XDP backend over interfaces with two receive queues
//! (veth pairs made with `numrxqueues 2 numtxqueues 2`): one AF_XDP socket
//! and one engine per queue, and a control thread that owns the core,
//! publishes the routes and reads the engines' next hops.
//!
//! * On one link, over IPv4 and over IPv6: sixteen clients on sockets of
//!   their own (the sender's flow hash picks the veth queue, as RSS does
//!   on a NIC), each subscribed to all: every packet reaches every other
//!   client exactly once, byte for byte, and comes back to its sender;
//!   both engines carried media; nothing took the kernel path; `/metrics`
//!   shows each queue's share and the sums.
//! * Behind a router host whose MAC changes while the clients stream: the
//!   engines' copies follow the kernel's new neighbour entry within the
//!   refresh period (delivery resumes, still through the TX rings).

use ringway_io::netns::{Host, Topology};
use ringway_io::{open_udp, Io, SocketConfig, XdpInterface};
use ringway_server::sfu::{SfuServer, SfuServerConfig};
use ringway_sfu::client::{parse_reply, Reply, Requests, Session};
use ringway_sfu::wire::{write_rtp, RtpHeader};
use ringway_sfu::{MediaType, RtpPacket, Selector};
use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::process::Command;
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

/// `count` client sockets on `local` (4 MiB receive buffers, 20 ms read
/// timeout), each joined to `server` and subscribed to all; their SSIDs.
/// Run inside the clients' host: its `eth0` sends full UDP checksums
/// (the backend verifies them; with offload a veth leaves them partial).
fn joined_clients(server: SocketAddr, local: IpAddr, count: usize) -> (Vec<UdpSocket>, Vec<u32>) {
    ringway_io::backend::disable_tx_checksum_offload("eth0").expect("checksum offload off");
    let mut config = SocketConfig::new(SocketAddr::new(local, 0));
    config.rcvbuf = Some(4 << 20);
    let socks: Vec<UdpSocket> = (0..count)
        .map(|_| {
            let (sock, _) = open_udp(&config).expect("client socket");
            sock.set_read_timeout(Some(Duration::from_millis(20)))
                .unwrap();
            sock
        })
        .collect();
    let ssids = socks.iter().map(|s| join(s, server).ssid).collect();
    (socks, ssids)
}

/// Every client's media as received by each client: (client index) →
/// the RTP datagrams it got.
fn run_clients(server: SocketAddr, local: IpAddr) -> (Vec<u32>, Vec<Vec<Vec<u8>>>) {
    let (socks, ssids) = joined_clients(server, local, CLIENTS);
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

/// Where this kernel refuses AF_XDP the tests are skipped (with the reason).
fn xdp_here() -> bool {
    if let Err(why) = ringway_io::BackendKind::Xdp.availability() {
        ringway_io::testing::skip(format!("the kernel refuses AF_XDP: {why}"));
        return false;
    }
    true
}

/// The SFU on `host`'s `eth0` at `listen`, xdp backend (one engine per
/// receive queue of that veth), for at most a minute.
fn start_sfu(host: &Host, listen: SocketAddr) -> SfuServer {
    host.run(move || {
        SfuServer::start(SfuServerConfig {
            listen,
            io: Io::Xdp(XdpInterface::new("eth0")),
            duration_s: Some(60.0),
            ..SfuServerConfig::default()
        })
    })
    .expect("enter the namespace")
    .expect("the SFU starts on the xdp backend")
}

/// Two hosts on a two-queue veth pair (over IPv6 too with `ipv6`), the
/// SFU on one, 16 clients on the other: exact copies, both engines
/// carried media, nothing took the kernel path.
fn two_engines_forward_exact_copies(ipv6: bool) {
    let mut builder = Topology::builder()
        .host("sfu")
        .host("peers")
        .link("sfu", "peers")
        .queues(2);
    if ipv6 {
        builder = builder.ipv6();
    }
    let topo = builder
        .build()
        .expect("two namespaces joined by a two-queue veth pair (needs root)");
    let sfu_host = topo.host("sfu").expect("built").clone();
    let peers = topo.host("peers").expect("built").clone();
    let (server_ip, local) = if ipv6 {
        (
            IpAddr::V6(sfu_host.addr6().expect("ipv6")),
            IpAddr::V6(peers.addr6().expect("ipv6")),
        )
    } else {
        (IpAddr::V4(sfu_host.addr()), IpAddr::V4(peers.addr()))
    };
    let listen = SocketAddr::new(server_ip, 5004);
    let server = start_sfu(&sfu_host, listen);
    assert_eq!(server.local_addr(), listen);
    let (ssids, received) = peers
        .run(move || run_clients(listen, local))
        .expect("enter the namespace");
    let total = (CLIENTS * PACKETS as usize) as u64;
    // The live counters (published every 50 ms) and /metrics: each queue's
    // share, and the totals as their sums.
    let until = Instant::now() + Duration::from_secs(10);
    while server.live().sfu.media_accepted < total && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(10));
    }
    let live = server.live();
    let metrics = ringway_server::sfu::admin::render_metrics(&live);
    assert!(
        metrics.contains(&format!("ringway_sfu_media_packets_total {total}\n")),
        "{metrics}"
    );
    assert_eq!(live.engines.len(), 2);
    for engine in &live.engines {
        let line = format!(
            "ringway_sfu_queue_media_total{{queue=\"{}\"}} {}\n",
            engine.queue, engine.counters.media
        );
        assert!(metrics.contains(&line), "{line} not in {metrics}");
    }
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
    // Control went through the control thread; no media had to. The
    // next hops were read there, for both engines.
    let control = report.control.expect("control thread counters");
    assert_eq!(control.copies, 0, "{control:?}");
    assert!(control.replies >= 3 * CLIENTS as u64, "{control:?}");
    assert!(control.next_hop_reads > 0, "{control:?}");
    // Every datagram came through an XSK: none took the kernel path.
    assert_eq!(report.io.rx_via_socket, 0, "{:?}", report.io);
    assert_eq!(report.io.rx_invalid, 0, "{:?}", report.io);
    assert_eq!(report.io.rx_bad_checksum, 0, "{:?}", report.io);
    assert!(report.io_mode.contains("2 engines"), "{}", report.io_mode);
}

#[test]
fn one_engine_per_rx_queue_forwards_exact_copies() {
    if xdp_here() {
        two_engines_forward_exact_copies(false);
    }
}

/// The same over IPv6 (unique local addresses): both engines receive
/// IPv6 media through their own XSK and send IPv6 copies (mandatory UDP
/// checksums, NDP neighbours) from their own TX rings.
#[test]
fn one_engine_per_rx_queue_forwards_exact_ipv6_copies() {
    if xdp_here() {
        two_engines_forward_exact_copies(true);
    }
}

/// Run `args` in `host` (`ip netns exec`), which must succeed.
fn run_in(host: &Host, args: &[&str]) {
    let out = host.command(args[0]).args(&args[1..]).output().unwrap();
    assert!(
        out.status.success(),
        "{args:?} in {}: {}",
        host.netns,
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The MAC of `ifname` in `host`.
fn mac_of(host: &Host, ifname: &str) -> String {
    let out = Command::new("ip")
        .args(["-n", &host.netns, "-o", "link", "show", "dev", ifname])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    text.split_whitespace()
        .skip_while(|w| *w != "link/ether")
        .nth(1)
        .unwrap_or_else(|| panic!("no MAC in {text}"))
        .to_string()
}

/// Clients streaming media in rounds, and for each client the newest
/// sequence number it has received of each source.
struct Stream {
    server: SocketAddr,
    socks: Vec<UdpSocket>,
    ssids: Vec<u32>,
    /// The next round's sequence number.
    seq: u16,
    /// Per client: source SSRC → newest sequence number received.
    newest: Vec<HashMap<u32, u16>>,
}

impl Stream {
    /// One round: every client sends packet `seq`; then whatever arrived
    /// is taken (without waiting).
    fn round(&mut self) {
        for (sock, &ssid) in self.socks.iter().zip(&self.ssids) {
            sock.send_to(&rtp(ssid, self.seq), self.server)
                .expect("send media");
        }
        self.seq += 1;
        let mut buf = [0u8; 2048];
        for (k, sock) in self.socks.iter().enumerate() {
            while let Ok((len, from)) = sock.recv_from(&mut buf) {
                if from != self.server {
                    continue;
                }
                if let Ok(packet) = RtpPacket::new_checked(&buf[..len]) {
                    let newest = self.newest[k].entry(packet.ssrc()).or_default();
                    *newest = (*newest).max(packet.seq());
                }
            }
        }
    }

    /// Every client has received a packet numbered `seq` or later from
    /// every source (the others' and its own echo).
    fn all_heard_since(&self, seq: u16) -> bool {
        self.newest.iter().all(|newest| {
            self.ssids
                .iter()
                .all(|ssid| newest.get(ssid).is_some_and(|&n| n >= seq))
        })
    }

    /// Stream (a round every 5 ms) until every client has heard every
    /// source since `seq`, at most `limit`; whether they have.
    fn until_all_heard_since(&mut self, seq: u16, limit: Duration) -> bool {
        let until = Instant::now() + limit;
        while !self.all_heard_since(seq) && Instant::now() < until {
            self.round();
            std::thread::sleep(Duration::from_millis(5));
        }
        self.all_heard_since(seq)
    }
}

/// The SFU behind a router (`sfu` —10.77.1.0/24— `router` —10.77.2.0/24—
/// `peers`, two queues on every veth): its next hop towards every client
/// is the router, whose MAC comes from the kernel's neighbour table, read
/// by the control thread for both engines. While six clients stream, the
/// router's MAC changes (and the SFU's kernel entry with it, `ip neigh
/// replace`): copies sent to the old MAC are dropped by the router, so
/// delivery to every client resumes only once the engines use the new
/// entry — within the one-second refresh (the deadline here is generous:
/// the machine may be loaded) — and the resumed copies still leave through
/// the TX rings (none through the companion socket).
#[test]
fn engines_follow_a_changed_router_mac() {
    if !xdp_here() {
        return;
    }
    let topo = Topology::builder()
        .host("sfu")
        .host("router")
        .host("peers")
        .link("sfu", "router")
        .link("router", "peers")
        .queues(2)
        .build()
        .expect("three namespaces joined by two-queue veth pairs (needs root)");
    let sfu_host = topo.host("sfu").expect("built").clone();
    let router = topo.host("router").expect("built").clone();
    let peers = topo.host("peers").expect("built").clone();
    run_in(&router, &["sysctl", "-qw", "net.ipv4.ip_forward=1"]);
    run_in(
        &sfu_host,
        &["ip", "route", "add", "10.77.2.0/24", "via", "10.77.1.2"],
    );
    run_in(
        &peers,
        &["ip", "route", "add", "10.77.1.0/24", "via", "10.77.2.1"],
    );
    let listen = SocketAddr::new(IpAddr::V4(sfu_host.addr()), 5004);
    let server = start_sfu(&sfu_host, listen);
    let local = IpAddr::V4(peers.addr());
    let (socks, ssids) = peers
        .run(move || {
            let (socks, ssids) = joined_clients(listen, local, 6);
            for sock in &socks {
                sock.set_nonblocking(true).unwrap();
            }
            (socks, ssids)
        })
        .expect("enter the namespace");
    let mut stream = Stream {
        server: listen,
        newest: vec![HashMap::new(); socks.len()],
        socks,
        ssids,
        seq: 0,
    };
    // (The client sockets were bound in the peers' namespace; sending and
    // receiving on them works from any thread.)
    assert!(
        stream.until_all_heard_since(0, Duration::from_secs(15)),
        "no delivery through the router before the change: {:?}",
        stream.newest
    );
    // Until no copy goes through the socket any more (next hops resolved)
    // over four publications of the live counters (every 50 ms; they lag
    // by up to two): what went that way before is counted before the
    // change.
    let until = Instant::now() + Duration::from_secs(15);
    let before = loop {
        let (io, ticks) = (server.live().io, server.live().ticks);
        while server.live().ticks < ticks + 4 && Instant::now() < until {
            stream.round();
            std::thread::sleep(Duration::from_millis(5));
        }
        let now = server.live().io;
        if now.tx_via_socket == io.tx_via_socket || Instant::now() >= until {
            break now;
        }
    };

    let old_mac = mac_of(&router, "eth0");
    let new_mac = "02:00:00:00:23:0e";
    assert_ne!(old_mac, new_mac);
    run_in(
        &router,
        &["ip", "link", "set", "dev", "eth0", "address", new_mac],
    );
    run_in(
        &sfu_host,
        &[
            "ip",
            "neigh",
            "replace",
            "10.77.1.2",
            "lladdr",
            new_mac,
            "dev",
            "eth0",
            "nud",
            "permanent",
        ],
    );
    let changed_at = Instant::now();
    let seq = stream.seq;
    let resumed = stream.until_all_heard_since(seq, Duration::from_secs(20));
    eprintln!(
        "router MAC {old_mac} -> {new_mac}: delivery resumed after {:?} (not a pass/fail measure)",
        changed_at.elapsed()
    );
    assert!(
        resumed,
        "delivery did not resume after the router's MAC changed: newest per client {:?} \
         (the change was at sequence {seq})",
        stream.newest
    );
    let seq = stream.seq;
    assert!(stream.until_all_heard_since(seq, Duration::from_secs(10)));
    drop(stream);
    let report = server.shutdown().expect("report");
    eprintln!("io: {:?}", report.io);
    eprintln!("control: {:?}", report.control);
    // The resumed copies went through the TX rings with the new MAC: none
    // fell back to the companion socket after the change.
    assert_eq!(
        report.io.tx_via_socket, before.tx_via_socket,
        "copies through the socket after the change: {:?} before {before:?}",
        report.io
    );
    assert!(report.io.tx_packets > before.tx_packets);
    // Read by the control thread: the first table, and the changed one.
    let control = report.control.expect("control thread counters");
    assert!(control.next_hop_tables >= 2, "{control:?}");
    assert_eq!(report.engines.len(), 2);
}
