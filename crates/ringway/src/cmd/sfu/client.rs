//! `ringway sfu client` and `ringway sfu load`: registered RTP sources with
//! a main thread (control: register, subscribe, keepalive, leave; live
//! statistics), a generator thread (paced RTP sending) and an engine thread
//! (receiving on every socket, loss/reordering/RTT statistics).

use super::serve::FRAME;
use super::util::{pin_this_thread, stop_flag, transient};
use anyhow::{bail, Context};
use ringway_io::netns::{Host, Topology};
use ringway_io::{
    open_backend, open_udp, realtime_now, BackendKind, BatchIo, RxBatch, SocketConfig, TxBatch,
};
use ringway_sfu::client::{
    parse_reply, Percentiles, Reply, Requests, RxStats, Session, StreamGen, StreamSummary,
};
use ringway_sfu::wire::MsgType;
use ringway_sfu::{MediaType, Selector};
use std::io::Write;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, UdpSocket};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Options shared by `client` and `load`.
#[derive(clap::Args, Debug, Clone)]
pub struct CommonArgs {
    /// SFU address.
    #[arg(long)]
    pub server: SocketAddr,
    /// Media types each source sends.
    #[arg(long, default_value = "asq,vsq,vhq", value_delimiter = ',')]
    pub types: Vec<MediaType>,
    /// Interval between packets of one stream (ms); 4 ms × 3 types = 750 pps per source.
    #[arg(long, default_value_t = 4.0)]
    pub interval_ms: f64,
    /// Packet sizes (bytes) per type, in `--types` order (the last one repeats).
    #[arg(long, default_value = "80,160,320", value_delimiter = ',')]
    pub sizes: Vec<usize>,
    /// What to subscribe to: `all`, `none`, or a list of `SSID:TYPE` / `SSID` / `all:TYPE`.
    #[arg(long, default_value = "all")]
    pub subscribe: String,
    /// Seconds of sending.
    #[arg(long, default_value_t = 10.0)]
    pub duration: f64,
    /// Seconds to keep receiving after sending stops.
    #[arg(long, default_value_t = 0.5)]
    pub drain: f64,
    /// Write the final report as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// I/O backend of the engine and generator.
    #[arg(long)]
    pub backend: Option<BackendKind>,
    /// Local IP to bind (default: the server's IP when loopback, else any).
    #[arg(long)]
    pub bind: Option<IpAddr>,
    /// Print live statistics every S seconds (0: never).
    #[arg(long, default_value_t = 1.0)]
    pub stats_interval: f64,
    /// Do not send keepalives (lets the SFU time the client out).
    #[arg(long)]
    pub no_keepalive: bool,
    /// Do not send LEAVE at the end.
    #[arg(long)]
    pub no_leave: bool,
    /// Only register and subscribe; send no media.
    #[arg(long)]
    pub no_send: bool,
    /// Pin the engine thread to these CPUs (list, e.g. `1` or `0-1`).
    #[arg(long)]
    pub cpus: Option<String>,
    /// Open source i's socket inside named network namespace i (mod the
    /// list length): one namespace host per client.
    #[arg(long, value_delimiter = ',')]
    pub in_netns: Vec<String>,
}

/// `ringway sfu client` options.
#[derive(clap::Args, Debug, Clone)]
pub struct ClientArgs {
    /// Number of sources (each its own socket and SSID).
    #[arg(long, default_value_t = 1)]
    pub streams: usize,
    #[command(flatten)]
    pub common: CommonArgs,
}

/// `ringway sfu load` options.
#[derive(clap::Args, Debug, Clone)]
pub struct LoadArgs {
    /// Number of clients (each its own socket and SSID, all in this process).
    #[arg(long)]
    pub clients: usize,
    /// Build a namespace topology (one bridge): the SFU (`ringway sfu serve`,
    /// started here) in host `sfu` at 10.77.0.1 on the port of `--server`,
    /// and each client in its own host; removed at the end.
    #[arg(long)]
    pub netns: bool,
    /// With `--netns`: backend of the SFU started in the `sfu` host (`xdp`
    /// attaches to that host's veth, `eth0`).
    #[arg(long, default_value = "socket")]
    pub sfu_backend: BackendKind,
    /// With `--netns`: where the started SFU writes its JSON report.
    #[arg(long)]
    pub sfu_json: Option<PathBuf>,
    #[command(flatten)]
    pub common: CommonArgs,
}

/// Final report of a client or load run.
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
    pub rtt: Percentiles,
    /// One-way delay of other sources' packets (same-host clocks).
    pub owd: Percentiles,
    /// Control replies received after setup (keepalive/leave ACKs, errors).
    pub control: u64,
    /// ERROR replies among them.
    pub control_errors: u64,
    /// Datagrams that were neither RTP nor control.
    pub malformed: u64,
    /// Per received stream (SSRC, type) counters, summed over receivers.
    pub received: Vec<StreamSummary>,
}

fn parse_subscribe(s: &str) -> anyhow::Result<Vec<Selector>> {
    if s.eq_ignore_ascii_case("none") || s.is_empty() {
        return Ok(Vec::new());
    }
    s.split(',')
        .map(|x| x.trim().parse::<Selector>().map_err(|e| anyhow::anyhow!(e)))
        .collect()
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
                    Some(r @ Reply::Ack(rid, _)) | Some(r @ Reply::Error(rid, _, _))
                        if rid == id =>
                    {
                        return Ok(r)
                    }
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

struct Source {
    sock: UdpSocket,
    session: Session,
    reqs: Requests,
}

fn setup(c: &CommonArgs, n: usize) -> anyhow::Result<Vec<Source>> {
    let sels = parse_subscribe(&c.subscribe)?;
    let bind_ip = c.bind.unwrap_or(if c.server.ip().is_loopback() {
        c.server.ip()
    } else if c.server.is_ipv4() {
        IpAddr::V4(Ipv4Addr::UNSPECIFIED)
    } else {
        IpAddr::V6(Ipv6Addr::UNSPECIFIED)
    });
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        let mut cfg = SocketConfig::new(SocketAddr::new(bind_ip, 0));
        cfg.rcvbuf = Some(4 << 20);
        cfg.sndbuf = Some(1 << 20);
        let (sock, _) = if c.in_netns.is_empty() {
            open_udp(&cfg).context("opening client socket")?
        } else {
            // A socket stays in the namespace it was created in.
            let ns = c.in_netns[i % c.in_netns.len()].clone();
            let host = Host {
                name: ns.clone(),
                netns: ns.clone(),
                ifaces: Vec::new(),
            };
            host.run(move || open_udp(&cfg))
                .with_context(|| format!("entering netns {ns}"))?
                .with_context(|| format!("opening client socket in netns {ns}"))?
        };
        sock.set_read_timeout(Some(Duration::from_millis(50)))?;
        let mut reqs = Requests::default();
        let (id, m) = reqs.register();
        let session = match request(&sock, c.server, id, &m)? {
            Reply::Ack(_, s) => s,
            Reply::Error(_, code, _) => bail!("REGISTER refused: {code:?}"),
        };
        out.push(Source {
            sock,
            session,
            reqs,
        });
    }
    if !sels.is_empty() {
        for s in out.iter_mut() {
            for chunk in sels.chunks(ringway_sfu::wire::MAX_SELECTORS) {
                let (id, m) = s.reqs.subscribe(s.session, chunk, false);
                if let Reply::Error(_, code, _) = request(&s.sock, c.server, id, &m)? {
                    bail!("SUBSCRIBE refused: {code:?}");
                }
            }
        }
    }
    Ok(out)
}

/// Run `ringway sfu client`.
pub fn run(a: ClientArgs) -> anyhow::Result<()> {
    let r = run_sources(&a.common, a.streams, BackendKind::Socket)?;
    finish(&a.common, &r)
}

/// Run `ringway sfu load`.
pub fn run_load(a: LoadArgs) -> anyhow::Result<()> {
    if !a.netns {
        let r = run_sources(&a.common, a.clients, BackendKind::Mmsg)?;
        return finish(&a.common, &r);
    }
    // Testbed: SFU host + one host per client on one bridge.
    let mut b = Topology::builder().host("sfu");
    let names: Vec<String> = (0..a.clients).map(|i| format!("c{i}")).collect();
    for n in &names {
        b = b.host(n);
    }
    let topo = b
        .bridge()
        .build()
        .context("building the namespace topology")?;
    let sfu = topo.host("sfu").expect("built");
    let listen = SocketAddr::new(IpAddr::V4(sfu.addr()), a.common.server.port());
    let exe = std::env::current_exe()?;
    let mut cmd = sfu.command(exe.to_str().context("executable path")?);
    cmd.args(["sfu", "serve", "--listen", &listen.to_string()])
        .args(["--backend", a.sfu_backend.name(), "--stats-interval", "0"]);
    if a.sfu_backend == BackendKind::Xdp {
        let iface = &sfu.ifaces.first().context("sfu host without interface")?.0;
        cmd.args(["--xdp-iface", iface]);
    }
    if let Some(p) = &a.sfu_json {
        cmd.arg("--json").arg(p);
    }
    let mut server = cmd
        .stdout(std::process::Stdio::null())
        .spawn()
        .context("starting the SFU in its host")?;
    let mut common = a.common.clone();
    common.server = listen;
    common.in_netns = names
        .iter()
        .map(|n| topo.host(n).expect("built").netns.clone())
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    let r = run_sources(&common, a.clients, BackendKind::Mmsg);
    // Stop the SFU by PID (SIGTERM: it writes its report), then drop the topology.
    let _ = std::process::Command::new("kill")
        .args(["-TERM", &server.id().to_string()])
        .status();
    let until = Instant::now() + Duration::from_secs(10);
    while server.try_wait()?.is_none() {
        if Instant::now() > until {
            let _ = server.kill();
            let _ = server.wait();
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    drop(topo);
    finish(&common, &r?)
}

fn finish(c: &CommonArgs, r: &ClientReport) -> anyhow::Result<()> {
    println!(
        "final: {:.1}s sources={} out={} pkts {:.2}Mbps in={} pkts {:.2}Mbps media={} lost={} \
         reordered={} echoes={} rtt p50={:.1}us p90={:.1}us p99={:.1}us errors={}",
        r.duration_s,
        r.ssids.len(),
        r.tx_packets,
        r.out_mbps,
        r.rx_packets,
        r.in_mbps,
        r.media_packets,
        r.lost,
        r.reordered,
        r.echoes,
        r.rtt.p50_us,
        r.rtt.p90_us,
        r.rtt.p99_us,
        r.control_errors
    );
    if let Some(p) = &c.json {
        std::fs::write(p, serde_json::to_vec_pretty(r)?)
            .with_context(|| format!("writing {}", p.display()))?;
    }
    Ok(())
}

/// Register `n` sources, send and receive for the configured duration, and report.
pub fn run_sources(
    c: &CommonArgs,
    n: usize,
    default_backend: BackendKind,
) -> anyhow::Result<ClientReport> {
    anyhow::ensure!(n >= 1, "need at least one source");
    anyhow::ensure!(
        !c.types.is_empty() && !c.sizes.is_empty(),
        "need types and sizes"
    );
    anyhow::ensure!(c.interval_ms > 0.0, "--interval-ms must be positive");
    let backend = c.backend.unwrap_or(default_backend);
    let stop_sig = stop_flag()?;
    let mut sources = setup(c, n)?;
    let ssids: Vec<u32> = sources.iter().map(|s| s.session.ssid).collect();
    println!("ringway sfu client: registered SSIDs {ssids:?}");
    let _ = std::io::stdout().flush();

    // Backends: one receive and one send instance per socket.
    let mut rx_side: Vec<(Box<dyn BatchIo>, RxStats)> = Vec::new();
    let mut tx_side: Vec<(Box<dyn BatchIo>, Vec<StreamGen>)> = Vec::new();
    let interval_ns = (c.interval_ms * 1e6) as u64;
    for s in &sources {
        rx_side.push((
            open_backend(backend, s.sock.try_clone()?)?,
            RxStats::new(vec![s.session.ssid]),
        ));
        let gens = c
            .types
            .iter()
            .enumerate()
            .map(|(i, m)| {
                let size = c.sizes[i.min(c.sizes.len() - 1)];
                StreamGen::new(
                    s.session.ssid,
                    *m,
                    size,
                    interval_ns,
                    (s.session.ssid as u16) ^ 0x1234,
                )
            })
            .collect();
        tx_side.push((open_backend(backend, s.sock.try_clone()?)?, gens));
    }
    for s in &mut sources {
        s.sock.set_nonblocking(true)?;
    }

    let rx_pk = Arc::new(AtomicU64::new(0));
    let rx_by = Arc::new(AtomicU64::new(0));
    let tx_pk = Arc::new(AtomicU64::new(0));
    let tx_by = Arc::new(AtomicU64::new(0));
    let stop_rx = Arc::new(AtomicBool::new(false));
    let stop_tx = Arc::new(AtomicBool::new(false));

    // Live loss / reordering totals, refreshed by the engine twice a second.
    let live_lost = Arc::new(AtomicU64::new(0));
    let live_reord = Arc::new(AtomicU64::new(0));
    let engine = {
        let (rx_pk, rx_by, stop) = (rx_pk.clone(), rx_by.clone(), stop_rx.clone());
        let (live_lost, live_reord) = (live_lost.clone(), live_reord.clone());
        let cpus = c.cpus.clone();
        std::thread::Builder::new()
            .name("sfu-client-engine".into())
            .spawn(move || -> anyhow::Result<Vec<RxStats>> {
                if let Some(c) = &cpus {
                    pin_this_thread(c)?;
                }
                let mut batch = RxBatch::new(64, FRAME);
                let mut published = Instant::now();
                while !stop.load(Ordering::Relaxed) {
                    if published.elapsed() >= Duration::from_millis(500) {
                        published = Instant::now();
                        let (l, r) = rx_side.iter().fold((0, 0), |a, (_, st)| {
                            let t = st.media_totals();
                            (a.0 + t.1, a.1 + t.2)
                        });
                        live_lost.store(l, Ordering::Relaxed);
                        live_reord.store(r, Ordering::Relaxed);
                    }
                    let mut got = 0;
                    let single = rx_side.len() == 1;
                    for (io, st) in rx_side.iter_mut() {
                        // One socket: block briefly; many: poll each without waiting.
                        let t = if single {
                            Duration::from_millis(5)
                        } else {
                            Duration::ZERO
                        };
                        let k = match io.recv_batch(&mut batch, Some(t)) {
                            Ok(k) => k,
                            Err(e) if transient(&e) => 0,
                            Err(e) => return Err(e.into()),
                        };
                        got += k;
                        let mut bytes = 0;
                        for d in batch.iter() {
                            let at = d.meta.kernel_rx.unwrap_or(d.meta.app_rx).0;
                            st.record(at, d.data);
                            bytes += d.data.len() as u64;
                        }
                        rx_pk.fetch_add(k as u64, Ordering::Relaxed);
                        rx_by.fetch_add(bytes, Ordering::Relaxed);
                    }
                    if got == 0 && !single {
                        std::thread::sleep(Duration::from_micros(200));
                    }
                }
                Ok(rx_side.into_iter().map(|(_, s)| s).collect())
            })?
    };

    let no_send = c.no_send;
    let server = c.server;
    let generator = {
        let (tx_pk, tx_by, stop) = (tx_pk.clone(), tx_by.clone(), stop_tx.clone());
        std::thread::Builder::new()
            .name("sfu-client-gen".into())
            .spawn(move || -> anyhow::Result<u64> {
                let mut tx = TxBatch::new(64, FRAME);
                let start = Instant::now();
                let mut k: u64 = 0;
                let mut late = 0;
                while !stop.load(Ordering::Relaxed) && !no_send {
                    let due = start + Duration::from_nanos(k * interval_ns);
                    let now = Instant::now();
                    if due > now {
                        std::thread::sleep(due - now);
                    } else if now - due > Duration::from_millis(1) {
                        late += 1;
                    }
                    k += 1;
                    for (io, gens) in tx_side.iter_mut() {
                        tx.clear();
                        for g in gens.iter_mut() {
                            let t = realtime_now().0;
                            if tx.push_with(server, |f| g.next_packet(f, t)).is_err() {
                                break;
                            }
                        }
                        let sent = io.send_batch(&tx)?;
                        tx_pk.fetch_add(sent as u64, Ordering::Relaxed);
                        tx_by.fetch_add(
                            tx.iter().take(sent).map(|(_, d)| d.len() as u64).sum(),
                            Ordering::Relaxed,
                        );
                    }
                }
                Ok(late)
            })?
    };

    let start = Instant::now();
    let mut last = (Instant::now(), 0u64, 0u64, 0u64, 0u64);
    let mut last_keepalive = Instant::now();
    let live = Duration::from_secs_f64(c.stats_interval.max(0.0));
    while start.elapsed().as_secs_f64() < c.duration && !stop_sig.load(Ordering::Relaxed) {
        std::thread::sleep(Duration::from_millis(20));
        if engine.is_finished() || (generator.is_finished() && !no_send) {
            break;
        }
        if !c.no_keepalive && last_keepalive.elapsed() >= Duration::from_secs(1) {
            last_keepalive = Instant::now();
            for s in sources.iter_mut() {
                let (_, m) = s.reqs.simple(MsgType::Keepalive, s.session);
                let _ = s.sock.send_to(&m, server);
            }
        }
        if !live.is_zero() && last.0.elapsed() >= live {
            let dt = last.0.elapsed().as_secs_f64();
            let (rp, rb, tp, tb) = (
                rx_pk.load(Ordering::Relaxed),
                rx_by.load(Ordering::Relaxed),
                tx_pk.load(Ordering::Relaxed),
                tx_by.load(Ordering::Relaxed),
            );
            println!(
                "[{:6.1}s] out {:.0}pps {:.2}Mbps  in {:.0}pps {:.2}Mbps  lost={} reordered={}",
                start.elapsed().as_secs_f64(),
                (tp - last.3) as f64 / dt,
                (tb - last.4) as f64 * 8.0 / dt / 1e6,
                (rp - last.1) as f64 / dt,
                (rb - last.2) as f64 * 8.0 / dt / 1e6,
                live_lost.load(Ordering::Relaxed),
                live_reord.load(Ordering::Relaxed)
            );
            let _ = std::io::stdout().flush();
            last = (Instant::now(), rp, rb, tp, tb);
        }
    }
    stop_tx.store(true, Ordering::Relaxed);
    let sent_for = start.elapsed().as_secs_f64();
    let late = generator
        .join()
        .map_err(|_| anyhow::anyhow!("generator panicked"))??;
    if late > 0 {
        eprintln!("generator: {late} ticks more than 1 ms late");
    }
    std::thread::sleep(Duration::from_secs_f64(c.drain.max(0.0)));
    if !c.no_leave {
        for s in sources.iter_mut() {
            let (_, m) = s.reqs.simple(MsgType::Leave, s.session);
            let _ = s.sock.send_to(&m, server);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    stop_rx.store(true, Ordering::Relaxed);
    let per_socket = engine
        .join()
        .map_err(|_| anyhow::anyhow!("engine panicked"))??;
    let mut total = RxStats::new(Vec::new());
    for s in &per_socket {
        total.merge(s);
    }
    let (media, lost, reordered) = total.media_totals();
    let tx_packets = tx_pk.load(Ordering::Relaxed);
    let tx_bytes = tx_by.load(Ordering::Relaxed);
    Ok(ClientReport {
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
        rtt: Percentiles::of(&total.rtt),
        owd: Percentiles::of(&total.owd),
        control: total.control,
        control_errors: total.control_errors,
        malformed: total.malformed,
        received: total.streams(),
    })
}
