//! The dispatcher core over connection transports (sans-IO): every
//! message in and out with its hop. A request over a connection is
//! answered over it, a `tcp:` proxy is reached over a connection with our
//! TCP Via and Record-Route, the responses go back to the connection's
//! peer (`rport`), two transports give a double Record-Route that
//! in-dialog requests follow, and the probes go over each proxy's
//! transport.

mod common;

use common::{addr, parse};
use ringway_sip::dispatch::{DispatchConfig, Dispatcher};
use ringway_sip::transport::alias_of;
use ringway_sip::{Action, FlowId, Hop, SipMsg, Transport, TransportAddr};

const D: &str = "192.0.2.100:5060";
const P_TCP: &str = "192.0.2.11:5060";
const P_UDP: &str = "192.0.2.12:5060";
/// A UA's connection: its peer address (an ephemeral port).
const UA_CONN: &str = "192.0.2.1:40001";
const MS: u64 = 1_000_000;

type Sent = Vec<(Hop, Vec<u8>)>;

fn dispatcher(proxies: &[&str]) -> Dispatcher {
    Dispatcher::new(DispatchConfig {
        local: addr(D),
        listeners: vec![
            "tcp:192.0.2.100:5060".parse().unwrap(),
            "tls:192.0.2.100:5061".parse().unwrap(),
        ],
        proxies: proxies
            .iter()
            .map(|p| p.parse::<TransportAddr>().unwrap())
            .collect(),
        probe_interval: 100 * MS,
        ..DispatchConfig::default()
    })
}

/// A connection's hop (its peer `at`, connection `flow`).
fn conn(transport: Transport, at: &str, flow: u64) -> Hop {
    Hop {
        addr: addr(at),
        transport,
        flow: Some(FlowId(flow)),
    }
}

fn run(d: &Dispatcher, from: Hop, msg: &[u8]) -> (Action, Sent) {
    let mut sent = Sent::new();
    let o = d
        .worker()
        .handle_from(0, from, msg, &mut |hop, b| sent.push((hop, b.to_vec())));
    (o.action, sent)
}

fn invite(call_id: &str, via: &str, extra: &str) -> Vec<u8> {
    format!(
        "INVITE sip:bob@example.com SIP/2.0\r\nVia: SIP/2.0/{via};branch=z9hG4bK{call_id}\r\n\
Max-Forwards: 70\r\nFrom: <sip:alice@example.com>;tag=a\r\nTo: <sip:bob@example.com>{extra}\r\n\
Call-ID: {call_id}\r\nCSeq: 1 INVITE\r\nContact: <sip:alice@192.0.2.1:5060>\r\nContent-Length: 0\r\n\r\n"
    )
    .into_bytes()
}

/// The answer `code` of whoever got `forwarded` (its Vias copied).
fn answer(forwarded: &[u8], code: u16) -> Vec<u8> {
    let text = String::from_utf8(forwarded.to_vec()).unwrap();
    let vias: Vec<&str> = text.lines().filter(|l| l.starts_with("Via:")).collect();
    format!(
        "SIP/2.0 {code} Whatever\r\n{}\r\nFrom: <sip:alice@example.com>;tag=a\r\nTo: <sip:bob@example.com>;tag=b\r\n\
Call-ID: x\r\nCSeq: 1 INVITE\r\nContent-Length: 0\r\n\r\n",
        vias.join("\r\n")
    )
    .into_bytes()
}

#[test]
fn a_request_over_a_connection_reaches_a_tcp_proxy_and_its_answers_come_back_over_it() {
    let d = dispatcher(&["tcp:192.0.2.11:5060"]);
    let from = conn(Transport::Tcp, UA_CONN, 7);
    let (action, sent) = run(&d, from, &invite("t1", "TCP 192.0.2.1:5062", ""));
    assert_eq!(action, Action::Forwarded { copies: 1 });
    // A connection to the proxy (the driver reuses the one it has).
    assert_eq!(sent[0].0, Hop::new(Transport::Tcp, addr(P_TCP)));
    let fwd = parse(&sent[0].1);
    let top = fwd.top_via().unwrap();
    assert_eq!(
        (top.transport, top.host, top.port),
        ("TCP", "192.0.2.100", Some(5060))
    );
    // RFC 5923 `alias`: the proxy may send its requests for us (a call
    // through our Path, the far side's in-dialog requests) over our
    // connection to it.
    assert_eq!(
        alias_of(&sent[0].1),
        Some((Transport::Tcp, addr("192.0.2.100:5060")))
    );
    // Its responses follow the connection's peer port.
    assert_eq!(fwd.second_via().unwrap().rport, Some(40001));
    let routes: Vec<&str> = fwd.record_routes().map(|r| r.uri).collect();
    assert_eq!(routes, ["sip:192.0.2.100:5060;transport=tcp;lr"]);
    // The proxy's answer, over our connection to it: to the UA's
    // connection (its address; the driver finds the connection by it).
    let ringing = answer(&sent[0].1, 180);
    let (action, back) = run(&d, conn(Transport::Tcp, P_TCP, 9), &ringing);
    assert_eq!(action, Action::Forwarded { copies: 1 });
    assert_eq!(back[0].0, Hop::new(Transport::Tcp, addr(UA_CONN)));
    assert_eq!(parse(&back[0].1).vias().count(), 1);
    // Our own answers go over the request's connection itself.
    let options = b"OPTIONS sip:192.0.2.100:5060;transport=tcp SIP/2.0\r\nVia: SIP/2.0/TCP 192.0.2.1:5062;branch=z9hG4bKo\r\n\
Max-Forwards: 70\r\nFrom: <sip:a@example.com>;tag=o\r\nTo: <sip:192.0.2.100:5060>\r\nCall-ID: o1\r\nCSeq: 1 OPTIONS\r\nContent-Length: 0\r\n\r\n";
    let (action, sent) = run(&d, from, options);
    assert_eq!(action, Action::Responded(200));
    assert_eq!(sent[0].0, from);
    let hops = String::from_utf8(invite("t2", "TCP 192.0.2.1:5062", ""))
        .unwrap()
        .replace("Max-Forwards: 70", "Max-Forwards: 0");
    let (action, sent) = run(&d, from, hops.as_bytes());
    assert_eq!(action, Action::Responded(483));
    assert_eq!(sent[0].0, from);
}

#[test]
fn udp_in_tcp_out_is_record_routed_twice_and_in_dialog_requests_follow_the_transport() {
    let d = dispatcher(&["tcp:192.0.2.11:5060"]);
    let (_, sent) = run(
        &d,
        Hop::udp(addr("192.0.2.1:5060")),
        &invite("u1", "UDP 192.0.2.1:5060", ""),
    );
    assert_eq!(sent[0].0, Hop::new(Transport::Tcp, addr(P_TCP)));
    let fwd = parse(&sent[0].1);
    assert_eq!(fwd.top_via().unwrap().transport, "TCP");
    // The far (TCP) side's on top: each side reaches us over its own.
    let routes: Vec<&str> = fwd.record_routes().map(|r| r.uri).collect();
    assert_eq!(
        routes,
        [
            "sip:192.0.2.100:5060;transport=tcp;lr",
            "sip:192.0.2.100:5060;lr"
        ]
    );
    // The callee's BYE through the proxy, which opened its own connection
    // to us (an ephemeral port at its IP): both our Routes popped, to the
    // UA's contact over the transport named last (UDP).
    let bye = "BYE sip:alice@192.0.2.1:5060 SIP/2.0\r\nVia: SIP/2.0/TCP 192.0.2.11:5060;branch=z9hG4bKbye\r\n\
Route: <sip:192.0.2.100:5060;transport=tcp;lr>, <sip:192.0.2.100:5060;lr>\r\n\
Max-Forwards: 69\r\nFrom: <sip:bob@example.com>;tag=b\r\nTo: <sip:alice@example.com>;tag=a\r\n\
Call-ID: u1\r\nCSeq: 1 BYE\r\nContent-Length: 0\r\n\r\n";
    let (action, sent) = run(
        &d,
        conn(Transport::Tcp, "192.0.2.11:45000", 3),
        bye.as_bytes(),
    );
    assert_eq!(action, Action::Forwarded { copies: 1 });
    assert_eq!(sent[0].0, Hop::udp(addr("192.0.2.1:5060")));
    let at_ua = parse(&sent[0].1);
    assert!(at_ua.routes().next().is_none(), "our Routes popped");
    assert_eq!(at_ua.top_via().unwrap().transport, "UDP");
    assert_eq!(d.stats().requests_to_uri, 1);
    // The same BYE over a connection from elsewhere is no proxy's: it
    // goes to a proxy like any request from outside, not to the UA.
    let (_, sent) = run(
        &d,
        conn(Transport::Tcp, "192.0.2.50:45000", 4),
        bye.as_bytes(),
    );
    assert_eq!(sent[0].0, Hop::new(Transport::Tcp, addr(P_TCP)));
}

#[test]
fn probes_go_over_each_proxys_transport() {
    let d = dispatcher(&["tcp:192.0.2.11:5060", P_UDP]);
    let mut probes = Sent::new();
    let n = d
        .worker()
        .on_timer_hops(0, &mut |hop, b| probes.push((hop, b.to_vec())));
    assert_eq!(n, 2);
    let (tcp, udp) = (&probes[0], &probes[1]);
    assert_eq!(tcp.0, Hop::new(Transport::Tcp, addr(P_TCP)));
    let probe = parse(&tcp.1);
    assert_eq!(
        probe.request_uri(),
        Some("sip:192.0.2.11:5060;transport=tcp")
    );
    assert_eq!(probe.top_via().unwrap().transport, "TCP");
    // RFC 5923: the proxy may use our connection for requests to us.
    assert_eq!(
        alias_of(&tcp.1),
        Some((Transport::Tcp, addr("192.0.2.100:5060")))
    );
    assert_eq!(udp.0, Hop::udp(addr(P_UDP)));
    assert_eq!(parse(&udp.1).top_via().unwrap().transport, "UDP");
    assert_eq!(alias_of(&udp.1), None);
    // The TCP proxy's answer over our connection to it counts.
    let m = SipMsg::parse(&tcp.1).unwrap();
    let mut ok = Vec::new();
    ringway_sip::build_response(&m, 200, "OK", &[], Some("p"), &mut ok);
    let (action, _) = run(&d, conn(Transport::Tcp, P_TCP, 5), &ok);
    assert_eq!(action, Action::Absorbed);
    assert_eq!(d.stats().probe_answers, 1);
    assert_eq!(d.stats().proxies[0].address, "tcp:192.0.2.11:5060");
    assert_eq!(d.stats().proxies[1].address, P_UDP);
}
