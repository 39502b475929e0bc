//! The two hosts of a run: a sender and a receiver namespace, each with
//! only `lo` and one TUN device (the relay holds both descriptors), the
//! sender's TCP profile (per-namespace sysctls), the sender's "NIC" (a
//! `tbf` qdisc at the link rate on its TUN device), iperf3 on both ends
//! and `nstat` counters of each namespace.
//!
//! Everything is created for one run and removed after it: the namespaces
//! (with their devices, qdiscs and sysctls) when the [`Hosts`] value is
//! dropped, the iperf3 processes by PID. Nothing is set outside the
//! namespaces.

use anyhow::Context;
use ringway_io::netns::{Host, Topology};
use ringway_io::tun::Tun;
use std::collections::BTreeMap;
use std::io::Read;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Sender address (inside the sender namespace).
pub const SENDER_ADDR: &str = "10.77.250.1";
/// Receiver address (inside the receiver namespace).
pub const RECEIVER_ADDR: &str = "10.77.250.2";
/// Link MTU of both TUN devices.
pub const MTU: usize = 1500;

/// The sender's TCP reordering behaviour (paper, Section 4).
#[derive(Copy, Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum SenderProfile {
    /// Static reordering threshold: dupthresh fixed at 3 (the paper patched
    /// its kernel). Approximated by sysctls in the sender namespace:
    /// `tcp_reordering=3`, `tcp_max_reordering=3` (the adaptive threshold
    /// can no longer grow), `tcp_recovery=0`, `tcp_no_metrics_save=1`.
    /// `tcp_recovery=0` turned RACK loss detection off only up to Linux
    /// 6.16: since 6.17 (commit 1c120191dcec, RFC 3517/6675 loss recovery
    /// removed) RACK-TLP is the only SACK loss detection and the bit is
    /// ignored, so on this machine's 6.18 the S-Sender differs from the
    /// A-Sender by the capped reordering threshold only (docs/srpic.md).
    S,
    /// Adaptive threshold: the kernel's defaults (RACK on, reordering up
    /// to `tcp_max_reordering`).
    A,
}

impl SenderProfile {
    /// "S-Sender" / "A-Sender".
    pub fn name(self) -> &'static str {
        match self {
            SenderProfile::S => "S-Sender",
            SenderProfile::A => "A-Sender",
        }
    }

    /// The sysctls this profile sets in the sender namespace.
    pub fn sysctls(self) -> &'static [(&'static str, &'static str)] {
        match self {
            SenderProfile::S => &[
                ("net.ipv4.tcp_reordering", "3"),
                ("net.ipv4.tcp_max_reordering", "3"),
                ("net.ipv4.tcp_recovery", "0"),
                ("net.ipv4.tcp_no_metrics_save", "1"),
            ],
            SenderProfile::A => &[],
        }
    }
}

/// Sysctls every run sets in both namespaces: SACK per table, and TCP
/// timestamps only when turned off (`timestamps == false`; on is the
/// kernel's default and is left alone). (CUBIC, the paper's congestion
/// control, is chosen per socket by `iperf3 -C cubic`: outside the initial
/// namespace the kernel refuses a default that is not in
/// `tcp_allowed_congestion_control`; iperf3's report is checked.)
pub fn common_sysctls(sack: bool, timestamps: bool) -> Vec<(&'static str, &'static str)> {
    let mut sysctls = vec![("net.ipv4.tcp_sack", if sack { "1" } else { "0" })];
    if !timestamps {
        sysctls.push(("net.ipv4.tcp_timestamps", "0"));
    }
    sysctls
}

/// Keys read back from every namespace for the record.
pub const RECORDED_SYSCTLS: &[&str] = &[
    "net.ipv4.tcp_congestion_control",
    "net.ipv4.tcp_sack",
    "net.ipv4.tcp_timestamps",
    "net.ipv4.tcp_dsack",
    "net.ipv4.tcp_reordering",
    "net.ipv4.tcp_max_reordering",
    "net.ipv4.tcp_recovery",
    "net.ipv4.tcp_early_retrans",
    "net.ipv4.tcp_frto",
    "net.ipv4.tcp_no_metrics_save",
];

/// A process killed (by PID) and reaped when dropped; a child process whose stdout is drained by a thread while it runs (a
/// child that writes more than a pipe holds, as iperf3 `-J` does at exit
/// with many streams, would otherwise block and never end).
#[derive(Debug)]
pub struct Proc {
    child: Child,
    stdout: Option<std::thread::JoinHandle<String>>,
}

impl Drop for Proc {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
    }
}

impl Proc {
    /// Take `child` (spawned with a piped stdout) and start draining it.
    pub fn new(mut child: Child) -> Proc {
        let stdout = child.stdout.take().map(|mut o| {
            std::thread::spawn(move || {
                let mut out = String::new();
                let _ = o.read_to_string(&mut out);
                out
            })
        });
        Proc { child, stdout }
    }

    /// Wait at most `limit` for the process to end; kill it after that.
    /// Returns its stdout and whether it ended by itself with success.
    pub fn finish(mut self, limit: Duration) -> (String, bool) {
        let started = Instant::now();
        let mut finished = false;
        loop {
            match self.child.try_wait() {
                Ok(Some(st)) => {
                    finished = st.success();
                    break;
                }
                Ok(None) if started.elapsed() < limit => {
                    std::thread::sleep(Duration::from_millis(20))
                }
                _ => {
                    // Still running (or unknown): kill it by PID.
                    let _ = self.child.kill();
                    let _ = self.child.wait();
                    break;
                }
            }
        }
        // The process has ended, so its stdout is closed and the drain ends.
        let out = self
            .stdout
            .take()
            .and_then(|h| h.join().ok())
            .unwrap_or_default();
        (out, finished)
    }
}

fn run_ok(cmd: &mut Command) -> anyhow::Result<String> {
    let output = cmd.output().with_context(|| format!("running {cmd:?}"))?;
    if !output.status.success() {
        anyhow::bail!(
            "{cmd:?} failed: {}",
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

/// The sender and receiver namespaces of one run with their TUN devices.
#[derive(Debug)]
pub struct Hosts {
    /// Sender's TUN device (the relay reads what the sender sends here).
    pub sender_tun: Tun,
    /// Receiver's TUN device.
    pub receiver_tun: Tun,
    /// Sysctl values read in the sender namespace after setup.
    pub sender_sysctls: BTreeMap<String, String>,
    // Dropped last: deleting the namespaces removes everything inside.
    topo: Topology,
}

impl Hosts {
    /// Create both namespaces, a TUN device `tun0` in each (MTU 1500,
    /// point-to-point addresses), the sender's `tbf` at `rate_bps` (0: no
    /// qdisc), the sender profile and SACK setting.
    pub fn create(rate_bps: u64, profile: SenderProfile, sack: bool) -> anyhow::Result<Hosts> {
        Hosts::create_with(rate_bps, profile, sack, true)
    }

    /// [`Hosts::create`] with TCP timestamps on (the kernel's default) or
    /// off in both namespaces.
    pub fn create_with(
        rate_bps: u64,
        profile: SenderProfile,
        sack: bool,
        timestamps: bool,
    ) -> anyhow::Result<Hosts> {
        let topo = Topology::builder()
            .host("snd")
            .host("rcv")
            .build()
            .context("creating the sender and receiver namespaces")?;
        let open = |h: &Host| -> anyhow::Result<Tun> {
            h.run(|| Tun::open("tun0"))?
                .with_context(|| format!("opening a TUN device in {}", h.netns))
        };
        let snd = topo.host("snd").context("sender host")?.clone();
        let rcv = topo.host("rcv").context("receiver host")?.clone();
        let sender_tun = open(&snd)?;
        let receiver_tun = open(&rcv)?;
        for (h, me, peer) in [
            (&snd, SENDER_ADDR, RECEIVER_ADDR),
            (&rcv, RECEIVER_ADDR, SENDER_ADDR),
        ] {
            run_ok(Command::new("ip").args([
                "-n", &h.netns, "addr", "add", me, "peer", peer, "dev", "tun0",
            ]))?;
            run_ok(Command::new("ip").args([
                "-n",
                &h.netns,
                "link",
                "set",
                "tun0",
                "mtu",
                &MTU.to_string(),
                "txqueuelen",
                "1000",
                "up",
            ]))?;
            for (k, value) in common_sysctls(sack, timestamps) {
                set_sysctl(h, k, value)?;
            }
        }
        for (k, value) in profile.sysctls() {
            set_sysctl(&snd, k, value)?;
        }
        if rate_bps > 0 {
            // The sender's NIC: packets leave at the link rate; TCP small
            // queues and the qdisc give the sender back-pressure as a real
            // NIC does (no loss at the sender).
            run_ok(Command::new("tc").args([
                "-n",
                &snd.netns,
                "qdisc",
                "replace",
                "dev",
                "tun0",
                "root",
                "tbf",
                "rate",
                &format!("{rate_bps}bit"),
                "burst",
                &(2 * (MTU + 14)).to_string(),
                "limit",
                "4194304",
            ]))?;
        }
        let mut sender_sysctls = BTreeMap::new();
        for k in RECORDED_SYSCTLS {
            if let Ok(value) = get_sysctl(&snd, k) {
                sender_sysctls.insert(k.to_string(), value);
            }
        }
        Ok(Hosts {
            sender_tun,
            receiver_tun,
            sender_sysctls,
            topo,
        })
    }

    /// The sender host.
    pub fn sender(&self) -> &Host {
        self.topo.host("snd").expect("built with snd")
    }

    /// The receiver host.
    pub fn receiver(&self) -> &Host {
        self.topo.host("rcv").expect("built with rcv")
    }

    /// Namespace names (for leftover checks).
    pub fn netns_names(&self) -> Vec<String> {
        self.topo.netns_names()
    }
}

/// Set a sysctl inside `h` (fails loudly: nothing is applied silently).
pub fn set_sysctl(h: &Host, key: &str, value: &str) -> anyhow::Result<()> {
    run_ok(
        h.command("sysctl")
            .args(["-q", "-w", &format!("{key}={value}")]),
    )?;
    let got = get_sysctl(h, key)?;
    if got != value {
        anyhow::bail!("{key} in {} reads {got} after setting {value}", h.netns);
    }
    Ok(())
}

/// Read a sysctl inside `h`.
pub fn get_sysctl(h: &Host, key: &str) -> anyhow::Result<String> {
    Ok(run_ok(h.command("sysctl").args(["-n", key]))?
        .trim()
        .to_string())
}

/// All kernel SNMP/TcpExt counters of `h` (`nstat -asz --json`; absolute
/// values, no history file touched).
pub fn nstat(h: &Host) -> anyhow::Result<BTreeMap<String, u64>> {
    let out = run_ok(h.command("nstat").args(["-asz", "--json"]))?;
    let json: serde_json::Value = serde_json::from_str(&out).context("nstat JSON")?;
    let kernel = json["kernel"].as_object().context("nstat: no kernel map")?;
    Ok(kernel
        .iter()
        .filter_map(|(n, x)| x.as_u64().map(|x| (n.clone(), x)))
        .collect())
}

/// `after - before` for every counter of `after`.
pub fn delta(
    before: &BTreeMap<String, u64>,
    after: &BTreeMap<String, u64>,
) -> BTreeMap<String, u64> {
    after
        .iter()
        .map(|(k, v)| (k.clone(), v.saturating_sub(*before.get(k).unwrap_or(&0))))
        .collect()
}

/// Start `iperf3 -s -1 -J` on the receiver, bound to its address.
pub fn iperf3_server(h: &Host, port: u16) -> anyhow::Result<Proc> {
    let child = h
        .command("iperf3")
        .args([
            "-s",
            "-1",
            "-J",
            "-B",
            RECEIVER_ADDR,
            "-p",
            &port.to_string(),
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .context("starting iperf3 -s (is iperf3 installed?)")?;
    Ok(Proc::new(child))
}

/// Start `iperf3 -c` on the sender: `streams` parallel streams for
/// `duration_s` seconds, CUBIC, JSON output.
pub fn iperf3_client(h: &Host, port: u16, duration_s: f64, streams: usize) -> anyhow::Result<Proc> {
    let child = h
        .command("iperf3")
        .args([
            "-c",
            RECEIVER_ADDR,
            "-p",
            &port.to_string(),
            "-t",
            &format!("{duration_s}"),
            "-P",
            &streams.to_string(),
            "-C",
            "cubic",
            "-J",
            "--connect-timeout",
            "3000",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .context("starting iperf3 -c")?;
    Ok(Proc::new(child))
}

/// What an iperf3 client run reported.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct IperfResult {
    /// Receiver-side throughput, Mb/s (`end.sum_received`).
    #[serde(deserialize_with = "crate::stats::nan_or_f64")]
    pub mbps: f64,
    /// Seconds measured.
    #[serde(deserialize_with = "crate::stats::nan_or_f64")]
    pub seconds: f64,
    /// Bytes received.
    pub bytes: u64,
    /// Retransmissions the sender's TCP reported (`end.sum_sent.retransmits`).
    pub retransmits: u64,
    /// Client process CPU (user + system) in % of the run.
    #[serde(deserialize_with = "crate::stats::nan_or_f64")]
    pub client_cpu_pct: f64,
    /// Server process CPU in % of the run.
    #[serde(deserialize_with = "crate::stats::nan_or_f64")]
    pub server_cpu_pct: f64,
    /// Congestion control of the sender's sockets, as iperf3 reports it.
    pub congestion: String,
}

/// Parse `iperf3 -c -J` output.
pub fn parse_iperf3(json: &str) -> anyhow::Result<IperfResult> {
    let report: serde_json::Value = serde_json::from_str(json).context("iperf3 JSON")?;
    if let Some(error) = report.get("error").and_then(|error| error.as_str()) {
        anyhow::bail!("iperf3: {error}");
    }
    let end = &report["end"];
    let received = &end["sum_received"];
    let sent = &end["sum_sent"];
    Ok(IperfResult {
        mbps: received["bits_per_second"]
            .as_f64()
            .context("sum_received")?
            / 1e6,
        seconds: received["seconds"].as_f64().unwrap_or(0.0),
        bytes: received["bytes"].as_u64().unwrap_or(0),
        retransmits: sent["retransmits"].as_u64().unwrap_or(0),
        client_cpu_pct: end["cpu_utilization_percent"]["host_total"]
            .as_f64()
            .unwrap_or(f64::NAN),
        server_cpu_pct: end["cpu_utilization_percent"]["remote_total"]
            .as_f64()
            .unwrap_or(f64::NAN),
        congestion: end["sender_tcp_congestion"]
            .as_str()
            .unwrap_or("")
            .to_string(),
    })
}

#[cfg(test)]
mod tests {
    use std::process::{Command, Stdio};

    #[test]
    fn output_larger_than_a_pipe_does_not_block_the_child() {
        // 300 kB, far above the 64 KiB pipe: the child ends by itself only
        // if its stdout is read while it runs.
        let child = Command::new("sh")
            .args(["-c", "yes 0123456789 | head -c 300000"])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let (out, ok) = Proc::new(child).finish(Duration::from_secs(60));
        assert!(ok, "the child was killed instead of ending");
        assert_eq!(out.len(), 300_000);
    }

    use super::*;

    #[test]
    fn iperf3_json_is_read() {
        let j = r#"{"start":{},"end":{"sum_sent":{"bytes":1000,"retransmits":7},
            "sum_received":{"seconds":2.0,"bytes":990,"bits_per_second":123456789.0},
            "cpu_utilization_percent":{"host_total":12.5,"remote_total":30.0},
            "sender_tcp_congestion":"cubic"}}"#;
        let r = parse_iperf3(j).unwrap();
        assert_eq!((r.bytes, r.retransmits), (990, 7));
        assert!((r.mbps - 123.456789).abs() < 1e-9);
        assert_eq!((r.client_cpu_pct, r.server_cpu_pct), (12.5, 30.0));
        assert_eq!(r.congestion, "cubic");
        assert!(parse_iperf3(r#"{"error":"unable to connect"}"#).is_err());
        assert!(parse_iperf3("not json").is_err());
    }

    #[test]
    fn timestamps_are_turned_off_only_when_asked() {
        assert_eq!(common_sysctls(true, true), [("net.ipv4.tcp_sack", "1")]);
        assert_eq!(
            common_sysctls(false, false),
            [("net.ipv4.tcp_sack", "0"), ("net.ipv4.tcp_timestamps", "0")]
        );
        assert!(RECORDED_SYSCTLS.contains(&"net.ipv4.tcp_timestamps"));
    }
}
