//! SIP targets: the parser and editor, digest credentials, the proxy core
//! and the dispatcher core. The message and core invariants live in
//! `ringway_sip::invariants` (shared with that crate's own tests); the
//! proxy and dispatcher inputs are scripts of datagrams and time steps
//! (`ringway_sip::invariants::proxy_sequence` says how they read).

use ringway_sip::auth::{Algorithm, Credentials, CredentialsError};

/// Parse, read every accessor, and forward through the editor.
pub fn sip_parse(data: &[u8]) {
    ringway_sip::invariants::parse_and_edit(data);
}

/// A script through stateful and stateless proxies, with and without
/// digest authentication.
pub fn sip_proxy(data: &[u8]) {
    ringway_sip::invariants::proxy_sequence(data);
}

/// A script through the dispatcher (two proxies behind it, probes).
pub fn sip_dispatch(data: &[u8]) {
    ringway_sip::invariants::dispatch_sequence(data);
}

/// One `Authorization` / `Proxy-Authorization` header value: parsed
/// credentials are slices of the value with the properties `parse`
/// promises, and agree with `realm_of`.
pub fn sip_digest(data: &[u8]) {
    let Ok(value) = std::str::from_utf8(data) else {
        return;
    };
    let realm = Credentials::realm_of(value);
    let credentials = match Credentials::parse(value) {
        Ok(c) => c,
        Err(CredentialsError::NotDigest) => {
            assert_eq!(realm, None, "a realm read from a non-Digest value");
            return;
        }
        Err(_) => return,
    };
    let within = |s: &str| {
        let (start, end) = (
            value.as_ptr() as usize,
            value.as_ptr() as usize + value.len(),
        );
        let p = s.as_ptr() as usize;
        assert!(
            start <= p && p + s.len() <= end,
            "{s:?} is not a slice of the value"
        );
    };
    for field in [
        credentials.username,
        credentials.realm,
        credentials.nonce,
        credentials.uri,
        credentials.response,
    ] {
        within(field);
    }
    assert_eq!(
        realm,
        Some(credentials.realm),
        "realm_of disagrees with parse"
    );
    for field in [credentials.username, credentials.nonce, credentials.uri] {
        assert!(!field.is_empty(), "an empty required field was accepted");
    }
    assert!(credentials.response.bytes().all(|b| b.is_ascii_hexdigit()));
    if let Some(text) = credentials.nc_text {
        assert_eq!(credentials.nc, u32::from_str_radix(text, 16).ok());
    }
    if credentials.qop.is_some() {
        assert!(credentials.nc.is_some() && credentials.cnonce.is_some_and(|c| !c.is_empty()));
    }
    // Checking a response costs the same whatever the values hold.
    let algorithm = credentials
        .algorithm
        .and_then(Algorithm::from_token)
        .unwrap_or(Algorithm::Md5);
    let expected = algorithm.response(
        "0123456789abcdef0123456789abcdef",
        credentials.nonce,
        credentials.nc_text.unwrap_or(""),
        credentials.cnonce.unwrap_or(""),
        "INVITE",
        credentials.uri,
    );
    let _ = expected.matches(credentials.response);
}
