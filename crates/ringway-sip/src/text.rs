//! Small lexical helpers shared by the parser and editor (RFC 3261 section 25).

/// Linear white space as it can appear inside a (possibly folded) header value.
#[inline]
pub(crate) fn is_lws(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\r' | b'\n')
}

/// RFC 3261 `token` characters, one flag per byte value.
static TOKEN: [bool; 256] = {
    let mut table = [false; 256];
    let mut b = 0;
    while b < 256 {
        let c = b as u8;
        table[b] = c.is_ascii_alphanumeric()
            || matches!(
                c,
                b'-' | b'.' | b'!' | b'%' | b'*' | b'_' | b'+' | b'`' | b'\'' | b'~'
            );
        b += 1;
    }
    table
};

/// RFC 3261 `token` character.
#[inline]
pub(crate) fn is_token(b: u8) -> bool {
    TOKEN[usize::from(b)]
}

/// Position of the first byte `b` in `s`. A plain loop: the pieces of a
/// header value searched here are a few dozen bytes, where a vectorised
/// search (`str::find`, `memchr`) costs more to set up than it saves
/// (measured with `benches/t_sip.rs`).
#[inline]
pub(crate) fn find_byte(s: &str, b: u8) -> Option<usize> {
    s.as_bytes().iter().position(|&c| c == b)
}

/// A port of 1 to 5 ASCII digits (leading zeros allowed) up to 65535, as
/// `str::parse::<u16>` reads digits, without its general machinery.
#[inline]
pub(crate) fn parse_port(digits: &str) -> Option<u16> {
    let bytes = digits.as_bytes();
    if bytes.is_empty() || bytes.len() > 5 || !bytes.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let value = bytes
        .iter()
        .fold(0u32, |value, &digit| value * 10 + u32::from(digit - b'0'));
    u16::try_from(value).ok()
}

/// Trim LWS (including folding CRLFs) on both sides.
#[inline]
pub(crate) fn trim(s: &str) -> &str {
    let bytes = s.as_bytes();
    let mut start = 0;
    let mut end = bytes.len();
    while start < end && is_lws(bytes[start]) {
        start += 1;
    }
    while end > start && is_lws(bytes[end - 1]) {
        end -= 1;
    }
    // LWS bytes are ASCII, so a and e are char boundaries.
    s.get(start..end).unwrap_or("")
}

/// True when `s` is a non-empty token.
pub(crate) fn is_token_str(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(is_token)
}

/// Parse an unsigned decimal of at most `max` (no sign, no LWS). `None` on
/// empty, non-digit or overflow beyond `max`.
pub(crate) fn parse_dec(s: &str, max: u64) -> Option<u64> {
    if s.is_empty() || s.len() > 20 {
        // More than 20 digits cannot fit; leading zeros beyond that are unusual
        // enough to reject rather than loop over arbitrarily long input.
        if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        let digits = s.trim_start_matches('0');
        if digits.len() > 20 {
            return None;
        }
        return parse_dec(if digits.is_empty() { "0" } else { digits }, max);
    }
    let mut value: u64 = 0;
    for b in s.bytes() {
        if !b.is_ascii_digit() {
            return None;
        }
        value = value.checked_mul(10)?.checked_add(u64::from(b - b'0'))?;
    }
    (value <= max).then_some(value)
}

/// Scan a quoted string starting at `s[0] == '"'`; returns the index just
/// after the closing quote, honouring backslash escapes.
pub(crate) fn quoted_end(s: &[u8]) -> Option<usize> {
    debug_assert!(s.first() == Some(&b'"'));
    let mut index = 1;
    while index < s.len() {
        match s[index] {
            b'\\' => index += 2,
            b'"' => return Some(index + 1),
            _ => index += 1,
        }
    }
    None
}

/// Split a header value at top-level commas (outside quotes and `<...>`).
/// Yields trimmed items; an empty item is yielded as an empty string so the
/// caller can reject it.
pub(crate) struct CommaSplit<'a> {
    s: &'a str,
    pos: usize,
    done: bool,
}

impl<'a> CommaSplit<'a> {
    pub(crate) fn new(s: &'a str) -> Self {
        CommaSplit {
            s,
            pos: 0,
            done: false,
        }
    }
}

impl<'a> Iterator for CommaSplit<'a> {
    type Item = &'a str;
    fn next(&mut self) -> Option<&'a str> {
        if self.done {
            return None;
        }
        let bytes = self.s.as_bytes();
        let start = self.pos;
        if memchr::memchr(b',', &bytes[start..]).is_none() {
            // Fast path: no comma left, the rest is one item.
            self.done = true;
            return Some(trim(&self.s[start..]));
        }
        let mut index = start;
        let mut angle = false;
        while index < bytes.len() {
            match bytes[index] {
                b'"' => match quoted_end(&bytes[index..]) {
                    Some(n) => {
                        index += n;
                        continue;
                    }
                    None => break,
                },
                b'<' => angle = true,
                b'>' => angle = false,
                b',' if !angle => {
                    self.pos = index + 1;
                    return Some(trim(&self.s[start..index]));
                }
                _ => {}
            }
            index += 1;
        }
        self.done = true;
        Some(trim(&self.s[start..]))
    }
}

/// Iterate `;`-separated parameters of a parameter list (the text after the
/// first `;`, or starting with `;`). Yields `(name, value)` trimmed.
pub(crate) struct Params<'a> {
    s: &'a str,
    pos: usize,
}

impl<'a> Params<'a> {
    pub(crate) fn new(s: &'a str) -> Self {
        Params { s, pos: 0 }
    }
}

impl<'a> Iterator for Params<'a> {
    type Item = (&'a str, Option<&'a str>);
    fn next(&mut self) -> Option<Self::Item> {
        let bytes = self.s.as_bytes();
        // skip leading LWS and one ';'
        let mut index = self.pos;
        while index < bytes.len() && is_lws(bytes[index]) {
            index += 1;
        }
        if index < bytes.len() && bytes[index] == b';' {
            index += 1;
        }
        if index >= bytes.len() {
            self.pos = bytes.len();
            return None;
        }
        let start = index;
        if memchr::memchr(b'"', &bytes[start..]).is_none() {
            // Fast path: no quoted strings, so `;` and `=` are delimiters.
            let end = memchr::memchr(b';', &bytes[start..]).map_or(bytes.len(), |p| start + p);
            self.pos = end;
            return Some(match memchr::memchr(b'=', &bytes[start..end]) {
                Some(equals) => (
                    trim(&self.s[start..start + equals]),
                    Some(trim(&self.s[start + equals + 1..end])),
                ),
                None => (trim(&self.s[start..end]), None),
            });
        }
        let mut equals_at = None;
        while index < bytes.len() {
            match bytes[index] {
                b'"' => match quoted_end(&bytes[index..]) {
                    Some(n) => {
                        index += n;
                        continue;
                    }
                    None => {
                        index = bytes.len();
                        break;
                    }
                },
                b'=' if equals_at.is_none() => equals_at = Some(index),
                b';' => break,
                _ => {}
            }
            index += 1;
        }
        self.pos = index;
        let item = &self.s[start..index];
        Some(match equals_at {
            Some(equals) => (
                trim(&self.s[start..equals]),
                Some(trim(&self.s[equals + 1..index])),
            ),
            None => (trim(item), None),
        })
    }
}

/// Look up a parameter by case-insensitive name. `Some(None)` for a flag.
pub(crate) fn find_param<'a>(params: &'a str, name: &str) -> Option<Option<&'a str>> {
    Params::new(params)
        .find(|(n, _)| n.eq_ignore_ascii_case(name))
        .map(|(_, v)| v)
}

/// Validate a parameter list: every parameter has a token name, and a value
/// (if any) that is a token, host-ish word or quoted string.
pub(crate) fn params_valid(params: &str) -> bool {
    scan_params(params, |_, _| true)
}

/// Read a parameter list (`;name[=value]`, LWS around `;` and `=`) in one
/// pass: every parameter goes to `each` as [`Params`] yields it (name and
/// value trimmed, a quoted value with its quotes), and the list is valid
/// as [`params_valid`] says: a token name, and a value (if any) that is
/// one quoted string or a non-empty run of token characters, `:`, `[` and
/// `]`. `false` when it is not (the parameters before the fault may have
/// gone to `each`) or when `each` returns `false`. An empty (or LWS only)
/// list is valid.
pub(crate) fn scan_params<'a>(
    params: &'a str,
    mut each: impl FnMut(&'a str, Option<&'a str>) -> bool,
) -> bool {
    let bytes = params.as_bytes();
    let skip_lws = |mut at: usize| {
        while at < bytes.len() && is_lws(bytes[at]) {
            at += 1;
        }
        at
    };
    let mut at = skip_lws(0);
    while at < bytes.len() {
        if bytes[at] != b';' {
            return false;
        }
        at = skip_lws(at + 1);
        let name_start = at;
        while at < bytes.len() && is_token(bytes[at]) {
            at += 1;
        }
        if at == name_start {
            return false;
        }
        // Token characters are ASCII: these are char boundaries.
        let name = &params[name_start..at];
        at = skip_lws(at);
        let mut value = None;
        if bytes.get(at) == Some(&b'=') {
            at = skip_lws(at + 1);
            let value_start = at;
            if bytes.get(at) == Some(&b'"') {
                match quoted_end(&bytes[at..]) {
                    Some(len) => at += len,
                    None => return false,
                }
            } else {
                while at < bytes.len()
                    && (is_token(bytes[at]) || matches!(bytes[at], b':' | b'[' | b']'))
                {
                    at += 1;
                }
                if at == value_start {
                    return false;
                }
            }
            value = Some(&params[value_start..at]);
            at = skip_lws(at);
        }
        if !each(name, value) {
            return false;
        }
    }
    true
}

/// `value` in decimal, without the formatting machinery (hot paths:
/// the quick refusal, overload-control parameters).
pub(crate) fn write_decimal(out: &mut Vec<u8>, value: u64) {
    let mut digits = [0u8; 20];
    let mut at = digits.len();
    let mut rest = value;
    loop {
        at -= 1;
        digits[at] = b'0' + (rest % 10) as u8;
        rest /= 10;
        if rest == 0 {
            break;
        }
    }
    out.extend_from_slice(&digits[at..]);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn comma_split_respects_quotes_and_angles() {
        let v: Vec<_> = CommaSplit::new(r#""a,b" <sip:x,y@h>;p=1 , <sip:z>"#).collect();
        assert_eq!(v, vec![r#""a,b" <sip:x,y@h>;p=1"#, "<sip:z>"]);
    }

    #[test]
    fn params_and_lookup() {
        assert_eq!(find_param(";lr;tag = ab ", "TAG"), Some(Some("ab")));
        assert_eq!(find_param(";lr;tag=ab", "lr"), Some(None));
        assert_eq!(find_param(";lr", "x"), None);
        assert!(params_valid(" ; a = b ;c"));
        assert!(!params_valid(";;"));
        assert!(!params_valid(";a;"));
        assert!(params_valid(r#";x="q;s""#));
    }

    /// The two-pass reading `scan_params` replaced (issue 23): the list
    /// validated item by item, then read again by [`Params`].
    fn two_pass(params: &str) -> Option<Vec<(&str, Option<&str>)>> {
        let trimmed = trim(params);
        if trimmed.is_empty() {
            return Some(Params::new(params).collect());
        }
        if !trimmed.starts_with(';') {
            return None;
        }
        let mut rest = trimmed;
        while !rest.is_empty() {
            let body = &rest[1..];
            let body_bytes = body.as_bytes();
            let mut index = 0;
            while index < body_bytes.len() {
                match body_bytes[index] {
                    b'"' => index += quoted_end(&body_bytes[index..])?,
                    b';' => break,
                    _ => index += 1,
                }
            }
            let item = &body[..index];
            let (name, value) = match find_byte(item, b'=') {
                Some(equals) => (trim(&item[..equals]), Some(trim(&item[equals + 1..]))),
                None => (trim(item), None),
            };
            if !is_token_str(name) {
                return None;
            }
            if let Some(text) = value {
                let valid = if text.starts_with('"') {
                    quoted_end(text.as_bytes()) == Some(text.len())
                } else {
                    !text.is_empty()
                        && text
                            .bytes()
                            .all(|c| is_token(c) || matches!(c, b':' | b'[' | b']'))
                };
                if !valid {
                    return None;
                }
            }
            rest = &body[index..];
        }
        Some(Params::new(params).collect())
    }

    fn one_pass(params: &str) -> Option<Vec<(&str, Option<&str>)>> {
        let mut seen = Vec::new();
        scan_params(params, |name, value| {
            seen.push((name, value));
            true
        })
        .then_some(seen)
    }

    /// `scan_params` accepts exactly the lists the two-pass reading
    /// accepted and hands over the same parameters. Seen failing with LWS
    /// before `=` refused, and with a quoted value followed by a token
    /// (`a="x"y`) accepted.
    #[test]
    fn one_pass_parameters_read_as_the_two_passes_did() {
        for params in [
            "",
            "  ",
            ";lr",
            " ; a = b ;c",
            ";branch=z9hG4bK1;rport;received=192.0.2.1",
            ";received=[2001:db8::1];rport=5060",
            r#";x="q;s";y"#,
            r#";x = "a\"b" ; y=1"#,
            r#";x="a"y"#,
            r#";x="a" "b""#,
            r#";x="unterminated"#,
            r#";x="esc\"#,
            ";;",
            ";a;",
            ";a=",
            ";=b",
            ";a b=c",
            ";a=b c",
            ";a=b=c",
            "a=b",
            ";a\r\n =b",
            ";a=\r\n\tb",
            ";tag=1,2",
            ";a=<b>",
            r#";a"=b"#,
            ";é=1",
            r#";a="é;""#,
        ] {
            assert_eq!(one_pass(params), two_pass(params), "{params:?}");
            assert_eq!(
                params_valid(params),
                two_pass(params).is_some(),
                "{params:?}"
            );
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig { cases: 4000, ..Default::default() })]
        #[test]
        fn one_pass_parameters_agree_on_any_text(
            params in proptest::collection::vec(
                proptest::sample::select(vec![
                    ";", "=", "\"", "\\", " ", "\t", "\r\n", "a", "b1", ":", "[", "]",
                    ",", "<", "é", "-", "~", "?",
                ]),
                0..16,
            )
        ) {
            let params: String = params.concat();
            proptest::prop_assert_eq!(one_pass(&params), two_pass(&params), "{:?}", params);
        }
    }

    #[test]
    fn ports_read_as_u16_parse_reads_digits() {
        for text in [
            "0", "5060", "05060", "65535", "65536", "99999", "1", "00000",
        ] {
            assert_eq!(parse_port(text), text.parse::<u16>().ok(), "{text}");
        }
        for text in ["", "123456", "+5", "5a", " 5"] {
            assert_eq!(parse_port(text), None, "{text}");
        }
    }

    #[test]
    fn decimal_limits() {
        assert_eq!(parse_dec("0068", 255), Some(68));
        assert_eq!(parse_dec("300", 255), None);
        assert_eq!(parse_dec("-1", 255), None);
        assert_eq!(parse_dec("36893488147419103232", u32::MAX as u64), None);
        assert_eq!(parse_dec("", 10), None);
    }
}
