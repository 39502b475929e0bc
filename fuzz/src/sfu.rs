//! SFU targets: the pktswitch wire format, and the forwarding core driven
//! by a script of datagrams from a few addresses, in which the peers use
//! the cookies, SSIDs and tokens the core gave them (or another peer's).

use ringway_sfu::wire::{
    self, write_auth, write_cookie, write_error, write_subscribe, Kind, MediaSel, SourceSel,
    COOKIE_LEN, CTRL_AUTH_LEN,
};
use ringway_sfu::{Action, Control, MediaType, MsgType, RtpPacket, Selector, Sfu, SfuConfig};
use std::collections::HashMap;
use std::net::SocketAddr;

/// One datagram through the RTP and control parsers: views stay inside
/// the datagram, the first-byte classifier agrees with the parsers, and a
/// control message the parser accepts is written back byte for byte by
/// the matching writer.
pub fn sfu_wire(data: &[u8]) {
    let kind = wire::classify(data);
    if let Ok(p) = RtpPacket::new_checked(data) {
        assert_eq!(kind, Kind::Rtp);
        let payload = p.payload();
        let start = payload.as_ptr() as usize - data.as_ptr() as usize;
        assert!(start + payload.len() <= data.len());
        let _ = (
            p.marker(),
            p.payload_type(),
            p.seq(),
            p.timestamp(),
            p.ssrc(),
        );
        let _ = (p.extension(), p.send_time());
    }
    let Ok(c) = Control::new_checked(data) else {
        return;
    };
    assert_eq!(kind, Kind::Control);
    let (ty, req) = (c.msg_type(), c.request_id());
    let mut out = vec![0u8; data.len().max(CTRL_AUTH_LEN)];
    let v2 = c.version() == wire::CTRL_VERSION_2;
    let cookie = c.cookie();
    let n = match (ty, cookie) {
        (MsgType::Register, Some(cookie)) if v2 => wire::write_register_v2(
            &mut out,
            req,
            &cookie,
            c.room().expect("v2 REGISTER has a room"),
            c.join_token().expect("v2 REGISTER has a token field"),
        ),
        (MsgType::Rebind, Some(cookie)) => {
            wire::write_rebind(&mut out, req, &cookie, c.ssid(), c.token())
        }
        (MsgType::Keepalive, _) if v2 => {
            wire::write_keepalive_v2(&mut out, req, c.ssid(), c.token(), c.echo_rtt_us())
        }
        // The other messages have one layout, written as version 1.
        _ if v2 => None,
        (MsgType::Register | MsgType::Join | MsgType::Challenge, Some(cookie)) => {
            write_cookie(&mut out, ty, req, &cookie)
        }
        (MsgType::Keepalive | MsgType::Leave | MsgType::Ack, _) => {
            write_auth(&mut out, ty, req, c.ssid(), c.token())
        }
        (MsgType::Subscribe | MsgType::Unsubscribe, _) => {
            let sels: Vec<Selector> = c.selectors().collect();
            write_subscribe(&mut out, ty, req, c.ssid(), c.token(), &sels)
        }
        (MsgType::Error, _) => match c.error_code() {
            // The writer zeroes the reserved bytes; compare what it writes.
            Some(code) if data[9..12] == [0, 0, 0] => write_error(&mut out, req, code, c.ssid()),
            _ => None,
        },
        _ => None,
    };
    if let Some(n) = n {
        assert_eq!(&out[..n], data, "{ty:?} does not round-trip");
    }
}

/// Addresses of the scripted peers (8: two share a /24, one is IPv6).
fn peer(i: u8) -> SocketAddr {
    const PEERS: [&str; 8] = [
        "192.0.2.1:4000",
        "192.0.2.1:4001",
        "192.0.2.2:4000",
        "198.51.100.7:9",
        "203.0.113.1:4000",
        "203.0.113.200:4000",
        "[2001:db8::1]:4000",
        "[2001:db8:0:1::1]:4000",
    ];
    PEERS[usize::from(i & 7)].parse().expect("literal address")
}

/// What the peers learnt from the core's replies.
#[derive(Default)]
struct Learnt {
    /// Last cookie each peer was challenged with.
    cookies: HashMap<SocketAddr, [u8; COOKIE_LEN]>,
    /// (SSID, token) of every registration acknowledged, in order.
    clients: Vec<(u32, u64)>,
}

/// Reads the fuzz input byte by byte (zeros once it ends).
struct Input<'a>(&'a [u8]);

impl Input<'_> {
    fn byte(&mut self) -> u8 {
        let Some((&b, rest)) = self.0.split_first() else {
            return 0;
        };
        self.0 = rest;
        b
    }
    fn bytes(&mut self, n: usize) -> &[u8] {
        let (a, b) = self.0.split_at(n.min(self.0.len()));
        self.0 = b;
        a
    }
}

/// A script through an SFU with a static room, small tables and a short
/// idle timeout. Each operation is one byte (bits 0–2: the sender; bits
/// 3–6: what it does; bit 7: use its own credentials or another peer's)
/// and its arguments. After every step the core's table invariants hold,
/// no reply is larger than the datagram that caused it or goes anywhere
/// but its sender, and media is copied to subscribers only, never back to
/// the sender unless echo is on.
pub fn sfu_core(data: &[u8]) {
    let mut input = Input(data);
    let echo = input.byte() & 1 == 1;
    let mut sfu = Sfu::new(SfuConfig {
        echo,
        static_room: true,
        max_clients: 4,
        max_subs: 3,
        idle_timeout_ns: 3_000_000_000,
        cookie_period_ns: 10_000_000_000,
        prefix_rate: 5,
        prefix_burst: 3,
        ..SfuConfig::default()
    });
    let mut learnt = Learnt::default();
    let mut now = 1_000_000_000u64;
    let mut buf = [0u8; 512];
    while !input.0.is_empty() {
        let op = input.byte();
        let from = peer(op);
        let own = op & 0x80 == 0;
        let other = if own { from } else { peer(input.byte()) };
        let pick = usize::from(input.byte());
        let (ssid, token) = learnt
            .clients
            .get(pick % learnt.clients.len().max(1))
            .copied()
            .unwrap_or((pick as u32, 0));
        let request = input.byte().into();
        let n = match (op >> 3) & 0x0f {
            0 => {
                let n = usize::from(input.byte());
                let raw = input.bytes(n);
                buf[..raw.len()].copy_from_slice(raw);
                Some(raw.len())
            }
            1 => write_cookie(&mut buf, MsgType::Register, request, &[0; COOKIE_LEN]),
            2 | 3 => {
                let ty = if op & 0x08 == 0 {
                    MsgType::Register
                } else {
                    MsgType::Join
                };
                let cookie = learnt.cookies.get(&other).copied().unwrap_or_default();
                write_cookie(&mut buf, ty, request, &cookie)
            }
            4 | 5 => {
                let ty = if op & 0x08 == 0 {
                    MsgType::Subscribe
                } else {
                    MsgType::Unsubscribe
                };
                let count = usize::from(input.byte() % 5);
                let sels: Vec<Selector> = (0..count)
                    .map(|_| {
                        let (s, m) = (input.byte(), input.byte());
                        let source = match learnt.clients.get(usize::from(s)) {
                            Some(&(ssid, _)) if s & 0x80 == 0 => SourceSel::Ssid(ssid),
                            _ if s == 0xff => SourceSel::All,
                            _ => SourceSel::Ssid(u32::from(s)),
                        };
                        let media = match MediaType::from_code(m % 4) {
                            Some(t) => MediaSel::One(t),
                            None => MediaSel::All,
                        };
                        Selector { source, media }
                    })
                    .collect();
                write_subscribe(&mut buf, ty, request, ssid, token, &sels)
            }
            6 => write_auth(&mut buf, MsgType::Keepalive, request, ssid, token),
            7 => write_auth(&mut buf, MsgType::Leave, request, ssid, token),
            8..=11 => {
                // RTP with a known SSID as SSRC (or the pick), a payload
                // type from the op, a fuzzed length.
                let h = wire::RtpHeader {
                    payload_type: 96 + ((op >> 3) & 3),
                    marker: false,
                    seq: u16::from(input.byte()),
                    timestamp: 0,
                    ssrc: ssid,
                };
                let len = 12 + usize::from(input.byte() % 64);
                wire::write_rtp(&mut buf, &h, None, len)
            }
            12 => {
                now += u64::from(input.byte()) * 50_000_000;
                sfu.tick(now);
                None
            }
            13 => {
                // A control message with a stolen cookie pasted over bytes 8..20.
                let cookie = learnt.cookies.get(&other).copied().unwrap_or_default();
                let n = usize::from(input.byte());
                let raw = input.bytes(n);
                buf[..raw.len()].copy_from_slice(raw);
                if raw.len() >= CTRL_AUTH_LEN {
                    buf[8..CTRL_AUTH_LEN].copy_from_slice(&cookie);
                }
                Some(raw.len())
            }
            _ => {
                now += 1_000_000;
                None
            }
        }
        .unwrap_or(0);
        if n == 0 {
            continue;
        }
        now += 1_000;
        step(&mut sfu, &mut learnt, echo, now, from, &buf[..n]);
        if let Err(e) = sfu.check_invariants() {
            panic!("SFU tables inconsistent: {e}");
        }
    }
}

/// One datagram through the core, checking and learning from its action.
fn step(
    sfu: &mut Sfu,
    learnt: &mut Learnt,
    echo_on: bool,
    now: u64,
    from: SocketAddr,
    datagram: &[u8],
) {
    match sfu.handle(now, from, datagram) {
        Action::Reply { dst, msg } => {
            assert_eq!(dst, from, "a reply to another address");
            assert!(msg.len() <= datagram.len(), "reply larger than the request");
            let c = Control::new_checked(msg).expect("replies parse");
            match c.msg_type() {
                MsgType::Challenge => {
                    learnt
                        .cookies
                        .insert(from, c.cookie().expect("challenge cookie"));
                }
                MsgType::Ack
                    if learnt.clients.len() < 64
                        && Control::new_checked(datagram)
                            .is_ok_and(|r| r.msg_type() == MsgType::Register) =>
                {
                    learnt.clients.push((c.ssid(), c.token()));
                }
                _ => {}
            }
        }
        Action::Forward { targets, echo, .. } => {
            assert!(!targets.contains(&from), "media copied back to its sender");
            if let Some(e) = echo {
                assert!(echo_on && e == from, "echo to {e} from {from}");
            }
        }
        Action::Drop(_) => {}
    }
}

/// A script of JackTrip datagrams through a three-client hub: each
/// datagram is `[sender (0–3; 3 never shook hands), length (2 bytes, big
/// endian), bytes...]`, and the hub's period runs after each. Whatever the hub sends is a JackTrip packet, to a
/// client that completed the handshake.
pub fn sfu_jacktrip(data: &[u8]) {
    use ringway_sfu::jacktrip::{parse, Hub, HubConfig, Outbox};
    let mut hub = Hub::new(HubConfig::default()).expect("default hub");
    let client = |p: u8| SocketAddr::from(([192, 0, 2, 1 + (p & 3)], 4464));
    for p in 0..3 {
        assert!(hub.handshake(0, client(p).ip(), client(p).port()));
    }
    let mut input = Input(data);
    let mut out = Outbox::new();
    let mut now = 0u64;
    while !input.0.is_empty() {
        let from = client(input.byte());
        let n = usize::from(u16::from_be_bytes([input.byte(), input.byte()]));
        let datagram = input.bytes(n).to_vec();
        now += 1_000_000;
        let _ = parse(&datagram);
        hub.handle(now, from, &datagram, &mut out);
        hub.tick(now, &mut out);
        for (dst, data) in out.iter() {
            assert!(parse(data).is_ok(), "the hub sent a malformed packet");
            assert!((0..3).any(|p| client(p) == dst), "sent to {dst}");
        }
        out.clear();
    }
}

/// A recording file (as `sfu serve --record-dir` writes them) through the
/// reader, the L16/L24 conversion (payload types 96 L16 mono, 97 L24
/// stereo, 0 L16 mono) and the WAV writer: never a panic; records lie
/// inside the file and are 1 to `MAX_PACKET` bytes; the reader stops after
/// its first error; the samples are bounded by the input (gaps filled with
/// silence add at most as much as was received, plus one longest gap per
/// track); every WAV is a RIFF file of its track's samples.
pub fn sfu_recording(data: &[u8]) {
    use ringway_sfu::recording::{
        convert, wav, ConvertStats, PayloadMap, Reader, MAX_PACKET, RECORD_HEADER_LEN,
    };
    let Ok(reader) = Reader::new(data) else {
        return;
    };
    let mut records = Vec::new();
    let mut bytes = 0;
    let mut failed = false;
    for r in reader {
        assert!(!failed, "a record after an error");
        match r {
            Ok(rec) => {
                assert!(!rec.packet.is_empty() && rec.packet.len() <= MAX_PACKET);
                bytes += RECORD_HEADER_LEN + rec.packet.len();
                records.push(rec);
            }
            Err(_) => failed = true,
        }
    }
    assert!(bytes <= data.len(), "records longer than the file");
    let mut map = PayloadMap::default();
    for spec in ["96=L16/8000/1", "97=L24/8000/2", "0=L16/8000/1"] {
        map.add(spec).expect("valid map entry");
    }
    let mut stats = ConvertStats::default();
    let n = records.len() as u64;
    let tracks = convert(records, &map, &mut stats);
    assert_eq!(stats.records, n, "every record counted");
    for t in &tracks {
        assert!(
            t.samples.len() <= 2 * data.len() + 16_000 * 2,
            "{} samples from {} bytes",
            t.samples.len(),
            data.len()
        );
        if let Some(w) = wav(t) {
            assert!(w.starts_with(b"RIFF"), "not a WAV file");
            assert_eq!(w.len(), 44 + t.samples.len() * t.format.encoding.bytes());
        }
    }
}

/// A join token through verification (and base64url decoding): never a
/// panic, and a token that verifies names the room it was checked for.
pub fn sfu_token(data: &[u8]) {
    use ringway_sfu::token::{b64url_decode, b64url_encode, verify, TokenKey};
    let key = TokenKey::new(b"ringway-corpus-key-0123456789abcdef".to_vec()).expect("key");
    if let Ok(v) = verify(&key, data, "jam", 1_700_000_000) {
        assert_eq!(v.claims.room, "jam");
    }
    if let Some(bytes) = b64url_decode(data) {
        assert_eq!(b64url_decode(b64url_encode(&bytes).as_bytes()), Some(bytes));
    }
}
