//! The typed errors of the public API: what each displays (the text the
//! binary prints) and what a caller can match on.

use ringway_io::thread::{ParsePolicyError, Policy};
use ringway_io::{
    open_backend, BackendKind, BackendUnavailable, NeedsInterface, ParseBackendError,
};
use std::io;
use std::net::UdpSocket;

#[test]
fn backend_unavailable_displays_kind_and_reason() {
    let e = BackendUnavailable::new(BackendKind::Uring, "io_uring_setup: EPERM (denied)")
        .with_errno(Some(libc::EPERM));
    assert_eq!(
        e.to_string(),
        "uring backend not available: io_uring_setup: EPERM (denied)"
    );
    assert_eq!(e.kind, BackendKind::Uring);
    assert_eq!(e.errno, Some(libc::EPERM));
    // As an io::Error (what open_uring returns): Unsupported, same text,
    // and the typed error is still there for a caller that looks.
    let io: io::Error = e.clone().into();
    assert_eq!(io.kind(), io::ErrorKind::Unsupported);
    assert_eq!(io.to_string(), e.to_string());
    assert_eq!(
        io.get_ref()
            .and_then(|x| x.downcast_ref::<BackendUnavailable>()),
        Some(&e)
    );
    let x = BackendUnavailable::new(BackendKind::Xdp, "socket(AF_XDP) refused: x");
    assert_eq!(x.errno, None);
    assert_eq!(
        x.to_string(),
        "xdp backend not available: socket(AF_XDP) refused: x"
    );
}

#[test]
fn parse_backend_error_names_the_input_and_the_choices() {
    let e = "epoll".parse::<BackendKind>().unwrap_err();
    assert_eq!(
        e,
        ParseBackendError {
            name: "epoll".into()
        }
    );
    assert_eq!(
        e.to_string(),
        r#"unknown backend "epoll" (known: socket, mmsg, uring, xdp)"#
    );
    for k in BackendKind::EVERY {
        assert_eq!(k.name().parse::<BackendKind>().unwrap(), *k);
    }
}

#[test]
fn parse_policy_errors() {
    assert_eq!("fifo:5".parse::<Policy>().unwrap(), Policy::Fifo(5));
    assert_eq!("rr".parse::<Policy>().unwrap(), Policy::Rr(1));
    let e = "deadline".parse::<Policy>().unwrap_err();
    assert_eq!(e, ParsePolicyError::Unknown("deadline".into()));
    assert_eq!(
        e.to_string(),
        r#"unknown policy "deadline" (other, batch, idle, fifo:N, rr:N)"#
    );
    let e = "idle:3".parse::<Policy>().unwrap_err();
    assert_eq!(e, ParsePolicyError::Unknown("idle:3".into()));
    for p in ["0", "100", "x", ""] {
        let e = format!("fifo:{p}").parse::<Policy>().unwrap_err();
        assert_eq!(e, ParsePolicyError::BadPriority(p.into()));
        assert_eq!(
            e.to_string(),
            format!("bad real-time priority {p:?} (1..=99)")
        );
    }
}

#[test]
fn open_backend_on_an_interface_backend_names_what_is_missing() {
    let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
    let e = open_backend(BackendKind::Xdp, sock).err().unwrap();
    assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
    assert_eq!(
        e.to_string(),
        "xdp backend needs an interface (open it with ringway_io::open_xdp)"
    );
    // The library names no command-line flag; the binary adds its own.
    assert!(!e.to_string().contains("--"), "{e}");
    assert_eq!(
        e.get_ref().and_then(|x| x.downcast_ref::<NeedsInterface>()),
        Some(&NeedsInterface {
            kind: BackendKind::Xdp
        })
    );
}
