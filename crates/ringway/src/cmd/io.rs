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
pub fn doctor(a: DoctorArgs) -> anyhow::Result<()> {
    let rep = ringway_io::doctor::run();
    if a.json {
        println!("{}", serde_json::to_string_pretty(&rep)?);
    } else {
        print!("{}", ringway_io::doctor::render_text(&rep));
    }
    Ok(())
}

/// Run `ringway bench ...`.
pub fn bench(_c: BenchCmd) -> anyhow::Result<()> {
    anyhow::bail!("bench not built yet")
}
