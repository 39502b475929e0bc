//! Suitability tests and flow keys for the sorter.
//!
//! TCP (paper, Section 3): a segment is sorted only if it is not an IP
//! fragment, its IP header has no options, its TCP header carries no option
//! other than timestamps (NOP/EOL padding allowed), none of
//! SYN/FIN/RST/URG/ECE/CWR is set, and it carries payload (pure ACKs are
//! never delayed: our interpretation, see `docs/srpic.md`). Unsuitable
//! segments of a parsable 5-tuple give [`Class::Bypass`], anything else
//! [`Class::PassThrough`]. A TCP flow's key is its whole 5-tuple
//! (protocol, addresses, ports). Only the headers are read: a segment whose
//! payload was cut off (snap length, NFQUEUE copy range) is classified by
//! the lengths in its IP header. [`inspect_ip`] tells drivers whether a
//! packet was malformed, not TCP, or TCP.
//!
//! RTP: version 2, at least 12 bytes, not RTCP (packet types 200..=204 sent
//! on the same port, RFC 5761); the flow is the SSRC, the sequence number
//! the 16-bit RTP sequence number, length 1.

use crate::key::FlowKey;
use crate::sorter::Class;

/// TCP flag bits.
pub mod tcp_flags {
    /// FIN.
    pub const FIN: u8 = 0x01;
    /// SYN.
    pub const SYN: u8 = 0x02;
    /// RST.
    pub const RST: u8 = 0x04;
    /// PSH.
    pub const PSH: u8 = 0x08;
    /// ACK.
    pub const ACK: u8 = 0x10;
    /// URG.
    pub const URG: u8 = 0x20;
    /// ECE.
    pub const ECE: u8 = 0x40;
    /// CWR.
    pub const CWR: u8 = 0x80;
    /// Flags that make a segment unsuitable for sorting.
    pub const UNSUITABLE: u8 = SYN | FIN | RST | URG | ECE | CWR;
}

/// Classify an RTP packet (the UDP payload) by SSRC and 16-bit sequence
/// number. Where the sender's address is known, key by it too (as the SFU
/// and `analyze` do): an SSRC is chosen by the sender and can collide.
pub fn classify_rtp(payload: &[u8]) -> Class {
    match rtp_seq(payload) {
        Some((ssrc, seq)) => Class::Flow {
            key: FlowKey::from_u64(ssrc as u64),
            seq: seq as u32,
            len: 1,
        },
        None => Class::PassThrough,
    }
}

/// `(ssrc, seq)` of an RTP packet, or `None` if it is not RTP v2 (or is RTCP).
pub fn rtp_seq(p: &[u8]) -> Option<(u32, u16)> {
    if p.len() < 12 || p[0] >> 6 != 2 {
        return None;
    }
    if (200..=204).contains(&p[1]) {
        return None; // RTCP multiplexed on the RTP port
    }
    let csrc_count = (p[0] & 0x0f) as usize;
    if p.len() < 12 + 4 * csrc_count {
        return None;
    }
    let seq = u16::from_be_bytes([p[2], p[3]]);
    let ssrc = u32::from_be_bytes([p[8], p[9], p[10], p[11]]);
    Some((ssrc, seq))
}

/// Facts about a TCP segment: what suitability and flow identity need,
/// plus the acknowledgement fields a relay counts (duplicate ACKs, SACK
/// blocks). Parsed from the headers alone: the payload may be cut off (a
/// snap-length-limited capture, an NFQUEUE copy range), its length comes
/// from the IP header.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct TcpSeg {
    /// The 5-tuple: protocol (6), source address, destination address,
    /// source port, destination port.
    pub key: FlowKey,
    /// Sequence number.
    pub seq: u32,
    /// Acknowledgement number (meaningful when ACK is set).
    pub ack: u32,
    /// Window field as sent (unscaled).
    pub window: u16,
    /// Payload length in bytes (from the IP header, not from what was captured).
    pub payload_len: u32,
    /// Flags byte.
    pub flags: u8,
    /// SACK blocks carried (option kind 5), DSACK blocks included.
    pub sack_blocks: u8,
    /// TCP options other than timestamps/NOP/EOL present.
    pub other_options: bool,
    /// TSval of the timestamps option (RFC 7323), when present.
    pub tsval: Option<u32>,
    /// IP-level problems: fragment or IPv4 options / IPv6 extension headers.
    pub ip_unsuitable: bool,
}

impl TcpSeg {
    /// The sorter class of this segment.
    pub fn class(&self) -> Class {
        if self.ip_unsuitable
            || self.other_options
            || self.flags & tcp_flags::UNSUITABLE != 0
            || self.payload_len == 0
        {
            Class::Bypass { key: self.key }
        } else {
            Class::Flow {
                key: self.key,
                seq: self.seq,
                len: self.payload_len,
            }
        }
    }
}

/// What an IP packet is, for drivers that must pass everything on and
/// count what they could not sort.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Inspect {
    /// Not a well-formed IPv4/IPv6 packet, or a TCP header that is cut
    /// short or inconsistent (data offset, option lengths).
    Malformed,
    /// Well-formed IP but not a TCP segment this parser reads (another
    /// protocol, a non-first fragment, an IPv6 extension header).
    NotTcp,
    /// A TCP segment.
    Tcp(TcpSeg),
}

impl Inspect {
    /// The sorter class (`PassThrough` unless TCP).
    pub fn class(&self) -> Class {
        match self {
            Inspect::Tcp(s) => s.class(),
            _ => Class::PassThrough,
        }
    }
}

/// Parse the TCP header at the start of `tcp` (`tcp` is what was captured
/// of the segment, `seg_len` its length per the IP header); `addrs` are
/// the source and destination addresses.
fn tcp_seg(addrs: (&[u8], &[u8]), tcp: &[u8], seg_len: usize, ip_bad: bool) -> Inspect {
    if tcp.len() < 20 || seg_len < 20 {
        return Inspect::Malformed;
    }
    let doff = (tcp[12] >> 4) as usize * 4;
    if doff < 20 || doff > tcp.len() || doff > seg_len {
        return Inspect::Malformed;
    }
    let mut other = false;
    let mut sack_blocks = 0u8;
    let mut tsval = None;
    let opts = &tcp[20..doff];
    let mut offset = 0;
    while offset < opts.len() {
        match opts[offset] {
            0 => break,
            1 => offset += 1,
            kind => {
                let Some(&option_len) = opts.get(offset + 1) else {
                    return Inspect::Malformed;
                };
                let option_len = option_len as usize;
                if option_len < 2 || offset + option_len > opts.len() {
                    return Inspect::Malformed;
                }
                match kind {
                    8 if option_len == 10 => {
                        let v = &opts[offset + 2..offset + 6];
                        tsval = Some(u32::from_be_bytes([v[0], v[1], v[2], v[3]]));
                    }
                    5 => {
                        sack_blocks = sack_blocks.saturating_add(((option_len - 2) / 8) as u8);
                        other = true;
                    }
                    _ => other = true,
                }
                offset += option_len;
            }
        }
    }
    let Some(key) = FlowKey::from_parts(&[&[6], addrs.0, addrs.1, &tcp[0..2], &tcp[2..4]]) else {
        return Inspect::Malformed;
    };
    Inspect::Tcp(TcpSeg {
        key,
        seq: u32::from_be_bytes([tcp[4], tcp[5], tcp[6], tcp[7]]),
        ack: u32::from_be_bytes([tcp[8], tcp[9], tcp[10], tcp[11]]),
        window: u16::from_be_bytes([tcp[14], tcp[15]]),
        payload_len: (seg_len - doff) as u32,
        flags: tcp[13],
        sack_blocks,
        other_options: other,
        tsval,
        ip_unsuitable: ip_bad,
    })
}

/// Inspect an IPv4 packet. `ip` may be cut short after the TCP header
/// (the payload length is taken from the IP total length).
pub fn inspect_ipv4(ip: &[u8]) -> Inspect {
    if ip.len() < 20 || ip[0] >> 4 != 4 {
        return Inspect::Malformed;
    }
    let ihl = (ip[0] & 0x0f) as usize * 4;
    let total = u16::from_be_bytes([ip[2], ip[3]]) as usize;
    if ihl < 20 || total < ihl || ip.len() < ihl {
        return Inspect::Malformed;
    }
    if ip[9] != 6 {
        return Inspect::NotTcp;
    }
    let frag = u16::from_be_bytes([ip[6], ip[7]]);
    if frag & 0x1fff != 0 {
        // Non-first fragment: no TCP header here.
        return Inspect::NotTcp;
    }
    let is_frag = frag & 0x2000 != 0;
    let captured = &ip[ihl..ip.len().min(total)];
    tcp_seg(
        (&ip[12..16], &ip[16..20]),
        captured,
        total - ihl,
        is_frag || ihl != 20,
    )
}

/// Inspect an IPv6 packet whose next header is directly TCP (any
/// extension header: [`Inspect::NotTcp`]). `ip` may be cut short after
/// the TCP header.
pub fn inspect_ipv6(ip: &[u8]) -> Inspect {
    if ip.len() < 40 || ip[0] >> 4 != 6 {
        return Inspect::Malformed;
    }
    if ip[6] != 6 {
        return Inspect::NotTcp;
    }
    let plen = u16::from_be_bytes([ip[4], ip[5]]) as usize;
    let captured = &ip[40..ip.len().min(40 + plen)];
    tcp_seg((&ip[8..24], &ip[24..40]), captured, plen, false)
}

/// Inspect an IPv4 or IPv6 packet (by its version nibble).
pub fn inspect_ip(ip: &[u8]) -> Inspect {
    match ip.first().map(|b| b >> 4) {
        Some(4) => inspect_ipv4(ip),
        Some(6) => inspect_ipv6(ip),
        _ => Inspect::Malformed,
    }
}

/// Parse an IPv4 packet carrying TCP. `None` if it is not IPv4/TCP or is malformed.
pub fn ipv4_tcp(ip: &[u8]) -> Option<TcpSeg> {
    match inspect_ipv4(ip) {
        Inspect::Tcp(s) => Some(s),
        _ => None,
    }
}

/// Parse an IPv6 packet whose next header is directly TCP.
pub fn ipv6_tcp(ip: &[u8]) -> Option<TcpSeg> {
    match inspect_ipv6(ip) {
        Inspect::Tcp(s) => Some(s),
        _ => None,
    }
}

/// Classify an IPv4 packet for a TCP-mode sorter.
pub fn classify_ipv4_tcp(ip: &[u8]) -> Class {
    inspect_ipv4(ip).class()
}

/// Classify an IPv6 packet for a TCP-mode sorter.
pub fn classify_ipv6_tcp(ip: &[u8]) -> Class {
    inspect_ipv6(ip).class()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ipv4_tcp_pkt(ihl_words: u8, flags: u8, opts: &[u8], payload: usize, frag: u16) -> Vec<u8> {
        let ihl = ihl_words as usize * 4;
        let doff = 20 + opts.len();
        let total = ihl + doff + payload;
        let mut p = vec![0u8; total];
        p[0] = 0x40 | ihl_words;
        p[2..4].copy_from_slice(&(total as u16).to_be_bytes());
        p[6..8].copy_from_slice(&frag.to_be_bytes());
        p[8] = 64;
        p[9] = 6;
        p[12..16].copy_from_slice(&[10, 0, 0, 1]);
        p[16..20].copy_from_slice(&[10, 0, 0, 2]);
        let t = &mut p[ihl..];
        t[0..2].copy_from_slice(&1234u16.to_be_bytes());
        t[2..4].copy_from_slice(&80u16.to_be_bytes());
        t[4..8].copy_from_slice(&1000u32.to_be_bytes());
        t[12] = ((doff / 4) as u8) << 4;
        t[13] = flags;
        t[20..20 + opts.len()].copy_from_slice(opts);
        p
    }

    #[test]
    fn tcp_suitability() {
        let ts = [1, 1, 8, 10, 0, 0, 0, 1, 0, 0, 0, 2];
        let good = ipv4_tcp_pkt(5, tcp_flags::ACK, &ts, 100, 0x4000);
        match classify_ipv4_tcp(&good) {
            Class::Flow { seq, len, .. } => assert_eq!((seq, len), (1000, 100)),
            c => panic!("{c:?}"),
        }
        let key = ipv4_tcp(&good).unwrap().key;
        for flag in [
            tcp_flags::SYN,
            tcp_flags::FIN,
            tcp_flags::RST,
            tcp_flags::URG,
            tcp_flags::ECE,
            tcp_flags::CWR,
        ] {
            let p = ipv4_tcp_pkt(5, tcp_flags::ACK | flag, &[], 10, 0);
            assert_eq!(
                classify_ipv4_tcp(&p),
                Class::Bypass { key },
                "flag {flag:#x}"
            );
        }
        // MSS option, SACK-permitted: unsuitable.
        let p = ipv4_tcp_pkt(5, tcp_flags::ACK, &[2, 4, 5, 0xb4], 10, 0);
        assert_eq!(classify_ipv4_tcp(&p), Class::Bypass { key });
        // IP options (ihl 6).
        let p = ipv4_tcp_pkt(6, tcp_flags::ACK, &[], 10, 0);
        assert_eq!(classify_ipv4_tcp(&p), Class::Bypass { key });
        // First fragment (MF set).
        let p = ipv4_tcp_pkt(5, tcp_flags::ACK, &[], 10, 0x2000);
        assert_eq!(classify_ipv4_tcp(&p), Class::Bypass { key });
        // Later fragment: no TCP header at all.
        let p = ipv4_tcp_pkt(5, tcp_flags::ACK, &[], 10, 0x0010);
        assert_eq!(classify_ipv4_tcp(&p), Class::PassThrough);
        // Pure ACK.
        let p = ipv4_tcp_pkt(5, tcp_flags::ACK, &[], 0, 0);
        assert_eq!(classify_ipv4_tcp(&p), Class::Bypass { key });
        // Garbage and truncation never panic.
        assert_eq!(classify_ipv4_tcp(&good[..30]), Class::PassThrough);
        assert_eq!(classify_ipv4_tcp(&[]), Class::PassThrough);
        let mut bad = good.clone();
        bad[20 + 12] = 0xf0; // data offset 60 > segment
        let _ = classify_ipv4_tcp(&bad);
    }

    #[test]
    fn headers_alone_are_enough_and_fields_are_read() {
        // Timestamps + a 2-block SACK option (NOP NOP kind 5 len 18).
        let mut opts = vec![1, 1, 8, 10, 0, 0, 0, 1, 0, 0, 0, 2, 1, 1, 5, 18];
        opts.extend([0u8; 16]);
        let mut p = ipv4_tcp_pkt(5, tcp_flags::ACK, &opts, 1448, 0x4000);
        p[20 + 8..20 + 12].copy_from_slice(&77u32.to_be_bytes());
        p[20 + 14..20 + 16].copy_from_slice(&501u16.to_be_bytes());
        let full = ipv4_tcp(&p).unwrap();
        assert_eq!(full.payload_len, 1448);
        assert_eq!((full.ack, full.window, full.sack_blocks), (77, 501, 2));
        assert!(full.other_options, "SACK is not a timestamp option");
        assert_eq!(full.tsval, Some(1));
        assert_eq!(
            ipv4_tcp(&ipv4_tcp_pkt(5, 0, &[], 10, 0)).unwrap().tsval,
            None
        );
        // Cut right after the TCP header (a -s 128 capture keeps less of a
        // 1500-byte packet than this): same segment.
        let hdr = 20 + 20 + opts.len();
        assert_eq!(ipv4_tcp(&p[..hdr]), Some(full));
        // Cut inside the TCP options: malformed, not a guess.
        assert_eq!(inspect_ipv4(&p[..hdr - 1]), Inspect::Malformed);
        // The key is the 5-tuple: protocol, addresses, ports.
        assert_eq!(
            full.key.as_bytes(),
            &[6, 10, 0, 0, 1, 10, 0, 0, 2, 4, 210, 0, 80]
        );
        // Ethernet padding beyond the IP total length is not payload.
        let mut padded = ipv4_tcp_pkt(5, tcp_flags::ACK, &[], 0, 0);
        padded.extend([0u8; 6]);
        assert_eq!(ipv4_tcp(&padded).unwrap().payload_len, 0);
    }

    #[test]
    fn inspect_sorts_out_malformed_and_other_protocols() {
        let good = ipv4_tcp_pkt(5, tcp_flags::ACK, &[], 10, 0);
        assert!(matches!(inspect_ip(&good), Inspect::Tcp(_)));
        let mut udp = good.clone();
        udp[9] = 17;
        assert_eq!(inspect_ip(&udp), Inspect::NotTcp);
        let mut later_fragment = good.clone();
        later_fragment[6..8].copy_from_slice(&0x0010u16.to_be_bytes());
        assert_eq!(inspect_ip(&later_fragment), Inspect::NotTcp);
        let mut bad_ihl = good.clone();
        bad_ihl[0] = 0x43;
        assert_eq!(inspect_ip(&bad_ihl), Inspect::Malformed);
        let mut bad_total = good.clone();
        bad_total[2..4].copy_from_slice(&10u16.to_be_bytes());
        assert_eq!(inspect_ip(&bad_total), Inspect::Malformed);
        let mut bad_opt = ipv4_tcp_pkt(5, tcp_flags::ACK, &[3, 9, 0, 0], 10, 0);
        bad_opt[20 + 20 + 1] = 9; // option length past the header
        assert_eq!(inspect_ip(&bad_opt), Inspect::Malformed);
        assert_eq!(inspect_ip(&[0x45]), Inspect::Malformed);
        assert_eq!(inspect_ip(&[]), Inspect::Malformed);
        assert_eq!(inspect_ip(&[0x15; 40]), Inspect::Malformed);
        // IPv6: TCP directly, or an extension header.
        let mut v6 = vec![0u8; 40 + 20 + 5];
        v6[0] = 0x60;
        v6[4..6].copy_from_slice(&25u16.to_be_bytes());
        v6[6] = 6;
        v6[40 + 12] = 5 << 4;
        v6[40 + 13] = tcp_flags::ACK;
        match inspect_ip(&v6) {
            Inspect::Tcp(s) => {
                assert_eq!(s.payload_len, 5);
                assert_eq!(s.key.as_bytes().len(), 37);
            }
            other => panic!("{other:?}"),
        }
        assert!(
            matches!(inspect_ip(&v6[..60]), Inspect::Tcp(_)),
            "payload cut"
        );
        v6[6] = 0; // hop-by-hop options header
        assert_eq!(inspect_ip(&v6), Inspect::NotTcp);
    }

    #[test]
    fn rtp_classes() {
        let mut p = [0u8; 12];
        p[0] = 0x80;
        p[1] = 96;
        p[2..4].copy_from_slice(&65535u16.to_be_bytes());
        p[8..12].copy_from_slice(&0xdeadbeefu32.to_be_bytes());
        assert_eq!(
            classify_rtp(&p),
            Class::Flow {
                key: FlowKey::from_u64(0xdeadbeef),
                seq: 65535,
                len: 1
            }
        );
        p[1] = 200; // RTCP SR
        assert_eq!(classify_rtp(&p), Class::PassThrough);
        p[1] = 96;
        p[0] = 0x83; // 3 CSRCs but too short
        assert_eq!(classify_rtp(&p), Class::PassThrough);
        assert_eq!(classify_rtp(&p[..5]), Class::PassThrough);
    }
}
