//! The SFU's forwarding engine: one receive batch through the sans-IO core
//! ([`ringway_sfu::Sfu`]), optionally sorted by SRPIC first, and the copies
//! handed to the backend.

use super::FRAME;
use crate::metrics::latency_histogram;
use hdrhistogram::Histogram;
use ringway_io::{realtime_now, BatchIo, Nanos, RxBatch, TxBatch};
use ringway_reorder::{Class, Srpic};
use ringway_sfu::{Action, Sfu, SfuStats};
use std::io;
use std::net::SocketAddr;

/// Counters the engine publishes while it runs (for live statistics).
#[derive(Clone, Debug, Default)]
pub struct LiveStats {
    /// Core counters.
    pub sfu: SfuStats,
    /// Bytes received by the engine.
    pub rx_bytes: u64,
    /// Bytes sent by the engine.
    pub tx_bytes: u64,
}

/// Send side of the engine: the send batch and the packets whose last copy it holds.
pub(super) struct Out {
    pub(super) tx: TxBatch,
    /// (application receive stamp, kernel receive stamp) of packets whose
    /// last copy is queued.
    pending: Vec<(Nanos, Option<Nanos>)>,
    pub(super) hist: Histogram<u64>,
    /// Delay from the kernel's software RX stamp (includes socket-queue wait).
    pub(super) khist: Histogram<u64>,
    pub(super) tx_bytes: u64,
}

impl Out {
    /// Hand the queued copies to the kernel, then record the processing
    /// delay of every packet whose last copy was among them.
    fn flush(&mut self, io: &mut dyn BatchIo) -> io::Result<()> {
        if !self.tx.is_empty() {
            io.send_batch(&self.tx)?;
            self.tx_bytes += self.tx.iter().map(|(_, d)| d.len() as u64).sum::<u64>();
            self.tx.clear();
        }
        if !self.pending.is_empty() {
            let done = realtime_now();
            for (t, k) in self.pending.drain(..) {
                let _ = self.hist.record(done.saturating_since(t).max(1));
                if let Some(k) = k {
                    let _ = self.khist.record(done.saturating_since(k).max(1));
                }
            }
        }
        Ok(())
    }

    fn push(&mut self, io: &mut dyn BatchIo, dst: SocketAddr, data: &[u8]) -> io::Result<()> {
        if self.tx.push(dst, data).is_err() {
            self.flush(io)?;
            self.tx.push(dst, data).map_err(|_| {
                io::Error::new(
                    io::ErrorKind::InvalidInput,
                    "datagram larger than a send frame",
                )
            })?;
        }
        Ok(())
    }
}

/// The forwarding engine: one receive batch in, the copies out.
pub(super) struct Engine {
    pub(super) sfu: Sfu,
    pub(super) rx: RxBatch,
    pub(super) out: Out,
    order: Vec<usize>,
    pub(super) srpic: Option<Srpic<usize>>,
    pub(super) per_packet: bool,
    pub(super) rx_bytes: u64,
    pub(super) truncated: u64,
    pub(super) rx_errors: u64,
    pub(super) forwarded: u64,
    pub(super) copies: u64,
}

impl Engine {
    pub(super) fn new(sfu: Sfu, batch: usize, srpic: Option<Srpic<usize>>) -> Engine {
        Engine {
            sfu,
            rx: RxBatch::new(batch, FRAME),
            out: Out {
                tx: TxBatch::new(256, FRAME),
                pending: Vec::with_capacity(batch),
                hist: latency_histogram(),
                khist: latency_histogram(),
                tx_bytes: 0,
            },
            order: Vec::with_capacity(batch),
            srpic,
            per_packet: false,
            rx_bytes: 0,
            truncated: 0,
            rx_errors: 0,
            forwarded: 0,
            copies: 0,
        }
    }

    /// Handle the datagrams of the current receive batch.
    pub(super) fn handle_batch(&mut self, io: &mut dyn BatchIo, now: u64) -> io::Result<()> {
        let n = self.rx.len();
        self.order.clear();
        if let Some(s) = self.srpic.as_mut() {
            let order = &mut self.order;
            let mut out = |i: usize| order.push(i);
            for i in 0..n {
                let d = self.rx.get(i).expect("held");
                s.push(classify(d.meta.peer, d.data), i, &mut out);
            }
            s.flush_all(&mut out);
        } else {
            self.order.extend(0..n);
        }
        let Engine {
            sfu,
            rx,
            out,
            order,
            per_packet,
            rx_bytes,
            truncated,
            forwarded,
            copies,
            ..
        } = self;
        for &i in order.iter() {
            let d = rx.get(i).expect("held");
            *rx_bytes += d.meta.len as u64;
            if d.meta.truncated {
                *truncated += 1;
                continue;
            }
            match sfu.handle(now, d.meta.peer, d.data) {
                Action::Forward { targets, echo, .. } => {
                    for dst in targets.iter().chain(echo.iter()) {
                        out.push(io, *dst, d.data)?;
                    }
                    let count = targets.len() + echo.is_some() as usize;
                    if count > 0 {
                        *forwarded += 1;
                        *copies += count as u64;
                        out.pending.push((d.meta.app_rx, d.meta.kernel_rx));
                        if *per_packet {
                            out.flush(io)?;
                        }
                    }
                }
                Action::Reply { dst, msg } => out.push(io, dst, msg)?,
                Action::Drop(_) => {}
            }
        }
        out.flush(io)
    }
}

/// SRPIC classification of a datagram: RTP flows keyed by (source address,
/// SSRC, payload type), so a sender cannot join another's flow by its SSRC.
fn classify(src: SocketAddr, data: &[u8]) -> Class {
    let addr = match src.ip() {
        std::net::IpAddr::V4(a) => a.to_ipv6_mapped().octets(),
        std::net::IpAddr::V6(a) => a.octets(),
    };
    match ringway_sfu::RtpPacket::new_checked(data) {
        Ok(p) => Class::Flow {
            key: ringway_reorder::FlowKey::from_parts(&[
                &addr,
                &src.port().to_be_bytes(),
                &p.ssrc().to_be_bytes(),
                &[p.payload_type()],
            ])
            .expect("23 bytes fit a flow key"),
            seq: p.seq() as u32,
            len: 1,
        },
        Err(_) => Class::PassThrough,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ringway_io::{BackendKind, IoStats, RxMeta, TxStamp};
    use ringway_reorder::{SeqSpace, SrpicConfig};
    use ringway_sfu::client::{parse_reply, Reply, Requests};
    use ringway_sfu::wire::{write_rtp, RtpHeader};
    use ringway_sfu::SfuConfig;
    use ringway_sfu::{MediaType, RtpPacket, Selector};
    use std::time::Duration;

    /// Records what the engine sends.
    #[derive(Default)]
    struct Capture(Vec<(SocketAddr, Vec<u8>)>);

    impl BatchIo for Capture {
        fn kind(&self) -> BackendKind {
            BackendKind::Mmsg
        }
        fn local_addr(&self) -> std::io::Result<SocketAddr> {
            Ok(SocketAddr::from(([127, 0, 0, 1], 5004)))
        }
        fn raw_fd(&self) -> std::os::fd::RawFd {
            -1
        }
        fn recv_batch(&mut self, _: &mut RxBatch, _: Option<Duration>) -> std::io::Result<usize> {
            Ok(0)
        }
        fn send_batch(&mut self, b: &TxBatch) -> std::io::Result<usize> {
            self.0.extend(b.iter().map(|(d, x)| (d, x.to_vec())));
            Ok(b.len())
        }
        fn poll_tx_stamps(&mut self, _: &mut Vec<TxStamp>) -> std::io::Result<usize> {
            Ok(0)
        }
        fn stats(&self) -> IoStats {
            IoStats::default()
        }
    }

    fn put(e: &mut Engine, peer: SocketAddr, data: &[u8]) {
        let f = e.rx.next_frame_mut().expect("room");
        f[..data.len()].copy_from_slice(data);
        e.rx.commit(RxMeta {
            peer,
            len: data.len(),
            truncated: false,
            kernel_rx: None,
            app_rx: realtime_now(),
        });
    }

    fn rtp(ssrc: u32, m: MediaType, seq: u16) -> Vec<u8> {
        let mut b = vec![0u8; 64];
        let h = RtpHeader {
            payload_type: m.payload_type(),
            marker: false,
            seq,
            timestamp: 0,
            ssrc,
        };
        let n = write_rtp(&mut b, &h, None, 40).unwrap();
        b.truncate(n);
        b
    }

    /// Register a sender and a subscriber, then forward one batch of
    /// out-of-order packets of two streams; returns the subscriber's seqs per type.
    fn forward_shuffled(srpic: bool) -> Vec<(u8, u16)> {
        let sorter = srpic.then(|| {
            Srpic::new(
                SrpicConfig {
                    block_size: 32,
                    ring_size: 64,
                    ..Default::default()
                },
                SeqSpace::U16,
            )
        });
        let sfu = Sfu::new(SfuConfig {
            echo: false,
            ..Default::default()
        });
        let mut e = Engine::new(sfu, 64, sorter);
        let mut io = Capture::default();
        let (tx_addr, rx_addr) = (
            SocketAddr::from(([127, 0, 0, 1], 1000)),
            SocketAddr::from(([127, 0, 0, 1], 2000)),
        );
        let mut reqs = Requests::default();
        let mut sessions = Vec::new();
        for a in [tx_addr, rx_addr] {
            e.rx.clear();
            put(&mut e, a, &reqs.register().1);
            e.handle_batch(&mut io, 0).unwrap();
            let Some(Reply::Ack(_, s)) = parse_reply(&io.0.pop().unwrap().1) else {
                panic!("register failed")
            };
            sessions.push(s);
        }
        e.rx.clear();
        put(
            &mut e,
            rx_addr,
            &reqs.subscribe(sessions[1], &[Selector::ALL], false).1,
        );
        e.handle_batch(&mut io, 0).unwrap();
        io.0.clear();
        e.rx.clear();
        let ssid = sessions[0].ssid;
        for (m, s) in [
            (MediaType::Asq, 3),
            (MediaType::Vsq, 11),
            (MediaType::Asq, 1),
            (MediaType::Asq, 2),
            (MediaType::Vsq, 10),
            (MediaType::Asq, 4),
        ] {
            put(&mut e, tx_addr, &rtp(ssid, m, s));
        }
        e.handle_batch(&mut io, 1).unwrap();
        assert!(io.0.iter().all(|(d, _)| *d == rx_addr));
        io.0.iter()
            .map(|(_, b)| {
                let p = RtpPacket::new_checked(b).unwrap();
                (p.payload_type(), p.seq())
            })
            .collect()
    }

    #[test]
    fn srpic_sorts_each_stream_within_a_batch() {
        let per_type = |v: &[(u8, u16)], pt: u8| -> Vec<u16> {
            v.iter().filter(|x| x.0 == pt).map(|x| x.1).collect()
        };
        let plain = forward_shuffled(false);
        assert_eq!(per_type(&plain, 96), vec![3, 1, 2, 4]);
        assert_eq!(per_type(&plain, 97), vec![11, 10]);
        let sorted = forward_shuffled(true);
        assert_eq!(sorted.len(), 6);
        assert_eq!(per_type(&sorted, 96), vec![1, 2, 3, 4]);
        assert_eq!(per_type(&sorted, 97), vec![10, 11]);
    }
}
