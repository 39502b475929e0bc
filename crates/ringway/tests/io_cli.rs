//! `ringway doctor` and `ringway bench io` through the real binary.

use std::process::Command;

fn ringway() -> Command {
    Command::new(env!("CARGO_BIN_EXE_ringway"))
}

#[test]
fn doctor_json_reports_probes() {
    let out = ringway().args(["doctor", "--json"]).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let checks = v["checks"].as_array().unwrap();
    let find = |n: &str| {
        checks
            .iter()
            .find(|c| c["name"] == n)
            .unwrap_or_else(|| panic!("no check {n}"))
    };
    // Loopback UDP works on any Linux that runs the suite.
    assert_eq!(find("backend socket")["ok"], true);
    assert_eq!(find("backend mmsg")["ok"], true);
    // io_uring may be missing or disabled; then the check says why.
    let u = find("backend uring");
    assert_eq!(
        u["ok"],
        ringway_io::BackendKind::Uring.availability().is_ok(),
        "{u}"
    );
    for n in [
        "tc netem",
        "io_uring",
        "perf hardware counters",
        "debugfs sched knobs",
        "SCHED_FIFO",
    ] {
        assert!(
            find(n)["detail"].as_str().is_some_and(|d| !d.is_empty()),
            "{n}"
        );
    }
    assert!(v["kernel"].as_str().unwrap().len() > 3);
}

#[test]
fn doctor_text_lists_areas() {
    let out = ringway().arg("doctor").output().unwrap();
    assert!(out.status.success());
    let t = String::from_utf8_lossy(&out.stdout);
    for a in [
        "[io]",
        "[timestamps]",
        "[offload]",
        "[kernel]",
        "[impair]",
        "[sched]",
        "[perf]",
        "[sysctl]",
    ] {
        assert!(t.contains(a), "{a} missing in:\n{t}");
    }
}

#[test]
fn bench_io_json_is_bounded_and_complete() {
    let start = std::time::Instant::now();
    let out = ringway()
        .args([
            "bench",
            "io",
            "--seconds",
            "0.2",
            "--payload",
            "64",
            "--json",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(start.elapsed().as_secs() < 60);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let rows = v["rows"].as_array().unwrap();
    let paths: Vec<&str> = rows.iter().map(|r| r["path"].as_str().unwrap()).collect();
    let unavailable = v["unavailable"].as_array().unwrap();
    if ringway_io::BackendKind::Uring.availability().is_ok() {
        assert_eq!(paths, ["socket", "mmsg", "uring", "gso->mmsg"]);
        assert!(unavailable.is_empty());
    } else {
        assert_eq!(paths, ["socket", "mmsg", "gso->mmsg"]);
        assert_eq!(unavailable[0][0], "uring");
    }
    for r in rows {
        let sent = r["sent"].as_u64().unwrap();
        assert!(sent > 0);
        assert_eq!(
            r["received"].as_u64().unwrap() + r["socket_drops"].as_u64().unwrap(),
            sent
        );
    }
    assert!(v["conclusion"].as_str().unwrap().contains("mmsg receives"));
}

#[test]
fn bench_io_rejects_bad_input() {
    let out = ringway()
        .args(["bench", "io", "--seconds", "0.1", "--payload", "0"])
        .output()
        .unwrap();
    assert!(!out.status.success());
}
