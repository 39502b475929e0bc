//! Every RFC 4475 / RFC 5118 torture message replayed to a running
//! `ringway sip proxy` over UDP, inside a private network namespace with only
//! `lo` (their hosts are 192.0.2.x/example.com: never replay them elsewhere).
//!
//! The proxy listens on 127.0.0.2:5060 and routes everything it forwards to a
//! sink on 127.0.0.3:5060 (`--route-to`). Each message is sent from
//! 127.0.0.1:<port of its top Via> so a response addressed per RFC 3261 18.2.2
//! (received = source address, port from Via or rport) reaches the sender.
//! After each message the test waits until the proxy's metrics show it was
//! processed (the workers update metrics only after sending the batch), then
//! classifies the handling: a response code at the sender, a forward at the
//! sink, or a counted drop, and compares it with the manifest.

mod sip_proxy_support;

use sip_proxy_support::*;
use std::collections::BTreeMap;
use std::net::{SocketAddr, UdpSocket};
use std::path::Path;
use std::time::{Duration, Instant};

const PROXY: &str = "127.0.0.2:5060";
const SINK: &str = "127.0.0.3:5060";
/// mpart01.dat carries `Route: <sip:127.0.0.1:5080>`: a second sink there.
const ROUTE_SINK: &str = "127.0.0.1:5080";
const METRICS: &str = "127.0.0.4:9464";

/// What the proxy did with one message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Handling {
    /// Forwarded (seen at a sink).
    Fwd,
    /// Forwarded by the core (counted) to an IP-literal target the private
    /// namespace cannot reach (the IPv6 hosts of RFC 5118), so no sink sees it.
    FwdUnreachable,
    /// Answered with this status code.
    Code(u16),
    /// No output; counted as dropped/absorbed by the proxy.
    Drop,
    /// Processed, but no output and no counter moved (always a failure).
    Lost,
}
use Handling::*;

/// Acceptable handlings per file, transcribed from the MANIFEST.tsv texts.
fn expectations() -> BTreeMap<&'static str, Vec<Handling>> {
    let e: &[(&str, &[Handling])] = &[
        // RFC 4475 3.1.1: valid messages (forward; responses not ours are dropped).
        ("wsinv.dat", &[Fwd]),
        ("intmeth.dat", &[Fwd, Code(501)]),
        ("esc01.dat", &[Fwd]),
        ("escnull.dat", &[Fwd]),
        ("esc02.dat", &[Fwd]),
        ("lwsdisp.dat", &[Fwd]),
        ("longreq.dat", &[Fwd]),
        ("dblreq.dat", &[Fwd]),
        ("semiuri.dat", &[Fwd]),
        ("transports.dat", &[Fwd]),
        ("mpart01.dat", &[Fwd]),
        ("unreason.dat", &[Drop]),
        ("noreason.dat", &[Drop]),
        // 3.1.2: invalid messages.
        ("badinv01.dat", &[Code(400)]),
        ("clerr.dat", &[Code(400), Drop]),
        ("ncl.dat", &[Code(400), Drop]),
        ("scalar02.dat", &[Code(400)]),
        ("scalarlg.dat", &[Drop]),
        ("quotbal.dat", &[Code(400)]),
        ("ltgtruri.dat", &[Code(400)]),
        ("lwsruri.dat", &[Code(400)]),
        ("lwsstart.dat", &[Code(400)]),
        ("trws.dat", &[Code(400)]),
        ("escruri.dat", &[Code(400), Fwd]),
        ("baddate.dat", &[Code(400), Fwd]),
        ("regbadct.dat", &[Code(400)]),
        ("badaspec.dat", &[Code(400), Fwd]),
        ("baddn.dat", &[Code(400)]),
        ("badvers.dat", &[Code(505)]),
        ("mismatch01.dat", &[Code(400)]),
        ("mismatch02.dat", &[Code(400)]),
        ("bigcode.dat", &[Drop]),
        // 3.2 / 3.3 / 3.4.
        ("badbranch.dat", &[Fwd]),
        ("insuf.dat", &[Code(400)]),
        ("unkscm.dat", &[Code(416)]),
        ("novelsc.dat", &[Code(416)]),
        ("unksm2.dat", &[Fwd]),
        ("bext01.dat", &[Code(420)]),
        ("invut.dat", &[Fwd]),
        ("regaut01.dat", &[Fwd, Code(401)]),
        ("multi01.dat", &[Code(400)]),
        ("mcl01.dat", &[Code(400)]),
        ("bcast.dat", &[Drop]),
        ("zeromf.dat", &[Code(483), Code(200)]),
        ("cparam01.dat", &[Fwd]),
        ("cparam02.dat", &[Fwd]),
        ("regescrt.dat", &[Fwd]),
        ("sdp01.dat", &[Fwd]),
        ("inv2543.dat", &[Fwd]),
        // RFC 5118.
        ("ipv6-good", &[Fwd, FwdUnreachable]),
        ("ipv6-bad", &[Code(400)]),
        ("port-ambiguous", &[Fwd, FwdUnreachable]),
        ("port-unambiguous", &[Fwd, FwdUnreachable]),
        ("via-received-param-with-delim", &[Fwd, FwdUnreachable]),
        ("via-received-param-no-delim", &[Fwd, FwdUnreachable]),
        ("ipv6-in-sdp", &[Fwd, FwdUnreachable]),
        ("mult-ip-in-header", &[Fwd]),
        ("mult-ip-in-sdp", &[Fwd, FwdUnreachable]),
        ("ipv4-mapped-ipv6", &[Fwd]),
        ("ipv6-bug-abnf-3-colons", &[Fwd, FwdUnreachable, Code(400)]),
        ("ipv6-correct-abnf-2-colons", &[Fwd, FwdUnreachable]),
    ];
    e.iter().map(|(f, h)| (*f, h.to_vec())).collect()
}

/// Files listed in a MANIFEST.tsv (first column, header skipped).
fn manifest(dir: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(dir.join("MANIFEST.tsv")).expect("MANIFEST.tsv");
    text.lines()
        .skip(1)
        .filter_map(|l| l.split('\t').next())
        .filter(|f| !f.is_empty())
        .map(str::to_string)
        .collect()
}

/// Port of the top Via's sent-by (5060 when absent or unparsable).
fn via_port(msg: &[u8]) -> u16 {
    let text = String::from_utf8_lossy(msg);
    for line in text.lines() {
        let Some((name, value)) = line.split_once(':') else {
            continue;
        };
        let n = name.trim().to_ascii_lowercase();
        if n != "via" && n != "v" {
            continue;
        }
        // "SIP/2.0/UDP host:port;params": drop blanks around '/', take the 2nd token.
        let mut compact = value.trim().to_string();
        while compact.contains(" /") || compact.contains("/ ") {
            compact = compact.replace(" /", "/").replace("/ ", "/");
        }
        let sent_by = compact.split_whitespace().nth(1).unwrap_or("");
        let host_port = sent_by.split([';', ',']).next().unwrap_or("").trim();
        let port = if let Some(rest) = host_port.strip_prefix('[') {
            rest.split_once("]:").map(|(_, p)| p)
        } else {
            host_port.split_once(':').map(|(_, p)| p)
        };
        return port
            .and_then(|p| p.trim().parse().ok())
            .filter(|p| *p != 0)
            .unwrap_or(5060);
    }
    5060
}

/// Total of the counters that mean "processed without output".
fn no_output_count(text: &str) -> f64 {
    prom_sum(text, "ringway_sip_core_drops_total")
        + prom_sum(text, "ringway_sip_absorbed_total")
        + prom_sum(text, "ringway_sip_rx_truncated_total")
}

/// Send `msg` to the proxy and classify what it did.
fn replay(msg: &[u8], sinks: &[UdpSocket], metrics: SocketAddr) -> (Handling, String) {
    let proxy: SocketAddr = PROXY.parse().unwrap();
    let before = scrape(metrics);
    let n0 = prom_value(&before, "ringway_sip_messages_in_total").unwrap();
    let d0 = no_output_count(&before);
    let f0 = prom_sum(&before, "ringway_sip_forwarded_total");
    let port = via_port(msg);
    let client = UdpSocket::bind(("127.0.0.1", port))
        .unwrap_or_else(|e| panic!("bind sender on 127.0.0.1:{port}: {e}"));
    client.send_to(msg, proxy).expect("send to proxy");
    // Wait until the proxy has processed it (metrics are updated after the send).
    let end = Instant::now() + Duration::from_secs(10);
    let after = loop {
        let t = scrape(metrics);
        if prom_value(&t, "ringway_sip_messages_in_total").unwrap() > n0 {
            break t;
        }
        assert!(Instant::now() < end, "proxy did not receive the message");
        std::thread::sleep(Duration::from_millis(5));
    };
    let mut buf = vec![0u8; 70000];
    client
        .set_read_timeout(Some(Duration::from_millis(100)))
        .unwrap();
    if let Ok((n, _)) = client.recv_from(&mut buf) {
        let r = String::from_utf8_lossy(&buf[..n]).into_owned();
        let code = r
            .strip_prefix("SIP/2.0 ")
            .and_then(|s| s.get(..3))
            .and_then(|c| c.parse().ok())
            .unwrap_or_else(|| panic!("non-response at sender: {r}"));
        return (Code(code), r);
    }
    for sink in sinks {
        sink.set_read_timeout(Some(Duration::from_millis(20)))
            .unwrap();
        if let Ok((n, _)) = sink.recv_from(&mut buf) {
            return (Fwd, String::from_utf8_lossy(&buf[..n]).into_owned());
        }
    }
    if no_output_count(&after) > d0 {
        return (Drop, String::new());
    }
    if prom_sum(&after, "ringway_sip_forwarded_total") > f0 {
        return (FwdUnreachable, String::new());
    }
    (Lost, String::new())
}

#[test]
fn torture_messages_get_manifest_handling() {
    let Some(root) = ringway_io::testing::testdata("sip-torture") else {
        return;
    };
    let expect = expectations();
    let mut files = Vec::new();
    for sub in ["rfc4475", "rfc5118"] {
        for f in manifest(&root.join(sub)) {
            assert!(
                expect.contains_key(f.as_str()),
                "no expectation for {sub}/{f}"
            );
            files.push((
                f.clone(),
                std::fs::read(root.join(sub).join(&f)).expect("read torture file"),
            ));
        }
    }
    assert_eq!(
        files.len(),
        expect.len(),
        "manifest and expectations differ"
    );
    let (results, summary) = in_bed(move |procs, dir| {
        let sinks = [
            UdpSocket::bind(SINK).unwrap(),
            UdpSocket::bind(ROUTE_SINK).unwrap(),
        ];
        let p = start_proxy(
            procs,
            dir,
            &[
                "--listen",
                PROXY,
                // The peers of this test bed are on loopback; the RFC 5118
                // messages name IPv6 targets (the private namespace has no
                // route to them: forwarded or unreachable, as the manifest
                // allows).
                "--relay",
                "127.0.0.0/8,::/0",
                "--mode",
                "stateless",
                "--route-to",
                SINK,
                "--metrics",
                METRICS,
                "--workers",
                "1",
            ],
        );
        let metrics: SocketAddr = METRICS.parse().unwrap();
        let mut results = Vec::new();
        for (name, bytes) in &files {
            let (h, text) = replay(bytes, &sinks, metrics);
            if h == Fwd {
                // The forward carries the proxy's own Via on top.
                let top_via = text
                    .lines()
                    .find(|l| {
                        let l = l.to_ascii_lowercase();
                        l.starts_with("via:") || l.starts_with("v:")
                    })
                    .unwrap_or("");
                assert!(
                    top_via.contains("127.0.0.2"),
                    "{name}: forward without our Via on top:\n{text}"
                );
            }
            results.push((name.clone(), h));
        }
        (results, stop_proxy(procs, &p))
    });
    let mut bad = Vec::new();
    for (name, h) in &results {
        eprintln!("{name:40} {h:?}");
        if !expect[name.as_str()].contains(h) {
            bad.push(format!(
                "{name}: got {h:?}, manifest allows {:?}",
                expect[name.as_str()]
            ));
        }
    }
    assert!(
        bad.is_empty(),
        "torture handling differs from the manifest:\n{}",
        bad.join("\n")
    );
    assert_eq!(
        summary["messages"]["in"].as_u64().unwrap(),
        results.len() as u64
    );
    let drops = results.iter().filter(|(_, h)| *h == Drop).count() as u64;
    let counted: u64 = summary["drops"]["core_dropped"].as_u64().unwrap()
        + summary["actions"]["absorbed"].as_u64().unwrap()
        + summary["messages"]["rx_truncated"].as_u64().unwrap();
    assert_eq!(counted, drops, "summary drop counters vs observed drops");
}
