//! Test support shared by the workspace's tests (cargo feature `testing`,
//! never on in a product build), as smoltcp ships `phy::Loopback` and
//! `FaultInjector` with the code they test:
//!
//! * [`MemIo`], an in-memory [`crate::BatchIo`] for the drivers' tests;
//! * [`skip`], [`data_missing`] and [`testdata`], so that a test which cannot run its
//!   checks says so on the test output (and in the summary of
//!   `scripts/test.sh`) instead of passing silently.

mod mem_io;
mod skip;

pub use mem_io::{MemIo, SentDatagram, SimClock};
pub use skip::{data_missing, skip, testdata};
