//! [`Io`]: the backend a server opens, carrying what it needs.

use super::{open_backend, open_xdp, BackendKind, BatchIo, XdpConfig, XdpMode};
use crate::sock::{open_udp, SocketConfig, SocketReport};
use std::io;
use std::net::{SocketAddr, SocketAddrV4};

/// The I/O backend a server opens, with the data each one needs: the
/// interface backend carries its interface, so a configuration cannot say
/// "xdp" without one (and a socket backend cannot have one).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Io {
    /// poll + one recvfrom/sendto per datagram.
    Socket,
    /// recvmmsg/sendmmsg.
    Mmsg,
    /// io_uring.
    Uring,
    /// AF_XDP on an interface.
    Xdp(XdpInterface),
}

/// The AF_XDP backend's interface and how to attach to it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct XdpInterface {
    /// Interface name (in the opening thread's network namespace); the
    /// server's listen address must be one of its IPv4 addresses.
    pub iface: String,
    /// How to attach the XDP program.
    pub mode: XdpMode,
    /// UMEM frames (see [`XdpConfig::frames`]).
    pub frames: u32,
}

impl XdpInterface {
    /// `iface` with the default mode (native, else generic) and 4096 frames.
    pub fn new(iface: impl Into<String>) -> XdpInterface {
        XdpInterface {
            iface: iface.into(),
            mode: XdpMode::Auto,
            frames: 4096,
        }
    }

    /// The backend's options for listening on `local` (its defaults, with
    /// this interface, mode and frame count).
    pub fn config(&self, local: SocketAddrV4) -> XdpConfig {
        XdpConfig {
            mode: self.mode,
            frames: self.frames,
            ..XdpConfig::new(&self.iface, local)
        }
    }
}

/// Why a backend could not be named.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum IoChoiceError {
    /// The interface backend without an interface.
    #[error("xdp backend needs an interface")]
    NeedsInterface,
    /// An interface given to a socket backend.
    #[error("an interface is only for the xdp backend (not {0})")]
    InterfaceWithoutXdp(BackendKind),
}

impl Io {
    /// The backend `kind` with `interface` (needed by xdp, refused by the others).
    pub fn new(kind: BackendKind, interface: Option<XdpInterface>) -> Result<Io, IoChoiceError> {
        match (kind, interface) {
            (BackendKind::Xdp, Some(interface)) => Ok(Io::Xdp(interface)),
            (BackendKind::Xdp, None) => Err(IoChoiceError::NeedsInterface),
            (kind, Some(_)) => Err(IoChoiceError::InterfaceWithoutXdp(kind)),
            (BackendKind::Socket, None) => Ok(Io::Socket),
            (BackendKind::Mmsg, None) => Ok(Io::Mmsg),
            (BackendKind::Uring, None) => Ok(Io::Uring),
        }
    }

    /// Which backend this is.
    pub fn kind(&self) -> BackendKind {
        match self {
            Io::Socket => BackendKind::Socket,
            Io::Mmsg => BackendKind::Mmsg,
            Io::Uring => BackendKind::Uring,
            Io::Xdp(_) => BackendKind::Xdp,
        }
    }

    /// The interface, for the xdp backend.
    pub fn interface(&self) -> Option<&XdpInterface> {
        match self {
            Io::Xdp(interface) => Some(interface),
            _ => None,
        }
    }

    /// Open it on `socket.bind`: the socket backends on a UDP socket
    /// configured by `socket` (the report says what the kernel granted),
    /// xdp on its interface (IPv4 only; `socket`'s buffers do not apply).
    pub fn open(
        &self,
        socket: &SocketConfig,
    ) -> Result<(Box<dyn BatchIo>, Option<SocketReport>), OpenError> {
        let backend = |source| OpenError::Backend {
            kind: self.kind(),
            source,
        };
        match self {
            Io::Xdp(interface) => {
                let SocketAddr::V4(local) = socket.bind else {
                    return Err(backend(io::Error::new(
                        io::ErrorKind::InvalidInput,
                        "the xdp backend is IPv4 only: listen on an IPv4 address",
                    )));
                };
                Ok((open_xdp(interface.config(local)).map_err(backend)?, None))
            }
            _ => {
                let (udp, report) = open_udp(socket).map_err(|source| OpenError::Socket {
                    addr: socket.bind,
                    source,
                })?;
                Ok((
                    open_backend(self.kind(), udp).map_err(backend)?,
                    Some(report),
                ))
            }
        }
    }
}

/// Why [`Io::open`] failed.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// The UDP socket could not be opened or bound.
    #[error("cannot open UDP socket on {addr}: {source}")]
    Socket {
        /// Address asked for.
        addr: SocketAddr,
        /// The system's reason.
        source: io::Error,
    },
    /// The backend could not be opened on the socket or the interface.
    #[error("cannot open the {kind} backend: {source}")]
    Backend {
        /// The backend.
        kind: BackendKind,
        /// The system's reason.
        source: io::Error,
    },
}

impl std::fmt::Display for Io {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.kind().name())
    }
}
