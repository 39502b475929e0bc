//! The generator's timers: retransmissions, transaction timeouts and the
//! BYE after the hold time.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};

/// What a timer does when it fires.
#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum TimerKind {
    /// UAC: retransmit the INVITE (Timer A).
    InviteRetransmit,
    /// UAC: give up on the INVITE (Timer B).
    InviteTimeout,
    /// UAC: the hold time is over, send the BYE.
    ByeStart,
    /// UAC: retransmit the BYE (Timer E).
    ByeRetransmit,
    /// UAC: give up on the BYE (Timer F).
    ByeTimeout,
    /// UAS: retransmit the 200 until the ACK comes.
    OkRetransmit,
    /// UAS: give up waiting for the ACK.
    AckTimeout,
}

/// One pending timer: at time `at`, `kind` for call `key`.
#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Timer {
    /// Deadline (ns).
    pub at: u64,
    /// Call number (UAC) or UAS call id.
    pub key: u64,
    /// What to do.
    pub kind: TimerKind,
}

/// The constant delays of first-time timers (one FIFO each).
#[derive(Copy, Clone, Debug)]
pub(crate) enum Delay {
    /// T1 (first retransmissions).
    T1,
    /// 64·T1 (transaction timeouts).
    SixtyFourT1,
    /// The hold time (BYE start).
    Hold,
}

/// Timers: most have a constant delay from "now" (T1, 64·T1, hold), so
/// for each delay insertion order is deadline order and a FIFO suffices
/// (O(1), and the many long timeouts never bloat a heap). Back-off
/// retransmissions (2·T1, 4·T1, ...) go to a small heap.
#[derive(Default)]
pub(crate) struct Timers {
    fifos: [VecDeque<Timer>; 3],
    heap: BinaryHeap<Reverse<Timer>>,
}

impl Timers {
    /// Add a timer of constant delay `d` (its deadline must not be before
    /// the last one added with `d`).
    pub(crate) fn push_fifo(&mut self, d: Delay, t: Timer) {
        self.fifos[d as usize].push_back(t);
    }

    /// Add a timer with any deadline.
    pub(crate) fn push(&mut self, t: Timer) {
        self.heap.push(Reverse(t));
    }

    /// The earliest deadline.
    pub(crate) fn next_at(&self) -> Option<u64> {
        let front = self
            .fifos
            .iter()
            .filter_map(|q| q.front().map(|t| t.at))
            .min();
        let heap_next = self.heap.peek().map(|Reverse(t)| t.at);
        match (front, heap_next) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Remove and return the earliest timer due at `now`.
    pub(crate) fn pop_due(&mut self, now: u64) -> Option<Timer> {
        let mut best: Option<(usize, u64)> = None;
        for (i, q) in self.fifos.iter().enumerate() {
            if let Some(timer) = q.front() {
                if timer.at <= now && best.is_none_or(|(_, at)| timer.at < at) {
                    best = Some((i, timer.at));
                }
            }
        }
        if let Some(Reverse(timer)) = self.heap.peek() {
            if timer.at <= now && best.is_none_or(|(_, at)| timer.at < at) {
                return self.heap.pop().map(|Reverse(timer)| timer);
            }
        }
        best.and_then(|(i, _)| self.fifos[i].pop_front())
    }
}
