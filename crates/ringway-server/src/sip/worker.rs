//! One receive batch through the proxy core: [`SipWorker::drive_batch`],
//! the seam the worker threads run and tests drive with a fake
//! [`BatchIo`].

use super::stats::{Latency, WorkerMetrics};
use super::tcp::Connections;
use ringway_io::time::realtime_now;
use ringway_io::{BatchIo, Nanos, RxBatch, TxBatch, TxStamp};
use ringway_sip::{Action, Hop, MsgLabel, Proxy, ProxyWorker, Transport};
use std::sync::Arc;

/// Bits of a TX stamp tag that carry the sequence number; the message
/// type's slot is above them.
const TAG_SHIFT: u32 = 40;
/// Bytes per send frame: a forwarded message grows by Via/Record-Route.
pub const TX_FRAME: usize = super::RX_FRAME + 2048;

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
    /// call: (slot, wait before processing in ns, end of processing on the
    /// realtime clock).
    waiting: Vec<(usize, u64, Nanos)>,
    /// Shed new INVITEs that waited longer than this (ns) since their
    /// kernel RX stamp.
    shed_after: Option<u64>,
    /// Where messages for connection transports go.
    connections: Option<Arc<Connections>>,
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
            shed_after: None,
            connections: None,
        }
    }

    /// Send what the core addresses to a connection transport through
    /// `connections` (without: such messages are counted as oversize
    /// drops, which a UDP-only server never produces).
    pub fn with_connections(&mut self, connections: Option<Arc<Connections>>) {
        self.connections = connections;
    }

    /// Overload shedding: a datagram that waited longer than `limit` ns
    /// from its kernel RX stamp to its processing is handled with the
    /// core's shedding on ([`ProxyWorker::set_shedding`]: a new INVITE gets
    /// `503` + `Retry-After`, nothing else changes). `None`: never.
    pub fn shed_after(&mut self, limit: Option<u64>) {
        self.shed_after = limit;
    }

    /// What this worker measured so far.
    pub fn metrics(&self) -> &WorkerMetrics {
        &self.metrics
    }

    /// Count a failed receive call.
    pub fn count_rx_error(&mut self) {
        self.metrics.rx_errors += 1;
    }

    /// Run every datagram of `rx` through the core (T_sip timed with
    /// `clock`, K_rcv from the datagram's stamps), send what it produced
    /// with one `send_batch` (earlier only if the send batch fills), sample
    /// K_snd, and refresh the socket counters from `io`. Each datagram's
    /// wait in the batch is stamped per datagram on the realtime clock (the
    /// clock of the receive stamps): from the receive call's return to its
    /// own processing, plus from the end of its processing to the send call
    /// (a datagram with no output waits only before).
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
            metrics: m,
            waiting,
            shed_after,
            connections,
            ..
        } = self;
        tx.clear();
        waiting.clear();
        for d in rx.iter() {
            m.msgs_in += 1;
            if d.meta.truncated {
                m.rx_truncated += 1;
                continue;
            }
            let before = tx.len();
            let mut oversize = 0u64;
            let mut flushed = 0usize;
            let mut send_errors = 0u64;
            let r0 = realtime_now();
            if let Some(limit) = *shed_after {
                // Queueing delay: the kernel's RX stamp (realtime) to now.
                let waited = d.meta.kernel_rx.map(|k| r0.saturating_since(k));
                proxy.set_shedding(waited.is_some_and(|w| w > limit));
            }
            let t0 = clock();
            let from = Hop::udp(d.meta.peer);
            let outcome = proxy.handle_from(t0.0, from, d.data, &mut |hop, bytes| {
                if hop.transport != Transport::Udp {
                    if let Some(connections) = connections.as_deref() {
                        connections.send(hop, bytes, t0.0);
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
            let t1 = clock();
            m.tx_oversize += oversize;
            m.tx_errors += send_errors;
            let slot = outcome.label.slot();
            match d.meta.kernel_rx {
                Some(k) => m
                    .slot_mut(slot)
                    .record(Latency::KRcv, d.meta.app_rx.saturating_since(k)),
                None => m.k_rcv_missing += 1,
            }
            let t_sip = t1.saturating_since(t0);
            let wait_before = r0.saturating_since(d.meta.app_rx);
            if tx.len() > before || flushed > 0 {
                waiting.push((slot, wait_before, Nanos(r0.0 + t_sip)));
            } else {
                m.slot_mut(slot).record(Latency::Wait, wait_before);
            }
            let stats = m.slot_mut(slot);
            stats.count += 1;
            stats.record(Latency::TSip, t_sip);
            match outcome.action {
                Action::Forwarded { copies } => {
                    stats.forwarded += 1;
                    stats.copies += u64::from(copies);
                }
                Action::Responded(code) => stats.count_response(code),
                Action::Absorbed => stats.absorbed += 1,
                Action::Dropped(reason) => stats.count_drop(reason),
                Action::Deferred => stats.deferred += 1,
            }
            // Sample K_snd: every Nth datagram this worker sends gets a TX stamp.
            if *tx_stamp_every > 0 {
                let start = if flushed > 0 { 0 } else { before };
                for i in start..tx.len() {
                    *sent_seq += 1;
                    if sent_seq.is_multiple_of(*tx_stamp_every) {
                        let tag =
                            ((slot as u64) << TAG_SHIFT) | (*sent_seq & ((1 << TAG_SHIFT) - 1));
                        tx.request_stamp(i, tag);
                        m.k_snd_requested += 1;
                    }
                }
            }
        }
        let sent_at = realtime_now();
        for &(slot, before, done) in waiting.iter() {
            m.slot_mut(slot)
                .record(Latency::Wait, before + sent_at.saturating_since(done));
        }
        if !tx.is_empty() {
            if io.send_batch(tx).is_err() {
                m.tx_errors += tx.len() as u64;
            }
            tx.clear();
        }
        self.collect_tx_stamps(io);
        let io_stats = io.stats();
        let m = &mut self.metrics;
        m.msgs_out = io_stats.tx_packets;
        m.tx_errors = m.tx_errors.max(io_stats.tx_errors);
        m.socket_rx_dropped = io_stats.rx_dropped;
    }

    /// Record the K_snd of the TX stamps the kernel returned, polling only
    /// while some are outstanding (each poll is a system call).
    fn collect_tx_stamps(&mut self, io: &mut dyn BatchIo) {
        if self.metrics.k_snd_requested <= self.stamps_seen + io.stats().tx_stamps_lost {
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
    fn oversize_output_and_truncated_input_are_counted() {
        let p = proxy(Mode::Stateless);
        let mut w = SipWorker::new(&p, 4, 0);
        // Fits a receive frame, but with our Via and Record-Route the
        // forwarded copy exceeds a send frame.
        let big = invite(1, TX_FRAME - 250);
        let small = invite(2, 0);
        let rx = batch(&[
            (UAC, &big, Some(40_000), false),
            (UAC, &small, Some(40_000), false),
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
        assert!(
            k_rcv.equivalent(k_rcv.max(), 50_000 - 40_000),
            "app_rx - kernel_rx"
        );
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
    fn every_datagram_gets_a_wait_in_batch_sample_that_grows_along_the_batch() {
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
        // before and after its own processing spans the others' (3 × 200 µs).
        let mut real = || {
            std::thread::sleep(Duration::from_micros(100));
            ringway_io::time::monotonic_now()
        };
        w.drive_batch(&mut io, &rx, &mut real);
        let inv = w.metrics().get(MsgLabel::Invite).unwrap();
        let wait = inv.histogram(Latency::Wait);
        assert_eq!(wait.len(), 4, "one wait sample per datagram");
        assert!(
            wait.min() >= 550_000,
            "each datagram waits for the other three: min {} ns",
            wait.min()
        );
        assert!(wait.max() < 1_000_000_000);
    }

    #[test]
    fn invites_that_waited_too_long_are_shed_before_any_state() {
        let p = proxy(Mode::Stateful);
        let mut w = SipWorker::new(&p, 8, 0);
        w.shed_after(Some(20_000_000));
        let fresh = realtime_now().0;
        let (late, on_time, in_dialog) = (invite(1, 0), invite(2, 0), {
            let text = String::from_utf8(invite(3, 0)).unwrap();
            text.replace(
                "To: <sip:bob@example.com>",
                "To: <sip:bob@example.com>;tag=b3",
            )
            .into_bytes()
        });
        let rx = batch(&[
            // Received by the kernel 100 ms ago (far beyond 20 ms).
            (UAC, &late, Some(fresh - 100_000_000), false),
            (UAC, &on_time, Some(fresh), false),
            (UAC, &in_dialog, Some(fresh - 100_000_000), false),
        ]);
        let mut io = mem_io();
        w.drive_batch(&mut io, &rx, ticking());
        let inv = w.metrics().get(MsgLabel::Invite).unwrap();
        assert_eq!(inv.count, 3);
        assert_eq!(
            inv.responded(),
            std::collections::BTreeMap::from([(503, 1)])
        );
        assert_eq!(
            inv.forwarded, 2,
            "the fresh INVITE and the in-dialog one go on"
        );
        let stats = p.stats();
        assert_eq!(stats.overload_queue_sheds, 1);
        // The shed INVITE left no transaction: two were created (the fresh
        // INVITE and the re-INVITE).
        assert_eq!(stats.transactions_created, 2);
        // Off: nothing is shed however long a datagram waited.
        let mut w = SipWorker::new(&p, 8, 0);
        let late = invite(4, 0);
        let rx = batch(&[(UAC, &late, Some(fresh - 100_000_000), false)]);
        w.drive_batch(&mut io, &rx, ticking());
        assert_eq!(w.metrics().get(MsgLabel::Invite).unwrap().forwarded, 1);
        assert_eq!(p.stats().overload_queue_sheds, 1);
    }
}
