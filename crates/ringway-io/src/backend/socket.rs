//! The baseline backend: one `recvmsg`/`sendmsg` per datagram (recvmsg
//! rather than recvfrom so control messages — timestamps, drop counts —
//! arrive with each datagram), and `ppoll` only to wait: while the last
//! receive found a datagram the next one is tried directly, so a busy
//! socket costs one syscall per datagram received, as the paper's
//! baseline (poll when idle, then recvfrom).

use super::common::{TxStamps, Waiter, ASYNC_ERROR_RETRIES};
use super::socket_state::SocketState;
use crate::backend::{BackendKind, BatchIo, IoStats};
use crate::batch::{RxBatch, RxMeta, TxBatch, TxStamp};
use crate::icmp::IcmpUnreachable;
use crate::sys::{self, CmsgBuf, CMSG_BUF_WORDS};
use crate::time::realtime_now;
use std::io;
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::RawFd;
use std::time::Duration;

/// One syscall per datagram.
pub(crate) struct SocketBackend {
    /// The socket, its counters, TX stamps and error queue.
    socket: SocketState,
    cbuf: CmsgBuf,
    /// The exclusive wait for a datagram, and its wake-up counts.
    waiter: Waiter,
    /// The last receive attempt found a datagram: try the next one without
    /// polling first.
    busy: bool,
}

impl SocketBackend {
    /// A backend on `sock`; `shared`: other backends receive on it too.
    pub(crate) fn new(sock: UdpSocket, tx_stamps: bool, stamps: TxStamps, shared: bool) -> Self {
        SocketBackend {
            waiter: Waiter::new(shared),
            socket: SocketState::new(sock, tx_stamps, stamps),
            cbuf: [0; CMSG_BUF_WORDS],
            busy: false,
        }
    }

    /// Receive one datagram into the batch's next frame; `Ok(false)` when none is queued.
    fn recv_one(&mut self, batch: &mut RxBatch) -> io::Result<bool> {
        let fd = self.socket.fd();
        let Some(frame) = batch.next_frame_mut() else {
            return Ok(false);
        };
        let mut iov = libc::iovec {
            iov_base: frame.as_mut_ptr().cast(),
            iov_len: frame.len(),
        };
        let mut name = sys::zero_storage();
        loop {
            // SAFETY: msghdr is plain old data; all-zero is valid before we fill it.
            let mut hdr: libc::msghdr = unsafe { std::mem::zeroed() };
            hdr.msg_name = (&mut name as *mut libc::sockaddr_storage).cast();
            hdr.msg_namelen = std::mem::size_of::<libc::sockaddr_storage>() as _;
            hdr.msg_iov = &mut iov;
            hdr.msg_iovlen = 1;
            hdr.msg_control = self.cbuf.as_mut_ptr().cast();
            hdr.msg_controllen = std::mem::size_of_val(&self.cbuf) as _;
            self.socket.stats.rx_syscalls += 1;
            // SAFETY: every pointer in hdr refers to a live buffer (frame, name,
            // cbuf) with the stated length, valid for the duration of the call.
            let received =
                match sys::cvt(unsafe { libc::recvmsg(fd, &mut hdr, libc::MSG_DONTWAIT) }) {
                    Ok(received) => received,
                    Err(e) => match e.kind() {
                        io::ErrorKind::Interrupted => continue,
                        io::ErrorKind::WouldBlock => return Ok(false),
                        _ if sys::is_async_send_error(&e) => {
                            self.socket.stats.socket_errors += 1;
                            self.socket.errors.signal();
                            continue;
                        }
                        _ => return Err(e),
                    },
                };
            let app_rx = realtime_now();
            let cmsgs = sys::parse_cmsgs(&hdr);
            if let Some(dropped) = cmsgs.rxq_ovfl {
                self.socket.stats.rx_dropped = dropped as u64;
            }
            let Some(peer) = sys::sockaddr_to(&name, hdr.msg_namelen) else {
                // Not an IP peer (cannot happen on a UDP socket): skip it.
                continue;
            };
            batch.commit(RxMeta {
                peer,
                len: received as usize,
                truncated: hdr.msg_flags & libc::MSG_TRUNC != 0,
                kernel_rx: cmsgs.sw_stamp,
                app_rx,
            });
            self.socket.stats.rx_packets += 1;
            return Ok(true);
        }
    }
}

impl BatchIo for SocketBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Socket
    }
    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.socket.sock.local_addr()
    }
    fn raw_fd(&self) -> RawFd {
        self.socket.fd()
    }
    fn recv_batch(&mut self, batch: &mut RxBatch, timeout: Option<Duration>) -> io::Result<usize> {
        batch.clear();
        // Data was there last time (or the caller is spinning): try a
        // receive before polling.
        let direct = self.busy || timeout == Some(Duration::ZERO);
        if !(direct && self.recv_one(batch)?) {
            self.busy = false;
            if timeout == Some(Duration::ZERO)
                || !self.socket.wait_for_datagram(timeout, &mut self.waiter)?
            {
                return Ok(0);
            }
            if !self.recv_one(batch)? {
                // Woken, but another waiter took the datagram.
                self.waiter.idle_wakeups += 1;
                return Ok(0);
            }
        }
        while batch.free_frames() > 0 {
            if !self.recv_one(batch)? {
                self.busy = false;
                return Ok(batch.len());
            }
        }
        self.busy = true;
        Ok(batch.len())
    }
    fn send_batch(&mut self, batch: &TxBatch) -> io::Result<usize> {
        let fd = self.socket.fd();
        let mut sent = 0;
        let mut name = sys::zero_storage();
        for (i, e) in batch.entries().iter().enumerate() {
            let data = batch.data(i);
            let namelen = sys::sockaddr_from(&e.dst, &mut name);
            let mut iov = libc::iovec {
                iov_base: data.as_ptr() as *mut libc::c_void,
                iov_len: data.len(),
            };
            // SAFETY: msghdr is plain old data; all-zero is valid before we fill it.
            let mut hdr: libc::msghdr = unsafe { std::mem::zeroed() };
            hdr.msg_name = (&mut name as *mut libc::sockaddr_storage).cast();
            hdr.msg_namelen = namelen;
            hdr.msg_iov = &mut iov;
            hdr.msg_iovlen = 1;
            let request = self.socket.stamp_request(e.stamp_tag);
            let key = request.flatten();
            if let Some(key) = request {
                let clen = sys::write_tx_stamp_cmsg(&mut self.cbuf, key);
                hdr.msg_control = self.cbuf.as_mut_ptr().cast();
                hdr.msg_controllen = clen as _;
            }
            let app_tx = realtime_now();
            if let (Some(key), Some(tag)) = (key, e.stamp_tag) {
                self.socket.stamps.expect(key, tag, app_tx);
            }
            let mut retries = 0;
            loop {
                self.socket.stats.tx_syscalls += 1;
                // SAFETY: hdr points at live buffers (name, iov over the frame,
                // cbuf) valid for the call; the kernel only reads them.
                match sys::cvt(unsafe { libc::sendmsg(fd, &hdr, libc::MSG_DONTWAIT) }) {
                    Ok(_) => {
                        sent += 1;
                        if let (Some(tag), Some(None)) = (e.stamp_tag, request) {
                            self.socket.stamps.sent(tag, app_tx);
                        }
                    }
                    Err(err) if err.kind() == io::ErrorKind::Interrupted => continue,
                    // A pending ICMP error about an earlier datagram, not
                    // this one: it is queued; send this one again.
                    Err(err) if sys::is_async_send_error(&err) && retries < ASYNC_ERROR_RETRIES => {
                        retries += 1;
                        self.socket.stats.socket_errors += 1;
                        self.socket.errors.signal();
                        continue;
                    }
                    Err(_) => {
                        self.socket.stats.tx_errors += 1;
                        if let Some(key) = key {
                            self.socket.stamps.unsent(key);
                        }
                    }
                }
                break;
            }
        }
        self.socket.stats.tx_packets += sent as u64;
        Ok(sent)
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
