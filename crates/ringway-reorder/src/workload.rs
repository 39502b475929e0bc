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
        let mut state = self.0;
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        self.0 = state;
        state
    }
    /// Uniform in `0..n` (n > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        (((self.next_u64() >> 11) as u128 * n as u128) >> 53) as u64
    }
}

/// A synthetic stream in compact form: one key per flow, and per packet
/// its flow (an index into `keys`) and sequence number. A bench builds
/// each packet's [`Class`] from it as a driver does from the headers it
/// just read, instead of streaming a prebuilt 52-byte `Class` per packet
/// from memory.
#[derive(Clone, Debug)]
pub struct SynthStream {
    /// The flows' keys.
    pub keys: Vec<FlowKey>,
    /// (flow, sequence number) per packet, in arrival order.
    pub packets: Vec<(u32, u32)>,
}

impl SynthStream {
    /// The class of packet `i` (length 1, as RTP).
    #[inline]
    pub fn class(&self, i: usize) -> Class {
        let (flow, seq) = self.packets[i];
        Class::Flow {
            key: self.keys[flow as usize],
            seq,
            len: 1,
        }
    }
}

/// `packets` RTP-like packets (len 1, 16-bit sequence numbers starting
/// near the wrap point) of `flows` flows sent round-robin; each packet is
/// held back by 1..=`max_disp` positions with probability `p_reorder`.
pub fn synth_stream(
    flows: usize,
    packets: usize,
    p_reorder: f64,
    max_disp: usize,
    seed: u64,
) -> SynthStream {
    let flows = flows.max(1);
    let mut rng = XorShift::new(seed);
    let thresh = (p_reorder.clamp(0.0, 1.0) * (1u64 << 32) as f64) as u64;
    let mut keyed: Vec<(u64, u32)> = (0..packets as u32)
        .map(|i| {
            let displacement = if max_disp > 0 && rng.next_u64() >> 32 < thresh {
                1 + rng.below(max_disp as u64)
            } else {
                0
            };
            // Position doubled so that a held-back packet lands after the
            // packet it lets pass (ties impossible).
            ((i as u64 + displacement) * 2 + 1, i)
        })
        .collect();
    keyed.sort_unstable();
    SynthStream {
        keys: (0..flows as u64)
            .map(|flow| FlowKey::from_u64(flow * 0x1_0000_0001 + 7))
            .collect(),
        packets: keyed
            .into_iter()
            .map(|(_, i)| {
                let flow = i as usize % flows;
                let seq_in_flow = i as usize / flows;
                (
                    flow as u32,
                    (65000u32.wrapping_add(seq_in_flow as u32)) & 0xffff,
                )
            })
            .collect(),
    }
}

/// [`synth_stream`] with a prebuilt [`Class`] per packet.
pub fn synth(
    flows: usize,
    packets: usize,
    p_reorder: f64,
    max_disp: usize,
    seed: u64,
) -> Vec<Class> {
    let stream = synth_stream(flows, packets, p_reorder, max_disp, seed);
    (0..stream.packets.len()).map(|i| stream.class(i)).collect()
}
