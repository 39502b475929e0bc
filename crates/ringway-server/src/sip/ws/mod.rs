//! SIP over WebSocket (RFC 7118), both ends: as a server, the HTTP/1.1
//! upgrade (RFC 6455 4.2, sub-protocol `sip`, configurable Origin check);
//! as a client (`--route-to ws:`), our opening handshake and the check of
//! the server's answer (RFC 6455 4.1: `101`, `Sec-WebSocket-Accept` of our
//! key, `sip`); and one frame codec (RFC 6455 5) for both directions,
//! the masking direction a [`Role`]. Plain data in, bytes and events out:
//! no socket here (the connection code feeds it what it read, over TCP or
//! TLS for `wss:`).
//!
//! Bounds: the upgrade request and the answer to ours are at most
//! [`WsLimits::max_handshake_bytes`]; a message (all its fragments) at
//! most [`WsLimits::max_message_bytes`], checked against the length a
//! frame header claims before anything is buffered for it. A client's
//! frames must be masked and a server's not (RFC 6455 5.1), control
//! frames short and unfragmented (5.5), reserved bits clear; any breach
//! is an error and the connection closes (with a close frame, 1002 or
//! 1009). Every frame we send as a client is masked with a fresh random
//! key (RFC 6455 5.3).

use serde::{Deserialize, Serialize};

/// The GUID of RFC 6455 1.3.
const ACCEPT_GUID: &[u8] = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11";

/// Bounds of one WebSocket connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WsLimits {
    /// The upgrade request (request line and headers), bytes.
    pub max_handshake_bytes: usize,
    /// One message, all fragments, bytes.
    pub max_message_bytes: usize,
}

/// Which browser origins may connect (`Origin`, RFC 6454).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct OriginPolicy {
    /// Allowed origins (`https://phone.example.net`, compared without
    /// case); empty: any origin, and clients that send none.
    pub allowed: Vec<String>,
}

impl OriginPolicy {
    fn allows(&self, origin: Option<&str>) -> bool {
        if self.allowed.is_empty() {
            return true;
        }
        origin.is_some_and(|o| {
            self.allowed
                .iter()
                .any(|a| a.eq_ignore_ascii_case(o.trim()))
        })
    }
}

/// Why an upgrade was refused (each with its HTTP answer).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HandshakeError {
    /// Longer than `max_handshake_bytes` without its end.
    TooLarge,
    /// Not an HTTP/1.1 GET with the WebSocket headers.
    NotWebSocket,
    /// `Sec-WebSocket-Version` other than 13.
    BadVersion,
    /// The client does not offer the `sip` sub-protocol.
    NoSipProtocol,
    /// The Origin is not allowed.
    Forbidden,
}

impl HandshakeError {
    /// Metrics label.
    pub fn label(self) -> &'static str {
        match self {
            HandshakeError::TooLarge => "too_large",
            HandshakeError::NotWebSocket => "not_websocket",
            HandshakeError::BadVersion => "bad_version",
            HandshakeError::NoSipProtocol => "no_sip_protocol",
            HandshakeError::Forbidden => "forbidden_origin",
        }
    }

    /// The HTTP response that refuses it.
    pub fn response(self) -> &'static [u8] {
        match self {
            HandshakeError::TooLarge => {
                b"HTTP/1.1 431 Request Header Fields Too Large\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"
            }
            HandshakeError::NotWebSocket | HandshakeError::NoSipProtocol => {
                b"HTTP/1.1 400 Bad Request\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"
            }
            HandshakeError::BadVersion => {
                b"HTTP/1.1 426 Upgrade Required\r\nSec-WebSocket-Version: 13\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"
            }
            HandshakeError::Forbidden => {
                b"HTTP/1.1 403 Forbidden\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"
            }
        }
    }
}

/// A complete, accepted upgrade request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Upgrade {
    /// The `101 Switching Protocols` answer to send.
    pub response: Vec<u8>,
    /// Bytes of the request (frames may follow them).
    pub consumed: usize,
}

/// Parse the upgrade request at the start of `buf`: `Ok(None)` while
/// incomplete.
pub fn parse_handshake(
    buf: &[u8],
    limits: WsLimits,
    origins: &OriginPolicy,
) -> Result<Option<Upgrade>, HandshakeError> {
    use HandshakeError::{NotWebSocket, TooLarge};
    let Some((mut lines, consumed)) = message_head(buf, limits, TooLarge, NotWebSocket)? else {
        return Ok(None);
    };
    let request_line = lines.next().unwrap_or_default();
    let mut parts = request_line.split(' ');
    let (Some("GET"), Some(target), Some("HTTP/1.1"), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(HandshakeError::NotWebSocket);
    };
    if !target.starts_with('/') {
        return Err(HandshakeError::NotWebSocket);
    }
    let (mut upgrade, mut connection, mut key, mut version, mut sip, mut origin) =
        (false, false, None, None, false, None);
    for line in lines {
        let (name, value) = header_field(line).ok_or(HandshakeError::NotWebSocket)?;
        match name.as_str() {
            "upgrade" => upgrade |= has_token(value, "websocket"),
            "connection" => connection |= has_token(value, "upgrade"),
            "sec-websocket-key" => key = Some(value),
            "sec-websocket-version" => version = Some(value),
            "sec-websocket-protocol" => sip |= has_token(value, "sip"),
            "origin" => origin = Some(value),
            _ => {}
        }
    }
    let key = key.filter(|k| k.len() == 24 && k.ends_with("=="));
    let (true, true, Some(key)) = (upgrade, connection, key) else {
        return Err(HandshakeError::NotWebSocket);
    };
    if version != Some("13") {
        return Err(HandshakeError::BadVersion);
    }
    if !sip {
        return Err(HandshakeError::NoSipProtocol);
    }
    if !origins.allows(origin) {
        return Err(HandshakeError::Forbidden);
    }
    let response = format!(
        "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Accept: {}\r\nSec-WebSocket-Protocol: sip\r\n\r\n",
        accept_key(key)
    );
    Ok(Some(Upgrade {
        response: response.into_bytes(),
        consumed,
    }))
}

/// `Sec-WebSocket-Accept` for a client's key (RFC 6455 4.2.2).
pub fn accept_key(key: &str) -> String {
    let mut input = Vec::with_capacity(key.len() + ACCEPT_GUID.len());
    input.extend_from_slice(key.as_bytes());
    input.extend_from_slice(ACCEPT_GUID);
    let digest = ring::digest::digest(&ring::digest::SHA1_FOR_LEGACY_USE_ONLY, &input);
    base64(digest.as_ref())
}

/// Our opening handshake as a client (RFC 6455 4.1) and the answer it
/// must get.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClientHandshake {
    /// The upgrade request to send.
    pub request: Vec<u8>,
    /// The `Sec-WebSocket-Accept` the server must answer with.
    pub accept: String,
}

/// The upgrade request for `path` on `host` (`IP:PORT` or a name) with
/// the 16-byte `key` (random: [`random_bytes`]), offering only `sip`.
/// `host` and `path` must be visible ASCII ([`valid_path`]); anything
/// else is replaced by `/` and dropped, so no header can be injected.
pub fn client_handshake(host: &str, path: &str, key: [u8; 16]) -> ClientHandshake {
    let key = base64(&key);
    let path = if valid_path(path) { path } else { "/" };
    let host: String = host.chars().filter(|c| c.is_ascii_graphic()).collect();
    let request = format!(
        "GET {path} HTTP/1.1\r\nHost: {host}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Protocol: sip\r\n\r\n"
    );
    ClientHandshake {
        request: request.into_bytes(),
        accept: accept_key(&key),
    }
}

/// Whether `path` can be the resource name of our upgrade request: `/`
/// then visible ASCII, at most 256 bytes.
pub fn valid_path(path: &str) -> bool {
    path.starts_with('/') && path.len() <= 256 && path.bytes().all(|b| b.is_ascii_graphic())
}

/// Why a server's answer to our upgrade was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ResponseError {
    /// Longer than `max_handshake_bytes` without its end.
    TooLarge,
    /// Not `HTTP/1.1 101` (the server refused, or is no WebSocket server).
    NotSwitching,
    /// `Upgrade: websocket` or `Connection: Upgrade` missing, an extension
    /// we did not offer, or not text.
    NotWebSocket,
    /// `Sec-WebSocket-Accept` missing or not the one our key asks for.
    BadAccept,
    /// The sub-protocol is not `sip` (RFC 7118 4).
    NoSipProtocol,
}

impl ResponseError {
    /// Label (logs).
    pub fn label(self) -> &'static str {
        match self {
            ResponseError::TooLarge => "too_large",
            ResponseError::NotSwitching => "not_101",
            ResponseError::NotWebSocket => "not_websocket",
            ResponseError::BadAccept => "bad_accept",
            ResponseError::NoSipProtocol => "no_sip_protocol",
        }
    }
}

/// Check the server's answer to our upgrade at the start of `buf`
/// (RFC 6455 4.1): `Ok(None)` while incomplete, else the bytes it took
/// (frames may follow).
pub fn parse_handshake_response(
    buf: &[u8],
    limits: WsLimits,
    accept: &str,
) -> Result<Option<usize>, ResponseError> {
    use ResponseError::{NotWebSocket, TooLarge};
    let Some((mut lines, consumed)) = message_head(buf, limits, TooLarge, NotWebSocket)? else {
        return Ok(None);
    };
    let status_line = lines.next().unwrap_or_default();
    let mut parts = status_line.splitn(3, ' ');
    let (Some("HTTP/1.1"), Some("101")) = (parts.next(), parts.next()) else {
        return Err(ResponseError::NotSwitching);
    };
    let (mut upgrade, mut connection, mut accepted, mut protocol) = (false, false, None, None);
    for line in lines {
        let (name, value) = header_field(line).ok_or(ResponseError::NotWebSocket)?;
        match name.as_str() {
            "upgrade" => upgrade |= has_token(value, "websocket"),
            "connection" => connection |= has_token(value, "upgrade"),
            // Every copy must be right (one wrong one fails it).
            "sec-websocket-accept" => {
                accepted = Some(accepted.unwrap_or(true) && value == accept);
            }
            "sec-websocket-protocol" => {
                protocol = Some(protocol.unwrap_or(true) && value.eq_ignore_ascii_case("sip"));
            }
            // We offered none (RFC 6455 4.1, point 5).
            "sec-websocket-extensions" => return Err(ResponseError::NotWebSocket),
            _ => {}
        }
    }
    if !(upgrade && connection) {
        return Err(ResponseError::NotWebSocket);
    }
    if accepted != Some(true) {
        return Err(ResponseError::BadAccept);
    }
    if protocol != Some(true) {
        return Err(ResponseError::NoSipProtocol);
    }
    Ok(Some(consumed))
}

/// `N` bytes from the system's random source (a mask, a key). Should it
/// ever fail, from the process's randomly keyed SipHash of a counter and
/// the time instead: still unpredictable to a peer.
pub fn random_bytes<const N: usize>() -> [u8; N] {
    use ring::rand::SecureRandom;
    let mut out = [0u8; N];
    if ring::rand::SystemRandom::new().fill(&mut out).is_ok() {
        return out;
    }
    use std::hash::{BuildHasher, Hasher};
    static KEYS: std::sync::OnceLock<std::collections::hash_map::RandomState> =
        std::sync::OnceLock::new();
    static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    for (i, chunk) in out.chunks_mut(8).enumerate() {
        let mut h = KEYS.get_or_init(Default::default).build_hasher();
        h.write_u64(COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
        h.write_u64(ringway_io::monotonic_now().0);
        h.write_usize(i);
        let bytes = h.finish().to_le_bytes();
        chunk.copy_from_slice(&bytes[..chunk.len()]);
    }
    out
}

fn base64(bytes: &[u8]) -> String {
    const ABC: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(char::from(ABC[((n >> (18 - 6 * i)) & 63) as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// The head of the HTTP message at the start of `buf` once it is whole:
/// its lines, and its length with the blank line that ends it. `Ok(None)`
/// while incomplete; `too_large` past `max_handshake_bytes`, `not_text`
/// when it is not UTF-8.
fn message_head<E>(
    buf: &[u8],
    limits: WsLimits,
    too_large: E,
    not_text: E,
) -> Result<Option<(impl Iterator<Item = &str>, usize)>, E> {
    let Some(end) = find(buf, b"\r\n\r\n") else {
        if buf.len() > limits.max_handshake_bytes {
            return Err(too_large);
        }
        return Ok(None);
    };
    if end + 4 > limits.max_handshake_bytes {
        return Err(too_large);
    }
    let head = std::str::from_utf8(&buf[..end]).map_err(|_| not_text)?;
    Ok(Some((head.split("\r\n"), end + 4)))
}

/// A header line's name (lower case) and value (trimmed); `None` without
/// a colon.
fn header_field(line: &str) -> Option<(String, &str)> {
    let (name, value) = line.split_once(':')?;
    Some((name.trim().to_ascii_lowercase(), value.trim()))
}

/// Whether the comma-separated header `value` lists `token` (any case).
fn has_token(value: &str, token: &str) -> bool {
    value
        .split(',')
        .any(|v| v.trim().eq_ignore_ascii_case(token))
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// Why a connection's frames were refused (the close code it gets).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FrameError {
    /// An unmasked client frame, reserved bits, an unknown opcode, a bad
    /// control frame or continuation: 1002 protocol error.
    Protocol,
    /// A message longer than `max_message_bytes`: 1009 message too big.
    TooBig,
}

impl FrameError {
    /// The close code (RFC 6455 7.4.1).
    pub fn close_code(self) -> u16 {
        match self {
            FrameError::Protocol => 1002,
            FrameError::TooBig => 1009,
        }
    }
}

/// Which end of a connection we are (RFC 6455 5.1, 5.3): a server reads
/// masked frames and writes unmasked ones; a client writes every frame
/// masked with a fresh random key and refuses masked ones.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Role {
    /// We accepted the connection (a browser's).
    #[default]
    Server,
    /// We opened it (`--route-to ws:`).
    Client,
}

/// What the peer sent, frame by frame.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WsEvent {
    /// A whole data message (text or binary): one SIP message (RFC 7118 5.2).
    Message(Vec<u8>),
    /// A ping: answer with a pong carrying its payload.
    Ping(Vec<u8>),
    /// A pong (ignored).
    Pong,
    /// A close (its code, if any): answer with a close and end.
    Close(Option<u16>),
}

const OP_CONTINUATION: u8 = 0;
const OP_TEXT: u8 = 1;
const OP_BINARY: u8 = 2;
const OP_CLOSE: u8 = 8;
const OP_PING: u8 = 9;
const OP_PONG: u8 = 10;

/// Bytes one [`Decoder::extend`] takes at most.
pub const MAX_READ: usize = 64 * 1024;

/// Decodes the peer's frames (after the upgrade), bounded: a client's
/// (masked) as [`Role::Server`], a server's (unmasked) as [`Role::Client`].
#[derive(Debug, Default)]
pub struct Decoder {
    /// Our end: which masking the peer's frames must have.
    role: Role,
    /// Bytes read and not yet decoded (at most one frame header plus
    /// what a bounded payload needs).
    buf: Vec<u8>,
    /// The fragments of the message being received.
    message: Vec<u8>,
    /// A fragmented message is open.
    in_message: bool,
}

impl Decoder {
    /// A decoder for our end `role` of the connection.
    pub fn new(role: Role) -> Decoder {
        Decoder {
            role,
            ..Decoder::default()
        }
    }

    /// Take bytes read from the connection (at most [`MAX_READ`] at a
    /// time, each followed by [`Decoder::next`] until `None`): the buffer
    /// then never holds more than one incomplete frame, whose claimed
    /// length was checked, and one read.
    pub fn extend(&mut self, bytes: &[u8], limits: WsLimits) -> Result<(), FrameError> {
        if self.buf.len() + bytes.len() > limits.max_message_bytes + 14 + MAX_READ {
            return Err(FrameError::TooBig);
        }
        self.buf.extend_from_slice(bytes);
        Ok(())
    }

    /// Whether a message or frame is part-way in.
    pub fn in_message(&self) -> bool {
        self.in_message || !self.buf.is_empty()
    }

    /// The next event, `Ok(None)` until a whole frame is buffered.
    pub fn next(&mut self, limits: WsLimits) -> Result<Option<WsEvent>, FrameError> {
        loop {
            let Some(frame) = parse_frame(&self.buf, limits, self.role)? else {
                return Ok(None);
            };
            let Frame {
                fin,
                opcode,
                header_len,
                payload_len,
                mask,
            } = frame;
            let mut payload = self.buf[header_len..header_len + payload_len].to_vec();
            if let Some(mask) = mask {
                for (i, b) in payload.iter_mut().enumerate() {
                    *b ^= mask[i % 4];
                }
            }
            self.buf.drain(..header_len + payload_len);
            match opcode {
                OP_PING => return Ok(Some(WsEvent::Ping(payload))),
                OP_PONG => return Ok(Some(WsEvent::Pong)),
                OP_CLOSE => {
                    let code =
                        (payload.len() >= 2).then(|| u16::from_be_bytes([payload[0], payload[1]]));
                    return Ok(Some(WsEvent::Close(code)));
                }
                OP_TEXT | OP_BINARY if self.in_message => return Err(FrameError::Protocol),
                OP_CONTINUATION if !self.in_message => return Err(FrameError::Protocol),
                _ => {}
            }
            if self.message.len() + payload.len() > limits.max_message_bytes {
                return Err(FrameError::TooBig);
            }
            if self.message.is_empty() && fin {
                self.in_message = false;
                return Ok(Some(WsEvent::Message(payload)));
            }
            self.message.extend_from_slice(&payload);
            self.in_message = !fin;
            if fin {
                return Ok(Some(WsEvent::Message(std::mem::take(&mut self.message))));
            }
        }
    }
}

struct Frame {
    fin: bool,
    opcode: u8,
    header_len: usize,
    payload_len: usize,
    mask: Option<[u8; 4]>,
}

/// One frame's header at the start of `buf`, once the whole frame is
/// there; its claimed length checked before anything waits for it. As
/// `role`'s peer wrote it: masked to a server, unmasked to a client.
fn parse_frame(buf: &[u8], limits: WsLimits, role: Role) -> Result<Option<Frame>, FrameError> {
    if buf.len() < 2 {
        return Ok(None);
    }
    let (b0, b1) = (buf[0], buf[1]);
    let fin = b0 & 0x80 != 0;
    let opcode = b0 & 0x0f;
    let masked = b1 & 0x80 != 0;
    if b0 & 0x70 != 0 || masked != (role == Role::Server) {
        // Reserved bits (no extension negotiated), or a client's frame
        // unmasked, or a server's masked.
        return Err(FrameError::Protocol);
    }
    let control = opcode >= 8;
    if !matches!(
        opcode,
        OP_CONTINUATION | OP_TEXT | OP_BINARY | OP_CLOSE | OP_PING | OP_PONG
    ) {
        return Err(FrameError::Protocol);
    }
    let short = usize::from(b1 & 0x7f);
    if control && (!fin || short > 125) {
        return Err(FrameError::Protocol);
    }
    let (len, at) = match short {
        126 => {
            let Some(b) = buf.get(2..4) else {
                return Ok(None);
            };
            (u64::from(u16::from_be_bytes([b[0], b[1]])), 4)
        }
        127 => {
            let Some(b) = buf.get(2..10) else {
                return Ok(None);
            };
            let mut n = [0u8; 8];
            n.copy_from_slice(b);
            (u64::from_be_bytes(n), 10)
        }
        n => (n as u64, 2),
    };
    if len > limits.max_message_bytes as u64 {
        return Err(FrameError::TooBig);
    }
    let payload_len = len as usize;
    let (mask, header_len) = if masked {
        let Some(mask) = buf.get(at..at + 4) else {
            return Ok(None);
        };
        (Some([mask[0], mask[1], mask[2], mask[3]]), at + 4)
    } else {
        (None, at)
    };
    if buf.len() < header_len + payload_len {
        return Ok(None);
    }
    Ok(Some(Frame {
        fin,
        opcode,
        header_len,
        payload_len,
        mask,
    }))
}

/// A server frame (unmasked, one fragment): a SIP message as text.
pub fn text_frame(payload: &[u8]) -> Vec<u8> {
    encode_frame(true, OP_TEXT, payload, None)
}

/// A server's pong answering a ping's payload.
pub fn pong_frame(payload: &[u8]) -> Vec<u8> {
    encode_frame(true, OP_PONG, &payload[..payload.len().min(125)], None)
}

/// A server's close frame with `code`.
pub fn close_frame(code: u16) -> Vec<u8> {
    encode_frame(true, OP_CLOSE, &code.to_be_bytes(), None)
}

/// One frame, both directions: `opcode` with `payload`, the last of its
/// message when `fin`; masked with `mask` when given (a client's frame,
/// RFC 6455 5.3), else as a server sends it.
pub fn encode_frame(fin: bool, opcode: u8, payload: &[u8], mask: Option<[u8; 4]>) -> Vec<u8> {
    let mut out = Vec::with_capacity(payload.len() + 14);
    let fin_bit: u8 = if fin { 0x80 } else { 0 };
    out.push(fin_bit | (opcode & 0x0f));
    let mask_bit = if mask.is_some() { 0x80 } else { 0 };
    match payload.len() {
        n if n < 126 => out.push(mask_bit | n as u8),
        n if n <= 0xffff => {
            out.push(mask_bit | 126);
            out.extend_from_slice(&(n as u16).to_be_bytes());
        }
        n => {
            out.push(mask_bit | 127);
            out.extend_from_slice(&(n as u64).to_be_bytes());
        }
    }
    match mask {
        None => out.extend_from_slice(payload),
        Some(mask) => {
            out.extend_from_slice(&mask);
            out.extend(payload.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
        }
    }
    out
}

/// A client's frame (masked with `mask`), for tests and the fuzz target.
pub fn client_frame(fin: bool, opcode: u8, payload: &[u8], mask: [u8; 4]) -> Vec<u8> {
    encode_frame(fin, opcode, payload, Some(mask))
}

/// The WebSocket settings of a server's connections.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WsSettings {
    /// Which browser origins may connect to us.
    pub origins: OriginPolicy,
    /// The resource name (`/sip`) of the connections we open to each
    /// address (others: `/`).
    pub paths: std::collections::HashMap<std::net::SocketAddr, String>,
}

/// What becomes of a SIP message sent on a WebSocket connection.
pub(crate) enum Outgoing {
    /// Its frame, to write now.
    Frame(Vec<u8>),
    /// Kept until the server answers our upgrade (then written).
    Queued,
    /// Not sent: no upgrade answered (server side), or beyond the bound
    /// of what waits for it.
    Refused,
}

/// One WebSocket connection's state in the driver: the upgrade request
/// (accepted) or the answer to ours (opened) until it is whole, then the
/// frame decoder.
#[derive(Debug, Default)]
pub(crate) struct WsSession {
    upgraded: std::sync::atomic::AtomicBool,
    /// Which end we are.
    role: Role,
    /// Opened by us: the `Sec-WebSocket-Accept` the server must answer.
    accept: String,
    state: std::sync::Mutex<WsState>,
}

#[derive(Debug, Default)]
pub(crate) struct WsState {
    /// The upgrade request (or the answer to ours) so far.
    pub(crate) head: Vec<u8>,
    pub(crate) decoder: Decoder,
    /// Opened by us: SIP messages sent before the server answered our
    /// upgrade (RFC 6455 4.1: nothing goes before it), and their bytes.
    pub(crate) pending: Vec<Vec<u8>>,
    pub(crate) pending_bytes: usize,
}

impl WsSession {
    /// An accepted connection's session.
    pub(crate) fn server() -> WsSession {
        WsSession::default()
    }

    /// The session of a connection we open to `host` (as the `Host`
    /// header names it) for `path`, and the upgrade request to write
    /// first.
    pub(crate) fn client(host: &str, path: &str) -> (WsSession, Vec<u8>) {
        let handshake = client_handshake(host, path, random_bytes());
        let session = WsSession {
            upgraded: Default::default(),
            role: Role::Client,
            accept: handshake.accept,
            state: std::sync::Mutex::new(WsState {
                decoder: Decoder::new(Role::Client),
                ..WsState::default()
            }),
        };
        (session, handshake.request)
    }

    /// Which end we are.
    pub(crate) fn role(&self) -> Role {
        self.role
    }

    /// Opened by us: the `Sec-WebSocket-Accept` the server must answer.
    pub(crate) fn accept(&self) -> &str {
        &self.accept
    }

    /// One whole frame of ours: masked with a fresh random key as a client.
    pub(crate) fn frame(&self, opcode: u8, payload: &[u8]) -> Vec<u8> {
        let mask = (self.role == Role::Client).then(random_bytes::<4>);
        encode_frame(true, opcode, payload, mask)
    }

    /// A SIP message as a text frame of ours.
    pub(crate) fn text(&self, message: &[u8]) -> Vec<u8> {
        self.frame(OP_TEXT, message)
    }

    /// Our pong to a ping's payload.
    pub(crate) fn pong(&self, payload: &[u8]) -> Vec<u8> {
        self.frame(OP_PONG, &payload[..payload.len().min(125)])
    }

    /// Our close frame with `code`.
    pub(crate) fn close(&self, code: u16) -> Vec<u8> {
        self.frame(OP_CLOSE, &code.to_be_bytes())
    }

    /// A SIP message to send: its frame once upgraded; on a connection we
    /// opened whose upgrade is not answered yet, kept (within `limit`
    /// bytes) until it is, to go out first (see `WsState::pending`).
    pub(crate) fn outgoing(&self, message: &[u8], limit: usize) -> Outgoing {
        if self.upgraded() {
            return Outgoing::Frame(self.text(message));
        }
        if self.role == Role::Server {
            return Outgoing::Refused;
        }
        let mut state = self.state();
        // The owner writes what waits, then marks it upgraded, under this
        // lock: seen upgraded now, this message goes after them.
        if self.upgraded() {
            drop(state);
            return Outgoing::Frame(self.text(message));
        }
        if state.pending_bytes + message.len() > limit {
            return Outgoing::Refused;
        }
        state.pending_bytes += message.len();
        state.pending.push(message.to_vec());
        Outgoing::Queued
    }

    /// Whether the upgrade was answered (frames flow).
    pub(crate) fn upgraded(&self) -> bool {
        self.upgraded.load(std::sync::atomic::Ordering::Acquire)
    }

    pub(crate) fn set_upgraded(&self) {
        self.upgraded
            .store(true, std::sync::atomic::Ordering::Release);
    }

    pub(crate) fn state(&self) -> std::sync::MutexGuard<'_, WsState> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: WsLimits = WsLimits {
        max_handshake_bytes: 4096,
        max_message_bytes: 1000,
    };

    fn request(extra: &str) -> String {
        format!(
            "GET /sip HTTP/1.1\r\nHost: proxy.test\r\nUpgrade: websocket\r\n\
             Connection: keep-alive, Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\
             Sec-WebSocket-Version: 13\r\n{extra}\r\n"
        )
    }

    #[test]
    fn rfc6455_sample_key() {
        assert_eq!(
            accept_key("dGhlIHNhbXBsZSBub25jZQ=="),
            "s3pPLMBiTxaQ9kYGzzhZRbK+xOo="
        );
        assert_eq!(base64(b"f"), "Zg==");
        assert_eq!(base64(b"fo"), "Zm8=");
        assert_eq!(base64(b"foo"), "Zm9v");
    }

    #[test]
    fn upgrade_needs_sip_and_an_allowed_origin() {
        let any = OriginPolicy::default();
        let req = request("Sec-WebSocket-Protocol: sip\r\nOrigin: https://a.test\r\n");
        let up = parse_handshake(req.as_bytes(), LIMITS, &any)
            .unwrap()
            .unwrap();
        assert_eq!(up.consumed, req.len());
        let text = String::from_utf8(up.response).unwrap();
        assert!(text.starts_with("HTTP/1.1 101 "), "{text}");
        assert!(text.contains("Sec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n"));
        assert!(text.contains("Sec-WebSocket-Protocol: sip\r\n"));
        // Incomplete: wait.
        assert_eq!(
            parse_handshake(&req.as_bytes()[..40], LIMITS, &any),
            Ok(None)
        );
        let no_sip = request("Sec-WebSocket-Protocol: chat\r\n");
        assert_eq!(
            parse_handshake(no_sip.as_bytes(), LIMITS, &any),
            Err(HandshakeError::NoSipProtocol)
        );
        let only = OriginPolicy {
            allowed: vec!["https://b.test".into()],
        };
        assert_eq!(
            parse_handshake(req.as_bytes(), LIMITS, &only),
            Err(HandshakeError::Forbidden)
        );
        let ok = request("Sec-WebSocket-Protocol: sip\r\nOrigin: https://B.test\r\n");
        assert!(parse_handshake(ok.as_bytes(), LIMITS, &only)
            .unwrap()
            .is_some());
        let v8 = request("Sec-WebSocket-Protocol: sip\r\n").replace("Version: 13", "Version: 8");
        assert_eq!(
            parse_handshake(v8.as_bytes(), LIMITS, &any),
            Err(HandshakeError::BadVersion)
        );
        let long = vec![b'a'; 5000];
        assert_eq!(
            parse_handshake(&long, LIMITS, &any),
            Err(HandshakeError::TooLarge)
        );
        assert_eq!(
            parse_handshake(b"POST / HTTP/1.1\r\n\r\n", LIMITS, &any),
            Err(HandshakeError::NotWebSocket)
        );
    }

    #[test]
    fn frames_decode_with_fragments_and_control_frames_between() {
        let mut d = Decoder::default();
        let mask = [1, 2, 3, 4];
        let mut bytes = client_frame(false, OP_TEXT, b"OPTIONS ", mask);
        bytes.extend(client_frame(true, OP_PING, b"hi", mask));
        bytes.extend(client_frame(true, OP_CONTINUATION, b"sip:a SIP/2.0", mask));
        bytes.extend(client_frame(true, OP_CLOSE, &1000u16.to_be_bytes(), mask));
        // Byte by byte: nothing before a frame is whole.
        let mut events = Vec::new();
        for b in &bytes {
            d.extend(&[*b], LIMITS).unwrap();
            while let Some(e) = d.next(LIMITS).unwrap() {
                events.push(e);
            }
        }
        assert_eq!(
            events,
            vec![
                WsEvent::Ping(b"hi".to_vec()),
                WsEvent::Message(b"OPTIONS sip:a SIP/2.0".to_vec()),
                WsEvent::Close(Some(1000)),
            ]
        );
    }

    #[test]
    fn bad_frames_are_refused() {
        let limits = LIMITS;
        let unmasked = text_frame(b"x");
        let mut d = Decoder::default();
        d.extend(&unmasked, limits).unwrap();
        assert_eq!(d.next(limits), Err(FrameError::Protocol));
        // A length claim beyond the bound is refused before its bytes come.
        let mut huge = vec![0x81, 0xff];
        huge.extend_from_slice(&(1u64 << 40).to_be_bytes());
        let mut d = Decoder::default();
        d.extend(&huge, limits).unwrap();
        assert_eq!(d.next(limits), Err(FrameError::TooBig));
        // Fragments adding up beyond the bound.
        let mut d = Decoder::default();
        for _ in 0..3 {
            let part = client_frame(false, OP_TEXT, &[b'a'; 400], [9; 4]);
            let _ = d.extend(&part, limits);
        }
        let mut result = Ok(None);
        for _ in 0..3 {
            result = d.next(limits);
            if result.is_err() {
                break;
            }
        }
        assert_eq!(result, Err(FrameError::Protocol));
        let mut d = Decoder::default();
        let mut bytes = client_frame(false, OP_TEXT, &[b'a'; 600], [9; 4]);
        bytes.extend(client_frame(true, OP_CONTINUATION, &[b'a'; 600], [9; 4]));
        d.extend(&bytes, limits).unwrap();
        assert_eq!(d.next(limits), Err(FrameError::TooBig));
        // A long ping, a fragmented ping, a continuation with nothing open.
        for bad in [
            client_frame(true, OP_PING, &[0; 126], [1; 4]),
            client_frame(false, OP_PING, b"x", [1; 4]),
            client_frame(true, OP_CONTINUATION, b"x", [1; 4]),
            client_frame(true, 3, b"x", [1; 4]),
        ] {
            let mut d = Decoder::default();
            d.extend(&bad, limits).unwrap();
            assert_eq!(d.next(limits), Err(FrameError::Protocol), "{bad:?}");
        }
    }

    #[test]
    fn server_frames_round_trip() {
        for len in [0, 125, 126, 65535, 65536] {
            let payload = vec![b'x'; len];
            let f = text_frame(&payload);
            assert_eq!(f[0], 0x81);
            assert_eq!(&f[f.len() - len..], &payload[..]);
        }
        assert_eq!(close_frame(1002), vec![0x88, 2, 0x03, 0xea]);
    }

    /// A server's answer to `handshake`, with `extra` headers.
    fn answer(handshake: &ClientHandshake, extra: &str) -> String {
        format!(
            "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
             Sec-WebSocket-Accept: {}\r\n{extra}\r\n",
            handshake.accept
        )
    }

    #[test]
    fn our_upgrade_is_accepted_by_our_server_and_its_answer_checked() {
        let ours = client_handshake("127.0.0.1:8080", "/sip", *b"the sample nonce");
        let text = String::from_utf8(ours.request.clone()).unwrap();
        assert!(text.starts_with("GET /sip HTTP/1.1\r\nHost: 127.0.0.1:8080\r\n"));
        // RFC 6455 1.3's sample key is this nonce's base64.
        assert!(text.contains("Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"));
        assert_eq!(ours.accept, "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=");
        // The server side of this module takes it and its answer passes.
        let up = parse_handshake(&ours.request, LIMITS, &OriginPolicy::default())
            .unwrap()
            .unwrap();
        let mut answered = up.response.clone();
        answered.extend(text_frame(b"x"));
        assert_eq!(
            parse_handshake_response(&answered, LIMITS, &ours.accept),
            Ok(Some(up.response.len()))
        );
        // Incomplete: wait.
        assert_eq!(
            parse_handshake_response(&up.response[..30], LIMITS, &ours.accept),
            Ok(None)
        );
        let good = answer(&ours, "Sec-WebSocket-Protocol: sip\r\n");
        assert!(parse_handshake_response(good.as_bytes(), LIMITS, &ours.accept).is_ok());
        for (bad, error) in [
            (
                good.replace("s3pPLMBiTxaQ9kYGzzhZRbK+xOo=", "s3pPLMBiTxaQ9kYGzzhZRbK+xOA="),
                ResponseError::BadAccept,
            ),
            (
                answer(&ours, "Sec-WebSocket-Protocol: sip\r\nSec-WebSocket-Accept: x\r\n"),
                ResponseError::BadAccept,
            ),
            (answer(&ours, ""), ResponseError::NoSipProtocol),
            (
                answer(&ours, "Sec-WebSocket-Protocol: chat\r\n"),
                ResponseError::NoSipProtocol,
            ),
            (
                good.replace("101 Switching Protocols", "200 OK"),
                ResponseError::NotSwitching,
            ),
            (
                "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n".to_string(),
                ResponseError::NotSwitching,
            ),
            (
                good.replace("Upgrade: websocket\r\n", ""),
                ResponseError::NotWebSocket,
            ),
            (
                answer(
                    &ours,
                    "Sec-WebSocket-Protocol: sip\r\nSec-WebSocket-Extensions: permessage-deflate\r\n",
                ),
                ResponseError::NotWebSocket,
            ),
        ] {
            assert_eq!(
                parse_handshake_response(bad.as_bytes(), LIMITS, &ours.accept),
                Err(error),
                "{bad}"
            );
        }
        assert_eq!(
            parse_handshake_response(&[b'a'; 5000], LIMITS, &ours.accept),
            Err(ResponseError::TooLarge)
        );
        // No header can be injected through the path or the host.
        let evil = client_handshake("a\r\nX: y", "/a\r\nX: y", [0; 16]);
        let text = String::from_utf8(evil.request).unwrap();
        assert!(
            text.starts_with("GET / HTTP/1.1\r\nHost: aX:y\r\n"),
            "{text}"
        );
        assert!(!valid_path("sip") && !valid_path("/a b") && valid_path("/ws?x=1"));
    }

    #[test]
    fn a_client_masks_every_frame_and_refuses_masked_ones() {
        let (session, request) = WsSession::client("127.0.0.1:1", "/");
        assert!(request.starts_with(b"GET / HTTP/1.1\r\n"));
        // Our frames as a client: masked, each with its own key, and the
        // server side decodes them.
        let a = session.text(b"OPTIONS sip:a SIP/2.0");
        let b = session.text(b"OPTIONS sip:a SIP/2.0");
        assert_eq!(a[1] & 0x80, 0x80, "masked");
        assert_ne!(a[2..6], b[2..6], "a fresh key per frame");
        let mut server = Decoder::new(Role::Server);
        server.extend(&a, LIMITS).unwrap();
        assert_eq!(
            server.next(LIMITS),
            Ok(Some(WsEvent::Message(b"OPTIONS sip:a SIP/2.0".to_vec())))
        );
        assert_eq!(session.pong(b"p")[1] & 0x80, 0x80);
        assert_eq!(session.close(1000)[1] & 0x80, 0x80);
        // A server's frames: unmasked, decoded by a client; a masked one
        // (a client's) is a protocol error there.
        let mut client = Decoder::new(Role::Client);
        client
            .extend(&text_frame(b"SIP/2.0 200 OK"), LIMITS)
            .unwrap();
        assert_eq!(
            client.next(LIMITS),
            Ok(Some(WsEvent::Message(b"SIP/2.0 200 OK".to_vec())))
        );
        let mut client = Decoder::new(Role::Client);
        client
            .extend(&client_frame(true, OP_TEXT, b"x", [1, 2, 3, 4]), LIMITS)
            .unwrap();
        assert_eq!(client.next(LIMITS), Err(FrameError::Protocol));
        // A server frame claiming more than a message may hold.
        let mut client = Decoder::new(Role::Client);
        let mut huge = vec![0x81, 127];
        huge.extend_from_slice(&(1u64 << 40).to_be_bytes());
        client.extend(&huge, LIMITS).unwrap();
        assert_eq!(client.next(LIMITS), Err(FrameError::TooBig));
        // Before the answer, messages wait (bounded), then go as frames.
        assert!(matches!(
            session.outgoing(&[b'a'; 600], 1000),
            Outgoing::Queued
        ));
        assert!(matches!(
            session.outgoing(&[b'a'; 600], 1000),
            Outgoing::Refused
        ));
        assert_eq!(session.state().pending.len(), 1);
        session.set_upgraded();
        assert!(matches!(session.outgoing(b"x", 1000), Outgoing::Frame(_)));
        // A server session sends nothing before the upgrade.
        assert!(matches!(
            WsSession::server().outgoing(b"x", 1000),
            Outgoing::Refused
        ));
    }
}
