//! The proxy core: stateless and transaction-stateful forwarding, loose
//! routing with Record-Route, registrar, and RFC 3261 request validation.
//!
//! One [`Proxy`] is shared (`Arc`) by all worker threads. Each thread drives
//! it through its own [`ProxyWorker`] ([`Proxy::worker`]), which holds that
//! thread's scratch buffer and counter stripe; transactions live in the
//! `Proxy`, in hash-sharded tables behind mutexes, so a response may reach
//! any worker. No I/O: [`ProxyWorker::handle`] and [`ProxyWorker::on_timer`]
//! emit datagrams through the `out` callback (destination always an IP
//! literal), and the caller drives timers with [`Proxy::next_deadline`].
//! The `out` callback must not call back into the same `Proxy` (it may run
//! while a shard lock is held).
//!
//! Routing choices (no DNS is ever done):
//! - our own Route values on top are consumed in one pass; an initial
//!   request (no To tag) loses every other (preloaded) Route, as
//!   Kamailio's default configuration does;
//! - next hop = first remaining Route (if its host is an IP literal), else
//!   the Request-URI host if it is an IP literal and not ours, else the
//!   registrar binding for a Request-URI at our domain, else `route_to`;
//! - if none applies the request gets `404 Not Found` (RFC 3261 21.4.5: the
//!   domain is not one we handle and we cannot resolve it);
//! - the next hop must pass the relay policy ([`crate::relay`]): else
//!   `403` (`482` for our own address), an ACK or CANCEL is dropped;
//! - responses go to the next Via's `received`/`rport`/sent-by (which we
//!   set from the real source when forwarding the request), only if our
//!   branch's MAC says that is where the request came from; a Via whose
//!   host is a name without `received` cannot be routed and is dropped;
//! - never sends to unspecified, broadcast or multicast addresses or port 0.
//! - Responses we generate go to the request's source address (port from
//!   the source when the top Via has `rport`, else the sent-by port), once
//!   (no retransmissions), at most [`AMPLIFICATION_LIMIT`] times the
//!   request's size.

// Layout: `worker` (ProxyWorker, entry point, local responses), `refusal`
// (the quick 503 of a new call under overload and its ACK), `request`
// (new requests: overload, validation, routing, dispatch), `routing`
// (16.3, 16.4, 16.6, next hop), `stateful` (requests matching transactions,
// stateful forwarding), `response`, `cancel`, `register`, `timers` (timer
// table and driver), `transport_error` (the driver's delivery failures),
// `transaction` (state machine, shards), `branch` (request keys, branch
// and To-tag), `config`, `outcome`, `stats`.

mod auth;
mod authorised;
mod branch;
mod cancel;
mod config;
mod deferred;
mod dialogs;
pub(crate) mod flood;
mod flow_retry;
mod flow_token;
mod names;
mod outcome;
mod refusal;
mod register;
mod request;
mod request_context;
mod response;
mod routing;
mod stateful;
mod stats;
mod timer_table;
mod timers;
mod transaction;
mod transport_error;
mod worker;

pub use crate::relay::sendable;
pub use config::{
    AuthConfig, FloodConfig, Mode, ProxyConfig, RegistrarPolicy, DEFAULT_MAX_PATH_BYTES,
    DEFAULT_MAX_TRANSACTION_BYTES,
};
pub use deferred::{DeferredRequest, QueueFull, StoreQueue};
pub use names::{NameAnswer, NameError, NameQuery, NameResolver, ResolvingRequest, MAX_TRIES};
pub use outcome::{Action, DropReason, MsgLabel, Outcome, DROP_REASONS, EXACT_CODES};
pub use register::{DEFAULT_EXPIRES, MAX_EXPIRES, STORE_RETRY_AFTER};
pub(crate) use routing::upstream_address;
pub use stats::ProxyStats;
pub use timer_table::{T1, T2, T4, TIMER_64T1, TIMER_C};
pub use transport_error::{TransportErrorOutcome, UnreachableOutcome};
pub(crate) use worker::reply_hop;
pub use worker::ProxyWorker;
pub use worker::AMPLIFICATION_LIMIT;

use crate::hash::{Hash64, KeyRing, Purpose};
use crate::registrar::{LocationStore, MemoryStore};
use crate::relay::RelayPolicy;
use crate::transport::{FlowState, Hop, Transport, TransportAddr};
use auth::Authenticator;
use authorised::AuthorisedHops;
use cancel::CancelIndex;
use deferred::StoreAccess;
use flood::FloodLimiter;
use stats::Counters;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use transaction::{Shard, SHARDS};

/// The SIP proxy/registrar core, shared by all workers (`Send + Sync`).
pub struct Proxy {
    config: ProxyConfig,
    /// Our address per transport: UDP (`local`) first, then the listeners.
    own: Vec<OwnAddress>,
    /// The keys of every value derived from our secret (branches,
    /// To-tags, signed Record-Route, flow tokens, table keys), one per
    /// purpose.
    keys: KeyRing,
    /// Where requests may go (a reload may replace it: read-locked per
    /// forwarded request, written only by [`Proxy::set_relay`]).
    relay: RwLock<RelayPolicy>,
    /// Draining ([`Proxy::set_draining`]): new requests get `503`.
    draining: AtomicBool,
    /// Our digest realms (the fixed one, or every served domain): their
    /// `Proxy-Authorization` is never forwarded.
    realms: Vec<String>,
    store: StoreAccess,
    /// The driver's DNS, for next hops that are names (`None`: names
    /// are not resolved).
    names: Option<Arc<dyn NameResolver>>,
    /// The driver's connections (`None`: every flow counts as open).
    flow_state: Option<Arc<dyn FlowState>>,
    /// Digest authentication, when configured.
    auth: Option<Authenticator>,
    /// Stateless with authentication: where authenticated INVITEs went
    /// (their CANCEL and non-2xx ACK may follow).
    authorised: Option<AuthorisedHops>,
    /// Per-source request limits, when configured.
    flood: Option<FloodLimiter>,
    shards: Box<[Mutex<Shard>]>,
    /// Pending INVITEs by RFC 2543 matching key (CANCEL matching).
    cancel_index: CancelIndex,
    active_transactions: AtomicUsize,
    /// Bytes the transaction table holds (every shard counts into it).
    transaction_bytes: Arc<AtomicUsize>,
    counters: Counters,
    /// When the registrar's expiry sweep last ran (ns).
    last_expiry_sweep: AtomicU64,
    /// Until when (ns) ACKs may acknowledge a quick refusal
    /// ([`refusal`]): they are peeked at for its tag only then.
    refusal_acks_until: AtomicU64,
    /// Dialogs set up through us (stateful mode), for a drain to wait on.
    dialogs: dialogs::DialogSet,
}

impl Proxy {
    /// A proxy with an in-memory location store of 100 000 bindings.
    pub fn new(config: ProxyConfig) -> Self {
        Self::with_store(config, Arc::new(MemoryStore::new(100_000)))
    }

    /// A proxy using `store` as location service, called on the workers
    /// (a store that answers at once).
    pub fn with_store(config: ProxyConfig, store: Arc<dyn LocationStore>) -> Self {
        Self::with_store_access(config, StoreAccess::Inline(store))
    }

    /// A proxy whose location store is reached through the driver:
    /// requests that need it are handed to `queue` and finished by
    /// [`ProxyWorker::resume`] (see [`StoreQueue`]).
    pub fn with_store_queue(config: ProxyConfig, queue: Arc<dyn StoreQueue>) -> Self {
        Self::with_store_access(config, StoreAccess::Deferred(queue))
    }

    fn with_store_access(config: ProxyConfig, store: StoreAccess) -> Self {
        let sent_by = config.local.to_string();
        let own = std::iter::once(TransportAddr::udp(config.local))
            .chain(config.listeners.iter().copied())
            .map(OwnAddress::new)
            .collect();
        let transaction_bytes = Arc::new(AtomicUsize::new(0));
        let config_max_transactions = config.max_transactions;
        // Deterministic until a driver calls `set_secret` (servers do, with
        // random bytes).
        let keys = KeyRing::from_seed(
            Hash64::new(0x5EC2E7)
                .str(&sent_by)
                .str(&format!("{:?}", config.mode))
                .finish(),
        );
        let relay = RelayPolicy::new(
            config.local,
            config.route_to.into_iter().collect(),
            config.relay.clone(),
        );
        let realms = match &config.auth {
            Some(auth) => match &auth.realm {
                Some(realm) => vec![realm.clone()],
                None => config
                    .domains
                    .iter()
                    .map(|d| d.to_ascii_lowercase())
                    .collect(),
            },
            None => Vec::new(),
        };
        Proxy {
            realms,
            authorised: (config.auth.is_some() && config.mode == Mode::Stateless)
                .then(|| AuthorisedHops::new(keys.key(Purpose::AuthorisedHop))),
            relay: RwLock::new(relay),
            draining: AtomicBool::new(false),
            auth: config.auth.clone().map(Authenticator::new),
            flood: config.flood.clone().map(|mut flood| {
                // Ourselves, and the configured next hop (its responses
                // and requests are the traffic we serve).
                flood.exempt.push(config.local.ip());
                flood.exempt.extend(config.route_to.map(|to| to.ip()));
                FloodLimiter::new(flood)
            }),
            config,
            own,
            store,
            names: None,
            flow_state: None,
            shards: (0..SHARDS)
                .map(|_| Mutex::new(Shard::new(transaction_bytes.clone())))
                .collect(),
            cancel_index: CancelIndex::new(),
            active_transactions: AtomicUsize::new(0),
            transaction_bytes,
            counters: Counters::new(),
            last_expiry_sweep: AtomicU64::new(0),
            refusal_acks_until: AtomicU64::new(0),
            dialogs: dialogs::DialogSet::new(config_max_transactions, keys.key(Purpose::Dialog)),
            keys,
        }
    }

    /// Replace the secret every value we derive from it is keyed by, one
    /// key per purpose ([`KeyRing`]: branches, To-tags, transaction and
    /// loop hashes, signed Record-Route, flow tokens, the keys of the
    /// tables an attacker fills): random at start-up in a server. Signed
    /// Record-Routes of dialogs set up before a change no longer verify,
    /// and the dialogs and authorised hops tracked so far are forgotten.
    pub fn set_secret(&mut self, secret: [u8; 32]) {
        self.keys = KeyRing::new(&secret);
        if self.authorised.is_some() {
            self.authorised = Some(AuthorisedHops::new(self.keys.key(Purpose::AuthorisedHop)));
        }
        self.dialogs =
            dialogs::DialogSet::new(self.config.max_transactions, self.keys.key(Purpose::Dialog));
    }

    /// Resolve next hops that are names through `resolver` (the driver's
    /// DNS; see [`NameResolver`]): `route_to_name`, and Request-URI and
    /// Route hosts where the relay policy allows them.
    pub fn set_name_resolver(&mut self, resolver: Arc<dyn NameResolver>) {
        self.names = Some(resolver);
    }

    /// Ask `state` whether a registered flow's connection is open before
    /// sending a request over it: one that is gone gets `430 Flow Failed`
    /// (RFC 5626 5.3) instead of being dropped by the driver.
    pub fn set_flow_state(&mut self, state: Arc<dyn FlowState>) {
        self.flow_state = Some(state);
    }

    /// Whether `hop` names a connection the driver says is gone.
    pub(super) fn flow_gone(&self, hop: Hop) -> bool {
        match (hop.flow, &self.flow_state) {
            (Some(flow), Some(state)) => !state.is_open(flow),
            _ => false,
        }
    }

    /// Drain (on) or serve again (off): while draining, a new request
    /// outside a dialog other than ACK and CANCEL (an INVITE, a REGISTER,
    /// an OPTIONS probe) is answered `503` with `Retry-After` before any
    /// state; transactions and dialogs already under way go on, so the
    /// table empties and a dispatcher probing with OPTIONS moves new
    /// traffic away.
    pub fn set_draining(&self, on: bool) {
        self.draining.store(on, Ordering::Relaxed);
    }

    /// Whether the proxy is draining.
    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::Relaxed)
    }

    /// Replace the relay networks (a reload): requests forwarded from now
    /// on are checked against `nets`; `route_to` and our own address stay
    /// as configured at start.
    pub fn set_relay(&self, nets: crate::RelayNets) {
        let policy = RelayPolicy::new(
            self.config.local,
            self.config.route_to.into_iter().collect(),
            nets,
        );
        *self.relay.write().unwrap_or_else(|e| e.into_inner()) = policy;
    }

    /// Sign and verify digest nonces with `key` from now on (a reload of
    /// a shared secret); a nonce of the old key gets a new challenge.
    /// `false` when authentication is off.
    pub fn set_nonce_key(&self, key: crate::auth::NonceKey) -> bool {
        match &self.auth {
            Some(auth) => {
                auth.set_key(key);
                true
            }
            None => false,
        }
    }

    /// New flood limit (requests per window) and window (ns), applied from
    /// the next datagram (a reload); `false` when the flood limiter is off
    /// (it is created at start, with its table).
    pub fn set_flood_limits(&self, limit: u32, window: u64) -> bool {
        match &self.flood {
            Some(flood) => {
                flood.set_limits(limit, window);
                true
            }
            None => false,
        }
    }

    /// The configuration.
    pub fn config(&self) -> &ProxyConfig {
        &self.config
    }

    /// Sources the flood limiter tracks now (0 when it is off).
    pub fn flood_sources_tracked(&self) -> usize {
        self.flood.as_ref().map_or(0, FloodLimiter::tracked)
    }

    /// The location store when the workers call it (`None`: reached
    /// through the driver's queue).
    pub fn store(&self) -> Option<&Arc<dyn LocationStore>> {
        match &self.store {
            StoreAccess::Inline(store) => Some(store),
            StoreAccess::Deferred(_) => None,
        }
    }

    /// Bindings held, when known locally.
    pub fn bindings(&self) -> Option<usize> {
        self.store().and_then(|store| store.len())
    }

    /// Transactions in the table now (what `stats().transactions_active`
    /// says, without summing every counter).
    pub fn transactions_active(&self) -> usize {
        self.active_transactions
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Dialogs set up through this proxy (stateful mode: the first 2xx to
    /// an INVITE outside a dialog went upstream) and not ended by a BYE
    /// through it. Kept as ids, at most `max_transactions`; one tracked
    /// for over four hours may be forgotten when room is needed (its BYE
    /// went another way, or never came). A drain that waits for dialogs
    /// waits until this is 0 or its deadline.
    pub fn dialogs_open(&self) -> usize {
        self.dialogs.len()
    }

    /// Transactions still waiting for their final response (what a drain
    /// waits for; the rest of the table only absorbs retransmissions until
    /// its timers end). Locks every shard in turn: for a drain's polling,
    /// not the data path.
    pub fn transactions_pending(&self) -> usize {
        self.shards
            .iter()
            .map(|shard| {
                transaction::lock(shard)
                    .transactions
                    .values()
                    .filter(|t| t.server == transaction::ServerState::Proceeding)
                    .count()
            })
            .sum()
    }

    /// Bytes the bindings take, when held locally.
    pub fn binding_bytes(&self) -> Option<usize> {
        self.store().and_then(|store| store.bytes())
    }

    /// A handle for one worker thread: its own scratch buffer and counter
    /// stripe (assigned round-robin). Hold it for the thread's lifetime;
    /// every worker sees every transaction.
    pub fn worker(&self) -> ProxyWorker<'_> {
        ProxyWorker::new(self, self.counters.next_stripe())
    }

    /// Bytes the transaction table holds now (requests and responses kept
    /// for retransmission, table entries).
    pub fn transaction_bytes(&self) -> usize {
        self.transaction_bytes.load(Ordering::Relaxed)
    }

    /// Deadlines queued in the transaction shards' timer heaps, stale ones
    /// included (bounded: at most two per transaction and a few per shard).
    pub fn timer_entries(&self) -> usize {
        self.shards
            .iter()
            .map(|shard| transaction::lock(shard).timers.len())
            .sum()
    }

    /// Whether one more transaction fits: fewer than `max_transactions`
    /// and fewer than `max_transaction_bytes` held (review S9: a bound in
    /// bytes, whatever the size of the messages).
    pub(super) fn transaction_room(&self) -> bool {
        self.active_transactions.load(Ordering::Relaxed) < self.config.max_transactions
            && self.transaction_bytes() < self.config.max_transaction_bytes
    }

    /// Our address on `transport` (`None`: we do not listen on it).
    pub(super) fn own_address(&self, transport: Transport) -> Option<&OwnAddress> {
        self.own.iter().find(|own| own.at.transport == transport)
    }

    /// Whether `addr` is one of our listening addresses (any transport).
    pub(super) fn is_own_address(&self, addr: SocketAddr) -> bool {
        self.own.iter().any(|own| own.at.addr == addr)
    }

    /// The shard holding transactions of hash `hash`.
    fn shard(&self, hash: u64) -> &Mutex<Shard> {
        &self.shards[(hash >> 58) as usize % SHARDS]
    }
}

/// One of our listening addresses with the texts we write for it.
pub(super) struct OwnAddress {
    pub(super) at: TransportAddr,
    /// `host:port` for Via.
    pub(super) sent_by: String,
    /// Record-Route URI without its signature
    /// (`sip:host:port;transport=tcp;lr`; no `transport` for UDP).
    pub(super) record_route_uri: String,
}

impl OwnAddress {
    fn new(at: TransportAddr) -> OwnAddress {
        let sent_by = at.addr.to_string();
        let record_route_uri = match at.transport {
            Transport::Udp => format!("sip:{sent_by};lr"),
            other => format!("sip:{sent_by};transport={};lr", other.name()),
        };
        OwnAddress {
            at,
            sent_by,
            record_route_uri,
        }
    }
}
