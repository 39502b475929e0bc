//! `ringway ctl`: the client of the management API of a running
//! `sip proxy` or `sip dispatch` (like kamcmd): human output, or the
//! server's JSON with `--json`. See docs/operations.md.

use anyhow::Context;
use serde_json::Value;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::time::Duration;

/// Default management socket (the systemd unit's `RuntimeDirectory`).
pub(crate) const DEFAULT_SOCKET: &str = "/run/ringway/ringway.sock";
/// Largest answer read (bytes).
const MAX_ANSWER: u64 = 64 << 20;

/// Arguments of `ringway ctl`.
#[derive(clap::Args, Debug)]
pub(crate) struct CtlArgs {
    /// The server's management socket (its --manage-socket).
    #[arg(long, default_value = DEFAULT_SOCKET)]
    pub socket: PathBuf,
    /// Talk to its loopback HTTP listener instead (its --manage-http).
    #[arg(long)]
    pub http: Option<SocketAddr>,
    /// Bearer token file for --http.
    #[arg(long, value_hint = clap::ValueHint::FilePath)]
    pub token_file: Option<PathBuf>,
    /// Print the server's JSON answer as it is.
    #[arg(long)]
    pub json: bool,
    #[command(subcommand)]
    pub cmd: CtlCmd,
}

/// What to ask.
#[derive(clap::Subcommand, Debug)]
pub(crate) enum CtlCmd {
    /// Version, uptime, draining, transactions, bindings, reloads.
    Status,
    /// The core's counters.
    Counters,
    /// Transactions in the table.
    Transactions,
    /// Bindings per AOR (all, or one AOR's).
    Bindings {
        /// Only this AOR (`user@domain`).
        aor: Option<String>,
        /// List at most this many AORs.
        #[arg(long, default_value_t = 1000)]
        max: usize,
    },
    /// Remove an AOR's bindings (or one contact's).
    Unbind {
        /// The AOR (`user@domain`).
        aor: String,
        /// Only this contact URI.
        #[arg(long)]
        contact: Option<String>,
    },
    /// Re-read the configuration file and apply the reloadable keys.
    Reload,
    /// Drain: new requests get 503, the server exits when what is in flight is done.
    Drain {
        /// Serve again instead (before the drain ends).
        #[arg(long)]
        cancel: bool,
    },
    /// Show or set the log levels: LEVEL[,MODULE=LEVEL]... (off, error, warn, info, debug, trace).
    LogLevel {
        /// The new levels, e.g. `info,ringway_server::sip=debug`.
        level: Option<String>,
    },
    /// Dispatcher: its proxies and their states.
    Targets,
    /// Dispatcher: set a proxy's state.
    Target {
        /// enable, disable or drain.
        #[arg(value_parser = ["enable", "disable", "drain"])]
        action: String,
        /// The proxy, IP:PORT.
        address: SocketAddr,
    },
}

/// Run `ringway ctl`.
pub(crate) fn run(a: CtlArgs) -> anyhow::Result<()> {
    let (method, path) = request_of(&a.cmd);
    let (status, body) = ask(&a, method, &path)?;
    let value: Value = serde_json::from_str(&body)
        .with_context(|| format!("the server answered {status} with no JSON"))?;
    if !(200..300).contains(&status) {
        let message = value["error"].as_str().unwrap_or("error").to_string();
        if a.json {
            println!("{body}");
        }
        anyhow::bail!("{message} (HTTP {status})");
    }
    if a.json {
        print!("{body}");
        return Ok(());
    }
    print!("{}", human(&a.cmd, &value));
    Ok(())
}

fn request_of(cmd: &CtlCmd) -> (&'static str, String) {
    match cmd {
        CtlCmd::Status => ("GET", "/status".into()),
        CtlCmd::Counters => ("GET", "/counters".into()),
        CtlCmd::Transactions => ("GET", "/transactions".into()),
        CtlCmd::Bindings { aor, max } => (
            "GET",
            match aor {
                Some(aor) => format!("/bindings?aor={}&max={max}", encode(aor)),
                None => format!("/bindings?max={max}"),
            },
        ),
        CtlCmd::Unbind { aor, contact } => (
            "DELETE",
            match contact {
                Some(c) => format!("/bindings/{}?contact={}", encode(aor), encode(c)),
                None => format!("/bindings/{}", encode(aor)),
            },
        ),
        CtlCmd::Reload => ("POST", "/reload".into()),
        CtlCmd::Drain { cancel: false } => ("POST", "/drain".into()),
        CtlCmd::Drain { cancel: true } => ("DELETE", "/drain".into()),
        CtlCmd::LogLevel { level: None } => ("GET", "/log-level".into()),
        CtlCmd::LogLevel { level: Some(l) } => ("PUT", format!("/log-level?level={}", encode(l))),
        CtlCmd::Targets => ("GET", "/dispatch/targets".into()),
        CtlCmd::Target { action, address } => {
            ("POST", format!("/dispatch/targets/{address}/{action}"))
        }
    }
}

/// Percent-encode everything but unreserved characters.
fn encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~@".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Send one request; the status and the body.
fn ask(a: &CtlArgs, method: &str, path: &str) -> anyhow::Result<(u16, String)> {
    let token = match &a.token_file {
        Some(p) => Some(
            std::fs::read_to_string(p)
                .with_context(|| format!("--token-file {}", p.display()))?
                .lines()
                .next()
                .unwrap_or("")
                .trim()
                .to_string(),
        ),
        None => None,
    };
    let mut head = format!(
        "{method} {path} HTTP/1.1\r\nHost: ringway\r\nConnection: close\r\nContent-Length: 0\r\n"
    );
    if let Some(token_value) = &token {
        head.push_str(&format!("Authorization: Bearer {token_value}\r\n"));
    }
    head.push_str("\r\n");
    let timeout = Some(Duration::from_secs(10));
    let mut answer = Vec::new();
    match a.http {
        Some(addr) => {
            anyhow::ensure!(a.token_file.is_some(), "--http needs --token-file");
            let mut stream =
                TcpStream::connect(addr).with_context(|| format!("cannot reach {addr}"))?;
            stream.set_read_timeout(timeout)?;
            stream.write_all(head.as_bytes())?;
            stream.take(MAX_ANSWER).read_to_end(&mut answer)?;
        }
        None => {
            let mut stream = UnixStream::connect(&a.socket).with_context(|| {
                format!(
                    "cannot reach {} (is the server running with --manage-socket?)",
                    a.socket.display()
                )
            })?;
            stream.set_read_timeout(timeout)?;
            stream.write_all(head.as_bytes())?;
            stream.take(MAX_ANSWER).read_to_end(&mut answer)?;
        }
    }
    let text = String::from_utf8_lossy(&answer);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .context("the server's answer has no HTTP head")?;
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|stream| stream.parse().ok())
        .context("the server's answer has no status")?;
    Ok((status, body.to_string()))
}

/// The answer for a person.
fn human(cmd: &CtlCmd, v: &Value) -> String {
    let mut out = String::new();
    match cmd {
        CtlCmd::Bindings { .. } => {
            let aors = v["aors"].as_array().cloned().unwrap_or_default();
            for aor in &aors {
                out.push_str(&format!("{}\n", aor["aor"].as_str().unwrap_or("?")));
                for c in aor["contacts"].as_array().into_iter().flatten() {
                    out.push_str(&format!(
                        "    {}  expires in {} s  call-id {}  cseq {}\n",
                        c["contact"].as_str().unwrap_or("?"),
                        c["expires_in_s"],
                        c["call_id"].as_str().unwrap_or("?"),
                        c["cseq"],
                    ));
                }
            }
            out.push_str(&format!("{} AOR(s)\n", aors.len()));
        }
        CtlCmd::Unbind { .. } => {
            out.push_str(&format!(
                "removed {} binding(s) of {}\n",
                v["removed"],
                v["aor"].as_str().unwrap_or("?")
            ));
        }
        CtlCmd::Reload => {
            let list = |key: &str| {
                v[key]
                    .as_array()
                    .map(|a| {
                        a.iter()
                            .filter_map(Value::as_str)
                            .collect::<Vec<_>>()
                            .join(", ")
                    })
                    .unwrap_or_default()
            };
            out.push_str(&format!("reloaded: applied [{}]\n", list("applied")));
            if let Some(count) = v["credentials"].as_u64() {
                out.push_str(&format!("credentials: {count}\n"));
            }
            let restart = list("restart_needed");
            if !restart.is_empty() {
                out.push_str(&format!("changed but needing a restart: [{restart}]\n"));
            }
        }
        CtlCmd::Targets => {
            out.push_str(&format!(
                "{:<24} {:<6} {:<9} {:>10} {:>6}\n",
                "target", "alive", "state", "requests", "downs"
            ));
            for t in v["targets"].as_array().into_iter().flatten() {
                out.push_str(&format!(
                    "{:<24} {:<6} {:<9} {:>10} {:>6}\n",
                    t["address"].as_str().unwrap_or("?"),
                    t["alive"],
                    t["state"].as_str().unwrap_or("?"),
                    t["requests"],
                    t["downs"],
                ));
            }
        }
        _ => flat(&mut out, "", v),
    }
    out
}

/// `key: value` lines of a JSON object (nested keys joined with `.`).
fn flat(out: &mut String, prefix: &str, v: &Value) {
    match v {
        Value::Object(map) => {
            for (k, v) in map {
                let key = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                flat(out, &key, v);
            }
        }
        Value::String(s) => out.push_str(&format!("{prefix}: {s}\n")),
        other => out.push_str(&format!("{prefix}: {other}\n")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_uris_for_paths_and_queries() {
        assert_eq!(encode("alice@example.com"), "alice@example.com");
        assert_eq!(
            encode("sip:a@127.0.0.1:5070;transport=udp"),
            "sip%3Aa@127.0.0.1%3A5070%3Btransport%3Dudp"
        );
        assert_eq!(
            ringway_server::manage::percent_decode(&encode("sip:x y&z?%")),
            "sip:x y&z?%"
        );
    }
}
