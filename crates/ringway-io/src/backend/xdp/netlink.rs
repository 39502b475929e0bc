//! The kernel's forwarding decisions over rtnetlink, for the fast paths'
//! next hops: `RTM_GETROUTE` for one destination (what `ip route get`
//! asks: the kernel's FIB with its policy rules, answering the output
//! interface and the gateway, if any) and a dump of the neighbour table
//! (`RTM_GETNEIGH`, both families: `ip neigh show`).
//!
//! Requests for many destinations go out in one `send` (the kernel handles
//! each message of the buffer in turn and answers each with its sequence
//! number); replies are parsed with every length checked against the
//! buffer (a malformed message ends the walk, never a panic).

use crate::sys;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

const NLMSG_HDRLEN: usize = 16;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const NLM_F_REQUEST: u16 = 1;
const NLM_F_DUMP: u16 = 0x300;
const RTM_NEWROUTE: u16 = 24;
const RTM_GETROUTE: u16 = 26;
const RTM_NEWNEIGH: u16 = 28;
const RTM_GETNEIGH: u16 = 30;
const RTA_DST: u16 = 1;
const RTA_OIF: u16 = 4;
const RTA_GATEWAY: u16 = 5;
const NDA_DST: u16 = 1;
const NDA_LLADDR: u16 = 2;
const RTN_UNICAST: u8 = 1;
/// NUD_REACHABLE | NUD_STALE | NUD_DELAY | NUD_PROBE | NUD_NOARP |
/// NUD_PERMANENT: an entry with a usable link-layer address.
const NUD_VALID: u16 = 0x02 | 0x04 | 0x08 | 0x10 | 0x40 | 0x80;
/// Route requests per `send` (their replies must fit the receive buffer).
const CHUNK: usize = 32;

/// Where the kernel sends a datagram for one destination.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) struct Hop {
    /// Output interface.
    pub(crate) oif: u32,
    /// The gateway, or `None` for an on-link destination.
    pub(crate) gateway: Option<IpAddr>,
}

/// The answer to one route request: a unicast route, or none usable
/// (unreachable, local, broadcast, multicast, a blackhole, an error).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum RouteAnswer {
    Unicast(Hop),
    Unusable,
}

/// An rtnetlink socket of the calling thread's network namespace.
pub(crate) struct RouteSocket {
    fd: OwnedFd,
    seq: u32,
    buf: Vec<u8>,
}

fn family_of(ip: IpAddr) -> u8 {
    match ip {
        IpAddr::V4(_) => libc::AF_INET as u8,
        IpAddr::V6(_) => libc::AF_INET6 as u8,
    }
}

fn put_header(out: &mut Vec<u8>, len: usize, ty: u16, flags: u16, seq: u32) {
    out.extend_from_slice(&(len as u32).to_ne_bytes());
    out.extend_from_slice(&ty.to_ne_bytes());
    out.extend_from_slice(&flags.to_ne_bytes());
    out.extend_from_slice(&seq.to_ne_bytes());
    out.extend_from_slice(&0u32.to_ne_bytes());
}

/// Append an `RTM_GETROUTE` request for `dst` with sequence number `seq`.
pub(crate) fn encode_route_request(out: &mut Vec<u8>, dst: IpAddr, seq: u32) {
    let addr: Vec<u8> = match dst {
        IpAddr::V4(a) => a.octets().to_vec(),
        IpAddr::V6(a) => a.octets().to_vec(),
    };
    let attr_len = 4 + addr.len();
    let len = NLMSG_HDRLEN + 12 + attr_len;
    put_header(out, len, RTM_GETROUTE, NLM_F_REQUEST, seq);
    // struct rtmsg: family, dst_len, src_len, tos, table, protocol, scope,
    // type, flags.
    out.extend_from_slice(&[family_of(dst), (addr.len() * 8) as u8, 0, 0, 0, 0, 0, 0]);
    out.extend_from_slice(&0u32.to_ne_bytes());
    out.extend_from_slice(&(attr_len as u16).to_ne_bytes());
    out.extend_from_slice(&RTA_DST.to_ne_bytes());
    out.extend_from_slice(&addr);
}

/// Append an `RTM_GETNEIGH` dump request (every family) with `seq`.
pub(crate) fn encode_neigh_dump(out: &mut Vec<u8>, seq: u32) {
    put_header(
        out,
        NLMSG_HDRLEN + 12,
        RTM_GETNEIGH,
        NLM_F_REQUEST | NLM_F_DUMP,
        seq,
    );
    out.extend_from_slice(&[0u8; 12]); // struct ndmsg, AF_UNSPEC
}

/// One message of a netlink buffer: (type, flags, seq, payload).
type Message<'a> = (u16, u16, u32, &'a [u8]);

/// The messages of `buf`, up to the first malformed one.
pub(crate) fn messages(buf: &[u8]) -> impl Iterator<Item = Message<'_>> {
    let mut at = 0usize;
    std::iter::from_fn(move || {
        let rest = buf.get(at..)?;
        if rest.len() < NLMSG_HDRLEN {
            return None;
        }
        let len = u32::from_ne_bytes(rest[0..4].try_into().ok()?) as usize;
        if len < NLMSG_HDRLEN || len > rest.len() {
            return None;
        }
        let ty = u16::from_ne_bytes([rest[4], rest[5]]);
        let flags = u16::from_ne_bytes([rest[6], rest[7]]);
        let seq = u32::from_ne_bytes(rest[8..12].try_into().ok()?);
        at += (len + 3) & !3;
        Some((ty, flags, seq, &rest[NLMSG_HDRLEN..len]))
    })
}

/// The attributes (type, value) of `buf`, up to the first malformed one.
fn attributes(buf: &[u8]) -> impl Iterator<Item = (u16, &[u8])> {
    let mut at = 0usize;
    std::iter::from_fn(move || {
        let rest = buf.get(at..)?;
        if rest.len() < 4 {
            return None;
        }
        let len = u16::from_ne_bytes([rest[0], rest[1]]) as usize;
        if len < 4 || len > rest.len() {
            return None;
        }
        let ty = u16::from_ne_bytes([rest[2], rest[3]]) & 0x3fff;
        at += (len + 3) & !3;
        Some((ty, &rest[4..len]))
    })
}

fn ip_of(family: u8, value: &[u8]) -> Option<IpAddr> {
    match (i32::from(family), value.len()) {
        (libc::AF_INET, 4) => Some(IpAddr::V4(Ipv4Addr::from(<[u8; 4]>::try_from(value).ok()?))),
        (libc::AF_INET6, 16) => Some(IpAddr::V6(Ipv6Addr::from(
            <[u8; 16]>::try_from(value).ok()?,
        ))),
        _ => None,
    }
}

/// The route in an `RTM_NEWROUTE` payload.
pub(crate) fn parse_route(payload: &[u8]) -> RouteAnswer {
    if payload.len() < 12 || payload[7] != RTN_UNICAST {
        return RouteAnswer::Unusable;
    }
    let family = payload[0];
    let (mut oif, mut gateway) = (None, None);
    for (ty, value) in attributes(&payload[12..]) {
        match ty {
            RTA_OIF if value.len() == 4 => {
                oif = Some(u32::from_ne_bytes(value.try_into().expect("4 bytes")));
            }
            RTA_GATEWAY => gateway = ip_of(family, value),
            _ => {}
        }
    }
    match oif {
        Some(oif) => RouteAnswer::Unicast(Hop { oif, gateway }),
        None => RouteAnswer::Unusable,
    }
}

/// The entry in an `RTM_NEWNEIGH` payload: (interface, address, MAC) when
/// it has a usable Ethernet address.
pub(crate) fn parse_neigh(payload: &[u8]) -> Option<(u32, IpAddr, [u8; 6])> {
    if payload.len() < 12 {
        return None;
    }
    let family = payload[0];
    let ifindex = u32::from_ne_bytes(payload[4..8].try_into().ok()?);
    let state = u16::from_ne_bytes([payload[8], payload[9]]);
    if state & NUD_VALID == 0 {
        return None;
    }
    let (mut ip, mut mac) = (None, None);
    for (ty, value) in attributes(&payload[12..]) {
        match ty {
            NDA_DST => ip = ip_of(family, value),
            NDA_LLADDR if value.len() == 6 => mac = <[u8; 6]>::try_from(value).ok(),
            _ => {}
        }
    }
    let mac = mac.filter(|m| *m != [0; 6])?;
    Some((ifindex, ip?, mac))
}

impl RouteSocket {
    /// A `NETLINK_ROUTE` socket in the calling thread's namespace.
    pub(crate) fn open() -> io::Result<RouteSocket> {
        // SAFETY: plain socket(2) call.
        let raw = sys::cvt(unsafe {
            libc::socket(
                libc::AF_NETLINK,
                libc::SOCK_RAW | libc::SOCK_CLOEXEC,
                libc::NETLINK_ROUTE,
            )
        })?;
        // SAFETY: a new descriptor nobody else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: an all-zero sockaddr_nl is valid (pid 0: the kernel picks).
        let mut addr: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
        addr.nl_family = libc::AF_NETLINK as libc::sa_family_t;
        // SAFETY: pointer/length describe the live sockaddr_nl.
        sys::cvt(unsafe {
            libc::bind(
                raw,
                (&addr as *const libc::sockaddr_nl).cast(),
                std::mem::size_of::<libc::sockaddr_nl>() as u32,
            )
        })?;
        let timeout = libc::timeval {
            tv_sec: 0,
            tv_usec: 200_000,
        };
        // SAFETY: pointer/length describe the live timeval.
        sys::cvt(unsafe {
            libc::setsockopt(
                raw,
                libc::SOL_SOCKET,
                libc::SO_RCVTIMEO,
                (&timeout as *const libc::timeval).cast(),
                std::mem::size_of::<libc::timeval>() as u32,
            )
        })?;
        Ok(RouteSocket {
            fd,
            seq: 1,
            buf: vec![0u8; 64 * 1024],
        })
    }

    fn send(&self, request: &[u8]) -> io::Result<()> {
        // SAFETY: pointer/length describe the live request buffer; the
        // destination (the kernel) is the socket's default.
        let sent = sys::cvt(unsafe {
            libc::send(
                self.fd.as_raw_fd(),
                request.as_ptr().cast(),
                request.len(),
                0,
            )
        })?;
        if sent as usize != request.len() {
            return Err(io::Error::other("rtnetlink: short send"));
        }
        Ok(())
    }

    /// One datagram of replies into `self.buf`; its length.
    fn recv(&mut self) -> io::Result<usize> {
        // SAFETY: pointer/length describe the live receive buffer.
        let n = sys::cvt(unsafe {
            libc::recv(
                self.fd.as_raw_fd(),
                self.buf.as_mut_ptr().cast(),
                self.buf.len(),
                0,
            )
        })?;
        Ok(n as usize)
    }

    /// The kernel's route for each of `dsts`, in order.
    pub(crate) fn routes(&mut self, dsts: &[IpAddr]) -> io::Result<Vec<RouteAnswer>> {
        let mut answers = vec![RouteAnswer::Unusable; dsts.len()];
        for (chunk_at, chunk) in dsts.chunks(CHUNK).enumerate() {
            let base = self.seq;
            self.seq = self.seq.wrapping_add(CHUNK as u32 + 1);
            let mut request = Vec::with_capacity(chunk.len() * 40);
            for (k, &dst) in chunk.iter().enumerate() {
                encode_route_request(&mut request, dst, base.wrapping_add(k as u32));
            }
            self.send(&request)?;
            let mut left = chunk.len();
            while left > 0 {
                let n = self.recv()?;
                for (ty, _, seq, payload) in messages(&self.buf[..n]) {
                    let k = seq.wrapping_sub(base) as usize;
                    if k >= chunk.len() {
                        continue; // a late answer to an earlier request
                    }
                    let answer = match ty {
                        RTM_NEWROUTE => parse_route(payload),
                        NLMSG_ERROR => RouteAnswer::Unusable,
                        _ => continue,
                    };
                    answers[chunk_at * CHUNK + k] = answer;
                    left = left.saturating_sub(1);
                }
            }
        }
        Ok(answers)
    }

    /// Every usable neighbour entry (interface, address, MAC), both families.
    pub(crate) fn neighbours(&mut self) -> io::Result<Vec<(u32, IpAddr, [u8; 6])>> {
        let seq = self.seq;
        self.seq = self.seq.wrapping_add(1);
        let mut request = Vec::new();
        encode_neigh_dump(&mut request, seq);
        self.send(&request)?;
        let mut out = Vec::new();
        // Bounded: a dump ends with NLMSG_DONE; at most this many reads.
        for _ in 0..4096 {
            let n = self.recv()?;
            for (ty, _, got, payload) in messages(&self.buf[..n]) {
                if got != seq {
                    continue;
                }
                match ty {
                    RTM_NEWNEIGH => out.extend(parse_neigh(payload)),
                    NLMSG_DONE => return Ok(out),
                    NLMSG_ERROR => {
                        return Err(io::Error::other("rtnetlink: neighbour dump refused"))
                    }
                    _ => {}
                }
            }
        }
        Err(io::Error::other("rtnetlink: neighbour dump did not end"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attr(ty: u16, value: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(&((4 + value.len()) as u16).to_ne_bytes());
        out.extend_from_slice(&ty.to_ne_bytes());
        out.extend_from_slice(value);
        while out.len() % 4 != 0 {
            out.push(0);
        }
        out
    }

    fn message(ty: u16, seq: u32, payload: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        put_header(&mut out, NLMSG_HDRLEN + payload.len(), ty, 0, seq);
        out.extend_from_slice(payload);
        while out.len() % 4 != 0 {
            out.push(0);
        }
        out
    }

    #[test]
    fn route_replies_give_interface_and_gateway() {
        let mut payload = vec![libc::AF_INET as u8, 32, 0, 0, 254, 0, 0, RTN_UNICAST];
        payload.extend_from_slice(&0u32.to_ne_bytes());
        payload.extend(attr(RTA_DST, &[10, 77, 2, 2]));
        payload.extend(attr(RTA_OIF, &7u32.to_ne_bytes()));
        payload.extend(attr(RTA_GATEWAY, &[10, 77, 1, 2]));
        let buf = message(RTM_NEWROUTE, 5, &payload);
        let got: Vec<_> = messages(&buf).collect();
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].2, 5);
        assert_eq!(
            parse_route(got[0].3),
            RouteAnswer::Unicast(Hop {
                oif: 7,
                gateway: Some(IpAddr::V4(Ipv4Addr::new(10, 77, 1, 2)))
            })
        );
        // On-link IPv6: no gateway.
        let mut v6 = vec![libc::AF_INET6 as u8, 128, 0, 0, 254, 0, 0, RTN_UNICAST];
        v6.extend_from_slice(&0u32.to_ne_bytes());
        v6.extend(attr(RTA_OIF, &3u32.to_ne_bytes()));
        assert_eq!(
            parse_route(&v6),
            RouteAnswer::Unicast(Hop {
                oif: 3,
                gateway: None
            })
        );
        // Local, unreachable: not for the fast path.
        let mut local = payload.clone();
        local[7] = 2;
        assert_eq!(parse_route(&local), RouteAnswer::Unusable);
        // Cut anywhere: never a panic, never a wrong gateway.
        for cut in 0..buf.len() {
            for (_, _, _, p) in messages(&buf[..cut]) {
                let _ = parse_route(p);
            }
        }
    }

    #[test]
    fn neighbour_entries_need_a_valid_state_and_a_mac() {
        let entry = |state: u16, mac: &[u8]| {
            let mut p = vec![libc::AF_INET6 as u8, 0, 0, 0];
            p.extend_from_slice(&4u32.to_ne_bytes());
            p.extend_from_slice(&state.to_ne_bytes());
            p.extend_from_slice(&[0, 1]);
            let ip: Ipv6Addr = "fd77:1::2".parse().unwrap();
            p.extend(attr(NDA_DST, &ip.octets()));
            p.extend(attr(NDA_LLADDR, mac));
            p
        };
        let mac = [2, 0, 0, 0, 0, 9];
        assert_eq!(
            parse_neigh(&entry(0x04, &mac)),
            Some((4, "fd77:1::2".parse().unwrap(), mac))
        );
        assert_eq!(parse_neigh(&entry(0x01, &mac)), None, "incomplete");
        assert_eq!(parse_neigh(&entry(0x20, &mac)), None, "failed");
        assert_eq!(parse_neigh(&entry(0x02, &[0; 6])), None, "no address");
        assert_eq!(parse_neigh(&entry(0x02, &mac[..4])), None, "not Ethernet");
        let whole = entry(0x02, &mac);
        for cut in 0..whole.len() {
            let _ = parse_neigh(&whole[..cut]);
        }
    }

    #[test]
    fn requests_encode_as_ip_route_get_does() {
        let mut buf = Vec::new();
        encode_route_request(&mut buf, IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1)), 9);
        encode_route_request(&mut buf, "fd77::1".parse().unwrap(), 10);
        let got: Vec<_> = messages(&buf).collect();
        assert_eq!(got.len(), 2);
        assert_eq!((got[0].0, got[0].2), (RTM_GETROUTE, 9));
        assert_eq!(got[0].3[..2], [libc::AF_INET as u8, 32]);
        assert_eq!(got[1].3[..2], [libc::AF_INET6 as u8, 128]);
        let attrs: Vec<_> = attributes(&got[1].3[12..]).collect();
        assert_eq!(attrs.len(), 1);
        assert_eq!(attrs[0].0, RTA_DST);
        assert_eq!(attrs[0].1.len(), 16);
    }
}
