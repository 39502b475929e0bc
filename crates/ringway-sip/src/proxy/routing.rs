//! Validation (RFC 3261 16.3), route preprocessing (16.4, 16.6) and target choice.

#![allow(unused_imports)]
use super::*;

/// Whether we may send to `a`.
pub fn sendable(a: &SocketAddr) -> bool {
    a.port() != 0
        && match a.ip() {
            IpAddr::V4(v) => !v.is_unspecified() && !v.is_broadcast() && !v.is_multicast(),
            IpAddr::V6(v) => {
                !v.is_unspecified()
                    && !v.is_multicast()
                    && v.to_ipv4_mapped()
                        .is_none_or(|m| !m.is_broadcast() && !m.is_multicast())
            }
        }
}

/// Where to send a request.
pub(super) enum Target<'a> {
    Send {
        to: SocketAddr,
        ruri: Option<std::borrow::Cow<'a, str>>,
    },
    Respond(u16, &'static str),
    Register,
    OptionsToUs,
}

impl Proxy {
    pub(super) fn host_is_ours(&self, host: &str, port: Option<u16>) -> bool {
        let port_ok = port.is_none_or(|p| p == self.cfg.local.port());
        if let Some(ip) = host_ip(host) {
            return ip == self.cfg.local.ip() && port_ok;
        }
        port_ok
            && self
                .cfg
                .domains
                .iter()
                .any(|d| d.eq_ignore_ascii_case(host))
    }

    pub(super) fn is_our_via(&self, v: &Via<'_>) -> bool {
        host_ip(v.host) == Some(self.cfg.local.ip())
            && v.port.unwrap_or(5060) == self.cfg.local.port()
    }

    pub(super) fn uri_is_us(&self, uri: &str) -> bool {
        SipUri::parse(uri).is_some_and(|u| self.host_is_ours(u.host, u.port))
    }

    pub(super) fn upstream_addr(src: SocketAddr, top: Option<&Via<'_>>) -> SocketAddr {
        match top {
            Some(v) if !v.rport_flag => SocketAddr::new(src.ip(), v.port.unwrap_or(5060)),
            _ => src,
        }
    }

    /// RFC 3261 16.3 validation; `Some((code, reason))` to reject.
    pub(super) fn validate(
        &self,
        msg: &SipMsg<'_>,
        keys: (u64, u32),
    ) -> Option<(u16, &'static str)> {
        let ruri = msg.request_uri().unwrap_or("");
        match scheme(ruri) {
            Some(s) if s.eq_ignore_ascii_case("sip") || s.eq_ignore_ascii_case("sips") => {}
            _ => return Some((416, "Unsupported URI Scheme")),
        }
        if msg.max_forwards() == Some(0) {
            return Some((483, "Too Many Hops"));
        }
        // Only requests that already passed a ringway proxy can loop here.
        static FINDER: std::sync::OnceLock<memchr::memmem::Finder<'static>> =
            std::sync::OnceLock::new();
        let finder = FINDER.get_or_init(|| memchr::memmem::Finder::new(BRANCH_PREFIX.as_bytes()));
        let seen_us = finder.find(msg.head().as_bytes()).is_some();
        for v in msg.vias().filter(|_| seen_us) {
            if self.is_our_via(&v) {
                if let Some((_, l)) = v.branch.and_then(parse_branch) {
                    if l == keys.1 {
                        return Some((482, "Loop Detected"));
                    }
                }
            }
        }
        if msg.proxy_require().next().is_some() {
            return Some((420, "Bad Extension"));
        }
        None
    }

    pub(super) fn route_by_uri<'m>(
        &self,
        now: u64,
        u: Option<SipUri<'_>>,
        method: Method<'_>,
    ) -> Target<'m> {
        let Some(u) = u else {
            return Target::Respond(416, "Unsupported URI Scheme");
        };
        if self.host_is_ours(u.host, u.port) {
            if method == Method::Register && self.cfg.registrar {
                return Target::Register;
            }
            if u.user.is_none() && method == Method::Options {
                return Target::OptionsToUs;
            }
            if self.cfg.registrar {
                if let Some(user) = u.user {
                    if let Some(b) = self.store.lookup(user, now).into_iter().next() {
                        let to = SipUri::parse(&b.contact).and_then(|c| {
                            c.host_ip()
                                .map(|ip| SocketAddr::new(ip, c.port.unwrap_or(5060)))
                        });
                        return match to.or(self.cfg.route_to) {
                            Some(to) => Target::Send {
                                to,
                                ruri: Some(std::borrow::Cow::Owned(b.contact)),
                            },
                            None => Target::Respond(480, "Temporarily Unavailable"),
                        };
                    }
                }
            }
            return match self.cfg.route_to {
                Some(to) => Target::Send { to, ruri: None },
                None => Target::Respond(404, "Not Found"),
            };
        }
        if let Some(ip) = u.host_ip() {
            return Target::Send {
                to: SocketAddr::new(ip, u.port.unwrap_or(5060)),
                ruri: None,
            };
        }
        match self.cfg.route_to {
            Some(to) => Target::Send { to, ruri: None },
            None => Target::Respond(404, "Not Found"),
        }
    }
}

pub(super) fn top_host_differs(msg: &SipMsg<'_>, src: SocketAddr) -> bool {
    msg.top_via()
        .is_some_and(|v| host_ip(v.host) != Some(src.ip()))
}

pub(super) fn fmt_ip(buf: &mut [u8; 48], ip: IpAddr) -> Option<&str> {
    let mut c = std::io::Cursor::new(&mut buf[..]);
    write!(c, "{ip}").ok()?;
    let n = c.position() as usize;
    std::str::from_utf8(&buf[..n]).ok()
}
