//! SIP over TLS through `ringway sip proxy`, against real peers in a
//! private network namespace (only `lo`), with certificates made at test
//! time by the openssl CLI:
//!
//! - SIPp (Debian's has no TLS) through stunnel: SIPp UAC → stunnel →
//!   TLS → proxy → TLS → stunnel → SIPp UAS, in both modes, the stateful
//!   one with mutual TLS on both sides (the proxy verifies the client's
//!   certificate and presents its own to the UAS side).
//! - Python's ssl module: TLS 1.0 and 1.1 refused (and counted as failed
//!   handshakes), 1.2 and 1.3 served, the certificate chosen by SNI.
//! - Certificate reload on SIGHUP and when the files change: a connection
//!   opened before keeps working, a new one gets the new certificate.

mod sip_proxy_support;

use sip_proxy_support::*;
use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const CALLS: u32 = 20;

fn a(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

fn run(cmd: &mut Command) {
    let out = cmd.output().expect("run openssl (Debian package openssl)");
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A test CA (`ca.pem`, `ca.key`) in `dir`.
fn make_ca(dir: &Path) {
    run(Command::new("openssl")
        .args(["req", "-x509", "-newkey", "ec", "-pkeyopt"])
        .args(["ec_paramgen_curve:prime256v1", "-nodes", "-days", "2"])
        .args(["-subj", "/CN=ringway-test-ca", "-keyout", "ca.key", "-out"])
        .args(["ca.pem", "-addext", "basicConstraints=critical,CA:TRUE"])
        .args(["-addext", "keyUsage=critical,keyCertSign"])
        .current_dir(dir));
}

/// A certificate `NAME.pem` / `NAME.key` signed by the test CA, for
/// 127.0.0.1 and the DNS names given, with common name `cn`.
fn make_cert(dir: &Path, name: &str, cn: &str, dns: &[&str]) -> (PathBuf, PathBuf) {
    let mut san = "subjectAltName=IP:127.0.0.1".to_string();
    for d in dns {
        san.push_str(&format!(",DNS:{d}"));
    }
    std::fs::write(
        dir.join(format!("{name}.ext")),
        format!("{san}\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth,clientAuth\n"),
    )
    .unwrap();
    run(Command::new("openssl")
        .args([
            "req",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
        ])
        .args(["-nodes", "-subj", &format!("/CN={cn}")])
        .args(["-keyout", &format!("{name}.key.new")])
        .args(["-out", &format!("{name}.csr")])
        .current_dir(dir));
    run(Command::new("openssl")
        .args(["x509", "-req", "-in", &format!("{name}.csr")])
        .args([
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "2",
        ])
        .args(["-extfile", &format!("{name}.ext")])
        .args(["-out", &format!("{name}.pem.new")])
        .current_dir(dir));
    // Renamed into place (a reload never sees half a file).
    let (cert, key) = (
        dir.join(format!("{name}.pem")),
        dir.join(format!("{name}.key")),
    );
    std::fs::rename(dir.join(format!("{name}.key.new")), &key).unwrap();
    std::fs::rename(dir.join(format!("{name}.pem.new")), &cert).unwrap();
    (cert, key)
}

fn tls_counter(s: &serde_json::Value, name: &str) -> u64 {
    s["tls"][name]
        .as_u64()
        .unwrap_or_else(|| panic!("tls.{name} in {}", s["tls"]))
}

/// `CALLS` calls SIPp UAC (TCP) → stunnel client (6060) → TLS → proxy
/// (tls:5061) → TLS → stunnel server (5071) → SIPp UAS (TCP 5070).
fn calls_over_tls(mode: &'static str, mutual: bool) -> (serde_json::Value, SippStats) {
    netns(move || {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        make_ca(d);
        make_cert(d, "proxy", "proxy", &["proxy.test"]);
        make_cert(d, "peer", "peer", &[]);
        let mut procs = Procs::default();
        let mut args = vec![
            "--listen",
            "127.0.0.1:5060",
            "--listen",
            "tls:127.0.0.1:5061",
            "--relay",
            "127.0.0.0/8",
            "--mode",
            mode,
            "--tls-cert",
            "proxy.pem",
            "--tls-key",
            "proxy.key",
            "--tls-ca",
            "ca.pem",
        ];
        if mutual {
            args.push("--tls-verify-clients");
        }
        let args: Vec<String> = args
            .iter()
            .map(|s| {
                if s.ends_with(".pem") || s.ends_with(".key") {
                    d.join(s).display().to_string()
                } else {
                    s.to_string()
                }
            })
            .collect();
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let p = start_proxy(&mut procs, d, &args);
        assert!(
            p.startup.iter().any(|l| l.contains("tls:127.0.0.1:5061")),
            "{:?}",
            p.startup
        );
        // The UAC side: a client certificate only with mutual TLS.
        let client_cert = if mutual {
            "cert = peer.pem\nkey = peer.key\n"
        } else {
            ""
        };
        spawn_stunnel(
            &mut procs,
            d,
            "stunnel-uac",
            &format!(
                "[uac]\nclient = yes\naccept = 127.0.0.1:6060\nconnect = 127.0.0.1:5061\n\
                 CAfile = ca.pem\nverifyChain = yes\ncheckIP = 127.0.0.1\n{client_cert}"
            ),
        );
        // The UAS side: with mutual TLS it wants the proxy's certificate.
        let verify_proxy = if mutual {
            "CAfile = ca.pem\nverifyChain = yes\n"
        } else {
            ""
        };
        spawn_stunnel(
            &mut procs,
            d,
            "stunnel-uas",
            &format!(
                "[uas]\naccept = 127.0.0.1:5071\nconnect = 127.0.0.1:5070\n\
                 cert = peer.pem\nkey = peer.key\n{verify_proxy}"
            ),
        );
        let mut uas = uas_args(a("127.0.0.1:5070"));
        uas.extend(["-t".into(), "t1".into()]);
        // Its Contact names the TLS address stunnel gives it, as a TLS
        // UAS's would.
        let scenario = std::fs::read_to_string(scenarios().join("uas_rr.xml"))
            .unwrap()
            .replace(
                "<sip:[local_ip]:[local_port];transport=[transport]>",
                "<sip:127.0.0.1:5071;transport=tls>",
            );
        std::fs::write(d.join("uas_tls.xml"), scenario).unwrap();
        let sf = uas.iter().position(|arg| arg == "-sf").unwrap() + 1;
        uas[sf] = d.join("uas_tls.xml").display().to_string();
        spawn_sipp(&mut procs, d, &uas);
        wait_listening("127.0.0.1:6060");
        wait_listening("127.0.0.1:5071");
        wait_listening("127.0.0.1:5070");
        let mut uac = uac_args(
            a("127.0.0.1:6060"),
            a("127.0.0.1:5062"),
            "bob",
            "127.0.0.1:5071;transport=tls",
            CALLS,
            20,
        );
        uac.extend(["-t".into(), "t1".into()]);
        // SIPp speaks TCP to stunnel but writes its Via as a TLS client
        // would (SIPp's own `[transport]` would say TCP).
        let scenario = std::fs::read_to_string(scenarios().join("uac_rr.xml"))
            .unwrap()
            .replace("SIP/2.0/[transport]", "SIP/2.0/TLS");
        std::fs::write(d.join("uac_tls.xml"), scenario).unwrap();
        let sf = uac.iter().position(|arg| arg == "-sf").unwrap() + 1;
        uac[sf] = d.join("uac_tls.xml").display().to_string();
        let (st, stats) = run_sipp(&mut procs, d, "uac", &uac, Duration::from_secs(60));
        let summary = stop_proxy(&mut procs, &p);
        eprintln!("sipp: {stats:?} exit {st:?}");
        for log in ["stunnel-uac.log", "stunnel-uas.log"] {
            let text = std::fs::read_to_string(d.join(log)).unwrap_or_default();
            eprintln!("--- {log}\n{text}");
        }
        (summary, stats)
    })
}

fn check_calls(s: &serde_json::Value, stats: &SippStats) {
    assert_eq!(stats.failed, 0, "{stats:?}");
    assert_eq!(stats.successful, CALLS as u64, "{stats:?}");
    let n = CALLS as u64;
    let tcp = &s["tcp"];
    assert!(tcp["messages_out"].as_u64().unwrap() >= 3 * n, "{tcp}");
    assert!(tcp["messages_in"].as_u64().unwrap() >= 3 * n, "{tcp}");
    assert_eq!(tcp["no_connection"], 0, "{tcp}");
    // One accepted from the UAC's stunnel, one opened to the UAS's, both
    // handshaken; none failed.
    assert!(tls_counter(s, "handshakes") >= 2, "{}", s["tls"]);
    assert_eq!(tls_counter(s, "handshake_failures"), 0, "{}", s["tls"]);
    assert!(tcp["connected"].as_u64().unwrap() >= 1, "{tcp}");
    assert!(tcp["accepted"].as_u64().unwrap() >= 1, "{tcp}");
    // No UDP on the way: every message went over TLS connections.
    assert_eq!(tcp["udp_out"], 0, "{tcp}");
    assert!(
        s["proxy"]["requests_forwarded"].as_u64().unwrap() >= 3 * n,
        "{}",
        s["proxy"]
    );
}

#[test]
fn sipp_calls_through_stunnel_over_tls_stateless() {
    let (s, stats) = calls_over_tls("stateless", false);
    check_calls(&s, &stats);
}

#[test]
fn sipp_calls_through_stunnel_over_mutual_tls_stateful() {
    let (s, stats) = calls_over_tls("stateful", true);
    check_calls(&s, &stats);
    assert_eq!(s["proxy"]["retransmissions_sent"], 0, "{}", s["proxy"]);
}

fn tls_client() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/sip_proxy_support/tls_client.py")
}

/// One probe (`tls_client.py`): its output lines and exit status.
fn probe(dir: &Path, extra: &[&str]) -> (Vec<String>, i32) {
    let out = Command::new("python3")
        .arg(tls_client())
        .args(["127.0.0.1", "5061"])
        .arg(dir.join("ca.pem"))
        .args(extra)
        .output()
        .expect("run python3");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    eprintln!(
        "probe {extra:?}: {text} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    (
        text.lines().map(str::to_string).collect(),
        out.status.code().unwrap_or(-1),
    )
}

fn proxy_args(d: &Path, extra: &[&str]) -> Vec<String> {
    let mut args: Vec<String> = [
        "--listen",
        "127.0.0.1:5060",
        "--listen",
        "tls:127.0.0.1:5061",
        "--tls-cert",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    args.push(d.join("proxy.pem").display().to_string());
    args.push("--tls-key".into());
    args.push(d.join("proxy.key").display().to_string());
    args.extend(extra.iter().map(|s| s.to_string()));
    args
}

#[test]
fn old_tls_versions_are_refused_and_sni_picks_the_certificate() {
    let (probes, s) = netns(|| {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        make_ca(d);
        make_cert(d, "proxy", "proxy", &["proxy.test"]);
        let (other_cert, other_key) = make_cert(d, "other", "other", &["other.test"]);
        let sni = format!(
            "other.test={},{}",
            other_cert.display(),
            other_key.display()
        );
        let mut procs = Procs::default();
        let args = proxy_args(d, &["--tls-sni", &sni]);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let p = start_proxy(&mut procs, d, &args);
        let probes = [
            probe(d, &["--max-version", "1.0"]),
            probe(d, &["--max-version", "1.1"]),
            probe(d, &["--max-version", "1.2"]),
            probe(d, &["--max-version", "1.3"]),
            probe(d, &["--sni", "other.test"]),
            probe(d, &["--sni", "proxy.test"]),
        ];
        (probes, stop_proxy(&mut procs, &p))
    });
    for (lines, code) in &probes[..2] {
        assert_eq!(*code, 2, "{lines:?}");
        assert!(lines[0].starts_with("handshake-error"), "{lines:?}");
    }
    let served = |i: usize, cn: &str, version: &str| {
        let (lines, code) = &probes[i];
        assert_eq!(*code, 0, "{lines:?}");
        assert_eq!(lines[0], format!("cert {cn}"), "{lines:?}");
        assert_eq!(lines[1], format!("version {version}"), "{lines:?}");
        assert_eq!(lines[2], "status 200", "{lines:?}");
    };
    served(2, "proxy", "TLSv1.2");
    served(3, "proxy", "TLSv1.3");
    served(4, "other", "TLSv1.3");
    served(5, "proxy", "TLSv1.3");
    // The two old-version ClientHellos reached the proxy and were refused
    // there (not by the client itself).
    assert_eq!(tls_counter(&s, "handshake_failures"), 2, "{}", s["tls"]);
    assert_eq!(tls_counter(&s, "handshakes"), 4, "{}", s["tls"]);
    let closed = s["tcp"]["closed"].as_array().unwrap();
    let tls_closed = closed
        .iter()
        .find(|pair| pair[0] == "tls_handshake")
        .and_then(|pair| pair[1].as_u64());
    assert_eq!(tls_closed, Some(2), "{}", s["tcp"]);
}

/// A probe that keeps its connection: `send()` asks for one more OPTIONS.
struct Held {
    child: std::process::Child,
    lines: std::io::Lines<BufReader<std::process::ChildStdout>>,
}

impl Held {
    fn open(dir: &Path) -> Held {
        let mut child = Command::new("python3")
            .arg(tls_client())
            .args(["127.0.0.1", "5061"])
            .arg(dir.join("ca.pem"))
            .arg("--hold")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("run python3");
        let lines = BufReader::new(child.stdout.take().unwrap()).lines();
        Held { child, lines }
    }

    fn line(&mut self) -> String {
        self.lines
            .next()
            .and_then(Result::ok)
            .unwrap_or_else(|| "eof".into())
    }

    fn again(&mut self) -> String {
        let stdin = self.child.stdin.as_mut().unwrap();
        let _ = stdin.write_all(b"\n");
        let _ = stdin.flush();
        self.line()
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Probe new connections until one is served `cn` (bounded).
fn wait_for_cert(d: &Path, cn: &str) {
    let end = Instant::now() + Duration::from_secs(30);
    loop {
        let (lines, _) = probe(d, &[]);
        if lines.first().map(String::as_str) == Some(&format!("cert {cn}")) {
            return;
        }
        assert!(Instant::now() < end, "never served {cn}: {lines:?}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn certificates_reload_without_dropping_connections() {
    let s = netns(|| {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        make_ca(d);
        make_cert(d, "proxy", "first", &[]);
        let mut procs = Procs::default();
        // SIGHUP only (no file checks).
        let args = proxy_args(d, &["--tls-reload-check-s", "0"]);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let p = start_proxy(&mut procs, d, &args);
        let mut held = Held::open(d);
        assert_eq!(held.line(), "cert first");
        held.line();
        assert_eq!(held.line(), "status 200");
        make_cert(d, "proxy", "second", &[]);
        // Not re-read without a signal.
        assert_eq!(probe(d, &[]).0[0], "cert first");
        signal(p.pid, "HUP");
        wait_for_cert(d, "second");
        assert_eq!(held.again(), "status 200", "the old connection lives on");
        let first = stop_proxy(&mut procs, &p);
        drop(held);

        // File checks every second: a change is picked up without a signal.
        let args = proxy_args(d, &["--tls-reload-check-s", "1"]);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let p = start_proxy(&mut procs, d, &args);
        let mut held = Held::open(d);
        assert_eq!(held.line(), "cert second");
        held.line();
        assert_eq!(held.line(), "status 200");
        make_cert(d, "proxy", "third", &[]);
        wait_for_cert(d, "third");
        assert_eq!(held.again(), "status 200", "the old connection lives on");
        // A broken file is refused; the certificate in use stays.
        std::fs::write(d.join("proxy.key"), "not a key").unwrap();
        let end = Instant::now() + Duration::from_secs(30);
        loop {
            let text = scrape_summary_free(&p);
            if text {
                break;
            }
            assert!(Instant::now() < end, "the broken key was never tried");
            std::thread::sleep(Duration::from_millis(200));
        }
        assert_eq!(probe(d, &[]).0[0], "cert third");
        assert_eq!(held.again(), "status 200");
        let second = stop_proxy(&mut procs, &p);
        (first, second)
    });
    let (first, second) = s;
    assert_eq!(tls_counter(&first, "reloads"), 1, "{}", first["tls"]);
    assert_eq!(tls_counter(&second, "reloads"), 1, "{}", second["tls"]);
    assert!(
        tls_counter(&second, "reload_failures") >= 1,
        "{}",
        second["tls"]
    );
    // The held connections were never closed by a reload.
    for s in [&first, &second] {
        assert_eq!(tls_counter(s, "handshake_failures"), 0, "{}", s["tls"]);
    }
}

/// Whether the proxy logged a refused reload (its stderr so far).
fn scrape_summary_free(p: &ProxyProc) -> bool {
    p.stderr
        .try_iter()
        .any(|line| line.contains("reload refused"))
}

#[test]
fn a_flood_of_handshakes_is_bounded_and_counted() {
    let (served, text, s) = netns(|| {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        make_ca(d);
        make_cert(d, "proxy", "proxy", &[]);
        let mut procs = Procs::default();
        let args = proxy_args(
            d,
            &[
                "--tls-max-handshakes",
                "4",
                "--tls-handshake-timeout-ms",
                "1000",
                "--metrics",
                "127.0.0.1:9461",
            ],
        );
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let p = start_proxy(&mut procs, d, &args);
        // Twelve connections that never say hello: four are in handshake,
        // the rest are closed at once and counted.
        let flood: Vec<TcpStream> = (0..12)
            .map(|_| TcpStream::connect("127.0.0.1:5061").expect("connect"))
            .collect();
        // Once the four time out, a real client is served again (bounded wait).
        let end = Instant::now() + Duration::from_secs(30);
        let served = loop {
            let (lines, _) = probe(d, &[]);
            if lines.iter().any(|l| l == "status 200") {
                break true;
            }
            if Instant::now() > end {
                break false;
            }
            std::thread::sleep(Duration::from_millis(200));
        };
        drop(flood);
        let text = scrape("127.0.0.1:9461".parse().unwrap());
        (served, text, stop_proxy(&mut procs, &p))
    });
    assert!(served, "a client was served after the flood");
    // The same counters in /metrics, and the exposition passes promtool.
    let refused = prom_value(
        &text,
        "ringway_sip_tls_handshake_failures_total{transport=\"tls\",reason=\"refused\"}",
    );
    assert!(refused.is_some_and(|v| v >= 8.0), "{text}");
    assert!(
        prom_value(&text, "ringway_sip_tls_handshakes_total{transport=\"tls\"}")
            .is_some_and(|v| v >= 1.0),
        "{text}"
    );
    // The connections are TLS ones, under their own label (they used to
    // be counted as transport="tcp"): the handshakes that timed out closed
    // as `tls_handshake`; no plain TCP row (no such listener, none used).
    assert!(
        prom_value(
            &text,
            "ringway_sip_connections_accepted_total{transport=\"tls\"}"
        )
        .is_some_and(|v| v >= 1.0),
        "{text}"
    );
    assert!(
        prom_value(
            &text,
            "ringway_sip_connections_closed_total{transport=\"tls\",reason=\"tls_handshake\"}"
        )
        .is_some_and(|v| v >= 4.0),
        "{text}"
    );
    assert_eq!(
        prom_value(
            &text,
            "ringway_sip_connections_accepted_total{transport=\"tcp\"}"
        ),
        None,
        "{text}"
    );
    let rows = &s["tcp"]["by_transport"];
    assert!(rows["tls"]["accepted"].as_u64().unwrap_or(0) >= 1, "{rows}");
    assert!(rows["tcp"].is_null(), "{rows}");
    assert_promtool_accepts(&text);
    assert!(tls_counter(&s, "handshakes_refused") >= 8, "{}", s["tls"]);
    assert!(tls_counter(&s, "handshake_timeouts") >= 4, "{}", s["tls"]);
    assert_eq!(tls_counter(&s, "in_handshake"), 0, "{}", s["tls"]);
    assert!(tls_counter(&s, "handshakes") >= 1, "{}", s["tls"]);
}
