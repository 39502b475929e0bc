//! Hashes: [`Hash64`], a small fast non-cryptographic 64-bit hash for
//! table keys, and [`MacKey`]/[`Mac`], SipHash-2-4 (a keyed PRF for short
//! inputs) for the tags we put on the wire and must recognise later
//! without state: signed Record-Route, the upstream MAC in our branches,
//! dispatcher probe nonces.

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

/// A 128-bit SipHash-2-4 key (random at start-up in a server).
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct MacKey {
    k0: u64,
    k1: u64,
}

impl std::fmt::Debug for MacKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("MacKey(..)")
    }
}

impl MacKey {
    /// The key of these 16 bytes (little-endian halves).
    pub fn new(key: [u8; 16]) -> MacKey {
        let mut k0 = [0u8; 8];
        let mut k1 = [0u8; 8];
        k0.copy_from_slice(&key[..8]);
        k1.copy_from_slice(&key[8..]);
        MacKey {
            k0: u64::from_le_bytes(k0),
            k1: u64::from_le_bytes(k1),
        }
    }

    /// A key derived from a 64-bit seed (deterministic; for configurations
    /// that were given no random key, e.g. tests).
    pub fn from_seed(seed: u64) -> MacKey {
        MacKey {
            k0: Hash64::new(seed).u64(1).finish(),
            k1: Hash64::new(seed).u64(2).finish(),
        }
    }

    /// Start a MAC under this key.
    pub fn mac(&self) -> Mac {
        Mac {
            v: [
                self.k0 ^ 0x736f_6d65_7073_6575,
                self.k1 ^ 0x646f_7261_6e64_6f6d,
                self.k0 ^ 0x6c79_6765_6e65_7261,
                self.k1 ^ 0x7465_6462_7974_6573,
            ],
            tail: 0,
            tail_len: 0,
            length: 0,
        }
    }
}

/// Streaming SipHash-2-4 (Aumasson and Bernstein, the reference algorithm
/// over the concatenated input). [`Mac::str`] and [`Mac::u64`] frame their
/// input (length suffix), so field boundaries matter.
#[derive(Clone, Copy, Debug)]
pub struct Mac {
    v: [u64; 4],
    tail: u64,
    tail_len: usize,
    length: usize,
}

impl Mac {
    #[inline]
    fn round(v: &mut [u64; 4]) {
        v[0] = v[0].wrapping_add(v[1]);
        v[1] = v[1].rotate_left(13) ^ v[0];
        v[0] = v[0].rotate_left(32);
        v[2] = v[2].wrapping_add(v[3]);
        v[3] = v[3].rotate_left(16) ^ v[2];
        v[0] = v[0].wrapping_add(v[3]);
        v[3] = v[3].rotate_left(21) ^ v[0];
        v[2] = v[2].wrapping_add(v[1]);
        v[1] = v[1].rotate_left(17) ^ v[2];
        v[2] = v[2].rotate_left(32);
    }

    #[inline]
    fn compress(&mut self, m: u64) {
        self.v[3] ^= m;
        Self::round(&mut self.v);
        Self::round(&mut self.v);
        self.v[0] ^= m;
    }

    /// Absorb raw bytes (no framing: `raw(b"ab").raw(b"c")` equals `raw(b"abc")`).
    pub fn raw(&mut self, mut b: &[u8]) -> &mut Self {
        self.length = self.length.wrapping_add(b.len());
        if self.tail_len > 0 {
            while self.tail_len < 8 {
                let Some((&x, rest)) = b.split_first() else {
                    return self;
                };
                self.tail |= u64::from(x) << (8 * self.tail_len);
                self.tail_len += 1;
                b = rest;
            }
            let m = self.tail;
            self.compress(m);
            self.tail = 0;
            self.tail_len = 0;
        }
        let mut chunks = b.chunks_exact(8);
        for c in &mut chunks {
            let mut w = [0u8; 8];
            w.copy_from_slice(c);
            self.compress(u64::from_le_bytes(w));
        }
        for &x in chunks.remainder() {
            self.tail |= u64::from(x) << (8 * self.tail_len);
            self.tail_len += 1;
        }
        self
    }

    /// Absorb a string followed by its length.
    pub fn str(&mut self, s: &str) -> &mut Self {
        self.raw(s.as_bytes()).raw(&(s.len() as u32).to_le_bytes())
    }

    /// Absorb an integer.
    pub fn u64(&mut self, v: u64) -> &mut Self {
        self.raw(&v.to_le_bytes())
    }

    /// Absorb a socket address (IP as 16 bytes, IPv4 mapped, then the port).
    pub fn addr(&mut self, a: std::net::SocketAddr) -> &mut Self {
        let ip = match a.ip() {
            std::net::IpAddr::V4(v4) => v4.to_ipv6_mapped(),
            std::net::IpAddr::V6(v6) => v6,
        };
        self.raw(&ip.octets()).raw(&a.port().to_le_bytes())
    }

    /// The 64-bit tag.
    pub fn finish(&self) -> u64 {
        let mut s = *self;
        let b = ((s.length as u64 & 0xFF) << 56) | s.tail;
        s.compress(b);
        s.v[2] ^= 0xFF;
        for _ in 0..4 {
            Self::round(&mut s.v);
        }
        s.v[0] ^ s.v[1] ^ s.v[2] ^ s.v[3]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn siphash_reference_vectors_streamed_in_any_split() {
        // The SipHash paper's vector: key 00..0f, message 00..0e.
        let key: [u8; 16] = std::array::from_fn(|i| i as u8);
        let message: Vec<u8> = (0..15).collect();
        let key = MacKey::new(key);
        assert_eq!(key.mac().raw(&message).finish(), 0xa129_ca61_49be_45e5);
        for split in 0..=15 {
            let (a, b) = message.split_at(split);
            assert_eq!(key.mac().raw(a).raw(b).finish(), 0xa129_ca61_49be_45e5);
        }
        // The empty message (first entry of the reference vector table).
        assert_eq!(key.mac().finish(), 0x726f_db47_dd0e_0e31);
        assert_ne!(
            key.mac().str("ab").str("c").finish(),
            key.mac().str("a").str("bc").finish()
        );
    }

    #[test]
    fn boundaries_matter_and_deterministic() {
        let a = Hash64::new(1).str("ab").str("c").finish();
        let b = Hash64::new(1).str("a").str("bc").finish();
        assert_ne!(a, b);
        assert_eq!(a, Hash64::new(1).str("ab").str("c").finish());
        assert_ne!(a, Hash64::new(2).str("ab").str("c").finish());
    }
}
