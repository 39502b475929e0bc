//! Subcommand implementations, one module per area (each owned separately).

pub(crate) mod config;
pub(crate) mod ctl;
pub(crate) mod demo;
pub(crate) mod io;
pub(crate) mod lab;
pub(crate) mod lab_impair;
pub(crate) mod lab_sfu;
pub(crate) mod lab_sip;
pub(crate) mod lab_srpic;
pub(crate) mod lab_srpic_tcp;
pub(crate) mod manage;
pub(crate) mod reorder;
pub(crate) mod serving;
pub(crate) mod sfu;
pub(crate) mod sip;
pub(crate) mod sip_connections;
pub(crate) mod sip_dispatch;
pub(crate) mod sip_idle;
pub(crate) mod sip_load;
pub(crate) mod sip_proxy;
pub(crate) mod sip_resolve;

/// The options `args` give one command's arguments `A` (test helper).
#[cfg(test)]
pub(crate) fn parse_args<A: clap::Args>(args: &[&str]) -> Result<A, clap::Error> {
    let command = A::augment_args(clap::Command::new("t"));
    let matches = command.try_get_matches_from(std::iter::once("t").chain(args.iter().copied()))?;
    A::from_arg_matches(&matches)
}
