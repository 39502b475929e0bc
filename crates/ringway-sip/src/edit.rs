//! Forwarding edits spliced from slices of the received datagram.
//!
//! Nothing is re-serialised: the output is the original bytes with a few
//! ranges replaced or inserted (new Via, Max-Forwards, Record-Route, consumed
//! Route, Request-URI, received/rport on the previous hop's Via).

use crate::msg::{HeaderKind, HeaderPos, SipMsg, MAX_HEADERS, MAX_MESSAGE};
use crate::text::{CommaSplit, Params};
use std::fmt;
use std::io::Write as _;

/// What [`forward_request`] changes.
#[derive(Clone, Copy, Debug, Default)]
pub struct RequestEdits<'e> {
    /// Prepend `Via: SIP/2.0/{transport} {sent_by};branch={branch}`.
    pub via: Option<ViaEdit<'e>>,
    /// Decrement Max-Forwards, capped at [`MAX_FORWARDS`] first (insert
    /// `Max-Forwards: 70` if absent).
    pub max_forwards: bool,
    /// Insert `Record-Route: <{uri}>` above existing Record-Route values.
    pub record_route: Option<&'e str>,
    /// Insert a second `Record-Route: <{uri}>` right below `record_route`
    /// (double Record-Route: the two sides reach us over two transports).
    pub record_route_inner: Option<&'e str>,
    /// Remove this many Route values from the top (loose routing: ours;
    /// or every preloaded Route of an initial request).
    pub pop_routes: usize,
    /// Replace the Request-URI.
    pub request_uri: Option<&'e str>,
    /// Remove the last Route value (strict-routing fix-up, RFC 3261 16.4).
    pub pop_last_route: bool,
    /// Set `received` of the top Via to this (RFC 3261 18.2.1), replacing
    /// any the sender wrote.
    pub received: Option<&'e str>,
    /// Set `rport` of the top Via to this port (RFC 3581), replacing any
    /// value the sender wrote.
    pub rport: Option<u16>,
    /// Write `rport` even where the sender asked for none (a request that
    /// came over a connection: its responses follow the connection's
    /// port, RFC 3261 18.2.2 and RFC 3581).
    pub add_rport: bool,
    /// The next hop (first Route value left after `pop_routes`) is a strict
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
    /// Header lines to remove.
    pub remove: RemoveHeaders<'e>,
}

/// Max-Forwards is capped at this on ingress (RFC 3261 8.1.1.6's
/// recommended initial value) before it is decremented.
pub const MAX_FORWARDS: u32 = 70;

/// Header lines [`forward_request`] removes.
#[derive(Clone, Copy, Debug, Default)]
pub struct RemoveHeaders<'e> {
    /// Identity asserted by the sender (`P-Asserted-Identity`,
    /// `P-Preferred-Identity`, `Remote-Party-ID`): only a trusted peer may
    /// assert one (RFC 3325).
    pub asserted_identity: bool,
    /// `Proxy-Authorization` credentials for these realms (ours: consumed,
    /// never passed on).
    pub proxy_authorization_realms: &'e [String],
}

impl RemoveHeaders<'_> {
    fn any(&self) -> bool {
        self.asserted_identity || !self.proxy_authorization_realms.is_empty()
    }

    /// Whether the header line `h` of `msg` goes.
    fn removes(&self, msg: &SipMsg<'_>, h: &HeaderPos) -> bool {
        if h.kind != HeaderKind::Other {
            return false;
        }
        let head = msg.head();
        let name = &head[h.line_start as usize..h.name_end as usize];
        let named = |n: &str| name.eq_ignore_ascii_case(n);
        if self.asserted_identity
            && (named("P-Asserted-Identity")
                || named("P-Preferred-Identity")
                || named("Remote-Party-ID"))
        {
            return true;
        }
        if self.proxy_authorization_realms.is_empty() || !named("Proxy-Authorization") {
            return false;
        }
        let value = &head[h.value_start as usize..h.value_end as usize];
        crate::auth::Credentials::realm_of(value).is_some_and(|realm| {
            self.proxy_authorization_realms
                .iter()
                .any(|ours| ours.eq_ignore_ascii_case(realm))
        })
    }
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
    /// Add `;alias` (RFC 5923): the connection the request goes out on
    /// may carry requests back to `sent_by` (over TCP or TLS).
    pub alias: bool,
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
    /// `;rport=N` where the sender wrote no `rport`.
    RportParam(u16),
    /// The top Via's parameters without `received`/`rport`, then ours.
    ViaParams {
        params: &'e str,
        received: Option<&'e str>,
        rport: Option<u16>,
    },
}

#[derive(Clone, Copy)]
struct Splice<'e> {
    start: usize,
    end: usize,
    piece: Option<Piece<'e>>,
}

/// Up to 12 splices kept on the stack (at most 8 are ever needed;
/// removals of whole lines go through [`Removals`]).
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
        let mut slot = self.n;
        while slot > 0 && self.s[slot - 1].start > start {
            self.s[slot] = self.s[slot - 1];
            slot -= 1;
        }
        self.s[slot] = Splice { start, end, piece };
        self.n += 1;
    }
}

fn write_u32(out: &mut Vec<u8>, value: u32) {
    let mut buf = [0u8; 10];
    let mut start = buf.len();
    let mut rest = value;
    loop {
        start -= 1;
        buf[start] = b'0' + (rest % 10) as u8;
        rest /= 10;
        if rest == 0 {
            break;
        }
    }
    out.extend_from_slice(&buf[start..]);
}

fn emit(out: &mut Vec<u8>, piece: Piece<'_>) {
    match piece {
        Piece::Via(v) => {
            out.extend_from_slice(b"Via: SIP/2.0/");
            out.extend_from_slice(v.transport.as_bytes());
            out.push(b' ');
            out.extend_from_slice(v.sent_by.as_bytes());
            out.extend_from_slice(b";branch=");
            out.extend_from_slice(v.branch.as_bytes());
            if v.alias {
                out.extend_from_slice(b";alias");
            }
            out.extend_from_slice(b"\r\n");
        }
        Piece::MaxFwd(n) => write_u32(out, n),
        Piece::MaxFwdLine => {
            out.extend_from_slice(b"Max-Forwards: ");
            write_u32(out, MAX_FORWARDS);
            out.extend_from_slice(b"\r\n");
        }
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
        Piece::Received(received_ip) => {
            out.extend_from_slice(b";received=");
            out.extend_from_slice(received_ip.as_bytes());
        }
        Piece::Rport(rport_value) => {
            out.push(b'=');
            write_u32(out, u32::from(rport_value));
        }
        Piece::RportParam(rport_value) => {
            out.extend_from_slice(b";rport=");
            write_u32(out, u32::from(rport_value));
        }
        Piece::ViaParams {
            params,
            received,
            rport,
        } => {
            for (name, value) in Params::new(params) {
                if name.eq_ignore_ascii_case("received") || name.eq_ignore_ascii_case("rport") {
                    continue;
                }
                out.push(b';');
                out.extend_from_slice(name.as_bytes());
                if let Some(value) = value {
                    out.push(b'=');
                    out.extend_from_slice(value.as_bytes());
                }
            }
            if let Some(received_ip) = received {
                out.extend_from_slice(b";received=");
                out.extend_from_slice(received_ip.as_bytes());
            }
            if let Some(rport_value) = rport {
                out.extend_from_slice(b";rport=");
                write_u32(out, u32::from(rport_value));
            }
        }
    }
}

fn offset_in(head: &str, sub: &str) -> usize {
    sub.as_ptr() as usize - head.as_ptr() as usize
}

/// Byte range to delete so that the first value of header line `idx` goes
/// away (the whole line if it holds one value).
fn first_value_range(msg: &SipMsg<'_>, idx: usize) -> (usize, usize) {
    let header = msg.header_positions()[idx];
    let head = msg.head();
    let value = &head[header.value_start as usize..header.value_end as usize];
    let mut values = CommaSplit::new(value);
    let _first = values.next();
    match values.next() {
        Some(second) if !second.is_empty() => {
            (header.value_start as usize, offset_in(head, second))
        }
        _ => (header.line_start as usize, header.line_end as usize),
    }
}

/// Copy `msg` into `out` (cleared first) with `edits` applied. Returns the
/// number of bytes written.
pub fn forward_request(
    msg: &SipMsg<'_>,
    edits: &RequestEdits<'_>,
    out: &mut Vec<u8>,
) -> Result<usize, EditError> {
    check_request_edits(msg, edits)?;
    let mut splices = Splices::new();
    let headers_start = msg.headers_start();
    if let Some(via) = edits.via {
        splices.push(headers_start, headers_start, Some(Piece::Via(via)));
    }
    // At the top of the header block: above every Route / Path received.
    if let Some(set) = edits.route_set {
        splices.push(headers_start, headers_start, Some(Piece::RouteSet(set)));
    }
    if let Some(uri) = edits.path {
        splices.push(headers_start, headers_start, Some(Piece::PathLine(uri)));
    }
    if edits.received.is_some() || edits.rport.is_some() {
        splice_top_via_params(msg, edits, &mut splices)?;
    }
    if edits.max_forwards {
        splice_max_forwards(msg, &mut splices)?;
    }
    if let Some(record_route) = edits.record_route {
        let record_route_at = msg
            .header_positions()
            .iter()
            .find(|header| header.kind == HeaderKind::RecordRoute)
            .map_or(headers_start, |header| header.line_start as usize);
        splices.push(
            record_route_at,
            record_route_at,
            Some(Piece::RecordRoute(record_route)),
        );
        if let Some(inner) = edits.record_route_inner {
            splices.push(
                record_route_at,
                record_route_at,
                Some(Piece::RecordRoute(inner)),
            );
        }
    }
    let removals = splice_routes(msg, edits, &mut splices)?;
    if let Some(uri) = edits.request_uri {
        if let Some((uri_start, uri_end)) = msg.request_uri_range() {
            splices.push(uri_start, uri_end, Some(Piece::Text(uri)));
        }
    }
    splice(msg, &splices, removals, out)
}

/// Refuse edits that would make a message we would not accept ourselves
/// (too many header lines) or that contradict each other.
fn check_request_edits(msg: &SipMsg<'_>, edits: &RequestEdits<'_>) -> Result<(), EditError> {
    if !msg.is_request() {
        return Err(EditError::WrongKind);
    }
    let added = usize::from(edits.via.is_some())
        + usize::from(edits.record_route.is_some())
        + usize::from(edits.record_route_inner.is_some())
        + usize::from(edits.strict_next_hop.is_some())
        + usize::from(edits.route_set.is_some())
        + usize::from(edits.path.is_some())
        + usize::from(edits.max_forwards && msg.max_forwards().is_none());
    if msg.header_positions().len() + added > MAX_HEADERS {
        return Err(EditError::TooLarge);
    }
    if edits.route_set.is_some() && edits.strict_next_hop.is_some()
        || edits.strict_next_hop.is_some() && edits.pop_last_route
    {
        return Err(EditError::Conflict);
    }
    Ok(())
}

/// `received`/`rport` on the top Via: the first value of the first Via
/// line. Its parameters are rewritten when the sender put in values of
/// its own (a sender's own received/rport never survive).
fn splice_top_via_params<'e>(
    msg: &SipMsg<'e>,
    edits: &RequestEdits<'e>,
    splices: &mut Splices<'e>,
) -> Result<(), EditError> {
    let positions = msg.header_positions();
    let via_index = positions
        .iter()
        .position(|header| header.kind == HeaderKind::Via)
        .ok_or(EditError::NoVia)?;
    let header = positions[via_index];
    let head = msg.head();
    let value = &head[header.value_start as usize..header.value_end as usize];
    let top = CommaSplit::new(value).next().unwrap_or("");
    let top_end = offset_in(head, top) + top.len();
    // The parameters (a `;` cannot occur before them: sent-by is a
    // host and port).
    let params = &top[top.find(';').unwrap_or(top.len())..];
    let mut senders_value = false;
    let mut rport_flag_end = None;
    for (name, value) in Params::new(params) {
        if name.eq_ignore_ascii_case("received") {
            senders_value = true;
        } else if name.eq_ignore_ascii_case("rport") {
            match value {
                Some(_) => senders_value = true,
                None => {
                    rport_flag_end.get_or_insert(offset_in(head, name) + name.len());
                }
            }
        }
    }
    if senders_value {
        splices.push(
            top_end - params.len(),
            top_end,
            Some(Piece::ViaParams {
                params,
                received: edits.received,
                rport: edits.rport,
            }),
        );
        return Ok(());
    }
    // Nothing of the sender's to replace (the common case): fill in the
    // valueless `rport`, append `received`.
    match (edits.rport, rport_flag_end) {
        (Some(port), Some(at)) => splices.push(at, at, Some(Piece::Rport(port))),
        (Some(port), None) if edits.add_rport => {
            splices.push(top_end, top_end, Some(Piece::RportParam(port)))
        }
        _ => {}
    }
    if let Some(received) = edits.received {
        splices.push(top_end, top_end, Some(Piece::Received(received)));
    }
    Ok(())
}

/// Decrement Max-Forwards (capped at [`MAX_FORWARDS`] first), or insert
/// the line when the request has none.
fn splice_max_forwards(msg: &SipMsg<'_>, splices: &mut Splices<'_>) -> Result<(), EditError> {
    let positions = msg.header_positions();
    match positions
        .iter()
        .find(|header| header.kind == HeaderKind::MaxForwards)
    {
        Some(header) => {
            let max_forwards = msg.max_forwards().unwrap_or(MAX_FORWARDS);
            if max_forwards == 0 {
                return Err(EditError::MaxForwardsExhausted);
            }
            splices.push(
                header.value_start as usize,
                header.value_end as usize,
                Some(Piece::MaxFwd(max_forwards.min(MAX_FORWARDS) - 1)),
            );
        }
        None => {
            let headers_start = msg.headers_start();
            splices.push(headers_start, headers_start, Some(Piece::MaxFwdLine));
        }
    }
    Ok(())
}

/// The Route values that go (popped from the top, the last one) and, for
/// a strict-routing next hop, the original Request-URI appended as the
/// last Route line.
fn splice_routes<'m, 'e>(
    msg: &'m SipMsg<'m>,
    edits: &RequestEdits<'e>,
    splices: &mut Splices<'e>,
) -> Result<Removals<'m, 'e>, EditError> {
    let popped = edits.pop_routes + usize::from(edits.strict_next_hop.is_some());
    // The values as `Removals` counts them (split at commas, not parsed:
    // the proxy has parsed them already).
    let total_routes = if popped > 0 || edits.pop_last_route {
        msg.values(HeaderKind::Route).count()
    } else {
        0
    };
    if popped + usize::from(edits.pop_last_route) > total_routes {
        return Err(EditError::NoRoute);
    }
    if let Some(original_uri) = edits.strict_next_hop {
        let last = msg
            .header_positions()
            .iter()
            .rposition(|header| header.kind == HeaderKind::Route)
            .ok_or(EditError::NoRoute)?;
        let insert_at = msg.header_positions()[last].line_end as usize;
        splices.push(insert_at, insert_at, Some(Piece::RouteLine(original_uri)));
    }
    Ok(Removals {
        msg,
        index: 0,
        route: 0,
        popped,
        last: edits.pop_last_route.then(|| total_routes - 1),
        remove: edits.remove,
        pending: None,
    })
}

/// The byte ranges of header lines (or Route values) that go, in order:
/// the first `popped` Route values, the last one (`last`, its index), and
/// the lines [`RemoveHeaders`] names. A line all of whose Route values go
/// goes whole (an empty Route value is invalid).
struct Removals<'m, 'e> {
    msg: &'m SipMsg<'m>,
    /// Next header line to look at.
    index: usize,
    /// Index of the first Route value of that line.
    route: usize,
    popped: usize,
    last: Option<usize>,
    remove: RemoveHeaders<'e>,
    /// A second range of the previous line.
    pending: Option<(usize, usize)>,
}

impl Iterator for Removals<'_, '_> {
    type Item = (usize, usize);

    fn next(&mut self) -> Option<(usize, usize)> {
        if let Some(range) = self.pending.take() {
            return Some(range);
        }
        let positions = self.msg.header_positions();
        let head = self.msg.head();
        while let Some(header) = positions.get(self.index) {
            self.index += 1;
            let whole = (header.line_start as usize, header.line_end as usize);
            if header.kind != HeaderKind::Route {
                if self.remove.any() && self.remove.removes(self.msg, header) {
                    return Some(whole);
                }
                continue;
            }
            if self.route >= self.popped && self.last.is_none() {
                continue;
            }
            let value = &head[header.value_start as usize..header.value_end as usize];
            let count = CommaSplit::new(value).count();
            let first = self.route;
            self.route += count;
            let prefix = self.popped.saturating_sub(first).min(count);
            let last = self
                .last
                .is_some_and(|l| l >= first + prefix && l < first + count);
            let removed = prefix + usize::from(last);
            if removed == 0 {
                continue;
            }
            if removed == count {
                return Some(whole);
            }
            let item_start = |i: usize| {
                CommaSplit::new(value)
                    .nth(i)
                    .map_or(header.value_end as usize, |item| offset_in(head, item))
            };
            let item_end = |i: usize| {
                CommaSplit::new(value)
                    .nth(i)
                    .map_or(header.value_end as usize, |item| {
                        offset_in(head, item) + item.len()
                    })
            };
            let tail = last.then(|| (item_end(count - 2), header.value_end as usize));
            if prefix > 0 {
                self.pending = tail;
                return Some((header.value_start as usize, item_start(prefix)));
            }
            return tail;
        }
        None
    }
}

fn splice(
    msg: &SipMsg<'_>,
    sp: &Splices<'_>,
    removals: impl Iterator<Item = (usize, usize)>,
    out: &mut Vec<u8>,
) -> Result<usize, EditError> {
    let buf = msg.datagram();
    out.clear();
    let mut cur = msg.msg_start();
    let mut removals = removals.peekable();
    let mut next = 0;
    loop {
        let splice = sp.s[..sp.n].get(next);
        let removal_first = match (splice, removals.peek()) {
            (None, None) => break,
            (Some(_), None) => false,
            (None, Some(_)) => true,
            // At the same offset an insertion goes before a removal.
            (Some(next_splice), Some(&(start, _))) => start < next_splice.start,
        };
        let (start, end, piece) = if removal_first {
            let (start, end) = removals.next().unwrap_or((cur, cur));
            (start, end, None)
        } else {
            next += 1;
            let next_splice = sp.s[next - 1];
            (next_splice.start, next_splice.end, next_splice.piece)
        };
        if start > cur {
            out.extend_from_slice(&buf[cur..start]);
        }
        if let Some(piece_to_emit) = piece {
            emit(out, piece_to_emit);
        }
        cur = cur.max(end);
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
    if msg.second_via().is_none() {
        return Err(EditError::NoVia);
    }
    let idx = msg
        .header_positions()
        .iter()
        .position(|h| h.kind == HeaderKind::Via)
        .ok_or(EditError::NoVia)?;
    let (start, end) = first_value_range(msg, idx);
    let mut splices = Splices::new();
    splices.push(start, end, None);
    splice(msg, &splices, std::iter::empty(), out)
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
                if let (false, Some(tag), true) = (has_tag, to_tag, code > 100) {
                    out.extend_from_slice(b";tag=");
                    out.extend_from_slice(tag.as_bytes());
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
                alias: false,
            }),
            max_forwards: true,
            record_route: Some("sip:192.0.2.10:5060;lr"),
            pop_routes: 1,
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
            pop_routes: 1,
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
                pop_routes: 1,
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
    fn sender_received_rport_replaced_and_max_forwards_capped() {
        let req = String::from_utf8(REQ.to_vec())
            .unwrap()
            .replace(
                "branch=z9hG4bKabc;rport",
                "received=198.51.100.9;rport=53;maddr=198.51.100.9;branch=z9hG4bKabc;received=1.2.3.4",
            )
            .replace("Max-Forwards: 70", "Max-Forwards: 255");
        let m = SipMsg::parse(req.as_bytes()).unwrap();
        let mut out = Vec::new();
        let e = RequestEdits {
            max_forwards: true,
            received: Some("192.0.2.77"),
            rport: Some(5099),
            ..Default::default()
        };
        forward_request(&m, &e, &mut out).unwrap();
        let m2 = SipMsg::parse(&out).unwrap();
        let via = m2.top_via().unwrap();
        assert_eq!(via.received, Some("192.0.2.77"));
        assert_eq!(via.rport, Some(5099));
        assert_eq!(via.branch, Some("z9hG4bKabc"));
        assert_eq!(
            via.response_target(),
            Some("192.0.2.77:5099".parse().unwrap())
        );
        assert_eq!(via.params.matches("received").count(), 1, "{}", via.raw);
        assert_eq!(m2.max_forwards(), Some(MAX_FORWARDS - 1));
        // A Via without parameters gets them appended.
        let bare = String::from_utf8(REQ.to_vec())
            .unwrap()
            .replace("192.0.2.1:5060;branch=z9hG4bKabc;rport", "host.example");
        let m = SipMsg::parse(bare.as_bytes()).unwrap();
        let e = RequestEdits {
            received: Some("192.0.2.77"),
            ..Default::default()
        };
        forward_request(&m, &e, &mut out).unwrap();
        let text = String::from_utf8(out.clone()).unwrap();
        assert!(
            text.contains("Via: SIP/2.0/UDP host.example;received=192.0.2.77\r\n"),
            "{text}"
        );
    }

    #[test]
    fn removes_many_routes_identity_and_our_credentials_in_one_pass() {
        let routes: Vec<String> = (0..60)
            .map(|i| format!("Route: <sip:a{i}@192.0.2.10>\r\n"))
            .collect();
        let req = String::from_utf8(REQ.to_vec())
            .unwrap()
            .replace(
                "Route: <sip:192.0.2.10;lr>, <sip:192.0.2.11;lr>\r\n",
                &format!(
                    "{}Route: <sip:x@192.0.2.10>, <sip:y@192.0.2.12>\r\nP-Asserted-Identity: <sip:boss@example.com>\r\n\
Proxy-Authorization: Digest username=\"alice\", realm=\"example.com\", nonce=\"n\", uri=\"sip:bob@example.com\", response=\"00\"\r\n\
Proxy-Authorization: Digest username=\"alice\", realm=\"other.example\", nonce=\"n\", uri=\"sip:bob@example.com\", response=\"00\"\r\n\
Remote-Party-ID: <sip:boss@example.com>\r\n",
                    routes.concat()
                ),
            );
        let m = SipMsg::parse(req.as_bytes()).unwrap();
        assert_eq!(m.routes().count(), 62);
        let realms = ["example.com".to_string()];
        let mut out = Vec::new();
        let e = RequestEdits {
            pop_routes: 61,
            remove: RemoveHeaders {
                asserted_identity: true,
                proxy_authorization_realms: &realms,
            },
            ..Default::default()
        };
        forward_request(&m, &e, &mut out).unwrap();
        let m2 = SipMsg::parse(&out).unwrap();
        let left: Vec<&str> = m2.routes().map(|r| r.uri).collect();
        assert_eq!(left, ["sip:y@192.0.2.12"]);
        assert_eq!(m2.header("P-Asserted-Identity").count(), 0);
        assert_eq!(m2.header("Remote-Party-ID").count(), 0);
        let creds: Vec<&str> = m2.header("Proxy-Authorization").collect();
        assert_eq!(creds.len(), 1);
        assert!(creds[0].contains("other.example"));
        assert_eq!(m2.body(), b"hi");
        // Every Route, and the last one besides the first ones.
        let e = RequestEdits {
            pop_routes: 62,
            ..Default::default()
        };
        forward_request(&m, &e, &mut out).unwrap();
        assert_eq!(SipMsg::parse(&out).unwrap().routes().count(), 0);
        let e = RequestEdits {
            pop_routes: 63,
            ..Default::default()
        };
        assert_eq!(forward_request(&m, &e, &mut out), Err(EditError::NoRoute));
        let e = RequestEdits {
            pop_routes: 60,
            pop_last_route: true,
            ..Default::default()
        };
        forward_request(&m, &e, &mut out).unwrap();
        let m2 = SipMsg::parse(&out).unwrap();
        let left: Vec<&str> = m2.routes().map(|r| r.uri).collect();
        assert_eq!(left, ["sip:x@192.0.2.10"]);
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
            alias: false,
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
