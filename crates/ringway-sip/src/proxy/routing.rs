//! Where a request goes: validation (RFC 3261 16.3), route information
//! preprocessing (16.4), the strict-router rewrite (16.6 step 6) and the
//! choice of next hop ([`Target`]). Also which addresses are ours and which
//! we may send to.

use super::branch::{Branch, RequestKeys, BRANCH_PREFIX};
use super::worker::Request;
use super::Proxy;
use crate::msg::{Method, SipMsg, Via};
use crate::registrar::Binding;
use crate::uri::{host_ip, scheme, NameAddr, SipUri};
use std::borrow::Cow;
use std::net::{IpAddr, SocketAddr};

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

/// Where responses to a request from `src` go: the source address, with
/// the sent-by port unless the top Via asked for `rport`.
pub(super) fn upstream_address(src: SocketAddr, top: Option<&Via<'_>>) -> SocketAddr {
    match top {
        Some(via) if !via.rport_flag => SocketAddr::new(src.ip(), via.port.unwrap_or(5060)),
        _ => src,
    }
}

/// Why a request fails validation (RFC 3261 16.3).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Rejection {
    /// Step 2: the Request-URI is not `sip:`/`sips:`.
    UnsupportedScheme,
    /// Step 3: Max-Forwards is 0.
    TooManyHops,
    /// Step 4: our Via with this request's loop hash is already there.
    LoopDetected,
    /// Step 5: a Proxy-Require we do not support.
    BadExtension,
    /// A Route value that could not be a Request-URI (a strict router's
    /// next hop becomes one): control characters, headers, no scheme.
    MalformedRoute,
}

impl Rejection {
    /// Status code and reason phrase of the rejection.
    pub(super) fn status(self) -> (u16, &'static str) {
        match self {
            Rejection::UnsupportedScheme => (416, "Unsupported URI Scheme"),
            Rejection::TooManyHops => (483, "Too Many Hops"),
            Rejection::LoopDetected => (482, "Loop Detected"),
            Rejection::BadExtension => (420, "Bad Extension"),
            Rejection::MalformedRoute => (400, "Bad Request - Malformed Route"),
        }
    }
}

/// Where a request goes.
pub(super) enum Target<'a> {
    /// Forward to `to`; `request_uri` replaces the Request-URI (a
    /// registrar binding), `route_set` goes on top of the Route headers
    /// (the binding's Path, RFC 3327).
    Send {
        to: SocketAddr,
        request_uri: Option<Cow<'a, str>>,
        route_set: Option<String>,
    },
    /// Answer locally with this final response.
    Respond(u16, &'static str),
    /// A REGISTER for our registrar.
    Register,
    /// An OPTIONS for us (no user part): answered with our capabilities.
    OptionsToUs,
    /// A request to a user of our domain: the location store decides
    /// (after authentication, so unauthenticated requests cost the store
    /// nothing).
    Lookup {
        /// The AOR (the user part alone, as the registrar keys it).
        aor: &'a str,
    },
}

/// The outcome of route information preprocessing (RFC 3261 16.4) and of
/// the strict-router check on the next hop (16.6 step 6).
pub(super) struct RoutePlan<'m> {
    /// The Request-URI is ours with `lr`: the previous hop was a strict
    /// router, so the last Route holds the real Request-URI and is popped.
    pub(super) from_strict_router: bool,
    /// The top Route is us and is popped.
    pub(super) pop_route: bool,
    /// The Request-URI after 16.4.
    pub(super) request_uri: &'m str,
    /// The Route that is the next hop, if one remains.
    pub(super) next_route: Option<NameAddr<'m>>,
    /// The next hop's URI when it is a strict router (no `lr`): it becomes
    /// the Request-URI and the old one goes to the end of the Route set.
    pub(super) strict_next_hop: Option<&'m str>,
    /// The received Request-URI, parsed.
    received_uri: Option<SipUri<'m>>,
}

impl<'m> RoutePlan<'m> {
    /// The Request-URI to write when forwarding, if it changes: the strict
    /// next hop, or the real one restored from the last Route.
    pub(super) fn request_uri_edit(&self) -> Option<&'m str> {
        self.strict_next_hop
            .or(self.from_strict_router.then_some(self.request_uri))
    }
}

impl Proxy {
    /// Whether `host[:port]` is us (our IP and port, or one of our domains).
    pub(super) fn host_is_ours(&self, host: &str, port: Option<u16>) -> bool {
        let port_ok = port.is_none_or(|p| p == self.config.local.port());
        if let Some(ip) = host_ip(host) {
            return ip == self.config.local.ip() && port_ok;
        }
        port_ok
            && self
                .config
                .domains
                .iter()
                .any(|domain| domain.eq_ignore_ascii_case(host))
    }

    /// Whether `via` is one we added.
    pub(super) fn is_our_via(&self, via: &Via<'_>) -> bool {
        host_ip(via.host) == Some(self.config.local.ip())
            && via.port.unwrap_or(5060) == self.config.local.port()
    }

    fn uri_is_us(&self, uri: &str) -> bool {
        SipUri::parse(uri).is_some_and(|u| self.host_is_ours(u.host, u.port))
    }

    /// RFC 3261 16.3 validation (steps 2 to 5).
    pub(super) fn validate(&self, msg: &SipMsg<'_>, keys: RequestKeys) -> Option<Rejection> {
        let request_uri = msg.request_uri().unwrap_or("");
        match scheme(request_uri) {
            Some(s) if s.eq_ignore_ascii_case("sip") || s.eq_ignore_ascii_case("sips") => {}
            _ => return Some(Rejection::UnsupportedScheme),
        }
        if msg.max_forwards() == Some(0) {
            return Some(Rejection::TooManyHops);
        }
        // Only requests that already passed a ringway proxy can loop here.
        static FINDER: std::sync::OnceLock<memchr::memmem::Finder<'static>> =
            std::sync::OnceLock::new();
        let finder = FINDER.get_or_init(|| memchr::memmem::Finder::new(BRANCH_PREFIX.as_bytes()));
        let seen_us = finder.find(msg.head().as_bytes()).is_some();
        for via in msg.vias().filter(|_| seen_us) {
            if self.is_our_via(&via) {
                if let Some(seen) = via.branch.and_then(Branch::parse) {
                    if seen.loop_detect == keys.loop_detect {
                        return Some(Rejection::LoopDetected);
                    }
                }
            }
        }
        if msg.proxy_require().next().is_some() {
            return Some(Rejection::BadExtension);
        }
        // Found by fuzzing: a strict next hop `<sip:bob\0...@host>` became
        // a Request-URI that no parser (ours included) accepts.
        if msg
            .routes()
            .any(|route| crate::msg::check_request_uri(route.uri).is_err())
        {
            return Some(Rejection::MalformedRoute);
        }
        None
    }

    /// Route information preprocessing (16.4) and the 16.6 step 6 check.
    pub(super) fn plan_route<'m>(&self, msg: &SipMsg<'m>) -> RoutePlan<'m> {
        let route_count = msg.routes().count();
        let received = msg.request_uri().unwrap_or("");
        let received_uri = msg.request_sip_uri();
        let from_strict_router = route_count > 0
            && received_uri.is_some_and(|u| {
                u.user.is_none() && u.param("lr").is_some() && self.host_is_ours(u.host, u.port)
            });
        let mut routes_left = route_count - usize::from(from_strict_router);
        let request_uri = if from_strict_router {
            msg.routes().last().map_or(received, |route| route.uri)
        } else {
            received
        };
        let pop_route =
            routes_left > 0 && msg.routes().next().is_some_and(|r| self.uri_is_us(r.uri));
        if pop_route {
            routes_left -= 1;
        }
        let next_route = if routes_left > 0 {
            msg.routes().nth(usize::from(pop_route))
        } else {
            None
        };
        let strict_next_hop = next_route
            .filter(|r| !from_strict_router && r.sip_uri().is_some_and(|u| u.param("lr").is_none()))
            .map(|r| r.uri);
        RoutePlan {
            from_strict_router,
            pop_route,
            request_uri,
            next_route,
            strict_next_hop,
            received_uri,
        }
    }

    /// The next hop: the next Route (if an IP literal), else by Request-URI.
    pub(super) fn choose_target<'m>(
        &self,
        request: &Request<'_>,
        plan: &RoutePlan<'m>,
    ) -> Target<'m> {
        if let Some(route) = plan.next_route {
            let to = route.sip_uri().and_then(|u| {
                u.host_ip()
                    .map(|ip| SocketAddr::new(ip, u.port.unwrap_or(5060)))
            });
            return match to {
                Some(to) => Target::Send {
                    to,
                    request_uri: None,
                    route_set: None,
                },
                None => self.default_route(),
            };
        }
        let uri = if plan.from_strict_router {
            SipUri::parse(plan.request_uri)
        } else {
            plan.received_uri
        };
        self.route_by_uri(uri, request.method)
    }

    /// Route by Request-URI: our registrar or OPTIONS for us, a lookup,
    /// an IP literal, else `route_to`.
    fn route_by_uri<'m>(&self, uri: Option<SipUri<'m>>, method: Method<'_>) -> Target<'m> {
        let Some(uri) = uri else {
            return Target::Respond(416, "Unsupported URI Scheme");
        };
        if self.host_is_ours(uri.host, uri.port) {
            if method == Method::Register && self.config.registrar {
                return Target::Register;
            }
            if uri.user.is_none() && method == Method::Options {
                return Target::OptionsToUs;
            }
            if self.config.registrar {
                if let Some(user) = uri.user {
                    return Target::Lookup { aor: user };
                }
            }
            return self.default_route();
        }
        if let Some(ip) = uri.host_ip() {
            return Target::Send {
                to: SocketAddr::new(ip, uri.port.unwrap_or(5060)),
                request_uri: None,
                route_set: None,
            };
        }
        self.default_route()
    }

    /// `route_to`, else 404 (we resolve no names).
    fn default_route<'m>(&self) -> Target<'m> {
        match self.config.route_to {
            Some(to) => Target::Send {
                to,
                request_uri: None,
                route_set: None,
            },
            None => Target::Respond(404, "Not Found"),
        }
    }

    /// Where a request to an AOR with these `bindings` goes: the most
    /// recently refreshed contact as Request-URI, through its Path when it
    /// was registered with one (the Path's first hop is the next hop and
    /// the whole Path goes on top of the Route headers, RFC 3327 5.3);
    /// `route_to` or the default route when the AOR has no binding.
    pub(super) fn binding_target<'m>(&self, bindings: Vec<Binding>) -> Target<'m> {
        let Some(binding) = bindings.into_iter().next() else {
            return self.default_route();
        };
        let uri_address = |uri: SipUri<'_>| {
            uri.host_ip()
                .map(|ip| SocketAddr::new(ip, uri.port.unwrap_or(5060)))
        };
        if let Some(first) = binding.path.first() {
            let next_hop = NameAddr::parse(first)
                .and_then(|hop| hop.sip_uri())
                .and_then(uri_address);
            return match next_hop {
                Some(to) => Target::Send {
                    to,
                    route_set: Some(binding.path.join(", ")),
                    request_uri: Some(Cow::Owned(binding.contact)),
                },
                // We resolve no names: a Path we cannot follow.
                None => Target::Respond(480, "Temporarily Unavailable - Path Not Routable"),
            };
        }
        let to = SipUri::parse(&binding.contact).and_then(uri_address);
        match to.or(self.config.route_to) {
            Some(to) => Target::Send {
                to,
                request_uri: Some(Cow::Owned(binding.contact)),
                route_set: None,
            },
            None => Target::Respond(480, "Temporarily Unavailable"),
        }
    }
}
