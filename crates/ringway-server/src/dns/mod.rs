//! DNS for next hops given as names (RFC 3263): the wire format
//! ([`wire`]), the lookup state machine ([`rfc3263`]), the TTL cache
//! ([`cache`]) and the [`Resolver`]: resolver threads that run lookups off
//! the workers, with a bounded queue.
//!
//! A worker never waits for DNS: it [`Resolver::submit`]s a lookup (a full
//! queue is refused at once, the caller answers `503`) and gets the answer
//! through the callback on a resolver thread. Start-up may call
//! [`Resolver::lookup`], which runs the same lookup on the calling thread.
//!
//! Queries go only to the configured nameserver (`dns_server`, else the
//! first `nameserver` of `/etc/resolv.conf`), from a connected UDP socket
//! per lookup (the kernel drops datagrams from anyone else; the id and the
//! question must match too). A truncated answer counts as a failure (no
//! TCP fallback: SIP answers fit 1232 bytes in practice).
//!
//! Every address a lookup gives is still a destination like any other: the
//! caller applies its relay policy to it ([`crate::dns::policy_filter`]).

pub mod cache;
mod next_hop;
pub mod rfc3263;
pub mod wire;

pub use next_hop::{NextHop, TransportNextHop};

use cache::{Cache, CacheLimits, Cached};
use rfc3263::{Answer, Lookup, LookupError, Question, Random, Service, XorShift};
use serde::{Deserialize, Serialize};
use std::collections::VecDeque;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Resolver settings (plain data).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DnsConfig {
    /// The nameserver; `None`: the first `nameserver` of /etc/resolv.conf.
    pub server: Option<SocketAddr>,
    /// Wait for one answer.
    pub timeout: Duration,
    /// Tries per question (1..=5).
    pub attempts: u32,
    /// Resolver threads (1..=16).
    pub threads: usize,
    /// Lookups waiting for a resolver thread at most.
    pub queue: usize,
    /// Cache entries at most.
    pub cache_entries: usize,
    /// Cache bytes at most.
    pub cache_bytes: usize,
    /// Negative answers are kept this long at most (s).
    pub negative_ttl_s: u32,
}

impl Default for DnsConfig {
    fn default() -> DnsConfig {
        let limits = CacheLimits::default();
        DnsConfig {
            server: None,
            timeout: Duration::from_millis(1000),
            attempts: 2,
            threads: 2,
            queue: 1024,
            cache_entries: limits.max_entries,
            cache_bytes: limits.max_bytes,
            negative_ttl_s: limits.negative_ttl_s,
        }
    }
}

impl DnsConfig {
    /// Reject settings out of range, naming the field.
    pub fn validate(&self) -> Result<(), String> {
        if !(1..=5).contains(&self.attempts) {
            return Err(format!("dns attempts must be 1..=5, not {}", self.attempts));
        }
        if !(1..=16).contains(&self.threads) {
            return Err(format!("dns threads must be 1..=16, not {}", self.threads));
        }
        if self.timeout < Duration::from_millis(10) || self.timeout > Duration::from_secs(30) {
            return Err("dns timeout must be 10 ms..=30 s".into());
        }
        if self.queue == 0 || self.cache_entries == 0 {
            return Err("dns queue and cache_entries must be above 0".into());
        }
        Ok(())
    }

    /// The nameserver: the configured one, else /etc/resolv.conf's first.
    pub fn nameserver(&self) -> Result<SocketAddr, DnsError> {
        if let Some(server) = self.server {
            return Ok(server);
        }
        let text = std::fs::read_to_string("/etc/resolv.conf").unwrap_or_default();
        resolv_conf_nameserver(&text).ok_or(DnsError::NoNameserver)
    }
}

/// The first `nameserver` of a resolv.conf text, port 53.
pub fn resolv_conf_nameserver(text: &str) -> Option<SocketAddr> {
    text.lines().find_map(|line| {
        let mut words = line.split_whitespace();
        (words.next() == Some("nameserver"))
            .then(|| words.next()?.split('%').next()?.parse::<IpAddr>().ok())
            .flatten()
            .map(|ip| SocketAddr::new(ip, 53))
    })
}

/// The `targets` the relay `policy` lets a configured next hop's name
/// reach: a resolved address is granted like an authenticated request's
/// target, so loopback, link-local and our own addresses stay refused
/// unless the relay networks name them (a name in DNS cannot open the
/// proxy host's other services), and nothing unsendable passes.
pub fn policy_filter(
    policy: &ringway_sip::relay::RelayPolicy,
    targets: Vec<SocketAddr>,
) -> Vec<SocketAddr> {
    targets
        .into_iter()
        .filter(|to| {
            let verdict = policy.check(*to, ringway_sip::relay::Grant::Authenticated);
            if let Err(refusal) = verdict {
                log::warn!("dns: resolved next hop {to} refused by the relay policy ({refusal:?})");
            }
            verdict.is_ok()
        })
        .collect()
}

/// Why a name gave no next hop.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DnsError {
    /// No nameserver configured and none in /etc/resolv.conf.
    NoNameserver,
    /// The name resolved to nothing we may send to.
    NoTargets(String),
    /// The nameserver did not answer usefully.
    Failed(String),
    /// The resolver threads' queue is full (the request gets 503).
    QueueFull,
}

impl fmt::Display for DnsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DnsError::NoNameserver => f.write_str("no nameserver (dns_server, /etc/resolv.conf)"),
            DnsError::NoTargets(name) => write!(f, "{name}: no address to send to"),
            DnsError::Failed(name) => write!(f, "{name}: DNS lookup failed"),
            DnsError::QueueFull => f.write_str("DNS resolver queue full"),
        }
    }
}

impl std::error::Error for DnsError {}

/// The resolver's counters.
#[derive(Debug, Default)]
pub struct DnsStats {
    lookups: AtomicU64,
    cached_lookups: AtomicU64,
    cache_hits: AtomicU64,
    cache_misses: AtomicU64,
    queries: AtomicU64,
    timeouts: AtomicU64,
    failures: AtomicU64,
    failovers: AtomicU64,
    queue_full: AtomicU64,
}

/// A snapshot of [`DnsStats`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct DnsStatsSnapshot {
    /// Next-hop lookups started (on a resolver thread or at start).
    pub lookups: u64,
    /// Next-hop lookups answered from the cache alone, on a worker.
    pub cached_lookups: u64,
    /// Questions answered from the cache (negative ones too).
    pub cache_hits: u64,
    /// Questions sent to the nameserver.
    pub cache_misses: u64,
    /// Query datagrams sent (retries too).
    pub queries: u64,
    /// Queries unanswered in time.
    pub timeouts: u64,
    /// Lookups that gave no next hop.
    pub failures: u64,
    /// Times a next hop was given up for the next target.
    pub failovers: u64,
    /// Lookups refused because the queue was full.
    pub queue_full: u64,
}

impl DnsStats {
    /// The counters now.
    pub fn snapshot(&self) -> DnsStatsSnapshot {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        DnsStatsSnapshot {
            lookups: get(&self.lookups),
            cached_lookups: get(&self.cached_lookups),
            cache_hits: get(&self.cache_hits),
            cache_misses: get(&self.cache_misses),
            queries: get(&self.queries),
            timeouts: get(&self.timeouts),
            failures: get(&self.failures),
            failovers: get(&self.failovers),
            queue_full: get(&self.queue_full),
        }
    }

    /// Count a failover (a caller moved on to the next target).
    pub fn add_failover(&self) {
        self.failovers.fetch_add(1, Ordering::Relaxed);
    }
}

impl DnsStatsSnapshot {
    /// The counters as Prometheus text (`ringway_dns_*`).
    pub fn prometheus(&self, text: &mut crate::metrics::PromText) {
        for (name, help, value) in [
            (
                "ringway_dns_lookups_total",
                "Next-hop lookups started.",
                self.lookups,
            ),
            (
                "ringway_dns_cached_lookups_total",
                "Next-hop lookups answered from the cache alone, on a worker.",
                self.cached_lookups,
            ),
            (
                "ringway_dns_cache_hits_total",
                "DNS questions answered from the cache (negative answers too).",
                self.cache_hits,
            ),
            (
                "ringway_dns_cache_misses_total",
                "DNS questions sent to the nameserver.",
                self.cache_misses,
            ),
            (
                "ringway_dns_queries_total",
                "DNS query datagrams sent (retries too).",
                self.queries,
            ),
            (
                "ringway_dns_timeouts_total",
                "DNS queries unanswered in time.",
                self.timeouts,
            ),
            (
                "ringway_dns_failures_total",
                "Next-hop lookups that gave no address.",
                self.failures,
            ),
            (
                "ringway_dns_failovers_total",
                "Times traffic moved from a resolved target to the next one.",
                self.failovers,
            ),
            (
                "ringway_dns_queue_full_total",
                "Lookups refused because the resolver queue was full.",
                self.queue_full,
            ),
        ] {
            text.counter(name, help, &[], value);
        }
    }
}

/// What a finished lookup calls with its answer.
pub type Done = Box<dyn FnOnce(Result<Vec<SocketAddr>, DnsError>) + Send>;

struct Job {
    host: String,
    port: Option<u16>,
    service: Service,
    ipv6: bool,
    done: Done,
}

struct Shared {
    config: DnsConfig,
    server: SocketAddr,
    started: Instant,
    cache: Mutex<Cache>,
    stats: DnsStats,
    jobs: Mutex<VecDeque<Job>>,
    ready: Condvar,
    stop: AtomicBool,
    random: Mutex<XorShift>,
}

/// Resolver threads with a shared cache (cheap to clone: one set of threads).
#[derive(Clone)]
pub struct Resolver {
    shared: Arc<Shared>,
    threads: Arc<Mutex<Vec<JoinHandle<()>>>>,
}

impl Resolver {
    /// Start `config.threads` resolver threads asking `config`'s nameserver.
    pub fn start(config: DnsConfig) -> Result<Resolver, DnsError> {
        config
            .validate()
            .map_err(|_| DnsError::Failed("dns configuration".into()))?;
        let server = config.nameserver()?;
        let seed: [u8; 8] = crate::host::random_bytes().unwrap_or_else(|_| {
            let t = Instant::now().elapsed().as_nanos() as u64 ^ u64::from(std::process::id());
            t.to_le_bytes()
        });
        let shared = Arc::new(Shared {
            cache: Mutex::new(Cache::new(CacheLimits {
                max_entries: config.cache_entries,
                max_bytes: config.cache_bytes,
                negative_ttl_s: config.negative_ttl_s,
                ..CacheLimits::default()
            })),
            server,
            started: Instant::now(),
            stats: DnsStats::default(),
            jobs: Mutex::new(VecDeque::new()),
            ready: Condvar::new(),
            stop: AtomicBool::new(false),
            random: Mutex::new(XorShift::new(u64::from_le_bytes(seed))),
            config,
        });
        let mut threads = Vec::new();
        for i in 0..shared.config.threads {
            let shared = shared.clone();
            let thread = std::thread::Builder::new()
                .name(format!("dns-{i}"))
                .spawn(move || resolver_thread(&shared))
                .map_err(|_| DnsError::Failed("starting resolver threads".into()))?;
            threads.push(thread);
        }
        log::info!("dns: {} resolver threads asking {server}", threads.len());
        Ok(Resolver {
            shared,
            threads: Arc::new(Mutex::new(threads)),
        })
    }

    /// The nameserver asked.
    pub fn nameserver(&self) -> SocketAddr {
        self.shared.server
    }

    /// Resolve `host` (with an explicit `port`, or by NAPTR/SRV) on this
    /// thread, for a sender bound to `local` (its address family decides
    /// A or AAAA): for start-up and resolver threads, never for a worker.
    pub fn lookup(
        &self,
        host: &str,
        port: Option<u16>,
        local: SocketAddr,
    ) -> Result<Vec<SocketAddr>, DnsError> {
        run_lookup(&self.shared, host, port, Service::Udp, local.is_ipv6())
    }

    /// [`Resolver::lookup`] for a next hop over `transport` (NAPTR
    /// `SIP+D2T`, SRV `_sip._tcp` for TCP; `SIPS+D2T`, `_sips._tcp`, port
    /// 5061 for TLS).
    pub fn lookup_over(
        &self,
        host: &str,
        port: Option<u16>,
        transport: ringway_sip::Transport,
        local: SocketAddr,
    ) -> Result<Vec<SocketAddr>, DnsError> {
        run_lookup(
            &self.shared,
            host,
            port,
            Service::of(transport),
            local.is_ipv6(),
        )
    }

    /// The answer from the cache alone, on the calling thread (a worker
    /// may call it: it takes the cache's lock once per question and never
    /// asks the nameserver): `None` when some question is not cached or
    /// has expired (then [`Resolver::submit_for`] it).
    pub fn cached(
        &self,
        host: &str,
        port: Option<u16>,
        service: Service,
        ipv6: bool,
    ) -> Option<Result<Vec<SocketAddr>, DnsError>> {
        let shared = &*self.shared;
        let mut lookup = Lookup::new(host, port, !ipv6, ipv6).for_service(service);
        // SRV weights: a cheap per-call seed (spread, not secrecy).
        let mut random =
            XorShift::new(shared.started.elapsed().as_nanos() as u64 ^ (host.len() as u64) << 32);
        let mut hits = 0;
        while let Some(question) = lookup.question().cloned() {
            let now = shared.started.elapsed().as_nanos() as u64;
            let cached = shared
                .cache
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .get(&question, now)
                .cloned()?;
            hits += 1;
            match &cached {
                Cached::Records(records) => lookup.answer(Answer::Records(records), &mut random),
                Cached::Negative => lookup.answer(Answer::NoData, &mut random),
            }
        }
        shared.stats.cache_hits.fetch_add(hits, Ordering::Relaxed);
        shared.stats.cached_lookups.fetch_add(1, Ordering::Relaxed);
        Some(lookup.targets().map_err(|e| match e {
            LookupError::NoTargets => DnsError::NoTargets(host.to_string()),
            LookupError::Failed => DnsError::Failed(host.to_string()),
        }))
    }

    /// [`Resolver::submit`] for a transport's `service` (its NAPTR service
    /// and SRV prefix).
    pub fn submit_for(
        &self,
        host: &str,
        port: Option<u16>,
        service: Service,
        local: SocketAddr,
        done: Done,
    ) -> Result<(), DnsError> {
        self.push(Job {
            host: host.to_string(),
            port,
            service,
            ipv6: local.is_ipv6(),
            done,
        })
    }

    /// Queue a lookup for a resolver thread; `done` gets its answer there.
    /// Never blocks: a full queue refuses it (counted).
    pub fn submit(
        &self,
        host: &str,
        port: Option<u16>,
        local: SocketAddr,
        done: Done,
    ) -> Result<(), DnsError> {
        self.push(Job {
            host: host.to_string(),
            port,
            service: Service::Udp,
            ipv6: local.is_ipv6(),
            done,
        })
    }

    fn push(&self, job: Job) -> Result<(), DnsError> {
        let mut jobs = self
            .shared
            .jobs
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if jobs.len() >= self.shared.config.queue {
            self.shared.stats.queue_full.fetch_add(1, Ordering::Relaxed);
            return Err(DnsError::QueueFull);
        }
        jobs.push_back(job);
        self.shared.ready.notify_one();
        Ok(())
    }

    /// The counters.
    pub fn stats(&self) -> &DnsStats {
        &self.shared.stats
    }

    /// Entries and bytes in the cache.
    pub fn cache_size(&self) -> (usize, usize) {
        let cache = self
            .shared
            .cache
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        (cache.len(), cache.bytes())
    }

    /// Forget every cached answer (a cold cache, for measurements).
    pub fn clear_cache(&self) {
        let mut cache = self
            .shared
            .cache
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        *cache = Cache::new(cache.limits());
    }

    /// Stop the resolver threads (queued lookups are dropped unanswered).
    pub fn stop(&self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        self.shared.ready.notify_all();
        let threads =
            std::mem::take(&mut *self.threads.lock().unwrap_or_else(PoisonError::into_inner));
        for thread in threads {
            let _ = thread.join();
        }
    }
}

fn resolver_thread(shared: &Shared) {
    loop {
        let job = {
            let mut jobs = shared.jobs.lock().unwrap_or_else(PoisonError::into_inner);
            loop {
                if shared.stop.load(Ordering::Relaxed) {
                    return;
                }
                if let Some(job) = jobs.pop_front() {
                    break job;
                }
                jobs = shared
                    .ready
                    .wait_timeout(jobs, Duration::from_millis(200))
                    .unwrap_or_else(PoisonError::into_inner)
                    .0;
            }
        };
        let answer = run_lookup(shared, &job.host, job.port, job.service, job.ipv6);
        (job.done)(answer);
    }
}

/// One whole lookup: questions from the cache or the nameserver.
fn run_lookup(
    shared: &Shared,
    host: &str,
    port: Option<u16>,
    service: Service,
    ipv6: bool,
) -> Result<Vec<SocketAddr>, DnsError> {
    shared.stats.lookups.fetch_add(1, Ordering::Relaxed);
    let mut lookup = Lookup::new(host, port, !ipv6, ipv6).for_service(service);
    let mut socket = None;
    let mut random = {
        let mut r = shared.random.lock().unwrap_or_else(PoisonError::into_inner);
        XorShift::new(u64::from(r.up_to(u32::MAX)) << 32 | u64::from(r.up_to(u32::MAX)))
    };
    while let Some(question) = lookup.question().cloned() {
        let now = shared.started.elapsed().as_nanos() as u64;
        let cached = shared
            .cache
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&question, now)
            .cloned();
        let answer = match cached {
            Some(cached) => {
                shared.stats.cache_hits.fetch_add(1, Ordering::Relaxed);
                cached
            }
            None => {
                shared.stats.cache_misses.fetch_add(1, Ordering::Relaxed);
                match ask(shared, &mut socket, &question, &mut random) {
                    Some((cached, ttl)) => {
                        let now = shared.started.elapsed().as_nanos() as u64;
                        shared
                            .cache
                            .lock()
                            .unwrap_or_else(PoisonError::into_inner)
                            .put(question.clone(), cached.clone(), ttl, now);
                        cached
                    }
                    None => {
                        lookup.answer(Answer::Failed, &mut random);
                        continue;
                    }
                }
            }
        };
        match &answer {
            Cached::Records(records) => lookup.answer(Answer::Records(records), &mut random),
            Cached::Negative => lookup.answer(Answer::NoData, &mut random),
        }
    }
    lookup.targets().map_err(|e| {
        shared.stats.failures.fetch_add(1, Ordering::Relaxed);
        match e {
            LookupError::NoTargets => DnsError::NoTargets(host.to_string()),
            LookupError::Failed => DnsError::Failed(host.to_string()),
        }
    })
}

/// Ask the nameserver `question`: the answer to cache and its TTL, or
/// `None` when it did not answer usefully.
fn ask(
    shared: &Shared,
    socket: &mut Option<UdpSocket>,
    question: &Question,
    random: &mut XorShift,
) -> Option<(Cached, Option<u32>)> {
    if socket.is_none() {
        let bind: IpAddr = match shared.server {
            SocketAddr::V4(_) => Ipv4Addr::UNSPECIFIED.into(),
            SocketAddr::V6(_) => Ipv6Addr::UNSPECIFIED.into(),
        };
        let s = UdpSocket::bind(SocketAddr::new(bind, 0)).ok()?;
        s.connect(shared.server).ok()?;
        *socket = Some(s);
    }
    let socket = socket.as_ref()?;
    let mut query = Vec::with_capacity(64);
    let mut buf = vec![0u8; 2048];
    for _ in 0..shared.config.attempts {
        let id = random.up_to(u32::from(u16::MAX)) as u16;
        wire::write_query(id, &question.name, question.record_type, &mut query)?;
        shared.stats.queries.fetch_add(1, Ordering::Relaxed);
        if socket.send(&query).is_err() {
            return None;
        }
        let deadline = Instant::now() + shared.config.timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                shared.stats.timeouts.fetch_add(1, Ordering::Relaxed);
                break;
            }
            socket.set_read_timeout(Some(left)).ok()?;
            let n = match socket.recv(&mut buf) {
                Ok(n) => n,
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) =>
                {
                    continue;
                }
                // ICMP unreachable and the like: no nameserver there.
                Err(_) => return None,
            };
            let Ok(response) = wire::parse_response(&buf[..n]) else {
                continue;
            };
            if response.id != id
                || response.question != question.name
                || response.question_type != question.record_type.code()
            {
                continue;
            }
            return classify(response, question);
        }
    }
    None
}

/// What a matching response means for the cache.
fn classify(response: wire::Response, question: &Question) -> Option<(Cached, Option<u32>)> {
    if response.truncated {
        return None;
    }
    match response.rcode {
        0 => {
            let relevant = response
                .records
                .iter()
                .any(|r| r.data.record_type() == question.record_type);
            if !relevant {
                return Some((Cached::Negative, response.negative_ttl));
            }
            let ttl = response.records.iter().map(|r| r.ttl).min();
            Some((Cached::Records(response.records), ttl))
        }
        3 => Some((Cached::Negative, response.negative_ttl)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const V4: SocketAddr = SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 5060);

    #[test]
    fn resolv_conf_first_nameserver() {
        let text = "# comment\nsearch x\nnameserver 10.0.0.53\nnameserver ::1\n";
        assert_eq!(
            resolv_conf_nameserver(text),
            Some("10.0.0.53:53".parse().unwrap())
        );
        assert_eq!(
            resolv_conf_nameserver("nameserver fe80::1%eth0"),
            Some("[fe80::1]:53".parse().unwrap())
        );
        assert_eq!(resolv_conf_nameserver("nameserver bogus\n"), None);
    }

    #[test]
    fn config_bounds() {
        assert!(DnsConfig::default().validate().is_ok());
        for bad in [
            DnsConfig {
                attempts: 0,
                ..DnsConfig::default()
            },
            DnsConfig {
                threads: 17,
                ..DnsConfig::default()
            },
            DnsConfig {
                timeout: Duration::ZERO,
                ..DnsConfig::default()
            },
            DnsConfig {
                queue: 0,
                ..DnsConfig::default()
            },
        ] {
            assert!(bad.validate().is_err(), "{bad:?}");
        }
    }

    /// A nameserver on loopback that answers from a fixed zone: the whole
    /// resolver (threads, cache, ids) against real datagrams.
    #[test]
    fn resolver_threads_against_a_loopback_nameserver() {
        use wire::tests::{naptr, response, srv};
        let server = UdpSocket::bind("127.0.0.1:0").unwrap();
        let addr = server.local_addr().unwrap();
        let served = Arc::new(AtomicU64::new(0));
        let count = served.clone();
        std::thread::spawn(move || {
            let mut buf = [0u8; 512];
            while let Ok((n, from)) = server.recv_from(&mut buf) {
                let id = u16::from_be_bytes([buf[0], buf[1]]);
                let (name, end) = wire_question(&buf[..n]);
                let qtype = u16::from_be_bytes([buf[end], buf[end + 1]]);
                count.fetch_add(1, Ordering::Relaxed);
                let answer = match (name.as_str(), qtype) {
                    ("sip.test", 35) => response(
                        id,
                        0,
                        &name,
                        qtype,
                        &[(
                            "sip.test",
                            35,
                            60,
                            naptr(1, 1, "s", "SIP+D2U", "_sip._udp.sip.test"),
                        )],
                        None,
                    ),
                    ("_sip._udp.sip.test", 33) => response(
                        id,
                        0,
                        &name,
                        qtype,
                        &[
                            ("_sip._udp.sip.test", 33, 60, srv(10, 1, 5070, "a.sip.test")),
                            ("_sip._udp.sip.test", 33, 60, srv(20, 1, 5080, "b.sip.test")),
                        ],
                        None,
                    ),
                    ("a.sip.test", 1) => response(
                        id,
                        0,
                        &name,
                        qtype,
                        &[("a.sip.test", 1, 60, vec![10, 0, 0, 1])],
                        None,
                    ),
                    ("b.sip.test", 1) => response(
                        id,
                        0,
                        &name,
                        qtype,
                        &[("b.sip.test", 1, 60, vec![10, 0, 0, 2])],
                        None,
                    ),
                    _ => response(id, 3, &name, qtype, &[], Some((60, 60))),
                };
                let _ = server.send_to(&answer, from);
            }
        });
        let resolver = Resolver::start(DnsConfig {
            server: Some(addr),
            ..DnsConfig::default()
        })
        .unwrap();
        let want: Vec<SocketAddr> = vec![
            "10.0.0.1:5070".parse().unwrap(),
            "10.0.0.2:5080".parse().unwrap(),
        ];
        assert_eq!(resolver.lookup("sip.test", None, V4).unwrap(), want);
        let asked = served.load(Ordering::Relaxed);
        assert_eq!(asked, 4, "NAPTR, SRV, A, A");
        // Warm: from the cache, on a resolver thread.
        let (tx, rx) = std::sync::mpsc::channel();
        resolver
            .submit("sip.test", None, V4, Box::new(move |r| tx.send(r).unwrap()))
            .unwrap();
        assert_eq!(
            rx.recv_timeout(Duration::from_secs(10)).unwrap().unwrap(),
            want
        );
        assert_eq!(
            served.load(Ordering::Relaxed),
            asked,
            "answered from the cache"
        );
        // A missing name: a failure, then cached as negative.
        assert!(matches!(
            resolver.lookup("nope.test", Some(1), V4),
            Err(DnsError::NoTargets(_))
        ));
        let after = served.load(Ordering::Relaxed);
        assert!(resolver.lookup("nope.test", Some(1), V4).is_err());
        assert_eq!(
            served.load(Ordering::Relaxed),
            after,
            "negative answer cached"
        );
        let stats = resolver.stats().snapshot();
        assert_eq!(stats.lookups, 4);
        assert_eq!(stats.cache_misses, 5);
        assert_eq!(stats.cache_hits, 5);
        assert_eq!(stats.failures, 2);
        resolver.stop();
    }

    /// The question name and where its type begins.
    fn wire_question(bytes: &[u8]) -> (String, usize) {
        let mut at = 12;
        let mut labels = Vec::new();
        while bytes[at] != 0 {
            let len = usize::from(bytes[at]);
            labels.push(String::from_utf8_lossy(&bytes[at + 1..at + 1 + len]).into_owned());
            at += 1 + len;
        }
        (labels.join("."), at + 1)
    }
}
