//! UDP socket setup with the options operators ask for.

use crate::sys;
use std::io;
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::{FromRawFd, OwnedFd, RawFd};

/// How to open a UDP socket.
#[derive(Clone, Debug)]
pub struct SocketConfig {
    /// Address to bind.
    pub bind: SocketAddr,
    /// Requested receive buffer (SO_RCVBUF, or SO_RCVBUFFORCE when allowed).
    pub rcvbuf: Option<usize>,
    /// Requested send buffer.
    pub sndbuf: Option<usize>,
    /// Set SO_REUSEPORT (several sockets on one port, kernel load-balances).
    pub reuseport: bool,
    /// Ask for kernel software RX timestamps.
    pub rx_timestamps: bool,
    /// Allow kernel software TX timestamps (requested per datagram).
    pub tx_timestamps: bool,
    /// Ask for SO_RXQ_OVFL drop counts with each receive.
    pub rxq_ovfl: bool,
    /// When a buffer request exceeds `net.core.{r,w}mem_max`, retry with
    /// SO_RCVBUFFORCE/SO_SNDBUFFORCE (works with CAP_NET_ADMIN).
    pub force_buffers: bool,
    /// Set IP_RECVERR (and IPV6_RECVERR on an IPv6 socket): the kernel
    /// queues the ICMP errors for datagrams sent from this socket on its
    /// error queue, where the backends read them
    /// ([`crate::BatchIo::poll_unreachable`]); an unconnected socket hears
    /// of none without it. A pending error also fails the next send or
    /// receive call on the socket once; the backends retry such a call.
    pub recv_errors: bool,
}

impl SocketConfig {
    /// Defaults: given address, no buffer change, RX stamps and drop counts on.
    pub fn new(bind: SocketAddr) -> Self {
        SocketConfig {
            bind,
            rcvbuf: None,
            sndbuf: None,
            reuseport: false,
            rx_timestamps: true,
            tx_timestamps: false,
            rxq_ovfl: true,
            force_buffers: true,
            recv_errors: false,
        }
    }
}

/// What was actually applied when opening a socket.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct SocketReport {
    /// Receive buffer the kernel reports after setup (SO_RCVBUF read back;
    /// the kernel doubles the requested value for bookkeeping overhead).
    pub rcvbuf_granted: usize,
    /// Send buffer read back (also doubled by the kernel).
    pub sndbuf_granted: usize,
    /// Requested receive buffer, if any.
    pub rcvbuf_requested: Option<usize>,
    /// Requested send buffer, if any.
    pub sndbuf_requested: Option<usize>,
    /// `net.core.rmem_max` at setup time (0 when unreadable).
    pub rmem_max: usize,
    /// `net.core.wmem_max` at setup time (0 when unreadable).
    pub wmem_max: usize,
    /// The buffer size was set with SO_RCVBUFFORCE (past rmem_max).
    pub rcvbuf_forced: bool,
    /// The buffer size was set with SO_SNDBUFFORCE (past wmem_max).
    pub sndbuf_forced: bool,
    /// SO_REUSEPORT is on.
    pub reuseport: bool,
    /// SO_TIMESTAMPING with software RX stamps is on.
    pub rx_timestamps: bool,
    /// SO_TIMESTAMPING with software TX stamps (OPT_ID, TSONLY) is enabled.
    pub tx_timestamps: bool,
    /// SO_RXQ_OVFL is on.
    pub rxq_ovfl: bool,
    /// IP_RECVERR (IPV6_RECVERR) is on: ICMP errors reach the error queue.
    pub recv_errors: bool,
    /// Options that were applied, by name.
    pub applied: Vec<String>,
    /// Human-readable warnings (clamped buffers, refused options).
    pub warnings: Vec<String>,
}

/// Read an integer sysctl under `/proc/sys` (e.g. `net/core/rmem_max`).
pub fn read_sysctl(path: &str) -> io::Result<i64> {
    let text = std::fs::read_to_string(format!("/proc/sys/{path}"))?;
    text.trim()
        .parse()
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("{path}: {e}")))
}

fn errno_text(e: &io::Error) -> String {
    match e.raw_os_error() {
        Some(libc::EPERM) => format!("EPERM ({e})"),
        Some(libc::EACCES) => format!("EACCES ({e})"),
        Some(libc::EINVAL) => format!("EINVAL ({e})"),
        Some(libc::ENOPROTOOPT) => format!("ENOPROTOOPT ({e})"),
        _ => e.to_string(),
    }
}

/// Apply one buffer size (receive or send): plain option first, FORCE when
/// the request exceeds the sysctl limit and `force` allows it.
#[allow(clippy::too_many_arguments)]
fn apply_buffer(
    fd: RawFd,
    what: &str,
    req: usize,
    max: usize,
    opt: libc::c_int,
    force_opt: libc::c_int,
    force: bool,
    rep: &mut SocketReport,
) -> (usize, bool) {
    let reqi = req.min(i32::MAX as usize / 2) as libc::c_int;
    let mut forced = false;
    match sys::setsockopt_int(fd, libc::SOL_SOCKET, opt, reqi) {
        Ok(()) => rep.applied.push(format!("{what}={req}")),
        Err(e) => rep
            .warnings
            .push(format!("{what}={req} refused: {}", errno_text(&e))),
    }
    let name_force = if opt == libc::SO_RCVBUF {
        "SO_RCVBUFFORCE"
    } else {
        "SO_SNDBUFFORCE"
    };
    if force && max > 0 && req > max {
        match sys::setsockopt_int(fd, libc::SOL_SOCKET, force_opt, reqi) {
            Ok(()) => {
                forced = true;
                rep.applied.push(format!("{name_force}={req}"));
            }
            Err(e) => rep.warnings.push(format!(
                "{name_force}={req} refused: {} (limit stays at the sysctl maximum {max})",
                errno_text(&e)
            )),
        }
    }
    let granted = sys::getsockopt_int(fd, libc::SOL_SOCKET, opt)
        .unwrap_or(0)
        .max(0) as usize;
    // The kernel stores twice the request; anything less means it was clamped.
    if granted < req.saturating_mul(2).min(i32::MAX as usize) {
        rep.warnings.push(format!(
            "{what}: requested {req} bytes, kernel granted {granted} (the kernel doubles the value; \
             sysctl max {max}, so at most {} without FORCE)",
            max.saturating_mul(2)
        ));
    }
    (granted, forced)
}

/// Open and configure a UDP socket as `cfg` says.
///
/// Every option that the kernel refuses becomes a warning in the report;
/// only socket creation and `bind` failures are errors. The socket is
/// returned in non-blocking mode.
pub fn open_udp(cfg: &SocketConfig) -> io::Result<(UdpSocket, SocketReport)> {
    let domain = match cfg.bind {
        SocketAddr::V4(_) => libc::AF_INET,
        SocketAddr::V6(_) => libc::AF_INET6,
    };
    // SAFETY: plain socket(2) call with constant arguments.
    let fd = sys::cvt(unsafe {
        libc::socket(
            domain,
            libc::SOCK_DGRAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
            libc::IPPROTO_UDP,
        )
    })?;
    // SAFETY: `fd` is a fresh descriptor we own exclusively.
    let owned = unsafe { OwnedFd::from_raw_fd(fd) };
    let mut rep = SocketReport {
        rcvbuf_requested: cfg.rcvbuf,
        sndbuf_requested: cfg.sndbuf,
        rmem_max: read_sysctl("net/core/rmem_max").unwrap_or(0).max(0) as usize,
        wmem_max: read_sysctl("net/core/wmem_max").unwrap_or(0).max(0) as usize,
        ..Default::default()
    };
    if let Some(req) = cfg.rcvbuf {
        let (granted, forced) = apply_buffer(
            fd,
            "SO_RCVBUF",
            req,
            rep.rmem_max,
            libc::SO_RCVBUF,
            sys::SO_RCVBUFFORCE,
            cfg.force_buffers,
            &mut rep,
        );
        rep.rcvbuf_granted = granted;
        rep.rcvbuf_forced = forced;
    }
    if let Some(req) = cfg.sndbuf {
        let (granted, forced) = apply_buffer(
            fd,
            "SO_SNDBUF",
            req,
            rep.wmem_max,
            libc::SO_SNDBUF,
            sys::SO_SNDBUFFORCE,
            cfg.force_buffers,
            &mut rep,
        );
        rep.sndbuf_granted = granted;
        rep.sndbuf_forced = forced;
    }
    if cfg.reuseport {
        match sys::setsockopt_int(fd, libc::SOL_SOCKET, libc::SO_REUSEPORT, 1) {
            Ok(()) => {
                rep.reuseport = sys::getsockopt_int(fd, libc::SOL_SOCKET, libc::SO_REUSEPORT)
                    .map(|v| v != 0)
                    .unwrap_or(false);
                rep.applied.push("SO_REUSEPORT".into());
            }
            Err(e) => rep
                .warnings
                .push(format!("SO_REUSEPORT refused: {}", errno_text(&e))),
        }
    }
    let mut ts_flags = 0u32;
    if cfg.rx_timestamps {
        ts_flags |= sys::SOF_RX_SOFTWARE | sys::SOF_SOFTWARE;
    }
    if cfg.tx_timestamps {
        ts_flags |= sys::SOF_SOFTWARE | sys::SOF_OPT_ID | sys::SOF_OPT_TSONLY;
    }
    if ts_flags != 0 {
        match sys::setsockopt_int(fd, libc::SOL_SOCKET, sys::SO_TIMESTAMPING, ts_flags as i32) {
            Ok(()) => {
                if cfg.rx_timestamps {
                    ensure_rx_stamping_live();
                }
                let back = sys::getsockopt_int(fd, libc::SOL_SOCKET, sys::SO_TIMESTAMPING)
                    .unwrap_or(0) as u32;
                rep.rx_timestamps = cfg.rx_timestamps && back & sys::SOF_RX_SOFTWARE != 0;
                rep.tx_timestamps = cfg.tx_timestamps && back & sys::SOF_OPT_ID != 0;
                rep.applied.push(format!("SO_TIMESTAMPING=0x{ts_flags:x}"));
                if back & ts_flags != ts_flags {
                    rep.warnings.push(format!(
                        "SO_TIMESTAMPING: asked 0x{ts_flags:x}, kernel reports 0x{back:x}"
                    ));
                }
            }
            Err(e) => rep
                .warnings
                .push(format!("SO_TIMESTAMPING refused: {}", errno_text(&e))),
        }
    }
    if cfg.rxq_ovfl {
        match sys::setsockopt_int(fd, libc::SOL_SOCKET, sys::SO_RXQ_OVFL, 1) {
            Ok(()) => {
                rep.rxq_ovfl = sys::getsockopt_int(fd, libc::SOL_SOCKET, sys::SO_RXQ_OVFL)
                    .map(|v| v != 0)
                    .unwrap_or(false);
                rep.applied.push("SO_RXQ_OVFL".into());
            }
            Err(e) => rep
                .warnings
                .push(format!("SO_RXQ_OVFL refused: {}", errno_text(&e))),
        }
    }
    if cfg.recv_errors {
        set_recv_errors(fd, cfg.bind.is_ipv6(), &mut rep);
    }
    let mut storage = sys::zero_storage();
    let len = sys::sockaddr_from(&cfg.bind, &mut storage);
    // SAFETY: `st` holds a valid sockaddr of length `len` for this family.
    sys::cvt(unsafe { libc::bind(fd, (&storage as *const libc::sockaddr_storage).cast(), len) })
        .map_err(|e| io::Error::new(e.kind(), format!("bind {}: {e}", cfg.bind)))?;
    if cfg.rcvbuf.is_none() {
        rep.rcvbuf_granted =
            sys::getsockopt_int(fd, libc::SOL_SOCKET, libc::SO_RCVBUF).unwrap_or(0) as usize;
    }
    if cfg.sndbuf.is_none() {
        rep.sndbuf_granted =
            sys::getsockopt_int(fd, libc::SOL_SOCKET, libc::SO_SNDBUF).unwrap_or(0) as usize;
    }
    Ok((UdpSocket::from(owned), rep))
}

/// Turn on IP_RECVERR, and IPV6_RECVERR on an IPv6 socket (whose
/// IPv4-mapped destinations still report through IP_RECVERR).
fn set_recv_errors(fd: RawFd, ipv6: bool, rep: &mut SocketReport) {
    let mut options = vec![(libc::SOL_IP, libc::IP_RECVERR, "IP_RECVERR")];
    if ipv6 {
        options.push((libc::SOL_IPV6, libc::IPV6_RECVERR, "IPV6_RECVERR"));
    }
    for (level, name, text) in options {
        match sys::setsockopt_int(fd, level, name, 1) {
            Ok(()) => rep.applied.push(text.into()),
            Err(e) => rep
                .warnings
                .push(format!("{text} refused: {}", errno_text(&e))),
        }
    }
    rep.recv_errors = recv_errors_enabled(fd);
}

/// Whether the socket `fd` reports ICMP errors on its error queue
/// (IP_RECVERR on an IPv4 socket, IPV6_RECVERR on an IPv6 one).
pub(crate) fn recv_errors_enabled(fd: RawFd) -> bool {
    let on = |level, name| sys::getsockopt_int(fd, level, name).is_ok_and(|v| v != 0);
    on(libc::SOL_IPV6, libc::IPV6_RECVERR) || on(libc::SOL_IP, libc::IP_RECVERR)
}

/// `sock.send_to(bytes, to)`, sent again when the call failed with an
/// asynchronous error: on a socket with [`SocketConfig::recv_errors`] an
/// ICMP error about an earlier datagram (to any peer) fails the next send
/// once, and this datagram is not the one it is about. The error stays on
/// the socket's error queue for the backends to read. Tried at most three
/// times in all.
pub fn send_to(sock: &UdpSocket, bytes: &[u8], to: SocketAddr) -> io::Result<usize> {
    let mut tries = 0;
    loop {
        match sock.send_to(bytes, to) {
            Err(e) if sys::is_async_send_error(&e) && tries < 2 => tries += 1,
            result => return result,
        }
    }
}

/// Current drop counter of a socket (`SO_MEMINFO` drops): datagrams the
/// kernel discarded for this socket, e.g. for lack of receive buffer.
pub fn socket_drops(fd: RawFd) -> io::Result<u64> {
    sys::socket_drop_count(fd)
}

/// The kernel turns RX software timestamping on lazily: the first socket
/// that asks for it schedules a work item that flips a global static key, and
/// datagrams received before that runs carry no stamp (and the key flips off
/// again when the last such socket closes). To make stamps dependable, the
/// first call keeps one stamping socket open for the life of the process and
/// waits (at most ~200 ms) until a datagram it sends itself comes back stamped.
fn ensure_rx_stamping_live() {
    static KEEPER: std::sync::OnceLock<Option<UdpSocket>> = std::sync::OnceLock::new();
    KEEPER.get_or_init(|| {
        // Build the keeper on a helper thread placed in the main thread's
        // network namespace, so a caller inside a test namespace does not pin
        // that namespace for the life of the process.
        std::thread::spawn(|| {
            if let Ok(file) = std::fs::File::open("/proc/self/ns/net") {
                use std::os::fd::AsRawFd;
                // SAFETY: setns with a namespace fd we hold open; affects only
                // this helper thread. On failure we stay where we are.
                let _ = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
            }
            make_keeper()
        })
        .join()
        .ok()
        .flatten()
    });
}

fn make_keeper() -> Option<UdpSocket> {
    {
        let socket = UdpSocket::bind("127.0.0.1:0").ok()?;
        use std::os::fd::AsRawFd;
        let fd = socket.as_raw_fd();
        let flags = (sys::SOF_RX_SOFTWARE | sys::SOF_SOFTWARE) as i32;
        sys::setsockopt_int(fd, libc::SOL_SOCKET, sys::SO_TIMESTAMPING, flags).ok()?;
        socket.set_nonblocking(true).ok()?;
        let local = socket.local_addr().ok()?;
        let mut io =
            crate::backend::open_backend(crate::BackendKind::Socket, socket.try_clone().ok()?)
                .ok()?;
        let mut rx_batch = crate::RxBatch::new(1, 16);
        for _ in 0..200 {
            if socket.send_to(b"ts", local).is_err() {
                break; // no usable loopback here: nothing to wait on
            }
            if io
                .recv_batch(&mut rx_batch, Some(std::time::Duration::from_millis(1)))
                .unwrap_or(0)
                > 0
                && rx_batch.get(0).and_then(|d| d.meta.kernel_rx).is_some()
            {
                break;
            }
            std::thread::sleep(std::time::Duration::from_micros(500));
        }
        Some(socket)
    }
}
