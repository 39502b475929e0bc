//! `ringway lab sip`: parameter validation, a short real sweep against
//! Kamailio (every run in its own private network namespace), report
//! files and table shapes, resume after an interruption, and a proxy that
//! dies being reported while the sweep goes on.

use std::path::Path;
use std::process::{Command, Output};

const BIN: &str = env!("CARGO_BIN_EXE_ringway");

fn lab(out: &Path, extra: &[&str]) -> Output {
    Command::new("timeout")
        .arg("300")
        .arg(BIN)
        .args(["lab", "sip", "--out"])
        .arg(out)
        .arg("--state-file")
        .arg(out.join("state.json"))
        .args(extra)
        .output()
        .unwrap()
}

const SHORT: &[&str] = &[
    "--proxy",
    "kamailio",
    "--workers",
    "1",
    "--rate-start",
    "100",
    "--rate-step",
    "100",
    "--rate-max",
    "200",
    "--reps",
    "1",
    "--duration",
    "1",
    "--refine",
    "0",
];

#[test]
fn impossible_parameters_fail_before_anything_runs() {
    let dir = tempfile::tempdir().unwrap();
    let cases: &[(&[&str], &str)] = &[
        (&["--rate-start=0"], "--rate-start must be > 0"),
        (&["--rate-step=-1"], "--rate-step must be > 0"),
        (&["--workers", "0"], "worker count 0"),
        (&["--reps", "0"], "--reps must be"),
        (&["--workers", ""], "worker"),
        (&["--profiles", "turbo"], "unknown scheduler profile"),
        (&["--rate-max", "100000", "--duration", "60"], "per run"),
        (
            &["--rate-start", "0.5", "--duration", "1"],
            "starts no call",
        ),
        (
            &["--rate-start", "500", "--rate-max", "200"],
            "below --rate-start",
        ),
        (&["--threshold", "0"], "--threshold"),
        (
            &["--proxy", "kamailio", "--kamailio", "/nonexistent/kamailio"],
            "kamailio binary /nonexistent/kamailio not found",
        ),
        (&["--proxy", "asterisk"], "unknown proxy"),
    ];
    for (args, msg) in cases {
        let out = lab(dir.path(), args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} accepted");
        assert!(err.contains(msg), "{args:?}: expected {msg:?} in {err}");
        assert!(
            !dir.path().join("runs.jsonl").exists(),
            "{args:?} ran something"
        );
    }
}

fn jsonl_lines(dir: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(dir.join("runs.jsonl"))
        .unwrap()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

#[test]
fn sweep_writes_report_and_resumes() {
    let dir = tempfile::tempdir().unwrap();
    let out = lab(dir.path(), SHORT);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    let runs = jsonl_lines(dir.path());
    assert_eq!(runs.len(), 2, "{err}");
    for r in &runs {
        assert!(r["error"].is_null(), "{r:#}");
        assert_eq!(r["failed_ratio"], 0.0, "{r:#}");
        assert!(r["attempted"].as_u64().unwrap() > 50);
        // Record-Routed calls: 6 messages per call reach the proxy.
        assert!(r["total_msgs"].as_u64().unwrap() >= 6 * r["attempted"].as_u64().unwrap());
        assert!(r["proxy_cpu_s"].as_f64().unwrap() > 0.0);
    }
    for f in [
        "runs.csv",
        "runs.json",
        "capacity.json",
        "report.md",
        "pdr.svg",
        "krcv.svg",
        "index.html",
    ] {
        assert!(dir.path().join(f).is_file(), "{f} missing");
    }
    let csv = std::fs::read_to_string(dir.path().join("runs.csv")).unwrap();
    let lines: Vec<&str> = csv.lines().collect();
    assert_eq!(lines.len(), 3);
    let ncol = lines[0].split(',').count();
    assert!(lines.iter().all(|l| l.split(',').count() == ncol));
    let md = std::fs::read_to_string(dir.path().join("report.md")).unwrap();
    assert!(md.contains(
        "| Workers | Call rate (calls/s) | Arrival rate (packets/s) | T_sip (µs) | K_rcv (µs) | RCV errors | Total messages | Drop rate (%) | Failed calls (%) |"
    ));
    // Two rates under the threshold: capacity is a lower bound; both rates
    // around the (not reached) crossing are in the table, Kamailio's
    // per-message latencies are n/a.
    assert!(
        md.contains("| kamailio/default | 1 | ≥ 200 (never crossed)"),
        "{md}"
    );
    assert!(md.contains("| 1 | 200 | "), "{md}");
    assert!(md.contains("| n/a | n/a |"), "{md}");
    let cap: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("capacity.json")).unwrap()).unwrap();
    assert_eq!(cap["capacities"][0]["capacity_cps"], 200.0);
    let html = std::fs::read_to_string(dir.path().join("index.html")).unwrap();
    assert!(html.contains("<img src=\"pdr.svg\"") && html.matches("<table>").count() >= 3);

    // Interrupted sweep: the last record is lost and a half-written line remains.
    let text = std::fs::read_to_string(dir.path().join("runs.jsonl")).unwrap();
    let first = text.lines().next().unwrap();
    std::fs::write(
        dir.path().join("runs.jsonl"),
        format!("{first}\n{{\"spec\": {{\"proxy\": \"kam"),
    )
    .unwrap();
    let out = lab(dir.path(), SHORT);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert_eq!(err.matches("(from runs.jsonl)").count(), 1, "{err}");
    assert_eq!(err.matches("max  elapsed").count(), 1, "{err}");
    assert_eq!(jsonl_lines(dir.path()).len(), 2);
    // Complete: nothing left to run.
    let out = lab(dir.path(), SHORT);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.matches("(from runs.jsonl)").count(), 2, "{err}");
    assert_eq!(err.matches("max  elapsed").count(), 0, "{err}");
    assert_eq!(jsonl_lines(dir.path()).len(), 2);
}

#[test]
fn dying_proxy_is_reported_and_sweep_continues() {
    let dir = tempfile::tempdir().unwrap();
    // A "kamailio" that starts the real one and kills it 0.8 s later.
    let fake = dir.path().join("dying-kamailio");
    std::fs::write(
        &fake,
        "#!/bin/sh\n/usr/sbin/kamailio \"$@\" &\nK=$!\nsleep 0.8\nkill $K\nexit 7\n",
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
    let f = fake.display().to_string();
    let args = [
        "--proxy",
        "kamailio",
        "--workers",
        "1",
        "--rate-start",
        "100",
        "--rate-step",
        "100",
        "--rate-max",
        "200",
        "--reps",
        "1",
        "--duration",
        "2",
        "--refine",
        "0",
        "--kamailio",
        &f,
    ];
    let out = lab(dir.path(), &args);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    let runs = jsonl_lines(dir.path());
    assert_eq!(runs.len(), 2, "both points attempted: {err}");
    for r in &runs {
        let e = r["error"].as_str().unwrap_or_default();
        assert!(e.contains("died during the run"), "{r:#}");
    }
    let md = std::fs::read_to_string(dir.path().join("report.md")).unwrap();
    assert!(
        md.contains("## Failed runs") && md.contains("n/a (all runs failed)"),
        "{md}"
    );
}
