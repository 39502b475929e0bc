//! `ringway lab sfu`: SFU experiments (Fig. 3-5).

/// Arguments (being built).
#[derive(clap::Args, Debug)]
pub struct LabSfuArgs {}

/// Run it.
pub fn run(_a: LabSfuArgs) -> anyhow::Result<()> {
    anyhow::bail!("not built yet")
}
