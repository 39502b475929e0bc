//! The in-kernel `tc` fan-out in a room larger than 16: every media packet
//! of 18 clients replicated in the kernel to the 17 others (the program's
//! copy loop, bounded by `MAX_FANOUT`), and the clients, which send no
//! keepalives, stay registered past the SFU's idle timeout because the
//! kernel's per-route packet counters refresh their idle timers.

mod sfu_common;

use sfu_common::*;

#[test]
fn kernel_fanout_serves_a_room_of_18_and_keeps_its_senders_alive() {
    if let Err(why) = ringway_io::backend::xdp_socket_supported() {
        ringway_io::testing::skip(format!("BPF not available: {why}"));
        return;
    }
    const CLIENTS: u64 = 18;
    let dir = tempfile::tempdir().unwrap();
    let (sj, lj) = (dir.path().join("sfu.json"), dir.path().join("load.json"));
    let (pid, out) = run_ringway(&[
        "sfu",
        "load",
        "--netns",
        "--clients",
        &CLIENTS.to_string(),
        "--server",
        "0.0.0.0:5004",
        "--types",
        "asq",
        "--interval-ms",
        "25",
        // Three idle timeouts of sending, no keepalives: only the media
        // the kernel forwards keeps the senders registered.
        "--duration",
        "3",
        "--no-keepalive",
        "--sfu-idle-timeout",
        "1",
        "--stats-interval",
        "0",
        "--sfu-kernel-fanout",
        "--sfu-json",
        sj.to_str().unwrap(),
        "--json",
        lj.to_str().unwrap(),
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    no_namespaces_of(pid);
    let (s, l) = (read_json(&sj), read_json(&lj));
    let tx = l["tx_packets"].as_u64().unwrap();
    assert!(tx >= CLIENTS * 100, "{l}");
    assert_eq!(s["sfu"]["timeouts"], 0, "{s}");
    assert_eq!(l["lost"], 0, "{l}");
    assert_eq!(
        l["media_packets"].as_u64().unwrap(),
        (CLIENTS - 1) * tx,
        "{l}"
    );
    assert_eq!(l["echoes"].as_u64().unwrap(), tx, "{l}");
    // The rest are replicated in the kernel, 17 copies and the echo each.
    assert_kernel_fanout_carried("tc, 18 clients", &s, tx);
}
