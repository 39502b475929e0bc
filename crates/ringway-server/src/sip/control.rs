//! Runtime control of a running [`SipServer`](super::SipServer): status,
//! bindings (list, delete), drain, and reload of the reloadable keys.
//! The management API ([`crate::manage`]) and the front end's signal
//! handling (SIGHUP, SIGTERM) call it through a [`SipControl`] handle.
//!
//! Reload applies, without touching transactions, dialogs or bindings:
//! the credentials of `auth_file` (re-read), the nonce secret of
//! `auth_secret_file` (re-read; nonces signed with the old one get a new
//! challenge), `flood_limit` and
//! `flood_window`, `relay`, and the TLS certificate, key and CA files
//! (re-read; open connections keep their sessions). Every other key takes effect at the
//! next start; a reload that changes one says so in
//! [`ReloadReport::restart_needed`] (see [`RELOADABLE`]).

use super::{Shared, SipServerConfig};
use crate::ServerError;
use ringway_io::monotonic_now;
use ringway_sip::auth::{Algorithm, CredentialStore, CredentialsUnavailable, Hex};
use ringway_sip::registrar::{BindingChange, Registration};
use serde::Serialize;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::Instant;

/// Keys a reload applies to the running server; every other key of
/// [`SipServerConfig`] needs a restart.
pub const RELOADABLE: [&str; 5] = [
    "auth_file",
    "auth_secret_file",
    "flood_limit",
    "flood_window",
    "relay",
];

/// Bindings listed at most by one [`SipControl::bindings`] call.
pub const MAX_LISTED_AORS: usize = 10_000;

/// Credentials the workers read and a reload replaces (one read lock per
/// digest check; the old set serves until the new one is parsed whole).
#[derive(Default)]
pub(super) struct SwappableCredentials {
    inner: RwLock<Option<Arc<dyn CredentialStore>>>,
}

impl SwappableCredentials {
    pub(super) fn set(&self, store: Arc<dyn CredentialStore>) {
        *self.inner.write().unwrap_or_else(PoisonError::into_inner) = Some(store);
    }
}

impl CredentialStore for SwappableCredentials {
    fn ha1(
        &self,
        username: &str,
        realm: &str,
        algorithm: Algorithm,
    ) -> Result<Option<Hex>, CredentialsUnavailable> {
        let store = self
            .inner
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        match store {
            Some(store) => store.ha1(username, realm, algorithm),
            None => Ok(None),
        }
    }
}

/// What control keeps in the server's shared state.
pub(super) struct ControlState {
    /// The configuration in force (the start one, then each reload's).
    pub(super) current: Mutex<SipServerConfig>,
    /// The credentials the core reads, when `auth` is on.
    pub(super) credentials: Option<Arc<SwappableCredentials>>,
    /// Reloads applied.
    pub(super) reloads: AtomicU64,
    /// Reloads refused (an invalid config).
    pub(super) reloads_refused: AtomicU64,
    /// When draining began, if it did.
    pub(super) drain_started: Mutex<Option<Instant>>,
}

impl ControlState {
    pub(super) fn new(
        config: SipServerConfig,
        credentials: Option<Arc<SwappableCredentials>>,
    ) -> Self {
        ControlState {
            current: Mutex::new(config),
            credentials,
            reloads: AtomicU64::new(0),
            reloads_refused: AtomicU64::new(0),
            drain_started: Mutex::new(None),
        }
    }
}

/// A handle on a running SIP server for the management API (cheap to
/// clone; keeps the server's shared state alive, not its threads).
#[derive(Clone)]
pub struct SipControl {
    pub(super) shared: Arc<Shared>,
}

/// The server's state, as `ringway ctl status` shows it.
#[derive(Clone, Debug, Serialize)]
pub struct Status {
    /// `ringway`'s version.
    pub version: &'static str,
    /// The address it listens on.
    pub listen: String,
    /// `stateless` or `stateful`.
    pub mode: String,
    /// Worker threads.
    pub workers: usize,
    /// Seconds since start.
    pub uptime_s: f64,
    /// Whether it is draining (new requests get 503).
    pub draining: bool,
    /// Seconds since draining began.
    pub draining_for_s: Option<f64>,
    /// Transactions in the table (completed ones included, until their
    /// timers end).
    pub transactions: usize,
    /// Transactions waiting for their final response.
    pub transactions_pending: usize,
    /// Bytes the transaction table holds.
    pub transaction_bytes: usize,
    /// Dialogs set up through the proxy and not ended by a BYE through it
    /// (stateful mode).
    pub dialogs_open: usize,
    /// Registrar bindings (`None`: a shared store).
    pub bindings: Option<usize>,
    /// Reloads applied.
    pub reloads: u64,
    /// Reloads refused.
    pub reloads_refused: u64,
    /// Worker, timer and store threads running.
    pub threads_alive: usize,
}

/// One AOR's bindings.
#[derive(Clone, Debug, Serialize)]
pub struct AorBindings {
    /// The address-of-record (`user@domain`).
    pub aor: String,
    /// Its contacts.
    pub contacts: Vec<ContactInfo>,
}

/// One binding.
#[derive(Clone, Debug, Serialize)]
pub struct ContactInfo {
    /// Contact URI.
    pub contact: String,
    /// Seconds left.
    pub expires_in_s: u64,
    /// Call-ID of the REGISTER that set it.
    pub call_id: String,
    /// Its CSeq.
    pub cseq: u32,
    /// Path values.
    pub path: Vec<String>,
}

/// What a reload did.
#[derive(Clone, Debug, Default, Serialize)]
pub struct ReloadReport {
    /// Reloadable keys whose value changed (applied now); `auth_file`
    /// is listed whenever credentials were re-read.
    pub applied: Vec<String>,
    /// Keys whose new value needs a restart (not applied).
    pub restart_needed: Vec<String>,
    /// Credentials loaded (users × realms × algorithms), when `auth` is on.
    pub credentials: Option<usize>,
}

/// Why a binding could not be listed or removed.
#[derive(Debug, thiserror::Error)]
pub enum BindingError {
    /// The bindings are in a shared store this API does not reach.
    #[error("the bindings are in a shared store (location = redis://…): use its own tools")]
    Shared,
    /// No such AOR or contact.
    #[error("no such binding")]
    NotFound,
    /// The store refused.
    #[error("location store: {0}")]
    Store(String),
}

impl SipControl {
    /// Status now.
    pub fn status(&self) -> Status {
        let s = &self.shared;
        let proxy = &s.proxy;
        let started = *lock(&s.control.drain_started);
        Status {
            version: env!("CARGO_PKG_VERSION"),
            listen: s.local.to_string(),
            mode: format!("{:?}", s.config.mode).to_ascii_lowercase(),
            workers: s.config.workers,
            uptime_s: s.started.elapsed().as_secs_f64(),
            draining: proxy.is_draining(),
            draining_for_s: started.map(|t| t.elapsed().as_secs_f64()),
            transactions: proxy.transactions_active(),
            transactions_pending: proxy.transactions_pending(),
            transaction_bytes: proxy.transaction_bytes(),
            dialogs_open: proxy.dialogs_open(),
            bindings: proxy.bindings(),
            reloads: s.control.reloads.load(Ordering::Relaxed),
            reloads_refused: s.control.reloads_refused.load(Ordering::Relaxed),
            threads_alive: s.threads_alive.load(Ordering::Relaxed),
        }
    }

    /// The core's counters.
    pub fn counters(&self) -> ringway_sip::ProxyStats {
        self.shared.proxy.stats()
    }

    /// Transactions in the table now.
    pub fn transactions(&self) -> usize {
        self.shared.proxy.transactions_active()
    }

    /// Transactions waiting for their final response (what a drain waits for).
    pub fn transactions_pending(&self) -> usize {
        self.shared.proxy.transactions_pending()
    }

    /// Dialogs set up through the proxy and not ended yet (what a drain
    /// with `drain_dialogs` waits for too).
    pub fn dialogs_open(&self) -> usize {
        self.shared.proxy.dialogs_open()
    }

    /// Bindings of `aor`, or of up to `max` AORs (at most
    /// [`MAX_LISTED_AORS`]).
    pub fn bindings(
        &self,
        aor: Option<&str>,
        max: usize,
    ) -> Result<Vec<AorBindings>, BindingError> {
        let store = self.shared.proxy.store().ok_or(BindingError::Shared)?;
        let aors = match aor {
            Some(aor) => vec![aor.to_string()],
            None => store
                .aors(max.min(MAX_LISTED_AORS))
                .ok_or(BindingError::Shared)?,
        };
        let now = monotonic_now().0;
        let mut out = Vec::with_capacity(aors.len());
        for aor in aors {
            let bindings = store
                .lookup(&aor, now)
                .map_err(|e| BindingError::Store(e.to_string()))?;
            if bindings.is_empty() {
                continue;
            }
            let contacts = bindings
                .into_iter()
                .map(|b| ContactInfo {
                    expires_in_s: b.expires_at.saturating_sub(now) / 1_000_000_000,
                    contact: b.contact,
                    call_id: b.call_id,
                    cseq: b.cseq,
                    path: b.path,
                })
                .collect();
            out.push(AorBindings { aor, contacts });
        }
        out.sort_by(|a, b| a.aor.cmp(&b.aor));
        Ok(out)
    }

    /// Remove the binding of `contact` of `aor` (every binding of `aor`
    /// when `None`); returns how many were removed.
    pub fn remove_binding(&self, aor: &str, contact: Option<&str>) -> Result<usize, BindingError> {
        let store = self.shared.proxy.store().ok_or(BindingError::Shared)?;
        let now = monotonic_now().0;
        let before = store
            .lookup(aor, now)
            .map_err(|e| BindingError::Store(e.to_string()))?;
        let gone: Vec<String> = before
            .iter()
            .filter(|b| contact.is_none_or(|c| c == b.contact))
            .map(|b| b.contact.clone())
            .collect();
        if gone.is_empty() {
            return Err(BindingError::NotFound);
        }
        // As a REGISTER with `Expires: 0` per contact would, with a Call-ID
        // no client uses (so no CSeq ordering applies).
        let registration = Registration {
            aor: aor.to_string(),
            call_id: "ringway-ctl-remove".into(),
            cseq: u32::MAX,
            path: Vec::new(),
            changes: gone
                .iter()
                .map(|c| BindingChange::Unbind { contact: c.clone() })
                .collect(),
            max_contacts: usize::MAX,
            flow: None,
        };
        store
            .register(&registration, now)
            .map_err(|e| BindingError::Store(e.to_string()))?;
        log::info!(
            "sip server: management: removed {} binding(s) of {aor}",
            gone.len()
        );
        Ok(gone.len())
    }

    /// Start draining (`true`) or serve again (`false`).
    pub fn set_draining(&self, on: bool) {
        let mut started = lock(&self.shared.control.drain_started);
        if on && started.is_none() {
            *started = Some(Instant::now());
            log::info!(
                "sip server: draining: new requests get 503, {} transaction(s) in flight",
                self.shared.proxy.transactions_active()
            );
        } else if !on && started.is_some() {
            *started = None;
            log::info!("sip server: serving again (drain cancelled)");
        }
        self.shared.proxy.set_draining(on);
    }

    /// Whether it is draining.
    pub fn is_draining(&self) -> bool {
        self.shared.proxy.is_draining()
    }

    /// Turns of each worker's receive loop so far (one counter per
    /// worker; a loop goes round at least every poll interval, 50 ms, when
    /// idle): what the systemd watchdog checks ([`crate::systemd::Watchdog`]).
    pub fn worker_beats(&self) -> Vec<u64> {
        self.shared.slots[..self.shared.config.workers]
            .iter()
            .map(|slot| slot.beats())
            .collect()
    }

    /// Whether every thread started is running (none panicked).
    pub fn threads_healthy(&self) -> bool {
        lock(&self.shared.panicked).is_empty()
    }

    /// A reload refused before it reached [`SipControl::reload`] (the
    /// file could not be read or parsed): count and log it.
    pub fn reload_refused(&self, reason: &str) {
        self.shared
            .control
            .reloads_refused
            .fetch_add(1, Ordering::Relaxed);
        log::warn!("sip server: reload refused, the running configuration stays: {reason}");
    }

    /// Apply `new`'s reloadable keys; refuse it whole (the running
    /// configuration stays) when it is invalid or its credentials cannot
    /// be read.
    pub fn reload(&self, new: SipServerConfig) -> Result<ReloadReport, ServerError> {
        let control = &self.shared.control;
        let result = self.try_reload(new);
        match &result {
            Ok(report) => {
                control.reloads.fetch_add(1, Ordering::Relaxed);
                log::info!(
                    "sip server: reloaded: applied [{}]{}",
                    report.applied.join(", "),
                    if report.restart_needed.is_empty() {
                        String::new()
                    } else {
                        format!(
                            "; changed but needing a restart: [{}]",
                            report.restart_needed.join(", ")
                        )
                    }
                );
            }
            Err(e) => {
                control.reloads_refused.fetch_add(1, Ordering::Relaxed);
                log::warn!("sip server: reload refused, the running configuration stays: {e}");
            }
        }
        result
    }

    fn try_reload(&self, new: SipServerConfig) -> Result<ReloadReport, ServerError> {
        new.validate()?;
        let shared = &self.shared;
        let mut current = lock(&shared.control.current);
        let mut report = ReloadReport::default();
        let (old_keys, new_keys) = (keys(&current)?, keys(&new)?);
        for (key, value) in &new_keys {
            if old_keys.get(key) != Some(value) && !RELOADABLE.contains(&key.as_str()) {
                report.restart_needed.push(key.clone());
            }
        }
        // Turning a feature on or off changes what the core was built
        // with: a restart.
        if new.flood_limit.is_some() != current.flood_limit.is_some() {
            report.restart_needed.push("flood_limit (on/off)".into());
        }
        // Parse everything before changing anything.
        let credentials = match (&shared.control.credentials, new.auth) {
            (Some(_), true) => new.load_credentials()?,
            _ => None,
        };
        // The nonce secret: re-read when one is configured; dropped from
        // the file, a random key again.
        let nonce_key = match (current.auth, new.auth) {
            (true, true) => match new.load_nonce_key()? {
                Some(key) => Some(key),
                None if current.auth_secret_file.is_some() => Some(super::random_key()?),
                None => None,
            },
            _ => None,
        };
        // The certificate files are re-read (same paths: new contents) and
        // swapped whole, or nothing changes; open connections keep their
        // sessions.
        if let Some(tls) = shared.connections.as_ref().and_then(|c| c.tls()) {
            tls.reload().map_err(ServerError::Config)?;
            report.applied.push("tls certificates".into());
        }
        if let (Some(swap), Some(credentials)) = (&shared.control.credentials, credentials) {
            report.credentials = Some(credentials.len());
            swap.set(Arc::new(credentials));
            report.applied.push("auth_file".into());
        }
        if let Some(key) = nonce_key {
            shared.proxy.set_nonce_key(key);
            report.applied.push("auth_secret_file".into());
        }
        if let (Some(limit), true) = (new.flood_limit, current.flood_limit.is_some()) {
            if Some(limit) != current.flood_limit || new.flood_window != current.flood_window {
                let window = u64::try_from(new.flood_window.as_nanos()).unwrap_or(u64::MAX);
                shared.proxy.set_flood_limits(limit, window);
                report.applied.push("flood_limit".into());
            }
        }
        if new.relay != current.relay {
            shared.proxy.set_relay(new.relay.clone());
            report.applied.push("relay".into());
        }
        // What is in force: the reloadable keys from `new`, the rest as started.
        current.auth_file = new.auth_file;
        if current.auth && new.auth {
            current.auth_secret_file = new.auth_secret_file;
        }
        if current.flood_limit.is_some() && new.flood_limit.is_some() {
            current.flood_limit = new.flood_limit;
            current.flood_window = new.flood_window;
        }
        current.relay = new.relay;
        Ok(report)
    }
}

/// The configuration's keys and values (to tell which changed).
fn keys(
    config: &SipServerConfig,
) -> Result<serde_json::Map<String, serde_json::Value>, ServerError> {
    match serde_json::to_value(config) {
        Ok(serde_json::Value::Object(map)) => Ok(map),
        _ => Err(ServerError::Config(
            "configuration not representable".into(),
        )),
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}
