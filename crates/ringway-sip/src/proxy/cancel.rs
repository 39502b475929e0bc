//! CANCEL (RFC 3261 9.1, 9.2, 16.10): a CANCEL for an INVITE we hold is
//! answered 200 here and sent on hop by hop once the INVITE has had a
//! provisional; timer C sends our own. Also the builders of hop-by-hop
//! requests (CANCEL, ACK for a non-2xx) and of our 200 to a CANCEL.
//!
//! Matching: by transaction (the INVITE's branch, RFC 3261 17.2.3), else
//! the RFC 2543 way (9.2): Call-ID, From tag, To, CSeq number and
//! Request-URI equal to a pending INVITE's, *and* the CANCEL comes from the
//! address the INVITE came from. Kamailio matches such CANCELs too; UAs
//! that give a CANCEL a branch of its own then get their call cancelled
//! instead of the CANCEL forwarded statelessly to a UAS that may not match
//! it. The source check keeps a third party that learnt the dialog
//! identifiers (they are in every message) from cancelling calls it could
//! not cancel with a matching branch either. A CANCEL that matches
//! nothing is forwarded statelessly (16.10).

use super::outcome::Action;
use super::request_context::Request;
use super::stats::Counter;
use super::transaction::{lock, Class, ClientState, Shard, Transaction, TransactionKey};
use super::worker::{send, ProxyWorker};
use super::Proxy;
use crate::msg::{HeaderKind, SipMsg};
use crate::transport::Hop;
use std::collections::HashMap;
use std::io::Write as _;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::{Mutex, MutexGuard};

/// Shards of the [`CancelIndex`].
const INDEX_SHARDS: usize = 16;

/// A pending INVITE as the RFC 2543 CANCEL match finds it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct IndexedInvite {
    /// Its transaction hash.
    hash: u64,
    /// The address it came from.
    src: SocketAddr,
}

/// Pending INVITE transactions by RFC 2543 matching key
/// ([`Proxy::cancel_match_key`]). An entry lives as long as its INVITE
/// transaction, so the index is bounded by the transaction table. Lock
/// order: a transaction shard may be held while an index shard is taken,
/// never the other way round.
pub(super) struct CancelIndex {
    shards: Box<[Mutex<HashMap<u64, IndexedInvite>>]>,
}

impl CancelIndex {
    pub(super) fn new() -> CancelIndex {
        CancelIndex {
            shards: (0..INDEX_SHARDS)
                .map(|_| Mutex::new(HashMap::new()))
                .collect(),
        }
    }

    fn shard(&self, key: u64) -> MutexGuard<'_, HashMap<u64, IndexedInvite>> {
        let shard = &self.shards[(key >> 60) as usize % INDEX_SHARDS];
        shard.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Index the INVITE transaction `hash` received from `src`.
    pub(super) fn insert(&self, key: u64, hash: u64, src: SocketAddr) {
        self.shard(key).insert(key, IndexedInvite { hash, src });
    }

    /// Forget the INVITE transaction `hash` (a newer INVITE with the same
    /// key keeps its entry).
    pub(super) fn remove(&self, key: u64, hash: u64) {
        let mut shard = self.shard(key);
        if shard.get(&key).is_some_and(|invite| invite.hash == hash) {
            shard.remove(&key);
        }
    }

    /// The INVITE transaction a CANCEL with `key` from `src` cancels.
    fn find(&self, key: u64, src: SocketAddr) -> Option<u64> {
        self.shard(key)
            .get(&key)
            .filter(|invite| invite.src == src)
            .map(|invite| invite.hash)
    }

    /// Number of indexed INVITEs.
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.shards
            .iter()
            .map(|shard| shard.lock().map_or(0, |s| s.len()))
            .sum()
    }
}

impl ProxyWorker<'_> {
    /// A CANCEL with no CANCEL transaction of its own, `shard` the locked
    /// shard of its hash. If it cancels an INVITE we hold (same branch, or
    /// the RFC 2543 match), it is answered here; `None` if it cancels
    /// nothing we hold: it is then forwarded statelessly (16.10).
    pub(super) fn cancel_invite(
        &mut self,
        request: &Request<'_>,
        shard: MutexGuard<'_, Shard>,
        out: &mut dyn FnMut(Hop, &[u8]),
    ) -> Option<Action> {
        let hash = request.keys.transaction;
        let invite = shard
            .transactions
            .get(&TransactionKey::new(hash, Class::Invite));
        // The same branch from another source is not the INVITE's CANCEL.
        let same_branch = invite
            .is_some_and(|invite| invite.upstream.map(|hop| hop.addr) == Some(request.reply.addr));
        let foreign = invite.is_some() && !same_branch;
        drop(shard);
        if foreign {
            return Some(self.drop_datagram(super::outcome::DropReason::SourceMismatch));
        }
        let invite_hash = if same_branch {
            hash
        } else {
            let proxy = self.proxy();
            let key = proxy.cancel_match_key(request.msg);
            let invite_hash = proxy.cancel_index.find(key, request.src)?;
            self.stripe.add(Counter::CancelsMatched2543);
            invite_hash
        };
        Some(self.cancel_matched(request, invite_hash, out))
    }

    /// Answer a CANCEL for the INVITE transaction `invite_hash` with 200,
    /// mark the INVITE cancelled and send our CANCEL downstream now (after
    /// a provisional) or on the first provisional. The CANCEL's own
    /// transaction keeps the 200 for its retransmissions.
    fn cancel_matched(
        &mut self,
        request: &Request<'_>,
        invite_hash: u64,
        out: &mut dyn FnMut(Hop, &[u8]),
    ) -> Action {
        let proxy = self.proxy();
        let now = request.now;
        let own_hash = request.keys.transaction;
        let action = self.respond(request.msg, request.reply, 200, "OK", &[], out);
        let mut answered = Transaction::new_cancel(now, Some(request.reply));
        proxy.build_cancel_ok(request.msg, &mut answered.last_response);
        if own_hash != invite_hash {
            // Matched the RFC 2543 way: the server side lives under the
            // CANCEL's own branch, the client side (our CANCEL, the
            // INVITE's branch) is created when it is sent. It counts
            // against the table's bounds (review S8): when full, the 200
            // went out statelessly and a retransmission is answered again.
            if proxy.transaction_room() {
                self.insert_transaction(TransactionKey::new(own_hash, Class::Cancel), answered);
            }
            let mut shard = lock(proxy.shard(invite_hash));
            let cancel_now = mark_cancelled(&mut shard, invite_hash);
            if cancel_now
                && !shard
                    .transactions
                    .contains_key(&TransactionKey::new(invite_hash, Class::Cancel))
            {
                self.cancel_downstream(&mut shard, now, invite_hash, out);
            }
            return action;
        }
        let mut shard = lock(proxy.shard(invite_hash));
        if mark_cancelled(&mut shard, invite_hash) {
            let invite_key = TransactionKey::new(invite_hash, Class::Invite);
            if let Some(invite) = shard.transactions.get(&invite_key) {
                self.send_cancel(now, invite, &mut answered, out);
            }
        }
        let cancel_key = TransactionKey::new(invite_hash, Class::Cancel);
        if shard.insert(cancel_key, answered).is_none() {
            proxy.active_transactions.fetch_add(1, Ordering::Relaxed);
            self.stripe.add(Counter::TransactionsCreated);
        }
        shard.schedule(cancel_key);
        action
    }

    /// Send our CANCEL for the INVITE transaction `hash` downstream (timer
    /// C, or a provisional after the UAC's CANCEL), as the client side of
    /// the CANCEL transaction (created if the UAC sent none).
    pub(super) fn cancel_downstream(
        &self,
        shard: &mut Shard,
        now: u64,
        hash: u64,
        out: &mut dyn FnMut(Hop, &[u8]),
    ) {
        let cancel_key = TransactionKey::new(hash, Class::Cancel);
        let mut cancel = shard.remove(&cancel_key).unwrap_or_else(|| {
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
        shard.insert(cancel_key, cancel);
        shard.schedule(cancel_key);
    }

    /// Build the CANCEL for `invite` and send it downstream as the client
    /// side of `cancel` (nothing if the INVITE was never sent).
    fn send_cancel(
        &self,
        now: u64,
        invite: &Transaction,
        cancel: &mut Transaction,
        out: &mut dyn FnMut(Hop, &[u8]),
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

/// Mark the INVITE transaction `invite_hash` cancelled if its client side
/// is still pending; returns whether our CANCEL may go downstream now (a
/// provisional came). Before one, it waits (RFC 3261 9.1) and goes on the
/// first provisional.
fn mark_cancelled(shard: &mut Shard, invite_hash: u64) -> bool {
    let Some(invite) = shard
        .transactions
        .get_mut(&TransactionKey::new(invite_hash, Class::Invite))
    else {
        return false;
    };
    match invite.client {
        ClientState::Calling => {
            invite.cancelled = true;
            invite.cancel_pending = true;
            false
        }
        ClientState::Proceeding => {
            invite.cancelled = true;
            true
        }
        ClientState::None | ClientState::Done => false,
    }
}

impl Proxy {
    /// A transaction left the table: take an INVITE out of the CANCEL index.
    pub(super) fn forget_invite(&self, transaction: &Transaction, hash: u64) {
        if let Some(key) = transaction.cancel_match {
            self.cancel_index.remove(key, hash);
        }
    }

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

#[cfg(test)]
mod tests {
    use crate::proxy::{Mode, Proxy, ProxyConfig, TIMER_64T1};
    use std::net::SocketAddr;

    const INVITE: &[u8] = b"INVITE sip:bob@192.0.2.10 SIP/2.0\r\n\
Via: SIP/2.0/UDP 192.0.2.1:5060;branch=z9hG4bKix1\r\n\
From: <sip:alice@example.com>;tag=1\r\nTo: <sip:bob@example.com>\r\n\
Call-ID: ix1\r\nCSeq: 1 INVITE\r\nMax-Forwards: 70\r\nContent-Length: 0\r\n\r\n";

    /// The CANCEL index holds an entry exactly while its INVITE
    /// transaction exists, so it is bounded by the transaction table.
    #[test]
    fn index_entries_live_as_long_as_their_invite() {
        let proxy = Proxy::new(ProxyConfig {
            mode: Mode::Stateful,
            local: "192.0.2.10:5060".parse().unwrap(),
            route_to: Some("192.0.2.2:5060".parse().unwrap()),
            ..ProxyConfig::default()
        });
        let uac: SocketAddr = "192.0.2.1:5060".parse().unwrap();
        let mut worker = proxy.worker();
        worker.handle(0, uac, INVITE, &mut |_, _| {});
        assert_eq!(proxy.cancel_index.len(), 1);
        // A retransmission is absorbed: still one entry.
        worker.handle(1, uac, INVITE, &mut |_, _| {});
        assert_eq!(proxy.cancel_index.len(), 1);
        // Timer B answers 408, timer H ends the transaction.
        for step in 1..=4 {
            worker.on_timer(step * TIMER_64T1, &mut |_, _| {});
        }
        assert_eq!(proxy.stats().transactions_active, 0);
        assert_eq!(proxy.cancel_index.len(), 0);
    }
}
