//! The single-producer/single-consumer rings an AF_XDP socket shares with
//! the kernel, and the transmit path built on two of them (TX and
//! completion): a frame is counted as handed to the kernel only once the
//! kernel has taken it from the TX ring, and a full ring is waited on
//! (bounded) instead of dropping at once.

use crate::backend::TxProgress;
use crate::sys::Mapping;
use std::io;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// `XDP_RING_NEED_WAKEUP`: the kernel wants a syscall to make progress.
const XDP_RING_NEED_WAKEUP: u32 = 1;

/// `struct xdp_ring_offset`.
#[derive(Copy, Clone, Default, Debug)]
#[repr(C)]
pub(crate) struct RingOffset {
    pub(crate) producer: u64,
    pub(crate) consumer: u64,
    pub(crate) desc: u64,
    pub(crate) flags: u64,
}

/// One single-producer/single-consumer ring shared with the kernel.
pub(crate) struct Ring {
    map: Mapping,
    off: RingOffset,
    size: u32,
    /// Our producer index (producer rings) or consumer index (consumer rings).
    local: u32,
}

impl Ring {
    /// Map the ring the kernel created on `fd` at `pgoff`; `producer`: we
    /// produce into it (fill, TX), else we consume (RX, completion).
    pub(crate) fn new(
        fd: std::os::fd::RawFd,
        off: RingOffset,
        size: u32,
        entry: usize,
        pgoff: i64,
        producer: bool,
        what: &str,
    ) -> io::Result<Ring> {
        let len = off.desc as usize + size as usize * entry;
        let map = Mapping::shared(fd, len, pgoff)
            .map_err(|e| super::program::err(&format!("mmap {what} ring"), e))?;
        Ok(Ring::over(map, off, size, producer))
    }

    fn over(map: Mapping, off: RingOffset, size: u32, producer: bool) -> Ring {
        let mut ring = Ring {
            map,
            off,
            size,
            local: 0,
        };
        // Start from where the kernel's indices are (both 0 on a new ring).
        ring.local = if producer {
            ring.producer().load(Ordering::Relaxed)
        } else {
            ring.consumer().load(Ordering::Relaxed)
        };
        ring
    }

    /// A ring in plain memory with the kernel's layout, for tests that play
    /// the kernel's side.
    #[cfg(test)]
    pub(crate) fn anon(size: u32, entry: usize, producer: bool) -> Ring {
        let off = RingOffset {
            producer: 0,
            consumer: 64,
            flags: 128,
            desc: 192,
        };
        let map = Mapping::anon(192 + size as usize * entry).expect("anonymous mapping");
        Ring::over(map, off, size, producer)
    }

    fn index(&self, at: u64) -> &AtomicU32 {
        // SAFETY: the kernel put a u32 index at this offset inside the
        // mapping (4-byte aligned); it is only accessed atomically.
        unsafe { &*self.map.ptr.add(at as usize).cast::<AtomicU32>() }
    }
    pub(crate) fn producer(&self) -> &AtomicU32 {
        self.index(self.off.producer)
    }
    pub(crate) fn consumer(&self) -> &AtomicU32 {
        self.index(self.off.consumer)
    }
    /// The kernel set `XDP_RING_NEED_WAKEUP` on this ring (bound with
    /// `XDP_USE_NEED_WAKEUP`): it makes progress only after a syscall.
    pub(crate) fn needs_wakeup(&self) -> bool {
        self.index(self.off.flags).load(Ordering::Acquire) & XDP_RING_NEED_WAKEUP != 0
    }
    pub(crate) fn size(&self) -> u32 {
        self.size
    }
    pub(crate) fn slot(&self, idx: u32, entry: usize) -> *mut u8 {
        let index = (idx & (self.size - 1)) as usize;
        // SAFETY: i < size, so the entry lies inside the descriptor array of the mapping.
        unsafe { self.map.ptr.add(self.off.desc as usize + index * entry) }
    }
    /// Producer ring: free slots.
    pub(crate) fn free(&self) -> u32 {
        self.size - self.pending()
    }
    /// Producer ring: entries (published or not) the kernel has not consumed.
    pub(crate) fn pending(&self) -> u32 {
        self.local
            .wrapping_sub(self.consumer().load(Ordering::Acquire))
    }
    /// Producer ring: queue an address (fill ring).
    pub(crate) fn push_addr(&mut self, addr: u64) {
        // SAFETY: the slot is an 8-byte aligned u64 entry of a ring we
        // produce; the kernel reads it only after `publish`.
        unsafe { self.slot(self.local, 8).cast::<u64>().write_volatile(addr) };
        self.local = self.local.wrapping_add(1);
    }
    /// Producer ring: queue a descriptor (TX ring).
    pub(crate) fn push_desc(&mut self, addr: u64, len: u32) {
        let slot = self.slot(self.local, 16);
        // SAFETY: the slot is a 16-byte `struct xdp_desc` of a ring we produce.
        unsafe {
            slot.cast::<u64>().write_volatile(addr);
            slot.add(8).cast::<u32>().write_volatile(len);
            slot.add(12).cast::<u32>().write_volatile(0);
        }
        self.local = self.local.wrapping_add(1);
    }
    /// Producer ring: make queued entries visible.
    pub(crate) fn publish(&self) {
        self.producer().store(self.local, Ordering::Release);
    }
    /// Consumer ring: entries ready.
    pub(crate) fn ready(&self) -> u32 {
        self.producer()
            .load(Ordering::Acquire)
            .wrapping_sub(self.local)
    }
    /// Consumer ring: the address at our index + k (completion ring).
    pub(crate) fn peek_addr(&self, k: u32) -> u64 {
        // SAFETY: an entry the kernel published (k < ready()), u64 aligned.
        unsafe {
            self.slot(self.local.wrapping_add(k), 8)
                .cast::<u64>()
                .read_volatile()
        }
    }
    /// Consumer ring: the descriptor at our index + k (RX ring).
    pub(crate) fn peek_desc(&self, k: u32) -> (u64, u32) {
        let slot = self.slot(self.local.wrapping_add(k), 16);
        // SAFETY: an entry the kernel published (k < ready()).
        unsafe {
            (
                slot.cast::<u64>().read_volatile(),
                slot.add(8).cast::<u32>().read_volatile(),
            )
        }
    }
    /// Consumer ring: hand `n` entries back.
    pub(crate) fn release(&mut self, n: u32) {
        self.local = self.local.wrapping_add(n);
        self.consumer().store(self.local, Ordering::Release);
    }
}

/// The kernel's side of transmitting: what the TX path asks of it.
pub(crate) trait TxKernel {
    /// Ask the kernel to transmit what the TX ring holds (one `sendto`
    /// kick; it may take only part of it).
    fn kick(&mut self) -> io::Result<()>;
    /// Wait at most `timeout` for the kernel to take or complete TX frames.
    fn wait(&mut self, timeout: Duration) -> io::Result<()>;
}

/// The transmit path: TX and completion rings, the frames not in any ring,
/// and what has been queued and handed over.
pub(crate) struct TxRing {
    pub(crate) tx: Ring,
    pub(crate) comp: Ring,
    /// UMEM frame offsets (frame starts) in no ring and not lent out.
    pub(crate) free: Vec<u64>,
    frame_size: u64,
    /// Descriptors published in the TX ring since opening.
    published: u64,
    /// Descriptors pushed but not yet published.
    unpublished: u32,
    /// Copies done with another way (sent by a socket, or dropped).
    pub(crate) elsewhere: u64,
    /// Longest wait for a free frame or ring slot before a copy is dropped.
    wait_bound: Duration,
    /// Waits for room (the ring was congested) and copies dropped after one.
    pub(crate) full_waits: u64,
    pub(crate) full_drops: u64,
    /// The last wait ended without room: until room appears again, copies
    /// are dropped after one kick instead of each waiting the whole bound
    /// (a stall costs one bound, not one per copy).
    stalled: bool,
}

impl TxRing {
    pub(crate) fn new(
        tx: Ring,
        comp: Ring,
        free: Vec<u64>,
        frame_size: u64,
        wait_bound: Duration,
    ) -> TxRing {
        TxRing {
            tx,
            comp,
            free,
            frame_size,
            published: 0,
            unpublished: 0,
            elsewhere: 0,
            wait_bound,
            full_waits: 0,
            full_drops: 0,
            stalled: false,
        }
    }

    /// Move completed frames back to the free list.
    pub(crate) fn reap(&mut self) {
        let ready = self.comp.ready();
        for k in 0..ready {
            let addr = self.comp.peek_addr(k);
            self.free.push(addr - addr % self.frame_size);
        }
        if ready > 0 {
            self.comp.release(ready);
        }
    }

    fn room(&self, frame: bool) -> bool {
        self.tx.free() > 0 && (!frame || !self.free.is_empty())
    }

    /// Make sure there is a TX ring slot (and, with `frame`, a free frame),
    /// waiting for the kernel — kick, wait, reap — at most the wait bound
    /// (not at all while a stall that already cost one bound lasts).
    /// `false`: the ring stayed full (counted in `full_drops`).
    pub(crate) fn make_room(&mut self, k: &mut impl TxKernel, frame: bool) -> io::Result<bool> {
        if self.room(frame) {
            self.stalled = false;
            return Ok(true);
        }
        self.reap();
        if self.room(frame) {
            self.stalled = false;
            return Ok(true);
        }
        self.publish();
        if self.stalled {
            k.kick()?;
            self.reap();
            if self.room(frame) {
                self.stalled = false;
                return Ok(true);
            }
            self.full_drops += 1;
            return Ok(false);
        }
        self.full_waits += 1;
        let deadline = Instant::now() + self.wait_bound;
        loop {
            k.kick()?;
            self.reap();
            if self.room(frame) {
                return Ok(true);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                self.full_drops += 1;
                self.stalled = true;
                return Ok(false);
            }
            k.wait(left.min(Duration::from_micros(100)))?;
            self.reap();
            if self.room(frame) {
                return Ok(true);
            }
        }
    }

    /// A free TX frame (waiting for one as [`Self::make_room`] does).
    pub(crate) fn reserve(&mut self, k: &mut impl TxKernel) -> io::Result<Option<u64>> {
        if !self.make_room(k, true)? {
            return Ok(None);
        }
        Ok(self.free.pop())
    }

    /// Queue descriptor (`addr`, `len`); visible after [`Self::publish`].
    /// The caller made room first.
    pub(crate) fn push(&mut self, addr: u64, len: u32) {
        debug_assert!(self.tx.free() > 0);
        self.tx.push_desc(addr, len);
        self.unpublished += 1;
    }

    /// Make pushed descriptors visible to the kernel.
    pub(crate) fn publish(&mut self) {
        if self.unpublished > 0 {
            self.tx.publish();
            self.published += u64::from(self.unpublished);
            self.unpublished = 0;
        }
    }

    /// Published descriptors the kernel has not taken yet.
    pub(crate) fn in_ring(&self) -> u64 {
        u64::from(self.tx.pending() - self.unpublished)
    }

    /// Descriptors the kernel has taken from the ring since opening.
    pub(crate) fn taken(&self) -> u64 {
        self.published - self.in_ring()
    }

    /// Queued and handed-over counts (see [`TxProgress`]).
    pub(crate) fn progress(&self) -> TxProgress {
        TxProgress {
            queued: self.published + self.elsewhere,
            handed: self.taken() + self.elsewhere,
        }
    }

    /// Publish and kick until the kernel has taken everything, at most a
    /// bounded number of kicks; what it did not take stays in the ring
    /// (and is not counted as handed over).
    pub(crate) fn kick_all(
        &mut self,
        k: &mut impl TxKernel,
        wakeup_needed: bool,
    ) -> io::Result<()> {
        self.publish();
        if self.in_ring() == 0 {
            self.reap();
            return Ok(());
        }
        if !wakeup_needed {
            // The kernel is running the ring by itself (need_wakeup clear).
            self.reap();
            return Ok(());
        }
        // Copy mode takes at most 32 frames per kick: kick again while the
        // kernel makes progress, and stop as soon as it makes none (its
        // queue is stopped: the frames wait for the next flush).
        let tries = 4 + self.tx.size() / 32;
        for _ in 0..tries {
            let before = self.in_ring();
            k.kick()?;
            self.reap();
            let after = self.in_ring();
            if after == 0 || after >= before {
                break;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Plays the kernel: each kick takes at most `per_kick` descriptors
    /// from the TX ring and completes them; `stalled` takes none.
    struct FakeKernel<'a> {
        ring: &'a mut (Ring, Ring),
        per_kick: u32,
        kicks: u32,
        waits: u32,
    }

    impl TxKernel for FakeKernel<'_> {
        fn kick(&mut self) -> io::Result<()> {
            self.kicks += 1;
            let (tx, comp) = &mut *self.ring;
            let prod = tx.producer().load(Ordering::Acquire);
            let mut cons = tx.consumer().load(Ordering::Acquire);
            let mut cq = comp.producer().load(Ordering::Acquire);
            let mut n = 0;
            while cons != prod && n < self.per_kick {
                let p = tx.slot(cons, 16);
                // SAFETY: reading a published descriptor of the fake ring.
                let addr = unsafe { p.cast::<u64>().read_volatile() };
                // SAFETY: writing a completion entry of the fake ring.
                unsafe { comp.slot(cq, 8).cast::<u64>().write_volatile(addr) };
                cons = cons.wrapping_add(1);
                cq = cq.wrapping_add(1);
                n += 1;
            }
            tx.consumer().store(cons, Ordering::Release);
            comp.producer().store(cq, Ordering::Release);
            Ok(())
        }
        fn wait(&mut self, t: Duration) -> io::Result<()> {
            self.waits += 1;
            std::thread::sleep(t);
            Ok(())
        }
    }

    /// The same memory as the TxRing's rings, seen from the kernel's side.
    fn kernel_view(t: &TxRing) -> std::mem::ManuallyDrop<(Ring, Ring)> {
        let alias = |r: &Ring| {
            // A second view of the same mapping (not owned: forgotten below).
            Ring {
                map: Mapping {
                    ptr: r.map.ptr,
                    len: r.map.len,
                },
                off: r.off,
                size: r.size,
                local: 0,
            }
        };
        std::mem::ManuallyDrop::new((alias(&t.tx), alias(&t.comp)))
    }

    fn tx_ring(frames: u64, ring: u32, bound: Duration) -> TxRing {
        TxRing::new(
            Ring::anon(ring, 16, true),
            Ring::anon(ring, 8, false),
            (0..frames).map(|i| i * 2048).collect(),
            2048,
            bound,
        )
    }

    /// Queue `n` copies through `reserve` + `push` + `publish`, as the
    /// backend does; returns how many got a frame.
    fn queue(t: &mut TxRing, k: &mut impl TxKernel, n: usize) -> usize {
        let mut got = 0;
        for _ in 0..n {
            if let Some(f) = t.reserve(k).unwrap() {
                t.push(f, 100);
                got += 1;
            } else {
                t.elsewhere += 1; // dropped: done with, never handed over
            }
        }
        t.publish();
        got
    }

    /// A stalled kernel: the send path waits at most the bound for room,
    /// then drops (and, while the stall lasts, drops without waiting
    /// again); frames still in the ring are never counted as handed; when
    /// the kernel moves again, so does the send path.
    #[test]
    fn full_ring_waits_bounded_and_never_counts_frames_in_the_ring() {
        let bound = Duration::from_millis(20);
        let mut t = tx_ring(8, 8, bound);
        let mut view = kernel_view(&t);
        let mut k = FakeKernel {
            ring: &mut view,
            per_kick: 0,
            kicks: 0,
            waits: 0,
        };
        let start = Instant::now();
        let got = queue(&mut t, &mut k, 12);
        let took = start.elapsed();
        assert_eq!(got, 8, "8 frames, then the ring is full");
        assert_eq!(t.full_waits, 1, "one wait for the stall");
        assert_eq!(t.full_drops, 4);
        assert!(took >= bound, "waited for room: {took:?}");
        assert!(
            took < bound + Duration::from_millis(200),
            "once, bounded: {took:?}"
        );
        assert!(k.waits > 0 && k.kicks > 0);
        assert_eq!(t.in_ring(), 8);
        let p = t.progress();
        assert_eq!(
            (p.queued, p.handed),
            (12, 4),
            "only the drops are done with"
        );
        // kick_all is bounded too and does not pretend.
        t.kick_all(&mut k, true).unwrap();
        assert_eq!(t.progress().handed, 4);
        // The kernel moves again: frames come back and copies go out.
        k.per_kick = 100;
        assert_eq!(queue(&mut t, &mut k, 4), 4);
        t.kick_all(&mut k, true).unwrap();
        assert_eq!(t.progress().handed, 16);
        assert_eq!(t.in_ring(), 0);
    }

    /// A kernel that takes a few frames per kick: a burst larger than the
    /// ring waits for completions instead of dropping, and the counts are
    /// exact — handed over only what the kernel took.
    #[test]
    fn slow_kernel_burst_waits_for_completions() {
        let mut t = tx_ring(16, 8, Duration::from_millis(500));
        let mut view = kernel_view(&t);
        let mut k = FakeKernel {
            ring: &mut view,
            per_kick: 3,
            kicks: 0,
            waits: 0,
        };
        let got = queue(&mut t, &mut k, 40);
        assert_eq!(got, 40, "nothing dropped");
        assert_eq!(t.full_drops, 0);
        assert!(t.full_waits > 0);
        let p = t.progress();
        assert_eq!(p.queued, 40);
        assert_eq!(p.handed, t.taken());
        assert_eq!(p.handed + t.in_ring(), 40);
        t.kick_all(&mut k, true).unwrap();
        assert_eq!(t.in_ring(), 0);
        assert_eq!(t.progress().handed, 40);
        assert_eq!(t.free.len(), 16, "every frame came back");
    }
}
