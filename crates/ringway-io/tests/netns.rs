//! Namespace helpers: traffic flows inside, nothing is left behind.

use ringway_io::netns::{self, Topology};
use ringway_io::{open_backend, open_udp, BackendKind, RxBatch, SocketConfig, TxBatch};
use std::net::{SocketAddr, UdpSocket};
use std::process::Command;
use std::time::Duration;

fn root_veths() -> Vec<String> {
    let out = Command::new("ip")
        .args(["-o", "link", "show", "type", "veth"])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split(':').nth(1).map(|s| s.trim().to_string()))
        .collect()
}

fn assert_gone(names: &[String]) {
    let live = netns::list_netns().unwrap();
    for n in names {
        assert!(!live.contains(n), "{n} still listed: {live:?}");
        assert!(!std::path::Path::new(&format!("/run/netns/{n}")).exists());
    }
}

/// Send one datagram from host `from` to host `to` and get it back there.
fn udp_across(topo: &Topology, from: &str, to: &str) {
    let dst_ip = topo.host(to).unwrap().addr();
    let (ready_tx, ready_rx) = std::sync::mpsc::channel::<SocketAddr>();
    let rx_thread = topo.host(to).unwrap().spawn(move || {
        let (s, _) = open_udp(&SocketConfig::new(SocketAddr::new(dst_ip.into(), 0))).unwrap();
        ready_tx.send(s.local_addr().unwrap()).unwrap();
        let mut io = open_backend(BackendKind::Mmsg, s).unwrap();
        let mut rx = RxBatch::new(4, 256);
        io.recv_batch(&mut rx, Some(Duration::from_secs(5)))
            .unwrap();
        rx.get(0)
            .map(|d| (d.meta.peer, d.data.to_vec(), d.meta.kernel_rx.is_some()))
    });
    let dst = ready_rx.recv().unwrap();
    topo.host(from)
        .unwrap()
        .run(move || {
            let (s, _) = open_udp(&SocketConfig::new("0.0.0.0:0".parse().unwrap())).unwrap();
            let mut io = open_backend(BackendKind::Socket, s).unwrap();
            let mut tx = TxBatch::new(1, 64);
            tx.push(dst, b"across").unwrap();
            assert_eq!(io.send_batch(&tx).unwrap(), 1);
        })
        .unwrap();
    let (peer, data, stamped) = rx_thread
        .join()
        .unwrap()
        .unwrap()
        .expect("datagram arrived");
    assert_eq!(data, b"across");
    assert_eq!(
        peer.ip(),
        std::net::IpAddr::V4(topo.host(from).unwrap().addr())
    );
    assert!(stamped);
}

#[test]
fn point_to_point_carries_udp_and_cleans_up() {
    let topo = Topology::builder()
        .host("a")
        .host("b")
        .link("a", "b")
        .build()
        .unwrap();
    let names = topo.netns_names();
    assert_eq!(names.len(), 2);
    assert!(names
        .iter()
        .all(|n| n.starts_with(&ringway_io::netns::own_prefix())));
    assert_eq!(topo.host("a").unwrap().addr().octets()[..2], [10, 77]);
    udp_across(&topo, "a", "b");
    udp_across(&topo, "b", "a");
    // A command inside a host sees its own interface and address.
    let out = topo
        .host("a")
        .unwrap()
        .command("ip")
        .args(["-o", "addr", "show", "dev", "eth0"])
        .output()
        .unwrap();
    assert!(out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stdout).contains(&topo.host("a").unwrap().addr().to_string())
    );
    drop(topo);
    assert_gone(&names);
    // veth ends are created inside the namespaces: none ever shows up in the root namespace.
    let ours: Vec<String> = vec!["eth0".into(), "eth1".into()];
    assert!(
        root_veths().iter().all(|v| !ours.contains(v)),
        "{:?}",
        root_veths()
    );
}

#[test]
fn bridge_joins_three_hosts() {
    let topo = Topology::builder()
        .host("x")
        .host("y")
        .host("z")
        .bridge()
        .build()
        .unwrap();
    let names = topo.netns_names();
    assert_eq!(names.len(), 4, "three hosts and the switch");
    udp_across(&topo, "x", "z");
    udp_across(&topo, "y", "x");
    drop(topo);
    assert_gone(&names);
}

#[test]
fn teardown_on_panic() {
    let names = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let n2 = names.clone();
    let r = std::panic::catch_unwind(move || {
        let topo = Topology::builder()
            .host("p")
            .host("q")
            .link("p", "q")
            .build()
            .unwrap();
        *n2.lock().unwrap() = topo.netns_names();
        panic!("test panic inside a topology");
    });
    assert!(r.is_err());
    let names = names.lock().unwrap().clone();
    assert_eq!(names.len(), 2);
    assert_gone(&names);
}

#[test]
fn bad_builds_fail_cleanly() {
    assert!(Topology::builder().host("a").host("a").build().is_err());
    assert!(Topology::builder().host("bad name").build().is_err());
    // Link to an unknown host: fails after the namespace was created, which must be removed.
    assert!(Topology::builder()
        .host("orphan")
        .link("orphan", "nope")
        .build()
        .is_err());
    let mine = ringway_io::netns::own_prefix();
    let left: Vec<_> = netns::list_netns()
        .unwrap()
        .into_iter()
        .filter(|n| n.starts_with(&mine) && n.ends_with("-orphan"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
}

#[test]
fn private_netns_has_only_lo() {
    let mut c = Command::new("ip");
    c.args(["-o", "link"]);
    let out = netns::command_in_private_netns(c).unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert_eq!(text.lines().count(), 1, "{text}");
    assert!(text.contains("lo:") && text.contains("UP"), "{text}");
    // And UDP on loopback works inside.
    let got = netns::in_private_netns(|| {
        let a = UdpSocket::bind("127.0.0.1:0").unwrap();
        let b = UdpSocket::bind("127.0.0.1:0").unwrap();
        a.send_to(b"in", b.local_addr().unwrap()).unwrap();
        let mut buf = [0u8; 8];
        b.recv(&mut buf).unwrap()
    })
    .unwrap();
    assert_eq!(got, 2);
}

#[test]
fn cleanup_removes_only_dead_owners() {
    // A namespace named as if created by a process that has exited.
    let mut child = Command::new("true").spawn().unwrap();
    let dead = child.id();
    child.wait().unwrap();
    let stale = format!("rw-{dead}-0-stale");
    assert!(Command::new("ip")
        .args(["netns", "add", &stale])
        .status()
        .unwrap()
        .success());
    let topo = Topology::builder().host("live").build().unwrap();
    let removed = netns::cleanup_leftovers(false).unwrap();
    assert!(removed.contains(&stale), "{removed:?}");
    let live = netns::list_netns().unwrap();
    assert!(!live.contains(&stale));
    assert!(
        live.contains(&topo.host("live").unwrap().netns),
        "live topology untouched"
    );
    drop(topo);
}
