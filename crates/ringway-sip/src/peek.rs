//! Decisions from a datagram's first bytes, without a parse: what a driver
//! under overload can afford for every datagram it is about to refuse.
//! Each piece reads a line or a value by the full parser's own grammar
//! (its line syntax, its header classification, where it finds a
//! From/To's parameters), so that what a quick path copies into a
//! response is what the full path would have read.

use crate::msg::{trim_range, HeaderKind};
use crate::text::{find_byte, is_lws, is_token, quoted_end, Params};

/// Whether `datagram` looks like a new INVITE: its request line starts
/// with `INVITE ` and its To header (`To` or `t`, any case) has no `tag`
/// parameter. A peek, not a parse: a malformed or unusual message may be
/// misjudged (a To tag on a folded continuation line is not seen), so only
/// a decision that is safe either way may rest on it — such as dropping
/// the datagram unanswered under overload, which the sender's
/// retransmission timer covers like a loss.
pub fn is_new_invite(datagram: &[u8]) -> bool {
    if !datagram.starts_with(b"INVITE ") {
        return false;
    }
    // Header lines up to the empty line that ends them.
    let mut lines = datagram.split(|&b| b == b'\n').skip(1);
    for line in lines.by_ref() {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if line.is_empty() {
            break;
        }
        if let Some(value) = to_header_value(line) {
            return !has_tag(value);
        }
    }
    // No To header: not a request a proxy would admit; not "new" either.
    false
}

/// The Call-ID of `datagram`: the value of its first `Call-ID` (or `i`)
/// header with its continuation lines, trimmed, by the full parser's line
/// grammar and folding; `None` if there is none or the value is empty or
/// holds white space (the full parser refuses those). What a driver
/// telling a sender's resend from a new request reads, without a parse.
/// For every message the full parser accepts it is that parser's
/// Call-ID (a fuzz invariant); on one it refuses it is a best effort
/// (lines it would refuse are skipped, a head without its empty line is
/// read to its end).
pub fn call_id(datagram: &[u8]) -> Option<&[u8]> {
    // The value's range, once the Call-ID line is found.
    let mut value: Option<(usize, usize)> = None;
    // Past the start line, and the empty lines before it (RFC 3261 §7.5).
    let skip = datagram
        .iter()
        .position(|&b| b != b'\r' && b != b'\n')
        .unwrap_or(datagram.len());
    let mut pos = find_byte_at(datagram, skip, b'\n')? + 1;
    while let Some(newline) = find_byte_at(datagram, pos, b'\n') {
        let mut content_end = newline;
        if content_end > pos && datagram[content_end - 1] == b'\r' {
            content_end -= 1;
        }
        if content_end == pos {
            break;
        }
        let line = &datagram[pos..content_end];
        if line[0] == b' ' || line[0] == b'\t' {
            // A continuation extends the value of the header above.
            if let Some((start, end)) = value.as_mut() {
                let (from, to) = trim_range(datagram, pos, content_end);
                if from < to {
                    if *start == *end {
                        *start = from;
                    }
                    *end = to;
                }
            }
        } else if value.is_some() {
            break;
        } else if let Some((name, _)) = split_header(line) {
            if header_kind(name) == HeaderKind::CallId {
                let colon = pos + line.iter().position(|&b| b == b':')? + 1;
                let (from, to) = trim_range(datagram, colon, content_end);
                value = Some(if from < to {
                    (from, to)
                } else {
                    (content_end, content_end)
                });
            }
        }
        pos = newline + 1;
    }
    let (start, end) = value?;
    let value = &datagram[start..end];
    let usable = !value.is_empty() && !value.iter().any(|&b| is_lws(b));
    usable.then_some(value)
}

/// The offset of the first `byte` in `bytes` at or after `from`.
fn find_byte_at(bytes: &[u8], from: usize, byte: u8) -> Option<usize> {
    Some(from + memchr::memchr(byte, bytes.get(from..)?)?)
}

/// The value of `line` if it is a To header (`To` or `t`, any case), by
/// the full parser's line grammar ([`split_header`]).
fn to_header_value(line: &[u8]) -> Option<&[u8]> {
    let (name, value) = split_header(line)?;
    (header_kind(name) == HeaderKind::To).then_some(value)
}

/// The kind of a header name as the full parser classifies it (compact
/// forms mapped, any case). A name from [`split_header`] is a token,
/// hence ASCII.
pub(crate) fn header_kind(name: &[u8]) -> HeaderKind {
    std::str::from_utf8(name).map_or(HeaderKind::Other, HeaderKind::of)
}

/// `name: value` of a header line, by the full parser's grammar (a token,
/// blanks, a colon; the value without linear white space at either end);
/// `None` for a line the full parser refuses.
pub(crate) fn split_header(line: &[u8]) -> Option<(&[u8], &[u8])> {
    let name_len = line.iter().position(|&b| !is_token(b))?;
    let blanks = line[name_len..]
        .iter()
        .take_while(|&&b| b == b' ' || b == b'\t')
        .count();
    if name_len == 0 || line.get(name_len + blanks) != Some(&b':') {
        return None;
    }
    Some((&line[..name_len], trim_lws(&line[name_len + blanks + 1..])))
}

/// `bytes` without linear white space at either end (as the full parser
/// trims values: not form feeds or other ASCII blanks).
pub(crate) fn trim_lws(bytes: &[u8]) -> &[u8] {
    let start = bytes
        .iter()
        .position(|&b| !is_lws(b))
        .unwrap_or(bytes.len());
    let end = bytes
        .iter()
        .rposition(|&b| !is_lws(b))
        .map_or(start, |at| at + 1);
    &bytes[start..end]
}

/// The header parameters of a From/To value where the full parser
/// ([`crate::NameAddr::parse`]) finds them: after the `>` that closes the
/// first `<` (past a quoted display name), else after the URI of an
/// addr-spec; split on `;` outside quoted strings. `None` for a value that
/// is not UTF-8 (the full parser refuses it).
fn header_params(value: &[u8]) -> Option<Params<'_>> {
    let value = std::str::from_utf8(value).ok()?;
    let bytes = value.as_bytes();
    // A quoted display name may hold `<`, `>` and `;`.
    let name_end = match bytes.first() {
        Some(b'"') => quoted_end(bytes).unwrap_or(bytes.len()),
        _ => 0,
    };
    let params = match find_byte(&value[name_end..], b'<') {
        Some(open) => {
            let uri_at = name_end + open + 1;
            match find_byte(&value[uri_at..], b'>') {
                Some(close) => &value[uri_at + close + 1..],
                None => "",
            }
        }
        // An addr-spec: the URI runs to the first `;`.
        None => find_byte(value, b';').map_or("", |at| &value[at..]),
    };
    Some(Params::new(params))
}

/// Whether a To value carries a `tag` parameter where the full parser
/// looks for it (with or without a value; a value that is not UTF-8 counts
/// as tagged: the full parser refuses it, so it is never taken for new).
pub(crate) fn has_tag(value: &[u8]) -> bool {
    header_params(value)
        .is_none_or(|mut params| params.any(|(name, _)| name.eq_ignore_ascii_case("tag")))
}

/// The value of the `tag` parameter of a From/To value as the full parser
/// reads it ([`crate::NameAddr::tag`]: the first `tag` with a value; `None`:
/// none, or not UTF-8).
pub(crate) fn tag_of(value: &[u8]) -> Option<&[u8]> {
    header_params(value)?
        .find(|(name, tag)| name.eq_ignore_ascii_case("tag") && tag.is_some())
        .and_then(|(_, tag)| tag)
        .filter(|tag| !tag.is_empty())
        .map(str::as_bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn invite(to: &str) -> Vec<u8> {
        format!(
            "INVITE sip:bob@example.com SIP/2.0\r\nVia: SIP/2.0/UDP 192.0.2.1;branch=z9hG4bK1\r\n\
From: <sip:a@example.com>;tag=1\r\n{to}\r\nCall-ID: c\r\nCSeq: 1 INVITE\r\n\r\n"
        )
        .into_bytes()
    }

    #[test]
    fn new_invites_are_told_from_in_dialog_ones_and_other_methods() {
        assert!(is_new_invite(&invite("To: <sip:bob@example.com>")));
        assert!(is_new_invite(&invite("t: sip:bob@example.com")));
        assert!(is_new_invite(&invite("TO : <sip:bob@example.com;tag=uri>")));
        assert!(!is_new_invite(&invite("To: <sip:bob@example.com>;tag=b")));
        assert!(!is_new_invite(&invite(
            "to: <sip:bob@example.com> ; TAG = b"
        )));
        assert!(!is_new_invite(&invite("t: sip:bob@example.com;tag=b")));
        // Where the full parser finds the parameters: after the `>` that
        // closes the URI (not the last `>`), outside quoted strings, past
        // a quoted display name.
        assert!(!is_new_invite(&invite(
            "To: <sip:bob@example.com>;tag=b;p=\">\""
        )));
        assert!(is_new_invite(&invite(
            "To: \"x>;tag=1\" <sip:bob@example.com>"
        )));
        assert!(is_new_invite(&invite(
            "To: <sip:bob@example.com>;p=\";tag=1\""
        )));
        assert!(!is_new_invite(&invite(
            "To: \"a<b>\" <sip:bob@example.com> ;tag=1"
        )));
        // A line the full parser refuses is no To header.
        assert!(!is_new_invite(&invite("To\x0c: <sip:bob@example.com>")));
        // No To header at all, another method, a response.
        assert!(!is_new_invite(&invite("X-To: <sip:bob@example.com>")));
        let bye = String::from_utf8(invite("To: <sip:b@example.com>")).unwrap();
        assert!(!is_new_invite(bye.replacen("INVITE", "BYE", 1).as_bytes()));
        assert!(!is_new_invite(b"SIP/2.0 200 OK\r\nTo: <sip:b@x>\r\n\r\n"));
        // The To header of the body is not read.
        let body = b"INVITE sip:b@x SIP/2.0\r\nTo: <sip:b@x>;tag=2\r\n\r\nTo: <sip:c@x>\r\n";
        assert!(!is_new_invite(body));
        assert!(!is_new_invite(b""));
    }

    #[test]
    fn the_call_id_is_read_as_the_full_parser_reads_it() {
        let with = |header: &str| {
            format!(
                "INVITE sip:b@x SIP/2.0\r\nVia: SIP/2.0/UDP 192.0.2.1;branch=z9hG4bK1\r\n\
From: <sip:a@x>;tag=1\r\nTo: <sip:b@x>\r\n{header}\r\nCSeq: 1 INVITE\r\n\r\nCall-ID: body\r\n"
            )
        };
        for (header, expected) in [
            ("Call-ID: a84b4c76e66710@pc33", Some("a84b4c76e66710@pc33")),
            ("i:  c1 ", Some("c1")),
            ("CALL-id\t: c2", Some("c2")),
            ("Call-ID: ", None),
            ("Call-ID: two words", None),
            ("X-Call-ID: c3", None),
            // Folded: the value on the continuation line, or spread over
            // lines (white space inside: refused).
            ("Call-ID:\r\n  c4@host", Some("c4@host")),
            ("Call-ID: c5@host\r\n \t", Some("c5@host")),
            ("Call-ID: c6\r\n @host", None),
        ] {
            let datagram = with(header);
            let peeked = call_id(datagram.as_bytes());
            assert_eq!(peeked, expected.map(str::as_bytes), "{header}");
            if let Ok(parsed) = crate::SipMsg::parse(datagram.as_bytes()) {
                assert_eq!(peeked, parsed.call_id().map(str::as_bytes), "{header}");
            }
        }
        assert_eq!(call_id(b""), None);
        assert_eq!(
            call_id(b"INVITE sip:b@x SIP/2.0\r\n\r\nCall-ID: body\r\n"),
            None
        );
    }
}
