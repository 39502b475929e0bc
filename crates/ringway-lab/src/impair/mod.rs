//! Network impairment after the SRPIC paper's netem setup (netem itself is
//! not available in this kernel), sans-IO:
//!
//! * [`path::Path`]: one direction — input link at a rate, loss (uniform
//!   δ or Gilbert-Elliott bursts), delay `~ N(α, (β·α)²)` per packet,
//!   output link in due order (reordering emerges from σ against the
//!   packet spacing), one arrival stamp per packet.
//! * [`coalesce::Coalescer`]: the receiver's interrupt coalescing (eq. 1–3):
//!   arrival times → receive blocks, independent of what is done with them.
//! * [`relay`]: the UDP relay `ringway lab impair` built from them (forward
//!   and reverse directions configured separately).
//!
//! The TCP relay of `ringway lab srpic-tcp` (TUN devices) uses the same
//! two cores (`crate::srpic_tcp`).

pub mod coalesce;
pub mod path;
pub mod relay;

pub use coalesce::{eq3_block, Block, BlockHistogram, CoalesceConfig, Coalescer};
pub use path::{LossModel, Path, PathConfig, PathStats, RouterBatching};

/// The paper's receiver (Section 3.1, Fig. 2) at 1 Gb/s: interrupt delay
/// 75 µs and softirq rate 2.9 Mpackets/s reproduce its block sizes (1 packet
/// at 95 Mb/s, ~7 at 938 Mb/s, 30–60 at 5.89 Gb/s; see
/// [`coalesce::eq3_block`]); ring 512 (its Myricom NIC).
pub const PAPER_RECEIVER: CoalesceConfig = CoalesceConfig {
    t_intr_ns: 75_000,
    rsn_pps: 2.9e6,
    ring: 512,
};

/// The paper's receiver with time stretched by `k` = 1 Gb/s ÷ emulated
/// rate: `T_intr·k` and `R_sn/k`, so a link `k` times slower forms the
/// same blocks at the same share of its rate (eq. 3 depends on P·T_intr
/// and P/R_sn only).
pub fn scaled_receiver(k: f64) -> CoalesceConfig {
    CoalesceConfig {
        t_intr_ns: (PAPER_RECEIVER.t_intr_ns as f64 * k) as u64,
        rsn_pps: PAPER_RECEIVER.rsn_pps / k,
        ring: PAPER_RECEIVER.ring,
    }
}
