//! The registrar with a store reached through the driver (deferred
//! queries, resumption, fail closed) and Path (RFC 3327) kept with a
//! binding and followed on lookups. Sans-IO: a queue that records what the
//! core hands it stands in for the driver.

mod common;

use common::*;
use ringway_sip::proxy::{DeferredRequest, QueueFull, StoreQueue};
use ringway_sip::registrar::{BindingChange, StoreQuery};
use ringway_sip::{
    Action, LocationStore, MemoryStore, Mode, Proxy, ProxyConfig, SipMsg, StoreError,
};
use std::sync::{Arc, Mutex};

const S: u64 = 1_000_000_000;

fn cfg(mode: Mode) -> ProxyConfig {
    ProxyConfig {
        mode,
        local: addr(PROXY),
        registrar: true,
        record_route: true,
        domains: vec!["example.com".into()],
        ..ProxyConfig::default()
    }
}

fn register(call_id: &str, cseq: u32, contact: &str, extra: &str) -> Vec<u8> {
    format!(
        "REGISTER sip:example.com SIP/2.0\r\nVia: SIP/2.0/UDP 192.0.2.50:5060;branch=z9hG4bKd{call_id}{cseq}\r\n\
Max-Forwards: 70\r\nFrom: <sip:carol@example.com>;tag=r\r\nTo: <sip:carol@example.com>\r\n\
Call-ID: {call_id}\r\nCSeq: {cseq} REGISTER\r\nContact: <{contact}>\r\n{extra}Content-Length: 0\r\n\r\n"
    )
    .into_bytes()
}

fn status(sent: &[(std::net::SocketAddr, Vec<u8>)]) -> Vec<u16> {
    sent.iter()
        .filter_map(|(_, b)| SipMsg::parse(b).ok()?.status())
        .collect()
}

/// A queue of bounded capacity that keeps what it is handed.
struct Recorder {
    capacity: usize,
    taken: Mutex<Vec<DeferredRequest>>,
}

impl StoreQueue for Recorder {
    fn submit(&self, request: DeferredRequest) -> Result<(), QueueFull> {
        let mut taken = self.taken.lock().unwrap();
        if taken.len() >= self.capacity {
            return Err(QueueFull);
        }
        taken.push(request);
        Ok(())
    }
}

fn deferred_proxy(mode: Mode, capacity: usize) -> (Proxy, Arc<Recorder>) {
    let queue = Arc::new(Recorder {
        capacity,
        taken: Mutex::new(Vec::new()),
    });
    (Proxy::with_store_queue(cfg(mode), queue.clone()), queue)
}

fn resume(
    p: &Proxy,
    request: &DeferredRequest,
    answer: ringway_sip::registrar::StoreAnswer,
    now: u64,
) -> (Action, Sent) {
    let mut sent = Vec::new();
    let o = p
        .worker()
        .resume(request, answer, now, &mut |a, b| sent.push((a, b.to_vec())));
    (o.action, sent)
}

#[test]
fn deferred_register_and_lookup_resume_with_the_stores_answer() {
    for mode in [Mode::Stateless, Mode::Stateful] {
        let (p, queue) = deferred_proxy(mode, 8);
        let store = MemoryStore::new(100);
        let reg = register("d1", 1, "sip:carol@192.0.2.2:5060", "Expires: 60\r\n");
        let (o, sent) = handle(&p, 0, "192.0.2.50:5060", &reg);
        assert_eq!(o.action, Action::Deferred, "{mode:?}");
        assert!(sent.is_empty(), "nothing answered before the store did");
        let job = queue.taken.lock().unwrap().remove(0);
        let StoreQuery::Register(registration) = &job.query else {
            panic!("{:?}", job.query)
        };
        assert_eq!(
            (registration.aor.as_str(), registration.call_id.as_str()),
            ("carol@example.com", "d1")
        );
        assert_eq!(
            registration.changes,
            vec![BindingChange::Bind {
                contact: "sip:carol@192.0.2.2:5060".into(),
                expires: 60,
                outbound: None,
            }]
        );
        let answer = job.query.run(&store, 10);
        let (action, sent) = resume(&p, &job, answer, 10);
        assert_eq!(action, Action::Responded(200), "{mode:?}");
        assert_eq!(status(&sent), [200]);
        let text = String::from_utf8_lossy(&sent[0].1).to_string();
        assert!(
            text.contains("Contact: <sip:carol@192.0.2.2:5060>;expires=60"),
            "{text}"
        );

        // A call to carol waits for its lookup, then goes to her contact.
        let inv = invite("z9hG4bKdi", "sip:carol@example.com", "");
        let (o, sent) = handle(&p, 20, UAC, &inv);
        assert_eq!((o.action, sent.len()), (Action::Deferred, 0));
        let job = queue.taken.lock().unwrap().remove(0);
        assert_eq!(
            job.query,
            StoreQuery::Lookup {
                aor: "carol@example.com".into()
            }
        );
        let (action, sent) = resume(&p, &job, job.query.run(&store, 30), 30);
        assert_eq!(action, Action::Forwarded { copies: 1 }, "{mode:?}");
        assert!(sent.iter().any(|(to, _)| *to == addr("192.0.2.2:5060")));
        let stats = p.stats();
        assert_eq!(stats.store_deferred, 2);
        assert_eq!(
            stats.requests_received, 2,
            "resumption counts nothing twice"
        );
        assert_eq!(
            stats.bindings, None,
            "a remote store is not counted locally"
        );
    }
}

#[test]
fn store_unavailable_fails_closed_and_is_counted() {
    let (p, queue) = deferred_proxy(Mode::Stateless, 1);
    let reg = register("u1", 1, "sip:carol@192.0.2.2:5060", "");
    assert_eq!(
        handle(&p, 0, "192.0.2.50:5060", &reg).0.action,
        Action::Deferred
    );
    // The queue is full: the next REGISTER is refused at once, 500 with
    // Retry-After, and a call gets 480.
    let (o, sent) = handle(
        &p,
        0,
        "192.0.2.50:5060",
        &register("u2", 1, "sip:x@192.0.2.3", ""),
    );
    assert_eq!(o.action, Action::Responded(500));
    let text = String::from_utf8_lossy(&sent[0].1).to_string();
    assert!(text.contains("\r\nRetry-After: 5\r\n"), "{text}");
    let (o, _) = handle(&p, 0, UAC, &invite("z9hG4bKu", "sip:carol@example.com", ""));
    assert_eq!(o.action, Action::Responded(480));
    // The store answered "unavailable" (down, late, unreadable reply).
    let job = queue.taken.lock().unwrap().remove(0);
    let (action, sent) = resume(&p, &job, Err(StoreError::Unavailable), 5);
    assert_eq!(action, Action::Responded(500));
    assert!(String::from_utf8_lossy(&sent[0].1).contains("Retry-After: 5"));
    let stats = p.stats();
    assert_eq!(stats.store_queue_full, 2);
    assert_eq!(stats.store_unavailable_registers, 2);
    assert_eq!(stats.store_unavailable_lookups, 1);
    assert_eq!(stats.responses_generated.get(&500), Some(&2));
    assert_eq!(stats.responses_generated.get(&480), Some(&1));
}

#[test]
fn out_of_order_register_from_the_store_gets_400() {
    let (p, queue) = deferred_proxy(Mode::Stateless, 4);
    handle(
        &p,
        0,
        "192.0.2.50:5060",
        &register("o1", 3, "sip:carol@192.0.2.2", ""),
    );
    let job = queue.taken.lock().unwrap().remove(0);
    let (action, _) = resume(&p, &job, Err(StoreError::OutOfOrder), 1);
    assert_eq!(action, Action::Responded(400));
}

#[test]
fn a_stateful_retransmission_resumed_after_the_first_is_absorbed() {
    let (p, queue) = deferred_proxy(Mode::Stateful, 4);
    let store = MemoryStore::new(10);
    store
        .register(
            &ringway_sip::registrar::Registration {
                aor: "carol@example.com".into(),
                call_id: "x".into(),
                cseq: 1,
                path: Vec::new(),
                flow: None,
                changes: vec![BindingChange::Bind {
                    contact: "sip:carol@192.0.2.2".into(),
                    expires: 60,
                    outbound: None,
                }],
                max_contacts: 4,
            },
            0,
        )
        .unwrap();
    let inv = invite("z9hG4bKrt", "sip:carol@example.com", "");
    handle(&p, 0, UAC, &inv);
    handle(&p, 1, UAC, &inv);
    let jobs: Vec<_> = queue.taken.lock().unwrap().drain(..).collect();
    assert_eq!(jobs.len(), 2);
    let (first, _) = resume(&p, &jobs[0], jobs[0].query.run(&store, 2), 2);
    let (second, sent) = resume(&p, &jobs[1], jobs[1].query.run(&store, 3), 3);
    assert_eq!(first, Action::Forwarded { copies: 1 });
    assert_eq!(second, Action::Absorbed, "one transaction, not two");
    assert!(
        sent.iter().all(|(to, _)| *to == addr(UAC)),
        "only 100 again"
    );
    assert_eq!(p.stats().transactions_created, 1);
}

#[test]
fn path_is_stored_echoed_and_followed() {
    let p = Proxy::new(cfg(Mode::Stateless));
    // Registered through an edge proxy (the dispatcher) that added Path.
    let reg = register(
        "p1",
        1,
        "sip:carol@192.0.2.2:5070",
        "Path: <sip:192.0.2.60:5060;lr>\r\nSupported: path\r\n",
    );
    let (o, sent) = handle(&p, 0, "192.0.2.60:5060", &reg);
    assert_eq!(o.action, Action::Responded(200));
    let text = String::from_utf8_lossy(&sent[0].1).to_string();
    assert!(
        text.contains("\r\nPath: <sip:192.0.2.60:5060;lr>\r\n"),
        "{text}"
    );
    let binding = &p.store().unwrap().lookup("carol@example.com", 0).unwrap()[0];
    assert_eq!(binding.path, ["<sip:192.0.2.60:5060;lr>"]);
    // No Supported: path, no echo (the Path is stored all the same).
    let reg = register(
        "p1",
        2,
        "sip:carol@192.0.2.2:5070",
        "Path: <sip:192.0.2.60:5060;lr>\r\n",
    );
    let (_, sent) = handle(&p, S, "192.0.2.60:5060", &reg);
    assert!(!String::from_utf8_lossy(&sent[0].1).contains("Path:"));

    // A call to carol goes to the Path's first hop, with the Path as Route
    // and her contact as Request-URI.
    let inv = invite("z9hG4bKpa", "sip:carol@example.com", "");
    let (o, sent) = handle(&p, 2 * S, UAC, &inv);
    assert_eq!(o.action, Action::Forwarded { copies: 1 });
    let (to, bytes) = &sent[0];
    assert_eq!(*to, addr("192.0.2.60:5060"));
    let fwd = parse(bytes);
    assert_eq!(fwd.request_uri(), Some("sip:carol@192.0.2.2:5070"));
    let routes: Vec<&str> = fwd.routes().map(|r| r.uri).collect();
    assert_eq!(routes, ["sip:192.0.2.60:5060;lr"]);
}

#[test]
fn path_with_a_name_is_not_followed() {
    let p = Proxy::new(cfg(Mode::Stateless));
    let reg = register(
        "n1",
        1,
        "sip:carol@192.0.2.2:5070",
        "Path: <sip:edge.example.net;lr>\r\n",
    );
    handle(&p, 0, "192.0.2.60:5060", &reg);
    let (o, _) = handle(
        &p,
        1,
        UAC,
        &invite("z9hG4bKpn", "sip:carol@example.com", ""),
    );
    assert_eq!(o.action, Action::Responded(480), "we resolve no names");
}
