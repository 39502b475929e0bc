//! State bounds of the proxy core (issue 19 part 4, review S8, S9): the
//! transaction table is bounded in bytes, CANCELs count against the table
//! bound, stale timer-heap entries stay bounded, and a REGISTER's Path is
//! bounded in bytes. Fake clock; no sockets.

mod common;
use common::*;
use ringway_sip::{Action, Mode, Proxy, ProxyConfig};

fn stateful(max_transactions: usize, max_transaction_bytes: usize) -> Proxy {
    Proxy::new(ProxyConfig {
        mode: Mode::Stateful,
        local: addr(PROXY),
        route_to: Some(addr(UAS)),
        record_route: true,
        max_transactions,
        max_transaction_bytes,
        domains: vec!["example.com".into()],
        ..ProxyConfig::default()
    })
}

/// Review S9: INVITEs of ~15 KB to a next hop that never answers. With a
/// count bound alone 100 000 of them held ~3 GB; the byte bound refuses
/// new ones (503) once the table holds its bytes, whatever the count.
#[test]
fn transaction_table_is_bounded_in_bytes() {
    const MAX: usize = 1 << 20;
    let p = stateful(100_000, MAX);
    let pad = format!("X-Pad: {}\r\n", "x".repeat(15_000));
    let (mut forwarded, mut refused) = (0, 0);
    for n in 0..200 {
        let inv = invite(&format!("z9hG4bKbig{n}"), "sip:bob@example.com", &pad);
        match handle(&p, n, UAC, &inv).0.action {
            Action::Forwarded { .. } => forwarded += 1,
            Action::Responded(503) => refused += 1,
            other => panic!("{other:?}"),
        }
    }
    let stats = p.stats();
    eprintln!(
        "forwarded {forwarded}, refused {refused}, {} transactions, {} bytes",
        stats.transactions_active, stats.transaction_bytes
    );
    assert!(refused > 100, "the byte bound never refused: {refused}");
    assert!((50..=70).contains(&forwarded), "{forwarded}");
    // At most one transaction beyond the bound (the one that crossed it).
    assert!(stats.transaction_bytes <= (MAX + 16 * 1024) as u64);
    assert_eq!(stats.transactions_active, forwarded);
    // The bytes come back when the transactions end (timer B, then gone).
    timer(&p, 40_000_000_000);
    timer(&p, 80_000_000_000);
    let stats = p.stats();
    assert_eq!(stats.transactions_active, 0);
    assert_eq!(stats.transaction_bytes, 0);
}

/// Review S8: the sender of an INVITE sends CANCELs with fresh branches
/// (RFC 2543 match: same Call-ID, tags, CSeq, Request-URI, source). Each
/// used to become a transaction outside `max_transactions`.
#[test]
fn cancels_count_against_the_transaction_bound() {
    let p = stateful(8, 1 << 30);
    let inv = invite("z9hG4bKinv", "sip:bob@example.com", "");
    assert_eq!(
        handle(&p, 0, UAC, &inv).0.action,
        Action::Forwarded { copies: 1 }
    );
    for n in 0..100 {
        let cancel = format!(
            "CANCEL sip:bob@example.com SIP/2.0\r\nVia: SIP/2.0/UDP 192.0.2.1:5060;branch=z9hG4bKc{n}\r\n\
             Max-Forwards: 70\r\nFrom: Alice <sip:alice@example.com>;tag=a1\r\nTo: Bob <sip:bob@example.com>\r\n\
             Call-ID: call-z9hG4bKinv@192.0.2.1\r\nCSeq: 1 CANCEL\r\nContent-Length: 0\r\n\r\n"
        );
        let (o, sent) = handle(&p, 1 + n, UAC, cancel.as_bytes());
        // Every CANCEL is still answered 200 (the call is cancelled once).
        assert_eq!(o.action, Action::Responded(200), "CANCEL {n}");
        assert!(sent
            .iter()
            .any(|(to, m)| *to == addr(UAC) && parse(m).status() == Some(200)));
    }
    let active = p.stats().transactions_active;
    assert!(active <= 8, "{active} transactions with max_transactions 8");
}

/// Review S9: every response matching a transaction reschedules it and
/// used to leave a stale heap entry until its deadline (timer C: 180 s).
/// A downstream sending 183s keeps the heap bounded now.
#[test]
fn stale_timer_entries_are_bounded() {
    let p = stateful(1000, 1 << 30);
    let inv = invite("z9hG4bKheap", "sip:bob@example.com", "");
    let (_, sent) = handle(&p, 0, UAC, &inv);
    let fwd = sent
        .iter()
        .find(|(to, _)| *to == addr(UAS))
        .unwrap()
        .1
        .clone();
    let ringing = response_to(&fwd, 183, "Session Progress", "");
    for n in 0..10_000 {
        handle(&p, 1 + n, UAS, &ringing);
    }
    let stats = p.stats();
    assert_eq!(stats.transactions_active, 1);
    assert!(
        stats.timer_entries <= 2 * 64 + 64,
        "{} heap entries for one transaction",
        stats.timer_entries
    );
}

/// Review S9: Path values are stored with every binding of a REGISTER:
/// bounded in bytes per REGISTER.
#[test]
fn register_path_is_bounded_in_bytes() {
    let p = Proxy::new(ProxyConfig {
        registrar: true,
        local: addr(PROXY),
        domains: vec!["example.com".into()],
        ..ProxyConfig::default()
    });
    let register = |path: &str| {
        format!(
            "REGISTER sip:example.com SIP/2.0\r\nVia: SIP/2.0/UDP 192.0.2.1:5060;branch=z9hG4bKr{}\r\n\
             Max-Forwards: 70\r\nFrom: <sip:alice@example.com>;tag=r1\r\nTo: <sip:alice@example.com>\r\n\
             Call-ID: reg@192.0.2.1\r\nCSeq: {} REGISTER\r\nContact: <sip:alice@192.0.2.1:5060>\r\n\
             Path: {path}\r\nSupported: path\r\nContent-Length: 0\r\n\r\n",
            path.len(),
            path.len()
        )
    };
    let short = "<sip:192.0.2.50;lr>";
    let (o, _) = handle(&p, 0, UAC, register(short).as_bytes());
    assert_eq!(o.action, Action::Responded(200));
    let long = format!("<sip:{}@192.0.2.50;lr>", "p".repeat(1100));
    let (o, sent) = handle(&p, 1, UAC, register(&long).as_bytes());
    assert_eq!(o.action, Action::Responded(400), "a 1.1 KB Path is refused");
    assert!(String::from_utf8_lossy(&sent[0].1).contains("Path Too Long"));
    assert_eq!(p.bindings(), Some(1));
}
