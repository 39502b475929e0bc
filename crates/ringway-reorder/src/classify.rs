//! Suitability tests and flow keys for the sorter.
//!
//! TCP (paper, Section 3): a segment is sorted only if it is not an IP
//! fragment, its IP header has no options, its TCP header carries no option
//! other than timestamps (NOP/EOL padding allowed), none of
//! SYN/FIN/RST/URG/ECE/CWR is set, and it carries payload (pure ACKs are
//! never delayed: our interpretation, see `docs/srpic.md`). Unsuitable
//! segments of a parsable 4-tuple give [`Class::Bypass`], anything else
//! [`Class::PassThrough`].
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
    let cc = (p[0] & 0x0f) as usize;
    if p.len() < 12 + 4 * cc {
        return None;
    }
    let seq = u16::from_be_bytes([p[2], p[3]]);
    let ssrc = u32::from_be_bytes([p[8], p[9], p[10], p[11]]);
    Some((ssrc, seq))
}

/// Facts about a TCP segment needed for suitability and flow identity.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct TcpSeg {
    /// (src addr, dst addr, src port, dst port).
    pub key: FlowKey,
    /// Sequence number.
    pub seq: u32,
    /// Payload length in bytes.
    pub payload_len: u32,
    /// Flags byte.
    pub flags: u8,
    /// TCP options other than timestamps/NOP/EOL present.
    pub other_options: bool,
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

/// Parse the TCP header `tcp` (with `payload_len` derived from the IP
/// header); `addrs` are the concatenated source and destination addresses.
fn tcp_seg(addrs: (&[u8], &[u8]), tcp: &[u8], seg_len: usize, ip_bad: bool) -> Option<TcpSeg> {
    if tcp.len() < 20 || seg_len < 20 {
        return None;
    }
    let doff = (tcp[12] >> 4) as usize * 4;
    if doff < 20 || doff > tcp.len() || doff > seg_len {
        return None;
    }
    let mut other = false;
    let opts = &tcp[20..doff];
    let mut i = 0;
    while i < opts.len() {
        match opts[i] {
            0 => break,
            1 => i += 1,
            kind => {
                let l = *opts.get(i + 1)? as usize;
                if l < 2 || i + l > opts.len() {
                    return None;
                }
                if !(kind == 8 && l == 10) {
                    other = true;
                }
                i += l;
            }
        }
    }
    Some(TcpSeg {
        key: FlowKey::from_parts(&[addrs.0, addrs.1, &tcp[0..2], &tcp[2..4]])?,
        seq: u32::from_be_bytes([tcp[4], tcp[5], tcp[6], tcp[7]]),
        payload_len: (seg_len - doff) as u32,
        flags: tcp[13],
        other_options: other,
        ip_unsuitable: ip_bad,
    })
}

/// Parse an IPv4 packet carrying TCP. `None` if it is not IPv4/TCP or is malformed.
pub fn ipv4_tcp(ip: &[u8]) -> Option<TcpSeg> {
    if ip.len() < 20 || ip[0] >> 4 != 4 {
        return None;
    }
    let ihl = (ip[0] & 0x0f) as usize * 4;
    let total = u16::from_be_bytes([ip[2], ip[3]]) as usize;
    if ihl < 20 || total < ihl || total > ip.len() || ip[9] != 6 {
        return None;
    }
    let frag = u16::from_be_bytes([ip[6], ip[7]]);
    let is_frag = frag & 0x2000 != 0 || frag & 0x1fff != 0;
    if frag & 0x1fff != 0 {
        // Non-first fragment: no TCP header here.
        return None;
    }
    tcp_seg(
        (&ip[12..16], &ip[16..20]),
        &ip[ihl..total],
        total - ihl,
        is_frag || ihl != 20,
    )
}

/// Parse an IPv6 packet whose next header is directly TCP (any extension
/// header makes it unparsable here, hence pass-through).
pub fn ipv6_tcp(ip: &[u8]) -> Option<TcpSeg> {
    if ip.len() < 40 || ip[0] >> 4 != 6 || ip[6] != 6 {
        return None;
    }
    let plen = u16::from_be_bytes([ip[4], ip[5]]) as usize;
    if 40 + plen > ip.len() {
        return None;
    }
    tcp_seg((&ip[8..24], &ip[24..40]), &ip[40..40 + plen], plen, false)
}

/// Classify an IPv4 packet for a TCP-mode sorter.
pub fn classify_ipv4_tcp(ip: &[u8]) -> Class {
    ipv4_tcp(ip).map_or(Class::PassThrough, |s| s.class())
}

/// Classify an IPv6 packet for a TCP-mode sorter.
pub fn classify_ipv6_tcp(ip: &[u8]) -> Class {
    ipv6_tcp(ip).map_or(Class::PassThrough, |s| s.class())
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
