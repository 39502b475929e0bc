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
//!
//! The UDP thread takes datagrams in batches (recvmmsg) and sends what
//! they completed in one sendmmsg, with no allocation per packet. It wakes
//! for every datagram by default (the least delay); with
//! [`HubServerConfig::clocked`] it wakes once per packet period instead
//! and takes everything queued, as a JACK period clock would (fewer
//! wakeups, up to one period more delay). An optional admin API
//! ([`super::hub_admin`]) lists clients with their counters, sets gains
//! and kicks.

use super::hub_admin::{self, HubAdminRequest, HubLive};
use crate::metrics::LatencySummary;
use crate::ServerError;
use ringway_io::{monotonic_now, open_backend, BackendKind, BatchIo, RxBatch, TxBatch};
use ringway_sfu::jacktrip::{Hub, HubConfig, HubStats, Outbox};
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
    /// Wake once per packet period (batching a period's datagrams) instead
    /// of once per datagram.
    pub clocked: bool,
    /// Serve the admin API and `/metrics` on this (loopback) address.
    pub admin_listen: Option<SocketAddr>,
    /// File holding the admin API's bearer token (at least 16 characters
    /// without spaces; trailing whitespace ignored). Required with
    /// `admin_listen`.
    pub admin_token_file: Option<std::path::PathBuf>,
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
    /// The socket backend's counters (receive and send calls, datagrams).
    pub io: ringway_io::IoStats,
    /// Wall seconds.
    pub wall_s: f64,
}

/// A running hub.
pub struct HubServer {
    tcp: SocketAddr,
    udp: SocketAddr,
    admin: Option<SocketAddr>,
    stop: Arc<AtomicBool>,
    live: Arc<Mutex<HubLive>>,
    threads: Vec<JoinHandle<()>>,
    udp_thread: Option<JoinHandle<HubReport>>,
}

/// The admin API's token, read once `admin_listen` and `admin_token_file`
/// are both there (or both absent); the address must be loopback.
fn read_admin_token(config: &HubServerConfig) -> Result<Option<String>, ServerError> {
    Ok(match (config.admin_listen, &config.admin_token_file) {
        (Some(addr), Some(path)) => {
            crate::metrics::http::validate_addr(addr, false)?;
            Some(super::read_admin_token(path)?)
        }
        (Some(_), None) => {
            return Err(ServerError::Config(
                "admin_listen needs admin_token_file".into(),
            ))
        }
        (None, Some(_)) => {
            return Err(ServerError::Config(
                "admin_token_file is only for admin_listen".into(),
            ))
        }
        (None, None) => None,
    })
}

impl HubServer {
    /// Bind both sockets and start the threads.
    pub fn start(config: HubServerConfig) -> Result<HubServer, ServerError> {
        let hub = Hub::new(config.hub.clone()).map_err(ServerError::Config)?;
        let admin_token = read_admin_token(&config)?;
        let udp = UdpSocket::bind(SocketAddr::new(config.listen.ip(), config.udp_port)).map_err(
            |source| ServerError::Socket {
                addr: config.listen,
                source,
            },
        )?;
        let udp_addr = udp.local_addr()?;
        let io = open_backend(BackendKind::Mmsg, udp).map_err(|source| ServerError::Backend {
            backend: "mmsg".into(),
            source,
        })?;
        let tcp = TcpListener::bind(config.listen).map_err(|source| ServerError::Socket {
            addr: config.listen,
            source,
        })?;
        let tcp_addr = tcp.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let live = Arc::new(Mutex::new(HubLive::default()));
        let (admin_tx, admin_rx) = sync_channel::<HubAdminRequest>(hub_admin::QUEUE);
        let mut threads = Vec::new();
        let admin = match (config.admin_listen, admin_token) {
            (Some(addr), Some(token)) => {
                let listener = TcpListener::bind(addr)
                    .map_err(|source| ServerError::Socket { addr, source })?;
                let bound = listener.local_addr()?;
                threads.push(
                    crate::admin_http::serve(
                        "jacktrip-admin",
                        listener,
                        stop.clone(),
                        hub_admin::handler(token, admin_tx, live.clone()),
                    )
                    .map_err(|source| ServerError::Thread {
                        name: "jacktrip-admin".into(),
                        source,
                    })?,
                );
                Some(bound)
            }
            _ => None,
        };
        let (handshake_tx, handshake_rx) = sync_channel::<(IpAddr, u16)>(64);
        let tcp_stop = stop.clone();
        let port = udp_addr.port();
        threads.push(
            std::thread::Builder::new()
                .name("jacktrip-tcp".into())
                .spawn(move || tcp_loop(tcp, port, handshake_tx, tcp_stop))
                .map_err(|source| ServerError::Thread {
                    name: "jacktrip-tcp".into(),
                    source,
                })?,
        );
        let (udp_stop, udp_live) = (stop.clone(), live.clone());
        let duration = config.duration_s.map(Duration::from_secs_f64);
        let clocked = config.clocked;
        let udp_thread = std::thread::Builder::new()
            .name("jacktrip-hub".into())
            .spawn(move || {
                UdpLoop {
                    io,
                    hub,
                    handshakes: handshake_rx,
                    admin: admin_rx,
                    live: udp_live,
                    clocked,
                }
                .run(udp_stop, duration)
            })
            .map_err(|source| ServerError::Thread {
                name: "jacktrip-hub".into(),
                source,
            })?;
        Ok(HubServer {
            tcp: tcp_addr,
            udp: udp_addr,
            admin,
            stop,
            live,
            threads,
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
    /// The admin API's address, when it is served.
    pub fn admin_addr(&self) -> Option<SocketAddr> {
        self.admin
    }
    /// Counters as last published.
    pub fn live(&self) -> HubStats {
        self.live.lock().unwrap_or_else(PoisonError::into_inner).hub
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
        if let Some(handle) = self.udp_thread.take() {
            let _ = handle.join();
        }
    }
}

/// JackTrip's handshake, bounded: 4 bytes (port) and an optional 64-byte
/// name, within 2 s; the reply is our UDP port.
fn tcp_loop(l: TcpListener, udp_port: u16, tx: SyncSender<(IpAddr, u16)>, stop: Arc<AtomicBool>) {
    let _ = l.set_nonblocking(true);
    while !stop.load(Ordering::Relaxed) {
        let (mut stream, peer) = match l.accept() {
            Ok(x) => x,
            Err(_) => {
                // 20 polls a second: a join waits at most 50 ms more, and
                // an idle listener costs next to nothing.
                std::thread::sleep(Duration::from_millis(50));
                continue;
            }
        };
        let _ = stream.set_nonblocking(false);
        let deadline = Instant::now() + Duration::from_secs(2);
        let mut buf = [0u8; 68];
        let mut count = 0;
        while count < 4 {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() || stream.set_read_timeout(Some(left)).is_err() {
                break;
            }
            match stream.read(&mut buf[count..]) {
                Ok(0) | Err(_) => break,
                Ok(k) => count += k,
            }
        }
        if count < 4 {
            continue;
        }
        let port = i32::from_le_bytes([buf[0], buf[1], buf[2], buf[3]]);
        if !(1..=65535).contains(&port) {
            continue; // 65536 (authentication) or garbage: closed
        }
        if tx.try_send((peer.ip(), port as u16)).is_err() {
            continue;
        }
        let _ = stream.set_write_timeout(Some(Duration::from_secs(1)));
        let _ = stream.write_all(&i32::from(udp_port).to_le_bytes());
    }
}

/// Datagrams taken per receive call.
const RX_BATCH: usize = 32;
/// Packets handed to the kernel per send call, at most.
const TX_BATCH: usize = 64;
/// Frame size of both batches: the largest UDP payload.
const FRAME: usize = 65_536;
/// How often the live counters (admin API, `/metrics`) are refreshed.
const PUBLISH_EVERY: Duration = Duration::from_millis(50);

/// The UDP thread's state.
struct UdpLoop {
    io: Box<dyn BatchIo>,
    hub: Hub,
    handshakes: Receiver<(IpAddr, u16)>,
    admin: Receiver<HubAdminRequest>,
    live: Arc<Mutex<HubLive>>,
    clocked: bool,
}

impl UdpLoop {
    fn run(mut self, stop: Arc<AtomicBool>, duration: Option<Duration>) -> HubReport {
        let started = Instant::now();
        let cpu0 = ringway_io::thread::thread_cpu_time().ok();
        let mut mix_wait = crate::metrics::latency_histogram();
        let mut processing = crate::metrics::latency_histogram();
        let mut rx_batch = RxBatch::new(RX_BATCH, FRAME);
        let mut tx_batch = TxBatch::new(TX_BATCH, FRAME);
        let mut out = Outbox::new();
        let mut delays = Vec::new();
        let mut last_pub = Instant::now();
        let mut next_wake = monotonic_now().0;
        while !stop.load(Ordering::Relaxed) && duration.is_none_or(|d| started.elapsed() < d) {
            let now = monotonic_now().0;
            while let Ok((peer_ip, port)) = self.handshakes.try_recv() {
                self.hub.handshake(now, peer_ip, port);
            }
            while let Ok(request) = self.admin.try_recv() {
                let _ = request
                    .reply
                    .try_send(hub_admin::apply(&mut self.hub, now, request.op));
            }
            let received = if self.clocked && self.hub.frames().is_some() {
                // One wake per period: sleep to the next period boundary,
                // then take everything queued.
                let period = self.hub.period_ns();
                next_wake = next_wake.saturating_add(period);
                if next_wake < now {
                    next_wake = now; // fell behind (or the first client): restart
                } else {
                    std::thread::sleep(Duration::from_nanos(next_wake - now));
                }
                let mut first = None;
                loop {
                    let count = self
                        .io
                        .recv_batch(&mut rx_batch, Some(Duration::ZERO))
                        .unwrap_or(0);
                    if count > 0 && first.is_none() {
                        first = Some(rx_batch.received_at(0).0);
                    }
                    self.handle_batch(&rx_batch, &mut out);
                    if count < rx_batch.capacity() {
                        break; // the socket is empty (the batch is too, when n = 0)
                    }
                }
                first
            } else {
                let wait = self
                    .hub
                    .next_deadline()
                    .map(|d| Duration::from_nanos(d.saturating_sub(now).max(50_000)))
                    .unwrap_or(Duration::from_millis(20))
                    .min(Duration::from_millis(20));
                let count = self.io.recv_batch(&mut rx_batch, Some(wait)).unwrap_or(0);
                self.handle_batch(&rx_batch, &mut out);
                (count > 0).then(|| rx_batch.received_at(0).0)
            };
            let now = monotonic_now().0;
            self.hub.tick(now, &mut out);
            if !out.is_empty() {
                self.send(&out, &mut tx_batch);
                out.clear();
                if let Some(first) = received {
                    // From the batch's receive to the send of what it completed.
                    let _ = processing.record(monotonic_now().0.saturating_sub(first).max(1));
                }
            }
            self.hub.take_delays(&mut delays);
            for d in delays.drain(..) {
                let _ = mix_wait.record(d.max(1));
            }
            if last_pub.elapsed() >= PUBLISH_EVERY {
                self.publish(&cpu0);
                last_pub = Instant::now();
            }
        }
        self.publish(&cpu0);
        let live = self
            .live
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        HubReport {
            hub: live.hub,
            mix_wait: LatencySummary::of_ns(&mix_wait),
            processing: LatencySummary::of_ns(&processing),
            cpu_s: live.cpu_s,
            io: live.io,
            wall_s: started.elapsed().as_secs_f64(),
        }
    }

    /// Every datagram of `rx` through the hub, at its receive time.
    fn handle_batch(&mut self, rx: &RxBatch, out: &mut Outbox) {
        for (i, d) in rx.iter().enumerate() {
            if d.meta.truncated {
                // Longer than a frame: not a packet the hub could take.
                self.hub.handle(rx.received_at(i).0, d.meta.peer, &[], out);
                continue;
            }
            self.hub
                .handle(rx.received_at(i).0, d.meta.peer, d.data, out);
        }
    }

    /// Hand `out` to the kernel, [`TX_BATCH`] packets per call.
    fn send(&mut self, out: &Outbox, tx: &mut TxBatch) {
        for (dst, data) in out.iter() {
            if tx.push(dst, data).is_err() {
                let _ = self.io.flush(tx);
                let _ = tx.push(dst, data);
            }
        }
        let _ = self.io.flush(tx);
        tx.clear();
    }

    /// Refresh the counters the admin API and `/metrics` read.
    fn publish(&self, cpu0: &Option<ringway_io::thread::CpuTime>) {
        let cpu = match (cpu0, ringway_io::thread::thread_cpu_time().ok()) {
            (Some(a), Some(b)) => Some(b.since(a).total_ns() as f64 / 1e9),
            _ => None,
        };
        let mut live = self.live.lock().unwrap_or_else(PoisonError::into_inner);
        live.hub = self.hub.stats();
        live.io = self.io.stats();
        live.cpu_s = cpu;
        live.clients = self.hub.clients_info(monotonic_now().0);
    }
}
