//! Invariants the fuzz targets (crates/ringway-sip/fuzz) check, shared with
//! the corpus replay test so both assert the same things. Each function
//! panics when an invariant is broken; that is the point.

use crate::{
    forward_request, forward_response, Mode, Proxy, ProxyConfig, RequestEdits, SipMsg, ViaEdit,
};
use std::net::SocketAddr;

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
                proxy_authorization_realm: Some("example.com"),
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

/// Feed a datagram sequence (split on 0xFF) through a stateful and a
/// stateless proxy (table bound 8) with timers in between: nothing may be
/// sent to port 0 or empty, and the table stays bounded.
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
    // The stateless one authenticates: arbitrary credentials headers
    // reach the digest code.
    let proxies = [mk(Mode::Stateful, false), mk(Mode::Stateless, true)];
    let src: SocketAddr = "192.0.2.1:5060".parse().unwrap();
    let mut now = 0u64;
    let mut sink = |to: SocketAddr, b: &[u8]| {
        assert!(to.port() != 0 && !b.is_empty(), "bad output to {to}");
    };
    let mut workers = [proxies[0].worker(), proxies[1].worker()];
    for (i, dg) in data.split(|&b| b == 0xFF).enumerate() {
        for worker in &mut workers {
            worker.handle(now, src, dg, &mut sink);
            worker.on_timer(now, &mut sink);
        }
        now += (i as u64 % 7) * 3_000_000_000;
    }
    for worker in &mut workers {
        worker.on_timer(now + 400_000_000_000, &mut sink);
        assert!(worker.proxy().stats().transactions_active <= 8 + 8);
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
