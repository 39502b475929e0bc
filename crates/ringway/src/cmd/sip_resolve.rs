//! `ringway sip resolve`: what a next-hop name resolves to (RFC 3263, the
//! resolver the dispatcher uses), and the cost of a lookup with a cold
//! cache (emptied before each) or a warm one (bench/sip/dns-cost.sh).

use ringway_server::dns::{DnsConfig, NextHop, Resolver};
use serde::Serialize;
use std::net::SocketAddr;
use std::time::Instant;

/// Arguments of `ringway sip resolve`.
#[derive(clap::Args, Debug, Clone)]
pub(crate) struct ResolveArgs {
    /// HOST (NAPTR, SRV, then A/AAAA) or HOST:PORT (A/AAAA).
    pub(crate) name: NextHop,
    /// Nameserver, IP:PORT (default: the first of /etc/resolv.conf).
    #[arg(long)]
    pub(crate) dns_server: Option<SocketAddr>,
    /// Resolve for an IPv6 sender (AAAA) instead of IPv4 (A).
    #[arg(long)]
    pub(crate) ipv6: bool,
    /// Lookups to time (after one untimed).
    #[arg(long, default_value_t = 1)]
    pub(crate) repeat: u32,
    /// Empty the cache before every lookup (each asks the nameserver).
    #[arg(long)]
    pub(crate) cold: bool,
}

/// What `ringway sip resolve` prints (JSON).
#[derive(Serialize)]
struct Resolved {
    schema: &'static str,
    name: String,
    nameserver: SocketAddr,
    targets: Vec<SocketAddr>,
    cache: &'static str,
    lookups_timed: u32,
    mean_us: f64,
    median_us: f64,
    p99_us: f64,
    dns: ringway_server::dns::DnsStatsSnapshot,
}

/// Resolve and print.
pub(crate) fn run(a: ResolveArgs) -> anyhow::Result<()> {
    let NextHop::Name { host, port } = &a.name else {
        anyhow::bail!("{}: an address needs no resolving", a.name);
    };
    anyhow::ensure!(
        (1..=1_000_000).contains(&a.repeat),
        "--repeat must be 1..=1000000"
    );
    let resolver = Resolver::start(DnsConfig {
        server: a.dns_server,
        threads: 1,
        ..DnsConfig::default()
    })?;
    let local: SocketAddr = if a.ipv6 {
        "[::1]:5060".parse()?
    } else {
        "127.0.0.1:5060".parse()?
    };
    let targets = resolver.lookup(host, *port, local)?;
    let mut times = Vec::with_capacity(a.repeat as usize);
    for _ in 0..a.repeat {
        if a.cold {
            resolver.clear_cache();
        }
        let start = Instant::now();
        let again = resolver.lookup(host, *port, local)?;
        times.push(start.elapsed().as_secs_f64() * 1e6);
        anyhow::ensure!(!again.is_empty(), "{}: no targets", a.name);
    }
    times.sort_by(f64::total_cmp);
    let at = |q: f64| times[((times.len() - 1) as f64 * q).round() as usize];
    let out = Resolved {
        schema: "ringway.sip-resolve/1",
        name: a.name.to_string(),
        nameserver: resolver.nameserver(),
        targets,
        cache: if a.cold { "cold" } else { "warm" },
        lookups_timed: a.repeat,
        mean_us: times.iter().sum::<f64>() / times.len() as f64,
        median_us: at(0.5),
        p99_us: at(0.99),
        dns: resolver.stats().snapshot(),
    };
    resolver.stop();
    println!("{}", serde_json::to_string_pretty(&out)?);
    Ok(())
}
