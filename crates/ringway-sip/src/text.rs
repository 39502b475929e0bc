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

/// Trim LWS (including folding CRLFs) on both sides.
#[inline]
pub(crate) fn trim(s: &str) -> &str {
    let b = s.as_bytes();
    let mut a = 0;
    let mut e = b.len();
    while a < e && is_lws(b[a]) {
        a += 1;
    }
    while e > a && is_lws(b[e - 1]) {
        e -= 1;
    }
    // LWS bytes are ASCII, so a and e are char boundaries.
    s.get(a..e).unwrap_or("")
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
        let t = s.trim_start_matches('0');
        if t.len() > 20 {
            return None;
        }
        return parse_dec(if t.is_empty() { "0" } else { t }, max);
    }
    let mut v: u64 = 0;
    for b in s.bytes() {
        if !b.is_ascii_digit() {
            return None;
        }
        v = v.checked_mul(10)?.checked_add(u64::from(b - b'0'))?;
    }
    (v <= max).then_some(v)
}

/// Scan a quoted string starting at `s[0] == '"'`; returns the index just
/// after the closing quote, honouring backslash escapes.
pub(crate) fn quoted_end(s: &[u8]) -> Option<usize> {
    debug_assert!(s.first() == Some(&b'"'));
    let mut i = 1;
    while i < s.len() {
        match s[i] {
            b'\\' => i += 2,
            b'"' => return Some(i + 1),
            _ => i += 1,
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
        let b = self.s.as_bytes();
        let start = self.pos;
        if memchr::memchr(b',', &b[start..]).is_none() {
            // Fast path: no comma left, the rest is one item.
            self.done = true;
            return Some(trim(&self.s[start..]));
        }
        let mut i = start;
        let mut angle = false;
        while i < b.len() {
            match b[i] {
                b'"' => match quoted_end(&b[i..]) {
                    Some(n) => {
                        i += n;
                        continue;
                    }
                    None => break,
                },
                b'<' => angle = true,
                b'>' => angle = false,
                b',' if !angle => {
                    self.pos = i + 1;
                    return Some(trim(&self.s[start..i]));
                }
                _ => {}
            }
            i += 1;
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
        let b = self.s.as_bytes();
        // skip leading LWS and one ';'
        let mut i = self.pos;
        while i < b.len() && is_lws(b[i]) {
            i += 1;
        }
        if i < b.len() && b[i] == b';' {
            i += 1;
        }
        if i >= b.len() {
            self.pos = b.len();
            return None;
        }
        let start = i;
        if memchr::memchr(b'"', &b[start..]).is_none() {
            // Fast path: no quoted strings, so `;` and `=` are delimiters.
            let end = memchr::memchr(b';', &b[start..]).map_or(b.len(), |p| start + p);
            self.pos = end;
            return Some(match memchr::memchr(b'=', &b[start..end]) {
                Some(e) => (
                    trim(&self.s[start..start + e]),
                    Some(trim(&self.s[start + e + 1..end])),
                ),
                None => (trim(&self.s[start..end]), None),
            });
        }
        let mut eq = None;
        while i < b.len() {
            match b[i] {
                b'"' => match quoted_end(&b[i..]) {
                    Some(n) => {
                        i += n;
                        continue;
                    }
                    None => {
                        i = b.len();
                        break;
                    }
                },
                b'=' if eq.is_none() => eq = Some(i),
                b';' => break,
                _ => {}
            }
            i += 1;
        }
        self.pos = i;
        let item = &self.s[start..i];
        Some(match eq {
            Some(e) => (trim(&self.s[start..e]), Some(trim(&self.s[e + 1..i]))),
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
    let b = params.as_bytes();
    // Reject empty parameters like ";;" or a trailing ";".
    let t = trim(params);
    if t.is_empty() {
        return true;
    }
    if !t.starts_with(';') {
        return false;
    }
    let _ = b;
    let mut rest = t;
    while !rest.is_empty() {
        // rest starts with ';'
        let body = &rest[1..];
        let bb = body.as_bytes();
        let mut i = 0;
        while i < bb.len() {
            match bb[i] {
                b'"' => match quoted_end(&bb[i..]) {
                    Some(n) => {
                        i += n;
                        continue;
                    }
                    None => return false,
                },
                b';' => break,
                _ => i += 1,
            }
        }
        let item = &body[..i];
        let (name, value) = match item.find('=') {
            Some(e) => (trim(&item[..e]), Some(trim(&item[e + 1..]))),
            None => (trim(item), None),
        };
        if !is_token_str(name) {
            return false;
        }
        if let Some(v) = value {
            let ok = if v.starts_with('"') {
                quoted_end(v.as_bytes()) == Some(v.len())
            } else {
                !v.is_empty()
                    && v.bytes()
                        .all(|c| is_token(c) || matches!(c, b':' | b'[' | b']'))
            };
            if !ok {
                return false;
            }
        }
        rest = &body[i..];
    }
    true
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

    #[test]
    fn decimal_limits() {
        assert_eq!(parse_dec("0068", 255), Some(68));
        assert_eq!(parse_dec("300", 255), None);
        assert_eq!(parse_dec("-1", 255), None);
        assert_eq!(parse_dec("36893488147419103232", u32::MAX as u64), None);
        assert_eq!(parse_dec("", 10), None);
    }
}
