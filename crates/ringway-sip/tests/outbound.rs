//! Browsers and edge proxies (RFC 7118, RFC 5626): a browser registers a
//! Contact whose host is a random `.invalid` name over its WebSocket; a
//! request for its AOR goes over that connection (the flow) and is never
//! routed by the `.invalid` host. As an edge proxy in front of another
//! registrar, we put the flow's token in our Path
//! (`<sip:TOKEN@proxy;lr;ob>`) when the REGISTER supports `path`; the
//! registrar's requests through that Path go out over the flow, and only a
//! token we signed for a Path is followed.

use ringway_sip::proxy::{NameAnswer, NameQuery, NameResolver, QueueFull, ResolvingRequest};
use ringway_sip::{
    Action, FlowId, FlowState, Hop, Mode, Proxy, ProxyConfig, RelayNets, SipMsg, Transport,
    TransportAddr,
};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

const PROXY: &str = "192.0.2.10:5060";
/// Our WebSocket listener.
const PROXY_WS: &str = "192.0.2.10:8443";
/// The registrar behind the edge proxy.
const REGISTRAR: &str = "192.0.2.20:5060";
/// The caller.
const UAC: &str = "192.0.2.1:5060";
const CONTACT: &str = "sip:k3j2h1@df7jal23ls0d.invalid;transport=ws";

fn addr(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

type Sent = Vec<(Hop, Vec<u8>)>;

/// A registrar for example.com (`edge`: false), or an edge proxy that
/// sends everything else to [`REGISTRAR`] (`edge`: true), with a WSS
/// listener.
fn proxy(edge: bool, nat: bool) -> Proxy {
    Proxy::new(config(edge, nat))
}

fn config(edge: bool, nat: bool) -> ProxyConfig {
    ProxyConfig {
        mode: Mode::Stateless,
        local: addr(PROXY),
        route_to: edge.then(|| addr(REGISTRAR)),
        listeners: vec![TransportAddr {
            transport: Transport::Wss,
            addr: addr(PROXY_WS),
        }],
        record_route: true,
        registrar: !edge,
        nat,
        domains: if edge {
            Vec::new()
        } else {
            vec!["example.com".into()]
        },
        ..ProxyConfig::default()
    }
}

/// The browser's WebSocket connection.
fn browser() -> Hop {
    Hop {
        flow: Some(FlowId(5)),
        ..Hop::new(Transport::Wss, addr("198.51.100.7:50123"))
    }
}

fn handle(p: &Proxy, from: Hop, msg: &[u8]) -> (Action, Sent) {
    let mut sent = Vec::new();
    let outcome = p
        .worker()
        .handle_from(0, from, msg, &mut |hop, b| sent.push((hop, b.to_vec())));
    (outcome.action, sent)
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// A REGISTER as JsSIP sends it (`.invalid` Via and Contact, outbound),
/// with this Supported header.
fn register(supported: &str) -> Vec<u8> {
    format!(
        "REGISTER sip:example.com SIP/2.0\r\n\
Via: SIP/2.0/WSS df7jal23ls0d.invalid;branch=z9hG4bKreg1\r\nMax-Forwards: 69\r\n\
To: <sip:carol@example.com>\r\nFrom: <sip:carol@example.com>;tag=r1\r\n\
Call-ID: reg1\r\nCSeq: 1 REGISTER\r\n\
Contact: <{CONTACT}>;+sip.ice;reg-id=1;+sip.instance=\"<urn:uuid:4c1b0a4e-1f5d-4a1e-9c55-0d2f0a7b9e11>\";expires=600\r\n\
Expires: 600\r\n{supported}Content-Length: 0\r\n\r\n"
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

/// An in-dialog request from `via` towards the browser's `.invalid`
/// Contact with this Route set.
fn in_dialog(method: &str, via: &str, routes: &str) -> Vec<u8> {
    format!(
        "{method} {CONTACT} SIP/2.0\r\n\
Via: SIP/2.0/UDP {via};branch=z9hG4bK{method}1\r\n\
Route: {routes}\r\nMax-Forwards: 70\r\nFrom: <sip:alice@example.com>;tag=a1\r\n\
To: <sip:carol@example.com>;tag=c1\r\nCall-ID: call1@192.0.2.1\r\nCSeq: 2 {method}\r\n\
Content-Length: 0\r\n\r\n"
    )
    .into_bytes()
}

/// The Record-Route values of `msg`, as a Route header value.
fn route_set(msg: &[u8]) -> String {
    let m = SipMsg::parse(msg).unwrap();
    let routes: Vec<String> = m.record_routes().map(|r| format!("<{}>", r.uri)).collect();
    routes.join(", ")
}

/// The one request `sent` holds starting with `method`.
fn sent_request(sent: &Sent, method: &str) -> (Hop, String) {
    let found = sent
        .iter()
        .find(|(_, b)| b.starts_with(method.as_bytes()))
        .unwrap_or_else(|| {
            panic!(
                "no {method} sent: {:?}",
                sent.iter().map(|(h, b)| (h, text(b))).collect::<Vec<_>>()
            )
        });
    (found.0, text(&found.1))
}

#[test]
fn a_browser_with_an_invalid_contact_is_called_over_its_websocket() {
    let p = proxy(false, true);
    let (action, sent) = handle(
        &p,
        browser(),
        &register("Supported: path,gruu,outbound\r\n"),
    );
    assert_eq!(action, Action::Responded(200));
    assert_eq!(
        sent[0].0,
        browser(),
        "the 200 goes back over the connection"
    );
    let (_, sent) = handle(&p, Hop::udp(addr(UAC)), &invite_carol());
    let (to, invite) = sent_request(&sent, "INVITE");
    assert_eq!(to, browser(), "over the REGISTER's connection");
    assert!(
        invite.starts_with(&format!("INVITE {CONTACT} SIP/2.0")),
        "{invite}"
    );
    assert!(
        invite.contains("Via: SIP/2.0/WSS 192.0.2.10:8443;"),
        "{invite}"
    );
    // Our Record-Route towards the browser carries the flow; the caller
    // reaches us over UDP by the other.
    let routes = route_set(invite.as_bytes());
    assert!(
        routes.starts_with("<sip:192.0.2.10:8443;transport=wss;lr;")
            && routes.contains(";ob-flow="),
        "{routes}"
    );
    // The caller's ACK and BYE to the `.invalid` Contact follow the token.
    for method in ["ACK", "BYE"] {
        let (_, sent) = handle(
            &p,
            Hop::udp(addr(UAC)),
            &in_dialog(method, "192.0.2.1:5060", &routes),
        );
        let (to, _) = sent_request(&sent, method);
        assert_eq!(to, browser(), "{method}");
    }
}

#[test]
fn an_invalid_contact_is_never_routed_by_its_host() {
    // Over UDP with NAT handling off no flow is stored: the `.invalid`
    // Contact is all there is, and it is not resolved.
    let p = proxy(false, false);
    let phone = Hop::udp(addr("198.51.100.7:40000"));
    let (action, _) = handle(&p, phone, &register(""));
    assert_eq!(action, Action::Responded(200));
    let (action, sent) = handle(&p, Hop::udp(addr(UAC)), &invite_carol());
    assert_eq!(action, Action::Responded(480));
    assert!(sent.iter().all(|(hop, _)| *hop == Hop::udp(addr(UAC))));
    // An in-dialog request to it without a token of ours: not relayed.
    let (action, sent) = handle(
        &p,
        Hop::udp(addr(UAC)),
        &in_dialog("BYE", "192.0.2.1:5060", "<sip:192.0.2.10:5060;lr>"),
    );
    assert_eq!(action, Action::Responded(404));
    assert!(sent.iter().all(|(hop, _)| *hop == Hop::udp(addr(UAC))));
}

/// A resolver that counts what it is asked and knows nothing.
#[derive(Default)]
struct Counting {
    asked: AtomicUsize,
}

impl NameResolver for Counting {
    fn cached(&self, _: &NameQuery) -> Option<NameAnswer> {
        self.asked.fetch_add(1, Ordering::Relaxed);
        None
    }

    fn submit(&self, _: ResolvingRequest) -> Result<(), QueueFull> {
        self.asked.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}

#[test]
fn a_proxy_that_resolves_names_never_resolves_an_invalid_host() {
    // Relaying anywhere: Request-URI names are resolved.
    let mut p = Proxy::new(ProxyConfig {
        relay: RelayNets::Any,
        ..config(false, false)
    });
    let resolver = Arc::new(Counting::default());
    p.set_name_resolver(resolver.clone());
    // An in-dialog request to a browser's Contact without a token of ours.
    let (action, _) = handle(
        &p,
        Hop::udp(addr(UAC)),
        &in_dialog("BYE", "192.0.2.1:5060", "<sip:192.0.2.10:5060;lr>"),
    );
    assert_eq!(action, Action::Responded(404));
    assert_eq!(resolver.asked.load(Ordering::Relaxed), 0);
    // A name that is not `.invalid` is asked for (the check above is not
    // vacuous).
    let other = text(&in_dialog(
        "BYE",
        "192.0.2.1:5060",
        "<sip:192.0.2.10:5060;lr>",
    ))
    .replace(".invalid;transport=ws", ".example;transport=ws");
    handle(&p, Hop::udp(addr(UAC)), other.as_bytes());
    assert!(resolver.asked.load(Ordering::Relaxed) > 0);
}

/// The REGISTER the edge proxy forwards to the registrar.
fn forwarded_register(p: &Proxy, from: Hop, supported: &str) -> String {
    let (action, sent) = handle(p, from, &register(supported));
    assert_eq!(action, Action::Forwarded { copies: 1 });
    let (to, register) = sent_request(&sent, "REGISTER");
    assert_eq!(to, Hop::udp(addr(REGISTRAR)));
    register
}

/// The Path value we wrote (the topmost).
fn our_path(register: &str) -> String {
    let m = SipMsg::parse(register.as_bytes()).unwrap();
    let value = m.header("Path").next().expect("a Path header");
    value.trim().to_string()
}

#[test]
fn an_edge_proxy_puts_the_flow_token_in_path() {
    let p = proxy(true, true);
    let register = forwarded_register(&p, browser(), "Supported: path,gruu,outbound\r\n");
    let path = our_path(&register);
    // `sip:TOKEN@us;lr;ob`: our address towards the registrar (UDP), the
    // token in the user part, `ob` because the REGISTER asked for outbound.
    let token = path
        .strip_prefix("<sip:")
        .and_then(|rest| rest.strip_suffix("@192.0.2.10:5060;lr;ob>"))
        .unwrap_or_else(|| panic!("{path}"));
    assert!(
        token.len() >= 20
            && token
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'),
        "{path}"
    );
    // Path without outbound: no `ob`.
    let register = forwarded_register(&p, browser(), "Supported: path\r\n");
    assert!(our_path(&register).ends_with(";lr>"), "{register}");
    // A UA that does not support Path gets none (RFC 3327 5.1).
    let register = forwarded_register(&p, browser(), "Supported: outbound\r\n");
    assert!(!register.contains("\r\nPath:"), "{register}");
    // A UDP phone: a Path with its flow when NAT handling is on, none
    // when it is off (its Contact is used as it is).
    let phone = Hop::udp(addr("198.51.100.7:40000"));
    let register = forwarded_register(&p, phone, "Supported: path\r\n");
    assert!(register.contains("\r\nPath: <sip:"), "{register}");
    let register = forwarded_register(&proxy(true, false), phone, "Supported: path\r\n");
    assert!(!register.contains("\r\nPath:"), "{register}");
}

#[test]
fn the_registrars_request_through_our_path_goes_over_the_flow() {
    let p = proxy(true, true);
    let path = our_path(&forwarded_register(
        &p,
        browser(),
        "Supported: path,gruu,outbound\r\n",
    ));
    // The registrar's INVITE: Route our Path, Request-URI the `.invalid`
    // Contact (RFC 3327 5.3).
    let invite = text(&invite_carol())
        .replace(
            "INVITE sip:carol@example.com SIP/2.0\r\n",
            &format!("INVITE {CONTACT} SIP/2.0\r\nRoute: {path}\r\n"),
        )
        .replace(
            "Via: SIP/2.0/UDP 192.0.2.1:5060;branch=z9hG4bKc1\r\n",
            "Via: SIP/2.0/UDP 192.0.2.20:5060;branch=z9hG4bKr9\r\n\
Via: SIP/2.0/UDP 192.0.2.1:5060;branch=z9hG4bKc1\r\n",
        );
    let registrar = Hop::udp(addr(REGISTRAR));
    let (_, sent) = handle(&p, registrar, invite.as_bytes());
    let (to, forwarded) = sent_request(&sent, "INVITE");
    assert_eq!(to, browser(), "{forwarded}");
    assert!(forwarded.starts_with(&format!("INVITE {CONTACT} SIP/2.0")));
    assert!(!forwarded.contains("\r\nRoute:"), "our Path is consumed");
    // Our Record-Route towards the browser carries the flow (a dialog
    // token): the registrar's BYE later in the dialog reaches it.
    let routes = route_set(forwarded.as_bytes());
    assert!(routes.contains(";ob-flow="), "{routes}");
    let (_, sent) = handle(&p, registrar, &in_dialog("BYE", REGISTRAR, &routes));
    assert_eq!(sent_request(&sent, "BYE").0, browser());
    // The browser's own request through our Path is routed as any other
    // (it came over the flow).
    let (_, sent) = handle(&p, browser(), invite.as_bytes());
    assert!(
        sent.iter().all(|(hop, _)| *hop != browser()),
        "not back to itself"
    );
}

#[test]
fn only_a_path_token_we_signed_is_followed() {
    let p = proxy(true, true);
    let path = our_path(&forwarded_register(&p, browser(), "Supported: path\r\n"));
    let token = path
        .strip_prefix("<sip:")
        .and_then(|rest| rest.split_once('@'))
        .map(|(token, _)| token.to_string())
        .unwrap();
    // The token of our Record-Route to the same flow (which callers see),
    // a token altered in one character, another proxy's token.
    let p_reg = proxy(false, true);
    handle(&p_reg, browser(), &register("Supported: outbound\r\n"));
    let (_, sent) = handle(&p_reg, Hop::udp(addr(UAC)), &invite_carol());
    let (_, rr_invite) = sent_request(&sent, "INVITE");
    let rr_token = rr_invite
        .split("ob-flow=")
        .nth(1)
        .and_then(|rest| rest.split(['>', ';']).next())
        .unwrap()
        .to_string();
    let mut altered = token.clone().into_bytes();
    altered[3] = if altered[3] == b'A' { b'B' } else { b'A' };
    let altered = String::from_utf8(altered).unwrap();
    let mut other = proxy(true, true);
    other.set_secret([9; 32]);
    let other_path = our_path(&forwarded_register(
        &other,
        browser(),
        "Supported: path\r\n",
    ));
    let other_token = other_path
        .strip_prefix("<sip:")
        .and_then(|rest| rest.split_once('@'))
        .map(|(token, _)| token.to_string())
        .unwrap();
    for bad in [rr_token, altered, other_token] {
        let invite = text(&invite_carol()).replace(
            "INVITE sip:carol@example.com SIP/2.0\r\n",
            &format!("INVITE {CONTACT} SIP/2.0\r\nRoute: <sip:{bad}@192.0.2.10:5060;lr;ob>\r\n"),
        );
        let (_, sent) = handle(&p, Hop::udp(addr(REGISTRAR)), invite.as_bytes());
        assert!(
            sent.iter().all(|(hop, _)| *hop != browser()),
            "{bad}: {:?}",
            sent.iter().map(|(h, b)| (h, text(b))).collect::<Vec<_>>()
        );
    }
}

/// The driver's connections as a test sets them: only the browser's
/// connection, open or gone.
struct BrowserConnection(AtomicBool);

impl FlowState for BrowserConnection {
    fn is_open(&self, flow: FlowId) -> bool {
        flow == browser().flow.unwrap() && self.0.load(Ordering::Relaxed)
    }
}

/// The status line of the one response in `sent`, and where it went.
fn response_line(sent: &Sent) -> (Hop, String) {
    let (hop, bytes) = sent
        .iter()
        .find(|(_, b)| b.starts_with(b"SIP/2.0 "))
        .unwrap_or_else(|| panic!("no response: {sent:?}"));
    let line = text(bytes).lines().next().unwrap_or("").to_string();
    (*hop, line)
}

#[test]
fn a_request_for_a_flow_that_is_gone_gets_430_flow_failed() {
    let connection = Arc::new(BrowserConnection(AtomicBool::new(true)));
    // Registrar: the binding's connection.
    let mut p = proxy(false, true);
    p.set_flow_state(connection.clone());
    let (action, _) = handle(&p, browser(), &register("Supported: outbound\r\n"));
    assert_eq!(action, Action::Responded(200));
    let (_, sent) = handle(&p, Hop::udp(addr(UAC)), &invite_carol());
    let (to, invite) = sent_request(&sent, "INVITE");
    assert_eq!(to, browser(), "open: over the flow");
    let routes = route_set(invite.as_bytes());
    connection.0.store(false, Ordering::Relaxed);
    let (action, sent) = handle(&p, Hop::udp(addr(UAC)), &invite_carol());
    assert_eq!(action, Action::Responded(430));
    assert_eq!(
        response_line(&sent),
        (Hop::udp(addr(UAC)), "SIP/2.0 430 Flow Failed".to_string())
    );
    // In the dialog: the Record-Route token's flow is gone too; an ACK
    // is never answered.
    let (action, sent) = handle(
        &p,
        Hop::udp(addr(UAC)),
        &in_dialog("BYE", "192.0.2.1:5060", &routes),
    );
    assert_eq!(action, Action::Responded(430));
    assert_eq!(response_line(&sent).1, "SIP/2.0 430 Flow Failed");
    let (action, sent) = handle(
        &p,
        Hop::udp(addr(UAC)),
        &in_dialog("ACK", "192.0.2.1:5060", &routes),
    );
    assert!(matches!(action, Action::Dropped(_)), "{action:?}");
    assert!(sent.is_empty(), "{sent:?}");
    assert_eq!(p.stats().flows_failed, 3);

    // Edge proxy: the registrar's request through our Path.
    connection.0.store(true, Ordering::Relaxed);
    let mut edge = proxy(true, true);
    edge.set_flow_state(connection.clone());
    let path = our_path(&forwarded_register(
        &edge,
        browser(),
        "Supported: path,outbound\r\n",
    ));
    let invite = text(&invite_carol())
        .replace(
            "INVITE sip:carol@example.com SIP/2.0\r\n",
            &format!("INVITE {CONTACT} SIP/2.0\r\nRoute: {path}\r\n"),
        )
        .replace(
            "Via: SIP/2.0/UDP 192.0.2.1:5060;branch=z9hG4bKc1\r\n",
            "Via: SIP/2.0/UDP 192.0.2.20:5060;branch=z9hG4bKr9\r\n\
Via: SIP/2.0/UDP 192.0.2.1:5060;branch=z9hG4bKc1\r\n",
        );
    let registrar = Hop::udp(addr(REGISTRAR));
    let (_, sent) = handle(&edge, registrar, invite.as_bytes());
    assert_eq!(sent_request(&sent, "INVITE").0, browser());
    connection.0.store(false, Ordering::Relaxed);
    let (action, sent) = handle(&edge, registrar, invite.as_bytes());
    assert_eq!(action, Action::Responded(430));
    assert_eq!(
        response_line(&sent),
        (registrar, "SIP/2.0 430 Flow Failed".to_string())
    );
}

/// The answer `code` of whoever got `request` (its Vias, From, Call-ID
/// and CSeq copied, a To tag added).
fn answer_to(request: &str, code: u16, reason: &str) -> Vec<u8> {
    let mut out = format!("SIP/2.0 {code} {reason}\r\n");
    for line in request
        .split("\r\n\r\n")
        .next()
        .unwrap_or("")
        .lines()
        .skip(1)
    {
        let name = line.split(':').next().unwrap_or("").to_ascii_lowercase();
        if ["via", "from", "call-id", "cseq"].contains(&name.as_str()) {
            out.push_str(&format!("{line}\r\n"));
        } else if name == "to" {
            out.push_str(&format!("{line};tag=e\r\n"));
        }
    }
    out.push_str("Content-Length: 0\r\n\r\n");
    out.into_bytes()
}

/// RFC 5626 7: a registrar whose request to a binding through an edge
/// proxy's Path gets `430 Flow Failed` removes that Path's bindings and
/// moves the request on to the AOR's next binding (a new branch try, the
/// other Path as Route); with none left the `430` goes upstream.
#[test]
fn a_430_through_a_path_removes_its_bindings_and_moves_on_to_the_next() {
    let mut config = config(false, false);
    config.mode = Mode::Stateful;
    let p = Proxy::new(config);
    let edges = ["192.0.2.31:5060", "192.0.2.32:5060"];
    // Two flows of carol, each through an edge's Path; flow 1 (edge 0)
    // registered last, so tried first.
    for (n, edge) in [(2, edges[1]), (1, edges[0])] {
        let register = format!(
            "REGISTER sip:example.com SIP/2.0\r\n\
Via: SIP/2.0/UDP {edge};branch=z9hG4bKe{n}\r\nVia: SIP/2.0/UDP 10.0.0.{n}:5060;branch=z9hG4bKu{n}\r\n\
Max-Forwards: 69\r\nTo: <sip:carol@example.com>\r\nFrom: <sip:carol@example.com>;tag=r{n}\r\n\
Call-ID: flow{n}\r\nCSeq: 1 REGISTER\r\nPath: <sip:tok{n}@{edge};lr;ob>\r\n\
Supported: path, outbound\r\n\
Contact: <sip:carol@10.0.0.{n}:5060>;+sip.instance=\"<urn:uuid:1>\";reg-id={n}\r\n\
Expires: 600\r\nContent-Length: 0\r\n\r\n"
        );
        let (action, _) = handle(&p, Hop::udp(addr(edge)), register.as_bytes());
        assert_eq!(action, Action::Responded(200));
    }
    let (_, sent) = handle(&p, Hop::udp(addr(UAC)), &invite_carol());
    let (to, invite) = sent_request(&sent, "INVITE");
    assert_eq!(to, Hop::udp(addr(edges[0])));
    assert!(
        invite.starts_with("INVITE sip:carol@10.0.0.1:5060 SIP/2.0\r\n")
            && invite.contains("Route: <sip:tok1@192.0.2.31:5060;lr;ob>\r\n"),
        "{invite}"
    );
    // Edge 0: flow 1 is gone.
    let (action, sent) = handle(
        &p,
        Hop::udp(addr(edges[0])),
        &answer_to(&invite, 430, "Flow Failed"),
    );
    assert_eq!(action, Action::Absorbed);
    assert_eq!(sent_request(&sent, "ACK").0, Hop::udp(addr(edges[0])));
    let (to, retry) = sent_request(&sent, "INVITE");
    assert_eq!(to, Hop::udp(addr(edges[1])), "on to flow 2");
    assert!(
        retry.starts_with("INVITE sip:carol@10.0.0.2:5060 SIP/2.0\r\n")
            && retry.contains("Route: <sip:tok2@192.0.2.32:5060;lr;ob>\r\n")
            && !retry.contains("tok1"),
        "{retry}"
    );
    let first_branch = SipMsg::parse(invite.as_bytes())
        .unwrap()
        .top_via()
        .unwrap()
        .branch;
    let retry_msg = SipMsg::parse(retry.as_bytes()).unwrap();
    let retry_branch = retry_msg.top_via().unwrap().branch.unwrap();
    assert_eq!(
        Some(retry_branch),
        first_branch.map(|b| format!("{b}.1")).as_deref(),
        "a new client transaction"
    );
    assert!(
        sent.iter().all(|(hop, _)| *hop != Hop::udp(addr(UAC))),
        "nothing upstream: {sent:?}"
    );
    // Flow 1's binding is gone: the next lookup finds only flow 2.
    assert_eq!(p.stats().bindings, Some(1));
    // Edge 1's 430 too: no binding left to try, the 430 goes upstream.
    let (_, sent) = handle(
        &p,
        Hop::udp(addr(edges[1])),
        &answer_to(&retry, 430, "Flow Failed"),
    );
    assert_eq!(
        response_line(&sent),
        (Hop::udp(addr(UAC)), "SIP/2.0 430 Flow Failed".to_string())
    );
    let stats = p.stats();
    assert_eq!(
        (
            stats.flow_failures_received,
            stats.flow_retries,
            stats.bindings
        ),
        (2, 1, Some(0))
    );
}
