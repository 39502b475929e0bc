//! Thread placement: CPU affinity, scheduling policy, nice, per-thread EEVDF
//! slice, and per-thread CPU time split into user and kernel.
//!
//! Every setter acts on the calling thread (those named `_of`: on the
//! thread given) and returns an [`Outcome`]:
//! applied (with the value read back from the kernel) or refused with the
//! errno reason. Nothing is silently ignored.

use crate::sys::cvt;
use std::io;
use std::time::Duration;

/// Result of one placement request.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "outcome", content = "detail", rename_all = "lowercase")]
pub enum Outcome {
    /// The kernel accepted it; the text is the value read back.
    Applied(String),
    /// The kernel refused it; the text is the reason (errno name and message).
    Refused(String),
}

impl Outcome {
    /// True when applied.
    pub fn is_applied(&self) -> bool {
        matches!(self, Outcome::Applied(_))
    }
}

impl std::fmt::Display for Outcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Outcome::Applied(s) => write!(f, "applied ({s})"),
            Outcome::Refused(s) => write!(f, "refused: {s}"),
        }
    }
}

/// Errno as "ENAME (message)".
pub fn errno_reason(e: &io::Error) -> String {
    let name = match e.raw_os_error() {
        Some(libc::EPERM) => "EPERM",
        Some(libc::EACCES) => "EACCES",
        Some(libc::EINVAL) => "EINVAL",
        Some(libc::ESRCH) => "ESRCH",
        Some(libc::E2BIG) => "E2BIG",
        Some(libc::EBUSY) => "EBUSY",
        Some(libc::ENOSYS) => "ENOSYS",
        Some(libc::EOPNOTSUPP) => "EOPNOTSUPP",
        Some(libc::ENOENT) => "ENOENT",
        Some(libc::EROFS) => "EROFS",
        Some(libc::ENODEV) => "ENODEV",
        Some(libc::EAFNOSUPPORT) => "EAFNOSUPPORT",
        Some(libc::ENOPROTOOPT) => "ENOPROTOOPT",
        _ => return e.to_string(),
    };
    format!("{name} ({e})")
}

fn refused(e: io::Error) -> Outcome {
    Outcome::Refused(errno_reason(&e))
}

/// Kernel thread id of the calling thread.
pub fn current_tid() -> i32 {
    // SAFETY: gettid has no arguments and cannot fail.
    unsafe { libc::gettid() }
}

/// Number of CPUs the kernel reports online.
pub fn online_cpus() -> usize {
    // SAFETY: sysconf with a constant name.
    let online = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
    online.max(1) as usize
}

/// CPUs the calling thread may run on.
pub fn affinity() -> io::Result<Vec<usize>> {
    affinity_of(0)
}

/// CPUs thread `tid` may run on (0: the calling thread).
pub fn affinity_of(tid: i32) -> io::Result<Vec<usize>> {
    // SAFETY: cpu_set_t is plain old data; all-zero is an empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: pointer and size describe a live cpu_set_t; tid names a
    // thread (0: the calling one), a wrong one is an error (ESRCH).
    cvt(unsafe { libc::sched_getaffinity(tid, std::mem::size_of::<libc::cpu_set_t>(), &mut set) })?;
    Ok((0..libc::CPU_SETSIZE as usize)
        // SAFETY: index is below CPU_SETSIZE.
        .filter(|&c| unsafe { libc::CPU_ISSET(c, &set) })
        .collect())
}

/// Pin the calling thread to `cpus`.
pub fn set_affinity(cpus: &[usize]) -> Outcome {
    set_affinity_of(0, cpus)
}

/// Pin thread `tid` (0: the calling thread) to `cpus`, e.g. a kernel
/// thread serving a testbed's device; needs the right to change it.
pub fn set_affinity_of(tid: i32, cpus: &[usize]) -> Outcome {
    if cpus.is_empty() {
        return Outcome::Refused("EINVAL (empty CPU list)".into());
    }
    // SAFETY: cpu_set_t is plain old data; all-zero is an empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    for &c in cpus {
        if c >= libc::CPU_SETSIZE as usize {
            return Outcome::Refused(format!("EINVAL (CPU {c} out of range)"));
        }
        // SAFETY: index checked against CPU_SETSIZE above.
        unsafe { libc::CPU_SET(c, &mut set) };
    }
    // SAFETY: pointer and size describe a live cpu_set_t; tid names a
    // thread (0: the calling one), a wrong one is an error (ESRCH).
    let result =
        cvt(unsafe { libc::sched_setaffinity(tid, std::mem::size_of::<libc::cpu_set_t>(), &set) });
    if let Err(error) = result {
        return refused(error);
    }
    match affinity_of(tid) {
        Ok(v) => Outcome::Applied(format!("cpus {v:?}")),
        Err(error) => Outcome::Applied(format!("read back failed: {error}")),
    }
}

/// Scheduling policy of a thread.
#[derive(Copy, Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Policy {
    /// SCHED_OTHER (EEVDF on 6.6+).
    Other,
    /// SCHED_BATCH.
    Batch,
    /// SCHED_IDLE.
    Idle,
    /// SCHED_FIFO with a real-time priority 1..=99.
    Fifo(u8),
    /// SCHED_RR with a real-time priority 1..=99.
    Rr(u8),
}

impl std::fmt::Display for Policy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Policy::Other => f.write_str("other"),
            Policy::Batch => f.write_str("batch"),
            Policy::Idle => f.write_str("idle"),
            Policy::Fifo(p) => write!(f, "fifo:{p}"),
            Policy::Rr(p) => write!(f, "rr:{p}"),
        }
    }
}

/// Text that is no [`Policy`].
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ParsePolicyError {
    /// Not one of the policy names.
    #[error("unknown policy {0:?} (other, batch, idle, fifo:N, rr:N)")]
    Unknown(String),
    /// `fifo:N` / `rr:N` with N outside 1..=99 or not a number.
    #[error("bad real-time priority {0:?} (1..=99)")]
    BadPriority(String),
}

impl std::str::FromStr for Policy {
    type Err = ParsePolicyError;
    /// `other`, `batch`, `idle`, `fifo:N`, `rr:N`.
    fn from_str(s: &str) -> Result<Self, ParsePolicyError> {
        let prio = |p: &str| -> Result<u8, ParsePolicyError> {
            p.parse::<u8>()
                .ok()
                .filter(|v| (1..=99).contains(v))
                .ok_or_else(|| ParsePolicyError::BadPriority(p.to_string()))
        };
        match s.split_once(':') {
            None => match s {
                "other" => Ok(Policy::Other),
                "batch" => Ok(Policy::Batch),
                "idle" => Ok(Policy::Idle),
                "fifo" => Ok(Policy::Fifo(1)),
                "rr" => Ok(Policy::Rr(1)),
                _ => Err(ParsePolicyError::Unknown(s.to_string())),
            },
            Some(("fifo", p)) => Ok(Policy::Fifo(prio(p)?)),
            Some(("rr", p)) => Ok(Policy::Rr(prio(p)?)),
            _ => Err(ParsePolicyError::Unknown(s.to_string())),
        }
    }
}

impl Policy {
    fn raw(self) -> (libc::c_int, libc::c_int) {
        match self {
            Policy::Other => (libc::SCHED_OTHER, 0),
            Policy::Batch => (libc::SCHED_BATCH, 0),
            Policy::Idle => (libc::SCHED_IDLE, 0),
            Policy::Fifo(p) => (libc::SCHED_FIFO, p as libc::c_int),
            Policy::Rr(p) => (libc::SCHED_RR, p as libc::c_int),
        }
    }
    /// True for the fair-class policies (other, batch, idle).
    pub fn is_fair(self) -> bool {
        matches!(self, Policy::Other | Policy::Batch | Policy::Idle)
    }
}

/// Size of the `struct sched_attr` we pass (version 0, 48 bytes).
const SCHED_ATTR_SIZE: u32 = std::mem::size_of::<libc::sched_attr>() as u32;

fn sched_getattr() -> io::Result<libc::sched_attr> {
    sched_getattr_of(0)
}

fn sched_getattr_of(tid: i32) -> io::Result<libc::sched_attr> {
    // SAFETY: sched_attr is plain old data; all-zero is valid.
    let mut attr: libc::sched_attr = unsafe { std::mem::zeroed() };
    // SAFETY: the buffer is a live sched_attr of the size we pass.
    cvt(unsafe {
        libc::syscall(
            libc::SYS_sched_getattr,
            tid,
            &mut attr as *mut libc::sched_attr,
            std::mem::size_of::<libc::sched_attr>() as libc::c_uint,
            0,
        )
    })?;
    Ok(attr)
}

/// Policy of the calling thread.
pub fn policy() -> io::Result<Policy> {
    let attr = sched_getattr()?;
    let prio = attr.sched_priority.min(99) as u8;
    Ok(match attr.sched_policy as libc::c_int {
        libc::SCHED_FIFO => Policy::Fifo(prio),
        libc::SCHED_RR => Policy::Rr(prio),
        libc::SCHED_BATCH => Policy::Batch,
        libc::SCHED_IDLE => Policy::Idle,
        _ => Policy::Other,
    })
}

/// Set the calling thread's policy (real-time ones need CAP_SYS_NICE or an RLIMIT_RTPRIO).
pub fn set_policy(p: Policy) -> Outcome {
    let (pol, prio) = p.raw();
    let param = libc::sched_param {
        sched_priority: prio,
    };
    // SAFETY: pid 0 = calling thread; param is a live sched_param.
    if let Err(error) = cvt(unsafe { libc::sched_setscheduler(0, pol, &param) }) {
        return refused(error);
    }
    match policy() {
        Ok(now) => Outcome::Applied(format!("policy {now}")),
        Err(error) => Outcome::Applied(format!("read back failed: {error}")),
    }
}

/// Nice value of the calling thread.
pub fn nice() -> io::Result<i32> {
    Ok(sched_getattr()?.sched_nice)
}

/// Set the calling thread's nice value (-20..=19; lowering needs CAP_SYS_NICE).
pub fn set_nice(n: i32) -> Outcome {
    // SAFETY: setpriority on our own thread id.
    let result =
        cvt(unsafe { libc::setpriority(libc::PRIO_PROCESS, current_tid() as libc::id_t, n) });
    if let Err(error) = result {
        return refused(error);
    }
    match nice() {
        Ok(v) => Outcome::Applied(format!("nice {v}")),
        Err(error) => Outcome::Applied(format!("read back failed: {error}")),
    }
}

/// Set the calling thread's timer slack (`PR_SET_TIMERSLACK`): how much
/// later than asked the kernel may end its timed sleeps and poll timeouts,
/// to merge wake-ups (50 µs by default for a normal thread). A short timed
/// wait (e.g. a receive-coalescing window of 100 µs) asks for a smaller
/// slack, or its length is mostly slack. At least 1 ns (0 would restore
/// the default); returns the value read back.
pub fn set_timer_slack(slack: Duration) -> Outcome {
    // prctl's unused arguments, passed as the unsigned longs it reads.
    const UNUSED: libc::c_ulong = 0;
    let ns = slack.as_nanos().clamp(1, u64::MAX as u128) as libc::c_ulong;
    // SAFETY: PR_SET_TIMERSLACK takes one integer argument and touches no
    // memory of ours.
    let set = unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, ns, UNUSED, UNUSED, UNUSED) };
    if let Err(error) = cvt(set) {
        return refused(error);
    }
    // SAFETY: PR_GET_TIMERSLACK takes no argument; it returns the slack.
    let read = unsafe { libc::prctl(libc::PR_GET_TIMERSLACK, UNUSED, UNUSED, UNUSED, UNUSED) };
    Outcome::Applied(format!("timer slack {read} ns"))
}

/// The calling thread's EEVDF slice (`sched_runtime` of a fair-class thread).
pub fn slice() -> io::Result<Duration> {
    Ok(Duration::from_nanos(sched_getattr()?.sched_runtime))
}

/// Ask for a custom EEVDF slice (`sched_setattr` with `sched_runtime`; the
/// kernel clamps to 100 µs..100 ms, so the read-back value is reported).
/// Keeps the thread's fair policy and nice value; refused for real-time threads.
pub fn set_slice(d: Duration) -> Outcome {
    set_slice_of(0, d)
}

/// [`set_slice`] for another thread `tid` (0: the calling thread), e.g. the
/// threads of an external proxy process; needs the right to change it.
pub fn set_slice_of(tid: i32, d: Duration) -> Outcome {
    let cur = match sched_getattr_of(tid) {
        Ok(attr) => attr,
        Err(error) => return refused(error),
    };
    let pol = cur.sched_policy as libc::c_int;
    if pol != libc::SCHED_OTHER && pol != libc::SCHED_BATCH && pol != libc::SCHED_IDLE {
        return Outcome::Refused("EINVAL (slice applies only to fair-class threads)".into());
    }
    let mut attr = cur;
    attr.size = SCHED_ATTR_SIZE;
    attr.sched_flags = 0;
    attr.sched_priority = 0;
    attr.sched_runtime = d.as_nanos().min(u64::MAX as u128) as u64;
    attr.sched_deadline = 0;
    attr.sched_period = 0;
    // SAFETY: tid names a thread (0 = calling thread); `a` is a live, fully
    // initialised sched_attr.
    let result = cvt(unsafe {
        libc::syscall(
            libc::SYS_sched_setattr,
            tid,
            &attr as *const libc::sched_attr,
            0,
        )
    });
    if let Err(error) = result {
        return refused(error);
    }
    match sched_getattr_of(tid).map(|attr| Duration::from_nanos(attr.sched_runtime)) {
        Ok(v) => Outcome::Applied(format!("slice {} us", v.as_micros())),
        Err(error) => Outcome::Applied(format!("read back failed: {error}")),
    }
}

/// What to apply to a thread; `None` fields are left alone.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Placement {
    /// CPUs to pin to.
    pub cpus: Option<Vec<usize>>,
    /// Scheduling policy.
    pub policy: Option<Policy>,
    /// Nice value (fair policies).
    pub nice: Option<i32>,
    /// EEVDF slice (fair policies).
    pub slice: Option<Duration>,
}

/// One line of a placement report.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct PlacementItem {
    /// Which knob ("affinity", "policy", "nice", "slice").
    pub what: String,
    /// What was asked.
    pub requested: String,
    /// What happened.
    pub result: Outcome,
}

impl Placement {
    /// Apply to the calling thread in the order policy, nice, slice, affinity.
    pub fn apply(&self) -> Vec<PlacementItem> {
        let mut out = Vec::new();
        if let Some(policy) = self.policy {
            out.push(PlacementItem {
                what: "policy".into(),
                requested: policy.to_string(),
                result: set_policy(policy),
            });
        }
        if let Some(nice) = self.nice {
            out.push(PlacementItem {
                what: "nice".into(),
                requested: nice.to_string(),
                result: set_nice(nice),
            });
        }
        if let Some(slice) = self.slice {
            out.push(PlacementItem {
                what: "slice".into(),
                requested: format!("{} us", slice.as_micros()),
                result: set_slice(slice),
            });
        }
        if let Some(cpus) = &self.cpus {
            out.push(PlacementItem {
                what: "affinity".into(),
                requested: format!("{cpus:?}"),
                result: set_affinity(cpus),
            });
        }
        out
    }
}

/// Snapshot of the calling thread's placement.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct CurrentPlacement {
    /// Kernel thread id.
    pub tid: i32,
    /// Allowed CPUs.
    pub cpus: Vec<usize>,
    /// Policy.
    pub policy: Policy,
    /// Nice value.
    pub nice: i32,
    /// EEVDF slice in nanoseconds (fair policies).
    pub slice_ns: u64,
}

/// Read the calling thread's affinity, policy, nice and slice.
pub fn current() -> io::Result<CurrentPlacement> {
    let attr = sched_getattr()?;
    Ok(CurrentPlacement {
        tid: current_tid(),
        cpus: affinity()?,
        policy: policy()?,
        nice: attr.sched_nice,
        slice_ns: attr.sched_runtime,
    })
}

/// CPU time split into user and kernel (system) time.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct CpuTime {
    /// Time spent in user mode, nanoseconds.
    pub user_ns: u64,
    /// Time spent in the kernel, nanoseconds.
    pub system_ns: u64,
}

impl CpuTime {
    /// User plus system.
    pub fn total_ns(&self) -> u64 {
        self.user_ns + self.system_ns
    }
    /// Growth from `earlier` to `self` (saturating).
    pub fn since(&self, earlier: &CpuTime) -> CpuTime {
        CpuTime {
            user_ns: self.user_ns.saturating_sub(earlier.user_ns),
            system_ns: self.system_ns.saturating_sub(earlier.system_ns),
        }
    }
    /// User plus system, in seconds.
    pub fn total_s(&self) -> f64 {
        self.total_ns() as f64 / 1e9
    }
}

impl std::ops::Add for CpuTime {
    type Output = CpuTime;
    fn add(self, other: CpuTime) -> CpuTime {
        CpuTime {
            user_ns: self.user_ns + other.user_ns,
            system_ns: self.system_ns + other.system_ns,
        }
    }
}

fn rusage(who: libc::c_int) -> io::Result<CpuTime> {
    // SAFETY: rusage is plain old data; all-zero is valid.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `r` is a live, writable rusage.
    cvt(unsafe { libc::getrusage(who, &mut usage) })?;
    let nanos = |t: libc::timeval| t.tv_sec as u64 * 1_000_000_000 + t.tv_usec as u64 * 1000;
    Ok(CpuTime {
        user_ns: nanos(usage.ru_utime),
        system_ns: nanos(usage.ru_stime),
    })
}

/// CPU time of the calling thread (`getrusage(RUSAGE_THREAD)`, microsecond
/// resolution; the kernel splits the exact runtime by its tick samples).
pub fn thread_cpu_time() -> io::Result<CpuTime> {
    const RUSAGE_THREAD: libc::c_int = 1;
    rusage(RUSAGE_THREAD)
}

/// CPU time of the whole process (all threads).
pub fn process_cpu_time() -> io::Result<CpuTime> {
    rusage(libc::RUSAGE_SELF)
}

/// CPU time of thread `tid` of this process, from `/proc/self/task/<tid>/stat`
/// (clock-tick resolution, usually 10 ms).
pub fn thread_cpu_time_of(tid: i32) -> io::Result<CpuTime> {
    let text = std::fs::read_to_string(format!("/proc/self/task/{tid}/stat"))?;
    parse_stat_cpu(&text, clock_ticks())
}

fn clock_ticks() -> u64 {
    // SAFETY: sysconf with a constant name.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if ticks > 0 {
        ticks as u64
    } else {
        100
    }
}

/// Parse utime/stime (fields 14 and 15) of a `/proc/.../stat` line.
pub fn parse_stat_cpu(stat: &str, ticks_per_sec: u64) -> io::Result<CpuTime> {
    // The command name (field 2) may contain spaces: split after its ')'.
    let rest = stat
        .rsplit_once(')')
        .map(|(_, r)| r)
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "stat: no ')'"))?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // rest starts at field 3 (state); utime is field 14 → index 11.
    let get = |i: usize| -> io::Result<u64> {
        fields
            .get(i)
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "stat: short line"))
    };
    let per = 1_000_000_000 / ticks_per_sec.max(1);
    Ok(CpuTime {
        user_ns: get(11)? * per,
        system_ns: get(12)? * per,
    })
}

/// Precise total CPU time of the calling thread (`CLOCK_THREAD_CPUTIME_ID`).
pub fn thread_cpu_total() -> Duration {
    let mut spec = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a live timespec; the clock id is constant.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut spec) };
    Duration::new(spec.tv_sec as u64, spec.tv_nsec as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timer_slack_is_set_for_the_calling_thread_and_read_back() {
        let (ours, zero) = std::thread::spawn(|| {
            (
                set_timer_slack(Duration::from_micros(3)),
                set_timer_slack(Duration::ZERO),
            )
        })
        .join()
        .unwrap();
        assert_eq!(ours, Outcome::Applied("timer slack 3000 ns".into()));
        // 0 would mean "the default" to the kernel: the least asked is 1 ns.
        assert_eq!(zero, Outcome::Applied("timer slack 1 ns".into()));
    }

    #[test]
    fn parses_stat() {
        let s = "123 (my (odd) name) S 1 2 3 4 5 6 7 8 9 10 250 30 0 0 20 0 1 0";
        let c = parse_stat_cpu(s, 100).unwrap();
        assert_eq!(c.user_ns, 2_500_000_000);
        assert_eq!(c.system_ns, 300_000_000);
        assert!(parse_stat_cpu("nonsense", 100).is_err());
    }

    #[test]
    fn policy_parse() {
        assert_eq!("fifo:10".parse::<Policy>().unwrap(), Policy::Fifo(10));
        assert_eq!("other".parse::<Policy>().unwrap(), Policy::Other);
        assert!("fifo:0".parse::<Policy>().is_err());
        assert!("fifo:100".parse::<Policy>().is_err());
        assert!("deadline".parse::<Policy>().is_err());
    }
}
