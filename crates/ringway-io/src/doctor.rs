//! `ringway doctor`: probe (never assume) what this kernel and machine offer.
//!
//! Every check calls the real interface and reports what happened. Probes
//! that could disturb the host run in throwaway namespaces: drop and netem
//! probes in a private network namespace, the debugfs probe in a private
//! mount namespace (with propagation to the host turned off first).

use crate::backend::{open_backend, xdp, xdp_veth_probe, BackendKind};
use crate::batch::{RxBatch, TxBatch};
use crate::netns::in_private_netns;
use crate::sock::{open_udp, read_sysctl, SocketConfig};
use crate::sys;
use crate::thread::{self, errno_reason, Outcome, Policy};
use std::io;
use std::net::UdpSocket;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::process::Command;
use std::time::{Duration, Instant};

/// One probe result.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Check {
    /// Area ("io", "timestamps", "offload", "kernel", "sched", "perf", "impair").
    pub area: String,
    /// What was probed.
    pub name: String,
    /// The feature works here.
    pub ok: bool,
    /// What the probe saw (counts, errno, error text).
    pub detail: String,
}

/// Everything `ringway doctor` found.
#[derive(Clone, Debug, serde::Serialize)]
pub struct DoctorReport {
    /// `uname -r` and `uname -v`.
    pub kernel: String,
    /// Machine (`uname -m`).
    pub machine: String,
    /// Online CPUs.
    pub cpus: usize,
    /// Effective uid is 0.
    pub root: bool,
    /// Probe results in report order.
    pub checks: Vec<Check>,
    /// Relevant sysctls (name, value or error).
    pub sysctls: Vec<(String, String)>,
}

impl DoctorReport {
    /// The check called `name`, if present.
    pub fn check(&self, name: &str) -> Option<&Check> {
        self.checks.iter().find(|c| c.name == name)
    }
}

/// Why one step of a probe failed; its text goes into [`Check::detail`].
#[derive(Debug, thiserror::Error)]
enum ProbeError {
    /// A system call was refused: "<step>: ENAME (message)".
    #[error("{step}: {}", errno_reason(.source))]
    Refused {
        step: &'static str,
        source: io::Error,
    },
    /// A helper program could not be run (or its namespace not made).
    #[error("could not run {program}: {source}")]
    Spawn {
        program: &'static str,
        source: io::Error,
    },
    /// A helper program ran and failed: its standard error.
    #[error("{stderr}")]
    Failed { stderr: String },
    /// The probe thread panicked.
    #[error("probe thread panicked")]
    Panicked,
}

impl ProbeError {
    /// Map an errno from `step` (for `map_err`).
    fn refused(step: &'static str) -> impl FnOnce(io::Error) -> ProbeError {
        move |source| ProbeError::Refused { step, source }
    }
}

fn chk(area: &str, name: &str, ok: bool, detail: impl Into<String>) -> Check {
    Check {
        area: area.into(),
        name: name.into(),
        ok,
        detail: detail.into(),
    }
}

fn utsname() -> (String, String) {
    // SAFETY: utsname is plain old data; uname fills it.
    let mut uts: libc::utsname = unsafe { std::mem::zeroed() };
    // SAFETY: `u` is a live, writable utsname.
    if sys::cvt(unsafe { libc::uname(&mut uts) }).is_err() {
        return ("unknown".into(), "unknown".into());
    }
    let field = |f: &[libc::c_char]| {
        let bytes: Vec<u8> = f
            .iter()
            .take_while(|&&c| c != 0)
            .map(|&c| c as u8)
            .collect();
        String::from_utf8_lossy(&bytes).into_owned()
    };
    (
        format!("{} {}", field(&uts.release), field(&uts.version)),
        field(&uts.machine),
    )
}

/// Run every probe.
pub fn run() -> DoctorReport {
    let (kernel, machine) = utsname();
    let mut checks = Vec::new();
    for &k in BackendKind::ALL {
        checks.push(probe_backend(k));
    }
    checks.push(probe_backend_xdp());
    checks.push(probe_rxq_ovfl());
    checks.push(probe_reuseport());
    checks.push(probe_rcvbuf_force());
    checks.push(probe_tx_stamps());
    checks.push(probe_gso());
    checks.push(probe_gro());
    checks.push(probe_io_uring());
    checks.extend(probe_af_xdp());
    checks.extend(probe_qdiscs());
    checks.extend(probe_sched());
    checks.push(probe_debugfs_sched());
    checks.push(probe_lab_sched_knobs());
    checks.extend(probe_perf());
    let sysctls = [
        "net/core/rmem_max",
        "net/core/wmem_max",
        "net/core/rmem_default",
        "net/core/wmem_default",
        "net/core/netdev_max_backlog",
        "kernel/io_uring_disabled",
        "kernel/perf_event_paranoid",
        "kernel/sched_rt_runtime_us",
    ]
    .iter()
    .map(|p| {
        let value = std::fs::read_to_string(format!("/proc/sys/{p}"))
            .map(|s| s.trim().to_string())
            .unwrap_or_else(|e| format!("unreadable: {e}"));
        (p.replace('/', "."), value)
    })
    .collect();
    DoctorReport {
        kernel,
        machine,
        cpus: thread::online_cpus(),
        // SAFETY: geteuid has no arguments and cannot fail.
        root: unsafe { libc::geteuid() } == 0,
        checks,
        sysctls,
    }
}

fn loop_pair(
    kind: BackendKind,
    tx_stamps: bool,
) -> io::Result<(Box<dyn crate::BatchIo>, Box<dyn crate::BatchIo>)> {
    let mut cfg = SocketConfig::new("127.0.0.1:0".parse().expect("literal"));
    cfg.tx_timestamps = tx_stamps;
    let (first, _) = open_udp(&cfg)?;
    let (second, _) = open_udp(&cfg)?;
    Ok((open_backend(kind, first)?, open_backend(kind, second)?))
}

fn probe_backend(kind: BackendKind) -> Check {
    let name = format!("backend {kind}");
    if let Err(why) = kind.availability() {
        return chk("io", &name, false, format!("not available: {}", why.reason));
    }
    let result = (|| -> io::Result<(usize, usize, usize)> {
        let (mut sender, mut receiver) = loop_pair(kind, false)?;
        let dst = receiver.local_addr()?;
        let mut tx_batch = TxBatch::new(8, 64);
        for i in 0..8u8 {
            tx_batch.push(dst, &[i; 32]).map_err(io::Error::other)?;
        }
        let sent = sender.send_batch(&tx_batch)?;
        let mut rx_batch = RxBatch::new(8, 64);
        let (mut got, mut stamped) = (0, 0);
        let end = Instant::now() + Duration::from_secs(1);
        while got < sent && Instant::now() < end {
            receiver.recv_batch(&mut rx_batch, Some(Duration::from_millis(50)))?;
            got += rx_batch.len();
            stamped += rx_batch
                .iter()
                .filter(|d| d.meta.kernel_rx.is_some_and(|k| k <= d.meta.app_rx))
                .count();
        }
        Ok((sent, got, stamped))
    })();
    match result {
        Ok((s, g, st)) => chk(
            "io",
            &name,
            s == 8 && g == 8 && st == g,
            format!(
                "loopback: sent {s}/8, received {g}/8, kernel RX software stamps on {st}/{g} (each <= app receive time){}",
                if kind == BackendKind::Uring {
                    "; multishot IORING_OP_RECVMSG into a provided-buffer ring, IORING_OP_SENDMSG SQEs"
                } else {
                    ""
                }
            ),
        ),
        Err(e) => chk("io", &name, false, format!("probe failed: {e}")),
    }
}

/// The xdp backend needs an interface: the active probe
/// ([`xdp_veth_probe`]) builds two namespace hosts joined by veth and passes
/// one datagram each way.
fn probe_backend_xdp() -> Check {
    match xdp_veth_probe() {
        Ok(()) => chk(
            "io",
            "backend xdp",
            true,
            "usable (--backend xdp --xdp-iface IFACE): veth between two namespace hosts, one datagram \
             received through the XSK RX ring and one reply sent through its TX ring; XDP program \
             loaded with bpf(2) and attached in native (driver) mode where the driver has it (veth \
             does), else generic; socket bound with XDP_COPY | XDP_USE_NEED_WAKEUP; RX time from \
             bpf_ktime_get_ns() in the XDP metadata; IPv4 and IPv6 (one per socket)",
        ),
        Err(why) => chk(
            "io",
            "backend xdp",
            false,
            format!("not available: {}", why.reason),
        ),
    }
}

fn probe_tx_stamps() -> Check {
    let result = (|| -> io::Result<(usize, Vec<u64>)> {
        let (mut sender, mut receiver) = loop_pair(BackendKind::Mmsg, true)?;
        let dst = receiver.local_addr()?;
        let mut tx_batch = TxBatch::new(4, 64);
        for _ in 0..4 {
            tx_batch.push(dst, b"stamp").map_err(io::Error::other)?;
        }
        tx_batch.request_stamp(0, 1);
        tx_batch.request_stamp(2, 3);
        sender.send_batch(&tx_batch)?;
        let mut stamps = Vec::new();
        let end = Instant::now() + Duration::from_millis(500);
        while stamps.len() < 2 && Instant::now() < end {
            sender.poll_tx_stamps(&mut stamps)?;
            std::thread::sleep(Duration::from_millis(2));
        }
        let mut rx_batch = RxBatch::new(4, 64);
        receiver.recv_batch(&mut rx_batch, Some(Duration::from_millis(100)))?;
        Ok((
            stamps.len(),
            stamps
                .iter()
                .map(|s| s.kernel_tx.saturating_since(s.app_tx))
                .collect(),
        ))
    })();
    match result {
        Ok((n, lat)) => chk(
            "timestamps",
            "tx software stamps",
            n == 2,
            format!(
                "SO_TIMESTAMPING TX_SOFTWARE|OPT_ID|OPT_TSONLY via MSG_ERRQUEUE: {n}/2 requested stamps returned (app->kernel ns {lat:?})"
            ),
        ),
        Err(e) => chk("timestamps", "tx software stamps", false, format!("probe failed: {e}")),
    }
}

fn probe_rxq_ovfl() -> Check {
    let result = in_private_netns(|| -> io::Result<(u64, u64)> {
        const K: u64 = 64;
        let mut cfg = SocketConfig::new("127.0.0.1:0".parse().expect("literal"));
        cfg.rcvbuf = Some(1);
        let (socket, rep) = open_udp(&cfg)?;
        if !rep.rxq_ovfl {
            return Err(io::Error::other(format!(
                "SO_RXQ_OVFL not set: {:?}",
                rep.warnings
            )));
        }
        let dst = socket.local_addr()?;
        let mut backend = open_backend(BackendKind::Mmsg, socket)?;
        let sender = UdpSocket::bind("127.0.0.1:0")?;
        for _ in 0..K {
            sender.send_to(&[0u8; 200], dst)?;
        }
        std::thread::sleep(Duration::from_millis(20));
        let mut rx_batch = RxBatch::new(64, 256);
        let mut got = 0u64;
        while backend.recv_batch(&mut rx_batch, Some(Duration::from_millis(50)))? > 0 {
            got += rx_batch.len() as u64;
        }
        sender.send_to(b"sentinel", dst)?;
        backend.recv_batch(&mut rx_batch, Some(Duration::from_millis(500)))?;
        Ok((got, backend.stats().rx_dropped))
    });
    match result {
        Ok(Ok((got, drops))) => chk(
            "io",
            "SO_RXQ_OVFL",
            drops > 0 && got + drops == 64,
            format!(
                "private netns, tiny rcvbuf, 64 sent: {got} delivered + {drops} reported dropped"
            ),
        ),
        Ok(Err(e)) | Err(e) => chk("io", "SO_RXQ_OVFL", false, format!("probe failed: {e}")),
    }
}

fn probe_reuseport() -> Check {
    let result = (|| -> io::Result<()> {
        let mut cfg = SocketConfig::new("127.0.0.1:0".parse().expect("literal"));
        cfg.reuseport = true;
        let (first, _) = open_udp(&cfg)?;
        cfg.bind = first.local_addr()?;
        let (_b, _) = open_udp(&cfg)?;
        Ok(())
    })();
    match result {
        Ok(()) => chk(
            "io",
            "SO_REUSEPORT",
            true,
            "two UDP sockets bound to one port",
        ),
        Err(e) => chk(
            "io",
            "SO_REUSEPORT",
            false,
            format!("second bind failed: {e}"),
        ),
    }
}

fn probe_rcvbuf_force() -> Check {
    let max = read_sysctl("net/core/rmem_max").unwrap_or(0).max(0) as usize;
    let mut cfg = SocketConfig::new("127.0.0.1:0".parse().expect("literal"));
    cfg.rcvbuf = Some(max.max(1) * 4);
    match open_udp(&cfg) {
        Ok((_s, rep)) => chk(
            "io",
            "SO_RCVBUFFORCE",
            rep.rcvbuf_forced,
            format!(
                "asked {} (4x rmem_max {max}): granted {}{}",
                max * 4,
                rep.rcvbuf_granted,
                if rep.warnings.is_empty() {
                    String::new()
                } else {
                    format!("; {}", rep.warnings.join("; "))
                }
            ),
        ),
        Err(e) => chk("io", "SO_RCVBUFFORCE", false, format!("open failed: {e}")),
    }
}

fn probe_gso() -> Check {
    let result = (|| -> io::Result<(usize, Vec<usize>)> {
        let receiver = UdpSocket::bind("127.0.0.1:0")?;
        receiver.set_read_timeout(Some(Duration::from_millis(200)))?;
        let sender = UdpSocket::bind("127.0.0.1:0")?;
        sys::setsockopt_int(sender.as_raw_fd(), sys::SOL_UDP, sys::UDP_SEGMENT, 1000)?;
        let sent = sender.send_to(&[7u8; 3000], receiver.local_addr()?)?;
        let mut sizes = Vec::new();
        let mut buf = [0u8; 4000];
        while let Ok(received) = receiver.recv(&mut buf) {
            sizes.push(received);
            if sizes.len() == 3 {
                break;
            }
        }
        Ok((sent, sizes))
    })();
    match result {
        Ok((sent, sizes)) => chk(
            "offload",
            "UDP GSO (UDP_SEGMENT)",
            sizes == [1000, 1000, 1000],
            format!("one send of {sent} bytes with segment 1000 arrived as datagrams of {sizes:?}"),
        ),
        Err(e) => chk(
            "offload",
            "UDP GSO (UDP_SEGMENT)",
            false,
            format!("refused: {}", errno_reason(&e)),
        ),
    }
}

fn probe_gro() -> Check {
    let result = (|| -> io::Result<i32> {
        let socket = UdpSocket::bind("127.0.0.1:0")?;
        sys::setsockopt_int(socket.as_raw_fd(), sys::SOL_UDP, sys::UDP_GRO, 1)?;
        sys::getsockopt_int(socket.as_raw_fd(), sys::SOL_UDP, sys::UDP_GRO)
    })();
    match result {
        Ok(v) => chk("offload", "UDP GRO (UDP_GRO)", v != 0, format!("setsockopt accepted, reads back {v} (coalescing itself needs a GRO-capable path; not exercised on lo)")),
        Err(e) => chk("offload", "UDP GRO (UDP_GRO)", false, format!("refused: {}", errno_reason(&e))),
    }
}

fn probe_io_uring() -> Check {
    let disabled = read_sysctl("kernel/io_uring_disabled")
        .map(|v| v.to_string())
        .unwrap_or_else(|e| format!("unreadable ({e})"));
    let mut params = [0u64; 16]; // struct io_uring_params is 120 bytes
                                 // SAFETY: io_uring_setup reads/writes a 120-byte params struct; we pass 128 zeroed bytes.
    let fd =
        sys::cvt(unsafe { libc::syscall(libc::SYS_io_uring_setup, 4u32, params.as_mut_ptr()) });
    match fd {
        Ok(fd) => {
            // SAFETY: the descriptor io_uring_setup just returned to us;
            // dropping it closes it.
            drop(unsafe { OwnedFd::from_raw_fd(fd as i32) });
            let sq_entries = params[0] as u32;
            chk(
                "kernel",
                "io_uring",
                true,
                format!("io_uring_setup(4) gave a ring (sq_entries {sq_entries}); kernel.io_uring_disabled={disabled}"),
            )
        }
        Err(e) => chk(
            "kernel",
            "io_uring",
            false,
            format!(
                "io_uring_setup refused: {}; kernel.io_uring_disabled={disabled}",
                errno_reason(&e)
            ),
        ),
    }
}

/// AF_XDP: create the socket, then in a private namespace attach an XDP
/// program to a veth in native (driver) mode, bind a socket to a veth in
/// copy mode with need_wakeup, and try zero-copy too.
fn probe_af_xdp() -> Vec<Check> {
    if let Err(error) = xdp::socket_supported() {
        return vec![chk("kernel", "AF_XDP socket", false, error.reason)];
    }
    let mut out = vec![chk(
        "kernel",
        "AF_XDP socket",
        true,
        "socket(AF_XDP, SOCK_RAW) created",
    )];
    type Probes = (io::Result<()>, io::Result<()>, io::Result<()>);
    let result = in_private_netns(|| -> io::Result<Probes> {
        let status = Command::new("ip")
            .args(["link", "add", "xv0", "type", "veth", "peer", "name", "xv1"])
            .status()?;
        if !status.success() {
            return Err(io::Error::other("ip link add veth failed"));
        }
        for i in ["xv0", "xv1"] {
            Command::new("ip").args(["link", "set", i, "up"]).status()?;
        }
        // SAFETY: NUL-terminated names; if_nametoindex resolves in this thread's netns.
        let (ifindex_a, ifindex_b) = unsafe {
            (
                libc::if_nametoindex(c"xv0".as_ptr()),
                libc::if_nametoindex(c"xv1".as_ptr()),
            )
        };
        // Native XDP first (attached and detached again), then the binds on
        // separate veth ends, so one teardown cannot interfere with another.
        let native = xdp::native_attach_probe("xv0");
        Ok((
            native,
            xsk_bind(ifindex_a, xdp::XDP_COPY | xdp::XDP_USE_NEED_WAKEUP),
            xsk_bind(ifindex_b, xdp::XDP_ZEROCOPY),
        ))
    });
    match result {
        Ok(Ok((native, copy, zc))) => {
            out.push(chk(
                "kernel",
                "XDP native mode (veth)",
                native.is_ok(),
                match native {
                    Ok(()) => "program attached with BPF_LINK_CREATE + XDP_FLAGS_DRV_MODE (driver \
                               mode: runs in veth's NAPI poll), detached again"
                        .into(),
                    Err(error) => format!("native attach refused (generic mode only): {error}"),
                },
            ));
            out.push(chk(
                "kernel",
                "AF_XDP copy mode (veth)",
                copy.is_ok(),
                match copy {
                    Ok(()) => "UMEM registered, XSK bound to a veth queue 0 with XDP_COPY | \
                               XDP_USE_NEED_WAKEUP"
                        .into(),
                    Err(error) => {
                        format!("bind with XDP_COPY | XDP_USE_NEED_WAKEUP failed: {error}")
                    }
                },
            ));
            out.push(chk(
                "kernel",
                "AF_XDP zero-copy (veth)",
                zc.is_ok(),
                match zc {
                    Ok(()) => "bound with XDP_ZEROCOPY".into(),
                    Err(error) => format!("bind with XDP_ZEROCOPY refused: {error}"),
                },
            ));
        }
        Ok(Err(error)) | Err(error) => out.push(chk(
            "kernel",
            "AF_XDP copy mode (veth)",
            false,
            format!("probe failed: {error}"),
        )),
    }
    out
}

/// Register a small UMEM, size the rings and bind to `ifindex` queue 0 with
/// `flags` (the xdp backend's own set-up steps); everything is released on return.
fn xsk_bind(ifindex: u32, flags: u16) -> io::Result<()> {
    if ifindex == 0 {
        return Err(io::Error::new(
            io::ErrorKind::NotFound,
            "no ifindex for the veth",
        ));
    }
    let xsk = xdp::xsk_setup(16, 4096, 16)?;
    xdp::xsk_bind(xsk.fd.as_raw_fd(), ifindex, 0, flags)
}

/// netem (and tbf for contrast) in a throwaway private namespace.
fn probe_qdiscs() -> Vec<Check> {
    let try_qdisc = |args: &'static [&'static str]| -> Result<(), ProbeError> {
        match in_private_netns(move || Command::new("tc").args(args).output()) {
            Ok(Ok(o)) if o.status.success() => Ok(()),
            Ok(Ok(o)) => Err(ProbeError::Failed {
                stderr: String::from_utf8_lossy(&o.stderr).trim().to_string(),
            }),
            Ok(Err(source)) | Err(source) => Err(ProbeError::Spawn {
                program: "tc",
                source,
            }),
        }
    };
    let netem = try_qdisc(&["qdisc", "add", "dev", "lo", "root", "netem", "delay", "1ms"]);
    let tbf = try_qdisc(&[
        "qdisc", "add", "dev", "lo", "root", "tbf", "rate", "1mbit", "burst", "32kbit", "latency",
        "400ms",
    ]);
    vec![
        chk(
            "impair",
            "tc netem",
            netem.is_ok(),
            match netem {
                Ok(()) => {
                    "tc qdisc add dev lo root netem delay 1ms: ok (private netns)".to_string()
                }
                Err(e) => format!("tc qdisc add ... netem delay 1ms (private netns): {e}"),
            },
        ),
        chk(
            "impair",
            "tc tbf",
            tbf.is_ok(),
            match tbf {
                Ok(()) => "tc qdisc add dev lo root tbf: ok (private netns)".to_string(),
                Err(e) => format!("tc qdisc add ... tbf (private netns): {e}"),
            },
        ),
    ]
}

fn probe_sched() -> Vec<Check> {
    let (slice, fifo, base) = std::thread::spawn(|| {
        let base = thread::slice().map(|d| d.as_micros()).unwrap_or(0);
        let slice_result = thread::set_slice(Duration::from_millis(2));
        let fifo_result = thread::set_policy(Policy::Fifo(1));
        if fifo_result.is_applied() {
            let _ = thread::set_policy(Policy::Other);
        }
        (slice_result, fifo_result, base)
    })
    .join()
    .unwrap_or((
        Outcome::Refused("probe thread panicked".into()),
        Outcome::Refused("probe thread panicked".into()),
        0,
    ));
    vec![
        chk(
            "sched",
            "EEVDF slice (sched_setattr)",
            slice.is_applied(),
            format!("default slice {base} us; request 2 ms on a test thread: {slice}"),
        ),
        chk(
            "sched",
            "SCHED_FIFO",
            fifo.is_applied(),
            format!("fifo:1 on a test thread: {fifo} (restored to other)"),
        ),
    ]
}

/// Can `/sys/kernel/debug/sched/*` be used? Tries in a private mount
/// namespace (propagation off), mounting debugfs/securityfs there if needed.
fn probe_debugfs_sched() -> Check {
    // Ok: (the knobs can be opened for writing, what the probe saw).
    let result = std::thread::spawn(|| -> Result<(bool, String), ProbeError> {
        // SAFETY: unshare affects only this thread (mount namespace and fs info).
        sys::cvt(unsafe { libc::unshare(libc::CLONE_NEWNS) })
            .map_err(ProbeError::refused("unshare(CLONE_NEWNS)"))?;
        let root = c"/";
        // SAFETY: make every mount in our new namespace private, so nothing we
        // mount propagates to the host; on failure we stop before mounting.
        sys::cvt(unsafe {
            libc::mount(
                std::ptr::null(),
                root.as_ptr(),
                std::ptr::null(),
                libc::MS_REC | libc::MS_PRIVATE,
                std::ptr::null(),
            )
        })
        .map_err(ProbeError::refused("make / private"))?;
        let mut notes = Vec::new();
        let mut mount_fs = |fs: &std::ffi::CStr, dir: &std::ffi::CStr, probe: &str| {
            if std::path::Path::new(probe).exists() {
                return;
            }
            // SAFETY: NUL-terminated strings; the mount lives only in this private namespace.
            let unshared = sys::cvt(unsafe {
                libc::mount(fs.as_ptr(), dir.as_ptr(), fs.as_ptr(), 0, std::ptr::null())
            });
            if let Err(error) = unshared {
                notes.push(format!(
                    "mount {}: {}",
                    fs.to_string_lossy(),
                    errno_reason(&error)
                ));
            } else {
                notes.push(format!(
                    "{} was not mounted (mounted privately for the probe)",
                    fs.to_string_lossy()
                ));
            }
        };
        mount_fs(c"debugfs", c"/sys/kernel/debug", "/sys/kernel/debug/sched");
        mount_fs(
            c"securityfs",
            c"/sys/kernel/security",
            "/sys/kernel/security/lockdown",
        );
        let lockdown = std::fs::read_to_string("/sys/kernel/security/lockdown")
            .map(|s| s.trim().to_string())
            .unwrap_or_else(|error| format!("unreadable ({error})"));
        let slice_path = "/sys/kernel/debug/sched/base_slice_ns";
        let read = std::fs::File::open(slice_path).map(|_| ());
        // Opening for write changes nothing until something is written; we write nothing.
        let write = std::fs::OpenOptions::new()
            .write(true)
            .open(slice_path)
            .map(|_| ());
        let fmt = |result: &io::Result<()>| match result {
            Ok(()) => "ok".to_string(),
            Err(error) => errno_reason(error),
        };
        let mode = lockdown
            .split_whitespace()
            .find(|w| w.starts_with('['))
            .map(|w| w.trim_matches(|c| c == '[' || c == ']').to_string())
            .unwrap_or_default();
        let why = if write
            .as_ref()
            .is_err_and(|error| error.raw_os_error() == Some(libc::EPERM))
            && (mode == "integrity" || mode == "confidentiality")
        {
            format!(" => blocked by kernel lockdown ({mode}): debugfs files cannot be opened")
        } else {
            String::new()
        };
        let text = format!(
            "{}open {slice_path} read: {}, write: {}; lockdown: {lockdown}{why}",
            if notes.is_empty() {
                String::new()
            } else {
                format!("{}; ", notes.join("; "))
            },
            fmt(&read),
            fmt(&write),
        );
        Ok((write.is_ok(), text))
    })
    .join()
    .unwrap_or(Err(ProbeError::Panicked));
    match result {
        Ok((ok, t)) => chk("sched", "debugfs sched knobs", ok, t),
        Err(error) => chk("sched", "debugfs sched knobs", false, error.to_string()),
    }
}

/// Scheduler knob files the SIP lab may map the papers' knobs to, over all
/// kernel generations: pre-5.13 sysctls, 5.13+ debugfs (CFS names, then
/// EEVDF's `base_slice_ns`), and the sched features file.
pub const SCHED_KNOB_PATHS: &[&str] = &[
    "/proc/sys/kernel/sched_latency_ns",
    "/proc/sys/kernel/sched_min_granularity_ns",
    "/proc/sys/kernel/sched_wakeup_granularity_ns",
    "/proc/sys/kernel/sched_migration_cost_ns",
    "/proc/sys/kernel/sched_tunable_scaling",
    "/sys/kernel/debug/sched/latency_ns",
    "/sys/kernel/debug/sched/min_granularity_ns",
    "/sys/kernel/debug/sched/wakeup_granularity_ns",
    "/sys/kernel/debug/sched/base_slice_ns",
    "/sys/kernel/debug/sched/migration_cost_ns",
    "/sys/kernel/debug/sched/tunable_scaling",
    "/sys/kernel/debug/sched/features",
];

/// What the calling process (the lab, in its own mount namespace: nothing
/// is mounted for the probe) can do with one knob file.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct KnobAccess {
    /// The file.
    pub path: String,
    /// Its current value (trimmed), or why it cannot be read.
    pub value: Result<String, String>,
    /// Ok when it opens for writing (nothing is written), else why not.
    pub writable: Result<(), String>,
}

/// Why `/sys/kernel/debug` files are missing or refused, in words.
fn debugfs_reason(e: &io::Error) -> String {
    let mounted = std::fs::read_to_string("/proc/self/mounts")
        .map(|m| {
            m.lines()
                .any(|l| l.split_whitespace().nth(1) == Some("/sys/kernel/debug"))
        })
        .unwrap_or(false);
    let lockdown = std::fs::read_to_string("/sys/kernel/security/lockdown")
        .map(|s| s.trim().to_string())
        .ok();
    if !mounted {
        return "debugfs is not mounted in the lab's mount namespace (the lab does not mount it)"
            .into();
    }
    if e.raw_os_error() == Some(libc::EPERM) {
        return match lockdown {
            Some(l) => format!("refused by the kernel (lockdown: {l})"),
            None => "refused by the kernel (EPERM; debugfs locked down?)".into(),
        };
    }
    errno_reason(e)
}

/// Probe every [`SCHED_KNOB_PATHS`] file as the lab would use it: in the
/// caller's mount namespace, opening for reading and for writing (nothing
/// is written, nothing is mounted).
pub fn sched_knob_access() -> Vec<KnobAccess> {
    SCHED_KNOB_PATHS
        .iter()
        .map(|&path| {
            let why = |e: &io::Error| {
                if path.starts_with("/sys/kernel/debug") {
                    debugfs_reason(e)
                } else if e.kind() == io::ErrorKind::NotFound {
                    "no such sysctl on this kernel".into()
                } else {
                    errno_reason(e)
                }
            };
            let value = std::fs::read_to_string(path)
                .map(|v| v.trim().to_string())
                .map_err(|e| why(&e));
            // Opening for write changes nothing until something is written.
            let writable = std::fs::OpenOptions::new()
                .write(true)
                .open(path)
                .map(|_| ())
                .map_err(|e| why(&e));
            KnobAccess {
                path: path.to_string(),
                value,
                writable,
            }
        })
        .collect()
}

/// The scheduler knobs `ringway lab sip` itself can write (its mount
/// namespace, no private debugfs mount), and why the others are refused.
fn probe_lab_sched_knobs() -> Check {
    let acc = sched_knob_access();
    let writable: Vec<&str> = acc
        .iter()
        .filter(|a| a.writable.is_ok())
        .map(|a| a.path.as_str())
        .collect();
    let mut reasons: Vec<String> = acc
        .iter()
        .filter_map(|a| a.writable.as_ref().err().cloned())
        .collect();
    reasons.sort();
    reasons.dedup();
    let detail = format!(
        "writable by the lab: {}; refused: {}; per-thread slice/policy/nice (sched_setattr) and process-wide affinity: see the checks above",
        if writable.is_empty() {
            "none".to_string()
        } else {
            writable.join(", ")
        },
        if reasons.is_empty() {
            "none".to_string()
        } else {
            reasons.join("; ")
        }
    );
    chk(
        "sched",
        "scheduler knobs the lab can write",
        !writable.is_empty(),
        detail,
    )
}

fn perf_open(ty: u32, config: u64) -> io::Result<()> {
    // struct perf_event_attr, version 0 layout (64 bytes) inside a larger zeroed buffer.
    let mut attr = [0u64; 16];
    attr[0] = ty as u64 | (64u64 << 32); // type, size
    attr[1] = config;
    attr[6] = 1 | (1 << 5) | (1 << 6); // disabled, exclude_kernel, exclude_hv
                                       // SAFETY: attr is a live buffer at least `size` (64) bytes long; pid 0 = self, cpu -1 = any.
    let fd =
        sys::cvt(unsafe { libc::syscall(libc::SYS_perf_event_open, attr.as_ptr(), 0, -1, -1, 0) })?;
    // SAFETY: the descriptor we were just given; dropping it closes it.
    drop(unsafe { OwnedFd::from_raw_fd(fd as i32) });
    Ok(())
}

fn probe_perf() -> Vec<Check> {
    let paranoid = read_sysctl("kernel/perf_event_paranoid")
        .map(|v| v.to_string())
        .unwrap_or_else(|e| format!("unreadable ({e})"));
    let hardware = perf_open(0, 0); // PERF_TYPE_HARDWARE, PERF_COUNT_HW_CPU_CYCLES
    let software = perf_open(1, 1); // PERF_TYPE_SOFTWARE, PERF_COUNT_SW_TASK_CLOCK
    vec![
        chk(
            "perf",
            "perf hardware counters",
            hardware.is_ok(),
            match &hardware {
                Ok(()) => format!("perf_event_open(CPU_CYCLES) ok; perf_event_paranoid={paranoid}"),
                Err(e) => format!(
                    "perf_event_open(CPU_CYCLES) refused: {}{}; perf_event_paranoid={paranoid}",
                    errno_reason(e),
                    if matches!(e.raw_os_error(), Some(libc::ENOENT | libc::EOPNOTSUPP)) {
                        " => no hardware PMU exposed to this kernel (usual in VMs)"
                    } else {
                        ""
                    }
                ),
            },
        ),
        chk(
            "perf",
            "perf software counters",
            software.is_ok(),
            match &software {
                Ok(()) => "perf_event_open(TASK_CLOCK) ok".to_string(),
                Err(e) => format!("perf_event_open(TASK_CLOCK) refused: {}", errno_reason(e)),
            },
        ),
    ]
}

/// Render the report as aligned text.
pub fn render_text(r: &DoctorReport) -> String {
    let mut out = format!(
        "kernel   {}\nmachine  {} ({} CPUs online){}\n\n",
        r.kernel,
        r.machine,
        r.cpus,
        if r.root {
            ", running as root"
        } else {
            ", not root"
        }
    );
    let width = r.checks.iter().map(|c| c.name.len()).max().unwrap_or(10);
    let mut area = String::new();
    for c in &r.checks {
        if c.area != area {
            area = c.area.clone();
            out.push_str(&format!("[{area}]\n"));
        }
        out.push_str(&format!(
            "  {:<width$}  {:<3}  {}\n",
            c.name,
            if c.ok { "yes" } else { "NO" },
            c.detail
        ));
    }
    out.push_str("[sysctl]\n");
    for (k, v) in &r.sysctls {
        out.push_str(&format!("  {k} = {v}\n"));
    }
    out
}
