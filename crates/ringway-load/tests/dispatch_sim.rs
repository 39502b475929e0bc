//! Deterministic simulation of the scale-out: a [`CallGen`] UAC → the
//! sans-IO [`Dispatcher`] → N stateless [`Proxy`] cores → a [`CallGen`]
//! UAS, over the seeded lossy link of `netsim`, with the dispatcher's
//! OPTIONS probes answered by the proxies. One proxy is killed mid-run (it
//! stops answering anything). The tests check, on the simulated clock,
//! that the dispatcher takes it out after the configured unanswered probes,
//! that only the calls whose rendezvous home was that proxy move (every
//! other call keeps its proxy through the whole run), that every call not
//! homed on it completes despite the loss, and that a seed gives one trace.
//! (`crates/ringway/tests/sip_scaleout.rs` runs the same story with real
//! processes, SIPp and redis-server.)

mod netsim;

use netsim::*;
use ringway_load::sip::{CallGen, CallGenConfig, CallStats};
use ringway_sip::dispatch::{rendezvous, DispatchConfig, DispatchStats, Dispatcher};
use ringway_sip::{Mode, Proxy, ProxyConfig, SipMsg};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

const UAC: &str = "192.0.2.10:5060";
const DISPATCHER: &str = "192.0.2.100:5060";
const PROXIES: [&str; 4] = [
    "192.0.2.11:5060",
    "192.0.2.12:5060",
    "192.0.2.13:5060",
    "192.0.2.14:5060",
];
const UAS: &str = "192.0.2.30:5060";
const PROBE_INTERVAL: u64 = 100 * MS;
const PROBE_FAILURES: u32 = 3;

/// Loss only (5 %): the story is about which proxy gets what.
const LOSSY: LinkConfig = LinkConfig {
    loss: 0.05,
    duplicate: 0.0,
    reorder: 0.0,
    reorder_delay: (0, 0),
    delay: MS,
    jitter: MS,
};

/// One run: `calls` calls, proxy `victim` killed at `kill_at`.
#[derive(Copy, Clone, Debug)]
struct Scenario {
    seed: u64,
    calls: u64,
    victim: usize,
    kill_at: u64,
}

/// Where each INVITE copy of a call went: (time, proxy index).
type Routes = BTreeMap<String, Vec<(u64, usize)>>;

struct Sim {
    sc: Scenario,
    now: u64,
    link: Link,
    starts: Starts,
    /// Call-ID → simulated time of its first INVITE.
    started_at: BTreeMap<String, u64>,
    uac: CallGen,
    uas: CallGen,
    dispatcher: Dispatcher,
    proxies: Vec<ProxyNode>,
    /// When the dispatcher first had the victim out.
    detected_at: Option<u64>,
    routes: Routes,
    trace: Trace,
    /// Datagrams that reached the killed proxy (dropped).
    to_dead: u64,
}

fn generator(local: &str, uas: Option<&str>, index: usize) -> CallGen {
    CallGen::new(&CallGenConfig {
        local: addr(local),
        uas: uas.map(addr),
        proxy: Some(addr(DISPATCHER)),
        run_id: "d15a0000".into(),
        index,
        t1: Duration::from_millis(500),
        t2: Duration::from_secs(4),
        hold: Duration::from_millis(200),
        overload_control: false,
    })
}

impl Sim {
    fn new(sc: Scenario) -> Sim {
        let proxies = PROXIES
            .iter()
            .map(|p| {
                ProxyNode(Proxy::new(ProxyConfig {
                    mode: Mode::Stateless,
                    local: addr(p),
                    record_route: true,
                    relay: "192.0.2.0/24".parse().expect("network"),
                    ..ProxyConfig::default()
                }))
            })
            .collect();
        Sim {
            sc,
            now: 0,
            link: Link::new(LOSSY, sc.seed),
            starts: Starts::new(sc.seed ^ 0xd15, sc.calls),
            started_at: BTreeMap::new(),
            uac: generator(UAC, Some(UAS), 0),
            uas: generator(UAS, None, 1),
            dispatcher: Dispatcher::new(DispatchConfig {
                local: addr(DISPATCHER),
                proxies: PROXIES
                    .iter()
                    .map(|p| ringway_sip::TransportAddr::udp(addr(p)))
                    .collect(),
                listeners: Vec::new(),
                probe_interval: PROBE_INTERVAL,
                probe_failures: PROBE_FAILURES,
                record_route: true,
                secret: {
                    let mut key = [0u8; 32];
                    key[..8].copy_from_slice(&sc.seed.to_le_bytes());
                    key
                },
                // The UAS is an IP literal in the simulated network.
                relay: "192.0.2.0/24".parse().expect("network"),
                flood: None,
            }),
            proxies,
            detected_at: None,
            routes: Routes::new(),
            trace: Trace(0xcbf2_9ce4_8422_2325),
            to_dead: 0,
        }
    }

    fn killed(&self) -> bool {
        self.now >= self.sc.kill_at
    }

    fn send_all(&mut self, from: SocketAddr, sent: Sent) {
        self.link.send_all(self.now, from, sent);
    }

    /// Note the proxy each INVITE the dispatcher sends goes to.
    fn note_routes(&mut self, sent: &Sent) {
        for (dst, data) in sent {
            let Some(index) = PROXIES.iter().position(|p| addr(p) == *dst) else {
                continue;
            };
            if !data.starts_with(b"INVITE ") {
                continue;
            }
            let msg = SipMsg::parse(data).expect("the dispatcher sends well-formed INVITEs");
            let call_id = msg.call_id().expect("Call-ID").to_string();
            self.started_at.entry(call_id.clone()).or_insert(self.now);
            self.routes
                .entry(call_id)
                .or_default()
                .push((self.now, index));
        }
    }

    fn deliver(&mut self, packet: Packet) {
        self.trace.delivered(self.now, &packet);
        let now = self.now;
        let mut sent = Sent::new();
        if packet.dst == addr(DISPATCHER) {
            self.dispatcher
                .worker()
                .handle(now, packet.src, &packet.data, &mut |to, b| {
                    sent.push((to, b.to_vec()))
                });
            self.note_routes(&sent);
        } else if let Some(index) = PROXIES.iter().position(|p| addr(p) == packet.dst) {
            if index == self.sc.victim && self.killed() {
                self.to_dead += 1;
                return;
            }
            self.proxies[index].handle(now, packet.src, &packet.data, &mut sent);
        } else if packet.dst == addr(UAC) {
            self.uac
                .handle(now, now, packet.src, &packet.data, &mut collect(&mut sent));
        } else if packet.dst == addr(UAS) {
            self.uas
                .handle(now, now, packet.src, &packet.data, &mut collect(&mut sent));
        } else {
            panic!("datagram to {} nobody has", packet.dst);
        }
        self.send_all(packet.dst, sent);
    }

    fn done(&self) -> bool {
        self.starts.all_started()
            && self.uac.calls_in_flight() == 0
            && self.uas.uas_calls_waiting() == 0
            && self.link.is_empty()
    }

    fn next_event(&self) -> Option<u64> {
        let starts = self.starts.next_at();
        let proxies = self
            .proxies
            .iter()
            .filter_map(ProxyNode::next_deadline)
            .min();
        // The dispatcher probes forever: its deadline counts only while
        // something else is still going on.
        let busy = [
            starts,
            self.link.next_at(),
            self.uac.next_deadline(),
            self.uas.next_deadline(),
            proxies,
        ]
        .into_iter()
        .flatten()
        .min()?;
        Some(busy.min(self.dispatcher.next_deadline()))
    }

    fn start_calls(&mut self) {
        let count = self.starts.due(self.now);
        if count > 0 {
            let mut sent = Sent::new();
            self.uac
                .start_calls(self.now, count, &mut collect(&mut sent));
            self.send_all(addr(UAC), sent);
        }
    }

    fn run_timers(&mut self) {
        let now = self.now;
        let mut sent = Sent::new();
        self.uac.on_timer(now, &mut collect(&mut sent));
        self.send_all(addr(UAC), sent);
        let mut sent = Sent::new();
        self.uas.on_timer(now, &mut collect(&mut sent));
        self.send_all(addr(UAS), sent);
        let killed = self.killed().then_some(self.sc.victim);
        for (index, (proxy, address)) in self.proxies.iter().zip(PROXIES).enumerate() {
            if Some(index) == killed {
                continue;
            }
            let mut sent = Sent::new();
            proxy.on_timer(now, &mut sent);
            self.link.send_all(now, addr(address), sent);
        }
        let mut sent = Sent::new();
        self.dispatcher
            .worker()
            .on_timer(now, &mut |to, b| sent.push((to, b.to_vec())));
        self.send_all(addr(DISPATCHER), sent);
    }

    /// Advance to the next event and handle everything due then; false
    /// when nothing is left to happen.
    fn step(&mut self) -> bool {
        let Some(next) = self.next_event() else {
            return false;
        };
        self.now = self.now.max(next);
        self.start_calls();
        while let Some(packet) = self.link.pop_due(self.now) {
            self.deliver(packet);
        }
        self.run_timers();
        if self.detected_at.is_none() && !self.dispatcher.is_alive(self.sc.victim) {
            self.detected_at = Some(self.now);
        }
        true
    }
}

/// What a run did.
struct Report {
    sc: Scenario,
    uac: CallStats,
    dispatcher: DispatchStats,
    victim_alive_at_end: bool,
    detected_at: Option<u64>,
    started_at: BTreeMap<String, u64>,
    routes: Routes,
    trace: u64,
    link: LinkCounts,
    to_dead: u64,
}

fn run(sc: Scenario) -> Report {
    let mut sim = Sim::new(sc);
    let mut steps = 0;
    while !sim.done() && sim.step() {
        steps += 1;
        assert!(steps < MAX_STEPS, "{sc:?}: too many steps");
        assert!(sim.now < MAX_SIM_TIME, "{sc:?}: ran too long");
    }
    Report {
        sc,
        uac: sim.uac.stats().clone(),
        dispatcher: sim.dispatcher.stats(),
        victim_alive_at_end: sim.dispatcher.is_alive(sc.victim),
        detected_at: sim.detected_at,
        started_at: sim.started_at,
        routes: sim.routes,
        trace: sim.trace.0,
        link: sim.link.counts,
        to_dead: sim.to_dead,
    }
}

/// The proxy a call goes to while every proxy is in.
fn home(call_id: &str) -> usize {
    let names: Vec<String> = PROXIES.iter().map(|p| addr(p).to_string()).collect();
    rendezvous::choose(call_id.as_bytes(), names.iter().map(|n| (n.as_str(), true)))
        .expect("a proxy")
}

fn scenario(seed: u64) -> Scenario {
    Scenario {
        seed,
        calls: 400,
        victim: (seed as usize) % PROXIES.len(),
        kill_at: 300 * MS,
    }
}

#[test]
fn a_killed_proxy_loses_only_its_share_and_the_other_calls_complete() {
    for seed in [1, 2, 3] {
        let r = run(scenario(seed));
        let sc = r.sc;
        let victim = sc.victim;
        assert!(r.link.lost > 0, "{sc:?}: no loss: {:?}", r.link);
        assert!(r.to_dead > 0, "{sc:?}: nothing reached the dead proxy");
        // Out after PROBE_FAILURES unanswered probes (plus the round in
        // flight), and only once.
        let detected = r
            .detected_at
            .unwrap_or_else(|| panic!("{sc:?}: never detected"));
        let budget = (u64::from(PROBE_FAILURES) + 2) * PROBE_INTERVAL;
        assert!(
            (sc.kill_at..=sc.kill_at + budget).contains(&detected),
            "{sc:?}: detected at {detected}"
        );
        assert!(!r.victim_alive_at_end, "{sc:?}");
        assert_eq!(r.dispatcher.proxies[victim].downs, 1, "{sc:?}");
        // Only its share moves: an INVITE copy goes to its call's home,
        // unless that home is the victim and the victim is out.
        let mut moved = 0;
        let mut homed_on_victim = 0;
        for (call_id, copies) in &r.routes {
            let home = home(call_id);
            homed_on_victim += usize::from(home == victim);
            for &(at, proxy) in copies {
                if home == victim && at >= detected {
                    assert_ne!(proxy, victim, "{sc:?}: {call_id} sent to the dead proxy");
                    moved += 1;
                } else {
                    assert_eq!(
                        proxy, home,
                        "{sc:?}: {call_id} moved off its live home at {at}"
                    );
                }
            }
        }
        let share = homed_on_victim as f64 / r.routes.len() as f64;
        assert!(
            (0.1..0.4).contains(&share),
            "{sc:?}: victim's share {share}"
        );
        assert!(moved > 0, "{sc:?}: no call of the victim's share moved");
        // Every call not homed on the victim, and every call started after
        // the detection, completed despite the loss.
        let may_fail = r
            .started_at
            .iter()
            .filter(|(call_id, &at)| home(call_id) == victim && at < detected)
            .count() as u64;
        assert_eq!(r.uac.attempted, sc.calls, "{sc:?}");
        assert!(
            r.uac.succeeded + may_fail >= sc.calls,
            "{sc:?}: {} succeeded, {may_fail} may fail: {:?}",
            r.uac.succeeded,
            r.uac.failed
        );
        assert!(r.uac.retrans_invite > 0, "{sc:?}: the loss hit no INVITE");
    }
}

#[test]
fn a_seed_gives_one_trace_and_another_seed_another() {
    let a = run(scenario(5));
    let again = run(scenario(5));
    let b = run(scenario(6));
    assert_eq!(a.trace, again.trace);
    assert_eq!(a.link, again.link);
    assert_eq!(a.detected_at, again.detected_at);
    assert_ne!(a.trace, b.trace);
}
