//! Temporary std-only backend (no timestamps): replaced by the real
//! `socket` and `mmsg` backends.

use crate::backend::{BackendKind, BatchIo, IoStats};
use crate::batch::{RxBatch, RxMeta, TxBatch, TxStamp};
use crate::time::realtime_now;
use std::io;
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::{AsRawFd, RawFd};
use std::time::Duration;

pub(crate) struct StdBackend {
    kind: BackendKind,
    sock: UdpSocket,
    stats: IoStats,
}

impl StdBackend {
    pub(crate) fn new(kind: BackendKind, sock: UdpSocket) -> Self {
        StdBackend {
            kind,
            sock,
            stats: IoStats::default(),
        }
    }
}

impl BatchIo for StdBackend {
    fn kind(&self) -> BackendKind {
        self.kind
    }
    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.sock.local_addr()
    }
    fn raw_fd(&self) -> RawFd {
        self.sock.as_raw_fd()
    }
    fn recv_batch(&mut self, batch: &mut RxBatch, timeout: Option<Duration>) -> io::Result<usize> {
        batch.clear();
        self.sock.set_nonblocking(false)?;
        self.sock
            .set_read_timeout(timeout.map(|t| t.max(Duration::from_micros(1))))?;
        let first = self.recv_one(batch);
        self.sock.set_nonblocking(true)?;
        match first {
            Ok(()) => {}
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock
                        | io::ErrorKind::TimedOut
                        | io::ErrorKind::Interrupted
                ) =>
            {
                return Ok(0)
            }
            Err(e) => return Err(e),
        }
        while batch.len() < batch.capacity() {
            match self.recv_one(batch) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) => return Err(e),
            }
        }
        Ok(batch.len())
    }
    fn send_batch(&mut self, batch: &TxBatch) -> io::Result<usize> {
        let mut sent = 0;
        for (dst, data) in batch.iter() {
            self.stats.tx_syscalls += 1;
            match self.sock.send_to(data, dst) {
                Ok(_) => sent += 1,
                Err(_) => self.stats.tx_errors += 1,
            }
        }
        self.stats.tx_packets += sent as u64;
        Ok(sent)
    }
    fn poll_tx_stamps(&mut self, _out: &mut Vec<TxStamp>) -> io::Result<usize> {
        Ok(0)
    }
    fn stats(&self) -> IoStats {
        self.stats
    }
}

impl StdBackend {
    fn recv_one(&mut self, batch: &mut RxBatch) -> io::Result<()> {
        let frame = batch.next_frame_mut().expect("room checked by caller");
        self.stats.rx_syscalls += 1;
        let (len, peer) = self.sock.recv_from(frame)?;
        let meta = RxMeta {
            peer,
            len,
            truncated: false,
            kernel_rx: None,
            app_rx: realtime_now(),
        };
        batch.commit(meta);
        self.stats.rx_packets += 1;
        Ok(())
    }
}
