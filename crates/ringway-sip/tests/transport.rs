//! Connection transports in the core: Via and Record-Route name the
//! transport of each hop, responses go back over the connection their
//! request came on, UDP↔TCP switching puts in a double Record-Route whose
//! last consumed entry picks the far side's transport, requests to a
//! contact registered over a connection go over that connection, and
//! nothing is retransmitted over a reliable transport.

use ringway_sip::proxy::T1;
use ringway_sip::{
    build_response, Action, FlowId, Hop, Mode, Proxy, ProxyConfig, SipMsg, Transport, TransportAddr,
};
use std::net::SocketAddr;

const PROXY: &str = "192.0.2.10:5060";
const UAC: &str = "192.0.2.1:5060";
const UAS: &str = "192.0.2.2:5070";

fn addr(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

type Sent = Vec<(Hop, Vec<u8>)>;

fn proxy(mode: Mode, route_to_transport: Transport, registrar: bool) -> Proxy {
    Proxy::new(ProxyConfig {
        mode,
        local: addr(PROXY),
        route_to: (!registrar).then(|| addr(UAS)),
        route_to_transport,
        listeners: vec![TransportAddr {
            transport: Transport::Tcp,
            addr: addr(PROXY),
        }],
        record_route: true,
        registrar,
        domains: vec!["example.com".into()],
        ..ProxyConfig::default()
    })
}

fn handle(p: &Proxy, now: u64, from: Hop, msg: &[u8]) -> (Action, Sent) {
    let mut sent = Vec::new();
    let outcome = p
        .worker()
        .handle_from(now, from, msg, &mut |hop, b| sent.push((hop, b.to_vec())));
    (outcome.action, sent)
}

fn invite(via_transport: &str, branch: &str) -> Vec<u8> {
    format!(
        "INVITE sip:bob@example.com SIP/2.0\r\n\
Via: SIP/2.0/{via_transport} 192.0.2.1:5060;branch={branch}\r\n\
Max-Forwards: 70\r\nFrom: <sip:alice@example.com>;tag=a1\r\nTo: <sip:bob@example.com>\r\n\
Call-ID: {branch}@192.0.2.1\r\nCSeq: 1 INVITE\r\nContact: <sip:alice@192.0.2.1:5060>\r\n\
Content-Length: 0\r\n\r\n"
    )
    .into_bytes()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn record_routes(b: &[u8]) -> Vec<String> {
    let m = SipMsg::parse(b).unwrap();
    m.record_routes().map(|r| r.uri.to_string()).collect()
}

/// The UAS's answer to the forwarded request `fwd` (Vias and Record-Route
/// copied), with a Contact.
fn answer(fwd: &[u8], code: u16, reason: &str) -> Vec<u8> {
    let mut out = Vec::new();
    build_response(
        &SipMsg::parse(fwd).unwrap(),
        code,
        reason,
        &[("Contact", "<sip:bob@192.0.2.2:5070>")],
        Some("b1"),
        &mut out,
    );
    out
}

#[test]
fn udp_in_tcp_out_uses_tcp_via_and_a_double_record_route() {
    let p = proxy(Mode::Stateful, Transport::Tcp, false);
    let (action, sent) = handle(&p, 0, Hop::udp(addr(UAC)), &invite("UDP", "z9hG4bKu1"));
    assert_eq!(action, Action::Forwarded { copies: 1 });
    let (trying, fwd): (Vec<_>, Vec<_>) =
        sent.into_iter().partition(|(hop, _)| hop.addr == addr(UAC));
    assert_eq!(trying[0].0, Hop::udp(addr(UAC)), "100 Trying back over UDP");
    let (hop, fwd) = &fwd[0];
    assert_eq!(*hop, Hop::new(Transport::Tcp, addr(UAS)));
    assert!(
        text(fwd).contains("Via: SIP/2.0/TCP 192.0.2.10:5060;branch="),
        "{}",
        text(fwd)
    );
    let rr = record_routes(fwd);
    assert_eq!(rr.len(), 2, "{rr:?}");
    assert!(
        rr[0].starts_with("sip:192.0.2.10:5060;transport=tcp;lr"),
        "{rr:?}"
    );
    assert!(rr[1].starts_with("sip:192.0.2.10:5060;lr"), "{rr:?}");

    // The 200 comes back over the TCP connection: it goes up over UDP.
    let ok = answer(fwd, 200, "OK");
    let from_uas = Hop {
        flow: Some(FlowId(3)),
        ..Hop::new(Transport::Tcp, addr(UAS))
    };
    let (action, sent) = handle(&p, 1, from_uas, &ok);
    assert_eq!(action, Action::Forwarded { copies: 1 });
    assert_eq!(sent[0].0, Hop::udp(addr(UAC)));

    // In the dialog: the UAC's route set is the Record-Route reversed
    // (UDP entry first); having consumed both, the BYE leaves by TCP to
    // the UAS's Contact, which names no transport.
    let bye = |route: &str, via: &str, ruri: &str| {
        format!(
            "BYE {ruri} SIP/2.0\r\nVia: SIP/2.0/{via};branch=z9hG4bKbye1\r\n\
Route: {route}\r\nMax-Forwards: 70\r\nFrom: <sip:alice@example.com>;tag=a1\r\n\
To: <sip:bob@example.com>;tag=b1\r\nCall-ID: z9hG4bKu1@192.0.2.1\r\nCSeq: 2 BYE\r\n\
Content-Length: 0\r\n\r\n"
        )
        .into_bytes()
    };
    let uac_routes = format!("<{}>, <{}>", rr[1], rr[0]);
    let (action, sent) = handle(
        &p,
        2,
        Hop::udp(addr(UAC)),
        &bye(&uac_routes, "UDP 192.0.2.1:5060", "sip:bob@192.0.2.2:5070"),
    );
    assert_eq!(action, Action::Forwarded { copies: 1 });
    assert_eq!(sent[0].0, Hop::new(Transport::Tcp, addr(UAS)));
    assert!(text(&sent[0].1).contains("Via: SIP/2.0/TCP 192.0.2.10:5060"));
    // The UAS's route set is the Record-Route as received (TCP entry
    // first): its BYE leaves by UDP to the UAC's Contact.
    let uas_routes = format!("<{}>, <{}>", rr[0], rr[1]);
    let (action, sent) = handle(
        &p,
        3,
        from_uas,
        &bye(
            &uas_routes,
            "TCP 192.0.2.2:5070",
            "sip:alice@192.0.2.1:5060",
        ),
    );
    assert_eq!(action, Action::Forwarded { copies: 1 });
    assert_eq!(sent[0].0, Hop::udp(addr(UAC)));
    assert!(text(&sent[0].1).contains("Via: SIP/2.0/UDP 192.0.2.10:5060"));
}

#[test]
fn responses_go_back_over_the_connection_of_their_request() {
    for mode in [Mode::Stateless, Mode::Stateful] {
        let p = proxy(mode, Transport::Tcp, false);
        // The UAC connected from an ephemeral port; its Via names 5060.
        let from_uac = Hop {
            flow: Some(FlowId(7)),
            ..Hop::new(Transport::Tcp, addr("192.0.2.1:40000"))
        };
        let (_, sent) = handle(&p, 0, from_uac, &invite("TCP", "z9hG4bKt1"));
        let fwd = &sent
            .iter()
            .find(|(hop, _)| hop.addr == addr(UAS))
            .unwrap()
            .1;
        // Same transport on both sides: one Record-Route, naming TCP.
        let rr = record_routes(fwd);
        assert_eq!(rr.len(), 1, "{rr:?}");
        assert!(rr[0].contains(";transport=tcp"), "{rr:?}");
        if mode == Mode::Stateful {
            let trying = sent.iter().find(|(hop, _)| hop.addr != addr(UAS)).unwrap();
            assert_eq!(trying.0, from_uac, "100 Trying over the UAC's connection");
        }
        let (_, sent) = handle(
            &p,
            1,
            Hop::new(Transport::Tcp, addr(UAS)),
            &answer(fwd, 486, "Busy Here"),
        );
        let up = sent
            .iter()
            .find(|(hop, _)| hop.addr != addr(UAS))
            .unwrap_or_else(|| panic!("{mode:?}: {sent:?}"));
        match mode {
            // The transaction kept the connection.
            Mode::Stateful => assert_eq!(up.0, from_uac),
            // Stateless: the Via's received/rport and transport name it;
            // the driver finds the connection by address.
            Mode::Stateless => {
                assert_eq!(up.0, Hop::new(Transport::Tcp, addr("192.0.2.1:40000")))
            }
        }
        // A request we answer ourselves goes back the same way.
        let bad = text(&invite("TCP", "z9hG4bKt2")).replace("Max-Forwards: 70", "Max-Forwards: 0");
        let (action, sent) = handle(&p, 2, from_uac, bad.as_bytes());
        assert_eq!(action, Action::Responded(483));
        assert_eq!(sent[0].0, from_uac);
    }
}

#[test]
fn a_contact_registered_over_a_connection_is_called_over_it() {
    let p = proxy(Mode::Stateless, Transport::Udp, true);
    let phone = Hop {
        flow: Some(FlowId(11)),
        ..Hop::new(Transport::Tcp, addr("192.0.2.7:50123"))
    };
    let register = b"REGISTER sip:example.com SIP/2.0\r\n\
Via: SIP/2.0/TCP 10.0.0.7:5060;branch=z9hG4bKr1\r\nMax-Forwards: 70\r\n\
From: <sip:carol@example.com>;tag=r1\r\nTo: <sip:carol@example.com>\r\n\
Call-ID: reg1\r\nCSeq: 1 REGISTER\r\nContact: <sip:carol@10.0.0.7:5060;transport=tcp>\r\n\
Expires: 600\r\nContent-Length: 0\r\n\r\n";
    let (action, sent) = handle(&p, 0, phone, register);
    assert_eq!(action, Action::Responded(200));
    assert_eq!(sent[0].0, phone);
    let call = text(&invite("UDP", "z9hG4bKc1"))
        .replace("sip:bob@example.com SIP", "sip:carol@example.com SIP");
    let (action, sent) = handle(&p, 1, Hop::udp(addr(UAC)), call.as_bytes());
    assert_eq!(action, Action::Forwarded { copies: 1 });
    // Over the phone's connection (its private Contact address is not
    // reachable), with the Contact as Request-URI.
    assert_eq!(sent[0].0, phone);
    assert!(text(&sent[0].1).starts_with("INVITE sip:carol@10.0.0.7:5060;transport=tcp SIP/2.0"));
    assert!(text(&sent[0].1).contains("Via: SIP/2.0/TCP 192.0.2.10:5060"));
}

#[test]
fn nothing_is_retransmitted_over_a_reliable_transport() {
    for (transport, expected) in [(Transport::Udp, 1), (Transport::Tcp, 0)] {
        let p = proxy(Mode::Stateful, transport, false);
        handle(&p, 0, Hop::udp(addr(UAC)), &invite("UDP", "z9hG4bKr1"));
        let mut sent = 0;
        p.worker().on_timer_hops(T1, &mut |_, _| sent += 1);
        assert_eq!(sent, expected, "timer A over {transport}");
    }
}

#[test]
fn a_udp_only_proxy_sends_everything_over_udp() {
    let p = Proxy::new(ProxyConfig {
        mode: Mode::Stateless,
        local: addr(PROXY),
        record_route: true,
        relay: ringway_sip::RelayNets::Any,
        ..ProxyConfig::default()
    });
    let msg = text(&invite("UDP", "z9hG4bKo1")).replace(
        "sip:bob@example.com SIP",
        "sip:bob@192.0.2.2:5070;transport=tcp SIP",
    );
    let (action, sent) = handle(&p, 0, Hop::udp(addr(UAC)), msg.as_bytes());
    assert_eq!(action, Action::Forwarded { copies: 1 });
    assert_eq!(sent[0].0, Hop::udp(addr(UAS)));
    assert_eq!(record_routes(&sent[0].1).len(), 1);
}
