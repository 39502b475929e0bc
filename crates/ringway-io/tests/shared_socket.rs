//! Several backends on one socket (the shared receive model): exclusive
//! wake-up (review D5) and TX stamp keys per backend (review D6), against
//! the real kernel over loopback. Counts, never timings.

use ringway_io::testing::skip;
use ringway_io::{open_shared, open_udp, BackendKind, RxBatch, SocketConfig, TxBatch};
use std::net::UdpSocket;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const WORKERS: usize = 4;
const DATAGRAMS: u64 = 40;

fn shared_socket(stamps: bool) -> UdpSocket {
    let mut config = SocketConfig::new("127.0.0.1:0".parse().unwrap());
    config.tx_timestamps = stamps;
    config.rx_timestamps = true;
    open_udp(&config).unwrap().0
}

/// What a worker thread tells the test (atomics: no lock a worker could
/// sleep on).
#[derive(Default)]
struct Board {
    received: AtomicU64,
    exited: AtomicU64,
    tids: Mutex<Vec<i32>>,
    /// Per worker: wake-ups and idle wake-ups, as of its last return.
    wakeups: [AtomicU64; WORKERS],
    idle: [AtomicU64; WORKERS],
}

/// The kernel's name for where thread `tid` sleeps ("" or "0" when running).
fn wchan(tid: i32) -> String {
    std::fs::read_to_string(format!("/proc/self/task/{tid}/wchan")).unwrap_or_default()
}

/// The kernel's count of times thread `tid` gave up the CPU to wait.
fn voluntary_switches(tid: i32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/self/task/{tid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))
        .and_then(|v| v.trim().parse().ok())
        .expect("voluntary_ctxt_switches in /proc status")
}

/// Every worker thread is asleep in its wait for a datagram (poll or epoll).
fn all_waiting(tids: &[i32]) -> bool {
    tids.iter().all(|&tid| wchan(tid).contains("poll"))
}

fn wakeups_per_datagram(kind: BackendKind) {
    if let Err(e) = kind.availability() {
        skip(format!("{kind}: {e}"));
        return;
    }
    if !std::path::Path::new("/proc/self/wchan").exists() {
        skip("no /proc/<pid>/wchan to tell that the workers wait");
        return;
    }
    let socket = shared_socket(false);
    let dst = socket.local_addr().unwrap();
    let ios = open_shared(kind, socket, WORKERS).unwrap();
    let board = Arc::new(Board::default());
    let stop = Arc::new(AtomicBool::new(false));
    let mut threads = Vec::new();
    for (index, mut io) in ios.into_iter().enumerate() {
        let board = board.clone();
        let stop = stop.clone();
        threads.push(std::thread::spawn(move || {
            // SAFETY: gettid has no preconditions.
            board.tids.lock().unwrap().push(unsafe { libc::gettid() });
            let mut rx = RxBatch::new(8, 2048);
            while !stop.load(Ordering::SeqCst) {
                let got = io
                    .recv_batch(&mut rx, Some(Duration::from_secs(60)))
                    .unwrap();
                let stats = io.stats();
                board.wakeups[index].store(stats.rx_wakeups, Ordering::SeqCst);
                board.idle[index].store(stats.rx_idle_wakeups, Ordering::SeqCst);
                board.received.fetch_add(got as u64, Ordering::SeqCst);
            }
            board.exited.fetch_add(1, Ordering::SeqCst);
        }));
    }
    let sender = UdpSocket::bind("127.0.0.1:0").unwrap();
    let wait_until = |what: &str, cond: &dyn Fn() -> bool| {
        let deadline = Instant::now() + Duration::from_secs(60);
        while !cond() {
            assert!(
                Instant::now() < deadline,
                "{kind}: timed out waiting for {what}"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
    };
    wait_until("the workers", &|| {
        board.tids.lock().unwrap().len() == WORKERS
    });
    let tids = board.tids.lock().unwrap().clone();
    wait_until("all workers waiting", &|| all_waiting(&tids));
    let switches_before: u64 = tids.iter().map(|&t| voluntary_switches(t)).sum();
    for i in 0..DATAGRAMS {
        // Only once every worker sleeps in its wait does a datagram show
        // how many of them it wakes.
        wait_until("all workers waiting", &|| all_waiting(&tids));
        sender.send_to(&i.to_be_bytes(), dst).unwrap();
        wait_until("the datagram", &|| {
            board.received.load(Ordering::SeqCst) == i + 1
        });
    }
    wait_until("all workers waiting", &|| all_waiting(&tids));
    // Every worker is back asleep, so each has published its tallies.
    let switches = tids.iter().map(|&t| voluntary_switches(t)).sum::<u64>() - switches_before;
    let sum = |counts: &[AtomicU64; WORKERS]| {
        counts.iter().map(|c| c.load(Ordering::SeqCst)).sum::<u64>()
    };
    let (woken, idle) = (sum(&board.wakeups), sum(&board.idle));
    // Stop: one datagram per worker, each after the previous worker left
    // (a datagram wakes one waiter).
    stop.store(true, Ordering::SeqCst);
    for n in 1..=WORKERS as u64 {
        sender.send_to(b"stop", dst).unwrap();
        wait_until("a worker to stop", &|| {
            board.exited.load(Ordering::SeqCst) >= n
        });
    }
    for t in threads {
        t.join().unwrap();
    }
    eprintln!(
        "{kind}: {DATAGRAMS} datagrams, {woken} wake-ups ({idle} idle), \
         {switches} voluntary context switches of {WORKERS} workers"
    );
    assert_eq!(
        idle, 0,
        "{kind}: idle workers were woken for datagrams another worker took"
    );
    assert_eq!(
        woken, DATAGRAMS,
        "{kind}: one wake-up per datagram with {WORKERS} idle workers"
    );
    // The kernel's own count: a worker sleeps once per wake-up. A herd
    // (every waiter woken, all but one going back to sleep inside the
    // kernel) would show WORKERS switches per datagram.
    assert!(
        switches <= DATAGRAMS + DATAGRAMS / 2,
        "{kind}: {switches} voluntary context switches for {DATAGRAMS} datagrams: \
         idle workers are woken per datagram"
    );
}

/// Review D5: with WORKERS idle backends on one socket, a datagram wakes
/// one of them, not all.
#[test]
fn one_idle_worker_woken_per_datagram_mmsg() {
    wakeups_per_datagram(BackendKind::Mmsg);
}

#[test]
fn one_idle_worker_woken_per_datagram_socket() {
    wakeups_per_datagram(BackendKind::Socket);
}

/// Review D6: two backends on one socket send stamped datagrams in turn;
/// each gets back exactly the stamps of its own datagrams, whichever of
/// them reads the error queue.
#[test]
fn tx_stamps_reach_the_backend_that_sent() {
    if !ringway_io::per_datagram_stamp_keys() {
        skip("kernel without SCM_TS_OPT_ID (Linux 6.13+): shared-socket stamps are off there");
        return;
    }
    for kind in BackendKind::usable() {
        let socket = shared_socket(true);
        let mut ios = open_shared(kind, socket, 2).unwrap();
        let peer = UdpSocket::bind("127.0.0.1:0").unwrap();
        let dst = peer.local_addr().unwrap();
        let mut tx = TxBatch::new(4, 64);
        let rounds = 20u64;
        // Interleave: worker 0, worker 1, worker 0, ... each one stamped
        // datagram (tag = worker * 1000 + round) plus one unstamped.
        for round in 0..rounds {
            for (w, io) in ios.iter_mut().enumerate() {
                tx.clear();
                tx.push(dst, b"plain").unwrap();
                tx.push(dst, b"stamped").unwrap();
                tx.request_stamp(1, w as u64 * 1000 + round);
                assert_eq!(io.send_batch(&tx).unwrap(), 2);
            }
        }
        // Worker 1 drains the error queue first (it takes worker 0's
        // stamps off the socket), then both collect theirs.
        let mut got: [Vec<u64>; 2] = [Vec::new(), Vec::new()];
        let deadline = Instant::now() + Duration::from_secs(10);
        while got.iter().map(Vec::len).sum::<usize>() < 2 * rounds as usize {
            assert!(Instant::now() < deadline, "{kind}: stamps missing: {got:?}");
            for w in [1, 0] {
                let mut stamps = Vec::new();
                ios[w].poll_tx_stamps(&mut stamps).unwrap();
                for s in stamps {
                    assert!(s.kernel_tx >= s.app_tx, "{kind}: {s:?}");
                    got[w].push(s.tag);
                }
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        for (w, tags) in got.iter().enumerate() {
            let want: Vec<u64> = (0..rounds).map(|r| w as u64 * 1000 + r).collect();
            assert_eq!(tags, &want, "{kind}: worker {w}");
        }
        for io in &ios {
            assert_eq!(io.stats().tx_stamps_lost, 0, "{kind}");
        }
    }
}

/// The epoll instances of this process that have descriptor `fd`
/// registered, with the registered event mask of each (from
/// /proc/self/fdinfo: `tfd: FD events: MASK ...`).
fn epoll_registrations(fd: i32) -> Vec<u32> {
    let mut masks = Vec::new();
    for entry in std::fs::read_dir("/proc/self/fd").unwrap().flatten() {
        let is_epoll = std::fs::read_link(entry.path())
            .is_ok_and(|target| target.to_string_lossy().contains("eventpoll"));
        if !is_epoll {
            continue;
        }
        let info_path = format!("/proc/self/fdinfo/{}", entry.file_name().to_string_lossy());
        let info = std::fs::read_to_string(info_path).unwrap_or_default();
        for line in info.lines() {
            let words: Vec<&str> = line.split_whitespace().collect();
            if words.len() >= 4 && words[0] == "tfd:" && words[1] == fd.to_string() {
                masks.extend(u32::from_str_radix(words[3], 16).ok());
            }
        }
    }
    masks
}

/// A backend's socket is on no epoll instance while the backend is not
/// waiting: an entry on a socket's wait queue is called back on every
/// datagram that arrives and every send whose buffer space comes back,
/// in the sender's kernel time, waiting or not (the SFU engine's CPU per
/// packet rose ~10 % with its clients' sockets registered for good). A
/// backend alone on its socket waits with ppoll; one of several on a
/// shared socket registers it `EPOLLEXCLUSIVE` for the length of a wait
/// (seen here while it waits) and takes it off after.
fn registered_only_while_waiting(kind: BackendKind) {
    if let Err(e) = kind.availability() {
        skip(format!("{kind}: {e}"));
        return;
    }
    // Alone on its socket: waits (and times out) without an epoll entry.
    let mut alone = ringway_io::open_backend(kind, shared_socket(false)).unwrap();
    let mut rx = RxBatch::new(8, 2048);
    assert_eq!(
        alone
            .recv_batch(&mut rx, Some(Duration::from_millis(20)))
            .unwrap(),
        0
    );
    assert_eq!(
        epoll_registrations(alone.raw_fd()),
        Vec::<u32>::new(),
        "{kind}: a backend alone on its socket"
    );
    // Two on one socket: backend 0 waits in a thread.
    let socket = shared_socket(false);
    let dst = socket.local_addr().unwrap();
    let mut ios = open_shared(kind, socket, 2).unwrap();
    let mut waiter = ios.remove(0);
    let fd = waiter.raw_fd();
    let thread = std::thread::spawn(move || {
        let mut rx = RxBatch::new(8, 2048);
        let got = waiter
            .recv_batch(&mut rx, Some(Duration::from_secs(20)))
            .unwrap();
        (waiter, got)
    });
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut during = Vec::new();
    while during.is_empty() && Instant::now() < deadline {
        during = epoll_registrations(fd);
        std::thread::sleep(Duration::from_millis(1));
    }
    UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .send_to(b"wake", dst)
        .unwrap();
    let (waiter, got) = thread.join().unwrap();
    assert_eq!(got, 1, "{kind}: the waiter got the datagram");
    let exclusive_input = (libc::EPOLLIN | libc::EPOLLEXCLUSIVE) as u32;
    assert!(
        during.len() == 1 && during[0] & exclusive_input == exclusive_input,
        "{kind}: registered once, exclusively, while it waits: {during:x?}"
    );
    assert_eq!(
        epoll_registrations(waiter.raw_fd()),
        Vec::<u32>::new(),
        "{kind}: a shared socket's waiter after its wait"
    );
    assert_eq!(
        epoll_registrations(ios[0].raw_fd()),
        Vec::<u32>::new(),
        "{kind}: a shared socket's backend that never waited"
    );
}

#[test]
fn socket_registered_only_while_waiting_mmsg() {
    registered_only_while_waiting(BackendKind::Mmsg);
}

#[test]
fn socket_registered_only_while_waiting_socket() {
    registered_only_while_waiting(BackendKind::Socket);
}
