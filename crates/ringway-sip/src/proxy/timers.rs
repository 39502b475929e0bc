//! RFC 3261 timers: the constants, each transaction's [`TimerTable`]
//! (deadlines as data, indexed by [`TransactionTimer`]), and the timer
//! driver (`ProxyWorker::on_timer`, `fire`, `Proxy::next_deadline`).

use super::stats::Counter;
use super::transaction::{lock, Class, ServerState, Shard, Transaction, TransactionKey};
use super::worker::{send, ProxyWorker};
use super::Proxy;
use crate::edit::{build_response, forward_response};
use crate::msg::SipMsg;
use crate::transport::Hop;
use std::cmp::Reverse;
use std::sync::atomic::Ordering;

/// RFC 3261 T1 (RTT estimate), ns.
pub const T1: u64 = 500_000_000;
/// RFC 3261 T2 (max non-INVITE retransmit interval), ns.
pub const T2: u64 = 4_000_000_000;
/// RFC 3261 T4 (max message lifetime), ns.
pub const T4: u64 = 5_000_000_000;
/// Timer B/F/H/J: 64*T1.
pub const TIMER_64T1: u64 = 64 * T1;
/// Timer C (proxy INVITE transaction after a provisional), ns.
pub const TIMER_C: u64 = 180_000_000_000;

/// The timers of one transaction (RFC 3261 17.1, 17.2 and 16.6 as a
/// proxy runs them).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum TransactionTimer {
    /// Resend the request downstream (A, E) or the final response
    /// upstream (G).
    Retransmit,
    /// Give up on the client side (B, F; C after an INVITE provisional).
    Timeout,
    /// Remove the transaction; until then it absorbs retransmissions
    /// (D, H, I, J, K).
    Expire,
}

impl TransactionTimer {
    /// Every timer, in slot order.
    pub(super) const VALUES: [TransactionTimer; 3] = [
        TransactionTimer::Retransmit,
        TransactionTimer::Timeout,
        TransactionTimer::Expire,
    ];
}

/// One deadline slot (ns, `None` = not running) per [`TransactionTimer`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct TimerTable {
    deadlines: [Option<u64>; TransactionTimer::VALUES.len()],
}

impl TimerTable {
    /// Run `timer` until `deadline` (replacing any earlier setting).
    pub(super) fn set(&mut self, timer: TransactionTimer, deadline: u64) {
        self.deadlines[timer as usize] = Some(deadline);
    }

    /// When `timer` fires, if it is running.
    pub(super) fn get(&self, timer: TransactionTimer) -> Option<u64> {
        self.deadlines[timer as usize]
    }

    /// Stop `timer`.
    pub(super) fn stop(&mut self, timer: TransactionTimer) {
        self.deadlines[timer as usize] = None;
    }

    /// Earliest deadline of the running timers.
    pub(super) fn next_deadline(&self) -> Option<u64> {
        self.deadlines.iter().flatten().min().copied()
    }

    /// Whether `timer` is running and due at `now`.
    pub(super) fn is_expired(&self, timer: TransactionTimer, now: u64) -> bool {
        self.deadlines[timer as usize].is_some_and(|deadline| deadline <= now)
    }
}

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
        let cancel_due = transaction.time_out();
        self.stripe.add(Counter::TransactionsTimedOut);
        if transaction.class == Class::Cancel || transaction.server != ServerState::Proceeding {
            transaction.end_after_timeout(now);
            return cancel_due;
        }
        let (code, reason) = if transaction.cancelled {
            (487, "Request Terminated")
        } else {
            (408, "Request Timeout")
        };
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
        // Our own 408/487 goes once: no timer-G series towards a source
        // nothing verified (a retransmitted INVITE gets it again).
        transaction.timers.stop(TransactionTimer::Retransmit);
        cancel_due
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

#[cfg(test)]
mod tests {
    use super::{TimerTable, TransactionTimer};

    #[test]
    fn timer_table_set_stop_next_and_expired() {
        let mut table = TimerTable::default();
        assert_eq!(table.next_deadline(), None);
        assert!(!table.is_expired(TransactionTimer::Retransmit, u64::MAX));

        table.set(TransactionTimer::Expire, 30);
        table.set(TransactionTimer::Timeout, 20);
        table.set(TransactionTimer::Retransmit, 10);
        assert_eq!(table.next_deadline(), Some(10));
        assert_eq!(table.get(TransactionTimer::Timeout), Some(20));
        assert!(!table.is_expired(TransactionTimer::Retransmit, 9));
        assert!(table.is_expired(TransactionTimer::Retransmit, 10));
        assert!(table.is_expired(TransactionTimer::Retransmit, 11));
        assert!(!table.is_expired(TransactionTimer::Timeout, 10));

        table.stop(TransactionTimer::Retransmit);
        assert_eq!(table.get(TransactionTimer::Retransmit), None);
        assert!(!table.is_expired(TransactionTimer::Retransmit, 11));
        assert_eq!(table.next_deadline(), Some(20));

        // Setting again replaces the deadline, earlier or later.
        table.set(TransactionTimer::Expire, 5);
        assert_eq!(table.next_deadline(), Some(5));
        table.set(TransactionTimer::Expire, 50);
        assert_eq!(table.next_deadline(), Some(20));

        table.stop(TransactionTimer::Timeout);
        table.stop(TransactionTimer::Expire);
        assert_eq!(table.next_deadline(), None);
        // A deadline at 0 is a real deadline (not "unset").
        table.set(TransactionTimer::Timeout, 0);
        assert_eq!(table.next_deadline(), Some(0));
        assert!(table.is_expired(TransactionTimer::Timeout, 0));
    }
}
