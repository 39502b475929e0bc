//! The UDP impairment relay: datagrams from clients to `listen` go to `to`
//! through the forward [`Path`] (and, optionally, the receiver's interrupt
//! coalescing: each block leaves in one `sendmmsg` when its drain ends);
//! replies from `to` go back to the client that sent last through the
//! reverse [`Path`], configured separately.
//!
//! Each datagram is stamped with its own kernel receive time
//! (SO_TIMESTAMPING software stamp; the application receive time when the
//! kernel gave none), not one time per receive batch. Link bytes of a
//! datagram: payload + 28 (IPv4 and UDP headers; 48 for IPv6).

use super::coalesce::{Block, BlockHistogram, CoalesceConfig, Coalescer};
use super::path::{Path, PathConfig, PathStats};
use ringway_io::{open_backend, open_udp, BackendKind, BatchIo, RxBatch, SocketConfig, TxBatch};
use std::net::{SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Relay settings.
#[derive(Clone, Debug)]
pub struct RelayConfig {
    /// Address clients send to.
    pub listen: SocketAddr,
    /// Where datagrams are relayed.
    pub to: SocketAddr,
    /// Client → `to` direction.
    pub forward: PathConfig,
    /// `to` → client direction (the default config: unimpaired).
    pub reverse: PathConfig,
    /// Receiver interrupt coalescing on the forward direction (`None`:
    /// each datagram leaves as soon as it arrives).
    pub coalesce: Option<CoalesceConfig>,
    /// Stop after this long.
    pub duration: Duration,
}

/// What a relay run did.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct RelayReport {
    /// Forward-direction counters.
    pub forward: PathStats,
    /// Reverse-direction counters.
    pub reverse: PathStats,
    /// Forward block sizes (empty without coalescing).
    pub blocks: BlockHistogram,
    /// Forward datagrams that left after a datagram of the same stream
    /// that arrived later (RFC 4737 reordered singletons against the
    /// relay's own arrival order; a stream is an RTP SSRC and payload
    /// type, all other datagrams are one stream).
    pub forward_reordered: u64,
    /// Datagrams that could not be sent (socket errors).
    pub send_errors: u64,
    /// Replies that arrived before any client was known.
    pub replies_without_client: u64,
    /// Datagrams stamped by the application because the kernel gave no stamp.
    pub unstamped: u64,
    /// The last client address seen.
    pub client: Option<String>,
}

/// A relay bound and ready to run (bind first, so callers know the port).
pub struct Relay {
    cfg: RelayConfig,
    listen: UdpSocket,
    upstream: UdpSocket,
}

impl Relay {
    /// Bind the listening socket and the upstream socket (connected to
    /// `to`), both with kernel receive timestamps and 4 MiB buffers (a
    /// burst the emulated link queues must not be lost in the socket).
    pub fn bind(cfg: RelayConfig) -> std::io::Result<Relay> {
        let sock = |bind: SocketAddr| SocketConfig {
            rcvbuf: Some(4 << 20),
            sndbuf: Some(4 << 20),
            ..SocketConfig::new(bind)
        };
        let (listen, _) = open_udp(&sock(cfg.listen))?;
        let any: SocketAddr = if cfg.to.is_ipv4() {
            "0.0.0.0:0".parse().expect("literal")
        } else {
            "[::]:0".parse().expect("literal")
        };
        let (upstream, _) = open_udp(&sock(any))?;
        upstream.connect(cfg.to)?;
        Ok(Relay {
            cfg,
            listen,
            upstream,
        })
    }

    /// The bound listening address.
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listen.local_addr()
    }

    /// Relay until `duration` passes or `stop` is set; then flush what is
    /// queued. Both directions use the recvmmsg/sendmmsg backend.
    pub fn run(self, stop: Arc<AtomicBool>) -> std::io::Result<RelayReport> {
        let start = Instant::now();
        let start_rt = ringway_io::realtime_now().0;
        let end = start + self.cfg.duration;
        let client: Arc<Mutex<Option<SocketAddr>>> = Arc::new(Mutex::new(None));
        let upstream_addr = self.cfg.to;
        let fwd = {
            let listen_io = open_backend(BackendKind::Mmsg, self.listen.try_clone()?)?;
            let upstream_io = open_backend(BackendKind::Mmsg, self.upstream.try_clone()?)?;
            let client = client.clone();
            let stop = stop.clone();
            let dir = Dir {
                start_rt,
                end,
                path: self.cfg.forward,
                coalesce: self.cfg.coalesce,
            };
            std::thread::spawn(move || {
                pump(
                    listen_io,
                    upstream_io,
                    dir,
                    &stop,
                    |from| {
                        *client.lock().expect("client lock") = Some(from);
                        true
                    },
                    || Some(upstream_addr),
                )
            })
        };
        let rev = {
            let listen_io = open_backend(BackendKind::Mmsg, self.upstream)?;
            let upstream_io = open_backend(BackendKind::Mmsg, self.listen)?;
            let client_fwd = client.clone();
            let client_rev = client.clone();
            let dir = Dir {
                start_rt,
                end,
                path: self.cfg.reverse,
                coalesce: None,
            };
            std::thread::spawn(move || {
                pump(
                    listen_io,
                    upstream_io,
                    dir,
                    &stop,
                    |_| client_fwd.lock().expect("client lock").is_some(),
                    || *client_rev.lock().expect("client lock"),
                )
            })
        };
        let forward_thread = fwd
            .join()
            .map_err(|_| std::io::Error::other("forward thread panicked"))??;
        let reverse_thread = rev
            .join()
            .map_err(|_| std::io::Error::other("reverse thread panicked"))??;
        let current = *client.lock().expect("client lock");
        Ok(RelayReport {
            forward: forward_thread.stats,
            reverse: reverse_thread.stats,
            blocks: forward_thread.blocks,
            forward_reordered: forward_thread.reordered,
            send_errors: forward_thread.send_errors + reverse_thread.send_errors,
            replies_without_client: reverse_thread.refused,
            unstamped: forward_thread.unstamped + reverse_thread.unstamped,
            client: current.map(|a| a.to_string()),
        })
    }
}

struct Dir {
    start_rt: u64,
    end: Instant,
    path: PathConfig,
    coalesce: Option<CoalesceConfig>,
}

struct DirReport {
    stats: PathStats,
    blocks: BlockHistogram,
    send_errors: u64,
    refused: u64,
    unstamped: u64,
    reordered: u64,
}

/// A datagram on its way: its arrival index in the direction and its bytes.
type Datagram = (u64, Vec<u8>);

/// The sending end of a direction: its backend and batch, where to
/// (`dst()`, asked per send), and the count of datagrams that leave out of
/// their arrival order within their stream (RTP SSRC and payload type;
/// bounded: streams beyond 4096 are not counted).
struct Sender<D> {
    tx: Box<dyn BatchIo>,
    out: TxBatch,
    dst: D,
    next_expected: std::collections::HashMap<u64, u64>,
    reordered: u64,
}

impl<D: Fn() -> Option<SocketAddr>> Sender<D> {
    fn new(tx: Box<dyn BatchIo>, dst: D) -> Self {
        Sender {
            tx,
            out: TxBatch::new(64, 65536),
            dst,
            next_expected: std::collections::HashMap::new(),
            reordered: 0,
        }
    }

    /// Send `datagrams` in batches; one with nowhere to go, or that the
    /// kernel did not take, counts in `errors`.
    fn send(&mut self, datagrams: impl Iterator<Item = Datagram>, errors: &mut u64) {
        let target = (self.dst)();
        for (i, p) in datagrams {
            self.count_order(i, &p);
            match target {
                Some(to) => {
                    if self.out.is_full() {
                        self.flush(errors);
                    }
                    if self.out.push(to, &p).is_err() {
                        *errors += 1;
                    }
                }
                None => *errors += 1,
            }
        }
        self.flush(errors);
    }

    /// Datagram `i` of its stream leaves: out of order if a later one left
    /// before it.
    fn count_order(&mut self, i: u64, p: &[u8]) {
        let stream = ringway_reorder::classify::rtp_seq(p).map_or(0, |(ssrc, _)| {
            ((ssrc as u64) << 8 | (p[1] & 0x7f) as u64) + 1
        });
        if self.next_expected.len() < 4096 || self.next_expected.contains_key(&stream) {
            let expected = self.next_expected.entry(stream).or_insert(0);
            if i < *expected {
                self.reordered += 1;
            } else {
                *expected = i + 1;
            }
        }
    }

    fn flush(&mut self, errors: &mut u64) {
        if !self.out.is_empty() {
            match self.tx.send_batch(&self.out) {
                Ok(sent) => *errors += (self.out.len() - sent) as u64,
                Err(_) => *errors += self.out.len() as u64,
            }
            self.out.clear();
        }
    }
}

/// Move what is due at `now` (`None`: everything left) through the path
/// and the receiver model, and send it; blocks leave together.
fn step<D: Fn() -> Option<SocketAddr>>(
    path: &mut Path<Datagram>,
    coal: &mut Option<Coalescer<Datagram>>,
    now: Option<u64>,
    sender: &mut Sender<D>,
    errors: &mut u64,
) {
    let mut due = Vec::new();
    match now {
        Some(now) => path.poll(now, &mut |a, p| due.push((a, p))),
        None => path.drain(&mut |a, p| due.push((a, p))),
    }
    let Some(c) = coal else {
        sender.send(due.into_iter().map(|(_, p)| p), errors);
        return;
    };
    let mut blocks: Vec<Block<Datagram>> = Vec::new();
    for (a, p) in due {
        c.push(a, p, &mut |b| blocks.push(b));
    }
    match now {
        Some(now) => {
            let next = path.earliest_arrival().map_or(now, |a| a.min(now));
            c.poll(now, Some(next), &mut |b| blocks.push(b));
        }
        None => c.drain(&mut |b| blocks.push(b)),
    }
    for b in blocks {
        sender.send(b.packets.into_iter(), errors);
    }
}

/// Receive on `rx`, impair, send on `tx` to `dst()`.
fn pump(
    mut rx: Box<dyn BatchIo>,
    tx: Box<dyn BatchIo>,
    d: Dir,
    stop: &AtomicBool,
    mut accept: impl FnMut(SocketAddr) -> bool,
    dst: impl Fn() -> Option<SocketAddr>,
) -> std::io::Result<DirReport> {
    let mut path: Path<Datagram> = Path::new(d.path);
    let mut coal: Option<Coalescer<Datagram>> = d.coalesce.map(Coalescer::new);
    let mut batch = RxBatch::new(64, 65536);
    let mut sender = Sender::new(tx, dst);
    let mut rep = DirReport {
        stats: PathStats::default(),
        blocks: BlockHistogram::default(),
        send_errors: 0,
        refused: 0,
        unstamped: 0,
        reordered: 0,
    };
    // Arrival index of each datagram, to count what leaves out of order.
    let mut index = 0u64;
    let now_ns = || ringway_io::realtime_now().0.saturating_sub(d.start_rt);
    loop {
        let now = Instant::now();
        if now >= d.end || stop.load(Ordering::Relaxed) {
            break;
        }
        let now_nanos = now_ns();
        let mut wait = (d.end - now).min(Duration::from_millis(5));
        let next = [
            path.next_deadline(),
            coal.as_ref().and_then(|c| c.pending_end()).map(|e| e + 1),
        ]
        .into_iter()
        .flatten()
        .min();
        if let Some(deadline) = next {
            wait = wait.min(Duration::from_nanos(deadline.saturating_sub(now_nanos)));
        }
        let received = rx.recv_batch(&mut batch, Some(wait.max(Duration::from_micros(20))))?;
        if received > 0 {
            for dg in batch.iter() {
                if !accept(dg.meta.peer) {
                    rep.refused += 1;
                    continue;
                }
                let stamp = match dg.meta.kernel_rx {
                    Some(k) => k.0,
                    None => {
                        rep.unstamped += 1;
                        dg.meta.app_rx.0
                    }
                };
                let offset = stamp.saturating_sub(d.start_rt);
                let bytes = dg.data.len() + if dg.meta.peer.is_ipv4() { 28 } else { 48 };
                path.push(offset, bytes, (index, dg.data.to_vec()));
                index += 1;
            }
        }
        step(
            &mut path,
            &mut coal,
            Some(now_ns()),
            &mut sender,
            &mut rep.send_errors,
        );
    }
    step(
        &mut path,
        &mut coal,
        None,
        &mut sender,
        &mut rep.send_errors,
    );
    rep.reordered = sender.reordered;
    rep.stats = path.stats();
    rep.blocks = coal.map(|c| c.histogram().clone()).unwrap_or_default();
    Ok(rep)
}
