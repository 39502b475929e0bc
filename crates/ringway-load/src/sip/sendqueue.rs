//! Datagrams waiting for the worker's next send call, grouped into UDP GSO
//! trains when GSO is on.

use super::callgen::MessageKind;
use ringway_io::{BatchIo, TxBatch};
use std::net::SocketAddr;

/// Most datagrams per send call.
pub(crate) const TX_FRAMES: usize = 128;
/// Largest datagram sent.
pub(crate) const TX_FRAME: usize = 2048;

/// A datagram waiting in the GSO staging area: bytes at `off..off+len` of
/// `SendQueue::stage`.
#[derive(Copy, Clone, Debug)]
struct Staged {
    kind: MessageKind,
    dst: SocketAddr,
    off: u32,
    len: u32,
}

/// The datagrams queued since the last flush, and send counters.
pub(crate) struct SendQueue {
    /// GSO is on: datagrams are staged and sorted before each flush.
    gso: bool,
    staged: Vec<Staged>,
    stage: Vec<u8>,
    tx: TxBatch,
    /// Datagrams to this address are counted in `msgs_to_proxy`.
    proxy: Option<SocketAddr>,
    /// Datagrams queued (all).
    pub msgs_sent: u64,
    /// Datagrams queued for the proxy address.
    pub msgs_to_proxy: u64,
    /// Of those, call-setup messages (INVITE, 180, 200 to INVITE, ACK).
    pub setup_to_proxy: u64,
}

impl SendQueue {
    /// An empty queue; `gso`: stage and sort for GSO trains.
    pub(crate) fn new(gso: bool, proxy: Option<SocketAddr>) -> SendQueue {
        SendQueue {
            gso,
            staged: Vec::with_capacity(TX_FRAMES),
            stage: Vec::with_capacity(TX_FRAMES * 1024),
            tx: TxBatch::new(TX_FRAMES, TX_FRAME),
            proxy,
            msgs_sent: 0,
            msgs_to_proxy: 0,
            setup_to_proxy: 0,
        }
    }

    /// GSO staging is on.
    pub(crate) fn gso(&self) -> bool {
        self.gso
    }

    /// Queue `bytes` for `dst` (a full queue is sent through `io` first).
    pub(crate) fn push(
        &mut self,
        io: &mut dyn BatchIo,
        dst: SocketAddr,
        kind: MessageKind,
        bytes: &[u8],
    ) {
        if self.gso {
            if bytes.len() > TX_FRAME {
                return; // as `TxBatch::push` refuses it without GSO
            }
            if self.staged.len() >= TX_FRAMES {
                self.flush(io);
            }
            self.staged.push(Staged {
                kind,
                dst,
                off: self.stage.len() as u32,
                len: bytes.len() as u32,
            });
            self.stage.extend_from_slice(bytes);
        } else {
            if self.tx.is_full() {
                self.flush(io);
            }
            if self.tx.push(dst, bytes).is_err() {
                return;
            }
        }
        self.msgs_sent += 1;
        if Some(dst) == self.proxy {
            self.msgs_to_proxy += 1;
            if matches!(
                kind,
                MessageKind::Invite
                    | MessageKind::Provisional
                    | MessageKind::InviteOk
                    | MessageKind::Ack
            ) {
                self.setup_to_proxy += 1;
            }
        }
    }

    /// Send everything queued through `io` in one send call.
    pub(crate) fn flush(&mut self, io: &mut dyn BatchIo) {
        if !self.staged.is_empty() {
            // Equal (kind, destination, length) side by side; `off` grows in
            // queueing order, so ties keep it (a stable sort without allocating).
            self.staged
                .sort_unstable_by_key(|m| (m.kind, m.dst, m.len, m.off));
            for m in &self.staged {
                let bytes = &self.stage[m.off as usize..(m.off + m.len) as usize];
                // Fits: at most TX_FRAMES staged, each at most TX_FRAME bytes.
                let _ = self.tx.push(m.dst, bytes);
            }
            self.staged.clear();
            self.stage.clear();
        }
        if self.tx.is_empty() {
            return;
        }
        let _ = io.send_batch(&self.tx);
        self.tx.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ringway_io::{open_backend, open_udp, BackendKind, RxBatch, SocketConfig};
    use std::time::{Duration, Instant};

    #[test]
    fn gso_flush_groups_kinds_in_call_order() {
        let sc = SocketConfig::new("127.0.0.1:0".parse().unwrap());
        let (sock, _) = open_udp(&sc).unwrap();
        let mut io = open_backend(BackendKind::Mmsg, sock).unwrap();
        assert!(io.set_gso(true), "UDP GSO not available");
        let mut q = SendQueue::new(true, None);
        let dst = io.local_addr().unwrap();
        // Queued interleaved, as answering two INVITEs and a BYE does.
        for (kind, body) in [
            (MessageKind::Provisional, "180a"),
            (MessageKind::InviteOk, "200-a"),
            (MessageKind::Final, "bye-ok"),
            (MessageKind::Provisional, "180b"),
            (MessageKind::InviteOk, "200-b"),
        ] {
            q.push(&mut *io, dst, kind, body.as_bytes());
        }
        q.flush(&mut *io);
        let mut rx = RxBatch::new(8, 64);
        let mut got = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(5);
        while got.len() < 5 && Instant::now() < deadline {
            io.recv_batch(&mut rx, Some(Duration::from_millis(100)))
                .unwrap();
            got.extend(
                rx.iter()
                    .map(|d| String::from_utf8_lossy(d.data).into_owned()),
            );
        }
        assert_eq!(got, ["180a", "180b", "200-a", "200-b", "bye-ok"]);
        assert_eq!(q.msgs_sent, 5);
        let g = io.gso_stats();
        assert!(g.enabled);
        assert_eq!((g.trains, g.segments), (2, 4), "{g:?}");
    }
}
