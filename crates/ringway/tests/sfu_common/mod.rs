//! Helpers for the SFU integration tests: start `ringway sfu serve` as a
//! child process (killed by PID on drop), and raw UDP peers that speak the
//! pktswitch protocol through the `ringway_sfu` wire module.
#![allow(dead_code)]

#[path = "../promtool_common/mod.rs"]
mod promtool_common;
#[allow(unused_imports)]
pub(crate) use promtool_common::assert_promtool_accepts;

use ringway_sfu::client::{parse_reply, Reply, Requests, Session};
use ringway_sfu::wire::{self, MsgType, RtpHeader};
use ringway_sfu::{MediaType, RtpPacket, Selector};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub(crate) const BIN: &str = env!("CARGO_BIN_EXE_ringway");

/// Run `ringway ARGS` to the end with stdout and stderr captured; returns
/// its PID (to check that its namespaces are gone) and its output.
pub(crate) fn run_ringway(args: &[&str]) -> (u32, std::process::Output) {
    let child = Command::new(BIN)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn ringway");
    let pid = child.id();
    (pid, child.wait_with_output().expect("wait for ringway"))
}

/// Short runs of `ringway lab sfu` that a busy machine does not leave
/// out: 1 s (+0.5 s warm-up) each, with the limits on foreign CPU and late
/// ticks out of reach (timings are not what these tests check).
const SHORT_LAB_RUNS: [&str; 8] = [
    "--duration",
    "1",
    "--warmup",
    "0.5",
    "--max-foreign-cpu",
    "1000",
    "--max-late",
    "100",
];

/// Run `ringway lab sfu --netns` with [`SHORT_LAB_RUNS`], `ARGS` and
/// `--json JSON`, which must succeed; returns its PID and stdout.
pub(crate) fn lab_sfu_netns(args: &[&str], json: &Path) -> (u32, String) {
    let mut all = vec!["lab", "sfu", "--netns"];
    all.extend_from_slice(&SHORT_LAB_RUNS);
    all.extend_from_slice(args);
    all.extend(["--json", json.to_str().expect("UTF-8 temp path")]);
    let (pid, out) = run_ringway(&all);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    (pid, stdout)
}

/// A running `ringway sfu serve`.
pub(crate) struct Server {
    pub child: Child,
    pub addr: SocketAddr,
    /// The start-up line (addresses).
    pub line: String,
    pub json: PathBuf,
    pub dir: tempfile::TempDir,
}

impl Server {
    pub(crate) fn start(backend: &str, extra: &[&str]) -> Server {
        let dir = tempfile::tempdir().unwrap();
        let json = dir.path().join("serve.json");
        let mut child = Command::new(BIN)
            .args([
                "sfu",
                "serve",
                "--listen",
                "127.0.0.1:0",
                "--backend",
                backend,
            ])
            .args(["--stats-interval", "0", "--duration", "60", "--json"])
            .arg(&json)
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn ringway sfu serve");
        let mut line = String::new();
        BufReader::new(child.stdout.as_mut().unwrap())
            .read_line(&mut line)
            .unwrap();
        let addr = line
            .split_whitespace()
            .find_map(|w| w.parse::<SocketAddr>().ok())
            .unwrap_or_else(|| {
                let mut e = String::new();
                let _ = child.stderr.as_mut().unwrap().read_to_string(&mut e);
                panic!("no address in {line:?}; stderr: {e}")
            });
        Server {
            child,
            addr,
            line,
            json,
            dir,
        }
    }

    /// SIGTERM, wait (bounded), and return the JSON report.
    pub(crate) fn stop(mut self) -> serde_json::Value {
        terminate(&mut self.child);
        let text = std::fs::read_to_string(&self.json).expect("serve wrote its JSON report");
        serde_json::from_str(&text).unwrap()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Send SIGTERM to `child` by PID and wait up to 10 s (then SIGKILL).
pub(crate) fn terminate(child: &mut Child) {
    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    let until = Instant::now() + Duration::from_secs(10);
    while Instant::now() < until {
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// A raw pktswitch peer on its own UDP socket.
pub(crate) struct Peer {
    pub sock: UdpSocket,
    pub server: SocketAddr,
    pub reqs: Requests,
    pub session: Option<Session>,
}

impl Peer {
    pub(crate) fn new(server: SocketAddr) -> Peer {
        let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
        sock.set_read_timeout(Some(Duration::from_millis(50)))
            .unwrap();
        Peer {
            sock,
            server,
            reqs: Requests::default(),
            session: None,
        }
    }
    pub(crate) fn addr(&self) -> SocketAddr {
        self.sock.local_addr().unwrap()
    }
    /// Send a control message and wait for its reply (ignoring media).
    pub(crate) fn request(&self, id: u32, msg: &[u8]) -> Reply {
        self.sock.send_to(msg, self.server).unwrap();
        let until = Instant::now() + Duration::from_secs(3);
        let mut b = [0u8; 2048];
        while Instant::now() < until {
            if let Ok((n, _)) = self.sock.recv_from(&mut b) {
                if let Some(r) = parse_reply(&b[..n]) {
                    let rid = match r {
                        Reply::Ack(i, _) | Reply::Error(i, _, _) | Reply::Challenge(i, _) => i,
                    };
                    if rid == id {
                        return r;
                    }
                }
            }
        }
        panic!("no reply to request {id}")
    }
    /// REGISTER, answering the CHALLENGE with its cookie: the reply to the
    /// second REGISTER (ACK or ERROR).
    pub(crate) fn register_reply(&mut self) -> Reply {
        let (id, m) = self.reqs.register();
        match self.request(id, &m) {
            Reply::Challenge(_, cookie) => {
                let (id, m) = self.reqs.register_with(&cookie);
                self.request(id, &m)
            }
            r => panic!("a first REGISTER must earn a CHALLENGE: {r:?}"),
        }
    }
    pub(crate) fn register(&mut self) -> Session {
        match self.register_reply() {
            Reply::Ack(_, s) => {
                self.session = Some(s);
                s
            }
            r => panic!("register refused: {r:?}"),
        }
    }
    pub(crate) fn subscribe(&mut self, sels: &str, unsub: bool) -> Reply {
        let s: Vec<Selector> = sels.split(',').map(|x| x.parse().unwrap()).collect();
        let (id, m) = self.reqs.subscribe(self.session.unwrap(), &s, unsub);
        self.request(id, &m)
    }
    pub(crate) fn simple(&mut self, ty: MsgType) -> Reply {
        let (id, m) = self.reqs.simple(ty, self.session.unwrap());
        self.request(id, &m)
    }
    /// Send one RTP packet (SSRC, type, seq) and return its bytes.
    pub(crate) fn send_rtp(&self, ssrc: u32, m: MediaType, seq: u16) -> Vec<u8> {
        let b = rtp(ssrc, m, seq);
        self.sock.send_to(&b, self.server).unwrap();
        b
    }

    /// Everything received until `quiet` passes without a datagram.
    pub(crate) fn drain(&self, quiet: Duration) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        let mut b = [0u8; 2048];
        let mut last = Instant::now();
        while last.elapsed() < quiet {
            if let Ok((n, _)) = self.sock.recv_from(&mut b) {
                out.push(b[..n].to_vec());
                last = Instant::now();
            }
        }
        out
    }
}

/// An RTP packet (SSRC, type, seq) with a send-time extension.
pub(crate) fn rtp(ssrc: u32, m: MediaType, seq: u16) -> Vec<u8> {
    let mut b = vec![0u8; 120];
    let h = RtpHeader {
        payload_type: m.payload_type(),
        marker: false,
        seq,
        timestamp: seq as u32 * 160,
        ssrc,
    };
    let n = wire::write_rtp(&mut b, &h, Some(1), 60 + m as usize * 20).unwrap();
    b.truncate(n);
    b
}

/// (SSRC, media) of each RTP datagram in `v` (control replies skipped).
pub(crate) fn rtp_ids(v: &[Vec<u8>]) -> Vec<(u32, Option<MediaType>, u16)> {
    v.iter()
        .filter_map(|d| RtpPacket::new_checked(d).ok())
        .map(|p| {
            (
                p.ssrc(),
                MediaType::from_payload_type(p.payload_type()),
                p.seq(),
            )
        })
        .collect()
}

/// Run `f` inside a private network namespace with only `lo`.
pub(crate) fn in_netns<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    ringway_io::netns::in_private_netns(f).expect("private netns (run as root)")
}

pub(crate) fn read_json(p: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
}

/// Assert that no namespace made by process `pid` (netns helper names
/// `[site prefix]<PREFIX><pid>-...`) is left.
pub(crate) fn no_namespaces_of(pid: u32) {
    let mine = format!(
        "{}{}{pid}-",
        ringway_io::netns::site_prefix(),
        ringway_io::netns::PREFIX
    );
    let left: Vec<String> = ringway_io::netns::list_netns()
        .unwrap()
        .into_iter()
        .filter(|n| n.starts_with(&mine))
        .collect();
    assert!(left.is_empty(), "namespaces left behind: {left:?}");
}

/// One request to an admin API (the SFU's, the JackTrip hub's) on `admin`,
/// with the bearer `token` if given: status and body.
pub(crate) fn admin_http(
    admin: SocketAddr,
    method: &str,
    path: &str,
    token: Option<&str>,
) -> (u16, String) {
    let mut c = TcpStream::connect(admin).unwrap();
    let auth = token
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    write!(
        c,
        "{method} {path} HTTP/1.1\r\nHost: x\r\n{auth}Content-Length: 0\r\n\r\n"
    )
    .unwrap();
    let mut r = String::new();
    c.read_to_string(&mut r).unwrap();
    let status = r[9..12].parse().unwrap();
    let body = r.split("\r\n\r\n").nth(1).unwrap_or("").to_string();
    (status, body)
}

/// One `ringway sfu load --netns` run of 3 clients (1.5 s, a packet every
/// 10 ms, no periodic stats) against an SFU listening on `server`, on
/// `backend`, with `extra` flags (`--routed`, `--ipv6`,
/// `--sfu-kernel-fanout`); it must succeed (`what` names the run in the
/// failure) and leave no namespace behind. Returns the SFU's and the
/// load's JSON reports.
pub(crate) fn load_netns_run(
    what: &str,
    server: &str,
    backend: &str,
    extra: &[&str],
) -> (serde_json::Value, serde_json::Value) {
    let dir = tempfile::tempdir().unwrap();
    let (sj, lj) = (dir.path().join("sfu.json"), dir.path().join("load.json"));
    let mut args = vec![
        "sfu",
        "load",
        "--netns",
        "--clients",
        "3",
        "--server",
        server,
        "--duration",
        "1.5",
        "--interval-ms",
        "10",
        "--stats-interval",
        "0",
        "--sfu-backend",
        backend,
        "--sfu-json",
        sj.to_str().unwrap(),
        "--json",
        lj.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    let (pid, out) = run_ringway(&args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{what}: {stderr}");
    no_namespaces_of(pid);
    (read_json(&sj), read_json(&lj))
}

/// Exact delivery at the 3 clients of [`load_netns_run`]: every packet to
/// the 2 others and back. Returns the packets sent.
pub(crate) fn delivered_exactly(what: &str, l: &serde_json::Value) -> u64 {
    let tx = l["tx_packets"].as_u64().unwrap();
    assert!(tx >= 3 * 3 * 50, "{what}: {l}");
    assert_eq!(l["media_packets"].as_u64().unwrap(), 2 * tx, "{what}: {l}");
    assert_eq!(l["echoes"].as_u64().unwrap(), tx, "{what}: {l}");
    assert_eq!(l["lost"], 0, "{what}: {l}");
    assert_eq!(l["control_errors"], 0, "{what}: {l}");
    tx
}

/// The AF_XDP backend's report `s` of a run whose clients sent `tx`
/// packets: every copy written from the received frame into the TX ring,
/// every echo the received frame turned around, none through the
/// companion socket either way, no send error.
pub(crate) fn assert_xdp_rings_carried_all(what: &str, s: &serde_json::Value, tx: u64) {
    assert_eq!(s["backend"], "xdp", "{what}");
    let io = &s["io"];
    assert_eq!(io["rx_via_socket"], 0, "{what}: {io}");
    assert_eq!(io["tx_via_socket"], 0, "{what}: {io}");
    assert_eq!(io["tx_errors"], 0, "{what}: {io}");
    assert_eq!(
        io["tx_from_rx_frame"].as_u64().unwrap(),
        2 * tx,
        "{what}: {io}"
    );
    assert_eq!(io["tx_moved"].as_u64().unwrap(), tx, "{what}: {io}");
}

/// The `tc` fan-out's report `s` of a run whose clients sent `tx` packets:
/// the first packets of each source reach user space (the route is
/// installed at the next control tick), the rest, at least half, stay in
/// the kernel.
pub(crate) fn assert_kernel_fanout_carried(what: &str, s: &serde_json::Value, tx: u64) {
    let kernel = s["kernel_fanout"]["packets"].as_u64().unwrap();
    let user = s["sfu"]["media_accepted"].as_u64().unwrap();
    assert_eq!(kernel + user, tx, "{what}: {s}");
    assert!(kernel >= tx / 2, "{what}: kernel {kernel} of {tx}: {s}");
}
