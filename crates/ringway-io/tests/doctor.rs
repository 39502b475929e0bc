//! `doctor::run` probes the real kernel. Facts that hold on any Linux that
//! runs these tests (loopback UDP, both backends) are asserted; the rest is
//! checked for shape and printed.

#[test]
fn doctor_probes_and_renders() {
    let rep = ringway_io::doctor::run();
    let text = ringway_io::doctor::render_text(&rep);
    println!("{text}");
    for name in ["backend socket", "backend mmsg"] {
        let c = rep.check(name).unwrap_or_else(|| panic!("missing {name}"));
        assert!(c.ok, "{name}: {}", c.detail);
    }
    // io_uring may be missing or disabled: then the check says why.
    let u = rep.check("backend uring").expect("missing backend uring");
    assert!(
        u.ok || u.detail.starts_with("not available: "),
        "{}",
        u.detail
    );
    assert_eq!(
        u.ok,
        ringway_io::BackendKind::Uring.availability().is_ok(),
        "{}",
        u.detail
    );
    // AF_XDP over veth likewise (needs root, BPF and veth): doctor runs the
    // active probe, whose yes implies the cheap availability check's yes.
    let x = rep.check("backend xdp").expect("missing backend xdp");
    assert!(
        x.ok || x.detail.starts_with("not available: "),
        "{}",
        x.detail
    );
    assert_eq!(
        x.ok,
        ringway_io::backend::xdp_veth_probe().is_ok(),
        "{}",
        x.detail
    );
    if x.ok {
        ringway_io::BackendKind::Xdp.availability().unwrap();
    }
    for name in [
        "tx software stamps",
        "SO_RXQ_OVFL",
        "SO_REUSEPORT",
        "UDP GSO (UDP_SEGMENT)",
        "io_uring",
        "AF_XDP socket",
        "tc netem",
        "EEVDF slice (sched_setattr)",
        "SCHED_FIFO",
        "debugfs sched knobs",
        "perf hardware counters",
    ] {
        let c = rep.check(name).unwrap_or_else(|| panic!("missing {name}"));
        assert!(!c.detail.is_empty());
        assert!(text.contains(name));
    }
    let json = serde_json::to_value(&rep).unwrap();
    assert!(json["checks"].as_array().unwrap().len() >= 15);
    // Probes must not leave named namespaces behind.
    let mine = ringway_io::netns::own_prefix();
    assert!(ringway_io::netns::list_netns()
        .unwrap()
        .iter()
        .all(|n| !n.starts_with(&mine)));
}
