//! `ringway`: one binary whose subcommands wire the sans-IO cores to the I/O backends.

#![forbid(unsafe_code)]

use clap::{CommandFactory, FromArgMatches, Subcommand};

mod cmd;
mod logging;

/// Fast UDP packet-switching servers (SIP proxy, SFU, SRPIC) and the lab that measures them.
#[derive(clap::Parser, Debug)]
#[command(name = "ringway", version = ringway_server::build::VERSION_LINE, about, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Short end-to-end demo on loopback (no system packages needed).
    Demo(cmd::demo::DemoArgs),
    /// Report what this kernel offers (backends, timestamps, AF_XDP, io_uring, netem, scheduler knobs).
    Doctor(cmd::io::DoctorArgs),
    /// Micro-benchmarks.
    #[command(subcommand)]
    Bench(cmd::io::BenchCmd),
    /// SIP proxy, registrar and load generator.
    #[command(subcommand)]
    Sip(cmd::sip::SipCmd),
    /// pktswitch SFU, its client and load tool.
    #[command(subcommand)]
    Sfu(cmd::sfu::SfuCmd),
    /// SRPIC sorting and reordering metrics.
    #[command(subcommand)]
    Reorder(cmd::reorder::ReorderCmd),
    /// Experiments: sweeps, repetitions, reports.
    #[command(subcommand)]
    Lab(cmd::lab::LabCmd),
    /// Configuration files (`--config FILE` of `sip proxy` and `sfu serve`).
    #[command(subcommand)]
    Config(cmd::config::ConfigCmd),
    /// Ask a running `sip proxy` or `sip dispatch` (its management socket).
    Ctl(cmd::ctl::CtlArgs),
}

fn main() -> anyhow::Result<()> {
    logging::init();
    ringway_server::manage::set_log_level_hook(logging::manage_hook);
    let root = Cli::command();
    // `--config FILE` of `sip proxy` / `sfu serve`: the file's options go
    // in before the command line's (which override them).
    let argv = match cmd::config::expand_args(std::env::args_os().collect(), &root) {
        Ok(argv) => argv,
        Err(e) => {
            eprintln!("ringway: {e}");
            std::process::exit(2);
        }
    };
    let matches = root.clone().get_matches_from(argv);
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    match cli.cmd {
        Cmd::Demo(a) => cmd::demo::run(a),
        Cmd::Doctor(a) => cmd::io::doctor(a),
        Cmd::Bench(c) => cmd::io::bench(c),
        Cmd::Sip(c) => cmd::sip::run(c),
        Cmd::Sfu(c) => cmd::sfu::run(c),
        Cmd::Reorder(c) => cmd::reorder::run(c),
        Cmd::Lab(c) => cmd::lab::run(c),
        Cmd::Config(c) => cmd::config::run(c, &root),
        Cmd::Ctl(a) => cmd::ctl::run(a),
    }
}
