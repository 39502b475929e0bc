//! Socket options applied and read back; drops counted exactly.

use ringway_io::netns::in_private_netns;
use ringway_io::{counters, open_backend, open_udp, BackendKind, RxBatch, SocketConfig, TxBatch};
use std::net::UdpSocket;
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

fn rmem_max() -> usize {
    ringway_io::sock::read_sysctl("net/core/rmem_max").unwrap() as usize
}
fn wmem_max() -> usize {
    ringway_io::sock::read_sysctl("net/core/wmem_max").unwrap() as usize
}

#[test]
fn buffers_forced_past_sysctl_max() {
    let (rmax, wmax) = (rmem_max(), wmem_max());
    let mut cfg = SocketConfig::new("127.0.0.1:0".parse().unwrap());
    cfg.rcvbuf = Some(rmax * 4);
    cfg.sndbuf = Some(wmax * 4);
    let (s, rep) = open_udp(&cfg).unwrap();
    // We run as root (CAP_NET_ADMIN): FORCE applies and the kernel doubles it.
    assert!(rep.rcvbuf_forced, "{rep:?}");
    assert_eq!(rep.rcvbuf_granted, rmax * 8, "{rep:?}");
    assert!(rep.sndbuf_forced, "{rep:?}");
    assert_eq!(rep.sndbuf_granted, wmax * 8, "{rep:?}");
    assert!(rep.warnings.is_empty(), "{:?}", rep.warnings);
    assert_eq!(rep.rmem_max, rmax);
    drop(s);
}

#[test]
fn buffers_clamped_without_force_warn() {
    let rmax = rmem_max();
    let mut cfg = SocketConfig::new("127.0.0.1:0".parse().unwrap());
    cfg.rcvbuf = Some(rmax * 4);
    cfg.sndbuf = Some(wmem_max() * 4);
    cfg.force_buffers = false;
    let (_s, rep) = open_udp(&cfg).unwrap();
    assert!(!rep.rcvbuf_forced);
    assert_eq!(rep.rcvbuf_granted, rmax * 2, "{rep:?}");
    assert_eq!(rep.sndbuf_granted, wmem_max() * 2, "{rep:?}");
    assert!(
        rep.warnings
            .iter()
            .any(|w| w.contains("SO_RCVBUF") && w.contains("granted")),
        "{:?}",
        rep.warnings
    );
    assert!(
        rep.warnings
            .iter()
            .any(|w| w.contains("SO_SNDBUF") && w.contains("granted")),
        "{:?}",
        rep.warnings
    );
}

#[test]
fn small_buffer_within_limit_no_warning() {
    let mut cfg = SocketConfig::new("127.0.0.1:0".parse().unwrap());
    cfg.rcvbuf = Some(65536);
    let (_s, rep) = open_udp(&cfg).unwrap();
    assert_eq!(rep.rcvbuf_granted, 131072);
    assert!(rep.warnings.is_empty(), "{:?}", rep.warnings);
    assert!(rep.rx_timestamps && rep.rxq_ovfl);
    assert!(!rep.tx_timestamps);
}

/// Capabilities are per thread: drop CAP_NET_ADMIN from this thread's
/// effective set so SO_RCVBUFFORCE is refused.
fn drop_net_admin_on_this_thread() {
    #[repr(C)]
    struct Hdr {
        version: u32,
        pid: i32,
    }
    #[repr(C)]
    #[derive(Default, Clone, Copy)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    let mut h = Hdr {
        version: 0x2008_0522,
        pid: 0,
    };
    let mut d = [Data::default(); 2];
    // SAFETY: capget writes two Data records for version 3; pointers are live.
    let rc = unsafe { libc::syscall(libc::SYS_capget, &mut h as *mut Hdr, d.as_mut_ptr()) };
    assert_eq!(rc, 0);
    d[0].effective &= !(1 << 12); // CAP_NET_ADMIN
                                  // SAFETY: capset reads the header and two Data records; pointers are live.
    let rc = unsafe { libc::syscall(libc::SYS_capset, &mut h as *mut Hdr, d.as_ptr()) };
    assert_eq!(rc, 0);
}

#[test]
fn force_refused_without_cap_is_a_warning() {
    let rmax = rmem_max();
    std::thread::spawn(move || {
        drop_net_admin_on_this_thread();
        let mut cfg = SocketConfig::new("127.0.0.1:0".parse().unwrap());
        cfg.rcvbuf = Some(rmax * 4);
        let (_s, rep) = open_udp(&cfg).unwrap();
        assert!(!rep.rcvbuf_forced);
        assert_eq!(rep.rcvbuf_granted, rmax * 2);
        assert!(
            rep.warnings
                .iter()
                .any(|w| w.contains("SO_RCVBUFFORCE") && w.contains("EPERM")),
            "{:?}",
            rep.warnings
        );
    })
    .join()
    .unwrap();
}

#[test]
fn reuseport_shares_a_port() {
    let mut cfg = SocketConfig::new("127.0.0.1:0".parse().unwrap());
    cfg.reuseport = true;
    let (a, rep) = open_udp(&cfg).unwrap();
    assert!(rep.reuseport);
    cfg.bind = a.local_addr().unwrap();
    let (b, _) = open_udp(&cfg).expect("second bind with SO_REUSEPORT");
    assert_eq!(a.local_addr().unwrap(), b.local_addr().unwrap());
    cfg.reuseport = false;
    let err = open_udp(&cfg).unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::AddrInUse);
}

#[test]
fn rx_stamps_off_means_none() {
    let mut cfg = SocketConfig::new("127.0.0.1:0".parse().unwrap());
    cfg.rx_timestamps = false;
    let (s, rep) = open_udp(&cfg).unwrap();
    assert!(!rep.rx_timestamps);
    let dst = s.local_addr().unwrap();
    let mut io = open_backend(BackendKind::Mmsg, s).unwrap();
    UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .send_to(b"hi", dst)
        .unwrap();
    let mut rx = RxBatch::new(2, 64);
    assert_eq!(
        io.recv_batch(&mut rx, Some(Duration::from_secs(2)))
            .unwrap(),
        1
    );
    assert_eq!(rx.get(0).unwrap().meta.kernel_rx, None);
}

/// Fill a tiny receive buffer inside a private namespace (so /proc/net/snmp
/// counts only our traffic) and check every counter agrees exactly.
fn exact_drops(kind: BackendKind) {
    in_private_netns(move || {
        const K: u64 = 300;
        let mut cfg = SocketConfig::new("127.0.0.1:0".parse().unwrap());
        cfg.rcvbuf = Some(1); // the kernel raises it to its minimum
        let (rs, rep) = open_udp(&cfg).unwrap();
        assert!(rep.rxq_ovfl);
        let dst = rs.local_addr().unwrap();
        let fd = rs.as_raw_fd();
        let mut io = open_backend(kind, rs).unwrap();
        let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
        let snmp0 = counters::udp_snmp().unwrap();
        for i in 0..K {
            tx.send_to(&i.to_be_bytes().repeat(25), dst).unwrap();
        }
        // Loopback delivery runs in softirq right after each send; still, wait
        // until the drop counter stops moving. (InDatagrams counts at read time.)
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut last = u64::MAX;
        loop {
            std::thread::sleep(Duration::from_millis(20));
            let now = counters::udp_snmp().unwrap().since(&snmp0).rcvbuf_errors;
            if now == last || Instant::now() > deadline {
                break;
            }
            last = now;
        }
        let mut rx = RxBatch::new(64, 256);
        let mut delivered = 0u64;
        while io
            .recv_batch(&mut rx, Some(Duration::from_millis(100)))
            .unwrap()
            > 0
        {
            delivered += rx.len() as u64;
        }
        // Drops after the last queued datagram are reported with the next one:
        // send a sentinel that now fits.
        tx.send_to(b"sentinel", dst).unwrap();
        assert_eq!(
            io.recv_batch(&mut rx, Some(Duration::from_secs(2)))
                .unwrap(),
            1
        );
        assert_eq!(rx.get(0).unwrap().data, b"sentinel");
        let drops = io.stats().rx_dropped;
        assert!(
            delivered > 0 && drops > 0,
            "delivered {delivered}, drops {drops}"
        );
        assert_eq!(
            delivered + drops,
            K,
            "delivered {delivered} + SO_RXQ_OVFL {drops}"
        );
        let d = counters::udp_snmp().unwrap().since(&snmp0);
        assert_eq!(d.rcvbuf_errors, drops, "{d:?}");
        assert_eq!(d.in_datagrams, delivered + 1, "{d:?}");
        assert_eq!(counters::socket_drops(fd).unwrap(), drops);
        assert_eq!(counters::socket_drops_by_addr(dst).unwrap(), drops);
        assert_eq!(ringway_io::sock::socket_drops(fd).unwrap(), drops);
    })
    .unwrap();
}

#[test]
fn exact_drops_socket() {
    exact_drops(BackendKind::Socket);
}

#[test]
fn exact_drops_mmsg() {
    exact_drops(BackendKind::Mmsg);
}

#[test]
fn exact_drops_uring() {
    exact_drops(BackendKind::Uring);
}

#[test]
fn send_batch_ipv6_counts_in_snmp6() {
    in_private_netns(|| {
        let s0 = counters::udp6_snmp().unwrap();
        let (a, _) = open_udp(&SocketConfig::new("[::1]:0".parse().unwrap())).unwrap();
        let (b, _) = open_udp(&SocketConfig::new("[::1]:0".parse().unwrap())).unwrap();
        let dst = b.local_addr().unwrap();
        let mut a = open_backend(BackendKind::Mmsg, a).unwrap();
        let mut tx = TxBatch::new(8, 64);
        for _ in 0..8 {
            tx.push(dst, b"v6").unwrap();
        }
        assert_eq!(a.send_batch(&tx).unwrap(), 8);
        let d = counters::udp6_snmp().unwrap().since(&s0);
        assert_eq!(d.out_datagrams, 8);
        drop(b);
    })
    .unwrap();
}
