//! TUN devices: a network interface whose "wire" is a file descriptor.
//!
//! [`Tun::open`] creates a layer-3 device (`IFF_TUN | IFF_NO_PI`: every
//! `read` returns one IP packet the kernel routed to the device, every
//! `write` hands one IP packet to the kernel as if it had arrived on the
//! device). The device is created in the network namespace of the calling
//! thread (the one `/dev/net/tun` is opened from), so a caller that wants
//! it inside a namespace opens it from a thread that entered it (e.g.
//! [`crate::netns::Host::run`]); the descriptor keeps working from any
//! thread. No offloads are requested (`TUNSETOFFLOAD` is never called), so
//! the sending kernel segments TCP to the MTU before the device and every
//! read is one wire-sized packet. The device disappears when the
//! descriptor is closed (it is not made persistent).
//!
//! The descriptor is non-blocking; [`wait_readable`] waits for several
//! descriptors with a nanosecond timeout (`ppoll`).

use crate::sys::cvt;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

/// `TUNSETIFF` = `_IOW('T', 202, int)`.
const TUNSETIFF: libc::c_ulong = 0x4004_54ca;
/// `IFF_TUN`: layer-3 device.
const IFF_TUN: libc::c_short = 0x0001;
/// `IFF_NO_PI`: no 4-byte packet-information prefix on reads and writes.
const IFF_NO_PI: libc::c_short = 0x1000;
/// Longest interface name (`IFNAMSIZ` - 1).
pub const MAX_NAME_LEN: usize = 15;

/// `struct ifreq` as `TUNSETIFF` reads it: the name, then the flags in the union.
#[repr(C)]
struct IfReqFlags {
    name: [u8; 16],
    flags: libc::c_short,
    _union_rest: [u8; 22],
}

/// An open TUN device (layer 3, no packet-information header).
#[derive(Debug)]
pub struct Tun {
    fd: OwnedFd,
    name: String,
}

impl Tun {
    /// Create the TUN device `name` in the calling thread's network
    /// namespace and open it non-blocking. Names are 1-15 bytes of ASCII
    /// letters, digits, `-`, `_` or `.`.
    pub fn open(name: &str) -> io::Result<Tun> {
        if name.is_empty()
            || name.len() > MAX_NAME_LEN
            || !name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
        {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("bad TUN device name {name:?}"),
            ));
        }
        // SAFETY: open with a NUL-terminated constant path; the returned fd
        // is checked before use and owned by `OwnedFd` from here on.
        let raw = cvt(unsafe {
            libc::open(
                c"/dev/net/tun".as_ptr(),
                libc::O_RDWR | libc::O_NONBLOCK | libc::O_CLOEXEC,
            )
        })?;
        // SAFETY: `raw` is a freshly opened descriptor nobody else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let mut req = IfReqFlags {
            name: [0; 16],
            flags: IFF_TUN | IFF_NO_PI,
            _union_rest: [0; 22],
        };
        req.name[..name.len()].copy_from_slice(name.as_bytes());
        // SAFETY: TUNSETIFF reads (and writes back the final name into) a
        // live `struct ifreq`-shaped buffer of the kernel's size (40 bytes).
        cvt(unsafe { libc::ioctl(fd.as_raw_fd(), TUNSETIFF as _, &mut req as *mut IfReqFlags) })?;
        let end = req.name.iter().position(|&b| b == 0).unwrap_or(16);
        Ok(Tun {
            fd,
            name: String::from_utf8_lossy(&req.name[..end]).into_owned(),
        })
    }

    /// The interface name the kernel gave the device.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Read one packet into `buf`: `Ok(Some(len))`, or `Ok(None)` when no
    /// packet is waiting. A packet longer than `buf` is cut (the kernel
    /// drops the rest); callers size `buf` to the MTU or more.
    pub fn read(&self, buf: &mut [u8]) -> io::Result<Option<usize>> {
        // SAFETY: read into a live, writable buffer of the given length.
        let result = unsafe { libc::read(self.fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
        match cvt(result) {
            Ok(n) => Ok(Some(n as usize)),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Hand one IP packet to the kernel as received on this device. The
    /// kernel processes it (up to the socket) before `write` returns, in
    /// the writer's context, so packets reach TCP in the order written.
    pub fn write(&self, packet: &[u8]) -> io::Result<()> {
        // SAFETY: write from a live buffer of the given length.
        let result =
            unsafe { libc::write(self.fd.as_raw_fd(), packet.as_ptr().cast(), packet.len()) };
        let written = cvt(result)?;
        if written as usize != packet.len() {
            return Err(io::Error::new(
                io::ErrorKind::WriteZero,
                "TUN write took part of a packet",
            ));
        }
        Ok(())
    }
}

impl AsRawFd for Tun {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

/// Wait until at least one of `fds` is readable or `timeout` passes
/// (`None`: no limit). Returns a bit mask: bit `i` set when `fds[i]` is
/// readable (or reports an error or hang-up, which a read then returns).
/// At most 64 descriptors.
pub fn wait_readable(fds: &[RawFd], timeout: Option<Duration>) -> io::Result<u64> {
    if fds.len() > 64 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "wait_readable takes at most 64 descriptors",
        ));
    }
    let mut p = [libc::pollfd {
        fd: -1,
        events: 0,
        revents: 0,
    }; 64];
    for (slot, &fd) in p.iter_mut().zip(fds) {
        slot.fd = fd;
        slot.events = libc::POLLIN;
    }
    crate::sys::ppoll(&mut p[..fds.len()], timeout)?;
    let mut mask = 0u64;
    for (i, slot) in p[..fds.len()].iter().enumerate() {
        if slot.revents != 0 {
            mask |= 1 << i;
        }
    }
    Ok(mask)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_checked_before_any_system_call() {
        for bad in ["", "a-name-longer-than-15", "sp ace", "sl/ash"] {
            let e = Tun::open(bad).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{bad:?}");
        }
        assert_eq!(size_of::<IfReqFlags>(), 40);
    }

    #[test]
    fn too_many_descriptors_is_an_error() {
        let fds = [0; 65];
        assert!(wait_readable(&fds, Some(Duration::ZERO)).is_err());
    }
}
