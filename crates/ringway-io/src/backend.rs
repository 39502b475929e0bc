//! The batch I/O interface and backend selection.

use crate::batch::{RxBatch, TxBatch, TxStamp};
use std::io;
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::RawFd;
use std::time::Duration;

mod common;
mod mmsg;
mod socket;
mod uring;

pub use uring::UringConfig;

/// Which I/O path a backend uses.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BackendKind {
    /// poll + one recvfrom/sendto per datagram (the papers' baseline).
    Socket,
    /// recvmmsg/sendmmsg: one syscall per batch.
    Mmsg,
    /// io_uring: multishot recvmsg into a provided-buffer ring, one sendmsg
    /// SQE per datagram, one io_uring_enter per batch. Needs Linux 6.1+
    /// (see [`BackendKind::availability`]).
    Uring,
}

impl BackendKind {
    /// All backends this build knows, in report order. Not every kernel runs
    /// all of them: see [`BackendKind::availability`] and [`BackendKind::usable`].
    pub const ALL: &'static [BackendKind] =
        &[BackendKind::Socket, BackendKind::Mmsg, BackendKind::Uring];
    /// Short name used on the command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            BackendKind::Socket => "socket",
            BackendKind::Mmsg => "mmsg",
            BackendKind::Uring => "uring",
        }
    }

    /// Whether this kernel runs the backend (probed once per process, with
    /// a real ring and a loopback datagram); `Err` says why not.
    pub fn availability(self) -> Result<(), String> {
        match self {
            BackendKind::Socket | BackendKind::Mmsg => Ok(()),
            BackendKind::Uring => {
                static PROBE: std::sync::OnceLock<Result<(), String>> = std::sync::OnceLock::new();
                PROBE.get_or_init(uring::probe).clone()
            }
        }
    }

    /// The backends of [`BackendKind::ALL`] that work on this kernel.
    pub fn usable() -> Vec<BackendKind> {
        BackendKind::ALL
            .iter()
            .copied()
            .filter(|k| k.availability().is_ok())
            .collect()
    }
}

impl std::fmt::Display for BackendKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for BackendKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        BackendKind::ALL
            .iter()
            .copied()
            .find(|k| k.name() == s)
            .ok_or_else(|| format!("unknown backend {s:?} (known: socket, mmsg, uring)"))
    }
}

/// Counters a backend keeps about its own work.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct IoStats {
    /// Datagrams received.
    pub rx_packets: u64,
    /// Receive syscalls made (including those that returned nothing).
    pub rx_syscalls: u64,
    /// Datagrams handed to the kernel.
    pub tx_packets: u64,
    /// Send syscalls made.
    pub tx_syscalls: u64,
    /// Datagrams the kernel refused to send (counted, skipped).
    pub tx_errors: u64,
    /// Latest SO_RXQ_OVFL value: datagrams this socket dropped for lack of
    /// buffer, as of the most recent datagram that carried the counter (the
    /// kernel attaches it only once it is nonzero, to datagrams queued after
    /// a drop; [`crate::sock::socket_drops`] reads the live value).
    pub rx_dropped: u64,
    /// TX timestamp requests that will not produce a [`TxStamp`]: the socket
    /// was opened without [`crate::SocketConfig::tx_timestamps`], or the
    /// kernel never returned the stamp, or too many were pending.
    pub tx_stamps_lost: u64,
    /// io_uring: the provided-buffer ring ran dry (the multishot receive
    /// ended with ENOBUFS and was re-armed; datagrams waited in the socket).
    pub rx_nobufs: u64,
    /// io_uring: times the multishot receive was armed again after it ended
    /// (ENOBUFS, socket error, CQ overflow).
    pub rx_rearms: u64,
    /// Asynchronous socket errors (SO_ERROR, e.g. ECONNREFUSED after an ICMP
    /// port unreachable on a connected socket) consumed while waiting.
    pub socket_errors: u64,
}

/// Receive and send batches of datagrams on one UDP socket.
pub trait BatchIo: Send {
    /// Which backend this is.
    fn kind(&self) -> BackendKind;
    /// The socket's local address.
    fn local_addr(&self) -> io::Result<SocketAddr>;
    /// The socket's file descriptor (for counters and diagnostics).
    fn raw_fd(&self) -> RawFd;
    /// Clear `batch`, then fill it with up to `batch.capacity()` datagrams.
    /// Waits at most `timeout` for the first one (`None`: without limit);
    /// returns how many were received (0 on timeout or EINTR).
    fn recv_batch(&mut self, batch: &mut RxBatch, timeout: Option<Duration>) -> io::Result<usize>;
    /// Hand every entry of `batch` to the kernel; returns how many were
    /// accepted. Per-datagram refusals (ECONNREFUSED, EAGAIN, ...) are
    /// counted in [`IoStats::tx_errors`] and skipped, not returned as errors.
    fn send_batch(&mut self, batch: &TxBatch) -> io::Result<usize>;
    /// Move kernel TX timestamps collected so far (entries sent with
    /// [`TxBatch::request_stamp`]) into `out`; returns how many were added.
    fn poll_tx_stamps(&mut self, out: &mut Vec<TxStamp>) -> io::Result<usize>;
    /// Counters of this backend instance.
    fn stats(&self) -> IoStats;
}

/// Wrap a configured socket (see [`crate::open_udp`]) in the chosen backend.
/// The socket is switched to non-blocking mode. A backend this kernel cannot
/// run is an `Unsupported` error "<name> backend not available: <reason>".
pub fn open_backend(kind: BackendKind, sock: UdpSocket) -> io::Result<Box<dyn BatchIo>> {
    if kind == BackendKind::Uring {
        return open_uring(sock, UringConfig::default());
    }
    sock.set_nonblocking(true)?;
    let tx_stamps = tx_stamps_enabled(&sock);
    Ok(match kind {
        BackendKind::Socket => Box::new(socket::SocketBackend::new(sock, tx_stamps)),
        BackendKind::Mmsg => Box::new(mmsg::MmsgBackend::new(sock, tx_stamps)),
        BackendKind::Uring => unreachable!("handled above"),
    })
}

/// [`open_backend`] for [`BackendKind::Uring`] with explicit options.
pub fn open_uring(sock: UdpSocket, cfg: UringConfig) -> io::Result<Box<dyn BatchIo>> {
    if cfg.buffers == 0 || cfg.buffers > 32768 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "uring buffers must be 1..=32768",
        ));
    }
    BackendKind::Uring.availability().map_err(|why| {
        io::Error::new(
            io::ErrorKind::Unsupported,
            format!("uring backend not available: {why}"),
        )
    })?;
    sock.set_nonblocking(true)?;
    let tx_stamps = tx_stamps_enabled(&sock);
    Ok(Box::new(uring::UringBackend::new(sock, tx_stamps, cfg)))
}

/// The socket has SO_TIMESTAMPING with OPT_ID (set by `open_udp` when
/// `tx_timestamps` is on), which per-datagram stamp requests rely on.
fn tx_stamps_enabled(sock: &UdpSocket) -> bool {
    use std::os::fd::AsRawFd;
    crate::sys::getsockopt_int(
        sock.as_raw_fd(),
        libc::SOL_SOCKET,
        crate::sys::SO_TIMESTAMPING,
    )
    .map(|f| (f as u32) & crate::sys::SOF_OPT_ID != 0)
    .unwrap_or(false)
}
