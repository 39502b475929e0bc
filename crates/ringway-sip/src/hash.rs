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
            let mut word_bytes = [0u8; 8];
            word_bytes.copy_from_slice(c);
            self.word(u64::from_le_bytes(word_bytes));
        }
        let tail = chunks.remainder();
        if !tail.is_empty() {
            let mut word_bytes = [0u8; 8];
            word_bytes[..tail.len()].copy_from_slice(tail);
            self.word(u64::from_le_bytes(word_bytes));
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
        let mut mixed = self.0;
        mixed = (mixed ^ (mixed >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        mixed = (mixed ^ (mixed >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        mixed ^ (mixed >> 31)
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
        let mut low = [0u8; 8];
        let mut high = [0u8; 8];
        low.copy_from_slice(&key[..8]);
        high.copy_from_slice(&key[8..]);
        MacKey {
            k0: u64::from_le_bytes(low),
            k1: u64::from_le_bytes(high),
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
            buf: [0; MAC_BLOCK],
            buffered: 0,
            length: 0,
        }
    }
}

/// Bytes a [`Mac`] gathers before compressing them (8 words).
const MAC_BLOCK: usize = 64;

/// Streaming SipHash-2-4 (Aumasson and Bernstein, the reference algorithm
/// over the concatenated input). [`Mac::str`] frames its input (length
/// suffix), so field boundaries matter.
#[derive(Clone, Copy, Debug)]
pub struct Mac {
    v: [u64; 4],
    buf: [u8; MAC_BLOCK],
    buffered: usize,
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
    fn compress(v: &mut [u64; 4], m: u64) {
        v[3] ^= m;
        Self::round(v);
        Self::round(v);
        v[0] ^= m;
    }

    /// Compress the whole words of `bytes` (a multiple of 8 long).
    fn compress_words(v: &mut [u64; 4], bytes: &[u8]) {
        for word in bytes.chunks_exact(8) {
            let mut word_bytes = [0u8; 8];
            word_bytes.copy_from_slice(word);
            Self::compress(v, u64::from_le_bytes(word_bytes));
        }
    }

    /// Absorb raw bytes (no framing: `raw(b"ab").raw(b"c")` equals `raw(b"abc")`).
    pub fn raw(&mut self, mut b: &[u8]) -> &mut Self {
        self.length = self.length.wrapping_add(b.len());
        while !b.is_empty() {
            let take = b.len().min(MAC_BLOCK - self.buffered);
            self.buf[self.buffered..self.buffered + take].copy_from_slice(&b[..take]);
            self.buffered += take;
            b = &b[take..];
            if self.buffered == MAC_BLOCK {
                Self::compress_words(&mut self.v, &self.buf);
                self.buffered = 0;
            }
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
        let mut state = self.v;
        let whole = self.buffered & !7;
        Self::compress_words(&mut state, &self.buf[..whole]);
        let mut tail = [0u8; 8];
        tail[..self.buffered - whole].copy_from_slice(&self.buf[whole..self.buffered]);
        let last_word = ((self.length as u64 & 0xFF) << 56) | u64::from_le_bytes(tail);
        Self::compress(&mut state, last_word);
        state[2] ^= 0xFF;
        for _ in 0..4 {
            Self::round(&mut state);
        }
        state[0] ^ state[1] ^ state[2] ^ state[3]
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
        // Longer than the buffer, in any split, is one stream.
        let long: Vec<u8> = (0..200u32).map(|i| (i * 7) as u8).collect();
        let whole = key.mac().raw(&long).finish();
        for split in [1, 7, 8, 63, 64, 65, 130, 199] {
            let (a, b) = long.split_at(split);
            assert_eq!(key.mac().raw(a).raw(b).finish(), whole, "{split}");
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
