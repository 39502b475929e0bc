//! Forwarding edits spliced from slices of the received datagram.
//!
//! Nothing is re-serialised: the output is the original bytes with a few
//! ranges replaced or inserted (new Via, Max-Forwards, Record-Route, consumed
//! Route, Request-URI, received/rport on the previous hop's Via).

use crate::msg::{HeaderKind, SipMsg, MAX_HEADERS, MAX_MESSAGE};
use crate::text::{CommaSplit, Params};
use std::fmt;
use std::io::Write as _;

/// What [`forward_request`] changes.
#[derive(Clone, Copy, Debug, Default)]
pub struct RequestEdits<'e> {
    /// Prepend `Via: SIP/2.0/{transport} {sent_by};branch={branch}`.
    pub via: Option<ViaEdit<'e>>,
    /// Decrement Max-Forwards (insert `Max-Forwards: 70` if absent).
    pub max_forwards: bool,
    /// Insert `Record-Route: <{uri}>` above existing Record-Route values.
    pub record_route: Option<&'e str>,
    /// Remove the first Route value (loose routing: it was us).
    pub pop_route: bool,
    /// Replace the Request-URI.
    pub request_uri: Option<&'e str>,
    /// Remove the last Route value (strict-routing fix-up, RFC 3261 16.4).
    pub pop_last_route: bool,
    /// Add `;received=` to the top Via (RFC 3261 18.2.1).
    pub received: Option<&'e str>,
    /// Fill in a valueless `rport` of the top Via (RFC 3581).
    pub rport: Option<u16>,
    /// The next hop (first Route value left after `pop_route`) is a strict
    /// router: remove that value as well and append `<uri>` (the
    /// Request-URI being replaced via `request_uri`) as the last Route
    /// (RFC 3261 16.6 step 6). Not combinable with `pop_last_route`.
    pub strict_next_hop: Option<&'e str>,
    /// Insert `Route: {value}` above every other Route (a route set given
    /// as one comma-separated value, e.g. the Path a binding was
    /// registered with, RFC 3327 5.3). Not combinable with
    /// `strict_next_hop`.
    pub route_set: Option<&'e str>,
    /// Insert `Path: <{uri}>` above every other Path (a proxy that wants
    /// to stay on the path of requests to a registering UA, RFC 3327 5.2).
    pub path: Option<&'e str>,
}

/// Our Via value.
#[derive(Clone, Copy, Debug)]
pub struct ViaEdit<'e> {
    /// Transport token, e.g. `UDP`.
    pub transport: &'e str,
    /// `host:port` (IPv6 in brackets).
    pub sent_by: &'e str,
    /// Branch parameter (must start with `z9hG4bK`).
    pub branch: &'e str,
}

/// Why an edit could not be applied.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EditError {
    /// Result would exceed the datagram limit.
    TooLarge,
    /// Asked to decrement Max-Forwards at 0.
    MaxForwardsExhausted,
    /// Asked to consume a Route that is not there.
    NoRoute,
    /// Asked to strip the top Via of a message that has none, or to
    /// forward a response that has no Via after ours.
    NoVia,
    /// Not a request (or not a response) as the function requires.
    WrongKind,
    /// Edits that cannot be combined.
    Conflict,
}

impl fmt::Display for EditError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            EditError::TooLarge => "message too large",
            EditError::MaxForwardsExhausted => "Max-Forwards is 0",
            EditError::NoRoute => "no Route to consume",
            EditError::NoVia => "no Via",
            EditError::WrongKind => "wrong message kind",
            EditError::Conflict => "conflicting edits",
        })
    }
}

impl std::error::Error for EditError {}

#[derive(Clone, Copy)]
enum Piece<'e> {
    Via(ViaEdit<'e>),
    MaxFwd(u32),
    MaxFwdLine,
    RecordRoute(&'e str),
    RouteLine(&'e str),
    RouteSet(&'e str),
    PathLine(&'e str),
    Text(&'e str),
    Received(&'e str),
    Rport(u16),
}

#[derive(Clone, Copy)]
struct Splice<'e> {
    start: usize,
    end: usize,
    piece: Option<Piece<'e>>,
}

/// Up to 12 splices kept on the stack (at most 9 are ever needed).
struct Splices<'e> {
    n: usize,
    s: [Splice<'e>; 12],
}

impl<'e> Splices<'e> {
    fn new() -> Self {
        Splices {
            n: 0,
            s: [Splice {
                start: 0,
                end: 0,
                piece: None,
            }; 12],
        }
    }
    fn push(&mut self, start: usize, end: usize, piece: Option<Piece<'e>>) {
        // Stable insertion by start offset.
        let mut i = self.n;
        while i > 0 && self.s[i - 1].start > start {
            self.s[i] = self.s[i - 1];
            i -= 1;
        }
        self.s[i] = Splice { start, end, piece };
        self.n += 1;
    }
}

fn write_u32(out: &mut Vec<u8>, v: u32) {
    let mut buf = [0u8; 10];
    let mut i = buf.len();
    let mut v = v;
    loop {
        i -= 1;
        buf[i] = b'0' + (v % 10) as u8;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    out.extend_from_slice(&buf[i..]);
}

fn emit(out: &mut Vec<u8>, p: Piece<'_>) {
    match p {
        Piece::Via(v) => {
            out.extend_from_slice(b"Via: SIP/2.0/");
            out.extend_from_slice(v.transport.as_bytes());
            out.push(b' ');
            out.extend_from_slice(v.sent_by.as_bytes());
            out.extend_from_slice(b";branch=");
            out.extend_from_slice(v.branch.as_bytes());
            out.extend_from_slice(b"\r\n");
        }
        Piece::MaxFwd(n) => write_u32(out, n),
        Piece::MaxFwdLine => out.extend_from_slice(b"Max-Forwards: 70\r\n"),
        Piece::RecordRoute(u) => {
            out.extend_from_slice(b"Record-Route: <");
            out.extend_from_slice(u.as_bytes());
            out.extend_from_slice(b">\r\n");
        }
        Piece::RouteLine(u) => {
            out.extend_from_slice(b"Route: <");
            out.extend_from_slice(u.as_bytes());
            out.extend_from_slice(b">\r\n");
        }
        Piece::RouteSet(set) => {
            out.extend_from_slice(b"Route: ");
            out.extend_from_slice(set.as_bytes());
            out.extend_from_slice(b"\r\n");
        }
        Piece::PathLine(u) => {
            out.extend_from_slice(b"Path: <");
            out.extend_from_slice(u.as_bytes());
            out.extend_from_slice(b">\r\n");
        }
        Piece::Text(t) => out.extend_from_slice(t.as_bytes()),
        Piece::Received(r) => {
            out.extend_from_slice(b";received=");
            out.extend_from_slice(r.as_bytes());
        }
        Piece::Rport(p) => {
            out.extend_from_slice(b"=");
            write_u32(out, u32::from(p));
        }
    }
}

fn offset_in(head: &str, sub: &str) -> usize {
    sub.as_ptr() as usize - head.as_ptr() as usize
}

/// Byte range to delete so that the first value of header line `idx` goes
/// away (the whole line if it holds one value).
fn first_value_range(msg: &SipMsg<'_>, idx: usize) -> (usize, usize) {
    let h = msg.header_positions()[idx];
    let head = msg.head();
    let v = &head[h.value_start as usize..h.value_end as usize];
    let mut it = CommaSplit::new(v);
    let _first = it.next();
    match it.next() {
        Some(second) if !second.is_empty() => (h.value_start as usize, offset_in(head, second)),
        _ => (h.line_start as usize, h.line_end as usize),
    }
}

/// Byte range removing the last value of header line `idx`.
fn last_value_range(msg: &SipMsg<'_>, idx: usize) -> (usize, usize) {
    let h = msg.header_positions()[idx];
    let head = msg.head();
    let v = &head[h.value_start as usize..h.value_end as usize];
    let mut prev_end = None;
    let mut last = None;
    for item in CommaSplit::new(v) {
        if let Some(l) = last {
            prev_end = Some(offset_in(head, l) + l.len());
        }
        last = Some(item);
    }
    match prev_end {
        Some(pe) => (pe, h.value_end as usize),
        None => (h.line_start as usize, h.line_end as usize),
    }
}

/// Copy `msg` into `out` (cleared first) with `edits` applied. Returns the
/// number of bytes written.
pub fn forward_request(
    msg: &SipMsg<'_>,
    edits: &RequestEdits<'_>,
    out: &mut Vec<u8>,
) -> Result<usize, EditError> {
    if !msg.is_request() {
        return Err(EditError::WrongKind);
    }
    let mut sp = Splices::new();
    let hstart = msg.headers_start();
    let hp = msg.header_positions();
    // Never emit a message with more header lines than we accept ourselves.
    let added = usize::from(edits.via.is_some())
        + usize::from(edits.record_route.is_some())
        + usize::from(edits.strict_next_hop.is_some())
        + usize::from(edits.route_set.is_some())
        + usize::from(edits.path.is_some())
        + usize::from(edits.max_forwards && msg.max_forwards().is_none());
    if hp.len() + added > MAX_HEADERS {
        return Err(EditError::TooLarge);
    }
    if edits.route_set.is_some() && edits.strict_next_hop.is_some() {
        return Err(EditError::Conflict);
    }
    if let Some(v) = edits.via {
        sp.push(hstart, hstart, Some(Piece::Via(v)));
    }
    // At the top of the header block: above every Route / Path received.
    if let Some(set) = edits.route_set {
        sp.push(hstart, hstart, Some(Piece::RouteSet(set)));
    }
    if let Some(uri) = edits.path {
        sp.push(hstart, hstart, Some(Piece::PathLine(uri)));
    }
    if edits.received.is_some() || edits.rport.is_some() {
        // Top Via: first value of the first Via line.
        let idx = hp
            .iter()
            .position(|h| h.kind == HeaderKind::Via)
            .ok_or(EditError::NoVia)?;
        let h = hp[idx];
        let head = msg.head();
        let v = &head[h.value_start as usize..h.value_end as usize];
        let top = CommaSplit::new(v).next().unwrap_or("");
        let top_end = offset_in(head, top) + top.len();
        if let Some(p) = edits.rport {
            // find a valueless rport parameter
            let semi = top.find(';').unwrap_or(top.len());
            let params = &top[semi..];
            for (name, val) in Params::new(params) {
                if name.eq_ignore_ascii_case("rport") && val.is_none() {
                    let at = offset_in(head, name) + name.len();
                    sp.push(at, at, Some(Piece::Rport(p)));
                    break;
                }
            }
        }
        if let Some(r) = edits.received {
            sp.push(top_end, top_end, Some(Piece::Received(r)));
        }
    }
    if edits.max_forwards {
        match hp.iter().find(|h| h.kind == HeaderKind::MaxForwards) {
            Some(h) => {
                let mf = msg.max_forwards().unwrap_or(70);
                if mf == 0 {
                    return Err(EditError::MaxForwardsExhausted);
                }
                sp.push(
                    h.value_start as usize,
                    h.value_end as usize,
                    Some(Piece::MaxFwd(mf - 1)),
                );
            }
            None => sp.push(hstart, hstart, Some(Piece::MaxFwdLine)),
        }
    }
    if let Some(rr) = edits.record_route {
        let at = hp
            .iter()
            .find(|h| h.kind == HeaderKind::RecordRoute)
            .map_or(hstart, |h| h.line_start as usize);
        sp.push(at, at, Some(Piece::RecordRoute(rr)));
    }
    let first_route = hp.iter().position(|h| h.kind == HeaderKind::Route);
    let last_route = hp.iter().rposition(|h| h.kind == HeaderKind::Route);
    if let Some(orig) = edits.strict_next_hop {
        if edits.pop_last_route {
            return Err(EditError::Conflict);
        }
        let last = last_route.ok_or(EditError::NoRoute)?;
        pop_first_routes(msg, 1 + usize::from(edits.pop_route), &mut sp)?;
        let at = hp[last].line_end as usize;
        sp.push(at, at, Some(Piece::RouteLine(orig)));
        if let Some(u) = edits.request_uri {
            if let Some((a, b)) = msg.request_uri_range() {
                sp.push(a, b, Some(Piece::Text(u)));
            }
        }
        return splice(msg, &sp, out);
    }
    let route_count = if edits.pop_route && edits.pop_last_route {
        msg.routes().count()
    } else {
        0
    };
    if edits.pop_route && edits.pop_last_route && route_count < 2 {
        return Err(EditError::NoRoute);
    }
    let same_line_pair = edits.pop_route
        && edits.pop_last_route
        && first_route.is_some()
        && first_route == last_route
        && first_route.is_some_and(|i| {
            let h = hp[i];
            CommaSplit::new(&msg.head()[h.value_start as usize..h.value_end as usize]).count() == 2
        });
    if same_line_pair {
        // Both values of one line go: drop the whole line.
        let h = hp[first_route.unwrap_or(0)];
        sp.push(h.line_start as usize, h.line_end as usize, None);
    } else {
        if edits.pop_route {
            let i = first_route.ok_or(EditError::NoRoute)?;
            let (a, b) = first_value_range(msg, i);
            sp.push(a, b, None);
        }
        if edits.pop_last_route {
            let i = last_route.ok_or(EditError::NoRoute)?;
            let (mut a, b) = last_value_range(msg, i);
            if edits.pop_route && Some(i) == first_route {
                // Both ends of one line: never overlap the first-value splice.
                let (_, fb) = first_value_range(msg, i);
                a = a.max(fb);
            }
            sp.push(a, b, None);
        }
    }
    if let Some(u) = edits.request_uri {
        if let Some((a, b)) = msg.request_uri_range() {
            sp.push(a, b, Some(Piece::Text(u)));
        }
    }
    splice(msg, &sp, out)
}

/// Remove the first `n` Route values (across lines; whole lines when all
/// their values go).
fn pop_first_routes(msg: &SipMsg<'_>, n: usize, sp: &mut Splices<'_>) -> Result<(), EditError> {
    let head = msg.head();
    let mut left = n;
    for h in msg.header_positions() {
        if left == 0 {
            break;
        }
        if h.kind != HeaderKind::Route {
            continue;
        }
        let v = &head[h.value_start as usize..h.value_end as usize];
        let count = CommaSplit::new(v).count();
        if left >= count {
            sp.push(h.line_start as usize, h.line_end as usize, None);
            left -= count;
        } else {
            let keep = CommaSplit::new(v).nth(left).unwrap_or("");
            sp.push(h.value_start as usize, offset_in(head, keep), None);
            left = 0;
        }
    }
    if left > 0 {
        return Err(EditError::NoRoute);
    }
    Ok(())
}

fn splice(msg: &SipMsg<'_>, sp: &Splices<'_>, out: &mut Vec<u8>) -> Result<usize, EditError> {
    let buf = msg.datagram();
    out.clear();
    let mut cur = msg.msg_start();
    for s in &sp.s[..sp.n] {
        if s.start > cur {
            out.extend_from_slice(&buf[cur..s.start]);
        }
        if let Some(p) = s.piece {
            emit(out, p);
        }
        cur = cur.max(s.end);
    }
    out.extend_from_slice(&buf[cur..msg.msg_end()]);
    if out.len() > MAX_MESSAGE {
        return Err(EditError::TooLarge);
    }
    Ok(out.len())
}

/// Copy a response into `out` without its top Via value. A response with
/// no Via after that one was meant for us and is not forwarded (RFC 3261
/// 16.7 step 3): [`EditError::NoVia`].
pub fn forward_response(msg: &SipMsg<'_>, out: &mut Vec<u8>) -> Result<usize, EditError> {
    if msg.is_request() {
        return Err(EditError::WrongKind);
    }
    if msg.vias().nth(1).is_none() {
        return Err(EditError::NoVia);
    }
    let idx = msg
        .header_positions()
        .iter()
        .position(|h| h.kind == HeaderKind::Via)
        .ok_or(EditError::NoVia)?;
    let (a, b) = first_value_range(msg, idx);
    let mut sp = Splices::new();
    sp.push(a, b, None);
    splice(msg, &sp, out)
}

/// Build a response to `req` (RFC 3261 8.2.6): status line, all Via, From,
/// To (with `to_tag` added when it has none and `code > 100`), Call-ID,
/// CSeq, `extra_headers`, `Content-Length: 0`. `out` is cleared first.
pub fn build_response(
    req: &SipMsg<'_>,
    code: u16,
    reason: &str,
    extra_headers: &[(&str, &str)],
    to_tag: Option<&str>,
    out: &mut Vec<u8>,
) -> usize {
    out.clear();
    out.extend_from_slice(b"SIP/2.0 ");
    write_u32(out, u32::from(code));
    out.push(b' ');
    // Reason phrases come from us; keep them on one line.
    for b in reason.bytes() {
        out.push(if b == b'\r' || b == b'\n' { b' ' } else { b });
    }
    out.extend_from_slice(b"\r\n");
    let head = req.head();
    let has_tag = req.to_tag().is_some();
    for h in req.header_positions() {
        match h.kind {
            HeaderKind::Via | HeaderKind::From | HeaderKind::CallId | HeaderKind::CSeq => {
                out.extend_from_slice(
                    &head.as_bytes()[h.line_start as usize..h.value_end as usize],
                );
                out.extend_from_slice(b"\r\n");
            }
            HeaderKind::To => {
                out.extend_from_slice(
                    &head.as_bytes()[h.line_start as usize..h.value_end as usize],
                );
                if let (false, Some(t), true) = (has_tag, to_tag, code > 100) {
                    out.extend_from_slice(b";tag=");
                    out.extend_from_slice(t.as_bytes());
                }
                out.extend_from_slice(b"\r\n");
            }
            _ => {}
        }
    }
    for (n, v) in extra_headers {
        let _ = write!(out, "{n}: {v}\r\n");
    }
    out.extend_from_slice(b"Content-Length: 0\r\n\r\n");
    out.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    const REQ: &[u8] = b"INVITE sip:bob@example.com SIP/2.0\r\n\
Via: SIP/2.0/UDP 192.0.2.1:5060;branch=z9hG4bKabc;rport\r\n\
Max-Forwards: 70\r\n\
Route: <sip:192.0.2.10;lr>, <sip:192.0.2.11;lr>\r\n\
Record-Route: <sip:192.0.2.99;lr>\r\n\
To: <sip:bob@example.com>\r\n\
From: <sip:alice@example.com>;tag=1\r\n\
Call-ID: c1\r\n\
CSeq: 1 INVITE\r\n\
Content-Length: 2\r\n\
\r\n\
hi";

    #[test]
    fn forward_request_edits() {
        let m = SipMsg::parse(REQ).unwrap();
        let mut out = Vec::new();
        let e = RequestEdits {
            via: Some(ViaEdit {
                transport: "UDP",
                sent_by: "192.0.2.10:5060",
                branch: "z9hG4bKxyz",
            }),
            max_forwards: true,
            record_route: Some("sip:192.0.2.10:5060;lr"),
            pop_route: true,
            received: Some("198.51.100.7"),
            rport: Some(5062),
            ..Default::default()
        };
        forward_request(&m, &e, &mut out).unwrap();
        let s = std::str::from_utf8(&out).unwrap();
        assert_eq!(
            s,
            "INVITE sip:bob@example.com SIP/2.0\r\n\
Via: SIP/2.0/UDP 192.0.2.10:5060;branch=z9hG4bKxyz\r\n\
Via: SIP/2.0/UDP 192.0.2.1:5060;branch=z9hG4bKabc;rport=5062;received=198.51.100.7\r\n\
Max-Forwards: 69\r\n\
Route: <sip:192.0.2.11;lr>\r\n\
Record-Route: <sip:192.0.2.10:5060;lr>\r\n\
Record-Route: <sip:192.0.2.99;lr>\r\n\
To: <sip:bob@example.com>\r\n\
From: <sip:alice@example.com>;tag=1\r\n\
Call-ID: c1\r\n\
CSeq: 1 INVITE\r\n\
Content-Length: 2\r\n\
\r\n\
hi"
        );
        let m2 = SipMsg::parse(&out).unwrap();
        assert_eq!(m2.max_forwards(), Some(69));
        assert_eq!(m2.vias().count(), 2);
    }

    #[test]
    fn pop_single_route_line_and_rewrite_uri() {
        let req = String::from_utf8(REQ.to_vec())
            .unwrap()
            .replace(
                "<sip:192.0.2.10;lr>, <sip:192.0.2.11;lr>",
                "<sip:192.0.2.10;lr>",
            )
            .replace("Max-Forwards: 70\r\n", "");
        let m = SipMsg::parse(req.as_bytes()).unwrap();
        let mut out = Vec::new();
        let e = RequestEdits {
            max_forwards: true,
            pop_route: true,
            request_uri: Some("sip:bob@192.0.2.44:5070"),
            ..Default::default()
        };
        forward_request(&m, &e, &mut out).unwrap();
        let m2 = SipMsg::parse(&out).unwrap();
        assert_eq!(m2.routes().count(), 0);
        assert_eq!(m2.max_forwards(), Some(70));
        assert_eq!(m2.request_uri(), Some("sip:bob@192.0.2.44:5070"));
        assert_eq!(m2.body(), b"hi");
    }

    #[test]
    fn pop_first_and_last_route_of_one_line() {
        // Found by fuzzing: both values of a two-value line must take the
        // whole line with them (an empty Route value is invalid).
        for (routes, left) in [
            ("<sip:192.0.2.10;lr>, <sip:192.0.2.11;lr>", 0),
            (
                "<sip:192.0.2.10;lr>, <sip:192.0.2.12;lr>, <sip:192.0.2.11;lr>",
                1,
            ),
        ] {
            let req = String::from_utf8(REQ.to_vec())
                .unwrap()
                .replace("<sip:192.0.2.10;lr>, <sip:192.0.2.11;lr>", routes);
            let m = SipMsg::parse(req.as_bytes()).unwrap();
            let mut out = Vec::new();
            let e = RequestEdits {
                pop_route: true,
                pop_last_route: true,
                ..Default::default()
            };
            forward_request(&m, &e, &mut out).unwrap();
            let m2 = SipMsg::parse(&out).unwrap();
            assert_eq!(m2.routes().count(), left);
            if left == 1 {
                assert_eq!(m2.routes().next().unwrap().uri, "sip:192.0.2.12;lr");
            }
        }
    }

    #[test]
    fn never_exceeds_own_header_limit() {
        // Found by fuzzing: 127 headers + our Via + Record-Route would give a
        // message our own parser rejects.
        let mut req = String::from_utf8(REQ.to_vec()).unwrap();
        let n = SipMsg::parse(REQ).unwrap().header_positions().len();
        let extra: String = (n..MAX_HEADERS - 1)
            .map(|i| format!("X-{i}: v\r\n"))
            .collect();
        req = req.replacen("To: ", &format!("{extra}To: "), 1);
        let m = SipMsg::parse(req.as_bytes()).unwrap();
        assert_eq!(m.header_positions().len(), MAX_HEADERS - 1);
        let mut out = Vec::new();
        let via = ViaEdit {
            transport: "UDP",
            sent_by: "192.0.2.10:5060",
            branch: "z9hG4bKx",
        };
        let one = RequestEdits {
            via: Some(via),
            ..Default::default()
        };
        forward_request(&m, &one, &mut out).unwrap();
        assert!(SipMsg::parse(&out).is_ok());
        let two = RequestEdits {
            record_route: Some("sip:192.0.2.10;lr"),
            ..one
        };
        assert_eq!(
            forward_request(&m, &two, &mut out),
            Err(EditError::TooLarge)
        );
    }

    #[test]
    fn strip_top_via_and_build_response() {
        let resp = b"SIP/2.0 200 OK\r\nVia: SIP/2.0/UDP 192.0.2.10;branch=z9hG4bKp, SIP/2.0/UDP 192.0.2.1;branch=z9hG4bKa\r\nTo: <sip:b@x>;tag=9\r\nFrom: <sip:a@x>;tag=1\r\nCall-ID: c\r\nCSeq: 1 INVITE\r\nContent-Length: 0\r\n\r\n";
        let m = SipMsg::parse(resp).unwrap();
        let mut out = Vec::new();
        forward_response(&m, &mut out).unwrap();
        let m2 = SipMsg::parse(&out).unwrap();
        assert_eq!(m2.vias().count(), 1);
        assert_eq!(m2.top_via().unwrap().branch, Some("z9hG4bKa"));

        let req = SipMsg::parse(REQ).unwrap();
        build_response(
            &req,
            404,
            "Not Found",
            &[("Server", "ringway")],
            Some("t1"),
            &mut out,
        );
        let r = SipMsg::parse(&out).unwrap();
        assert_eq!(r.status(), Some(404));
        assert_eq!(r.to_tag(), Some("t1"));
        assert_eq!(r.call_id(), Some("c1"));
        assert_eq!(r.cseq(), Some((1, crate::Method::Invite)));
        assert_eq!(r.header("Server").next(), Some("ringway"));
        assert_eq!(r.top_via().unwrap().branch, Some("z9hG4bKabc"));
    }
}
