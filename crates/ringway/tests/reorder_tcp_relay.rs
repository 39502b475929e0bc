//! SRPIC's TCP path: iperf3 from a sender namespace to a receiver
//! namespace through the TUN relay (the paper's impairment: Normal delay
//! at a link rate, loss; the receiver's interrupt coalescing). Checks the
//! plumbing (TUN devices inside namespaces the test creates and removes),
//! the relay's duplicate-ACK and SACK-block counts against tshark on a
//! `-s 128` capture of the sender's device, `ringway reorder analyze` on
//! that capture, and SRPIC on vs off over the same seed.

mod reorder_common;

use reorder_common::*;
use ringway_lab::impair::{scaled_receiver, LossModel, PathConfig};
use ringway_lab::srpic_tcp::hosts::{parse_iperf3, Hosts, SenderProfile, RECEIVER_ADDR};
use ringway_lab::srpic_tcp::relay::{Placement, RelayCoreConfig};
use ringway_reorder::SrpicConfig;
use std::process::Command;

const RATE: u64 = 100_000_000;

fn relay_config(srpic: bool) -> RelayCoreConfig {
    let k = 1e9 / RATE as f64;
    RelayCoreConfig {
        forward: PathConfig {
            rate_bps: RATE,
            delay_ns: 2_500_000,
            sigma_ns: (0.02 * 2.5e6 * k) as u64, // β = 2 %, scaled
            loss: LossModel::Uniform(0.005),
            seed: 5,
            queue_ns: 100_000_000,
            ..Default::default()
        },
        reverse: PathConfig {
            rate_bps: RATE,
            delay_ns: 2_500_000,
            seed: 6,
            queue_ns: 100_000_000,
            ..Default::default()
        },
        receiver: scaled_receiver(k),
        srpic: srpic.then_some(SrpicConfig {
            block_size: 32,
            ring_size: 512,
            max_flows: 64,
            idle_flushes: 64,
        }),
        max_flows: 64,
        placement: Placement::Listing1,
    }
}

/// The relay's DupAcksIn and SackBlocksRcvd are what tshark finds in a
/// capture of what the sender received.
#[test]
fn relay_counts_match_tshark_and_analyze_reads_the_snapped_capture() {
    let dir = tempfile::tempdir().unwrap();
    let cap = dir.path().join("sender.pcap");
    let hosts = Hosts::create(RATE, SenderProfile::A, true).unwrap();
    let td = tcpdump(hosts.sender(), "tun0", &cap, &["tcp"]);
    let (json, rep) = with_relay(&hosts, &relay_config(false), || iperf3(&hosts, 2.5, 1));
    wait_written(&cap);
    let st = td.interrupt();
    let names = hosts.netns_names();
    drop(hosts);
    assert_netns_gone(&names);
    let ip = parse_iperf3(&json).unwrap_or_else(|e| panic!("{e:#}: {json}"));
    eprintln!("{ip:?}\n{rep:?}\ntcpdump {st:?}");
    assert!(ip.mbps > 5.0, "{ip:?}");
    assert_eq!(rep.write_errors + rep.read_errors, 0);
    // What the relay handed the sender, packet by packet, is in the capture.
    let from_receiver = format!("ip.src=={RECEIVER_ADDR}");
    let acks = tshark(&cap, &from_receiver, &["frame.number"]).len() as u64;
    assert_eq!(acks, rep.to_sender.segments, "tcpdump saw every packet");
    let dup = tshark(
        &cap,
        &format!("{from_receiver} && tcp.analysis.duplicate_ack"),
        &["frame.number"],
    )
    .len() as u64;
    let sack: u64 = tshark(
        &cap,
        &format!("{from_receiver} && tcp.options.sack.count"),
        &["tcp.options.sack.count"],
    )
    .iter()
    .flat_map(|l| {
        l.split(',')
            .map(|x| x.trim().parse::<u64>().unwrap())
            .collect::<Vec<_>>()
    })
    .sum();
    assert!(
        dup > 50 && sack > 50,
        "reordering and loss made some: {dup} {sack}"
    );
    assert_eq!(
        rep.to_sender.dup_acks, dup,
        "duplicate ACKs: relay vs tshark"
    );
    assert_eq!(
        rep.to_sender.sack_blocks, sack,
        "SACK blocks: relay vs tshark"
    );
    // The receiver's TCP saw reordering: the relay's RFC 4737 count at the
    // receiver is far above the sender's own order.
    assert!(rep.arrival_order.2 > 0.05, "{:?}", rep.arrival_order);
    // `ringway reorder analyze` reads the -s 128 capture: every TCP frame
    // is a packet of the analysis, nothing is skipped, and every data
    // segment (tshark: tcp.len > 0) enters the metrics (as a packet or a
    // duplicate).
    let all = tshark(&cap, "tcp", &["frame.number"]).len() as u64;
    let data = tshark(&cap, "tcp.len > 0", &["frame.number"]).len() as u64;
    let o = Command::new(BIN)
        .args(["reorder", "analyze", "--json"])
        .arg(&cap)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let an: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let frames = tshark(
        &cap,
        "frame.cap_len <= 128 && frame.len > 1000",
        &["frame.number"],
    )
    .len();
    assert!(
        frames > 1000,
        "the capture is snap-length limited: {frames}"
    );
    assert!(data > 1000);
    assert_eq!(an["packets"].as_u64(), Some(all));
    assert_eq!(an["skipped_frames"].as_u64(), Some(0));
    let total = &an["variants"][0]["total"];
    assert_eq!(
        total["packets"].as_u64().unwrap() + total["duplicates"].as_u64().unwrap(),
        data,
        "{total}"
    );
    assert!(an["flows"].as_array().unwrap().len() >= 2, "{an}");
}

/// With SRPIC on, the data reach the receiver's TCP far less reordered than
/// they arrived; with it off, exactly as they arrived. Same seed.
#[test]
fn srpic_sorts_what_the_receiver_gets() {
    let mut out = Vec::new();
    for on in [false, true] {
        let hosts = Hosts::create(RATE, SenderProfile::A, true).unwrap();
        let (json, rep) = with_relay(&hosts, &relay_config(on), || iperf3(&hosts, 2.0, 2));
        let names = hosts.netns_names();
        drop(hosts);
        assert_netns_gone(&names);
        let ip = parse_iperf3(&json).unwrap_or_else(|e| panic!("{e:#}: {json}"));
        eprintln!(
            "srpic {on}: {ip:?} blocks {:.2} arrival {:?} delivery {:?} sorter {:?}",
            rep.blocks.mean(),
            rep.arrival_order,
            rep.delivery_order,
            rep.srpic
        );
        out.push(rep);
    }
    let (off, on) = (&out[0], &out[1]);
    assert_eq!(off.arrival_order, off.delivery_order);
    assert!(off.srpic.is_none());
    let s = on.srpic.unwrap();
    assert!(s.to_prev + s.to_after > 100, "{s:?}");
    assert!(
        on.delivery_order.2 < 0.8 * on.arrival_order.2,
        "{:?} {:?}",
        on.arrival_order,
        on.delivery_order
    );
    // The block sizes come from the same receiver model at similar rates.
    assert!(off.blocks.mean() > 1.5 && on.blocks.mean() > 1.5);
}
