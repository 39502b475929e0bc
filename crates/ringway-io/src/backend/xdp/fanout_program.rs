//! The in-kernel fan-out's `SCHED_CLS` program ([`super::fanout`]),
//! hand-assembled for one address family: the same steps over IPv4 and
//! IPv6, at the offsets of a [`Layout`].
//!
//! Over IPv4 both checksums follow each address change
//! (`bpf_l3_csum_replace`, `bpf_l4_csum_replace`, 4 bytes at a time); over
//! IPv6 there is no header checksum, and a 16-byte address change reaches
//! the UDP checksum as one difference (`bpf_csum_diff` of the old and new
//! address, then `bpf_l4_csum_replace` with it, pseudo-header flag on).

use super::program::*;

/// Most destinations (echo excluded) one packet is replicated to in the
/// kernel; packets with more go to user space.
pub const MAX_FANOUT: usize = 256;
const FUNC_MAP_LOOKUP: i32 = 1;
const FUNC_KTIME: i32 = 5;
const FUNC_STORE_BYTES: i32 = 9;
const FUNC_L3_CSUM: i32 = 10;
const FUNC_L4_CSUM: i32 = 11;
const FUNC_CLONE_REDIRECT: i32 = 13;
const FUNC_REDIRECT: i32 = 23;
const FUNC_CSUM_DIFF: i32 = 28;
/// `BPF_F_PSEUDO_HDR | BPF_F_MARK_MANGLED_0`.
const L4_FLAGS: i32 = (1 << 4) | (1 << 5);
const ST_W: u8 = 0x62;
const ST_H: u8 = 0x6a;
const STX_W: u8 = 0x63;
const ATOMIC_ADD_DW: u8 = 0xdb;
const JNE_REG: u8 = 0x5d;
const JEQ_IMM: u8 = 0x15;
const JGE_IMM: u8 = 0x35;
const JGE_REG: u8 = 0x3d;
const JGT_IMM: u8 = 0x25;
const JA: u8 = 0x05;
const LDXDW: u8 = 0x79;
const SUB64_REG: u8 = 0x1f;
/// `TC_ACT_OK` / `TCX_PASS`, `TC_ACT_SHOT`.
const TC_OK: i32 = 0;
const TC_SHOT: i32 = 2;

/// Where things are, per address family: in the frame (Ethernet, IP
/// without options or extension headers, UDP, RTP), in a map entry, and
/// on the program's stack.
///
/// Map entry (key: SSRC as on the wire, payload type, 3 zero bytes):
///
/// | IPv4 | IPv6 | field |
/// |---|---|---|
/// | 0 | 0 | sender address (wire order) |
/// | 4 | 16 | sender UDP port (wire order) |
/// | 6 | 18 | destinations n (u16, native) |
/// | 8 | 40 | sender MAC (6 bytes) |
/// | 16 | 20 | echo (u32: 1 = echo to the sender) |
/// | 24 | 24 | packets (u64, atomically added) |
/// | 32 | 32 | delay sum, ns (u64, atomically added) |
/// | 40 + 16·i | 48 + 32·i | destination i: address, port (2), MAC (6), padding |
#[derive(Debug)]
pub(crate) struct Layout {
    v6: bool,
    /// Frame: EtherType value, source and destination address, ports, UDP
    /// checksum, RTP header.
    ethertype: u16,
    ip_src: i32,
    ip_dst: i32,
    sport: i32,
    dport: i32,
    udp_csum: i32,
    rtp: i32,
    /// Address bytes.
    pub(crate) addr_len: usize,
    /// Entry: sender port, count, sender MAC, echo flag, first destination,
    /// log2 of a destination's size.
    pub(crate) e_port: usize,
    pub(crate) e_count: usize,
    pub(crate) e_mac: usize,
    pub(crate) e_echo: usize,
    pub(crate) e_dests: usize,
    pub(crate) dest_shift: usize,
    /// Bytes of an entry.
    pub(crate) value_len: usize,
    /// Stack: the current destination address and port (the packet's now),
    /// our address, port and MAC.
    s_cur_addr: i16,
    s_cur_port: i16,
    s_our_addr: i16,
    s_our_port: i16,
    s_our_mac: i16,
}

/// Offset of the IPv4 header checksum in the frame.
const IP_CSUM: i32 = 24;

impl Layout {
    pub(crate) const V4: Layout = Layout {
        v6: false,
        ethertype: 0x0800,
        ip_src: 26,
        ip_dst: 30,
        sport: 34,
        dport: 36,
        udp_csum: 40,
        rtp: 42,
        addr_len: 4,
        e_port: 4,
        e_count: 6,
        e_mac: 8,
        e_echo: 16,
        e_dests: 40,
        dest_shift: 4,
        value_len: 40 + 16 * MAX_FANOUT,
        s_cur_addr: -16,
        s_cur_port: -12,
        s_our_addr: -32,
        s_our_port: -28,
        s_our_mac: -24,
    };
    pub(crate) const V6: Layout = Layout {
        v6: true,
        ethertype: 0x86dd,
        ip_src: 22,
        ip_dst: 38,
        sport: 54,
        dport: 56,
        udp_csum: 60,
        rtp: 62,
        addr_len: 16,
        e_port: 16,
        e_count: 18,
        e_mac: 40,
        e_echo: 20,
        e_dests: 48,
        dest_shift: 5,
        value_len: 48 + 32 * MAX_FANOUT,
        s_cur_addr: -32,
        s_cur_port: -16,
        s_our_addr: -72,
        s_our_port: -56,
        s_our_mac: -48,
    };

    /// Offset of destination `i` in an entry.
    pub(crate) fn dest(&self, i: usize) -> usize {
        self.e_dests + (i << self.dest_shift)
    }
}

fn le16(v: u16) -> i32 {
    i32::from(u16::from_le_bytes(v.to_be_bytes()))
}
fn le32(v: &[u8]) -> i32 {
    u32::from_le_bytes(v.try_into().expect("4 bytes")) as i32
}

fn call(function: i32) -> Insn {
    insn(CALL, 0, 0, 0, function)
}

/// The checks before any change (the packet is ours: IP/UDP to our
/// address and port, RTP version 2; its source is in the map, verified;
/// at most [`MAX_FANOUT`] destinations), then our MAC, address and port
/// on the stack. Registers from here on: r6 the context, r7 the map
/// entry, r8 the destination count (r9 is the copy loop's index); the
/// pickup time is on the stack at -40.
fn checks(l: &Layout, map_fd: i32, addr: &[u8], port: i32, mac: [u8; 6]) -> Vec<Insn> {
    let frame_len = l.rtp + 12; // Ethernet + IP + UDP + RTP header
    let mut program = vec![
        insn(MOV64_REG, 6, 1, 0, 0),
        call(FUNC_KTIME),
        insn(STXDW, 10, 0, -40, 0), // pickup
        insn(LDXW, 2, 6, 76, 0),    // data
        insn(LDXW, 3, 6, 80, 0),    // data_end
        insn(MOV64_REG, 4, 2, 0, 0),
        insn(ADD64_IMM, 4, 0, 0, frame_len),
        insn(JGT_REG, 4, 3, TO_PASS, 0),
        insn(LDXH, 5, 2, 12, 0),
        insn(JNE32_IMM, 5, 0, TO_PASS, le16(l.ethertype)),
    ];
    if l.v6 {
        program.extend([
            insn(LDXB, 5, 2, 14, 0), // version 6
            insn(RSH64_IMM, 5, 0, 0, 4),
            insn(JNE32_IMM, 5, 0, TO_PASS, 6),
            insn(LDXB, 5, 2, 20, 0), // next header UDP: no extension headers
            insn(JNE32_IMM, 5, 0, TO_PASS, 17),
        ]);
    } else {
        program.extend([
            insn(LDXB, 5, 2, 14, 0),
            insn(JNE32_IMM, 5, 0, TO_PASS, 0x45),
            insn(LDXB, 5, 2, 23, 0),
            insn(JNE32_IMM, 5, 0, TO_PASS, 17),
            insn(LDXH, 5, 2, 20, 0),
            insn(AND64_IMM, 5, 0, 0, le16(0x3fff)),
            insn(JNE32_IMM, 5, 0, TO_PASS, 0),
        ]);
    }
    for (k, word) in addr.chunks_exact(4).enumerate() {
        program.push(insn(LDXW, 5, 2, (l.ip_dst + 4 * k as i32) as i16, 0));
        program.push(insn(JNE32_IMM, 5, 0, TO_PASS, le32(word)));
    }
    let rtp = l.rtp as i16;
    program.extend([
        insn(LDXH, 5, 2, l.dport as i16, 0),
        insn(JNE32_IMM, 5, 0, TO_PASS, port),
        insn(LDXB, 5, 2, rtp, 0), // RTP version 2
        insn(AND64_IMM, 5, 0, 0, 0xc0),
        insn(JNE32_IMM, 5, 0, TO_PASS, 0x80),
        // key: SSRC, payload type, zeros
        insn(LDXW, 5, 2, rtp + 8, 0),
        insn(STX_W, 10, 5, -8, 0),
        insn(LDXB, 5, 2, rtp + 1, 0),
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
        insn(ADD64_IMM, 4, 0, 0, frame_len),
        insn(JGT_REG, 4, 3, TO_PASS, 0),
    ]);
    for k in 0..(l.addr_len / 4) as i16 {
        program.extend([
            insn(LDXW, 4, 2, l.ip_src as i16 + 4 * k, 0),
            insn(LDXW, 5, 7, 4 * k, 0),
            insn(JNE_REG, 4, 5, TO_PASS, 0),
        ]);
    }
    program.extend([
        insn(LDXH, 4, 2, l.sport as i16, 0),
        insn(LDXH, 5, 7, l.e_port as i16, 0),
        insn(JNE_REG, 4, 5, TO_PASS, 0),
        insn(LDXH, 8, 7, l.e_count as i16, 0), // r8 = n
        insn(JGT_IMM, 8, 0, TO_PASS, MAX_FANOUT as i32),
        // our MAC, address and port on the stack
        insn(ST_W, 10, 0, l.s_our_mac, le32(&mac[0..4])),
        insn(
            ST_H,
            10,
            0,
            l.s_our_mac + 4,
            i32::from(u16::from_le_bytes([mac[4], mac[5]])),
        ),
    ]);
    let words = addr.chunks_exact(4).enumerate();
    for (k, word) in words.clone() {
        program.push(insn(ST_W, 10, 0, l.s_our_addr + 4 * k as i16, le32(word)));
    }
    program.push(insn(ST_H, 10, 0, l.s_our_port, port));
    // The current destination: us.
    for (k, word) in words {
        program.push(insn(ST_W, 10, 0, l.s_cur_addr + 4 * k as i16, le32(word)));
    }
    program.push(insn(ST_W, 10, 0, l.s_cur_port, port));
    program
}

/// The rest of the program, written after [`checks`]: helper sequences as
/// methods, so each step below reads as one line.
struct Builder {
    layout: &'static Layout,
    program: Vec<Insn>,
}

impl Builder {
    fn extend(&mut self, insns: impl IntoIterator<Item = Insn>) {
        self.program.extend(insns);
    }

    /// `bpf_skb_store_bytes` of `len` bytes at `from_reg + from_off` into
    /// the packet at `off`.
    fn store(&mut self, off: i32, from_reg: u8, from_off: i32, len: i32) {
        self.store_from(off, vec![insn(MOV64_REG, 3, from_reg, 0, 0)], from_off, len);
    }

    /// As [`Builder::store`], from r3 set by `base` plus `from_off`.
    fn store_from(&mut self, off: i32, base: Vec<Insn>, from_off: i32, len: i32) {
        self.extend([insn(MOV64_REG, 1, 6, 0, 0), insn(MOV64_IMM, 2, 0, 0, off)]);
        self.extend(base);
        self.extend([
            insn(ADD64_IMM, 3, 0, 0, from_off),
            insn(MOV64_IMM, 4, 0, 0, len),
            insn(MOV64_IMM, 5, 0, 0, 0),
            call(FUNC_STORE_BYTES),
        ]);
    }

    /// r3 = old, r4 = new (each loaded by its instructions, which may use
    /// r3/r4 only): the UDP checksum update, and the IPv4 header's first
    /// when `l3`.
    fn csum(&mut self, l3: bool, size: i32, old: Vec<Insn>, new: Vec<Insn>) {
        if l3 {
            self.extend([
                insn(MOV64_REG, 1, 6, 0, 0),
                insn(MOV64_IMM, 2, 0, 0, IP_CSUM),
            ]);
            self.extend(old.clone());
            self.extend(new.clone());
            self.extend([insn(MOV64_IMM, 5, 0, 0, size), call(FUNC_L3_CSUM)]);
        }
        self.extend([
            insn(MOV64_REG, 1, 6, 0, 0),
            insn(MOV64_IMM, 2, 0, 0, self.layout.udp_csum),
        ]);
        self.extend(old);
        self.extend(new);
        self.extend([
            insn(MOV64_IMM, 5, 0, 0, L4_FLAGS | size),
            call(FUNC_L4_CSUM),
        ]);
    }

    /// An IPv6 address change in the UDP checksum: `bpf_csum_diff` of the
    /// 16 bytes at r1 (set by `from`) and at r3 (set by `to`, which may use
    /// r3 only), then `bpf_l4_csum_replace` by that difference.
    fn csum_diff16(&mut self, from: Vec<Insn>, to: Vec<Insn>) {
        self.extend(from);
        self.extend([insn(MOV64_IMM, 2, 0, 0, 16)]);
        self.extend(to);
        self.extend([
            insn(MOV64_IMM, 4, 0, 0, 16),
            insn(MOV64_IMM, 5, 0, 0, 0),
            call(FUNC_CSUM_DIFF),
            insn(MOV64_REG, 4, 0, 0, 0),
            insn(MOV64_REG, 1, 6, 0, 0),
            insn(MOV64_IMM, 2, 0, 0, self.layout.udp_csum),
            insn(MOV64_IMM, 3, 0, 0, 0),
            insn(MOV64_IMM, 5, 0, 0, L4_FLAGS),
            call(FUNC_L4_CSUM),
        ]);
    }

    /// The source becomes us: MAC, address (both checksums), port.
    fn source_is_us(&mut self, addr: &[u8], port: i32) {
        let l = self.layout;
        self.store(6, 10, i32::from(l.s_our_mac), 6);
        if l.v6 {
            self.csum_diff16(
                vec![insn(MOV64_REG, 1, 7, 0, 0)],
                vec![
                    insn(MOV64_REG, 3, 10, 0, 0),
                    insn(ADD64_IMM, 3, 0, 0, i32::from(l.s_our_addr)),
                ],
            );
        } else {
            self.csum(
                true,
                4,
                vec![insn(LDXW, 3, 7, 0, 0)],
                vec![insn(MOV64_IMM, 4, 0, 0, le32(addr))],
            );
        }
        self.store(l.ip_src, 10, i32::from(l.s_our_addr), l.addr_len as i32);
        self.csum(
            false,
            2,
            vec![insn(LDXH, 3, 7, l.e_port as i16, 0)],
            vec![insn(MOV64_IMM, 4, 0, 0, port)],
        );
        self.store(l.sport, 10, i32::from(l.s_our_port), 2);
    }

    /// Point the packet at the address and port at `base + at` (`base`:
    /// instructions setting `reg`, r3 or r4, to the entry or a destination
    /// in it), checksums from the current destination kept on the stack,
    /// and remember it as the current one.
    fn retarget(&mut self, base: impl Fn(u8) -> Vec<Insn>, at: i32) {
        let l = self.layout;
        let load = |code: u8, reg: u8, off: i32| {
            let mut v = base(reg);
            v.push(insn(code, reg, reg, off as i16, 0));
            v
        };
        let (cur, cur_port) = (l.s_cur_addr, l.s_cur_port);
        if l.v6 {
            let mut to = base(3);
            to.push(insn(ADD64_IMM, 3, 0, 0, at));
            self.csum_diff16(
                vec![
                    insn(MOV64_REG, 1, 10, 0, 0),
                    insn(ADD64_IMM, 1, 0, 0, i32::from(cur)),
                ],
                to,
            );
            self.store_from(l.ip_dst, base(3), at, 16);
            self.extend(base(3));
            for k in 0..4 {
                self.extend([
                    insn(LDXW, 4, 3, (at + 4 * k) as i16, 0),
                    insn(STX_W, 10, 4, cur + 4 * k as i16, 0),
                ]);
            }
        } else {
            self.csum(true, 4, vec![insn(LDXW, 3, 10, cur, 0)], load(LDXW, 4, at));
            self.store_from(l.ip_dst, base(3), at, 4);
            self.extend(load(LDXW, 3, at));
            self.extend([insn(STX_W, 10, 3, cur, 0)]);
        }
        let port_at = at + l.addr_len as i32;
        self.csum(
            false,
            2,
            vec![insn(LDXW, 3, 10, cur_port, 0)],
            load(LDXH, 4, port_at),
        );
        self.store_from(l.dport, base(3), port_at, 2);
        self.extend(load(LDXH, 3, port_at));
        self.extend([insn(STX_W, 10, 3, cur_port, 0)]);
    }

    /// One clone per destination i < n, in a bounded loop (r9 = i; the
    /// verifier follows every iteration up to [`MAX_FANOUT`]).
    fn copies(&mut self, ifindex: u32) {
        let l = self.layout;
        // reg = r7 + (r9 << shift): destination i is at reg + e_dests.
        let dest = |reg: u8| {
            vec![
                insn(MOV64_REG, reg, 9, 0, 0),
                insn(LSH64_IMM, reg, 0, 0, l.dest_shift as i32),
                insn(ADD64_REG, reg, 7, 0, 0),
            ]
        };
        let first = l.e_dests as i32;
        self.program.push(insn(MOV64_IMM, 9, 0, 0, 0));
        let top = self.program.len();
        self.program.push(insn(JGE_REG, 9, 8, 0, 0)); // i >= n: done
        self.program.push(insn(JGE_IMM, 9, 0, 0, MAX_FANOUT as i32)); // (for the verifier)
        self.retarget(dest, first);
        // destination MAC
        self.store_from(0, dest(3), first + l.addr_len as i32 + 2, 6);
        self.extend([
            insn(MOV64_REG, 1, 6, 0, 0),
            insn(MOV64_IMM, 2, 0, 0, ifindex as i32),
            insn(MOV64_IMM, 3, 0, 0, 0), // egress
            call(FUNC_CLONE_REDIRECT),
            insn(ADD64_IMM, 9, 0, 0, 1),
        ]);
        let back = self.program.len();
        self.program
            .push(insn(JA, 0, 0, (top as i64 - back as i64 - 1) as i16, 0));
        let end = self.program.len();
        self.program[top].off = (end - top - 1) as i16;
        self.program[top + 1].off = (end - top - 2) as i16;
    }

    /// Add the packet and its delay (now − pickup) to the entry's counters.
    fn account(&mut self) {
        self.extend([
            call(FUNC_KTIME),
            insn(LDXDW, 1, 10, -40, 0),
            insn(SUB64_REG, 0, 1, 0, 0),
            insn(ATOMIC_ADD_DW, 7, 0, 32, 0),
            insn(MOV64_IMM, 1, 0, 0, 1),
            insn(ATOMIC_ADD_DW, 7, 1, 24, 0),
        ]);
    }

    /// Without an echo: account and drop the original. With one: the
    /// packet itself goes back to the sender.
    fn echo_or_drop(&mut self, ifindex: u32) {
        let l = self.layout;
        self.program.push(insn(LDXW, 1, 7, l.e_echo as i16, 0));
        let no_echo = self.program.len();
        self.program.push(insn(JNE32_IMM, 1, 0, 0, 0));
        self.account();
        self.extend([insn(MOV64_IMM, 0, 0, 0, TC_SHOT), insn(EXIT, 0, 0, 0, 0)]);
        let echo = self.program.len();
        self.program[no_echo].off = (echo - no_echo - 1) as i16;
        self.retarget(|reg| vec![insn(MOV64_REG, reg, 7, 0, 0)], 0);
        self.store(0, 7, l.e_mac as i32, 6);
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

/// The program for our address `addr` (4 or 16 bytes, wire order: the
/// layout's family) and `port`, MAC `mac`, interface `ifindex`.
pub(crate) fn fanout_program(
    layout: &'static Layout,
    map_fd: i32,
    (addr, port): (&[u8], u16),
    mac: [u8; 6],
    ifindex: u32,
) -> Vec<Insn> {
    debug_assert_eq!(addr.len(), layout.addr_len);
    let port = le16(port);
    let mut builder = Builder {
        layout,
        program: checks(layout, map_fd, addr, port, mac),
    };
    builder.source_is_us(addr, port);
    builder.copies(ifindex);
    builder.echo_or_drop(ifindex);
    builder.pass()
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

    /// A golden test of the IPv4 instruction stream: any edit of the
    /// program changes it (the program itself runs only in the root/veth
    /// tests). The IPv6 program is pinned by its length only until it has
    /// been reviewed the same way.
    #[test]
    fn the_program_is_the_one_reviewed() {
        let program = fanout_program(
            &Layout::V4,
            9,
            (&[192, 0, 2, 7], 5004),
            [2, 0, 0, 0, 0, 7],
            3,
        );
        assert_eq!(
            (program.len(), fingerprint(&program)),
            (237, 0x67f4_786f_49b8_e424)
        );
    }

    /// The layouts' entries hold their destinations inside the value.
    #[test]
    fn destinations_fit_the_entry() {
        for l in [&Layout::V4, &Layout::V6] {
            let last = l.dest(MAX_FANOUT - 1);
            assert_eq!(last + (1 << l.dest_shift), l.value_len);
            assert!(l.addr_len + 2 + 6 <= 1 << l.dest_shift);
            assert!(l.e_mac + 6 <= l.e_dests && l.e_echo + 4 <= 24);
        }
    }
}
