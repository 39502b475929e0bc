//! Subcommand implementations, one module per area (each owned separately).

pub mod demo;
pub mod io;
pub mod lab;
pub mod lab_impair;
pub mod lab_sfu;
pub mod lab_sip;
pub mod lab_srpic;
pub mod reorder;
pub mod sfu;
pub mod sip;
pub mod sip_load;
pub mod sip_proxy;
