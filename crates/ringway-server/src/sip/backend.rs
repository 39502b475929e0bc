//! The workers' I/O as the server opens it: sockets of the receive model
//! wrapped in the configured socket backend, or the AF_XDP backend on an
//! interface ([`Io::Xdp`]), which falls back to mmsg — with the reason
//! logged and kept for the summary — when the kernel will not run it.
//!
//! With xdp, the one worker owns the XSK rings of the interface's queue 0;
//! the XDP program steers only UDP datagrams for the listen address and
//! port into them and passes everything else to the kernel (ARP, ICMP,
//! other ports and addresses, IP fragments: a fragmented SIP message is
//! reassembled by the kernel and read from the companion socket). The
//! companion UDP socket stays bound to the listen address: the timer and
//! store threads send through it (mmsg), so the kernel never answers our
//! port with ICMP port unreachable.
//!
//! An interface with more than one receive queue is refused (fallback to
//! mmsg, with the reason): the NIC's hashing (RSS) spreads the calls' flows
//! over its queues, and the one worker's socket on queue 0 would see only
//! that queue's share; the rest would miss the XSKMAP and take the kernel
//! path to the companion socket, a slower path than mmsg's. A socket and a
//! worker per queue would need the workers to share the transaction and
//! dialog state that one worker keeps today. Until then: one queue
//! (`ethtool -L IFACE combined 1`), or mmsg.

use super::sockets::open_sockets;
use super::{RxModel, SipServerConfig};
use crate::ServerError;
use ringway_io::{
    open_backend, open_xdp_with_socket, xdp_rx_queues, BackendKind, BatchIo, Io, XdpInterface,
};
use serde::Serialize;
use std::net::{SocketAddr, UdpSocket};

/// The backend the workers run on, as opened.
#[derive(Clone, Debug, Serialize)]
pub struct IoInUse {
    /// The backend (mmsg after a fallback from xdp).
    pub backend: BackendKind,
    /// The backend and its modes (e.g. "xdp (native XDP, copy mode, ...)").
    pub description: String,
    /// Why the configured xdp backend did not start (null: it did, or
    /// another backend was configured).
    pub fallback: Option<String>,
}

/// What [`open`] opened.
pub(super) struct OpenedIo {
    /// One backend per worker.
    pub workers: Vec<Box<dyn BatchIo>>,
    /// A socket on the listen address for the timer, store and TCP threads.
    pub kernel_socket: UdpSocket,
    /// Receive buffer granted per socket (empty with xdp).
    pub rcvbuf_granted: Vec<usize>,
    /// The backend in use.
    pub in_use: IoInUse,
}

impl OpenedIo {
    /// The backend for threads that send through `kernel_socket`: the
    /// workers' socket backend, or mmsg beside xdp.
    pub(super) fn kernel_backend(&self) -> BackendKind {
        match self.in_use.backend {
            BackendKind::Xdp => BackendKind::Mmsg,
            kind => kind,
        }
    }
}

/// Open the workers' I/O for `config` (validated).
pub(super) fn open(config: &SipServerConfig) -> Result<OpenedIo, ServerError> {
    let mut fallback = None;
    if let Io::Xdp(interface) = &config.io {
        match open_xdp(config, interface) {
            Ok(opened) => return Ok(opened),
            Err(XdpRefused::Config(e)) => return Err(e),
            Err(XdpRefused::Unavailable(reason)) => {
                log::warn!(
                    "sip server: the xdp backend on {} cannot start ({reason}); \
                     falling back to mmsg",
                    interface.iface
                );
                fallback = Some(reason);
            }
        }
    }
    let kind = match config.io.kind() {
        BackendKind::Xdp => BackendKind::Mmsg,
        kind => kind,
    };
    let (sockets, kernel_socket, rcvbuf_granted) = open_sockets(config)?;
    let workers = open_socket_backends(config, kind, sockets)?;
    Ok(OpenedIo {
        in_use: IoInUse {
            backend: kind,
            description: workers[0].describe(),
            fallback,
        },
        workers,
        kernel_socket,
        rcvbuf_granted,
    })
}

/// Why the xdp backend was not opened.
enum XdpRefused {
    /// A configuration error (no fallback: the configuration is wrong).
    Config(ServerError),
    /// The kernel (or this build) cannot run it here: fall back.
    Unavailable(String),
}

/// The AF_XDP backend on `interface` for the one worker.
fn open_xdp(config: &SipServerConfig, interface: &XdpInterface) -> Result<OpenedIo, XdpRefused> {
    let SocketAddr::V4(local) = config.listen else {
        return Err(XdpRefused::Unavailable(
            "the xdp backend is IPv4 only so far: listen is an IPv6 address".into(),
        ));
    };
    if let Ok(queues @ 2..) = xdp_rx_queues(&interface.iface) {
        return Err(XdpRefused::Unavailable(format!(
            "{} has {queues} receive queues: the xdp backend runs one worker on an \
             AF_XDP socket of queue 0, and what the NIC hashes to the other queues \
             would take the kernel path; give it one queue (ethtool -L {} combined 1)",
            interface.iface, interface.iface
        )));
    }
    match open_xdp_with_socket(interface.config(local)) {
        Ok((io, kernel_socket)) => {
            let description = io.describe();
            log::info!(
                "sip server: worker on {description} at {} on {}",
                config.listen,
                interface.iface
            );
            Ok(OpenedIo {
                workers: vec![io],
                kernel_socket,
                rcvbuf_granted: Vec::new(),
                in_use: IoInUse {
                    backend: BackendKind::Xdp,
                    description,
                    fallback: None,
                },
            })
        }
        Err(e) if e.kind() == std::io::ErrorKind::InvalidInput => {
            Err(XdpRefused::Config(ServerError::Backend {
                backend: BackendKind::Xdp.to_string(),
                source: e,
            }))
        }
        // A taken address is no reason to try another backend.
        Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => {
            Err(XdpRefused::Config(ServerError::Socket {
                addr: config.listen,
                source: e,
            }))
        }
        Err(e) => Err(XdpRefused::Unavailable(e.to_string())),
    }
}
/// The socket backend `kind` on the receive model's sockets.
fn open_socket_backends(
    config: &SipServerConfig,
    kind: BackendKind,
    sockets: Vec<UdpSocket>,
) -> Result<Vec<Box<dyn BatchIo>>, ServerError> {
    let fail = |source| ServerError::Backend {
        backend: kind.to_string(),
        source,
    };
    if config.rx_model == RxModel::Shared && sockets.len() > 1 {
        // One socket for every worker: exclusive wake-up and TX stamp
        // keys per worker (review D5, D6). The dups made for the
        // workers are not needed: open_shared makes its own.
        let socket = sockets.into_iter().next().expect("one socket per worker");
        return ringway_io::open_shared(kind, socket, config.workers).map_err(fail);
    }
    sockets
        .into_iter()
        .map(|socket| open_backend(kind, socket).map_err(fail))
        .collect()
}
