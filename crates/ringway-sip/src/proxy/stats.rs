//! Striped counters and the [`ProxyStats`] snapshot.

#![allow(unused_imports)]
use super::*;

/// Counters snapshot.
#[derive(Clone, Debug, Default, Serialize)]
pub struct ProxyStats {
    /// Requests received (parsed).
    pub requests_received: u64,
    /// Responses received (parsed).
    pub responses_received: u64,
    /// Requests forwarded (including CANCEL/ACK we generated).
    pub requests_forwarded: u64,
    /// Responses forwarded upstream.
    pub responses_forwarded: u64,
    /// Transactions currently in the table.
    pub transactions_active: u64,
    /// Transactions created.
    pub transactions_created: u64,
    /// Transactions ended by timer B/F/C.
    pub transactions_timed_out: u64,
    /// Request/response retransmissions absorbed.
    pub retransmissions_absorbed: u64,
    /// Retransmissions we sent (timers A/E/G).
    pub retransmissions_sent: u64,
    /// Requests refused because the table was full (503 or drop).
    pub overload_sheds: u64,
    /// In-dialog requests forwarded statelessly because the table was full
    /// (calls already set up are completed, new ones are shed).
    pub overload_stateless: u64,
    /// Responses we generated, by code.
    pub responses_generated: BTreeMap<u16, u64>,
    /// Drops by reason.
    pub drops: BTreeMap<&'static str, u64>,
    /// Registrar bindings.
    pub bindings: u64,
}

#[derive(Clone, Copy)]
pub(super) enum C {
    ReqIn,
    RespIn,
    ReqFwd,
    RespFwd,
    TxCreated,
    TxTimedOut,
    RetransAbsorbed,
    RetransSent,
    Overload,
    OverloadStateless,
}
pub(super) const NC: usize = 10;
pub(super) const STRIPES: usize = 8;

#[repr(align(128))]
pub(super) struct Stripe {
    pub(super) c: [AtomicU64; NC],
    pub(super) codes: [AtomicU64; 600],
    pub(super) drops: [AtomicU64; DROP_REASONS.len()],
}

impl Stripe {
    pub(super) fn new() -> Self {
        Stripe {
            c: std::array::from_fn(|_| AtomicU64::new(0)),
            codes: std::array::from_fn(|_| AtomicU64::new(0)),
            drops: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }
}

pub(super) struct Counters {
    pub(super) stripes: Box<[Stripe]>,
}

thread_local! {
    pub(super) static STRIPE: usize = {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        NEXT.fetch_add(1, Ordering::Relaxed) % STRIPES
    };
    pub(super) static SCRATCH: RefCell<Vec<u8>> = RefCell::new(Vec::with_capacity(4096));
}

impl Counters {
    pub(super) fn new() -> Self {
        Counters {
            stripes: (0..STRIPES).map(|_| Stripe::new()).collect(),
        }
    }
    #[inline]
    pub(super) fn stripe(&self) -> &Stripe {
        &self.stripes[STRIPE.with(|s| *s)]
    }
    #[inline]
    pub(super) fn inc(&self, c: C) {
        self.stripe().c[c as usize].fetch_add(1, Ordering::Relaxed);
    }
    pub(super) fn code(&self, code: u16) {
        if (100..700).contains(&code) {
            self.stripe().codes[(code - 100) as usize].fetch_add(1, Ordering::Relaxed);
        }
    }
    pub(super) fn drop(&self, d: DropReason) {
        self.stripe().drops[d.index()].fetch_add(1, Ordering::Relaxed);
    }
    pub(super) fn sum(&self, c: C) -> u64 {
        self.stripes
            .iter()
            .map(|s| s.c[c as usize].load(Ordering::Relaxed))
            .sum()
    }
}

/// Take the thread-local scratch buffer (reentrancy-safe).
pub(super) fn with_scratch<R>(f: impl FnOnce(&mut Vec<u8>) -> R) -> R {
    let mut v = SCRATCH.with(|s| std::mem::take(&mut *s.borrow_mut()));
    let r = f(&mut v);
    SCRATCH.with(|s| *s.borrow_mut() = v);
    r
}

impl Proxy {
    /// Counter snapshot.
    pub fn stats(&self) -> ProxyStats {
        let c = &self.counters;
        let mut codes = BTreeMap::new();
        for i in 0..600 {
            let v: u64 = c
                .stripes
                .iter()
                .map(|s| s.codes[i].load(Ordering::Relaxed))
                .sum();
            if v > 0 {
                codes.insert(i as u16 + 100, v);
            }
        }
        let mut drops = BTreeMap::new();
        for (i, d) in DROP_REASONS.iter().enumerate() {
            let v: u64 = c
                .stripes
                .iter()
                .map(|s| s.drops[i].load(Ordering::Relaxed))
                .sum();
            if v > 0 {
                drops.insert(d.as_str(), v);
            }
        }
        ProxyStats {
            requests_received: c.sum(C::ReqIn),
            responses_received: c.sum(C::RespIn),
            requests_forwarded: c.sum(C::ReqFwd),
            responses_forwarded: c.sum(C::RespFwd),
            transactions_active: self.active.load(Ordering::Relaxed) as u64,
            transactions_created: c.sum(C::TxCreated),
            transactions_timed_out: c.sum(C::TxTimedOut),
            retransmissions_absorbed: c.sum(C::RetransAbsorbed),
            retransmissions_sent: c.sum(C::RetransSent),
            overload_sheds: c.sum(C::Overload),
            overload_stateless: c.sum(C::OverloadStateless),
            responses_generated: codes,
            drops,
            bindings: self.store.len() as u64,
        }
    }
}
