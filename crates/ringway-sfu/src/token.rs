//! Signed join tokens: JSON Web Tokens (RFC 7519) signed with HMAC-SHA256
//! (`alg` HS256, RFC 7518 §3.2), so any JWT library can mint them.
//!
//! Claims (`room` and `sub` required, the rest optional):
//!
//! | claim | meaning |
//! |---|---|
//! | `room` | the room the token admits to (1-64 bytes) |
//! | `sub` | the participant's identity (1-64 bytes) |
//! | `exp` | expiry, Unix seconds (required) |
//! | `nbf` | not valid before, Unix seconds |
//! | `iat` | issued at, Unix seconds |
//! | `publish` | may send media (default true) |
//! | `subscribe` | may subscribe (default true) |
//!
//! Verification is bounded: a token longer than [`MAX_TOKEN_LEN`] bytes is
//! refused before anything is decoded, the MAC is checked (in constant
//! time) before the claims are parsed, and `alg` must be HS256 (`none` and
//! every other algorithm are refused). The key never appears in a `Debug`
//! output, an error or a log line.

use crate::wire::{MAX_ROOM_LEN, MAX_TOKEN_LEN};
use hmac::{Hmac, Mac};
use sha2::Sha256;

type HmacSha256 = Hmac<Sha256>;

/// Shortest key accepted (bytes).
pub const MIN_KEY_LEN: usize = 32;
/// Longest identity (`sub`) accepted (bytes).
pub const MAX_IDENTITY_LEN: usize = 64;

/// The HMAC key tokens are signed with. Its `Debug` hides the bytes.
#[derive(Clone)]
pub struct TokenKey(Vec<u8>);

impl std::fmt::Debug for TokenKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "TokenKey({} bytes, hidden)", self.0.len())
    }
}

impl TokenKey {
    /// A key from raw bytes; at least [`MIN_KEY_LEN`] bytes.
    pub fn new(bytes: Vec<u8>) -> Result<TokenKey, String> {
        if bytes.len() < MIN_KEY_LEN {
            return Err(format!(
                "token key too short: {} bytes, at least {MIN_KEY_LEN} needed",
                bytes.len()
            ));
        }
        Ok(TokenKey(bytes))
    }

    /// A key from the contents of a key file: the bytes with trailing
    /// whitespace (a final newline) removed.
    pub fn from_file_contents(mut bytes: Vec<u8>) -> Result<TokenKey, String> {
        while bytes.last().is_some_and(|b| b.is_ascii_whitespace()) {
            bytes.pop();
        }
        TokenKey::new(bytes)
    }

    fn mac(&self) -> HmacSha256 {
        HmacSha256::new_from_slice(&self.0).expect("HMAC takes any key length")
    }
}

/// What a token grants.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Claims {
    /// Room.
    pub room: String,
    /// Identity (JWT `sub`).
    pub sub: String,
    /// Expiry (Unix seconds).
    pub exp: u64,
    /// Not valid before (Unix seconds).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nbf: Option<u64>,
    /// Issued at (Unix seconds).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub iat: Option<u64>,
    /// May send media.
    #[serde(default = "yes")]
    pub publish: bool,
    /// May subscribe to others' media.
    #[serde(default = "yes")]
    pub subscribe: bool,
}

fn yes() -> bool {
    true
}

/// Why a token was refused (each is counted by the core).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, thiserror::Error, serde::Serialize)]
pub enum TokenError {
    /// No token, where one is required.
    #[error("token missing")]
    Missing,
    /// Not a well-formed HS256 JWT with valid claims.
    #[error("token malformed")]
    Malformed,
    /// The signature does not verify under our key.
    #[error("token signature invalid")]
    Forged,
    /// `exp` is past (or `nbf` is in the future).
    #[error("token expired or not yet valid")]
    Expired,
    /// The token is for another room.
    #[error("token is for another room")]
    WrongRoom,
    /// The token was revoked (its holder was kicked).
    #[error("token revoked")]
    Revoked,
}

/// The parts of a verified token the core keeps.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Verified {
    /// The claims.
    pub claims: Claims,
    /// The first 16 bytes of the signature: identifies the token (for
    /// revocation) without keeping it.
    pub id: [u8; 16],
}

/// Mint a token for `claims` under `key`.
pub fn mint(key: &TokenKey, claims: &Claims) -> String {
    let header = b64url_encode(br#"{"alg":"HS256","typ":"JWT"}"#);
    let payload = b64url_encode(&serde_json::to_vec(claims).expect("claims serialize"));
    let signing_input = format!("{header}.{payload}");
    let mut mac = key.mac();
    mac.update(signing_input.as_bytes());
    let sig = b64url_encode(&mac.finalize().into_bytes());
    format!("{signing_input}.{sig}")
}

#[derive(serde::Deserialize)]
struct Header {
    alg: String,
}

/// Verify `token` under `key` for `room` at Unix time `now_s`.
pub fn verify(
    key: &TokenKey,
    token: &[u8],
    room: &str,
    now_s: u64,
) -> Result<Verified, TokenError> {
    if token.is_empty() {
        return Err(TokenError::Missing);
    }
    if token.len() > MAX_TOKEN_LEN {
        return Err(TokenError::Malformed);
    }
    let mut parts = token.split(|&b| b == b'.');
    let (Some(header_part), Some(payload_part), Some(signature), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(TokenError::Malformed);
    };
    let header = b64url_decode(header_part).ok_or(TokenError::Malformed)?;
    let header: Header = serde_json::from_slice(&header).map_err(|_| TokenError::Malformed)?;
    if header.alg != "HS256" {
        return Err(TokenError::Malformed);
    }
    let sig = b64url_decode(signature).ok_or(TokenError::Malformed)?;
    if sig.len() != 32 {
        return Err(TokenError::Malformed);
    }
    let mut mac = key.mac();
    mac.update(&token[..header_part.len() + 1 + payload_part.len()]);
    mac.verify_slice(&sig).map_err(|_| TokenError::Forged)?;
    let payload = b64url_decode(payload_part).ok_or(TokenError::Malformed)?;
    let claims: Claims = serde_json::from_slice(&payload).map_err(|_| TokenError::Malformed)?;
    if claims.room.is_empty()
        || claims.room.len() > MAX_ROOM_LEN
        || claims.sub.is_empty()
        || claims.sub.len() > MAX_IDENTITY_LEN
    {
        return Err(TokenError::Malformed);
    }
    if now_s >= claims.exp || claims.nbf.is_some_and(|n| now_s < n) {
        return Err(TokenError::Expired);
    }
    if claims.room != room {
        return Err(TokenError::WrongRoom);
    }
    let mut token_id = [0u8; 16];
    token_id.copy_from_slice(&sig[..16]);
    Ok(Verified {
        claims,
        id: token_id,
    })
}

const B64: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

/// Base64url without padding (RFC 4648 §5), as JWT uses.
pub fn b64url_encode(data: &[u8]) -> String {
    let mut out = String::with_capacity(data.len().div_ceil(3) * 4);
    for c in data.chunks(3) {
        let triple = (u32::from(c[0]) << 16)
            | (u32::from(*c.get(1).unwrap_or(&0)) << 8)
            | u32::from(*c.get(2).unwrap_or(&0));
        for i in 0..=c.len() {
            out.push(B64[(triple >> (18 - 6 * i) & 63) as usize] as char);
        }
    }
    out
}

/// Decode base64url without padding; `None` on any other byte or an
/// impossible length.
pub fn b64url_decode(s: &[u8]) -> Option<Vec<u8>> {
    if s.len() % 4 == 1 {
        return None;
    }
    let val = |b: u8| -> Option<u32> {
        Some(match b {
            b'A'..=b'Z' => b - b'A',
            b'a'..=b'z' => b - b'a' + 26,
            b'0'..=b'9' => b - b'0' + 52,
            b'-' => 62,
            b'_' => 63,
            _ => return None,
        } as u32)
    };
    let mut out = Vec::with_capacity(s.len() * 3 / 4);
    for c in s.chunks(4) {
        let mut bits = 0u32;
        for (i, &b) in c.iter().enumerate() {
            bits |= val(b)? << (18 - 6 * i);
        }
        let bytes = [(bits >> 16) as u8, (bits >> 8) as u8, bits as u8];
        out.extend_from_slice(&bytes[..c.len() - 1]);
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn key() -> TokenKey {
        TokenKey::new(vec![7u8; 32]).unwrap()
    }

    fn claims(room: &str, exp: u64) -> Claims {
        Claims {
            room: room.into(),
            sub: "alice".into(),
            exp,
            nbf: None,
            iat: Some(1000),
            publish: true,
            subscribe: false,
        }
    }

    #[test]
    fn base64url_roundtrip_and_rfc4648_vectors() {
        for (plain, enc) in [
            ("", ""),
            ("f", "Zg"),
            ("fo", "Zm8"),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg"),
            ("fooba", "Zm9vYmE"),
            ("foobar", "Zm9vYmFy"),
        ] {
            assert_eq!(b64url_encode(plain.as_bytes()), enc);
            assert_eq!(b64url_decode(enc.as_bytes()).unwrap(), plain.as_bytes());
        }
        assert_eq!(b64url_encode(&[0xfb, 0xff]), "-_8");
        assert!(b64url_decode(b"Zm9v=").is_none());
        assert!(b64url_decode(b"Z").is_none());
    }

    /// RFC 7515 appendix A.1's HS256 example verifies with its key (the
    /// signature is what any JWT library computes), and its claims are not
    /// ours (no room): malformed, but only after the signature checked.
    #[test]
    fn rfc7515_hs256_example_signature() {
        let k = b64url_decode(
            b"AyM1SysPpbyDfgZld3umj1qzKObwVMkoqQ-EstJQLr_T-1qS0gZH75aKtMN3Yj0iPS4hcgUuTwjAzZr1Z9CAow",
        )
        .unwrap();
        let token = b"eyJ0eXAiOiJKV1QiLA0KICJhbGciOiJIUzI1NiJ9.eyJpc3MiOiJqb2UiLA0KICJleHAiOjEzMDA4MTkzODAsDQogImh0dHA6Ly9leGFtcGxlLmNvbS9pc19yb290Ijp0cnVlfQ.dBjftJeZ4CVP-mB92K27uhbUJU1p1r_wW1gFWFOEjXk";
        let key = TokenKey::new(k).unwrap();
        assert_eq!(verify(&key, token, "x", 0), Err(TokenError::Malformed));
        let mut forged = token.to_vec();
        let last = forged.len() - 2;
        forged[last] = b'A';
        assert_eq!(verify(&key, &forged, "x", 0), Err(TokenError::Forged));
    }

    #[test]
    fn mint_and_verify() {
        let k = key();
        let t = mint(&k, &claims("jam", 2000));
        let v = verify(&k, t.as_bytes(), "jam", 1500).unwrap();
        assert_eq!(v.claims, claims("jam", 2000));
        assert!(!v.claims.subscribe && v.claims.publish);
        assert_eq!(
            verify(&k, t.as_bytes(), "jam", 2000),
            Err(TokenError::Expired)
        );
        assert_eq!(
            verify(&k, t.as_bytes(), "other", 1500),
            Err(TokenError::WrongRoom)
        );
        let other = TokenKey::new(vec![8u8; 32]).unwrap();
        assert_eq!(
            verify(&other, t.as_bytes(), "jam", 1500),
            Err(TokenError::Forged)
        );
        // Claims changed after signing: forged.
        let parts: Vec<&str> = t.split('.').collect();
        let evil = b64url_encode(&serde_json::to_vec(&claims("jam", 99_999)).unwrap());
        let t2 = format!("{}.{}.{}", parts[0], evil, parts[2]);
        assert_eq!(
            verify(&k, t2.as_bytes(), "jam", 1500),
            Err(TokenError::Forged)
        );
        // alg none is refused whatever the signature.
        let none = b64url_encode(br#"{"alg":"none"}"#);
        let t3 = format!("{none}.{}.{}", parts[1], parts[2]);
        assert_eq!(
            verify(&k, t3.as_bytes(), "jam", 1500),
            Err(TokenError::Malformed)
        );
        assert_eq!(verify(&k, b"", "jam", 1500), Err(TokenError::Missing));
        // nbf in the future.
        let mut c = claims("jam", 2000);
        c.nbf = Some(1800);
        let t4 = mint(&k, &c);
        assert_eq!(
            verify(&k, t4.as_bytes(), "jam", 1500),
            Err(TokenError::Expired)
        );
        assert!(verify(&k, t4.as_bytes(), "jam", 1900).is_ok());
    }

    #[test]
    fn key_is_never_printed_and_must_be_long() {
        let k = TokenKey::from_file_contents(b"0123456789abcdef0123456789abcdefSECRET\n".to_vec())
            .unwrap();
        assert!(!format!("{k:?}").contains("SECRET"));
        assert!(TokenKey::new(vec![1; 31]).is_err());
    }

    /// The replayed corpus (tests/corpus/token): none panics; the valid
    /// ones verify under the corpus key.
    #[test]
    fn corpus_replays() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/corpus/token");
        let key = TokenKey::new(b"ringway-corpus-key-0123456789abcdef".to_vec()).unwrap();
        let mut n = 0;
        for e in std::fs::read_dir(&dir).expect("corpus present") {
            let path = e.unwrap().path();
            let data = std::fs::read(&path).unwrap();
            let r = verify(&key, &data, "jam", 1_700_000_000);
            let name = path.file_name().unwrap().to_string_lossy().to_string();
            if name.starts_with("valid") {
                assert!(r.is_ok(), "{name}: {r:?}");
            } else {
                assert!(r.is_err(), "{name} verified");
            }
            n += 1;
        }
        assert!(n >= 5, "corpus has {n} entries");
    }

    proptest! {
        #[test]
        fn verify_never_panics(data in proptest::collection::vec(any::<u8>(), 0..1200)) {
            let _ = verify(&key(), &data, "jam", 10);
            let _ = b64url_decode(&data);
        }
        #[test]
        fn verify_never_panics_on_dotted(a in "[A-Za-z0-9_-]{0,60}", b in "[A-Za-z0-9_-]{0,200}", c in "[A-Za-z0-9_-]{0,50}") {
            let t = format!("{a}.{b}.{c}");
            let _ = verify(&key(), t.as_bytes(), "jam", 10);
        }
        #[test]
        fn b64_roundtrip(data in proptest::collection::vec(any::<u8>(), 0..100)) {
            prop_assert_eq!(b64url_decode(b64url_encode(&data).as_bytes()).unwrap(), data);
        }
    }
}
