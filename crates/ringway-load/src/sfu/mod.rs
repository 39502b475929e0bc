//! The SFU's load clients: N registered RTP sources in one process, each
//! with its own socket and SSID (optionally each inside its own network
//! namespace host), a sender thread pacing RTP, a receiver thread counting
//! loss, reordering, echo RTT and one-way delay (with AF_XDP one thread
//! does both: [`SfuLoadConfig::xdp_receive`]), and the control traffic
//! (register with the SFU's cookie exchange, subscribe, keepalive, leave)
//! on the calling thread.
//!
//! The sources are desynchronised as independent machines are: each has its
//! own phase within the packet interval (drawn from a seeded generator), so
//! the SFU sees each client's three packets back to back at the client's
//! own moment, not every client's packets in one burst.

mod rx_stats;
mod schedule;

pub use rx_stats::{RxStats, StreamSummary};
use schedule::TickSchedule;
pub use schedule::{phases, tick_lateness, LATE_TICK};

use anyhow::{bail, Context};
use ringway_io::netns::Host;
use ringway_io::thread::{CpuTime, Policy};
use ringway_io::{
    open_backend, open_udp, open_xdp_with_socket, realtime_now, BackendKind, BatchIo, IoStats,
    RxBatch, SocketConfig, TxBatch, XdpConfig,
};
use ringway_server::host::{self, transient};
use ringway_server::metrics::LatencySummary;
use ringway_server::sfu::FRAME;
use ringway_sfu::client::{parse_reply, Reply, Requests, Session, StreamGen};
use ringway_sfu::wire::MsgType;
use ringway_sfu::{MediaType, Selector};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// What a load run does.
#[derive(Clone, Debug)]
pub struct SfuLoadConfig {
    /// SFU address.
    pub server: SocketAddr,
    /// Sources (clients), each with its own socket and SSID.
    pub sources: usize,
    /// Media types each source sends.
    pub types: Vec<MediaType>,
    /// Interval between packets of one stream (ms).
    pub interval_ms: f64,
    /// Packet sizes (bytes) per type, in `types` order (the last one repeats).
    pub sizes: Vec<usize>,
    /// What every source subscribes to.
    pub subscribe: Vec<Selector>,
    /// Seconds of sending.
    pub duration_s: f64,
    /// Seconds to keep receiving after sending stops.
    pub drain_s: f64,
    /// I/O backend of the sender and receiver threads (not used with
    /// `xdp_receive`).
    pub backend: BackendKind,
    /// Local IP to bind (default: the server's IP when loopback, else any).
    pub bind: Option<IpAddr>,
    /// Send keepalives every second.
    pub keepalive: bool,
    /// Send LEAVE at the end.
    pub leave: bool,
    /// Send media (otherwise only register and subscribe).
    pub send: bool,
    /// Pin the receiver and sender threads to these CPUs.
    pub cpus: Option<Vec<usize>>,
    /// Scheduling policy of the sender thread; `None`: inherited. A
    /// real-time policy (`Fifo`) keeps the receive work the load itself
    /// causes on the load's CPUs (the receiver thread, softirq threads) from
    /// delaying its ticks; the receiver keeps the fair policy, and kernel
    /// stamps keep its measurements independent of when it runs. With
    /// `xdp_receive` the one thread that sends and reads the rings takes
    /// it (the reading between two ticks is short, and a tick it delays
    /// is counted late like any other).
    pub sender_policy: Option<Policy>,
    /// Open source i's socket inside named network namespace i (mod the
    /// list length): one namespace host per client.
    pub in_netns: Vec<String>,
    /// Receive and send through AF_XDP: source i on interface and address
    /// `xdp_receive[i]` of its namespace host (`in_netns[i]`), instead of
    /// through its socket; one thread then owns every source's rings and
    /// both sends and receives. Empty: the sockets.
    pub xdp_receive: Vec<(String, IpAddr)>,
    /// Give each source its own phase within the interval (independent
    /// clients); `false`: every source sends at the same tick (one burst).
    pub desync: bool,
    /// Seed of the phases.
    pub seed: u64,
}

impl SfuLoadConfig {
    /// Defaults of the command line (4 ms per stream, ASQ/VSQ/VHQ of 80,
    /// 160 and 320 bytes, subscribe to all, 10 s, mmsg).
    pub fn new(server: SocketAddr, sources: usize) -> SfuLoadConfig {
        SfuLoadConfig {
            server,
            sources,
            types: vec![MediaType::Asq, MediaType::Vsq, MediaType::Vhq],
            interval_ms: 4.0,
            sizes: vec![80, 160, 320],
            subscribe: vec![Selector::ALL],
            duration_s: 10.0,
            drain_s: 0.5,
            backend: BackendKind::Mmsg,
            bind: None,
            keepalive: true,
            leave: true,
            send: true,
            cpus: None,
            sender_policy: None,
            in_netns: Vec::new(),
            xdp_receive: Vec::new(),
            desync: true,
            seed: 1,
        }
    }
}

/// Parse a subscription list: `all`, `none`, or `SSID:TYPE` / `SSID` /
/// `all:TYPE` items separated by commas.
pub fn parse_subscribe(s: &str) -> anyhow::Result<Vec<Selector>> {
    if s.eq_ignore_ascii_case("none") || s.is_empty() {
        return Ok(Vec::new());
    }
    s.split(',')
        .map(|x| x.trim().parse::<Selector>().map_err(|e| anyhow::anyhow!(e)))
        .collect()
}

/// Final report of a load run.
#[derive(Clone, Debug, serde::Serialize)]
pub struct ClientReport {
    /// SSIDs of the sources in this process.
    pub ssids: Vec<u32>,
    /// Seconds of sending.
    pub duration_s: f64,
    /// Media packets sent.
    pub tx_packets: u64,
    /// Media bytes sent.
    pub tx_bytes: u64,
    /// Datagrams received (media, echoes, control replies).
    pub rx_packets: u64,
    /// Bytes received.
    pub rx_bytes: u64,
    /// Send rate (Mbit/s).
    pub out_mbps: f64,
    /// Receive rate (Mbit/s).
    pub in_mbps: f64,
    /// Media packets received from other sources.
    pub media_packets: u64,
    /// Of those: lost (expected − received, per stream and receiver).
    pub lost: u64,
    /// Of those: late / out-of-order by RTP sequence number.
    pub reordered: u64,
    /// Reordered / received media packets.
    pub reordered_ratio: f64,
    /// Echoes of own packets received.
    pub echoes: u64,
    /// RTT from the echo.
    pub rtt: LatencySummary,
    /// One-way delay of other sources' packets (same-host clocks).
    pub owd: LatencySummary,
    /// Control replies received after setup (keepalive/leave ACKs, errors).
    pub control: u64,
    /// ERROR replies among them.
    pub control_errors: u64,
    /// Datagrams that were neither RTP nor control.
    pub malformed: u64,
    /// The receive backends that ran (`socket`, `mmsg`, `uring`, `xdp`;
    /// `mixed` if they differ).
    pub rx_backend: String,
    /// AF_XDP receive: datagrams that came through the companion sockets
    /// instead of the rings (`None`: not AF_XDP).
    pub rx_via_kernel: Option<u64>,
    /// AF_XDP receive: frames dropped as invalid or with a bad UDP
    /// checksum (`None`: not AF_XDP; the kernel drops those silently).
    pub rx_rejected: Option<u64>,
    /// AF_XDP receive: frames the kernel dropped at the clients' sockets
    /// (no fill-ring frame, RX ring full: `XDP_STATISTICS`), which
    /// otherwise show only as loss; `None`: not AF_XDP.
    pub rx_ring_drops: Option<u64>,
    /// The backends the media went out through (`mmsg`, `xdp`, …; `mixed`
    /// if they differ).
    pub tx_backend: String,
    /// AF_XDP sends: media datagrams that went through the companion
    /// sockets instead of the TX rings (no next hop in the ring's tables,
    /// too long); `None`: not AF_XDP.
    pub tx_via_kernel: Option<u64>,
    /// AF_XDP sends: media datagrams dropped on the way out (TX ring full
    /// after the bounded wait, send errors), which otherwise show only as
    /// loss; `None`: not AF_XDP.
    pub tx_dropped: Option<u64>,
    /// Per received stream (SSRC, type) counters, summed over receivers.
    pub received: Vec<StreamSummary>,
    /// Sender ticks (one per source per interval) made.
    pub ticks: u64,
    /// Sender ticks that started more than 1 ms late.
    pub late_ticks: u64,
    /// CPU time of the sender and receiver threads (`user_s`, `sys_s`);
    /// `None` (null) when the kernel did not tell it.
    #[serde(with = "ringway_server::host::cpu_seconds::option")]
    pub cpu: Option<CpuTime>,
    /// Placement lines (CPUs, the sender's policy) the kernel refused, per
    /// thread (empty: all applied, or nothing asked).
    pub placement_refused: Vec<String>,
    /// The sender thread's scheduling policy as the kernel reports it at
    /// its end (`fifo:10`, `other`; `None`: nothing was sent, or it could
    /// not be read).
    pub sender_policy: Option<String>,
}

/// Counters of a running load, for live statistics.
#[derive(Clone, Copy, Debug, Default)]
pub struct LiveLoad {
    /// Seconds since sending started.
    pub elapsed_s: f64,
    /// Media packets / bytes sent so far.
    pub tx_packets: u64,
    /// See `tx_packets`.
    pub tx_bytes: u64,
    /// Datagrams / bytes received so far.
    pub rx_packets: u64,
    /// See `rx_packets`.
    pub rx_bytes: u64,
    /// Media lost and reordered so far (refreshed twice a second).
    pub lost: u64,
    /// See `lost`.
    pub reordered: u64,
}

/// Send `msg` and wait for the matching reply (retransmitting); the socket must be blocking.
fn request(sock: &UdpSocket, server: SocketAddr, id: u32, msg: &[u8]) -> anyhow::Result<Reply> {
    let mut buf = [0u8; FRAME];
    for _ in 0..10 {
        sock.send_to(msg, server)?;
        let until = Instant::now() + Duration::from_millis(300);
        while Instant::now() < until {
            match sock.recv_from(&mut buf) {
                Ok((n, from)) if from == server => match parse_reply(&buf[..n]) {
                    Some(
                        r @ (Reply::Ack(rid, _)
                        | Reply::Error(rid, _, _)
                        | Reply::Challenge(rid, _)),
                    ) if rid == id => return Ok(r),
                    _ => {} // media or a stale reply
                },
                Ok(_) => {}
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) => {}
                Err(e) => return Err(e.into()),
            }
        }
    }
    bail!("no reply from {server}")
}

/// REGISTER, then REGISTER again with the CHALLENGE's cookie (the SFU's
/// return-routability check); the session of the ACK.
pub fn register(
    sock: &UdpSocket,
    server: SocketAddr,
    requests: &mut Requests,
) -> anyhow::Result<Session> {
    let (id, msg) = requests.register();
    let mut reply = request(sock, server, id, &msg)?;
    for _ in 0..3 {
        match reply {
            Reply::Ack(_, s) => return Ok(s),
            Reply::Error(_, code, _) => bail!("REGISTER refused: {code:?}"),
            Reply::Challenge(_, cookie) => {
                let (id, msg) = requests.register_with(&cookie);
                reply = request(sock, server, id, &msg)?;
            }
        }
    }
    bail!("REGISTER: the SFU kept answering with CHALLENGEs")
}

/// One registered source.
struct Source {
    sock: UdpSocket,
    session: Session,
    requests: Requests,
}

/// Open source `i`'s socket (inside its namespace host, if any).
fn open_source_socket(c: &SfuLoadConfig, i: usize) -> anyhow::Result<UdpSocket> {
    let xdp_ip = (!c.xdp_receive.is_empty()).then(|| c.xdp_receive[i % c.xdp_receive.len()].1);
    let bind_ip = c.bind.or(xdp_ip).unwrap_or(if c.server.ip().is_loopback() {
        c.server.ip()
    } else if c.server.is_ipv4() {
        IpAddr::V4(Ipv4Addr::UNSPECIFIED)
    } else {
        IpAddr::V6(Ipv6Addr::UNSPECIFIED)
    });
    let mut cfg = SocketConfig::new(SocketAddr::new(bind_ip, 0));
    cfg.rcvbuf = Some(4 << 20);
    cfg.sndbuf = Some(1 << 20);
    if c.in_netns.is_empty() {
        return Ok(open_udp(&cfg).context("opening client socket")?.0);
    }
    // A socket stays in the namespace it was created in.
    let host = client_host(c, i);
    let (sock, _) = host
        .run(move || open_udp(&cfg))
        .with_context(|| format!("entering netns {}", host.netns))?
        .with_context(|| format!("opening client socket in netns {}", host.netns))?;
    Ok(sock)
}

/// Source `i`'s namespace host (`c.in_netns` must not be empty).
fn client_host(c: &SfuLoadConfig, i: usize) -> Host {
    let netns = c.in_netns[i % c.in_netns.len()].clone();
    Host {
        name: netns.clone(),
        netns,
        ifaces: Vec::new(),
        ifaces6: Vec::new(),
    }
}

/// UMEM frames of a client's AF_XDP backend (half on the fill ring, the
/// rest for the TX ring): 512 fill frames hold far more than arrives in
/// the client thread's longest pause between two looks at the RX ring.
const XDP_RX_FRAMES: u32 = 1024;

/// Source `i`'s AF_XDP receive backend, opened inside its namespace host
/// on the address and port it registered from: the registration socket
/// is closed first and the backend's companion socket (bound to the same
/// address and port) takes its place for the control messages; the media
/// go out through the backend's TX ring. Nothing is sent to the source
/// between the two (the senders have not started).
fn swap_to_xdp(
    c: &SfuLoadConfig,
    i: usize,
    source: &mut Source,
) -> anyhow::Result<Box<dyn BatchIo>> {
    let (ifname, _) = &c.xdp_receive[i % c.xdp_receive.len()];
    let local = source.sock.local_addr()?;
    let host = client_host(c, i);
    let stand_in = host
        .run(move || UdpSocket::bind(SocketAddr::new(local.ip(), 0)))
        .with_context(|| format!("entering netns {}", host.netns))??;
    drop(std::mem::replace(&mut source.sock, stand_in));
    let cfg = XdpConfig {
        frames: XDP_RX_FRAMES,
        ..XdpConfig::new(ifname, local)
    };
    let (backend, companion) = host
        .run(move || open_xdp_with_socket(cfg))
        .with_context(|| format!("entering netns {}", host.netns))?
        .with_context(|| format!("AF_XDP receive on {ifname} in netns {}", host.netns))?;
    source.sock = companion;
    Ok(backend)
}

/// Register every source, then subscribe each to `c.subscribe`.
fn register_sources(c: &SfuLoadConfig) -> anyhow::Result<Vec<Source>> {
    let mut out = Vec::with_capacity(c.sources);
    for i in 0..c.sources {
        let sock = open_source_socket(c, i)?;
        sock.set_read_timeout(Some(Duration::from_millis(50)))?;
        let mut requests = Requests::default();
        let session = register(&sock, c.server, &mut requests)?;
        out.push(Source {
            sock,
            session,
            requests,
        });
    }
    for s in out.iter_mut() {
        for chunk in c.subscribe.chunks(ringway_sfu::wire::MAX_SELECTORS) {
            let (id, msg) = s.requests.subscribe(s.session, chunk, false);
            match request(&s.sock, c.server, id, &msg)? {
                Reply::Ack(..) => {}
                r => bail!("SUBSCRIBE refused: {r:?}"),
            }
        }
    }
    Ok(out)
}

/// Counters the threads share with the controlling thread.
#[derive(Default)]
struct Shared {
    rx_packets: AtomicU64,
    rx_bytes: AtomicU64,
    tx_packets: AtomicU64,
    tx_bytes: AtomicU64,
    lost: AtomicU64,
    reordered: AtomicU64,
    stop_rx: AtomicBool,
    stop_tx: AtomicBool,
}

impl Shared {
    fn live(&self, elapsed_s: f64) -> LiveLoad {
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        LiveLoad {
            elapsed_s,
            tx_packets: get(&self.tx_packets),
            tx_bytes: get(&self.tx_bytes),
            rx_packets: get(&self.rx_packets),
            rx_bytes: get(&self.rx_bytes),
            lost: get(&self.lost),
            reordered: get(&self.reordered),
        }
    }
}

/// What the receiver thread reports.
struct ReceiverEnd {
    /// Statistics per source.
    stats: Vec<RxStats>,
    /// Its CPU time.
    cpu: Option<CpuTime>,
    /// The placement lines the kernel refused.
    refused: Vec<String>,
    /// The receive backends' counters (their sends too, when they sent).
    io: IoStats,
    /// The sender's end, when this thread sent too (AF_XDP).
    sender: Option<SenderEnd>,
}

impl ReceiverEnd {
    /// The calling (receiving) thread's end: its CPU time now, the
    /// backends' counters and each source's statistics.
    fn at_end(
        sockets: Vec<Receiving>,
        refused: Vec<String>,
        sender: Option<SenderEnd>,
    ) -> ReceiverEnd {
        let cpu = host::thread_cpu_time().ok();
        let io = io_totals(&sockets);
        let stats = sockets.into_iter().map(|(_, s)| s).collect();
        ReceiverEnd {
            stats,
            cpu,
            refused,
            io,
            sender,
        }
    }
}

/// Pin the calling thread to `cpus` and give it `policy` (each if any);
/// the lines the kernel refused.
fn pin(thread: &str, cpus: Option<Vec<usize>>, policy: Option<Policy>) -> Vec<String> {
    if cpus.is_none() && policy.is_none() {
        return Vec::new();
    }
    let placement = ringway_io::thread::Placement {
        cpus,
        policy,
        ..Default::default()
    };
    placement
        .apply()
        .into_iter()
        .filter(|i| !i.result.is_applied())
        .map(|i| format!("{thread}: {} {} -> {}", i.what, i.requested, i.result))
        .inspect(|line| log::info!("sfu load: placement {line}"))
        .collect()
}

/// A source's receive backend and what it counts.
type Receiving = (Box<dyn BatchIo>, RxStats);

/// A source's send backend and its media streams, one per type.
type Sending = (Box<dyn BatchIo>, Vec<StreamGen>);

/// The sources' backends.
enum Backends {
    /// A receive and a send backend per source (sockets): a receiver
    /// thread and a sender thread.
    Apart(Vec<Receiving>, Vec<Sending>),
    /// One backend per source that receives and sends (AF_XDP: one
    /// socket's RX and TX rings), with the source's media streams: one
    /// thread owns them all ([`spawn_client_io`]).
    Shared(Vec<Receiving>, Vec<Vec<StreamGen>>),
}

/// The media streams of `session`, one per type.
fn streams_of(c: &SfuLoadConfig, session: &Session, interval_ns: u64) -> Vec<StreamGen> {
    c.types
        .iter()
        .enumerate()
        .map(|(i, msg)| {
            let size = c.sizes[i.min(c.sizes.len() - 1)];
            StreamGen::new(
                session.ssid,
                *msg,
                size,
                interval_ns,
                (session.ssid as u16) ^ 0x1234,
            )
        })
        .collect()
}

/// The sources' backends; each source's socket is then made non-blocking
/// (it carries the control messages). Sockets: a receive and a send
/// backend on each. With `c.xdp_receive`: an AF_XDP backend per source
/// ([`swap_to_xdp`]) that receives through its RX ring and sends through
/// its TX ring; the control messages go through its companion socket.
fn open_backends(
    c: &SfuLoadConfig,
    sources: &mut [Source],
    interval_ns: u64,
) -> anyhow::Result<Backends> {
    anyhow::ensure!(
        c.xdp_receive.is_empty() || c.xdp_receive.len() == c.in_netns.len(),
        "AF_XDP needs one interface per source namespace host ({} interfaces, {} namespaces)",
        c.xdp_receive.len(),
        c.in_netns.len()
    );
    let mut receivers = Vec::new();
    let mut senders = Vec::new();
    let mut streams = Vec::new();
    for (i, s) in sources.iter_mut().enumerate() {
        if c.xdp_receive.is_empty() {
            receivers.push((
                open_backend(c.backend, s.sock.try_clone()?)?,
                RxStats::new(vec![s.session.ssid]),
            ));
            senders.push((
                open_backend(c.backend, s.sock.try_clone()?)?,
                streams_of(c, &s.session, interval_ns),
            ));
        } else {
            receivers.push((swap_to_xdp(c, i, s)?, RxStats::new(vec![s.session.ssid])));
            streams.push(streams_of(c, &s.session, interval_ns));
        }
        s.sock.set_nonblocking(true)?;
    }
    Ok(if c.xdp_receive.is_empty() {
        Backends::Apart(receivers, senders)
    } else {
        Backends::Shared(receivers, streams)
    })
}

/// Send a control message of `kind` (keepalive, leave) from every source
/// to `server` (best effort).
fn tell_all(sources: &mut [Source], kind: MsgType, server: SocketAddr) {
    for s in sources.iter_mut() {
        let (_, msg) = s.requests.simple(kind, s.session);
        let _ = s.sock.send_to(&msg, server);
    }
}

/// How long the receiver lets datagrams gather after a pass over the
/// sockets that found some. They carry kernel receive stamps, so waiting
/// costs the measurement nothing, and each socket is then read once per
/// pass for several datagrams instead of once per datagram: the testbed's
/// clients must cost less than the SFU they load. A datagram without a
/// kernel stamp (the user-space pickup time stands in) turns it off.
const RX_GATHER: Duration = Duration::from_micros(500);
/// The longest wait for any socket to become readable.
const RX_WAIT: Duration = Duration::from_millis(5);
/// The pause between two passes that found nothing over backends without
/// readiness (io_uring), and the AF_XDP client thread's pause while
/// datagrams come without the XDP program's stamp.
const RING_PAUSE: Duration = Duration::from_micros(200);
/// The AF_XDP client thread's longest pause between two looks at its RX
/// rings while every datagram carries the XDP program's receive stamp
/// (reading later then costs the measurement nothing; 512 fill-ring
/// frames per source last 18 ms at 28 500 datagrams/s); without stamps,
/// [`RING_PAUSE`].
const RING_GATHER: Duration = Duration::from_millis(1);

/// Which of `fds` are readable within `wait` (bit `i`: `fds[i]`). More
/// than 64, or a failed wait: all of them (each is then read without
/// waiting).
fn readable(fds: &[std::os::fd::RawFd], wait: Duration) -> u64 {
    if fds.len() > 64 {
        return u64::MAX;
    }
    ringway_io::tun::wait_readable(fds, Some(wait)).unwrap_or(u64::MAX)
}

/// One pass over the receive backends: those marked in `ready` (bit `i`:
/// backend `i`; beyond 64: all) are read once, each waiting up to `wait`,
/// and what they hold is recorded. Returns (datagrams, whether every one
/// carried a kernel receive stamp).
fn receive_pass(
    sockets: &mut [Receiving],
    batch: &mut RxBatch,
    shared: &Shared,
    ready: u64,
    wait: Duration,
) -> anyhow::Result<(usize, bool)> {
    let mut got = 0;
    let mut stamped = true;
    for (i, (io, st)) in sockets.iter_mut().enumerate() {
        if i < 64 && (ready >> i) & 1 == 0 {
            continue;
        }
        let received = match io.recv_batch(batch, Some(wait)) {
            Ok(received) => received,
            Err(e) if transient(&e) => 0,
            Err(e) => return Err(e.into()),
        };
        got += received;
        let mut bytes = 0;
        for d in batch.iter() {
            stamped &= d.meta.kernel_rx.is_some();
            let stamp = d.meta.kernel_rx.unwrap_or(d.meta.app_rx).0;
            st.record(stamp, d.data);
            bytes += d.data.len() as u64;
        }
        shared
            .rx_packets
            .fetch_add(received as u64, Ordering::Relaxed);
        shared.rx_bytes.fetch_add(bytes, Ordering::Relaxed);
    }
    Ok((got, stamped))
}

/// Publish the media lost and reordered so far (for live statistics).
fn publish_loss(sockets: &[Receiving], shared: &Shared) {
    let (lost, reordered) = sockets.iter().fold((0, 0), |a, (_, st)| {
        let totals = st.media_totals();
        (a.0 + totals.1, a.1 + totals.2)
    });
    shared.lost.store(lost, Ordering::Relaxed);
    shared.reordered.store(reordered, Ordering::Relaxed);
}

/// The receive backends' counters summed.
fn io_totals(sockets: &[Receiving]) -> IoStats {
    let mut io_stats = IoStats::default();
    for (io, _) in sockets {
        io_stats.add(&io.stats());
    }
    io_stats
}

/// The receiver thread: every source's receive backend, statistics per
/// source.
fn spawn_receiver(
    shared: Arc<Shared>,
    mut sockets: Vec<Receiving>,
    cpus: Option<Vec<usize>>,
) -> std::io::Result<JoinHandle<anyhow::Result<ReceiverEnd>>> {
    std::thread::Builder::new()
        .name("sfu-client-rx".into())
        .spawn(move || -> anyhow::Result<ReceiverEnd> {
            let refused = pin("sfu-client-rx", cpus, None);
            let mut batch = RxBatch::new(64, FRAME);
            let mut published = Instant::now();
            let single = sockets.len() == 1;
            // Readiness is the socket's own only for backends that read it
            // when asked (io_uring's multishot receive empties it itself).
            let pollable = !single
                && sockets
                    .iter()
                    .all(|(io, _)| matches!(io.kind(), BackendKind::Socket | BackendKind::Mmsg));
            let fds: Vec<_> = sockets.iter().map(|(io, _)| io.raw_fd()).collect();
            // One socket: block briefly; many: poll each without waiting.
            let wait = if single {
                Duration::from_millis(5)
            } else {
                Duration::ZERO
            };
            let mut gather = true;
            while !shared.stop_rx.load(Ordering::Relaxed) {
                if published.elapsed() >= Duration::from_millis(500) {
                    published = Instant::now();
                    publish_loss(&sockets, &shared);
                }
                let ready = if pollable {
                    readable(&fds, RX_WAIT)
                } else {
                    u64::MAX
                };
                let (got, stamped) = receive_pass(&mut sockets, &mut batch, &shared, ready, wait)?;
                gather &= stamped;
                if got > 0 && pollable && gather {
                    std::thread::sleep(RX_GATHER);
                } else if got == 0 && !single && !pollable {
                    // (Backends without readiness: never spin.)
                    std::thread::sleep(RING_PAUSE);
                }
            }
            Ok(ReceiverEnd::at_end(sockets, refused, None))
        })
}

/// What the sender thread reports.
struct SenderEnd {
    ticks: u64,
    late: u64,
    cpu: Option<CpuTime>,
    refused: Vec<String>,
    /// Its scheduling policy read back at its end.
    policy: Option<Policy>,
}

/// One tick of a source: one packet per stream, sent to `server` in one
/// batch through `io`, and counted.
fn send_tick(
    io: &mut dyn BatchIo,
    streams: &mut [StreamGen],
    tx_batch: &mut TxBatch,
    server: SocketAddr,
    shared: &Shared,
) -> anyhow::Result<()> {
    tx_batch.clear();
    for s in streams.iter_mut() {
        let now_ns = realtime_now().0;
        if tx_batch
            .push_with(server, |f| s.next_packet(f, now_ns))
            .is_err()
        {
            break;
        }
    }
    let sent = io.send_batch(tx_batch)?;
    shared.tx_packets.fetch_add(sent as u64, Ordering::Relaxed);
    shared.tx_bytes.fetch_add(
        tx_batch
            .iter()
            .take(sent)
            .map(|(_, d)| d.len() as u64)
            .sum(),
        Ordering::Relaxed,
    );
    Ok(())
}

/// The sender thread: source k ticks every interval at its own phase
/// `phases[k]` (ns after the start), one packet per stream per tick;
/// counts the ticks that started more than 1 ms late.
fn spawn_sender(
    shared: Arc<Shared>,
    mut sources: Vec<Sending>,
    server: SocketAddr,
    interval_ns: u64,
    phases: Vec<u64>,
    cpus: Option<Vec<usize>>,
    policy: Option<Policy>,
) -> std::io::Result<JoinHandle<anyhow::Result<SenderEnd>>> {
    std::thread::Builder::new()
        .name("sfu-client-tx".into())
        .spawn(move || -> anyhow::Result<SenderEnd> {
            let refused = pin("sfu-client-tx", cpus, policy);
            let mut tx_batch = TxBatch::new(64, FRAME);
            let mut schedule = TickSchedule::new(phases, interval_ns);
            while !shared.stop_tx.load(Ordering::Relaxed) && !sources.is_empty() {
                let source = schedule.wait_next();
                let (io, streams) = &mut sources[source];
                send_tick(io.as_mut(), streams, &mut tx_batch, server, &shared)?;
            }
            Ok(SenderEnd {
                ticks: schedule.ticks,
                late: schedule.late,
                cpu: host::thread_cpu_time().ok(),
                refused,
                policy: ringway_io::thread::policy().ok(),
            })
        })
}

/// How the single client thread of AF_XDP sources runs.
struct ClientIoPlan {
    server: SocketAddr,
    interval_ns: u64,
    phases: Vec<u64>,
    /// Send media (otherwise only receive).
    send: bool,
    cpus: Option<Vec<usize>>,
    policy: Option<Policy>,
}

/// The client thread of AF_XDP sources: it owns every source's socket,
/// sends each source's ticks through its TX ring on the sender's schedule
/// (with the sender's policy) and reads the RX rings at its first wake-up
/// after each [`RING_GATHER`] (not before every tick: each look at a ring costs
/// clock reads and ring bookkeeping, the datagrams carry the XDP program's
/// stamps, and 64 per client and pass is more than twice what 20 clients
/// at 1500 pps bring in a pause). The rings need no system call to be
/// read, so a second thread would only add its own wake-ups; ticks made
/// late by the receive work are counted like any other.
fn spawn_client_io(
    shared: Arc<Shared>,
    mut sockets: Vec<Receiving>,
    mut streams: Vec<Vec<StreamGen>>,
    plan: ClientIoPlan,
) -> std::io::Result<JoinHandle<anyhow::Result<ReceiverEnd>>> {
    std::thread::Builder::new()
        .name("sfu-client-io".into())
        .spawn(move || -> anyhow::Result<ReceiverEnd> {
            let refused = pin("sfu-client-io", plan.cpus, plan.policy);
            let mut rx_batch = RxBatch::new(64, FRAME);
            let mut tx_batch = TxBatch::new(64, FRAME);
            let mut schedule = TickSchedule::new(plan.phases, plan.interval_ns);
            let mut sending = plan.send && !sockets.is_empty();
            let mut published = Instant::now();
            let sender_end = |schedule: &TickSchedule| SenderEnd {
                ticks: schedule.ticks,
                late: schedule.late,
                // Counted in the thread's own CPU time.
                cpu: Some(CpuTime::default()),
                refused: Vec::new(),
                policy: ringway_io::thread::policy().ok(),
            };
            let mut sender = None;
            // The last pass over the RX rings and the pause until the next.
            let mut passed: Option<Instant> = None;
            let mut pause = RING_GATHER;
            while !shared.stop_rx.load(Ordering::Relaxed) {
                if published.elapsed() >= Duration::from_millis(500) {
                    published = Instant::now();
                    publish_loss(&sockets, &shared);
                }
                if passed.is_none_or(|at| at.elapsed() >= pause) {
                    let (_, stamped) = receive_pass(
                        &mut sockets,
                        &mut rx_batch,
                        &shared,
                        u64::MAX,
                        Duration::ZERO,
                    )?;
                    passed = Some(Instant::now());
                    pause = if stamped { RING_GATHER } else { RING_PAUSE };
                }
                if sending && shared.stop_tx.load(Ordering::Relaxed) {
                    sending = false;
                    sender = Some(sender_end(&schedule));
                }
                // The next pass waits for a wake-up the ticks make anyway
                // (at most one pause later): no wake-up of its own.
                if !sending {
                    std::thread::sleep(pause);
                } else if let Some(k) = schedule.wait_next_within(pause) {
                    let io = sockets[k].0.as_mut();
                    send_tick(io, &mut streams[k], &mut tx_batch, plan.server, &shared)?;
                }
            }
            if sending {
                sender = Some(sender_end(&schedule));
            }
            Ok(ReceiverEnd::at_end(sockets, refused, sender))
        })
}

/// Register the sources, send and receive for the configured time (or
/// until `stop` is set), and report. `on_live` is called every `every`.
pub fn run(
    c: &SfuLoadConfig,
    stop: &AtomicBool,
    every: Option<Duration>,
    mut on_live: impl FnMut(&LiveLoad),
) -> anyhow::Result<ClientReport> {
    anyhow::ensure!(c.sources >= 1, "need at least one source");
    anyhow::ensure!(
        !c.types.is_empty() && !c.sizes.is_empty(),
        "need media types and sizes"
    );
    anyhow::ensure!(c.interval_ms > 0.0, "the packet interval must be positive");
    let mut sources = register_sources(c)?;
    let ssids: Vec<u32> = sources.iter().map(|s| s.session.ssid).collect();
    let interval_ns = (c.interval_ms * 1e6) as u64;
    let backends = open_backends(c, &mut sources, interval_ns)?;
    // What the backends are (not what was asked for).
    let (rx_kind, tx_kind) = match &backends {
        Backends::Apart(receivers, senders) => (
            one_kind(receivers.iter().map(|(io, _)| io.kind())),
            one_kind(senders.iter().map(|(io, _)| io.kind())),
        ),
        Backends::Shared(receivers, _) => {
            let kind = one_kind(receivers.iter().map(|(io, _)| io.kind()));
            (kind, kind)
        }
    };
    let shared = Arc::new(Shared::default());
    let phases = phases(c.sources, interval_ns, c.desync, c.seed);
    // Stops and joins whatever thread is still running on every way out
    // (a sender that failed to start or stopped with an error included).
    let mut threads = Threads {
        shared: shared.clone(),
        receiver: None,
        sender: None,
    };
    match backends {
        Backends::Apart(receivers, senders) => {
            threads.receiver = Some(spawn_receiver(shared.clone(), receivers, c.cpus.clone())?);
            if c.send {
                threads.sender = Some(spawn_sender(
                    shared.clone(),
                    senders,
                    c.server,
                    interval_ns,
                    phases,
                    c.cpus.clone(),
                    c.sender_policy,
                )?);
            }
        }
        Backends::Shared(receivers, streams) => {
            let plan = ClientIoPlan {
                server: c.server,
                interval_ns,
                phases,
                send: c.send,
                cpus: c.cpus.clone(),
                policy: c.sender_policy,
            };
            threads.receiver = Some(spawn_client_io(shared.clone(), receivers, streams, plan)?);
        }
    }
    let start = Instant::now();
    let mut last_live = Instant::now();
    let mut last_keepalive = Instant::now();
    while start.elapsed().as_secs_f64() < c.duration_s && !stop.load(Ordering::Relaxed) {
        std::thread::sleep(Duration::from_millis(20));
        if threads.finished() {
            break;
        }
        if c.keepalive && last_keepalive.elapsed() >= Duration::from_secs(1) {
            last_keepalive = Instant::now();
            tell_all(&mut sources, MsgType::Keepalive, c.server);
        }
        if let Some(every) = every.filter(|e| !e.is_zero()) {
            if last_live.elapsed() >= every {
                last_live = Instant::now();
                on_live(&shared.live(start.elapsed().as_secs_f64()));
            }
        }
    }
    shared.stop_tx.store(true, Ordering::Relaxed);
    let sent_for = start.elapsed().as_secs_f64();
    let sender = match threads.sender.take() {
        Some(s) => Some(
            s.join()
                .map_err(|_| anyhow::anyhow!("sender thread panicked"))??,
        ),
        None => None,
    };
    std::thread::sleep(Duration::from_secs_f64(c.drain_s.max(0.0)));
    if c.leave {
        tell_all(&mut sources, MsgType::Leave, c.server);
        std::thread::sleep(Duration::from_millis(50));
    }
    shared.stop_rx.store(true, Ordering::Relaxed);
    let received = threads
        .receiver
        .take()
        .expect("the receiver is joined once")
        .join()
        .map_err(|_| anyhow::anyhow!("receiver thread panicked"))??;
    let sent = sender.or(received.sender).unwrap_or(SenderEnd {
        ticks: 0,
        late: 0,
        cpu: Some(CpuTime::default()),
        refused: Vec::new(),
        policy: None,
    });
    let mut summary = report(ssids, sent_for, &shared, &received.stats, sent.late);
    summary.ticks = sent.ticks;
    summary.rx_backend = rx_kind.map_or("mixed", |k| k.name()).to_string();
    summary.tx_backend = tx_kind.map_or("mixed", |k| k.name()).to_string();
    if rx_kind == Some(BackendKind::Xdp) {
        summary.rx_via_kernel = Some(received.io.rx_via_socket);
        summary.rx_rejected = Some(received.io.rx_invalid + received.io.rx_bad_checksum);
        summary.rx_ring_drops = Some(received.io.rx_dropped);
    }
    if tx_kind == Some(BackendKind::Xdp) {
        summary.tx_via_kernel = Some(received.io.tx_via_socket);
        summary.tx_dropped = Some(received.io.tx_ring_full_drops + received.io.tx_errors);
    }
    summary.cpu = match (sent.cpu, received.cpu) {
        (Some(a), Some(b)) => Some(CpuTime {
            user_ns: a.user_ns + b.user_ns,
            system_ns: a.system_ns + b.system_ns,
        }),
        _ => None,
    };
    summary.placement_refused = received.refused.into_iter().chain(sent.refused).collect();
    summary.sender_policy = sent.policy.map(|p| p.to_string());
    Ok(summary)
}

/// The one kind of `kinds` (`None`: none, or they differ).
fn one_kind(mut kinds: impl Iterator<Item = BackendKind>) -> Option<BackendKind> {
    kinds
        .try_fold(None, |seen, kind| match seen {
            Some(k) if k != kind => Err(()),
            _ => Ok(Some(kind)),
        })
        .ok()
        .flatten()
}

/// The load's threads; dropping it stops and joins those still running.
struct Threads {
    shared: Arc<Shared>,
    receiver: Option<JoinHandle<anyhow::Result<ReceiverEnd>>>,
    sender: Option<JoinHandle<anyhow::Result<SenderEnd>>>,
}

impl Threads {
    /// One of the threads has ended (an error, or nothing left to send).
    fn finished(&self) -> bool {
        self.receiver.as_ref().is_some_and(|h| h.is_finished())
            || self.sender.as_ref().is_some_and(|h| h.is_finished())
    }
}

impl Drop for Threads {
    fn drop(&mut self) {
        self.shared.stop_tx.store(true, Ordering::Relaxed);
        self.shared.stop_rx.store(true, Ordering::Relaxed);
        if let Some(handle) = self.sender.take() {
            let _ = handle.join();
        }
        if let Some(handle) = self.receiver.take() {
            let _ = handle.join();
        }
    }
}

fn report(
    ssids: Vec<u32>,
    sent_for: f64,
    shared: &Shared,
    per_socket: &[RxStats],
    late_ticks: u64,
) -> ClientReport {
    let mut total = RxStats::new(Vec::new());
    for s in per_socket {
        total.merge(s);
    }
    let (media, lost, reordered) = total.media_totals();
    let tx_packets = shared.tx_packets.load(Ordering::Relaxed);
    let tx_bytes = shared.tx_bytes.load(Ordering::Relaxed);
    ClientReport {
        ssids,
        duration_s: sent_for,
        tx_packets,
        tx_bytes,
        rx_packets: total.rx_packets,
        rx_bytes: total.rx_bytes,
        out_mbps: tx_bytes as f64 * 8.0 / sent_for / 1e6,
        in_mbps: total.rx_bytes as f64 * 8.0 / sent_for / 1e6,
        media_packets: media,
        lost,
        reordered,
        reordered_ratio: if media > 0 {
            reordered as f64 / media as f64
        } else {
            0.0
        },
        echoes: total.echoes,
        rtt: LatencySummary::of_ns(&total.rtt),
        owd: LatencySummary::of_ns(&total.owd),
        control: total.control,
        control_errors: total.control_errors,
        malformed: total.malformed,
        rx_backend: String::new(),
        rx_via_kernel: None,
        rx_rejected: None,
        rx_ring_drops: None,
        tx_backend: String::new(),
        tx_via_kernel: None,
        tx_dropped: None,
        received: total.streams(),
        ticks: 0,
        late_ticks,
        cpu: None,
        placement_refused: Vec::new(),
        sender_policy: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The sender thread runs with the policy asked for and reads it back
    /// (root may set a real-time policy; otherwise the refusal is in its
    /// placement lines and it keeps the caller's).
    #[test]
    fn the_sender_takes_the_asked_policy_and_reports_it() {
        let server: SocketAddr = "127.0.0.1:9".parse().unwrap();
        let run = |policy| {
            let shared = Arc::new(Shared::default());
            let sender = spawn_sender(
                shared,
                Vec::new(),
                server,
                1_000_000,
                Vec::new(),
                None,
                policy,
            );
            sender.unwrap().join().unwrap().unwrap()
        };
        let inherited = ringway_io::thread::policy().unwrap();
        let end = run(Some(Policy::Fifo(10)));
        if end.refused.is_empty() {
            assert_eq!(end.policy, Some(Policy::Fifo(10)));
        } else {
            assert_eq!(end.policy, Some(inherited), "{:?}", end.refused);
        }
        // Without a policy the sender keeps the caller's.
        let end = run(None);
        assert!(end.refused.is_empty());
        assert_eq!(end.policy, Some(inherited));
    }

    /// The guard stops and joins the receiver on an early exit (here: the
    /// sender failed), so no thread outlives `run`.
    #[test]
    fn dropping_the_threads_guard_stops_and_joins_the_receiver() {
        let shared = Arc::new(Shared::default());
        let receiver = spawn_receiver(shared.clone(), Vec::new(), None).unwrap();
        let sender =
            std::thread::spawn(|| -> anyhow::Result<SenderEnd> { anyhow::bail!("send failed") });
        let threads = Threads {
            shared: shared.clone(),
            receiver: Some(receiver),
            sender: Some(sender),
        };
        std::thread::sleep(Duration::from_millis(20));
        assert!(!threads.receiver.as_ref().unwrap().is_finished());
        drop(threads);
        assert!(shared.stop_rx.load(Ordering::Relaxed));
        // The receiver thread held a reference until it ended.
        assert_eq!(Arc::strong_count(&shared), 1);
    }

    /// With several sockets the receiver reads the ones the kernel says
    /// are readable: whatever reaches the second and the third of three
    /// is all read, by the socket it reached, over several gathering
    /// passes.
    #[test]
    fn the_receiver_reads_every_readable_socket() {
        let shared = Arc::new(Shared::default());
        let mut sockets = Vec::new();
        let mut addrs = Vec::new();
        for ssid in 1..=3 {
            let cfg = SocketConfig::new("127.0.0.1:0".parse().unwrap());
            let sock = open_udp(&cfg).unwrap().0;
            addrs.push(sock.local_addr().unwrap());
            sockets.push((
                open_backend(BackendKind::Mmsg, sock).unwrap(),
                RxStats::new(vec![ssid]),
            ));
        }
        let receiver = spawn_receiver(shared.clone(), sockets, None).unwrap();
        let sender = UdpSocket::bind("127.0.0.1:0").unwrap();
        for round in 0..5 {
            for (to, count) in [(addrs[1], 3), (addrs[2], 7)] {
                for _ in 0..count {
                    sender.send_to(&[round; 40], to).unwrap();
                }
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        while shared.rx_packets.load(Ordering::Relaxed) < 50 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        shared.stop_rx.store(true, Ordering::Relaxed);
        let end = receiver.join().unwrap().unwrap();
        assert_eq!(shared.rx_packets.load(Ordering::Relaxed), 50);
        let per_socket: Vec<u64> = end.stats.iter().map(|st| st.rx_packets).collect();
        assert_eq!(per_socket, [0, 15, 35]);
    }
}
