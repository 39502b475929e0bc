//! Proxy core behaviour: call flows, response codes, transactions, timers,
//! CANCEL, registrar, overload. Fake clock; no sockets.

mod common;
use common::*;
use ringway_sip::proxy::{T1, TIMER_64T1};
use ringway_sip::{Action, DropReason, Method, Mode, MsgLabel, Proxy, ProxyConfig, RelayNets};

fn cfg(mode: Mode) -> ProxyConfig {
    ProxyConfig {
        mode,
        local: addr(PROXY),
        route_to: Some(addr(UAS)),
        registrar: false,
        record_route: true,
        max_transactions: 1000,
        domains: vec!["example.com".into()],
        ..ProxyConfig::default()
    }
}

fn sec(s: u64) -> u64 {
    s * 1_000_000_000
}

fn call_flow(mode: Mode) {
    let p = Proxy::new(cfg(mode));
    let inv = invite("z9hG4bKc1", "sip:bob@example.com", "");
    let (o, sent) = handle(&p, 0, UAC, &inv);
    assert_eq!(o.label, MsgLabel::Invite);
    assert_eq!(o.action, Action::Forwarded { copies: 1 });
    let fwd: Vec<_> = sent.iter().filter(|(a, _)| *a == addr(UAS)).collect();
    assert_eq!(fwd.len(), 1);
    if mode == Mode::Stateful {
        let trying: Vec<_> = sent.iter().filter(|(a, _)| *a == addr(UAC)).collect();
        assert_eq!(trying.len(), 1);
        assert_eq!(parse(&trying[0].1).status(), Some(100));
    } else {
        assert_eq!(sent.len(), 1);
    }
    let fwd_inv = fwd[0].1.clone();
    let m = parse(&fwd_inv);
    let vias: Vec<_> = m.vias().collect();
    assert_eq!(vias.len(), 2);
    assert_eq!(vias[0].host, "192.0.2.10");
    assert_eq!(vias[0].port, Some(5060));
    assert!(vias[0].branch.unwrap().starts_with("z9hG4bK"));
    assert_eq!(vias[1].branch, Some("z9hG4bKc1"));
    assert_eq!(m.max_forwards(), Some(69));
    // Our Record-Route, signed for this dialog.
    let record_route = m.record_routes().next().unwrap().uri.to_string();
    assert!(
        record_route.starts_with("sip:192.0.2.10:5060;lr;rw="),
        "{record_route}"
    );
    assert_eq!(m.request_uri(), Some("sip:bob@example.com"));
    assert_eq!(m.body(), b"v=0\r\n");
    let text = std::str::from_utf8(&fwd_inv).unwrap();
    assert!(text.starts_with(
        "INVITE sip:bob@example.com SIP/2.0\r\nVia: SIP/2.0/UDP 192.0.2.10:5060;branch=z9hG4bK"
    ));

    // Stateless: a retransmission is forwarded again with the same branch.
    // Stateful: absorbed and the 100 Trying repeated.
    let (o, sent) = handle(&p, 1000, UAC, &inv);
    if mode == Mode::Stateless {
        assert_eq!(o.action, Action::Forwarded { copies: 1 });
        assert_eq!(
            parse(&sent[0].1).top_via().unwrap().branch,
            vias[0].branch,
            "RFC 3261 16.11: retransmission gets the same branch"
        );
    } else {
        assert_eq!(o.action, Action::Absorbed);
        assert_eq!(sent.len(), 1);
        assert_eq!(sent[0].0, addr(UAC));
        assert_eq!(parse(&sent[0].1).status(), Some(100));
    }

    // 180 and 200 from the UAS go back to the UAC without our Via.
    for (code, reason) in [(180, "Ringing"), (200, "OK")] {
        let resp = response_to(
            &fwd_inv,
            code,
            reason,
            "Contact: <sip:bob@192.0.2.2:5060>\r\n",
        );
        let (o, sent) = handle(&p, 2000, UAS, &resp);
        assert_eq!(o.label, MsgLabel::Response(code));
        assert_eq!(o.action, Action::Forwarded { copies: 1 }, "{code}");
        assert_eq!(sent.len(), 1);
        assert_eq!(sent[0].0, addr(UAC));
        let r = parse(&sent[0].1);
        assert_eq!(r.status(), Some(code));
        assert_eq!(r.vias().count(), 1);
        assert_eq!(r.top_via().unwrap().branch, Some("z9hG4bKc1"));
        assert_eq!(r.record_routes().count(), 1);
    }

    // Stateful: the 2xx set up a dialog through us (a drain with
    // `--drain-dialogs` waits for it); its BYE ends it.
    let tracked = usize::from(mode == Mode::Stateful);
    assert_eq!(p.dialogs_open(), tracked);

    // ACK for the 2xx (new branch) follows the route set: Route = us.
    let ack = "ACK sip:bob@192.0.2.2:5060 SIP/2.0\r\n\
Via: SIP/2.0/UDP 192.0.2.1:5060;branch=z9hG4bKack1\r\n\
Route: <RR>\r\n\
Max-Forwards: 70\r\n\
From: Alice <sip:alice@example.com>;tag=a1\r\n\
To: Bob <sip:bob@example.com>;tag=b1\r\n\
Call-ID: call-z9hG4bKc1@192.0.2.1\r\n\
CSeq: 1 ACK\r\n\
Content-Length: 0\r\n\r\n"
        .replace("RR", &record_route);
    let (o, sent) = handle(&p, 3000, UAC, ack.as_bytes());
    assert_eq!(o.label, MsgLabel::Ack);
    assert_eq!(o.action, Action::Forwarded { copies: 1 });
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0].0, addr(UAS));
    let a = parse(&sent[0].1);
    assert_eq!(a.routes().count(), 0, "our Route consumed");
    assert_eq!(a.record_routes().count(), 0, "no RR on in-dialog requests");
    assert_eq!(a.method(), Some(Method::Ack));

    // BYE from the UAS to the UAC through us (the route set signed for
    // this dialog is what lets it reach the caller's address).
    let bye = "BYE sip:alice@192.0.2.1:5060 SIP/2.0\r\n\
Via: SIP/2.0/UDP 192.0.2.2:5060;branch=z9hG4bKbye1\r\n\
Route: <RR>\r\n\
Max-Forwards: 70\r\n\
From: Bob <sip:bob@example.com>;tag=b1\r\n\
To: Alice <sip:alice@example.com>;tag=a1\r\n\
Call-ID: call-z9hG4bKc1@192.0.2.1\r\n\
CSeq: 1 BYE\r\n\
Content-Length: 0\r\n\r\n"
        .replace("RR", &record_route);
    // Unsigned, our Route does not get it to an address nothing grants.
    let unsigned = bye.replace(&record_route, "sip:192.0.2.10:5060;lr");
    let (o, _) = handle(&p, 3500, UAS, unsigned.as_bytes());
    assert_eq!(o.action, Action::Responded(403));
    let (o, sent) = handle(&p, 4000, UAS, bye.as_bytes());
    assert_eq!(o.label, MsgLabel::Bye);
    assert_eq!(o.action, Action::Forwarded { copies: 1 });
    assert_eq!(sent[0].0, addr(UAC));
    assert_eq!(p.dialogs_open(), 0, "the callee's BYE ended it");
    assert_eq!(p.stats().dialogs_ended, tracked as u64);
    let fwd_bye = sent[0].1.clone();
    let ok = response_to(&fwd_bye, 200, "OK", "");
    let (o, sent) = handle(&p, 5000, UAC, &ok);
    assert_eq!(o.label, MsgLabel::ByeOk, "the 200 to BYE has its own label");
    assert_eq!(o.action, Action::Forwarded { copies: 1 });
    assert_eq!(sent[0].0, addr(UAS));
    assert_eq!(parse(&sent[0].1).cseq(), Some((1, Method::Bye)));
    let st = p.stats();
    assert_eq!(st.requests_received, 5);
    assert_eq!(st.responses_received, 3);
    assert_eq!(st.relay_refused, 1);
}

#[test]
fn stateless_call_flow() {
    call_flow(Mode::Stateless);
}

#[test]
fn stateful_call_flow() {
    call_flow(Mode::Stateful);
    let p = Proxy::new(cfg(Mode::Stateful));
    let inv = invite("z9hG4bKst", "sip:bob@example.com", "");
    handle(&p, 0, UAC, &inv);
    assert_eq!(p.stats().transactions_active, 1);
    assert_eq!(p.stats().responses_generated.get(&100), Some(&1));
}

fn one_response(p: &Proxy, msg: &[u8]) -> (Action, ringway_sip::SipMsg<'static>, u16) {
    let (o, sent) = handle(p, 0, UAC, msg);
    assert_eq!(sent.len(), 1, "{o:?}");
    assert_eq!(sent[0].0, addr(UAC));
    let bytes: &'static [u8] = Box::leak(sent[0].1.clone().into_boxed_slice());
    let m = parse(bytes);
    let code = m.status().unwrap();
    (o.action, m, code)
}

#[test]
fn response_codes() {
    for mode in [Mode::Stateless, Mode::Stateful] {
        let p = Proxy::new(cfg(mode));
        // 416 unsupported scheme
        let r = invite("z9hG4bK416", "tel:+15551234", "");
        let (a, m, c) = one_response(&p, &r);
        assert_eq!((a, c), (Action::Responded(416), 416));
        assert!(m.to_tag().is_some());
        // 483 Max-Forwards 0
        let r = String::from_utf8(invite("z9hG4bK483", "sip:bob@example.com", ""))
            .unwrap()
            .replace("Max-Forwards: 70", "Max-Forwards: 0");
        let (a, _, _) = one_response(&p, r.as_bytes());
        assert_eq!(a, Action::Responded(483));
        // 420 with Unsupported
        let r = invite(
            "z9hG4bK420",
            "sip:bob@example.com",
            "Proxy-Require: foo, bar\r\n",
        );
        let (a, m, _) = one_response(&p, &r);
        assert_eq!(a, Action::Responded(420));
        assert_eq!(m.header("Unsupported").next(), Some("foo, bar"));
        // 505
        let r = String::from_utf8(invite("z9hG4bK505", "sip:bob@example.com", ""))
            .unwrap()
            .replace(" SIP/2.0\r\n", " SIP/3.0\r\n");
        let (a, _, _) = one_response(&p, r.as_bytes());
        assert_eq!(a, Action::Responded(505));
        // 400 with a reason naming the problem
        let r = String::from_utf8(invite("z9hG4bK400", "sip:bob@example.com", ""))
            .unwrap()
            .replace("CSeq: 1 INVITE", "CSeq: 1 BYE");
        let (a, m, _) = one_response(&p, r.as_bytes());
        assert_eq!(a, Action::Responded(400));
        assert_eq!(m.reason(), Some("Bad Request - CSeq Method Mismatch"));
        let r = String::from_utf8(invite("z9hG4bK400b", "sip:bob@example.com", ""))
            .unwrap()
            .replace("Call-ID: call-z9hG4bK400b@192.0.2.1\r\n", "");
        let (o, sent) = handle(&p, 0, UAC, r.as_bytes());
        assert_eq!(o.action, Action::Responded(400));
        // Our own parser rejects a response lacking Call-ID, so read it loosely.
        let m = ringway_sip::SipMsg::parse_loose(&sent[0].1).unwrap();
        assert_eq!(m.reason(), Some("Bad Request - Missing Call-ID"));
        // OPTIONS to us -> 200
        let r = b"OPTIONS sip:192.0.2.10:5060 SIP/2.0\r\nVia: SIP/2.0/UDP 192.0.2.1:5060;branch=z9hG4bKo1\r\nMax-Forwards: 70\r\nFrom: <sip:a@example.com>;tag=1\r\nTo: <sip:192.0.2.10>\r\nCall-ID: o1\r\nCSeq: 1 OPTIONS\r\n\r\n";
        let (a, m, _) = one_response(&p, r);
        assert_eq!(a, Action::Responded(200));
        assert!(m.header("Allow").next().unwrap().contains("INVITE"));
        // 482 loop: our Via with the branch we would compute is present.
        let inv = invite("z9hG4bKloop", "sip:bob@example.com", "");
        let (_, sent) = handle(&p, 0, UAC, &inv);
        let looped = sent
            .iter()
            .find(|(a, _)| *a == addr(UAS))
            .unwrap()
            .1
            .clone();
        // The request comes back to us (e.g. UAS misconfigured to route to us)
        // with one more Via on top.
        let back = String::from_utf8(looped).unwrap().replacen(
            "Via: ",
            "Via: SIP/2.0/UDP 192.0.2.2:5060;branch=z9hG4bKuas\r\nVia: ",
            1,
        );
        let (o, sent) = handle(&p, 0, UAS, back.as_bytes());
        assert_eq!(o.action, Action::Responded(482), "{mode:?}");
        assert_eq!(parse(&sent[0].1).status(), Some(482));
        let st = p.stats();
        for c in [416, 483, 420, 505, 400, 200, 482] {
            assert!(st.responses_generated.contains_key(&c), "{c} {st:?}");
        }
    }
}

#[test]
fn no_dns_unknown_domain_gets_404() {
    let mut c = cfg(Mode::Stateless);
    c.route_to = None;
    let p = Proxy::new(c);
    let r = invite("z9hG4bKnd", "sip:bob@elsewhere.example.net", "");
    let (a, m, _) = one_response(&p, &r);
    assert_eq!(a, Action::Responded(404));
    assert_eq!(m.reason(), Some("Not Found"));
    // An IP-literal R-URI is not served: not relayed without a relay
    // network for it ...
    let r = invite("z9hG4bKip", "sip:bob@198.51.100.9:5070", "");
    let (a, m, _) = one_response(&p, &r);
    assert_eq!(a, Action::Responded(403));
    assert_eq!(m.reason(), Some("Forbidden - Not Relaying"));
    // ... with one, forwarded there directly.
    let mut c = cfg(Mode::Stateless);
    c.route_to = None;
    c.relay = "198.51.100.0/24".parse().unwrap();
    let p = Proxy::new(c);
    let (o, sent) = handle(&p, 0, UAC, &r);
    assert_eq!(o.action, Action::Forwarded { copies: 1 });
    assert_eq!(sent[0].0, addr("198.51.100.9:5070"));
    // ... but never to broadcast.
    let r = invite("z9hG4bKbc", "sip:bob@255.255.255.255", "");
    let (o, sent) = handle(&p, 0, UAC, &r);
    assert_eq!(o.action, Action::Dropped(DropReason::ForbiddenDestination));
    assert!(sent.is_empty());
}

#[test]
fn responses_dropped_and_counted() {
    let p = Proxy::new(cfg(Mode::Stateless));
    // malformed response
    let bad = b"SIP/2.0 2000 OK\r\nVia: SIP/2.0/UDP 192.0.2.10;branch=z9hG4bKx\r\n\r\n";
    let (o, sent) = handle(&p, 0, UAS, bad);
    assert_eq!(o.action, Action::Dropped(DropReason::MalformedResponse));
    assert!(sent.is_empty());
    // top Via not ours
    let inv = invite("z9hG4bKr1", "sip:bob@example.com", "");
    let resp = response_to(&inv, 200, "OK", "");
    let (o, _) = handle(&p, 0, UAS, &resp);
    assert_eq!(o.action, Action::Dropped(DropReason::ResponseNotOurs));
    // our Via but next Via is a host name without received: unroutable
    let inv2 = String::from_utf8(inv.clone())
        .unwrap()
        .replace("192.0.2.1:5060;branch", "client.example.com;branch");
    let (_, sent) = handle(&p, 0, UAC, inv2.as_bytes());
    // The proxy added received=192.0.2.1 so the response *is* routable.
    let resp = response_to(&sent[0].1, 180, "Ringing", "");
    let (o, sent) = handle(&p, 0, UAS, &resp);
    assert_eq!(o.action, Action::Forwarded { copies: 1 });
    assert_eq!(sent[0].0, addr(UAC));
    let st = p.stats();
    assert_eq!(st.drops.get("malformed_response"), Some(&1));
    assert_eq!(st.drops.get("response_via_not_ours"), Some(&1));
    // Keep-alive CRLF
    let (o, _) = handle(&p, 0, UAC, b"\r\n\r\n");
    assert_eq!(o.action, Action::Dropped(DropReason::KeepAlive));
}

#[test]
fn stateful_timers_retransmit_then_408() {
    let p = Proxy::new(cfg(Mode::Stateful));
    let inv = invite("z9hG4bKt1", "sip:bob@example.com", "");
    let (_, sent) = handle(&p, 0, UAC, &inv);
    let fwd = sent
        .iter()
        .find(|(a, _)| *a == addr(UAS))
        .unwrap()
        .1
        .clone();
    assert_eq!(p.next_deadline(), Some(T1));
    // Nothing due before T1.
    let (n, sent) = timer(&p, T1 - 1);
    assert_eq!((n, sent.len()), (0, 0));
    // Timer A: T1, 2T1, 4T1 ... identical retransmissions.
    let mut now = T1;
    let mut retrans = 0;
    let mut got408 = None;
    while now <= TIMER_64T1 {
        let (_, sent) = timer(&p, now);
        for (a, b) in sent {
            if a == addr(UAS) {
                assert_eq!(b, fwd);
                retrans += 1;
            } else {
                got408 = Some(b);
            }
        }
        now = p.next_deadline().unwrap();
    }
    assert_eq!(retrans, 6, "A fires at 1,2,4,8,16 s... before B at 32 s");
    let r408 = got408.expect("408 upstream on timer B");
    let r = parse(&r408);
    assert_eq!(r.status(), Some(408));
    assert_eq!(r.vias().count(), 1);
    assert_eq!(r.top_via().unwrap().branch, Some("z9hG4bKt1"));
    assert_eq!(p.stats().transactions_timed_out, 1);
    // Our own 408 goes once (no timer G towards a source nothing
    // verified); a retransmitted INVITE from the caller gets it again.
    assert_eq!(now, TIMER_64T1 * 2, "next: timer H, nothing before");
    let after_b = TIMER_64T1 + sec(2);
    let (_, sent) = timer(&p, after_b);
    assert!(sent.is_empty(), "{sent:?}");
    let (o, sent) = handle(&p, after_b, UAC, &inv);
    assert_eq!(o.action, Action::Absorbed);
    assert_eq!(sent, vec![(addr(UAC), r408.clone())]);
    // The same INVITE from elsewhere (a copy) gets nothing.
    let (o, sent) = handle(&p, after_b, "192.0.2.66:5060", &inv);
    assert_eq!(o.action, Action::Dropped(DropReason::SourceMismatch));
    assert!(sent.is_empty());
    let ack = format!(
        "ACK sip:bob@example.com SIP/2.0\r\nVia: SIP/2.0/UDP 192.0.2.1:5060;branch=z9hG4bKt1\r\nMax-Forwards: 70\r\nFrom: Alice <sip:alice@example.com>;tag=a1\r\nTo: Bob <sip:bob@example.com>;tag={}\r\nCall-ID: call-z9hG4bKt1@192.0.2.1\r\nCSeq: 1 ACK\r\n\r\n",
        r.to_tag().unwrap()
    );
    let (o, sent) = handle(&p, after_b + sec(1), UAC, ack.as_bytes());
    assert_eq!(o.action, Action::Absorbed);
    assert!(sent.is_empty());
    // Cleanup: table empties, no more deadlines.
    let (_, _) = timer(&p, now + sec(100));
    assert_eq!(p.stats().transactions_active, 0);
    assert_eq!(p.next_deadline(), None);
}

#[test]
fn stateful_non_invite_retransmissions_absorbed() {
    let p = Proxy::new(cfg(Mode::Stateful));
    let opt = b"OPTIONS sip:bob@example.com SIP/2.0\r\nVia: SIP/2.0/UDP 192.0.2.1:5060;branch=z9hG4bKn1\r\nMax-Forwards: 70\r\nFrom: <sip:a@example.com>;tag=1\r\nTo: <sip:bob@example.com>\r\nCall-ID: n1\r\nCSeq: 1 OPTIONS\r\n\r\n";
    let (o, sent) = handle(&p, 0, UAC, opt);
    assert_eq!(o.action, Action::Forwarded { copies: 1 });
    assert_eq!(sent.len(), 1, "no 100 for non-INVITE");
    let fwd = sent[0].1.clone();
    // request retransmission before any response: absorbed, nothing sent
    let (o, sent) = handle(&p, 10, UAC, opt);
    assert_eq!(o.action, Action::Absorbed);
    assert!(sent.is_empty());
    let ok = response_to(&fwd, 200, "OK", "");
    let (o, sent) = handle(&p, 20, UAS, &ok);
    assert_eq!(o.action, Action::Forwarded { copies: 1 });
    let up = sent[0].1.clone();
    // response retransmission: absorbed
    let (o, sent) = handle(&p, 30, UAS, &ok);
    assert_eq!(o.action, Action::Absorbed);
    assert!(sent.is_empty());
    // request retransmission after final: the final is resent upstream
    let (o, sent) = handle(&p, 40, UAC, opt);
    assert_eq!(o.action, Action::Absorbed);
    assert_eq!(sent, vec![(addr(UAC), up)]);
    assert_eq!(p.stats().retransmissions_absorbed, 3);
}

#[test]
fn stateful_cancel() {
    let p = Proxy::new(cfg(Mode::Stateful));
    let inv = invite("z9hG4bKcx", "sip:bob@example.com", "");
    let (_, sent) = handle(&p, 0, UAC, &inv);
    let fwd = sent
        .iter()
        .find(|(a, _)| *a == addr(UAS))
        .unwrap()
        .1
        .clone();
    let our_branch = parse(&fwd).top_via().unwrap().branch.unwrap().to_string();
    let (_, sent) = handle(&p, 100, UAS, &response_to(&fwd, 180, "Ringing", ""));
    assert_eq!(sent.len(), 1);
    let cancel = b"CANCEL sip:bob@example.com SIP/2.0\r\nVia: SIP/2.0/UDP 192.0.2.1:5060;branch=z9hG4bKcx\r\nMax-Forwards: 70\r\nFrom: Alice <sip:alice@example.com>;tag=a1\r\nTo: Bob <sip:bob@example.com>\r\nCall-ID: call-z9hG4bKcx@192.0.2.1\r\nCSeq: 1 CANCEL\r\nContent-Length: 0\r\n\r\n";
    let (o, sent) = handle(&p, 200, UAC, cancel);
    assert_eq!(o.label, MsgLabel::Cancel);
    assert_eq!(o.action, Action::Responded(200));
    assert_eq!(sent.len(), 2);
    let up = sent.iter().find(|(a, _)| *a == addr(UAC)).unwrap();
    let r = parse(&up.1);
    assert_eq!(
        (r.status(), r.cseq()),
        (Some(200), Some((1, Method::Cancel)))
    );
    let down = sent
        .iter()
        .find(|(a, _)| *a == addr(UAS))
        .unwrap()
        .1
        .clone();
    let c = parse(&down);
    assert_eq!(c.method(), Some(Method::Cancel));
    assert_eq!(c.top_via().unwrap().branch, Some(our_branch.as_str()));
    assert_eq!(c.vias().count(), 1);
    assert_eq!(c.request_uri(), Some("sip:bob@example.com"));
    assert_eq!(c.cseq(), Some((1, Method::Cancel)));
    // CANCEL retransmission from the UAC: our 200 again
    let (o, sent) = handle(&p, 250, UAC, cancel);
    assert_eq!(o.action, Action::Absorbed);
    assert_eq!(parse(&sent[0].1).status(), Some(200));
    // UAS: 200 to CANCEL (absorbed), 487 to INVITE (forwarded + ACK downstream)
    let (o, sent) = handle(&p, 300, UAS, &response_to(&down, 200, "OK", ""));
    assert_eq!(o.action, Action::Absorbed);
    assert!(sent.is_empty());
    let r487 = response_to(&fwd, 487, "Request Terminated", "");
    let (o, sent) = handle(&p, 400, UAS, &r487);
    assert_eq!(o.action, Action::Forwarded { copies: 1 });
    assert_eq!(sent.len(), 2);
    let ack = sent.iter().find(|(a, _)| *a == addr(UAS)).unwrap();
    let ack = parse(&ack.1);
    assert_eq!(ack.method(), Some(Method::Ack));
    assert_eq!(ack.to_tag(), Some("b1"));
    assert_eq!(ack.top_via().unwrap().branch, Some(our_branch.as_str()));
    let up = sent.iter().find(|(a, _)| *a == addr(UAC)).unwrap();
    assert_eq!(parse(&up.1).status(), Some(487));
    // 487 retransmitted by the UAS: absorbed, ACK repeated
    let (o, sent) = handle(&p, 500, UAS, &r487);
    assert_eq!(o.action, Action::Absorbed);
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0].0, addr(UAS));
    // UAC's ACK for the 487 is absorbed (hop-by-hop)
    let uac_ack = b"ACK sip:bob@example.com SIP/2.0\r\nVia: SIP/2.0/UDP 192.0.2.1:5060;branch=z9hG4bKcx\r\nMax-Forwards: 70\r\nFrom: Alice <sip:alice@example.com>;tag=a1\r\nTo: Bob <sip:bob@example.com>;tag=b1\r\nCall-ID: call-z9hG4bKcx@192.0.2.1\r\nCSeq: 1 ACK\r\nContent-Length: 0\r\n\r\n";
    let (o, sent) = handle(&p, 600, UAC, uac_ack);
    assert_eq!(o.action, Action::Absorbed);
    assert!(sent.is_empty());
    timer(&p, sec(100));
    assert_eq!(p.stats().transactions_active, 0);
}

/// RFC 3261 16.10 / 16.7: a CANCEL that matches no transaction (here its
/// branch differs from the INVITE's and it comes from another port, so the
/// RFC 2543 match does not apply either) is forwarded statelessly, and the
/// response to it, matching no client transaction, is forwarded upstream.
#[test]
fn unmatched_cancel_and_its_response_are_forwarded() {
    for mode in [Mode::Stateless, Mode::Stateful] {
        let p = Proxy::new(cfg(mode));
        let (_, sent) = handle(&p, 0, UAC, &invite("z9hG4bKum", "sip:bob@example.com", ""));
        let fwd = sent
            .iter()
            .find(|(a, _)| *a == addr(UAS))
            .unwrap()
            .1
            .clone();
        handle(&p, 100, UAS, &response_to(&fwd, 180, "Ringing", ""));
        let cancel = b"CANCEL sip:bob@example.com SIP/2.0\r\nVia: SIP/2.0/UDP 192.0.2.1:5060;branch=z9hG4bKother\r\nMax-Forwards: 70\r\nFrom: Alice <sip:alice@example.com>;tag=a1\r\nTo: Bob <sip:bob@example.com>\r\nCall-ID: call-z9hG4bKum@192.0.2.1\r\nCSeq: 1 CANCEL\r\nContent-Length: 0\r\n\r\n";
        let (o, sent) = handle(&p, 200, UAC_OTHER_PORT, cancel);
        assert_eq!(o.action, Action::Forwarded { copies: 1 }, "{mode:?}");
        assert_eq!(
            sent.len(),
            1,
            "{mode:?}: no local 200 for an unmatched CANCEL"
        );
        assert_eq!(sent[0].0, addr(UAS));
        let down = parse(&sent[0].1);
        assert_eq!(down.method(), Some(Method::Cancel));
        assert_eq!(down.vias().count(), 2, "{mode:?}: forwarded, not generated");
        // The UAS's 200 to that CANCEL goes back to the UAC.
        let (o, back) = handle(&p, 300, UAS, &response_to(&sent[0].1, 200, "OK", ""));
        assert_eq!(o.action, Action::Forwarded { copies: 1 }, "{mode:?}");
        assert_eq!(back.len(), 1);
        assert_eq!(back[0].0, addr(UAC));
        let r = parse(&back[0].1);
        assert_eq!(
            (r.status(), r.cseq()),
            (Some(200), Some((1, Method::Cancel)))
        );
        assert_eq!(r.top_via().unwrap().branch, Some("z9hG4bKother"));
        // Its retransmission is forwarded again (no state to absorb it).
        let (o, sent) = handle(&p, 400, UAC_OTHER_PORT, cancel);
        assert_eq!((o.action, sent.len()), (Action::Forwarded { copies: 1 }, 1));
    }
}

/// The UAC's source with another port (not the INVITE's source).
const UAC_OTHER_PORT: &str = "192.0.2.1:5070";

/// A CANCEL for `invite(branch)` with the given branch of its own.
fn cancel_for(invite_branch: &str, cancel_branch: &str) -> Vec<u8> {
    format!(
        "CANCEL sip:bob@example.com SIP/2.0\r\n\
Via: SIP/2.0/UDP 192.0.2.1:5060;branch={cancel_branch}\r\n\
Max-Forwards: 70\r\n\
From: Alice <sip:alice@example.com>;tag=a1\r\n\
To: Bob <sip:bob@example.com>\r\n\
Call-ID: call-{invite_branch}@192.0.2.1\r\n\
CSeq: 1 CANCEL\r\n\
Content-Length: 0\r\n\r\n"
    )
    .into_bytes()
}

/// RFC 3261 9.2 / Kamailio: a CANCEL whose branch matches no transaction
/// but whose Call-ID, From tag, To, CSeq number and Request-URI are a
/// pending INVITE's, from the INVITE's source, cancels that INVITE: 200 to
/// the UAC at once, our CANCEL downstream with the INVITE's branch, the
/// CANCEL's retransmissions absorbed, the 487 relayed. From another source
/// it matches nothing and is forwarded statelessly.
#[test]
fn cancel_with_its_own_branch_matches_the_rfc2543_way() {
    let p = Proxy::new(cfg(Mode::Stateful));
    let (_, sent) = handle(&p, 0, UAC, &invite("z9hG4bKm1", "sip:bob@example.com", ""));
    let fwd = sent
        .iter()
        .find(|(a, _)| *a == addr(UAS))
        .unwrap()
        .1
        .clone();
    let invite_branch = parse(&fwd).top_via().unwrap().branch.unwrap().to_string();
    handle(&p, 100, UAS, &response_to(&fwd, 180, "Ringing", ""));
    let cancel = cancel_for("z9hG4bKm1", "z9hG4bKown");

    // From another source: not ours to cancel, forwarded statelessly.
    let (o, sent) = handle(&p, 150, "192.0.2.66:5060", &cancel);
    assert_eq!(o.action, Action::Forwarded { copies: 1 });
    assert_eq!(parse(&sent[0].1).vias().count(), 2);
    assert_eq!(p.stats().cancels_matched_2543, 0);

    let (o, sent) = handle(&p, 200, UAC, &cancel);
    assert_eq!(o.action, Action::Responded(200));
    assert_eq!(sent.len(), 2, "200 upstream and our CANCEL downstream");
    let up = parse(&sent.iter().find(|(a, _)| *a == addr(UAC)).unwrap().1);
    assert_eq!(
        (up.status(), up.cseq(), up.top_via().unwrap().branch),
        (Some(200), Some((1, Method::Cancel)), Some("z9hG4bKown"))
    );
    let down = sent
        .iter()
        .find(|(a, _)| *a == addr(UAS))
        .unwrap()
        .1
        .clone();
    let c = parse(&down);
    assert_eq!(c.method(), Some(Method::Cancel));
    assert_eq!(c.vias().count(), 1, "generated hop by hop, not forwarded");
    assert_eq!(c.top_via().unwrap().branch, Some(invite_branch.as_str()));
    assert_eq!(p.stats().cancels_matched_2543, 1);

    // A retransmission of the CANCEL: our 200 again, nothing downstream.
    let (o, sent) = handle(&p, 250, UAC, &cancel);
    assert_eq!(o.action, Action::Absorbed);
    assert_eq!(sent.len(), 1);
    assert_eq!(
        (sent[0].0, parse(&sent[0].1).status()),
        (addr(UAC), Some(200))
    );

    // The UAS: 200 to our CANCEL absorbed, 487 relayed (and ACKed).
    let (o, sent) = handle(&p, 300, UAS, &response_to(&down, 200, "OK", ""));
    assert_eq!((o.action, sent.len()), (Action::Absorbed, 0));
    let (o, sent) = handle(
        &p,
        400,
        UAS,
        &response_to(&fwd, 487, "Request Terminated", ""),
    );
    assert_eq!(o.action, Action::Forwarded { copies: 1 });
    let up = sent.iter().find(|(a, _)| *a == addr(UAC)).unwrap();
    assert_eq!(parse(&up.1).status(), Some(487));

    // Once the INVITE transaction is gone, the same CANCEL matches nothing.
    timer(&p, sec(100));
    assert_eq!(p.stats().transactions_active, 0);
    let (o, _) = handle(&p, sec(101), UAC, &cancel_for("z9hG4bKm1", "z9hG4bKown2"));
    assert_eq!(o.action, Action::Forwarded { copies: 1 });
}

/// The RFC 2543 match before any provisional: 200 at once, our CANCEL only
/// after the first provisional (RFC 3261 9.1).
#[test]
fn rfc2543_cancel_before_a_provisional_waits_for_it() {
    let p = Proxy::new(cfg(Mode::Stateful));
    let (_, sent) = handle(&p, 0, UAC, &invite("z9hG4bKm2", "sip:bob@example.com", ""));
    let fwd = sent
        .iter()
        .find(|(a, _)| *a == addr(UAS))
        .unwrap()
        .1
        .clone();
    let (o, sent) = handle(&p, 10, UAC, &cancel_for("z9hG4bKm2", "z9hG4bKown"));
    assert_eq!(o.action, Action::Responded(200));
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0].0, addr(UAC));
    let (_, sent) = handle(&p, 20, UAS, &response_to(&fwd, 180, "Ringing", ""));
    let down: Vec<_> = sent.iter().filter(|(a, _)| *a == addr(UAS)).collect();
    assert_eq!(down.len(), 1, "our CANCEL after the provisional");
    assert_eq!(parse(&down[0].1).method(), Some(Method::Cancel));
    // Timer B/C: the cancelled INVITE would get 487, not 408.
    let (_, sent) = timer(&p, ringway_sip::proxy::TIMER_C + 30);
    let up: Vec<_> = sent.iter().filter(|(a, _)| *a == addr(UAC)).collect();
    assert_eq!(parse(&up[0].1).status(), Some(487));
}

#[test]
fn cancel_without_provisional_waits_then_487_on_timeout() {
    let p = Proxy::new(cfg(Mode::Stateful));
    let inv = invite("z9hG4bKcw", "sip:bob@example.com", "");
    handle(&p, 0, UAC, &inv);
    let cancel = b"CANCEL sip:bob@example.com SIP/2.0\r\nVia: SIP/2.0/UDP 192.0.2.1:5060;branch=z9hG4bKcw\r\nMax-Forwards: 70\r\nFrom: Alice <sip:alice@example.com>;tag=a1\r\nTo: Bob <sip:bob@example.com>\r\nCall-ID: call-z9hG4bKcw@192.0.2.1\r\nCSeq: 1 CANCEL\r\n\r\n";
    let (o, sent) = handle(&p, 10, UAC, cancel);
    assert_eq!(o.action, Action::Responded(200));
    // RFC 3261 9.1: no CANCEL downstream before a provisional response.
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0].0, addr(UAC));
    // Timer B: the cancelled INVITE gets 487 upstream.
    let (_, sent) = timer(&p, TIMER_64T1);
    let up: Vec<_> = sent.iter().filter(|(a, _)| *a == addr(UAC)).collect();
    assert_eq!(parse(&up[0].1).status(), Some(487));
}

#[test]
fn registrar_then_invite() {
    let mut c = cfg(Mode::Stateless);
    c.registrar = true;
    c.route_to = None;
    let p = Proxy::new(c);
    let reg = |contact: &str, expires: &str, cseq: u32| {
        format!("REGISTER sip:example.com SIP/2.0\r\nVia: SIP/2.0/UDP 192.0.2.3:5060;branch=z9hG4bKr{cseq}\r\nMax-Forwards: 70\r\nFrom: <sip:carol@example.com>;tag=r\r\nTo: <sip:carol@example.com>\r\nCall-ID: reg1\r\nCSeq: {cseq} REGISTER\r\nContact: {contact}\r\n{expires}Content-Length: 0\r\n\r\n").into_bytes()
    };
    let (o, sent) = handle(
        &p,
        0,
        "192.0.2.3:5060",
        &reg("<sip:carol@192.0.2.3:5062>", "Expires: 60\r\n", 1),
    );
    assert_eq!(o.label, MsgLabel::Register);
    assert_eq!(o.action, Action::Responded(200));
    let r = parse(&sent[0].1);
    let contacts: Vec<_> = r.contact().collect();
    assert_eq!(contacts.len(), 1);
    assert_eq!(contacts[0].uri, "sip:carol@192.0.2.3:5062");
    assert_eq!(contacts[0].param("expires"), Some(Some("60")));
    assert_eq!(p.stats().bindings, Some(1));

    // INVITE to the AOR goes to the contact with the R-URI rewritten.
    let inv = invite("z9hG4bKri", "sip:carol@example.com", "");
    let (o, sent) = handle(&p, sec(1), UAC, &inv);
    assert_eq!(o.action, Action::Forwarded { copies: 1 });
    assert_eq!(sent[0].0, addr("192.0.2.3:5062"));
    assert_eq!(
        parse(&sent[0].1).request_uri(),
        Some("sip:carol@192.0.2.3:5062")
    );
    // Unknown user at our domain: 404.
    let inv = invite("z9hG4bKru", "sip:nobody@example.com", "");
    let (o, _) = handle(&p, sec(1), UAC, &inv);
    assert_eq!(o.action, Action::Responded(404));
    // Binding expires (on_timer runs registrar expiry; next_deadline asks
    // for a sweep while bindings exist).
    assert!(p.next_deadline().is_some());
    timer(&p, sec(61));
    assert_eq!(p.stats().bindings, Some(0));
    let inv = invite("z9hG4bKrx", "sip:carol@example.com", "");
    let (o, _) = handle(&p, sec(62), UAC, &inv);
    assert_eq!(o.action, Action::Responded(404));
    // Contact param expires, then "*" with Expires: 0 removes everything.
    let (o, sent) = handle(
        &p,
        sec(70),
        "192.0.2.3:5060",
        &reg(
            "<sip:carol@192.0.2.3:5062>;expires=90, <sip:carol@192.0.2.4>",
            "",
            2,
        ),
    );
    assert_eq!(o.action, Action::Responded(200));
    let r = parse(&sent[0].1);
    let exps: Vec<_> = r
        .contact()
        .map(|c| c.param("expires").unwrap().unwrap().to_string())
        .collect();
    assert_eq!(exps.len(), 2);
    assert!(
        exps.contains(&"90".to_string()) && exps.contains(&"3600".to_string()),
        "{exps:?}"
    );
    let (o, sent) = handle(
        &p,
        sec(71),
        "192.0.2.3:5060",
        &reg("*", "Expires: 0\r\n", 3),
    );
    assert_eq!(o.action, Action::Responded(200));
    assert_eq!(parse(&sent[0].1).contact().count(), 0);
    assert_eq!(p.stats().bindings, Some(0));
    // "*" without Expires: 0 is a 400.
    let (o, _) = handle(&p, sec(72), "192.0.2.3:5060", &reg("*", "", 4));
    assert_eq!(o.action, Action::Responded(400));
}

#[test]
fn overload_503_and_bounded_table() {
    let mut c = cfg(Mode::Stateful);
    c.max_transactions = 2;
    let p = Proxy::new(c);
    for i in 0..2 {
        let (o, _) = handle(
            &p,
            0,
            UAC,
            &invite(&format!("z9hG4bKo{i}"), "sip:bob@example.com", ""),
        );
        assert_eq!(o.action, Action::Forwarded { copies: 1 });
    }
    let (o, sent) = handle(&p, 0, UAC, &invite("z9hG4bKo9", "sip:bob@example.com", ""));
    assert_eq!(o.action, Action::Responded(503));
    let r = parse(&sent[0].1);
    assert_eq!(r.header("Retry-After").next(), Some("5"));
    let opt = b"OPTIONS sip:bob@example.com SIP/2.0\r\nVia: SIP/2.0/UDP 192.0.2.1:5060;branch=z9hG4bKov\r\nMax-Forwards: 70\r\nFrom: <sip:a@example.com>;tag=1\r\nTo: <sip:bob@example.com>\r\nCall-ID: ov\r\nCSeq: 1 OPTIONS\r\n\r\n";
    let (o, sent) = handle(&p, 0, UAC, opt);
    assert_eq!(o.action, Action::Dropped(DropReason::Overload));
    assert!(sent.is_empty());
    let st = p.stats();
    assert_eq!(st.overload_sheds, 2);
    assert_eq!(st.transactions_active, 2);
    // Many more attempts never grow the table.
    for i in 0..500 {
        handle(
            &p,
            0,
            UAC,
            &invite(&format!("z9hG4bKm{i}"), "sip:bob@example.com", ""),
        );
    }
    assert_eq!(p.stats().transactions_active, 2);
    // After timeouts the table drains and accepts again.
    timer(&p, sec(40));
    timer(&p, sec(80));
    assert_eq!(p.stats().transactions_active, 0);
    let (o, _) = handle(
        &p,
        sec(81),
        UAC,
        &invite("z9hG4bKagain", "sip:bob@example.com", ""),
    );
    assert_eq!(o.action, Action::Forwarded { copies: 1 });
}

#[test]
fn overload_forwards_in_dialog_requests_statelessly() {
    let mut c = cfg(Mode::Stateful);
    c.max_transactions = 1;
    let p = Proxy::new(c);
    let (o, _) = handle(&p, 0, UAC, &invite("z9hG4bKof", "sip:bob@example.com", ""));
    assert_eq!(o.action, Action::Forwarded { copies: 1 });
    // A new call is shed ...
    let (o, _) = handle(&p, 0, UAC, &invite("z9hG4bKog", "sip:bob@example.com", ""));
    assert_eq!(o.action, Action::Responded(503));
    // ... but a BYE of a call already set up (To tag) still goes through,
    // without taking a transaction slot.
    let bye = b"BYE sip:bob@192.0.2.2:5060 SIP/2.0\r\nVia: SIP/2.0/UDP 192.0.2.1:5060;branch=z9hG4bKob\r\nMax-Forwards: 70\r\nFrom: <sip:a@example.com>;tag=1\r\nTo: <sip:bob@example.com>;tag=2\r\nCall-ID: of\r\nCSeq: 2 BYE\r\n\r\n";
    let (o, sent) = handle(&p, 0, UAC, bye);
    assert_eq!(o.action, Action::Forwarded { copies: 1 });
    assert_eq!(sent.len(), 1, "no 100 Trying for a non-INVITE");
    assert_eq!(sent[0].0, addr(UAS));
    assert_eq!(p.stats().transactions_active, 1);
    assert_eq!(p.stats().overload_stateless, 1);
    // Its 200 has no transaction and follows the Via stack back.
    let ok = response_to(&sent[0].1, 200, "OK", "");
    let (o, back) = handle(&p, 0, UAS, &ok);
    assert_eq!(o.action, Action::Forwarded { copies: 1 });
    assert_eq!(back[0].0, addr(UAC));
    assert_eq!(parse(&back[0].1).vias().count(), 1);
    // A To tag does not buy a REGISTER or OPTIONS past the shedding.
    let tagged = b"OPTIONS sip:bob@example.com SIP/2.0\r\nVia: SIP/2.0/UDP 192.0.2.1:5060;branch=z9hG4bKot\r\nMax-Forwards: 70\r\nFrom: <sip:a@example.com>;tag=1\r\nTo: <sip:bob@example.com>;tag=x\r\nCall-ID: ot\r\nCSeq: 1 OPTIONS\r\n\r\n";
    let (o, _) = handle(&p, 0, UAC, tagged);
    assert_eq!(o.action, Action::Dropped(DropReason::Overload));
    // An out-of-dialog non-INVITE is still shed.
    let opt = b"OPTIONS sip:bob@example.com SIP/2.0\r\nVia: SIP/2.0/UDP 192.0.2.1:5060;branch=z9hG4bKoo\r\nMax-Forwards: 70\r\nFrom: <sip:a@example.com>;tag=1\r\nTo: <sip:bob@example.com>\r\nCall-ID: oo\r\nCSeq: 1 OPTIONS\r\n\r\n";
    let (o, _) = handle(&p, 0, UAC, opt);
    assert_eq!(o.action, Action::Dropped(DropReason::Overload));
}

#[test]
fn strict_route_and_loose_route_multi() {
    let mut c = cfg(Mode::Stateless);
    c.route_to = None;
    c.relay = RelayNets::Any;
    let p = Proxy::new(c);
    // Routes are followed in a dialog (To tag); see preloaded_routes_*
    // for initial requests.
    let in_dialog = |branch: &str, ruri: &str, extra: &str| {
        String::from_utf8(invite(branch, ruri, extra))
            .unwrap()
            .replace(
                "To: Bob <sip:bob@example.com>",
                "To: Bob <sip:bob@example.com>;tag=b1",
            )
            .into_bytes()
    };
    // Loose route: first Route is us, next Route is an IP literal.
    let r = in_dialog(
        "z9hG4bKlr",
        "sip:bob@example.org",
        "Route: <sip:192.0.2.10:5060;lr>, <sip:198.51.100.20;lr>\r\n",
    );
    let (o, sent) = handle(&p, 0, UAC, &r);
    assert_eq!(o.action, Action::Forwarded { copies: 1 });
    assert_eq!(sent[0].0, addr("198.51.100.20:5060"));
    let m = parse(&sent[0].1);
    let routes: Vec<_> = m.routes().map(|r| r.uri).collect();
    assert_eq!(routes, vec!["sip:198.51.100.20;lr"]);
    assert_eq!(m.request_uri(), Some("sip:bob@example.org"));
    // Next hop is a strict router (no lr): it becomes the R-URI, the old
    // R-URI is appended to the Route set (RFC 3261 16.6 step 6).
    let r = in_dialog(
        "z9hG4bKsn",
        "sip:bob@example.org",
        "Route: <sip:192.0.2.10:5060;lr>\r\nRoute: <sip:198.51.100.50:5090>, <sip:198.51.100.51;lr>\r\n",
    );
    let (o, sent) = handle(&p, 0, UAC, &r);
    assert_eq!(o.action, Action::Forwarded { copies: 1 });
    assert_eq!(sent[0].0, addr("198.51.100.50:5090"));
    let m = parse(&sent[0].1);
    assert_eq!(m.request_uri(), Some("sip:198.51.100.50:5090"));
    let routes: Vec<_> = m.routes().map(|r| r.uri).collect();
    assert_eq!(routes, vec!["sip:198.51.100.51;lr", "sip:bob@example.org"]);
    // Strict routing fix-up: R-URI is our RR value; last Route becomes R-URI.
    let r = in_dialog(
        "z9hG4bKsr",
        "sip:192.0.2.10:5060;lr",
        "Route: <sip:bob@198.51.100.30:5080>\r\n",
    );
    let (o, sent) = handle(&p, 0, UAC, &r);
    assert_eq!(o.action, Action::Forwarded { copies: 1 });
    assert_eq!(sent[0].0, addr("198.51.100.30:5080"));
    let m = parse(&sent[0].1);
    assert_eq!(m.request_uri(), Some("sip:bob@198.51.100.30:5080"));
    assert_eq!(m.routes().count(), 0);
}

#[test]
fn labels() {
    assert_eq!(MsgLabel::Response(183).as_str(), "183");
    // Codes without a slot of their own are labelled by class (review S2).
    assert_eq!(MsgLabel::Response(699).to_string(), "6xx");
    assert_eq!(MsgLabel::Invite.as_str(), "INVITE");
    assert_eq!(MsgLabel::OtherRequest.as_str(), "other");
    assert_eq!(MsgLabel::ByeOk.as_str(), "200-BYE");
}

#[test]
fn never_sends_to_port_zero() {
    // Found by fuzzing: a malformed request whose Via says port 0 must not
    // make the proxy emit a 400 towards port 0.
    for mode in [Mode::Stateless, Mode::Stateful] {
        let p = Proxy::new(cfg(mode));
        let bad =
            b"INVITE sip:bob@example.com SIP/2.0\r\nVia: SIP/2.0/UDP 192.0.2.1t-Length: 0\r\n\r\n";
        let (o, sent) = handle(&p, 0, UAC, bad);
        assert_eq!(o.action, Action::Dropped(DropReason::ForbiddenDestination));
        assert!(sent.is_empty());
    }
}

#[test]
fn shared_across_threads() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Proxy>();
    for mode in [Mode::Stateless, Mode::Stateful] {
        let p = std::sync::Arc::new(Proxy::new(cfg(mode)));
        let threads: Vec<_> = (0..4)
            .map(|t| {
                let p = p.clone();
                std::thread::spawn(move || {
                    let mut worker = p.worker();
                    let mut sent = 0u64;
                    for i in 0..500u64 {
                        let inv = invite(&format!("z9hG4bKmt{t}x{i}"), "sip:bob@example.com", "");
                        worker.handle(i, addr(UAC), &inv, &mut |_, _| sent += 1);
                        if i % 50 == 0 {
                            worker.on_timer(i * 1_000_000_000, &mut |_, _| sent += 1);
                        }
                    }
                    sent
                })
            })
            .collect();
        let sent: u64 = threads.into_iter().map(|t| t.join().unwrap()).sum();
        let st = p.stats();
        assert_eq!(st.requests_received, 2000, "{mode:?}");
        assert_eq!(st.requests_forwarded, 2000);
        assert!(sent >= 2000);
        if mode == Mode::Stateful {
            assert_eq!(st.transactions_created, 2000);
            assert_eq!(st.responses_generated.get(&100), Some(&2000));
            // Everything drains once all timers have run.
            let mut worker = p.worker();
            for k in 1..10u64 {
                worker.on_timer(k * 100 * 1_000_000_000 + 1_000_000_000_000, &mut |_, _| {});
            }
            assert_eq!(p.stats().transactions_active, 0);
            assert_eq!(p.next_deadline(), None);
        }
    }
}

#[test]
fn downstream_100_is_hop_by_hop_in_stateful_mode() {
    for mode in [Mode::Stateless, Mode::Stateful] {
        let p = Proxy::new(cfg(mode));
        let inv = invite("z9hG4bKh100", "sip:bob@example.com", "");
        let (_, sent) = handle(&p, 0, UAC, &inv);
        let fwd = sent
            .iter()
            .find(|(a, _)| *a == addr(UAS))
            .unwrap()
            .1
            .clone();
        let (o, sent) = handle(&p, 10, UAS, &response_to(&fwd, 100, "Trying", ""));
        if mode == Mode::Stateful {
            assert_eq!(o.action, Action::Absorbed);
            assert!(sent.is_empty());
            // ... and it stopped timer A: no retransmission at T1.
            let (_, sent) = timer(&p, T1);
            assert!(sent.iter().all(|(a, _)| *a != addr(UAS)));
        } else {
            // A stateless proxy forwards every response.
            assert_eq!(o.action, Action::Forwarded { copies: 1 });
            assert_eq!(sent[0].0, addr(UAC));
        }
    }
}

#[test]
fn timer_c_cancels_downstream_and_late_cancel_still_gets_200() {
    let p = Proxy::new(cfg(Mode::Stateful));
    let inv = invite("z9hG4bKtc", "sip:bob@example.com", "");
    let (_, sent) = handle(&p, 0, UAC, &inv);
    let fwd = sent
        .iter()
        .find(|(a, _)| *a == addr(UAS))
        .unwrap()
        .1
        .clone();
    handle(&p, 10, UAS, &response_to(&fwd, 180, "Ringing", ""));
    // Timer C (180 s after the provisional): CANCEL downstream, 408 upstream.
    let (_, sent) = timer(&p, ringway_sip::proxy::TIMER_C + 10);
    let down: Vec<_> = sent.iter().filter(|(a, _)| *a == addr(UAS)).collect();
    let up: Vec<_> = sent.iter().filter(|(a, _)| *a == addr(UAC)).collect();
    assert_eq!(parse(&down[0].1).method(), Some(Method::Cancel));
    assert_eq!(parse(&up[0].1).status(), Some(408));
    assert_eq!(p.stats().transactions_timed_out, 1);
    // The UAC gives up too: its CANCEL is answered.
    let cancel = b"CANCEL sip:bob@example.com SIP/2.0\r\nVia: SIP/2.0/UDP 192.0.2.1:5060;branch=z9hG4bKtc\r\nMax-Forwards: 70\r\nFrom: Alice <sip:alice@example.com>;tag=a1\r\nTo: Bob <sip:bob@example.com>\r\nCall-ID: call-z9hG4bKtc@192.0.2.1\r\nCSeq: 1 CANCEL\r\n\r\n";
    let (o, sent) = handle(&p, ringway_sip::proxy::TIMER_C + 20, UAC, cancel);
    assert_eq!(o.action, Action::Responded(200));
    assert_eq!(parse(&sent[0].1).status(), Some(200));
    let (o, sent) = handle(&p, ringway_sip::proxy::TIMER_C + 30, UAC, cancel);
    assert_eq!(o.action, Action::Absorbed);
    assert_eq!(parse(&sent[0].1).status(), Some(200));
}

/// RFC 3261 10.3: Expires bounds (423 with Min-Expires, shortened to the
/// maximum), bounded contacts per AOR, Call-ID/CSeq ordering, `Contact: *`.
#[test]
fn registrar_rules() {
    let mut c = cfg(Mode::Stateless);
    c.registrar = true;
    c.registrar_policy = ringway_sip::RegistrarPolicy {
        min_expires: 60,
        max_expires: 7200,
        default_expires: 3600,
        max_contacts: 2,
        ..Default::default()
    };
    let p = Proxy::new(c);
    let reg = |call_id: &str, cseq: u32, contact: &str, expires: &str| {
        format!("REGISTER sip:example.com SIP/2.0\r\nVia: SIP/2.0/UDP 192.0.2.3:5060;branch=z9hG4bKrr{call_id}{cseq}\r\nMax-Forwards: 70\r\nFrom: <sip:dave@example.com>;tag=r\r\nTo: <sip:dave@example.com>\r\nCall-ID: {call_id}\r\nCSeq: {cseq} REGISTER\r\nContact: {contact}\r\n{expires}Content-Length: 0\r\n\r\n").into_bytes()
    };
    let send = |now: u64, msg: Vec<u8>| {
        let (o, sent) = handle(&p, now, "192.0.2.3:5060", &msg);
        (o.action, sent[0].1.clone())
    };
    let expires_of = |response: &[u8]| -> Vec<String> {
        parse(response)
            .contact()
            .map(|c| c.param("expires").unwrap().unwrap().to_string())
            .collect()
    };
    // Too brief: 423 with Min-Expires, nothing bound.
    let (action, r) = send(0, reg("x", 1, "<sip:dave@192.0.2.3>", "Expires: 30\r\n"));
    assert_eq!(action, Action::Responded(423));
    assert_eq!(parse(&r).header("Min-Expires").next(), Some("60"));
    assert_eq!(p.stats().bindings, Some(0));
    // Too long: shortened to the maximum.
    let (action, r) = send(
        0,
        reg("x", 2, "<sip:dave@192.0.2.3>", "Expires: 200000\r\n"),
    );
    assert_eq!(action, Action::Responded(200));
    assert_eq!(expires_of(&r), ["7200"]);
    // A second contact fits, a third does not: 403, nothing changed.
    assert_eq!(
        send(0, reg("x", 3, "<sip:dave@192.0.2.4>", "")).0,
        Action::Responded(200)
    );
    let (action, _) = send(
        0,
        reg("x", 4, "<sip:dave@192.0.2.5>, <sip:dave@192.0.2.6>", ""),
    );
    assert_eq!(action, Action::Responded(403));
    assert_eq!(p.stats().bindings, Some(2));
    // Replacing one while adding one stays within the bound.
    let (action, r) = send(
        0,
        reg(
            "x",
            5,
            "<sip:dave@192.0.2.4>;expires=0, <sip:dave@192.0.2.5>",
            "",
        ),
    );
    assert_eq!(action, Action::Responded(200));
    assert_eq!(expires_of(&r).len(), 2);
    // Ordering: the same Call-ID with a lower CSeq fails and changes nothing.
    let (action, _) = send(
        sec(1),
        reg("x", 4, "<sip:dave@192.0.2.5>", "Expires: 0\r\n"),
    );
    assert_eq!(action, Action::Responded(400));
    assert_eq!(p.stats().bindings, Some(2));
    // The same CSeq again (a retransmission) re-applies the same change.
    let (action, _) = send(
        sec(1),
        reg(
            "x",
            5,
            "<sip:dave@192.0.2.4>;expires=0, <sip:dave@192.0.2.5>",
            "",
        ),
    );
    assert_eq!(action, Action::Responded(200));
    // Another Call-ID replaces the binding whatever its CSeq.
    let (action, r) = send(
        sec(2),
        reg("y", 1, "<sip:dave@192.0.2.5>", "Expires: 120\r\n"),
    );
    assert_eq!(action, Action::Responded(200));
    assert!(expires_of(&r).contains(&"120".to_string()));
    // "*" from Call-ID y with a lower CSeq than its binding: refused.
    let (action, _) = send(sec(3), reg("y", 0, "*", "Expires: 0\r\n"));
    assert_eq!(action, Action::Responded(400));
    assert_eq!(p.stats().bindings, Some(2));
    // "*" with a higher CSeq removes every binding.
    let (action, r) = send(sec(4), reg("y", 2, "*", "Expires: 0\r\n"));
    assert_eq!(action, Action::Responded(200));
    assert!(expires_of(&r).is_empty());
    assert_eq!(p.stats().bindings, Some(0));
}

/// Flood protection: over the per-source limit, requests are dropped and
/// counted without an answer; other sources and responses are not
/// affected; a source that calms down is let through again.
#[test]
fn flood_limit_drops_and_counts_requests_of_one_source() {
    let mut c = cfg(Mode::Stateful);
    c.flood = Some(ringway_sip::FloodConfig {
        limit: 5,
        window: sec(1),
        table_size: 64,
        exempt: Vec::new(),
        ..Default::default()
    });
    let p = Proxy::new(c);
    let options = |n: u32| {
        format!("OPTIONS sip:bob@example.com SIP/2.0\r\nVia: SIP/2.0/UDP 192.0.2.1:5060;branch=z9hG4bKfl{n}\r\nMax-Forwards: 70\r\nFrom: <sip:alice@example.com>;tag=f\r\nTo: <sip:bob@example.com>\r\nCall-ID: flood{n}\r\nCSeq: 1 OPTIONS\r\nContent-Length: 0\r\n\r\n").into_bytes()
    };
    for n in 0..5 {
        let (o, sent) = handle(&p, u64::from(n), UAC, &options(n));
        assert_eq!((o.action, sent.len()), (Action::Forwarded { copies: 1 }, 1));
    }
    for n in 5..20 {
        let (o, sent) = handle(&p, u64::from(n), UAC, &options(n));
        assert_eq!(o.label, MsgLabel::Options);
        assert_eq!(o.action, Action::Dropped(DropReason::Flood));
        assert!(sent.is_empty(), "no answer to a possibly spoofed source");
    }
    // Another source passes. Responses from the flooding one are dropped
    // too since review S12 (they used to pass unlimited).
    let (o, _) = handle(&p, 30, "192.0.2.7:5060", &options(100));
    assert_eq!(o.action, Action::Forwarded { copies: 1 });
    let (o, _) = handle(&p, 31, UAC, &response_to(&options(101), 200, "OK", ""));
    assert_eq!(o.action, Action::Dropped(DropReason::Flood));
    let stats = p.stats();
    assert_eq!(stats.drops.get("flood"), Some(&16));
    assert_eq!(stats.flood_blocks, 1);
    assert_eq!(stats.flood_sources_tracked, 2);
    // Two windows later (one quiet window): through again.
    let (o, _) = handle(&p, sec(2) + 1, UAC, &options(200));
    assert_eq!(o.action, Action::Forwarded { copies: 1 });
    // The configured next hop (`route_to`) is exempt like our own address
    // (review S12): it carries everyone's responses. 100 of them (25
    // requests' worth, five times the limit) and 20 requests in one window.
    for n in 0..100u32 {
        let (o, _) = handle(
            &p,
            sec(4) + u64::from(n),
            UAS,
            &response_to(&options(300 + n), 200, "OK", ""),
        );
        assert_ne!(o.action, Action::Dropped(DropReason::Flood), "response {n}");
    }
    for n in 0..20u32 {
        let (o, _) = handle(&p, sec(4) + 200 + u64::from(n), UAS, &options(500 + n));
        assert_ne!(o.action, Action::Dropped(DropReason::Flood), "request {n}");
    }
    assert_eq!(p.stats().drops.get("flood"), Some(&16));
}

#[test]
fn a_response_with_no_via_left_after_ours_is_not_forwarded() {
    // Found by fuzzing (fuzz/corpus/sip_proxy/crash-no-via-left): a
    // "response" to the hop-by-hop ACK of a non-2xx carries only our Via;
    // it matched the INVITE's client transaction (an ACK's class) and went
    // upstream with no Via at all. RFC 3261 16.7 step 3: with no Via left
    // the response was meant for us; 17.1.3: a response matches a client
    // transaction only with the CSeq method of its request (an ACK is
    // never answered).
    for mode in [Mode::Stateless, Mode::Stateful] {
        let p = Proxy::new(cfg(mode));
        let inv = invite("z9hG4bKnv", "sip:bob@example.com", "");
        let (_, sent) = handle(&p, 0, UAC, &inv);
        let fwd = sent
            .iter()
            .find(|(a, _)| *a == addr(UAS))
            .unwrap()
            .1
            .clone();
        // Only our Via: what a response to a request we originated carries.
        let ours = parse(&fwd).vias().next().unwrap();
        let only_ours = String::from_utf8(response_to(&fwd, 180, "Ringing", ""))
            .unwrap()
            .split("\r\n")
            .filter(|l| !l.starts_with("Via:") || l.contains(ours.branch.unwrap()))
            .collect::<Vec<_>>()
            .join("\r\n");
        assert_eq!(parse(only_ours.as_bytes()).vias().count(), 1);
        let (o, sent) = handle(&p, 1, UAS, only_ours.as_bytes());
        assert!(sent.is_empty(), "{mode:?}: forwarded {sent:?}");
        assert!(matches!(o.action, Action::Dropped(_)), "{mode:?}: {o:?}");
        if mode == Mode::Stateful {
            // The ACK of a 486, answered: nothing goes upstream.
            let (_, sent) = handle(&p, 2, UAS, &response_to(&fwd, 486, "Busy Here", ""));
            let ack = sent
                .iter()
                .find(|(a, _)| *a == addr(UAS))
                .unwrap()
                .1
                .clone();
            assert_eq!(parse(&ack).method(), Some(Method::Ack));
            let (o, sent) = handle(&p, 3, UAS, &response_to(&ack, 200, "OK", ""));
            assert!(sent.is_empty(), "answer to an ACK forwarded: {sent:?}");
            assert!(matches!(o.action, Action::Dropped(_)), "{o:?}");
        }
    }
}

#[test]
fn a_route_that_cannot_be_a_request_uri_is_refused() {
    // Found by fuzzing (fuzz/corpus/sip_proxy/crash-nul-request-uri): a
    // strict next hop (Route without `lr`) with control characters became
    // the Request-URI of the forwarded INVITE, which no parser accepts.
    for mode in [Mode::Stateless, Mode::Stateful] {
        let p = Proxy::new(cfg(mode));
        let inv = invite(
            "z9hG4bKnul",
            "sip:bob@example.com",
            "Route: <sip:bob\0\0@198.51.100.30>\r\n",
        );
        let (o, sent) = handle(&p, 0, UAC, &inv);
        assert_eq!(o.action, Action::Responded(400), "{mode:?}");
        assert!(
            sent.iter().all(|(a, _)| *a == addr(UAC)),
            "{mode:?}: {sent:?}"
        );
        assert_eq!(parse(&sent.last().unwrap().1).status(), Some(400));
    }
}
