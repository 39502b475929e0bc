//! The embeddable SIP server end to end on loopback: start, answer a
//! REGISTER (the registrar answers locally, nothing is forwarded), report
//! it in the snapshot and the final summary, and release its port on
//! shutdown and on drop; with receive coalescing, handle a spread burst in
//! a few wake-ups.

use ringway_server::sip::{RxModel, SipServer, SipServerConfig};
use std::net::{SocketAddr, UdpSocket};
use std::time::Duration;

fn config(workers: usize, rx_model: RxModel) -> SipServerConfig {
    SipServerConfig {
        listen: SocketAddr::from(([127, 0, 0, 1], 0)),
        workers,
        rx_model,
        registrar: true,
        domains: vec!["example.test".into()],
        ..SipServerConfig::default()
    }
}

fn register(client: &UdpSocket, server: SocketAddr, call_id: &str) -> String {
    send_register(client, server, call_id);
    read_answer(client, server)
}

fn send_register(client: &UdpSocket, server: SocketAddr, call_id: &str) {
    let me = client.local_addr().unwrap();
    let msg = format!(
        "REGISTER sip:example.test SIP/2.0\r\n\
         Via: SIP/2.0/UDP {me};branch=z9hG4bK-{call_id}\r\n\
         Max-Forwards: 70\r\n\
         From: <sip:alice@example.test>;tag=a1\r\n\
         To: <sip:alice@example.test>\r\n\
         Call-ID: {call_id}\r\n\
         CSeq: 1 REGISTER\r\n\
         Contact: <sip:alice@{me}>\r\n\
         Expires: 60\r\n\
         Content-Length: 0\r\n\r\n"
    );
    client.send_to(msg.as_bytes(), server).unwrap();
}

fn read_answer(client: &UdpSocket, server: SocketAddr) -> String {
    let mut buf = [0u8; 4096];
    let (n, from) = client.recv_from(&mut buf).expect("a response");
    assert_eq!(from, server);
    String::from_utf8_lossy(&buf[..n]).into_owned()
}

fn client() -> UdpSocket {
    let c = UdpSocket::bind("127.0.0.1:0").unwrap();
    c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    c
}

#[test]
fn registers_reports_and_shuts_down() {
    for rx_model in [RxModel::Shared, RxModel::Reuseport] {
        let server = SipServer::start(config(2, rx_model)).unwrap();
        let addr = server.local_addr();
        assert_ne!(addr.port(), 0);
        let c = client();
        let reply = register(&c, addr, "srv-1");
        assert!(reply.starts_with("SIP/2.0 200"), "{reply}");
        assert!(reply.contains("Contact: <sip:alice@"), "{reply}");
        assert_eq!(server.proxy().stats().bindings, Some(1));
        let snap = server.snapshot();
        assert_eq!(snap.per_worker_in.len(), 2);
        let summary = server.shutdown();
        // The final copies: every thread published when it ended.
        assert_eq!(summary.messages.in_, 1, "{rx_model:?}");
        assert_eq!(summary.messages.per_worker_in.iter().sum::<u64>(), 1);
        assert_eq!(summary.actions.responded.get(&200), Some(&1));
        assert_eq!(summary.by_type.get("REGISTER").map(|t| t.count), Some(1));
        // The port is free again: every socket was closed.
        UdpSocket::bind(addr).expect("port released after shutdown");
    }
}

#[test]
fn drop_stops_the_threads_and_releases_the_port() {
    let server = SipServer::start(config(2, RxModel::Reuseport)).unwrap();
    let addr = server.local_addr();
    drop(server);
    UdpSocket::bind(addr).expect("port released after drop");
}

#[test]
fn bad_configuration_is_an_error_not_a_panic() {
    let mut c = config(0, RxModel::Shared);
    assert!(SipServer::start(c.clone()).is_err());
    c.workers = 1;
    c.batch = 0;
    assert!(SipServer::start(c).is_err());
}

/// Receive coalescing (`rx_coalesce`): 100 REGISTERs sent about 1 ms
/// apart, far more than two per 20 ms window, are handled by far fewer
/// wake-ups of the worker than datagrams (without coalescing each one,
/// coming alone, wakes it: about 100), every one is answered, and the
/// wake-ups and windows are in the summary.
#[test]
fn receive_coalescing_handles_a_spread_burst_in_fewer_wakeups() {
    const BURST: usize = 100;
    let server = SipServer::start(SipServerConfig {
        rx_coalesce: Some(Duration::from_millis(20)),
        ..config(1, RxModel::Reuseport)
    })
    .unwrap();
    let addr = server.local_addr();
    let c = client();
    for n in 0..BURST {
        send_register(&c, addr, &format!("co-{n}"));
        std::thread::sleep(Duration::from_millis(1));
    }
    for _ in 0..BURST {
        let reply = read_answer(&c, addr);
        assert!(reply.starts_with("SIP/2.0 200"), "{reply}");
    }
    let summary = server.shutdown();
    let messages = &summary.messages;
    assert_eq!(messages.in_, BURST as u64);
    assert_eq!(summary.actions.responded.get(&200), Some(&(BURST as u64)));
    // The first 32 datagrams (two per window over 16 windows) prove the
    // rate and are handled one by one; the rest come during windows and
    // are taken a window's worth at a time. A loaded machine may stretch
    // the burst: room for that.
    assert!(
        messages.wakeups <= 60,
        "{} wake-ups for {} datagrams",
        messages.wakeups,
        messages.in_
    );
    assert!(messages.rx_coalesce_windows >= 1, "{messages:?}");
    assert_eq!(summary.config.rx_coalesce_us, 20_000);
}

#[test]
fn without_coalescing_each_datagram_alone_is_a_wakeup_of_its_own() {
    let server = SipServer::start(config(1, RxModel::Reuseport)).unwrap();
    let addr = server.local_addr();
    let c = client();
    for n in 0..3 {
        // One at a time: each answered before the next is sent.
        let reply = register(&c, addr, &format!("one-{n}"));
        assert!(reply.starts_with("SIP/2.0 200"), "{reply}");
    }
    let summary = server.shutdown();
    assert_eq!(summary.messages.in_, 3);
    assert_eq!(summary.messages.wakeups, 3);
    assert_eq!(summary.messages.rx_coalesce_windows, 0);
    assert_eq!(summary.config.rx_coalesce_us, 0);
}
