//! ringway-io: batch datagram I/O backends, timestamps, drop counters,
//! thread placement and network-namespace test helpers.
//!
//! This is the only crate of the workspace allowed to contain `unsafe`;
//! every block carries a `// SAFETY:` line (enforced: clippy's
//! `undocumented_unsafe_blocks` and `unsafe_op_in_unsafe_fn` are denied),
//! and libc calls that report failure as `-1` + errno are checked by one
//! helper that turns that into an [`std::io::Error`].
//!
//! The central abstraction is [`BatchIo`]: receive a batch of datagrams into
//! the pre-allocated frames of an [`RxBatch`], send a [`TxBatch`] whose
//! entries each carry their own destination. Frames are fixed-size slots of
//! one contiguous arena, the same shape as an AF_XDP UMEM or an io_uring
//! provided-buffer ring, so ring-based backends can adopt it.
//!
//! Modules:
//! * [`backend`]: `socket` (poll + one recvmsg/sendmsg per datagram),
//!   `mmsg` (recvmmsg/sendmmsg) and `uring` (io_uring multishot recvmsg with
//!   a provided-buffer ring, sendmsg SQEs) and `xdp` (AF_XDP on one
//!   interface, [`open_xdp`]; IPv4 or IPv6, no kernel RX stamps). Each datagram carries peer, length,
//!   truncation, kernel software RX stamp and app receive time; TX stamps
//!   come back from the error queue on request ([`TxBatch::request_stamp`]).
//! * [`sock`]: [`open_udp`] applies buffers (FORCE when permitted),
//!   SO_REUSEPORT, SO_TIMESTAMPING, SO_RXQ_OVFL and reports what it got.
//! * [`counters`]: `/proc/net/snmp{,6}` UDP totals and `/proc/net/udp{,6}`
//!   per-socket drops.
//! * [`thread`]: affinity, policy, nice, EEVDF slice; user/kernel CPU time.
//! * [`limits`]: the limit of open files (every connection is a descriptor).
//! * [`wire`]: Ethernet/IPv4/IPv6/UDP zero-copy checked views (AF_XDP frames).
//! * [`netns`]: private namespaces and veth topologies for tests.
//! * [`tun`]: TUN devices (one IP packet per read/write) and a multi-fd
//!   wait; [`nfqueue`]: NFQUEUE packets and per-packet verdicts over
//!   netlink (the SRPIC receive paths in front of the kernel's TCP).
//! * [`doctor`]: probes of what this kernel offers; [`mod@bench`]: loopback
//!   cost of each path.

#![deny(unsafe_op_in_unsafe_fn, clippy::undocumented_unsafe_blocks)]

pub mod backend;
pub mod batch;
pub mod bench;
pub mod counters;
pub mod doctor;
pub mod icmp;
pub mod limits;
pub mod netns;
pub mod nfqueue;
pub mod sock;
mod sys;
#[cfg(feature = "testing")]
pub mod testing;
pub mod thread;
pub mod time;
pub mod tun;
pub mod wire;

pub use backend::{
    open_backend, open_shared, open_uring, open_xdp, open_xdp_queues, open_xdp_with_socket,
    per_datagram_stamp_keys, xdp_rx_queues, BackendKind, BackendUnavailable, BatchIo, Io,
    IoChoiceError, IoStats, NeedsInterface, NextHopRefresher, OpenError, ParseBackendError,
    TxProgress, UringConfig, XdpConfig, XdpInterface, XdpMode, XdpQueues,
};
pub use batch::{Datagram, GsoStats, RxBatch, RxMeta, TxBatch, TxFull, TxStamp};
pub use icmp::IcmpUnreachable;
pub use sock::{open_udp, SocketConfig, SocketReport};
pub use time::{monotonic_now, realtime_now, Nanos};
