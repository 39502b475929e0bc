//! RFC 3261 timers: constants, `on_timer`, `fire`, `next_deadline`.

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
            let mut sh = lock(shard);
            while let Some(&Reverse((d, h, class, gen))) = sh.timers.peek() {
                if d > now {
                    break;
                }
                sh.timers.pop();
                let key = (h, class);
                let live = sh.txs.get(&key).is_some_and(|t| t.gen == gen);
                if !live {
                    continue;
                }
                n += 1;
                self.fire(&mut sh, now, key, out);
            }
        }
        n
    }

    pub(super) fn fire(
        &self,
        sh: &mut Shard,
        now: u64,
        key: Key,
        out: &mut dyn FnMut(SocketAddr, &[u8]),
    ) {
        let mut remove = false;
        let mut cancel = false;
        if let Some(tx) = sh.txs.get_mut(&key) {
            if tx.retrans != Retrans::None && tx.retrans_at <= now {
                let (to, bytes) = match tx.retrans {
                    Retrans::Downstream => (tx.downstream, &tx.request),
                    _ => (tx.upstream, &tx.last_resp),
                };
                if let Some(to) = to {
                    send(out, to, bytes);
                    self.counters.inc(C::RetransSent);
                }
                let cap = if tx.class == Class::Invite && tx.retrans == Retrans::Downstream {
                    u64::MAX
                } else {
                    T2
                };
                tx.retrans_iv = (tx.retrans_iv * 2).min(cap);
                tx.retrans_at = now + tx.retrans_iv;
            }
            if tx.timeout_at != 0 && tx.timeout_at <= now {
                tx.timeout_at = 0;
                tx.retrans = Retrans::None;
                self.counters.inc(C::TxTimedOut);
                if tx.class == Class::Invite && tx.client == ClientState::Proceeding {
                    cancel = true;
                }
                tx.client = ClientState::Done;
                if tx.class != Class::Cancel && tx.server == ServerState::Proceeding {
                    let (code, reason) = if tx.cancelled {
                        (487, "Request Terminated")
                    } else {
                        (408, "Request Timeout")
                    };
                    if let (Some(up), Ok(req)) = (tx.upstream, SipMsg::parse(&tx.request)) {
                        let mut resp = Vec::new();
                        build_response_below_top_via(&req, code, reason, &mut resp);
                        send(out, up, &resp);
                        self.counters.code(code);
                        tx.last_resp = resp;
                    }
                    tx.server = ServerState::Completed;
                    if tx.class == Class::Invite {
                        tx.retrans = Retrans::Upstream;
                        tx.retrans_iv = T1;
                        tx.retrans_at = now + T1;
                        tx.expire_at = now + TIMER_64T1;
                    } else {
                        tx.expire_at = now + T4;
                    }
                } else if tx.expire_at == 0 || tx.class == Class::Cancel {
                    tx.expire_at = now;
                }
            }
            if tx.expire_at != 0 && tx.expire_at <= now {
                remove = true;
            }
        }
        if cancel {
            self.spawn_cancel(sh, now, key.0, None, out);
        }
        if remove {
            if sh.txs.remove(&key).is_some() {
                self.active.fetch_sub(1, Ordering::Relaxed);
            }
        } else {
            sh.schedule(key);
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
            let mut sh = lock(shard);
            // Drop stale heap entries so the answer is exact.
            while let Some(&Reverse((d, h, class, gen))) = sh.timers.peek() {
                if sh.txs.get(&(h, class)).is_some_and(|t| t.gen == gen) {
                    best = Some(best.map_or(d, |b| b.min(d)));
                    break;
                }
                sh.timers.pop();
            }
        }
        best
    }
}
