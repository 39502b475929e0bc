//! The systemd service protocol (sd_notify(3)), spoken directly: one
//! datagram on the Unix socket named by `$NOTIFY_SOCKET` (a path, or an
//! abstract name written `@name`) per state change: `READY=1` once the
//! sockets are bound and the threads run, `RELOADING=1` then `READY=1`
//! around a reload, `STOPPING=1` when a drain or stop begins, and
//! `WATCHDOG=1` pings at half of `$WATCHDOG_USEC` while every worker's
//! loop has gone round since the previous ping ([`Watchdog`]). Outside
//! systemd (no `$NOTIFY_SOCKET`) nothing is sent. No libsystemd.

use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::time::{Duration, Instant};

/// Where states go: `$NOTIFY_SOCKET`.
#[derive(Debug)]
pub struct Notifier {
    socket: UnixDatagram,
    address: SocketAddr,
}

impl Notifier {
    /// The notifier `$NOTIFY_SOCKET` names, if any (a name that cannot be
    /// used is logged and ignored).
    pub fn from_env() -> Option<Notifier> {
        let name = std::env::var_os("NOTIFY_SOCKET")?;
        match Notifier::new(&name.to_string_lossy()) {
            Ok(notifier) => Some(notifier),
            Err(e) => {
                log::warn!("systemd: NOTIFY_SOCKET unusable: {e}");
                None
            }
        }
    }

    /// A notifier for the socket `name` (`/path` or `@abstract`).
    pub fn new(name: &str) -> std::io::Result<Notifier> {
        let address = if let Some(abstract_name) = name.strip_prefix('@') {
            use std::os::linux::net::SocketAddrExt;
            SocketAddr::from_abstract_name(abstract_name.as_bytes())?
        } else if name.starts_with('/') {
            SocketAddr::from_pathname(name)?
        } else {
            return Err(std::io::Error::other(format!(
                "{name:?}: neither a path nor @name"
            )));
        };
        Ok(Notifier {
            socket: UnixDatagram::unbound()?,
            address,
        })
    }

    /// Send `state` (newline-separated `KEY=VALUE` lines).
    pub fn notify(&self, state: &str) -> std::io::Result<()> {
        self.socket
            .send_to_addr(state.as_bytes(), &self.address)
            .map(|_| ())
    }

    /// [`Notifier::notify`], a failure logged (the service goes on).
    pub fn send(&self, state: &str) {
        if let Err(e) = self.notify(state) {
            crate::warn_limited!("systemd: notify {state:?}: {e}");
        }
    }
}

/// How often systemd wants a `WATCHDOG=1`: `$WATCHDOG_USEC`, when
/// `$WATCHDOG_PID` is unset or this process.
pub fn watchdog_timeout() -> Option<Duration> {
    if let Ok(pid) = std::env::var("WATCHDOG_PID") {
        if pid.trim().parse::<u32>().ok() != Some(std::process::id()) {
            return None;
        }
    }
    let usec: u64 = std::env::var("WATCHDOG_USEC").ok()?.trim().parse().ok()?;
    (usec > 0).then(|| Duration::from_micros(usec))
}

/// Watchdog pings that vouch for the workers: [`Watchdog::poll`] pings at
/// half the timeout, and only if every worker's loop counter moved since
/// the last ping (a stuck or dead worker stops the pings, and systemd
/// restarts the service).
#[derive(Debug)]
pub struct Watchdog {
    every: Duration,
    next: Instant,
    beats: Vec<u64>,
    /// Pings sent.
    pub pings: u64,
    /// Pings withheld because a worker had not gone round.
    pub withheld: u64,
}

impl Watchdog {
    /// A watchdog for `timeout` (systemd's `WatchdogSec`), from `now`.
    pub fn new(timeout: Duration, now: Instant) -> Watchdog {
        let every = timeout / 2;
        Watchdog {
            every,
            next: now + every,
            beats: Vec::new(),
            pings: 0,
            withheld: 0,
        }
    }

    /// Called often (every few tens of ms): at each half-timeout, `true`
    /// (send `WATCHDOG=1`) if `healthy` and every counter in `beats` (one
    /// per worker loop) moved since the previous check.
    pub fn poll(&mut self, now: Instant, beats: &[u64], healthy: bool) -> bool {
        if now < self.next {
            return false;
        }
        self.next = now + self.every;
        let moved = self.beats.len() == beats.len()
            && self
                .beats
                .iter()
                .zip(beats)
                .all(|(before, now)| now != before);
        let first = self.beats.is_empty() && !beats.is_empty();
        self.beats.clear();
        self.beats.extend_from_slice(beats);
        if healthy && (moved || first) {
            self.pings += 1;
            true
        } else {
            self.withheld += 1;
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn notifies_a_bound_socket() {
        let path = std::env::temp_dir().join(format!("ringway-notify-{}", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let server = UnixDatagram::bind(&path).unwrap();
        let notifier = Notifier::new(path.to_str().unwrap()).unwrap();
        notifier.notify("READY=1\nSTATUS=serving").unwrap();
        let mut buf = [0u8; 64];
        let n = server.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"READY=1\nSTATUS=serving");
        let _ = std::fs::remove_file(&path);
        // Abstract names too.
        let name = format!("ringway-test-{}", std::process::id());
        use std::os::linux::net::SocketAddrExt;
        let server =
            UnixDatagram::bind_addr(&SocketAddr::from_abstract_name(name.as_bytes()).unwrap())
                .unwrap();
        Notifier::new(&format!("@{name}"))
            .unwrap()
            .notify("WATCHDOG=1")
            .unwrap();
        let n = server.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"WATCHDOG=1");
        assert!(Notifier::new("relative").is_err());
    }

    #[test]
    fn pings_only_while_every_worker_goes_round() {
        let t0 = Instant::now();
        let s = Duration::from_secs(1);
        let mut dog = Watchdog::new(Duration::from_secs(2), t0);
        assert!(!dog.poll(t0, &[1, 1], true), "not before half the timeout");
        assert!(dog.poll(t0 + s, &[5, 7], true), "first check");
        assert!(dog.poll(t0 + 2 * s, &[9, 8], true), "both moved");
        assert!(!dog.poll(t0 + 3 * s, &[12, 8], true), "worker 1 stuck");
        assert!(dog.poll(t0 + 4 * s, &[13, 9], true), "going again");
        assert!(!dog.poll(t0 + 5 * s, &[14, 10], false), "a thread died");
        assert_eq!((dog.pings, dog.withheld), (3, 2));
    }
}
