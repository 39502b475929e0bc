//! `recvmmsg`/`sendmmsg`: one syscall moves a whole batch.

use super::common::TxStamps;
use crate::backend::{BackendKind, BatchIo, IoStats};
use crate::batch::{RxBatch, RxMeta, TxBatch, TxStamp};
use crate::sys::{self, CmsgBuf, Ready, CMSG_BUF_WORDS};
use crate::time::realtime_now;
use std::io;
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::{AsRawFd, RawFd};
use std::time::Duration;

/// Per-slot scratch the syscalls point into; grown to the largest batch seen.
struct Scratch {
    hdrs: Vec<libc::mmsghdr>,
    iovs: Vec<libc::iovec>,
    names: Vec<libc::sockaddr_storage>,
    cbufs: Vec<CmsgBuf>,
}

// SAFETY: the raw pointers inside `hdrs`/`iovs` are rewritten before every
// syscall to point into buffers owned by the same backend (or the batch passed
// to the call) and are never dereferenced outside that call, so moving the
// scratch to another thread cannot create shared access.
unsafe impl Send for Scratch {}

impl Scratch {
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
    sock: UdpSocket,
    stats: IoStats,
    stamps: TxStamps,
    /// Stamp requests are honoured (socket has OPT_ID).
    tx_stamps: bool,
    s: Scratch,
}

impl MmsgBackend {
    pub(crate) fn new(sock: UdpSocket, tx_stamps: bool) -> Self {
        MmsgBackend {
            sock,
            stats: IoStats::default(),
            stamps: TxStamps::default(),
            tx_stamps,
            s: Scratch {
                hdrs: Vec::new(),
                iovs: Vec::new(),
                names: Vec::new(),
                cbufs: Vec::new(),
            },
        }
    }

    /// One non-blocking recvmmsg into the free frames of `batch`; returns datagrams added.
    fn recv_some(&mut self, batch: &mut RxBatch) -> io::Result<usize> {
        let start = batch.len();
        let n = batch.capacity() - start;
        if n == 0 {
            return Ok(0);
        }
        self.s.ensure(n);
        let fsz = batch.frame_size();
        let base = batch.arena_ptr();
        for k in 0..n {
            // SAFETY: frame start+k lies inside the arena (start+k < capacity).
            let fp = unsafe { base.add((start + k) * fsz) };
            self.s.iovs[k] = libc::iovec {
                iov_base: fp.cast(),
                iov_len: fsz,
            };
            let h = &mut self.s.hdrs[k];
            h.msg_len = 0;
            h.msg_hdr.msg_name = (&mut self.s.names[k] as *mut libc::sockaddr_storage).cast();
            h.msg_hdr.msg_namelen = std::mem::size_of::<libc::sockaddr_storage>() as _;
            h.msg_hdr.msg_iov = &mut self.s.iovs[k];
            h.msg_hdr.msg_iovlen = 1;
            h.msg_hdr.msg_control = self.s.cbufs[k].as_mut_ptr().cast();
            h.msg_hdr.msg_controllen = std::mem::size_of::<CmsgBuf>() as _;
            h.msg_hdr.msg_flags = 0;
        }
        let fd = self.sock.as_raw_fd();
        let got = loop {
            self.stats.rx_syscalls += 1;
            // SAFETY: hdrs[..n] point at live iovecs over distinct arena frames,
            // name storages and control buffers, all valid for the call.
            let rc = unsafe {
                libc::recvmmsg(
                    fd,
                    self.s.hdrs.as_mut_ptr(),
                    n as libc::c_uint,
                    libc::MSG_DONTWAIT,
                    std::ptr::null_mut(),
                )
            };
            if rc >= 0 {
                break rc as usize;
            }
            let e = sys::last_err();
            match e.kind() {
                io::ErrorKind::Interrupted => continue,
                io::ErrorKind::WouldBlock => return Ok(0),
                _ if sys::is_async_send_error(&e) => {
                    self.stats.socket_errors += 1;
                    continue;
                }
                _ => return Err(e),
            }
        };
        let app_rx = realtime_now();
        let mut added = 0;
        for k in 0..got {
            let h = &self.s.hdrs[k].msg_hdr;
            let c = sys::parse_cmsgs(h);
            if let Some(d) = c.rxq_ovfl {
                self.stats.rx_dropped = d as u64;
            }
            let Some(peer) = sys::sockaddr_to(&self.s.names[k], h.msg_namelen) else {
                continue;
            };
            let meta = RxMeta {
                peer,
                len: self.s.hdrs[k].msg_len as usize,
                truncated: h.msg_flags & libc::MSG_TRUNC != 0,
                kernel_rx: c.sw_stamp,
                app_rx,
            };
            if added != k {
                // A skipped slot before this one: move the payload down so frames stay dense.
                batch.move_frame(start + k, start + added, meta.len);
            }
            batch.commit(meta);
            added += 1;
        }
        self.stats.rx_packets += added as u64;
        Ok(added)
    }
}

impl BatchIo for MmsgBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Mmsg
    }
    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.sock.local_addr()
    }
    fn raw_fd(&self) -> RawFd {
        self.sock.as_raw_fd()
    }
    fn recv_batch(&mut self, batch: &mut RxBatch, timeout: Option<Duration>) -> io::Result<usize> {
        batch.clear();
        let fd = self.sock.as_raw_fd();
        let deadline = timeout.map(|t| std::time::Instant::now() + t);
        loop {
            let left = deadline.map(|d| d.saturating_duration_since(std::time::Instant::now()));
            match sys::wait_readable(fd, left)? {
                Ready::Readable => break,
                Ready::ErrQueue => {
                    self.stamps.drain_errqueue(fd)?;
                    // A pending socket error (not queued) also raises POLLERR.
                    if sys::take_socket_error(fd).is_some() {
                        self.stats.socket_errors += 1;
                    }
                    if left == Some(Duration::ZERO) {
                        return Ok(0);
                    }
                }
                Ready::Nothing => return Ok(0),
            }
        }
        self.recv_some(batch)?;
        Ok(batch.len())
    }
    fn send_batch(&mut self, batch: &TxBatch) -> io::Result<usize> {
        let n = batch.len();
        if n == 0 {
            return Ok(0);
        }
        self.s.ensure(n);
        for (k, e) in batch.entries().iter().enumerate() {
            let data = batch.data(k);
            let namelen = sys::sockaddr_from(&e.dst, &mut self.s.names[k]);
            self.s.iovs[k] = libc::iovec {
                iov_base: data.as_ptr() as *mut libc::c_void,
                iov_len: data.len(),
            };
            if e.stamp_tag.is_some() && !self.tx_stamps {
                self.stats.tx_stamps_lost += 1;
            }
            let clen = if e.stamp_tag.is_some() && self.tx_stamps {
                sys::write_tx_stamp_cmsg(&mut self.s.cbufs[k])
            } else {
                0
            };
            let h = &mut self.s.hdrs[k];
            h.msg_len = 0;
            h.msg_hdr.msg_name = (&mut self.s.names[k] as *mut libc::sockaddr_storage).cast();
            h.msg_hdr.msg_namelen = namelen;
            h.msg_hdr.msg_iov = &mut self.s.iovs[k];
            h.msg_hdr.msg_iovlen = 1;
            h.msg_hdr.msg_control = if clen > 0 {
                self.s.cbufs[k].as_mut_ptr().cast()
            } else {
                std::ptr::null_mut()
            };
            h.msg_hdr.msg_controllen = clen as _;
            h.msg_hdr.msg_flags = 0;
        }
        let fd = self.sock.as_raw_fd();
        let entries = batch.entries();
        let mut at = 0;
        let mut sent = 0;
        while at < n {
            let app_tx = realtime_now();
            self.stats.tx_syscalls += 1;
            // SAFETY: hdrs[at..n] point at live name storages, iovecs over the
            // batch's frames and control buffers; the kernel only reads them.
            let rc = unsafe {
                libc::sendmmsg(
                    fd,
                    self.s.hdrs.as_mut_ptr().add(at),
                    (n - at) as libc::c_uint,
                    libc::MSG_DONTWAIT,
                )
            };
            if rc < 0 {
                if sys::last_err().kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                // The datagram at `at` was refused: count it and go on.
                self.stats.tx_errors += 1;
                at += 1;
                continue;
            }
            let got = rc as usize;
            if self.tx_stamps {
                for e in &entries[at..at + got] {
                    if let Some(tag) = e.stamp_tag {
                        self.stamps.sent(tag, app_tx);
                    }
                }
            }
            sent += got;
            at += got;
            if got == 0 {
                // Should not happen; avoid spinning.
                self.stats.tx_errors += (n - at) as u64;
                break;
            }
        }
        self.stats.tx_packets += sent as u64;
        Ok(sent)
    }
    fn poll_tx_stamps(&mut self, out: &mut Vec<TxStamp>) -> io::Result<usize> {
        self.stamps.drain_errqueue(self.sock.as_raw_fd())?;
        Ok(self.stamps.take(out))
    }
    fn stats(&self) -> IoStats {
        IoStats {
            tx_stamps_lost: self.stats.tx_stamps_lost + self.stamps.lost,
            ..self.stats
        }
    }
}
