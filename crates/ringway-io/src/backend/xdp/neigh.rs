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
//!
//! With several engines (one per receive queue) the reads are done once,
//! not per engine: a [`NextHopRefresher`] owned by one thread (the SFU's
//! control thread) reads the tables as above and publishes each result as
//! an immutable [`NextHopTable`]; every engine's [`NextHopView`] picks up a
//! newer one with one atomic load per receive call (a lock only when there
//! is one) and asks for missing addresses over a bounded channel (full:
//! the ask waits for the next one; the refresher's budget applies).

use super::netlink::{RouteAnswer, RouteSocket};
use std::collections::{HashMap, HashSet};
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// One read's result: next hops and the kernel's neighbour table of our
/// interface (immutable once read; shared between engines).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct NextHopTable {
    /// The kernel's neighbour table on our interface.
    table: HashMap<IpAddr, [u8; 6]>,
    /// Destination → its next hop through our interface (`None`: not
    /// through it, or no unicast route).
    hops: HashMap<IpAddr, Option<IpAddr>>,
}

impl NextHopTable {
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

    /// `ip` has not been looked up yet, or its next hop has no MAC yet.
    fn missing(&self, ip: IpAddr) -> bool {
        match self.hops.get(&ip) {
            None => true,
            Some(Some(hop)) => !self.table.contains_key(hop),
            Some(None) => false,
        }
    }
}

/// Next hops and the kernel's neighbour entries of one interface.
pub(crate) struct Neighbours {
    dev: String,
    /// The interface's index, resolved when the backend was opened.
    ifindex: Option<u32>,
    socket: Option<RouteSocket>,
    /// `socket` was opened in the namespace the backend was made in: it is
    /// never dropped for another (see [`Neighbours::new`]).
    socket_from_start: bool,
    /// What the last read found.
    current: Arc<NextHopTable>,
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
            .field("hops", &self.current.hops.len())
            .field("table", &self.current.table.len())
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

    /// The tables of `dev`, in the calling thread's network namespace: its
    /// index and the rtnetlink socket are taken now (a socket stays in the
    /// namespace it was made in), so a backend handed to a thread of
    /// another namespace (a load client's receiver) still reads its own.
    /// That socket is kept after a failed read (replies are matched by
    /// sequence number, so a stale one is ignored); only a reader whose
    /// socket could not be opened here opens one when it reads.
    pub(crate) fn new(dev: &str) -> Neighbours {
        let socket = RouteSocket::open().ok();
        let socket_from_start = socket.is_some();
        Neighbours {
            dev: dev.to_string(),
            ifindex: super::ifindex(dev).ok(),
            socket,
            socket_from_start,
            current: Arc::default(),
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

    /// MAC of the next hop towards `ip` ([`NextHopTable::get`]).
    pub(crate) fn get(&self, ip: IpAddr) -> Option<[u8; 6]> {
        self.current.get(ip)
    }

    /// `ip` was looked for: if it has no next hop or MAC yet, ask for an
    /// early read.
    pub(crate) fn note(&mut self, ip: IpAddr) {
        match self.current.hops.get(&ip) {
            None => {
                if self.pending.len() < Self::MAX_DESTINATIONS {
                    self.pending.insert(ip);
                }
                self.wanted = true;
            }
            Some(Some(hop)) if !self.current.table.contains_key(hop) => self.wanted = true,
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
            self.current.hops.keys().copied().collect()
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
            .filter(|ip| !self.current.hops.contains_key(ip))
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
                    self.current.hops.clone()
                };
                if hops.len() + found.len() > Self::MAX_DESTINATIONS {
                    hops.clear();
                }
                hops.extend(found);
                self.replace(NextHopTable { table, hops })
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
                if !self.socket_from_start {
                    self.socket = None;
                }
                self.replace(NextHopTable::default())
            }
        }
    }

    /// The neighbour table of our interface and the next hops of `dsts`.
    #[allow(clippy::type_complexity)]
    fn read(
        &mut self,
        dsts: &[IpAddr],
    ) -> std::io::Result<(HashMap<IpAddr, [u8; 6]>, Vec<(IpAddr, Option<IpAddr>)>)> {
        let ifindex = match self.ifindex {
            Some(index) => index,
            None => *self.ifindex.insert(super::ifindex(&self.dev)?),
        };
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

    fn replace(&mut self, found: NextHopTable) -> bool {
        if found == *self.current {
            return false;
        }
        self.current = Arc::new(found);
        self.generation += 1;
        true
    }
}

/// Where a [`NextHopRefresher`] publishes its tables for the engines.
#[derive(Debug, Default)]
struct Published {
    generation: AtomicU64,
    current: Mutex<Arc<NextHopTable>>,
}

/// Addresses the engines may ask for between two polls of the refresher
/// (more: the ask is repeated later).
const ASK_QUEUE: usize = 1024;
/// An address still missing is asked for again after this long (the
/// refresher's budget bounds the reads it makes for them).
const ASK_AGAIN: Duration = Duration::from_millis(20);

/// Reads the kernel's routes and neighbours for several engines (one per
/// receive queue of an interface) and publishes what it read to them: the
/// netlink reads happen once, in the thread that polls it, never in an
/// engine. Poll it every few milliseconds ([`NextHopRefresher::poll`]):
/// until its first read every copy goes through the kernel.
pub struct NextHopRefresher {
    neigh: Neighbours,
    published: Arc<Published>,
    asks: Receiver<IpAddr>,
    ask_tx: SyncSender<IpAddr>,
}

impl std::fmt::Debug for NextHopRefresher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NextHopRefresher")
            .field("neigh", &self.neigh)
            .finish()
    }
}

impl NextHopRefresher {
    /// A refresher for interface `dev` (read in the namespace of the
    /// thread that polls it).
    pub(crate) fn new(dev: &str) -> NextHopRefresher {
        let (ask_tx, asks) = sync_channel(ASK_QUEUE);
        NextHopRefresher {
            neigh: Neighbours::new(dev),
            published: Arc::default(),
            asks,
            ask_tx,
        }
    }

    /// A view for one more engine.
    pub(crate) fn view(&self) -> NextHopView {
        NextHopView {
            published: self.published.clone(),
            current: self
                .published
                .current
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .clone(),
            generation: self.published.generation.load(Ordering::Acquire),
            ask: self.ask_tx.clone(),
            asked: HashSet::new(),
            asked_at: Instant::now(),
        }
    }

    /// `ip` will be sent to (a client that registered): look up its next
    /// hop at the next read.
    pub fn note(&mut self, ip: IpAddr) {
        self.neigh.note(ip);
    }

    /// Take the engines' asks, read the kernel's tables when due (every
    /// second in full, at once within a budget for missing addresses) and
    /// publish what changed. Returns true when a read was made.
    pub fn poll(&mut self) -> bool {
        self.take_asks();
        if !self.neigh.due() {
            return false;
        }
        if self.neigh.refresh() {
            self.publish();
        }
        true
    }

    /// Note what the engines asked for.
    fn take_asks(&mut self) {
        for ip in self.asks.try_iter().take(ASK_QUEUE) {
            self.neigh.note(ip);
        }
    }

    /// Hand the current table to the engines.
    fn publish(&self) {
        *self
            .published
            .current
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = self.neigh.current.clone();
        self.published
            .generation
            .store(self.neigh.generation, Ordering::Release);
    }

    /// Reads of the kernel's tables so far.
    pub fn reads(&self) -> u64 {
        self.neigh.reads
    }

    /// Tables published so far (each a change of a next hop or a MAC).
    pub fn generation(&self) -> u64 {
        self.neigh.generation
    }
}

/// One engine's view of a [`NextHopRefresher`]'s tables.
#[derive(Debug)]
pub(crate) struct NextHopView {
    published: Arc<Published>,
    current: Arc<NextHopTable>,
    generation: u64,
    ask: SyncSender<IpAddr>,
    /// Addresses asked for since the last table picked up, or since
    /// `asked_at` (asked once each per [`ASK_AGAIN`]; at most
    /// [`Neighbours::MAX_DESTINATIONS`]).
    asked: HashSet<IpAddr>,
    asked_at: Instant,
}

impl NextHopView {
    /// Pick up a newer table, if one was published (one atomic load; the
    /// lock only then).
    fn refresh(&mut self) {
        let generation = self.published.generation.load(Ordering::Acquire);
        if generation != self.generation {
            self.current = self
                .published
                .current
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .clone();
            self.generation = generation;
            self.asked.clear();
            self.asked_at = Instant::now();
        }
    }

    /// Ask the refresher for `ip` if it is missing (once per table or per
    /// [`ASK_AGAIN`]; never blocks: a full queue drops the ask, to be made
    /// again later).
    fn note(&mut self, ip: IpAddr) {
        if self.current.missing(ip) {
            self.ask(ip, Instant::now());
        }
    }

    /// Ask for the missing `ip` at `now`.
    fn ask(&mut self, ip: IpAddr, now: Instant) {
        if now.saturating_duration_since(self.asked_at) >= ASK_AGAIN {
            self.asked.clear();
            self.asked_at = now;
        }
        if self.asked.len() >= Neighbours::MAX_DESTINATIONS || !self.asked.insert(ip) {
            return;
        }
        if self.ask.try_send(ip).is_err() {
            self.asked.remove(&ip);
        }
    }
}

/// Where a backend's next hops come from.
#[derive(Debug)]
pub(crate) enum NextHops {
    /// Read by this backend itself, on its receive path (one engine).
    Own(Neighbours),
    /// Read by a [`NextHopRefresher`] in another thread (one engine per
    /// receive queue).
    Shared(NextHopView),
}

impl NextHops {
    /// MAC of the next hop towards `ip`, if known now.
    pub(crate) fn get(&self, ip: IpAddr) -> Option<[u8; 6]> {
        match self {
            NextHops::Own(neigh) => neigh.get(ip),
            NextHops::Shared(view) => view.current.get(ip),
        }
    }

    /// `ip` was looked for: ask for it if it is missing.
    pub(crate) fn note(&mut self, ip: IpAddr) {
        match self {
            NextHops::Own(neigh) => neigh.note(ip),
            NextHops::Shared(view) => view.note(ip),
        }
    }

    /// Changes with every new table (cached headers are rebuilt).
    pub(crate) fn generation(&self) -> u64 {
        match self {
            NextHops::Own(neigh) => neigh.generation,
            NextHops::Shared(view) => view.generation,
        }
    }

    /// Off the send path: read the kernel's tables when due (own), or
    /// pick up the refresher's newer table (shared).
    pub(crate) fn refresh(&mut self) {
        match self {
            NextHops::Own(neigh) => {
                if neigh.due() {
                    neigh.refresh();
                }
            }
            NextHops::Shared(view) => view.refresh(),
        }
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
        let tables = |table: &HashMap<_, _>, hops: &HashMap<_, _>| NextHopTable {
            table: table.clone(),
            hops: hops.clone(),
        };
        assert!(n.replace(tables(&table, &hops)));
        assert_eq!(n.get(ip("10.77.3.2")), Some(router));
        assert_eq!(n.get(ip("10.77.1.9")), Some([2, 0, 0, 0, 0, 9]));
        assert_eq!(n.get(ip("10.88.0.1")), None, "not through us");
        assert_eq!(n.get(ip("10.77.4.4")), None, "never looked up");
        assert_eq!(n.get(ip("255.255.255.255")), Some([0xff; 6]));
        let g = n.generation;
        assert!(!n.replace(tables(&table, &hops)), "same tables");
        // The kernel forgot the router's MAC: so do we.
        assert!(n.replace(tables(&HashMap::new(), &hops)));
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

    /// With several engines one refresher reads and publishes: an engine
    /// asks once for a missing address, sees nothing new until it picks up
    /// the next table, then the new next hop's MAC (and a changed MAC,
    /// with a new generation for its cached headers).
    #[test]
    fn engines_take_the_refreshers_tables_and_ask_for_what_is_missing() {
        let mut refresher = NextHopRefresher::new("eth0");
        let mut engine = NextHops::Shared(refresher.view());
        let (client, router) = (ip("10.77.3.2"), ip("10.77.1.2"));
        // A missing address is asked for once, and again while it is still
        // missing a while later.
        let mut view = refresher.view();
        let t0 = view.asked_at;
        view.ask(client, t0);
        view.ask(client, t0 + ASK_AGAIN / 2);
        assert_eq!(refresher.asks.try_iter().count(), 1, "asked once");
        view.ask(client, t0 + ASK_AGAIN);
        assert_eq!(refresher.asks.try_iter().count(), 1, "asked again");
        engine.note(client);
        assert_eq!(refresher.asks.try_iter().count(), 1, "missing: asked");
        engine.note(ip("10.77.3.3"));
        refresher.take_asks();
        assert!(refresher.neigh.pending.contains(&ip("10.77.3.3")));
        assert!(refresher.neigh.wanted);
        let read = |mac: [u8; 6]| NextHopTable {
            table: [(router, mac)].into(),
            hops: [(client, Some(router))].into(),
        };
        let old_mac = [2, 0, 0, 0, 0, 1];
        assert!(refresher.neigh.replace(read(old_mac)));
        refresher.publish();
        assert_eq!(engine.get(client), None, "not picked up yet");
        let before = engine.generation();
        engine.refresh();
        assert_eq!(engine.get(client), Some(old_mac));
        assert_ne!(engine.generation(), before);
        // Resolved: no more asks for it.
        engine.note(client);
        assert_eq!(refresher.asks.try_iter().count(), 0);
        // The router's MAC changed in the kernel: the next table has it.
        let new_mac = [2, 0, 0, 0, 0x23, 0x0e];
        assert!(refresher.neigh.replace(read(new_mac)));
        refresher.publish();
        let before = engine.generation();
        engine.refresh();
        assert_eq!(engine.get(client), Some(new_mac));
        assert_ne!(engine.generation(), before);
        // Asks never block: a full queue drops them (asked again later).
        let mut view = refresher.view();
        let t0 = view.asked_at;
        for k in 0..(ASK_QUEUE as u32 + 10) {
            view.ask(IpAddr::V4((0x0a00_0000 + k).into()), t0);
        }
        assert_eq!(view.asked.len(), ASK_QUEUE);
        assert_eq!(refresher.asks.try_iter().count(), ASK_QUEUE);
    }
}
