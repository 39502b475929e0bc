//! Decisions from a datagram's first bytes, without a parse: what a driver
//! under overload can afford for every datagram it is about to refuse.

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

/// The value of `line` if it is a To header (`To:` or `t:`, any case,
/// blanks before the colon).
fn to_header_value(line: &[u8]) -> Option<&[u8]> {
    let name_end = line.iter().position(|&b| b == b':')?;
    let name = line[..name_end].trim_ascii_end();
    (name.eq_ignore_ascii_case(b"to") || name.eq_ignore_ascii_case(b"t"))
        .then(|| &line[name_end + 1..])
}

/// The header parameters of a From/To value, `name` and `value` each
/// trimmed (`value` empty when there is none).
fn header_params(value: &[u8]) -> impl Iterator<Item = (&[u8], &[u8])> {
    // Parameters of the header follow the URI's closing '>' when there is
    // one (`;tag` inside <...> is a URI parameter); else the whole value.
    let params = match value.iter().rposition(|&b| b == b'>') {
        Some(end) => &value[end + 1..],
        None => value,
    };
    params.split(|&b| b == b';').skip(1).map(|param| {
        let (name, value) = match param.iter().position(|&b| b == b'=') {
            Some(eq) => (&param[..eq], &param[eq + 1..]),
            None => (param, &[][..]),
        };
        (name.trim_ascii(), value.trim_ascii())
    })
}

/// Whether a To value carries a `tag` parameter (outside its `<...>`).
pub(crate) fn has_tag(value: &[u8]) -> bool {
    header_params(value).any(|(name, _)| name.eq_ignore_ascii_case(b"tag"))
}

/// The value of the first `tag` parameter of a From/To value (`None`:
/// none, or one without a value).
pub(crate) fn tag_of(value: &[u8]) -> Option<&[u8]> {
    header_params(value)
        .find(|(name, _)| name.eq_ignore_ascii_case(b"tag"))
        .map(|(_, tag)| tag)
        .filter(|tag| !tag.is_empty())
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
}
