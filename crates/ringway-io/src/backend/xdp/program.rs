//! The XDP programs, hand-assembled eBPF loaded with `bpf(2)` (no C
//! toolchain, no libbpf), and attaching them with `BPF_LINK_CREATE`:
//! native (driver) mode first, generic (SKB) mode as the fallback.

use crate::sys;
use std::io;
use std::net::Ipv4Addr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

pub(super) const BPF_MAP_CREATE: libc::c_long = 0;
pub(super) const BPF_MAP_LOOKUP_ELEM: libc::c_long = 1;
pub(super) const BPF_MAP_UPDATE_ELEM: libc::c_long = 2;
pub(super) const BPF_MAP_DELETE_ELEM: libc::c_long = 3;
const BPF_PROG_LOAD: libc::c_long = 5;
pub(super) const BPF_LINK_CREATE: libc::c_long = 28;
const BPF_MAP_TYPE_XSKMAP: u32 = 17;
const BPF_PROG_TYPE_XDP: u32 = 6;
const BPF_XDP: u32 = 37;
const XDP_FLAGS_SKB_MODE: u32 = 1 << 1;
const XDP_FLAGS_DRV_MODE: u32 = 1 << 2;
/// `bpf_ktime_get_ns` helper id (CLOCK_MONOTONIC).
const BPF_FUNC_KTIME_GET_NS: i32 = 5;
/// `bpf_redirect_map` helper id.
const BPF_FUNC_REDIRECT_MAP: i32 = 51;
/// `bpf_xdp_adjust_meta` helper id.
const BPF_FUNC_XDP_ADJUST_META: i32 = 54;
/// `XDP_PASS` action.
const XDP_PASS: i32 = 2;
/// Bytes of metadata the program puts in front of a redirected frame: the
/// `bpf_ktime_get_ns()` value when the program ran (native endian u64).
pub(crate) const META_LEN: usize = 8;

/// How an XDP program is attached to an interface.
#[derive(
    Copy, Clone, Debug, Default, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum XdpMode {
    /// Native (driver) mode, falling back to generic when the driver has
    /// no XDP support.
    #[default]
    Auto,
    /// Native (driver) mode only (`XDP_FLAGS_DRV_MODE`): the program runs
    /// in the driver's receive path (veth: in its NAPI poll), before an
    /// sk_buff exists where the driver allows it.
    Native,
    /// Generic (SKB) mode only (`XDP_FLAGS_SKB_MODE`): after the sk_buff
    /// is built, on any device.
    Generic,
}

impl XdpMode {
    /// Short name.
    pub fn name(self) -> &'static str {
        match self {
            XdpMode::Auto => "auto",
            XdpMode::Native => "native",
            XdpMode::Generic => "generic",
        }
    }
}

pub(crate) fn err(what: &str, e: io::Error) -> io::Error {
    io::Error::new(
        e.kind(),
        format!("{what}: {}", crate::thread::errno_reason(&e)),
    )
}

pub(super) fn check_rc(rc: libc::c_long, what: &str) -> io::Result<libc::c_long> {
    sys::cvt(rc).map_err(|e| err(what, e))
}

/// `bpf(cmd, attr, size)`.
pub(super) fn bpf(cmd: libc::c_long, attr: &mut [u8; 128], what: &str) -> io::Result<OwnedFd> {
    // SAFETY: `attr` is a live, zero-initialised 128-byte union bpf_attr
    // prefix; the kernel reads (and for some commands writes) at most `size`.
    let result = unsafe { libc::syscall(libc::SYS_bpf, cmd, attr.as_mut_ptr(), attr.len() as u32) };
    let fd = check_rc(result, what)?;
    // SAFETY: the command returned a new descriptor that nobody else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

pub(super) fn put32(a: &mut [u8], at: usize, v: u32) {
    a[at..at + 4].copy_from_slice(&v.to_ne_bytes());
}
pub(super) fn put64(a: &mut [u8], at: usize, v: u64) {
    a[at..at + 8].copy_from_slice(&v.to_ne_bytes());
}

/// One eBPF instruction.
#[derive(Copy, Clone, Debug)]
#[repr(C)]
pub(super) struct Insn {
    code: u8,
    regs: u8,
    pub(super) off: i16,
    imm: i32,
}

pub(super) fn insn(code: u8, dst: u8, src: u8, off: i16, imm: i32) -> Insn {
    Insn {
        code,
        regs: (src << 4) | (dst & 0x0f),
        off,
        imm,
    }
}

pub(super) const LDXW: u8 = 0x61;
pub(super) const LDXH: u8 = 0x69;
pub(super) const LDXB: u8 = 0x71;
pub(super) const STXDW: u8 = 0x7b;
pub(super) const MOV64_IMM: u8 = 0xb7;
pub(super) const MOV64_REG: u8 = 0xbf;
pub(super) const ADD64_IMM: u8 = 0x07;
pub(super) const ADD64_REG: u8 = 0x0f;
pub(super) const AND64_IMM: u8 = 0x57;
pub(super) const LSH64_IMM: u8 = 0x67;
pub(super) const RSH64_IMM: u8 = 0x77;
pub(super) const JGT_REG: u8 = 0x2d;
pub(super) const JNE_IMM: u8 = 0x55;
pub(super) const JNE32_IMM: u8 = 0x56;
pub(super) const JLT32_IMM: u8 = 0xa6;
pub(super) const LD_IMM64: u8 = 0x18;
pub(super) const CALL: u8 = 0x85;
pub(super) const EXIT: u8 = 0x95;
/// Markers in `off` for "jump to label", patched at the end.
pub(super) const TO_PASS: i16 = i16::MIN;
const TO_REDIRECT: i16 = i16::MIN + 1;

/// The steering program. IPv4 (any IHL, not a fragment), protocol UDP,
/// destination address (when not unspecified) and port equal to ours →
/// with `stamp`, `bpf_xdp_adjust_meta(-8)` and the `bpf_ktime_get_ns()`
/// value stored in the metadata area in front of the frame (skipped if the
/// driver offers no room), then `bpf_redirect_map(xskmap,
/// rx_queue_index, XDP_PASS)`; everything else (ARP, ICMP, other ports,
/// fragments) → `XDP_PASS` to the kernel stack. `port` and `daddr` in host
/// order.
fn steering_program(map_fd: RawFd, port: u16, daddr: Ipv4Addr, stamp: bool) -> Vec<Insn> {
    // Values as a little-endian load of the big-endian wire bytes sees them.
    let le16 = |v: u16| u16::from_le_bytes(v.to_be_bytes()) as i32;
    let le32 = |v: [u8; 4]| u32::from_le_bytes(v) as i32;
    let mut program = vec![
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
        program.push(insn(LDXW, 7, 2, 30, 0)); // IPv4 destination
        program.push(insn(JNE32_IMM, 7, 0, TO_PASS, le32(daddr.octets())));
    }
    program.extend([
        insn(LSH64_IMM, 5, 0, 0, 2),  // IHL * 4 (bounded 20..60)
        insn(ADD64_REG, 2, 5, 0, 0),  // r2 = data + IP header length
        insn(MOV64_REG, 4, 2, 0, 0),  // r4 = end of the UDP header
        insn(ADD64_IMM, 4, 0, 0, 22), // eth 14 + UDP 8
        insn(JGT_REG, 4, 3, TO_PASS, 0),
        insn(LDXH, 5, 2, 16, 0), // UDP destination port
        insn(JNE32_IMM, 5, 0, TO_PASS, le16(port)),
    ]);
    if stamp {
        program.extend([
            insn(MOV64_REG, 1, 6, 0, 0), // bpf_xdp_adjust_meta(ctx, -8)
            insn(MOV64_IMM, 2, 0, 0, -(META_LEN as i32)),
            insn(CALL, 0, 0, 0, BPF_FUNC_XDP_ADJUST_META),
            insn(JNE_IMM, 0, 0, TO_REDIRECT, 0), // no room: no stamp
            insn(LDXW, 7, 6, 8, 0),              // r7 = ctx->data_meta
            insn(LDXW, 3, 6, 0, 0),              // r3 = ctx->data
            insn(MOV64_REG, 4, 7, 0, 0),
            insn(ADD64_IMM, 4, 0, 0, META_LEN as i32),
            insn(JGT_REG, 4, 3, TO_REDIRECT, 0),
            insn(CALL, 0, 0, 0, BPF_FUNC_KTIME_GET_NS),
            insn(STXDW, 7, 0, 0, 0), // *(u64 *)meta = now
        ]);
    }
    let redirect = program.len();
    program.extend([
        insn(LDXW, 2, 6, 16, 0),         // key = ctx->rx_queue_index
        insn(LD_IMM64, 1, 1, 0, map_fd), // r1 = xskmap (BPF_PSEUDO_MAP_FD)
        insn(0, 0, 0, 0, 0),
        insn(MOV64_IMM, 3, 0, 0, XDP_PASS), // flags: XDP_PASS when no socket
        insn(CALL, 0, 0, 0, BPF_FUNC_REDIRECT_MAP),
        insn(EXIT, 0, 0, 0, 0),
    ]);
    let pass = program.len();
    program.push(insn(MOV64_IMM, 0, 0, 0, XDP_PASS));
    program.push(insn(EXIT, 0, 0, 0, 0));
    for (i, x) in program.iter_mut().enumerate() {
        let target = match x.off {
            TO_PASS => pass,
            TO_REDIRECT => redirect,
            _ => continue,
        };
        x.off = (target - i - 1) as i16;
    }
    program
}

/// Load `prog` as an XDP program; the verifier's last lines on refusal.
fn load_program(prog: &[Insn], name: &[u8]) -> io::Result<OwnedFd> {
    load_program_of(BPF_PROG_TYPE_XDP, BPF_XDP, prog, name)
}

/// Load `prog` as a program of `kind` for `attach_type`.
pub(super) fn load_program_of(
    kind: u32,
    attach_type: u32,
    prog: &[Insn],
    name: &[u8],
) -> io::Result<OwnedFd> {
    let license = c"GPL";
    // Without a log first (a long program's log can overflow the buffer,
    // which fails the load); on refusal again with one, for the reason.
    let attempt = |log: Option<&mut Vec<u8>>| {
        let mut attr = [0u8; 128];
        put32(&mut attr, 0, kind);
        put32(&mut attr, 4, prog.len() as u32);
        put64(&mut attr, 8, prog.as_ptr() as u64);
        put64(&mut attr, 16, license.as_ptr() as u64);
        if let Some(log) = log {
            put32(&mut attr, 24, 1); // log level
            put32(&mut attr, 28, log.len() as u32);
            put64(&mut attr, 32, log.as_mut_ptr() as u64);
        }
        let name_len = name.len().min(15);
        attr[48..48 + name_len].copy_from_slice(&name[..name_len]);
        put32(&mut attr, 68, attach_type); // expected attach type
        bpf(BPF_PROG_LOAD, &mut attr, "BPF_PROG_LOAD")
    };
    attempt(None).map_err(|e| {
        let mut log = vec![0u8; 1 << 20];
        let _ = attempt(Some(&mut log));
        let end = log.iter().position(|&b| b == 0).unwrap_or(log.len());
        let verifier_log = String::from_utf8_lossy(&log[..end]);
        let tail: String = verifier_log
            .lines()
            .rev()
            .take(6)
            .collect::<Vec<_>>()
            .join(" | ");
        io::Error::new(e.kind(), format!("{e}; verifier: {tail}"))
    })
}

/// Create the XSKMAP with each `(queue, xsk)` of `sockets` at key
/// `queue` (the program looks up `rx_queue_index`), and load the steering
/// program that redirects into it; returns (map, program). Nothing is
/// attached: both are released when their descriptors close.
pub(crate) fn load(
    sockets: &[(u32, RawFd)],
    port: u16,
    daddr: Ipv4Addr,
    stamp: bool,
) -> io::Result<(OwnedFd, OwnedFd)> {
    let highest = sockets.iter().map(|&(queue, _)| queue).max().unwrap_or(0);
    let mut attr = [0u8; 128];
    put32(&mut attr, 0, BPF_MAP_TYPE_XSKMAP);
    put32(&mut attr, 4, 4); // key size
    put32(&mut attr, 8, 4); // value size
    put32(&mut attr, 12, highest.saturating_add(1).max(64)); // max entries
    attr[28..28 + 7].copy_from_slice(b"rw_xsks");
    let map = bpf(BPF_MAP_CREATE, &mut attr, "BPF_MAP_CREATE(XSKMAP)")?;
    for &(queue, xsk) in sockets {
        let key: u32 = queue;
        let val: u32 = xsk as u32;
        let mut attr = [0u8; 128];
        put32(&mut attr, 0, map.as_raw_fd() as u32);
        put64(&mut attr, 8, &key as *const u32 as u64);
        put64(&mut attr, 16, &val as *const u32 as u64);
        // SAFETY: the attr holds the map fd and pointers to the live key/value.
        let result = unsafe {
            libc::syscall(
                libc::SYS_bpf,
                BPF_MAP_UPDATE_ELEM,
                attr.as_mut_ptr(),
                128u32,
            )
        };
        check_rc(result, "BPF_MAP_UPDATE_ELEM(xskmap[queue] = socket)")?;
    }
    let prog = steering_program(map.as_raw_fd(), port, daddr, stamp);
    let prog_fd = load_program(&prog, b"rw_xdp_rx")?;
    Ok((map, prog_fd))
}

/// Attach program `prog` to `ifindex` in `mode` (Auto: native, then
/// generic when the driver refuses); returns the link (dropping it
/// detaches) and the mode in effect (never Auto).
pub(crate) fn attach(prog: RawFd, ifindex: u32, mode: XdpMode) -> io::Result<(OwnedFd, XdpMode)> {
    let link = |flags: u32, what: &str| {
        let mut attr = [0u8; 128];
        put32(&mut attr, 0, prog as u32);
        put32(&mut attr, 4, ifindex);
        put32(&mut attr, 8, BPF_XDP);
        put32(&mut attr, 12, flags);
        bpf(BPF_LINK_CREATE, &mut attr, what)
    };
    let native = || {
        link(
            XDP_FLAGS_DRV_MODE,
            "BPF_LINK_CREATE(BPF_XDP, XDP_FLAGS_DRV_MODE)",
        )
    };
    let generic = || {
        link(
            XDP_FLAGS_SKB_MODE,
            "BPF_LINK_CREATE(BPF_XDP, XDP_FLAGS_SKB_MODE)",
        )
    };
    match mode {
        XdpMode::Native => Ok((native()?, XdpMode::Native)),
        XdpMode::Generic => Ok((generic()?, XdpMode::Generic)),
        XdpMode::Auto => match native() {
            Ok(l) => Ok((l, XdpMode::Native)),
            Err(native_err) => match generic() {
                Ok(l) => Ok((l, XdpMode::Generic)),
                Err(e) => Err(io::Error::new(e.kind(), format!("{native_err}; then {e}"))),
            },
        },
    }
}

/// An XDP program attached to an interface; dropping it detaches it.
pub struct XdpAttachment {
    // Declared first: the link goes (detaching) before the program.
    _link: OwnedFd,
    _prog: OwnedFd,
    mode: XdpMode,
}

impl XdpAttachment {
    /// The mode the program runs in (native or generic).
    pub fn mode(&self) -> XdpMode {
        self.mode
    }
}

impl std::fmt::Debug for XdpAttachment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("XdpAttachment")
            .field("mode", &self.mode)
            .finish()
    }
}

/// Attach a program that passes every frame (`XDP_PASS`) to `ifname` (in
/// the calling thread's network namespace) in `mode`. On veth this turns
/// on the device's NAPI receive path: frames sent into it are queued to a
/// NAPI instance (which can then run in its own kernel thread, "threaded
/// NAPI") instead of being processed inside the sender's `send` call.
pub fn attach_xdp_pass(ifname: &str, mode: XdpMode) -> io::Result<XdpAttachment> {
    let cname = std::ffi::CString::new(ifname)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "bad interface name"))?;
    // SAFETY: NUL-terminated name; resolved in this thread's namespace.
    let ifindex = unsafe { libc::if_nametoindex(cname.as_ptr()) };
    if ifindex == 0 {
        return Err(err(&format!("interface {ifname}"), sys::last_err()));
    }
    let prog = load_program(
        &[insn(MOV64_IMM, 0, 0, 0, XDP_PASS), insn(EXIT, 0, 0, 0, 0)],
        b"rw_xdp_pass",
    )?;
    let (link, mode) = attach(prog.as_raw_fd(), ifindex, mode)?;
    Ok(XdpAttachment {
        _link: link,
        _prog: prog,
        mode,
    })
}
