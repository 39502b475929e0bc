//! A real browser through `ringway sip proxy` (issue 21): JsSIP (npm) in
//! headless Chromium (Debian `chromium`) registers over WSS, then SIPp
//! (UDP) calls it through the proxy and the page answers; all in a private
//! network namespace (only `lo`).
//!
//! - JsSIP is installed at set-up with npm into a cache under the target
//!   directory (`jssip` and `esbuild`, pinned, `--ignore-scripts`) and
//!   bundled for the browser with esbuild; nothing is vendored.
//! - The certificate comes from the test's own CA (openssl CLI); Chromium
//!   trusts it by its public key (`--ignore-certificate-errors-spki-list`,
//!   with its own profile directory).
//! - The page (`sip_proxy_support/jssip_page.html`) is served by the test
//!   on loopback, so its Origin is known and the proxy allows only that
//!   one (`--ws-origin`); it POSTs each JsSIP event back to the test.
//! - JsSIP registers with a `.invalid` Contact host and Via, as browsers
//!   do: the INVITE must go over the REGISTER's connection, and the ACK
//!   and BYE over it too (by the flow token in our Record-Route), never by
//!   the Contact's host.
//! - SIPp's offer is WebRTC SDP (`uac_webrtc.xml`); the page answers with
//!   no local media. The assertion is the signalling: 200, ACK, BYE.
//!
//! Missing chromium, node/npm, or an npm registry: a visible skip, a
//! failure under `CI=true` (scripts/install-deps.sh installs the packages).

mod sip_proxy_support;

use sip_proxy_support::*;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The JsSIP release the test runs (npm).
const JSSIP_VERSION: &str = "3.13.8";
/// The esbuild release that bundles it (JsSIP's own build tool).
const ESBUILD_VERSION: &str = "0.27.2";

const PAGE: &str = include_str!("sip_proxy_support/jssip_page.html");

/// `cmd --version` runs: the tool is installed.
fn installed(cmd: &str) -> bool {
    Command::new(cmd)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|status| status.success())
}

/// The browser bundle of JsSIP: built once into the target directory's
/// cache with npm and esbuild (outside the test's namespace: npm needs
/// the registry). `Err`: why it could not be.
fn jssip_bundle() -> Result<PathBuf, String> {
    let cache = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("jssip-{JSSIP_VERSION}-esbuild-{ESBUILD_VERSION}"));
    let bundle = cache.join("jssip.js");
    if bundle.exists() {
        return Ok(bundle);
    }
    std::fs::create_dir_all(&cache).map_err(|e| format!("{}: {e}", cache.display()))?;
    let out = Command::new("timeout")
        .arg("300")
        .arg("npm")
        .args(["install", "--no-audit", "--no-fund", "--ignore-scripts"])
        .arg("--prefix")
        .arg(&cache)
        .arg(format!("jssip@{JSSIP_VERSION}"))
        .arg(format!("esbuild@{ESBUILD_VERSION}"))
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("run npm: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "npm install jssip@{JSSIP_VERSION} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let modules = cache.join("node_modules");
    let partial = cache.join("jssip.js.partial");
    let out = Command::new(modules.join(".bin/esbuild"))
        .arg(modules.join("jssip/lib/JsSIP.js"))
        .args(["--bundle", "--format=iife", "--global-name=JsSIP"])
        .arg(format!("--outfile={}", partial.display()))
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("run esbuild: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "esbuild failed: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    // Renamed into place: a run cut short leaves no half bundle.
    std::fs::rename(&partial, &bundle).map_err(|e| format!("{}: {e}", bundle.display()))?;
    Ok(bundle)
}

/// What the test needs from outside, or `None` after a visible skip (a
/// failure under `CI=true`).
fn prerequisites() -> Option<Vec<u8>> {
    for (tool, package) in [("chromium", "chromium"), ("node", "nodejs"), ("npm", "npm")] {
        if !installed(tool) {
            ringway_io::testing::data_missing(format!(
                "{tool} is not installed (Debian package {package}; scripts/install-deps.sh)"
            ));
            return None;
        }
    }
    match jssip_bundle().and_then(|path| std::fs::read(&path).map_err(|e| e.to_string())) {
        Ok(bundle) => Some(bundle),
        Err(why) => {
            ringway_io::testing::data_missing(format!("no JsSIP bundle: {why}"));
            None
        }
    }
}

/// Base64 of the SHA-256 of the certificate's public key (what
/// `--ignore-certificate-errors-spki-list` takes).
fn spki_hash(dir: &Path, cert: &str) -> String {
    let out = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "openssl x509 -in {cert} -pubkey -noout | openssl pkey -pubin -outform der \
             | openssl dgst -sha256 -binary | openssl base64 -A"
        ))
        .current_dir(dir)
        .output()
        .expect("run openssl");
    let hash = String::from_utf8_lossy(&out.stdout).trim().to_string();
    assert!(hash.len() == 44, "SPKI hash of {cert}: {hash:?}");
    hash
}

/// The test's HTTP server on loopback: serves the page and the bundle,
/// and hands each line POSTed to `/event` to `events`.
struct PageServer {
    addr: SocketAddr,
    events: mpsc::Receiver<String>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl PageServer {
    fn start(bundle: Vec<u8>) -> PageServer {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the page server");
        listener.set_nonblocking(true).unwrap();
        let addr = listener.local_addr().unwrap();
        let (tx, events) = mpsc::channel();
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        let thread = std::thread::spawn(move || {
            while !stopped.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((stream, _)) => {
                        let _ = serve_one(stream, &bundle, &tx);
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(10)),
                }
            }
        });
        PageServer {
            addr,
            events,
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for PageServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// One HTTP/1.1 request, answered with `Connection: close`.
fn serve_one(
    stream: TcpStream,
    bundle: &[u8],
    events: &mpsc::Sender<String>,
) -> std::io::Result<()> {
    stream.set_nonblocking(false)?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut request_line = String::new();
    reader.read_line(&mut request_line)?;
    let mut length = 0usize;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line)? == 0 || line.trim().is_empty() {
            break;
        }
        if let Some((name, value)) = line.split_once(':') {
            if name.eq_ignore_ascii_case("content-length") {
                length = value.trim().parse().unwrap_or(0).min(4096);
            }
        }
    }
    let mut body = vec![0; length];
    reader.read_exact(&mut body)?;
    let path = request_line.split(' ').nth(1).unwrap_or("");
    let (status, kind, content): (&str, &str, &[u8]) = if request_line.starts_with("POST /event") {
        let _ = events.send(String::from_utf8_lossy(&body).into_owned());
        ("204 No Content", "text/plain", b"")
    } else if path == "/jssip.js" {
        ("200 OK", "text/javascript", bundle)
    } else if path == "/" || path.starts_with("/?") {
        ("200 OK", "text/html; charset=utf-8", PAGE.as_bytes())
    } else {
        ("404 Not Found", "text/plain", b"")
    };
    let mut stream = stream;
    write!(
        stream,
        "HTTP/1.1 {status}\r\nContent-Type: {kind}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        content.len()
    )?;
    stream.write_all(content)
}

/// Headless Chromium in its own process group, with its own profile and
/// HOME; stopped with SIGTERM (bounded), then the group killed.
struct Browser {
    child: Child,
}

impl Browser {
    fn start(dir: &Path, spki: &str, url: &str) -> Browser {
        let log = std::fs::File::create(dir.join("chromium.log")).unwrap();
        let child = Command::new("chromium")
            .args([
                "--headless=new",
                // As root (the namespace needs it) Chromium's sandbox cannot start.
                "--no-sandbox",
                "--disable-gpu",
                "--no-first-run",
                "--no-default-browser-check",
                "--disable-crash-reporter",
                // ICE gathering finishes on a host with only `lo`.
                "--allow-loopback-in-peer-connection",
                "--disable-features=WebRtcHideLocalIpsWithMdns",
                "--enable-logging=stderr",
                "--v=0",
            ])
            .arg(format!("--user-data-dir={}", dir.join("profile").display()))
            .arg(format!("--ignore-certificate-errors-spki-list={spki}"))
            .arg(url)
            .env("HOME", dir)
            .current_dir(dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .process_group(0)
            .spawn()
            .expect("spawn chromium (Debian package chromium)");
        Browser { child }
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let pid = self.child.id();
        signal(pid, "TERM");
        let _ = wait_bounded(&mut self.child, Duration::from_secs(10));
        // Whatever is left of its process group (zygotes, renderers).
        let _ = Command::new("kill")
            .args(["-KILL", "--", &format!("-{pid}")])
            .stderr(Stdio::null())
            .status();
    }
}

/// Collect events into `seen` until one starts with one of `wanted`, or
/// until `limit` passes; whether one did.
fn wait_event(
    events: &mpsc::Receiver<String>,
    seen: &mut Vec<String>,
    wanted: &[&str],
    limit: Duration,
) -> bool {
    let end = Instant::now() + limit;
    loop {
        let left = end.saturating_duration_since(Instant::now());
        match events.recv_timeout(left) {
            Ok(event) => {
                eprintln!("[page] {event}");
                let hit = wanted.iter().any(|w| event.starts_with(w));
                seen.push(event);
                if hit {
                    return true;
                }
            }
            Err(_) => return false,
        }
    }
}

/// The last lines of Chromium's log (for a failure message).
fn chromium_log_tail(dir: &Path) -> String {
    let text = std::fs::read_to_string(dir.join("chromium.log")).unwrap_or_default();
    let lines: Vec<&str> = text.lines().filter(|line| !line.contains("dbus")).collect();
    lines[lines.len().saturating_sub(30)..].join("\n")
}

struct Outcome {
    events: Vec<String>,
    sipp: Option<SippStats>,
    summary: serde_json::Value,
    log: String,
}

fn browser_call(bundle: Vec<u8>) -> Outcome {
    netns(move || {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let cert_args = proxy_cert_args(d);
        let spki = spki_hash(d, "proxy.pem");
        let server = PageServer::start(bundle);
        let origin = format!("http://{}", server.addr);
        let mut procs = Procs::default();
        let mut args = vec![
            "--listen",
            "127.0.0.1:5060",
            "--listen",
            "wss:127.0.0.1:5067",
        ];
        args.extend(cert_args.iter().map(String::as_str));
        args.extend([
            // The page's origin only: the browser sends it.
            "--ws-origin",
            &origin,
            "--registrar",
            "--domain",
            "ringway.test",
            "--relay",
            "127.0.0.0/8",
        ]);
        let p = start_proxy(&mut procs, d, &args);
        let url = format!("{origin}/?ws=wss://127.0.0.1:5067&uri=sip:bob@ringway.test");
        let browser = Browser::start(d, &spki, &url);
        let mut events = Vec::new();
        let registered = wait_event(
            &server.events,
            &mut events,
            &["registered", "registrationFailed"],
            Duration::from_secs(60),
        );
        let mut sipp = None;
        if registered && events.iter().any(|e| e == "registered 200") {
            let args = strings(&[
                "127.0.0.1:5060",
                "-sf",
                &Path::new(env!("CARGO_MANIFEST_DIR"))
                    .join("tests/sip_proxy_support/uac_webrtc.xml")
                    .display()
                    .to_string(),
                "-s",
                "bob",
                "-key",
                "dest",
                "ringway.test",
                "-i",
                "127.0.0.1",
                "-p",
                "5062",
                "-m",
                "1",
                "-r",
                "1",
                "-d",
                "500",
                "-timeout",
                "40",
                "-timeout_error",
                "-trace_msg",
                "-message_file",
                "sipp.msg",
            ]);
            let (_, stats) = run_sipp(&mut procs, d, "uac", &args, Duration::from_secs(60));
            sipp = Some(stats);
            wait_event(
                &server.events,
                &mut events,
                &["ended", "failed"],
                Duration::from_secs(20),
            );
        }
        drop(browser);
        let summary = stop_proxy(&mut procs, &p);
        let mut log = chromium_log_tail(d);
        if let Ok(msgs) = std::fs::read_to_string(d.join("sipp.msg")) {
            log.push_str("\n--- SIPp messages ---\n");
            log.push_str(&msgs);
        }
        Outcome {
            events,
            sipp,
            summary,
            log,
        }
    })
}

#[test]
fn jssip_in_chromium_registers_over_wss_and_receives_a_call_from_sipp() {
    let Some(bundle) = prerequisites() else {
        return;
    };
    let out = browser_call(bundle);
    let Outcome {
        events,
        sipp,
        summary: s,
        log,
    } = &out;
    let context = || format!("page events {events:?}\nproxy tcp {}\n{log}", s["tcp"]);
    assert!(
        events.iter().any(|e| e == "registered 200"),
        "JsSIP did not register over wss: {}",
        context()
    );
    // Browsers register a Contact whose host is a random `.invalid` name:
    // only the flow reaches them.
    let contact = events
        .iter()
        .find_map(|e| e.strip_prefix("contact "))
        .unwrap_or("");
    assert!(
        contact.contains(".invalid;transport=ws"),
        "{contact}: {}",
        context()
    );
    let sipp = sipp.as_ref().expect("SIPp ran");
    assert_eq!(sipp.successful, 1, "{sipp:?}: {}", context());
    assert_eq!(sipp.failed, 0, "{sipp:?}: {}", context());
    let call: Vec<&String> = events
        .iter()
        .filter(|e| {
            ["invite", "confirmed", "ended", "failed"]
                .iter()
                .any(|w| e.starts_with(w))
        })
        .collect();
    assert_eq!(
        call,
        ["invite", "confirmed", "ended remote Terminated"],
        "the page's view of the call (INVITE answered, ACK, BYE from SIPp): {}",
        context()
    );
    // REGISTER, 180, 200 (INVITE), 200 (BYE) came in over the WebSocket;
    // 200 (REGISTER), INVITE, ACK, BYE went out over it.
    assert!(s["tcp"]["messages_in"].as_u64() >= Some(4), "{}", s["tcp"]);
    assert!(s["tcp"]["messages_out"].as_u64() >= Some(4), "{}", s["tcp"]);
    assert_eq!(tcp_closed(s, "ws_handshake"), 0, "{}", s["tcp"]);
    assert_eq!(tcp_closed(s, "ws_error"), 0, "{}", s["tcp"]);
    assert_eq!(s["tcp"]["no_connection"], 0, "{}", s["tcp"]);
    assert!(s["tls"]["handshakes"].as_u64() >= Some(1), "{}", s["tls"]);
}
