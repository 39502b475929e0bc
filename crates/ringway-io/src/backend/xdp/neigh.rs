//! Destination MAC addresses for the AF_XDP send path: a copy of the
//! kernel's neighbour table for our interface, nothing else. Received
//! frames teach nothing (a frame's source MAC is whatever its sender
//! wrote), so an on-link spoofer cannot redirect anybody's copies; the
//! table is read off the send path — by the receive path, every
//! [`Neighbours::REFRESH_EVERY`], and when an address is missing at once
//! within a budget ([`Neighbours::WANTED_BURST`] reads, refilled at
//! [`Neighbours::WANTED_PER_SEC`]; a sender of spoofed sources cannot make
//! it read more often) — and entries the kernel
//! dropped or changed are dropped or changed here at the next read (they
//! age out with the kernel's). A destination the table lacks is sent
//! through the kernel (companion socket), which resolves it.

use std::collections::HashMap;
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

/// The kernel's complete neighbour entries of one interface.
#[derive(Debug)]
pub(crate) struct Neighbours {
    dev: String,
    table: HashMap<Ipv4Addr, [u8; 6]>,
    read_at: Option<Instant>,
    /// Reads for missing addresses still allowed now, and when that budget
    /// was last refilled.
    budget: f64,
    budget_at: Instant,
    /// A destination or a source was missing: read again soon.
    wanted: bool,
    /// Bumped whenever the table changes (cached headers are rebuilt).
    pub(crate) generation: u64,
    /// Reads of the kernel table so far.
    pub(crate) reads: u64,
}

impl Neighbours {
    /// Read again at least this often (entries age out with the kernel's).
    pub(crate) const REFRESH_EVERY: Duration = Duration::from_secs(1);
    /// Reads for missing addresses allowed at once (e.g. clients joining
    /// together).
    pub(crate) const WANTED_BURST: f64 = 16.0;
    /// Reads for missing addresses per second after the burst.
    pub(crate) const WANTED_PER_SEC: f64 = 50.0;

    pub(crate) fn new(dev: &str) -> Neighbours {
        Neighbours {
            dev: dev.to_string(),
            table: HashMap::new(),
            read_at: None,
            budget: Self::WANTED_BURST,
            budget_at: Instant::now(),
            wanted: false,
            generation: 0,
            reads: 0,
        }
    }

    /// MAC of on-link `ip`, if the kernel knows it (broadcast: all ones).
    pub(crate) fn get(&self, ip: Ipv4Addr) -> Option<[u8; 6]> {
        if ip.is_broadcast() {
            return Some([0xff; 6]);
        }
        self.table.get(&ip).copied()
    }

    /// `ip` was looked for: if unknown, ask for an early read.
    pub(crate) fn note(&mut self, ip: Ipv4Addr) {
        if !self.table.contains_key(&ip) {
            self.wanted = true;
        }
    }

    /// Time to read the kernel table again: every REFRESH_EVERY, and at
    /// once when an address is missing while the budget allows.
    pub(crate) fn due(&mut self) -> bool {
        if self
            .read_at
            .is_none_or(|t| t.elapsed() >= Self::REFRESH_EVERY)
        {
            return true;
        }
        if !self.wanted {
            return false;
        }
        let elapsed = self.budget_at.elapsed().as_secs_f64();
        self.budget_at = Instant::now();
        self.budget = (self.budget + elapsed * Self::WANTED_PER_SEC).min(Self::WANTED_BURST);
        self.budget >= 1.0
    }

    /// Replace the table with the kernel's; true when it changed.
    pub(crate) fn refresh(&mut self) -> bool {
        let now = Instant::now();
        self.read_at = Some(now);
        if self.wanted {
            self.budget -= 1.0;
        }
        self.wanted = false;
        self.reads += 1;
        let fresh: HashMap<Ipv4Addr, [u8; 6]> = read_arp(&self.dev).into_iter().collect();
        self.replace(fresh)
    }

    fn replace(&mut self, fresh: HashMap<Ipv4Addr, [u8; 6]>) -> bool {
        if fresh == self.table {
            return false;
        }
        self.table = fresh;
        self.generation += 1;
        true
    }
}

fn parse_mac(s: &str) -> Option<[u8; 6]> {
    let mut mac = [0u8; 6];
    let mut parts = s.split(':');
    for b in mac.iter_mut() {
        *b = u8::from_str_radix(parts.next()?, 16).ok()?;
    }
    parts.next().is_none().then_some(mac)
}

/// Complete entries of the calling thread's `/proc/.../net/arp` on `dev`.
fn read_arp(dev: &str) -> Vec<(Ipv4Addr, [u8; 6])> {
    let Ok(text) = std::fs::read_to_string("/proc/thread-self/net/arp") else {
        return Vec::new();
    };
    parse_arp(&text, dev)
}

fn parse_arp(t: &str, dev: &str) -> Vec<(Ipv4Addr, [u8; 6])> {
    t.lines()
        .skip(1)
        .filter_map(|l| {
            let fields: Vec<&str> = l.split_whitespace().collect();
            if fields.len() < 6 || fields[5] != dev {
                return None;
            }
            let flags = u32::from_str_radix(fields[2].trim_start_matches("0x"), 16).ok()?;
            if flags & 0x2 == 0 {
                return None; // ATF_COM: resolved
            }
            let mac = parse_mac(fields[3])?;
            (mac != [0; 6]).then_some((fields[0].parse().ok()?, mac))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_follows_the_kernel_and_ages_out() {
        let text =
            "IP address       HW type     Flags       HW address            Mask     Device\n\
                    10.77.0.2        0x1         0x2         02:00:00:00:00:02     *        eth0\n\
                    10.77.0.3        0x1         0x0         00:00:00:00:00:00     *        eth0\n\
                    10.77.0.4        0x1         0x2         02:00:00:00:00:04     *        eth1\n";
        let mut n = Neighbours::new("eth0");
        assert!(n.replace(parse_arp(text, "eth0").into_iter().collect()));
        assert_eq!(
            n.get("10.77.0.2".parse().unwrap()),
            Some([2, 0, 0, 0, 0, 2])
        );
        assert_eq!(n.get("10.77.0.3".parse().unwrap()), None, "incomplete");
        assert_eq!(n.get("10.77.0.4".parse().unwrap()), None, "other device");
        let g = n.generation;
        // The kernel forgot 10.77.0.2: so do we.
        assert!(n.replace(HashMap::new()));
        assert_eq!(n.get("10.77.0.2".parse().unwrap()), None);
        assert!(n.generation > g);
        // A miss asks for an early read, within a budget: a burst, then
        // WANTED_PER_SEC.
        n.read_at = Some(Instant::now());
        n.wanted = false;
        assert!(!n.due());
        let mut reads = 0;
        let start = Instant::now();
        while start.elapsed() < Duration::from_millis(100) {
            n.note("10.77.0.9".parse().unwrap());
            if n.due() {
                n.read_at = Some(Instant::now());
                n.budget -= 1.0;
                n.wanted = false;
                reads += 1;
            }
        }
        assert!(reads >= 16, "{reads}");
        assert!(reads <= 16 + 6, "{reads}: no more than the budget");
    }
}
