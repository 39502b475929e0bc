//! Idle SIP connections: open many TCP or TLS connections to a server,
//! keep them open with nothing on them, and measure what they cost the
//! server (issue 21: memory per idle connection at 10 000 and 50 000
//! connections, TLS handshakes per second).
//!
//! One thread, one mio poll, non-blocking sockets: at most `parallel`
//! connections are being set up at once (connect, TLS handshake, and with
//! `ping` a CRLF CRLF keep-alive answered by a CRLF pong, RFC 5626 4.4.1,
//! which shows the server took the connection into its loop, not only the
//! kernel). Each connection binds one of `sources` round robin: one
//! loopback source address has about 28 000 ephemeral ports towards one
//! server address, so 50 000 connections need two or more (127.0.0.x).
//!
//! The server's memory is read before the first connection and after the
//! last one is open (and `settle` has passed): resident set (`VmRSS` of
//! `/proc/PID/status`) and proportional set (`Pss` of
//! `/proc/PID/smaps_rollup`), summed over the process and its children.
//! The PSS sum is the metric that is the same for a one-process server
//! (ringway) and a forking one (Kamailio, whose shared memory every child
//! maps: its RSS sum counts those pages once per child). Its CPU time
//! (utime + stime of the tree) over the opening phase gives the server's
//! CPU per connection set up (per TLS handshake over TLS).

use ringway_sip::{Transport, TransportAddr};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use rustls::{ClientConfig, ClientConnection, RootCertStore};
use serde::Serialize;
use socket2::{Domain, Protocol, Socket, Type};
use std::collections::BTreeMap;
use std::io::{ErrorKind, Read, Write};
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Most connections one run opens.
pub const MAX_CONNECTIONS: usize = 200_000;
/// Most connections being set up at once.
pub const MAX_PARALLEL: usize = 4096;

/// What to open and measure.
#[derive(Clone, Debug)]
pub struct IdleConfig {
    /// The server: `tcp:ADDR` or `tls:ADDR`.
    pub target: TransportAddr,
    /// Connections to open.
    pub connections: usize,
    /// Local addresses the connections bind, round robin.
    pub sources: Vec<IpAddr>,
    /// PEM CA the server's certificate is verified with (TLS).
    pub tls_ca: Option<PathBuf>,
    /// Name sent by SNI and verified (default: the server's IP address).
    pub tls_server_name: Option<String>,
    /// Send a CRLF CRLF keep-alive on each connection and wait for the pong.
    pub ping: bool,
    /// Connections being set up at once at most.
    pub parallel: usize,
    /// Time one connection may take to be set up (connect, handshake, pong).
    pub timeout: Duration,
    /// Wait after the last connection is open before reading the memory.
    pub settle: Duration,
    /// Keep the connections open this long after the reading.
    pub hold: Duration,
    /// The server process (its children included) whose memory and CPU
    /// are read.
    pub server_pid: Option<u32>,
    /// Written (the opening phase's counts, JSON) once every connection
    /// has been tried, before `settle` and `hold`: for a script or test
    /// that acts while the connections are held.
    pub ready_file: Option<PathBuf>,
}

impl Default for IdleConfig {
    fn default() -> Self {
        IdleConfig {
            target: TransportAddr {
                transport: Transport::Tcp,
                addr: SocketAddr::from(([127, 0, 0, 1], 5060)),
            },
            connections: 1000,
            sources: vec![IpAddr::from([127, 0, 0, 1])],
            tls_ca: None,
            tls_server_name: None,
            ping: true,
            parallel: 64,
            timeout: Duration::from_secs(10),
            settle: Duration::from_secs(2),
            hold: Duration::ZERO,
            server_pid: None,
            ready_file: None,
        }
    }
}

impl IdleConfig {
    /// Reject what cannot run, naming the option.
    pub fn validate(&self) -> Result<(), String> {
        match self.target.transport {
            Transport::Tcp => {}
            Transport::Tls if self.tls_ca.is_some() => {}
            Transport::Tls => return Err("--to tls: needs --tls-ca".into()),
            other => return Err(format!("--to: tcp: or tls:, not {}", other.name())),
        }
        if !(1..=MAX_CONNECTIONS).contains(&self.connections) {
            return Err(format!("--connections must be 1..={MAX_CONNECTIONS}"));
        }
        if !(1..=MAX_PARALLEL).contains(&self.parallel) {
            return Err(format!("--parallel must be 1..={MAX_PARALLEL}"));
        }
        if self.sources.is_empty() {
            return Err("--source: give at least one local address".into());
        }
        if let Some(bad) = self
            .sources
            .iter()
            .find(|ip| ip.is_ipv4() != self.target.addr.is_ipv4())
        {
            return Err(format!(
                "--source {bad} is not of the address family of {}",
                self.target.addr
            ));
        }
        if self.timeout.is_zero() || self.timeout > Duration::from_secs(600) {
            return Err("--timeout-s must be 1..=600".into());
        }
        if self.settle > Duration::from_secs(600) || self.hold > Duration::from_secs(86_400) {
            return Err("--settle-s must be at most 600 and --hold-s at most 86400".into());
        }
        Ok(())
    }
}

/// The memory and CPU of a process and its children at one moment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct TreeUsage {
    /// Processes counted (the root and its descendants).
    pub processes: usize,
    /// Sum of `VmRSS` (KiB).
    pub rss_kib: u64,
    /// Sum of `Pss` (KiB); shared pages divided among their users.
    pub pss_kib: u64,
    /// Sum of utime + stime (clock ticks, USER_HZ = 100/s).
    pub cpu_ticks: u64,
}

/// The process `root` and its descendants now (`None`: it is gone).
pub fn tree_usage(root: u32) -> Option<TreeUsage> {
    let mut parent = BTreeMap::new();
    let mut ticks = BTreeMap::new();
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // Fields after the `)` that ends the command name: state, ppid, …
        let Some(rest) = stat.rsplit_once(')').map(|(_, rest)| rest) else {
            continue;
        };
        let fields: Vec<&str> = rest.split_whitespace().collect();
        let number = |i: usize| fields.get(i).and_then(|f| f.parse::<u64>().ok());
        if let (Some(ppid), Some(utime), Some(stime)) = (number(1), number(11), number(12)) {
            parent.insert(pid, ppid as u32);
            ticks.insert(pid, utime + stime);
        }
    }
    if !parent.contains_key(&root) {
        return None;
    }
    let mut members = vec![root];
    let mut grew = true;
    while grew {
        grew = false;
        for (&pid, &ppid) in &parent {
            if members.contains(&ppid) && !members.contains(&pid) {
                members.push(pid);
                grew = true;
            }
        }
    }
    let mut usage = TreeUsage::default();
    for pid in members {
        usage.processes += 1;
        usage.cpu_ticks += ticks.get(&pid).copied().unwrap_or(0);
        usage.rss_kib += kib_field(&format!("/proc/{pid}/status"), "VmRSS:").unwrap_or(0);
        usage.pss_kib += kib_field(&format!("/proc/{pid}/smaps_rollup"), "Pss:").unwrap_or(0);
    }
    Some(usage)
}

/// This process' limit of open files (`Max open files` of
/// /proc/self/limits, the soft one); `None` when unlimited or unreadable.
fn open_files_limit() -> Option<u64> {
    std::fs::read_to_string("/proc/self/limits")
        .ok()?
        .lines()
        .find_map(|line| line.strip_prefix("Max open files"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// The `NAME: N kB` line of a /proc file.
fn kib_field(path: &str, name: &str) -> Option<u64> {
    std::fs::read_to_string(path)
        .ok()?
        .lines()
        .find_map(|line| line.strip_prefix(name))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// What a run did and measured.
#[derive(Clone, Debug, Default, Serialize)]
pub struct IdleSummary {
    /// `tcp` or `tls`.
    pub transport: String,
    /// The server's address.
    pub target: String,
    /// Connections asked for.
    pub connections: usize,
    /// Connections set up (connected, handshaken, pong received with `ping`).
    pub open: usize,
    /// Connections that failed, by stage: `socket`, `bind`, `connect` (our
    /// side, or the connection refused by the kernel), `closed` (the
    /// server closed or reset it after the TCP handshake and before it was
    /// set up: how a server refuses a connection beyond its limits),
    /// `handshake` (a TLS error), `ping`, `timeout`.
    pub failed: BTreeMap<String, u64>,
    /// The first error of each stage (no secrets: socket and TLS errors).
    pub first_errors: BTreeMap<String, String>,
    /// Open connections the server closed before the end.
    pub closed_while_idle: usize,
    /// Seconds from the first connection to the last one set up.
    pub opening_s: f64,
    /// Connections set up per second over the opening phase (TLS: full
    /// handshakes per second, with this client on the same machine).
    pub opened_per_s: f64,
    /// The server's memory and CPU (with `server_pid`).
    pub server: Option<ServerUsage>,
}

/// The server's usage around the run.
#[derive(Clone, Debug, Default, Serialize)]
pub struct ServerUsage {
    /// The process measured.
    pub pid: u32,
    /// Before the first connection.
    pub before: TreeUsage,
    /// When every connection was open (after `settle`).
    pub open: TreeUsage,
    /// After every connection was closed again (after `settle`).
    pub closed: Option<TreeUsage>,
    /// (PSS open − PSS before) / open connections (bytes).
    pub pss_per_connection_bytes: Option<f64>,
    /// (RSS open − RSS before) / open connections (bytes).
    pub rss_per_connection_bytes: Option<f64>,
    /// The server's CPU over the opening phase / connections set up (µs).
    pub cpu_us_per_connection: Option<f64>,
}

impl IdleSummary {
    /// A few lines for a terminal.
    pub fn text(&self) -> String {
        let mut out = format!(
            "{} {}: {} of {} open ({:.1}/s over {:.2} s), {} closed by the server while idle\n",
            self.transport,
            self.target,
            self.open,
            self.connections,
            self.opened_per_s,
            self.opening_s,
            self.closed_while_idle
        );
        for (stage, n) in &self.failed {
            let first = self.first_errors.get(stage).map_or("", String::as_str);
            out.push_str(&format!("  failed at {stage}: {n} (first: {first})\n"));
        }
        if let Some(s) = &self.server {
            let per = |v: Option<f64>| v.map_or("n/a".to_string(), |b| format!("{:.0}", b));
            out.push_str(&format!(
                "  server {}: PSS {} -> {} KiB, RSS {} -> {} KiB: {} B PSS, {} B RSS per connection; CPU {} µs per connection\n",
                s.pid,
                s.before.pss_kib,
                s.open.pss_kib,
                s.before.rss_kib,
                s.open.rss_kib,
                per(s.pss_per_connection_bytes),
                per(s.rss_per_connection_bytes),
                s.cpu_us_per_connection.map_or("n/a".into(), |us| format!("{us:.1}")),
            ));
            if let Some(closed) = &s.closed {
                out.push_str(&format!(
                    "  after closing: PSS {} KiB, RSS {} KiB\n",
                    closed.pss_kib, closed.rss_kib
                ));
            }
        }
        out
    }
}

/// Where one connection is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stage {
    Connecting,
    Handshaking,
    Pinging,
    Open,
    Closed,
}

struct Link {
    stream: mio::net::TcpStream,
    tls: Option<Box<ClientConnection>>,
    stage: Stage,
    deadline: Instant,
    /// Plaintext bytes seen while waiting for the pong (the last two).
    tail: [u8; 2],
}

/// A stage's failure: its label and the error.
type Failure = (&'static str, String);

fn client_config(config: &IdleConfig) -> Result<Option<Arc<ClientConfig>>, String> {
    let Some(ca) = &config.tls_ca else {
        return Ok(None);
    };
    let mut roots = RootCertStore::empty();
    let certs = CertificateDer::pem_file_iter(ca)
        .and_then(|iter| iter.collect::<Result<Vec<_>, _>>())
        .map_err(|e| format!("{}: {e}", ca.display()))?;
    for cert in certs {
        roots
            .add(cert)
            .map_err(|e| format!("{}: {e}", ca.display()))?;
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let client = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(Some(Arc::new(client)))
}

/// A non-blocking connection from `source` (any port) to `target`.
fn open_from(source: IpAddr, target: SocketAddr) -> Result<mio::net::TcpStream, Failure> {
    let socket = Socket::new(
        Domain::for_address(target),
        Type::STREAM,
        Some(Protocol::TCP),
    )
    .map_err(|e| ("socket", e.to_string()))?;
    socket
        .set_nonblocking(true)
        .map_err(|e| ("socket", e.to_string()))?;
    socket
        .bind(&SocketAddr::new(source, 0).into())
        .map_err(|e| ("bind", e.to_string()))?;
    match socket.connect(&target.into()) {
        Ok(()) => {}
        Err(e) if e.raw_os_error() == Some(libc::EINPROGRESS) => {}
        Err(e) => return Err(("connect", e.to_string())),
    }
    Ok(mio::net::TcpStream::from_std(socket.into()))
}

/// Push what rustls has to send; `Ok(())` also when the kernel is full.
fn write_tls(tls: &mut ClientConnection, stream: &mut mio::net::TcpStream) -> std::io::Result<()> {
    while tls.wants_write() {
        match tls.write_tls(stream) {
            Ok(_) => {}
            Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(()),
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

impl Link {
    /// Close it (its slot stays: tokens are indices).
    fn close(&mut self) {
        self.stage = Stage::Closed;
        self.tls = None;
        let _ = self.stream.shutdown(std::net::Shutdown::Both);
    }

    /// Move on as far as the socket allows.
    fn advance(&mut self, ping: bool) -> Result<(), Failure> {
        if self.stage == Stage::Connecting {
            match self.stream.take_error() {
                Ok(None) => {}
                Ok(Some(e)) | Err(e) => return Err(("connect", e.to_string())),
            }
            match self.stream.peer_addr() {
                Ok(_) => {}
                Err(e) if e.kind() == ErrorKind::NotConnected => return Ok(()),
                Err(e) => return Err(("connect", e.to_string())),
            }
            self.stage = if self.tls.is_some() {
                Stage::Handshaking
            } else {
                self.start_ping(ping)?
            };
        }
        if self.stage == Stage::Handshaking {
            let tls = self.tls.as_mut().expect("a TLS link");
            loop {
                // An I/O error here is the server closing or resetting
                // the connection, not a TLS failure.
                write_tls(tls, &mut self.stream).map_err(|e| ("closed", e.to_string()))?;
                if !tls.is_handshaking() {
                    break;
                }
                match tls.read_tls(&mut self.stream) {
                    Ok(0) => return Err(("closed", "during the handshake".into())),
                    Ok(_) => {
                        tls.process_new_packets()
                            .map_err(|e| ("handshake", e.to_string()))?;
                    }
                    Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(()),
                    Err(e) if e.kind() == ErrorKind::Interrupted => {}
                    Err(e) => return Err(("closed", e.to_string())),
                }
            }
            self.stage = self.start_ping(ping)?;
        }
        if matches!(self.stage, Stage::Pinging | Stage::Open) {
            self.drain()?;
        }
        Ok(())
    }

    /// Send the keep-alive ping (or be done).
    fn start_ping(&mut self, ping: bool) -> Result<Stage, Failure> {
        if !ping {
            return Ok(Stage::Open);
        }
        let ping_bytes = b"\r\n\r\n";
        match &mut self.tls {
            Some(tls) => {
                tls.writer()
                    .write_all(ping_bytes)
                    .map_err(|e| ("ping", e.to_string()))?;
                write_tls(tls, &mut self.stream).map_err(|e| ("closed", e.to_string()))?;
            }
            // Four bytes into an empty socket buffer: taken whole.
            None => match self.stream.write(ping_bytes) {
                Ok(4) => {}
                Ok(_) => return Err(("ping", "short write".into())),
                // Reset or closed by the server (EPIPE, ECONNRESET).
                Err(e) => return Err(("closed", e.to_string())),
            },
        }
        Ok(Stage::Pinging)
    }

    /// Read what came (the pong, TLS session tickets); a pong ends the
    /// pinging stage, the end of the stream fails the connection.
    fn drain(&mut self) -> Result<(), Failure> {
        let mut buf = [0u8; 512];
        loop {
            let n = match &mut self.tls {
                None => match self.stream.read(&mut buf) {
                    Ok(0) => return Err(("closed", "by the server".into())),
                    Ok(n) => n,
                    Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(()),
                    Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                    Err(e) => return Err(("closed", e.to_string())),
                },
                Some(tls) => match tls.reader().read(&mut buf) {
                    Ok(0) => return Err(("closed", "close_notify".into())),
                    Ok(n) => n,
                    Err(e) if e.kind() == ErrorKind::WouldBlock => {
                        match tls.read_tls(&mut self.stream) {
                            Ok(0) => return Err(("closed", "by the server".into())),
                            Ok(_) => {
                                tls.process_new_packets()
                                    .map_err(|e| ("closed", e.to_string()))?;
                                continue;
                            }
                            Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(()),
                            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                            Err(e) => return Err(("closed", e.to_string())),
                        }
                    }
                    Err(e) => return Err(("closed", e.to_string())),
                },
            };
            if self.stage == Stage::Pinging {
                let mut seen = self.tail.to_vec();
                seen.extend_from_slice(&buf[..n]);
                if seen.windows(2).any(|w| w == b"\r\n") {
                    self.stage = Stage::Open;
                }
                self.tail = [seen[seen.len() - 2], seen[seen.len() - 1]];
            }
        }
    }
}

/// The tallies of a run.
#[derive(Default)]
struct Tally {
    failed: BTreeMap<String, u64>,
    first_errors: BTreeMap<String, String>,
}

impl Tally {
    fn fail(&mut self, (stage, error): Failure) {
        *self.failed.entry(stage.to_string()).or_default() += 1;
        self.first_errors.entry(stage.to_string()).or_insert(error);
    }
}

/// What the opening phase leaves: every link (open, or closed after a
/// failure), the failures, the connections tried, and the time from the
/// start to the last one that opened.
struct Opened {
    links: Vec<Link>,
    tally: Tally,
    started: usize,
    took: Duration,
}

/// The opening phase: `config.connections` connections, at most
/// `config.parallel` in set-up at a time, each given `config.timeout` to
/// open (handshake and first ping included); ends early when `stop` is
/// set.
fn open_all(
    config: &IdleConfig,
    stop: &AtomicBool,
    (poll, events): (&mut mio::Poll, &mut mio::Events),
    tls: (&Option<Arc<ClientConfig>>, &ServerName<'static>),
) -> anyhow::Result<Opened> {
    let mut links: Vec<Link> = Vec::with_capacity(config.connections);
    let mut tally = Tally::default();
    let mut in_setup: Vec<usize> = Vec::new();
    let mut started = 0usize;
    let begin = Instant::now();
    let mut last_open = begin;
    while (started < config.connections || !in_setup.is_empty()) && !stop.load(Ordering::Relaxed) {
        while in_setup.len() < config.parallel && started < config.connections {
            let source = config.sources[started % config.sources.len()];
            started += 1;
            match start_link(config, source, poll, links.len(), tls)? {
                Ok(link) => {
                    in_setup.push(links.len());
                    links.push(link);
                }
                Err(failure) => tally.fail(failure),
            }
        }
        poll.poll(events, Some(Duration::from_millis(20)))?;
        let now = Instant::now();
        for event in events.iter() {
            let Some(link) = links.get_mut(event.token().0) else {
                continue;
            };
            if link.stage == Stage::Closed {
                continue;
            }
            let was_open = link.stage == Stage::Open;
            if let Err(failure) = link.advance(config.ping) {
                link.close();
                if !was_open {
                    tally.fail(failure);
                }
            }
        }
        in_setup.retain(|&i| {
            let link = &mut links[i];
            match link.stage {
                Stage::Open => {
                    last_open = now;
                    false
                }
                Stage::Closed => false,
                stage if now > link.deadline => {
                    tally.fail(("timeout", format!("{stage:?}")));
                    link.close();
                    false
                }
                _ => true,
            }
        });
    }
    Ok(Opened {
        links,
        tally,
        started,
        took: last_open.duration_since(begin),
    })
}

/// A connection from `source` registered with `poll` as `token`, its TLS
/// client made when `tls` has one: a failure to tally, or an error that
/// ends the run (a TLS client that cannot be made).
fn start_link(
    config: &IdleConfig,
    source: IpAddr,
    poll: &mio::Poll,
    token: usize,
    (client, server_name): (&Option<Arc<ClientConfig>>, &ServerName<'static>),
) -> anyhow::Result<Result<Link, Failure>> {
    let mut stream = match open_from(source, config.target.addr) {
        Ok(stream) => stream,
        Err(failure) => return Ok(Err(failure)),
    };
    if let Err(e) = poll.registry().register(
        &mut stream,
        mio::Token(token),
        mio::Interest::READABLE | mio::Interest::WRITABLE,
    ) {
        return Ok(Err(("socket", e.to_string())));
    }
    let tls = match client {
        Some(client) => Some(Box::new(
            ClientConnection::new(client.clone(), server_name.clone())
                .map_err(|e| anyhow::anyhow!("TLS client: {e}"))?,
        )),
        None => None,
    };
    Ok(Ok(Link {
        stream,
        tls,
        stage: Stage::Connecting,
        deadline: Instant::now() + config.timeout,
        tail: [0; 2],
    }))
}

/// Open the connections, read the server's usage, hold, close, read it
/// again. Stops early (closing everything) when `stop` is set.
pub fn run(config: &IdleConfig, stop: &AtomicBool) -> anyhow::Result<IdleSummary> {
    config.validate().map_err(anyhow::Error::msg)?;
    check_open_files(config.connections)?;
    let client = client_config(config).map_err(anyhow::Error::msg)?;
    let server_name = match &config.tls_server_name {
        Some(name) => ServerName::try_from(name.clone())
            .map_err(|_| anyhow::anyhow!("--tls-server-name {name:?} is not a DNS name or IP"))?,
        None => ServerName::IpAddress(config.target.addr.ip().into()),
    };
    let usage = |pid: Option<u32>| pid.and_then(tree_usage);
    let before = usage(config.server_pid);
    if config.server_pid.is_some() && before.is_none() {
        anyhow::bail!("--server-pid: no such process");
    }
    let mut poll = mio::Poll::new()?;
    let mut events = mio::Events::with_capacity(1024);
    let Opened {
        mut links,
        tally,
        started,
        took: opening,
    } = open_all(
        config,
        stop,
        (&mut poll, &mut events),
        (&client, &server_name),
    )?;
    let open = links.iter().filter(|l| l.stage == Stage::Open).count();
    if let Some(path) = &config.ready_file {
        write_ready(path, started, open, &tally)?;
    }
    let after_opening = usage(config.server_pid);
    wait(
        config.settle,
        stop,
        &mut poll,
        &mut events,
        &mut links,
        config.ping,
    );
    let open_usage = usage(config.server_pid);
    wait(
        config.hold,
        stop,
        &mut poll,
        &mut events,
        &mut links,
        config.ping,
    );
    let closed_while_idle =
        open.saturating_sub(links.iter().filter(|l| l.stage == Stage::Open).count());
    drop(links);
    let closed_usage = if config.server_pid.is_some() && !config.settle.is_zero() {
        std::thread::sleep(config.settle);
        usage(config.server_pid)
    } else {
        None
    };
    let server = match (config.server_pid, before, after_opening, open_usage) {
        (Some(pid), Some(before), Some(after_opening), Some(open_usage)) => Some(server_usage(
            pid,
            [before, after_opening, open_usage],
            closed_usage,
            open,
        )),
        _ => None,
    };
    Ok(IdleSummary {
        transport: config.target.transport.name().to_string(),
        target: config.target.addr.to_string(),
        connections: config.connections,
        open,
        failed: tally.failed,
        first_errors: tally.first_errors,
        closed_while_idle,
        opening_s: opening.as_secs_f64(),
        opened_per_s: if opening.is_zero() {
            0.0
        } else {
            open as f64 / opening.as_secs_f64()
        },
        server,
    })
}

/// Write the opening phase's counts to `path` (whole: written aside, then
/// renamed).
fn write_ready(
    path: &std::path::Path,
    tried: usize,
    open: usize,
    tally: &Tally,
) -> anyhow::Result<()> {
    let text = serde_json::json!({ "tried": tried, "open": open, "failed": tally.failed });
    let aside = path.with_extension("part");
    std::fs::write(&aside, text.to_string())?;
    std::fs::rename(&aside, path)?;
    Ok(())
}

/// Refuse a run that needs more descriptors than the process may open: one
/// per connection, a few for the poll and /proc.
fn check_open_files(connections: usize) -> anyhow::Result<()> {
    if let Some(limit) = open_files_limit() {
        if connections as u64 + 32 > limit {
            anyhow::bail!(
                "{connections} connections need {} open files, the limit is {limit}: raise it (ulimit -n)",
                connections + 32
            );
        }
    }
    Ok(())
}

/// The server's cost per open connection from its usage before the first
/// connection, after the last one opened and while they sat idle.
fn server_usage(
    pid: u32,
    [before, after_opening, open_usage]: [TreeUsage; 3],
    closed_usage: Option<TreeUsage>,
    open: usize,
) -> ServerUsage {
    let per = |delta: i64| (open > 0).then(|| delta as f64 * 1024.0 / open as f64);
    ServerUsage {
        pid,
        before,
        open: open_usage,
        closed: closed_usage,
        pss_per_connection_bytes: per(open_usage.pss_kib as i64 - before.pss_kib as i64),
        rss_per_connection_bytes: per(open_usage.rss_kib as i64 - before.rss_kib as i64),
        cpu_us_per_connection: (open > 0).then(|| {
            after_opening.cpu_ticks.saturating_sub(before.cpu_ticks) as f64 * 10_000.0 / open as f64
        }),
    }
}

/// Keep the connections (reading what comes, noting closes) for `span`.
fn wait(
    span: Duration,
    stop: &AtomicBool,
    poll: &mut mio::Poll,
    events: &mut mio::Events,
    links: &mut [Link],
    ping: bool,
) {
    let end = Instant::now() + span;
    while Instant::now() < end && !stop.load(Ordering::Relaxed) {
        let left = end.saturating_duration_since(Instant::now());
        if poll
            .poll(events, Some(left.min(Duration::from_millis(200))))
            .is_err()
        {
            continue;
        }
        for event in events.iter() {
            if let Some(link) = links.get_mut(event.token().0) {
                if link.stage != Stage::Closed && link.advance(ping).is_err() {
                    link.close();
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validation_names_the_option() {
        let tls = IdleConfig {
            target: "tls:127.0.0.1:5061".parse().unwrap(),
            ..IdleConfig::default()
        };
        assert!(tls.validate().unwrap_err().contains("--tls-ca"));
        let udp = IdleConfig {
            target: "udp:127.0.0.1:5060".parse().unwrap(),
            ..IdleConfig::default()
        };
        assert!(udp.validate().unwrap_err().contains("--to"));
        let family = IdleConfig {
            target: "tcp:[::1]:5060".parse().unwrap(),
            ..IdleConfig::default()
        };
        assert!(family.validate().unwrap_err().contains("--source"));
        let many = IdleConfig {
            connections: MAX_CONNECTIONS + 1,
            ..IdleConfig::default()
        };
        assert!(many.validate().unwrap_err().contains("--connections"));
        assert!(IdleConfig::default().validate().is_ok());
    }

    #[test]
    fn own_process_usage_is_read() {
        let me = tree_usage(std::process::id()).expect("this process");
        assert!(me.processes >= 1);
        assert!(me.rss_kib > 0 && me.pss_kib > 0, "{me:?}");
        assert!(tree_usage(u32::MAX).is_none());
    }

    /// A listener on one thread: the first `answered` connections get a
    /// CRLF pong to their ping, the rest are closed at once.
    fn listener(total: usize, answered: usize) -> (SocketAddr, std::thread::JoinHandle<()>) {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let thread = std::thread::spawn(move || {
            let mut held = Vec::new();
            for i in 0..total {
                let (mut s, _) = listener.accept().unwrap();
                if i >= answered {
                    continue;
                }
                let mut ping = [0u8; 4];
                s.read_exact(&mut ping).unwrap();
                assert_eq!(&ping, b"\r\n\r\n");
                s.write_all(b"\r\n").unwrap();
                held.push(s);
            }
            // Held until the client has counted them.
            std::thread::sleep(Duration::from_millis(500));
        });
        (addr, thread)
    }

    #[test]
    fn connections_are_opened_pinged_and_counted() {
        let (addr, thread) = listener(20, 15);
        let config = IdleConfig {
            target: TransportAddr {
                transport: Transport::Tcp,
                addr,
            },
            connections: 20,
            parallel: 4,
            settle: Duration::ZERO,
            server_pid: Some(std::process::id()),
            ..IdleConfig::default()
        };
        let summary = run(&config, &AtomicBool::new(false)).unwrap();
        thread.join().unwrap();
        assert_eq!(summary.open, 15, "{}", summary.text());
        // Closed before the pong (seen at the read, or at the ping's write).
        assert_eq!(
            summary.failed.values().sum::<u64>(),
            5,
            "{}",
            summary.text()
        );
        let usage = summary.server.expect("own usage read");
        assert!(usage.pss_per_connection_bytes.is_some());
    }
}
