//! CANCEL (RFC 3261 9.1, 16.10): a CANCEL for an INVITE we hold is answered
//! 200 here and sent on hop by hop once the INVITE has had a provisional;
//! timer C sends our own. Also the builders of hop-by-hop requests (CANCEL,
//! ACK for a non-2xx) and of our 200 to a CANCEL.

use super::outcome::Action;
use super::stats::Counter;
use super::transaction::{lock, Class, ClientState, Shard, Transaction, TransactionKey};
use super::worker::{send, ProxyWorker, Request};
use super::Proxy;
use crate::msg::{HeaderKind, SipMsg};
use std::io::Write as _;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::MutexGuard;

impl ProxyWorker<'_> {
    /// A CANCEL with no CANCEL transaction yet, `shard` its locked shard.
    /// If it cancels an INVITE we hold: answer 200, mark the INVITE
    /// cancelled, and send our CANCEL downstream now (after a provisional)
    /// or on the first provisional. `None` if there is no such INVITE: the
    /// CANCEL is then forwarded statelessly (16.10).
    pub(super) fn cancel_invite(
        &mut self,
        request: &Request<'_>,
        shard: MutexGuard<'_, Shard>,
        out: &mut dyn FnMut(SocketAddr, &[u8]),
    ) -> Option<Action> {
        let proxy = self.proxy();
        let (now, hash) = (request.now, request.keys.transaction);
        // Same branch, so same hash as the INVITE it cancels.
        let invite_key = TransactionKey::new(hash, Class::Invite);
        let invite_client = shard.transactions.get(&invite_key)?.client;
        let invite_pending = matches!(
            invite_client,
            ClientState::Calling | ClientState::Proceeding
        );
        let invite_calling = invite_client == ClientState::Calling;
        drop(shard);
        let action = self.respond(request.msg, request.upstream, 200, "OK", &[], out);
        let mut cancel = Transaction::new_cancel(now, Some(request.upstream));
        proxy.build_cancel_ok(request.msg, &mut cancel.last_response);
        let mut shard = lock(proxy.shard(hash));
        if invite_pending {
            if let Some(invite) = shard.transactions.get_mut(&invite_key) {
                invite.cancelled = true;
                if invite_calling {
                    // No CANCEL before a provisional (RFC 3261 9.1): it waits.
                    invite.cancel_pending = true;
                }
            }
            if !invite_calling {
                if let Some(invite) = shard.transactions.get(&invite_key) {
                    self.send_cancel(now, invite, &mut cancel, out);
                }
            }
        }
        let cancel_key = TransactionKey::new(hash, Class::Cancel);
        if shard.transactions.insert(cancel_key, cancel).is_none() {
            proxy.active_transactions.fetch_add(1, Ordering::Relaxed);
            self.stripe.add(Counter::TransactionsCreated);
        }
        shard.schedule(cancel_key);
        Some(action)
    }

    /// Send our CANCEL for the INVITE transaction `hash` downstream (timer
    /// C, or a provisional after the UAC's CANCEL), as the client side of
    /// the CANCEL transaction (created if the UAC sent none).
    pub(super) fn cancel_downstream(
        &self,
        shard: &mut Shard,
        now: u64,
        hash: u64,
        out: &mut dyn FnMut(SocketAddr, &[u8]),
    ) {
        let cancel_key = TransactionKey::new(hash, Class::Cancel);
        let mut cancel = shard.transactions.remove(&cancel_key).unwrap_or_else(|| {
            self.proxy()
                .active_transactions
                .fetch_add(1, Ordering::Relaxed);
            self.stripe.add(Counter::TransactionsCreated);
            Transaction::new_cancel(now, None)
        });
        if let Some(invite) = shard
            .transactions
            .get(&TransactionKey::new(hash, Class::Invite))
        {
            self.send_cancel(now, invite, &mut cancel, out);
        }
        shard.transactions.insert(cancel_key, cancel);
        shard.schedule(cancel_key);
    }

    /// Build the CANCEL for `invite` and send it downstream as the client
    /// side of `cancel` (nothing if the INVITE was never sent).
    fn send_cancel(
        &self,
        now: u64,
        invite: &Transaction,
        cancel: &mut Transaction,
        out: &mut dyn FnMut(SocketAddr, &[u8]),
    ) {
        let (Some(downstream), Ok(forwarded)) = (invite.downstream, SipMsg::parse(&invite.request))
        else {
            return;
        };
        build_hop_request(&forwarded, "CANCEL", None, &mut cancel.request);
        cancel.start_client(now, downstream);
        send(out, downstream, &cancel.request);
        self.stripe.add(Counter::RequestsForwarded);
    }
}

impl Proxy {
    /// Build our `200 OK` to a CANCEL into `out`.
    pub(super) fn build_cancel_ok(&self, cancel: &SipMsg<'_>, out: &mut Vec<u8>) {
        self.build_local_response(cancel, 200, "OK", &[], out);
    }
}

/// Build a hop-by-hop CANCEL or ACK from the request we forwarded (RFC 3261
/// 9.1 / 17.1.1.3): same Request-URI, top Via, Route, Call-ID, From, CSeq
/// number; To from `response` for ACK.
pub(super) fn build_hop_request(
    forwarded: &SipMsg<'_>,
    method: &str,
    response: Option<&SipMsg<'_>>,
    out: &mut Vec<u8>,
) {
    out.clear();
    let head = forwarded.head();
    out.extend_from_slice(method.as_bytes());
    out.push(b' ');
    out.extend_from_slice(forwarded.request_uri().unwrap_or("").as_bytes());
    out.extend_from_slice(b" SIP/2.0\r\n");
    if let Some(via) = forwarded.top_via() {
        out.extend_from_slice(b"Via: ");
        out.extend_from_slice(via.raw.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    for header in forwarded.header_positions() {
        let line = &head[header.line_start as usize..header.value_end as usize];
        match header.kind {
            HeaderKind::Route | HeaderKind::From | HeaderKind::CallId => {
                out.extend_from_slice(line.as_bytes());
                out.extend_from_slice(b"\r\n");
            }
            HeaderKind::To => {
                let to_line = response
                    .and_then(|r| {
                        r.header_positions()
                            .iter()
                            .find(|x| x.kind == HeaderKind::To)
                            .map(|x| &r.head()[x.line_start as usize..x.value_end as usize])
                    })
                    .unwrap_or(line);
                out.extend_from_slice(to_line.as_bytes());
                out.extend_from_slice(b"\r\n");
            }
            _ => {}
        }
    }
    let _ = write!(
        out,
        "CSeq: {} {method}\r\nMax-Forwards: 70\r\nContent-Length: 0\r\n\r\n",
        forwarded.cseq().map_or(0, |c| c.0)
    );
}
