//! Deterministic synthetic packet streams for benchmarks and experiments.

use crate::key::FlowKey;
use crate::sorter::Class;

/// Small xorshift64 generator (deterministic for a seed; never 0 state).
#[derive(Clone, Debug)]
pub struct XorShift(u64);

impl XorShift {
    /// Seeded generator.
    pub fn new(seed: u64) -> Self {
        XorShift(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1)
    }
    /// Next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }
    /// Uniform in `0..n` (n > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        (((self.next_u64() >> 11) as u128 * n as u128) >> 53) as u64
    }
}

/// `packets` RTP-like packets (len 1, 16-bit sequence numbers starting
/// near the wrap point) of `flows` flows sent round-robin; each packet is
/// held back by 1..=`max_disp` positions with probability `p_reorder`.
pub fn synth(
    flows: usize,
    packets: usize,
    p_reorder: f64,
    max_disp: usize,
    seed: u64,
) -> Vec<Class> {
    let flows = flows.max(1);
    let mut rng = XorShift::new(seed);
    let thresh = (p_reorder.clamp(0.0, 1.0) * (1u64 << 32) as f64) as u64;
    let mut keyed: Vec<(u64, u32)> = (0..packets as u32)
        .map(|i| {
            let d = if max_disp > 0 && rng.next_u64() >> 32 < thresh {
                1 + rng.below(max_disp as u64)
            } else {
                0
            };
            // Position doubled so that a held-back packet lands after the
            // packet it lets pass (ties impossible).
            ((i as u64 + d) * 2 + 1, i)
        })
        .collect();
    keyed.sort_unstable();
    keyed
        .into_iter()
        .map(|(_, i)| {
            let f = i as usize % flows;
            let n = i as usize / flows;
            Class::Flow {
                key: FlowKey::from_u64(f as u64 * 0x1_0000_0001 + 7),
                seq: (65000u32.wrapping_add(n as u32)) & 0xffff,
                len: 1,
            }
        })
        .collect()
}
