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
use crate::wire::{
    self, classify, Control, ErrorCode, Kind, MediaType, MsgType, RtpPacket, Selector, SourceSel,
    COOKIE_LEN, CTRL_AUTH_LEN, CTRL_ERROR_LEN,
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
}

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
}

#[derive(Debug)]
struct Client {
    addr: SocketAddr,
    token: u64,
    last_seen: u64,
    /// Selectors (a set: no duplicates), at most `max_subs`.
    subs: Vec<Selector>,
}

/// Subscriber addresses of one (source, media type), with an index for
/// O(1) insertion and removal (order is not kept).
#[derive(Debug, Default)]
struct RouteList {
    addrs: Vec<SocketAddr>,
    ssids: Vec<u32>,
    pos: HashMap<u32, usize>,
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
        let Some(i) = self.pos.remove(&ssid) else {
            return;
        };
        self.addrs.swap_remove(i);
        self.ssids.swap_remove(i);
        if let Some(&moved) = self.ssids.get(i) {
            self.pos.insert(moved, i);
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
        }
    }

    /// Settings.
    pub fn config(&self) -> &SfuConfig {
        &self.cfg
    }

    /// Counters (with current table sizes).
    pub fn stats(&self) -> SfuStats {
        let mut s = self.stats;
        s.clients = self.clients.len() as u64;
        s.room_members = self.room.len() as u64;
        s
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
        self.routes.iter().flat_map(move |(&ssid, lists)| {
            let addr = self.clients[&ssid].addr;
            MediaType::ALL
                .into_iter()
                .map(move |m| (ssid, m, addr, lists[m as usize].addrs.as_slice()))
        })
    }

    /// Whether `data` from `peer` is media from a verified source: RTP whose
    /// SSRC is registered to `peer`, or RTP from an admitted static-room
    /// member. Changes nothing; the engine asks before it lets a packet
    /// take a slot of a per-flow structure (SRPIC).
    pub fn is_verified_media(&self, peer: SocketAddr, data: &[u8]) -> bool {
        let Ok(p) = RtpPacket::new_checked(data) else {
            return false;
        };
        match self.clients.get(&p.ssrc()) {
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
        let Ok(p) = RtpPacket::new_checked(data) else {
            self.stats.drop_malformed += 1;
            return Action::Drop(DropReason::Malformed);
        };
        let ssrc = p.ssrc();
        let media = MediaType::from_payload_type(p.payload_type());
        if let Some(c) = self.clients.get_mut(&ssrc) {
            if c.addr != peer {
                self.stats.drop_unverified += 1;
                return Action::Drop(DropReason::Unverified);
            }
            c.last_seen = now;
            let Some(m) = media else {
                self.stats.drop_unknown_pt += 1;
                return Action::Drop(DropReason::UnknownPayloadType);
            };
            let targets = self
                .routes
                .get(&ssrc)
                .map(|r| r[m as usize].addrs.as_slice())
                .unwrap_or(&[]);
            self.stats.media_accepted += 1;
            self.stats.copies += targets.len() as u64;
            let echo = self.cfg.echo.then_some(peer);
            self.stats.echoes += echo.is_some() as u64;
            return Action::Forward {
                ssid: ssrc,
                media: Some(m),
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
        let Some(t) = self.room.get_mut(&peer) else {
            // Not admitted: one CHALLENGE if it is no larger than the packet.
            self.stats.drop_not_admitted += 1;
            if data.len() >= CTRL_AUTH_LEN {
                return self.challenge(now, peer, 0);
            }
            return Action::Drop(DropReason::NotAdmitted);
        };
        *t = now;
        self.scratch.clear();
        self.scratch
            .extend(self.room_list.iter().copied().filter(|a| *a != peer));
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
        let n = wire::write_cookie(&mut self.reply, MsgType::Challenge, req, &cookie)
            .expect("reply buffer fits");
        Action::Reply {
            dst: peer,
            msg: &self.reply[..n],
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
        let n = wire::write_error(&mut self.reply, req, code, ssid).expect("reply buffer fits");
        Action::Reply {
            dst: peer,
            msg: &self.reply[..n],
        }
    }

    fn ack(&mut self, peer: SocketAddr, req: u32, ssid: u32, token: u64) -> Action<'_> {
        self.stats.acks += 1;
        let n = wire::write_auth(&mut self.reply, MsgType::Ack, req, ssid, token)
            .expect("reply buffer fits");
        Action::Reply {
            dst: peer,
            msg: &self.reply[..n],
        }
    }

    fn handle_control(&mut self, now: u64, peer: SocketAddr, data: &[u8]) -> Action<'_> {
        let c = match Control::new_checked(data) {
            Ok(c) => c,
            Err(e) => {
                self.stats.drop_malformed += 1;
                // Answer only when the reply is not larger than the request.
                if let (Some(req), true) = (e.request_id, data.len() >= CTRL_ERROR_LEN) {
                    return self.error(now, peer, req, ErrorCode::Malformed, 0);
                }
                return Action::Drop(DropReason::Malformed);
            }
        };
        let req = c.request_id();
        match c.msg_type() {
            MsgType::Ack | MsgType::Error | MsgType::Challenge => {
                self.stats.drop_unexpected_control += 1;
                Action::Drop(DropReason::UnexpectedControl)
            }
            MsgType::Register => {
                let cookie = c.cookie().expect("REGISTER has a cookie field");
                self.register(now, peer, req, &cookie)
            }
            MsgType::Join => {
                let cookie = c.cookie().expect("JOIN has a cookie field");
                self.join(now, peer, req, &cookie)
            }
            ty => {
                let ssid = c.ssid();
                let Some(cl) = self.clients.get_mut(&ssid) else {
                    self.stats.drop_unknown_ssid += 1;
                    return self.error(now, peer, req, ErrorCode::UnknownSsid, ssid);
                };
                if cl.token != c.token() {
                    self.stats.drop_bad_token += 1;
                    return self.error(now, peer, req, ErrorCode::BadToken, ssid);
                }
                if cl.addr != peer {
                    self.stats.drop_wrong_address += 1;
                    return self.error(now, peer, req, ErrorCode::WrongAddress, ssid);
                }
                cl.last_seen = now;
                let token = cl.token;
                match ty {
                    MsgType::Keepalive => self.ack(peer, req, ssid, token),
                    MsgType::Leave => {
                        self.remove_client(ssid);
                        self.stats.leaves += 1;
                        self.ack(peer, req, ssid, token)
                    }
                    MsgType::Subscribe => {
                        let sels: Vec<Selector> = c.selectors().collect();
                        if self.subscribe(ssid, &sels) {
                            self.ack(peer, req, ssid, token)
                        } else {
                            self.stats.rejected_subscribe += 1;
                            self.error(now, peer, req, ErrorCode::TooManySubs, ssid)
                        }
                    }
                    MsgType::Unsubscribe => {
                        let sels: Vec<Selector> = c.selectors().collect();
                        self.unsubscribe(ssid, &sels);
                        self.ack(peer, req, ssid, token)
                    }
                    MsgType::Register
                    | MsgType::Join
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

    fn register(
        &mut self,
        now: u64,
        peer: SocketAddr,
        req: u32,
        cookie: &[u8; COOKIE_LEN],
    ) -> Action<'_> {
        if !self.cookie_ok(now, peer, cookie) {
            return self.challenge(now, peer, req);
        }
        if let Some(&ssid) = self.by_addr.get(&peer) {
            // Retransmitted REGISTER: same answer.
            let c = self.clients.get_mut(&ssid).expect("index consistent");
            c.last_seen = now;
            let token = c.token;
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
        if self.limited(now, peer) {
            return Action::Drop(DropReason::RateLimited);
        }
        let mut ssid = self.next_ssid;
        while ssid == 0 || ssid == wire::ALL_SOURCES || self.clients.contains_key(&ssid) {
            ssid = ssid.wrapping_add(1);
        }
        self.next_ssid = ssid.wrapping_add(1);
        let token = self.rng.next_u64();
        // A static-room member that registers leaves the room (it proved
        // it owns the address).
        if self.room.remove(&peer).is_some() {
            self.room_list.retain(|a| *a != peer);
            uncount(&mut self.room_prefixes, prefix);
        }
        *self.client_prefixes.entry(prefix).or_insert(0) += 1;
        self.clients.insert(
            ssid,
            Client {
                addr: peer,
                token,
                last_seen: now,
                subs: Vec::new(),
            },
        );
        self.by_addr.insert(peer, ssid);
        // Routes of the new source: wildcard subscribers and those whose
        // selectors already name this SSID.
        let mut r: [RouteList; MediaType::COUNT] = Default::default();
        for m in MediaType::ALL {
            for (&sub, &n) in &self.wildcard[m as usize] {
                if n > 0 && sub != ssid {
                    r[m as usize].insert(sub, self.clients[&sub].addr);
                }
            }
            if let Some(ex) = self.explicit.get(&ssid) {
                for (&sub, counts) in ex {
                    if counts[m as usize] > 0 && sub != ssid {
                        r[m as usize].insert(sub, self.clients[&sub].addr);
                    }
                }
            }
        }
        self.routes.insert(ssid, r);
        self.stats.registrations += 1;
        self.ack(peer, req, ssid, token)
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
        if let Some(t) = self.room.get_mut(&peer) {
            *t = now;
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
            && (self.wildcard[m as usize].get(&sub).is_some_and(|&n| n > 0)
                || self.counts_of(src, sub)[m as usize] > 0)
    }

    /// Count one selector of `sub` in (`add`) or out, and bring the route
    /// lists it touches in line.
    fn apply_selector(&mut self, sub: u32, sel: Selector, add: bool) {
        let addr = self.clients[&sub].addr;
        for m in MediaType::ALL.into_iter().filter(|m| sel.media.matches(*m)) {
            let mi = m as usize;
            self.work += 1;
            match sel.source {
                SourceSel::Ssid(src) => {
                    let before = self.wants(src, sub, m);
                    let e = self.explicit.entry(src).or_default();
                    let counts = e.entry(sub).or_default();
                    if add {
                        counts[mi] += 1;
                    } else {
                        counts[mi] = counts[mi].saturating_sub(1);
                        if counts.iter().all(|&n| n == 0) {
                            e.remove(&sub);
                            if e.is_empty() {
                                self.explicit.remove(&src);
                            }
                        }
                    }
                    let after = self.wants(src, sub, m);
                    if before != after {
                        if let Some(lists) = self.routes.get_mut(&src) {
                            if after {
                                lists[mi].insert(sub, addr);
                            } else {
                                lists[mi].remove(sub);
                            }
                        }
                    }
                }
                SourceSel::All => {
                    let w = self.wildcard[mi].entry(sub).or_default();
                    let before = *w > 0;
                    if add {
                        *w += 1;
                    } else {
                        *w = w.saturating_sub(1);
                    }
                    let after = *w > 0;
                    if !after {
                        self.wildcard[mi].remove(&sub);
                    }
                    if before == after {
                        continue;
                    }
                    // Every source, except where an explicit selector keeps
                    // the route anyway.
                    for (&src, lists) in self.routes.iter_mut() {
                        self.work += 1;
                        if src == sub {
                            continue;
                        }
                        let explicit = self
                            .explicit
                            .get(&src)
                            .and_then(|e| e.get(&sub))
                            .is_some_and(|c| c[mi] > 0);
                        if explicit {
                            continue;
                        }
                        if after {
                            lists[mi].insert(sub, addr);
                        } else {
                            lists[mi].remove(sub);
                        }
                    }
                }
            }
        }
    }

    /// Add selectors to `ssid`; false (and no change) if that would exceed `max_subs`.
    fn subscribe(&mut self, ssid: u32, sels: &[Selector]) -> bool {
        let c = self.clients.get(&ssid).expect("checked by caller");
        let mut new: Vec<Selector> = Vec::new();
        for s in sels {
            if !c.subs.contains(s) && !new.contains(s) {
                new.push(*s);
            }
        }
        if c.subs.len() + new.len() > self.cfg.max_subs {
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
        let c = self.clients.get_mut(&ssid).expect("checked by caller");
        let removed: Vec<Selector> = if sels.contains(&Selector::ALL) {
            std::mem::take(&mut c.subs)
        } else {
            let r: Vec<Selector> = c
                .subs
                .iter()
                .copied()
                .filter(|s| sels.contains(s))
                .collect();
            c.subs.retain(|s| !sels.contains(s));
            r
        };
        for s in removed {
            self.apply_selector(ssid, s, false);
        }
    }

    fn remove_client(&mut self, ssid: u32) {
        let Some(subs) = self.clients.get(&ssid).map(|c| c.subs.clone()) else {
            return;
        };
        for s in subs {
            self.apply_selector(ssid, s, false);
        }
        let c = self.clients.remove(&ssid).expect("present");
        self.by_addr.remove(&c.addr);
        self.routes.remove(&ssid);
        let prefix = self.client_prefix(c.addr);
        uncount(&mut self.client_prefixes, prefix);
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
                let l = &lists[m as usize];
                if l.addrs.len() != l.ssids.len() || l.pos.len() != l.ssids.len() {
                    return Err(format!("route list of {src} out of sync"));
                }
                for (i, (&sub, a)) in l.ssids.iter().zip(&l.addrs).enumerate() {
                    if l.pos.get(&sub) != Some(&i) || l.ssids[..i].contains(&sub) {
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
                    if self.wants(src, sub, m) && !l.pos.contains_key(&sub) {
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
        let n = idle.len() + before - self.room.len();
        self.stats.timeouts += n as u64;
        n
    }
}

/// A source prefix of the per-prefix client cap: (IP version, masked address).
type PrefixKey = (u8, u128);

/// Count one member of `prefix` out (the entry goes at 0).
fn uncount(counts: &mut HashMap<PrefixKey, usize>, prefix: PrefixKey) {
    if let Some(n) = counts.get_mut(&prefix) {
        *n -= 1;
        if *n == 0 {
            counts.remove(&prefix);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{
        write_auth, write_cookie, write_register, write_rtp, write_subscribe, RtpHeader,
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

    proptest::proptest! {
        /// Random control and media traffic from a few addresses (with
        /// guessed and stolen SSIDs/tokens/cookies, timeouts) keeps the
        /// tables consistent and never answers with more bytes than it got.
        #[test]
        fn random_traffic_keeps_tables_consistent(
            ops in proptest::collection::vec((0u8..10, 0u16..6, 0u32..8, proptest::bool::ANY, 0u8..4), 1..200)
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
                    if op == 7 && c.msg_type() == MsgType::Ack {
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
