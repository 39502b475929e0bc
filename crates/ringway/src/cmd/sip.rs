//! `ringway sip ...`.

/// `ringway sip` subcommands.
#[derive(clap::Subcommand, Debug)]
pub enum SipCmd {
    /// Placeholder until this area lands.
    Todo,
}

/// Run a `ringway sip` subcommand.
pub fn run(_c: SipCmd) -> anyhow::Result<()> {
    anyhow::bail!("not built yet")
}
