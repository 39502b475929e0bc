//! Responses: ours (top Via) or dropped; in stateful mode matched to their
//! client transaction by our branch, otherwise (and when nothing matches)
//! forwarded along the Via stack (RFC 3261 16.7, 16.11).

use super::branch::{try_of, Branch};
use super::cancel::build_hop_request;
use super::config::Mode;
use super::outcome::{Action, DropReason, MsgLabel, Outcome};
use super::stats::Counter;
use super::transaction::{lock, Class, ClientState, ServerState, Transaction, TransactionKey};
use super::worker::{scratch_for, send, ProxyWorker};
use crate::edit::forward_response;
use crate::msg::{Method, SipMsg};
use crate::relay::sendable;
use crate::transport::{Hop, Transport};

impl ProxyWorker<'_> {
    pub(super) fn on_response(
        &mut self,
        now: u64,
        msg: &SipMsg<'_>,
        out: &mut dyn FnMut(Hop, &[u8]),
    ) -> Outcome {
        self.stripe.add(Counter::ResponsesReceived);
        let status = msg.status().unwrap_or(0);
        let to_bye = status == 200 && msg.cseq().is_some_and(|c| c.1 == Method::Bye);
        let label = if to_bye {
            MsgLabel::ByeOk
        } else {
            MsgLabel::Response(status)
        };
        let action = self.route_response(now, msg, out);
        Outcome { label, action }
    }

    fn route_response(
        &mut self,
        now: u64,
        msg: &SipMsg<'_>,
        out: &mut dyn FnMut(Hop, &[u8]),
    ) -> Action {
        let proxy = self.proxy();
        let Some(top) = msg.top_via() else {
            return self.drop_datagram(DropReason::MalformedResponse);
        };
        if !proxy.is_our_via(&top) {
            return self.drop_datagram(DropReason::ResponseNotOurs);
        }
        let Some((keys, mac)) = top.branch.and_then(Branch::parse) else {
            return self.drop_datagram(DropReason::ResponseNotOurs);
        };
        let method = msg.cseq().map_or(Method::Other(""), |cseq| cseq.1);
        if method == Method::Ack {
            // Nobody answers an ACK (RFC 3261 17.1.3: a response matches
            // the client transaction of its CSeq method; an ACK has none).
            return self.drop_datagram(DropReason::MalformedResponse);
        }
        if proxy.config.mode == Mode::Stateful {
            let key = TransactionKey::new(keys.transaction, Class::of(method));
            let tries = top.branch.map_or(0, try_of);
            if let Some(action) = self.on_transaction_response(now, msg, key, tries, out) {
                return action;
            }
        }
        self.forward_along_vias(msg, keys.transaction, mac, out)
    }

    /// Forward a response to the next Via, statelessly, if that is where
    /// the request came from: the MAC in our branch (`mac`, over the
    /// transaction hash and the upstream address) must match the next
    /// Via's response address, so a forged response with our Via on top
    /// is not reflected to an address of the forger's choice.
    fn forward_along_vias(
        &mut self,
        msg: &SipMsg<'_>,
        transaction: u64,
        mac: u64,
        out: &mut dyn FnMut(Hop, &[u8]),
    ) -> Action {
        let Some((to, transport)) = msg.second_via().and_then(|next| {
            let transport = Transport::from_via_token(next.transport).unwrap_or_default();
            Some((next.response_target()?, transport))
        }) else {
            return self.drop_datagram(DropReason::UnroutableResponse);
        };
        if self.proxy().upstream_mac(transaction, to) != mac {
            return self.drop_datagram(DropReason::ResponseNotOurs);
        }
        if !sendable(&to) || self.proxy().is_own_address(to) {
            return self.drop_datagram(DropReason::ForbiddenDestination);
        }
        // Over a connection to that address if the driver has one (the
        // request's), else as the Via says.
        let hop = self.proxy().hop_over(transport, to);
        let buf = scratch_for(&mut self.scratch, msg.as_bytes().len());
        match forward_response(msg, buf) {
            Ok(_) => {
                send(out, hop, buf);
                self.stripe.add(Counter::ResponsesForwarded);
                Action::Forwarded { copies: 1 }
            }
            Err(_) => self.drop_datagram(DropReason::MalformedResponse),
        }
    }

    /// A response for the client transaction `key`; `None` if we hold none.
    fn on_transaction_response(
        &mut self,
        now: u64,
        msg: &SipMsg<'_>,
        key: TransactionKey,
        tries: u8,
        out: &mut dyn FnMut(Hop, &[u8]),
    ) -> Option<Action> {
        let code = msg.status().unwrap_or(0);
        let mut shard = lock(self.proxy().shard(key.hash));
        let transaction = shard.transactions.get_mut(&key)?;
        let mut cancel_due = false;
        let action = if !transaction.is_current_try(tries) {
            // From a target we moved on from: only a 2xx to an INVITE
            // still goes on, end to end; the rest is absorbed.
            if transaction.class == Class::Invite && (200..300).contains(&code) {
                self.forward_upstream(transaction.upstream, msg, out)
            } else {
                Action::Absorbed
            }
        } else if key.class == Class::Cancel {
            // Response to our CANCEL: hop-by-hop, never forwarded.
            if code >= 200 {
                transaction.cancel_answered(now);
            }
            Action::Absorbed
        } else if code < 200 {
            cancel_due = transaction.client_provisional(now, code);
            self.provisional_response(transaction, msg, code, out)
        } else if transaction.client == ClientState::Done {
            self.retransmitted_final_response(transaction, msg, code, out)
        } else {
            self.final_response(now, transaction, msg, code, out)
        };
        if let Action::Dropped(reason) = action {
            self.stripe.dropped(reason);
        }
        if cancel_due {
            self.cancel_downstream(&mut shard, now, key.hash, out);
        }
        shard.schedule(key);
        Some(action)
    }

    /// A provisional: relayed upstream unless it is a 100 (hop-by-hop,
    /// RFC 3261 16.7) or a final response already went upstream.
    fn provisional_response(
        &mut self,
        transaction: &mut Transaction,
        msg: &SipMsg<'_>,
        code: u16,
        out: &mut dyn FnMut(Hop, &[u8]),
    ) -> Action {
        if code == 100 || transaction.server != ServerState::Proceeding {
            // A 100 is consumed, not a retransmission.
            if code != 100 {
                self.stripe.add(Counter::RetransmissionsAbsorbed);
            }
            return Action::Absorbed;
        }
        self.relay_upstream(transaction, msg, out)
    }

    /// A final response again: a non-2xx to an INVITE is ACKed again, a
    /// 2xx to an INVITE goes on end to end, anything else is absorbed.
    fn retransmitted_final_response(
        &mut self,
        transaction: &Transaction,
        msg: &SipMsg<'_>,
        code: u16,
        out: &mut dyn FnMut(Hop, &[u8]),
    ) -> Action {
        match transaction.class {
            Class::Invite if code >= 300 => {
                self.ack_downstream(transaction, msg, out);
                self.stripe.add(Counter::RetransmissionsAbsorbed);
                Action::Absorbed
            }
            Class::Invite => self.forward_upstream(transaction.upstream, msg, out),
            _ => {
                self.stripe.add(Counter::RetransmissionsAbsorbed);
                Action::Absorbed
            }
        }
    }

    /// The first final response: the client side is done (a non-2xx to an
    /// INVITE is ACKed hop by hop); relayed upstream, completing (or, 2xx
    /// to an INVITE, accepting) the server side, unless one already went.
    fn final_response(
        &mut self,
        now: u64,
        transaction: &mut Transaction,
        msg: &SipMsg<'_>,
        code: u16,
        out: &mut dyn FnMut(Hop, &[u8]),
    ) -> Action {
        transaction.client_final();
        let invite = transaction.class == Class::Invite;
        if invite && code >= 300 {
            self.ack_downstream(transaction, msg, out);
        }
        if code == 430 {
            // RFC 5626 7: an edge proxy's flow is gone; its bindings go and
            // the next binding of the AOR gets the request.
            if let Some(to) = self.on_flow_failed(now, transaction) {
                send(out, to, &transaction.request);
                return Action::Absorbed;
            }
        }
        if code == 503 && transaction.can_fail_over() {
            // RFC 3263 4.3: the next target (after the ACK of this one).
            if let Some(to) = transaction.fail_over(now) {
                send(out, to, &transaction.request);
                self.stripe.add(Counter::Failovers);
                return Action::Absorbed;
            }
        }
        if transaction.server != ServerState::Proceeding {
            // Already answered upstream (408/487 after a timeout): only a
            // 2xx to an INVITE still goes on, end to end.
            return if invite && code < 300 {
                self.forward_upstream(transaction.upstream, msg, out)
            } else {
                Action::Absorbed
            };
        }
        let action = self.relay_upstream(transaction, msg, out);
        if invite && code < 300 {
            transaction.accept(now);
            if transaction.initial_invite && self.proxy().dialogs.confirmed(now, msg) {
                self.stripe.add(Counter::DialogsConfirmed);
            }
        } else {
            transaction.complete(now, code);
        }
        action
    }

    /// Send the response upstream, kept as the transaction's last response
    /// (drops are counted by the caller).
    fn relay_upstream(
        &self,
        transaction: &mut Transaction,
        msg: &SipMsg<'_>,
        out: &mut dyn FnMut(Hop, &[u8]),
    ) -> Action {
        let forwarded = forward_response(msg, &mut transaction.last_response);
        match (transaction.upstream, forwarded) {
            (Some(upstream), Ok(_)) if sendable(&upstream.addr) => {
                send(out, upstream, &transaction.last_response);
                self.stripe.add(Counter::ResponsesForwarded);
                Action::Forwarded { copies: 1 }
            }
            _ => Action::Dropped(DropReason::UnroutableResponse),
        }
    }

    /// Send the response upstream without keeping it (drops are counted by
    /// the caller).
    fn forward_upstream(
        &mut self,
        upstream: Option<Hop>,
        msg: &SipMsg<'_>,
        out: &mut dyn FnMut(Hop, &[u8]),
    ) -> Action {
        let Some(upstream) = upstream.filter(|hop| sendable(&hop.addr)) else {
            return Action::Dropped(DropReason::UnroutableResponse);
        };
        let buf = scratch_for(&mut self.scratch, msg.as_bytes().len());
        match forward_response(msg, buf) {
            Ok(_) => {
                send(out, upstream, buf);
                self.stripe.add(Counter::ResponsesForwarded);
                Action::Forwarded { copies: 1 }
            }
            Err(_) => Action::Dropped(DropReason::MalformedResponse),
        }
    }

    /// ACK a non-2xx final response hop by hop (RFC 3261 17.1.1.3).
    fn ack_downstream(
        &mut self,
        transaction: &Transaction,
        response: &SipMsg<'_>,
        out: &mut dyn FnMut(Hop, &[u8]),
    ) {
        let (Some(downstream), Ok(forwarded)) =
            (transaction.downstream, SipMsg::parse(&transaction.request))
        else {
            return;
        };
        let buf = scratch_for(&mut self.scratch, transaction.request.len());
        build_hop_request(&forwarded, "ACK", Some(response), buf);
        send(out, downstream, buf);
    }
}
