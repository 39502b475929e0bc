//! `ringway lab sip --netns`: the generator and the proxy in namespaces of
//! their own on one veth pair; ringway on mmsg and on AF_XDP and Kamailio
//! measured at the same rates in one short run, each ringway backend with
//! and without receive coalescing (`--rx-coalesce-us 0,500`). The report has every
//! arm's row at every rate, every run valid (the xdp arm did not fall
//! back to a socket), the drop rate and CPU figures where an arm has data
//! and n/a (null) where it has none, the ratios, and no namespace is left.
//! Also the options that do not go together.

mod lab_sip_common;

use lab_sip_common::*;
use std::path::Path;

const KAMAILIO: &str = "/usr/sbin/kamailio";

/// The kernel runs AF_XDP; else skip, saying why.
fn xdp_here() -> bool {
    match ringway_io::BackendKind::Xdp.availability() {
        Ok(()) => true,
        Err(why) => {
            ringway_io::testing::skip(format!("the kernel refuses AF_XDP: {why}"));
            false
        }
    }
}

fn namespaces() -> Vec<String> {
    ringway_io::netns::list_netns().unwrap_or_default()
}

#[test]
fn one_short_run_compares_every_arm_on_the_same_wire() {
    if !xdp_here() {
        return;
    }
    let kamailio = Path::new(KAMAILIO).exists();
    if !kamailio {
        ringway_io::testing::skip(format!(
            "{KAMAILIO} is not installed (scripts/install-deps.sh): the kamailio arm is left out"
        ));
    }
    let proxies = if kamailio {
        "ringway,kamailio"
    } else {
        "ringway"
    };
    let before = namespaces();
    let dir = tempfile::tempdir().unwrap();
    let out = lab_on_shared_machine(
        dir.path(),
        &[
            "--netns",
            "--proxy",
            proxies,
            "--backends",
            "mmsg,xdp",
            "--rx-coalesce-us",
            "0,500",
            "--workers",
            "1",
            "--rates",
            "200,400",
            "--reps",
            "1",
            "--duration",
            "2",
        ],
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    let report: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("veth.json")).unwrap()).unwrap();
    let mut arms = vec![
        "ringway/mmsg",
        "ringway/mmsg+rx500us",
        "ringway/xdp",
        "ringway/xdp+rx500us",
    ];
    if kamailio {
        arms.push("kamailio");
    }
    let rows = report["rows"].as_array().unwrap();
    assert_eq!(rows.len(), arms.len() * 2, "{report:#}");
    for arm in &arms {
        for rate in [200.0, 400.0] {
            let row = rows
                .iter()
                .find(|r| r["arm"] == *arm && r["rate"].as_f64() == Some(rate))
                .unwrap_or_else(|| panic!("no row for {arm} at {rate}: {report:#}"));
            assert_eq!(row["runs"], 1, "{row:#}");
            // Valid: not flagged (generator behind, xdp fallen back), no error.
            assert_eq!(row["left_out"], serde_json::json!([]), "{row:#}");
            // Carried (the capacity's definition; a loaded CI machine may
            // lose the odd datagram).
            assert!(row["pdr"].as_f64().unwrap() < 0.01, "{row:#}");
            assert!(row["failed_ratio"].as_f64().unwrap() < 0.01, "{row:#}");
            for key in [
                "proxy_us_per_call",
                "proxy_process_us_per_call",
                "gen_us_per_call",
            ] {
                let v = row[key]
                    .as_f64()
                    .unwrap_or_else(|| panic!("{key}: {row:#}"));
                assert!(v > 0.0, "{key}: {row:#}");
            }
            // Stamped per packet by ringway only: n/a (null) for Kamailio, never 0.
            if *arm == "kamailio" {
                assert!(row["t_sip_us"].is_null(), "{row:#}");
                assert!(row["datagrams_per_wakeup"].is_null(), "{row:#}");
            } else {
                assert!(row["t_sip_us"].as_f64().unwrap() > 0.0, "{row:#}");
                assert!(
                    row["datagrams_per_wakeup"].as_f64().unwrap() >= 1.0,
                    "{row:#}"
                );
            }
        }
    }
    let ratios = report["ratios"].as_array().unwrap();
    let ratio = |what: &str| {
        ratios
            .iter()
            .find(|r| r["what"] == what && r["rate"].as_f64() == Some(400.0))
            .and_then(|r| r["ratio"].as_f64())
            .unwrap_or_else(|| panic!("no {what} at 400: {report:#}"))
    };
    assert!(ratio("ringway/xdp / ringway/mmsg CPU per call") > 0.0);
    assert!(ratio("ringway/xdp+rx500us / ringway/xdp CPU per call") > 0.0);
    if kamailio {
        assert!(ratio("ringway/xdp / kamailio CPU per call") > 0.0);
    }
    // Every run: the calls completed, the xdp proxy's drops include its
    // AF_XDP socket's, every run counted the wire's drops.
    let runs = std::fs::read_to_string(dir.path().join("veth").join("runs.jsonl")).unwrap();
    let runs: Vec<serde_json::Value> = runs
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(runs.len(), arms.len() * 2);
    for run in &runs {
        assert!(run["error"].is_null(), "{run:#}");
        assert!(run["attempted"].as_u64().unwrap() >= 300, "{run:#}");
        let (ok, tried) = (
            run["succeeded"].as_u64().unwrap(),
            run["attempted"].as_u64().unwrap(),
        );
        assert!(ok * 100 >= tried * 99, "{run:#}");
        assert!(run["wire_drops"].is_u64(), "{run:#}");
        assert!(run["proxy_napi_cpu_s"].as_f64().unwrap() > 0.0, "{run:#}");
        let xdp = run["spec"]["proxy"] == "ringway" && run["spec"]["backend"] == "xdp";
        // The window reached the proxy (a run whose proxy reports another
        // one is flagged, and no row has a flagged run: checked above).
        let coalesced = run["spec"]["rx_coalesce_us"].as_u64();
        assert!(coalesced.is_none() || coalesced == Some(500), "{run:#}");
        if run["spec"]["proxy"] == "ringway" {
            assert!(run["proxy_wakeups"].as_u64().unwrap() > 0, "{run:#}");
        }
        assert_eq!(run["xsk_drops"].is_u64(), xdp, "{run:#}");
        if run["spec"]["proxy"] == "ringway" {
            // The proxy itself counted (nearly) every call-setup message
            // the generator sent: they reached it through the wire.
            let (lost, sent) = (
                run["setup_drops"].as_u64().unwrap(),
                run["setup_msgs"].as_u64().unwrap(),
            );
            assert!(sent >= 4 * 300 && lost * 100 <= sent, "{run:#}");
        }
    }
    let md = std::fs::read_to_string(dir.path().join("veth.md")).unwrap();
    assert!(md.contains("| ringway/xdp | 1 | ≥ 400 |"), "{md}");
    let left: Vec<String> = namespaces()
        .into_iter()
        .filter(|n| !before.contains(n))
        .collect();
    assert!(left.is_empty(), "namespaces left behind: {left:?}");
}

#[test]
fn netns_options_that_do_not_go_together_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let cases: &[(&[&str], &str)] = &[
        (&["--netns"], "--rates"),
        (&["--rates", "100"], "--netns"),
        (
            &["--netns", "--rates", "100", "--rate-max", "200"],
            "--rate-max",
        ),
        (
            &[
                "--netns",
                "--rates",
                "100",
                "--backends",
                "xdp",
                "--workers",
                "2",
            ],
            "the proxy runs one worker on AF_XDP (--workers 1)",
        ),
        (
            &["--netns", "--rates", "0"],
            "--rates: 0 is not a positive rate",
        ),
        (&["--ipv6"], "--netns"),
        (&["--rx-coalesce-us", "200"], "--netns"),
        (
            &["--netns", "--rates", "100", "--rx-coalesce-us", "100001"],
            "--rx-coalesce-us 100001",
        ),
    ];
    for (args, want) in cases {
        let out = lab(dir.path(), args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} succeeded");
        assert!(err.contains(want), "{args:?}: {err}");
    }
}
