//! `ringway lab srpic`: SRPIC in the SFU, reordering on/off.

/// Arguments (being built).
#[derive(clap::Args, Debug)]
pub struct LabSrpicArgs {}

/// Run it.
pub fn run(_a: LabSrpicArgs) -> anyhow::Result<()> {
    anyhow::bail!("not built yet")
}
