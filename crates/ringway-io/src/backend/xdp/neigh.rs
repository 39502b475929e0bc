//! Destination MAC addresses for the fast paths (the AF_XDP send path and
//! the in-kernel fan-out's map): the kernel's own forwarding decision for
//! each destination, nothing else.
//!
//! * **Next hop**: per destination, the kernel's route (`RTM_GETROUTE`,
//!   [`super::netlink`]: its FIB with policy rules, as `ip route get`):
//!   the gateway when the route has one, the destination itself when it is
//!   on-link; a destination routed out of another interface, or not by a
//!   unicast route, has no next hop here.
//! * **MAC**: the next hop's entry in the kernel's neighbour table (IPv4
//!   and IPv6, `RTM_GETNEIGH`) on our interface, in a usable state.
//!
//! Received frames teach nothing (a frame's source MAC is whatever its
//! sender wrote), so an on-link spoofer cannot redirect anybody's copies.
//! Both tables are read off the send path — by the receive path (or the
//! fan-out's control tick), every [`Neighbours::REFRESH_EVERY`] in full,
//! and for newly wanted destinations at once within a budget
//! ([`Neighbours::WANTED_BURST`] reads, refilled at
//! [`Neighbours::WANTED_PER_SEC`], at most [`Neighbours::NEW_PER_READ`]
//! new destinations each: a sender of spoofed sources cannot make it read
//! more) — and entries the kernel dropped or changed are dropped or changed
//! here at the next read (they age out with the kernel's). A destination
//! without a next hop and MAC is sent through the kernel (companion
//! socket, counted as `tx_via_socket`; the fan-out leaves its route to user
//! space), which resolves it: its neighbour entry is there at a later read.

use super::netlink::{RouteAnswer, RouteSocket};
use std::collections::{HashMap, HashSet};
use std::net::IpAddr;
use std::time::{Duration, Instant};

/// Next hops and the kernel's neighbour entries of one interface.
pub(crate) struct Neighbours {
    dev: String,
    socket: Option<RouteSocket>,
    /// The kernel's neighbour table on our interface.
    table: HashMap<IpAddr, [u8; 6]>,
    /// Destination → its next hop through our interface (`None`: not
    /// through it, or no unicast route).
    hops: HashMap<IpAddr, Option<IpAddr>>,
    /// Destinations asked for that have no next hop yet.
    pending: HashSet<IpAddr>,
    read_at: Option<Instant>,
    /// Reads for missing addresses still allowed now, and when that budget
    /// was last refilled.
    budget: f64,
    budget_at: Instant,
    /// A destination or a source was missing: read again soon.
    wanted: bool,
    /// Bumped whenever a next hop or a MAC changes (cached headers are
    /// rebuilt).
    pub(crate) generation: u64,
    /// Reads of the kernel tables so far.
    pub(crate) reads: u64,
    /// Reads that failed (the tables are then empty: everything goes
    /// through the kernel until a read works).
    pub(crate) failures: u64,
}

impl std::fmt::Debug for Neighbours {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Neighbours")
            .field("dev", &self.dev)
            .field("hops", &self.hops.len())
            .field("table", &self.table.len())
            .finish()
    }
}

impl Neighbours {
    /// Read again at least this often (entries age out with the kernel's,
    /// routes are looked up again).
    pub(crate) const REFRESH_EVERY: Duration = Duration::from_secs(1);
    /// Reads for missing addresses allowed at once (e.g. clients joining
    /// together).
    pub(crate) const WANTED_BURST: f64 = 16.0;
    /// Reads for missing addresses per second after the burst.
    pub(crate) const WANTED_PER_SEC: f64 = 50.0;
    /// New destinations whose route one early read looks up.
    pub(crate) const NEW_PER_READ: usize = 32;
    /// Destinations remembered at most (then forgotten all at once).
    pub(crate) const MAX_DESTINATIONS: usize = 4096;

    pub(crate) fn new(dev: &str) -> Neighbours {
        Neighbours {
            dev: dev.to_string(),
            socket: None,
            table: HashMap::new(),
            hops: HashMap::new(),
            pending: HashSet::new(),
            read_at: None,
            budget: Self::WANTED_BURST,
            budget_at: Instant::now(),
            wanted: false,
            generation: 0,
            reads: 0,
            failures: 0,
        }
    }

    /// MAC of the next hop towards `ip`, if the kernel routes it out of
    /// our interface and knows that hop's MAC (IPv4 broadcast: all ones).
    pub(crate) fn get(&self, ip: IpAddr) -> Option<[u8; 6]> {
        if let IpAddr::V4(v4) = ip {
            if v4.is_broadcast() {
                return Some([0xff; 6]);
            }
        }
        let hop = (*self.hops.get(&ip)?)?;
        self.table.get(&hop).copied()
    }

    /// `ip` was looked for: if it has no next hop or MAC yet, ask for an
    /// early read.
    pub(crate) fn note(&mut self, ip: IpAddr) {
        match self.hops.get(&ip) {
            None => {
                if self.pending.len() < Self::MAX_DESTINATIONS {
                    self.pending.insert(ip);
                }
                self.wanted = true;
            }
            Some(Some(hop)) if !self.table.contains_key(hop) => self.wanted = true,
            Some(_) => {}
        }
    }

    /// Time to read the kernel tables again: every REFRESH_EVERY, and at
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

    /// Read the kernel's tables (in full every REFRESH_EVERY, else the
    /// neighbour table and the routes of up to NEW_PER_READ new
    /// destinations); true when a next hop or a MAC changed.
    pub(crate) fn refresh(&mut self) -> bool {
        let full = self
            .read_at
            .is_none_or(|t| t.elapsed() >= Self::REFRESH_EVERY);
        self.read_at = Some(Instant::now());
        if self.wanted && !full {
            self.budget -= 1.0;
        }
        self.wanted = false;
        self.reads += 1;
        let mut dsts: Vec<IpAddr> = if full {
            self.hops.keys().copied().collect()
        } else {
            Vec::new()
        };
        if dsts.len() + self.pending.len() > Self::MAX_DESTINATIONS {
            dsts.clear();
        }
        let new: Vec<IpAddr> = self
            .pending
            .iter()
            .copied()
            .filter(|ip| !self.hops.contains_key(ip))
            .take(if full {
                Self::MAX_DESTINATIONS
            } else {
                Self::NEW_PER_READ
            })
            .collect();
        for ip in &new {
            self.pending.remove(ip);
        }
        if !self.pending.is_empty() {
            self.wanted = true;
        }
        dsts.extend(new);
        match self.read(&dsts) {
            Ok((table, found)) => {
                let mut hops = if full {
                    HashMap::new()
                } else {
                    self.hops.clone()
                };
                if hops.len() + found.len() > Self::MAX_DESTINATIONS {
                    hops.clear();
                }
                hops.extend(found);
                self.replace(table, hops)
            }
            Err(e) => {
                if self.failures == 0 {
                    log::warn!(
                        "fast path on {}: reading the kernel's routes and neighbours: {e} \
                         (copies go through the kernel until a read works)",
                        self.dev
                    );
                }
                self.failures += 1;
                self.socket = None;
                self.replace(HashMap::new(), HashMap::new())
            }
        }
    }

    /// The neighbour table of our interface and the next hops of `dsts`.
    #[allow(clippy::type_complexity)]
    fn read(
        &mut self,
        dsts: &[IpAddr],
    ) -> std::io::Result<(HashMap<IpAddr, [u8; 6]>, Vec<(IpAddr, Option<IpAddr>)>)> {
        let ifindex = super::ifindex(&self.dev)?;
        let socket = match &mut self.socket {
            Some(s) => s,
            None => self.socket.insert(RouteSocket::open()?),
        };
        let answers = socket.routes(dsts)?;
        let table = socket
            .neighbours()?
            .into_iter()
            .filter(|(oif, _, _)| *oif == ifindex)
            .map(|(_, ip, mac)| (ip, mac))
            .collect();
        let hops = dsts
            .iter()
            .zip(answers)
            .map(|(&dst, answer)| {
                let hop = match answer {
                    RouteAnswer::Unicast(h) if h.oif == ifindex => Some(h.gateway.unwrap_or(dst)),
                    _ => None,
                };
                (dst, hop)
            })
            .collect();
        Ok((table, hops))
    }

    fn replace(
        &mut self,
        table: HashMap<IpAddr, [u8; 6]>,
        hops: HashMap<IpAddr, Option<IpAddr>>,
    ) -> bool {
        if table == self.table && hops == self.hops {
            return false;
        }
        self.table = table;
        self.hops = hops;
        self.generation += 1;
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn a_destination_takes_its_next_hops_mac_and_ages_out() {
        let mut n = Neighbours::new("eth0");
        let router = [2, 0, 0, 0, 0, 1];
        let table: HashMap<_, _> = [
            (ip("10.77.1.2"), router),
            (ip("10.77.1.9"), [2, 0, 0, 0, 0, 9]),
        ]
        .into();
        let hops: HashMap<_, _> = [
            // Behind the router, on-link, out of another interface.
            (ip("10.77.3.2"), Some(ip("10.77.1.2"))),
            (ip("10.77.1.9"), Some(ip("10.77.1.9"))),
            (ip("10.88.0.1"), None),
        ]
        .into();
        assert!(n.replace(table.clone(), hops.clone()));
        assert_eq!(n.get(ip("10.77.3.2")), Some(router));
        assert_eq!(n.get(ip("10.77.1.9")), Some([2, 0, 0, 0, 0, 9]));
        assert_eq!(n.get(ip("10.88.0.1")), None, "not through us");
        assert_eq!(n.get(ip("10.77.4.4")), None, "never looked up");
        assert_eq!(n.get(ip("255.255.255.255")), Some([0xff; 6]));
        let g = n.generation;
        assert!(!n.replace(table, hops.clone()), "same tables");
        // The kernel forgot the router's MAC: so do we.
        assert!(n.replace(HashMap::new(), hops));
        assert_eq!(n.get(ip("10.77.3.2")), None);
        assert!(n.generation > g);
    }

    #[test]
    fn misses_ask_for_early_reads_within_a_budget() {
        let mut n = Neighbours::new("eth0");
        n.read_at = Some(Instant::now());
        assert!(!n.due());
        let mut reads = 0;
        let start = Instant::now();
        while start.elapsed() < Duration::from_millis(100) {
            n.note(ip("10.77.0.9"));
            if n.due() {
                n.read_at = Some(Instant::now());
                n.budget -= 1.0;
                n.wanted = false;
                reads += 1;
            }
        }
        assert!(reads >= 16, "{reads}");
        assert!(reads <= 16 + 6, "{reads}: no more than the budget");
        // Pending destinations are bounded.
        for k in 0..(Neighbours::MAX_DESTINATIONS as u32 + 100) {
            n.note(IpAddr::V4(k.into()));
        }
        assert!(n.pending.len() <= Neighbours::MAX_DESTINATIONS);
    }
}
