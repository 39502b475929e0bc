//! What every socket backend keeps about its UDP socket: the socket, its
//! counters, the TX stamp bookkeeping and the error queue's reader, and
//! the calls that only need those (reading stamps and ICMP reports, the
//! counters, waiting for a datagram).

use super::common::{ErrorQueue, TxStamps, Waiter};
use crate::backend::IoStats;
use crate::batch::TxStamp;
use crate::icmp::IcmpUnreachable;
use crate::sys;
use std::io;
use std::net::UdpSocket;
use std::os::fd::{AsRawFd, RawFd};
use std::time::{Duration, Instant};

/// A backend's socket and its bookkeeping.
pub(crate) struct SocketState {
    pub(crate) sock: UdpSocket,
    pub(crate) stats: IoStats,
    pub(crate) stamps: TxStamps,
    /// The error queue's reader (TX stamps, ICMP errors).
    pub(crate) errors: ErrorQueue,
    /// Stamp requests are honoured (socket has OPT_ID).
    pub(crate) tx_stamps: bool,
}

impl SocketState {
    /// The state of a backend on `sock`, its counters at zero.
    pub(crate) fn new(sock: UdpSocket, tx_stamps: bool, stamps: TxStamps) -> SocketState {
        SocketState {
            errors: ErrorQueue::new(&sock),
            sock,
            stats: IoStats::default(),
            stamps,
            tx_stamps,
        }
    }

    /// The socket's descriptor.
    pub(crate) fn fd(&self) -> RawFd {
        self.sock.as_raw_fd()
    }

    /// The TX stamp a send of an entry tagged `tag` asks the kernel for:
    /// `None` when the entry asks for none, or when the socket cannot
    /// stamp (then counted lost); otherwise `Some(key)`, the key to set on
    /// the datagram (`Some(None)`: the socket's counter numbers it).
    pub(crate) fn stamp_request(&mut self, tag: Option<u64>) -> Option<Option<u32>> {
        tag?;
        if !self.tx_stamps {
            self.stats.tx_stamps_lost += 1;
            return None;
        }
        Some(self.stamps.next_key())
    }

    /// Read the error queue and move the TX stamps read so far to `out`.
    pub(crate) fn poll_tx_stamps(&mut self, out: &mut Vec<TxStamp>) -> io::Result<usize> {
        self.errors.read(self.sock.as_raw_fd(), &mut self.stamps)?;
        Ok(self.stamps.take(out))
    }

    /// Move the ICMP unreachable reports to `out` (see [`ErrorQueue::poll`]).
    pub(crate) fn poll_unreachable(&mut self, out: &mut Vec<IcmpUnreachable>) -> io::Result<usize> {
        self.errors
            .poll(self.sock.as_raw_fd(), &mut self.stamps, out)
    }

    /// The counters, with the stamps lost and the error queue's counts,
    /// and `waiter`'s wake-ups (a backend that waits through one).
    pub(crate) fn stats(&self, waiter: Option<&Waiter>) -> IoStats {
        let mut stats = IoStats {
            tx_stamps_lost: self.stats.tx_stamps_lost + self.stamps.lost(),
            ..self.stats
        };
        if let Some(waiter) = waiter {
            stats.rx_wakeups = waiter.wakeups;
            stats.rx_idle_wakeups = waiter.idle_wakeups;
        }
        self.errors.count_into(&mut stats);
        stats
    }

    /// Wait until the socket has a datagram to read, reading the error
    /// queue (TX stamps, ICMP errors) and counting pending socket errors
    /// on the way. Returns `false` when `timeout` passed with nothing to
    /// read, or when the error queue gave ICMP reports for the caller to
    /// take. A `true` counts as a wake-up of `waiter`; the caller counts it
    /// idle if the receive then finds nothing.
    pub(crate) fn wait_for_datagram(
        &mut self,
        timeout: Option<Duration>,
        waiter: &mut Waiter,
    ) -> io::Result<bool> {
        let fd = self.sock.as_raw_fd();
        let deadline = timeout.map(|t| Instant::now() + t);
        loop {
            let left = deadline.map(|d| d.saturating_duration_since(Instant::now()));
            match waiter.wait(fd, left)? {
                sys::Ready::Readable => {
                    waiter.wakeups += 1;
                    return Ok(true);
                }
                sys::Ready::ErrQueue => {
                    self.errors.read(fd, &mut self.stamps)?;
                    // A pending socket error (not queued) also raises POLLERR.
                    if sys::take_socket_error(fd).is_some() {
                        self.stats.socket_errors += 1;
                    }
                    if left == Some(Duration::ZERO) || self.errors.holds_reports() {
                        return Ok(false);
                    }
                }
                sys::Ready::Nothing => return Ok(false),
            }
        }
    }
}
