//! UDP GRO receive of the mmsg backend against real loopback sockets: a
//! GSO train reaches a GRO socket as one message, and the backend hands it
//! out as the original datagrams (exact bytes, order, peer); more datagrams
//! than frames fit one batch; a train cut by a short frame marks only its
//! last piece truncated; without GRO nothing is coalesced.

use ringway_io::{open_backend, open_udp, BackendKind, BatchIo, RxBatch, SocketConfig, TxBatch};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

fn open(ip: &str) -> Box<dyn BatchIo> {
    let mut cfg = SocketConfig::new(format!("{ip}:0").parse().unwrap());
    cfg.rcvbuf = Some(4 << 20);
    let (s, _) = open_udp(&cfg).unwrap();
    open_backend(BackendKind::Mmsg, s).unwrap()
}

/// Datagram `seq` of `len` bytes: the sequence number, then a filler derived from it.
fn payload(seq: u32, len: usize) -> Vec<u8> {
    let mut v: Vec<u8> = (0..len).map(|i| (seq as usize * 7 + i) as u8).collect();
    v[..4].copy_from_slice(&seq.to_be_bytes());
    v
}

/// Send `runs` (length, count) from `a` to `dst` in one batch; returns the datagrams in order.
fn send_runs(a: &mut dyn BatchIo, dst: SocketAddr, runs: &[(usize, usize)]) -> Vec<Vec<u8>> {
    let mut tx = TxBatch::new(256, 2048);
    let mut sent = Vec::new();
    let mut seq = 0u32;
    for &(len, count) in runs {
        for _ in 0..count {
            let p = payload(seq, len);
            tx.push(dst, &p).unwrap();
            sent.push(p);
            seq += 1;
        }
    }
    assert_eq!(a.send_batch(&tx).unwrap(), sent.len());
    sent
}

/// A received datagram: peer, bytes, truncated.
type Got = (SocketAddr, Vec<u8>, bool);

/// Receive until `n` datagrams came (or 5 s passed), then once more briefly;
/// returns (peer, bytes, truncated) in arrival order and the datagram count of each call.
fn recv_all(io: &mut dyn BatchIo, rx: &mut RxBatch, n: usize) -> (Vec<Got>, Vec<usize>) {
    let mut out = Vec::new();
    let mut per_call = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(5);
    while out.len() < n && Instant::now() < deadline {
        let got = io.recv_batch(rx, Some(Duration::from_millis(100))).unwrap();
        assert_eq!(got, rx.len());
        if got > 0 {
            per_call.push(got);
        }
        for d in rx.iter() {
            out.push((d.meta.peer, d.data.to_vec(), d.meta.truncated));
        }
    }
    io.recv_batch(rx, Some(Duration::from_millis(50))).unwrap();
    for d in rx.iter() {
        out.push((d.meta.peer, d.data.to_vec(), d.meta.truncated));
    }
    (out, per_call)
}

fn train_arrives_split(ip: &str) {
    let mut a = open(ip);
    let mut b = open(ip);
    assert!(a.set_gso(true), "UDP GSO refused on this kernel");
    assert!(b.set_gro(true), "UDP GRO refused on this kernel");
    assert!(b.gso_stats().gro_enabled);
    // A train of 40 × 300 B (last one 300 too), a single 120 B, a train of 5 × 77 B.
    let sent = send_runs(
        a.as_mut(),
        b.local_addr().unwrap(),
        &[(300, 40), (120, 1), (77, 5)],
    );
    let mut rx = RxBatch::new(8, 65_536);
    let (got, _) = recv_all(b.as_mut(), &mut rx, sent.len());
    let src = a.local_addr().unwrap();
    assert_eq!(got.len(), sent.len());
    for (i, ((peer, bytes, trunc), want)) in got.iter().zip(&sent).enumerate() {
        assert_eq!(*peer, src, "datagram {i}");
        assert_eq!(bytes, want, "datagram {i}");
        assert!(!trunc, "datagram {i}");
    }
    let g = b.gso_stats();
    // Loopback hands a GSO train to a GRO socket unsegmented.
    assert_eq!((g.gro_trains, g.gro_segments), (2, 45), "{g:?}");
    assert_eq!(b.stats().rx_packets, 46);
}

#[test]
fn gso_train_arrives_as_its_datagrams_ipv4() {
    train_arrives_split("127.0.0.1");
}

#[test]
fn gso_train_arrives_as_its_datagrams_ipv6() {
    if std::net::UdpSocket::bind("[::1]:0").is_err() {
        ringway_io::testing::skip("no IPv6 loopback here: only IPv4 checked");
        return;
    }
    train_arrives_split("[::1]");
}

#[test]
fn more_datagrams_than_frames_in_one_batch() {
    let mut a = open("127.0.0.1");
    let mut b = open("127.0.0.1");
    assert!(a.set_gso(true) && b.set_gro(true));
    let dst = b.local_addr().unwrap();
    // Three trains (different lengths keep them apart), two frames per batch.
    let sent = send_runs(a.as_mut(), dst, &[(200, 8), (201, 8), (202, 8)]);
    let mut rx = RxBatch::new(2, 65_536);
    let (got, per_call) = recv_all(b.as_mut(), &mut rx, sent.len());
    let bytes: Vec<&Vec<u8>> = got.iter().map(|(_, b, _)| b).collect();
    assert_eq!(bytes, sent.iter().collect::<Vec<_>>());
    // Both frames of the first batch carried a whole train.
    assert_eq!(per_call.first(), Some(&16), "{per_call:?}");
    assert_eq!(rx.free_frames(), rx.capacity() - rx.frames_used());
}

#[test]
fn train_longer_than_a_frame_is_cut_at_the_frame_end() {
    let mut a = open("127.0.0.1");
    let mut b = open("127.0.0.1");
    assert!(a.set_gso(true) && b.set_gro(true));
    let sent = send_runs(a.as_mut(), b.local_addr().unwrap(), &[(300, 5)]);
    let mut rx = RxBatch::new(4, 1000);
    let (got, _) = recv_all(b.as_mut(), &mut rx, 4);
    // 1000 of 1500 bytes fit: three whole datagrams and 100 bytes of the fourth.
    assert_eq!(
        got.len(),
        4,
        "{:?}",
        got.iter().map(|g| g.1.len()).collect::<Vec<_>>()
    );
    for (i, (_, bytes, trunc)) in got.iter().take(3).enumerate() {
        assert_eq!(bytes, &sent[i]);
        assert!(!trunc);
    }
    assert_eq!(got[3].1, sent[3][..100]);
    assert!(got[3].2, "the cut piece is marked truncated");
    assert_eq!(b.gso_stats().gro_cut, 1);
    // Cut exactly at a datagram boundary: three whole datagrams, none
    // marked truncated, and the cut train still counted.
    let sent = send_runs(a.as_mut(), b.local_addr().unwrap(), &[(250, 5)]);
    let (got, _) = recv_all(b.as_mut(), &mut rx, 4);
    assert_eq!(got.len(), 4);
    for (i, (_, bytes, trunc)) in got.iter().enumerate() {
        assert_eq!(bytes, &sent[i]);
        assert!(!trunc, "datagram {i} is whole");
    }
    assert_eq!(b.gso_stats().gro_cut, 2);
    // A frame shorter than one datagram of the train: one cut piece.
    let mut small = RxBatch::new(4, 100);
    let sent = send_runs(a.as_mut(), b.local_addr().unwrap(), &[(300, 3)]);
    let (got, _) = recv_all(b.as_mut(), &mut small, 1);
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].1, sent[0][..100]);
    assert!(got[0].2);
    assert_eq!(b.gso_stats().gro_cut, 3);
}

#[test]
fn without_gro_every_datagram_arrives_alone() {
    let mut a = open("127.0.0.1");
    let mut b = open("127.0.0.1");
    assert!(a.set_gso(true));
    assert!(!b.gso_stats().gro_enabled);
    let sent = send_runs(a.as_mut(), b.local_addr().unwrap(), &[(300, 10)]);
    let mut rx = RxBatch::new(32, 65_536);
    let (got, _) = recv_all(b.as_mut(), &mut rx, sent.len());
    assert_eq!(got.len(), 10);
    let g = b.gso_stats();
    assert_eq!((g.gro_trains, g.gro_segments), (0, 0));
    // Switching GRO on and off again works and reads back.
    assert!(b.set_gro(true));
    assert!(!b.set_gro(false));
    assert!(!b.gso_stats().gro_enabled);
}

#[test]
fn backends_without_gro_say_so() {
    let (s, _) = open_udp(&SocketConfig::new("127.0.0.1:0".parse().unwrap())).unwrap();
    let mut io = open_backend(BackendKind::Socket, s).unwrap();
    assert!(!io.set_gro(true));
    assert!(!io.gso_stats().gro_enabled);
}
