//! The batch I/O interface and backend selection.

use crate::batch::{RxBatch, TxBatch, TxStamp};
use crate::icmp::IcmpUnreachable;
use std::io;
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::RawFd;
use std::time::Duration;

mod choice;
mod common;
mod mmsg;
mod socket;
mod socket_state;
mod uring;
pub(crate) mod xdp;

pub use choice::{Io, IoChoiceError, OpenError, XdpInterface};
pub use uring::UringConfig;
#[doc(hidden)]
pub use xdp::frame_fuzzing;
pub use xdp::{
    attach_xdp_pass, disable_tx_checksum_offload, parse_rtnetlink_replies, FanoutRoute,
    FanoutStats, KernelFanout, NextHopRefresher, RtnetlinkReplies, XdpAttachment, XdpConfig,
    XdpMode, MAX_FANOUT,
};

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
    /// AF_XDP: an XDP program steers our UDP datagrams on one interface into
    /// an XSK socket (copy mode, generic XDP); frames are built and parsed
    /// in user space. IPv4 or IPv6 (one per socket), needs an interface: open it with
    /// [`open_xdp`], not [`open_backend`].
    Xdp,
}

impl BackendKind {
    /// All backends this build knows, in report order. Not every kernel runs
    /// all of them: see [`BackendKind::availability`] and [`BackendKind::usable`].
    /// These work on any UDP socket (loopback included); [`BackendKind::Xdp`]
    /// needs an interface and is listed in [`BackendKind::EVERY`] only.
    pub const ALL: &'static [BackendKind] =
        &[BackendKind::Socket, BackendKind::Mmsg, BackendKind::Uring];
    /// [`BackendKind::ALL`] plus the interface backends.
    pub const EVERY: &'static [BackendKind] = &[
        BackendKind::Socket,
        BackendKind::Mmsg,
        BackendKind::Uring,
        BackendKind::Xdp,
    ];
    /// Short name used on the command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            BackendKind::Socket => "socket",
            BackendKind::Mmsg => "mmsg",
            BackendKind::Uring => "uring",
            BackendKind::Xdp => "xdp",
        }
    }

    /// The backend attaches to a network interface ([`open_xdp`]) instead of
    /// wrapping a UDP socket.
    pub fn needs_interface(self) -> bool {
        self == BackendKind::Xdp
    }

    /// Whether this kernel runs the backend; `Err` says why not. Checked
    /// once per process, without side effects: whatever a check creates
    /// lives on descriptors that are closed before it returns, and no
    /// namespace, interface or route is created.
    ///
    /// * socket, mmsg: always available.
    /// * uring: sets up a ring with the flags the backend uses, registers a
    ///   provided-buffer ring and passes one datagram over loopback.
    /// * xdp: creates an AF_XDP socket, registers a small UMEM with its
    ///   rings, creates an XSKMAP and loads the XDP program (not attached).
    ///   Binding to an interface and attaching the program are not tried:
    ///   [`xdp_veth_probe`] does that, on a veth pair of its own.
    pub fn availability(self) -> Result<(), BackendUnavailable> {
        type Probe = std::sync::OnceLock<Result<(), BackendUnavailable>>;
        match self {
            BackendKind::Socket | BackendKind::Mmsg => Ok(()),
            BackendKind::Uring => {
                static PROBE: Probe = Probe::new();
                PROBE.get_or_init(uring::probe).clone()
            }
            BackendKind::Xdp => {
                static PROBE: Probe = Probe::new();
                PROBE.get_or_init(xdp::available).clone()
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
    type Err = ParseBackendError;
    /// One of the [`BackendKind::name`]s.
    fn from_str(s: &str) -> Result<Self, ParseBackendError> {
        BackendKind::EVERY
            .iter()
            .copied()
            .find(|k| k.name() == s)
            .ok_or_else(|| ParseBackendError {
                name: s.to_string(),
            })
    }
}

/// A backend this kernel (or this process's privileges) cannot run, from
/// [`BackendKind::availability`] or [`xdp_veth_probe`]. Displays as
/// "<kind> backend not available: <reason>".
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{kind} backend not available: {reason}")]
pub struct BackendUnavailable {
    /// The backend.
    pub kind: BackendKind,
    /// What failed: the step and what the kernel said (e.g.
    /// "io_uring_setup: EPERM (kernel.io_uring_disabled or seccomp forbids it)").
    pub reason: String,
    /// The errno of the refused step, when it was a refused system call.
    pub errno: Option<i32>,
}

impl BackendUnavailable {
    /// `kind` is unavailable because of `reason` (no errno).
    pub fn new(kind: BackendKind, reason: impl Into<String>) -> Self {
        BackendUnavailable {
            kind,
            reason: reason.into(),
            errno: None,
        }
    }
    /// The same, with the errno of the refused step.
    pub fn with_errno(mut self, errno: Option<i32>) -> Self {
        self.errno = errno;
        self
    }
}

impl From<BackendUnavailable> for io::Error {
    /// An `Unsupported` error that displays the same text.
    fn from(e: BackendUnavailable) -> io::Error {
        io::Error::new(io::ErrorKind::Unsupported, e)
    }
}

/// A name that is no [`BackendKind`].
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown backend {name:?} (known: socket, mmsg, uring, xdp)")]
pub struct ParseBackendError {
    /// The name given.
    pub name: String,
}

/// [`open_backend`] was asked for a backend that attaches to a network
/// interface ([`BackendKind::needs_interface`]); it is opened with
/// [`open_xdp`] and an interface name instead. Carried inside the
/// `InvalidInput` [`io::Error`] that [`open_backend`] returns.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{kind} backend needs an interface (open it with ringway_io::open_xdp)")]
pub struct NeedsInterface {
    /// The backend.
    pub kind: BackendKind,
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
    /// xdp: frames in the RX ring that were not a valid IPv4 UDP datagram
    /// for our address and port (bad length or checksum), dropped.
    pub rx_invalid: u64,
    /// xdp: datagrams received through the companion UDP socket (what the
    /// XDP program leaves to the kernel stack, e.g. IP fragments).
    pub rx_via_socket: u64,
    /// xdp: datagrams sent through the companion UDP socket because the
    /// destination's MAC address was not known yet.
    pub tx_via_socket: u64,
    /// Asynchronous socket errors (SO_ERROR, e.g. ECONNREFUSED after an ICMP
    /// port unreachable on a connected socket) consumed while waiting.
    pub socket_errors: u64,
    /// xdp: frames whose UDP checksum did not verify, dropped (also counted
    /// in `rx_invalid`).
    pub rx_bad_checksum: u64,
    /// xdp: copies written straight from a received frame into a TX frame.
    pub tx_from_rx_frame: u64,
    /// xdp: echoes sent by moving the received frame itself to the TX ring.
    pub tx_moved: u64,
    /// xdp: times the send path found no free TX frame or ring slot and
    /// waited for the kernel to complete frames (the TX ring was congested).
    pub tx_ring_full_waits: u64,
    /// xdp: copies dropped because the TX ring stayed full for the whole
    /// bounded wait (also counted in `tx_errors`).
    pub tx_ring_full_drops: u64,
    /// xdp: frames published in the TX ring that the kernel has not taken
    /// yet (not counted in `tx_packets` until it does).
    pub tx_in_ring: u64,
    /// socket, mmsg: waits for a datagram that ended because one was there
    /// (the backend was woken), not by their timeout.
    pub rx_wakeups: u64,
    /// Of `rx_wakeups`, those after which the receive found nothing:
    /// another backend on the same socket had taken the datagram (a
    /// needless wake-up; 0 with exclusive wake-up and idle waiters).
    pub rx_idle_wakeups: u64,
    /// ICMP errors read from the socket's error queue that say a
    /// destination cannot be reached ([`BatchIo::poll_unreachable`];
    /// socket, mmsg, uring with [`crate::SocketConfig::recv_errors`]).
    pub icmp_unreachable: u64,
    /// Other errors read from the error queue and not reported: time
    /// exceeded, source quench, path MTU, local errors.
    pub icmp_ignored: u64,
    /// Unreachable reports dropped because the caller had not taken them
    /// (more than a backend keeps, 1 024).
    pub icmp_lost: u64,
}

impl IoStats {
    /// Add the counters of `other` (another backend instance, e.g. another
    /// receive queue's) to these; `tx_in_ring`, a level, adds up too.
    pub fn add(&mut self, other: &IoStats) {
        let IoStats {
            rx_packets,
            rx_syscalls,
            tx_packets,
            tx_syscalls,
            tx_errors,
            rx_dropped,
            tx_stamps_lost,
            rx_nobufs,
            rx_rearms,
            rx_invalid,
            rx_via_socket,
            tx_via_socket,
            socket_errors,
            rx_bad_checksum,
            tx_from_rx_frame,
            tx_moved,
            tx_ring_full_waits,
            tx_ring_full_drops,
            tx_in_ring,
            rx_wakeups,
            rx_idle_wakeups,
            icmp_unreachable,
            icmp_ignored,
            icmp_lost,
        } = *other;
        self.rx_packets += rx_packets;
        self.rx_syscalls += rx_syscalls;
        self.tx_packets += tx_packets;
        self.tx_syscalls += tx_syscalls;
        self.tx_errors += tx_errors;
        self.rx_dropped += rx_dropped;
        self.tx_stamps_lost += tx_stamps_lost;
        self.rx_nobufs += rx_nobufs;
        self.rx_rearms += rx_rearms;
        self.rx_invalid += rx_invalid;
        self.rx_via_socket += rx_via_socket;
        self.tx_via_socket += tx_via_socket;
        self.socket_errors += socket_errors;
        self.rx_bad_checksum += rx_bad_checksum;
        self.tx_from_rx_frame += tx_from_rx_frame;
        self.tx_moved += tx_moved;
        self.tx_ring_full_waits += tx_ring_full_waits;
        self.tx_ring_full_drops += tx_ring_full_drops;
        self.tx_in_ring += tx_in_ring;
        self.rx_wakeups += rx_wakeups;
        self.rx_idle_wakeups += rx_idle_wakeups;
        self.icmp_unreachable += icmp_unreachable;
        self.icmp_ignored += icmp_ignored;
        self.icmp_lost += icmp_lost;
    }

    /// The counters accumulated since `start` (an earlier reading of the
    /// same backend), e.g. over a measured window after a warm-up. Counts
    /// are subtracted (saturating); `tx_in_ring`, a level, is taken as now.
    pub fn since(&self, start: &IoStats) -> IoStats {
        let d = |now: u64, then: u64| now.saturating_sub(then);
        IoStats {
            rx_packets: d(self.rx_packets, start.rx_packets),
            rx_syscalls: d(self.rx_syscalls, start.rx_syscalls),
            tx_packets: d(self.tx_packets, start.tx_packets),
            tx_syscalls: d(self.tx_syscalls, start.tx_syscalls),
            tx_errors: d(self.tx_errors, start.tx_errors),
            rx_dropped: d(self.rx_dropped, start.rx_dropped),
            tx_stamps_lost: d(self.tx_stamps_lost, start.tx_stamps_lost),
            rx_nobufs: d(self.rx_nobufs, start.rx_nobufs),
            rx_rearms: d(self.rx_rearms, start.rx_rearms),
            rx_invalid: d(self.rx_invalid, start.rx_invalid),
            rx_via_socket: d(self.rx_via_socket, start.rx_via_socket),
            tx_via_socket: d(self.tx_via_socket, start.tx_via_socket),
            socket_errors: d(self.socket_errors, start.socket_errors),
            rx_bad_checksum: d(self.rx_bad_checksum, start.rx_bad_checksum),
            tx_from_rx_frame: d(self.tx_from_rx_frame, start.tx_from_rx_frame),
            tx_moved: d(self.tx_moved, start.tx_moved),
            tx_ring_full_waits: d(self.tx_ring_full_waits, start.tx_ring_full_waits),
            tx_ring_full_drops: d(self.tx_ring_full_drops, start.tx_ring_full_drops),
            tx_in_ring: self.tx_in_ring,
            rx_wakeups: d(self.rx_wakeups, start.rx_wakeups),
            rx_idle_wakeups: d(self.rx_idle_wakeups, start.rx_idle_wakeups),
            icmp_unreachable: d(self.icmp_unreachable, start.icmp_unreachable),
            icmp_ignored: d(self.icmp_ignored, start.icmp_ignored),
            icmp_lost: d(self.icmp_lost, start.icmp_lost),
        }
    }
}

/// Progress of a backend with a transmit ring shared with the kernel, in
/// copies since it was opened (see [`BatchIo::tx_progress`]).
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct TxProgress {
    /// Copies the application is done with: published in the TX ring (the
    /// paper's "scheduled for transmission"), sent another way, or dropped.
    pub queued: u64,
    /// Of those, copies the kernel has taken from the ring (or that left
    /// by a send call, or were dropped): "handed to the kernel".
    pub handed: u64,
}

/// Receive and send batches of datagrams on one UDP socket.
pub trait BatchIo: Send {
    /// Which backend this is.
    fn kind(&self) -> BackendKind;
    /// The backend and the modes it runs in, for reports (default: the
    /// backend's name).
    fn describe(&self) -> String {
        self.kind().name().to_string()
    }
    /// The socket's local address.
    fn local_addr(&self) -> io::Result<SocketAddr>;
    /// The socket's file descriptor (for counters and diagnostics).
    fn raw_fd(&self) -> RawFd;
    /// Clear `batch`, then fill its `batch.capacity()` frames with datagrams
    /// (more datagrams than frames with [`BatchIo::set_gro`]).
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
    /// Move the ICMP errors read so far that say a destination cannot be
    /// reached ([`IcmpUnreachable`]: port, host, network or protocol
    /// unreachable, parameter problem) into `out`; returns how many were
    /// added. Needs a socket opened with
    /// [`crate::SocketConfig::recv_errors`]. The error queue is read here
    /// when something is queued (a send or receive call failed with a
    /// pending error, or the queue stopped at its per-call bound) or its
    /// period (10 ms) passed: call it regularly (a proxy every loop), so the
    /// queue, which is charged to the receive buffer, stays short. Reads of
    /// the error queue for TX stamps ([`BatchIo::poll_tx_stamps`], the wait
    /// for a datagram) keep what they find here, and this read files the
    /// stamps it finds. Default: nothing (backends without an error queue).
    fn poll_unreachable(&mut self, out: &mut Vec<IcmpUnreachable>) -> io::Result<usize> {
        let _ = out;
        Ok(0)
    }
    /// Counters of this backend instance.
    fn stats(&self) -> IoStats;
    /// Send runs of adjacent equal-length entries to one destination as one
    /// UDP GSO train (UDP_SEGMENT); returns whether coalescing is now on.
    /// Default: not supported (mmsg implements it).
    fn set_gso(&mut self, _on: bool) -> bool {
        false
    }
    /// Let the kernel deliver a UDP GSO train (or GRO-merged datagrams) as
    /// one message (UDP_GRO); the backend splits it into its datagrams, so
    /// one received frame may yield several entries of the [`RxBatch`].
    /// A train longer than a frame is cut: use frames of 64 KiB with GRO.
    /// Returns whether receive coalescing is now on. Default: not
    /// supported (mmsg implements it).
    fn set_gro(&mut self, _on: bool) -> bool {
        false
    }
    /// GSO and GRO counters (all zero for backends without [`BatchIo::set_gso`]
    /// and [`BatchIo::set_gro`]).
    fn gso_stats(&self) -> crate::batch::GsoStats {
        crate::batch::GsoStats::default()
    }
    /// Queue one copy of `data` for each of `dsts`, in order. `data` is
    /// datagram `index` of the batch the last [`BatchIo::recv_batch`] filled
    /// (`None`: not a received datagram, e.g. a control reply).
    ///
    /// Default (socket, mmsg, uring): push the copies into `tx`, handing
    /// `tx` to [`BatchIo::send_batch`] first when it is full; the copies
    /// leave at the next [`BatchIo::flush`]. A backend with a shared TX ring
    /// (xdp) writes them straight from the received frame into TX frames
    /// and publishes them at once (the echo — a destination equal to the
    /// datagram's sender — by moving the received frame), and leaves `tx`
    /// alone; see [`BatchIo::tx_progress`].
    fn replicate(
        &mut self,
        index: Option<usize>,
        data: &[u8],
        dsts: &[SocketAddr],
        tx: &mut TxBatch,
    ) -> io::Result<()> {
        let _ = index;
        queue_copies(self, data, dsts, tx)
    }
    /// Hand everything queued to the kernel: [`BatchIo::send_batch`] of `tx`
    /// (then cleared) by default; xdp kicks its TX ring (bounded: frames the
    /// kernel has not taken stay queued and are not counted as sent).
    fn flush(&mut self, tx: &mut TxBatch) -> io::Result<()> {
        if !tx.is_empty() {
            self.send_batch(tx)?;
            tx.clear();
        }
        Ok(())
    }
    /// For a backend whose [`BatchIo::replicate`] queues into a ring shared
    /// with the kernel: copies queued and handed over so far, so the caller
    /// can tell when a given copy was scheduled and when the kernel took it.
    /// `None` (default): copies are queued and handed to the kernel together,
    /// when the send call that carries them returns.
    fn tx_progress(&self) -> Option<TxProgress> {
        None
    }
    /// Something queued still waits for the kernel (`flush` again later).
    fn tx_pending(&self) -> bool {
        self.tx_progress().is_some_and(|p| p.handed < p.queued)
    }
}

/// [`BatchIo::replicate`]'s default: push one copy per destination into
/// `tx`, flushing it first when it is full.
pub(crate) fn queue_copies<B: BatchIo + ?Sized>(
    io: &mut B,
    data: &[u8],
    dsts: &[SocketAddr],
    tx: &mut TxBatch,
) -> io::Result<()> {
    for &dst in dsts {
        if tx.push(dst, data).is_err() {
            io.flush(tx)?;
            tx.push(dst, data).map_err(|_| {
                io::Error::new(
                    io::ErrorKind::InvalidInput,
                    "datagram larger than a send frame",
                )
            })?;
        }
    }
    Ok(())
}

/// Wrap a configured socket (see [`crate::open_udp`]) in the chosen backend.
/// The socket is switched to non-blocking mode. A backend this kernel cannot
/// run is an `Unsupported` error carrying a [`BackendUnavailable`]
/// ("<name> backend not available: <reason>"); an interface backend is an
/// `InvalidInput` error carrying a [`NeedsInterface`].
pub fn open_backend(kind: BackendKind, sock: UdpSocket) -> io::Result<Box<dyn BatchIo>> {
    if kind.needs_interface() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            NeedsInterface { kind },
        ));
    }
    if kind == BackendKind::Uring {
        return open_uring(sock, UringConfig::default());
    }
    let tx_stamps = tx_stamps_enabled(&sock);
    let stamps = if tx_stamps {
        common::TxStamps::single()
    } else {
        common::TxStamps::default()
    };
    open_with_stamps(kind, sock, tx_stamps, stamps, UringConfig::default(), false)
}

/// Open `kind` on `sock` with its handle on the socket's stamp book;
/// `shared`: other backends receive on the socket too (their waits are
/// exclusive, see [`open_shared`]).
fn open_with_stamps(
    kind: BackendKind,
    sock: UdpSocket,
    tx_stamps: bool,
    stamps: common::TxStamps,
    cfg: UringConfig,
    shared: bool,
) -> io::Result<Box<dyn BatchIo>> {
    sock.set_nonblocking(true)?;
    Ok(match kind {
        BackendKind::Socket => {
            Box::new(socket::SocketBackend::new(sock, tx_stamps, stamps, shared))
        }
        BackendKind::Mmsg => Box::new(mmsg::MmsgBackend::new(sock, tx_stamps, stamps, shared)),
        BackendKind::Uring => Box::new(uring::UringBackend::new(sock, tx_stamps, stamps, cfg)),
        BackendKind::Xdp => {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                NeedsInterface { kind },
            ))
        }
    })
}

/// Open `backends` backends of `kind` on one socket, each on its own dup
/// of the descriptor: the shared receive model, where every worker
/// receives from the one socket as Kamailio's children do. The socket and
/// mmsg backends wait with exclusive wake-up (one idle backend is woken
/// per datagram, [`IoStats::rx_wakeups`]); TX stamps are told apart per
/// backend with a key of its own on every stamped datagram
/// (`SCM_TS_OPT_ID`, Linux 6.13+). On an older kernel the socket's one
/// key counter cannot be followed by two senders: with `backends` > 1
/// stamp requests are then counted lost ([`IoStats::tx_stamps_lost`]).
/// `backends` is 1..=256.
pub fn open_shared(
    kind: BackendKind,
    sock: UdpSocket,
    backends: usize,
) -> io::Result<Vec<Box<dyn BatchIo>>> {
    if backends == 0 || backends > common::MAX_OWNERS {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("backends on one socket must be 1..={}", common::MAX_OWNERS),
        ));
    }
    if kind.needs_interface() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            NeedsInterface { kind },
        ));
    }
    kind.availability()?;
    let explicit = common::explicit_keys_supported();
    let tx_stamps = tx_stamps_enabled(&sock) && (explicit || backends == 1);
    let book = common::StampBook::new(backends, explicit);
    let mut socks = (1..backends)
        .map(|_| sock.try_clone())
        .collect::<io::Result<Vec<_>>>()?;
    socks.insert(0, sock);
    socks
        .into_iter()
        .enumerate()
        .map(|(owner, sock)| {
            let stamps = common::TxStamps::owner(book.clone(), owner);
            open_with_stamps(
                kind,
                sock,
                tx_stamps,
                stamps,
                UringConfig::default(),
                backends > 1,
            )
        })
        .collect()
}

/// Whether this kernel takes a TX timestamp key per datagram
/// (`SCM_TS_OPT_ID`, Linux 6.13+), which [`open_shared`] needs to tell
/// several backends' stamps apart. Probed once over loopback.
pub fn per_datagram_stamp_keys() -> bool {
    common::explicit_keys_supported()
}

/// [`open_backend`] for [`BackendKind::Uring`] with explicit options.
pub fn open_uring(sock: UdpSocket, cfg: UringConfig) -> io::Result<Box<dyn BatchIo>> {
    if cfg.buffers == 0 || cfg.buffers > 32768 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "uring buffers must be 1..=32768",
        ));
    }
    BackendKind::Uring.availability()?;
    let tx_stamps = tx_stamps_enabled(&sock);
    let stamps = if tx_stamps {
        common::TxStamps::single()
    } else {
        common::TxStamps::default()
    };
    open_with_stamps(BackendKind::Uring, sock, tx_stamps, stamps, cfg, false)
}

/// Open the AF_XDP backend on `cfg.ifname` (in the calling thread's network
/// namespace; needs CAP_NET_ADMIN and CAP_BPF/CAP_SYS_ADMIN). It binds a
/// regular UDP socket to `cfg.local` too (port 0: any), attaches the XDP
/// program, and detaches it when dropped. Bad options are `InvalidInput`;
/// anything the kernel refuses carries a [`BackendUnavailable`] and reads
/// "xdp backend not available: <step>: <errno>".
pub fn open_xdp(cfg: XdpConfig) -> io::Result<Box<dyn BatchIo>> {
    match xdp::XdpBackend::open(cfg) {
        Ok(b) => Ok(Box::new(b)),
        Err(e) => Err(xdp_open_error(e)),
    }
}

/// [`open_xdp`], and a second handle of the backend's companion UDP socket
/// (bound to `cfg.local`, non-blocking) for threads that send through the
/// kernel while the backend's own thread owns the XSK rings (a server's
/// timer thread). Only the backend's thread should receive on it. Errors
/// as [`open_xdp`]'s.
pub fn open_xdp_with_socket(cfg: XdpConfig) -> io::Result<(Box<dyn BatchIo>, UdpSocket)> {
    match xdp::with_socket::open(cfg) {
        Ok((b, socket)) => Ok((Box::new(b), socket)),
        Err(e) => Err(xdp_open_error(e)),
    }
}

/// The AF_XDP backend on every receive queue of an interface
/// ([`open_xdp_queues`]).
pub struct XdpQueues {
    /// One backend per receive queue, in queue order, each with its own
    /// AF_XDP socket, UMEM and rings (move each to its own thread). The
    /// first also receives what the kernel stack delivers to the companion
    /// UDP socket (IP fragments); the others only send through it.
    pub backends: Vec<Box<dyn BatchIo>>,
    /// The queue each backend is bound to.
    pub queues: Vec<u32>,
    /// Another handle of the companion UDP socket (bound to the listen
    /// address, non-blocking), for a thread that sends through the kernel.
    /// Only the first backend receives on it.
    pub socket: UdpSocket,
    /// With several queues: the backends' next hops (routes and neighbour
    /// entries read once for all of them, not by each backend). One thread
    /// must poll it every few milliseconds ([`NextHopRefresher::poll`]);
    /// until it has read, every copy goes through the companion socket.
    /// `None` with one queue: that backend reads its own.
    pub next_hops: Option<NextHopRefresher>,
}

/// Receive queues of interface `ifname` (in the calling thread's network
/// namespace), as ethtool reports its channels (RX-only plus combined); a
/// driver that does not tell counts as one.
pub fn xdp_rx_queues(ifname: &str) -> io::Result<u32> {
    xdp::rx_queue_count(ifname)
}

/// [`open_xdp`] on every receive queue of `cfg.ifname` ([`xdp_rx_queues`];
/// `cfg.queue` is ignored): one AF_XDP socket per queue, all in one XSKMAP
/// that the steering program indexes by `rx_queue_index`, so whatever
/// queue the NIC's hashing (RSS) puts a datagram on, it reaches an XSK and
/// not the kernel path. At most 64 queues. Errors as [`open_xdp`]'s.
pub fn open_xdp_queues(cfg: XdpConfig) -> io::Result<XdpQueues> {
    let count = xdp::rx_queue_count(&cfg.ifname).map_err(xdp_open_error)?;
    if count as usize > xdp::MAX_QUEUES {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "xdp backend: {} has {count} receive queues, at most {} are bound",
                cfg.ifname,
                xdp::MAX_QUEUES
            ),
        ));
    }
    let queues: Vec<u32> = (0..count).collect();
    match xdp::XdpBackend::open_queues(cfg, &queues) {
        Ok((backends, socket, next_hops)) => Ok(XdpQueues {
            backends: backends
                .into_iter()
                .map(|b| Box::new(b) as Box<dyn BatchIo>)
                .collect(),
            queues,
            socket,
            next_hops,
        }),
        Err(e) => Err(xdp_open_error(e)),
    }
}

/// Bad options stay `InvalidInput` ("xdp backend: ..."); what the kernel
/// refused carries a [`BackendUnavailable`].
fn xdp_open_error(e: io::Error) -> io::Error {
    if e.kind() == io::ErrorKind::InvalidInput {
        return io::Error::new(io::ErrorKind::InvalidInput, format!("xdp backend: {e}"));
    }
    io::Error::new(
        e.kind(),
        BackendUnavailable::new(BackendKind::Xdp, e.to_string()).with_errno(e.raw_os_error()),
    )
}

/// Whether this kernel creates AF_XDP sockets at all: creates one and
/// closes it. The first step of [`BackendKind::availability`] of
/// [`BackendKind::Xdp`], which also checks UMEM registration and the
/// program load; not cached.
pub fn xdp_socket_supported() -> Result<(), BackendUnavailable> {
    xdp::socket_supported()
}

/// The full, active AF_XDP probe (what `ringway doctor` reports as
/// "backend xdp"), with side effects while it runs: creates two named
/// network namespaces (`rw-<pid>-...`) joined by a veth pair, opens the
/// backend on one end (program attached in generic mode, socket bound with
/// XDP_COPY), passes one datagram each way and checks them byte for byte.
/// Everything it created is removed before it returns. Needs root (named
/// namespaces, BPF). Run once per process; later calls return the first
/// answer. [`BackendKind::availability`] never does this.
pub fn xdp_veth_probe() -> Result<(), BackendUnavailable> {
    static PROBE: std::sync::OnceLock<Result<(), BackendUnavailable>> = std::sync::OnceLock::new();
    PROBE.get_or_init(xdp::veth_probe).clone()
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn io_stats_since_subtracts_every_count() {
        let start = IoStats {
            rx_packets: 10,
            tx_packets: 20,
            tx_ring_full_waits: 3,
            tx_ring_full_drops: 1,
            rx_dropped: 7,
            tx_in_ring: 50,
            rx_wakeups: 4,
            ..IoStats::default()
        };
        let end = IoStats {
            rx_packets: 15,
            tx_packets: 29,
            tx_ring_full_waits: 3,
            tx_ring_full_drops: 4,
            rx_dropped: 9,
            tx_in_ring: 2,
            rx_wakeups: 10,
            ..IoStats::default()
        };
        let d = end.since(&start);
        assert_eq!(d.rx_packets, 5);
        assert_eq!(d.tx_packets, 9);
        assert_eq!(d.tx_ring_full_waits, 0);
        assert_eq!(d.tx_ring_full_drops, 3);
        assert_eq!(d.rx_dropped, 2);
        assert_eq!(d.rx_wakeups, 6);
        // A level is taken as it is now.
        assert_eq!(d.tx_in_ring, 2);
        // Since itself: nothing.
        assert_eq!(end.since(&end).tx_packets, 0);
    }
}
