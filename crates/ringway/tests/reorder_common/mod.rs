//! Helpers of the TCP/SRPIC namespace tests: background processes killed
//! by PID on drop, tcpdump started and stopped cleanly, the TUN relay on a
//! thread that stops when the guard is dropped (also while unwinding).

#![allow(dead_code, unreachable_pub)]

use ringway_io::netns::Host;
use ringway_lab::srpic_tcp::hosts::Hosts;
use ringway_lab::srpic_tcp::relay::{run_tun_relay, RelayCore, RelayCoreConfig, RelayReport};
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

pub const BIN: &str = env!("CARGO_BIN_EXE_ringway");

/// A child process killed by PID and reaped on drop (with the stderr
/// lines a reader thread collected, for tcpdump's statistics).
pub struct Bg(pub Child, pub Option<std::sync::mpsc::Receiver<String>>);

impl Drop for Bg {
    fn drop(&mut self) {
        if matches!(self.0.try_wait(), Ok(None)) {
            let _ = self.0.kill();
        }
        let _ = self.0.wait();
    }
}

impl Bg {
    /// SIGINT by PID, then wait up to 5 s (SIGKILL after that); returns
    /// the process's remaining stderr lines (tcpdump's statistics).
    pub fn interrupt(mut self) -> String {
        let _ = Command::new("kill")
            .args(["-INT", &self.0.id().to_string()])
            .status();
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(5) {
            if let Ok(Some(_)) = self.0.try_wait() {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        std::thread::sleep(Duration::from_millis(50));
        self.1
            .as_ref()
            .map(|rx| rx.try_iter().collect::<Vec<_>>().join("; "))
            .unwrap_or_default()
    }

    /// Wait up to `limit` for the process to end; its stdout.
    pub fn output(mut self, limit: Duration) -> String {
        let t = Instant::now();
        while matches!(self.0.try_wait(), Ok(None)) && t.elapsed() < limit {
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
        let mut s = String::new();
        if let Some(mut o) = self.0.stdout.take() {
            use std::io::Read;
            let _ = o.read_to_string(&mut s);
        }
        s
    }
}

/// tcpdump on `iface` inside `h`, `-s 128`, packet-buffered into `file`;
/// returns once it listens.
pub fn tcpdump(h: &Host, iface: &str, file: &std::path::Path, filter: &[&str]) -> Bg {
    tcpdump_with(h.command("tcpdump"), iface, file, filter)
}

/// tcpdump from `c` (a `tcpdump` command, e.g. in the caller's own
/// namespace) on `iface`, as [`tcpdump`]. A small snap length and a large
/// buffer give the capture ring room for thousands of frames (the default
/// 262144-byte snap length leaves few slots, and a busy machine then drops
/// packets).
pub fn tcpdump_with(mut c: Command, iface: &str, file: &std::path::Path, filter: &[&str]) -> Bg {
    c.args([
        "-i",
        iface,
        "-n",
        "-U",
        "--immediate-mode",
        "-s",
        "128",
        "-B",
        "16384",
        "-Z",
        "root",
        "-w",
    ])
    .arg(file)
    .args(filter)
    .stdout(Stdio::null())
    .stderr(Stdio::piped());
    let mut child = c.spawn().expect("tcpdump is installed");
    let err = child.stderr.take().expect("piped");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(err).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let line = rx
        .recv_timeout(Duration::from_secs(10))
        .expect("tcpdump reports that it listens");
    assert!(line.contains("listening on"), "{line}");
    Bg(child, Some(rx))
}

/// Wait until `file` stopped growing for 300 ms (at most 10 s): tcpdump has
/// written what it received (an interrupt stops it reading at once).
pub fn wait_written(file: &std::path::Path) {
    let t = Instant::now();
    let mut last = (0u64, Instant::now());
    while t.elapsed() < Duration::from_secs(10) {
        let n = std::fs::metadata(file).map_or(0, |m| m.len());
        if n != last.0 {
            last = (n, Instant::now());
        } else if last.1.elapsed() > Duration::from_millis(300) {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Sets the stop flag when dropped.
pub struct StopOnDrop(pub Arc<AtomicBool>);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// Run `f` while the relay moves packets between the hosts' TUN devices;
/// returns `f`'s result and the relay's report.
pub fn with_relay<T>(
    hosts: &Hosts,
    cfg: &RelayCoreConfig,
    f: impl FnOnce() -> T,
) -> (T, RelayReport) {
    let stop = Arc::new(AtomicBool::new(false));
    let mut core = RelayCore::new(cfg);
    std::thread::scope(|s| {
        let guard = StopOnDrop(stop.clone());
        let relay = s.spawn(|| {
            run_tun_relay(
                &mut core,
                &hosts.sender_tun,
                &hosts.receiver_tun,
                &stop,
                Duration::from_secs(60),
            )
        });
        let out = f();
        std::thread::sleep(Duration::from_millis(100));
        drop(guard);
        let report = relay.join().expect("relay thread").expect("relay runs");
        (out, report)
    })
}

/// iperf3 from the sender to the receiver: `(client JSON, ok)`.
pub fn iperf3(hosts: &Hosts, seconds: f64, streams: usize) -> String {
    let server = ringway_lab::srpic_tcp::hosts::iperf3_server(hosts.receiver(), 5201).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let client =
        ringway_lab::srpic_tcp::hosts::iperf3_client(hosts.sender(), 5201, seconds, streams)
            .unwrap();
    let (out, _) = client.finish(Duration::from_secs_f64(seconds + 20.0));
    let _ = server.finish(Duration::from_secs(3));
    out
}

/// `tshark -r file -Y filter -T fields -e field...`: one line per packet.
pub fn tshark(file: &std::path::Path, filter: &str, fields: &[&str]) -> Vec<String> {
    let mut c = Command::new("tshark");
    c.arg("-r").arg(file).args(["-Y", filter, "-T", "fields"]);
    for f in fields {
        c.args(["-e", f]);
    }
    let o = c.output().expect("tshark is installed");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .map(str::to_string)
        .collect()
}

/// None of `names` (namespaces a test created and dropped) is left.
pub fn assert_netns_gone(names: &[String]) {
    let left: Vec<String> = ringway_io::netns::list_netns()
        .unwrap()
        .into_iter()
        .filter(|n| names.contains(n))
        .collect();
    assert!(left.is_empty(), "namespaces left: {left:?}");
}

/// An iptables rule inside a host, deleted (by its spec) when dropped;
/// the namespace's deletion removes it too.
pub struct Rule {
    netns: String,
    table: String,
    spec: Vec<String>,
}

impl Rule {
    /// `iptables -t table -A spec...` inside `h`.
    pub fn append(h: &Host, table: &str, spec: &[&str]) -> Rule {
        let o = h
            .command("iptables")
            .args(["-w", "-t", table, "-A"])
            .args(spec)
            .output()
            .expect("iptables is installed");
        assert!(
            o.status.success(),
            "iptables -A {spec:?}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        Rule {
            netns: h.netns.clone(),
            table: table.to_string(),
            spec: spec.iter().map(|s| s.to_string()).collect(),
        }
    }

    /// Packets the rule matched so far.
    pub fn packets(&self) -> u64 {
        let chain = &self.spec[0];
        let o = Command::new("ip")
            .args([
                "netns",
                "exec",
                &self.netns,
                "iptables",
                "-w",
                "-t",
                &self.table,
                "-L",
                chain,
                "-v",
                "-x",
                "-n",
            ])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&o.stdout);
        // The first rule line of the chain after the two header lines.
        text.lines()
            .nth(2)
            .and_then(|l| l.split_whitespace().next())
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
    }
}

impl Drop for Rule {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args([
                "netns",
                "exec",
                &self.netns,
                "iptables",
                "-w",
                "-t",
                &self.table,
                "-D",
            ])
            .args(&self.spec)
            .output();
    }
}

/// `ringway reorder nfqueue` inside `h` with `args`; returns once bound.
pub fn ringway_nfqueue(h: &Host, args: &[&str]) -> Bg {
    let mut c = h.command(BIN);
    c.args(["reorder", "nfqueue", "--json"])
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = c.spawn().unwrap();
    let err = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(err).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let line = rx
        .recv_timeout(Duration::from_secs(10))
        .expect("ringway reorder nfqueue reports that it is bound");
    assert!(line.contains("bound"), "{line}");
    Bg(child, Some(rx))
}
