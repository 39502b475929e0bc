//! The transaction model: one [`Transaction`] pairs the server side
//! (towards the upstream client) with the client side (towards the
//! downstream server); its RFC 3261 timers are a [`TimerTable`] and every
//! state change is a named transition below. Transactions live in
//! hash-sharded [`Shard`] tables, each with a heap of pending deadlines.

use super::flow_retry::FlowRetry;
use super::timer_table::{TimerTable, TransactionTimer, T1, T2, T4, TIMER_64T1, TIMER_C};
use crate::msg::Method;
use crate::transport::{Hop, Transport};
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

/// Timer-G retransmissions of a final response towards the upstream (RFC
/// 3261 17.2.1 goes on until timer H, about ten): two keep a lost response
/// at loss `p` to `p^3` while bounding what a spoofed INVITE draws towards
/// its claimed source to three copies of the downstream's answer.
pub(super) const MAX_UPSTREAM_RETRANSMISSIONS: u32 = 2;

/// Number of transaction table shards (each behind its own mutex).
pub(super) const SHARDS: usize = 64;

/// Transaction class: INVITE (and its ACK), CANCEL, everything else.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(super) enum Class {
    Invite,
    NonInvite,
    Cancel,
}

impl Class {
    /// The class a request of `method` belongs to (an ACK to INVITE's).
    pub(super) fn of(method: Method<'_>) -> Class {
        match method {
            Method::Invite | Method::Ack => Class::Invite,
            Method::Cancel => Class::Cancel,
            _ => Class::NonInvite,
        }
    }
}

/// State of the client side (the request we sent downstream).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum ClientState {
    /// Nothing sent downstream (answered locally).
    None,
    /// Waiting for any response.
    Calling,
    /// Provisional received.
    Proceeding,
    /// Final received (or timed out).
    Done,
}

/// State of the server side (the request we received from upstream).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum ServerState {
    /// No final response sent upstream yet.
    Proceeding,
    /// Final non-2xx sent (INVITE: waiting for ACK, timer G/H).
    Completed,
    /// 2xx forwarded (INVITE).
    Accepted,
    /// ACK received (INVITE), timer I.
    Confirmed,
}

/// Which way the retransmit timer resends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Direction {
    /// The request, to the downstream server (timers A/E).
    Downstream,
    /// The last response, to the upstream client (timer G).
    Upstream,
}

/// One proxied transaction (RFC 3261 17, as a proxy uses it in 16).
pub(super) struct Transaction {
    pub(super) class: Class,
    pub(super) upstream: Option<Hop>,
    pub(super) downstream: Option<Hop>,
    /// Request as forwarded downstream (for retransmission, CANCEL, ACK).
    pub(super) request: Vec<u8>,
    /// Last response sent upstream (for retransmission).
    pub(super) last_response: Vec<u8>,
    pub(super) client: ClientState,
    pub(super) server: ServerState,
    /// Deadlines of this transaction's timers.
    pub(super) timers: TimerTable,
    /// Where [`TransactionTimer::Retransmit`] resends (while it is set).
    retransmit_direction: Direction,
    /// Current retransmit interval (doubles up to its cap).
    retransmit_interval: u64,
    /// A CANCEL arrived before any provisional: send ours on the first one.
    pub(super) cancel_pending: bool,
    /// Cancelled by the client: a timeout answers 487, not 408.
    pub(super) cancelled: bool,
    /// An INVITE outside a dialog (no To tag): its 2xx sets one up.
    pub(super) initial_invite: bool,
    /// An INVITE's RFC 2543 matching key, while it is in the CANCEL index.
    pub(super) cancel_match: Option<u64>,
    /// Bumped on every reschedule; heap entries of older generations are stale.
    pub(super) generation: u32,
    /// The next RFC 3263 targets, when the next hop was a name with more
    /// than one (`None` on the IP-literal path: nothing allocated).
    pub(super) failover: Option<Box<Failover>>,
    /// Bytes this transaction is counted for in its shard's table
    /// ([`Transaction::footprint`] when last (re)scheduled).
    charged: usize,
    /// The UDP destination its shard's [`Shard::waiting_at`] index lists
    /// it under (the index is swept lazily: an entry is checked against
    /// [`Transaction::waits_at`] when used).
    indexed_at: Option<SocketAddr>,
}

impl Transaction {
    /// A transaction with no timers running, nothing sent, no final response.
    pub(super) fn new(class: Class, upstream: Option<Hop>) -> Transaction {
        Transaction {
            class,
            upstream,
            downstream: None,
            request: Vec::new(),
            last_response: Vec::new(),
            client: ClientState::None,
            server: ServerState::Proceeding,
            timers: TimerTable::default(),
            retransmit_direction: Direction::Downstream,
            retransmit_interval: T1,
            cancel_pending: false,
            cancelled: false,
            initial_invite: false,
            cancel_match: None,
            generation: 0,
            failover: None,
            charged: 0,
            indexed_at: None,
        }
    }

    /// The UDP destination whose answer the client side waits for with
    /// nothing heard yet (Calling): an ICMP unreachable for it is a
    /// transport error of this transaction (RFC 3261 18.4, 8.1.3.1). Not
    /// a CANCEL (it never fails over), not a connection transport (the
    /// connection reports its own errors).
    pub(super) fn waits_at(&self) -> Option<SocketAddr> {
        if self.class == Class::Cancel || self.client != ClientState::Calling {
            return None;
        }
        self.downstream
            .filter(|hop| hop.transport == Transport::Udp)
            .map(|hop| hop.addr)
    }

    /// Whether the client side may move on to the next target now: nothing
    /// but silence or a `503` came back (no provisional), nothing went
    /// upstream yet, not cancelled, and a target is left.
    pub(super) fn can_fail_over(&self) -> bool {
        self.class != Class::Cancel
            && self.server == ServerState::Proceeding
            && !self.cancelled
            && !self.cancel_pending
            && self
                .failover
                .as_ref()
                .is_some_and(|f| !f.alternates.is_empty())
    }

    /// Move the client side to the next target: the request gets a new
    /// branch (ours with `.<try>`, RFC 3261 16.6 step 8: a new client
    /// transaction) and goes there, timers A/E and B/F from the start.
    /// Returns where it goes now (`None`: no target left).
    pub(super) fn fail_over(&mut self, now: u64) -> Option<Hop> {
        let failover = self.failover.as_mut()?;
        if failover.alternates.is_empty() {
            return None;
        }
        let tries = failover.tries.checked_add(1)?;
        if !super::branch::set_try(&mut self.request, tries) {
            return None;
        }
        failover.tries = tries;
        let to = failover.alternates.remove(0);
        self.start_client(now, to);
        Some(to)
    }

    /// Which try a response with our branch's try `tries` answers: the
    /// current one, or an earlier target's (stale).
    pub(super) fn is_current_try(&self, tries: u8) -> bool {
        self.failover.as_ref().map_or(0, |f| f.tries) == tries
    }

    /// Memory this transaction holds: the entry itself and its two
    /// buffers (their capacity, not their length).
    pub(super) fn footprint(&self) -> usize {
        ENTRY_BYTES
            + self.request.capacity()
            + self.last_response.capacity()
            + self.failover.as_ref().map_or(0, |f| {
                std::mem::size_of::<Failover>()
                    + f.alternates.capacity() * std::mem::size_of::<Hop>()
                    + f.flows.as_ref().map_or(0, FlowRetry::bytes)
            })
    }

    /// The CANCEL transaction for an INVITE: its server side is answered
    /// (200) at once, so it starts completed and lives 64*T1.
    pub(super) fn new_cancel(now: u64, upstream: Option<Hop>) -> Transaction {
        let mut cancel = Transaction::new(Class::Cancel, upstream);
        cancel.complete(now, 200);
        cancel
    }

    /// Earliest pending deadline, if any.
    pub(super) fn next_deadline(&self) -> Option<u64> {
        self.timers.next_deadline()
    }

    /// Start resending towards `direction` every T1, doubling (timers A/E/G).
    pub(super) fn arm_retransmit(&mut self, now: u64, direction: Direction) {
        self.retransmit_direction = direction;
        self.retransmit_interval = T1;
        self.timers.set(TransactionTimer::Retransmit, now + T1);
    }

    /// Where a due retransmission goes and what it resends.
    pub(super) fn retransmission(&self) -> (Option<Hop>, &[u8]) {
        match self.retransmit_direction {
            Direction::Downstream => (self.downstream, &self.request),
            Direction::Upstream => (self.upstream, &self.last_response),
        }
    }

    /// After a retransmission: double the interval (capped at T2, except
    /// timer A of an INVITE, which is not capped) and rearm. Towards the
    /// upstream (timer G) only [`MAX_UPSTREAM_RETRANSMISSIONS`] go: the
    /// upstream address is whatever the request claimed (docs/security.md).
    pub(super) fn back_off_retransmit(&mut self, now: u64) {
        if self.retransmit_direction == Direction::Upstream
            && self.retransmit_interval >= T1 << (MAX_UPSTREAM_RETRANSMISSIONS - 1)
        {
            self.timers.stop(TransactionTimer::Retransmit);
            return;
        }
        let cap =
            if self.class == Class::Invite && self.retransmit_direction == Direction::Downstream {
                u64::MAX
            } else {
                T2
            };
        self.retransmit_interval = (self.retransmit_interval * 2).min(cap);
        self.timers
            .set(TransactionTimer::Retransmit, now + self.retransmit_interval);
    }

    /// The request went downstream to `to`: client side Calling, timer A/E
    /// retransmits it, timer B/F gives up after 64*T1.
    pub(super) fn start_client(&mut self, now: u64, to: Hop) {
        self.downstream = Some(to);
        self.client = ClientState::Calling;
        self.arm_retransmit(now, Direction::Downstream);
        self.timers.set(TransactionTimer::Timeout, now + TIMER_64T1);
    }

    /// A provisional response with status `code` arrived. From Calling:
    /// Proceeding; an INVITE stops retransmitting and runs timer C instead
    /// of B, a non-INVITE retransmits every T2. A later provisional other
    /// than 100 resets an INVITE's timer C (RFC 3261 16.7 step 2). Returns
    /// whether a CANCEL that waited for this provisional is now due.
    pub(super) fn client_provisional(&mut self, now: u64, code: u16) -> bool {
        if self.client != ClientState::Calling {
            if self.client == ClientState::Proceeding && self.class == Class::Invite && code != 100
            {
                self.timers.set(TransactionTimer::Timeout, now + TIMER_C);
            }
            return false;
        }
        self.client = ClientState::Proceeding;
        if self.class == Class::Invite {
            self.timers.stop(TransactionTimer::Retransmit);
            self.timers.set(TransactionTimer::Timeout, now + TIMER_C);
            std::mem::take(&mut self.cancel_pending)
        } else {
            self.retransmit_interval = T2;
            false
        }
    }

    /// A final response arrived: the client side is done, its
    /// retransmissions and timeout stop, no CANCEL is due any more.
    pub(super) fn client_final(&mut self) {
        self.client = ClientState::Done;
        self.timers.stop(TransactionTimer::Retransmit);
        self.timers.stop(TransactionTimer::Timeout);
        self.cancel_pending = false;
    }

    /// A final response to the CANCEL we sent: done; it lingers T4 unless
    /// it already has an end.
    pub(super) fn cancel_answered(&mut self, now: u64) {
        if self.client == ClientState::Done {
            return;
        }
        self.client = ClientState::Done;
        self.timers.stop(TransactionTimer::Retransmit);
        self.timers.stop(TransactionTimer::Timeout);
        if self.timers.get(TransactionTimer::Expire).is_none() {
            self.timers.set(TransactionTimer::Expire, now + T4);
        }
    }

    /// The final response `code` went upstream: Completed; a non-2xx to an
    /// INVITE is retransmitted (timer G) until the ACK; gone after 64*T1
    /// (timers H/J).
    pub(super) fn complete(&mut self, now: u64, code: u16) {
        self.server = ServerState::Completed;
        if self.class == Class::Invite && code >= 300 {
            self.arm_retransmit(now, Direction::Upstream);
        }
        self.timers.set(TransactionTimer::Expire, now + TIMER_64T1);
    }

    /// A 2xx to an INVITE went upstream: Accepted (its retransmissions are
    /// forwarded end to end) for 64*T1.
    pub(super) fn accept(&mut self, now: u64) {
        self.server = ServerState::Accepted;
        self.timers.set(TransactionTimer::Expire, now + TIMER_64T1);
    }

    /// The ACK for our non-2xx arrived: Confirmed, retransmissions stop,
    /// gone after T4 (timer I).
    pub(super) fn confirm(&mut self, now: u64) {
        self.server = ServerState::Confirmed;
        self.timers.stop(TransactionTimer::Retransmit);
        self.timers.stop(TransactionTimer::Timeout);
        self.timers.set(TransactionTimer::Expire, now + T4);
    }

    /// Timer B/F/C fired: the client side gives up and stops
    /// retransmitting. Returns whether an INVITE had a provisional (so a
    /// CANCEL is due downstream).
    pub(super) fn time_out(&mut self) -> bool {
        self.timers.stop(TransactionTimer::Timeout);
        self.timers.stop(TransactionTimer::Retransmit);
        let cancel_due = self.class == Class::Invite && self.client == ClientState::Proceeding;
        self.client = ClientState::Done;
        cancel_due
    }

    /// After a timeout we answered upstream with `code` (408/487):
    /// Completed; an INVITE retransmits it until H, a non-INVITE only
    /// lingers T4.
    pub(super) fn complete_timed_out(&mut self, now: u64, code: u16) {
        self.complete(now, code);
        if self.class != Class::Invite {
            self.timers.set(TransactionTimer::Expire, now + T4);
        }
    }

    /// After a timeout with nothing to answer: end now unless an end is
    /// already set (a CANCEL always ends now).
    pub(super) fn end_after_timeout(&mut self, now: u64) {
        if self.timers.get(TransactionTimer::Expire).is_none() || self.class == Class::Cancel {
            self.timers.set(TransactionTimer::Expire, now);
        }
    }
}

/// The targets left for a transaction's failover, and how many it moved on.
pub(super) struct Failover {
    /// Targets not tried yet, in RFC 3263 order.
    pub(super) alternates: Vec<Hop>,
    /// Targets moved on from (the branch carries it as `.<tries>`).
    pub(super) tries: u8,
    /// The AOR's other bindings, when the request went to a binding
    /// through a Path (a `430 Flow Failed` moves it on, RFC 5626 7).
    pub(super) flows: Option<FlowRetry>,
}

/// Table key: the request's transaction hash and its class.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) struct TransactionKey {
    pub(super) hash: u64,
    pub(super) class: Class,
}

impl TransactionKey {
    pub(super) fn new(hash: u64, class: Class) -> TransactionKey {
        TransactionKey { hash, class }
    }
}

/// A pending deadline in a shard's heap; stale once the transaction's
/// generation moved on (or it is gone).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct ScheduledTimer {
    pub(super) deadline: u64,
    pub(super) hash: u64,
    pub(super) class: Class,
    pub(super) generation: u32,
}

impl ScheduledTimer {
    pub(super) fn key(&self) -> TransactionKey {
        TransactionKey::new(self.hash, self.class)
    }
}

/// Bytes of a table entry besides its buffers: the transaction (boxed) and
/// its pointer, its key, the hash table's control byte and slack, and its
/// heap entries.
const ENTRY_BYTES: usize = std::mem::size_of::<Transaction>()
    + std::mem::size_of::<Box<Transaction>>()
    + std::mem::size_of::<TransactionKey>()
    + 2 * std::mem::size_of::<ScheduledTimer>()
    + WAITING_ENTRIES_PER_TRANSACTION * std::mem::size_of::<TransactionKey>()
    + 16;

/// Entries of the [`Shard::waiting_at`] index kept per live transaction at
/// most (beyond, the stale ones are swept), as for the timer heap.
const WAITING_ENTRIES_PER_TRANSACTION: usize = 2;

/// Heap entries kept per live transaction at most (beyond, the stale ones
/// are swept): stale entries of rescheduled transactions stay bounded.
const HEAP_ENTRIES_PER_TRANSACTION: usize = 2;

/// One of the [`SHARDS`] transaction tables. Its transactions' bytes
/// ([`Transaction::footprint`]) are counted in `bytes`, shared by every
/// shard (the table's byte bound, review S9): insert and remove through
/// [`Shard::insert`] and [`Shard::remove`], and [`Shard::schedule`] after
/// every change (it recounts a transaction whose buffers grew).
pub(super) struct Shard {
    /// Boxed: the table's own entries stay small (24 bytes), so growing it
    /// moves little. With the transactions inline (312 bytes an entry)
    /// the 64 shards, filled evenly, grow together: 64 doublings at 7 168
    /// transactions a shard took ~190 ms, at 14 336 ~225 ms (boxed: 13 and
    /// 25 ms; a stand-alone timing on this VM) — at ~18 000 calls/s, 12 s
    /// and 25 s into an overload from a fresh proxy, a stall that pushed
    /// the queue past the drop bound (docs/sip-proxy.md, "Transactions
    /// boxed").
    pub(super) transactions: HashMap<TransactionKey, Box<Transaction>>,
    pub(super) timers: BinaryHeap<Reverse<ScheduledTimer>>,
    /// Transactions by the UDP destination they wait at
    /// ([`Transaction::waits_at`]), so that an ICMP unreachable for one
    /// destination finds its transactions without a scan of the table.
    /// Entries go stale when a transaction moves on (a response, another
    /// target, its end); [`Shard::take_waiting_at`] checks each, and
    /// [`Shard::schedule`] sweeps them when they outnumber the live
    /// transactions (amortised O(1), as the timer heap).
    waiting_at: HashMap<SocketAddr, Vec<TransactionKey>>,
    /// Entries in `waiting_at`, over every destination.
    waiting_entries: usize,
    bytes: Arc<AtomicUsize>,
}

impl Shard {
    /// An empty shard counting its bytes into `bytes`.
    pub(super) fn new(bytes: Arc<AtomicUsize>) -> Shard {
        Shard {
            transactions: HashMap::new(),
            timers: BinaryHeap::new(),
            waiting_at: HashMap::new(),
            waiting_entries: 0,
            bytes,
        }
    }

    /// Add `transaction` (counting its bytes); returns the one it replaced
    /// (no longer counted).
    pub(super) fn insert(
        &mut self,
        key: TransactionKey,
        mut transaction: Transaction,
    ) -> Option<Transaction> {
        transaction.charged = transaction.footprint();
        self.bytes.fetch_add(transaction.charged, Ordering::Relaxed);
        let replaced = self.transactions.insert(key, Box::new(transaction))?;
        self.bytes.fetch_sub(replaced.charged, Ordering::Relaxed);
        Some(*replaced)
    }

    /// Take a transaction out (no longer counted).
    pub(super) fn remove(&mut self, key: &TransactionKey) -> Option<Transaction> {
        let removed = self.transactions.remove(key)?;
        self.bytes.fetch_sub(removed.charged, Ordering::Relaxed);
        Some(*removed)
    }

    /// Queue the transaction's next deadline (after any timer change);
    /// older queued entries for it become stale. Recounts its bytes, and
    /// sweeps stale heap entries when they outnumber the live ones.
    pub(super) fn schedule(&mut self, key: TransactionKey) {
        if let Some(transaction) = self.transactions.get_mut(&key) {
            let size = transaction.footprint();
            if size != transaction.charged {
                self.bytes.fetch_add(size, Ordering::Relaxed);
                self.bytes.fetch_sub(transaction.charged, Ordering::Relaxed);
                transaction.charged = size;
            }
            transaction.generation = transaction.generation.wrapping_add(1);
            if let Some(deadline) = transaction.next_deadline() {
                self.timers.push(Reverse(ScheduledTimer {
                    deadline,
                    hash: key.hash,
                    class: key.class,
                    generation: transaction.generation,
                }));
            }
            if let Some(at) = transaction.waits_at() {
                if transaction.indexed_at != Some(at) {
                    transaction.indexed_at = Some(at);
                    self.waiting_at.entry(at).or_default().push(key);
                    self.waiting_entries += 1;
                }
            }
        }
        if self.waiting_entries > WAITING_ENTRIES_PER_TRANSACTION * self.transactions.len() + 64 {
            self.sweep_waiting();
        }
        if self.timers.len() > HEAP_ENTRIES_PER_TRANSACTION * self.transactions.len() + 64 {
            // Every reschedule leaves a stale entry until its deadline
            // (up to timer C, 180 s): sweep them now (amortised O(1)).
            let transactions = &self.transactions;
            self.timers.retain(|Reverse(entry)| {
                transactions
                    .get(&entry.key())
                    .is_some_and(|t| t.generation == entry.generation)
            });
        }
    }

    /// Keep only the [`Shard::waiting_at`] entries of transactions that
    /// still wait at their destination.
    fn sweep_waiting(&mut self) {
        let transactions = &mut self.transactions;
        let mut kept = 0;
        self.waiting_at.retain(|at, keys| {
            // A transaction's first entry here keeps it if it still waits
            // here; its later ones (it left and came back) go, as do the
            // entries of those that moved on.
            keys.retain(|key| match transactions.get_mut(key) {
                Some(t) if t.indexed_at == Some(*at) => {
                    t.indexed_at = None;
                    t.waits_at() == Some(*at)
                }
                _ => false,
            });
            for key in keys.iter() {
                if let Some(t) = transactions.get_mut(key) {
                    t.indexed_at = Some(*at);
                }
            }
            kept += keys.len();
            !keys.is_empty()
        });
        self.waiting_entries = kept;
    }

    /// Take the transactions waiting at the UDP destination `at` out of
    /// the index: the keys of those that still wait there (each once).
    /// The caller moves each on (another target, or an end) and
    /// [`Shard::schedule`]s it, which indexes it again where it waits now.
    pub(super) fn take_waiting_at(&mut self, at: SocketAddr) -> Vec<TransactionKey> {
        let Some(mut keys) = self.waiting_at.remove(&at) else {
            return Vec::new();
        };
        self.waiting_entries = self.waiting_entries.saturating_sub(keys.len());
        keys.retain(|key| match self.transactions.get_mut(key) {
            Some(t) if t.indexed_at == Some(at) => {
                t.indexed_at = None;
                t.waits_at() == Some(at)
            }
            _ => false,
        });
        keys
    }

    /// Entries of the [`Shard::waiting_at`] index (stale ones included).
    #[cfg(test)]
    pub(super) fn waiting_entries(&self) -> usize {
        self.waiting_entries
    }

    /// Whether `entry` still describes its transaction's current schedule.
    pub(super) fn is_live(&self, entry: &ScheduledTimer) -> bool {
        self.transactions
            .get(&entry.key())
            .is_some_and(|t| t.generation == entry.generation)
    }
}

/// Lock a shard, ignoring poisoning (a panic elsewhere leaves the table usable).
pub(super) fn lock(shard: &Mutex<Shard>) -> MutexGuard<'_, Shard> {
    shard.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a shard's table moves when it grows is its entries: a key and
    /// a pointer, not a transaction (see [`Shard::transactions`]).
    #[test]
    fn the_table_entries_stay_small() {
        let entry = std::mem::size_of::<(TransactionKey, Box<Transaction>)>();
        assert!(entry <= 32, "{entry} bytes an entry");
        assert!(std::mem::size_of::<Transaction>() > 8 * entry);
        let shard = Shard::new(Arc::new(AtomicUsize::new(0)));
        let _: &HashMap<TransactionKey, Box<Transaction>> = &shard.transactions;
    }

    fn addr(s: &str) -> Hop {
        Hop::udp(s.parse().unwrap())
    }

    #[test]
    fn start_client_arms_retransmit_and_timeout_with_backoff() {
        let down = addr("192.0.2.2:5060");
        let mut invite = Transaction::new(Class::Invite, Some(addr("192.0.2.1:5060")));
        invite.request = b"INVITE".to_vec();
        assert_eq!(invite.next_deadline(), None);

        invite.start_client(100, down);
        assert_eq!(invite.client, ClientState::Calling);
        assert_eq!(
            invite.timers.get(TransactionTimer::Retransmit),
            Some(100 + T1)
        );
        assert_eq!(
            invite.timers.get(TransactionTimer::Timeout),
            Some(100 + TIMER_64T1)
        );
        assert_eq!(invite.timers.get(TransactionTimer::Expire), None);
        assert_eq!(invite.next_deadline(), Some(100 + T1));
        assert_eq!(invite.retransmission(), (Some(down), &b"INVITE"[..]));

        // Timer A doubles without a cap; a non-INVITE's timer E stops at T2.
        let mut now = 100 + T1;
        invite.back_off_retransmit(now);
        assert_eq!(
            invite.timers.get(TransactionTimer::Retransmit),
            Some(now + 2 * T1)
        );
        let mut options = Transaction::new(Class::NonInvite, None);
        options.start_client(0, down);
        for _ in 0..6 {
            now += T1;
            invite.back_off_retransmit(now);
            options.back_off_retransmit(now);
        }
        assert_eq!(
            invite.timers.get(TransactionTimer::Retransmit),
            Some(now + 128 * T1)
        );
        assert_eq!(
            options.timers.get(TransactionTimer::Retransmit),
            Some(now + T2)
        );
    }

    #[test]
    fn final_response_stops_client_timers_and_completion_arms_server_timers() {
        let upstream = addr("192.0.2.1:5060");
        let mut invite = Transaction::new(Class::Invite, Some(upstream));
        invite.start_client(0, addr("192.0.2.2:5060"));
        invite.cancel_pending = true;

        // A provisional: timer A stops, timer C replaces B, the waiting
        // CANCEL is due.
        assert!(invite.client_provisional(10, 180));
        assert_eq!(invite.timers.get(TransactionTimer::Retransmit), None);
        assert_eq!(
            invite.timers.get(TransactionTimer::Timeout),
            Some(10 + TIMER_C)
        );
        // A later provisional other than 100 resets timer C (RFC 3261 16.7
        // step 2); a 100 does not.
        assert!(!invite.client_provisional(20, 183));
        assert_eq!(
            invite.timers.get(TransactionTimer::Timeout),
            Some(20 + TIMER_C)
        );
        assert!(!invite.client_provisional(25, 100));
        assert_eq!(
            invite.timers.get(TransactionTimer::Timeout),
            Some(20 + TIMER_C)
        );

        invite.client_final();
        assert_eq!(invite.client, ClientState::Done);
        assert_eq!(invite.next_deadline(), None);

        // A non-2xx forwarded upstream: timer G resends it, H ends it.
        invite.last_response = b"SIP/2.0 486".to_vec();
        invite.complete(30, 486);
        assert_eq!(invite.server, ServerState::Completed);
        assert_eq!(
            invite.timers.get(TransactionTimer::Retransmit),
            Some(30 + T1)
        );
        assert_eq!(
            invite.timers.get(TransactionTimer::Expire),
            Some(30 + TIMER_64T1)
        );
        assert_eq!(
            invite.retransmission(),
            (Some(upstream), &b"SIP/2.0 486"[..])
        );

        // The ACK: retransmissions stop, timer I ends it after T4.
        invite.confirm(40);
        assert_eq!(invite.server, ServerState::Confirmed);
        assert_eq!(invite.timers.get(TransactionTimer::Retransmit), None);
        assert_eq!(invite.next_deadline(), Some(40 + T4));
    }

    #[test]
    fn timeout_transitions() {
        let mut invite = Transaction::new(Class::Invite, None);
        invite.start_client(0, addr("192.0.2.2:5060"));
        invite.client_provisional(1, 180);
        // Timer C after a provisional: a CANCEL is due, the 408 upstream
        // is then retransmitted.
        assert!(invite.time_out());
        assert_eq!(invite.next_deadline(), None);
        invite.complete_timed_out(2, 408);
        assert_eq!(
            invite.timers.get(TransactionTimer::Retransmit),
            Some(2 + T1)
        );
        assert_eq!(
            invite.timers.get(TransactionTimer::Expire),
            Some(2 + TIMER_64T1)
        );

        // A non-INVITE only lingers T4 after its 408.
        let mut options = Transaction::new(Class::NonInvite, None);
        options.start_client(0, addr("192.0.2.2:5060"));
        assert!(!options.time_out());
        options.complete_timed_out(3, 408);
        assert_eq!(options.timers.get(TransactionTimer::Retransmit), None);
        assert_eq!(options.next_deadline(), Some(3 + T4));

        // Our CANCEL timing out ends at once, even with an end set.
        let mut cancel = Transaction::new_cancel(0, None);
        assert_eq!(cancel.next_deadline(), Some(TIMER_64T1));
        cancel.start_client(0, addr("192.0.2.2:5060"));
        cancel.time_out();
        cancel.end_after_timeout(7);
        assert_eq!(cancel.next_deadline(), Some(7));
    }

    /// The index by destination finds the transactions waiting at one
    /// (not one that heard a provisional, not a CANCEL, not another
    /// destination's), each once; and a transaction moving between
    /// destinations again and again leaves a bounded number of entries.
    #[test]
    fn the_waiting_index_finds_the_waiting_transactions_and_stays_bounded() {
        let mut shard = Shard::new(Arc::new(AtomicUsize::new(0)));
        let (a, b) = (addr("192.0.2.2:5060"), addr("192.0.2.3:5060"));
        for hash in 0..10 {
            let class = if hash == 9 {
                Class::Cancel
            } else {
                Class::Invite
            };
            let key = TransactionKey::new(hash, class);
            let mut transaction = Transaction::new(class, None);
            transaction.start_client(0, if hash % 3 == 0 { a } else { b });
            shard.insert(key, transaction);
            shard.schedule(key);
            shard.schedule(key);
        }
        let heard = TransactionKey::new(3, Class::Invite);
        shard
            .transactions
            .get_mut(&heard)
            .unwrap()
            .client_provisional(1, 100);
        shard.schedule(heard);
        let mut found: Vec<u64> = shard
            .take_waiting_at(a.addr)
            .iter()
            .map(|k| k.hash)
            .collect();
        found.sort_unstable();
        assert_eq!(found, vec![0, 6]);
        assert!(shard.take_waiting_at(a.addr).is_empty());
        let moving = TransactionKey::new(1, Class::Invite);
        for i in 0..10_000u64 {
            let transaction = shard.transactions.get_mut(&moving).unwrap();
            transaction.start_client(i, if i % 2 == 0 { a } else { b });
            shard.schedule(moving);
        }
        assert!(
            shard.waiting_entries() <= WAITING_ENTRIES_PER_TRANSACTION * 10 + 64 + 1,
            "{}",
            shard.waiting_entries()
        );
        // Swept, one entry per transaction waiting: the five others at B
        // and the one that moved (0 and 6 were taken out above).
        shard.sweep_waiting();
        assert_eq!(shard.waiting_entries(), 6);
        let at_b = shard.take_waiting_at(b.addr);
        assert_eq!(at_b.iter().filter(|k| **k == moving).count(), 1);
        assert_eq!(at_b.len(), 6);
    }
}
