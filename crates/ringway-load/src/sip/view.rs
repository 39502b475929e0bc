//! What the generator needs from a received SIP datagram, read through
//! `ringway_sip::SipMsg` (the workspace's parser, in its lazy mode: header
//! grammars are parsed when read, which roughly halves the parse cost per
//! message): dialog identifiers, routing information and the header lines
//! it copies into responses.

use ringway_sip::{HeaderKind, NameAddr, SipMsg, SipUri};
use std::net::SocketAddr;

/// Header lines the UAS copies into responses.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Hdr {
    /// Via.
    Via,
    /// From.
    From,
    /// To.
    To,
    /// Call-ID.
    CallId,
    /// CSeq.
    CSeq,
    /// Record-Route.
    RecordRoute,
}

impl Hdr {
    fn kind(self) -> HeaderKind {
        match self {
            Hdr::Via => HeaderKind::Via,
            Hdr::From => HeaderKind::From,
            Hdr::To => HeaderKind::To,
            Hdr::CallId => HeaderKind::CallId,
            Hdr::CSeq => HeaderKind::CSeq,
            Hdr::RecordRoute => HeaderKind::RecordRoute,
        }
    }
}

/// A parsed message (no copies).
#[derive(Debug)]
pub struct View<'a> {
    m: SipMsg<'a>,
}

impl<'a> View<'a> {
    /// Parse with [`SipMsg::parse_lazy`]: start line, required headers,
    /// CSeq and Content-Length are checked; a header's grammar only when
    /// the generator reads it. `None` when the datagram is refused.
    pub fn parse(buf: &'a [u8]) -> Option<View<'a>> {
        SipMsg::parse_lazy(buf).ok().map(|m| View { m })
    }

    /// True for requests.
    pub fn is_request(&self) -> bool {
        self.m.is_request()
    }

    /// Status code of a response.
    pub fn status(&self) -> Option<u16> {
        self.m.status()
    }

    /// Method of a request.
    pub fn method(&self) -> Option<&'a [u8]> {
        self.m.method().map(|x| x.as_str().as_bytes())
    }

    /// Whole header lines (name to end of value, no CRLF) of kind `h`, in order.
    pub fn lines(&self, h: Hdr) -> impl Iterator<Item = &'a [u8]> + '_ {
        let head = self.m.head().as_bytes();
        let kind = h.kind();
        self.m
            .header_positions()
            .iter()
            .filter(move |p| p.kind == kind)
            .map(move |p| &head[p.line_start as usize..p.value_end as usize])
    }

    /// The parameters of the top Via (`None`: no Via, or it does not parse).
    pub fn top_via_params(&self) -> Option<&'a str> {
        self.m.top_via().map(|via| via.params)
    }

    /// Call-ID value.
    pub fn call_id(&self) -> Option<&'a [u8]> {
        self.m.call_id().map(str::as_bytes)
    }

    /// CSeq number and method.
    pub fn cseq(&self) -> Option<(u32, &'a [u8])> {
        self.m.cseq().map(|(n, x)| (n, x.as_str().as_bytes()))
    }

    /// The `tag` parameter of To.
    pub fn to_tag(&self) -> Option<&'a [u8]> {
        self.m.to_tag().map(str::as_bytes)
    }

    /// Record-Route entries as `<uri>;params` (one per entry), top first;
    /// `None` when any entry does not parse (a route set with a hole would
    /// skip a proxy).
    pub fn record_routes(&self) -> Option<Vec<Vec<u8>>> {
        let mut out = Vec::new();
        for v in self.m.values(HeaderKind::RecordRoute) {
            let name_addr = NameAddr::parse(v)?;
            out.push(format!("<{}>{}", name_addr.uri, name_addr.params).into_bytes());
        }
        Some(out)
    }

    /// URI of the first Contact: `Ok(None)` without Contact, `Err(())`
    /// when the first Contact value does not parse.
    #[allow(clippy::result_unit_err)]
    pub fn contact_uri(&self) -> Result<Option<&'a [u8]>, ()> {
        match self.m.values(HeaderKind::Contact).next() {
            None => Ok(None),
            Some(v) => NameAddr::parse(v).map(|c| Some(c.uri.as_bytes())).ok_or(()),
        }
    }

    /// Where a UAS sends responses to this request: the top Via's
    /// `received`/`rport`, else its sent-by (RFC 3261 18.2.2 / RFC 3581); a
    /// bare `rport` means the source port. Only IP literals (no DNS).
    pub fn response_target(&self, from: SocketAddr) -> Option<SocketAddr> {
        let via = self.m.top_via()?;
        let mut target = via.response_target()?;
        if via.rport_flag && via.rport.is_none() {
            target.set_port(from.port());
        }
        Some(target)
    }
}

/// The URI of a name-addr value (`<uri>;params` or bare addr-spec).
pub fn name_addr_uri(v: &[u8]) -> &[u8] {
    let Ok(text) = std::str::from_utf8(v) else {
        return v;
    };
    match NameAddr::parse(text) {
        Some(na) => {
            let off = na.uri.as_ptr() as usize - text.as_ptr() as usize;
            &v[off..off + na.uri.len()]
        }
        None => v,
    }
}

/// Socket address of a SIP URI with an IP-literal host (default port 5060)
/// and whether it carries `;lr`.
pub fn uri_addr(uri: &[u8]) -> Option<(SocketAddr, bool)> {
    let sip_uri = SipUri::parse(std::str::from_utf8(uri).ok()?)?;
    let ip = sip_uri.host_ip()?;
    Some((
        SocketAddr::new(ip, sip_uri.port.unwrap_or(5060)),
        sip_uri.param("lr").is_some(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    const RESP: &[u8] = b"SIP/2.0 200 OK\r\nVia: SIP/2.0/UDP 127.0.0.1:5070;branch=z9hG4bKa;rport=5071;received=127.0.0.2\r\nv: SIP/2.0/UDP 127.0.0.1:6000;branch=z9hG4bKb\r\nRecord-Route: <sip:127.0.0.1:5060;lr>, <sip:127.0.0.3;lr>\r\nFrom: <sip:a@x>;tag=1\r\nTo: \"B\" <sip:b@127.0.0.1:7000>;tag=xyz\r\nCall-ID: 5-0-ab@ringway\r\nCSeq: 1 INVITE\r\nContact: <sip:b@127.0.0.1:7000>\r\nContent-Length: 0\r\n\r\n";

    #[test]
    fn reads_fields() {
        let v = View::parse(RESP).unwrap();
        assert_eq!(v.status(), Some(200));
        assert!(!v.is_request());
        assert_eq!(v.call_id(), Some(&b"5-0-ab@ringway"[..]));
        assert_eq!(v.cseq(), Some((1, &b"INVITE"[..])));
        assert_eq!(v.to_tag(), Some(&b"xyz"[..]));
        let vias: Vec<_> = v.lines(Hdr::Via).collect();
        assert_eq!(vias.len(), 2);
        assert!(vias[1].starts_with(b"v: SIP/2.0/UDP 127.0.0.1:6000"));
        let rr = v.record_routes().unwrap();
        assert_eq!(rr.len(), 2);
        assert_eq!(rr[0], b"<sip:127.0.0.1:5060;lr>".to_vec());
        assert_eq!(
            uri_addr(name_addr_uri(&rr[1])),
            Some(("127.0.0.3:5060".parse().unwrap(), true))
        );
        assert_eq!(v.contact_uri(), Ok(Some(&b"sip:b@127.0.0.1:7000"[..])));
        let t = v.response_target("127.0.0.9:1".parse().unwrap());
        assert_eq!(t, Some("127.0.0.2:5071".parse().unwrap()));
    }

    #[test]
    fn bare_rport_uses_source_port_and_garbage_is_rejected() {
        let req = b"BYE sip:b@127.0.0.1 SIP/2.0\r\nVia: SIP/2.0/UDP 127.0.0.1:5070;branch=z9hG4bKx;rport\r\nFrom: <sip:a@x>;tag=1\r\nTo: <sip:b@y>;tag=2\r\nCall-ID: c\r\nCSeq: 2 BYE\r\nMax-Forwards: 70\r\nContent-Length: 0\r\n\r\n";
        let v = View::parse(req).unwrap();
        assert_eq!(v.method(), Some(&b"BYE"[..]));
        assert_eq!(
            v.response_target("127.0.0.1:4444".parse().unwrap()),
            Some("127.0.0.1:4444".parse().unwrap())
        );
        assert!(View::parse(b"").is_none());
        assert!(View::parse(b"hello").is_none());
        assert_eq!(uri_addr(b"sip:proxy.example.com;lr"), None);
    }

    #[test]
    fn malformed_route_contact_or_top_via_is_not_skipped() {
        let s = String::from_utf8_lossy(RESP);
        // A Record-Route entry that does not parse: no route set at all.
        let m = s.replace("<sip:127.0.0.3;lr>", "<sip:127.0.0.3;lr");
        let v = View::parse(m.as_bytes()).unwrap();
        assert_eq!(v.record_routes(), None);
        // A first Contact that does not parse: an error, not the second one.
        let m = s.replace(
            "Contact: <sip:b@127.0.0.1:7000>",
            "Contact: garbage<, <sip:c@127.0.0.1:7001>",
        );
        let v = View::parse(m.as_bytes()).unwrap();
        assert_eq!(v.contact_uri(), Err(()));
        // No Contact: none.
        let m = s.replace("Contact: <sip:b@127.0.0.1:7000>\r\n", "");
        assert_eq!(View::parse(m.as_bytes()).unwrap().contact_uri(), Ok(None));
        // A topmost Via that does not parse gives no response target (the
        // second Via is the hop before, not where responses go).
        let m = s.replace("rport=5071", "rport=99999");
        let v = View::parse(m.as_bytes()).unwrap();
        assert_eq!(v.response_target("127.0.0.9:1".parse().unwrap()), None);
    }
}
