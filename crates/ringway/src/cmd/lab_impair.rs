//! `ringway lab impair`: UDP impairment relay (reorder, delay, loss), since netem is absent.

/// Arguments (being built).
#[derive(clap::Args, Debug)]
pub struct ImpairArgs {}

/// Run it.
pub fn run(_a: ImpairArgs) -> anyhow::Result<()> {
    anyhow::bail!("not built yet")
}
