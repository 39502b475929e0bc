//! The systemd service protocol (issue 22): `ringway sip proxy` started
//! with `$NOTIFY_SOCKET` (a datagram socket this test binds) and
//! `$WATCHDOG_USEC` says READY=1 once it serves, pings WATCHDOG=1 while
//! its workers go round, RELOADING=1 then READY=1 around a SIGHUP reload,
//! and STOPPING=1 on SIGTERM before it drains and exits 0. `ringway sfu
//! serve` says READY=1, pings WATCHDOG=1 while its engine loop turns, and
//! STOPPING=1 on SIGTERM.

mod sip_proxy_support;

use sip_proxy_support::*;
use std::os::unix::net::UnixDatagram;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[test]
fn notifies_ready_watchdog_reloading_and_stopping() {
    let (states, exit) = netns(|| {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify.sock");
        let socket = UnixDatagram::bind(&path).unwrap();
        socket
            .set_read_timeout(Some(Duration::from_millis(100)))
            .unwrap();
        std::env::set_var("NOTIFY_SOCKET", &path);
        // 400 ms: a ping every 200 ms.
        std::env::set_var("WATCHDOG_USEC", "400000");
        let mut procs = Procs::default();
        let p = start_proxy(
            &mut procs,
            dir.path(),
            &["--listen", "127.0.0.1:5060", "--workers", "2"],
        );
        let mut states: Vec<String> = Vec::new();
        let read_until = |states: &mut Vec<String>, done: &dyn Fn(&[String]) -> bool| {
            let end = Instant::now() + Duration::from_secs(20);
            let mut buf = [0u8; 512];
            while Instant::now() < end && !done(states) {
                if let Ok(n) = socket.recv(&mut buf) {
                    states.push(String::from_utf8_lossy(&buf[..n]).into_owned());
                }
            }
        };
        let pings = |s: &[String]| s.iter().filter(|m| *m == "WATCHDOG=1").count();
        read_until(&mut states, &|s| pings(s) >= 3);
        signal(p.pid, "HUP");
        read_until(&mut states, &|s| {
            s.iter()
                .any(|m| m.starts_with("READY=1\nSTATUS=serving (reloaded)"))
        });
        signal(p.pid, "TERM");
        let mut child = procs.take(p.pid).unwrap();
        let exit = wait_bounded(&mut child, Duration::from_secs(30));
        read_until(&mut states, &|s| {
            s.iter().any(|m| m.starts_with("STOPPING=1"))
        });
        (states, exit)
    });
    eprintln!("states: {states:?}");
    assert!(exit.is_some_and(|s| s.success()), "{exit:?}");
    let at = |prefix: &str| {
        states
            .iter()
            .position(|m| m.starts_with(prefix))
            .unwrap_or_else(|| panic!("no {prefix:?} in {states:?}"))
    };
    let ready = at("READY=1\nSTATUS=serving");
    let first_ping = at("WATCHDOG=1");
    let reloading = at("RELOADING=1");
    let reloaded = at("READY=1\nSTATUS=serving (reloaded)");
    let stopping = at("STOPPING=1");
    assert!(ready < first_ping, "{states:?}");
    assert!(reloading < reloaded && reloaded < stopping, "{states:?}");
    assert!(
        states.iter().filter(|m| *m == "WATCHDOG=1").count() >= 3,
        "{states:?}"
    );
}

/// Datagrams on `socket` until `done(states)` or 20 s.
fn read_states(socket: &UnixDatagram, states: &mut Vec<String>, done: &dyn Fn(&[String]) -> bool) {
    let end = Instant::now() + Duration::from_secs(20);
    let mut buf = [0u8; 512];
    while Instant::now() < end && !done(states) {
        if let Ok(n) = socket.recv(&mut buf) {
            states.push(String::from_utf8_lossy(&buf[..n]).into_owned());
        }
    }
}

#[test]
fn sfu_notifies_ready_watchdog_and_stopping() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("notify.sock");
    let socket = UnixDatagram::bind(&path).unwrap();
    socket
        .set_read_timeout(Some(Duration::from_millis(100)))
        .unwrap();
    let mut procs = Procs::default();
    let child = Command::new(ringway())
        .args([
            "sfu",
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--stats-interval",
            "0",
        ])
        .args(["--duration", "60"])
        .env("NOTIFY_SOCKET", &path)
        .env("WATCHDOG_USEC", "400000")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn ringway sfu serve");
    let pid = procs.add("sfu", child);
    let mut states = Vec::new();
    let pings = |s: &[String]| s.iter().filter(|m| *m == "WATCHDOG=1").count();
    read_states(&socket, &mut states, &|s| pings(s) >= 3);
    signal(pid, "TERM");
    let mut child = procs.take(pid).unwrap();
    let exit = wait_bounded(&mut child, Duration::from_secs(20));
    read_states(&socket, &mut states, &|s| {
        s.iter().any(|m| m.starts_with("STOPPING=1"))
    });
    eprintln!("sfu states: {states:?}");
    assert!(exit.is_some_and(|s| s.success()), "{exit:?}");
    let at = |prefix: &str| {
        states
            .iter()
            .position(|m| m.starts_with(prefix))
            .unwrap_or_else(|| panic!("no {prefix:?} in {states:?}"))
    };
    assert_eq!(at("READY=1\nSTATUS=serving"), 0, "{states:?}");
    assert!(pings(&states) >= 3, "{states:?}");
    assert!(at("WATCHDOG=1") < at("STOPPING=1"), "{states:?}");
}
