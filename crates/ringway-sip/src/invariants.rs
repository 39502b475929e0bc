//! Invariants the fuzz targets (crates/ringway-sip/fuzz) check, shared with
//! the corpus replay test so both assert the same things. Each function
//! panics when an invariant is broken; that is the point.

use crate::auth::Credentials;
use crate::proxy::{ProxyWorker, AMPLIFICATION_LIMIT};
use crate::uri::NameAddr;
use crate::{
    forward_request, forward_response, Method, Mode, Proxy, ProxyConfig, RequestEdits, SipMsg,
    ViaEdit,
};
use std::collections::{HashMap, HashSet};
use std::net::{IpAddr, SocketAddr};

/// Parse `data`, touch every accessor and, for a valid message, forward it
/// through the editor: an edited request must parse again with the same
/// Call-ID and body and one Via more; a forwarded response one Via less.
/// A message [`SipMsg::parse`] accepts is accepted by
/// [`SipMsg::parse_lazy`] with the same accessor results.
/// Returns whether `data` parsed.
pub fn parse_and_edit(data: &[u8]) -> bool {
    let _ = SipMsg::parse_loose(data);
    let lazy = SipMsg::parse_lazy(data);
    let Ok(m) = SipMsg::parse(data) else {
        if let Ok(l) = lazy {
            // Touch the lazily parsed accessors: they must not panic.
            let _ = (l.to_tag(), l.from_tag(), l.top_via(), l.request_sip_uri());
            let _ = l.vias().count() + l.contact().count() + l.record_routes().count();
        }
        return false;
    };
    let l = lazy.expect("parse_lazy accepts what parse accepts");
    lazy_agrees(&m, &l);
    let _ = (
        m.method(),
        m.status(),
        m.request_uri(),
        m.call_id(),
        m.cseq(),
    );
    let _ = (
        m.from_tag(),
        m.to_tag(),
        m.max_forwards(),
        m.content_length(),
    );
    let _ = (m.expires(), m.body(), m.request_sip_uri(), m.contact_star());
    for v in m.vias() {
        let _ = v.response_target();
    }
    let _ = m.routes().count() + m.record_routes().count() + m.contact().count();
    let _ = m.proxy_require().count() + m.header("v").count() + m.headers().count();
    let mut out = Vec::new();
    if m.is_request() {
        let routes = m.routes().count();
        let edits = RequestEdits {
            via: Some(ViaEdit {
                transport: "UDP",
                sent_by: "192.0.2.10:5060",
                branch: "z9hG4bKfuzz",
            }),
            max_forwards: true,
            record_route: Some("sip:192.0.2.10:5060;lr"),
            pop_routes: usize::from(routes > 0),
            request_uri: Some("sip:x@192.0.2.20"),
            pop_last_route: routes > 1,
            received: Some("192.0.2.1"),
            rport: Some(5060),
            strict_next_hop: None,
            route_set: None,
            path: None,
            remove: crate::edit::RemoveHeaders {
                asserted_identity: true,
                proxy_authorization_realms: &["example.com".to_string()],
            },
        };
        if forward_request(&m, &edits, &mut out).is_ok() {
            let f = SipMsg::parse(&out).expect("forwarded request must parse");
            assert_eq!(f.call_id(), m.call_id());
            assert_eq!(f.body(), m.body());
            assert_eq!(f.vias().count(), m.vias().count() + 1);
        }
    } else if forward_response(&m, &mut out).is_ok() && m.vias().count() > 1 {
        let f = SipMsg::parse(&out).expect("forwarded response must parse");
        assert_eq!(f.vias().count() + 1, m.vias().count());
    }
    true
}

/// Feed a datagram sequence (split on 0xFF) from three sources (a client,
/// the configured next hop, a stranger) through stateful and stateless
/// proxies, with and without authentication (table bound 8), with timers
/// in between: nothing may be sent to port 0 or empty, the table stays
/// bounded, and every step keeps the [`Guarded`] security invariants.
pub fn proxy_sequence(data: &[u8]) {
    let mk = |mode, auth: bool| {
        let mut proxy = Proxy::new(ProxyConfig {
            mode,
            local: "192.0.2.10:5060".parse().unwrap(),
            route_to: Some("192.0.2.20:5060".parse().unwrap()),
            registrar: true,
            record_route: true,
            max_transactions: 8,
            domains: vec!["example.com".into()],
            auth: auth.then(crate::proxy::AuthConfig::default),
            ..ProxyConfig::default()
        });
        let mut users = crate::auth::HtdigestCredentials::default();
        users.add_password("alice", "example.com", "secret");
        proxy.set_credentials(std::sync::Arc::new(users));
        proxy
    };
    let proxies = [
        mk(Mode::Stateful, false),
        mk(Mode::Stateless, true),
        mk(Mode::Stateful, true),
        mk(Mode::Stateless, false),
    ];
    let sources: [SocketAddr; 3] = [
        "192.0.2.1:5060".parse().unwrap(),
        "192.0.2.20:5060".parse().unwrap(),
        "192.0.2.7:5070".parse().unwrap(),
    ];
    let mut now = 0u64;
    let mut guarded: Vec<Guarded<'_>> = proxies.iter().map(Guarded::new).collect();
    for (i, dg) in data.split(|&b| b == 0xFF).enumerate() {
        let src = sources[i % sources.len()];
        for guard in &mut guarded {
            guard.handle(now, src, dg);
            guard.on_timer(now);
        }
        now += (i as u64 % 7) * 3_000_000_000;
    }
    for guard in &mut guarded {
        guard.on_timer(now + 400_000_000_000);
        assert!(guard.worker.proxy().stats().transactions_active <= 8 + 8);
    }
}

/// A proxy worker whose every output is checked against the security
/// invariants of issue 19 (docs/security.md), given what it was fed:
///
/// - (a) a request goes only to `route_to`, an address bound by a
///   REGISTER the proxy accepted, a relay network, a destination a request
///   already went to (retransmissions, hop-by-hop ACK/CANCEL), or anywhere
///   (but (c)) while handling a request that was authenticated or that
///   carries a signed Route of ours;
/// - (b) towards an address that never sent us a response, the responses
///   we generate (not those relayed from a downstream hop, nor their
///   timer-G copies) total at most [`AMPLIFICATION_LIMIT`] times the bytes
///   of the requests it sent;
/// - (c) nothing goes to our own address, and no request to loopback,
///   link-local or our IP unless configured (`route_to`, or a relay
///   network naming it);
/// - (d) no request carries `Proxy-Authorization` for one of our realms.
pub struct Guarded<'p> {
    worker: ProxyWorker<'p>,
    allowed: HashSet<SocketAddr>,
    requested_from: HashMap<IpAddr, usize>,
    generated_to: HashMap<IpAddr, usize>,
    responders: HashSet<IpAddr>,
    relayed: HashSet<u64>,
}

/// What kind of step produced an output.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Step {
    Request { free: bool },
    Response,
    Timer,
}

impl<'p> Guarded<'p> {
    /// Guard a new worker of `proxy`.
    pub fn new(proxy: &'p Proxy) -> Guarded<'p> {
        Guarded {
            worker: proxy.worker(),
            allowed: proxy.config().route_to.into_iter().collect(),
            requested_from: HashMap::new(),
            generated_to: HashMap::new(),
            responders: HashSet::new(),
            relayed: HashSet::new(),
        }
    }

    /// Handle one datagram and check what it produced; returns how many
    /// datagrams it produced.
    pub fn handle(&mut self, now: u64, src: SocketAddr, datagram: &[u8]) -> usize {
        let msg = SipMsg::parse(datagram).ok();
        let is_response = msg.as_ref().is_some_and(|m| !m.is_request());
        let step = if is_response {
            self.responders.insert(src.ip());
            Step::Response
        } else {
            *self.requested_from.entry(src.ip()).or_default() += datagram.len();
            let signed = msg
                .as_ref()
                .is_some_and(|m| m.to_tag().is_some() && m.head().contains(";rw="));
            Step::Request { free: signed }
        };
        let accepted_before = self.worker.proxy().stats().auth_accepted;
        let mut outputs = Vec::new();
        let outcome = self.worker.handle(now, src, datagram, &mut |to, b| {
            outputs.push((to, b.to_vec()))
        });
        let authenticated = self.worker.proxy().stats().auth_accepted > accepted_before;
        let step = match step {
            Step::Request { free } => Step::Request {
                free: free || authenticated,
            },
            other => other,
        };
        for (to, bytes) in &outputs {
            self.check(*to, bytes, step);
        }
        // A REGISTER the proxy accepted binds its contacts (and Path).
        if let (Some(m), crate::Action::Responded(200)) = (&msg, outcome.action) {
            if m.method() == Some(Method::Register) {
                let hops = m
                    .contact()
                    .filter_map(|c| c.sip_uri())
                    .chain(
                        m.header("Path")
                            .filter_map(|p| NameAddr::parse(p)?.sip_uri()),
                    )
                    .filter_map(|u| Some(SocketAddr::new(u.host_ip()?, u.port.unwrap_or(5060))));
                self.allowed.extend(hops);
            }
        }
        outputs.len()
    }

    /// Run due timers and check what they produced.
    pub fn on_timer(&mut self, now: u64) {
        let mut outputs = Vec::new();
        self.worker
            .on_timer(now, &mut |to, b| outputs.push((to, b.to_vec())));
        for (to, bytes) in &outputs {
            self.check(*to, bytes, Step::Timer);
        }
    }

    fn check(&mut self, to: SocketAddr, bytes: &[u8], step: Step) {
        let proxy = self.worker.proxy();
        let config = proxy.config();
        assert!(to.port() != 0 && !bytes.is_empty(), "bad output to {to}");
        assert_ne!(to, config.local, "(c) a datagram to our own address");
        // (Our 400 to a request missing a mandatory header lacks it too.)
        let Ok(msg) = SipMsg::parse(bytes).or_else(|_| SipMsg::parse_loose(bytes)) else {
            panic!("an output that does not parse, to {to}");
        };
        if msg.is_request() {
            // (c)
            let ip = to.ip();
            let local_network = ip.is_loopback()
                || ip == config.local.ip()
                || matches!(ip, IpAddr::V4(v4) if v4.is_link_local());
            assert!(
                !local_network || config.route_to == Some(to) || config.relay.names(ip),
                "(c) a request to {to}"
            );
            // (a)
            let free = matches!(step, Step::Request { free: true });
            assert!(
                free || self.allowed.contains(&to) || config.relay.contains(ip),
                "(a) a request to {to}, which nothing granted"
            );
            self.allowed.insert(to);
            // (d)
            let realms: Vec<String> = match config.auth.as_ref() {
                Some(auth) => auth
                    .realm
                    .iter()
                    .cloned()
                    .chain(config.domains.iter().map(|d| d.to_ascii_lowercase()))
                    .collect(),
                None => Vec::new(),
            };
            for value in msg.header("Proxy-Authorization") {
                if let Some(realm) = Credentials::realm_of(value) {
                    assert!(
                        !realms.iter().any(|r| r.eq_ignore_ascii_case(realm)),
                        "(d) our realm's credentials forwarded to {to}"
                    );
                }
            }
            return;
        }
        // (b)
        let digest = crate::hash::Hash64::new(0).bytes(bytes).finish();
        match step {
            Step::Response => {
                self.relayed.insert(digest);
                return;
            }
            Step::Timer if self.relayed.contains(&digest) => return,
            _ => {}
        }
        if self.responders.contains(&to.ip()) {
            return;
        }
        let generated = self.generated_to.entry(to.ip()).or_default();
        *generated += bytes.len();
        let budget = AMPLIFICATION_LIMIT * self.requested_from.get(&to.ip()).copied().unwrap_or(0);
        assert!(
            *generated <= budget,
            "(b) {generated} bytes generated towards {to}, which sent {} bytes of requests",
            budget / AMPLIFICATION_LIMIT
        );
    }
}

/// `lazy` (from [`SipMsg::parse_lazy`]) reads like `strict` (from [`SipMsg::parse`]).
pub fn lazy_agrees(strict: &SipMsg<'_>, lazy: &SipMsg<'_>) {
    assert_eq!(strict.start_line(), lazy.start_line());
    assert_eq!(strict.method(), lazy.method());
    assert_eq!(strict.status(), lazy.status());
    assert_eq!(strict.request_uri(), lazy.request_uri());
    assert_eq!(strict.request_sip_uri(), lazy.request_sip_uri());
    assert_eq!(strict.call_id(), lazy.call_id());
    assert_eq!(strict.cseq(), lazy.cseq());
    assert_eq!(strict.from_tag(), lazy.from_tag());
    assert_eq!(strict.to_tag(), lazy.to_tag());
    assert_eq!(strict.top_via(), lazy.top_via());
    assert!(strict.vias().eq(lazy.vias()));
    assert!(strict.routes().eq(lazy.routes()));
    assert!(strict.record_routes().eq(lazy.record_routes()));
    assert!(strict.contact().eq(lazy.contact()));
    assert_eq!(strict.max_forwards(), lazy.max_forwards());
    assert_eq!(strict.content_length(), lazy.content_length());
    assert_eq!(strict.body(), lazy.body());
    assert!(strict.headers().eq(lazy.headers()));
}
