//! `ringway sip proxy`: the multi-threaded SIP proxy/registrar server.
//!
//! N worker threads receive batches of datagrams (one shared socket whose
//! fd every worker dups, or one SO_REUSEPORT socket per worker), pass each
//! datagram to the shared sans-IO [`ringway_sip::proxy::Proxy`] and send
//! what it produced with one `send_batch` per received batch. A timer thread
//! drives the core's retransmission/timeout timers. Per message type the
//! workers measure K_rcv, T_sip and (sampled) K_snd in HDR histograms; the
//! results are served as Prometheus text (`--metrics`) and written as a JSON
//! summary on exit (schema in docs/sip-proxy.md).

mod http;
pub mod metrics;
mod server;

use std::net::SocketAddr;
use std::path::PathBuf;

/// How workers receive.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum RxModel {
    /// One socket; every worker receives on a dup of its fd (like Kamailio children).
    Shared,
    /// One SO_REUSEPORT socket per worker; the kernel spreads flows over them.
    Reuseport,
}

/// Proxy operating mode.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ModeArg {
    /// Forward without transaction state.
    Stateless,
    /// Transaction-stateful (100 Trying, retransmissions, timers).
    Stateful,
}

/// Scheduling policy of the worker threads.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum PolicyArg {
    /// SCHED_OTHER (CFS/EEVDF).
    Other,
    /// SCHED_FIFO (real time).
    Fifo,
    /// SCHED_RR (real time, round robin).
    Rr,
}

/// Arguments of `ringway sip proxy`.
#[derive(clap::Args, Debug, Clone)]
pub struct ProxyArgs {
    /// UDP address to listen on.
    #[arg(long, default_value = "127.0.0.1:5060")]
    pub listen: SocketAddr,
    /// Stateless or transaction-stateful proxying.
    #[arg(long, value_enum, default_value_t = ModeArg::Stateless)]
    pub mode: ModeArg,
    /// Worker threads.
    #[arg(long, default_value_t = 1)]
    pub workers: usize,
    /// Send every request not addressed elsewhere to this next hop.
    #[arg(long)]
    pub route_to: Option<SocketAddr>,
    /// Act as registrar for the served domains (REGISTER → location service).
    #[arg(long)]
    pub registrar: bool,
    /// Do not insert Record-Route (in-dialog requests then bypass the proxy).
    #[arg(long)]
    pub no_record_route: bool,
    /// Serve Prometheus text on http://ADDR/metrics (loopback only unless --metrics-public).
    #[arg(long)]
    pub metrics: Option<SocketAddr>,
    /// Allow --metrics on a non-loopback address.
    #[arg(long)]
    pub metrics_public: bool,
    /// I/O backend: socket (one syscall per datagram), mmsg (recvmmsg/sendmmsg) or uring (io_uring).
    #[arg(long, default_value = "mmsg")]
    pub backend: ringway_io::BackendKind,
    /// Receive model.
    #[arg(long, value_enum, default_value_t = RxModel::Reuseport)]
    pub rx_model: RxModel,
    /// Requested SO_RCVBUF per socket (bytes).
    #[arg(long)]
    pub rcvbuf: Option<usize>,
    /// CPUs for the workers, e.g. "0,1" or "0-3" (worker i gets the i-th, round robin).
    #[arg(long)]
    pub cpus: Option<String>,
    /// Scheduling policy of the workers.
    #[arg(long, value_enum)]
    pub policy: Option<PolicyArg>,
    /// Real-time priority (with --policy fifo|rr).
    #[arg(long)]
    pub priority: Option<i32>,
    /// Nice value of the workers (SCHED_OTHER).
    #[arg(long, allow_hyphen_values = true)]
    pub nice: Option<i32>,
    /// EEVDF time slice request in µs (sched_attr.sched_runtime).
    #[arg(long)]
    pub slice_us: Option<u64>,
    /// Request a kernel TX timestamp for every Nth sent datagram (0 = never).
    #[arg(long, default_value_t = 64)]
    pub tx_stamp_every: u64,
    /// Stop after this many seconds (otherwise on SIGINT/SIGTERM).
    #[arg(long)]
    pub duration: Option<f64>,
    /// Also write the JSON summary to this file.
    #[arg(long)]
    pub summary: Option<PathBuf>,
    /// Do not print the JSON summary to stdout.
    #[arg(long)]
    pub quiet: bool,
    /// Transaction table bound; beyond it new requests get 503 Retry-After.
    #[arg(long, default_value_t = 100_000)]
    pub max_transactions: usize,
    /// Domain served by this proxy/registrar (repeatable).
    #[arg(long = "domain")]
    pub domains: Vec<String>,
    /// Datagrams per receive batch.
    #[arg(long, default_value_t = 32)]
    pub batch: usize,
}

impl ProxyArgs {
    /// Reject inconsistent arguments with a clear message.
    pub fn validate(&self) -> anyhow::Result<()> {
        anyhow::ensure!(
            (1..=256).contains(&self.workers),
            "--workers must be 1..=256"
        );
        anyhow::ensure!((1..=1024).contains(&self.batch), "--batch must be 1..=1024");
        anyhow::ensure!(self.max_transactions > 0, "--max-transactions must be > 0");
        anyhow::ensure!(
            !self.listen.ip().is_unspecified(),
            "--listen {}: use a concrete address (it goes into Via and Record-Route)",
            self.listen
        );
        if let Some(d) = self.duration {
            anyhow::ensure!(
                d.is_finite() && d > 0.0,
                "--duration must be a positive number of seconds"
            );
        }
        if let Some(p) = self.priority {
            anyhow::ensure!(
                matches!(self.policy, Some(PolicyArg::Fifo | PolicyArg::Rr)),
                "--priority needs --policy fifo or rr"
            );
            anyhow::ensure!((1..=99).contains(&p), "--priority must be 1..=99");
        }
        if let Some(n) = self.nice {
            anyhow::ensure!((-20..=19).contains(&n), "--nice must be -20..=19");
        }
        if let Some(m) = self.metrics {
            http::validate_addr(m, self.metrics_public)?;
        }
        if let Some(c) = &self.cpus {
            parse_cpu_list(c)?;
        }
        Ok(())
    }
}

/// Parse "0,2-3" into [0, 2, 3].
pub fn parse_cpu_list(s: &str) -> anyhow::Result<Vec<usize>> {
    let mut out = Vec::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        if let Some((a, b)) = part.split_once('-') {
            let a: usize = a.trim().parse()?;
            let b: usize = b.trim().parse()?;
            anyhow::ensure!(a <= b && b < 4096, "bad CPU range {part:?}");
            out.extend(a..=b);
        } else {
            let c: usize = part.parse()?;
            anyhow::ensure!(c < 4096, "bad CPU {part:?}");
            out.push(c);
        }
    }
    anyhow::ensure!(!out.is_empty(), "empty CPU list {s:?}");
    Ok(out)
}

impl ProxyArgs {
    /// The thread placement requested for worker `i`.
    pub fn placement(&self, i: usize) -> ringway_io::thread::Placement {
        use ringway_io::thread::Policy;
        let prio = self.priority.unwrap_or(1).clamp(1, 99) as u8;
        ringway_io::thread::Placement {
            cpus: self
                .cpus
                .as_deref()
                .and_then(|c| parse_cpu_list(c).ok())
                .map(|l| vec![l[i % l.len()]]),
            policy: self.policy.map(|p| match p {
                PolicyArg::Other => Policy::Other,
                PolicyArg::Fifo => Policy::Fifo(prio),
                PolicyArg::Rr => Policy::Rr(prio),
            }),
            nice: self.nice,
            slice: self.slice_us.map(std::time::Duration::from_micros),
        }
    }
}

/// Run the proxy until SIGINT/SIGTERM or `--duration`, then print the summary.
pub fn run(a: ProxyArgs) -> anyhow::Result<()> {
    a.validate()?;
    server::run(a)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists() {
        assert_eq!(parse_cpu_list("0,2-4").unwrap(), vec![0, 2, 3, 4]);
        assert!(parse_cpu_list("3-1").is_err());
        assert!(parse_cpu_list("x").is_err());
        assert!(parse_cpu_list("").is_err());
    }

    #[test]
    fn rejects_bad_arguments() {
        use clap::Parser;
        #[derive(clap::Parser)]
        struct T {
            #[command(flatten)]
            a: ProxyArgs,
        }
        let parse = |args: &[&str]| {
            let mut v = vec!["t"];
            v.extend_from_slice(args);
            T::try_parse_from(v).map(|t| t.a)
        };
        assert!(parse(&[]).unwrap().validate().is_ok());
        for bad in [
            &["--listen", "0.0.0.0:5060"][..],
            &["--workers", "0"],
            &["--priority", "5"],
            &["--policy", "fifo", "--priority", "100"],
            &["--metrics", "192.0.2.1:9000"],
            &["--cpus", "3-1"],
            &["--duration", "0"],
            &["--nice", "25"],
        ] {
            let a = parse(bad).unwrap();
            assert!(a.validate().is_err(), "{bad:?} accepted");
        }
        assert!(parse(&["--metrics", "192.0.2.1:9000", "--metrics-public"])
            .unwrap()
            .validate()
            .is_ok());
    }
}
