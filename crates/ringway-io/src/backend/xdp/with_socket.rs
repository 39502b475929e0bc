//! The AF_XDP backend for a server that also sends through the kernel: the
//! backend and a second handle of its companion UDP socket (bound to the
//! same address and port), for threads that do not own the XSK rings
//! (a SIP proxy's timer and store threads send retransmissions and
//! deferred answers through it; the kernel resolves their neighbours).

use super::{XdpBackend, XdpConfig};
use std::io;
use std::net::UdpSocket;

/// [`XdpBackend::open`], plus a clone of the companion socket (non-blocking,
/// the same open file: what either receives is read by whoever reads
/// first, so only the backend's thread should receive on it).
pub(crate) fn open(cfg: XdpConfig) -> io::Result<(XdpBackend, UdpSocket)> {
    let backend = XdpBackend::open(cfg)?;
    let socket = backend.sock.try_clone()?;
    Ok((backend, socket))
}
