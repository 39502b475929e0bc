//! Digest authentication in the proxy core (RFC 3261 22, RFC 7616, RFC
//! 8760): challenges, verification, replays, stale nonces, bad input, and
//! the registrar's owner rule. Fake clock; no sockets.

mod common;
use common::*;
use ringway_sip::auth::{Algorithm, HtdigestCredentials, NonceKey};
use ringway_sip::{Action, AuthConfig, Mode, Proxy, ProxyConfig};
use std::sync::Arc;

const REALM: &str = "ringway.test";
const PHONE: &str = "192.0.2.3:5060";

fn sec(s: u64) -> u64 {
    s * 1_000_000_000
}

fn proxy(mode: Mode) -> Proxy {
    let mut p = Proxy::new(ProxyConfig {
        mode,
        local: addr(PROXY),
        route_to: Some(addr(UAS)),
        registrar: true,
        record_route: true,
        domains: vec![REALM.into()],
        auth: Some(AuthConfig {
            key: NonceKey([9; 32]),
            nonce_lifetime: sec(300),
            ..AuthConfig::default()
        }),
        ..ProxyConfig::default()
    });
    let mut users = HtdigestCredentials::default();
    users.add_password("alice", REALM, "secret");
    users.add_password("bob", REALM, "hunter2");
    p.set_credentials(Arc::new(users));
    p
}

/// A REGISTER from `from_user` for the AOR `aor_user`@ringway.test.
fn register(from_user: &str, aor_user: &str, cseq: u32, auth: Option<&str>) -> Vec<u8> {
    let auth = auth.map_or(String::new(), |a| format!("Authorization: {a}\r\n"));
    format!(
        "REGISTER sip:{REALM} SIP/2.0\r\n\
Via: SIP/2.0/UDP 192.0.2.3:5060;branch=z9hG4bKreg{cseq}\r\n\
Max-Forwards: 70\r\n\
From: <sip:{from_user}@{REALM}>;tag=r1\r\n\
To: <sip:{aor_user}@{REALM}>\r\n\
Call-ID: reg-{from_user}@192.0.2.3\r\n\
CSeq: {cseq} REGISTER\r\n\
Contact: <sip:{aor_user}@192.0.2.3:5062>\r\n\
Expires: 600\r\n\
{auth}Content-Length: 0\r\n\r\n"
    )
    .into_bytes()
}

/// An INVITE from `from` (user@host) to sip:carol@example.com.
fn invite_from(from: &str, branch: &str, auth: Option<&str>) -> Vec<u8> {
    let auth = auth.map_or(String::new(), |a| format!("Proxy-Authorization: {a}\r\n"));
    format!(
        "INVITE sip:carol@example.com SIP/2.0\r\n\
Via: SIP/2.0/UDP 192.0.2.1:5060;branch={branch}\r\n\
Max-Forwards: 70\r\n\
From: <sip:{from}>;tag=a1\r\n\
To: <sip:carol@example.com>\r\n\
Call-ID: call-{branch}\r\n\
CSeq: 1 INVITE\r\n\
{auth}Content-Length: 0\r\n\r\n"
    )
    .into_bytes()
}

/// One challenge header, read back.
#[derive(Debug)]
struct Challenge {
    realm: String,
    nonce: String,
    algorithm: String,
    stale: bool,
}

fn quoted(value: &str, name: &str) -> String {
    let start = value.find(&format!("{name}=\"")).unwrap() + name.len() + 2;
    let end = value[start..].find('"').unwrap();
    value[start..start + end].to_string()
}

/// The challenges of a 401/407, in order.
fn challenges(response: &[u8], header: &str) -> Vec<Challenge> {
    parse(response)
        .header(header)
        .map(|value| Challenge {
            realm: quoted(value, "realm"),
            nonce: quoted(value, "nonce"),
            algorithm: value
                .split("algorithm=")
                .nth(1)
                .unwrap()
                .split(',')
                .next()
                .unwrap()
                .to_string(),
            stale: value.contains("stale=true"),
        })
        .collect()
}

/// Digest credentials for a challenge.
#[allow(clippy::too_many_arguments)]
fn credentials(
    algorithm: Algorithm,
    user: &str,
    password: &str,
    nonce: &str,
    method: &str,
    uri: &str,
    nc: u32,
) -> String {
    let ha1 = algorithm.ha1(user, REALM, password);
    let nc = format!("{nc:08x}");
    let response = algorithm.response(ha1.as_str(), nonce, &nc, "c0ffee", method, uri);
    format!(
        "Digest username=\"{user}\", realm=\"{REALM}\", nonce=\"{nonce}\", uri=\"{uri}\", \
response=\"{response}\", algorithm={algorithm}, qop=auth, nc={nc}, cnonce=\"c0ffee\""
    )
}

/// Send a REGISTER and return the action and the response.
fn send(p: &Proxy, now: u64, msg: &[u8]) -> (Action, Vec<u8>) {
    let (o, sent) = handle(p, now, PHONE, msg);
    (
        o.action,
        sent.into_iter().next().map(|(_, b)| b).unwrap_or_default(),
    )
}

/// The nonce of a fresh challenge to a REGISTER.
fn fresh_nonce(p: &Proxy, now: u64, cseq: u32) -> String {
    let (action, response) = send(p, now, &register("alice", "alice", cseq, None));
    assert_eq!(action, Action::Responded(401));
    challenges(&response, "WWW-Authenticate")[0].nonce.clone()
}

#[test]
fn register_is_challenged_then_accepted_with_sha256_and_md5() {
    for mode in [Mode::Stateless, Mode::Stateful] {
        let p = proxy(mode);
        let (action, response) = send(&p, 0, &register("alice", "alice", 1, None));
        assert_eq!(action, Action::Responded(401), "{mode:?}");
        let c = challenges(&response, "WWW-Authenticate");
        assert_eq!(c.len(), 2, "one challenge per algorithm");
        assert_eq!(
            (c[0].algorithm.as_str(), c[1].algorithm.as_str()),
            ("SHA-256", "MD5")
        );
        assert_eq!(c[0].nonce, c[1].nonce);
        assert!(c.iter().all(|c| c.realm == REALM && !c.stale));
        assert!(parse(&response)
            .header("WWW-Authenticate")
            .all(|v| v.contains("qop=\"auth\"")));
        assert_eq!(p.stats().bindings, Some(0));

        let auth = credentials(
            Algorithm::Sha256,
            "alice",
            "secret",
            &c[0].nonce,
            "REGISTER",
            "sip:ringway.test",
            1,
        );
        let (action, response) = send(&p, sec(1), &register("alice", "alice", 2, Some(&auth)));
        assert_eq!(
            action,
            Action::Responded(200),
            "{mode:?}: {}",
            String::from_utf8_lossy(&response)
        );
        assert_eq!(p.stats().bindings, Some(1));
        // The same nonce with the next nc and MD5.
        let auth = credentials(
            Algorithm::Md5,
            "alice",
            "secret",
            &c[0].nonce,
            "REGISTER",
            "sip:ringway.test",
            2,
        );
        let (action, _) = send(&p, sec(2), &register("alice", "alice", 3, Some(&auth)));
        assert_eq!(action, Action::Responded(200), "{mode:?}");
        assert_eq!(p.stats().auth_accepted, 2);
    }
}

#[test]
fn replayed_authorization_gets_a_new_challenge() {
    for mode in [Mode::Stateless, Mode::Stateful] {
        let p = proxy(mode);
        let nonce = fresh_nonce(&p, 0, 1);
        let auth = credentials(
            Algorithm::Sha256,
            "alice",
            "secret",
            &nonce,
            "REGISTER",
            "sip:ringway.test",
            1,
        );
        let first = register("alice", "alice", 2, Some(&auth));
        assert_eq!(send(&p, sec(1), &first).0, Action::Responded(200));
        // The very same request again, from the same source (a
        // retransmission): verified again, same answer (local answers keep
        // no transaction in either mode).
        let (action, response) = send(&p, sec(2), &first);
        assert_eq!(parse(&response).status(), Some(200), "{mode:?}: {action:?}");
        // The same Authorization on another request: a replay.
        let (action, response) = send(&p, sec(3), &register("alice", "alice", 3, Some(&auth)));
        assert_eq!(action, Action::Responded(401), "{mode:?}");
        let c = challenges(&response, "WWW-Authenticate");
        assert!(!c[0].stale);
        assert_ne!(c[0].nonce, nonce, "a new nonce");
        assert_eq!(p.stats().auth_replays, 1, "{mode:?}");
        assert_eq!(p.stats().auth_accepted, 2);
        // The first request again, byte for byte, from another source: a
        // captured copy, not a retransmission.
        let (action, sent) = handle(&p, sec(4), "192.0.2.99:5060", &first);
        assert_eq!(action.action, Action::Responded(401), "{mode:?}");
        assert!(sent
            .iter()
            .all(|(to, _)| to.ip().to_string() == "192.0.2.99"));
        assert_eq!(p.stats().auth_replays, 2, "{mode:?}");
    }
}

#[test]
fn wrong_password_unknown_user_and_bad_credentials() {
    let p = proxy(Mode::Stateless);
    let nonce = fresh_nonce(&p, 0, 1);
    let uri = "sip:ringway.test";
    let wrong = credentials(Algorithm::Md5, "alice", "guess", &nonce, "REGISTER", uri, 1);
    assert_eq!(
        send(&p, 1, &register("alice", "alice", 2, Some(&wrong))).0,
        Action::Responded(403)
    );
    let unknown = credentials(Algorithm::Md5, "mallory", "x", &nonce, "REGISTER", uri, 2);
    assert_eq!(
        send(&p, 1, &register("mallory", "mallory", 3, Some(&unknown))).0,
        Action::Responded(403)
    );
    let other_uri = credentials(
        Algorithm::Md5,
        "alice",
        "secret",
        &nonce,
        "REGISTER",
        "sip:elsewhere",
        3,
    );
    assert_eq!(
        send(&p, 1, &register("alice", "alice", 4, Some(&other_uri))).0,
        Action::Responded(400)
    );
    for (i, bad) in [
        "Digest username=\"alice\", realm=\"ringway.test\", nonce=\"x",
        "Digest username=\"alice\" realm=\"ringway.test\"",
        "Digest username=\"alice\", realm=\"ringway.test\", nonce=\"n\", uri=\"sip:ringway.test\", response=\"not-hex\"",
        "Digest realm=\"ringway.test\", nc=zz",
        "Digest ,,,",
        "Digest username=\"alice\", realm=\"ringway.test\", nonce=\"n\", uri=\"sip:ringway.test\", response=\"00\", qop=auth, nc=00000001",
    ]
    .iter()
    .enumerate()
    {
        let (action, response) = send(&p, 1, &register("alice", "alice", 10 + i as u32, Some(bad)));
        assert_eq!(action, Action::Responded(400), "{bad}: {}", String::from_utf8_lossy(&response));
    }
    // Without qop (RFC 2069 style): no nc to detect replays by.
    let no_qop = format!(
        "Digest username=\"alice\", realm=\"{REALM}\", nonce=\"{nonce}\", uri=\"{uri}\", response=\"{}\"",
        "0".repeat(32)
    );
    assert_eq!(
        send(&p, 1, &register("alice", "alice", 20, Some(&no_qop))).0,
        Action::Responded(400)
    );
    // Credentials for another realm only: challenged, not refused.
    let other_realm = credentials(
        Algorithm::Md5,
        "alice",
        "secret",
        &nonce,
        "REGISTER",
        uri,
        5,
    )
    .replace("realm=\"ringway.test\"", "realm=\"elsewhere\"");
    assert_eq!(
        send(&p, 1, &register("alice", "alice", 21, Some(&other_realm))).0,
        Action::Responded(401)
    );
    // A nonce we did not issue (another key): a new challenge.
    let forged = credentials(
        Algorithm::Md5,
        "alice",
        "secret",
        &"0".repeat(64),
        "REGISTER",
        uri,
        1,
    );
    assert_eq!(
        send(&p, 1, &register("alice", "alice", 22, Some(&forged))).0,
        Action::Responded(401)
    );
    assert_eq!(p.stats().bindings, Some(0));
    assert!(p.stats().auth_refused >= 9);
}

#[test]
fn expired_nonce_gets_stale_challenge() {
    let p = proxy(Mode::Stateful);
    let nonce = fresh_nonce(&p, 0, 1);
    let auth = credentials(
        Algorithm::Sha256,
        "alice",
        "secret",
        &nonce,
        "REGISTER",
        "sip:ringway.test",
        1,
    );
    let (action, response) = send(&p, sec(301), &register("alice", "alice", 2, Some(&auth)));
    assert_eq!(action, Action::Responded(401));
    let c = challenges(&response, "WWW-Authenticate");
    assert!(c.iter().all(|c| c.stale), "{c:?}");
    assert_eq!(p.stats().auth_stale, 1);
    // With a wrong password an expired nonce is a 403, not stale.
    let wrong = credentials(
        Algorithm::Sha256,
        "alice",
        "guess",
        &nonce,
        "REGISTER",
        "sip:ringway.test",
        2,
    );
    assert_eq!(
        send(&p, sec(302), &register("alice", "alice", 3, Some(&wrong))).0,
        Action::Responded(403)
    );
}

/// RFC 3261 10.3 step 6: valid credentials of another user do not let
/// bob change alice's bindings.
#[test]
fn register_for_someone_elses_aor_is_forbidden() {
    let p = proxy(Mode::Stateful);
    let nonce = fresh_nonce(&p, 0, 1);
    let bob = credentials(
        Algorithm::Md5,
        "bob",
        "hunter2",
        &nonce,
        "REGISTER",
        "sip:ringway.test",
        1,
    );
    let (action, response) = send(&p, 1, &register("bob", "alice", 2, Some(&bob)));
    assert_eq!(
        action,
        Action::Responded(403),
        "{}",
        String::from_utf8_lossy(&response)
    );
    assert_eq!(p.stats().bindings, Some(0));
    // His own AOR is fine.
    let bob = credentials(
        Algorithm::Md5,
        "bob",
        "hunter2",
        &nonce,
        "REGISTER",
        "sip:ringway.test",
        2,
    );
    assert_eq!(
        send(&p, 2, &register("bob", "bob", 3, Some(&bob))).0,
        Action::Responded(200)
    );
    assert_eq!(p.stats().bindings, Some(1));
}

#[test]
fn requests_from_our_domain_get_407_and_others_are_not_relayed() {
    for mode in [Mode::Stateless, Mode::Stateful] {
        let p = proxy(mode);
        let (o, sent) = handle(
            &p,
            0,
            UAC,
            &invite_from("alice@ringway.test", "z9hG4bKi1", None),
        );
        assert_eq!(o.action, Action::Responded(407), "{mode:?}");
        let c = challenges(&sent[0].1, "Proxy-Authenticate");
        assert_eq!(c.len(), 2);
        // The ACK for the 407 is ours: absorbed, not forwarded.
        let ack = "ACK sip:carol@example.com SIP/2.0\r\nVia: SIP/2.0/UDP 192.0.2.1:5060;branch=z9hG4bKi1\r\n\
Max-Forwards: 70\r\nFrom: <sip:alice@ringway.test>;tag=a1\r\nTo: <sip:carol@example.com>;tag=TAG\r\n\
Call-ID: call-z9hG4bKi1\r\nCSeq: 1 ACK\r\nContent-Length: 0\r\n\r\n"
            .replace("TAG", parse(&sent[0].1).to_tag().unwrap());
        let (o, sent_ack) = handle(&p, 1, UAC, ack.as_bytes());
        assert_eq!(
            (o.action, sent_ack.len()),
            (Action::Absorbed, 0),
            "{mode:?}"
        );

        let auth = credentials(
            Algorithm::Sha256,
            "alice",
            "secret",
            &c[0].nonce,
            "INVITE",
            "sip:carol@example.com",
            1,
        );
        let (o, sent) = handle(
            &p,
            2,
            UAC,
            &invite_from("alice@ringway.test", "z9hG4bKi2", Some(&auth)),
        );
        assert_eq!(o.action, Action::Forwarded { copies: 1 }, "{mode:?}");
        let forwarded = &sent.iter().find(|(to, _)| *to == addr(UAS)).unwrap().1;
        let forwarded = parse(forwarded);
        // Our realm's credentials are consumed, not passed on.
        assert_eq!(forwarded.header("Proxy-Authorization").count(), 0);
        let record_route = forwarded.record_routes().next().unwrap().uri.to_string();
        assert!(record_route.contains(";rw="), "{record_route}");
        // alice's credentials with bob in From: refused.
        let auth = credentials(
            Algorithm::Sha256,
            "alice",
            "secret",
            &c[0].nonce,
            "INVITE",
            "sip:carol@example.com",
            2,
        );
        let (o, _) = handle(
            &p,
            3,
            UAC,
            &invite_from("bob@ringway.test", "z9hG4bKi3", Some(&auth)),
        );
        assert_eq!(o.action, Action::Responded(403), "{mode:?}");
        // From another domain to a domain that is not ours: not relayed.
        let (o, _) = handle(
            &p,
            4,
            UAC,
            &invite_from("eve@example.org", "z9hG4bKi4", None),
        );
        assert_eq!(o.action, Action::Responded(403), "{mode:?}");
        // From another domain to one of our users: no challenge (no
        // binding: on to route_to).
        let to_us = String::from_utf8(invite_from("eve@example.org", "z9hG4bKi5", None))
            .unwrap()
            .replace(
                "INVITE sip:carol@example.com",
                "INVITE sip:alice@ringway.test",
            );
        let (o, _) = handle(&p, 5, UAC, to_us.as_bytes());
        assert_eq!(o.action, Action::Forwarded { copies: 1 }, "{mode:?}");
        // A CANCEL is never challenged; nor is a request in a dialog we
        // Record-Routed.
        let cancel = String::from_utf8(invite_from("alice@ringway.test", "z9hG4bKi6", None))
            .unwrap()
            .replace("INVITE", "CANCEL");
        let (o, _) = handle(&p, 6, UAC, cancel.as_bytes());
        assert_eq!(o.action, Action::Forwarded { copies: 1 }, "{mode:?}");
        let bye = "BYE sip:carol@192.0.2.2:5060 SIP/2.0\r\nVia: SIP/2.0/UDP 192.0.2.1:5060;branch=z9hG4bKb1\r\n\
Route: <RR>\r\nMax-Forwards: 70\r\nFrom: <sip:alice@ringway.test>;tag=a1\r\n\
To: <sip:carol@example.com>;tag=c1\r\nCall-ID: call-z9hG4bKi2\r\nCSeq: 2 BYE\r\nContent-Length: 0\r\n\r\n"
            .replace("RR", &record_route);
        let (o, _) = handle(&p, 7, UAC, bye.as_bytes());
        assert_eq!(o.action, Action::Forwarded { copies: 1 }, "{mode:?}");
        // The callee's BYE (tags the other way round) is in the dialog too.
        let callee_bye = bye
            .replace(
                "From: <sip:alice@ringway.test>;tag=a1",
                "From: <sip:carol@example.com>;tag=c1",
            )
            .replace(
                "To: <sip:carol@example.com>;tag=c1",
                "To: <sip:alice@ringway.test>;tag=a1",
            )
            .replace("z9hG4bKb1", "z9hG4bKb0");
        let (o, _) = handle(&p, 7, UAS, callee_bye.as_bytes());
        assert_eq!(o.action, Action::Forwarded { copies: 1 }, "{mode:?}");
        // The same BYE without our Route, with our Route unsigned, or
        // signed for another dialog, is not in a dialog we hold.
        for (n, route) in [
            "",
            "Route: <sip:192.0.2.10:5060;lr>\r\n",
            "Route: <sip:192.0.2.10:5060;lr;rw=ABCDEFGHIJK>\r\n",
        ]
        .into_iter()
        .enumerate()
        {
            let other = bye
                .replace(&format!("Route: <{record_route}>\r\n"), route)
                .replace("z9hG4bKb1", &format!("z9hG4bKb2{n}"));
            let (o, _) = handle(&p, 8, UAC, other.as_bytes());
            assert_eq!(o.action, Action::Responded(407), "{mode:?} {route}");
        }
        let other_dialog = bye
            .replace("call-z9hG4bKi2", "call-other")
            .replace("z9hG4bKb1", "z9hG4bKb3");
        let (o, _) = handle(&p, 8, UAC, other_dialog.as_bytes());
        assert_eq!(o.action, Action::Responded(407), "{mode:?}");
    }
}

/// Proxies with one nonce key (as derived from a secret they share)
/// accept each other's challenges: a REGISTER challenged by A is accepted
/// at B. Once B's key changes (`set_nonce_key`, a reload), A's nonces get
/// a new challenge at B (not `stale`: not B's), and B's own work.
#[test]
fn a_shared_nonce_key_lets_one_proxy_accept_anothers_challenge() {
    let (a, b) = (proxy(Mode::Stateful), proxy(Mode::Stateful));
    let answer = |nonce: &str, cseq: u32| {
        let auth = credentials(
            Algorithm::Md5,
            "alice",
            "secret",
            nonce,
            "REGISTER",
            "sip:ringway.test",
            1,
        );
        register("alice", "alice", cseq, Some(&auth))
    };
    let from_a = fresh_nonce(&a, sec(1), 1);
    let (action, response) = send(&b, sec(2), &answer(&from_a, 2));
    assert_eq!(
        action,
        Action::Responded(200),
        "{}",
        String::from_utf8_lossy(&response)
    );
    assert!(b.set_nonce_key(NonceKey::derive(b"a secret only B has now")));
    let from_a = fresh_nonce(&a, sec(3), 3);
    let (action, response) = send(&b, sec(4), &answer(&from_a, 4));
    assert_eq!(action, Action::Responded(401));
    assert!(!challenges(&response, "WWW-Authenticate")[0].stale);
    let from_b = fresh_nonce(&b, sec(5), 5);
    let (action, _) = send(&b, sec(6), &answer(&from_b, 6));
    assert_eq!(action, Action::Responded(200));
    assert_eq!(b.stats().auth_accepted, 2);
    // Without authentication there is no key to set.
    let plain = Proxy::new(ProxyConfig::default());
    assert!(!plain.set_nonce_key(NonceKey([1; 32])));
}
