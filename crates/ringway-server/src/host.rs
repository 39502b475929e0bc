//! What the servers need from the host: CPU time (one type:
//! [`ringway_io::thread::CpuTime`]), CPU lists, thread placement, and the
//! SIGINT/SIGTERM stop flag. The system calls behind them live in
//! `ringway_io::thread`.

pub use ringway_io::thread::{process_cpu_time, thread_cpu_time, CpuTime};
use ringway_io::thread::{Placement, PlacementItem};
use std::io;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

/// Highest CPU number a list may name.
const MAX_CPU: usize = 4095;

/// A CPU list that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("bad CPU list {list:?}: {reason}")]
pub struct CpuListError {
    /// The list as given.
    pub list: String,
    /// What is wrong with it.
    pub reason: String,
}

/// Parse a CPU list in `taskset`/cpuset syntax, e.g. `1`, `0,2` or `0-3,6`.
pub fn parse_cpu_list(list: &str) -> Result<Vec<usize>, CpuListError> {
    let bad = |reason: String| CpuListError {
        list: list.to_string(),
        reason,
    };
    let number = |s: &str| -> Result<usize, CpuListError> {
        let cpu: usize = s
            .trim()
            .parse()
            .map_err(|_| bad(format!("{s:?} is not a CPU number")))?;
        if cpu > MAX_CPU {
            return Err(bad(format!("CPU {cpu} is above {MAX_CPU}")));
        }
        Ok(cpu)
    };
    let mut cpus = Vec::new();
    for part in list.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((first, last)) => {
                let (first, last) = (number(first)?, number(last)?);
                if first > last {
                    return Err(bad(format!("range {part} runs backwards")));
                }
                cpus.extend(first..=last);
            }
            None => cpus.push(number(part)?),
        }
    }
    if cpus.is_empty() {
        return Err(bad("it names no CPU".into()));
    }
    Ok(cpus)
}

/// Clock ticks per second of the times in `/proc/<pid>/stat` (Linux's
/// USER_HZ, fixed at 100 whatever the kernel's HZ).
pub const USER_HZ: u64 = 100;

/// CPU time of process `pid` (all its threads, not its children), from
/// `/proc/<pid>/stat` (10 ms resolution).
pub fn process_cpu_time_of(pid: u32) -> io::Result<CpuTime> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    ringway_io::thread::parse_stat_cpu(&stat, USER_HZ)
}

/// `N` bytes from the operating system's random source (keys, secrets).
pub fn random_bytes<const N: usize>() -> io::Result<[u8; N]> {
    use std::io::Read as _;
    let mut bytes = [0u8; N];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut bytes)?;
    Ok(bytes)
}

/// A flag that SIGINT and SIGTERM set (the one stop flag of every command).
pub fn stop_flag() -> io::Result<Arc<AtomicBool>> {
    let flag = Arc::new(AtomicBool::new(false));
    for signal in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(signal, flag.clone())?;
    }
    Ok(flag)
}

/// The flags of a managed server (`sip proxy`): SIGINT stops at once,
/// SIGTERM asks for a graceful drain, SIGHUP for a reload. The front end
/// clears `terminate` and `hangup` as it acts on them.
pub struct ControlSignals {
    /// SIGINT came.
    pub interrupt: Arc<AtomicBool>,
    /// SIGTERM came (drain, then exit).
    pub terminate: Arc<AtomicBool>,
    /// SIGHUP came (reload).
    pub hangup: Arc<AtomicBool>,
}

/// Register [`ControlSignals`].
pub fn control_signals() -> io::Result<ControlSignals> {
    let flag = |signal| -> io::Result<Arc<AtomicBool>> {
        let flag = Arc::new(AtomicBool::new(false));
        signal_hook::flag::register(signal, flag.clone())?;
        Ok(flag)
    };
    Ok(ControlSignals {
        interrupt: flag(signal_hook::consts::SIGINT)?,
        terminate: flag(signal_hook::consts::SIGTERM)?,
        hangup: flag(signal_hook::consts::SIGHUP)?,
    })
}

/// IPv4 + IPv6 UDP counters of this network namespace (`/proc/net/snmp`
/// and `snmp6`); `None` when they cannot be read.
pub fn udp_totals() -> Option<ringway_io::counters::UdpSnmp> {
    use ringway_io::counters::{udp6_snmp, udp_snmp, UdpSnmp};
    let udp4 = udp_snmp().ok()?;
    let udp6 = udp6_snmp().unwrap_or_default();
    Some(UdpSnmp {
        in_datagrams: udp4.in_datagrams + udp6.in_datagrams,
        no_ports: udp4.no_ports + udp6.no_ports,
        in_errors: udp4.in_errors + udp6.in_errors,
        out_datagrams: udp4.out_datagrams + udp6.out_datagrams,
        rcvbuf_errors: udp4.rcvbuf_errors + udp6.rcvbuf_errors,
        sndbuf_errors: udp4.sndbuf_errors + udp6.sndbuf_errors,
        in_csum_errors: udp4.in_csum_errors + udp6.in_csum_errors,
        mem_errors: udp4.mem_errors + udp6.mem_errors,
    })
}

/// Receive errors that concern one peer (an ICMP error reported on the
/// socket) or an interrupted wait, not the socket itself: count them and
/// keep going.
pub fn transient(e: &io::Error) -> bool {
    use io::ErrorKind::*;
    matches!(
        e.kind(),
        ConnectionRefused
            | ConnectionReset
            | HostUnreachable
            | NetworkUnreachable
            | Interrupted
            | WouldBlock
            | TimedOut
    )
}

/// Apply `placement` to the calling thread (named `thread` in the report)
/// and return one line per knob: what was asked and what the kernel did.
pub fn place_this_thread(thread: &str, placement: &Placement) -> Vec<String> {
    placement
        .apply()
        .into_iter()
        .map(
            |PlacementItem {
                 what,
                 requested,
                 result,
             }| { format!("{thread}: {what} {requested} -> {result}") },
        )
        .collect()
}

/// Serde (de)serialisation of a [`CpuTime`] as `{"user_s": .., "sys_s": ..}`
/// (seconds), the shape of every JSON report; use with `#[serde(with)]`.
pub mod cpu_seconds {
    use super::CpuTime;
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    #[derive(Serialize, Deserialize)]
    struct Seconds {
        user_s: f64,
        sys_s: f64,
    }

    /// Serialise as seconds.
    pub fn serialize<S: Serializer>(cpu: &CpuTime, s: S) -> Result<S::Ok, S::Error> {
        Seconds {
            user_s: cpu.user_ns as f64 / 1e9,
            sys_s: cpu.system_ns as f64 / 1e9,
        }
        .serialize(s)
    }

    /// Deserialise from seconds (negative values read as 0).
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<CpuTime, D::Error> {
        let seconds = Seconds::deserialize(d)?;
        let to_ns = |x: f64| (x.max(0.0) * 1e9).round() as u64;
        Ok(CpuTime {
            user_ns: to_ns(seconds.user_s),
            system_ns: to_ns(seconds.sys_s),
        })
    }

    /// An optional [`CpuTime`]: seconds, or `null` when it is not known.
    pub mod option {
        use super::CpuTime;
        use serde::{Deserialize, Deserializer, Serialize, Serializer};

        /// Serialise as seconds, or `null`.
        pub fn serialize<S: Serializer>(cpu: &Option<CpuTime>, s: S) -> Result<S::Ok, S::Error> {
            cpu.map(|c| super::Seconds {
                user_s: c.user_ns as f64 / 1e9,
                sys_s: c.system_ns as f64 / 1e9,
            })
            .serialize(s)
        }

        /// Deserialise from seconds, or `null`.
        pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<CpuTime>, D::Error> {
            let to_ns = |x: f64| (x.max(0.0) * 1e9).round() as u64;
            Ok(Option::<super::Seconds>::deserialize(d)?.map(|s| CpuTime {
                user_ns: to_ns(s.user_s),
                system_ns: to_ns(s.sys_s),
            }))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists() {
        assert_eq!(parse_cpu_list("0,2-4").unwrap(), vec![0, 2, 3, 4]);
        assert_eq!(parse_cpu_list(" 1 ").unwrap(), vec![1]);
        for bad in ["3-1", "x", "", ",", "1-x", "5000"] {
            assert!(parse_cpu_list(bad).is_err(), "{bad:?} accepted");
        }
        let e = parse_cpu_list("3-1").unwrap_err().to_string();
        assert!(e.contains("backwards"), "{e}");
    }

    #[test]
    fn cpu_time_as_seconds_round_trips() {
        #[derive(serde::Serialize, serde::Deserialize)]
        struct R {
            #[serde(with = "cpu_seconds")]
            cpu: CpuTime,
        }
        let r = R {
            cpu: CpuTime {
                user_ns: 2_500_000_000,
                system_ns: 370_000_000,
            },
        };
        let text = serde_json::to_string(&r).unwrap();
        assert_eq!(text, r#"{"cpu":{"user_s":2.5,"sys_s":0.37}}"#);
        let back: R = serde_json::from_str(&text).unwrap();
        assert_eq!(back.cpu, r.cpu);
    }

    #[test]
    fn own_process_cpu_time_from_proc() {
        let mine = process_cpu_time_of(std::process::id()).unwrap();
        // Burn CPU until the 10 ms ticks of /proc move (bounded; the
        // process already ran for a while, so this is quick).
        let until = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let mut x = 0u64;
        let mut later = mine;
        while later.total_ns() <= mine.total_ns() && std::time::Instant::now() < until {
            for _ in 0..1_000_000 {
                x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
            }
            later = process_cpu_time_of(std::process::id()).unwrap();
        }
        std::hint::black_box(x);
        assert!(later.total_ns() > mine.total_ns(), "{mine:?} -> {later:?}");
        assert!(process_cpu_time_of(u32::MAX).is_err());
    }
}

/// A server's named threads: spawned one by one, joined together.
#[derive(Debug, Default)]
pub struct ThreadGroup {
    threads: Vec<(String, std::thread::JoinHandle<()>)>,
}

impl ThreadGroup {
    /// Start `body` on a thread called `name`.
    pub fn spawn(
        &mut self,
        name: String,
        body: impl FnOnce() + Send + 'static,
    ) -> Result<(), crate::ServerError> {
        match std::thread::Builder::new().name(name.clone()).spawn(body) {
            Ok(handle) => {
                self.threads.push((name, handle));
                Ok(())
            }
            Err(source) => Err(crate::ServerError::Thread { name, source }),
        }
    }

    /// Wait for every thread (the caller has told them to stop); a thread
    /// that panicked is reported on stderr, prefixed with `who`.
    pub fn join_all(&mut self, who: &str) {
        for (name, handle) in self.threads.drain(..) {
            if handle.join().is_err() {
                log::error!("{who}: thread {name} panicked");
            }
        }
    }
}
