//! The UDP impairment relay: datagrams from clients to `listen` go to `to`
//! through a forward [`Impairer`]; replies from `to` go back to the client
//! that sent last, through a reverse impairer (no impairment unless asked).

use super::{ImpairConfig, ImpairStats, Impairer};
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

    /// Relay until `duration` passes or `stop` is set; then flush what is queued.
    pub fn run(self, stop: Arc<AtomicBool>) -> std::io::Result<RelayReport> {
        let start = Instant::now();
        let end = start + self.cfg.duration;
        let client: Arc<Mutex<Option<SocketAddr>>> = Arc::new(Mutex::new(None));
        let fwd = {
            let rx = self.listen.try_clone()?;
            let tx = self.upstream.try_clone()?;
            let client = client.clone();
            let stop = stop.clone();
            let cfg = self.cfg.forward;
            std::thread::spawn(move || {
                pump(
                    rx,
                    start,
                    end,
                    &stop,
                    cfg,
                    |from| {
                        *client.lock().expect("client lock") = Some(from);
                        true
                    },
                    |p| tx.send(p).map(|_| ()),
                )
            })
        };
        let rev = {
            let rx = self.upstream.try_clone()?;
            let tx = self.listen.try_clone()?;
            let client2 = client.clone();
            let client3 = client.clone();
            let cfg = self.cfg.reverse.unwrap_or_default();
            std::thread::spawn(move || {
                pump(
                    rx,
                    start,
                    end,
                    &stop,
                    cfg,
                    |_| client2.lock().expect("client lock").is_some(),
                    |p| match *client3.lock().expect("client lock") {
                        Some(c) => tx.send_to(p, c).map(|_| ()),
                        None => Ok(()),
                    },
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

/// Receive on `rx`, impair, send with `send`. Returns (stats, send errors, refused).
fn pump(
    rx: UdpSocket,
    start: Instant,
    end: Instant,
    stop: &AtomicBool,
    cfg: ImpairConfig,
    mut accept: impl FnMut(SocketAddr) -> bool,
    mut send: impl FnMut(&[u8]) -> std::io::Result<()>,
) -> std::io::Result<(ImpairStats, u64, u64)> {
    let mut im: Impairer<Vec<u8>> = Impairer::new(cfg);
    let mut buf = vec![0u8; 65536];
    let mut errors = 0u64;
    let mut refused = 0u64;
    let now_ns = || start.elapsed().as_nanos() as u64;
    loop {
        let now = Instant::now();
        if now >= end || stop.load(Ordering::Relaxed) {
            break;
        }
        let t = now_ns();
        let mut wait = (end - now).min(Duration::from_millis(5));
        if let Some(d) = im.next_deadline() {
            wait = wait.min(Duration::from_nanos(d.saturating_sub(t)));
        }
        rx.set_read_timeout(Some(wait.max(Duration::from_micros(20))))?;
        match rx.recv_from(&mut buf) {
            Ok((n, from)) => {
                if accept(from) {
                    im.push(now_ns(), buf[..n].to_vec());
                } else {
                    refused += 1;
                }
            }
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock
                        | std::io::ErrorKind::TimedOut
                        | std::io::ErrorKind::ConnectionRefused
                ) => {}
            Err(e) => return Err(e),
        }
        im.poll(now_ns(), &mut |p| {
            if send(&p).is_err() {
                errors += 1;
            }
        });
    }
    im.drain(&mut |p| {
        if send(&p).is_err() {
            errors += 1;
        }
    });
    Ok((im.stats(), errors, refused))
}
