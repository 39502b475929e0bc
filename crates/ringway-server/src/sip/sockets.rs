//! Opening the server's sockets: the UDP sockets of the receive model and
//! the connection transports' listeners and event-loop polls.

use super::{Connections, RxModel, SipServerConfig, TcpConfig, TlsConfig};
use crate::ServerError;
use ringway_io::{open_udp, SocketConfig, SocketReport};
use ringway_sip::TransportAddr;
use std::net::{SocketAddr, UdpSocket};
use std::sync::Arc;

/// Open the sockets of the chosen receive model: one per worker plus one
/// for the timer thread, and the granted receive buffer sizes.
pub(super) fn open_sockets(
    config: &SipServerConfig,
) -> Result<(Vec<UdpSocket>, UdpSocket, Vec<usize>), ServerError> {
    let mut socket_config = SocketConfig::new(config.listen);
    socket_config.rcvbuf = config.rcvbuf;
    socket_config.tx_timestamps = config.tx_stamp_every > 0;
    socket_config.rx_timestamps = true;
    socket_config.rxq_ovfl = true;
    // ICMP errors for next hops reach the error queue: a port or host
    // unreachable fails the transactions waiting there over at once.
    socket_config.recv_errors = true;
    let open = |c: &SocketConfig| -> Result<(UdpSocket, SocketReport), ServerError> {
        let (socket, report) = open_udp(c).map_err(|source| ServerError::Socket {
            addr: c.bind,
            source,
        })?;
        for w in &report.warnings {
            log::warn!("sip server: socket {}: {w}", c.bind);
        }
        Ok((socket, report))
    };
    let mut sockets = Vec::with_capacity(config.workers);
    let mut granted = Vec::new();
    match config.rx_model {
        RxModel::Shared => {
            let (socket, report) = open(&socket_config)?;
            granted.push(report.rcvbuf_granted);
            for _ in 1..config.workers {
                sockets.push(socket.try_clone()?);
            }
            sockets.insert(0, socket);
        }
        RxModel::Reuseport => {
            socket_config.reuseport = true;
            for _ in 0..config.workers {
                let (socket, report) = open(&socket_config)?;
                // With port 0 the first bind picks the port the others share.
                socket_config.bind = socket.local_addr()?;
                granted.push(report.rcvbuf_granted);
                sockets.push(socket);
            }
        }
    }
    let timer = sockets[0].try_clone()?;
    Ok((sockets, timer, granted))
}

/// The connection transports' listeners, polls and table.
pub(crate) struct StreamListeners {
    /// The bound addresses (port 0 replaced).
    pub(crate) addresses: Vec<TransportAddr>,
    /// Every listener and its transport (accepted on by event loop 0).
    pub(crate) listeners: Vec<(mio::net::TcpListener, ringway_sip::Transport)>,
    /// One poll per event loop.
    pub(crate) polls: Vec<mio::Poll>,
    pub(crate) connections: Option<Arc<Connections>>,
}

/// What a server's connection transports open with (the proxy's and the
/// dispatcher's configurations name the same settings).
pub(crate) struct StreamSettings<'a> {
    /// Connection-transport listen addresses (none: no event loops).
    pub(crate) listeners: &'a [TransportAddr],
    pub(crate) tcp: &'a TcpConfig,
    pub(crate) tls: &'a TlsConfig,
    /// Origins WebSocket clients may come from (none: any).
    pub(crate) ws_origins: &'a [String],
    /// The resource name of the WebSocket connections we open to an
    /// address (others: `/`).
    pub(crate) ws_paths: Vec<(SocketAddr, String)>,
    /// Event loops when `tcp.threads` is 0: as many as UDP workers.
    pub(crate) workers: usize,
    /// Who logs ("sip server", "sip dispatch").
    pub(crate) who: &'static str,
}

/// Bind the TCP listeners of the proxy (port 0: the UDP port `local`
/// got) and make the event loops' polls and the connection table.
pub(super) fn open_listeners(
    config: &SipServerConfig,
    local: SocketAddr,
) -> Result<StreamListeners, ServerError> {
    open_stream_listeners(
        &StreamSettings {
            listeners: &config.listeners,
            tcp: &config.tcp,
            tls: &config.tls,
            ws_origins: &config.ws_origins,
            ws_paths: config
                .route_to
                .zip(config.route_to_path.clone())
                .map(|(to, path)| (to.addr, path))
                .into_iter()
                .collect(),
            workers: config.workers,
            who: "sip server",
        },
        local,
    )
}

/// Descriptors a server needs besides its connections (sockets, polls,
/// files, the metrics and Redis connections), with room to spare.
const OTHER_FILES: u64 = 256;

/// Each connection is a descriptor: raise the soft limit of open files to
/// cover `max_connections` where the hard limit allows, and say so when it
/// does not (connections beyond it are refused, counted as `descriptors`).
fn ensure_open_files(max_connections: usize, who: &str) {
    let wanted = max_connections as u64 + OTHER_FILES;
    match ringway_io::limits::raise_open_files(wanted) {
        Ok(limits) if limits.soft >= wanted => {
            log::debug!(
                "{who}: open files limit {} (hard {})",
                limits.soft,
                limits.hard
            )
        }
        Ok(limits) => log::warn!(
            "{who}: the open files limit {} (hard {}) is below tcp.max_connections {} + {}: \
             connections beyond about {} are refused (counted: reason \"descriptors\"); \
             raise it (LimitNOFILE=, ulimit -Hn) or lower tcp.max_connections",
            limits.soft,
            limits.hard,
            max_connections,
            OTHER_FILES,
            limits.soft.saturating_sub(OTHER_FILES)
        ),
        Err(e) => log::warn!("{who}: cannot read or raise the open files limit: {e}"),
    }
}

/// Bind the TCP listeners (port 0: the UDP port `local` got) and make the
/// event loops' polls and the connection table.
pub(crate) fn open_stream_listeners(
    config: &StreamSettings<'_>,
    local: SocketAddr,
) -> Result<StreamListeners, ServerError> {
    let mut streams = StreamListeners {
        addresses: Vec::new(),
        listeners: Vec::new(),
        polls: Vec::new(),
        connections: None,
    };
    if config.listeners.is_empty() {
        return Ok(streams);
    }
    for listener in config.listeners {
        let mut addr = listener.addr;
        if addr.port() == 0 {
            addr.set_port(local.port());
        }
        let bound = mio::net::TcpListener::bind(addr)
            .map_err(|source| ServerError::Socket { addr, source })?;
        streams.addresses.push(TransportAddr {
            transport: listener.transport,
            addr: bound.local_addr()?,
        });
        streams.listeners.push((bound, listener.transport));
    }
    let threads = match config.tcp.threads {
        0 => config.workers.max(1),
        n => n,
    };
    let mut registries = Vec::with_capacity(threads);
    for _ in 0..threads {
        let poll = mio::Poll::new()?;
        registries.push(poll.registry().try_clone()?);
        streams.polls.push(poll);
    }
    // TLS with a certificate to serve, or a CA to connect with.
    let tls = if config.tls.cert.is_some() || config.tls.ca.is_some() {
        Some(Arc::new(
            super::tls::TlsContext::new(config.tls.clone()).map_err(ServerError::Config)?,
        ))
    } else {
        None
    };
    ensure_open_files(config.tcp.max_connections, config.who);
    streams.connections = Some(Arc::new(Connections::new(
        config.tcp.clone(),
        registries,
        tls,
        super::ws::WsSettings {
            origins: super::ws::OriginPolicy {
                allowed: config.ws_origins.to_vec(),
            },
            paths: config.ws_paths.iter().cloned().collect(),
        },
        config.listeners.iter().map(|l| l.transport).collect(),
    )));
    for a in &streams.addresses {
        log::info!("{}: listening on {a} ({threads} event loops)", config.who);
    }
    Ok(streams)
}
