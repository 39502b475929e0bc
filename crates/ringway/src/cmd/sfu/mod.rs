//! `ringway sfu ...`: the pktswitch SFU server, its client and load tool.

pub(crate) mod client;
pub(crate) mod jacktrip;
pub(crate) mod record;
pub(crate) mod serve;
pub(crate) mod token;

/// `ringway sfu` subcommands.
#[derive(clap::Subcommand, Debug)]
pub(crate) enum SfuCmd {
    /// Run the SFU: register/subscribe control plane, verified-source RTP forwarding with echo.
    Serve(serve::ServeArgs),
    /// Run a client: N registered sources sending RTP streams, receive statistics.
    Client(client::ClientArgs),
    /// Run many clients in one process (shared engine threads, one socket each).
    Load(client::LoadArgs),
    /// Run a JackTrip hub: JackTrip 1.7 clients (`jacktrip -C`) get an N-1 mix of the others.
    Jacktrip(jacktrip::HubArgs),
    /// Recordings made with `sfu serve --record-dir`: convert to WAV.
    #[command(subcommand)]
    Record(record::RecordCmd),
    /// Mint a signed join token (JWT HS256) for a room and an identity.
    Token(token::TokenArgs),
}

/// Run a `ringway sfu` subcommand.
pub(crate) fn run(c: SfuCmd) -> anyhow::Result<()> {
    match c {
        SfuCmd::Serve(a) => serve::run(a),
        SfuCmd::Client(a) => client::run(a),
        SfuCmd::Load(a) => client::run_load(a),
        SfuCmd::Token(a) => token::run(a),
        SfuCmd::Jacktrip(a) => jacktrip::run(a),
        SfuCmd::Record(c) => record::run(c),
    }
}
