//! The hashes that identify a request ([`RequestKeys`]), their encoding in
//! our Via branch (`z9hG4bKrw<16 hex>.<8 hex>.<16 hex>`: transaction hash,
//! loop-detection hash, and a MAC of where the responses go), our To-tags,
//! and the signature of our Record-Route.

use super::Proxy;
use crate::edit::build_response;
use crate::hash::Hash64;
use crate::msg::SipMsg;

/// Magic cookie plus our mark: branches we generate start with this.
pub(super) const BRANCH_PREFIX: &str = "z9hG4bKrw";

const HASH_DIGITS: usize = 16;
const LOOP_DIGITS: usize = 8;
const MAC_DIGITS: usize = 16;
const BRANCH_LEN: usize = BRANCH_PREFIX.len() + HASH_DIGITS + 1 + LOOP_DIGITS + 1 + MAC_DIGITS;

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

/// Write `value`'s low `digits` hex digits into `out`.
fn write_hex(out: &mut [u8], value: u64, digits: usize) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    for (i, byte) in out[..digits].iter_mut().enumerate() {
        *byte = HEX[((value >> (4 * (digits - 1 - i))) & 0xF) as usize];
    }
}

/// Stack-formatted branch `z9hG4bKrw<16 hex transaction>.<8 hex loop>.<16
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
        write_hex(&mut buf[at + 1..], upstream_mac, MAC_DIGITS);
        Branch { buf }
    }

    /// The branch text.
    pub(super) fn as_str(&self) -> &str {
        std::str::from_utf8(&self.buf).unwrap_or(BRANCH_PREFIX)
    }

    /// The 16 hex digits of the transaction hash, used as a To-tag.
    pub(super) fn to_tag(&self) -> &str {
        let start = BRANCH_PREFIX.len();
        &self.as_str()[start..start + HASH_DIGITS]
    }

    /// The keys and the upstream MAC encoded in one of our branches
    /// (`None` if not ours).
    pub(super) fn parse(branch: &str) -> Option<(RequestKeys, u64)> {
        let rest = branch.strip_prefix(BRANCH_PREFIX)?;
        let loop_at = HASH_DIGITS + 1;
        let mac_at = loop_at + LOOP_DIGITS + 1;
        let bytes = rest.as_bytes();
        if bytes.len() != mac_at + MAC_DIGITS
            || bytes[HASH_DIGITS] != b'.'
            || bytes[mac_at - 1] != b'.'
        {
            return None;
        }
        let hex = |range: std::ops::Range<usize>| {
            rest.get(range)
                .filter(|digits| digits.bytes().all(|b| b.is_ascii_hexdigit()))
                .and_then(|digits| u64::from_str_radix(digits, 16).ok())
        };
        let transaction = hex(0..HASH_DIGITS)?;
        let loop_detect = hex(loop_at..loop_at + LOOP_DIGITS)? as u32;
        let mac = hex(mac_at..mac_at + MAC_DIGITS)?;
        Some((
            RequestKeys {
                transaction,
                loop_detect,
            },
            mac,
        ))
    }
}

/// `a == b` in time independent of where they differ (case-insensitive
/// for `b`, hex digits).
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len()
        && a.iter()
            .zip(b)
            .fold(0u8, |acc, (x, y)| acc | (x ^ y.to_ascii_lowercase()))
            == 0
}

/// Stack-formatted signature of our Record-Route (`;rw=<16 hex>`).
pub(super) struct RouteSignature {
    buf: [u8; MAC_DIGITS],
}

impl RouteSignature {
    /// The hex text.
    pub(super) fn as_str(&self) -> &str {
        std::str::from_utf8(&self.buf).unwrap_or("")
    }
}

impl Proxy {
    /// The MAC in our branch of a request with transaction hash
    /// `transaction` whose responses go to `upstream`: a response with our
    /// Via on top is relayed (without a transaction) only to the address
    /// that matches it, so a forged one cannot be reflected anywhere else.
    pub(super) fn upstream_mac(&self, transaction: u64, upstream: std::net::SocketAddr) -> u64 {
        self.mac_key
            .mac()
            .u64(0xB2A)
            .u64(transaction)
            .addr(upstream)
            .finish()
    }

    /// The signature of our Record-Route for the dialog of Call-ID
    /// `call_id` whose caller's tag is `tag` (the INVITE's From tag; the
    /// From or To tag of later requests, by direction).
    pub(super) fn route_signature(&self, call_id: &str, tag: &str) -> RouteSignature {
        let mac = self
            .mac_key
            .mac()
            .u64(0x5EED)
            .str(call_id)
            .str(tag)
            .finish();
        let mut buf = [0u8; MAC_DIGITS];
        write_hex(&mut buf, mac, MAC_DIGITS);
        RouteSignature { buf }
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
        let call_id = msg.call_id().unwrap_or("");
        [msg.from_tag(), msg.to_tag()]
            .into_iter()
            .flatten()
            .any(|tag| {
                constant_time_eq(
                    self.route_signature(call_id, tag).as_str().as_bytes(),
                    signature.as_bytes(),
                )
            })
    }

    /// The keys of a request (RFC 3261 16.11; 16.6 step 8).
    pub(super) fn request_keys(&self, msg: &SipMsg<'_>) -> RequestKeys {
        let top = msg.top_via();
        let request_uri = msg.request_uri().unwrap_or("");
        let from_tag = msg.from_tag().unwrap_or("");
        let call_id = msg.call_id().unwrap_or("");
        let cseq = msg.cseq().map_or(0, |c| c.0);
        let transaction = match top {
            Some(via) if via.has_cookie() => Hash64::new(self.secret)
                .str(via.branch.unwrap_or(""))
                .str(via.host)
                .u64(u64::from(via.port.unwrap_or(5060)))
                .finish(),
            _ => Hash64::new(self.secret)
                .str(request_uri)
                .str(from_tag)
                .str(call_id)
                .u64(u64::from(cseq))
                .str(top.map_or("", |via| via.raw))
                .finish(),
        };
        let mut loop_hash = Hash64::new(self.secret ^ 0x100F);
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
        Hash64::new(self.secret ^ 0xCA9CE1)
            .str(msg.call_id().unwrap_or(""))
            .str(msg.from_tag().unwrap_or(""))
            .str(to.map_or("", |to| to.uri))
            .str(msg.to_tag().unwrap_or(""))
            .u64(u64::from(msg.cseq().map_or(0, |c| c.0)))
            .str(msg.request_uri().unwrap_or(""))
            .finish()
    }

    /// The To-tag of the responses we generate to requests of `call_id`.
    pub(super) fn local_to_tag(&self, call_id: &str) -> Branch {
        Branch::new(
            RequestKeys {
                transaction: Hash64::new(self.secret).str(call_id).finish(),
                loop_detect: 0,
            },
            0,
        )
    }

    /// Whether `ack` acknowledges a response we generated: its To tag is
    /// the one we give responses of its Call-ID.
    pub(super) fn is_ack_for_local_response(&self, ack: &SipMsg<'_>) -> bool {
        ack.to_tag()
            .is_some_and(|tag| tag == self.local_to_tag(ack.call_id().unwrap_or("")).to_tag())
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
            Some(tag.to_tag()),
            out,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn branch_round_trip_and_to_tag() {
        let keys = RequestKeys {
            transaction: 0x0123_4567_89ab_cdef,
            loop_detect: 0xfeed_beef,
        };
        let branch = Branch::new(keys, 0x1122_3344_5566_7788);
        assert_eq!(
            branch.as_str(),
            "z9hG4bKrw0123456789abcdef.feedbeef.1122334455667788"
        );
        assert_eq!(branch.to_tag(), "0123456789abcdef");
        assert_eq!(
            Branch::parse(branch.as_str()),
            Some((keys, 0x1122_3344_5566_7788))
        );
        assert_eq!(
            Branch::parse("z9hG4bKrw0123456789abcdef-feedbeef.1122334455667788"),
            None
        );
        assert_eq!(Branch::parse("z9hG4bKrw0123456789abcdef.feedbeef"), None);
        assert_eq!(
            Branch::parse("z9hG4bKrw0123456789abcdef.+eedbeef.1122334455667788"),
            None
        );
    }
}
