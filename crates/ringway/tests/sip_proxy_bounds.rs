//! State of `ringway sip proxy` stays bounded under hostile traffic
//! (issue 19 part 4, review findings S2, S8, S9, S11, S12, S17), each in a
//! private network namespace against the real binary:
//! - responses with 600 distinct status codes do not grow the metrics (S2);
//! - a slow `/metrics` client cannot hold the endpoint (S17);
//! - a worker thread that panics takes the process down with an error,
//!   reported in the summary, and leaves no socket bound (S11);
//! - large INVITEs to a next hop that never answers fill the transaction
//!   table's byte bound, not memory (S9);
//! - a source flooding responses is flood-limited like one flooding
//!   requests (S12).

mod sip_proxy_support;

use sip_proxy_support::*;
use std::collections::BTreeSet;
use std::io::Write as _;
use std::net::{SocketAddr, TcpStream, UdpSocket};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn a(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

/// A small response (~150 bytes) with status `code` whose top Via is not
/// the proxy's: the core drops it, but it is labelled and counted.
fn stray_response(code: u16) -> Vec<u8> {
    format!(
        "SIP/2.0 {code} x\r\nVia: SIP/2.0/UDP 192.0.2.1:5060;branch=z9hG4bKs{code}\r\n\
         From: <sip:a@192.0.2.1>;tag=1\r\nTo: <sip:b@192.0.2.2>;tag=2\r\n\
         Call-ID: s{code}@192.0.2.1\r\nCSeq: 1 INVITE\r\nContent-Length: 0\r\n\r\n"
    )
    .into_bytes()
}

/// The distinct values of label `label` in the samples of `metric`.
fn label_values(text: &str, metric: &str, label: &str) -> BTreeSet<String> {
    let key = format!("{label}=\"");
    text.lines()
        .filter_map(|l| l.strip_prefix(metric)?.strip_prefix('{'))
        .filter_map(|rest| {
            let v = &rest[rest.find(&key)? + key.len()..];
            Some(v[..v.find('"')?].to_string())
        })
        .collect()
}

/// Review S2: one response per status code 100..=699, from many source
/// ports (spread over both workers), then a scrape. Before the fix each
/// code got its own slot of four HDR histograms (~0.9 MiB) in every
/// worker, its published copy and the merged snapshot: ~550 MiB per
/// worker. Now the codes map to a fixed table (exact codes and classes).
#[test]
fn distinct_status_codes_do_not_grow_the_metrics() {
    let (text, rss0, rss1, summary) = in_bed(|procs, dir| {
        let p = start_proxy(
            procs,
            dir,
            &[
                "--listen",
                "127.0.0.1:5060",
                "--workers",
                "2",
                "--rcvbuf",
                "4194304",
                "--metrics",
                "127.0.0.1:9464",
            ],
        );
        // Baseline with the metrics machinery warmed up (one type seen, one scrape).
        let s = UdpSocket::bind("127.0.0.1:0").unwrap();
        s.send_to(&stray_response(200), "127.0.0.1:5060").unwrap();
        std::thread::sleep(Duration::from_millis(200));
        scrape(a("127.0.0.1:9464"));
        let rss0 = rss_kib(p.pid);
        let senders: Vec<UdpSocket> = (0..16)
            .map(|_| UdpSocket::bind("127.0.0.1:0").unwrap())
            .collect();
        for round in 0..2 {
            for code in 100u16..=699 {
                let s = &senders[(code as usize + round) % senders.len()];
                s.send_to(&stray_response(code), "127.0.0.1:5060").unwrap();
                if code % 50 == 0 {
                    // Paced: the point is distinct codes, not socket drops.
                    std::thread::sleep(Duration::from_millis(5));
                }
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        let text = scrape(a("127.0.0.1:9464"));
        std::thread::sleep(Duration::from_millis(200));
        let rss1 = rss_kib(p.pid);
        (text, rss0, rss1, stop_proxy(procs, &p))
    });
    let types = label_values(&text, "ringway_sip_messages_by_type_total", "type");
    eprintln!("RSS {rss0} -> {rss1} KiB; type labels {types:?}");
    // Every datagram was seen and counted (1 + 2 × 600 responses), or
    // dropped by a full socket and counted as such.
    let seen = summary["messages"]["in"].as_u64().unwrap();
    let socket_drops = summary["drops"]["socket_rxq_ovfl"].as_u64().unwrap();
    assert_eq!(seen + socket_drops, 1201, "{}", summary["drops"]);
    assert!(seen > 1100, "most responses reach the core: {seen}");
    let counted: f64 = prom_sum(&text, "ringway_sip_messages_by_type_total");
    assert_eq!(counted as u64, seen);
    // A fixed set of labels: the exact codes seen and the six classes.
    assert!(types.contains("6xx") && types.contains("3xx"), "{types:?}");
    assert!(
        !types.contains("699") && !types.contains("302"),
        "{types:?}"
    );
    assert!(
        types.len() <= ringway_sip::MsgLabel::SLOTS,
        "{} type labels",
        types.len()
    );
    // Every thread still runs (2 workers and the timer).
    assert_eq!(prom_value(&text, "ringway_sip_threads_alive"), Some(3.0));
    assert_eq!(prom_value(&text, "ringway_sip_threads"), Some(3.0));
    let by_type = summary["by_type"].as_object().unwrap();
    assert_eq!(by_type.len(), types.len(), "{:?}", by_type.keys());
    // Memory: a bounded table costs at most ~20 slots × 0.9 MiB per copy.
    assert!(
        rss1 < rss0 + 96 * 1024,
        "RSS grew from {rss0} to {rss1} KiB with 600 status codes"
    );
}

/// Review S17: a client that trickles its request a byte at a time (each
/// byte well within the old per-read timeout) used to hold the one
/// `/metrics` handler for as long as it liked. Now the whole request must
/// arrive within a deadline: a scrape started after the slow client is
/// answered while the slow client is still trickling, and the slow
/// client's connection is closed before it has sent everything.
#[test]
fn slow_metrics_client_cannot_hold_the_endpoint() {
    let (answered_while_trickling, trickle_cut) = in_bed(|procs, dir| {
        let p = start_proxy(
            procs,
            dir,
            &["--listen", "127.0.0.1:5060", "--metrics", "127.0.0.1:9464"],
        );
        let trickling = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
        let flag = trickling.clone();
        let slow = std::thread::spawn(move || {
            let mut c = TcpStream::connect("127.0.0.1:9464").unwrap();
            // 100 bytes, one every 200 ms (20 s), never ending the head.
            let request = format!("GET /metrics HTTP/1.0\r\nX-Slow: {}", "a".repeat(100));
            let mut cut = false;
            for b in request.as_bytes().iter().take(100) {
                if c.write_all(&[*b]).is_err() {
                    cut = true;
                    break;
                }
                std::thread::sleep(Duration::from_millis(200));
            }
            flag.store(false, std::sync::atomic::Ordering::SeqCst);
            cut
        });
        std::thread::sleep(Duration::from_millis(300));
        let started = Instant::now();
        let body = scrape(a("127.0.0.1:9464"));
        let answered_while_trickling = trickling.load(std::sync::atomic::Ordering::SeqCst);
        eprintln!(
            "scrape answered after {:?} ({} bytes) while the slow client {}",
            started.elapsed(),
            body.len(),
            if answered_while_trickling {
                "still trickled"
            } else {
                "had finished"
            }
        );
        let trickle_cut = slow.join().unwrap();
        stop_proxy(procs, &p);
        (answered_while_trickling, trickle_cut)
    });
    assert!(
        answered_while_trickling,
        "the scrape waited for the slow client to finish"
    );
    assert!(trickle_cut, "the slow client's connection was never closed");
}

/// Run `ringway ARGS` with `RINGWAY_TEST_PANIC=thread`, send datagrams
/// from many source ports to `target`, and return its exit status (None:
/// still running after 30 s, then killed), its summary, whether `target`
/// can be bound again, and its stderr.
fn run_with_injected_panic(
    args: &[&str],
    thread: &str,
    target: &str,
) -> (
    Option<std::process::ExitStatus>,
    Option<serde_json::Value>,
    bool,
    String,
) {
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    let (thread, target) = (thread.to_string(), target.to_string());
    netns(move || {
        let dir = tempfile::tempdir().unwrap();
        let summary_path = dir.path().join("summary.json");
        let mut child = Command::new(ringway())
            .args(&args)
            .args(["--duration", "60", "--quiet", "--summary"])
            .arg(&summary_path)
            .env("RINGWAY_TEST_PANIC", &thread)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut stderr_pipe = child.stderr.take().unwrap();
        let reader = std::thread::spawn(move || {
            let mut text = String::new();
            let _ = std::io::Read::read_to_string(&mut stderr_pipe, &mut text);
            text
        });
        std::thread::sleep(Duration::from_millis(500));
        // Datagrams from many source ports: some hash to the doomed worker.
        let sockets: Vec<UdpSocket> = (0..32)
            .map(|_| UdpSocket::bind("127.0.0.1:0").unwrap())
            .collect();
        for s in &sockets {
            let _ = s.send_to(b"OPTIONS sip:x SIP/2.0\r\n\r\n", target.as_str());
        }
        // Bounded wait (not a timing assertion: the old binary never exits).
        let status = wait_bounded(&mut child, Duration::from_secs(30));
        let summary: Option<serde_json::Value> = std::fs::read_to_string(&summary_path)
            .ok()
            .and_then(|t| serde_json::from_str(&t).ok());
        let rebind = UdpSocket::bind(target.as_str()).is_ok();
        (status, summary, rebind, reader.join().unwrap())
    })
}

/// Review S11: with `--rx-model reuseport` each worker has its own socket in
/// the SO_REUSEPORT group; a worker that panicked used to leave its socket
/// bound (the kernel kept hashing 1/N of the peers to it) while the process
/// and the other workers ran on. A panic injected into one worker (test
/// hook `RINGWAY_TEST_PANIC`) now stops the whole proxy: it exits non-zero
/// with the thread named in its summary, and the port is free again. The
/// dispatcher's workers do the same.
#[test]
fn a_panicking_worker_stops_the_proxy_with_an_error() {
    let (status, summary, rebind, stderr) = run_with_injected_panic(
        &[
            "sip",
            "proxy",
            "--listen",
            "127.0.0.1:5060",
            "--workers",
            "2",
            "--rx-model",
            "reuseport",
        ],
        "sip-w1",
        "127.0.0.1:5060",
    );
    eprintln!("{stderr}");
    let status = status.expect("the proxy kept running after a worker panicked");
    assert!(!status.success(), "exit status {status}");
    assert!(stderr.contains("sip-w1"), "{stderr}");
    let summary = summary.expect("the summary is still written");
    assert_eq!(summary["threads_panicked"], serde_json::json!(["sip-w1"]));
    assert!(rebind, "the proxy's port is still bound");

    let (status, summary, rebind, stderr) = run_with_injected_panic(
        &[
            "sip",
            "dispatch",
            "--listen",
            "127.0.0.1:5070",
            "--proxy",
            "127.0.0.1:5060",
        ],
        "dispatch-w0",
        "127.0.0.1:5070",
    );
    eprintln!("{stderr}");
    let status = status.expect("the dispatcher kept running after a worker panicked");
    assert!(!status.success(), "exit status {status}");
    let summary = summary.expect("the dispatcher's summary is still written");
    assert_eq!(
        summary["threads_panicked"],
        serde_json::json!(["dispatch-w0"])
    );
    assert!(rebind, "the dispatcher's port is still bound");
}

/// Review S9: ~15 KB INVITEs to a next hop that never answers. The table
/// holds at most `--max-transaction-bytes`; beyond it new INVITEs get 503,
/// and the gauges say how full it is.
#[test]
fn large_invites_fill_the_byte_bound_not_memory() {
    const MAX: u64 = 2 << 20;
    let (text, refused, rss0, rss1) = in_bed(|procs, dir| {
        let max = MAX.to_string();
        let p = start_proxy(
            procs,
            dir,
            &[
                "--listen",
                "127.0.0.1:5060",
                "--mode",
                "stateful",
                "--domain",
                "ringway.test",
                "--route-to",
                "127.0.0.1:5099",
                "--max-transaction-bytes",
                &max,
                "--rcvbuf",
                "4194304",
                "--metrics",
                "127.0.0.1:9464",
            ],
        );
        let rss0 = rss_kib(p.pid);
        let uac = UdpSocket::bind("127.0.0.1:5061").unwrap();
        let pad = "x".repeat(15_000);
        for n in 0..400 {
            let invite = format!(
                "INVITE sip:bob@ringway.test SIP/2.0\r\nVia: SIP/2.0/UDP 127.0.0.1:5061;branch=z9hG4bKbig{n}\r\n\
                 Max-Forwards: 70\r\nFrom: <sip:alice@example.net>;tag=a{n}\r\nTo: <sip:bob@ringway.test>\r\n\
                 Call-ID: big{n}@127.0.0.1\r\nCSeq: 1 INVITE\r\nContact: <sip:alice@127.0.0.1:5061>\r\n\
                 X-Pad: {pad}\r\nContent-Length: 0\r\n\r\n"
            );
            uac.send_to(invite.as_bytes(), "127.0.0.1:5060").unwrap();
            if n % 5 == 0 {
                // Paced: the point is the table, not socket drops.
                std::thread::sleep(Duration::from_millis(2));
            }
        }
        std::thread::sleep(Duration::from_millis(300));
        let text = scrape(a("127.0.0.1:9464"));
        let rss1 = rss_kib(p.pid);
        let summary = stop_proxy(procs, &p);
        let refused = summary["by_type"]["INVITE"]["responded"]["503"]
            .as_u64()
            .unwrap_or(0);
        (text, refused, rss0, rss1)
    });
    let bytes = prom_value(&text, "ringway_sip_transaction_bytes").unwrap();
    let active = prom_value(&text, "ringway_sip_transactions_active").unwrap();
    eprintln!("503s {refused}, {active} transactions, {bytes} bytes, RSS {rss0} -> {rss1} KiB");
    assert_eq!(
        prom_value(&text, "ringway_sip_transaction_bytes_max"),
        Some(MAX as f64)
    );
    assert!(bytes <= (MAX + 32 * 1024) as f64, "{bytes} bytes held");
    assert!(active < 200.0, "{active} transactions");
    assert!(refused >= 200, "only {refused} INVITEs refused");
    assert!(
        rss1 < rss0 + 32 * 1024,
        "RSS grew from {rss0} to {rss1} KiB"
    );
}

/// Review S12: responses were exempt from the flood limit (the S2 flood and
/// forged responses passed unlimited). Now a response counts a quarter of
/// a request: with `--flood-limit 50`, 200 responses from one source pass
/// in a window, the rest are dropped and counted as `flood`.
#[test]
fn response_floods_are_limited() {
    let summary = in_bed(|procs, dir| {
        let p = start_proxy(
            procs,
            dir,
            &[
                "--listen",
                "127.0.0.1:5060",
                "--flood-limit",
                "50",
                "--flood-window-ms",
                "60000",
                "--rcvbuf",
                "4194304",
            ],
        );
        let s = UdpSocket::bind("127.0.0.3:5060").unwrap();
        for n in 0..1000 {
            s.send_to(&stray_response(200), "127.0.0.1:5060").unwrap();
            if n % 50 == 0 {
                std::thread::sleep(Duration::from_millis(2));
            }
        }
        std::thread::sleep(Duration::from_millis(300));
        stop_proxy(procs, &p)
    });
    let seen = summary["messages"]["in"].as_u64().unwrap();
    let ok = &summary["by_type"]["200"]["dropped"];
    eprintln!("{seen} seen, dropped {ok}");
    assert_eq!(summary["drops"]["socket_rxq_ovfl"].as_u64(), Some(0));
    assert_eq!(seen, 1000);
    assert_eq!(ok["flood"].as_u64(), Some(800), "{ok}");
    assert_eq!(ok["response_via_not_ours"].as_u64(), Some(200), "{ok}");
    assert_eq!(summary["proxy"]["flood_blocks"].as_u64(), Some(1));
}
