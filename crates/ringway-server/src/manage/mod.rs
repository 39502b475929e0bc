//! The management API of `ringway sip proxy` and `ringway sip dispatch`
//! (what `ringway ctl` talks to): JSON over HTTP/1.1 on a Unix socket
//! (local only: whoever may open the socket file, mode 0600, may ask),
//! and optionally on a loopback TCP address behind a bearer token. The
//! handlers are plain functions of the request ([`crate::admin_http`]),
//! the same on both transports.
//!
//! | method and path | does |
//! |---|---|
//! | `GET /status` | version, uptime, draining, transactions, bindings, reloads |
//! | `GET /counters` | the core's counters |
//! | `GET /transactions` | transactions in the table |
//! | `GET /bindings[?aor=A&max=N]` | bindings per AOR |
//! | `DELETE /bindings/AOR[?contact=URI]` | remove an AOR's bindings (or one) |
//! | `POST /reload` | re-read the config file and apply the reloadable keys |
//! | `POST /drain` / `DELETE /drain` | start draining / serve again |
//! | `GET /log-level`, `PUT /log-level?level=SPEC` | log levels (`info,ringway_server::sip=debug`) |
//! | `GET /dispatch/targets` | the dispatcher's proxies and their states |
//! | `POST /dispatch/targets/ADDR/(enable\|disable\|drain)` | set a proxy's state |
//!
//! Values in paths and queries are percent-decoded.

use crate::admin_http::{self, token_matches, Handler, Request, Response};
use crate::dispatch::DispatchControl;
use crate::sip::{BindingError, ReloadReport, SipControl};
use ringway_sip::dispatch::AdminState;
use serde_json::json;
use std::net::{SocketAddr, TcpListener};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

/// Bindings listed by default (`?max=` up to [`crate::sip::MAX_LISTED_AORS`]).
pub const DEFAULT_LISTED_AORS: usize = 1000;

/// What re-reads the configuration file and applies it (the front end
/// knows how the file becomes a config); `Err`: refused, with the reason.
pub type Reloader = Arc<dyn Fn() -> Result<ReloadReport, String> + Send + Sync>;

/// What a management endpoint serves.
#[derive(Clone)]
pub enum Managed {
    /// A SIP proxy/registrar, and how to reload it.
    Proxy(SipControl, Reloader),
    /// A dispatcher, and how to reload it.
    Dispatch(DispatchControl, Reloader),
}

/// The handler for `managed` (no token check: wrap it with
/// [`with_token`] for a TCP listener).
pub fn handler(managed: Managed) -> Handler {
    Arc::new(move |r: &Request| {
        let path = r.path.trim_end_matches('/');
        let segments: Vec<String> = path.split('/').skip(1).map(percent_decode).collect();
        let segments: Vec<&str> = segments.iter().map(String::as_str).collect();
        match (r.method.as_str(), segments.as_slice()) {
            ("GET", ["log-level"]) => log_level(),
            ("PUT" | "POST", ["log-level"]) => set_log_level(r),
            _ => match &managed {
                Managed::Proxy(control, reload) => proxy_route(control, reload, r, &segments),
                Managed::Dispatch(control, reload) => dispatch_route(control, reload, r, &segments),
            },
        }
    })
}

/// `handler` behind a bearer token (the TCP listener's).
pub fn with_token(handler: Handler, token: String) -> Handler {
    Arc::new(move |r: &Request| {
        if !token_matches(r.bearer.as_deref(), &token) {
            return Response::error(401, "missing or wrong bearer token");
        }
        handler(r)
    })
}

fn proxy_route(
    control: &SipControl,
    reload: &Reloader,
    r: &Request,
    segments: &[&str],
) -> Response {
    let ok = |value: serde_json::Value| Response::json(200, &value);
    match (r.method.as_str(), segments) {
        ("GET", ["status"]) => ok(json!(control.status())),
        ("GET", ["counters"]) => ok(json!(control.counters())),
        ("GET", ["transactions"]) => ok(json!({
            "active": control.transactions(),
            "pending": control.transactions_pending(),
        })),
        ("GET", ["bindings"]) => {
            let aor = r.query_param("aor").map(percent_decode);
            let max = match r.query_param("max").map(str::parse::<usize>) {
                None => DEFAULT_LISTED_AORS,
                Some(Ok(n)) => n,
                Some(Err(_)) => return Response::error(400, "max must be a number"),
            };
            match control.bindings(aor.as_deref(), max) {
                Ok(list) => ok(json!({ "aors": list })),
                Err(e) => binding_error(&e),
            }
        }
        ("DELETE", ["bindings", aor]) => {
            let contact = r.query_param("contact").map(percent_decode);
            match control.remove_binding(aor, contact.as_deref()) {
                Ok(n) => ok(json!({ "aor": aor, "removed": n })),
                Err(e) => binding_error(&e),
            }
        }
        ("POST", ["reload"]) => match reload() {
            Ok(report) => ok(json!(report)),
            Err(reason) => Response::error(422, &format!("reload refused: {reason}")),
        },
        ("POST", ["drain"]) => {
            control.set_draining(true);
            ok(json!(control.status()))
        }
        ("DELETE", ["drain"]) => {
            control.set_draining(false);
            ok(json!(control.status()))
        }
        ("GET", ["dispatch", ..]) | ("POST", ["dispatch", ..]) => {
            Response::error(404, "this is a proxy, not a dispatcher")
        }
        _ => Response::error(404, "no such endpoint (see docs/operations.md)"),
    }
}

fn binding_error(e: &BindingError) -> Response {
    let status = match e {
        BindingError::Shared => 501,
        BindingError::NotFound => 404,
        BindingError::Store(_) => 503,
    };
    Response::error(status, &e.to_string())
}

fn dispatch_route(
    control: &DispatchControl,
    reload: &Reloader,
    r: &Request,
    segments: &[&str],
) -> Response {
    match (r.method.as_str(), segments) {
        ("GET", ["status"]) => {
            let (reloads, reloads_refused) = control.reloads();
            Response::json(
                200,
                &json!({
                    "version": env!("CARGO_PKG_VERSION"),
                    "listen": control.local_addr().to_string(),
                    "uptime_s": control.uptime_s(),
                    "role": "dispatcher",
                    "reloads": reloads,
                    "reloads_refused": reloads_refused,
                }),
            )
        }
        ("POST", ["reload"]) => match reload() {
            Ok(report) => Response::json(200, &json!(report)),
            Err(reason) => Response::error(422, &format!("reload refused: {reason}")),
        },
        ("GET", ["counters"]) => Response::json(200, &json!(control.stats())),
        ("GET", ["dispatch", "targets"]) => {
            Response::json(200, &json!({ "targets": control.stats().proxies }))
        }
        ("POST", ["dispatch", "targets", address, action]) => {
            let Ok(address) = address.parse::<SocketAddr>() else {
                return Response::error(400, "a target is IP:PORT");
            };
            let state = match *action {
                "enable" => AdminState::Active,
                "disable" => AdminState::Disabled,
                "drain" => AdminState::Draining,
                _ => return Response::error(404, "actions: enable, disable, drain"),
            };
            if control.set_admin_state(address, state) {
                Response::json(
                    200,
                    &json!({ "target": address.to_string(), "state": state.as_str() }),
                )
            } else {
                Response::error(404, "no such target")
            }
        }
        _ => Response::error(404, "no such endpoint (see docs/operations.md)"),
    }
}

/// How the process reads (`None`) and sets (`Some(spec)`) its log levels:
/// the spec in force, or why a new one was refused. The binary owns the
/// logger and installs this once ([`set_log_level_hook`]); without it the
/// endpoint reads and sets `log::max_level` alone.
pub type LogLevelHook = fn(Option<&str>) -> Result<String, String>;

static LOG_LEVEL_HOOK: std::sync::OnceLock<LogLevelHook> = std::sync::OnceLock::new();

/// Install the process's [`LogLevelHook`] (the first call wins).
pub fn set_log_level_hook(hook: LogLevelHook) {
    let _ = LOG_LEVEL_HOOK.set(hook);
}

fn log_level() -> Response {
    let level = match LOG_LEVEL_HOOK.get() {
        Some(hook) => hook(None).unwrap_or_default(),
        None => log::max_level().as_str().to_ascii_lowercase(),
    };
    Response::json(200, &json!({ "level": level }))
}

fn set_log_level(r: &Request) -> Response {
    let Some(spec) = r.query_param("level").map(percent_decode) else {
        return Response::error(
            400,
            "give ?level=LEVEL[,MODULE=LEVEL]... (off, error, warn, info, debug, trace)",
        );
    };
    let result = match LOG_LEVEL_HOOK.get() {
        Some(hook) => hook(Some(&spec)),
        None => spec
            .parse::<log::LevelFilter>()
            .map(log::set_max_level)
            .map(|()| spec.clone())
            .map_err(|_| "level: off, error, warn, info, debug or trace".to_string()),
    };
    match result {
        Ok(now) => {
            log::warn!("management: log level set to {now}");
            log_level()
        }
        Err(e) => Response::error(400, &format!("log level: {e}")),
    }
}

/// `%XX` decoded (and `+` kept: it is part of SIP URIs); bad escapes
/// are kept as they are.
pub fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut index = 0;
    while index < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        if bytes[index] == b'%' && index + 2 < bytes.len() {
            if let (Some(high), Some(low)) = (hex(bytes[index + 1]), hex(bytes[index + 2])) {
                out.push((high * 16 + low) as u8);
                index += 3;
                continue;
            }
        }
        out.push(bytes[index]);
        index += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Where a management endpoint listens.
#[derive(Clone, Debug, Default)]
pub struct ManageConfig {
    /// The Unix socket (created with mode 0600; a stale file is replaced).
    pub socket: Option<PathBuf>,
    /// A loopback TCP address (needs `token`).
    pub http: Option<SocketAddr>,
    /// The bearer token of `http`.
    pub token: Option<String>,
}

/// A running management endpoint.
pub struct Endpoint {
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
    socket: Option<PathBuf>,
    /// The TCP address bound, if any.
    pub http_addr: Option<SocketAddr>,
}

impl Endpoint {
    /// Listen where `config` says and serve `handler`.
    pub fn start(config: &ManageConfig, handler: Handler) -> std::io::Result<Endpoint> {
        let stop = Arc::new(AtomicBool::new(false));
        let mut endpoint = Endpoint {
            stop: stop.clone(),
            threads: Vec::new(),
            socket: None,
            http_addr: None,
        };
        if let Some(path) = &config.socket {
            let listener = bind_unix(path)?;
            endpoint.socket = Some(path.clone());
            endpoint.threads.push(admin_http::serve_unix(
                "manage-unix",
                listener,
                stop.clone(),
                handler.clone(),
            )?);
        }
        if let Some(addr) = config.http {
            if !addr.ip().is_loopback() {
                return Err(std::io::Error::other(format!(
                    "management HTTP {addr}: loopback addresses only"
                )));
            }
            let Some(token) = config.token.clone().filter(|t| !t.is_empty()) else {
                return Err(std::io::Error::other("management HTTP needs a token"));
            };
            let listener = TcpListener::bind(addr)?;
            endpoint.http_addr = Some(listener.local_addr()?);
            endpoint.threads.push(admin_http::serve(
                "manage-http",
                listener,
                stop,
                with_token(handler, token),
            )?);
        }
        Ok(endpoint)
    }

    /// Stop serving, wait for the threads, remove the socket file.
    pub fn stop(self) {
        self.stop.store(true, Ordering::Relaxed);
        for thread in self.threads {
            let _ = thread.join();
        }
        if let Some(path) = self.socket {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// Bind the Unix socket at `path` with mode 0600. A socket file left by a
/// dead process is replaced; one a live process answers on is not.
fn bind_unix(path: &Path) -> std::io::Result<UnixListener> {
    if path.exists() {
        if std::os::unix::net::UnixStream::connect(path).is_ok() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::AddrInUse,
                format!("{}: another process serves it", path.display()),
            ));
        }
        std::fs::remove_file(path)?;
    }
    let listener = UnixListener::bind(path)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    Ok(listener)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percent_decoding() {
        assert_eq!(percent_decode("sip%3Aa%40b%3B5"), "sip:a@b;5");
        assert_eq!(percent_decode("a%2"), "a%2");
        assert_eq!(percent_decode("%zz%"), "%zz%");
        assert_eq!(percent_decode("x%41"), "xA");
    }
}
