//! The proxies behind a dispatcher now. A reload that changes them
//! ([`super::Dispatcher::set_proxies`]) replaces the whole set at once;
//! each worker keeps its copy and takes the new one at its next datagram
//! (a generation counter says when), so the data path reads no lock.

use super::health::Member;
use crate::relay::{RelayNets, RelayPolicy};
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
    pub(super) retired: Vec<SocketAddr>,
    /// Where requests may go: the proxies (also the retired ones) and the
    /// relay networks.
    pub(super) relay: RelayPolicy,
}

impl Targets {
    /// The set `proxies` behind `local`; a proxy that was in `previous`
    /// keeps its state (alive, operator's state, counters, probes).
    pub(super) fn new(
        local: SocketAddr,
        proxies: &[SocketAddr],
        previous: Option<&Targets>,
        relay: RelayNets,
    ) -> Targets {
        let members: Vec<Arc<Member>> = proxies
            .iter()
            .map(|&address| {
                previous
                    .and_then(|p| p.members.iter().find(|m| m.address == address))
                    .cloned()
                    .unwrap_or_else(|| Arc::new(Member::new(address)))
            })
            .collect();
        let mut retired: Vec<SocketAddr> = previous
            .map(|p| {
                p.retired
                    .iter()
                    .copied()
                    .chain(p.members.iter().map(|m| m.address))
                    .filter(|a| !proxies.contains(a))
                    .collect()
            })
            .unwrap_or_default();
        retired.dedup();
        let excess = retired.len().saturating_sub(MAX_RETIRED);
        retired.drain(..excess);
        let trusted: Vec<SocketAddr> = proxies.iter().chain(&retired).copied().collect();
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

    /// Whether `address` is one of our proxies, now or retired.
    pub(super) fn is_proxy(&self, address: SocketAddr) -> bool {
        self.member_at(address).is_some() || self.retired.contains(&address)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::Ordering;

    fn a(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    #[test]
    fn a_new_set_keeps_the_state_of_proxies_that_stay_and_retires_the_others() {
        let local = a("192.0.2.1:5060");
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
        assert_eq!(second.members[1].address, a("192.0.2.13:5060"));
        assert_eq!(second.retired, [a("192.0.2.12:5060")]);
        assert!(second.is_proxy(a("192.0.2.12:5060")));
        assert_eq!(second.member_at(a("192.0.2.12:5060")), None);
        // Back again: no longer retired.
        let third = Targets::new(
            local,
            &[a("192.0.2.12:5060")],
            Some(&second),
            RelayNets::None,
        );
        assert_eq!(third.retired, [a("192.0.2.11:5060"), a("192.0.2.13:5060")]);
    }
}
