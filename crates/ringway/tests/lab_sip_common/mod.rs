//! Shared by the `ringway lab sip` tests (`lab_sip_sweep.rs`,
//! `lab_sip_netns.rs`).

use std::path::Path;
use std::process::{Command, Output};

pub(crate) const BIN: &str = env!("CARGO_BIN_EXE_ringway");

/// Run `ringway lab sip --out OUT --state-file OUT/state.json EXTRA` to
/// the end (at most 300 s) with its output captured.
pub(crate) fn lab(out: &Path, extra: &[&str]) -> Output {
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

/// [`lab`] on this shared machine: the proxy on one core, the generator on
/// another, and other load on the machine flagging no run (the report's
/// content is under test, not the machine's quiet).
pub(crate) fn lab_on_shared_machine(out: &Path, extra: &[&str]) -> Output {
    let shared = [
        "--cores",
        "1",
        "--gen-cpus",
        "1",
        "--max-foreign-cpu",
        "100",
    ];
    lab(out, &[extra, &shared[..]].concat())
}
