//! Rate-limited warnings for the data path: a flood of bad input or a
//! failing socket must not become a flood of log lines (and the CPU and
//! disk they cost). [`warn_limited!`](crate::warn_limited) keeps one token
//! bucket per call site ([`LogLimiter`]): a burst of
//! [`LogLimiter::BURST`] lines, then [`LogLimiter::PER_SECOND`] a second.
//! Lines it drops are counted, per site (the next line it lets through
//! says how many were left out) and process-wide ([`suppressed_total`],
//! exported as `ringway_log_suppressed_total`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Instant;

static SUPPRESSED_TOTAL: AtomicU64 = AtomicU64::new(0);

/// Lines the limiters dropped since the process started.
pub fn suppressed_total() -> u64 {
    SUPPRESSED_TOTAL.load(Ordering::Relaxed)
}

/// One call site's token bucket.
#[derive(Debug)]
pub struct LogLimiter {
    state: Mutex<Bucket>,
}

#[derive(Debug)]
struct Bucket {
    tokens: f64,
    last: Option<Instant>,
    suppressed: u64,
}

impl LogLimiter {
    /// Lines let through at once.
    pub const BURST: f64 = 10.0;
    /// Lines a second after the burst.
    pub const PER_SECOND: f64 = 1.0;

    /// A full bucket.
    pub const fn new() -> LogLimiter {
        LogLimiter {
            state: Mutex::new(Bucket {
                tokens: Self::BURST,
                last: None,
                suppressed: 0,
            }),
        }
    }

    /// May a line go out at `now`? `Some(n)`: yes, and `n` lines were
    /// suppressed since the last one; `None`: no (counted).
    pub fn admit(&self, now: Instant) -> Option<u64> {
        let mut bucket = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(last) = bucket.last {
            let refill = now.saturating_duration_since(last).as_secs_f64() * Self::PER_SECOND;
            bucket.tokens = (bucket.tokens + refill).min(Self::BURST);
        }
        bucket.last = Some(now);
        if bucket.tokens >= 1.0 {
            bucket.tokens -= 1.0;
            Some(std::mem::take(&mut bucket.suppressed))
        } else {
            bucket.suppressed += 1;
            SUPPRESSED_TOTAL.fetch_add(1, Ordering::Relaxed);
            None
        }
    }
}

impl Default for LogLimiter {
    fn default() -> Self {
        LogLimiter::new()
    }
}

/// `log::warn!` through a token bucket of this call site's own
/// ([`LogLimiter`]); a line after suppressed ones says how many.
#[macro_export]
macro_rules! warn_limited {
    ($($arg:tt)+) => {{
        static LIMITER: $crate::log_limit::LogLimiter = $crate::log_limit::LogLimiter::new();
        if log::log_enabled!(log::Level::Warn) {
            match LIMITER.admit(std::time::Instant::now()) {
                Some(0) => log::warn!($($arg)+),
                Some(suppressed) => log::warn!(
                    "{} ({suppressed} similar line(s) suppressed)",
                    format_args!($($arg)+)
                ),
                None => {}
            }
        }
    }};
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn burst_then_rate_and_counts() {
        let limiter = LogLimiter::new();
        let t0 = Instant::now();
        let before = suppressed_total();
        let admitted = (0..100).filter(|_| limiter.admit(t0).is_some()).count();
        assert_eq!(admitted, LogLimiter::BURST as usize);
        assert!(suppressed_total() - before >= 90);
        // One second later: one more line, which reports the 90 left out.
        assert_eq!(limiter.admit(t0 + Duration::from_secs(1)), Some(90));
        assert_eq!(limiter.admit(t0 + Duration::from_secs(1)), None);
        // A long quiet spell refills the burst, no more.
        let later = t0 + Duration::from_secs(3600);
        let admitted = (0..100).filter(|_| limiter.admit(later).is_some()).count();
        assert_eq!(admitted, LogLimiter::BURST as usize);
    }

    #[test]
    fn the_macro_limits_its_call_site() {
        let before = suppressed_total();
        for i in 0..50 {
            crate::warn_limited!("test line {i}");
        }
        // The logger may be absent (no line written), the bucket is not.
        assert!(suppressed_total() - before >= 40 || !log::log_enabled!(log::Level::Warn));
    }
}
