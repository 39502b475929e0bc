//! Building and turning around Ethernet/IPv4/UDP frames in UMEM: one header
//! template per destination with the fixed part of both checksums summed
//! once, so a copy costs a 42-byte header copy, the payload copy and two
//! additions; the UDP checksum of a received frame verified on the way in
//! (its payload sum kept for the copies); the echo made by rewriting the
//! received frame's headers in place.

use crate::wire::{fold, pseudo_sum, sum16, ETH_HLEN, IPV4_HLEN, UDP_FRAME_OVERHEAD, UDP_HLEN};
use std::net::{Ipv4Addr, SocketAddrV4};

/// Headers towards one destination, with their checksums' fixed parts.
#[derive(Clone, Debug)]
pub(crate) struct Template {
    hdr: [u8; UDP_FRAME_OVERHEAD],
    /// One's-complement sum of the IPv4 header with total length,
    /// identification and checksum zero.
    ip_sum: u32,
    /// One's-complement sum of the pseudo-header addresses and protocol
    /// plus both ports (the lengths are added per copy).
    udp_sum: u32,
}

impl Template {
    pub(crate) fn new(
        src_mac: [u8; 6],
        dst_mac: [u8; 6],
        src: SocketAddrV4,
        dst: SocketAddrV4,
    ) -> Template {
        let mut header = [0u8; UDP_FRAME_OVERHEAD];
        header[0..6].copy_from_slice(&dst_mac);
        header[6..12].copy_from_slice(&src_mac);
        header[12..14].copy_from_slice(&crate::wire::ETHERTYPE_IPV4.to_be_bytes());
        let ip = &mut header[ETH_HLEN..ETH_HLEN + IPV4_HLEN];
        ip[0] = 0x45;
        ip[6..8].copy_from_slice(&0x4000u16.to_be_bytes()); // DF
        ip[8] = 64;
        ip[9] = crate::wire::IPPROTO_UDP;
        ip[12..16].copy_from_slice(&src.ip().octets());
        ip[16..20].copy_from_slice(&dst.ip().octets());
        let ip_sum = sum16(ip, 0);
        let udp = &mut header[ETH_HLEN + IPV4_HLEN..];
        udp[0..2].copy_from_slice(&src.port().to_be_bytes());
        udp[2..4].copy_from_slice(&dst.port().to_be_bytes());
        let udp_sum = sum16(&udp[0..4], pseudo_sum(*src.ip(), *dst.ip(), 0));
        Template {
            hdr: header,
            ip_sum,
            udp_sum,
        }
    }

    /// Write the headers for a payload of `len` bytes, whose one's-complement
    /// sum (taken at an even offset) is `payload_sum`, into
    /// `out[..UDP_FRAME_OVERHEAD]`; returns the frame length. `out` must
    /// hold the whole frame.
    pub(crate) fn write(&self, out: &mut [u8], ip_id: u16, len: usize, payload_sum: u32) -> usize {
        let total = UDP_FRAME_OVERHEAD + len;
        let header = &mut out[..UDP_FRAME_OVERHEAD];
        header.copy_from_slice(&self.hdr);
        let ip_len = (IPV4_HLEN + UDP_HLEN + len) as u16;
        let udp_len = (UDP_HLEN + len) as u16;
        let ip = &mut header[ETH_HLEN..ETH_HLEN + IPV4_HLEN];
        ip[2..4].copy_from_slice(&ip_len.to_be_bytes());
        ip[4..6].copy_from_slice(&ip_id.to_be_bytes());
        let checksum = !fold(self.ip_sum + u32::from(ip_len) + u32::from(ip_id));
        ip[10..12].copy_from_slice(&checksum.to_be_bytes());
        let udp = &mut header[ETH_HLEN + IPV4_HLEN..];
        udp[4..6].copy_from_slice(&udp_len.to_be_bytes());
        // Pseudo-header length + UDP length field + payload.
        let sum = self.udp_sum + 2 * u32::from(udp_len) + u32::from(fold(payload_sum));
        let mut checksum = !fold(sum);
        if checksum == 0 {
            checksum = 0xffff; // 0 means "no checksum" in UDP over IPv4
        }
        udp[6..8].copy_from_slice(&checksum.to_be_bytes());
        total
    }
}

/// Verify the UDP checksum of `udp` (header and payload) sent from `src`
/// to `dst`: `Some(payload sum)` when it verifies or is absent (0), `None`
/// when it does not — a corrupted datagram, or a checksum the sender left
/// to offload (on veth between namespaces of one host, the sender's kernel
/// leaves the pseudo-header sum only: turn TX checksum offload off there).
pub(crate) fn verify_udp(src: Ipv4Addr, dst: Ipv4Addr, udp: &[u8]) -> Option<u32> {
    let payload_sum = sum16(&udp[UDP_HLEN..], 0);
    let field = u16::from_be_bytes([udp[6], udp[7]]);
    if field == 0 {
        return Some(payload_sum);
    }
    let total = u32::from(fold(pseudo_sum(src, dst, udp.len())))
        + u32::from(fold(sum16(&udp[..UDP_HLEN], 0)))
        + u32::from(fold(payload_sum));
    (fold(total) == 0xffff).then_some(payload_sum)
}

/// Turn a received frame (Ethernet, IPv4 without options, UDP) around in
/// place, for the echo: our MAC as source and `dst_mac` as destination,
/// IPv4 addresses and UDP ports swapped, TTL 64. The UDP checksum stays
/// valid (its sum does not depend on the order of addresses and ports);
/// the IPv4 header checksum is recomputed. `false` (frame untouched) when
/// the frame is not of that shape.
pub(crate) fn turn_around(frame: &mut [u8], our_mac: [u8; 6], dst_mac: [u8; 6]) -> bool {
    if frame.len() < UDP_FRAME_OVERHEAD || frame[ETH_HLEN] != 0x45 {
        return false;
    }
    frame[0..6].copy_from_slice(&dst_mac);
    frame[6..12].copy_from_slice(&our_mac);
    let ip = &mut frame[ETH_HLEN..ETH_HLEN + IPV4_HLEN];
    for i in 0..4 {
        ip.swap(12 + i, 16 + i);
    }
    ip[8] = 64;
    ip[10..12].copy_from_slice(&[0, 0]);
    let checksum = !fold(sum16(ip, 0));
    ip[10..12].copy_from_slice(&checksum.to_be_bytes());
    let udp = &mut frame[ETH_HLEN + IPV4_HLEN..];
    udp.swap(0, 2);
    udp.swap(1, 3);
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{write_udp_frame, Udp4Frame, UdpFrameAddrs};

    const A: [u8; 6] = [2, 0, 0, 0, 0, 1];
    const B: [u8; 6] = [2, 0, 0, 0, 0, 2];

    fn addrs() -> (SocketAddrV4, SocketAddrV4) {
        (
            "10.77.0.1:5004".parse().unwrap(),
            "10.77.0.7:40001".parse().unwrap(),
        )
    }

    /// The template gives byte for byte the frame the full builder gives,
    /// for odd and even payload lengths and any IP id.
    #[test]
    fn template_matches_the_full_builder() {
        let (src, dst) = addrs();
        let t = Template::new(A, B, src, dst);
        for (len, id) in [
            (0usize, 0u16),
            (1, 1),
            (80, 0xffff),
            (161, 77),
            (1400, 12345),
        ] {
            let payload: Vec<u8> = (0..len).map(|i| (i * 7 + 3) as u8).collect();
            let mut want = vec![0u8; 1500];
            let n = write_udp_frame(
                &mut want,
                &UdpFrameAddrs {
                    src_mac: A,
                    dst_mac: B,
                    src_ip: *src.ip(),
                    dst_ip: *dst.ip(),
                    src_port: src.port(),
                    dst_port: dst.port(),
                },
                id,
                &payload,
            )
            .unwrap();
            let mut got = vec![0u8; 1500];
            got[UDP_FRAME_OVERHEAD..UDP_FRAME_OVERHEAD + len].copy_from_slice(&payload);
            let m = t.write(&mut got, id, len, sum16(&payload, 0));
            assert_eq!(m, n);
            assert_eq!(got[..m], want[..n], "len {len} id {id}");
        }
    }

    /// Verification accepts good and absent checksums, refuses a flipped
    /// payload bit and a partial (offload) checksum.
    #[test]
    fn udp_checksum_verification() {
        let (src, dst) = addrs();
        let mut f = vec![0u8; 200];
        let payload = b"pktswitch payload!";
        let n = Template::new(A, B, src, dst).write(&mut f, 1, 0, 0);
        let _ = n;
        f[UDP_FRAME_OVERHEAD..UDP_FRAME_OVERHEAD + payload.len()].copy_from_slice(payload);
        let n = Template::new(A, B, src, dst).write(&mut f, 1, payload.len(), sum16(payload, 0));
        let udp = |f: &[u8]| f[ETH_HLEN + IPV4_HLEN..n].to_vec();
        assert_eq!(
            verify_udp(*src.ip(), *dst.ip(), &udp(&f)),
            Some(sum16(payload, 0))
        );
        let mut bad = f.clone();
        bad[n - 1] ^= 0x10;
        assert_eq!(verify_udp(*src.ip(), *dst.ip(), &udp(&bad)), None);
        // Partial checksum as an offloading sender leaves it.
        let mut partial = f.clone();
        let ulen = n - ETH_HLEN - IPV4_HLEN;
        let p = fold(pseudo_sum(*src.ip(), *dst.ip(), ulen));
        partial[ETH_HLEN + IPV4_HLEN + 6..ETH_HLEN + IPV4_HLEN + 8]
            .copy_from_slice(&p.to_be_bytes());
        assert_eq!(verify_udp(*src.ip(), *dst.ip(), &udp(&partial)), None);
        let mut none = f.clone();
        none[ETH_HLEN + IPV4_HLEN + 6..ETH_HLEN + IPV4_HLEN + 8].copy_from_slice(&[0, 0]);
        assert!(verify_udp(*src.ip(), *dst.ip(), &udp(&none)).is_some());
    }

    /// The turned-around frame is a valid frame back to the sender with the
    /// same payload.
    #[test]
    fn echo_turns_the_frame_around() {
        let (us, them) = addrs();
        let mut f = vec![0u8; 200];
        let payload = b"echo me";
        f[UDP_FRAME_OVERHEAD..UDP_FRAME_OVERHEAD + payload.len()].copy_from_slice(payload);
        // As received: from them (MAC B) to us (MAC A).
        let n = Template::new(B, A, them, us).write(&mut f, 9, payload.len(), sum16(payload, 0));
        assert!(turn_around(&mut f[..n], A, B));
        let p = Udp4Frame::parse(&f[..n]).unwrap().unwrap();
        assert_eq!((p.eth.src(), p.eth.dst()), (A, B));
        assert_eq!((p.ip.src(), p.ip.dst()), (*us.ip(), *them.ip()));
        assert_eq!(
            (p.udp.src_port(), p.udp.dst_port()),
            (us.port(), them.port())
        );
        assert!(p.ip.checksum_ok());
        assert!(p.udp.checksum_ok(p.ip.src(), p.ip.dst()));
        assert_eq!(p.udp.payload(), payload);
        // IP options: not turned around here.
        let mut g = f.clone();
        g[ETH_HLEN] = 0x46;
        assert!(!turn_around(&mut g[..n], A, B));
    }
}
