//! io_uring: one multishot `IORING_OP_RECVMSG` with a provided-buffer ring
//! (the kernel picks a buffer per datagram and lays out an
//! `io_uring_recvmsg_out` header, peer address, control messages and payload
//! in it), and one `IORING_OP_SENDMSG` SQE per outgoing datagram, a whole
//! batch submitted with one `io_uring_enter`.
//!
//! The ring is set up with `IORING_SETUP_SINGLE_ISSUER | DEFER_TASKRUN`: the
//! kernel receives only while we are inside `io_uring_enter(GETEVENTS)`, so
//! datagrams wait in the socket queue (and are dropped and counted there
//! when it is full) exactly as with the other backends, and no other thread
//! is interrupted to run our completions. Single issuer means one thread
//! submits: the ring is created lazily by the first call, and rebuilt if a
//! later call comes from another thread (completions not yet taken by then
//! are lost; move the backend before using it, as `BatchIo: Send` intends).
//!
//! Buffers hold `max(frame size of the first receive batch, 2048)` payload
//! bytes; a later receive batch with larger frames rebuilds the buffer ring
//! (once nothing is outstanding in it), so a datagram is cut only where the
//! caller's frame cuts it.

use super::common::TxStamps;
use super::socket_state::SocketState;
use crate::backend::{BackendKind, BackendUnavailable, BatchIo, IoStats};
use crate::batch::{RxBatch, RxMeta, TxBatch, TxStamp};
use crate::icmp::IcmpUnreachable;
use crate::sys::{self, CmsgBuf, Mapping, CMSG_BUF_WORDS};
use crate::time::realtime_now;
use io_uring::{cqueue, opcode, types, IoUring};
use std::collections::VecDeque;
use std::io;
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicU16, Ordering};
use std::thread::ThreadId;
use std::time::{Duration, Instant};

/// user_data of the multishot receive.
const UD_RECV: u64 = 1;
/// user_data of a send: this tag plus the datagram's index in the batch.
const UD_SEND: u64 = 1 << 32;
/// Buffer group id of the provided-buffer ring.
const BGID: u16 = 7;
/// `IORING_ENTER_GETEVENTS`.
const ENTER_GETEVENTS: u32 = 1;
/// `IORING_ENTER_EXT_ARG`.
const ENTER_EXT_ARG: u32 = 8;
/// Size of `struct io_uring_recvmsg_out`.
const RECVMSG_OUT: usize = 16;
/// Space reserved for the peer address in each buffer.
const NAME_LEN: usize = std::mem::size_of::<libc::sockaddr_storage>();
/// Space reserved for control messages in each buffer.
const CTRL_LEN: usize = std::mem::size_of::<CmsgBuf>();
/// Smallest payload room per buffer.
const MIN_PAYLOAD: usize = 2048;
/// Submission queue entries (send batches larger than this go in chunks).
const SQ_ENTRIES: u32 = 256;

/// Options of the io_uring backend.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct UringConfig {
    /// Buffers in the provided-buffer ring: datagrams the kernel can receive
    /// before we hand buffers back. Rounded up to a power of two, 1..=32768.
    /// When they run out the multishot receive ends with ENOBUFS
    /// ([`IoStats::rx_nobufs`]) and is re-armed; datagrams wait in the socket.
    pub buffers: u16,
}

impl Default for UringConfig {
    fn default() -> Self {
        UringConfig { buffers: 512 }
    }
}

/// The provided-buffer ring: `entries` descriptors (16 bytes each, the tail
/// shares the first one's reserved field) and `entries` buffers.
struct BufRing {
    ring: Mapping,
    mem: Mapping,
    entries: u16,
    buf_size: usize,
    /// Our copy of the tail, published with [`BufRing::publish`].
    tail: u16,
}

impl BufRing {
    fn new(entries: u16, payload: usize) -> io::Result<BufRing> {
        let buf_size = (RECVMSG_OUT + NAME_LEN + CTRL_LEN + payload).next_multiple_of(64);
        let ring = Mapping::anon(entries as usize * 16)?;
        let mem = Mapping::anon(entries as usize * buf_size)?;
        let mut buf_ring = BufRing {
            ring,
            mem,
            entries,
            buf_size,
            tail: 0,
        };
        for bid in 0..entries {
            buf_ring.push(bid);
        }
        Ok(buf_ring)
    }

    /// Payload bytes one buffer can take.
    fn payload_room(&self) -> usize {
        self.buf_size - RECVMSG_OUT - NAME_LEN - CTRL_LEN
    }

    /// Queue buffer `bid` for the kernel (visible after `publish`).
    fn push(&mut self, bid: u16) {
        let slot = (self.tail & (self.entries - 1)) as usize;
        // SAFETY: slot < entries, so the 16-byte descriptor lies inside the ring
        // mapping; we write addr/len/bid only, never the shared tail field at
        // offset 14 of descriptor 0. bid < entries, so the buffer lies inside `mem`.
        unsafe {
            let desc = self.ring.ptr.add(slot * 16);
            let addr = self.mem.ptr.add(bid as usize * self.buf_size) as u64;
            std::ptr::write_volatile(desc.cast::<u64>(), addr);
            std::ptr::write_volatile(desc.add(8).cast::<u32>(), self.buf_size as u32);
            std::ptr::write_volatile(desc.add(12).cast::<u16>(), bid);
        }
        self.tail = self.tail.wrapping_add(1);
    }

    /// Make pushed buffers visible to the kernel.
    fn publish(&self) {
        // SAFETY: the tail is the u16 at offset 14 of the page-aligned ring,
        // which the kernel reads concurrently; an atomic release store orders
        // the descriptor writes before it.
        let tail = unsafe { &*self.ring.ptr.add(14).cast::<AtomicU16>() };
        tail.store(self.tail, Ordering::Release);
    }

    /// The whole of buffer `bid`.
    fn buf(&self, bid: u16) -> Option<&[u8]> {
        if bid >= self.entries {
            return None;
        }
        // SAFETY: bid < entries, so the range lies inside `mem`; the kernel
        // wrote it before posting the completion and does not touch it until
        // we push the buffer back.
        Some(unsafe {
            std::slice::from_raw_parts(
                self.mem.ptr.add(bid as usize * self.buf_size),
                self.buf_size,
            )
        })
    }
}

/// Receive-side state next to the ring.
struct RxState {
    bufs: BufRing,
    /// Template for the multishot recvmsg: only the name and control lengths
    /// matter. Boxed so its address stays put while the request may read it.
    hdr: Box<libc::msghdr>,
    /// The multishot receive is submitted (or queued for submission) and has
    /// not ended.
    armed: bool,
    /// It was armed before (later arms are counted as re-arms).
    ever_armed: bool,
    /// Receive completions taken off the CQ while waiting for sends.
    stash: VecDeque<(i32, u32)>,
    /// Buffers handed back since the last publish.
    recycled: bool,
}

/// Send scratch, grown to the largest batch seen.
#[derive(Default)]
struct TxScratch {
    hdrs: Vec<libc::msghdr>,
    iovs: Vec<libc::iovec>,
    names: Vec<libc::sockaddr_storage>,
    cbufs: Vec<CmsgBuf>,
    results: Vec<Option<i32>>,
    /// Explicit TX stamp key of each entry (`None`: no stamp, or the
    /// socket's counter numbers it).
    keys: Vec<Option<u32>>,
}

impl TxScratch {
    /// Point a header per entry of `batch` at its name, its iovec over the
    /// entry's data and (for a stamp request) its control message, growing
    /// the scratch as needed; the stamp keys go to `keys`, the results are
    /// reset.
    fn fill(&mut self, batch: &TxBatch, socket: &mut SocketState) {
        self.ensure(batch.len());
        for (k, e) in batch.entries().iter().enumerate() {
            let data = batch.data(k);
            let namelen = sys::sockaddr_from(&e.dst, &mut self.names[k]);
            self.iovs[k] = libc::iovec {
                iov_base: data.as_ptr() as *mut libc::c_void,
                iov_len: data.len(),
            };
            let request = socket.stamp_request(e.stamp_tag);
            let clen = match request {
                Some(key) => sys::write_tx_stamp_cmsg(&mut self.cbufs[k], key),
                None => 0,
            };
            self.keys[k] = request.flatten();
            let hdr = &mut self.hdrs[k];
            hdr.msg_name = (&mut self.names[k] as *mut libc::sockaddr_storage).cast();
            hdr.msg_namelen = namelen;
            hdr.msg_iov = &mut self.iovs[k];
            hdr.msg_iovlen = 1;
            hdr.msg_control = if clen > 0 {
                self.cbufs[k].as_mut_ptr().cast()
            } else {
                std::ptr::null_mut()
            };
            hdr.msg_controllen = clen as _;
            hdr.msg_flags = 0;
            self.results[k] = None;
        }
    }

    fn ensure(&mut self, n: usize) {
        while self.hdrs.len() < n {
            // SAFETY: msghdr and iovec are plain old data; all-zero is valid.
            self.hdrs.push(unsafe { std::mem::zeroed() });
            // SAFETY: as above.
            self.iovs.push(unsafe { std::mem::zeroed() });
            self.names.push(sys::zero_storage());
            self.cbufs.push([0; CMSG_BUF_WORDS]);
            self.results.push(None);
            self.keys.push(None);
        }
    }
}

/// One ring with its buffers, owned by the thread that created it.
struct Ring {
    // Declared first so it is dropped (closing the ring) before the buffers
    // it points into are unmapped. Closing is not synchronous (the kernel
    // tears the ring down later), so `Drop for Ring` first unregisters the
    // buffer ring, which is: after it no receive can select our buffers.
    uring: IoUring,
    rx: RxState,
    tx: TxScratch,
    owner: ThreadId,
}

// SAFETY: the raw pointers (mappings, msghdr/iovec scratch) point into memory
// owned by the same `Ring`; moving it to another thread moves that memory's
// ownership along. The single-issuer ring itself is never used from another
// thread: `UringBackend::ring_for` rebuilds it when the calling thread changes.
unsafe impl Send for Ring {}

impl Drop for Ring {
    fn drop(&mut self) {
        // Synchronous under the ring's lock: once it returns, a receive still
        // armed in the kernel can only fail with ENOBUFS, never write into
        // the buffers unmapped after this. (Refused with EEXIST when a
        // single-issuer ring is dropped by another thread; then the ring's
        // own teardown cancels the receive.)
        let _ = self.uring.submitter().unregister_buf_ring(BGID);
    }
}

impl Ring {
    fn new(cfg: UringConfig, payload: usize) -> io::Result<Ring> {
        let entries = cfg
            .buffers
            .max(1)
            .checked_next_power_of_two()
            .unwrap_or(32768)
            .min(32768);
        let uring = IoUring::builder()
            .setup_single_issuer()
            .setup_defer_taskrun()
            .setup_cqsize((entries as u32 * 2).max(4096))
            .build(SQ_ENTRIES)?;
        let mut probe = io_uring::Probe::new();
        uring.submitter().register_probe(&mut probe)?;
        for (op, name) in [
            (opcode::RecvMsgMulti::CODE, "IORING_OP_RECVMSG"),
            (opcode::SendMsg::CODE, "IORING_OP_SENDMSG"),
        ] {
            if !probe.is_supported(op) {
                return Err(io::Error::new(
                    io::ErrorKind::Unsupported,
                    format!("{name} not supported"),
                ));
            }
        }
        let bufs = BufRing::new(entries, payload.max(MIN_PAYLOAD))?;
        bufs.publish();
        // SAFETY: the ring mapping holds `entries` descriptors, is page aligned
        // and lives in `Ring` next to `uring`, which is dropped first.
        unsafe {
            uring.submitter().register_buf_ring_with_flags(
                bufs.ring.ptr as u64,
                entries,
                BGID,
                0,
            )?;
        }
        // SAFETY: msghdr is plain old data; all-zero is valid.
        let mut hdr: Box<libc::msghdr> = Box::new(unsafe { std::mem::zeroed() });
        hdr.msg_namelen = NAME_LEN as _;
        hdr.msg_controllen = CTRL_LEN as _;
        Ok(Ring {
            uring,
            rx: RxState {
                bufs,
                hdr,
                armed: false,
                ever_armed: false,
                stash: VecDeque::new(),
                recycled: false,
            },
            tx: TxScratch::default(),
            owner: std::thread::current().id(),
        })
    }

    /// Queue the multishot receive if it is not running.
    fn arm(&mut self, fd: RawFd, stats: &mut IoStats) -> io::Result<()> {
        if self.rx.armed {
            return Ok(());
        }
        let sqe = opcode::RecvMsgMulti::new(types::Fd(fd), &*self.rx.hdr, BGID)
            .flags(libc::MSG_TRUNC as u32)
            .build()
            .user_data(UD_RECV);
        // SAFETY: the SQE points at `self.rx.hdr` (boxed, lives as long as the
        // ring) and the registered buffer group; nothing else.
        let pushed = unsafe { self.uring.submission().push(&sqe) };
        if pushed.is_err() {
            // SQ full: submit what is queued, then retry once.
            self.enter(0, None, stats, false)?;
            // SAFETY: as above.
            unsafe { self.uring.submission().push(&sqe) }
                .map_err(|_| io::Error::other("io_uring submission queue full"))?;
        }
        if self.rx.ever_armed {
            stats.rx_rearms += 1;
        }
        self.rx.armed = true;
        self.rx.ever_armed = true;
        Ok(())
    }

    /// Take completions off the CQ: sends of the current batch (of `n`) are
    /// recorded, receive completions stashed. Returns sends newly completed.
    fn reap_tx(&mut self, n: usize) -> usize {
        let Ring { uring, rx, tx, .. } = self;
        let mut done = 0;
        for e in uring.completion() {
            let user_data = e.user_data();
            if user_data == UD_RECV {
                rx.stash.push_back((e.result(), e.flags()));
            } else if user_data >= UD_SEND && ((user_data - UD_SEND) as usize) < n {
                let slot = (user_data - UD_SEND) as usize;
                if tx.results[slot].is_none() {
                    tx.results[slot] = Some(e.result());
                    done += 1;
                }
            }
        }
        done
    }

    /// io_uring_enter: publish recycled buffers and submit queued SQEs; with
    /// `rx` or `want > 0`, run deferred work (the receive); with `want > 0`,
    /// wait for that many completions at most `timeout` (`None`: forever).
    /// Returns false when the wait timed out or was interrupted.
    fn enter(
        &mut self,
        want: u32,
        timeout: Option<Duration>,
        stats: &mut IoStats,
        rx: bool,
    ) -> io::Result<bool> {
        if self.rx.recycled {
            self.rx.bufs.publish();
            self.rx.recycled = false;
        }
        self.uring.submission().sync();
        let to_submit = self.uring.submission().len() as u32;
        if rx {
            stats.rx_syscalls += 1;
        } else {
            stats.tx_syscalls += 1;
        }
        let sub = self.uring.submitter();
        let flags = if want > 0 || rx { ENTER_GETEVENTS } else { 0 };
        let result = match timeout {
            Some(t) if want > 0 => {
                let timespec = types::Timespec::from(t);
                let args = types::SubmitArgs::new().timespec(&timespec);
                // SAFETY: `args` is a live io_uring_getevents_arg whose
                // timespec pointer refers to `ts`, both outliving the call.
                unsafe { sub.enter(to_submit, want, flags | ENTER_EXT_ARG, Some(&args)) }
            }
            // SAFETY: no argument pointer is passed.
            _ => unsafe { sub.enter::<libc::sigset_t>(to_submit, want, flags, None) },
        };
        match result {
            Ok(_) => Ok(true),
            Err(e) => match e.raw_os_error() {
                Some(libc::ETIME) | Some(libc::EINTR) => Ok(false),
                // Completions are waiting in the overflow list: reap and retry.
                Some(libc::EBUSY) => Ok(true),
                _ => Err(e),
            },
        }
    }
}

/// Handle one completion of the multishot receive: copy a datagram into
/// the next frame of `batch` (the caller checked there is one) and give the
/// buffer back.
fn take_recv(
    rx: &mut RxState,
    res: i32,
    flags: u32,
    batch: &mut RxBatch,
    stats: &mut IoStats,
    app_rx: crate::time::Nanos,
) -> io::Result<()> {
    if !cqueue::more(flags) {
        rx.armed = false;
    }
    let bid = cqueue::buffer_select(flags);
    if res < 0 {
        if let Some(bid) = bid {
            rx.bufs.push(bid);
            rx.recycled = true;
        }
        let error = io::Error::from_raw_os_error(-res);
        return match -res {
            libc::ENOBUFS => {
                stats.rx_nobufs += 1;
                Ok(())
            }
            libc::ECANCELED | libc::EINTR | libc::EAGAIN => Ok(()),
            _ if sys::is_async_send_error(&error) => {
                stats.socket_errors += 1;
                Ok(())
            }
            _ => Err(error),
        };
    }
    let Some(bid) = bid else {
        return Err(io::Error::other(
            "io_uring receive completion without a buffer",
        ));
    };
    let out = {
        let buf = rx
            .bufs
            .buf(bid)
            .ok_or_else(|| io::Error::other("io_uring buffer id out of range"))?;
        let out = types::RecvMsgOut::parse(buf, &rx.hdr)
            .map_err(|_| io::Error::other("io_uring receive buffer too short"))?;
        let mut name = sys::zero_storage();
        let name_data = out.name_data();
        let nlen = name_data.len().min(NAME_LEN);
        // SAFETY: copying at most NAME_LEN bytes into a sockaddr_storage of that size.
        unsafe {
            std::ptr::copy_nonoverlapping(
                name_data.as_ptr(),
                (&mut name as *mut libc::sockaddr_storage).cast::<u8>(),
                nlen,
            )
        };
        let control_data = out.control_data();
        // SAFETY: msghdr is plain old data; all-zero is valid before we fill it.
        let mut chdr: libc::msghdr = unsafe { std::mem::zeroed() };
        chdr.msg_control = control_data.as_ptr() as *mut libc::c_void;
        chdr.msg_controllen = control_data.len() as _;
        // The control area starts 8-byte aligned (buffer start + 16 + 128),
        // as CMSG_FIRSTHDR/NXTHDR expect.
        let cmsgs = sys::parse_cmsgs(&chdr);
        if let Some(dropped) = cmsgs.rxq_ovfl {
            stats.rx_dropped = dropped as u64;
        }
        match sys::sockaddr_to(&name, out.incoming_name_len() as libc::socklen_t) {
            None => None,
            Some(peer) => {
                let data = out.payload_data();
                let frame = batch.next_frame_mut().expect("caller checked capacity");
                let copied = data.len().min(frame.len());
                frame[..copied].copy_from_slice(&data[..copied]);
                Some(RxMeta {
                    peer,
                    len: copied,
                    // MSG_TRUNC makes payloadlen the datagram's real length.
                    truncated: out.incoming_payload_len() as usize > copied
                        || out.is_payload_truncated(),
                    kernel_rx: cmsgs.sw_stamp,
                    app_rx,
                })
            }
        }
    };
    rx.bufs.push(bid);
    rx.recycled = true;
    if let Some(meta) = out {
        batch.commit(meta);
        stats.rx_packets += 1;
    }
    Ok(())
}

/// Multishot receive, one SQE per sent datagram.
pub(crate) struct UringBackend {
    /// The socket, its counters, TX stamps and error queue.
    socket: SocketState,
    cfg: UringConfig,
    ring: Option<Ring>,
}

impl UringBackend {
    pub(crate) fn new(
        sock: UdpSocket,
        tx_stamps: bool,
        stamps: TxStamps,
        cfg: UringConfig,
    ) -> Self {
        UringBackend {
            socket: SocketState::new(sock, tx_stamps, stamps),
            cfg,
            ring: None,
        }
    }

    /// The ring for this thread, with buffers taking at least `payload` bytes.
    fn ring_for(&mut self, payload: usize) -> io::Result<&mut Ring> {
        let thread_id = std::thread::current().id();
        let rebuild = match &mut self.ring {
            None => true,
            Some(r) if r.owner != thread_id => true,
            Some(r) => {
                r.rx.bufs.payload_room() < payload
                    && r.rx.stash.is_empty()
                    && r.uring.completion().is_empty()
            }
        };
        if rebuild {
            let room = self
                .ring
                .as_ref()
                .map_or(0, |r| r.rx.bufs.payload_room())
                .max(payload);
            // Close the old ring first: its multishot receive is cancelled and
            // unreceived datagrams stay in the socket queue.
            self.ring = None;
            self.ring = Some(Ring::new(self.cfg, room)?);
        }
        Ok(self.ring.as_mut().expect("set above"))
    }

    /// Move receive completions (stashed ones first) into `batch` while it
    /// has room; returns how many completions were handled.
    fn reap_rx(&mut self, batch: &mut RxBatch) -> io::Result<usize> {
        let ring = self.ring.as_mut().expect("ring exists");
        let stats = &mut self.socket.stats;
        let app_rx = realtime_now();
        let mut handled = 0;
        while batch.free_frames() > 0 {
            let Some((res, flags)) = ring.rx.stash.pop_front() else {
                break;
            };
            take_recv(&mut ring.rx, res, flags, batch, stats, app_rx)?;
            handled += 1;
        }
        if !ring.rx.stash.is_empty() {
            return Ok(handled);
        }
        let Ring { uring, rx, .. } = ring;
        let mut completion = uring.completion();
        let mut err = None;
        while batch.free_frames() > 0 {
            let Some(entry) = completion.next() else {
                break;
            };
            if entry.user_data() != UD_RECV {
                continue; // a late send completion; sends count their own
            }
            handled += 1;
            if let Err(error) = take_recv(rx, entry.result(), entry.flags(), batch, stats, app_rx) {
                err = Some(error);
                break;
            }
        }
        drop(completion);
        match err {
            Some(entry) => Err(entry),
            None => Ok(handled),
        }
    }
}

impl BatchIo for UringBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Uring
    }
    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.socket.sock.local_addr()
    }
    fn raw_fd(&self) -> RawFd {
        self.socket.fd()
    }
    fn recv_batch(&mut self, batch: &mut RxBatch, timeout: Option<Duration>) -> io::Result<usize> {
        let socket_errors = self.socket.stats.socket_errors;
        let result = self.recv_inner(batch, timeout);
        if self.socket.stats.socket_errors != socket_errors {
            // A pending ICMP error ended a receive: it is queued.
            self.socket.errors.signal();
        }
        if result.is_err() {
            // Start from a fresh ring next time rather than from a state we
            // do not understand (queued SQEs, a half-handled completion).
            self.ring = None;
        }
        result
    }
    fn send_batch(&mut self, batch: &TxBatch) -> io::Result<usize> {
        let result = self.send_inner(batch);
        if result.is_err() {
            // SQEs that were queued but not submitted point into scratch
            // that the next batch rewrites: never submit them.
            self.ring = None;
        }
        result
    }
    fn poll_tx_stamps(&mut self, out: &mut Vec<TxStamp>) -> io::Result<usize> {
        self.socket.poll_tx_stamps(out)
    }
    fn poll_unreachable(&mut self, out: &mut Vec<IcmpUnreachable>) -> io::Result<usize> {
        self.socket.poll_unreachable(out)
    }
    fn stats(&self) -> IoStats {
        self.socket.stats(None)
    }
}

impl UringBackend {
    fn recv_inner(&mut self, batch: &mut RxBatch, timeout: Option<Duration>) -> io::Result<usize> {
        batch.clear();
        let fd = self.socket.fd();
        self.ring_for(batch.frame_size())?;
        let deadline = timeout.map(|t| Instant::now() + t);
        // Completions left over from the last call (no syscall).
        self.reap_rx(batch)?;
        loop {
            if batch.free_frames() == 0 {
                break;
            }
            let ring = self.ring.as_mut().expect("ring exists");
            let rearm = !ring.rx.armed;
            ring.arm(fd, &mut self.socket.stats)?;
            let have = !batch.is_empty();
            if have && !rearm {
                // Data in hand and the receive kept running: everything the
                // socket held was taken by the last enter.
                break;
            }
            let (want, left) = if have {
                (0, None)
            } else {
                let left = deadline.map(|d| d.saturating_duration_since(Instant::now()));
                (1, left)
            };
            let woke = ring.enter(want, left, &mut self.socket.stats, true)?;
            let handled = self.reap_rx(batch)?;
            if have {
                if handled == 0 {
                    break;
                }
                continue;
            }
            if !woke && batch.is_empty() {
                // Timed out or interrupted.
                break;
            }
            if handled == 0 && deadline.is_some_and(|d| Instant::now() >= d) {
                break;
            }
        }
        Ok(batch.len())
    }

    fn send_inner(&mut self, batch: &TxBatch) -> io::Result<usize> {
        let count = batch.len();
        if count == 0 {
            return Ok(0);
        }
        let fd = self.socket.fd();
        let tx_stamps = self.socket.tx_stamps;
        self.ring_for(0)?;
        let ring = self.ring.as_mut().expect("ring exists");
        ring.tx.fill(batch, &mut self.socket);
        let stats = &mut self.socket.stats;
        let app_tx = realtime_now();
        // Explicit keys are registered before the sends (another backend
        // on the socket may read a stamp before we reap its completion).
        for (k, e) in batch.entries().iter().enumerate() {
            if let (Some(key), Some(tag)) = (ring.tx.keys[k], e.stamp_tag) {
                self.socket.stamps.expect(key, tag, app_tx);
            }
        }
        let mut queued = 0;
        let mut done = 0;
        // io_uring has no sendmmsg: one SENDMSG per datagram, and the
        // batching is that one enter submits them all.
        while done < count {
            // Queue as many sends as the SQ takes, then one enter submits them.
            while queued < count {
                let sqe = opcode::SendMsg::new(types::Fd(fd), &ring.tx.hdrs[queued])
                    .flags(libc::MSG_DONTWAIT as u32)
                    .build()
                    .user_data(UD_SEND + queued as u64);
                // SAFETY: the SQE points at hdrs[queued], whose name, iovec
                // (over the batch's frame) and control buffer stay alive and
                // unchanged until its completion is reaped below.
                if unsafe { ring.uring.submission().push(&sqe) }.is_err() {
                    break;
                }
                queued += 1;
            }
            ring.enter(0, None, stats, false)?;
            done += ring.reap_tx(count);
            // UDP sends with MSG_DONTWAIT complete inline during submission;
            // wait only if some did not.
            while done < queued {
                ring.enter(1, None, stats, false)?;
                done += ring.reap_tx(count);
            }
        }
        // Every send completes on its own: a refused datagram is counted
        // and the others still go, as with sendmmsg's skip-and-go-on.
        let mut sent = 0;
        for (k, e) in batch.entries().iter().enumerate() {
            let mut result = ring.tx.results[k];
            if let Some(r) = result.filter(|r| *r < 0) {
                if sys::is_async_send_error(&io::Error::from_raw_os_error(-r)) {
                    // A pending ICMP error about an earlier datagram, not
                    // this one: it is queued; send this one again, here.
                    stats.socket_errors += 1;
                    self.socket.errors.signal();
                    stats.tx_syscalls += 1;
                    // SAFETY: hdrs[k] points at the name, iovec (over the
                    // batch's frame) and control buffer filled above, all
                    // alive and unchanged; the kernel only reads them.
                    let again = sys::cvt(unsafe {
                        libc::sendmsg(fd, &ring.tx.hdrs[k], libc::MSG_DONTWAIT)
                    });
                    result = Some(match again {
                        Ok(n) => n as i32,
                        Err(e) => -e.raw_os_error().unwrap_or(libc::EIO),
                    });
                }
            }
            match result {
                Some(r) if r >= 0 => {
                    sent += 1;
                    if let (Some(tag), true, None) = (e.stamp_tag, tx_stamps, ring.tx.keys[k]) {
                        self.socket.stamps.sent(tag, app_tx);
                    }
                }
                _ => {
                    stats.tx_errors += 1;
                    if let Some(key) = ring.tx.keys[k] {
                        self.socket.stamps.unsent(key);
                    }
                }
            }
        }
        stats.tx_packets += sent as u64;
        Ok(sent)
    }
}

/// Can this kernel run the backend? Sets up a ring with the flags we use,
/// checks the opcodes and registers a provided-buffer ring; then receives
/// one datagram over loopback through the real backend.
pub(crate) fn probe() -> Result<(), BackendUnavailable> {
    Ring::new(UringConfig { buffers: 4 }, 64).map_err(|e| {
        let reason = match e.raw_os_error() {
            Some(libc::ENOSYS) => "io_uring_setup: ENOSYS (kernel built without io_uring)".into(),
            Some(libc::EPERM) => {
                "io_uring_setup: EPERM (kernel.io_uring_disabled or seccomp forbids it)".into()
            }
            Some(libc::EINVAL) => format!(
                "ring setup: EINVAL (kernel too old for SINGLE_ISSUER/DEFER_TASKRUN or buffer rings; 6.1+ needed): {e}"
            ),
            _ => format!("ring setup: {e}"),
        };
        BackendUnavailable::new(BackendKind::Uring, reason).with_errno(e.raw_os_error())
    })?;
    // A ring that sets up proves the flags, not the receive path
    // (multishot RECVMSG with a buffer ring): one real datagram does.
    let smoke = || -> io::Result<()> {
        let sock_a = UdpSocket::bind("127.0.0.1:0")?;
        let sock_b = UdpSocket::bind("127.0.0.1:0")?;
        sock_a.set_nonblocking(true)?;
        sock_b.set_nonblocking(true)?;
        let dst = sock_b.local_addr()?;
        let mut sender = UringBackend::new(
            sock_a,
            false,
            TxStamps::default(),
            UringConfig { buffers: 4 },
        );
        let mut receiver = UringBackend::new(
            sock_b,
            false,
            TxStamps::default(),
            UringConfig { buffers: 4 },
        );
        let mut tx_batch = TxBatch::new(1, 64);
        tx_batch.push(dst, b"probe").map_err(io::Error::other)?;
        if sender.send_batch(&tx_batch)? != 1 {
            return Err(io::Error::other("send via IORING_OP_SENDMSG failed"));
        }
        let mut rx_batch = RxBatch::new(2, 64);
        let received = receiver.recv_batch(&mut rx_batch, Some(Duration::from_secs(2)))?;
        match rx_batch.get(0) {
            Some(d) if received == 1 && d.data == b"probe" => Ok(()),
            _ => Err(io::Error::other(
                "multishot IORING_OP_RECVMSG delivered nothing over loopback",
            )),
        }
    };
    smoke().map_err(|e| {
        BackendUnavailable::new(BackendKind::Uring, format!("loopback smoke test: {e}"))
            .with_errno(e.raw_os_error())
    })
}
