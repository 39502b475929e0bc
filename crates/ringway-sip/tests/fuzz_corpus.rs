//! Replays the cargo-fuzz corpus (crates/ringway-sip/fuzz/corpus) in every
//! `cargo test`, with the fuzz targets' invariants, so inputs that once
//! crashed the parser or the proxy stay fixed without cargo-fuzz installed.

use ringway_sip::{
    forward_request, forward_response, Mode, Proxy, ProxyConfig, RequestEdits, SipMsg, ViaEdit,
};
use std::net::SocketAddr;
use std::path::PathBuf;

fn corpus(target: &str) -> Vec<(String, Vec<u8>)> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz/corpus")
        .join(target);
    let mut v: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| {
            let p = e.unwrap().path();
            (p.display().to_string(), std::fs::read(&p).unwrap())
        })
        .collect();
    v.sort();
    assert!(v.len() >= 10, "corpus {target} has only {} inputs", v.len());
    v
}

#[test]
fn parse_corpus_keeps_the_editor_invariants() {
    let mut parsed = 0;
    for (name, data) in corpus("parse") {
        let _ = SipMsg::parse_loose(&data);
        let Ok(m) = SipMsg::parse(&data) else {
            continue;
        };
        parsed += 1;
        let mut out = Vec::new();
        if m.is_request() {
            let routes = m.routes().count();
            let edits = RequestEdits {
                via: Some(ViaEdit {
                    transport: "UDP",
                    sent_by: "192.0.2.10:5060",
                    branch: "z9hG4bKfuzz",
                }),
                max_forwards: true,
                record_route: Some("sip:192.0.2.10:5060;lr"),
                pop_route: routes > 0,
                request_uri: Some("sip:x@192.0.2.20"),
                pop_last_route: routes > 1,
                received: Some("192.0.2.1"),
                rport: Some(5060),
                strict_next_hop: None,
            };
            if forward_request(&m, &edits, &mut out).is_ok() {
                let f = SipMsg::parse(&out)
                    .unwrap_or_else(|e| panic!("{name}: forwarded request does not parse: {e:?}"));
                assert_eq!(f.call_id(), m.call_id(), "{name}");
                assert_eq!(f.body(), m.body(), "{name}");
                assert_eq!(f.vias().count(), m.vias().count() + 1, "{name}");
            }
        } else if forward_response(&m, &mut out).is_ok() && m.vias().count() > 1 {
            let f = SipMsg::parse(&out)
                .unwrap_or_else(|e| panic!("{name}: forwarded response does not parse: {e:?}"));
            assert_eq!(f.vias().count() + 1, m.vias().count(), "{name}");
        }
    }
    assert!(parsed > 0, "no corpus input parsed");
}

#[test]
fn proxy_corpus_never_emits_to_port_0_and_bounds_the_table() {
    let mk = |mode| {
        Proxy::new(ProxyConfig {
            mode,
            local: "192.0.2.10:5060".parse().unwrap(),
            route_to: Some("192.0.2.20:5060".parse().unwrap()),
            registrar: true,
            record_route: true,
            max_transactions: 8,
            domains: vec!["example.com".into()],
        })
    };
    let src: SocketAddr = "192.0.2.1:5060".parse().unwrap();
    for (name, data) in corpus("proxy") {
        let proxies = [mk(Mode::Stateful), mk(Mode::Stateless)];
        let mut now = 0u64;
        let mut sink = |to: SocketAddr, b: &[u8]| {
            assert!(
                to.port() != 0 && !b.is_empty(),
                "{name}: bad output to {to}"
            );
        };
        for (i, dg) in data.split(|&b| b == 0xFF).enumerate() {
            for p in &proxies {
                p.handle(now, src, dg, &mut sink);
                p.on_timer(now, &mut sink);
            }
            now += (i as u64 % 7) * 3_000_000_000;
        }
        for p in &proxies {
            p.on_timer(now + 400_000_000_000, &mut sink);
            assert!(p.stats().transactions_active <= 16, "{name}");
        }
    }
}
