//! `ringway demo`.

/// Arguments of `ringway demo`.
#[derive(clap::Args, Debug)]
pub struct DemoArgs {
    /// Seconds per demo part.
    #[arg(long, default_value_t = 2.0)]
    pub seconds: f64,
}

/// Run the loopback demo.
pub fn run(_a: DemoArgs) -> anyhow::Result<()> {
    anyhow::bail!("demo not built yet")
}
