//! `ringway reorder ...`.

/// `ringway reorder` subcommands.
#[derive(clap::Subcommand, Debug)]
pub enum ReorderCmd {
    /// Placeholder until this area lands.
    Todo,
}

/// Run a `ringway reorder` subcommand.
pub fn run(_c: ReorderCmd) -> anyhow::Result<()> {
    anyhow::bail!("not built yet")
}
