//! Transport errors (RFC 3261 16.9, 17.1.4, 18.4; RFC 3263 4.3): the
//! driver could not deliver a request we forwarded (a connection to its
//! target was refused or reset before it was established, a TLS handshake
//! failed, a connection could not be opened at all: one message reported;
//! or the kernel reported an ICMP unreachable for a UDP destination: every
//! transaction waiting there). The client transaction learns
//! it at once, not at timer B/F: it moves on to the next RFC 3263 target
//! as after a `503`, or, with no target left, the upstream gets
//! `500 Server Internal Error` (16.9: a transport error counts as a `503`
//! received; 16.7 step 6: a proxy whose only response is a `503` answers
//! `500`, so the upstream does not take this proxy for unavailable).

use super::branch::{try_of, Branch};
use super::config::Mode;
use super::stats::Counter;
use super::transaction::{lock, Class, ClientState, Transaction, TransactionKey};
use super::worker::{send, ProxyWorker};
use crate::msg::{Method, SipMsg};
use crate::transport::{Hop, Transport};

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
        let outcome = self.transport_failed(transaction, now, out);
        shard.schedule(key);
        outcome
    }

    /// The kernel reported that datagrams to the UDP destination `to`
    /// cannot be delivered (an ICMP port, host, network or protocol
    /// unreachable, or a parameter problem, read from the socket's error
    /// queue; RFC 3261 18.4: a transport error, 8.1.3.1). Every client
    /// transaction that sent its request to `to` and heard nothing back
    /// yet moves on to its next target at once, or gets `500` with none
    /// left, as [`ProxyWorker::on_transport_error`] does for one message.
    ///
    /// Only the address the kernel reports is used (never the quoted
    /// payload): nothing is sent anywhere but to a transaction's next
    /// configured or resolved target and to its upstream. A transaction
    /// that already had a response (provisional or final) is not touched
    /// (an ICMP error then says nothing about the request). A stateless
    /// proxy holds nothing to move: the report is only counted. The work
    /// is bounded by the transactions waiting at `to` (an index by
    /// destination per shard, no scan of the table). Returns how many
    /// transactions failed over and how many gave up.
    pub fn on_unreachable(
        &mut self,
        now: u64,
        to: Hop,
        out: &mut dyn FnMut(Hop, &[u8]),
    ) -> UnreachableOutcome {
        self.stripe.add(Counter::UnreachableReports);
        let mut outcome = UnreachableOutcome::default();
        let proxy = self.proxy();
        if proxy.config.mode != Mode::Stateful || to.transport != Transport::Udp {
            return outcome;
        }
        for shard in proxy.shards.iter() {
            let mut shard = lock(shard);
            for key in shard.take_waiting_at(to.addr) {
                let Some(transaction) = shard.transactions.get_mut(&key) else {
                    continue;
                };
                match self.transport_failed(transaction, now, out) {
                    TransportErrorOutcome::FailedOver => outcome.failed_over += 1,
                    TransportErrorOutcome::GaveUp => outcome.gave_up += 1,
                    TransportErrorOutcome::Ignored => {}
                }
                shard.schedule(key);
            }
        }
        outcome
    }

    /// The request of `transaction`, waiting at its current target, could
    /// not be delivered there: the next target, or `500` upstream.
    fn transport_failed(
        &mut self,
        transaction: &mut Transaction,
        now: u64,
        out: &mut dyn FnMut(Hop, &[u8]),
    ) -> TransportErrorOutcome {
        self.stripe.add(Counter::TransportErrors);
        let next = if transaction.can_fail_over() {
            transaction.fail_over(now)
        } else {
            None
        };
        match next {
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
        }
    }
}

/// What an unreachable report ([`ProxyWorker::on_unreachable`]) came to.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UnreachableOutcome {
    /// Transactions that moved on to their next target.
    pub failed_over: usize,
    /// Transactions with no target left: `500` upstream (or their end).
    pub gave_up: usize,
}
