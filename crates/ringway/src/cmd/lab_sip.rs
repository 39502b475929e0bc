//! `ringway lab sip`: SIP capacity sweeps and reports.

/// Arguments (being built).
#[derive(clap::Args, Debug)]
pub struct LabSipArgs {}

/// Run it.
pub fn run(_a: LabSipArgs) -> anyhow::Result<()> {
    anyhow::bail!("not built yet")
}
