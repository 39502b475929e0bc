//! ICMP errors for datagrams sent from an unconnected socket with
//! `SocketConfig::recv_errors` (IP_RECVERR), on every usable backend,
//! over loopback: a datagram to a port where nothing listens draws an
//! ICMP port unreachable, which the backend reads from the error queue
//! and reports with the destination it was about; the error left pending
//! on the socket does not cost the next datagram to another peer; and a
//! read of the queue for TX stamps keeps the ICMP report, as a read for
//! ICMP reports files the stamps.

use ringway_io::{
    open_backend, open_udp, BackendKind, BatchIo, IcmpUnreachable, RxBatch, SocketConfig, TxBatch,
    TxStamp,
};
use std::net::{SocketAddr, UdpSocket};
use std::time::{Duration, Instant};

/// A backend of `kind` on 127.0.0.1 with IP_RECVERR (`recv_errors`) and
/// TX stamps as asked.
fn backend(kind: BackendKind, recv_errors: bool, tx_stamps: bool) -> Box<dyn BatchIo> {
    let mut config = SocketConfig::new("127.0.0.1:0".parse().unwrap());
    config.recv_errors = recv_errors;
    config.tx_timestamps = tx_stamps;
    let (socket, report) = open_udp(&config).unwrap();
    assert_eq!(report.recv_errors, recv_errors, "{report:?}");
    open_backend(kind, socket).unwrap()
}

/// A loopback port where nothing listens (bound, then closed).
fn dead_port() -> SocketAddr {
    let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
    socket.local_addr().unwrap()
}

fn send(io: &mut dyn BatchIo, to: SocketAddr, payload: &[u8], stamp: Option<u64>) -> usize {
    let mut tx = TxBatch::new(1, 256);
    tx.push(to, payload).unwrap();
    if let Some(tag) = stamp {
        tx.request_stamp(0, tag);
    }
    io.send_batch(&tx).unwrap()
}

/// Wait (bounded) until the socket of `io` reports POLLERR: an error
/// queued or pending, nothing read or cleared.
fn wait_pollerr(io: &dyn BatchIo) {
    let end = Instant::now() + Duration::from_secs(5);
    loop {
        let mut pfd = libc::pollfd {
            fd: io.raw_fd(),
            events: 0,
            revents: 0,
        };
        // SAFETY: one live pollfd for the call.
        unsafe { libc::poll(&mut pfd, 1, 10) };
        if pfd.revents & libc::POLLERR != 0 {
            return;
        }
        assert!(Instant::now() < end, "no ICMP error arrived");
    }
}

/// Poll `io` for unreachable reports until one comes (bounded).
fn until_reported(io: &mut dyn BatchIo) -> Vec<IcmpUnreachable> {
    let end = Instant::now() + Duration::from_secs(5);
    let mut reports = Vec::new();
    while reports.is_empty() && Instant::now() < end {
        io.poll_unreachable(&mut reports).unwrap();
        std::thread::sleep(Duration::from_millis(5));
    }
    reports
}

fn port_unreachable(reports: &[IcmpUnreachable], to: SocketAddr) {
    assert_eq!(reports.len(), 1, "{reports:?}");
    let report = reports[0];
    assert_eq!(report.destination, to);
    assert_eq!(report.errno, libc::ECONNREFUSED);
    assert_eq!((report.icmp_type, report.icmp_code), (3, 3));
}

/// The port unreachable is reported with its destination, once; the
/// datagram sent to a live peer while the error is pending on the socket
/// is delivered (sent again, not counted as refused).
#[test]
fn a_port_unreachable_is_reported_and_costs_no_other_datagram() {
    for kind in BackendKind::usable() {
        let mut io = backend(kind, true, false);
        let dead = dead_port();
        let peer = UdpSocket::bind("127.0.0.1:0").unwrap();
        peer.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        assert_eq!(send(io.as_mut(), dead, b"to nobody", None), 1, "{kind}");
        wait_pollerr(io.as_ref());
        // The pending error fails this send once; it goes again.
        assert_eq!(
            send(io.as_mut(), peer.local_addr().unwrap(), b"hello", None),
            1,
            "{kind}"
        );
        let mut buf = [0u8; 64];
        let (len, _) = peer.recv_from(&mut buf).expect("the datagram to the peer");
        assert_eq!(&buf[..len], b"hello", "{kind}");
        assert_eq!(io.stats().tx_errors, 0, "{kind}");
        port_unreachable(&until_reported(io.as_mut()), dead);
        let mut more = Vec::new();
        io.poll_unreachable(&mut more).unwrap();
        assert!(more.is_empty(), "{kind}: {more:?}");
        let stats = io.stats();
        assert_eq!((stats.icmp_unreachable, stats.icmp_lost), (1, 0), "{kind}");
    }
}

/// A backend waiting for a datagram reads the error as it arrives and
/// returns, so that the caller takes the report without waiting for
/// traffic or for the receive timeout.
#[test]
fn a_waiting_receive_returns_for_an_icmp_error() {
    for kind in [BackendKind::Socket, BackendKind::Mmsg] {
        let mut io = backend(kind, true, false);
        let dead = dead_port();
        send(io.as_mut(), dead, b"to nobody", None);
        let mut rx = RxBatch::new(4, 256);
        let start = Instant::now();
        assert_eq!(
            io.recv_batch(&mut rx, Some(Duration::from_secs(20)))
                .unwrap(),
            0
        );
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "{kind}: the wait ran to its timeout"
        );
        let mut reports = Vec::new();
        io.poll_unreachable(&mut reports).unwrap();
        port_unreachable(&reports, dead);
    }
}

/// Without `recv_errors` an unconnected socket hears of no ICMP error.
#[test]
fn without_recv_errors_nothing_is_reported() {
    for kind in BackendKind::usable() {
        let mut io = backend(kind, false, false);
        let peer = UdpSocket::bind("127.0.0.1:0").unwrap();
        peer.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        send(io.as_mut(), dead_port(), b"to nobody", None);
        // The datagram to the peer after it is the sign the ICMP came.
        send(io.as_mut(), peer.local_addr().unwrap(), b"hello", None);
        let mut buf = [0u8; 64];
        peer.recv_from(&mut buf).expect("the datagram to the peer");
        std::thread::sleep(Duration::from_millis(20));
        let mut reports = Vec::new();
        io.poll_unreachable(&mut reports).unwrap();
        assert!(reports.is_empty(), "{kind}: {reports:?}");
    }
}

/// Until a TX stamp for tag `tag` comes back (bounded).
fn until_stamped(io: &mut dyn BatchIo, tag: u64) -> Vec<TxStamp> {
    let end = Instant::now() + Duration::from_secs(5);
    let mut stamps = Vec::new();
    while !stamps.iter().any(|s: &TxStamp| s.tag == tag) && Instant::now() < end {
        io.poll_tx_stamps(&mut stamps).unwrap();
        std::thread::sleep(Duration::from_millis(5));
    }
    stamps
}

/// One error queue holds both TX stamps and ICMP errors. A read for
/// stamps that meets an ICMP error keeps it for `poll_unreachable`; a
/// read for ICMP errors that meets a stamp files it for `poll_tx_stamps`.
#[test]
fn stamps_and_icmp_errors_share_the_error_queue_without_loss() {
    for kind in BackendKind::usable() {
        let peer = UdpSocket::bind("127.0.0.1:0").unwrap();
        let to_peer = peer.local_addr().unwrap();
        // The ICMP error is queued before the stamp: the read that finds
        // the stamp has read the error too.
        let mut io = backend(kind, true, true);
        let dead = dead_port();
        send(io.as_mut(), dead, b"to nobody", None);
        wait_pollerr(io.as_ref());
        send(io.as_mut(), to_peer, b"stamped", Some(7));
        let stamps = until_stamped(io.as_mut(), 7);
        assert!(stamps.iter().any(|s| s.tag == 7), "{kind}: {stamps:?}");
        let mut reports = Vec::new();
        io.poll_unreachable(&mut reports).unwrap();
        port_unreachable(&reports, dead);
        // The stamp is queued before the ICMP error: the read that finds
        // the error has read the stamp too.
        let mut io = backend(kind, true, true);
        send(io.as_mut(), to_peer, b"stamped", Some(8));
        send(io.as_mut(), dead, b"to nobody", None);
        port_unreachable(&until_reported(io.as_mut()), dead);
        let mut stamps = Vec::new();
        io.poll_tx_stamps(&mut stamps).unwrap();
        assert!(stamps.iter().any(|s| s.tag == 8), "{kind}: {stamps:?}");
    }
}
