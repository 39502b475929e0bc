//! Both backends against real loopback sockets: payloads, peers,
//! truncation, RX timestamps, TX timestamps on request only.

use ringway_io::{open_backend, open_udp, BackendKind, BatchIo, RxBatch, SocketConfig, TxBatch};
use std::net::SocketAddr;
use std::time::Duration;

fn pair(kind: BackendKind, ip: &str, tx_stamps: bool) -> (Box<dyn BatchIo>, Box<dyn BatchIo>) {
    let mut cfg = SocketConfig::new(format!("{ip}:0").parse().unwrap());
    cfg.tx_timestamps = tx_stamps;
    let (a, ra) = open_udp(&cfg).unwrap();
    assert!(ra.rx_timestamps, "{ra:?}");
    let (b, _) = open_udp(&cfg).unwrap();
    (
        open_backend(kind, a).unwrap(),
        open_backend(kind, b).unwrap(),
    )
}

fn recv_n(
    io: &mut dyn BatchIo,
    rx: &mut RxBatch,
    n: usize,
) -> Vec<(SocketAddr, Vec<u8>, ringway_io::RxMeta)> {
    let mut out = Vec::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while out.len() < n && std::time::Instant::now() < deadline {
        io.recv_batch(rx, Some(Duration::from_millis(100))).unwrap();
        for d in rx.iter() {
            out.push((d.meta.peer, d.data.to_vec(), *d.meta));
        }
    }
    out
}

fn roundtrip(kind: BackendKind, ip: &str) {
    let (mut a, mut b) = pair(kind, ip, false);
    let dst = b.local_addr().unwrap();
    let src = a.local_addr().unwrap();
    let mut tx = TxBatch::new(16, 256);
    for i in 0..10u8 {
        tx.push(dst, &[i; 20]).unwrap();
    }
    let before = ringway_io::realtime_now();
    assert_eq!(a.send_batch(&tx).unwrap(), 10);
    let mut rx = RxBatch::new(4, 256);
    let got = recv_n(b.as_mut(), &mut rx, 10);
    assert_eq!(got.len(), 10);
    for (i, (peer, data, meta)) in got.iter().enumerate() {
        assert_eq!(*peer, src);
        assert_eq!(data, &vec![i as u8; 20]);
        assert!(!meta.truncated);
        let k = meta.kernel_rx.expect("kernel RX timestamp");
        assert!(k >= before, "kernel stamp {k:?} before send {before:?}");
        assert!(k <= meta.app_rx, "kernel {k:?} after app {:?}", meta.app_rx);
    }
    let st = b.stats();
    assert_eq!(st.rx_packets, 10);
    assert_eq!(a.stats().tx_packets, 10);
    // Timeout with nothing queued returns 0.
    assert_eq!(
        b.recv_batch(&mut rx, Some(Duration::from_millis(20)))
            .unwrap(),
        0
    );
    // Truncation: a frame smaller than the datagram.
    tx.clear();
    tx.push(dst, &[7u8; 200]).unwrap();
    a.send_batch(&tx).unwrap();
    let mut small = RxBatch::new(2, 50);
    let got = recv_n(b.as_mut(), &mut small, 1);
    assert_eq!(got.len(), 1);
    assert!(got[0].2.truncated);
    assert_eq!(got[0].1.len(), 50);
}

#[test]
fn socket_v4() {
    roundtrip(BackendKind::Socket, "127.0.0.1");
}
#[test]
fn mmsg_v4() {
    roundtrip(BackendKind::Mmsg, "127.0.0.1");
}
#[test]
fn uring_v4() {
    roundtrip(BackendKind::Uring, "127.0.0.1");
}
#[test]
fn uring_v6() {
    roundtrip(BackendKind::Uring, "[::1]");
}
#[test]
fn socket_v6() {
    roundtrip(BackendKind::Socket, "[::1]");
}
#[test]
fn mmsg_v6() {
    roundtrip(BackendKind::Mmsg, "[::1]");
}

fn tx_stamps(kind: BackendKind, ip: &str) {
    let (mut a, mut b) = pair(kind, ip, true);
    let dst = b.local_addr().unwrap();
    let mut tx = TxBatch::new(16, 64);
    for i in 0..12u8 {
        tx.push(dst, &[i; 10]).unwrap();
    }
    // Request stamps for entries 1, 5 and 11 only.
    tx.request_stamp(1, 101);
    tx.request_stamp(5, 105);
    tx.request_stamp(11, 111);
    let t0 = ringway_io::realtime_now();
    assert_eq!(a.send_batch(&tx).unwrap(), 12);
    let mut stamps = Vec::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while stamps.len() < 3 && std::time::Instant::now() < deadline {
        a.poll_tx_stamps(&mut stamps).unwrap();
        std::thread::sleep(Duration::from_millis(5));
    }
    let tags: Vec<u64> = stamps.iter().map(|s| s.tag).collect();
    assert_eq!(tags, vec![101, 105, 111]);
    for s in &stamps {
        assert!(s.app_tx >= t0);
        assert!(s.kernel_tx >= s.app_tx, "{s:?}");
    }
    // A second batch without requests yields no stamps.
    tx.clear();
    tx.push(dst, b"x").unwrap();
    a.send_batch(&tx).unwrap();
    std::thread::sleep(Duration::from_millis(20));
    let mut more = Vec::new();
    assert_eq!(a.poll_tx_stamps(&mut more).unwrap(), 0);
    // Later requests still match (key counter stays in step).
    tx.clear();
    tx.push(dst, b"y").unwrap();
    tx.request_stamp(0, 7);
    a.send_batch(&tx).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while more.is_empty() && std::time::Instant::now() < deadline {
        a.poll_tx_stamps(&mut more).unwrap();
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(more.iter().map(|s| s.tag).collect::<Vec<_>>(), vec![7]);
    let mut rx = RxBatch::new(32, 64);
    assert_eq!(recv_n(b.as_mut(), &mut rx, 14).len(), 14);
}

#[test]
fn tx_stamps_socket_v4() {
    tx_stamps(BackendKind::Socket, "127.0.0.1");
}
#[test]
fn tx_stamps_mmsg_v4() {
    tx_stamps(BackendKind::Mmsg, "127.0.0.1");
}
#[test]
fn tx_stamps_uring_v4() {
    tx_stamps(BackendKind::Uring, "127.0.0.1");
}
#[test]
fn tx_stamps_uring_v6() {
    tx_stamps(BackendKind::Uring, "[::1]");
}
#[test]
fn tx_stamps_socket_v6() {
    tx_stamps(BackendKind::Socket, "[::1]");
}
#[test]
fn tx_stamps_mmsg_v6() {
    tx_stamps(BackendKind::Mmsg, "[::1]");
}

#[test]
fn tx_error_is_counted_not_fatal() {
    for kind in &BackendKind::usable() {
        let (mut a, mut b) = pair(*kind, "127.0.0.1", false);
        let dst = b.local_addr().unwrap();
        let mut tx = TxBatch::new(4, 64);
        tx.push(dst, b"one").unwrap();
        // IPv6 destination on an IPv4 socket: refused by the kernel.
        tx.push("[::1]:9".parse().unwrap(), b"bad").unwrap();
        tx.push(dst, b"three").unwrap();
        assert_eq!(a.send_batch(&tx).unwrap(), 2, "{kind}");
        assert_eq!(a.stats().tx_errors, 1);
        let mut rx = RxBatch::new(4, 64);
        let got = recv_n(b.as_mut(), &mut rx, 2);
        assert_eq!(
            got.iter().map(|g| g.1.clone()).collect::<Vec<_>>(),
            vec![b"one".to_vec(), b"three".to_vec()]
        );
    }
}

#[test]
fn stamp_requests_without_tx_timestamps_are_counted_lost() {
    for kind in &BackendKind::usable() {
        let (mut a, mut b) = pair(*kind, "127.0.0.1", false);
        let dst = b.local_addr().unwrap();
        let mut tx = TxBatch::new(4, 64);
        tx.push(dst, b"a").unwrap();
        tx.push(dst, b"b").unwrap();
        tx.request_stamp(1, 9);
        assert_eq!(a.send_batch(&tx).unwrap(), 2);
        assert_eq!(a.stats().tx_stamps_lost, 1, "{kind}");
        std::thread::sleep(Duration::from_millis(20));
        let mut st = Vec::new();
        assert_eq!(a.poll_tx_stamps(&mut st).unwrap(), 0);
        let mut rx = RxBatch::new(4, 64);
        assert_eq!(recv_n(b.as_mut(), &mut rx, 2).len(), 2);
    }
}

#[test]
fn pending_socket_error_is_consumed_not_spun_on() {
    for kind in &BackendKind::usable() {
        let (s, _) = open_udp(&SocketConfig::new("127.0.0.1:0".parse().unwrap())).unwrap();
        // Connect to a port nobody listens on and send: ICMP port unreachable
        // leaves ECONNREFUSED pending on the connected socket.
        let dead = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let dead_addr = dead.local_addr().unwrap();
        drop(dead);
        s.connect(dead_addr).unwrap();
        s.send(b"x").unwrap();
        std::thread::sleep(Duration::from_millis(20));
        let same = s.try_clone().unwrap();
        let mut io = open_backend(*kind, s).unwrap();
        let mut rx = RxBatch::new(4, 64);
        assert_eq!(
            io.recv_batch(&mut rx, Some(Duration::from_millis(100)))
                .unwrap(),
            0
        );
        // recv_batch consumed the pending error, so poll stops reporting POLLERR
        // (otherwise the wait would spin on it until the timeout).
        assert!(same.take_error().unwrap().is_none(), "{kind}");
        assert_eq!(io.stats().socket_errors, 1, "{kind}");
    }
}

#[test]
fn async_error_with_data_queued_still_delivers() {
    for kind in &BackendKind::usable() {
        let (s, _) = open_udp(&SocketConfig::new("127.0.0.1:0".parse().unwrap())).unwrap();
        let me = s.local_addr().unwrap();
        let dead = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let dead_addr = dead.local_addr().unwrap();
        drop(dead);
        // Unconnected sends to a dead port leave no error; a connected one does.
        let peer = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        s.connect(dead_addr).unwrap();
        s.send(b"x").unwrap();
        std::thread::sleep(Duration::from_millis(20));
        // Reconnect to the live peer (clears nothing pending) and queue data from it.
        s.connect(peer.local_addr().unwrap()).unwrap();
        peer.send_to(b"data", me).unwrap();
        std::thread::sleep(Duration::from_millis(20));
        let mut io = open_backend(*kind, s).unwrap();
        let mut rx = RxBatch::new(4, 64);
        let got = recv_n(io.as_mut(), &mut rx, 1);
        assert_eq!(got.len(), 1, "{kind}");
        assert_eq!(got[0].1, b"data");
    }
}
