//! A kernel that refuses io_uring (here: a seccomp filter on this test's
//! thread makes `io_uring_setup` fail with EPERM, as a container runtime's
//! profile or `kernel.io_uring_disabled=2` would) gets a clear "not
//! available" everywhere instead of a failure. One test per process: the
//! availability probe is cached per process.

use ringway_io::{open_backend, open_udp, BackendKind, SocketConfig};

/// Make `io_uring_setup` fail with EPERM on this thread (and threads it spawns).
fn deny_io_uring_on_this_thread() {
    let nr = libc::SYS_io_uring_setup as u32;
    let mut prog = [
        // A = seccomp_data.nr
        libc::sock_filter {
            code: (libc::BPF_LD | libc::BPF_W | libc::BPF_ABS) as u16,
            jt: 0,
            jf: 0,
            k: 0,
        },
        libc::sock_filter {
            code: (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16,
            jt: 0,
            jf: 1,
            k: nr,
        },
        libc::sock_filter {
            code: (libc::BPF_RET | libc::BPF_K) as u16,
            jt: 0,
            jf: 0,
            k: libc::SECCOMP_RET_ERRNO | libc::EPERM as u32,
        },
        libc::sock_filter {
            code: (libc::BPF_RET | libc::BPF_K) as u16,
            jt: 0,
            jf: 0,
            k: libc::SECCOMP_RET_ALLOW,
        },
    ];
    let fprog = libc::sock_fprog {
        len: prog.len() as u16,
        filter: prog.as_mut_ptr(),
    };
    // SAFETY: prctl with integer arguments only.
    let rc = unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) };
    assert_eq!(rc, 0);
    // SAFETY: `fprog` points at a live, well-formed filter for the duration of
    // the call (the kernel copies it).
    let rc = unsafe {
        libc::prctl(
            libc::PR_SET_SECCOMP,
            libc::SECCOMP_MODE_FILTER,
            &fprog as *const libc::sock_fprog,
            0,
            0,
        )
    };
    assert_eq!(rc, 0, "{}", std::io::Error::last_os_error());
}

#[test]
fn refused_io_uring_is_reported_not_available() {
    // Everything on a fresh thread: the filter stays with it.
    std::thread::spawn(|| {
        deny_io_uring_on_this_thread();
        let why = BackendKind::Uring.availability().unwrap_err();
        assert!(why.reason.contains("EPERM"), "{why}");
        assert_eq!(why.kind, BackendKind::Uring);
        assert_eq!(why.errno, Some(libc::EPERM));
        assert_eq!(
            BackendKind::usable(),
            [BackendKind::Socket, BackendKind::Mmsg]
        );
        // Parsing still knows the name; opening says why it cannot.
        let k: BackendKind = "uring".parse().unwrap();
        let (s, _) = open_udp(&SocketConfig::new("127.0.0.1:0".parse().unwrap())).unwrap();
        let err = match open_backend(k, s) {
            Ok(_) => panic!("uring opened with io_uring refused"),
            Err(e) => e,
        };
        assert_eq!(err.kind(), std::io::ErrorKind::Unsupported);
        assert!(
            err.to_string()
                .starts_with("uring backend not available: io_uring_setup: EPERM"),
            "{err}"
        );
        // The other backends are unaffected.
        let (s, _) = open_udp(&SocketConfig::new("127.0.0.1:0".parse().unwrap())).unwrap();
        assert!(open_backend(BackendKind::Mmsg, s).is_ok());
        // bench io leaves it out.
        let rows = ringway_io::bench::run_all(&[64], 0.05, 8, false).unwrap();
        let paths: Vec<&str> = rows.iter().map(|r| r.path.as_str()).collect();
        assert_eq!(paths, ["socket", "mmsg"]);
        // doctor states it.
        let rep = ringway_io::doctor::run();
        let c = rep.check("backend uring").unwrap();
        assert!(!c.ok);
        assert!(
            c.detail.starts_with("not available: io_uring_setup: EPERM"),
            "{}",
            c.detail
        );
        assert!(rep.check("backend mmsg").unwrap().ok);
    })
    .join()
    .unwrap();
}
