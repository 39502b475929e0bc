//! The AF_XDP backend over IPv6 (unique local addresses) on a real veth
//! pair between two namespace hosts: exact payloads and peers both ways
//! through the XSK rings (frames built with the mandatory UDP checksum,
//! the peer's MAC from the kernel's NDP entry); the kernel still gets what
//! the XDP program passes (neighbour discovery and ping over ICMPv6, other
//! ports, fragments, a hop-by-hop extension header); every UDP checksum is
//! verified on receive, and a zero one is refused (mandatory over IPv6).
//! Needs root (named namespaces, BPF, raw sockets).

mod xdp_common;

use ringway_io::netns::{Host, Topology};
use ringway_io::{open_xdp, BackendKind, IoStats, RxBatch, TxBatch, XdpConfig};
use std::net::{IpAddr, Ipv6Addr, SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;
use std::process::Command;
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Hosts a (`fd77:0:0:1::1`) and b (`fd77:0:0:1::2`) on one veth pair,
/// a's sockets sending full UDP checksums; `None` (skipped) where this
/// kernel has no AF_XDP.
fn pair() -> Option<(Topology, Host, Host)> {
    if let Err(why) = ringway_io::backend::xdp_socket_supported() {
        ringway_io::testing::skip(format!("AF_XDP not available on this kernel: {why}"));
        return None;
    }
    Some(xdp_common::veth_pair(true))
}

fn v6(host: &Host) -> Ipv6Addr {
    host.addr6().expect("built with ipv6")
}

/// Datagrams received: (peer, payload).
type Received = Vec<(SocketAddr, Vec<u8>)>;

/// Says whether the datagrams received so far are all.
type Done = fn(&[(SocketAddr, Vec<u8>)]) -> bool;

/// The backend on b's veth at `[b]:0`: it sends its port, then receives
/// until `done` says the datagrams so far are all, answering each with
/// `reply` (if any); returns what came (peer, payload) and the counters
/// once the kernel has taken every answer from the TX ring.
fn serve(
    b: &Host,
    port_tx: mpsc::Sender<u16>,
    done: Done,
    reply: Option<&'static [u8]>,
) -> std::thread::JoinHandle<std::io::Result<(Received, IoStats)>> {
    let bip = v6(b);
    b.spawn(move || {
        let mut io = open_xdp(XdpConfig::new("eth0", SocketAddr::new(IpAddr::V6(bip), 0))).unwrap();
        assert_eq!(io.kind(), BackendKind::Xdp);
        port_tx.send(io.local_addr().unwrap().port()).unwrap();
        let mut rx = RxBatch::new(8, 4096);
        let mut tx = TxBatch::new(8, 4096);
        let mut got = Vec::new();
        let end = Instant::now() + Duration::from_secs(10);
        while !done(&got) && Instant::now() < end {
            io.recv_batch(&mut rx, Some(Duration::from_millis(50)))
                .unwrap();
            for d in rx.iter() {
                got.push((d.meta.peer, d.data.to_vec()));
                if let Some(prefix) = reply {
                    let mut r = prefix.to_vec();
                    r.extend_from_slice(d.data);
                    tx.push(d.meta.peer, &r).unwrap();
                }
            }
            if !tx.is_empty() {
                assert_eq!(io.send_batch(&tx).unwrap(), tx.len());
                tx.clear();
            }
        }
        while io.stats().tx_in_ring > 0 && Instant::now() < end {
            io.recv_batch(&mut rx, Some(Duration::from_millis(1)))
                .unwrap();
        }
        (got, io.stats())
    })
}

/// `ip netns exec NS ARGS...` succeeded.
fn succeeds_in(ns: &str, args: &[&str]) -> bool {
    Command::new("ip")
        .args(["netns", "exec", ns])
        .args(args)
        .output()
        .unwrap()
        .status
        .success()
}

#[test]
fn ipv6_roundtrip_exact_and_kernel_keeps_the_rest() {
    let Some((_t, a, b)) = pair() else {
        return;
    };
    let (aip, bip) = (v6(&a), v6(&b));
    let (port_tx, port_rx) = mpsc::channel();
    let server = serve(&b, port_tx, |got| got.len() >= 20, Some(b"re:"));
    let port = port_rx.recv_timeout(Duration::from_secs(10)).unwrap();
    let dst = SocketAddr::new(IpAddr::V6(bip), port);
    // A kernel UDP socket in b on another port still receives.
    let other = xdp_common::kernel_socket(&b, IpAddr::V6(bip));
    let other_addr = other.local_addr().unwrap();
    let (me, sent, replies) = a
        .run(move || xdp_common::numbered_exchange(IpAddr::V6(aip), dst, other_addr))
        .unwrap();
    let mut buf = [0u8; 64];
    let (n, from) = other.recv_from(&mut buf).unwrap();
    assert_eq!((&buf[..n], from), (&b"kernel path"[..], me));
    // ICMPv6 still works while the program is attached: neighbour
    // discovery resolved b for a (a's replies came back), and b's kernel
    // answers an echo request.
    assert!(
        succeeds_in(
            &a.netns,
            &["ping", "-6", "-c", "1", "-W", "3", &bip.to_string()]
        ),
        "ping over IPv6 through the XDP program"
    );
    let (got, stats) = server.join().unwrap().unwrap();
    assert_eq!(got.len(), 20);
    for ((peer, data), p) in got.iter().zip(&sent) {
        assert_eq!((*peer, data), (me, p));
    }
    for ((from, data), p) in replies.iter().zip(&sent) {
        let mut want = b"re:".to_vec();
        want.extend_from_slice(p);
        assert_eq!((*from, data), (dst, &want));
    }
    assert_eq!(stats.rx_packets, 20);
    assert_eq!(stats.rx_via_socket, 0, "{stats:?}");
    assert_eq!(
        (stats.rx_invalid, stats.rx_bad_checksum),
        (0, 0),
        "{stats:?}"
    );
    // Every reply through the TX ring: a's MAC from b's NDP entry.
    assert_eq!(stats.tx_packets, 20, "{stats:?}");
    assert_eq!(stats.tx_via_socket, 0, "{stats:?}");
    assert_eq!(stats.tx_errors, 0, "{stats:?}");
}

/// `IPV6_HOPOPTS`: every datagram of `socket` carries a hop-by-hop options
/// header (one PadN option), an extension header between IPv6 and UDP.
fn add_hop_by_hop(socket: &UdpSocket) {
    // next header (the kernel fills it in), length 0 (8 bytes), PadN of 4.
    let header = [0u8, 0, 1, 4, 0, 0, 0, 0];
    // SAFETY: a live socket and an 8-byte buffer for the call.
    let rc = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::IPPROTO_IPV6,
            libc::IPV6_HOPOPTS,
            header.as_ptr().cast(),
            header.len() as libc::socklen_t,
        )
    };
    assert_eq!(rc, 0, "IPV6_HOPOPTS: {}", std::io::Error::last_os_error());
}

/// What the program does not handle goes to the kernel, whose companion
/// socket delivers it: a datagram fragmented by its sender (a Fragment
/// extension header) and one with a hop-by-hop options header. Plain ones
/// come through the ring.
#[test]
fn ipv6_extension_headers_and_fragments_take_the_kernel_path() {
    let Some((_t, a, b)) = pair() else {
        return;
    };
    let (aip, bip) = (v6(&a), v6(&b));
    let (port_tx, port_rx) = mpsc::channel();
    let server = serve(&b, port_tx, |got| got.len() >= 4, None);
    let port = port_rx.recv_timeout(Duration::from_secs(10)).unwrap();
    let dst = SocketAddr::new(IpAddr::V6(bip), port);
    let big = xdp_common::big_payload();
    let big2 = big.clone();
    let me = a
        .run(move || {
            let s = xdp_common::send_small_then_big(IpAddr::V6(aip), dst, &big2);
            std::thread::sleep(Duration::from_millis(20));
            let hop = UdpSocket::bind((aip, 0)).unwrap();
            add_hop_by_hop(&hop);
            hop.send_to(b"hop-by-hop", dst).unwrap();
            std::thread::sleep(Duration::from_millis(20));
            s.send_to(b"last", dst).unwrap();
            (s.local_addr().unwrap(), hop.local_addr().unwrap())
        })
        .unwrap();
    let (got, st) = server.join().unwrap().unwrap();
    let mut got = got;
    got.sort_by_key(|(_, data)| data.len());
    assert_eq!(
        got,
        vec![
            (me.0, b"last".to_vec()),
            (me.0, b"small".to_vec()),
            (me.1, b"hop-by-hop".to_vec()),
            (me.0, big),
        ]
    );
    assert_eq!((st.rx_packets, st.rx_via_socket), (4, 2), "{st:?}");
    assert_eq!(st.rx_invalid, 0, "{st:?}");
}

/// Datagrams from a raw IPv6 socket with the UDP checksum we choose: a
/// good one arrives, a corrupted payload and a zero checksum (no checksum,
/// not allowed over IPv6) are dropped and counted.
#[test]
fn ipv6_udp_checksums_verified_on_receive() {
    let Some((_t, a, b)) = pair() else {
        return;
    };
    let (aip, bip) = (v6(&a), v6(&b));
    let (port_tx, port_rx) = mpsc::channel();
    let server = serve(
        &b,
        port_tx,
        |got| got.iter().any(|(_, g)| g == b"end"),
        None,
    );
    let port = port_rx.recv_timeout(Duration::from_secs(10)).unwrap();
    a.run(move || xdp_common::send_checksum_cases(aip.into(), bip.into(), port))
        .unwrap();
    let (got, st) = server.join().unwrap().unwrap();
    let payloads: Vec<Vec<u8>> = got.into_iter().map(|(_, d)| d).collect();
    assert_eq!(payloads, vec![b"good".to_vec(), b"end".to_vec()]);
    assert_eq!((st.rx_bad_checksum, st.rx_invalid), (2, 2), "{st:?}");
}
