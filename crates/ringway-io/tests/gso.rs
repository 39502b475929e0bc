//! UDP GSO coalescing of the mmsg backend against real loopback sockets:
//! mixed destinations and sizes arrive complete, exact, one datagram each
//! and in order per destination; stamp requests are never coalesced.

use ringway_io::{open_backend, open_udp, BackendKind, BatchIo, RxBatch, SocketConfig, TxBatch};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

fn open(kind: BackendKind, ip: &str, tx_stamps: bool) -> Box<dyn BatchIo> {
    let mut cfg = SocketConfig::new(format!("{ip}:0").parse().unwrap());
    cfg.tx_timestamps = tx_stamps;
    cfg.rcvbuf = Some(4 << 20);
    let (s, _) = open_udp(&cfg).unwrap();
    open_backend(kind, s).unwrap()
}

/// Receive until `n` datagrams came (or 5 s passed); (peer, bytes) in arrival order.
fn recv_n(io: &mut dyn BatchIo, n: usize) -> Vec<(SocketAddr, Vec<u8>)> {
    let mut rx = RxBatch::new(32, 4096);
    let mut out = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(5);
    while out.len() < n && Instant::now() < deadline {
        io.recv_batch(&mut rx, Some(Duration::from_millis(100)))
            .unwrap();
        for d in rx.iter() {
            assert!(!d.meta.truncated);
            out.push((d.meta.peer, d.data.to_vec()));
        }
    }
    // Nothing beyond the expected datagrams (no coalesced leftovers).
    io.recv_batch(&mut rx, Some(Duration::from_millis(50)))
        .unwrap();
    for d in rx.iter() {
        out.push((d.meta.peer, d.data.to_vec()));
    }
    out
}

/// Datagram `seq` of `len` bytes: the sequence number, then a filler derived from it.
fn payload(seq: u32, len: usize) -> Vec<u8> {
    let mut v: Vec<u8> = (0..len).map(|i| (seq as usize * 7 + i) as u8).collect();
    v[..4].copy_from_slice(&seq.to_be_bytes());
    v
}

fn mixed(ip: &str) {
    let mut a = open(BackendKind::Mmsg, ip, false);
    let mut b = open(BackendKind::Mmsg, ip, false);
    let mut c = open(BackendKind::Mmsg, ip, false);
    assert!(a.set_gso(true), "UDP GSO refused on this kernel");
    assert!(a.gso_stats().enabled);
    let (bd, cd) = (b.local_addr().unwrap(), c.local_addr().unwrap());
    // Runs: b×5 len 100 (train), c×3 len 100 (train), b×2 len 50 (train),
    // b×1 len 100 (single), c×70 len 30 (trains of 64 and 6), b×1 len 7.
    let plan: &[(SocketAddr, usize, usize)] = &[
        (bd, 100, 5),
        (cd, 100, 3),
        (bd, 50, 2),
        (bd, 100, 1),
        (cd, 30, 70),
        (bd, 7, 1),
    ];
    let mut tx = TxBatch::new(128, 256);
    let mut want: HashMap<SocketAddr, Vec<Vec<u8>>> = HashMap::new();
    let mut seq = 0u32;
    for &(dst, len, count) in plan {
        for _ in 0..count {
            let p = payload(seq, len);
            tx.push(dst, &p).unwrap();
            want.entry(dst).or_default().push(p);
            seq += 1;
        }
    }
    assert_eq!(a.send_batch(&tx).unwrap(), 82);
    let g = a.gso_stats();
    assert_eq!((g.trains, g.segments, g.fallbacks), (5, 80, 0), "{g:?}");
    let st = a.stats();
    assert_eq!((st.tx_packets, st.tx_errors), (82, 0));
    let src = a.local_addr().unwrap();
    for (io, dst) in [(&mut b, bd), (&mut c, cd)] {
        let got = recv_n(io.as_mut(), want[&dst].len());
        assert!(got.iter().all(|(p, _)| *p == src));
        let got: Vec<Vec<u8>> = got.into_iter().map(|(_, d)| d).collect();
        assert_eq!(
            got, want[&dst],
            "datagrams at {dst} differ or are out of order"
        );
    }
}

#[test]
fn mixed_batch_arrives_exact_v4() {
    mixed("127.0.0.1");
}

#[test]
fn mixed_batch_arrives_exact_v6() {
    mixed("[::1]");
}

#[test]
fn trains_respect_the_byte_limit() {
    let mut a = open(BackendKind::Mmsg, "127.0.0.1", false);
    let mut b = open(BackendKind::Mmsg, "127.0.0.1", false);
    assert!(a.set_gso(true));
    let dst = b.local_addr().unwrap();
    // 40 × 2000 bytes = 80 000 > 65 000: trains of 32 and 8.
    let mut tx = TxBatch::new(40, 2048);
    let want: Vec<Vec<u8>> = (0..40).map(|i| payload(i, 2000)).collect();
    for p in &want {
        tx.push(dst, p).unwrap();
    }
    assert_eq!(a.send_batch(&tx).unwrap(), 40);
    let g = a.gso_stats();
    assert_eq!((g.trains, g.segments), (2, 40), "{g:?}");
    let got: Vec<Vec<u8>> = recv_n(b.as_mut(), 40).into_iter().map(|(_, d)| d).collect();
    assert_eq!(got, want);
}

#[test]
fn stamp_requests_are_not_coalesced() {
    let mut a = open(BackendKind::Mmsg, "127.0.0.1", true);
    let mut b = open(BackendKind::Mmsg, "127.0.0.1", false);
    assert!(a.set_gso(true));
    let dst = b.local_addr().unwrap();
    let mut tx = TxBatch::new(8, 64);
    let want: Vec<Vec<u8>> = (0..6).map(|i| payload(i, 40)).collect();
    for p in &want {
        tx.push(dst, p).unwrap();
    }
    tx.request_stamp(2, 77);
    assert_eq!(a.send_batch(&tx).unwrap(), 6);
    // [0,1] train, [2] alone with its stamp request, [3,4,5] train.
    let g = a.gso_stats();
    assert_eq!((g.trains, g.segments), (2, 5), "{g:?}");
    let mut stamps = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(5);
    while stamps.is_empty() && Instant::now() < deadline {
        a.poll_tx_stamps(&mut stamps).unwrap();
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(stamps.iter().map(|s| s.tag).collect::<Vec<_>>(), vec![77]);
    let got: Vec<Vec<u8>> = recv_n(b.as_mut(), 6).into_iter().map(|(_, d)| d).collect();
    assert_eq!(got, want);
}

#[test]
fn off_by_default_and_switchable() {
    let mut a = open(BackendKind::Mmsg, "127.0.0.1", false);
    let mut b = open(BackendKind::Mmsg, "127.0.0.1", false);
    assert!(!a.gso_stats().enabled);
    let dst = b.local_addr().unwrap();
    let mut tx = TxBatch::new(4, 64);
    for i in 0..4 {
        tx.push(dst, &payload(i, 20)).unwrap();
    }
    assert_eq!(a.send_batch(&tx).unwrap(), 4);
    assert_eq!(a.gso_stats().trains, 0);
    assert!(a.set_gso(true));
    assert_eq!(a.send_batch(&tx).unwrap(), 4);
    assert_eq!(a.gso_stats().trains, 1);
    assert!(!a.set_gso(false));
    assert_eq!(a.send_batch(&tx).unwrap(), 4);
    assert_eq!(a.gso_stats().trains, 1);
    assert_eq!(recv_n(b.as_mut(), 12).len(), 12);
    // Backends without coalescing say so.
    let mut s = open(BackendKind::Socket, "127.0.0.1", false);
    assert!(!s.set_gso(true));
    assert_eq!(s.gso_stats(), ringway_io::GsoStats::default());
}

/// A train the kernel refuses on its own (SO_NO_CHECK makes UDP_SEGMENT
/// sends fail with EINVAL) goes out datagram by datagram, every datagram
/// arrives exactly once, and coalescing stays on for later trains.
#[test]
fn refused_train_is_resent_one_by_one_and_gso_stays_on() {
    let mut a = open(BackendKind::Mmsg, "127.0.0.1", false);
    let mut b = open(BackendKind::Mmsg, "127.0.0.1", false);
    assert!(a.set_gso(true), "UDP GSO refused on this kernel");
    let one: libc::c_int = 1;
    // SAFETY: valid fd and a live c_int option value.
    let rc = unsafe {
        libc::setsockopt(
            a.raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_NO_CHECK,
            (&one as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    assert_eq!(rc, 0);
    let bd = b.local_addr().unwrap();
    let mut tx = TxBatch::new(16, 256);
    let want: Vec<Vec<u8>> = (0..10).map(|i| payload(i, 100)).collect();
    for p in &want {
        tx.push(bd, p).unwrap();
    }
    assert_eq!(a.send_batch(&tx).unwrap(), 10);
    let got: Vec<Vec<u8>> = recv_n(b.as_mut(), 10).into_iter().map(|x| x.1).collect();
    assert_eq!(got, want);
    let g = a.gso_stats();
    assert_eq!((g.trains, g.fallbacks), (0, 1), "{g:?}");
    assert!(
        g.enabled,
        "one refused train must not switch GSO off: {g:?}"
    );
}
