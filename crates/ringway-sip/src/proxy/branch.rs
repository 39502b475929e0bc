//! The hashes that identify a request ([`RequestKeys`]), their encoding in
//! our Via branch (`z9hG4bKrw<16 hex>.<8 hex>`) and our To-tags.

use super::Proxy;
use crate::edit::build_response;
use crate::hash::Hash64;
use crate::msg::SipMsg;

/// Magic cookie plus our mark: branches we generate start with this.
pub(super) const BRANCH_PREFIX: &str = "z9hG4bKrw";

const HASH_DIGITS: usize = 16;
const LOOP_DIGITS: usize = 8;
const BRANCH_LEN: usize = BRANCH_PREFIX.len() + HASH_DIGITS + 1 + LOOP_DIGITS;

/// The hashes identifying a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct RequestKeys {
    /// Transaction hash (RFC 3261 16.11: the branch with a magic cookie,
    /// else the RFC 2543 fields); keys the transaction tables.
    pub(super) transaction: u64,
    /// Loop-detection hash (RFC 3261 16.6 step 8, checked in 16.3 step 4).
    pub(super) loop_detect: u32,
}

/// Stack-formatted branch `z9hG4bKrw<16 hex transaction>.<8 hex loop>`.
pub(super) struct Branch {
    buf: [u8; BRANCH_LEN],
}

impl Branch {
    /// The branch we put in our Via for a request with `keys`.
    pub(super) fn new(keys: RequestKeys) -> Branch {
        const HEX: &[u8; 16] = b"0123456789abcdef";
        let mut buf = [0u8; BRANCH_LEN];
        let prefix = BRANCH_PREFIX.len();
        buf[..prefix].copy_from_slice(BRANCH_PREFIX.as_bytes());
        for i in 0..HASH_DIGITS {
            buf[prefix + i] = HEX[((keys.transaction >> (60 - 4 * i)) & 0xF) as usize];
        }
        buf[prefix + HASH_DIGITS] = b'.';
        for i in 0..LOOP_DIGITS {
            buf[prefix + HASH_DIGITS + 1 + i] =
                HEX[((keys.loop_detect >> (28 - 4 * i)) & 0xF) as usize];
        }
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

    /// The keys encoded in one of our branches (`None` if not ours).
    pub(super) fn parse(branch: &str) -> Option<RequestKeys> {
        let rest = branch.strip_prefix(BRANCH_PREFIX)?;
        if rest.len() != HASH_DIGITS + 1 + LOOP_DIGITS || rest.as_bytes()[HASH_DIGITS] != b'.' {
            return None;
        }
        let transaction = u64::from_str_radix(&rest[..HASH_DIGITS], 16).ok()?;
        let loop_detect = u32::from_str_radix(&rest[HASH_DIGITS + 1..], 16).ok()?;
        Some(RequestKeys {
            transaction,
            loop_detect,
        })
    }
}

impl Proxy {
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
        Branch::new(RequestKeys {
            transaction: Hash64::new(self.secret).str(call_id).finish(),
            loop_detect: 0,
        })
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
        let branch = Branch::new(keys);
        assert_eq!(branch.as_str(), "z9hG4bKrw0123456789abcdef.feedbeef");
        assert_eq!(branch.to_tag(), "0123456789abcdef");
        assert_eq!(Branch::parse(branch.as_str()), Some(keys));
        assert_eq!(Branch::parse("z9hG4bKrw0123456789abcdef-feedbeef"), None);
        assert_eq!(Branch::parse("z9hG4bK0123456789abcdef.feedbeef"), None);
    }
}
