//! [`ProxyWorker`]: one thread's handle on a shared [`Proxy`] (its scratch
//! buffer and counter stripe), the per-datagram entry point, and the
//! helpers every handling step uses (local responses, drops, sending).

use super::flood::FloodCheck;
use super::outcome::{Action, DropReason, MsgLabel, Outcome};
use super::routing::upstream_address;
use super::stats::{Counter, CounterStripe};
use super::Proxy;
use crate::edit::EditError;
use crate::msg::{HeaderKind, Method, ParseError, SipMsg};
use crate::overload_control::{self, OcAdvert};
use crate::registrar::{StoreAnswer, StoreQuery};
use crate::relay::sendable;
use crate::text::is_lws;
use crate::transport::Hop;
use std::net::SocketAddr;

/// A response we generate is at most this many times the size of the
/// request it answers (else it is not sent: `reply_too_large`), so that a
/// request with a spoofed source draws at most this many bytes per byte
/// towards the victim (a REGISTER's `200` lists only the bindings that fit).
pub const AMPLIFICATION_LIMIT: usize = 4;

/// Initial scratch capacity of a held worker (grows if a datagram needs more).
const SCRATCH_CAPACITY: usize = 4096;

/// Room to leave in the scratch buffer beyond the received datagram's size
/// (our Via, Record-Route, `received`/`rport`).
const SCRATCH_HEADROOM: usize = 512;

/// One worker thread's handle on a shared [`Proxy`], from [`Proxy::worker`].
///
/// It owns the per-thread state (a scratch buffer for the datagrams it
/// builds, and the counter stripe it counts into), so handling needs no
/// thread-locals. Transactions belong to the `Proxy`: a response or a timer
/// handled by one worker completes a transaction another worker created.
pub struct ProxyWorker<'p> {
    proxy: &'p Proxy,
    pub(super) stripe: &'p CounterStripe,
    pub(super) scratch: Vec<u8>,
    /// While resuming a deferred request: the store's answer to its query.
    pub(super) resumed_answer: Option<(StoreQuery, StoreAnswer)>,
    /// While resuming a deferred request (the store step never defers).
    pub(super) resuming: bool,
    /// While resuming a request parked on a name: the name's answer.
    pub(super) resolved_name: Option<(super::NameQuery, super::NameAnswer)>,
    /// While resuming a request parked on a name (it never parks twice).
    pub(super) resuming_name: bool,
    /// The driver reports overload: new INVITEs are shed.
    pub(super) shedding: bool,
    /// RFC 7339 overload control advertised to clients asking for it
    /// (`oc` in their top Via), set by the driver; `None`: nothing added.
    pub(super) overload_control: Option<OcAdvert>,
}

/// In the response `buf`, the copy of the request's top Via `via` gets
/// `rport=<port>;received=<ip>` of `source` (RFC 3581 4) where it has a
/// valueless `rport`. Nothing changes if the copy is not found.
#[cfg(test)]
pub(super) fn fill_rport(buf: &mut Vec<u8>, via: &crate::msg::Via<'_>, source: SocketAddr) {
    fill_via(buf, via, Some(source), None);
}

/// In the response `buf`, the copy of the request's top Via `via` gets
/// `rport=<port>;received=<ip>` of `source` where it has a valueless
/// `rport` (RFC 3581 4; `source` `None`: not), and the overload control
/// advertisement `oc` where it asks for it ([`overload_control`]). Nothing
/// changes if the copy is not found.
pub(super) fn fill_via(
    buf: &mut Vec<u8>,
    via: &crate::msg::Via<'_>,
    source: Option<SocketAddr>,
    oc: Option<&OcAdvert>,
) {
    let raw = via.raw;
    let rport_end = source.and_then(|source| {
        crate::text::Params::new(via.params)
            .find(|(name, value)| name.eq_ignore_ascii_case("rport") && value.is_none())
            .map(|(name, _)| {
                (
                    name.as_ptr() as usize - raw.as_ptr() as usize + name.len(),
                    source,
                )
            })
    });
    let oc_end = oc.and_then(|oc| Some((overload_control::insert_offset(via)?, oc)));
    if rport_end.is_none() && oc_end.is_none() {
        return;
    }
    // The copy is at the start of the first Via line's value (not wherever
    // the text occurs first: a From copied before it may quote it).
    let Some(at) = first_via_value(buf).filter(|&at| buf[at..].starts_with(raw.as_bytes())) else {
        return;
    };
    // `=65535;received=` and an IPv6 address fit; no allocation.
    let mut rport_text = [0u8; 80];
    let mut inserts: [(usize, &[u8]); 2] = [(0, &[]), (0, &[])];
    if let Some((end, source)) = rport_end.filter(|(end, _)| *end <= raw.len()) {
        let mut cursor = std::io::Cursor::new(&mut rport_text[..]);
        if std::io::Write::write_fmt(
            &mut cursor,
            format_args!("={};received={}", source.port(), source.ip()),
        )
        .is_ok()
        {
            let len = cursor.position() as usize;
            inserts[0] = (at + end, &rport_text[..len]);
        }
    }
    let mut oc_text = Vec::new();
    if let Some((end, oc)) = oc_end {
        oc.write_value(&mut oc_text);
        inserts[1] = (at + end, &oc_text);
    }
    // The later insertion first: the earlier offset stays valid.
    inserts.sort_by_key(|&(offset, _)| std::cmp::Reverse(offset));
    for (offset, text) in inserts {
        if !text.is_empty() {
            buf.splice(offset..offset, text.iter().copied());
        }
    }
}

impl<'p> ProxyWorker<'p> {
    /// A worker to be held: scratch buffer allocated once.
    pub(super) fn new(proxy: &'p Proxy, stripe: &'p CounterStripe) -> Self {
        ProxyWorker {
            proxy,
            stripe,
            scratch: Vec::with_capacity(SCRATCH_CAPACITY),
            resumed_answer: None,
            resuming: false,
            resolved_name: None,
            resuming_name: false,
            shedding: false,
            overload_control: None,
        }
    }

    /// Overload from the driver's side (RFC 6357 / 7339 in spirit): while
    /// `on`, a new INVITE (no To tag, no transaction) is answered `503` with
    /// `Retry-After` before any transaction, store lookup or authentication
    /// work; requests of calls already set up, retransmissions and responses
    /// are handled as usual. The driver sets it per datagram, e.g. from how
    /// long that datagram waited in its receive queue.
    pub fn set_shedding(&mut self, on: bool) {
        self.shedding = on;
    }

    /// RFC 7339 overload control (loss-based): while `Some`, a response
    /// this worker generates to a request whose top Via carries a
    /// valueless `oc` (the client supports it) gets `advert` in the copy of
    /// that Via ([`crate::overload_control`]); `None` (the default): never.
    /// The driver sets it per datagram, from its admission controller.
    pub fn set_overload_control(&mut self, advert: Option<OcAdvert>) {
        self.overload_control = advert;
    }

    /// The shared proxy (configuration, stats, [`Proxy::next_deadline`]).
    pub fn proxy(&self) -> &'p Proxy {
        self.proxy
    }

    /// Process one UDP datagram received from `src` at time `now`
    /// (monotonic ns); datagrams to send go to `out` (UDP only: a proxy
    /// with connection transports is driven with [`ProxyWorker::handle_from`]).
    pub fn handle(
        &mut self,
        now: u64,
        src: SocketAddr,
        datagram: &[u8],
        out: &mut dyn FnMut(SocketAddr, &[u8]),
    ) -> Outcome {
        self.handle_from(now, Hop::udp(src), datagram, &mut |hop, bytes| {
            out(hop.addr, bytes)
        })
    }

    /// Process one message (a datagram, or one message framed off a
    /// connection) that came from `from` at time `now` (monotonic ns);
    /// messages to send go to `out` with the hop they go over.
    pub fn handle_from(
        &mut self,
        now: u64,
        from: Hop,
        message: &[u8],
        out: &mut dyn FnMut(Hop, &[u8]),
    ) -> Outcome {
        if let Some(dropped) = self.flood_check(now, from.addr, message) {
            return dropped;
        }
        if self.shedding {
            // A new call the driver refuses: 503 from a scan of the lines
            // it copies (`refusal`), else the full path below.
            if let Some(refused) = self.refuse_new_call(now, from, message, out) {
                return refused;
            }
        }
        if self.proxy.refusal_acks_expected(now) {
            if let Some(absorbed) = self.absorb_refusal_ack(message) {
                return absorbed;
            }
        }
        match SipMsg::parse(message) {
            Ok(msg) if msg.is_request() => self.on_request(now, from, &msg, out),
            Ok(msg) => self.on_response(now, &msg, out),
            Err(error) => self.on_parse_error(from, message, error, out),
        }
    }

    /// Run due timers: retransmissions (A/E/G), timeouts with 408 or 487
    /// upstream (B/F/C, CANCEL downstream on C), cleanup (D/H/I/J/K) and
    /// registrar expiry (once per second). Returns the number of timer
    /// events processed. Call it at (or after) [`Proxy::next_deadline`].
    /// UDP only; see [`ProxyWorker::on_timer_hops`].
    pub fn on_timer(&mut self, now: u64, out: &mut dyn FnMut(SocketAddr, &[u8])) -> usize {
        self.run_due_timers(now, &mut |hop, bytes| out(hop.addr, bytes))
    }

    /// [`ProxyWorker::on_timer`] with the hop of every message sent.
    pub fn on_timer_hops(&mut self, now: u64, out: &mut dyn FnMut(Hop, &[u8])) -> usize {
        self.run_due_timers(now, out)
    }

    /// Count a datagram against its source's flood limit (a response a
    /// quarter of a request); the outcome if it is dropped. Keep-alives
    /// are not counted.
    fn flood_check(&self, now: u64, src: SocketAddr, datagram: &[u8]) -> Option<Outcome> {
        let flood = self.proxy.flood.as_ref()?;
        match flood.check_datagram(src.ip(), datagram, now) {
            FloodCheck::Pass => None,
            FloodCheck::Untracked => {
                self.stripe.add(Counter::FloodUntracked);
                None
            }
            FloodCheck::Drop { newly, label } => {
                if newly {
                    self.stripe.add(Counter::FloodBlocks);
                }
                Some(Outcome {
                    label,
                    action: self.drop_datagram(DropReason::Flood),
                })
            }
        }
    }

    /// A datagram that does not parse: keep-alives and broken responses are
    /// dropped; a request readable enough to answer gets 400 (or 413/...).
    fn on_parse_error(
        &mut self,
        from: Hop,
        datagram: &[u8],
        error: ParseError,
        out: &mut dyn FnMut(Hop, &[u8]),
    ) -> Outcome {
        let malformed = |action| Outcome {
            label: MsgLabel::Malformed,
            action,
        };
        if error == ParseError::Empty {
            return malformed(self.drop_datagram(DropReason::KeepAlive));
        }
        let start = datagram
            .iter()
            .position(|&b| b != b'\r' && b != b'\n')
            .map_or(&[][..], |p| &datagram[p..]);
        if start.len() >= 4 && start[..4].eq_ignore_ascii_case(b"SIP/") {
            return malformed(self.drop_datagram(DropReason::MalformedResponse));
        }
        let loose = match SipMsg::parse_loose(datagram) {
            Ok(m) if m.raw_values(HeaderKind::Via).next().is_some() => m,
            _ => return malformed(self.drop_datagram(DropReason::MalformedRequest)),
        };
        let label = loose
            .method()
            .map_or(MsgLabel::Malformed, MsgLabel::of_method);
        self.stripe.add(Counter::RequestsReceived);
        let reason = error.to_string();
        let to = reply_hop(from, upstream_address(from, loose.top_via().as_ref()));
        if loose.method() == Some(Method::Ack) {
            // Never answer an ACK.
            let action = self.drop_datagram(DropReason::MalformedRequest);
            return Outcome { label, action };
        }
        // A forbidden reply address is counted as a drop inside `respond`.
        let action = self.respond(&loose, to, error.status(), &reason, &[], out);
        Outcome { label, action }
    }

    /// Send a response we generate to `request` (our To-tag) to `to`.
    /// Never answers an ACK; never sends to a forbidden address.
    pub(super) fn respond(
        &mut self,
        request: &SipMsg<'_>,
        to: Hop,
        code: u16,
        reason: &str,
        extra_headers: &[(&str, &str)],
        out: &mut dyn FnMut(Hop, &[u8]),
    ) -> Action {
        if request.method() == Some(Method::Ack) {
            return self.drop_datagram(DropReason::AckNotRoutable);
        }
        if !sendable(&to.addr) || self.proxy.is_own_address(to.addr) {
            return self.drop_datagram(DropReason::ForbiddenDestination);
        }
        let buf = scratch_for(&mut self.scratch, request.as_bytes().len());
        self.proxy
            .build_local_response(request, code, reason, extra_headers, buf);
        if let Some(via) = request.top_via() {
            // RFC 3581 4: the reply hop is the source (rport asked for
            // it); tell the client its public address and port. RFC 7339:
            // the overload control advertisement, if it asked for it.
            let rport = (via.rport_flag && via.rport.is_none()).then_some(to.addr);
            fill_via(buf, &via, rport, self.overload_control.as_ref());
        }
        if buf.len() > AMPLIFICATION_LIMIT * request.as_bytes().len() {
            return self.drop_datagram(DropReason::ReplyTooLarge);
        }
        send(out, to, buf);
        self.stripe.response_generated(code);
        Action::Responded(code)
    }

    /// Count a drop and return it as the action.
    pub(super) fn drop_datagram(&self, reason: DropReason) -> Action {
        self.stripe.dropped(reason);
        Action::Dropped(reason)
    }

    /// A forwarding edit failed: count and return the drop.
    pub(super) fn edit_failed(&self, error: EditError) -> Action {
        self.drop_datagram(match error {
            EditError::TooLarge => DropReason::TooLarge,
            _ => DropReason::MalformedRequest,
        })
    }
}

/// Where the value of the first Via line of the message `buf` starts (its
/// header lines read by the full parser's line grammar).
fn first_via_value(buf: &[u8]) -> Option<usize> {
    let mut pos = memchr::memchr(b'\n', buf)? + 1;
    loop {
        let end = pos + memchr::memchr(b'\n', &buf[pos..])?;
        let line = &buf[pos..end];
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if line.is_empty() {
            return None;
        }
        if let Some((name, value)) = crate::peek::split_header(line) {
            if crate::peek::header_kind(name) == HeaderKind::Via {
                // A value that starts on a continuation line starts after
                // the fold.
                let at = value.as_ptr() as usize - buf.as_ptr() as usize;
                return Some(at + buf[at..].iter().take_while(|&&b| is_lws(b)).count());
            }
        }
        pos = end + 1;
    }
}

/// The scratch buffer, cleared, with room for a datagram built from one of
/// `received_len` bytes (a held worker's buffer rarely needs to grow).
pub(super) fn scratch_for(scratch: &mut Vec<u8>, received_len: usize) -> &mut Vec<u8> {
    scratch.clear();
    scratch.reserve(received_len + SCRATCH_HEADROOM);
    scratch
}

/// The hop responses to a request from `from` go over: the connection it
/// came on (RFC 3261 18.2.2: a response goes back over the connection of
/// its request), or for a datagram the `upstream` address (RFC 3581).
pub(crate) fn reply_hop(from: Hop, upstream: SocketAddr) -> Hop {
    match from.transport.is_reliable() {
        true => from,
        false => Hop::udp(upstream),
    }
}

/// Hand a message to the caller unless the destination is forbidden
/// (port 0, unspecified, broadcast, multicast) or there is nothing to send.
pub(super) fn send(out: &mut dyn FnMut(Hop, &[u8]), to: Hop, bytes: &[u8]) -> bool {
    if bytes.is_empty() || !sendable(&to.addr) {
        return false;
    }
    out(to, bytes);
    true
}

#[cfg(test)]
mod tests {
    use crate::edit::build_response;
    use crate::proxy::{Action, Mode, Proxy, ProxyConfig, T1};
    use crate::SipMsg;
    use std::net::SocketAddr;

    const UAC: &str = "192.0.2.1:5060";
    const UAS: &str = "192.0.2.2:5060";
    const INVITE: &[u8] = b"INVITE sip:bob@192.0.2.10 SIP/2.0\r\n\
Via: SIP/2.0/UDP 192.0.2.1:5060;branch=z9hG4bKw1\r\n\
From: <sip:alice@example.com>;tag=1\r\nTo: <sip:bob@example.com>\r\n\
Call-ID: w1\r\nCSeq: 1 INVITE\r\nMax-Forwards: 70\r\nContent-Length: 0\r\n\r\n";
    const ACK: &[u8] = b"ACK sip:bob@192.0.2.10 SIP/2.0\r\n\
Via: SIP/2.0/UDP 192.0.2.1:5060;branch=z9hG4bKw1\r\n\
From: <sip:alice@example.com>;tag=1\r\nTo: <sip:bob@example.com>;tag=b1\r\n\
Call-ID: w1\r\nCSeq: 1 ACK\r\nMax-Forwards: 70\r\nContent-Length: 0\r\n\r\n";

    fn addr(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    fn stateful() -> Proxy {
        Proxy::new(ProxyConfig {
            mode: Mode::Stateful,
            local: addr("192.0.2.10:5060"),
            route_to: Some(addr(UAS)),
            ..ProxyConfig::default()
        })
    }

    type Sent = Vec<(SocketAddr, Vec<u8>)>;

    fn collect(sent: &mut Sent) -> impl FnMut(SocketAddr, &[u8]) + '_ {
        |to, bytes| sent.push((to, bytes.to_vec()))
    }

    fn is_ack(bytes: &[u8]) -> bool {
        SipMsg::parse(bytes).is_ok_and(|m| m.method() == Some(crate::Method::Ack))
    }

    #[test]
    fn proxy_is_shared_and_workers_are_sendable() {
        fn assert_send_sync<T: Send + Sync>() {}
        fn assert_send<T: Send>() {}
        assert_send_sync::<Proxy>();
        assert_send::<super::ProxyWorker<'static>>();
    }

    #[test]
    fn two_workers_share_transactions() {
        let proxy = stateful();
        let mut worker_a = proxy.worker();
        let mut worker_b = proxy.worker();
        assert!(!std::ptr::eq(worker_a.stripe, worker_b.stripe));

        // Worker A creates the INVITE transaction.
        let mut sent = Sent::new();
        let outcome = worker_a.handle(0, addr(UAC), INVITE, &mut collect(&mut sent));
        assert_eq!(outcome.action, Action::Forwarded { copies: 1 });
        let forwarded = sent
            .iter()
            .find(|(to, _)| *to == addr(UAS))
            .unwrap()
            .1
            .clone();
        let mut busy = Vec::new();
        build_response(
            &SipMsg::parse(&forwarded).unwrap(),
            486,
            "Busy Here",
            &[],
            Some("b1"),
            &mut busy,
        );

        // Worker B gets the 486: it completes A's transaction (ACK
        // downstream hop by hop, 486 upstream), which only a transaction
        // match does.
        let mut sent = Sent::new();
        let outcome = worker_b.handle(10, addr(UAS), &busy, &mut collect(&mut sent));
        assert_eq!(outcome.action, Action::Forwarded { copies: 1 });
        assert!(sent.iter().any(|(to, b)| *to == addr(UAS) && is_ack(b)));
        assert!(sent.iter().any(|(to, _)| *to == addr(UAC)));
        // Timer G now runs for the 486 (not timer A for the INVITE).
        assert_eq!(proxy.next_deadline(), Some(10 + T1));

        // Back on worker A: the retransmitted 486 is absorbed (and ACKed
        // again), the UAC's ACK confirms the transaction.
        let mut sent = Sent::new();
        let outcome = worker_a.handle(20, addr(UAS), &busy, &mut collect(&mut sent));
        assert_eq!(outcome.action, Action::Absorbed);
        assert!(sent.len() == 1 && is_ack(&sent[0].1));
        let outcome = worker_b.handle(30, addr(UAC), ACK, &mut |_, _| {});
        assert_eq!(outcome.action, Action::Absorbed);

        let stats = proxy.stats();
        assert_eq!(stats.transactions_created, 1);
        assert_eq!(stats.transactions_active, 1);
        assert_eq!(stats.retransmissions_absorbed, 1);
        assert_eq!(stats.requests_received, 2);
        assert_eq!(stats.responses_received, 2);
        // Timer I ends it; any worker runs it.
        assert_eq!(worker_b.on_timer(30 + super::super::T4, &mut |_, _| {}), 1);
        assert_eq!(proxy.stats().transactions_active, 0);
    }

    /// Issue 19: `rport`/`received` go into the copy of the top Via, found
    /// as the full parser finds it (the first Via line), not wherever its
    /// text occurs first. Seen failing with the search over the whole
    /// response: the From line, copied before the Via, quotes the Via and
    /// got `rport=…;received=…` instead.
    #[test]
    fn rport_is_filled_in_the_via_line_not_in_a_header_quoting_it() {
        let via = "SIP/2.0/UDP 192.0.2.1:5060;branch=z9hG4bKw9;rport";
        for (first_via, top) in [
            (format!("Via: {via}"), via),
            // A value that starts on a continuation line.
            (format!("Via:\r\n {via}"), via),
        ] {
            let request = format!(
                "OPTIONS sip:192.0.2.10 SIP/2.0\r\nFrom: <sip:a@example.com>;q=\"{via}\";tag=1\r\n\
{first_via}\r\nTo: <sip:192.0.2.10>\r\nCall-ID: w9\r\nCSeq: 1 OPTIONS\r\n\
Max-Forwards: 70\r\nContent-Length: 0\r\n\r\n"
            );
            let msg = SipMsg::parse(request.as_bytes()).unwrap();
            assert_eq!(msg.top_via().unwrap().raw, top);
            let mut buf = Vec::new();
            build_response(&msg, 200, "OK", &[], Some("t"), &mut buf);
            super::fill_rport(&mut buf, &msg.top_via().unwrap(), UAC.parse().unwrap());
            let response = String::from_utf8(buf).unwrap();
            let filled = format!("{via}=5060;received=192.0.2.1\r\n");
            assert!(response.contains(&filled), "{response}");
            assert!(
                response.contains(&format!("q=\"{via}\";tag=1")),
                "{response}"
            );
            assert_eq!(response.matches("received=").count(), 1, "{response}");
        }
    }
}
