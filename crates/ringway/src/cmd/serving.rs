//! What the long-running server commands (`sip proxy`, `sip dispatch`)
//! share around their server: the metrics endpoint, the wait for a signal
//! or the duration, the shutdown and the JSON summary at the end.

use anyhow::Context;
use ringway_server::metrics::http;
use std::net::{SocketAddr, TcpListener};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The checks of the options every long-running server command has and
/// only the front end can make: `--duration` and `--metrics` (loopback
/// unless `--metrics-public`).
pub(crate) fn check_common_options(
    duration: Option<f64>,
    metrics: Option<SocketAddr>,
    metrics_public: bool,
) -> anyhow::Result<()> {
    if let Some(duration) = duration {
        anyhow::ensure!(
            duration.is_finite() && duration > 0.0,
            "--duration must be a positive number of seconds"
        );
    }
    if let Some(metrics) = metrics {
        http::validate_addr(metrics, metrics_public)
            .map_err(|e| anyhow::anyhow!("--metrics: {e} (pass --metrics-public to allow it)"))?;
    }
    Ok(())
}

/// A server's error; configuration errors point at `ringway COMMAND --help`.
pub(crate) fn with_help(command: &str, error: ringway_server::ServerError) -> anyhow::Error {
    match error {
        ringway_server::ServerError::Config(_) => {
            anyhow::anyhow!("{error} (see ringway {command} --help)")
        }
        other => other.into(),
    }
}

/// A running `/metrics` HTTP endpoint.
pub(crate) struct MetricsEndpoint {
    done: Arc<AtomicBool>,
    thread: JoinHandle<()>,
}

impl MetricsEndpoint {
    /// Serve `render` on `addr` (if given) from a thread named `thread`;
    /// `who` prefixes the line that says where.
    pub(crate) fn start(
        who: &str,
        thread: &str,
        addr: Option<SocketAddr>,
        render: impl Fn() -> String + Send + 'static,
    ) -> anyhow::Result<Option<MetricsEndpoint>> {
        let Some(addr) = addr else {
            return Ok(None);
        };
        let listener =
            TcpListener::bind(addr).with_context(|| format!("cannot bind metrics on {addr}"))?;
        log::info!(
            "{who}: metrics on http://{}/metrics",
            listener.local_addr()?
        );
        let done = Arc::new(AtomicBool::new(false));
        let thread = http::serve(thread, listener, done.clone(), render)?;
        Ok(Some(MetricsEndpoint { done, thread }))
    }

    /// Stop serving and wait for the thread.
    pub(crate) fn stop(self) {
        self.done.store(true, Ordering::Relaxed);
        let _ = self.thread.join();
    }
}

/// Sleep until SIGINT or SIGTERM, `duration_s` (if any) has passed, or
/// `failed()` says the server cannot go on; `reload()` at each SIGHUP.
/// Tells systemd (if it started us) READY, watchdog pings while nothing
/// failed, and STOPPING.
pub(crate) fn wait_for_stop_or(
    signals: &ringway_server::host::ControlSignals,
    duration_s: Option<f64>,
    failed: impl Fn() -> bool,
    reload: impl Fn(),
) {
    let started = Instant::now();
    let mut systemd = Systemd::from_env();
    systemd.notify("READY=1\nSTATUS=serving");
    while !signals.interrupt.load(Ordering::Relaxed)
        && !signals.terminate.load(Ordering::Relaxed)
        && duration_s.is_none_or(|d| started.elapsed().as_secs_f64() < d)
        && !failed()
    {
        if signals.hangup.swap(false, Ordering::Relaxed) {
            reload();
        }
        systemd.tick(Vec::new, true);
        std::thread::sleep(Duration::from_millis(20));
    }
    systemd.notify("STOPPING=1");
}

/// What a server command runs beside its server: the management API and
/// `/metrics`.
pub(crate) struct Endpoints {
    manage: Option<ringway_server::manage::Endpoint>,
    metrics: Option<MetricsEndpoint>,
}

impl Endpoints {
    /// Start `/metrics` on `metrics` (if given; `render` from a thread
    /// named `metrics_thread`), then the management API for `managed` (if
    /// `manage` asks for one); `who` prefixes the lines that say where.
    pub(crate) fn start(
        who: &str,
        metrics_thread: &str,
        metrics: Option<SocketAddr>,
        render: impl Fn() -> String + Send + 'static,
        manage: &super::manage::ManageArgs,
        managed: ringway_server::manage::Managed,
    ) -> anyhow::Result<Endpoints> {
        let metrics = MetricsEndpoint::start(who, metrics_thread, metrics, render)?;
        let manage = manage.start(who, managed)?;
        Ok(Endpoints { manage, metrics })
    }

    /// Stop the management API, run `shutdown` (the server's), then stop
    /// `/metrics`, which serves until the server is down; returns what
    /// `shutdown` returned.
    pub(crate) fn stop_around<Summary>(self, shutdown: impl FnOnce() -> Summary) -> Summary {
        if let Some(manage) = self.manage {
            manage.stop();
        }
        let summary = shutdown();
        if let Some(metrics) = self.metrics {
            metrics.stop();
        }
        summary
    }
}

/// The end of a server command: emit the summary (see [`emit_summary`]);
/// an error when a thread panicked (`threads_panicked`), since that
/// stopped the server `what` names: the process exits non-zero, and a
/// supervisor restarts it rather than run on with a socket nobody reads.
pub(crate) fn conclude(
    summary: &impl serde::Serialize,
    threads_panicked: &[String],
    path: Option<&Path>,
    quiet: bool,
    what: &str,
) -> anyhow::Result<()> {
    emit_summary(summary, path, quiet)?;
    anyhow::ensure!(
        threads_panicked.is_empty(),
        "thread(s) {} panicked; the {what} stopped",
        threads_panicked.join(", ")
    );
    Ok(())
}

/// Write the summary as pretty JSON to `path` (if any) and, unless
/// `quiet`, to stdout.
fn emit_summary(
    summary: &impl serde::Serialize,
    path: Option<&Path>,
    quiet: bool,
) -> anyhow::Result<()> {
    let text = serde_json::to_string_pretty(summary)?;
    if let Some(p) = path {
        std::fs::write(p, &text)
            .with_context(|| format!("cannot write summary {}", p.display()))?;
    }
    if !quiet {
        println!("{text}");
    }
    Ok(())
}

/// The service manager, if systemd started us (`$NOTIFY_SOCKET`): the
/// states a server goes through and its watchdog pings.
pub(crate) struct Systemd {
    notifier: Option<ringway_server::systemd::Notifier>,
    watchdog: Option<ringway_server::systemd::Watchdog>,
}

impl Systemd {
    /// From the environment systemd sets (nothing outside systemd).
    pub(crate) fn from_env() -> Systemd {
        let notifier = ringway_server::systemd::Notifier::from_env();
        let watchdog = ringway_server::systemd::watchdog_timeout()
            .filter(|_| notifier.is_some())
            .map(|timeout| ringway_server::systemd::Watchdog::new(timeout, Instant::now()));
        Systemd { notifier, watchdog }
    }

    /// Send `state` (`READY=1`, `STOPPING=1`, ...).
    pub(crate) fn notify(&self, state: &str) {
        if let Some(notifier) = &self.notifier {
            notifier.send(state);
        }
    }

    /// Call every few tens of ms: a `WATCHDOG=1` at each half-timeout
    /// while `healthy` and every worker loop in `beats` went round.
    pub(crate) fn tick(&mut self, beats: impl FnOnce() -> Vec<u64>, healthy: bool) {
        let (Some(notifier), Some(watchdog)) = (&self.notifier, &mut self.watchdog) else {
            return;
        };
        let now = Instant::now();
        if watchdog.due(now) && watchdog.poll(now, &beats(), healthy) {
            notifier.send("WATCHDOG=1");
        }
    }
}
