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
//! One program per family, that of our address: IPv4, or IPv6 without
//! extension headers (the program, its map entry layout and the checksum
//! updates of each family: [`super::fanout_program`]); routes of the other
//! family stay with user space.

use super::fanout_program::{fanout_program, Layout};
use super::neigh::Neighbours;
use super::program::*;
use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsRawFd, OwnedFd};

pub use super::fanout_program::MAX_FANOUT;
const BPF_MAP_TYPE_HASH: u32 = 1;
const BPF_PROG_TYPE_SCHED_CLS: u32 = 3;
const BPF_TCX_INGRESS: u32 = 46;

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
    /// Our address's family: where things are in the entries.
    layout: &'static Layout,
    neigh: Neighbours,
    /// Installed entries: key → the value bytes written (counters zero).
    installed: HashMap<[u8; 8], Vec<u8>>,
    /// Packets of each installed entry at the last [`KernelFanout::active_sources`].
    seen: HashMap<[u8; 8], u64>,
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
    /// Load the program for our `local` address (IPv4 or IPv6: media to
    /// it is replicated in the kernel) on `ifname` (in the calling thread's
    /// namespace) and attach it to the ingress.
    pub fn attach(ifname: &str, local: impl Into<SocketAddr>) -> io::Result<KernelFanout> {
        let local = local.into();
        let sock = std::net::UdpSocket::bind("0.0.0.0:0")?;
        let (mac, _) = super::if_info(sock.as_raw_fd(), ifname)?;
        let ifindex = super::ifindex(ifname)?;
        let (layout, addr) = match local.ip() {
            IpAddr::V4(ip) => (&Layout::V4, ip.octets().to_vec()),
            IpAddr::V6(ip) => (&Layout::V6, ip.octets().to_vec()),
        };
        let mut attr = [0u8; 128];
        put32(&mut attr, 0, BPF_MAP_TYPE_HASH);
        put32(&mut attr, 4, 8);
        put32(&mut attr, 8, layout.value_len as u32);
        put32(&mut attr, 12, 4096);
        // BPF_F_NO_PREALLOC: entries are 4 KiB (IPv4) or 8 KiB (IPv6);
        // memory for those in use only.
        put32(&mut attr, 16, 1);
        attr[28..28 + 9].copy_from_slice(b"rw_fanout");
        let map = bpf(BPF_MAP_CREATE, &mut attr, "BPF_MAP_CREATE(HASH fan-out)")?;
        let prog = fanout_program(layout, map.as_raw_fd(), (&addr, local.port()), mac, ifindex);
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
            layout,
            neigh: Neighbours::new(ifname),
            installed: HashMap::new(),
            seen: HashMap::new(),
            updates: 0,
            removed: (0, 0),
        })
    }

    /// Make the map hold exactly the `routes` it can serve (our family, at most
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
            self.seen.remove(&k);
            self.updates += 1;
        }
        for (k, value) in want {
            if self.installed.get(&k) == Some(&value) {
                continue;
            }
            // Keep the counters of an entry that changes.
            let mut cur = vec![0u8; self.layout.value_len];
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

    /// The entry for `r` in our family's layout, if every address is of
    /// our family with a known next-hop MAC.
    fn value_of(&mut self, r: &FanoutRoute) -> Option<Vec<u8>> {
        let l = self.layout;
        if r.dsts.len() > MAX_FANOUT {
            return None;
        }
        let mut value = vec![0u8; l.value_len];
        let src_mac = self.endpoint(&mut value, 0, r.src)?;
        value[l.e_count..l.e_count + 2].copy_from_slice(&(r.dsts.len() as u16).to_ne_bytes());
        value[l.e_mac..l.e_mac + 6].copy_from_slice(&src_mac);
        value[l.e_echo..l.e_echo + 4].copy_from_slice(&u32::from(r.echo).to_ne_bytes());
        for (i, d) in r.dsts.iter().enumerate() {
            let at = l.dest(i);
            let mac = self.endpoint(&mut value, at, *d)?;
            let mac_at = at + l.addr_len + 2;
            value[mac_at..mac_at + 6].copy_from_slice(&mac);
        }
        Some(value)
    }

    /// Write `addr`'s address and port at `at` of `value`; its next hop's
    /// MAC, if it is of our family and the MAC is known.
    fn endpoint(&mut self, value: &mut [u8], at: usize, addr: SocketAddr) -> Option<[u8; 6]> {
        let len = self.layout.addr_len;
        match addr.ip() {
            IpAddr::V4(ip) if len == 4 => value[at..at + 4].copy_from_slice(&ip.octets()),
            IpAddr::V6(ip) if len == 16 => value[at..at + 16].copy_from_slice(&ip.octets()),
            _ => return None,
        }
        value[at + len..at + len + 2].copy_from_slice(&addr.port().to_be_bytes());
        self.mac_of(addr.ip())
    }

    fn mac_of(&mut self, ip: IpAddr) -> Option<[u8; 6]> {
        let mac = self.neigh.get(ip);
        if mac.is_none() {
            self.neigh.note(ip);
        }
        mac
    }

    /// (packets, delay ns) of entry `k`.
    fn counters(&self, k: &[u8; 8]) -> Option<(u64, u64)> {
        let mut value = vec![0u8; self.layout.value_len];
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

    /// The sources (SSRCs) whose media the kernel replicated since the last
    /// call: the control plane refreshes their idle timers with them, as
    /// media handled in the kernel never reaches it.
    pub fn active_sources(&mut self) -> Vec<u32> {
        let mut active = Vec::new();
        let keys: Vec<[u8; 8]> = self.installed.keys().copied().collect();
        for k in keys {
            let Some((packets, _)) = self.counters(&k) else {
                continue;
            };
            let before = self.seen.insert(k, packets).unwrap_or(0);
            let ssrc = u32::from_be_bytes([k[0], k[1], k[2], k[3]]);
            if packets > before && !active.contains(&ssrc) {
                active.push(ssrc);
            }
        }
        active
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
