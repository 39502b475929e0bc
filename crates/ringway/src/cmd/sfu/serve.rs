//! `ringway sfu serve`: the SFU. The main thread prints statistics; one
//! engine thread receives batches, runs them through the sans-IO core
//! ([`ringway_sfu::Sfu`]) and sends the copies.

use super::util::{pin_this_thread, stop_flag, transient, CpuTime};
use anyhow::Context;
use hdrhistogram::Histogram;
use ringway_io::{
    monotonic_now, open_backend, open_udp, open_xdp, realtime_now, BackendKind, IoStats, Nanos,
    RxBatch, SocketConfig, TxBatch, XdpConfig,
};
use ringway_reorder::{Class, SeqSpace, Srpic, SrpicConfig};
use ringway_sfu::client::{latency_histogram, Percentiles};
use ringway_sfu::{Action, Sfu, SfuConfig, SfuStats};
use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Datagram frame size of the receive and send batches.
pub const FRAME: usize = 2048;

/// `ringway sfu serve` options.
#[derive(clap::Args, Debug, Clone)]
pub struct ServeArgs {
    /// Address to listen on (port 0: any; the bound address is printed).
    #[arg(long, default_value = "127.0.0.1:5004")]
    pub listen: SocketAddr,
    /// I/O backend: socket, mmsg, uring, or xdp (AF_XDP on `--xdp-iface`;
    /// `--listen` must then be that interface's IPv4 address).
    #[arg(long, default_value = "socket")]
    pub backend: BackendKind,
    /// With `--backend xdp`: the interface to attach the XDP program and the
    /// AF_XDP socket to (queue 0, copy mode, generic XDP).
    #[arg(long)]
    pub xdp_iface: Option<String>,
    /// Datagrams per receive batch (default: 1 for socket, as in the paper's baseline; 64 for mmsg, uring and xdp).
    #[arg(long)]
    pub batch: Option<usize>,
    /// When copies are handed to the kernel: `batch` (once per receive batch,
    /// fewest syscalls) or `packet` (after each packet's copies: lower delay).
    #[arg(long, default_value = "batch")]
    pub flush: Flush,
    /// Do not echo media packets back to their senders.
    #[arg(long)]
    pub no_echo: bool,
    /// Admit plain RTP senders by address into one static room (latching).
    #[arg(long)]
    pub static_room: bool,
    /// Most registered clients (and static-room members).
    #[arg(long, default_value_t = 1024)]
    pub max_clients: usize,
    /// Most subscription selectors per client.
    #[arg(long, default_value_t = 64)]
    pub max_subs: usize,
    /// Remove clients silent for this many seconds.
    #[arg(long, default_value_t = 10.0)]
    pub idle_timeout: f64,
    /// Pin the engine thread to these CPUs (taskset list, e.g. `1`).
    #[arg(long)]
    pub cpus: Option<String>,
    /// Stop after this many seconds (default: until SIGINT/SIGTERM).
    #[arg(long)]
    pub duration: Option<f64>,
    /// Print live statistics every S seconds (0: never).
    #[arg(long, default_value_t = 1.0)]
    pub stats_interval: f64,
    /// Write the final report as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Sort each RTP stream (SSRC, payload type) by sequence number within
    /// each receive batch before forwarding (SRPIC).
    #[arg(long)]
    pub srpic: bool,
    /// SRPIC block size (packets a flow may hold before it flushes).
    #[arg(long, default_value_t = 32)]
    pub srpic_block: usize,
}

/// When the engine hands queued copies to the kernel.
#[derive(Copy, Clone, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Flush {
    /// Once per receive batch (and when the send batch is full).
    Batch,
    /// After the copies of every packet.
    Packet,
}

/// SRPIC counters in the report.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct SrpicReport {
    /// Packets pushed through the sorter.
    pub packets: u64,
    /// Packets put behind a gap (AfterPacketList).
    pub to_after: u64,
    /// Packets older than the expected one (PrevPacketList).
    pub to_prev: u64,
    /// Flows tracked now.
    pub flows: usize,
}

/// Final report of `ringway sfu serve`.
#[derive(Clone, Debug, serde::Serialize)]
pub struct ServeReport {
    /// Backend name.
    pub backend: String,
    /// Receive batch size.
    pub batch: usize,
    /// Send flush policy.
    pub flush: Flush,
    /// Address served.
    pub listen: String,
    /// Wall time of the engine loop (s).
    pub wall_s: f64,
    /// Engine thread CPU time.
    pub cpu: CpuTime,
    /// User CPU in % of one core over `wall_s`.
    pub cpu_user_pct: f64,
    /// Kernel CPU in % of one core over `wall_s`.
    pub cpu_system_pct: f64,
    /// Per-packet processing delay (app receive → last copy handed to the kernel).
    pub delay: Percentiles,
    /// Mean of that delay (µs).
    pub delay_mean_us: f64,
    /// Delay from the kernel's software RX timestamp to the last copy handed
    /// to the kernel (adds the wait in the socket queue; empty without stamps).
    pub delay_from_kernel: Percentiles,
    /// Mean number of copies (subscribers + echo) per forwarded packet.
    pub copies_per_packet: f64,
    /// Core counters.
    pub sfu: SfuStats,
    /// Backend counters.
    pub io: IoStats,
    /// Bytes received / sent by the engine.
    pub rx_bytes: u64,
    /// See `rx_bytes`.
    pub tx_bytes: u64,
    /// Receive frames that were truncated (dropped).
    pub truncated: u64,
    /// Per-peer receive errors (ICMP errors reported on the socket), skipped.
    pub rx_errors: u64,
    /// SRPIC counters, when sorting was on.
    pub srpic: Option<SrpicReport>,
}

#[derive(Clone, Debug, Default)]
struct Live {
    sfu: SfuStats,
    rx_bytes: u64,
    tx_bytes: u64,
}

/// Send side of the engine: the send batch and the packets whose last copy it holds.
struct Out {
    tx: TxBatch,
    /// (application receive stamp, kernel receive stamp) of packets whose
    /// last copy is queued.
    pending: Vec<(Nanos, Option<Nanos>)>,
    hist: Histogram<u64>,
    /// Delay from the kernel's software RX stamp (includes socket-queue wait).
    khist: Histogram<u64>,
    tx_bytes: u64,
}

impl Out {
    /// Hand the queued copies to the kernel, then record the processing
    /// delay of every packet whose last copy was among them.
    fn flush(&mut self, io: &mut dyn ringway_io::BatchIo) -> anyhow::Result<()> {
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

    fn push(
        &mut self,
        io: &mut dyn ringway_io::BatchIo,
        dst: SocketAddr,
        data: &[u8],
    ) -> anyhow::Result<()> {
        if self.tx.push(dst, data).is_err() {
            self.flush(io)?;
            self.tx
                .push(dst, data)
                .map_err(|_| anyhow::anyhow!("datagram larger than a send frame"))?;
        }
        Ok(())
    }
}

struct Engine {
    sfu: Sfu,
    rx: RxBatch,
    out: Out,
    order: Vec<usize>,
    srpic: Option<Srpic<usize>>,
    per_packet: bool,
    rx_bytes: u64,
    truncated: u64,
    rx_errors: u64,
    forwarded: u64,
    copies: u64,
}

impl Engine {
    fn new(sfu: Sfu, batch: usize, srpic: Option<Srpic<usize>>) -> Engine {
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
    fn handle_batch(&mut self, io: &mut dyn ringway_io::BatchIo, now: u64) -> anyhow::Result<()> {
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
fn classify(src: std::net::SocketAddr, data: &[u8]) -> Class {
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

/// Run the SFU until the duration ends or a signal arrives.
pub fn run(a: ServeArgs) -> anyhow::Result<()> {
    let stop = stop_flag()?;
    let report = serve(a.clone(), stop, |addr| {
        println!("ringway sfu: listening on {addr} ({} backend)", a.backend);
        let _ = std::io::stdout().flush();
    })?;
    print_final(&report);
    if let Some(p) = &a.json {
        std::fs::write(p, serde_json::to_vec_pretty(&report)?)
            .with_context(|| format!("writing {}", p.display()))?;
    }
    Ok(())
}

fn print_final(r: &ServeReport) {
    let s = &r.sfu;
    println!(
        "final: {:.1}s backend={} batch={} rx={} media={} copies={} echoes={} acks={} errors={} \
         cpu user={:.1}% sys={:.1}% delay p50={:.1}us p99={:.1}us",
        r.wall_s,
        r.backend,
        r.batch,
        s.rx_datagrams,
        s.media_accepted,
        s.copies,
        s.echoes,
        s.acks,
        s.errors_sent,
        r.cpu_user_pct,
        r.cpu_system_pct,
        r.delay.p50_us,
        r.delay.p99_us
    );
    println!(
        "drops: malformed={} unregistered={} unverified={} unknown_pt={} bad_token={} \
         unknown_ssid={} wrong_address={} rejected_register={} rejected_subscribe={} timeouts={}",
        s.drop_malformed,
        s.drop_unregistered,
        s.drop_unverified,
        s.drop_unknown_pt,
        s.drop_bad_token,
        s.drop_unknown_ssid,
        s.drop_wrong_address,
        s.rejected_register,
        s.rejected_subscribe,
        s.timeouts
    );
}

/// Run the SFU with `args`; `on_bound` is called with the bound address once
/// the socket is open. Returns when `stop` is set or the duration ends.
pub fn serve(
    args: ServeArgs,
    stop: Arc<AtomicBool>,
    on_bound: impl FnOnce(SocketAddr),
) -> anyhow::Result<ServeReport> {
    let mut io = if args.backend == BackendKind::Xdp {
        let Some(iface) = &args.xdp_iface else {
            anyhow::bail!("xdp backend needs an interface: use --xdp-iface");
        };
        let SocketAddr::V4(local) = args.listen else {
            anyhow::bail!("xdp backend is IPv4 only: --listen must be an IPv4 address");
        };
        open_xdp(XdpConfig::new(iface, local))
            .with_context(|| format!("opening the xdp backend on {iface} for {local}"))?
    } else {
        anyhow::ensure!(args.xdp_iface.is_none(), "--xdp-iface needs --backend xdp");
        let mut cfg = SocketConfig::new(args.listen);
        cfg.rcvbuf = Some(8 << 20);
        cfg.sndbuf = Some(8 << 20);
        let (sock, _rep) = open_udp(&cfg).with_context(|| format!("binding {}", args.listen))?;
        open_backend(args.backend, sock)?
    };
    let bound = io.local_addr()?;
    on_bound(bound);
    let batch = args.batch.unwrap_or(match args.backend {
        BackendKind::Socket => 1,
        _ => 64,
    });
    anyhow::ensure!(batch >= 1, "--batch must be at least 1");
    let seed = realtime_now().0 ^ ((std::process::id() as u64) << 32);
    let sfu = Sfu::new(SfuConfig {
        echo: !args.no_echo,
        static_room: args.static_room,
        max_clients: args.max_clients,
        max_subs: args.max_subs,
        idle_timeout_ns: (args.idle_timeout * 1e9) as u64,
        seed,
    });
    let srpic = args.srpic.then(|| {
        Srpic::new(
            SrpicConfig {
                block_size: args.srpic_block.max(1),
                ring_size: batch.max(args.srpic_block).max(1),
                ..Default::default()
            },
            SeqSpace::U16,
        )
    });
    let live = Arc::new(Mutex::new(Live::default()));
    let engine_live = live.clone();
    let engine_stop = stop.clone();
    let cpus = args.cpus.clone();
    let flush = args.flush;
    let engine = std::thread::Builder::new()
        .name("sfu-engine".into())
        .spawn(move || -> anyhow::Result<(Engine, IoStats, CpuTime, f64)> {
            if let Some(c) = &cpus {
                pin_this_thread(c)?;
            }
            let mut e = Engine::new(sfu, batch, srpic);
            e.per_packet = flush == Flush::Packet;
            let cpu0 = CpuTime::this_thread();
            let t0 = Instant::now();
            let mut next_tick = 0u64;
            while !engine_stop.load(Ordering::Relaxed) {
                let n = match io.recv_batch(&mut e.rx, Some(Duration::from_millis(20))) {
                    Ok(n) => n,
                    Err(err) if transient(&err) => {
                        e.rx_errors += 1;
                        0
                    }
                    Err(err) => return Err(err.into()),
                };
                let now = monotonic_now().0;
                if n > 0 {
                    e.handle_batch(io.as_mut(), now)?;
                }
                if now >= next_tick {
                    e.sfu.tick(now);
                    next_tick = now + 50_000_000;
                    let mut l = engine_live.lock().expect("not poisoned");
                    l.sfu = e.sfu.stats();
                    l.rx_bytes = e.rx_bytes;
                    l.tx_bytes = e.out.tx_bytes;
                }
            }
            let wall = t0.elapsed().as_secs_f64();
            let cpu = CpuTime::this_thread().since(cpu0);
            Ok((e, io.stats(), cpu, wall))
        })?;
    let start = Instant::now();
    let mut last = (Instant::now(), Live::default());
    let interval = Duration::from_secs_f64(args.stats_interval.max(0.0));
    loop {
        std::thread::sleep(Duration::from_millis(20));
        if engine.is_finished() {
            break;
        }
        if let Some(d) = args.duration {
            if start.elapsed().as_secs_f64() >= d {
                stop.store(true, Ordering::Relaxed);
            }
        }
        if stop.load(Ordering::Relaxed) {
            break;
        }
        if !interval.is_zero() && last.0.elapsed() >= interval {
            let l = live.lock().expect("not poisoned").clone();
            let dt = last.0.elapsed().as_secs_f64();
            println!(
                "[{:6.1}s] clients={} room={} in={:.0}pps {:.2}Mbps out={:.2}Mbps copies={:.0}/s drops={}",
                start.elapsed().as_secs_f64(),
                l.sfu.clients,
                l.sfu.room_members,
                (l.sfu.rx_datagrams - last.1.sfu.rx_datagrams) as f64 / dt,
                (l.rx_bytes - last.1.rx_bytes) as f64 * 8.0 / dt / 1e6,
                (l.tx_bytes - last.1.tx_bytes) as f64 * 8.0 / dt / 1e6,
                (l.sfu.copies + l.sfu.echoes - last.1.sfu.copies - last.1.sfu.echoes) as f64 / dt,
                l.sfu.drop_malformed
                    + l.sfu.drop_unregistered
                    + l.sfu.drop_unverified
                    + l.sfu.drop_unknown_pt,
            );
            let _ = std::io::stdout().flush();
            last = (Instant::now(), l);
        }
    }
    stop.store(true, Ordering::Relaxed);
    let (e, io_stats, cpu, wall) = engine
        .join()
        .map_err(|_| anyhow::anyhow!("engine thread panicked"))??;
    let pct = |s: f64| if wall > 0.0 { 100.0 * s / wall } else { 0.0 };
    let hist = &e.out.hist;
    Ok(ServeReport {
        backend: args.backend.name().into(),
        batch,
        flush: args.flush,
        listen: bound.to_string(),
        wall_s: wall,
        cpu,
        cpu_user_pct: pct(cpu.user_s),
        cpu_system_pct: pct(cpu.system_s),
        delay: Percentiles::of(hist),
        delay_from_kernel: Percentiles::of(&e.out.khist),
        delay_mean_us: if hist.is_empty() {
            0.0
        } else {
            hist.mean() / 1000.0
        },
        copies_per_packet: if e.forwarded > 0 {
            e.copies as f64 / e.forwarded as f64
        } else {
            0.0
        },
        sfu: e.sfu.stats(),
        io: io_stats,
        rx_bytes: e.rx_bytes,
        tx_bytes: e.out.tx_bytes,
        truncated: e.truncated,
        rx_errors: e.rx_errors,
        srpic: e.srpic.as_ref().map(|s| {
            let st = s.stats();
            SrpicReport {
                packets: st.packets,
                to_after: st.to_after,
                to_prev: st.to_prev,
                flows: st.flows,
            }
        }),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use ringway_io::{BatchIo, RxMeta, TxStamp};
    use ringway_sfu::client::{parse_reply, Reply, Requests};
    use ringway_sfu::wire::{write_rtp, RtpHeader};
    use ringway_sfu::{MediaType, RtpPacket, Selector};

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
