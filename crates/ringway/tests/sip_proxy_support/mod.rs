//! Shared helpers of the `sip_proxy_*` integration tests: a private network
//! namespace per test, child processes killed by PID on drop, the proxy
//! started/stopped with its JSON summary, SIPp runs with parsed statistics.
#![allow(dead_code)]

#[path = "../promtool_common/mod.rs"]
mod promtool_common;
#[allow(unused_imports)]
pub(crate) use promtool_common::assert_promtool_accepts;
mod flows;
#[allow(unused_imports)]
pub(crate) use flows::*;
mod tls;
#[allow(unused_imports)]
pub(crate) use tls::*;
mod phone;
#[allow(unused_imports)]
pub(crate) use phone::*;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// The lower-case name of a header line (`Via: ...` gives `via`).
pub(crate) fn header_name(line: &str) -> String {
    line.split(':')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase()
}

/// The `ringway` binary under test: this build's, or `RINGWAY_BIN` (also
/// `RINGWAY_TEST_BIN`), to run a test against another build, e.g. to see it
/// fail on an older one.
pub(crate) fn ringway() -> &'static str {
    static BIN: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    BIN.get_or_init(|| {
        std::env::var("RINGWAY_BIN")
            .or_else(|_| std::env::var("RINGWAY_TEST_BIN"))
            .unwrap_or_else(|_| env!("CARGO_BIN_EXE_ringway").to_string())
    })
}

/// bench/sip (SIPp scenarios).
pub(crate) fn scenarios() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../bench/sip")
}

/// Run `f` inside a fresh network namespace with only `lo` (no DNS, no real network).
pub(crate) fn netns<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    ringway_io::netns::in_private_netns(f).expect("create private network namespace (needs root)")
}

/// Run `f` in a fresh private namespace (see [`netns`]) with a temporary
/// directory and a [`Procs`] guard: the children are killed before the
/// directory goes.
pub(crate) fn in_bed<T: Send + 'static>(
    f: impl FnOnce(&mut Procs, &Path) -> T + Send + 'static,
) -> T {
    netns(move || {
        let dir = tempfile::tempdir().unwrap();
        let mut procs = Procs::default();
        f(&mut procs, dir.path())
    })
}

/// [`in_bed`] with the proxy started with `args` before `f` runs and
/// stopped after it: returns the proxy's JSON summary and what `f` returned.
pub(crate) fn with_proxy<T: Send + 'static>(
    args: &[&str],
    f: impl FnOnce(&mut Procs, &Path) -> T + Send + 'static,
) -> (serde_json::Value, T) {
    let args = strings(args);
    in_bed(move |procs, dir| {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let proxy = start_proxy(procs, dir, &args);
        let out = f(procs, dir);
        (stop_proxy(procs, &proxy), out)
    })
}

/// The loopback test bed's proxy: it listens on 127.0.0.1:5060 and relays
/// to 127.0.0.0/8, where every UA of the bed is (docs/security.md).
pub(crate) const LOOPBACK_PROXY: [&str; 4] =
    ["--listen", "127.0.0.1:5060", "--relay", "127.0.0.0/8"];

/// [`LOOPBACK_PROXY`] followed by `extra`.
pub(crate) fn loopback_proxy_args<'a>(extra: &[&'a str]) -> Vec<&'a str> {
    let mut args = LOOPBACK_PROXY.to_vec();
    args.extend_from_slice(extra);
    args
}

/// [`with_proxy`] with the loopback bed's proxy ([`LOOPBACK_PROXY`] + `extra`).
pub(crate) fn with_loopback_proxy<T: Send + 'static>(
    extra: &[&str],
    f: impl FnOnce(&mut Procs, &Path) -> T + Send + 'static,
) -> (serde_json::Value, T) {
    with_proxy(&loopback_proxy_args(extra), f)
}

/// Start the loopback bed's proxy ([`LOOPBACK_PROXY`] + `extra`).
pub(crate) fn start_loopback_proxy(procs: &mut Procs, dir: &Path, extra: &[&str]) -> ProxyProc {
    start_proxy(procs, dir, &loopback_proxy_args(extra))
}

/// A SIPp command line built step by step (the options keep the order of
/// the calls).
#[derive(Debug, Clone)]
pub(crate) struct Sipp {
    args: Vec<String>,
}

impl Sipp {
    /// SIPp sending to `remote` with the scenario `scenario` of bench/sip.
    pub(crate) fn client(remote: impl std::fmt::Display, scenario: &str) -> Self {
        Sipp {
            args: vec![
                remote.to_string(),
                "-sf".into(),
                scenarios().join(scenario).display().to_string(),
            ],
        }
    }

    /// SIPp waiting for requests with the scenario `scenario` of bench/sip
    /// (a UAS).
    pub(crate) fn server(scenario: &str) -> Self {
        Sipp {
            args: vec![
                "-sf".into(),
                scenarios().join(scenario).display().to_string(),
            ],
        }
    }

    /// One option or value as it is.
    pub(crate) fn arg(mut self, arg: impl ToString) -> Self {
        self.args.push(arg.to_string());
        self
    }

    /// `-s service`: the Request-URI's user part.
    pub(crate) fn service(self, service: &str) -> Self {
        self.arg("-s").arg(service)
    }

    /// `-key name value`: a scenario's `[name]`.
    pub(crate) fn key(self, name: &str, value: &str) -> Self {
        self.arg("-key").arg(name).arg(value)
    }

    /// `-au user -ap password -auth_uri uri`: answers to digest challenges
    /// (SIPp's default digest-uri is its remote address; it adds "sip:").
    pub(crate) fn digest(self, user: &str, password: &str, uri: &str) -> Self {
        self.arg("-au")
            .arg(user)
            .arg("-ap")
            .arg(password)
            .arg("-auth_uri")
            .arg(uri)
    }

    /// `-i ip -p port`: SIPp's own address.
    pub(crate) fn local(self, ip: &str, port: impl ToString) -> Self {
        self.arg("-i").arg(ip).arg("-p").arg(port)
    }

    /// `-m calls`: stop after that many calls.
    pub(crate) fn calls(self, calls: u32) -> Self {
        self.arg("-m").arg(calls)
    }

    /// `-r rate`: calls per second.
    pub(crate) fn rate(self, rate: u32) -> Self {
        self.arg("-r").arg(rate)
    }

    /// `-timeout seconds -timeout_error`: a run that takes longer fails.
    pub(crate) fn timeout(self, seconds: u32) -> Self {
        self.arg("-timeout").arg(seconds).arg("-timeout_error")
    }

    /// The arguments.
    pub(crate) fn build(self) -> Vec<String> {
        self.args
    }
}

/// One REGISTER of `aor`@ringway.test → `contact` from SIPp on
/// 127.0.0.1:`port` to the proxy on 127.0.0.1:5060 with `scenario`
/// (register.xml, register_auth.xml…); add [`Sipp::digest`] and
/// [`Sipp::timeout`] as the test needs.
pub(crate) fn register_sipp(scenario: &str, aor: &str, contact: &str, port: &str) -> Sipp {
    Sipp::client("127.0.0.1:5060", scenario)
        .service(aor)
        .key("domain", "ringway.test")
        .key("contact", contact)
        .local("127.0.0.1", port)
        .calls(1)
}

/// Children killed by PID (SIGKILL) and reaped when dropped, even on panic.
#[derive(Default)]
pub(crate) struct Procs {
    kids: Vec<(String, Child)>,
}

impl Procs {
    /// Take ownership of `c`.
    pub(crate) fn add(&mut self, name: &str, c: Child) -> u32 {
        let pid = c.id();
        self.kids.push((name.to_string(), c));
        pid
    }

    /// Remove and return the child `pid`.
    pub(crate) fn take(&mut self, pid: u32) -> Option<Child> {
        let i = self.kids.iter().position(|(_, c)| c.id() == pid)?;
        Some(self.kids.remove(i).1)
    }
}

impl Drop for Procs {
    fn drop(&mut self) {
        for (_, c) in &mut self.kids {
            let _ = c.kill();
        }
        for (_, c) in &mut self.kids {
            let _ = c.wait();
        }
    }
}

/// Send `sig` (e.g. "TERM", "INT") to `pid`.
pub(crate) fn signal(pid: u32, sig: &str) {
    let _ = Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(pid.to_string())
        .status();
}

/// Wait for `c` to exit for at most `limit`; kill it (SIGKILL) after that.
pub(crate) fn wait_bounded(c: &mut Child, limit: Duration) -> Option<ExitStatus> {
    let end = Instant::now() + limit;
    while Instant::now() < end {
        if let Ok(Some(st)) = c.try_wait() {
            return Some(st);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = c.kill();
    let _ = c.wait();
    None
}

/// A running `ringway sip proxy`.
pub(crate) struct ProxyProc {
    /// PID (the child itself sits in the [`Procs`] guard).
    pub pid: u32,
    /// Where the summary JSON goes.
    pub summary: PathBuf,
    /// stderr lines collected so far.
    pub stderr: mpsc::Receiver<String>,
    /// Startup lines (stderr before "listening on").
    pub startup: Vec<String>,
}

/// Start the proxy with `args` (plus --summary/--quiet/--duration) and wait until it listens.
pub(crate) fn start_proxy(procs: &mut Procs, dir: &Path, args: &[&str]) -> ProxyProc {
    start_server(procs, dir, "proxy", args, 120, None)
}

/// [`start_proxy`] for a test that needs the proxy longer than 120 s
/// (`--duration seconds`), with its limit of open files (soft and hard)
/// set to `open_files` if given (by `prlimit`, util-linux).
pub(crate) fn start_proxy_for(
    procs: &mut Procs,
    dir: &Path,
    args: &[&str],
    seconds: u32,
    open_files: Option<u64>,
) -> ProxyProc {
    start_server(procs, dir, "proxy", args, seconds, open_files)
}

/// Start `ringway sip dispatch` with `args` (plus --summary/--quiet/--duration)
/// and wait until it listens.
pub(crate) fn start_dispatcher(procs: &mut Procs, dir: &Path, args: &[&str]) -> ProxyProc {
    start_server(procs, dir, "dispatch", args, 120, None)
}

/// `ringway sip COMMAND ARGS…`, once it says it listens.
fn start_server(
    procs: &mut Procs,
    dir: &Path,
    command: &str,
    args: &[&str],
    seconds: u32,
    open_files: Option<u64>,
) -> ProxyProc {
    static STARTED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = STARTED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let summary = dir.join(format!("summary-{command}-{n}.json"));
    let mut c = match open_files {
        // prlimit sets the limits and executes the command (same PID).
        Some(n) => {
            let mut c = Command::new("prlimit");
            c.arg(format!("--nofile={n}:{n}")).arg("--").arg(ringway());
            c
        }
        None => Command::new(ringway()),
    };
    let mut c = c
        .args(["sip", command])
        .args(args)
        .args(["--duration", &seconds.to_string(), "--quiet", "--summary"])
        .arg(&summary)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn ringway sip proxy/dispatch");
    let err = c.stderr.take().unwrap();
    let pid = procs.add("ringway", c);
    let (tx, rx) = mpsc::channel();
    let tag = format!("{command} {pid}");
    std::thread::spawn(move || {
        for line in BufReader::new(err).lines().map_while(Result::ok) {
            eprintln!("[{tag}] {line}");
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut startup = Vec::new();
    let end = Instant::now() + Duration::from_secs(20);
    loop {
        let left = end.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(l) => {
                let done = l.contains("listening on");
                startup.push(l);
                if done {
                    break;
                }
            }
            Err(_) => panic!("{command} did not start: {startup:?}"),
        }
    }
    ProxyProc {
        pid,
        summary,
        stderr: rx,
        startup,
    }
}

/// Stop the proxy with SIGINT (at once; SIGTERM drains first, see
/// `sip_proxy_manage.rs`) and return its JSON summary.
pub(crate) fn stop_proxy(procs: &mut Procs, p: &ProxyProc) -> serde_json::Value {
    signal(p.pid, "INT");
    let mut c = procs.take(p.pid).expect("proxy child");
    let st = wait_bounded(&mut c, Duration::from_secs(15)).expect("proxy exits on SIGINT");
    assert!(st.success(), "proxy exit status {st}");
    let text = std::fs::read_to_string(&p.summary).expect("summary file written");
    serde_json::from_str(&text).expect("summary is JSON")
}

/// Start a SIPp process in the background (e.g. a UAS).
pub(crate) fn spawn_sipp(procs: &mut Procs, dir: &Path, args: &[String]) -> u32 {
    let c = Command::new("sipp")
        .args(args)
        .args(["-nostdin"])
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn sipp (Debian package sip-tester)");
    procs.add("sipp", c)
}

/// Statistics SIPp wrote with -trace_stat.
#[derive(Debug, Clone, Default)]
pub(crate) struct SippStats {
    /// Successful calls.
    pub successful: u64,
    /// Failed calls.
    pub failed: u64,
    /// Retransmissions SIPp made.
    pub retransmissions: u64,
}

/// Parse the last line of a SIPp -trace_stat CSV.
pub(crate) fn parse_sipp_csv(text: &str) -> Option<SippStats> {
    let mut lines = text.lines().filter(|l| !l.trim().is_empty());
    let head: Vec<&str> = lines.next()?.split(';').collect();
    let last: Vec<&str> = lines.next_back()?.split(';').collect();
    let get = |name: &str| -> Option<u64> {
        let i = head.iter().position(|h| *h == name)?;
        last.get(i)?.trim().parse().ok()
    };
    Some(SippStats {
        successful: get("SuccessfulCall(C)")?,
        failed: get("FailedCall(C)")?,
        retransmissions: get("Retransmissions(C)").unwrap_or(0),
    })
}

/// Run SIPp to completion (bounded by `limit`); returns exit status and stats.
pub(crate) fn run_sipp(
    procs: &mut Procs,
    dir: &Path,
    name: &str,
    args: &[String],
    limit: Duration,
) -> (Option<ExitStatus>, SippStats) {
    let pid = spawn_sipp_with_stats(procs, dir, name, args);
    finish_sipp(procs, dir, name, pid, limit)
}

/// Standard SIPp arguments for a UAS on `addr` with the Record-Route-aware scenario.
pub(crate) fn uas_args(addr: SocketAddr) -> Vec<String> {
    vec![
        "-sf".into(),
        scenarios().join("uas_rr.xml").display().to_string(),
        "-i".into(),
        addr.ip().to_string(),
        "-p".into(),
        addr.port().to_string(),
    ]
}

/// SIPp UAC arguments: `calls` calls at `rate`/s through `proxy` to `dest` (R-URI host part).
pub(crate) fn uac_args(
    proxy: SocketAddr,
    local: SocketAddr,
    service: &str,
    dest: &str,
    calls: u32,
    rate: u32,
) -> Vec<String> {
    Sipp::client(proxy, "uac_rr.xml")
        .service(service)
        .key("dest", dest)
        .local(&local.ip().to_string(), local.port())
        .calls(calls)
        .rate(rate)
        // Call hold 200 ms: with a shared socket two workers could otherwise
        // reorder a call's ACK and BYE when one of them is descheduled.
        .arg("-d")
        .arg(200)
        .timeout(40)
        .build()
}

/// The loopback test bed's SIPp UAS (`127.0.0.1:5070`), given 300 ms to bind.
pub(crate) fn start_loopback_uas(procs: &mut Procs, dir: &Path) -> u32 {
    let pid = spawn_sipp(procs, dir, &uas_args(loopback("127.0.0.1:5070")));
    std::thread::sleep(Duration::from_millis(300));
    pid
}

/// `calls` calls at `rate`/s from SIPp on `127.0.0.1:5061` through the proxy
/// on `127.0.0.1:5060` to `bob@127.0.0.1:5070` (the loopback UAS), bounded by 60 s.
pub(crate) fn run_loopback_calls(
    procs: &mut Procs,
    dir: &Path,
    name: &str,
    calls: u32,
    rate: u32,
) -> (Option<ExitStatus>, SippStats) {
    let args = uac_args(
        loopback("127.0.0.1:5060"),
        loopback("127.0.0.1:5061"),
        "bob",
        "127.0.0.1:5070",
        calls,
        rate,
    );
    run_sipp(procs, dir, name, &args, Duration::from_secs(60))
}

fn loopback(text: &str) -> SocketAddr {
    text.parse().expect("a socket address")
}

/// Resident set size of `pid` in KiB.
pub(crate) fn rss_kib(pid: u32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    s.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS")
}

/// GET http://addr/metrics and return the body.
pub(crate) fn scrape(addr: SocketAddr) -> String {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).expect("connect metrics");
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    write!(s, "GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n").unwrap();
    let mut r = String::new();
    s.read_to_string(&mut r).expect("read metrics");
    let (head, body) = r.split_once("\r\n\r\n").expect("HTTP response");
    assert!(head.starts_with("HTTP/1.0 200"), "{head}");
    body.to_string()
}

/// Value of an unlabelled or exactly-labelled sample `name` in Prometheus text.
pub(crate) fn prom_value(text: &str, name_with_labels: &str) -> Option<f64> {
    text.lines().find_map(|l| {
        l.strip_prefix(name_with_labels)?
            .strip_prefix(' ')?
            .trim()
            .parse()
            .ok()
    })
}

/// Sum of all samples of metric `name` (any labels).
pub(crate) fn prom_sum(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| {
            l.strip_prefix(name)
                .is_some_and(|r| r.starts_with(' ') || r.starts_with('{'))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// `summary.by_type[t].<field>` as u64 (0 when absent).
pub(crate) fn type_count(summary: &serde_json::Value, t: &str, field: &str) -> u64 {
    summary["by_type"][t][field].as_u64().unwrap_or(0)
}

/// Start SIPp in the background writing statistics (e.g. a UAS with `-m`
/// whose statistics are wanted); finish it with [`finish_sipp`].
pub(crate) fn spawn_sipp_with_stats(
    procs: &mut Procs,
    dir: &Path,
    name: &str,
    args: &[String],
) -> u32 {
    let csv = dir.join(format!("{name}.csv"));
    let c = Command::new("sipp")
        .args(args)
        .args(["-nostdin", "-trace_stat", "-fd", "1", "-stf"])
        .arg(&csv)
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn sipp (Debian package sip-tester)");
    procs.add(name, c)
}

/// Wait (bounded) for a SIPp started by [`spawn_sipp_with_stats`] and
/// return its exit status and statistics.
pub(crate) fn finish_sipp(
    procs: &mut Procs,
    dir: &Path,
    name: &str,
    pid: u32,
    limit: Duration,
) -> (Option<ExitStatus>, SippStats) {
    let mut c = procs.take(pid).expect("sipp child");
    let st = wait_bounded(&mut c, limit);
    let csv = dir.join(format!("{name}.csv"));
    let text = std::fs::read_to_string(&csv).unwrap_or_default();
    let stats =
        parse_sipp_csv(&text).unwrap_or_else(|| panic!("no SIPp statistics in {}", csv.display()));
    (st, stats)
}

/// Strings as owned arguments.
pub(crate) fn strings(args: &[&str]) -> Vec<String> {
    args.iter().map(|s| s.to_string()).collect()
}

/// SIPp UAC arguments for `calls` calls at 1 call per 1000/`rate` ms from
/// alice@ringway.test (password `secret`, the sample htdigest file) to bob
/// at the UAS on 127.0.0.1:5070, through the proxy on 127.0.0.1:5060,
/// answering its challenges (`uac_auth.xml`); call hold `hold_ms`.
pub(crate) fn uac_auth_args(calls: u32, rate: u32, hold_ms: Option<u32>) -> Vec<String> {
    let mut sipp = Sipp::client("127.0.0.1:5060", "uac_auth.xml")
        .service("bob")
        .key("dest", "127.0.0.1:5070")
        .key("caller", "alice")
        .key("domain", "ringway.test")
        .digest("alice", "secret", "bob@127.0.0.1:5070")
        .local("127.0.0.1", 5061)
        .calls(calls)
        .rate(rate);
    if let Some(hold) = hold_ms {
        sipp = sipp.arg("-d").arg(hold);
    }
    sipp.timeout(30).build()
}

/// Connections the summary `s` counts closed for `reason` (`tcp.closed`).
pub(crate) fn tcp_closed(s: &serde_json::Value, reason: &str) -> u64 {
    s["tcp"]["closed"]
        .as_array()
        .expect("tcp.closed")
        .iter()
        .find(|pair| pair[0] == reason)
        .and_then(|pair| pair[1].as_u64())
        .unwrap_or(0)
}

/// `--tls-cert`/`--tls-key` of the proxy certificate [`make_proxy_certs`]
/// makes in `dir` (made here).
pub(crate) fn proxy_cert_args(dir: &Path) -> Vec<String> {
    make_proxy_certs(dir);
    vec![
        "--tls-cert".into(),
        dir.join("proxy.pem").display().to_string(),
        "--tls-key".into(),
        dir.join("proxy.key").display().to_string(),
    ]
}

/// A CA (`ca.pem`, `ca.key`) and one proxy certificate (`proxy.pem`,
/// `proxy.key`) naming each of these IP addresses, for servers on several
/// addresses.
pub(crate) fn make_certs_for_ips(dir: &Path, ips: &[&str]) {
    make_ca(dir);
    make_cert_for(dir, "proxy", "proxy", ips, &[]);
}
