//! Bad input (issue 21): "50,000 idle connections" must leave memory
//! bounded, be counted, never panic and leave other connections
//! unaffected. One process cannot hold 50 000 sockets here (hard limit of
//! open files 20 000, no CAP_SYS_RESOURCE), but several can try 50 000
//! connections together: four `ringway sip idle` processes over TCP and one
//! over TLS, each from its own loopback source address, against a proxy
//! whose bounds lie below its own limit of open files (12 000 connections
//! in all, 2 000 per source address), then one more from four new sources
//! that fills the bound in all. Each attacker sends one CRLF CRLF
//! keep-alive per connection and holds what it gets.
//!
//! Checked, in a private network namespace:
//! - the proxy holds exactly its bounds (2 000 per attacking source, then
//!   12 000 in all) and refuses the rest, counted by reason (`per_ip`,
//!   `limit`): the refusals account for every attempt beyond the bounds;
//! - its memory (PSS and RSS) stays below its resident size before the
//!   flood + the bounds × the per-connection goals (10 KiB TCP,
//!   40 KiB TLS);
//! - a phone registered over TCP from another address (its own flow)
//!   re-registers, and takes 10 calls from a SIPp UAC over a new TCP
//!   connection while the flood is held; once the bound in all is reached
//!   a new connection is refused (counted), but the phone re-registers and
//!   takes calls from SIPp over UDP over its flow;
//! - when the attackers go, the proxy's connections drain to the phone's,
//!   and an attacking address may connect again; the proxy never panics
//!   and exits cleanly.
//!
//! A second test runs a proxy whose limit of open files (600) lies below
//! its bound (16 384, the default) and floods it with 1 500 attempts: the
//! proxy says so at start; out of descriptors it refuses connections at
//! once (counted, reason `descriptors`) instead of leaving them in the
//! kernel's backlog until their clients time out; UDP calls go on; once
//! the attacker goes, a new connection is served.
//!
//! Seen failing: with the per-IP refusal in `Connections::adopt` removed
//! (the per-source bound not enforced), the first phase holds 12 000 and
//! the phone's caller is refused; with a refusal not counted, the
//! accounting fails (see the report of the change that added this test).

mod sip_proxy_support;

use sip_proxy_support::*;
use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Connections the proxy holds in all.
const MAX_CONNECTIONS: u64 = 12_000;
/// Accepted connections per source address.
const PER_IP: u64 = 2_000;
/// The TCP attackers of the first phase (one source each) and their
/// attempts each.
const TCP_SOURCES: [&str; 4] = ["127.0.0.10", "127.0.0.11", "127.0.0.12", "127.0.0.13"];
const TCP_ATTEMPTS: u64 = 11_000;
/// The TLS attacker of the first phase and its attempts.
const TLS_SOURCE: &str = "127.0.0.14";
const TLS_ATTEMPTS: u64 = 2_500;
/// The second phase: one attacker over four sources, filling the bound in
/// all.
const FILL_SOURCES: [&str; 4] = ["127.0.0.20", "127.0.0.21", "127.0.0.22", "127.0.0.23"];
const FILL_ATTEMPTS: u64 = 3_500;
/// The goals per idle connection (bytes).
const TCP_GOAL: u64 = 10 * 1024;
const TLS_GOAL: u64 = 40 * 1024;
const METRICS: &str = "127.0.0.1:9091";
const PHONE: &str = "127.0.0.50:5090";
const CALLER: &str = "127.0.0.51";

fn a(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

/// The soft limit of open files of `pid` ("self" for this process).
fn open_files(pid: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/limits"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("Max open files"))
        .and_then(|rest| rest.split_whitespace().next()?.parse().ok())
        .unwrap_or(u64::MAX)
}

/// `(PSS, RSS)` of `pid` in KiB.
fn memory_kib(pid: u32) -> (u64, u64) {
    let text = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).unwrap();
    let pss = text
        .lines()
        .find_map(|l| l.strip_prefix("Pss:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("Pss");
    (pss, rss_kib(pid))
}

/// A `ringway sip idle` attacker holding what it gets until SIGTERM.
struct Attacker {
    name: String,
    pid: u32,
    ready: PathBuf,
    json: PathBuf,
    attempts: u64,
}

fn attack(
    procs: &mut Procs,
    dir: &Path,
    name: &str,
    to: &str,
    sources: &[&str],
    attempts: u64,
    extra: &[String],
) -> Attacker {
    let ready = dir.join(format!("{name}.ready"));
    let json = dir.join(format!("{name}.json"));
    let mut cmd = Command::new(ringway());
    cmd.args(["sip", "idle", "--to", to])
        .args(["--connections", &attempts.to_string()]);
    for source in sources {
        cmd.args(["--source", source]);
    }
    let child = cmd
        .args(["--parallel", "64", "--timeout-s", "30", "--settle-s", "0"])
        .args(["--hold-s", "600", "--ready-file"])
        .arg(&ready)
        .arg("--json")
        .arg(&json)
        .args(extra)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.join(format!("{name}.err"))).unwrap())
        .spawn()
        .expect("spawn ringway sip idle");
    let pid = procs.add(name, child);
    Attacker {
        name: name.to_string(),
        pid,
        ready,
        json,
        attempts,
    }
}

/// Wait (bounded) until every attacker has tried all its connections.
fn wait_ready(procs: &mut Procs, dir: &Path, attackers: &[&Attacker]) {
    let end = Instant::now() + Duration::from_secs(180);
    for attacker in attackers {
        while !attacker.ready.exists() {
            if let Some(child) = procs.take(attacker.pid) {
                let mut child = child;
                let gone = child.try_wait().unwrap();
                procs.add(&attacker.name, child);
                if let Some(status) = gone {
                    let err = std::fs::read_to_string(dir.join(format!("{}.err", attacker.name)));
                    panic!(
                        "{} exited ({status}) before it was ready: {err:?}",
                        attacker.name
                    );
                }
            }
            assert!(
                Instant::now() < end,
                "{} not ready within 180 s",
                attacker.name
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// Stop an attacker (SIGTERM: it closes its connections and writes its
/// summary); its summary.
fn retreat(procs: &mut Procs, attacker: &Attacker) -> serde_json::Value {
    signal(attacker.pid, "TERM");
    let mut child = procs.take(attacker.pid).expect("attacker child");
    let status = wait_bounded(&mut child, Duration::from_secs(30)).expect("attacker exits");
    assert!(status.success(), "{} exit {status}", attacker.name);
    let text = std::fs::read_to_string(&attacker.json).expect("attacker summary");
    serde_json::from_str(&text).unwrap()
}

/// A sample of the proxy's /metrics.
fn metric(sample: &str) -> u64 {
    prom_value(&scrape(a(METRICS)), sample).unwrap_or(0.0) as u64
}

fn open_gauge(transport: &str) -> String {
    format!("ringway_sip_connections_open{{transport=\"{transport}\"}}")
}

/// Wait (bounded) until the proxy holds `tcp` TCP and `tls` TLS
/// connections; the last reading.
fn wait_open(tcp: u64, tls: u64) -> (u64, u64) {
    let end = Instant::now() + Duration::from_secs(60);
    loop {
        let now = (metric(&open_gauge("tcp")), metric(&open_gauge("tls")));
        if now == (tcp, tls) || Instant::now() > end {
            return now;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A new TCP connection from `source` sends a keep-alive ping: whether
/// the proxy answered it (else it closed or reset the connection).
fn ping_from(source: &str) -> bool {
    let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    socket.bind(&a(&format!("{source}:0")).into()).unwrap();
    socket
        .connect_timeout(&a("127.0.0.1:5060").into(), Duration::from_secs(5))
        .expect("the kernel completes the handshake");
    let mut stream: TcpStream = socket.into();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    if stream.write_all(b"\r\n\r\n").is_err() {
        return false;
    }
    let mut pong = [0u8; 2];
    match stream.read(&mut pong) {
        Ok(2) => &pong == b"\r\n",
        Ok(_) => false,
        Err(e) => {
            assert!(
                !matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut),
                "neither answered nor refused within 10 s"
            );
            false
        }
    }
}

/// `calls` calls from SIPp on `CALLER`:`port` (`transport`: SIPp's `-t`)
/// through the proxy to bob@ringway.test (the phone).
fn call_bob(
    procs: &mut Procs,
    dir: &Path,
    name: &str,
    port: u16,
    transport: &str,
    calls: u32,
) -> SippStats {
    let mut args = uac_args(
        a("127.0.0.1:5060"),
        a(&format!("{CALLER}:{port}")),
        "bob",
        "ringway.test",
        calls,
        10,
    );
    args.extend([
        "-t".to_string(),
        transport.to_string(),
        "-trace_err".to_string(),
    ]);
    let (status, stats) = run_sipp(procs, dir, name, &args, Duration::from_secs(60));
    eprintln!("{name}: {stats:?} exit {status:?}");
    if stats.failed > 0 {
        for entry in std::fs::read_dir(dir).unwrap().flatten() {
            if entry.file_name().to_string_lossy().ends_with("_errors.log") {
                eprintln!(
                    "{:?}: {}",
                    entry.path(),
                    std::fs::read_to_string(entry.path()).unwrap_or_default()
                );
            }
        }
    }
    stats
}

/// Failures of an attacker's connections at `stage`.
fn failed(summary: &serde_json::Value, stage: &str) -> u64 {
    summary["failed"][stage].as_u64().unwrap_or(0)
}

fn row(summary: &serde_json::Value, transport: &str, field: &str) -> u64 {
    summary["tcp"]["by_transport"][transport][field]
        .as_u64()
        .unwrap_or_else(|| panic!("tcp.by_transport.{transport}.{field}: {}", summary["tcp"]))
}

#[test]
fn fifty_thousand_connection_attempts_are_bounded_counted_and_leave_a_phone_working() {
    let needed = TCP_ATTEMPTS + 200;
    if open_files("self") < needed {
        ringway_io::testing::skip(format!(
            "the open files limit {} is below the {needed} one attacker needs (ulimit -n)",
            open_files("self")
        ));
        return;
    }
    in_bed(|procs, d| {
        let certs = proxy_cert_args(d);
        let mut args = strings(&[
            "--listen",
            "127.0.0.1:5060",
            "--listen",
            "tcp:127.0.0.1:5060",
            "--listen",
            "tls:127.0.0.1:5061",
            "--relay",
            "127.0.0.0/8",
            "--mode",
            "stateful",
            "--registrar",
            "--domain",
            "ringway.test",
            "--tcp-max-connections",
            &MAX_CONNECTIONS.to_string(),
            "--tcp-max-connections-per-ip",
            &PER_IP.to_string(),
            "--metrics",
            METRICS,
        ]);
        args.extend(certs);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let proxy = start_proxy_for(procs, d, &args, 600, None);
        let proxy_files = open_files(&proxy.pid.to_string());
        assert!(
            proxy_files > MAX_CONNECTIONS + 100,
            "the proxy's bounds must lie below its open files limit {proxy_files}"
        );

        // The phone registers over its own connection.
        let mut bob = TcpPhone::connect(a(PHONE), a("127.0.0.1:5060"), "bob", "ringway.test");
        assert!(bob.register(Duration::from_secs(10)), "bob registers");
        let base = memory_kib(proxy.pid);

        // Phase 1: four TCP attackers and one TLS attacker, one source
        // each, against the per-source bound.
        let mut attackers = Vec::new();
        for (i, source) in TCP_SOURCES.iter().enumerate() {
            attackers.push(attack(
                procs,
                d,
                &format!("tcp{i}"),
                "tcp:127.0.0.1:5060",
                &[*source],
                TCP_ATTEMPTS,
                &[],
            ));
        }
        let ca = d.join("ca.pem").display().to_string();
        attackers.push(attack(
            procs,
            d,
            "tls",
            "tls:127.0.0.1:5061",
            &[TLS_SOURCE],
            TLS_ATTEMPTS,
            &strings(&["--tls-ca", &ca]),
        ));
        wait_ready(procs, d, &attackers.iter().collect::<Vec<_>>());
        let held_tcp = PER_IP * TCP_SOURCES.len() as u64;
        let phase1 = wait_open(held_tcp + 1, PER_IP);
        assert_eq!(
            phase1,
            (held_tcp + 1, PER_IP),
            "each attacking source holds {PER_IP}, the phone its one"
        );
        // The phone re-registers and takes calls over a new connection
        // while the flood is held.
        assert!(bob.register(Duration::from_secs(10)), "bob re-registers");
        let tcp_calls = call_bob(procs, d, "uac-tcp", 5061, "t1", 10);
        assert_eq!((tcp_calls.successful, tcp_calls.failed), (10, 0));
        // The caller's connection closed again.
        assert_eq!(wait_open(held_tcp + 1, PER_IP), (held_tcp + 1, PER_IP));

        // Phase 2: four more sources fill the bound in all.
        let fill = attack(
            procs,
            d,
            "fill",
            "tcp:127.0.0.1:5060",
            &FILL_SOURCES,
            FILL_ATTEMPTS,
            &[],
        );
        wait_ready(procs, d, &[&fill]);
        let full = wait_open(MAX_CONNECTIONS - PER_IP, PER_IP);
        assert_eq!(full, (MAX_CONNECTIONS - PER_IP, PER_IP), "the bound in all");
        let (pss, rss) = memory_kib(proxy.pid);
        // A new connection is refused now, whatever its source…
        assert!(!ping_from("127.0.0.52"), "refused at the bound in all");
        // …but the phone's flow carries on: it re-registers, and takes
        // calls from SIPp over UDP.
        assert!(bob.register(Duration::from_secs(10)), "bob re-registers");
        let udp_calls = call_bob(procs, d, "uac-udp", 5062, "u1", 5);
        assert_eq!((udp_calls.successful, udp_calls.failed), (5, 0));
        assert!(
            bob.counts
                .answered
                .load(std::sync::atomic::Ordering::Relaxed)
                >= 15
        );

        // The attackers go: the proxy's connections drain to the phone's.
        let mut summaries = Vec::new();
        for attacker in attackers.iter().chain([&fill]) {
            summaries.push((attacker.attempts, retreat(procs, attacker)));
        }
        assert_eq!(wait_open(1, 0), (1, 0), "drained to the phone's flow");
        // An attacking source may connect again (its count went back).
        assert!(ping_from(TCP_SOURCES[0]), "a pong after the flood");
        let after = memory_kib(proxy.pid);
        assert!(bob.register(Duration::from_secs(10)), "bob re-registers");
        drop(bob);
        let summary = stop_proxy(procs, &proxy);
        eprintln!(
            "proxy memory (PSS, RSS KiB): before {base:?}, at the bound {:?}, after {after:?}",
            (pss, rss)
        );
        eprintln!("proxy tcp: {}", summary["tcp"]);
        eprintln!("proxy tls: {}", summary["tls"]);

        // Never panicked.
        assert_eq!(
            summary["threads_panicked"],
            serde_json::json!([]),
            "{summary}"
        );
        // Bounded memory: the bounds times the goals over the base.
        let bound_kib = |base_kib: u64| {
            base_kib + ((MAX_CONNECTIONS - PER_IP) * TCP_GOAL + PER_IP * TLS_GOAL) / 1024
        };
        assert!(
            pss <= bound_kib(base.0),
            "PSS {pss} KiB > {} KiB",
            bound_kib(base.0)
        );
        assert!(
            rss <= bound_kib(base.1),
            "RSS {rss} KiB > {} KiB",
            bound_kib(base.1)
        );

        // Every attempt is accounted for: held by an attacker (as the
        // proxy counts it, accepted) or refused, by reason.
        let mut attempts = [0u64; 2];
        let mut open = [0u64; 2];
        let mut refused_seen = [0u64; 2];
        let mut lost = 0;
        for (i, (tried, s)) in summaries.iter().enumerate() {
            eprintln!("attacker {i}: {s}");
            let t = usize::from(s["transport"] == "tls");
            attempts[t] += tried;
            open[t] += s["open"].as_u64().unwrap();
            refused_seen[t] += failed(s, "closed");
            // Attempts that may never have reached the proxy's accept.
            lost += failed(s, "timeout") + failed(s, "connect");
            assert_eq!(failed(s, "handshake"), 0, "{s}");
        }
        assert!(
            lost * 100 <= attempts[0] + attempts[1],
            "{lost} attempts failed before the proxy saw them"
        );
        assert_eq!(attempts[0] + attempts[1], 50_000);
        assert_eq!(open[1], PER_IP, "the TLS attacker holds its bound");
        assert_eq!(
            open[0],
            MAX_CONNECTIONS - PER_IP - 1,
            "the TCP attackers hold the rest but the phone's"
        );
        let refused =
            |t: &str| row(&summary, t, "refused_per_ip") + row(&summary, t, "refused_limit");
        for (t, name) in [(0, "tcp"), (1, "tls")] {
            let beyond = attempts[t] - open[t];
            // The phone's registration, the caller's connection and the
            // two probes are the TCP row's own: 1 refused (the probe at
            // the bound in all).
            let own_refused = u64::from(t == 0);
            assert!(
                refused(name) >= beyond.saturating_sub(lost) + own_refused
                    && refused(name) <= beyond + own_refused,
                "{name}: {} refused for {beyond} attempts beyond the bounds ({lost} lost)",
                refused(name)
            );
            assert!(refused_seen[t] + lost >= beyond, "{name}: {refused_seen:?}");
        }
        // By reason: the first phase hit the per-source bound only, the
        // second (and the probe) the bound in all.
        let per_source_beyond = TCP_SOURCES.len() as u64 * (TCP_ATTEMPTS - PER_IP);
        assert!(row(&summary, "tcp", "refused_per_ip") + lost >= per_source_beyond);
        assert!(row(&summary, "tcp", "refused_per_ip") <= per_source_beyond);
        assert_eq!(row(&summary, "tls", "refused_limit"), 0);
        let fill_beyond = FILL_ATTEMPTS - (MAX_CONNECTIONS - PER_IP - 1 - held_tcp);
        // (More: the probe at the bound in all is one.)
        assert!(row(&summary, "tcp", "refused_limit") + lost > fill_beyond);
        assert!(row(&summary, "tcp", "refused_limit") <= fill_beyond + 1);
        assert!(tls_counter(&summary, "handshakes") >= PER_IP);
        // And the proxy answered every held connection's keep-alive.
        assert!(row(&summary, "tcp", "pings") >= open[0]);
    });
}

/// The proxy's limit of open files in the second test, and the attempts.
const FEW_FILES: u64 = 600;
const FEW_FILES_ATTEMPTS: u64 = 1_500;

#[test]
fn out_of_descriptors_connections_are_refused_at_once_and_counted() {
    in_bed(|procs, d| {
        let proxy = start_proxy_for(
            procs,
            d,
            &[
                "--listen",
                "127.0.0.1:5060",
                "--listen",
                "tcp:127.0.0.1:5060",
                "--relay",
                "127.0.0.0/8",
                "--tcp-max-connections-per-ip",
                "10000",
                "--metrics",
                METRICS,
            ],
            300,
            Some(FEW_FILES),
        );
        assert!(
            proxy
                .startup
                .iter()
                .any(|l| l.contains("open files limit 600")),
            "a warning at start: {:?}",
            proxy.startup
        );
        start_loopback_uas(procs, d);
        let attacker = attack(
            procs,
            d,
            "few-files",
            "tcp:127.0.0.1:5060",
            &[TCP_SOURCES[0]],
            FEW_FILES_ATTEMPTS,
            &[],
        );
        wait_ready(procs, d, &[&attacker]);
        // (Not from /metrics: its server has no descriptor to answer with
        // either.)
        let ready: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&attacker.ready).unwrap()).unwrap();
        let held = ready["open"].as_u64().unwrap();
        assert!(
            held > FEW_FILES / 2 && held < FEW_FILES,
            "{held} held with {FEW_FILES} descriptors"
        );
        // Out of descriptors: a new connection is refused at once (not
        // left waiting: `ping_from` fails the test after 10 s), UDP calls
        // go on.
        assert!(!ping_from("127.0.0.52"), "refused");
        let (status, calls) = run_loopback_calls(procs, d, "uac-udp", 5, 10);
        assert!(status.is_some_and(|s| s.success()), "{calls:?}");
        assert_eq!((calls.successful, calls.failed), (5, 0));
        let s = retreat(procs, &attacker);
        eprintln!("attacker: {s}");
        assert_eq!(wait_open(0, 0), (0, 0), "drained");
        assert!(
            ping_from(TCP_SOURCES[0]),
            "a pong once descriptors are free"
        );
        let summary = stop_proxy(procs, &proxy);
        eprintln!("proxy tcp: {}", summary["tcp"]);
        let open = s["open"].as_u64().unwrap();
        let lost = failed(&s, "timeout") + failed(&s, "connect");
        assert_eq!(lost, 0, "no attempt left waiting: {s}");
        let refused = row(&summary, "tcp", "refused_descriptors");
        // Every attempt beyond what the descriptors held, and the probe.
        assert_eq!(refused, FEW_FILES_ATTEMPTS - open + 1, "{}", summary["tcp"]);
        assert_eq!(failed(&s, "closed"), FEW_FILES_ATTEMPTS - open, "{s}");
        assert_eq!(row(&summary, "tcp", "refused_limit"), 0);
        assert_eq!(
            summary["threads_panicked"],
            serde_json::json!([]),
            "{summary}"
        );
    });
}
