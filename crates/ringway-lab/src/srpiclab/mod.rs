//! `ringway lab srpic`: SRPIC in the SFU's receive path, on versus off.
//!
//! Topology (all on loopback): a sender (`ringway sfu client`) sends RTP
//! through the impairment relay ([`crate::impair::relay`], seeded
//! reordering, packets released in bursts to emulate interrupt coalescing)
//! to the SFU (`ringway sfu serve --backend mmsg`, with or without
//! `--srpic`); subscribers (`ringway sfu client`, subscribed to everything)
//! receive the copies directly. We read reordering as the subscribers see
//! it (packets of the sender's SSRC that arrive below the highest sequence
//! number seen: RFC 4737 reordered singletons), the SFU's per-packet
//! processing delay (app receive → last copy handed to the kernel), the
//! sorter's counters, and the sender's echo RTT.

use crate::impair::relay::{Relay, RelayConfig};
use crate::impair::ImpairConfig;
use crate::stats::{mean_ci, MeanCi};
use anyhow::{bail, Context};
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Experiment settings.
#[derive(Clone, Debug)]
pub struct SrpicLabConfig {
    /// The `ringway` binary.
    pub exe: PathBuf,
    /// Directory for the JSON reports of each run.
    pub dir: PathBuf,
    /// Seconds the sender sends.
    pub duration_s: f64,
    /// Sender packet interval per media type (ms); 3 types.
    pub interval_ms: f64,
    /// Number of subscribers.
    pub subscribers: usize,
    /// Relay: probability of holding a packet back.
    pub reorder: f64,
    /// Relay: packets that overtake a held one.
    pub reorder_gap: u32,
    /// Relay: burst period (µs) = emulated interrupt-coalescing interval.
    pub burst_us: f64,
    /// SFU receive batch (recvmmsg).
    pub batch: usize,
    /// SRPIC block size.
    pub block: usize,
    /// Repetitions per mode.
    pub reps: usize,
    /// Relay seed of the first repetition (+ rep index).
    pub seed: u64,
}

/// What one run measured.
#[derive(Clone, Debug, serde::Serialize)]
pub struct RunResult {
    /// SRPIC on in the SFU.
    pub srpic: bool,
    /// Repetition index.
    pub rep: usize,
    /// Media packets sent.
    pub sent: u64,
    /// Packets the relay held back.
    pub relay_reordered: u64,
    /// Sender's packets received by subscribers (sum).
    pub sub_packets: u64,
    /// Of those lost.
    pub sub_lost: u64,
    /// Of those reordered (arrived below the highest sequence number seen).
    pub sub_reordered: u64,
    /// sub_reordered / sub_packets.
    pub sub_reordered_ratio: f64,
    /// SFU processing delay p50 / p99 (µs).
    pub sfu_delay_p50_us: f64,
    /// See `sfu_delay_p50_us`.
    pub sfu_delay_p99_us: f64,
    /// Mean datagrams per receive syscall at the SFU.
    pub sfu_mean_batch: f64,
    /// Sorter: packets put on AfterPacketList / PrevPacketList (`None`:
    /// the SFU ran no sorter and reported none).
    pub sorter_to_after: Option<u64>,
    /// See `sorter_to_after`.
    pub sorter_to_prev: Option<u64>,
    /// Sender's echo RTT p50 / p99 (µs), through the relay.
    pub rtt_p50_us: f64,
    /// See `rtt_p50_us`.
    pub rtt_p99_us: f64,
}

/// Kills (by PID, through `Child::kill`) and reaps a child on drop.
struct Proc(Child, &'static str);
impl Drop for Proc {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
        }
        let _ = self.0.wait();
    }
}

impl Proc {
    /// Wait up to `limit` for the child to exit by itself; kill it after that.
    fn wait_bounded(&mut self, limit: Duration) -> anyhow::Result<()> {
        let t = Instant::now();
        while self.0.try_wait()?.is_none() {
            if t.elapsed() > limit {
                let _ = self.0.kill();
                let _ = self.0.wait();
                bail!("{} did not finish within {:?}; killed", self.1, limit);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(())
    }
}

fn read_json(p: &Path) -> anyhow::Result<serde_json::Value> {
    let b = std::fs::read(p).with_context(|| format!("reading {}", p.display()))?;
    serde_json::from_slice(&b).with_context(|| format!("parsing {}", p.display()))
}

fn f(v: &serde_json::Value, path: &[&str]) -> f64 {
    let mut x = v;
    for k in path {
        x = &x[*k];
    }
    x.as_f64().unwrap_or(0.0)
}

/// One run with SRPIC `on` or off.
pub fn run_once(c: &SrpicLabConfig, on: bool, rep: usize) -> anyhow::Result<RunResult> {
    let tag = format!("{}_{rep}", if on { "on" } else { "off" });
    let t = c.duration_s;
    let sfu_json = c.dir.join(format!("sfu_{tag}.json"));
    let mut sfu_cmd = Command::new(&c.exe);
    sfu_cmd.args([
        "sfu",
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--backend",
        "mmsg",
    ]);
    sfu_cmd
        .args(["--batch", &c.batch.to_string(), "--stats-interval", "0"])
        .args(["--duration", &format!("{}", t + 4.0), "--json"])
        .arg(&sfu_json);
    if on {
        sfu_cmd.args(["--srpic", "--srpic-block", &c.block.to_string()]);
    }
    let mut sfu = Proc(
        sfu_cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .context("starting ringway sfu serve")?,
        "sfu serve",
    );
    // The SFU prints "ringway sfu: listening on ADDR (...)" once bound.
    let out = sfu.0.stdout.take().expect("piped");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let sfu_addr: SocketAddr = loop {
        let line = rx
            .recv_timeout(Duration::from_secs(10))
            .context("sfu serve did not report its address")?;
        if let Some(rest) = line.split("listening on ").nth(1) {
            break rest
                .split_whitespace()
                .next()
                .unwrap_or("")
                .parse()
                .context("sfu address")?;
        }
    };
    // Relay in this process.
    let relay = Relay::bind(RelayConfig {
        listen: "127.0.0.1:0".parse().expect("literal"),
        to: sfu_addr,
        forward: ImpairConfig {
            reorder: c.reorder,
            reorder_gap: c.reorder_gap,
            seed: c.seed + rep as u64,
            burst_ns: (c.burst_us * 1000.0) as u64,
            hold_timeout_ns: 50_000_000,
            ..Default::default()
        },
        reverse: None,
        duration: Duration::from_secs_f64(t + 3.0),
    })?;
    let relay_addr = relay.local_addr()?;
    let stop = Arc::new(AtomicBool::new(false));
    let relay_thread = {
        let stop = stop.clone();
        std::thread::spawn(move || relay.run(stop))
    };
    // Subscribers: they must send something (a 20 pps audio stream) to keep
    // their client running; only the sender's SSRC is counted.
    let mut subs = Vec::new();
    for k in 0..c.subscribers {
        let j = c.dir.join(format!("sub_{tag}_{k}.json"));
        let p = Command::new(&c.exe)
            .args(["sfu", "client", "--server", &sfu_addr.to_string()])
            .args(["--subscribe", "all", "--types", "asq", "--sizes", "40"])
            .args(["--interval-ms", "50", "--stats-interval", "0"])
            .args(["--duration", &format!("{}", t + 1.5), "--json"])
            .arg(&j)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("starting subscriber")?;
        subs.push((Proc(p, "subscriber"), j));
    }
    std::thread::sleep(Duration::from_millis(700));
    let snd_json = c.dir.join(format!("snd_{tag}.json"));
    let mut snd = Proc(
        Command::new(&c.exe)
            .args(["sfu", "client", "--server", &relay_addr.to_string()])
            .args([
                "--streams",
                "1",
                "--subscribe",
                "none",
                "--stats-interval",
                "0",
            ])
            .args(["--interval-ms", &c.interval_ms.to_string()])
            .args(["--duration", &t.to_string(), "--json"])
            .arg(&snd_json)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("starting sender")?,
        "sender",
    );
    let limit = Duration::from_secs_f64(t + 15.0);
    snd.wait_bounded(limit)?;
    for (p, _) in subs.iter_mut() {
        p.wait_bounded(limit)?;
    }
    stop.store(true, Ordering::Relaxed);
    let relay_report = relay_thread
        .join()
        .map_err(|_| anyhow::anyhow!("relay thread panicked"))??;
    sfu.wait_bounded(limit)?;

    let s = read_json(&snd_json)?;
    let ssid = s["ssids"][0].as_u64().context("sender SSID")?;
    let (mut pk, mut lost, mut re) = (0u64, 0u64, 0u64);
    for (_, j) in &subs {
        let v = read_json(j)?;
        for st in v["received"].as_array().into_iter().flatten() {
            if st["ssrc"].as_u64() == Some(ssid) {
                pk += st["packets"].as_u64().unwrap_or(0);
                lost += st["lost"].as_u64().unwrap_or(0);
                re += st["reordered"].as_u64().unwrap_or(0);
            }
        }
    }
    let sv = read_json(&sfu_json)?;
    let syscalls = f(&sv, &["io", "rx_syscalls"]);
    Ok(RunResult {
        srpic: on,
        rep,
        sent: s["tx_packets"].as_u64().unwrap_or(0),
        relay_reordered: relay_report.forward.reordered,
        sub_packets: pk,
        sub_lost: lost,
        sub_reordered: re,
        sub_reordered_ratio: if pk > 0 { re as f64 / pk as f64 } else { 0.0 },
        sfu_delay_p50_us: f(&sv, &["delay", "p50_us"]),
        sfu_delay_p99_us: f(&sv, &["delay", "p99_us"]),
        sfu_mean_batch: if syscalls > 0.0 {
            f(&sv, &["io", "rx_packets"]) / syscalls
        } else {
            0.0
        },
        sorter_to_after: sv["srpic"]["to_after"].as_u64(),
        sorter_to_prev: sv["srpic"]["to_prev"].as_u64(),
        rtt_p50_us: f(&s, &["rtt", "p50_us"]),
        rtt_p99_us: f(&s, &["rtt", "p99_us"]),
    })
}

/// Mean ± 95% CI of each measure, per mode.
#[derive(Clone, Debug, serde::Serialize)]
pub struct ModeSummary {
    /// SRPIC on.
    pub srpic: bool,
    /// Runs.
    pub runs: usize,
    /// Subscriber-side reordered ratio.
    pub reordered_ratio: MeanCi,
    /// Subscriber-side loss ratio.
    pub lost_ratio: MeanCi,
    /// SFU processing delay p50 (µs).
    pub delay_p50_us: MeanCi,
    /// SFU processing delay p99 (µs).
    pub delay_p99_us: MeanCi,
    /// Sender RTT p50 (µs).
    pub rtt_p50_us: MeanCi,
    /// Sender RTT p99 (µs).
    pub rtt_p99_us: MeanCi,
    /// Datagrams per receive syscall at the SFU.
    pub mean_batch: MeanCi,
}

/// Summaries of `results` for off and on.
pub fn summarize(results: &[RunResult]) -> Vec<ModeSummary> {
    [false, true]
        .iter()
        .filter_map(|&on| {
            let r: Vec<&RunResult> = results.iter().filter(|x| x.srpic == on).collect();
            if r.is_empty() {
                return None;
            }
            let m = |g: &dyn Fn(&RunResult) -> f64| {
                mean_ci(&r.iter().map(|x| g(x)).collect::<Vec<_>>())
            };
            Some(ModeSummary {
                srpic: on,
                runs: r.len(),
                reordered_ratio: m(&|x| x.sub_reordered_ratio),
                lost_ratio: m(&|x| {
                    let n = x.sub_packets + x.sub_lost;
                    if n == 0 {
                        0.0
                    } else {
                        x.sub_lost as f64 / n as f64
                    }
                }),
                delay_p50_us: m(&|x| x.sfu_delay_p50_us),
                delay_p99_us: m(&|x| x.sfu_delay_p99_us),
                rtt_p50_us: m(&|x| x.rtt_p50_us),
                rtt_p99_us: m(&|x| x.rtt_p99_us),
                mean_batch: m(&|x| x.sfu_mean_batch),
            })
        })
        .collect()
}

/// Run every repetition, alternating off and on so drift hits both alike.
pub fn run_all(
    c: &SrpicLabConfig,
    mut progress: impl FnMut(&RunResult),
) -> anyhow::Result<Vec<RunResult>> {
    std::fs::create_dir_all(&c.dir)?;
    let mut v = Vec::new();
    for rep in 0..c.reps.max(1) {
        for on in [false, true] {
            let r = run_once(c, on, rep)?;
            progress(&r);
            v.push(r);
        }
    }
    Ok(v)
}
