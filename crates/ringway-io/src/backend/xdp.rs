//! AF_XDP: an XDP program on the interface redirects the UDP datagrams for
//! our address and port into an XSK socket's RX ring; we copy their payload
//! into the caller's frames and build whole Ethernet/IPv4/UDP frames in the
//! UMEM for the TX ring.
//!
//! * The XDP program is hand-assembled eBPF loaded with `bpf(2)` (no C
//!   toolchain, no libbpf): IPv4 (any IHL, not a fragment), protocol UDP,
//!   destination address (when configured) and port equal to ours →
//!   `bpf_redirect_map(xskmap, rx_queue_index, XDP_PASS)`; everything else
//!   (ARP, ICMP, other ports, fragments) → `XDP_PASS` to the kernel stack.
//!   It is attached with `BPF_LINK_CREATE` in generic (SKB) mode; closing
//!   the link descriptor (drop) detaches it.
//! * The socket is bound with `XDP_COPY` (veth offers no zero-copy).
//! * A regular UDP socket stays bound to the same address and port, so the
//!   kernel answers nothing (no ICMP port unreachable) for our port, and so
//!   datagrams the program passes (IP fragments) are still received: the
//!   backend reads that socket too when the XSK has nothing.
//! * RX: no kernel RX timestamp (`RxMeta::kernel_rx` is `None`); `app_rx`
//!   is CLOCK_REALTIME after the ring is read, as for the other backends.
//! * TX: destination MAC from frames received (IP → MAC cache) or from the
//!   kernel neighbour table (`/proc/thread-self/net/arp`, complete entries
//!   on our interface); when unknown, the datagram goes out through the
//!   regular UDP socket instead (the kernel resolves the neighbour, so later
//!   datagrams take the XSK path); counted in `IoStats::tx_via_socket`.
//!   Destinations must be on-link (no routing). IPv4 only. No TX timestamps.

use crate::backend::{BackendKind, BackendUnavailable, BatchIo, IoStats};
use crate::batch::{RxBatch, RxMeta, TxBatch, TxStamp};
use crate::sys::{self, Mapping};
use crate::time::realtime_now;
use crate::wire::{write_udp_frame, Udp4Frame, UdpFrameAddrs, UDP_FRAME_OVERHEAD};
use std::collections::HashMap;
use std::io;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, UdpSocket};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU32, Ordering};
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
const XDP_COPY: u16 = 1 << 1;
const XDP_PGOFF_RX_RING: i64 = 0;
const XDP_PGOFF_TX_RING: i64 = 0x8000_0000;
const XDP_UMEM_PGOFF_FILL_RING: i64 = 0x1_0000_0000;
const XDP_UMEM_PGOFF_COMPLETION_RING: i64 = 0x1_8000_0000;

const BPF_MAP_CREATE: libc::c_long = 0;
const BPF_MAP_UPDATE_ELEM: libc::c_long = 2;
const BPF_PROG_LOAD: libc::c_long = 5;
const BPF_LINK_CREATE: libc::c_long = 28;
const BPF_MAP_TYPE_XSKMAP: u32 = 17;
const BPF_PROG_TYPE_XDP: u32 = 6;
const BPF_XDP: u32 = 37;
const XDP_FLAGS_SKB_MODE: u32 = 1 << 1;
/// `bpf_redirect_map` helper id.
const BPF_FUNC_REDIRECT_MAP: i32 = 51;
/// `XDP_PASS` action.
const XDP_PASS: i32 = 2;

/// Options of the AF_XDP backend.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct XdpConfig {
    /// Interface to attach to (in the calling thread's network namespace).
    pub ifname: String,
    /// Receive queue to bind (veth: 0).
    pub queue: u32,
    /// Our IPv4 address and UDP port. The address must be one of the
    /// interface's (it is the source of every frame sent); port 0 picks one.
    pub local: SocketAddrV4,
    /// UMEM frames, a power of two 16..=65536; half receive, half send.
    pub frames: u32,
    /// Bytes per UMEM frame: 2048 or 4096 (a received frame holds at most
    /// `frame_size - 256` bytes; longer ones are dropped by the kernel).
    pub frame_size: u32,
}

impl XdpConfig {
    /// Defaults (queue 0, 4096 frames of 2048 bytes) for `ifname` and `local`.
    pub fn new(ifname: &str, local: SocketAddrV4) -> XdpConfig {
        XdpConfig {
            ifname: ifname.to_string(),
            queue: 0,
            local,
            frames: 4096,
            frame_size: 2048,
        }
    }
}

fn err(what: &str, e: io::Error) -> io::Error {
    io::Error::new(
        e.kind(),
        format!("{what}: {}", crate::thread::errno_reason(&e)),
    )
}

fn check_rc(rc: libc::c_long, what: &str) -> io::Result<libc::c_long> {
    sys::cvt(rc).map_err(|e| err(what, e))
}

/// `bpf(cmd, attr, size)`.
fn bpf(cmd: libc::c_long, attr: &mut [u8; 128], what: &str) -> io::Result<OwnedFd> {
    // SAFETY: `attr` is a live, zero-initialised 128-byte union bpf_attr
    // prefix; the kernel reads (and for some commands writes) at most `size`.
    let rc = unsafe { libc::syscall(libc::SYS_bpf, cmd, attr.as_mut_ptr(), attr.len() as u32) };
    let fd = check_rc(rc, what)?;
    // SAFETY: the command returned a new descriptor that nobody else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

fn put32(a: &mut [u8], at: usize, v: u32) {
    a[at..at + 4].copy_from_slice(&v.to_ne_bytes());
}
fn put64(a: &mut [u8], at: usize, v: u64) {
    a[at..at + 8].copy_from_slice(&v.to_ne_bytes());
}

/// One eBPF instruction.
#[derive(Copy, Clone, Debug)]
#[repr(C)]
struct Insn {
    code: u8,
    regs: u8,
    off: i16,
    imm: i32,
}

fn insn(code: u8, dst: u8, src: u8, off: i16, imm: i32) -> Insn {
    Insn {
        code,
        regs: (src << 4) | (dst & 0x0f),
        off,
        imm,
    }
}

/// The XDP program (see the module docs). `port` and `daddr` in host order;
/// `daddr` 0 accepts any destination address.
fn xdp_program(map_fd: RawFd, port: u16, daddr: Ipv4Addr) -> Vec<Insn> {
    const LDXW: u8 = 0x61;
    const LDXH: u8 = 0x69;
    const LDXB: u8 = 0x71;
    const MOV64_IMM: u8 = 0xb7;
    const MOV64_REG: u8 = 0xbf;
    const ADD64_IMM: u8 = 0x07;
    const ADD64_REG: u8 = 0x0f;
    const AND64_IMM: u8 = 0x57;
    const LSH64_IMM: u8 = 0x67;
    const RSH64_IMM: u8 = 0x77;
    const JGT_REG: u8 = 0x2d;
    const JNE32_IMM: u8 = 0x56;
    const JLT32_IMM: u8 = 0xa6;
    const LD_IMM64: u8 = 0x18;
    const CALL: u8 = 0x85;
    const EXIT: u8 = 0x95;
    /// Marker in `off` for "jump to the pass label", patched below.
    const TO_PASS: i16 = i16::MIN;
    // Values as a little-endian load of the big-endian wire bytes sees them.
    let le16 = |v: u16| u16::from_le_bytes(v.to_be_bytes()) as i32;
    let le32 = |v: [u8; 4]| u32::from_le_bytes(v) as i32;
    let mut p = vec![
        insn(MOV64_REG, 6, 1, 0, 0), // r6 = ctx
        insn(LDXW, 2, 1, 0, 0),      // r2 = ctx->data
        insn(LDXW, 3, 1, 4, 0),      // r3 = ctx->data_end
        insn(MOV64_REG, 4, 2, 0, 0), // r4 = data + eth + 20 + udp
        insn(ADD64_IMM, 4, 0, 0, 42),
        insn(JGT_REG, 4, 3, TO_PASS, 0),
        insn(LDXH, 5, 2, 12, 0), // ethertype
        insn(JNE32_IMM, 5, 0, TO_PASS, le16(0x0800)),
        insn(LDXB, 5, 2, 23, 0), // IP protocol
        insn(JNE32_IMM, 5, 0, TO_PASS, 17),
        insn(LDXH, 5, 2, 20, 0), // flags + fragment offset: MF or offset set
        insn(AND64_IMM, 5, 0, 0, le16(0x3fff)),
        insn(JNE32_IMM, 5, 0, TO_PASS, 0),
        insn(LDXB, 5, 2, 14, 0), // version + IHL
        insn(MOV64_REG, 7, 5, 0, 0),
        insn(RSH64_IMM, 7, 0, 0, 4),
        insn(JNE32_IMM, 7, 0, TO_PASS, 4),
        insn(AND64_IMM, 5, 0, 0, 0x0f),
        insn(JLT32_IMM, 5, 0, TO_PASS, 5),
    ];
    if !daddr.is_unspecified() {
        p.push(insn(LDXW, 7, 2, 30, 0)); // IPv4 destination
        p.push(insn(JNE32_IMM, 7, 0, TO_PASS, le32(daddr.octets())));
    }
    p.extend([
        insn(LSH64_IMM, 5, 0, 0, 2),  // IHL * 4 (bounded 20..60)
        insn(ADD64_REG, 2, 5, 0, 0),  // r2 = data + IP header length
        insn(MOV64_REG, 4, 2, 0, 0),  // r4 = end of the UDP header
        insn(ADD64_IMM, 4, 0, 0, 22), // eth 14 + UDP 8
        insn(JGT_REG, 4, 3, TO_PASS, 0),
        insn(LDXH, 5, 2, 16, 0), // UDP destination port
        insn(JNE32_IMM, 5, 0, TO_PASS, le16(port)),
        insn(LDXW, 2, 6, 16, 0),         // key = ctx->rx_queue_index
        insn(LD_IMM64, 1, 1, 0, map_fd), // r1 = xskmap (BPF_PSEUDO_MAP_FD)
        insn(0, 0, 0, 0, 0),
        insn(MOV64_IMM, 3, 0, 0, XDP_PASS), // flags: XDP_PASS when no socket
        insn(CALL, 0, 0, 0, BPF_FUNC_REDIRECT_MAP),
        insn(EXIT, 0, 0, 0, 0),
    ]);
    let pass = p.len();
    p.push(insn(MOV64_IMM, 0, 0, 0, XDP_PASS));
    p.push(insn(EXIT, 0, 0, 0, 0));
    for (i, x) in p.iter_mut().enumerate() {
        if x.off == TO_PASS {
            x.off = (pass - i - 1) as i16;
        }
    }
    p
}

/// The XSKMAP, the program and the link that attaches it.
struct Attached {
    // Declared first: dropping the link detaches the program before the
    // rest goes away.
    _link: OwnedFd,
    _prog: OwnedFd,
    _map: OwnedFd,
}

fn attach(
    ifindex: u32,
    queue: u32,
    xsk: RawFd,
    port: u16,
    daddr: Ipv4Addr,
) -> io::Result<Attached> {
    let (map, prog_fd) = load(queue, Some(xsk), port, daddr)?;
    let mut a = [0u8; 128];
    put32(&mut a, 0, prog_fd.as_raw_fd() as u32);
    put32(&mut a, 4, ifindex);
    put32(&mut a, 8, BPF_XDP);
    put32(&mut a, 12, XDP_FLAGS_SKB_MODE);
    let link = bpf(
        BPF_LINK_CREATE,
        &mut a,
        "BPF_LINK_CREATE(BPF_XDP, XDP_FLAGS_SKB_MODE)",
    )?;
    Ok(Attached {
        _link: link,
        _prog: prog_fd,
        _map: map,
    })
}

/// Create the XSKMAP (with `xsk` at `queue` when given) and load the XDP
/// program that redirects into it; returns (map, program). Nothing is
/// attached: both are released when their descriptors close.
fn load(
    queue: u32,
    xsk: Option<RawFd>,
    port: u16,
    daddr: Ipv4Addr,
) -> io::Result<(OwnedFd, OwnedFd)> {
    let mut a = [0u8; 128];
    put32(&mut a, 0, BPF_MAP_TYPE_XSKMAP);
    put32(&mut a, 4, 4); // key size
    put32(&mut a, 8, 4); // value size
    put32(&mut a, 12, (queue + 1).max(64)); // max entries
    a[28..28 + 7].copy_from_slice(b"rw_xsks");
    let map = bpf(BPF_MAP_CREATE, &mut a, "BPF_MAP_CREATE(XSKMAP)")?;
    if let Some(xsk) = xsk {
        let key: u32 = queue;
        let val: u32 = xsk as u32;
        let mut a = [0u8; 128];
        put32(&mut a, 0, map.as_raw_fd() as u32);
        put64(&mut a, 8, &key as *const u32 as u64);
        put64(&mut a, 16, &val as *const u32 as u64);
        // SAFETY: the attr holds the map fd and pointers to the live key/value.
        let rc =
            unsafe { libc::syscall(libc::SYS_bpf, BPF_MAP_UPDATE_ELEM, a.as_mut_ptr(), 128u32) };
        check_rc(rc, "BPF_MAP_UPDATE_ELEM(xskmap[queue] = socket)")?;
    }
    let prog = xdp_program(map.as_raw_fd(), port, daddr);
    let license = c"GPL";
    let mut log = vec![0u8; 16384];
    let mut a = [0u8; 128];
    put32(&mut a, 0, BPF_PROG_TYPE_XDP);
    put32(&mut a, 4, prog.len() as u32);
    put64(&mut a, 8, prog.as_ptr() as u64);
    put64(&mut a, 16, license.as_ptr() as u64);
    put32(&mut a, 24, 1); // log level
    put32(&mut a, 28, log.len() as u32);
    put64(&mut a, 32, log.as_mut_ptr() as u64);
    a[48..48 + 9].copy_from_slice(b"rw_xdp_rx");
    put32(&mut a, 68, BPF_XDP); // expected attach type
    let prog_fd = bpf(BPF_PROG_LOAD, &mut a, "BPF_PROG_LOAD(XDP)").map_err(|e| {
        let end = log.iter().position(|&b| b == 0).unwrap_or(log.len());
        let v = String::from_utf8_lossy(&log[..end]);
        let tail: String = v.lines().rev().take(6).collect::<Vec<_>>().join(" | ");
        io::Error::new(e.kind(), format!("{e}; verifier: {tail}"))
    })?;
    Ok((map, prog_fd))
}

/// `struct xdp_ring_offset`.
#[derive(Copy, Clone, Default, Debug)]
#[repr(C)]
struct RingOffset {
    producer: u64,
    consumer: u64,
    desc: u64,
    flags: u64,
}

/// One single-producer/single-consumer ring shared with the kernel.
struct Ring {
    map: Mapping,
    off: RingOffset,
    size: u32,
    /// Our producer index (producer rings) or consumer index (consumer rings).
    local: u32,
}

impl Ring {
    fn new(
        fd: RawFd,
        off: RingOffset,
        size: u32,
        entry: usize,
        pgoff: i64,
        what: &str,
    ) -> io::Result<Ring> {
        let len = off.desc as usize + size as usize * entry;
        let map =
            Mapping::shared(fd, len, pgoff).map_err(|e| err(&format!("mmap {what} ring"), e))?;
        let mut r = Ring {
            map,
            off,
            size,
            local: 0,
        };
        // Start from where the kernel's indices are (both 0 on a new ring).
        r.local = if pgoff == XDP_UMEM_PGOFF_FILL_RING || pgoff == XDP_PGOFF_TX_RING {
            r.producer().load(Ordering::Relaxed)
        } else {
            r.consumer().load(Ordering::Relaxed)
        };
        Ok(r)
    }
    fn producer(&self) -> &AtomicU32 {
        // SAFETY: the kernel put the u32 producer index at this offset inside
        // the mapping (4-byte aligned); it is only accessed atomically.
        unsafe {
            &*self
                .map
                .ptr
                .add(self.off.producer as usize)
                .cast::<AtomicU32>()
        }
    }
    fn consumer(&self) -> &AtomicU32 {
        // SAFETY: as for `producer`.
        unsafe {
            &*self
                .map
                .ptr
                .add(self.off.consumer as usize)
                .cast::<AtomicU32>()
        }
    }
    fn slot(&self, idx: u32, entry: usize) -> *mut u8 {
        let i = (idx & (self.size - 1)) as usize;
        // SAFETY: i < size, so the entry lies inside the descriptor array of the mapping.
        unsafe { self.map.ptr.add(self.off.desc as usize + i * entry) }
    }
    /// Producer ring: free slots.
    fn free(&self) -> u32 {
        self.size
            - self
                .local
                .wrapping_sub(self.consumer().load(Ordering::Acquire))
    }
    /// Producer ring: entries the kernel has not consumed yet.
    fn pending(&self) -> u32 {
        self.local
            .wrapping_sub(self.consumer().load(Ordering::Acquire))
    }
    /// Producer ring: queue an address (fill ring).
    fn push_addr(&mut self, addr: u64) {
        // SAFETY: the slot is an 8-byte aligned u64 entry of a ring we
        // produce; the kernel reads it only after `publish`.
        unsafe { self.slot(self.local, 8).cast::<u64>().write_volatile(addr) };
        self.local = self.local.wrapping_add(1);
    }
    /// Producer ring: queue a descriptor (TX ring).
    fn push_desc(&mut self, addr: u64, len: u32) {
        let p = self.slot(self.local, 16);
        // SAFETY: the slot is a 16-byte `struct xdp_desc` of a ring we produce.
        unsafe {
            p.cast::<u64>().write_volatile(addr);
            p.add(8).cast::<u32>().write_volatile(len);
            p.add(12).cast::<u32>().write_volatile(0);
        }
        self.local = self.local.wrapping_add(1);
    }
    /// Producer ring: make queued entries visible.
    fn publish(&self) {
        self.producer().store(self.local, Ordering::Release);
    }
    /// Consumer ring: entries ready.
    fn ready(&self) -> u32 {
        self.producer()
            .load(Ordering::Acquire)
            .wrapping_sub(self.local)
    }
    /// Consumer ring: the address at our index + k (completion ring).
    fn peek_addr(&self, k: u32) -> u64 {
        // SAFETY: an entry the kernel published (k < ready()), u64 aligned.
        unsafe {
            self.slot(self.local.wrapping_add(k), 8)
                .cast::<u64>()
                .read_volatile()
        }
    }
    /// Consumer ring: the descriptor at our index + k (RX ring).
    fn peek_desc(&self, k: u32) -> (u64, u32) {
        let p = self.slot(self.local.wrapping_add(k), 16);
        // SAFETY: an entry the kernel published (k < ready()).
        unsafe {
            (
                p.cast::<u64>().read_volatile(),
                p.add(8).cast::<u32>().read_volatile(),
            )
        }
    }
    /// Consumer ring: hand `n` entries back.
    fn release(&mut self, n: u32) {
        self.local = self.local.wrapping_add(n);
        self.consumer().store(self.local, Ordering::Release);
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

fn parse_mac(s: &str) -> Option<[u8; 6]> {
    let mut m = [0u8; 6];
    let mut it = s.split(':');
    for b in m.iter_mut() {
        *b = u8::from_str_radix(it.next()?, 16).ok()?;
    }
    it.next().is_none().then_some(m)
}

/// Complete entries of `/proc/<...>/net/arp` on `dev`.
fn read_arp(dev: &str) -> Vec<(Ipv4Addr, [u8; 6])> {
    let Ok(t) = std::fs::read_to_string("/proc/thread-self/net/arp") else {
        return Vec::new();
    };
    t.lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            if f.len() < 6 || f[5] != dev {
                return None;
            }
            let flags = u32::from_str_radix(f[2].trim_start_matches("0x"), 16).ok()?;
            if flags & 0x2 == 0 {
                return None; // ATF_COM: resolved
            }
            let mac = parse_mac(f[3])?;
            (mac != [0; 6]).then_some((f[0].parse().ok()?, mac))
        })
        .collect()
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
/// (`XDP_COPY`, `XDP_ZEROCOPY`).
pub(crate) fn xsk_bind(fd: RawFd, ifindex: u32, queue: u32, flags: u16) -> io::Result<()> {
    #[repr(C)]
    struct SockaddrXdp {
        family: u16,
        flags: u16,
        ifindex: u32,
        queue_id: u32,
        shared_umem_fd: u32,
    }
    let sa = SockaddrXdp {
        family: AF_XDP as u16,
        flags,
        ifindex,
        queue_id: queue,
        shared_umem_fd: 0,
    };
    // SAFETY: pointer/length describe a live sockaddr_xdp.
    let rc = sys::cvt(unsafe {
        libc::bind(
            fd,
            (&sa as *const SockaddrXdp).cast(),
            std::mem::size_of::<SockaddrXdp>() as u32,
        )
    });
    rc.map(drop).map_err(|e| {
        let mode = if flags & XDP_COPY != 0 {
            "XDP_COPY"
        } else {
            "XDP_ZEROCOPY"
        };
        err(
            &format!("bind AF_XDP to ifindex {ifindex} queue {queue} ({mode})"),
            e,
        )
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

/// Most IP → MAC entries remembered.
const MAX_NEIGH: usize = 65536;

/// AF_XDP backend (see the module docs).
pub(crate) struct XdpBackend {
    // Drop order: detach the program, then close the XSK (which the map
    // refers to), unmap its rings, and only then the UMEM.
    _attached: Attached,
    rx: Ring,
    tx: Ring,
    fill: Ring,
    comp: Ring,
    xsk: OwnedFd,
    umem: Mapping,
    sock: UdpSocket,
    cfg: XdpConfig,
    local: SocketAddrV4,
    mac: [u8; 6],
    mtu: usize,
    /// TX frames (UMEM offsets) not in the TX ring.
    tx_free: Vec<u64>,
    neigh: HashMap<Ipv4Addr, [u8; 6]>,
    arp_read: Option<Instant>,
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
    pub(crate) fn open(cfg: XdpConfig) -> io::Result<XdpBackend> {
        let bad = |m: &str| io::Error::new(io::ErrorKind::InvalidInput, m.to_string());
        if !(16..=65536).contains(&cfg.frames) || !cfg.frames.is_power_of_two() {
            return Err(bad("xdp frames must be a power of two in 16..=65536"));
        }
        if cfg.frame_size != 2048 && cfg.frame_size != 4096 {
            return Err(bad("xdp frame size must be 2048 or 4096"));
        }
        if cfg.local.ip().is_unspecified() || cfg.local.ip().is_loopback() {
            return Err(bad(
                "xdp backend needs the interface's own IPv4 address to listen on (not 0.0.0.0 or loopback)",
            ));
        }
        let sock = UdpSocket::bind(cfg.local).map_err(|e| {
            err(
                &format!("binding the companion UDP socket {}", cfg.local),
                e,
            )
        })?;
        sock.set_nonblocking(true)?;
        let local = match sock.local_addr()? {
            SocketAddr::V4(a) => a,
            SocketAddr::V6(_) => return Err(bad("xdp backend is IPv4 only")),
        };
        let (mac, mtu) = if_info(sock.as_raw_fd(), &cfg.ifname)?;
        let cname =
            std::ffi::CString::new(cfg.ifname.clone()).map_err(|_| bad("bad interface name"))?;
        // SAFETY: NUL-terminated name; resolved in this thread's namespace.
        let ifindex = unsafe { libc::if_nametoindex(cname.as_ptr()) };
        if ifindex == 0 {
            return Err(err(&format!("interface {}", cfg.ifname), sys::last_err()));
        }
        let half = cfg.frames / 2;
        let XskSetup { fd: xsk, umem } = xsk_setup(cfg.frames, cfg.frame_size, half)?;
        let fd = xsk.as_raw_fd();
        let fs = cfg.frame_size as usize;
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
        let rx = Ring::new(fd, offs[0], half, 16, XDP_PGOFF_RX_RING, "RX")?;
        let tx = Ring::new(fd, offs[1], half, 16, XDP_PGOFF_TX_RING, "TX")?;
        let mut fill = Ring::new(fd, offs[2], half, 8, XDP_UMEM_PGOFF_FILL_RING, "fill")?;
        let comp = Ring::new(
            fd,
            offs[3],
            half,
            8,
            XDP_UMEM_PGOFF_COMPLETION_RING,
            "completion",
        )?;
        for i in 0..half as u64 {
            fill.push_addr(i * fs as u64);
        }
        fill.publish();
        let tx_free: Vec<u64> = (half as u64..cfg.frames as u64)
            .map(|i| i * fs as u64)
            .collect();
        xsk_bind(fd, ifindex, cfg.queue, XDP_COPY)
            .map_err(|e| io::Error::new(e.kind(), format!("{} ({})", e, cfg.ifname)))?;
        let attached = attach(ifindex, cfg.queue, fd, local.port(), *local.ip())?;
        Ok(XdpBackend {
            _attached: attached,
            rx,
            tx,
            fill,
            comp,
            xsk,
            umem,
            sock,
            cfg,
            local,
            mac,
            mtu,
            tx_free,
            neigh: HashMap::new(),
            arp_read: None,
            ip_id: 0,
            calls: 0,
            stats: IoStats::default(),
            scratch: vec![0u8; 65536],
        })
    }

    /// Take what the RX ring holds (up to the batch's room) into `batch`.
    fn take_rx(&mut self, batch: &mut RxBatch) -> usize {
        let room = batch.free_frames() as u32;
        let n = self.rx.ready().min(room);
        if n == 0 {
            return 0;
        }
        let app_rx = realtime_now();
        let fs = self.cfg.frame_size as u64;
        let mut added = 0;
        for k in 0..n {
            let (addr, len) = self.rx.peek_desc(k);
            // The UDP checksum is not verified: a sender on the same host
            // (veth, checksum offload) leaves it partial (pseudo-header sum
            // only), and generic XDP sees the frame before anyone completes it.
            let meta = match umem_slice(&self.umem, addr, len as usize).map(Udp4Frame::parse) {
                Some(Ok(Some(f)))
                    if f.udp.dst_port() == self.local.port()
                        && f.ip.dst() == *self.local.ip()
                        && f.ip.checksum_ok() =>
                {
                    // Learn the sender's MAC as a hint only: never a group
                    // address, never over a known entry (the kernel's
                    // neighbour table, re-read every second, overrides), and
                    // a full cache starts over instead of freezing.
                    let (src, mac) = (f.ip.src(), f.eth.src());
                    if mac[0] & 1 == 0 && !self.neigh.contains_key(&src) {
                        if self.neigh.len() >= MAX_NEIGH {
                            self.neigh.clear();
                        }
                        self.neigh.insert(src, mac);
                    }
                    let data = f.udp.payload();
                    let frame = batch.next_frame_mut().expect("room checked");
                    let c = data.len().min(frame.len());
                    frame[..c].copy_from_slice(&data[..c]);
                    Some(RxMeta {
                        peer: SocketAddr::V4(SocketAddrV4::new(src, f.udp.src_port())),
                        len: c,
                        truncated: data.len() > c,
                        kernel_rx: None,
                        app_rx,
                    })
                }
                _ => None,
            };
            match meta {
                Some(m) => {
                    batch.commit(m);
                    added += 1;
                }
                None => self.stats.rx_invalid += 1,
            }
            // The frame goes straight back to the fill ring (it has room: it
            // holds at most the RX frames, and this one was out of it).
            self.fill.push_addr(addr - addr % fs);
        }
        self.rx.release(n);
        self.fill.publish();
        self.stats.rx_packets += added as u64;
        added
    }

    /// Read datagrams the kernel stack delivered to the companion socket.
    fn take_socket(&mut self, batch: &mut RxBatch) -> io::Result<usize> {
        let mut added = 0;
        while batch.free_frames() > 0 {
            self.stats.rx_syscalls += 1;
            let flen = batch.frame_size();
            let r = self.sock.recv_from(&mut self.scratch);
            match r {
                Ok((n, peer)) => {
                    let c = n.min(flen);
                    let frame = batch.next_frame_mut().expect("room checked");
                    frame[..c].copy_from_slice(&self.scratch[..c]);
                    batch.commit(RxMeta {
                        peer,
                        len: c,
                        truncated: n > c,
                        kernel_rx: None,
                        app_rx: realtime_now(),
                    });
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
        let mut p = [
            libc::pollfd {
                fd: self.xsk.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: self.sock.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        self.stats.rx_syscalls += 1;
        if sys::ppoll(&mut p, timeout)? == 0 {
            return Ok((false, false));
        }
        if p[1].revents & libc::POLLERR != 0
            && sys::take_socket_error(self.sock.as_raw_fd()).is_some()
        {
            self.stats.socket_errors += 1;
        }
        Ok((p[0].revents != 0, p[1].revents & libc::POLLIN != 0))
    }

    /// Move completed TX frames back to the free list.
    fn reap_completions(&mut self) {
        let n = self.comp.ready();
        let fs = self.cfg.frame_size as u64;
        for k in 0..n {
            let a = self.comp.peek_addr(k);
            self.tx_free.push(a - a % fs);
        }
        if n > 0 {
            self.comp.release(n);
        }
    }

    /// Ask the kernel to transmit what the TX ring holds (copy mode sends
    /// at most 32 frames per call and then says EAGAIN).
    fn kick(&mut self) -> io::Result<()> {
        let mut tries = 0;
        while self.tx.pending() > 0 && tries < 64 + self.tx.size / 16 {
            tries += 1;
            self.stats.tx_syscalls += 1;
            // SAFETY: sendto with no buffer and no address only kicks the XSK.
            let rc = sys::cvt(unsafe {
                libc::sendto(
                    self.xsk.as_raw_fd(),
                    std::ptr::null(),
                    0,
                    libc::MSG_DONTWAIT,
                    std::ptr::null(),
                    0,
                )
            });
            if let Err(e) = rc {
                match e.raw_os_error() {
                    Some(libc::EAGAIN | libc::EBUSY | libc::ENOBUFS | libc::EINTR) => {
                        self.reap_completions();
                        continue;
                    }
                    _ => return Err(err("AF_XDP TX kick (sendto)", e)),
                }
            }
        }
        self.reap_completions();
        Ok(())
    }

    /// Destination MAC of an on-link `ip`.
    fn neighbour(&mut self, ip: Ipv4Addr) -> Option<[u8; 6]> {
        if ip.is_broadcast() {
            return Some([0xff; 6]);
        }
        // The kernel's neighbour table is authoritative: re-read it every
        // second, and at most every 50 ms while `ip` is unknown.
        let every = if self.neigh.contains_key(&ip) {
            Duration::from_secs(1)
        } else {
            Duration::from_millis(50)
        };
        if self.arp_read.is_none_or(|t| t.elapsed() >= every) {
            self.arp_read = Some(Instant::now());
            for (a, m) in read_arp(&self.cfg.ifname) {
                if self.neigh.len() >= MAX_NEIGH && !self.neigh.contains_key(&a) {
                    self.neigh.clear();
                }
                self.neigh.insert(a, m);
            }
        }
        self.neigh.get(&ip).copied()
    }

    fn xdp_stats(&self) -> Option<[u64; 6]> {
        let mut s = [0u64; 6];
        let mut len = std::mem::size_of_val(&s) as libc::socklen_t;
        // SAFETY: buffer pointer and in/out length describe the live array.
        let rc = sys::cvt(unsafe {
            libc::getsockopt(
                self.xsk.as_raw_fd(),
                SOL_XDP,
                XDP_STATISTICS,
                s.as_mut_ptr().cast(),
                &mut len,
            )
        });
        rc.ok().map(|_| s)
    }
}

impl BatchIo for XdpBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Xdp
    }
    fn local_addr(&self) -> io::Result<SocketAddr> {
        Ok(SocketAddr::V4(self.local))
    }
    fn raw_fd(&self) -> RawFd {
        self.xsk.as_raw_fd()
    }
    fn recv_batch(&mut self, batch: &mut RxBatch, timeout: Option<Duration>) -> io::Result<usize> {
        batch.clear();
        self.calls += 1;
        let deadline = timeout.map(|t| Instant::now() + t);
        self.take_rx(batch);
        // Now and then look at the companion socket even while the ring is
        // busy, so kernel-path datagrams (fragments) are not starved.
        if self.calls.is_multiple_of(64) && batch.free_frames() > 0 {
            self.take_socket(batch)?;
        }
        while batch.is_empty() {
            let left = deadline.map(|d| d.saturating_duration_since(Instant::now()));
            let (x, s) = self.wait(left)?;
            if x {
                self.take_rx(batch);
            }
            if s && batch.free_frames() > 0 {
                self.take_socket(batch)?;
            }
            if batch.is_empty() && deadline.is_some_and(|d| Instant::now() >= d) {
                break;
            }
        }
        Ok(batch.len())
    }
    fn send_batch(&mut self, batch: &TxBatch) -> io::Result<usize> {
        if batch.is_empty() {
            return Ok(0);
        }
        self.reap_completions();
        let fs = self.cfg.frame_size as usize;
        let max_payload = (self.mtu - 28).min(fs - UDP_FRAME_OVERHEAD);
        let mut queued = 0usize;
        let mut via_socket = 0usize;
        for (k, e) in batch.entries().iter().enumerate() {
            let data = batch.data(k);
            if e.stamp_tag.is_some() {
                self.stats.tx_stamps_lost += 1;
            }
            let SocketAddr::V4(dst) = e.dst else {
                self.stats.tx_errors += 1;
                continue;
            };
            let mac = if data.len() > max_payload {
                None
            } else {
                self.neighbour(*dst.ip())
            };
            let Some(dst_mac) = mac else {
                // Unknown neighbour (the kernel path resolves it) or larger
                // than one frame (the kernel fragments it, as the other
                // backends do).
                self.stats.tx_syscalls += 1;
                match self.sock.send_to(data, dst) {
                    Ok(_) => via_socket += 1,
                    Err(_) => self.stats.tx_errors += 1,
                }
                continue;
            };
            if self.tx_free.is_empty() {
                self.tx.publish();
                self.kick()?;
            }
            let Some(off) = self.tx_free.pop() else {
                self.stats.tx_errors += 1;
                continue;
            };
            let addrs = UdpFrameAddrs {
                src_mac: self.mac,
                dst_mac,
                src_ip: *self.local.ip(),
                dst_ip: *dst.ip(),
                src_port: self.local.port(),
                dst_port: dst.port(),
            };
            self.ip_id = self.ip_id.wrapping_add(1);
            // SAFETY: `off` is a TX frame we own (from the free list, not in
            // any ring), `fs` bytes inside the UMEM mapping.
            let frame =
                unsafe { std::slice::from_raw_parts_mut(self.umem.ptr.add(off as usize), fs) };
            let Some(len) = write_udp_frame(frame, &addrs, self.ip_id, data) else {
                self.tx_free.push(off);
                self.stats.tx_errors += 1;
                continue;
            };
            debug_assert!(self.tx.free() > 0, "TX ring holds at most the TX frames");
            self.tx.push_desc(off, len as u32);
            queued += 1;
        }
        self.tx.publish();
        self.kick()?;
        self.stats.tx_packets += (queued + via_socket) as u64;
        self.stats.tx_via_socket += via_socket as u64;
        Ok(queued + via_socket)
    }
    fn poll_tx_stamps(&mut self, _out: &mut Vec<TxStamp>) -> io::Result<usize> {
        Ok(0)
    }
    fn stats(&self) -> IoStats {
        let mut s = self.stats;
        if let Some(x) = self.xdp_stats() {
            // rx_dropped (no fill buffer, too long) + rx_ring_full.
            s.rx_dropped = x[0] + x[3];
        }
        s
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
    // The program as `open` loads it (with an address test), for a
    // documentation address and the discard port.
    let _loaded = load(0, None, 9, Ipv4Addr::new(192, 0, 2, 1)).map_err(unavailable)?;
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
    let a = topo.host("a").expect("built").clone();
    let b = topo.host("b").expect("built").clone();
    let (ifname, bip) = (b.ifaces[0].0.clone(), b.ifaces[0].1);
    let (ready_tx, ready_rx) = std::sync::mpsc::channel::<io::Result<u16>>();
    let server = b.spawn(move || -> io::Result<()> {
        let mut io = match XdpBackend::open(XdpConfig::new(&ifname, SocketAddrV4::new(bip, 0))) {
            Ok(io) => io,
            Err(e) => {
                let _ = ready_tx.send(Err(io::Error::new(e.kind(), e.to_string())));
                return Err(e);
            }
        };
        let _ = ready_tx.send(Ok(io.local.port()));
        let mut rx = RxBatch::new(4, 256);
        let end = Instant::now() + Duration::from_secs(3);
        while Instant::now() < end {
            io.recv_batch(&mut rx, Some(Duration::from_millis(100)))?;
            if let Some(d) = rx.iter().find(|d| d.data == b"xdp-probe") {
                let mut tx = TxBatch::new(1, 256);
                tx.push(d.meta.peer, b"xdp-probe-reply").map_err(io::Error::other)?;
                io.send_batch(&tx)?;
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
    let aip = a.ifaces[0].1;
    let client = a.run(move || -> io::Result<()> {
        let s = UdpSocket::bind((aip, 0))?;
        s.set_read_timeout(Some(Duration::from_millis(200)))?;
        let mut buf = [0u8; 256];
        for _ in 0..10 {
            s.send_to(b"xdp-probe", dst)?;
            if let Ok((n, from)) = s.recv_from(&mut buf) {
                if from == SocketAddr::V4(dst) && &buf[..n] == b"xdp-probe-reply" {
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
