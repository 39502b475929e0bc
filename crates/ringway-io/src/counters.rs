//! Kernel UDP counters: `/proc/net/snmp` (+ `snmp6`) totals and the
//! per-socket rows of `/proc/net/udp` and `/proc/net/udp6`.
//!
//! All files are read through `/proc/thread-self/net/`, so a thread that
//! entered another network namespace sees that namespace's counters.

use std::io;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::os::fd::RawFd;

/// UDP totals of one network namespace (one address family).
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct UdpSnmp {
    /// Datagrams delivered to sockets.
    pub in_datagrams: u64,
    /// Datagrams to a port with no socket.
    pub no_ports: u64,
    /// Datagrams dropped on receive (includes buffer and checksum errors).
    pub in_errors: u64,
    /// Datagrams sent.
    pub out_datagrams: u64,
    /// Datagrams dropped because a socket receive buffer was full.
    pub rcvbuf_errors: u64,
    /// Datagrams dropped because a send buffer was full.
    pub sndbuf_errors: u64,
    /// Datagrams with a bad checksum.
    pub in_csum_errors: u64,
    /// Datagrams dropped on receive because UDP memory (`udp_mem`) was
    /// exhausted: counted apart from RcvbufErrors.
    pub mem_errors: u64,
}

impl UdpSnmp {
    /// Counter growth from `earlier` to `self` (saturating at zero).
    pub fn since(&self, earlier: &UdpSnmp) -> UdpSnmp {
        UdpSnmp {
            in_datagrams: self.in_datagrams.saturating_sub(earlier.in_datagrams),
            no_ports: self.no_ports.saturating_sub(earlier.no_ports),
            in_errors: self.in_errors.saturating_sub(earlier.in_errors),
            out_datagrams: self.out_datagrams.saturating_sub(earlier.out_datagrams),
            rcvbuf_errors: self.rcvbuf_errors.saturating_sub(earlier.rcvbuf_errors),
            sndbuf_errors: self.sndbuf_errors.saturating_sub(earlier.sndbuf_errors),
            in_csum_errors: self.in_csum_errors.saturating_sub(earlier.in_csum_errors),
            mem_errors: self.mem_errors.saturating_sub(earlier.mem_errors),
        }
    }

    fn set(&mut self, name: &str, v: u64) {
        match name {
            "InDatagrams" => self.in_datagrams = v,
            "NoPorts" => self.no_ports = v,
            "InErrors" => self.in_errors = v,
            "OutDatagrams" => self.out_datagrams = v,
            "RcvbufErrors" => self.rcvbuf_errors = v,
            "SndbufErrors" => self.sndbuf_errors = v,
            "InCsumErrors" => self.in_csum_errors = v,
            "MemErrors" => self.mem_errors = v,
            _ => {}
        }
    }
}

fn net_path(file: &str) -> String {
    format!("/proc/thread-self/net/{file}")
}

/// Parse the `Udp:` header/value line pair of `/proc/net/snmp` text.
pub fn parse_snmp_udp(text: &str) -> io::Result<UdpSnmp> {
    let mut lines = text.lines().filter(|l| l.starts_with("Udp:"));
    let (Some(head), Some(vals)) = (lines.next(), lines.next()) else {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "no Udp: lines in snmp",
        ));
    };
    let mut out = UdpSnmp::default();
    for (name, values) in head.split_whitespace().zip(vals.split_whitespace()).skip(1) {
        let values = values
            .parse::<u64>()
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("Udp {name}: {e}")))?;
        out.set(name, values);
    }
    Ok(out)
}

/// Parse the `Udp6*` lines of `/proc/net/snmp6` text.
pub fn parse_snmp6_udp(text: &str) -> io::Result<UdpSnmp> {
    let mut out = UdpSnmp::default();
    let mut seen = false;
    for l in text.lines() {
        let mut fields = l.split_whitespace();
        let (Some(name), Some(value)) = (fields.next(), fields.next()) else {
            continue;
        };
        if let Some(counter) = name.strip_prefix("Udp6") {
            if let Ok(value) = value.parse() {
                out.set(counter, value);
                seen = true;
            }
        }
    }
    if !seen {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "no Udp6 lines in snmp6",
        ));
    }
    Ok(out)
}

/// IPv4 UDP totals of the calling thread's network namespace.
pub fn udp_snmp() -> io::Result<UdpSnmp> {
    parse_snmp_udp(&std::fs::read_to_string(net_path("snmp"))?)
}

/// IPv6 UDP totals of the calling thread's network namespace.
pub fn udp6_snmp() -> io::Result<UdpSnmp> {
    parse_snmp6_udp(&std::fs::read_to_string(net_path("snmp6"))?)
}

/// One row of `/proc/net/udp` or `/proc/net/udp6`.
#[derive(Copy, Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct UdpSocketRow {
    /// Local address.
    pub local: SocketAddr,
    /// Remote address (unspecified when not connected).
    pub remote: SocketAddr,
    /// Bytes queued for sending.
    pub tx_queue: u64,
    /// Bytes queued for receiving.
    pub rx_queue: u64,
    /// Socket inode (matches `/proc/self/fd/N -> socket:[inode]`).
    pub inode: u64,
    /// Datagrams this socket dropped.
    pub drops: u64,
}

fn parse_hex_addr(s: &str) -> Option<SocketAddr> {
    let (addr_hex, port_hex) = s.split_once(':')?;
    let port = u16::from_str_radix(port_hex, 16).ok()?;
    match addr_hex.len() {
        8 => {
            // The kernel prints the network-order u32 as a host-order number.
            let word = u32::from_str_radix(addr_hex, 16).ok()?;
            Some(SocketAddr::V4(SocketAddrV4::new(
                Ipv4Addr::from(word.to_ne_bytes()),
                port,
            )))
        }
        32 => {
            let mut octets = [0u8; 16];
            for i in 0..4 {
                let word = u32::from_str_radix(&addr_hex[i * 8..i * 8 + 8], 16).ok()?;
                octets[i * 4..i * 4 + 4].copy_from_slice(&word.to_ne_bytes());
            }
            Some(SocketAddr::V6(SocketAddrV6::new(
                Ipv6Addr::from(octets),
                port,
                0,
                0,
            )))
        }
        _ => None,
    }
}

/// Parse the text of `/proc/net/udp` or `/proc/net/udp6` (bad rows are skipped).
pub fn parse_proc_udp(text: &str) -> Vec<UdpSocketRow> {
    let mut out = Vec::new();
    for l in text.lines().skip(1) {
        let fields: Vec<&str> = l.split_whitespace().collect();
        if fields.len() < 13 {
            continue;
        }
        let (Some(local), Some(remote)) = (parse_hex_addr(fields[1]), parse_hex_addr(fields[2]))
        else {
            continue;
        };
        let Some((txq, rxq)) = fields[4].split_once(':') else {
            continue;
        };
        let (Ok(tx_queue), Ok(rx_queue), Ok(inode), Ok(drops)) = (
            u64::from_str_radix(txq, 16),
            u64::from_str_radix(rxq, 16),
            fields[9].parse::<u64>(),
            fields[12].parse::<u64>(),
        ) else {
            continue;
        };
        out.push(UdpSocketRow {
            local,
            remote,
            tx_queue,
            rx_queue,
            inode,
            drops,
        });
    }
    out
}

/// All UDP sockets (IPv4 and IPv6) of the calling thread's network namespace.
pub fn udp_sockets() -> io::Result<Vec<UdpSocketRow>> {
    let mut rows = parse_proc_udp(&std::fs::read_to_string(net_path("udp"))?);
    if let Ok(text) = std::fs::read_to_string(net_path("udp6")) {
        rows.extend(parse_proc_udp(&text));
    }
    Ok(rows)
}

/// Inode number of the socket behind `fd` (from `/proc/self/fd/<fd>`).
pub fn socket_inode(fd: RawFd) -> io::Result<u64> {
    let link = std::fs::read_link(format!("/proc/self/fd/{fd}"))?;
    let target = link.to_string_lossy();
    target
        .strip_prefix("socket:[")
        .and_then(|r| r.strip_suffix(']'))
        .and_then(|n| n.parse().ok())
        .ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("fd {fd} is {target}, not a socket"),
            )
        })
}

/// Row of the socket behind `fd` in `/proc/net/udp{,6}` (matched by inode).
pub fn socket_row(fd: RawFd) -> io::Result<UdpSocketRow> {
    let ino = socket_inode(fd)?;
    udp_sockets()?
        .into_iter()
        .find(|r| r.inode == ino)
        .ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::NotFound,
                format!("inode {ino} not in /proc/net/udp"),
            )
        })
}

/// Drops of the socket behind `fd` as `/proc/net/udp{,6}` reports them.
pub fn socket_drops(fd: RawFd) -> io::Result<u64> {
    socket_row(fd).map(|r| r.drops)
}

/// Sum of drops of the UDP sockets (IPv4 and IPv6) bound to `port` on any
/// address in the calling thread's namespace.
pub fn socket_drops_by_port(port: u16) -> io::Result<u64> {
    Ok(udp_sockets()?
        .iter()
        .filter(|r| r.local.port() == port)
        .map(|r| r.drops)
        .sum())
}

/// Sum of drops of the sockets bound to `local` (several with SO_REUSEPORT).
pub fn socket_drops_by_addr(local: SocketAddr) -> io::Result<u64> {
    Ok(udp_sockets()?
        .iter()
        .filter(|r| r.local == local)
        .map(|r| r.drops)
        .sum())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_snmp() {
        let t = "Ip: Forwarding\nIp: 1\nUdp: InDatagrams NoPorts InErrors OutDatagrams RcvbufErrors SndbufErrors InCsumErrors IgnoredMulti MemErrors\nUdp: 10 2 3 40 5 6 7 0 9\nUdpLite: InDatagrams\nUdpLite: 0\n";
        let s = parse_snmp_udp(t).unwrap();
        assert_eq!(s.in_datagrams, 10);
        assert_eq!(s.no_ports, 2);
        assert_eq!(s.in_errors, 3);
        assert_eq!(s.out_datagrams, 40);
        assert_eq!(s.rcvbuf_errors, 5);
        assert_eq!(s.sndbuf_errors, 6);
        assert_eq!(s.in_csum_errors, 7);
        assert_eq!(s.mem_errors, 9);
        assert!(parse_snmp_udp("Ip: x\n").is_err());
    }

    #[test]
    fn parses_proc_udp() {
        let t = "   sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode ref pointer drops\n\
                 1: 0100007F:1F90 00000000:0000 07 00000000:00000300 00:00000000 00000000     0        0 12345 2 0000000000000000 17\n\
                 garbage\n";
        let r = parse_proc_udp(t);
        assert_eq!(r.len(), 1);
        assert_eq!(r[0].local, "127.0.0.1:8080".parse().unwrap());
        assert_eq!(r[0].rx_queue, 0x300);
        assert_eq!(r[0].inode, 12345);
        assert_eq!(r[0].drops, 17);
        let t6 = "hdr\n 0: 00000000000000000000000001000000:0035 00000000000000000000000000000000:0000 07 00000000:00000000 00:00000000 00000000 0 0 99 2 0000000000000000 3\n";
        let r = parse_proc_udp(t6);
        assert_eq!(r[0].local, "[::1]:53".parse().unwrap());
        assert_eq!(r[0].drops, 3);
    }

    #[test]
    fn live_counters_read() {
        let s = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        use std::os::fd::AsRawFd;
        let row = socket_row(s.as_raw_fd()).unwrap();
        assert_eq!(row.local, s.local_addr().unwrap());
        assert_eq!(row.drops, 0);
        udp_snmp().unwrap();
    }
}
