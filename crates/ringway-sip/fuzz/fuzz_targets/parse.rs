//! Fuzz the parser, every accessor, and the forwarding editor.
#![no_main]

use libfuzzer_sys::fuzz_target;
use ringway_sip::{forward_request, forward_response, RequestEdits, SipMsg, ViaEdit};

fuzz_target!(|data: &[u8]| {
    let _ = SipMsg::parse_loose(data);
    let Ok(m) = SipMsg::parse(data) else { return };
    let _ = (
        m.method(),
        m.status(),
        m.request_uri(),
        m.call_id(),
        m.cseq(),
    );
    let _ = (
        m.from_tag(),
        m.to_tag(),
        m.max_forwards(),
        m.content_length(),
    );
    let _ = (m.expires(), m.body(), m.request_sip_uri(), m.contact_star());
    for v in m.vias() {
        let _ = v.response_target();
    }
    let _ = m.routes().count() + m.record_routes().count() + m.contact().count();
    let _ = m.proxy_require().count() + m.header("v").count() + m.headers().count();
    let mut out = Vec::new();
    if m.is_request() {
        let routes = m.routes().count();
        let edits = RequestEdits {
            via: Some(ViaEdit {
                transport: "UDP",
                sent_by: "192.0.2.10:5060",
                branch: "z9hG4bKfuzz",
            }),
            max_forwards: true,
            record_route: Some("sip:192.0.2.10:5060;lr"),
            pop_route: routes > 0,
            request_uri: Some("sip:x@192.0.2.20"),
            pop_last_route: routes > 1,
            received: Some("192.0.2.1"),
            rport: Some(5060),
            strict_next_hop: None,
        };
        if forward_request(&m, &edits, &mut out).is_ok() {
            // An edited valid request must still be a valid request.
            let f = SipMsg::parse(&out).expect("forwarded request must parse");
            assert_eq!(f.call_id(), m.call_id());
            assert_eq!(f.body(), m.body());
            assert_eq!(f.vias().count(), m.vias().count() + 1);
        }
    } else if forward_response(&m, &mut out).is_ok() && m.vias().count() > 1 {
        let f = SipMsg::parse(&out).expect("forwarded response must parse");
        assert_eq!(f.vias().count() + 1, m.vias().count());
    }
});
