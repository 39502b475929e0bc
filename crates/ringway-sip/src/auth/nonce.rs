//! Stateless nonces: `hex(issued, id, HMAC-SHA256(key, issued, id,
//! realm)[..16])`. Any worker holding the key verifies any nonce without a
//! shared table; the expiry comes from `issued` and the `now` the driver
//! passes (the core reads no clock). A nonce from another key (another
//! process, or forged) does not verify; proxies given the same key
//! ([`NonceKey::derive`] from a shared secret) verify each other's.

use hmac::{Hmac, Mac};
use sha2::Sha256;
use std::fmt;

type HmacSha256 = Hmac<Sha256>;

/// Bytes of the MAC kept in a nonce (128 bits).
const MAC_BYTES: usize = 16;
/// Hex digits of a nonce: issued (16), id (16), MAC (32).
pub const NONCE_LEN: usize = 16 + 16 + 2 * MAC_BYTES;

/// How far in the future (ns) a nonce's issue time may be and still be
/// ours: the clocks of proxies sharing a key differ a little.
pub const CLOCK_SKEW: u64 = 500_000_000;

/// Domain separation of [`NonceKey::derive`].
const DERIVE_CONTEXT: &[u8] = b"ringway digest nonce key v1\0";

/// The secret key nonces are signed with (random at start-up; shared by
/// all workers through the `Proxy`). Its `Debug` does not show it.
#[derive(Clone, PartialEq, Eq)]
pub struct NonceKey(pub [u8; 32]);

impl fmt::Debug for NonceKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("NonceKey(..)")
    }
}

/// What a received nonce is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NonceCheck {
    /// Ours and not expired: issued at `issued` (ns) with this `id`.
    Fresh {
        /// Issue time (ns, the driver's clock).
        issued: u64,
        /// Unique id (a counter) of the nonce.
        id: u64,
    },
    /// Ours but expired (answer with a new challenge, `stale=true`).
    Stale {
        /// Unique id of the nonce.
        id: u64,
    },
    /// Not a nonce of ours (wrong length, not hex, bad MAC, other realm).
    Invalid,
}

impl NonceKey {
    /// The key of a shared `secret` (e.g. a file every proxy behind a
    /// dispatcher reads): SHA-256 over a fixed context and the secret, so
    /// proxies given the same secret sign and verify the same nonces.
    pub fn derive(secret: &[u8]) -> NonceKey {
        use sha2::Digest;
        let mut hash = Sha256::new();
        hash.update(DERIVE_CONTEXT);
        hash.update(secret);
        NonceKey(hash.finalize().into())
    }

    fn mac(&self, issued: u64, id: u64, realm: &str) -> [u8; MAC_BYTES] {
        // A key of any length is accepted by HMAC.
        let mut mac = <HmacSha256 as Mac>::new_from_slice(&self.0)
            .unwrap_or_else(|_| unreachable!("HMAC takes keys of any length"));
        mac.update(&issued.to_be_bytes());
        mac.update(&id.to_be_bytes());
        mac.update(realm.as_bytes());
        let full = mac.finalize().into_bytes();
        let mut out = [0u8; MAC_BYTES];
        out.copy_from_slice(&full[..MAC_BYTES]);
        out
    }

    /// A nonce for `realm` issued at `now` with the unique `id`.
    pub fn issue(&self, now: u64, id: u64, realm: &str) -> String {
        let mut bytes = [0u8; NONCE_LEN / 2];
        bytes[..8].copy_from_slice(&now.to_be_bytes());
        bytes[8..16].copy_from_slice(&id.to_be_bytes());
        bytes[16..].copy_from_slice(&self.mac(now, id, realm));
        let mut text = String::with_capacity(NONCE_LEN);
        for b in bytes {
            text.push(char::from(b"0123456789abcdef"[usize::from(b >> 4)]));
            text.push(char::from(b"0123456789abcdef"[usize::from(b & 0xF)]));
        }
        text
    }

    /// Check a received nonce for `realm` at `now`; it lives `lifetime` ns.
    pub fn check(&self, nonce: &str, realm: &str, now: u64, lifetime: u64) -> NonceCheck {
        let Some(bytes) = decode_hex::<{ NONCE_LEN / 2 }>(nonce) else {
            return NonceCheck::Invalid;
        };
        let issued = u64::from_be_bytes(bytes[..8].try_into().unwrap_or_default());
        let id = u64::from_be_bytes(bytes[8..16].try_into().unwrap_or_default());
        let expected = self.mac(issued, id, realm);
        // Constant-time comparison of the MAC.
        let difference = expected
            .iter()
            .zip(&bytes[16..])
            .fold(0u8, |acc, (a, b)| acc | (a ^ b));
        if difference != 0 {
            return NonceCheck::Invalid;
        }
        // A nonce from the future (beyond the skew between the clocks of
        // proxies sharing the key) is not ours.
        if issued > now.saturating_add(CLOCK_SKEW) {
            return NonceCheck::Invalid;
        }
        if now.saturating_sub(issued) >= lifetime {
            return NonceCheck::Stale { id };
        }
        NonceCheck::Fresh { issued, id }
    }
}

fn decode_hex<const N: usize>(text: &str) -> Option<[u8; N]> {
    let digits = text.as_bytes();
    if digits.len() != 2 * N {
        return None;
    }
    let value = |d: u8| (d as char).to_digit(16).map(|v| v as u8);
    let mut out = [0u8; N];
    for (i, pair) in digits.chunks_exact(2).enumerate() {
        out[i] = value(pair[0])? << 4 | value(pair[1])?;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECOND: u64 = 1_000_000_000;

    #[test]
    fn issued_nonces_verify_until_they_expire() {
        let key = NonceKey([7; 32]);
        let nonce = key.issue(10 * SECOND, 42, "ringway.test");
        assert_eq!(nonce.len(), NONCE_LEN);
        assert_eq!(
            key.check(&nonce, "ringway.test", 10 * SECOND, 300 * SECOND),
            NonceCheck::Fresh {
                issued: 10 * SECOND,
                id: 42
            }
        );
        assert_eq!(
            key.check(&nonce, "ringway.test", 310 * SECOND, 300 * SECOND),
            NonceCheck::Stale { id: 42 }
        );
        // Another realm, another key, a tampered or garbled nonce.
        let invalid = NonceCheck::Invalid;
        assert_eq!(
            key.check(&nonce, "other", 11 * SECOND, 300 * SECOND),
            invalid
        );
        let other_key = NonceKey([8; 32]);
        assert_eq!(
            other_key.check(&nonce, "ringway.test", 11 * SECOND, 300 * SECOND),
            invalid
        );
        let mut tampered = nonce.clone().into_bytes();
        tampered[20] = if tampered[20] == b'0' { b'1' } else { b'0' };
        let tampered = String::from_utf8(tampered).unwrap();
        assert_eq!(
            key.check(&tampered, "ringway.test", 11 * SECOND, 300 * SECOND),
            invalid
        );
        assert_eq!(
            key.check("abc", "ringway.test", 11 * SECOND, 300 * SECOND),
            invalid
        );
        let mut garbled = nonce.clone();
        garbled.replace_range(0..1, "g");
        assert_eq!(
            key.check(&garbled, "ringway.test", 11 * SECOND, 300 * SECOND),
            invalid
        );
        // Issued "in the future": not ours.
        assert_eq!(
            key.check(&nonce, "ringway.test", 9 * SECOND, 300 * SECOND),
            invalid
        );
        assert!(!format!("{key:?}").contains('7'));
    }

    #[test]
    fn derived_keys_agree_on_one_secret_only() {
        let a = NonceKey::derive(b"a shared secret of the fleet");
        let b = NonceKey::derive(b"a shared secret of the fleet");
        let other = NonceKey::derive(b"another secret of the fleet");
        let nonce = a.issue(10 * SECOND, 1, "ringway.test");
        assert!(matches!(
            b.check(&nonce, "ringway.test", 11 * SECOND, 300 * SECOND),
            NonceCheck::Fresh { .. }
        ));
        assert_eq!(
            other.check(&nonce, "ringway.test", 11 * SECOND, 300 * SECOND),
            NonceCheck::Invalid
        );
        // Issued by a proxy whose clock is a little ahead: still fresh.
        let ahead = a.issue(10 * SECOND + CLOCK_SKEW / 2, 2, "ringway.test");
        assert!(matches!(
            b.check(&ahead, "ringway.test", 10 * SECOND, 300 * SECOND),
            NonceCheck::Fresh { .. }
        ));
    }
}
