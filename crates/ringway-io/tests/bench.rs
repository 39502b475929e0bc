//! The loopback benchmark accounts for every datagram (timings are not asserted).

use ringway_io::bench::{conclusion, render_table, run_one, Sender};
use ringway_io::BackendKind;

#[test]
fn every_datagram_is_received_or_counted_as_dropped() {
    let mut rows = Vec::new();
    for s in [
        Sender::Backend(BackendKind::Socket),
        Sender::Backend(BackendKind::Mmsg),
        Sender::Gso,
    ] {
        let r = run_one(s, 64, 0.2, 16).unwrap();
        assert!(r.sent > 0 && r.received > 0, "{r:?}");
        assert_eq!(r.received + r.socket_drops, r.sent, "{r:?}");
        assert_eq!(r.lost, r.socket_drops);
        assert!(r.send_ns_per_pkt > 0.0 && r.recv_ns_per_pkt > 0.0);
        rows.push(r);
    }
    // socket: one send syscall per datagram; mmsg: one per batch of 16.
    assert_eq!(rows[0].send_syscalls_per_pkt, 1.0);
    assert!(rows[1].send_syscalls_per_pkt <= 1.0 / 16.0 + 1e-9);
    let t = render_table(&rows);
    assert_eq!(t.lines().count(), 4);
    let c = conclusion(&rows);
    assert!(c.contains("mmsg receives") && c.contains("GSO"), "{c}");
}

#[test]
fn uring_path_accounts_for_every_datagram() {
    let r = run_one(Sender::Backend(BackendKind::Uring), 64, 0.2, 16).unwrap();
    assert_eq!(r.path, "uring");
    assert!(r.sent > 0 && r.received > 0, "{r:?}");
    assert_eq!(r.received + r.socket_drops, r.sent, "{r:?}");
    // One io_uring_enter per batch of 16 sends.
    assert!(r.send_syscalls_per_pkt <= 1.0 / 16.0 + 1e-9, "{r:?}");
    let m = run_one(Sender::Backend(BackendKind::Mmsg), 64, 0.2, 16).unwrap();
    let s = run_one(Sender::Backend(BackendKind::Socket), 64, 0.2, 16).unwrap();
    let c = conclusion(&[s, m, r]);
    assert!(c.contains("uring receives"), "{c}");
}

#[test]
fn bad_parameters_are_errors() {
    assert!(run_one(Sender::Gso, 0, 0.1, 8).is_err());
    assert!(run_one(Sender::Gso, 64, 0.1, 0).is_err());
    assert!(run_one(Sender::Gso, 64, 1e6, 8).is_err());
}
