//! [`MemIo`]: a [`BatchIo`] over memory, for the drivers' tests.

use crate::backend::{BackendKind, BatchIo, IoStats, TxProgress};
use crate::batch::{RxBatch, RxMeta, TxBatch, TxStamp};
use crate::time::Nanos;
use std::collections::VecDeque;
use std::io;
use std::net::SocketAddr;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Simulated nanoseconds shared between a test's fake clock and the
/// [`MemIo`] that charges its costs to it.
pub type SimClock = Arc<AtomicU64>;

/// One datagram a [`MemIo`] sent (or queued in its ring).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SentDatagram {
    /// Destination.
    pub dst: SocketAddr,
    /// Bytes.
    pub bytes: Vec<u8>,
    /// The TX stamp tag it asked for, if any.
    pub stamp_tag: Option<u64>,
}

/// An in-memory backend.
///
/// * Receive: [`MemIo::deliver`] queues datagrams that the next
///   `recv_batch` calls hand out (stamped with the clock's time).
/// * Send: every datagram is recorded ([`MemIo::sent`]), grouped per send
///   call ([`MemIo::send_calls`]). A socket-like kind (anything but
///   [`BackendKind::Xdp`]) sends copies with the send call; the xdp kind
///   models a TX ring: `replicate` queues copies at once and `flush` hands
///   at most `take_per_kick` of them to the "kernel" ([`BatchIo::tx_progress`]).
/// * Costs, when a clock is attached ([`MemIo::charging`]): `send_ns` per
///   datagram the kernel takes, `queue_ns` per copy written into the ring,
///   `replicate_call_ns` per `replicate` call.
/// * TX stamps ([`MemIo::with_tx_stamps`]): every datagram sent with a stamp
///   tag gets a stamp `kernel_delay_ns` after its hand-off.
pub struct MemIo {
    kind: BackendKind,
    local: SocketAddr,
    inbound: VecDeque<(SocketAddr, Vec<u8>)>,
    sent: Vec<SentDatagram>,
    send_calls: Vec<usize>,
    clock: Option<SimClock>,
    /// Cost of each datagram the kernel takes (ns, on the attached clock).
    pub send_ns: u64,
    /// Cost of writing one copy into the ring (xdp kind; ns).
    pub queue_ns: u64,
    /// Cost of each `replicate` call (ns).
    pub replicate_call_ns: u64,
    /// Most ring copies the kernel takes per `flush` (xdp kind).
    pub take_per_kick: u64,
    queued: u64,
    handed: u64,
    tx_stamps: Option<(u64, u64)>,
    stamps: Vec<TxStamp>,
    received: u64,
}

impl MemIo {
    /// A backend of `kind` bound to `local`, with no costs and no stamps.
    pub fn new(kind: BackendKind, local: SocketAddr) -> MemIo {
        MemIo {
            kind,
            local,
            inbound: VecDeque::new(),
            sent: Vec::new(),
            send_calls: Vec::new(),
            clock: None,
            send_ns: 0,
            queue_ns: 0,
            replicate_call_ns: 0,
            take_per_kick: u64::MAX,
            queued: 0,
            handed: 0,
            tx_stamps: None,
            stamps: Vec::new(),
            received: 0,
        }
    }

    /// Charge the costs to `clock`.
    pub fn charging(mut self, clock: SimClock) -> MemIo {
        self.clock = Some(clock);
        self
    }

    /// Stamp datagrams that ask for it: the application's hand-off at
    /// `app_tx_base_ns` plus the datagram's index in its send call, the
    /// kernel's stamp `kernel_delay_ns` later.
    pub fn with_tx_stamps(mut self, app_tx_base_ns: u64, kernel_delay_ns: u64) -> MemIo {
        self.tx_stamps = Some((app_tx_base_ns, kernel_delay_ns));
        self
    }

    /// Queue a datagram from `peer` for the next receive.
    pub fn deliver(&mut self, peer: SocketAddr, bytes: &[u8]) {
        self.inbound.push_back((peer, bytes.to_vec()));
    }

    /// Every datagram sent (or queued in the ring), in order.
    pub fn sent(&self) -> &[SentDatagram] {
        &self.sent
    }

    /// Take the datagrams sent so far.
    pub fn take_sent(&mut self) -> Vec<SentDatagram> {
        self.send_calls.clear();
        std::mem::take(&mut self.sent)
    }

    /// How many datagrams each send call carried, in order.
    pub fn send_calls(&self) -> &[usize] {
        &self.send_calls
    }

    /// The datagrams of send call `call`.
    pub fn call(&self, call: usize) -> &[SentDatagram] {
        let start: usize = self.send_calls[..call].iter().sum();
        &self.sent[start..start + self.send_calls[call]]
    }

    fn ring(&self) -> bool {
        self.kind == BackendKind::Xdp
    }

    fn charge(&self, ns: u64) {
        if let Some(clock) = &self.clock {
            clock.fetch_add(ns, Ordering::SeqCst);
        }
    }

    /// The ring's copies are all taken by the kernel now (xdp kind), as
    /// after a long enough wait; nothing is charged.
    pub fn hand_all_to_kernel(&mut self) {
        self.handed = self.queued;
    }

    /// The attached clock's time (ns; 0 without a clock).
    pub fn now(&self) -> u64 {
        self.clock
            .as_ref()
            .map_or(0, |clock| clock.load(Ordering::SeqCst))
    }
}

impl BatchIo for MemIo {
    fn kind(&self) -> BackendKind {
        self.kind
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        Ok(self.local)
    }

    fn raw_fd(&self) -> RawFd {
        -1
    }

    fn recv_batch(&mut self, batch: &mut RxBatch, _timeout: Option<Duration>) -> io::Result<usize> {
        batch.clear();
        let now = Nanos(self.now());
        while batch.free_frames() > 0 {
            let Some((peer, bytes)) = self.inbound.pop_front() else {
                break;
            };
            let Some(frame) = batch.next_frame_mut() else {
                break;
            };
            let len = bytes.len().min(frame.len());
            frame[..len].copy_from_slice(&bytes[..len]);
            batch.commit_received(
                RxMeta {
                    peer,
                    len,
                    truncated: len < bytes.len(),
                    kernel_rx: None,
                    app_rx: now,
                },
                now,
            );
            self.received += 1;
        }
        Ok(batch.len())
    }

    fn send_batch(&mut self, batch: &TxBatch) -> io::Result<usize> {
        self.charge(self.send_ns * batch.len() as u64);
        for (index, entry) in batch.entries().iter().enumerate() {
            if let (Some(tag), Some((base, delay))) = (entry.stamp_tag, self.tx_stamps) {
                let app_tx = Nanos(base + index as u64);
                self.stamps.push(TxStamp {
                    tag,
                    app_tx,
                    kernel_tx: Nanos(app_tx.0 + delay),
                });
            }
            self.sent.push(SentDatagram {
                dst: entry.dst,
                bytes: batch.data(index).to_vec(),
                stamp_tag: entry.stamp_tag,
            });
        }
        self.send_calls.push(batch.len());
        Ok(batch.len())
    }

    fn replicate(
        &mut self,
        _index: Option<usize>,
        data: &[u8],
        dsts: &[SocketAddr],
        tx: &mut TxBatch,
    ) -> io::Result<()> {
        self.charge(self.replicate_call_ns);
        if !self.ring() {
            // As the trait's default: copies go with the next send call.
            return crate::backend::queue_copies(self, data, dsts, tx);
        }
        self.charge(self.queue_ns * dsts.len() as u64);
        self.queued += dsts.len() as u64;
        self.sent.extend(dsts.iter().map(|&dst| SentDatagram {
            dst,
            bytes: data.to_vec(),
            stamp_tag: None,
        }));
        self.send_calls.push(dsts.len());
        Ok(())
    }

    fn flush(&mut self, tx: &mut TxBatch) -> io::Result<()> {
        if !self.ring() {
            if !tx.is_empty() {
                self.send_batch(tx)?;
                tx.clear();
            }
            return Ok(());
        }
        let take = (self.queued - self.handed).min(self.take_per_kick);
        self.charge(self.send_ns * take);
        self.handed += take;
        Ok(())
    }

    fn tx_progress(&self) -> Option<TxProgress> {
        self.ring().then_some(TxProgress {
            queued: self.queued,
            handed: self.handed,
        })
    }

    fn poll_tx_stamps(&mut self, out: &mut Vec<TxStamp>) -> io::Result<usize> {
        let count = self.stamps.len();
        out.append(&mut self.stamps);
        Ok(count)
    }

    fn stats(&self) -> IoStats {
        IoStats {
            rx_packets: self.received,
            tx_packets: self.sent.len() as u64,
            ..IoStats::default()
        }
    }
}
