//! Next hops given as names (RFC 3263) against a real DNS server: Debian's
//! dnsmasq, started by the test in its private network namespace (only
//! `lo`; no DNS leaves it) with NAPTR, SRV and A records from a config the
//! test writes. `sip.test` has two SRV targets: `down.sip.test`
//! (priority 10, 127.0.0.21: nothing listens there) and `up.sip.test`
//! (priority 20, 127.0.0.22: a `ringway sip proxy` in front of a SIPp UAS).
//!
//! Addresses: dnsmasq 127.0.0.53:53, the dispatcher 127.0.0.10:5060 (its
//! metrics on :9100), the UAS 127.0.0.30:5070, the UAC 127.0.0.40:5061.

mod sip_proxy_support;

use sip_proxy_support::*;
use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, TcpStream, UdpSocket};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const DNS: &str = "127.0.0.53:53";
const DISPATCH: &str = "127.0.0.10:5060";
const METRICS: &str = "127.0.0.10:9100";
const DOWN: &str = "127.0.0.21:5060";
const UP: &str = "127.0.0.22:5060";
const UAS: &str = "127.0.0.30:5070";
const UAC: &str = "127.0.0.40:5061";

fn a(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

/// dnsmasq on [`DNS`] serving only the `test` domain (nothing
/// forwarded, no hosts file), answers with a TTL of `ttl` seconds, then
/// `records`.
fn zone(ttl: u32, records: &str) -> String {
    format!(
        "listen-address=127.0.0.53\nbind-interfaces\nport=53\nno-resolv\nno-hosts\nno-poll\n\
         local=/test/\nlocal-ttl={ttl}\n{records}"
    )
}

/// The dispatcher's records: NAPTR → SRV (two targets, the first down) → A.
const RECORDS: &str = r#"naptr-record=sip.test,10,10,"S","SIP+D2U","",_sip._udp.sip.test
srv-host=_sip._udp.sip.test,down.sip.test,5060,10,1
srv-host=_sip._udp.sip.test,up.sip.test,5060,20,1
host-record=down.sip.test,127.0.0.21
host-record=up.sip.test,127.0.0.22
"#;

/// Start dnsmasq with [`RECORDS`] (TTL 60 s) and wait (bounded) until it answers.
fn start_dnsmasq(procs: &mut Procs, dir: &Path) -> u32 {
    start_dnsmasq_with(procs, dir, &zone(60, RECORDS))
}

/// Start dnsmasq serving `zone` and wait (bounded) until it answers.
fn start_dnsmasq_with(procs: &mut Procs, dir: &Path, zone: &str) -> u32 {
    let conf = dir.join("dnsmasq.conf");
    std::fs::write(&conf, zone).unwrap();
    let child = Command::new("dnsmasq")
        .arg("--keep-in-foreground")
        .arg(format!("--conf-file={}", conf.display()))
        .args([
            "--pid-file=",
            "--user=root",
            "--log-facility=-",
            "--log-queries",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn dnsmasq (Debian package dnsmasq-base; scripts/install-deps.sh)");
    let pid = procs.add("dnsmasq", child);
    let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
    socket
        .set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let mut query = Vec::new();
    ringway_server::dns::wire::write_query(
        7,
        "up.sip.test",
        ringway_server::dns::wire::RecordType::A,
        &mut query,
    )
    .unwrap();
    let end = Instant::now() + Duration::from_secs(20);
    let mut buf = [0u8; 512];
    loop {
        assert!(Instant::now() < end, "dnsmasq did not answer");
        let _ = socket.send_to(&query, DNS);
        if socket.recv(&mut buf).is_ok() {
            return pid;
        }
    }
}

/// Whether dnsmasq is missing (then the test skips visibly; under CI it fails).
fn dnsmasq_missing() -> bool {
    if Command::new("dnsmasq").arg("--version").output().is_err() {
        ringway_io::testing::skip("dnsmasq is not installed (scripts/install-deps.sh)");
        assert!(
            std::env::var("CI").is_err(),
            "dnsmasq must be installed in CI"
        );
        return true;
    }
    false
}

/// Stop dnsmasq `old` and start it again serving `zone` (a record
/// changed); returns the new PID.
fn restart_dnsmasq(procs: &mut Procs, dir: &Path, old: u32, zone: &str) -> u32 {
    let mut old = procs.take(old).unwrap();
    let _ = old.kill();
    let _ = old.wait();
    start_dnsmasq_with(procs, dir, zone)
}

/// A running dispatcher: PID, stderr lines, the summary path.
struct Dispatch {
    pid: u32,
    stderr: mpsc::Receiver<String>,
    summary: std::path::PathBuf,
}

fn spawn_dispatch(procs: &mut Procs, dir: &Path, relay: &str) -> Dispatch {
    spawn_dispatch_to(procs, dir, relay, "sip.test")
}

fn spawn_dispatch_to(procs: &mut Procs, dir: &Path, relay: &str, proxy: &str) -> Dispatch {
    let summary = dir.join(format!("dispatch-{relay}.json").replace('/', "_"));
    let mut child = Command::new(ringway())
        .args(["sip", "dispatch", "--listen", DISPATCH, "--proxy", proxy])
        .args(["--dns-server", DNS, "--relay", relay, "--metrics", METRICS])
        .args(["--probe-interval-ms", "100", "--probe-failures", "3"])
        .args(["--backend", "socket", "--duration", "120", "--quiet"])
        .arg("--summary")
        .arg(&summary)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn ringway sip dispatch");
    let err = child.stderr.take().unwrap();
    let pid = procs.add("dispatch", child);
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(err).lines().map_while(Result::ok) {
            eprintln!("[dispatch] {line}");
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    Dispatch {
        pid,
        stderr: rx,
        summary,
    }
}

/// Stop the dispatcher with SIGINT and wait (bounded) until it exits.
fn stop_dispatch(procs: &mut Procs, dispatch: &Dispatch) {
    signal(dispatch.pid, "INT");
    let mut child = procs.take(dispatch.pid).unwrap();
    wait_bounded(&mut child, Duration::from_secs(15)).expect("dispatcher exits");
}

/// `count` SIPp calls (at 10/s, UAC named `name` on [`UAC`]) to
/// `bob@domain` through `to`.
fn sipp_calls(
    procs: &mut Procs,
    dir: &Path,
    to: &str,
    domain: &str,
    name: &str,
    count: u32,
) -> SippStats {
    run_sipp(
        procs,
        dir,
        name,
        &uac_args(a(to), a(UAC), "bob", domain, count, 10),
        Duration::from_secs(90),
    )
    .1
}

/// One call at a time through `to` (UACs `uac-after-N`), every 200 ms,
/// until one completes or 30 s pass: the last call's statistics and the
/// number of tries.
fn until_a_call_completes(
    procs: &mut Procs,
    dir: &Path,
    to: &str,
    domain: &str,
) -> (SippStats, u32) {
    let end = Instant::now() + Duration::from_secs(30);
    let mut tries = 0;
    loop {
        tries += 1;
        let stats = sipp_calls(procs, dir, to, domain, &format!("uac-after-{tries}"), 1);
        if stats.successful == 1 || Instant::now() > end {
            return (stats, tries);
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Wait (bounded) for a stderr line containing `needle`; all lines seen.
fn wait_line(lines: &mpsc::Receiver<String>, needle: &str) -> Result<(), Vec<String>> {
    let end = Instant::now() + Duration::from_secs(20);
    let mut seen = Vec::new();
    while let Ok(line) = lines.recv_timeout(end.saturating_duration_since(Instant::now())) {
        let found = line.contains(needle);
        seen.push(line);
        if found {
            return Ok(());
        }
    }
    Err(seen)
}

/// The dispatcher resolves `sip.test` through NAPTR and SRV to both
/// targets in priority order; the first is down, so its probes go
/// unanswered, it goes out, and every SIPp call completes through the
/// second (a retransmission of an INVITE first hashed to the dead one is
/// re-hashed once it is out: the dispatcher keeps no transaction).
#[test]
fn calls_complete_through_the_second_srv_target_when_the_first_is_down() {
    if dnsmasq_missing() {
        return;
    }
    let (calls, metrics, summary) = netns(|| {
        let dir = tempfile::tempdir().unwrap();
        let mut procs = Procs::default();
        start_dnsmasq(&mut procs, dir.path());
        let _proxy = start_proxy(
            &mut procs,
            dir.path(),
            &["--listen", UP, "--relay", "127.0.0.0/8"],
        );
        spawn_sipp(&mut procs, dir.path(), &uas_args(a(UAS)));
        let dispatch = spawn_dispatch(&mut procs, dir.path(), "127.0.0.0/8");
        wait_line(&dispatch.stderr, "listening on").expect("dispatcher started");
        let calls = sipp_calls(&mut procs, dir.path(), DISPATCH, UAS, "uac", 20);
        // The down target is out once its probes went unanswered.
        let end = Instant::now() + Duration::from_secs(20);
        let metrics = loop {
            let text = scrape(a(METRICS));
            let out = prom_value(
                &text,
                &format!("ringway_dispatch_proxy_up{{proxy=\"{DOWN}\"}}"),
            );
            if out == Some(0.0) || Instant::now() > end {
                break text;
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        stop_dispatch(&mut procs, &dispatch);
        let summary: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&dispatch.summary).unwrap()).unwrap();
        (calls, metrics, summary)
    });
    assert_eq!((calls.successful, calls.failed), (20, 0), "{calls:?}");
    // NAPTR → SRV in priority order → A.
    assert_eq!(summary["config"]["proxies"], serde_json::json!([DOWN, UP]));
    let value = |name: &str| prom_value(&metrics, name).unwrap_or_else(|| panic!("{name}"));
    assert_eq!(
        value(&format!("ringway_dispatch_proxy_up{{proxy=\"{DOWN}\"}}")),
        0.0
    );
    assert_eq!(
        value(&format!("ringway_dispatch_proxy_up{{proxy=\"{UP}\"}}")),
        1.0
    );
    // At start, then once a second again (from the cache: TTL 60 s).
    assert!(value("ringway_dns_lookups_total") >= 1.0);
    assert_eq!(
        value("ringway_dns_cache_misses_total"),
        4.0,
        "NAPTR, SRV, A, A, once"
    );
    assert_eq!(value("ringway_dns_failures_total"), 0.0);
    assert!(value("ringway_dns_failovers_total") >= 1.0);
    assert!(
        value(&format!(
            "ringway_dispatch_proxy_requests_total{{proxy=\"{UP}\"}}"
        )) >= 20.0
    );
}

/// The relay policy applies to what a name resolves to: `sip.test` points
/// at loopback, which stays refused unless `--relay` names it, so the
/// dispatcher refuses to start and says why.
#[test]
fn a_name_resolving_to_loopback_is_refused_without_relay() {
    if dnsmasq_missing() {
        return;
    }
    let (status, lines) = netns(|| {
        let dir = tempfile::tempdir().unwrap();
        let mut procs = Procs::default();
        start_dnsmasq(&mut procs, dir.path());
        let dispatch = spawn_dispatch(&mut procs, dir.path(), "none");
        let mut child = procs.take(dispatch.pid).unwrap();
        let status = wait_bounded(&mut child, Duration::from_secs(20));
        let lines: Vec<String> = dispatch.stderr.iter().collect();
        (status, lines)
    });
    let status = status.expect("the dispatcher exits");
    assert!(!status.success());
    assert!(
        lines
            .iter()
            .any(|l| l.contains("no resolved address the relay policy allows")),
        "{lines:?}"
    );
}

/// The proxy's zone: `gw.test` by NAPTR and SRV to a target that answers
/// every call 503 (priority 10) and to the UAS (priority 20); `flip.test`
/// by A to `flip` with a 1 s TTL; `up.sip.test` for the readiness probe;
/// `other.test` at 127.0.0.24; `tcp.test` by NAPTR (`SIP+D2T`) and SRV
/// `_sip._tcp` to a closed TCP port (priority 10) and to the UAS over TCP
/// (priority 20); `udp.test` (`SIP+D2U`) to a UDP port where nothing
/// listens (priority 10) and to the UAS (priority 20).
fn proxy_zone(flip: &str) -> String {
    let records = format!(
        r#"naptr-record=gw.test,10,10,"S","SIP+D2U","",_sip._udp.gw.test
srv-host=_sip._udp.gw.test,busy.gw.test,5060,10,1
srv-host=_sip._udp.gw.test,uas.gw.test,5070,20,1
host-record=busy.gw.test,127.0.0.23
host-record=uas.gw.test,127.0.0.30
host-record=flip.test,{flip}
host-record=up.sip.test,127.0.0.22
host-record=other.test,127.0.0.24
naptr-record=tcp.test,10,10,"S","SIP+D2T","",_sip._tcp.tcp.test
srv-host=_sip._tcp.tcp.test,closed.tcp.test,5090,10,1
srv-host=_sip._tcp.tcp.test,uas.tcp.test,5070,20,1
host-record=closed.tcp.test,127.0.0.23
host-record=uas.tcp.test,127.0.0.30
naptr-record=udp.test,10,10,"S","SIP+D2U","",_sip._udp.udp.test
srv-host=_sip._udp.udp.test,closed.udp.test,5090,10,1
srv-host=_sip._udp.udp.test,uas.udp.test,5070,20,1
host-record=closed.udp.test,127.0.0.23
host-record=uas.udp.test,127.0.0.30
"#
    );
    zone(1, &records)
}

const PROXY: &str = "127.0.0.10:5060";
const PROXY_METRICS: &str = "127.0.0.10:9100";

/// A SIPp UAS on `addr` that answers every INVITE 503.
fn busy_uas(procs: &mut Procs, dir: &Path, addr: &str) -> u32 {
    let addr = a(addr);
    spawn_sipp(
        procs,
        dir,
        &strings(&[
            "-sf",
            &scenarios().join("uas_busy.xml").display().to_string(),
            "-i",
            &addr.ip().to_string(),
            "-p",
            &addr.port().to_string(),
        ]),
    )
}

/// A UAS answering 503 on `busy` ([`busy_uas`]), the UAS on [`UAS`], then
/// the stateful proxy on [`PROXY`] resolving names with [`DNS`], relaying
/// to loopback, with `extra` (its next hop).
fn busy_uas_then_proxy(procs: &mut Procs, dir: &Path, busy: &str, extra: &[&str]) -> ProxyProc {
    busy_uas(procs, dir, busy);
    spawn_sipp(procs, dir, &uas_args(a(UAS)));
    let mut args = vec![
        "--listen",
        PROXY,
        "--mode",
        "stateful",
        "--dns-server",
        DNS,
        "--relay",
        "127.0.0.0/8",
    ];
    args.extend_from_slice(extra);
    start_proxy(procs, dir, &args)
}

/// The proxy's `--route-to gw.test` (RFC 3263: NAPTR → SRV → A, resolved
/// per request on resolver threads, then from the cache): the first SRV
/// target answers every call 503, so each INVITE moves on to the second
/// target (a new branch) and every call completes there. Without the
/// failover every call fails with the first target's 503.
#[test]
fn the_proxy_fails_over_to_the_next_srv_target_on_503() {
    if dnsmasq_missing() {
        return;
    }
    let (calls, metrics) = netns(|| {
        let dir = tempfile::tempdir().unwrap();
        let mut procs = Procs::default();
        start_dnsmasq_with(&mut procs, dir.path(), &proxy_zone("127.0.0.30"));
        let proxy = busy_uas_then_proxy(
            &mut procs,
            dir.path(),
            "127.0.0.23:5060",
            &["--route-to", "gw.test", "--metrics", PROXY_METRICS],
        );
        let calls = sipp_calls(&mut procs, dir.path(), PROXY, "example.com", "uac", 10);
        let metrics = scrape(a(PROXY_METRICS));
        stop_proxy(&mut procs, &proxy);
        (calls, metrics)
    });
    assert_eq!((calls.successful, calls.failed), (10, 0), "{calls:?}");
    let value = |name: &str| prom_value(&metrics, name).unwrap_or_else(|| panic!("{name}"));
    // Every INVITE went to the busy target first, then to the UAS.
    assert!(value("ringway_sip_failovers_total") >= 10.0, "{metrics}");
    // The first call's name was not cached: parked, resolved off the worker.
    assert!(value("ringway_sip_names_parked_total") >= 1.0);
    assert!(value("ringway_dns_lookups_total") >= 1.0);
    assert_eq!(value("ringway_sip_names_unavailable_total"), 0.0);
    assert!(
        value("ringway_dns_lookups_total") + value("ringway_dns_cached_lookups_total") >= 10.0,
        "a lookup per request, from the cache once warm"
    );
}

/// A target changed in DNS is picked up without a reload once its TTL
/// ran out: `--route-to flip.test:5070` first resolves to a target that
/// answers 503 (calls fail), dnsmasq is restarted with `flip.test` at the
/// UAS, and calls complete within a few seconds (TTL 1 s). With an answer
/// kept past its TTL, calls would go on failing.
#[test]
fn the_proxy_picks_up_a_target_changed_in_dns_when_its_ttl_expires() {
    if dnsmasq_missing() {
        return;
    }
    let (before, after, tries) = netns(|| {
        let dir = tempfile::tempdir().unwrap();
        let mut procs = Procs::default();
        let dns = start_dnsmasq_with(&mut procs, dir.path(), &proxy_zone("127.0.0.23"));
        let proxy = busy_uas_then_proxy(
            &mut procs,
            dir.path(),
            "127.0.0.23:5070",
            &["--route-to", "flip.test:5070"],
        );
        let before = sipp_calls(
            &mut procs,
            dir.path(),
            PROXY,
            "example.com",
            "uac-before",
            3,
        );
        // The record changes: dnsmasq restarted with the new zone.
        restart_dnsmasq(&mut procs, dir.path(), dns, &proxy_zone("127.0.0.30"));
        let (after, tries) = until_a_call_completes(&mut procs, dir.path(), PROXY, "example.com");
        stop_proxy(&mut procs, &proxy);
        (before, after, tries)
    });
    assert_eq!((before.successful, before.failed), (0, 3), "{before:?}");
    assert_eq!(
        (after.successful, after.failed),
        (1, 0),
        "{after:?} after {tries} tries"
    );
}

/// The dispatcher's `--proxy flip.test:5060` is looked at again once its
/// TTL (1 s) ran out: dnsmasq is restarted with `flip.test` at a second
/// proxy and the first proxy stopped, and calls complete through the
/// second without a reload. With the set resolved at start only, the
/// first proxy goes out and every call gets 503 (no proxy in).
#[test]
fn the_dispatcher_picks_up_a_proxy_changed_in_dns_when_its_ttl_expires() {
    if dnsmasq_missing() {
        return;
    }
    let (before, after, tries, metrics) = netns(|| {
        let dir = tempfile::tempdir().unwrap();
        let mut procs = Procs::default();
        let dns = start_dnsmasq_with(&mut procs, dir.path(), &proxy_zone("127.0.0.22"));
        spawn_sipp(&mut procs, dir.path(), &uas_args(a(UAS)));
        let first = start_proxy(
            &mut procs,
            dir.path(),
            &["--listen", UP, "--relay", "127.0.0.0/8"],
        );
        let _second = start_proxy(
            &mut procs,
            dir.path(),
            &["--listen", "127.0.0.24:5060", "--relay", "127.0.0.0/8"],
        );
        let dispatch = spawn_dispatch_to(&mut procs, dir.path(), "127.0.0.0/8", "flip.test:5060");
        wait_line(&dispatch.stderr, "listening on").expect("dispatcher started");
        let before = sipp_calls(&mut procs, dir.path(), DISPATCH, UAS, "uac-before", 3);
        restart_dnsmasq(&mut procs, dir.path(), dns, &proxy_zone("127.0.0.24"));
        stop_proxy(&mut procs, &first);
        let (after, tries) = until_a_call_completes(&mut procs, dir.path(), DISPATCH, UAS);
        let metrics = scrape(a(METRICS));
        stop_dispatch(&mut procs, &dispatch);
        (before, after, tries, metrics)
    });
    assert_eq!((before.successful, before.failed), (3, 0), "{before:?}");
    assert_eq!(
        (after.successful, after.failed),
        (1, 0),
        "{after:?} after {tries} tries"
    );
    let value = |name: &str| prom_value(&metrics, name).unwrap_or_else(|| panic!("{name}"));
    assert!(value("ringway_dispatch_proxy_requests_total{proxy=\"127.0.0.24:5060\"}") >= 1.0);
    // Counters taken over by the replacement: the first calls still count.
    assert!(
        value("ringway_dispatch_requests_forwarded_total{by=\"hash\"}") >= 4.0,
        "{metrics}"
    );
}

/// Ten SIPp calls through a stateful proxy whose `--route-to` is
/// `route_to` (resolved by dnsmasq to a dead first target and the UAS), the
/// UAC giving each message 8 s (`-recv_timeout`), well under timer B
/// (32 s): without an immediate failover every call would fail. Over TCP
/// (`tcp`) the UAS and the proxy listen on TCP too. Returns the UAC's
/// counts and the proxy's metrics.
fn failover_calls(route_to: &'static str, tcp: bool) -> (SippStats, String) {
    netns(move || {
        let dir = tempfile::tempdir().unwrap();
        let mut procs = Procs::default();
        start_dnsmasq_with(&mut procs, dir.path(), &proxy_zone("127.0.0.30"));
        let mut uas = uas_args(a(UAS));
        if tcp {
            uas.extend(["-t".to_string(), "t1".to_string()]);
        }
        spawn_sipp(&mut procs, dir.path(), &uas);
        // A TCP UAS listens before the first call (bounded).
        let end = Instant::now() + Duration::from_secs(20);
        while tcp && TcpStream::connect_timeout(&a(UAS), Duration::from_millis(200)).is_err() {
            assert!(Instant::now() < end, "the SIPp UAS did not listen on TCP");
            std::thread::sleep(Duration::from_millis(50));
        }
        let tcp_listen = format!("tcp:{PROXY}");
        let mut args = vec!["--listen", PROXY];
        if tcp {
            args.extend(["--listen", tcp_listen.as_str()]);
        }
        args.extend([
            "--mode",
            "stateful",
            "--route-to",
            route_to,
            "--dns-server",
            DNS,
            "--relay",
            "127.0.0.0/8",
            "--metrics",
            PROXY_METRICS,
        ]);
        let proxy = start_proxy(&mut procs, dir.path(), &args);
        let mut uac = uac_args(a(PROXY), a(UAC), "bob", "example.com", 10, 10);
        uac.extend(["-recv_timeout".to_string(), "8000".to_string()]);
        // SIPp's own account of a failed call (its errors log, in `dir`).
        uac.push("-trace_err".to_string());
        let calls = run_sipp(&mut procs, dir.path(), "uac", &uac, Duration::from_secs(90)).1;
        let metrics = scrape(a(PROXY_METRICS));
        stop_proxy(&mut procs, &proxy);
        if calls.failed > 0 {
            // What went wrong is gone with the directory after the test:
            // print it now (shown with the failing test's output).
            for entry in std::fs::read_dir(dir.path()).unwrap().flatten() {
                let name = entry.file_name().to_string_lossy().into_owned();
                if name.ends_with("errors.log") {
                    let text = std::fs::read_to_string(entry.path()).unwrap_or_default();
                    let from = (text.len().saturating_sub(6000)..text.len())
                        .find(|i| text.is_char_boundary(*i))
                        .unwrap_or(text.len());
                    let tail = &text[from..];
                    eprintln!("--- {name} (last 6000 bytes) ---\n{tail}");
                }
            }
            eprintln!("--- the proxy's metrics ---\n{metrics}");
        }
        (calls, metrics)
    })
}

/// RFC 3263 4.3 on a transport error: `--route-to tcp:tcp.test` resolves
/// (NAPTR `SIP+D2T`, SRV `_sip._tcp`) to a first target whose TCP port is
/// closed (the connection is refused) and to a SIPp UAS over TCP. Each
/// INVITE moves on to the UAS as soon as the connection is refused; with
/// the refusal not reaching the transaction, it would wait for timer B.
#[test]
fn the_proxy_fails_over_at_once_when_the_first_target_refuses_the_connection() {
    if dnsmasq_missing() {
        return;
    }
    let (calls, metrics) = failover_calls("tcp:tcp.test", true);
    assert_eq!((calls.successful, calls.failed), (10, 0), "{calls:?}");
    let value = |name: &str| prom_value(&metrics, name).unwrap_or_else(|| panic!("{name}"));
    // Every INVITE was refused at the first target and moved on.
    assert!(
        value("ringway_sip_transport_errors_total") >= 10.0,
        "{metrics}"
    );
    assert!(value("ringway_sip_failovers_total") >= 10.0, "{metrics}");
    assert!(
        value("ringway_sip_transport_undelivered_total{outcome=\"reported\"}") >= 10.0,
        "{metrics}"
    );
    assert_eq!(value("ringway_sip_transactions_timed_out_total"), 0.0);
}

/// RFC 3263 4.3 and RFC 3261 18.4 over UDP: `--route-to udp.test`
/// resolves (NAPTR `SIP+D2U`, SRV `_sip._udp`) to a first target whose UDP
/// port has no listener, so the kernel answers each INVITE sent there
/// with an ICMP port unreachable (inside the namespace's `lo`), and to a
/// SIPp UAS. The proxy's sockets have `IP_RECVERR`: it reads the error
/// from the socket's error queue and moves each INVITE waiting at that
/// destination on to the UAS at once; without the ICMP path the INVITE
/// would wait at the dead target until timer B.
#[test]
fn the_proxy_fails_over_at_once_when_the_first_udp_target_is_unreachable() {
    if dnsmasq_missing() {
        return;
    }
    let (calls, metrics) = failover_calls("udp.test", false);
    assert_eq!((calls.successful, calls.failed), (10, 0), "{calls:?}");
    let value = |name: &str| prom_value(&metrics, name).unwrap_or_else(|| panic!("{name}"));
    // Every INVITE met the port unreachable at the first target and moved on.
    assert!(
        value("ringway_sip_icmp_unreachable_total") >= 1.0,
        "{metrics}"
    );
    assert!(
        value("ringway_sip_transport_errors_total") >= 10.0,
        "{metrics}"
    );
    assert!(value("ringway_sip_failovers_total") >= 10.0, "{metrics}");
    assert_eq!(value("ringway_sip_transactions_timed_out_total"), 0.0);
}

/// `ringway ctl --socket SOCKET --json ARGS…`, parsed.
fn ctl_json(socket: &Path, args: &[&str]) -> serde_json::Value {
    let out = Command::new(ringway())
        .arg("ctl")
        .arg("--socket")
        .arg(socket)
        .arg("--json")
        .args(args)
        .output()
        .expect("run ringway ctl");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "ctl {args:?}: {text}");
    serde_json::from_str(&text).expect("ctl --json prints JSON")
}

/// The dispatcher's targets in force (`ctl targets`), sorted.
fn target_addresses(socket: &Path) -> Vec<String> {
    let mut list: Vec<String> = ctl_json(socket, &["targets"])["targets"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["address"].as_str().unwrap().to_string())
        .collect();
    list.sort();
    list
}

/// A DNS refresh does not undo a reload: the dispatcher starts with
/// `proxy = ["flip.test:5060"]` (127.0.0.22, TTL 1 s) from its config
/// file; a reload changes the list to `["other.test:5060"]`
/// (127.0.0.24); once the names were looked up again past their TTL (the
/// resolver's cache misses grew twice), the targets are still the
/// reloaded set. A refresh starting from the list the dispatcher started
/// with would put 127.0.0.22 back within a second.
#[test]
fn a_dns_refresh_does_not_undo_a_dispatcher_reload() {
    if dnsmasq_missing() {
        return;
    }
    let (before, after, misses, report) = netns(|| {
        let dir = tempfile::tempdir().unwrap();
        let mut procs = Procs::default();
        start_dnsmasq_with(&mut procs, dir.path(), &proxy_zone("127.0.0.22"));
        let config = dir.path().join("dispatch.toml");
        let write = |proxy: &str| {
            std::fs::write(
                &config,
                format!(
                    "[sip.dispatch]\nlisten = \"{DISPATCH}\"\nproxy = [\"{proxy}\"]\n\
dns-server = \"{DNS}\"\nrelay = \"127.0.0.0/8\"\nprobe-interval-ms = 100\n"
                ),
            )
            .unwrap()
        };
        write("flip.test:5060");
        let socket = dir.path().join("dispatch.sock");
        let dispatch = start_dispatcher(
            &mut procs,
            dir.path(),
            &[
                "--config",
                config.to_str().unwrap(),
                "--manage-socket",
                socket.to_str().unwrap(),
                "--metrics",
                METRICS,
            ],
        );
        let before = target_addresses(&socket);
        write("other.test:5060");
        let report = ctl_json(&socket, &["reload"]);
        let misses = |text: &str| prom_value(text, "ringway_dns_cache_misses_total").unwrap_or(0.0);
        let at_reload = misses(&scrape(a(METRICS)));
        // Two refreshes that asked the nameserver again (TTL 1 s).
        let end = Instant::now() + Duration::from_secs(20);
        let refreshed = loop {
            let now = misses(&scrape(a(METRICS)));
            if now >= at_reload + 2.0 || Instant::now() > end {
                break now - at_reload;
            }
            std::thread::sleep(Duration::from_millis(100));
        };
        let after = target_addresses(&socket);
        stop_proxy(&mut procs, &dispatch);
        (before, after, refreshed, report)
    });
    assert_eq!(before, ["127.0.0.22:5060"]);
    assert_eq!(report["applied"], serde_json::json!(["proxy"]), "{report}");
    assert!(
        misses >= 2.0,
        "names looked up again after the reload: {misses}"
    );
    assert_eq!(after, ["127.0.0.24:5060"], "the reloaded set stays");
}
