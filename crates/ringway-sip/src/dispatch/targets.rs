//! The proxies behind a dispatcher now. A reload that changes them
//! ([`super::Dispatcher::set_proxies`]) replaces the whole set at once;
//! each worker keeps its copy and takes the new one at its next datagram
//! (a generation counter says when), so the data path reads no lock.

use super::health::Member;
use crate::relay::{RelayNets, RelayPolicy};
use crate::transport::{Hop, TransportAddr};
use std::net::SocketAddr;
use std::sync::Arc;

/// Proxies a reload removed that are still remembered (the most recent).
pub(super) const MAX_RETIRED: usize = 64;

/// One generation of the proxy set.
pub(super) struct Targets {
    /// The proxies new requests may go to (hashed over), in configured order.
    pub(super) members: Vec<Arc<Member>>,
    /// Proxies a reload removed, oldest first (at most [`MAX_RETIRED`]):
    /// the in-dialog requests of calls they Record-Routed still go to them
    /// and come from them as from a proxy, until a restart.
    pub(super) retired: Vec<TransportAddr>,
    /// Where requests may go: the proxies (also the retired ones) and the
    /// relay networks.
    pub(super) relay: RelayPolicy,
}

impl Targets {
    /// The set `proxies` behind `local`; a proxy that was in `previous`
    /// keeps its state (alive, operator's state, counters, probes); one
    /// whose transport changed is a new proxy.
    pub(super) fn new(
        local: SocketAddr,
        proxies: &[TransportAddr],
        previous: Option<&Targets>,
        relay: RelayNets,
    ) -> Targets {
        let members: Vec<Arc<Member>> = proxies
            .iter()
            .map(|&at| {
                previous
                    .and_then(|p| p.members.iter().find(|m| m.at() == at))
                    .cloned()
                    .unwrap_or_else(|| Arc::new(Member::new(at)))
            })
            .collect();
        let mut retired: Vec<TransportAddr> = previous
            .map(|p| {
                p.retired
                    .iter()
                    .copied()
                    .chain(p.members.iter().map(|m| m.at()))
                    .filter(|a| !proxies.contains(a))
                    .collect()
            })
            .unwrap_or_default();
        retired.dedup();
        let excess = retired.len().saturating_sub(MAX_RETIRED);
        retired.drain(..excess);
        let trusted: Vec<SocketAddr> = proxies.iter().chain(&retired).map(|at| at.addr).collect();
        Targets {
            members,
            retired,
            relay: RelayPolicy::new(local, trusted, relay),
        }
    }

    /// The index of the member at `address`.
    pub(super) fn member_at(&self, address: SocketAddr) -> Option<usize> {
        self.members.iter().position(|m| m.address == address)
    }

    /// Whether a message from `from` comes from one of our proxies, now or
    /// retired. A datagram: from a proxy's address. Over a connection: from
    /// the IP of a proxy we reach over a connection, any port (a proxy's
    /// own connections to us come from an ephemeral port; a TCP peer's
    /// address, unlike a datagram's, cannot be spoofed without its
    /// handshake). So clients must not share an IP with a TCP/TLS proxy.
    pub(super) fn is_proxy(&self, from: Hop) -> bool {
        let mut all = self
            .members
            .iter()
            .map(|m| m.at())
            .chain(self.retired.iter().copied());
        if from.transport.is_reliable() {
            all.any(|p| p.transport.is_reliable() && p.addr.ip() == from.addr.ip())
        } else {
            all.any(|p| p.addr == from.addr)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::Ordering;

    fn a(s: &str) -> TransportAddr {
        s.parse().unwrap()
    }

    #[test]
    fn a_new_set_keeps_the_state_of_proxies_that_stay_and_retires_the_others() {
        let local = a("192.0.2.1:5060").addr;
        let first = Targets::new(
            local,
            &[a("192.0.2.11:5060"), a("192.0.2.12:5060")],
            None,
            RelayNets::None,
        );
        first.members[0].requests.fetch_add(7, Ordering::Relaxed);
        let second = Targets::new(
            local,
            &[a("192.0.2.11:5060"), a("192.0.2.13:5060")],
            Some(&first),
            RelayNets::None,
        );
        assert!(Arc::ptr_eq(&first.members[0], &second.members[0]));
        assert_eq!(second.members[0].requests.load(Ordering::Relaxed), 7);
        assert_eq!(second.members[1].at(), a("192.0.2.13:5060"));
        assert_eq!(second.retired, [a("192.0.2.12:5060")]);
        assert!(second.is_proxy(a("192.0.2.12:5060").hop()));
        assert!(!second.is_proxy(a("192.0.2.12:5061").hop()));
        assert!(!second.is_proxy(a("tcp:192.0.2.12:40000").hop()));
        assert_eq!(second.member_at(a("192.0.2.12:5060").addr), None);
        // Back again: no longer retired.
        let third = Targets::new(
            local,
            &[a("192.0.2.12:5060")],
            Some(&second),
            RelayNets::None,
        );
        assert_eq!(third.retired, [a("192.0.2.11:5060"), a("192.0.2.13:5060")]);
        // Over a connection a proxy is known by its IP (its connections to
        // us come from ephemeral ports); a datagram from there is not.
        let tcp = Targets::new(local, &[a("tcp:192.0.2.14:5060")], None, RelayNets::None);
        assert!(tcp.is_proxy(a("tcp:192.0.2.14:41000").hop()));
        assert!(!tcp.is_proxy(a("192.0.2.14:41000").hop()));
        assert!(!tcp.is_proxy(a("tcp:192.0.2.15:5060").hop()));
    }
}
