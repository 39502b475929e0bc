//! RFC 7339 overload control as a closed loop: deterministic models of
//! one proxy worker at 3× its capacity whose senders obey the advertised
//! reduction, around the real [`Shedder`] and [`OcController`]. What they
//! show: the advertisement settles within a couple of seconds and stays in
//! a narrow band, the admitted calls stay at 90 % of the capacity or more
//! in every second after that (80 % with stalls of the worker), and the
//! reduction goes back to 0 within a second of the overload's end; the
//! first version's loop (advertising the shedder's own refused share)
//! swings and loses goodput in the same model, and the capacity estimate
//! without the worker's CPU times loses seconds under 80 % to the stalls.
//! When the whole machine stalls and the queue neither grows nor reaches
//! the target, the estimate falls only slowly, and the seconds after the
//! stalls keep 80 % of what the machine could serve; the bounded fall in
//! every saturated period (the rule before) loses them.
//!
//! The models, in 1 ms steps, no randomness:
//! - capacity `C` = 20 000 new calls/s: a call costs 50 µs of the worker's
//!   CPU; a refused one (INVITE → 503, its ACK) 13 % of that (measured on
//!   the quiet machine, docs/sip-proxy.md); a new INVITE dropped on a peek
//!   for waiting over twice the target 1 %, and its sender sends it again
//!   after 500 ms, 1 s, 2 s, ... (timer A; up to 7 sends);
//! - senders offer `3·C` (then `C/2`) and apply the advertisement of one
//!   controller period (100 ms) ago, or of 1 ms ago (a round trip), or
//!   ignore it (without `oc`);
//! - the fluid model ([`simulate`]): the queue is the CPU work not yet
//!   done (its length in seconds is the queueing delay every datagram
//!   sees), a new INVITE is decided as it arrives and its call's whole
//!   work queued; every new INVITE's delay goes to the shedder, as the
//!   driver does;
//! - the queue model ([`simulate_queue`]): datagrams wait in order, a new
//!   INVITE is decided when the worker takes it up (as the driver does),
//!   an admitted call's later messages queue behind; the worker gets the
//!   whole CPU, or (stalls) 70 % of it for 200 or 300 ms every 3 s, or 70 %
//!   from some second on (another process took the rest for good), or
//!   (machine stalls) 70 % for 300 ms, 600 ms or 1 s every 3 s with its
//!   senders descheduled too, the steal unseen by its CPU clock and a
//!   standing delay of half the target that never grows ([`Cpu`]); the CPU
//!   it used is what the controller reads as its thread's CPU time (or
//!   nothing: the estimate before CPU times were read). In a stall the
//!   fluid model would still decide calls at the full rate: only the queue
//!   model shows what a descheduled worker measures.

use ringway_sip::overload::{ShedConfig, Shedder};
use ringway_sip::overload_control::{OcController, OcControllerConfig, OcPool};
use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};

const MS: u64 = 1_000_000;
const S: u64 = 1_000;
/// Capacity (new calls per second) and a call's CPU time (s).
const CAPACITY: u64 = 20_000;
const CALL_S: f64 = 1.0 / CAPACITY as f64;
/// A refused call's and a dropped INVITE's cost, relative to a call.
const REFUSAL: f64 = 0.13;
const PEEK: f64 = 0.01;
/// bench/sip/overload.sh's set point.
const TARGET: u64 = 10 * MS;
/// The overload lasts this long (ms), then `C/2` for 5 s.
const OVERLOAD_MS: u64 = 30 * S;
const END_MS: u64 = OVERLOAD_MS + 5 * S;

/// How the proxy derives what it advertises.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Law {
    /// [`OcController`] (the capacity against the arrivals, a floor for
    /// the shedder).
    Controller,
    /// The first version: the shedder's refused share, no floor.
    ShedderShare,
}

/// What the senders do with the advertisement.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Senders {
    /// Apply it this many ms after it was current.
    Obey(u64),
    /// No `oc` in their Via: they never throttle.
    Ignore,
    /// Half obey after 100 ms, half ignore it.
    Mixed,
}

/// A controller whose table of dropped INVITEs is keyed from a fixed seed:
/// every run of a model is the same.
fn seeded(config: OcControllerConfig) -> OcController {
    OcController::join(&std::sync::Arc::new(OcPool::seeded(config, 7)))
}

/// One new INVITE as sent: its call and how many times it was sent.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
struct Invite {
    call: u64,
    sends: u8,
}

impl Invite {
    /// Its Call-ID, as the driver peeks it.
    fn call_id(self) -> String {
        format!("{}@sim", self.call)
    }
}

/// The senders: their throttles and their timer-A retransmissions.
struct Offer {
    senders: Senders,
    /// The advertised reduction of the last 101 ms, newest last.
    history: VecDeque<u8>,
    /// INVITEs to send again: (when in ms, the INVITE as sent so far).
    again: BinaryHeap<Reverse<(u64, Invite)>>,
    /// Credit of each half of the senders (calls).
    credit: [f64; 2],
    /// Calls made so far.
    calls: u64,
}

impl Offer {
    fn new(senders: Senders) -> Offer {
        Offer {
            senders,
            history: VecDeque::new(),
            again: BinaryHeap::new(),
            credit: [0.0; 2],
            calls: 0,
        }
    }

    /// The new INVITEs sent in millisecond `ms` (new calls and resends),
    /// with `reduction` advertised now; none if the senders are
    /// descheduled (`sending` false: the calls of that millisecond are not
    /// made, resends wait).
    fn new_calls(&mut self, ms: u64, reduction: u8, sending: bool) -> Vec<Invite> {
        let history = &mut self.history;
        history.push_back(reduction);
        if history.len() > 101 {
            history.pop_front();
        }
        if !sending {
            return Vec::new();
        }
        let applied = |delay: u64| -> f64 {
            let back = (delay as usize).min(history.len() - 1);
            let r = history[history.len() - 1 - back];
            f64::from(100 - r) / 100.0
        };
        // New calls offered this millisecond.
        let offered = if ms < OVERLOAD_MS {
            3.0 * CAPACITY as f64 / 1_000.0
        } else {
            CAPACITY as f64 / 2_000.0
        };
        // Two halves of the senders, each with its own throttle.
        let keep = match self.senders {
            Senders::Obey(delay) => [applied(delay); 2],
            Senders::Ignore => [1.0; 2],
            Senders::Mixed => [applied(100), 1.0],
        };
        let mut new_calls = Vec::new();
        for (credit, keep) in self.credit.iter_mut().zip(keep) {
            *credit += offered / 2.0 * keep;
            while *credit >= 1.0 {
                *credit -= 1.0;
                self.calls += 1;
                new_calls.push(Invite {
                    call: self.calls,
                    sends: 1,
                });
            }
        }
        while self.again.peek().is_some_and(|&Reverse((at, _))| at <= ms) {
            let invite = self.again.pop().unwrap().0 .1;
            new_calls.push(Invite {
                sends: invite.sends + 1,
                ..invite
            });
        }
        new_calls
    }

    /// `invite` was dropped in millisecond `ms`: timer A sends it again
    /// after 500 ms, 1 s, 2 s, ... (up to 7 sends).
    fn resend(&mut self, ms: u64, invite: Invite) {
        if invite.sends < 7 {
            self.again
                .push(Reverse((ms + (500 << (invite.sends - 1)), invite)));
        }
    }
}

/// What the driver tells the controller of a new INVITE it took up at
/// `now`: whether it is the resend of one dropped unanswered (when it
/// `tells` the controller of drops at all: the rule before counted every
/// resend as a new call), remembering it if it is `dropped`, and its fate.
fn count_invite(
    oc: &mut OcController,
    now: u64,
    invite: Invite,
    tells: bool,
    dropped: bool,
    admitted: bool,
) {
    let call_id = invite.call_id();
    let resent = tells && oc.is_resend(now, call_id.as_bytes());
    if tells && dropped {
        oc.remember_dropped(now, call_id.as_bytes());
    }
    if resent {
        oc.count_resend(now, admitted);
    } else {
        oc.count_new_call(now, admitted);
    }
}

/// The CPU the worker gets.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Cpu {
    /// All of it.
    Whole,
    /// 70 % for 200 ms, then 3 s later for 300 ms, and so on (from second 3).
    Stalls,
    /// The hypervisor takes the whole machine, the senders too: 70 % for
    /// 300 ms, 3 s later for 600 ms, then 1 s, and so on (from second 3),
    /// and the worker's thread's CPU clock runs on through it (the guest
    /// does not see the steal). Every datagram also waits half the target
    /// on top of the work ahead of it: a standing delay that the
    /// controller counts as saturation although it neither grows nor
    /// reaches the target. The proxy completes 30 % fewer calls in a stall
    /// while its queue stays where it was.
    MachineStalls,
    /// 70 % from this second to the overload's end.
    LostFrom(u64),
}

impl Cpu {
    /// Whether millisecond `ms` falls in a stall's window (from second 3,
    /// one every 3 s, of these lengths in turn, ms) and there in the 15 ms
    /// of every 50 ms that the worker is descheduled: 30 % less.
    fn descheduled(ms: u64, lengths: &[u64]) -> bool {
        let window = ms / (3 * S);
        let length = lengths[window as usize % lengths.len()];
        (3 * S..OVERLOAD_MS).contains(&ms) && ms % (3 * S) < length && ms % 50 < 15
    }

    /// The share of the CPU the worker gets in millisecond `ms`.
    fn share(self, ms: u64) -> f64 {
        let descheduled = match self {
            Cpu::Stalls => Cpu::descheduled(ms, &[200, 300]),
            Cpu::MachineStalls => Cpu::descheduled(ms, &[300, 600, 1_000]),
            Cpu::LostFrom(second) if (second * S..OVERLOAD_MS).contains(&ms) => return 0.7,
            Cpu::Whole | Cpu::LostFrom(_) => false,
        };
        if descheduled {
            0.0
        } else {
            1.0
        }
    }

    /// Whether the worker's thread's CPU time runs on while it is
    /// descheduled (the hypervisor took the CPU: the guest does not see it).
    fn stolen(self) -> bool {
        self == Cpu::MachineStalls
    }

    /// What every datagram waits on top of the work ahead of it (ns).
    fn wait_floor(self) -> u64 {
        if self == Cpu::MachineStalls {
            TARGET / 2
        } else {
            0
        }
    }

    /// Whether the senders run in millisecond `ms`.
    fn senders_run(self, ms: u64) -> bool {
        self != Cpu::MachineStalls || self.share(ms) > 0.0
    }
}

struct Run {
    /// New calls admitted per second.
    admitted: Vec<u64>,
    /// The advertised reduction (percent) at the end of every 100 ms.
    reduction: Vec<u8>,
    /// The capacity estimate (calls/s; 0: none) at the end of every 100 ms.
    capacity: Vec<u64>,
    /// The largest queueing delay seen (ns).
    max_delay: u64,
}

impl Run {
    fn new() -> Run {
        Run {
            admitted: vec![0; (END_MS / S) as usize],
            reduction: Vec::new(),
            capacity: Vec::new(),
            max_delay: 0,
        }
    }
}

/// The fluid model: every new INVITE is decided as it arrives, with the
/// delay the work queued ahead of it will cost, and its whole call's work
/// is queued at once. The worker has the whole CPU.
fn simulate(law: Law, senders: Senders) -> Run {
    let mut shedder = Shedder::new(ShedConfig::with_target(TARGET));
    let mut oc = seeded(OcControllerConfig::default());
    let mut offer = Offer::new(senders);
    let mut queue_s = 0.0f64;
    let mut cpu_used_ns = 0u64;
    let mut run = Run::new();
    for ms in 0..END_MS {
        let now = ms * MS;
        let reduction = match law {
            Law::Controller => oc.advert(now).reduction(),
            Law::ShedderShare => {
                let refused = 1_000_000 - shedder.admitted_ppm().min(1_000_000);
                (refused / 10_000) as u8
            }
        };
        let new_calls = offer.new_calls(ms, reduction, true);
        let mut work = 0.0;
        for invite in new_calls {
            let delay = (queue_s * 1e9) as u64;
            run.max_delay = run.max_delay.max(delay);
            shedder.observe(now, delay);
            let controller = (law == Law::Controller).then_some(&mut oc);
            if delay > 2 * TARGET {
                work += PEEK * CALL_S;
                offer.resend(ms, invite);
                if let Some(oc) = controller {
                    count_invite(oc, now, invite, true, true, false);
                }
                continue;
            }
            let refuse = shedder.is_shedding() && !shedder.admit_new_call();
            let admit = match controller {
                Some(oc) => {
                    let admit = !refuse || oc.overrides_refusal(now, delay);
                    count_invite(oc, now, invite, true, false, admit);
                    admit
                }
                None => !refuse,
            };
            if admit {
                work += CALL_S;
                run.admitted[(ms / S) as usize] += 1;
            } else {
                work += REFUSAL * CALL_S;
            }
        }
        cpu_used_ns += ((queue_s + work).min(0.001) * 1e9) as u64;
        queue_s = (queue_s + work - 0.001).max(0.0);
        oc.tick(now, shedder.standing_delay(), TARGET, || Some(cpu_used_ns));
        if ms % 100 == 99 {
            run.reduction.push(reduction);
            run.capacity.push(oc.capacity().map_or(0, |c| c as u64));
        }
    }
    run
}

/// How the capacity is estimated.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Estimate {
    /// As the driver does now: per CPU-second of the worker's thread, the
    /// CPU supply and the estimate held through short dips, a fall the
    /// queue does not confirm slow.
    Now,
    /// The rule before the slow fall: every saturated period may lower the
    /// estimate by the bounded step, whatever the queue does.
    FastFall,
    /// Before CPU times: the smoothed admitted rate while saturated (no
    /// CPU times, no hold).
    Before,
    /// As now, but the resends of INVITEs dropped unanswered counted as
    /// new calls' arrivals (the rule before the driver told them apart).
    ResendsCounted,
}

impl Estimate {
    /// The controller's knobs for this estimate.
    fn config(self) -> OcControllerConfig {
        let now = OcControllerConfig::default();
        match self {
            Estimate::Now | Estimate::ResendsCounted => now,
            Estimate::FastFall => OcControllerConfig {
                slow_fall: now.max_fall,
                ..now
            },
            Estimate::Before => OcControllerConfig {
                max_fall: 1.0,
                slow_fall: 1.0,
                ..now
            },
        }
    }
}

/// What waits in the worker's queue.
enum Item {
    /// A new INVITE that arrived at this time (ns).
    Invite { at: f64, invite: Invite },
    /// The rest of an admitted call (its responses, ACK, BYE), in seconds
    /// of CPU.
    Rest(f64),
}

/// The share of a call's work done with its INVITE (INVITE in, 100 Trying
/// back, the INVITE out): about one of the call's four exchanges.
const INVITE_PART: f64 = 0.25;

/// The queue model: datagrams wait in arrival order and each new INVITE
/// is decided when the worker takes it up, after the wait it measured, as
/// the driver does; an admitted call's later messages queue behind what is
/// there. The worker gets `cpu` of the CPU: in a stall it serves fewer
/// messages and decides fewer calls, and a datagram's wait is the work
/// ahead of it at the CPU it gets. With [`Estimate::Now`] the controller
/// reads the CPU time the worker used, as the driver does.
fn simulate_queue(senders: Senders, cpu: Cpu, estimate: Estimate) -> Run {
    let cpu_times = estimate != Estimate::Before;
    let tells = estimate != Estimate::ResendsCounted;
    let mut shedder = Shedder::new(ShedConfig::with_target(TARGET));
    let mut oc = seeded(estimate.config());
    let mut offer = Offer::new(senders);
    let mut queue: VecDeque<Item> = VecDeque::new();
    // The worker's clock (ns): it runs ahead of the millisecond while it
    // works off a message that started in it.
    let mut clock = 0.0f64;
    let mut cpu_used_s = 0.0f64;
    let mut run = Run::new();
    for ms in 0..END_MS {
        let start = (ms * MS) as f64;
        let end = start + MS as f64;
        let share = cpu.share(ms);
        let reduction = oc.advert(ms * MS).reduction();
        let new_calls = offer.new_calls(ms, reduction, cpu.senders_run(ms));
        let spacing = MS as f64 / new_calls.len().max(1) as f64;
        for (i, invite) in new_calls.into_iter().enumerate() {
            let at = start + i as f64 * spacing;
            queue.push_back(Item::Invite { at, invite });
        }
        clock = clock.max(start);
        if share == 0.0 {
            // Descheduled: nothing is served, the clock runs on. The
            // hypervisor's steal runs on the thread's CPU clock too, if the
            // worker had work.
            if cpu.stolen() && clock < end && !queue.is_empty() {
                cpu_used_s += (end - clock) / 1e9;
            }
            clock = clock.max(end);
        }

        while clock < end {
            let Some(item) = queue.pop_front() else {
                break;
            };
            let cost = match item {
                Item::Rest(cost) => cost,
                Item::Invite { at, invite } => {
                    // Idle until it arrives.
                    clock = clock.max(at);
                    let now = clock as u64;
                    let delay = (clock - at) as u64 + cpu.wait_floor();
                    run.max_delay = run.max_delay.max(delay);
                    shedder.observe(now, delay);
                    if delay > 2 * TARGET {
                        offer.resend(ms, invite);
                        count_invite(&mut oc, now, invite, tells, true, false);
                        PEEK * CALL_S
                    } else {
                        let refuse = shedder.is_shedding() && !shedder.admit_new_call();
                        let admit = !refuse || oc.overrides_refusal(now, delay);
                        count_invite(&mut oc, now, invite, tells, false, admit);
                        if admit {
                            run.admitted[(ms / S) as usize] += 1;
                            queue.push_back(Item::Rest((1.0 - INVITE_PART) * CALL_S));
                            INVITE_PART * CALL_S
                        } else {
                            REFUSAL * CALL_S
                        }
                    }
                }
            };
            clock += cost / share * 1e9;
            cpu_used_s += cost;
            oc.tick(clock as u64, shedder.standing_delay(), TARGET, || {
                cpu_times.then_some((cpu_used_s * 1e9) as u64)
            });
        }
        if ms % 100 == 99 {
            run.reduction.push(reduction);
            run.capacity.push(oc.capacity().map_or(0, |c| c as u64));
        }
    }
    run
}

/// Worst and mean admitted rate over seconds `from..30`, as a share of
/// the capacity; the range and the largest step of the advertised
/// reduction over the same time.
fn judge(name: &str, run: &Run, from: usize) -> (f64, f64, u8, u8) {
    let seconds = &run.admitted[from..(OVERLOAD_MS / S) as usize];
    let share = |n: u64| n as f64 / CAPACITY as f64;
    let worst = seconds.iter().copied().map(share).fold(f64::MAX, f64::min);
    let mean = seconds.iter().copied().map(share).sum::<f64>() / seconds.len() as f64;
    let advert = &run.reduction[from * 10..(OVERLOAD_MS / 100) as usize];
    let range = advert.iter().max().unwrap() - advert.iter().min().unwrap();
    let step = advert
        .windows(2)
        .map(|w| w[0].abs_diff(w[1]))
        .max()
        .unwrap();
    println!(
        "{name}: admitted per second {:?}; reduction per 100 ms {:?}; \
         from second {from}: worst {:.1} %, mean {:.1} %, reduction range {range}, \
         largest step {step}; largest delay {} ms",
        run.admitted,
        run.reduction,
        worst * 100.0,
        mean * 100.0,
        run.max_delay / MS,
    );
    (worst, mean, range, step)
}

/// Senders one controller period late (the slowest a conforming sender
/// reacts here: every response carries the advertisement) or one round
/// trip late: the reduction settles near 2/3 and stays within a few
/// points, every second from the third on admits at least 90 % of the
/// capacity, and the reduction is 0 again within a second of the end.
/// The first version's law in the same model swings by tens of points and
/// drops seconds under 90 %.
#[test]
fn the_advertisement_settles_and_keeps_the_admitted_calls_near_the_capacity() {
    for delay in [100, 1] {
        let run = simulate(Law::Controller, Senders::Obey(delay));
        let (worst, mean, range, step) = judge(&format!("controller, delay {delay} ms"), &run, 3);
        assert!(worst >= 0.9, "worst second {:.1} %", worst * 100.0);
        assert!(mean >= 0.95, "mean {:.1} %", mean * 100.0);
        assert!(range <= 8, "reduction range {range} points");
        assert!(step <= 4, "reduction step {step} points");
        let settled = &run.reduction[50..300];
        assert!(
            settled.iter().all(|&r| (60..=70).contains(&r)),
            "{settled:?}"
        );
        // 1 s after the end: no reduction; every call admitted.
        let after = (OVERLOAD_MS / 100) as usize + 10;
        assert!(
            run.reduction[after..].iter().all(|&r| r == 0),
            "{:?}",
            &run.reduction[after - 10..]
        );
        let last = run.admitted[run.admitted.len() - 2];
        assert!(last >= CAPACITY / 2, "{last}");
        // The queue stayed well inside what the socket holds (~50 ms).
        assert!(run.max_delay <= 4 * TARGET, "{} ms", run.max_delay / MS);
    }
    // The first version: the two stages swing.
    let run = simulate(Law::ShedderShare, Senders::Obey(100));
    let (worst, _, range, _) = judge("first version, delay 100 ms", &run, 3);
    assert!(
        worst < 0.9 && range >= 20,
        "first version: worst {:.1} %, range {range}",
        worst * 100.0
    );
}

/// Senders without `oc` get nothing from the advertisement: the shedder
/// still refuses their excess and the floor costs nothing against it (the
/// goodput is that of the shedder alone, at the ceiling a refusal's cost
/// leaves: (1 − 3·0.13)/(1 − 0.13) = 70 %), and the queue stays bounded.
/// With half the senders conforming they make room for the others.
#[test]
fn senders_without_oc_are_still_shed_and_conforming_ones_make_room() {
    let ceiling = (1.0 - 3.0 * REFUSAL) / (1.0 - REFUSAL);
    let alone = simulate(Law::ShedderShare, Senders::Ignore);
    let (_, alone_mean, _, _) = judge("shedder alone, no oc", &alone, 3);
    let run = simulate(Law::Controller, Senders::Ignore);
    let (worst, mean, _, _) = judge("controller, no oc", &run, 3);
    assert!(mean >= alone_mean - 0.01, "mean {:.1} %", mean * 100.0);
    assert!(mean >= ceiling - 0.05, "mean {:.1} %", mean * 100.0);
    assert!(worst >= ceiling - 0.1, "worst {:.1} %", worst * 100.0);
    assert!(run.max_delay <= 4 * TARGET, "{} ms", run.max_delay / MS);
    let mixed = simulate(Law::Controller, Senders::Mixed);
    let (worst, mean, _, _) = judge("controller, half the senders with oc", &mixed, 3);
    // Half offer 1.5 C and ignore; the others are asked to stop entirely
    // (down to the 1/64 trickle), and the shedder refuses a third of what
    // remains: two refusals per admitted call become ~0.5.
    assert!(mean > ceiling + 0.1, "mean {:.1} %", mean * 100.0);
    assert!(worst > ceiling, "worst {:.1} %", worst * 100.0);
    let settled = &mixed.reduction[50..300];
    assert!(settled.iter().all(|&r| r >= 90), "{settled:?}");
}

/// Stalls, in the queue model: in a window of 200 or 300 ms every 3 s the
/// worker is descheduled for 15 ms of every 50 ms (30 % of the CPU lost:
/// other threads on its core, the hypervisor). Every second from the third
/// on admits at least 80 % of the capacity (a stall's own second can reach
/// at most 91 %), and the capacity estimate stays within 10 % of the
/// capacity. The estimate before CPU times, run in the same model
/// (printed, not asserted), does about as well here (worst second 83 %
/// against 85 %): this model does not reproduce the 70 % seconds measured
/// on the quiet machine (see [`a_fall_the_queue_does_not_confirm_is_slow`]
/// for a model in which the estimate falls as it did there).
#[test]
fn short_stalls_do_not_lower_the_capacity_estimate() {
    let whole = simulate_queue(Senders::Obey(100), Cpu::Whole, Estimate::Now);
    let (worst, mean, _, _) = judge("queue model, whole CPU, delay 100 ms", &whole, 3);
    println!("capacity per 100 ms {:?}", whole.capacity);
    assert!(worst >= 0.9, "worst second {:.1} %", worst * 100.0);
    assert!(mean >= 0.95, "mean {:.1} %", mean * 100.0);
    for delay in [100, 1] {
        let run = simulate_queue(Senders::Obey(delay), Cpu::Stalls, Estimate::Now);
        let (worst, mean, _, _) = judge(&format!("stalls, CPU times, delay {delay} ms"), &run, 3);
        println!("capacity per 100 ms {:?}", run.capacity);
        assert!(worst >= 0.8, "worst second {:.1} %", worst * 100.0);
        assert!(mean >= 0.9, "mean {:.1} %", mean * 100.0);
        let lowest = *run.capacity[50..300].iter().min().unwrap();
        assert!(
            lowest as f64 >= 0.9 * CAPACITY as f64,
            "lowest estimate {lowest}"
        );
    }
    let before = simulate_queue(Senders::Obey(100), Cpu::Stalls, Estimate::Before);
    judge("stalls, the estimate before, delay 100 ms", &before, 3);
    println!("capacity per 100 ms {:?}", before.capacity);
}

/// A lasting loss: from second 15 the worker gets 70 % of the CPU for
/// good (queue model). The estimate follows within a second, and every
/// second after that admits at least 80 % of what is left.
#[test]
fn a_lasting_loss_of_cpu_is_followed() {
    let run = simulate_queue(Senders::Obey(100), Cpu::LostFrom(15), Estimate::Now);
    judge("70 % of the CPU from second 15, delay 100 ms", &run, 3);
    println!("capacity per 100 ms {:?}", run.capacity);
    let left = 0.7 * CAPACITY as f64;
    let followed = &run.capacity[160..300];
    assert!(
        followed
            .iter()
            .all(|&c| (c as f64) < 1.12 * left && (c as f64) > 0.9 * left),
        "{followed:?}"
    );
    for (second, &admitted) in run.admitted.iter().enumerate().take(30).skip(16) {
        assert!(
            admitted as f64 >= 0.8 * left,
            "second {second}: {admitted} admitted"
        );
    }
}

/// Stalls of the whole machine (queue model, [`Cpu::MachineStalls`]): the
/// senders are descheduled with the worker, so in a window of 300 ms,
/// 600 ms or 1 s the proxy completes 30 % fewer calls per second, per
/// CPU-second as its thread's clock reads, while its queue stays under the
/// target and does not grow. A fall the queue does not confirm is slow, so
/// every second from the third admits at least 80 % of what the machine
/// could serve in it (the capacity times the CPU the stall left;
/// measured here: ≥ 96 %) and 90 % on average. The rule before (the
/// bounded fall in every saturated period) lowers the estimate with the
/// completions, the advertisement throttles the senders to it, and the
/// seconds after the stalls lose more: at least 10 points of the worst
/// second and 3 of the mean (here 81–84 % and 93 %; before the resends of
/// dropped INVITEs were told apart, under both bounds).
#[test]
fn a_fall_the_queue_does_not_confirm_is_slow() {
    // The share of the CPU in each second the stalls leave.
    let available = |second: usize| {
        let ms = second as u64 * S;
        (ms..ms + S)
            .map(|ms| Cpu::MachineStalls.share(ms))
            .sum::<f64>()
            / S as f64
    };
    let relative = |run: &Run| -> (f64, f64) {
        let seconds: Vec<f64> = (3..(OVERLOAD_MS / S) as usize)
            .map(|second| run.admitted[second] as f64 / (CAPACITY as f64 * available(second)))
            .collect();
        let worst = seconds.iter().copied().fold(f64::MAX, f64::min);
        (worst, seconds.iter().sum::<f64>() / seconds.len() as f64)
    };
    for delay in [100, 1] {
        let mut results = Vec::new();
        for estimate in [Estimate::Now, Estimate::FastFall] {
            let run = simulate_queue(Senders::Obey(delay), Cpu::MachineStalls, estimate);
            judge(
                &format!("machine stalls, {estimate:?}, delay {delay} ms"),
                &run,
                3,
            );
            let lowest = *run.capacity[50..300].iter().min().unwrap();
            let (worst, mean) = relative(&run);
            println!(
                "of what the machine could serve: worst {:.1} %, mean {:.1} %; \
                 lowest estimate {lowest}",
                worst * 100.0,
                mean * 100.0
            );
            results.push((worst, mean));
        }
        let [(worst, mean), (worst_before, mean_before)] = results[..] else {
            unreachable!()
        };
        assert!(worst >= 0.8, "worst second {:.1} %", worst * 100.0);
        assert!(mean >= 0.9, "mean {:.1} %", mean * 100.0);
        assert!(
            worst_before <= worst - 0.1 && mean_before <= mean - 0.03,
            "the fall before: worst {:.1} %, mean {:.1} %",
            worst_before * 100.0,
            mean_before * 100.0
        );
    }
}

/// The onset, in the queue model: at the jump to 3× the capacity the
/// queue passes the drop bound before the shedder and the throttles catch
/// up, and the INVITEs dropped then come back 0.5 s, 1.5 s, … later,
/// whatever the advertisement says. The driver tells those resends apart
/// (the Call-IDs of the dropped INVITEs, `overload_control::resends`), so
/// the advertisement overshoots its fixed point (67 %) by at most 15
/// points (the senders' own lag) and every second from the one after the
/// onset admits 90 % of the capacity (here 97–98 %). Counted as new calls
/// (the rule before) they made the reduction climb to 85–88 % and the
/// second after the onset admit 81 % (measured on the quiet machine: 78 %).
#[test]
fn resends_of_dropped_invites_are_not_taken_for_new_calls() {
    for delay in [100, 1] {
        let mut results = Vec::new();
        for estimate in [Estimate::Now, Estimate::ResendsCounted] {
            let run = simulate_queue(Senders::Obey(delay), Cpu::Whole, estimate);
            let (worst, mean, _, _) =
                judge(&format!("onset, {estimate:?}, delay {delay} ms"), &run, 1);
            let peak = *run.reduction[..30].iter().max().unwrap();
            println!("peak reduction in the first 3 s: {peak} %");
            results.push((worst, mean, peak));
        }
        let [(worst, mean, peak), (worst_before, _, peak_before)] = results[..] else {
            unreachable!()
        };
        assert!(worst >= 0.9, "worst second {:.1} %", worst * 100.0);
        assert!(mean >= 0.95, "mean {:.1} %", mean * 100.0);
        assert!(peak <= 82, "peak reduction {peak} %");
        assert!(
            worst_before < 0.85 && peak_before >= 85,
            "resends counted: worst {:.1} %, peak reduction {peak_before} %",
            worst_before * 100.0
        );
    }
}
