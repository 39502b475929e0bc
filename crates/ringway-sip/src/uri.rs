//! Zero-copy SIP URI and name-addr views.

use crate::text::{find_byte, find_param, is_lws, is_token, params_valid, quoted_end, trim};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// The scheme of a URI (text before the first `:`), if syntactically valid
/// (`ALPHA *( ALPHA / DIGIT / "+" / "-" / "." )`).
pub fn scheme(uri: &str) -> Option<&str> {
    let colon = find_byte(uri, b':')?;
    let name = &uri[..colon];
    let bytes = name.as_bytes();
    if bytes.is_empty()
        || !bytes[0].is_ascii_alphabetic()
        || !bytes
            .iter()
            .all(|&x| x.is_ascii_alphanumeric() || matches!(x, b'+' | b'-' | b'.'))
    {
        return None;
    }
    Some(name)
}

/// A parsed `sip:`/`sips:` URI; every field borrows the input.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SipUri<'a> {
    /// `true` for `sips:`.
    pub secure: bool,
    /// User part (possibly with `;` user params and escapes), without password.
    pub user: Option<&'a str>,
    /// Host as written (IPv6 references keep their brackets).
    pub host: &'a str,
    /// Explicit port.
    pub port: Option<u16>,
    /// URI parameters including the leading `;` (empty if none).
    pub params: &'a str,
    /// Headers after `?` (without the `?`).
    pub headers: Option<&'a str>,
}

impl<'a> SipUri<'a> {
    /// Parse a `sip:` or `sips:` URI. `None` if it is not one or is malformed.
    pub fn parse(uri: &'a str) -> Option<SipUri<'a>> {
        let (secure, rest) = if uri.len() >= 4 && uri.as_bytes()[..4].eq_ignore_ascii_case(b"sip:")
        {
            (false, &uri[4..])
        } else if uri.len() >= 5 && uri.as_bytes()[..5].eq_ignore_ascii_case(b"sips:") {
            (true, &uri[5..])
        } else {
            return None;
        };
        if rest.bytes().any(|b| is_lws(b) || b == b'<' || b == b'>') {
            return None;
        }
        let (user, hostpart) = match find_byte(rest, b'@') {
            Some(at) => {
                let userinfo = &rest[..at];
                let user = match find_byte(userinfo, b':') {
                    Some(c) => &userinfo[..c],
                    None => userinfo,
                };
                if user.is_empty() {
                    return None;
                }
                (Some(user), &rest[at + 1..])
            }
            None => (None, rest),
        };
        let (host, after) = split_host(hostpart)?;
        let mut port = None;
        let mut after = after;
        if let Some(port_and_rest) = after.strip_prefix(':') {
            let end = port_and_rest
                .bytes()
                .position(|b| b == b';' || b == b'?')
                .unwrap_or(port_and_rest.len());
            let port_text = &port_and_rest[..end];
            if port_text.is_empty()
                || port_text.len() > 5
                || !port_text.bytes().all(|b| b.is_ascii_digit())
            {
                return None;
            }
            port = Some(crate::text::parse_port(port_text)?);
            after = &port_and_rest[end..];
        }
        let (params, headers) = match find_byte(after, b'?') {
            Some(q) => (&after[..q], Some(&after[q + 1..])),
            None => (after, None),
        };
        if !params.is_empty() && !params.starts_with(';') {
            return None;
        }
        let empty_param = params.as_bytes().windows(2).any(|pair| pair == b";;");
        if empty_param || params.ends_with(';') && !params.is_empty() {
            // Empty uri-parameter; tolerated only as a trailing ';' in the wild?
            // RFC 3261 forbids both, so reject.
            return None;
        }
        Some(SipUri {
            secure,
            user,
            host,
            port,
            params,
            headers,
        })
    }

    /// Look up a URI parameter (`Some(None)` for a flag such as `lr`).
    pub fn param(&self, name: &str) -> Option<Option<&'a str>> {
        find_param(self.params, name)
    }

    /// The host as an IP address if it is an IPv4 or (bracketed) IPv6 literal.
    pub fn host_ip(&self) -> Option<IpAddr> {
        host_ip(self.host)
    }
}

/// Split `host[...]` from the front of `s`; validates the host characters.
pub(crate) fn split_host(s: &str) -> Option<(&str, &str)> {
    let bytes = s.as_bytes();
    if bytes.first() == Some(&b'[') {
        let close = s.find(']')?;
        let inner = &s[1..close];
        if inner.is_empty()
            || !inner
                .bytes()
                .all(|c| c.is_ascii_hexdigit() || c == b':' || c == b'.')
            || !inner.contains(':')
        {
            return None;
        }
        return Some((&s[..close + 1], &s[close + 1..]));
    }
    // One pass: the host runs to the first byte that is not a host
    // character, which must end it (`:`, `;`, `?`, LWS, or the end).
    let end = s
        .bytes()
        .position(|c| !HOST_CHAR[usize::from(c)])
        .unwrap_or(s.len());
    let ends_host = match bytes.get(end) {
        None => true,
        Some(&c) => matches!(c, b':' | b';' | b'?') || is_lws(c),
    };
    if end == 0 || !ends_host {
        return None;
    }
    Some((&s[..end], &s[end..]))
}

/// Characters of a host name or IPv4 literal (alphanumerics, `-`, `.`, `_`).
static HOST_CHAR: [bool; 256] = {
    let mut table = [false; 256];
    let mut b = 0;
    while b < 256 {
        let c = b as u8;
        table[b] = c.is_ascii_alphanumeric() || c == b'-' || c == b'.' || c == b'_';
        b += 1;
    }
    table
};

/// Interpret a host (as written in a URI or Via) as an IP literal.
pub fn host_ip(host: &str) -> Option<IpAddr> {
    if let Some(inner) = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
        return inner.parse::<Ipv6Addr>().ok().map(IpAddr::V6);
    }
    if host.bytes().all(|c| c.is_ascii_digit() || c == b'.') {
        return host.parse::<Ipv4Addr>().ok().map(IpAddr::V4);
    }
    // RFC 5118 4.5: received= may carry a bare IPv6 address.
    if host.contains(':') {
        return host.parse::<Ipv6Addr>().ok().map(IpAddr::V6);
    }
    None
}

/// A `name-addr` / `addr-spec` with header parameters, as in From, To,
/// Contact, Route and Record-Route values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NameAddr<'a> {
    /// Display name (quoted string with its quotes, or tokens), if any.
    pub display: Option<&'a str>,
    /// The URI (between `<>` or the bare addr-spec).
    pub uri: &'a str,
    /// Header parameters after the URI, including the leading `;`.
    pub params: &'a str,
    /// Whether the URI was enclosed in `<>`.
    pub bracketed: bool,
}

impl<'a> NameAddr<'a> {
    /// Parse one (already comma-split, trimmed) value.
    pub fn parse(value: &'a str) -> Option<NameAddr<'a>> {
        Self::parse_with_uri(value).map(|(name_addr, _)| name_addr)
    }

    /// [`NameAddr::parse`], with the URI as a SIP URI when it is one
    /// (what [`NameAddr::sip_uri`] returns, without parsing it again).
    pub(crate) fn parse_with_uri(value: &'a str) -> Option<(NameAddr<'a>, Option<SipUri<'a>>)> {
        let value = trim(value);
        let bytes = value.as_bytes();
        if bytes.is_empty() {
            return None;
        }
        let mut display = None;
        let mut index = 0;
        if bytes[0] == b'"' {
            let quote_end = quoted_end(bytes)?;
            display = Some(&value[..quote_end]);
            index = quote_end;
            while index < bytes.len() && is_lws(bytes[index]) {
                index += 1;
            }
            if bytes.get(index) != Some(&b'<') {
                return None;
            }
        } else if let Some(angle_open) = find_byte(value, b'<') {
            // Everything before '<' must be tokens separated by LWS. If a
            // ':' shows up first this is an addr-spec whose params contain
            // '<', which is invalid anyway.
            let before_angle = &value[..angle_open];
            if !before_angle.bytes().all(|c| is_token(c) || is_lws(c)) {
                return None;
            }
            let display_name = trim(before_angle);
            if !display_name.is_empty() {
                display = Some(display_name);
            }
            index = angle_open;
        }
        if bytes.get(index) == Some(&b'<') {
            let rest = &value[index + 1..];
            let angle_close = find_byte(rest, b'>')?;
            let uri = trim(&rest[..angle_close]);
            let sip_uri = SipUri::parse(uri);
            // A SIP URI has a scheme and no LWS (`SipUri::parse` checked);
            // any other needs a scheme, no LWS, and not to be `sip:`.
            if sip_uri.is_none()
                && (scheme(uri).is_none() || uri.bytes().any(is_lws) || is_sip_scheme(uri))
            {
                return None;
            }
            let params = &rest[angle_close + 1..];
            if !params_valid(params) {
                return None;
            }
            let name_addr = NameAddr {
                display,
                uri,
                params: trim(params),
                bracketed: true,
            };
            return Some((name_addr, sip_uri));
        }
        // addr-spec: the URI runs to the first ';' (the rest are header params).
        let end = find_byte(value, b';').unwrap_or(value.len());
        let uri = trim(&value[..end]);
        scheme(uri)?;
        if uri
            .bytes()
            .any(|c| is_lws(c) || matches!(c, b',' | b'?' | b'<' | b'>' | b'"'))
        {
            return None;
        }
        let sip_uri = match is_sip_scheme(uri) {
            true => Some(SipUri::parse(uri)?),
            false => None,
        };
        let params = &value[end..];
        if !params_valid(params) {
            return None;
        }
        let name_addr = NameAddr {
            display: None,
            uri,
            params: trim(params),
            bracketed: false,
        };
        Some((name_addr, sip_uri))
    }

    /// Look up a header parameter (e.g. `tag`, `expires`, `q`).
    pub fn param(&self, name: &str) -> Option<Option<&'a str>> {
        find_param(self.params, name)
    }

    /// The `tag` parameter.
    pub fn tag(&self) -> Option<&'a str> {
        self.param("tag").flatten()
    }

    /// The URI as a SIP URI, if it is one.
    pub fn sip_uri(&self) -> Option<SipUri<'a>> {
        SipUri::parse(self.uri)
    }
}

fn is_sip_scheme(uri: &str) -> bool {
    matches!(scheme(uri), Some(s) if s.eq_ignore_ascii_case("sip") || s.eq_ignore_ascii_case("sips"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sip_uri_parts() {
        let u = SipUri::parse("sip:alice:pw@[2001:db8::1]:5070;lr;transport=udp?X=1").unwrap();
        assert_eq!(u.user, Some("alice"));
        assert_eq!(u.host, "[2001:db8::1]");
        assert_eq!(u.port, Some(5070));
        assert_eq!(u.param("lr"), Some(None));
        assert_eq!(u.headers, Some("X=1"));
        assert_eq!(u.host_ip(), Some("2001:db8::1".parse().unwrap()));
        assert!(SipUri::parse("sip:2001:db8::10").is_none());
        let p = SipUri::parse("sip:[2001:db8::10:5070]").unwrap();
        assert_eq!(p.port, None);
        assert!(SipUri::parse("sip:user@example.com; lr").is_none());
        assert!(SipUri::parse("sips:host").unwrap().secure);
    }

    #[test]
    fn name_addr_forms() {
        let n = NameAddr::parse(r#""J \"R\"" <sip:j@example.com>;tag=12"#).unwrap();
        assert_eq!(n.uri, "sip:j@example.com");
        assert_eq!(n.tag(), Some("12"));
        let n = NameAddr::parse("sip:c@example.net;tag=9").unwrap();
        assert_eq!(n.uri, "sip:c@example.net");
        assert!(!n.bracketed);
        let n = NameAddr::parse("caller<sip:caller@example.com>;tag=323").unwrap();
        assert_eq!(n.display, Some("caller"));
        assert!(NameAddr::parse(r#""Mr. J. User <sip:j.user@example.com>"#).is_none());
        assert!(NameAddr::parse("Bell, Alexander <sip:a@b>").is_none());
        assert!(NameAddr::parse("sip:user@example.com?Route=%3Csip:x%3E").is_none());
        assert!(NameAddr::parse(r#""Joe" <sip:joe@example.org>;;;;"#).is_none());
        assert!(NameAddr::parse("<name:John_Smith>").is_some());
    }
}
