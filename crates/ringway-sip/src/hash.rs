//! Small fast non-cryptographic 64-bit hash for branch ids and table keys.

/// Streaming hasher: 8-byte words, multiply-rotate mixing, strong finaliser.
#[derive(Clone, Copy, Debug)]
pub struct Hash64(u64);

const K: u64 = 0x9E37_79B9_7F4A_7C15;

impl Hash64 {
    /// New hasher with a seed (e.g. a per-proxy secret).
    pub fn new(seed: u64) -> Self {
        Hash64(seed ^ 0x243F_6A88_85A3_08D3)
    }

    #[inline]
    fn word(&mut self, w: u64) {
        self.0 = (self.0 ^ w).wrapping_mul(K).rotate_left(29);
    }

    /// Absorb bytes followed by their length (so field boundaries matter).
    pub fn bytes(&mut self, b: &[u8]) -> &mut Self {
        let mut chunks = b.chunks_exact(8);
        for c in &mut chunks {
            let mut w = [0u8; 8];
            w.copy_from_slice(c);
            self.word(u64::from_le_bytes(w));
        }
        let r = chunks.remainder();
        if !r.is_empty() {
            let mut w = [0u8; 8];
            w[..r.len()].copy_from_slice(r);
            self.word(u64::from_le_bytes(w));
        }
        self.word(b.len() as u64 ^ 0xFF00_0000_0000_0000);
        self
    }

    /// Absorb a string.
    pub fn str(&mut self, s: &str) -> &mut Self {
        self.bytes(s.as_bytes())
    }

    /// Absorb an integer.
    pub fn u64(&mut self, v: u64) -> &mut Self {
        self.word(v);
        self
    }

    /// Final avalanche (splitmix64 finaliser).
    pub fn finish(&self) -> u64 {
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn boundaries_matter_and_deterministic() {
        let a = Hash64::new(1).str("ab").str("c").finish();
        let b = Hash64::new(1).str("a").str("bc").finish();
        assert_ne!(a, b);
        assert_eq!(a, Hash64::new(1).str("ab").str("c").finish());
        assert_ne!(a, Hash64::new(2).str("ab").str("c").finish());
    }
}
