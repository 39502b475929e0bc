//! Health of the proxies behind a dispatcher: an OPTIONS probe to each
//! every interval (like Kamailio's `ds_ping_interval`); a proxy that
//! leaves `failures` probes in a row unanswered (or answers them `408` or
//! `5xx`) is out, and back in with its first good answer. A proxy starts
//! in (traffic flows before the first probe returns).

use crate::transport::{Hop, Transport, TransportAddr};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::Mutex;

/// Prefix of our probes' branch (after the magic cookie) and Call-ID.
pub(super) const PROBE_TAG: &str = "rwprobe";

/// What the operator set for one proxy (Kamailio's dispatcher
/// `ds.set_state` flags, in spirit).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AdminState {
    /// Gets new requests while it answers its probes.
    Active = 0,
    /// Gets no new requests (taken out by hand).
    Disabled = 1,
    /// Gets no new requests while its own calls end (it is being drained
    /// or restarted); as `Disabled` for routing, told apart in listings.
    Draining = 2,
}

impl AdminState {
    /// `active`, `disabled` or `draining`.
    pub fn as_str(self) -> &'static str {
        match self {
            AdminState::Active => "active",
            AdminState::Disabled => "disabled",
            AdminState::Draining => "draining",
        }
    }
}

/// One proxy behind the dispatcher.
pub(super) struct Member {
    /// Its address.
    pub(super) address: SocketAddr,
    /// The transport requests and probes go to it over.
    pub(super) transport: Transport,
    /// Its identity for rendezvous hashing and in listings: `ip:port`
    /// over UDP, `tcp:ip:port` / `tls:ip:port` over a connection.
    pub(super) identity: String,
    /// In: new requests may go to it.
    pub(super) alive: AtomicBool,
    /// The operator's [`AdminState`] (as `u8`).
    admin: AtomicU8,
    /// New requests sent to it.
    pub(super) requests: AtomicU64,
    /// Times it went out.
    pub(super) downs: AtomicU64,
    probe: Mutex<Probe>,
}

/// The probe state of one proxy.
#[derive(Default)]
struct Probe {
    /// Sequence number of the probe in flight, if unanswered.
    outstanding: Option<u64>,
    /// Probes unanswered in a row.
    missed: u32,
    /// Last sequence number used.
    seq: u64,
}

impl Member {
    pub(super) fn new(at: TransportAddr) -> Member {
        Member {
            address: at.addr,
            transport: at.transport,
            identity: identity(at),
            alive: AtomicBool::new(true),
            admin: AtomicU8::new(AdminState::Active as u8),
            requests: AtomicU64::new(0),
            downs: AtomicU64::new(0),
            probe: Mutex::new(Probe::default()),
        }
    }

    /// Its address with its transport.
    pub(super) fn at(&self) -> TransportAddr {
        TransportAddr {
            transport: self.transport,
            addr: self.address,
        }
    }

    /// The hop to it (a connection to it, reused, for TCP and TLS).
    pub(super) fn hop(&self) -> Hop {
        Hop::new(self.transport, self.address)
    }

    pub(super) fn is_alive(&self) -> bool {
        self.alive.load(Ordering::Relaxed)
    }

    /// Alive and `Active`: new requests may go to it.
    pub(super) fn takes_new(&self) -> bool {
        self.is_alive() && self.admin_state() == AdminState::Active
    }

    pub(super) fn admin_state(&self) -> AdminState {
        match self.admin.load(Ordering::Relaxed) {
            1 => AdminState::Disabled,
            2 => AdminState::Draining,
            _ => AdminState::Active,
        }
    }

    pub(super) fn set_admin_state(&self, state: AdminState) {
        self.admin.store(state as u8, Ordering::Relaxed);
    }

    /// A probe is due: count the last one if unanswered (out after
    /// `failures` in a row); returns the new probe's sequence number.
    pub(super) fn next_probe(&self, failures: u32) -> u64 {
        let mut probe = self.probe.lock().unwrap_or_else(|e| e.into_inner());
        if probe.outstanding.take().is_some() {
            probe.missed = probe.missed.saturating_add(1);
            if probe.missed >= failures && self.alive.swap(false, Ordering::Relaxed) {
                self.downs.fetch_add(1, Ordering::Relaxed);
            }
        }
        probe.seq += 1;
        probe.outstanding = Some(probe.seq);
        probe.seq
    }

    /// The answer `code` to probe `seq` came; `false` if it is not the
    /// probe in flight (late or forged).
    pub(super) fn probe_answered(&self, seq: u64, code: u16, failures: u32) -> bool {
        let mut probe = self.probe.lock().unwrap_or_else(|e| e.into_inner());
        if probe.outstanding != Some(seq) {
            return false;
        }
        probe.outstanding = None;
        if code == 408 || code >= 500 {
            probe.missed = probe.missed.saturating_add(1);
            if probe.missed >= failures && self.alive.swap(false, Ordering::Relaxed) {
                self.downs.fetch_add(1, Ordering::Relaxed);
            }
        } else {
            probe.missed = 0;
            self.alive.store(true, Ordering::Relaxed);
        }
        true
    }
}

/// How a proxy is named in listings and hashed: `ip:port` over UDP (as
/// before other transports existed, so UDP shares do not move), else
/// `transport:ip:port`.
pub(super) fn identity(at: TransportAddr) -> String {
    match at.transport {
        Transport::Udp => at.addr.to_string(),
        _ => at.to_string(),
    }
}

/// `(member index, sequence, nonce)` of a probe id `rwprobe-I-S-NONCE`
/// (its branch after the magic cookie; its Call-ID before the `@`).
pub(super) fn parse_probe_id(id: &str) -> Option<(usize, u64, u64)> {
    let rest = id.strip_prefix(PROBE_TAG)?.strip_prefix('-')?;
    let mut parts = rest.split('@').next()?.splitn(3, '-');
    let index = parts.next()?.parse().ok()?;
    let seq = parts.next()?.parse().ok()?;
    let nonce = parts.next()?;
    if nonce.len() != 16 {
        return None;
    }
    Some((index, seq, u64::from_str_radix(nonce, 16).ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn out_after_failures_in_a_row_back_with_one_answer() {
        let m = Member::new("192.0.2.11:5060".parse().unwrap());
        assert_eq!(m.identity, "192.0.2.11:5060");
        let tcp = Member::new("tcp:192.0.2.11:5060".parse().unwrap());
        assert_eq!(tcp.identity, "tcp:192.0.2.11:5060");
        let s1 = m.next_probe(3);
        assert!(m.probe_answered(s1, 200, 3));
        assert!(!m.probe_answered(s1, 200, 3), "answered twice");
        m.next_probe(3);
        m.next_probe(3); // 1 missed
        m.next_probe(3); // 2 missed
        assert!(m.is_alive());
        let s = m.next_probe(3); // 3 missed: out
        assert!(!m.is_alive());
        assert_eq!(m.downs.load(Ordering::Relaxed), 1);
        assert!(m.probe_answered(s, 404, 3), "any answer but 408/5xx");
        assert!(m.is_alive());
        assert_eq!(
            parse_probe_id("rwprobe-2-17-00000000000000ff@192.0.2.5"),
            Some((2, 17, 255))
        );
        assert_eq!(parse_probe_id("rwprobe-2-17"), None);
        assert_eq!(parse_probe_id("call-2-17-00000000000000ff"), None);
    }
}
