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
