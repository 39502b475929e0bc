//! `ringway sip load`: SIP UAC+UAS load generator.

use ringway_load::sip::{ArrivalKind, GsoMode, Live, LoadConfig};
use std::io::Write;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// Arguments of `ringway sip load`.
#[derive(clap::Args, Debug)]
pub(crate) struct LoadArgs {
    /// Proxy to send INVITEs to (ip:port); omit to call the UAS directly.
    #[arg(long)]
    pub proxy: Option<SocketAddr>,
    /// External UAS for the Request-URI (ip:port); omit to answer calls with the built-in UAS.
    #[arg(long)]
    pub uas: Option<SocketAddr>,
    /// Local IP of the generator's sockets.
    #[arg(long, default_value = "127.0.0.1")]
    pub bind: IpAddr,
    /// First local port (thread i binds port+i); 0 = ephemeral.
    #[arg(long, default_value_t = 0)]
    pub port: u16,
    /// Target call rate (calls/s).
    #[arg(long, default_value_t = 100.0)]
    pub rate: f64,
    /// Arrival process: poisson or constant.
    #[arg(long, default_value = "poisson")]
    pub arrival: ArrivalKind,
    /// RNG seed.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Maximum number of calls.
    #[arg(long, default_value_t = 1000)]
    pub calls: u64,
    /// Maximum time to start calls for (seconds).
    #[arg(long, default_value_t = 10.0)]
    pub duration: f64,
    /// Worker threads.
    #[arg(long, default_value_t = 1)]
    pub threads: usize,
    /// I/O backend: socket, mmsg or uring.
    #[arg(long, default_value = "mmsg")]
    pub backend: ringway_io::BackendKind,
    /// RFC 3261 T1 in milliseconds.
    #[arg(long, default_value_t = 500)]
    pub t1_ms: u64,
    /// Time between ACK and BYE in milliseconds.
    #[arg(long, default_value_t = 0)]
    pub hold_ms: u64,
    /// Wakeup coalescing in microseconds while calls are in flight (0: wake
    /// per event; auto: the time 8 call starts take per thread, 1000..=10000).
    /// With the built-in UAS, response times include up to one tick.
    #[arg(long, default_value = "auto")]
    pub tick_us: TickArg,
    /// UDP GSO: send equal-length messages to one destination as one
    /// datagram train (auto: where the backend and kernel support it; on:
    /// require it; off: one datagram per send entry).
    #[arg(long, default_value = "auto")]
    pub gso: GsoMode,
    /// UDP GRO: receive a datagram train as one message and split it (auto:
    /// where the backend and kernel support it; on: require it; off: one
    /// datagram per receive entry).
    #[arg(long, default_value = "auto")]
    pub gro: GsoMode,
    /// RFC 7339 overload control (loss-based): `;oc` in the Via, and the share of new calls the proxy advertises refused locally, counted as throttled (on, off: a sender without it).
    #[arg(long, default_value = "on", value_parser = ["on", "off"])]
    pub overload_control: String,
    /// Write the final summary as JSON to this file ("-" for stdout).
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// No live progress line.
    #[arg(long)]
    pub quiet: bool,
}

/// `--tick-us`: `auto` (`None`) or a number of microseconds.
#[derive(Copy, Clone, Debug)]
pub(crate) struct TickArg(pub Option<u64>);

impl std::str::FromStr for TickArg {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        if s == "auto" {
            return Ok(TickArg(None));
        }
        s.parse()
            .map(|us| TickArg(Some(us)))
            .map_err(|_| format!("must be auto or a number of microseconds (got {s:?})"))
    }
}

/// Turn the arguments into a generator configuration.
pub(crate) fn config(a: &LoadArgs) -> anyhow::Result<LoadConfig> {
    if !(a.duration.is_finite() && a.duration > 0.0 && a.duration <= 86400.0) {
        anyhow::bail!(
            "--duration must be in (0, 86400] seconds (got {})",
            a.duration
        );
    }
    if a.t1_ms == 0 || a.t1_ms > 60_000 {
        anyhow::bail!("--t1-ms must be in 1..=60000");
    }
    let cfg = LoadConfig {
        proxy: a.proxy,
        uas: a.uas,
        bind_ip: a.bind,
        base_port: a.port,
        rate: a.rate,
        arrival: a.arrival,
        seed: a.seed,
        calls: a.calls,
        duration: Duration::from_secs_f64(a.duration),
        threads: a.threads,
        backend: a.backend,
        t1: Duration::from_millis(a.t1_ms),
        t2: Duration::from_millis((a.t1_ms * 8).max(4000)),
        hold: Duration::from_millis(a.hold_ms),
        tick: a.tick_us.0.map(Duration::from_micros),
        gso: a.gso,
        gro: a.gro,
        overload_control: a.overload_control == "on",
        ..LoadConfig::default()
    };
    cfg.validate().map_err(anyhow::Error::msg)?;
    Ok(cfg)
}

/// Run it.
pub(crate) fn run(a: LoadArgs) -> anyhow::Result<()> {
    let cfg = config(&a)?;
    let live = Arc::new(Live {
        stop: ringway_server::host::stop_flag()?,
        ..Live::default()
    });
    let quiet = a.quiet;
    let calls = cfg.calls;
    let mut prog = |l: &Live, e: Duration| {
        if !quiet {
            eprint!("\r{}   ", ringway_load::sip::progress_line(l, e, calls));
            let _ = std::io::stderr().flush();
        }
    };
    let sum = ringway_load::sip::run(&cfg, live, Some(&mut prog))?;
    if !quiet {
        eprintln!();
    }
    match a.json.as_deref() {
        Some(p) if p.as_os_str() == "-" => println!("{}", serde_json::to_string_pretty(&sum)?),
        Some(p) => {
            std::fs::write(p, serde_json::to_string_pretty(&sum)?)?;
            print!("{}", sum.text());
        }
        None => print!("{}", sum.text()),
    }
    Ok(())
}
