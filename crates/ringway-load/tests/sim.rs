//! Deterministic whole-system simulation of `ringway sip load`'s call
//! generator: a [`CallGen`] as UAC ↔ the sans-IO [`Proxy`] (stateless and
//! stateful) ↔ a [`CallGen`] as UAS, over an in-memory link that loses,
//! duplicates, reorders and delays datagrams, with a fake clock and seeded
//! random generators (in the style of smoltcp's `tests/netsim.rs` and
//! quinn-proto's `Pair`). Addresses are from the documentation range
//! 192.0.2.0/24; nothing touches a network.
//!
//! For each seed the tests check that the impairments and the
//! retransmission timers really happened (counted), that every call
//! completed anyway, and that a seed always gives the same trace (every
//! delivered datagram with its time) and another seed a different one.

mod netsim;

use netsim::*;
use ringway_load::sip::{CallGen, CallGenConfig, CallStats};
use ringway_sip::{Mode, Proxy, ProxyConfig, ProxyStats};
use std::net::SocketAddr;
use std::time::Duration;

const UAC: &str = "192.0.2.10:5060";
const PROXY: &str = "192.0.2.20:5060";
const UAS: &str = "192.0.2.30:5060";

/// One simulated run.
#[derive(Copy, Clone, Debug)]
struct Scenario {
    seed: u64,
    mode: Mode,
    calls: u64,
    link: LinkConfig,
    /// The UAC generator answers its own calls (no separate UAS).
    builtin_uas: bool,
}

impl Scenario {
    fn new(seed: u64, mode: Mode) -> Scenario {
        Scenario {
            seed,
            mode,
            calls: 100,
            link: MODERATE,
            builtin_uas: false,
        }
    }
}

/// What a run did.
#[derive(Debug)]
struct Report {
    link: LinkCounts,
    trace: u64,
    end: u64,
    uac: CallStats,
    /// The UAS's counts (the UAC's own with `builtin_uas`).
    uas: CallStats,
    proxy: ProxyStats,
    /// Calls the UAC had in flight and the UAS had waiting for ACK at the end.
    left: (usize, usize),
    /// Datagrams sent to an address no node has.
    undeliverable: u64,
}

impl Report {
    /// Everything that must be equal for the same seed.
    fn fingerprint(&self) -> impl PartialEq + std::fmt::Debug {
        let c = |s: &CallStats| {
            (
                s.attempted,
                s.succeeded,
                s.failed.clone(),
                [
                    s.retrans_invite,
                    s.retrans_bye,
                    s.retrans_200,
                    s.retrans_ack,
                ],
                [s.uas_calls, s.uas_ack_timeouts, s.msgs_ignored],
            )
        };
        (
            self.link.clone(),
            self.trace,
            self.end,
            c(&self.uac),
            c(&self.uas),
            self.proxy.retransmissions_sent,
        )
    }
}

fn generator(local: &str, uas: Option<&str>, index: usize) -> CallGen {
    CallGen::new(&CallGenConfig {
        local: addr(local),
        uas: uas.map(addr),
        proxy: Some(addr(PROXY)),
        run_id: "5eed0000".into(),
        index,
        t1: Duration::from_millis(500),
        t2: Duration::from_secs(4),
        // Longer than any link delay: no copy of an INVITE can reach the
        // UAS after the BYE and open a call nobody ACKs.
        hold: Duration::from_secs(1),
        overload_control: false,
    })
}

/// The UAC, the proxy and the UAS on one link, and the clock.
struct Sim {
    sc: Scenario,
    now: u64,
    link: Link,
    /// Call starts: spacing and batch sizes.
    starts: Starts,
    uac: CallGen,
    uas: Option<CallGen>,
    proxy: ProxyNode,
    trace: Trace,
    undeliverable: u64,
}

impl Sim {
    fn new(sc: Scenario) -> Sim {
        let (uac, uas) = if sc.builtin_uas {
            (generator(UAC, None, 0), None)
        } else {
            (generator(UAC, Some(UAS), 0), Some(generator(UAS, None, 1)))
        };
        Sim {
            sc,
            now: 0,
            link: Link::new(sc.link, sc.seed),
            starts: Starts::new(sc.seed ^ 0x5742_7473, sc.calls),
            uac,
            uas,
            proxy: ProxyNode(Proxy::new(ProxyConfig {
                mode: sc.mode,
                local: addr(PROXY),
                record_route: true,
                // Calls go to the UAS (or the UAC's own) by IP-literal
                // Request-URI in the simulated network.
                relay: "192.0.2.0/24".parse().expect("network"),
                ..ProxyConfig::default()
            })),
            trace: Trace(0xcbf2_9ce4_8422_2325),
            undeliverable: 0,
        }
    }

    /// Send what node `from` emitted.
    fn send_all(&mut self, from: SocketAddr, sent: Sent) {
        self.link.send_all(self.now, from, sent);
    }

    fn deliver(&mut self, p: Packet) {
        self.trace.delivered(self.now, &p);
        let now = self.now;
        let mut sent = Sent::new();
        if p.dst == addr(PROXY) {
            self.proxy.handle(now, p.src, &p.data, &mut sent);
        } else if p.dst == addr(UAC) {
            self.uac
                .handle(now, now, p.src, &p.data, &mut collect(&mut sent));
        } else if let (Some(uas), true) = (self.uas.as_mut(), p.dst == addr(UAS)) {
            uas.handle(now, now, p.src, &p.data, &mut collect(&mut sent));
        } else {
            self.undeliverable += 1;
        }
        self.send_all(p.dst, sent);
    }

    fn done(&self) -> bool {
        let uas_waiting = self.uas.as_ref().unwrap_or(&self.uac).uas_calls_waiting();
        self.starts.all_started()
            && self.uac.calls_in_flight() == 0
            && uas_waiting == 0
            && self.link.is_empty()
    }

    /// Advance to the next event and handle everything due then; false
    /// when nothing is left to happen.
    fn step(&mut self) -> bool {
        let starts = self.starts.next_at();
        let next = [
            starts,
            self.link.next_at(),
            self.uac.next_deadline(),
            self.uas.as_ref().and_then(CallGen::next_deadline),
            self.proxy.next_deadline(),
        ]
        .into_iter()
        .flatten()
        .min();
        let Some(t) = next else {
            return false;
        };
        self.now = self.now.max(t);
        let now = self.now;
        let count = self.starts.due(now);
        if count > 0 {
            let mut sent = Sent::new();
            self.uac.start_calls(now, count, &mut collect(&mut sent));
            self.send_all(addr(UAC), sent);
        }
        while let Some(p) = self.link.pop_due(now) {
            self.deliver(p);
        }
        let mut sent = Sent::new();
        self.uac.on_timer(now, &mut collect(&mut sent));
        self.send_all(addr(UAC), sent);
        if let Some(uas) = self.uas.as_mut() {
            let mut sent = Sent::new();
            uas.on_timer(now, &mut collect(&mut sent));
            self.send_all(addr(UAS), sent);
        }
        let mut sent = Sent::new();
        self.proxy.on_timer(now, &mut sent);
        self.send_all(addr(PROXY), sent);
        true
    }

    fn run(mut self) -> Report {
        let mut steps = 0;
        while !self.done() && self.step() {
            steps += 1;
            assert!(steps < MAX_STEPS, "{:?}: too many steps", self.sc);
            assert!(self.now < MAX_SIM_TIME, "{:?}: ran too long", self.sc);
        }
        let uas = self.uas.as_ref().unwrap_or(&self.uac);
        let left = (self.uac.calls_in_flight(), uas.uas_calls_waiting());
        let uas = uas.stats().clone();
        Report {
            link: self.link.counts,
            trace: self.trace.0,
            end: self.now,
            uac: self.uac.into_stats(),
            uas,
            proxy: self.proxy.0.stats(),
            left,
            undeliverable: self.undeliverable,
        }
    }
}

fn run(sc: Scenario) -> Report {
    let r = Sim::new(sc).run();
    eprintln!(
        "seed {} {:?}{}: link {:?}; UAC retrans INVITE {} BYE {} ACK {}; UAS retrans 200 {} calls {}; \
         proxy retrans sent {} absorbed {}; ended at {:.3} s",
        sc.seed,
        sc.mode,
        if sc.builtin_uas { " (built-in UAS)" } else { "" },
        r.link,
        r.uac.retrans_invite,
        r.uac.retrans_bye,
        r.uac.retrans_ack,
        r.uas.retrans_200,
        r.uas.uas_calls,
        r.proxy.retransmissions_sent,
        r.proxy.retransmissions_absorbed,
        r.end as f64 / 1e9
    );
    r
}

/// The impairments happened, the retransmission timers fired, and every
/// call completed.
fn check(sc: Scenario, r: &Report) {
    let l = &r.link;
    assert!(l.lost > 0, "{sc:?}: no datagram lost: {l:?}");
    assert!(l.duplicated > 0, "{sc:?}: no datagram duplicated: {l:?}");
    assert!(l.reordered > 0, "{sc:?}: no datagram reordered: {l:?}");
    assert_eq!(l.delivered, l.sent - l.lost + l.duplicated, "{sc:?}");
    assert_eq!(r.undeliverable, 0, "{sc:?}");
    // Every call completed, on both sides.
    assert_eq!(r.uac.attempted, sc.calls, "{sc:?}");
    assert_eq!(r.uac.succeeded, sc.calls, "{sc:?}: {:?}", r.uac.failed);
    assert!(r.uac.failed.is_empty(), "{sc:?}: {:?}", r.uac.failed);
    assert_eq!(r.left, (0, 0), "{sc:?}");
    assert!(r.uas.uas_calls >= sc.calls, "{sc:?}: {:?}", r.uas);
    assert_eq!(r.uas.uas_ack_timeouts, 0, "{sc:?}: {:?}", r.uas);
    assert_eq!(r.uac.msgs_ignored + r.uas.msgs_ignored, 0, "{sc:?}");
    // Timers A (INVITE), E (BYE) and the UAS's 200-until-ACK all fired.
    assert!(r.uac.retrans_invite > 0, "{sc:?}: {:?}", r.uac);
    assert!(r.uac.retrans_bye > 0, "{sc:?}: {:?}", r.uac);
    assert!(r.uas.retrans_200 > 0, "{sc:?}: {:?}", r.uas);
    // Response times are measured on the simulated clock: one per call,
    // none shorter than the four one-way link delays of a round trip
    // through the proxy.
    let min_us = 4 * sc.link.delay / 1000;
    for h in [&r.uac.invite_to_200, &r.uac.bye_to_200] {
        assert_eq!(h.len(), sc.calls, "{sc:?}");
        assert!(h.min() >= min_us, "{sc:?}: {} µs", h.min());
    }
    // The proxy timed nothing out.
    assert_eq!(r.proxy.transactions_timed_out, 0, "{sc:?}: {:?}", r.proxy);
}

const SEEDS: [u64; 3] = [1, 2, 3];

#[test]
fn calls_complete_through_a_stateless_proxy_over_a_bad_link() {
    for seed in SEEDS {
        let sc = Scenario::new(seed, Mode::Stateless);
        check(sc, &run(sc));
    }
}

#[test]
fn calls_complete_through_a_stateful_proxy_over_a_bad_link() {
    for seed in SEEDS {
        let sc = Scenario::new(seed, Mode::Stateful);
        let r = run(sc);
        check(sc, &r);
        // The stateful proxy retransmits too, and absorbs retransmissions.
        assert!(r.proxy.retransmissions_sent > 0, "{sc:?}: {:?}", r.proxy);
        assert!(
            r.proxy.retransmissions_absorbed > 0,
            "{sc:?}: {:?}",
            r.proxy
        );
    }
}

#[test]
fn calls_complete_with_the_generators_own_uas() {
    for mode in [Mode::Stateless, Mode::Stateful] {
        let sc = Scenario {
            builtin_uas: true,
            ..Scenario::new(4, mode)
        };
        check(sc, &run(sc));
    }
}

#[test]
fn a_seed_gives_one_trace_and_another_seed_another() {
    for mode in [Mode::Stateless, Mode::Stateful] {
        let a = run(Scenario::new(7, mode));
        let again = run(Scenario::new(7, mode));
        let b = run(Scenario::new(8, mode));
        assert_eq!(a.fingerprint(), again.fingerprint(), "{mode:?}");
        assert_ne!(a.trace, b.trace, "{mode:?}");
        assert_ne!(a.link, b.link, "{mode:?}");
    }
}
