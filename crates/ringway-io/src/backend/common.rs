//! Parts both real backends share: TX timestamp bookkeeping, the error
//! queue reader (TX stamps and ICMP errors), and the exclusive-wake-up
//! wait for a datagram.
//!
//! Several backends may run on one socket (the shared receive model:
//! every worker holds a dup of the same descriptor, like Kamailio's
//! children). Two things then need care:
//!
//! * **Wake-ups.** `poll` waiters are not exclusive: every datagram would
//!   wake every idle worker, and all but one would find nothing (review
//!   D5). Each backend waits in its own epoll instance with the socket
//!   registered `EPOLLEXCLUSIVE`, so the kernel wakes one idle waiter per
//!   datagram, as children blocking in `recvfrom` are woken. The socket is
//!   registered only for the length of each wait, as a `recvfrom` or a
//!   `ppoll` waiter is: an entry left on the socket's wait queue is called
//!   back on every datagram that arrives and on every send whose buffer
//!   space comes back, in the sender's kernel time (over loopback: our own
//!   sends into a peer's socket, and the peer's into ours), whether or not
//!   anyone waits. A backend alone on its socket waits with `ppoll`.
//! * **TX stamp keys.** The kernel's OPT_ID key is one counter per socket,
//!   and any of the workers may read the error queue (review D6). The
//!   backends on one socket share one [`StampBook`]; each sets its own key
//!   on every stamped datagram (`SCM_TS_OPT_ID`, Linux 6.13+: the owner in
//!   the top bits), and whoever drains the error queue files each stamp
//!   with its owner. Without `SCM_TS_OPT_ID` the socket's counter is used,
//!   which only one stamping backend per socket can follow: with two or
//!   more, stamps are off and counted lost.

use crate::backend::IoStats;
use crate::batch::TxStamp;
use crate::icmp::IcmpUnreachable;
use crate::sys::{self, CmsgBuf, CMSG_BUF_WORDS};
use crate::time::{monotonic_now, Nanos};
use std::collections::VecDeque;
use std::io;
use std::net::UdpSocket;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

/// Most TX stamps waiting for their kernel half; older ones are forgotten.
const MAX_PENDING: usize = 8192;
/// Most collected stamps kept before the caller polls; older ones are dropped.
const MAX_READY: usize = 65536;
/// Key bits below the owner's index (explicit keys).
const OWNER_SHIFT: u32 = 24;
/// Most backends sharing one socket's stamp book.
pub(crate) const MAX_OWNERS: usize = 1 << (32 - OWNER_SHIFT);

/// One backend's stamped datagrams and matched stamps.
#[derive(Debug, Default)]
struct OwnerStamps {
    /// Sequence number of this owner's next explicit key.
    next: u32,
    /// (key, tag, app_tx) of stamped datagrams not yet reported.
    pending: VecDeque<(u32, u64, Nanos)>,
    /// Stamps matched and waiting for `poll_tx_stamps`.
    ready: Vec<TxStamp>,
    /// Stamps given up on (never came back, or evicted).
    lost: u64,
}

impl OwnerStamps {
    fn expect(&mut self, key: u32, tag: u64, app_tx: Nanos) {
        if self.pending.len() >= MAX_PENDING {
            self.pending.pop_front();
            self.lost += 1;
        }
        self.pending.push_back((key, tag, app_tx));
    }

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
}

/// The TX stamp bookkeeping of every backend on one socket.
#[derive(Debug)]
pub(crate) struct StampBook {
    /// Keys are set per datagram (`SCM_TS_OPT_ID`), owner in the top bits;
    /// otherwise the socket's counter numbers them (one owner only).
    explicit: bool,
    /// Key the kernel's counter gives the next stamped datagram (counter mode).
    counter: u32,
    owners: Vec<OwnerStamps>,
}

impl StampBook {
    /// A book for `owners` backends (1..=[`MAX_OWNERS`]).
    pub(crate) fn new(owners: usize, explicit: bool) -> Arc<Mutex<StampBook>> {
        Arc::new(Mutex::new(StampBook {
            explicit,
            counter: 0,
            owners: (0..owners.clamp(1, MAX_OWNERS))
                .map(|_| OwnerStamps::default())
                .collect(),
        }))
    }

    /// A stamp with `key` came back from the kernel: file it with its owner.
    fn matched(&mut self, key: u32, kernel_tx: Nanos) {
        let owner = if self.explicit {
            (key >> OWNER_SHIFT) as usize
        } else {
            0
        };
        if let Some(entry) = self.owners.get_mut(owner) {
            entry.matched(key, kernel_tx);
        }
    }
}

/// One backend's handle on its socket's [`StampBook`]: matches kernel TX
/// timestamps to caller tags.
#[derive(Debug)]
pub(crate) struct TxStamps {
    book: Arc<Mutex<StampBook>>,
    owner: usize,
}

impl Default for TxStamps {
    /// The only backend on its socket, keys from the socket's counter.
    fn default() -> Self {
        TxStamps::owner(StampBook::new(1, false), 0)
    }
}

impl TxStamps {
    /// Backend `owner` of the book's socket.
    pub(crate) fn owner(book: Arc<Mutex<StampBook>>, owner: usize) -> TxStamps {
        TxStamps { book, owner }
    }

    /// The book for the only backend on its socket: explicit keys where the
    /// kernel takes them.
    pub(crate) fn single() -> TxStamps {
        TxStamps::owner(StampBook::new(1, explicit_keys_supported()), 0)
    }

    fn book(&self) -> MutexGuard<'_, StampBook> {
        // A panic while holding the lock leaves plain counters: keep going.
        self.book.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Stamps given up on by this backend.
    pub(crate) fn lost(&self) -> u64 {
        self.book().owners[self.owner].lost
    }

    /// Before sending a datagram with a stamp request: the key to set on
    /// it (`SCM_TS_OPT_ID`). Register it with [`TxStamps::expect`] before
    /// the send call, so that whichever backend drains the error queue can
    /// file the stamp even before the call returns. `None`: counter mode;
    /// call [`TxStamps::sent`] after the kernel accepted the datagram.
    pub(crate) fn next_key(&mut self) -> Option<u32> {
        let owner = self.owner;
        let mut book = self.book();
        if !book.explicit {
            return None;
        }
        let entry = &mut book.owners[owner];
        let key = ((owner as u32) << OWNER_SHIFT) | (entry.next & ((1 << OWNER_SHIFT) - 1));
        entry.next = entry.next.wrapping_add(1);
        Some(key)
    }

    /// The datagram with explicit `key` and caller `tag` goes to the
    /// kernel now (`app_tx`).
    pub(crate) fn expect(&mut self, key: u32, tag: u64, app_tx: Nanos) {
        let owner = self.owner;
        self.book().owners[owner].expect(key, tag, app_tx);
    }

    /// The datagram that got `key` from [`TxStamps::next_key`] was not
    /// sent: forget it (not a lost stamp).
    pub(crate) fn unsent(&mut self, key: u32) {
        let owner = self.owner;
        let mut book = self.book();
        let pending = &mut book.owners[owner].pending;
        if let Some(pos) = pending.iter().rposition(|p| p.0 == key) {
            pending.remove(pos);
        }
    }

    /// Counter mode: a datagram with a stamp request was accepted by the
    /// kernel (the socket's counter numbered it).
    pub(crate) fn sent(&mut self, tag: u64, app_tx: Nanos) {
        let owner = self.owner;
        let mut book = self.book();
        let key = book.counter;
        book.counter = key.wrapping_add(1);
        book.owners[owner].expect(key, tag, app_tx);
    }

    /// A stamp with `key` came back from the kernel at `kernel_tx`: file
    /// it with its owner (whichever backend read it).
    fn file(&mut self, key: u32, kernel_tx: Nanos) {
        self.book().matched(key, kernel_tx);
    }

    /// Move this backend's collected stamps into `out`.
    pub(crate) fn take(&mut self, out: &mut Vec<TxStamp>) -> usize {
        let owner = self.owner;
        let mut book = self.book();
        let ready = &mut book.owners[owner].ready;
        let ready_len = ready.len();
        out.append(ready);
        ready_len
    }
}

/// Times a send that failed with an asynchronous error is tried again.
/// With `IP_RECVERR` an ICMP error about an earlier datagram (to any
/// peer) is left pending on the socket, and the next send on it fails
/// with it once, whatever its destination: that datagram is sent again
/// rather than lost. Bounded, so errors arriving faster than we send
/// cannot hold a send call.
pub(crate) const ASYNC_ERROR_RETRIES: usize = 3;

/// Most messages one read of the error queue takes: bounded work per
/// call, whatever arrives (the queue itself is bounded by the socket's
/// receive buffer); a read that stops there leaves the next one due.
const ERRQUEUE_READS: usize = 256;
/// Most ICMP reports a backend keeps until the caller takes them
/// ([`ErrorQueue::poll`]); beyond, the oldest are dropped (counted lost).
const MAX_REPORTS: usize = 1024;
/// How often [`ErrorQueue::poll`] reads a watched error queue that gave
/// no sign (an error a send or receive call consumed said nothing to us,
/// or a TX stamp's wake-up went to another backend): one system call per
/// period at most, and no ICMP error waits longer.
const ERRQUEUE_PERIOD_NS: u64 = 10_000_000;

/// One backend's reader of its socket's error queue: files TX stamps with
/// their owners ([`TxStamps`]) and keeps the ICMP errors that say a
/// destination cannot be reached ([`IcmpUnreachable`]) for the caller, so
/// that a read for either kind loses neither.
///
/// With `IP_RECVERR` each ICMP error is queued *and* left pending on the
/// socket (`SO_ERROR`), where the next send or receive call on it, to any
/// peer, fails once with it (the backends retry that call). Such a
/// failure, or `POLLERR` while waiting, is the sign that the queue holds
/// something; without one, a watched queue is read every
/// [`ERRQUEUE_PERIOD_NS`] when the caller polls, so it never fills the
/// receive buffer it is charged to.
#[derive(Debug)]
pub(crate) struct ErrorQueue {
    /// The socket has `IP_RECVERR`/`IPV6_RECVERR` on.
    watched: bool,
    /// Something is (probably) queued: read at the next poll.
    due: bool,
    /// When a watched queue is read at the latest without a sign
    /// (monotonic ns).
    next_read: u64,
    /// Reports waiting for the caller, oldest first.
    reports: VecDeque<IcmpUnreachable>,
    /// Unreachable reports read.
    unreachable: u64,
    /// Other errors read (time exceeded, path MTU, local errors).
    ignored: u64,
    /// Reports dropped because the caller had not taken them.
    lost: u64,
}

impl ErrorQueue {
    /// The reader for `sock` (watched when it has IP_RECVERR/IPV6_RECVERR).
    pub(crate) fn new(sock: &UdpSocket) -> ErrorQueue {
        ErrorQueue {
            watched: crate::sock::recv_errors_enabled(sock.as_raw_fd()),
            due: false,
            next_read: 0,
            reports: VecDeque::new(),
            unreachable: 0,
            ignored: 0,
            lost: 0,
        }
    }

    /// A send or receive call failed with an asynchronous error (a
    /// pending ICMP error): the queue holds it.
    pub(crate) fn signal(&mut self) {
        self.due = true;
    }

    /// Reports are waiting for the caller.
    pub(crate) fn holds_reports(&self) -> bool {
        !self.reports.is_empty()
    }

    /// Read up to [`ERRQUEUE_READS`] messages from the error queue of `fd`:
    /// TX stamps go to `stamps`, unreachable reports are kept.
    pub(crate) fn read(&mut self, fd: RawFd, stamps: &mut TxStamps) -> io::Result<()> {
        let mut cbuf: CmsgBuf = [0; CMSG_BUF_WORDS];
        let mut data = [0u8; 64];
        let mut name = sys::zero_storage();
        self.due = false;
        self.next_read = monotonic_now().0.saturating_add(ERRQUEUE_PERIOD_NS);
        let mut reads = 0;
        while reads < ERRQUEUE_READS {
            let mut iov = libc::iovec {
                iov_base: data.as_mut_ptr().cast(),
                iov_len: data.len(),
            };
            // SAFETY: msghdr is plain old data; all-zero is valid before we fill it.
            let mut hdr: libc::msghdr = unsafe { std::mem::zeroed() };
            hdr.msg_name = (&mut name as *mut libc::sockaddr_storage).cast();
            hdr.msg_namelen = std::mem::size_of::<libc::sockaddr_storage>() as _;
            hdr.msg_iov = &mut iov;
            hdr.msg_iovlen = 1;
            hdr.msg_control = cbuf.as_mut_ptr().cast();
            hdr.msg_controllen = std::mem::size_of_val(&cbuf) as _;
            // SAFETY: hdr points at live buffers (name, iov, cbuf) that outlive the call.
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
            reads += 1;
            let cmsgs = sys::parse_cmsgs(&hdr);
            if let (Some(key), Some(stamp)) = (cmsgs.ts_key, cmsgs.sw_stamp) {
                stamps.file(key, stamp);
            }
            if let Some(error) = cmsgs.error {
                let report = sys::sockaddr_to(&name, hdr.msg_namelen)
                    .and_then(|to| IcmpUnreachable::from_error(&error, to));
                self.keep(report);
            }
        }
        // Stopped at the bound: the rest at the next poll.
        self.due = true;
        Ok(())
    }

    /// Keep `report` for the caller (the oldest goes when full); `None`:
    /// an error that is no unreachable report.
    fn keep(&mut self, report: Option<IcmpUnreachable>) {
        let Some(report) = report else {
            self.ignored += 1;
            return;
        };
        self.unreachable += 1;
        if self.reports.len() >= MAX_REPORTS {
            self.reports.pop_front();
            self.lost += 1;
        }
        self.reports.push_back(report);
    }

    /// [`crate::BatchIo::poll_unreachable`]: read the queue if a sign says
    /// so or its period passed (watched sockets only), then move the
    /// reports into `out`.
    pub(crate) fn poll(
        &mut self,
        fd: RawFd,
        stamps: &mut TxStamps,
        out: &mut Vec<IcmpUnreachable>,
    ) -> io::Result<usize> {
        if self.due || (self.watched && monotonic_now().0 >= self.next_read) {
            self.read(fd, stamps)?;
        }
        let count = self.reports.len();
        out.extend(self.reports.drain(..));
        Ok(count)
    }

    /// Add the reader's counters to `stats`.
    pub(crate) fn count_into(&self, stats: &mut IoStats) {
        stats.icmp_unreachable += self.unreachable;
        stats.icmp_ignored += self.ignored;
        stats.icmp_lost += self.lost;
    }
}

/// Whether this kernel takes a TX stamp key per datagram (`SCM_TS_OPT_ID`,
/// Linux 6.13+) and reports it back: sends one stamped datagram to itself
/// over loopback with a chosen key and reads the key from the error
/// queue. Checked once per process.
pub(crate) fn explicit_keys_supported() -> bool {
    static PROBE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *PROBE.get_or_init(|| probe_explicit_keys().unwrap_or(false))
}

fn probe_explicit_keys() -> io::Result<bool> {
    const KEY: u32 = 0x5a17_0b1d;
    let mut config = crate::SocketConfig::new("127.0.0.1:0".parse().expect("address"));
    config.tx_timestamps = true;
    let (sock, _) = crate::open_udp(&config)?;
    let target = sock.local_addr()?;
    let fd = sock.as_raw_fd();
    let mut cbuf: CmsgBuf = [0; CMSG_BUF_WORDS];
    let clen = sys::write_tx_stamp_cmsg(&mut cbuf, Some(KEY));
    let mut name = sys::zero_storage();
    let namelen = sys::sockaddr_from(&target, &mut name);
    let payload = [0u8; 1];
    let mut iov = libc::iovec {
        iov_base: payload.as_ptr() as *mut libc::c_void,
        iov_len: payload.len(),
    };
    // SAFETY: msghdr is plain old data; all-zero is valid before we fill it.
    let mut hdr: libc::msghdr = unsafe { std::mem::zeroed() };
    hdr.msg_name = (&mut name as *mut libc::sockaddr_storage).cast();
    hdr.msg_namelen = namelen;
    hdr.msg_iov = &mut iov;
    hdr.msg_iovlen = 1;
    hdr.msg_control = cbuf.as_mut_ptr().cast();
    hdr.msg_controllen = clen as _;
    // SAFETY: hdr points at live buffers (name, payload, cbuf) valid for the call.
    if sys::cvt(unsafe { libc::sendmsg(fd, &hdr, 0) }).is_err() {
        // EINVAL: the control message type is unknown to this kernel.
        return Ok(false);
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(1);
    while std::time::Instant::now() < deadline {
        let mut pfd = [libc::pollfd {
            fd,
            events: 0,
            revents: 0,
        }];
        sys::ppoll(&mut pfd, Some(std::time::Duration::from_millis(50)))?;
        let mut data = [0u8; 64];
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
        if result.is_ok() {
            return Ok(sys::parse_cmsgs(&hdr).ts_key == Some(KEY));
        }
    }
    Ok(false)
}

/// Waits for a datagram on one socket and counts the wake-ups: alone on
/// the socket with `ppoll`; sharing it, in an epoll instance of its own
/// with the socket registered `EPOLLEXCLUSIVE` while it waits (one idle
/// waiter woken per datagram; see the module doc). Falls back to `ppoll`
/// if the epoll instance cannot be made.
#[derive(Debug)]
pub(crate) struct Waiter {
    /// Other backends receive on the same socket.
    shared: bool,
    /// The epoll instance of a shared socket's waiter, made at its first
    /// wait (an instance that could not be made: `Some(None)`, `ppoll`).
    epoll: Option<Option<OwnedFd>>,
    /// epoll_pwait2 (nanosecond timeouts) is missing: whole milliseconds.
    millis_only: bool,
    /// Waits that returned because the socket had a datagram.
    pub(crate) wakeups: u64,
    /// Of those, the receive that followed found nothing (another waiter
    /// had taken it: a needless wake-up).
    pub(crate) idle_wakeups: u64,
}

impl Waiter {
    /// A waiter for a backend that other backends share its socket with
    /// (`shared`), or that is alone on it.
    pub(crate) fn new(shared: bool) -> Waiter {
        Waiter {
            shared,
            epoll: None,
            millis_only: false,
            wakeups: 0,
            idle_wakeups: 0,
        }
    }

    /// Wait until `fd` is readable or has something in its error queue,
    /// at most `timeout` (`None`: forever).
    pub(super) fn wait(&mut self, fd: RawFd, timeout: Option<Duration>) -> io::Result<sys::Ready> {
        if !self.shared {
            return sys::wait_readable(fd, timeout);
        }
        let epoll = self.epoll.get_or_insert_with(|| new_epoll().ok());
        let Some(epoll) = epoll.as_ref().map(|e| e.as_raw_fd()) else {
            return sys::wait_readable(fd, timeout);
        };
        if register_exclusive(epoll, fd).is_err() {
            return sys::wait_readable(fd, timeout);
        }
        let ready = self.epoll_wait(epoll, timeout);
        // SAFETY: both descriptors are open; DEL ignores the event argument.
        let removed = sys::cvt(unsafe {
            libc::epoll_ctl(epoll, libc::EPOLL_CTL_DEL, fd, std::ptr::null_mut())
        });
        if removed.is_err() {
            // Left registered, the next ADD would fail (EEXIST) and every
            // wait fall back to ppoll: start over with a new instance.
            self.epoll = None;
        }
        ready
    }

    /// One `epoll_pwait2` (or `epoll_wait`) on `epoll`, at most `timeout`.
    fn epoll_wait(&mut self, epoll: RawFd, timeout: Option<Duration>) -> io::Result<sys::Ready> {
        // SAFETY: epoll_event is plain old data; all-zero is valid.
        let mut event: libc::epoll_event = unsafe { std::mem::zeroed() };
        let result = if self.millis_only {
            let millis = timeout.map_or(-1, |t| {
                // Round up so that a short wait is not a busy spin.
                t.as_nanos().div_ceil(1_000_000).min(i32::MAX as u128) as libc::c_int
            });
            // SAFETY: one live epoll_event to fill; maxevents 1.
            sys::cvt(unsafe { libc::epoll_wait(epoll, &mut event, 1, millis) })
        } else {
            let ts = timeout.map(|t| libc::timespec {
                tv_sec: t.as_secs().min(i64::MAX as u64) as libc::time_t,
                tv_nsec: t.subsec_nanos() as libc::c_long,
            });
            let tsp = ts
                .as_ref()
                .map_or(std::ptr::null(), |t| t as *const libc::timespec);
            // SAFETY: epoll_pwait2(epfd, events, maxevents, timeout, sigmask,
            // sigsetsize): one live epoll_event, a null or live timespec, no
            // signal mask.
            let result = sys::cvt(unsafe {
                libc::syscall(
                    libc::SYS_epoll_pwait2,
                    epoll,
                    &mut event as *mut libc::epoll_event,
                    1 as libc::c_int,
                    tsp,
                    std::ptr::null::<libc::sigset_t>(),
                    0usize,
                )
            });
            match result {
                Err(e) if e.raw_os_error() == Some(libc::ENOSYS) => {
                    self.millis_only = true;
                    return self.epoll_wait(epoll, timeout);
                }
                other => other.map(|ready| ready as libc::c_int),
            }
        };
        let ready = match result {
            Ok(ready) => ready,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => 0,
            Err(e) => return Err(e),
        };
        if ready == 0 {
            return Ok(sys::Ready::Nothing);
        }
        let events = event.events;
        if events & libc::EPOLLIN as u32 != 0 {
            Ok(sys::Ready::Readable)
        } else if events & libc::EPOLLERR as u32 != 0 {
            Ok(sys::Ready::ErrQueue)
        } else {
            Ok(sys::Ready::Readable)
        }
    }
}

/// An empty epoll instance.
fn new_epoll() -> io::Result<OwnedFd> {
    // SAFETY: plain epoll_create1 call.
    let epfd = sys::cvt(unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) })?;
    // SAFETY: epfd is a descriptor we just created and own alone.
    Ok(unsafe { OwnedFd::from_raw_fd(epfd) })
}

/// Register `fd` in `epoll` for input, exclusively (`EPOLLEXCLUSIVE` is
/// only taken by `EPOLL_CTL_ADD`).
fn register_exclusive(epoll: RawFd, fd: RawFd) -> io::Result<()> {
    let mut event = libc::epoll_event {
        events: (libc::EPOLLIN | libc::EPOLLEXCLUSIVE) as u32,
        u64: 0,
    };
    // SAFETY: both descriptors are open; `event` is live for the call.
    sys::cvt(unsafe { libc::epoll_ctl(epoll, libc::EPOLL_CTL_ADD, fd, &mut event) })?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn matched(t: &TxStamps, key: u32, at: u64) {
        t.book().matched(key, Nanos(at));
    }

    fn pending(t: &TxStamps) -> usize {
        t.book().owners[t.owner].pending.len()
    }

    #[test]
    fn matches_in_order_and_skips_lost() {
        let mut t = TxStamps::default();
        for tag in [10, 11, 12, 13] {
            t.sent(tag, Nanos(tag));
        }
        // Key 1 (tag 11) arrives first: key 0 is given up.
        matched(&t, 1, 100);
        matched(&t, 3, 300);
        // Unknown or already consumed keys are ignored.
        matched(&t, 0, 1);
        matched(&t, 77, 1);
        let mut out = Vec::new();
        assert_eq!(t.take(&mut out), 2);
        assert_eq!(out.iter().map(|s| s.tag).collect::<Vec<_>>(), vec![11, 13]);
        assert_eq!(out[0].kernel_tx, Nanos(100));
        assert_eq!(out[0].app_tx, Nanos(11));
        assert_eq!(t.lost(), 2);
        assert_eq!(pending(&t), 0);
    }

    #[test]
    fn pending_is_bounded() {
        let mut t = TxStamps::default();
        for i in 0..(MAX_PENDING as u64 + 5) {
            t.sent(i, Nanos(i));
        }
        assert_eq!(pending(&t), MAX_PENDING);
        assert_eq!(t.lost(), 5);
        // The key counter kept counting: the newest entry still matches.
        matched(&t, (MAX_PENDING + 4) as u32, 1);
        let mut out = Vec::new();
        t.take(&mut out);
        assert_eq!(out[0].tag, MAX_PENDING as u64 + 4);
    }

    /// Review D6: two workers on one socket send stamped datagrams
    /// interleaved; the kernel returns the stamps in its order and either
    /// worker may drain them. Each stamp must reach the worker that sent
    /// the datagram, with that datagram's tag and send time.
    #[test]
    fn two_workers_interleaved_keys_reach_their_owner() {
        let book = StampBook::new(2, true);
        let mut a = TxStamps::owner(book.clone(), 0);
        let mut b = TxStamps::owner(book.clone(), 1);
        // Sends in time order: a, b, b, a, b (tags say who and which).
        let mut order = Vec::new();
        for (i, who) in [0, 1, 1, 0, 1].into_iter().enumerate() {
            let w = if who == 0 { &mut a } else { &mut b };
            let tag = 100 * (who + 1) + i as u64;
            let key = w.next_key().expect("explicit keys");
            w.expect(key, tag, Nanos(1000 + i as u64));
            order.push((key, i as u64));
        }
        // Keys of different workers never collide.
        let mut keys: Vec<u32> = order.iter().map(|o| o.0).collect();
        keys.sort_unstable();
        keys.dedup();
        assert_eq!(keys.len(), 5);
        // Worker b drains all five stamps (kernel order = send order).
        for &(key, i) in &order {
            matched(&b, key, 5000 + i);
        }
        let (mut out_a, mut out_b) = (Vec::new(), Vec::new());
        a.take(&mut out_a);
        b.take(&mut out_b);
        let seen = |out: &[TxStamp]| {
            out.iter()
                .map(|s| (s.tag, s.app_tx.0, s.kernel_tx.0))
                .collect::<Vec<_>>()
        };
        assert_eq!(seen(&out_a), vec![(100, 1000, 5000), (103, 1003, 5003)]);
        assert_eq!(
            seen(&out_b),
            vec![(201, 1001, 5001), (202, 1002, 5002), (204, 1004, 5004)]
        );
        assert_eq!(a.lost() + b.lost(), 0);
    }

    /// A datagram that was never sent is forgotten, not counted lost, and
    /// does not make the next stamp look late.
    #[test]
    fn unsent_key_is_forgotten() {
        let book = StampBook::new(1, true);
        let mut t = TxStamps::owner(book, 0);
        let k0 = t.next_key().unwrap();
        t.expect(k0, 1, Nanos(1));
        t.unsent(k0);
        let k1 = t.next_key().unwrap();
        t.expect(k1, 2, Nanos(2));
        matched(&t, k1, 9);
        let mut out = Vec::new();
        assert_eq!(t.take(&mut out), 1);
        assert_eq!(out[0].tag, 2);
        assert_eq!(t.lost(), 0);
    }

    /// Reports the caller does not take are bounded: the oldest go, and
    /// are counted lost; errors that are no unreachable report are counted.
    #[test]
    fn kept_reports_are_bounded() {
        let mut errors = ErrorQueue {
            watched: true,
            due: false,
            next_read: 0,
            reports: VecDeque::new(),
            unreachable: 0,
            ignored: 0,
            lost: 0,
        };
        for port in 0..(MAX_REPORTS + 3) as u16 {
            errors.keep(Some(IcmpUnreachable {
                destination: std::net::SocketAddr::from(([192, 0, 2, 1], port)),
                errno: libc::ECONNREFUSED,
                icmp_type: 3,
                icmp_code: 3,
            }));
        }
        errors.keep(None);
        assert_eq!(errors.reports.len(), MAX_REPORTS);
        assert_eq!(errors.reports[0].destination.port(), 3);
        let mut stats = IoStats::default();
        errors.count_into(&mut stats);
        assert_eq!(
            (stats.icmp_unreachable, stats.icmp_lost, stats.icmp_ignored),
            (MAX_REPORTS as u64 + 3, 3, 1)
        );
    }
}
