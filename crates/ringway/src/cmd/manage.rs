//! The management options of `sip proxy` and `sip dispatch` (the socket
//! `ringway ctl` talks to), and the proxy's life under signals: SIGHUP
//! reloads, SIGTERM (or `ringway ctl drain`) drains and exits, SIGINT
//! stops at once. See docs/operations.md.

use anyhow::Context;
use clap::{CommandFactory, FromArgMatches};
use ringway_server::dispatch::{DispatchControl, DispatchServerConfig};
use ringway_server::host::ControlSignals;
use ringway_server::manage::{self, Endpoint, ManageConfig, Managed, Reloader};
use ringway_server::sip::{ReloadReport, SipControl, SipServerConfig};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Management options.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct ManageArgs {
    /// Management API on this Unix socket (mode 0600; `ringway ctl --socket PATH`).
    #[arg(long, value_hint = clap::ValueHint::FilePath)]
    pub manage_socket: Option<PathBuf>,
    /// Management API also on this loopback HTTP address (needs --manage-token-file).
    #[arg(long)]
    pub manage_http: Option<SocketAddr>,
    /// File holding the bearer token of --manage-http (first line).
    #[arg(long, value_hint = clap::ValueHint::FilePath)]
    pub manage_token_file: Option<PathBuf>,
}

/// Drain options of `sip proxy`.
#[derive(clap::Args, Debug, Clone)]
pub struct DrainArgs {
    /// Drain (SIGTERM, `ringway ctl drain`): longest wait for the transactions in flight (s).
    #[arg(long, default_value_t = 30.0)]
    pub drain_timeout: f64,
    /// Drain: exit once no transaction has waited for a final response for this long (ms), so
    /// that in-dialog requests of calls just set up (ACK, an early BYE) still pass.
    #[arg(long, default_value_t = 1000)]
    pub drain_idle_ms: u64,
    /// Drain: also wait (up to --drain-timeout) for the calls set up through this proxy to end
    /// with their BYE, relaying their in-dialog requests meanwhile (--mode stateful, Record-Route).
    #[arg(long)]
    pub drain_dialogs: bool,
}

impl DrainArgs {
    /// Reject inconsistent options, naming them.
    pub fn validate(&self) -> anyhow::Result<()> {
        anyhow::ensure!(
            self.drain_timeout.is_finite() && (0.0..=86_400.0).contains(&self.drain_timeout),
            "--drain-timeout must be 0..=86400 seconds"
        );
        Ok(())
    }
}

impl ManageArgs {
    /// Reject inconsistent options, naming them.
    pub fn validate(&self) -> anyhow::Result<()> {
        if let Some(addr) = self.manage_http {
            anyhow::ensure!(
                addr.ip().is_loopback(),
                "--manage-http: loopback addresses only"
            );
            anyhow::ensure!(
                self.manage_token_file.is_some(),
                "--manage-http needs --manage-token-file"
            );
        }
        Ok(())
    }

    fn config(&self) -> anyhow::Result<ManageConfig> {
        let token = match &self.manage_token_file {
            Some(path) => {
                let text = std::fs::read_to_string(path)
                    .with_context(|| format!("--manage-token-file {}", path.display()))?;
                let token = text.lines().next().unwrap_or("").trim().to_string();
                anyhow::ensure!(
                    token.len() >= 16,
                    "--manage-token-file {}: the token must be at least 16 characters",
                    path.display()
                );
                Some(token)
            }
            None => None,
        };
        Ok(ManageConfig {
            socket: self.manage_socket.clone(),
            http: self.manage_http,
            token,
        })
    }

    /// Start the endpoint for `managed` (none when no option asks for one).
    pub fn start(&self, who: &str, managed: Managed) -> anyhow::Result<Option<Endpoint>> {
        if self.manage_socket.is_none() && self.manage_http.is_none() {
            return Ok(None);
        }
        let config = self.config()?;
        let endpoint = Endpoint::start(&config, manage::handler(managed))
            .context("cannot start the management API")?;
        if let Some(path) = &config.socket {
            log::info!("{who}: management socket {}", path.display());
        }
        if let Some(addr) = endpoint.http_addr {
            log::info!("{who}: management http://{addr}/ (bearer token)");
        }
        Ok(Some(endpoint))
    }
}

/// The command as the command line and its `--config` file say now (the
/// file re-read): what a reload applies.
fn reread_command() -> Result<super::sip::SipCmd, String> {
    let root = crate::Cli::command();
    let argv = super::config::expand_args(std::env::args_os().collect(), &root)
        .map_err(|e| e.to_string())?;
    let matches = root
        .try_get_matches_from(argv)
        .map_err(|e| e.kind().to_string())?;
    let cli = crate::Cli::from_arg_matches(&matches).map_err(|e| e.kind().to_string())?;
    match cli.cmd {
        crate::Cmd::Sip(command) => Ok(command),
        _ => Err("not a sip command line".into()),
    }
}

/// The proxy's configuration now (see [`reread_command`]).
fn reread_proxy_config() -> Result<(SipServerConfig, crate::logging::LogArgs), String> {
    let super::sip::SipCmd::Proxy(args) = reread_command()? else {
        return Err("not a sip proxy command line".into());
    };
    let config = super::sip_proxy::checked_config(&args).map_err(|e| format!("{e:#}"))?;
    Ok((config, args.log))
}

/// A reloader for `control`: re-read the file, apply.
/// systemd (if it started us) hears RELOADING=1, then READY=1.
pub(crate) fn proxy_reloader(control: SipControl) -> Reloader {
    let systemd = super::serving::Systemd::from_env();
    Arc::new(move || -> Result<ReloadReport, String> {
        notify_reloading(&systemd);
        let result = match reread_proxy_config() {
            Err(e) => {
                control.reload_refused(&e);
                Err(e)
            }
            Ok((config, log)) => control
                .reload(config)
                // The file's log format and levels too (as `ctl log-level` would).
                .inspect(|_| log.apply())
                .map_err(|e| e.to_string()),
        };
        notified(&systemd, result)
    })
}

/// Tell systemd how a reload ended (READY=1 with the outcome). The
/// RELOADING=1 before it is sent by [`notify_reloading`].
fn notified(
    systemd: &super::serving::Systemd,
    result: Result<ReloadReport, String>,
) -> Result<ReloadReport, String> {
    systemd.notify(match &result {
        Ok(_) => "READY=1\nSTATUS=serving (reloaded)",
        Err(_) => "READY=1\nSTATUS=serving (reload refused)",
    });
    result
}

/// Tell systemd a reload starts.
fn notify_reloading(systemd: &super::serving::Systemd) {
    systemd.notify("RELOADING=1\nSTATUS=reloading");
}

/// A reloader for a dispatcher: re-read the file, apply its proxies and
/// relay networks (and its log keys). systemd hears RELOADING=1, then READY=1.
pub(crate) fn dispatch_reloader(control: DispatchControl) -> Reloader {
    let systemd = super::serving::Systemd::from_env();
    Arc::new(move || -> Result<ReloadReport, String> {
        notify_reloading(&systemd);
        let reread = match reread_command() {
            Ok(super::sip::SipCmd::Dispatch(args)) => DispatchServerConfig::try_from(&*args)
                .map(|config| (config, args.log))
                .map_err(|e| format!("{e:#}")),
            Ok(_) => Err("not a sip dispatch command line".into()),
            Err(e) => Err(e),
        };
        let result = match reread {
            Err(e) => {
                control.reload_refused(&e);
                Err(e)
            }
            Ok((config, log)) => control
                .reload(config)
                .inspect(|_| log.apply())
                .map_err(|e| e.to_string()),
        };
        notified(&systemd, result)
    })
}

/// How a managed proxy's run ended.
#[derive(Debug, PartialEq)]
pub(crate) enum Ending {
    /// SIGINT, `--duration` or a panicked thread.
    Stopped,
    /// Drained: the table emptied (seconds the drain took).
    Drained(f64),
    /// The drain deadline passed with transactions left.
    DrainTimedOut(usize),
}

/// Serve until stopped: SIGHUP reloads, SIGTERM or the API's drain
/// drains and then ends, SIGINT, `duration_s` or `failed()` end at once.
pub(crate) fn run_proxy(
    signals: &ControlSignals,
    control: &SipControl,
    reload: &Reloader,
    args: &DrainArgs,
    duration_s: Option<f64>,
    failed: impl Fn() -> bool,
) -> Ending {
    let started = Instant::now();
    let mut drain: Option<Instant> = None;
    let mut idle_since: Option<Instant> = None;
    let timeout = Duration::from_secs_f64(args.drain_timeout);
    let idle = Duration::from_millis(args.drain_idle_ms);
    // systemd (Type=notify): READY now, watchdog pings while every worker
    // loop goes round, STOPPING when a drain or a stop begins.
    let mut systemd = super::serving::Systemd::from_env();
    systemd.notify("READY=1\nSTATUS=serving");
    loop {
        if signals.interrupt.load(Ordering::Relaxed)
            || duration_s.is_some_and(|d| started.elapsed().as_secs_f64() >= d)
            || failed()
        {
            systemd.notify("STOPPING=1");
            return Ending::Stopped;
        }
        systemd.tick(|| control.worker_beats(), control.threads_healthy());
        if signals.hangup.swap(false, Ordering::Relaxed) {
            log::info!("sip proxy: SIGHUP: reloading");
            let _ = reload();
        }
        if signals.terminate.swap(false, Ordering::Relaxed) && !control.is_draining() {
            log::info!(
                "sip proxy: SIGTERM: draining (at most {:.1} s)",
                args.drain_timeout
            );
            control.set_draining(true);
        }
        match (control.is_draining(), drain) {
            (true, None) => {
                systemd.notify("STOPPING=1\nSTATUS=draining");
                drain = Some(Instant::now());
            }
            (false, Some(_)) => {
                drain = None;
                idle_since = None;
            }
            _ => {}
        }
        if let Some(began) = drain {
            let left = control.transactions_pending();
            let dialogs = if args.drain_dialogs {
                control.dialogs_open()
            } else {
                0
            };
            if left == 0 && dialogs == 0 {
                let since = *idle_since.get_or_insert_with(Instant::now);
                if since.elapsed() >= idle {
                    let took = began.elapsed().as_secs_f64();
                    log::info!("sip proxy: drained in {took:.2} s; exiting");
                    return Ending::Drained(took);
                }
            } else {
                idle_since = None;
            }
            if began.elapsed() >= timeout && left == 0 && dialogs > 0 {
                // Only dialogs left: their time was the deadline.
                let took = began.elapsed().as_secs_f64();
                log::warn!(
                    "sip proxy: drain deadline ({:.1} s) passed with {dialogs} dialog(s) still open; exiting",
                    args.drain_timeout
                );
                return Ending::Drained(took);
            }
            if began.elapsed() >= timeout {
                log::warn!(
                    "sip proxy: drain deadline ({:.1} s) passed with {left} transaction(s) left; exiting",
                    args.drain_timeout
                );
                return Ending::DrainTimedOut(left);
            }
        }
        // While draining the poll counts the table (every shard in turn).
        std::thread::sleep(Duration::from_millis(if drain.is_some() { 50 } else { 20 }));
    }
}
