//! The forwarding core: client and subscription tables, verified-source
//! checks, replication targets, the static room, return-routability
//! cookies and idle timeouts.
//!
//! Sans-IO: [`Sfu::handle`] takes one received datagram (sender address,
//! bytes, `now` in ns on any monotonic clock) and returns an [`Action`]: the
//! addresses to send copies of the same bytes to, a control reply to send,
//! or a counted drop. [`Sfu::tick`] expires idle clients.
//!
//! **No state for unverified addresses.** A REGISTER without a valid
//! cookie, and the first RTP packet of an address that wants to join the
//! static room, get one CHALLENGE (20 bytes, never more than the request,
//! rate-limited per source prefix) and change nothing. Only an address
//! that echoes the cookie (REGISTER / JOIN) is registered or admitted, so
//! spoofed sources can neither fill the tables, nor evict anybody, nor be
//! latched into the room to receive its media.
//!
//! **Subscriptions cost what they change.** Route lists are materialised
//! per (source, media type) with an index, and every (source, subscriber,
//! media) pair keeps a count of the selectors that want it: SUBSCRIBE and
//! UNSUBSCRIBE touch only the sources their selectors name (every source
//! for a wildcard), O(1) each, whatever the number of clients and
//! subscriptions already there.

use crate::admission::{Cookies, KeyedRng, PrefixLimiter};
use crate::quality::{QualitySnapshot, StreamQuality};
use crate::token::{self, TokenError, TokenKey};
use crate::wire::{
    self, classify, Control, ErrorCode, Kind, MediaType, MsgType, RtpPacket, Selector, SourceSel,
    COOKIE_LEN, CTRL_AUTH_LEN, CTRL_ERROR_LEN, MAX_ROOM_LEN,
};
use std::collections::HashMap;
use std::net::SocketAddr;

/// SFU settings.
#[derive(Clone, Debug)]
pub struct SfuConfig {
    /// Send every accepted media packet back to its sender (RTT measurement).
    pub echo: bool,
    /// Admit RTP senders into one static room by address, after a
    /// return-routability check (CHALLENGE, then JOIN with the cookie).
    pub static_room: bool,
    /// Most registered clients (and, separately, static-room members).
    pub max_clients: usize,
    /// Most registered clients (and, separately, static-room members) from
    /// one source prefix ([`SfuConfig::client_prefix_v4`],
    /// [`SfuConfig::client_prefix_v6`]): one host cannot fill the table.
    pub max_clients_per_prefix: usize,
    /// IPv4 prefix length (bits) of that cap: 32 (one address) or e.g. 24.
    pub client_prefix_v4: u8,
    /// IPv6 prefix length (bits) of that cap (56: a customer site).
    pub client_prefix_v6: u8,
    /// Most subscription selectors per client.
    pub max_subs: usize,
    /// Remove clients silent for longer than this (ns).
    pub idle_timeout_ns: u64,
    /// Key of the generator behind tokens and cookie secrets. Give real
    /// entropy (the server reads the OS random source); with a known seed
    /// tokens and cookies are predictable.
    pub seed: u128,
    /// Lifetime of one cookie secret (ns): a cookie is accepted for one to
    /// two of these after it was made.
    pub cookie_period_ns: u64,
    /// Replies to unverified addresses (CHALLENGE, ERROR) per second per
    /// source prefix (IPv4 /24, IPv6 /56), and registrations per second.
    pub prefix_rate: u32,
    /// Burst of that rate.
    pub prefix_burst: u32,
    /// With a key, REGISTER needs a valid join token for its room
    /// (version-2 REGISTER); without, anyone who passes the cookie joins.
    pub token_key: Option<TokenKey>,
    /// Most rooms at once.
    pub max_rooms: usize,
    /// Most registered clients per room (rooms created through the admin
    /// API may set a lower one).
    pub max_clients_per_room: usize,
    /// Create a room when the first client names it; otherwise only rooms
    /// created through [`Sfu::create_room`] (and `default`, for version-1
    /// REGISTERs, if created) can be joined.
    pub auto_create_rooms: bool,
    /// A media packet whose transit exceeds the stream's smallest by more
    /// than this (ns) counts as late (see [`crate::quality`]).
    pub late_after_ns: u64,
    /// Most revoked tokens remembered (until they expire).
    pub max_revoked: usize,
}

/// The room a version-1 REGISTER joins.
pub const DEFAULT_ROOM: &str = "default";

impl Default for SfuConfig {
    fn default() -> Self {
        SfuConfig {
            echo: true,
            static_room: false,
            max_clients: 1024,
            max_clients_per_prefix: 64,
            client_prefix_v4: 32,
            client_prefix_v6: 56,
            max_subs: 64,
            idle_timeout_ns: 10_000_000_000,
            seed: 0x5eed,
            cookie_period_ns: 10_000_000_000,
            prefix_rate: 32,
            prefix_burst: 128,
            token_key: None,
            max_rooms: 256,
            max_clients_per_room: 1024,
            auto_create_rooms: true,
            late_after_ns: 20_000_000,
            max_revoked: 4096,
        }
    }
}

/// Why a datagram was dropped.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub enum DropReason {
    /// Not RTP/control, or failed the wire checks.
    Malformed,
    /// RTP whose SSRC is not a registered SSID (and no static room).
    Unregistered,
    /// RTP whose SSRC is registered to another address (spoofed/unverified).
    Unverified,
    /// RTP from a verified source with a payload type that is not a media type.
    UnknownPayloadType,
    /// Static room full.
    RoomFull,
    /// Control reply (ACK/ERROR/CHALLENGE) sent to the SFU: never answered.
    UnexpectedControl,
    /// RTP from an address not (yet) admitted to the static room: at most a
    /// CHALLENGE went back.
    NotAdmitted,
    /// REGISTER or JOIN with a cookie that is not valid for its address.
    BadCookie,
    /// Over the per-prefix rate of replies to unverified addresses: no reply.
    RateLimited,
    /// Media from a client whose token does not grant publishing.
    NotAllowed,
}

/// What the caller should do with a datagram.
#[derive(Debug, PartialEq, Eq)]
pub enum Action<'a> {
    /// Send a copy of the received bytes to each of `targets`, then to
    /// `echo` (the sender) if set.
    Forward {
        /// Source SSID (the SSRC; for static-room members as received).
        ssid: u32,
        /// Media type, when the payload type is a pktswitch type.
        media: Option<MediaType>,
        /// Subscribers (never the sender itself).
        targets: &'a [SocketAddr],
        /// The sender, when echo is on.
        echo: Option<SocketAddr>,
    },
    /// Send `msg` to `dst` (an ACK, ERROR or CHALLENGE).
    Reply {
        /// Destination (the requester).
        dst: SocketAddr,
        /// Message bytes.
        msg: &'a [u8],
    },
    /// Drop the datagram (already counted).
    Drop(DropReason),
}

/// Counters of the core.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct SfuStats {
    /// Datagrams handled.
    pub rx_datagrams: u64,
    /// RTP datagrams handled.
    pub rx_rtp: u64,
    /// Control datagrams handled.
    pub rx_control: u64,
    /// Media packets accepted for forwarding.
    pub media_accepted: u64,
    /// Copies to subscribers.
    pub copies: u64,
    /// Echo copies to senders.
    pub echoes: u64,
    /// ACKs sent.
    pub acks: u64,
    /// ERRORs sent.
    pub errors_sent: u64,
    /// CHALLENGEs sent (REGISTER without a valid cookie, RTP from an
    /// address not admitted to the static room).
    pub challenges: u64,
    /// Malformed datagrams dropped.
    pub drop_malformed: u64,
    /// RTP from unregistered SSRCs dropped.
    pub drop_unregistered: u64,
    /// RTP from a registered SSRC but another address dropped.
    pub drop_unverified: u64,
    /// RTP with an unknown payload type dropped.
    pub drop_unknown_pt: u64,
    /// Control with a wrong token refused.
    pub drop_bad_token: u64,
    /// Control for an unknown SSID refused.
    pub drop_unknown_ssid: u64,
    /// Control from another address than the registered one refused.
    pub drop_wrong_address: u64,
    /// Unexpected ACK/ERROR/CHALLENGE received (ignored).
    pub drop_unexpected_control: u64,
    /// RTP from addresses not admitted to the static room.
    pub drop_not_admitted: u64,
    /// REGISTER / JOIN whose cookie was wrong or expired (a CHALLENGE
    /// followed, rate permitting).
    pub drop_bad_cookie: u64,
    /// Replies to unverified addresses withheld by the per-prefix rate limit.
    pub rate_limited: u64,
    /// Registrations refused (table full).
    pub rejected_register: u64,
    /// Subscriptions refused (too many selectors).
    pub rejected_subscribe: u64,
    /// Static-room senders refused (room full).
    pub rejected_room: u64,
    /// Registrations and static-room senders refused because their source
    /// prefix holds `max_clients_per_prefix` already (also counted in
    /// `rejected_register` / `rejected_room`).
    pub rejected_prefix: u64,
    /// Successful registrations (new SSIDs).
    pub registrations: u64,
    /// Addresses admitted to the static room (JOIN with a valid cookie).
    pub joins: u64,
    /// Clients that left.
    pub leaves: u64,
    /// Clients and static members removed for idleness.
    pub timeouts: u64,
    /// Registered clients now.
    pub clients: u64,
    /// Static-room members now.
    pub room_members: u64,
    /// Rooms now.
    pub rooms: u64,
    /// REGISTERs without a token where one is required.
    pub token_missing: u64,
    /// Tokens that were not well-formed HS256 JWTs with our claims.
    pub token_malformed: u64,
    /// Tokens whose signature did not verify.
    pub token_forged: u64,
    /// Tokens past `exp` (or before `nbf`).
    pub token_expired: u64,
    /// Tokens for another room.
    pub token_wrong_room: u64,
    /// Revoked tokens (replayed after a kick).
    pub token_revoked: u64,
    /// Registrations refused: room full.
    pub rejected_room_full: u64,
    /// Registrations refused: no such room, bad room name, or room table full.
    pub rejected_no_room: u64,
    /// Media from non-publishers and SUBSCRIBEs from non-subscribers refused.
    pub drop_not_allowed: u64,
    /// Clients removed by the operator.
    pub kicks: u64,
    /// Sessions moved to a new address (REBIND with token and cookie).
    pub rebinds: u64,
    /// Revoked tokens remembered now.
    pub revoked: u64,
}

/// Why a room operation failed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RoomError {
    /// Room names are 1-64 bytes of `A-Z a-z 0-9 . _ -`.
    #[error("bad room name (1-64 bytes of A-Z a-z 0-9 . _ -)")]
    BadName,
    /// The room table is full.
    #[error("room table full")]
    TooManyRooms,
    /// No such room.
    #[error("no such room")]
    NoSuchRoom,
    /// The room exists already.
    #[error("room exists")]
    Exists,
}

/// One room in the admin API's view.
#[derive(Clone, Debug, serde::Serialize)]
pub struct RoomInfo {
    /// Name.
    pub name: String,
    /// Most clients.
    pub max_clients: usize,
    /// Created through the admin API (kept while empty).
    pub pinned: bool,
    /// Its clients.
    pub clients: Vec<ClientInfo>,
}

/// One client in the admin API's view.
#[derive(Clone, Debug, serde::Serialize)]
pub struct ClientInfo {
    /// SSID.
    pub ssid: u32,
    /// Address (media and control).
    pub addr: SocketAddr,
    /// Identity from its token (`sub`), if any.
    pub identity: Option<String>,
    /// May send media.
    pub publish: bool,
    /// May subscribe.
    pub subscribe: bool,
    /// Seconds since it registered.
    pub age_s: f64,
    /// Seconds since it was last heard.
    pub idle_s: f64,
    /// Echo RTT its last KEEPALIVE reported (ms; with echo on).
    pub echo_rtt_ms: Option<f64>,
    /// Subscription selectors.
    pub subscriptions: usize,
    /// Reception statistics per media stream it sends.
    pub streams: Vec<StreamInfo>,
}

/// Reception statistics of one media stream.
#[derive(Clone, Debug, serde::Serialize)]
pub struct StreamInfo {
    /// Media type.
    pub media: MediaType,
    /// The statistics.
    #[serde(flatten)]
    pub quality: QualitySnapshot,
}

#[derive(Debug)]
struct Client {
    addr: SocketAddr,
    token: u64,
    last_seen: u64,
    /// Selectors (a set: no duplicates), at most `max_subs`.
    subs: Vec<Selector>,
    room: u32,
    registered_at: u64,
    /// From the join token: identity, signature id and expiry (for
    /// revocation), rights.
    identity: Option<String>,
    token_id: Option<([u8; 16], u64)>,
    publish: bool,
    subscribe: bool,
    echo_rtt_us: Option<u32>,
    quality: [Option<Box<StreamQuality>>; MediaType::COUNT],
}

/// A room: a set of clients that see each other's media.
#[derive(Debug)]
struct Room {
    name: String,
    members: usize,
    max_clients: usize,
    pinned: bool,
}

/// Room names: 1-64 bytes of `A-Z a-z 0-9 . _ -` (safe as a label).
fn valid_room_name(name: &[u8]) -> bool {
    !name.is_empty()
        && name.len() <= MAX_ROOM_LEN
        && name
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// Subscriber addresses of one (source, media type), with an index for
/// O(1) insertion and removal (order is not kept).
#[derive(Debug, Default)]
struct RouteList {
    addrs: Vec<SocketAddr>,
    ssids: Vec<u32>,
    pos: HashMap<u32, usize>,
    /// Where the next packet's fan-out starts (rotates by one per packet).
    first: usize,
}

impl RouteList {
    fn insert(&mut self, ssid: u32, addr: SocketAddr) {
        if self.pos.contains_key(&ssid) {
            return;
        }
        self.pos.insert(ssid, self.addrs.len());
        self.addrs.push(addr);
        self.ssids.push(ssid);
    }
    fn remove(&mut self, ssid: u32) {
        let Some(index) = self.pos.remove(&ssid) else {
            return;
        };
        self.addrs.swap_remove(index);
        self.ssids.swap_remove(index);
        if let Some(&moved) = self.ssids.get(index) {
            self.pos.insert(moved, index);
        }
    }
}

/// Counts of selectors wanting media type m, per media type.
type Counts = [u16; MediaType::COUNT];

/// The SFU forwarding core.
#[derive(Debug)]
pub struct Sfu {
    cfg: SfuConfig,
    clients: HashMap<u32, Client>,
    by_addr: HashMap<SocketAddr, u32>,
    /// Per registered source SSID and media type: subscribers.
    routes: HashMap<u32, [RouteList; MediaType::COUNT]>,
    /// Per source SSID (registered or not) and subscriber SSID: selectors
    /// naming that source, per media type.
    explicit: HashMap<u32, HashMap<u32, Counts>>,
    /// Per media type and subscriber SSID: wildcard-source selectors.
    wildcard: [HashMap<u32, u16>; MediaType::COUNT],
    room: HashMap<SocketAddr, u64>,
    room_list: Vec<SocketAddr>,
    /// Where the next static-room packet's fan-out starts.
    room_first: usize,
    /// Registered clients per source prefix (entries only while above 0).
    client_prefixes: HashMap<PrefixKey, usize>,
    /// Static-room members per source prefix.
    room_prefixes: HashMap<PrefixKey, usize>,
    scratch: Vec<SocketAddr>,
    next_ssid: u32,
    rng: KeyedRng,
    cookies: Cookies,
    limiter: PrefixLimiter,
    reply: [u8; 32],
    stats: SfuStats,
    rooms: HashMap<u32, Room>,
    room_ids: HashMap<String, u32>,
    next_room: u32,
    /// Revoked token ids and their expiry (Unix s).
    revoked: HashMap<[u8; 16], u64>,
    /// Unix time (s) minus monotonic `now` (ns) / 1e9, set by the driver.
    unix_offset_s: i64,
    /// Route-table steps taken by subscription changes (for the cost tests).
    work: u64,
}

impl Sfu {
    /// A core with no clients.
    pub fn new(cfg: SfuConfig) -> Self {
        let mut rng = KeyedRng::new(cfg.seed);
        let cookies = Cookies::new(cfg.cookie_period_ns, 0, &mut rng);
        let limiter = PrefixLimiter::new(cfg.prefix_rate, cfg.prefix_burst, 4096);
        Sfu {
            cfg,
            clients: HashMap::new(),
            by_addr: HashMap::new(),
            routes: HashMap::new(),
            explicit: HashMap::new(),
            wildcard: Default::default(),
            room: HashMap::new(),
            room_list: Vec::new(),
            room_first: 0,
            client_prefixes: HashMap::new(),
            room_prefixes: HashMap::new(),
            scratch: Vec::new(),
            next_ssid: 1,
            rng,
            cookies,
            limiter,
            reply: [0; 32],
            stats: SfuStats::default(),
            work: 0,
            rooms: HashMap::new(),
            room_ids: HashMap::new(),
            next_room: 1,
            revoked: HashMap::new(),
            unix_offset_s: 0,
        }
    }

    /// Settings.
    pub fn config(&self) -> &SfuConfig {
        &self.cfg
    }

    /// Counters (with current table sizes).
    pub fn stats(&self) -> SfuStats {
        let mut snapshot = self.stats;
        snapshot.clients = self.clients.len() as u64;
        snapshot.room_members = self.room.len() as u64;
        snapshot.rooms = self.rooms.len() as u64;
        snapshot.revoked = self.revoked.len() as u64;
        snapshot
    }

    /// Tell the core the wall-clock time: `unix_ns` (CLOCK_REALTIME) at
    /// monotonic `now` (ns). Token expiry is checked against it. The driver
    /// calls it at start and on every tick.
    pub fn set_unix_time(&mut self, now: u64, unix_ns: u64) {
        self.unix_offset_s = (unix_ns / 1_000_000_000) as i64 - (now / 1_000_000_000) as i64;
    }

    fn unix_s(&self, now: u64) -> u64 {
        ((now / 1_000_000_000) as i64 + self.unix_offset_s).max(0) as u64
    }

    /// Create a room that stays while empty, with at most `max_clients`
    /// (capped by the configuration's `max_clients_per_room`).
    pub fn create_room(&mut self, name: &str, max_clients: Option<usize>) -> Result<(), RoomError> {
        if !valid_room_name(name.as_bytes()) {
            return Err(RoomError::BadName);
        }
        if let Some(room_id) = self.room_ids.get(name) {
            let room = self.rooms.get_mut(room_id).expect("index consistent");
            if room.pinned {
                return Err(RoomError::Exists);
            }
            room.pinned = true;
            if let Some(max) = max_clients {
                room.max_clients = max.min(self.cfg.max_clients_per_room);
            }
            return Ok(());
        }
        let room_id = self.new_room(name).ok_or(RoomError::TooManyRooms)?;
        let room = self.rooms.get_mut(&room_id).expect("just made");
        room.pinned = true;
        if let Some(max) = max_clients {
            room.max_clients = max.min(self.cfg.max_clients_per_room);
        }
        Ok(())
    }

    /// Close a room: kick every client in it (their tokens revoked) and
    /// forget it. Returns how many clients were kicked.
    pub fn close_room(&mut self, name: &str) -> Result<usize, RoomError> {
        let room_id = *self.room_ids.get(name).ok_or(RoomError::NoSuchRoom)?;
        let members: Vec<u32> = self
            .clients
            .iter()
            .filter(|(_, c)| c.room == room_id)
            .map(|(s, _)| *s)
            .collect();
        for s in &members {
            self.kick(*s);
        }
        if let Some(room) = self.rooms.remove(&room_id) {
            self.room_ids.remove(&room.name);
        }
        Ok(members.len())
    }

    /// Remove client `ssid` now and revoke its join token (a replay of it is
    /// refused until it expires). False if there is no such client.
    pub fn kick(&mut self, ssid: u32) -> bool {
        let Some(client) = self.clients.get(&ssid) else {
            return false;
        };
        if let Some((id, exp)) = client.token_id {
            self.revoke(id, exp);
        }
        self.remove_client(ssid);
        self.stats.kicks += 1;
        true
    }

    /// Remember a revoked token id until `exp`, within `max_revoked`
    /// (expired ones go first, then the one expiring soonest).
    fn revoke(&mut self, id: [u8; 16], exp: u64) {
        if self.revoked.len() >= self.cfg.max_revoked.max(1) {
            if let Some((&oldest, _)) = self.revoked.iter().min_by_key(|(_, &e)| e) {
                self.revoked.remove(&oldest);
            }
        }
        self.revoked.insert(id, exp);
    }

    /// Rooms, their clients and each client's statistics, at `now`.
    pub fn rooms_info(&self, now: u64) -> Vec<RoomInfo> {
        let mut rooms: Vec<RoomInfo> = self
            .rooms
            .iter()
            .map(|(&id, r)| {
                let mut clients: Vec<ClientInfo> = self
                    .clients
                    .iter()
                    .filter(|(_, c)| c.room == id)
                    .map(|(&ssid, c)| self.client_info(now, ssid, c))
                    .collect();
                clients.sort_by_key(|c| c.ssid);
                RoomInfo {
                    name: r.name.clone(),
                    max_clients: r.max_clients,
                    pinned: r.pinned,
                    clients,
                }
            })
            .collect();
        rooms.sort_by(|a, b| a.name.cmp(&b.name));
        rooms
    }

    fn client_info(&self, now: u64, ssid: u32, c: &Client) -> ClientInfo {
        ClientInfo {
            ssid,
            addr: c.addr,
            identity: c.identity.clone(),
            publish: c.publish,
            subscribe: c.subscribe,
            age_s: now.saturating_sub(c.registered_at) as f64 / 1e9,
            idle_s: now.saturating_sub(c.last_seen) as f64 / 1e9,
            echo_rtt_ms: c.echo_rtt_us.map(|u| f64::from(u) / 1000.0),
            subscriptions: c.subs.len(),
            streams: MediaType::ALL
                .into_iter()
                .filter_map(|m| {
                    c.quality[m as usize].as_ref().map(|q| StreamInfo {
                        media: m,
                        quality: q.snapshot(m.clock_rate()),
                    })
                })
                .collect(),
        }
    }

    /// The room of client `ssid`.
    pub fn room_of(&self, ssid: u32) -> Option<&str> {
        let client = self.clients.get(&ssid)?;
        self.rooms.get(&client.room).map(|r| r.name.as_str())
    }

    /// Room names and their client counts.
    pub fn room_sizes(&self) -> impl Iterator<Item = (&str, usize)> + '_ {
        self.rooms.values().map(|r| (r.name.as_str(), r.members))
    }

    fn new_room(&mut self, name: &str) -> Option<u32> {
        if self.rooms.len() >= self.cfg.max_rooms {
            return None;
        }
        let mut room_id = self.next_room;
        while room_id == 0 || self.rooms.contains_key(&room_id) {
            room_id = room_id.wrapping_add(1);
        }
        self.next_room = room_id.wrapping_add(1);
        self.rooms.insert(
            room_id,
            Room {
                name: name.to_string(),
                members: 0,
                max_clients: self.cfg.max_clients_per_room,
                pinned: false,
            },
        );
        self.room_ids.insert(name.to_string(), room_id);
        Some(room_id)
    }

    /// Registered clients: (SSID, address).
    pub fn clients(&self) -> impl Iterator<Item = (u32, SocketAddr)> + '_ {
        self.clients.iter().map(|(s, c)| (*s, c.addr))
    }

    /// Selectors of client `ssid`.
    pub fn subscriptions(&self, ssid: u32) -> Option<&[Selector]> {
        self.clients.get(&ssid).map(|c| c.subs.as_slice())
    }

    /// Subscriber addresses of (`ssid`, `media`), sender excluded, in no
    /// particular order.
    pub fn subscribers(&self, ssid: u32, media: MediaType) -> &[SocketAddr] {
        self.routes
            .get(&ssid)
            .map(|r| r[media as usize].addrs.as_slice())
            .unwrap_or(&[])
    }

    /// Every route of a registered source: (SSID, media type, the source's
    /// address, its subscribers), for a data plane outside the core (the
    /// in-kernel fan-out). Echo is `config().echo`.
    pub fn routes(&self) -> impl Iterator<Item = (u32, MediaType, SocketAddr, &[SocketAddr])> + '_ {
        self.routes
            .iter()
            .filter(move |(ssid, _)| self.clients[ssid].publish)
            .flat_map(move |(&ssid, lists)| {
                let addr = self.clients[&ssid].addr;
                MediaType::ALL
                    .into_iter()
                    .map(move |m| (ssid, m, addr, lists[m as usize].addrs.as_slice()))
            })
    }

    /// Media of registered source `ssid` was forwarded outside the core (by
    /// the in-kernel fan-out, which checks the source's address itself)
    /// at `now`: the source is not idle.
    pub fn media_seen(&mut self, now: u64, ssid: u32) {
        if let Some(client) = self.clients.get_mut(&ssid) {
            client.last_seen = client.last_seen.max(now);
        }
    }

    /// Whether `data` from `peer` is media from a verified source: RTP whose
    /// SSRC is registered to `peer`, or RTP from an admitted static-room
    /// member. Changes nothing; the engine asks before it lets a packet
    /// take a slot of a per-flow structure (SRPIC).
    pub fn is_verified_media(&self, peer: SocketAddr, data: &[u8]) -> bool {
        let Ok(packet) = RtpPacket::new_checked(data) else {
            return false;
        };
        match self.clients.get(&packet.ssrc()) {
            Some(c) => c.addr == peer,
            None => {
                self.cfg.static_room
                    && !self.by_addr.contains_key(&peer)
                    && self.room.contains_key(&peer)
            }
        }
    }

    /// Handle one received datagram from `peer` at time `now` (ns).
    pub fn handle(&mut self, now: u64, peer: SocketAddr, data: &[u8]) -> Action<'_> {
        self.stats.rx_datagrams += 1;
        match classify(data) {
            Kind::Rtp => {
                self.stats.rx_rtp += 1;
                self.handle_rtp(now, peer, data)
            }
            Kind::Control => {
                self.stats.rx_control += 1;
                self.handle_control(now, peer, data)
            }
            Kind::Unknown => {
                self.stats.drop_malformed += 1;
                Action::Drop(DropReason::Malformed)
            }
        }
    }

    fn handle_rtp(&mut self, now: u64, peer: SocketAddr, data: &[u8]) -> Action<'_> {
        let Ok(packet) = RtpPacket::new_checked(data) else {
            self.stats.drop_malformed += 1;
            return Action::Drop(DropReason::Malformed);
        };
        let ssrc = packet.ssrc();
        let media = MediaType::from_payload_type(packet.payload_type());
        if let Some(client) = self.clients.get_mut(&ssrc) {
            if client.addr != peer {
                self.stats.drop_unverified += 1;
                return Action::Drop(DropReason::Unverified);
            }
            client.last_seen = now;
            let Some(media_info) = media else {
                self.stats.drop_unknown_pt += 1;
                return Action::Drop(DropReason::UnknownPayloadType);
            };
            if !client.publish {
                self.stats.drop_not_allowed += 1;
                return Action::Drop(DropReason::NotAllowed);
            }
            client.quality[media_info as usize]
                .get_or_insert_default()
                .record(
                    now,
                    packet.seq(),
                    packet.timestamp(),
                    data.len(),
                    media_info.clock_rate(),
                    self.cfg.late_after_ns,
                );
            // A fan-out order that rotates per packet: no subscriber is
            // always served last.
            self.scratch.clear();
            if let Some(list) = self
                .routes
                .get_mut(&ssrc)
                .map(|r| &mut r[media_info as usize])
            {
                let start = if list.addrs.is_empty() {
                    0
                } else {
                    list.first % list.addrs.len()
                };
                list.first = start + 1;
                self.scratch.extend_from_slice(&list.addrs[start..]);
                self.scratch.extend_from_slice(&list.addrs[..start]);
            }
            let targets = self.scratch.as_slice();
            self.stats.media_accepted += 1;
            self.stats.copies += targets.len() as u64;
            let echo = self.cfg.echo.then_some(peer);
            self.stats.echoes += echo.is_some() as u64;
            return Action::Forward {
                ssid: ssrc,
                media: Some(media_info),
                targets,
                echo,
            };
        }
        if self.by_addr.contains_key(&peer) {
            // A registered client sending under a foreign SSRC.
            self.stats.drop_unverified += 1;
            return Action::Drop(DropReason::Unverified);
        }
        if !self.cfg.static_room {
            self.stats.drop_unregistered += 1;
            return Action::Drop(DropReason::Unregistered);
        }
        let Some(target) = self.room.get_mut(&peer) else {
            // Not admitted: one CHALLENGE if it is no larger than the packet.
            self.stats.drop_not_admitted += 1;
            if data.len() >= CTRL_AUTH_LEN {
                return self.challenge(now, peer, 0);
            }
            return Action::Drop(DropReason::NotAdmitted);
        };
        *target = now;
        self.scratch.clear();
        self.scratch
            .extend(self.room_list.iter().copied().filter(|a| *a != peer));
        if !self.scratch.is_empty() {
            let start = self.room_first % self.scratch.len();
            self.room_first = start + 1;
            self.scratch.rotate_left(start);
        }
        self.stats.media_accepted += 1;
        self.stats.copies += self.scratch.len() as u64;
        let echo = self.cfg.echo.then_some(peer);
        self.stats.echoes += echo.is_some() as u64;
        Action::Forward {
            ssid: ssrc,
            media,
            targets: &self.scratch,
            echo,
        }
    }

    /// A reply to an address that has not proved it receives: subject to
    /// the per-prefix rate limit.
    fn limited(&mut self, now: u64, peer: SocketAddr) -> bool {
        if self.limiter.allow(peer.ip(), now) {
            false
        } else {
            self.stats.rate_limited += 1;
            true
        }
    }

    fn challenge(&mut self, now: u64, peer: SocketAddr, req: u32) -> Action<'_> {
        if self.limited(now, peer) {
            return Action::Drop(DropReason::RateLimited);
        }
        self.cookies.rotate(now, &mut self.rng);
        let cookie = self.cookies.make(peer);
        self.stats.challenges += 1;
        let len = wire::write_cookie(&mut self.reply, MsgType::Challenge, req, &cookie)
            .expect("reply buffer fits");
        Action::Reply {
            dst: peer,
            msg: &self.reply[..len],
        }
    }

    /// ERROR to `peer`; rate-limited unless `peer` is a verified client.
    fn error(
        &mut self,
        now: u64,
        peer: SocketAddr,
        req: u32,
        code: ErrorCode,
        ssid: u32,
    ) -> Action<'_> {
        let verified = self
            .by_addr
            .get(&peer)
            .is_some_and(|s| self.clients.contains_key(s));
        if !verified && self.limited(now, peer) {
            return Action::Drop(DropReason::RateLimited);
        }
        self.stats.errors_sent += 1;
        let len = wire::write_error(&mut self.reply, req, code, ssid).expect("reply buffer fits");
        Action::Reply {
            dst: peer,
            msg: &self.reply[..len],
        }
    }

    fn ack(&mut self, peer: SocketAddr, req: u32, ssid: u32, token: u64) -> Action<'_> {
        self.stats.acks += 1;
        let len = wire::write_auth(&mut self.reply, MsgType::Ack, req, ssid, token)
            .expect("reply buffer fits");
        Action::Reply {
            dst: peer,
            msg: &self.reply[..len],
        }
    }

    fn handle_control(&mut self, now: u64, peer: SocketAddr, data: &[u8]) -> Action<'_> {
        let control = match Control::new_checked(data) {
            Ok(control) => control,
            Err(e) => {
                self.stats.drop_malformed += 1;
                // Answer only when the reply is not larger than the request.
                if let (Some(req), true) = (e.request_id, data.len() >= CTRL_ERROR_LEN) {
                    return self.error(now, peer, req, ErrorCode::Malformed, 0);
                }
                return Action::Drop(DropReason::Malformed);
            }
        };
        let req = control.request_id();
        match control.msg_type() {
            MsgType::Ack | MsgType::Error | MsgType::Challenge => {
                self.stats.drop_unexpected_control += 1;
                Action::Drop(DropReason::UnexpectedControl)
            }
            MsgType::Register => {
                let cookie = control.cookie().expect("REGISTER has a cookie field");
                let room = control.room().unwrap_or(DEFAULT_ROOM.as_bytes());
                self.register(now, peer, req, &cookie, room, control.join_token())
            }
            MsgType::Rebind => {
                let cookie = control.cookie().expect("REBIND has a cookie field");
                self.rebind(now, peer, req, &cookie, control.ssid(), control.token())
            }
            MsgType::Join => {
                let cookie = control.cookie().expect("JOIN has a cookie field");
                self.join(now, peer, req, &cookie)
            }
            ty => {
                let ssid = control.ssid();
                let Some(client) = self.clients.get_mut(&ssid) else {
                    self.stats.drop_unknown_ssid += 1;
                    return self.error(now, peer, req, ErrorCode::UnknownSsid, ssid);
                };
                if client.token != control.token() {
                    self.stats.drop_bad_token += 1;
                    return self.error(now, peer, req, ErrorCode::BadToken, ssid);
                }
                if client.addr != peer {
                    self.stats.drop_wrong_address += 1;
                    return self.error(now, peer, req, ErrorCode::WrongAddress, ssid);
                }
                client.last_seen = now;
                if let Some(rtt) = control.echo_rtt_us() {
                    client.echo_rtt_us = Some(rtt);
                }
                let token = client.token;
                let may_subscribe = client.subscribe;
                match ty {
                    MsgType::Keepalive => self.ack(peer, req, ssid, token),
                    MsgType::Subscribe if !may_subscribe => {
                        self.stats.drop_not_allowed += 1;
                        self.error(now, peer, req, ErrorCode::NotAllowed, ssid)
                    }
                    MsgType::Leave => {
                        self.remove_client(ssid);
                        self.stats.leaves += 1;
                        self.ack(peer, req, ssid, token)
                    }
                    MsgType::Subscribe => {
                        let sels: Vec<Selector> = control.selectors().collect();
                        if self.subscribe(ssid, &sels) {
                            self.ack(peer, req, ssid, token)
                        } else {
                            self.stats.rejected_subscribe += 1;
                            self.error(now, peer, req, ErrorCode::TooManySubs, ssid)
                        }
                    }
                    MsgType::Unsubscribe => {
                        let sels: Vec<Selector> = control.selectors().collect();
                        self.unsubscribe(ssid, &sels);
                        self.ack(peer, req, ssid, token)
                    }
                    MsgType::Register
                    | MsgType::Join
                    | MsgType::Rebind
                    | MsgType::Ack
                    | MsgType::Error
                    | MsgType::Challenge => {
                        unreachable!("handled above")
                    }
                }
            }
        }
    }

    /// Is `cookie` valid for `peer` now? (Counts a wrong non-zero one.)
    fn cookie_ok(&mut self, now: u64, peer: SocketAddr, cookie: &[u8; COOKIE_LEN]) -> bool {
        self.cookies.rotate(now, &mut self.rng);
        if self.cookies.check(peer, cookie) {
            return true;
        }
        if cookie.iter().any(|&b| b != 0) {
            self.stats.drop_bad_cookie += 1;
        }
        false
    }

    /// Count a refused token; the ERROR to send.
    fn token_refused(&mut self, e: TokenError) -> ErrorCode {
        let stats = &mut self.stats;
        match e {
            TokenError::Missing => stats.token_missing += 1,
            TokenError::Malformed => stats.token_malformed += 1,
            TokenError::Forged => stats.token_forged += 1,
            TokenError::Expired => stats.token_expired += 1,
            TokenError::WrongRoom => stats.token_wrong_room += 1,
            TokenError::Revoked => stats.token_revoked += 1,
        }
        ErrorCode::Unauthorized
    }

    fn register(
        &mut self,
        now: u64,
        peer: SocketAddr,
        req: u32,
        cookie: &[u8; COOKIE_LEN],
        room: &[u8],
        join_token: Option<&[u8]>,
    ) -> Action<'_> {
        if !self.cookie_ok(now, peer, cookie) {
            return self.challenge(now, peer, req);
        }
        if let Some(&ssid) = self.by_addr.get(&peer) {
            // Retransmitted REGISTER: same answer.
            let client = self.clients.get_mut(&ssid).expect("index consistent");
            client.last_seen = now;
            let token = client.token;
            return self.ack(peer, req, ssid, token);
        }
        if self.clients.len() >= self.cfg.max_clients {
            self.stats.rejected_register += 1;
            return self.error(now, peer, req, ErrorCode::TooManyClients, 0);
        }
        let prefix = self.client_prefix(peer);
        if self.client_prefixes.get(&prefix).copied().unwrap_or(0)
            >= self.cfg.max_clients_per_prefix
        {
            self.stats.rejected_register += 1;
            self.stats.rejected_prefix += 1;
            return self.error(now, peer, req, ErrorCode::TooManyClients, 0);
        }
        // Rate-limited before the token is verified: a token flood from a
        // verified address costs at most the prefix rate in MACs.
        if self.limited(now, peer) {
            return Action::Drop(DropReason::RateLimited);
        }
        if !valid_room_name(room) {
            self.stats.rejected_no_room += 1;
            return self.error(now, peer, req, ErrorCode::NoSuchRoom, 0);
        }
        let room = std::str::from_utf8(room).expect("checked ASCII");
        let verified = match self.join_token(now, room, join_token) {
            Ok(verified) => verified,
            Err(e) => {
                let code = self.token_refused(e);
                return self.error(now, peer, req, code, 0);
            }
        };
        let Some(room_id) = self.room_to_join(room) else {
            self.stats.rejected_no_room += 1;
            return self.error(now, peer, req, ErrorCode::NoSuchRoom, 0);
        };
        let room_state = self.rooms.get_mut(&room_id).expect("index consistent");
        if room_state.members >= room_state.max_clients {
            self.stats.rejected_room_full += 1;
            return self.error(now, peer, req, ErrorCode::RoomFull, 0);
        }
        room_state.members += 1;
        let ssid = self.next_free_ssid();
        let token = self.rng.next_u64();
        // A static-room member that registers leaves the room (it proved
        // it owns the address).
        if self.room.remove(&peer).is_some() {
            self.room_list.retain(|a| *a != peer);
            uncount(&mut self.room_prefixes, prefix);
        }
        *self.client_prefixes.entry(prefix).or_insert(0) += 1;
        let (identity, token_id, publish, subscribe) = match verified {
            Some(token_check) => (
                Some(token_check.claims.sub),
                Some((token_check.id, token_check.claims.exp)),
                token_check.claims.publish,
                token_check.claims.subscribe,
            ),
            None => (None, None, true, true),
        };
        self.clients.insert(
            ssid,
            Client {
                addr: peer,
                token,
                last_seen: now,
                subs: Vec::new(),
                room: room_id,
                registered_at: now,
                identity,
                token_id,
                publish,
                subscribe,
                echo_rtt_us: None,
                quality: Default::default(),
            },
        );
        self.by_addr.insert(peer, ssid);
        let routes = self.routes_of_new_source(ssid, room_id);
        self.routes.insert(ssid, routes);
        self.stats.registrations += 1;
        self.ack(peer, req, ssid, token)
    }

    /// The join token a REGISTER for `room` carries, verified against the
    /// token key (and not revoked); `None` when the SFU takes no tokens.
    fn join_token(
        &self,
        now: u64,
        room: &str,
        join_token: Option<&[u8]>,
    ) -> Result<Option<token::Verified>, TokenError> {
        let Some(key) = &self.cfg.token_key else {
            return Ok(None);
        };
        let verified = token::verify(key, join_token.unwrap_or(&[]), room, self.unix_s(now))?;
        if self.revoked.contains_key(&verified.id) {
            return Err(TokenError::Revoked);
        }
        Ok(Some(verified))
    }

    /// The room a REGISTER joins: the one of that name, or a new one when
    /// rooms are created on demand (and the room limit allows).
    fn room_to_join(&mut self, room: &str) -> Option<u32> {
        match self.room_ids.get(room) {
            Some(&id) => Some(id),
            None if self.cfg.auto_create_rooms => self.new_room(room),
            None => None,
        }
    }

    /// The next SSID that is neither 0, nor "all sources", nor in use.
    fn next_free_ssid(&mut self) -> u32 {
        let mut ssid = self.next_ssid;
        while ssid == 0 || ssid == wire::ALL_SOURCES || self.clients.contains_key(&ssid) {
            ssid = ssid.wrapping_add(1);
        }
        self.next_ssid = ssid.wrapping_add(1);
        ssid
    }

    /// Routes of a new source: wildcard subscribers and those whose
    /// selectors already name this SSID, in its room.
    fn routes_of_new_source(&self, ssid: u32, room_id: u32) -> [RouteList; MediaType::COUNT] {
        let mut routes: [RouteList; MediaType::COUNT] = Default::default();
        for m in MediaType::ALL {
            for (&sub, &n) in &self.wildcard[m as usize] {
                let client = &self.clients[&sub];
                if n > 0 && sub != ssid && client.room == room_id {
                    routes[m as usize].insert(sub, client.addr);
                }
            }
            if let Some(explicit) = self.explicit.get(&ssid) {
                for (&sub, counts) in explicit {
                    let client = &self.clients[&sub];
                    if counts[m as usize] > 0 && sub != ssid && client.room == room_id {
                        routes[m as usize].insert(sub, client.addr);
                    }
                }
            }
        }
        routes
    }

    fn join(
        &mut self,
        now: u64,
        peer: SocketAddr,
        req: u32,
        cookie: &[u8; COOKIE_LEN],
    ) -> Action<'_> {
        if !self.cfg.static_room || self.by_addr.contains_key(&peer) {
            self.stats.drop_unexpected_control += 1;
            return Action::Drop(DropReason::UnexpectedControl);
        }
        if !self.cookie_ok(now, peer, cookie) {
            return self.challenge(now, peer, req);
        }
        if let Some(target) = self.room.get_mut(&peer) {
            *target = now;
        } else {
            if self.room.len() >= self.cfg.max_clients {
                self.stats.rejected_room += 1;
                return self.error(now, peer, req, ErrorCode::TooManyClients, 0);
            }
            let prefix = self.client_prefix(peer);
            let count = self.room_prefixes.entry(prefix).or_insert(0);
            if *count >= self.cfg.max_clients_per_prefix {
                self.stats.rejected_room += 1;
                self.stats.rejected_prefix += 1;
                return self.error(now, peer, req, ErrorCode::TooManyClients, 0);
            }
            *count += 1;
            self.room.insert(peer, now);
            self.room_list.push(peer);
            self.stats.joins += 1;
        }
        self.ack(peer, req, 0, 0)
    }

    /// REBIND: move session `ssid` to `peer` once `peer` proved it
    /// receives (cookie) and the request carries the session's token.
    fn rebind(
        &mut self,
        now: u64,
        peer: SocketAddr,
        req: u32,
        cookie: &[u8; COOKIE_LEN],
        ssid: u32,
        token: u64,
    ) -> Action<'_> {
        if !self.cookie_ok(now, peer, cookie) {
            return self.challenge(now, peer, req);
        }
        let Some(client) = self.clients.get(&ssid) else {
            self.stats.drop_unknown_ssid += 1;
            return self.error(now, peer, req, ErrorCode::UnknownSsid, ssid);
        };
        if client.token != token {
            self.stats.drop_bad_token += 1;
            return self.error(now, peer, req, ErrorCode::BadToken, ssid);
        }
        if client.addr == peer {
            return self.ack(peer, req, ssid, token);
        }
        if self.by_addr.contains_key(&peer) {
            // The new address is another client's: refuse.
            self.stats.drop_wrong_address += 1;
            return self.error(now, peer, req, ErrorCode::WrongAddress, ssid);
        }
        let old = client.addr;
        let (old_prefix, prefix) = (self.client_prefix(old), self.client_prefix(peer));
        if prefix != old_prefix
            && self.client_prefixes.get(&prefix).copied().unwrap_or(0)
                >= self.cfg.max_clients_per_prefix
        {
            // Moving there would put one prefix over its cap.
            self.stats.rejected_prefix += 1;
            return self.error(now, peer, req, ErrorCode::TooManyClients, ssid);
        }
        uncount(&mut self.client_prefixes, old_prefix);
        *self.client_prefixes.entry(prefix).or_insert(0) += 1;
        self.by_addr.remove(&old);
        self.by_addr.insert(peer, ssid);
        let client = self.clients.get_mut(&ssid).expect("present");
        client.addr = peer;
        client.last_seen = now;
        for lists in self.routes.values_mut() {
            for l in lists.iter_mut() {
                if let Some(&index) = l.pos.get(&ssid) {
                    l.addrs[index] = peer;
                }
            }
        }
        if self.room.remove(&peer).is_some() {
            self.room_list.retain(|a| *a != peer);
            uncount(&mut self.room_prefixes, prefix);
        }
        self.stats.rebinds += 1;
        self.ack(peer, req, ssid, token)
    }

    fn counts_of(&self, src: u32, sub: u32) -> Counts {
        self.explicit
            .get(&src)
            .and_then(|e| e.get(&sub))
            .copied()
            .unwrap_or_default()
    }

    /// Does subscriber `sub` want media `m` of source `src`?
    fn wants(&self, src: u32, sub: u32, m: MediaType) -> bool {
        src != sub
            && self.same_room(src, sub)
            && (self.wildcard[m as usize].get(&sub).is_some_and(|&n| n > 0)
                || self.counts_of(src, sub)[m as usize] > 0)
    }

    /// Both are registered, in one room.
    fn same_room(&self, a: u32, b: u32) -> bool {
        match (self.clients.get(&a), self.clients.get(&b)) {
            (Some(x), Some(y)) => x.room == y.room,
            _ => false,
        }
    }

    /// Count one selector of `sub` in (`add`) or out, and bring the route
    /// lists it touches in line.
    fn apply_selector(&mut self, sub: u32, sel: Selector, add: bool) {
        let addr = self.clients[&sub].addr;
        let sub_room = self.clients[&sub].room;
        for m in MediaType::ALL.into_iter().filter(|m| sel.media.matches(*m)) {
            let media_index = m as usize;
            self.work += 1;
            match sel.source {
                SourceSel::Ssid(src) => {
                    let before = self.wants(src, sub, m);
                    let explicit_set = self.explicit.entry(src).or_default();
                    let counts = explicit_set.entry(sub).or_default();
                    if add {
                        counts[media_index] += 1;
                    } else {
                        counts[media_index] = counts[media_index].saturating_sub(1);
                        if counts.iter().all(|&n| n == 0) {
                            explicit_set.remove(&sub);
                            if explicit_set.is_empty() {
                                self.explicit.remove(&src);
                            }
                        }
                    }
                    let after = self.wants(src, sub, m);
                    if before != after {
                        if let Some(lists) = self.routes.get_mut(&src) {
                            if after {
                                lists[media_index].insert(sub, addr);
                            } else {
                                lists[media_index].remove(sub);
                            }
                        }
                    }
                }
                SourceSel::All => {
                    let wildcard = self.wildcard[media_index].entry(sub).or_default();
                    let before = *wildcard > 0;
                    if add {
                        *wildcard += 1;
                    } else {
                        *wildcard = wildcard.saturating_sub(1);
                    }
                    let after = *wildcard > 0;
                    if !after {
                        self.wildcard[media_index].remove(&sub);
                    }
                    if before == after {
                        continue;
                    }
                    // Every source, except where an explicit selector keeps
                    // the route anyway.
                    for (&src, lists) in self.routes.iter_mut() {
                        self.work += 1;
                        if src == sub || self.clients[&src].room != sub_room {
                            continue;
                        }
                        let explicit = self
                            .explicit
                            .get(&src)
                            .and_then(|explicit_set| explicit_set.get(&sub))
                            .is_some_and(|c| c[media_index] > 0);
                        if explicit {
                            continue;
                        }
                        if after {
                            lists[media_index].insert(sub, addr);
                        } else {
                            lists[media_index].remove(sub);
                        }
                    }
                }
            }
        }
    }

    /// Add selectors to `ssid`; false (and no change) if that would exceed `max_subs`.
    fn subscribe(&mut self, ssid: u32, sels: &[Selector]) -> bool {
        let client = self.clients.get(&ssid).expect("checked by caller");
        let mut new: Vec<Selector> = Vec::new();
        for s in sels {
            if !client.subs.contains(s) && !new.contains(s) {
                new.push(*s);
            }
        }
        if client.subs.len() + new.len() > self.cfg.max_subs {
            return false;
        }
        for s in &new {
            self.apply_selector(ssid, *s, true);
        }
        self.clients
            .get_mut(&ssid)
            .expect("checked")
            .subs
            .extend_from_slice(&new);
        true
    }

    /// Remove selectors; `all:all` clears every subscription of the client.
    fn unsubscribe(&mut self, ssid: u32, sels: &[Selector]) {
        let client = self.clients.get_mut(&ssid).expect("checked by caller");
        let removed: Vec<Selector> = if sels.contains(&Selector::ALL) {
            std::mem::take(&mut client.subs)
        } else {
            let dropped: Vec<Selector> = client
                .subs
                .iter()
                .copied()
                .filter(|s| sels.contains(s))
                .collect();
            client.subs.retain(|s| !sels.contains(s));
            dropped
        };
        for s in removed {
            self.apply_selector(ssid, s, false);
        }
    }

    fn remove_client(&mut self, ssid: u32) {
        let Some(subs) = self.clients.get(&ssid).map(|client| client.subs.clone()) else {
            return;
        };
        for s in subs {
            self.apply_selector(ssid, s, false);
        }
        let client = self.clients.remove(&ssid).expect("present");
        self.by_addr.remove(&client.addr);
        self.routes.remove(&ssid);
        let prefix = self.client_prefix(client.addr);
        uncount(&mut self.client_prefixes, prefix);
        if let Some(room) = self.rooms.get_mut(&client.room) {
            room.members = room.members.saturating_sub(1);
            if room.members == 0 && !room.pinned {
                let name = std::mem::take(&mut room.name);
                self.rooms.remove(&client.room);
                self.room_ids.remove(&name);
            }
        }
    }

    /// The per-prefix cap's key of `peer`: its address cut to
    /// `client_prefix_v4` / `client_prefix_v6` bits (IPv4-mapped IPv6 as IPv4).
    fn client_prefix(&self, peer: SocketAddr) -> PrefixKey {
        // The top `len` bits of a `bits`-bit address.
        let mask = |bits: u32, len: u8| -> u128 {
            let keep = u32::from(len).min(bits);
            u128::MAX.checked_shl(bits - keep).unwrap_or(0) & (u128::MAX >> (128 - bits))
        };
        match peer.ip().to_canonical() {
            std::net::IpAddr::V4(v4) => (
                4,
                u128::from(u32::from(v4)) & mask(32, self.cfg.client_prefix_v4),
            ),
            std::net::IpAddr::V6(v6) => (6, u128::from(v6) & mask(128, self.cfg.client_prefix_v6)),
        }
    }

    /// Check internal consistency (tests): route lists hold exactly the
    /// registered subscribers whose selectors match, never the source
    /// itself, without duplicates; the selector counts match the selectors.
    pub fn check_invariants(&self) -> Result<(), String> {
        if self.clients.len() > self.cfg.max_clients || self.room.len() > self.cfg.max_clients {
            return Err("table over its bound".into());
        }
        if self.by_addr.len() != self.clients.len() || self.room_list.len() != self.room.len() {
            return Err("index out of sync".into());
        }
        let mut per_prefix: HashMap<PrefixKey, usize> = HashMap::new();
        for c in self.clients.values() {
            *per_prefix.entry(self.client_prefix(c.addr)).or_insert(0) += 1;
        }
        if per_prefix != self.client_prefixes
            || per_prefix
                .values()
                .any(|&n| n > self.cfg.max_clients_per_prefix)
        {
            return Err("per-prefix client counts out of sync or over the cap".into());
        }
        let mut per_prefix: HashMap<PrefixKey, usize> = HashMap::new();
        for a in self.room.keys() {
            *per_prefix.entry(self.client_prefix(*a)).or_insert(0) += 1;
        }
        if per_prefix != self.room_prefixes {
            return Err("per-prefix room counts out of sync".into());
        }
        if self.rooms.len() != self.room_ids.len()
            || self.rooms.values().map(|r| r.members).sum::<usize>() != self.clients.len()
            || self
                .clients
                .values()
                .any(|c| !self.rooms.contains_key(&c.room))
            || self.rooms.iter().any(|(id, r)| {
                self.room_ids.get(&r.name) != Some(id) || (r.members == 0 && !r.pinned)
            })
        {
            return Err("room table out of sync".into());
        }
        if self.clients.keys().any(|k| !self.routes.contains_key(k))
            || self.routes.len() != self.clients.len()
        {
            return Err("registered clients and route tables differ".into());
        }
        // Recount every selector.
        let mut explicit: HashMap<(u32, u32), Counts> = HashMap::new();
        let mut wildcard: HashMap<(usize, u32), u16> = HashMap::new();
        for (&sub, c) in &self.clients {
            for s in &c.subs {
                for m in MediaType::ALL.into_iter().filter(|m| s.media.matches(*m)) {
                    match s.source {
                        SourceSel::Ssid(src) => {
                            explicit.entry((src, sub)).or_default()[m as usize] += 1
                        }
                        SourceSel::All => *wildcard.entry((m as usize, sub)).or_default() += 1,
                    }
                }
            }
        }
        let stored: usize = self.explicit.values().map(|e| e.len()).sum();
        if stored != explicit.len()
            || explicit
                .iter()
                .any(|(&(src, sub), c)| self.counts_of(src, sub) != *c)
        {
            return Err("explicit selector counts differ".into());
        }
        let stored: usize = self.wildcard.iter().map(|w| w.len()).sum();
        if stored != wildcard.len()
            || wildcard
                .iter()
                .any(|(&(m, sub), &n)| self.wildcard[m].get(&sub) != Some(&n))
        {
            return Err("wildcard selector counts differ".into());
        }
        for (&src, lists) in &self.routes {
            for m in MediaType::ALL {
                let list = &lists[m as usize];
                if list.addrs.len() != list.ssids.len() || list.pos.len() != list.ssids.len() {
                    return Err(format!("route list of {src} out of sync"));
                }
                for (i, (&sub, a)) in list.ssids.iter().zip(&list.addrs).enumerate() {
                    if list.pos.get(&sub) != Some(&i) || list.ssids[..i].contains(&sub) {
                        return Err(format!("bad index or duplicate in routes of {src}"));
                    }
                    match self.clients.get(&sub) {
                        Some(c) if c.addr == *a => {}
                        _ => return Err(format!("unregistered {a} in routes of {src}")),
                    }
                    if !self.wants(src, sub, m) {
                        return Err(format!("{a} routed from {src} without a selector"));
                    }
                }
                for &sub in self.clients.keys() {
                    if self.wants(src, sub, m) && !list.pos.contains_key(&sub) {
                        return Err(format!("subscriber {sub} missing from routes of {src}"));
                    }
                }
            }
        }
        Ok(())
    }

    /// Remove clients and static-room members silent for longer than the
    /// idle timeout; returns how many were removed.
    pub fn tick(&mut self, now: u64) -> usize {
        self.cookies.rotate(now, &mut self.rng);
        let unix = self.unix_s(now);
        self.revoked.retain(|_, exp| *exp > unix);
        let limit = self.cfg.idle_timeout_ns;
        let idle: Vec<u32> = self
            .clients
            .iter()
            .filter(|(_, c)| now.saturating_sub(c.last_seen) > limit)
            .map(|(s, _)| *s)
            .collect();
        for s in &idle {
            self.remove_client(*s);
        }
        let before = self.room.len();
        let gone: Vec<SocketAddr> = self
            .room
            .iter()
            .filter(|(_, t)| now.saturating_sub(**t) > limit)
            .map(|(a, _)| *a)
            .collect();
        for a in &gone {
            self.room.remove(a);
            let prefix = self.client_prefix(*a);
            uncount(&mut self.room_prefixes, prefix);
        }
        if self.room.len() != before {
            let room = &self.room;
            self.room_list.retain(|a| room.contains_key(a));
        }
        let removed = idle.len() + before - self.room.len();
        self.stats.timeouts += removed as u64;
        removed
    }
}

/// A source prefix of the per-prefix client cap: (IP version, masked address).
type PrefixKey = (u8, u128);

/// Count one member of `prefix` out (the entry goes at 0).
fn uncount(counts: &mut HashMap<PrefixKey, usize>, prefix: PrefixKey) {
    if let Some(count) = counts.get_mut(&prefix) {
        *count -= 1;
        if *count == 0 {
            counts.remove(&prefix);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::token::{mint, Claims};
    use crate::wire::{
        write_auth, write_cookie, write_rebind, write_register, write_register_v2, write_rtp,
        write_subscribe, RtpHeader,
    };

    fn addr(p: u16) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], p))
    }

    /// The CHALLENGE's cookie from a reply, if it is one.
    fn cookie_of(a: &Action<'_>) -> Option<[u8; COOKIE_LEN]> {
        match a {
            Action::Reply { msg, .. } => {
                let c = Control::new_checked(msg).ok()?;
                (c.msg_type() == MsgType::Challenge).then(|| c.cookie().unwrap())
            }
            _ => None,
        }
    }

    /// REGISTER twice (first without, then with the cookie) at time `now`.
    fn register_at(sfu: &mut Sfu, now: u64, a: SocketAddr) -> (u32, u64) {
        let mut b = [0u8; 64];
        let n = write_register(&mut b, 1).unwrap();
        let first = sfu.handle(now, a, &b[..n]);
        let cookie = cookie_of(&first).expect("a first REGISTER earns a CHALLENGE");
        assert_eq!(sfu.stats().clients as usize, sfu.clients.len());
        let n = write_cookie(&mut b, MsgType::Register, 1, &cookie).unwrap();
        match sfu.handle(now, a, &b[..n]) {
            Action::Reply { msg, .. } => {
                let c = Control::new_checked(msg).unwrap();
                assert_eq!(c.msg_type(), MsgType::Ack);
                (c.ssid(), c.token())
            }
            other => panic!("{other:?}"),
        }
    }

    fn register(sfu: &mut Sfu, a: SocketAddr) -> (u32, u64) {
        register_at(sfu, 0, a)
    }

    fn sub(sfu: &mut Sfu, a: SocketAddr, id: (u32, u64), ty: MsgType, s: &str) -> MsgType {
        let mut b = [0u8; 64];
        let sels: Vec<Selector> = s.split(',').map(|x| x.parse().unwrap()).collect();
        let n = write_subscribe(&mut b, ty, 2, id.0, id.1, &sels).unwrap();
        match sfu.handle(0, a, &b[..n]) {
            Action::Reply { msg, .. } => Control::new_checked(msg).unwrap().msg_type(),
            other => panic!("{other:?}"),
        }
    }

    fn rtp(ssrc: u32, m: MediaType) -> Vec<u8> {
        let mut b = vec![0u8; 100];
        let h = RtpHeader {
            payload_type: m.payload_type(),
            marker: false,
            seq: 1,
            timestamp: 0,
            ssrc,
        };
        let n = write_rtp(&mut b, &h, Some(5), 100).unwrap();
        b.truncate(n);
        b
    }

    /// Targets (sorted) and whether an echo goes back.
    fn targets(sfu: &mut Sfu, a: SocketAddr, p: &[u8]) -> Option<(Vec<SocketAddr>, bool)> {
        match sfu.handle(1, a, p) {
            Action::Forward { targets, echo, .. } => {
                let mut t = targets.to_vec();
                t.sort();
                Some((t, echo.is_some()))
            }
            _ => None,
        }
    }

    #[test]
    fn selective_forwarding() {
        let mut sfu = Sfu::new(SfuConfig::default());
        let (a, b, c) = (addr(1), addr(2), addr(3));
        let ia = register(&mut sfu, a);
        let ib = register(&mut sfu, b);
        let ic = register(&mut sfu, c);
        assert_ne!(ia.0, ib.0);
        assert_eq!(
            sub(
                &mut sfu,
                a,
                ia,
                MsgType::Subscribe,
                &format!("{}:asq", ib.0)
            ),
            MsgType::Ack
        );
        assert_eq!(
            sub(&mut sfu, c, ic, MsgType::Subscribe, "all"),
            MsgType::Ack
        );
        assert_eq!(
            targets(&mut sfu, b, &rtp(ib.0, MediaType::Asq)),
            Some((vec![a, c], true))
        );
        assert_eq!(
            targets(&mut sfu, b, &rtp(ib.0, MediaType::Vsq)),
            Some((vec![c], true))
        );
        assert_eq!(
            targets(&mut sfu, c, &rtp(ic.0, MediaType::Asq)),
            Some((vec![], true))
        );
        assert_eq!(
            targets(&mut sfu, a, &rtp(ia.0, MediaType::Vhq)),
            Some((vec![c], true))
        );
        // spoofed address / unregistered
        assert_eq!(targets(&mut sfu, a, &rtp(ib.0, MediaType::Asq)), None);
        assert_eq!(targets(&mut sfu, addr(9), &rtp(ib.0, MediaType::Asq)), None);
        assert_eq!(targets(&mut sfu, addr(9), &rtp(999, MediaType::Asq)), None);
        let s = sfu.stats();
        assert_eq!((s.drop_unverified, s.drop_unregistered), (2, 1));
        assert!(sfu.is_verified_media(b, &rtp(ib.0, MediaType::Asq)));
        assert!(!sfu.is_verified_media(a, &rtp(ib.0, MediaType::Asq)));
        assert!(!sfu.is_verified_media(addr(9), &rtp(999, MediaType::Asq)));
        // unsubscribe
        assert_eq!(
            sub(
                &mut sfu,
                a,
                ia,
                MsgType::Unsubscribe,
                &format!("{}:asq", ib.0)
            ),
            MsgType::Ack
        );
        assert_eq!(
            targets(&mut sfu, b, &rtp(ib.0, MediaType::Asq)),
            Some((vec![c], true))
        );
        // a newcomer is picked up by "all"
        let d = addr(4);
        let id = register(&mut sfu, d);
        assert_eq!(
            targets(&mut sfu, d, &rtp(id.0, MediaType::Asq)),
            Some((vec![c], true))
        );
        // leave removes c everywhere
        let mut m = [0u8; 32];
        let n = write_auth(&mut m, MsgType::Leave, 3, ic.0, ic.1).unwrap();
        assert!(matches!(sfu.handle(2, c, &m[..n]), Action::Reply { .. }));
        assert_eq!(
            targets(&mut sfu, d, &rtp(id.0, MediaType::Asq)),
            Some((vec![], true))
        );
        assert_eq!(sfu.stats().clients, 3);
        sfu.check_invariants().unwrap();
    }

    /// The fan-out order rotates per packet: over n packets each of the n
    /// subscribers is served first once (and last once), and every packet
    /// still goes to all of them.
    #[test]
    fn fan_out_order_rotates_so_no_subscriber_is_always_last() {
        let mut sfu = Sfu::new(SfuConfig::default());
        let members: Vec<SocketAddr> = (1..=4).map(addr).collect();
        let ids: Vec<(u32, u64)> = members.iter().map(|&a| register(&mut sfu, a)).collect();
        for (&a, &id) in members.iter().zip(&ids).skip(1) {
            assert_eq!(
                sub(&mut sfu, a, id, MsgType::Subscribe, "all"),
                MsgType::Ack
            );
        }
        let mut firsts = Vec::new();
        let mut lasts = Vec::new();
        for _ in 0..3 {
            match sfu.handle(1, members[0], &rtp(ids[0].0, MediaType::Asq)) {
                Action::Forward { targets, .. } => {
                    let mut sorted = targets.to_vec();
                    sorted.sort();
                    assert_eq!(sorted, members[1..].to_vec());
                    firsts.push(targets[0]);
                    lasts.push(targets[targets.len() - 1]);
                }
                other => panic!("{other:?}"),
            }
        }
        firsts.sort();
        lasts.sort();
        assert_eq!(firsts, members[1..].to_vec(), "each served first once");
        assert_eq!(lasts, members[1..].to_vec(), "each served last once");
        sfu.check_invariants().unwrap();
    }

    #[test]
    fn subscription_to_a_future_source_and_overlapping_selectors() {
        let mut sfu = Sfu::new(SfuConfig::default());
        let (a, b) = (addr(1), addr(2));
        let ia = register(&mut sfu, a);
        // a names SSID ia.0 + 1 (the next one) before it exists, and also
        // subscribes to all audio: one copy, not two.
        let next = ia.0 + 1;
        for s in [format!("{next}:asq"), "all:asq".into(), format!("{next}")] {
            assert_eq!(sub(&mut sfu, a, ia, MsgType::Subscribe, &s), MsgType::Ack);
        }
        let ib = register(&mut sfu, b);
        assert_eq!(ib.0, next);
        assert_eq!(sfu.subscribers(ib.0, MediaType::Asq), &[a]);
        assert_eq!(sfu.subscribers(ib.0, MediaType::Vhq), &[a]);
        // Dropping the wildcard keeps the explicit route, and the other way round.
        assert_eq!(
            sub(&mut sfu, a, ia, MsgType::Unsubscribe, "all:asq"),
            MsgType::Ack
        );
        assert_eq!(sfu.subscribers(ib.0, MediaType::Asq), &[a]);
        assert_eq!(
            sub(
                &mut sfu,
                a,
                ia,
                MsgType::Unsubscribe,
                &format!("{next}:asq,{next}")
            ),
            MsgType::Ack
        );
        assert!(sfu.subscribers(ib.0, MediaType::Asq).is_empty());
        sfu.check_invariants().unwrap();
    }

    #[test]
    fn bad_token_wrong_addr_limits_and_timeout() {
        let cfg = SfuConfig {
            max_clients: 2,
            max_subs: 1,
            idle_timeout_ns: 100,
            echo: false,
            ..Default::default()
        };
        let mut sfu = Sfu::new(cfg);
        let ia = register(&mut sfu, addr(1));
        let ib = register(&mut sfu, addr(2));
        let mut b = [0u8; 64];
        let n = write_register(&mut b, 7).unwrap();
        let cookie = cookie_of(&sfu.handle(0, addr(3), &b[..n])).unwrap();
        let n = write_cookie(&mut b, MsgType::Register, 7, &cookie).unwrap();
        let Action::Reply { msg, .. } = sfu.handle(0, addr(3), &b[..n]) else {
            panic!()
        };
        assert_eq!(
            Control::new_checked(msg).unwrap().error_code(),
            Some(ErrorCode::TooManyClients)
        );
        let bad = (ia.0, ia.1 ^ 1);
        assert_eq!(
            sub(&mut sfu, addr(1), bad, MsgType::Subscribe, "all"),
            MsgType::Error
        );
        assert_eq!(
            sub(&mut sfu, addr(2), ia, MsgType::Subscribe, "all"),
            MsgType::Error
        );
        assert_eq!(
            sub(&mut sfu, addr(1), ia, MsgType::Subscribe, "all:asq,all:vsq"),
            MsgType::Error
        );
        assert_eq!(
            sub(&mut sfu, addr(1), ia, MsgType::Subscribe, "all:asq"),
            MsgType::Ack
        );
        let s = sfu.stats();
        assert_eq!(
            (s.drop_bad_token, s.drop_wrong_address, s.rejected_subscribe),
            (1, 1, 1)
        );
        assert_eq!(
            targets(&mut sfu, addr(2), &rtp(ib.0, MediaType::Asq)),
            Some((vec![addr(1)], false))
        );
        // b stays alive through media, a goes silent
        assert!(targets(&mut sfu, addr(2), &rtp(ib.0, MediaType::Vsq)).is_some());
        sfu.handle(150, addr(2), &rtp(ib.0, MediaType::Vsq));
        assert_eq!(sfu.tick(150), 1);
        assert_eq!(sfu.subscribers(ib.0, MediaType::Asq), &[] as &[SocketAddr]);
        assert!(sfu.subscriptions(ia.0).is_none());
        // ACK/ERROR/CHALLENGE sent to the SFU are never answered
        let n = write_auth(&mut b, MsgType::Ack, 1, ib.0, ib.1).unwrap();
        assert_eq!(
            sfu.handle(151, addr(2), &b[..n]),
            Action::Drop(DropReason::UnexpectedControl)
        );
        let n = write_cookie(&mut b, MsgType::Challenge, 1, &cookie).unwrap();
        assert_eq!(
            sfu.handle(151, addr(2), &b[..n]),
            Action::Drop(DropReason::UnexpectedControl)
        );
        assert_eq!(
            sfu.handle(151, addr(2), b"hello"),
            Action::Drop(DropReason::Malformed)
        );
        sfu.check_invariants().unwrap();
    }

    /// A spoofed REGISTER (the attacker never sees the CHALLENGE) changes
    /// nothing; a cookie works only for the address it was made for and
    /// expires; a registration costs exactly one CHALLENGE and one ACK.
    #[test]
    fn register_needs_the_cookie_of_its_own_address() {
        let p = 1_000_000_000;
        let mut sfu = Sfu::new(SfuConfig {
            cookie_period_ns: p,
            ..Default::default()
        });
        let mut b = [0u8; 64];
        let n = write_register(&mut b, 1).unwrap();
        let victim = addr(40);
        let c = cookie_of(&sfu.handle(0, victim, &b[..n])).unwrap();
        assert_eq!(sfu.stats().clients, 0, "a CHALLENGE allocates nothing");
        // The cookie from another address, a forged one, or an expired one.
        for (who, cookie, at) in [
            (addr(41), c, 0),
            (victim, [7u8; COOKIE_LEN], 0),
            (victim, c, 2 * p + 1),
        ] {
            let n = write_cookie(&mut b, MsgType::Register, 1, &cookie).unwrap();
            let r = sfu.handle(at, who, &b[..n]);
            assert!(cookie_of(&r).is_some(), "{r:?}");
        }
        assert_eq!(sfu.stats().clients, 0);
        assert_eq!(sfu.stats().drop_bad_cookie, 3);
        // Within its lifetime (made at 3 s, echoed one epoch later) it works.
        let c2 = cookie_of(&sfu.handle(3 * p, victim, &write_register_buf())).unwrap();
        let n = write_cookie(&mut b, MsgType::Register, 1, &c2).unwrap();
        assert!(matches!(
            sfu.handle(4 * p + 5, victim, &b[..n]),
            Action::Reply { msg, .. } if Control::new_checked(msg).unwrap().msg_type() == MsgType::Ack
        ));
        assert_eq!(sfu.stats().clients, 1);
        sfu.check_invariants().unwrap();
    }

    fn write_register_buf() -> Vec<u8> {
        let mut b = vec![0u8; CTRL_AUTH_LEN];
        write_register(&mut b, 1).unwrap();
        b
    }

    /// Review S15: one host with many ports cannot fill `max_clients`: a
    /// prefix holds at most `max_clients_per_prefix` clients (and static-room
    /// members); other hosts still get in.
    #[test]
    fn one_prefix_cannot_fill_the_client_table() {
        let mut sfu = Sfu::new(SfuConfig {
            max_clients: 1024,
            max_clients_per_prefix: 16,
            ..Default::default()
        });
        let host = |ip: [u8; 4], port: u16| SocketAddr::from((ip, port));
        let try_register = |sfu: &mut Sfu, now: u64, a: SocketAddr| -> MsgType {
            let mut b = [0u8; 64];
            let n = write_register(&mut b, 1).unwrap();
            let cookie = cookie_of(&sfu.handle(now, a, &b[..n])).unwrap();
            let n = write_cookie(&mut b, MsgType::Register, 1, &cookie).unwrap();
            match sfu.handle(now, a, &b[..n]) {
                Action::Reply { msg, .. } => Control::new_checked(msg).unwrap().msg_type(),
                other => panic!("{other:?}"),
            }
        };
        let mut accepted = 0;
        for port in 0..100u16 {
            let now = u64::from(port) * 1_000_000_000;
            match try_register(&mut sfu, now, host([198, 51, 100, 7], 10_000 + port)) {
                MsgType::Ack => accepted += 1,
                MsgType::Error => {}
                other => panic!("{other:?}"),
            }
            sfu.check_invariants().unwrap();
        }
        assert_eq!(accepted, 16);
        let s = sfu.stats();
        assert_eq!((s.clients, s.rejected_prefix), (16, 84));
        // Another address (its own /32) still registers.
        assert_eq!(
            try_register(&mut sfu, 200_000_000_000, host([198, 51, 100, 8], 5000)),
            MsgType::Ack
        );
        // A client that leaves by timeout frees its slot.
        sfu.tick(200_000_000_000 + 11_000_000_000);
        sfu.check_invariants().unwrap();
        assert_eq!(sfu.stats().clients, 0);
        assert_eq!(
            try_register(&mut sfu, 300_000_000_000, host([198, 51, 100, 7], 9)),
            MsgType::Ack
        );
        // Keyed by /24 when configured: the neighbour shares the cap.
        let mut sfu = Sfu::new(SfuConfig {
            max_clients_per_prefix: 1,
            client_prefix_v4: 24,
            ..Default::default()
        });
        assert_eq!(
            try_register(&mut sfu, 0, host([198, 51, 100, 7], 1)),
            MsgType::Ack
        );
        assert_eq!(
            try_register(&mut sfu, 1_000_000_000, host([198, 51, 100, 9], 1)),
            MsgType::Error
        );
        assert_eq!(
            try_register(&mut sfu, 2_000_000_000, host([198, 51, 101, 9], 1)),
            MsgType::Ack
        );
        // IPv6 by /56.
        let v6 = |text: &str| SocketAddr::new(text.parse().unwrap(), 5004);
        assert_eq!(
            try_register(&mut sfu, 3_000_000_000, v6("2001:db8:0:100::1")),
            MsgType::Ack
        );
        assert_eq!(
            try_register(&mut sfu, 4_000_000_000, v6("2001:db8:0:1ff::2")),
            MsgType::Error,
            "same /56"
        );
        assert_eq!(
            try_register(&mut sfu, 5_000_000_000, v6("2001:db8:0:200::1")),
            MsgType::Ack
        );
    }

    /// A flood of REGISTERs from many spoofed sources (zero and forged
    /// cookies) neither fills the client table nor evicts a registered
    /// client or a static-room member; every request gets at most one reply
    /// no larger than itself, and the replies per prefix are rate-limited.
    #[test]
    fn register_flood_from_spoofed_sources() {
        let mut sfu = Sfu::new(SfuConfig {
            max_clients: 8,
            static_room: true,
            ..Default::default()
        });
        let member = register(&mut sfu, addr(1));
        // A static-room member (admitted through its cookie).
        let room_addr = addr(2);
        let n_rtp = rtp(77, MediaType::Asq);
        let cookie = cookie_of(&sfu.handle(0, room_addr, &n_rtp)).unwrap();
        let mut b = [0u8; 64];
        let n = write_cookie(&mut b, MsgType::Join, 5, &cookie).unwrap();
        assert!(matches!(
            sfu.handle(0, room_addr, &b[..n]),
            Action::Reply { .. }
        ));
        assert_eq!(sfu.stats().room_members, 1);
        let mut replies = 0u64;
        let mut x = 0x1234_5678u64;
        for i in 0..20_000u32 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            // Random sources, some of them the member's and the room's own addresses.
            let src = match i % 50 {
                0 => addr(1),
                1 => room_addr,
                _ => SocketAddr::from(((x as u32).to_be_bytes(), (x >> 32) as u16)),
            };
            let n = if i % 2 == 0 {
                write_register(&mut b, i).unwrap()
            } else {
                let forged: [u8; COOKIE_LEN] = std::array::from_fn(|k| (x >> (k % 8 * 8)) as u8);
                write_cookie(&mut b, MsgType::Register, i, &forged).unwrap()
            };
            if let Action::Reply { msg, dst } = sfu.handle(u64::from(i) * 1000, src, &b[..n]) {
                replies += 1;
                assert_eq!(dst, src);
                assert!(msg.len() <= n, "reply larger than its request");
                assert_eq!(
                    Control::new_checked(msg).unwrap().msg_type(),
                    MsgType::Challenge
                );
            }
        }
        let s = sfu.stats();
        assert_eq!(s.clients, 1, "the flood registered nobody");
        assert_eq!(s.room_members, 1, "nor evicted the room member");
        assert!(replies <= 20_000);
        assert!(s.rate_limited > 0, "the same prefixes were limited: {s:?}");
        // The member is still there with its identity, and the table is usable.
        let mut m = [0u8; 32];
        let n = write_auth(&mut m, MsgType::Keepalive, 9, member.0, member.1).unwrap();
        assert!(matches!(
            sfu.handle(30_000_000_000, addr(1), &m[..n]),
            Action::Reply { .. }
        ));
        register_at(&mut sfu, 30_000_000_000, addr(3));
        assert_eq!(sfu.stats().clients, 2);
        assert!(sfu.is_verified_media(room_addr, &n_rtp));
        sfu.check_invariants().unwrap();
    }

    /// The static room latches nobody without the return-routability check:
    /// a spoofed RTP packet from a victim's address earns one CHALLENGE (no
    /// larger than the packet) and no media; a JOIN with the cookie admits.
    #[test]
    fn static_room_requires_return_routability() {
        let cfg = SfuConfig {
            static_room: true,
            echo: true,
            ..Default::default()
        };
        let mut sfu = Sfu::new(cfg);
        let p = rtp(1234, MediaType::Asq);
        let join = |sfu: &mut Sfu, a: SocketAddr| {
            let cookie = cookie_of(&sfu.handle(0, a, &p)).expect("a CHALLENGE");
            let mut b = [0u8; 32];
            let n = write_cookie(&mut b, MsgType::Join, 1, &cookie).unwrap();
            let r = sfu.handle(0, a, &b[..n]);
            assert!(
                matches!(r, Action::Reply { msg, .. } if Control::new_checked(msg).unwrap().msg_type() == MsgType::Ack),
                "{r:?}"
            );
        };
        join(&mut sfu, addr(1));
        join(&mut sfu, addr(2));
        assert_eq!(targets(&mut sfu, addr(1), &p), Some((vec![addr(2)], true)));
        // The victim never sent anything; the attacker spoofs its address.
        let victim = addr(66);
        let r = sfu.handle(1, victim, &p);
        match r {
            Action::Reply { dst, msg } => {
                assert_eq!(dst, victim);
                assert!(msg.len() <= p.len());
            }
            other => panic!("{other:?}"),
        }
        // Not latched: members' media does not go to the victim, no echo.
        assert_eq!(targets(&mut sfu, addr(1), &p), Some((vec![addr(2)], true)));
        assert!(!sfu.is_verified_media(victim, &p));
        // A JOIN spoofed from the victim with a cookie made for another address fails.
        let other_cookie = cookie_of(&sfu.handle(1, addr(3), &p)).unwrap();
        let mut b = [0u8; 32];
        let n = write_cookie(&mut b, MsgType::Join, 1, &other_cookie).unwrap();
        assert!(cookie_of(&sfu.handle(1, victim, &b[..n])).is_some());
        assert_eq!(sfu.stats().room_members, 2);
        // An RTP packet shorter than a CHALLENGE gets nothing back at all.
        let mut small = [0u8; 16];
        let h = RtpHeader {
            payload_type: 96,
            marker: false,
            seq: 1,
            timestamp: 0,
            ssrc: 1234,
        };
        let n = write_rtp(&mut small, &h, None, 16).unwrap();
        assert_eq!(
            sfu.handle(1, victim, &small[..n]),
            Action::Drop(DropReason::NotAdmitted)
        );
        assert_eq!(sfu.stats().drop_not_admitted, 5);
        sfu.check_invariants().unwrap();
    }

    /// SUBSCRIBE/UNSUBSCRIBE cost what they change: with 600 clients that
    /// each hold 60 selectors, one client alternating `all` / unsubscribe
    /// `all` touches each source a bounded number of times, and a selector
    /// naming one source costs a constant, however many subscriptions exist.
    #[test]
    fn subscription_changes_do_not_scale_with_clients_times_subscriptions() {
        const N: usize = 600;
        const S: usize = 60;
        let mut sfu = Sfu::new(SfuConfig {
            max_clients: N,
            // Every client is on 127.0.0.1 here.
            max_clients_per_prefix: N,
            max_subs: S + 2,
            echo: false,
            prefix_burst: 10_000,
            ..Default::default()
        });
        let ids: Vec<(u32, u64)> = (0..N)
            .map(|i| register(&mut sfu, addr(1000 + i as u16)))
            .collect();
        let mut b = vec![0u8; 2048];
        for (i, id) in ids.iter().enumerate() {
            let sels: Vec<Selector> = (1..=S)
                .map(|k| Selector {
                    source: SourceSel::Ssid(ids[(i + k) % N].0),
                    media: crate::wire::MediaSel::All,
                })
                .collect();
            let n = write_subscribe(&mut b, MsgType::Subscribe, 2, id.0, id.1, &sels).unwrap();
            assert!(matches!(
                sfu.handle(0, addr(1000 + i as u16), &b[..n]),
                Action::Reply { .. }
            ));
        }
        let a = addr(1000);
        let before = sfu.work;
        for _ in 0..10 {
            assert_eq!(
                sub(&mut sfu, a, ids[0], MsgType::Subscribe, "all"),
                MsgType::Ack
            );
            assert_eq!(
                sub(&mut sfu, a, ids[0], MsgType::Unsubscribe, "all"),
                MsgType::Ack
            );
        }
        let per_pair = (sfu.work - before) / 10;
        // all/all: 3 media types × (N sources + 1) each way.
        assert!(
            per_pair <= 2 * 3 * (N as u64 + 1) + 2 * S as u64 * 3,
            "{per_pair} steps"
        );
        // One explicit selector: constant work.
        let before = sfu.work;
        let one = format!("{}:asq", ids[N / 2].0);
        assert_eq!(
            sub(&mut sfu, a, ids[0], MsgType::Subscribe, &one),
            MsgType::Ack
        );
        assert_eq!(
            sub(&mut sfu, a, ids[0], MsgType::Unsubscribe, &one),
            MsgType::Ack
        );
        assert!(sfu.work - before <= 4, "{} steps", sfu.work - before);
        sfu.check_invariants().unwrap();
    }

    /// The reply to `msg` from `a`: (type, error code, ssid, token).
    fn ask(
        sfu: &mut Sfu,
        now: u64,
        a: SocketAddr,
        msg: &[u8],
    ) -> (MsgType, Option<ErrorCode>, u32, u64) {
        match sfu.handle(now, a, msg) {
            Action::Reply { msg, .. } => {
                let c = Control::new_checked(msg).unwrap();
                (c.msg_type(), c.error_code(), c.ssid(), c.token())
            }
            other => panic!("{other:?}"),
        }
    }

    /// REGISTER v2 for `room` with `token`, the cookie exchange included.
    fn join_room(
        sfu: &mut Sfu,
        now: u64,
        a: SocketAddr,
        room: &str,
        token: &str,
    ) -> (MsgType, Option<ErrorCode>, u32, u64) {
        let mut b = vec![0u8; 2048];
        let n = write_register_v2(
            &mut b,
            1,
            &[0; COOKIE_LEN],
            room.as_bytes(),
            token.as_bytes(),
        )
        .unwrap();
        let cookie = cookie_of(&sfu.handle(now, a, &b[..n])).expect("challenge");
        let n = write_register_v2(&mut b, 2, &cookie, room.as_bytes(), token.as_bytes()).unwrap();
        ask(sfu, now, a, &b[..n])
    }

    const T0: u64 = 1_700_000_000;

    fn keyed() -> (Sfu, TokenKey) {
        let key = TokenKey::new(vec![3u8; 32]).unwrap();
        let mut sfu = Sfu::new(SfuConfig {
            token_key: Some(key.clone()),
            ..Default::default()
        });
        sfu.set_unix_time(0, T0 * 1_000_000_000);
        (sfu, key)
    }

    fn claims(room: &str, who: &str, exp: u64) -> Claims {
        Claims {
            room: room.into(),
            sub: who.into(),
            exp,
            nbf: None,
            iat: Some(T0),
            publish: true,
            subscribe: true,
        }
    }

    /// Rooms isolate media: "all" in room a never reaches room b, and an
    /// explicit selector naming a source of another room routes nothing.
    #[test]
    fn rooms_isolate_media() {
        let mut sfu = Sfu::new(SfuConfig::default());
        let ids: Vec<(u32, u64)> = ["a", "a", "b"]
            .iter()
            .enumerate()
            .map(|(i, r)| {
                let (t, _, ssid, token) = join_room(&mut sfu, 0, addr(10 + i as u16), r, "");
                assert_eq!(t, MsgType::Ack);
                (ssid, token)
            })
            .collect();
        for (i, id) in ids.iter().enumerate() {
            assert_eq!(
                sub(
                    &mut sfu,
                    addr(10 + i as u16),
                    *id,
                    MsgType::Subscribe,
                    "all"
                ),
                MsgType::Ack
            );
        }
        let x = format!("{}", ids[0].0);
        assert_eq!(
            sub(&mut sfu, addr(12), ids[2], MsgType::Subscribe, &x),
            MsgType::Ack
        );
        assert_eq!(
            targets(&mut sfu, addr(10), &rtp(ids[0].0, MediaType::Asq)),
            Some((vec![addr(11)], true))
        );
        assert_eq!(
            targets(&mut sfu, addr(12), &rtp(ids[2].0, MediaType::Asq)),
            Some((vec![], true))
        );
        assert_eq!(sfu.room_of(ids[2].0), Some("b"));
        assert_eq!(sfu.stats().rooms, 2);
        // v1 REGISTER lands in "default".
        let v1 = register(&mut sfu, addr(20));
        assert_eq!(sfu.room_of(v1.0), Some(DEFAULT_ROOM));
        sfu.check_invariants().unwrap();
        // The last member leaving removes an auto-created room.
        let mut m = [0u8; 32];
        let n = write_auth(&mut m, MsgType::Leave, 3, ids[2].0, ids[2].1).unwrap();
        sfu.handle(1, addr(12), &m[..n]);
        assert_eq!(sfu.stats().rooms, 2);
        sfu.check_invariants().unwrap();
    }

    #[test]
    fn room_limits_and_admin_rooms() {
        let mut sfu = Sfu::new(SfuConfig {
            max_clients_per_room: 2,
            max_rooms: 2,
            auto_create_rooms: false,
            ..Default::default()
        });
        assert_eq!(
            join_room(&mut sfu, 0, addr(1), "jam", "").1,
            Some(ErrorCode::NoSuchRoom)
        );
        sfu.create_room("jam", Some(5)).unwrap();
        assert_eq!(sfu.create_room("jam", None), Err(RoomError::Exists));
        assert_eq!(sfu.create_room("bad name", None), Err(RoomError::BadName));
        sfu.create_room("two", None).unwrap();
        assert_eq!(sfu.create_room("three", None), Err(RoomError::TooManyRooms));
        assert_eq!(join_room(&mut sfu, 0, addr(1), "jam", "").0, MsgType::Ack);
        assert_eq!(join_room(&mut sfu, 0, addr(2), "jam", "").0, MsgType::Ack);
        assert_eq!(
            join_room(&mut sfu, 0, addr(3), "jam", "").1,
            Some(ErrorCode::RoomFull)
        );
        assert_eq!(sfu.stats().rejected_room_full, 1);
        assert_eq!(sfu.close_room("jam"), Ok(2));
        assert_eq!(sfu.stats().clients, 0);
        assert_eq!(sfu.close_room("jam"), Err(RoomError::NoSuchRoom));
        sfu.check_invariants().unwrap();
    }

    /// With a key: a token is needed; forged, expired, wrong-room and
    /// revoked (replayed after a kick) tokens are refused and counted.
    #[test]
    fn join_tokens_checked() {
        let (mut sfu, key) = keyed();
        let good = mint(&key, &claims("jam", "alice", T0 + 60));
        let r = join_room(&mut sfu, 0, addr(1), "jam", "");
        assert_eq!(r.1, Some(ErrorCode::Unauthorized));
        let other = TokenKey::new(vec![4u8; 32]).unwrap();
        let forged = mint(&other, &claims("jam", "alice", T0 + 60));
        assert_eq!(
            join_room(&mut sfu, 0, addr(1), "jam", &forged).1,
            Some(ErrorCode::Unauthorized)
        );
        let expired = mint(&key, &claims("jam", "alice", T0 - 1));
        assert_eq!(
            join_room(&mut sfu, 0, addr(1), "jam", &expired).1,
            Some(ErrorCode::Unauthorized)
        );
        assert_eq!(
            join_room(&mut sfu, 0, addr(1), "other", &good).1,
            Some(ErrorCode::Unauthorized)
        );
        // v1 REGISTER has no token: refused.
        let mut b = [0u8; 64];
        let n = write_register(&mut b, 1).unwrap();
        let cookie = cookie_of(&sfu.handle(0, addr(1), &b[..n])).unwrap();
        let n = write_cookie(&mut b, MsgType::Register, 1, &cookie).unwrap();
        assert_eq!(
            ask(&mut sfu, 0, addr(1), &b[..n]).1,
            Some(ErrorCode::Unauthorized)
        );
        let s = sfu.stats();
        assert_eq!(
            (
                s.token_missing,
                s.token_forged,
                s.token_expired,
                s.token_wrong_room,
                s.clients
            ),
            (2, 1, 1, 1, 0)
        );
        let (t, _, ssid, _) = join_room(&mut sfu, 0, addr(1), "jam", &good);
        assert_eq!(t, MsgType::Ack);
        let info = sfu.rooms_info(0);
        assert_eq!(info[0].clients[0].identity.as_deref(), Some("alice"));
        // Kicked: media stops, and the same token is refused from anywhere.
        assert!(targets(&mut sfu, addr(1), &rtp(ssid, MediaType::Asq)).is_some());
        assert!(sfu.kick(ssid));
        assert!(targets(&mut sfu, addr(1), &rtp(ssid, MediaType::Asq)).is_none());
        assert_eq!(
            join_room(&mut sfu, 0, addr(1), "jam", &good).1,
            Some(ErrorCode::Unauthorized)
        );
        assert_eq!(
            join_room(&mut sfu, 0, addr(5), "jam", &good).1,
            Some(ErrorCode::Unauthorized)
        );
        assert_eq!(sfu.stats().token_revoked, 2);
        // A new token for the same identity is the operator's decision: accepted.
        let fresh = mint(&key, &claims("jam", "alice", T0 + 61));
        assert_eq!(
            join_room(&mut sfu, 0, addr(1), "jam", &fresh).0,
            MsgType::Ack
        );
        // The revocation is forgotten once the token has expired anyway.
        sfu.set_unix_time(0, (T0 + 100) * 1_000_000_000);
        sfu.tick(1);
        assert_eq!(sfu.stats().revoked, 0);
        sfu.check_invariants().unwrap();
    }

    #[test]
    fn rights_from_the_token() {
        let (mut sfu, key) = keyed();
        let mut listener = claims("jam", "bob", T0 + 60);
        listener.publish = false;
        let mut mute = claims("jam", "carol", T0 + 60);
        mute.subscribe = false;
        let (_, _, lb, lt) = join_room(&mut sfu, 0, addr(1), "jam", &mint(&key, &listener));
        let (_, _, cs, ct) = join_room(&mut sfu, 0, addr(2), "jam", &mint(&key, &mute));
        assert_eq!(
            sub(&mut sfu, addr(1), (lb, lt), MsgType::Subscribe, "all"),
            MsgType::Ack
        );
        assert_eq!(
            sub(&mut sfu, addr(2), (cs, ct), MsgType::Subscribe, "all"),
            MsgType::Error
        );
        assert_eq!(
            sfu.handle(1, addr(1), &rtp(lb, MediaType::Asq)),
            Action::Drop(DropReason::NotAllowed)
        );
        assert_eq!(
            targets(&mut sfu, addr(2), &rtp(cs, MediaType::Asq)),
            Some((vec![addr(1)], true))
        );
        assert_eq!(sfu.stats().drop_not_allowed, 2);
    }

    /// NAT rebinding: the new address proves it receives (cookie) and
    /// knows the session token; only then do media and routes move. A
    /// guessed token, or a cookie of another address, moves nothing.
    #[test]
    fn rebind_moves_a_session_and_cannot_be_hijacked() {
        let mut sfu = Sfu::new(SfuConfig::default());
        let (a, b, new, evil) = (addr(1), addr(2), addr(3), addr(4));
        let ia = register(&mut sfu, a);
        let ib = register(&mut sfu, b);
        assert_eq!(
            sub(&mut sfu, b, ib, MsgType::Subscribe, "all"),
            MsgType::Ack
        );
        assert_eq!(
            sub(&mut sfu, a, ia, MsgType::Subscribe, "all"),
            MsgType::Ack
        );
        // a's NAT rebinds to `new`: its media is unverified there.
        assert!(targets(&mut sfu, new, &rtp(ia.0, MediaType::Asq)).is_none());
        let mut m = [0u8; 64];
        let n = write_rebind(&mut m, 1, &[0; COOKIE_LEN], ia.0, ia.1).unwrap();
        let cookie = cookie_of(&sfu.handle(0, new, &m[..n])).expect("challenge first");
        // The attacker has a cookie for its own address but not the token.
        let n = write_rebind(&mut m, 1, &[0; COOKIE_LEN], ia.0, 0).unwrap();
        let evil_cookie = cookie_of(&sfu.handle(0, evil, &m[..n])).unwrap();
        let n = write_rebind(&mut m, 1, &evil_cookie, ia.0, ia.1 ^ 1).unwrap();
        assert_eq!(ask(&mut sfu, 0, evil, &m[..n]).1, Some(ErrorCode::BadToken));
        // A cookie stolen from `new` does not work from `evil`.
        let n = write_rebind(&mut m, 1, &cookie, ia.0, ia.1).unwrap();
        assert_eq!(ask(&mut sfu, 0, evil, &m[..n]).0, MsgType::Challenge);
        assert_eq!(sfu.stats().rebinds, 0);
        // The real client completes it.
        assert_eq!(ask(&mut sfu, 0, new, &m[..n]).0, MsgType::Ack);
        assert_eq!(sfu.stats().rebinds, 1);
        assert_eq!(
            targets(&mut sfu, b, &rtp(ib.0, MediaType::Asq)),
            Some((vec![new], true))
        );
        assert_eq!(
            targets(&mut sfu, new, &rtp(ia.0, MediaType::Asq)),
            Some((vec![b], true))
        );
        assert!(targets(&mut sfu, a, &rtp(ia.0, MediaType::Asq)).is_none());
        // Rebinding onto another client's address is refused.
        let n = write_rebind(&mut m, 1, &[0; COOKIE_LEN], ia.0, ia.1).unwrap();
        let cb = cookie_of(&sfu.handle(0, b, &m[..n])).unwrap();
        let n = write_rebind(&mut m, 1, &cb, ia.0, ia.1).unwrap();
        assert_eq!(
            ask(&mut sfu, 0, b, &m[..n]).1,
            Some(ErrorCode::WrongAddress)
        );
        sfu.check_invariants().unwrap();
    }

    #[test]
    fn per_stream_quality_in_the_room_view() {
        let mut sfu = Sfu::new(SfuConfig::default());
        let ia = register(&mut sfu, addr(1));
        for (i, seq) in [0u16, 1, 3, 2, 5].into_iter().enumerate() {
            let mut p = rtp(ia.0, MediaType::Asq);
            p[2..4].copy_from_slice(&seq.to_be_bytes());
            p[4..8].copy_from_slice(&(u32::from(seq) * 960).to_be_bytes());
            sfu.handle(i as u64 * 20_000_000, addr(1), &p);
        }
        let info = sfu.rooms_info(100_000_000);
        let st = &info[0].clients[0].streams[0];
        assert_eq!(st.media, MediaType::Asq);
        assert_eq!(
            (st.quality.packets, st.quality.lost, st.quality.reordered),
            (5, 1, 1)
        );
        assert!(st.quality.jitter_ms > 0.0);
    }

    proptest::proptest! {
        /// Random control and media traffic from a few addresses (with
        /// guessed and stolen SSIDs/tokens/cookies, timeouts) keeps the
        /// tables consistent and never answers with more bytes than it got.
        #[test]
        fn random_traffic_keeps_tables_consistent(
            ops in proptest::collection::vec((0u8..13, 0u16..6, 0u32..8, proptest::bool::ANY, 0u8..4), 1..200)
        ) {
            let mut sfu = Sfu::new(SfuConfig {
                max_clients: 4,
                max_subs: 3,
                idle_timeout_ns: 50,
                static_room: true,
                ..Default::default()
            });
            let mut known: Vec<(u32, u64)> = Vec::new();
            let mut cookies: HashMap<u16, [u8; COOKIE_LEN]> = HashMap::new();
            let mut now = 0u64;
            let mut b = [0u8; 128];
            for (op, port, pick, good, m) in ops {
                now += 7;
                let a = addr(port);
                let (ssid, token) = known.get(pick as usize % known.len().max(1)).copied().unwrap_or((pick, 0));
                let token = if good { token } else { token ^ 0x55 };
                let media = MediaType::from_code(m % 3).unwrap();
                let sel = if m == 3 { Selector::ALL } else { Selector { source: SourceSel::Ssid(ssid), media: crate::wire::MediaSel::One(media) } };
                // A cookie this address earned, or one stolen from another.
                let cookie = if good { cookies.get(&port) } else { cookies.get(&((port + 1) % 6)) }
                    .copied().unwrap_or([0; COOKIE_LEN]);
                let n = match op {
                    0 => write_register(&mut b, 1).unwrap(),
                    1 => write_subscribe(&mut b, MsgType::Subscribe, 1, ssid, token, &[sel]).unwrap(),
                    2 => write_subscribe(&mut b, MsgType::Unsubscribe, 1, ssid, token, &[sel]).unwrap(),
                    3 => write_auth(&mut b, MsgType::Keepalive, 1, ssid, token).unwrap(),
                    4 => write_auth(&mut b, MsgType::Leave, 1, ssid, token).unwrap(),
                    5 => { sfu.tick(now); continue; }
                    7 => write_cookie(&mut b, MsgType::Register, 1, &cookie).unwrap(),
                    8 => write_cookie(&mut b, MsgType::Join, 1, &cookie).unwrap(),
                    10 => write_register_v2(&mut b, 1, &cookie, if m % 2 == 0 { b"a" } else { b"b" }, b"").unwrap(),
                    11 => write_rebind(&mut b, 1, &cookie, ssid, token).unwrap(),
                    12 => { sfu.kick(ssid); continue; }
                    _ => {
                        let p = rtp(ssid, media);
                        b[..p.len()].copy_from_slice(&p);
                        p.len()
                    }
                };
                if let Action::Reply { msg, dst } = sfu.handle(now, a, &b[..n]) {
                    let c = Control::new_checked(msg).unwrap();
                    // Never a reply larger than the request (no amplification).
                    proptest::prop_assert!(msg.len() <= n);
                    proptest::prop_assert_eq!(dst, a);
                    if c.msg_type() == MsgType::Challenge {
                        cookies.insert(port, c.cookie().unwrap());
                    }
                    if (op == 7 || op == 10) && c.msg_type() == MsgType::Ack {
                        known.push((c.ssid(), c.token()));
                    }
                }
                if let Err(e) = sfu.check_invariants() {
                    return Err(proptest::test_runner::TestCaseError::fail(e));
                }
            }
        }
    }
}
