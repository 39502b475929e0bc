//! Entry points of the fuzz targets in `fuzz/` for this crate's private
//! parsers (not a stable API). Each panics when its parser breaks an
//! invariant; that is the point.

use crate::metrics::http::{route, Route};

/// A Redis reply (RESP bytes, as read from the socket) through the
/// location store's reply parser at a fixed `now`: a reply is either
/// refused with a reason or gives bindings that have not expired.
#[cfg(feature = "redis")]
pub fn redis_reply(bytes: &[u8]) {
    const NOW: u64 = 1_000_000_000_000;
    let Some(answer) = crate::sip::location::parse_resp_reply(bytes, NOW) else {
        return;
    };
    if let Ok(Ok(bindings)) = answer {
        for binding in bindings {
            assert!(binding.expires_at > NOW, "expired binding returned");
        }
    }
}

/// A `/metrics` request head through the request-line router: only the
/// first line decides, and only a `GET` is answered with metrics.
pub fn metrics_request(head: &[u8]) {
    let r = route(head);
    let first_line = head.split(|&b| b == b'\n').next().unwrap_or(&[]);
    let mut longer = first_line.to_vec();
    longer.extend_from_slice(b"\nGET /metrics HTTP/1.0\r\n\r\n");
    assert_eq!(route(&longer), r, "only the request line decides");
    if r != Route::BadRequest {
        let text = String::from_utf8_lossy(first_line);
        assert!(
            text.trim_start().starts_with("GET"),
            "{text:?} routed as {r:?}"
        );
    }
}
