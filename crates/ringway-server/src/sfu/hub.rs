//! The JackTrip hub front end: a TCP thread for JackTrip's port handshake
//! and a UDP thread running [`ringway_sfu::jacktrip::Hub`].
//!
//! Handshake (JackTrip 1.7 hub client, `jacktrip -C`): the client connects
//! to the TCP port and sends its UDP port (i32 little-endian) and, usually,
//! a 64-byte client name; the hub answers with its UDP port (i32
//! little-endian) and closes. Every client gets the same UDP port here (one
//! socket; clients are told apart by address). The TCP side is bounded: at
//! most 68 bytes read, within 2 s, one connection at a time. JackTrip's
//! authenticated mode (TLS, username and password: the client sends the
//! value 65536 first) is answered "not required"-style by closing.

use crate::metrics::LatencySummary;
use crate::ServerError;
use ringway_io::monotonic_now;
use ringway_sfu::jacktrip::{Hub, HubConfig, HubStats, Outgoing};
use serde::Serialize;
use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Hub settings.
#[derive(Clone, Debug)]
pub struct HubServerConfig {
    /// TCP address of the handshake (JackTrip's default port is 4464).
    pub listen: SocketAddr,
    /// UDP port for audio (0: any; told to the clients).
    pub udp_port: u16,
    /// The core's settings.
    pub hub: HubConfig,
    /// Stop after this long.
    pub duration_s: Option<f64>,
}

/// Final report.
#[derive(Clone, Debug, Serialize)]
pub struct HubReport {
    /// Counters.
    pub hub: HubStats,
    /// Time a client's audio waited in a pending mix before it was sent
    /// (arrival at the UDP thread → send), per contribution.
    pub mix_wait: LatencySummary,
    /// Time from a datagram's receive to the send of the packets it
    /// completed (the hub's processing), per datagram that sent something.
    pub processing: LatencySummary,
    /// UDP thread CPU seconds; `None` if unknown.
    pub cpu_s: Option<f64>,
    /// Wall seconds.
    pub wall_s: f64,
}

/// A running hub.
pub struct HubServer {
    tcp: SocketAddr,
    udp: SocketAddr,
    stop: Arc<AtomicBool>,
    live: Arc<Mutex<HubStats>>,
    threads: Vec<JoinHandle<()>>,
    udp_thread: Option<JoinHandle<HubReport>>,
}

impl HubServer {
    /// Bind both sockets and start the threads.
    pub fn start(config: HubServerConfig) -> Result<HubServer, ServerError> {
        let hub = Hub::new(config.hub.clone()).map_err(ServerError::Config)?;
        let udp = UdpSocket::bind(SocketAddr::new(config.listen.ip(), config.udp_port)).map_err(
            |source| ServerError::Socket {
                addr: config.listen,
                source,
            },
        )?;
        let udp_addr = udp.local_addr()?;
        let tcp = TcpListener::bind(config.listen).map_err(|source| ServerError::Socket {
            addr: config.listen,
            source,
        })?;
        let tcp_addr = tcp.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let live = Arc::new(Mutex::new(HubStats::default()));
        let (tx, rx) = sync_channel::<(IpAddr, u16)>(64);
        let t_stop = stop.clone();
        let port = udp_addr.port();
        let tcp_thread = std::thread::Builder::new()
            .name("jacktrip-tcp".into())
            .spawn(move || tcp_loop(tcp, port, tx, t_stop))
            .map_err(|source| ServerError::Thread {
                name: "jacktrip-tcp".into(),
                source,
            })?;
        let (u_stop, u_live) = (stop.clone(), live.clone());
        let duration = config.duration_s.map(Duration::from_secs_f64);
        let udp_thread = std::thread::Builder::new()
            .name("jacktrip-hub".into())
            .spawn(move || udp_loop(udp, hub, rx, u_stop, u_live, duration))
            .map_err(|source| ServerError::Thread {
                name: "jacktrip-hub".into(),
                source,
            })?;
        Ok(HubServer {
            tcp: tcp_addr,
            udp: udp_addr,
            stop,
            live,
            threads: vec![tcp_thread],
            udp_thread: Some(udp_thread),
        })
    }

    /// The TCP handshake address.
    pub fn tcp_addr(&self) -> SocketAddr {
        self.tcp
    }
    /// The UDP audio address.
    pub fn udp_addr(&self) -> SocketAddr {
        self.udp
    }
    /// Counters as last published.
    pub fn live(&self) -> HubStats {
        *self.live.lock().unwrap_or_else(PoisonError::into_inner)
    }
    /// The duration is over.
    pub fn is_finished(&self) -> bool {
        self.udp_thread.as_ref().is_none_or(|h| h.is_finished())
    }
    /// Stop and return the report.
    pub fn shutdown(mut self) -> Result<HubReport, ServerError> {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
        self.udp_thread
            .take()
            .expect("joined once")
            .join()
            .map_err(|_| ServerError::Panicked("jacktrip-hub".into()))
    }
}

impl Drop for HubServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
        if let Some(h) = self.udp_thread.take() {
            let _ = h.join();
        }
    }
}

/// JackTrip's handshake, bounded: 4 bytes (port) and an optional 64-byte
/// name, within 2 s; the reply is our UDP port.
fn tcp_loop(l: TcpListener, udp_port: u16, tx: SyncSender<(IpAddr, u16)>, stop: Arc<AtomicBool>) {
    let _ = l.set_nonblocking(true);
    while !stop.load(Ordering::Relaxed) {
        let (mut s, peer) = match l.accept() {
            Ok(x) => x,
            Err(_) => {
                std::thread::sleep(Duration::from_millis(10));
                continue;
            }
        };
        let _ = s.set_nonblocking(false);
        let deadline = Instant::now() + Duration::from_secs(2);
        let mut buf = [0u8; 68];
        let mut n = 0;
        while n < 4 {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() || s.set_read_timeout(Some(left)).is_err() {
                break;
            }
            match s.read(&mut buf[n..]) {
                Ok(0) | Err(_) => break,
                Ok(k) => n += k,
            }
        }
        if n < 4 {
            continue;
        }
        let port = i32::from_le_bytes([buf[0], buf[1], buf[2], buf[3]]);
        if !(1..=65535).contains(&port) {
            continue; // 65536 (authentication) or garbage: closed
        }
        if tx.try_send((peer.ip(), port as u16)).is_err() {
            continue;
        }
        let _ = s.set_write_timeout(Some(Duration::from_secs(1)));
        let _ = s.write_all(&i32::from(udp_port).to_le_bytes());
    }
}

fn udp_loop(
    sock: UdpSocket,
    mut hub: Hub,
    handshakes: Receiver<(IpAddr, u16)>,
    stop: Arc<AtomicBool>,
    live: Arc<Mutex<HubStats>>,
    duration: Option<Duration>,
) -> HubReport {
    let started = Instant::now();
    let cpu0 = ringway_io::thread::thread_cpu_time().ok();
    let mut mix_wait = crate::metrics::latency_histogram();
    let mut processing = crate::metrics::latency_histogram();
    let mut buf = vec![0u8; 65536];
    let mut out: Vec<Outgoing> = Vec::new();
    let mut delays = Vec::new();
    let mut last_pub = Instant::now();
    while !stop.load(Ordering::Relaxed) && duration.is_none_or(|d| started.elapsed() < d) {
        let now = monotonic_now().0;
        while let Ok((ip, port)) = handshakes.try_recv() {
            hub.handshake(now, ip, port);
        }
        let wait = hub
            .next_deadline()
            .map(|d| Duration::from_nanos(d.saturating_sub(now).max(50_000)))
            .unwrap_or(Duration::from_millis(20))
            .min(Duration::from_millis(20));
        let _ = sock.set_read_timeout(Some(wait));
        if let Ok((n, peer)) = sock.recv_from(&mut buf) {
            let t = monotonic_now().0;
            hub.handle(t, peer, &buf[..n], &mut out);
            if !out.is_empty() {
                for o in out.drain(..) {
                    let _ = sock.send_to(&o.data, o.dst);
                }
                let _ = processing.record(monotonic_now().0.saturating_sub(t).max(1));
            }
        }
        let now = monotonic_now().0;
        hub.tick(now, &mut out);
        for o in out.drain(..) {
            let _ = sock.send_to(&o.data, o.dst);
        }
        hub.take_delays(&mut delays);
        for d in delays.drain(..) {
            let _ = mix_wait.record(d.max(1));
        }
        if last_pub.elapsed() >= Duration::from_millis(50) {
            *live.lock().unwrap_or_else(PoisonError::into_inner) = hub.stats();
            last_pub = Instant::now();
        }
    }
    let cpu = match (cpu0, ringway_io::thread::thread_cpu_time().ok()) {
        (Some(a), Some(b)) => Some(b.since(&a).total_ns() as f64 / 1e9),
        _ => None,
    };
    HubReport {
        hub: hub.stats(),
        mix_wait: LatencySummary::of_ns(&mix_wait),
        processing: LatencySummary::of_ns(&processing),
        cpu_s: cpu,
        wall_s: started.elapsed().as_secs_f64(),
    }
}
