//! Thread placement against the real kernel (tests run as root).

use ringway_io::thread::{self, Outcome, Placement, Policy};
use std::time::Duration;

fn on_thread<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    std::thread::spawn(f).join().unwrap()
}

#[test]
fn affinity_applied_and_read_back() {
    on_thread(|| {
        let all = thread::affinity().unwrap();
        assert!(!all.is_empty());
        let one = *all.last().unwrap();
        let r = thread::set_affinity(&[one]);
        assert!(r.is_applied(), "{r}");
        assert_eq!(thread::affinity().unwrap(), vec![one]);
        assert!(thread::set_affinity(&all).is_applied());
        assert_eq!(thread::affinity().unwrap(), all);
        // Nonexistent CPU: refused with a reason.
        match thread::set_affinity(&[4000]) {
            Outcome::Refused(r) => assert!(r.contains("EINVAL"), "{r}"),
            o => panic!("unexpected {o}"),
        }
        assert!(!thread::set_affinity(&[]).is_applied());
    });
}

#[test]
fn another_threads_affinity_is_set_and_read_back() {
    let all = thread::affinity().unwrap();
    let one = *all.last().unwrap();
    if all.len() < 2 {
        ringway_io::testing::skip("one CPU: a pin would not change the mask");
        return;
    }
    let (tid_tx, tid_rx) = std::sync::mpsc::channel();
    let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
    let other = std::thread::spawn(move || {
        tid_tx.send(thread::current_tid()).unwrap();
        done_rx.recv().unwrap();
        thread::affinity().unwrap()
    });
    let tid = tid_rx.recv().unwrap();
    let r = thread::set_affinity_of(tid, &[one]);
    assert!(r.is_applied(), "{r}");
    assert_eq!(thread::affinity_of(tid).unwrap(), vec![one]);
    // The calling thread is left as it was.
    assert_eq!(thread::affinity().unwrap(), all);
    done_tx.send(()).unwrap();
    // The other thread sees its own new mask.
    assert_eq!(other.join().unwrap(), vec![one]);
    // A thread that does not exist: refused with the reason.
    match thread::set_affinity_of(i32::MAX, &[one]) {
        Outcome::Refused(r) => assert!(r.contains("ESRCH"), "{r}"),
        o => panic!("unexpected {o}"),
    }
}

#[test]
fn slice_applied_or_refused_with_reason() {
    on_thread(|| {
        match thread::set_slice(Duration::from_millis(3)) {
            Outcome::Applied(s) => {
                assert_eq!(thread::slice().unwrap(), Duration::from_millis(3), "{s}");
                // The kernel clamps to 100 us .. 100 ms; read-back shows it.
                assert!(thread::set_slice(Duration::from_micros(10)).is_applied());
                assert_eq!(thread::slice().unwrap(), Duration::from_micros(100));
                assert!(thread::set_slice(Duration::from_secs(1)).is_applied());
                assert_eq!(thread::slice().unwrap(), Duration::from_millis(100));
            }
            Outcome::Refused(r) => assert!(!r.is_empty()),
        }
        // Nice is preserved by set_slice.
        assert!(thread::set_nice(5).is_applied());
        let _ = thread::set_slice(Duration::from_millis(2));
        assert_eq!(thread::nice().unwrap(), 5);
    });
}

#[test]
fn fifo_applies_as_root_and_restores() {
    on_thread(|| {
        let r = thread::set_policy(Policy::Fifo(1));
        assert!(r.is_applied(), "{r}");
        assert_eq!(thread::policy().unwrap(), Policy::Fifo(1));
        // A slice makes no sense for a real-time thread: refused with a reason.
        match thread::set_slice(Duration::from_millis(1)) {
            Outcome::Refused(r) => assert!(r.contains("fair"), "{r}"),
            o => panic!("unexpected {o}"),
        }
        assert!(thread::set_policy(Policy::Other).is_applied());
        assert_eq!(thread::policy().unwrap(), Policy::Other);
    });
}

#[test]
fn fifo_refused_without_cap_sys_nice() {
    on_thread(|| {
        // Drop to an unprivileged uid on this thread only (setresuid syscall is per thread).
        // SAFETY: raw syscall changes only this thread's credentials; the thread ends afterwards.
        let rc = unsafe { libc::syscall(libc::SYS_setresuid, 65534, 65534, 65534) };
        assert_eq!(rc, 0);
        match thread::set_policy(Policy::Fifo(1)) {
            Outcome::Refused(r) => assert!(r.contains("EPERM"), "{r}"),
            o => panic!("unexpected {o}"),
        }
        assert_eq!(thread::policy().unwrap(), Policy::Other);
    });
}

#[test]
fn placement_report_lists_each_item() {
    on_thread(|| {
        let cpus = thread::affinity().unwrap();
        let p = Placement {
            cpus: Some(vec![cpus[0]]),
            policy: Some(Policy::Other),
            nice: Some(3),
            slice: Some(Duration::from_millis(4)),
        };
        let rep = p.apply();
        assert_eq!(rep.len(), 4);
        assert!(rep.iter().all(|i| i.result.is_applied()), "{rep:?}");
        let cur = thread::current().unwrap();
        assert_eq!(cur.cpus, vec![cpus[0]]);
        assert_eq!(cur.nice, 3);
        assert_eq!(cur.slice_ns, 4_000_000);
        assert_eq!(cur.tid, thread::current_tid());
    });
}

#[test]
fn cpu_time_splits_user_and_kernel() {
    on_thread(|| {
        let t0 = thread::thread_cpu_time().unwrap();
        // Kernel-heavy: many small syscalls.
        let s = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let dst = s.local_addr().unwrap();
        s.set_nonblocking(true).unwrap();
        let mut buf = [0u8; 64];
        // Run until this thread has used 200 ms of CPU (bounded by 10 s of wall time),
        // so the tick-sampled user/system split has enough samples even under load.
        let (start, cpu0) = (std::time::Instant::now(), thread::thread_cpu_total());
        while thread::thread_cpu_total() - cpu0 < Duration::from_millis(200)
            && start.elapsed() < Duration::from_secs(10)
        {
            for _ in 0..100 {
                s.send_to(&buf[..32], dst).unwrap();
                let _ = s.recv_from(&mut buf);
            }
        }
        let t1 = thread::thread_cpu_time().unwrap();
        let kernel = t1.since(&t0);
        assert!(kernel.system_ns > 0, "{kernel:?}");
        // User-heavy: pure arithmetic.
        let mut x = 1u64;
        let (start, cpu0) = (std::time::Instant::now(), thread::thread_cpu_total());
        while thread::thread_cpu_total() - cpu0 < Duration::from_millis(200)
            && start.elapsed() < Duration::from_secs(10)
        {
            for i in 0..10_000u64 {
                x = x.wrapping_mul(6364136223846793005).wrapping_add(i);
            }
        }
        std::hint::black_box(x);
        let user = thread::thread_cpu_time().unwrap().since(&t1);
        assert!(user.user_ns > user.system_ns, "{user:?}");
        assert!(kernel.system_ns > kernel.user_ns, "{kernel:?}");
        let of = thread::thread_cpu_time_of(thread::current_tid()).unwrap();
        assert!(of.total_ns() > 0);
        assert!(thread::process_cpu_time().unwrap().total_ns() >= t1.total_ns());
    });
}
