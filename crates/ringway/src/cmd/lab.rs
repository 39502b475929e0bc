//! `ringway lab ...`.

/// `ringway lab` subcommands.
#[derive(clap::Subcommand, Debug)]
pub enum LabCmd {
    /// Placeholder until this area lands.
    Todo,
}

/// Run a `ringway lab` subcommand.
pub fn run(_c: LabCmd) -> anyhow::Result<()> {
    anyhow::bail!("not built yet")
}
