//! Branch encoding (`z9hG4bKrw<hash>.<loop hash>`) and parsing.

#![allow(unused_imports)]
use super::*;

pub(super) const BRANCH_PREFIX: &str = "z9hG4bKrw";

/// Stack-formatted branch `z9hG4bKrw<16 hex>.<8 hex>`.
pub(super) struct Branch {
    pub(super) buf: [u8; 34],
}

impl Branch {
    pub(super) fn new(h: u64, l: u32) -> Branch {
        const HEX: &[u8; 16] = b"0123456789abcdef";
        let mut buf = [0u8; 34];
        buf[..9].copy_from_slice(BRANCH_PREFIX.as_bytes());
        for i in 0..16 {
            buf[9 + i] = HEX[((h >> (60 - 4 * i)) & 0xF) as usize];
        }
        buf[25] = b'.';
        for i in 0..8 {
            buf[26 + i] = HEX[((l >> (28 - 4 * i)) & 0xF) as usize];
        }
        Branch { buf }
    }
    pub(super) fn as_str(&self) -> &str {
        std::str::from_utf8(&self.buf).unwrap_or(BRANCH_PREFIX)
    }
}

/// Parse one of our branches back into (tx hash, loop hash).
pub(super) fn parse_branch(b: &str) -> Option<(u64, u32)> {
    let rest = b.strip_prefix(BRANCH_PREFIX)?;
    if rest.len() != 25 || rest.as_bytes()[16] != b'.' {
        return None;
    }
    let h = u64::from_str_radix(&rest[..16], 16).ok()?;
    let l = u32::from_str_radix(&rest[17..], 16).ok()?;
    Some((h, l))
}
