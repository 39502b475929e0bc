//! Thin, checked wrappers over the libc calls the backends and probes share:
//! socket options, socket addresses, control messages, polling.

use crate::time::Nanos;
use std::io;
use std::mem::{size_of, zeroed};
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::os::fd::RawFd;
use std::time::Duration;

// Constants spelled out here (x86_64/aarch64 Linux values) so the crate does
// not depend on which of them a given libc release exports.
/// `SO_TIMESTAMPING` (old layout; identical to the new one on 64-bit).
pub(crate) const SO_TIMESTAMPING: libc::c_int = 37;
/// `SCM_TIMESTAMPING` control message type.
pub(crate) const SCM_TIMESTAMPING: libc::c_int = SO_TIMESTAMPING;
/// `SO_RXQ_OVFL`: per-datagram socket drop counter as a control message.
pub(crate) const SO_RXQ_OVFL: libc::c_int = 40;
/// `SO_RCVBUFFORCE` (needs CAP_NET_ADMIN).
pub(crate) const SO_RCVBUFFORCE: libc::c_int = 33;
/// `SO_SNDBUFFORCE` (needs CAP_NET_ADMIN).
pub(crate) const SO_SNDBUFFORCE: libc::c_int = 32;
/// `SO_MEMINFO`: socket memory counters, including drops.
pub(crate) const SO_MEMINFO: libc::c_int = 55;
/// Index of the drop counter in the `SO_MEMINFO` array.
pub(crate) const SK_MEMINFO_DROPS: usize = 8;
/// `UDP_SEGMENT` (UDP GSO segment size).
pub(crate) const UDP_SEGMENT: libc::c_int = 103;
/// `UDP_GRO`.
pub(crate) const UDP_GRO: libc::c_int = 104;
/// `SOL_UDP`.
pub(crate) const SOL_UDP: libc::c_int = 17;

/// `SOF_TIMESTAMPING_TX_SOFTWARE`.
pub(crate) const SOF_TX_SOFTWARE: u32 = 1 << 1;
/// `SOF_TIMESTAMPING_RX_SOFTWARE`.
pub(crate) const SOF_RX_SOFTWARE: u32 = 1 << 3;
/// `SOF_TIMESTAMPING_SOFTWARE` (report software stamps).
pub(crate) const SOF_SOFTWARE: u32 = 1 << 4;
/// `SOF_TIMESTAMPING_OPT_ID`.
pub(crate) const SOF_OPT_ID: u32 = 1 << 7;
/// `SOF_TIMESTAMPING_OPT_TSONLY`.
pub(crate) const SOF_OPT_TSONLY: u32 = 1 << 11;
/// `SO_EE_ORIGIN_TIMESTAMPING`.
pub(crate) const SO_EE_ORIGIN_TIMESTAMPING: u8 = 4;
/// `SO_EE_ORIGIN_ICMP`: an ICMP error for a datagram we sent (IP_RECVERR).
pub(crate) const SO_EE_ORIGIN_ICMP: u8 = 2;
/// `SO_EE_ORIGIN_ICMP6`: an ICMPv6 error (IPV6_RECVERR).
pub(crate) const SO_EE_ORIGIN_ICMP6: u8 = 3;

/// Last OS error as `io::Error`.
pub(crate) fn last_err() -> io::Error {
    io::Error::last_os_error()
}

/// A libc return type whose negative values (the `-1` of a failed call)
/// mean "see errno": `c_int`, `ssize_t` and `c_long` (from `syscall(2)`).
pub(crate) trait SysRet: Copy {
    /// The call failed.
    fn failed(self) -> bool;
}

macro_rules! sys_ret {
    ($($t:ty),*) => {$(
        impl SysRet for $t {
            #[inline]
            fn failed(self) -> bool {
                self < 0
            }
        }
    )*};
}
sys_ret!(i32, i64, isize);

/// The one check of a libc return code (the `syscall!` of mio, std's
/// `cvt`): a negative `rc` becomes `Err(io::Error::last_os_error())`, any
/// other value is returned. Call it on the value straight from the call,
/// before anything else can touch errno. The call itself stays in the
/// caller's own `unsafe` block, next to its `// SAFETY:` comment.
#[inline]
pub(crate) fn cvt<T: SysRet>(rc: T) -> io::Result<T> {
    if rc.failed() {
        Err(io::Error::last_os_error())
    } else {
        Ok(rc)
    }
}

/// Set an integer socket option.
pub(crate) fn setsockopt_int(
    fd: RawFd,
    level: libc::c_int,
    name: libc::c_int,
    val: libc::c_int,
) -> io::Result<()> {
    // SAFETY: the value pointer and length describe a live c_int on the stack.
    cvt(unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            (&val as *const libc::c_int).cast(),
            size_of::<libc::c_int>() as libc::socklen_t,
        )
    })?;
    Ok(())
}

/// Read an integer socket option.
pub(crate) fn getsockopt_int(fd: RawFd, level: libc::c_int, name: libc::c_int) -> io::Result<i32> {
    let mut val: libc::c_int = 0;
    let mut len = size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: value pointer and in/out length describe a live c_int.
    cvt(unsafe {
        libc::getsockopt(
            fd,
            level,
            name,
            (&mut val as *mut libc::c_int).cast(),
            &mut len,
        )
    })?;
    Ok(val)
}

/// Read and clear a pending socket error (`SO_ERROR`), e.g. ECONNREFUSED on
/// a connected UDP socket; without this, poll keeps reporting POLLERR.
pub(crate) fn take_socket_error(fd: RawFd) -> Option<i32> {
    getsockopt_int(fd, libc::SOL_SOCKET, libc::SO_ERROR)
        .ok()
        .filter(|&e| e != 0)
}

/// An asynchronous error a receive or send call can report for an earlier
/// send (ICMP feedback on a connected socket, or on any socket with
/// `IP_RECVERR`: unreachable, time exceeded, protocol unreachable,
/// parameter problem, administratively prohibited); it says nothing about
/// this call's datagram.
pub(crate) fn is_async_send_error(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(
            libc::ECONNREFUSED
                | libc::EHOSTUNREACH
                | libc::ENETUNREACH
                | libc::EHOSTDOWN
                | libc::ENONET
                | libc::ENOPROTOOPT
                | libc::EPROTO
                | libc::EACCES
        )
    )
}

/// Current drop counter of a socket (`SO_MEMINFO[SK_MEMINFO_DROPS]`).
pub(crate) fn socket_drop_count(fd: RawFd) -> io::Result<u64> {
    let mut vals = [0u32; 16];
    let mut len = std::mem::size_of_val(&vals) as libc::socklen_t;
    // SAFETY: buffer pointer and in/out length describe a live, writable u32 array.
    cvt(unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            SO_MEMINFO,
            vals.as_mut_ptr().cast(),
            &mut len,
        )
    })?;
    if (len as usize) < (SK_MEMINFO_DROPS + 1) * 4 {
        return Err(io::Error::other(
            "SO_MEMINFO too short for the drop counter",
        ));
    }
    Ok(vals[SK_MEMINFO_DROPS] as u64)
}

/// Encode `addr` into a `sockaddr_storage`; returns the length to pass.
pub(crate) fn sockaddr_from(
    addr: &SocketAddr,
    out: &mut libc::sockaddr_storage,
) -> libc::socklen_t {
    match addr {
        SocketAddr::V4(a) => {
            // SAFETY: sockaddr_storage is larger than and suitably aligned for sockaddr_in.
            let sin =
                unsafe { &mut *(out as *mut libc::sockaddr_storage).cast::<libc::sockaddr_in>() };
            sin.sin_family = libc::AF_INET as libc::sa_family_t;
            sin.sin_port = a.port().to_be();
            sin.sin_addr = libc::in_addr {
                s_addr: u32::from_ne_bytes(a.ip().octets()),
            };
            sin.sin_zero = [0; 8];
            size_of::<libc::sockaddr_in>() as libc::socklen_t
        }
        SocketAddr::V6(a) => {
            // SAFETY: sockaddr_storage is larger than and suitably aligned for sockaddr_in6.
            let sin6 =
                unsafe { &mut *(out as *mut libc::sockaddr_storage).cast::<libc::sockaddr_in6>() };
            sin6.sin6_family = libc::AF_INET6 as libc::sa_family_t;
            sin6.sin6_port = a.port().to_be();
            sin6.sin6_flowinfo = a.flowinfo();
            sin6.sin6_addr = libc::in6_addr {
                s6_addr: a.ip().octets(),
            };
            sin6.sin6_scope_id = a.scope_id();
            size_of::<libc::sockaddr_in6>() as libc::socklen_t
        }
    }
}

/// Decode a `sockaddr_storage` filled by the kernel.
pub(crate) fn sockaddr_to(st: &libc::sockaddr_storage, len: libc::socklen_t) -> Option<SocketAddr> {
    match st.ss_family as libc::c_int {
        libc::AF_INET if len as usize >= size_of::<libc::sockaddr_in>() => {
            // SAFETY: the family says the storage holds a sockaddr_in, and it is long enough.
            let sin =
                unsafe { &*(st as *const libc::sockaddr_storage).cast::<libc::sockaddr_in>() };
            Some(SocketAddr::V4(SocketAddrV4::new(
                Ipv4Addr::from(sin.sin_addr.s_addr.to_ne_bytes()),
                u16::from_be(sin.sin_port),
            )))
        }
        libc::AF_INET6 if len as usize >= size_of::<libc::sockaddr_in6>() => {
            // SAFETY: the family says the storage holds a sockaddr_in6, and it is long enough.
            let sin6 =
                unsafe { &*(st as *const libc::sockaddr_storage).cast::<libc::sockaddr_in6>() };
            Some(SocketAddr::V6(SocketAddrV6::new(
                Ipv6Addr::from(sin6.sin6_addr.s6_addr),
                u16::from_be(sin6.sin6_port),
                sin6.sin6_flowinfo,
                sin6.sin6_scope_id,
            )))
        }
        _ => None,
    }
}

/// A zeroed `sockaddr_storage`.
pub(crate) fn zero_storage() -> libc::sockaddr_storage {
    // SAFETY: sockaddr_storage is plain old data; all-zero is a valid value.
    unsafe { zeroed() }
}

/// Outcome of waiting on a socket.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum Ready {
    /// Data to read.
    Readable,
    /// Only the error queue has something (e.g. TX timestamps).
    ErrQueue,
    /// Timed out or interrupted.
    Nothing,
}

/// `ppoll` on `fds`, at most `timeout` (`None`: forever). Returns the
/// number of ready descriptors; 0 on timeout or when a signal interrupted.
pub(crate) fn ppoll(fds: &mut [libc::pollfd], timeout: Option<Duration>) -> io::Result<usize> {
    let timeout_spec = timeout.map(|t| libc::timespec {
        tv_sec: t.as_secs().min(i64::MAX as u64) as libc::time_t,
        tv_nsec: t.subsec_nanos() as libc::c_long,
    });
    let tsp = timeout_spec
        .as_ref()
        .map_or(std::ptr::null(), |t| t as *const libc::timespec);
    // SAFETY: `fds` is a live slice of pollfds of the given length; the
    // timespec pointer is null or points to a live value.
    let result = cvt(unsafe {
        libc::ppoll(
            fds.as_mut_ptr(),
            fds.len() as libc::nfds_t,
            tsp,
            std::ptr::null(),
        )
    });
    match result {
        Ok(n) => Ok(n as usize),
        Err(e) if e.kind() == io::ErrorKind::Interrupted => Ok(0),
        Err(e) => Err(e),
    }
}

/// Wait until `fd` is readable, at most `timeout` (`None`: forever).
pub(crate) fn wait_readable(fd: RawFd, timeout: Option<Duration>) -> io::Result<Ready> {
    let mut pfd = [libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    }];
    let ready = ppoll(&mut pfd, timeout)?;
    let pfd = pfd[0];
    if ready == 0 {
        return Ok(Ready::Nothing);
    }
    if pfd.revents & libc::POLLIN != 0 {
        Ok(Ready::Readable)
    } else if pfd.revents & libc::POLLERR != 0 {
        Ok(Ready::ErrQueue)
    } else if pfd.revents & libc::POLLNVAL != 0 {
        Err(io::Error::from_raw_os_error(libc::EBADF))
    } else {
        Ok(Ready::Readable)
    }
}

/// Space for the control messages one received datagram may carry
/// (SCM_TIMESTAMPING 48 bytes, SO_RXQ_OVFL 4 bytes, UDP_GRO 4 bytes,
/// IP_RECVERR ~32, with headers).
pub(crate) const CMSG_BUF_WORDS: usize = 32;

/// An 8-byte aligned control-message buffer.
pub(crate) type CmsgBuf = [u64; CMSG_BUF_WORDS];

/// What the control messages of one received message said.
#[derive(Copy, Clone, Debug, Default)]
pub(crate) struct Cmsgs {
    /// Software timestamp (SCM_TIMESTAMPING ts[0]), when present and nonzero.
    pub sw_stamp: Option<Nanos>,
    /// SO_RXQ_OVFL counter value.
    pub rxq_ovfl: Option<u32>,
    /// A timestamping extended error's key (ee_data) from the error queue.
    pub ts_key: Option<u32>,
    /// UDP_GRO: the message is a coalesced train of datagrams of this size.
    pub gro_size: Option<u16>,
    /// An extended error from the error queue that is not a TX timestamp
    /// (an ICMP error, or a local one).
    pub error: Option<ExtendedError>,
}

/// The parts of a `sock_extended_err` the error queue reader uses.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct ExtendedError {
    /// The errno the kernel mapped it to.
    pub errno: u32,
    /// `SO_EE_ORIGIN_*`.
    pub origin: u8,
    /// ICMP or ICMPv6 type and code (for the ICMP origins).
    pub icmp_type: u8,
    pub icmp_code: u8,
}

/// Parse the control messages a kernel left in `hdr`.
pub(crate) fn parse_cmsgs(hdr: &libc::msghdr) -> Cmsgs {
    let mut out = Cmsgs::default();
    // SAFETY: `hdr` was filled by a successful recvmsg/recvmmsg, so its control
    // pointer/length describe the kernel-written, aligned buffer we supplied;
    // CMSG_FIRSTHDR/NXTHDR stay inside msg_controllen.
    unsafe {
        let mut cmsg = libc::CMSG_FIRSTHDR(hdr);
        while !cmsg.is_null() {
            let level = (*cmsg).cmsg_level;
            let cmsg_type = (*cmsg).cmsg_type;
            let data = libc::CMSG_DATA(cmsg);
            let data_len = ((*cmsg).cmsg_len as usize).saturating_sub(libc::CMSG_LEN(0) as usize);
            if level == libc::SOL_SOCKET && cmsg_type == SCM_TIMESTAMPING && data_len >= 16 {
                let stamp: libc::timespec = std::ptr::read_unaligned(data.cast());
                if stamp.tv_sec != 0 || stamp.tv_nsec != 0 {
                    out.sw_stamp = Some(Nanos(
                        stamp.tv_sec as u64 * 1_000_000_000 + stamp.tv_nsec as u64,
                    ));
                }
            } else if level == libc::SOL_SOCKET && cmsg_type == SO_RXQ_OVFL && data_len >= 4 {
                out.rxq_ovfl = Some(std::ptr::read_unaligned(data.cast::<u32>()));
            } else if level == SOL_UDP && cmsg_type == UDP_GRO && data_len >= 4 {
                let size = std::ptr::read_unaligned(data.cast::<libc::c_int>());
                out.gro_size = u16::try_from(size).ok().filter(|&s| s > 0);
            } else if ((level == libc::SOL_IP && cmsg_type == libc::IP_RECVERR)
                || (level == libc::SOL_IPV6 && cmsg_type == libc::IPV6_RECVERR))
                && data_len >= size_of::<libc::sock_extended_err>()
            {
                let extended_err: libc::sock_extended_err = std::ptr::read_unaligned(data.cast());
                if extended_err.ee_errno == libc::ENOMSG as u32
                    && extended_err.ee_origin == SO_EE_ORIGIN_TIMESTAMPING
                {
                    out.ts_key = Some(extended_err.ee_data);
                } else {
                    out.error = Some(ExtendedError {
                        errno: extended_err.ee_errno,
                        origin: extended_err.ee_origin,
                        icmp_type: extended_err.ee_type,
                        icmp_code: extended_err.ee_code,
                    });
                }
            }
            cmsg = libc::CMSG_NXTHDR(hdr, cmsg);
        }
    }
    out
}

/// `SCM_TS_OPT_ID` (Linux 6.13+): the OPT_ID key for this one datagram.
pub(crate) const SCM_TS_OPT_ID: libc::c_int = 81;

/// Write a SOL_SOCKET/SO_TIMESTAMPING control message requesting a
/// software TX timestamp into `buf`, followed by `SCM_TS_OPT_ID` with
/// `key` when given; returns the control length to use.
pub(crate) fn write_tx_stamp_cmsg(buf: &mut CmsgBuf, key: Option<u32>) -> usize {
    // SAFETY: `buf` is 8-byte aligned and 256 bytes long, far more than
    // 2 * CMSG_SPACE(4); we build the headers through a msghdr that points
    // at it, and CMSG_NXTHDR stays inside the declared length.
    unsafe {
        let one = libc::CMSG_SPACE(4) as usize;
        let space = if key.is_some() { 2 * one } else { one };
        buf[..space.div_ceil(8)].fill(0);
        let mut hdr: libc::msghdr = zeroed();
        hdr.msg_control = buf.as_mut_ptr().cast();
        hdr.msg_controllen = space as _;
        let cmsg = libc::CMSG_FIRSTHDR(&hdr);
        (*cmsg).cmsg_level = libc::SOL_SOCKET;
        (*cmsg).cmsg_type = SO_TIMESTAMPING;
        (*cmsg).cmsg_len = libc::CMSG_LEN(4) as _;
        std::ptr::write_unaligned(libc::CMSG_DATA(cmsg).cast::<u32>(), SOF_TX_SOFTWARE);
        if let Some(key) = key {
            let cmsg = libc::CMSG_NXTHDR(&hdr, cmsg);
            (*cmsg).cmsg_level = libc::SOL_SOCKET;
            (*cmsg).cmsg_type = SCM_TS_OPT_ID;
            (*cmsg).cmsg_len = libc::CMSG_LEN(4) as _;
            std::ptr::write_unaligned(libc::CMSG_DATA(cmsg).cast::<u32>(), key);
        }
        space
    }
}

/// Write one SOL_UDP/UDP_SEGMENT control message (UDP GSO: the payload is
/// cut into datagrams of `seg` bytes) into `buf`; returns the control length.
pub(crate) fn write_gso_cmsg(buf: &mut CmsgBuf, seg: u16) -> usize {
    // SAFETY: `buf` is 8-byte aligned and 256 bytes long, far more than
    // CMSG_SPACE(2); we build the header through a msghdr that points at it.
    unsafe {
        let space = libc::CMSG_SPACE(2) as usize;
        let mut hdr: libc::msghdr = zeroed();
        hdr.msg_control = buf.as_mut_ptr().cast();
        hdr.msg_controllen = space as _;
        let cmsg = libc::CMSG_FIRSTHDR(&hdr);
        (*cmsg).cmsg_level = SOL_UDP;
        (*cmsg).cmsg_type = UDP_SEGMENT;
        (*cmsg).cmsg_len = libc::CMSG_LEN(2) as _;
        std::ptr::write_unaligned(libc::CMSG_DATA(cmsg).cast::<u16>(), seg);
        space
    }
}

/// A memory mapping (anonymous, or of a kernel object), unmapped on drop.
pub(crate) struct Mapping {
    pub(crate) ptr: *mut u8,
    pub(crate) len: usize,
}

impl Mapping {
    /// An anonymous private read/write mapping (page aligned, zeroed).
    pub(crate) fn anon(len: usize) -> io::Result<Mapping> {
        // SAFETY: anonymous private mapping with no address hint; checked below.
        let mapping = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if mapping == libc::MAP_FAILED {
            return Err(last_err());
        }
        Ok(Mapping {
            ptr: mapping.cast(),
            len,
        })
    }

    /// A shared read/write mapping of `len` bytes of `fd` at offset `pgoff`
    /// (a ring the kernel created on that descriptor), pre-faulted.
    pub(crate) fn shared(fd: RawFd, len: usize, pgoff: i64) -> io::Result<Mapping> {
        // SAFETY: shared mapping of an object the kernel created on `fd`; the
        // caller passes the length the kernel reported; checked below.
        let mapping = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_POPULATE,
                fd,
                pgoff,
            )
        };
        if mapping == libc::MAP_FAILED {
            return Err(last_err());
        }
        Ok(Mapping {
            ptr: mapping.cast(),
            len,
        })
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: unmapping exactly the mapping created in the constructor.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cvt_maps_a_failing_call_to_its_errno() {
        // SAFETY: closing fd -1 touches no descriptor; it only fails.
        let e = cvt(unsafe { libc::close(-1) }).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EBADF));
        // ssize_t (isize) and syscall(2)'s c_long (i64) results too.
        let mut b = [0u8; 1];
        // SAFETY: reading into a live 1-byte buffer from a bad descriptor.
        let e = cvt(unsafe { libc::read(-1, b.as_mut_ptr().cast(), 1) }).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EBADF));
        // SAFETY: close(-1) through syscall(2): no descriptor is touched.
        let e = cvt(unsafe { libc::syscall(libc::SYS_close, -1) }).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EBADF));
    }

    #[test]
    fn cvt_passes_success_values_through() {
        assert_eq!(cvt(0i32).unwrap(), 0);
        assert_eq!(cvt(7isize).unwrap(), 7);
        assert_eq!(cvt(i64::MAX).unwrap(), i64::MAX);
        // A real call: open a socket, then close it, both through cvt.
        // SAFETY: plain socket(2) call; the descriptor is ours.
        let fd = cvt(unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM, 0) }).unwrap();
        assert!(fd >= 0);
        // SAFETY: closing the descriptor socket(2) just gave us.
        assert_eq!(cvt(unsafe { libc::close(fd) }).unwrap(), 0);
    }
}
