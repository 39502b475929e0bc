//! SIP over TLS (RFC 3261 26.2, RFC 5630): rustls sessions on the TCP
//! transport's connections ([`super::tcp`]), with the ring provider and
//! TLS 1.2 and 1.3 only.
//!
//! - One [`TlsContext`] per server: the certificate and key we present
//!   (as server and, to mTLS peers, as client), certificates chosen by SNI,
//!   and the CA we verify peers with. It builds rustls' server and client
//!   configurations from the files and swaps them whole on [`TlsContext::reload`]
//!   (SIGHUP, `ringway ctl reload`) and when a file's size or time changes:
//!   connections already open keep the session they have, new ones get the
//!   new certificate. A reload that cannot read or parse a file changes
//!   nothing (counted, logged without the key).
//! - Handshakes run on the TCP event loops (never on a UDP worker): a UDP
//!   worker that forwards over TLS only encrypts the records it writes.
//!   Handshakes in progress are bounded ([`TlsConfig::max_handshakes`]:
//!   beyond, a new connection is closed at once and counted) and must end
//!   within [`TlsConfig::handshake_timeout_ms`].
//! - Every TLS byte in either direction is bounded like plain TCP: rustls'
//!   buffers are limited to the connection's send buffer bound.

use mio::net::TcpStream;
use ringway_sip::Transport;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::server::{ClientHello, ResolvesServerCert, WebPkiClientVerifier};
use rustls::sign::CertifiedKey;
use rustls::{ClientConfig, ClientConnection, Connection, RootCertStore, ServerConfig};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::io::{ErrorKind, Read, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, RwLock};
use std::time::SystemTime;

/// One certificate served to clients that ask for `name` by SNI.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SniCertificate {
    /// The server name (SNI, case-insensitive).
    pub name: String,
    /// PEM certificate chain.
    pub cert: PathBuf,
    /// PEM private key.
    pub key: PathBuf,
}

/// The TLS transport's settings (plain data; `[tls]` keys in the configuration).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TlsConfig {
    /// PEM certificate chain we present (server; client too, to mTLS peers).
    pub cert: Option<PathBuf>,
    /// PEM private key of `cert`.
    pub key: Option<PathBuf>,
    /// PEM CA certificates peers are verified with: the servers we connect
    /// to, and clients when `verify_clients`.
    pub ca: Option<PathBuf>,
    /// Require a client certificate signed by `ca` (mTLS).
    pub verify_clients: bool,
    /// Further certificates chosen by the SNI name a client sends (others,
    /// and clients that send none, get `cert`).
    pub sni: Vec<SniCertificate>,
    /// The name we send by SNI and verify the server's certificate for,
    /// when we connect (default: the peer's IP address, no SNI).
    pub server_name: Option<String>,
    /// Accepted connections in handshake at most; beyond, new ones are
    /// closed at once (counted).
    pub max_handshakes: usize,
    /// A handshake must finish within this (ms).
    pub handshake_timeout_ms: u64,
    /// How often the files are checked for changes (s; 0: only on reload).
    pub reload_check_s: u64,
}

impl Default for TlsConfig {
    fn default() -> Self {
        TlsConfig {
            cert: None,
            key: None,
            ca: None,
            verify_clients: false,
            sni: Vec::new(),
            server_name: None,
            max_handshakes: 256,
            handshake_timeout_ms: 5_000,
            reload_check_s: 5,
        }
    }
}

impl TlsConfig {
    /// Reject inconsistent settings, naming the field (files are read at
    /// start, by [`TlsContext::new`]).
    pub fn validate(&self, listening: bool) -> Result<(), String> {
        if listening && (self.cert.is_none() || self.key.is_none()) {
            return Err("a tls listen address needs tls.cert and tls.key".into());
        }
        if self.cert.is_some() != self.key.is_some() {
            return Err("tls.cert and tls.key go together".into());
        }
        if self.verify_clients && self.ca.is_none() {
            return Err("tls.verify_clients needs tls.ca".into());
        }
        if self.max_handshakes == 0 || self.handshake_timeout_ms == 0 {
            return Err("tls.max_handshakes and tls.handshake_timeout_ms must be above 0".into());
        }
        if let Some(name) = &self.server_name {
            ServerName::try_from(name.as_str())
                .map_err(|_| format!("tls.server_name {name:?} is not a DNS name or IP"))?;
        }
        Ok(())
    }

    fn files(&self) -> Vec<&Path> {
        let mut files: Vec<&Path> = [&self.cert, &self.key, &self.ca]
            .into_iter()
            .flatten()
            .map(PathBuf::as_path)
            .collect();
        for sni in &self.sni {
            files.push(&sni.cert);
            files.push(&sni.key);
        }
        files
    }
}

/// Handshake counters of one transport over TLS (`tls` or `wss`).
#[derive(Default)]
pub struct HandshakeCounters {
    handshakes: AtomicU64,
    handshake_failures: AtomicU64,
    handshakes_refused: AtomicU64,
    handshake_timeouts: AtomicU64,
}

/// The transports over TLS, in metrics order.
pub const TLS_TRANSPORTS: [Transport; 2] = [Transport::Tls, Transport::Wss];

/// Counters of the TLS layer (all threads).
#[derive(Default)]
pub struct TlsCounters {
    /// Per transport ([`TLS_TRANSPORTS`]).
    rows: [HandshakeCounters; 2],
    in_handshake: AtomicUsize,
    reloads: AtomicU64,
    reload_failures: AtomicU64,
    no_client_config: AtomicU64,
}

impl TlsCounters {
    /// The row of `transport` (`wss`, else `tls`).
    fn of(&self, transport: Transport) -> &HandshakeCounters {
        &self.rows[usize::from(transport == Transport::Wss)]
    }
}

/// One transport's handshakes at one moment.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HandshakeSnapshot {
    /// Handshakes completed (accepted and opened).
    pub handshakes: u64,
    /// Handshakes that failed.
    pub handshake_failures: u64,
    /// Accepted connections closed at once: `max_handshakes` in progress.
    pub handshakes_refused: u64,
    /// Handshakes not done within `handshake_timeout_ms`.
    pub handshake_timeouts: u64,
}

/// The TLS layer's counters at one moment: handshakes summed over `tls`
/// and `wss`, and per transport in `by_transport`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TlsSnapshot {
    /// Handshakes completed (accepted and opened).
    pub handshakes: u64,
    /// Handshakes that failed (bad certificate, old protocol version, garbage).
    pub handshake_failures: u64,
    /// Accepted connections closed at once: `max_handshakes` in progress.
    pub handshakes_refused: u64,
    /// Handshakes not done within `handshake_timeout_ms`.
    pub handshake_timeouts: u64,
    /// Handshakes in progress now.
    pub in_handshake: u64,
    /// Certificate reloads applied.
    pub reloads: u64,
    /// Reloads refused (a file unreadable or invalid): the old certificates stay.
    pub reload_failures: u64,
    /// Connections we could not open: no `tls.ca` to verify the server with.
    pub no_client_config: u64,
    /// Handshakes per transport (`tls`, `wss`).
    #[serde(default)]
    pub by_transport: std::collections::BTreeMap<String, HandshakeSnapshot>,
}

/// What sessions are made with; swapped whole by a reload.
struct Configs {
    server: Option<Arc<ServerConfig>>,
    client: Option<Arc<ClientConfig>>,
}

/// When each file was last seen (size, modification time).
type Stamps = Vec<Option<(u64, SystemTime)>>;

/// The server's TLS state: configurations (swapped by reloads) and counters.
pub struct TlsContext {
    config: TlsConfig,
    configs: RwLock<Configs>,
    stamps: Mutex<(Stamps, u64)>,
    pub(crate) counters: TlsCounters,
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

const VERSIONS: &[&rustls::SupportedProtocolVersion] =
    &[&rustls::version::TLS13, &rustls::version::TLS12];

fn read_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs: Vec<_> = CertificateDer::pem_file_iter(path)
        .and_then(|iter| iter.collect::<Result<Vec<_>, _>>())
        .map_err(|e| format!("{}: {e}", path.display()))?;
    if certs.is_empty() {
        return Err(format!("{}: no PEM certificate", path.display()));
    }
    Ok(certs)
}

fn read_key(path: &Path) -> Result<PrivateKeyDer<'static>, String> {
    // The error names the file, never its content.
    PrivateKeyDer::from_pem_file(path)
        .map_err(|_| format!("{}: no readable PEM private key", path.display()))
}

fn certified(cert: &Path, key: &Path, provider: &CryptoProvider) -> Result<CertifiedKey, String> {
    CertifiedKey::from_der(read_certs(cert)?, read_key(key)?, provider)
        .map_err(|e| format!("{} with {}: {e}", cert.display(), key.display()))
}

/// Picks the certificate by the SNI name a client sent.
#[derive(Debug)]
struct SniResolver {
    default: Arc<CertifiedKey>,
    by_name: HashMap<String, Arc<CertifiedKey>>,
}

impl ResolvesServerCert for SniResolver {
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        let named = hello
            .server_name()
            .and_then(|name| self.by_name.get(&name.to_ascii_lowercase()));
        Some(named.unwrap_or(&self.default).clone())
    }
}

impl TlsConfig {
    /// Build rustls' configurations from the files.
    fn build(&self) -> Result<Configs, String> {
        let provider = provider();
        let roots = match &self.ca {
            Some(ca) => {
                let mut roots = RootCertStore::empty();
                for cert in read_certs(ca)? {
                    roots
                        .add(cert)
                        .map_err(|e| format!("{}: {e}", ca.display()))?;
                }
                Some(Arc::new(roots))
            }
            None => None,
        };
        let own = match (&self.cert, &self.key) {
            (Some(cert), Some(key)) => Some(Arc::new(certified(cert, key, &provider)?)),
            _ => None,
        };
        let server = match &own {
            Some(own) => {
                let mut by_name = HashMap::new();
                for sni in &self.sni {
                    let key = certified(&sni.cert, &sni.key, &provider)?;
                    by_name.insert(sni.name.to_ascii_lowercase(), Arc::new(key));
                }
                let builder = ServerConfig::builder_with_provider(provider.clone())
                    .with_protocol_versions(VERSIONS)
                    .map_err(|e| e.to_string())?;
                let builder = match (&roots, self.verify_clients) {
                    (Some(roots), true) => {
                        let verifier = WebPkiClientVerifier::builder_with_provider(
                            roots.clone(),
                            provider.clone(),
                        )
                        .build()
                        .map_err(|e| format!("tls.ca: {e}"))?;
                        builder.with_client_cert_verifier(verifier)
                    }
                    _ => builder.with_no_client_auth(),
                };
                let config = builder.with_cert_resolver(Arc::new(SniResolver {
                    default: own.clone(),
                    by_name,
                }));
                Some(Arc::new(config))
            }
            None => None,
        };
        let client = match roots {
            Some(roots) => {
                let builder = ClientConfig::builder_with_provider(provider.clone())
                    .with_protocol_versions(VERSIONS)
                    .map_err(|e| e.to_string())?
                    .with_root_certificates(roots);
                let config = match &own {
                    Some(own) => builder.with_client_cert_resolver(Arc::new(
                        rustls::sign::SingleCertAndKey::from(own.clone()),
                    )),
                    None => builder.with_no_client_auth(),
                };
                Some(Arc::new(config))
            }
            None => None,
        };
        Ok(Configs { server, client })
    }

    fn stamps(&self) -> Stamps {
        self.files()
            .iter()
            .map(|path| {
                let meta = std::fs::metadata(path).ok()?;
                Some((meta.len(), meta.modified().ok()?))
            })
            .collect()
    }
}

impl TlsContext {
    /// Read the files and build the configurations (an error names the file).
    pub fn new(config: TlsConfig) -> Result<TlsContext, String> {
        let configs = config.build()?;
        let stamps = config.stamps();
        Ok(TlsContext {
            config,
            configs: RwLock::new(configs),
            stamps: Mutex::new((stamps, 0)),
            counters: TlsCounters::default(),
        })
    }

    /// The settings it runs with.
    pub fn config(&self) -> &TlsConfig {
        &self.config
    }

    /// Re-read the files and swap the configurations; on an error the
    /// old ones stay (counted).
    pub fn reload(&self) -> Result<(), String> {
        let stamps = self.config.stamps();
        match self.config.build() {
            Ok(configs) => {
                *self.configs.write().unwrap_or_else(PoisonError::into_inner) = configs;
                lock(&self.stamps).0 = stamps;
                self.counters.reloads.fetch_add(1, Ordering::Relaxed);
                log::info!("sip tls: certificates reloaded");
                Ok(())
            }
            Err(e) => {
                // Remember the stamps: one attempt per change, not one per check.
                lock(&self.stamps).0 = stamps;
                self.counters
                    .reload_failures
                    .fetch_add(1, Ordering::Relaxed);
                log::warn!("sip tls: reload refused, the certificates in use stay: {e}");
                Err(e)
            }
        }
    }

    /// Reload when a file changed (checked at most every `reload_check_s`).
    pub(crate) fn reload_if_changed(&self, now_ns: u64) {
        if self.config.reload_check_s == 0 {
            return;
        }
        {
            let mut stamps = lock(&self.stamps);
            let every = self.config.reload_check_s.saturating_mul(1_000_000_000);
            if now_ns < stamps.1.saturating_add(every) {
                return;
            }
            stamps.1 = now_ns;
            if self.config.stamps() == stamps.0 {
                return;
            }
        }
        log::info!("sip tls: certificate files changed");
        let _ = self.reload();
    }

    /// A session for a connection we accepted, or `None` beyond
    /// `max_handshakes` (counted).
    pub(crate) fn accept(
        self: &Arc<Self>,
        limit: usize,
        transport: Transport,
    ) -> Option<TlsSession> {
        let server = self
            .configs
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .server
            .clone()?;
        let in_handshake = self.counters.in_handshake.fetch_add(1, Ordering::Relaxed);
        if in_handshake >= self.config.max_handshakes {
            self.counters.in_handshake.fetch_sub(1, Ordering::Relaxed);
            self.counters
                .of(transport)
                .handshakes_refused
                .fetch_add(1, Ordering::Relaxed);
            return None;
        }
        let Ok(session) = rustls::ServerConnection::new(server) else {
            self.counters.in_handshake.fetch_sub(1, Ordering::Relaxed);
            return None;
        };
        Some(TlsSession::new(
            self.clone(),
            Connection::Server(session),
            limit,
            transport,
        ))
    }

    /// A session for a connection we open to `peer` (`tls` or `wss`), or
    /// `None` without a CA to verify it with (counted).
    pub(crate) fn connect(
        self: &Arc<Self>,
        peer: SocketAddr,
        limit: usize,
        transport: Transport,
    ) -> Option<TlsSession> {
        let client = self
            .configs
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .client
            .clone();
        let Some(client) = client else {
            self.counters
                .no_client_config
                .fetch_add(1, Ordering::Relaxed);
            return None;
        };
        let name = match &self.config.server_name {
            Some(name) => ServerName::try_from(name.clone()).ok()?,
            None => ServerName::IpAddress(peer.ip().into()),
        };
        let session = ClientConnection::new(client, name).ok()?;
        self.counters.in_handshake.fetch_add(1, Ordering::Relaxed);
        Some(TlsSession::new(
            self.clone(),
            Connection::Client(session),
            limit,
            transport,
        ))
    }

    /// The counters now.
    pub fn snapshot(&self) -> TlsSnapshot {
        let c = &self.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let by_transport: std::collections::BTreeMap<String, HandshakeSnapshot> = TLS_TRANSPORTS
            .iter()
            .map(|t| {
                let row = c.of(*t);
                let counts = HandshakeSnapshot {
                    handshakes: get(&row.handshakes),
                    handshake_failures: get(&row.handshake_failures),
                    handshakes_refused: get(&row.handshakes_refused),
                    handshake_timeouts: get(&row.handshake_timeouts),
                };
                (t.name().to_string(), counts)
            })
            .collect();
        let sum = |f: fn(&HandshakeSnapshot) -> u64| by_transport.values().map(f).sum::<u64>();
        TlsSnapshot {
            handshakes: sum(|r| r.handshakes),
            handshake_failures: sum(|r| r.handshake_failures),
            handshakes_refused: sum(|r| r.handshakes_refused),
            handshake_timeouts: sum(|r| r.handshake_timeouts),
            in_handshake: c.in_handshake.load(Ordering::Relaxed) as u64,
            reloads: get(&c.reloads),
            reload_failures: get(&c.reload_failures),
            no_client_config: get(&c.no_client_config),
            by_transport,
        }
    }
}

/// One connection's TLS session, shared by its owner loop (which reads)
/// and every thread that sends on it.
pub(crate) struct TlsSession {
    context: Arc<TlsContext>,
    /// `tls` or `wss` (its handshakes' counters row).
    transport: Transport,
    session: Mutex<Connection>,
    handshaking: AtomicBool,
}

/// A TLS read or write failed: the connection closes.
#[derive(Debug)]
pub(crate) enum TlsFailure {
    /// The handshake failed (counted).
    Handshake,
    /// A protocol error or an I/O error after the handshake.
    Broken,
}

impl TlsSession {
    fn new(
        context: Arc<TlsContext>,
        mut session: Connection,
        limit: usize,
        transport: Transport,
    ) -> TlsSession {
        session.set_buffer_limit(Some(limit));
        TlsSession {
            context,
            transport,
            session: Mutex::new(session),
            handshaking: AtomicBool::new(true),
        }
    }

    /// Still in the handshake.
    pub(crate) fn handshaking(&self) -> bool {
        self.handshaking.load(Ordering::Relaxed)
    }

    /// The handshake took too long: counted once, the caller closes.
    pub(crate) fn timed_out(&self) {
        if self.handshaking.swap(false, Ordering::Relaxed) {
            let c = &self.context.counters;
            c.in_handshake.fetch_sub(1, Ordering::Relaxed);
            c.of(self.transport)
                .handshake_timeouts
                .fetch_add(1, Ordering::Relaxed);
        }
    }

    fn note_progress(&self, session: &Connection) {
        if !session.is_handshaking() && self.handshaking.swap(false, Ordering::Relaxed) {
            let c = &self.context.counters;
            c.in_handshake.fetch_sub(1, Ordering::Relaxed);
            c.of(self.transport)
                .handshakes
                .fetch_add(1, Ordering::Relaxed);
        }
    }

    fn failed(&self) -> TlsFailure {
        if self.handshaking.swap(false, Ordering::Relaxed) {
            let c = &self.context.counters;
            c.in_handshake.fetch_sub(1, Ordering::Relaxed);
            c.of(self.transport)
                .handshake_failures
                .fetch_add(1, Ordering::Relaxed);
            TlsFailure::Handshake
        } else {
            TlsFailure::Broken
        }
    }

    /// Encrypt `bytes` and write what the kernel takes; `Ok(false)`: more
    /// than the buffer bound waits.
    pub(crate) fn write(&self, stream: &TcpStream, bytes: &[u8]) -> Result<bool, TlsFailure> {
        let mut session = lock(&self.session);
        let taken = session.writer().write(bytes).unwrap_or(0);
        if taken < bytes.len() {
            return Ok(false);
        }
        flush_tls(&mut session, stream).map_err(|_| TlsFailure::Broken)?;
        Ok(true)
    }

    /// Write what waits (on a writable event).
    pub(crate) fn flush(&self, stream: &TcpStream) -> std::io::Result<()> {
        flush_tls(&mut lock(&self.session), stream)
    }

    /// Read plaintext into `buf`: `Ok(0)` at the end of the stream,
    /// `WouldBlock` when the kernel has nothing more. Handshake messages
    /// are answered on the way.
    pub(crate) fn read(&self, stream: &TcpStream, buf: &mut [u8]) -> Result<usize, ReadError> {
        let mut session = lock(&self.session);
        loop {
            match session.reader().read(buf) {
                Ok(n) if n > 0 => return Ok(n),
                // A close_notify: the end.
                Ok(_) => return Ok(0),
                Err(e) if e.kind() == ErrorKind::WouldBlock => {}
                // The peer closed without close_notify (as most SIP peers do).
                Err(e) if e.kind() == ErrorKind::UnexpectedEof => return Ok(0),
                Err(_) => return Err(ReadError::Tls(self.failed())),
            }
            let mut reader = stream;
            match session.read_tls(&mut reader) {
                Ok(0) => return Ok(0),
                Ok(_) => {}
                Err(e) if e.kind() == ErrorKind::WouldBlock => {
                    flush_tls(&mut session, stream).map_err(ReadError::Io)?;
                    return Err(ReadError::Io(e));
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) => return Err(ReadError::Io(e)),
            }
            let processed = session.process_new_packets();
            // Our alert (if any) goes out before the close.
            let _ = flush_tls(&mut session, stream);
            if processed.is_err() {
                return Err(ReadError::Tls(self.failed()));
            }
            self.note_progress(&session);
        }
    }
}

/// A [`TlsSession::read`] failure.
#[derive(Debug)]
pub(crate) enum ReadError {
    /// The socket's (`WouldBlock`: nothing more now).
    Io(std::io::Error),
    /// TLS's.
    Tls(TlsFailure),
}

impl Drop for TlsSession {
    fn drop(&mut self) {
        if self.handshaking.swap(false, Ordering::Relaxed) {
            self.context
                .counters
                .in_handshake
                .fetch_sub(1, Ordering::Relaxed);
        }
    }
}

fn flush_tls(session: &mut Connection, stream: &TcpStream) -> std::io::Result<()> {
    let mut writer = stream;
    while session.wants_write() {
        match session.write_tls(&mut writer) {
            Ok(0) => break,
            Ok(_) => {}
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::NotConnected) => break,
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validation_names_the_field() {
        let listening = TlsConfig::default().validate(true).unwrap_err();
        assert!(listening.contains("tls.cert and tls.key"), "{listening}");
        let half = TlsConfig {
            cert: Some("c.pem".into()),
            ..TlsConfig::default()
        };
        assert!(half.validate(false).unwrap_err().contains("go together"));
        let mtls = TlsConfig {
            verify_clients: true,
            ..TlsConfig::default()
        };
        assert!(mtls.validate(false).unwrap_err().contains("tls.ca"));
        let name = TlsConfig {
            server_name: Some("not a name!".into()),
            ..TlsConfig::default()
        };
        assert!(name.validate(false).unwrap_err().contains("server_name"));
        assert!(TlsConfig::default().validate(false).is_ok());
    }

    #[test]
    fn unreadable_files_are_named_and_keys_never_printed() {
        let dir = std::env::temp_dir().join(format!("ringway-tls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let cert = dir.join("cert.pem");
        let key = dir.join("key.pem");
        std::fs::write(&cert, "not a certificate").unwrap();
        std::fs::write(&key, "SECRET-KEY-MATERIAL").unwrap();
        let config = TlsConfig {
            cert: Some(cert.clone()),
            key: Some(key.clone()),
            ..TlsConfig::default()
        };
        let e = TlsContext::new(config.clone()).err().expect("refused");
        assert!(e.contains("cert.pem"), "{e}");
        let missing = TlsConfig {
            ca: Some(dir.join("absent.pem")),
            ..TlsConfig::default()
        };
        let e = TlsContext::new(missing).err().expect("refused");
        assert!(e.contains("absent.pem"), "{e}");
        // A key file that is not a key: named, its content not echoed.
        std::fs::write(
            &cert,
            "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n",
        )
        .unwrap();
        let e = TlsContext::new(config).err().expect("refused");
        assert!(!e.contains("SECRET"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
