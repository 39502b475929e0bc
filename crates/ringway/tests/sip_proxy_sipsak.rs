//! sipsak against `ringway sip proxy` in a private network namespace:
//! OPTIONS to the proxy → 200; Max-Forwards 0 on a request to forward → 483.

mod sip_proxy_support;

use sip_proxy_support::*;
use std::process::Command;
use std::time::Duration;

/// Run sipsak with `args` (bounded); returns (exit code, stdout+stderr).
fn sipsak(args: &[&str]) -> (Option<i32>, String) {
    let out = Command::new("timeout")
        .args(["20", "sipsak"])
        .args(args)
        .output()
        .expect("run sipsak");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code(), text)
}

#[test]
fn sipsak_options_200_and_max_forwards_zero_483() {
    let (s, options, mf0) = in_bed(|procs, dir| {
        let p = start_proxy(
            procs,
            dir,
            // Every UA of this test bed is on loopback (docs/security.md).
            &[
                "--listen",
                "127.0.0.1:5060",
                "--relay",
                "127.0.0.0/8",
                "--mode",
                "stateless",
            ],
        );
        // OPTIONS addressed to the proxy itself: it answers.
        let options = sipsak(&["-s", "sip:127.0.0.1:5060", "-H", "127.0.0.1", "-vv"]);
        // A request the proxy would forward (R-URI elsewhere), sent to the
        // proxy (-p) with Max-Forwards 0: 483 Too Many Hops.
        let mf0 = sipsak(&[
            "-s",
            "sip:bob@127.0.0.2:5060",
            "-p",
            "127.0.0.1",
            "-H",
            "127.0.0.1",
            "-m",
            "0",
            "-vv",
        ]);
        std::thread::sleep(Duration::from_millis(100));
        (stop_proxy(procs, &p), options, mf0)
    });
    eprintln!("OPTIONS: {options:?}\nMF0: {mf0:?}");
    assert_eq!(
        options.0,
        Some(0),
        "sipsak OPTIONS did not get 200: {}",
        options.1
    );
    assert!(options.1.contains("SIP/2.0 200"), "{}", options.1);
    assert!(
        mf0.1.contains("SIP/2.0 483"),
        "no 483 for Max-Forwards 0: {}",
        mf0.1
    );
    assert_eq!(mf0.0, Some(1), "sipsak exit code for a 4xx is 1: {}", mf0.1);
    assert_eq!(
        s["by_type"]["OPTIONS"]["responded"]["200"], 1,
        "{}",
        s["by_type"]
    );
    assert_eq!(
        s["by_type"]["OPTIONS"]["responded"]["483"], 1,
        "{}",
        s["by_type"]
    );
    assert_eq!(s["actions"]["forwarded"], 0);
}
