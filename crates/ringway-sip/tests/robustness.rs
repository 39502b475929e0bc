//! Property tests: parsing, editing and proxying never panic on mutated
//! messages, and edits of valid requests stay valid (run in CI, unlike the
//! cargo-fuzz targets).

mod common;
use common::*;
use proptest::prelude::*;
use ringway_sip::auth::{HtdigestCredentials, NonceKey};
use ringway_sip::invariants::Guarded;
use ringway_sip::{
    forward_request, forward_response, AuthConfig, Mode, Proxy, ProxyConfig, RequestEdits, SipMsg,
    ViaEdit,
};

fn seeds() -> Vec<Vec<u8>> {
    let inv = invite(
        "z9hG4bKp1",
        "sip:bob@example.com",
        "Route: <sip:192.0.2.10:5060;lr>, <sip:192.0.2.11;lr>\r\nRecord-Route: <sip:192.0.2.30;lr>\r\n",
    );
    let resp = response_to(&inv, 180, "Ringing", "");
    vec![
        inv,
        resp,
        b"REGISTER sip:example.com SIP/2.0\r\nv: SIP/2.0/UDP 192.0.2.3;branch=z9hG4bKr;rport\r\nf: <sip:c@example.com>;tag=1\r\nt: <sip:c@example.com>\r\ni: r1\r\nCSeq: 1 REGISTER\r\nm: <sip:c@192.0.2.3>;expires=60\r\nExpires: 60\r\nl: 0\r\n\r\n".to_vec(),
        b"OPTIONS sip:[2001:db8::1]:5070 SIP/2.0\r\nVia: SIP / 2.0 / UDP\r\n [2001:db8::2];branch=z9hG4bKo;received=2001:db8::9\r\nTo :\r\n <sip:a@b>\r\nFrom: \"x\\\"y\" <sip:c@d>;tag=1\r\nCall-ID: o\r\nCSeq: 1\r\n OPTIONS\r\nProxy-Require: x\r\n\r\n".to_vec(),
        b"SIP/2.0 200 OK\r\nVia: SIP/2.0/UDP 192.0.2.10;branch=z9hG4bKrw0000000000000000.00000000, SIP/2.0/UDP 192.0.2.1\r\nTo: <sip:b@x>;tag=2\r\nFrom: <sip:a@x>;tag=1\r\nCall-ID: c\r\nCSeq: 1 INVITE\r\n\r\n".to_vec(),
    ]
}

#[derive(Debug, Clone)]
enum Mutation {
    Flip(usize, u8),
    Insert(usize, u8),
    Delete(usize),
    Truncate(usize),
    Dup(usize, usize),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    let special = prop_oneof![
        Just(b'\r'),
        Just(b'\n'),
        Just(b' '),
        Just(b':'),
        Just(b';'),
        Just(b','),
        Just(b'"'),
        Just(b'<'),
        Just(b'>'),
        Just(b'['),
        Just(b'\\'),
        Just(0xC3u8),
        any::<u8>()
    ];
    prop_oneof![
        (any::<usize>(), special.clone()).prop_map(|(p, b)| Mutation::Flip(p, b)),
        (any::<usize>(), special).prop_map(|(p, b)| Mutation::Insert(p, b)),
        any::<usize>().prop_map(Mutation::Delete),
        any::<usize>().prop_map(Mutation::Truncate),
        (any::<usize>(), 1usize..40).prop_map(|(p, n)| Mutation::Dup(p, n)),
    ]
}

fn apply(mut v: Vec<u8>, ms: &[Mutation]) -> Vec<u8> {
    for m in ms {
        if v.is_empty() {
            break;
        }
        let n = v.len();
        match *m {
            Mutation::Flip(p, b) => v[p % n] = b,
            Mutation::Insert(p, b) => v.insert(p % (n + 1), b),
            Mutation::Delete(p) => {
                v.remove(p % n);
            }
            Mutation::Truncate(p) => v.truncate(p % (n + 1)),
            Mutation::Dup(p, len) => {
                let s = p % n;
                let e = (s + len).min(n);
                let chunk = v[s..e].to_vec();
                v.splice(s..s, chunk);
            }
        }
    }
    v
}

fn exercise(data: &[u8], proxies: &[Proxy]) {
    let _ = SipMsg::parse_loose(data);
    match (SipMsg::parse(data), SipMsg::parse_lazy(data)) {
        (Ok(s), Ok(l)) => ringway_sip::invariants::lazy_agrees(&s, &l),
        (Ok(_), Err(e)) => panic!("parse_lazy refused what parse accepts: {e}"),
        (Err(_), Ok(l)) => {
            let _ = (
                l.to_tag(),
                l.top_via(),
                l.vias().count(),
                l.contact().count(),
            );
        }
        (Err(_), Err(_)) => {}
    }
    if let Ok(m) = SipMsg::parse(data) {
        let _ = (m.call_id(), m.cseq(), m.from_tag(), m.to_tag(), m.expires());
        let _ = (m.vias().count(), m.routes().count(), m.contact().count());
        let mut out = Vec::new();
        if m.is_request() {
            let e = RequestEdits {
                via: Some(ViaEdit {
                    transport: "UDP",
                    sent_by: "192.0.2.10:5060",
                    branch: "z9hG4bKx",
                    alias: false,
                }),
                max_forwards: true,
                record_route: Some("sip:192.0.2.10:5060;lr"),
                record_route_inner: Some("sip:192.0.2.10:5060;transport=tcp;lr"),
                pop_routes: usize::from(m.routes().count() > 0),
                pop_last_route: m.routes().count() > 1,
                request_uri: Some("sip:x@192.0.2.9"),
                received: Some("192.0.2.1"),
                rport: Some(1),
                add_rport: true,
                strict_next_hop: None,
                route_set: None,
                path: None,
                remove: ringway_sip::edit::RemoveHeaders::default(),
            };
            if forward_request(&m, &e, &mut out).is_ok() {
                let f = SipMsg::parse(&out).expect("edited request must parse");
                assert_eq!(f.call_id(), m.call_id());
                assert_eq!(f.body(), m.body());
            }
        } else {
            let _ = forward_response(&m, &mut out);
        }
    }
    // Each proxy under the security invariants (ringway_sip::invariants::
    // Guarded): from the client, then the same bytes from the next hop.
    for (i, p) in proxies.iter().enumerate() {
        let mut guard = Guarded::new(p);
        assert!(guard.handle(i as u64, addr(UAC), data) <= 2);
        assert!(guard.handle(i as u64 + 1, addr(UAS), data) <= 2);
        guard.on_timer(40_000_000_000);
    }
}

/// Stateless and stateful, without and with digest authentication.
fn proxies() -> Vec<Proxy> {
    [Mode::Stateless, Mode::Stateful]
        .into_iter()
        .flat_map(|mode| [(mode, false), (mode, true)])
        .map(|(mode, auth)| {
            let mut proxy = Proxy::new(ProxyConfig {
                mode,
                local: addr(PROXY),
                route_to: Some(addr(UAS)),
                registrar: true,
                record_route: true,
                max_transactions: 64,
                domains: vec!["example.com".into()],
                auth: auth.then(|| AuthConfig {
                    key: NonceKey([1; 32]),
                    ..AuthConfig::default()
                }),
                ..ProxyConfig::default()
            });
            let mut users = HtdigestCredentials::default();
            users.add_password("alice", "example.com", "secret");
            proxy.set_credentials(std::sync::Arc::new(users));
            proxy
        })
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn mutated_messages_never_panic(seed in 0usize..5, ms in proptest::collection::vec(mutation(), 1..8)) {
        let data = apply(seeds()[seed].clone(), &ms);
        exercise(&data, &proxies());
    }

    #[test]
    fn random_bytes_never_panic(data in proptest::collection::vec(any::<u8>(), 0..600)) {
        exercise(&data, &proxies());
    }
}

#[test]
fn seeds_are_valid() {
    for s in seeds() {
        parse(&s);
    }
}
