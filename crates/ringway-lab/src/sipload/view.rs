//! What the generator needs to know about a received SIP datagram: the
//! start line, dialog identifiers and the header lines it copies into
//! responses. Field extraction uses `ringway_sip` where it offers it; this
//! module only locates whole header lines for verbatim copying.

use std::net::{IpAddr, SocketAddr};

/// Which header a located line is.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Hdr {
    /// Via (or `v`).
    Via,
    /// From (or `f`).
    From,
    /// To (or `t`).
    To,
    /// Call-ID (or `i`).
    CallId,
    /// CSeq.
    CSeq,
    /// Record-Route.
    RecordRoute,
    /// Contact (or `m`).
    Contact,
}

const MAX_LINES: usize = 32;

/// A located view over one SIP message (no copies).
#[derive(Debug)]
pub struct View<'a> {
    buf: &'a [u8],
    start: &'a [u8],
    lines: [(Hdr, u32, u32, u32); MAX_LINES],
    n: usize,
}

fn trim(s: &[u8]) -> &[u8] {
    let a = s
        .iter()
        .position(|c| !c.is_ascii_whitespace())
        .unwrap_or(s.len());
    let b = s
        .iter()
        .rposition(|c| !c.is_ascii_whitespace())
        .map_or(a, |i| i + 1);
    &s[a..b.max(a)]
}

fn classify(name: &[u8]) -> Option<Hdr> {
    let n = trim(name);
    let eq = |s: &str| n.eq_ignore_ascii_case(s.as_bytes());
    Some(if eq("via") || eq("v") {
        Hdr::Via
    } else if eq("from") || eq("f") {
        Hdr::From
    } else if eq("to") || eq("t") {
        Hdr::To
    } else if eq("call-id") || eq("i") {
        Hdr::CallId
    } else if eq("cseq") {
        Hdr::CSeq
    } else if eq("record-route") {
        Hdr::RecordRoute
    } else if eq("contact") || eq("m") {
        Hdr::Contact
    } else {
        return None;
    })
}

impl<'a> View<'a> {
    /// Locate the start line and the interesting header lines. `None` when
    /// the datagram is not a SIP message (no start line, no header end,
    /// more than 32 interesting header lines).
    pub fn parse(buf: &'a [u8]) -> Option<View<'a>> {
        let mut v = View {
            buf,
            start: &[],
            lines: [(Hdr::Via, 0, 0, 0); MAX_LINES],
            n: 0,
        };
        let mut pos = 0usize;
        let mut first = true;
        loop {
            let rel = buf[pos..].windows(2).position(|w| w == b"\r\n")?;
            let line = &buf[pos..pos + rel];
            let next = pos + rel + 2;
            if first {
                if line.is_empty() {
                    return None;
                }
                v.start = line;
                first = false;
            } else if line.is_empty() {
                break;
            } else if line[0] == b' ' || line[0] == b'\t' {
                // Folded continuation: extend the previous located line if any.
                if v.n > 0 && v.lines[v.n - 1].2 as usize == pos - 2 {
                    v.lines[v.n - 1].2 = (pos + rel) as u32;
                }
            } else if let Some(colon) = line.iter().position(|&c| c == b':') {
                if let Some(h) = classify(&line[..colon]) {
                    if v.n == MAX_LINES {
                        return None;
                    }
                    v.lines[v.n] = (h, pos as u32, (pos + rel) as u32, (pos + colon + 1) as u32);
                    v.n += 1;
                }
            }
            pos = next;
        }
        Some(v)
    }

    /// True for requests, false for responses.
    pub fn is_request(&self) -> bool {
        !self.start.starts_with(b"SIP/2.0 ")
    }

    /// Status code of a response.
    pub fn status(&self) -> Option<u16> {
        if self.is_request() {
            return None;
        }
        let s = self.start.get(8..11)?;
        std::str::from_utf8(s).ok()?.parse().ok()
    }

    /// Method of a request.
    pub fn method(&self) -> Option<&'a [u8]> {
        if !self.is_request() {
            return None;
        }
        self.start.split(|&c| c == b' ').next()
    }

    /// Request-URI of a request.
    pub fn request_uri(&self) -> Option<&'a [u8]> {
        if !self.is_request() {
            return None;
        }
        self.start.split(|&c| c == b' ').nth(1)
    }

    /// Whole header lines (name, colon, value; no CRLF) of kind `h`, in order.
    pub fn lines(&self, h: Hdr) -> impl Iterator<Item = &'a [u8]> + '_ {
        self.lines[..self.n]
            .iter()
            .filter(move |l| l.0 == h)
            .map(move |l| &self.buf[l.1 as usize..l.2 as usize])
    }

    /// Values of header `h` (after the colon, trimmed), in order.
    pub fn values(&self, h: Hdr) -> impl Iterator<Item = &'a [u8]> + '_ {
        self.lines[..self.n]
            .iter()
            .filter(move |l| l.0 == h)
            .map(move |l| trim(&self.buf[l.3 as usize..l.2 as usize]))
    }

    /// First value of header `h`.
    pub fn value(&self, h: Hdr) -> Option<&'a [u8]> {
        self.values(h).next()
    }

    /// Call-ID value.
    pub fn call_id(&self) -> Option<&'a [u8]> {
        self.value(Hdr::CallId)
    }

    /// CSeq number and method.
    pub fn cseq(&self) -> Option<(u32, &'a [u8])> {
        let v = self.value(Hdr::CSeq)?;
        let mut it = v
            .split(|c| c.is_ascii_whitespace())
            .filter(|s| !s.is_empty());
        let num = std::str::from_utf8(it.next()?).ok()?.parse().ok()?;
        Some((num, it.next()?))
    }

    /// The `tag` parameter of To.
    pub fn to_tag(&self) -> Option<&'a [u8]> {
        param(uri_params_tail(self.value(Hdr::To)?), b"tag")
    }

    /// Record-Route entries (each `<uri>` element, comma-separated values split), in order.
    pub fn record_routes(&self) -> Vec<&'a [u8]> {
        let mut out = Vec::new();
        for v in self.values(Hdr::RecordRoute) {
            for e in split_commas(v) {
                out.push(trim(e));
            }
        }
        out
    }

    /// URI of the first Contact (without angle brackets).
    pub fn contact_uri(&self) -> Option<&'a [u8]> {
        Some(name_addr_uri(self.value(Hdr::Contact)?))
    }

    /// Where a UAS sends responses to this request: the top Via's
    /// `received`/`rport`, else its sent-by (RFC 3261 18.2.2 / RFC 3581).
    /// Only IP literals are accepted (no DNS).
    pub fn response_target(&self, from: SocketAddr) -> Option<SocketAddr> {
        let via = self.value(Hdr::Via)?;
        let via = split_commas(via).next()?;
        // "SIP/2.0/UDP host[:port][;params]"
        let sp = via.iter().position(|c| c.is_ascii_whitespace())?;
        let rest = trim(&via[sp..]);
        let (sent_by, params) = match rest.iter().position(|&c| c == b';') {
            Some(i) => (trim(&rest[..i]), &rest[i..]),
            None => (rest, &rest[rest.len()..]),
        };
        let (host, port) = host_port(sent_by)?;
        let mut ip: IpAddr = std::str::from_utf8(host).ok()?.parse().ok()?;
        let mut port = port.unwrap_or(5060);
        if let Some(r) = param(params, b"received") {
            ip = std::str::from_utf8(r).ok()?.parse().ok()?;
        }
        if let Some(rp) = param(params, b"rport") {
            if rp.is_empty() {
                port = from.port();
            } else {
                port = std::str::from_utf8(rp).ok()?.parse().ok()?;
            }
        }
        Some(SocketAddr::new(ip, port))
    }
}

/// Split at commas that are outside `<...>` and quotes.
pub fn split_commas(v: &[u8]) -> impl Iterator<Item = &[u8]> {
    let mut start = 0usize;
    let mut depth = 0i32;
    let mut quoted = false;
    let mut i = 0usize;
    std::iter::from_fn(move || {
        if start > v.len() {
            return None;
        }
        while i < v.len() {
            match v[i] {
                b'"' => quoted = !quoted,
                b'<' if !quoted => depth += 1,
                b'>' if !quoted => depth -= 1,
                b',' if !quoted && depth <= 0 => {
                    let s = &v[start..i];
                    i += 1;
                    start = i;
                    return Some(s);
                }
                _ => {}
            }
            i += 1;
        }
        let s = &v[start..];
        start = v.len() + 1;
        Some(s)
    })
}

/// The URI inside `<...>` of a name-addr, or the addr-spec up to `;`.
pub fn name_addr_uri(v: &[u8]) -> &[u8] {
    if let Some(a) = v.iter().position(|&c| c == b'<') {
        if let Some(b) = v[a..].iter().position(|&c| c == b'>') {
            return &v[a + 1..a + b];
        }
    }
    let end = v.iter().position(|&c| c == b';').unwrap_or(v.len());
    trim(&v[..end])
}

/// Header parameters after a name-addr (after `>`), or after the addr-spec.
fn uri_params_tail(v: &[u8]) -> &[u8] {
    match v.iter().rposition(|&c| c == b'>') {
        Some(i) => &v[i + 1..],
        None => match v.iter().position(|&c| c == b';') {
            Some(i) => &v[i..],
            None => &v[v.len()..],
        },
    }
}

/// Value of `;name=value` (or `;name` → empty) in a parameter list.
pub fn param<'a>(params: &'a [u8], name: &[u8]) -> Option<&'a [u8]> {
    for p in params.split(|&c| c == b';') {
        let p = trim(p);
        let (k, val) = match p.iter().position(|&c| c == b'=') {
            Some(i) => (trim(&p[..i]), trim(&p[i + 1..])),
            None => (p, &p[p.len()..]),
        };
        if k.eq_ignore_ascii_case(name) {
            return Some(val);
        }
    }
    None
}

/// Split `host[:port]` (IPv6 in brackets).
fn host_port(s: &[u8]) -> Option<(&[u8], Option<u16>)> {
    if s.first() == Some(&b'[') {
        let e = s.iter().position(|&c| c == b']')?;
        let host = &s[1..e];
        let port = match s.get(e + 1) {
            Some(b':') => Some(std::str::from_utf8(&s[e + 2..]).ok()?.parse().ok()?),
            _ => None,
        };
        return Some((host, port));
    }
    match s.iter().position(|&c| c == b':') {
        Some(i) => Some((
            &s[..i],
            Some(std::str::from_utf8(&s[i + 1..]).ok()?.parse().ok()?),
        )),
        None => Some((s, None)),
    }
}

/// Socket address of a SIP URI `sip:[user@]host[:port][;params]` with an
/// IP-literal host (default port 5060), and whether it has `;lr`.
pub fn uri_addr(uri: &[u8]) -> Option<(SocketAddr, bool)> {
    let rest = uri
        .strip_prefix(b"sip:")
        .or_else(|| uri.strip_prefix(b"SIP:"))?;
    let rest = match rest.iter().position(|&c| c == b'@') {
        Some(i) => &rest[i + 1..],
        None => rest,
    };
    let end = rest
        .iter()
        .position(|&c| c == b';' || c == b'?' || c == b'>')
        .unwrap_or(rest.len());
    let (host, port) = host_port(&rest[..end])?;
    let ip: IpAddr = std::str::from_utf8(host).ok()?.parse().ok()?;
    let lr = param(&rest[end..], b"lr").is_some();
    Some((SocketAddr::new(ip, port.unwrap_or(5060)), lr))
}

#[cfg(test)]
mod tests {
    use super::*;

    const RESP: &[u8] = b"SIP/2.0 200 OK\r\nVia: SIP/2.0/UDP 127.0.0.1:5070;branch=z9hG4bKa;rport=5071;received=127.0.0.2\r\nv: SIP/2.0/UDP 127.0.0.1:6000;branch=z9hG4bKb\r\nRecord-Route: <sip:127.0.0.1:5060;lr>, <sip:127.0.0.3;lr>\r\nFrom: <sip:a@x>;tag=1\r\nTo: \"B\" <sip:b@127.0.0.1:7000>;tag=xyz\r\nCall-ID: 5-0-ab@ringway\r\nCSeq: 1 INVITE\r\nContact: <sip:b@127.0.0.1:7000>\r\nContent-Length: 0\r\n\r\n";

    #[test]
    fn locates_fields() {
        let v = View::parse(RESP).unwrap();
        assert_eq!(v.status(), Some(200));
        assert!(!v.is_request());
        assert_eq!(v.call_id(), Some(&b"5-0-ab@ringway"[..]));
        assert_eq!(v.cseq(), Some((1, &b"INVITE"[..])));
        assert_eq!(v.to_tag(), Some(&b"xyz"[..]));
        assert_eq!(v.lines(Hdr::Via).count(), 2);
        let rr = v.record_routes();
        assert_eq!(
            rr,
            vec![&b"<sip:127.0.0.1:5060;lr>"[..], &b"<sip:127.0.0.3;lr>"[..]]
        );
        assert_eq!(
            uri_addr(name_addr_uri(rr[1])),
            Some(("127.0.0.3:5060".parse().unwrap(), true))
        );
        assert_eq!(v.contact_uri(), Some(&b"sip:b@127.0.0.1:7000"[..]));
        let t = v.response_target("127.0.0.9:1".parse().unwrap());
        assert_eq!(t, Some("127.0.0.2:5071".parse().unwrap()));
    }

    #[test]
    fn rejects_garbage() {
        assert!(View::parse(b"").is_none());
        assert!(View::parse(b"hello").is_none());
        assert!(View::parse(b"\r\n\r\n").is_none());
        let v = View::parse(b"INVITE sip:x SIP/2.0\r\nVia: nonsense\r\n\r\n").unwrap();
        assert_eq!(v.response_target("127.0.0.1:1".parse().unwrap()), None);
        assert_eq!(v.cseq(), None);
    }
}
