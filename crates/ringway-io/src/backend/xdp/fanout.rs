//! In-kernel fan-out: a `SCHED_CLS` (direct-action) program on the
//! interface's ingress (attached as a tcx link, `BPF_TCX_INGRESS`)
//! replicates each media packet of a verified source to its subscribers
//! with `bpf_clone_redirect` and sends the echo by redirecting the packet
//! itself, from a BPF hash map that the user-space control plane keeps in
//! line with its route table ([`KernelFanout::sync`]). Packets the map does
//! not cover (control, unknown or unverified sources, more than
//! [`MAX_FANOUT`] destinations, destinations whose MAC the kernel does not
//! know yet) go up the stack to the user-space SFU as before.
//!
//! Per map entry the program counts packets and the nanoseconds from its
//! start (`bpf_ktime_get_ns`, the packet's pickup) to the moment the echo —
//! the last copy — is scheduled (the redirect decided), the in-kernel
//! counterpart of delay (a).
//!
//! Map entry (key: SSRC as on the wire, payload type, 3 zero bytes):
//!
//! | offset | field |
//! |---|---|
//! | 0 | sender IPv4 address (wire order) |
//! | 4 | sender UDP port (wire order) |
//! | 6 | destinations n (u16, native) |
//! | 8 | sender MAC (6 bytes, 2 pad) |
//! | 16 | echo (u32: 1 = echo to the sender) |
//! | 24 | packets (u64, atomically added) |
//! | 32 | delay sum, ns (u64, atomically added) |
//! | 40 + 16·i | destination i: IPv4 (4), port (2), MAC (6), 4 pad |

use super::neigh::Neighbours;
use super::program::*;
use std::collections::HashMap;
use std::io;
use std::net::{SocketAddr, SocketAddrV4};
use std::os::fd::{AsRawFd, OwnedFd};

/// Most destinations (echo excluded) one packet is replicated to in the
/// kernel; packets with more go to user space.
pub const MAX_FANOUT: usize = 16;
const VALUE_LEN: usize = 40 + 16 * MAX_FANOUT;
const BPF_MAP_TYPE_HASH: u32 = 1;
const BPF_PROG_TYPE_SCHED_CLS: u32 = 3;
const BPF_TCX_INGRESS: u32 = 46;
const FUNC_MAP_LOOKUP: i32 = 1;
const FUNC_KTIME: i32 = 5;
const FUNC_STORE_BYTES: i32 = 9;
const FUNC_L3_CSUM: i32 = 10;
const FUNC_L4_CSUM: i32 = 11;
const FUNC_CLONE_REDIRECT: i32 = 13;
const FUNC_REDIRECT: i32 = 23;
/// `BPF_F_PSEUDO_HDR | BPF_F_MARK_MANGLED_0`.
const L4_FLAGS: i32 = (1 << 4) | (1 << 5);
const ST_W: u8 = 0x62;
const ST_H: u8 = 0x6a;
const STX_W: u8 = 0x63;
const ATOMIC_ADD_DW: u8 = 0xdb;
const JNE_REG: u8 = 0x5d;
const JEQ_IMM: u8 = 0x15;
const JLE_IMM: u8 = 0xb5;
const SUB64_REG: u8 = 0x1f;
/// `TC_ACT_OK` / `TCX_PASS`, `TC_ACT_SHOT`.
const TC_OK: i32 = 0;
const TC_SHOT: i32 = 2;
/// Offsets in the frame (Ethernet, IPv4 without options, UDP, RTP).
const IP_CSUM: i32 = 24;
const IP_SRC: i32 = 26;
const IP_DST: i32 = 30;
const UDP_SPORT: i32 = 34;
const UDP_DPORT: i32 = 36;
const UDP_CSUM: i32 = 40;

fn le16(v: u16) -> i32 {
    i32::from(u16::from_le_bytes(v.to_be_bytes()))
}
fn le32(v: [u8; 4]) -> i32 {
    u32::from_le_bytes(v) as i32
}

fn call(function: i32) -> Insn {
    insn(CALL, 0, 0, 0, function)
}

/// The checks before any change (the packet is ours: IPv4/UDP to our
/// address and port, RTP version 2; its source is in the map, verified;
/// at most [`MAX_FANOUT`] destinations), then our MAC, address and port
/// on the stack. Registers from here on: r6 the context, r7 the map
/// entry, r8 the destination count, r9 the pickup time.
fn checks(map_fd: i32, ip: i32, port: i32, mac: [u8; 6]) -> Vec<Insn> {
    vec![
        insn(MOV64_REG, 6, 1, 0, 0),
        call(FUNC_KTIME),
        insn(MOV64_REG, 9, 0, 0, 0), // r9 = pickup
        insn(LDXW, 2, 6, 76, 0),     // data
        insn(LDXW, 3, 6, 80, 0),     // data_end
        insn(MOV64_REG, 4, 2, 0, 0),
        insn(ADD64_IMM, 4, 0, 0, 54), // Ethernet + IPv4 + UDP + RTP header
        insn(JGT_REG, 4, 3, TO_PASS, 0),
        insn(LDXH, 5, 2, 12, 0),
        insn(JNE32_IMM, 5, 0, TO_PASS, le16(0x0800)),
        insn(LDXB, 5, 2, 14, 0),
        insn(JNE32_IMM, 5, 0, TO_PASS, 0x45),
        insn(LDXB, 5, 2, 23, 0),
        insn(JNE32_IMM, 5, 0, TO_PASS, 17),
        insn(LDXH, 5, 2, 20, 0),
        insn(AND64_IMM, 5, 0, 0, le16(0x3fff)),
        insn(JNE32_IMM, 5, 0, TO_PASS, 0),
        insn(LDXW, 5, 2, IP_DST as i16, 0),
        insn(JNE32_IMM, 5, 0, TO_PASS, ip),
        insn(LDXH, 5, 2, UDP_DPORT as i16, 0),
        insn(JNE32_IMM, 5, 0, TO_PASS, port),
        insn(LDXB, 5, 2, 42, 0), // RTP version 2
        insn(AND64_IMM, 5, 0, 0, 0xc0),
        insn(JNE32_IMM, 5, 0, TO_PASS, 0x80),
        // key: SSRC, payload type, zeros
        insn(LDXW, 5, 2, 50, 0),
        insn(STX_W, 10, 5, -8, 0),
        insn(LDXB, 5, 2, 43, 0),
        insn(AND64_IMM, 5, 0, 0, 0x7f),
        insn(STX_W, 10, 5, -4, 0),
        insn(LD_IMM64, 1, 1, 0, map_fd),
        insn(0, 0, 0, 0, 0),
        insn(MOV64_REG, 2, 10, 0, 0),
        insn(ADD64_IMM, 2, 0, 0, -8),
        call(FUNC_MAP_LOOKUP),
        insn(JEQ_IMM, 0, 0, TO_PASS, 0),
        insn(MOV64_REG, 7, 0, 0, 0), // r7 = entry
        // verified source: address and port are the registered ones
        insn(LDXW, 2, 6, 76, 0),
        insn(LDXW, 3, 6, 80, 0),
        insn(MOV64_REG, 4, 2, 0, 0),
        insn(ADD64_IMM, 4, 0, 0, 54),
        insn(JGT_REG, 4, 3, TO_PASS, 0),
        insn(LDXW, 4, 2, IP_SRC as i16, 0),
        insn(LDXW, 5, 7, 0, 0),
        insn(JNE_REG, 4, 5, TO_PASS, 0),
        insn(LDXH, 4, 2, UDP_SPORT as i16, 0),
        insn(LDXH, 5, 7, 4, 0),
        insn(JNE_REG, 4, 5, TO_PASS, 0),
        insn(LDXH, 8, 7, 6, 0), // r8 = n
        insn(JGT_IMM, 8, 0, TO_PASS, MAX_FANOUT as i32),
        // our MAC, address and port on the stack
        insn(
            ST_W,
            10,
            0,
            -24,
            i32::from_le_bytes([mac[0], mac[1], mac[2], mac[3]]),
        ),
        insn(
            ST_H,
            10,
            0,
            -20,
            i32::from(u16::from_le_bytes([mac[4], mac[5]])),
        ),
        insn(ST_W, 10, 0, -32, ip),
        insn(ST_H, 10, 0, -28, port),
        insn(ST_W, 10, 0, -16, ip),   // current destination address
        insn(ST_W, 10, 0, -12, port), // current destination port
    ]
}

/// The rest of the program, written after [`checks`]: helper sequences as
/// methods, so each step below reads as one line.
struct Builder {
    program: Vec<Insn>,
}

impl Builder {
    fn extend(&mut self, insns: impl IntoIterator<Item = Insn>) {
        self.program.extend(insns);
    }

    /// `bpf_skb_store_bytes` of `len` bytes at `from_reg + from_off` into
    /// the packet at `off`.
    fn store(&mut self, off: i32, from_reg: u8, from_off: i32, len: i32) {
        self.extend([
            insn(MOV64_REG, 1, 6, 0, 0),
            insn(MOV64_IMM, 2, 0, 0, off),
            insn(MOV64_REG, 3, from_reg, 0, 0),
            insn(ADD64_IMM, 3, 0, 0, from_off),
            insn(MOV64_IMM, 4, 0, 0, len),
            insn(MOV64_IMM, 5, 0, 0, 0),
            call(FUNC_STORE_BYTES),
        ]);
    }

    /// r3 = old (a load), r4 = new (a load): the UDP checksum update, and
    /// the IPv4 header's first when `l3`.
    fn csum(&mut self, l3: bool, size: i32, old: Insn, new: Insn) {
        if l3 {
            self.extend([
                insn(MOV64_REG, 1, 6, 0, 0),
                insn(MOV64_IMM, 2, 0, 0, IP_CSUM),
                old,
                new,
                insn(MOV64_IMM, 5, 0, 0, size),
                call(FUNC_L3_CSUM),
            ]);
        }
        self.extend([
            insn(MOV64_REG, 1, 6, 0, 0),
            insn(MOV64_IMM, 2, 0, 0, UDP_CSUM),
            old,
            new,
            insn(MOV64_IMM, 5, 0, 0, L4_FLAGS | size),
            call(FUNC_L4_CSUM),
        ]);
    }

    /// The source becomes us: MAC, address (both checksums), port.
    fn source_is_us(&mut self, ip: i32, port: i32) {
        self.store(6, 10, -24, 6);
        self.csum(
            true,
            4,
            insn(LDXW, 3, 7, 0, 0),
            insn(MOV64_IMM, 4, 0, 0, ip),
        );
        self.store(IP_SRC, 10, -32, 4);
        self.csum(
            false,
            2,
            insn(LDXH, 3, 7, 4, 0),
            insn(MOV64_IMM, 4, 0, 0, port),
        );
        self.store(UDP_SPORT, 10, -28, 2);
    }

    /// Point the packet at the destination at entry offset `at` (address
    /// and port, checksums from the current destination kept on the stack)
    /// and remember it as the current one.
    fn retarget(&mut self, at: i32) {
        self.csum(
            true,
            4,
            insn(LDXW, 3, 10, -16, 0),
            insn(LDXW, 4, 7, at as i16, 0),
        );
        self.store(IP_DST, 7, at, 4);
        self.extend([insn(LDXW, 1, 7, at as i16, 0), insn(STX_W, 10, 1, -16, 0)]);
        self.csum(
            false,
            2,
            insn(LDXW, 3, 10, -12, 0),
            insn(LDXH, 4, 7, (at + 4) as i16, 0),
        );
        self.store(UDP_DPORT, 7, at + 4, 2);
        self.extend([
            insn(LDXH, 1, 7, (at + 4) as i16, 0),
            insn(STX_W, 10, 1, -12, 0),
        ]);
    }

    /// One clone per destination i < n (unrolled: the verifier wants
    /// bounded code), each jump "n <= i" going to the end of the copies.
    fn copies(&mut self, ifindex: u32) {
        let mut done_jumps = Vec::new();
        for i in 0..MAX_FANOUT {
            done_jumps.push(self.program.len());
            self.program.push(insn(JLE_IMM, 8, 0, 0, i as i32)); // n <= i: done
            let offset = 40 + 16 * i as i32;
            self.retarget(offset);
            self.store(0, 7, offset + 6, 6); // destination MAC
            self.extend([
                insn(MOV64_REG, 1, 6, 0, 0),
                insn(MOV64_IMM, 2, 0, 0, ifindex as i32),
                insn(MOV64_IMM, 3, 0, 0, 0), // egress
                call(FUNC_CLONE_REDIRECT),
            ]);
        }
        let end = self.program.len();
        for offset in done_jumps {
            self.program[offset].off = (end - offset - 1) as i16;
        }
    }

    /// Add the packet and its delay (now − pickup) to the entry's counters.
    fn account(&mut self) {
        self.extend([
            call(FUNC_KTIME),
            insn(SUB64_REG, 0, 9, 0, 0),
            insn(ATOMIC_ADD_DW, 7, 0, 32, 0),
            insn(MOV64_IMM, 1, 0, 0, 1),
            insn(ATOMIC_ADD_DW, 7, 1, 24, 0),
        ]);
    }

    /// Without an echo: account and drop the original. With one: the
    /// packet itself goes back to the sender.
    fn echo_or_drop(&mut self, ifindex: u32) {
        self.program.push(insn(LDXW, 1, 7, 16, 0));
        let no_echo = self.program.len();
        self.program.push(insn(JNE32_IMM, 1, 0, 0, 0));
        self.account();
        self.extend([insn(MOV64_IMM, 0, 0, 0, TC_SHOT), insn(EXIT, 0, 0, 0, 0)]);
        let echo = self.program.len();
        self.program[no_echo].off = (echo - no_echo - 1) as i16;
        self.retarget(0);
        self.store(0, 7, 8, 6);
        self.account();
        self.extend([
            insn(MOV64_IMM, 1, 0, 0, ifindex as i32),
            insn(MOV64_IMM, 2, 0, 0, 0),
            call(FUNC_REDIRECT),
            insn(EXIT, 0, 0, 0, 0),
        ]);
    }

    /// The pass exit (up the stack to user space), where every check's
    /// `TO_PASS` jump lands.
    fn pass(mut self) -> Vec<Insn> {
        let pass = self.program.len();
        self.program.push(insn(MOV64_IMM, 0, 0, 0, TC_OK));
        self.program.push(insn(EXIT, 0, 0, 0, 0));
        for (i, x) in self.program.iter_mut().enumerate() {
            if x.off == TO_PASS {
                x.off = (pass - i - 1) as i16;
            }
        }
        self.program
    }
}

/// The program for our address `local`, MAC `mac`, interface `ifindex`.
fn fanout_program(map_fd: i32, local: SocketAddrV4, mac: [u8; 6], ifindex: u32) -> Vec<Insn> {
    let ip = le32(local.ip().octets());
    let port = le16(local.port());
    let mut builder = Builder {
        program: checks(map_fd, ip, port, mac),
    };
    builder.source_is_us(ip, port);
    builder.copies(ifindex);
    builder.echo_or_drop(ifindex);
    builder.pass()
}

const JGT_IMM: u8 = 0x25;

/// Per-entry counters of the program.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct FanoutStats {
    /// Entries in the map now.
    pub entries: usize,
    /// Packets replicated in the kernel.
    pub packets: u64,
    /// Sum over them of pickup → last copy scheduled (ns).
    pub delay_sum_ns: u64,
    /// Map updates made (entries written or removed).
    pub updates: u64,
}

impl FanoutStats {
    /// The counts accumulated since `start` (an earlier reading of the same
    /// program); `entries`, a level, is taken as now.
    pub fn since(&self, start: &FanoutStats) -> FanoutStats {
        FanoutStats {
            entries: self.entries,
            packets: self.packets.saturating_sub(start.packets),
            delay_sum_ns: self.delay_sum_ns.saturating_sub(start.delay_sum_ns),
            updates: self.updates.saturating_sub(start.updates),
        }
    }
}

/// One route the control plane wants in the kernel: packets with `ssrc`
/// and payload type `pt` from `src` go to `dsts`, and back to `src` when
/// `echo`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FanoutRoute {
    /// SSRC (the source's SSID).
    pub ssrc: u32,
    /// RTP payload type.
    pub pt: u8,
    /// The registered sender.
    pub src: SocketAddr,
    /// Subscribers.
    pub dsts: Vec<SocketAddr>,
    /// Echo to the sender.
    pub echo: bool,
}

/// The in-kernel fan-out on one interface (see the module docs); dropping
/// it detaches the program.
pub struct KernelFanout {
    // The link first: detached before the program and map go.
    _link: OwnedFd,
    _prog: OwnedFd,
    map: OwnedFd,
    neigh: Neighbours,
    /// Installed entries: key → the value bytes written (counters zero).
    installed: HashMap<[u8; 8], Vec<u8>>,
    updates: u64,
    /// Counters of entries removed since (packets, delay ns).
    removed: (u64, u64),
}

impl std::fmt::Debug for KernelFanout {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KernelFanout")
            .field("entries", &self.installed.len())
            .finish()
    }
}

fn map_op(
    cmd: libc::c_long,
    map: &OwnedFd,
    key: &[u8],
    value: Option<&mut [u8]>,
    what: &str,
) -> io::Result<()> {
    let mut attr = [0u8; 128];
    put32(&mut attr, 0, map.as_raw_fd() as u32);
    put64(&mut attr, 8, key.as_ptr() as u64);
    if let Some(bytes) = value {
        put64(&mut attr, 16, bytes.as_mut_ptr() as u64);
    }
    // SAFETY: the attr holds the map fd and pointers to live key (and
    // value) buffers of the map's sizes; flags 0 (BPF_ANY).
    let result = unsafe { libc::syscall(libc::SYS_bpf, cmd, attr.as_mut_ptr(), 128u32) };
    check_rc(result, what).map(drop)
}

impl KernelFanout {
    /// Load the program for our `local` address on `ifname` (in the
    /// calling thread's namespace) and attach it to the ingress.
    pub fn attach(ifname: &str, local: SocketAddrV4) -> io::Result<KernelFanout> {
        let sock = std::net::UdpSocket::bind("0.0.0.0:0")?;
        let (mac, _) = super::if_info(sock.as_raw_fd(), ifname)?;
        let ifindex = super::ifindex(ifname)?;
        let mut attr = [0u8; 128];
        put32(&mut attr, 0, BPF_MAP_TYPE_HASH);
        put32(&mut attr, 4, 8);
        put32(&mut attr, 8, VALUE_LEN as u32);
        put32(&mut attr, 12, 4096);
        attr[28..28 + 9].copy_from_slice(b"rw_fanout");
        let map = bpf(BPF_MAP_CREATE, &mut attr, "BPF_MAP_CREATE(HASH fan-out)")?;
        let prog = fanout_program(map.as_raw_fd(), local, mac, ifindex);
        let prog = load_program_of(
            BPF_PROG_TYPE_SCHED_CLS,
            BPF_TCX_INGRESS,
            &prog,
            b"rw_fanout",
        )?;
        let mut attr = [0u8; 128];
        put32(&mut attr, 0, prog.as_raw_fd() as u32);
        put32(&mut attr, 4, ifindex);
        put32(&mut attr, 8, BPF_TCX_INGRESS);
        let link = bpf(
            BPF_LINK_CREATE,
            &mut attr,
            "BPF_LINK_CREATE(BPF_TCX_INGRESS)",
        )
        .map_err(|e| io::Error::new(e.kind(), format!("{e} ({ifname})")))?;
        Ok(KernelFanout {
            _link: link,
            _prog: prog,
            map,
            neigh: Neighbours::new(ifname),
            installed: HashMap::new(),
            updates: 0,
            removed: (0, 0),
        })
    }

    /// Make the map hold exactly the `routes` it can serve (IPv4, at most
    /// [`MAX_FANOUT`] destinations, every MAC known to the kernel); the
    /// rest stay with user space. Reads the kernel's neighbour table when
    /// due. Returns the entries installed.
    pub fn sync(&mut self, routes: &[FanoutRoute]) -> io::Result<usize> {
        if self.neigh.due() {
            self.neigh.refresh();
        }
        let mut want: HashMap<[u8; 8], Vec<u8>> = HashMap::new();
        for r in routes {
            if let Some(value) = self.value_of(r) {
                let mut key = [0u8; 8];
                key[..4].copy_from_slice(&r.ssrc.to_be_bytes());
                key[4] = r.pt;
                want.insert(key, value);
            }
        }
        let stale: Vec<[u8; 8]> = self
            .installed
            .keys()
            .filter(|k| !want.contains_key(*k))
            .copied()
            .collect();
        for k in stale {
            if let Some((packets, dropped)) = self.counters(&k) {
                self.removed.0 += packets;
                self.removed.1 += dropped;
            }
            map_op(
                BPF_MAP_DELETE_ELEM,
                &self.map,
                &k,
                None,
                "BPF_MAP_DELETE_ELEM",
            )?;
            self.installed.remove(&k);
            self.updates += 1;
        }
        for (k, value) in want {
            if self.installed.get(&k) == Some(&value) {
                continue;
            }
            // Keep the counters of an entry that changes.
            let mut cur = vec![0u8; VALUE_LEN];
            let mut new = value.clone();
            if map_op(BPF_MAP_LOOKUP_ELEM, &self.map, &k, Some(&mut cur), "lookup").is_ok() {
                new[24..40].copy_from_slice(&cur[24..40]);
            }
            map_op(
                BPF_MAP_UPDATE_ELEM,
                &self.map,
                &k,
                Some(&mut new),
                "BPF_MAP_UPDATE_ELEM",
            )?;
            self.installed.insert(k, value);
            self.updates += 1;
        }
        Ok(self.installed.len())
    }

    fn value_of(&mut self, r: &FanoutRoute) -> Option<Vec<u8>> {
        let SocketAddr::V4(src) = r.src else {
            return None;
        };
        if r.dsts.len() > MAX_FANOUT {
            return None;
        }
        let mut value = vec![0u8; VALUE_LEN];
        value[0..4].copy_from_slice(&src.ip().octets());
        value[4..6].copy_from_slice(&src.port().to_be_bytes());
        value[6..8].copy_from_slice(&(r.dsts.len() as u16).to_ne_bytes());
        let mac = self.mac_of(*src.ip())?;
        value[8..14].copy_from_slice(&mac);
        value[16..20].copy_from_slice(&u32::from(r.echo).to_ne_bytes());
        for (i, d) in r.dsts.iter().enumerate() {
            let SocketAddr::V4(d) = d else {
                return None;
            };
            let offset = 40 + 16 * i;
            value[offset..offset + 4].copy_from_slice(&d.ip().octets());
            value[offset + 4..offset + 6].copy_from_slice(&d.port().to_be_bytes());
            value[offset + 6..offset + 12].copy_from_slice(&self.mac_of(*d.ip())?);
        }
        Some(value)
    }

    fn mac_of(&mut self, ip: std::net::Ipv4Addr) -> Option<[u8; 6]> {
        let ip = std::net::IpAddr::V4(ip);
        let mac = self.neigh.get(ip);
        if mac.is_none() {
            self.neigh.note(ip);
        }
        mac
    }

    /// (packets, delay ns) of entry `k`.
    fn counters(&self, k: &[u8; 8]) -> Option<(u64, u64)> {
        let mut value = vec![0u8; VALUE_LEN];
        map_op(
            BPF_MAP_LOOKUP_ELEM,
            &self.map,
            k,
            Some(&mut value),
            "lookup",
        )
        .ok()?;
        Some((
            u64::from_ne_bytes(value[24..32].try_into().expect("8 bytes")),
            u64::from_ne_bytes(value[32..40].try_into().expect("8 bytes")),
        ))
    }

    /// Counters since attaching: entries in the map now and removed ones.
    pub fn stats(&self) -> FanoutStats {
        let mut totals = FanoutStats {
            entries: self.installed.len(),
            updates: self.updates,
            packets: self.removed.0,
            delay_sum_ns: self.removed.1,
        };
        for k in self.installed.keys() {
            if let Some((p, dropped)) = self.counters(k) {
                totals.packets += p;
                totals.delay_sum_ns += dropped;
            }
        }
        totals
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// FNV-1a of the program's instructions as printed.
    fn fingerprint(program: &[Insn]) -> u64 {
        format!("{program:?}")
            .bytes()
            .fold(0xcbf2_9ce4_8422_2325, |h, b| {
                (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
            })
    }

    /// A golden test of the instruction stream: any edit of the program
    /// changes it (the program itself runs only in the root/veth tests).
    #[test]
    fn the_program_is_the_one_reviewed() {
        let local = SocketAddrV4::new([192, 0, 2, 7].into(), 5004);
        let program = fanout_program(9, local, [2, 0, 0, 0, 0, 7], 3);
        assert_eq!(
            (program.len(), fingerprint(&program)),
            (925, 0x6ef4_ec77_f897_8859)
        );
    }
}
