//! Ethernet II / IPv4 / IPv6 / UDP headers as zero-copy checked views over
//! `&[u8]` (smoltcp `wire` style), for the AF_XDP backend, which sees whole
//! frames.
//!
//! `*::new_checked(buf)` verifies that every field the accessors read lies
//! inside `buf` and that the lengths the headers claim are consistent;
//! accessors never panic afterwards. [`UdpFrame::parse`] takes a frame of
//! either family; [`write_udp_frame`] builds one.
//!
//! IPv6: only a UDP header right after the fixed header is a UDP datagram
//! here (next header 17); a frame with extension headers (hop-by-hop,
//! routing, fragment, ...) is "not UDP" (`Ok(None)`), left to the kernel.
//! A UDP checksum of 0 is refused over IPv6 (RFC 8200 8.1: mandatory).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV6};

/// Why a frame was not accepted.
#[derive(Copy, Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    /// The buffer ends before the header (or the length it claims) does.
    #[error("truncated")]
    Truncated,
    /// A field has a value this view does not handle (version, IHL, lengths).
    #[error("malformed")]
    Malformed,
}

/// EtherType of IPv4.
pub const ETHERTYPE_IPV4: u16 = 0x0800;
/// EtherType of IPv6.
pub const ETHERTYPE_IPV6: u16 = 0x86dd;
/// IPv6 fixed header length.
pub const IPV6_HLEN: usize = 40;
/// IP protocol number of UDP.
pub const IPPROTO_UDP: u8 = 17;
/// Ethernet II header length.
pub const ETH_HLEN: usize = 14;
/// IPv4 header length without options.
pub const IPV4_HLEN: usize = 20;
/// UDP header length.
pub const UDP_HLEN: usize = 8;
/// Ethernet + IPv4 (no options) + UDP header bytes in front of a payload.
pub const UDP_FRAME_OVERHEAD: usize = ETH_HLEN + IPV4_HLEN + UDP_HLEN;
/// Ethernet + IPv6 (no extension headers) + UDP header bytes in front of a
/// payload.
pub const UDP6_FRAME_OVERHEAD: usize = ETH_HLEN + IPV6_HLEN + UDP_HLEN;

fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

/// An Ethernet II frame.
#[derive(Copy, Clone, Debug)]
pub struct EthernetFrame<'a> {
    buf: &'a [u8],
}

impl<'a> EthernetFrame<'a> {
    /// Check that `buf` holds at least an Ethernet header.
    pub fn new_checked(buf: &'a [u8]) -> Result<Self, WireError> {
        if buf.len() < ETH_HLEN {
            return Err(WireError::Truncated);
        }
        Ok(EthernetFrame { buf })
    }
    /// Destination MAC.
    pub fn dst(&self) -> [u8; 6] {
        self.buf[0..6].try_into().expect("checked length")
    }
    /// Source MAC.
    pub fn src(&self) -> [u8; 6] {
        self.buf[6..12].try_into().expect("checked length")
    }
    /// EtherType (VLAN tags are not looked through).
    pub fn ethertype(&self) -> u16 {
        be16(self.buf, 12)
    }
    /// Bytes after the header.
    pub fn payload(&self) -> &'a [u8] {
        &self.buf[ETH_HLEN..]
    }
}

/// An IPv4 packet (options allowed and skipped).
#[derive(Copy, Clone, Debug)]
pub struct Ipv4Packet<'a> {
    buf: &'a [u8],
}

impl<'a> Ipv4Packet<'a> {
    /// Check version 4, IHL >= 5, total length within `buf` and >= header
    /// length. Bytes after the total length (Ethernet padding) are ignored.
    pub fn new_checked(buf: &'a [u8]) -> Result<Self, WireError> {
        if buf.len() < IPV4_HLEN {
            return Err(WireError::Truncated);
        }
        if buf[0] >> 4 != 4 {
            return Err(WireError::Malformed);
        }
        let hlen = ((buf[0] & 0x0f) as usize) * 4;
        let total = be16(buf, 2) as usize;
        if hlen < IPV4_HLEN || total < hlen {
            return Err(WireError::Malformed);
        }
        if buf.len() < total {
            return Err(WireError::Truncated);
        }
        Ok(Ipv4Packet { buf: &buf[..total] })
    }
    /// Header length in bytes (with options).
    pub fn header_len(&self) -> usize {
        ((self.buf[0] & 0x0f) as usize) * 4
    }
    /// Total length (header + payload).
    pub fn total_len(&self) -> usize {
        self.buf.len()
    }
    /// More-fragments flag or a nonzero fragment offset.
    pub fn is_fragment(&self) -> bool {
        be16(self.buf, 6) & 0x3fff != 0
    }
    /// Protocol number.
    pub fn protocol(&self) -> u8 {
        self.buf[9]
    }
    /// Source address.
    pub fn src(&self) -> Ipv4Addr {
        Ipv4Addr::new(self.buf[12], self.buf[13], self.buf[14], self.buf[15])
    }
    /// Destination address.
    pub fn dst(&self) -> Ipv4Addr {
        Ipv4Addr::new(self.buf[16], self.buf[17], self.buf[18], self.buf[19])
    }
    /// The header checksum verifies.
    pub fn checksum_ok(&self) -> bool {
        fold(sum16(&self.buf[..self.header_len()], 0)) == 0xffff
    }
    /// Bytes after the header, up to the total length.
    pub fn payload(&self) -> &'a [u8] {
        &self.buf[self.header_len()..]
    }
}

/// An IPv6 packet (fixed header; extension headers are not walked).
#[derive(Copy, Clone, Debug)]
pub struct Ipv6Packet<'a> {
    buf: &'a [u8],
}

impl<'a> Ipv6Packet<'a> {
    /// Check version 6 and that the payload length lies within `buf`.
    /// Bytes after it (Ethernet padding) are ignored.
    pub fn new_checked(buf: &'a [u8]) -> Result<Self, WireError> {
        if buf.len() < IPV6_HLEN {
            return Err(WireError::Truncated);
        }
        if buf[0] >> 4 != 6 {
            return Err(WireError::Malformed);
        }
        let total = IPV6_HLEN + be16(buf, 4) as usize;
        if buf.len() < total {
            return Err(WireError::Truncated);
        }
        Ok(Ipv6Packet { buf: &buf[..total] })
    }
    /// Next header (the protocol when there are no extension headers).
    pub fn next_header(&self) -> u8 {
        self.buf[6]
    }
    /// Hop limit.
    pub fn hop_limit(&self) -> u8 {
        self.buf[7]
    }
    /// Source address.
    pub fn src(&self) -> Ipv6Addr {
        Ipv6Addr::from(<[u8; 16]>::try_from(&self.buf[8..24]).expect("checked length"))
    }
    /// Destination address.
    pub fn dst(&self) -> Ipv6Addr {
        Ipv6Addr::from(<[u8; 16]>::try_from(&self.buf[24..40]).expect("checked length"))
    }
    /// Bytes after the fixed header, up to the payload length.
    pub fn payload(&self) -> &'a [u8] {
        &self.buf[IPV6_HLEN..]
    }
}

/// A UDP datagram.
#[derive(Copy, Clone, Debug)]
pub struct UdpDatagram<'a> {
    buf: &'a [u8],
}

impl<'a> UdpDatagram<'a> {
    /// Check the header and that its length field lies within `buf`.
    pub fn new_checked(buf: &'a [u8]) -> Result<Self, WireError> {
        if buf.len() < UDP_HLEN {
            return Err(WireError::Truncated);
        }
        let len = be16(buf, 4) as usize;
        if len < UDP_HLEN {
            return Err(WireError::Malformed);
        }
        if buf.len() < len {
            return Err(WireError::Truncated);
        }
        Ok(UdpDatagram { buf: &buf[..len] })
    }
    /// Source port.
    pub fn src_port(&self) -> u16 {
        be16(self.buf, 0)
    }
    /// Destination port.
    pub fn dst_port(&self) -> u16 {
        be16(self.buf, 2)
    }
    /// Checksum field (0: none).
    pub fn checksum(&self) -> u16 {
        be16(self.buf, 6)
    }
    /// The UDP checksum verifies (or is absent) for this IPv4 pair.
    pub fn checksum_ok(&self, src: Ipv4Addr, dst: Ipv4Addr) -> bool {
        self.checksum() == 0
            || fold(sum16(self.buf, pseudo_sum(src, dst, self.buf.len()))) == 0xffff
    }
    /// The UDP checksum verifies for this IPv6 pair (0, "none", does not:
    /// the checksum is mandatory over IPv6).
    pub fn checksum_ok6(&self, src: Ipv6Addr, dst: Ipv6Addr) -> bool {
        self.checksum() != 0
            && fold(sum16(self.buf, pseudo_sum6(src, dst, self.buf.len()))) == 0xffff
    }
    /// The payload.
    pub fn payload(&self) -> &'a [u8] {
        &self.buf[UDP_HLEN..]
    }
}

/// A UDP datagram inside IPv4 inside Ethernet, as the XDP backend receives it.
#[derive(Copy, Clone, Debug)]
pub struct Udp4Frame<'a> {
    /// The Ethernet layer.
    pub eth: EthernetFrame<'a>,
    /// The IPv4 layer.
    pub ip: Ipv4Packet<'a>,
    /// The UDP layer.
    pub udp: UdpDatagram<'a>,
}

impl<'a> Udp4Frame<'a> {
    /// Parse all three layers; `Ok(None)` when the frame is valid but not
    /// an unfragmented IPv4 UDP datagram.
    pub fn parse(buf: &'a [u8]) -> Result<Option<Self>, WireError> {
        let eth = EthernetFrame::new_checked(buf)?;
        if eth.ethertype() != ETHERTYPE_IPV4 {
            return Ok(None);
        }
        let ip = Ipv4Packet::new_checked(eth.payload())?;
        if ip.protocol() != IPPROTO_UDP || ip.is_fragment() {
            return Ok(None);
        }
        let udp = UdpDatagram::new_checked(ip.payload())?;
        Ok(Some(Udp4Frame { eth, ip, udp }))
    }
}

/// A UDP datagram inside IPv6 (no extension headers) inside Ethernet.
#[derive(Copy, Clone, Debug)]
pub struct Udp6Frame<'a> {
    /// The Ethernet layer.
    pub eth: EthernetFrame<'a>,
    /// The IPv6 layer.
    pub ip: Ipv6Packet<'a>,
    /// The UDP layer.
    pub udp: UdpDatagram<'a>,
}

impl<'a> Udp6Frame<'a> {
    /// Parse all three layers; `Ok(None)` when the frame is valid but not
    /// an IPv6 UDP datagram without extension headers.
    pub fn parse(buf: &'a [u8]) -> Result<Option<Self>, WireError> {
        let eth = EthernetFrame::new_checked(buf)?;
        if eth.ethertype() != ETHERTYPE_IPV6 {
            return Ok(None);
        }
        let ip = Ipv6Packet::new_checked(eth.payload())?;
        if ip.next_header() != IPPROTO_UDP {
            return Ok(None);
        }
        let udp = UdpDatagram::new_checked(ip.payload())?;
        Ok(Some(Udp6Frame { eth, ip, udp }))
    }
}

/// A UDP datagram in an Ethernet frame, over IPv4 or IPv6.
#[derive(Copy, Clone, Debug)]
pub enum UdpFrame<'a> {
    /// Over IPv4 (options allowed, not a fragment).
    V4(Udp4Frame<'a>),
    /// Over IPv6 (no extension headers).
    V6(Udp6Frame<'a>),
}

impl<'a> UdpFrame<'a> {
    /// Parse a frame of either family; `Ok(None)` when it is valid but
    /// not a UDP datagram these views handle.
    pub fn parse(buf: &'a [u8]) -> Result<Option<Self>, WireError> {
        let eth = EthernetFrame::new_checked(buf)?;
        match eth.ethertype() {
            ETHERTYPE_IPV4 => Ok(Udp4Frame::parse(buf)?.map(UdpFrame::V4)),
            ETHERTYPE_IPV6 => Ok(Udp6Frame::parse(buf)?.map(UdpFrame::V6)),
            _ => Ok(None),
        }
    }
    /// The Ethernet layer.
    pub fn eth(&self) -> EthernetFrame<'a> {
        match self {
            UdpFrame::V4(f) => f.eth,
            UdpFrame::V6(f) => f.eth,
        }
    }
    /// The UDP layer.
    pub fn udp(&self) -> UdpDatagram<'a> {
        match self {
            UdpFrame::V4(f) => f.udp,
            UdpFrame::V6(f) => f.udp,
        }
    }
    /// Sender address and port.
    pub fn src(&self) -> SocketAddr {
        match self {
            UdpFrame::V4(f) => SocketAddr::new(IpAddr::V4(f.ip.src()), f.udp.src_port()),
            UdpFrame::V6(f) => SocketAddr::new(IpAddr::V6(f.ip.src()), f.udp.src_port()),
        }
    }
    /// Destination address and port.
    pub fn dst(&self) -> SocketAddr {
        match self {
            UdpFrame::V4(f) => SocketAddr::new(IpAddr::V4(f.ip.dst()), f.udp.dst_port()),
            UdpFrame::V6(f) => SocketAddr::new(IpAddr::V6(f.ip.dst()), f.udp.dst_port()),
        }
    }
    /// Offset of the UDP header in the frame.
    pub fn udp_offset(&self) -> usize {
        match self {
            UdpFrame::V4(f) => ETH_HLEN + f.ip.header_len(),
            UdpFrame::V6(_) => ETH_HLEN + IPV6_HLEN,
        }
    }
    /// The IP header has no options (IPv4 IHL 5; IPv6 always): the frame
    /// can be turned around in place.
    pub fn plain_header(&self) -> bool {
        match self {
            UdpFrame::V4(f) => f.ip.header_len() == IPV4_HLEN,
            UdpFrame::V6(_) => true,
        }
    }
    /// The IP header checksum verifies (IPv6 has none).
    pub fn ip_checksum_ok(&self) -> bool {
        match self {
            UdpFrame::V4(f) => f.ip.checksum_ok(),
            UdpFrame::V6(_) => true,
        }
    }
    /// The UDP checksum verifies (IPv4: or is absent; IPv6: mandatory).
    pub fn udp_checksum_ok(&self) -> bool {
        match self {
            UdpFrame::V4(f) => f.udp.checksum_ok(f.ip.src(), f.ip.dst()),
            UdpFrame::V6(f) => f.udp.checksum_ok6(f.ip.src(), f.ip.dst()),
        }
    }
}

/// One's-complement sum of `data` (big-endian 16-bit words, a last odd
/// byte padded with zero) added to `acc`; the result is not folded to 16
/// bits yet (see [`fold`]). Eight bytes at a time: summing big-endian
/// 32-bit words gives the same one's-complement sum, as 2^16 ≡ 1 modulo
/// 0xffff.
pub(crate) fn sum16(data: &[u8], acc: u32) -> u32 {
    let mut wide = u64::from(acc);
    let mut chunks = data.chunks_exact(8);
    for c in &mut chunks {
        let high = u32::from_be_bytes([c[0], c[1], c[2], c[3]]);
        let low = u32::from_be_bytes([c[4], c[5], c[6], c[7]]);
        wide += u64::from(high) + u64::from(low);
    }
    let mut pairs = chunks.remainder().chunks_exact(2);
    for c in &mut pairs {
        wide += u64::from(u16::from_be_bytes([c[0], c[1]]));
    }
    if let [last] = pairs.remainder() {
        wide += u64::from(*last) << 8;
    }
    // Fold 64 → 32 bits (end-around carries), keeping the sum mod 0xffff.
    while wide > 0xffff_ffff {
        wide = (wide & 0xffff_ffff) + (wide >> 32);
    }
    // And below 2^31, so callers may add a few more 16-bit sums.
    let mut acc = wide as u32;
    while acc > 0x7fff_ffff {
        acc = (acc & 0xffff) + (acc >> 16);
    }
    acc
}

pub(crate) fn fold(mut acc: u32) -> u16 {
    while acc > 0xffff {
        acc = (acc & 0xffff) + (acc >> 16);
    }
    acc as u16
}

pub(crate) fn pseudo_sum(src: Ipv4Addr, dst: Ipv4Addr, udp_len: usize) -> u32 {
    let mut pseudo = [0u8; 12];
    pseudo[0..4].copy_from_slice(&src.octets());
    pseudo[4..8].copy_from_slice(&dst.octets());
    pseudo[9] = IPPROTO_UDP;
    pseudo[10..12].copy_from_slice(&(udp_len as u16).to_be_bytes());
    sum16(&pseudo, 0)
}

/// The IPv6 pseudo-header's sum (RFC 8200 8.1): addresses, upper-layer
/// length, next header UDP.
pub(crate) fn pseudo_sum6(src: Ipv6Addr, dst: Ipv6Addr, udp_len: usize) -> u32 {
    let mut pseudo = [0u8; 40];
    pseudo[0..16].copy_from_slice(&src.octets());
    pseudo[16..32].copy_from_slice(&dst.octets());
    pseudo[32..36].copy_from_slice(&(udp_len as u32).to_be_bytes());
    pseudo[39] = IPPROTO_UDP;
    sum16(&pseudo, 0)
}

/// The pseudo-header's sum for a pair of either family (mixed families:
/// the IPv6 form of both).
pub(crate) fn pseudo_sum_ip(src: IpAddr, dst: IpAddr, udp_len: usize) -> u32 {
    match (src, dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => pseudo_sum(s, d, udp_len),
        (s, d) => pseudo_sum6(to_v6(s), to_v6(d), udp_len),
    }
}

fn to_v6(ip: IpAddr) -> Ipv6Addr {
    match ip {
        IpAddr::V4(v4) => v4.to_ipv6_mapped(),
        IpAddr::V6(v6) => v6,
    }
}

/// Addresses of a frame to build.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct UdpFrameAddrs {
    /// Source MAC.
    pub src_mac: [u8; 6],
    /// Destination MAC.
    pub dst_mac: [u8; 6],
    /// Source IPv4 address.
    pub src_ip: Ipv4Addr,
    /// Destination IPv4 address.
    pub dst_ip: Ipv4Addr,
    /// Source port.
    pub src_port: u16,
    /// Destination port.
    pub dst_port: u16,
}

/// Write Ethernet + IPv4 (no options, DF, TTL 64, header checksum) + UDP
/// (with checksum) headers and `payload` into `out`; returns the frame
/// length, or `None` if `out` is too small or the datagram exceeds 65507
/// payload bytes.
pub fn write_udp_frame(
    out: &mut [u8],
    a: &UdpFrameAddrs,
    ip_id: u16,
    payload: &[u8],
) -> Option<usize> {
    let total = UDP_FRAME_OVERHEAD + payload.len();
    if out.len() < total || payload.len() > 65507 {
        return None;
    }
    let frame = &mut out[..total];
    frame[0..6].copy_from_slice(&a.dst_mac);
    frame[6..12].copy_from_slice(&a.src_mac);
    frame[12..14].copy_from_slice(&ETHERTYPE_IPV4.to_be_bytes());
    let ip_len = (IPV4_HLEN + UDP_HLEN + payload.len()) as u16;
    let udp_len = (UDP_HLEN + payload.len()) as u16;
    {
        let ip = &mut frame[ETH_HLEN..ETH_HLEN + IPV4_HLEN];
        ip[0] = 0x45;
        ip[1] = 0;
        ip[2..4].copy_from_slice(&ip_len.to_be_bytes());
        ip[4..6].copy_from_slice(&ip_id.to_be_bytes());
        ip[6..8].copy_from_slice(&0x4000u16.to_be_bytes()); // DF
        ip[8] = 64;
        ip[9] = IPPROTO_UDP;
        ip[10..12].copy_from_slice(&[0, 0]);
        ip[12..16].copy_from_slice(&a.src_ip.octets());
        ip[16..20].copy_from_slice(&a.dst_ip.octets());
        let checksum = !fold(sum16(ip, 0));
        ip[10..12].copy_from_slice(&checksum.to_be_bytes());
    }
    let udp = &mut frame[ETH_HLEN + IPV4_HLEN..];
    udp[0..2].copy_from_slice(&a.src_port.to_be_bytes());
    udp[2..4].copy_from_slice(&a.dst_port.to_be_bytes());
    udp[4..6].copy_from_slice(&udp_len.to_be_bytes());
    udp[6..8].copy_from_slice(&[0, 0]);
    udp[UDP_HLEN..].copy_from_slice(payload);
    let mut checksum = !fold(sum16(udp, pseudo_sum(a.src_ip, a.dst_ip, udp.len())));
    if checksum == 0 {
        checksum = 0xffff; // 0 means "no checksum" in UDP over IPv4
    }
    udp[6..8].copy_from_slice(&checksum.to_be_bytes());
    Some(total)
}

/// Write Ethernet + IPv6 (traffic class and flow label 0, hop limit 64,
/// no extension headers) + UDP (with its mandatory checksum) headers and
/// `payload` from `src` (MAC `src_mac`) to `dst` (MAC `dst_mac`) into
/// `out`; returns the frame length, or `None` if `out` is too small or the
/// datagram exceeds 65527 payload bytes.
pub fn write_udp6_frame(
    out: &mut [u8],
    (src_mac, dst_mac): ([u8; 6], [u8; 6]),
    (src, dst): (SocketAddrV6, SocketAddrV6),
    payload: &[u8],
) -> Option<usize> {
    let total = UDP6_FRAME_OVERHEAD + payload.len();
    if out.len() < total || payload.len() > 65535 - UDP_HLEN {
        return None;
    }
    let frame = &mut out[..total];
    frame[0..6].copy_from_slice(&dst_mac);
    frame[6..12].copy_from_slice(&src_mac);
    frame[12..14].copy_from_slice(&ETHERTYPE_IPV6.to_be_bytes());
    let udp_len = (UDP_HLEN + payload.len()) as u16;
    {
        let ip = &mut frame[ETH_HLEN..ETH_HLEN + IPV6_HLEN];
        ip[0..4].copy_from_slice(&[0x60, 0, 0, 0]);
        ip[4..6].copy_from_slice(&udp_len.to_be_bytes());
        ip[6] = IPPROTO_UDP;
        ip[7] = 64;
        ip[8..24].copy_from_slice(&src.ip().octets());
        ip[24..40].copy_from_slice(&dst.ip().octets());
    }
    let udp = &mut frame[ETH_HLEN + IPV6_HLEN..];
    udp[0..2].copy_from_slice(&src.port().to_be_bytes());
    udp[2..4].copy_from_slice(&dst.port().to_be_bytes());
    udp[4..6].copy_from_slice(&udp_len.to_be_bytes());
    udp[6..8].copy_from_slice(&[0, 0]);
    udp[UDP_HLEN..].copy_from_slice(payload);
    let mut checksum = !fold(sum16(udp, pseudo_sum6(*src.ip(), *dst.ip(), udp.len())));
    if checksum == 0 {
        checksum = 0xffff; // a computed 0 is sent as all ones (RFC 8200 8.1)
    }
    udp[6..8].copy_from_slice(&checksum.to_be_bytes());
    Some(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addrs() -> UdpFrameAddrs {
        UdpFrameAddrs {
            src_mac: [2, 0, 0, 0, 0, 1],
            dst_mac: [2, 0, 0, 0, 0, 2],
            src_ip: Ipv4Addr::new(10, 77, 1, 2),
            dst_ip: Ipv4Addr::new(10, 77, 1, 1),
            src_port: 5004,
            dst_port: 40000,
        }
    }

    #[test]
    fn build_then_parse_roundtrip() {
        let mut buf = [0u8; 128];
        for payload in [&b""[..], b"x", b"hello world"] {
            let n = write_udp_frame(&mut buf, &addrs(), 7, payload).unwrap();
            assert_eq!(n, UDP_FRAME_OVERHEAD + payload.len());
            let f = Udp4Frame::parse(&buf[..n]).unwrap().unwrap();
            assert_eq!(f.eth.dst(), [2, 0, 0, 0, 0, 2]);
            assert_eq!(f.eth.src(), [2, 0, 0, 0, 0, 1]);
            assert!(f.ip.checksum_ok());
            assert!(!f.ip.is_fragment());
            assert_eq!(f.ip.src(), Ipv4Addr::new(10, 77, 1, 2));
            assert_eq!(f.ip.dst(), Ipv4Addr::new(10, 77, 1, 1));
            assert_eq!((f.udp.src_port(), f.udp.dst_port()), (5004, 40000));
            assert_ne!(f.udp.checksum(), 0);
            assert!(f.udp.checksum_ok(f.ip.src(), f.ip.dst()));
            assert_eq!(f.udp.payload(), payload);
        }
    }

    /// The 8-bytes-at-a-time sum equals the plain 16-bit word sum, for
    /// every length and alignment of the tail.
    #[test]
    fn wide_sum_equals_word_sum() {
        let plain = |d: &[u8], mut acc: u64| {
            for c in d.chunks(2) {
                acc += u64::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)]));
            }
            while acc > 0xffff {
                acc = (acc & 0xffff) + (acc >> 16);
            }
            acc as u16
        };
        let data: Vec<u8> = (0..300u32).map(|i| (i * 37 + 11) as u8).collect();
        for len in 0..data.len() {
            for acc in [0u32, 1, 0xffff, 0x1234_5678] {
                let d = &data[..len];
                assert_eq!(
                    fold(sum16(d, acc)),
                    plain(d, u64::from(acc)),
                    "len {len} acc {acc}"
                );
            }
        }
        assert_eq!(fold(sum16(&[0xff; 1500], 0)), 0xffff);
    }

    #[test]
    fn known_ipv4_header_checksum() {
        // The example header of RFC 1071 style tutorials (checksum 0xb861).
        let h: [u8; 20] = [
            0x45, 0x00, 0x00, 0x73, 0x00, 0x00, 0x40, 0x00, 0x40, 0x11, 0xb8, 0x61, 0xc0, 0xa8,
            0x00, 0x01, 0xc0, 0xa8, 0x00, 0xc7,
        ];
        let mut pkt = h.to_vec();
        pkt.resize(0x73, 0);
        assert!(Ipv4Packet::new_checked(&pkt).unwrap().checksum_ok());
        pkt[11] ^= 1;
        assert!(!Ipv4Packet::new_checked(&pkt).unwrap().checksum_ok());
    }

    #[test]
    fn rejects_bad_lengths_without_panicking() {
        let mut buf = [0u8; 128];
        let n = write_udp_frame(&mut buf, &addrs(), 1, b"abcdef").unwrap();
        // Every truncation is an error or "not UDP", never a panic.
        for cut in 0..n {
            assert!(
                !matches!(Udp4Frame::parse(&buf[..cut]), Ok(Some(_))),
                "{cut}"
            );
        }
        // Ethernet padding after the IP total length is ignored.
        let f = Udp4Frame::parse(&buf[..n + 10]).unwrap().unwrap();
        assert_eq!(f.udp.payload(), b"abcdef");
        // IHL below 5, UDP length below 8, total length below IHL.
        let mut b = buf;
        b[ETH_HLEN] = 0x44;
        assert_eq!(Udp4Frame::parse(&b[..n]).unwrap_err(), WireError::Malformed);
        let mut b = buf;
        b[ETH_HLEN + IPV4_HLEN + 4..ETH_HLEN + IPV4_HLEN + 6].copy_from_slice(&[0, 4]);
        assert_eq!(Udp4Frame::parse(&b[..n]).unwrap_err(), WireError::Malformed);
        let mut b = buf;
        b[ETH_HLEN + 2..ETH_HLEN + 4].copy_from_slice(&[0, 10]);
        assert_eq!(Udp4Frame::parse(&b[..n]).unwrap_err(), WireError::Malformed);
        // Not IPv4 / not UDP / a fragment: valid frames we pass over.
        let mut b = buf;
        b[12..14].copy_from_slice(&[0x86, 0xdd]);
        assert!(Udp4Frame::parse(&b[..n]).unwrap().is_none());
        let mut b = buf;
        b[ETH_HLEN + 9] = 6;
        assert!(Udp4Frame::parse(&b[..n]).unwrap().is_none());
        let mut b = buf;
        b[ETH_HLEN + 6] |= 0x20; // MF
        assert!(Udp4Frame::parse(&b[..n]).unwrap().is_none());
        // A corrupted payload fails the UDP checksum.
        let mut b = buf;
        b[n - 1] ^= 0xff;
        let f = Udp4Frame::parse(&b[..n]).unwrap().unwrap();
        assert!(!f.udp.checksum_ok(f.ip.src(), f.ip.dst()));
        // Output too small.
        assert!(write_udp_frame(&mut buf[..40], &addrs(), 1, b"abcdef").is_none());
    }

    fn v6_ends() -> (SocketAddrV6, SocketAddrV6) {
        (
            "[fd77:0:0:1::2]:40000".parse().unwrap(),
            "[fd77::1]:5004".parse().unwrap(),
        )
    }

    const MACS: ([u8; 6], [u8; 6]) = ([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2]);

    #[test]
    fn ipv6_build_then_parse_roundtrip() {
        let (src, dst) = v6_ends();
        let mut buf = [0u8; 160];
        for payload in [&b""[..], b"x", b"hello world, over IPv6"] {
            let n = write_udp6_frame(&mut buf, MACS, (src, dst), payload).unwrap();
            assert_eq!(n, UDP6_FRAME_OVERHEAD + payload.len());
            let Some(UdpFrame::V6(f)) = UdpFrame::parse(&buf[..n]).unwrap() else {
                panic!("not an IPv6 UDP frame");
            };
            assert_eq!((f.eth.src(), f.eth.dst()), MACS);
            assert_eq!((f.ip.src(), f.ip.dst()), (*src.ip(), *dst.ip()));
            assert_eq!(f.ip.hop_limit(), 64);
            assert_eq!((f.udp.src_port(), f.udp.dst_port()), (40000, 5004));
            assert_ne!(f.udp.checksum(), 0);
            assert!(f.udp.checksum_ok6(f.ip.src(), f.ip.dst()));
            assert_eq!(f.udp.payload(), payload);
            let any = UdpFrame::V6(f);
            assert_eq!(any.src(), SocketAddr::V6(src));
            assert_eq!(any.dst(), SocketAddr::V6(dst));
            assert_eq!(any.udp_offset(), ETH_HLEN + IPV6_HLEN);
            assert!(any.udp_checksum_ok() && any.ip_checksum_ok() && any.plain_header());
        }
    }

    /// A known IPv6 UDP checksum, worked by hand from RFC 8200's
    /// pseudo-header: ::1 to ::1, ports 1 and 2, payload "ab" (0x6162).
    #[test]
    fn known_ipv6_udp_checksum() {
        let (one, payload) = (Ipv6Addr::LOCALHOST, b"ab");
        let ends = (
            SocketAddrV6::new(one, 1, 0, 0),
            SocketAddrV6::new(one, 2, 0, 0),
        );
        let mut buf = [0u8; 80];
        let n = write_udp6_frame(&mut buf, MACS, ends, payload).unwrap();
        // Pseudo: 1 + 1 (addresses) + 10 (length) + 17; UDP: 1 + 2 + 10 +
        // 0x6162. Sum 0x618c, checksum !0x618c = 0x9e73.
        assert_eq!(be16(&buf, UDP6_FRAME_OVERHEAD - 2), 0x9e73);
        assert_eq!(n, UDP6_FRAME_OVERHEAD + 2);
    }

    #[test]
    fn ipv6_rejects_bad_frames_without_panicking() {
        let (src, dst) = v6_ends();
        let mut buf = [0u8; 160];
        let n = write_udp6_frame(&mut buf, MACS, (src, dst), b"abcdef").unwrap();
        for cut in 0..n {
            assert!(
                !matches!(UdpFrame::parse(&buf[..cut]), Ok(Some(_))),
                "{cut}"
            );
        }
        // Padding after the payload length is ignored.
        let Some(f) = UdpFrame::parse(&buf[..n + 10]).unwrap() else {
            panic!("padded frame");
        };
        assert_eq!(f.udp().payload(), b"abcdef");
        // Version 4 inside an IPv6 EtherType.
        let mut b = buf;
        b[ETH_HLEN] = 0x40;
        assert_eq!(UdpFrame::parse(&b[..n]).unwrap_err(), WireError::Malformed);
        // Payload length past the buffer.
        let mut b = buf;
        b[ETH_HLEN + 4..ETH_HLEN + 6].copy_from_slice(&[0x01, 0]);
        assert_eq!(UdpFrame::parse(&b[..n]).unwrap_err(), WireError::Truncated);
        // An extension header (hop-by-hop, fragment) or ICMPv6: not ours.
        for next in [0u8, 44, 58] {
            let mut b = buf;
            b[ETH_HLEN + 6] = next;
            assert!(UdpFrame::parse(&b[..n]).unwrap().is_none(), "{next}");
        }
        // A zero checksum is no checksum: refused over IPv6.
        let mut b = buf;
        b[UDP6_FRAME_OVERHEAD - 2..UDP6_FRAME_OVERHEAD].copy_from_slice(&[0, 0]);
        assert!(!UdpFrame::parse(&b[..n]).unwrap().unwrap().udp_checksum_ok());
        // A flipped payload bit fails.
        let mut b = buf;
        b[n - 1] ^= 1;
        assert!(!UdpFrame::parse(&b[..n]).unwrap().unwrap().udp_checksum_ok());
        assert!(write_udp6_frame(&mut buf[..60], MACS, (src, dst), b"abcdef").is_none());
    }
}
