//! pcap and pcapng capture files parsed from bytes (zero-copy), and
//! decoding of captured frames down to TCP segments and UDP payloads.
//!
//! Link types: Ethernet (1, with 802.1Q tags), Linux cooked SLL (113) and
//! SLL2 (276) as written by `tcpdump -i any`, raw IP (101, 12, 14, 228,
//! 229; a TUN device), loopback DLT_NULL (0) / DLT_LOOP (108), and NFLOG
//! (239, `tcpdump -i nflog:N`: packets where an iptables NFLOG rule saw
//! them).

use std::fmt;

/// Why a capture could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PcapError {
    /// Not a pcap or pcapng file.
    BadMagic,
    /// The file ends inside a header or record.
    Truncated,
    /// A pcapng block is malformed.
    BadBlock(&'static str),
}

impl fmt::Display for PcapError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PcapError::BadMagic => write!(f, "not a pcap/pcapng capture (bad magic)"),
            PcapError::Truncated => write!(f, "capture is truncated"),
            PcapError::BadBlock(w) => write!(f, "malformed pcapng block: {w}"),
        }
    }
}

impl std::error::Error for PcapError {}

/// One captured frame.
#[derive(Copy, Clone, Debug)]
pub struct Frame<'a> {
    /// Capture time, nanoseconds since the Unix epoch.
    pub ts_ns: u64,
    /// Link-layer type of the interface.
    pub linktype: u32,
    /// Captured bytes (possibly cut at the snap length).
    pub data: &'a [u8],
    /// Original length on the wire.
    pub orig_len: u32,
}

fn rd16(b: &[u8], le: bool) -> u16 {
    let bytes = [b[0], b[1]];
    if le {
        u16::from_le_bytes(bytes)
    } else {
        u16::from_be_bytes(bytes)
    }
}
fn rd32(b: &[u8], le: bool) -> u32 {
    let bytes = [b[0], b[1], b[2], b[3]];
    if le {
        u32::from_le_bytes(bytes)
    } else {
        u32::from_be_bytes(bytes)
    }
}

/// Parse a whole pcap or pcapng file into its frames (records that are
/// not packets are skipped; a truncated final record is an error).
pub fn parse(bytes: &[u8]) -> Result<Vec<Frame<'_>>, PcapError> {
    if bytes.len() < 4 {
        return Err(PcapError::BadMagic);
    }
    match &bytes[0..4] {
        [0xd4, 0xc3, 0xb2, 0xa1] => parse_pcap(bytes, true, 1_000),
        [0xa1, 0xb2, 0xc3, 0xd4] => parse_pcap(bytes, false, 1_000),
        [0x4d, 0x3c, 0xb2, 0xa1] => parse_pcap(bytes, true, 1),
        [0xa1, 0xb2, 0x3c, 0x4d] => parse_pcap(bytes, false, 1),
        [0x0a, 0x0d, 0x0d, 0x0a] => parse_pcapng(bytes),
        _ => Err(PcapError::BadMagic),
    }
}

fn parse_pcap(b: &[u8], le: bool, frac_ns: u64) -> Result<Vec<Frame<'_>>, PcapError> {
    if b.len() < 24 {
        return Err(PcapError::Truncated);
    }
    let linktype = rd32(&b[20..24], le) & 0x0fff_ffff;
    let mut out = Vec::new();
    let mut off = 24;
    while off < b.len() {
        let record = b.get(off..off + 16).ok_or(PcapError::Truncated)?;
        let sec = rd32(&record[0..4], le) as u64;
        let frac = rd32(&record[4..8], le) as u64;
        let incl = rd32(&record[8..12], le) as usize;
        let orig = rd32(&record[12..16], le);
        let data = b
            .get(off + 16..off + 16 + incl)
            .ok_or(PcapError::Truncated)?;
        out.push(Frame {
            ts_ns: sec * 1_000_000_000 + frac * frac_ns,
            linktype,
            data,
            orig_len: orig,
        });
        off += 16 + incl;
    }
    Ok(out)
}

struct Iface {
    linktype: u32,
    /// Timestamp units per second.
    units: u64,
}

/// An interface description block's body: linktype, reserved, snaplen,
/// options (of which the timestamp resolution is read).
fn interface_description(body: &[u8], little_endian: bool) -> Result<Iface, PcapError> {
    if body.len() < 8 {
        return Err(PcapError::BadBlock("interface description"));
    }
    let linktype = rd16(&body[0..2], little_endian) as u32;
    let mut units = 1_000_000u64;
    let mut offset = 8;
    while offset + 4 <= body.len() {
        let code = rd16(&body[offset..offset + 2], little_endian);
        let len = rd16(&body[offset + 2..offset + 4], little_endian) as usize;
        if code == 0 {
            break;
        }
        // An option whose value runs past the block is
        // malformed (S18: it used to panic on `val[0]`).
        let val = body
            .get(offset + 4..offset + 4 + len)
            .ok_or(PcapError::BadBlock("interface description option"))?;
        if let (9, &[resolution]) = (code, val) {
            let exp = (resolution & 0x7f) as u32;
            units = if resolution & 0x80 == 0 {
                10u64.checked_pow(exp).unwrap_or(1_000_000_000)
            } else {
                1u64.checked_shl(exp).unwrap_or(1_000_000_000)
            };
        }
        offset += 4 + len.div_ceil(4) * 4;
    }
    Ok(Iface { linktype, units })
}

/// An enhanced packet block's body: interface, timestamp high and low,
/// captured and original length, data.
fn enhanced_packet<'a>(
    body: &'a [u8],
    ifaces: &[Iface],
    little_endian: bool,
) -> Result<Frame<'a>, PcapError> {
    if body.len() < 20 {
        return Err(PcapError::BadBlock("enhanced packet"));
    }
    let ifc = ifaces
        .get(rd32(&body[0..4], little_endian) as usize)
        .ok_or(PcapError::BadBlock("unknown interface"))?;
    let timestamp = ((rd32(&body[4..8], little_endian) as u64) << 32)
        | rd32(&body[8..12], little_endian) as u64;
    let cap = rd32(&body[12..16], little_endian) as usize;
    let orig = rd32(&body[16..20], little_endian);
    let data = body
        .get(20..20 + cap)
        .ok_or(PcapError::BadBlock("enhanced packet length"))?;
    // `units` is at least 1; a time past u64 nanoseconds saturates.
    let ts_ns = u64::try_from(timestamp as u128 * 1_000_000_000 / ifc.units.max(1) as u128)
        .unwrap_or(u64::MAX);
    Ok(Frame {
        ts_ns,
        linktype: ifc.linktype,
        data,
        orig_len: orig,
    })
}

fn parse_pcapng(b: &[u8]) -> Result<Vec<Frame<'_>>, PcapError> {
    let mut out = Vec::new();
    let mut ifaces: Vec<Iface> = Vec::new();
    let mut little_endian = true;
    let mut off = 0;
    while off < b.len() {
        let hdr = b.get(off..off + 12).ok_or(PcapError::Truncated)?;
        let btype_raw = &hdr[0..4];
        if btype_raw == [0x0a, 0x0d, 0x0d, 0x0a] {
            // Section header: byte order magic decides endianness.
            little_endian = match &hdr[8..12] {
                [0x4d, 0x3c, 0x2b, 0x1a] => true,
                [0x1a, 0x2b, 0x3c, 0x4d] => false,
                _ => return Err(PcapError::BadBlock("section byte-order magic")),
            };
            ifaces.clear();
        }
        let btype = rd32(btype_raw, little_endian);
        let blen = rd32(&hdr[4..8], little_endian) as usize;
        if blen < 12 || !blen.is_multiple_of(4) {
            return Err(PcapError::BadBlock("block length"));
        }
        let block = b.get(off..off + blen).ok_or(PcapError::Truncated)?;
        let body = &block[8..blen - 4];
        match btype {
            1 => ifaces.push(interface_description(body, little_endian)?),
            6 => out.push(enhanced_packet(body, &ifaces, little_endian)?),
            3 => {
                // Simple packet: no timestamp.
                if body.len() < 4 {
                    return Err(PcapError::BadBlock("simple packet"));
                }
                let ifc = ifaces.first().ok_or(PcapError::BadBlock("no interface"))?;
                let orig = rd32(&body[0..4], little_endian);
                let data = &body[4..body.len().min(4 + orig as usize)];
                out.push(Frame {
                    ts_ns: 0,
                    linktype: ifc.linktype,
                    data,
                    orig_len: orig,
                });
            }
            _ => {}
        }
        off += blen;
    }
    Ok(out)
}

/// The network-layer packet inside a frame: `(ip version, ip bytes)`.
pub fn ip_of<'a>(f: &Frame<'a>) -> Option<(u8, &'a [u8])> {
    let data = f.data;
    let (ethertype_or_ver, ip): (u16, &[u8]) = match f.linktype {
        1 => {
            let mut off = 12;
            let mut ethertype = u16::from_be_bytes([*data.get(12)?, *data.get(13)?]);
            while ethertype == 0x8100 || ethertype == 0x88a8 {
                off += 4;
                ethertype = u16::from_be_bytes([*data.get(off)?, *data.get(off + 1)?]);
            }
            (ethertype, data.get(off + 2..)?)
        }
        113 => (
            u16::from_be_bytes([*data.get(14)?, *data.get(15)?]),
            data.get(16..)?,
        ),
        276 => (
            u16::from_be_bytes([*data.first()?, *data.get(1)?]),
            data.get(20..)?,
        ),
        0 | 108 => {
            let fam = data.get(0..4)?;
            let version = if f.linktype == 108 {
                u32::from_be_bytes([fam[0], fam[1], fam[2], fam[3]])
            } else {
                // Host byte order of the capturing machine: accept either.
                let family_word = u32::from_le_bytes([fam[0], fam[1], fam[2], fam[3]]);
                if family_word < 256 {
                    family_word
                } else {
                    u32::from_be_bytes([fam[0], fam[1], fam[2], fam[3]])
                }
            };
            match version {
                2 => (0x0800, data.get(4..)?),
                10 | 24 | 28 | 30 => (0x86dd, data.get(4..)?),
                _ => return None,
            }
        }
        101 | 12 | 14 | 228 | 229 => (0, data),
        239 => {
            // NFLOG (`tcpdump -i nflog:N`): family, version, resource id,
            // then TLVs (length and type in the capturing host's byte
            // order, here little-endian) up to the payload TLV (type 9).
            let family = *data.first()?;
            let mut off = 4;
            loop {
                let len = u16::from_le_bytes([*data.get(off)?, *data.get(off + 1)?]) as usize;
                let proto = u16::from_le_bytes([*data.get(off + 2)?, *data.get(off + 3)?]);
                if len < 4 {
                    return None;
                }
                if proto == 9 {
                    let ethertype = match family {
                        2 => 0x0800,
                        10 => 0x86dd,
                        _ => return None,
                    };
                    break (ethertype, data.get(off + 4..(off + len).min(data.len()))?);
                }
                off += len.div_ceil(4) * 4;
            }
        }
        _ => return None,
    };
    let ver = match ethertype_or_ver {
        0x0800 => 4,
        0x86dd => 6,
        0 => *ip.first()? >> 4,
        _ => return None,
    };
    if ip.first()? >> 4 != ver {
        return None;
    }
    Some((ver, ip))
}

/// A UDP datagram decoded from an IP packet.
#[derive(Copy, Clone, Debug)]
pub struct Udp<'a> {
    /// Source and destination addresses (4 or 16 bytes each).
    pub src: &'a [u8],
    /// See `src`.
    pub dst: &'a [u8],
    /// Source port.
    pub sport: u16,
    /// Destination port.
    pub dport: u16,
    /// The UDP payload (possibly cut by the snap length).
    pub payload: &'a [u8],
}

/// Decode UDP in an IPv4 (first fragment or unfragmented) or IPv6 packet.
pub fn udp_of(ver: u8, ip: &[u8]) -> Option<Udp<'_>> {
    let (src, dst, transport) = if ver == 4 {
        let ihl = (*ip.first()? & 0x0f) as usize * 4;
        let frag = u16::from_be_bytes([*ip.get(6)?, *ip.get(7)?]);
        if ihl < 20 || *ip.get(9)? != 17 || frag & 0x1fff != 0 {
            return None;
        }
        (ip.get(12..16)?, ip.get(16..20)?, ip.get(ihl..)?)
    } else {
        if *ip.get(6)? != 17 {
            return None;
        }
        (ip.get(8..24)?, ip.get(24..40)?, ip.get(40..)?)
    };
    let header = transport.get(0..8)?;
    let ulen = u16::from_be_bytes([header[4], header[5]]) as usize;
    let end = ulen.clamp(8, transport.len());
    Some(Udp {
        src,
        dst,
        sport: u16::from_be_bytes([header[0], header[1]]),
        dport: u16::from_be_bytes([header[2], header[3]]),
        payload: &transport[8..end],
    })
}
