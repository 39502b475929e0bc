//! `ringway reorder ...`: analyze captures with RFC 4737/5236 metrics before
//! and after SRPIC sorting, benchmark the sorter, and sort a host's own
//! TCP through NFQUEUE.

use anyhow::Context;
use ringway_reorder::analyze::{analyze, report, AnalyzeOpts, Trace};
use ringway_reorder::workload::synth;
use ringway_reorder::{SeqSpace, Srpic, SrpicConfig};
use std::hint::black_box;
use std::time::Instant;

/// `ringway reorder` subcommands.
#[derive(clap::Subcommand, Debug)]
pub(crate) enum ReorderCmd {
    /// Reordering metrics of a pcap/pcapng capture, per flow and overall,
    /// before and after SRPIC sorting (TCP and RTP-over-UDP flows).
    Analyze(AnalyzeArgs),
    /// ns/packet of the sorter alone (in order, mild, heavy reordering; 1 and 1000 flows).
    Bench(BenchArgs),
    /// SRPIC in front of this host's TCP: sort NFQUEUE packets and issue
    /// one verdict per packet in sorted order. Rule (fails open when
    /// ringway is not running):
    /// iptables -t raw -A PREROUTING -p tcp -j NFQUEUE --queue-num N --queue-bypass
    Nfqueue(NfqueueArgs),
}

/// Arguments of `ringway reorder nfqueue`.
#[derive(clap::Args, Debug)]
pub(crate) struct NfqueueArgs {
    /// Queue number (the rule's --queue-num).
    #[arg(long)]
    pub queue: u16,
    /// SRPIC BlockSize.
    #[arg(long, default_value_t = 32)]
    pub block: usize,
    /// SRPIC Ringbuffer_Size: most packets taken per drain and held at once.
    #[arg(long, default_value_t = 512)]
    pub ring: usize,
    /// Most flows sorted at once (further flows pass through, counted).
    #[arg(long, default_value_t = 4096)]
    pub max_flows: usize,
    /// After the first packet of a drain, keep taking packets for this many
    /// µs (an interrupt coalescing delay; 0: only what is already queued).
    #[arg(long, default_value_t = 0)]
    pub coalesce_us: u64,
    /// Do not sort (verdicts in arrival order; for comparison).
    #[arg(long)]
    pub no_sort: bool,
    /// Stop after this many seconds (default: at SIGINT/SIGTERM).
    #[arg(long)]
    pub duration: Option<f64>,
    /// Kernel-side queue length (beyond it packets are accepted unsorted).
    #[arg(long, default_value_t = 4096)]
    pub max_len: u32,
    /// Print the final report as JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

/// Arguments of `ringway reorder analyze`.
#[derive(clap::Args, Debug)]
pub(crate) struct AnalyzeArgs {
    /// Capture file (pcap or pcapng; Ethernet, Linux SLL/SLL2, raw IP, loopback).
    pub file: std::path::PathBuf,
    /// SRPIC block sizes to evaluate.
    #[arg(long, value_delimiter = ',', default_value = "1,5,10,32")]
    pub block: Vec<usize>,
    /// Receive-batch window: packets whose capture timestamps fall within
    /// this many microseconds of a batch's first packet form one batch.
    #[arg(long, default_value_t = 100.0)]
    pub batch_us: f64,
    /// Ring size (global flush threshold).
    #[arg(long, default_value_t = 1024)]
    pub ring: usize,
    /// RFC 5236 displacement threshold DT.
    #[arg(long, default_value_t = 64)]
    pub dt: u64,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// Arguments of `ringway reorder bench`.
#[derive(clap::Args, Debug)]
pub(crate) struct BenchArgs {
    /// Packets per run.
    #[arg(long, default_value_t = 2_000_000)]
    pub packets: usize,
    /// Runs per case (the median is reported).
    #[arg(long, default_value_t = 5)]
    pub reps: usize,
    /// Receive-batch size (flush all managers after this many packets).
    #[arg(long, default_value_t = 64)]
    pub batch: usize,
    /// Block size.
    #[arg(long, default_value_t = 32)]
    pub block: usize,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// Run a `ringway reorder` subcommand.
pub(crate) fn run(c: ReorderCmd) -> anyhow::Result<()> {
    match c {
        ReorderCmd::Analyze(a) => run_analyze(a),
        ReorderCmd::Bench(b) => run_bench(b),
        ReorderCmd::Nfqueue(n) => run_nfqueue(n),
    }
}

fn run_nfqueue(a: NfqueueArgs) -> anyhow::Result<()> {
    use ringway_server::reorder::nfqueue::{run, NfqSortConfig};
    let duration = match a.duration {
        Some(d) if d.is_finite() && d > 0.0 => Some(std::time::Duration::from_secs_f64(d)),
        Some(_) => anyhow::bail!("--duration must be positive"),
        None => None,
    };
    let cfg = NfqSortConfig {
        queue: a.queue,
        block: a.block.max(1),
        ring: a.ring.clamp(1, 65536),
        max_flows: a.max_flows,
        coalesce_us: a.coalesce_us.min(100_000),
        sort: !a.no_sort,
        duration,
        max_len: a.max_len.max(1),
    };
    let stop = ringway_server::host::stop_flag()?;
    let bound = || {
        eprintln!(
            "reorder nfqueue: queue {} bound (block {}, ring {}, coalesce {} us{})",
            cfg.queue,
            cfg.block,
            cfg.ring,
            cfg.coalesce_us,
            if cfg.sort { "" } else { ", not sorting" }
        )
    };
    let line = |r: &ringway_server::reorder::nfqueue::NfqSortReport| {
        format!(
            "packets {} batches {} held {} sorted {} passed {} (malformed {} not-tcp {} unsuitable {}) reordered before {:.4} after {:.4}",
            r.packets,
            r.batches,
            r.held,
            r.sorted,
            r.passed_through,
            r.malformed,
            r.not_tcp,
            r.unsuitable,
            r.before.ratio,
            r.after.ratio
        )
    };
    let rep = run(&cfg, &stop, bound, |r| eprintln!("{}", line(r)))
        .with_context(|| format!("NFQUEUE queue {}", cfg.queue))?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&rep)?);
    } else {
        println!("{}", line(&rep));
    }
    Ok(())
}

fn run_analyze(a: AnalyzeArgs) -> anyhow::Result<()> {
    let bytes = std::fs::read(&a.file).with_context(|| format!("reading {}", a.file.display()))?;
    let frames = ringway_reorder::pcap::parse(&bytes)
        .with_context(|| format!("parsing {}", a.file.display()))?;
    let trace = Trace::from_frames(&frames);
    if a.batch_us < 0.0 || !a.batch_us.is_finite() {
        anyhow::bail!("--batch-us must be a non-negative number");
    }
    let opts = AnalyzeOpts {
        blocks: a.block.clone(),
        batch_ns: (a.batch_us * 1000.0) as u64,
        ring_size: a.ring,
        dt: a.dt,
    };
    let v = analyze(&trace, &opts);
    if a.json {
        let m = |x: &(
            ringway_reorder::metrics::Rfc4737,
            ringway_reorder::metrics::Rfc5236,
        )| {
            serde_json::json!({
                "packets": x.0.received,
                "duplicates": x.0.duplicates,
                "reordered": x.0.reordered,
                "reordered_ratio": x.0.ratio(),
                "extent_mean": x.0.extent_mean(),
                "extent_max": x.0.extent_max(),
                "n3_ratio": x.0.n_ratio(3),
                "rd": x.1.rd().iter().map(|(k, v)| (k.to_string(), *v)).collect::<std::collections::BTreeMap<_, _>>(),
                "rd0": x.1.rd0(),
                "rbd": x.1.rbd().iter().map(|(k, v)| (k.to_string(), *v)).collect::<std::collections::BTreeMap<_, _>>(),
                "rbd_mean": x.1.rbd_mean(),
            })
        };
        let out = serde_json::json!({
            "file": a.file.display().to_string(),
            "packets": trace.recs.len(),
            "skipped_frames": trace.skipped,
            "batch_us": a.batch_us,
            "ring": a.ring,
            "dt": a.dt,
            "flows": trace.flows.iter().map(|f| f.name.clone()).collect::<Vec<_>>(),
            "variants": v.iter().map(|var| serde_json::json!({
                "order": match var.block { None => "capture".to_string(), Some(b) => format!("srpic_b{b}") },
                "total": m(&var.total),
                "per_flow": var.flows.iter().map(m).collect::<Vec<_>>(),
            })).collect::<Vec<_>>(),
        });
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        print!("{}", report(&trace, &opts, &v));
    }
    Ok(())
}

/// One bench case: label, flows, reorder probability, max displacement.
const CASES: &[(&str, usize, f64, usize)] = &[
    ("in order", 1, 0.0, 0),
    ("mild (5%, <=3)", 1, 0.05, 3),
    ("heavy (40%, <=16)", 1, 0.40, 16),
    ("in order", 1000, 0.0, 0),
    ("mild (5%, <=3)", 1000, 0.05, 3),
    ("heavy (40%, <=16)", 1000, 0.40, 16),
];

fn run_bench(b: BenchArgs) -> anyhow::Result<()> {
    let mut rows = Vec::new();
    for &(label, flows, p, d) in CASES {
        // For 1000 flows, reorder within a flow: displacement is counted in
        // packets of the interleaved stream, so scale it by the flow count.
        let classes = synth(flows, b.packets, p, d * flows, 42);
        let cfg = SrpicConfig {
            block_size: b.block,
            ring_size: 1024.max(b.batch),
            max_flows: flows.max(1024),
            idle_flushes: 64,
        };
        let mut samples = Vec::new();
        let mut stats = None;
        for _ in 0..b.reps.max(1) {
            // A fresh sorter per run (allocated before the clock starts).
            let mut s: Srpic<u32> = Srpic::new(cfg, SeqSpace::U16);
            let mut sink = 0u64;
            let t0 = Instant::now();
            for (ci, chunk) in classes.chunks(b.batch.max(1)).enumerate() {
                let base = (ci * b.batch) as u32;
                for (i, c) in chunk.iter().enumerate() {
                    s.push(*c, base + i as u32, &mut |x| {
                        sink = sink.wrapping_add(x as u64)
                    });
                }
                s.flush_all(&mut |x| sink = sink.wrapping_add(x as u64));
            }
            let el = t0.elapsed();
            black_box(sink);
            samples.push(el.as_nanos() as f64 / classes.len() as f64);
            stats = Some(s.stats());
        }
        samples.sort_by(|a, b| a.total_cmp(b));
        let st = stats.expect("at least one run");
        rows.push((label, flows, samples[samples.len() / 2], samples[0], st));
    }
    if b.json {
        let v: Vec<_> = rows
            .iter()
            .map(|(l, f, med, best, st)| {
                serde_json::json!({"case": l, "flows": f, "ns_per_packet_median": med,
                  "ns_per_packet_best": best, "to_prev": st.to_prev, "to_after": st.to_after,
                  "block_flushes": st.block_flushes})
            })
            .collect();
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    println!(
        "SRPIC sorter alone: {} packets/run, {} runs, batch {} (flush all after each), block {}, items u32",
        b.packets, b.reps, b.batch, b.block
    );
    println!(
        "{:<20} {:>6} {:>12} {:>10} {:>10} {:>10}",
        "case", "flows", "ns/pkt(med)", "best", "prev%", "after%"
    );
    for (l, f, med, best, st) in &rows {
        let n = st.packets.max(1) as f64;
        println!(
            "{:<20} {:>6} {:>12.1} {:>10.1} {:>10.2} {:>10.2}",
            l,
            f,
            med,
            best,
            100.0 * st.to_prev as f64 / n,
            100.0 * st.to_after as f64 / n
        );
    }
    Ok(())
}
