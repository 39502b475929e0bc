//! ringway's fuzz targets: one function per target, taking the fuzzer's
//! bytes and panicking when the code under test breaks an invariant.
//!
//! The same functions run in two ways:
//! - coverage-guided, as libFuzzer targets (`fuzz_targets/*.rs`, built by
//!   `cargo fuzz` on the stable toolchain with `--sanitizer none`; see
//!   `scripts/fuzz.sh` and DEVELOPERS.md "Fuzzing");
//! - as ordinary tests (`tests/corpus.rs`), replaying every saved input of
//!   `fuzz/corpus/<target>/`, crash reproducers included.
//!
//! Targets reach the code through public APIs (and a few
//! `#[doc(hidden)]` entry points for private parsers), so moving a file
//! inside a crate does not break them.

mod capture;
mod sfu;
mod sip;

pub use capture::{nfqueue, pcap, rtnetlink, xdp_frame};
pub use sfu::{sfu_core, sfu_jacktrip, sfu_recording, sfu_token, sfu_wire};
pub use sip::{sip_digest, sip_dispatch, sip_parse, sip_proxy};

/// A DNS response datagram through the resolver's parser, lookups and
/// cache (see `ringway_server::fuzzing::dns_response`).
pub fn dns_response(data: &[u8]) {
    ringway_server::fuzzing::dns_response(data);
}

/// A Redis reply (RESP bytes) through the location store's reply parser.
pub fn redis_reply(data: &[u8]) {
    ringway_server::fuzzing::redis_reply(data);
}

/// A byte stream cut into reads (the first byte picks the read sizes)
/// through the SIP-over-TCP framer: every framed message lies inside what
/// was received and within the limits, the buffer never holds more than one
/// message's worth of bytes, and an error ends the stream.
pub fn sip_tcp_framing(data: &[u8]) {
    use ringway_server::sip::tcp::framing::{FrameLimits, Framed, Framer};
    let Some((&cut, stream)) = data.split_first() else {
        return;
    };
    let limits = FrameLimits {
        max_header_bytes: 256,
        max_body_bytes: 512,
    };
    let read = usize::from(cut % 64) + 1;
    let mut framer = Framer::default();
    let mut received = 0usize;
    let mut framed = 0usize;
    'stream: for chunk in stream.chunks(read) {
        if framer.extend(chunk, limits).is_err() {
            break;
        }
        received += chunk.len();
        assert!(
            framer.buffered().len() <= limits.max_header_bytes + limits.max_body_bytes,
            "buffer over one message's bound"
        );
        loop {
            match framer.next(limits) {
                Ok(None) => break,
                Ok(Some(Framed::Message(len))) => {
                    assert!(len > 0 && len <= framer.buffered().len());
                    assert!(len <= limits.max_header_bytes + limits.max_body_bytes);
                    framed += len;
                    framer.consume(len);
                }
                Ok(Some(Framed::Ping)) => framed += 4,
                Ok(Some(Framed::Pong)) => framed += 2,
                Err(_) => break 'stream,
            }
        }
        assert_eq!(
            framed + framer.buffered().len(),
            received,
            "bytes lost or made up"
        );
    }
}

/// A WebSocket connection's bytes (RFC 7118): the upgrade request, then
/// frames, cut into reads (the first byte picks the read size, the second
/// whether an Origin list applies): the upgrade consumes no more than it
/// was given, the decoder's buffer stays within one frame and one read,
/// and no message exceeds its bound.
pub fn sip_ws(data: &[u8]) {
    use ringway_server::sip::ws::{parse_handshake, Decoder, OriginPolicy};
    let Some((&[cut, policy], stream)) = data.split_first_chunk::<2>() else {
        return;
    };
    let origins = OriginPolicy {
        allowed: if policy & 1 == 1 {
            vec!["https://a.test".into()]
        } else {
            Vec::new()
        },
    };
    ws_connection(
        cut,
        stream,
        Decoder::default(),
        |head| match parse_handshake(head, WS_LIMITS, &origins) {
            Ok(upgrade) => Some(upgrade.map(|u| u.consumed)),
            Err(_) => None,
        },
        |_| {},
    );
}

/// The server's side of a WebSocket connection we opened (`--route-to
/// ws:`), cut into reads (the first byte picks the read size): the
/// answer to our upgrade (RFC 6455 4.1, checked against the accept key of
/// a fixed key) consumes no more than it was given and no more than its
/// bound, then the server's (unmasked) frames decode within their bounds;
/// every message re-encoded as our masked client frame decodes to itself
/// on the server side (one codec, both directions).
pub fn sip_ws_client(data: &[u8]) {
    use ringway_server::sip::ws::{
        client_handshake, encode_frame, parse_handshake_response, Decoder, Role, WsEvent,
    };
    let Some((&cut, stream)) = data.split_first() else {
        return;
    };
    // The key of RFC 6455 1.3's example: its accept is in the seeds.
    let ours = client_handshake("proxy.test", "/sip", *b"the sample nonce");
    ws_connection(
        cut,
        stream,
        Decoder::new(Role::Client),
        |head| match parse_handshake_response(head, WS_LIMITS, &ours.accept) {
            Ok(None) => {
                assert!(head.len() <= WS_LIMITS.max_handshake_bytes);
                Some(None)
            }
            Ok(Some(consumed)) => {
                assert_eq!(&head[consumed - 4..consumed], b"\r\n\r\n");
                Some(Some(consumed))
            }
            Err(_) => None,
        },
        |m| {
            let frame = encode_frame(true, 1, &m, Some([cut, 7, 0, 255]));
            let mut server = Decoder::new(Role::Server);
            server.extend(&frame, WS_LIMITS).expect("within bounds");
            assert_eq!(server.next(WS_LIMITS), Ok(Some(WsEvent::Message(m))));
        },
    );
}

/// The bounds of the WebSocket targets.
const WS_LIMITS: ringway_server::sip::ws::WsLimits = ringway_server::sip::ws::WsLimits {
    max_handshake_bytes: 512,
    max_message_bytes: 256,
};

/// One end of a WebSocket connection fed `stream` in reads of `cut % 64 +
/// 1` bytes: the head so far goes to `handshake` (`Some(None)`: incomplete,
/// `Some(Some(consumed))`: the upgrade took `consumed` bytes, which must be
/// within what it was given and its bound; `None`: refused, the end), the
/// rest to `decoder`, whose messages (each within its bound) go to
/// `message`, until a close or an error.
fn ws_connection(
    cut: u8,
    stream: &[u8],
    mut decoder: ringway_server::sip::ws::Decoder,
    mut handshake: impl FnMut(&[u8]) -> Option<Option<usize>>,
    mut message: impl FnMut(Vec<u8>),
) {
    use ringway_server::sip::ws::WsEvent;
    let limits = WS_LIMITS;
    let read = usize::from(cut % 64) + 1;
    let mut head = Vec::new();
    let mut upgraded = false;
    for chunk in stream.chunks(read) {
        let bytes = if upgraded {
            chunk.to_vec()
        } else {
            head.extend_from_slice(chunk);
            match handshake(&head) {
                Some(None) => continue,
                None => return,
                Some(Some(consumed)) => {
                    assert!(consumed <= head.len());
                    assert!(consumed <= limits.max_handshake_bytes);
                    upgraded = true;
                    head[consumed..].to_vec()
                }
            }
        };
        if decoder.extend(&bytes, limits).is_err() {
            return;
        }
        loop {
            match decoder.next(limits) {
                Ok(None) => break,
                Ok(Some(WsEvent::Message(m))) => {
                    assert!(m.len() <= limits.max_message_bytes);
                    message(m);
                }
                Ok(Some(WsEvent::Ping(p))) => assert!(p.len() <= 125),
                Ok(Some(WsEvent::Close(_))) => return,
                Ok(Some(WsEvent::Pong)) => {}
                Err(_) => return,
            }
        }
    }
}

/// A `/metrics` HTTP request head through its router.
pub fn metrics_http(data: &[u8]) {
    ringway_server::fuzzing::metrics_request(data);
}

/// A fuzz target's function.
pub type Target = fn(&[u8]);

/// Every target: name (the `fuzz_targets/` binary and the `corpus/`
/// directory) and function.
pub const TARGETS: [(&str, Target); 19] = [
    ("sip_parse", sip_parse),
    ("sip_digest", sip_digest),
    ("sip_proxy", sip_proxy),
    ("sip_dispatch", sip_dispatch),
    ("sfu_wire", sfu_wire),
    ("sfu_core", sfu_core),
    ("sfu_jacktrip", sfu_jacktrip),
    ("sfu_token", sfu_token),
    ("sfu_recording", sfu_recording),
    ("pcap", pcap),
    ("nfqueue", nfqueue),
    ("rtnetlink", rtnetlink),
    ("redis_reply", redis_reply),
    ("metrics_http", metrics_http),
    ("sip_tcp_framing", sip_tcp_framing),
    ("dns_response", dns_response),
    ("sip_ws", sip_ws),
    ("sip_ws_client", sip_ws_client),
    ("xdp_frame", xdp_frame),
];
