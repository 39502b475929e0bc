//! Building and turning around Ethernet/IP/UDP frames in UMEM, over IPv4
//! or IPv6: one header template per destination with the fixed part of the
//! checksums summed once, so a copy costs a 42-byte (IPv4) or 62-byte
//! (IPv6) header copy, the payload copy and two additions; the UDP checksum
//! of a received frame verified on the way in (its payload sum kept for the
//! copies; over IPv6 a missing checksum is an invalid one); the echo made
//! by rewriting the received frame's headers in place.

use crate::wire::{
    fold, pseudo_sum_ip, sum16, ETHERTYPE_IPV4, ETHERTYPE_IPV6, ETH_HLEN, IPPROTO_UDP, IPV4_HLEN,
    IPV6_HLEN, UDP6_FRAME_OVERHEAD, UDP_FRAME_OVERHEAD, UDP_HLEN,
};
use std::net::{IpAddr, SocketAddr};

/// Headers towards one destination, with their checksums' fixed parts.
#[derive(Clone, Debug)]
pub(crate) struct Template {
    /// The headers (the first [`Template::overhead`] bytes are used).
    hdr: [u8; UDP6_FRAME_OVERHEAD],
    /// IPv6 (else IPv4).
    v6: bool,
    /// IPv4: one's-complement sum of the IPv4 header with total length,
    /// identification and checksum zero (IPv6 has no header checksum).
    ip_sum: u32,
    /// One's-complement sum of the pseudo-header addresses and protocol
    /// plus both ports (the lengths are added per copy).
    udp_sum: u32,
}

/// Header bytes in front of the payload for a destination's family.
pub(crate) fn overhead_for(dst: &SocketAddr) -> usize {
    match dst {
        SocketAddr::V4(_) => UDP_FRAME_OVERHEAD,
        SocketAddr::V6(_) => UDP6_FRAME_OVERHEAD,
    }
}

impl Template {
    /// Headers from `src` to `dst`, which must be of one family (`None`
    /// when they are not).
    pub(crate) fn new(
        src_mac: [u8; 6],
        dst_mac: [u8; 6],
        src: SocketAddr,
        dst: SocketAddr,
    ) -> Option<Template> {
        let mut header = [0u8; UDP6_FRAME_OVERHEAD];
        header[0..6].copy_from_slice(&dst_mac);
        header[6..12].copy_from_slice(&src_mac);
        let (v6, ip_len, ip_sum) = match (src.ip(), dst.ip()) {
            (IpAddr::V4(s), IpAddr::V4(d)) => {
                header[12..14].copy_from_slice(&ETHERTYPE_IPV4.to_be_bytes());
                let ip = &mut header[ETH_HLEN..ETH_HLEN + IPV4_HLEN];
                ip[0] = 0x45;
                ip[6..8].copy_from_slice(&0x4000u16.to_be_bytes()); // DF
                ip[8] = 64;
                ip[9] = IPPROTO_UDP;
                ip[12..16].copy_from_slice(&s.octets());
                ip[16..20].copy_from_slice(&d.octets());
                (false, IPV4_HLEN, sum16(ip, 0))
            }
            (IpAddr::V6(s), IpAddr::V6(d)) => {
                header[12..14].copy_from_slice(&ETHERTYPE_IPV6.to_be_bytes());
                let ip = &mut header[ETH_HLEN..ETH_HLEN + IPV6_HLEN];
                ip[0] = 0x60; // version 6, traffic class and flow label 0
                ip[6] = IPPROTO_UDP;
                ip[7] = 64; // hop limit
                ip[8..24].copy_from_slice(&s.octets());
                ip[24..40].copy_from_slice(&d.octets());
                (true, IPV6_HLEN, 0)
            }
            _ => return None,
        };
        let udp = &mut header[ETH_HLEN + ip_len..ETH_HLEN + ip_len + UDP_HLEN];
        udp[0..2].copy_from_slice(&src.port().to_be_bytes());
        udp[2..4].copy_from_slice(&dst.port().to_be_bytes());
        let udp_sum = sum16(&udp[0..4], pseudo_sum_ip(src.ip(), dst.ip(), 0));
        Some(Template {
            hdr: header,
            v6,
            ip_sum,
            udp_sum,
        })
    }

    /// Header bytes in front of the payload (42 for IPv4, 62 for IPv6).
    pub(crate) fn overhead(&self) -> usize {
        if self.v6 {
            UDP6_FRAME_OVERHEAD
        } else {
            UDP_FRAME_OVERHEAD
        }
    }

    /// Write the headers for a payload of `len` bytes, whose one's-complement
    /// sum (taken at an even offset) is `payload_sum`, into
    /// `out[..self.overhead()]`; returns the frame length. `out` must hold
    /// the whole frame. `ip_id` is IPv4's identification (unused over IPv6).
    pub(crate) fn write(&self, out: &mut [u8], ip_id: u16, len: usize, payload_sum: u32) -> usize {
        let overhead = self.overhead();
        let header = &mut out[..overhead];
        header.copy_from_slice(&self.hdr[..overhead]);
        let udp_len = (UDP_HLEN + len) as u16;
        let udp_at = if self.v6 {
            // Payload length: everything after the fixed header.
            header[ETH_HLEN + 4..ETH_HLEN + 6].copy_from_slice(&udp_len.to_be_bytes());
            ETH_HLEN + IPV6_HLEN
        } else {
            let ip_len = (IPV4_HLEN + UDP_HLEN + len) as u16;
            let ip = &mut header[ETH_HLEN..ETH_HLEN + IPV4_HLEN];
            ip[2..4].copy_from_slice(&ip_len.to_be_bytes());
            ip[4..6].copy_from_slice(&ip_id.to_be_bytes());
            let checksum = !fold(self.ip_sum + u32::from(ip_len) + u32::from(ip_id));
            ip[10..12].copy_from_slice(&checksum.to_be_bytes());
            ETH_HLEN + IPV4_HLEN
        };
        let udp = &mut header[udp_at..];
        udp[4..6].copy_from_slice(&udp_len.to_be_bytes());
        // Pseudo-header length + UDP length field + payload.
        let sum = self.udp_sum + 2 * u32::from(udp_len) + u32::from(fold(payload_sum));
        let mut checksum = !fold(sum);
        if checksum == 0 {
            // 0 means "no checksum" over IPv4 and is invalid over IPv6: a
            // computed 0 goes out as all ones (RFC 768, RFC 8200 8.1).
            checksum = 0xffff;
        }
        udp[6..8].copy_from_slice(&checksum.to_be_bytes());
        overhead + len
    }
}

/// Verify the UDP checksum of `udp` (header and payload) sent from `src`
/// to `dst`: `Some(payload sum)` when it verifies or, over IPv4, is absent
/// (0); `None` when it does not — a corrupted datagram, a zero checksum
/// over IPv6 (mandatory there), or a checksum the sender left to offload
/// (on veth between namespaces of one host, the sender's kernel leaves the
/// pseudo-header sum only: turn TX checksum offload off there).
pub(crate) fn verify_udp(src: IpAddr, dst: IpAddr, udp: &[u8]) -> Option<u32> {
    let payload_sum = sum16(&udp[UDP_HLEN..], 0);
    let field = u16::from_be_bytes([udp[6], udp[7]]);
    if field == 0 {
        return src.is_ipv4().then_some(payload_sum);
    }
    let total = u32::from(fold(pseudo_sum_ip(src, dst, udp.len())))
        + u32::from(fold(sum16(&udp[..UDP_HLEN], 0)))
        + u32::from(fold(payload_sum));
    (fold(total) == 0xffff).then_some(payload_sum)
}

/// Turn a received frame (Ethernet, IPv4 without options or IPv6 without
/// extension headers, UDP) around in place, for the echo: our MAC as source
/// and `dst_mac` as destination, IP addresses and UDP ports swapped, TTL
/// (hop limit) 64. The UDP checksum stays valid (its sum does not depend
/// on the order of addresses and ports); the IPv4 header checksum is
/// recomputed. `false` (frame untouched) when the frame is not of that
/// shape.
pub(crate) fn turn_around(frame: &mut [u8], our_mac: [u8; 6], dst_mac: [u8; 6]) -> bool {
    if frame.len() < UDP_FRAME_OVERHEAD {
        return false;
    }
    let ethertype = u16::from_be_bytes([frame[12], frame[13]]);
    let udp_at = match ethertype {
        ETHERTYPE_IPV4 if frame[ETH_HLEN] == 0x45 => ETH_HLEN + IPV4_HLEN,
        ETHERTYPE_IPV6
            if frame.len() >= UDP6_FRAME_OVERHEAD
                && frame[ETH_HLEN] >> 4 == 6
                && frame[ETH_HLEN + 6] == IPPROTO_UDP =>
        {
            ETH_HLEN + IPV6_HLEN
        }
        _ => return false,
    };
    frame[0..6].copy_from_slice(&dst_mac);
    frame[6..12].copy_from_slice(&our_mac);
    if ethertype == ETHERTYPE_IPV4 {
        let ip = &mut frame[ETH_HLEN..ETH_HLEN + IPV4_HLEN];
        for i in 0..4 {
            ip.swap(12 + i, 16 + i);
        }
        ip[8] = 64;
        ip[10..12].copy_from_slice(&[0, 0]);
        let checksum = !fold(sum16(ip, 0));
        ip[10..12].copy_from_slice(&checksum.to_be_bytes());
    } else {
        let ip = &mut frame[ETH_HLEN..ETH_HLEN + IPV6_HLEN];
        for i in 0..16 {
            ip.swap(8 + i, 24 + i);
        }
        ip[7] = 64;
    }
    let udp = &mut frame[udp_at..];
    udp.swap(0, 2);
    udp.swap(1, 3);
    true
}

/// The frame functions for the `xdp_frame` fuzz target (not an API).
#[doc(hidden)]
pub mod frame_fuzzing {
    use std::net::{IpAddr, SocketAddr};

    /// [`super::verify_udp`].
    pub fn verify_udp(src: IpAddr, dst: IpAddr, udp: &[u8]) -> Option<u32> {
        if udp.len() < super::UDP_HLEN {
            return None;
        }
        super::verify_udp(src, dst, udp)
    }

    /// [`super::turn_around`].
    pub fn turn_around(frame: &mut [u8], our_mac: [u8; 6], dst_mac: [u8; 6]) -> bool {
        super::turn_around(frame, our_mac, dst_mac)
    }

    /// A whole frame from `src` to `dst` with `payload`, as the send path
    /// builds it from a [`super::Template`] (`None`: mixed families).
    pub fn template_frame(
        macs: ([u8; 6], [u8; 6]),
        src: SocketAddr,
        dst: SocketAddr,
        ip_id: u16,
        payload: &[u8],
    ) -> Option<Vec<u8>> {
        let template = super::Template::new(macs.0, macs.1, src, dst)?;
        let at = template.overhead();
        let mut frame = vec![0u8; at + payload.len()];
        frame[at..].copy_from_slice(payload);
        let sum = crate::wire::sum16(payload, 0);
        let len = template.write(&mut frame, ip_id, payload.len(), sum);
        debug_assert_eq!(len, frame.len());
        Some(frame)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{write_udp6_frame, write_udp_frame, UdpFrame, UdpFrameAddrs};
    use std::net::{SocketAddrV4, SocketAddrV6};

    const A: [u8; 6] = [2, 0, 0, 0, 0, 1];
    const B: [u8; 6] = [2, 0, 0, 0, 0, 2];

    fn addrs() -> (SocketAddrV4, SocketAddrV4) {
        (
            "10.77.0.1:5004".parse().unwrap(),
            "10.77.0.7:40001".parse().unwrap(),
        )
    }

    fn addrs6() -> (SocketAddrV6, SocketAddrV6) {
        (
            "[fd77::1]:5004".parse().unwrap(),
            "[fd77:0:0:3::2]:40001".parse().unwrap(),
        )
    }

    const CASES: [(usize, u16); 5] = [(0, 0), (1, 1), (80, 0xffff), (161, 77), (1400, 12345)];

    fn payload(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i * 7 + 3) as u8).collect()
    }

    /// A frame from the template: the payload placed, the headers written.
    fn templated(t: &Template, id: u16, payload: &[u8]) -> Vec<u8> {
        let mut got = vec![0u8; 1500];
        let at = t.overhead();
        got[at..at + payload.len()].copy_from_slice(payload);
        let m = t.write(&mut got, id, payload.len(), sum16(payload, 0));
        got.truncate(m);
        got
    }

    /// The template gives byte for byte the frame the full builder gives,
    /// for odd and even payload lengths and any IP id.
    #[test]
    fn template_matches_the_full_builder() {
        let (src, dst) = addrs();
        let t = Template::new(A, B, src.into(), dst.into()).unwrap();
        for (len, id) in CASES {
            let payload = payload(len);
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
            assert_eq!(templated(&t, id, &payload), want[..n], "len {len} id {id}");
        }
    }

    /// The same over IPv6: 62 header bytes, no header checksum, the UDP
    /// checksum over the IPv6 pseudo-header (and never 0).
    #[test]
    fn ipv6_template_matches_the_full_builder() {
        let (src, dst) = addrs6();
        let t = Template::new(A, B, src.into(), dst.into()).unwrap();
        assert_eq!(t.overhead(), 62);
        for (len, id) in CASES {
            let payload = payload(len);
            let mut want = vec![0u8; 1500];
            let n = write_udp6_frame(&mut want, (A, B), (src, dst), &payload).unwrap();
            let got = templated(&t, id, &payload);
            assert_eq!(got, want[..n], "len {len}");
            let f = UdpFrame::parse(&got).unwrap().unwrap();
            assert!(f.udp_checksum_ok(), "len {len}");
        }
        // A checksum that sums to 0 goes out as 0xffff: find a payload
        // whose checksum would be 0 by adjusting its last word.
        let mut p = payload(20);
        let base = templated(&t, 0, &p);
        let field = |f: &[u8]| u16::from_be_bytes([f[54 + 6], f[54 + 7]]);
        let want = field(&base);
        // Adding `want` to the sum turns the checksum into !(!want + want) = 0.
        let last = u16::from_be_bytes([p[18], p[19]]);
        let bumped = fold(u32::from(last) + u32::from(want));
        p[18..20].copy_from_slice(&bumped.to_be_bytes());
        let zero = templated(&t, 0, &p);
        assert_eq!(field(&zero), 0xffff);
        assert!(UdpFrame::parse(&zero).unwrap().unwrap().udp_checksum_ok());
        // Mixed families: no template.
        assert!(Template::new(A, B, addrs().0.into(), dst.into()).is_none());
    }

    /// Verification accepts good and (IPv4 only) absent checksums, refuses
    /// a flipped payload bit and a partial (offload) checksum.
    #[test]
    fn udp_checksum_verification() {
        let payload = b"pktswitch payload!";
        let (s4, d4) = addrs();
        let (s6, d6) = addrs6();
        for (src, dst) in [
            (SocketAddr::from(s4), SocketAddr::from(d4)),
            (SocketAddr::from(s6), SocketAddr::from(d6)),
        ] {
            let t = Template::new(A, B, src, dst).unwrap();
            let f = templated(&t, 1, payload);
            let at = t.overhead() - UDP_HLEN;
            let (s, d) = (src.ip(), dst.ip());
            assert_eq!(verify_udp(s, d, &f[at..]), Some(sum16(payload, 0)));
            let mut bad = f.clone();
            *bad.last_mut().unwrap() ^= 0x10;
            assert_eq!(verify_udp(s, d, &bad[at..]), None);
            // Partial checksum as an offloading sender leaves it.
            let mut partial = f.clone();
            let p = fold(pseudo_sum_ip(s, d, f.len() - at));
            partial[at + 6..at + 8].copy_from_slice(&p.to_be_bytes());
            assert_eq!(verify_udp(s, d, &partial[at..]), None);
            // No checksum: fine over IPv4, invalid over IPv6.
            let mut none = f.clone();
            none[at + 6..at + 8].copy_from_slice(&[0, 0]);
            assert_eq!(verify_udp(s, d, &none[at..]).is_some(), s.is_ipv4());
        }
    }

    /// The turned-around frame is a valid frame back to the sender with the
    /// same payload, for both families.
    #[test]
    fn echo_turns_the_frame_around() {
        let payload = b"echo me";
        let (s4, d4) = addrs();
        let (s6, d6) = addrs6();
        for (us, them) in [
            (SocketAddr::from(s4), SocketAddr::from(d4)),
            (SocketAddr::from(s6), SocketAddr::from(d6)),
        ] {
            // As received: from them (MAC B) to us (MAC A).
            let t = Template::new(B, A, them, us).unwrap();
            let mut f = templated(&t, 9, payload);
            assert!(turn_around(&mut f, A, B));
            let p = UdpFrame::parse(&f).unwrap().unwrap();
            assert_eq!((p.eth().src(), p.eth().dst()), (A, B));
            assert_eq!((p.src(), p.dst()), (us, them));
            assert!(p.ip_checksum_ok());
            assert!(p.udp_checksum_ok());
            assert_eq!(p.udp().payload(), payload);
        }
        // IPv4 options, an IPv6 extension header: not turned around here.
        let t = Template::new(B, A, d4.into(), s4.into()).unwrap();
        let mut g = templated(&t, 9, payload);
        g[ETH_HLEN] = 0x46;
        assert!(!turn_around(&mut g, A, B));
        let t = Template::new(B, A, d6.into(), s6.into()).unwrap();
        let mut g = templated(&t, 9, payload);
        g[ETH_HLEN + 6] = 0; // hop-by-hop options
        let before = g.clone();
        assert!(!turn_around(&mut g, A, B));
        assert_eq!(g, before, "untouched");
    }
}
