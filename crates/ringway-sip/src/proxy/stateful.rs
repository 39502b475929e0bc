//! Transaction-stateful requests: a request that matches a transaction
//! (retransmission, ACK) is absorbed or answered from it; a new request
//! forwarded statefully creates one. A request matching a transaction is
//! only taken as its retransmission (or its ACK, CANCEL) when it comes from
//! where the transaction's request came from: a copy sent from elsewhere
//! is dropped (`source_mismatch`), never answered, so the stored response
//! cannot be reflected to the original source by third parties.

use super::flow_retry::FlowRetry;
use super::outcome::{Action, DropReason};
use super::request_context::Request;
use super::stats::Counter;
use super::transaction::{lock, Class, Failover, ServerState, Transaction, TransactionKey};
use super::worker::AMPLIFICATION_LIMIT;
use super::worker::{send, ProxyWorker};
use crate::edit::{build_response, forward_request, RequestEdits};
use crate::msg::Method;
use crate::transport::Hop;
use std::sync::atomic::Ordering;

/// Scratch room beyond the received request for the copy we forward.
const FORWARDED_HEADROOM: usize = 256;
/// Room for the responses a transaction keeps.
const RESPONSE_CAPACITY: usize = 512;

impl ProxyWorker<'_> {
    /// A request that belongs to a transaction we hold (or a CANCEL for an
    /// INVITE we hold); `None` to handle it as a new request.
    pub(super) fn on_transaction_request(
        &mut self,
        request: &Request<'_>,
        out: &mut dyn FnMut(Hop, &[u8]),
    ) -> Option<Action> {
        let proxy = self.proxy();
        let hash = request.keys.transaction;
        let key = TransactionKey::new(hash, Class::of(request.method));
        let mut shard = lock(proxy.shard(hash));
        let Some(transaction) = shard.transactions.get_mut(&key) else {
            return match request.method {
                Method::Cancel => self.cancel_invite(request, shard, out),
                _ => None,
            };
        };
        if transaction
            .upstream
            .is_some_and(|upstream| upstream.addr != request.reply.addr)
        {
            drop(shard);
            return Some(self.drop_datagram(DropReason::SourceMismatch));
        }
        if request.method == Method::Cancel && transaction.last_response.is_empty() {
            // Our own CANCEL (timer C) is in flight; still answer the
            // UAC's CANCEL with 200 and absorb its retransmissions.
            proxy.build_cancel_ok(request.msg, &mut transaction.last_response);
            transaction.upstream = Some(request.reply);
            send(out, request.reply, &transaction.last_response);
            self.stripe.response_generated(200);
            return Some(Action::Responded(200));
        }
        if request.method == Method::Ack {
            return match transaction.server {
                ServerState::Completed => {
                    transaction.confirm(request.now);
                    shard.schedule(key);
                    Some(Action::Absorbed)
                }
                ServerState::Confirmed => {
                    self.stripe.add(Counter::RetransmissionsAbsorbed);
                    Some(Action::Absorbed)
                }
                // End-to-end ACK (2543-style match): forward.
                _ => None,
            };
        }
        // A retransmitted request: resend our last response, if any, once,
        // to where the request came from, unless it is many times the
        // request's size (a downstream's answer, however large, is not
        // re-sent at will towards a claimed source).
        if !transaction.last_response.is_empty() {
            let too_large = transaction.last_response.len()
                > AMPLIFICATION_LIMIT * request.msg.as_bytes().len();
            if too_large {
                drop(shard);
                return Some(self.drop_datagram(DropReason::ReplyTooLarge));
            }
            if let Some(upstream) = transaction.upstream {
                send(out, upstream, &transaction.last_response);
            }
        }
        self.stripe.add(Counter::RetransmissionsAbsorbed);
        Some(Action::Absorbed)
    }

    /// Forward a new request with `edits` and keep a transaction for it
    /// (100 Trying upstream first for an INVITE). `alternates`: the next
    /// RFC 3263 targets; `flows`: the AOR's other bindings after a `430`.
    pub(super) fn forward_stateful(
        &mut self,
        request: &Request<'_>,
        (to, alternates, flows): (Hop, &[Hop], Option<FlowRetry>),
        edits: &RequestEdits<'_>,
        out: &mut dyn FnMut(Hop, &[u8]),
    ) -> Action {
        let msg = request.msg;
        let class = Class::of(request.method);
        let mut transaction = Transaction::new(class, Some(request.reply));
        transaction.initial_invite = request.method == Method::Invite && msg.to_tag().is_none();
        if !alternates.is_empty() || flows.is_some() {
            transaction.failover = Some(Box::new(Failover {
                alternates: alternates.to_vec(),
                tries: 0,
                flows,
            }));
        }
        // One right-sized allocation each instead of repeated growth.
        transaction.request = Vec::with_capacity(msg.as_bytes().len() + FORWARDED_HEADROOM);
        transaction.last_response = Vec::with_capacity(RESPONSE_CAPACITY);
        if let Err(error) = forward_request(msg, edits, &mut transaction.request) {
            return self.edit_failed(error);
        }
        if class == Class::Invite {
            build_response(
                msg,
                100,
                "Trying",
                &[],
                None,
                &mut transaction.last_response,
            );
            if let (Some(oc), Some(via)) = (self.overload_control.as_ref(), msg.top_via()) {
                // RFC 7339: the advertisement, if the client asked for it.
                super::worker::fill_via(&mut transaction.last_response, &via, None, Some(oc));
            }
            send(out, request.reply, &transaction.last_response);
            self.stripe.response_generated(100);
        }
        transaction.start_client(request.now, to);
        send(out, to, &transaction.request);
        self.stripe.add(Counter::RequestsForwarded);
        if request.method == Method::Bye && self.proxy().dialogs.ended(msg) {
            // The dialog's end (a drain waits for them).
            self.stripe.add(Counter::DialogsEnded);
        }
        let hash = request.keys.transaction;
        let cancel_match = (class == Class::Invite).then(|| self.proxy().cancel_match_key(msg));
        transaction.cancel_match = cancel_match;
        self.insert_transaction(TransactionKey::new(hash, class), transaction);
        if let Some(key) = cancel_match {
            // Indexed once it is in the table: a CANCEL that comes before
            // is forwarded statelessly, never matched to nothing.
            self.proxy().cancel_index.insert(key, hash, request.src);
        }
        Action::Forwarded { copies: 1 }
    }

    /// Put `transaction` in its table (counting it if new) and queue its timers.
    pub(super) fn insert_transaction(&self, key: TransactionKey, transaction: Transaction) {
        let proxy = self.proxy();
        let mut shard = lock(proxy.shard(key.hash));
        match shard.insert(key, transaction) {
            None => {
                proxy.active_transactions.fetch_add(1, Ordering::Relaxed);
                self.stripe.add(Counter::TransactionsCreated);
            }
            Some(replaced) => proxy.forget_invite(&replaced, key.hash),
        }
        shard.schedule(key);
    }
}
