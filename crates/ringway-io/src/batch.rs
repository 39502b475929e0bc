//! Pre-allocated receive and send batches.

use crate::time::{monotonic_now, Nanos};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};

/// Metadata of one received datagram.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct RxMeta {
    /// Sender address.
    pub peer: SocketAddr,
    /// Bytes stored in the frame (at most the frame size).
    pub len: usize,
    /// The datagram was longer than the frame and was cut.
    pub truncated: bool,
    /// Kernel software RX timestamp (CLOCK_REALTIME), when enabled and delivered.
    pub kernel_rx: Option<Nanos>,
    /// When the application got the datagram (CLOCK_REALTIME, taken after
    /// the syscall; comparable with `kernel_rx`). The same moment on the
    /// monotonic clock, for intervals inside the application, is
    /// [`RxBatch::received_at`].
    pub app_rx: Nanos,
}

impl Default for RxMeta {
    fn default() -> Self {
        RxMeta {
            peer: SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 0)),
            len: 0,
            truncated: false,
            kernel_rx: None,
            app_rx: Nanos(0),
        }
    }
}

/// A received datagram: metadata plus a view of its bytes in the batch's frame.
#[derive(Copy, Clone, Debug)]
pub struct Datagram<'a> {
    /// Metadata (peer, length, timestamps).
    pub meta: &'a RxMeta,
    /// The payload bytes.
    pub data: &'a [u8],
}

/// Fixed-size frames in one contiguous arena (UMEM-like layout).
#[derive(Debug)]
struct Arena {
    mem: Vec<u8>,
    frame_size: usize,
    frames: usize,
}

impl Arena {
    fn new(frames: usize, frame_size: usize) -> Self {
        assert!(
            frames > 0 && frame_size > 0,
            "batch needs at least one frame of at least one byte"
        );
        Arena {
            mem: vec![0u8; frames * frame_size],
            frame_size,
            frames,
        }
    }
    fn frame(&self, i: usize) -> &[u8] {
        &self.mem[i * self.frame_size..(i + 1) * self.frame_size]
    }
    fn frame_mut(&mut self, i: usize) -> &mut [u8] {
        &mut self.mem[i * self.frame_size..(i + 1) * self.frame_size]
    }
}

/// A receive batch: `capacity` frames of `frame_size` bytes, allocated once.
///
/// Normally each frame holds one datagram. With UDP GRO
/// ([`crate::BatchIo::set_gro`]) one frame may hold a coalesced train that
/// is split into several datagrams, so [`Self::len`] can exceed
/// [`Self::capacity`]; [`Self::free_frames`] tells how many frames are left.
#[derive(Debug)]
pub struct RxBatch {
    arena: Arena,
    meta: Vec<RxMeta>,
    /// CLOCK_MONOTONIC application receive time of each held datagram.
    received: Vec<Nanos>,
    /// Byte offset of each held datagram in the arena.
    offs: Vec<usize>,
    /// Frames filled so far.
    used: usize,
}

impl RxBatch {
    /// Allocate a batch of `capacity` frames of `frame_size` bytes each.
    pub fn new(capacity: usize, frame_size: usize) -> Self {
        RxBatch {
            arena: Arena::new(capacity, frame_size),
            meta: Vec::with_capacity(capacity),
            received: Vec::with_capacity(capacity),
            offs: Vec::with_capacity(capacity),
            used: 0,
        }
    }
    /// Number of frames.
    pub fn capacity(&self) -> usize {
        self.arena.frames
    }
    /// Bytes per frame.
    pub fn frame_size(&self) -> usize {
        self.arena.frame_size
    }
    /// Number of datagrams currently held.
    pub fn len(&self) -> usize {
        self.meta.len()
    }
    /// True when no datagram is held.
    pub fn is_empty(&self) -> bool {
        self.meta.is_empty()
    }
    /// Frames filled so far (equals [`Self::len`] unless GRO split a frame).
    pub fn frames_used(&self) -> usize {
        self.used
    }
    /// Frames still free.
    pub fn free_frames(&self) -> usize {
        self.arena.frames - self.used
    }
    /// Forget all held datagrams (frames are reused).
    pub fn clear(&mut self) {
        self.meta.clear();
        self.received.clear();
        self.offs.clear();
        self.used = 0;
    }
    /// The `i`-th datagram, if held.
    pub fn get(&self, i: usize) -> Option<Datagram<'_>> {
        let meta = self.meta.get(i)?;
        let off = self.offs[i];
        Some(Datagram {
            meta,
            data: &self.arena.mem[off..off + meta.len],
        })
    }
    /// Iterate the held datagrams in arrival order.
    pub fn iter(&self) -> impl Iterator<Item = Datagram<'_>> + '_ {
        (0..self.len()).filter_map(move |i| self.get(i))
    }
    /// Mutable bytes of the `i`-th held datagram (for in-place edits).
    pub fn data_mut(&mut self, i: usize) -> &mut [u8] {
        let (off, len) = (self.offs[i], self.meta[i].len);
        &mut self.arena.mem[off..off + len]
    }
    /// Metadata of the held datagrams.
    pub fn metas(&self) -> &[RxMeta] {
        &self.meta
    }
    /// When the application got the `i`-th datagram, on CLOCK_MONOTONIC
    /// (per datagram: datagrams taken by one `recvmmsg` share the moment
    /// it returned; socket, io_uring and AF_XDP stamp each datagram as it is
    /// taken).
    /// Panics if `i` is not held.
    pub fn received_at(&self, i: usize) -> Nanos {
        self.received[i]
    }
    /// The whole frame that the next received datagram goes to (`None`
    /// when every frame is used). Write the datagram into it, then record
    /// it with [`Self::commit`]. Backends fill a batch this way, and so can
    /// a test's fake [`crate::BatchIo`]:
    ///
    /// ```
    /// use ringway_io::{realtime_now, RxBatch, RxMeta};
    /// let mut rx = RxBatch::new(4, 64);
    /// let frame = rx.next_frame_mut().expect("a free frame");
    /// frame[..5].copy_from_slice(b"hello");
    /// rx.commit(RxMeta {
    ///     peer: "127.0.0.1:5004".parse().unwrap(),
    ///     len: 5,
    ///     truncated: false,
    ///     kernel_rx: None,
    ///     app_rx: realtime_now(),
    /// });
    /// assert_eq!(rx.get(0).unwrap().data, b"hello");
    /// ```
    pub fn next_frame_mut(&mut self) -> Option<&mut [u8]> {
        if self.used >= self.arena.frames {
            return None;
        }
        Some(self.arena.frame_mut(self.used))
    }
    /// Record that the frame handed out by [`Self::next_frame_mut`] holds a
    /// datagram of `meta.len` bytes (cut to the frame size), received by
    /// the application now (CLOCK_MONOTONIC, see [`Self::received_at`]).
    /// Panics when every frame is used.
    pub fn commit(&mut self, meta: RxMeta) {
        self.commit_received(meta, monotonic_now());
    }
    /// [`Self::commit`] with the monotonic application receive time given
    /// (backends stamp once per receive call or per ring entry; tests give
    /// known stamps).
    pub fn commit_received(&mut self, meta: RxMeta, received: Nanos) {
        assert!(self.used < self.arena.frames, "commit past capacity");
        let len = meta.len.min(self.arena.frame_size);
        self.offs.push(self.used * self.arena.frame_size);
        self.meta.push(RxMeta { len, ..meta });
        self.received.push(received);
        self.used += 1;
    }
    /// Backend use: the next frame holds a GRO train of `meta.len` bytes made
    /// of `seg`-byte datagrams (the last one may be shorter): record each
    /// as its own datagram. Returns how many were recorded. Of a train cut
    /// by the frame end (`meta.truncated`) the whole datagrams are kept, a
    /// partial last piece is marked truncated, and the datagrams beyond
    /// the frame are lost (the backend counts such trains).
    pub(crate) fn commit_segments(&mut self, meta: RxMeta, seg: usize, received: Nanos) -> usize {
        assert!(self.used < self.arena.frames, "commit past capacity");
        let frame_size = self.arena.frame_size;
        let len = meta.len.min(frame_size);
        if seg == 0 || seg >= len {
            self.commit_received(meta, received);
            return 1;
        }
        let base = self.used * frame_size;
        let mut offset = 0;
        let mut count = 0;
        while offset < len {
            let seg_len = seg.min(len - offset);
            self.offs.push(base + offset);
            self.meta.push(RxMeta {
                len: seg_len,
                truncated: meta.truncated && seg_len < seg,
                ..meta
            });
            self.received.push(received);
            offset += seg_len;
            count += 1;
        }
        self.used += 1;
        count
    }
    /// Backend use: copy the first `len` bytes of frame `src` into frame `dst`.
    pub(crate) fn move_frame(&mut self, src: usize, dst: usize, len: usize) {
        let frame_size = self.arena.frame_size;
        let len = len.min(frame_size);
        self.arena
            .mem
            .copy_within(src * frame_size..src * frame_size + len, dst * frame_size);
    }
    /// Backend use: raw pointer to the start of the arena (for iovec setup).
    pub(crate) fn arena_ptr(&mut self) -> *mut u8 {
        self.arena.mem.as_mut_ptr()
    }
}

/// Error: the send batch has no free frame, or the datagram exceeds a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("send batch full or datagram larger than a frame")]
pub struct TxFull;

/// One datagram queued for sending.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct TxEntry {
    /// Destination.
    pub dst: SocketAddr,
    /// Bytes in the frame.
    pub len: usize,
    /// When set, ask the kernel for a TX timestamp and report it under this tag.
    pub stamp_tag: Option<u64>,
}

/// A send batch: frames allocated once, each entry with its own destination.
#[derive(Debug)]
pub struct TxBatch {
    arena: Arena,
    entries: Vec<TxEntry>,
}

impl TxBatch {
    /// Allocate a batch of `capacity` frames of `frame_size` bytes each.
    pub fn new(capacity: usize, frame_size: usize) -> Self {
        TxBatch {
            arena: Arena::new(capacity, frame_size),
            entries: Vec::with_capacity(capacity),
        }
    }
    /// Number of frames.
    pub fn capacity(&self) -> usize {
        self.arena.frames
    }
    /// Bytes per frame.
    pub fn frame_size(&self) -> usize {
        self.arena.frame_size
    }
    /// Number of queued datagrams.
    pub fn len(&self) -> usize {
        self.entries.len()
    }
    /// True when nothing is queued.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
    /// True when every frame is used.
    pub fn is_full(&self) -> bool {
        self.entries.len() == self.arena.frames
    }
    /// Drop all queued datagrams.
    pub fn clear(&mut self) {
        self.entries.clear();
    }
    /// Queue a copy of `data` for `dst`.
    pub fn push(&mut self, dst: SocketAddr, data: &[u8]) -> Result<(), TxFull> {
        self.push_with(dst, |frame| {
            if data.len() > frame.len() {
                return None;
            }
            frame[..data.len()].copy_from_slice(data);
            Some(data.len())
        })
        .map(|_| ())
    }
    /// Queue a datagram written in place by `fill`, which returns its length
    /// (or `None` to abandon it, e.g. when it does not fit).
    pub fn push_with(
        &mut self,
        dst: SocketAddr,
        fill: impl FnOnce(&mut [u8]) -> Option<usize>,
    ) -> Result<usize, TxFull> {
        let index = self.entries.len();
        if index >= self.arena.frames {
            return Err(TxFull);
        }
        let frame = self.arena.frame_mut(index);
        let len = fill(frame).ok_or(TxFull)?;
        if len > frame.len() {
            return Err(TxFull);
        }
        self.entries.push(TxEntry {
            dst,
            len,
            stamp_tag: None,
        });
        Ok(index)
    }
    /// Ask for a kernel TX timestamp of entry `i`, reported under `tag` by
    /// [`crate::BatchIo::poll_tx_stamps`]. Needs a socket opened with
    /// [`crate::SocketConfig::tx_timestamps`]; otherwise the request is
    /// counted in [`crate::IoStats::tx_stamps_lost`]. Panics if `i` is not queued.
    pub fn request_stamp(&mut self, i: usize, tag: u64) {
        self.entries[i].stamp_tag = Some(tag);
    }
    /// Queued entries.
    pub fn entries(&self) -> &[TxEntry] {
        &self.entries
    }
    /// Bytes of entry `i`.
    pub fn data(&self, i: usize) -> &[u8] {
        &self.arena.frame(i)[..self.entries[i].len]
    }
    /// Iterate (destination, bytes) of the queued datagrams.
    pub fn iter(&self) -> impl Iterator<Item = (SocketAddr, &[u8])> + '_ {
        (0..self.len()).map(move |i| (self.entries[i].dst, self.data(i)))
    }
}

/// UDP GSO and GRO counters of a backend (see [`crate::BatchIo::set_gso`]
/// and [`crate::BatchIo::set_gro`]).
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct GsoStats {
    /// Coalescing is on now (asked for, the kernel accepted UDP_SEGMENT and
    /// no send refused it since).
    pub enabled: bool,
    /// Datagram trains sent as one message with a UDP_SEGMENT control
    /// message (each of at least two datagrams).
    pub trains: u64,
    /// Datagrams sent inside those trains.
    pub segments: u64,
    /// Times the kernel refused a train: its datagrams went out one by one.
    /// Coalescing is switched off when the refusal means no GSO at all
    /// (EIO, EOPNOTSUPP, ENOPROTOOPT) and stays on after one train's
    /// EINVAL/EMSGSIZE.
    pub fallbacks: u64,
    /// Receive coalescing (UDP_GRO) is on (see [`crate::BatchIo::set_gro`]).
    pub gro_enabled: bool,
    /// Received messages that held a coalesced train of two or more datagrams.
    pub gro_trains: u64,
    /// Datagrams received inside those trains.
    pub gro_segments: u64,
    /// Trains longer than a receive frame: their datagrams beyond the
    /// frame end were lost (use 64 KiB frames with GRO).
    pub gro_cut: u64,
}

/// A kernel TX timestamp collected from the socket error queue.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct TxStamp {
    /// Tag given in [`TxBatch::request_stamp`].
    pub tag: u64,
    /// When the application handed the datagram to the kernel (CLOCK_REALTIME).
    pub app_tx: Nanos,
    /// Kernel software TX timestamp (CLOCK_REALTIME).
    pub kernel_tx: Nanos,
}
