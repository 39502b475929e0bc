//! Capture the proxy's traffic on `lo` (tcpdump) during SIPp calls and let
//! tshark check that no SIP message it sent is malformed.

mod sip_proxy_support;

use sip_proxy_support::*;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn tshark(pcap: &std::path::Path, filter: &str, fields: &[&str]) -> String {
    let mut c = Command::new("tshark");
    c.arg("-r").arg(pcap).args(["-n", "-Y", filter]);
    if !fields.is_empty() {
        c.args(["-T", "fields"]);
        for f in fields {
            c.args(["-e", f]);
        }
    }
    let out = c.output().expect("run tshark");
    assert!(
        out.status.success(),
        "tshark failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn proxy_output_is_well_formed_sip_in_tshark() {
    let (pcap_dir, stats) = netns(|| {
        let dir = tempfile::tempdir().unwrap();
        let mut procs = Procs::default();
        let pcap = dir.path().join("lo.pcap");
        let mut td = Command::new("tcpdump")
            .args(["-i", "lo", "-n", "-U", "--immediate-mode", "-s", "0", "-w"])
            .arg(&pcap)
            .arg("udp")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn tcpdump");
        let err = td.stderr.take().unwrap();
        let td_pid = procs.add("tcpdump", td);
        // tcpdump says "listening on lo" once the capture runs.
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for l in BufReader::new(err).lines().map_while(Result::ok) {
                let _ = tx.send(l);
            }
        });
        let end = Instant::now() + Duration::from_secs(10);
        loop {
            let l = rx
                .recv_timeout(end.saturating_duration_since(Instant::now()))
                .expect("tcpdump did not start");
            if l.contains("listening on") {
                break;
            }
        }
        let p = start_loopback_proxy(
            &mut procs,
            dir.path(),
            &["--mode", "stateful", "--workers", "2"],
        );
        start_loopback_uas(&mut procs, dir.path());
        let (st, stats) = run_loopback_calls(&mut procs, dir.path(), "uac", 20, 20);
        stop_proxy(&mut procs, &p);
        std::thread::sleep(Duration::from_millis(200));
        signal(td_pid, "INT");
        let mut td = procs.take(td_pid).unwrap();
        wait_bounded(&mut td, Duration::from_secs(10));
        assert!(st.is_some_and(|s| s.success()), "calls failed: {stats:?}");
        (dir, stats)
    });
    assert_eq!(stats.failed, 0);
    let pcap = pcap_dir.path().join("lo.pcap");
    // The proxy sends from port 5060; tshark decodes it as SIP.
    let out = "udp.srcport == 5060";
    let methods = tshark(
        &pcap,
        &format!("{out} && sip"),
        &["sip.Method", "sip.Status-Code"],
    );
    let lines: Vec<&str> = methods.lines().collect();
    for want in ["INVITE", "ACK", "BYE", "200", "180"] {
        assert!(
            lines.iter().any(|l| l.split('\t').any(|f| f == want)),
            "no {want} sent by the proxy in the capture: {lines:?}"
        );
    }
    // At least one forwarded message per call leg (INVITE, 180, 200, ACK, BYE, 200).
    assert!(
        lines.len() >= 6 * 20,
        "only {} SIP messages from the proxy",
        lines.len()
    );
    let bad = tshark(
        &pcap,
        &format!("({out}) && (_ws.malformed || _ws.expert.severity == error)"),
        &[],
    );
    assert!(bad.trim().is_empty(), "tshark flags proxy output:\n{bad}");
    // And the whole capture (SIPp's messages included) is clean too.
    let bad_all = tshark(&pcap, "_ws.malformed || _ws.expert.severity == error", &[]);
    assert!(
        bad_all.trim().is_empty(),
        "tshark flags capture:\n{bad_all}"
    );
}
