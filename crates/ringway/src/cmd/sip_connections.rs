//! The connection-transport options `sip proxy` and `sip dispatch` share
//! (flattened into both): TCP bounds, TLS certificates, WebSocket origins.
//! Both commands run the same connection driver
//! (`ringway_server::sip::tcp`), so they name its settings the same way.

use anyhow::Context;
use ringway_server::sip::{SniCertificate, TcpConfig, TlsConfig};
use ringway_sip::{Transport, TransportAddr};
use std::path::PathBuf;

/// TCP, TLS and WebSocket options.
#[derive(clap::Args, Debug, Clone)]
pub struct ConnectionArgs {
    /// TCP event loop threads (0: as many as --workers).
    #[arg(long, default_value_t = 0)]
    pub tcp_threads: usize,
    /// TCP: connections open at most (accepted and opened); beyond, new ones are closed at once.
    #[arg(long, default_value_t = TcpConfig::default().max_connections)]
    pub tcp_max_connections: usize,
    /// TCP: accepted connections from one IP address at most.
    #[arg(long, default_value_t = TcpConfig::default().max_connections_per_ip)]
    pub tcp_max_connections_per_ip: usize,
    /// TCP: longest start line and header of a message (bytes); longer closes the connection.
    #[arg(long, default_value_t = TcpConfig::default().max_header_bytes)]
    pub tcp_max_header_bytes: usize,
    /// TCP: longest body of a message (bytes); longer closes the connection.
    #[arg(long, default_value_t = TcpConfig::default().max_body_bytes)]
    pub tcp_max_body_bytes: usize,
    /// TCP: messages one connection may carry before it is closed (0: no limit).
    #[arg(long, default_value_t = 0)]
    pub tcp_max_messages: u64,
    /// TCP: close a connection idle for this long (s).
    #[arg(long, default_value_t = TcpConfig::default().idle_timeout_s)]
    pub tcp_idle_timeout_s: u64,
    /// TCP: a message begun must be complete within this (ms; slowloris), else the connection is closed.
    #[arg(long, default_value_t = TcpConfig::default().message_timeout_ms)]
    pub tcp_message_timeout_ms: u64,
    /// TLS: PEM certificate chain we present (needed by `tls:` listen addresses).
    #[arg(long, value_hint = clap::ValueHint::FilePath)]
    pub tls_cert: Option<PathBuf>,
    /// TLS: PEM private key of --tls-cert.
    #[arg(long, value_hint = clap::ValueHint::FilePath)]
    pub tls_key: Option<PathBuf>,
    /// TLS: PEM CA certificates peers are verified with (servers we connect to; clients with --tls-verify-clients).
    #[arg(long, value_hint = clap::ValueHint::FilePath)]
    pub tls_ca: Option<PathBuf>,
    /// TLS: require a client certificate signed by --tls-ca (mTLS trunks).
    #[arg(long)]
    pub tls_verify_clients: bool,
    /// TLS: another certificate for clients asking for NAME by SNI: `NAME=CERT,KEY` (repeatable).
    #[arg(long, value_parser = parse_sni)]
    pub tls_sni: Vec<SniCertificate>,
    /// TLS: name sent by SNI and verified in the server's certificate when connecting (default: the peer's IP).
    #[arg(long)]
    pub tls_server_name: Option<String>,
    /// TLS: accepted connections in handshake at most; beyond, new ones are closed at once (counted).
    #[arg(long, default_value_t = TlsConfig::default().max_handshakes)]
    pub tls_max_handshakes: usize,
    /// TLS: a handshake must finish within this (ms), else the connection is closed.
    #[arg(long, default_value_t = TlsConfig::default().handshake_timeout_ms)]
    pub tls_handshake_timeout_ms: u64,
    /// TLS: check the certificate files for changes this often and reload them (s; 0: only on SIGHUP).
    #[arg(long, default_value_t = TlsConfig::default().reload_check_s)]
    pub tls_reload_check_s: u64,
    /// WebSocket (ws:, wss:): an Origin browsers may connect from, e.g. `https://phone.example.net`
    /// (repeatable; none given: any origin).
    #[arg(long = "ws-origin")]
    pub ws_origins: Vec<String>,
}

impl ConnectionArgs {
    /// The TCP bounds.
    pub(crate) fn tcp_config(&self) -> TcpConfig {
        TcpConfig {
            threads: self.tcp_threads,
            max_connections: self.tcp_max_connections,
            max_connections_per_ip: self.tcp_max_connections_per_ip,
            max_header_bytes: self.tcp_max_header_bytes,
            max_body_bytes: self.tcp_max_body_bytes,
            max_messages_per_connection: self.tcp_max_messages,
            idle_timeout_s: self.tcp_idle_timeout_s,
            message_timeout_ms: self.tcp_message_timeout_ms,
            ..TcpConfig::default()
        }
    }

    /// The TLS settings.
    pub(crate) fn tls_config(&self) -> TlsConfig {
        TlsConfig {
            cert: self.tls_cert.clone(),
            key: self.tls_key.clone(),
            ca: self.tls_ca.clone(),
            verify_clients: self.tls_verify_clients,
            sni: self.tls_sni.clone(),
            server_name: self.tls_server_name.clone(),
            max_handshakes: self.tls_max_handshakes,
            handshake_timeout_ms: self.tls_handshake_timeout_ms,
            reload_check_s: self.tls_reload_check_s,
        }
    }
}

/// `--tls-sni`: `NAME=CERT,KEY`.
pub(crate) fn parse_sni(text: &str) -> Result<SniCertificate, String> {
    let (name, files) = text
        .split_once('=')
        .ok_or("want NAME=CERT,KEY".to_string())?;
    let (cert, key) = files
        .split_once(',')
        .ok_or("want NAME=CERT,KEY".to_string())?;
    if name.is_empty() || cert.is_empty() || key.is_empty() {
        return Err("want NAME=CERT,KEY".into());
    }
    Ok(SniCertificate {
        name: name.to_string(),
        cert: cert.into(),
        key: key.into(),
    })
}

/// `--listen` split into the one UDP address (the last given: a command
/// line's overrides a configuration file's) and every other transport's
/// address as given, without repeats. `server` names the command in the
/// error ("proxy", "dispatcher").
pub(crate) fn split_listen(
    listen: &[TransportAddr],
    server: &str,
) -> anyhow::Result<(std::net::SocketAddr, Vec<TransportAddr>)> {
    let udp = listen
        .iter()
        .rev()
        .find(|a| a.transport == Transport::Udp)
        .map(|a| a.addr)
        .with_context(|| {
            format!("--listen: give one udp address (the {server} always listens on UDP)")
        })?;
    let mut listeners: Vec<TransportAddr> = Vec::new();
    for a in listen.iter().filter(|a| a.transport != Transport::Udp) {
        if !listeners.contains(a) {
            listeners.push(*a);
        }
    }
    Ok((udp, listeners))
}
