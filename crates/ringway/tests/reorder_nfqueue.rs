//! `ringway reorder nfqueue`: SRPIC in front of a host's own TCP through
//! NFQUEUE, in a receiver namespace the test creates (removed after, with
//! its iptables rules; processes killed by PID). Reordering is injected
//! upstream by the TUN relay (the paper's Normal delay, no sorting there).

mod reorder_common;

use reorder_common::*;
use ringway_io::netns::Host;
use ringway_lab::impair::{scaled_receiver, PathConfig};
use ringway_lab::srpic_tcp::hosts::{parse_iperf3, Hosts, SenderProfile, RECEIVER_ADDR};
use ringway_lab::srpic_tcp::relay::{Placement, RelayCoreConfig};
use std::process::Command;
use std::time::Duration;

const RATE: u64 = 100_000_000;

/// Upstream impairment only (SRPIC off in the relay): Normal delay with
/// σ = β·α scaled by 1 Gb/s / rate, the paper's receiver coalescing scaled
/// the same way (blocks reach the receiver's stack together, so the queue
/// has something to sort).
fn upstream(rate: u64, beta: f64) -> RelayCoreConfig {
    let k = 1e9 / rate as f64;
    RelayCoreConfig {
        forward: PathConfig {
            rate_bps: rate,
            delay_ns: 2_500_000,
            sigma_ns: (beta * 2.5e6 * k) as u64,
            seed: 21,
            queue_ns: 100_000_000,
            ..Default::default()
        },
        reverse: PathConfig {
            rate_bps: rate,
            delay_ns: 2_500_000,
            seed: 22,
            ..Default::default()
        },
        receiver: scaled_receiver(k),
        srpic: None,
        max_flows: 64,
        placement: Placement::Listing1,
    }
}

fn analyze(cap: &std::path::Path) -> serde_json::Value {
    let o = Command::new(BIN)
        .args(["reorder", "analyze", "--block", "1", "--json"])
        .arg(cap)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    serde_json::from_slice(&o.stdout).unwrap()
}

fn report(out: &str) -> serde_json::Value {
    serde_json::from_str(out).unwrap_or_else(|e| panic!("{e}: {out:?}"))
}

/// iperf3 through the queue: held and sorted above 0, a lower RFC 4737
/// reordered ratio after the queue than before it. Checked independently:
/// ringway's "before" ratio is what `ringway reorder analyze` finds in a
/// tcpdump capture of the device (before the queue), and the receiver's
/// TCP queues fewer segments out of order (TcpExtTCPOFOQueue per data
/// segment) than in the same run without ringway (same seed; the queue
/// bypassed).
/// The receiver's rule sending TCP from the relay's TUN device to NFQUEUE
/// `queue` (with `--queue-bypass`: fail-open when nobody binds it).
fn queue_rule(rcv: &Host, queue: u16, bypass: bool) -> Rule {
    let queue = queue.to_string();
    let mut spec = vec![
        "PREROUTING",
        "-i",
        "tun0",
        "-p",
        "tcp",
        "-j",
        "NFQUEUE",
        "--queue-num",
        &queue,
    ];
    if bypass {
        spec.push("--queue-bypass");
    }
    Rule::append(rcv, "raw", &spec)
}

#[test]
fn nfqueue_sorts_a_tcp_transfer_reordered_upstream() {
    let dir = tempfile::tempdir().unwrap();
    let cap_in = dir.path().join("in.pcap");
    let rate = 20_000_000;
    let cfg = upstream(rate, 0.005);
    let mut ofo = Vec::new();
    for with_ringway in [true, false] {
        let hosts = Hosts::create(rate, SenderProfile::A, true).unwrap();
        let rcv = hosts.receiver().clone();
        let queue = queue_rule(&rcv, 7, true);
        let before = ringway_lab::srpic_tcp::hosts::nstat(&rcv).unwrap();
        let td = with_ringway.then(|| tcpdump(&rcv, "tun0", &cap_in, &["tcp"]));
        let sorter = with_ringway.then(|| ringway_nfqueue(&rcv, &["--queue", "7"]));
        let (json, relay) = with_relay(&hosts, &cfg, || iperf3(&hosts, 3.0, 1));
        let after = ringway_lab::srpic_tcp::hosts::nstat(&rcv).unwrap();
        let d = ringway_lab::srpic_tcp::hosts::delta(&before, &after);
        let ip = parse_iperf3(&json).unwrap_or_else(|e| panic!("{e:#}: {json}"));
        assert!(ip.mbps > 5.0, "the transfer went through: {ip:?}");
        let segs = relay.arrival_order.0 as f64;
        ofo.push(d["TcpExtTCPOFOQueue"] as f64 / segs);
        eprintln!(
            "ringway {with_ringway}: {ip:?} arrival {:?} OFO/segment {}",
            relay.arrival_order,
            ofo.last().unwrap()
        );
        if let (Some(td), Some(sorter)) = (td, sorter) {
            wait_written(&cap_in);
            let st = td.interrupt();
            check_sorter(sorter, &relay, &st, &cap_in);
        }
        assert!(queue.packets() > 1000);
        let names = hosts.netns_names();
        drop(queue);
        drop(hosts);
        assert_netns_gone(&names);
    }
    assert!(
        ofo[1] > 0.05,
        "reordering reached TCP without ringway: {ofo:?}"
    );
    assert!(
        ofo[0] < 0.8 * ofo[1],
        "TCP queued fewer segments out of order with ringway: {ofo:?}"
    );
}

fn check_sorter(
    sorter: Bg,
    relay: &ringway_lab::srpic_tcp::relay::RelayReport,
    tcpdump_stats: &str,
    cap_in: &std::path::Path,
) {
    let _ = Command::new("kill")
        .args(["-INT", &sorter.0.id().to_string()])
        .status();
    let r = report(&sorter.output(Duration::from_secs(10)));
    eprintln!(
        "nfqueue {r:#}
tcpdump {tcpdump_stats}"
    );
    let n = |k: &str| r[k].as_u64().unwrap();
    assert!(n("packets") > 1000, "{r}");
    assert!(
        n("batches") < n("packets"),
        "drains held several packets: {r}"
    );
    assert!(n("held") > 0 && n("sorted") > 0, "{r}");
    assert_eq!(n("malformed"), 0);
    assert_eq!(
        r["queue"]["kernel_errors"].as_u64(),
        Some(0),
        "every verdict named a queued packet"
    );
    assert_eq!(
        r["queue"]["verdicts"].as_u64(),
        r["queue"]["packets"].as_u64(),
        "one verdict per packet"
    );
    let (before, after) = (
        r["before"]["ratio"].as_f64().unwrap(),
        r["after"]["ratio"].as_f64().unwrap(),
    );
    assert!(before > 0.05, "reordering was injected upstream: {before}");
    assert!(after < before, "{after} !< {before}");
    // ringway's "before" is the order a capture of the device shows (the
    // data flow is the flow with the most packets), and the relay's own
    // count of what it delivered.
    let a = analyze(cap_in);
    let flow = a["variants"][0]["per_flow"]
        .as_array()
        .unwrap()
        .iter()
        .max_by_key(|f| f["packets"].as_u64().unwrap())
        .unwrap()
        .clone();
    let r_in = flow["reordered_ratio"].as_f64().unwrap();
    eprintln!("capture before the queue: {flow}");
    assert!(
        (r_in - before).abs() < 0.02,
        "capture {r_in} vs ringway {before}"
    );
    assert!(
        (relay.arrival_order.2 - before).abs() < 0.02,
        "relay {:?} vs ringway {before}",
        relay.arrival_order
    );
}

/// With `--queue-bypass` the host keeps receiving when ringway is not
/// running, and when it is killed in the middle of a transfer; without
/// the flag (the control) nothing gets through.
#[test]
fn nfqueue_fails_open_with_queue_bypass() {
    let hosts = Hosts::create(RATE, SenderProfile::A, true).unwrap();
    let rcv = hosts.receiver().clone();
    let queue = queue_rule(&rcv, 8, true);
    let cfg = upstream(RATE, 0.0);
    // 1. No program bound: packets bypass the queue.
    let (json, _) = with_relay(&hosts, &cfg, || iperf3(&hosts, 1.0, 1));
    let ip = parse_iperf3(&json).unwrap_or_else(|e| panic!("no listener, bypass: {e:#}"));
    assert!(ip.mbps > 5.0, "{ip:?}");
    // 2. ringway bound, then killed (SIGKILL by PID) in the middle.
    let sorter = ringway_nfqueue(&rcv, &["--queue", "8"]);
    let pid = sorter.0.id();
    let (json, _) = with_relay(&hosts, &cfg, || {
        let killer = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(1300));
            let _ = Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .status();
        });
        let out = iperf3(&hosts, 3.0, 1);
        killer.join().unwrap();
        out
    });
    drop(sorter);
    let ip = parse_iperf3(&json).unwrap_or_else(|e| panic!("killed mid-transfer: {e:#}"));
    assert!(ip.mbps > 5.0 && ip.seconds > 2.5, "{ip:?}");
    // 3. Control: the same rule without --queue-bypass and no program:
    // the connection cannot even be set up.
    drop(queue);
    let _strict = queue_rule(&rcv, 8, false);
    let (json, _) = with_relay(&hosts, &cfg, || iperf3(&hosts, 1.0, 1));
    assert!(
        parse_iperf3(&json).is_err(),
        "without --queue-bypass: {json}"
    );
    let names = hosts.netns_names();
    drop(_strict);
    drop(hosts);
    assert_netns_gone(&names);
}

/// IPv4 header checksum.
fn ip_checksum(h: &[u8]) -> u16 {
    let mut s: u32 = h
        .chunks(2)
        .map(|c| u16::from_be_bytes([c[0], c[1]]) as u32)
        .sum();
    while s > 0xffff {
        s = (s & 0xffff) + (s >> 16);
    }
    !(s as u16)
}

/// Malformed segments (a TCP data offset beyond the segment) pass the
/// queue unsorted, are counted, and reach INPUT; the flow table and the
/// held packets stay within their bounds while four flows go through.
#[test]
fn nfqueue_passes_malformed_packets_and_stays_bounded() {
    let hosts = Hosts::create(RATE, SenderProfile::A, true).unwrap();
    let rcv = hosts.receiver().clone();
    let _queue = queue_rule(&rcv, 9, true);
    let seen = Rule::append(&rcv, "filter", &["INPUT", "-s", "10.77.99.9", "-p", "tcp"]);
    let sorter = ringway_nfqueue(&rcv, &["--queue", "9", "--max-flows", "1", "--ring", "8"]);
    let (json, _) = with_relay(&hosts, &upstream(RATE, 0.02), || {
        for i in 0..5u8 {
            let mut p = vec![0u8; 40];
            p[0] = 0x45;
            p[2..4].copy_from_slice(&40u16.to_be_bytes());
            p[8] = 64;
            p[9] = 6;
            p[12..16].copy_from_slice(&[10, 77, 99, 9]);
            let dst: std::net::Ipv4Addr = RECEIVER_ADDR.parse().unwrap();
            p[16..20].copy_from_slice(&dst.octets());
            let c = ip_checksum(&p[..20]);
            p[10..12].copy_from_slice(&c.to_be_bytes());
            p[20] = i;
            p[32] = 15 << 4; // data offset 60 > the 20-byte segment
            hosts.receiver_tun.write(&p).unwrap();
        }
        iperf3(&hosts, 2.0, 3)
    });
    let _ = Command::new("kill")
        .args(["-INT", &sorter.0.id().to_string()])
        .status();
    let r = report(&sorter.output(Duration::from_secs(10)));
    let ip = parse_iperf3(&json).unwrap_or_else(|e| panic!("{e:#}: {json}"));
    eprintln!("{ip:?}\n{r:#}");
    let n = |k: &str| r[k].as_u64().unwrap();
    assert_eq!(n("malformed"), 5, "{r}");
    assert_eq!(
        seen.packets(),
        5,
        "the malformed packets were accepted and reached INPUT"
    );
    assert!(n("passed_through") >= 5);
    assert!(
        r["srpic"]["table_full"].as_u64().unwrap() > 0,
        "three data flows, room for one: {r}"
    );
    assert!(n("held_max") <= 8, "{r}");
    assert!(ip.mbps > 5.0, "{ip:?}");
    let names = hosts.netns_names();
    drop((seen, _queue));
    drop(hosts);
    assert_netns_gone(&names);
}
