//! Transports and hops: what a message came in on and what it goes out on.
//!
//! The core sees every message as `(hop, bytes)`: a [`Hop`] is the other
//! end of one hop, its [`Transport`] and, for a connection, the driver's
//! [`FlowId`] for it. The core never opens anything: it names the hop, the
//! driver finds (or makes) the socket or connection. Datagrams and stream
//! messages run through the same code; only Via's transport token,
//! Record-Route's `transport` parameter and the retransmission timers
//! (none over a reliable transport, RFC 3261 17.1.1.2) differ.

use crate::uri::SipUri;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::net::SocketAddr;
use std::str::FromStr;

/// A SIP transport (RFC 3261 18, RFC 5630 for TLS).
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum Transport {
    /// Datagrams.
    #[default]
    Udp,
    /// A TCP connection, messages framed by Content-Length (RFC 3261 18.3).
    Tcp,
    /// TLS over TCP (`sips:`, port 5061 by default).
    Tls,
    /// WebSocket (RFC 7118): one SIP message per WebSocket message.
    Ws,
    /// WebSocket over TLS (RFC 7118).
    Wss,
}

impl Transport {
    /// Every transport, in a fixed order (metrics rows).
    pub const ALL: [Transport; 5] = [
        Transport::Udp,
        Transport::Tcp,
        Transport::Tls,
        Transport::Ws,
        Transport::Wss,
    ];

    /// The token of a Via (`UDP`, `TCP`, `TLS`, `WS`, `WSS`).
    pub fn via_token(self) -> &'static str {
        match self {
            Transport::Udp => "UDP",
            Transport::Tcp => "TCP",
            Transport::Tls => "TLS",
            Transport::Ws => "WS",
            Transport::Wss => "WSS",
        }
    }

    /// The value of a URI's `transport` parameter, and the scheme of a
    /// listening address (`udp`, `tcp`, `tls`).
    pub fn name(self) -> &'static str {
        match self {
            Transport::Udp => "udp",
            Transport::Tcp => "tcp",
            Transport::Tls => "tls",
            Transport::Ws => "ws",
            Transport::Wss => "wss",
        }
    }

    /// Whether the transport delivers reliably (no retransmissions by the
    /// transaction layer, RFC 3261 17.1.1.2 and 17.2.1).
    pub fn is_reliable(self) -> bool {
        self != Transport::Udp
    }

    /// The transport a Via token names (case-insensitive), if we speak it.
    pub fn from_via_token(token: &str) -> Option<Transport> {
        Transport::ALL
            .into_iter()
            .find(|t| t.via_token().eq_ignore_ascii_case(token))
    }

    /// The transport a SIP URI asks for: its `transport` parameter, else
    /// TLS for `sips:` (RFC 3261 26.2.2), else `None` (the caller's
    /// default). An unknown `transport` value is `None` too.
    pub fn of_uri(uri: &SipUri<'_>) -> Option<Transport> {
        match uri.param("transport").flatten() {
            Some(value) => Transport::ALL
                .into_iter()
                .find(|t| t.name().eq_ignore_ascii_case(value)),
            None => uri.secure.then_some(Transport::Tls),
        }
    }
}

impl fmt::Display for Transport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Transport {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Transport::ALL
            .into_iter()
            .find(|t| t.name().eq_ignore_ascii_case(s))
            .ok_or_else(|| format!("unknown transport {s:?} (udp, tcp, tls, ws or wss)"))
    }
}

/// The driver's name for one connection (opaque to the core; never 0).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FlowId(pub u64);

/// The other end of one hop: where a message came from, or where one goes.
///
/// For a datagram `flow` is `None`. For a message that came over a
/// connection it names that connection, and a reply names it again so
/// that the driver sends over the same connection (RFC 3261 18.2.2); a
/// hop with no flow on a connection transport means "a connection to
/// `addr`": the driver reuses one it has to that address or opens one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Hop {
    /// The remote address (for a connection: its peer address).
    pub addr: SocketAddr,
    /// The transport.
    pub transport: Transport,
    /// The connection, when one is meant.
    pub flow: Option<FlowId>,
}

impl Hop {
    /// A datagram hop.
    pub fn udp(addr: SocketAddr) -> Hop {
        Hop {
            addr,
            transport: Transport::Udp,
            flow: None,
        }
    }

    /// A hop over `transport` to `addr`, no particular connection.
    pub fn new(transport: Transport, addr: SocketAddr) -> Hop {
        Hop {
            addr,
            transport,
            flow: None,
        }
    }
}

/// An address with a transport (`tcp:127.0.0.1:5060`): a listening
/// address or a configured next hop. A bare address means UDP.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TransportAddr {
    /// The transport.
    pub transport: Transport,
    /// The address.
    pub addr: SocketAddr,
}

impl TransportAddr {
    /// A UDP address.
    pub fn udp(addr: SocketAddr) -> TransportAddr {
        TransportAddr {
            transport: Transport::Udp,
            addr,
        }
    }

    /// This address as a hop (no particular connection).
    pub fn hop(self) -> Hop {
        Hop::new(self.transport, self.addr)
    }
}

impl fmt::Display for TransportAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.transport, self.addr)
    }
}

impl FromStr for TransportAddr {
    type Err = String;
    /// `ADDR`, `udp:ADDR`, `tcp:ADDR` or `tls:ADDR` (`[v6]:port` for IPv6).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (transport, rest) = match s.split_once(':') {
            Some((scheme, rest)) if scheme.chars().all(|c| c.is_ascii_alphabetic()) => {
                (scheme.parse::<Transport>()?, rest)
            }
            _ => (Transport::Udp, s),
        };
        let addr = rest
            .parse::<SocketAddr>()
            .map_err(|e| format!("{s:?}: {e} (want [udp:|tcp:|tls:|ws:|wss:]IP:PORT)"))?;
        Ok(TransportAddr { transport, addr })
    }
}

impl Serialize for TransportAddr {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for TransportAddr {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_parse_with_and_without_scheme() {
        let a: TransportAddr = "127.0.0.1:5060".parse().unwrap();
        assert_eq!(a.transport, Transport::Udp);
        let a: TransportAddr = "tcp:127.0.0.1:5070".parse().unwrap();
        assert_eq!((a.transport, a.addr.port()), (Transport::Tcp, 5070));
        let a: TransportAddr = "TLS:[::1]:5061".parse().unwrap();
        assert_eq!(a.transport, Transport::Tls);
        assert!(a.addr.is_ipv6());
        let a: TransportAddr = "[::1]:5060".parse().unwrap();
        assert_eq!(a.transport, Transport::Udp);
        assert!("sctp:127.0.0.1:5060".parse::<TransportAddr>().is_err());
        assert!("tcp:localhost:5060".parse::<TransportAddr>().is_err());
        assert_eq!(
            "tcp:127.0.0.1:5070"
                .parse::<TransportAddr>()
                .unwrap()
                .to_string(),
            "tcp:127.0.0.1:5070"
        );
    }

    #[test]
    fn uris_name_their_transport() {
        let uri = SipUri::parse("sip:a@192.0.2.1;transport=TCP").unwrap();
        assert_eq!(Transport::of_uri(&uri), Some(Transport::Tcp));
        let uri = SipUri::parse("sips:a@192.0.2.1").unwrap();
        assert_eq!(Transport::of_uri(&uri), Some(Transport::Tls));
        let uri = SipUri::parse("sip:a@192.0.2.1").unwrap();
        assert_eq!(Transport::of_uri(&uri), None);
        assert_eq!(Transport::from_via_token("tcp"), Some(Transport::Tcp));
        assert_eq!(Transport::from_via_token("SCTP"), None);
        assert_eq!(Transport::from_via_token("WSS"), Some(Transport::Wss));
        let uri = SipUri::parse("sip:a@x.invalid;transport=ws").unwrap();
        assert_eq!(Transport::of_uri(&uri), Some(Transport::Ws));
    }
}
