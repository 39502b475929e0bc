//! The SFU on the AF_XDP backend (`--backend xdp --xdp-iface`) in the veth
//! testbed: exact forwarding and echo counts at both ends, the lab sweep
//! with an xdp column, and clear errors where xdp cannot run.

mod sfu_common;

use sfu_common::*;
use std::process::Command;

/// AF_XDP sockets exist on this kernel (else the tests check the error).
fn xdp_here() -> bool {
    match ringway_io::backend::xdp_socket_supported() {
        Ok(()) => true,
        Err(why) => {
            ringway_io::testing::skip(format!("AF_XDP not available on this kernel: {why}"));
            false
        }
    }
}

#[test]
fn xdp_needs_an_interface() {
    let out = Command::new(BIN)
        .args([
            "sfu",
            "serve",
            "--backend",
            "xdp",
            "--listen",
            "127.0.0.1:0",
        ])
        .args(["--duration", "1", "--stats-interval", "0"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("xdp backend needs an interface: use --xdp-iface"),
        "{err}"
    );
    let out = Command::new(BIN)
        .args(["lab", "sfu", "--backends", "socket,xdp", "--reps", "1"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("xdp backend needs --netns"), "{err}");
}

/// `ringway sfu load --netns --sfu-backend xdp`: the SFU attaches to its
/// host's veth; every packet reaches the 3 other clients and is echoed.
#[test]
fn load_netns_testbed_on_xdp() {
    let dir = tempfile::tempdir().unwrap();
    let (sj, lj) = (dir.path().join("sfu.json"), dir.path().join("load.json"));
    let (pid, out) = run_ringway(&[
        "sfu",
        "load",
        "--netns",
        "--clients",
        "4",
        "--server",
        "0.0.0.0:5004",
        "--duration",
        "1",
        "--interval-ms",
        "10",
        "--stats-interval",
        "0",
        "--sfu-backend",
        "xdp",
        "--sfu-json",
        sj.to_str().unwrap(),
        "--json",
        lj.to_str().unwrap(),
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    if !xdp_here() {
        assert!(stderr.contains("xdp backend not available"), "{stderr}");
        return;
    }
    assert!(out.status.success(), "{stderr}");
    let (s, l) = (read_json(&sj), read_json(&lj));
    assert_eq!(s["backend"], "xdp");
    let tx = l["tx_packets"].as_u64().unwrap();
    assert!(tx >= 4 * 3 * 50, "{l}"); // 4 sources × 3 types × ≥50 ticks
    assert_eq!(s["sfu"]["media_accepted"].as_u64().unwrap(), tx);
    assert_eq!(s["sfu"]["copies"].as_u64().unwrap(), 3 * tx);
    assert_eq!(s["sfu"]["echoes"].as_u64().unwrap(), tx);
    assert_eq!(l["media_packets"].as_u64().unwrap(), 3 * tx);
    assert_eq!(l["echoes"].as_u64().unwrap(), tx);
    assert_eq!(l["lost"], 0);
    assert_eq!(l["control_errors"], 0);
    assert_eq!(s["sfu"]["drop_unverified"], 0);
    // Everything took the XSK rings: nothing through the companion socket.
    let io = &s["io"];
    assert_eq!(io["rx_via_socket"], 0, "{io}");
    assert_eq!(io["tx_via_socket"], 0, "{io}");
    assert_eq!(io["tx_errors"], 0, "{io}");
    assert!(io["rx_packets"].as_u64().unwrap() >= tx);
    // Native XDP on the veth; copies written from the received frames, the
    // echo sent in the received frame itself; every checksum verified.
    assert!(s["io_mode"].as_str().unwrap().contains("native XDP"), "{s}");
    assert_eq!(io["tx_from_rx_frame"].as_u64().unwrap(), 3 * tx, "{io}");
    assert_eq!(io["tx_moved"].as_u64().unwrap(), tx, "{io}");
    assert_eq!(io["rx_bad_checksum"], 0, "{io}");
    assert_eq!(io["tx_in_ring"], 0, "{io}");
    // The XDP program's RX stamps give delay (d) for every packet.
    assert_eq!(s["delay_from_kernel"]["count"].as_u64().unwrap(), tx);
    assert_eq!(s["delay"]["count"].as_u64().unwrap(), tx);
    no_namespaces_of(pid);
}

/// `ringway lab sfu --netns --backends socket,xdp`: the xdp column runs on
/// the SFU host's veth with exact copies and no client loss.
#[test]
fn lab_sfu_xdp_column() {
    if !xdp_here() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("lab.json");
    let (pid, stdout) = lab_sfu_netns(
        &[
            "--reps",
            "1",
            "--clients",
            "3",
            "--pps",
            "300",
            "--backends",
            "socket,xdp",
            // This test is about the xdp column, not the A/A floor.
            "--no-aa",
        ],
        &json,
    );
    assert!(stdout.contains("overall xdp vs socket"), "{stdout}");
    assert!(stdout.contains("native XDP"), "{stdout}");
    let v = read_json(&json);
    let runs = v["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 2, "{stdout}");
    let x = runs
        .iter()
        .find(|r| r["backend"] == "xdp")
        .expect("xdp run");
    assert_eq!(x["copies_per_packet"].as_f64().unwrap(), 3.0, "{x}");
    assert!(x["media"].as_u64().unwrap() > 0);
    assert_eq!(x["client_lost"], 0, "{x}");
    assert!(x["kdelay_p50_us"].as_f64().is_some_and(|d| d > 0.0), "{x}");
    assert!(x["delay_p50_us"].as_f64().unwrap() <= x["handoff_p50_us"].as_f64().unwrap());
    no_namespaces_of(pid);
}
