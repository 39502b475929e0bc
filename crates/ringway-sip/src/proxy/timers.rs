//! RFC 3261 timers: the constants, each transaction's [`TimerTable`]
//! (deadlines as data, indexed by [`TransactionTimer`]), and the proxy's
//! timer driver (`on_timer`, `fire`, `next_deadline`).

#![allow(unused_imports)]
use super::*;

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

impl Proxy {
    // ---------------------------------------------------------------- timers

    /// Run due timers: retransmissions (A/E/G), timeouts with 408 or 487
    /// upstream (B/F/C, CANCEL downstream on C), cleanup (D/H/I/J/K) and
    /// registrar expiry (once per second). Returns the number of timer
    /// events processed. Call it at (or after) [`Self::next_deadline`].
    pub fn on_timer(&self, now: u64, out: &mut dyn FnMut(SocketAddr, &[u8])) -> usize {
        let mut n = 0;
        let last = self.last_expire.load(Ordering::Relaxed);
        if now >= last.saturating_add(1_000_000_000)
            && self
                .last_expire
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            n += self.store.expire(now);
        }
        for shard in self.shards.iter() {
            let mut shard = lock(shard);
            while let Some(&Reverse(entry)) = shard.timers.peek() {
                if entry.deadline > now {
                    break;
                }
                shard.timers.pop();
                if !shard.is_live(&entry) {
                    continue;
                }
                n += 1;
                self.fire(&mut shard, now, entry.key(), out);
            }
        }
        n
    }

    /// Run the due timers of the transaction `key`: retransmit, time out
    /// (answering 408/487 upstream, CANCEL downstream after timer C),
    /// remove once expired; otherwise queue its next deadline.
    pub(super) fn fire(
        &self,
        shard: &mut Shard,
        now: u64,
        key: TransactionKey,
        out: &mut dyn FnMut(SocketAddr, &[u8]),
    ) {
        let mut remove = false;
        let mut cancel_due = false;
        if let Some(transaction) = shard.transactions.get_mut(&key) {
            if transaction
                .timers
                .is_expired(TransactionTimer::Retransmit, now)
            {
                if let (Some(to), bytes) = transaction.retransmission() {
                    send(out, to, bytes);
                    self.counters.inc(C::RetransSent);
                }
                transaction.back_off_retransmit(now);
            }
            if transaction
                .timers
                .is_expired(TransactionTimer::Timeout, now)
            {
                cancel_due = transaction.time_out();
                self.counters.inc(C::TxTimedOut);
                if transaction.class != Class::Cancel
                    && transaction.server == ServerState::Proceeding
                {
                    let (code, reason) = if transaction.cancelled {
                        (487, "Request Terminated")
                    } else {
                        (408, "Request Timeout")
                    };
                    if let (Some(up), Ok(req)) =
                        (transaction.upstream, SipMsg::parse(&transaction.request))
                    {
                        let mut response = Vec::new();
                        build_response_below_top_via(&req, code, reason, &mut response);
                        send(out, up, &response);
                        self.counters.code(code);
                        transaction.last_response = response;
                    }
                    transaction.complete_timed_out(now, code);
                } else {
                    transaction.end_after_timeout(now);
                }
            }
            remove = transaction.timers.is_expired(TransactionTimer::Expire, now);
        }
        if cancel_due {
            self.spawn_cancel(shard, now, key.hash, None, out);
        }
        if remove {
            if shard.transactions.remove(&key).is_some() {
                self.active.fetch_sub(1, Ordering::Relaxed);
            }
        } else {
            shard.schedule(key);
        }
    }

    /// Earliest pending timer (ns), if any: transaction timers and, while
    /// the registrar holds bindings, the next once-a-second expiry sweep.
    pub fn next_deadline(&self) -> Option<u64> {
        let mut best: Option<u64> = None;
        if self.cfg.registrar && !self.store.is_empty() {
            best = Some(
                self.last_expire
                    .load(Ordering::Relaxed)
                    .saturating_add(1_000_000_000),
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
