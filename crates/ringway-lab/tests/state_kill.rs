//! A process that changed global settings through the state file is killed
//! with SIGKILL while they are changed; the next start restores them.
//!
//! The child is this test binary itself, run again with an environment
//! variable that makes `child_changes_knobs_and_waits` apply two knobs (fake
//! files standing in for /proc/sys and /sys/kernel/debug/sched/features)
//! and sleep until it is killed.

use ringway_lab::sched::{Knob, SysState};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

const CHILD_ENV: &str = "RINGWAY_STATE_KILL_CHILD_DIR";

fn knobs(dir: &Path) -> Vec<Knob> {
    vec![
        Knob {
            path: dir.join("sched_min_granularity_ns").display().to_string(),
            value: "100000".into(),
        },
        Knob {
            path: dir.join("sched/features").display().to_string(),
            value: "NO_RUN_TO_PARITY".into(),
        },
    ]
}

#[test]
fn child_changes_knobs_and_waits() {
    let Ok(dir) = std::env::var(CHILD_ENV) else {
        return; // only meaningful as the child of the test below
    };
    let dir = Path::new(&dir);
    let (state, msgs) = SysState::apply(&dir.join("state.json"), &knobs(dir));
    std::fs::write(dir.join("applied"), msgs.join("\n")).unwrap();
    std::thread::sleep(Duration::from_secs(60));
    drop(state);
}

#[test]
fn settings_are_restored_after_kill_9() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    std::fs::create_dir_all(dir.join("sched")).unwrap();
    let gran = dir.join("sched_min_granularity_ns");
    let feat = dir.join("sched/features");
    std::fs::write(&gran, "3000000\n").unwrap();
    // A features file lists every feature; the lab restores the one it changed.
    std::fs::write(&feat, "GENTLE_FAIR_SLEEPERS RUN_TO_PARITY PREEMPT_SHORT\n").unwrap();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child_changes_knobs_and_waits", "--nocapture"])
        .env(CHILD_ENV, dir)
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    while !dir.join("applied").exists() {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "child never applied"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // Changed, and the originals are on disk before anything is restored.
    assert_eq!(std::fs::read_to_string(&gran).unwrap(), "100000");
    assert_eq!(std::fs::read_to_string(&feat).unwrap(), "NO_RUN_TO_PARITY");
    let state = dir.join("state.json");
    assert!(state.exists());
    // SIGKILL: no destructor, no signal handler runs.
    let st = Command::new("kill")
        .args(["-KILL", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(st.success());
    let _ = child.wait();
    assert_eq!(
        std::fs::read_to_string(&gran).unwrap(),
        "100000",
        "still changed"
    );
    // The next start restores from the state file.
    let msgs = SysState::recover_under(&state, &[dir]);
    assert!(msgs[0].contains("leftover"), "{msgs:?}");
    assert_eq!(std::fs::read_to_string(&gran).unwrap(), "3000000");
    assert_eq!(std::fs::read_to_string(&feat).unwrap(), "RUN_TO_PARITY");
    assert!(!state.exists());
    assert!(SysState::recover_under(&state, &[dir]).is_empty());
}
