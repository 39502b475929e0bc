//! Admission control without per-address state: return-routability
//! cookies (a keyed MAC with a rotating secret and an expiry) and a
//! per-prefix rate limit on the replies the SFU sends to addresses it has
//! not verified.
//!
//! A cookie is what a CHALLENGE carries and what REGISTER / JOIN must echo:
//! `epoch` (u32, big-endian) followed by the first 8 bytes (big-endian) of
//! SipHash-2-4 over (address, port, epoch) under that epoch's secret. The
//! secret of each epoch is drawn from the core's keyed generator when the
//! epoch begins and forgotten one epoch later, so a cookie is accepted for
//! at least one and at most two epoch lengths after it was made. Only an
//! address that receives what is sent to it can echo a valid cookie: a
//! spoofed source never gets past the CHALLENGE, and the CHALLENGE is never
//! larger than the request that earned it.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};

use crate::wire::COOKIE_LEN;

/// SipHash-2-4 of `data` under the 128-bit key `(k0, k1)` (the reference
/// algorithm of Aumasson and Bernstein, little-endian words).
pub fn siphash24(k0: u64, k1: u64, data: &[u8]) -> u64 {
    let mut state = [
        k0 ^ 0x736f_6d65_7073_6575,
        k1 ^ 0x646f_7261_6e64_6f6d,
        k0 ^ 0x6c79_6765_6e65_7261,
        k1 ^ 0x7465_6462_7974_6573,
    ];
    fn round(state: &mut [u64; 4]) {
        state[0] = state[0].wrapping_add(state[1]);
        state[1] = state[1].rotate_left(13) ^ state[0];
        state[0] = state[0].rotate_left(32);
        state[2] = state[2].wrapping_add(state[3]);
        state[3] = state[3].rotate_left(16) ^ state[2];
        state[0] = state[0].wrapping_add(state[3]);
        state[3] = state[3].rotate_left(21) ^ state[0];
        state[2] = state[2].wrapping_add(state[1]);
        state[1] = state[1].rotate_left(17) ^ state[2];
        state[2] = state[2].rotate_left(32);
    }
    let mut chunks = data.chunks_exact(8);
    for c in &mut chunks {
        let word = u64::from_le_bytes(c.try_into().expect("8 bytes"));
        state[3] ^= word;
        round(&mut state);
        round(&mut state);
        state[0] ^= word;
    }
    let rest = chunks.remainder();
    let mut last = [0u8; 8];
    last[..rest.len()].copy_from_slice(rest);
    last[7] = data.len() as u8;
    let word = u64::from_le_bytes(last);
    state[3] ^= word;
    round(&mut state);
    round(&mut state);
    state[0] ^= word;
    state[2] ^= 0xff;
    for _ in 0..4 {
        round(&mut state);
    }
    state[0] ^ state[1] ^ state[2] ^ state[3]
}

/// A keyed generator: SipHash-2-4 of a counter under a secret key. Its
/// outputs (tokens, cookie secrets) cannot be predicted from earlier ones
/// without the key; the key comes from [`crate::SfuConfig::seed`], which
/// the server fills from the operating system's random source.
#[derive(Clone, Debug)]
pub(crate) struct KeyedRng {
    key: (u64, u64),
    counter: u64,
}

impl KeyedRng {
    pub(crate) fn new(seed: u128) -> Self {
        KeyedRng {
            key: (seed as u64, (seed >> 64) as u64),
            counter: 0,
        }
    }
    pub(crate) fn next_u64(&mut self) -> u64 {
        self.counter = self.counter.wrapping_add(1);
        siphash24(self.key.0, self.key.1, &self.counter.to_le_bytes())
    }
}

/// Makes and checks return-routability cookies (see the module docs).
#[derive(Clone, Debug)]
pub(crate) struct Cookies {
    /// Length of one epoch (ns).
    period_ns: u64,
    /// (epoch, secret) of the current and the previous epoch.
    secrets: [(u64, (u64, u64)); 2],
}

impl Cookies {
    pub(crate) fn new(period_ns: u64, now: u64, rng: &mut KeyedRng) -> Self {
        let epoch = now / period_ns.max(1);
        Cookies {
            period_ns: period_ns.max(1),
            secrets: [
                (epoch, (rng.next_u64(), rng.next_u64())),
                (epoch.wrapping_sub(1), (rng.next_u64(), rng.next_u64())),
            ],
        }
    }

    /// Move to the epoch of `now`: a new secret for it, the one before kept
    /// (secrets older than that are forgotten, and their cookies with them).
    pub(crate) fn rotate(&mut self, now: u64, rng: &mut KeyedRng) {
        let epoch = now / self.period_ns;
        if epoch == self.secrets[0].0 {
            return;
        }
        let prev = if epoch == self.secrets[0].0.wrapping_add(1) {
            self.secrets[0]
        } else {
            (epoch.wrapping_sub(1), (rng.next_u64(), rng.next_u64()))
        };
        self.secrets = [(epoch, (rng.next_u64(), rng.next_u64())), prev];
    }

    fn mac(secret: (u64, u64), peer: SocketAddr, epoch: u32) -> u64 {
        let mut input = [0u8; 16 + 2 + 4];
        let ip = match peer.ip() {
            IpAddr::V4(a) => a.to_ipv6_mapped().octets(),
            IpAddr::V6(a) => a.octets(),
        };
        input[..16].copy_from_slice(&ip);
        input[16..18].copy_from_slice(&peer.port().to_be_bytes());
        input[18..].copy_from_slice(&epoch.to_be_bytes());
        siphash24(secret.0, secret.1, &input)
    }

    /// The cookie for `peer` in the current epoch (call [`Self::rotate`] first).
    pub(crate) fn make(&self, peer: SocketAddr) -> [u8; COOKIE_LEN] {
        let (current_epoch, secret) = self.secrets[0];
        let epoch = current_epoch as u32;
        let mut cookie = [0u8; COOKIE_LEN];
        cookie[..4].copy_from_slice(&epoch.to_be_bytes());
        cookie[4..].copy_from_slice(&Self::mac(secret, peer, epoch).to_be_bytes());
        cookie
    }

    /// `cookie` was made for `peer` in the current or the previous epoch.
    pub(crate) fn check(&self, peer: SocketAddr, cookie: &[u8; COOKIE_LEN]) -> bool {
        let epoch = u32::from_be_bytes(cookie[..4].try_into().expect("4 bytes"));
        let mac = u64::from_be_bytes(cookie[4..].try_into().expect("8 bytes"));
        self.secrets
            .iter()
            .any(|&(e, secret)| e as u32 == epoch && Self::mac(secret, peer, epoch) == mac)
    }
}

/// The network prefix a rate-limit bucket covers: IPv4 /24, IPv6 /56.
fn prefix(ip: IpAddr) -> [u8; 8] {
    let mut bytes = [0u8; 8];
    match ip {
        IpAddr::V4(a) => {
            bytes[0] = 4;
            bytes[1..4].copy_from_slice(&a.octets()[..3]);
        }
        IpAddr::V6(a) => {
            if let Some(ipv4) = a.to_ipv4_mapped() {
                return prefix(IpAddr::V4(ipv4));
            }
            bytes[0] = 6;
            bytes[1..8].copy_from_slice(&a.octets()[..7]);
        }
    }
    bytes
}

/// Token buckets per source prefix, bounded in number: when every slot is
/// taken, buckets that are full again are dropped, and prefixes that still
/// find no slot share one overflow bucket.
#[derive(Clone, Debug)]
pub(crate) struct PrefixLimiter {
    /// Replies per second per prefix.
    rate: u32,
    /// Bucket depth.
    burst: u32,
    /// Most buckets kept.
    max_prefixes: usize,
    /// (tokens × 1e9, last refill ns) per prefix.
    buckets: HashMap<[u8; 8], (u64, u64)>,
    overflow: (u64, u64),
    /// When the table was last swept for full buckets (ns): at most once
    /// per token interval, so packets from ever new prefixes cannot make
    /// every packet scan the whole table.
    last_sweep: Option<u64>,
}

impl PrefixLimiter {
    pub(crate) fn new(rate: u32, burst: u32, max_prefixes: usize) -> Self {
        PrefixLimiter {
            rate,
            burst: burst.max(1),
            max_prefixes: max_prefixes.max(1),
            buckets: HashMap::new(),
            overflow: (u64::from(burst.max(1)) * 1_000_000_000, 0),
            last_sweep: None,
        }
    }

    fn refill(&self, b: &mut (u64, u64), now: u64) {
        let cap = u64::from(self.burst) * 1_000_000_000;
        let elapsed = now.saturating_sub(b.1);
        b.0 =
            b.0.saturating_add(elapsed.saturating_mul(u64::from(self.rate)))
                .min(cap);
        b.1 = now;
    }

    /// Take one token for `ip` at `now` (ns); false when its prefix is over
    /// the rate.
    pub(crate) fn allow(&mut self, ip: IpAddr, now: u64) -> bool {
        let key = prefix(ip);
        let cap = u64::from(self.burst) * 1_000_000_000;
        let sweep_interval = (1_000_000_000 / u64::from(self.rate.max(1))).max(1_000_000);
        if !self.buckets.contains_key(&key)
            && self.buckets.len() >= self.max_prefixes
            && self
                .last_sweep
                .is_none_or(|t| now.saturating_sub(t) >= sweep_interval)
        {
            self.last_sweep = Some(now);
            let (rate, full) = (u64::from(self.rate), cap);
            self.buckets.retain(|_, found| {
                found
                    .0
                    .saturating_add(now.saturating_sub(found.1).saturating_mul(rate))
                    < full
            });
        }
        let mut bucket = if let Some(found) = self.buckets.get(&key) {
            *found
        } else if self.buckets.len() < self.max_prefixes {
            (cap, now)
        } else {
            let mut overflow = self.overflow;
            self.refill(&mut overflow, now);
            let allowed = overflow.0 >= 1_000_000_000;
            if allowed {
                overflow.0 -= 1_000_000_000;
            }
            self.overflow = overflow;
            return allowed;
        };
        self.refill(&mut bucket, now);
        let allowed = bucket.0 >= 1_000_000_000;
        if allowed {
            bucket.0 -= 1_000_000_000;
        }
        self.buckets.insert(key, bucket);
        allowed
    }

    /// Buckets held now.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.buckets.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn siphash_reference_vector() {
        // The SipHash paper's test vector: key 00..0f, message 00..0e.
        let k0 = u64::from_le_bytes([0, 1, 2, 3, 4, 5, 6, 7]);
        let k1 = u64::from_le_bytes([8, 9, 10, 11, 12, 13, 14, 15]);
        let m: Vec<u8> = (0..15).collect();
        assert_eq!(siphash24(k0, k1, &m), 0xa129_ca61_49be_45e5);
        // And the first entry of the reference table (empty message).
        assert_eq!(siphash24(k0, k1, &[]), 0x726f_db47_dd0e_0e31);
    }

    #[test]
    fn cookies_bind_address_and_expire() {
        let mut rng = KeyedRng::new(7);
        let p = 1_000_000_000;
        let mut c = Cookies::new(p, 5 * p, &mut rng);
        let a: SocketAddr = "10.0.0.1:4000".parse().unwrap();
        let b: SocketAddr = "10.0.0.1:4001".parse().unwrap();
        let k = c.make(a);
        assert!(c.check(a, &k));
        assert!(!c.check(b, &k), "bound to the port");
        let mut bad = k;
        bad[11] ^= 1;
        assert!(!c.check(a, &bad));
        c.rotate(6 * p, &mut rng);
        assert!(c.check(a, &k), "accepted one epoch later");
        c.rotate(7 * p, &mut rng);
        assert!(!c.check(a, &k), "expired after two epochs");
        // A jump over several epochs forgets everything.
        let k = c.make(a);
        c.rotate(20 * p, &mut rng);
        assert!(!c.check(a, &k));
        // Another SFU (another seed) does not accept our cookies.
        let other = Cookies::new(p, 20 * p, &mut KeyedRng::new(8));
        assert!(!other.check(a, &c.make(a)));
    }

    #[test]
    fn limiter_per_prefix_and_bounded() {
        let mut l = PrefixLimiter::new(10, 3, 4);
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        // Burst of 3 per /24, then 10 per second.
        assert!((0..3).all(|_| l.allow(ip("10.0.0.1"), 0)));
        assert!(!l.allow(ip("10.0.0.200"), 0), "same /24");
        assert!(l.allow(ip("10.0.1.1"), 0), "other /24");
        assert!(l.allow(ip("10.0.0.1"), 100_000_000), "refilled after 0.1 s");
        assert!(!l.allow(ip("10.0.0.1"), 100_000_000));
        // Many prefixes: the table stays bounded; newcomers share the overflow bucket.
        for i in 0..100u8 {
            l.allow(ip(&format!("10.1.{i}.1")), 200_000_000);
        }
        assert!(l.len() <= 4);
        assert!(!l.allow(ip("10.2.0.1"), 200_000_000));
    }
}
