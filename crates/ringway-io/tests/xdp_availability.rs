//! Asking whether the AF_XDP backend is available has no side effects: no
//! network namespace (named or private) and no interface appears, neither
//! while `BackendKind::Xdp.availability()` runs nor after it. The full
//! probe that does build namespaces and a veth pair is `xdp_veth_probe`.
//!
//! One test in its own binary: availability is cached per process, so this
//! must be the first call in the process for the check to mean anything.

use ringway_io::BackendKind;
use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

fn names(dir: &str) -> BTreeSet<String> {
    std::fs::read_dir(dir)
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// Named namespaces this process made (`rw-<pid>-...`); other processes on
/// the machine may make their own meanwhile.
fn our_netns() -> BTreeSet<String> {
    let mine = ringway_io::netns::own_prefix();
    names("/var/run/netns")
        .into_iter()
        .filter(|n| n.starts_with(&mine))
        .collect()
}

/// The network namespace of each thread of this process.
fn thread_netns() -> BTreeSet<String> {
    names("/proc/self/task")
        .into_iter()
        .filter_map(|t| std::fs::read_link(format!("/proc/self/task/{t}/ns/net")).ok())
        .map(|l| l.to_string_lossy().into_owned())
        .collect()
}

#[test]
fn xdp_availability_creates_no_namespace_and_no_interface() {
    let netns_before = our_netns();
    let ifaces_before = names("/sys/class/net");
    let own_ns = thread_netns();
    assert_eq!(own_ns.len(), 1, "threads already in other namespaces");

    // Watch while the check runs: what the old probe did (two named
    // namespaces, threads entering them, veth ends) lasts far longer than
    // one poll.
    let stop = Arc::new(AtomicBool::new(false));
    let seen = Arc::new(Mutex::new(BTreeSet::new()));
    let watcher = {
        let (stop, seen, own_ns) = (stop.clone(), seen.clone(), own_ns.clone());
        let (netns_before, ifaces_before) = (netns_before.clone(), ifaces_before.clone());
        std::thread::spawn(move || loop {
            let done = stop.load(Ordering::Acquire);
            let mut s = seen.lock().unwrap();
            s.extend(
                our_netns()
                    .difference(&netns_before)
                    .map(|n| format!("netns {n}")),
            );
            s.extend(
                names("/sys/class/net")
                    .difference(&ifaces_before)
                    .map(|n| format!("interface {n}")),
            );
            s.extend(
                thread_netns()
                    .difference(&own_ns)
                    .map(|n| format!("thread in {n}")),
            );
            drop(s);
            if done {
                break;
            }
            std::thread::sleep(Duration::from_millis(1));
        })
    };
    let r = BackendKind::Xdp.availability();
    stop.store(true, Ordering::Release);
    watcher.join().unwrap();
    eprintln!("availability of xdp: {r:?}");

    let seen = seen.lock().unwrap();
    assert!(seen.is_empty(), "availability() made: {seen:?}");
    assert_eq!(our_netns(), netns_before);
    assert_eq!(names("/sys/class/net"), ifaces_before);
    // Where AF_XDP sockets exist (and we may use them) the cheap check
    // agrees with the cheapest one; it never says yes when that says no.
    if ringway_io::backend::xdp_socket_supported().is_err() {
        assert!(r.is_err());
    }
}
