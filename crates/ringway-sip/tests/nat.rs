//! NAT handling in the core: a UDP registration's binding keeps its flow
//! (source address and port), calls go there with a signed flow token in
//! our Record-Route, and in-dialog requests carrying the token go over the
//! flow (RFC 5626 5.3); with NAT handling off the Contact is used. RFC 5626
//! outbound REGISTERs get `Require: outbound` and `Flow-Timer`, a second
//! REGISTER of the same instance and reg-id replaces the binding, and a
//! local response fills in `rport`/`received` (RFC 3581).

use ringway_sip::{build_response, Action, Hop, Mode, Proxy, ProxyConfig, SipMsg};
use std::net::SocketAddr;

const PROXY: &str = "192.0.2.10:5060";
/// The phone's public address (its NAT's mapping).
const PHONE_PUBLIC: &str = "198.51.100.7:40321";
/// The caller.
const UAC: &str = "192.0.2.1:5060";

fn addr(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

type Sent = Vec<(Hop, Vec<u8>)>;

fn proxy(nat: bool) -> Proxy {
    Proxy::new(ProxyConfig {
        mode: Mode::Stateful,
        local: addr(PROXY),
        record_route: true,
        registrar: true,
        nat,
        flow_timer: Some(29),
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

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn register(cseq: u32, contact: &str, extra: &str) -> Vec<u8> {
    format!(
        "REGISTER sip:example.com SIP/2.0\r\n\
Via: SIP/2.0/UDP 10.0.0.7:5060;branch=z9hG4bKreg{cseq};rport\r\nMax-Forwards: 70\r\n\
From: <sip:carol@example.com>;tag=r1\r\nTo: <sip:carol@example.com>\r\n\
Call-ID: reg1\r\nCSeq: {cseq} REGISTER\r\nContact: {contact}\r\n{extra}\
Expires: 600\r\nContent-Length: 0\r\n\r\n"
    )
    .into_bytes()
}

fn invite_carol() -> Vec<u8> {
    b"INVITE sip:carol@example.com SIP/2.0\r\n\
Via: SIP/2.0/UDP 192.0.2.1:5060;branch=z9hG4bKc1\r\n\
Max-Forwards: 70\r\nFrom: <sip:alice@example.com>;tag=a1\r\nTo: <sip:carol@example.com>\r\n\
Call-ID: call1@192.0.2.1\r\nCSeq: 1 INVITE\r\nContact: <sip:alice@192.0.2.1:5060>\r\n\
Content-Length: 0\r\n\r\n"
        .to_vec()
}

/// The caller's in-dialog request (`method`) built from the phone's 200
/// `ok`: Request-URI the phone's (private) Contact, Route the Record-Route.
fn in_dialog(method: &str, ok: &[u8]) -> Vec<u8> {
    let m = SipMsg::parse(ok).unwrap();
    let routes: Vec<String> = m.record_routes().map(|r| format!("<{}>", r.uri)).collect();
    format!(
        "{method} sip:carol@10.0.0.7:5060 SIP/2.0\r\n\
Via: SIP/2.0/UDP 192.0.2.1:5060;branch=z9hG4bK{method}1\r\n\
Route: {}\r\nMax-Forwards: 70\r\nFrom: <sip:alice@example.com>;tag=a1\r\n\
To: <sip:carol@example.com>;tag=c1\r\nCall-ID: call1@192.0.2.1\r\nCSeq: 2 {method}\r\n\
Content-Length: 0\r\n\r\n",
        routes.join(", ")
    )
    .into_bytes()
}

/// The phone's 200 to the forwarded INVITE: Record-Route copied, its
/// private Contact.
fn answer(invite: &[u8]) -> Vec<u8> {
    let m = SipMsg::parse(invite).unwrap();
    let rr: Vec<String> = m.record_routes().map(|r| format!("<{}>", r.uri)).collect();
    let rr = rr.join(", ");
    let mut ok = Vec::new();
    build_response(
        &m,
        200,
        "OK",
        &[
            ("Record-Route", &rr),
            ("Contact", "<sip:carol@10.0.0.7:5060>"),
        ],
        Some("c1"),
        &mut ok,
    );
    ok
}

/// Register carol from behind a NAT, call her, and send the caller's BYE
/// through the route set; where the INVITE and the BYE went.
fn call_through_nat(nat: bool) -> (Hop, String, Hop) {
    let p = proxy(nat);
    let phone = Hop::udp(addr(PHONE_PUBLIC));
    let (action, sent) = handle(&p, 0, phone, &register(1, "<sip:carol@10.0.0.7:5060>", ""));
    assert_eq!(action, Action::Responded(200));
    // rport asked: the answer goes to the source and says what it was.
    assert_eq!(sent[0].0, phone);
    assert!(
        text(&sent[0].1).contains(";rport=40321;received=198.51.100.7"),
        "{}",
        text(&sent[0].1)
    );
    let (_, sent) = handle(&p, 1, Hop::udp(addr(UAC)), &invite_carol());
    let (to, invite) = sent
        .iter()
        .find(|(_, b)| b.starts_with(b"INVITE"))
        .cloned()
        .expect("INVITE forwarded");
    let ok = answer(&invite);
    let (_, sent) = handle(&p, 2, phone, &ok);
    let ok_up = sent
        .iter()
        .find(|(_, b)| b.starts_with(b"SIP/2.0 200"))
        .expect("200 relayed")
        .1
        .clone();
    let (_, sent) = handle(&p, 3, Hop::udp(addr(UAC)), &in_dialog("BYE", &ok_up));
    let bye_to = sent
        .iter()
        .find(|(_, b)| b.starts_with(b"BYE"))
        .map(|(hop, _)| *hop)
        .unwrap_or_else(|| {
            panic!(
                "BYE not forwarded: {:?}",
                sent.iter().map(|(h, b)| (h, text(b))).collect::<Vec<_>>()
            )
        });
    (to, text(&invite), bye_to)
}

#[test]
fn with_nat_handling_calls_and_dialogs_follow_the_flow() {
    let (to, invite, bye_to) = call_through_nat(true);
    let phone = Hop::udp(addr(PHONE_PUBLIC));
    assert_eq!(to, phone, "the INVITE goes to the NAT's mapping");
    assert!(invite.starts_with("INVITE sip:carol@10.0.0.7:5060 SIP/2.0"));
    assert!(invite.contains(";ob-flow="), "{invite}");
    assert_eq!(bye_to, phone, "the BYE follows the flow token");
}

#[test]
fn without_nat_handling_the_private_contact_is_used() {
    let (to, invite, bye_to) = call_through_nat(false);
    let private = Hop::udp(addr("10.0.0.7:5060"));
    assert_eq!(to, private);
    assert!(!invite.contains(";ob-flow="), "{invite}");
    assert_eq!(bye_to, private);
}

#[test]
fn a_forged_or_altered_flow_token_is_not_followed() {
    let p = proxy(true);
    let phone = Hop::udp(addr(PHONE_PUBLIC));
    handle(&p, 0, phone, &register(1, "<sip:carol@10.0.0.7:5060>", ""));
    let (_, sent) = handle(&p, 1, Hop::udp(addr(UAC)), &invite_carol());
    let invite = sent.iter().find(|(_, b)| b.starts_with(b"INVITE")).unwrap();
    let ok = answer(&invite.1);
    let (_, sent) = handle(&p, 2, phone, &ok);
    let ok_up = text(
        &sent
            .iter()
            .find(|(_, b)| b.starts_with(b"SIP/2.0 200"))
            .unwrap()
            .1,
    );
    // Change a character of the address in the token: it still decodes to
    // a flow, but the MAC no longer matches, so the BYE goes by its
    // Request-URI (the private address), never to the forged address.
    let at = ok_up.find("ob-flow=").unwrap() + "ob-flow=".len() + 5;
    let mut forged = ok_up.clone();
    let first = &ok_up[at..at + 1];
    forged.replace_range(at..at + 1, if first == "A" { "B" } else { "A" });
    let (_, sent) = handle(
        &p,
        3,
        Hop::udp(addr(UAC)),
        &in_dialog("BYE", forged.as_bytes()),
    );
    let bye = sent.iter().find(|(_, b)| b.starts_with(b"BYE")).unwrap();
    assert_eq!(bye.0, Hop::udp(addr("10.0.0.7:5060")));
}

#[test]
fn outbound_registrations_get_flow_timer_and_replace_their_flow() {
    let p = proxy(true);
    let phone = Hop::udp(addr(PHONE_PUBLIC));
    let contact = |host: &str| {
        format!(
            "<sip:carol@{host}:5060>;+sip.instance=\"<urn:uuid:00000000-0000-1000-8000-000a95a0e128>\";reg-id=1"
        )
    };
    let (action, sent) = handle(
        &p,
        0,
        phone,
        &register(1, &contact("10.0.0.7"), "Supported: outbound, path\r\n"),
    );
    assert_eq!(action, Action::Responded(200));
    let ok = text(&sent[0].1);
    assert!(ok.contains("\r\nRequire: outbound\r\n"), "{ok}");
    assert!(ok.contains("\r\nFlow-Timer: 29\r\n"), "{ok}");
    assert!(ok.contains(";reg-id=1"), "{ok}");
    // The phone moved (a new private address), same instance and reg-id:
    // one binding, the new one.
    let (_, sent) = handle(
        &p,
        1,
        phone,
        &register(2, &contact("10.0.0.8"), "Supported: outbound\r\n"),
    );
    let ok = text(&sent[0].1);
    assert_eq!(ok.matches("\r\nContact: ").count(), 1, "{ok}");
    assert!(ok.contains("sip:carol@10.0.0.8:5060"), "{ok}");
    // Without Supported: outbound nothing of it is used.
    let (_, sent) = handle(&p, 2, phone, &register(3, "<sip:carol@10.0.0.9:5060>", ""));
    let ok = text(&sent[0].1);
    assert!(!ok.contains("Flow-Timer"), "{ok}");
}

#[test]
fn a_contact_at_the_source_ip_on_another_port_is_not_taken_for_nat() {
    // A UA that sends from one port and listens on another (or registers
    // a third party on its host): no NAT between, the Contact is used.
    let p = proxy(true);
    let from = Hop::udp(addr("192.0.2.50:5073"));
    handle(&p, 0, from, &register(1, "<sip:carol@192.0.2.50:5072>", ""));
    let (_, sent) = handle(&p, 1, Hop::udp(addr(UAC)), &invite_carol());
    let invite = sent.iter().find(|(_, b)| b.starts_with(b"INVITE")).unwrap();
    assert_eq!(invite.0, Hop::udp(addr("192.0.2.50:5072")));
    assert!(!text(&invite.1).contains("ob-flow"));
}
