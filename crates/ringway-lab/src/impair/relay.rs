//! The UDP impairment relay: datagrams from clients to `listen` go to `to`
//! through a forward [`Impairer`]; replies from `to` go back to the client
//! that sent last, through a reverse impairer (no impairment unless asked).

use super::{ImpairConfig, ImpairStats, Impairer};
use ringway_io::{open_backend, BackendKind, BatchIo, RxBatch, TxBatch};
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
    /// Impairment of client → `to` datagrams.
    pub forward: ImpairConfig,
    /// Impairment of `to` → client replies (`None`: relayed unimpaired).
    pub reverse: Option<ImpairConfig>,
    /// Stop after this long.
    pub duration: Duration,
}

/// What a relay run did.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct RelayReport {
    /// Forward-direction counters.
    pub forward: ImpairStats,
    /// Reverse-direction counters.
    pub reverse: ImpairStats,
    /// Datagrams that could not be sent (socket errors).
    pub send_errors: u64,
    /// Replies that arrived before any client was known.
    pub replies_without_client: u64,
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
    /// Bind the listening socket and the upstream socket (connected to `to`).
    pub fn bind(cfg: RelayConfig) -> std::io::Result<Relay> {
        let listen = UdpSocket::bind(cfg.listen)?;
        let any: SocketAddr = if cfg.to.is_ipv4() {
            "0.0.0.0:0".parse().expect("literal")
        } else {
            "[::]:0".parse().expect("literal")
        };
        let upstream = UdpSocket::bind(any)?;
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
    /// queued. Both directions use the recvmmsg/sendmmsg backend, so the
    /// packets released together (e.g. a burst) leave in one syscall.
    pub fn run(self, stop: Arc<AtomicBool>) -> std::io::Result<RelayReport> {
        let start = Instant::now();
        let end = start + self.cfg.duration;
        let client: Arc<Mutex<Option<SocketAddr>>> = Arc::new(Mutex::new(None));
        let to = self.cfg.to;
        let fwd = {
            let rx = open_backend(BackendKind::Mmsg, self.listen.try_clone()?)?;
            let tx = open_backend(BackendKind::Mmsg, self.upstream.try_clone()?)?;
            let client = client.clone();
            let stop = stop.clone();
            let cfg = self.cfg.forward;
            std::thread::spawn(move || {
                pump(
                    rx,
                    tx,
                    Dir { start, end, cfg },
                    &stop,
                    |from| {
                        *client.lock().expect("client lock") = Some(from);
                        true
                    },
                    || Some(to),
                )
            })
        };
        let rev = {
            let rx = open_backend(BackendKind::Mmsg, self.upstream)?;
            let tx = open_backend(BackendKind::Mmsg, self.listen)?;
            let c2 = client.clone();
            let c3 = client.clone();
            let cfg = self.cfg.reverse.unwrap_or_default();
            std::thread::spawn(move || {
                pump(
                    rx,
                    tx,
                    Dir { start, end, cfg },
                    &stop,
                    |_| c2.lock().expect("client lock").is_some(),
                    || *c3.lock().expect("client lock"),
                )
            })
        };
        let f = fwd
            .join()
            .map_err(|_| std::io::Error::other("forward thread panicked"))??;
        let r = rev
            .join()
            .map_err(|_| std::io::Error::other("reverse thread panicked"))??;
        let c = *client.lock().expect("client lock");
        Ok(RelayReport {
            forward: f.0,
            reverse: r.0,
            send_errors: f.1 + r.1,
            replies_without_client: r.2,
            client: c.map(|a| a.to_string()),
        })
    }
}

struct Dir {
    start: Instant,
    end: Instant,
    cfg: ImpairConfig,
}

/// Receive on `rx`, impair, send on `tx` to `dst()`. Returns (stats, send errors, refused).
fn pump(
    mut rx: Box<dyn BatchIo>,
    mut tx: Box<dyn BatchIo>,
    d: Dir,
    stop: &AtomicBool,
    mut accept: impl FnMut(SocketAddr) -> bool,
    dst: impl Fn() -> Option<SocketAddr>,
) -> std::io::Result<(ImpairStats, u64, u64)> {
    let mut im: Impairer<Vec<u8>> = Impairer::new(d.cfg);
    let mut batch = RxBatch::new(64, 65536);
    let mut out = TxBatch::new(64, 65536);
    let mut errors = 0u64;
    let mut refused = 0u64;
    let now_ns = || d.start.elapsed().as_nanos() as u64;
    let mut send_due = |im: &mut Impairer<Vec<u8>>, now: Option<u64>, errors: &mut u64| {
        let target = dst();
        let mut flush = |out: &mut TxBatch, errors: &mut u64| {
            if !out.is_empty() {
                match tx.send_batch(out) {
                    Ok(n) => *errors += (out.len() - n) as u64,
                    Err(_) => *errors += out.len() as u64,
                }
                out.clear();
            }
        };
        let mut emit = |p: Vec<u8>| match target {
            Some(t) => {
                if out.is_full() {
                    flush(&mut out, errors);
                }
                if out.push(t, &p).is_err() {
                    *errors += 1;
                }
            }
            None => *errors += 1,
        };
        match now {
            Some(n) => im.poll(n, &mut emit),
            None => im.drain(&mut emit),
        }
        flush(&mut out, errors);
    };
    loop {
        let now = Instant::now();
        if now >= d.end || stop.load(Ordering::Relaxed) {
            break;
        }
        let t = now_ns();
        let mut wait = (d.end - now).min(Duration::from_millis(5));
        if let Some(dl) = im.next_deadline() {
            wait = wait.min(Duration::from_nanos(dl.saturating_sub(t)));
        }
        let n = rx.recv_batch(&mut batch, Some(wait.max(Duration::from_micros(20))))?;
        if n > 0 {
            let t = now_ns();
            for dg in batch.iter() {
                if accept(dg.meta.peer) {
                    im.push(t, dg.data.to_vec());
                } else {
                    refused += 1;
                }
            }
        }
        send_due(&mut im, Some(now_ns()), &mut errors);
    }
    send_due(&mut im, None, &mut errors);
    Ok((im.stats(), errors, refused))
}
