//! Loopback throughput and per-packet cost of each send/receive path.
//!
//! One sender thread blasts fixed-size datagrams for a bounded time, one
//! receiver thread drains them; both measure their own CPU time (user and
//! kernel). With two or more CPUs the sender is pinned to CPU 0 and the
//! receiver to CPU 1.

use crate::backend::{open_backend, BackendKind};
use crate::batch::{RxBatch, TxBatch};
use crate::sock::{open_udp, SocketConfig};
use crate::sys;
use crate::thread::{self, CpuTime};
use std::io;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How the sender hands datagrams to the kernel.
#[derive(Copy, Clone, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Sender {
    /// A [`BackendKind`] `send_batch` (socket: one sendmsg per datagram; mmsg:
    /// sendmmsg; uring: one sendmsg SQE per datagram, one io_uring_enter per batch).
    Backend(BackendKind),
    /// UDP GSO: one send of many segments (`UDP_SEGMENT`), received with mmsg.
    Gso,
}

impl std::fmt::Display for Sender {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Sender::Backend(k) => write!(f, "{k}"),
            Sender::Gso => f.write_str("gso->mmsg"),
        }
    }
}

/// One measured run.
#[derive(Clone, Debug, serde::Serialize)]
pub struct BenchRow {
    /// Send path (the receiver uses the same backend; mmsg for GSO).
    pub path: String,
    /// Datagram payload bytes.
    pub payload: usize,
    /// Sender run time, seconds.
    pub seconds: f64,
    /// Datagrams the kernel accepted.
    pub sent: u64,
    /// Datagrams received.
    pub received: u64,
    /// Datagrams the receiving socket dropped (SO_MEMINFO drops).
    pub socket_drops: u64,
    /// sent - received.
    pub lost: u64,
    /// Send rate, datagrams per second.
    pub send_pps: f64,
    /// Receive rate, datagrams per second (over the receiver's active time).
    pub recv_pps: f64,
    /// Sender CPU per datagram, ns (user + kernel).
    pub send_ns_per_pkt: f64,
    /// Sender user CPU per datagram, ns.
    pub send_user_ns_per_pkt: f64,
    /// Sender kernel CPU per datagram, ns.
    pub send_sys_ns_per_pkt: f64,
    /// Receiver CPU per datagram, ns (user + kernel).
    pub recv_ns_per_pkt: f64,
    /// Receiver user CPU per datagram, ns.
    pub recv_user_ns_per_pkt: f64,
    /// Receiver kernel CPU per datagram, ns.
    pub recv_sys_ns_per_pkt: f64,
    /// Send syscalls per datagram.
    pub send_syscalls_per_pkt: f64,
    /// Receive syscalls per datagram.
    pub recv_syscalls_per_pkt: f64,
    /// Share of one CPU the sender thread got (CPU time / wall time); well
    /// below 1 means other load competed and pps understate the path.
    pub send_cpu_share: f64,
    /// Share of one CPU the receiver thread used over its active time.
    pub recv_cpu_share: f64,
}

/// Run one sender/receiver pair for `seconds` with `payload`-byte datagrams
/// and `batch` datagrams per batch (GSO: segments per send).
pub fn run_one(sender: Sender, payload: usize, seconds: f64, batch: usize) -> io::Result<BenchRow> {
    if payload == 0 || payload > 65000 || batch == 0 || !(0.01..=600.0).contains(&seconds) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "payload 1..=65000, batch >= 1, seconds 0.01..=600",
        ));
    }
    let rx_kind = match sender {
        Sender::Backend(k) => k,
        Sender::Gso => BackendKind::Mmsg,
    };
    let mut rcfg = SocketConfig::new("127.0.0.1:0".parse().expect("literal"));
    rcfg.rcvbuf = Some(8 << 20);
    let (rsock, _) = open_udp(&rcfg)?;
    let dst = rsock.local_addr()?;
    let rfd = rsock.as_raw_fd();
    let mut rio = open_backend(rx_kind, rsock)?;
    let two_cpus = thread::online_cpus() >= 2;
    let stop = Arc::new(AtomicBool::new(false));
    let stop_rx = stop.clone();
    let receiver = std::thread::spawn(move || -> io::Result<(u64, Duration, CpuTime, u64, u64)> {
        if two_cpus {
            let _ = thread::set_affinity(&[1]);
        }
        let mut rx_batch = RxBatch::new(batch.max(1), payload.max(64));
        let cpu_start = thread::thread_cpu_time()?;
        let start = Instant::now();
        let mut last = start;
        let mut got = 0u64;
        loop {
            let n = rio.recv_batch(&mut rx_batch, Some(Duration::from_millis(50)))?;
            if n > 0 {
                got += n as u64;
                last = Instant::now();
            } else if stop_rx.load(Ordering::Acquire) {
                break;
            }
        }
        let cpu = thread::thread_cpu_time()?.since(&cpu_start);
        let drops = sys::socket_drop_count(rfd).unwrap_or(0);
        Ok((got, last - start, cpu, rio.stats().rx_syscalls, drops))
    });
    let sender_res = std::thread::spawn(move || -> io::Result<(u64, Duration, CpuTime, u64)> {
        if two_cpus {
            let _ = thread::set_affinity(&[0]);
        }
        let dur = Duration::from_secs_f64(seconds);
        let (ssock, _) = open_udp(&SocketConfig::new("127.0.0.1:0".parse().expect("literal")))?;
        match sender {
            Sender::Backend(k) => {
                let mut io = open_backend(k, ssock)?;
                let mut tx_batch = TxBatch::new(batch, payload);
                let data = vec![0x5au8; payload];
                while !tx_batch.is_full() {
                    tx_batch.push(dst, &data).map_err(io::Error::other)?;
                }
                let cpu_start = thread::thread_cpu_time()?;
                let start = Instant::now();
                let mut sent = 0u64;
                while start.elapsed() < dur {
                    sent += io.send_batch(&tx_batch)? as u64;
                }
                let elapsed = start.elapsed();
                Ok((
                    sent,
                    elapsed,
                    thread::thread_cpu_time()?.since(&cpu_start),
                    io.stats().tx_syscalls,
                ))
            }
            Sender::Gso => {
                let segs = batch.min(64).min(65000 / payload).max(1);
                sys::setsockopt_int(
                    ssock.as_raw_fd(),
                    sys::SOL_UDP,
                    sys::UDP_SEGMENT,
                    payload as i32,
                )?;
                let buf = vec![0x5au8; segs * payload];
                let cpu_start = thread::thread_cpu_time()?;
                let start = Instant::now();
                let (mut sent, mut calls) = (0u64, 0u64);
                while start.elapsed() < dur {
                    calls += 1;
                    match ssock.send_to(&buf, dst) {
                        Ok(_) => sent += segs as u64,
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => std::thread::yield_now(),
                        Err(e) => return Err(e),
                    }
                }
                let elapsed = start.elapsed();
                Ok((
                    sent,
                    elapsed,
                    thread::thread_cpu_time()?.since(&cpu_start),
                    calls,
                ))
            }
        }
    })
    .join();
    stop.store(true, Ordering::Release);
    let rx_res = receiver
        .join()
        .map_err(|_| io::Error::other("receiver thread panicked"))?;
    let (sent, s_el, s_cpu, s_calls) =
        sender_res.map_err(|_| io::Error::other("sender thread panicked"))??;
    let (received, r_el, r_cpu, r_calls, drops) = rx_res?;
    let per = |v: u64, n: u64| if n == 0 { 0.0 } else { v as f64 / n as f64 };
    Ok(BenchRow {
        path: sender.to_string(),
        payload,
        seconds: s_el.as_secs_f64(),
        sent,
        received,
        socket_drops: drops,
        lost: sent.saturating_sub(received),
        send_pps: sent as f64 / s_el.as_secs_f64().max(1e-9),
        recv_pps: received as f64 / r_el.as_secs_f64().max(1e-9),
        send_ns_per_pkt: per(s_cpu.total_ns(), sent),
        send_user_ns_per_pkt: per(s_cpu.user_ns, sent),
        send_sys_ns_per_pkt: per(s_cpu.system_ns, sent),
        recv_ns_per_pkt: per(r_cpu.total_ns(), received),
        recv_user_ns_per_pkt: per(r_cpu.user_ns, received),
        recv_sys_ns_per_pkt: per(r_cpu.system_ns, received),
        send_syscalls_per_pkt: per(s_calls, sent),
        recv_syscalls_per_pkt: per(r_calls, received),
        send_cpu_share: s_cpu.total_ns() as f64 / (s_el.as_nanos() as f64).max(1.0),
        recv_cpu_share: r_cpu.total_ns() as f64 / (r_el.as_nanos() as f64).max(1.0),
    })
}

/// Run every path this kernel supports for every payload (`seconds` each);
/// backends it cannot run are left out (see [`BackendKind::usable`]).
pub fn run_all(
    payloads: &[usize],
    seconds: f64,
    batch: usize,
    gso: bool,
) -> io::Result<Vec<BenchRow>> {
    let mut senders: Vec<Sender> = BackendKind::usable()
        .into_iter()
        .map(Sender::Backend)
        .collect();
    if gso {
        senders.push(Sender::Gso);
    }
    let mut rows = Vec::new();
    for &p in payloads {
        for &s in &senders {
            rows.push(run_one(s, p, seconds, batch)?);
        }
    }
    Ok(rows)
}

/// Render rows as an aligned table.
pub fn render_table(rows: &[BenchRow]) -> String {
    let mut out = format!(
        "{:<10} {:>5} {:>10} {:>10} {:>7} {:>10} {:>10} {:>14} {:>14} {:>8} {:>8}\n",
        "path",
        "bytes",
        "send pps",
        "recv pps",
        "loss%",
        "send ns/p",
        "recv ns/p",
        "send usr/sys",
        "recv usr/sys",
        "tx sc/p",
        "rx sc/p"
    );
    for r in rows {
        out.push_str(&format!(
            "{:<10} {:>5} {:>10.0} {:>10.0} {:>7.2} {:>10.0} {:>10.0} {:>14} {:>14} {:>8.3} {:>8.3} {:>9}\n",
            r.path,
            r.payload,
            r.send_pps,
            r.recv_pps,
            if r.sent == 0 { 0.0 } else { 100.0 * r.lost as f64 / r.sent as f64 },
            r.send_ns_per_pkt,
            r.recv_ns_per_pkt,
            format!("{:.0}/{:.0}", r.send_user_ns_per_pkt, r.send_sys_ns_per_pkt),
            format!("{:.0}/{:.0}", r.recv_user_ns_per_pkt, r.recv_sys_ns_per_pkt),
            r.send_syscalls_per_pkt,
            r.recv_syscalls_per_pkt,
            format!("{:.0}%/{:.0}%", 100.0 * r.send_cpu_share, 100.0 * r.recv_cpu_share),
        ));
    }
    out
}

/// One-line comparison of mmsg against socket (and GSO when measured),
/// derived from the rows.
pub fn conclusion(rows: &[BenchRow]) -> String {
    let mut parts = Vec::new();
    let mut payloads: Vec<usize> = rows.iter().map(|r| r.payload).collect();
    payloads.dedup();
    for p in payloads {
        let get = |path: &str| rows.iter().find(|r| r.payload == p && r.path == path);
        let (Some(socket), Some(mmsg)) = (get("socket"), get("mmsg")) else {
            continue;
        };
        let ratio = |a: f64, b: f64| if b > 0.0 { a / b } else { 0.0 };
        let kernel_share = |r: &BenchRow| {
            let tot = r.send_ns_per_pkt + r.recv_ns_per_pkt;
            if tot > 0.0 {
                100.0 * (r.send_sys_ns_per_pkt + r.recv_sys_ns_per_pkt) / tot
            } else {
                0.0
            }
        };
        let mut text = format!(
            "{p} B: mmsg receives {:.2}x and sends {:.2}x the pps of socket; CPU per packet (send+recv) socket {:.2} us vs mmsg {:.2} us, {:.0}%/{:.0}% of it in the kernel",
            ratio(mmsg.recv_pps, socket.recv_pps),
            ratio(mmsg.send_pps, socket.send_pps),
            (socket.send_ns_per_pkt + socket.recv_ns_per_pkt) / 1000.0,
            (mmsg.send_ns_per_pkt + mmsg.recv_ns_per_pkt) / 1000.0,
            kernel_share(socket),
            kernel_share(mmsg),
        );
        let per_core = |ns: f64| if ns > 0.0 { 1e9 / ns } else { 0.0 };
        text.push_str(&format!(
            "; per fully used core (1/CPU per packet) mmsg sends {:.2}x and receives {:.2}x socket",
            ratio(
                per_core(mmsg.send_ns_per_pkt),
                per_core(socket.send_ns_per_pkt)
            ),
            ratio(
                per_core(mmsg.recv_ns_per_pkt),
                per_core(socket.recv_ns_per_pkt)
            ),
        ));
        if (socket.send_cpu_share - mmsg.send_cpu_share).abs() > 0.15 {
            text.push_str(&format!(
                " (raw pps are load-skewed: the sender got {:.0}% of a CPU with socket, {:.0}% with mmsg)",
                100.0 * socket.send_cpu_share,
                100.0 * mmsg.send_cpu_share
            ));
        }
        if let Some(uring) = get("uring") {
            text.push_str(&format!(
                "; uring receives {:.2}x and sends {:.2}x the pps of mmsg, CPU per packet (send+recv) {:.2} us vs mmsg {:.2} us, {:.0}% of it in the kernel",
                ratio(uring.recv_pps, mmsg.recv_pps),
                ratio(uring.send_pps, mmsg.send_pps),
                (uring.send_ns_per_pkt + uring.recv_ns_per_pkt) / 1000.0,
                (mmsg.send_ns_per_pkt + mmsg.recv_ns_per_pkt) / 1000.0,
                kernel_share(uring),
            ));
        }
        if let Some(gso) = get("gso->mmsg") {
            text.push_str(&format!(
                "; GSO sends {:.2}x the pps of mmsg at {:.2} us send CPU/packet",
                ratio(gso.send_pps, mmsg.send_pps),
                gso.send_ns_per_pkt / 1000.0
            ));
        }
        parts.push(text);
    }
    let mut line = parts.join(". ");
    let pairs: Vec<(f64, f64)> = rows
        .iter()
        .filter(|r| r.path == "mmsg")
        .filter_map(|mmsg| {
            rows.iter()
                .find(|socket| socket.path == "socket" && socket.payload == mmsg.payload)
                .map(|socket| {
                    (
                        socket.send_ns_per_pkt + socket.recv_ns_per_pkt,
                        mmsg.send_ns_per_pkt + mmsg.recv_ns_per_pkt,
                    )
                })
        })
        .collect();
    if !pairs.is_empty() {
        let pair_count = pairs.len() as f64;
        let sock = pairs.iter().map(|p| p.0).sum::<f64>() / pair_count;
        let mean_mmsg = pairs.iter().map(|p| p.1).sum::<f64>() / pair_count;
        let frac = if sock > 0.0 {
            (sock - mean_mmsg) / sock
        } else {
            0.0
        };
        line.push_str(&format!(
            ". Batching saves {:.2} us ({:.0}%) of {:.2} us CPU per packet: {}. (On loopback the receive-side stack runs in the sender's softirq, so send CPU includes delivery.)",
            (sock - mean_mmsg) / 1000.0,
            100.0 * frac,
            sock / 1000.0,
            if frac < 0.15 {
                "per-packet kernel work (UDP/IP stack, copies, wakeups) dominates, syscall batching helps little"
            } else if frac < 0.4 {
                "batching helps moderately, but per-packet kernel work (UDP/IP stack, copies, wakeups) still dominates"
            } else {
                "syscall and wakeup overhead is a large part of the per-packet cost here, batching pays"
            }
        ));
    }
    line
}
