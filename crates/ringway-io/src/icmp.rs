//! ICMP errors for datagrams a socket sent, as the kernel reports them on
//! the socket's error queue with `IP_RECVERR` / `IPV6_RECVERR`
//! ([`crate::SocketConfig::recv_errors`]), and which of them say that the
//! destination cannot take the datagram.
//!
//! An unconnected UDP socket hears nothing of an ICMP error without these
//! options: a SIP proxy sending to a next hop whose port is closed learns
//! it only at its transaction timeout (RFC 3261 timer B/F, 32 s). With
//! them, the kernel queues each error with the original destination
//! (`msg_name`: the address and port of the datagram the ICMP message
//! quotes) and a `sock_extended_err` (origin, type, code, errno). The
//! backends read the queue ([`crate::BatchIo::poll_unreachable`]) and keep
//! the errors that RFC 3261 18.4 calls transport failures: host, network,
//! port or protocol unreachable and parameter problems. Time exceeded,
//! source quench and "fragmentation needed"/"packet too big" (path MTU)
//! say nothing about the destination taking the datagram and are only
//! counted ([`crate::IoStats::icmp_ignored`]).
//!
//! What an ICMP error tells is only as good as its source: anyone on the
//! path (or anyone who can guess the addresses and ports) can forge one.
//! A report names no more than the destination the kernel matched it to;
//! what a caller does with it must not send anything anywhere new.

use crate::sys::{ExtendedError, SO_EE_ORIGIN_ICMP, SO_EE_ORIGIN_ICMP6};
use std::net::SocketAddr;

/// ICMP type "destination unreachable".
const ICMP_DEST_UNREACH: u8 = 3;
/// ICMP code "fragmentation needed" (path MTU, not unreachability).
const ICMP_FRAG_NEEDED: u8 = 4;
/// ICMP type "parameter problem".
const ICMP_PARAMETERPROB: u8 = 12;
/// ICMPv6 type "destination unreachable".
const ICMP6_DST_UNREACH: u8 = 1;
/// ICMPv6 type "parameter problem".
const ICMP6_PARAMPROB: u8 = 4;

/// An ICMP error saying that a datagram this socket sent to `destination`
/// could not be delivered (RFC 3261 18.4: a transport failure).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct IcmpUnreachable {
    /// Where the datagram was going: the destination address and port the
    /// kernel took from the quoted datagram (an IPv4-mapped IPv6 address
    /// is given as IPv4).
    pub destination: SocketAddr,
    /// The errno the kernel maps the error to (`ECONNREFUSED` for a port
    /// unreachable, `EHOSTUNREACH`, `ENETUNREACH`, `ENOPROTOOPT`, `EPROTO`, ...).
    pub errno: i32,
    /// The ICMP (IPv4) or ICMPv6 (IPv6 destination) type.
    pub icmp_type: u8,
    /// The ICMP or ICMPv6 code.
    pub icmp_code: u8,
}

impl IcmpUnreachable {
    /// The report for an error-queue message with extended error `error`
    /// about a datagram to `destination`, if it is one RFC 3261 18.4 counts
    /// as a transport failure; `None` for every other error (time
    /// exceeded, source quench, path MTU, local errors).
    pub(crate) fn from_error(
        error: &ExtendedError,
        destination: SocketAddr,
    ) -> Option<IcmpUnreachable> {
        let unreachable = match error.origin {
            SO_EE_ORIGIN_ICMP => match error.icmp_type {
                ICMP_DEST_UNREACH => error.icmp_code != ICMP_FRAG_NEEDED,
                ICMP_PARAMETERPROB => true,
                _ => false,
            },
            SO_EE_ORIGIN_ICMP6 => {
                matches!(error.icmp_type, ICMP6_DST_UNREACH | ICMP6_PARAMPROB)
            }
            _ => false,
        };
        unreachable.then(|| IcmpUnreachable {
            destination: unmapped(destination),
            errno: i32::try_from(error.errno).unwrap_or(i32::MAX),
            icmp_type: error.icmp_type,
            icmp_code: error.icmp_code,
        })
    }
}

/// `addr` with an IPv4-mapped IPv6 address given as IPv4 (what a caller
/// sent to, over a dual-stack socket).
fn unmapped(addr: SocketAddr) -> SocketAddr {
    match addr {
        SocketAddr::V6(v6) => match v6.ip().to_ipv4_mapped() {
            Some(v4) => SocketAddr::new(v4.into(), v6.port()),
            None => addr,
        },
        v4 => v4,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn error(origin: u8, icmp_type: u8, icmp_code: u8) -> ExtendedError {
        ExtendedError {
            errno: libc::ECONNREFUSED as u32,
            origin,
            icmp_type,
            icmp_code,
        }
    }

    #[test]
    fn only_unreachability_counts_as_a_transport_failure() {
        let to: SocketAddr = "192.0.2.7:5060".parse().unwrap();
        let counts = |e: ExtendedError| IcmpUnreachable::from_error(&e, to).is_some();
        // Port (3), host (1), network (0) unreachable; parameter problem.
        for code in [0, 1, 2, 3, 13] {
            assert!(counts(error(SO_EE_ORIGIN_ICMP, 3, code)), "code {code}");
        }
        assert!(counts(error(SO_EE_ORIGIN_ICMP, 12, 0)));
        // Fragmentation needed, time exceeded (11), source quench (4).
        assert!(!counts(error(SO_EE_ORIGIN_ICMP, 3, 4)));
        assert!(!counts(error(SO_EE_ORIGIN_ICMP, 11, 0)));
        assert!(!counts(error(SO_EE_ORIGIN_ICMP, 4, 0)));
        // ICMPv6: unreachable (port: code 4) and parameter problem count;
        // packet too big (2) and time exceeded (3) do not.
        assert!(counts(error(SO_EE_ORIGIN_ICMP6, 1, 4)));
        assert!(counts(error(SO_EE_ORIGIN_ICMP6, 4, 1)));
        assert!(!counts(error(SO_EE_ORIGIN_ICMP6, 2, 0)));
        assert!(!counts(error(SO_EE_ORIGIN_ICMP6, 3, 0)));
        // A local error (origin 1) and a timestamp (origin 4) are no ICMP.
        assert!(!counts(error(1, 3, 3)));
        assert!(!counts(error(4, 3, 3)));
    }

    #[test]
    fn a_mapped_destination_is_reported_as_ipv4() {
        let mapped: SocketAddr = "[::ffff:192.0.2.7]:5060".parse().unwrap();
        let report = IcmpUnreachable::from_error(&error(SO_EE_ORIGIN_ICMP, 3, 3), mapped).unwrap();
        assert_eq!(report.destination, "192.0.2.7:5060".parse().unwrap());
        assert_eq!(report.errno, libc::ECONNREFUSED);
        let v6: SocketAddr = "[2001:db8::7]:5060".parse().unwrap();
        let report = IcmpUnreachable::from_error(&error(SO_EE_ORIGIN_ICMP6, 1, 4), v6).unwrap();
        assert_eq!(report.destination, v6);
    }
}
