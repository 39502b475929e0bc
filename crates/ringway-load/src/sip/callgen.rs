//! The call generator without I/O: UAC and UAS state machines, messages
//! from templates, RFC 3261 retransmission and call timers, and call
//! accounting.
//!
//! A [`CallGen`] opens no socket and reads no clock. Its driver passes the
//! time (`now`, nanoseconds on any monotonic clock) and the datagrams it
//! received, and gets the datagrams to send through a [`Sink`]:
//!
//! - [`CallGen::start_calls`] starts calls (the driver decides when);
//! - [`CallGen::handle`] takes one received datagram;
//! - [`CallGen::on_timer`] runs the timers due at `now`, to be called at
//!   (or after) [`CallGen::next_deadline`].
//!
//! As UAC it sends INVITE to the proxy (or straight to the UAS) with the
//! Request-URI naming the UAS, follows the route set of the 200 (RFC 3261
//! 12.1.2, loose or strict routing) for ACK and BYE, and retransmits INVITE
//! (Timer A/B) and BYE (Timer E/F). As UAS it answers INVITE with 180 and
//! 200 (Record-Route copied), retransmits the 200 until ACK, and answers
//! BYE with 200.

use super::template::{Dialog, Templates};
use super::timers::{Delay, Timer, TimerKind, Timers};
use super::view::{name_addr_uri, uri_addr, Hdr, View};
use hdrhistogram::Histogram;
use ringway_sip::overload_control::{LossThrottle, OcReceived};
use std::collections::{BTreeMap, HashMap};
use std::hash::{BuildHasherDefault, Hasher};
use std::net::SocketAddr;
use std::time::Duration;

/// What a sent message is. The order is the one in which one call's
/// messages can follow each other within one send batch: a driver that
/// sorts a batch by (kind, destination, length) to form UDP GSO trains of
/// equal messages keeps the messages of each call in order (a 180 before
/// its 200).
#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum MessageKind {
    /// INVITE (first or retransmitted).
    Invite,
    /// Provisional response (180) of the UAS.
    Provisional,
    /// 200 to INVITE of the UAS (first or retransmitted).
    InviteOk,
    /// ACK (for a 2xx or a non-2xx final response).
    Ack,
    /// BYE (first or retransmitted).
    Bye,
    /// Final responses of the UAS to non-INVITE requests (BYE, OPTIONS, ...).
    Final,
}

/// Where a [`CallGen`] puts the datagrams it sends: destination, kind, bytes.
pub type Sink<'a> = dyn FnMut(SocketAddr, MessageKind, &[u8]) + 'a;

/// What one call generator is.
#[derive(Clone, Debug)]
pub struct CallGenConfig {
    /// The generator's own address (its socket's): in Via, From and Contact.
    pub local: SocketAddr,
    /// UAS named in the Request-URI; `None`: `local` (the generator answers its own calls).
    pub uas: Option<SocketAddr>,
    /// Where requests outside a dialog go (the proxy); `None`: straight to the UAS.
    pub proxy: Option<SocketAddr>,
    /// Run id in branches and Call-IDs (tells runs apart).
    pub run_id: String,
    /// Generator number in branches, tags and Call-IDs (tells the generators of a run apart).
    pub index: usize,
    /// RFC 3261 T1 (retransmission base).
    pub t1: Duration,
    /// RFC 3261 T2 (retransmission cap).
    pub t2: Duration,
    /// Time between the ACK and the BYE.
    pub hold: Duration,
    /// RFC 7339 overload control (loss-based): `;oc` in the Via, and the
    /// advertised share of new calls refused locally (`throttled`);
    /// `false` models a sender that does not support it.
    pub overload_control: bool,
}

/// Call accounting of a generator.
#[derive(Clone, Debug)]
pub struct CallStats {
    /// Calls started.
    pub attempted: u64,
    /// Calls that completed INVITE/200/ACK/BYE/200.
    pub succeeded: u64,
    /// Failed calls by reason (`"486"`, `"timeout_invite"`, `"bye_481"`, `"unfinished"`, ...).
    pub failed: BTreeMap<String, u64>,
    /// Calls refused locally by RFC 7339 overload control (counted in
    /// `attempted`; never sent, neither succeeded nor failed).
    pub throttled: u64,
    /// INVITE retransmissions (Timer A).
    pub retrans_invite: u64,
    /// BYE retransmissions (Timer E).
    pub retrans_bye: u64,
    /// 200 OK retransmissions by the UAS (waiting for ACK).
    pub retrans_200: u64,
    /// ACKs re-sent for retransmitted 200s.
    pub retrans_ack: u64,
    /// Calls answered as UAS.
    pub uas_calls: u64,
    /// UAS calls whose ACK never came.
    pub uas_ack_timeouts: u64,
    /// Received datagrams that were not understood (or not ours).
    pub msgs_ignored: u64,
    /// INVITE → 180 (µs).
    pub invite_to_180: Histogram<u64>,
    /// INVITE → 200 (µs).
    pub invite_to_200: Histogram<u64>,
    /// BYE → 200 (µs).
    pub bye_to_200: Histogram<u64>,
}

/// An empty response-time histogram (1 µs to 1 h, 3 significant digits).
pub(crate) fn new_hist() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 3_600_000_000, 3).expect("valid histogram bounds")
}

impl Default for CallStats {
    fn default() -> Self {
        CallStats {
            attempted: 0,
            succeeded: 0,
            failed: BTreeMap::new(),
            throttled: 0,
            retrans_invite: 0,
            retrans_bye: 0,
            retrans_200: 0,
            retrans_ack: 0,
            uas_calls: 0,
            uas_ack_timeouts: 0,
            msgs_ignored: 0,
            invite_to_180: new_hist(),
            invite_to_200: new_hist(),
            bye_to_200: new_hist(),
        }
    }
}

impl CallStats {
    /// Failed calls, all reasons.
    pub fn failed_total(&self) -> u64 {
        self.failed.values().sum()
    }

    /// Retransmissions of all kinds (INVITE, BYE, 200; not re-sent ACKs).
    pub fn retransmissions(&self) -> u64 {
        self.retrans_invite + self.retrans_bye + self.retrans_200
    }

    /// Add `o` to these counts.
    pub fn merge(&mut self, o: &CallStats) {
        self.attempted += o.attempted;
        self.succeeded += o.succeeded;
        self.throttled += o.throttled;
        for (k, v) in &o.failed {
            *self.failed.entry(k.clone()).or_default() += v;
        }
        self.retrans_invite += o.retrans_invite;
        self.retrans_bye += o.retrans_bye;
        self.retrans_200 += o.retrans_200;
        self.retrans_ack += o.retrans_ack;
        self.uas_calls += o.uas_calls;
        self.uas_ack_timeouts += o.uas_ack_timeouts;
        self.msgs_ignored += o.msgs_ignored;
        self.invite_to_180.add(&o.invite_to_180).ok();
        self.invite_to_200.add(&o.invite_to_200).ok();
        self.bye_to_200.add(&o.bye_to_200).ok();
    }

    fn fail(&mut self, reason: &str) {
        *self.failed.entry(reason.to_string()).or_default() += 1;
    }
}

/// Where a UAC call is.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum UacState {
    /// INVITE sent, nothing heard (Timer A running).
    Calling,
    /// Provisional response heard.
    Proceeding,
    /// 200 ACKed, waiting to send BYE.
    Confirmed,
    /// BYE sent.
    Terminating,
}

/// A call this generator started.
struct UacCall {
    state: UacState,
    /// When the INVITE was first sent.
    t_invite: u64,
    /// When the BYE was first sent.
    t_bye: u64,
    got_180: bool,
    /// Current retransmission interval.
    interval: u64,
    /// A provisional response to the BYE was heard (retransmit every T2).
    bye_prov: bool,
    /// Set by the 200.
    dialog: Dialog,
}

impl UacCall {
    fn new(now: u64, t1: u64) -> UacCall {
        UacCall {
            state: UacState::Calling,
            t_invite: now,
            t_bye: 0,
            got_180: false,
            interval: t1,
            bye_prov: false,
            dialog: Dialog::default(),
        }
    }
}

/// A call this generator answers, until its ACK (or BYE) comes.
struct UasCall {
    call_id: Vec<u8>,
    /// The 200, repeated until the ACK.
    ok: Vec<u8>,
    /// Where responses go.
    dst: SocketAddr,
    /// Current retransmission interval of the 200.
    interval: u64,
}

/// The last URI looked up and its address (every call of a run has the
/// same Contact and Record-Route, so parsing them once is enough).
#[derive(Default)]
struct UriMemo {
    uri: Vec<u8>,
    addr: Option<(SocketAddr, bool)>,
}

impl UriMemo {
    /// [`uri_addr`] of `uri`, remembered for the next identical `uri`.
    fn get(&mut self, uri: &[u8]) -> Option<(SocketAddr, bool)> {
        if self.uri != uri || self.uri.is_empty() {
            self.uri.clear();
            self.uri.extend_from_slice(uri);
            self.addr = uri_addr(uri);
        }
        self.addr
    }
}

/// Multiply-rotate hasher for the generator's own keys (call numbers and
/// Call-IDs it mostly made itself); SipHash is not needed here.
#[derive(Default, Clone, Copy)]
struct FastHash(u64);

impl Hasher for FastHash {
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            self.write_u64(u64::from_le_bytes(word));
        }
    }
    fn write_u64(&mut self, x: u64) {
        self.0 = (self.0.rotate_left(5) ^ x).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
    fn finish(&self) -> u64 {
        self.0
    }
}

type FastMap<K, V> = HashMap<K, V, BuildHasherDefault<FastHash>>;

/// A SIP call generator (UAC and UAS) without I/O; see the module docs.
pub struct CallGen {
    templates: Templates,
    /// Remote target and first-route lookups.
    target_memo: UriMemo,
    route_memo: UriMemo,
    /// Where INVITEs go.
    next_hop: SocketAddr,
    proxy: Option<SocketAddr>,
    /// The UAS of the Request-URI.
    ruri: SocketAddr,
    t1: u64,
    t2: u64,
    hold: u64,
    /// UAC calls in flight by call number.
    calls: FastMap<u64, UacCall>,
    /// Number of the next call started.
    next_call: u64,
    /// UAS calls waiting for their ACK, by id, and their ids by Call-ID.
    uas: FastMap<u64, UasCall>,
    uas_ids: FastMap<Vec<u8>, u64>,
    next_uas: u64,
    timers: Timers,
    /// The message being built.
    scratch: Vec<u8>,
    stats: CallStats,
    /// RFC 7339 loss-based throttle of new calls (`None`: overload control off).
    throttle: Option<LossThrottle>,
}

impl CallGen {
    /// A generator with no call in flight.
    pub fn new(cfg: &CallGenConfig) -> CallGen {
        let ruri = cfg.uas.unwrap_or(cfg.local);
        CallGen {
            templates: Templates::new(
                &cfg.local.to_string(),
                &ruri.to_string(),
                &cfg.run_id,
                cfg.index,
                cfg.overload_control,
            ),
            target_memo: UriMemo::default(),
            route_memo: UriMemo::default(),
            next_hop: cfg.proxy.unwrap_or(ruri),
            proxy: cfg.proxy,
            ruri,
            t1: cfg.t1.as_nanos() as u64,
            t2: cfg.t2.as_nanos() as u64,
            hold: cfg.hold.as_nanos() as u64,
            calls: FastMap::default(),
            next_call: 0,
            uas: FastMap::default(),
            uas_ids: FastMap::default(),
            next_uas: 0,
            timers: Timers::default(),
            scratch: Vec::with_capacity(2048),
            stats: CallStats::default(),
            throttle: cfg.overload_control.then(LossThrottle::default),
        }
    }

    /// Start `n` calls at `now` (their INVITEs go to `out`).
    pub fn start_calls(&mut self, now: u64, n: u64, out: &mut Sink<'_>) {
        for _ in 0..n {
            if let Some(throttle) = self.throttle.as_mut() {
                if !throttle.admit(now) {
                    // RFC 7339 5.3: refused here, never sent.
                    self.stats.attempted += 1;
                    self.stats.throttled += 1;
                    continue;
                }
            }
            let id = self.next_call;
            self.next_call += 1;
            self.templates.invite(&mut self.scratch, id);
            out(self.next_hop, MessageKind::Invite, &self.scratch);
            self.stats.attempted += 1;
            self.calls.insert(id, UacCall::new(now, self.t1));
            self.schedule_after(Delay::T1, now, id, TimerKind::InviteRetransmit);
            self.schedule_after(Delay::SixtyFourT1, now, id, TimerKind::InviteTimeout);
        }
    }

    /// Handle one datagram from `src`. `now` is the current time (timers
    /// are set from it); `received` is when the datagram arrived, on the
    /// same clock and at most `now`: response times are measured to it.
    pub fn handle(
        &mut self,
        now: u64,
        received: u64,
        src: SocketAddr,
        datagram: &[u8],
        out: &mut Sink<'_>,
    ) {
        let Some(view) = View::parse(datagram) else {
            self.stats.msgs_ignored += 1;
            return;
        };
        if view.is_request() {
            self.on_request(&view, src, now, out);
            return;
        }
        if let Some(throttle) = self.throttle.as_mut() {
            // RFC 7339: an advertisement in our Via (the top one).
            if let Some(advert) = view.top_via_params().and_then(OcReceived::from_via_params) {
                throttle.receive(now, advert);
            }
        }
        if !self.on_response(&view, now, received, out) {
            self.stats.msgs_ignored += 1;
        }
    }

    /// Run the timers due at `now`: retransmissions, timeouts, BYEs after
    /// the hold time.
    pub fn on_timer(&mut self, now: u64, out: &mut Sink<'_>) {
        while let Some(timer) = self.timers.pop_due(now) {
            self.fire(timer, now, out);
        }
    }

    /// The earliest timer deadline, if any timer is pending (some may find
    /// their call gone and do nothing).
    pub fn next_deadline(&self) -> Option<u64> {
        self.timers.next_at()
    }

    /// Calls started here and not finished yet.
    pub fn calls_in_flight(&self) -> usize {
        self.calls.len()
    }

    /// Calls answered here whose ACK has not come yet.
    pub fn uas_calls_waiting(&self) -> usize {
        self.uas.len()
    }

    /// No call in flight, in either role.
    pub fn is_idle(&self) -> bool {
        self.calls.is_empty() && self.uas.is_empty()
    }

    /// Give up the calls in flight: each counts as failed with `reason`.
    /// Returns how many there were.
    pub fn abandon_calls(&mut self, reason: &str) -> u64 {
        let left = self.calls.len() as u64;
        if left > 0 {
            *self.stats.failed.entry(reason.into()).or_default() += left;
            self.calls.clear();
        }
        left
    }

    /// Call accounting so far.
    pub fn stats(&self) -> &CallStats {
        &self.stats
    }

    /// The final call accounting.
    pub fn into_stats(self) -> CallStats {
        self.stats
    }

    /// A timer at `now` + `d`.
    fn schedule_after(&mut self, d: Delay, now: u64, key: u64, kind: TimerKind) {
        let deadline = now
            + match d {
                Delay::T1 => self.t1,
                Delay::SixtyFourT1 => 64 * self.t1,
                Delay::Hold => self.hold,
            };
        self.timers.push_fifo(
            d,
            Timer {
                at: deadline,
                key,
                kind,
            },
        );
    }

    /// A timer at `at`.
    fn schedule(&mut self, at: u64, key: u64, kind: TimerKind) {
        self.timers.push(Timer { at, key, kind });
    }

    /// Build in-dialog request `method` of call `n` into `scratch`;
    /// returns where to send it (`None`: the route set or remote target
    /// has no usable address, or the call is gone).
    fn build_in_dialog(&mut self, n: u64, method: &str, cseq: u32) -> Option<SocketAddr> {
        let call = self.calls.get(&n)?;
        let (dst, strict) = match call.dialog.route.first() {
            // No route set: an outbound proxy, when configured, still gets
            // the request (RFC 3261 8.1.2); else the remote target does.
            None => {
                let target = self.target_memo.get(&call.dialog.target)?.0;
                (self.proxy.unwrap_or(target), false)
            }
            Some(route) => {
                let (addr, loose_route) = self.route_memo.get(name_addr_uri(route))?;
                (addr, !loose_route)
            }
        };
        self.templates
            .in_dialog(&mut self.scratch, n, method, cseq, &call.dialog, strict);
        Some(dst)
    }

    /// Send in-dialog request `method` of call `n`; false when it has nowhere to go.
    fn send_in_dialog(&mut self, n: u64, method: &str, cseq: u32, out: &mut Sink<'_>) -> bool {
        let kind = if method == "ACK" {
            MessageKind::Ack
        } else {
            MessageKind::Bye
        };
        match self.build_in_dialog(n, method, cseq) {
            Some(dst) => {
                out(dst, kind, &self.scratch);
                true
            }
            None => false,
        }
    }

    fn fire(&mut self, timer: Timer, now: u64, out: &mut Sink<'_>) {
        match timer.kind {
            TimerKind::InviteRetransmit => {
                let Some(call) = self.calls.get_mut(&timer.key) else {
                    return;
                };
                if call.state != UacState::Calling {
                    return;
                }
                call.interval *= 2;
                let next = now + call.interval;
                self.templates.invite(&mut self.scratch, timer.key);
                out(self.next_hop, MessageKind::Invite, &self.scratch);
                self.stats.retrans_invite += 1;
                self.schedule(next, timer.key, TimerKind::InviteRetransmit);
            }
            TimerKind::InviteTimeout => {
                let timed_out = matches!(
                    self.calls.get(&timer.key).map(|call| call.state),
                    Some(UacState::Calling | UacState::Proceeding)
                );
                if timed_out {
                    self.calls.remove(&timer.key);
                    self.stats.fail("timeout_invite");
                }
            }
            TimerKind::ByeStart => {
                let Some(call) = self.calls.get_mut(&timer.key) else {
                    return;
                };
                if call.state != UacState::Confirmed {
                    return;
                }
                call.state = UacState::Terminating;
                call.t_bye = now;
                call.interval = self.t1;
                if self.send_in_dialog(timer.key, "BYE", 2, out) {
                    self.schedule_after(Delay::T1, now, timer.key, TimerKind::ByeRetransmit);
                    self.schedule_after(Delay::SixtyFourT1, now, timer.key, TimerKind::ByeTimeout);
                } else {
                    self.calls.remove(&timer.key);
                    self.stats.fail("bad_route");
                }
            }
            TimerKind::ByeRetransmit => {
                let t2 = self.t2;
                let Some(call) = self.calls.get_mut(&timer.key) else {
                    return;
                };
                if call.state != UacState::Terminating {
                    return;
                }
                call.interval = if call.bye_prov {
                    t2
                } else {
                    (call.interval * 2).min(t2)
                };
                let next = now + call.interval;
                self.send_in_dialog(timer.key, "BYE", 2, out);
                self.stats.retrans_bye += 1;
                self.schedule(next, timer.key, TimerKind::ByeRetransmit);
            }
            TimerKind::ByeTimeout => {
                if self.calls.get(&timer.key).map(|call| call.state) == Some(UacState::Terminating)
                {
                    self.calls.remove(&timer.key);
                    self.stats.fail("timeout_bye");
                }
            }
            TimerKind::OkRetransmit => {
                let Some(uas_call) = self.uas.get_mut(&timer.key) else {
                    return;
                };
                uas_call.interval = (uas_call.interval * 2).min(self.t2);
                let next = now + uas_call.interval;
                out(uas_call.dst, MessageKind::InviteOk, &uas_call.ok);
                self.stats.retrans_200 += 1;
                self.schedule(next, timer.key, TimerKind::OkRetransmit);
            }
            TimerKind::AckTimeout => {
                if let Some(uas_call) = self.uas.remove(&timer.key) {
                    self.uas_ids.remove(&uas_call.call_id);
                    self.stats.uas_ack_timeouts += 1;
                }
            }
        }
    }

    /// A response; false when it is not understood or not ours.
    fn on_response(
        &mut self,
        view: &View<'_>,
        now: u64,
        received: u64,
        out: &mut Sink<'_>,
    ) -> bool {
        let (Some(code), Some((_, method)), Some(cid)) =
            (view.status(), view.cseq(), view.call_id())
        else {
            return false;
        };
        let Some(number) = self.templates.call_number(cid) else {
            return false;
        };
        // Response time in µs: arrival minus the first send.
        let micros = |sent: u64| (received.saturating_sub(sent) / 1000).max(1);
        if method == b"INVITE" {
            if (300..700).contains(&code) {
                // Non-2xx final: ACK hop-by-hop (same branch), from the response alone.
                if let Some(to_line) = view.lines(Hdr::To).next() {
                    self.templates
                        .ack_non2xx(&mut self.scratch, number, to_line);
                    out(self.next_hop, MessageKind::Ack, &self.scratch);
                }
                if self.calls.get(&number).is_some_and(|call| {
                    matches!(call.state, UacState::Calling | UacState::Proceeding)
                }) {
                    self.calls.remove(&number);
                    self.stats.fail(&code.to_string());
                }
                return true;
            }
            let Some(call) = self.calls.get_mut(&number) else {
                return true; // late response of a finished call
            };
            if (100..200).contains(&code) {
                if call.state == UacState::Calling {
                    call.state = UacState::Proceeding;
                }
                if code == 180 && !call.got_180 {
                    call.got_180 = true;
                    let _ = self.stats.invite_to_180.record(micros(call.t_invite));
                }
                return true;
            }
            if (200..300).contains(&code) {
                if matches!(call.state, UacState::Calling | UacState::Proceeding) {
                    let _ = self.stats.invite_to_200.record(micros(call.t_invite));
                    let (Some(route), Ok(target)) = (view.record_routes(), view.contact_uri())
                    else {
                        // A route set or target that does not parse: the
                        // dialog cannot be followed.
                        self.calls.remove(&number);
                        self.stats.fail("bad_route");
                        return true;
                    };
                    call.state = UacState::Confirmed;
                    call.dialog = Dialog {
                        to_tag: view.to_tag().unwrap_or_default().to_vec(),
                        route: route.into_iter().rev().collect(),
                        target: match target {
                            Some(t) => t.to_vec(),
                            None => format!("sip:service@{}", self.ruri).into_bytes(),
                        },
                    };
                    if self.send_in_dialog(number, "ACK", 1, out) {
                        self.schedule_after(Delay::Hold, now, number, TimerKind::ByeStart);
                    } else {
                        self.calls.remove(&number);
                        self.stats.fail("bad_route");
                    }
                } else {
                    // Retransmitted 200: the UAS did not see our ACK.
                    self.send_in_dialog(number, "ACK", 1, out);
                    self.stats.retrans_ack += 1;
                }
                return true;
            }
            return false;
        }
        if method == b"BYE" {
            self.on_bye_response(number, code, received);
            return true;
        }
        false
    }

    /// A response to our BYE of call `number`: provisional (the UAS is
    /// there: retransmit at T2 from now on) or final (the call is over).
    fn on_bye_response(&mut self, number: u64, code: u16, received: u64) {
        let Some(call) = self.calls.get_mut(&number) else {
            return;
        };
        if call.state != UacState::Terminating {
            return;
        }
        if (100..200).contains(&code) {
            call.bye_prov = true;
            return;
        }
        let t_bye = call.t_bye;
        self.calls.remove(&number);
        if (200..300).contains(&code) {
            let micros = (received.saturating_sub(t_bye) / 1000).max(1);
            let _ = self.stats.bye_to_200.record(micros);
            self.stats.succeeded += 1;
        } else {
            self.stats.fail(&format!("bye_{code}"));
        }
    }

    /// A request (the UAS role).
    fn on_request(&mut self, view: &View<'_>, src: SocketAddr, now: u64, out: &mut Sink<'_>) {
        let (Some(method), Some(cid), Some(_)) = (view.method(), view.call_id(), view.cseq())
        else {
            self.stats.msgs_ignored += 1;
            return;
        };
        let Some(dst) = view.response_target(src) else {
            self.stats.msgs_ignored += 1;
            return;
        };
        let templates = &self.templates;
        match method {
            b"INVITE" => {
                if let Some(id) = self.uas_ids.get(cid) {
                    // Retransmitted INVITE: repeat the last response.
                    let uas_call = &self.uas[id];
                    out(dst, MessageKind::InviteOk, &uas_call.ok);
                    return;
                }
                templates.response(&mut self.scratch, view, 180, "Ringing", true);
                out(dst, MessageKind::Provisional, &self.scratch);
                templates.response(&mut self.scratch, view, 200, "OK", true);
                out(dst, MessageKind::InviteOk, &self.scratch);
                let id = self.next_uas;
                self.next_uas += 1;
                self.uas_ids.insert(cid.to_vec(), id);
                self.uas.insert(
                    id,
                    UasCall {
                        call_id: cid.to_vec(),
                        ok: self.scratch.clone(),
                        dst,
                        interval: self.t1,
                    },
                );
                self.stats.uas_calls += 1;
                self.schedule_after(Delay::T1, now, id, TimerKind::OkRetransmit);
                self.schedule_after(Delay::SixtyFourT1, now, id, TimerKind::AckTimeout);
            }
            b"ACK" => {
                if let Some(id) = self.uas_ids.remove(cid) {
                    self.uas.remove(&id);
                }
            }
            b"BYE" => {
                if let Some(id) = self.uas_ids.remove(cid) {
                    self.uas.remove(&id);
                }
                templates.response(&mut self.scratch, view, 200, "OK", false);
                out(dst, MessageKind::Final, &self.scratch);
            }
            b"OPTIONS" | b"CANCEL" => {
                templates.response(&mut self.scratch, view, 200, "OK", false);
                out(dst, MessageKind::Final, &self.scratch);
            }
            _ => {
                templates.response(&mut self.scratch, view, 501, "Not Implemented", false);
                out(dst, MessageKind::Final, &self.scratch);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::template::{push_dec, to_tag_of, SDP};
    use super::*;

    /// A UAC dialog confirmed by the 200 `r`, with route set `route`.
    fn confirmed(r: &View<'_>, route: Vec<Vec<u8>>) -> UacCall {
        UacCall {
            state: UacState::Confirmed,
            t_invite: 0,
            t_bye: 0,
            got_180: true,
            interval: 0,
            bye_prov: false,
            dialog: Dialog {
                to_tag: r.to_tag().unwrap().to_vec(),
                route,
                target: r.contact_uri().unwrap().unwrap().to_vec(),
            },
        }
    }

    /// Our own address in these tests (no socket: the generator only names it).
    const LOCAL: &str = "127.0.0.1:5062";

    fn gen() -> CallGen {
        CallGen::new(&CallGenConfig {
            local: LOCAL.parse().unwrap(),
            uas: None,
            proxy: Some("127.0.0.1:5060".parse().unwrap()),
            run_id: "abcd1234".into(),
            index: 0,
            t1: Duration::from_millis(500),
            t2: Duration::from_secs(4),
            hold: Duration::ZERO,
            overload_control: false,
        })
    }

    /// The INVITE of call `n`.
    fn invite(g: &CallGen, n: u64) -> Vec<u8> {
        let mut out = Vec::new();
        g.templates.invite(&mut out, n);
        out
    }

    /// The UAS's response to `v`.
    fn response(g: &CallGen, v: &View<'_>, code: u16, reason: &str) -> Vec<u8> {
        let mut out = Vec::new();
        g.templates.response(&mut out, v, code, reason, true);
        out
    }

    #[test]
    fn own_messages_parse_with_ringway_sip() {
        let mut w = gen();
        let inv = invite(&w, 7);
        let m = ringway_sip::SipMsg::parse(&inv);
        assert!(
            m.is_ok(),
            "{:?}\n{}",
            m.err(),
            String::from_utf8_lossy(&inv)
        );
        let v = View::parse(&inv).unwrap();
        assert_eq!(w.templates.call_number(v.call_id().unwrap()), Some(7));
        let resp = response(&w, &v, 200, "OK");
        let m = ringway_sip::SipMsg::parse(&resp);
        assert!(
            m.is_ok(),
            "{:?}\n{}",
            m.err(),
            String::from_utf8_lossy(&resp)
        );
        let r = View::parse(&resp).unwrap();
        assert_eq!(r.status(), Some(200));
        assert!(r.to_tag().is_some());
        // Dialog state from the 200, then the in-dialog BYE.
        w.calls
            .insert(7, confirmed(&r, vec![b"<sip:127.0.0.1:5060;lr>".to_vec()]));
        let dst = w.build_in_dialog(7, "BYE", 2).unwrap();
        assert_eq!(dst, "127.0.0.1:5060".parse().unwrap());
        let bye = w.scratch.clone();
        let m = ringway_sip::SipMsg::parse(&bye);
        assert!(
            m.is_ok(),
            "{:?}\n{}",
            m.err(),
            String::from_utf8_lossy(&bye)
        );
        let b = View::parse(&bye).unwrap();
        assert_eq!(b.method(), Some(&b"BYE"[..]));
        assert!(String::from_utf8_lossy(&bye).contains("Route: <sip:127.0.0.1:5060;lr>\r\n"));
        assert!(String::from_utf8_lossy(&bye).starts_with("BYE sip:service@"));
        // Strict first route: it becomes the Request-URI, the remote target the last Route.
        let target = w.calls[&7].dialog.target.clone();
        w.calls.get_mut(&7).unwrap().dialog.route = vec![
            b"<sip:127.0.0.9:5080;transport=udp>".to_vec(),
            b"<sip:127.0.0.8;lr>".to_vec(),
        ];
        let dst = w.build_in_dialog(7, "ACK", 1).unwrap();
        assert_eq!(dst, "127.0.0.9:5080".parse().unwrap());
        let ack = String::from_utf8(w.scratch.clone()).unwrap();
        assert!(
            ack.starts_with("ACK sip:127.0.0.9:5080 SIP/2.0\r\n"),
            "{ack}"
        );
        let want = format!(
            "Route: <sip:127.0.0.8;lr>, <{}>\r\n",
            String::from_utf8_lossy(&target)
        );
        assert!(ack.contains(&want), "{ack}");
        assert!(ringway_sip::SipMsg::parse(ack.as_bytes()).is_ok());
        // No route set: the outbound proxy gets it, Request-URI = remote target.
        w.calls.get_mut(&7).unwrap().dialog.route.clear();
        assert_eq!(
            w.build_in_dialog(7, "BYE", 2),
            Some("127.0.0.1:5060".parse().unwrap())
        );
        assert!(!String::from_utf8_lossy(&w.scratch).contains("Route:"));
    }

    #[test]
    fn templates_render_the_documented_messages() {
        let mut w = gen();
        let l = LOCAL;
        let r = l; // no --uas: the built-in UAS is the Request-URI
        let (run, t, n) = ("abcd1234", 0usize, 4242u64);
        w.templates.invite(&mut w.scratch, n);
        let want = format!(
            "INVITE sip:service@{r} SIP/2.0\r\n\
             Via: SIP/2.0/UDP {l};branch=z9hG4bK-{run}-{t:03}-{n:08}-i;rport\r\n\
             Max-Forwards: 70\r\n\
             From: <sip:ringway@{l}>;tag={t:03}x{n:08}\r\n\
             To: <sip:service@{r}>\r\n\
             Call-ID: {n:08}-{t:03}-{run}@ringway\r\n\
             CSeq: 1 INVITE\r\n\
             Contact: <sip:ringway@{l}>\r\n\
             Content-Type: application/sdp\r\n\
             Content-Length: {len}\r\n\r\n{SDP}",
            len = SDP.len()
        );
        assert_eq!(String::from_utf8_lossy(&w.scratch), want);
        let inv = w.scratch.clone();
        let v = View::parse(&inv).unwrap();
        w.scratch = response(&w, &v, 180, "Ringing");
        let tag = format!("{:016x}", to_tag_of(v.call_id().unwrap()));
        let want = format!(
            "SIP/2.0 180 Ringing\r\n\
             Via: SIP/2.0/UDP {l};branch=z9hG4bK-{run}-{t:03}-{n:08}-i;rport\r\n\
             From: <sip:ringway@{l}>;tag={t:03}x{n:08}\r\n\
             To: <sip:service@{r}>;tag={tag}\r\n\
             Call-ID: {n:08}-{t:03}-{run}@ringway\r\n\
             CSeq: 1 INVITE\r\n\
             Contact: <sip:service@{l}>\r\n\
             Content-Length: 0\r\n\r\n"
        );
        assert_eq!(String::from_utf8_lossy(&w.scratch), want);
        let resp = response(&w, &v, 200, "OK");
        assert!(String::from_utf8_lossy(&resp).ends_with(&format!(
            "Content-Type: application/sdp\r\nContent-Length: {}\r\n\r\n{SDP}",
            SDP.len()
        )));
        let rv = View::parse(&resp).unwrap();
        w.calls.insert(n, confirmed(&rv, Vec::new()));
        w.build_in_dialog(n, "BYE", 2).unwrap();
        let want = format!(
            "BYE sip:service@{l} SIP/2.0\r\n\
             Via: SIP/2.0/UDP {l};branch=z9hG4bK-{run}-{t:03}-{n:08}-b;rport\r\n\
             Max-Forwards: 70\r\n\
             From: <sip:ringway@{l}>;tag={t:03}x{n:08}\r\n\
             To: <sip:service@{r}>;tag={tag}\r\n\
             Call-ID: {n:08}-{t:03}-{run}@ringway\r\n\
             CSeq: 2 BYE\r\n\
             Content-Length: 0\r\n\r\n"
        );
        assert_eq!(String::from_utf8_lossy(&w.scratch), want);
        // Call-IDs: ours map back to the call number, others do not.
        let cid = |s: &str| w.templates.call_number(s.as_bytes());
        assert_eq!(cid(&format!("{n:08}-000-{run}@ringway")), Some(n));
        assert_eq!(
            cid("123456789012-000-abcd1234@ringway"),
            Some(123_456_789_012)
        );
        for other in [
            "00004242-001-abcd1234@ringway",
            "00004242-000-abcd1235@ringway",
            "-000-abcd1234@ringway",
            "12a4-000-abcd1234@ringway",
            "99999999999999999999-000-abcd1234@ringway",
            "x",
        ] {
            assert_eq!(cid(other), None, "{other}");
        }
        let mut d = Vec::new();
        push_dec(&mut d, 0, 3);
        push_dec(&mut d, 7, 1);
        push_dec(&mut d, 123_456, 3);
        push_dec(&mut d, u64::MAX, 8);
        assert_eq!(
            String::from_utf8(d).unwrap(),
            format!("0007123456{}", u64::MAX)
        );
    }

    #[test]
    fn messages_of_a_kind_have_one_length() {
        let mut w = gen();
        let mut lens: Vec<[usize; 5]> = Vec::new();
        for n in [0u64, 7, 4242, 12_345_678] {
            let inv = invite(&w, n);
            let v = View::parse(&inv).unwrap();
            let l180 = response(&w, &v, 180, "Ringing").len();
            let resp = response(&w, &v, 200, "OK");
            let r = View::parse(&resp).unwrap();
            w.calls.insert(n, confirmed(&r, Vec::new()));
            w.build_in_dialog(n, "ACK", 1).unwrap();
            let ack = w.scratch.len();
            w.build_in_dialog(n, "BYE", 2).unwrap();
            lens.push([inv.len(), l180, resp.len(), ack, w.scratch.len()]);
            assert_eq!(w.templates.call_number(v.call_id().unwrap()), Some(n));
        }
        assert!(lens.iter().all(|l| *l == lens[0]), "{lens:?}");
    }
}
