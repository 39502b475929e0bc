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
/// namespaces are gone afterwards. Every block has the A/A arm
/// (`socket#aa`); the runs go to a state file, and a resumed grid makes
/// only the runs missing there.
#[test]
fn lab_sfu_in_veth_hosts() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("lab.json");
    let state = dir.path().join("state.jsonl");
    let state_arg = state.to_str().unwrap();
    let grid = [
        "--state",
        state_arg,
        "--reps",
        "1",
        "--clients",
        "2,3",
        "--pps",
        "300",
        "--backends",
        "socket,mmsg,xdp",
        // The stretch's in-kernel fan-out as a fourth column (`tc`).
        "--kernel-fanout",
    ];
    let (pid, stdout) = lab_sfu_netns(&grid, &json);
    assert!(
        stdout.contains("delay model socket: d(n) = k_rcv + n * k_snd"),
        "{stdout}"
    );
    assert!(
        stdout.contains("delay model xdp: d(n) = u_rx + n * u_tx"),
        "{stdout}"
    );
    assert!(stdout.contains("overall mmsg vs socket: cpu"), "{stdout}");
    assert!(stdout.contains("Fig. 3/4 shape, 300 pps"), "{stdout}");
    assert!(stdout.contains("Fig. 5 shape, 300 pps"), "{stdout}");
    assert!(!stdout.contains("0.00x"), "{stdout}");
    let v = read_json(&json);
    let runs = v["runs"].as_array().unwrap();
    // 2 blocks × (socket, socket#aa, mmsg, xdp, tc), each block's order
    // recorded.
    assert_eq!(runs.len(), 2 * 5);
    assert_eq!(
        runs.iter().filter(|r| r["backend"] == "socket#aa").count(),
        2,
        "{stdout}"
    );
    for block in 0..2 {
        let mut order: Vec<u64> = runs
            .iter()
            .filter(|r| r["block"] == block)
            .map(|r| r["order"].as_u64().unwrap())
            .collect();
        order.sort();
        assert_eq!(order, [0, 1, 2, 3, 4], "{stdout}");
    }
    assert!(stdout.contains("A/A: the noise floor"), "{stdout}");
    for r in runs {
        // Every packet: clients − 1 subscribers + echo (the kernel's
        // copies are not counted: n/a).
        let n = r["clients"].as_u64().unwrap() as f64;
        if r["backend"] == "tc" {
            assert!(r["copies_per_packet"].is_null(), "{r}");
            assert!(r["cpu_per_packet_us"].is_null(), "{r}");
        } else {
            assert_eq!(r["copies_per_packet"].as_f64().unwrap(), n, "{r}");
        }
        assert!(r["media"].as_u64().unwrap() > 0);
        assert_eq!(r["client_lost"], 0, "{r}");
        // Socket receive: the AF_XDP counters have no data (null, not 0).
        assert_eq!(r["client_rx"], "mmsg", "{r}");
        assert!(r["client_rx_via_kernel"].is_null(), "{r}");
        // The testbed's sender runs real-time by default (read back from
        // the kernel at the end of the run).
        assert_eq!(r["load_sender_policy"], "fifo:10", "{r}");
        // CPU per emulated host: the SFU host and the switch threads.
        assert!(r["sfu_host_pct"].as_f64().is_some(), "{r}");
        assert!(r["switch_pct"].as_f64().is_some(), "{r}");
        if r["backend"] == "tc" {
            // The kernel forwards: the engine's per-packet delays say n/a
            // (null), the kernel's own mean pickup-to-scheduled is there.
            assert!(r["delay_p50_us"].is_null(), "{r}");
            assert!(r["delay_mean_us"].as_f64().is_some_and(|x| x > 0.0), "{r}");
            continue;
        }
        // The four delays have data for every backend (xdp's kernel RX
        // time comes from its XDP program).
        for k in [
            "delay_p50_us",
            "handoff_p50_us",
            "wait_p50_us",
            "kdelay_p50_us",
        ] {
            assert!(r[k].as_f64().is_some_and(|x| x > 0.0), "{k}: {r}");
        }
    }
    let rows = v["rows"].as_array().unwrap();
    assert!(rows.len() + v["excluded"].as_array().unwrap().len() >= 4);
    // One object per backend (socket, socket#aa, mmsg, xdp, tc) with the
    // five ratios to socket.
    let backends = v["backends"].as_array().unwrap();
    assert_eq!(backends.len(), 5, "{stdout}");
    let xdp = backends.iter().find(|b| b["backend"] == "xdp").unwrap();
    for k in [
        "cpu_ratio",
        "delay_p50_ratio",
        "handoff_p50_ratio",
        "wait_p50_ratio",
        "kdelay_p50_ratio",
        "cpu_pct",
        "delay_p50_us",
        "kdelay_p50_us",
    ] {
        assert!(xdp.get(k).is_some(), "{k} missing: {xdp}");
    }
    // The topology (host "sfu" + one host per client, bridge) is gone.
    no_namespaces_of(pid);
    // Every run is in the state file (a header line, then one per run).
    let text = std::fs::read_to_string(&state).unwrap();
    assert_eq!(text.lines().count(), 1 + 2 * 5, "{text}");
    // Without --resume the state is not overwritten.
    let (_, refused) = run_ringway(&[
        "lab",
        "sfu",
        "--netns",
        "--state",
        state_arg,
        "--reps",
        "1",
        "--duration",
        "1",
    ]);
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("--resume"));
    // A grid cut short: one run lost. Resumed, it makes that one only.
    let mut lines: Vec<&str> = text.lines().collect();
    let lost: serde_json::Value = serde_json::from_str(lines.pop().unwrap()).unwrap();
    std::fs::write(&state, lines.join("\n") + "\n").unwrap();
    let (pid, stdout) = lab_sfu_netns(
        &[&grid[..], &["--resume", "--calibrate", "0"][..]].concat(),
        &json,
    );
    assert!(
        stdout.contains("9 runs already there, 1 to make"),
        "{stdout}"
    );
    let made: Vec<&str> = stdout
        .lines()
        .filter(|l| l.starts_with("run rep="))
        .collect();
    assert_eq!(made.len(), 1, "{stdout}");
    assert!(
        made[0].contains(&format!("backend={} ", lost["backend"].as_str().unwrap())),
        "{stdout}"
    );
    assert_eq!(read_json(&json)["runs"].as_array().unwrap().len(), 2 * 5);
    no_namespaces_of(pid);
}

/// `ringway lab sfu --netns --client-io xdp`: the load clients receive
/// and send through AF_XDP on their own veths. Every run has its echoes
/// (only the clients' receive path carries them) and nothing lost, none of
/// it came through the companion sockets (the XDP programs redirected it
/// all), the media went out through the TX rings (only the first ticks,
/// before each client's next hop is known, through the companion sockets),
/// and the clients' CPU is reported beside the SFU's.
#[test]
fn lab_sfu_clients_receive_and_send_through_af_xdp() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("lab.json");
    let grid = [
        "--reps",
        "1",
        "--clients",
        "3",
        "--pps",
        "300",
        "--backends",
        "socket,xdp",
        "--client-io",
        "xdp",
    ];
    let (pid, stdout) = lab_sfu_netns(&grid, &json);
    assert!(
        stdout.contains("clients receive and send through AF_XDP"),
        "{stdout}"
    );
    let v = read_json(&json);
    let runs = v["runs"].as_array().unwrap();
    // socket, socket#aa, xdp
    assert_eq!(runs.len(), 3, "{stdout}");
    for r in runs {
        // The backends that ran, not the option asked for.
        assert_eq!(r["client_rx"], "xdp", "{r}");
        assert_eq!(r["client_rx_via_kernel"], 0, "{r}");
        // A checksum the rings rejected would show as loss only.
        assert_eq!(r["client_rx_rejected"], 0, "{r}");
        assert_eq!(r["client_rx_ring_drops"], 0, "{r}");
        assert_eq!(r["client_tx"], "xdp", "{r}");
        // A few first ticks per client at most (3 datagrams each).
        let via_kernel = r["client_tx_via_kernel"].as_u64().expect("AF_XDP sends");
        assert!(via_kernel <= 3 * 3 * 4, "{r}");
        assert_eq!(r["client_tx_drops"], 0, "{r}");
        assert!(
            r["client_rtt_p50_us"].as_f64().is_some_and(|x| x > 0.0),
            "{r}"
        );
        assert_eq!(r["client_lost"], 0, "{r}");
        assert!(r["media"].as_u64().unwrap() > 0, "{r}");
        assert!(r["clients_pct"].as_f64().is_some(), "{r}");
    }
    no_namespaces_of(pid);
    // Without the testbed there is no client veth to attach to.
    let (_, refused) = run_ringway(&["lab", "sfu", "--client-io", "xdp", "--duration", "1"]);
    assert!(!refused.status.success());
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("--client-io xdp needs --netns"),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );
}

/// `ringway lab sfu --capacity`: the clients rise per backend until a
/// limit; the curve and the load each backend carried are printed.
#[test]
fn lab_sfu_capacity_curve() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("cap.json");
    let (pid, stdout) = lab_sfu_netns(
        &[
            "--capacity",
            "--capacity-clients",
            "2,3",
            "--capacity-pps",
            "300",
            "--backends",
            "socket,xdp",
        ],
        &json,
    );
    assert!(
        stdout.contains("capacity (loss <= 1% and engine CPU < 95% of a core, valid runs only)"),
        "{stdout}"
    );
    assert!(
        stdout.contains("carried socket: 3 clients, 900 pps in"),
        "{stdout}"
    );
    assert!(
        stdout.contains("carried xdp: 3 clients, 900 pps in (1.00x socket)"),
        "{stdout}"
    );
    let v = read_json(&json);
    let points = v["capacity"]["points"].as_array().unwrap();
    assert_eq!(points.len(), 4, "{v}");
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

/// `sfu load --netns --sfu-json`: when the clients fail after the SFU
/// started, the SFU is stopped, its report is still written with the
/// error, the command fails, and the testbed is gone.
#[test]
fn load_netns_failure_writes_sfu_json_with_the_error() {
    let dir = tempfile::tempdir().unwrap();
    let sj = dir.path().join("sfu.json");
    let (pid, out) = run_ringway(&[
        "sfu",
        "load",
        "--netns",
        "--clients",
        "2",
        "--server",
        "0.0.0.0:5004",
        "--interval-ms",
        "0",
        "--stats-interval",
        "0",
        "--sfu-json",
        sj.to_str().unwrap(),
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("--interval-ms must be positive"),
        "{stderr}"
    );
    let s = read_json(&sj);
    assert!(
        s["error"]
            .as_str()
            .is_some_and(|e| e.contains("--interval-ms must be positive")),
        "{s}"
    );
    // The SFU ran: its report is there, with nothing forwarded.
    assert_eq!(s["backend"], "socket", "{s}");
    assert_eq!(s["sfu"]["media_accepted"], 0, "{s}");
    no_namespaces_of(pid);
}
