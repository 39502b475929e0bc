//! RFC 5626 flow tokens: our Record-Route and Path towards a registered
//! flow carry the flow, so that requests later in the dialog (Record-Route)
//! or from the registrar behind us (Path) reach a phone behind NAT, or a
//! browser whose Contact names a `.invalid` host, over the same flow (5.3),
//! whatever its Contact says.
//!
//! A token is base64url: transport, address, port and connection of the
//! flow, then a 64-bit MAC under the proxy's key. In our Record-Route it
//! is the URI parameter `ob-flow=<token>`; in our Path (an edge proxy in
//! front of a registrar, RFC 5626 5.1) it is the user part,
//! `sip:<token>@host:port;lr;ob`. The two are signed under different MAC
//! tweaks ([`TokenUse`]): a Record-Route token, which both ends of a
//! dialog see, is followed only within a dialog and is never a Path token.
//! Only a token we wrote is followed (a forged one would make us a relay to
//! any address); a token that does not decode or verify is ignored.

use super::Proxy;
use crate::transport::{FlowId, Hop, Transport};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// URI parameter of our Record-Route or Path carrying a flow token.
pub(super) const FLOW_PARAM: &str = "ob-flow";

/// Bytes of a token at most: transport, family, 16 address bytes, port,
/// connection, MAC.
const MAX_TOKEN_BYTES: usize = 1 + 1 + 16 + 2 + 8 + 8;
/// Characters of its base64url text at most.
pub(super) const MAX_TOKEN_CHARS: usize = MAX_TOKEN_BYTES.div_ceil(3) * 4;

const BASE64URL: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

/// Where a token is written, and so what it may be used for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum TokenUse {
    /// Our Record-Route (`ob-flow=`): followed by requests within the
    /// dialog.
    RecordRoute,
    /// The user part of our Path: followed by any request the registrar
    /// sends us for the binding, initial ones too.
    Path,
}

impl TokenUse {
    fn tweak(self) -> u64 {
        match self {
            TokenUse::RecordRoute => 0xF10_5626,
            TokenUse::Path => 0x0F10_5626_0A7E,
        }
    }
}

/// A flow token as text, on the stack.
pub(super) struct FlowToken {
    buf: [u8; MAX_TOKEN_CHARS],
    len: usize,
}

impl FlowToken {
    /// The base64url text.
    pub(super) fn as_str(&self) -> &str {
        std::str::from_utf8(&self.buf[..self.len]).unwrap_or("")
    }
}

fn transport_byte(transport: Transport) -> u8 {
    match transport {
        Transport::Udp => 0,
        Transport::Tcp => 1,
        Transport::Tls => 2,
        Transport::Ws => 3,
        Transport::Wss => 4,
    }
}

/// The flow's bytes without the MAC; returns the length used.
fn flow_bytes(hop: Hop, out: &mut [u8; MAX_TOKEN_BYTES]) -> usize {
    out[0] = transport_byte(hop.transport);
    let mut len = 2;
    match hop.addr.ip() {
        IpAddr::V4(ip) => {
            out[1] = 4;
            out[len..len + 4].copy_from_slice(&ip.octets());
            len += 4;
        }
        IpAddr::V6(ip) => {
            out[1] = 6;
            out[len..len + 16].copy_from_slice(&ip.octets());
            len += 16;
        }
    }
    out[len..len + 2].copy_from_slice(&hop.addr.port().to_be_bytes());
    len += 2;
    let flow = hop.flow.map_or(0, |f| f.0);
    out[len..len + 8].copy_from_slice(&flow.to_be_bytes());
    len + 8
}

fn encode(bytes: &[u8]) -> FlowToken {
    let mut token = FlowToken {
        buf: [0; MAX_TOKEN_CHARS],
        len: 0,
    };
    for chunk in bytes.chunks(3) {
        let mut group = [0u8; 3];
        group[..chunk.len()].copy_from_slice(chunk);
        let value = u32::from(group[0]) << 16 | u32::from(group[1]) << 8 | u32::from(group[2]);
        let chars = chunk.len() + 1;
        for i in 0..chars {
            let shift = 18 - 6 * i;
            token.buf[token.len] = BASE64URL[((value >> shift) & 0x3F) as usize];
            token.len += 1;
        }
    }
    token
}

/// The bytes of base64url `text` (unpadded), into `out`; `None` if it is
/// not base64url or too long.
fn decode(text: &[u8], out: &mut [u8; MAX_TOKEN_BYTES]) -> Option<usize> {
    if text.len() > MAX_TOKEN_CHARS || text.len() % 4 == 1 {
        return None;
    }
    let mut len = 0;
    for chunk in text.chunks(4) {
        let mut value = 0u32;
        for (i, &c) in chunk.iter().enumerate() {
            let digit = match c {
                b'A'..=b'Z' => c - b'A',
                b'a'..=b'z' => c - b'a' + 26,
                b'0'..=b'9' => c - b'0' + 52,
                b'-' => 62,
                b'_' => 63,
                _ => return None,
            };
            value |= u32::from(digit) << (18 - 6 * i);
        }
        let bytes = value.to_be_bytes();
        for &b in &bytes[1..chunk.len()] {
            *out.get_mut(len)? = b;
            len += 1;
        }
    }
    Some(len)
}

impl Proxy {
    /// The token naming flow `hop`, signed for `used`.
    pub(super) fn flow_token(&self, hop: Hop, used: TokenUse) -> FlowToken {
        let mut bytes = [0u8; MAX_TOKEN_BYTES];
        let len = flow_bytes(hop, &mut bytes);
        let mac = self.flow_mac(used, &bytes[..len]);
        bytes[len..len + 8].copy_from_slice(&mac.to_be_bytes());
        encode(&bytes[..len + 8])
    }

    /// The flow a token names, if we signed it for `used`.
    pub(super) fn flow_of_token(&self, text: &str, used: TokenUse) -> Option<Hop> {
        let mut bytes = [0u8; MAX_TOKEN_BYTES];
        let len = decode(text.as_bytes(), &mut bytes)?;
        let addr_len = match bytes.get(1)? {
            4 => 4,
            6 => 16,
            _ => return None,
        };
        let body = 2 + addr_len + 2 + 8;
        if len != body + 8 {
            return None;
        }
        // The MAC before anything is read from the body: a token we did
        // not sign must not steer a request to an address of its choosing.
        let mac = u64::from_be_bytes(bytes[body..body + 8].try_into().ok()?);
        if mac != self.flow_mac(used, &bytes[..body]) {
            return None;
        }
        let transport = match bytes[0] {
            0 => Transport::Udp,
            1 => Transport::Tcp,
            2 => Transport::Tls,
            3 => Transport::Ws,
            4 => Transport::Wss,
            _ => return None,
        };
        let ip = match addr_len {
            4 => IpAddr::V4(Ipv4Addr::from(<[u8; 4]>::try_from(&bytes[2..6]).ok()?)),
            _ => IpAddr::V6(Ipv6Addr::from(<[u8; 16]>::try_from(&bytes[2..18]).ok()?)),
        };
        let at = 2 + addr_len;
        let port = u16::from_be_bytes([bytes[at], bytes[at + 1]]);
        let flow = u64::from_be_bytes(bytes[at + 2..at + 10].try_into().ok()?);
        Some(Hop {
            addr: SocketAddr::new(ip, port),
            transport,
            flow: (flow != 0).then_some(FlowId(flow)),
        })
    }

    fn flow_mac(&self, used: TokenUse, bytes: &[u8]) -> u64 {
        // The flow tokens' own key, and the use first: a Record-Route token
        // must never verify as a Path token.
        self.keys
            .mac(crate::hash::Purpose::FlowToken)
            .u64(used.tweak())
            .raw(bytes)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proxy::ProxyConfig;

    #[test]
    fn tokens_round_trip_and_forgeries_are_refused() {
        let proxy = Proxy::new(ProxyConfig::default());
        let hops = [
            Hop::udp("192.0.2.7:40123".parse().unwrap()),
            Hop {
                addr: "[2001:db8::1]:5060".parse().unwrap(),
                transport: Transport::Tcp,
                flow: Some(FlowId(65_537)),
            },
        ];
        for (hop, used) in hops
            .into_iter()
            .flat_map(|hop| [(hop, TokenUse::RecordRoute), (hop, TokenUse::Path)])
        {
            let token = proxy.flow_token(hop, used);
            assert!(token.as_str().len() <= MAX_TOKEN_CHARS);
            assert_eq!(proxy.flow_of_token(token.as_str(), used), Some(hop));
            // Any one character changed: refused.
            let text = token.as_str().as_bytes().to_vec();
            for i in 0..text.len() {
                let mut bad = text.clone();
                bad[i] = if bad[i] == b'A' { b'B' } else { b'A' };
                let bad = String::from_utf8(bad).unwrap();
                assert_eq!(proxy.flow_of_token(&bad, used), None, "{bad}");
            }
            // Another proxy's key: refused.
            let mut other = Proxy::new(ProxyConfig::default());
            other.set_secret([9; 32]);
            assert_eq!(other.flow_of_token(token.as_str(), used), None);
        }
        for junk in ["", "A", "====", "é", &"A".repeat(200)] {
            assert_eq!(proxy.flow_of_token(junk, TokenUse::Path), None, "{junk}");
        }
    }

    /// A Record-Route token (seen by both ends of a dialog) is not a Path
    /// token (which lets an initial request reach the flow), nor the
    /// reverse.
    #[test]
    fn record_route_and_path_tokens_are_not_interchangeable() {
        let proxy = Proxy::new(ProxyConfig::default());
        let hop = Hop {
            addr: "127.0.0.1:40000".parse().unwrap(),
            transport: Transport::Wss,
            flow: Some(FlowId(7)),
        };
        let rr = proxy.flow_token(hop, TokenUse::RecordRoute);
        let path = proxy.flow_token(hop, TokenUse::Path);
        assert_ne!(rr.as_str(), path.as_str());
        assert_eq!(proxy.flow_of_token(rr.as_str(), TokenUse::Path), None);
        assert_eq!(
            proxy.flow_of_token(path.as_str(), TokenUse::RecordRoute),
            None
        );
    }
}
