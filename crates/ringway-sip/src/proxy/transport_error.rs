//! Transport errors (RFC 3261 16.9, 17.1.4; RFC 3263 4.3): the driver
//! could not deliver a request we forwarded (a connection to its target
//! was refused or reset before it was established, a TLS handshake failed,
//! a connection could not be opened at all). The client transaction learns
//! it at once, not at timer B/F: it moves on to the next RFC 3263 target
//! as after a `503`, or, with no target left, the upstream gets
//! `500 Server Internal Error` (16.9: a transport error counts as a `503`
//! received; 16.7 step 6: a proxy whose only response is a `503` answers
//! `500`, so the upstream does not take this proxy for unavailable).

use super::branch::{try_of, Branch};
use super::config::Mode;
use super::stats::Counter;
use super::transaction::{lock, Class, ClientState, TransactionKey};
use super::worker::{send, ProxyWorker};
use crate::msg::{Method, SipMsg};
use crate::transport::Hop;

/// What a reported transport error came to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TransportErrorOutcome {
    /// The request went to the next target.
    FailedOver,
    /// No target was left: the upstream got `500` (or the transaction
    /// ended, when something already went upstream).
    GaveUp,
    /// Not a request of a client transaction still waiting on that hop
    /// (stateless mode, a response, an ACK, a target moved on from, a
    /// transaction that heard back or is gone): nothing changed.
    Ignored,
}

impl ProxyWorker<'_> {
    /// The driver could not deliver `message`, which the core had sent to
    /// `to` (the same bytes and hop it got from `out`). Messages to send go
    /// to `out`, as from [`ProxyWorker::handle_from`].
    pub fn on_transport_error(
        &mut self,
        now: u64,
        to: Hop,
        message: &[u8],
        out: &mut dyn FnMut(Hop, &[u8]),
    ) -> TransportErrorOutcome {
        let proxy = self.proxy();
        if proxy.config.mode != Mode::Stateful {
            return TransportErrorOutcome::Ignored;
        }
        let Ok(msg) = SipMsg::parse(message) else {
            return TransportErrorOutcome::Ignored;
        };
        let method = match msg.method() {
            Some(Method::Ack | Method::Cancel) | None => return TransportErrorOutcome::Ignored,
            Some(method) => method,
        };
        let Some(top) = msg.top_via().filter(|via| proxy.is_our_via(via)) else {
            return TransportErrorOutcome::Ignored;
        };
        let Some(branch) = top.branch else {
            return TransportErrorOutcome::Ignored;
        };
        let Some((keys, _)) = Branch::parse(branch) else {
            return TransportErrorOutcome::Ignored;
        };
        let key = TransactionKey::new(keys.transaction, Class::of(method));
        let mut shard = lock(proxy.shard(key.hash));
        let Some(transaction) = shard.transactions.get_mut(&key) else {
            return TransportErrorOutcome::Ignored;
        };
        let waiting_there = transaction.client == ClientState::Calling
            && transaction.is_current_try(try_of(branch))
            && transaction
                .downstream
                .is_some_and(|hop| hop.addr == to.addr && hop.transport == to.transport);
        if !waiting_there {
            return TransportErrorOutcome::Ignored;
        }
        self.stripe.add(Counter::TransportErrors);
        let next = if transaction.can_fail_over() {
            transaction.fail_over(now)
        } else {
            None
        };
        let outcome = match next {
            Some(next) => {
                send(out, next, &transaction.request);
                self.stripe.add(Counter::Failovers);
                TransportErrorOutcome::FailedOver
            }
            None => {
                transaction.time_out();
                let answer = if transaction.cancelled {
                    (487, "Request Terminated")
                } else {
                    (500, "Server Internal Error - Next Hop Unreachable")
                };
                self.give_up(transaction, now, answer, out);
                TransportErrorOutcome::GaveUp
            }
        };
        shard.schedule(key);
        outcome
    }
}
