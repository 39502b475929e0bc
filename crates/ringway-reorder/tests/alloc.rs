//! The sorter does not allocate in steady state: `allocation-counter`
//! (which installs a counting global allocator in this test binary) counts
//! allocations made by this thread during push/flush_all.

use ringway_reorder::workload::synth;
use ringway_reorder::{SeqSpace, Srpic, SrpicConfig};
#[test]
fn no_allocation_per_packet() {
    // Heavy reordering over 300 flows, with flow churn (idle eviction).
    let classes = synth(300, 200_000, 0.4, 16 * 300, 9);
    let mut s: Srpic<u32> = Srpic::new(
        SrpicConfig {
            block_size: 32,
            ring_size: 1024,
            max_flows: 256, // fewer than flows: table-full pass-through path too
            idle_flushes: 2,
        },
        SeqSpace::U16,
    );
    let mut sink = 0u64;
    let info = allocation_counter::measure(|| {
        for chunk in classes.chunks(64) {
            for (i, c) in chunk.iter().enumerate() {
                s.push(*c, i as u32, &mut |x| sink += x as u64);
            }
            s.flush_all(&mut |x| sink += x as u64);
        }
    });
    assert_eq!(info.count_total, 0, "allocations during push/flush_all");
    assert!(s.stats().table_full > 0 && s.stats().to_after > 0);
    assert_eq!(s.stats().emitted, 200_000);
    std::hint::black_box(sink);
}
