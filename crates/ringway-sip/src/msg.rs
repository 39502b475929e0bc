//! Zero-copy SIP message view ([`SipMsg`]) over one datagram.
//!
//! [`SipMsg::parse`] validates everything a proxy depends on (start line,
//! Via, From/To, Call-ID, CSeq, Max-Forwards, Content-Length, Contact,
//! Request-URI) and records where every header sits, without allocating.
//! Accessors return slices of the original datagram.

use crate::text::{is_lws, is_token, is_token_str, parse_dec, trim, CommaSplit};
use crate::uri::{host_ip, scheme, split_host, NameAddr, SipUri};
use std::fmt;
use std::net::IpAddr;

/// Most header fields (lines) a message may carry.
pub const MAX_HEADERS: usize = 128;
/// Largest message accepted (the UDP datagram limit).
pub const MAX_MESSAGE: usize = 65535;

/// A SIP method; extension methods are kept as text.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Method<'a> {
    /// INVITE
    Invite,
    /// ACK
    Ack,
    /// BYE
    Bye,
    /// CANCEL
    Cancel,
    /// REGISTER
    Register,
    /// OPTIONS
    Options,
    /// INFO
    Info,
    /// UPDATE
    Update,
    /// PRACK
    Prack,
    /// SUBSCRIBE
    Subscribe,
    /// NOTIFY
    Notify,
    /// REFER
    Refer,
    /// MESSAGE
    Message,
    /// PUBLISH
    Publish,
    /// Any other (extension) method token, case preserved.
    Other(&'a str),
}

impl<'a> Method<'a> {
    /// Classify a method token (methods are case-sensitive).
    pub fn from_token(s: &'a str) -> Method<'a> {
        match s {
            "INVITE" => Method::Invite,
            "ACK" => Method::Ack,
            "BYE" => Method::Bye,
            "CANCEL" => Method::Cancel,
            "REGISTER" => Method::Register,
            "OPTIONS" => Method::Options,
            "INFO" => Method::Info,
            "UPDATE" => Method::Update,
            "PRACK" => Method::Prack,
            "SUBSCRIBE" => Method::Subscribe,
            "NOTIFY" => Method::Notify,
            "REFER" => Method::Refer,
            "MESSAGE" => Method::Message,
            "PUBLISH" => Method::Publish,
            other => Method::Other(other),
        }
    }

    /// The method token.
    pub fn as_str(&self) -> &'a str {
        match self {
            Method::Invite => "INVITE",
            Method::Ack => "ACK",
            Method::Bye => "BYE",
            Method::Cancel => "CANCEL",
            Method::Register => "REGISTER",
            Method::Options => "OPTIONS",
            Method::Info => "INFO",
            Method::Update => "UPDATE",
            Method::Prack => "PRACK",
            Method::Subscribe => "SUBSCRIBE",
            Method::Notify => "NOTIFY",
            Method::Refer => "REFER",
            Method::Message => "MESSAGE",
            Method::Publish => "PUBLISH",
            Method::Other(s) => s,
        }
    }
}

impl fmt::Display for Method<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a datagram is not an acceptable SIP message. `Display` gives a short
/// phrase suitable for a `400` reason phrase.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ParseError {
    /// Empty datagram (or only CRLF keep-alives).
    Empty,
    /// Larger than [`MAX_MESSAGE`].
    TooLarge,
    /// No empty line terminating the header section.
    NoHeaderEnd,
    /// Start line or headers are not UTF-8.
    NotUtf8,
    /// The start line is malformed; the text says how.
    BadStartLine(&'static str),
    /// SIP version other than 2.0 (a request gets `505`).
    BadVersion,
    /// Status code not three digits in 100..=699.
    BadStatus,
    /// The Request-URI is malformed.
    BadRequestUri(&'static str),
    /// A header line is not `name: value`.
    BadHeaderLine,
    /// More than [`MAX_HEADERS`] header fields.
    TooManyHeaders,
    /// A required header is missing (name given).
    MissingHeader(&'static str),
    /// A single-valued header appears more than once.
    DuplicateHeader(&'static str),
    /// A header value does not parse (name given).
    BadHeaderValue(&'static str),
    /// Content-Length exceeds the bytes present.
    ContentLengthTooLarge,
    /// CSeq method differs from the request method.
    CSeqMethodMismatch,
}

impl ParseError {
    /// Response code a request with this error gets (`505` or `400`).
    pub fn status(&self) -> u16 {
        match self {
            ParseError::BadVersion => 505,
            _ => 400,
        }
    }
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ParseError::Empty => f.write_str("Empty Message"),
            ParseError::TooLarge => f.write_str("Message Too Large"),
            ParseError::NoHeaderEnd => f.write_str("Bad Request - No End Of Headers"),
            ParseError::NotUtf8 => f.write_str("Bad Request - Headers Not UTF-8"),
            ParseError::BadStartLine(w) => write!(f, "Bad Request - Bad Start Line ({w})"),
            ParseError::BadVersion => f.write_str("Version Not Supported"),
            ParseError::BadStatus => f.write_str("Bad Status Code"),
            ParseError::BadRequestUri(w) => write!(f, "Bad Request - Bad Request-URI ({w})"),
            ParseError::BadHeaderLine => f.write_str("Bad Request - Malformed Header Line"),
            ParseError::TooManyHeaders => f.write_str("Bad Request - Too Many Headers"),
            ParseError::MissingHeader(h) => write!(f, "Bad Request - Missing {h}"),
            ParseError::DuplicateHeader(h) => write!(f, "Bad Request - Multiple {h}"),
            ParseError::BadHeaderValue(h) => write!(f, "Bad Request - Malformed {h}"),
            ParseError::ContentLengthTooLarge => {
                f.write_str("Bad Request - Content-Length Exceeds Message")
            }
            ParseError::CSeqMethodMismatch => f.write_str("Bad Request - CSeq Method Mismatch"),
        }
    }
}

impl std::error::Error for ParseError {}

/// Header kinds the parser recognises (long and compact names).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum HeaderKind {
    /// Via / v
    Via,
    /// Route
    Route,
    /// Record-Route
    RecordRoute,
    /// Call-ID / i
    CallId,
    /// CSeq
    CSeq,
    /// From / f
    From,
    /// To / t
    To,
    /// Max-Forwards
    MaxForwards,
    /// Contact / m
    Contact,
    /// Content-Length / l
    ContentLength,
    /// Content-Type / c
    ContentType,
    /// Expires
    Expires,
    /// Proxy-Require
    ProxyRequire,
    /// Require
    Require,
    /// Supported / k
    Supported,
    /// Anything else.
    Other,
}

/// Full names of compact header forms (RFC 3261 7.3.3 and extensions).
fn expand_compact(name: &str) -> &str {
    if name.len() != 1 {
        return name;
    }
    match name.as_bytes()[0].to_ascii_lowercase() {
        b'i' => "Call-ID",
        b'm' => "Contact",
        b'e' => "Content-Encoding",
        b'l' => "Content-Length",
        b'c' => "Content-Type",
        b'f' => "From",
        b's' => "Subject",
        b'k' => "Supported",
        b't' => "To",
        b'v' => "Via",
        b'o' => "Event",
        b'r' => "Refer-To",
        b'b' => "Referred-By",
        b'u' => "Allow-Events",
        b'x' => "Session-Expires",
        b'a' => "Accept-Contact",
        b'j' => "Reject-Contact",
        b'd' => "Request-Disposition",
        b'y' => "Identity",
        b'n' => "Identity-Info",
        _ => name,
    }
}

impl HeaderKind {
    /// Classify a header name (case-insensitive, compact forms mapped).
    pub fn of(name: &str) -> HeaderKind {
        let canonical = expand_compact(name);
        let named = |s: &str| canonical.eq_ignore_ascii_case(s);
        match canonical.len() {
            3 if named("Via") => HeaderKind::Via,
            5 if named("Route") => HeaderKind::Route,
            12 if named("Record-Route") => HeaderKind::RecordRoute,
            7 if named("Call-ID") => HeaderKind::CallId,
            4 if named("CSeq") => HeaderKind::CSeq,
            4 if named("From") => HeaderKind::From,
            2 if named("To") => HeaderKind::To,
            12 if named("Max-Forwards") => HeaderKind::MaxForwards,
            7 if named("Contact") => HeaderKind::Contact,
            14 if named("Content-Length") => HeaderKind::ContentLength,
            12 if named("Content-Type") => HeaderKind::ContentType,
            7 if named("Expires") => HeaderKind::Expires,
            13 if named("Proxy-Require") => HeaderKind::ProxyRequire,
            7 if named("Require") => HeaderKind::Require,
            9 if named("Supported") => HeaderKind::Supported,
            _ => HeaderKind::Other,
        }
    }
}

/// Where one header field sits in the datagram (byte offsets).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HeaderPos {
    /// Kind of header.
    pub kind: HeaderKind,
    /// Offset of the header name (start of the line).
    pub line_start: u16,
    /// End of the name.
    pub name_end: u16,
    /// Start of the value (after `:` and LWS).
    pub value_start: u16,
    /// End of the value (trailing LWS trimmed).
    pub value_end: u16,
    /// Offset just past the line terminator of the last (folded) line.
    pub line_end: u16,
}

const EMPTY_POS: HeaderPos = HeaderPos {
    kind: HeaderKind::Other,
    line_start: 0,
    name_end: 0,
    value_start: 0,
    value_end: 0,
    line_end: 0,
};

/// One Via value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Via<'a> {
    /// Transport token (`UDP`, `TCP`, ...).
    pub transport: &'a str,
    /// sent-by host as written (IPv6 keeps brackets).
    pub host: &'a str,
    /// sent-by port.
    pub port: Option<u16>,
    /// `branch` parameter.
    pub branch: Option<&'a str>,
    /// `received` parameter.
    pub received: Option<&'a str>,
    /// `rport` present (with or without value).
    pub rport_flag: bool,
    /// `rport` value.
    pub rport: Option<u16>,
    /// `maddr` parameter.
    pub maddr: Option<&'a str>,
    /// All parameters (leading `;` included), raw.
    pub params: &'a str,
    /// The whole value.
    pub raw: &'a str,
}

impl<'a> Via<'a> {
    /// Parse one Via value (`SIP/2.0/UDP host:port;params`), LWS tolerated
    /// around `/` as RFC 3261 allows.
    pub fn parse(v: &'a str) -> Option<Via<'a>> {
        let raw = trim(v);
        let mut rest = raw;
        let next_tok = |rest: &mut &'a str| -> Option<&'a str> {
            let trimmed = trim(rest);
            let end = trimmed
                .bytes()
                .position(|b| !is_token(b))
                .unwrap_or(trimmed.len());
            let token = &trimmed[..end];
            *rest = &trimmed[end..];
            (!token.is_empty()).then_some(token)
        };
        let name = next_tok(&mut rest)?;
        rest = trim(rest).strip_prefix('/')?;
        let ver = next_tok(&mut rest)?;
        rest = trim(rest).strip_prefix('/')?;
        let transport = next_tok(&mut rest)?;
        if !name.eq_ignore_ascii_case("SIP") || ver != "2.0" {
            return None;
        }
        // LWS before sent-by is mandatory, but folding makes it any LWS.
        if !rest.as_bytes().first().is_some_and(|&b| is_lws(b)) {
            return None;
        }
        let trimmed = trim(rest);
        let (host, after) = split_host(trimmed)?;
        if after.starts_with('?') {
            return None;
        }
        let mut after = after.trim_start_matches(|c: char| c.is_ascii() && is_lws(c as u8));
        let mut port = None;
        if let Some(port_text) = after.strip_prefix(':') {
            let port_text = port_text.trim_start_matches(|c: char| c.is_ascii() && is_lws(c as u8));
            let end = port_text
                .bytes()
                .position(|b| !b.is_ascii_digit())
                .unwrap_or(port_text.len());
            if end == 0 || end > 5 {
                return None;
            }
            port = Some(crate::text::parse_port(&port_text[..end])?);
            after = &port_text[end..];
        }
        let params = trim(after);
        let mut via = Via {
            transport,
            host,
            port,
            branch: None,
            received: None,
            rport_flag: false,
            rport: None,
            maddr: None,
            params,
            raw,
        };
        // One pass over the parameters, which also checks their grammar
        // (first occurrence wins).
        let valid = crate::text::scan_params(params, |name, value| {
            let named = |s: &str| name.eq_ignore_ascii_case(s);
            match name.len() {
                6 if named("branch") && via.branch.is_none() => match value {
                    Some(value) => via.branch = Some(value),
                    None => return false,
                },
                5 if named("rport") && !via.rport_flag => {
                    via.rport_flag = true;
                    via.rport = match value.map(str::parse::<u16>) {
                        Some(Ok(port)) => Some(port),
                        Some(Err(_)) => return false,
                        None => None,
                    };
                }
                8 if named("received") && via.received.is_none() => via.received = value,
                5 if named("maddr") && via.maddr.is_none() => via.maddr = value,
                _ => {}
            }
            true
        });
        if !valid {
            return None;
        }
        Some(via)
    }

    /// Where a response to this hop goes (RFC 3261 18.2.2 / RFC 3581):
    /// `received` (or host) and `rport` (or port, default 5060). `None` if
    /// the host is not an IP literal (no DNS here).
    pub fn response_target(&self) -> Option<std::net::SocketAddr> {
        let ip: IpAddr = match self.received.and_then(host_ip) {
            Some(ip) => ip,
            None => host_ip(self.maddr.unwrap_or(self.host))?,
        };
        let port = self.rport.or(self.port).unwrap_or(5060);
        Some(std::net::SocketAddr::new(ip, port))
    }

    /// Whether the branch carries the RFC 3261 magic cookie (and more).
    pub fn has_cookie(&self) -> bool {
        self.branch
            .is_some_and(|b| b.len() > 7 && b.as_bytes()[..7].eq_ignore_ascii_case(b"z9hG4bK"))
    }
}

#[derive(Clone, Copy, Debug)]
enum Start {
    Request { method: (u16, u16), uri: (u16, u16) },
    Response { status: u16, reason: (u16, u16) },
}

const NONE: u8 = u8::MAX;

/// A parsed SIP message borrowing its datagram.
#[derive(Clone)]
pub struct SipMsg<'a> {
    buf: &'a [u8],
    head: &'a str,
    start: Start,
    msg_start: u16,
    start_line_end: u16,
    head_end: u16,
    body_start: u16,
    body_end: u16,
    nhdrs: u8,
    hdrs: [HeaderPos; MAX_HEADERS],
    i_call_id: u8,
    i_cseq: u8,
    i_from: u8,
    i_to: u8,
    i_max_fwd: u8,
    i_clen: u8,
    cseq_num: u32,
    max_fwd: u32,
    validated: bool,
    c_top_via: Option<Via<'a>>,
    c_second_via: Option<Via<'a>>,
    c_from_tag: Option<&'a str>,
    c_to_tag: Option<&'a str>,
    c_ruri: Option<SipUri<'a>>,
}

impl fmt::Debug for SipMsg<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SipMsg")
            .field("start", &self.start_line())
            .field("headers", &self.nhdrs)
            .field("body_len", &self.body().len())
            .finish()
    }
}

/// The header lines of a message head, found in one pass (their
/// positions written into the message's own table: no copy of it).
struct HeaderLines<'p> {
    positions: &'p mut [HeaderPos; MAX_HEADERS],
    count: usize,
    /// Offset of the empty line ending the head.
    head_end: usize,
    /// Offset just past that empty line.
    body_start: usize,
}

impl<'p> HeaderLines<'p> {
    /// Scan the lines from `first` (just past the start line) to the empty
    /// line, folding continuation lines into the header above them.
    fn scan(
        buf: &[u8],
        first: usize,
        positions: &'p mut [HeaderPos; MAX_HEADERS],
    ) -> Result<HeaderLines<'p>, ParseError> {
        let mut lines = HeaderLines {
            positions,
            count: 0,
            head_end: 0,
            body_start: 0,
        };
        let mut pos = first;
        loop {
            let Some(offset) = buf.get(pos..).and_then(|rest| memchr::memchr(b'\n', rest)) else {
                return Err(ParseError::NoHeaderEnd);
            };
            let newline = pos + offset;
            let line_end = newline + 1;
            let mut content_end = newline;
            if content_end > pos && buf[content_end - 1] == b'\r' {
                content_end -= 1;
            }
            if content_end == pos {
                lines.head_end = pos;
                lines.body_start = line_end;
                return Ok(lines);
            }
            if buf[pos] == b' ' || buf[pos] == b'\t' {
                lines.fold(buf, pos, content_end, line_end)?;
            } else {
                let header = header_line(buf, pos, content_end, line_end)?;
                if lines.count == MAX_HEADERS {
                    return Err(ParseError::TooManyHeaders);
                }
                lines.positions[lines.count] = header;
                lines.count += 1;
            }
            pos = line_end;
        }
    }

    /// A continuation (folded) line extends the value of the header above.
    fn fold(
        &mut self,
        buf: &[u8],
        pos: usize,
        content_end: usize,
        line_end: usize,
    ) -> Result<(), ParseError> {
        if self.count == 0 {
            return Err(ParseError::BadHeaderLine);
        }
        let header = &mut self.positions[self.count - 1];
        let (value_start, value_end) = trim_range(buf, pos, content_end);
        if value_start < value_end {
            if header.value_start == header.value_end {
                header.value_start = value_start as u16;
            }
            header.value_end = value_end as u16;
        }
        header.line_end = line_end as u16;
        Ok(())
    }
}

/// One `name: value` line from `pos` to `content_end` (its CRLF ends at
/// `line_end`).
fn header_line(
    buf: &[u8],
    pos: usize,
    content_end: usize,
    line_end: usize,
) -> Result<HeaderPos, ParseError> {
    let line = &buf[pos..content_end];
    let name_len = line
        .iter()
        .position(|&byte| !is_token(byte))
        .unwrap_or(line.len());
    if name_len == 0 {
        return Err(ParseError::BadHeaderLine);
    }
    let mut colon = name_len;
    while colon < line.len() && (line[colon] == b' ' || line[colon] == b'\t') {
        colon += 1;
    }
    if line.get(colon) != Some(&b':') {
        return Err(ParseError::BadHeaderLine);
    }
    let (mut value_start, mut value_end) = trim_range(buf, pos + colon + 1, content_end);
    if value_start == value_end {
        // An empty value sits at the end of the line.
        (value_start, value_end) = (content_end, content_end);
    }
    // Token characters are ASCII, so this cannot fail.
    let name = std::str::from_utf8(&line[..name_len]).unwrap_or("");
    Ok(HeaderPos {
        kind: HeaderKind::of(name),
        line_start: pos as u16,
        name_end: (pos + name_len) as u16,
        value_start: value_start as u16,
        value_end: value_end as u16,
        line_end: line_end as u16,
    })
}

/// Trim LWS from both ends of `buf[a..e]`, returning the new bounds.
#[inline]
pub(crate) fn trim_range(buf: &[u8], mut a: usize, mut e: usize) -> (usize, usize) {
    while a < e && is_lws(buf[a]) {
        a += 1;
    }
    while e > a && is_lws(buf[e - 1]) {
        e -= 1;
    }
    (a, e)
}

/// How much of a message [`SipMsg::parse_impl`] checks.
#[derive(Copy, Clone, PartialEq, Eq)]
enum Level {
    /// Everything (`parse`).
    Strict,
    /// All but header value grammars (`parse_lazy`).
    Lazy,
    /// Structure only (`parse_loose`).
    Loose,
}

impl<'a> SipMsg<'a> {
    /// Parse and validate a datagram. Leading CRLFs (keep-alives) are
    /// skipped; bytes after `Content-Length` are ignored (RFC 3261 18.3).
    pub fn parse(buf: &'a [u8]) -> Result<SipMsg<'a>, ParseError> {
        Self::parse_impl(buf, Level::Strict)
    }

    /// Parse for a user agent that trusts the header grammar until it reads
    /// a header: everything [`Self::parse`] checks except the grammar of
    /// Via, From, To, Contact, Route and Record-Route values, which their
    /// accessors parse on use (returning `None` or skipping an entry that
    /// does not parse). The start line, the presence and uniqueness of
    /// Via/Call-ID/CSeq/From/To, CSeq, Max-Forwards and Content-Length are
    /// checked as in [`Self::parse`]. Every message `parse` accepts is
    /// accepted, with the same accessor results. For a message only this
    /// accepts: [`Self::top_via`] is `None` when the topmost Via does not
    /// parse, and the iterating accessors (`vias`, `routes`,
    /// `record_routes`, `contact`) skip values that do not parse, so a
    /// caller that needs the whole list compares with [`Self::values`].
    pub fn parse_lazy(buf: &'a [u8]) -> Result<SipMsg<'a>, ParseError> {
        Self::parse_impl(buf, Level::Lazy)
    }

    /// Structure-only parse used to answer a malformed request: the start
    /// line and header values are not validated (a bad start line becomes a
    /// request with an empty Request-URI), only line structure, UTF-8 and
    /// the header end are required. Accessors that need a valid value
    /// (e.g. [`Self::cseq`]) may return `None`.
    pub fn parse_loose(buf: &'a [u8]) -> Result<SipMsg<'a>, ParseError> {
        Self::parse_impl(buf, Level::Loose)
    }

    fn parse_impl(buf: &'a [u8], level: Level) -> Result<SipMsg<'a>, ParseError> {
        if buf.len() > MAX_MESSAGE {
            return Err(ParseError::TooLarge);
        }
        let skip = buf
            .iter()
            .position(|&byte| byte != b'\r' && byte != b'\n')
            .ok_or(ParseError::Empty)?;
        // Offsets are relative to `buf` (skipped CRLFs stay outside the
        // message range but offsets still index `buf`). One pass over the
        // lines finds every header and the empty line ending the head.
        let start_line_newline = match memchr::memchr(b'\n', &buf[skip..]) {
            Some(offset) => skip + offset,
            None => return Err(ParseError::NoHeaderEnd),
        };
        // The message is built first and its header table filled in place
        // (a table of MAX_HEADERS positions is worth not copying).
        let mut msg = SipMsg {
            buf,
            head: "",
            start: Start::Response {
                status: 0,
                reason: (0, 0),
            },
            msg_start: skip as u16,
            start_line_end: (start_line_newline + 1) as u16,
            head_end: 0,
            body_start: 0,
            body_end: buf.len() as u16,
            nhdrs: 0,
            hdrs: [EMPTY_POS; MAX_HEADERS],
            i_call_id: NONE,
            i_cseq: NONE,
            i_from: NONE,
            i_to: NONE,
            i_max_fwd: NONE,
            i_clen: NONE,
            cseq_num: 0,
            max_fwd: 0,
            validated: false,
            c_top_via: None,
            c_second_via: None,
            c_from_tag: None,
            c_to_tag: None,
            c_ruri: None,
        };
        let lines = HeaderLines::scan(buf, start_line_newline + 1, &mut msg.hdrs)?;
        let (count, head_end, body_start) = (lines.count, lines.head_end, lines.body_start);
        let head = std::str::from_utf8(&buf[..head_end]).map_err(|_| ParseError::NotUtf8)?;
        let start_line_end = if start_line_newline > skip && buf[start_line_newline - 1] == b'\r' {
            start_line_newline - 1
        } else {
            start_line_newline
        };
        let (start, ruri) = Self::parse_start(&head[skip..start_line_end], skip, level)?;
        msg.head = head;
        msg.start = start;
        msg.head_end = head_end as u16;
        msg.body_start = body_start as u16;
        msg.nhdrs = count as u8;
        match level {
            Level::Strict => {
                msg.validate(true)?;
                msg.validated = true;
                msg.c_ruri = ruri;
            }
            Level::Lazy => msg.validate(false)?,
            Level::Loose => msg.index_loose(),
        }
        Ok(msg)
    }

    /// The start line (`line` begins at offset `skip`). At [`Level::Loose`]
    /// a bad one becomes a request whose method is the first word and
    /// whose Request-URI is empty, so that it can still be answered.
    fn parse_start(
        line: &'a str,
        skip: usize,
        level: Level,
    ) -> Result<(Start, Option<SipUri<'a>>), ParseError> {
        match parse_start_line(line, skip) {
            Ok(parsed) => Ok(parsed),
            Err(error) if level != Level::Loose => Err(error),
            Err(_) => {
                let method_end = skip + line.find(' ').unwrap_or(line.len());
                Ok((
                    Start::Request {
                        method: (skip as u16, method_end as u16),
                        uri: (method_end as u16, method_end as u16),
                    },
                    None,
                ))
            }
        }
    }

    fn index_loose(&mut self) {
        for i in 0..self.nhdrs as usize {
            let slot = match self.hdrs[i].kind {
                HeaderKind::CallId => &mut self.i_call_id,
                HeaderKind::CSeq => &mut self.i_cseq,
                HeaderKind::From => &mut self.i_from,
                HeaderKind::To => &mut self.i_to,
                _ => continue,
            };
            if *slot == NONE {
                *slot = i as u8;
            }
        }
    }

    /// Index and check the headers; `grammar`: also parse every Via,
    /// From, To, Contact, Route and Record-Route value (and cache results).
    fn validate(&mut self, grammar: bool) -> Result<(), ParseError> {
        let mut via_seen = false;
        for index in 0..self.nhdrs as usize {
            self.index_header(index)?;
            let kind = self.hdrs[index].kind;
            let value = self.value_at(index);
            if grammar {
                self.check_grammar(kind, value, &mut via_seen)?;
                continue;
            }
            match kind {
                HeaderKind::Via if !value.is_empty() => via_seen = true,
                HeaderKind::CallId if value.is_empty() || value.bytes().any(is_lws) => {
                    return Err(ParseError::BadHeaderValue("Call-ID"));
                }
                _ => {}
            }
        }
        if !via_seen {
            return Err(ParseError::MissingHeader("Via"));
        }
        for (index, name) in [
            (self.i_call_id, "Call-ID"),
            (self.i_cseq, "CSeq"),
            (self.i_from, "From"),
            (self.i_to, "To"),
        ] {
            if index == NONE {
                return Err(ParseError::MissingHeader(name));
            }
        }
        self.check_cseq()?;
        self.check_lengths()
    }

    /// Remember where the headers that may occur once are; a second one
    /// is an error.
    fn index_header(&mut self, index: usize) -> Result<(), ParseError> {
        let (slot, name) = match self.hdrs[index].kind {
            HeaderKind::CallId => (&mut self.i_call_id, "Call-ID"),
            HeaderKind::CSeq => (&mut self.i_cseq, "CSeq"),
            HeaderKind::From => (&mut self.i_from, "From"),
            HeaderKind::To => (&mut self.i_to, "To"),
            HeaderKind::MaxForwards => (&mut self.i_max_fwd, "Max-Forwards"),
            HeaderKind::ContentLength => (&mut self.i_clen, "Content-Length"),
            _ => return Ok(()),
        };
        if *slot != NONE {
            return Err(ParseError::DuplicateHeader(name));
        }
        *slot = index as u8;
        Ok(())
    }

    /// Parse one header value whose grammar the proxy relies on, caching
    /// the top Via and the From/To tags.
    fn check_grammar(
        &mut self,
        kind: HeaderKind,
        value: &'a str,
        via_seen: &mut bool,
    ) -> Result<(), ParseError> {
        match kind {
            HeaderKind::Via => {
                for item in CommaSplit::new(value) {
                    let via = Via::parse(item).ok_or(ParseError::BadHeaderValue("Via"))?;
                    if !*via_seen {
                        self.c_top_via = Some(via);
                    } else if self.c_second_via.is_none() {
                        self.c_second_via = Some(via);
                    }
                    *via_seen = true;
                }
            }
            HeaderKind::From | HeaderKind::To => {
                let from = kind == HeaderKind::From;
                let name = if from { "From" } else { "To" };
                let name_addr = NameAddr::parse(value).ok_or(ParseError::BadHeaderValue(name))?;
                if from {
                    self.c_from_tag = name_addr.tag();
                } else {
                    self.c_to_tag = name_addr.tag();
                }
            }
            HeaderKind::Contact if value != "*" => {
                for item in CommaSplit::new(value) {
                    NameAddr::parse(item).ok_or(ParseError::BadHeaderValue("Contact"))?;
                }
            }
            HeaderKind::Route | HeaderKind::RecordRoute => {
                let name = if kind == HeaderKind::Route {
                    "Route"
                } else {
                    "Record-Route"
                };
                for item in CommaSplit::new(value) {
                    NameAddr::parse(item).ok_or(ParseError::BadHeaderValue(name))?;
                }
            }
            HeaderKind::CallId if value.is_empty() || value.bytes().any(is_lws) => {
                return Err(ParseError::BadHeaderValue("Call-ID"));
            }
            _ => {}
        }
        Ok(())
    }

    /// CSeq is a 32-bit number, LWS and the request's method.
    fn check_cseq(&mut self) -> Result<(), ParseError> {
        let cseq = self.value_at(self.i_cseq as usize);
        let bytes = cseq.as_bytes();
        let digits_end = bytes
            .iter()
            .position(|byte| !byte.is_ascii_digit())
            .unwrap_or(bytes.len());
        let number = parse_dec(&cseq[..digits_end], u64::from(u32::MAX))
            .ok_or(ParseError::BadHeaderValue("CSeq"))?;
        let method = trim(&cseq[digits_end..]);
        if digits_end == cseq.len()
            || !bytes[digits_end..]
                .first()
                .is_some_and(|&byte| is_lws(byte))
            || !is_token_str(method)
        {
            return Err(ParseError::BadHeaderValue("CSeq"));
        }
        self.cseq_num = number as u32;
        if let Start::Request {
            method: (method_start, method_end),
            ..
        } = self.start
        {
            if &self.head[method_start as usize..method_end as usize] != method {
                return Err(ParseError::CSeqMethodMismatch);
            }
        }
        Ok(())
    }

    /// Max-Forwards (0..=255) and Content-Length, which bounds the message
    /// (extra datagram bytes are ignored).
    fn check_lengths(&mut self) -> Result<(), ParseError> {
        if self.i_max_fwd != NONE {
            let value = self.value_at(self.i_max_fwd as usize);
            self.max_fwd =
                parse_dec(value, 255).ok_or(ParseError::BadHeaderValue("Max-Forwards"))? as u32;
        }
        if self.i_clen != NONE {
            let value = self.value_at(self.i_clen as usize);
            let content_length = parse_dec(value, MAX_MESSAGE as u64)
                .ok_or(ParseError::BadHeaderValue("Content-Length"))?
                as usize;
            let available = self.buf.len() - self.body_start as usize;
            if content_length > available {
                return Err(ParseError::ContentLengthTooLarge);
            }
            self.body_end = self.body_start + content_length as u16;
        }
        Ok(())
    }

    #[inline]
    fn value_at(&self, i: usize) -> &'a str {
        let header = &self.hdrs[i];
        &self.head[header.value_start as usize..header.value_end as usize]
    }

    #[inline]
    fn opt_value(&self, i: u8) -> Option<&'a str> {
        (i != NONE).then(|| self.value_at(i as usize))
    }

    /// The message bytes (from the start line to the end of the body per
    /// Content-Length; leading keep-alive CRLFs and trailing junk excluded).
    pub fn as_bytes(&self) -> &'a [u8] {
        &self.buf[self.msg_start as usize..self.body_end as usize]
    }

    /// Offset of the start line in the datagram.
    pub fn msg_start(&self) -> usize {
        self.msg_start as usize
    }

    /// Offset just past the body (Content-Length honoured).
    pub fn msg_end(&self) -> usize {
        self.body_end as usize
    }

    /// The header section (start line and headers) as text.
    pub fn head(&self) -> &'a str {
        self.head
    }

    /// The start line, without line terminator.
    pub fn start_line(&self) -> &'a str {
        self.head[self.msg_start as usize..self.start_line_end as usize]
            .trim_end_matches(['\r', '\n'])
    }

    /// `true` for requests.
    pub fn is_request(&self) -> bool {
        matches!(self.start, Start::Request { .. })
    }

    /// Request method.
    pub fn method(&self) -> Option<Method<'a>> {
        match self.start {
            Start::Request { method, .. } => Some(Method::from_token(
                &self.head[method.0 as usize..method.1 as usize],
            )),
            Start::Response { .. } => None,
        }
    }

    /// Response status code.
    pub fn status(&self) -> Option<u16> {
        match self.start {
            Start::Response { status, .. } => Some(status),
            Start::Request { .. } => None,
        }
    }

    /// Response reason phrase.
    pub fn reason(&self) -> Option<&'a str> {
        match self.start {
            Start::Response { reason, .. } => {
                Some(&self.head[reason.0 as usize..reason.1 as usize])
            }
            Start::Request { .. } => None,
        }
    }

    /// Request-URI text.
    pub fn request_uri(&self) -> Option<&'a str> {
        match self.start {
            Start::Request { uri, .. } => Some(&self.head[uri.0 as usize..uri.1 as usize]),
            Start::Response { .. } => None,
        }
    }

    /// Byte range of the Request-URI in the datagram.
    pub fn request_uri_range(&self) -> Option<(usize, usize)> {
        match self.start {
            Start::Request { uri, .. } => Some((uri.0 as usize, uri.1 as usize)),
            Start::Response { .. } => None,
        }
    }

    /// Call-ID value.
    pub fn call_id(&self) -> Option<&'a str> {
        self.opt_value(self.i_call_id)
    }

    /// CSeq number and method.
    pub fn cseq(&self) -> Option<(u32, Method<'a>)> {
        let value = self.opt_value(self.i_cseq)?;
        let digits_end = value
            .bytes()
            .position(|b| !b.is_ascii_digit())
            .unwrap_or(value.len());
        Some((
            self.cseq_num,
            Method::from_token(trim(&value[digits_end..])),
        ))
    }

    /// From as a name-addr.
    pub fn from(&self) -> Option<NameAddr<'a>> {
        NameAddr::parse(self.opt_value(self.i_from)?)
    }

    /// To as a name-addr.
    pub fn to(&self) -> Option<NameAddr<'a>> {
        NameAddr::parse(self.opt_value(self.i_to)?)
    }

    /// From tag.
    pub fn from_tag(&self) -> Option<&'a str> {
        if self.validated {
            return self.c_from_tag;
        }
        self.from()?.tag()
    }

    /// To tag.
    pub fn to_tag(&self) -> Option<&'a str> {
        if self.validated {
            return self.c_to_tag;
        }
        self.to()?.tag()
    }

    /// All Via values, top first (multiple values per line and `v:` handled).
    pub fn vias(&self) -> impl Iterator<Item = Via<'a>> + '_ {
        self.values(HeaderKind::Via).filter_map(Via::parse)
    }

    /// The topmost Via.
    pub fn top_via(&self) -> Option<Via<'a>> {
        if self.validated {
            return self.c_top_via;
        }
        // The topmost value, not the first that parses (lazy messages).
        self.values(HeaderKind::Via).next().and_then(Via::parse)
    }

    /// The second Via value (where a response goes once the top one is
    /// removed): `vias().nth(1)`, without parsing again what
    /// [`Self::parse`] parsed.
    pub fn second_via(&self) -> Option<Via<'a>> {
        if self.validated {
            return self.c_second_via;
        }
        self.vias().nth(1)
    }

    /// Max-Forwards value if present.
    pub fn max_forwards(&self) -> Option<u32> {
        (self.i_max_fwd != NONE).then_some(self.max_fwd)
    }

    /// Route values, top first.
    pub fn routes(&self) -> impl Iterator<Item = NameAddr<'a>> + '_ {
        self.values(HeaderKind::Route).filter_map(NameAddr::parse)
    }

    /// Route values, top first, each with its URI parsed as a SIP URI
    /// when it is one ([`NameAddr::sip_uri`], parsed once).
    pub(crate) fn routes_with_uri(
        &self,
    ) -> impl Iterator<Item = (NameAddr<'a>, Option<SipUri<'a>>)> + '_ {
        self.values(HeaderKind::Route)
            .filter_map(NameAddr::parse_with_uri)
    }

    /// Record-Route values, top first.
    pub fn record_routes(&self) -> impl Iterator<Item = NameAddr<'a>> + '_ {
        self.values(HeaderKind::RecordRoute)
            .filter_map(NameAddr::parse)
    }

    /// Contact values (empty for `Contact: *`; see [`Self::contact_star`]).
    pub fn contact(&self) -> impl Iterator<Item = NameAddr<'a>> + '_ {
        self.values(HeaderKind::Contact)
            .filter(|v| *v != "*")
            .filter_map(NameAddr::parse)
    }

    /// `true` if a `Contact: *` is present.
    pub fn contact_star(&self) -> bool {
        self.values(HeaderKind::Contact).any(|v| v == "*")
    }

    /// Expires header value; values beyond 2^32-1 saturate.
    pub fn expires(&self) -> Option<u32> {
        let value = self.raw_values(HeaderKind::Expires).next()?;
        parse_delta(value)
    }

    /// Content-Length value if present.
    pub fn content_length(&self) -> Option<usize> {
        (self.i_clen != NONE).then(|| (self.body_end - self.body_start) as usize)
    }

    /// Proxy-Require option tags.
    pub fn proxy_require(&self) -> impl Iterator<Item = &'a str> + '_ {
        self.values(HeaderKind::ProxyRequire)
            .filter(|s| !s.is_empty())
    }

    /// The body (Content-Length bytes, or the rest of the datagram).
    pub fn body(&self) -> &'a [u8] {
        &self.buf[self.body_start as usize..self.body_end as usize]
    }

    /// Raw values of every header named `name` (case-insensitive, compact
    /// forms mapped), one item per header line.
    pub fn header<'s>(&'s self, name: &'s str) -> impl Iterator<Item = &'a str> + 's {
        let kind = HeaderKind::of(name);
        let long = expand_compact(name);
        self.hdrs[..self.nhdrs as usize]
            .iter()
            .enumerate()
            .filter(move |(_, h)| {
                h.kind == kind
                    && (kind != HeaderKind::Other
                        || expand_compact(&self.head[h.line_start as usize..h.name_end as usize])
                            .eq_ignore_ascii_case(long))
            })
            .map(|(i, _)| self.value_at(i))
    }

    /// Every header as `(name, raw value)` in order.
    pub fn headers(&self) -> impl Iterator<Item = (&'a str, &'a str)> + '_ {
        (0..self.nhdrs as usize).map(|i| {
            let header = &self.hdrs[i];
            (
                &self.head[header.line_start as usize..header.name_end as usize],
                self.value_at(i),
            )
        })
    }

    /// Header positions (for the editor).
    pub fn header_positions(&self) -> &[HeaderPos] {
        &self.hdrs[..self.nhdrs as usize]
    }

    /// Offset where the first header line starts (after the start line).
    pub fn headers_start(&self) -> usize {
        self.start_line_end as usize
    }

    /// Offset of the empty line ending the header section.
    pub fn head_end(&self) -> usize {
        self.head_end as usize
    }

    /// The underlying datagram.
    pub fn datagram(&self) -> &'a [u8] {
        self.buf
    }

    /// Raw header values of a kind, one per line.
    pub fn raw_values(&self, kind: HeaderKind) -> impl Iterator<Item = &'a str> + '_ {
        self.hdrs[..self.nhdrs as usize]
            .iter()
            .enumerate()
            .filter(move |(_, h)| h.kind == kind)
            .map(|(i, _)| self.value_at(i))
    }

    /// Comma-separated values of a kind across all its lines.
    pub fn values(&self, kind: HeaderKind) -> impl Iterator<Item = &'a str> + '_ {
        self.raw_values(kind).flat_map(CommaSplit::new)
    }

    /// The Request-URI as a SIP URI, if it is one.
    pub fn request_sip_uri(&self) -> Option<SipUri<'a>> {
        if self.validated {
            return self.c_ruri;
        }
        SipUri::parse(self.request_uri()?)
    }
}

/// Parse delta-seconds, saturating at `u32::MAX` (RFC 3261 20.19).
pub fn parse_delta(text: &str) -> Option<u32> {
    let text = trim(text);
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some(parse_dec(text, u64::from(u32::MAX)).map_or(u32::MAX, |x| x as u32))
}

fn parse_version(v: &str) -> Result<(), ParseError> {
    let bytes = v.as_bytes();
    if bytes.len() < 7 || !bytes[..4].eq_ignore_ascii_case(b"SIP/") {
        return Err(ParseError::BadStartLine("version"));
    }
    let rest = &v[4..];
    let dot = rest.find('.').ok_or(ParseError::BadStartLine("version"))?;
    let (maj, min) = (&rest[..dot], &rest[dot + 1..]);
    if maj.is_empty()
        || min.is_empty()
        || !maj.bytes().all(|c| c.is_ascii_digit())
        || !min.bytes().all(|c| c.is_ascii_digit())
    {
        return Err(ParseError::BadStartLine("version"));
    }
    if maj != "2" || min != "0" {
        return Err(ParseError::BadVersion);
    }
    Ok(())
}

/// Check `u` as a Request-URI: no whitespace or control characters, a
/// scheme, and for `sip:`/`sips:` a SIP URI without headers (returned).
/// The proxy checks a Route value with it before making it the
/// Request-URI.
pub(crate) fn check_request_uri(uri: &str) -> Result<Option<SipUri<'_>>, ParseError> {
    request_uri_checked(uri, SipUri::parse)
}

/// [`check_request_uri`] of `uri` whose [`SipUri::parse`] was `sip_uri`
/// (a Route value's, from [`SipMsg::routes_with_uri`]: not parsed again).
pub(crate) fn check_parsed_request_uri<'u>(
    uri: &'u str,
    sip_uri: Option<SipUri<'u>>,
) -> Result<Option<SipUri<'u>>, ParseError> {
    request_uri_checked(uri, |_| sip_uri)
}

fn request_uri_checked<'u>(
    uri: &'u str,
    sip_parse: impl FnOnce(&'u str) -> Option<SipUri<'u>>,
) -> Result<Option<SipUri<'u>>, ParseError> {
    if uri.bytes().any(|b| is_lws(b) || b < 0x21) {
        return Err(ParseError::BadRequestUri("whitespace"));
    }
    match scheme(uri) {
        None => Err(ParseError::BadRequestUri("scheme")),
        Some(scheme_name)
            if scheme_name.eq_ignore_ascii_case("sip")
                || scheme_name.eq_ignore_ascii_case("sips") =>
        {
            let sip_uri = sip_parse(uri).ok_or(ParseError::BadRequestUri("sip uri"))?;
            if sip_uri.headers.is_some() {
                return Err(ParseError::BadRequestUri("headers not allowed"));
            }
            Ok(Some(sip_uri))
        }
        Some(_) => Ok(None),
    }
}

fn parse_start_line(line: &str, off: usize) -> Result<(Start, Option<SipUri<'_>>), ParseError> {
    if line.len() >= 4 && line.as_bytes()[..4].eq_ignore_ascii_case(b"SIP/") {
        // Status-Line = SIP-Version SP Status-Code SP Reason-Phrase
        let space = line
            .find(' ')
            .ok_or(ParseError::BadStartLine("status line"))?;
        parse_version(&line[..space])?;
        let rest = &line[space + 1..];
        let code_end = rest.find(' ').unwrap_or(rest.len());
        let code = &rest[..code_end];
        if code.len() != 3 || !code.bytes().all(|c| c.is_ascii_digit()) {
            return Err(ParseError::BadStatus);
        }
        let status: u16 = code.parse().map_err(|_| ParseError::BadStatus)?;
        if !(100..=699).contains(&status) {
            return Err(ParseError::BadStatus);
        }
        let reason_start = (space + 1 + code_end + 1).min(line.len());
        return Ok((
            Start::Response {
                status,
                reason: ((off + reason_start) as u16, (off + line.len()) as u16),
            },
            None,
        ));
    }
    // Request-Line = Method SP Request-URI SP SIP-Version
    let mut parts = line.split(' ');
    let (method, uri, version) = match (parts.next(), parts.next(), parts.next(), parts.next()) {
        (Some(method), Some(uri), Some(version), None) => (method, uri, version),
        _ => {
            return Err(ParseError::BadStartLine(
                "expected METHOD SP URI SP VERSION",
            ))
        }
    };
    if !is_token_str(method) {
        return Err(ParseError::BadStartLine("method"));
    }
    if uri.is_empty() || version.is_empty() {
        return Err(ParseError::BadStartLine(
            "expected METHOD SP URI SP VERSION",
        ));
    }
    if uri.bytes().any(|b| is_lws(b) || b < 0x21) {
        return Err(ParseError::BadRequestUri("whitespace"));
    }
    parse_version(version)?;
    let sip_uri = check_request_uri(uri)?;
    let method_start = off;
    let uri_start = off + method.len() + 1;
    Ok((
        Start::Request {
            method: (method_start as u16, (method_start + method.len()) as u16),
            uri: (uri_start as u16, (uri_start + uri.len()) as u16),
        },
        sip_uri,
    ))
}

/// Is `host` (as written) an IP literal equal to `ip`?
pub fn host_is(host: &str, ip: IpAddr) -> bool {
    host_ip(host) == Some(ip)
}

#[cfg(test)]
mod tests {
    use super::*;

    const INV: &[u8] = b"INVITE sip:bob@192.0.2.4 SIP/2.0\r\n\
Via: SIP/2.0/UDP 192.0.2.1:5060;branch=z9hG4bK776asdhds;rport\r\n\
v: SIP/2.0/UDP 192.0.2.9;branch=z9hG4bKold, SIP/2.0/TCP [2001:db8::1]:5070;branch=z9hG4bKx;received=192.0.2.77\r\n\
Max-Forwards: 70\r\n\
To: Bob <sip:bob@example.com>\r\n\
f: Alice <sip:alice@example.com>;tag=1928301774\r\n\
i: a84b4c76e66710@pc33.example.com\r\n\
CSeq: 314159 INVITE\r\n\
Route: <sip:192.0.2.10;lr>, <sip:192.0.2.11;lr>\r\n\
Contact: <sip:alice@192.0.2.1>;expires=60\r\n\
Proxy-Require: foo, bar\r\n\
Content-Type: application/sdp\r\n\
l: 4\r\n\
\r\n\
v=0\r\ntrailing";

    #[test]
    fn lazy_skips_only_header_grammar() {
        let s = SipMsg::parse(INV).unwrap();
        let l = SipMsg::parse_lazy(INV).unwrap();
        crate::invariants::lazy_agrees(&s, &l);
        // A Contact that is no name-addr: strict refuses, lazy accepts and
        // the accessor skips the entry.
        let bad = String::from_utf8_lossy(INV).replace(
            "Contact: <sip:alice@192.0.2.1>",
            "Contact: <sip:alice@192.0.2.1",
        );
        assert!(SipMsg::parse(bad.as_bytes()).is_err());
        let l = SipMsg::parse_lazy(bad.as_bytes()).unwrap();
        assert_eq!(l.contact().count(), 0);
        // A malformed topmost Via is not replaced by the next one.
        let bad_via = String::from_utf8_lossy(INV).replace(
            "Via: SIP/2.0/UDP 192.0.2.1:5060;branch=z9hG4bK776asdhds;rport",
            "Via: SIP/2.0/UDP 192.0.2.1:5060;branch=z9hG4bK776asdhds;rport=99999",
        );
        assert!(SipMsg::parse(bad_via.as_bytes()).is_err());
        let l = SipMsg::parse_lazy(bad_via.as_bytes()).unwrap();
        assert_eq!(l.top_via(), None);
        assert_eq!(l.vias().count(), 2);
        assert_eq!(l.cseq(), Some((314159, Method::Invite)));
        // What lazy still checks: required headers, CSeq, Content-Length, start line.
        for (from, to) in [
            ("i: a84b4c76e66710@pc33.example.com\r\n", ""),
            ("CSeq: 314159 INVITE", "CSeq: x INVITE"),
            ("CSeq: 314159 INVITE", "CSeq: 314159 BYE"),
            ("l: 4", "l: 400"),
            (
                "INVITE sip:bob@192.0.2.4 SIP/2.0",
                "INVITE sip:bob@192.0.2.4 SIP/3.0",
            ),
            ("Max-Forwards: 70", "Max-Forwards: 700"),
        ] {
            let m = String::from_utf8_lossy(INV).replace(from, to);
            assert!(SipMsg::parse_lazy(m.as_bytes()).is_err(), "{to:?} accepted");
        }
        let no_via = String::from_utf8_lossy(INV)
            .lines()
            .filter(|l| !l.starts_with("Via:") && !l.starts_with("v:"))
            .collect::<Vec<_>>()
            .join("\r\n");
        assert_eq!(
            SipMsg::parse_lazy(no_via.as_bytes()).unwrap_err(),
            ParseError::MissingHeader("Via")
        );
    }

    #[test]
    fn parses_request() {
        let m = SipMsg::parse(INV).unwrap();
        assert!(m.is_request());
        assert_eq!(m.method(), Some(Method::Invite));
        assert_eq!(m.request_uri(), Some("sip:bob@192.0.2.4"));
        assert_eq!(m.call_id(), Some("a84b4c76e66710@pc33.example.com"));
        assert_eq!(m.cseq(), Some((314159, Method::Invite)));
        assert_eq!(m.from_tag(), Some("1928301774"));
        assert_eq!(m.to_tag(), None);
        let vias: Vec<_> = m.vias().collect();
        assert_eq!(vias.len(), 3);
        assert_eq!(vias[0].branch, Some("z9hG4bK776asdhds"));
        assert!(vias[0].rport_flag);
        assert_eq!(vias[2].host, "[2001:db8::1]");
        assert_eq!(vias[2].port, Some(5070));
        assert_eq!(vias[2].transport, "TCP");
        assert_eq!(
            vias[2].response_target(),
            Some("192.0.2.77:5070".parse().unwrap())
        );
        assert_eq!(m.max_forwards(), Some(70));
        assert_eq!(m.routes().count(), 2);
        assert_eq!(
            m.contact().next().unwrap().param("expires"),
            Some(Some("60"))
        );
        assert_eq!(m.proxy_require().collect::<Vec<_>>(), vec!["foo", "bar"]);
        assert_eq!(m.body(), b"v=0\r");
        assert_eq!(m.content_length(), Some(4));
        assert_eq!(m.header("content-type").next(), Some("application/sdp"));
        assert_eq!(m.header("c").next(), Some("application/sdp"));
        assert_eq!(m.header("Call-ID").next(), m.call_id());
    }

    #[test]
    fn parses_response_and_folding() {
        let r = b"SIP/2.0 180 Ringing\r\nVia: SIP/2.0/UDP\r\n 192.0.2.1\r\n ;branch=z9hG4bKa\r\nTo: <sip:b@x>;tag=2\r\nFrom: <sip:a@x>;tag=1\r\nCall-ID: c\r\nCSeq: 1\r\n  INVITE\r\n\r\n";
        let m = SipMsg::parse(r).unwrap();
        assert_eq!(m.status(), Some(180));
        assert_eq!(m.reason(), Some("Ringing"));
        assert_eq!(m.top_via().unwrap().branch, Some("z9hG4bKa"));
        assert_eq!(m.cseq(), Some((1, Method::Invite)));
        assert_eq!(m.to_tag(), Some("2"));
        assert_eq!(m.body(), b"");
    }

    #[test]
    fn errors() {
        let base = "OPTIONS sip:a@b SIP/2.0\r\nVia: SIP/2.0/UDP h;branch=z9hG4bK1\r\nTo: <sip:a@b>\r\nFrom: <sip:c@d>;tag=1\r\nCall-ID: x\r\nCSeq: 1 OPTIONS\r\n";
        let ok = format!("{base}\r\n");
        assert!(SipMsg::parse(ok.as_bytes()).is_ok());
        let e = |s: String| SipMsg::parse(s.as_bytes()).unwrap_err();
        assert_eq!(
            e(format!("{base}Call-ID: y\r\n\r\n")),
            ParseError::DuplicateHeader("Call-ID")
        );
        assert_eq!(
            e(format!("{base}Max-Forwards: 256\r\n\r\n")),
            ParseError::BadHeaderValue("Max-Forwards")
        );
        assert_eq!(
            e(format!("{base}l: 5\r\n\r\nab")),
            ParseError::ContentLengthTooLarge
        );
        assert_eq!(
            e(base.replace("SIP/2.0\r\n", "SIP/3.0\r\n") + "\r\n"),
            ParseError::BadVersion
        );
        assert_eq!(
            e(base.replace("1 OPTIONS", "1 INVITE") + "\r\n"),
            ParseError::CSeqMethodMismatch
        );
        assert_eq!(
            e(base.replace("Call-ID: x\r\n", "") + "\r\n"),
            ParseError::MissingHeader("Call-ID")
        );
        assert_eq!(e(base.to_string()), ParseError::NoHeaderEnd);
        assert_eq!(SipMsg::parse(b"\r\n\r\n").unwrap_err(), ParseError::Empty);
    }
}
