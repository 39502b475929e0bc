//! `ringway lab sip --netns`: the proxies on one wire. The generator (the
//! built-in load generator with its UAS) runs in host `gen`, the proxy in
//! host `proxy`, joined by one veth pair (10.77.1.1 and 10.77.1.2; with
//! `--ipv6` the hosts' unique local addresses fd77:0:0:1::1 and ::2 are
//! used instead). ringway on each socket backend and on AF_XDP, and
//! Kamailio, are measured on this same wire in one run: for every
//! repetition and rate each arm runs once, in an order that rotates from
//! block to block, with the same seed, and every arm gets the same drop
//! rate and CPU figures (a column an arm has no data for says n/a).
//!
//! The wire, as the SFU testbed's (`sfulab::testbed`):
//! * **Native XDP and threaded NAPI on both veth ends.** The proxy's end
//!   runs the xdp backend's own program, or a pass-everything one for the
//!   other arms (so every arm pays the same veth receive path); the
//!   generator's end a pass-everything one. Each host's receive path then
//!   runs in the NAPI thread of its own veth and is counted as that
//!   host's CPU (without NAPI, veth delivers inside the sender's syscall
//!   and this kernel, without IRQ time accounting, charges the receiver's
//!   work to the sender).
//! * **A transmit queue** (pfifo, 10,000 packets) on both ends, as a NIC
//!   driver has: a sender waits there while the peer's ring is full.
//! * **Full UDP checksums** from the generator (TX checksum offload off on
//!   its veth: the xdp backend verifies every checksum, and a same-host
//!   sender would leave them partial).
//!
//! Per run, for every arm alike: the drop rate (PDR) is every datagram
//! lost on its way into the proxy over all datagrams offered to it: the
//! proxy's socket drops, the AF_XDP socket's own (RX ring full, no fill
//! buffer: xdp arm) and the veth pair's towards the proxy. Proxy CPU is
//! its processes plus its veth's NAPI thread, generator CPU its threads
//! plus its veth's NAPI thread. A run whose generator fell behind, or
//! whose xdp proxy fell back to a socket backend, is flagged and left
//! out, as in the loopback lab.

use super::kernel::Plan;
use super::sweep::{seed_for, Store, SweepConfig, SweepProgress, MAX_CALLS_PER_RUN};
use super::{
    plan_for, proxy_ended, proxy_summary, record_background, record_load, record_proxy_summary,
    run_generator, start_proxy, stop_proxy, topology, Counters, ProxyKind, ProxyWire, RunRecord,
    RunSpec, Tools,
};
use crate::sfulab::testbed::{
    napi_snapshot, pin_kernel_threads, run_in, threaded_napi, NapiSnapshot,
};
use crate::stats::mean_ci;
use anyhow::Context;
use ringway_io::backend::{attach_xdp_pass, XdpAttachment};
use ringway_io::netns::{Host, Topology};
use ringway_io::{BackendKind, XdpMode};
use serde::Serialize;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

/// The veth end's name in both hosts (the namespace builder's).
const DEV: &str = "eth0";
/// The proxy's SIP port.
const SIP_PORT: u16 = 5060;
/// Longest receive-coalescing window `ringway sip proxy` takes (µs).
const MAX_RX_COALESCE_US: u64 = 100_000;

/// Name of an arm in reports: `kamailio`, `ringway/<backend>`.
pub fn arm_name(proxy: ProxyKind, backend: BackendKind) -> &'static str {
    match (proxy, backend) {
        (ProxyKind::Kamailio, _) => "kamailio",
        (ProxyKind::Ringway, BackendKind::Xdp) => "ringway/xdp",
        (ProxyKind::Ringway, BackendKind::Mmsg) => "ringway/mmsg",
        (ProxyKind::Ringway, BackendKind::Socket) => "ringway/socket",
        (ProxyKind::Ringway, BackendKind::Uring) => "ringway/uring",
    }
}

/// One proxy as measured: Kamailio, or ringway on one backend (with
/// receive coalescing or without).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Arm {
    /// The proxy.
    pub proxy: ProxyKind,
    /// ringway's backend (Kamailio: mmsg, not used).
    pub backend: BackendKind,
    /// ringway's receive-coalescing window, µs (`None`: off; Kamailio: none).
    pub rx_coalesce_us: Option<u64>,
}

impl Arm {
    /// The arm a run of `spec` belongs to.
    pub fn of(spec: &RunSpec) -> Arm {
        match spec.proxy {
            ProxyKind::Kamailio => Arm {
                proxy: ProxyKind::Kamailio,
                backend: BackendKind::Mmsg,
                rx_coalesce_us: None,
            },
            ProxyKind::Ringway => Arm {
                proxy: ProxyKind::Ringway,
                backend: spec.backend,
                rx_coalesce_us: spec.rx_coalesce_us,
            },
        }
    }

    /// `kamailio`, `ringway/xdp`, `ringway/xdp+rx200us` (receive
    /// coalescing of 200 µs), ...
    pub fn name(&self) -> String {
        let base = arm_name(self.proxy, self.backend);
        match self.rx_coalesce_us {
            Some(us) => format!("{base}+rx{us}us"),
            None => base.to_string(),
        }
    }
}

/// What `--netns` adds to the sweep's options (`--backends`, `--rates`,
/// `--ipv6`, `--rx-coalesce-us`).
#[derive(Clone, Debug, Default)]
pub struct VethPlan {
    /// ringway's backends, one arm each.
    pub backends: Vec<BackendKind>,
    /// Offered call rates (calls/s).
    pub rates: Vec<f64>,
    /// The hosts talk IPv6.
    pub ipv6: bool,
    /// ringway's receive-coalescing windows (µs; 0: off).
    pub rx_coalesce_us: Vec<u64>,
}

/// A `--netns` experiment: the sweep's settings (proxies, workers, mode,
/// repetitions, duration, threshold, CPUs, seed) at fixed rates, with
/// ringway on each of `backends`.
#[derive(Clone, Debug)]
pub struct VethConfig {
    /// Shared settings (its rate grid and scheduler modes are not used).
    pub sweep: SweepConfig,
    /// ringway's backends, one arm each (`--backends`).
    pub backends: Vec<BackendKind>,
    /// Offered call rates (calls/s, `--rates`).
    pub rates: Vec<f64>,
    /// The hosts talk IPv6 (`--ipv6`).
    pub ipv6: bool,
    /// ringway's receive-coalescing windows (µs, `--rx-coalesce-us`; 0:
    /// off), one arm per backend and window; empty: off only.
    pub rx_coalesce_us: Vec<u64>,
}

impl VethConfig {
    /// The arms in their base order: ringway on each backend (with each
    /// coalescing window), then Kamailio.
    pub fn arms(&self) -> Vec<Arm> {
        let windows: Vec<Option<u64>> = if self.rx_coalesce_us.is_empty() {
            vec![None]
        } else {
            self.rx_coalesce_us
                .iter()
                .map(|&us| (us > 0).then_some(us))
                .collect()
        };
        let mut arms: Vec<Arm> = Vec::new();
        for &proxy in &self.sweep.proxies {
            match proxy {
                ProxyKind::Ringway => {
                    for &backend in &self.backends {
                        for &rx_coalesce_us in &windows {
                            arms.push(Arm {
                                proxy,
                                backend,
                                rx_coalesce_us,
                            });
                        }
                    }
                }
                ProxyKind::Kamailio => arms.push(Arm {
                    proxy,
                    backend: BackendKind::Mmsg,
                    rx_coalesce_us: None,
                }),
            }
        }
        let mut seen = Vec::new();
        arms.retain(|arm| {
            let new = !seen.contains(arm);
            seen.push(*arm);
            new
        });
        arms
    }

    /// The `wire` of the runs' specs.
    pub fn wire(&self) -> &'static str {
        if self.ipv6 {
            "veth-ipv6"
        } else {
            "veth"
        }
    }

    /// Everything checkable before the testbed is built (messages name
    /// the options of `ringway lab sip --netns`).
    pub fn validate(&self, tools: &Tools) -> Result<(), String> {
        if self.rates.is_empty() {
            return Err("--netns needs --rates (comma-separated calls/s)".into());
        }
        for &rate in &self.rates {
            if !(rate.is_finite() && rate > 0.0) {
                return Err(format!("--rates: {rate} is not a positive rate"));
            }
            if rate * self.sweep.duration_s < 1.0 {
                return Err(format!(
                    "--rates {rate} for --duration {} starts no call",
                    self.sweep.duration_s
                ));
            }
            if rate * self.sweep.duration_s > MAX_CALLS_PER_RUN {
                return Err(format!(
                    "--rates {rate} for --duration {} would start more than {MAX_CALLS_PER_RUN} calls per run",
                    self.sweep.duration_s
                ));
            }
        }
        if self.sweep.proxies.contains(&ProxyKind::Ringway) && self.backends.is_empty() {
            return Err("--backends is empty".into());
        }
        if let Some(&bad) = self
            .rx_coalesce_us
            .iter()
            .find(|&&us| us > MAX_RX_COALESCE_US)
        {
            return Err(format!(
                "--rx-coalesce-us {bad}: a window is 1..={MAX_RX_COALESCE_US} µs (0: off)"
            ));
        }
        if self.backends.contains(&BackendKind::Xdp) && self.sweep.workers.iter().any(|&w| w != 1) {
            return Err("--backends xdp: the proxy runs one worker on AF_XDP (--workers 1)".into());
        }
        if self.sweep.cores.len() != 1 {
            return Err("--netns takes one core count (--cores N)".into());
        }
        let planned = self.planned();
        if planned > super::sweep::MAX_RUNS {
            return Err(format!(
                "{planned} runs planned (limit {})",
                super::sweep::MAX_RUNS
            ));
        }
        // The rest as the loopback lab checks it, its rate grid spanning --rates.
        let mut sweep = self.sweep.clone();
        sweep.rate_start = self.rates.iter().copied().fold(f64::INFINITY, f64::min);
        sweep.rate_max = self.rates.iter().copied().fold(0.0, f64::max);
        sweep.rate_step = (sweep.rate_max - sweep.rate_start).max(1.0);
        sweep.validate(tools).map(|_| ())
    }

    /// Runs planned.
    pub fn planned(&self) -> usize {
        self.arms().len() * self.rates.len() * self.sweep.workers.len() * self.sweep.reps as usize
    }

    /// The spec of `arm`'s run at (workers, rate, rep): the same seed for
    /// every arm at one point.
    pub fn spec(&self, arm: Arm, workers: usize, rate: f64, rep: u32) -> RunSpec {
        let cores = self.sweep.cores[0];
        let seed = seed_for(self.sweep.seed, workers, cores, rate, rep);
        let mut spec = super::sweep::spec_for(
            &self.sweep,
            arm.proxy,
            cores,
            workers,
            "default",
            Default::default(),
            rate,
            rep,
            seed,
        );
        spec.backend = arm.backend;
        spec.wire = Some(self.wire().to_string());
        spec.rx_coalesce_us = arm.rx_coalesce_us;
        spec
    }
}

/// Rotate `arms` by `block`: every arm runs first (and last) equally often.
pub fn block_order(arms: &[Arm], block: usize) -> Vec<Arm> {
    let mut order = arms.to_vec();
    if !order.is_empty() {
        let k = block % order.len();
        order.rotate_left(k);
    }
    order
}

/// The two namespaces and their veth pair (deleted on drop, also while
/// unwinding from a panic or returning an error).
pub struct SipTestbed {
    // Declared first: the program is detached before the namespaces go.
    _gen_pass: XdpAttachment,
    /// NAPI threads of the generator's veth.
    gen_napi: Vec<u32>,
    ipv6: bool,
    topology: Topology,
}

impl SipTestbed {
    /// Build it (see the module docs). Namespaces that a killed earlier
    /// run of this prefix left behind are removed first.
    pub fn build(ipv6: bool) -> anyhow::Result<SipTestbed> {
        for gone in ringway_io::netns::cleanup_leftovers(false).unwrap_or_default() {
            log::info!("removed namespace {gone} left by a process that is gone");
        }
        let builder = Topology::builder()
            .host("gen")
            .host("proxy")
            .link("gen", "proxy");
        let builder = if ipv6 { builder.ipv6() } else { builder };
        let topology = builder
            .build()
            .context("building the veth testbed (needs root)")?;
        let gen = topology.host("gen").expect("built").clone();
        let proxy = topology.host("proxy").expect("built").clone();
        gen.run(|| ringway_io::backend::disable_tx_checksum_offload(DEV))
            .context("entering the generator's namespace")?
            .context("turning TX checksum offload off on the generator's veth")?;
        for host in [&gen, &proxy] {
            run_in(
                host,
                &[
                    "tc", "qdisc", "replace", "dev", DEV, "root", "pfifo", "limit", "10000",
                ],
            )?;
        }
        // Threaded NAPI on the proxy's veth once, here: the device keeps the
        // setting, so each run's program (the pass one, or the xdp
        // backend's, on whose veth with a bound AF_XDP socket the setting
        // cannot be written: EIO) gets its NAPI thread as it attaches.
        let pass = proxy
            .run(|| attach_xdp_pass(DEV, XdpMode::Native))
            .context("entering the proxy's namespace")?
            .context("native XDP on the proxy's veth")?;
        threaded_napi(&proxy, DEV)?;
        drop(pass);
        let before = napi_snapshot();
        let gen_pass = gen
            .run(|| attach_xdp_pass(DEV, XdpMode::Native))
            .context("entering the generator's namespace")?
            .context("native XDP on the generator's veth")?;
        let gen_napi = napi_threads_of(&gen, &before)?;
        Ok(SipTestbed {
            _gen_pass: gen_pass,
            gen_napi,
            ipv6,
            topology,
        })
    }

    /// The generator's host.
    pub fn gen(&self) -> &Host {
        self.topology.host("gen").expect("built")
    }

    /// The proxy's host.
    pub fn proxy(&self) -> &Host {
        self.topology.host("proxy").expect("built")
    }

    fn ip_of(&self, host: &Host) -> IpAddr {
        match host.addr6() {
            Some(v6) if self.ipv6 => IpAddr::V6(v6),
            _ => IpAddr::V4(host.addr()),
        }
    }

    /// The generator's address.
    pub fn gen_ip(&self) -> IpAddr {
        self.ip_of(self.gen())
    }

    /// The proxy's SIP address.
    pub fn proxy_addr(&self) -> SocketAddr {
        SocketAddr::new(self.ip_of(self.proxy()), SIP_PORT)
    }

    /// Where `spec`'s proxy listens and relays to.
    fn wire(&self, spec: &RunSpec) -> ProxyWire {
        let relay = match self.gen_ip() {
            IpAddr::V4(v4) => format!("{v4}/32"),
            IpAddr::V6(v6) => format!("{v6}/128"),
        };
        ProxyWire {
            listen: self.proxy_addr(),
            relay,
            interface: (spec.proxy == ProxyKind::Ringway && spec.backend == BackendKind::Xdp)
                .then(|| DEV.to_string()),
        }
    }

    /// Datagrams the veth pair dropped towards the proxy so far: the
    /// generator's end's TX drops and the proxy's end's RX drops.
    fn drops_to_proxy(&self) -> anyhow::Result<u64> {
        Ok(link_dropped(self.gen(), "tx")? + link_dropped(self.proxy(), "rx")?)
    }
}

/// The `dropped` counter of `dir` (`rx`/`tx`) of the veth in `host`.
fn link_dropped(host: &Host, dir: &str) -> anyhow::Result<u64> {
    let out = host
        .command("ip")
        .args(["-s", "-j", "link", "show", "dev", DEV])
        .output()
        .context("running ip -s link")?;
    anyhow::ensure!(
        out.status.success(),
        "ip -s link in {}: {}",
        host.netns,
        String::from_utf8_lossy(&out.stderr).trim()
    );
    let json: serde_json::Value =
        serde_json::from_slice(&out.stdout).context("reading ip -s -j link")?;
    json[0]["stats64"][dir]["dropped"]
        .as_u64()
        .with_context(|| format!("no {dir} dropped counter for {DEV} in {}", host.netns))
}

/// Threaded NAPI on `host`'s veth; its NAPI threads that are not in
/// `before` (taken before the XDP program that gives veth NAPI was
/// attached).
fn napi_threads_of(host: &Host, before: &NapiSnapshot) -> anyhow::Result<Vec<u32>> {
    let mut found = threaded_napi(host, DEV)?;
    found.extend(before.new_threads(&format!("napi/{DEV}-")));
    found.sort_unstable();
    found.dedup();
    Ok(found)
}

/// CPU seconds the kernel threads `pids` have run (`/proc/PID/schedstat`,
/// nanoseconds: a short run's NAPI time is a few ms, which the 10 ms ticks
/// of `stat` would round to 0); `None`: none given or one is gone.
fn cpu_s(pids: &[u32]) -> Option<f64> {
    if pids.is_empty() {
        return None;
    }
    pids.iter().try_fold(0.0, |sum, pid| {
        let text = std::fs::read_to_string(format!("/proc/{pid}/schedstat")).ok()?;
        let ns: u64 = text.split_whitespace().next()?.parse().ok()?;
        Some(sum + ns as f64 / 1e9)
    })
}

/// One run of `spec` on the testbed. `stop` (SIGINT) ends the generator
/// at once; the caller then discards the record.
pub fn run_on(
    bed: &SipTestbed,
    spec: &RunSpec,
    tools: &Tools,
    stop: &Arc<AtomicBool>,
) -> RunRecord {
    let started = Instant::now();
    let mut rec = RunRecord::empty(spec);
    let (plan, kernel) = plan_for(&spec.knobs);
    rec.kernel = kernel;
    rec.effective = plan.effective();
    rec.topology = topology::detect(&spec.proxy_cpus);
    if let Err(error) = run_inner(bed, spec, &plan, tools, stop, &mut rec) {
        rec.error = Some(format!("{error:#}"));
    }
    rec.wall_s = started.elapsed().as_secs_f64();
    rec
}

fn run_inner(
    bed: &SipTestbed,
    spec: &RunSpec,
    plan: &Plan,
    tools: &Tools,
    stop: &Arc<AtomicBool>,
    rec: &mut RunRecord,
) -> anyhow::Result<()> {
    let dir: PathBuf = tools.work_dir.join(format!("run-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let proxy_host = bed.proxy().clone();
    let before_napi = napi_snapshot();
    // Every arm but xdp (which attaches its own) gets the pass program:
    // the same veth receive path for all.
    let pass = if bed.wire(spec).interface.is_none() {
        Some(
            proxy_host
                .run(|| attach_xdp_pass(DEV, XdpMode::Native))
                .context("entering the proxy's namespace")?
                .context("native XDP on the proxy's veth")?,
        )
    } else {
        None
    };
    let (s, p, t, d, w) = (
        spec.clone(),
        plan.clone(),
        tools.clone(),
        dir.clone(),
        bed.wire(spec),
    );
    let (mut proxy, mut notes) = proxy_host
        .run(move || {
            let mut notes = Vec::new();
            start_proxy(&s, &p, &t, &d, &w, &mut notes).map(|proxy| (proxy, notes))
        })
        .context("entering the proxy's namespace")??;
    let pid = proxy.child.id();
    let measured = measure(
        bed,
        spec,
        pid,
        (&before_napi, tools.max_foreign_cpu_pct),
        stop,
        rec,
        &mut notes,
    );
    let alive = proxy.child.try_wait().is_ok_and(|status| status.is_none());
    let stopped = stop_proxy(&mut proxy);
    drop(pass);
    measured?;
    proxy_ended(spec, &proxy, alive, stopped, &mut notes)?;
    if let Some(summary) = proxy_summary(&proxy, &mut notes) {
        record_proxy_summary(spec, &summary, rec, &mut notes);
        record_xdp(spec, &summary, rec);
    }
    rec.notes.extend(notes);
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

/// The load and the counters around it.
fn measure(
    bed: &SipTestbed,
    spec: &RunSpec,
    pid: u32,
    (before_napi, max_foreign_pct): (&NapiSnapshot, f64),
    stop: &Arc<AtomicBool>,
    rec: &mut RunRecord,
    notes: &mut Vec<String>,
) -> anyhow::Result<()> {
    let proxy_host = bed.proxy().clone();
    // The xdp backend may bind its socket before its program is attached:
    // its NAPI thread appears with the program (bounded wait).
    let deadline = Instant::now() + std::time::Duration::from_secs(5);
    let proxy_napi = loop {
        let found = before_napi.new_threads(&format!("napi/{DEV}-"));
        if !found.is_empty() || Instant::now() > deadline {
            break found;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    if proxy_napi.is_empty() {
        notes.push(
            "no NAPI thread found for the proxy's veth: its receive path is not in its CPU".into(),
        );
    }
    // Each host's NAPI thread on its host's CPUs, as a NIC's interrupt on
    // the host it serves (a refusal is a note).
    notes.extend(pin_kernel_threads(&proxy_napi, &spec.proxy_cpus, "proxy"));
    notes.extend(pin_kernel_threads(
        &bed.gen_napi,
        &spec.gen_cpus,
        "generator",
    ));
    let cpus = spec.proxy_cpus.clone();
    let read = move || Counters::read(pid, &cpus);
    let loadavg = super::background::loadavg1().unwrap_or(f64::NAN);
    let before = proxy_host
        .run(read.clone())
        .context("entering the proxy's namespace")?;
    let wire_before = bed.drops_to_proxy()?;
    let napi_before = (cpu_s(&proxy_napi), cpu_s(&bed.gen_napi));
    let mut cfg = super::generator_config(spec);
    cfg.proxy = Some(bed.proxy_addr());
    cfg.bind_ip = bed.gen_ip();
    let (gen_spec, stop) = (spec.clone(), stop.clone());
    let load = bed
        .gen()
        .run(move || {
            super::pin_generator(&gen_spec)?;
            run_generator(&cfg, pid, Some(stop))
        })
        .context("entering the generator's namespace")?;
    let after = proxy_host
        .run(read)
        .context("entering the proxy's namespace")?;
    let wire_after = bed.drops_to_proxy()?;
    let napi_after = (cpu_s(&proxy_napi), cpu_s(&bed.gen_napi));
    record_load(spec, &load?, (&before, &after), rec, notes);
    rec.proxy_napi_cpu_s = napi_before.0.zip(napi_after.0).map(|(b, a)| a - b);
    rec.gen_napi_cpu_s = napi_before.1.zip(napi_after.1).map(|(b, a)| a - b);
    let napi_ns = (rec.proxy_napi_cpu_s.unwrap_or(0.0).max(0.0) * 1e9) as u64;
    record_background((&before, &after), napi_ns, loadavg, max_foreign_pct, rec);
    let wire = wire_after.saturating_sub(wire_before);
    rec.wire_drops = Some(wire);
    rec.proxy_socket_drops += wire;
    rec.pdr = super::drop_rate(rec.proxy_socket_drops, rec.total_msgs).unwrap_or(0.0);
    Ok(())
}

/// The xdp arm: the AF_XDP socket's drops join the proxy's, and a proxy
/// that fell back to a socket backend flags the run.
fn record_xdp(spec: &RunSpec, summary: &serde_json::Value, rec: &mut RunRecord) {
    if spec.proxy != ProxyKind::Ringway || spec.backend != BackendKind::Xdp {
        return;
    }
    if let Some(why) = summary["config"]["backend_fallback"].as_str() {
        rec.flags.push(format!(
            "xdp fell back to {}: {why}",
            summary["config"]["backend"]
        ));
    }
    let xsk = summary["io"]["rx_dropped"].as_u64().unwrap_or(0);
    rec.xsk_drops = Some(xsk);
    rec.proxy_socket_drops += xsk;
    rec.pdr = super::drop_rate(rec.proxy_socket_drops, rec.total_msgs).unwrap_or(0.0);
}

/// What a `--netns` experiment produced.
#[derive(Debug, Default)]
pub struct VethOutcome {
    /// Every run (taken from runs.jsonl or made now), in the order planned.
    pub records: Vec<RunRecord>,
    /// Runs skipped because runs.jsonl had them.
    pub resumed: usize,
}

/// Run (or resume from `store`) every run of `cfg` on `bed`, the arms
/// interleaved. `Ok(None)`: interrupted (`stop`), nothing half-made kept.
pub fn run_all(
    cfg: &VethConfig,
    bed: &SipTestbed,
    tools: &Tools,
    store: &mut Store,
    progress: &mut dyn SweepProgress,
    stop: &Arc<AtomicBool>,
) -> anyhow::Result<Option<VethOutcome>> {
    let arms = cfg.arms();
    let mut out = VethOutcome::default();
    let planned = cfg.planned();
    let mut block = 0;
    let started = Instant::now();
    let mut made = 0usize;
    for &workers in &cfg.sweep.workers {
        for rep in 0..cfg.sweep.reps {
            for &rate in &cfg.rates {
                for arm in block_order(&arms, block) {
                    let spec = cfg.spec(arm, workers, rate, rep);
                    if let Some(done) = store.get(&spec.key()) {
                        progress.finished(done, true);
                        out.records.push(done.clone());
                        out.resumed += 1;
                        continue;
                    }
                    if stop.load(Ordering::Relaxed) {
                        return Ok(None);
                    }
                    let done_so_far = out.records.len();
                    let eta = (made > 0).then(|| {
                        started.elapsed().as_secs_f64() / made as f64
                            * (planned - done_so_far) as f64
                    });
                    progress.starting(&spec, done_so_far, planned, eta);
                    let record = run_on(bed, &spec, tools, stop);
                    if stop.load(Ordering::Relaxed) {
                        return Ok(None);
                    }
                    made += 1;
                    progress.finished(&record, false);
                    store.add(record.clone())?;
                    out.records.push(record);
                }
                block += 1;
            }
        }
    }
    Ok(Some(out))
}

/// One arm at one rate, over its valid repetitions.
#[derive(Clone, Debug, Serialize)]
pub struct VethRow {
    /// The arm (`ringway/xdp`, ...).
    pub arm: String,
    /// Worker threads / UDP children.
    pub workers: usize,
    /// Offered rate (calls/s).
    pub rate: f64,
    /// Runs made.
    pub runs: usize,
    /// Runs left out (flagged or failed), with their first reason.
    pub left_out: Vec<String>,
    /// Mean PDR of the valid runs (`None`: no valid run).
    pub pdr: Option<f64>,
    /// Mean failed-call ratio of the valid runs.
    pub failed_ratio: Option<f64>,
    /// Achieved calls/s (mean).
    pub achieved_cps: Option<f64>,
    /// Proxy CPU per successful call, µs: its processes and its veth's
    /// NAPI thread (`None`: no valid run or the NAPI thread unreadable).
    pub proxy_us_per_call: Option<f64>,
    /// The same, the proxy's processes alone.
    pub proxy_process_us_per_call: Option<f64>,
    /// Generator CPU per successful call, µs (threads + NAPI thread).
    pub gen_us_per_call: Option<f64>,
    /// Generator CPU as a share of one CPU over the call-start phase (%).
    pub gen_cpu_pct: Option<f64>,
    /// Mean T_sip over all messages, µs (`None`: Kamailio, not measured).
    pub t_sip_us: Option<f64>,
    /// Mean K_rcv over all messages, µs (`None`: not stamped).
    pub k_rcv_us: Option<f64>,
    /// Datagrams the proxy's workers handled per wake-up of their receive
    /// loop (mean of the runs; `None`: Kamailio, or a summary without it).
    pub datagrams_per_wakeup: Option<f64>,
}

/// Capacity of one arm: the highest rate up to which every rate's valid
/// runs kept PDR and failed calls under the threshold.
#[derive(Clone, Debug, Serialize)]
pub struct VethCapacity {
    /// The arm.
    pub arm: String,
    /// Workers.
    pub workers: usize,
    /// Calls/s (`None`: the lowest rate already crossed or had no valid run).
    pub capacity: Option<f64>,
    /// The arm carried the highest rate tried: the capacity is at least this.
    pub censored: bool,
    /// Proxy CPU per call (µs, with NAPI) at the capacity rate.
    pub proxy_us_per_call: Option<f64>,
}

/// A ratio of two arms (`None`: one of them has no data).
#[derive(Clone, Debug, Serialize)]
pub struct VethRatio {
    /// `ringway/xdp / kamailio`, ...
    pub what: String,
    /// Workers.
    pub workers: usize,
    /// Rate (calls/s) for a CPU ratio; `None` for the capacity ratio.
    pub rate: Option<f64>,
    /// Capacity ratio or CPU-per-call ratio.
    pub ratio: Option<f64>,
    /// For capacities: one side's capacity is a lower bound.
    pub censored: bool,
}

fn mean_of(xs: impl Iterator<Item = Option<f64>>) -> Option<f64> {
    let v: Option<Vec<f64>> = xs.collect();
    v.filter(|v| !v.is_empty()).map(|v| mean_ci(&v).mean)
}

/// The rows of `records` (one per arm, workers and rate).
pub fn rows(cfg: &VethConfig, records: &[RunRecord]) -> Vec<VethRow> {
    let mut out = Vec::new();
    for &workers in &cfg.sweep.workers {
        for arm in cfg.arms() {
            for &rate in &cfg.rates {
                let runs: Vec<&RunRecord> = records
                    .iter()
                    .filter(|r| {
                        r.spec.workers == workers && r.spec.rate == rate && Arm::of(&r.spec) == arm
                    })
                    .collect();
                let valid: Vec<&RunRecord> = runs.iter().copied().filter(|r| r.valid()).collect();
                let per_call = |cpu: f64, r: &RunRecord| {
                    (r.succeeded > 0).then(|| 1e6 * cpu / r.succeeded as f64)
                };
                let left_out = runs
                    .iter()
                    .filter(|r| !r.valid())
                    .map(|r| {
                        r.error
                            .clone()
                            .or_else(|| r.flags.first().cloned())
                            .unwrap_or_default()
                    })
                    .collect();
                let ringway = arm.proxy == ProxyKind::Ringway;
                out.push(VethRow {
                    arm: arm.name(),
                    workers,
                    rate,
                    runs: runs.len(),
                    left_out,
                    pdr: mean_of(valid.iter().map(|&r| Some(r.pdr))),
                    failed_ratio: mean_of(valid.iter().map(|&r| Some(r.failed_ratio))),
                    achieved_cps: mean_of(valid.iter().map(|&r| Some(r.achieved_cps))),
                    proxy_us_per_call: mean_of(valid.iter().map(|&r| {
                        r.proxy_napi_cpu_s
                            .and_then(|napi| per_call(r.proxy_cpu_s + napi, r))
                    })),
                    proxy_process_us_per_call: mean_of(
                        valid.iter().map(|&r| per_call(r.proxy_cpu_s, r)),
                    ),
                    gen_us_per_call: mean_of(valid.iter().map(|&r| {
                        r.gen_napi_cpu_s
                            .and_then(|napi| per_call(r.gen_cpu_s + napi, r))
                    })),
                    gen_cpu_pct: mean_of(valid.iter().map(|&r| {
                        let napi = r.gen_napi_cpu_s?;
                        Some(100.0 * (r.gen_cpu_s + napi) / r.spec.duration_s)
                    })),
                    t_sip_us: if ringway {
                        mean_of(valid.iter().map(|&r| {
                            r.all
                                .as_ref()
                                .filter(|a| a.t_sip.count > 0)
                                .map(|a| a.t_sip.mean_us)
                        }))
                    } else {
                        None
                    },
                    k_rcv_us: if ringway {
                        mean_of(valid.iter().map(|&r| {
                            r.all
                                .as_ref()
                                .filter(|a| a.k_rcv.count > 0)
                                .map(|a| a.k_rcv.mean_us)
                        }))
                    } else {
                        None
                    },
                    datagrams_per_wakeup: mean_of(valid.iter().map(|&r| {
                        let wakeups = r.proxy_wakeups.filter(|&w| w > 0)?;
                        Some(r.proxy_msgs_in? as f64 / wakeups as f64)
                    })),
                });
            }
        }
    }
    out
}

/// Each arm's capacity from its rows (rates ascending).
pub fn capacities(cfg: &VethConfig, rows: &[VethRow], threshold: f64) -> Vec<VethCapacity> {
    let mut out = Vec::new();
    let mut rates = cfg.rates.clone();
    rates.sort_by(f64::total_cmp);
    for &workers in &cfg.sweep.workers {
        for arm in cfg.arms() {
            let mut capacity = None;
            let mut censored = false;
            for (i, &rate) in rates.iter().enumerate() {
                let name = arm.name();
                let Some(row) = rows
                    .iter()
                    .find(|r| r.arm == name && r.workers == workers && r.rate == rate)
                else {
                    break;
                };
                match (row.pdr, row.failed_ratio) {
                    (Some(pdr), Some(failed)) if pdr < threshold && failed < threshold => {
                        capacity = Some((rate, row.proxy_us_per_call));
                        censored = i + 1 == rates.len();
                    }
                    _ => break,
                }
            }
            out.push(VethCapacity {
                arm: arm.name(),
                workers,
                capacity: capacity.map(|c| c.0),
                censored,
                proxy_us_per_call: capacity.and_then(|c| c.1),
            });
        }
    }
    out
}

/// xdp/Kamailio, xdp/mmsg and mmsg/Kamailio, and each arm with receive
/// coalescing against Kamailio and against its backend without:
/// capacities, and CPU per call at every rate both carried.
pub fn ratios(rows: &[VethRow], caps: &[VethCapacity]) -> Vec<VethRatio> {
    let mut pairs: Vec<(&str, &str)> = vec![
        ("ringway/xdp", "kamailio"),
        ("ringway/xdp", "ringway/mmsg"),
        ("ringway/mmsg", "kamailio"),
    ];
    for cap in caps {
        if let Some((base, _)) = cap.arm.split_once('+') {
            for pair in [(cap.arm.as_str(), "kamailio"), (cap.arm.as_str(), base)] {
                if !pairs.contains(&pair) {
                    pairs.push(pair);
                }
            }
        }
    }
    let mut out = Vec::new();
    for (a, b) in pairs {
        for ca in caps.iter().filter(|c| c.arm == a) {
            let Some(cb) = caps.iter().find(|c| c.arm == b && c.workers == ca.workers) else {
                continue;
            };
            out.push(VethRatio {
                what: format!("{a} / {b} capacity"),
                workers: ca.workers,
                rate: None,
                ratio: ca.capacity.zip(cb.capacity).map(|(x, y)| x / y),
                censored: ca.censored || cb.censored,
            });
            for ra in rows
                .iter()
                .filter(|r| r.arm == a && r.workers == ca.workers)
            {
                let rb = rows
                    .iter()
                    .find(|r| r.arm == b && r.workers == ra.workers && r.rate == ra.rate);
                let carried = |r: &VethRow| r.pdr.zip(r.failed_ratio).is_some();
                let ratio = rb.filter(|rb| carried(ra) && carried(rb)).and_then(|rb| {
                    ra.proxy_us_per_call
                        .zip(rb.proxy_us_per_call)
                        .map(|(x, y)| x / y)
                });
                out.push(VethRatio {
                    what: format!("{a} / {b} CPU per call"),
                    workers: ra.workers,
                    rate: Some(ra.rate),
                    ratio,
                    censored: false,
                });
            }
        }
    }
    out
}

fn opt(v: Option<f64>, digits: usize) -> String {
    v.map_or("n/a".into(), |v| format!("{v:.digits$}"))
}

/// The report as Markdown.
pub fn markdown(
    rows: &[VethRow],
    caps: &[VethCapacity],
    ratios: &[VethRatio],
    threshold: f64,
) -> String {
    let mut s = String::new();
    s.push_str(
        "| arm | workers | rate | runs | left out | PDR % | failed % | achieved cps | proxy µs/call | proxy process µs/call | gen µs/call | gen CPU % | T_sip µs | K_rcv µs | datagrams/wake-up |\n\
         |---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for r in rows {
        s.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
            r.arm,
            r.workers,
            r.rate,
            r.runs,
            r.left_out.len(),
            opt(r.pdr.map(|p| 100.0 * p), 3),
            opt(r.failed_ratio.map(|p| 100.0 * p), 3),
            opt(r.achieved_cps, 0),
            opt(r.proxy_us_per_call, 1),
            opt(r.proxy_process_us_per_call, 1),
            opt(r.gen_us_per_call, 1),
            opt(r.gen_cpu_pct, 0),
            opt(r.t_sip_us, 2),
            opt(r.k_rcv_us, 1),
            opt(r.datagrams_per_wakeup, 2),
        ));
    }
    s.push_str(&format!(
        "\nCapacity (highest rate with PDR and failed calls < {} %; ≥: the highest rate tried):\n\n| arm | workers | calls/s | proxy µs/call there |\n|---|---|---|---|\n",
        100.0 * threshold
    ));
    for c in caps {
        let cap = match c.capacity {
            Some(v) if c.censored => format!("≥ {v}"),
            Some(v) => format!("{v}"),
            None => "n/a".into(),
        };
        s.push_str(&format!(
            "| {} | {} | {cap} | {} |\n",
            c.arm,
            c.workers,
            opt(c.proxy_us_per_call, 1)
        ));
    }
    s.push_str("\nRatios (same run):\n\n");
    for r in ratios {
        let at = r
            .rate
            .map_or(String::new(), |rate| format!(" at {rate} calls/s"));
        let bound = if r.censored {
            " (a capacity is a lower bound)"
        } else {
            ""
        };
        s.push_str(&format!(
            "- {}{at}, {} worker(s): {}{bound}\n",
            r.what,
            r.workers,
            opt(r.ratio, 2)
        ));
    }
    for r in rows.iter().filter(|r| !r.left_out.is_empty()) {
        s.push_str(&format!(
            "\n{} at {} calls/s left out: {}",
            r.arm,
            r.rate,
            r.left_out.join("; ")
        ));
    }
    s.push('\n');
    s
}

/// Write `veth.md` and `veth.json` into `out`; returns their paths.
pub fn write_report(
    out: &Path,
    cfg: &VethConfig,
    outcome: &VethOutcome,
    command: &str,
) -> anyhow::Result<(String, Vec<PathBuf>)> {
    let rows = rows(cfg, &outcome.records);
    let caps = capacities(cfg, &rows, cfg.sweep.threshold);
    let ratios = ratios(&rows, &caps);
    let text = markdown(&rows, &caps, &ratios, cfg.sweep.threshold);
    let md = out.join("veth.md");
    std::fs::write(
        &md,
        format!("# ringway lab sip --netns\n\n`{command}`\n\n{text}"),
    )?;
    let json = out.join("veth.json");
    std::fs::write(
        &json,
        serde_json::to_vec_pretty(&serde_json::json!({
            "schema": "ringway.lab-sip-veth/1",
            "command": command,
            "wire": cfg.wire(),
            "arms": cfg.arms(),
            "rates": cfg.rates,
            "threshold": cfg.sweep.threshold,
            "rows": rows,
            "capacities": caps,
            "ratios": ratios,
        }))?,
    )?;
    Ok((text, vec![md, json]))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(arm: &str, rate: f64, pdr: Option<f64>, cpu: Option<f64>) -> VethRow {
        VethRow {
            arm: arm.into(),
            workers: 1,
            rate,
            runs: 1,
            left_out: Vec::new(),
            pdr,
            failed_ratio: pdr.map(|_| 0.0),
            achieved_cps: Some(rate),
            proxy_us_per_call: cpu,
            proxy_process_us_per_call: cpu,
            gen_us_per_call: None,
            gen_cpu_pct: None,
            t_sip_us: None,
            k_rcv_us: None,
            datagrams_per_wakeup: None,
        }
    }

    fn cfg(rates: &[f64]) -> VethConfig {
        let mut sweep = super::super::sweep::tests_support::test_cfg();
        sweep.proxies = vec![ProxyKind::Ringway, ProxyKind::Kamailio];
        sweep.workers = vec![1];
        VethConfig {
            sweep,
            backends: vec![BackendKind::Mmsg, BackendKind::Xdp],
            rates: rates.to_vec(),
            ipv6: false,
            rx_coalesce_us: Vec::new(),
        }
    }

    #[test]
    fn arms_rotate_so_that_none_is_always_first() {
        let c = cfg(&[1000.0]);
        let arms = c.arms();
        let names: Vec<String> = arms.iter().map(|a| a.name()).collect();
        assert_eq!(names, ["ringway/mmsg", "ringway/xdp", "kamailio"]);
        let firsts: Vec<String> = (0..3).map(|b| block_order(&arms, b)[0].name()).collect();
        assert_eq!(firsts, ["ringway/mmsg", "ringway/xdp", "kamailio"]);
    }

    /// `--rx-coalesce-us 0,200`: every ringway backend runs with and
    /// without the window, as arms of their own (the proxy is told, the
    /// run keys differ); each run's datagrams per wake-up lands in its own
    /// arm's row; the coalesced arm is compared with Kamailio and with its
    /// backend without coalescing.
    #[test]
    fn coalescing_windows_are_arms_of_their_own() {
        let mut c = cfg(&[2000.0]);
        c.backends = vec![BackendKind::Xdp];
        c.rx_coalesce_us = vec![0, 200];
        let arms = c.arms();
        let names: Vec<String> = arms.iter().map(|a| a.name()).collect();
        assert_eq!(names, ["ringway/xdp", "ringway/xdp+rx200us", "kamailio"]);
        assert_eq!(c.planned(), 3 * c.sweep.reps as usize);
        let specs: Vec<RunSpec> = arms.iter().map(|&a| c.spec(a, 1, 2000.0, 0)).collect();
        assert_eq!(specs[0].rx_coalesce_us, None);
        assert_eq!(specs[1].rx_coalesce_us, Some(200));
        assert_ne!(specs[0].key(), specs[1].key());
        assert!(
            !specs[0].key().contains("rx_coalesce"),
            "keys of runs without it stay as they were"
        );
        assert_eq!(specs[1].config_label(), "ringway/xdp+rx200us");
        let records: Vec<RunRecord> = specs
            .iter()
            .zip([(12_000, 12_000), (12_000, 3_000), (0, 0)])
            .map(|(spec, (msgs, wakeups))| {
                let mut r = RunRecord::empty(spec);
                r.succeeded = 2000;
                r.proxy_cpu_s = 0.1;
                r.proxy_napi_cpu_s = Some(0.02);
                if spec.proxy == ProxyKind::Ringway {
                    r.proxy_msgs_in = Some(msgs);
                    r.proxy_wakeups = Some(wakeups);
                }
                r
            })
            .collect();
        let rows = rows(&c, &records);
        let per_wakeup = |arm: &str| {
            rows.iter()
                .find(|r| r.arm == arm)
                .unwrap()
                .datagrams_per_wakeup
        };
        assert_eq!(per_wakeup("ringway/xdp"), Some(1.0));
        assert_eq!(per_wakeup("ringway/xdp+rx200us"), Some(4.0));
        assert_eq!(per_wakeup("kamailio"), None, "n/a, not 0");
        let caps = capacities(&c, &rows, 0.01);
        let whats: Vec<String> = ratios(&rows, &caps)
            .into_iter()
            .filter(|r| r.rate.is_some())
            .map(|r| r.what)
            .collect();
        assert!(
            whats.contains(&"ringway/xdp+rx200us / kamailio CPU per call".to_string()),
            "{whats:?}"
        );
        assert!(
            whats.contains(&"ringway/xdp+rx200us / ringway/xdp CPU per call".to_string()),
            "{whats:?}"
        );
        let md = markdown(&rows, &caps, &ratios(&rows, &caps), 0.01);
        assert!(md.contains("datagrams/wake-up"), "{md}");
    }

    #[test]
    fn capacity_stops_at_the_first_crossing_and_says_when_it_is_a_lower_bound() {
        let c = cfg(&[2000.0, 4000.0, 6000.0]);
        let rows = vec![
            row("ringway/mmsg", 2000.0, Some(0.0), Some(40.0)),
            row("ringway/mmsg", 4000.0, Some(0.02), Some(41.0)),
            // Below the threshold again above a crossing: not the capacity.
            row("ringway/mmsg", 6000.0, Some(0.0), Some(42.0)),
            row("ringway/xdp", 2000.0, Some(0.0), Some(10.0)),
            row("ringway/xdp", 4000.0, Some(0.0), Some(11.0)),
            row("ringway/xdp", 6000.0, Some(0.005), Some(12.0)),
            row("kamailio", 2000.0, Some(0.0), Some(200.0)),
            row("kamailio", 4000.0, None, None),
            row("kamailio", 6000.0, Some(0.5), Some(300.0)),
        ];
        let caps = capacities(&c, &rows, 0.01);
        let cap = |arm: &str| caps.iter().find(|x| x.arm == arm).unwrap().clone();
        assert_eq!(cap("ringway/mmsg").capacity, Some(2000.0));
        assert!(!cap("ringway/mmsg").censored);
        assert_eq!(cap("ringway/xdp").capacity, Some(6000.0));
        assert!(cap("ringway/xdp").censored);
        assert_eq!(cap("ringway/xdp").proxy_us_per_call, Some(12.0));
        assert_eq!(cap("kamailio").capacity, Some(2000.0));
        let r = ratios(&rows, &caps);
        let get = |what: &str, rate: Option<f64>| {
            r.iter()
                .find(|x| x.what == what && x.rate == rate)
                .unwrap()
                .clone()
        };
        let xk = get("ringway/xdp / kamailio capacity", None);
        assert_eq!(xk.ratio, Some(3.0));
        assert!(xk.censored);
        assert_eq!(
            get("ringway/xdp / kamailio CPU per call", Some(2000.0)).ratio,
            Some(0.05)
        );
        // Kamailio has no valid run at 4000: n/a, never 0.
        assert_eq!(
            get("ringway/xdp / kamailio CPU per call", Some(4000.0)).ratio,
            None
        );
        assert_eq!(
            get("ringway/xdp / ringway/mmsg CPU per call", Some(4000.0)).ratio,
            Some(11.0 / 41.0)
        );
        let md = markdown(&rows, &caps, &r, 0.01);
        assert!(md.contains("| ringway/xdp | 1 | ≥ 6000 | 12.0 |"), "{md}");
        assert!(md.contains("| kamailio | 1 | 4000 | 1 | 0 | n/a |"), "{md}");
    }
}
