//! The RFC 3261 timer driver (`ProxyWorker::on_timer`, `fire`,
//! `Proxy::next_deadline`) over the transactions' [`TimerTable`](super::timer_table::TimerTable)s
//! (the table and the constants are the leaf [`super::timer_table`]).

use super::stats::Counter;
use super::timer_table::TransactionTimer;
use super::transaction::{
    lock, Class, ClientState, ServerState, Shard, Transaction, TransactionKey,
};
use super::worker::{send, ProxyWorker};
use super::Proxy;
use crate::edit::{build_response, forward_response};
use crate::msg::SipMsg;
use crate::transport::Hop;
use std::cmp::Reverse;
use std::sync::atomic::Ordering;

/// Registrar expiry sweeps run at most this often (ns).
const EXPIRY_SWEEP_INTERVAL: u64 = 1_000_000_000;

impl ProxyWorker<'_> {
    /// [`ProxyWorker::on_timer`]: the registrar sweep, then every due
    /// transaction, shard by shard.
    pub(super) fn run_due_timers(&mut self, now: u64, out: &mut dyn FnMut(Hop, &[u8])) -> usize {
        let proxy = self.proxy();
        let mut events = 0;
        let last_sweep = proxy.last_expiry_sweep.load(Ordering::Relaxed);
        if now >= last_sweep.saturating_add(EXPIRY_SWEEP_INTERVAL)
            && proxy
                .last_expiry_sweep
                .compare_exchange(last_sweep, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            if let Some(store) = proxy.store() {
                events += store.expire(now);
            }
        }
        for shard in proxy.shards.iter() {
            let mut shard = lock(shard);
            while let Some(&Reverse(entry)) = shard.timers.peek() {
                if entry.deadline > now {
                    break;
                }
                shard.timers.pop();
                if !shard.is_live(&entry) {
                    continue;
                }
                events += 1;
                self.fire(&mut shard, now, entry.key(), out);
            }
        }
        events
    }

    /// Run the due timers of the transaction `key`: retransmit, time out
    /// (answering 408/487 upstream, CANCEL downstream after timer C),
    /// remove once expired; otherwise queue its next deadline.
    fn fire(
        &self,
        shard: &mut Shard,
        now: u64,
        key: TransactionKey,
        out: &mut dyn FnMut(Hop, &[u8]),
    ) {
        let mut remove = false;
        let mut cancel_due = false;
        if let Some(transaction) = shard.transactions.get_mut(&key) {
            if transaction
                .timers
                .is_expired(TransactionTimer::Retransmit, now)
            {
                // Never over a reliable transport (RFC 3261 17.1.1.2,
                // 17.2.1): it retransmits itself.
                if let (Some(to), bytes) = transaction.retransmission() {
                    if !to.transport.is_reliable() {
                        send(out, to, bytes);
                        self.stripe.add(Counter::RetransmissionsSent);
                    }
                }
                transaction.back_off_retransmit(now);
            }
            if transaction
                .timers
                .is_expired(TransactionTimer::Timeout, now)
            {
                cancel_due = self.time_out(transaction, now, out);
            }
            remove = transaction.timers.is_expired(TransactionTimer::Expire, now);
        }
        if cancel_due {
            self.cancel_downstream(shard, now, key.hash, out);
        }
        if remove {
            if let Some(removed) = shard.remove(&key) {
                let proxy = self.proxy();
                proxy.forget_invite(&removed, key.hash);
                proxy.active_transactions.fetch_sub(1, Ordering::Relaxed);
            }
        } else {
            shard.schedule(key);
        }
    }

    /// Timer B/F/C fired: the client side gives up; a request not yet
    /// answered upstream gets 408 (487 if cancelled). Returns whether a
    /// CANCEL is due downstream (timer C).
    fn time_out(
        &self,
        transaction: &mut Transaction,
        now: u64,
        out: &mut dyn FnMut(Hop, &[u8]),
    ) -> bool {
        if transaction.client == ClientState::Calling && transaction.can_fail_over() {
            // Timer B/F with nothing heard: the next RFC 3263 target.
            if let Some(to) = transaction.fail_over(now) {
                send(out, to, &transaction.request);
                self.stripe.add(Counter::Failovers);
                return false;
            }
        }
        let cancel_due = transaction.time_out();
        self.stripe.add(Counter::TransactionsTimedOut);
        let answer = if transaction.cancelled {
            (487, "Request Terminated")
        } else {
            (408, "Request Timeout")
        };
        self.give_up(transaction, now, answer, out);
        cancel_due
    }

    /// The client side gave up (timer B/F/C, or a transport error with no
    /// target left): a request not answered upstream yet gets `code`
    /// (once: no timer-G series towards a source nothing verified);
    /// otherwise (and a CANCEL) the transaction just ends.
    pub(super) fn give_up(
        &self,
        transaction: &mut Transaction,
        now: u64,
        (code, reason): (u16, &str),
        out: &mut dyn FnMut(Hop, &[u8]),
    ) {
        if transaction.class == Class::Cancel || transaction.server != ServerState::Proceeding {
            transaction.end_after_timeout(now);
            return;
        }
        if let (Some(upstream), Ok(forwarded)) =
            (transaction.upstream, SipMsg::parse(&transaction.request))
        {
            let mut response = Vec::new();
            build_response_below_top_via(&forwarded, code, reason, &mut response);
            send(out, upstream, &response);
            self.stripe.response_generated(code);
            transaction.last_response = response;
        }
        transaction.complete_timed_out(now, code);
        // Our own 408/487/500 goes once: no timer-G series towards a
        // source nothing verified (a retransmitted INVITE gets it again).
        transaction.timers.stop(TransactionTimer::Retransmit);
    }
}

impl Proxy {
    /// Earliest pending timer (ns), if any: transaction timers and, while
    /// the registrar holds bindings, the next once-a-second expiry sweep.
    pub fn next_deadline(&self) -> Option<u64> {
        let mut best: Option<u64> = None;
        if self.config.registrar && self.bindings().is_some_and(|n| n > 0) {
            best = Some(
                self.last_expiry_sweep
                    .load(Ordering::Relaxed)
                    .saturating_add(EXPIRY_SWEEP_INTERVAL),
            );
        }
        for shard in self.shards.iter() {
            let mut shard = lock(shard);
            // Drop stale heap entries so the answer is exact.
            while let Some(&Reverse(entry)) = shard.timers.peek() {
                if shard.is_live(&entry) {
                    best = Some(best.map_or(entry.deadline, |b| b.min(entry.deadline)));
                    break;
                }
                shard.timers.pop();
            }
        }
        best
    }
}

/// A response to the original request, built from our forwarded copy by
/// leaving out our own (top) Via.
fn build_response_below_top_via(
    forwarded: &SipMsg<'_>,
    code: u16,
    reason: &str,
    out: &mut Vec<u8>,
) {
    let mut with_our_via = Vec::new();
    build_response(
        forwarded,
        code,
        reason,
        &[],
        Some("rw-timeout"),
        &mut with_our_via,
    );
    match SipMsg::parse(&with_our_via) {
        Ok(response) => {
            if forward_response(&response, out).is_err() {
                out.clear();
            }
        }
        Err(_) => out.clear(),
    }
}
