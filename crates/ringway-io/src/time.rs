//! Clocks. Kernel software timestamps (SO_TIMESTAMPING) use CLOCK_REALTIME,
//! so application-side stamps that are compared with them use it too.

use serde::{Deserialize, Serialize};

/// Nanoseconds on some clock (see the function that produced it).
#[derive(
    Copy, Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
pub struct Nanos(pub u64);

impl Nanos {
    /// `self - earlier`, saturating at zero (clock steps never give huge values).
    pub fn saturating_since(self, earlier: Nanos) -> u64 {
        self.0.saturating_sub(earlier.0)
    }
}

fn clock(id: libc::clockid_t) -> Nanos {
    let mut spec = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec and `id` is a valid clock id.
    let result = unsafe { libc::clock_gettime(id, &mut spec) };
    debug_assert_eq!(result, 0);
    Nanos(spec.tv_sec as u64 * 1_000_000_000 + spec.tv_nsec as u64)
}

/// CLOCK_REALTIME now: comparable with kernel software RX/TX timestamps.
pub fn realtime_now() -> Nanos {
    clock(libc::CLOCK_REALTIME)
}

/// CLOCK_MONOTONIC now: for intervals measured inside the application.
pub fn monotonic_now() -> Nanos {
    clock(libc::CLOCK_MONOTONIC)
}
