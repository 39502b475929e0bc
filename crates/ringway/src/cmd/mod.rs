//! Subcommand implementations, one module per area (each owned separately).

pub mod demo;
pub mod io;
pub mod lab;
pub mod reorder;
pub mod sfu;
pub mod sip;
