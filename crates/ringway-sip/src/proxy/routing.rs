//! Where a request goes: validation (RFC 3261 16.3), route information
//! preprocessing (16.4), the strict-router rewrite (16.6 step 6) and the
//! choice of next hop ([`Target`]) with what grants it ([`Grant`]). Also
//! which addresses, domains and identities are ours.

use super::branch::{Branch, RequestKeys, BRANCH_PREFIX};
use super::flow_token::TokenUse;
use super::request_context::Request;
use super::Proxy;
use crate::msg::{Method, SipMsg, Via};
use crate::registrar::Binding;
use crate::relay::Grant;
use crate::transport::{Hop, Transport};
use crate::uri::{host_ip, scheme, NameAddr, SipUri};
use std::borrow::Cow;
use std::net::SocketAddr;

/// Our own Vias in one request at most (a spiral through us and back, e.g.
/// through the dispatcher): one more is a loop whatever the Request-URI
/// (RFC 3261 16.3 step 4 misses rewrite chains, each pass changes it).
const MAX_OWN_VIAS: usize = 3;

/// Where responses to a request from `from` go: the source address, with
/// the sent-by port unless the top Via asked for `rport` or the request
/// came over a connection (whose port the responses follow, RFC 3261
/// 18.2.2).
pub(crate) fn upstream_address(from: Hop, top: Option<&Via<'_>>) -> SocketAddr {
    match top {
        Some(via) if !via.rport_flag && !from.transport.is_reliable() => {
            SocketAddr::new(from.addr.ip(), via.port.unwrap_or(5060))
        }
        _ => from.addr,
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
    /// Forward to `to` if the relay policy allows it with `grant`;
    /// `request_uri` replaces the Request-URI (a registrar binding),
    /// `route_set` goes on top of the Route headers (the binding's Path,
    /// RFC 3327).
    Send {
        to: Hop,
        grant: Grant,
        request_uri: Option<Cow<'a, str>>,
        route_set: Option<String>,
        /// `to` is a registered flow: our Record-Route towards it carries
        /// its token (RFC 5626 5.3).
        flow: bool,
    },
    /// A next hop given by name (RFC 3263): resolved after authorization
    /// ([`super::names`]), when `grant` (or the request's authentication)
    /// or the relay networks could let the request go to what it resolves
    /// to; otherwise the default route.
    Resolve {
        query: super::NameQuery,
        grant: Grant,
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
        /// The AOR, `user@domain` ([`Proxy::aor`]).
        aor: String,
    },
}

/// The outcome of route information preprocessing (RFC 3261 16.4) and of
/// the strict-router check on the next hop (16.6 step 6).
pub(super) struct RoutePlan<'m> {
    /// The Request-URI is ours with `lr`: the previous hop was a strict
    /// router, so the last Route holds the real Request-URI and is popped.
    pub(super) from_strict_router: bool,
    /// Route values removed from the top: ours (all of them, in one pass)
    /// and, on an initial request, every preloaded one after them.
    pub(super) pop_routes: usize,
    /// In a dialog, and one of our Route values we consume (or our
    /// Request-URI behind a strict router) carries our signature for it.
    pub(super) signed: bool,
    /// The Request-URI after 16.4.
    pub(super) request_uri: &'m str,
    /// The Route that is the next hop, if one remains.
    pub(super) next_route: Option<NameAddr<'m>>,
    /// Its URI when it is a `sip:`/`sips:` URI (parsed once, here).
    next_route_uri: Option<SipUri<'m>>,
    /// A Route value could not be a Request-URI (control characters,
    /// URI headers, no scheme): the request is refused (16.3, with the
    /// rest of validation). Found by fuzzing: a strict next hop
    /// `<sip:bob\0...@host>` became a Request-URI that no parser (ours
    /// included) accepts.
    pub(super) malformed_route: bool,
    /// The next hop's URI when it is a strict router (no `lr`): it becomes
    /// the Request-URI and the old one goes to the end of the Route set.
    pub(super) strict_next_hop: Option<&'m str>,
    /// The received Request-URI, parsed.
    received_uri: Option<SipUri<'m>>,
    /// The transport named by the last of our Route values consumed (a
    /// double Record-Route names the far side's transport last): how to
    /// reach the Request-URI when it names none.
    pub(super) own_route_transport: Option<Transport>,
    /// The flow a signed flow token in one of our Route values names
    /// (RFC 5626 5.3): a Record-Route token within a dialog, or a Path
    /// token (the user part of our Path, an edge proxy's) on any request.
    /// A request that did not come over the flow goes over it.
    pub(super) flow: Option<Hop>,
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
    /// Whether `host[:port]` is us (our IP and port, or one of our domains;
    /// a fully qualified name's trailing dot is ignored).
    pub(super) fn host_is_ours(&self, host: &str, port: Option<u16>) -> bool {
        if let Some(ip) = host_ip(host) {
            return self
                .own
                .iter()
                .any(|own| own.at.addr.ip() == ip && port.is_none_or(|p| p == own.at.addr.port()));
        }
        let port_ok = port.is_none_or(|p| self.own.iter().any(|own| own.at.addr.port() == p));
        port_ok && self.is_our_host(host)
    }

    /// Whether `host` is our IP or one of our domains (ports do not matter).
    pub(super) fn is_our_host(&self, host: &str) -> bool {
        if let Some(ip) = host_ip(host) {
            return self.own.iter().any(|own| own.at.addr.ip() == ip);
        }
        let host = host.strip_suffix('.').unwrap_or(host);
        self.config
            .domains
            .iter()
            .any(|domain| domain.eq_ignore_ascii_case(host))
    }

    /// The served domain `host` names, canonical (lower case, no trailing
    /// dot): one of our domains, or for our IP the first of them (our IP
    /// as text when we serve none). `None`: not ours. Ports do not matter.
    pub(super) fn domain_of(&self, host: &str) -> Option<Cow<'_, str>> {
        if let Some(ip) = host_ip(host) {
            if !self.own.iter().any(|own| own.at.addr.ip() == ip) {
                return None;
            }
            return Some(match self.config.domains.first() {
                Some(domain) => Cow::Owned(domain.to_ascii_lowercase()),
                None => Cow::Owned(ip.to_string()),
            });
        }
        let host = host.strip_suffix('.').unwrap_or(host);
        self.config
            .domains
            .iter()
            .find(|domain| domain.eq_ignore_ascii_case(host))
            .map(|domain| Cow::Owned(domain.to_ascii_lowercase()))
    }

    /// The address-of-record of `user` at our `host`: `user@domain` with
    /// the user percent-decoded and the domain canonical
    /// ([`Proxy::domain_of`]), so that every spelling of one AOR is one key
    /// and equal users of two domains are two (`None`: not our domain).
    pub(super) fn aor(&self, user: &str, host: &str) -> Option<String> {
        let domain = self.domain_of(host)?;
        Some(format!("{}@{domain}", canonical_user(user)))
    }

    /// Whether `via` is one we added.
    pub(super) fn is_our_via(&self, via: &Via<'_>) -> bool {
        let ip = host_ip(via.host);
        let port = via.port.unwrap_or(5060);
        self.own
            .iter()
            .any(|own| ip == Some(own.at.addr.ip()) && port == own.at.addr.port())
    }

    /// RFC 3261 16.3 validation (steps 2 to 5), with a bound on our own
    /// Vias in the request.
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
        let mut own_vias = 0;
        // (Not `vias().filter(..)`: that would parse every Via first.)
        let vias = seen_us.then(|| msg.vias()).into_iter().flatten();
        for via in vias {
            if self.is_our_via(&via) {
                own_vias += 1;
                if own_vias > MAX_OWN_VIAS {
                    return Some(Rejection::LoopDetected);
                }
                if let Some((seen, _)) = via.branch.and_then(Branch::parse) {
                    if seen.loop_detect == keys.loop_detect {
                        return Some(Rejection::LoopDetected);
                    }
                }
            }
        }
        if msg.proxy_require().next().is_some() {
            return Some(Rejection::BadExtension);
        }
        // The last check, a Route that could not be a Request-URI, is
        // made by `plan_route` in its pass over the Routes
        // (`RoutePlan::malformed_route`).
        None
    }

    /// Route information preprocessing (16.4) and the 16.6 step 6 check.
    /// Every Route value of ours on top is consumed at once (a request
    /// naming us sixty times costs one pass, not sixty); on an initial
    /// request (no To tag) the Routes after them are preloaded and removed
    /// too, so that only our own routing picks the next hop. In a dialog,
    /// the Routes left are followed, and [`RoutePlan::signed`] says
    /// whether we Record-Routed it.
    pub(super) fn plan_route<'m>(&self, msg: &SipMsg<'m>) -> RoutePlan<'m> {
        let received = msg.request_uri().unwrap_or("");
        let received_uri = msg.request_sip_uri();
        let in_dialog = msg.to_tag().is_some();
        // One pass over the Route values: how many, how many of ours lead
        // (and whether one of them is signed for this dialog), the first
        // other one, and the last one.
        // Each value is parsed once, here (as a name-addr, then its URI as
        // a Request-URI would be).
        let mut route_count = 0;
        let mut ours = 0;
        let mut signed = false;
        let mut first_other: Option<(NameAddr<'m>, Option<SipUri<'m>>)> = None;
        let mut last: Option<NameAddr<'m>> = None;
        let mut own_route_transport = None;
        let mut flow = None;
        let mut path_flow = None;
        let mut malformed_route = false;
        for (route, sip_uri) in msg.routes_with_uri() {
            let uri = match crate::msg::check_parsed_request_uri(route.uri, sip_uri) {
                Ok(uri) => uri,
                Err(_) => {
                    malformed_route = true;
                    None
                }
            };
            if first_other.is_none() {
                if let Some(u) = uri.filter(|u| self.host_is_ours(u.host, u.port)) {
                    own_route_transport = Some(Transport::of_uri(&u).unwrap_or_default());
                    if let Some(Some(token)) = u.param(super::flow_token::FLOW_PARAM) {
                        flow = flow.or(self.flow_of_token(token, TokenUse::RecordRoute));
                    }
                    if let Some(token) = u.user {
                        path_flow = path_flow.or(self.flow_of_token(token, TokenUse::Path));
                    }
                    ours += 1;
                    signed = signed || in_dialog && self.route_is_signed(msg, uri);
                } else {
                    first_other = Some((route, uri));
                }
            }
            last = Some(route);
            route_count += 1;
        }
        let from_strict_router = route_count > 0
            && received_uri.is_some_and(|u| {
                u.user.is_none() && u.param("lr").is_some() && self.host_is_ours(u.host, u.port)
            });
        let routes_left = route_count - usize::from(from_strict_router);
        let request_uri = if from_strict_router {
            last.map_or(received, |route| route.uri)
        } else {
            received
        };
        // Behind a strict router the last Route is the Request-URI, not a
        // Route of ours or a next hop.
        let ours = ours.min(routes_left);
        let signed =
            in_dialog && (from_strict_router && self.route_is_signed(msg, received_uri) || signed);
        let preloaded = !in_dialog && routes_left > ours;
        let (next_route, next_route_uri) = match first_other {
            Some((route, uri)) if !preloaded && routes_left > ours => (Some(route), uri),
            _ => (None, None),
        };
        let strict_next_hop = next_route
            .filter(|_| {
                !from_strict_router && next_route_uri.is_some_and(|u| u.param("lr").is_none())
            })
            .map(|r| r.uri);
        RoutePlan {
            from_strict_router,
            pop_routes: if preloaded { routes_left } else { ours },
            signed,
            request_uri,
            next_route,
            next_route_uri,
            malformed_route,
            strict_next_hop,
            received_uri,
            own_route_transport,
            // A Record-Route token only within a dialog; a Path token
            // (the registrar sends the initial request through our Path)
            // on any request.
            flow: flow.filter(|_| in_dialog).or(path_flow),
        }
    }

    /// The next hop: the next Route (if an IP literal), else by Request-URI.
    pub(super) fn choose_target<'m>(
        &self,
        request: &Request<'_>,
        plan: &RoutePlan<'m>,
    ) -> Target<'m> {
        let grant = if plan.signed {
            Grant::SignedRoute
        } else {
            Grant::None
        };
        if let Some(flow) = plan.flow {
            // RFC 5626 5.3: towards the flow unless it came over it (then
            // it is the phone's own request, routed as any other).
            let came_over_it = request.from.transport == flow.transport
                && request.from.addr == flow.addr
                && (flow.flow.is_none() || request.from.flow == flow.flow);
            if !came_over_it {
                return Target::Send {
                    to: flow,
                    // The token is signed: we sent this dialog there, or
                    // the phone registered through us over it.
                    grant: Grant::SignedRoute,
                    request_uri: None,
                    route_set: None,
                    // An initial request (through our Path): our
                    // Record-Route towards the flow carries its token.
                    flow: true,
                };
            }
        }
        if plan.next_route.is_some() {
            let uri = plan.next_route_uri;
            if let Some(query) = uri.as_ref().and_then(|u| self.name_of(u)) {
                return Target::Resolve { query, grant };
            }
            let to = uri.and_then(|u| {
                u.host_ip().map(|ip| {
                    let transport = Transport::of_uri(&u).unwrap_or_default();
                    self.hop_over(transport, SocketAddr::new(ip, u.port.unwrap_or(5060)))
                })
            });
            return match to {
                Some(to) => Target::Send {
                    to,
                    grant,
                    request_uri: None,
                    route_set: None,
                    flow: false,
                },
                None => self.default_route(),
            };
        }
        let uri = if plan.from_strict_router {
            SipUri::parse(plan.request_uri)
        } else {
            plan.received_uri
        };
        self.route_by_uri(uri, request.method, grant, plan.own_route_transport)
    }

    /// A hop to `addr` over `transport` if we speak it, else over UDP (a
    /// proxy that listens only on UDP sends everything over UDP, as
    /// before connection transports existed).
    pub(super) fn hop_over(&self, transport: Transport, addr: SocketAddr) -> Hop {
        match self.own_address(transport) {
            Some(_) => Hop::new(transport, addr),
            None => Hop::udp(addr),
        }
    }

    /// Route by Request-URI: our registrar or OPTIONS for us, a lookup,
    /// an IP literal, else `route_to`.
    fn route_by_uri<'m>(
        &self,
        uri: Option<SipUri<'m>>,
        method: Method<'_>,
        grant: Grant,
        own_route_transport: Option<Transport>,
    ) -> Target<'m> {
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
                if let Some(aor) = uri.user.and_then(|user| self.aor(user, uri.host)) {
                    return Target::Lookup { aor };
                }
            }
            return self.default_route();
        }
        if let Some(ip) = uri.host_ip() {
            let transport = Transport::of_uri(&uri)
                .or(own_route_transport)
                .unwrap_or_default();
            return Target::Send {
                to: self.hop_over(transport, SocketAddr::new(ip, uri.port.unwrap_or(5060))),
                grant,
                request_uri: None,
                route_set: None,
                flow: false,
            };
        }
        if self.config.route_to.is_none() && self.config.route_to_name.is_none() {
            if let Some(query) = self.name_of(&uri) {
                return Target::Resolve { query, grant };
            }
        }
        self.default_route()
    }

    /// The name to resolve for `uri`'s host, if it is a name and we have a
    /// resolver (its transport from the URI: `sips:` TLS, `;transport=`).
    /// A `.invalid` host (a browser's Contact, RFC 7118) is never
    /// resolved (RFC 6761 6.4).
    fn name_of(&self, uri: &SipUri<'_>) -> Option<super::NameQuery> {
        if self.names.is_none() || uri.host_ip().is_some() || is_invalid_name(uri.host) {
            return None;
        }
        let transport = Transport::of_uri(uri).unwrap_or_default();
        let transport = self.hop_over(transport, self.config.local).transport;
        Some(super::NameQuery::new(uri.host, uri.port, transport))
    }

    /// Whether the relay networks are `none` (only grants pass).
    pub(super) fn relays_nowhere(&self) -> bool {
        matches!(
            self.relay.read().unwrap_or_else(|e| e.into_inner()).nets(),
            crate::relay::RelayNets::None
        )
    }

    /// Whether a stored flow is one we can send over: a transport we
    /// listen on, and a UDP flow only with NAT handling on (a binding
    /// stored by a proxy with it on, read from a shared store).
    fn flow_usable(&self, flow: Hop) -> bool {
        self.own_address(flow.transport).is_some()
            && (flow.transport.is_reliable() || self.config.nat)
    }

    /// `route_to` (an address, or a name to resolve), else 404.
    pub(super) fn default_route<'m>(&self) -> Target<'m> {
        match (self.config.route_to, &self.config.route_to_name) {
            (Some(to), _) => Target::Send {
                to: self.hop_over(self.config.route_to_transport, to),
                grant: Grant::None,
                request_uri: None,
                route_set: None,
                flow: false,
            },
            // Configured: granted like an authenticated request's target
            // (loopback, link-local, our IP only when a network names them).
            (None, Some(query)) if self.names.is_some() => Target::Resolve {
                query: query.clone(),
                grant: Grant::Authenticated,
            },
            _ => Target::Respond(404, "Not Found"),
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
            uri.host_ip().map(|ip| {
                let transport = Transport::of_uri(&uri).unwrap_or_default();
                self.hop_over(transport, SocketAddr::new(ip, uri.port.unwrap_or(5060)))
            })
        };
        if let Some(first) = binding.path.first() {
            let next_hop = NameAddr::parse(first)
                .and_then(|hop| hop.sip_uri())
                .and_then(uri_address);
            return match next_hop {
                Some(to) => Target::Send {
                    to,
                    grant: Grant::Binding,
                    route_set: Some(binding.path.join(", ")),
                    request_uri: Some(Cow::Owned(binding.contact)),
                    flow: false,
                },
                // We resolve no names: a Path we cannot follow.
                None => Target::Respond(480, "Temporarily Unavailable - Path Not Routable"),
            };
        }
        let flow = binding.flow.filter(|flow| self.flow_usable(*flow));
        let to = match flow {
            // Over the flow the REGISTER came in on (RFC 5626 5.3): a
            // connection it opened, or its NAT binding.
            Some(flow) => Some(flow),
            None => SipUri::parse(&binding.contact).and_then(uri_address),
        };
        let route_to = self
            .config
            .route_to
            .map(|to| self.hop_over(self.config.route_to_transport, to));
        if to.is_none() && route_to.is_none() && self.config.route_to_name.is_some() {
            // A contact that is a name, with a default route by name.
            return self.default_route();
        }
        match to.or(route_to) {
            Some(to) => Target::Send {
                to,
                grant: Grant::Binding,
                request_uri: Some(Cow::Owned(binding.contact)),
                route_set: None,
                flow: flow.is_some(),
            },
            None => Target::Respond(480, "Temporarily Unavailable"),
        }
    }
}

/// Whether `host` is under the special-use domain `invalid.` (RFC 6761
/// 6.4: it never resolves; browsers name their Contact and Via hosts so).
pub(super) fn is_invalid_name(host: &str) -> bool {
    let host = host.strip_suffix('.').unwrap_or(host).as_bytes();
    let label = b"invalid";
    host.len() >= label.len()
        && host[host.len() - label.len()..].eq_ignore_ascii_case(label)
        && (host.len() == label.len() || host[host.len() - label.len() - 1] == b'.')
}

/// A user part as one key: percent-escapes decoded (RFC 3261 19.1.4: `%61`
/// and `a` are the same user); compared case-sensitively.
pub(super) fn canonical_user(user: &str) -> Cow<'_, str> {
    if !user.contains('%') {
        return Cow::Borrowed(user);
    }
    let bytes = user.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        match (
            bytes[i],
            bytes.get(i + 1).copied(),
            bytes.get(i + 2).copied(),
        ) {
            (b'%', Some(h), Some(l)) if hex(h).is_some() && hex(l).is_some() => {
                out.push((hex(h).unwrap_or(0) * 16 + hex(l).unwrap_or(0)) as u8);
                i += 3;
            }
            (b, _, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    Cow::Owned(String::from_utf8_lossy(&out).into_owned())
}

#[cfg(test)]
mod tests {
    use super::{canonical_user, is_invalid_name};

    #[test]
    fn invalid_names_are_recognised() {
        for name in [
            "df7jal23ls0d.invalid",
            "a.b.INVALID",
            "invalid",
            "x.invalid.",
        ] {
            assert!(is_invalid_name(name), "{name}");
        }
        for name in [
            "notinvalid",
            "invalid.example.com",
            "example.com",
            "",
            "é.invalidé",
        ] {
            assert!(!is_invalid_name(name), "{name}");
        }
    }

    #[test]
    fn users_are_compared_decoded() {
        assert_eq!(canonical_user("alice"), "alice");
        assert_eq!(canonical_user("%61lice"), "alice");
        assert_eq!(canonical_user("a%2"), "a%2");
        assert_ne!(canonical_user("Alice"), "alice");
    }
}
