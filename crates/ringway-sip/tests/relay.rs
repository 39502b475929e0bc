//! The relay policy in the proxy and dispatcher cores (issue 19 parts 1,
//! 2, 3 and 5): where requests may go, preloaded and own Routes, signed
//! Record-Route, ACK/CANCEL, loops, Max-Forwards, Via steering, forged
//! responses, reply sizes, copies from other sources, credentials and
//! identities. Fake clock; no sockets.

mod common;
use common::*;
use ringway_sip::auth::{Algorithm, HtdigestCredentials, NonceKey};
use ringway_sip::dispatch::{DispatchConfig, Dispatcher};
use ringway_sip::{
    Action, AuthConfig, DropReason, Mode, Proxy, ProxyConfig, RelayNets, SipMsg, TransportAddr,
};
use std::sync::Arc;

const FAR: &str = "203.0.113.7:5060";
const MODES: [Mode; 2] = [Mode::Stateless, Mode::Stateful];

fn cfg(mode: Mode) -> ProxyConfig {
    ProxyConfig {
        mode,
        local: addr(PROXY),
        route_to: Some(addr(UAS)),
        record_route: true,
        domains: vec!["example.com".into()],
        ..ProxyConfig::default()
    }
}

fn with_auth(mut config: ProxyConfig) -> Proxy {
    config.auth = Some(AuthConfig {
        key: NonceKey([3; 32]),
        ..AuthConfig::default()
    });
    let mut p = Proxy::new(config);
    let mut users = HtdigestCredentials::default();
    users.add_password("alice", "example.com", "secret");
    p.set_credentials(Arc::new(users));
    p
}

/// Every configuration: both modes, auth off and on.
fn proxies() -> Vec<(String, Proxy)> {
    MODES
        .into_iter()
        .flat_map(|mode| {
            [
                (format!("{mode:?}"), Proxy::new(cfg(mode))),
                (format!("{mode:?}+auth"), with_auth(cfg(mode))),
            ]
        })
        .collect()
}

fn tagged(message: Vec<u8>) -> Vec<u8> {
    String::from_utf8(message)
        .unwrap()
        .replace(
            "To: Bob <sip:bob@example.com>",
            "To: Bob <sip:bob@example.com>;tag=b1",
        )
        .into_bytes()
}

fn to(sent: &Sent, address: &str) -> Vec<Vec<u8>> {
    sent.iter()
        .filter(|(a, _)| *a == addr(address))
        .map(|(_, b)| b.clone())
        .collect()
}

#[test]
fn preloaded_routes_of_initial_requests_are_removed() {
    for (name, p) in proxies() {
        for (i, route) in [
            "Route: <sip:+19005550100@203.0.113.7>\r\n",
            "Route: <sip:203.0.113.7;lr>\r\n",
            "Route: <sip:192.0.2.10:5060;lr>, <sip:203.0.113.7;lr>\r\n",
        ]
        .iter()
        .enumerate()
        {
            let inv = invite(&format!("z9hG4bKpre{i}"), "sip:bob@example.com", route);
            // From another domain to ours: no challenge.
            let inv = String::from_utf8(inv)
                .unwrap()
                .replace("alice@example.com", "eve@example.org");
            let (o, sent) = handle(&p, 0, UAC, inv.as_bytes());
            assert_eq!(o.action, Action::Forwarded { copies: 1 }, "{name} {route}");
            assert!(to(&sent, FAR).is_empty(), "{name}");
            let fwd = to(&sent, UAS);
            let m = parse(&fwd[0]);
            assert_eq!(m.request_uri(), Some("sip:bob@example.com"), "{name}");
            assert_eq!(m.routes().count(), 0, "{name}");
        }
    }
}

#[test]
fn own_routes_are_consumed_in_one_pass() {
    for (name, p) in proxies() {
        let routes: String = (0..60)
            .map(|i| format!("Route: <sip:hop{i}@192.0.2.10:5060>\r\n"))
            .collect();
        for inv in [
            invite("z9hG4bKself1", "sip:bob@example.com", &routes),
            tagged(invite("z9hG4bKself2", "sip:bob@example.com", &routes)),
        ] {
            let inv = String::from_utf8(inv)
                .unwrap()
                .replace("alice@example.com", "eve@example.org");
            let (o, sent) = handle(&p, 0, UAC, inv.as_bytes());
            assert_eq!(o.action, Action::Forwarded { copies: 1 }, "{name}");
            assert!(sent.iter().all(|(a, _)| *a != addr(PROXY)), "{name}");
            let fwd = to(&sent, UAS);
            assert_eq!(parse(&fwd[0]).routes().count(), 0, "{name}");
        }
        assert_eq!(p.stats().requests_received, 2, "{name}");
    }
}

#[test]
fn in_dialog_requests_follow_only_routes_we_signed() {
    for mode in MODES {
        let p = Proxy::new(cfg(mode));
        let inv = invite("z9hG4bKdlg", "sip:bob@example.com", "");
        let (_, sent) = handle(&p, 0, UAC, &inv);
        let fwd = parse(&to(&sent, UAS)[0])
            .record_routes()
            .next()
            .unwrap()
            .uri
            .to_string();
        let bye = |route: &str, branch: &str, call: &str| {
            format!(
                "BYE sip:carol@203.0.113.7 SIP/2.0\r\nVia: SIP/2.0/UDP 192.0.2.2:5060;branch={branch}\r\n\
Route: <{route}>\r\nMax-Forwards: 70\r\nFrom: Bob <sip:bob@example.com>;tag=b1\r\n\
To: Alice <sip:alice@example.com>;tag=a1\r\nCall-ID: {call}\r\nCSeq: 2 BYE\r\nContent-Length: 0\r\n\r\n"
            )
        };
        let call = "call-z9hG4bKdlg@192.0.2.1";
        let (o, sent) = handle(&p, 1, UAS, bye(&fwd, "z9hG4bKb1", call).as_bytes());
        assert_eq!(o.action, Action::Forwarded { copies: 1 }, "{mode:?}");
        assert_eq!(sent.last().unwrap().0, addr(FAR));
        for (route, call) in [
            ("sip:192.0.2.10:5060;lr", call),
            ("sip:192.0.2.10:5060;lr;rw=AAAAAAAAAAA", call),
            (fwd.as_str(), "another-call"),
        ] {
            let (o, sent) = handle(&p, 2, UAS, bye(route, "z9hG4bKb2", call).as_bytes());
            assert_eq!(o.action, Action::Responded(403), "{mode:?} {route} {call}");
            assert!(to(&sent, FAR).is_empty());
        }
    }
}

#[test]
fn unmatched_ack_and_cancel_go_only_where_the_policy_allows() {
    for (name, p) in proxies() {
        for method in ["ACK", "CANCEL"] {
            let msg = String::from_utf8(tagged(invite(
                &format!("z9hG4bK{method}"),
                "sip:x@203.0.113.7",
                "",
            )))
            .unwrap()
            .replace("INVITE", method);
            let (o, sent) = handle(&p, 0, UAC, msg.as_bytes());
            assert_eq!(
                o.action,
                Action::Dropped(DropReason::NotRelayed),
                "{name} {method}"
            );
            assert!(sent.is_empty(), "{name}");
        }
    }
    // With a relay network for the target, they go.
    let mut c = cfg(Mode::Stateless);
    c.relay = RelayNets::Any;
    let p = Proxy::new(c);
    let cancel = String::from_utf8(invite("z9hG4bKc", "sip:x@203.0.113.7", ""))
        .unwrap()
        .replace("INVITE", "CANCEL");
    let (o, sent) = handle(&p, 0, UAC, cancel.as_bytes());
    assert_eq!(o.action, Action::Forwarded { copies: 1 });
    assert_eq!(sent[0].0, addr(FAR));
}

/// Digest credentials of alice for `method` `uri` with `nonce`.
fn alice(method: &str, uri: &str, nonce: &str, nc: u32) -> String {
    let ha1 = Algorithm::Sha256.ha1("alice", "example.com", "secret");
    let nc_text = format!("{nc:08x}");
    let response = Algorithm::Sha256.response(ha1.as_str(), nonce, &nc_text, "c0ffee", method, uri);
    format!(
        "Digest username=\"alice\", realm=\"example.com\", nonce=\"{nonce}\", uri=\"{uri}\", \
response=\"{response}\", algorithm=SHA-256, qop=auth, nc={nc_text}, cnonce=\"c0ffee\""
    )
}

fn nonce_of(challenge: &[u8]) -> String {
    let m = parse(challenge);
    let value = m.header("Proxy-Authenticate").next().unwrap();
    let start = value.find("nonce=\"").unwrap() + 7;
    value[start..].split('"').next().unwrap().to_string()
}

#[test]
fn authenticated_calls_go_anywhere_public_and_their_cancel_follows() {
    for mode in MODES {
        let p = with_auth(cfg(mode));
        let uri = "sip:carol@203.0.113.7";
        let first = invite("z9hG4bKa0", uri, "");
        let (o, sent) = handle(&p, 0, UAC, &first);
        assert_eq!(o.action, Action::Responded(407), "{mode:?}");
        let nonce = nonce_of(&sent[0].1);
        let inv = invite(
            "z9hG4bKa1",
            uri,
            &format!(
                "Proxy-Authorization: {}\r\nP-Asserted-Identity: <sip:boss@example.com>\r\n",
                alice("INVITE", uri, &nonce, 1)
            ),
        );
        let (o, sent) = handle(&p, 1, UAC, &inv);
        assert_eq!(o.action, Action::Forwarded { copies: 1 }, "{mode:?}");
        let fwd = to(&sent, FAR);
        let m = parse(&fwd[0]);
        // Our realm's credentials are consumed, the asserted identity of
        // an untrusted source removed.
        assert_eq!(m.header("Proxy-Authorization").count(), 0);
        assert_eq!(m.header("P-Asserted-Identity").count(), 0);
        // Its CANCEL (never authenticated) follows it; from elsewhere not.
        let cancel = String::from_utf8(inv.clone())
            .unwrap()
            .replace("INVITE", "CANCEL");
        let (o, sent) = handle(&p, 2, "192.0.2.66:5060", cancel.as_bytes());
        assert!(to(&sent, FAR).is_empty(), "{mode:?}: {o:?}");
        let (o, sent) = handle(&p, 3, UAC, cancel.as_bytes());
        assert!(
            matches!(o.action, Action::Forwarded { .. } | Action::Responded(200)),
            "{mode:?}: {o:?}"
        );
        assert!(
            !to(&sent, FAR).is_empty() || mode == Mode::Stateful,
            "{mode:?}"
        );
        // Loopback, link-local and our own IP stay out even authenticated.
        for target in [
            "sip:x@127.0.0.1:514",
            "sip:x@169.254.1.1",
            "sip:x@192.0.2.10:5070",
        ] {
            let (_, sent) = handle(&p, 4, UAC, &invite("z9hG4bKa2", target, ""));
            let nonce = nonce_of(&sent[0].1);
            let inv = invite(
                "z9hG4bKa3",
                target,
                &format!(
                    "Proxy-Authorization: {}\r\n",
                    alice("INVITE", target, &nonce, 1)
                ),
            );
            let (o, sent) = handle(&p, 5, UAC, &inv);
            assert_eq!(o.action, Action::Responded(403), "{mode:?} {target}");
            assert!(sent.iter().all(|(a, _)| *a == addr(UAC)));
        }
    }
}

#[test]
fn a_binding_at_our_own_address_is_a_loop_not_a_forward() {
    for mode in MODES {
        let mut c = cfg(mode);
        c.registrar = true;
        let p = Proxy::new(c);
        let reg = "REGISTER sip:example.com SIP/2.0\r\nVia: SIP/2.0/UDP 192.0.2.1:5060;branch=z9hG4bKr\r\n\
Max-Forwards: 70\r\nFrom: <sip:bob@example.com>;tag=r\r\nTo: <sip:bob@example.com>\r\nCall-ID: r\r\n\
CSeq: 1 REGISTER\r\nContact: <sip:bob@192.0.2.10:5060>\r\nContent-Length: 0\r\n\r\n";
        assert_eq!(
            handle(&p, 0, UAC, reg.as_bytes()).0.action,
            Action::Responded(200)
        );
        let (o, sent) = handle(&p, 1, UAC, &invite("z9hG4bKl", "sip:bob@example.com", ""));
        assert_eq!(o.action, Action::Responded(482), "{mode:?}");
        assert!(sent.iter().all(|(a, _)| *a == addr(UAC)));
    }
}

#[test]
fn max_forwards_is_capped_and_via_received_rport_come_from_the_source() {
    for mode in MODES {
        let p = Proxy::new(cfg(mode));
        let inv = String::from_utf8(invite("z9hG4bKmf", "sip:bob@example.com", ""))
            .unwrap()
            .replace("Max-Forwards: 70", "Max-Forwards: 255")
            .replace(
                "192.0.2.1:5060;branch=z9hG4bKmf",
                "192.0.2.1:5060;received=198.51.100.9;rport=53;maddr=198.51.100.9;branch=z9hG4bKmf",
            );
        let (_, sent) = handle(&p, 0, "192.0.2.1:5071", inv.as_bytes());
        let fwd = &to(&sent, UAS)[0];
        let m = parse(fwd);
        assert_eq!(m.max_forwards(), Some(69));
        let theirs = m.vias().nth(1).unwrap();
        assert_eq!(theirs.received, Some("192.0.2.1"));
        assert_eq!(theirs.rport, Some(5071));
        assert_eq!(theirs.response_target(), Some(addr("192.0.2.1:5071")));
        // The UAS's answer goes to the real source.
        let busy = response_to(fwd, 486, "Busy Here", "");
        let (_, back) = handle(&p, 1, UAS, &busy);
        assert!(
            back.iter()
                .any(|(a, b)| *a == addr("192.0.2.1:5071") && parse(b).status() == Some(486)),
            "{mode:?}: {back:?}"
        );
    }
}

#[test]
fn forged_responses_and_replayed_copies_are_not_reflected() {
    for mode in MODES {
        let p = Proxy::new(cfg(mode));
        let inv = invite("z9hG4bKfr", "sip:bob@example.com", "");
        let (_, sent) = handle(&p, 0, UAC, &inv);
        let fwd = to(&sent, UAS)[0].clone();
        // The UAS's answer with the second Via pointed elsewhere, and the
        // same with our branch's digits changed (no transaction matches).
        let forged = String::from_utf8(response_to(&fwd, 200, "OK", ""))
            .unwrap()
            .replace(
                "Via: SIP/2.0/UDP 192.0.2.1:5060;branch=z9hG4bKfr",
                "Via: SIP/2.0/UDP 198.51.100.9:53;branch=z9hG4bKfr",
            );
        let digit = forged.find("z9hG4bKrw").unwrap() + 9;
        let flipped = if &forged[digit..=digit] == "0" {
            "1"
        } else {
            "0"
        };
        let other_branch = format!("{}{flipped}{}", &forged[..digit], &forged[digit + 1..]);
        for response in [forged.clone(), other_branch] {
            let (o, sent) = handle(&p, 1, UAS, response.as_bytes());
            assert!(
                sent.iter().all(|(a, _)| *a != addr("198.51.100.9:53")),
                "{mode:?}: {o:?}"
            );
        }
        // A tiny malformed request would draw a reply many times its size.
        let (o, sent) = handle(&p, 2, UAC, b"A\r\nVia:x\r\n\r\n");
        assert_eq!(o.action, Action::Dropped(DropReason::ReplyTooLarge));
        assert!(sent.is_empty());
    }
}

#[test]
fn aors_are_user_at_domain_and_from_identities_canonical() {
    let mut c = cfg(Mode::Stateless);
    c.registrar = true;
    c.domains = vec!["a.test".into(), "b.test".into()];
    c.route_to = None;
    c.auth = Some(AuthConfig {
        key: NonceKey([3; 32]),
        ..AuthConfig::default()
    });
    let mut p = Proxy::new(c);
    let mut users = HtdigestCredentials::default();
    users.add_password("alice", "b.test", "secret");
    p.set_credentials(Arc::new(users));
    // alice of b.test registers with her realm's credentials.
    let reg = |auth: &str| {
        format!(
            "REGISTER sip:b.test SIP/2.0\r\nVia: SIP/2.0/UDP 192.0.2.1:5060;branch=z9hG4bKr{}\r\n\
Max-Forwards: 70\r\nFrom: <sip:alice@b.test>;tag=r\r\nTo: <sip:alice@b.test>\r\nCall-ID: r\r\n\
CSeq: {} REGISTER\r\nContact: <sip:alice@198.51.100.4>\r\n{auth}Content-Length: 0\r\n\r\n",
            auth.len(),
            1 + auth.len()
        )
    };
    let (_, sent) = handle(&p, 0, UAC, reg("").as_bytes());
    let m = parse(&sent[0].1);
    let value = m.header("WWW-Authenticate").next().unwrap();
    let start = value.find("nonce=\"").unwrap() + 7;
    let nonce = value[start..].split('"').next().unwrap();
    let ha1 = Algorithm::Sha256.ha1("alice", "b.test", "secret");
    let response = Algorithm::Sha256.response(
        ha1.as_str(),
        nonce,
        "00000001",
        "c",
        "REGISTER",
        "sip:b.test",
    );
    let auth = format!(
        "Authorization: Digest username=\"alice\", realm=\"b.test\", nonce=\"{nonce}\", uri=\"sip:b.test\", \
response=\"{response}\", algorithm=SHA-256, qop=auth, nc=00000001, cnonce=\"c\"\r\n"
    );
    let (o, _) = handle(&p, 1, UAC, reg(&auth).as_bytes());
    assert_eq!(o.action, Action::Responded(200));
    let store = p.store().unwrap();
    assert_eq!(store.lookup("alice@b.test", 2).unwrap().len(), 1);
    assert!(store.lookup("alice@a.test", 2).unwrap().is_empty());
    // A call to alice@a.test does not reach b.test's alice; to alice@b.test
    // (any spelling of the domain) it does.
    let call = |uri: &str, branch: &str| {
        String::from_utf8(invite(branch, uri, ""))
            .unwrap()
            .replace("alice@example.com", "eve@example.org")
    };
    let (o, sent) = handle(&p, 3, UAC, call("sip:alice@a.test", "z9hG4bKx1").as_bytes());
    assert_eq!(o.action, Action::Responded(404));
    assert!(sent.iter().all(|(a, _)| *a == addr(UAC)));
    let (o, sent) = handle(
        &p,
        4,
        UAC,
        call("sip:alice@B.TEST.", "z9hG4bKx2").as_bytes(),
    );
    assert_eq!(o.action, Action::Forwarded { copies: 1 });
    assert_eq!(sent[0].0, addr("198.51.100.4:5060"));
    // From one of our users with a port or a trailing dot: still ours,
    // challenged.
    for from in ["alice@a.test:5999", "alice@A.TEST."] {
        let inv = String::from_utf8(invite("z9hG4bKx3", "sip:bob@198.51.100.8", ""))
            .unwrap()
            .replace("alice@example.com", from);
        let (o, _) = handle(&p, 5, UAC, inv.as_bytes());
        assert_eq!(o.action, Action::Responded(407), "{from}");
    }
}

const D: &str = "192.0.2.100:5060";
const MEMBER: &str = "192.0.2.11:5060";

fn dispatcher(relay: RelayNets) -> Dispatcher {
    Dispatcher::new(DispatchConfig {
        local: addr(D),
        proxies: vec![TransportAddr::udp(addr(MEMBER))],
        secret: [5; 32],
        relay,
        ..DispatchConfig::default()
    })
}

fn dispatch(d: &Dispatcher, src: &str, msg: &[u8]) -> (Action, Sent) {
    let mut sent = Sent::new();
    let o = d
        .worker()
        .handle(0, addr(src), msg, &mut |to, b| sent.push((to, b.to_vec())));
    (o.action, sent)
}

#[test]
fn dispatcher_sends_outsiders_to_its_proxies_only() {
    let d = dispatcher(RelayNets::None);
    // A preloaded Route: ignored, to the proxy.
    let inv = invite(
        "z9hG4bKd1",
        "sip:bob@example.com",
        "Route: <sip:203.0.113.7;lr>\r\n",
    );
    let (o, sent) = dispatch(&d, UAC, &inv);
    assert_eq!(o, Action::Forwarded { copies: 1 });
    assert_eq!(sent[0].0, addr(MEMBER));
    assert_eq!(parse(&sent[0].1).routes().count(), 0);
    // In a dialog, a Route to elsewhere: refused; an ACK dropped.
    let bye = String::from_utf8(tagged(invite(
        "z9hG4bKd2",
        "sip:bob@203.0.113.7",
        "Route: <sip:203.0.113.7;lr>\r\n",
    )))
    .unwrap()
    .replace("INVITE", "BYE");
    let (o, sent) = dispatch(&d, UAC, bye.as_bytes());
    assert_eq!(o, Action::Responded(403));
    assert_eq!(sent[0].0, addr(UAC));
    let (o, sent) = dispatch(&d, UAC, bye.replace("BYE", "ACK").as_bytes());
    assert_eq!(o, Action::Dropped(DropReason::NotRelayed));
    assert!(sent.is_empty());
    // From its proxy, by Request-URI: anywhere public, loopback only when
    // named.
    let from_proxy = tagged(invite("z9hG4bKd3", "sip:bob@203.0.113.7", ""));
    assert_eq!(dispatch(&d, MEMBER, &from_proxy).1[0].0, addr(FAR));
    let local = tagged(invite("z9hG4bKd4", "sip:bob@127.0.0.1:5070", ""));
    assert_eq!(dispatch(&d, MEMBER, &local).0, Action::Responded(403));
    let d = dispatcher("127.0.0.0/8".parse().unwrap());
    assert_eq!(dispatch(&d, MEMBER, &local).1[0].0, addr("127.0.0.1:5070"));
}

/// A reload replaces the proxies (`set_proxies`): new requests go to the
/// new set only, a worker created before takes it at its next datagram,
/// and a removed proxy stays trusted for the in-dialog requests of its
/// calls (a Route to it from outside passes with no relay network; its own
/// requests go by Request-URI, as from a proxy).
#[test]
fn dispatcher_reload_replaces_the_proxies_and_keeps_a_removed_one_routable() {
    const NEW: &str = "192.0.2.12:5060";
    let d = dispatcher(RelayNets::None);
    let mut worker = d.worker();
    let inv = invite("z9hG4bKr1", "sip:bob@example.com", "");
    let mut sent = Sent::new();
    worker.handle(0, addr(UAC), &inv, &mut |to, b| sent.push((to, b.to_vec())));
    assert_eq!(sent[0].0, addr(MEMBER));
    d.set_proxies(&[TransportAddr::udp(addr(NEW))], RelayNets::None);
    assert_eq!(d.proxies(), [TransportAddr::udp(addr(NEW))]);
    let mut sent = Sent::new();
    worker.handle(0, addr(UAC), &inv, &mut |to, b| sent.push((to, b.to_vec())));
    assert_eq!(sent[0].0, addr(NEW), "the old worker took the new set");
    assert_eq!(d.stats().proxies.len(), 1);
    // In a dialog through the removed proxy: still routed to it.
    let bye = String::from_utf8(tagged(invite(
        "z9hG4bKr2",
        "sip:bob@203.0.113.7",
        &format!("Route: <sip:{MEMBER};lr>\r\n"),
    )))
    .unwrap()
    .replace("INVITE", "BYE");
    let (o, sent) = dispatch(&d, UAC, bye.as_bytes());
    assert_eq!(o, Action::Forwarded { copies: 1 });
    assert_eq!(sent[0].0, addr(MEMBER));
    // From the removed proxy, by Request-URI (not hashed to a proxy).
    let from_old = tagged(invite("z9hG4bKr3", "sip:bob@203.0.113.7", ""));
    assert_eq!(dispatch(&d, MEMBER, &from_old).1[0].0, addr(FAR));
    // A Route to a proxy never configured is refused as before.
    let elsewhere = bye.replace(MEMBER, "192.0.2.99:5060");
    assert_eq!(
        dispatch(&d, UAC, elsewhere.as_bytes()).0,
        Action::Responded(403)
    );
}

#[test]
fn dispatcher_relays_responses_only_to_where_requests_came_from() {
    let d = dispatcher(RelayNets::None);
    let inv = String::from_utf8(invite("z9hG4bKd5", "sip:bob@example.com", ""))
        .unwrap()
        .replace(
            ";branch=z9hG4bKd5",
            ";received=198.51.100.9;rport=53;branch=z9hG4bKd5;rport",
        );
    let (_, sent) = dispatch(&d, "192.0.2.1:5077", inv.as_bytes());
    let fwd = &sent[0].1;
    let answer = response_to(fwd, 486, "Busy Here", "");
    let (o, back) = dispatch(&d, MEMBER, &answer);
    assert_eq!(o, Action::Forwarded { copies: 1 });
    assert_eq!(back[0].0, addr("192.0.2.1:5077"));
    // The same answer with the second Via pointed elsewhere: dropped.
    let text = String::from_utf8(answer).unwrap();
    let forged = text.replace("received=192.0.2.1", "received=198.51.100.9");
    let (o, back) = dispatch(&d, MEMBER, forged.as_bytes());
    assert_eq!(o, Action::Dropped(DropReason::ResponseNotOurs));
    assert!(back.is_empty());
}

#[test]
fn dispatcher_probe_answers_must_carry_the_probe_nonce() {
    // A silent proxy whose answers an attacker forges (right member,
    // right sequence, wrong nonce) still goes out after three probes.
    let d = dispatcher(RelayNets::None);
    let mut w = d.worker();
    for t in 0..4u64 {
        let mut probe = Vec::new();
        w.on_timer(t * 1_000_000_000, &mut |_, b| probe = b.to_vec());
        let text = String::from_utf8(response_to(&probe, 200, "OK", "")).unwrap();
        let call_id = SipMsg::parse(&probe)
            .unwrap()
            .call_id()
            .unwrap()
            .to_string();
        let nonce = call_id
            .split('@')
            .next()
            .unwrap()
            .rsplit('-')
            .next()
            .unwrap();
        assert_eq!(nonce.len(), 16, "{call_id}");
        let forged = text.replace(nonce, "0000000000000000");
        w.handle(0, addr(MEMBER), forged.as_bytes(), &mut |_, _| {});
    }
    assert_eq!(d.stats().probe_answers, 0);
    assert!(!d.is_alive(0));
    // Genuine answers count.
    let d = dispatcher(RelayNets::None);
    let mut w = d.worker();
    for t in 0..3u64 {
        let mut probe = Vec::new();
        w.on_timer(t * 1_000_000_000, &mut |_, b| probe = b.to_vec());
        let answer = response_to(&probe, 200, "OK", "");
        w.handle(0, addr(MEMBER), &answer, &mut |_, _| {});
    }
    assert_eq!(d.stats().probe_answers, 3);
    assert!(d.is_alive(0));
}

#[test]
fn a_relayed_non_2xx_goes_upstream_at_most_three_times() {
    let p = Proxy::new(cfg(Mode::Stateful));
    let inv = invite("z9hG4bKg", "sip:bob@example.com", "");
    let (_, sent) = handle(&p, 0, UAC, &inv);
    let busy = response_to(&to(&sent, UAS)[0], 486, "Busy Here", "");
    let (_, sent) = handle(&p, 1, UAS, &busy);
    let mut upstream = to(&sent, UAC).len();
    let mut now = 1;
    while let Some(deadline) = p.next_deadline() {
        now = deadline.max(now);
        let (_, sent) = timer(&p, now);
        upstream += to(&sent, UAC).len();
    }
    assert_eq!(upstream, 3, "the 486 and two timer-G copies");
}
