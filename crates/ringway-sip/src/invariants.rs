//! Invariants the SIP fuzz targets (`fuzz/`) check, shared with the corpus
//! replay tests so both assert the same things. Each function panics when
//! an invariant is broken; that is the point.

mod script;

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
    // The overload peek reads every datagram too (it must not panic), and
    // so does the quick refusal.
    let _ = crate::peek::is_new_invite(data);
    let peeked_call_id = crate::peek::call_id(data);
    refuse_under_overload(data);
    let lazy = SipMsg::parse_lazy(data);
    let Ok(m) = SipMsg::parse(data) else {
        if let Ok(l) = lazy {
            // Touch the lazily parsed accessors: they must not panic.
            let _ = (l.to_tag(), l.from_tag(), l.top_via(), l.request_sip_uri());
            let _ = l.vias().count() + l.contact().count() + l.record_routes().count();
        }
        return false;
    };
    // The overload path tells resends apart by the peeked Call-ID: for a
    // message the full parser accepts it is the parser's.
    assert_eq!(
        peeked_call_id,
        m.call_id().map(str::as_bytes),
        "the peeked Call-ID differs from the parsed one"
    );
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
                alias: false,
            }),
            max_forwards: true,
            record_route: Some("sip:192.0.2.10:5060;lr"),
            record_route_inner: Some("sip:192.0.2.10:5060;transport=tcp;lr"),
            pop_routes: usize::from(routes > 0),
            request_uri: Some("sip:x@192.0.2.20"),
            pop_last_route: routes > 1,
            received: Some("192.0.2.1"),
            rport: Some(5060),
            add_rport: true,
            strict_next_hop: None,
            route_set: None,
            path: None,
            path_inner: None,
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

/// `data` from 192.0.2.1:5070 with the core's shedding on (the quick
/// refusal of a new call, `proxy::refusal`, else the full path): whatever
/// answers it goes to the source and is at most [`AMPLIFICATION_LIMIT`]
/// times the datagram; a quick refusal is a 503 with our refusal To-tag,
/// whose ACK the proxy absorbs without output.
fn refuse_under_overload(data: &[u8]) {
    static PROXY: std::sync::OnceLock<Proxy> = std::sync::OnceLock::new();
    let proxy = PROXY.get_or_init(|| {
        Proxy::new(ProxyConfig {
            local: "192.0.2.10:5060".parse().unwrap(),
            ..ProxyConfig::default()
        })
    });
    let src: SocketAddr = "192.0.2.1:5070".parse().unwrap();
    let mut worker = proxy.worker();
    worker.set_shedding(true);
    // RFC 7339: the advertisement goes into a Via asking for it; the
    // bounds below hold with it.
    worker.set_overload_control(Some(crate::overload_control::OcAdvert::from_admitted_ppm(
        u32::from(data.first().copied().unwrap_or(0)) * 4_000,
        crate::overload_control::ADVERTISED_VALIDITY_MS,
        u64::MAX,
    )));
    let mut responses = Vec::new();
    worker.handle(1, src, data, &mut |to, bytes| {
        check_sent(to, bytes);
        if bytes.starts_with(b"SIP/") {
            assert_eq!(
                to.ip(),
                src.ip(),
                "a response we generate goes to the source"
            );
            assert!(bytes.len() <= AMPLIFICATION_LIMIT * data.len());
            responses.push(bytes.to_vec());
        }
    });
    let Some(refusal) = responses.first().filter(|r| r.starts_with(b"SIP/2.0 503")) else {
        return;
    };
    assert_eq!(responses.len(), 1, "one answer");
    // A quick refusal (our refusal tag) answers only what the full path
    // reads alike: a head the full parser can read (else it drops the
    // datagram unanswered), and never an INVITE inside a dialog (the full
    // path does not shed those).
    let quick = SipMsg::parse_loose(refusal).is_ok_and(|answer| {
        let call_id = answer.call_id().unwrap_or("").as_bytes();
        answer
            .to_tag()
            .is_some_and(|tag| proxy.is_refusal_tag(tag.as_bytes(), call_id))
    });
    if quick {
        assert!(
            SipMsg::parse_loose(data).is_ok(),
            "a quick 503 to a head the full parser cannot read"
        );
        if let Ok(request) = SipMsg::parse(data) {
            assert_eq!(
                request.to_tag(),
                None,
                "a quick 503 to an INVITE in a dialog"
            );
        }
    }
    // Its ACK (RFC 3261 17.1.1.3), built from the 503: absorbed.
    let Ok(answer) = SipMsg::parse(refusal) else {
        return;
    };
    let (Some(via), Some(from), Some(to), Some(call_id)) = (
        answer.raw_values(crate::HeaderKind::Via).next(),
        answer.raw_values(crate::HeaderKind::From).next(),
        answer.raw_values(crate::HeaderKind::To).next(),
        answer.call_id(),
    ) else {
        return;
    };
    let ack = format!(
        "ACK sip:x@192.0.2.10 SIP/2.0\r\nVia: {via}\r\nFrom: {from}\r\nTo: {to}\r\n\
         Call-ID: {call_id}\r\nCSeq: 1 ACK\r\nMax-Forwards: 70\r\nContent-Length: 0\r\n\r\n"
    );
    worker.set_shedding(false);
    let outcome = worker.handle(2, src, ack.as_bytes(), &mut |to, bytes| {
        panic!(
            "the ACK of our 503 went on to {to}: {:?}",
            String::from_utf8_lossy(bytes)
        )
    });
    // (An ACK that does not parse is dropped, counted; ours is absorbed.)
    if SipMsg::parse(ack.as_bytes()).is_ok() {
        assert_eq!(outcome.action, crate::proxy::Action::Absorbed, "{ack:?}");
    }
}

/// Bound on the fuzzed proxies' transaction tables.
const FUZZ_MAX_TRANSACTIONS: usize = 8;

/// A proxy as the fuzz targets run it: our address 192.0.2.10:5060,
/// `route_to` 192.0.2.20:5060, registrar for `example.com` with [`script::USER`]'s
/// password, Record-Route, [`FUZZ_MAX_TRANSACTIONS`].
fn fuzz_proxy(mode: Mode, auth: bool) -> Proxy {
    let mut proxy = Proxy::new(ProxyConfig {
        mode,
        local: "192.0.2.10:5060".parse().unwrap(),
        route_to: Some("192.0.2.20:5060".parse().unwrap()),
        registrar: true,
        record_route: true,
        max_transactions: FUZZ_MAX_TRANSACTIONS,
        domains: vec!["example.com".into()],
        auth: auth.then(crate::proxy::AuthConfig::default),
        ..ProxyConfig::default()
    });
    let mut users = crate::auth::HtdigestCredentials::default();
    let (user, realm, password) = script::USER;
    users.add_password(user, realm, password);
    proxy.set_credentials(std::sync::Arc::new(users));
    proxy
}

/// What every datagram a core sends must satisfy: a real destination, a
/// message that parses (an error response to a malformed request, which
/// echoes its headers, at least loosely).
pub fn check_sent(to: SocketAddr, bytes: &[u8]) {
    assert!(to.port() != 0 && !to.ip().is_unspecified(), "sent to {to}");
    if let Err(e) = SipMsg::parse(bytes) {
        let echoes_a_malformed_request = SipMsg::parse_loose(bytes)
            .is_ok_and(|m| m.status().is_some_and(|s| (400..600).contains(&s)));
        assert!(
            echoes_a_malformed_request,
            "sent an unparseable message ({e:?}) to {to}: {:?}",
            String::from_utf8_lossy(bytes)
        );
    }
}

/// Run a fuzz script (see [`script`]: datagrams from a user agent, the next
/// hop, another host and an IPv6 host, with time steps; peers answer the
/// last request, replay what the proxy sent, or add digest credentials
/// answering its last challenge; the driver reports ICMP unreachables for
/// where the proxy sent) through four proxies: stateful and
/// stateless, each with and without digest authentication. Every datagram
/// sent passes [`check_sent`], and the transaction table stays bounded.
pub fn proxy_sequence(data: &[u8]) {
    for (mode, auth) in [
        (Mode::Stateful, false),
        (Mode::Stateless, false),
        (Mode::Stateful, true),
        (Mode::Stateless, true),
    ] {
        run_proxy_script(&fuzz_proxy(mode, auth), data);
    }
}

/// One proxy through a script, with the checks of [`proxy_sequence`] and
/// the security invariants of [`Guarded`].
fn run_proxy_script(proxy: &Proxy, data: &[u8]) {
    let mut guard = Guarded::new(proxy);
    let mut peers = script::Peers::default();
    let mut now = 1_000_000_000u64;
    for step in script::steps(data) {
        now += script::WAITS[step.wait];
        guard.on_timer(now);
        if step.unreachable {
            if let Some(to) = peers.destination(step.payload) {
                guard.unreachable(now, to);
            }
        } else if let Some((src, datagram)) = peers.datagram(&step) {
            guard.handle(now, src, datagram);
        }
        for (to, bytes) in guard.take_outputs() {
            check_sent(to, &bytes);
            peers.saw(to, &bytes);
        }
        let active = proxy.transactions_active();
        assert!(active <= 2 * FUZZ_MAX_TRANSACTIONS, "{active} transactions");
    }
    // Timers that fire start others (timer C sends CANCEL, a final
    // response starts D): let 10 × 200 s pass, one step at a time.
    for _ in 0..10 {
        now += 200_000_000_000;
        guard.on_timer(now);
        for (to, bytes) in guard.take_outputs() {
            check_sent(to, &bytes);
        }
    }
    assert_eq!(
        proxy.transactions_active(),
        0,
        "transactions left after every timer fired"
    );
}

/// Run a fuzz script (see [`script`]; peer 1 and 2 are the two proxies
/// behind it) through a dispatcher with probes every 500 ms: every
/// datagram sent passes [`check_sent`].
pub fn dispatch_sequence(data: &[u8]) {
    run_dispatch_script(&fuzz_dispatcher(), data);
}

/// The dispatcher of [`dispatch_sequence`]: peers 1 and 2 are its proxies.
fn fuzz_dispatcher() -> crate::dispatch::Dispatcher {
    crate::dispatch::Dispatcher::new(crate::dispatch::DispatchConfig {
        local: "192.0.2.10:5060".parse().unwrap(),
        listeners: Vec::new(),
        proxies: vec![
            crate::TransportAddr::udp(script::peer(1)),
            crate::TransportAddr::udp(script::peer(2)),
        ],
        probe_interval: 500_000_000,
        probe_failures: 3,
        record_route: true,
        secret: [0x5E; 32],
        relay: crate::RelayNets::default(),
        // Low enough that a long script from one peer reaches it.
        flood: Some(crate::FloodConfig {
            limit: 40,
            ..crate::FloodConfig::default()
        }),
    })
}

/// One dispatcher through a script, with the checks of [`dispatch_sequence`].
fn run_dispatch_script(dispatcher: &crate::dispatch::Dispatcher, data: &[u8]) {
    let mut worker = dispatcher.worker();
    let mut peers = script::Peers::default();
    let mut sent = Vec::new();
    let mut now = 1_000_000_000u64;
    for step in script::steps(data) {
        now += script::WAITS[step.wait];
        worker.on_timer(now, &mut |to, b| sent.push((to, b.to_vec())));
        if let Some((src, datagram)) = peers.datagram(&step) {
            worker.handle(now, src, datagram, &mut |to, b| sent.push((to, b.to_vec())));
        }
        for (to, bytes) in sent.drain(..) {
            check_sent(to, &bytes);
            peers.saw(to, &bytes);
        }
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
    outputs: Vec<(SocketAddr, Vec<u8>)>,
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
            outputs: Vec::new(),
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
        let produced = outputs.len();
        self.outputs.extend(outputs);
        produced
    }

    /// Run due timers and check what they produced.
    pub fn on_timer(&mut self, now: u64) {
        let mut outputs = Vec::new();
        self.worker
            .on_timer(now, &mut |to, b| outputs.push((to, b.to_vec())));
        for (to, bytes) in &outputs {
            self.check(*to, bytes, Step::Timer);
        }
        self.outputs.extend(outputs);
    }

    /// The driver read an ICMP unreachable for `to` (UDP): check what the
    /// core sent (next targets, `500`s upstream) as a timer's output.
    pub fn unreachable(&mut self, now: u64, to: SocketAddr) {
        let mut outputs = Vec::new();
        self.worker
            .on_unreachable(now, crate::Hop::udp(to), &mut |hop, b| {
                outputs.push((hop.addr, b.to_vec()))
            });
        for (to, bytes) in &outputs {
            self.check(*to, bytes, Step::Timer);
        }
        self.outputs.extend(outputs);
    }

    /// The datagrams produced (and checked) since the last call.
    pub fn take_outputs(&mut self) -> Vec<(SocketAddr, Vec<u8>)> {
        std::mem::take(&mut self.outputs)
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
    // The cached second Via is the second of the list.
    assert_eq!(strict.second_via(), lazy.second_via());
    assert_eq!(strict.second_via(), strict.vias().nth(1));
    assert!(strict.routes().eq(lazy.routes()));
    assert!(strict.record_routes().eq(lazy.record_routes()));
    assert!(strict.contact().eq(lazy.contact()));
    assert_eq!(strict.max_forwards(), lazy.max_forwards());
    assert_eq!(strict.content_length(), lazy.content_length());
    assert_eq!(strict.body(), lazy.body());
    assert!(strict.headers().eq(lazy.headers()));
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The scripted peers' credentials are accepted: the fuzz target
    /// reaches the authenticated paths, not only the challenges.
    #[test]
    fn scripted_credentials_answer_the_challenge() {
        let invite = b"INVITE sip:bob@example.com SIP/2.0\r\n\
Via: SIP/2.0/UDP 192.0.2.1:5060;branch=z9hG4bKa1\r\nMax-Forwards: 70\r\n\
From: <sip:alice@example.com>;tag=1\r\nTo: <sip:bob@example.com>\r\n\
Call-ID: c1\r\nCSeq: 1 INVITE\r\nContent-Length: 0\r\n\r\n";
        // Raw INVITE (challenged), then the same with credentials (0x20).
        let data = [&[0x00][..], invite, &[0xff, 0x20], invite].concat();
        for mode in [Mode::Stateful, Mode::Stateless] {
            let proxy = fuzz_proxy(mode, true);
            run_proxy_script(&proxy, &data);
            let stats = proxy.stats();
            assert_eq!(stats.auth_accepted, 1, "{mode:?}: {stats:?}");
            assert_eq!(stats.requests_forwarded, 1, "{mode:?}: {stats:?}");
        }
    }

    /// A step that lets 600 ms pass makes the dispatcher probe; answering
    /// the last request answers a probe, from the probed proxy.
    #[test]
    fn scripted_peers_answer_probes() {
        let data = [&[0x0c][..], b"", &[0xff, 0x40, 0x00, 0x64]].concat();
        let dispatcher = fuzz_dispatcher();
        run_dispatch_script(&dispatcher, &data);
        let stats = dispatcher.stats();
        assert_eq!(stats.probes_sent, 2, "{stats:?}");
        assert_eq!(stats.probe_answers, 1, "{stats:?}");
    }
}
