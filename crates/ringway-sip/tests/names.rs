//! Next hops that are names (RFC 3263) in the core: the cached answer used
//! at once, a cold name parked and resumed, the relay policy on resolved
//! addresses, and the stateful failover to the next target on `503`, on
//! timer B, bounded, and on a transport error the driver reports. Sans-IO: a resolver that answers from a table stands
//! in for the driver's DNS.

mod common;

use common::*;
use ringway_sip::proxy::{
    NameAnswer, NameError, NameQuery, NameResolver, QueueFull, ResolvingRequest,
    TransportErrorOutcome, UnreachableOutcome, MAX_TRIES, TIMER_64T1,
};
use ringway_sip::{Action, Hop, Mode, Proxy, ProxyConfig, RelayNets, SipMsg, Transport};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// A resolver answering from `answers` (a name missing there is "not
/// cached": parked, up to `capacity`).
#[derive(Default)]
struct Table {
    answers: Mutex<HashMap<String, NameAnswer>>,
    asked: AtomicUsize,
    parked: Mutex<Vec<ResolvingRequest>>,
    capacity: usize,
}

impl NameResolver for Table {
    fn cached(&self, query: &NameQuery) -> Option<NameAnswer> {
        self.asked.fetch_add(1, Ordering::Relaxed);
        self.answers.lock().unwrap().get(&query.host).cloned()
    }

    fn submit(&self, request: ResolvingRequest) -> Result<(), QueueFull> {
        let mut parked = self.parked.lock().unwrap();
        if parked.len() >= self.capacity {
            return Err(QueueFull);
        }
        parked.push(request);
        Ok(())
    }
}

fn addrs(list: &[&str]) -> Vec<SocketAddr> {
    list.iter().map(|a| addr(a)).collect()
}

/// A stateful proxy whose default route is the name `gw.test`.
fn proxy(table: Arc<Table>, relay: RelayNets) -> Proxy {
    let mut p = Proxy::new(ProxyConfig {
        mode: Mode::Stateful,
        local: addr(PROXY),
        route_to_name: Some(NameQuery::new("GW.test.", None, Transport::Udp)),
        relay,
        ..ProxyConfig::default()
    });
    p.set_name_resolver(table);
    p
}

fn table(answers: &[(&str, NameAnswer)], capacity: usize) -> Arc<Table> {
    Arc::new(Table {
        answers: Mutex::new(
            answers
                .iter()
                .map(|(n, a)| (n.to_string(), a.clone()))
                .collect(),
        ),
        capacity,
        ..Table::default()
    })
}

fn to(sent: &Sent, target: &str) -> Vec<Vec<u8>> {
    sent.iter()
        .filter(|(a, _)| *a == addr(target))
        .map(|(_, b)| b.clone())
        .collect()
}

fn top_branch(msg: &[u8]) -> String {
    SipMsg::parse(msg)
        .unwrap()
        .top_via()
        .unwrap()
        .branch
        .unwrap()
        .to_string()
}

const A: &str = "198.51.100.1:5060";
const B: &str = "198.51.100.2:5060";
const C: &str = "198.51.100.3:5060";

#[test]
fn a_cached_name_is_used_at_once_and_a_503_moves_to_the_next_target() {
    let t = table(&[("gw.test", Ok(addrs(&[A, B])))], 8);
    let p = proxy(t.clone(), RelayNets::None);
    let inv = invite("z9hG4bKn1", "sip:bob@example.com", "");
    let (o, sent) = handle(&p, 0, UAC, &inv);
    assert_eq!(o.action, Action::Forwarded { copies: 1 });
    let first = to(&sent, A);
    assert_eq!(first.len(), 1, "to the first target");
    assert!(t.parked.lock().unwrap().is_empty());
    // The first answers 503: ACKed, and the INVITE goes to the second
    // with a new branch; nothing goes upstream but the 100.
    let busy = response_to(&first[0], 503, "Service Unavailable", "");
    let (o, sent) = handle(&p, 1_000, A, &busy);
    assert_eq!(o.action, Action::Absorbed);
    assert!(String::from_utf8_lossy(&to(&sent, A)[0]).starts_with("ACK "));
    let second = to(&sent, B);
    assert_eq!(second.len(), 1, "{sent:?}");
    assert_eq!(
        top_branch(&second[0]),
        format!("{}.1", top_branch(&first[0]))
    );
    assert!(to(&sent, UAC).is_empty());
    // A late 503 from the first again: absorbed (no second move, nothing up).
    let (o, sent) = handle(&p, 2_000, A, &busy);
    assert_eq!(o.action, Action::Absorbed);
    assert!(to(&sent, UAC).is_empty() && to(&sent, C).is_empty());
    // The second answers 200: it goes upstream.
    let ok = response_to(&second[0], 200, "OK", "");
    let (_, sent) = handle(&p, 3_000, B, &ok);
    let up = to(&sent, UAC);
    assert_eq!(up.len(), 1);
    assert_eq!(SipMsg::parse(&up[0]).unwrap().status(), Some(200));
    assert_eq!(p.stats().failovers, 1);
}

/// The driver reports that `message` (sent to `target`) could not be
/// delivered; what the core did and sent.
fn transport_error(
    p: &Proxy,
    now: u64,
    target: &str,
    message: &[u8],
) -> (TransportErrorOutcome, Sent) {
    let mut sent = Sent::new();
    let outcome =
        p.worker()
            .on_transport_error(now, Hop::udp(addr(target)), message, &mut |hop, bytes| {
                sent.push((hop.addr, bytes.to_vec()))
            });
    (outcome, sent)
}

/// A transport error on the first target (its connection refused) moves
/// the INVITE to the next target at once, with a new branch, long before
/// timer B; the same report again, or one for a hop the transaction does
/// not wait on, changes nothing; on the last target the upstream gets
/// `500` at once (RFC 3261 16.9 and 16.7 step 6), not `408` at timer B.
#[test]
fn a_transport_error_moves_to_the_next_target_at_once_then_500() {
    let t = table(&[("gw.test", Ok(addrs(&[A, B])))], 8);
    let p = proxy(t, RelayNets::None);
    let inv = invite("z9hG4bKn9", "sip:bob@example.com", "");
    let (_, sent) = handle(&p, 0, UAC, &inv);
    let first = to(&sent, A);
    assert_eq!(first.len(), 1);
    let (outcome, sent) = transport_error(&p, 1_000, A, &first[0]);
    assert_eq!(outcome, TransportErrorOutcome::FailedOver);
    let second = to(&sent, B);
    assert_eq!(second.len(), 1, "{sent:?}");
    assert_eq!(
        top_branch(&second[0]),
        format!("{}.1", top_branch(&first[0]))
    );
    assert!(to(&sent, UAC).is_empty());
    // The first try is over: a second report of it is ignored.
    let (outcome, sent) = transport_error(&p, 2_000, A, &first[0]);
    assert_eq!((outcome, sent.len()), (TransportErrorOutcome::Ignored, 0));
    // Not the hop it waits on.
    let (outcome, sent) = transport_error(&p, 2_000, C, &second[0]);
    assert_eq!((outcome, sent.len()), (TransportErrorOutcome::Ignored, 0));
    // The last target fails too: 500 upstream at once.
    let (outcome, sent) = transport_error(&p, 3_000, B, &second[0]);
    assert_eq!(outcome, TransportErrorOutcome::GaveUp);
    let up = to(&sent, UAC);
    assert_eq!(up.len(), 1, "{sent:?}");
    assert_eq!(SipMsg::parse(&up[0]).unwrap().status(), Some(500));
    let stats = p.stats();
    assert_eq!((stats.failovers, stats.transport_errors), (1, 2));
    // Nothing more at timer B: the client side is over.
    let (_, sent) = timer(&p, TIMER_64T1 + 10_000);
    assert!(sent.is_empty(), "{sent:?}");
    // A stateless proxy holds no transaction to tell.
    let stateless = Proxy::new(ProxyConfig {
        mode: Mode::Stateless,
        local: addr(PROXY),
        route_to: Some(addr(A)),
        ..ProxyConfig::default()
    });
    let (_, sent) = handle(&stateless, 0, UAC, &inv);
    let (outcome, _) = transport_error(&stateless, 1_000, A, &to(&sent, A)[0]);
    assert_eq!(outcome, TransportErrorOutcome::Ignored);
}

#[test]
fn timer_b_moves_to_the_next_target_at_most_max_tries_times() {
    let many = [
        "198.51.100.1:5060",
        "198.51.100.2:5060",
        "198.51.100.3:5060",
    ];
    let mut list: Vec<String> = many.iter().map(|s| s.to_string()).collect();
    for i in 4..10 {
        list.push(format!("198.51.100.{i}:5060"));
    }
    let all: Vec<&str> = list.iter().map(String::as_str).collect();
    let t = table(&[("gw.test", Ok(addrs(&all)))], 8);
    let p = proxy(t, RelayNets::None);
    let inv = invite("z9hG4bKn2", "sip:bob@example.com", "");
    let (_, sent) = handle(&p, 0, UAC, &inv);
    assert_eq!(to(&sent, all[0]).len(), 1);
    let mut now = 0;
    for target in &all[1..MAX_TRIES] {
        now += TIMER_64T1 + 1;
        let (_, sent) = timer(&p, now);
        assert_eq!(to(&sent, target).len(), 1, "next target {target}: {sent:?}");
        assert!(to(&sent, UAC).is_empty(), "no 408 while a target is left");
    }
    now += TIMER_64T1 + 1;
    let (_, sent) = timer(&p, now);
    let up = to(&sent, UAC);
    assert_eq!(up.len(), 1, "408 after {MAX_TRIES} targets: {sent:?}");
    assert_eq!(SipMsg::parse(&up[0]).unwrap().status(), Some(408));
    assert!(to(&sent, all[MAX_TRIES]).is_empty());
    assert_eq!(p.stats().failovers, MAX_TRIES as u64 - 1);
}

#[test]
fn a_cold_name_parks_the_request_until_it_is_resolved() {
    let t = table(&[], 1);
    let p = proxy(t.clone(), RelayNets::None);
    let inv = invite("z9hG4bKn3", "sip:bob@example.com", "");
    let (o, sent) = handle(&p, 0, UAC, &inv);
    assert_eq!((o.action, sent.len()), (Action::Deferred, 0));
    // The pending set is full: the next one gets 503 at once.
    let other = invite("z9hG4bKn4", "sip:bob@example.com", "");
    let (o, sent) = handle(&p, 0, UAC, &other);
    assert_eq!(o.action, Action::Responded(503));
    assert_eq!(sent.len(), 1);
    let parked = t.parked.lock().unwrap().remove(0);
    assert_eq!(parked.query.host, "gw.test");
    let mut sent = Vec::new();
    let o = p
        .worker()
        .resume_resolved(&parked, Ok(addrs(&[A])), 10, &mut |hop, b| {
            sent.push((hop.addr, b.to_vec()))
        });
    assert_eq!(o.action, Action::Forwarded { copies: 1 });
    assert_eq!(to(&sent, A).len(), 1);
    // A lookup that failed or timed out: 503; a name with no address: 404.
    for (answer, code) in [
        (Err(NameError::Unavailable), 503),
        (Err(NameError::NoAddress), 404),
    ] {
        let inv = invite(&format!("z9hG4bKn5{code}"), "sip:bob@example.com", "");
        let (o, _) = handle(&p, 20, UAC, &inv);
        assert_eq!(o.action, Action::Deferred);
        let parked = t.parked.lock().unwrap().remove(0);
        let o = p
            .worker()
            .resume_resolved(&parked, answer, 30, &mut |_, _| {});
        assert_eq!(o.action, Action::Responded(code));
    }
    let stats = p.stats();
    assert_eq!(
        (
            stats.names_parked,
            stats.names_unavailable,
            stats.names_failed
        ),
        (3, 2, 1)
    );
}

#[test]
fn resolved_addresses_pass_the_relay_policy_one_by_one() {
    // Loopback is refused unless a relay network names it: skipped.
    let t = table(&[("gw.test", Ok(addrs(&["127.0.0.1:5060", A])))], 8);
    let p = proxy(t.clone(), RelayNets::None);
    let (_, sent) = handle(&p, 0, UAC, &invite("z9hG4bKn6", "sip:bob@example.com", ""));
    assert_eq!(to(&sent, A).len(), 1);
    assert!(to(&sent, "127.0.0.1:5060").is_empty());
    // Only loopback: refused (403).
    let t = table(&[("gw.test", Ok(addrs(&["127.0.0.1:5060"])))], 8);
    let p = proxy(t, RelayNets::None);
    let (o, _) = handle(&p, 0, UAC, &invite("z9hG4bKn7", "sip:bob@example.com", ""));
    assert_eq!(o.action, Action::Responded(403));
}

#[test]
fn request_uri_names_are_resolved_only_where_the_relay_policy_allows_them() {
    let t = table(&[("far.test", Ok(addrs(&[B])))], 8);
    let config = |relay| ProxyConfig {
        mode: Mode::Stateful,
        local: addr(PROXY),
        relay,
        ..ProxyConfig::default()
    };
    // Relay `none`, unauthenticated: no lookup at all (404 as before).
    let mut p = Proxy::new(config(RelayNets::None));
    p.set_name_resolver(t.clone());
    let (o, _) = handle(&p, 0, UAC, &invite("z9hG4bKn8", "sip:bob@far.test", ""));
    assert_eq!(o.action, Action::Responded(404));
    assert_eq!(t.asked.load(Ordering::Relaxed), 0);
    // IP literals never ask the resolver.
    let mut p = Proxy::new(config(RelayNets::Any));
    p.set_name_resolver(t.clone());
    let (_, sent) = handle(
        &p,
        0,
        UAC,
        &invite("z9hG4bKn9", &format!("sip:bob@{C}"), ""),
    );
    assert_eq!(to(&sent, C).len(), 1);
    assert_eq!(t.asked.load(Ordering::Relaxed), 0);
    // Relay `any`: the Request-URI's name is resolved and followed.
    let (_, sent) = handle(&p, 0, UAC, &invite("z9hG4bKna", "sip:bob@far.test", ""));
    assert_eq!(to(&sent, B).len(), 1, "{sent:?}");
    assert_eq!(t.asked.load(Ordering::Relaxed), 1);
}

/// The driver read an ICMP unreachable for `target` (over `transport`);
/// what the core did and sent.
fn unreachable(
    p: &Proxy,
    now: u64,
    transport: Transport,
    target: &str,
) -> (UnreachableOutcome, Sent) {
    let mut sent = Sent::new();
    let outcome =
        p.worker()
            .on_unreachable(now, Hop::new(transport, addr(target)), &mut |hop, bytes| {
                sent.push((hop.addr, bytes.to_vec()))
            });
    (outcome, sent)
}

/// An ICMP unreachable for a UDP destination (RFC 3261 18.4) is a
/// transport error of every transaction whose request waits there with
/// nothing heard back: each moves on to its next target at once, or gets
/// `500` with none left. A report for another destination, for the same
/// destination over a connection transport, or for a destination a
/// transaction already heard from, changes nothing; a stateless proxy
/// only counts it.
#[test]
fn an_icmp_unreachable_moves_the_transactions_waiting_there_and_no_other() {
    let t = table(&[("gw.test", Ok(addrs(&[A, B])))], 8);
    let p = proxy(t, RelayNets::None);
    // Three INVITEs to A; the third hears a 100 from A (Proceeding).
    let mut first = Vec::new();
    for n in 0..3 {
        let inv = invite(&format!("z9hG4bKu{n}"), "sip:bob@example.com", "");
        let (_, sent) = handle(&p, 0, UAC, &inv);
        first.push(to(&sent, A).remove(0));
    }
    let trying = response_to(&first[2], 100, "Trying", "");
    let _ = handle(&p, 500, A, &trying);
    // Unrelated destinations, and A over TCP: nothing moves.
    for (transport, target) in [
        (Transport::Udp, C),
        (Transport::Udp, UAC),
        (Transport::Tcp, A),
    ] {
        let (outcome, sent) = unreachable(&p, 1_000, transport, target);
        assert_eq!(outcome, UnreachableOutcome::default(), "{target}");
        assert!(sent.is_empty(), "{target}: {sent:?}");
    }
    assert_eq!(p.stats().failovers, 0);
    // A is unreachable: the two that heard nothing go to B, new branches.
    let (outcome, sent) = unreachable(&p, 2_000, Transport::Udp, A);
    assert_eq!(
        outcome,
        UnreachableOutcome {
            failed_over: 2,
            gave_up: 0
        }
    );
    let second = to(&sent, B);
    assert_eq!(second.len(), 2, "{sent:?}");
    let mut branches: Vec<String> = second.iter().map(|m| top_branch(m)).collect();
    branches.sort();
    let mut expected: Vec<String> = first[..2]
        .iter()
        .map(|m| format!("{}.1", top_branch(m)))
        .collect();
    expected.sort();
    assert_eq!(branches, expected);
    assert!(to(&sent, A).is_empty() && to(&sent, UAC).is_empty());
    // Again for A: nobody waits there any more.
    let (outcome, sent) = unreachable(&p, 2_500, Transport::Udp, A);
    assert_eq!((outcome, sent.len()), (UnreachableOutcome::default(), 0));
    // B too: no target left, 500 upstream at once for both.
    let (outcome, sent) = unreachable(&p, 3_000, Transport::Udp, B);
    assert_eq!(
        outcome,
        UnreachableOutcome {
            failed_over: 0,
            gave_up: 2
        }
    );
    let up = to(&sent, UAC);
    assert_eq!(up.len(), 2, "{sent:?}");
    for response in &up {
        assert_eq!(SipMsg::parse(response).unwrap().status(), Some(500));
    }
    let stats = p.stats();
    assert_eq!(
        (
            stats.failovers,
            stats.transport_errors,
            stats.unreachable_reports
        ),
        (2, 4, 6)
    );
    // The one that heard a 100 still waits for its answer from A.
    let ok = response_to(&first[2], 200, "OK", "");
    let (_, sent) = handle(&p, 4_000, A, &ok);
    assert_eq!(to(&sent, UAC).len(), 1, "{sent:?}");
    // A stateless proxy holds nothing to move: counted only.
    let stateless = Proxy::new(ProxyConfig {
        mode: Mode::Stateless,
        local: addr(PROXY),
        route_to: Some(addr(A)),
        ..ProxyConfig::default()
    });
    let inv = invite("z9hG4bKu9", "sip:bob@example.com", "");
    let _ = handle(&stateless, 0, UAC, &inv);
    let (outcome, sent) = unreachable(&stateless, 1_000, Transport::Udp, A);
    assert_eq!((outcome, sent.len()), (UnreachableOutcome::default(), 0));
    assert_eq!(stateless.stats().unreachable_reports, 1);
}
