//! Worker placement requests are applied through ringway-io and every
//! result (applied or refused) is printed at start and listed in the summary.

mod sip_proxy_support;

use sip_proxy_support::*;
use std::time::{Duration, Instant};

#[test]
fn placement_results_are_reported() {
    let (lines, summary) = in_bed(|procs, dir| {
        let p = start_proxy(
            procs,
            dir,
            &[
                "--listen",
                "127.0.0.1:5060",
                "--workers",
                "2",
                "--cpus",
                "0",
                "--nice",
                "3",
                "--slice-us",
                "2000",
            ],
        );
        // 3 knobs x 2 workers and the timer thread's affinity; lines may
        // come before or after "listening on".
        let mut lines: Vec<String> = p
            .startup
            .iter()
            .filter(|l| l.contains("placement"))
            .cloned()
            .collect();
        let end = Instant::now() + Duration::from_secs(10);
        while lines.len() < 7 && Instant::now() < end {
            if let Ok(l) = p.stderr.recv_timeout(Duration::from_millis(200)) {
                if l.contains("placement") {
                    lines.push(l);
                }
            }
        }
        (lines, stop_proxy(procs, &p))
    });
    assert_eq!(lines.len(), 7, "{lines:?}");
    // The timer thread runs on the workers' CPUs (affinity only).
    assert!(
        lines.iter().any(|l| l.contains("sip-timer: affinity [0]")),
        "{lines:?}"
    );
    for w in ["sip-w0", "sip-w1"] {
        for knob in ["affinity [0]", "nice 3", "slice 2000 us"] {
            let l = lines
                .iter()
                .find(|l| l.contains(w) && l.contains(knob))
                .unwrap_or_else(|| panic!("no {knob} line for {w}: {lines:?}"));
            assert!(l.contains("-> applied") || l.contains("-> refused"), "{l}");
        }
        // Raising one's own nice value is always permitted.
        assert!(lines
            .iter()
            .any(|l| l.contains(w) && l.contains("nice 3 -> applied")));
    }
    let listed = summary["placement"].as_array().unwrap();
    assert_eq!(listed.len(), 7, "{listed:?}");
}
