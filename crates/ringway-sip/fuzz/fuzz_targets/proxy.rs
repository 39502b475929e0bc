//! Fuzz the proxy core: a sequence of datagrams (split on 0xFF) through a
//! stateful and a stateless proxy with timers between them.
#![no_main]

use libfuzzer_sys::fuzz_target;
use ringway_sip::{Mode, Proxy, ProxyConfig};
use std::net::SocketAddr;

fuzz_target!(|data: &[u8]| {
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
    let proxies = [mk(Mode::Stateful), mk(Mode::Stateless)];
    let src: SocketAddr = "192.0.2.1:5060".parse().unwrap();
    let mut now = 0u64;
    let mut sink = |to: SocketAddr, b: &[u8]| {
        assert!(to.port() != 0 && !b.is_empty());
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
        assert!(p.stats().transactions_active <= 8 + 8);
    }
});
