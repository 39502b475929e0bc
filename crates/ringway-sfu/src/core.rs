//! The forwarding core: client and subscription tables, verified-source
//! checks, replication targets, static-room latching and idle timeouts.
//!
//! Sans-IO: [`Sfu::handle`] takes one received datagram (sender address,
//! bytes, `now` in ns on any monotonic clock) and returns an [`Action`]: the
//! addresses to send copies of the same bytes to, a control reply to send,
//! or a counted drop. [`Sfu::tick`] expires idle clients.

use crate::wire::{
    self, classify, Control, ErrorCode, Kind, MediaType, MsgType, RtpPacket, Selector, SourceSel,
    CTRL_ERROR_LEN,
};
use std::collections::HashMap;
use std::net::SocketAddr;

/// SFU settings.
#[derive(Clone, Debug)]
pub struct SfuConfig {
    /// Send every accepted media packet back to its sender (RTT measurement).
    pub echo: bool,
    /// Admit plain RTP senders by address (latching) into one static room.
    pub static_room: bool,
    /// Most registered clients (and, separately, static-room members).
    pub max_clients: usize,
    /// Most subscription selectors per client.
    pub max_subs: usize,
    /// Remove clients silent for longer than this (ns).
    pub idle_timeout_ns: u64,
    /// Seed for token generation (give real entropy in production).
    pub seed: u64,
}

impl Default for SfuConfig {
    fn default() -> Self {
        SfuConfig {
            echo: true,
            static_room: false,
            max_clients: 1024,
            max_subs: 64,
            idle_timeout_ns: 10_000_000_000,
            seed: 0x5eed,
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
    /// Control reply (ACK/ERROR) sent to the SFU: never answered.
    UnexpectedControl,
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
    /// Send `msg` to `dst` (an ACK or ERROR).
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
    /// Unexpected ACK/ERROR received (ignored).
    pub drop_unexpected_control: u64,
    /// Registrations refused (table full).
    pub rejected_register: u64,
    /// Subscriptions refused (too many selectors).
    pub rejected_subscribe: u64,
    /// Static-room senders refused (room full).
    pub rejected_room: u64,
    /// Successful registrations (new SSIDs).
    pub registrations: u64,
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
    subs: Vec<Selector>,
}

/// The SFU forwarding core.
#[derive(Debug)]
pub struct Sfu {
    cfg: SfuConfig,
    clients: HashMap<u32, Client>,
    by_addr: HashMap<SocketAddr, u32>,
    /// Per source SSID and media type: subscriber addresses.
    routes: HashMap<u32, [Vec<SocketAddr>; MediaType::COUNT]>,
    room: HashMap<SocketAddr, u64>,
    room_list: Vec<SocketAddr>,
    scratch: Vec<SocketAddr>,
    next_ssid: u32,
    rng: u64,
    reply: [u8; 32],
    stats: SfuStats,
}

impl Sfu {
    /// A core with no clients.
    pub fn new(cfg: SfuConfig) -> Self {
        let rng = cfg.seed ^ 0x9e37_79b9_7f4a_7c15;
        Sfu {
            cfg,
            clients: HashMap::new(),
            by_addr: HashMap::new(),
            routes: HashMap::new(),
            room: HashMap::new(),
            room_list: Vec::new(),
            scratch: Vec::new(),
            next_ssid: 1,
            rng,
            reply: [0; 32],
            stats: SfuStats::default(),
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

    /// Subscriber addresses of (`ssid`, `media`), sender excluded.
    pub fn subscribers(&self, ssid: u32, media: MediaType) -> &[SocketAddr] {
        self.routes
            .get(&ssid)
            .map(|r| r[media as usize].as_slice())
            .unwrap_or(&[])
    }

    fn next_rand(&mut self) -> u64 {
        // splitmix64
        self.rng = self.rng.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.rng;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
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
                .map(|r| r[m as usize].as_slice())
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
        if let Some(t) = self.room.get_mut(&peer) {
            *t = now;
        } else {
            if self.room.len() >= self.cfg.max_clients {
                self.stats.rejected_room += 1;
                return Action::Drop(DropReason::RoomFull);
            }
            self.room.insert(peer, now);
            self.room_list.push(peer);
        }
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

    fn error(&mut self, peer: SocketAddr, req: u32, code: ErrorCode, ssid: u32) -> Action<'_> {
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
                    return self.error(peer, req, ErrorCode::Malformed, 0);
                }
                return Action::Drop(DropReason::Malformed);
            }
        };
        let req = c.request_id();
        match c.msg_type() {
            MsgType::Ack | MsgType::Error => {
                self.stats.drop_unexpected_control += 1;
                Action::Drop(DropReason::UnexpectedControl)
            }
            MsgType::Register => self.register(now, peer, req),
            ty => {
                let ssid = c.ssid();
                let Some(cl) = self.clients.get_mut(&ssid) else {
                    self.stats.drop_unknown_ssid += 1;
                    return self.error(peer, req, ErrorCode::UnknownSsid, ssid);
                };
                if cl.token != c.token() {
                    self.stats.drop_bad_token += 1;
                    return self.error(peer, req, ErrorCode::BadToken, ssid);
                }
                if cl.addr != peer {
                    self.stats.drop_wrong_address += 1;
                    return self.error(peer, req, ErrorCode::WrongAddress, ssid);
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
                            self.error(peer, req, ErrorCode::TooManySubs, ssid)
                        }
                    }
                    MsgType::Unsubscribe => {
                        let sels: Vec<Selector> = c.selectors().collect();
                        self.unsubscribe(ssid, &sels);
                        self.ack(peer, req, ssid, token)
                    }
                    MsgType::Register | MsgType::Ack | MsgType::Error => {
                        unreachable!("handled above")
                    }
                }
            }
        }
    }

    fn register(&mut self, now: u64, peer: SocketAddr, req: u32) -> Action<'_> {
        if let Some(&ssid) = self.by_addr.get(&peer) {
            // Retransmitted REGISTER: same answer.
            let c = self.clients.get_mut(&ssid).expect("index consistent");
            c.last_seen = now;
            let token = c.token;
            return self.ack(peer, req, ssid, token);
        }
        if self.clients.len() >= self.cfg.max_clients {
            self.stats.rejected_register += 1;
            return self.error(peer, req, ErrorCode::TooManyClients, 0);
        }
        let mut ssid = self.next_ssid;
        while ssid == 0 || ssid == wire::ALL_SOURCES || self.clients.contains_key(&ssid) {
            ssid = ssid.wrapping_add(1);
        }
        self.next_ssid = ssid.wrapping_add(1);
        let token = self.next_rand();
        // A static-room member that registers leaves the room.
        if self.room.remove(&peer).is_some() {
            self.room_list.retain(|a| *a != peer);
        }
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
        // Routes of the new source: everyone whose selectors match it.
        let mut r: [Vec<SocketAddr>; MediaType::COUNT] = Default::default();
        for (&other, oc) in &self.clients {
            if other == ssid {
                continue;
            }
            for m in MediaType::ALL {
                if oc.subs.iter().any(|s| s.matches(ssid, m)) {
                    r[m as usize].push(oc.addr);
                }
            }
        }
        self.routes.insert(ssid, r);
        self.stats.registrations += 1;
        self.ack(peer, req, ssid, token)
    }

    /// Add selectors to `ssid`; false (and no change) if that would exceed `max_subs`.
    fn subscribe(&mut self, ssid: u32, sels: &[Selector]) -> bool {
        let c = self.clients.get_mut(&ssid).expect("checked by caller");
        let mut new: Vec<Selector> = Vec::new();
        for s in sels {
            if !c.subs.contains(s) && !new.contains(s) {
                new.push(*s);
            }
        }
        if c.subs.len() + new.len() > self.cfg.max_subs {
            return false;
        }
        c.subs.extend_from_slice(&new);
        self.refresh_subscriber(ssid, &new);
        true
    }

    /// Remove selectors; `all:all` clears every subscription of the client.
    fn unsubscribe(&mut self, ssid: u32, sels: &[Selector]) {
        let c = self.clients.get_mut(&ssid).expect("checked by caller");
        let removed: Vec<Selector> = if sels.contains(&Selector::ALL) {
            std::mem::take(&mut c.subs)
        } else {
            let r = c
                .subs
                .iter()
                .copied()
                .filter(|s| sels.contains(s))
                .collect();
            c.subs.retain(|s| !sels.contains(s));
            r
        };
        self.refresh_subscriber(ssid, &removed);
    }

    /// Bring `ssid`'s presence in the route lists of the sources touched by
    /// `changed` in line with its selectors.
    fn refresh_subscriber(&mut self, ssid: u32, changed: &[Selector]) {
        let c = &self.clients[&ssid];
        let (addr, subs) = (c.addr, c.subs.clone());
        let all = changed.iter().any(|s| s.source == SourceSel::All);
        for (&src, lists) in self.routes.iter_mut() {
            if src == ssid {
                continue;
            }
            let touched = all || changed.iter().any(|s| s.source == SourceSel::Ssid(src));
            if !touched {
                continue;
            }
            for m in MediaType::ALL {
                let want = subs.iter().any(|s| s.matches(src, m));
                let list = &mut lists[m as usize];
                let has = list.contains(&addr);
                if want && !has {
                    list.push(addr);
                } else if !want && has {
                    list.retain(|a| *a != addr);
                }
            }
        }
    }

    fn remove_client(&mut self, ssid: u32) {
        let Some(c) = self.clients.remove(&ssid) else {
            return;
        };
        self.by_addr.remove(&c.addr);
        self.routes.remove(&ssid);
        if !c.subs.is_empty() {
            for lists in self.routes.values_mut() {
                for l in lists.iter_mut() {
                    l.retain(|a| *a != c.addr);
                }
            }
        }
    }

    /// Check internal consistency (tests): route lists hold only registered
    /// subscribers of that source, never the source itself, without duplicates.
    pub fn check_invariants(&self) -> Result<(), String> {
        if self.clients.len() > self.cfg.max_clients || self.room.len() > self.cfg.max_clients {
            return Err("table over its bound".into());
        }
        if self.by_addr.len() != self.clients.len() || self.room_list.len() != self.room.len() {
            return Err("index out of sync".into());
        }
        for (src, lists) in &self.routes {
            let Some(sc) = self.clients.get(src) else {
                return Err(format!("routes for unknown source {src}"));
            };
            for m in MediaType::ALL {
                let l = &lists[m as usize];
                for (i, a) in l.iter().enumerate() {
                    if *a == sc.addr || l[..i].contains(a) {
                        return Err(format!("self or duplicate in routes of {src}"));
                    }
                    let Some(ssid) = self.by_addr.get(a) else {
                        return Err(format!("unregistered {a} in routes of {src}"));
                    };
                    if !self.clients[ssid].subs.iter().any(|s| s.matches(*src, m)) {
                        return Err(format!("{a} routed without a matching selector"));
                    }
                }
                for (&ssid, c) in &self.clients {
                    if ssid != *src
                        && c.subs.iter().any(|s| s.matches(*src, m))
                        && !l.contains(&c.addr)
                    {
                        return Err(format!("subscriber {ssid} missing from routes of {src}"));
                    }
                }
            }
        }
        if self.clients.keys().any(|k| !self.routes.contains_key(k)) {
            return Err("registered client without routes".into());
        }
        Ok(())
    }

    /// Remove clients and static-room members silent for longer than the
    /// idle timeout; returns how many were removed.
    pub fn tick(&mut self, now: u64) -> usize {
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
        self.room.retain(|_, t| now.saturating_sub(*t) <= limit);
        if self.room.len() != before {
            let room = &self.room;
            self.room_list.retain(|a| room.contains_key(a));
        }
        let n = idle.len() + before - self.room.len();
        self.stats.timeouts += n as u64;
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{write_auth, write_register, write_rtp, write_subscribe, RtpHeader};

    fn addr(p: u16) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], p))
    }

    fn register(sfu: &mut Sfu, a: SocketAddr) -> (u32, u64) {
        let mut b = [0u8; 64];
        let n = write_register(&mut b, 1).unwrap();
        match sfu.handle(0, a, &b[..n]) {
            Action::Reply { msg, .. } => {
                let c = Control::new_checked(msg).unwrap();
                assert_eq!(c.msg_type(), MsgType::Ack);
                (c.ssid(), c.token())
            }
            other => panic!("{other:?}"),
        }
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

    fn targets(sfu: &mut Sfu, a: SocketAddr, p: &[u8]) -> Option<(Vec<SocketAddr>, bool)> {
        match sfu.handle(1, a, p) {
            Action::Forward { targets, echo, .. } => Some((targets.to_vec(), echo.is_some())),
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
        // ACK/ERROR sent to the SFU are never answered
        let n = write_auth(&mut b, MsgType::Ack, 1, ib.0, ib.1).unwrap();
        assert_eq!(
            sfu.handle(151, addr(2), &b[..n]),
            Action::Drop(DropReason::UnexpectedControl)
        );
        assert_eq!(
            sfu.handle(151, addr(2), b"hello"),
            Action::Drop(DropReason::Malformed)
        );
    }

    proptest::proptest! {
        /// Random control and media traffic from a few addresses (with
        /// guessed and stolen SSIDs/tokens, timeouts) keeps the tables consistent.
        #[test]
        fn random_traffic_keeps_tables_consistent(
            ops in proptest::collection::vec((0u8..8, 0u16..6, 0u32..8, proptest::bool::ANY, 0u8..4), 1..200)
        ) {
            let mut sfu = Sfu::new(SfuConfig {
                max_clients: 4,
                max_subs: 3,
                idle_timeout_ns: 50,
                static_room: true,
                ..Default::default()
            });
            let mut known: Vec<(u32, u64)> = Vec::new();
            let mut now = 0u64;
            let mut b = [0u8; 128];
            for (op, port, pick, good_token, m) in ops {
                now += 7;
                let a = addr(port);
                let (ssid, token) = known.get(pick as usize % known.len().max(1)).copied().unwrap_or((pick, 0));
                let token = if good_token { token } else { token ^ 0x55 };
                let media = MediaType::from_code(m % 3).unwrap();
                let sel = if m == 3 { Selector::ALL } else { Selector { source: SourceSel::Ssid(ssid), media: crate::wire::MediaSel::One(media) } };
                let n = match op {
                    0 => write_register(&mut b, 1).unwrap(),
                    1 => write_subscribe(&mut b, MsgType::Subscribe, 1, ssid, token, &[sel]).unwrap(),
                    2 => write_subscribe(&mut b, MsgType::Unsubscribe, 1, ssid, token, &[sel]).unwrap(),
                    3 => write_auth(&mut b, MsgType::Keepalive, 1, ssid, token).unwrap(),
                    4 => write_auth(&mut b, MsgType::Leave, 1, ssid, token).unwrap(),
                    5 => { sfu.tick(now); continue; }
                    _ => {
                        let p = rtp(ssid, media);
                        b[..p.len()].copy_from_slice(&p);
                        p.len()
                    }
                };
                if let Action::Reply { msg, .. } = sfu.handle(now, a, &b[..n]) {
                    let c = Control::new_checked(msg).unwrap();
                    // Never a reply larger than the request (no amplification).
                    proptest::prop_assert!(msg.len() <= n);
                    if op == 0 && c.msg_type() == MsgType::Ack {
                        known.push((c.ssid(), c.token()));
                    }
                }
                if let Err(e) = sfu.check_invariants() {
                    return Err(proptest::test_runner::TestCaseError::fail(e));
                }
            }
        }
    }

    #[test]
    fn static_room_latches() {
        let cfg = SfuConfig {
            static_room: true,
            echo: false,
            ..Default::default()
        };
        let mut sfu = Sfu::new(cfg);
        let p = rtp(1234, MediaType::Asq);
        assert_eq!(targets(&mut sfu, addr(1), &p), Some((vec![], false)));
        assert_eq!(targets(&mut sfu, addr(2), &p), Some((vec![addr(1)], false)));
        assert_eq!(targets(&mut sfu, addr(1), &p), Some((vec![addr(2)], false)));
        assert_eq!(sfu.stats().room_members, 2);
    }
}
