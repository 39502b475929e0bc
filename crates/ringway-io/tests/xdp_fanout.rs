//! The in-kernel fan-out (a SCHED_CLS program on the SFU veth's tcx
//! ingress, `bpf_clone_redirect` from a map) on a bridge of namespace
//! hosts: a verified sender's RTP reaches every subscriber byte for byte
//! from the SFU's address and comes back as the echo; anything the map does
//! not cover — another SSRC, the right SSRC from another address — goes up
//! the stack to a socket as before. Needs root; namespaces are removed.

use ringway_io::backend::{disable_tx_checksum_offload, FanoutRoute, KernelFanout};
use ringway_io::netns::Topology;
use std::net::{SocketAddr, SocketAddrV4, UdpSocket};
use std::time::Duration;

fn rtp(ssrc: u32, pt: u8, seq: u16) -> Vec<u8> {
    let mut b = vec![0x80, pt, 0, 0, 0, 0, 0, 9];
    b[2..4].copy_from_slice(&seq.to_be_bytes());
    b.extend_from_slice(&ssrc.to_be_bytes());
    b.extend((0..61u8).map(|i| i.wrapping_mul(7)));
    b
}

#[test]
fn kernel_fanout_replicates_verified_media_and_passes_the_rest() {
    if ringway_io::backend::xdp_socket_supported().is_err() {
        ringway_io::testing::skip("no AF_XDP/BPF here");
        return;
    }
    let t = Topology::builder()
        .host("sfu")
        .host("c0")
        .host("c1")
        .host("c2")
        .bridge()
        .build()
        .unwrap();
    let hosts: Vec<_> = ["sfu", "c0", "c1", "c2"]
        .iter()
        .map(|h| t.host(h).unwrap().clone())
        .collect();
    // Clients: full checksums, and one socket each (bound in its host).
    let socks: Vec<UdpSocket> = hosts[1..]
        .iter()
        .map(|h| {
            let ip = h.addr();
            h.run(move || {
                disable_tx_checksum_offload("eth0").unwrap();
                let s = UdpSocket::bind((ip, 0)).unwrap();
                s.set_read_timeout(Some(Duration::from_millis(500)))
                    .unwrap();
                s
            })
            .unwrap()
        })
        .collect();
    let addrs: Vec<SocketAddr> = socks.iter().map(|s| s.local_addr().unwrap()).collect();
    // The SFU's user-space socket: what the program passes lands here.
    let sfu = hosts[0].clone();
    let sip = sfu.addr();
    let user = sfu
        .run(move || {
            let s = UdpSocket::bind((sip, 0)).unwrap();
            s.set_read_timeout(Some(Duration::from_millis(500)))
                .unwrap();
            s
        })
        .unwrap();
    let local = match user.local_addr().unwrap() {
        SocketAddr::V4(a) => a,
        _ => unreachable!(),
    };
    // Every client talks to the SFU once first (ARP both ways, as a
    // registration would), and the SFU's user socket hears them.
    for s in &socks {
        s.send_to(b"hello", local).unwrap();
        let mut b = [0u8; 64];
        user.recv_from(&mut b).unwrap();
    }
    let route = FanoutRoute {
        ssrc: 7,
        pt: 96,
        src: addrs[0],
        dsts: vec![addrs[1], addrs[2]],
        echo: true,
    };
    let (stop_tx, stop_rx) = std::sync::mpsc::channel::<()>();
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let control = sfu.spawn(move || {
        let mut f = KernelFanout::attach("eth0", local).unwrap();
        // The neighbour table is read when due: retry until installed.
        for _ in 0..100 {
            if f.sync(std::slice::from_ref(&route)).unwrap() == 1 {
                break;
            }
            std::thread::sleep(Duration::from_millis(30));
        }
        ready_tx.send(f.stats().entries).unwrap();
        stop_rx.recv().unwrap();
        let before = f.stats();
        // Removing the route keeps its counters.
        assert_eq!(f.sync(&[]).unwrap(), 0);
        let after = f.stats();
        assert_eq!(
            (after.packets, after.delay_sum_ns),
            (before.packets, before.delay_sum_ns)
        );
        after
    });
    assert_eq!(ready_rx.recv_timeout(Duration::from_secs(10)).unwrap(), 1);
    let mut buf = [0u8; 2048];
    for seq in 0..20u16 {
        let p = rtp(7, 96, seq);
        socks[0].send_to(&p, local).unwrap();
        for (i, s) in socks.iter().enumerate() {
            let (n, from) = s
                .recv_from(&mut buf)
                .unwrap_or_else(|e| panic!("client {i}: {e}"));
            assert_eq!(from, SocketAddr::V4(local), "client {i}");
            assert_eq!(&buf[..n], &p[..], "client {i}");
        }
    }
    // Not in the map: another payload type, and SSRC 7 from c1.
    for (s, p) in [(&socks[0], rtp(7, 97, 1)), (&socks[1], rtp(7, 96, 2))] {
        s.send_to(&p, local).unwrap();
        let (n, from) = user.recv_from(&mut buf).expect("passed to the stack");
        assert_eq!((&buf[..n], from), (&p[..], s.local_addr().unwrap()));
    }
    for s in &socks {
        assert!(s.recv_from(&mut buf).is_err(), "nothing else arrives");
    }
    stop_tx.send(()).unwrap();
    let st = control.join().unwrap().unwrap();
    assert_eq!(st.packets, 20);
    assert!(st.delay_sum_ns > 0);
    let names = t.netns_names();
    drop(t);
    let left = ringway_io::netns::list_netns().unwrap();
    assert!(names.iter().all(|n| !left.contains(n)));
    let _ = SocketAddrV4::new(sip, 0);
}
