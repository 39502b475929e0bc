//! `ringway sip load`: SIP UAC+UAS load generator.

/// Arguments (being built).
#[derive(clap::Args, Debug)]
pub struct LoadArgs {}

/// Run it.
pub fn run(_a: LoadArgs) -> anyhow::Result<()> {
    anyhow::bail!("not built yet")
}
