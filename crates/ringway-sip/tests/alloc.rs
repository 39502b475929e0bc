//! The stateless hot path (parse, forward request, forward response) does not
//! allocate once warmed up (counted per thread by `allocation-counter`).

mod common;
use common::*;
use ringway_sip::{Action, Mode, Proxy, ProxyConfig, SipMsg};

/// Run `f`, returning its result and how many allocations this thread made.
fn counted<R>(f: impl FnOnce() -> R) -> (R, u64) {
    let mut r = None;
    let info = allocation_counter::measure(|| r = Some(f()));
    (r.expect("closure ran"), info.count_total)
}

#[test]
fn stateless_forwarding_does_not_allocate() {
    // The counter itself works.
    assert!(counted(|| std::hint::black_box(vec![1u8; 10])).1 >= 1);
    let p = Proxy::new(ProxyConfig {
        mode: Mode::Stateless,
        local: addr(PROXY),
        route_to: Some(addr(UAS)),
        registrar: false,
        record_route: true,
        max_transactions: 1000,
        domains: vec!["example.com".into()],
        ..ProxyConfig::default()
    });
    let invs: Vec<Vec<u8>> = (0..50)
        .map(|i| invite(&format!("z9hG4bKa{i}"), "sip:bob@example.com", ""))
        .collect();
    let mut worker = p.worker();
    let mut fwd = Vec::new();
    worker.handle(0, addr(UAC), &invs[0], &mut |a, b| {
        if a == addr(UAS) {
            fwd = b.to_vec()
        }
    });
    let resp = response_to(&fwd, 200, "OK", "");
    // warm-up (the worker's scratch buffer, counters, finder)
    worker.handle(0, addr(UAS), &resp, &mut |_, _| {});

    let (sent, allocs) = counted(|| {
        let mut sent = 0usize;
        for inv in &invs {
            let o = worker.handle(1, addr(UAC), inv, &mut |_, b| sent += b.len());
            assert_eq!(o.action, Action::Forwarded { copies: 1 });
            let o = worker.handle(1, addr(UAS), &resp, &mut |_, b| sent += b.len());
            assert_eq!(o.action, Action::Forwarded { copies: 1 });
            assert!(SipMsg::parse(inv).is_ok());
        }
        sent
    });
    assert!(sent > 0);
    assert_eq!(allocs, 0, "allocations on the stateless hot path");
}
