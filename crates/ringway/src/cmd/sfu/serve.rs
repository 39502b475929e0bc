//! `ringway sfu serve`: command-line front end of
//! [`ringway_server::sfu::serve`]: options → [`SfuServerConfig`], live
//! statistics, the final report.

use anyhow::Context;
use ringway_io::{BackendKind, Io, IoChoiceError, XdpInterface, XdpMode};
pub(crate) use ringway_server::sfu::Flush;
use ringway_server::sfu::{LiveStats, ServeReport, SfuServer, SfuServerConfig};
use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// `ringway sfu serve` options.
#[derive(clap::Args, Debug, Clone)]
pub struct ServeArgs {
    /// Read options from this TOML file (table [sfu.serve]; see
    /// docs/ringway.toml); options on the command line override it.
    #[arg(long, value_hint = clap::ValueHint::FilePath)]
    pub config: Option<PathBuf>,
    /// Address to listen on (port 0: any; the bound address is printed).
    #[arg(long, default_value = "127.0.0.1:5004")]
    pub listen: SocketAddr,
    /// I/O backend: socket, mmsg, uring, or xdp (AF_XDP on `--xdp-iface`;
    /// `--listen` must then be one of that interface's addresses, IPv4 or IPv6).
    #[arg(long, default_value = "socket")]
    pub backend: BackendKind,
    /// With `--backend xdp`: the interface to attach the XDP program and the
    /// AF_XDP socket to (queue 0, copy mode).
    #[arg(long)]
    pub xdp_iface: Option<String>,
    /// With `--backend xdp`: attach the XDP program in `native` (driver)
    /// mode, `generic` (SKB) mode, or `auto` (native, else generic).
    #[arg(long, default_value = "auto", value_parser = parse_xdp_mode)]
    pub xdp_mode: XdpMode,
    /// With `--backend xdp`: UMEM frames, a power of two (half on the fill
    /// ring, the rest for the TX ring).
    #[arg(long, default_value_t = 4096)]
    pub xdp_frames: u32,
    /// Replicate verified media in the kernel: a tcx ingress program on
    /// this interface (`--listen` must be one of its addresses) with the
    /// routes the SFU holds; the rest comes to the engine as usual.
    #[arg(long)]
    pub kernel_fanout: Option<String>,
    /// Datagrams per receive batch (default: 1 for socket, as in the paper's baseline; 64 for mmsg, uring and xdp).
    #[arg(long)]
    pub batch: Option<usize>,
    /// When copies are handed to the kernel: `packet` (after each packet's
    /// copies), `adaptive` (when the receive batch is done or the oldest
    /// unsent copy is `--flush-age-us` old) or `batch` (once per receive
    /// batch). Default: packet.
    #[arg(long)]
    pub flush: Option<Flush>,
    /// With `--flush adaptive`: longest a copy may wait unsent (µs).
    #[arg(long, default_value_t = 20)]
    pub flush_age_us: u32,
    /// Spin this long (µs) polling for datagrams before sleeping (0: never);
    /// the CPU it burns is reported (`spin_s`).
    #[arg(long, default_value_t = 0)]
    pub spin_us: u32,
    /// Seconds at the start left out of the delay and CPU measurement.
    #[arg(long, default_value_t = 0.0)]
    pub warmup: f64,
    /// Do not echo media packets back to their senders.
    #[arg(long)]
    pub no_echo: bool,
    /// Admit RTP senders by address into one static room, each after a
    /// return-routability check (its first packet earns a CHALLENGE whose
    /// cookie it must echo in a JOIN).
    #[arg(long)]
    pub static_room: bool,
    /// Most registered clients (and static-room members).
    #[arg(long, default_value_t = 1024)]
    pub max_clients: usize,
    /// Most clients (and static-room members) from one source prefix (--client-prefix-v4/-v6).
    #[arg(long, default_value_t = 64)]
    pub max_clients_per_prefix: usize,
    /// IPv4 prefix length of --max-clients-per-prefix (32: one address, 24: a /24).
    #[arg(long, default_value_t = 32)]
    pub client_prefix_v4: u8,
    /// IPv6 prefix length of --max-clients-per-prefix.
    #[arg(long, default_value_t = 56)]
    pub client_prefix_v6: u8,
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
    /// Sort each RTP stream (source, SSRC, payload type) by sequence number
    /// within each receive batch before forwarding (SRPIC).
    #[arg(long)]
    pub srpic: bool,
    /// SRPIC block size (packets a flow may hold before it flushes).
    #[arg(long, default_value_t = 32)]
    pub srpic_block: usize,
    /// Join tokens: the HMAC-SHA256 key is in this file (at least 32 bytes;
    /// trailing whitespace ignored; never printed). With it, REGISTER needs
    /// a valid token for its room (`ringway sfu token` mints them).
    #[arg(long, value_hint = clap::ValueHint::FilePath)]
    pub token_key_file: Option<PathBuf>,
    /// Most rooms at once.
    #[arg(long, default_value_t = 256)]
    pub max_rooms: usize,
    /// Most clients per room.
    #[arg(long, default_value_t = 1024)]
    pub max_clients_per_room: usize,
    /// Only rooms created through the admin API can be joined (default:
    /// a room is created when a client first names it).
    #[arg(long)]
    pub no_auto_rooms: bool,
    /// Per-peer statistics: a media packet more than this many ms later
    /// than its stream's earliest counts as late.
    #[arg(long, default_value_t = 20.0)]
    pub late_after_ms: f64,
    /// Serve the admin API (JSON, bearer token) and /metrics on this
    /// loopback address (port 0: any; the bound address is printed).
    #[arg(long)]
    pub admin: Option<SocketAddr>,
    /// The admin API's bearer token is in this file (at least 16
    /// characters). Required with --admin.
    #[arg(long, value_hint = clap::ValueHint::FilePath)]
    pub admin_token_file: Option<PathBuf>,
    /// Record forwarded media into this directory: one file per source,
    /// written by a recorder thread off the data path (`ringway sfu record
    /// convert` makes WAV files of them).
    #[arg(long, value_hint = clap::ValueHint::DirPath)]
    pub record_dir: Option<PathBuf>,
    /// With --record-dir: most bytes the recording may write (headers
    /// included); then it stops, and later packets are counted as dropped.
    #[arg(long, default_value_t = 1 << 30)]
    pub record_max_bytes: u64,
    /// Log format and levels (stderr).
    #[command(flatten)]
    pub log: crate::logging::LogArgs,
}

impl TryFrom<&ServeArgs> for SfuServerConfig {
    type Error = anyhow::Error;

    fn try_from(a: &ServeArgs) -> anyhow::Result<SfuServerConfig> {
        let cpus = match &a.cpus {
            Some(list) => Some(ringway_server::host::parse_cpu_list(list).context("--cpus")?),
            None => None,
        };
        if let Some(duration) = a.duration {
            anyhow::ensure!(
                duration.is_finite() && duration > 0.0,
                "--duration must be positive"
            );
        }
        // The one place "xdp needs an interface" is checked: from here on
        // the backend carries its interface.
        let interface = a.xdp_iface.as_ref().map(|iface| XdpInterface {
            mode: a.xdp_mode,
            frames: a.xdp_frames,
            ..XdpInterface::new(iface)
        });
        let io = Io::new(a.backend, interface).map_err(|e| match e {
            IoChoiceError::NeedsInterface => {
                anyhow::anyhow!("xdp backend needs an interface: use --xdp-iface")
            }
            IoChoiceError::InterfaceWithoutXdp(_) => {
                anyhow::anyhow!("--xdp-iface needs --backend xdp")
            }
        })?;
        // Validated once, by the server when it starts (or by `config check`).
        Ok(SfuServerConfig {
            listen: a.listen,
            io,
            batch: a.batch,
            flush: a.flush,
            flush_age_us: a.flush_age_us,
            spin_us: a.spin_us,
            warmup_s: a.warmup,
            kernel_fanout: a.kernel_fanout.clone(),
            echo: !a.no_echo,
            static_room: a.static_room,
            max_clients: a.max_clients,
            max_clients_per_prefix: a.max_clients_per_prefix,
            client_prefix_v4: a.client_prefix_v4,
            client_prefix_v6: a.client_prefix_v6,
            max_subs: a.max_subs,
            idle_timeout_s: a.idle_timeout,
            cpus,
            duration_s: a.duration,
            srpic_block: a.srpic.then_some(a.srpic_block),
            token_key_file: a.token_key_file.clone(),
            max_rooms: a.max_rooms,
            max_clients_per_room: a.max_clients_per_room,
            auto_create_rooms: !a.no_auto_rooms,
            late_after_ms: a.late_after_ms,
            admin_listen: a.admin,
            admin_token_file: a.admin_token_file.clone(),
            record_dir: a.record_dir.clone(),
            record_max_bytes: a.record_max_bytes,
        })
    }
}

pub(crate) fn parse_xdp_mode(s: &str) -> Result<XdpMode, String> {
    [XdpMode::Auto, XdpMode::Native, XdpMode::Generic]
        .into_iter()
        .find(|m| m.name() == s)
        .ok_or_else(|| format!("unknown XDP mode {s:?} (auto, native, generic)"))
}

/// Run the SFU until the duration ends or a signal arrives.
pub(crate) fn run(a: ServeArgs) -> anyhow::Result<()> {
    a.log.apply();
    let config = SfuServerConfig::try_from(&a)?;
    let stop = ringway_server::host::stop_flag()?;
    let every = Duration::from_secs_f64(a.stats_interval.max(0.0));
    let start = Instant::now();
    let mut last = (Instant::now(), LiveStats::default());
    let server = SfuServer::start(config)?;
    // One line: tests and scripts read the addresses from it.
    let admin = server
        .admin_addr()
        .map(|a| format!("; admin API and /metrics on http://{a}"))
        .unwrap_or_default();
    println!(
        "ringway sfu: listening on {} ({} backend){admin}",
        server.local_addr(),
        a.backend
    );
    let _ = std::io::stdout().flush();
    let mut last_live = Instant::now();
    // systemd (Type=notify): READY now, watchdog pings while the engine
    // loop goes round (its tick counter moves), STOPPING at the end.
    let mut systemd = crate::cmd::serving::Systemd::from_env();
    systemd.notify("READY=1\nSTATUS=serving");
    while !server.is_finished() && !stop.load(std::sync::atomic::Ordering::Relaxed) {
        systemd.tick(|| vec![server.live().ticks], !server.is_finished());
        std::thread::sleep(Duration::from_millis(20));
        if !every.is_zero() && last_live.elapsed() >= every {
            let live = server.live();
            print_live(start, &last, &live);
            last = (Instant::now(), live);
            last_live = Instant::now();
        }
    }
    systemd.notify("STOPPING=1");
    let report = server.shutdown()?;
    print_final(&report);
    if let Some(path) = &a.json {
        std::fs::write(path, serde_json::to_vec_pretty(&report)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

/// One line of live statistics: rates since the previous line.
fn print_live(start: Instant, last: &(Instant, LiveStats), l: &LiveStats) {
    let interval = last.0.elapsed().as_secs_f64().max(1e-9);
    let prev = &last.1;
    println!(
        "[{:6.1}s] clients={} room={} in={:.0}pps {:.2}Mbps out={:.2}Mbps copies={:.0}/s drops={}",
        start.elapsed().as_secs_f64(),
        l.sfu.clients,
        l.sfu.room_members,
        (l.sfu.rx_datagrams - prev.sfu.rx_datagrams) as f64 / interval,
        (l.rx_bytes - prev.rx_bytes) as f64 * 8.0 / interval / 1e6,
        (l.tx_bytes - prev.tx_bytes) as f64 * 8.0 / interval / 1e6,
        (l.sfu.copies + l.sfu.echoes - prev.sfu.copies - prev.sfu.echoes) as f64 / interval,
        l.sfu.drop_malformed
            + l.sfu.drop_unregistered
            + l.sfu.drop_unverified
            + l.sfu.drop_unknown_pt,
    );
    let _ = std::io::stdout().flush();
}

/// What `sfu serve` prints when it stops: totals, threads, delays, the
/// recording and the drops.
fn print_final(r: &ServeReport) {
    let sfu = &r.sfu;
    // Unknown CPU time (the kernel did not tell it) prints n/a, never 0.
    let pct = |v: f64| {
        if v.is_finite() {
            format!("{v:.1}%")
        } else {
            "n/a".into()
        }
    };
    println!(
        "final: {:.1}s {} batch={} flush={:?} rx={} media={} copies={} echoes={} acks={} errors={} \
         challenges={} cpu user={} sys={} spin={:.2}s",
        r.wall_s,
        r.io_mode,
        r.batch,
        r.flush,
        sfu.rx_datagrams,
        sfu.media_accepted,
        sfu.copies,
        sfu.echoes,
        sfu.acks,
        sfu.errors_sent,
        sfu.challenges,
        pct(r.cpu_user_pct),
        pct(r.cpu_system_pct),
        r.spin_s
    );
    for line in &r.placement_refused {
        println!("placement refused: {line}");
    }
    print_threads(r);
    print_delays(r);
    if let Some(rec) = &r.recording {
        print_recording(rec);
    }
    print_drops(sfu);
}

/// The engines' and the control thread's counters.
fn print_threads(r: &ServeReport) {
    for engine in &r.engines {
        let c = &engine.counters;
        println!(
            "engine of RX queue {}: rx={} media={} copies={} echoes={} to_control={} (dropped {}) cpu={}",
            engine.queue,
            c.datagrams,
            c.media,
            c.copies,
            c.echoes,
            c.to_control,
            c.to_control_dropped,
            engine
                .cpu
                .map_or("n/a".into(), |cpu| format!("{:.2}s", cpu.total_s()))
        );
    }
    if let Some(c) = &r.control {
        println!(
            "control thread: handled={} replies={} copies={} send_errors={} snapshots={} \
             next-hop reads={} tables={}",
            c.handled,
            c.replies,
            c.copies,
            c.send_errors,
            c.snapshots,
            c.next_hop_reads,
            c.next_hop_tables
        );
    }
}

/// The four delays' medians and delay (a)'s 99th percentile.
fn print_delays(r: &ServeReport) {
    let p50 = |l: &ringway_server::metrics::LatencySummary| {
        if l.count > 0 {
            format!("{:.1}us", l.p50_us)
        } else {
            "n/a".into()
        }
    };
    println!(
        "delay p50: (a) scheduled={} (b) handoff={} (c) wait={} (d) from kernel RX={}; (a) p99={}{}",
        p50(&r.delay),
        p50(&r.delay_handoff),
        p50(&r.delay_wait),
        p50(&r.delay_from_kernel),
        if r.delay.count > 0 {
            format!("{:.1}us", r.delay.p99_us)
        } else {
            "n/a".into()
        },
        if r.tx_congested {
            " (TX ring congested)"
        } else {
            ""
        }
    );
}

/// The recorder's files, packets and drops.
fn print_recording(rec: &ringway_server::sfu::RecordReport) {
    println!(
        "recording: {} files, {} packets, {} bytes (cap {}{}) dropped: queue_full={} disk_full={} too_many_sources={} write_errors={}",
        rec.files,
        rec.packets,
        rec.bytes,
        rec.max_bytes,
        if rec.full { ", reached" } else { "" },
        rec.dropped_queue_full,
        rec.dropped_disk_full,
        rec.dropped_too_many_sources,
        rec.write_errors
    );
    if let Some(error) = &rec.error {
        println!("recording error: {error}");
    }
}

/// The SFU core's drops by reason.
fn print_drops(sfu: &ringway_sfu::SfuStats) {
    println!(
        "drops: malformed={} unregistered={} unverified={} unknown_pt={} bad_token={} \
         unknown_ssid={} wrong_address={} not_admitted={} bad_cookie={} rate_limited={} \
         rejected_register={} rejected_subscribe={} timeouts={}",
        sfu.drop_malformed,
        sfu.drop_unregistered,
        sfu.drop_unverified,
        sfu.drop_unknown_pt,
        sfu.drop_bad_token,
        sfu.drop_unknown_ssid,
        sfu.drop_wrong_address,
        sfu.drop_not_admitted,
        sfu.drop_bad_cookie,
        sfu.rate_limited,
        sfu.rejected_register,
        sfu.rejected_subscribe,
        sfu.timeouts
    );
}
