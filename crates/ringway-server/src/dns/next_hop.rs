//! A configured next hop as given: an address, or a name to resolve
//! (RFC 3263: `host` by NAPTR/SRV, `host:port` by A/AAAA).

use serde::{Deserialize, Serialize};
use std::fmt;
use std::net::SocketAddr;
use std::str::FromStr;

/// A next hop: an IP literal with port, or a host name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NextHop {
    /// An address (no DNS).
    Addr(SocketAddr),
    /// A name, with the port if one was given.
    Name {
        /// The host name (lower case).
        host: String,
        /// The port, if given (then no NAPTR/SRV lookup, RFC 3263 4.2).
        port: Option<u16>,
    },
}

impl FromStr for NextHop {
    type Err = String;

    /// `IP:PORT`, `[IPv6]:PORT`, `host` or `host:port`.
    fn from_str(text: &str) -> Result<NextHop, String> {
        let text = text.trim();
        if let Ok(addr) = text.parse::<SocketAddr>() {
            return Ok(NextHop::Addr(addr));
        }
        let (host, port) = match text.rsplit_once(':') {
            Some((host, port)) => {
                let port = port
                    .parse::<u16>()
                    .ok()
                    .filter(|p| *p != 0)
                    .ok_or_else(|| format!("`{text}`: bad port"))?;
                (host, Some(port))
            }
            None => (text, None),
        };
        let host = host.trim_end_matches('.').to_ascii_lowercase();
        if host.parse::<std::net::IpAddr>().is_ok() {
            return Err(format!("`{text}`: an IP address needs a port (IP:PORT)"));
        }
        let valid = !host.is_empty()
            && host.len() <= 253
            && host.split('.').all(|label| {
                !label.is_empty()
                    && label.len() <= 63
                    && label
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
            });
        if !valid {
            return Err(format!("`{text}`: not IP:PORT nor a host name"));
        }
        Ok(NextHop::Name { host, port })
    }
}

impl fmt::Display for NextHop {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NextHop::Addr(addr) => write!(f, "{addr}"),
            NextHop::Name {
                host,
                port: Some(port),
            } => write!(f, "{host}:{port}"),
            NextHop::Name { host, port: None } => f.write_str(host),
        }
    }
}

impl Serialize for NextHop {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for NextHop {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<NextHop, D::Error> {
        let text = String::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

/// A next hop with its transport: `[udp:|tcp:|tls:|ws:|wss:]` and an
/// address or a name (`tls:proxy.example.net`, `tcp:10.0.0.5:5060`,
/// `sip.example.net`); `ws:` and `wss:` may add the WebSocket resource
/// name (`ws:10.0.0.5:8080/sip`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TransportNextHop {
    /// The transport (UDP when no scheme is given).
    pub transport: ringway_sip::Transport,
    /// The address or the name.
    pub hop: NextHop,
    /// `ws:`/`wss:` only: the path of the upgrade request (`/sip`), if given.
    pub path: Option<String>,
}

impl FromStr for TransportNextHop {
    type Err = String;

    fn from_str(text: &str) -> Result<TransportNextHop, String> {
        let text = text.trim();
        let scheme = text.split_once(':').and_then(|(scheme, rest)| {
            ringway_sip::Transport::ALL
                .into_iter()
                .find(|t| t.name().eq_ignore_ascii_case(scheme))
                .map(|t| (t, rest))
        });
        let (transport, rest) = scheme.unwrap_or((ringway_sip::Transport::Udp, text));
        let websocket = matches!(
            transport,
            ringway_sip::Transport::Ws | ringway_sip::Transport::Wss
        );
        let (rest, path) = match rest.find('/') {
            Some(at) if websocket => {
                let path = &rest[at..];
                if !crate::sip::ws::valid_path(path) {
                    return Err(format!(
                        "`{text}`: the path must be / then at most 255 visible ASCII characters"
                    ));
                }
                (&rest[..at], Some(path.to_string()))
            }
            _ => (rest, None),
        };
        Ok(TransportNextHop {
            transport,
            hop: rest.parse()?,
            path,
        })
    }
}

impl fmt::Display for TransportNextHop {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.transport {
            ringway_sip::Transport::Udp => write!(f, "{}", self.hop)?,
            transport => write!(f, "{}:{}", transport.name(), self.hop)?,
        }
        f.write_str(self.path.as_deref().unwrap_or_default())
    }
}

impl Serialize for TransportNextHop {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for TransportNextHop {
    fn deserialize<D: serde::Deserializer<'de>>(
        deserializer: D,
    ) -> Result<TransportNextHop, D::Error> {
        let text = String::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_addresses_and_names() {
        assert_eq!(
            "127.0.0.1:5060".parse(),
            Ok(NextHop::Addr("127.0.0.1:5060".parse().unwrap()))
        );
        assert_eq!(
            "[::1]:5070".parse(),
            Ok(NextHop::Addr("[::1]:5070".parse().unwrap()))
        );
        assert_eq!(
            "Proxy.Example.net.".parse(),
            Ok(NextHop::Name {
                host: "proxy.example.net".into(),
                port: None
            })
        );
        let named: NextHop = "p.test:5080".parse().unwrap();
        assert_eq!(named.to_string(), "p.test:5080");
        let tls: TransportNextHop = "TLS:Proxy.test".parse().unwrap();
        assert_eq!(tls.transport, ringway_sip::Transport::Tls);
        assert_eq!(tls.to_string(), "tls:proxy.test");
        let plain: TransportNextHop = "p.test:5080".parse().unwrap();
        assert_eq!(plain.transport, ringway_sip::Transport::Udp);
        assert_eq!(plain.to_string(), "p.test:5080");
        let addr: TransportNextHop = "tcp:[::1]:5070".parse().unwrap();
        assert_eq!(addr.hop, NextHop::Addr("[::1]:5070".parse().unwrap()));
        let ws: TransportNextHop = "ws:[::1]:8080/sip".parse().unwrap();
        assert_eq!(ws.hop, NextHop::Addr("[::1]:8080".parse().unwrap()));
        assert_eq!(ws.path.as_deref(), Some("/sip"));
        assert_eq!(ws.to_string(), "ws:[::1]:8080/sip");
        let wss: TransportNextHop = "wss:127.0.0.1:443".parse().unwrap();
        assert_eq!(wss.path, None);
        assert!("tcp:127.0.0.1:5060/sip"
            .parse::<TransportNextHop>()
            .is_err());
        assert!("ws:127.0.0.1:80/a b".parse::<TransportNextHop>().is_err());
        for bad in [
            "",
            "127.0.0.1",
            "a..b",
            "p.test:0",
            "p.test:x",
            "a b",
            "-:1:2",
        ] {
            assert!(bad.parse::<NextHop>().is_err(), "{bad}");
        }
    }
}
