//! The cheap refusal of a new call under overload (issue 19): a new INVITE
//! the driver refuses ([`ProxyWorker::set_shedding`]) is answered `503` +
//! `Retry-After` from one scan of the header lines a response copies
//! (Via, From, To, Call-ID, CSeq), without the strict parse and without a
//! transaction lookup; and the ACK of that `503` is recognised by its
//! To-tag on a scan of two lines and absorbed, without a parse either.
//!
//! Why: at three times the capacity two of every three new calls are
//! refused, so each admitted call pays for two refusals; with the full
//! path a refusal (INVITE → 503, ACK) took about a quarter of a relayed
//! call's core time and the overload goal could not be met
//! (`tests/overload_sim.rs`).
//!
//! What stays as on the full path:
//! - the `503` goes where every response we generate goes: the source
//!   address, with the sent-by port unless the top Via asks for `rport`
//!   (then the source port, written into `rport`/`received`); never to a
//!   forbidden address or to us; once, no transaction, no retransmission;
//! - it copies only header lines of the request (plus our tag,
//!   `Retry-After` and `Content-Length`), and is not sent if it would be
//!   more than [`AMPLIFICATION_LIMIT`] times the datagram;
//! - it is counted like the full path's refusal (`requests_received`,
//!   `overload_queue_sheds`, a generated 503).
//!
//! What the scan does not check: the Request-URI, Max-Forwards,
//! Content-Length and the grammar of From/To beyond their tag. A request
//! malformed there gets the `503` (stateless, bounded, like the `400` it
//! would otherwise get) instead of a `400`. Anything the scan cannot
//! handle — a folded line among the copied ones or before any header, a
//! header line the full parser's line grammar refuses, a second
//! From/To/Call-ID/CSeq, a CSeq that is not `INVITE`, a To tag (found
//! where the full parser finds it: [`crate::peek`]), a top Via that does
//! not parse, a head that is not UTF-8 anywhere, more than [`MAX_COPIED`]
//! copied lines — takes the full path, which refuses it as before (or
//! answers `400`, or drops what it cannot read).
//!
//! The To-tag of a quick refusal is `rwo` and 16 hex digits of a keyed MAC
//! of the Call-ID ([`Proxy::refusal_tag`]): the ACK is recognised without
//! state, and the full path recognises it too (an ACK that arrives after
//! [`REFUSAL_ACK_WINDOW`], or one the scan cannot read). Forging the tag
//! gains nothing: an ACK carrying it is dropped, which is what a proxy may
//! do with any ACK it cannot route.

use super::outcome::{Action, DropReason, MsgLabel, Outcome};
use super::routing::upstream_address;
use super::stats::Counter;
use super::worker::{reply_hop, scratch_for, send, ProxyWorker, AMPLIFICATION_LIMIT};
use super::{Proxy, T1};
use crate::hash::{Purpose, Tag};
use crate::msg::HeaderKind;
use crate::msg::{Via, MAX_HEADERS, MAX_MESSAGE};
use crate::overload_control::OcAdvert;
use crate::peek::{header_kind, split_header, trim_lws};
use crate::relay::sendable;
use crate::text::{is_lws, CommaSplit};
use crate::transport::Hop;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::Ordering;

/// The status line of a quick refusal.
const STATUS_LINE: &[u8] = b"SIP/2.0 503 Service Unavailable\r\n";
/// What follows the copied lines.
const TAIL: &[u8] = b"Retry-After: 5\r\nContent-Length: 0\r\n\r\n";
/// Header lines a quick refusal copies at most (Via lines included); a
/// request with more takes the full path.
const MAX_COPIED: usize = 24;
/// How long after the last quick refusal ACKs are peeked at for its tag
/// (ns): a refused INVITE may be retransmitted for 64·T1 and each
/// retransmission draws a `503` and an ACK; a few seconds more for the
/// network. Outside it (and for an ACK the peek cannot read) the full path
/// still recognises the tag.
pub(super) const REFUSAL_ACK_WINDOW: u64 = 64 * T1 + 8_000_000_000;
/// The window is moved forward only when it would grow by more than this
/// (ns): one store per second, not one per refusal.
const REFUSAL_WINDOW_SLACK: u64 = 1_000_000_000;

impl Proxy {
    /// The To-tag of our quick refusals of calls with Call-ID `call_id`
    /// (`rwo` and 16 hex digits of a MAC under the refusal tags' key), so
    /// that the ACK is recognised without state and nobody else's tag is
    /// taken for ours.
    pub(super) fn refusal_tag(&self, call_id: &[u8]) -> Tag {
        self.keys.tag(Purpose::RefusalTag, call_id)
    }

    /// Whether `tag` (a To tag) is the one our quick refusals give
    /// responses of Call-ID `call_id`.
    pub(crate) fn is_refusal_tag(&self, tag: &[u8], call_id: &[u8]) -> bool {
        self.keys.is_tag(Purpose::RefusalTag, tag, call_id)
    }

    /// A quick refusal was sent at `now`: peek at ACKs for a while.
    fn note_refusal(&self, now: u64) {
        let until = now.saturating_add(REFUSAL_ACK_WINDOW);
        let current = self.refusal_acks_until.load(Ordering::Relaxed);
        if current.saturating_add(REFUSAL_WINDOW_SLACK) < until {
            self.refusal_acks_until.store(until, Ordering::Relaxed);
        }
    }

    /// Whether an ACK at `now` may acknowledge a quick refusal.
    pub(super) fn refusal_acks_expected(&self, now: u64) -> bool {
        now < self.refusal_acks_until.load(Ordering::Relaxed)
    }
}

impl ProxyWorker<'_> {
    /// Refuse `message` from `from` quickly if it is a new INVITE the scan
    /// can answer (see the module documentation); `None`: it is not, the
    /// full path handles it.
    pub(super) fn refuse_new_call(
        &mut self,
        now: u64,
        from: Hop,
        message: &[u8],
        out: &mut dyn FnMut(Hop, &[u8]),
    ) -> Option<Outcome> {
        let head = InviteHead::scan(message)?;
        let proxy = self.proxy();
        self.stripe.add(Counter::RequestsReceived);
        self.stripe.add(Counter::OverloadQueueSheds);
        let outcome = |action| {
            Some(Outcome {
                label: MsgLabel::Invite,
                action,
            })
        };
        let to = reply_hop(from, upstream_address(from, Some(&head.top_via)));
        if !sendable(&to.addr) || proxy.is_own_address(to.addr) {
            return outcome(self.drop_datagram(DropReason::ForbiddenDestination));
        }
        let tag = proxy.refusal_tag(head.call_id);
        let buf = scratch_for(&mut self.scratch, message.len());
        let oc = self.overload_control.as_ref().and_then(|advert| {
            let at = crate::overload_control::insert_offset(&head.top_via)?;
            Some((
                head.top_via.raw.as_ptr() as usize - message.as_ptr() as usize + at,
                advert,
            ))
        });
        head.write_refusal(message, tag.as_bytes(), to.addr, oc, buf);
        if buf.len() > AMPLIFICATION_LIMIT * message.len() {
            return outcome(self.drop_datagram(DropReason::ReplyTooLarge));
        }
        send(out, to, buf);
        self.stripe.response_generated(503);
        proxy.note_refusal(now);
        outcome(Action::Responded(503))
    }

    /// Absorb `message` if it is the ACK of one of our quick refusals
    /// (its To tag is [`Proxy::refusal_tag`] of its Call-ID); `None`: it
    /// is not (or the peek cannot tell), the full path handles it.
    pub(super) fn absorb_refusal_ack(&mut self, message: &[u8]) -> Option<Outcome> {
        let (tag, call_id) = ack_tag_and_call_id(message)?;
        if !self.proxy().is_refusal_tag(tag, call_id) {
            return None;
        }
        self.stripe.add(Counter::RequestsReceived);
        Some(Outcome {
            label: MsgLabel::Ack,
            action: Action::Absorbed,
        })
    }
}

/// What a quick refusal copies from a new INVITE, found by one scan.
struct InviteHead<'a> {
    /// The copied header lines (start, end of their trimmed content), in
    /// order, and whether each is the To line.
    copied: [(u32, u32, bool); MAX_COPIED],
    count: usize,
    top_via: Via<'a>,
    /// Where in the message the top Via's valueless `rport` ends: the
    /// source port and address go there (RFC 3581 4, as on the full path).
    rport_end: Option<usize>,
    call_id: &'a [u8],
}

/// The header kinds a response copies.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Copied {
    Via,
    From,
    To,
    CallId,
    CSeq,
}

/// The copied kind a header name (long or compact, any case) is, by the
/// full parser's classification.
fn copied_kind(name: &[u8]) -> Option<Copied> {
    match header_kind(name) {
        HeaderKind::Via => Some(Copied::Via),
        HeaderKind::From => Some(Copied::From),
        HeaderKind::To => Some(Copied::To),
        HeaderKind::CallId => Some(Copied::CallId),
        HeaderKind::CSeq => Some(Copied::CSeq),
        _ => None,
    }
}

/// The header lines of `message` after its start line, as (start, end of
/// content without CR, start of the next line); ends at the empty line
/// (then `Some(None)`), `None` when the head does not end.
fn next_line(message: &[u8], pos: usize) -> Option<Option<(usize, usize, usize)>> {
    let newline = pos + memchr::memchr(b'\n', message.get(pos..)?)?;
    let end = if newline > pos && message[newline - 1] == b'\r' {
        newline - 1
    } else {
        newline
    };
    Some((end > pos).then_some((pos, end, newline + 1)))
}

impl<'a> InviteHead<'a> {
    /// Scan a new INVITE (request line `INVITE … SIP/2.0`, no To tag, CSeq
    /// method INVITE, exactly one From/To/Call-ID/CSeq, a top Via that
    /// parses); `None` for anything else.
    fn scan(message: &'a [u8]) -> Option<InviteHead<'a>> {
        if message.len() > MAX_MESSAGE || !message.starts_with(b"INVITE ") {
            return None;
        }
        let first = memchr::memchr(b'\n', message)?;
        let request_line = message[..first]
            .strip_suffix(b"\r")
            .unwrap_or(&message[..first]);
        let version = request_line.get(request_line.len().checked_sub(8)?..)?;
        if !version.eq_ignore_ascii_case(b" SIP/2.0") {
            return None;
        }
        let mut copied = [(0u32, 0u32, false); MAX_COPIED];
        let mut count = 0;
        let mut top_via = None;
        let mut call_id = None;
        // From, To, CSeq seen.
        let mut seen = [false; 3];
        let mut last_copied = false;
        let mut lines = 0;
        let mut pos = first + 1;
        while let Some((start, end, next)) = next_line(message, pos)? {
            pos = next;
            lines += 1;
            if lines > MAX_HEADERS {
                return None;
            }
            let line = &message[start..end];
            if line[0] == b' ' || line[0] == b'\t' {
                // A folded line: the full path unfolds it (or, before any
                // header, refuses the message unanswered).
                if last_copied || lines == 1 {
                    return None;
                }
                continue;
            }
            let (name, value) = split_header(line)?;
            let Some(kind) = copied_kind(name) else {
                last_copied = false;
                continue;
            };
            let once = |slot: &mut bool| (!std::mem::replace(slot, true)).then_some(());
            match kind {
                Copied::Via if top_via.is_none() => {
                    let value = std::str::from_utf8(value).ok()?;
                    top_via = Some(Via::parse(CommaSplit::new(value).next()?)?);
                }
                Copied::Via => {}
                Copied::From => once(&mut seen[0])?,
                Copied::To if crate::peek::has_tag(value) => return None,
                Copied::To => once(&mut seen[1])?,
                Copied::CallId => {
                    if call_id.is_some()
                        || value.is_empty()
                        || value.iter().any(|b| b.is_ascii_whitespace())
                    {
                        return None;
                    }
                    call_id = Some(value);
                }
                Copied::CSeq => {
                    once(&mut seen[2])?;
                    if !is_invite_cseq(value) {
                        return None;
                    }
                }
            }
            let slot = copied.get_mut(count)?;
            let trimmed_end =
                start + line.len() - line.iter().rev().take_while(|&&b| is_lws(b)).count();
            *slot = (start as u32, trimmed_end as u32, kind == Copied::To);
            count += 1;
            last_copied = true;
        }
        // A head that is not UTF-8 anywhere, copied line or not, is
        // dropped unanswered by the full path: answer it there.
        if seen != [true; 3] || std::str::from_utf8(&message[..pos]).is_err() {
            return None;
        }
        let top_via = top_via?;
        let rport_end = match (top_via.rport_flag, top_via.rport) {
            (true, None) => crate::text::Params::new(top_via.params)
                .find(|(name, value)| name.eq_ignore_ascii_case("rport") && value.is_none())
                .map(|(name, _)| name.as_ptr() as usize - message.as_ptr() as usize + name.len()),
            _ => None,
        };
        Some(InviteHead {
            copied,
            count,
            top_via,
            rport_end,
            call_id: call_id?,
        })
    }

    /// The `503` to `source` into `out` (cleared first): status line, the
    /// copied lines in their order (the top Via's `rport` filled in with
    /// `received`, its `oc` with the advertisement `oc` at its offset in
    /// the message, To with our `tag`), `Retry-After`, `Content-Length`.
    fn write_refusal(
        &self,
        message: &[u8],
        tag: &[u8],
        source: SocketAddr,
        oc: Option<(usize, &OcAdvert)>,
        out: &mut Vec<u8>,
    ) {
        out.clear();
        out.extend_from_slice(STATUS_LINE);
        for &(start, end, is_to) in &self.copied[..self.count] {
            let (start, end) = (start as usize, end as usize);
            let within = |at: &usize| (start..=end).contains(at);
            let rport = self.rport_end.filter(within);
            let oc = oc.filter(|(at, _)| within(at));
            let mut from = start;
            // The insertions in the order of their offsets.
            let mut inserts = [
                rport.map(|at| (at, None)),
                oc.map(|(at, advert)| (at, Some(advert))),
            ];
            inserts.sort_by_key(|insert| insert.map(|(at, _)| at));
            for (at, advert) in inserts.into_iter().flatten() {
                out.extend_from_slice(&message[from..at]);
                match advert {
                    None => write_rport_received(out, source),
                    Some(advert) => advert.write_value(out),
                }
                from = at;
            }
            out.extend_from_slice(&message[from..end]);
            if is_to {
                out.extend_from_slice(b";tag=");
                out.extend_from_slice(tag);
            }
            out.extend_from_slice(b"\r\n");
        }
        out.extend_from_slice(TAIL);
    }
}

/// `=<port>;received=<ip>` of `source` (what RFC 3581 4 puts after a
/// valueless `rport`), written without the formatting machinery for IPv4.
fn write_rport_received(out: &mut Vec<u8>, source: SocketAddr) {
    out.push(b'=');
    crate::text::write_decimal(out, u64::from(source.port()));
    out.extend_from_slice(b";received=");
    match source.ip() {
        IpAddr::V4(ip) => {
            for (i, octet) in ip.octets().into_iter().enumerate() {
                if i > 0 {
                    out.push(b'.');
                }
                crate::text::write_decimal(out, u64::from(octet));
            }
        }
        IpAddr::V6(ip) => {
            let _ = std::io::Write::write_fmt(out, format_args!("{ip}"));
        }
    }
}

/// `<number> INVITE` (a 32-bit number, blanks, the method).
fn is_invite_cseq(value: &[u8]) -> bool {
    let digits = value.iter().take_while(|b| b.is_ascii_digit()).count();
    let rest = &value[digits..];
    (1..=10).contains(&digits)
        && std::str::from_utf8(&value[..digits])
            .ok()
            .and_then(|d| d.parse::<u32>().ok())
            .is_some()
        && rest.first().is_some_and(|&b| b == b' ' || b == b'\t')
        && trim_lws(rest) == b"INVITE"
}

/// The To tag and the Call-ID of an ACK, from a peek at its header lines
/// (the first To and Call-ID lines; `None` if either is missing or the
/// To has no tag).
fn ack_tag_and_call_id(message: &[u8]) -> Option<(&[u8], &[u8])> {
    if message.len() > MAX_MESSAGE || !message.starts_with(b"ACK ") {
        return None;
    }
    let mut pos = memchr::memchr(b'\n', message)? + 1;
    let mut to = None;
    let mut call_id = None;
    let mut lines = 0;
    while let Some((start, end, next)) = next_line(message, pos)? {
        pos = next;
        lines += 1;
        if lines > MAX_HEADERS {
            return None;
        }
        let Some((name, value)) = split_header(&message[start..end]) else {
            continue;
        };
        match copied_kind(name) {
            Some(Copied::To) if to.is_none() => to = Some(value),
            Some(Copied::CallId) if call_id.is_none() => call_id = Some(value),
            _ => continue,
        }
        if let (Some(to), Some(call_id)) = (to, call_id) {
            return Some((crate::peek::tag_of(to)?, call_id));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proxy::worker::fill_rport;
    use crate::proxy::{Mode, ProxyConfig};
    use crate::SipMsg;
    use std::net::SocketAddr;

    const INVITE: &str = "INVITE sip:bob@192.0.2.20 SIP/2.0\r\n\
Via: SIP/2.0/UDP 192.0.2.1:5070;branch=z9hG4bKq1;rport\r\n\
v: SIP/2.0/UDP 192.0.2.9;branch=z9hG4bKq0, SIP/2.0/UDP 192.0.2.8;branch=z9hG4bKqq\r\n\
Max-Forwards: 70\r\n\
From: \"A\" <sip:alice@example.com>;tag=a1\r\n\
To: <sip:bob@example.com>  \r\n\
Call-ID: q1@host\r\n\
CSeq: 7 INVITE\r\n\
Contact: <sip:alice@192.0.2.1:5070>\r\n\
Content-Length: 0\r\n\r\n";

    fn addr(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    fn proxy(mode: Mode) -> Proxy {
        Proxy::new(ProxyConfig {
            mode,
            local: addr("192.0.2.10:5060"),
            route_to: Some(addr("192.0.2.2:5060")),
            ..ProxyConfig::default()
        })
    }

    /// What `proxy` sends for `message` from `src` with shedding `on`.
    fn handle(
        proxy: &Proxy,
        src: &str,
        message: &[u8],
        shedding: bool,
    ) -> (Outcome, Vec<(SocketAddr, Vec<u8>)>) {
        let mut worker = proxy.worker();
        worker.set_shedding(shedding);
        let mut sent = Vec::new();
        let outcome = worker.handle(1_000, addr(src), message, &mut |to, bytes| {
            sent.push((to, bytes.to_vec()))
        });
        (outcome, sent)
    }

    /// The response with its To tag replaced by `TAG`.
    fn untagged(response: &[u8], tag: &str) -> String {
        String::from_utf8_lossy(response).replace(tag, "TAG")
    }

    #[test]
    fn the_quick_refusal_is_the_full_paths_but_for_its_tag() {
        for mode in [Mode::Stateless, Mode::Stateful] {
            let proxy = proxy(mode);
            let (outcome, sent) = handle(&proxy, "192.0.2.1:5070", INVITE.as_bytes(), true);
            assert_eq!(outcome.action, Action::Responded(503));
            assert_eq!(outcome.label, MsgLabel::Invite);
            assert_eq!(sent.len(), 1);
            // rport: the source port, received filled in.
            assert_eq!(sent[0].0, addr("192.0.2.1:5070"));
            let quick = &sent[0].1;
            let tag = proxy.refusal_tag(b"q1@host");
            let tag = tag.as_str();
            let response = SipMsg::parse(quick).unwrap();
            assert_eq!(response.to_tag(), Some(tag));
            // The full path's refusal of the same INVITE: identical but
            // for the tag.
            let slow = {
                let msg = SipMsg::parse(INVITE.as_bytes()).unwrap();
                let mut buf = Vec::new();
                proxy.build_local_response(
                    &msg,
                    503,
                    "Service Unavailable",
                    &[("Retry-After", "5")],
                    &mut buf,
                );
                fill_rport(&mut buf, &msg.top_via().unwrap(), addr("192.0.2.1:5070"));
                let local = proxy.local_to_tag("q1@host");
                untagged(&buf, local.as_str())
            };
            assert_eq!(untagged(quick, tag), slow);
            assert!(slow.contains("rport=5070;received=192.0.2.1"));
            let stats = proxy.stats();
            assert_eq!(stats.overload_queue_sheds, 1);
            assert_eq!(stats.requests_received, 1);
            assert_eq!(stats.transactions_created, 0);
        }
    }

    #[test]
    fn the_ack_of_a_quick_refusal_is_absorbed_on_both_paths() {
        for mode in [Mode::Stateless, Mode::Stateful] {
            let proxy = proxy(mode);
            let (_, sent) = handle(&proxy, "192.0.2.1:5070", INVITE.as_bytes(), true);
            let to_line = String::from_utf8_lossy(&sent[0].1)
                .lines()
                .find(|l| l.starts_with("To:"))
                .unwrap()
                .to_string();
            let ack = INVITE
                .replacen("INVITE sip", "ACK sip", 1)
                .replace("CSeq: 7 INVITE", "CSeq: 7 ACK")
                .replace("To: <sip:bob@example.com>  ", &to_line);
            assert!(ack_tag_and_call_id(ack.as_bytes()).is_some());
            let (outcome, sent) = handle(&proxy, "192.0.2.1:5070", ack.as_bytes(), false);
            assert_eq!(outcome.action, Action::Absorbed, "{mode:?}");
            assert!(sent.is_empty());
            // Folded To line: the peek cannot read it; the full path
            // recognises the tag.
            let folded = ack.replace(";tag=rwo", "\r\n ;tag=rwo");
            assert_eq!(
                ack_tag_and_call_id(folded.as_bytes()).map(|t| t.0.len()),
                None
            );
            let (outcome, sent) = handle(&proxy, "192.0.2.1:5070", folded.as_bytes(), false);
            assert_eq!(outcome.action, Action::Absorbed, "{mode:?} folded");
            assert!(sent.is_empty());
            // Another Call-ID: not ours, routed as any ACK (route_to).
            let other = ack.replace("Call-ID: q1@host", "Call-ID: q2@host");
            let (outcome, _) = handle(&proxy, "192.0.2.1:5070", other.as_bytes(), false);
            assert_ne!(outcome.action, Action::Absorbed);
        }
    }

    #[test]
    fn what_the_scan_cannot_answer_takes_the_full_path() {
        let proxy = proxy(Mode::Stateless);
        let cases = [
            // A To tag (in dialog).
            INVITE.replace(
                "To: <sip:bob@example.com>",
                "To: <sip:bob@example.com>;tag=x",
            ),
            // Two From lines.
            INVITE.replace("Max-Forwards: 70\r\n", "f: <sip:x@example.com>;tag=2\r\n"),
            // A folded From.
            INVITE.replace("From: \"A\"", "From:\r\n \"A\""),
            // CSeq of another method.
            INVITE.replace("CSeq: 7 INVITE", "CSeq: 7 OPTIONS"),
            // A top Via that does not parse.
            INVITE.replace("SIP/2.0/UDP 192.0.2.1:5070", "SIP/2.0/UDP 192.0.2.1:99999"),
            // A line without a colon.
            INVITE.replace("Max-Forwards: 70", "Max-Forwards 70"),
            // Another version.
            INVITE.replace(" SIP/2.0\r\nVia", " SIP/3.0\r\nVia"),
            // No Call-ID.
            INVITE.replace("Call-ID: q1@host\r\n", ""),
            // A form feed between a name and its colon (found by fuzzing:
            // the full parser refuses the line, so the copy must not
            // reach a response).
            INVITE.replace("To: <sip:bob", "To\x0c: <sip:bob"),
            // A name that is not a token.
            INVITE.replace("Max-Forwards: 70", "Max\"Forwards: 70"),
        ];
        for case in &cases {
            assert!(InviteHead::scan(case.as_bytes()).is_none(), "{case}");
        }
        // Not UTF-8.
        let mut bytes = INVITE.as_bytes().to_vec();
        let at = INVITE.find("alice").unwrap();
        bytes[at] = 0xFF;
        assert!(InviteHead::scan(&bytes).is_none());
        // The full path still refuses an INVITE it parses (with its own
        // tag), and answers 400 to one it does not.
        let (outcome, sent) = handle(&proxy, "192.0.2.1:5070", cases[2].as_bytes(), true);
        assert_eq!(outcome.action, Action::Responded(503));
        assert!(!String::from_utf8_lossy(&sent[0].1).contains("tag=rwo"));
        let (outcome, _) = handle(&proxy, "192.0.2.1:5070", cases[4].as_bytes(), true);
        assert_eq!(outcome.action, Action::Responded(400));
    }

    /// Issue 19: the scan reads what the full parser reads, so that a
    /// quick path never answers (or copies) what the full path would not.
    /// Each case was seen passing the scan before the fix (a tag after a
    /// quoted `>`: the scan looked for the header parameters after the
    /// last `>`; a byte that is not UTF-8 outside the copied lines; a
    /// folded line before any header).
    #[test]
    fn the_scan_answers_only_what_the_full_path_reads_alike() {
        for mode in [Mode::Stateless, Mode::Stateful] {
            let proxy = proxy(mode);
            // An in-dialog INVITE whose tag follows a quoted `>`: the full
            // parser reads the tag (the parameters follow the `>` closing
            // the URI), so it is not a new call, is not refused, and no
            // response carries a second tag.
            let tagged = INVITE.replace(
                "To: <sip:bob@example.com>  ",
                "To: <sip:bob@example.com>;tag=x;p=\">\"",
            );
            let msg = SipMsg::parse(tagged.as_bytes()).unwrap();
            assert_eq!(msg.to_tag(), Some("x"));
            assert!(!crate::peek::is_new_invite(tagged.as_bytes()));
            assert!(InviteHead::scan(tagged.as_bytes()).is_none());
            let (outcome, sent) = handle(&proxy, "192.0.2.1:5070", tagged.as_bytes(), true);
            assert_ne!(outcome.action, Action::Responded(503), "{mode:?}");
            assert!(sent
                .iter()
                .all(|(_, m)| !m.windows(7).any(|w| w == b"tag=rwo")));
            // A byte that is not UTF-8 in a line the refusal does not copy:
            // the full path drops the datagram unanswered, so must the scan.
            let mut subject = INVITE
                .replace("Max-Forwards: 70", "Subject: caf\u{e9}\r\nMax-Forwards: 70")
                .into_bytes();
            let at = subject.iter().position(|&b| b == 0xC3).unwrap();
            subject[at] = 0xFF;
            assert!(SipMsg::parse_loose(&subject).is_err());
            assert!(InviteHead::scan(&subject).is_none());
            let (outcome, sent) = handle(&proxy, "192.0.2.1:5070", &subject, true);
            assert!(sent.is_empty(), "{mode:?}: {outcome:?}");
            // A folded line before any header: the full parser refuses the
            // head (not even a 400), so no quick 503 either.
            let folded = INVITE.replace("SIP/2.0\r\nVia", "SIP/2.0\r\n x\r\nVia");
            assert!(SipMsg::parse_loose(folded.as_bytes()).is_err());
            assert!(InviteHead::scan(folded.as_bytes()).is_none());
            let (_, sent) = handle(&proxy, "192.0.2.1:5070", folded.as_bytes(), true);
            assert!(sent.is_empty(), "{mode:?}");
        }
        // The ACK peek finds the tag where the full parser does, past a
        // quoted parameter holding `;tag=` and `>`.
        let ack =
            "ACK sip:bob@192.0.2.20 SIP/2.0\r\nVia: SIP/2.0/UDP 192.0.2.1;branch=z9hG4bKa\r\n\
To: <sip:bob@example.com>;p=\"a>;tag=no\";tag=rwo1\r\nCall-ID: c\r\nFrom: <sip:a@x>;tag=1\r\n\
CSeq: 1 ACK\r\nMax-Forwards: 70\r\nContent-Length: 0\r\n\r\n";
        assert_eq!(
            SipMsg::parse(ack.as_bytes()).unwrap().to_tag(),
            Some("rwo1")
        );
        assert_eq!(
            ack_tag_and_call_id(ack.as_bytes()),
            Some((&b"rwo1"[..], &b"c"[..]))
        );
    }

    #[test]
    fn rport_and_received_are_written_as_the_full_path_writes_them() {
        for source in [
            "192.0.2.1:5070",
            "10.0.0.255:65535",
            "[2001:db8::7]:5",
            "0.0.0.1:0",
        ] {
            let source = addr(source);
            let mut quick = Vec::new();
            write_rport_received(&mut quick, source);
            assert_eq!(
                String::from_utf8(quick).unwrap(),
                format!("={};received={}", source.port(), source.ip())
            );
        }
        // IPv6 source over the whole path, as the full path fills it in.
        let proxy = proxy(Mode::Stateless);
        let invite = INVITE.replace("192.0.2.1:5070", "[2001:db8::1]:5070");
        let (outcome, sent) = handle(&proxy, "[2001:db8::1]:5070", invite.as_bytes(), true);
        assert_eq!(outcome.action, Action::Responded(503));
        assert!(String::from_utf8_lossy(&sent[0].1)
            .contains("branch=z9hG4bKq1;rport=5070;received=2001:db8::1\r\n"));
    }

    #[test]
    fn the_refusal_goes_to_the_source_never_to_a_claimed_address() {
        let proxy = proxy(Mode::Stateless);
        // No rport: the source IP with the sent-by port; `received`,
        // `maddr` and a claimed host are ignored.
        let claimed = INVITE.replace(
            "192.0.2.1:5070;branch=z9hG4bKq1;rport",
            "198.51.100.7:5099;branch=z9hG4bKq1;received=203.0.113.5;maddr=203.0.113.6",
        );
        let (outcome, sent) = handle(&proxy, "192.0.2.1:5070", claimed.as_bytes(), true);
        assert_eq!(outcome.action, Action::Responded(503));
        assert_eq!(sent[0].0, addr("192.0.2.1:5099"));
        // Towards our own address, or a forbidden one: dropped, counted.
        let (outcome, sent) = handle(&proxy, "192.0.2.10:5060", INVITE.as_bytes(), true);
        assert_eq!(
            outcome.action,
            Action::Dropped(DropReason::ForbiddenDestination)
        );
        assert!(sent.is_empty());
        let (outcome, _) = handle(&proxy, "0.0.0.0:5070", INVITE.as_bytes(), true);
        assert_eq!(
            outcome.action,
            Action::Dropped(DropReason::ForbiddenDestination)
        );
    }

    #[test]
    fn the_refusal_is_never_larger_than_the_amplification_limit() {
        let proxy = proxy(Mode::Stateless);
        // Many short Via lines: the response copies them all; under the
        // limit it is sent, and it is never larger than the request plus
        // our few lines.
        let (outcome, sent) = handle(&proxy, "192.0.2.1:5070", INVITE.as_bytes(), true);
        assert_eq!(outcome.action, Action::Responded(503));
        assert!(sent[0].1.len() <= INVITE.len() + STATUS_LINE.len() + TAIL.len() + 64);
        // A datagram over the copy limit takes the full path.
        let vias = "v: SIP/2.0/UDP h;branch=z9hG4bKv\r\n".repeat(MAX_COPIED);
        let many = INVITE.replace("Max-Forwards: 70\r\n", &vias);
        assert!(InviteHead::scan(many.as_bytes()).is_none());
    }

    /// What `proxy` sends for `message` from `src` with shedding `shedding`
    /// and the overload control advertisement `advert`.
    fn handle_oc(
        proxy: &Proxy,
        src: &str,
        message: &[u8],
        shedding: bool,
        advert: Option<OcAdvert>,
    ) -> (Outcome, Vec<(SocketAddr, Vec<u8>)>) {
        let mut worker = proxy.worker();
        worker.set_shedding(shedding);
        worker.set_overload_control(advert);
        let mut sent = Vec::new();
        let outcome = worker.handle(1_000, addr(src), message, &mut |to, bytes| {
            sent.push((to, bytes.to_vec()))
        });
        (outcome, sent)
    }

    /// The INVITE with RFC 7339's `oc` in its top Via.
    fn oc_invite() -> String {
        INVITE.replace("branch=z9hG4bKq1;rport", "branch=z9hG4bKq1;oc;rport")
    }

    const SEQ_NS: u64 = 1_700_000_000_123_456_789;

    #[test]
    fn a_refusal_carries_the_advertisement_exactly_when_the_via_asks_for_it() {
        for mode in [Mode::Stateless, Mode::Stateful] {
            let proxy = proxy(mode);
            let advert = OcAdvert::from_admitted_ppm(250_000, 500, SEQ_NS);
            let (outcome, sent) = handle_oc(
                &proxy,
                "192.0.2.1:5070",
                oc_invite().as_bytes(),
                true,
                Some(advert),
            );
            assert_eq!(outcome.action, Action::Responded(503));
            assert_eq!(sent.len(), 1);
            assert_eq!(sent[0].0, addr("192.0.2.1:5070"));
            let text = String::from_utf8_lossy(&sent[0].1).to_string();
            // In the top Via, after its `oc`; rport filled in as before;
            // the other Vias untouched.
            assert!(
                text.contains(
                    "Via: SIP/2.0/UDP 192.0.2.1:5070;branch=z9hG4bKq1;oc=75;oc-algo=\"loss\";\
                     oc-validity=500;oc-seq=1700000000.12345;rport=5070;received=192.0.2.1\r\n"
                ),
                "{text}"
            );
            assert_eq!(text.matches("oc=").count(), 1, "{text}");
            let response = SipMsg::parse(&sent[0].1).unwrap();
            let via = response.top_via().unwrap();
            let got = crate::overload_control::OcReceived::from_via_params(via.params).unwrap();
            assert_eq!((got.reduction, got.validity_ms), (75, 500));
            // The full path writes the same (a folded From takes it).
            let folded = oc_invite().replace("From: \"A\"", "From:\r\n \"A\"");
            let (outcome, slow) = handle_oc(
                &proxy,
                "192.0.2.1:5070",
                folded.as_bytes(),
                true,
                Some(advert),
            );
            assert_eq!(outcome.action, Action::Responded(503));
            assert!(String::from_utf8_lossy(&slow[0].1).contains(
                "branch=z9hG4bKq1;oc=75;oc-algo=\"loss\";oc-validity=500;oc-seq=1700000000.12345;rport=5070;"
            ));
            // The values follow the controller.
            let other = OcAdvert::from_admitted_ppm(900_000, 500, SEQ_NS + 1_000_000_000);
            let (_, sent) = handle_oc(
                &proxy,
                "192.0.2.1:5070",
                oc_invite().as_bytes(),
                true,
                Some(other),
            );
            assert!(String::from_utf8_lossy(&sent[0].1)
                .contains(";oc=10;oc-algo=\"loss\";oc-validity=500;oc-seq=1700000001.12345;"));
            // A Via without `oc`, or no advertisement: nothing added.
            for (message, advert) in [(INVITE.to_string(), Some(advert)), (oc_invite(), None)] {
                for shedding in [true, false] {
                    let (_, sent) = handle_oc(
                        &proxy,
                        "192.0.2.1:5070",
                        message.as_bytes(),
                        shedding,
                        advert,
                    );
                    for (_, bytes) in &sent {
                        assert!(
                            !String::from_utf8_lossy(bytes).contains("oc="),
                            "{}",
                            String::from_utf8_lossy(bytes)
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn the_advertisement_goes_only_into_our_own_responses_to_the_client() {
        let proxy = Proxy::new(ProxyConfig {
            mode: Mode::Stateful,
            local: addr("192.0.2.10:5060"),
            route_to: Some(addr("192.0.2.2:5060")),
            relay: crate::RelayNets::Any,
            ..ProxyConfig::default()
        });
        let advert = OcAdvert::from_admitted_ppm(500_000, 500, SEQ_NS);
        let mut worker = proxy.worker();
        worker.set_overload_control(Some(advert));
        let mut sent = Vec::new();
        let outcome = worker.handle(
            1_000,
            addr("192.0.2.1:5070"),
            oc_invite().as_bytes(),
            &mut |to, bytes| sent.push((to, bytes.to_vec())),
        );
        assert_eq!(outcome.action, Action::Forwarded { copies: 1 });
        // 100 Trying to the client: advertised. The INVITE downstream:
        // the client's valueless `oc` as it was, nothing added.
        let trying = sent
            .iter()
            .find(|(_, b)| b.starts_with(b"SIP/2.0 100"))
            .unwrap();
        assert_eq!(trying.0, addr("192.0.2.1:5070"));
        assert!(String::from_utf8_lossy(&trying.1).contains(";oc=50;oc-algo=\"loss\";"));
        let invite = sent.iter().find(|(_, b)| b.starts_with(b"INVITE")).unwrap();
        assert_eq!(invite.0, addr("192.0.2.20:5060"));
        let text = String::from_utf8_lossy(&invite.1);
        assert!(!text.contains("oc=") && !text.contains("oc-"), "{text}");
        assert!(text.contains("branch=z9hG4bKq1;oc;rport"), "{text}");
        // The callee's 180, relayed to the client: as the callee sent it.
        let forwarded = SipMsg::parse(&invite.1).unwrap();
        let vias: Vec<&str> = forwarded.raw_values(crate::HeaderKind::Via).collect();
        let ringing = format!(
            "SIP/2.0 180 Ringing\r\nVia: {}\r\nVia: {}\r\nv: SIP/2.0/UDP 192.0.2.9;branch=z9hG4bKq0, \
             SIP/2.0/UDP 192.0.2.8;branch=z9hG4bKqq\r\nFrom: \"A\" <sip:alice@example.com>;tag=a1\r\n\
             To: <sip:bob@example.com>;tag=b1\r\nCall-ID: q1@host\r\nCSeq: 7 INVITE\r\n\
             Content-Length: 0\r\n\r\n",
            vias[0], vias[1]
        );
        let mut relayed = Vec::new();
        worker.handle(
            2_000,
            addr("192.0.2.2:5060"),
            ringing.as_bytes(),
            &mut |to, bytes| relayed.push((to, bytes.to_vec())),
        );
        assert_eq!(relayed.len(), 1, "{ringing}");
        let text = String::from_utf8_lossy(&relayed[0].1);
        assert!(!text.contains("oc="), "{text}");
    }
}
