//! Zero-copy SIP URI and name-addr views.

use crate::text::{find_param, is_lws, is_token, params_valid, quoted_end, trim};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// The scheme of a URI (text before the first `:`), if syntactically valid
/// (`ALPHA *( ALPHA / DIGIT / "+" / "-" / "." )`).
pub fn scheme(uri: &str) -> Option<&str> {
    let c = uri.find(':')?;
    let s = &uri[..c];
    let b = s.as_bytes();
    if b.is_empty()
        || !b[0].is_ascii_alphabetic()
        || !b
            .iter()
            .all(|&x| x.is_ascii_alphanumeric() || matches!(x, b'+' | b'-' | b'.'))
    {
        return None;
    }
    Some(s)
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
        let (user, hostpart) = match rest.find('@') {
            Some(at) => {
                let ui = &rest[..at];
                let user = match ui.find(':') {
                    Some(c) => &ui[..c],
                    None => ui,
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
        if let Some(p) = after.strip_prefix(':') {
            let end = p.find([';', '?']).unwrap_or(p.len());
            let ps = &p[..end];
            if ps.is_empty() || ps.len() > 5 || !ps.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            port = Some(ps.parse::<u16>().ok()?);
            after = &p[end..];
        }
        let (params, headers) = match after.find('?') {
            Some(q) => (&after[..q], Some(&after[q + 1..])),
            None => (after, None),
        };
        if !params.is_empty() && !params.starts_with(';') {
            return None;
        }
        if params.contains(";;") || params.ends_with(';') && !params.is_empty() {
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
    let b = s.as_bytes();
    if b.first() == Some(&b'[') {
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
    let end = s
        .bytes()
        .position(|c| matches!(c, b':' | b';' | b'?') || is_lws(c))
        .unwrap_or(s.len());
    let host = &s[..end];
    if host.is_empty()
        || !host
            .bytes()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'.' | b'_'))
    {
        return None;
    }
    Some((host, &s[end..]))
}

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
    pub fn parse(v: &'a str) -> Option<NameAddr<'a>> {
        let v = trim(v);
        let b = v.as_bytes();
        if b.is_empty() {
            return None;
        }
        let mut display = None;
        let mut i = 0;
        if b[0] == b'"' {
            let e = quoted_end(b)?;
            display = Some(&v[..e]);
            i = e;
            while i < b.len() && is_lws(b[i]) {
                i += 1;
            }
            if b.get(i) != Some(&b'<') {
                return None;
            }
        } else if let Some(lt) = v.find('<') {
            // Everything before '<' must be tokens separated by LWS. If a
            // ':' shows up first this is an addr-spec whose params contain
            // '<', which is invalid anyway.
            let d = &v[..lt];
            if !d.bytes().all(|c| is_token(c) || is_lws(c)) {
                return None;
            }
            let dt = trim(d);
            if !dt.is_empty() {
                display = Some(dt);
            }
            i = lt;
        }
        if b.get(i) == Some(&b'<') {
            let rest = &v[i + 1..];
            let gt = rest.find('>')?;
            let uri = trim(&rest[..gt]);
            scheme(uri)?;
            if uri.bytes().any(is_lws) {
                return None;
            }
            if let Some(s) = SipUri::parse(uri) {
                let _ = s;
            } else if is_sip_scheme(uri) {
                return None;
            }
            let params = &rest[gt + 1..];
            if !params_valid(params) {
                return None;
            }
            return Some(NameAddr {
                display,
                uri,
                params: trim(params),
                bracketed: true,
            });
        }
        // addr-spec: the URI runs to the first ';' (the rest are header params).
        let end = v.find(';').unwrap_or(v.len());
        let uri = trim(&v[..end]);
        scheme(uri)?;
        if uri
            .bytes()
            .any(|c| is_lws(c) || matches!(c, b',' | b'?' | b'<' | b'>' | b'"'))
        {
            return None;
        }
        if is_sip_scheme(uri) && SipUri::parse(uri).is_none() {
            return None;
        }
        let params = &v[end..];
        if !params_valid(params) {
            return None;
        }
        Some(NameAddr {
            display: None,
            uri,
            params: trim(params),
            bracketed: false,
        })
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
