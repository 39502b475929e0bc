//! Network-namespace helpers for tests and experiments.
//!
//! * [`in_private_netns`] / [`command_in_private_netns`]: an anonymous
//!   namespace with only `lo`, gone when the last user ends.
//! * [`Topology`]: named namespaces ("hosts") joined by veth pairs, either
//!   point-to-point or through a bridge, with addresses in 10.77.0.0/16
//!   and, on request, IPv6 unique local addresses in fd77::/48 (used only
//!   inside these namespaces). Everything is deleted on drop
//!   (also while unwinding from a panic); [`cleanup_leftovers`] removes what
//!   crashed processes left behind.
//!
//! Names: namespaces are `rw-<pid>-<n>-<host>`; veth ends are created
//! directly inside their namespaces, so the root namespace never sees them.

use std::io;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::os::fd::AsRawFd;
use std::process::{Command, Output};
use std::sync::atomic::{AtomicU32, Ordering};

/// Prefix of every namespace name this module creates (after
/// [`site_prefix`], when one is set).
pub const PREFIX: &str = "rw-";

/// Environment variable: an extra prefix for every namespace name (e.g.
/// `i25t-`, so namespaces of parallel checkouts on one machine can be told
/// apart). At most 16 characters of `[a-z0-9-]`; anything else is ignored.
pub const SITE_PREFIX_ENV: &str = "RINGWAY_NETNS_PREFIX";

/// The extra prefix of [`SITE_PREFIX_ENV`] ("" when unset or invalid).
pub fn site_prefix() -> String {
    std::env::var(SITE_PREFIX_ENV)
        .ok()
        .filter(|p| {
            p.len() <= 16
                && p.chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        })
        .unwrap_or_default()
}

/// The prefix of every namespace this process creates:
/// `[site prefix]rw-<pid>-`.
pub fn own_prefix() -> String {
    format!("{}{PREFIX}{}-", site_prefix(), std::process::id())
}

/// The creating process's PID in a namespace name of ours
/// (`<site prefix>rw-<pid>-...`), if `name` is one.
fn creator_pid(name: &str) -> Option<u32> {
    let rest = name.strip_prefix(&site_prefix())?.strip_prefix(PREFIX)?;
    rest.split_once('-')?.0.parse().ok()
}

/// Delete the namespaces of ours (same site prefix) whose creating process
/// is gone: a lab killed by a signal cannot drop its topology, and its
/// namespaces (with their veths and programs) would stay forever. Only
/// names this module makes are touched; failures are ignored.
pub fn remove_stale_namespaces() {
    let Ok(out) = Command::new("ip").args(["netns", "list"]).output() else {
        return;
    };
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Some(name) = line.split_whitespace().next() else {
            continue;
        };
        let Some(pid) = creator_pid(name) else {
            continue;
        };
        if pid != std::process::id() && !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            let _ = Command::new("ip").args(["netns", "del", name]).output();
        }
    }
}

/// Run `f` on a new thread inside a fresh, private network namespace that
/// has only `lo` (brought up). Threads and child processes started from `f`
/// inherit the namespace; it disappears when the last of them ends.
pub fn in_private_netns<T: Send + 'static>(
    f: impl FnOnce() -> T + Send + 'static,
) -> io::Result<T> {
    std::thread::spawn(move || -> io::Result<T> {
        // SAFETY: unshare only changes this thread's namespace membership; no
        // memory is shared with the kernel.
        crate::sys::cvt(unsafe { libc::unshare(libc::CLONE_NEWNET) })?;
        let status = Command::new("ip")
            .args(["link", "set", "lo", "up"])
            .status()?;
        if !status.success() {
            return Err(io::Error::other(
                "ip link set lo up failed in private netns",
            ));
        }
        Ok(f())
    })
    .join()
    .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
}

/// Run `cmd` to completion inside a fresh private namespace with only `lo`
/// (the child inherits the namespace of the thread that forks it).
pub fn command_in_private_netns(mut cmd: Command) -> io::Result<Output> {
    in_private_netns(move || cmd.output())?
}

fn ip(args: &[&str]) -> io::Result<()> {
    let out = Command::new("ip").args(args).output()?;
    if out.status.success() {
        Ok(())
    } else {
        Err(io::Error::other(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        )))
    }
}

/// Names of the named network namespaces (`ip netns list`).
pub fn list_netns() -> io::Result<Vec<String>> {
    let out = Command::new("ip").args(["netns", "list"]).output()?;
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .collect())
}

fn pid_alive(pid: u32) -> bool {
    std::path::Path::new(&format!("/proc/{pid}")).exists()
}

/// Delete namespaces named `rw-<pid>-...` whose process is gone (or all of
/// them with `include_live`); returns the names deleted.
pub fn cleanup_leftovers(include_live: bool) -> io::Result<Vec<String>> {
    let mut gone = Vec::new();
    for n in list_netns()? {
        let Some(rest) = n
            .strip_prefix(site_prefix().as_str())
            .and_then(|r| r.strip_prefix(PREFIX))
        else {
            continue;
        };
        let Some(pid) = rest.split('-').next().and_then(|p| p.parse::<u32>().ok()) else {
            continue;
        };
        if include_live || !pid_alive(pid) {
            ip(&["netns", "del", &n])?;
            gone.push(n);
        }
    }
    Ok(gone)
}

/// One network namespace of a [`Topology`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Host {
    /// Short name given to the builder.
    pub name: String,
    /// Namespace name (`ip netns`).
    pub netns: String,
    /// (interface, address, prefix length) of each veth end in this host.
    pub ifaces: Vec<(String, Ipv4Addr, u8)>,
    /// (interface, IPv6 unique local address, prefix length) of each veth
    /// end, when the topology was built with [`TopologyBuilder::ipv6`].
    pub ifaces6: Vec<(String, Ipv6Addr, u8)>,
}

impl Host {
    /// First address of this host.
    pub fn addr(&self) -> Ipv4Addr {
        self.ifaces
            .first()
            .map(|i| i.1)
            .unwrap_or(Ipv4Addr::LOCALHOST)
    }

    /// First IPv6 unique local address of this host, if it has one.
    pub fn addr6(&self) -> Option<Ipv6Addr> {
        self.ifaces6.first().map(|i| i.1)
    }

    /// The link-local IPv6 address of `ifname` in this host (as the
    /// kernel made it from the MAC), if it has one.
    pub fn link_local(&self, ifname: &str) -> io::Result<Option<Ipv6Addr>> {
        let out = Command::new("ip")
            .args(["-n", &self.netns, "-6", "-o", "addr", "show", "dev", ifname])
            .args(["scope", "link"])
            .output()?;
        if !out.status.success() {
            return Err(io::Error::other(format!(
                "ip -6 addr show dev {ifname} in {}: {}",
                self.netns,
                String::from_utf8_lossy(&out.stderr).trim()
            )));
        }
        Ok(String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .skip_while(|w| *w != "inet6")
            .nth(1)
            .and_then(|a| a.split('/').next()?.parse().ok()))
    }

    /// A `Command` that runs `program` inside this host (`ip netns exec`).
    pub fn command(&self, program: &str) -> Command {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &self.netns, program]);
        cmd
    }

    /// Move the calling thread into this host's namespace (for good).
    pub fn enter(&self) -> io::Result<()> {
        let file = std::fs::File::open(format!("/run/netns/{}", self.netns))?;
        // SAFETY: setns with a namespace fd we hold open; affects only this thread.
        crate::sys::cvt(unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) })?;
        Ok(())
    }

    /// Start a thread inside this host. The thread enters the namespace
    /// before `f` runs; an error to enter is returned through the handle.
    pub fn spawn<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> std::thread::JoinHandle<io::Result<T>> {
        let handle = self.clone();
        std::thread::spawn(move || {
            handle.enter()?;
            Ok(f())
        })
    }

    /// Run `f` on a thread inside this host and wait for it (a scoped
    /// thread: `f` may borrow from the caller). A panic in `f` is resumed
    /// in the caller.
    pub fn run<T: Send>(&self, f: impl FnOnce() -> T + Send) -> io::Result<T> {
        std::thread::scope(|scope| {
            scope
                .spawn(|| {
                    self.enter()?;
                    Ok(f())
                })
                .join()
                .unwrap_or_else(|p| std::panic::resume_unwind(p))
        })
    }
}

/// How hosts are joined.
#[derive(Clone, Debug)]
enum Wiring {
    /// veth pairs between named hosts, one /24 each.
    Links(Vec<(String, String)>),
    /// Every host on one bridge in a hidden switch namespace, one /24.
    Bridge,
}

/// Builds a [`Topology`].
#[derive(Clone, Debug)]
pub struct TopologyBuilder {
    hosts: Vec<String>,
    wiring: Wiring,
    ipv6: bool,
    /// Receive and transmit queues of each point-to-point veth end.
    queues: u32,
}

impl TopologyBuilder {
    /// Add a host (names: letters, digits, `_`; at most 16 bytes).
    pub fn host(mut self, name: &str) -> Self {
        self.hosts.push(name.to_string());
        self
    }
    /// Join `a` and `b` with a veth pair (point-to-point).
    pub fn link(mut self, a: &str, b: &str) -> Self {
        match &mut self.wiring {
            Wiring::Links(l) => l.push((a.to_string(), b.to_string())),
            Wiring::Bridge => {}
        }
        self
    }
    /// Give every point-to-point veth end `queues` receive and transmit
    /// queues (`numrxqueues`/`numtxqueues`, 1..=64; default 1): a sender's
    /// transmit queue, chosen by its flow hash, is the receiver's receive
    /// queue, as RSS spreads flows on a multi-queue NIC.
    pub fn queues(mut self, queues: u32) -> Self {
        self.queues = queues;
        self
    }
    /// Put every host on one bridge instead of point-to-point links.
    pub fn bridge(mut self) -> Self {
        self.wiring = Wiring::Bridge;
        self
    }
    /// Give every veth end an IPv6 unique local address too, next to its
    /// IPv4 one: `fd77:0:0:N::H/64` where the IPv4 address is `10.77.N.H`
    /// (duplicate address detection off in these namespaces, so every
    /// address, link-local ones included, is usable at once).
    pub fn ipv6(mut self) -> Self {
        self.ipv6 = true;
        self
    }

    /// Create the namespaces and links. On any failure, what was created is removed.
    pub fn build(self) -> io::Result<Topology> {
        static COUNTER: AtomicU32 = AtomicU32::new(0);
        let serial = COUNTER.fetch_add(1, Ordering::Relaxed);
        if serial == 0 {
            remove_stale_namespaces();
        }
        let base = format!("{}{serial}-", own_prefix());
        self.validate()?;
        let queues = self.queues.to_string();
        let mut topo = Topology {
            hosts: self
                .hosts
                .iter()
                .map(|h| Host {
                    name: h.clone(),
                    netns: format!("{base}{h}"),
                    ifaces: Vec::new(),
                    ifaces6: Vec::new(),
                })
                .collect(),
            extra_netns: Vec::new(),
        };
        // From here on, dropping `topo` on error removes whatever exists.
        for h in &topo.hosts {
            ip(&["netns", "add", &h.netns])?;
            ip(&["-n", &h.netns, "link", "set", "lo", "up"])?;
            if self.ipv6 {
                // Before any veth exists: they take the namespace's defaults.
                no_dad(&h.netns)?;
            }
        }
        let ipv6 = self.ipv6;
        match self.wiring {
            Wiring::Links(links) => {
                for (k, (addr, b)) in links.iter().enumerate() {
                    if k >= 250 {
                        return Err(io::Error::new(
                            io::ErrorKind::InvalidInput,
                            "too many links",
                        ));
                    }
                    let index_a = topo.index(addr)?;
                    let index_b = topo.index(b)?;
                    if index_a == index_b {
                        return Err(io::Error::new(
                            io::ErrorKind::InvalidInput,
                            "link to itself",
                        ));
                    }
                    let net = (k + 1) as u8;
                    let name_a = format!("eth{}", topo.hosts[index_a].ifaces.len());
                    let name_b = format!("eth{}", topo.hosts[index_b].ifaces.len());
                    let (nsa, nsb) = (
                        topo.hosts[index_a].netns.clone(),
                        topo.hosts[index_b].netns.clone(),
                    );
                    ip(&[
                        "link",
                        "add",
                        "name",
                        &name_a,
                        "netns",
                        &nsa,
                        "numrxqueues",
                        &queues,
                        "numtxqueues",
                        &queues,
                        "type",
                        "veth",
                        "peer",
                        "name",
                        &name_b,
                        "netns",
                        &nsb,
                        "numrxqueues",
                        &queues,
                        "numtxqueues",
                        &queues,
                    ])?;
                    for (ns, ifn, host, i) in
                        [(&nsa, &name_a, 1u8, index_a), (&nsb, &name_b, 2u8, index_b)]
                    {
                        let addr = Ipv4Addr::new(10, 77, net, host);
                        ip(&["-n", ns, "addr", "add", &format!("{addr}/24"), "dev", ifn])?;
                        if ipv6 {
                            let addr6 = ula(net, host);
                            add_ula(ns, ifn, addr6)?;
                            topo.hosts[i].ifaces6.push((ifn.clone(), addr6, 64));
                        }
                        ip(&["-n", ns, "link", "set", ifn, "up"])?;
                        topo.hosts[i].ifaces.push((ifn.clone(), addr, 24));
                    }
                }
            }
            Wiring::Bridge => wire_bridge(&mut topo, &base, ipv6)?,
        }
        Ok(topo)
    }

    /// The host names and queue count, checked before anything is created.
    fn validate(&self) -> io::Result<()> {
        for h in &self.hosts {
            if h.is_empty()
                || h.len() > 16
                || !h.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
            {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("bad host name {h:?}"),
                ));
            }
        }
        if !(1..=64).contains(&self.queues) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "1 to 64 queues per veth end",
            ));
        }
        let mut seen = std::collections::HashSet::new();
        if !self.hosts.iter().all(|h| seen.insert(h)) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "duplicate host name",
            ));
        }
        Ok(())
    }
}

/// Every host on one bridge in a hidden switch namespace, one /24 (and one
/// /64 with `ipv6`).
fn wire_bridge(topo: &mut Topology, base: &str, ipv6: bool) -> io::Result<()> {
    if topo.hosts.len() > 250 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "too many hosts",
        ));
    }
    let switch = format!("{base}switch");
    ip(&["netns", "add", &switch])?;
    topo.extra_netns.push(switch.clone());
    ip(&["-n", &switch, "link", "add", "br0", "type", "bridge"])?;
    ip(&["-n", &switch, "link", "set", "br0", "up"])?;
    for i in 0..topo.hosts.len() {
        let ns = topo.hosts[i].netns.clone();
        let port = format!("p{i}");
        ip(&[
            "link", "add", "name", "eth0", "netns", &ns, "type", "veth", "peer", "name", &port,
            "netns", &switch,
        ])?;
        ip(&["-n", &switch, "link", "set", &port, "master", "br0"])?;
        ip(&["-n", &switch, "link", "set", &port, "up"])?;
        let addr = Ipv4Addr::new(10, 77, 0, (i + 1) as u8);
        ip(&[
            "-n",
            &ns,
            "addr",
            "add",
            &format!("{addr}/24"),
            "dev",
            "eth0",
        ])?;
        if ipv6 {
            let addr6 = ula(0, (i + 1) as u8);
            add_ula(&ns, "eth0", addr6)?;
            topo.hosts[i].ifaces6.push(("eth0".into(), addr6, 64));
        }
        ip(&["-n", &ns, "link", "set", "eth0", "up"])?;
        topo.hosts[i].ifaces.push(("eth0".into(), addr, 24));
    }
    Ok(())
}

/// The unique local address `fd77:0:0:net::host` (IPv4 `10.77.net.host`).
fn ula(net: u8, host: u8) -> Ipv6Addr {
    Ipv6Addr::new(0xfd77, 0, 0, net.into(), 0, 0, 0, host.into())
}

/// Add `addr`/64 to `ifname` in `ns`, usable at once (no DAD).
fn add_ula(ns: &str, ifname: &str, addr: Ipv6Addr) -> io::Result<()> {
    ip(&[
        "-n",
        ns,
        "-6",
        "addr",
        "add",
        &format!("{addr}/64"),
        "dev",
        ifname,
        "nodad",
    ])
}

/// Duplicate address detection off in namespace `ns` (its own sysctls):
/// link-local addresses are usable as soon as a link is up, so neighbour
/// discovery between the hosts starts at once.
fn no_dad(ns: &str) -> io::Result<()> {
    for key in [
        "net.ipv6.conf.all.accept_dad=0",
        "net.ipv6.conf.default.accept_dad=0",
    ] {
        let out = Command::new("ip")
            .args(["netns", "exec", ns, "sysctl", "-qw", key])
            .output()?;
        if !out.status.success() {
            return Err(io::Error::other(format!(
                "sysctl {key} in {ns}: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            )));
        }
    }
    Ok(())
}

/// Named namespaces joined by veth pairs; all deleted on drop.
#[derive(Debug)]
pub struct Topology {
    hosts: Vec<Host>,
    extra_netns: Vec<String>,
}

impl Topology {
    /// Start describing a topology.
    pub fn builder() -> TopologyBuilder {
        TopologyBuilder {
            hosts: Vec::new(),
            wiring: Wiring::Links(Vec::new()),
            ipv6: false,
            queues: 1,
        }
    }

    fn index(&self, name: &str) -> io::Result<usize> {
        self.hosts
            .iter()
            .position(|h| h.name == name)
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, format!("no host {name:?}")))
    }

    /// The host called `name`.
    pub fn host(&self, name: &str) -> Option<&Host> {
        self.hosts.iter().find(|h| h.name == name)
    }

    /// All hosts, in the order they were added.
    pub fn hosts(&self) -> &[Host] {
        &self.hosts
    }

    /// Every namespace name this topology owns (hosts and switch).
    pub fn netns_names(&self) -> Vec<String> {
        self.hosts
            .iter()
            .map(|h| h.netns.clone())
            .chain(self.extra_netns.iter().cloned())
            .collect()
    }
}

impl Drop for Topology {
    fn drop(&mut self) {
        // Deleting a namespace destroys the veth ends inside it (and with them
        // their peers). Errors are reported, never raised, while dropping.
        for ns in self.netns_names() {
            if let Err(error) = ip(&["netns", "del", &ns]) {
                if std::path::Path::new(&format!("/run/netns/{ns}")).exists() {
                    log::warn!("could not delete netns {ns}: {error}");
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_our_names_give_a_creator_pid() {
        // (No site prefix in the test environment unless set: then the
        // names below are not ours and none matches.)
        let site = site_prefix();
        assert_eq!(creator_pid(&format!("{site}rw-4242-0-sfu")), Some(4242));
        assert_eq!(creator_pid(&format!("{site}rw-4242-")), Some(4242));
        assert_eq!(creator_pid(&format!("{site}rw-x42-0-sfu")), None);
        assert_eq!(creator_pid(&format!("{site}rw-4242")), None);
        assert_eq!(creator_pid("other-4242-0-sfu"), None);
        assert_eq!(creator_pid(&format!("{site}rw--0")), None);
    }

    #[test]
    fn stale_namespaces_of_dead_creators_are_removed_and_live_ones_kept() {
        if !std::path::Path::new("/run/netns").exists() && ip(&["netns", "list"]).is_err() {
            return;
        }
        // A PID that cannot exist (above pid_max's ceiling) and our own.
        let dead = format!("{}rw-4194304-0-stale", site_prefix());
        let live = format!("{}0-live", own_prefix());
        if ip(&["netns", "add", &dead]).is_err() {
            return; // no CAP_SYS_ADMIN here
        }
        ip(&["netns", "add", &live]).unwrap();
        remove_stale_namespaces();
        let list = String::from_utf8_lossy(
            &Command::new("ip")
                .args(["netns", "list"])
                .output()
                .unwrap()
                .stdout,
        )
        .into_owned();
        let _ = ip(&["netns", "del", &live]);
        let _ = ip(&["netns", "del", &dead]);
        assert!(
            !list.contains(&dead),
            "the dead creator's namespace is gone"
        );
        assert!(list.contains(&live), "our own namespace stays");
    }
}
