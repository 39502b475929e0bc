//! `ringway lab sfu`: SFU experiments (pktswitch Fig. 3-5), the command-line
//! front end of [`ringway_lab::sfulab`]: for every repetition, client
//! count, per-client packet rate and backend it runs the SFU and its load
//! clients in this process, collects the SFU engine's CPU user/kernel time
//! and per-packet delay, and prints a table with 95% CIs, ratios to the
//! socket baseline and the fitted delay model d(n) = k_rcv + n·k_snd.
//!
//! Everything runs inside a private network namespace with only `lo`
//! (default), or with `--netns` in the paper's testbed shape: the SFU in one
//! namespace host and each client in its own host, joined by veth to one
//! bridge (names carry the PID, removed afterwards).

use anyhow::Context;
use ringway_io::BackendKind;
use ringway_lab::sfulab::experiment::{run_grid, Placement, SfuLabConfig};
use ringway_lab::sfulab::{render, summarize, svg};
use ringway_server::sfu::Flush;
use std::path::PathBuf;

/// `ringway lab sfu` options.
#[derive(clap::Args, Debug, Clone)]
pub(crate) struct LabSfuArgs {
    /// Client counts.
    #[arg(long, default_value = "6,8,10", value_delimiter = ',')]
    pub clients: Vec<usize>,
    /// Packets per second sent by each client (3 streams: ASQ, VSQ, VHQ).
    #[arg(long, default_value = "750,1500", value_delimiter = ',')]
    pub pps: Vec<u32>,
    /// Backends to compare (the first `socket` is the baseline). `xdp`
    /// needs `--netns` (it attaches to the SFU host's veth).
    #[arg(long, default_value = "socket,mmsg", value_delimiter = ',')]
    pub backends: Vec<BackendKind>,
    /// Repetitions of every cell.
    #[arg(long, default_value_t = 3)]
    pub reps: usize,
    /// Seconds of load per run.
    #[arg(long, default_value_t = 5.0)]
    pub duration: f64,
    /// SFU send flush policy (`batch`: one send call per receive batch;
    /// `packet`: after each packet's copies).
    #[arg(long, default_value = "batch")]
    pub flush: Flush,
    /// Pin the SFU engine thread to these CPUs.
    #[arg(long)]
    pub cpus: Option<String>,
    /// Run the SFU and the load in separate namespace hosts joined by veth.
    #[arg(long)]
    pub netns: bool,
    /// Write runs and summary as JSON.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Write an SVG plot of delay versus copies per packet.
    #[arg(long)]
    pub svg: Option<PathBuf>,
}

fn experiment(a: LabSfuArgs, place: Placement) -> anyhow::Result<()> {
    let config = SfuLabConfig {
        clients: a.clients.clone(),
        pps: a.pps.clone(),
        backends: a.backends.clone(),
        reps: a.reps,
        duration_s: a.duration,
        flush: a.flush,
        cpus: match &a.cpus {
            Some(list) => Some(ringway_server::host::parse_cpu_list(list).context("--cpus")?),
            None => None,
        },
    };
    let total = a.reps * a.clients.len() * a.pps.len() * a.backends.len();
    println!(
        "ringway lab sfu: {total} runs of {:.0}s ({}), clients {:?}, pps/client {:?}, backends {:?}, flush {:?}",
        a.duration,
        if a.netns { "veth hosts" } else { "private netns, lo" },
        a.clients,
        a.pps,
        a.backends.iter().map(|b| b.name()).collect::<Vec<_>>(),
        a.flush
    );
    let (runs, failed) = run_grid(&place, &config, |r, (rep, n, pps, b)| match r {
        // One failed run (overloaded machine) must not lose the sweep.
        Err(e) => eprintln!("run rep={rep} clients={n} pps={pps} backend={b} failed: {e:#}"),
        Ok(r) => println!(
            "run rep={rep} clients={n} pps={pps} backend={b}: cpu user={:.1}% kern={:.1}% \
             delay p50={:.1}us p99={:.1}us kdelay p50={:.1}us copies={:.1} media={} \
             client_lost={}",
            r.cpu_user_pct,
            r.cpu_system_pct,
            r.delay_p50_us,
            r.delay_p99_us,
            r.kdelay_p50_us,
            r.copies_per_packet,
            r.media,
            r.client_lost
        ),
    });
    drop(place);
    anyhow::ensure!(!runs.is_empty(), "every run failed");
    if failed > 0 {
        println!("{failed} of {total} runs failed (see stderr); summary over the rest");
    }
    let s = summarize(&runs);
    print!("{}", render(&s));
    if let Some(p) = &a.json {
        let v = serde_json::json!({ "runs": runs, "summary": s });
        std::fs::write(p, serde_json::to_vec_pretty(&v)?)?;
    }
    if let Some(p) = &a.svg {
        std::fs::write(p, svg(&runs, &s))?;
    }
    Ok(())
}

/// Run `ringway lab sfu`.
pub(crate) fn run(a: LabSfuArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        a.reps >= 1 && !a.clients.is_empty() && !a.pps.is_empty() && !a.backends.is_empty(),
        "need at least one repetition, client count, rate and backend"
    );
    anyhow::ensure!(a.pps.iter().all(|&p| p > 0), "--pps must be positive");
    anyhow::ensure!(
        a.netns || !a.backends.contains(&BackendKind::Xdp),
        "the xdp backend needs --netns (it attaches to the SFU host's veth)"
    );
    if a.netns {
        let max = a.clients.iter().copied().max().unwrap_or(1);
        let place = Placement::hosts(max)?;
        return experiment(a, place);
    }
    ringway_io::netns::in_private_netns(move || experiment(a, Placement::Loopback))?
}
