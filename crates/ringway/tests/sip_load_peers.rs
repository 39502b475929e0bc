//! `ringway sip load` against real peers, each test in a private network
//! namespace: SIPp as UAS (directly and through Kamailio) and Kamailio as
//! the proxy in front of the built-in UAS. Every call must succeed.

use ringway_io::netns::in_private_netns;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

const BIN: &str = env!("CARGO_BIN_EXE_ringway");

/// A child in its own process group; dropping it kills the whole group
/// (Kamailio forks workers that would outlive a killed parent).
struct Kill(Child);
impl Drop for Kill {
    fn drop(&mut self) {
        let group = format!("-{}", self.0.id());
        // SIGTERM first so the parent reaps its own children, then SIGKILL
        // whatever of the group is left.
        let _ = Command::new("kill").args(["-TERM", "--", &group]).status();
        for _ in 0..250 {
            if matches!(self.0.try_wait(), Ok(Some(_))) {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = Command::new("kill")
            .args(["-KILL", "--", &group])
            .stderr(Stdio::null())
            .status();
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn sipp_uas(port: u16) -> Kill {
    let c = Command::new("sipp")
        .args(["-sn", "uas", "-i", "127.0.0.1", "-p", &port.to_string()])
        .args(["-nostdin", "-timeout", "60"])
        .process_group(0)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("sipp installed");
    Kill(c)
}

fn kamailio(dir: &std::path::Path, workers: usize) -> Kill {
    let cfg = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../bench/kamailio/stateless.cfg"
    );
    let c = Command::new("/usr/sbin/kamailio")
        .args(["-DD", "-E", "-f", cfg, "-l", "udp:127.0.0.1:5060", "-n"])
        .arg(workers.to_string())
        .arg("-P")
        .arg(dir.join("k.pid"))
        .arg("-Y")
        .arg(dir)
        .args(["-m", "32", "-M", "4"])
        .process_group(0)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("kamailio installed");
    Kill(c)
}

fn wait_bound(port: u16) {
    for _ in 0..250 {
        if ringway_io::counters::udp_sockets()
            .unwrap_or_default()
            .iter()
            .any(|r| r.local.port() == port)
        {
            std::thread::sleep(Duration::from_millis(200));
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("nothing bound port {port}");
}

fn load(args: &[&str]) -> serde_json::Value {
    let out: Output = Command::new("timeout")
        .arg("60")
        .arg(BIN)
        .args(["sip", "load", "--quiet", "--json", "-"])
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "sip load failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("JSON summary")
}

fn assert_all_ok(s: &serde_json::Value, calls: u64) {
    assert_eq!(s["attempted"], calls, "{s:#}");
    assert_eq!(s["succeeded"], calls, "{s:#}");
    assert_eq!(s["failed_total"], 0, "{s:#}");
    assert_eq!(s["invite_to_200"]["count"], calls);
    assert_eq!(s["bye_to_200"]["count"], calls);
}

#[test]
fn calls_sipp_uas_directly() {
    let s = in_private_netns(|| {
        let _uas = sipp_uas(5070);
        wait_bound(5070);
        load(&[
            "--uas",
            "127.0.0.1:5070",
            "--rate",
            "200",
            "--calls",
            "300",
            "--duration",
            "10",
            "--threads",
            "2",
        ])
    })
    .unwrap();
    assert_all_ok(&s, 300);
    // Straight to the UAS: INVITE, ACK, BYE per call, nothing via a proxy.
    assert_eq!(s["msgs_to_proxy"], 0);
    assert_eq!(s["msgs_sent"], 900);
}

#[test]
fn calls_through_kamailio_to_builtin_uas_and_to_sipp() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_path_buf();
    let (own, sipp) = in_private_netns(move || {
        let _k = kamailio(&d, 2);
        wait_bound(5060);
        let own = load(&[
            "--proxy",
            "127.0.0.1:5060",
            "--rate",
            "200",
            "--calls",
            "300",
            "--duration",
            "10",
            "--threads",
            "2",
        ]);
        let _uas = sipp_uas(5070);
        wait_bound(5070);
        let sipp = load(&[
            "--proxy",
            "127.0.0.1:5060",
            "--uas",
            "127.0.0.1:5070",
            "--rate",
            "100",
            "--calls",
            "150",
            "--duration",
            "10",
        ]);
        (own, sipp)
    })
    .unwrap();
    assert_all_ok(&own, 300);
    // Kamailio Record-Routes: all six messages of each call cross it.
    assert_eq!(own["msgs_to_proxy"], 6 * 300);
    assert_all_ok(&sipp, 150);
    assert_eq!(sipp["msgs_to_proxy"], 3 * 150);
}

#[test]
fn bad_parameters_are_refused_before_sending() {
    for args in [
        &["--rate", "0"][..],
        &["--rate=-5"],
        &["--calls", "0"],
        &["--threads", "0"],
        &["--duration", "0"],
        &["--rate", "0.1", "--duration", "1"],
    ] {
        let out = Command::new(BIN)
            .args(["sip", "load", "--quiet"])
            .args(args)
            .output()
            .unwrap();
        assert!(!out.status.success(), "{args:?} accepted");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("must") || err.contains("starts no call"),
            "{args:?}: {err}"
        );
    }
}
