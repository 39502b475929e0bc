//! Counters, striped per worker so workers do not share cache lines, and
//! the [`ProxyStats`] snapshot summed over the stripes.

use super::outcome::{DropReason, DROP_REASONS};
use super::Proxy;
use serde::Serialize;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

/// Counters snapshot.
#[derive(Clone, Debug, Default, Serialize)]
pub struct ProxyStats {
    /// Requests received (parsed).
    pub requests_received: u64,
    /// Responses received (parsed).
    pub responses_received: u64,
    /// Requests forwarded (including CANCEL/ACK we generated).
    pub requests_forwarded: u64,
    /// Responses forwarded upstream.
    pub responses_forwarded: u64,
    /// Transactions currently in the table.
    pub transactions_active: u64,
    /// Bytes the transaction table holds now (bounded by
    /// `max_transaction_bytes`).
    pub transaction_bytes: u64,
    /// Deadlines queued in the timer heaps (stale ones included; bounded
    /// by twice the transactions plus a constant).
    pub timer_entries: u64,
    /// Transactions created.
    pub transactions_created: u64,
    /// Transactions ended by timer B/F/C.
    pub transactions_timed_out: u64,
    /// Request/response retransmissions absorbed.
    pub retransmissions_absorbed: u64,
    /// Retransmissions we sent (timers A/E/G).
    pub retransmissions_sent: u64,
    /// Requests refused because the table was full (503 or drop).
    pub overload_sheds: u64,
    /// New INVITEs answered `503` + `Retry-After` before any state because
    /// the driver reported overload ([`ProxyWorker::set_shedding`]: its
    /// receive queue is too long), RFC 7339 style.
    ///
    /// [`ProxyWorker::set_shedding`]: crate::ProxyWorker::set_shedding
    pub overload_queue_sheds: u64,
    /// New requests answered `503` + `Retry-After` while draining
    /// ([`Proxy::set_draining`]).
    pub drain_refusals: u64,
    /// In-dialog requests forwarded statelessly because the table was full
    /// (calls already set up are completed, new ones are shed).
    pub overload_stateless: u64,
    /// CANCELs matched to their INVITE the RFC 2543 way (their branch
    /// matched no transaction).
    pub cancels_matched_2543: u64,
    /// Requests whose digest credentials were verified.
    pub auth_accepted: u64,
    /// Requests refused by authentication (400 bad credentials, 403 wrong
    /// password, unknown user, From not the user, not relaying; 500 store
    /// down).
    pub auth_refused: u64,
    /// Challenges with `stale=true` (nonce expired or forgotten).
    pub auth_stale: u64,
    /// Replayed credentials (a used (nonce, nc) on another request),
    /// answered with a new challenge.
    pub auth_replays: u64,
    /// Requests whose next hop the relay policy refused (403, 482 for our
    /// own address; an ACK or CANCEL dropped as `not_relayed`).
    pub relay_refused: u64,
    /// Times a source went over the flood limit (its requests are then
    /// dropped, counted under `drops.flood`).
    pub flood_blocks: u64,
    /// Requests not tracked by the flood limiter (their table set was full
    /// of blocked sources); they passed.
    pub flood_untracked: u64,
    /// Sources the flood limiter tracks now.
    pub flood_sources_tracked: u64,
    /// Requests handed to the driver to wait for a remote location store.
    pub store_deferred: u64,
    /// Requests answered as if the store were down because the driver's
    /// store queue was full (fail closed).
    pub store_queue_full: u64,
    /// REGISTERs answered `500` with `Retry-After` because the location
    /// store was unavailable (down, late, full queue, unreadable reply).
    pub store_unavailable_registers: u64,
    /// Requests answered `480` because the location store was unavailable
    /// for their lookup.
    pub store_unavailable_lookups: u64,
    /// Requests parked until their next hop's name was resolved (a name
    /// not in the cache).
    pub names_parked: u64,
    /// Requests answered `404` because their next hop's name has no address.
    pub names_failed: u64,
    /// Requests answered `503` (an ACK or CANCEL dropped) because their
    /// next hop's name could not be resolved: lookup failed or timed out,
    /// the resolver's pending set was full, or every address was refused.
    pub names_unavailable: u64,
    /// Times a stateful transaction moved on to the next RFC 3263 target
    /// (timeout, `503`, or a transport error on the one before).
    pub failovers: u64,
    /// Requests for a registered flow (a flow token, or a binding's
    /// connection) whose connection is gone: answered `430 Flow Failed`
    /// (RFC 5626 5.3; an ACK dropped).
    pub flows_failed: u64,
    /// `430 Flow Failed` answers from downstream to a request we sent to a
    /// binding through its Path (an edge proxy's flow is gone): the
    /// bindings of that Path were removed (RFC 5626 7).
    pub flow_failures_received: u64,
    /// Requests that moved on to another binding of their AOR after such a
    /// `430`.
    pub flow_retries: u64,
    /// Requests the driver could not deliver to their next hop (a
    /// connection refused or reset before it was up, a failed TLS
    /// handshake) while their transaction waited there: each moved on to
    /// the next target at once, or got `500` with none left.
    pub transport_errors: u64,
    /// ICMP unreachable errors the driver read for UDP destinations the
    /// proxy sent to ([`ProxyWorker::on_unreachable`]; stateless mode
    /// counts them and changes nothing). The transactions they moved on
    /// count in `transport_errors` and `failovers`.
    ///
    /// [`ProxyWorker::on_unreachable`]: crate::ProxyWorker::on_unreachable
    pub unreachable_reports: u64,
    /// Dialogs set up through this proxy and tracked: the first 2xx to an
    /// INVITE outside a dialog went upstream (stateful mode).
    pub dialogs_confirmed: u64,
    /// Tracked dialogs ended by a BYE forwarded through this proxy.
    pub dialogs_ended: u64,
    /// Dialogs tracked now ([`Proxy::dialogs_open`]).
    ///
    /// [`Proxy::dialogs_open`]: crate::Proxy::dialogs_open
    pub dialogs_open: u64,
    /// Responses we generated, by code.
    pub responses_generated: BTreeMap<u16, u64>,
    /// Drops by reason.
    pub drops: BTreeMap<&'static str, u64>,
    /// Registrar bindings (`None`: a shared store, not counted locally).
    pub bindings: Option<u64>,
    /// Bytes the registrar bindings take (`None`: a shared store).
    pub binding_bytes: Option<u64>,
}

/// Counted events, one slot each per stripe.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Counter {
    RequestsReceived,
    ResponsesReceived,
    RequestsForwarded,
    ResponsesForwarded,
    TransactionsCreated,
    TransactionsTimedOut,
    RetransmissionsAbsorbed,
    RetransmissionsSent,
    OverloadSheds,
    OverloadQueueSheds,
    DrainRefusals,
    OverloadStateless,
    CancelsMatched2543,
    AuthAccepted,
    AuthRefused,
    AuthStale,
    AuthReplays,
    RelayRefused,
    FloodBlocks,
    FloodUntracked,
    StoreDeferred,
    StoreQueueFull,
    StoreUnavailableRegisters,
    StoreUnavailableLookups,
    NamesParked,
    NamesFailed,
    NamesUnavailable,
    Failovers,
    FlowsFailed,
    FlowFailuresReceived,
    FlowRetries,
    TransportErrors,
    DialogsConfirmed,
    DialogsEnded,
    UnreachableReports,
}

impl Counter {
    /// Number of counters.
    pub(super) const COUNT: usize = Counter::UnreachableReports as usize + 1;
}

/// Number of counter stripes (workers beyond this share stripes).
const STRIPES: usize = 8;

/// Response codes counted: 100..=699.
const CODES: usize = 600;

/// One worker's counters, on cache lines of their own.
#[repr(align(128))]
pub(super) struct CounterStripe {
    events: [AtomicU64; Counter::COUNT],
    responses_generated: [AtomicU64; CODES],
    drops: [AtomicU64; DROP_REASONS.len()],
}

impl CounterStripe {
    fn new() -> Self {
        CounterStripe {
            events: std::array::from_fn(|_| AtomicU64::new(0)),
            responses_generated: std::array::from_fn(|_| AtomicU64::new(0)),
            drops: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }

    /// Count one `counter` event.
    #[inline]
    pub(super) fn add(&self, counter: Counter) {
        self.events[counter as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// Count a response we generated (codes outside 100..=699 are not counted).
    #[inline]
    pub(super) fn response_generated(&self, code: u16) {
        if (100..700).contains(&code) {
            self.responses_generated[usize::from(code - 100)].fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Count a dropped datagram.
    #[inline]
    pub(super) fn dropped(&self, reason: DropReason) {
        self.drops[reason.index()].fetch_add(1, Ordering::Relaxed);
    }
}

/// All stripes, and the round-robin assignment of stripes to workers.
pub(super) struct Counters {
    stripes: Box<[CounterStripe]>,
    next_stripe: AtomicUsize,
}

impl Counters {
    pub(super) fn new() -> Self {
        Counters {
            stripes: (0..STRIPES).map(|_| CounterStripe::new()).collect(),
            next_stripe: AtomicUsize::new(0),
        }
    }

    /// The stripe for a new worker (round-robin).
    pub(super) fn next_stripe(&self) -> &CounterStripe {
        let index = self.next_stripe.fetch_add(1, Ordering::Relaxed) % STRIPES;
        &self.stripes[index]
    }

    fn sum(&self, read: impl Fn(&CounterStripe) -> &AtomicU64) -> u64 {
        self.stripes
            .iter()
            .map(|stripe| read(stripe).load(Ordering::Relaxed))
            .sum()
    }

    fn event(&self, counter: Counter) -> u64 {
        self.sum(|stripe| &stripe.events[counter as usize])
    }
}

impl Proxy {
    /// Counter snapshot (summed over all workers).
    pub fn stats(&self) -> ProxyStats {
        let counters = &self.counters;
        let mut responses_generated = BTreeMap::new();
        for slot in 0..CODES {
            let count = counters.sum(|stripe| &stripe.responses_generated[slot]);
            if count > 0 {
                responses_generated.insert(slot as u16 + 100, count);
            }
        }
        let mut drops = BTreeMap::new();
        for (slot, reason) in DROP_REASONS.iter().enumerate() {
            let count = counters.sum(|stripe| &stripe.drops[slot]);
            if count > 0 {
                drops.insert(reason.as_str(), count);
            }
        }
        ProxyStats {
            requests_received: counters.event(Counter::RequestsReceived),
            responses_received: counters.event(Counter::ResponsesReceived),
            requests_forwarded: counters.event(Counter::RequestsForwarded),
            responses_forwarded: counters.event(Counter::ResponsesForwarded),
            transactions_active: self.active_transactions.load(Ordering::Relaxed) as u64,
            transaction_bytes: self.transaction_bytes() as u64,
            timer_entries: self.timer_entries() as u64,
            transactions_created: counters.event(Counter::TransactionsCreated),
            transactions_timed_out: counters.event(Counter::TransactionsTimedOut),
            retransmissions_absorbed: counters.event(Counter::RetransmissionsAbsorbed),
            retransmissions_sent: counters.event(Counter::RetransmissionsSent),
            overload_sheds: counters.event(Counter::OverloadSheds),
            overload_queue_sheds: counters.event(Counter::OverloadQueueSheds),
            drain_refusals: counters.event(Counter::DrainRefusals),
            overload_stateless: counters.event(Counter::OverloadStateless),
            cancels_matched_2543: counters.event(Counter::CancelsMatched2543),
            auth_accepted: counters.event(Counter::AuthAccepted),
            auth_refused: counters.event(Counter::AuthRefused),
            auth_stale: counters.event(Counter::AuthStale),
            auth_replays: counters.event(Counter::AuthReplays),
            relay_refused: counters.event(Counter::RelayRefused),
            flood_blocks: counters.event(Counter::FloodBlocks),
            flood_untracked: counters.event(Counter::FloodUntracked),
            flood_sources_tracked: self.flood_sources_tracked() as u64,
            store_deferred: counters.event(Counter::StoreDeferred),
            store_queue_full: counters.event(Counter::StoreQueueFull),
            store_unavailable_registers: counters.event(Counter::StoreUnavailableRegisters),
            store_unavailable_lookups: counters.event(Counter::StoreUnavailableLookups),
            names_parked: counters.event(Counter::NamesParked),
            names_failed: counters.event(Counter::NamesFailed),
            names_unavailable: counters.event(Counter::NamesUnavailable),
            failovers: counters.event(Counter::Failovers),
            flows_failed: counters.event(Counter::FlowsFailed),
            flow_failures_received: counters.event(Counter::FlowFailuresReceived),
            flow_retries: counters.event(Counter::FlowRetries),
            transport_errors: counters.event(Counter::TransportErrors),
            unreachable_reports: counters.event(Counter::UnreachableReports),
            dialogs_confirmed: counters.event(Counter::DialogsConfirmed),
            dialogs_ended: counters.event(Counter::DialogsEnded),
            dialogs_open: self.dialogs_open() as u64,
            responses_generated,
            drops,
            bindings: self.bindings().map(|n| n as u64),
            binding_bytes: self.binding_bytes().map(|n| n as u64),
        }
    }
}
