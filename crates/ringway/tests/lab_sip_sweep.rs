//! `ringway lab sip`: parameter validation (impossible combinations refused
//! before anything starts), a short real sweep against Kamailio (every run
//! in its own private network namespace), report files and table shapes,
//! resume after an interruption, a proxy that dies being reported while the
//! sweep goes on, and a short ringway run under the papers' modes (knobs
//! applied or refused with reasons, six message types, thread statistics).

mod lab_sip_common;

use lab_sip_common::*;
use std::path::Path;
use std::process::Command;

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
    "--profiles",
    "default",
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
        (
            &["--cores", "1,2", "--gen-cpus", "1"],
            "--cores 2: the proxy can have 1..=1 CPUs here",
        ),
        (
            &["--cores", "64"],
            "larger core counts need a larger machine",
        ),
        (
            &["--proxy-cpus", "1", "--gen-cpus", "1"],
            "--gen-cpus overlaps the proxy's CPUs",
        ),
        (&["--gen-cpus", "4000"], "--gen-cpus"),
        (&["--profiles", "tuned"], "list baseline before tuned"),
        (
            &["--rx-model", "ring"],
            "--rx-model must be shared or reuseport",
        ),
        (&["--batch", "0"], "--batch must be in 1..=1024"),
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
    // A mode file with a key the lab does not know.
    let mode = dir.path().join("typo.toml");
    std::fs::write(
        &mode,
        "name = \"typo\"\n[knobs]\nsched_latency_ns = 800000\n",
    )
    .unwrap();
    let mode = mode.display().to_string();
    let file_case = [("--profiles", mode.as_str())];
    let mut all: Vec<(Vec<&str>, &str)> = cases.iter().map(|(a, m)| (a.to_vec(), *m)).collect();
    all.push((
        vec![file_case[0].0, file_case[0].1],
        "unknown field `sched_latency_ns`",
    ));
    for (args, msg) in &all {
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
fn comparisons_without_enough_blocks_or_rates_fail_before_anything_runs() {
    let dir = tempfile::tempdir().unwrap();
    let compare = |extra: &[&str]| {
        Command::new("timeout")
            .arg("60")
            .arg(BIN)
            .args(["lab", "sip", "compare", "--out"])
            .arg(dir.path())
            .arg("--state-file")
            .arg(dir.path().join("state.json"))
            .args(["--gen-cpus", "1", "--proxy", "kamailio"])
            .args(extra)
            .output()
            .unwrap()
    };
    for (args, msg) in [
        (
            &["--at-rates", "200", "--reps", "1"][..],
            "at least 2 blocks",
        ),
        (
            &["--at-rates", "200", "--profiles", "baseline,tuned"][..],
            "tuned",
        ),
        (&["--reps", "3"][..], "--at-rates"),
        (
            &["--at-rates", "200", "--emulated-service-us", "exp:0"][..],
            "emulated service time",
        ),
    ] {
        let out = compare(args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} accepted");
        assert!(err.contains(msg), "{args:?}: expected {msg:?} in {err}");
        assert!(
            !dir.path().join("runs.jsonl").exists(),
            "{args:?} ran something"
        );
    }
}

#[test]
fn sweep_writes_report_and_resumes() {
    let dir = tempfile::tempdir().unwrap();
    let out = lab_on_shared_machine(dir.path(), SHORT);
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
        "pdr-kamailio.svg",
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
    // The papers' Table I shape: threads × loads as columns, their rows.
    // Which loads are columns depends on where the crossing fell (on a
    // busy machine Kamailio may drop at 200 cps already): 200 cps is one.
    assert!(
        md.lines()
            .any(|l| l.starts_with("|  | 1 thr ") && l.contains("1 thr 200 cps |")),
        "{md}"
    );
    for row in [
        "| Arrival rate (packets/s) |",
        "| T_sip (µs) | n/a |",
        "| K_rcv (µs) | n/a |",
        "| RCV errors (proxy socket drops) |",
        "| Call-setup drops | n/a |",
        "| Total messages |",
        "| PDR (%) |",
    ] {
        assert!(md.contains(row), "{row} missing:\n{md}");
    }
    let valid = runs
        .iter()
        .all(|r| r["flags"].as_array().unwrap().is_empty());
    if valid {
        // Two rates under the threshold: capacity is a lower bound.
        assert!(
            md.contains("| kamailio/default c1 | 1 | 1 | ≥ 200 (never crossed)"),
            "{md}"
        );
        let cap: serde_json::Value =
            serde_json::from_slice(&std::fs::read(dir.path().join("capacity.json")).unwrap())
                .unwrap();
        assert_eq!(cap["capacities"][0]["capacity_cps"], 200.0);
    } else {
        // Only a busy machine makes the generator fall behind or puts
        // other load on the proxy's CPU; it is said.
        for r in &runs {
            for f in r["flags"].as_array().unwrap() {
                let f = f.as_str().unwrap();
                assert!(
                    f.contains("generator fell behind") || f.contains("other load took"),
                    "{r:#}"
                );
            }
        }
    }
    for r in &runs {
        // The generator on CPU 1, Kamailio's process tree on CPU 0.
        assert_eq!(r["spec"]["gen_cpus"], serde_json::json!([1]));
        assert_eq!(r["spec"]["proxy_cpus"], serde_json::json!([0]));
        let threads = r["threads"].as_array().unwrap();
        assert!(threads.len() >= 2, "kamailio's children: {r:#}");
        assert!(threads.iter().all(|t| t["cpus_allowed"] == "0"), "{r:#}");
    }
    let html = std::fs::read_to_string(dir.path().join("index.html")).unwrap();
    assert!(html.contains("<img src=\"pdr-kamailio.svg\"") && html.matches("<table>").count() >= 3);
    // Kamailio has no K_rcv: no empty K_rcv plot.
    assert!(!dir.path().join("krcv-kamailio.svg").exists());

    // Interrupted sweep: the last record is lost and a half-written line remains.
    let text = std::fs::read_to_string(dir.path().join("runs.jsonl")).unwrap();
    let first = text.lines().next().unwrap();
    std::fs::write(
        dir.path().join("runs.jsonl"),
        format!("{first}\n{{\"spec\": {{\"proxy\": \"kam"),
    )
    .unwrap();
    let out = lab_on_shared_machine(dir.path(), SHORT);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert_eq!(err.matches("(from runs.jsonl)").count(), 1, "{err}");
    assert_eq!(err.matches("max  elapsed").count(), 1, "{err}");
    assert_eq!(jsonl_lines(dir.path()).len(), 2);
    // Complete: nothing left to run.
    let out = lab_on_shared_machine(dir.path(), SHORT);
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
        "--profiles",
        "default",
        "--gen-cpus",
        "1",
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
        md.contains("## Failed runs") && md.contains("n/a (no valid run)"),
        "{md}"
    );
}

#[test]
fn ringway_under_the_papers_modes_records_what_was_applied_and_refused() {
    let dir = tempfile::tempdir().unwrap();
    let out = lab(
        dir.path(),
        &[
            "--proxy",
            "ringway",
            "--workers",
            "1",
            "--profiles",
            "default,baseline,enhanced",
            "--cores",
            "1",
            "--gen-cpus",
            "1",
            "--rate-start",
            "200",
            "--rate-step",
            "200",
            "--rate-max",
            "200",
            "--reps",
            "2",
            "--duration",
            "1",
        ],
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    let runs = jsonl_lines(dir.path());
    assert_eq!(runs.len(), 6, "{err}");
    let by_mode = |m: &str| -> Vec<&serde_json::Value> {
        runs.iter().filter(|r| r["spec"]["sched"] == m).collect()
    };
    for r in &runs {
        assert!(r["error"].is_null(), "{r:#}");
        // The six message types, the 200 to BYE apart.
        for t in ["INVITE", "180", "200", "ACK", "BYE", "200-BYE"] {
            assert!(r["by_type"][t]["count"].as_u64().unwrap() > 0, "{t}: {r:#}");
        }
        assert!(r["all"]["wait"]["count"].as_u64().unwrap() > 0, "{r:#}");
        assert_eq!(r["per_worker_in"].as_array().unwrap().len(), 1);
        assert_eq!(r["topology"]["cores"], 1);
        assert!(!r["threads"].as_array().unwrap().is_empty());
        assert!(r["kernel"].as_str().unwrap().contains('.'));
        // The drop rate is the proxy sockets' drops over all offered messages.
        let pdr = r["pdr"].as_f64().unwrap();
        let want = r["proxy_socket_drops"].as_f64().unwrap() / r["total_msgs"].as_f64().unwrap();
        assert!((pdr - want).abs() < 1e-12, "{r:#}");
    }
    for r in by_mode("default") {
        assert!(r["refused"].as_array().unwrap().is_empty(), "{r:#}");
        assert!(r["spec"]["knobs"].as_object().unwrap().is_empty());
    }
    let kernel = runs[0]["kernel"].as_str().unwrap().to_string();
    let (major, minor) = kernel.split_once('.').unwrap();
    let eevdf = (major.parse::<u32>().unwrap(), minor.parse::<u32>().unwrap()) >= (6, 6);
    for m in ["baseline", "enhanced"] {
        for r in by_mode(m) {
            let refused: Vec<&str> = r["refused"]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_str().unwrap())
                .collect();
            let applied: Vec<&str> = r["applied"]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_str().unwrap())
                .collect();
            if eevdf {
                // sched_latency_ns is gone: refused with the reason, never skipped.
                assert!(
                    refused
                        .iter()
                        .any(|x| x.contains("latency_ns") && x.contains("EEVDF")),
                    "{refused:?}"
                );
            }
            // Every other knob is either applied or refused with a reason.
            assert!(!refused.is_empty() || !applied.is_empty(), "{r:#}");
        }
    }
    let md = std::fs::read_to_string(dir.path().join("report.md")).unwrap();
    assert!(md.contains("## Scheduler knobs"), "{md}");
    let same_b = by_mode("baseline")[0]["effective"].clone();
    let same_e = by_mode("enhanced")[0]["effective"].clone();
    if same_b == same_e {
        // At 1 thread both papers' modes ask for min_granularity 100 µs.
        assert!(
            md.contains("modes baseline, enhanced applied the same settings"),
            "{md}"
        );
    }
}
