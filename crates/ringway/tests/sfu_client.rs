//! The `ringway sfu client` / `load` commands and `ringway lab sfu`, end to
//! end: counts that must be exact on an unloaded path (every packet echoed,
//! every packet delivered to the other subscribers).

mod sfu_common;

use sfu_common::*;
use std::process::Command;

fn client_cli(backend: &'static str, cmd: &'static str) {
    in_netns(move || {
        let srv = Server::start(backend, &[]);
        let json = srv.dir.path().join("client.json");
        let n_flag = if cmd == "client" {
            "--streams"
        } else {
            "--clients"
        };
        let st = Command::new(BIN)
            .args(["sfu", cmd, n_flag, "3", "--server", &srv.addr.to_string()])
            .args([
                "--duration",
                "1",
                "--interval-ms",
                "10",
                "--backend",
                backend,
            ])
            .args(["--stats-interval", "0", "--json"])
            .arg(&json)
            .status()
            .unwrap();
        assert!(st.success());
        let c = read_json(&json);
        let r = srv.stop();
        let tx = c["tx_packets"].as_u64().unwrap();
        assert!(tx >= 3 * 3 * 50, "{c}"); // 3 sources × 3 types × ≥50 ticks
        assert_eq!(c["ssids"].as_array().unwrap().len(), 3);
        // Every packet echoed to its sender and delivered to the 2 other sources.
        assert_eq!(c["echoes"].as_u64().unwrap(), tx);
        assert_eq!(c["rtt"]["count"].as_u64().unwrap(), tx);
        assert_eq!(c["media_packets"].as_u64().unwrap(), 2 * tx);
        assert_eq!(c["lost"], 0);
        assert_eq!(c["reordered"], 0);
        assert_eq!(c["control_errors"], 0);
        // 3 sources × 3 types, each seen as echo + 2 copies.
        let streams = c["received"].as_array().unwrap();
        assert_eq!(streams.len(), 9);
        assert_eq!(
            streams
                .iter()
                .map(|s| s["packets"].as_u64().unwrap())
                .sum::<u64>(),
            3 * tx
        );
        // The SFU agrees.
        let s = &r["sfu"];
        assert_eq!(s["media_accepted"].as_u64().unwrap(), tx);
        assert_eq!(s["copies"].as_u64().unwrap(), 2 * tx);
        assert_eq!(s["leaves"], 3);
        assert_eq!(s["clients"], 0);
        assert_eq!(r["copies_per_packet"].as_f64().unwrap(), 3.0);
    });
}

#[test]
fn client_command_socket() {
    client_cli("socket", "client");
}

#[test]
fn load_command_mmsg() {
    client_cli("mmsg", "load");
}

/// `ringway lab sfu --netns`: the SFU in one namespace host, each client in
/// its own host (veth to one bridge); the table is printed and the
/// namespaces are gone afterwards.
#[test]
fn lab_sfu_in_veth_hosts() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("lab.json");
    let (pid, stdout) = lab_sfu_netns(
        &[
            "--reps",
            "2",
            "--duration",
            "1",
            "--clients",
            "2,3",
            "--pps",
            "300",
        ],
        &json,
    );
    assert!(stdout.contains("delay model socket"), "{stdout}");
    assert!(stdout.contains("overall mmsg vs socket"), "{stdout}");
    let v = read_json(&json);
    let runs = v["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 2 * 2 * 2);
    for r in runs {
        // Every packet: clients − 1 subscribers + echo.
        let n = r["clients"].as_u64().unwrap() as f64;
        assert_eq!(r["copies_per_packet"].as_f64().unwrap(), n, "{r}");
        assert!(r["media"].as_u64().unwrap() > 0);
        assert_eq!(r["client_lost"], 0, "{r}");
    }
    let rows = v["summary"]["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 4);
    // The topology (host "sfu" + one host per client, bridge) is gone.
    no_namespaces_of(pid);
}

/// `ringway sfu load --netns`: starts the SFU in host `sfu` and puts each
/// client's socket in its own host; exact counts at both ends.
#[test]
fn load_netns_testbed() {
    let dir = tempfile::tempdir().unwrap();
    let (sj, lj) = (dir.path().join("sfu.json"), dir.path().join("load.json"));
    let st = Command::new(BIN)
        .args([
            "sfu",
            "load",
            "--netns",
            "--clients",
            "4",
            "--server",
            "0.0.0.0:5004",
        ])
        .args([
            "--duration",
            "1",
            "--interval-ms",
            "10",
            "--stats-interval",
            "0",
        ])
        .args(["--sfu-backend", "mmsg", "--sfu-json"])
        .arg(&sj)
        .arg("--json")
        .arg(&lj)
        .status()
        .unwrap();
    assert!(st.success());
    let (s, l) = (read_json(&sj), read_json(&lj));
    let tx = l["tx_packets"].as_u64().unwrap();
    assert!(tx > 0);
    assert_eq!(s["sfu"]["media_accepted"].as_u64().unwrap(), tx);
    assert_eq!(s["sfu"]["copies"].as_u64().unwrap(), 3 * tx);
    assert_eq!(l["media_packets"].as_u64().unwrap(), 3 * tx);
    assert_eq!(l["echoes"].as_u64().unwrap(), tx);
    assert_eq!(s["sfu"]["drop_unverified"], 0);
    assert_eq!(s["backend"], "mmsg");
}
