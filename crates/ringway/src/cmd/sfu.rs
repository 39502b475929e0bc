//! `ringway sfu ...`.

/// `ringway sfu` subcommands.
#[derive(clap::Subcommand, Debug)]
pub enum SfuCmd {
    /// Placeholder until this area lands.
    Todo,
}

/// Run a `ringway sfu` subcommand.
pub fn run(_c: SfuCmd) -> anyhow::Result<()> {
    anyhow::bail!("not built yet")
}
