//! `ringway sip idle`: open many idle TCP or TLS connections to a SIP
//! server and report what they cost it (memory per connection, CPU per
//! connection set up).

use ringway_load::sip::idle::IdleConfig;
use ringway_sip::TransportAddr;
use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

/// Arguments of `ringway sip idle`.
#[derive(clap::Args, Debug)]
pub(crate) struct IdleArgs {
    /// The server: `tcp:ADDR` or `tls:ADDR`.
    #[arg(long, value_parser = super::sip_proxy::parse_transport_addr)]
    pub to: TransportAddr,
    /// Connections to open.
    #[arg(long, default_value_t = 1000)]
    pub connections: usize,
    /// Local address to connect from (repeatable: used round robin; one
    /// address has about 28 000 ports towards one server address).
    #[arg(long = "source", default_value = "127.0.0.1")]
    pub sources: Vec<IpAddr>,
    /// TLS: PEM CA the server's certificate is verified with.
    #[arg(long)]
    pub tls_ca: Option<PathBuf>,
    /// TLS: name sent by SNI and verified (default: the server's IP address).
    #[arg(long)]
    pub tls_server_name: Option<String>,
    /// Do not send the CRLF CRLF keep-alive (by default each connection
    /// sends one and waits for the server's CRLF pong).
    #[arg(long)]
    pub no_ping: bool,
    /// Connections being set up at once at most.
    #[arg(long, default_value_t = 64)]
    pub parallel: usize,
    /// Seconds one connection may take to be set up.
    #[arg(long, default_value_t = 10)]
    pub timeout_s: u64,
    /// Seconds to wait after the last connection before reading the memory.
    #[arg(long, default_value_t = 2.0)]
    pub settle_s: f64,
    /// Seconds to keep the connections after the reading.
    #[arg(long, default_value_t = 0.0)]
    pub hold_s: f64,
    /// The server's PID: its memory (VmRSS, Pss, with its children) and
    /// CPU are read before and after.
    #[arg(long)]
    pub server_pid: Option<u32>,
    /// Write the summary as JSON to this file ("-" for stdout).
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Write this file (JSON: connections tried, open, failed by stage)
    /// once every connection has been tried, before --settle-s and
    /// --hold-s: a script or test can act while they are held.
    #[arg(long)]
    pub ready_file: Option<PathBuf>,
}

fn seconds(option: &str, value: f64) -> anyhow::Result<Duration> {
    Duration::try_from_secs_f64(value).map_err(|_| anyhow::anyhow!("{option}: not a duration"))
}

/// Run it.
pub(crate) fn run(a: IdleArgs) -> anyhow::Result<()> {
    let config = IdleConfig {
        target: a.to,
        connections: a.connections,
        sources: a.sources,
        tls_ca: a.tls_ca,
        tls_server_name: a.tls_server_name,
        ping: !a.no_ping,
        parallel: a.parallel,
        timeout: Duration::from_secs(a.timeout_s),
        settle: seconds("--settle-s", a.settle_s)?,
        hold: seconds("--hold-s", a.hold_s)?,
        server_pid: a.server_pid,
        ready_file: a.ready_file,
    };
    let stop = ringway_server::host::stop_flag()?;
    let summary = ringway_load::sip::idle::run(&config, &stop)?;
    match a.json.as_deref() {
        Some(p) if p.as_os_str() == "-" => {
            println!("{}", serde_json::to_string_pretty(&summary)?)
        }
        Some(p) => {
            std::fs::write(p, serde_json::to_string_pretty(&summary)?)?;
            print!("{}", summary.text());
        }
        None => print!("{}", summary.text()),
    }
    Ok(())
}
