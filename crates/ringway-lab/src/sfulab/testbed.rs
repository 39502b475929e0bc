//! The paper's testbed emulated with namespaces: the SFU in host `sfu`,
//! client i in host `c<i>`, all joined by veth to one bridge in a switch
//! namespace — with a NIC-like boundary at the switch ports and CPU time
//! accounted per emulated host.
//!
//! * **Switch ports with threaded NAPI.** Every bridge-side veth gets a
//!   pass-everything XDP program in native mode (which gives veth a NAPI
//!   receive path) and `threaded` NAPI: a frame sent into a port is queued
//!   there, and the bridging and the receiving host's stack run in that
//!   port's NAPI kernel thread. So the SFU's send call pays for handing its
//!   copies to "the NIC", not for delivering them to the clients (without
//!   this, veth runs the whole downstream path inside the sender's syscall
//!   and this kernel, without IRQ time accounting, charges it to the
//!   sender). Chosen over pinning the load to the other CPU: pinning moves
//!   no softirq work, which runs on the sender's CPU either way.
//! * **The SFU's interface** also gets native XDP (the AF_XDP backend's own
//!   program, or a pass-everything one for the other backends, so every
//!   backend pays the same veth XDP receive path) and threaded NAPI: the
//!   SFU host's receive-side kernel work runs in its own NAPI thread.
//! * **A transmit queue** (pfifo, 10000 packets) on every host's veth, as a
//!   NIC driver has: veth stops its queue while the switch port's ring is
//!   full, so a socket's packets wait there instead of being dropped; the
//!   AF_XDP backend, which bypasses the qdisc, queues in its TX ring (the
//!   lab gives it 8192 TX frames, as deep) and waits when that is full (a
//!   run where it had to is flagged as congested).
//! * **Full UDP checksums** from the clients (TX checksum offload off on
//!   their veths): the AF_XDP backend verifies every checksum, and a
//!   same-host sender would otherwise leave it partial.
//! * **CPU per emulated host**: the SFU host is its engine thread plus its
//!   NAPI thread, the switch is the port NAPI threads (bridging and the
//!   clients' receive path), the clients are the load threads. Kernel
//!   threads are found by name (`napi/<dev>-<id>`) as they appear. The
//!   machine's busy time (the CPUs' time less their exact idle time,
//!   [`MachineTimes`]) minus all of these is other load on the machine.
//!   Softirq work done outside these threads (e.g. at a syscall's return)
//!   is charged to whatever thread ran it: approximate, as the kernel has
//!   no IRQ time accounting here.
//! * **The SFU host alone on its CPUs** ([`Testbed::pin_napi_threads`]):
//!   with `--cpus` the SFU's NAPI thread runs on the SFU's CPUs with its
//!   engine, with `--load-cpus` the switch's (the wire's) on the load's, as the
//!   paper's SFU had a machine of its own. Unpinned, the scheduler moved
//!   the SFU's NAPI thread and the busiest switch thread between the two
//!   vCPUs every few seconds, and the SFU host's kernel work ran partly
//!   beside the wire on the load's CPU, where its wake-ups were local and
//!   its caches shared: the in-kernel fan-out's SFU host measured 0.19x
//!   socket's CPU per packet that way and 0.35x pinned (docs/pktswitch.md).

use anyhow::Context;
use ringway_io::backend::{attach_xdp_pass, XdpAttachment};
use ringway_io::netns::{Host, Topology};
use ringway_io::thread::CpuTime;
use ringway_io::XdpMode;
use std::collections::BTreeSet;
use std::net::IpAddr;

/// The namespace testbed (deleted on drop).
pub struct Testbed {
    // Declared first: the programs are detached before the namespaces go.
    ports: Vec<XdpAttachment>,
    /// NAPI threads of the switch ports (pids).
    pub switch_napi: Vec<u32>,
    /// The switch namespace (bridged testbeds only).
    switch: Option<Host>,
    clients: usize,
    napi: bool,
    /// Every host has an IPv6 unique local address too, and the SFU
    /// listens on its own ([`Testbed::sfu_addr`]).
    ipv6: bool,
    topology: Topology,
}

impl Testbed {
    /// Hosts `sfu` and `c0..c<clients>` on one bridge; `napi`: threaded
    /// NAPI at the switch ports (see the module docs); `ipv6`: IPv6 unique
    /// local addresses too (`fd77::1` the SFU, `fd77::<i+2>` client i), the
    /// SFU listening on its own.
    pub fn build(clients: usize, napi: bool, ipv6: bool) -> anyhow::Result<Testbed> {
        let mut topology_builder = Topology::builder().host("sfu");
        for i in 0..clients {
            topology_builder = topology_builder.host(&format!("c{i}"));
        }
        if ipv6 {
            topology_builder = topology_builder.ipv6();
        }
        let topology = topology_builder
            .bridge()
            .build()
            .context("building the namespace topology")?;
        let switch_ns = topology
            .netns_names()
            .into_iter()
            .find(|n| n.ends_with("-switch"))
            .context("the topology has no switch namespace")?;
        let switch = Some(Host {
            name: "switch".into(),
            netns: switch_ns,
            ifaces: Vec::new(),
            ifaces6: Vec::new(),
        });
        for i in 0..clients {
            let host = topology.host(&format!("c{i}")).expect("built").clone();
            let ifname = host.ifaces[0].0.clone();
            host.run(move || ringway_io::backend::disable_tx_checksum_offload(&ifname))
                .context("entering a client host")?
                .context("turning TX checksum offload off on a client veth")?;
        }
        if napi {
            queue_on_every_host(&topology)?;
        }
        let mut testbed = Testbed {
            ports: Vec::new(),
            switch_napi: Vec::new(),
            switch,
            clients,
            napi,
            ipv6,
            topology,
        };
        if let (true, Some(switch)) = (napi, testbed.switch.clone()) {
            let ports: Vec<String> = (0..=clients).map(|p| format!("p{p}")).collect();
            testbed.napi_at_ports(&switch, &ports)?;
        }
        Ok(testbed)
    }

    /// Native pass-everything XDP and threaded NAPI on `ports` of `host`
    /// (the switch, or the router), their NAPI threads counted as the
    /// switch's CPU.
    fn napi_at_ports(&mut self, host: &Host, ports: &[String]) -> anyhow::Result<()> {
        for port in ports {
            let name = port.clone();
            let attachment = host
                .run(move || attach_xdp_pass(&name, XdpMode::Native))
                .with_context(|| format!("entering the {} namespace", host.name))?
                .with_context(|| format!("native XDP on {} port {port}", host.name))?;
            self.ports.push(attachment);
            let threads = threaded_napi(host, port)?;
            self.switch_napi.extend(threads);
        }
        Ok(())
    }

    /// Hosts `sfu` and `c0..c<clients>` each on a link of its own to host
    /// `router`, which forwards between them (IPv4 and IPv6 forwarding on
    /// in its namespace): every client is behind a router, as on the
    /// Internet, and the SFU's next hop towards each is the router. Link 0
    /// is sfu–router (10.77.1.0/24, the SFU at .1), link i+1 router–client
    /// i (10.77.(i+2).0/24, the client at .2); default routes point at the
    /// router. With `ipv6`, the same in `fd77:0:0:N::/64` too, and the
    /// SFU's IPv6 default route points at the router's link-local address,
    /// as a route learnt from router advertisements does. `napi`: the
    /// router's ports get what a bridged testbed's switch ports get (native
    /// XDP, threaded NAPI, counted as the switch's CPU, and a transmit queue
    /// on every host), so that the forwarding the experiment causes is not
    /// counted as other load on the machine.
    pub fn routed(clients: usize, napi: bool, ipv6: bool) -> anyhow::Result<Testbed> {
        anyhow::ensure!(clients <= 200, "a routed testbed has at most 200 clients");
        let mut topology_builder = Topology::builder()
            .host("sfu")
            .host("router")
            .link("sfu", "router");
        for i in 0..clients {
            let name = format!("c{i}");
            topology_builder = topology_builder.host(&name).link("router", &name);
        }
        if ipv6 {
            topology_builder = topology_builder.ipv6();
        }
        let topology = topology_builder
            .build()
            .context("building the namespace topology")?;
        let router = topology.host("router").expect("built").clone();
        run_in(&router, &["sysctl", "-qw", "net.ipv4.ip_forward=1"])?;
        run_in(
            &router,
            &["sysctl", "-qw", "net.ipv6.conf.all.forwarding=1"],
        )?;
        let sfu = topology.host("sfu").expect("built").clone();
        run_in(&sfu, &["ip", "route", "add", "default", "via", "10.77.1.2"])?;
        if ipv6 {
            // (The SFU's own link-local address too: its fe80::/64 route
            // makes the gateway reachable.)
            wait_link_local(&sfu, "eth0")?;
            let router_eth0 = wait_link_local(&router, "eth0")?.to_string();
            run_in(
                &sfu,
                &[
                    "ip",
                    "-6",
                    "route",
                    "add",
                    "default",
                    "via",
                    &router_eth0,
                    "dev",
                    "eth0",
                ],
            )?;
        }
        for i in 0..clients {
            let host = topology.host(&format!("c{i}")).expect("built").clone();
            let gateway = format!("10.77.{}.1", i + 2);
            run_in(&host, &["ip", "route", "add", "default", "via", &gateway])?;
            if ipv6 {
                let gateway = format!("fd77:0:0:{:x}::1", i + 2);
                run_in(
                    &host,
                    &["ip", "-6", "route", "add", "default", "via", &gateway],
                )?;
            }
            let ifname = host.ifaces[0].0.clone();
            host.run(move || ringway_io::backend::disable_tx_checksum_offload(&ifname))
                .context("entering a client host")?
                .context("turning TX checksum offload off on a client veth")?;
        }
        if napi {
            queue_on_every_host(&topology)?;
        }
        let mut testbed = Testbed {
            ports: Vec::new(),
            switch_napi: Vec::new(),
            switch: napi.then(|| router.clone()),
            clients,
            napi,
            ipv6,
            topology,
        };
        if napi {
            let ports: Vec<String> = router.ifaces.iter().map(|i| i.0.clone()).collect();
            testbed.napi_at_ports(&router, &ports)?;
        }
        Ok(testbed)
    }

    /// The SFU's host.
    pub fn sfu(&self) -> &Host {
        self.topology.host("sfu").expect("built")
    }

    /// The address the SFU listens on: its IPv6 unique local address in an
    /// IPv6 testbed, else its IPv4 one.
    pub fn sfu_addr(&self) -> IpAddr {
        let sfu = self.sfu();
        match sfu.addr6() {
            Some(v6) if self.ipv6 => IpAddr::V6(v6),
            _ => IpAddr::V4(sfu.addr()),
        }
    }

    /// Namespaces of the first `n` clients.
    pub fn client_netns(&self, n: usize) -> Vec<String> {
        (0..n.min(self.clients))
            .map(|i| {
                self.topology
                    .host(&format!("c{i}"))
                    .expect("built")
                    .netns
                    .clone()
            })
            .collect()
    }

    /// Interface and address of each of the first `n` clients (IPv6 in an
    /// IPv6 testbed), for their AF_XDP receive path.
    pub fn client_interfaces(&self, n: usize) -> Vec<(String, IpAddr)> {
        (0..n.min(self.clients))
            .filter_map(|i| {
                let host = self.topology.host(&format!("c{i}")).expect("built");
                if self.ipv6 {
                    let (name, addr, _) = host.ifaces6.first()?;
                    Some((name.clone(), IpAddr::V6(*addr)))
                } else {
                    let (name, addr, _) = host.ifaces.first()?;
                    Some((name.clone(), IpAddr::V4(*addr)))
                }
            })
            .collect()
    }

    /// Full UDP checksums from the SFU host too (TX checksum offload off
    /// on its veth), for clients that receive through AF_XDP: it verifies
    /// every checksum, and a same-host sender leaves it partial.
    pub fn full_checksums_from_sfu(&self) -> anyhow::Result<()> {
        let host = self.sfu().clone();
        let ifname = host.ifaces[0].0.clone();
        host.run(move || ringway_io::backend::disable_tx_checksum_offload(&ifname))
            .context("entering the SFU host")?
            .context("turning TX checksum offload off on the SFU's veth")
    }

    /// Clients the testbed has hosts for.
    pub fn clients(&self) -> usize {
        self.clients
    }

    /// Threaded NAPI is on at the switch ports.
    pub fn napi(&self) -> bool {
        self.napi
    }

    /// Native pass-everything XDP on the SFU's interface (for the backends
    /// that do not attach their own program); held until dropped.
    pub fn sfu_pass_program(&self) -> anyhow::Result<XdpAttachment> {
        let host = self.sfu().clone();
        let ifname = host.ifaces[0].0.clone();
        host.run(move || attach_xdp_pass(&ifname, XdpMode::Native))
            .context("entering the SFU host")?
            .context("native XDP on the SFU's veth")
    }

    /// Turn threaded NAPI on for the SFU's interface (it has NAPI once an
    /// XDP program is attached); returns its NAPI threads: those named for
    /// it that are not in `before` (taken with [`napi_snapshot`] before the
    /// program was attached: the device keeps its threaded setting, so a
    /// re-attached program gets its thread at once).
    pub fn sfu_threaded_napi(&self, before: &NapiSnapshot) -> anyhow::Result<Vec<u32>> {
        let host = self.sfu().clone();
        let ifname = host.ifaces[0].0.clone();
        let mut found = threaded_napi(&host, &ifname)?;
        let prefix = format!("napi/{ifname}-");
        found.extend(
            napi_threads()
                .difference(&before.0)
                .filter(|(_, c)| c.starts_with(&prefix))
                .map(|(p, _)| *p),
        );
        found.sort_unstable();
        found.dedup();
        Ok(found)
    }

    /// The SFU host alone on its CPUs (module docs): the SFU's NAPI threads
    /// `sfu_napi` to `sfu_cpus`, the switch's to `load_cpus` (an empty list
    /// pins nothing). Returns one line per refusal; with `sfu_cpus` given
    /// and no SFU thread to pin, that is one too.
    pub fn pin_napi_threads(
        &self,
        sfu_napi: &[u32],
        sfu_cpus: &[usize],
        load_cpus: &[usize],
    ) -> Vec<String> {
        let missing = (sfu_napi.is_empty() && !sfu_cpus.is_empty())
            .then(|| "the SFU's NAPI thread was not found: not on the SFU's CPUs".to_string());
        [
            missing.into_iter().collect(),
            pin_kernel_threads(sfu_napi, sfu_cpus, "the SFU's"),
            pin_kernel_threads(&self.switch_napi, load_cpus, "the switch's"),
        ]
        .concat()
    }
}

/// The link-local address of `ifname` in `host`, once the kernel has made
/// it (when the link's carrier comes up; polled for at most 5 s).
fn wait_link_local(host: &Host, ifname: &str) -> anyhow::Result<std::net::Ipv6Addr> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        let found = host
            .link_local(ifname)
            .with_context(|| format!("reading the link-local address of {ifname}"))?;
        match found {
            Some(addr) => return Ok(addr),
            None if std::time::Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            None => anyhow::bail!("{ifname} in {} has no link-local address", host.netns),
        }
    }
}

/// Run `args` inside `host` (`ip netns exec`), failing with its stderr.
pub(crate) fn run_in(host: &Host, args: &[&str]) -> anyhow::Result<()> {
    let out = host
        .command(args[0])
        .args(&args[1..])
        .output()
        .with_context(|| format!("running {}", args[0]))?;
    anyhow::ensure!(
        out.status.success(),
        "{} in {}: {}",
        args.join(" "),
        host.netns,
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Ok(())
}

/// The kernel's NAPI threads at one moment.
pub struct NapiSnapshot(BTreeSet<(u32, String)>);

/// Take a [`NapiSnapshot`].
pub fn napi_snapshot() -> NapiSnapshot {
    NapiSnapshot(napi_threads())
}

impl NapiSnapshot {
    /// NAPI threads named `<prefix>...` now that were not in the snapshot.
    pub fn new_threads(&self, prefix: &str) -> Vec<u32> {
        napi_threads()
            .difference(&self.0)
            .filter(|(_, comm)| comm.starts_with(prefix))
            .map(|(pid, _)| *pid)
            .collect()
    }
}

/// Kernel threads named `napi/...` now.
fn napi_threads() -> BTreeSet<(u32, String)> {
    let mut out = BTreeSet::new();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return out;
    };
    for e in dir.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        if let Ok(comm) = std::fs::read_to_string(format!("/proc/{pid}/comm")) {
            if comm.starts_with("napi/") {
                out.insert((pid, comm.trim().to_string()));
            }
        }
    }
    out
}

/// A transmit queue (pfifo, 10000 packets) on every host's veth, as a NIC
/// driver has: with NAPI at the switch (or router) port, veth stops its
/// queue while the port's ring is full, and a socket's packets wait in the
/// qdisc instead of being dropped (AF_XDP, which bypasses the qdisc, waits
/// in its TX ring).
fn queue_on_every_host(topology: &Topology) -> anyhow::Result<()> {
    for host in topology.hosts() {
        for (dev, _, _) in &host.ifaces {
            run_in(
                host,
                &[
                    "tc", "qdisc", "replace", "dev", dev, "root", "pfifo", "limit", "10000",
                ],
            )?;
        }
    }
    Ok(())
}

/// `echo 1 > /sys/class/net/<dev>/threaded` inside `host` (sysfs shows the
/// devices of the namespace it was mounted in, so through `ip netns
/// exec`); returns the NAPI threads that appeared for `dev`.
pub(crate) fn threaded_napi(host: &Host, dev: &str) -> anyhow::Result<Vec<u32>> {
    let before = napi_threads();
    let enable = format!("echo 1 > /sys/class/net/{dev}/threaded");
    run_in(host, &["sh", "-c", &enable])?;
    let prefix = format!("napi/{dev}-");
    let mut found = Vec::new();
    for _ in 0..50 {
        found = napi_threads()
            .difference(&before)
            .filter(|(_, c)| c.starts_with(&prefix))
            .map(|(p, _)| *p)
            .collect();
        if !found.is_empty() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    Ok(found)
}

/// Pin the kernel threads `pids` (a testbed device's NAPI threads) to
/// `cpus`, as a NIC's interrupt is steered to the host it serves; returns
/// one line per refusal (`what`: whose threads). Nothing for empty `cpus`.
pub(crate) fn pin_kernel_threads(pids: &[u32], cpus: &[usize], what: &str) -> Vec<String> {
    if cpus.is_empty() {
        return Vec::new();
    }
    let list = crate::siplab::topology::cpu_list_text(cpus);
    pids.iter()
        .filter_map(|&pid| {
            let outcome = match i32::try_from(pid) {
                // 0 would name the calling thread.
                Ok(tid) if tid > 0 => ringway_io::thread::set_affinity_of(tid, cpus),
                _ => ringway_io::thread::Outcome::Refused("not a thread id".into()),
            };
            match outcome {
                ringway_io::thread::Outcome::Applied(_) => None,
                ringway_io::thread::Outcome::Refused(why) => {
                    Some(format!("{what} NAPI thread {pid} to CPUs {list}: {why}"))
                }
            }
        })
        .collect()
}

/// Sum of the CPU times of `pids` (processes or kernel threads) now;
/// `None` if one of them cannot be read (gone): the sum is unknown, n/a.
pub fn cpu_of(pids: &[u32]) -> Option<CpuTime> {
    pids.iter().try_fold(CpuTime::default(), |a, &p| {
        let cpu = ringway_server::host::process_cpu_time_of(p).ok()?;
        Some(CpuTime {
            user_ns: a.user_ns + cpu.user_ns,
            system_ns: a.system_ns + cpu.system_ns,
        })
    })
}

/// The id of a live thread of this process named `name` (`comm`), if any.
pub fn thread_named(name: &str) -> Option<i32> {
    std::fs::read_dir("/proc/self/task")
        .ok()?
        .flatten()
        .find_map(|e| {
            let tid: i32 = e.file_name().to_str()?.parse().ok()?;
            let comm = std::fs::read_to_string(e.path().join("comm")).ok()?;
            (comm.trim_end() == name).then_some(tid)
        })
}

/// The CPU time a thread of this process has run, in ns
/// (`/proc/self/task/TID/schedstat`, first field: exact, unlike the 10 ms
/// ticks of `stat`, which round a short window's few ms to 0).
pub fn thread_run_time_ns(tid: i32) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/self/task/{tid}/schedstat")).ok()?;
    text.split_whitespace().next()?.parse().ok()
}

/// The machine's CPU times at one moment, all CPUs summed (`/proc/stat`),
/// in ns.
///
/// The busy fields (user, system, softirq, ...) are tick samples: this
/// kernel (`CONFIG_TICK_CPU_ACCOUNTING`) charges a whole tick (4 ms at
/// HZ=250) to whatever a CPU is doing when its tick fires. The idle and
/// iowait fields are exact on a tickless kernel (the idle clock). A load
/// whose period divides the tick's (the SFU lab's 2 ms and 4 ms packet
/// intervals) puts its bursts at the same point of every tick: a CPU's
/// ticks then find it always busy or always idle, and its sampled busy time
/// is off by up to the CPU's whole idle time, the same way for a whole run.
/// Busy time over a window is therefore the window's CPU time less the
/// exact idle time ([`MachineTimes::busy_between`]), not the sum of the
/// sampled fields ([`MachineTimes::sampled_busy_ns`], kept to show the
/// difference).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MachineTimes {
    /// CPUs with a line of their own (online).
    pub cpus: u64,
    /// Idle and iowait time.
    pub idle_ns: u64,
    /// Busy time as the ticks sampled it (user, nice, system, irq, softirq,
    /// steal).
    pub sampled_busy_ns: u64,
    /// Time the hypervisor took from the machine's CPUs (steal).
    pub steal_ns: u64,
}

impl MachineTimes {
    /// From a `/proc/stat` text (`None`: no `cpu` line, or one with fewer
    /// than 8 fields).
    pub fn parse(text: &str) -> Option<MachineTimes> {
        let mut lines = text.lines();
        let fields: Vec<u64> = lines
            .next()?
            .strip_prefix("cpu ")?
            .split_whitespace()
            .filter_map(|x| x.parse().ok())
            .collect();
        if fields.len() < 8 {
            return None;
        }
        let cpus = lines
            .take_while(|l| l.starts_with("cpu"))
            .filter(|l| l[3..].starts_with(|c: char| c.is_ascii_digit()))
            .count() as u64;
        let tick = 1_000_000_000 / ringway_server::host::USER_HZ;
        let idle = fields[3] + fields[4];
        let total: u64 = fields[..8].iter().sum();
        Some(MachineTimes {
            cpus,
            idle_ns: idle * tick,
            sampled_busy_ns: (total - idle) * tick,
            steal_ns: fields[7] * tick,
        })
    }

    /// Now.
    pub fn read() -> Option<MachineTimes> {
        MachineTimes::parse(&std::fs::read_to_string("/proc/stat").ok()?)
    }

    /// Busy time of all CPUs from `self` to `later`, `window_ns` apart:
    /// the CPUs' time over the window less their exact idle time (`None`
    /// if the CPUs changed in between or a counter went back).
    pub fn busy_between(&self, later: &MachineTimes, window_ns: u64) -> Option<u64> {
        if self.cpus != later.cpus || self.cpus == 0 {
            return None;
        }
        let idle = later.idle_ns.checked_sub(self.idle_ns)?;
        Some((window_ns * self.cpus).saturating_sub(idle))
    }
}

#[cfg(test)]
mod thread_tests {
    use super::*;

    #[test]
    fn a_thread_that_ran_under_a_tick_shows_its_run_time() {
        let (go_tx, go) = std::sync::mpsc::channel::<()>();
        let (done_tx, done) = std::sync::mpsc::channel::<i32>();
        let (end_tx, end) = std::sync::mpsc::channel::<()>();
        let t = std::thread::spawn(move || {
            let tid: i32 = std::fs::read_link("/proc/thread-self")
                .unwrap()
                .file_name()
                .unwrap()
                .to_str()
                .unwrap()
                .parse()
                .unwrap();
            done_tx.send(tid).unwrap();
            go.recv().unwrap();
            // Spin for 3 ms of this thread's CPU time (its own precise
            // clock), not of wall time, which a loaded machine would spend
            // partly on other threads.
            let own = ringway_io::thread::thread_cpu_total();
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
            while ringway_io::thread::thread_cpu_total() < own + std::time::Duration::from_millis(3)
                && std::time::Instant::now() < deadline
            {
                for _ in 0..1000 {
                    std::hint::black_box(0u64);
                }
            }
            // Blocking here accounts the run time (a context switch).
            done_tx.send(tid).unwrap();
            let _ = end.recv();
        });
        let tid = done.recv().unwrap();
        let before = thread_run_time_ns(tid).expect("schedstat");
        go_tx.send(()).unwrap();
        done.recv().unwrap();
        std::thread::sleep(std::time::Duration::from_millis(2));
        let after = thread_run_time_ns(tid).expect("schedstat");
        end_tx.send(()).unwrap();
        t.join().unwrap();
        // 3 ms of spinning is under one 10 ms tick of `stat`, yet it shows.
        assert!(after >= before + 2_000_000, "{before} -> {after}");
    }

    #[test]
    fn machine_times_take_idle_exactly_and_count_online_cpus() {
        // user nice system idle iowait irq softirq steal guest guest_nice
        let text = "cpu  300 5 120 1900 20 0 40 15 0 0\n\
            cpu0 150 5 60 950 10 0 20 5 0 0\n\
            cpu1 150 0 60 950 10 0 20 10 0 0\n\
            intr 1 2\nctxt 9\n";
        let a = MachineTimes::parse(text).unwrap();
        let tick = 10_000_000;
        assert_eq!(
            a,
            MachineTimes {
                cpus: 2,
                idle_ns: 1920 * tick,
                sampled_busy_ns: 480 * tick,
                steal_ns: 15 * tick,
            }
        );
        // 1 s later: 0.5 s of the 2 CPU-seconds idle, whatever the ticks
        // sampled.
        let b = MachineTimes {
            idle_ns: a.idle_ns + 500_000_000,
            sampled_busy_ns: a.sampled_busy_ns,
            ..a
        };
        assert_eq!(a.busy_between(&b, 1_000_000_000), Some(1_500_000_000));
        assert_eq!(b.busy_between(&a, 1_000_000_000), None, "idle went back");
        let three = MachineTimes { cpus: 3, ..b };
        assert_eq!(a.busy_between(&three, 1_000_000_000), None);
        assert!(MachineTimes::parse("cpu0 1 2 3 4 5 6 7 8\n").is_none());
        assert!(MachineTimes::parse("cpu  1 2 3\n").is_none());
        // The live counters parse, with at least one CPU.
        let now = MachineTimes::read().expect("/proc/stat");
        assert!(now.cpus >= 1);
    }

    #[test]
    fn finds_a_thread_of_this_process_by_name() {
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let (started_tx, started) = std::sync::mpsc::channel::<()>();
        let t = std::thread::Builder::new()
            .name("probe-thread".into())
            .spawn(move || {
                // The name is set by the thread itself as it starts.
                started_tx.send(()).unwrap();
                let _ = rx.recv();
            })
            .unwrap();
        started.recv().unwrap();
        let tid = thread_named("probe-thread").expect("the named thread");
        let comm = std::fs::read_to_string(format!("/proc/self/task/{tid}/comm")).unwrap();
        assert_eq!(comm.trim_end(), "probe-thread");
        assert!(ringway_io::thread::thread_cpu_time_of(tid).is_ok());
        tx.send(()).unwrap();
        t.join().unwrap();
        assert_eq!(thread_named("no-such-thread"), None);
    }

    #[test]
    fn threads_are_pinned_to_their_hosts_cpus_or_the_refusal_is_named() {
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let (started_tx, started) = std::sync::mpsc::channel::<i32>();
        let t = std::thread::spawn(move || {
            started_tx.send(ringway_io::thread::current_tid()).unwrap();
            let _ = rx.recv();
        });
        let tid = started.recv().unwrap();
        let all = ringway_io::thread::affinity().unwrap();
        let last = *all.last().unwrap();
        if all.len() < 2 {
            tx.send(()).unwrap();
            t.join().unwrap();
            ringway_io::testing::skip("one CPU: a pin would not change the mask");
            return;
        }
        let pid = u32::try_from(tid).unwrap();
        assert!(pin_kernel_threads(&[pid], &[last], "a test's").is_empty());
        assert_eq!(ringway_io::thread::affinity_of(tid).unwrap(), vec![last]);
        // Not pinned without CPUs.
        assert!(pin_kernel_threads(&[pid], &[], "a test's").is_empty());
        assert_eq!(ringway_io::thread::affinity_of(tid).unwrap(), vec![last]);
        tx.send(()).unwrap();
        t.join().unwrap();
        // A thread that is gone: one line naming whose thread and why.
        let refused = pin_kernel_threads(&[u32::MAX >> 1], &[last], "the switch's");
        assert_eq!(refused.len(), 1, "{refused:?}");
        assert!(
            refused[0].starts_with("the switch's NAPI thread") && refused[0].contains("ESRCH"),
            "{refused:?}"
        );
    }
}
