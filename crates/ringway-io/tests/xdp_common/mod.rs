//! Helpers shared by the AF_XDP backend's IPv4 and IPv6 tests (`xdp.rs`,
//! `xdp_ipv6.rs`): the two-host veth pair, the numbered payloads, and UDP
//! datagrams built by hand with a checksum computed independently of the
//! backend's code.
#![allow(dead_code)]

use ringway_io::netns::{Host, Topology};
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::time::Duration;

/// Hosts a and b of a fresh veth pair (`10.77.1.1`/`.2`; with `ipv6`
/// also `fd77:0:0:1::1`/`::2`); a's veth puts full UDP checksums on the
/// wire (the backend verifies them; with offload the sender leaves them
/// partial). Keep the `Topology` alive while the hosts are used.
pub(crate) fn veth_pair(ipv6: bool) -> (Topology, Host, Host) {
    let mut builder = Topology::builder().host("a").host("b").link("a", "b");
    if ipv6 {
        builder = builder.ipv6();
    }
    let t = builder.build().unwrap();
    let a = t.host("a").unwrap().clone();
    let b = t.host("b").unwrap().clone();
    let aif = a.ifaces[0].0.clone();
    a.run(move || ringway_io::backend::disable_tx_checksum_offload(&aif))
        .unwrap()
        .unwrap();
    (t, a, b)
}

/// Twenty payloads of growing size (1 to 1331 bytes), each starting with
/// `p` and filled with its number.
pub(crate) fn numbered_payloads() -> Vec<Vec<u8>> {
    (0..20u8)
        .map(|i| {
            let mut p = vec![i; 1 + i as usize * 70];
            p[0] = b'p';
            p
        })
        .collect()
}

/// A UDP header and `payload` from port 40000 to `port`, with the checksum
/// over the pseudo-header of `src` → `dst` (or `csum` as given); with
/// `corrupt`, the payload's last byte is flipped after the checksum.
pub(crate) fn udp_datagram(
    src: IpAddr,
    dst: IpAddr,
    port: u16,
    payload: &[u8],
    csum: Option<u16>,
    corrupt: bool,
) -> Vec<u8> {
    let mut u = Vec::new();
    u.extend_from_slice(&40000u16.to_be_bytes());
    u.extend_from_slice(&port.to_be_bytes());
    u.extend_from_slice(&((8 + payload.len()) as u16).to_be_bytes());
    u.extend_from_slice(&[0, 0]);
    u.extend_from_slice(payload);
    let c = csum.unwrap_or_else(|| udp_checksum(src, dst, &u));
    u[6..8].copy_from_slice(&c.to_be_bytes());
    if corrupt {
        let last = u.len() - 1;
        u[last] ^= 0x01;
    }
    u
}

/// The UDP checksum over the pseudo-header of either family and `udp`
/// (checksum field 0), word by word: the addresses, the length as 32 bits
/// and the protocol (over IPv4 the same sum as its 16-bit length and zero
/// byte); a computed 0 is sent as 0xffff.
pub(crate) fn udp_checksum(src: IpAddr, dst: IpAddr, udp: &[u8]) -> u16 {
    let mut sum: u64 = 0;
    let mut add = |b: &[u8]| {
        for c in b.chunks(2) {
            sum += u64::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)]));
        }
    };
    let octets = |ip: IpAddr| match ip {
        IpAddr::V4(v4) => v4.octets().to_vec(),
        IpAddr::V6(v6) => v6.octets().to_vec(),
    };
    add(&octets(src));
    add(&octets(dst));
    add(&(udp.len() as u32).to_be_bytes());
    add(&[0, 0, 0, 17]);
    add(udp);
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    match !(sum as u16) {
        0 => 0xffff,
        c => c,
    }
}

/// A kernel UDP socket on `ip` (any port) in `host`, with a 3 s read
/// timeout: it still receives while the XDP program is attached there.
pub(crate) fn kernel_socket(host: &Host, ip: IpAddr) -> UdpSocket {
    host.run(move || {
        let s = UdpSocket::bind((ip, 0)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
        s
    })
    .unwrap()
}

/// From a fresh socket on `ip` (run it in the sending host): the
/// [`numbered_payloads`] to `dst` (2 ms apart), then their replies (5 s
/// each at most), then one datagram `kernel path` to `other`. Returns the
/// socket's address, the payloads sent, and the replies (from, data).
#[allow(clippy::type_complexity)]
pub(crate) fn numbered_exchange(
    ip: IpAddr,
    dst: SocketAddr,
    other: SocketAddr,
) -> (SocketAddr, Vec<Vec<u8>>, Vec<(SocketAddr, Vec<u8>)>) {
    let s = UdpSocket::bind((ip, 0)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let sent = numbered_payloads();
    for p in &sent {
        s.send_to(p, dst).unwrap();
        std::thread::sleep(Duration::from_millis(2));
    }
    let mut replies = Vec::new();
    let mut buf = [0u8; 4096];
    while replies.len() < sent.len() {
        let (n, from) = s.recv_from(&mut buf).expect("reply via xdp");
        replies.push((from, buf[..n].to_vec()));
    }
    s.send_to(b"kernel path", other).unwrap();
    (s.local_addr().unwrap(), sent, replies)
}

/// From a raw socket (run it in the sending host), 20 ms apart, the four
/// datagrams of the checksum tests from `src` to `dst`:`port`: `good`
/// (right checksum), `corrupted!` (the payload changed after its checksum
/// was computed), `no checksum` (0), `end`. Over IPv4 the IP header is
/// ours (`IPPROTO_RAW`); over IPv6 the kernel writes it.
pub(crate) fn send_checksum_cases(src: IpAddr, dst: IpAddr, port: u16) {
    let (family, protocol) = match dst {
        IpAddr::V4(_) => (libc::AF_INET, libc::IPPROTO_RAW),
        IpAddr::V6(_) => (libc::AF_INET6, libc::IPPROTO_UDP),
    };
    // SAFETY: plain socket(2); the descriptor is closed below.
    let fd = unsafe { libc::socket(family, libc::SOCK_RAW, protocol) };
    assert!(fd >= 0, "{}", std::io::Error::last_os_error());
    let send = |payload: &[u8], csum: Option<u16>, corrupt: bool| {
        let u = udp_datagram(src, dst, port, payload, csum, corrupt);
        let (sent, want) = match (src, dst) {
            (IpAddr::V4(s4), IpAddr::V4(d4)) => {
                let mut p = vec![0x45, 0, 0, 0, 0, 0, 0x40, 0, 64, 17, 0, 0];
                p.extend_from_slice(&s4.octets());
                p.extend_from_slice(&d4.octets());
                let total = (p.len() + u.len()) as u16;
                p[2..4].copy_from_slice(&total.to_be_bytes());
                p.extend_from_slice(&u);
                let sa = libc::sockaddr_in {
                    sin_family: libc::AF_INET as libc::sa_family_t,
                    sin_port: 0,
                    sin_addr: libc::in_addr {
                        s_addr: u32::from_ne_bytes(d4.octets()),
                    },
                    sin_zero: [0; 8],
                };
                // SAFETY: valid buffer and sockaddr_in for the call.
                let n = unsafe {
                    libc::sendto(
                        fd,
                        p.as_ptr().cast(),
                        p.len(),
                        0,
                        (&sa as *const libc::sockaddr_in).cast(),
                        std::mem::size_of::<libc::sockaddr_in>() as u32,
                    )
                };
                (n, p.len())
            }
            (_, IpAddr::V6(d6)) => {
                // SAFETY: an all-zero sockaddr_in6 is valid; fields set below.
                let mut sa: libc::sockaddr_in6 = unsafe { std::mem::zeroed() };
                sa.sin6_family = libc::AF_INET6 as libc::sa_family_t;
                sa.sin6_addr.s6_addr = d6.octets();
                // SAFETY: valid buffer and sockaddr_in6 for the call.
                let n = unsafe {
                    libc::sendto(
                        fd,
                        u.as_ptr().cast(),
                        u.len(),
                        0,
                        (&sa as *const libc::sockaddr_in6).cast(),
                        std::mem::size_of::<libc::sockaddr_in6>() as u32,
                    )
                };
                (n, u.len())
            }
            _ => panic!("{src} and {dst} are of different families"),
        };
        assert_eq!(sent as usize, want, "{}", std::io::Error::last_os_error());
        std::thread::sleep(Duration::from_millis(20));
    };
    send(b"good", None, false);
    send(b"corrupted!", None, true);
    send(b"no checksum", Some(0), false);
    send(b"end", None, false);
    // SAFETY: closing our own descriptor.
    unsafe { libc::close(fd) };
}

/// 3000 bytes: more than the veth's MTU, so the sender fragments it.
pub(crate) fn big_payload() -> Vec<u8> {
    (0..3000u32).map(|i| (i % 251) as u8).collect()
}

/// From a fresh socket on `ip` (run it in the sending host): `small`, then
/// `big` 20 ms later, to `dst`. Returns the socket.
pub(crate) fn send_small_then_big(ip: IpAddr, dst: SocketAddr, big: &[u8]) -> UdpSocket {
    let s = UdpSocket::bind((ip, 0)).unwrap();
    s.send_to(b"small", dst).unwrap();
    std::thread::sleep(Duration::from_millis(20));
    s.send_to(big, dst).unwrap();
    s
}
