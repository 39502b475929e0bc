//! AF_XDP: an XDP program on the interface redirects the UDP datagrams for
//! our address and port into an XSK socket's RX ring; the SFU's copies are
//! written from the received frame straight into TX frames of the same
//! UMEM, and the echo leaves in the received frame itself.
//!
//! * **Program** ([`program`]): hand-assembled eBPF loaded with `bpf(2)`,
//!   for the family of our address: IPv4 (any IHL, not a fragment) with
//!   protocol UDP, or IPv6 with next header UDP (no extension headers);
//!   destination address and port equal to ours → `bpf_ktime_get_ns()`
//!   into the metadata area in front of the frame (the kernel RX time;
//!   [`XdpConfig::rx_timestamps`]) and `bpf_redirect_map(xskmap,
//!   rx_queue_index, XDP_PASS)`; everything else (ARP, ICMP, ICMPv6 and
//!   its neighbour discovery, the other family, other ports, fragments,
//!   IPv6 extension headers) → `XDP_PASS`. Attached with
//!   `BPF_LINK_CREATE` in native (driver) mode — veth has it — falling back
//!   to generic (SKB) mode where the driver has none ([`XdpMode`]); closing
//!   the link (drop) detaches it.
//! * **Socket**: bound with `XDP_COPY | XDP_USE_NEED_WAKEUP` (veth has no
//!   zero-copy); kicks (`sendto`) only when the TX ring asks for a wakeup.
//!   One pool of UMEM frames: the fill ring is kept at half of them, the
//!   rest (and every completed frame) serve the TX ring.
//! * **Receive**: each frame is checked (Ethernet, IPv4 header checksum,
//!   lengths, **UDP checksum verified**, mandatory over IPv6 — a corrupted
//!   datagram is dropped
//!   and counted, never forwarded under a fresh checksum), its payload is
//!   copied into the caller's batch for the core, and the frame itself is
//!   lent to the caller until the next `recv_batch`: [`BatchIo::replicate`]
//!   of that datagram copies from it. `RxMeta::kernel_rx` is the XDP
//!   program's stamp (CLOCK_MONOTONIC in the kernel, converted to
//!   CLOCK_REALTIME with the offset between the clocks read at the same
//!   receive call); each datagram's application receive time is taken as it
//!   leaves the ring.
//! * **Send**: per destination a header template ([`frame::Template`],
//!   42 bytes over IPv4, 62 over IPv6) with the checksums' fixed parts
//!   summed once; a copy is the header, the
//!   payload and two additions (the payload's sum was taken when its
//!   checksum was verified). Copies are published in the TX ring at once
//!   ("scheduled", [`BatchIo::tx_progress`]) and the ring is kicked by
//!   [`BatchIo::flush`]. With no free frame or ring slot the send path
//!   kicks and waits for completions, at most [`XdpConfig::tx_wait_us`],
//!   and drops only after that (`IoStats::tx_ring_full_drops`); frames
//!   still in the ring are never counted as sent (`IoStats::tx_in_ring`).
//! * **Next hops** ([`neigh`]): a destination's MAC is that of its next
//!   hop — the gateway of the kernel's route to it (`RTM_GETROUTE`), or the
//!   destination itself when on-link — from the kernel's neighbour table,
//!   both read by the receive path (never on the send path) and aged with
//!   the kernel's — or, with one backend per receive queue, read once by
//!   the thread that polls their [`NextHopRefresher`] and taken by each
//!   backend from its published table; received frames teach nothing. A destination without
//!   one (unresolved yet, or routed out of another interface) goes through
//!   the companion UDP socket (the kernel resolves it):
//!   `IoStats::tx_via_socket`.
//! * **Companion UDP socket** on the same address and port: the kernel
//!   answers nothing for our port (no ICMP port unreachable), and what the
//!   program passes (IP fragments) is still received (`rx_via_socket`).
//!
//! One family per backend (that of [`XdpConfig::local`]); no TX timestamps.

mod fanout;
mod fanout_program;
mod frame;
mod neigh;
mod netlink;
mod program;
mod ring;
pub(crate) mod with_socket;

pub use fanout::{FanoutRoute, FanoutStats, KernelFanout, MAX_FANOUT};
#[doc(hidden)]
pub use frame::frame_fuzzing;
pub use netlink::{parse_rtnetlink_replies, RtnetlinkReplies};
pub use program::{attach_xdp_pass, XdpAttachment, XdpMode};

use crate::backend::{BackendKind, BackendUnavailable, BatchIo, IoStats, TxProgress};
use crate::batch::{RxBatch, RxMeta, TxBatch, TxStamp};
use crate::sys::{self, Mapping};
use crate::time::{monotonic_now, realtime_now, Nanos};
use crate::wire::{sum16, UdpFrame};
use frame::{overhead_for, turn_around, verify_udp, Template};
pub use neigh::NextHopRefresher;
use neigh::{Neighbours, NextHops};
use program::err;
use ring::{Ring, RingOffset, TxKernel, TxRing};
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, UdpSocket};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::Arc;
use std::time::{Duration, Instant};

const AF_XDP: libc::c_int = 44;
const SOL_XDP: libc::c_int = 283;
const XDP_MMAP_OFFSETS: libc::c_int = 1;
const XDP_RX_RING: libc::c_int = 2;
const XDP_TX_RING: libc::c_int = 3;
const XDP_UMEM_REG: libc::c_int = 4;
const XDP_UMEM_FILL_RING: libc::c_int = 5;
const XDP_UMEM_COMPLETION_RING: libc::c_int = 6;
const XDP_STATISTICS: libc::c_int = 7;
pub(crate) const XDP_COPY: u16 = 1 << 1;
pub(crate) const XDP_ZEROCOPY: u16 = 1 << 2;
pub(crate) const XDP_USE_NEED_WAKEUP: u16 = 1 << 3;
const XDP_PGOFF_RX_RING: i64 = 0;
const XDP_PGOFF_TX_RING: i64 = 0x8000_0000;
const XDP_UMEM_PGOFF_FILL_RING: i64 = 0x1_0000_0000;
const XDP_UMEM_PGOFF_COMPLETION_RING: i64 = 0x1_8000_0000;
/// Where the kernel puts a received frame in a UMEM chunk (copy mode,
/// no UMEM headroom): after XDP_PACKET_HEADROOM.
const RX_DATA_OFFSET: u64 = 256;
/// Most receive queues one [`XdpBackend::open_queues`] binds.
pub(crate) const MAX_QUEUES: usize = 64;

/// Options of the AF_XDP backend.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct XdpConfig {
    /// Interface to attach to (in the calling thread's network namespace).
    pub ifname: String,
    /// Receive queue to bind (veth: 0).
    pub queue: u32,
    /// Our address (IPv4 or IPv6: the backend serves that family) and UDP
    /// port. The address must be one of the interface's (it is the source
    /// of every frame sent); port 0 picks one.
    pub local: SocketAddr,
    /// UMEM frames, a power of two 16..=65536 (half of them on the fill ring).
    pub frames: u32,
    /// Bytes per UMEM frame: 2048 or 4096 (a received frame holds at most
    /// `frame_size - 256` bytes; longer ones are dropped by the kernel).
    pub frame_size: u32,
    /// How to attach the XDP program (default: native, else generic).
    pub mode: XdpMode,
    /// Have the program stamp each frame with `bpf_ktime_get_ns()` in the
    /// metadata area (`RxMeta::kernel_rx`).
    pub rx_timestamps: bool,
    /// Longest wait (µs) for a free TX frame or ring slot before a copy is
    /// dropped.
    pub tx_wait_us: u32,
}

impl XdpConfig {
    /// Defaults (queue 0, 4096 frames of 2048 bytes, native mode if the
    /// driver has it, RX stamps, 2 ms TX wait) for `ifname` and `local`.
    pub fn new(ifname: &str, local: impl Into<SocketAddr>) -> XdpConfig {
        XdpConfig {
            ifname: ifname.to_string(),
            queue: 0,
            local: local.into(),
            frames: 4096,
            frame_size: 2048,
            mode: XdpMode::Auto,
            rx_timestamps: true,
            tx_wait_us: 2000,
        }
    }
}

/// Interface facts read with ioctls on a socket of the right namespace.
fn if_info(fd: RawFd, name: &str) -> io::Result<([u8; 6], usize)> {
    let mut req = [0u8; 40]; // struct ifreq
    if name.is_empty() || name.len() >= 16 || name.contains('\0') {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("bad interface name {name:?}"),
        ));
    }
    req[..name.len()].copy_from_slice(name.as_bytes());
    // SAFETY: `req` is a live 40-byte struct ifreq with a NUL-terminated name.
    sys::cvt(unsafe { libc::ioctl(fd, libc::SIOCGIFHWADDR, req.as_mut_ptr()) })
        .map_err(|e| err(&format!("SIOCGIFHWADDR {name}"), e))?;
    let family = u16::from_ne_bytes([req[16], req[17]]);
    if family != libc::ARPHRD_ETHER {
        return Err(io::Error::new(
            io::ErrorKind::Unsupported,
            format!("{name} is not an Ethernet interface (hardware type {family})"),
        ));
    }
    let mac: [u8; 6] = req[18..24].try_into().expect("6 bytes");
    let mut req2 = [0u8; 40];
    req2[..name.len()].copy_from_slice(name.as_bytes());
    // SAFETY: as above.
    sys::cvt(unsafe { libc::ioctl(fd, libc::SIOCGIFMTU, req2.as_mut_ptr()) })
        .map_err(|e| err(&format!("SIOCGIFMTU {name}"), e))?;
    let mtu = i32::from_ne_bytes(req2[16..20].try_into().expect("4 bytes")).max(68) as usize;
    Ok((mac, mtu))
}

/// An AF_XDP socket with its UMEM registered and its four rings sized, not
/// yet mapped or bound (rings must be mapped before `bind`). Field order is
/// drop order: the socket is closed before the UMEM is unmapped.
pub(crate) struct XskSetup {
    pub(crate) fd: OwnedFd,
    pub(crate) umem: Mapping,
}

/// Create an AF_XDP socket, register a UMEM of `frames` × `frame_size`
/// bytes and size the fill, completion, RX and TX rings to `ring` entries.
pub(crate) fn xsk_setup(frames: u32, frame_size: u32, ring: u32) -> io::Result<XskSetup> {
    // SAFETY: plain socket(2) call.
    let raw = sys::cvt(unsafe { libc::socket(AF_XDP, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0) })
        .map_err(|e| err("socket(AF_XDP)", e))?;
    // SAFETY: a new descriptor nobody else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    let umem =
        Mapping::anon(frames as usize * frame_size as usize).map_err(|e| err("mmap UMEM", e))?;
    #[repr(C)]
    struct UmemReg {
        addr: u64,
        len: u64,
        chunk_size: u32,
        headroom: u32,
        flags: u32,
        tx_metadata_len: u32,
    }
    let reg = UmemReg {
        addr: umem.ptr as u64,
        len: umem.len as u64,
        chunk_size: frame_size,
        headroom: 0,
        flags: 0,
        tx_metadata_len: 0,
    };
    // SAFETY: pointer/length describe a live UmemReg; the UMEM mapping
    // outlives the socket (XskSetup drops the socket first).
    sys::cvt(unsafe {
        libc::setsockopt(
            raw,
            SOL_XDP,
            XDP_UMEM_REG,
            (&reg as *const UmemReg).cast(),
            std::mem::size_of::<UmemReg>() as u32,
        )
    })
    .map_err(|e| err("XDP_UMEM_REG", e))?;
    for (opt, what) in [
        (XDP_UMEM_FILL_RING, "XDP_UMEM_FILL_RING"),
        (XDP_UMEM_COMPLETION_RING, "XDP_UMEM_COMPLETION_RING"),
        (XDP_RX_RING, "XDP_RX_RING"),
        (XDP_TX_RING, "XDP_TX_RING"),
    ] {
        sys::setsockopt_int(raw, SOL_XDP, opt, ring as i32).map_err(|e| err(what, e))?;
    }
    Ok(XskSetup { fd, umem })
}

/// Bind an AF_XDP socket to `ifindex` / `queue` with bind `flags`
/// (`XDP_COPY`, `XDP_ZEROCOPY`, `XDP_USE_NEED_WAKEUP`).
pub(crate) fn xsk_bind(fd: RawFd, ifindex: u32, queue: u32, flags: u16) -> io::Result<()> {
    #[repr(C)]
    struct SockaddrXdp {
        family: u16,
        flags: u16,
        ifindex: u32,
        queue_id: u32,
        shared_umem_fd: u32,
    }
    let addr = SockaddrXdp {
        family: AF_XDP as u16,
        flags,
        ifindex,
        queue_id: queue,
        shared_umem_fd: 0,
    };
    // SAFETY: pointer/length describe a live sockaddr_xdp.
    let result = sys::cvt(unsafe {
        libc::bind(
            fd,
            (&addr as *const SockaddrXdp).cast(),
            std::mem::size_of::<SockaddrXdp>() as u32,
        )
    });
    result.map(drop).map_err(|e| {
        let mode = match (flags & XDP_COPY != 0, flags & XDP_USE_NEED_WAKEUP != 0) {
            (true, true) => "XDP_COPY | XDP_USE_NEED_WAKEUP",
            (true, false) => "XDP_COPY",
            (false, true) => "XDP_ZEROCOPY | XDP_USE_NEED_WAKEUP",
            (false, false) => "XDP_ZEROCOPY",
        };
        err(
            &format!("bind AF_XDP to ifindex {ifindex} queue {queue} ({mode})"),
            e,
        )
    })
}

/// The AF_XDP socket of `queue` on interface `ifindex`: UMEM registered,
/// rings sized and mapped, bound in copy mode with need_wakeup.
fn open_queue_socket(cfg: &XdpConfig, ifindex: u32, queue: u32) -> io::Result<QueueSocket> {
    let half = cfg.frames / 2;
    let XskSetup { fd: xsk, umem } = xsk_setup(cfg.frames, cfg.frame_size, half)?;
    let fd = xsk.as_raw_fd();
    let frame_size = u64::from(cfg.frame_size);
    let mut offs = [RingOffset::default(); 4]; // rx, tx, fill, completion
    let mut olen = std::mem::size_of_val(&offs) as libc::socklen_t;
    // SAFETY: buffer pointer and in/out length describe the live array.
    sys::cvt(unsafe {
        libc::getsockopt(
            fd,
            SOL_XDP,
            XDP_MMAP_OFFSETS,
            offs.as_mut_ptr().cast(),
            &mut olen,
        )
    })
    .map_err(|e| err("XDP_MMAP_OFFSETS", e))?;
    if olen as usize != std::mem::size_of_val(&offs) {
        return Err(io::Error::other(
            "XDP_MMAP_OFFSETS: kernel without ring flags (too old)",
        ));
    }
    let rx = Ring::new(fd, offs[0], half, 16, XDP_PGOFF_RX_RING, false, "RX")?;
    let tx = Ring::new(fd, offs[1], half, 16, XDP_PGOFF_TX_RING, true, "TX")?;
    let fill = Ring::new(fd, offs[2], half, 8, XDP_UMEM_PGOFF_FILL_RING, true, "fill")?;
    let comp = Ring::new(
        fd,
        offs[3],
        half,
        8,
        XDP_UMEM_PGOFF_COMPLETION_RING,
        false,
        "completion",
    )?;
    let free: Vec<u64> = (0..u64::from(cfg.frames))
        .rev()
        .map(|i| i * frame_size)
        .collect();
    let txr = TxRing::new(
        tx,
        comp,
        free,
        frame_size,
        Duration::from_micros(u64::from(cfg.tx_wait_us)),
    );
    // A socket that was bound to this queue a moment ago is released
    // asynchronously (after its program and map): EBUSY for a while.
    let until = Instant::now() + Duration::from_secs(2);
    loop {
        match xsk_bind(fd, ifindex, queue, XDP_COPY | XDP_USE_NEED_WAKEUP) {
            Ok(()) => break,
            Err(e) if e.kind() == io::ErrorKind::ResourceBusy && Instant::now() < until => {
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => return Err(io::Error::new(e.kind(), format!("{} ({})", e, cfg.ifname))),
        }
    }
    Ok(QueueSocket {
        rx,
        fill,
        txr,
        xsk,
        umem,
    })
}

/// Bytes of the UMEM at `off..off+len`, if inside.
fn umem_slice(umem: &Mapping, off: u64, len: usize) -> Option<&[u8]> {
    let off = usize::try_from(off).ok()?;
    if off.checked_add(len)? > umem.len {
        return None;
    }
    // SAFETY: the range lies inside the UMEM mapping; the kernel wrote it
    // before publishing the descriptor and does not touch the frame until
    // we give it back through the fill ring.
    Some(unsafe { std::slice::from_raw_parts(umem.ptr.add(off), len) })
}

/// A received frame lent to the caller until the next `recv_batch`.
#[derive(Copy, Clone, Debug)]
struct Lent {
    /// UMEM offset of the frame's first byte (the RX descriptor's address).
    addr: u64,
    /// Frame length.
    len: u32,
    /// Offset of the UDP payload in the frame, and its length.
    payload_at: u32,
    payload_len: u32,
    /// One's-complement sum of the payload (from the checksum check).
    payload_sum: u32,
    /// The sender.
    src: SocketAddr,
    /// IPv4 header without options, or IPv6: can be turned around for the
    /// echo.
    movable: bool,
    /// Gone to the TX ring as an echo (not returned to the pool).
    moved: bool,
}

/// A fast hasher for the template map (FxHash's mixing): its keys are the
/// SFU's own destinations, which senders cannot choose freely.
#[derive(Default)]
struct AddrHasher(u64);

impl Hasher for AddrHasher {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(5) ^ u64::from(b)).wrapping_mul(0x517c_c1b7_2722_0a95);
        }
    }
    fn finish(&self) -> u64 {
        self.0
    }
}

/// The kernel side of the TX ring: `sendto` kicks, `ppoll` for POLLOUT.
struct Xsk {
    fd: RawFd,
    syscalls: u64,
}

impl TxKernel for Xsk {
    fn kick(&mut self) -> io::Result<()> {
        self.syscalls += 1;
        // SAFETY: sendto with no buffer and no address only kicks the XSK.
        let result = sys::cvt(unsafe {
            libc::sendto(
                self.fd,
                std::ptr::null(),
                0,
                libc::MSG_DONTWAIT,
                std::ptr::null(),
                0,
            )
        });
        match result {
            Ok(_) => Ok(()),
            Err(e) => match e.raw_os_error() {
                // Took part of it (copy mode: 32 frames per call), or the
                // device queue is busy, or the completion ring is full.
                Some(libc::EAGAIN | libc::EBUSY | libc::ENOBUFS | libc::EINTR) => Ok(()),
                _ => Err(err("AF_XDP TX kick (sendto)", e)),
            },
        }
    }
    fn wait(&mut self, timeout: Duration) -> io::Result<()> {
        self.syscalls += 1;
        let mut fds = [libc::pollfd {
            fd: self.fd,
            events: libc::POLLOUT,
            revents: 0,
        }];
        let start = Instant::now();
        sys::ppoll(&mut fds, Some(timeout))?;
        // POLLOUT means "the TX ring is less than half full": waiting for
        // free frames (completions) it may return at once. Do not spin.
        if start.elapsed() < timeout / 4 {
            std::thread::sleep(timeout.min(Duration::from_micros(50)));
        }
        Ok(())
    }
}

/// The steering program attached to the interface, with its XSKMAP:
/// shared by the backends of every queue, detached when the last goes.
/// Field order is drop order: detach, then close the program and the map.
struct Steering {
    _link: OwnedFd,
    _prog: OwnedFd,
    _map: OwnedFd,
}

/// One queue's AF_XDP socket, bound, with its UMEM and its four rings.
/// Field order is drop order: unmap the rings, close the XSK, and only
/// then unmap the UMEM.
struct QueueSocket {
    rx: Ring,
    fill: Ring,
    txr: TxRing,
    xsk: OwnedFd,
    umem: Mapping,
}

/// AF_XDP backend (see the module docs).
pub(crate) struct XdpBackend {
    // Drop order: let go of the program (detached with the last queue's
    // backend), unmap the rings, close the XSK, and only then unmap the
    // UMEM.
    _steering: Arc<Steering>,
    mode: XdpMode,
    rx: Ring,
    fill: Ring,
    txr: TxRing,
    xsk: OwnedFd,
    umem: Mapping,
    sock: UdpSocket,
    /// This backend receives on the companion socket (the first queue's
    /// does; the others only send through their handle of it).
    sock_rx: bool,
    /// Queues opened together with this one (1: the interface's one queue,
    /// or one queue asked for).
    queues: u32,
    cfg: XdpConfig,
    local: SocketAddr,
    mac: [u8; 6],
    mtu: usize,
    /// Frames in the fill or RX ring.
    rx_owned: u32,
    /// Frames lent out now (not moved).
    lent_count: u32,
    /// Per datagram of the caller's current batch: its frame, if it came
    /// through the XSK.
    lent: Vec<Option<Lent>>,
    next_hops: NextHops,
    /// The last source whose next hop was known, and in which table
    /// (generation): its datagrams need no look-up until the table
    /// changes (a client's packets come back to back).
    known_source: Option<(IpAddr, u64)>,
    templates: HashMap<SocketAddr, Template, BuildHasherDefault<AddrHasher>>,
    templates_generation: u64,
    ip_id: u16,
    calls: u64,
    stats: IoStats,
    scratch: Vec<u8>,
}

// SAFETY: the raw pointers (UMEM and ring mappings) point into memory owned
// by this backend; moving it to another thread moves that ownership along,
// and the kernel side of the rings does not care which thread uses them.
unsafe impl Send for XdpBackend {}

impl XdpBackend {
    /// The backend on queue `cfg.queue` only.
    pub(crate) fn open(cfg: XdpConfig) -> io::Result<XdpBackend> {
        let queue = cfg.queue;
        let (mut backends, _, _) = XdpBackend::open_queues(cfg, &[queue])?;
        Ok(backends.pop().expect("one queue asked, one opened"))
    }

    /// One backend per queue of `queues` (`cfg.queue` is ignored), each
    /// with its own AF_XDP socket, UMEM and rings, behind one steering
    /// program whose XSKMAP holds every socket at its queue's index. The
    /// first backend receives on the companion UDP socket too; the others
    /// send through handles of it. Also returns one more handle of that
    /// socket, for a thread that sends through the kernel, and with several
    /// queues the refresher of their next hops (one backend reads its
    /// own).
    pub(crate) fn open_queues(
        cfg: XdpConfig,
        queues: &[u32],
    ) -> io::Result<(Vec<XdpBackend>, UdpSocket, Option<NextHopRefresher>)> {
        let bad = |m: &str| io::Error::new(io::ErrorKind::InvalidInput, m.to_string());
        if !(16..=65536).contains(&cfg.frames) || !cfg.frames.is_power_of_two() {
            return Err(bad("xdp frames must be a power of two in 16..=65536"));
        }
        if cfg.frame_size != 2048 && cfg.frame_size != 4096 {
            return Err(bad("xdp frame size must be 2048 or 4096"));
        }
        if cfg.local.ip().is_unspecified() || cfg.local.ip().is_loopback() {
            return Err(bad(
                "xdp backend needs the interface's own address to listen on (not 0.0.0.0, :: or loopback)",
            ));
        }
        if queues.is_empty() || queues.len() > MAX_QUEUES {
            return Err(bad("xdp backend: 1 to 64 receive queues"));
        }
        let sock = UdpSocket::bind(cfg.local).map_err(|e| {
            err(
                &format!("binding the companion UDP socket {}", cfg.local),
                e,
            )
        })?;
        sock.set_nonblocking(true)?;
        let local = sock.local_addr()?;
        let (mac, mtu) = if_info(sock.as_raw_fd(), &cfg.ifname)?;
        let ifindex = ifindex(&cfg.ifname)?;
        let mut sockets = Vec::with_capacity(queues.len());
        for &queue in queues {
            sockets.push((queue, open_queue_socket(&cfg, ifindex, queue)?));
        }
        let entries: Vec<(u32, RawFd)> = sockets
            .iter()
            .map(|(queue, socket)| (*queue, socket.xsk.as_raw_fd()))
            .collect();
        let (map, prog) = program::load(&entries, local.port(), local.ip(), cfg.rx_timestamps)?;
        let (link, mode) = program::attach(prog.as_raw_fd(), ifindex, cfg.mode)
            .map_err(|e| io::Error::new(e.kind(), format!("{e} ({})", cfg.ifname)))?;
        let steering = Arc::new(Steering {
            _link: link,
            _prog: prog,
            _map: map,
        });
        let spare = sock.try_clone()?;
        let refresher = (queues.len() > 1).then(|| NextHopRefresher::new(&cfg.ifname));
        let mut receiving = Some(sock);
        let mut backends = Vec::with_capacity(sockets.len());
        for (queue, socket) in sockets {
            let (sock, sock_rx) = match receiving.take() {
                Some(sock) => (sock, true),
                None => (spare.try_clone()?, false),
            };
            let QueueSocket {
                rx,
                fill,
                txr,
                xsk,
                umem,
            } = socket;
            let mut backend = XdpBackend {
                _steering: steering.clone(),
                mode,
                rx,
                fill,
                txr,
                xsk,
                umem,
                sock,
                sock_rx,
                queues: queues.len() as u32,
                next_hops: match &refresher {
                    Some(refresher) => NextHops::Shared(refresher.view()),
                    None => NextHops::Own(Neighbours::new(&cfg.ifname)),
                },
                cfg: XdpConfig {
                    queue,
                    ..cfg.clone()
                },
                local,
                mac,
                mtu,
                rx_owned: 0,
                lent_count: 0,
                lent: Vec::new(),
                known_source: None,
                templates: HashMap::default(),
                templates_generation: 0,
                ip_id: 0,
                calls: 0,
                stats: IoStats::default(),
                scratch: vec![0u8; 65536],
            };
            backend.refill();
            backends.push(backend);
        }
        Ok((backends, spare, refresher))
    }

    /// Frames the fill and RX rings (and the lent ones) may hold.
    fn rx_target(&self) -> u32 {
        self.cfg.frames / 2
    }

    /// Top the fill ring up from the free frames.
    fn refill(&mut self) {
        let mut pushed = false;
        while self.rx_owned + self.lent_count < self.rx_target() && self.fill.free() > 0 {
            let Some(base) = self.txr.free.pop() else {
                break;
            };
            if self.cfg.rx_timestamps {
                // Clear the metadata slot, so a frame the program could not
                // stamp never shows an older frame's stamp.
                let offset = (base + RX_DATA_OFFSET) as usize - program::META_LEN;
                // SAFETY: `base` is a free frame of the UMEM (no ring holds
                // it); the 8 bytes lie inside it (RX_DATA_OFFSET < frame size).
                unsafe { self.umem.ptr.add(offset).cast::<u64>().write_unaligned(0) };
            }
            self.fill.push_addr(base);
            self.rx_owned += 1;
            pushed = true;
        }
        if pushed {
            self.fill.publish();
        }
    }

    /// Give the frames lent with the last batch back to the pool.
    fn take_back(&mut self) {
        let frame_size = u64::from(self.cfg.frame_size);
        for l in self.lent.drain(..).flatten() {
            if !l.moved {
                self.txr.free.push(l.addr - l.addr % frame_size);
            }
        }
        self.lent_count = 0;
    }

    fn kernel(&self) -> Xsk {
        Xsk {
            fd: self.xsk.as_raw_fd(),
            syscalls: 0,
        }
    }

    /// Kick the TX ring (bounded) when it asks for a wakeup.
    fn kick(&mut self) -> io::Result<()> {
        let mut kernel = self.kernel();
        let wake = self.txr.tx.needs_wakeup();
        let result = self.txr.kick_all(&mut kernel, wake);
        self.stats.tx_syscalls += kernel.syscalls;
        result
    }

    /// Take what the RX ring holds (up to the batch's room) into `batch`.
    fn take_rx(&mut self, batch: &mut RxBatch) -> usize {
        let room = batch.free_frames() as u32;
        let ready = self.rx.ready().min(room);
        if ready == 0 {
            return 0;
        }
        // CLOCK_REALTIME - CLOCK_MONOTONIC now, to put the program's
        // monotonic stamps on the clock of RxMeta::kernel_rx.
        let mono0 = monotonic_now().0;
        let real = realtime_now().0;
        let offset = real.wrapping_sub(mono0);
        let frame_size = u64::from(self.cfg.frame_size);
        let mut added = 0;
        for k in 0..ready {
            let (addr, len) = self.rx.peek_desc(k);
            self.rx_owned = self.rx_owned.saturating_sub(1);
            let kernel_rx = self
                .stamp_of(addr, mono0)
                .map(|t| Nanos(t.wrapping_add(offset)));
            let frame = umem_slice(&self.umem, addr, len as usize);
            let taken = match frame.map(UdpFrame::parse) {
                Some(Ok(Some(parsed)))
                    if parsed.dst().ip() == self.local.ip()
                        && parsed.dst().port() == self.local.port()
                        && parsed.ip_checksum_ok() =>
                {
                    let udp_at = parsed.udp_offset();
                    let udp =
                        &frame.expect("checked")[udp_at..udp_at + 8 + parsed.udp().payload().len()];
                    match verify_udp(parsed.src().ip(), parsed.dst().ip(), udp) {
                        Some(payload_sum) => Some((parsed, payload_sum, udp_at)),
                        None => {
                            self.stats.rx_bad_checksum += 1;
                            None
                        }
                    }
                }
                _ => None,
            };
            let Some((parsed, payload_sum, udp_at)) = taken else {
                self.stats.rx_invalid += 1;
                self.txr.free.push(addr - addr % frame_size);
                continue;
            };
            let src = parsed.src();
            note_source(&mut self.next_hops, &mut self.known_source, src.ip());
            let data = parsed.udp().payload();
            let frame = batch.next_frame_mut().expect("room checked");
            let copied = data.len().min(frame.len());
            frame[..copied].copy_from_slice(&data[..copied]);
            let movable = parsed.plain_header();
            batch.commit_received(
                RxMeta {
                    peer: src,
                    len: copied,
                    truncated: data.len() > copied,
                    kernel_rx,
                    app_rx: Nanos(real),
                },
                monotonic_now(),
            );
            self.lent.push(Some(Lent {
                addr,
                len,
                payload_at: (udp_at + 8) as u32,
                payload_len: data.len() as u32,
                payload_sum,
                src,
                movable,
                moved: false,
            }));
            self.lent_count += 1;
            added += 1;
        }
        self.rx.release(ready);
        self.refill();
        self.stats.rx_packets += added as u64;
        added
    }

    /// The program's stamp of the frame at `addr`, if it wrote a plausible
    /// one (no later than `now`, at most 10 s before).
    fn stamp_of(&self, addr: u64, now: u64) -> Option<u64> {
        if !self.cfg.rx_timestamps
            || addr % u64::from(self.cfg.frame_size) < program::META_LEN as u64
        {
            return None;
        }
        let offset = addr as usize - program::META_LEN;
        // SAFETY: the 8 bytes before the frame lie in the same UMEM chunk
        // (checked above), which the kernel handed to us with the frame.
        let stamp = unsafe { self.umem.ptr.add(offset).cast::<u64>().read_unaligned() };
        (stamp > 0 && stamp <= now && now - stamp < 10_000_000_000).then_some(stamp)
    }

    /// Read datagrams the kernel stack delivered to the companion socket.
    fn take_socket(&mut self, batch: &mut RxBatch) -> io::Result<usize> {
        let mut added = 0;
        while batch.free_frames() > 0 {
            self.stats.rx_syscalls += 1;
            let flen = batch.frame_size();
            let result = self.sock.recv_from(&mut self.scratch);
            match result {
                Ok((n, peer)) => {
                    let copied = n.min(flen);
                    let frame = batch.next_frame_mut().expect("room checked");
                    frame[..copied].copy_from_slice(&self.scratch[..copied]);
                    batch.commit(RxMeta {
                        peer,
                        len: copied,
                        truncated: n > copied,
                        kernel_rx: None,
                        app_rx: realtime_now(),
                    });
                    self.lent.push(None);
                    added += 1;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) if sys::is_async_send_error(&e) => self.stats.socket_errors += 1,
                Err(e) => return Err(e),
            }
        }
        self.stats.rx_packets += added as u64;
        self.stats.rx_via_socket += added as u64;
        Ok(added)
    }

    /// Wait for the XSK or the companion socket; returns (xsk, socket) readiness.
    fn wait(&mut self, timeout: Option<Duration>) -> io::Result<(bool, bool)> {
        let mut pollfds = [
            libc::pollfd {
                fd: self.xsk.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                // A negative descriptor is skipped: the other queues'
                // backends leave the companion socket to the first one.
                fd: if self.sock_rx {
                    self.sock.as_raw_fd()
                } else {
                    -1
                },
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        self.stats.rx_syscalls += 1;
        if sys::ppoll(&mut pollfds, timeout)? == 0 {
            return Ok((false, false));
        }
        if pollfds[1].revents & libc::POLLERR != 0
            && sys::take_socket_error(self.sock.as_raw_fd()).is_some()
        {
            self.stats.socket_errors += 1;
        }
        Ok((
            pollfds[0].revents & libc::POLLIN != 0,
            pollfds[1].revents & libc::POLLIN != 0,
        ))
    }

    /// The header template towards `dst` (of our family), when its MAC is
    /// known.
    fn template(&mut self, dst: SocketAddr) -> Option<Template> {
        if self.templates_generation != self.next_hops.generation() {
            self.templates.clear();
            self.templates_generation = self.next_hops.generation();
        }
        if let Some(found) = self.templates.get(&dst) {
            return Some(found.clone());
        }
        let Some(mac) = self.next_hops.get(dst.ip()) else {
            self.next_hops.note(dst.ip());
            return None;
        };
        if self.templates.len() >= 65536 {
            self.templates.clear();
        }
        let found = Template::new(self.mac, mac, self.local, dst)?;
        self.templates.insert(dst, found.clone());
        Some(found)
    }

    /// Send `payload` to `dst` through the companion socket (unknown
    /// neighbour, or larger than one frame: the kernel resolves and
    /// fragments).
    fn via_socket(&mut self, payload: &[u8], dst: SocketAddr) {
        self.stats.tx_syscalls += 1;
        match self.sock.send_to(payload, dst) {
            Ok(_) => self.stats.tx_via_socket += 1,
            Err(_) => self.stats.tx_errors += 1,
        }
        self.txr.elsewhere += 1;
    }

    /// Queue one copy of the `len` payload bytes at `src` (UMEM or caller
    /// memory), whose sum is `sum`, to `dst`: a TX frame from the header
    /// template, or the companion socket. Returns false for a copy that
    /// was not written into the ring.
    fn queue_copy(
        &mut self,
        src: *const u8,
        len: usize,
        sum: u32,
        dst: SocketAddr,
    ) -> io::Result<bool> {
        // SAFETY: `src` points at `len` readable bytes that stay untouched
        // during this call: the caller's datagram, or a lent RX frame (the
        // TX frame written below is another UMEM chunk).
        let payload = unsafe { std::slice::from_raw_parts(src, len) };
        if dst.is_ipv4() != self.local.is_ipv4() {
            // The other family: not reachable from our address.
            self.stats.tx_errors += 1;
            self.txr.elsewhere += 1;
            return Ok(false);
        }
        let frame_size = self.cfg.frame_size as usize;
        // IP and UDP headers inside the MTU, Ethernet too inside the frame.
        let overhead = overhead_for(&dst);
        let max_payload = (self.mtu + 14 - overhead).min(frame_size - overhead);
        let template = if len > max_payload {
            None
        } else {
            self.template(dst)
        };
        let Some(template_) = template else {
            self.via_socket(payload, dst);
            return Ok(false);
        };
        let mut kernel = self.kernel();
        let got = self.txr.reserve(&mut kernel);
        self.stats.tx_syscalls += kernel.syscalls;
        let Some(off) = got? else {
            self.stats.tx_errors += 1;
            self.txr.elsewhere += 1;
            return Ok(false);
        };
        self.ip_id = self.ip_id.wrapping_add(1);
        // SAFETY: `off` is a TX frame we own (from the free list, not in any
        // ring), `fs` bytes inside the UMEM mapping, and not `payload`.
        let frame =
            unsafe { std::slice::from_raw_parts_mut(self.umem.ptr.add(off as usize), frame_size) };
        frame[overhead..overhead + len].copy_from_slice(payload);
        let written = template_.write(frame, self.ip_id, len, sum);
        self.txr.push(off, written as u32);
        Ok(true)
    }

    /// Send the lent frame `i` back to its sender by rewriting it in place
    /// and moving it to the TX ring; false when that cannot be done (the
    /// caller copies instead).
    fn move_echo(&mut self, i: usize) -> io::Result<bool> {
        let Some(lent) = self.lent[i] else {
            return Ok(false);
        };
        let Some(mac) = self.next_hops.get(lent.src.ip()) else {
            return Ok(false);
        };
        let mut kernel = self.kernel();
        let room = self.txr.make_room(&mut kernel, false);
        self.stats.tx_syscalls += kernel.syscalls;
        if !room? {
            return Ok(false);
        }
        // SAFETY: the lent frame is ours until the next recv_batch; it is in
        // no ring; addr..addr+len lies inside the UMEM (checked when taken).
        let frame = unsafe {
            std::slice::from_raw_parts_mut(self.umem.ptr.add(lent.addr as usize), lent.len as usize)
        };
        if !turn_around(frame, self.mac, mac) {
            return Ok(false);
        }
        self.txr.push(lent.addr, lent.len);
        self.lent[i] = Some(Lent {
            moved: true,
            ..lent
        });
        self.lent_count -= 1;
        self.stats.tx_moved += 1;
        Ok(true)
    }

    /// Wait (until `deadline`) for datagrams while `batch` is empty,
    /// kicking the TX ring while it holds frames the kernel has not taken.
    fn wait_for_rx(&mut self, batch: &mut RxBatch, deadline: Option<Instant>) -> io::Result<()> {
        while batch.is_empty() {
            let mut left = deadline.map(|d| d.saturating_duration_since(Instant::now()));
            if self.txr.in_ring() > 0 {
                // Copies the kernel has not taken: come back soon to kick.
                let cap = Duration::from_micros(200);
                left = Some(left.map_or(cap, |l| l.min(cap)));
            }
            let (xdp_ready, socket_ready) = self.wait(left)?;
            if xdp_ready {
                self.take_rx(batch);
            }
            if socket_ready && self.sock_rx && batch.free_frames() > 0 {
                self.take_socket(batch)?;
            }
            if self.txr.in_ring() > 0 {
                self.kick()?;
            }
            if batch.is_empty() && deadline.is_some_and(|d| Instant::now() >= d) {
                break;
            }
        }
        Ok(())
    }

    fn xdp_stats(&self) -> Option<[u64; 6]> {
        let mut counters = [0u64; 6];
        let mut len = std::mem::size_of_val(&counters) as libc::socklen_t;
        // SAFETY: buffer pointer and in/out length describe the live array.
        let result = sys::cvt(unsafe {
            libc::getsockopt(
                self.xsk.as_raw_fd(),
                SOL_XDP,
                XDP_STATISTICS,
                counters.as_mut_ptr().cast(),
                &mut len,
            )
        });
        result.ok().map(|_| counters)
    }
}

impl BatchIo for XdpBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Xdp
    }
    fn describe(&self) -> String {
        format!(
            "xdp ({} XDP, copy mode, need_wakeup{}{})",
            self.mode.name(),
            if self.cfg.rx_timestamps {
                ", RX stamps from the XDP program"
            } else {
                ""
            },
            if self.queues > 1 {
                format!(", RX queue {} of {}", self.cfg.queue, self.queues)
            } else {
                String::new()
            }
        )
    }
    fn local_addr(&self) -> io::Result<SocketAddr> {
        Ok(self.local)
    }
    fn raw_fd(&self) -> RawFd {
        self.xsk.as_raw_fd()
    }
    fn recv_batch(&mut self, batch: &mut RxBatch, timeout: Option<Duration>) -> io::Result<usize> {
        batch.clear();
        self.take_back();
        self.refill();
        self.calls += 1;
        self.next_hops.refresh();
        if self.txr.in_ring() > 0 {
            self.kick()?;
        }
        self.txr.reap();
        let deadline = timeout.map(|t| Instant::now() + t);
        self.take_rx(batch);
        // Now and then look at the companion socket even while the ring is
        // busy, so kernel-path datagrams (fragments) are not starved.
        if self.sock_rx && self.calls.is_multiple_of(64) && batch.free_frames() > 0 {
            self.take_socket(batch)?;
        }
        if timeout != Some(Duration::ZERO) {
            // (Spinning, timeout zero: no syscall while nothing came.)
            self.wait_for_rx(batch, deadline)?;
        }
        if !batch.is_empty() {
            // A sender we have no neighbour entry for: read the kernel's
            // table now if due (before the copies are made, not on the
            // send path), or take the refresher's newer one.
            self.next_hops.refresh();
        }
        Ok(batch.len())
    }
    fn replicate(
        &mut self,
        index: Option<usize>,
        data: &[u8],
        dsts: &[SocketAddr],
        _tx: &mut TxBatch,
    ) -> io::Result<()> {
        self.txr.reap();
        let lent = index.and_then(|slot| Some((slot, self.lent.get(slot).copied().flatten()?)));
        let lent = lent.filter(|(_, lent_frame)| {
            !lent_frame.moved && lent_frame.payload_len as usize == data.len()
        });
        let (src, sum) = match lent {
            Some((_, lent_frame)) => {
                // SAFETY: payload_at..payload_at+payload_len lies in the
                // lent frame, inside the UMEM (checked when it was taken).
                let ptr = unsafe {
                    self.umem
                        .ptr
                        .add((lent_frame.addr + u64::from(lent_frame.payload_at)) as usize)
                };
                (ptr.cast_const(), lent_frame.payload_sum)
            }
            None => (data.as_ptr(), sum16(data, 0)),
        };
        let mut echo = None;
        for &dst in dsts {
            if let Some((slot, lent_frame)) = lent {
                if echo.is_none() && lent_frame.movable && dst == lent_frame.src {
                    echo = Some((slot, dst));
                    continue;
                }
            }
            if self.queue_copy(src, data.len(), sum, dst)? && lent.is_some() {
                self.stats.tx_from_rx_frame += 1;
            }
        }
        if let Some((slot, dst)) = echo {
            if !self.move_echo(slot)? {
                self.queue_copy(src, data.len(), sum, dst)?;
            }
        }
        self.txr.publish();
        Ok(())
    }
    fn flush(&mut self, tx: &mut TxBatch) -> io::Result<()> {
        if !tx.is_empty() {
            self.send_batch(tx)?;
            tx.clear();
        }
        self.kick()
    }
    fn tx_progress(&self) -> Option<TxProgress> {
        Some(self.txr.progress())
    }
    fn send_batch(&mut self, batch: &TxBatch) -> io::Result<usize> {
        if batch.is_empty() {
            return Ok(0);
        }
        self.txr.reap();
        let before = self.stats.tx_errors;
        for (k, e) in batch.entries().iter().enumerate() {
            let data = batch.data(k);
            if e.stamp_tag.is_some() {
                self.stats.tx_stamps_lost += 1;
            }
            self.queue_copy(data.as_ptr(), data.len(), sum16(data, 0), e.dst)?;
        }
        self.txr.publish();
        self.kick()?;
        Ok(batch.len() - (self.stats.tx_errors - before) as usize)
    }
    fn poll_tx_stamps(&mut self, _out: &mut Vec<TxStamp>) -> io::Result<usize> {
        Ok(0)
    }
    fn stats(&self) -> IoStats {
        let mut snapshot = self.stats;
        if let Some(xdp) = self.xdp_stats() {
            // rx_dropped (no fill buffer, too long) + rx_ring_full.
            snapshot.rx_dropped = xdp[0] + xdp[3];
        }
        snapshot.tx_packets = self.txr.taken() + snapshot.tx_via_socket;
        snapshot.tx_in_ring = self.txr.in_ring();
        snapshot.tx_ring_full_waits = self.txr.full_waits;
        snapshot.tx_ring_full_drops = self.txr.full_drops;
        snapshot
    }
}

/// A datagram came from `ip`: ask `next_hops` for its next hop if it is
/// missing, skipped while `known` (the last source found known, and the
/// table's generation then) sends again.
fn note_source(next_hops: &mut NextHops, known: &mut Option<(IpAddr, u64)>, ip: IpAddr) {
    let generation = next_hops.generation();
    if *known == Some((ip, generation)) {
        return;
    }
    next_hops.note(ip);
    *known = next_hops.get(ip).is_some().then_some((ip, generation));
}

fn ifindex(name: &str) -> io::Result<u32> {
    let cname = std::ffi::CString::new(name)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "bad interface name"))?;
    // SAFETY: NUL-terminated name; resolved in this thread's namespace.
    let index = unsafe { libc::if_nametoindex(cname.as_ptr()) };
    if index == 0 {
        return Err(err(&format!("interface {name}"), sys::last_err()));
    }
    Ok(index)
}

/// Receive queues of `ifname` (in the calling thread's network namespace):
/// ethtool `ETHTOOL_GCHANNELS`, the RX-only plus the combined channels, as
/// `ethtool -l` shows them. A driver that does not answer (no
/// `get_channels`) counts as one queue.
pub(crate) fn rx_queue_count(ifname: &str) -> io::Result<u32> {
    const SIOCETHTOOL: libc::c_ulong = 0x8946;
    const ETHTOOL_GCHANNELS: u32 = 0x3c;
    if ifname.is_empty() || ifname.len() >= 16 || ifname.contains('\0') {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("bad interface name {ifname:?}"),
        ));
    }
    /// `struct ethtool_channels`.
    #[repr(C)]
    #[derive(Default)]
    struct EthtoolChannels {
        cmd: u32,
        max_rx: u32,
        max_tx: u32,
        max_other: u32,
        max_combined: u32,
        rx_count: u32,
        tx_count: u32,
        other_count: u32,
        combined_count: u32,
    }
    let mut channels = EthtoolChannels {
        cmd: ETHTOOL_GCHANNELS,
        ..EthtoolChannels::default()
    };
    #[repr(C)]
    struct IfreqData {
        name: [u8; 16],
        data: *mut EthtoolChannels,
        _pad: [u8; 16],
    }
    let mut req = IfreqData {
        name: [0; 16],
        data: &mut channels,
        _pad: [0; 16],
    };
    req.name[..ifname.len()].copy_from_slice(ifname.as_bytes());
    let sock = UdpSocket::bind("0.0.0.0:0")?;
    // SAFETY: `req` is a live struct ifreq whose ifr_data points at the live
    // ethtool_channels; the kernel reads and writes both during the call only.
    let result = sys::cvt(unsafe { libc::ioctl(sock.as_raw_fd(), SIOCETHTOOL as _, &mut req) });
    match result {
        Ok(_) => Ok((channels.rx_count + channels.combined_count).max(1)),
        Err(e) if e.raw_os_error() == Some(libc::EOPNOTSUPP) => Ok(1),
        Err(e) => Err(err(&format!("ETHTOOL_GCHANNELS on {ifname}"), e)),
    }
}

/// Does this kernel create AF_XDP sockets at all? (socket, then close.)
pub(crate) fn socket_supported() -> Result<(), BackendUnavailable> {
    // SAFETY: plain socket(2) call; the descriptor is owned (closed) right away.
    let fd = sys::cvt(unsafe { libc::socket(AF_XDP, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0) })
        .map_err(|e| {
            BackendUnavailable::new(
                BackendKind::Xdp,
                format!(
                    "socket(AF_XDP) refused: {}",
                    crate::thread::errno_reason(&e)
                ),
            )
            .with_errno(e.raw_os_error())
        })?;
    // SAFETY: a new descriptor nobody else owns; dropping it closes it.
    drop(unsafe { OwnedFd::from_raw_fd(fd) });
    Ok(())
}

/// The cheap check behind [`BackendKind::availability`]: the set-up steps
/// that need no interface, each on descriptors released on return. An
/// AF_XDP socket ([`socket_supported`]), a small UMEM registered on it with
/// its four rings sized, an XSKMAP created and the XDP program loaded (the
/// verifier accepts it; it is attached nowhere). No namespace, interface,
/// route or attached program is created.
pub(crate) fn available() -> Result<(), BackendUnavailable> {
    socket_supported()?;
    let unavailable = |e: io::Error| {
        let errno = e.raw_os_error();
        BackendUnavailable::new(BackendKind::Xdp, e.to_string()).with_errno(errno)
    };
    let _xsk = xsk_setup(16, 2048, 16).map_err(unavailable)?;
    // The programs as `open` loads them (with an address test), for
    // documentation addresses of both families and the discard port.
    for daddr in [
        IpAddr::V4(Ipv4Addr::new(192, 0, 2, 1)),
        IpAddr::V6(Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 1)),
    ] {
        let _loaded = program::load(&[], 9, daddr, true).map_err(unavailable)?;
    }
    Ok(())
}

/// The full, active probe (see [`crate::backend::xdp_veth_probe`]): two
/// namespace hosts joined by veth, one datagram each way through the real
/// backend.
pub(crate) fn veth_probe() -> Result<(), BackendUnavailable> {
    smoke().map_err(|e| BackendUnavailable::new(BackendKind::Xdp, e.to_string()))
}

/// Hosts `a` and `b` joined by veth; the backend on b's veth, a regular
/// UDP socket in a: one datagram each way, checked byte for byte.
fn smoke() -> io::Result<()> {
    use crate::netns::Topology;
    let topo = Topology::builder()
        .host("a")
        .host("b")
        .link("a", "b")
        .build()?;
    let host_a = topo.host("a").expect("built").clone();
    let host_b = topo.host("b").expect("built").clone();
    let (ifname, bip) = (host_b.ifaces[0].0.clone(), host_b.ifaces[0].1);
    let (ready_tx, ready_rx) = std::sync::mpsc::channel::<io::Result<u16>>();
    let server = host_b.spawn(move || -> io::Result<()> {
        let mut io = match XdpBackend::open(XdpConfig::new(&ifname, SocketAddrV4::new(bip, 0))) {
            Ok(io) => io,
            Err(e) => {
                let _ = ready_tx.send(Err(io::Error::new(e.kind(), e.to_string())));
                return Err(e);
            }
        };
        let _ = ready_tx.send(Ok(io.local.port()));
        let mut rx_batch = RxBatch::new(4, 256);
        let end = Instant::now() + Duration::from_secs(3);
        while Instant::now() < end {
            io.recv_batch(&mut rx_batch, Some(Duration::from_millis(100)))?;
            if let Some(datagram) = rx_batch.iter().find(|datagram| datagram.data == b"xdp-probe") {
                let mut tx_batch = TxBatch::new(1, 256);
                tx_batch.push(datagram.meta.peer, b"xdp-probe-reply").map_err(io::Error::other)?;
                io.send_batch(&tx_batch)?;
                if io.stats.tx_via_socket > 0 {
                    return Err(io::Error::other("reply went through the kernel socket"));
                }
                return Ok(());
            }
        }
        Err(io::Error::other(format!(
            "nothing arrived through the XSK RX ring (XDP_STATISTICS {:?}, via socket {}, invalid {})",
            io.xdp_stats(),
            io.stats.rx_via_socket, io.stats.rx_invalid
        )))
    });
    let port = match ready_rx.recv_timeout(Duration::from_secs(10)) {
        Ok(r) => r?,
        // The thread ended without a word (could not enter the namespace):
        // its own error says why.
        Err(_) => {
            return match server.join() {
                Ok(Err(e)) | Ok(Ok(Err(e))) => Err(e),
                _ => Err(io::Error::other("backend did not start")),
            }
        }
    };
    let dst = SocketAddrV4::new(bip, port);
    let (aif, aip) = (host_a.ifaces[0].0.clone(), host_a.ifaces[0].1);
    let client = host_a.run(move || -> io::Result<()> {
        // Full UDP checksums from this same-host sender (the backend
        // verifies them).
        disable_tx_checksum_offload(&aif)?;
        let socket = UdpSocket::bind((aip, 0))?;
        socket.set_read_timeout(Some(Duration::from_millis(200)))?;
        let mut buf = [0u8; 256];
        for _ in 0..10 {
            socket.send_to(b"xdp-probe", dst)?;
            if let Ok((len, from)) = socket.recv_from(&mut buf) {
                if from == SocketAddr::V4(dst) && &buf[..len] == b"xdp-probe-reply" {
                    return Ok(());
                }
            }
        }
        Err(io::Error::other("no reply through the XSK TX ring"))
    })?;
    let served = server
        .join()
        .map_err(|_| io::Error::other("probe thread panicked"))??;
    served?;
    client
}

/// Attach a pass-everything program to `ifindex` in native (driver) mode
/// and detach it again (the doctor's check that the driver has XDP).
pub(crate) fn native_attach_probe(ifname: &str) -> io::Result<()> {
    attach_xdp_pass(ifname, XdpMode::Native).map(drop)
}

/// Turn the transmit checksum offload of `ifname` off (ethtool
/// `ETHTOOL_STXCSUM`, as `ethtool -K IFACE tx off`; in the calling thread's
/// namespace). A socket sending from one namespace to another over veth
/// otherwise leaves UDP checksums partial (the pseudo-header sum only,
/// completed by nobody), and the AF_XDP backend, which verifies every UDP
/// checksum it receives, drops such frames as corrupt. Real NICs put full
/// checksums on the wire: this is for same-host testbeds.
pub fn disable_tx_checksum_offload(ifname: &str) -> io::Result<()> {
    const SIOCETHTOOL: libc::c_ulong = 0x8946;
    const ETHTOOL_STXCSUM: u32 = 0x17;
    if ifname.is_empty() || ifname.len() >= 16 || ifname.contains('\0') {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("bad interface name {ifname:?}"),
        ));
    }
    #[repr(C)]
    struct EthtoolValue {
        cmd: u32,
        data: u32,
    }
    let mut value = EthtoolValue {
        cmd: ETHTOOL_STXCSUM,
        data: 0,
    };
    #[repr(C)]
    struct IfreqData {
        name: [u8; 16],
        data: *mut EthtoolValue,
        _pad: [u8; 16],
    }
    let mut req = IfreqData {
        name: [0; 16],
        data: &mut value,
        _pad: [0; 16],
    };
    req.name[..ifname.len()].copy_from_slice(ifname.as_bytes());
    let sock = UdpSocket::bind("0.0.0.0:0")?;
    // SAFETY: `req` is a live struct ifreq whose ifr_data points at the live
    // ethtool_value `v`; the kernel reads both during the call only.
    sys::cvt(unsafe { libc::ioctl(sock.as_raw_fd(), SIOCETHTOOL as _, &mut req) })
        .map(drop)
        .map_err(|e| err(&format!("ETHTOOL_STXCSUM off on {ifname}"), e))
}
