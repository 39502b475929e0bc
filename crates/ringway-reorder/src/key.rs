//! Flow identity for the sorter: the whole key, compared byte for byte.
//!
//! The paper finds a flow's `SRPIC_manager` by {src ip, dst ip, src port,
//! dst port}; ringway's TCP key also carries the protocol (the 5-tuple). A 64-bit hash alone would let two colliding flows share one
//! manager (and hold or reorder each other's packets), so the sorter keeps
//! and compares the full key; the hash only picks the table slot.

/// Longest key in bytes: an IPv6 TCP 5-tuple is 37 (protocol, two
/// addresses, two ports), an SFU key (IPv6 source address and port, SSRC,
/// payload type) 23.
pub const MAX_KEY_LEN: usize = 40;

/// A flow's full identity, up to [`MAX_KEY_LEN`] bytes (the bytes beyond
/// its length are always zero, so keys compare and hash as fixed words).
#[derive(Copy, Clone, Debug)]
pub struct FlowKey {
    len: u8,
    bytes: [u8; MAX_KEY_LEN],
}

impl FlowKey {
    /// A key equal to no other (its length is impossible): an empty cache
    /// entry or table slot.
    pub(crate) const NONE: FlowKey = FlowKey {
        len: u8::MAX,
        bytes: [0; MAX_KEY_LEN],
    };

    /// The concatenation of `parts`. Callers use fixed layouts (the parts of
    /// one kind of key always have the same lengths), so concatenation is
    /// unambiguous. `None` if the parts exceed [`MAX_KEY_LEN`] bytes.
    pub fn from_parts(parts: &[&[u8]]) -> Option<FlowKey> {
        let mut key = FlowKey {
            len: 0,
            bytes: [0; MAX_KEY_LEN],
        };
        for p in parts {
            let offset = key.len as usize;
            key.bytes
                .get_mut(offset..offset + p.len())?
                .copy_from_slice(p);
            key.len += p.len() as u8;
        }
        Some(key)
    }

    /// A key made of one number (tests, synthetic workloads).
    pub fn from_u64(v: u64) -> FlowKey {
        let mut bytes = [0; MAX_KEY_LEN];
        bytes[..8].copy_from_slice(&v.to_be_bytes());
        FlowKey { len: 8, bytes }
    }

    /// The key's bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes[..self.len as usize]
    }

    /// The key as five 64-bit words (compared and hashed word by word: no
    /// byte loop, no `memcmp` call on the sorter's per-packet lookup).
    #[inline(always)]
    fn words(&self) -> [u64; MAX_KEY_LEN / 8] {
        let bytes = &self.bytes;
        let word =
            |i: usize| u64::from_le_bytes(bytes[i * 8..i * 8 + 8].try_into().expect("8 bytes"));
        [word(0), word(1), word(2), word(3), word(4)]
    }

    /// A 64-bit hash of the key (a multiply-rotate mix per word, then a
    /// splitmix64 finaliser), for picking a table slot; equality is always
    /// checked on the whole key.
    #[inline]
    pub fn hash64(&self) -> u64 {
        let mut hash = 0x9e37_79b9_7f4a_7c15u64 ^ u64::from(self.len);
        for word in self.words() {
            hash = (hash ^ word)
                .wrapping_mul(0xff51_afd7_ed55_8ccd)
                .rotate_left(29);
        }
        let mut mixed = hash.wrapping_add(0x9e37_79b9_7f4a_7c15);
        mixed = (mixed ^ (mixed >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        mixed = (mixed ^ (mixed >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        mixed ^ (mixed >> 31)
    }
}

/// Secret keys of [`FlowKey::hash_seeded`], drawn per sorter.
#[derive(Copy, Clone, Debug)]
pub(crate) struct HashSeed(pub(crate) [u64; 6]);

impl HashSeed {
    /// Fresh keys from the standard library's per-process random source
    /// (`RandomState`): the table layout cannot be predicted by a sender
    /// choosing addresses and ports.
    pub(crate) fn random() -> HashSeed {
        use std::hash::BuildHasher;
        let state = std::collections::hash_map::RandomState::new();
        let mut seed = [0u64; 6];
        for (i, s) in seed.iter_mut().enumerate() {
            *s = state.hash_one(i as u64);
        }
        HashSeed(seed)
    }
}

/// The 128-bit product of `a` and `b`, its halves xor-ed together.
#[inline(always)]
fn folded_multiply(a: u64, b: u64) -> u64 {
    let product = u128::from(a) * u128::from(b);
    (product as u64) ^ ((product >> 64) as u64)
}

impl FlowKey {
    /// A keyed 64-bit hash for the sorter's flow table: three independent
    /// folded multiplies over the five words and the length, then one more
    /// (two multiplies of latency, against [`FlowKey::hash64`]'s seven
    /// dependent ones). Equality is still checked on the whole key.
    #[inline]
    pub(crate) fn hash_seeded(&self, seed: &HashSeed) -> u64 {
        let seed_words = &seed.0;
        let words = self.words();
        if self.len <= 16 {
            // An IPv4 TCP 5-tuple, an SSRC: the other words are zero.
            return folded_multiply(
                words[0] ^ seed_words[0],
                words[1] ^ seed_words[1] ^ u64::from(self.len),
            );
        }
        let lane0 = folded_multiply(words[0] ^ seed_words[0], words[1] ^ seed_words[1]);
        let lane1 = folded_multiply(words[2] ^ seed_words[2], words[3] ^ seed_words[3]);
        let lane2 = folded_multiply(
            words[4] ^ seed_words[4],
            u64::from(self.len) ^ seed_words[5],
        );
        folded_multiply(lane0 ^ seed_words[5], lane1 ^ lane2 ^ seed_words[1])
    }
}

impl PartialEq for FlowKey {
    #[inline]
    fn eq(&self, other: &FlowKey) -> bool {
        if self.len != other.len {
            return false;
        }
        let (mine, theirs) = (self.words(), other.words());
        if self.len <= 16 {
            // The bytes beyond the length are zero in both keys: an IPv4
            // 5-tuple or an SSRC needs two words.
            return (mine[0] ^ theirs[0]) | (mine[1] ^ theirs[1]) == 0;
        }
        // One or-reduction of the differences, no branch per word.
        let diff = (mine[0] ^ theirs[0])
            | (mine[1] ^ theirs[1])
            | (mine[2] ^ theirs[2])
            | (mine[3] ^ theirs[3])
            | (mine[4] ^ theirs[4])
            | u64::from(self.len ^ other.len);
        diff == 0
    }
}

impl Eq for FlowKey {}

impl std::hash::Hash for FlowKey {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        state.write(self.as_bytes());
    }
}

impl From<u64> for FlowKey {
    fn from(v: u64) -> FlowKey {
        FlowKey::from_u64(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_compare_whole_bytes() {
        let a =
            FlowKey::from_parts(&[&[10, 0, 0, 1], &[10, 0, 0, 2], &[0, 80], &[4, 210]]).unwrap();
        let b =
            FlowKey::from_parts(&[&[10, 0, 0, 1], &[10, 0, 0, 2], &[0, 80], &[4, 211]]).unwrap();
        assert_ne!(a, b);
        assert_eq!(a.as_bytes().len(), 12);
        assert_eq!(
            a,
            FlowKey::from_parts(&[&a.as_bytes()[..6], &a.as_bytes()[6..]]).unwrap()
        );
        assert!(FlowKey::from_parts(&[&[0; 36], &[0; 4]]).is_some());
        assert!(FlowKey::from_parts(&[&[0; 36], &[0; 5]]).is_none());
        assert_ne!(FlowKey::from_u64(1), FlowKey::from_u64(2));
    }
}
