//! The relay policy: one decision, for every request the proxy or the
//! dispatcher sends on, whether its destination (the address the datagram
//! goes to, after route preprocessing and strict-route rewriting) is one
//! we may send to.
//!
//! A request may go to:
//! - a configured next hop (`route_to`, the dispatcher's proxies);
//! - a binding of a served AOR ([`Grant::Binding`]);
//! - the next hop of an in-dialog request whose top Route is a
//!   Record-Route we signed for this dialog ([`Grant::SignedRoute`]);
//! - any target of a request authenticated as a served user
//!   ([`Grant::Authenticated`]);
//! - a destination in the configured relay networks ([`RelayNets`]:
//!   `any` or a CIDR list), whatever the request.
//!
//! Whatever the grant, never: an address that is not unicast (port 0,
//! unspecified, broadcast, multicast), our own listening address (a loop),
//! and, unless a configured next hop or named by an explicit CIDR of the
//! relay networks (`any` does not count), loopback, link-local and our own
//! IP (server-side request forgery towards the proxy host's other services).

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::str::FromStr;

/// One IP network (`addr/prefix`; a bare address is a host network).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cidr {
    addr: IpAddr,
    prefix: u8,
}

impl Cidr {
    /// Whether `ip` is in this network (an IPv4-mapped IPv6 address counts
    /// as its IPv4 address).
    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.addr, canonical(ip)) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                let mask = u32::MAX
                    .checked_shl(32 - u32::from(self.prefix))
                    .unwrap_or(0);
                u32::from(net) & mask == u32::from(ip) & mask
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                let mask = u128::MAX
                    .checked_shl(128 - u32::from(self.prefix))
                    .unwrap_or(0);
                u128::from(net) & mask == u128::from(ip) & mask
            }
            _ => false,
        }
    }
}

impl FromStr for Cidr {
    type Err = String;

    fn from_str(text: &str) -> Result<Cidr, String> {
        let (addr, prefix) = match text.split_once('/') {
            Some((addr, prefix)) => (addr, Some(prefix)),
            None => (text, None),
        };
        let addr: IpAddr = addr
            .trim()
            .parse()
            .map_err(|_| format!("`{text}`: not an IP address or CIDR network"))?;
        let addr = canonical(addr);
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            None => max,
            Some(p) => p
                .trim()
                .parse::<u8>()
                .ok()
                .filter(|p| *p <= max)
                .ok_or_else(|| format!("`{text}`: prefix length must be 0..={max}"))?,
        };
        Ok(Cidr { addr, prefix })
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

/// Destinations any request may be relayed to, authenticated or not
/// (`--relay`): none (the default), `any`, or a list of networks.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum RelayNets {
    /// Only granted destinations (the default).
    #[default]
    None,
    /// Every unicast destination (an open relay, except loopback,
    /// link-local and our own IP).
    Any,
    /// These networks; one that names loopback, link-local or our own IP
    /// explicitly also allows them.
    Nets(Vec<Cidr>),
}

impl RelayNets {
    /// Whether `ip` is relayed to without a grant.
    pub fn contains(&self, ip: IpAddr) -> bool {
        match self {
            RelayNets::None => false,
            RelayNets::Any => true,
            RelayNets::Nets(nets) => nets.iter().any(|n| n.contains(ip)),
        }
    }

    /// Whether an explicit network (not `any`) contains `ip`.
    pub fn names(&self, ip: IpAddr) -> bool {
        matches!(self, RelayNets::Nets(nets) if nets.iter().any(|n| n.contains(ip)))
    }
}

impl FromStr for RelayNets {
    type Err = String;

    /// `none`, `any`, or comma-separated networks (`127.0.0.0/8,::1`).
    fn from_str(text: &str) -> Result<RelayNets, String> {
        let text = text.trim();
        if text.eq_ignore_ascii_case("none") || text.is_empty() {
            return Ok(RelayNets::None);
        }
        if text.eq_ignore_ascii_case("any") {
            return Ok(RelayNets::Any);
        }
        text.split(',')
            .map(str::parse)
            .collect::<Result<Vec<Cidr>, String>>()
            .map(RelayNets::Nets)
    }
}

impl fmt::Display for RelayNets {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RelayNets::None => f.write_str("none"),
            RelayNets::Any => f.write_str("any"),
            RelayNets::Nets(nets) => {
                for (i, net) in nets.iter().enumerate() {
                    if i > 0 {
                        f.write_str(",")?;
                    }
                    write!(f, "{net}")?;
                }
                Ok(())
            }
        }
    }
}

impl serde::Serialize for RelayNets {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for RelayNets {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<RelayNets, D::Error> {
        let text = String::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

/// Why a request may go where routing sends it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Grant {
    /// Nothing vouches for the destination: only the relay networks (or a
    /// configured next hop) let it through.
    None,
    /// The destination is a binding (contact or Path) of a served AOR.
    Binding,
    /// An in-dialog request whose top Route (or Request-URI, behind a
    /// strict router) is a Record-Route we signed for this dialog.
    SignedRoute,
    /// The request was authenticated as a served user.
    Authenticated,
}

/// Why the policy refuses a destination.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// Not a unicast address (port 0, unspecified, broadcast, multicast).
    Unsendable,
    /// Our own listening address: a loop.
    OwnAddress,
    /// Loopback, link-local or our own IP, not configured.
    LocalNetwork,
    /// Nothing grants this destination (403 Not Relaying).
    NotRelaying,
}

/// The relay policy of one proxy or dispatcher (built once from its
/// configuration).
#[derive(Clone, Debug)]
pub struct RelayPolicy {
    local: SocketAddr,
    configured: Vec<SocketAddr>,
    nets: RelayNets,
}

impl RelayPolicy {
    /// The policy of a server listening on `local`, with configured next
    /// hops `configured` and relay networks `nets`.
    pub fn new(local: SocketAddr, configured: Vec<SocketAddr>, nets: RelayNets) -> RelayPolicy {
        RelayPolicy {
            local,
            configured,
            nets,
        }
    }

    /// Whether a request with `grant` may be sent to `to`.
    pub fn check(&self, to: SocketAddr, grant: Grant) -> Result<(), Refusal> {
        if !sendable(&to) {
            return Err(Refusal::Unsendable);
        }
        let ip = canonical(to.ip());
        if ip == canonical(self.local.ip()) && to.port() == self.local.port() {
            return Err(Refusal::OwnAddress);
        }
        if self.configured.contains(&to) {
            return Ok(());
        }
        if self.is_local_network(ip) && !self.nets.names(ip) {
            return Err(Refusal::LocalNetwork);
        }
        if grant != Grant::None || self.nets.contains(ip) {
            return Ok(());
        }
        Err(Refusal::NotRelaying)
    }

    /// The relay networks.
    pub fn nets(&self) -> &RelayNets {
        &self.nets
    }

    /// Loopback, link-local, or our own IP.
    fn is_local_network(&self, ip: IpAddr) -> bool {
        ip == canonical(self.local.ip())
            || match ip {
                IpAddr::V4(v4) => v4.is_loopback() || v4.is_link_local(),
                IpAddr::V6(v6) => v6.is_loopback() || (v6.segments()[0] & 0xffc0) == 0xfe80,
            }
    }
}

/// Whether we may send to `a` at all: a unicast address with a port (not
/// port 0, unspecified, broadcast or multicast).
pub fn sendable(a: &SocketAddr) -> bool {
    a.port() != 0
        && match canonical(a.ip()) {
            IpAddr::V4(v) => !v.is_unspecified() && !v.is_broadcast() && !v.is_multicast(),
            IpAddr::V6(v) => !v.is_unspecified() && !v.is_multicast(),
        }
}

/// An IPv4-mapped IPv6 address as its IPv4 address.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6
            .to_ipv4_mapped()
            .map_or(IpAddr::V6(v6), |v4: Ipv4Addr| IpAddr::V4(v4)),
        v4 => v4,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    #[test]
    fn cidr_parse_contains_and_display() {
        let net: Cidr = "192.0.2.0/24".parse().unwrap();
        assert!(net.contains("192.0.2.77".parse().unwrap()));
        assert!(!net.contains("192.0.3.1".parse().unwrap()));
        assert!(net.contains("::ffff:192.0.2.1".parse().unwrap()));
        assert_eq!(net.to_string(), "192.0.2.0/24");
        let host: Cidr = "127.0.0.4".parse().unwrap();
        assert!(host.contains("127.0.0.4".parse().unwrap()));
        assert!(!host.contains("127.0.0.5".parse().unwrap()));
        let all: Cidr = "0.0.0.0/0".parse().unwrap();
        assert!(all.contains("203.0.113.9".parse().unwrap()));
        let v6: Cidr = "2001:db8::/32".parse().unwrap();
        assert!(v6.contains("2001:db8::1".parse().unwrap()));
        assert!(!v6.contains("192.0.2.1".parse().unwrap()));
        for bad in ["192.0.2.0/33", "x", "::/129", "1.2.3.4/-1", ""] {
            assert!(bad.parse::<Cidr>().is_err(), "{bad}");
        }
        let nets: RelayNets = "127.0.0.0/8, ::1".parse().unwrap();
        assert_eq!(nets.to_string(), "127.0.0.0/8,::1/128");
        assert_eq!("any".parse::<RelayNets>(), Ok(RelayNets::Any));
        assert_eq!("none".parse::<RelayNets>(), Ok(RelayNets::None));
        assert!("127.0.0.0/8,nope".parse::<RelayNets>().is_err());
    }

    #[test]
    fn grants_nets_and_local_networks() {
        let local = addr("192.0.2.10:5060");
        let gateway = addr("192.0.2.20:5060");
        let none = RelayPolicy::new(local, vec![gateway], RelayNets::None);
        let far = addr("203.0.113.7:5060");
        // Only a grant or a configured hop passes without relay networks.
        assert_eq!(none.check(far, Grant::None), Err(Refusal::NotRelaying));
        for grant in [Grant::Binding, Grant::SignedRoute, Grant::Authenticated] {
            assert_eq!(none.check(far, grant), Ok(()));
        }
        assert_eq!(none.check(gateway, Grant::None), Ok(()));
        // Never our own address, never a non-unicast one.
        assert_eq!(
            none.check(local, Grant::Authenticated),
            Err(Refusal::OwnAddress)
        );
        for bad in ["224.0.0.1:5060", "0.0.0.0:5060", "192.0.2.1:0", "[::]:5060"] {
            assert_eq!(
                none.check(addr(bad), Grant::Authenticated),
                Err(Refusal::Unsendable),
                "{bad}"
            );
        }
        // Loopback, link-local and our IP need an explicit network, even
        // with a grant or `any`.
        let any = RelayPolicy::new(local, vec![], RelayNets::Any);
        for special in [
            "127.0.0.1:514",
            "169.254.1.1:5060",
            "192.0.2.10:5070",
            "[::1]:5060",
            "[fe80::1]:5060",
            "[::ffff:127.0.0.1]:5060",
        ] {
            assert_eq!(
                any.check(addr(special), Grant::Authenticated),
                Err(Refusal::LocalNetwork),
                "{special}"
            );
        }
        assert_eq!(any.check(far, Grant::None), Ok(()));
        let loopback = RelayPolicy::new(local, vec![], "127.0.0.0/8".parse().unwrap());
        assert_eq!(loopback.check(addr("127.0.0.5:5099"), Grant::None), Ok(()));
        assert_eq!(loopback.check(far, Grant::None), Err(Refusal::NotRelaying));
        // A configured next hop on loopback is allowed as configured.
        let lo_local = addr("127.0.0.1:5060");
        let lo = RelayPolicy::new(lo_local, vec![addr("127.0.0.1:5070")], RelayNets::None);
        assert_eq!(lo.check(addr("127.0.0.1:5070"), Grant::None), Ok(()));
        assert_eq!(
            lo.check(addr("127.0.0.1:5071"), Grant::Binding),
            Err(Refusal::LocalNetwork)
        );
        assert_eq!(
            lo.check(lo_local, Grant::Authenticated),
            Err(Refusal::OwnAddress)
        );
    }
}
