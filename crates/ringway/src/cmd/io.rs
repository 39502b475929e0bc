//! `ringway doctor` and `ringway bench ...`.

/// Arguments of `ringway doctor`.
#[derive(clap::Args, Debug)]
pub(crate) struct DoctorArgs {
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

/// `ringway bench` subcommands.
#[derive(clap::Subcommand, Debug)]
pub(crate) enum BenchCmd {
    /// Loopback send/receive pps and ns/packet per backend, side by side.
    Io {
        /// Seconds per backend.
        #[arg(long, default_value_t = 2.0)]
        seconds: f64,
        /// Datagram payload sizes in bytes (comma separated).
        #[arg(long, value_delimiter = ',', default_values_t = vec![64usize, 1200])]
        payload: Vec<usize>,
        /// Datagrams per batch (and GSO segments per send, at most 64).
        #[arg(long, default_value_t = 32)]
        batch: usize,
        /// Skip the UDP GSO sender variant.
        #[arg(long)]
        no_gso: bool,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
}

/// Run `ringway doctor`.
pub(crate) fn doctor(a: DoctorArgs) -> anyhow::Result<()> {
    let rep = ringway_io::doctor::run();
    if a.json {
        println!("{}", serde_json::to_string_pretty(&rep)?);
    } else {
        print!("{}", ringway_io::doctor::render_text(&rep));
    }
    Ok(())
}

/// Run `ringway bench ...`.
pub(crate) fn bench(c: BenchCmd) -> anyhow::Result<()> {
    match c {
        BenchCmd::Io {
            seconds,
            payload,
            batch,
            no_gso,
            json,
        } => {
            use ringway_io::bench;
            let rows = bench::run_all(&payload, seconds, batch, !no_gso)?;
            let conclusion = bench::conclusion(&rows);
            if json {
                let unavailable: Vec<_> = ringway_io::BackendKind::ALL
                    .iter()
                    .filter_map(|k| k.availability().err().map(|why| (k.name(), why.reason)))
                    .collect();
                let report = serde_json::json!({ "rows": rows, "conclusion": conclusion, "unavailable": unavailable });
                println!("{}", serde_json::to_string_pretty(&report)?);
            } else {
                println!(
                    "loopback UDP, {seconds} s per path, batch {batch}; ns/p = CPU ns per datagram (user/sys split), sc/p = syscalls per datagram"
                );
                print!("{}", bench::render_table(&rows));
                for k in ringway_io::BackendKind::ALL {
                    if let Err(why) = k.availability() {
                        println!("{k}: not available: {}", why.reason);
                    }
                }
                println!("{conclusion}");
            }
            Ok(())
        }
    }
}
