//! One receive batch through the proxy core: [`SipWorker::drive_batch`],
//! the seam the worker threads run and tests drive with a fake
//! [`BatchIo`].

use super::keepalive::FlowMonitor;
use super::service::ServiceTime;
use super::stats::{Latency, WorkerMetrics};
use super::tcp::Connections;
use ringway_io::time::realtime_now;
use ringway_io::{BatchIo, IcmpUnreachable, Nanos, RxBatch, TxBatch, TxStamp};
use ringway_sip::overload::{ShedConfig, Shedder};
use ringway_sip::overload_control::{OcController, OcControllerConfig, OcPool};
use ringway_sip::{Action, DropReason, Hop, MsgLabel, Outcome, Proxy, ProxyWorker, Transport};
use std::sync::Arc;

/// Bits of a TX stamp tag that carry the sequence number; the message
/// type's slot is above them.
const TAG_SHIFT: u32 = 40;
/// Bytes per send frame: a forwarded message grows by Via/Record-Route.
pub const TX_FRAME: usize = super::RX_FRAME + 2048;
/// The second stage of overload shedding: a new INVITE that waited more
/// than this many times the shedding target is dropped unanswered on a peek
/// of its first bytes (no parse, no 503 to build and send, no ACK to
/// absorb); the sender's retransmission covers it like a loss. Such waits
/// follow a stall (the proxy descheduled, a burst): the queue drains
/// several times faster than with a 503 each.
pub(crate) const OVERLOAD_DROP_FACTOR: u64 = 2;
/// How often (ns) a busy worker copies its backend's counters into its
/// metrics: reading them may be a system call (AF_XDP's
/// `XDP_STATISTICS`), once per batch was one per wake-up at low rates.
/// [`SipWorker::refresh_io`] reads them at once (on an idle timeout, and
/// when the worker ends).
const IO_STATS_EVERY_NS: u64 = 10_000_000;

/// What overload control made of one datagram before any parse.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Shed {
    /// A new INVITE to drop unanswered.
    drop: bool,
    /// A new INVITE that is the resend of one dropped unanswered
    /// ([`OcController::is_resend`]).
    resent: bool,
}

/// Overload control of one datagram, before any parse: feed its queueing
/// delay to `shedder`; a new INVITE that waited beyond
/// [`OVERLOAD_DROP_FACTOR`] × the target is to be dropped unanswered (its
/// Call-ID remembered by `oc`), else set the core's shedding for it (a new
/// INVITE the controller refuses gets `503`, unless `oc`'s floor takes it:
/// [`OcController::overrides_refusal`]). Only a new INVITE is peeked at,
/// and only while the controller sheds, the wait is beyond the drop bound,
/// or `oc` expects resends of INVITEs dropped in the last 32 s.
fn shed(
    shedder: &mut Shedder,
    oc: Option<&mut OcController>,
    proxy: &mut ProxyWorker<'_>,
    datagram: &ringway_io::Datagram<'_>,
    picked_at: Nanos,
) -> Shed {
    let mut beyond_drop_bound = false;
    // Without a stamp the wait is unknown: never under the floor's bound.
    let mut waited = u64::MAX;
    if let Some(stamp) = datagram.meta.kernel_rx {
        // Queueing delay: the kernel's RX stamp (realtime) to now. The
        // controller's intervals run on arrival time (the stamps).
        waited = picked_at.saturating_since(stamp);
        shedder.observe(stamp.0, waited);
        let bound = shedder.config().target.saturating_mul(OVERLOAD_DROP_FACTOR);
        beyond_drop_bound = waited > bound;
    }
    let expects_resends = oc
        .as_deref()
        .is_some_and(|oc| oc.expects_resends(picked_at.0));
    let new_invite = (shedder.is_shedding() || beyond_drop_bound || expects_resends)
        && ringway_sip::peek::is_new_invite(datagram.data);
    let call_id = match &oc {
        Some(_) if new_invite => ringway_sip::peek::call_id(datagram.data),
        _ => None,
    };
    let resent = match (oc.as_deref(), call_id) {
        (Some(oc), Some(call_id)) => oc.is_resend(picked_at.0, call_id),
        _ => false,
    };
    if new_invite && beyond_drop_bound {
        if let (Some(oc), Some(call_id)) = (oc.as_deref(), call_id) {
            oc.remember_dropped(picked_at.0, call_id);
        }
        return Shed { drop: true, resent };
    }
    let refuse = new_invite && shedder.is_shedding() && !shedder.admit_new_call();
    let refuse = refuse && !oc.is_some_and(|oc| oc.overrides_refusal(picked_at.0, waited));
    proxy.set_shedding(refuse);
    Shed {
        drop: false,
        resent,
    }
}

/// Count a new call (or, `resent`, the resend of one dropped unanswered)
/// for `oc` from what the core did with an INVITE: forwarded (admitted) or
/// refused with `503`; anything else (a retransmission absorbed, another
/// answer) is not a new call's fate. Returns whether a resend was counted.
fn count_new_call(oc: &mut OcController, now: Nanos, outcome: &Outcome, resent: bool) -> bool {
    if outcome.label != MsgLabel::Invite {
        return false;
    }
    let admitted = match outcome.action {
        Action::Forwarded { .. } => true,
        Action::Responded(503) => false,
        _ => return false,
    };
    if resent {
        oc.count_resend(now.0, admitted);
    } else {
        oc.count_new_call(now.0, admitted);
    }
    resent
}

/// Per-worker state: the send batch, TX-stamp sampling, and the metrics.
pub struct SipWorker<'p> {
    proxy: ProxyWorker<'p>,
    tx: TxBatch,
    stamps: Vec<TxStamp>,
    tx_stamp_every: u64,
    sent_seq: u64,
    stamps_seen: u64,
    metrics: WorkerMetrics,
    /// Datagrams of the current batch whose output waits for the send
    /// call: (slot, end of processing on the realtime clock).
    waiting: Vec<(usize, Nanos)>,
    /// Overload control of new INVITEs from the queueing delay (from each
    /// datagram's kernel RX stamp); `None`: off.
    shedder: Option<Shedder>,
    /// RFC 7339 overload control (default on): the advertisement's
    /// controller, while `shedder` runs.
    overload_control: bool,
    oc: Option<OcController>,
    /// The pool the controller joins (workers sharing one queue; `None`:
    /// a pool of its own).
    oc_pool: Option<Arc<OcPool>>,
    /// The lab's pinned fraction ([`SipWorker::pin_admitted`]).
    pinned_ppm: Option<u32>,
    /// Emulated service time added to every handled message, and its
    /// random state.
    service: Option<(ServiceTime, u64)>,
    /// Where messages for connection transports go.
    connections: Option<Arc<Connections>>,
    /// The registrar's flows: answers to keepalives and STUN keepalives
    /// go there, not to the core.
    monitor: Option<Arc<FlowMonitor>>,
    /// ICMP unreachable reports taken from the socket, for the core.
    unreachable: Vec<IcmpUnreachable>,
    /// When the backend's counters were last copied into the metrics
    /// (the T_sip clock; `None`: never).
    io_read_at: Option<Nanos>,
}

impl<'p> SipWorker<'p> {
    /// A worker for `proxy` sending up to `batch * 4` datagrams per send
    /// call (more output is flushed early), requesting a kernel TX stamp
    /// for every `tx_stamp_every`th datagram it sends (0: never).
    pub fn new(proxy: &'p Proxy, batch: usize, tx_stamp_every: u64) -> SipWorker<'p> {
        SipWorker {
            proxy: proxy.worker(),
            tx: TxBatch::new(batch.max(1) * 4, TX_FRAME),
            stamps: Vec::with_capacity(64),
            tx_stamp_every,
            sent_seq: 0,
            stamps_seen: 0,
            metrics: WorkerMetrics::default(),
            waiting: Vec::with_capacity(batch.max(1)),
            shedder: None,
            overload_control: true,
            oc: None,
            oc_pool: None,
            pinned_ppm: None,
            service: None,
            connections: None,
            monitor: None,
            unreachable: Vec::new(),
            io_read_at: None,
        }
    }

    /// Hand answers to keepalives and RFC 5626 STUN keepalives to
    /// `monitor` ([`FlowMonitor`]) instead of the core.
    pub fn with_monitor(&mut self, monitor: Option<Arc<FlowMonitor>>) {
        self.monitor = monitor;
    }

    /// Send what the core addresses to a connection transport through
    /// `connections` (without: such messages are counted as oversize
    /// drops, which a UDP-only server never produces).
    pub fn with_connections(&mut self, connections: Option<Arc<Connections>>) {
        self.connections = connections;
    }

    /// Overload shedding with a queueing-delay target of `target` ns
    /// (`None`: never): [`Shedder`] turns the waits from the kernel RX
    /// stamps into the fraction of new INVITEs admitted; a refused one is
    /// handled with the core's shedding on ([`ProxyWorker::set_shedding`]:
    /// `503` + `Retry-After` before any state, nothing else changes).
    pub fn shed_after(&mut self, target: Option<u64>) {
        self.shed_with(target.map(ShedConfig::with_target));
    }

    /// [`SipWorker::shed_after`] with every knob of the controller.
    pub fn shed_with(&mut self, config: Option<ShedConfig>) {
        self.shedder = config.map(Shedder::new);
        self.pinned_ppm = None;
        self.reset_overload_control();
        // The gauge is there from the start (everything admitted), or not.
        self.metrics.overload_controllers = u64::from(self.shedder.is_some());
        self.metrics.overload_admitted_ppm = 1_000_000 * self.metrics.overload_controllers;
    }

    /// Lab and test knob: pin the controller's admitted fraction to `ppm`
    /// millionths ([`Shedder::pin`]; `None`: it follows the queue). Call
    /// after [`SipWorker::shed_with`].
    pub fn pin_admitted(&mut self, ppm: Option<u32>) {
        if let (Some(shedder), Some(ppm)) = (self.shedder.as_mut(), ppm) {
            shedder.pin(ppm);
            self.pinned_ppm = Some(ppm);
            self.reset_overload_control();
        }
    }

    /// RFC 7339 overload control (loss-based, default on): while the
    /// admission controller runs, a response the core generates to a
    /// client whose Via carries `oc` tells it the share of new calls to
    /// refuse itself ([`OcController`]: the offered calls beyond the
    /// measured capacity), and the admission controller refuses only what
    /// exceeds 90 % of that capacity. With a pinned fraction
    /// ([`SipWorker::pin_admitted`]) the advertisement is that fraction's
    /// refused share.
    pub fn overload_control(&mut self, on: bool) {
        self.overload_control = on;
        self.reset_overload_control();
    }

    /// Share the overload controller's estimate and advertisement with the
    /// other workers given the same `pool` (workers reading one socket:
    /// [`OcPool`]); `None`: this worker's own. Call before
    /// [`SipWorker::shed_with`].
    pub fn overload_control_pool(&mut self, pool: Option<Arc<OcPool>>) {
        self.oc_pool = pool;
        self.oc = None;
        self.reset_overload_control();
    }

    /// A fresh advertisement controller for the current settings (in this
    /// worker's place of the pool, if it has one already).
    fn reset_overload_control(&mut self) {
        let previous = self.oc.take();
        self.oc = (self.overload_control && self.shedder.is_some()).then(|| {
            let mut oc = match (&self.oc_pool, previous) {
                (Some(_), Some(previous)) => previous.fresh(),
                (Some(pool), None) => OcController::join(pool),
                (None, _) => OcController::new(OcControllerConfig::default()),
            };
            if let Some(ppm) = self.pinned_ppm {
                oc.pin(ppm);
            }
            oc
        });
    }

    /// Lab emulation: burn `service` CPU time per handled message, inside
    /// the T_sip measurement (`None`: off, the default). `seed` varies the
    /// exponential draws per worker.
    pub fn emulate_service(&mut self, service: Option<ServiceTime>, seed: u64) {
        self.service = service.map(|s| (s, seed));
    }

    /// What this worker measured so far.
    pub fn metrics(&self) -> &WorkerMetrics {
        &self.metrics
    }

    /// Count a failed receive call.
    pub fn count_rx_error(&mut self) {
        self.metrics.rx_errors += 1;
    }

    /// Count a wake-up of the receive loop ([`WorkerMetrics::wakeups`]).
    pub fn count_wakeup(&mut self) {
        self.metrics.wakeups += 1;
    }

    /// Count a receive-coalescing window slept.
    pub fn count_coalesce_window(&mut self) {
        self.metrics.rx_coalesce_windows += 1;
    }

    /// Copy `io`'s counters into the metrics now (a busy worker does so
    /// every 10 ms, [`IO_STATS_EVERY_NS`]; call this when idle and before
    /// the final metrics are taken).
    pub fn refresh_io(&mut self, io: &dyn BatchIo) {
        let io_stats = io.stats();
        let metrics = &mut self.metrics;
        metrics.msgs_out = io_stats.tx_packets;
        metrics.tx_errors = metrics.tx_errors.max(io_stats.tx_errors);
        metrics.socket_rx_dropped = io_stats.rx_dropped;
        metrics.io = io_stats;
    }

    /// Run every datagram of `rx` through the core (T_sip timed with
    /// `clock`), send what it produced with one `send_batch` (earlier only
    /// if the send batch fills), sample K_snd, and refresh the socket
    /// counters from `io` (the first time, then every 10 ms of `clock`:
    /// [`SipWorker::refresh_io`]). The waits follow the papers' eq. 1, stamped per
    /// datagram on the realtime clock (the clock of the receive stamps):
    /// K_rcv runs from the kernel RX stamp to the start of this datagram's
    /// own processing (t_sip-in − t_arr: the wait behind the datagrams
    /// before it in the batch included), and the wait after processing,
    /// from its end to the send call that hands the output to the kernel,
    /// is recorded as [`Latency::Wait`] (eq. 1 counts it in K_snd; a
    /// datagram with no output has none).
    pub fn drive_batch(
        &mut self,
        io: &mut dyn BatchIo,
        rx: &RxBatch,
        mut clock: impl FnMut() -> Nanos,
    ) {
        let SipWorker {
            proxy,
            tx,
            tx_stamp_every,
            sent_seq,
            metrics,
            waiting,
            shedder,
            oc,
            service,
            connections,
            monitor,
            ..
        } = self;
        tx.clear();
        waiting.clear();
        for datagram in rx.iter() {
            metrics.msgs_in += 1;
            if datagram.meta.truncated {
                metrics.rx_truncated += 1;
                continue;
            }
            let before = tx.len();
            let mut oversize = 0u64;
            let mut flushed = 0usize;
            let mut send_errors = 0u64;
            if let Some(monitor) = monitor.as_deref() {
                if keepalive_input(monitor, &datagram, tx) {
                    continue;
                }
            }
            let picked_at = realtime_now();
            let mut resent = false;
            if let Some(shedder) = shedder.as_mut() {
                let verdict = shed(shedder, oc.as_mut(), proxy, &datagram, picked_at);
                resent = verdict.resent;
                // The gauge: the fraction now (the last datagram's) and the
                // lowest seen, per datagram (a batch may span a whole cut).
                let ppm = u64::from(shedder.admitted_ppm());
                metrics.overload_controllers = 1;
                metrics.overload_admitted_ppm = ppm;
                metrics.overload_admitted_min_ppm = metrics.overload_admitted_min_ppm.min(ppm);
                if let Some(oc) = oc.as_mut() {
                    oc.tick(
                        picked_at.0,
                        shedder.standing_delay(),
                        shedder.config().target,
                        // A few times per period: CPU the worker got,
                        // so that its stalls do not count as lost capacity.
                        || Some(ringway_io::thread::thread_cpu_total().as_nanos() as u64),
                    );
                    if verdict.drop && verdict.resent {
                        oc.count_resend(picked_at.0, false);
                        metrics.overload_invite_resends += 1;
                    } else if verdict.drop {
                        oc.count_new_call(picked_at.0, false);
                    }
                    let advert = oc.advert(picked_at.0);
                    metrics.overload_oc_workers = 1;
                    metrics.overload_oc_reduction_pct = u64::from(advert.reduction());
                    metrics.overload_oc_capacity = oc.capacity().map_or(0, |c| c as u64);
                    proxy.set_overload_control(Some(advert));
                }
                if verdict.drop {
                    metrics.overload_queue_drops += 1;
                    let stats = metrics.slot_mut(MsgLabel::Invite.slot());
                    stats.count += 1;
                    stats.count_drop(DropReason::Overload);
                    continue;
                }
            }
            let core_start = clock();
            let from = Hop::udp(datagram.meta.peer);
            let outcome =
                proxy.handle_from(core_start.0, from, datagram.data, &mut |hop, bytes| {
                    if hop.transport != Transport::Udp {
                        // Keep order across transports: what is queued (a
                        // 100 Trying upstream) leaves before a request goes
                        // out on a connection, whose answer, relayed by
                        // another thread, could otherwise overtake it.
                        if !tx.is_empty() {
                            match io.send_batch(tx) {
                                Ok(_) => flushed += tx.len(),
                                Err(_) => send_errors += tx.len() as u64,
                            }
                            tx.clear();
                        }
                        if let Some(connections) = connections.as_deref() {
                            connections.send(hop, bytes, core_start.0);
                        } else {
                            oversize += 1;
                        }
                        return;
                    }
                    let dst = hop.addr;
                    if tx.is_full() {
                        // More output than the batch holds: flush early (rare).
                        match io.send_batch(tx) {
                            Ok(_) => flushed += tx.len(),
                            Err(_) => send_errors += tx.len() as u64,
                        }
                        tx.clear();
                    }
                    if tx.push(dst, bytes).is_err() {
                        oversize += 1;
                    }
                });
            if let Some(oc) = oc.as_mut() {
                if count_new_call(oc, picked_at, &outcome, resent) {
                    metrics.overload_invite_resends += 1;
                }
            }
            if let Some((time, rng)) = service.as_mut() {
                time.burn(rng);
            }
            let core_end = clock();
            metrics.tx_oversize += oversize;
            metrics.tx_errors += send_errors;
            let slot = outcome.label.slot();
            match datagram.meta.kernel_rx {
                Some(stamp) => metrics
                    .slot_mut(slot)
                    .record(Latency::KRcv, picked_at.saturating_since(stamp)),
                None => metrics.k_rcv_missing += 1,
            }
            let t_sip = core_end.saturating_since(core_start);
            if tx.len() > before || flushed > 0 {
                waiting.push((slot, Nanos(picked_at.0 + t_sip)));
            }
            let stats = metrics.slot_mut(slot);
            stats.count += 1;
            stats.record(Latency::TSip, t_sip);
            stats.count_action(outcome.action);
            if *tx_stamp_every > 0 {
                // After an early flush every queued datagram is this one's.
                let start = if flushed > 0 { 0 } else { before };
                metrics.k_snd_requested +=
                    request_tx_stamps(tx, start, *tx_stamp_every, sent_seq, slot);
            }
        }
        self.send_and_record_waits(io);
        self.collect_tx_stamps(io);
        let now = clock();
        let due = self
            .io_read_at
            .is_none_or(|at| now.saturating_since(at) >= IO_STATS_EVERY_NS);
        if due {
            self.io_read_at = Some(now);
            self.refresh_io(io);
        }
    }

    /// Send what the batch produced, then record each datagram's wait
    /// after its processing (up to this send call).
    fn send_and_record_waits(&mut self, io: &mut dyn BatchIo) {
        let metrics = &mut self.metrics;
        let sent_at = realtime_now();
        for &(slot, done) in self.waiting.iter() {
            metrics
                .slot_mut(slot)
                .record(Latency::Wait, sent_at.saturating_since(done));
        }
        if !self.tx.is_empty() {
            if io.send_batch(&self.tx).is_err() {
                metrics.tx_errors += self.tx.len() as u64;
            }
            self.tx.clear();
        }
    }

    /// Hand the core the ICMP unreachable errors `io` read for UDP
    /// destinations the proxy sent to ([`BatchIo::poll_unreachable`]; a
    /// system call only when one is queued or every 10 ms), each
    /// destination once per poll, and send what the core answers (the
    /// next targets of the transactions waiting there, or their `500`s).
    /// Call it every loop, busy or idle: it keeps the error queue short.
    pub fn report_unreachable(&mut self, io: &mut dyn BatchIo, now: u64) {
        self.unreachable.clear();
        if !matches!(io.poll_unreachable(&mut self.unreachable), Ok(1..)) {
            return;
        }
        self.unreachable
            .sort_unstable_by_key(|report| report.destination);
        self.unreachable.dedup_by_key(|report| report.destination);
        let SipWorker {
            proxy,
            tx,
            metrics,
            connections,
            unreachable,
            ..
        } = self;
        tx.clear();
        let mut oversize = 0u64;
        for report in unreachable.iter() {
            proxy.on_unreachable(now, Hop::udp(report.destination), &mut |hop, bytes| {
                if hop.transport != Transport::Udp {
                    match connections.as_deref() {
                        Some(connections) => {
                            connections.send(hop, bytes, now);
                        }
                        None => oversize += 1,
                    }
                    return;
                }
                if tx.is_full() {
                    if io.send_batch(tx).is_err() {
                        metrics.tx_errors += tx.len() as u64;
                    }
                    tx.clear();
                }
                if tx.push(hop.addr, bytes).is_err() {
                    oversize += 1;
                }
            });
        }
        metrics.tx_oversize += oversize;
        if !tx.is_empty() {
            if io.send_batch(tx).is_err() {
                metrics.tx_errors += tx.len() as u64;
            }
            tx.clear();
        }
        metrics.io = io.stats();
        metrics.msgs_out = metrics.io.tx_packets;
    }

    /// Record the K_snd of the TX stamps the kernel returned, polling only
    /// while some are outstanding (each poll is a system call).
    fn collect_tx_stamps(&mut self, io: &mut dyn BatchIo) {
        // The counters only when stamps are outstanding (they may cost a
        // system call).
        if self.metrics.k_snd_requested <= self.stamps_seen
            || self.metrics.k_snd_requested <= self.stamps_seen + io.stats().tx_stamps_lost
        {
            return;
        }
        self.stamps.clear();
        if io.poll_tx_stamps(&mut self.stamps).is_ok() {
            self.stamps_seen += self.stamps.len() as u64;
            for s in &self.stamps {
                let slot = (s.tag >> TAG_SHIFT) as usize;
                if slot >= MsgLabel::SLOTS {
                    // Not a tag this worker wrote: no message type to charge.
                    continue;
                }
                self.metrics
                    .slot_mut(slot)
                    .record(Latency::KSnd, s.kernel_tx.saturating_since(s.app_tx));
            }
        }
    }
}

/// A keepalive's answer (taken) or an RFC 5626 STUN keepalive (taken and
/// answered into `tx`): `true` when the datagram is not for the core.
fn keepalive_input(
    monitor: &FlowMonitor,
    datagram: &ringway_io::Datagram<'_>,
    tx: &mut TxBatch,
) -> bool {
    let peer = datagram.meta.peer;
    if super::keepalive::is_stun(datagram.data) {
        if let Some(answer) = monitor.on_stun(peer, datagram.data) {
            // A full batch drops the answer: the UA's next keepalive retries.
            let _ = tx.push(peer, answer.bytes());
        }
        return true;
    }
    if monitor.is_keepalive_reply(datagram.data) {
        monitor.on_reply(peer, datagram.data);
        return true;
    }
    false
}

/// Sample K_snd: ask for a kernel TX stamp on every `every`-th datagram
/// this worker sends (`sent_seq` counts them), for the datagrams of `tx`
/// from `start` on; each stamp's tag carries the message type's `slot`.
/// Returns how many stamps were asked for.
fn request_tx_stamps(
    tx: &mut TxBatch,
    start: usize,
    every: u64,
    sent_seq: &mut u64,
    slot: usize,
) -> u64 {
    let mut requested = 0;
    for index in start..tx.len() {
        *sent_seq += 1;
        if sent_seq.is_multiple_of(every) {
            let tag = ((slot as u64) << TAG_SHIFT) | (*sent_seq & ((1 << TAG_SHIFT) - 1));
            tx.request_stamp(index, tag);
            requested += 1;
        }
    }
    requested
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sip::stats::Latency;
    use ringway_io::testing::MemIo;
    use ringway_io::{BackendKind, RxMeta};
    use ringway_sip::{Mode, MsgLabel, ProxyConfig};
    use std::time::Duration;

    const UAC: &str = "192.0.2.1:5060";
    const UAS: &str = "192.0.2.2:5060";
    /// What the fake kernel adds between hand-off and its TX stamp.
    const K_SND_NS: u64 = 7_000;

    /// A backend that records every send call and hands back a TX stamp
    /// (K_SND_NS after hand-off) for every datagram that asked for one.
    fn mem_io() -> MemIo {
        MemIo::new(BackendKind::Mmsg, "192.0.2.10:5060".parse().unwrap())
            .with_tx_stamps(1_000_000, K_SND_NS)
    }

    fn proxy(mode: Mode) -> Proxy {
        Proxy::new(ProxyConfig {
            mode,
            local: "192.0.2.10:5060".parse().unwrap(),
            route_to: Some(UAS.parse().unwrap()),
            record_route: true,
            domains: vec!["example.com".into()],
            ..ProxyConfig::default()
        })
    }

    fn invite(n: usize, pad: usize) -> Vec<u8> {
        format!(
            "INVITE sip:bob@example.com SIP/2.0\r\nVia: SIP/2.0/UDP 192.0.2.1:5060;branch=z9hG4bKw{n}\r\n\
             Max-Forwards: 70\r\nFrom: <sip:alice@example.com>;tag=a{n}\r\nTo: <sip:bob@example.com>\r\n\
             Call-ID: w{n}@192.0.2.1\r\nCSeq: 1 INVITE\r\nContact: <sip:alice@192.0.2.1:5060>\r\n\
             X-Pad: {}\r\nContent-Length: 0\r\n\r\n",
            "x".repeat(pad)
        )
        .into_bytes()
    }

    /// A 180 Ringing as the UAS would answer the forwarded INVITE `fwd`.
    fn ringing(fwd: &[u8]) -> Vec<u8> {
        let text = String::from_utf8_lossy(fwd);
        let mut out = String::from("SIP/2.0 180 Ringing\r\n");
        for line in text.split("\r\n").skip(1).take_while(|l| !l.is_empty()) {
            let name = line.split(':').next().unwrap_or("").to_ascii_lowercase();
            if ["via", "from", "call-id", "cseq", "record-route"].contains(&name.as_str()) {
                out.push_str(line);
                out.push_str("\r\n");
            } else if name == "to" {
                out.push_str(line);
                out.push_str(";tag=b1\r\n");
            }
        }
        out.push_str("Content-Length: 0\r\n\r\n");
        out.into_bytes()
    }

    fn batch(msgs: &[(&str, &[u8], Option<u64>, bool)]) -> RxBatch {
        let mut rx = RxBatch::new(msgs.len(), 64 * 1024);
        for (from, data, kernel_rx, truncated) in msgs {
            rx.next_frame_mut().unwrap()[..data.len()].copy_from_slice(data);
            rx.commit(RxMeta {
                peer: from.parse().unwrap(),
                len: data.len(),
                truncated: *truncated,
                kernel_rx: kernel_rx.map(Nanos),
                app_rx: Nanos(50_000),
            });
        }
        rx
    }

    /// A clock that advances 1 µs per reading.
    fn ticking() -> impl FnMut() -> Nanos {
        let mut t = 100_000;
        move || {
            t += 1_000;
            Nanos(t)
        }
    }

    #[test]
    fn output_beyond_the_send_batch_is_flushed_early_and_nothing_is_lost() {
        let p = proxy(Mode::Stateful);
        // batch 1: a send batch holds 4 datagrams; three INVITEs make six
        // (100 Trying upstream + the forwarded INVITE each).
        let mut w = SipWorker::new(&p, 1, 0);
        let msgs: Vec<Vec<u8>> = (0..3).map(|n| invite(n, 0)).collect();
        let rx = batch(&[
            (UAC, &msgs[0], None, false),
            (UAC, &msgs[1], None, false),
            (UAC, &msgs[2], None, false),
        ]);
        let mut io = mem_io();
        w.drive_batch(&mut io, &rx, ticking());
        let sizes = io.send_calls().to_vec();
        assert_eq!(
            sizes,
            vec![4, 2],
            "one early flush of a full batch, then the rest"
        );
        let to_uas = io
            .sent()
            .iter()
            .filter(|s| s.dst == UAS.parse().unwrap())
            .count();
        assert_eq!(to_uas, 3);
        let m = w.metrics();
        assert_eq!(
            (m.msgs_in, m.msgs_out, m.tx_errors, m.tx_oversize),
            (3, 6, 0, 0)
        );
        let inv = m.get(MsgLabel::Invite).unwrap();
        assert_eq!((inv.count, inv.forwarded), (3, 3));
        assert_eq!(inv.histogram(Latency::TSip).len(), 3);
        assert!((inv.histogram(Latency::TSip).mean() - 1_000.0).abs() < 10.0);
        assert_eq!(m.k_rcv_missing, 3, "no kernel RX stamps given");
    }

    #[test]
    fn queued_datagrams_leave_before_a_request_goes_out_on_a_connection() {
        // Two INVITEs over UDP, routed to a TCP next hop: each one's 100
        // Trying is sent before its INVITE is handed to a connection (the
        // answer coming back on it must not overtake the 100).
        let p = Proxy::new(ProxyConfig {
            mode: Mode::Stateful,
            local: "192.0.2.10:5060".parse().unwrap(),
            route_to: Some(UAS.parse().unwrap()),
            route_to_transport: Transport::Tcp,
            listeners: vec![ringway_sip::TransportAddr {
                transport: Transport::Tcp,
                addr: "192.0.2.10:5060".parse().unwrap(),
            }],
            domains: vec!["example.com".into()],
            ..ProxyConfig::default()
        });
        let mut w = SipWorker::new(&p, 4, 0);
        let msgs: Vec<Vec<u8>> = (0..2).map(|n| invite(n, 0)).collect();
        let rx = batch(&[(UAC, &msgs[0], None, false), (UAC, &msgs[1], None, false)]);
        let mut io = mem_io();
        w.drive_batch(&mut io, &rx, ticking());
        assert_eq!(io.send_calls(), &[1, 1], "one flush before each hand-off");
        assert!(io.sent().iter().all(|s| s.dst == UAC.parse().unwrap()));
        // No connections here: the hand-offs are counted as not sent.
        assert_eq!(w.metrics().tx_oversize, 2);
    }

    #[test]
    fn oversize_output_and_truncated_input_are_counted() {
        let p = proxy(Mode::Stateless);
        let mut w = SipWorker::new(&p, 4, 0);
        // Fits a receive frame, but with our Via and Record-Route the
        // forwarded copy exceeds a send frame.
        let big = invite(1, TX_FRAME - 250);
        let small = invite(2, 0);
        let rx = batch(&[
            (UAC, &big, Some(realtime_now().0 - 10_000), false),
            (UAC, &small, Some(realtime_now().0 - 10_000), false),
            (UAC, &small, None, true),
        ]);
        let mut io = mem_io();
        w.drive_batch(&mut io, &rx, ticking());
        let m = w.metrics();
        assert_eq!(m.msgs_in, 3);
        assert_eq!(m.rx_truncated, 1, "a truncated datagram is not handled");
        assert_eq!(
            m.tx_oversize, 1,
            "the grown INVITE did not fit a send frame"
        );
        assert_eq!(io.sent().len(), 1, "only the small INVITE went out");
        let inv = m.get(MsgLabel::Invite).unwrap();
        assert_eq!(inv.count, 2);
        let k_rcv = inv.histogram(Latency::KRcv);
        assert_eq!(k_rcv.len(), 2);
        // From the kernel stamp (10 µs before the batch) to processing.
        assert!(k_rcv.min() >= 10_000, "{}", k_rcv.min());
        assert!(k_rcv.max() < 1_000_000_000, "{}", k_rcv.max());
    }

    #[test]
    fn tx_stamps_come_back_to_the_message_type_that_caused_them() {
        let p = proxy(Mode::Stateless);
        let mut w = SipWorker::new(&p, 8, 1);
        let inv = invite(7, 0);
        let mut io = mem_io();
        w.drive_batch(&mut io, &batch(&[(UAC, &inv, None, false)]), ticking());
        let fwd = io.call(0)[0].bytes.clone();
        assert!(fwd.len() > inv.len());
        // The UAS's 180 to the forwarded INVITE (with our Via).
        let r180 = ringing(&fwd);
        w.drive_batch(&mut io, &batch(&[(UAS, &r180, None, false)]), ticking());
        let m = w.metrics();
        assert_eq!(m.k_snd_requested, 2);
        for label in [MsgLabel::Invite, MsgLabel::Response(180)] {
            let k_snd = m.get(label).unwrap().histogram(Latency::KSnd);
            assert_eq!(k_snd.len(), 1, "{label}");
            assert!(k_snd.equivalent(k_snd.max(), K_SND_NS), "{label}");
        }
        assert!(io.sent().iter().all(|s| s.stamp_tag.is_some()));
    }

    #[test]
    fn the_emulated_service_time_is_spent_inside_t_sip() {
        let p = proxy(Mode::Stateless);
        let mut w = SipWorker::new(&p, 8, 0);
        w.emulate_service(Some(ServiceTime::Constant { us: 1500 }), 1);
        let msgs: Vec<Vec<u8>> = (0..2).map(|n| invite(n, 0)).collect();
        let rx = batch(&[(UAC, &msgs[0], None, false), (UAC, &msgs[1], None, false)]);
        let mut io = mem_io();
        let cpu0 = ringway_io::thread::thread_cpu_total();
        w.drive_batch(&mut io, &rx, ringway_io::time::monotonic_now);
        // Lower bounds only: each message burns at least 1.5 ms of this
        // thread's CPU between the two clock readings of its T_sip.
        let used = ringway_io::thread::thread_cpu_total() - cpu0;
        assert!(used >= Duration::from_micros(3000), "{used:?}");
        let t_sip = w
            .metrics()
            .get(MsgLabel::Invite)
            .unwrap()
            .histogram(Latency::TSip);
        assert_eq!(t_sip.len(), 2);
        assert!(t_sip.min() >= 1_490_000, "T_sip {} ns", t_sip.min());
        assert_eq!(io.sent().len(), 2, "both still forwarded");
    }

    #[test]
    fn k_rcv_includes_the_wait_before_processing_and_the_wait_after_is_apart() {
        let p = proxy(Mode::Stateless);
        let mut w = SipWorker::new(&p, 8, 0);
        let msgs: Vec<Vec<u8>> = (0..4).map(|n| invite(n, 0)).collect();
        let mut rx = RxBatch::new(4, 64 * 1024);
        let app_rx = realtime_now();
        for m in &msgs {
            rx.next_frame_mut().unwrap()[..m.len()].copy_from_slice(m);
            rx.commit(RxMeta {
                peer: UAC.parse().unwrap(),
                len: m.len(),
                truncated: false,
                kernel_rx: Some(Nanos(app_rx.0 - 5_000)),
                app_rx,
            });
        }
        let mut io = mem_io();
        // Each handle() takes 200 µs of real time, so a datagram's wait
        // before (in K_rcv, eq. 1) and after its own processing spans the
        // others' (3 × 200 µs). Lower bounds only.
        let mut real = || {
            std::thread::sleep(Duration::from_micros(100));
            ringway_io::time::monotonic_now()
        };
        w.drive_batch(&mut io, &rx, &mut real);
        let inv = w.metrics().get(MsgLabel::Invite).unwrap();
        let wait = inv.histogram(Latency::Wait);
        let k_rcv = inv.histogram(Latency::KRcv);
        assert_eq!(
            wait.len(),
            4,
            "one wait-after sample per forwarded datagram"
        );
        assert_eq!(k_rcv.len(), 4);
        // The last datagram waited before its processing for the three
        // before it (plus 5 µs in the kernel); the first, after it.
        assert!(k_rcv.max() >= 605_000, "K_rcv max {} ns", k_rcv.max());
        assert!(k_rcv.min() >= 5_000, "K_rcv min {} ns", k_rcv.min());
        assert!(wait.max() >= 600_000, "wait max {} ns", wait.max());
        // Each waits for the other three, before or after: K_rcv − 5 µs
        // plus the wait after is ≥ 600 µs on average.
        let both = k_rcv.mean() - 5_000.0 + wait.mean();
        assert!(both >= 600_000.0, "mean wait before + after {both} ns");
        assert!(wait.max() < 1_000_000_000 && k_rcv.max() < 1_000_000_000);
    }

    /// A new INVITE dropped unanswered for waiting past the drop bound is
    /// remembered: its sender's resend (the same Call-ID) is counted apart
    /// from new calls, once, also by another worker of the same pool;
    /// another call's INVITE is a new call.
    #[test]
    fn the_resend_of_a_dropped_invite_is_told_from_a_new_call() {
        use ringway_sip::overload_control::NewCallCounts;
        let p = proxy(Mode::Stateful);
        let pool = Arc::new(OcPool::new(OcControllerConfig::default()));
        let worker = || {
            let mut w = SipWorker::new(&p, 8, 0);
            w.overload_control_pool(Some(pool.clone()));
            w.shed_with(Some(ShedConfig::with_target(200_000_000)));
            w
        };
        let (mut first, mut second) = (worker(), worker());
        let fresh = realtime_now().0;
        let ms = 1_000_000;
        let (dropped, other) = (invite(7, 0), invite(8, 0));
        let mut io = mem_io();
        let rx = batch(&[(UAC, &dropped, Some(fresh - 1000 * ms), false)]);
        first.drive_batch(&mut io, &rx, ticking());
        assert_eq!(first.metrics().overload_queue_drops, 1);
        let counted = |w: &SipWorker<'_>| w.oc.as_ref().map(OcController::counted);
        assert_eq!(
            counted(&first),
            Some(NewCallCounts {
                arrived: 1,
                resent: 0,
                admitted: 0
            })
        );
        // The resend, a copy of it, another call: read by the other worker.
        let rx = batch(&[
            (UAC, &dropped, Some(fresh + 500 * ms), false),
            (UAC, &dropped, Some(fresh + 500 * ms + 1), false),
            (UAC, &other, Some(fresh + 500 * ms + 2), false),
        ]);
        second.drive_batch(&mut io, &rx, ticking());
        let inv = second.metrics().get(MsgLabel::Invite).unwrap();
        assert_eq!(inv.forwarded, 2, "the resend and the other call go on");
        assert_eq!(second.metrics().overload_invite_resends, 1);
        assert_eq!(
            counted(&second),
            Some(NewCallCounts {
                arrived: 1,
                resent: 1,
                admitted: 2
            }),
            "the copy is the resend's retransmission, absorbed"
        );
    }

    #[test]
    fn invites_are_shed_by_the_controller_before_any_state() {
        let p = proxy(Mode::Stateful);
        let mut w = SipWorker::new(&p, 8, 0);
        // A 200 ms target (wide margins: the waits below grow by however
        // long this test takes); every datagram (1 ns of arrival time
        // apart) ends the controller's interval of the one before it, so
        // each update below follows from one delay.
        w.shed_with(Some(ShedConfig {
            interval: 1,
            ..ShedConfig::with_target(200_000_000)
        }));
        let fresh = realtime_now().0;
        let in_dialog = {
            let text = String::from_utf8(invite(3, 0)).unwrap();
            text.replace(
                "To: <sip:bob@example.com>",
                "To: <sip:bob@example.com>;tag=b3",
            )
            .into_bytes()
        };
        let (very_late, late, admitted, after) =
            (invite(5, 0), invite(1, 0), invite(2, 0), invite(6, 0));
        let ms = 1_000_000;
        let rx = batch(&[
            // Received 1 s ago, beyond twice the target: dropped
            // unanswered on a peek (the controller admits all so far).
            (UAC, &very_late, Some(fresh - 1000 * ms), false),
            // The interval of a 1 s standing wait cuts the fraction by a
            // quarter (the most per interval): with credit for 3/4 of a
            // call this new INVITE is refused, 503.
            (UAC, &late, Some(fresh - 300 * ms), false),
            // A 300 ms standing queue, 700 ms shorter than before (the
            // fraction grows): a re-INVITE is not shed anyway.
            (UAC, &in_dialog, Some(fresh - 50 * ms + 1), false),
            // No queue (50 ms < 100 ms): the fraction doubles, the credit
            // passes one call: admitted.
            (UAC, &admitted, Some(fresh - 40 * ms + 2), false),
            // All admitted again.
            (UAC, &after, Some(fresh - 30 * ms + 3), false),
        ]);
        let mut io = mem_io();
        w.drive_batch(&mut io, &rx, ticking());
        let inv = w.metrics().get(MsgLabel::Invite).unwrap();
        assert_eq!(inv.count, 5);
        assert_eq!(
            inv.responded(),
            std::collections::BTreeMap::from([(503, 1)])
        );
        assert_eq!(
            inv.forwarded, 3,
            "the re-INVITE and the two admitted INVITEs go on"
        );
        assert_eq!(
            inv.dropped(),
            std::collections::BTreeMap::from([("overload".to_string(), 1)])
        );
        assert_eq!(w.metrics().overload_queue_drops, 1);
        // The gauge: all admitted again at the end, a quarter cut at worst.
        assert_eq!(
            w.metrics().overload_admitted_ratio(),
            Some((1.0, 0.75)),
            "admitted fraction (now, lowest)"
        );
        // Sent: the 503; 100 Trying and the forwarded INVITE for the
        // three that go on; nothing for the dropped one.
        let sent: Vec<String> = io
            .sent()
            .iter()
            .map(|d| {
                String::from_utf8_lossy(&d.bytes)
                    .lines()
                    .next()
                    .unwrap_or("")
                    .to_string()
            })
            .collect();
        assert_eq!(
            sent.iter().filter(|l| l.starts_with("SIP/2.0 503")).count(),
            1,
            "{sent:?}"
        );
        assert_eq!(
            sent.iter().filter(|l| l.starts_with("INVITE ")).count(),
            3,
            "{sent:?}"
        );
        assert_eq!(sent.len(), 7, "and a 100 Trying for each: {sent:?}");
        let stats = p.stats();
        assert_eq!(stats.overload_queue_sheds, 1);
        // The shed INVITE left no transaction: three were created.
        assert_eq!(stats.transactions_created, 3);
        // Off: nothing is shed however long a datagram waited.
        let mut w = SipWorker::new(&p, 8, 0);
        let late = invite(4, 0);
        let rx = batch(&[(UAC, &late, Some(fresh - 100_000_000), false)]);
        w.drive_batch(&mut io, &rx, ticking());
        assert_eq!(w.metrics().get(MsgLabel::Invite).unwrap().forwarded, 1);
        assert_eq!(p.stats().overload_queue_sheds, 1);
        assert_eq!(w.metrics().overload_admitted_ratio(), None);
    }
}
