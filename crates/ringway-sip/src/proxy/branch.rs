//! The hashes that identify a request ([`RequestKeys`]), their encoding in
//! our Via branch (`z9hG4bKrw<16 hex>.<8 hex>.<8 hex>`: transaction hash,
//! loop-detection hash, and a MAC of where the responses go), our To-tags,
//! and the signature of our Record-Route. Each is a keyed MAC under its
//! own key of the proxy's [`KeyRing`](crate::hash::KeyRing): one seen on
//! the wire tells nothing of the key or of the others.

use super::Proxy;
use crate::edit::build_response;
use crate::hash::{write_hex, Purpose, Tag};
use crate::msg::SipMsg;

/// Magic cookie plus our mark: branches we generate start with this.
pub(super) const BRANCH_PREFIX: &str = "z9hG4bKrw";

const HASH_DIGITS: usize = 16;
const LOOP_DIGITS: usize = 8;
/// Digits of the upstream MAC in our branch: 32 bits. A forger needs about
/// 2^31 responses to have one relayed (one datagram, no amplification):
/// worthless, and every message of a call carries the branch.
const UPSTREAM_MAC_DIGITS: usize = 8;
/// Characters of the Record-Route signature: 64 bits in base64url (it
/// grants relaying).
const SIGNATURE_CHARS: usize = 11;

/// The base64url alphabet (RFC 4648 5): unreserved in URIs, token in SIP.
const BASE64URL: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
const BRANCH_LEN: usize =
    BRANCH_PREFIX.len() + HASH_DIGITS + 1 + LOOP_DIGITS + 1 + UPSTREAM_MAC_DIGITS;

/// URI parameter of our Record-Route carrying its signature.
pub(super) const SIGNATURE_PARAM: &str = "rw";

/// The hashes identifying a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct RequestKeys {
    /// Transaction hash (RFC 3261 16.11: the branch with a magic cookie,
    /// else the RFC 2543 fields); keys the transaction tables.
    pub(super) transaction: u64,
    /// Loop-detection hash (RFC 3261 16.6 step 8, checked in 16.3 step 4).
    pub(super) loop_detect: u32,
}

/// Stack-formatted branch `z9hG4bKrw<16 hex transaction>.<8 hex loop>.<8
/// hex upstream MAC>`.
pub(super) struct Branch {
    buf: [u8; BRANCH_LEN],
}

impl Branch {
    /// The branch we put in our Via for a request with `keys` whose
    /// responses go where `upstream_mac` says ([`Proxy::upstream_mac`]).
    pub(super) fn new(keys: RequestKeys, upstream_mac: u64) -> Branch {
        let mut buf = [0u8; BRANCH_LEN];
        let mut at = BRANCH_PREFIX.len();
        buf[..at].copy_from_slice(BRANCH_PREFIX.as_bytes());
        write_hex(&mut buf[at..], keys.transaction, HASH_DIGITS);
        at += HASH_DIGITS;
        buf[at] = b'.';
        write_hex(&mut buf[at + 1..], u64::from(keys.loop_detect), LOOP_DIGITS);
        at += 1 + LOOP_DIGITS;
        buf[at] = b'.';
        write_hex(&mut buf[at + 1..], upstream_mac, UPSTREAM_MAC_DIGITS);
        Branch { buf }
    }

    /// The branch text.
    pub(super) fn as_str(&self) -> &str {
        std::str::from_utf8(&self.buf).unwrap_or(BRANCH_PREFIX)
    }

    /// The keys and the upstream MAC encoded in one of our branches
    /// (`None` if not ours).
    pub(super) fn parse(branch: &str) -> Option<(RequestKeys, u64)> {
        let rest = branch.strip_prefix(BRANCH_PREFIX)?;
        let loop_at = HASH_DIGITS + 1;
        let mac_at = loop_at + LOOP_DIGITS + 1;
        let bytes = rest.as_bytes();
        let base = mac_at + UPSTREAM_MAC_DIGITS;
        if !(bytes.len() == base || bytes.len() == base + 2 && try_digit(&bytes[base..]).is_some())
            || bytes[HASH_DIGITS] != b'.'
            || bytes[mac_at - 1] != b'.'
        {
            return None;
        }
        let hex = |range: std::ops::Range<usize>| parse_hex(bytes.get(range)?);
        let transaction = hex(0..HASH_DIGITS)?;
        let loop_detect = hex(loop_at..loop_at + LOOP_DIGITS)? as u32;
        let mac = hex(mac_at..mac_at + UPSTREAM_MAC_DIGITS)?;
        Some((
            RequestKeys {
                transaction,
                loop_detect,
            },
            mac,
        ))
    }
}

/// `.<1..=9>`: a failover try's mark after our branch.
fn try_digit(suffix: &[u8]) -> Option<u8> {
    match suffix {
        [b'.', digit @ b'1'..=b'9'] => Some(digit - b'0'),
        _ => None,
    }
}

/// The failover try one of our branches names: 0 for the first target,
/// `N` for `<branch>.N`.
pub(super) fn try_of(branch: &str) -> u8 {
    let bytes = branch.as_bytes();
    bytes.get(BRANCH_LEN..).and_then(try_digit).unwrap_or(0)
}

/// Mark our branch in the top Via of `request` (a request we forward) with
/// failover try `tries` (1..=9): `<branch>.<tries>`. `false` when it is
/// not found or `tries` is out of range.
pub(super) fn set_try(request: &mut Vec<u8>, tries: u8) -> bool {
    if !(1..=9).contains(&tries) {
        return false;
    }
    // Our Via is the first one, after the request line.
    let Some(line_end) = memchr::memchr(b'\n', request) else {
        return false;
    };
    let needle = format!(";branch={BRANCH_PREFIX}");
    let Some(at) = memchr::memmem::find(&request[line_end..], needle.as_bytes()) else {
        return false;
    };
    let end = line_end + at + needle.len() - BRANCH_PREFIX.len() + BRANCH_LEN;
    if end > request.len() {
        return false;
    }
    let digit = b'0' + tries;
    match request.get(end..end + 2) {
        Some([b'.', b'1'..=b'9']) => request[end + 1] = digit,
        _ => {
            request.splice(end..end, [b'.', digit]);
        }
    }
    true
}

/// Up to 16 hex digits (either case) as a number; `None` for anything else.
fn parse_hex(digits: &[u8]) -> Option<u64> {
    if digits.is_empty() || digits.len() > 16 {
        return None;
    }
    digits.iter().try_fold(0u64, |value, &digit| {
        let nibble = match digit {
            b'0'..=b'9' => digit - b'0',
            b'a'..=b'f' => digit - b'a' + 10,
            b'A'..=b'F' => digit - b'A' + 10,
            _ => return None,
        };
        Some(value << 4 | u64::from(nibble))
    })
}

/// Stack-formatted signature of our Record-Route (`;rw=<11 base64url>`).
pub(super) struct RouteSignature {
    buf: [u8; SIGNATURE_CHARS],
}

/// `value` as 11 base64url characters, most significant first.
fn encode_signature(value: u64) -> [u8; SIGNATURE_CHARS] {
    let mut out = [0u8; SIGNATURE_CHARS];
    for (i, c) in out.iter_mut().enumerate() {
        let shift = 6 * (SIGNATURE_CHARS - 1 - i);
        *c = BASE64URL[((value >> shift) & 0x3F) as usize];
    }
    out
}

/// The value of 11 base64url characters (`None` for anything else).
fn decode_signature(text: &[u8]) -> Option<u64> {
    if text.len() != SIGNATURE_CHARS {
        return None;
    }
    text.iter().try_fold(0u64, |value, &c| {
        let digit = match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'-' => 62,
            b'_' => 63,
            _ => return None,
        };
        Some(value << 6 | u64::from(digit))
    })
}

impl RouteSignature {
    /// The hex text.
    pub(super) fn as_str(&self) -> &str {
        std::str::from_utf8(&self.buf).unwrap_or("")
    }
}

impl Proxy {
    /// The (32-bit) MAC in our branch of a request with transaction hash
    /// `transaction` whose responses go to `upstream`: a response with our
    /// Via on top is relayed (without a transaction) only to the address
    /// that matches it, so a forged one cannot be reflected anywhere else.
    pub(super) fn upstream_mac(&self, transaction: u64, upstream: std::net::SocketAddr) -> u64 {
        self.keys
            .mac(Purpose::Upstream)
            .u64(transaction)
            .addr(upstream)
            .finish()
            & 0xFFFF_FFFF
    }

    /// The signature of our Record-Route for the dialog of Call-ID
    /// `call_id` whose caller's tag is `tag` (the INVITE's From tag; the
    /// From or To tag of later requests, by direction).
    pub(super) fn route_signature(&self, call_id: &str, tag: &str) -> RouteSignature {
        RouteSignature {
            buf: encode_signature(self.route_mac(call_id, tag)),
        }
    }

    fn route_mac(&self, call_id: &str, tag: &str) -> u64 {
        self.keys
            .mac(Purpose::RecordRoute)
            .str(call_id)
            .str(tag)
            .finish()
    }

    /// Whether `uri` (one of our Route values, or our Request-URI behind a
    /// strict router) carries our signature for the dialog of `msg`.
    pub(super) fn route_is_signed(
        &self,
        msg: &SipMsg<'_>,
        uri: Option<crate::uri::SipUri<'_>>,
    ) -> bool {
        let Some(Some(signature)) = uri.and_then(|u| u.param(SIGNATURE_PARAM)) else {
            return false;
        };
        let Some(signature) = decode_signature(signature.as_bytes()) else {
            return false;
        };
        let call_id = msg.call_id().unwrap_or("");
        // (Comparing two u64 takes the same time wherever they differ.)
        [msg.from_tag(), msg.to_tag()]
            .into_iter()
            .flatten()
            .any(|tag| self.route_mac(call_id, tag) == signature)
    }

    /// The keys of a request (RFC 3261 16.11; 16.6 step 8).
    pub(super) fn request_keys(&self, msg: &SipMsg<'_>) -> RequestKeys {
        let top = msg.top_via();
        let request_uri = msg.request_uri().unwrap_or("");
        let from_tag = msg.from_tag().unwrap_or("");
        let call_id = msg.call_id().unwrap_or("");
        let cseq = msg.cseq().map_or(0, |c| c.0);
        let transaction = match top {
            Some(via) if via.has_cookie() => self
                .keys
                .mac(Purpose::Transaction)
                .str(via.branch.unwrap_or(""))
                .str(via.host)
                .u64(u64::from(via.port.unwrap_or(5060)))
                .finish(),
            _ => self
                .keys
                .mac(Purpose::Transaction)
                .str(request_uri)
                .str(from_tag)
                .str(call_id)
                .u64(u64::from(cseq))
                .str(top.map_or("", |via| via.raw))
                .finish(),
        };
        let mut loop_hash = self.keys.mac(Purpose::LoopDetect);
        loop_hash
            .str(request_uri)
            .str(from_tag)
            .str(msg.to_tag().unwrap_or(""))
            .str(call_id)
            .u64(u64::from(cseq));
        for option in msg.proxy_require() {
            loop_hash.str(option);
        }
        RequestKeys {
            transaction,
            loop_detect: loop_hash.finish() as u32,
        }
    }

    /// The RFC 2543 matching key of an INVITE or a CANCEL (RFC 3261 9.2,
    /// 17.2.3 without the top Via): Call-ID, From tag, To URI and tag, CSeq
    /// number and Request-URI. A CANCEL has the same key as the INVITE it
    /// cancels whatever its branch.
    pub(super) fn cancel_match_key(&self, msg: &SipMsg<'_>) -> u64 {
        let to = msg.to();
        self.keys
            .mac(Purpose::CancelMatch)
            .str(msg.call_id().unwrap_or(""))
            .str(msg.from_tag().unwrap_or(""))
            .str(to.map_or("", |to| to.uri))
            .str(msg.to_tag().unwrap_or(""))
            .u64(u64::from(msg.cseq().map_or(0, |c| c.0)))
            .str(msg.request_uri().unwrap_or(""))
            .finish()
    }

    /// The To-tag of the responses we generate to requests of `call_id`
    /// (a keyed MAC of it: retransmissions get the same tag, and nobody
    /// learns the key from it).
    pub(super) fn local_to_tag(&self, call_id: &str) -> Tag {
        self.keys.tag(Purpose::LocalTag, call_id.as_bytes())
    }

    /// Whether `ack` acknowledges a response we generated: its To tag is
    /// the one we give responses of its Call-ID, or that of our quick
    /// refusals ([`Proxy::refusal_tag`]).
    pub(super) fn is_ack_for_local_response(&self, ack: &SipMsg<'_>) -> bool {
        let call_id = ack.call_id().unwrap_or("").as_bytes();
        ack.to_tag().is_some_and(|tag| {
            self.keys.is_tag(Purpose::LocalTag, tag.as_bytes(), call_id)
                || self.is_refusal_tag(tag.as_bytes(), call_id)
        })
    }

    /// Build a response we generate to `request` into `out`, with our
    /// To-tag (derived from the Call-ID, so retransmissions get the same).
    pub(super) fn build_local_response(
        &self,
        request: &SipMsg<'_>,
        code: u16,
        reason: &str,
        extra_headers: &[(&str, &str)],
        out: &mut Vec<u8>,
    ) {
        let tag = self.local_to_tag(request.call_id().unwrap_or(""));
        build_response(
            request,
            code,
            reason,
            extra_headers,
            Some(tag.as_str()),
            out,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signatures_round_trip() {
        for value in [0, 1, u64::MAX, 0x0123_4567_89ab_cdef] {
            let text = encode_signature(value);
            assert_eq!(decode_signature(&text), Some(value), "{text:?}");
        }
        assert_eq!(&encode_signature(0), b"AAAAAAAAAAA");
        assert_eq!(decode_signature(b"AAAAAAAAAA"), None);
        assert_eq!(decode_signature(b"AAAAAAAAAA="), None);
    }

    #[test]
    fn branch_round_trip() {
        let keys = RequestKeys {
            transaction: 0x0123_4567_89ab_cdef,
            loop_detect: 0xfeed_beef,
        };
        let branch = Branch::new(keys, 0x1122_3344_5566_7788);
        assert_eq!(
            branch.as_str(),
            "z9hG4bKrw0123456789abcdef.feedbeef.55667788"
        );
        assert_eq!(Branch::parse(branch.as_str()), Some((keys, 0x5566_7788)));
        assert_eq!(
            Branch::parse("z9hG4bKrw0123456789abcdef-feedbeef.55667788"),
            None
        );
        assert_eq!(Branch::parse("z9hG4bKrw0123456789abcdef.feedbeef"), None);
        assert_eq!(
            Branch::parse("z9hG4bKrw0123456789abcdef.+eedbeef.55667788"),
            None
        );
    }

    /// Issue 19: what the proxy derives from its secret is keyed per
    /// purpose. The local To-tag was an unkeyed hash seeded with 8 bytes
    /// of the secret (invertible: one tag gave the seed back, and with it
    /// the transaction and loop hashes in every branch); seen failing with
    /// that derivation (neither the tag nor the transaction hash changed
    /// with the secret's bytes 8 to 31).
    #[test]
    fn tags_and_branch_hashes_are_keyed_per_purpose_by_the_whole_secret() {
        let request = |branch: &str| {
            format!(
                "INVITE sip:bob@192.0.2.20 SIP/2.0\r\nVia: SIP/2.0/UDP 192.0.2.1;branch={branch}\r\n\
From: <sip:a@example.com>;tag=1\r\nTo: <sip:bob@example.com>\r\nCall-ID: {branch}\r\n\
CSeq: 1 INVITE\r\nMax-Forwards: 70\r\nContent-Length: 0\r\n\r\n"
            )
        };
        let text = request("z9hG4bKsame");
        let msg = SipMsg::parse(text.as_bytes()).unwrap();
        let with_secret = |secret: [u8; 32]| {
            let mut proxy = Proxy::new(crate::proxy::ProxyConfig::default());
            proxy.set_secret(secret);
            let keys = proxy.request_keys(&msg);
            let tag = proxy.local_to_tag("z9hG4bKsame").as_str().to_owned();
            let refusal = proxy.refusal_tag(b"z9hG4bKsame").as_str().to_owned();
            (tag, refusal, keys)
        };
        let secret: [u8; 32] = std::array::from_fn(|i| i as u8 * 3);
        let (tag, refusal, keys) = with_secret(secret);
        assert_eq!(tag.len(), 16);
        assert!(tag.bytes().all(|b| b.is_ascii_hexdigit()));
        // Same input, other purposes: unrelated values.
        assert_ne!(tag, format!("{:016x}", keys.transaction));
        assert_ne!(tag, refusal[3..]);
        assert_ne!(
            u64::from_str_radix(&tag, 16).unwrap() as u32,
            keys.loop_detect
        );
        // Every byte of the secret moves every value.
        for byte in [0, 7, 8, 15, 16, 31] {
            let mut other = secret;
            other[byte] ^= 0x80;
            let (other_tag, other_refusal, other_keys) = with_secret(other);
            assert_ne!(other_tag, tag, "byte {byte}");
            assert_ne!(other_refusal, refusal, "byte {byte}");
            assert_ne!(other_keys.transaction, keys.transaction, "byte {byte}");
        }
    }
}
