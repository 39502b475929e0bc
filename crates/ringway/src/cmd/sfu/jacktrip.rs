//! `ringway sfu jacktrip`: a hub for JackTrip 1.7 hub clients.

use anyhow::Context;
use ringway_server::sfu::hub::{HubServer, HubServerConfig};
use ringway_sfu::jacktrip::HubConfig;
use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::time::Duration;

/// `ringway sfu jacktrip` options.
#[derive(clap::Args, Debug, Clone)]
pub(crate) struct HubArgs {
    /// TCP address of the handshake (JackTrip clients connect to port 4464 by default).
    #[arg(long, default_value = "0.0.0.0:4464")]
    pub listen: SocketAddr,
    /// UDP port for audio, told to every client (0: any).
    #[arg(long, default_value_t = 61002)]
    pub udp_port: u16,
    /// Sampling rate every client must use (Hz).
    #[arg(long, default_value_t = 48_000)]
    pub rate: u32,
    /// Most clients.
    #[arg(long, default_value_t = 32)]
    pub max_clients: usize,
    /// Most clients (and pending handshakes) per IP address.
    #[arg(long, default_value_t = 8)]
    pub max_per_ip: usize,
    /// Stop after this many seconds (default: until SIGINT/SIGTERM).
    #[arg(long)]
    pub duration: Option<f64>,
    /// Wake once per packet period and take every datagram queued (as a
    /// JACK period clock does) instead of once per datagram: fewer
    /// wakeups, up to one period more delay.
    #[arg(long)]
    pub clocked: bool,
    /// Serve the admin API (JSON, bearer token: clients, counters, gains,
    /// kick) and /metrics on this loopback address (port 0: any; the bound
    /// address is printed).
    #[arg(long)]
    pub admin: Option<SocketAddr>,
    /// The admin API's bearer token is in this file (at least 16
    /// characters). Required with --admin.
    #[arg(long, value_hint = clap::ValueHint::FilePath)]
    pub admin_token_file: Option<PathBuf>,
    /// Write the final report as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

pub(crate) fn run(a: HubArgs) -> anyhow::Result<()> {
    let server = HubServer::start(HubServerConfig {
        listen: a.listen,
        udp_port: a.udp_port,
        hub: HubConfig {
            rate: a.rate,
            max_clients: a.max_clients,
            max_per_ip: a.max_per_ip,
            ..HubConfig::default()
        },
        duration_s: a.duration,
        clocked: a.clocked,
        admin_listen: a.admin,
        admin_token_file: a.admin_token_file.clone(),
    })?;
    println!(
        "ringway sfu jacktrip: handshake on tcp {}; audio on udp {}{}",
        server.tcp_addr(),
        server.udp_addr(),
        server
            .admin_addr()
            .map_or(String::new(), |a| format!("; admin on http://{a}"))
    );
    let _ = std::io::stdout().flush();
    let stop = ringway_server::host::stop_flag()?;
    while !server.is_finished() && !stop.load(Ordering::Relaxed) {
        std::thread::sleep(Duration::from_millis(50));
    }
    let summary = server.shutdown()?;
    let s = &summary.hub;
    println!(
        "final: {:.1}s joins={} exits={} rx_audio={} tx={} forwarded={} by_deadline={} cpu={} \
         mix_wait p50={:.1}us p99={:.1}us recv_calls={} send_calls={}; drops: unknown_peer={} malformed={} rate_mismatch={} \
         frames_mismatch={} handshakes_refused={}",
        summary.wall_s,
        s.joins,
        s.exits,
        s.rx_audio,
        s.tx_packets,
        s.tx_forwarded,
        s.mixes_by_deadline,
        summary.cpu_s.map_or("n/a".into(), |c| format!("{c:.3}s")),
        summary.mix_wait.p50_us,
        summary.mix_wait.p99_us,
        summary.io.rx_syscalls,
        summary.io.tx_syscalls,
        s.drop_unknown_peer,
        s.drop_malformed,
        s.drop_rate_mismatch,
        s.drop_frames_mismatch,
        s.handshakes_refused
    );
    if let Some(path) = &a.json {
        std::fs::write(path, serde_json::to_vec_pretty(&summary)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}
