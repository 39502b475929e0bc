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

/// A DNS response datagram through the wire parser, then through an
/// RFC 3263 lookup of each kind (NAPTR, SRV, A/AAAA) and the cache: the
/// parser keeps at most `MAX_RECORDS` records with names of at most 255
/// bytes, a lookup asks a bounded number of questions and gives distinct
/// targets, and the cache stays within its byte bound.
pub fn dns_response(bytes: &[u8]) {
    use crate::dns::cache::{Cache, CacheLimits, Cached};
    use crate::dns::rfc3263::{Answer, Lookup, XorShift, MAX_QUESTIONS};
    use crate::dns::wire::{parse_response, MAX_RECORDS};
    let Ok(response) = parse_response(bytes) else {
        return;
    };
    assert!(response.records.len() <= MAX_RECORDS);
    assert!(response.question.len() <= 255);
    for record in &response.records {
        assert!(record.name.len() <= 255);
    }
    let mut random = XorShift::new(1);
    for (host, port) in [(response.question.as_str(), None), ("t.test", Some(5060))] {
        let mut lookup = Lookup::new(host, port, true, true);
        let mut asked = 0;
        while lookup.question().is_some() {
            lookup.answer(Answer::Records(&response.records), &mut random);
            asked += 1;
            assert!(asked <= MAX_QUESTIONS, "a lookup asked without end");
        }
        if let Ok(targets) = lookup.targets() {
            for (i, t) in targets.iter().enumerate() {
                assert!(!targets[..i].contains(t), "target {t} twice");
            }
        }
    }
    let limits = CacheLimits {
        max_bytes: 2048,
        ..CacheLimits::default()
    };
    let mut cache = Cache::new(limits);
    for (i, record) in response.records.iter().enumerate() {
        let question = crate::dns::rfc3263::Question {
            name: format!("{i}.{}", record.name),
            record_type: record.data.record_type(),
        };
        cache.put(
            question,
            Cached::Records(vec![record.clone()]),
            Some(record.ttl),
            0,
        );
        assert!(cache.bytes() <= limits.max_bytes);
    }
}
