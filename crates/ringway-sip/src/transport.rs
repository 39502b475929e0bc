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

/// The driver's connections as the core asks about them: whether a
/// registered flow's connection is still open (RFC 5626 5.3: a request
/// that must go over a flow that is gone is answered `430 Flow Failed`).
pub trait FlowState: Send + Sync {
    /// Whether the connection `flow` is open.
    fn is_open(&self, flow: FlowId) -> bool;
}

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

/// The RFC 5923 alias a request asks for: its top Via's transport and
/// sent-by when that Via carries `alias`, names TCP or TLS, and its
/// sent-by host is an IP literal (port: as written, else the transport's
/// default, 5060 or 5061). `None` for a response, another transport, a
/// host name, or no `alias`. A cheap search for `alias` (`alias`, `ALIAS`,
/// `Alias`: what implementations write) comes first: a message without it
/// is not parsed.
///
/// What the driver does with it is its own policy: ringway aliases a
/// connection only to the sent-by at the connection's own source IP (the
/// port alone is taken, as Kamailio's `tcp_accept_aliases` does), so an
/// alias never redirects traffic meant for another host.
pub fn alias_of(message: &[u8]) -> Option<(Transport, SocketAddr)> {
    static FINDERS: std::sync::OnceLock<[memchr::memmem::Finder<'static>; 2]> =
        std::sync::OnceLock::new();
    let finders = FINDERS.get_or_init(|| {
        [
            memchr::memmem::Finder::new(b"lias"),
            memchr::memmem::Finder::new(b"LIAS"),
        ]
    });
    let mentioned = finders.iter().any(|finder| {
        finder
            .find_iter(message)
            .any(|at| at > 0 && message[at - 1].eq_ignore_ascii_case(&b'a'))
    });
    if !mentioned {
        return None;
    }
    let msg = crate::msg::SipMsg::parse(message).ok()?;
    if !msg.is_request() {
        return None;
    }
    let via = msg.top_via()?;
    let transport = Transport::from_via_token(via.transport)
        .filter(|t| matches!(t, Transport::Tcp | Transport::Tls))?;
    let asked =
        crate::text::Params::new(via.params).any(|(name, _)| name.eq_ignore_ascii_case("alias"));
    if !asked {
        return None;
    }
    let ip = crate::uri::host_ip(via.host)?;
    let port = via.port.unwrap_or(match transport {
        Transport::Tls => 5061,
        _ => 5060,
    });
    (port != 0).then_some((transport, SocketAddr::new(ip, port)))
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

    #[test]
    fn aliases_are_read_from_the_top_via_of_requests_only() {
        let request = |via: &str| {
            format!(
                "OPTIONS sip:a@192.0.2.9 SIP/2.0\r\nVia: {via}\r\n\
                 From: <sip:b@192.0.2.1>;tag=1\r\nTo: <sip:a@192.0.2.9>\r\n\
                 Call-ID: c\r\nCSeq: 1 OPTIONS\r\nMax-Forwards: 70\r\n\
                 Content-Length: 0\r\n\r\n"
            )
        };
        let at = |s: &str| s.parse::<SocketAddr>().unwrap();
        let m = request("SIP/2.0/TCP 192.0.2.1:5070;branch=z9hG4bK1;alias");
        assert_eq!(
            alias_of(m.as_bytes()),
            Some((Transport::Tcp, at("192.0.2.1:5070")))
        );
        let m = request("SIP/2.0/TLS [2001:db8::1];ALIAS;branch=z9hG4bK1");
        assert_eq!(
            alias_of(m.as_bytes()),
            Some((Transport::Tls, at("[2001:db8::1]:5061")))
        );
        for via in [
            "SIP/2.0/TCP 192.0.2.1:5070;branch=z9hG4bK1",
            "SIP/2.0/UDP 192.0.2.1:5070;branch=z9hG4bK1;alias",
            "SIP/2.0/TCP host.example.com:5070;branch=z9hG4bK1;alias",
            "SIP/2.0/TCP 192.0.2.1:5070;branch=z9hG4bKalias",
            "SIP/2.0/WS abc.invalid;branch=z9hG4bK1;alias",
        ] {
            assert_eq!(alias_of(request(via).as_bytes()), None, "{via}");
        }
        let response =
            "SIP/2.0 200 OK\r\nVia: SIP/2.0/TCP 192.0.2.1:5070;branch=z9hG4bK1;alias\r\n\
            From: <sip:b@192.0.2.1>;tag=1\r\nTo: <sip:a@192.0.2.9>;tag=2\r\n\
            Call-ID: c\r\nCSeq: 1 OPTIONS\r\nContent-Length: 0\r\n\r\n";
        assert_eq!(alias_of(response.as_bytes()), None);
    }
}
