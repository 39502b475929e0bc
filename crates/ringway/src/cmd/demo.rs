//! `ringway demo`: a short tour on loopback that needs no system packages.
//!
//! Every part runs this same binary as a child process (the same commands a
//! user would type), bounded in time, and is killed by PID if it overstays.

use anyhow::{bail, Context};
use std::net::{Ipv4Addr, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Arguments of `ringway demo`.
#[derive(clap::Args, Debug)]
pub(crate) struct DemoArgs {
    /// Seconds of traffic per demo part.
    #[arg(long, default_value_t = 3.0)]
    pub seconds: f64,
    /// Skip `ringway doctor` at the start.
    #[arg(long)]
    pub no_doctor: bool,
}

/// A child process that is killed (by PID) and reaped when dropped.
struct Guard(Child);

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn exe() -> anyhow::Result<PathBuf> {
    std::env::current_exe().context("cannot find the ringway binary")
}

fn free_udp_port() -> anyhow::Result<u16> {
    let socket = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0))?;
    Ok(socket.local_addr()?.port())
}

fn spawn(args: &[String], quiet: bool) -> anyhow::Result<Guard> {
    let mut cmd = Command::new(exe()?);
    cmd.args(args).stdin(Stdio::null());
    if quiet {
        cmd.stdout(Stdio::null());
    }
    let child = cmd
        .spawn()
        .with_context(|| format!("starting ringway {}", args.join(" ")))?;
    Ok(Guard(child))
}

/// Wait for the child to exit within `limit`; kill it otherwise.
fn finish(mut g: Guard, limit: Duration, what: &str) -> anyhow::Result<()> {
    let start = Instant::now();
    loop {
        if let Some(status) = g.0.try_wait()? {
            if !status.success() {
                bail!("{what} exited with {status}");
            }
            return Ok(());
        }
        if start.elapsed() > limit {
            bail!("{what} did not finish within {limit:?}; killed");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn run_to_end(args: &[String], limit: Duration) -> anyhow::Result<()> {
    let what = format!("ringway {}", args.join(" "));
    finish(spawn(args, false)?, limit, &what)
}

fn s(v: &[&str]) -> Vec<String> {
    v.iter().map(|x| x.to_string()).collect()
}

fn header(t: &str) {
    println!("\n=== {t} ===");
}

fn read_json(p: &Path) -> anyhow::Result<serde_json::Value> {
    let text = std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?;
    serde_json::from_str(&text).with_context(|| format!("parsing {}", p.display()))
}

fn sfu_part(secs: f64, dir: &Path) -> anyhow::Result<()> {
    header(
        "pktswitch SFU: 3 clients × 3 streams (ASQ/VSQ/VHQ), subscribe all, echo on, mmsg backend",
    );
    let port = free_udp_port()?;
    let addr = format!("127.0.0.1:{port}");
    let json = dir.join("sfu.json");
    let serve = spawn(
        &s(&[
            "sfu",
            "serve",
            "--listen",
            &addr,
            "--backend",
            "mmsg",
            "--stats-interval",
            "0",
            "--duration",
        ])
        .into_iter()
        .chain([
            format!("{}", secs + 3.0),
            "--json".into(),
            json.display().to_string(),
        ])
        .collect::<Vec<_>>(),
        true,
    )?;
    std::thread::sleep(Duration::from_millis(300));
    let mut clients = Vec::new();
    for i in 0..3 {
        let client_json = dir.join(format!("client{i}.json"));
        let mut args = s(&[
            "sfu",
            "client",
            "--server",
            &addr,
            "--stats-interval",
            "0",
            "--duration",
        ]);
        args.push(format!("{secs}"));
        args.extend(["--json".to_string(), client_json.display().to_string()]);
        clients.push((spawn(&args, true)?, client_json));
    }
    let limit = Duration::from_secs_f64(secs + 10.0);
    for (i, (g, client_json)) in clients.into_iter().enumerate() {
        finish(g, limit, &format!("sfu client {i}"))?;
        let report = read_json(&client_json)?;
        println!("client {i}: {}", summarize(&report));
    }
    finish(serve, limit, "sfu serve")?;
    let report = read_json(&json)?;
    println!("SFU: {}", summarize(&report));
    Ok(())
}

fn sip_part(secs: f64, dir: &Path) -> anyhow::Result<()> {
    header("SIP: stateless proxy (2 workers, mmsg) + ringway sip load at 200 calls/s (Poisson), all on 127.0.0.1");
    let port = free_udp_port()?;
    let addr = format!("127.0.0.1:{port}");
    let summary = dir.join("proxy.json");
    let mut proxy_args = s(&[
        "sip",
        "proxy",
        "--listen",
        &addr,
        "--mode",
        "stateless",
        "--workers",
        "2",
        // The load generator's UAS is on loopback: relayed to explicitly.
        "--relay",
        "127.0.0.0/8",
        "--quiet",
    ]);
    proxy_args.extend([
        "--duration".into(),
        format!("{}", secs + 3.0),
        "--summary".into(),
        summary.display().to_string(),
    ]);
    let proxy = spawn(&proxy_args, true)?;
    std::thread::sleep(Duration::from_millis(300));
    let load_json = dir.join("load.json");
    let mut load_args = s(&[
        "sip",
        "load",
        "--proxy",
        &addr,
        "--rate",
        "200",
        // 1 ms wakeups: at 200 calls/s the automatic tick would be 10 ms
        // and the proxy would see bursts, which its K_rcv would show.
        "--tick-us",
        "1000",
        "--quiet",
        "--duration",
    ]);
    load_args.push(format!("{secs}"));
    load_args.extend([
        "--calls".into(),
        format!("{}", (secs * 200.0) as u64),
        "--json".into(),
        load_json.display().to_string(),
    ]);
    let limit = Duration::from_secs_f64(secs + 40.0);
    finish(spawn(&load_args, true)?, limit, "sip load")?;
    println!("load: {}", summarize(&read_json(&load_json)?));
    finish(proxy, limit, "sip proxy")?;
    let summary_json = read_json(&summary)?;
    let micros = |t: &str, k: &str| summary_json["all"][t][k].as_f64().unwrap_or(f64::NAN);
    println!(
        "proxy: {} | messages in={} out={} | per message mean K_rcv={:.1} us, T_sip={:.1} us, K_snd={:.1} us (sampled) | drops pdr={}",
        summarize(&summary_json),
        summary_json["messages"]["in"],
        summary_json["messages"]["out"],
        micros("k_rcv", "mean_us"),
        micros("t_sip", "mean_us"),
        micros("k_snd", "mean_us"),
        summary_json["drops"]["pdr"],
    );
    Ok(())
}

/// One line of the scalar top-level fields of a JSON report (nested objects elided).
fn summarize(v: &serde_json::Value) -> String {
    let Some(obj) = v.as_object() else {
        return v.to_string();
    };
    let mut parts = Vec::new();
    for (k, x) in obj {
        match x {
            serde_json::Value::Number(n) => {
                let value = n.as_f64().unwrap_or(0.0);
                if value.fract() == 0.0 {
                    parts.push(format!("{k}={value:.0}"));
                } else if value.abs() < 0.01 {
                    // Small values (CPU seconds per call) keep their digits.
                    parts.push(format!("{k}={value:.3e}"));
                } else {
                    parts.push(format!("{k}={value:.3}"));
                }
            }
            serde_json::Value::String(t) if t.len() < 40 => parts.push(format!("{k}={t}")),
            serde_json::Value::Bool(b) => parts.push(format!("{k}={b}")),
            _ => {}
        }
    }
    parts.join(" ")
}

/// Run the loopback demo.
pub(crate) fn run(a: DemoArgs) -> anyhow::Result<()> {
    if !(a.seconds > 0.0 && a.seconds <= 60.0) {
        bail!("--seconds must be in (0, 60]");
    }
    let dir = tempdir()?;
    let mut failed = Vec::new();
    if !a.no_doctor {
        header("ringway doctor: what this kernel offers");
        if let Err(error) = run_to_end(&s(&["doctor"]), Duration::from_secs(60)) {
            failed.push(format!("doctor: {error:#}"));
        }
    }
    header("ringway bench io: loopback pps per backend, side by side");
    if let Err(error) = run_to_end(
        &s(&["bench", "io", "--seconds", "0.5", "--payload", "200"]),
        Duration::from_secs(60),
    ) {
        failed.push(format!("bench io: {error:#}"));
    }
    if let Err(error) = sfu_part(a.seconds, &dir) {
        failed.push(format!("sfu: {error:#}"));
    }
    if let Err(error) = sip_part(a.seconds, &dir) {
        failed.push(format!("sip: {error:#}"));
    }
    header("SRPIC sorter alone: ns/packet");
    if let Err(error) = run_to_end(
        &s(&["reorder", "bench", "--packets", "200000", "--reps", "1"]),
        Duration::from_secs(120),
    ) {
        failed.push(format!("reorder bench: {error:#}"));
    }
    let _ = std::fs::remove_dir_all(&dir);
    if failed.is_empty() {
        println!("\ndemo finished: every part ran.");
        Ok(())
    } else {
        bail!("demo parts failed:\n  {}", failed.join("\n  "))
    }
}

fn tempdir() -> anyhow::Result<PathBuf> {
    let dir = std::env::temp_dir().join(format!("ringway-demo-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}
