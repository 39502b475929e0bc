//! The SFU over IPv6 between namespace hosts (`sfu load --netns --ipv6`:
//! unique local addresses in fd77::/48), on one link (a bridge) and with
//! every client behind a router host (`--routed`, the SFU's default route
//! via the router's link-local address), on every backend: the socket
//! backends deliver every copy; the AF_XDP backend receives every datagram
//! through its RX ring and sends every copy and echo through its TX ring
//! (IPv6 frames built in user space with their mandatory UDP checksums;
//! the next hops' MACs from the kernel's IPv6 routes and NDP neighbours);
//! the `tc` fan-out replicates the media in the kernel.

mod sfu_common;

use sfu_common::*;

/// One `sfu load --netns --ipv6` run with 3 clients (`routed`: behind a
/// router); returns the SFU's and the load's JSON reports.
fn ipv6_run(
    backend: &str,
    kernel_fanout: bool,
    routed: bool,
) -> (serde_json::Value, serde_json::Value) {
    let mut extra = vec!["--ipv6"];
    if routed {
        extra.push("--routed");
    }
    if kernel_fanout {
        extra.push("--sfu-kernel-fanout");
    }
    let what = format!("{backend} routed={routed}");
    let (s, l) = load_netns_run(&what, "[::]:5004", backend, &extra);
    // The SFU served its IPv6 unique local address.
    let listen = s["listen"].as_str().unwrap_or_default();
    assert!(listen.starts_with("[fd77:"), "{backend}: listen {listen}");
    (s, l)
}

#[test]
fn socket_backends_deliver_over_ipv6_on_link_and_through_a_router() {
    let mut backends = vec!["socket", "mmsg"];
    if ringway_io::BackendKind::Uring.availability().is_ok() {
        backends.push("uring");
    } else {
        ringway_io::testing::skip("io_uring not available: the uring column of the IPv6 test");
    }
    for routed in [false, true] {
        for &backend in &backends {
            let what = format!("{backend} routed={routed}");
            let (s, l) = ipv6_run(backend, false, routed);
            let tx = delivered_exactly(&what, &l);
            assert_eq!(s["sfu"]["copies"].as_u64().unwrap(), 2 * tx, "{what}");
        }
    }
}

/// AF_XDP over IPv6: every datagram through the RX ring (none through the
/// companion socket, none dropped as invalid or for its checksum), every
/// copy written from the received frame into the TX ring and every echo
/// the received frame turned around — on one link, and behind a router
/// whose MAC comes from the kernel's IPv6 route (a link-local gateway) and
/// its NDP entry.
#[test]
fn xdp_serves_ipv6_through_its_rings_on_link_and_through_a_router() {
    if let Err(why) = ringway_io::backend::xdp_socket_supported() {
        ringway_io::testing::skip(format!("AF_XDP not available: {why}"));
        return;
    }
    for routed in [false, true] {
        let what = format!("xdp routed={routed}");
        let (s, l) = ipv6_run("xdp", false, routed);
        let tx = delivered_exactly(&what, &l);
        assert_xdp_rings_carried_all(&what, &s, tx);
        let io = &s["io"];
        assert_eq!(io["rx_invalid"], 0, "{what}: {io}");
        assert_eq!(io["rx_bad_checksum"], 0, "{what}: {io}");
    }
}

/// The `tc` fan-out over IPv6: the routes are installed in the kernel's
/// map (IPv6 entries) and carry the media, on one link and behind a router.
#[test]
fn kernel_fanout_replicates_ipv6_media_on_link_and_through_a_router() {
    if let Err(why) = ringway_io::backend::xdp_socket_supported() {
        ringway_io::testing::skip(format!("BPF not available: {why}"));
        return;
    }
    for routed in [false, true] {
        let what = format!("tc routed={routed}");
        let (s, l) = ipv6_run("socket", true, routed);
        let tx = delivered_exactly(&what, &l);
        assert_kernel_fanout_carried(&what, &s, tx);
    }
}
