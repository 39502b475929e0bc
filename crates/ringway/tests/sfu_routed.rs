//! The SFU's fast paths beyond the first link: every client in a host of
//! its own behind a router host (`sfu load --netns --routed`), so the
//! SFU's next hop towards each is the router. Every backend
//! delivers every copy; the AF_XDP backend sends them all through its TX
//! ring (the router's MAC from the kernel's route and neighbour tables,
//! none through the companion socket), and the in-kernel `tc` fan-out
//! replicates the media in the kernel.

mod sfu_common;

use sfu_common::*;

/// One `sfu load --netns --routed` run with 3 clients; returns the SFU's
/// and the load's JSON reports.
fn routed_run(backend: &str, kernel_fanout: bool) -> (serde_json::Value, serde_json::Value) {
    let mut extra = vec!["--routed"];
    if kernel_fanout {
        extra.push("--sfu-kernel-fanout");
    }
    load_netns_run(backend, "0.0.0.0:5004", backend, &extra)
}

#[test]
fn socket_backends_deliver_through_a_router() {
    for backend in ["socket", "mmsg"] {
        let (s, l) = routed_run(backend, false);
        let tx = delivered_exactly(backend, &l);
        assert_eq!(s["sfu"]["copies"].as_u64().unwrap(), 2 * tx, "{backend}");
    }
    if ringway_io::BackendKind::Uring.availability().is_ok() {
        let (s, l) = routed_run("uring", false);
        let tx = delivered_exactly("uring", &l);
        assert_eq!(s["sfu"]["copies"].as_u64().unwrap(), 2 * tx);
    } else {
        ringway_io::testing::skip("io_uring not available: the uring column of the routed test");
    }
}

/// AF_XDP behind a router: every copy and echo leaves through the TX
/// ring, with the router's MAC (before next hops were resolved from the
/// kernel's routes, every one of them went through the companion socket).
#[test]
fn xdp_sends_every_copy_to_the_router_through_the_ring() {
    if let Err(why) = ringway_io::backend::xdp_socket_supported() {
        ringway_io::testing::skip(format!("AF_XDP not available: {why}"));
        return;
    }
    let (s, l) = routed_run("xdp", false);
    let tx = delivered_exactly("xdp", &l);
    assert_xdp_rings_carried_all("xdp", &s, tx);
}

/// The tc fan-out behind a router: the routes are installed in the
/// kernel's map (next hop: the router) and carry the media.
#[test]
fn kernel_fanout_replicates_to_clients_behind_a_router() {
    if let Err(why) = ringway_io::backend::xdp_socket_supported() {
        ringway_io::testing::skip(format!("BPF not available: {why}"));
        return;
    }
    let (s, l) = routed_run("socket", true);
    let tx = delivered_exactly("tc", &l);
    assert_kernel_fanout_carried("tc", &s, tx);
}
