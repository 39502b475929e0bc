//! Shared helpers for ringway-sip integration tests. Addresses are from the
//! documentation ranges; nothing here touches a network (sans-IO core).
#![allow(dead_code)]

use ringway_sip::{Outcome, Proxy, SipMsg};
use std::net::SocketAddr;

pub(crate) const PROXY: &str = "192.0.2.10:5060";
pub(crate) const UAC: &str = "192.0.2.1:5060";
pub(crate) const UAS: &str = "192.0.2.2:5060";

pub(crate) fn addr(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

/// Sent datagrams.
pub(crate) type Sent = Vec<(SocketAddr, Vec<u8>)>;

/// Handle `msg` through a worker of `p` (any worker sees every transaction).
pub(crate) fn handle(p: &Proxy, now: u64, src: &str, msg: &[u8]) -> (Outcome, Sent) {
    let mut sent = Vec::new();
    let o = p
        .worker()
        .handle(now, addr(src), msg, &mut |a, b| sent.push((a, b.to_vec())));
    (o, sent)
}

pub(crate) fn timer(p: &Proxy, now: u64) -> (usize, Sent) {
    let mut sent = Vec::new();
    let n = p
        .worker()
        .on_timer(now, &mut |a, b| sent.push((a, b.to_vec())));
    (n, sent)
}

pub(crate) fn parse(b: &[u8]) -> SipMsg<'_> {
    SipMsg::parse(b).unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(b)))
}

pub(crate) fn invite(branch: &str, ruri: &str, extra: &str) -> Vec<u8> {
    format!(
        "INVITE {ruri} SIP/2.0\r\n\
Via: SIP/2.0/UDP 192.0.2.1:5060;branch={branch}\r\n\
Max-Forwards: 70\r\n\
From: Alice <sip:alice@example.com>;tag=a1\r\n\
To: Bob <sip:bob@example.com>\r\n\
Call-ID: call-{branch}@192.0.2.1\r\n\
CSeq: 1 INVITE\r\n\
Contact: <sip:alice@192.0.2.1:5060>\r\n\
{extra}\
Content-Type: application/sdp\r\n\
Content-Length: 5\r\n\
\r\n\
v=0\r\n"
    )
    .into_bytes()
}

/// A response built by the UAS from the request it received (all Vias,
/// Record-Route copied), with To tag `b1`.
pub(crate) fn response_to(req: &[u8], code: u16, reason: &str, extra: &str) -> Vec<u8> {
    let m = parse(req);
    let mut s = format!("SIP/2.0 {code} {reason}\r\n");
    for (n, v) in m.headers() {
        let kind = ringway_sip::HeaderKind::of(n);
        use ringway_sip::HeaderKind as K;
        match kind {
            K::Via | K::RecordRoute | K::From | K::CallId | K::CSeq => {
                s.push_str(&format!("{n}: {v}\r\n"))
            }
            K::To => {
                if v.contains("tag=") || code == 100 {
                    s.push_str(&format!("{n}: {v}\r\n"))
                } else {
                    s.push_str(&format!("{n}: {v};tag=b1\r\n"))
                }
            }
            _ => {}
        }
    }
    s.push_str(extra);
    s.push_str("Content-Length: 0\r\n\r\n");
    s.into_bytes()
}
