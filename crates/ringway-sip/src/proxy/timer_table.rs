//! RFC 3261 timer constants and each transaction's [`TimerTable`]
//! (deadlines as data, indexed by [`TransactionTimer`]). A leaf: it
//! imports nothing of the proxy; the transactions hold a table and the
//! driver (`super::timers`) reads it.

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
