//! `ringway doctor` and `ringway bench ...`.

/// Arguments of `ringway doctor`.
#[derive(clap::Args, Debug)]
pub struct DoctorArgs {
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

/// `ringway bench` subcommands.
#[derive(clap::Subcommand, Debug)]
pub enum BenchCmd {
    /// Loopback send/receive pps and ns/packet per backend, side by side.
    Io {
        /// Seconds per backend.
        #[arg(long, default_value_t = 2.0)]
        seconds: f64,
    },
}

/// Run `ringway doctor`.
pub fn doctor(_a: DoctorArgs) -> anyhow::Result<()> {
    anyhow::bail!("doctor not built yet")
}

/// Run `ringway bench ...`.
pub fn bench(_c: BenchCmd) -> anyhow::Result<()> {
    anyhow::bail!("bench not built yet")
}
