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

/// Receive on `rx`, impair, send on `tx` to `dst()`.
fn pump(
    mut rx: Box<dyn BatchIo>,
    mut tx: Box<dyn BatchIo>,
    d: Dir,
    stop: &AtomicBool,
    mut accept: impl FnMut(SocketAddr) -> bool,
    dst: impl Fn() -> Option<SocketAddr>,
) -> std::io::Result<DirReport> {
    let mut path: Path<(u64, Vec<u8>)> = Path::new(d.path);
    let mut coal: Option<Coalescer<(u64, Vec<u8>)>> = d.coalesce.map(Coalescer::new);
    let mut batch = RxBatch::new(64, 65536);
    let mut out = TxBatch::new(64, 65536);
    let mut rep = DirReport {
        stats: PathStats::default(),
        blocks: BlockHistogram::default(),
        send_errors: 0,
        refused: 0,
        unstamped: 0,
        reordered: 0,
    };
    // Arrival index of each datagram, to count what leaves out of order
    // per stream (bounded: streams beyond 4096 are not counted).
    let mut index = 0u64;
    let mut next_exp: std::collections::HashMap<u64, u64> = std::collections::HashMap::new();
    let mut reordered = 0u64;
    let now_ns = || ringway_io::realtime_now().0.saturating_sub(d.start_rt);
    let mut send = |pkts: &mut dyn Iterator<Item = (u64, Vec<u8>)>, errors: &mut u64| {
        let target = dst();
        let mut flush = |out: &mut TxBatch, errors: &mut u64| {
            if !out.is_empty() {
                match tx.send_batch(out) {
                    Ok(expected) => *errors += (out.len() - expected) as u64,
                    Err(_) => *errors += out.len() as u64,
                }
                out.clear();
            }
        };
        for (i, p) in pkts {
            let stream = ringway_reorder::classify::rtp_seq(&p).map_or(0, |(ssrc, _)| {
                ((ssrc as u64) << 8 | (p[1] & 0x7f) as u64) + 1
            });
            if next_exp.len() < 4096 || next_exp.contains_key(&stream) {
                let expected = next_exp.entry(stream).or_insert(0);
                if i < *expected {
                    reordered += 1;
                } else {
                    *expected = i + 1;
                }
            }
            match target {
                Some(now_nanos) => {
                    if out.is_full() {
                        flush(&mut out, errors);
                    }
                    if out.push(now_nanos, &p).is_err() {
                        *errors += 1;
                    }
                }
                None => *errors += 1,
            }
        }
        flush(&mut out, errors);
    };
    // Move what is due at `now` through the path (and the receiver model)
    // and send it; blocks leave together.
    let mut step = |path: &mut Path<(u64, Vec<u8>)>,
                    coal: &mut Option<Coalescer<(u64, Vec<u8>)>>,
                    now: Option<u64>,
                    errors: &mut u64| {
        let mut due = Vec::new();
        match now {
            Some(expected) => path.poll(expected, &mut |a, p| due.push((a, p))),
            None => path.drain(&mut |a, p| due.push((a, p))),
        }
        match coal {
            None => send(&mut due.into_iter().map(|(_, p)| p), errors),
            Some(c) => {
                let mut blocks: Vec<Block<(u64, Vec<u8>)>> = Vec::new();
                for (a, p) in due {
                    c.push(a, p, &mut |b| blocks.push(b));
                }
                match now {
                    Some(expected) => {
                        let next = path
                            .earliest_arrival()
                            .map_or(expected, |a| a.min(expected));
                        c.poll(expected, Some(next), &mut |b| blocks.push(b));
                    }
                    None => c.drain(&mut |b| blocks.push(b)),
                }
                for b in blocks {
                    send(&mut b.packets.into_iter(), errors);
                }
            }
        }
    };
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
        let expected = rx.recv_batch(&mut batch, Some(wait.max(Duration::from_micros(20))))?;
        if expected > 0 {
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
        step(&mut path, &mut coal, Some(now_ns()), &mut rep.send_errors);
    }
    step(&mut path, &mut coal, None, &mut rep.send_errors);
    rep.reordered = reordered;
    rep.stats = path.stats();
    rep.blocks = coal.map(|c| c.histogram().clone()).unwrap_or_default();
    Ok(rep)
}
