//! Parts both real backends share: TX timestamp bookkeeping and the error
//! queue reader.

use crate::batch::TxStamp;
use crate::sys::{self, CmsgBuf, CMSG_BUF_WORDS};
use crate::time::Nanos;
use std::collections::VecDeque;
use std::io;
use std::os::fd::RawFd;

/// Most TX stamps waiting for their kernel half; older ones are forgotten.
const MAX_PENDING: usize = 8192;
/// Most collected stamps kept before the caller polls; older ones are dropped.
const MAX_READY: usize = 65536;

/// Matches kernel TX timestamps (keyed by the socket's OPT_ID counter, which
/// advances once per datagram that requested a stamp) to caller tags.
#[derive(Debug, Default)]
pub(crate) struct TxStamps {
    /// Key the kernel will give the next stamped datagram.
    next_key: u32,
    /// (key, tag, app_tx) of stamped datagrams not yet reported.
    pending: VecDeque<(u32, u64, Nanos)>,
    /// Stamps matched and waiting for `poll_tx_stamps`.
    ready: Vec<TxStamp>,
    /// Stamps given up on (never came back, or evicted).
    pub(crate) lost: u64,
}

impl TxStamps {
    /// Record that a datagram with a stamp request was accepted by the kernel.
    pub(crate) fn sent(&mut self, tag: u64, app_tx: Nanos) {
        if self.pending.len() >= MAX_PENDING {
            self.pending.pop_front();
            self.lost += 1;
        }
        self.pending.push_back((self.next_key, tag, app_tx));
        self.next_key = self.next_key.wrapping_add(1);
    }

    /// A kernel stamp with `key` arrived.
    fn matched(&mut self, key: u32, kernel_tx: Nanos) {
        let Some(pos) = self.pending.iter().position(|p| p.0 == key) else {
            return;
        };
        // Entries before it will not be stamped any more (the kernel reports in order).
        for _ in 0..pos {
            self.pending.pop_front();
            self.lost += 1;
        }
        let (_, tag, app_tx) = self.pending.pop_front().expect("position found");
        if self.ready.len() >= MAX_READY {
            self.lost += 1;
            return;
        }
        self.ready.push(TxStamp {
            tag,
            app_tx,
            kernel_tx,
        });
    }

    /// Read every message from the socket's error queue and match stamps.
    pub(crate) fn drain_errqueue(&mut self, fd: RawFd) -> io::Result<()> {
        let mut cbuf: CmsgBuf = [0; CMSG_BUF_WORDS];
        let mut data = [0u8; 64];
        loop {
            let mut iov = libc::iovec {
                iov_base: data.as_mut_ptr().cast(),
                iov_len: data.len(),
            };
            // SAFETY: msghdr is plain old data; all-zero is valid before we fill it.
            let mut hdr: libc::msghdr = unsafe { std::mem::zeroed() };
            hdr.msg_iov = &mut iov;
            hdr.msg_iovlen = 1;
            hdr.msg_control = cbuf.as_mut_ptr().cast();
            hdr.msg_controllen = std::mem::size_of_val(&cbuf) as _;
            // SAFETY: hdr points at live buffers (iov, cbuf) that outlive the call.
            let result = sys::cvt(unsafe {
                libc::recvmsg(fd, &mut hdr, libc::MSG_ERRQUEUE | libc::MSG_DONTWAIT)
            });
            if let Err(error) = result {
                match error.kind() {
                    io::ErrorKind::WouldBlock => return Ok(()),
                    io::ErrorKind::Interrupted => continue,
                    _ => return Err(error),
                }
            }
            let cmsgs = sys::parse_cmsgs(&hdr);
            if let (Some(key), Some(stamp)) = (cmsgs.ts_key, cmsgs.sw_stamp) {
                self.matched(key, stamp);
            }
        }
    }

    /// Move collected stamps into `out`.
    pub(crate) fn take(&mut self, out: &mut Vec<TxStamp>) -> usize {
        let ready = self.ready.len();
        out.append(&mut self.ready);
        ready
    }
}

/// Wait until `fd` has a datagram to read, draining TX stamps from the
/// error queue and counting pending socket errors on the way. Returns
/// `false` when `timeout` passed with nothing to read.
pub(crate) fn wait_for_datagram(
    fd: RawFd,
    timeout: Option<std::time::Duration>,
    stamps: &mut TxStamps,
    socket_errors: &mut u64,
) -> io::Result<bool> {
    use std::time::{Duration, Instant};
    let deadline = timeout.map(|t| Instant::now() + t);
    loop {
        let left = deadline.map(|d| d.saturating_duration_since(Instant::now()));
        match sys::wait_readable(fd, left)? {
            sys::Ready::Readable => return Ok(true),
            sys::Ready::ErrQueue => {
                stamps.drain_errqueue(fd)?;
                // A pending socket error (not queued) also raises POLLERR.
                if sys::take_socket_error(fd).is_some() {
                    *socket_errors += 1;
                }
                if left == Some(Duration::ZERO) {
                    return Ok(false);
                }
            }
            sys::Ready::Nothing => return Ok(false),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_in_order_and_skips_lost() {
        let mut t = TxStamps::default();
        for tag in [10, 11, 12, 13] {
            t.sent(tag, Nanos(tag));
        }
        // Key 1 (tag 11) arrives first: key 0 is given up.
        t.matched(1, Nanos(100));
        t.matched(3, Nanos(300));
        // Unknown or already consumed keys are ignored.
        t.matched(0, Nanos(1));
        t.matched(77, Nanos(1));
        let mut out = Vec::new();
        assert_eq!(t.take(&mut out), 2);
        assert_eq!(out.iter().map(|s| s.tag).collect::<Vec<_>>(), vec![11, 13]);
        assert_eq!(out[0].kernel_tx, Nanos(100));
        assert_eq!(out[0].app_tx, Nanos(11));
        assert_eq!(t.lost, 2);
        assert!(t.pending.is_empty());
    }

    #[test]
    fn pending_is_bounded() {
        let mut t = TxStamps::default();
        for i in 0..(MAX_PENDING as u64 + 5) {
            t.sent(i, Nanos(i));
        }
        assert_eq!(t.pending.len(), MAX_PENDING);
        assert_eq!(t.lost, 5);
        // The key counter kept counting: the newest entry still matches.
        t.matched((MAX_PENDING + 4) as u32, Nanos(1));
        let mut out = Vec::new();
        t.take(&mut out);
        assert_eq!(out[0].tag, MAX_PENDING as u64 + 4);
    }
}
