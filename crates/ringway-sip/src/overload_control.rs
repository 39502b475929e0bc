//! RFC 7339 SIP overload control, loss-based algorithm (`oc-algo="loss"`,
//! RFC 7339 §5, §6), both sides, sans-IO.
//!
//! - Server side ([`OcController`], [`OcAdvert`]): a client that supports
//!   overload control puts a valueless `oc` parameter in its Via. In the
//!   responses the proxy generates to such a request (the quick `503`
//!   refusal, the full path's local responses, the stateful `100 Trying`)
//!   the copy of that Via gets `oc=<percentage of new requests to reduce>`,
//!   `oc-algo="loss"`, `oc-validity=<ms>` and `oc-seq=<seconds>.<fraction>`.
//!   The reduction comes from [`OcController`]: the share of the offered
//!   new calls above the capacity the workers measured ([`OcPool`]: one
//!   estimate and one advertisement per set of workers sharing a queue). The
//!   parameters go only into a response to the sender of the request,
//!   which that response goes to anyway: no new destination, a few bytes
//!   more (the amplification bound still holds), nothing in a forwarded
//!   message changes.
//! - Client side ([`OcReceived::from_via_params`]): the parameters of the
//!   top Via of a response; the load generator refuses that percentage of
//!   its new calls locally for the validity period (the latest `oc-seq`
//!   wins).
//!
//! What is not supported: a Via whose client lists algorithms itself
//! (`oc-algo` in the request) or that already carries `oc` with a value or
//! any other `oc-` parameter gets nothing added (the proxy still sheds it
//! like a client without overload control).

mod controller;
mod pool;
mod resends;

use crate::msg::Via;
pub use controller::{NewCallCounts, OcController};
pub use pool::{OcControllerConfig, OcPool, PeriodRecord, TRACE_PERIODS};

/// How long an advertised reduction holds (ms) unless renewed, for a
/// client that gets none (RFC 7339's default is the same 500 ms).
pub const DEFAULT_VALIDITY_MS: u32 = 500;
/// The validity the proxy advertises (ms): 20 of [`OcController`]'s
/// periods. Every response to a conforming client renews it, so it only
/// matters for a client that goes quiet; long enough that a sender whose
/// new calls are mostly throttled keeps its reduction between the few
/// responses it gets (at 500 ms the throttles lapsed between them and the
/// full load came back in bursts), short enough that a client that hears
/// nothing more stops throttling soon after an overload ends (the proxy's
/// responses say `oc=0` before that).
pub const ADVERTISED_VALIDITY_MS: u32 = 2_000;
/// The longest validity a client accepts (ms): a bogus huge value cannot
/// silence it for long.
pub const MAX_VALIDITY_MS: u32 = 60_000;
/// The longest text [`OcAdvert::write_value`] writes.
pub const MAX_ADVERT_LEN: usize = 64;

/// What the proxy advertises to a client supporting overload control.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OcAdvert {
    /// Percentage of new requests the client is to refuse (0–100).
    reduction: u8,
    /// How long the reduction holds (ms).
    validity_ms: u32,
    /// `oc-seq`: whole seconds and the fraction (in 10 µs units) of the
    /// time it was computed at.
    seq_secs: u64,
    seq_frac: u32,
}

impl OcAdvert {
    /// The advertisement of an admission controller admitting `admitted_ppm`
    /// millionths of the new calls, at `now_ns` (any clock that does not run
    /// backwards; a realtime one keeps `oc-seq` ordered across restarts).
    /// The reduction is rounded down: a controller admitting 1/64 asks for
    /// 98 %, one admitting everything for 0 %.
    pub fn from_admitted_ppm(admitted_ppm: u32, validity_ms: u32, now_ns: u64) -> OcAdvert {
        let refused = 1_000_000u32.saturating_sub(admitted_ppm.min(1_000_000));
        OcAdvert {
            reduction: (refused / 10_000) as u8,
            validity_ms: validity_ms.min(MAX_VALIDITY_MS),
            seq_secs: now_ns / 1_000_000_000,
            seq_frac: ((now_ns % 1_000_000_000) / 10_000) as u32,
        }
    }

    /// The advertised reduction (percent).
    pub fn reduction(&self) -> u8 {
        self.reduction
    }

    /// `=<reduction>;oc-algo="loss";oc-validity=<ms>;oc-seq=<s>.<f>`: what
    /// follows the valueless `oc` of the client's Via.
    pub fn write_value(&self, out: &mut Vec<u8>) {
        out.push(b'=');
        crate::text::write_decimal(out, u64::from(self.reduction));
        out.extend_from_slice(b";oc-algo=\"loss\";oc-validity=");
        crate::text::write_decimal(out, u64::from(self.validity_ms));
        out.extend_from_slice(b";oc-seq=");
        // At most 12 digits of seconds (RFC 7339's grammar).
        crate::text::write_decimal(out, self.seq_secs % 1_000_000_000_000);
        out.push(b'.');
        crate::text::write_decimal(out, u64::from(self.seq_frac));
    }
}

/// Where in `via.raw` the advertisement goes (the end of its valueless
/// `oc`), if the Via asks for overload control and leaves the algorithm
/// to us; `None` otherwise (see the module documentation).
pub fn insert_offset(via: &Via<'_>) -> Option<usize> {
    let mut at = None;
    for (name, value) in crate::text::Params::new(via.params) {
        if name.eq_ignore_ascii_case("oc") {
            if value.is_some() || at.is_some() {
                return None;
            }
            at = Some(name.as_ptr() as usize + name.len());
        } else if name.len() > 3 && name.as_bytes()[..3].eq_ignore_ascii_case(b"oc-") {
            return None;
        }
    }
    let end = at? - via.raw.as_ptr() as usize;
    (end <= via.raw.len()).then_some(end)
}

/// An advertisement a client received (the top Via of a response).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OcReceived {
    /// Percentage of new requests to refuse (0–100).
    pub reduction: u8,
    /// For how long (ms; at most [`MAX_VALIDITY_MS`]; 0: stop now).
    pub validity_ms: u32,
    /// `oc-seq` (seconds, fraction): a later one replaces an earlier one.
    pub seq: (u64, u64),
}

impl OcReceived {
    /// The loss-based advertisement in Via parameters `params` (`None`:
    /// none, another algorithm, or a value out of its grammar).
    pub fn from_via_params(params: &str) -> Option<OcReceived> {
        let mut reduction = None;
        let mut validity = None;
        let mut seq = None;
        let mut algo_loss = true;
        for (name, value) in crate::text::Params::new(params) {
            let named = |s: &str| name.eq_ignore_ascii_case(s);
            if named("oc") && reduction.is_none() {
                let v = parse_decimal(value?, 3)?;
                reduction = Some(u8::try_from(v).ok().filter(|&v| v <= 100)?);
            } else if named("oc-validity") && validity.is_none() {
                validity = Some(parse_decimal(value?, 10)?.min(u64::from(MAX_VALIDITY_MS)) as u32);
            } else if named("oc-seq") && seq.is_none() {
                let (secs, frac) = value?.split_once('.')?;
                seq = Some((parse_decimal(secs, 12)?, parse_decimal(frac, 5)?));
            } else if named("oc-algo") {
                let v = value?;
                let v = v
                    .strip_prefix('"')
                    .and_then(|v| v.strip_suffix('"'))
                    .unwrap_or(v);
                algo_loss = v.eq_ignore_ascii_case("loss");
            }
        }
        if !algo_loss {
            return None;
        }
        Some(OcReceived {
            reduction: reduction?,
            validity_ms: validity.unwrap_or(DEFAULT_VALIDITY_MS),
            seq: seq.unwrap_or((0, 0)),
        })
    }
}

/// 1 to `max_digits` ASCII digits.
fn parse_decimal(text: &str, max_digits: usize) -> Option<u64> {
    if text.is_empty() || text.len() > max_digits || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse().ok()
}

/// A client's throttle (RFC 7339 §5.3, loss algorithm): the latest
/// advertisement (by `oc-seq`) and a credit accumulator that refuses
/// exactly the advertised share of new requests, evenly spread.
#[derive(Clone, Debug, Default)]
pub struct LossThrottle {
    /// Reduction in force (percent) and until when (ns; the caller's clock).
    reduction: u8,
    until: u64,
    /// The `oc-seq` of the advertisement in force.
    seq: (u64, u64),
    /// Credit in hundredths of a request.
    credit: u32,
}

impl LossThrottle {
    /// Take `advert`, received at `now` (ns), unless an advertisement with
    /// a later `oc-seq` is in force.
    pub fn receive(&mut self, now: u64, advert: OcReceived) {
        if advert.seq < self.seq && now < self.until {
            return;
        }
        self.seq = advert.seq;
        self.reduction = advert.reduction;
        self.until = now.saturating_add(u64::from(advert.validity_ms) * 1_000_000);
    }

    /// The reduction in force at `now` (percent).
    pub fn reduction(&self, now: u64) -> u8 {
        if now < self.until {
            self.reduction
        } else {
            0
        }
    }

    /// Whether a new request at `now` may be sent (`false`: refuse it
    /// locally).
    pub fn admit(&mut self, now: u64) -> bool {
        let reduction = self.reduction(now);
        if reduction == 0 {
            return true;
        }
        self.credit += 100 - u32::from(reduction);
        if self.credit >= 100 {
            self.credit -= 100;
            true
        } else {
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn via(text: &str) -> Via<'_> {
        Via::parse(text).unwrap()
    }

    #[test]
    fn the_advertisement_follows_the_admitted_fraction() {
        let advert = OcAdvert::from_admitted_ppm(333_333, 500, 1_700_000_000_123_456_789);
        assert_eq!(advert.reduction(), 66);
        let mut out = Vec::new();
        advert.write_value(&mut out);
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "=66;oc-algo=\"loss\";oc-validity=500;oc-seq=1700000000.12345"
        );
        assert_eq!(
            OcAdvert::from_admitted_ppm(1_000_000, 500, 0).reduction(),
            0
        );
        assert_eq!(OcAdvert::from_admitted_ppm(15_625, 500, 0).reduction(), 98);
        assert_eq!(OcAdvert::from_admitted_ppm(0, 500, 0).reduction(), 100);
        assert_eq!(OcAdvert::from_admitted_ppm(u32::MAX, 500, 0).reduction(), 0);
        let mut out = Vec::new();
        OcAdvert::from_admitted_ppm(0, u32::MAX, u64::MAX).write_value(&mut out);
        assert!(out.len() <= MAX_ADVERT_LEN, "{}", out.len());
    }

    #[test]
    fn only_a_valueless_oc_without_other_oc_parameters_is_answered() {
        let raw = "SIP/2.0/UDP 192.0.2.1:5070;branch=z9hG4bKa;oc;rport";
        let at = insert_offset(&via(raw)).unwrap();
        assert_eq!(&raw[..at], "SIP/2.0/UDP 192.0.2.1:5070;branch=z9hG4bKa;oc");
        assert!(insert_offset(&via("SIP/2.0/UDP h;branch=z9hG4bKa;OC")).is_some());
        for refused in [
            "SIP/2.0/UDP h;branch=z9hG4bKa",
            "SIP/2.0/UDP h;branch=z9hG4bKa;oc=20",
            "SIP/2.0/UDP h;branch=z9hG4bKa;oc;oc",
            "SIP/2.0/UDP h;branch=z9hG4bKa;oc;oc-algo=\"loss,rate\"",
            "SIP/2.0/UDP h;branch=z9hG4bKa;oc;oc-seq=1.1",
            "SIP/2.0/UDP h;branch=z9hG4bKa;ocx",
        ] {
            assert_eq!(insert_offset(&via(refused)), None, "{refused}");
        }
    }

    #[test]
    fn a_received_advertisement_is_parsed_strictly() {
        let got = OcReceived::from_via_params(
            ";branch=z9hG4bKa;oc=66;oc-algo=\"loss\";oc-validity=500;oc-seq=1700000000.12345",
        )
        .unwrap();
        assert_eq!(
            got,
            OcReceived {
                reduction: 66,
                validity_ms: 500,
                seq: (1_700_000_000, 12_345)
            }
        );
        // Defaults: loss, 500 ms, seq 0.
        let got = OcReceived::from_via_params(";oc=10").unwrap();
        assert_eq!((got.validity_ms, got.seq), (DEFAULT_VALIDITY_MS, (0, 0)));
        for bad in [
            ";oc",
            ";oc=101",
            ";oc=-1",
            ";oc=1000",
            ";oc=5;oc-algo=rate",
            ";oc=5;oc-seq=1",
            ";oc=5;oc-seq=1.123456",
            ";oc=5;oc-validity=x",
            ";branch=z9hG4bKa",
        ] {
            assert_eq!(OcReceived::from_via_params(bad), None, "{bad}");
        }
        // A huge validity is capped.
        let got = OcReceived::from_via_params(";oc=5;oc-validity=9999999999").unwrap();
        assert_eq!(got.validity_ms, MAX_VALIDITY_MS);
    }

    #[test]
    fn the_throttle_refuses_the_share_for_the_validity_and_the_latest_seq_wins() {
        const MS: u64 = 1_000_000;
        let mut t = LossThrottle::default();
        assert_eq!((0..100).filter(|_| t.admit(0)).count(), 100);
        t.receive(
            0,
            OcReceived {
                reduction: 75,
                validity_ms: 500,
                seq: (10, 5),
            },
        );
        assert_eq!((0..100).filter(|_| t.admit(MS)).count(), 25);
        // An older seq does not replace it.
        t.receive(
            MS,
            OcReceived {
                reduction: 0,
                validity_ms: 500,
                seq: (10, 4),
            },
        );
        assert_eq!(t.reduction(2 * MS), 75);
        // A newer one does.
        t.receive(
            2 * MS,
            OcReceived {
                reduction: 50,
                validity_ms: 500,
                seq: (11, 0),
            },
        );
        assert_eq!((0..100).filter(|_| t.admit(3 * MS)).count(), 50);
        // Expired: everything passes.
        assert_eq!(t.reduction(503 * MS), 0);
        assert!(t.admit(503 * MS));
        // oc=0 ends it at once.
        t.receive(
            600 * MS,
            OcReceived {
                reduction: 90,
                validity_ms: 500,
                seq: (12, 0),
            },
        );
        t.receive(
            601 * MS,
            OcReceived {
                reduction: 0,
                validity_ms: 500,
                seq: (12, 1),
            },
        );
        assert_eq!(t.reduction(602 * MS), 0);
    }
}
