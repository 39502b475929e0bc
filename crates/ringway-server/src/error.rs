//! Errors of starting and running a server.

use std::net::SocketAddr;

/// Why a server could not start or stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// The configuration is inconsistent; the text names the field.
    #[error("invalid configuration: {0}")]
    Config(String),
    /// A socket could not be opened or bound.
    #[error("cannot open UDP socket on {addr}: {source}")]
    Socket {
        /// Address asked for.
        addr: SocketAddr,
        /// The system's reason.
        source: std::io::Error,
    },
    /// The I/O backend could not be opened on a socket or interface.
    #[error("cannot open the {backend} backend: {source}")]
    Backend {
        /// Backend name.
        backend: String,
        /// The system's reason.
        source: std::io::Error,
    },
    /// A thread could not be started.
    #[error("cannot start thread {name}: {source}")]
    Thread {
        /// Thread name.
        name: String,
        /// The system's reason.
        source: std::io::Error,
    },
    /// A receive or send call failed in a way that ends the server.
    #[error("I/O error: {0}")]
    Io(#[from] std::io::Error),
    /// A server thread panicked.
    #[error("thread {0} panicked")]
    Panicked(String),
}
