//! UDP socket setup with the options operators ask for.

use std::io;
use std::net::{SocketAddr, UdpSocket};

/// How to open a UDP socket.
#[derive(Clone, Debug)]
pub struct SocketConfig {
    /// Address to bind.
    pub bind: SocketAddr,
    /// Requested receive buffer (SO_RCVBUF, or SO_RCVBUFFORCE when allowed).
    pub rcvbuf: Option<usize>,
    /// Requested send buffer.
    pub sndbuf: Option<usize>,
    /// Set SO_REUSEPORT (several sockets on one port, kernel load-balances).
    pub reuseport: bool,
    /// Ask for kernel software RX timestamps.
    pub rx_timestamps: bool,
    /// Allow kernel software TX timestamps (requested per datagram).
    pub tx_timestamps: bool,
    /// Ask for SO_RXQ_OVFL drop counts with each receive.
    pub rxq_ovfl: bool,
}

impl SocketConfig {
    /// Defaults: given address, no buffer change, RX stamps and drop counts on.
    pub fn new(bind: SocketAddr) -> Self {
        SocketConfig {
            bind,
            rcvbuf: None,
            sndbuf: None,
            reuseport: false,
            rx_timestamps: true,
            tx_timestamps: false,
            rxq_ovfl: true,
        }
    }
}

/// What was actually applied when opening a socket.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct SocketReport {
    /// Receive buffer the kernel reports after setup (SO_RCVBUF read back).
    pub rcvbuf_granted: usize,
    /// Send buffer read back.
    pub sndbuf_granted: usize,
    /// Human-readable warnings (clamped buffers, refused options).
    pub warnings: Vec<String>,
}

/// Open and configure a UDP socket as `cfg` says (placeholder: bind only).
pub fn open_udp(cfg: &SocketConfig) -> io::Result<(UdpSocket, SocketReport)> {
    let sock = UdpSocket::bind(cfg.bind)?;
    let report = SocketReport {
        warnings: vec!["socket options not applied yet (placeholder)".into()],
        ..Default::default()
    };
    Ok((sock, report))
}
