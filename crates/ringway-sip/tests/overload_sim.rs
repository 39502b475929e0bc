//! A deterministic simulation of the overload benchmark
//! (bench/sip/overload.sh) around [`Shedder`]: one CPU serving one FIFO
//! socket queue, calls offered at 3× its capacity for 30 s, then a light
//! load. Sans-IO and seeded: no clock, no thread, the same numbers on
//! every run. What it shows: with the controller's parameters the goodput
//! stays at least 80 % of capacity in every second of the overload, and
//! every call is admitted again within 5 s of its end; with the
//! parameters of the first version it does not.
//!
//! The model (the numbers from the quiet-machine runs in
//! docs/sip-proxy.md, capacity ~15 700 calls/s on one CPU):
//! - a call is six datagrams at the proxy — INVITE, 180, 200, ACK, BYE,
//!   200 — of which each follow-up arrives one round trip (`RTT`) after
//!   the proxy sent what it answers; a call counts as good when its last
//!   200 is served (the generator's "ok");
//! - a refused call is two datagrams: the INVITE (answered 503) and its
//!   ACK, together about 7 % of a call's CPU with the full-parse refusal
//!   (measured: 1.09 M refusals and 10 900 calls/s filled 86 % of the
//!   CPU), about 2.5–3 % with the quick refusal (`proxy/refusal.rs`, see
//!   [`QUICK_REFUSAL_PER_MILLE`]); a new INVITE that waited
//!   over twice the target is dropped on a peek (about 1 %), and its
//!   sender retransmits it after T1, 2·T1, ...;
//! - the socket holds at most `QUEUE` datagrams (4 MB of receive buffer);
//!   a datagram that does not fit is lost, and its sender retransmits it
//!   like a dropped INVITE (ACKs and 180s are not retransmitted);
//! - service times vary ±50 % (uniform), and the CPU stalls now and then
//!   (another thread runs: 0–4 ms every 40 ms on average, ~5 % of it),
//!   which is what a per-datagram threshold overreacts to.

use ringway_sip::overload::{ShedConfig, Shedder};
use std::cmp::Reverse;

/// What the simulation needs of an admission controller.
trait Controller {
    fn observe(&mut self, now: u64, delay: u64);
    fn is_shedding(&self) -> bool;
    fn admit_new_call(&mut self) -> bool;
    fn admitted_ppm(&self) -> u32;
    fn target(&self) -> u64;
}

impl Controller for Shedder {
    fn observe(&mut self, now: u64, delay: u64) {
        Shedder::observe(self, now, delay)
    }
    fn is_shedding(&self) -> bool {
        Shedder::is_shedding(self)
    }
    fn admit_new_call(&mut self) -> bool {
        Shedder::admit_new_call(self)
    }
    fn admitted_ppm(&self) -> u32 {
        Shedder::admitted_ppm(self)
    }
    fn target(&self) -> u64 {
        self.config().target
    }
}

/// The first version's law (before the PI controller), for comparison:
/// over the target the fraction is scaled by target / delay (at most
/// halved), with no queue at all it doubles (+1/32), with the smallest
/// delay under half the target it grows by 1/32, else it holds.
struct FirstVersion {
    target: u64,
    start: Option<u64>,
    min: u64,
    max: u64,
    samples: u64,
    admit: u64,
    credit: u64,
}

impl FirstVersion {
    const ONE: u64 = 1 << 16;

    fn new(target: u64) -> FirstVersion {
        FirstVersion {
            target,
            start: None,
            min: u64::MAX,
            max: 0,
            samples: 0,
            admit: Self::ONE,
            credit: 0,
        }
    }
}

impl Controller for FirstVersion {
    fn observe(&mut self, now: u64, delay: u64) {
        let start = *self.start.get_or_insert(now);
        if now.saturating_sub(start) >= 100 * MS {
            if self.samples > 0 {
                let (a, t, step) = (self.admit, self.target, Self::ONE / 32);
                let next = if self.min > t {
                    (a * t / self.min).max(a / 2)
                } else if self.max < t / 2 {
                    a * 2 + step
                } else if self.min < t / 2 {
                    a + step
                } else {
                    a
                };
                self.admit = next.clamp(Self::ONE / 64, Self::ONE);
            }
            self.min = u64::MAX;
            self.max = 0;
            self.samples = 0;
            self.start = Some(now);
        }
        self.min = self.min.min(delay);
        self.max = self.max.max(delay);
        self.samples += 1;
    }
    fn is_shedding(&self) -> bool {
        self.admit < Self::ONE
    }
    fn admit_new_call(&mut self) -> bool {
        self.credit += self.admit;
        let pass = self.credit >= Self::ONE;
        if pass {
            self.credit -= Self::ONE;
        }
        pass
    }
    fn admitted_ppm(&self) -> u32 {
        (self.admit * 1_000_000 / Self::ONE) as u32
    }
    fn target(&self) -> u64 {
        self.target
    }
}
use std::collections::{BinaryHeap, VecDeque};

const MS: u64 = 1_000_000;
const S: u64 = 1_000_000_000;
/// CPU time of one call at the proxy (ns): the capacity is 1 / CALL_NS
/// less the stalls. Four times the measured 63 µs (and a quarter of the
/// socket queue), so that a run is a quarter of the events: the dynamics
/// in delays and fractions are the same.
const CALL_NS: u64 = 4 * 63_000;
/// A new INVITE dropped on a peek (1 % of a call).
const PEEK_NS: u64 = CALL_NS / 100;
/// Network and peer turnaround per follow-up.
const RTT: u64 = 300_000;
/// Datagrams the socket queue holds (~50 ms of work).
const QUEUE: usize = 1_250;
const T1: u64 = 500 * MS;
/// Sends of one datagram before its sender gives up (timer B: 64·T1).
const MAX_SENDS: u8 = 7;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    NewInvite,
    Ringing,
    InviteOk,
    Ack,
    Bye,
    ByeOk,
    RefusedAck,
}

impl Kind {
    /// Share of CALL_NS (in 1/64) of the six datagrams of a call.
    fn cost(self) -> u64 {
        let share = match self {
            Kind::NewInvite => 16,
            Kind::Ringing => 8,
            Kind::InviteOk => 11,
            Kind::Ack => 8,
            Kind::Bye => 12,
            Kind::ByeOk => 9,
            Kind::RefusedAck => unreachable!(),
        };
        CALL_NS * share / 64
    }

    fn retransmitted(self) -> bool {
        matches!(
            self,
            Kind::NewInvite | Kind::InviteOk | Kind::Bye | Kind::ByeOk
        )
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Datagram {
    kind: Kind,
    /// When the call started (its first INVITE was sent).
    call_start: u64,
    /// Times sent so far.
    sends: u8,
}

/// xorshift64*: the only randomness, seeded.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform in [0, n).
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// The offered load: new calls per second over time.
struct Load {
    /// (until, calls per second) segments.
    phases: Vec<(u64, u64)>,
}

impl Load {
    fn rate_at(&self, t: u64) -> Option<u64> {
        self.phases
            .iter()
            .find(|(until, _)| t < *until)
            .map(|p| p.1)
    }
}

/// What a run gives: per second of simulated time, calls completed OK,
/// calls started, calls of those started that failed, and the admitted
/// fraction at the second's end.
#[derive(Debug, Default)]
struct Run {
    goodput: Vec<u64>,
    started: Vec<u64>,
    failed_by_start: Vec<u64>,
    admitted_ppm: Vec<u32>,
    socket_drops: u64,
    busy_ns: u64,
    idle_ns: Vec<u64>,
}

fn capacity() -> u64 {
    // Stalls take ~5 % of the CPU (see `simulate`).
    S * 95 / 100 / CALL_NS
}

fn simulate(shedder: &mut dyn Controller, model: &Model, seconds: u64, seed: u64) -> Run {
    let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
    let load = &model.load;
    let mut run = Run {
        goodput: vec![0; seconds as usize + 80],
        started: vec![0; seconds as usize + 80],
        failed_by_start: vec![0; seconds as usize + 80],
        idle_ns: vec![0; seconds as usize + 80],
        ..Run::default()
    };
    let mut arrivals: BinaryHeap<Reverse<(u64, Datagram)>> = BinaryHeap::new();
    let mut queue: VecDeque<(u64, Datagram)> = VecDeque::new();
    let mut next_call = 0u64;
    let mut next_stall = 0u64;
    let mut now = 0u64;
    let mut next_second = S;
    let end = seconds * S;
    let sec = |t: u64| (t / S) as usize;
    // Deliver to the socket, or lose (and schedule the sender's retry).
    let deliver = |queue: &mut VecDeque<(u64, Datagram)>,
                   arrivals: &mut BinaryHeap<Reverse<(u64, Datagram)>>,
                   run: &mut Run,
                   at: u64,
                   d: Datagram| {
        if queue.len() < QUEUE {
            queue.push_back((at, d));
            return;
        }
        run.socket_drops += 1;
        resend(arrivals, run, at, d);
    };
    loop {
        // New calls up to now (constant arrivals, as the generator's).
        while let Some(rate) = load.rate_at(next_call) {
            if next_call > now {
                break;
            }
            run.started[sec(next_call)] += 1;
            let d = Datagram {
                kind: Kind::NewInvite,
                call_start: next_call,
                sends: 1,
            };
            arrivals.push(Reverse((next_call, d)));
            next_call += S / rate;
        }
        while let Some(&Reverse((at, d))) = arrivals.peek() {
            if at > now {
                break;
            }
            arrivals.pop();
            deliver(&mut queue, &mut arrivals, &mut run, at, d);
        }
        while now >= next_second {
            run.admitted_ppm.push(shedder.admitted_ppm());
            next_second += S;
        }
        if now >= end && arrivals.is_empty() && queue.is_empty() {
            break;
        }
        if now >= next_stall {
            // Another thread takes the CPU for a while.
            now += rng.below(4 * MS);
            next_stall = now + rng.below(80 * MS);
            continue;
        }
        let Some((arrived, d)) = queue.pop_front() else {
            // Idle until the next arrival.
            let next = arrivals.peek().map(|r| r.0 .0);
            let new = load.rate_at(next_call).map(|_| next_call);
            match next.into_iter().chain(new).min() {
                Some(t) => {
                    if t > now {
                        run.idle_ns[sec(now)] += t - now;
                    }
                    now = now.max(t)
                }
                None => break,
            }
            continue;
        };
        let waited = now - arrived;
        shedder.observe(arrived, waited);
        let jitter = |rng: &mut Rng, ns: u64| ns / 2 + rng.below(ns);
        let (cost, next): (u64, &[Kind]) = match d.kind {
            Kind::NewInvite if waited > 2 * shedder.target() => {
                resend(&mut arrivals, &mut run, now, d);
                (PEEK_NS, &[])
            }
            Kind::NewInvite if shedder.is_shedding() && !shedder.admit_new_call() => {
                run.failed_by_start[sec(d.call_start)] += 1;
                (model.refuse_ns, &[Kind::RefusedAck])
            }
            Kind::NewInvite => (d.kind.cost(), &[Kind::Ringing, Kind::InviteOk]),
            Kind::InviteOk => (d.kind.cost(), &[Kind::Ack, Kind::Bye]),
            Kind::Bye => (d.kind.cost(), &[Kind::ByeOk]),
            Kind::ByeOk => {
                run.goodput[sec(now)] += 1;
                (d.kind.cost(), &[])
            }
            Kind::RefusedAck => (model.refused_ack_ns, &[]),
            Kind::Ringing | Kind::Ack => (d.kind.cost(), &[]),
        };
        let cost = jitter(&mut rng, cost);
        now += cost;
        run.busy_ns += cost;
        for &kind in next {
            let follow = Datagram {
                kind,
                call_start: d.call_start,
                sends: 1,
            };
            arrivals.push(Reverse((now + RTT, follow)));
        }
    }
    run
}

/// The sender of `d` (lost or dropped at `at`) sends it again after its
/// retransmission interval, or gives up and the call fails.
fn resend(
    arrivals: &mut BinaryHeap<Reverse<(u64, Datagram)>>,
    run: &mut Run,
    at: u64,
    d: Datagram,
) {
    if !d.kind.retransmitted() {
        return;
    }
    if d.sends >= MAX_SENDS {
        run.failed_by_start[(d.call_start / S) as usize] += 1;
        return;
    }
    let again = Datagram {
        sends: d.sends + 1,
        ..d
    };
    arrivals.push(Reverse((at + (T1 << (d.sends - 1)), again)));
}

/// The load and the cost of a refusal.
struct Model {
    load: Load,
    /// A refused call's INVITE (parse, 503) and its ACK (ns).
    refuse_ns: u64,
    refused_ack_ns: u64,
}

/// 3× the capacity for 30 s, then a probe of 10 % of it for 10 s; a
/// refused call costs `refusal_per_mille` of a call (INVITE 60 %, ACK 40 %).
fn overload_then_probe(refusal_per_mille: u64) -> Model {
    let cap = capacity();
    let refusal = CALL_NS * refusal_per_mille / 1000;
    Model {
        load: Load {
            phases: vec![(30 * S, 3 * cap), (40 * S, cap / 10)],
        },
        refuse_ns: refusal * 6 / 10,
        refused_ack_ns: refusal * 4 / 10,
    }
}

struct Verdict {
    worst_second: f64,
    mean: f64,
    /// Seconds after the overload's end until every call started from
    /// then on succeeded (`None`: never within the probe).
    recovery_s: Option<u64>,
}

fn judge(run: &Run) -> Verdict {
    let cap = capacity() as f64;
    let during: Vec<f64> = run.goodput[2..30].iter().map(|&g| g as f64 / cap).collect();
    let worst_second = during.iter().cloned().fold(f64::MAX, f64::min);
    let mean = during.iter().sum::<f64>() / during.len() as f64;
    let recovery_s = (30..40)
        .find(|&s| (s..40).all(|t| run.failed_by_start[t] == 0 && run.started[t] > 0))
        .map(|s| s as u64 - 30);
    Verdict {
        worst_second,
        mean,
        recovery_s,
    }
}

fn report(name: &str, run: &Run) -> Verdict {
    let v = judge(run);
    println!(
        "{name}: capacity {}/s; goodput per second {:?}; admitted ppm {:?}; idle ms {:?}; \
         worst second {:.1} %, mean {:.1} %, recovery {:?} s, socket drops {}",
        capacity(),
        &run.goodput[..40],
        &run.admitted_ppm,
        run.idle_ns[..32].iter().map(|n| n / MS).collect::<Vec<_>>(),
        v.worst_second * 100.0,
        v.mean * 100.0,
        v.recovery_s,
        run.socket_drops,
    );
    v
}

/// A refused call's cost with the quick refusal, in 1/1000 of a call:
/// `cargo bench -p ringway-sip --bench t_sip` (alternated pairs under
/// load, p50): INVITE → 503 with the driver's peek, and its ACK, 4.07 →
/// 1.10 µs (×0.27: the last quiet run's 3.8 µs becomes ~1.0 µs, −2.8 µs);
/// the ~4.4 µs a refusal cost end to end (7 % of 63 µs) becomes ~1.6 µs,
/// 25 ‰, taken as 30 ‰ for margin. An estimate until the quiet-machine
/// run of `bench/sip/overload.sh` measures it end to end.
const QUICK_REFUSAL_PER_MILLE: u64 = 30;

/// `bench/sip/overload.sh`'s default set point (`SHED_MS`).
const TARGET: u64 = 10 * MS;
const SEEDS: [u64; 3] = [1, 2, 3];

/// The worst second and the slowest recovery over the seeds.
fn worst_over_seeds(
    name: &str,
    controller: impl Fn() -> Box<dyn Controller>,
    refusal_per_mille: u64,
) -> (f64, f64, Option<u64>) {
    let model = overload_then_probe(refusal_per_mille);
    let mut worst = f64::MAX;
    let mut mean = 0.0;
    let mut recovery = Some(0);
    for seed in SEEDS {
        let run = simulate(controller().as_mut(), &model, 40, seed);
        let v = report(
            &format!("{name}, refusal {refusal_per_mille} per mille, seed {seed}"),
            &run,
        );
        worst = worst.min(v.worst_second);
        mean += v.mean / SEEDS.len() as f64;
        recovery = recovery.zip(v.recovery_s).map(|(a, b)| a.max(b));
    }
    (worst, mean, recovery)
}

/// With a refusal at 5 % of a call's CPU (what it must cost: see the
/// next test), the controller keeps every second of a 3× overload at
/// 80 % of the capacity or more and admits every call again within 5 s
/// of its end; the first version's law does not.
#[test]
fn the_controller_keeps_goodput_over_80_percent_at_3x_and_recovers_within_5_s() {
    let (worst, mean, recovery) = worst_over_seeds(
        "PI",
        || Box::new(Shedder::new(ShedConfig::with_target(TARGET))),
        50,
    );
    assert!(
        worst >= 0.8,
        "a second at {:.1} % of capacity",
        worst * 100.0
    );
    assert!(mean >= 0.85, "mean {:.1} %", mean * 100.0);
    assert!(
        matches!(recovery, Some(s) if s <= 5),
        "recovery {recovery:?}"
    );
    // The first version, same model and set point: fails the goal.
    let (worst, _, _) =
        worst_over_seeds("first version", || Box::new(FirstVersion::new(TARGET)), 50);
    assert!(
        worst < 0.8,
        "first version: worst second {:.1} %",
        worst * 100.0
    );
}

/// Where the goal's margin comes from: at 3× the capacity two of every
/// three calls are refused, so a refusal's cost is taken twice per
/// admitted call. With refusals at 7 % of a call (as measured on the
/// quiet machine) even a perfect controller keeps at most
/// (1 − 3·0.07) / (1 − 0.07) = 85 % of the capacity, and stalls then push
/// single seconds under 80 %: the controller holds the mean at that
/// ceiling, but the goal needs a cheaper refusal too.
#[test]
fn at_the_measured_refusal_cost_the_mean_sits_at_the_ceiling() {
    let (worst, mean, recovery) = worst_over_seeds(
        "PI",
        || Box::new(Shedder::new(ShedConfig::with_target(TARGET))),
        70,
    );
    let ceiling = (1.0 - 3.0 * 0.07) / (1.0 - 0.07);
    assert!(mean >= ceiling - 0.015, "mean {:.1} %", mean * 100.0);
    assert!(worst >= 0.75, "worst second {:.1} %", worst * 100.0);
    assert!(
        matches!(recovery, Some(s) if s <= 5),
        "recovery {recovery:?}"
    );
    let (_, first, _) =
        worst_over_seeds("first version", || Box::new(FirstVersion::new(TARGET)), 70);
    assert!(first < mean, "first version's mean {:.1} %", first * 100.0);
}

/// At the quick refusal's cost ([`QUICK_REFUSAL_PER_MILLE`]) the ceiling
/// is (1 − 3·0.03) / (1 − 0.03) = 93.8 % of the capacity: the controller
/// keeps every second of the 3× overload over 80 % with a margin, its mean
/// within 2.5 points of the ceiling, and recovers within 5 s.
#[test]
fn at_the_quick_refusal_cost_the_goal_holds_with_a_margin() {
    let (worst, mean, recovery) = worst_over_seeds(
        "PI",
        || Box::new(Shedder::new(ShedConfig::with_target(TARGET))),
        QUICK_REFUSAL_PER_MILLE,
    );
    let r = QUICK_REFUSAL_PER_MILLE as f64 / 1000.0;
    let ceiling = (1.0 - 3.0 * r) / (1.0 - r);
    assert!(
        worst >= 0.83,
        "a second at {:.1} % of capacity",
        worst * 100.0
    );
    assert!(
        mean >= ceiling - 0.025,
        "mean {:.1} % (ceiling {:.1} %)",
        mean * 100.0,
        ceiling * 100.0
    );
    assert!(
        matches!(recovery, Some(s) if s <= 5),
        "recovery {recovery:?}"
    );
}
