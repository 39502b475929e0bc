//! A JackTrip hub without I/O: JackTrip 1.7's UDP packet header and audio
//! encodings, and a mixer that gives each client the sum of the others
//! (N−1), or the other's packet as it came when there is only one other
//! with the same format (plain forwarding).
//!
//! **The packet** (JackTrip's `DefaultHeaderStruct`, written by memcpy of a
//! host struct, so little-endian on every platform JackTrip ships on; 16
//! bytes):
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 8 | time stamp (µs since the Unix epoch, sender's clock) |
//! | 8 | 2 | sequence number |
//! | 10 | 2 | buffer size (frames per packet) |
//! | 12 | 1 | sampling rate code (0 22.05k, 1 32k, 2 44.1k, 3 48k, 4 88.2k, 5 96k, 6 192k) |
//! | 13 | 1 | bit resolution (8, 16, 24, 32) |
//! | 14 | 1 | channels the sender wants from the network |
//! | 15 | 1 | channels it sends: 0 = as many as it wants, 255 = none |
//!
//! then `frames × channels × bytes` of interleaved audio (frame-major).
//! 16-bit samples are `round(x × 32767)` little-endian; 24-bit ones are
//! JackTrip's own (a 16-bit `floor(x × 32768)` and an 8-bit remainder);
//! 32-bit ones are IEEE floats. A datagram of 63 bytes of 0xFF is the exit
//! packet. (Read from JackTrip's PacketHeader, AudioInterface and
//! UdpDataProtocol sources; nothing copied.)
//!
//! **Timing.** Packets drive everything: when client k's packet arrives,
//! its audio is added to every other client j's pending mix; j's mix is
//! sent as soon as every other active client has contributed, when a
//! contributor comes again before that (its next period started), or one
//! packet period after the first contribution ([`Hub::tick`]), whichever
//! is first. The delay the hub adds to a packet is the time it waits in a
//! pending mix: 0 for the last contributor, less than a period for the
//! others.

use std::net::SocketAddr;

/// Header length.
pub const HEADER_LEN: usize = 16;
/// Length of JackTrip's exit packet (all 0xFF).
pub const EXIT_LEN: usize = 63;
/// Most channels per client.
pub const MAX_CHANNELS: usize = 64;
/// Most frames per packet.
pub const MAX_FRAMES: usize = 4096;

/// Sampling rate of a JackTrip rate code.
pub fn rate_of_code(code: u8) -> Option<u32> {
    Some(match code {
        0 => 22_050,
        1 => 32_000,
        2 => 44_100,
        3 => 48_000,
        4 => 88_200,
        5 => 96_000,
        6 => 192_000,
        _ => return None,
    })
}

/// The JackTrip rate code of a sampling rate.
pub fn code_of_rate(rate: u32) -> Option<u8> {
    (0..7).find(|&c| rate_of_code(c) == Some(rate))
}

/// A parsed JackTrip header.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Header {
    /// Sender's time stamp (µs).
    pub timestamp_us: u64,
    /// Sequence number.
    pub seq: u16,
    /// Frames per packet.
    pub frames: u16,
    /// Rate code.
    pub rate_code: u8,
    /// Bits per sample (8, 16, 24, 32).
    pub bits: u8,
    /// Channels the sender wants to receive.
    pub channels_in: u8,
    /// Channels field as sent (0: same as `channels_in`, 255: none).
    pub channels_out_field: u8,
}

impl Header {
    /// Channels of audio in this packet.
    pub fn channels_sent(&self) -> usize {
        match self.channels_out_field {
            0 => self.channels_in as usize,
            255 => 0,
            n => n as usize,
        }
    }
    /// Bytes per sample.
    pub fn sample_bytes(&self) -> usize {
        self.bits as usize / 8
    }
    /// Write the header into `out[..16]`.
    pub fn write(&self, out: &mut [u8]) {
        out[0..8].copy_from_slice(&self.timestamp_us.to_le_bytes());
        out[8..10].copy_from_slice(&self.seq.to_le_bytes());
        out[10..12].copy_from_slice(&self.frames.to_le_bytes());
        out[12] = self.rate_code;
        out[13] = self.bits;
        out[14] = self.channels_in;
        out[15] = self.channels_out_field;
    }
}

/// Why a datagram is not a JackTrip audio packet.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, thiserror::Error, serde::Serialize)]
pub enum PacketError {
    /// Shorter than the header.
    #[error("shorter than the header")]
    Truncated,
    /// Bit resolution not 8, 16, 24 or 32, unknown rate code, or frame or
    /// channel counts out of range.
    #[error("bad header field")]
    BadHeader,
    /// Length does not match frames × channels × bytes per sample.
    #[error("length does not match the header")]
    BadLength,
}

/// What a datagram is.
#[derive(Debug, PartialEq, Eq)]
pub enum Packet<'a> {
    /// Audio: header and interleaved samples.
    Audio(Header, &'a [u8]),
    /// The exit packet.
    Exit,
}

/// Parse one datagram.
pub fn parse(buf: &[u8]) -> Result<Packet<'_>, PacketError> {
    if buf.len() == EXIT_LEN && buf.iter().all(|&b| b == 0xff) {
        return Ok(Packet::Exit);
    }
    if buf.len() < HEADER_LEN {
        return Err(PacketError::Truncated);
    }
    let h = Header {
        timestamp_us: u64::from_le_bytes(buf[0..8].try_into().expect("8 bytes")),
        seq: u16::from_le_bytes([buf[8], buf[9]]),
        frames: u16::from_le_bytes([buf[10], buf[11]]),
        rate_code: buf[12],
        bits: buf[13],
        channels_in: buf[14],
        channels_out_field: buf[15],
    };
    if !matches!(h.bits, 8 | 16 | 24 | 32)
        || rate_of_code(h.rate_code).is_none()
        || h.frames == 0
        || h.frames as usize > MAX_FRAMES
        || h.channels_sent() > MAX_CHANNELS
        || h.channels_in as usize > MAX_CHANNELS
    {
        return Err(PacketError::BadHeader);
    }
    let audio = &buf[HEADER_LEN..];
    if audio.len() != h.frames as usize * h.channels_sent() * h.sample_bytes() {
        return Err(PacketError::BadLength);
    }
    Ok(Packet::Audio(h, audio))
}

/// Decode one sample (JackTrip's conversions).
pub fn decode_sample(b: &[u8], bits: u8) -> f32 {
    match bits {
        8 => f32::from(b[0] as i8) / 127.0,
        16 => f32::from(i16::from_le_bytes([b[0], b[1]])) / 32767.0,
        24 => {
            let hi = f32::from(i16::from_le_bytes([b[0], b[1]]));
            (hi + f32::from(b[2]) / 256.0) / 32768.0
        }
        _ => f32::from_le_bytes([b[0], b[1], b[2], b[3]]),
    }
}

/// Encode one sample, saturating at full scale.
pub fn encode_sample(x: f32, out: &mut [u8], bits: u8) {
    let x = if x.is_nan() { 0.0 } else { x.clamp(-1.0, 1.0) };
    match bits {
        8 => out[0] = (x * 127.0).round() as i8 as u8,
        16 => out[..2].copy_from_slice(&((x * 32767.0).round() as i16).to_le_bytes()),
        24 => {
            let t = (x * 32768.0).min(32767.996);
            let hi = t.floor();
            out[..2].copy_from_slice(&(hi as i16).to_le_bytes());
            out[2] = ((t - hi) * 256.0).floor().clamp(0.0, 255.0) as u8;
        }
        _ => out[..4].copy_from_slice(&x.to_le_bytes()),
    }
}

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
    /// Datagrams from addresses without a handshake.
    pub drop_unknown_peer: u64,
    /// Malformed datagrams (header or length).
    pub drop_malformed: u64,
    /// Packets at another sampling rate than the hub's.
    pub drop_rate_mismatch: u64,
    /// Packets with another buffer size than the session's.
    pub drop_frames_mismatch: u64,
}

/// One packet to send.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outgoing {
    /// Destination.
    pub dst: SocketAddr,
    /// Bytes.
    pub data: Vec<u8>,
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
    last_seen: u64,
    /// The last packet's audio as received (for plain forwarding).
    last_audio: Vec<u8>,
    /// Pending mix for this client: interleaved, `frames × channels_in`.
    mix: Vec<f32>,
    /// (contributor id, its arrival) of the pending mix.
    contributors: Vec<(u64, u64)>,
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
    pending: Vec<(std::net::IpAddr, u16, u64)>,
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
        let mut s = self.stats;
        s.clients = self.clients.len() as u64;
        s
    }

    /// Clients: (id, address, gain).
    pub fn clients(&self) -> impl Iterator<Item = (u64, SocketAddr, f32)> + '_ {
        self.clients.iter().map(|c| (c.id, c.addr, c.gain))
    }

    /// Set the gain of client `id` (applied to its audio in the others'
    /// mixes). False if there is no such client.
    pub fn set_gain(&mut self, id: u64, gain: f32) -> bool {
        match self.clients.iter_mut().find(|c| c.id == id) {
            Some(c) if gain.is_finite() && gain >= 0.0 => {
                c.gain = gain;
                true
            }
            _ => false,
        }
    }

    /// The waits of the contributions sent since the last call (ns).
    pub fn take_delays(&mut self, into: &mut Vec<u64>) {
        into.append(&mut self.delays);
    }

    /// A TCP handshake from `ip` announced UDP port `port`: accept its
    /// audio for the handshake timeout. False (counted) when the hub or
    /// the IP's share is full.
    pub fn handshake(&mut self, now: u64, ip: std::net::IpAddr, port: u16) -> bool {
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

    fn period_ns(&self) -> u64 {
        u64::from(self.frames.unwrap_or(128)) * 1_000_000_000 / u64::from(self.cfg.rate)
    }

    /// Handle one datagram from `peer` at `now` (ns); packets to send go to `out`.
    pub fn handle(&mut self, now: u64, peer: SocketAddr, data: &[u8], out: &mut Vec<Outgoing>) {
        self.stats.rx_datagrams += 1;
        let known = self.clients.iter().position(|c| c.addr == peer);
        let packet = match parse(data) {
            Ok(p) => p,
            Err(_) => {
                if known.is_some() {
                    self.stats.drop_malformed += 1;
                } else {
                    self.stats.drop_unknown_peer += 1;
                }
                return;
            }
        };
        let (h, audio) = match packet {
            Packet::Exit => {
                if let Some(i) = known {
                    self.remove(i);
                    self.stats.exits += 1;
                } else {
                    self.stats.drop_unknown_peer += 1;
                }
                return;
            }
            Packet::Audio(h, a) => (h, a),
        };
        let i = match known {
            Some(i) => i,
            None => match self.latch(now, peer, &h) {
                Some(i) => i,
                None => return,
            },
        };
        if h.rate_code != self.rate_code {
            self.stats.drop_rate_mismatch += 1;
            return;
        }
        if Some(h.frames) != self.frames {
            self.stats.drop_frames_mismatch += 1;
            return;
        }
        self.stats.rx_audio += 1;
        let period = self.period_ns();
        let active_window = period * self.cfg.active_periods;
        let c = &mut self.clients[i];
        c.last_seen = now;
        c.bits = h.bits;
        c.channels_in = (h.channels_in as usize).max(1);
        c.channels_sent = h.channels_sent();
        c.last_audio.clear();
        c.last_audio.extend_from_slice(audio);
        let (kid, gain, kch, kbits) = (c.id, c.gain, c.channels_sent, c.bits);
        let frames = h.frames as usize;
        // Decode once.
        self.scratch.clear();
        let sb = kbits as usize / 8;
        self.scratch.extend(
            audio
                .chunks_exact(sb)
                .map(|s| decode_sample(s, kbits) * gain),
        );
        for j in 0..self.clients.len() {
            if j == i {
                continue;
            }
            if self.clients[j]
                .contributors
                .iter()
                .any(|&(id, _)| id == kid)
            {
                // k's next period began before j's mix was complete.
                self.flush(j, now, out);
            }
            let cj = &mut self.clients[j];
            let jch = cj.channels_in;
            if cj.mix.len() != frames * jch {
                cj.mix.clear();
                cj.mix.resize(frames * jch, 0.0);
            }
            if kch > 0 {
                for f in 0..frames {
                    for ch in 0..kch {
                        cj.mix[f * jch + ch % jch] += self.scratch[f * kch + ch];
                    }
                }
            }
            cj.contributors.push((kid, now));
            let jid = cj.id;
            let active = self
                .clients
                .iter()
                .filter(|c| c.id != jid && now.saturating_sub(c.last_seen) <= active_window)
                .count();
            if self.clients[j].contributors.len() >= active {
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
        let from_ip: Vec<usize> = (0..self.pending.len())
            .filter(|&k| self.pending[k].0 == ip)
            .collect();
        let k = match (exact, from_ip.as_slice()) {
            (Some(k), _) => k,
            (None, [k]) => *k,
            _ => {
                self.stats.drop_unknown_peer += 1;
                return None;
            }
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
        self.pending.swap_remove(k);
        let id = self.next_id;
        self.next_id += 1;
        self.clients.push(HubClient {
            addr: peer,
            id,
            gain: 1.0,
            bits: h.bits,
            channels_in: (h.channels_in as usize).max(1),
            channels_sent: h.channels_sent(),
            seq_out: 0,
            last_seen: now,
            last_audio: Vec::new(),
            mix: Vec::new(),
            contributors: Vec::new(),
        });
        self.stats.joins += 1;
        Some(self.clients.len() - 1)
    }

    /// Send client `j`'s pending mix (if any contribution is pending).
    fn flush(&mut self, j: usize, now: u64, out: &mut Vec<Outgoing>) {
        if self.clients[j].contributors.is_empty() {
            return;
        }
        let frames = self.frames.unwrap_or(0) as usize;
        let rate_code = self.rate_code;
        // Plain forwarding: one contributor at unity gain, same format.
        let single = match self.clients[j].contributors.as_slice() {
            [(k, _)] => self.clients.iter().find(|c| c.id == *k).filter(|k| {
                k.gain == 1.0
                    && k.bits == self.clients[j].bits
                    && k.channels_sent == self.clients[j].channels_in
                    && k.last_audio.len() == frames * k.channels_sent * k.bits as usize / 8
            }),
            _ => None,
        }
        .map(|k| k.last_audio.clone());
        let c = &mut self.clients[j];
        let sb = c.bits as usize / 8;
        let mut data = vec![0u8; HEADER_LEN + frames * c.channels_in * sb];
        Header {
            timestamp_us: now / 1000,
            seq: c.seq_out,
            frames: frames as u16,
            rate_code,
            bits: c.bits,
            channels_in: c.channels_in as u8,
            channels_out_field: 0,
        }
        .write(&mut data);
        c.seq_out = c.seq_out.wrapping_add(1);
        if let Some(raw) = &single {
            data[HEADER_LEN..].copy_from_slice(raw);
            self.stats.tx_forwarded += 1;
        } else {
            for (s, x) in data[HEADER_LEN..].chunks_exact_mut(sb).zip(&c.mix) {
                encode_sample(*x, s, c.bits);
            }
        }
        c.mix.iter_mut().for_each(|x| *x = 0.0);
        for &(_, arrived) in &c.contributors {
            self.delays.push(now.saturating_sub(arrived));
        }
        c.contributors.clear();
        self.stats.tx_packets += 1;
        out.push(Outgoing { dst: c.addr, data });
    }

    /// When [`Hub::tick`] has work: the earliest mix deadline.
    pub fn next_deadline(&self) -> Option<u64> {
        let p = self.period_ns();
        self.clients
            .iter()
            .filter_map(|c| c.contributors.first().map(|&(_, t)| t + p))
            .min()
    }

    /// Send mixes whose period is over; expire idle clients and handshakes.
    pub fn tick(&mut self, now: u64, out: &mut Vec<Outgoing>) {
        let p = self.period_ns();
        for j in 0..self.clients.len() {
            if self.clients[j]
                .contributors
                .first()
                .is_some_and(|&(_, t)| now >= t + p)
            {
                self.flush(j, now, out);
                self.stats.mixes_by_deadline += 1;
            }
        }
        let limit = self.cfg.idle_timeout_ns;
        while let Some(i) = self
            .clients
            .iter()
            .position(|c| now.saturating_sub(c.last_seen) > limit)
        {
            self.remove(i);
            self.stats.timeouts += 1;
        }
        self.pending.retain(|p| p.2 > now);
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

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    fn addr(p: u16) -> SocketAddr {
        SocketAddr::from(([10, 0, 0, 1], p))
    }

    /// A 16-bit packet of `frames` × `ch` with every sample `v`.
    fn packet(seq: u16, frames: u16, ch: u8, v: f32) -> Vec<u8> {
        let mut d = vec![0u8; HEADER_LEN + frames as usize * ch as usize * 2];
        Header {
            timestamp_us: 1,
            seq,
            frames,
            rate_code: 3,
            bits: 16,
            channels_in: ch,
            channels_out_field: 0,
        }
        .write(&mut d);
        for s in d[HEADER_LEN..].chunks_exact_mut(2) {
            encode_sample(v, s, 16);
        }
        d
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

    #[test]
    fn header_roundtrip_and_checks() {
        let d = packet(7, 64, 2, 0.5);
        let Ok(Packet::Audio(h, a)) = parse(&d) else {
            panic!()
        };
        assert_eq!((h.seq, h.frames, h.bits, h.channels_sent()), (7, 64, 16, 2));
        assert_eq!(a.len(), 256);
        assert_eq!(parse(&d[..d.len() - 1]), Err(PacketError::BadLength));
        assert_eq!(parse(&d[..10]), Err(PacketError::Truncated));
        let mut bad = d.clone();
        bad[13] = 12;
        assert_eq!(parse(&bad), Err(PacketError::BadHeader));
        assert_eq!(parse(&[0xff; EXIT_LEN]), Ok(Packet::Exit));
        // 255 = sends nothing: header only.
        let mut none = d[..HEADER_LEN].to_vec();
        none[15] = 255;
        assert!(matches!(parse(&none), Ok(Packet::Audio(_, a)) if a.is_empty()));
    }

    #[test]
    fn sample_conversions() {
        let mut b = [0u8; 4];
        for bits in [8u8, 16, 24, 32] {
            for x in [-1.0f32, -0.5, 0.0, 0.25, 0.999] {
                encode_sample(x, &mut b, bits);
                let y = decode_sample(&b, bits);
                assert!((x - y).abs() < 0.01, "{bits}: {x} -> {y}");
            }
            encode_sample(3.0, &mut b, bits);
            assert!(decode_sample(&b, bits) <= 1.0001, "saturates");
        }
        encode_sample(0.5, &mut b, 16);
        assert_eq!(i16::from_le_bytes([b[0], b[1]]), 16384);
    }

    /// Three clients: each gets the sum of the other two as soon as both
    /// contributed, saturating at full scale; gains apply.
    #[test]
    fn n_minus_one_mix() {
        let mut hub = hub_with(3);
        let mut out = Vec::new();
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
            out.iter().map(|o| (o.dst, samples(&o.data)[0])).collect();
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
            out.iter().map(|o| (o.dst, samples(&o.data)[0])).collect();
        assert!((got[&addr(3)] - 1.0).abs() < 1e-3, "saturated: {got:?}");
        assert!((got[&addr(1)] - 0.9).abs() < 1e-3, "client 3 at gain 0");
        // Only the first mix of client 1 (client 2 alone) was a plain forward.
        assert_eq!(hub.stats().tx_forwarded, 1);
    }

    /// Two clients: the other's packet goes as it came (plain forwarding).
    #[test]
    fn two_clients_forward_plainly_and_deadline_flushes() {
        let mut hub = hub_with(2);
        let mut out = Vec::new();
        let a = packet(0, 64, 2, 0.25);
        hub.handle(0, addr(2), &packet(0, 64, 2, 0.0), &mut out);
        assert!(out.is_empty());
        hub.handle(0, addr(1), &a, &mut out);
        assert_eq!(out.len(), 1, "only one other: sent at once");
        hub.handle(1, addr(2), &packet(1, 64, 2, 0.0), &mut out);
        assert_eq!(out.len(), 2);
        assert_eq!(out[0].dst, addr(2));
        assert_eq!(out[0].data[HEADER_LEN..], a[HEADER_LEN..]);
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
        let mut out = Vec::new();
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
            hub.handle(0, addr(1), &data, &mut Vec::new());
            n += 1;
        }
        assert!(n >= 5);
    }

    proptest! {
        #[test]
        fn parser_and_hub_never_panic(datagrams in proptest::collection::vec((0u16..4, proptest::collection::vec(any::<u8>(), 0..300)), 1..40)) {
            let mut hub = hub_with(3);
            let mut out = Vec::new();
            let mut now = 0;
            for (p, d) in datagrams {
                now += 1_000_000;
                let _ = parse(&d);
                hub.handle(now, addr(p), &d, &mut out);
                hub.tick(now, &mut out);
                prop_assert!(out.iter().all(|o| parse(&o.data).is_ok()));
                out.clear();
            }
        }
        #[test]
        fn valid_headers_with_random_fields(frames in 1u16..300, ch in 0u8..5, bits in prop::sample::select(vec![8u8, 16, 24, 32]), out_field in any::<u8>()) {
            let h = Header { timestamp_us: 0, seq: 0, frames, rate_code: 3, bits, channels_in: ch, channels_out_field: out_field };
            let mut d = vec![0u8; HEADER_LEN + frames as usize * h.channels_sent() * (bits as usize / 8)];
            h.write(&mut d);
            let ok = h.channels_sent() <= MAX_CHANNELS;
            prop_assert_eq!(parse(&d).is_ok(), ok);
        }
    }
}
