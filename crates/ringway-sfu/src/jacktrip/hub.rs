//! The hub: clients by address, a pending N−1 mix per client, plain
//! forwarding when one other client with the same format is all there is.
//!
//! Cost per packet, the hot path: one decode of the arriving audio (gain
//! applied), one add into each other client's mix (a straight zip when the
//! channel counts agree), one encode per mix sent, written in place into an
//! [`Outbox`] whose buffers are reused, so nothing is allocated per packet
//! once the first packets have sized the buffers.

use super::{code_of_rate, decode_sample, encode_sample, parse, Header, Packet, HEADER_LEN};
use std::net::{IpAddr, SocketAddr};
use std::ops::Range;

/// Hub settings.
#[derive(Clone, Debug)]
pub struct HubConfig {
    /// Sampling rate every client must use (Hz).
    pub rate: u32,
    /// Most clients.
    pub max_clients: usize,
    /// Most clients (and pending handshakes) per IP address.
    pub max_per_ip: usize,
    /// Remove clients silent this long (ns).
    pub idle_timeout_ns: u64,
    /// A handshake not followed by audio within this long is forgotten (ns).
    pub handshake_timeout_ns: u64,
    /// A client counts as active (its contribution is awaited) while it
    /// was heard within this many packet periods.
    pub active_periods: u64,
}

impl Default for HubConfig {
    fn default() -> Self {
        HubConfig {
            rate: 48_000,
            max_clients: 32,
            max_per_ip: 8,
            idle_timeout_ns: 10_000_000_000,
            handshake_timeout_ns: 10_000_000_000,
            active_periods: 4,
        }
    }
}

/// Counters of the hub.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct HubStats {
    /// Datagrams handled.
    pub rx_datagrams: u64,
    /// Audio packets accepted.
    pub rx_audio: u64,
    /// Packets sent to clients.
    pub tx_packets: u64,
    /// Of those, forwarded as received (one other client, same format).
    pub tx_forwarded: u64,
    /// Mixes sent by the period deadline (a contributor was missing).
    pub mixes_by_deadline: u64,
    /// TCP handshakes accepted.
    pub handshakes: u64,
    /// Handshakes refused (too many clients or pending, per IP).
    pub handshakes_refused: u64,
    /// Clients now.
    pub clients: u64,
    /// Clients that joined.
    pub joins: u64,
    /// Clients that sent the exit packet.
    pub exits: u64,
    /// Clients removed for idleness.
    pub timeouts: u64,
    /// Clients removed by the operator ([`Hub::kick`]).
    pub kicks: u64,
    /// Datagrams from addresses without a handshake.
    pub drop_unknown_peer: u64,
    /// Malformed datagrams (header or length).
    pub drop_malformed: u64,
    /// Packets at another sampling rate than the hub's.
    pub drop_rate_mismatch: u64,
    /// Packets with another buffer size than the session's.
    pub drop_frames_mismatch: u64,
}

/// Counters of one client.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct ClientStats {
    /// Audio packets accepted from it.
    pub rx_packets: u64,
    /// Their bytes (header included).
    pub rx_bytes: u64,
    /// Sequence numbers skipped (packets lost or not yet arrived).
    pub lost: u64,
    /// Packets whose sequence number was behind the highest seen (late,
    /// reordered or duplicated); mixed all the same.
    pub late: u64,
    /// Packets sent to it (mixes and forwards).
    pub tx_packets: u64,
    /// Of those, the other's packet as it came.
    pub tx_forwarded: u64,
    /// Of those, mixes sent by the period deadline (a contributor missing).
    pub mixes_by_deadline: u64,
    /// Its malformed datagrams.
    pub drop_malformed: u64,
    /// Its packets at another rate or buffer size than the session's.
    pub drop_mismatch: u64,
}

/// A client as [`Hub::clients_info`] shows it.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct ClientInfo {
    /// The hub's id of the client (stable while it stays).
    pub id: u64,
    /// Its UDP address.
    pub addr: SocketAddr,
    /// Gain applied to its audio in the others' mixes.
    pub gain: f32,
    /// Bits per sample of its last packet.
    pub bits: u8,
    /// Channels it wants.
    pub channels_in: usize,
    /// Channels it sends.
    pub channels_sent: usize,
    /// Time since its last packet (ms).
    pub idle_ms: u64,
    /// Its counters.
    pub stats: ClientStats,
}

/// The packets the hub wants sent, written in place into one buffer that
/// is reused: [`Outbox::clear`] keeps the capacity.
#[derive(Debug, Default)]
pub struct Outbox {
    bytes: Vec<u8>,
    packets: Vec<(SocketAddr, Range<usize>)>,
}

impl Outbox {
    /// An empty outbox.
    pub fn new() -> Self {
        Outbox::default()
    }
    /// Packets queued.
    pub fn len(&self) -> usize {
        self.packets.len()
    }
    /// Nothing queued.
    pub fn is_empty(&self) -> bool {
        self.packets.is_empty()
    }
    /// Forget the queued packets (the buffers stay).
    pub fn clear(&mut self) {
        self.bytes.clear();
        self.packets.clear();
    }
    /// Packet `i`: destination and bytes.
    pub fn get(&self, i: usize) -> Option<(SocketAddr, &[u8])> {
        self.packets
            .get(i)
            .map(|(dst, r)| (*dst, &self.bytes[r.clone()]))
    }
    /// The queued packets in order.
    pub fn iter(&self) -> impl Iterator<Item = (SocketAddr, &[u8])> + '_ {
        self.packets
            .iter()
            .map(|(dst, r)| (*dst, &self.bytes[r.clone()]))
    }
    /// Queue a packet of `len` zero bytes for `dst`; returns them to fill.
    fn reserve(&mut self, dst: SocketAddr, len: usize) -> &mut [u8] {
        let start = self.bytes.len();
        self.bytes.resize(start + len, 0);
        self.packets.push((dst, start..start + len));
        &mut self.bytes[start..]
    }
}

#[derive(Debug)]
struct HubClient {
    addr: SocketAddr,
    id: u64,
    gain: f32,
    bits: u8,
    channels_in: usize,
    channels_sent: usize,
    seq_out: u16,
    /// Highest sequence number received.
    seq_in: Option<u16>,
    last_seen: u64,
    /// The last packet's audio as received (for plain forwarding).
    last_audio: Vec<u8>,
    /// Pending mix for this client: interleaved, `frames × channels_in`.
    mix: Vec<f32>,
    /// (contributor id, its arrival) of the pending mix.
    contributors: Vec<(u64, u64)>,
    stats: ClientStats,
}

/// The hub: clients by address, their pending mixes.
#[derive(Debug)]
pub struct Hub {
    cfg: HubConfig,
    rate_code: u8,
    /// Frames per packet of the session (the first client's).
    frames: Option<u16>,
    clients: Vec<HubClient>,
    /// (IP, announced UDP port, deadline) of TCP handshakes awaiting audio.
    pending: Vec<(IpAddr, u16, u64)>,
    next_id: u64,
    stats: HubStats,
    /// Waits (ns) of contributions sent since the last [`Hub::take_delays`].
    delays: Vec<u64>,
    scratch: Vec<f32>,
}

impl Hub {
    /// A hub with no clients. `cfg.rate` must be one of JackTrip's rates.
    pub fn new(cfg: HubConfig) -> Result<Hub, String> {
        let rate_code =
            code_of_rate(cfg.rate).ok_or_else(|| format!("JackTrip has no rate {}", cfg.rate))?;
        Ok(Hub {
            cfg,
            rate_code,
            frames: None,
            clients: Vec::new(),
            pending: Vec::new(),
            next_id: 1,
            stats: HubStats::default(),
            delays: Vec::new(),
            scratch: Vec::new(),
        })
    }

    /// Counters.
    pub fn stats(&self) -> HubStats {
        let mut snapshot = self.stats;
        snapshot.clients = self.clients.len() as u64;
        snapshot
    }

    /// Clients: (id, address, gain).
    pub fn clients(&self) -> impl Iterator<Item = (u64, SocketAddr, f32)> + '_ {
        self.clients.iter().map(|c| (c.id, c.addr, c.gain))
    }

    /// Every client with its format, gain and counters, at `now`.
    pub fn clients_info(&self, now: u64) -> Vec<ClientInfo> {
        self.clients
            .iter()
            .map(|c| ClientInfo {
                id: c.id,
                addr: c.addr,
                gain: c.gain,
                bits: c.bits,
                channels_in: c.channels_in,
                channels_sent: c.channels_sent,
                idle_ms: now.saturating_sub(c.last_seen) / 1_000_000,
                stats: c.stats,
            })
            .collect()
    }

    /// Frames per packet of the session, once a client joined.
    pub fn frames(&self) -> Option<u16> {
        self.frames
    }

    /// Set the gain of client `id` (applied to its audio in the others'
    /// mixes; finite, 0 to 16). False if there is no such client or the
    /// gain is out of range.
    pub fn set_gain(&mut self, id: u64, gain: f32) -> bool {
        match self.clients.iter_mut().find(|c| c.id == id) {
            Some(c) if gain.is_finite() && (0.0..=16.0).contains(&gain) => {
                c.gain = gain;
                true
            }
            _ => false,
        }
    }

    /// Remove client `id` (counted in [`HubStats::kicks`]): its datagrams
    /// count as from an unknown peer until it shakes hands again. False if
    /// there is no such client.
    pub fn kick(&mut self, id: u64) -> bool {
        match self.clients.iter().position(|c| c.id == id) {
            Some(i) => {
                self.remove(i);
                self.stats.kicks += 1;
                true
            }
            None => false,
        }
    }

    /// The waits of the contributions sent since the last call (ns).
    pub fn take_delays(&mut self, into: &mut Vec<u64>) {
        into.append(&mut self.delays);
    }

    /// A TCP handshake from `ip` announced UDP port `port`: accept its
    /// audio for the handshake timeout. False (counted) when the hub or
    /// the IP's share is full.
    pub fn handshake(&mut self, now: u64, ip: IpAddr, port: u16) -> bool {
        self.pending.retain(|p| p.2 > now);
        let per_ip = self.clients.iter().filter(|c| c.addr.ip() == ip).count()
            + self.pending.iter().filter(|p| p.0 == ip).count();
        if self.clients.len() + self.pending.len() >= self.cfg.max_clients
            || per_ip >= self.cfg.max_per_ip
        {
            self.stats.handshakes_refused += 1;
            return false;
        }
        self.pending.retain(|p| !(p.0 == ip && p.1 == port));
        self.pending
            .push((ip, port, now.saturating_add(self.cfg.handshake_timeout_ns)));
        self.stats.handshakes += 1;
        true
    }

    /// One packet period of the session (128 frames until a client joined).
    pub fn period_ns(&self) -> u64 {
        u64::from(self.frames.unwrap_or(128)) * 1_000_000_000 / u64::from(self.cfg.rate)
    }

    /// Handle one datagram from `peer` at `now` (ns); packets to send are
    /// added to `out`.
    pub fn handle(&mut self, now: u64, peer: SocketAddr, data: &[u8], out: &mut Outbox) {
        self.stats.rx_datagrams += 1;
        let known = self.clients.iter().position(|client| client.addr == peer);
        let packet = match parse(data) {
            Ok(p) => p,
            Err(_) => {
                match known {
                    Some(index) => {
                        self.stats.drop_malformed += 1;
                        self.clients[index].stats.drop_malformed += 1;
                    }
                    None => self.stats.drop_unknown_peer += 1,
                }
                return;
            }
        };
        let (header, audio) = match packet {
            Packet::Exit => {
                if let Some(index) = known {
                    self.remove(index);
                    self.stats.exits += 1;
                } else {
                    self.stats.drop_unknown_peer += 1;
                }
                return;
            }
            Packet::Audio(header, a) => (header, a),
        };
        let index = match known {
            Some(index) => index,
            None => match self.latch(now, peer, &header) {
                Some(index) => index,
                None => return,
            },
        };
        if header.rate_code != self.rate_code || Some(header.frames) != self.frames {
            if header.rate_code != self.rate_code {
                self.stats.drop_rate_mismatch += 1;
            } else {
                self.stats.drop_frames_mismatch += 1;
            }
            self.clients[index].stats.drop_mismatch += 1;
            return;
        }
        self.stats.rx_audio += 1;
        let kid = self.clients[index].id;
        // k's next period began before these mixes were complete: send them
        // (with k's previous packet, still in `last_audio`) first.
        for j in 0..self.clients.len() {
            if j != index
                && self.clients[j]
                    .contributors
                    .iter()
                    .any(|&(id, _)| id == kid)
            {
                self.flush(j, now, out);
            }
        }
        let client = &mut self.clients[index];
        client.accept(now, &header, audio);
        let (gain, kch, kbits) = (client.gain, client.channels_sent, client.bits);
        let frames = header.frames as usize;
        decode_into(audio, kbits, gain, &mut self.scratch);
        let window = self.period_ns() * self.cfg.active_periods;
        let active = self
            .clients
            .iter()
            .filter(|client| now.saturating_sub(client.last_seen) <= window)
            .count();
        for j in 0..self.clients.len() {
            if j == index {
                continue;
            }
            let other = &mut self.clients[j];
            let jch = other.channels_in;
            if other.mix.len() != frames * jch {
                other.mix.clear();
                other.mix.resize(frames * jch, 0.0);
            }
            if kch == jch {
                for (m, s) in other.mix.iter_mut().zip(&self.scratch) {
                    *m += *s;
                }
            } else if kch > 0 {
                for f in 0..frames {
                    for ch in 0..kch {
                        other.mix[f * jch + ch % jch] += self.scratch[f * kch + ch];
                    }
                }
            }
            other.contributors.push((kid, now));
            // The active clients other than j.
            let others = active - usize::from(now.saturating_sub(other.last_seen) <= window);
            if other.contributors.len() >= others {
                self.flush(j, now, out);
            }
        }
    }

    /// The first audio from `peer`: latch it to a pending handshake from
    /// its IP (its announced port, or the only one from that IP: NAT).
    fn latch(&mut self, now: u64, peer: SocketAddr, h: &Header) -> Option<usize> {
        self.pending.retain(|p| p.2 > now);
        let ip = peer.ip();
        let exact = self
            .pending
            .iter()
            .position(|p| p.0 == ip && p.1 == peer.port());
        let mut from_ip = (0..self.pending.len()).filter(|&slot| self.pending[slot].0 == ip);
        let only = match (from_ip.next(), from_ip.next()) {
            (Some(slot), None) => Some(slot),
            _ => None,
        };
        let Some(slot) = exact.or(only) else {
            self.stats.drop_unknown_peer += 1;
            return None;
        };
        if h.rate_code != self.rate_code {
            self.stats.drop_rate_mismatch += 1;
            return None;
        }
        if self.clients.is_empty() {
            self.frames = Some(h.frames);
        }
        if Some(h.frames) != self.frames {
            self.stats.drop_frames_mismatch += 1;
            return None;
        }
        self.pending.swap_remove(slot);
        let client_id = self.next_id;
        self.next_id += 1;
        self.clients.push(HubClient {
            addr: peer,
            id: client_id,
            gain: 1.0,
            bits: h.bits,
            channels_in: (h.channels_in as usize).max(1),
            channels_sent: h.channels_sent(),
            seq_out: 0,
            seq_in: None,
            last_seen: now,
            last_audio: Vec::new(),
            mix: Vec::new(),
            contributors: Vec::new(),
            stats: ClientStats::default(),
        });
        self.stats.joins += 1;
        Some(self.clients.len() - 1)
    }

    /// Send client `j`'s pending mix (if any contribution is pending).
    fn flush(&mut self, j: usize, now: u64, out: &mut Outbox) {
        let client = &self.clients[j];
        if client.contributors.is_empty() {
            return;
        }
        let frames = self.frames.unwrap_or(0) as usize;
        // Plain forwarding: one contributor at unity gain, same format.
        let single = match client.contributors.as_slice() {
            [(k, _)] => self.clients.iter().position(|o| {
                o.id == *k
                    && o.gain == 1.0
                    && o.bits == client.bits
                    && o.channels_sent == client.channels_in
                    && o.last_audio.len() == frames * o.channels_sent * o.bits as usize / 8
            }),
            _ => None,
        };
        let buf = out.reserve(
            client.addr,
            HEADER_LEN + frames * client.channels_in * (client.bits as usize / 8),
        );
        Header {
            timestamp_us: now / 1000,
            seq: client.seq_out,
            frames: frames as u16,
            rate_code: self.rate_code,
            bits: client.bits,
            channels_in: client.channels_in as u8,
            channels_out_field: 0,
        }
        .write(buf);
        match single {
            Some(k) => buf[HEADER_LEN..].copy_from_slice(&self.clients[k].last_audio),
            None => encode_into(&client.mix, client.bits, &mut buf[HEADER_LEN..]),
        }
        let client = &mut self.clients[j];
        client.seq_out = client.seq_out.wrapping_add(1);
        client.stats.tx_packets += 1;
        if single.is_some() {
            client.stats.tx_forwarded += 1;
            self.stats.tx_forwarded += 1;
        }
        client.mix.iter_mut().for_each(|x| *x = 0.0);
        self.delays.extend(
            client
                .contributors
                .iter()
                .map(|&(_, t)| now.saturating_sub(t)),
        );
        client.contributors.clear();
        self.stats.tx_packets += 1;
    }

    /// When [`Hub::tick`] has work: the earliest mix deadline.
    pub fn next_deadline(&self) -> Option<u64> {
        let period = self.period_ns();
        self.clients
            .iter()
            .filter_map(|c| c.contributors.first().map(|&(_, t)| t + period))
            .min()
    }

    /// Send mixes whose period is over; expire idle clients and handshakes.
    pub fn tick(&mut self, now: u64, out: &mut Outbox) {
        let period = self.period_ns();
        for j in 0..self.clients.len() {
            if self.clients[j]
                .contributors
                .first()
                .is_some_and(|&(_, t)| now >= t + period)
            {
                self.flush(j, now, out);
                self.stats.mixes_by_deadline += 1;
                self.clients[j].stats.mixes_by_deadline += 1;
            }
        }
        let limit = self.cfg.idle_timeout_ns;
        while let Some(index) = self
            .clients
            .iter()
            .position(|c| now.saturating_sub(c.last_seen) > limit)
        {
            self.remove(index);
            self.stats.timeouts += 1;
        }
        self.pending.retain(|period| period.2 > now);
    }

    /// Forget client `i` (what it contributed to pending mixes stays; mixes
    /// that waited for it go at their deadline).
    fn remove(&mut self, i: usize) {
        self.clients.remove(i);
        if self.clients.is_empty() {
            self.frames = None;
        }
    }
}

impl HubClient {
    /// Take an accepted packet: format, sequence accounting, its audio.
    fn accept(&mut self, now: u64, h: &Header, audio: &[u8]) {
        self.last_seen = now;
        self.bits = h.bits;
        self.channels_in = (h.channels_in as usize).max(1);
        self.channels_sent = h.channels_sent();
        self.stats.rx_packets += 1;
        self.stats.rx_bytes += (HEADER_LEN + audio.len()) as u64;
        match self.seq_in {
            None => self.seq_in = Some(h.seq),
            Some(last) => {
                let ahead = h.seq.wrapping_sub(last) as i16;
                if ahead > 0 {
                    self.stats.lost += ahead as u64 - 1;
                    self.seq_in = Some(h.seq);
                } else {
                    self.stats.late += 1;
                }
            }
        }
        self.last_audio.clear();
        self.last_audio.extend_from_slice(audio);
    }
}

/// Decode `audio` (interleaved, `bits` per sample) times `gain` into `out`.
fn decode_into(audio: &[u8], bits: u8, gain: f32, out: &mut Vec<f32>) {
    out.clear();
    match bits {
        16 => {
            let scale = gain / 32767.0;
            out.extend(
                audio
                    .chunks_exact(2)
                    .map(|s| f32::from(i16::from_le_bytes([s[0], s[1]])) * scale),
            );
        }
        _ => {
            let sample_bytes = bits as usize / 8;
            out.extend(
                audio
                    .chunks_exact(sample_bytes)
                    .map(|s| decode_sample(s, bits) * gain),
            );
        }
    }
}

/// Encode `mix` into `out` (`bits` per sample), saturating at full scale.
fn encode_into(mix: &[f32], bits: u8, out: &mut [u8]) {
    match bits {
        16 => {
            for (s, x) in out.chunks_exact_mut(2).zip(mix) {
                // NaN becomes 0 (`as` saturates; clamp keeps NaN).
                let sample = (x.clamp(-1.0, 1.0) * 32767.0).round() as i16;
                s.copy_from_slice(&sample.to_le_bytes());
            }
        }
        _ => {
            let sample_bytes = bits as usize / 8;
            for (s, x) in out.chunks_exact_mut(sample_bytes).zip(mix) {
                encode_sample(*x, s, bits);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::packet;
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    fn addr(p: u16) -> SocketAddr {
        SocketAddr::from(([10, 0, 0, 1], p))
    }

    fn samples(d: &[u8]) -> Vec<f32> {
        let Ok(Packet::Audio(h, a)) = parse(d) else {
            panic!()
        };
        a.chunks_exact(h.sample_bytes())
            .map(|s| decode_sample(s, h.bits))
            .collect()
    }

    fn hub_with(n: u16) -> Hub {
        let mut hub = Hub::new(HubConfig::default()).unwrap();
        for p in 1..=n {
            assert!(hub.handshake(0, addr(p).ip(), p));
        }
        hub
    }

    /// Three clients: each gets the sum of the other two as soon as both
    /// contributed, saturating at full scale; gains apply.
    #[test]
    fn n_minus_one_mix() {
        let mut hub = hub_with(3);
        let mut out = Outbox::new();
        hub.handle(0, addr(1), &packet(0, 64, 1, 0.1), &mut out);
        hub.handle(0, addr(2), &packet(0, 64, 1, 0.2), &mut out);
        hub.handle(0, addr(3), &packet(0, 64, 1, 0.3), &mut out);
        out.clear();
        for p in 1..=3u16 {
            hub.handle(
                1_000,
                addr(p),
                &packet(1, 64, 1, 0.1 * f32::from(p)),
                &mut out,
            );
        }
        // Second round: everyone contributed; each mix is the other two.
        let got: HashMap<SocketAddr, f32> =
            out.iter().map(|(dst, d)| (dst, samples(d)[0])).collect();
        assert!((got[&addr(1)] - 0.5).abs() < 1e-3, "{got:?}");
        assert!((got[&addr(2)] - 0.4).abs() < 1e-3);
        assert!((got[&addr(3)] - 0.3).abs() < 1e-3);
        hub.set_gain(3, 0.0);
        for round in [2, 3] {
            out.clear();
            for p in 1..=3u16 {
                hub.handle(
                    1_000 * round,
                    addr(p),
                    &packet(round as u16, 64, 1, 0.9),
                    &mut out,
                );
            }
        }
        let got: HashMap<SocketAddr, f32> =
            out.iter().map(|(dst, d)| (dst, samples(d)[0])).collect();
        assert!((got[&addr(3)] - 1.0).abs() < 1e-3, "saturated: {got:?}");
        assert!((got[&addr(1)] - 0.9).abs() < 1e-3, "client 3 at gain 0");
        // Only the first mix of client 1 (client 2 alone) was a plain forward.
        assert_eq!(hub.stats().tx_forwarded, 1);
    }

    /// Two clients: the other's packet goes as it came (plain forwarding).
    #[test]
    fn two_clients_forward_plainly_and_deadline_flushes() {
        let mut hub = hub_with(2);
        let mut out = Outbox::new();
        let a = packet(0, 64, 2, 0.25);
        hub.handle(0, addr(2), &packet(0, 64, 2, 0.0), &mut out);
        assert!(out.is_empty());
        hub.handle(0, addr(1), &a, &mut out);
        assert_eq!(out.len(), 1, "only one other: sent at once");
        hub.handle(1, addr(2), &packet(1, 64, 2, 0.0), &mut out);
        assert_eq!(out.len(), 2);
        let (dst, data) = out.get(0).unwrap();
        assert_eq!(dst, addr(2));
        assert_eq!(data[HEADER_LEN..], a[HEADER_LEN..]);
        assert_eq!(hub.stats().tx_forwarded, 2);
        // A third joins but is silent after its first packet: the others'
        // mixes go at the period deadline.
        assert!(hub.handshake(10, addr(3).ip(), 3));
        out.clear();
        hub.handle(10, addr(3), &packet(0, 64, 2, 0.5), &mut out);
        hub.handle(20, addr(1), &packet(1, 64, 2, 0.25), &mut out);
        let n = out.len();
        let late = 20 + 64 * 1_000_000_000 / 48_000 * 5;
        hub.tick(late, &mut out);
        assert!(out.len() > n, "deadline flush");
        assert!(hub.stats().mixes_by_deadline > 0);
    }

    #[test]
    fn bad_input_counted() {
        let mut hub = hub_with(1);
        let mut out = Outbox::new();
        // Unknown peer (no handshake from its IP).
        hub.handle(
            0,
            SocketAddr::from(([10, 9, 9, 9], 1)),
            &packet(0, 64, 1, 0.1),
            &mut out,
        );
        // Rate mismatch before latching.
        let mut p = packet(0, 64, 1, 0.1);
        p[12] = 2;
        hub.handle(0, addr(1), &p, &mut out);
        hub.handle(0, addr(1), &packet(0, 64, 1, 0.1), &mut out);
        hub.handle(0, addr(1), &[1, 2, 3], &mut out);
        hub.handle(0, addr(1), &packet(1, 128, 1, 0.1), &mut out);
        let s = hub.stats();
        assert_eq!(
            (
                s.drop_unknown_peer,
                s.drop_rate_mismatch,
                s.drop_malformed,
                s.drop_frames_mismatch,
                s.clients
            ),
            (1, 1, 1, 1, 1)
        );
        // Handshake floods are bounded per IP and in total.
        let ip = SocketAddr::from(([10, 7, 7, 7], 1)).ip();
        let ok = (0..100).filter(|&p| hub.handshake(0, ip, p)).count();
        assert_eq!(ok, 8);
        assert_eq!(hub.stats().handshakes_refused, 92);
    }

    /// The committed corpus replays without a panic (the `audio-*` files
    /// parse as audio).
    #[test]
    fn corpus_replays() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/corpus/jacktrip");
        let mut n = 0;
        for e in std::fs::read_dir(&dir).expect("corpus present") {
            let path = e.unwrap().path();
            let data = std::fs::read(&path).unwrap();
            let name = path.file_name().unwrap().to_string_lossy().to_string();
            let r = parse(&data);
            assert_eq!(
                name.starts_with("audio-"),
                matches!(r, Ok(Packet::Audio(..))),
                "{name}: {r:?}"
            );
            let mut hub = hub_with(1);
            hub.handle(0, addr(1), &data, &mut Outbox::new());
            n += 1;
        }
        assert!(n >= 5);
    }

    /// Per-client counters: sequence gaps are lost, packets behind the
    /// highest are late; each client's sends and drops are its own.
    #[test]
    fn per_client_stats_and_kick() {
        let mut hub = hub_with(2);
        let mut out = Outbox::new();
        for seq in [0u16, 1, 4, 3, 5] {
            hub.handle(u64::from(seq), addr(1), &packet(seq, 64, 1, 0.1), &mut out);
        }
        hub.handle(9, addr(2), &packet(0, 64, 1, 0.1), &mut out);
        hub.handle(10, addr(2), &[0u8; 20], &mut out);
        let info = hub.clients_info(1_000_000_000);
        let one = info.iter().find(|c| c.addr == addr(1)).unwrap();
        let two = info.iter().find(|c| c.addr == addr(2)).unwrap();
        assert_eq!(
            (one.stats.rx_packets, one.stats.lost, one.stats.late),
            (5, 2, 1)
        );
        assert_eq!(one.stats.rx_bytes, 5 * (16 + 128));
        assert_eq!((two.stats.rx_packets, two.stats.drop_malformed), (1, 1));
        assert_eq!(one.stats.tx_packets, 1, "client 2's one packet, forwarded");
        assert_eq!(two.stats.tx_packets, 0, "client 1 sent before 2 joined");
        assert_eq!(one.idle_ms, 999);
        assert!(!hub.set_gain(one.id, f32::NAN) && !hub.set_gain(one.id, 17.0));
        assert!(hub.set_gain(one.id, 0.5));
        assert!(hub.kick(one.id));
        assert!(!hub.kick(one.id));
        out.clear();
        hub.handle(20, addr(1), &packet(6, 64, 1, 0.1), &mut out);
        assert!(out.is_empty());
        let s = hub.stats();
        assert_eq!((s.kicks, s.clients, s.drop_unknown_peer), (1, 1, 1));
    }

    /// A pending single contribution is sent as it was when its sender's
    /// next packet comes first (not the newer packet, twice).
    #[test]
    fn early_next_packet_sends_the_pending_one() {
        let mut hub = hub_with(3);
        let mut out = Outbox::new();
        for p in 1..=3 {
            hub.handle(0, addr(p), &packet(0, 64, 1, 0.0), &mut out);
        }
        out.clear();
        // Client 2's mix was waiting for 1 (3 came after it); 3's waits for 2.
        let first = packet(1, 64, 1, 0.25);
        hub.handle(10, addr(1), &first, &mut out);
        assert_eq!(out.iter().map(|(d, _)| d).collect::<Vec<_>>(), [addr(2)]);
        out.clear();
        hub.handle(20, addr(1), &packet(2, 64, 1, 0.5), &mut out);
        assert_eq!(out.len(), 1);
        let (dst, data) = out.get(0).unwrap();
        assert_eq!(dst, addr(3));
        assert_eq!(data[HEADER_LEN..], first[HEADER_LEN..]);
    }

    proptest! {
        #[test]
        fn parser_and_hub_never_panic(datagrams in proptest::collection::vec((0u16..4, proptest::collection::vec(any::<u8>(), 0..300)), 1..40)) {
            let mut hub = hub_with(3);
            let mut out = Outbox::new();
            let mut now = 0;
            for (p, d) in datagrams {
                now += 1_000_000;
                let _ = parse(&d);
                hub.handle(now, addr(p), &d, &mut out);
                hub.tick(now, &mut out);
                prop_assert!(out.iter().all(|(_, d)| parse(d).is_ok()));
                out.clear();
            }
        }
    }
}
