//! Forwarding mode and proxy configuration.

use crate::auth::{Algorithm, NonceKey};
use crate::relay::RelayNets;
use crate::transport::{Transport, TransportAddr};
use serde::Serialize;
use std::net::{IpAddr, SocketAddr};

/// Forwarding mode (`stateless` / `stateful` in configuration files).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// RFC 3261 16.11 stateless proxy.
    Stateless,
    /// Transaction-stateful proxy (100 Trying, retransmissions, CANCEL, 408).
    Stateful,
}

/// Proxy configuration.
#[derive(Clone, Debug)]
pub struct ProxyConfig {
    /// Stateless or stateful.
    pub mode: Mode,
    /// Our address as put in Via and Record-Route and used for loop
    /// detection. Must be a concrete address (not 0.0.0.0).
    pub local: SocketAddr,
    /// Default next hop for requests with no IP-literal target.
    pub route_to: Option<SocketAddr>,
    /// The transport to `route_to` (UDP unless configured otherwise).
    pub route_to_transport: Transport,
    /// The default next hop given by name (RFC 3263; resolved through the
    /// driver's [`super::NameResolver`] per request, from its cache while
    /// fresh), when `route_to` is `None`. Its addresses are granted like an
    /// authenticated request's target by the relay policy.
    pub route_to_name: Option<super::NameQuery>,
    /// Where we listen on connection transports (TCP, TLS), beyond
    /// `local` (UDP): each goes into the Via and Record-Route of what we
    /// send over that transport, and is recognised as ours in Route and
    /// Via. Every transport we send over must be listed (UDP is `local`).
    pub listeners: Vec<TransportAddr>,
    /// Act as registrar (REGISTER to our domain, location lookup).
    pub registrar: bool,
    /// NAT handling: a UDP registration's binding keeps the source
    /// address and port the REGISTER came from (its flow), requests to the
    /// contact go there, and our Record-Route towards a flow carries a
    /// signed flow token so that in-dialog requests reach it too (RFC 5626
    /// 5.3). Off: a UDP contact is reached at its Contact address only.
    /// Connections (TCP, TLS) are always used as flows.
    pub nat: bool,
    /// `Flow-Timer` (s) in the `200` to a REGISTER that asked for
    /// outbound (RFC 5626 5.4): how often the UA should send keepalives
    /// on its flow. `None`: no Flow-Timer.
    pub flow_timer: Option<u32>,
    /// Insert Record-Route into dialog-creating requests.
    pub record_route: bool,
    /// Bound on the transaction table (stateful mode).
    pub max_transactions: usize,
    /// Bound on the bytes the transaction table holds (kept requests and
    /// responses included); beyond it new transactions are refused like
    /// beyond `max_transactions`.
    pub max_transaction_bytes: usize,
    /// Host names we are authoritative for (the local IP is always ours).
    pub domains: Vec<String>,
    /// Registrar rules (Expires bounds, contacts per AOR).
    pub registrar_policy: RegistrarPolicy,
    /// Digest authentication of our domains' users (`None`: off).
    pub auth: Option<AuthConfig>,
    /// Per-source request rate limit (`None`: off).
    pub flood: Option<FloodConfig>,
    /// Destinations any request may be relayed to without a grant
    /// ([`crate::relay`]); the default relays only to `route_to`,
    /// bindings, signed dialogs and authenticated requests' targets.
    pub relay: RelayNets,
}

/// Default of [`ProxyConfig::max_transaction_bytes`]: 256 MiB.
pub const DEFAULT_MAX_TRANSACTION_BYTES: usize = 256 << 20;

/// Default of [`RegistrarPolicy::max_path_bytes`].
pub const DEFAULT_MAX_PATH_BYTES: usize = 1024;

/// Flood protection (like Kamailio's pike): a source IP address that sends
/// more than `limit` requests in a `window` has its requests dropped (and
/// counted) until a whole window passes within the limit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FloodConfig {
    /// Requests per window allowed from one source address.
    pub limit: u32,
    /// Window length (ns).
    pub window: u64,
    /// Sources tracked at most (the table is allocated once).
    pub table_size: usize,
    /// Sources never limited (trusted peers; our own address is added).
    pub exempt: Vec<IpAddr>,
    /// IPv6 sources are keyed by this prefix length (bits; 64: one host's
    /// /64 is one source). IPv4 sources are whole addresses.
    pub ipv6_prefix: u8,
    /// Key of the hash that places sources in the table (random per
    /// process in the server, so sets cannot be aimed at).
    pub seed: u64,
}

impl Default for FloodConfig {
    fn default() -> Self {
        FloodConfig {
            limit: 100,
            window: 2_000_000_000,
            table_size: 16_384,
            exempt: Vec::new(),
            ipv6_prefix: 64,
            seed: 0,
        }
    }
}

/// Registrar rules (RFC 3261 10.3).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RegistrarPolicy {
    /// Shortest registration accepted (s); shorter ones (but not 0) get
    /// `423 Interval Too Brief` with `Min-Expires`.
    pub min_expires: u32,
    /// Longest registration granted (s); longer requests are shortened.
    pub max_expires: u32,
    /// Registration lifetime when the request gives none (s).
    pub default_expires: u32,
    /// Most contacts bound to one AOR; a REGISTER that would exceed it is
    /// refused with `403`.
    pub max_contacts: usize,
    /// Most bytes of Path values one REGISTER may carry (they are stored
    /// with every binding it sets); more is refused with `400`.
    pub max_path_bytes: usize,
}

impl Default for RegistrarPolicy {
    fn default() -> Self {
        RegistrarPolicy {
            min_expires: 60,
            max_expires: super::MAX_EXPIRES,
            default_expires: super::DEFAULT_EXPIRES,
            max_contacts: 16,
            max_path_bytes: DEFAULT_MAX_PATH_BYTES,
        }
    }
}

/// Digest authentication (RFC 3261 22): REGISTERs to our registrar are
/// challenged with 401, other requests from our domains with 407. The
/// HA1s come from the store given to [`Proxy::set_credentials`].
///
/// [`Proxy::set_credentials`]: crate::Proxy::set_credentials
#[derive(Clone, Debug)]
pub struct AuthConfig {
    /// Realm of every challenge; `None`: the domain of the AOR (To host of
    /// a REGISTER, From host otherwise), lower-cased.
    pub realm: Option<String>,
    /// Algorithms offered, one challenge header each, most preferred first
    /// (RFC 8760 2.4). Clients use the first they support; Debian's SIPp
    /// takes the first header whatever its algorithm, so list MD5 first
    /// for it.
    pub algorithms: Vec<Algorithm>,
    /// How long a nonce may be used (ns); after that a request with valid
    /// credentials gets a new challenge with `stale=true`.
    pub nonce_lifetime: u64,
    /// Nonces whose highest `nc` is remembered (replay protection).
    pub replay_capacity: usize,
    /// HMAC key of the nonces: random at start-up, or derived from a
    /// secret shared by proxies behind one dispatcher
    /// ([`NonceKey::derive`]), so that a challenge issued by one is
    /// answered at another. [`Proxy::set_nonce_key`] replaces it.
    ///
    /// [`Proxy::set_nonce_key`]: crate::Proxy::set_nonce_key
    pub key: NonceKey,
    /// Added to the driver's `now` for nonce issue times (ns): 0 keeps
    /// the driver's clock; a server puts nonces on the wall clock
    /// (realtime minus monotonic at start) so that proxies on several
    /// hosts sharing a key agree on a nonce's age.
    pub nonce_clock_offset: u64,
}

impl Default for AuthConfig {
    fn default() -> Self {
        AuthConfig {
            realm: None,
            algorithms: vec![Algorithm::Sha256, Algorithm::Md5],
            nonce_lifetime: 300_000_000_000,
            replay_capacity: 65_536,
            key: NonceKey([0; 32]),
            nonce_clock_offset: 0,
        }
    }
}

impl Default for ProxyConfig {
    fn default() -> Self {
        ProxyConfig {
            mode: Mode::Stateless,
            local: SocketAddr::from(([127, 0, 0, 1], 5060)),
            route_to: None,
            route_to_transport: Transport::Udp,
            route_to_name: None,
            listeners: Vec::new(),
            registrar: false,
            // Off in the core's default (a library user opts in); the
            // server turns it on (`--nat on`).
            nat: false,
            flow_timer: None,
            record_route: false,
            max_transactions: 65536,
            max_transaction_bytes: DEFAULT_MAX_TRANSACTION_BYTES,
            domains: Vec::new(),
            registrar_policy: RegistrarPolicy::default(),
            auth: None,
            flood: None,
            relay: RelayNets::None,
        }
    }
}
