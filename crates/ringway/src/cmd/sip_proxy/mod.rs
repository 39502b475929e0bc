//! `ringway sip proxy`: the multi-threaded SIP proxy/registrar server.

/// Arguments (being built).
#[derive(clap::Args, Debug)]
pub struct ProxyArgs {}

/// Run it.
pub fn run(_a: ProxyArgs) -> anyhow::Result<()> {
    anyhow::bail!("not built yet")
}
