//! The DNS wire format (RFC 1035, RFC 2782 SRV, RFC 3403 NAPTR, RFC 3596
//! AAAA): one query written into a caller's buffer, one response read into
//! the few record types SIP next-hop resolution uses.
//!
//! Bounds: a response is read only within its datagram; the header's
//! counts are never used to allocate (each record is read off the bytes,
//! at most [`MAX_RECORDS`] kept, the rest skipped); a name is at most 255
//! bytes and a compression pointer must point backwards (so a name cannot
//! loop); a character string is at most 255 bytes by construction.

use std::fmt;
use std::net::{Ipv4Addr, Ipv6Addr};

/// Records kept from one response (answer and additional sections).
pub const MAX_RECORDS: usize = 64;
/// The longest name on the wire (RFC 1035 3.1).
const MAX_NAME: usize = 255;
/// Our EDNS0 payload size (the DNS flag day 2020 value: no fragments).
pub const EDNS_PAYLOAD: u16 = 1232;

/// The record types we ask for or read.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum RecordType {
    /// IPv4 address.
    A,
    /// IPv6 address.
    Aaaa,
    /// Alias.
    Cname,
    /// Service location (RFC 2782).
    Srv,
    /// Naming authority pointer (RFC 3403).
    Naptr,
}

impl RecordType {
    /// The type's code on the wire.
    pub fn code(self) -> u16 {
        match self {
            RecordType::A => 1,
            RecordType::Cname => 5,
            RecordType::Aaaa => 28,
            RecordType::Srv => 33,
            RecordType::Naptr => 35,
        }
    }

    fn from_code(code: u16) -> Option<RecordType> {
        [
            RecordType::A,
            RecordType::Aaaa,
            RecordType::Cname,
            RecordType::Srv,
            RecordType::Naptr,
        ]
        .into_iter()
        .find(|t| t.code() == code)
    }
}

impl fmt::Display for RecordType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            RecordType::A => "A",
            RecordType::Aaaa => "AAAA",
            RecordType::Cname => "CNAME",
            RecordType::Srv => "SRV",
            RecordType::Naptr => "NAPTR",
        })
    }
}

/// The data of a record we read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RecordData {
    /// An IPv4 address.
    A(Ipv4Addr),
    /// An IPv6 address.
    Aaaa(Ipv6Addr),
    /// The canonical name of an alias.
    Cname(String),
    /// A service target.
    Srv {
        /// Lower is tried first.
        priority: u16,
        /// Share within a priority.
        weight: u16,
        /// The port.
        port: u16,
        /// The target host (`.` — empty here — means "no service").
        target: String,
    },
    /// A naming authority pointer.
    Naptr {
        /// Lower is tried first.
        order: u16,
        /// Lower is tried first within an order.
        preference: u16,
        /// Flags (`s`: the replacement is an SRV name).
        flags: String,
        /// Services (`SIP+D2U`, `SIP+D2T`, `SIPS+D2T`).
        services: String,
        /// The next name to look up.
        replacement: String,
    },
}

impl RecordData {
    /// The record's type.
    pub fn record_type(&self) -> RecordType {
        match self {
            RecordData::A(_) => RecordType::A,
            RecordData::Aaaa(_) => RecordType::Aaaa,
            RecordData::Cname(_) => RecordType::Cname,
            RecordData::Srv { .. } => RecordType::Srv,
            RecordData::Naptr { .. } => RecordType::Naptr,
        }
    }

    /// Bytes this record holds on the heap and inline (for cache bounds).
    pub fn footprint(&self) -> usize {
        std::mem::size_of::<RecordData>()
            + match self {
                RecordData::A(_) | RecordData::Aaaa(_) => 0,
                RecordData::Cname(name) | RecordData::Srv { target: name, .. } => name.len(),
                RecordData::Naptr {
                    flags,
                    services,
                    replacement,
                    ..
                } => flags.len() + services.len() + replacement.len(),
            }
    }
}

/// One resource record: owner name (lower case, no trailing dot), TTL
/// (seconds) and data.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    /// Owner name.
    pub name: String,
    /// Time to live (s).
    pub ttl: u32,
    /// The data.
    pub data: RecordData,
}

/// A response read off the wire.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Response {
    /// The query id it answers.
    pub id: u16,
    /// RCODE (0 no error, 2 server failure, 3 name error).
    pub rcode: u8,
    /// TC: the answer did not fit the datagram.
    pub truncated: bool,
    /// The question's name (lower case, no trailing dot).
    pub question: String,
    /// The question's type code.
    pub question_type: u16,
    /// The records we read of the answer and additional sections.
    pub records: Vec<Record>,
    /// The negative-caching TTL (RFC 2308: the SOA's TTL capped by its
    /// MINIMUM), when the authority section has an SOA.
    pub negative_ttl: Option<u32>,
}

/// Why a response was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WireError {
    /// It ended inside a field.
    Truncated,
    /// Not a response (QR clear) or not one question.
    NotAResponse,
    /// A name longer than 255 bytes, a bad label or a forward pointer.
    BadName,
    /// A record's data does not match its length or type.
    BadRecord,
}

impl fmt::Display for WireError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            WireError::Truncated => "response cut short",
            WireError::NotAResponse => "not a response to one question",
            WireError::BadName => "malformed name",
            WireError::BadRecord => "malformed record",
        })
    }
}

/// Write a recursive query for `name`/`record_type` with `id` into `out`
/// (cleared first), with an EDNS0 OPT record. `None` if `name` is not a
/// valid host name (a label empty or over 63 bytes, the name over 253).
pub fn write_query(id: u16, name: &str, record_type: RecordType, out: &mut Vec<u8>) -> Option<()> {
    out.clear();
    out.extend_from_slice(&id.to_be_bytes());
    out.extend_from_slice(&0x0100u16.to_be_bytes()); // RD
    out.extend_from_slice(&[0, 1, 0, 0, 0, 0, 0, 1]); // 1 question, 1 additional
    let name = name.strip_suffix('.').unwrap_or(name);
    if name.is_empty() || name.len() > 253 {
        return None;
    }
    for label in name.split('.') {
        if label.is_empty() || label.len() > 63 {
            return None;
        }
        out.push(label.len() as u8);
        out.extend_from_slice(label.as_bytes());
    }
    out.push(0);
    out.extend_from_slice(&record_type.code().to_be_bytes());
    out.extend_from_slice(&1u16.to_be_bytes()); // IN
                                                // OPT: root name, type 41, class = payload size, TTL 0, no options.
    out.push(0);
    out.extend_from_slice(&41u16.to_be_bytes());
    out.extend_from_slice(&EDNS_PAYLOAD.to_be_bytes());
    out.extend_from_slice(&[0, 0, 0, 0, 0, 0]);
    Some(())
}

/// A cursor over a response.
struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], WireError> {
        let end = self.at.checked_add(n).ok_or(WireError::Truncated)?;
        let slice = self.bytes.get(self.at..end).ok_or(WireError::Truncated)?;
        self.at = end;
        Ok(slice)
    }

    fn u8(&mut self) -> Result<u8, WireError> {
        Ok(self.take(1)?[0])
    }

    fn u16(&mut self) -> Result<u16, WireError> {
        let b = self.take(2)?;
        Ok(u16::from_be_bytes([b[0], b[1]]))
    }

    fn u32(&mut self) -> Result<u32, WireError> {
        let b = self.take(4)?;
        Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }

    /// A (possibly compressed) name at the cursor, lower case, dots
    /// between labels, no trailing dot (the root is empty).
    fn name(&mut self) -> Result<String, WireError> {
        let (name, end) = read_name(self.bytes, self.at)?;
        self.at = end;
        Ok(name)
    }

    /// A character string (length byte, then at most 255 bytes).
    fn character_string(&mut self) -> Result<String, WireError> {
        let len = usize::from(self.u8()?);
        let bytes = self.take(len)?;
        Ok(String::from_utf8_lossy(bytes).into_owned())
    }
}

/// Read the name at `start` in `bytes`: its text and where the bytes after
/// it (after the first pointer, if any) begin. Pointers must point strictly
/// before the label that holds them, so every jump goes backwards and the
/// walk ends.
fn read_name(bytes: &[u8], start: usize) -> Result<(String, usize), WireError> {
    let mut name = String::new();
    let mut at = start;
    let mut end = None;
    loop {
        let len = *bytes.get(at).ok_or(WireError::Truncated)?;
        match len & 0xC0 {
            0x00 => {
                if len == 0 {
                    return Ok((name, end.unwrap_or(at + 1)));
                }
                let label = bytes
                    .get(at + 1..at + 1 + usize::from(len))
                    .ok_or(WireError::Truncated)?;
                if !name.is_empty() {
                    name.push('.');
                }
                for &b in label {
                    name.push(char::from(b.to_ascii_lowercase()));
                }
                if name.len() > MAX_NAME {
                    return Err(WireError::BadName);
                }
                at += 1 + usize::from(len);
            }
            0xC0 => {
                let low = *bytes.get(at + 1).ok_or(WireError::Truncated)?;
                let target = usize::from(u16::from_be_bytes([len & 0x3F, low]));
                if target >= at {
                    return Err(WireError::BadName);
                }
                end.get_or_insert(at + 2);
                at = target;
            }
            _ => return Err(WireError::BadName),
        }
    }
}

/// Read a response datagram. Records of types we do not read are skipped;
/// at most [`MAX_RECORDS`] are kept.
pub fn parse_response(bytes: &[u8]) -> Result<Response, WireError> {
    let mut r = Reader { bytes, at: 0 };
    let id = r.u16()?;
    let flags = r.u16()?;
    let questions = r.u16()?;
    let answers = r.u16()?;
    let authority = r.u16()?;
    let additional = r.u16()?;
    if flags & 0x8000 == 0 || questions != 1 {
        return Err(WireError::NotAResponse);
    }
    let question = r.name()?;
    let question_type = r.u16()?;
    r.u16()?; // class
    let mut records = Vec::new();
    let mut negative_ttl = None;
    // Each section is read off the bytes: a count larger than what the
    // datagram holds ends in `Truncated`, never in an allocation.
    for section in 0..3 {
        let count = [answers, authority, additional][section];
        for _ in 0..count {
            let name = r.name()?;
            let code = r.u16()?;
            let _class = r.u16()?;
            let ttl = r.u32()?;
            let len = usize::from(r.u16()?);
            let data_at = r.at;
            let data = r.take(len)?;
            if section == 1 {
                if code == 6 {
                    negative_ttl = Some(soa_negative_ttl(bytes, data_at, len, ttl)?);
                }
                continue;
            }
            let Some(record_type) = RecordType::from_code(code) else {
                continue;
            };
            let data = record_data(bytes, data_at, data, record_type)?;
            if records.len() < MAX_RECORDS {
                records.push(Record {
                    name,
                    ttl: ttl.min(i32::MAX as u32),
                    data,
                });
            }
        }
    }
    Ok(Response {
        id,
        rcode: (flags & 0x000F) as u8,
        truncated: flags & 0x0200 != 0,
        question,
        question_type,
        records,
        negative_ttl,
    })
}

/// The negative TTL of an SOA record (RFC 2308 5: min(TTL, MINIMUM)).
fn soa_negative_ttl(bytes: &[u8], at: usize, len: usize, ttl: u32) -> Result<u32, WireError> {
    let mut r = Reader {
        bytes: bytes.get(..at + len).ok_or(WireError::BadRecord)?,
        at,
    };
    r.name()?; // MNAME
    r.name()?; // RNAME
    for _ in 0..4 {
        r.u32()?; // serial, refresh, retry, expire
    }
    let minimum = r.u32()?;
    if r.at != at + len {
        return Err(WireError::BadRecord);
    }
    Ok(ttl.min(minimum))
}

/// The data of one record (`data` is its RDATA at `at` in `bytes`; names
/// in it may point anywhere before them).
fn record_data(
    bytes: &[u8],
    at: usize,
    data: &[u8],
    record_type: RecordType,
) -> Result<RecordData, WireError> {
    let mut r = Reader {
        bytes: bytes.get(..at + data.len()).ok_or(WireError::BadRecord)?,
        at,
    };
    let value = match record_type {
        RecordType::A => {
            let b: [u8; 4] = data.try_into().map_err(|_| WireError::BadRecord)?;
            r.at += 4;
            RecordData::A(Ipv4Addr::from(b))
        }
        RecordType::Aaaa => {
            let b: [u8; 16] = data.try_into().map_err(|_| WireError::BadRecord)?;
            r.at += 16;
            RecordData::Aaaa(Ipv6Addr::from(b))
        }
        RecordType::Cname => RecordData::Cname(r.name()?),
        RecordType::Srv => RecordData::Srv {
            priority: r.u16()?,
            weight: r.u16()?,
            port: r.u16()?,
            target: r.name()?,
        },
        RecordType::Naptr => RecordData::Naptr {
            order: r.u16()?,
            preference: r.u16()?,
            flags: r.character_string()?,
            services: r.character_string()?,
            replacement: {
                r.character_string()?; // regexp: SIP uses the replacement
                r.name()?
            },
        },
    };
    if r.at != at + data.len() {
        return Err(WireError::BadRecord);
    }
    Ok(value)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A name in wire form (uncompressed).
    pub(crate) fn wire_name(name: &str) -> Vec<u8> {
        let mut out = Vec::new();
        for label in name.split('.').filter(|l| !l.is_empty()) {
            out.push(label.len() as u8);
            out.extend_from_slice(label.as_bytes());
        }
        out.push(0);
        out
    }

    /// A response to `question`/`qtype` with `records` (name, type, ttl,
    /// rdata) in the answer section and an optional SOA (ttl, minimum) in
    /// the authority section.
    pub(crate) fn response(
        id: u16,
        rcode: u8,
        question: &str,
        qtype: u16,
        records: &[(&str, u16, u32, Vec<u8>)],
        soa: Option<(u32, u32)>,
    ) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(&id.to_be_bytes());
        out.extend_from_slice(&(0x8180u16 | u16::from(rcode)).to_be_bytes());
        out.extend_from_slice(&1u16.to_be_bytes());
        out.extend_from_slice(&(records.len() as u16).to_be_bytes());
        out.extend_from_slice(&u16::from(soa.is_some()).to_be_bytes());
        out.extend_from_slice(&0u16.to_be_bytes());
        out.extend_from_slice(&wire_name(question));
        out.extend_from_slice(&qtype.to_be_bytes());
        out.extend_from_slice(&1u16.to_be_bytes());
        for (name, code, ttl, data) in records {
            out.extend_from_slice(&wire_name(name));
            out.extend_from_slice(&code.to_be_bytes());
            out.extend_from_slice(&1u16.to_be_bytes());
            out.extend_from_slice(&ttl.to_be_bytes());
            out.extend_from_slice(&(data.len() as u16).to_be_bytes());
            out.extend_from_slice(data);
        }
        if let Some((ttl, minimum)) = soa {
            let mut data = wire_name("ns.test");
            data.extend_from_slice(&wire_name("admin.test"));
            for v in [1u32, 2, 3, 4, minimum] {
                data.extend_from_slice(&v.to_be_bytes());
            }
            out.extend_from_slice(&wire_name("test"));
            out.extend_from_slice(&6u16.to_be_bytes());
            out.extend_from_slice(&1u16.to_be_bytes());
            out.extend_from_slice(&ttl.to_be_bytes());
            out.extend_from_slice(&(data.len() as u16).to_be_bytes());
            out.extend_from_slice(&data);
        }
        out
    }

    pub(crate) fn srv(priority: u16, weight: u16, port: u16, target: &str) -> Vec<u8> {
        let mut d = Vec::new();
        for v in [priority, weight, port] {
            d.extend_from_slice(&v.to_be_bytes());
        }
        d.extend_from_slice(&wire_name(target));
        d
    }

    pub(crate) fn naptr(order: u16, pref: u16, flags: &str, services: &str, repl: &str) -> Vec<u8> {
        let mut d = Vec::new();
        d.extend_from_slice(&order.to_be_bytes());
        d.extend_from_slice(&pref.to_be_bytes());
        for s in [flags, services, ""] {
            d.push(s.len() as u8);
            d.extend_from_slice(s.as_bytes());
        }
        d.extend_from_slice(&wire_name(repl));
        d
    }

    #[test]
    fn query_layout() {
        let mut q = Vec::new();
        write_query(0x1234, "_sip._udp.Example.test.", RecordType::Srv, &mut q).unwrap();
        assert_eq!(&q[..4], &[0x12, 0x34, 0x01, 0x00]);
        assert_eq!(&q[12..17], b"\x04_sip");
        // Question then a 11-byte OPT record.
        let question_end = 12 + wire_name("_sip._udp.Example.test").len() + 4;
        assert_eq!(q.len(), question_end + 11);
        assert_eq!(&q[question_end - 4..question_end], &[0, 33, 0, 1]);
        for bad in [
            "",
            "a..b",
            &"x".repeat(64),
            &format!("{}.t", "a.".repeat(130)),
        ] {
            assert!(
                write_query(1, bad, RecordType::A, &mut q).is_none(),
                "{bad}"
            );
        }
    }

    #[test]
    fn reads_srv_naptr_a_aaaa_and_soa() {
        let bytes = response(
            7,
            0,
            "sip.test",
            35,
            &[
                (
                    "sip.test",
                    35,
                    60,
                    naptr(10, 20, "S", "SIP+D2U", "_sip._udp.sip.test"),
                ),
                ("_sip._udp.sip.test", 33, 30, srv(10, 5, 5070, "a.sip.test")),
                ("a.sip.test", 1, 20, vec![10, 0, 0, 1]),
                ("a.sip.test", 28, 20, [0u8; 16].to_vec()),
                ("a.sip.test", 99, 20, vec![1, 2, 3]),
            ],
            Some((300, 45)),
        );
        let r = parse_response(&bytes).unwrap();
        assert_eq!((r.id, r.rcode, r.truncated), (7, 0, false));
        assert_eq!(r.question, "sip.test");
        assert_eq!(r.negative_ttl, Some(45));
        assert_eq!(r.records.len(), 4);
        assert_eq!(
            r.records[0].data,
            RecordData::Naptr {
                order: 10,
                preference: 20,
                flags: "S".into(),
                services: "SIP+D2U".into(),
                replacement: "_sip._udp.sip.test".into()
            }
        );
        assert_eq!(
            r.records[1].data,
            RecordData::Srv {
                priority: 10,
                weight: 5,
                port: 5070,
                target: "a.sip.test".into()
            }
        );
        assert_eq!(r.records[2].data, RecordData::A(Ipv4Addr::new(10, 0, 0, 1)));
    }

    #[test]
    fn compression_pointers_go_backwards_only() {
        // Answer name = pointer to the question name (offset 12).
        let mut bytes = response(1, 0, "a.test", 1, &[], None);
        bytes[7] = 1; // one answer
        bytes.extend_from_slice(&[0xC0, 12, 0, 1, 0, 1, 0, 0, 0, 9, 0, 4, 1, 2, 3, 4]);
        let r = parse_response(&bytes).unwrap();
        assert_eq!(r.records[0].name, "a.test");
        // A pointer to itself (a loop) is refused, not followed.
        let at = bytes.len() - 16;
        bytes[at + 1] = at as u8;
        assert_eq!(parse_response(&bytes), Err(WireError::BadName));
    }

    #[test]
    fn counts_beyond_the_datagram_are_truncation_not_allocation() {
        let mut bytes = response(1, 0, "a.test", 1, &[], None);
        bytes[6] = 0xFF;
        bytes[7] = 0xFF;
        assert_eq!(parse_response(&bytes), Err(WireError::Truncated));
        // More records than we keep: the rest are read and dropped.
        let many: Vec<_> = (0..100u8)
            .map(|i| ("a.test", 1u16, 5u32, vec![10, 0, 0, i]))
            .collect();
        let r = parse_response(&response(1, 0, "a.test", 1, &many, None)).unwrap();
        assert_eq!(r.records.len(), MAX_RECORDS);
        for cut in 0..bytes.len() {
            assert!(parse_response(&bytes[..cut]).is_err());
        }
    }

    #[test]
    fn bad_rdata_lengths_are_refused() {
        let bytes = response(1, 0, "a.test", 1, &[("a.test", 1, 5, vec![1, 2, 3])], None);
        assert_eq!(parse_response(&bytes), Err(WireError::BadRecord));
        let mut long_srv = srv(1, 1, 1, "b.test");
        long_srv.push(0);
        let bytes = response(1, 0, "a.test", 33, &[("a.test", 33, 5, long_srv)], None);
        assert_eq!(parse_response(&bytes), Err(WireError::BadRecord));
    }
}
