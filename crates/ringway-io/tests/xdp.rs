//! The AF_XDP backend over a real veth pair between two namespace hosts:
//! exact payloads and peers both ways, the kernel still gets what the XDP
//! program passes (other ports, ARP, ping), and teardown leaves nothing.
//! Needs root (named namespaces, BPF); on a kernel without AF_XDP the
//! backend must refuse with a clear error, which is what is checked then.

mod xdp_common;

use ringway_io::netns::{Host, Topology};
use ringway_io::{open_backend, open_xdp, BackendKind, RxBatch, TxBatch, XdpConfig, XdpMode};
use std::net::{SocketAddr, SocketAddrV4, UdpSocket};
use std::process::Command;
use std::sync::mpsc;
use std::time::{Duration, Instant};

fn topo() -> Topology {
    Topology::builder()
        .host("a")
        .host("b")
        .link("a", "b")
        .build()
        .unwrap()
}

/// `ip -n NS link show DEV` text.
fn link_show(ns: &str, dev: &str) -> String {
    let o = Command::new("ip")
        .args(["-n", ns, "link", "show", "dev", dev])
        .output()
        .unwrap();
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// When the kernel has no AF_XDP, the backend must say so; returns true
/// when the full tests can run.
fn xdp_here() -> bool {
    if let Err(why) = ringway_io::backend::xdp_socket_supported() {
        let why = format!("AF_XDP not available on this kernel: {why}");
        let t = topo();
        let b = t.host("b").unwrap().clone();
        let bip = b.addr();
        let e = b
            .run(move || {
                open_xdp(XdpConfig::new("eth0", SocketAddrV4::new(bip, 0)))
                    .err()
                    .expect("must refuse")
            })
            .unwrap();
        assert!(
            e.to_string().starts_with("xdp backend not available"),
            "{e}"
        );
        ringway_io::testing::skip(why);
        return false;
    }
    true
}

/// Hosts a and b of a fresh veth pair (keep the `Topology` alive while
/// they are used), or `None` where this kernel has no AF_XDP.
fn pair() -> Option<(Topology, Host, Host)> {
    if !xdp_here() {
        return None;
    }
    Some(xdp_common::veth_pair(false))
}

#[test]
fn bad_options_are_clear_errors() {
    let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
    let e = open_backend(BackendKind::Xdp, sock).err().unwrap();
    assert!(e.to_string().contains("needs an interface"), "{e}");
    assert_eq!("xdp".parse::<BackendKind>().unwrap(), BackendKind::Xdp);
    assert!(BackendKind::Xdp.needs_interface());
    assert!(!BackendKind::ALL.contains(&BackendKind::Xdp));
    let local = SocketAddrV4::new([10, 0, 0, 1].into(), 0);
    for (cfg, want) in [
        (
            XdpConfig {
                frames: 100,
                ..XdpConfig::new("lo", local)
            },
            "power of two",
        ),
        (
            XdpConfig {
                frame_size: 1000,
                ..XdpConfig::new("lo", local)
            },
            "2048 or 4096",
        ),
        (
            XdpConfig::new("lo", SocketAddrV4::new([0, 0, 0, 0].into(), 0)),
            "own address",
        ),
        (
            XdpConfig::new("lo", "[::]:0".parse::<SocketAddr>().unwrap()),
            "own address",
        ),
    ] {
        let e = open_xdp(cfg).err().unwrap();
        assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput);
        assert!(e.to_string().starts_with("xdp backend: "), "{e}");
        assert!(e.to_string().contains(want), "{e}");
    }
    // An interface that does not exist (in a namespace with only lo).
    let t = topo();
    let b = t.host("b").unwrap().clone();
    let bip = b.addr();
    let e = b
        .run(move || {
            open_xdp(XdpConfig::new("nosuch0", SocketAddrV4::new(bip, 0)))
                .err()
                .unwrap()
        })
        .unwrap();
    assert!(e.to_string().contains("nosuch0"), "{e}");
}

#[test]
fn veth_roundtrip_exact_and_kernel_keeps_the_rest() {
    let Some((t, a, b)) = pair() else {
        return;
    };
    let (aip, bip) = (a.addr(), b.addr());
    let (bns, ans) = (b.netns.clone(), a.netns.clone());
    let (port_tx, port_rx) = mpsc::channel();
    let (go_tx, go_rx) = mpsc::channel::<()>();
    // Host b: the backend on b's veth; receive 20 datagrams, reply to each,
    // then hold the program attached until told to stop.
    let server = b.spawn(move || {
        let mut io = open_xdp(XdpConfig::new("eth0", SocketAddrV4::new(bip, 0))).unwrap();
        assert_eq!(io.kind(), BackendKind::Xdp);
        let local = io.local_addr().unwrap();
        port_tx.send(local.port()).unwrap();
        let mut got = Vec::new();
        let mut rx = RxBatch::new(8, 2048);
        let end = Instant::now() + Duration::from_secs(10);
        while got.len() < 20 && Instant::now() < end {
            io.recv_batch(&mut rx, Some(Duration::from_millis(100)))
                .unwrap();
            for d in rx.iter() {
                // The XDP program's stamp, on CLOCK_REALTIME, before the
                // application got the frame (and not long before).
                let k = d.meta.kernel_rx.expect("RX stamp from the XDP metadata");
                assert!(k <= d.meta.app_rx, "{k:?} {:?}", d.meta.app_rx);
                assert!(d.meta.app_rx.0 - k.0 < 1_000_000_000);
                assert!(!d.meta.truncated);
                got.push((d.meta.peer, d.data.to_vec()));
            }
        }
        let mut tx = TxBatch::new(32, 2048);
        for (peer, data) in &got {
            let mut r = b"re:".to_vec();
            r.extend_from_slice(data);
            tx.push(*peer, &r).unwrap();
        }
        assert_eq!(io.send_batch(&tx).unwrap(), got.len());
        go_rx.recv().unwrap();
        (got, io.stats())
    });
    let port = port_rx.recv_timeout(Duration::from_secs(10)).unwrap();
    let dst = SocketAddr::V4(SocketAddrV4::new(bip, port));
    // The program is attached in native (driver) mode while the backend
    // lives: veth has XDP in its NAPI poll.
    let shown = link_show(&bns, "eth0");
    assert!(
        shown.contains("prog/xdp ") && !shown.contains("xdpgeneric"),
        "{shown}"
    );
    // A kernel UDP socket in b on another port still receives.
    let other = xdp_common::kernel_socket(&b, bip.into());
    let other_addr = other.local_addr().unwrap();
    let client = a.spawn(move || xdp_common::numbered_exchange(aip.into(), dst, other_addr));
    let (me, sent, replies) = client.join().unwrap().unwrap();
    let mut buf = [0u8; 64];
    let (n, from) = other.recv_from(&mut buf).unwrap();
    assert_eq!((&buf[..n], from), (&b"kernel path"[..], me));
    // ARP and ICMP still work while the program is attached: a resolved b's
    // MAC (b's kernel answered ARP), and a datagram to a closed port of b
    // comes back as ICMP port unreachable (ECONNREFUSED on a connected socket).
    let neigh = Command::new("ip")
        .args(["-n", &ans, "neigh", "show", &bip.to_string()])
        .output()
        .unwrap();
    let neigh = String::from_utf8_lossy(&neigh.stdout).into_owned();
    assert!(neigh.contains("lladdr"), "{neigh:?}");
    let closed = b
        .run(move || UdpSocket::bind((bip, 0)).unwrap().local_addr().unwrap())
        .unwrap();
    let refused = a
        .run(move || {
            let s = UdpSocket::bind((aip, 0)).unwrap();
            s.connect(closed).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
            s.send(b"nobody here").unwrap();
            s.recv(&mut [0u8; 16]).unwrap_err().kind()
        })
        .unwrap();
    assert_eq!(refused, std::io::ErrorKind::ConnectionRefused);
    go_tx.send(()).unwrap();
    let (got, stats) = server.join().unwrap().unwrap();
    // Exact payloads, in order, from the client's address and port.
    assert_eq!(got.len(), 20);
    for ((peer, data), p) in got.iter().zip(&sent) {
        assert_eq!(*peer, me);
        assert_eq!(data, p);
    }
    for ((from, data), p) in replies.iter().zip(&sent) {
        assert_eq!(*from, dst);
        let mut want = b"re:".to_vec();
        want.extend_from_slice(p);
        assert_eq!(data, &want);
    }
    assert_eq!(stats.rx_packets, 20);
    assert_eq!(stats.rx_via_socket, 0);
    assert_eq!(stats.tx_packets, 20);
    // The client's MAC was learnt from its frames: nothing went the kernel way.
    assert_eq!(stats.tx_via_socket, 0);
    assert_eq!(stats.tx_errors, 0);
    // Dropping the backend detached the program.
    assert!(
        !link_show(&bns, "eth0").contains("xdp"),
        "{}",
        link_show(&bns, "eth0")
    );
    let names = t.netns_names();
    drop(t);
    let left = ringway_io::netns::list_netns().unwrap();
    assert!(names.iter().all(|n| !left.contains(n)), "{left:?}");
}

/// A reply to a peer whose MAC the backend never saw nor finds in the
/// neighbour table goes through the companion socket (and arrives).
#[test]
fn unknown_neighbour_falls_back_to_the_socket() {
    let Some((_t, a, b)) = pair() else {
        return;
    };
    let (aip, bip) = (a.addr(), b.addr());
    let listener = a
        .run(move || {
            let s = UdpSocket::bind((aip, 0)).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            s
        })
        .unwrap();
    let to = listener.local_addr().unwrap();
    let stats = b
        .run(move || {
            let mut io = open_xdp(XdpConfig::new("eth0", SocketAddrV4::new(bip, 0))).unwrap();
            let mut tx = TxBatch::new(2, 256);
            tx.push(to, b"first").unwrap();
            assert_eq!(io.send_batch(&tx).unwrap(), 1);
            io.stats()
        })
        .unwrap();
    assert_eq!(stats.tx_via_socket, 1);
    let mut buf = [0u8; 64];
    let (n, from) = listener.recv_from(&mut buf).unwrap();
    assert_eq!(&buf[..n], b"first");
    assert_eq!(from.ip(), std::net::IpAddr::V4(bip));
}

#[test]
fn availability_probe_agrees() {
    if !xdp_here() {
        return;
    }
    BackendKind::Xdp.availability().unwrap();
    // The active probe (namespaces, veth, one datagram each way) too.
    ringway_io::backend::xdp_veth_probe().unwrap();
}

/// With the smallest UMEM (8 receive and 8 send frames) 300 ping-pongs
/// wrap every ring many times; each reply is exact.
#[test]
fn small_umem_rings_wrap_around() {
    const N: usize = 300;
    let Some((_t, a, b)) = pair() else {
        return;
    };
    let (aip, bip) = (a.addr(), b.addr());
    let (port_tx, port_rx) = mpsc::channel();
    let server = b.spawn(move || {
        let cfg = XdpConfig {
            frames: 16,
            ..XdpConfig::new("eth0", SocketAddrV4::new(bip, 0))
        };
        let mut io = open_xdp(cfg).unwrap();
        port_tx.send(io.local_addr().unwrap().port()).unwrap();
        let mut rx = RxBatch::new(4, 2048);
        let mut tx = TxBatch::new(4, 2048);
        let mut n = 0;
        let end = Instant::now() + Duration::from_secs(20);
        while n < N && Instant::now() < end {
            io.recv_batch(&mut rx, Some(Duration::from_millis(100)))
                .unwrap();
            tx.clear();
            for d in rx.iter() {
                tx.push(d.meta.peer, d.data).unwrap();
            }
            n += io.send_batch(&tx).unwrap();
        }
        io.stats()
    });
    let port = port_rx.recv_timeout(Duration::from_secs(10)).unwrap();
    let dst = SocketAddr::V4(SocketAddrV4::new(bip, port));
    a.run(move || {
        let s = UdpSocket::bind((aip, 0)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut buf = [0u8; 2048];
        for i in 0..N {
            let msg = format!("ping {i} {}", "x".repeat(i % 1400));
            s.send_to(msg.as_bytes(), dst).unwrap();
            let (n, from) = s.recv_from(&mut buf).expect("echo");
            assert_eq!(from, dst);
            assert_eq!(&buf[..n], msg.as_bytes());
        }
    })
    .unwrap();
    let st = server.join().unwrap().unwrap();
    assert_eq!((st.rx_packets, st.tx_packets), (N as u64, N as u64));
    assert_eq!((st.rx_dropped, st.tx_errors, st.rx_invalid), (0, 0, 0));
}

/// A datagram larger than the MTU arrives as IP fragments, which the
/// program leaves to the kernel: it is reassembled and received exactly
/// through the companion socket.
#[test]
fn fragments_take_the_kernel_path() {
    let Some((_t, a, b)) = pair() else {
        return;
    };
    let (aip, bip) = (a.addr(), b.addr());
    let (port_tx, port_rx) = mpsc::channel();
    let server = b.spawn(move || {
        let mut io = open_xdp(XdpConfig::new("eth0", SocketAddrV4::new(bip, 0))).unwrap();
        port_tx.send(io.local_addr().unwrap().port()).unwrap();
        let mut rx = RxBatch::new(4, 4096);
        let end = Instant::now() + Duration::from_secs(10);
        let mut got = Vec::new();
        while got.len() < 2 && Instant::now() < end {
            io.recv_batch(&mut rx, Some(Duration::from_millis(100)))
                .unwrap();
            got.extend(rx.iter().map(|d| (d.meta.peer, d.data.to_vec())));
        }
        (got, io.stats())
    });
    let port = port_rx.recv_timeout(Duration::from_secs(10)).unwrap();
    let dst = SocketAddr::V4(SocketAddrV4::new(bip, port));
    let big = xdp_common::big_payload();
    let big2 = big.clone();
    let me = a
        .run(move || {
            xdp_common::send_small_then_big(aip.into(), dst, &big2)
                .local_addr()
                .unwrap()
        })
        .unwrap();
    let (got, st) = server.join().unwrap().unwrap();
    assert_eq!(got, vec![(me, b"small".to_vec()), (me, big)]);
    assert_eq!(st.rx_via_socket, 1);
    assert_eq!(st.rx_packets, 2);
}

/// `ip -n NS ARGS...`, which must succeed.
fn ip_in(ns: &str, args: &[&str]) {
    let o = Command::new("ip")
        .arg("-n")
        .arg(ns)
        .args(args)
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "ip -n {ns} {args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
}

/// Native (driver) mode where the driver has XDP (veth), generic mode as
/// the fallback where it has none (a bridge device); `Native` alone refuses
/// such a device, `Generic` alone is honoured on veth; the doctor's native
/// probe says yes on this kernel.
#[test]
fn native_mode_with_fallback_to_generic() {
    let Some((_t, _a, b)) = pair() else {
        return;
    };
    let bns = b.netns.clone();
    ip_in(&bns, &["link", "add", "d0", "type", "bridge"]);
    ip_in(&bns, &["addr", "add", "10.78.0.1/24", "dev", "d0"]);
    ip_in(&bns, &["link", "set", "d0", "up"]);
    let bip = b.addr();
    let (bns2, bns3) = (bns.clone(), bns.clone());
    b.run(move || {
        let dummy = SocketAddrV4::new([10, 78, 0, 1].into(), 0);
        // veth: native.
        let io = open_xdp(XdpConfig::new("eth0", SocketAddrV4::new(bip, 0))).unwrap();
        assert!(io.describe().contains("native XDP"), "{}", io.describe());
        let shown = link_show(&bns2, "eth0");
        assert!(
            shown.contains("prog/xdp ") && !shown.contains("xdpgeneric"),
            "{shown}"
        );
        drop(io);
        // veth, generic asked for: generic.
        let io = open_xdp(XdpConfig {
            mode: XdpMode::Generic,
            ..XdpConfig::new("eth0", SocketAddrV4::new(bip, 0))
        })
        .unwrap();
        assert!(io.describe().contains("generic XDP"), "{}", io.describe());
        assert!(link_show(&bns2, "eth0").contains("xdpgeneric"));
        drop(io);
        // bridge: no driver XDP. Auto falls back to generic...
        let io = open_xdp(XdpConfig::new("d0", dummy)).unwrap();
        assert!(io.describe().contains("generic XDP"), "{}", io.describe());
        let shown = link_show(&bns3, "d0");
        assert!(shown.contains("xdpgeneric"), "{shown}");
        drop(io);
        assert!(!link_show(&bns3, "d0").contains("xdp"));
        // ...and native alone is refused with the reason.
        let e = open_xdp(XdpConfig {
            mode: XdpMode::Native,
            ..XdpConfig::new("d0", dummy)
        })
        .err()
        .expect("a bridge has no native XDP");
        assert!(e.to_string().contains("XDP_FLAGS_DRV_MODE"), "{e}");
    })
    .unwrap();
    let rep = ringway_io::doctor::run();
    let c = rep
        .check("XDP native mode (veth)")
        .expect("the doctor checks native mode");
    assert!(c.ok, "{}", c.detail);
}

/// The echo server's thread: (message, datagrams sent through the
/// companion socket so far) per message.
type Echo = std::thread::JoinHandle<std::io::Result<Vec<(Vec<u8>, u64)>>>;

/// Echo server on b's veth for the neighbour test: replies to every
/// datagram, and records after each reply how many datagrams so far went
/// through the companion socket (destination MAC unknown). Stops at "end".
fn echo_recording_via_socket(b: &Host) -> (u16, Echo) {
    let (port_tx, port_rx) = mpsc::channel();
    let bip = b.addr();
    let server = b.spawn(move || {
        let mut io = open_xdp(XdpConfig::new("eth0", SocketAddrV4::new(bip, 0))).unwrap();
        port_tx.send(io.local_addr().unwrap().port()).unwrap();
        let mut rx = RxBatch::new(8, 2048);
        let mut out = Vec::new();
        let end = Instant::now() + Duration::from_secs(20);
        while Instant::now() < end {
            io.recv_batch(&mut rx, Some(Duration::from_millis(50)))
                .unwrap();
            let mut tx = TxBatch::new(8, 2048);
            for d in rx.iter() {
                tx.push(d.meta.peer, d.data).unwrap();
            }
            io.send_batch(&tx).unwrap();
            for d in rx.iter() {
                out.push((d.data.to_vec(), io.stats().tx_via_socket));
                if d.data == b"end" {
                    return out;
                }
            }
        }
        out
    });
    (
        port_rx.recv_timeout(Duration::from_secs(10)).unwrap(),
        server,
    )
}

/// Destination MACs come from the kernel's neighbour table only: a frame
/// from an address the kernel has no entry for teaches the backend nothing
/// (the reply goes through the kernel, which resolves it), and an entry
/// the kernel drops is dropped by the backend too (aged out).
#[test]
fn neighbours_not_learned_from_frames_and_aged_out() {
    let Some((_t, a, b)) = pair() else {
        return;
    };
    // A second address on a's veth, which b's kernel has never seen.
    let other = std::net::Ipv4Addr::new(10, 77, 1, 9);
    ip_in(&a.netns, &["addr", "add", "10.77.1.9/24", "dev", "eth0"]);
    let (port, server) = echo_recording_via_socket(&b);
    let dst = SocketAddr::V4(SocketAddrV4::new(b.addr(), port));
    let (aip, bns) = (a.addr(), b.netns.clone());
    a.run(move || {
        let main = UdpSocket::bind((aip, 0)).unwrap();
        let second = UdpSocket::bind((other, 0)).unwrap();
        for s in [&main, &second] {
            s.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
        }
        let ping = |s: &UdpSocket, msg: &[u8]| {
            s.send_to(msg, dst).unwrap();
            let mut buf = [0u8; 64];
            let (n, from) = s.recv_from(&mut buf).expect("echo");
            assert_eq!((from, &buf[..n]), (dst, msg));
        };
        ping(&main, b"p1"); // b's kernel learnt a's main address by ARP
        ping(&second, b"s1"); // a frame from .9, which nobody resolved
        ping(&second, b"s2"); // the kernel resolved .9 for the reply to s1
                              // The kernel forgets .9; the backend must follow within its refresh.
        let o = Command::new("ip")
            .args(["-n", &bns, "neigh", "del", "10.77.1.9", "dev", "eth0"])
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        std::thread::sleep(Duration::from_millis(1300));
        ping(&second, b"s3");
        main.send_to(b"end", dst).unwrap();
    })
    .unwrap();
    let got = server.join().unwrap().unwrap();
    let via: Vec<(&[u8], u64)> = got.iter().map(|(m, v)| (m.as_slice(), *v)).collect();
    assert_eq!(
        via[..4],
        [
            (&b"p1"[..], 0), // known from the kernel: through the XSK
            (&b"s1"[..], 1), // not learnt from the frame: through the kernel
            (&b"s2"[..], 1), // the kernel's entry now: through the XSK
            (&b"s3"[..], 2), // aged out with the kernel's: through the kernel
        ]
    );
}

/// The UDP checksum of every received frame is verified: a frame whose
/// payload was corrupted after its checksum was computed is dropped and
/// counted, never forwarded (under a fresh checksum); a good one and one
/// without a checksum (0) are received. Frames are built by hand and sent
/// from a raw socket in a.
#[test]
fn udp_checksums_verified_on_receive() {
    let Some((_t, a, b)) = pair() else {
        return;
    };
    let bip = b.addr();
    let (port_tx, port_rx) = mpsc::channel();
    let server = b.spawn(move || {
        let mut io = open_xdp(XdpConfig::new("eth0", SocketAddrV4::new(bip, 0))).unwrap();
        port_tx.send(io.local_addr().unwrap().port()).unwrap();
        let mut rx = RxBatch::new(8, 2048);
        let mut got = Vec::new();
        let end = Instant::now() + Duration::from_secs(10);
        while Instant::now() < end && !got.iter().any(|g: &Vec<u8>| g == b"end") {
            io.recv_batch(&mut rx, Some(Duration::from_millis(50)))
                .unwrap();
            got.extend(rx.iter().map(|d| d.data.to_vec()));
        }
        (got, io.stats())
    });
    let port = port_rx.recv_timeout(Duration::from_secs(10)).unwrap();
    let aip = a.addr();
    a.run(move || xdp_common::send_checksum_cases(aip.into(), bip.into(), port))
        .unwrap();
    let (got, st) = server.join().unwrap().unwrap();
    assert_eq!(
        got,
        vec![b"good".to_vec(), b"no checksum".to_vec(), b"end".to_vec()]
    );
    assert_eq!((st.rx_bad_checksum, st.rx_invalid), (1, 1));
}
