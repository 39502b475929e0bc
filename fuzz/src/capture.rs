//! Capture and packet-path targets: pcap/pcapng files as
//! `ringway reorder analyze` reads them, and NFQUEUE netlink buffers as
//! the reorder engine receives them from the kernel.

use ringway_io::nfqueue::{parse_messages, Message};
use ringway_reorder::analyze::{analyze, report, AnalyzeOpts, Trace};
use ringway_reorder::{inspect_ip, pcap as capture};

/// `true` when `part` lies inside `whole` (a zero-copy view of it).
fn inside(whole: &[u8], part: &[u8]) -> bool {
    let start = whole.as_ptr() as usize;
    let p = part.as_ptr() as usize;
    part.is_empty() || (start <= p && p + part.len() <= start + whole.len())
}

/// A capture file through the whole analysis: frames are views of the
/// file, every frame becomes a packet or is skipped, and SRPIC sorting
/// delivers each packet exactly once whatever the timestamps and
/// sequence numbers.
pub fn pcap(data: &[u8]) {
    let Ok(frames) = capture::parse(data) else {
        return;
    };
    for f in &frames {
        assert!(inside(data, f.data), "frame outside the file");
        if let Some((ver, ip)) = capture::ip_of(f) {
            assert!(inside(f.data, ip));
            if let Some(udp) = capture::udp_of(ver, ip) {
                assert!(inside(ip, udp.payload));
            }
            let _ = inspect_ip(ip);
        }
    }
    let trace = Trace::from_frames(&frames);
    assert_eq!(
        trace.recs.len() as u64 + trace.skipped,
        frames.len() as u64,
        "frames lost or counted twice"
    );
    let opts = AnalyzeOpts {
        blocks: vec![1, 4, 32],
        batch_ns: 1_000_000,
        ring_size: 64,
        dt: 3,
    };
    for block in [1, 4, 32] {
        let mut order = trace.srpic_order(
            ringway_reorder::SrpicConfig {
                block_size: block,
                ring_size: opts.ring_size,
                max_flows: trace.flows.len().clamp(1, 8),
                idle_flushes: 2,
            },
            opts.batch_ns,
        );
        order.sort_unstable();
        assert!(
            order.iter().copied().eq(0..trace.recs.len() as u32),
            "SRPIC with block {block} lost or duplicated packets"
        );
    }
    let variants = analyze(&trace, &opts);
    let _ = report(&trace, &opts, &variants);
}

/// A netlink receive buffer through the NFQUEUE parser, and each queued
/// packet through the reorder classifier: packets are views of the
/// buffer, and an error names an offset inside it.
pub fn nfqueue(data: &[u8]) {
    let mut packets = 0usize;
    let result = parse_messages(data, |m| {
        if let Message::Packet(p) = m {
            assert!(inside(data, p.payload), "payload outside the buffer");
            let _ = inspect_ip(p.payload).class();
            packets += 1;
        }
    });
    if let Err(e) = result {
        assert!(
            e.offset < data.len(),
            "error at {} of {}",
            e.offset,
            data.len()
        );
    }
    assert!(packets <= data.len() / 16, "more messages than headers fit");
}

/// The rtnetlink replies the fast paths read (routes and neighbours for
/// their next hops): never a panic, at most one message per 16 bytes, and
/// every gateway of the address family its route names.
pub fn rtnetlink(data: &[u8]) {
    let replies = ringway_io::backend::parse_rtnetlink_replies(data);
    assert!(
        replies.messages <= data.len() / 16,
        "more messages than headers fit"
    );
    assert!(replies.routes.len() + replies.neighbours.len() <= replies.messages);
    for (_, _, mac) in &replies.neighbours {
        assert_ne!(*mac, [0u8; 6], "an all-zero MAC is no entry");
    }
}

/// An Ethernet frame as the AF_XDP backend receives it (IPv4 or IPv6,
/// UDP): the parser never panics and its views lie inside the frame; the
/// backend's checksum check agrees with the views' (a zero checksum passes
/// over IPv4 only); a frame with plain headers turns around in place into
/// a valid frame back to its sender with the same payload and checksum
/// verdict; and the send path's header template for that answer verifies
/// and, when the received checksum did, carries the same UDP checksum (the
/// incremental sum equals the full one).
pub fn xdp_frame(data: &[u8]) {
    use ringway_io::backend::frame_fuzzing::{template_frame, turn_around, verify_udp};
    use ringway_io::wire::UdpFrame;
    const OURS: [u8; 6] = [2, 0, 0, 0, 0, 1];
    const THEIRS: [u8; 6] = [2, 0, 0, 0, 0, 2];
    let Ok(Some(frame)) = UdpFrame::parse(data) else {
        return;
    };
    let (src, dst, udp) = (frame.src(), frame.dst(), frame.udp());
    let udp_at = frame.udp_offset();
    let udp_end = udp_at + 8 + udp.payload().len();
    assert!(udp_end <= data.len(), "UDP view past the frame");
    let udp_bytes = &data[udp_at..udp_end];
    let verified = frame.udp_checksum_ok();
    assert_eq!(
        verify_udp(src.ip(), dst.ip(), udp_bytes).is_some(),
        verified,
        "the backend's checksum check and the view's disagree"
    );
    if src.is_ipv6() && udp.checksum() == 0 {
        assert!(!verified, "a zero UDP checksum over IPv6 passed");
    }
    if frame.plain_header() {
        let mut turned = data.to_vec();
        assert!(
            turn_around(&mut turned, OURS, THEIRS),
            "plain frame refused"
        );
        let back = UdpFrame::parse(&turned)
            .expect("a turned-around frame parses")
            .expect("and is UDP");
        assert_eq!((back.src(), back.dst()), (dst, src), "not turned around");
        assert_eq!((back.eth().src(), back.eth().dst()), (OURS, THEIRS));
        assert_eq!(back.udp().payload(), udp.payload(), "payload changed");
        assert_eq!(back.udp_checksum_ok(), verified, "checksum verdict changed");
        assert!(back.ip_checksum_ok(), "IPv4 header checksum not recomputed");
    }
    let answer = template_frame((OURS, THEIRS), dst, src, 7, udp.payload())
        .expect("addresses of one family");
    let built = UdpFrame::parse(&answer)
        .expect("a built frame parses")
        .expect("and is UDP");
    assert_eq!((built.src(), built.dst()), (dst, src));
    assert_eq!(built.udp().payload(), udp.payload());
    assert!(
        built.ip_checksum_ok() && built.udp_checksum_ok(),
        "built frame fails its checksums"
    );
    if verified && udp.checksum() != 0 {
        assert_eq!(
            built.udp().checksum(),
            udp.checksum(),
            "the template's incremental checksum differs from the verified one"
        );
    }
}
