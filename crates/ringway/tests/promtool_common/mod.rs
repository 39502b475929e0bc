//! `promtool check metrics` for the integration tests that serve
//! Prometheus text (SIP proxy, dispatcher, SFU, JackTrip hub): one copy,
//! included by `sip_proxy_support` and `sfu_common`.

use std::io::Write;
use std::process::{Command, Stdio};

/// `promtool check metrics` (Debian package prometheus) finds nothing to
/// say about the Prometheus text `text`: it exits 0 and prints nothing
/// (no error, no lint warning).
pub(crate) fn assert_promtool_accepts(text: &str) {
    let mut promtool = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool (Debian package prometheus)");
    promtool
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = promtool.wait_with_output().unwrap();
    let report = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success() && report.trim().is_empty(),
        "promtool: {report}\n{text}"
    );
}
