//! Wire formats: RTP media packets and pktswitch control messages.
//!
//! Both travel on the same UDP port. The first byte tells them apart:
//! RTP version 2 packets start with the bits `10` (0x80..=0xBF), control
//! messages start with the magic `b"PS"` (0x50 = bits `01`). Anything else
//! is malformed. See `docs/pktswitch.md`.

use std::fmt;

/// Errors of the checked constructors.
#[derive(Copy, Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    /// Fewer bytes than the header (or a declared field) needs.
    #[error("packet truncated")]
    Truncated,
    /// RTP version is not 2.
    #[error("RTP version is not 2")]
    BadVersion,
    /// RTP padding length is zero or larger than the payload.
    #[error("bad RTP padding")]
    BadPadding,
    /// Control message: wrong magic.
    #[error("bad control magic")]
    BadMagic,
    /// Control message: unsupported protocol version.
    #[error("unsupported control version {0}")]
    UnsupportedVersion(u8),
    /// Control message: unknown message type.
    #[error("unknown control message type {0:#x}")]
    UnknownType(u8),
    /// Control message: length does not match the message type.
    #[error("control message has the wrong length")]
    BadLength,
    /// Control message: selector with an unknown media type.
    #[error("unknown media type {0}")]
    BadMediaType(u8),
}

/// What a datagram's first byte says it is.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Kind {
    /// RTP (or RTCP) version 2: first two bits `10`.
    Rtp,
    /// pktswitch control message: starts with [`CTRL_MAGIC`].
    Control,
    /// Neither (or empty).
    Unknown,
}

/// Classify a datagram by its first byte.
pub fn classify(data: &[u8]) -> Kind {
    match data.first() {
        Some(b) if b >> 6 == 2 => Kind::Rtp,
        Some(&b) if b == CTRL_MAGIC[0] => Kind::Control,
        _ => Kind::Unknown,
    }
}

/// Media types of the pktswitch SFU: audio, standard- and high-quality video.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum MediaType {
    /// Audio, standard quality (RTP payload type 96).
    Asq = 0,
    /// Video, standard quality (payload type 97).
    Vsq = 1,
    /// Video, high quality (payload type 98).
    Vhq = 2,
}

impl MediaType {
    /// All media types, in code order.
    pub const ALL: [MediaType; 3] = [MediaType::Asq, MediaType::Vsq, MediaType::Vhq];
    /// Number of media types.
    pub const COUNT: usize = 3;
    /// RTP payload type carrying this media type.
    pub fn payload_type(self) -> u8 {
        96 + self as u8
    }
    /// Media type of an RTP payload type (96, 97, 98).
    pub fn from_payload_type(pt: u8) -> Option<Self> {
        match pt {
            96 => Some(MediaType::Asq),
            97 => Some(MediaType::Vsq),
            98 => Some(MediaType::Vhq),
            _ => None,
        }
    }
    /// Media type of a wire code (0, 1, 2).
    pub fn from_code(c: u8) -> Option<Self> {
        MediaType::ALL.get(c as usize).copied()
    }
    /// Short lowercase name.
    pub fn name(self) -> &'static str {
        match self {
            MediaType::Asq => "asq",
            MediaType::Vsq => "vsq",
            MediaType::Vhq => "vhq",
        }
    }
    /// RTP clock rate used for timestamps (48 kHz audio, 90 kHz video).
    pub fn clock_rate(self) -> u32 {
        match self {
            MediaType::Asq => 48_000,
            MediaType::Vsq | MediaType::Vhq => 90_000,
        }
    }
}

impl fmt::Display for MediaType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for MediaType {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        MediaType::ALL
            .iter()
            .copied()
            .find(|m| m.name().eq_ignore_ascii_case(s))
            .ok_or_else(|| format!("unknown media type {s:?} (known: asq, vsq, vhq)"))
    }
}

// ---------------------------------------------------------------- RTP

/// Fixed RTP header length.
pub const RTP_HEADER_LEN: usize = 12;
/// RFC 8285 one-byte header extension profile marker.
pub const ONE_BYTE_PROFILE: u16 = 0xBEDE;
/// Extension element id carrying the sender's send time (u64 ns, big-endian).
pub const SEND_TIME_EXT_ID: u8 = 1;
/// Bytes the send-time extension adds (4 header + 12 data, in 32-bit words: 3).
pub const SEND_TIME_EXT_LEN: usize = 16;

/// A zero-copy view of an RTP packet (RFC 3550).
#[derive(Copy, Clone, Debug)]
pub struct RtpPacket<'a> {
    buf: &'a [u8],
    payload_start: usize,
    payload_end: usize,
    ext: Option<(usize, usize)>,
}

impl<'a> RtpPacket<'a> {
    /// Check the header, CSRC list, extension and padding; then view `buf`.
    pub fn new_checked(buf: &'a [u8]) -> Result<Self, WireError> {
        if buf.len() < RTP_HEADER_LEN {
            return Err(WireError::Truncated);
        }
        if buf[0] >> 6 != 2 {
            return Err(WireError::BadVersion);
        }
        let csrc_count = (buf[0] & 0x0f) as usize;
        let mut off = RTP_HEADER_LEN + 4 * csrc_count;
        if buf.len() < off {
            return Err(WireError::Truncated);
        }
        let mut ext = None;
        if buf[0] & 0x10 != 0 {
            if buf.len() < off + 4 {
                return Err(WireError::Truncated);
            }
            let words = u16::from_be_bytes([buf[off + 2], buf[off + 3]]) as usize;
            let start = off + 4;
            let end = start + 4 * words;
            if buf.len() < end {
                return Err(WireError::Truncated);
            }
            ext = Some((off, end));
            off = end;
        }
        let mut end = buf.len();
        if buf[0] & 0x20 != 0 {
            let pad = buf[buf.len() - 1] as usize;
            if pad == 0 || pad > buf.len() - off {
                return Err(WireError::BadPadding);
            }
            end -= pad;
        }
        Ok(RtpPacket {
            buf,
            payload_start: off,
            payload_end: end,
            ext,
        })
    }
    /// The whole packet.
    pub fn as_bytes(&self) -> &'a [u8] {
        self.buf
    }
    /// Marker bit.
    pub fn marker(&self) -> bool {
        self.buf[1] & 0x80 != 0
    }
    /// Payload type (7 bits).
    pub fn payload_type(&self) -> u8 {
        self.buf[1] & 0x7f
    }
    /// Sequence number.
    pub fn seq(&self) -> u16 {
        u16::from_be_bytes([self.buf[2], self.buf[3]])
    }
    /// RTP timestamp.
    pub fn timestamp(&self) -> u32 {
        u32::from_be_bytes([self.buf[4], self.buf[5], self.buf[6], self.buf[7]])
    }
    /// Synchronisation source (in pktswitch: the sender's SSID).
    pub fn ssrc(&self) -> u32 {
        u32::from_be_bytes([self.buf[8], self.buf[9], self.buf[10], self.buf[11]])
    }
    /// Payload bytes (after CSRCs and extension, before padding).
    pub fn payload(&self) -> &'a [u8] {
        &self.buf[self.payload_start..self.payload_end]
    }
    /// Header extension: (profile, data), if present.
    pub fn extension(&self) -> Option<(u16, &'a [u8])> {
        let (start, end) = self.ext?;
        Some((
            u16::from_be_bytes([self.buf[start], self.buf[start + 1]]),
            &self.buf[start + 4..end],
        ))
    }
    /// Sender's send time (ns) from the RFC 8285 one-byte element
    /// [`SEND_TIME_EXT_ID`] of length 8, if present.
    pub fn send_time(&self) -> Option<u64> {
        let (profile, data) = self.extension()?;
        if profile != ONE_BYTE_PROFILE {
            return None;
        }
        let mut offset = 0;
        while offset < data.len() {
            let byte = data[offset];
            if byte == 0 {
                offset += 1; // padding
                continue;
            }
            let element_id = byte >> 4;
            if element_id == 15 {
                return None; // reserved: stop parsing (RFC 8285 4.2)
            }
            let len = (byte & 0x0f) as usize + 1;
            let value = data.get(offset + 1..offset + 1 + len)?;
            if element_id == SEND_TIME_EXT_ID && len == 8 {
                return Some(u64::from_be_bytes(value.try_into().ok()?));
            }
            offset += 1 + len;
        }
        None
    }
}

/// Fields of an RTP packet to write.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct RtpHeader {
    /// Payload type.
    pub payload_type: u8,
    /// Marker bit.
    pub marker: bool,
    /// Sequence number.
    pub seq: u16,
    /// RTP timestamp.
    pub timestamp: u32,
    /// SSRC (= SSID).
    pub ssrc: u32,
}

/// Write an RTP packet of `total_len` bytes into `buf`: header, the
/// send-time extension when `send_time` is given, then a payload filled with
/// a simple pattern. Returns the length, or `None` if `buf` is too small or
/// `total_len` cannot hold the header (and extension).
pub fn write_rtp(
    buf: &mut [u8],
    h: &RtpHeader,
    send_time: Option<u64>,
    total_len: usize,
) -> Option<usize> {
    let hdr = RTP_HEADER_LEN
        + if send_time.is_some() {
            SEND_TIME_EXT_LEN
        } else {
            0
        };
    if total_len < hdr || buf.len() < total_len {
        return None;
    }
    buf[0] = 0x80 | if send_time.is_some() { 0x10 } else { 0 };
    buf[1] = (h.payload_type & 0x7f) | if h.marker { 0x80 } else { 0 };
    buf[2..4].copy_from_slice(&h.seq.to_be_bytes());
    buf[4..8].copy_from_slice(&h.timestamp.to_be_bytes());
    buf[8..12].copy_from_slice(&h.ssrc.to_be_bytes());
    if let Some(time) = send_time {
        buf[12..14].copy_from_slice(&ONE_BYTE_PROFILE.to_be_bytes());
        buf[14..16].copy_from_slice(&3u16.to_be_bytes());
        buf[16] = (SEND_TIME_EXT_ID << 4) | 7;
        buf[17..25].copy_from_slice(&time.to_be_bytes());
        buf[25..28].fill(0);
    }
    for (i, b) in buf[hdr..total_len].iter_mut().enumerate() {
        *b = i as u8;
    }
    Some(total_len)
}

// ---------------------------------------------------------------- control

/// Control message magic (first two bytes): `b"PS"`.
pub const CTRL_MAGIC: [u8; 2] = *b"PS";
/// Control protocol version of the original messages (and of every reply).
pub const CTRL_VERSION: u8 = 1;
/// Control protocol version 2: REGISTER names a room and may carry a join
/// token, REBIND moves a session to a new address, KEEPALIVE may report
/// the client's echo RTT. Every version-1 message is still accepted as is.
pub const CTRL_VERSION_2: u8 = 2;
/// Longest room name in a version-2 REGISTER (bytes).
pub const MAX_ROOM_LEN: usize = 64;
/// Longest join token in a version-2 REGISTER (bytes).
pub const MAX_TOKEN_LEN: usize = 1024;
/// Length of REBIND: header, cookie (12), SSID (4), token (8).
pub const CTRL_REBIND_LEN: usize = CTRL_AUTH_LEN + 12;
/// Length of a version-2 KEEPALIVE: header, SSID, token, echo RTT (µs, u32).
pub const CTRL_KEEPALIVE_V2_LEN: usize = CTRL_AUTH_LEN + 4;
/// Echo RTT field value meaning "not measured".
pub const NO_RTT: u32 = u32::MAX;
/// Control header: magic (2), version (1), type (1), request id (4).
pub const CTRL_HEADER_LEN: usize = 8;
/// Header plus SSID (4) and token (8): the length of REGISTER, JOIN,
/// CHALLENGE, KEEPALIVE, LEAVE and ACK.
pub const CTRL_AUTH_LEN: usize = CTRL_HEADER_LEN + 12;
/// Bytes of a return-routability cookie (REGISTER, JOIN, CHALLENGE body):
/// epoch (u32) and a keyed MAC (8 bytes).
pub const COOKIE_LEN: usize = 12;
/// ERROR: header, code (1), reserved (3), SSID (4).
pub const CTRL_ERROR_LEN: usize = CTRL_HEADER_LEN + 8;
/// Bytes per subscription selector: source SSID (4) and media code (1).
pub const SELECTOR_LEN: usize = 5;
/// Source SSID wildcard in a selector: every source.
pub const ALL_SOURCES: u32 = u32::MAX;
/// Media code wildcard in a selector: every media type.
pub const ALL_MEDIA: u8 = 0xff;
/// Most selectors one SUBSCRIBE/UNSUBSCRIBE carries.
pub const MAX_SELECTORS: usize = 256;

/// Control message types.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub enum MsgType {
    /// Client → SFU: ask for an SSID and token. Body: the 12-byte cookie of
    /// a CHALLENGE (all zero on the first try, which only earns a
    /// CHALLENGE); 20 bytes, so neither reply is larger than the request.
    Register = 1,
    /// Client → SFU: add selectors.
    Subscribe = 2,
    /// Client → SFU: remove selectors.
    Unsubscribe = 3,
    /// Client → SFU: still here.
    Keepalive = 4,
    /// Client → SFU: remove me and my subscriptions.
    Leave = 5,
    /// Client → SFU: admit my address to the static room; body: the cookie
    /// of the CHALLENGE my first RTP packet earned.
    Join = 6,
    /// Client → SFU (version 2): my address changed (NAT rebinding); body:
    /// the cookie of a CHALLENGE sent to the new address (zero on the first
    /// try), then my SSID and token.
    Rebind = 7,
    /// SFU → client: request done; carries SSID and token.
    Ack = 0x80,
    /// SFU → client: request refused; carries an [`ErrorCode`].
    Error = 0x81,
    /// SFU → client: prove you receive at this address: send the 12-byte
    /// cookie back in a REGISTER (or JOIN) within its lifetime.
    Challenge = 0x82,
}

impl MsgType {
    fn from_u8(b: u8) -> Option<Self> {
        Some(match b {
            1 => MsgType::Register,
            2 => MsgType::Subscribe,
            3 => MsgType::Unsubscribe,
            4 => MsgType::Keepalive,
            5 => MsgType::Leave,
            6 => MsgType::Join,
            7 => MsgType::Rebind,
            0x80 => MsgType::Ack,
            0x81 => MsgType::Error,
            0x82 => MsgType::Challenge,
            _ => return None,
        })
    }
}

/// Error codes carried by [`MsgType::Error`].
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub enum ErrorCode {
    /// The SSID is not registered.
    UnknownSsid = 1,
    /// Token does not match the SSID.
    BadToken = 2,
    /// Request came from another address than the registered one.
    WrongAddress = 3,
    /// Client table full (`--max-clients`).
    TooManyClients = 4,
    /// Subscription table of this client full (`--max-subs`).
    TooManySubs = 5,
    /// The message could not be parsed (only sent for well-framed headers).
    Malformed = 6,
    /// Join token missing, malformed, forged, expired, for another room,
    /// or revoked (kicked).
    Unauthorized = 7,
    /// The room is full (`max_clients_per_room`).
    RoomFull = 8,
    /// No such room (and rooms are not created on demand), or the room table is full.
    NoSuchRoom = 9,
    /// The token does not grant this (publish or subscribe).
    NotAllowed = 10,
}

impl ErrorCode {
    /// Decode a wire code.
    pub fn from_u8(b: u8) -> Option<Self> {
        Some(match b {
            1 => ErrorCode::UnknownSsid,
            2 => ErrorCode::BadToken,
            3 => ErrorCode::WrongAddress,
            4 => ErrorCode::TooManyClients,
            5 => ErrorCode::TooManySubs,
            6 => ErrorCode::Malformed,
            7 => ErrorCode::Unauthorized,
            8 => ErrorCode::RoomFull,
            9 => ErrorCode::NoSuchRoom,
            10 => ErrorCode::NotAllowed,
            _ => return None,
        })
    }
}

/// Which source a selector names.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
pub enum SourceSel {
    /// One SSID.
    Ssid(u32),
    /// Every source, present and future.
    All,
}

/// Which media types a selector names.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
pub enum MediaSel {
    /// One media type.
    One(MediaType),
    /// All media types.
    All,
}

impl MediaSel {
    /// True when `m` is selected.
    pub fn matches(self, m: MediaType) -> bool {
        match self {
            MediaSel::All => true,
            MediaSel::One(x) => x == m,
        }
    }
}

/// One subscription selector: (source, media).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
pub struct Selector {
    /// Source.
    pub source: SourceSel,
    /// Media types.
    pub media: MediaSel,
}

impl Selector {
    /// Every source, every type.
    pub const ALL: Selector = Selector {
        source: SourceSel::All,
        media: MediaSel::All,
    };
    /// True when media type `m` of source `ssid` is selected.
    pub fn matches(&self, ssid: u32, m: MediaType) -> bool {
        (self.source == SourceSel::All || self.source == SourceSel::Ssid(ssid))
            && self.media.matches(m)
    }
    fn encode(&self, out: &mut [u8]) {
        let source = match self.source {
            SourceSel::All => ALL_SOURCES,
            SourceSel::Ssid(source) => source,
        };
        out[..4].copy_from_slice(&source.to_be_bytes());
        out[4] = match self.media {
            MediaSel::All => ALL_MEDIA,
            MediaSel::One(m) => m as u8,
        };
    }
    fn decode(b: &[u8]) -> Result<Self, WireError> {
        let value = u32::from_be_bytes([b[0], b[1], b[2], b[3]]);
        let source = if value == ALL_SOURCES {
            SourceSel::All
        } else {
            SourceSel::Ssid(value)
        };
        let media = if b[4] == ALL_MEDIA {
            MediaSel::All
        } else {
            MediaSel::One(MediaType::from_code(b[4]).ok_or(WireError::BadMediaType(b[4]))?)
        };
        Ok(Selector { source, media })
    }
}

impl std::str::FromStr for Selector {
    type Err = String;
    /// `all`, `SSID`, `SSID:TYPE`, `all:TYPE`, `SSID:all`.
    fn from_str(s: &str) -> Result<Self, String> {
        let (ssid_text, media_text) = s.split_once(':').unwrap_or((s, "all"));
        let source = if ssid_text.eq_ignore_ascii_case("all") {
            SourceSel::All
        } else {
            let ssid: u32 = ssid_text
                .parse()
                .map_err(|_| format!("bad SSID {ssid_text:?}"))?;
            if ssid == 0 || ssid == ALL_SOURCES {
                return Err(format!("SSID {ssid} is reserved"));
            }
            SourceSel::Ssid(ssid)
        };
        let media = if media_text.eq_ignore_ascii_case("all") {
            MediaSel::All
        } else {
            MediaSel::One(media_text.parse()?)
        };
        Ok(Selector { source, media })
    }
}

/// A zero-copy view of a control message.
#[derive(Copy, Clone, Debug)]
pub struct Control<'a> {
    buf: &'a [u8],
    ty: MsgType,
    version: u8,
}

/// A control message failed the checks; `request_id` is set when the
/// header was intact enough to answer with an ERROR.
#[derive(Copy, Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{error}")]
pub struct ControlError {
    /// What was wrong.
    pub error: WireError,
    /// Request id, when magic and version were correct.
    pub request_id: Option<u32>,
}

impl<'a> Control<'a> {
    /// Check magic, version, type and exact length (selectors included).
    pub fn new_checked(buf: &'a [u8]) -> Result<Self, ControlError> {
        let fail = |error, request_id| ControlError { error, request_id };
        if buf.len() < CTRL_HEADER_LEN {
            return Err(fail(WireError::Truncated, None));
        }
        if buf[..2] != CTRL_MAGIC {
            return Err(fail(WireError::BadMagic, None));
        }
        let version = buf[2];
        if version != CTRL_VERSION && version != CTRL_VERSION_2 {
            return Err(fail(WireError::UnsupportedVersion(version), None));
        }
        let req = Some(u32::from_be_bytes([buf[4], buf[5], buf[6], buf[7]]));
        let msg_type = MsgType::from_u8(buf[3]).ok_or(fail(WireError::UnknownType(buf[3]), req))?;
        let is_v2 = version == CTRL_VERSION_2;
        let ok_len = match msg_type {
            MsgType::Rebind => is_v2 && buf.len() == CTRL_REBIND_LEN,
            MsgType::Register if is_v2 => register_v2_ok(buf),
            MsgType::Keepalive if is_v2 => buf.len() == CTRL_KEEPALIVE_V2_LEN,
            MsgType::Register
            | MsgType::Join
            | MsgType::Challenge
            | MsgType::Keepalive
            | MsgType::Leave
            | MsgType::Ack => buf.len() == CTRL_AUTH_LEN,
            MsgType::Error => buf.len() == CTRL_ERROR_LEN,
            MsgType::Subscribe | MsgType::Unsubscribe => {
                if buf.len() < CTRL_AUTH_LEN + 2 {
                    false
                } else {
                    let needed =
                        u16::from_be_bytes([buf[CTRL_AUTH_LEN], buf[CTRL_AUTH_LEN + 1]]) as usize;
                    needed <= MAX_SELECTORS
                        && buf.len() == CTRL_AUTH_LEN + 2 + needed * SELECTOR_LEN
                }
            }
        };
        if !ok_len {
            return Err(fail(WireError::BadLength, req));
        }
        let control = Control {
            buf,
            ty: msg_type,
            version,
        };
        if matches!(msg_type, MsgType::Subscribe | MsgType::Unsubscribe) {
            for s in control.raw_selectors() {
                Selector::decode(s).map_err(|e| fail(e, req))?;
            }
        }
        Ok(control)
    }
    /// Message type.
    pub fn msg_type(&self) -> MsgType {
        self.ty
    }
    /// Protocol version of the message (1 or 2).
    pub fn version(&self) -> u8 {
        self.version
    }
    /// Request id (echoed in the ACK or ERROR).
    pub fn request_id(&self) -> u32 {
        u32::from_be_bytes([self.buf[4], self.buf[5], self.buf[6], self.buf[7]])
    }
    /// SSID field (0 in REGISTER).
    pub fn ssid(&self) -> u32 {
        let offset = match self.ty {
            MsgType::Error => 12,
            MsgType::Rebind => CTRL_AUTH_LEN,
            _ => 8,
        };
        u32::from_be_bytes([
            self.buf[offset],
            self.buf[offset + 1],
            self.buf[offset + 2],
            self.buf[offset + 3],
        ])
    }
    /// Token field (0 in REGISTER and ERROR).
    pub fn token(&self) -> u64 {
        let offset = match self.ty {
            MsgType::Error => return 0,
            MsgType::Rebind => CTRL_AUTH_LEN + 4,
            _ => 12,
        };
        u64::from_be_bytes(
            self.buf[offset..offset + 8]
                .try_into()
                .expect("length checked"),
        )
    }
    /// Room name of a version-2 REGISTER (1 to [`MAX_ROOM_LEN`] bytes).
    pub fn room(&self) -> Option<&'a [u8]> {
        if self.ty != MsgType::Register || self.version != CTRL_VERSION_2 {
            return None;
        }
        let room_len = self.buf[CTRL_AUTH_LEN] as usize;
        Some(&self.buf[CTRL_AUTH_LEN + 1..CTRL_AUTH_LEN + 1 + room_len])
    }
    /// Join token of a version-2 REGISTER (empty when none was given).
    pub fn join_token(&self) -> Option<&'a [u8]> {
        let room = self.room()?;
        let offset = CTRL_AUTH_LEN + 1 + room.len();
        Some(&self.buf[offset + 2..])
    }
    /// Echo RTT (µs) a version-2 KEEPALIVE reports; `None` when absent or
    /// [`NO_RTT`].
    pub fn echo_rtt_us(&self) -> Option<u32> {
        if self.ty != MsgType::Keepalive || self.buf.len() != CTRL_KEEPALIVE_V2_LEN {
            return None;
        }
        let rtt = u32::from_be_bytes(self.buf[CTRL_AUTH_LEN..].try_into().expect("4 bytes"));
        (rtt != NO_RTT).then_some(rtt)
    }
    /// Cookie of REGISTER, JOIN and CHALLENGE (the 12 bytes after the
    /// header; all zero in a first REGISTER), `None` for other types.
    pub fn cookie(&self) -> Option<[u8; COOKIE_LEN]> {
        matches!(
            self.ty,
            MsgType::Register | MsgType::Join | MsgType::Challenge | MsgType::Rebind
        )
        .then(|| {
            self.buf[CTRL_HEADER_LEN..CTRL_AUTH_LEN]
                .try_into()
                .expect("length checked")
        })
    }
    /// Error code of an ERROR message.
    pub fn error_code(&self) -> Option<ErrorCode> {
        if self.ty != MsgType::Error {
            return None;
        }
        ErrorCode::from_u8(self.buf[8])
    }
    fn raw_selectors(&self) -> impl Iterator<Item = &'a [u8]> + 'a {
        let body: &'a [u8] = match self.ty {
            MsgType::Subscribe | MsgType::Unsubscribe => &self.buf[CTRL_AUTH_LEN + 2..],
            _ => &[],
        };
        body.chunks_exact(SELECTOR_LEN)
    }
    /// Selectors of SUBSCRIBE / UNSUBSCRIBE (validated by the constructor).
    pub fn selectors(&self) -> impl Iterator<Item = Selector> + 'a {
        self.raw_selectors()
            .filter_map(|b| Selector::decode(b).ok())
    }
}

/// A version-2 REGISTER: cookie, room length (1..=64), room, token length
/// (u16, at most [`MAX_TOKEN_LEN`]), token; nothing after it.
fn register_v2_ok(buf: &[u8]) -> bool {
    let Some(&room_len) = buf.get(CTRL_AUTH_LEN) else {
        return false;
    };
    let room_len = room_len as usize;
    if room_len == 0 || room_len > MAX_ROOM_LEN {
        return false;
    }
    let offset = CTRL_AUTH_LEN + 1 + room_len;
    let Some(tail) = buf.get(offset..offset + 2) else {
        return false;
    };
    let tail = u16::from_be_bytes([tail[0], tail[1]]) as usize;
    tail <= MAX_TOKEN_LEN && buf.len() == offset + 2 + tail
}

fn write_header(buf: &mut [u8], ty: MsgType, req: u32) {
    write_header_v(buf, ty, req, CTRL_VERSION);
}

fn write_header_v(buf: &mut [u8], ty: MsgType, req: u32, version: u8) {
    buf[..2].copy_from_slice(&CTRL_MAGIC);
    buf[2] = version;
    buf[3] = ty as u8;
    buf[4..8].copy_from_slice(&req.to_be_bytes());
}

/// Write a version-2 REGISTER for `room` with `cookie` (zeros on the first
/// try) and an optional join `token`; `None` if a field is too long or `buf`
/// is short.
pub fn write_register_v2(
    buf: &mut [u8],
    req: u32,
    cookie: &[u8; COOKIE_LEN],
    room: &[u8],
    token: &[u8],
) -> Option<usize> {
    if room.is_empty() || room.len() > MAX_ROOM_LEN || token.len() > MAX_TOKEN_LEN {
        return None;
    }
    let len = CTRL_AUTH_LEN + 1 + room.len() + 2 + token.len();
    let msg = buf.get_mut(..len)?;
    write_header_v(msg, MsgType::Register, req, CTRL_VERSION_2);
    msg[CTRL_HEADER_LEN..CTRL_AUTH_LEN].copy_from_slice(cookie);
    msg[CTRL_AUTH_LEN] = room.len() as u8;
    let offset = CTRL_AUTH_LEN + 1 + room.len();
    msg[CTRL_AUTH_LEN + 1..offset].copy_from_slice(room);
    msg[offset..offset + 2].copy_from_slice(&(token.len() as u16).to_be_bytes());
    msg[offset + 2..].copy_from_slice(token);
    Some(len)
}

/// Write REBIND (version 2): `cookie` (zeros on the first try), SSID, token.
pub fn write_rebind(
    buf: &mut [u8],
    req: u32,
    cookie: &[u8; COOKIE_LEN],
    ssid: u32,
    token: u64,
) -> Option<usize> {
    let msg = buf.get_mut(..CTRL_REBIND_LEN)?;
    write_header_v(msg, MsgType::Rebind, req, CTRL_VERSION_2);
    msg[CTRL_HEADER_LEN..CTRL_AUTH_LEN].copy_from_slice(cookie);
    msg[CTRL_AUTH_LEN..CTRL_AUTH_LEN + 4].copy_from_slice(&ssid.to_be_bytes());
    msg[CTRL_AUTH_LEN + 4..].copy_from_slice(&token.to_be_bytes());
    Some(CTRL_REBIND_LEN)
}

/// Write a version-2 KEEPALIVE reporting the client's echo RTT (µs; `None`:
/// not measured).
pub fn write_keepalive_v2(
    buf: &mut [u8],
    req: u32,
    ssid: u32,
    token: u64,
    echo_rtt_us: Option<u32>,
) -> Option<usize> {
    let msg = buf.get_mut(..CTRL_KEEPALIVE_V2_LEN)?;
    write_auth(msg, MsgType::Keepalive, req, ssid, token)?;
    msg[2] = CTRL_VERSION_2;
    msg[CTRL_AUTH_LEN..].copy_from_slice(&echo_rtt_us.unwrap_or(NO_RTT).to_be_bytes());
    Some(CTRL_KEEPALIVE_V2_LEN)
}

/// Write a first REGISTER (zero cookie, [`CTRL_AUTH_LEN`] bytes); returns
/// the length or `None` if `buf` is short.
pub fn write_register(buf: &mut [u8], req: u32) -> Option<usize> {
    write_auth(buf, MsgType::Register, req, 0, 0)
}

/// Write REGISTER, JOIN or CHALLENGE carrying `cookie`.
pub fn write_cookie(
    buf: &mut [u8],
    ty: MsgType,
    req: u32,
    cookie: &[u8; COOKIE_LEN],
) -> Option<usize> {
    if !matches!(ty, MsgType::Register | MsgType::Join | MsgType::Challenge) {
        return None;
    }
    let msg = buf.get_mut(..CTRL_AUTH_LEN)?;
    write_header(msg, ty, req);
    msg[CTRL_HEADER_LEN..].copy_from_slice(cookie);
    Some(CTRL_AUTH_LEN)
}

/// Write a header + SSID + token message (REGISTER, KEEPALIVE, LEAVE, ACK).
pub fn write_auth(buf: &mut [u8], ty: MsgType, req: u32, ssid: u32, token: u64) -> Option<usize> {
    let msg = buf.get_mut(..CTRL_AUTH_LEN)?;
    write_header(msg, ty, req);
    msg[8..12].copy_from_slice(&ssid.to_be_bytes());
    msg[12..20].copy_from_slice(&token.to_be_bytes());
    Some(CTRL_AUTH_LEN)
}

/// Write SUBSCRIBE or UNSUBSCRIBE with `sels` (at most [`MAX_SELECTORS`]).
pub fn write_subscribe(
    buf: &mut [u8],
    ty: MsgType,
    req: u32,
    ssid: u32,
    token: u64,
    sels: &[Selector],
) -> Option<usize> {
    if !matches!(ty, MsgType::Subscribe | MsgType::Unsubscribe) || sels.len() > MAX_SELECTORS {
        return None;
    }
    let len = CTRL_AUTH_LEN + 2 + sels.len() * SELECTOR_LEN;
    let msg = buf.get_mut(..len)?;
    write_auth(msg, ty, req, ssid, token)?;
    msg[CTRL_AUTH_LEN..CTRL_AUTH_LEN + 2].copy_from_slice(&(sels.len() as u16).to_be_bytes());
    for (i, s) in sels.iter().enumerate() {
        let offset = CTRL_AUTH_LEN + 2 + i * SELECTOR_LEN;
        s.encode(&mut msg[offset..offset + SELECTOR_LEN]);
    }
    Some(len)
}

/// Write ERROR with `code` about `ssid`.
pub fn write_error(buf: &mut [u8], req: u32, code: ErrorCode, ssid: u32) -> Option<usize> {
    let msg = buf.get_mut(..CTRL_ERROR_LEN)?;
    write_header(msg, MsgType::Error, req);
    msg[8] = code as u8;
    msg[9..12].fill(0);
    msg[12..16].copy_from_slice(&ssid.to_be_bytes());
    Some(CTRL_ERROR_LEN)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn rtp_roundtrip_with_send_time() {
        let mut b = [0u8; 200];
        let h = RtpHeader {
            payload_type: 97,
            marker: true,
            seq: 65535,
            timestamp: 123456,
            ssrc: 7,
        };
        let n = write_rtp(&mut b, &h, Some(0x0102_0304_0506_0708), 160).unwrap();
        let p = RtpPacket::new_checked(&b[..n]).unwrap();
        assert_eq!(
            (p.payload_type(), p.seq(), p.timestamp(), p.ssrc()),
            (97, 65535, 123456, 7)
        );
        assert!(p.marker());
        assert_eq!(p.send_time(), Some(0x0102_0304_0506_0708));
        assert_eq!(p.payload().len(), 160 - 28);
        let n = write_rtp(&mut b, &h, None, 40).unwrap();
        let p = RtpPacket::new_checked(&b[..n]).unwrap();
        assert_eq!(p.send_time(), None);
        assert_eq!(p.payload().len(), 28);
        assert!(write_rtp(&mut b, &h, Some(1), 20).is_none());
    }

    #[test]
    fn rtp_rejects_bad() {
        assert_eq!(
            RtpPacket::new_checked(&[0x80; 11]).unwrap_err(),
            WireError::Truncated
        );
        assert_eq!(
            RtpPacket::new_checked(&[0x40; 12]).unwrap_err(),
            WireError::BadVersion
        );
        let mut b = [0u8; 12];
        b[0] = 0x82; // two CSRCs missing
        assert_eq!(
            RtpPacket::new_checked(&b).unwrap_err(),
            WireError::Truncated
        );
        b[0] = 0x90; // extension header missing
        assert_eq!(
            RtpPacket::new_checked(&b).unwrap_err(),
            WireError::Truncated
        );
        let mut b = [0u8; 13];
        b[0] = 0xA0;
        b[12] = 5; // padding longer than payload
        assert_eq!(
            RtpPacket::new_checked(&b).unwrap_err(),
            WireError::BadPadding
        );
    }

    #[test]
    fn control_roundtrip() {
        let mut b = [0u8; 2048];
        let sels = [
            Selector::ALL,
            "5:asq".parse::<Selector>().unwrap(),
            "all:vhq".parse::<Selector>().unwrap(),
        ];
        let n = write_subscribe(&mut b, MsgType::Subscribe, 9, 3, 0xdead, &sels).unwrap();
        let c = Control::new_checked(&b[..n]).unwrap();
        assert_eq!(c.msg_type(), MsgType::Subscribe);
        assert_eq!((c.request_id(), c.ssid(), c.token()), (9, 3, 0xdead));
        assert_eq!(c.selectors().collect::<Vec<_>>(), sels);
        assert_eq!(classify(&b[..n]), Kind::Control);
        let n = write_error(&mut b, 4, ErrorCode::BadToken, 77).unwrap();
        let c = Control::new_checked(&b[..n]).unwrap();
        assert_eq!(c.error_code(), Some(ErrorCode::BadToken));
        assert_eq!((c.request_id(), c.ssid()), (4, 77));
        // wrong length
        let n = write_register(&mut b, 1).unwrap();
        assert!(Control::new_checked(&b[..n - 1]).is_err());
        // bad media code inside a selector
        let n = write_subscribe(&mut b, MsgType::Subscribe, 1, 1, 1, &sels[..1]).unwrap();
        b[n - 1] = 9;
        assert_eq!(
            Control::new_checked(&b[..n]).unwrap_err().error,
            WireError::BadMediaType(9)
        );
    }

    proptest! {
        #[test]
        fn parsers_never_panic(data in proptest::collection::vec(any::<u8>(), 0..200)) {
            if let Ok(p) = RtpPacket::new_checked(&data) {
                let _ = (p.payload(), p.send_time(), p.extension());
            }
            if let Ok(c) = Control::new_checked(&data) {
                let _ = (c.ssid(), c.token(), c.error_code(), c.selectors().count());
                let _ = (c.room(), c.join_token(), c.echo_rtt_us(), c.cookie());
            }
            let _ = classify(&data);
        }
    }
}
