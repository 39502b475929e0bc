//! `recvmmsg`/`sendmmsg`: one syscall moves a whole batch.

use super::common::{TxStamps, Waiter, ASYNC_ERROR_RETRIES};
use super::socket_state::SocketState;
use crate::backend::{BackendKind, BatchIo, IoStats};
use crate::batch::{GsoStats, RxBatch, RxMeta, TxBatch, TxEntry, TxStamp};
use crate::icmp::IcmpUnreachable;
use crate::sys::{self, CmsgBuf, CMSG_BUF_WORDS};
use crate::time::{monotonic_now, realtime_now};
use std::io;
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::RawFd;
use std::time::Duration;

/// Per-slot scratch the syscalls point into; grown to the largest batch seen.
struct Scratch {
    hdrs: Vec<libc::mmsghdr>,
    iovs: Vec<libc::iovec>,
    names: Vec<libc::sockaddr_storage>,
    cbufs: Vec<CmsgBuf>,
    /// Send messages: (first entry, entries) of each, in order.
    msgs: Vec<(usize, usize)>,
    /// Explicit TX stamp key of each send message (`None`: no stamp, or
    /// the socket's counter numbers it).
    keys: Vec<Option<u32>>,
}

// SAFETY: the raw pointers inside `hdrs`/`iovs` are rewritten before every
// syscall to point into buffers owned by the same backend (or the batch passed
// to the call) and are never dereferenced outside that call, so moving the
// scratch to another thread cannot create shared access.
unsafe impl Send for Scratch {}

impl Scratch {
    /// Point one header per free frame of `batch` at that frame, a name
    /// storage and a control buffer, for a receive.
    fn point_at_free_frames(&mut self, batch: &mut RxBatch) {
        let start = batch.frames_used();
        let free = batch.free_frames();
        self.ensure(free);
        let fsz = batch.frame_size();
        let base = batch.arena_ptr();
        for k in 0..free {
            // SAFETY: frame start+k lies inside the arena (start+k < capacity).
            let frame_ptr = unsafe { base.add((start + k) * fsz) };
            self.iovs[k] = libc::iovec {
                iov_base: frame_ptr.cast(),
                iov_len: fsz,
            };
            let hdr = &mut self.hdrs[k];
            hdr.msg_len = 0;
            hdr.msg_hdr.msg_name = (&mut self.names[k] as *mut libc::sockaddr_storage).cast();
            hdr.msg_hdr.msg_namelen = std::mem::size_of::<libc::sockaddr_storage>() as _;
            hdr.msg_hdr.msg_iov = &mut self.iovs[k];
            hdr.msg_hdr.msg_iovlen = 1;
            hdr.msg_hdr.msg_control = self.cbufs[k].as_mut_ptr().cast();
            hdr.msg_hdr.msg_controllen = std::mem::size_of::<CmsgBuf>() as _;
            hdr.msg_hdr.msg_flags = 0;
        }
    }

    fn ensure(&mut self, n: usize) {
        while self.hdrs.len() < n {
            // SAFETY: mmsghdr and iovec are plain old data; all-zero is valid.
            self.hdrs.push(unsafe { std::mem::zeroed() });
            // SAFETY: as above.
            self.iovs.push(unsafe { std::mem::zeroed() });
            self.names.push(sys::zero_storage());
            self.cbufs.push([0; CMSG_BUF_WORDS]);
        }
    }
}

/// One syscall per batch.
pub(crate) struct MmsgBackend {
    /// The socket, its counters, TX stamps and error queue.
    socket: SocketState,
    s: Scratch,
    /// UDP GSO coalescing state and counters.
    gso: GsoStats,
    /// The last receive filled the batch: try the next without polling.
    busy: bool,
    /// The exclusive wait for a datagram, and its wake-up counts.
    waiter: Waiter,
}

impl MmsgBackend {
    /// A backend on `sock`; `shared`: other backends receive on it too.
    pub(crate) fn new(sock: UdpSocket, tx_stamps: bool, stamps: TxStamps, shared: bool) -> Self {
        MmsgBackend {
            waiter: Waiter::new(shared),
            socket: SocketState::new(sock, tx_stamps, stamps),
            s: Scratch {
                hdrs: Vec::new(),
                iovs: Vec::new(),
                names: Vec::new(),
                cbufs: Vec::new(),
                msgs: Vec::new(),
                keys: Vec::new(),
            },
            gso: GsoStats::default(),
            busy: false,
        }
    }

    /// One non-blocking recvmmsg into the free frames of `batch`; returns datagrams added.
    fn recv_some(&mut self, batch: &mut RxBatch) -> io::Result<usize> {
        let start = batch.frames_used();
        let free = batch.free_frames();
        if free == 0 {
            return Ok(0);
        }
        self.s.point_at_free_frames(batch);
        let fd = self.socket.fd();
        let got = loop {
            self.socket.stats.rx_syscalls += 1;
            // SAFETY: hdrs[..n] point at live iovecs over distinct arena frames,
            // name storages and control buffers, all valid for the call.
            let result = sys::cvt(unsafe {
                libc::recvmmsg(
                    fd,
                    self.s.hdrs.as_mut_ptr(),
                    free as libc::c_uint,
                    libc::MSG_DONTWAIT,
                    std::ptr::null_mut(),
                )
            });
            let error = match result {
                Ok(result) => break result as usize,
                Err(error) => error,
            };
            match error.kind() {
                io::ErrorKind::Interrupted => continue,
                io::ErrorKind::WouldBlock => return Ok(0),
                // ICMP feedback to an earlier send, reported on this
                // receive: returning it would stop a worker over a peer
                // that went away, so count it and receive again.
                _ if sys::is_async_send_error(&error) => {
                    self.socket.stats.socket_errors += 1;
                    self.socket.errors.signal();
                    continue;
                }
                _ => return Err(error),
            }
        };
        let app_rx = realtime_now();
        let received = monotonic_now();
        // Frames used (dense) and datagrams recorded (more with GRO).
        let mut used = 0;
        let mut added = 0;
        for k in 0..got {
            let hdr = &self.s.hdrs[k].msg_hdr;
            let cmsgs = sys::parse_cmsgs(hdr);
            if let Some(dropped) = cmsgs.rxq_ovfl {
                // SO_RXQ_OVFL carries the socket's running total, not a
                // delta: the latest value is the count.
                self.socket.stats.rx_dropped = dropped as u64;
            }
            let Some(peer) = sys::sockaddr_to(&self.s.names[k], hdr.msg_namelen) else {
                continue;
            };
            let meta = RxMeta {
                peer,
                len: self.s.hdrs[k].msg_len as usize,
                truncated: hdr.msg_flags & libc::MSG_TRUNC != 0,
                kernel_rx: cmsgs.sw_stamp,
                app_rx,
            };
            if used != k {
                // A skipped slot before this one: move the payload down so frames stay dense.
                batch.move_frame(start + k, start + used, meta.len);
            }
            used += 1;
            match cmsgs.gro_size {
                Some(seg) if self.gso.gro_enabled => {
                    // A train (cut by the frame end when truncated, even
                    // to less than one datagram).
                    let cut = meta.truncated;
                    let segs = batch.commit_segments(meta, seg as usize, received);
                    if segs > 1 {
                        self.gso.gro_trains += 1;
                        self.gso.gro_segments += segs as u64;
                    }
                    self.gso.gro_cut += u64::from(cut);
                    added += segs;
                }
                _ => {
                    batch.commit_received(meta, received);
                    added += 1;
                }
            }
        }
        self.socket.stats.rx_packets += added as u64;
        Ok(added)
    }

    /// Group entries `from..from + count` into messages: `msgs` gets
    /// (first entry, entries in the message) per message.
    fn plan_messages(&mut self, entries: &[TxEntry], from: usize, count: usize) {
        // Entry from+j uses iovs[j]; message m (entries k..k+run) uses
        // hdrs[m], names[m], cbufs[m] and iovs[k..k+run].
        let mut done = 0;
        while done < count {
            let entry = &entries[from + done];
            let mut run = 1;
            // A stamp request rides alone: the kernel stamps a GSO train
            // once, so a stamped entry in a train would lose its stamp.
            // Equal lengths: GSO cuts a train at one segment size (only
            // the last may be shorter, which this does not try).
            if self.gso.enabled && entry.stamp_tag.is_none() && entry.len > 0 {
                let cap = GSO_MAX_SEGMENTS.min(GSO_MAX_BYTES / entry.len);
                while done + run < count && run < cap {
                    let next = &entries[from + done + run];
                    if next.dst != entry.dst || next.len != entry.len || next.stamp_tag.is_some() {
                        break;
                    }
                    run += 1;
                }
            }
            self.s.msgs.push((done, run));
            done += run;
        }
    }

    /// Fill the iovecs, names and control messages of the planned messages,
    /// and point their headers at them (registering stamp keys in `keys`).
    fn fill_headers(&mut self, batch: &TxBatch, from: usize, count: usize) {
        let entries = batch.entries();
        // Fill the iovecs, names and control messages first, then point the
        // headers at them through pointers taken after the last write.
        for j in 0..count {
            let data = batch.data(from + j);
            self.s.iovs[j] = libc::iovec {
                iov_base: data.as_ptr() as *mut libc::c_void,
                iov_len: data.len(),
            };
        }
        for m in 0..self.s.msgs.len() {
            let (done, run) = self.s.msgs[m];
            let entry = &entries[from + done];
            let namelen = sys::sockaddr_from(&entry.dst, &mut self.s.names[m]);
            // A train has no stamp request (see `plan_messages`).
            let request = self.socket.stamp_request(entry.stamp_tag);
            let clen = if run > 1 {
                sys::write_gso_cmsg(&mut self.s.cbufs[m], entry.len as u16)
            } else if let Some(key) = request {
                sys::write_tx_stamp_cmsg(&mut self.s.cbufs[m], key)
            } else {
                0
            };
            self.s.keys.push(request.flatten());
            let hdr = &mut self.s.hdrs[m].msg_hdr;
            hdr.msg_namelen = namelen;
            hdr.msg_iovlen = run as _;
            hdr.msg_controllen = clen as _;
        }
        let names = self.s.names.as_mut_ptr();
        let iovs = self.s.iovs.as_mut_ptr();
        let cbufs = self.s.cbufs.as_mut_ptr();
        for (m, &(done, _)) in self.s.msgs.iter().enumerate() {
            let hdr = &mut self.s.hdrs[m];
            hdr.msg_len = 0;
            hdr.msg_hdr.msg_name = names.wrapping_add(m).cast();
            hdr.msg_hdr.msg_iov = iovs.wrapping_add(done);
            hdr.msg_hdr.msg_control = if hdr.msg_hdr.msg_controllen > 0 {
                cbufs.wrapping_add(m).cast()
            } else {
                std::ptr::null_mut()
            };
            hdr.msg_hdr.msg_flags = 0;
        }
    }

    /// Send entries `from..to` of `batch`: runs of adjacent entries with the
    /// same destination and length (no stamp request) as one GSO train when
    /// coalescing is on, the rest one message each, all in sendmmsg calls.
    fn send_from(&mut self, batch: &TxBatch, from: usize, to: usize) -> Sent {
        let entries = &batch.entries()[..to];
        let count = to - from;
        self.s.ensure(count);
        self.s.msgs.clear();
        self.s.keys.clear();
        self.plan_messages(entries, from, count);
        self.fill_headers(batch, from, count);
        let fd = self.socket.fd();
        let nmsg = self.s.msgs.len();
        let mut offset = 0;
        let mut sent = 0;
        let mut retries = 0;
        // Explicit keys are registered before the first call (another
        // backend on the socket may read the stamp before it returns); a
        // message a later call sends keeps this send time.
        let first_tx = realtime_now();
        for (m, key) in self.s.keys.iter().enumerate() {
            if let (Some(key), Some(tag)) = (*key, entries[from + self.s.msgs[m].0].stamp_tag) {
                self.socket.stamps.expect(key, tag, first_tx);
            }
        }
        while offset < nmsg {
            let app_tx = if offset == 0 {
                first_tx
            } else {
                realtime_now()
            };
            self.socket.stats.tx_syscalls += 1;
            // SAFETY: hdrs[at..nmsg] point at live name storages, iovecs over
            // the batch's frames and control buffers; the kernel only reads them.
            let result = sys::cvt(unsafe {
                libc::sendmmsg(
                    fd,
                    self.s.hdrs.as_mut_ptr().add(offset),
                    (nmsg - offset) as libc::c_uint,
                    libc::MSG_DONTWAIT,
                )
            });
            let got = match result {
                Ok(result) => result as usize,
                Err(entry) if entry.kind() == io::ErrorKind::Interrupted => continue,
                // A pending ICMP error about an earlier datagram, not the
                // message at `offset`: it is queued; send again from there.
                Err(entry) if sys::is_async_send_error(&entry) && retries < ASYNC_ERROR_RETRIES => {
                    retries += 1;
                    self.socket.stats.socket_errors += 1;
                    self.socket.errors.signal();
                    continue;
                }
                Err(entry) => {
                    let (done, run) = self.s.msgs[offset];
                    if run > 1 && is_gso_refusal(&entry) {
                        return Sent::GsoRefused {
                            sent,
                            at: from + done,
                            run,
                            permanent: is_gso_unsupported(&entry),
                        };
                    }
                    // The message at `at` was refused: count its datagrams and go on.
                    self.socket.stats.tx_errors += run as u64;
                    if let Some(key) = self.s.keys[offset] {
                        self.socket.stamps.unsent(key);
                    }
                    offset += 1;
                    continue;
                }
            };
            for (m, &(done, run)) in self.s.msgs.iter().enumerate().skip(offset).take(got) {
                sent += run;
                if run > 1 {
                    self.gso.trains += 1;
                    self.gso.segments += run as u64;
                } else if self.socket.tx_stamps && self.s.keys[m].is_none() {
                    // Counter mode: the socket numbered it on acceptance.
                    if let Some(tag) = entries[from + done].stamp_tag {
                        self.socket.stamps.sent(tag, app_tx);
                    }
                }
            }
            offset += got;
            if got == 0 {
                // Should not happen; avoid spinning.
                for &(_, run) in &self.s.msgs[offset..] {
                    self.socket.stats.tx_errors += run as u64;
                }
                for key in self.s.keys[offset..].iter().flatten() {
                    self.socket.stamps.unsent(*key);
                }
                break;
            }
        }
        Sent::All(sent)
    }
}

/// Outcome of [`MmsgBackend::send_from`].
enum Sent {
    /// Everything was handed over (or counted as refused); datagrams accepted.
    All(usize),
    /// The kernel refused the GSO train of `run` entries starting at entry
    /// `at`; `sent` datagrams before it were accepted. `permanent`: the
    /// socket or route cannot segment at all (not just this train).
    GsoRefused {
        sent: usize,
        at: usize,
        run: usize,
        permanent: bool,
    },
}

/// Most datagrams in one GSO train (the kernel's UDP_MAX_SEGMENTS on older kernels).
const GSO_MAX_SEGMENTS: usize = 64;
/// Most payload bytes in one GSO train (one IP datagram before segmentation).
const GSO_MAX_BYTES: usize = 65_000;

/// Refusals that mean the socket or route cannot segment at all (no
/// checksum offload: EIO; protocol without GSO), as opposed to one train
/// the kernel would not take (EINVAL, EMSGSIZE).
fn is_gso_unsupported(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EIO | libc::EOPNOTSUPP | libc::ENOPROTOOPT)
    )
}

/// Errors with which a kernel or route refuses UDP segmentation offload
/// (no checksum offload: EIO; segment too large for the MTU: EINVAL; ...).
fn is_gso_refusal(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EIO | libc::EINVAL | libc::EOPNOTSUPP | libc::ENOPROTOOPT | libc::EMSGSIZE)
    )
}

impl BatchIo for MmsgBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Mmsg
    }
    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.socket.sock.local_addr()
    }
    fn raw_fd(&self) -> RawFd {
        self.socket.fd()
    }
    fn recv_batch(&mut self, batch: &mut RxBatch, timeout: Option<Duration>) -> io::Result<usize> {
        batch.clear();
        // While the last receive filled the whole batch (or the caller is
        // spinning) more is probably queued: receive before polling.
        let direct = self.busy || timeout == Some(Duration::ZERO);
        if direct && self.recv_some(batch)? > 0 {
            self.busy = batch.free_frames() == 0;
            return Ok(batch.len());
        }
        self.busy = false;
        if timeout == Some(Duration::ZERO)
            || !self.socket.wait_for_datagram(timeout, &mut self.waiter)?
        {
            return Ok(0);
        }
        if self.recv_some(batch)? == 0 {
            // Woken, but another waiter took the datagram.
            self.waiter.idle_wakeups += 1;
        }
        self.busy = batch.free_frames() == 0;
        Ok(batch.len())
    }
    fn send_batch(&mut self, batch: &TxBatch) -> io::Result<usize> {
        let mut from = 0;
        let mut sent = 0;
        while from < batch.len() {
            match self.send_from(batch, from, batch.len()) {
                Sent::All(s) => {
                    sent += s;
                    break;
                }
                Sent::GsoRefused {
                    sent: s,
                    at,
                    run,
                    permanent,
                } => {
                    sent += s;
                    self.gso.fallbacks += 1;
                    if permanent {
                        // The kernel will not segment for us: send the rest
                        // (that train included) datagram by datagram.
                        self.gso.enabled = false;
                        from = at;
                    } else {
                        // Only this train was refused (e.g. EINVAL: segment
                        // larger than the path allows): send it datagram by
                        // datagram and keep coalescing for the rest.
                        self.gso.enabled = false;
                        if let Sent::All(s) = self.send_from(batch, at, at + run) {
                            sent += s;
                        }
                        self.gso.enabled = true;
                        from = at + run;
                    }
                }
            }
        }
        self.socket.stats.tx_packets += sent as u64;
        Ok(sent)
    }
    fn set_gso(&mut self, on: bool) -> bool {
        // Probe once: setting the socket default segment size to 0 (off) is
        // harmless and fails with ENOPROTOOPT where UDP GSO is unknown.
        self.gso.enabled =
            on && sys::setsockopt_int(self.socket.fd(), sys::SOL_UDP, sys::UDP_SEGMENT, 0).is_ok();
        self.gso.enabled
    }
    fn set_gro(&mut self, on: bool) -> bool {
        let fd = self.socket.fd();
        self.gso.gro_enabled =
            sys::setsockopt_int(fd, sys::SOL_UDP, sys::UDP_GRO, i32::from(on)).is_ok() && on;
        self.gso.gro_enabled
    }
    fn gso_stats(&self) -> GsoStats {
        self.gso
    }
    fn poll_tx_stamps(&mut self, out: &mut Vec<TxStamp>) -> io::Result<usize> {
        self.socket.poll_tx_stamps(out)
    }
    fn poll_unreachable(&mut self, out: &mut Vec<IcmpUnreachable>) -> io::Result<usize> {
        self.socket.poll_unreachable(out)
    }
    fn stats(&self) -> IoStats {
        self.socket.stats(Some(&self.waiter))
    }
}
