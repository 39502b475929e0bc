//! `ringway reorder ...`: analyze captures with RFC 4737/5236 metrics before
//! and after SRPIC sorting, benchmark the sorter, and sort a host's own
//! TCP through NFQUEUE.

use anyhow::Context;
use ringway_io::thread::thread_cpu_total;
use ringway_reorder::analyze::{analyze, report, AnalyzeOpts, Trace};
use ringway_reorder::reference::ReferenceSrpic;
use ringway_reorder::workload::{synth_stream, SynthStream};
use ringway_reorder::{Class, SeqSpace, Srpic, SrpicConfig, SrpicStats};
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
    /// Which sorters to run: `fast` (ringway's), `reference` (Listing 1
    /// with linked lists, the sorter before issue 23) or both,
    /// alternating run by run on the same input.
    #[arg(long, value_enum, default_value_t = BenchSorters::Both)]
    pub sorter: BenchSorters,
    /// Only these cases (0-5, the table's rows; default all).
    #[arg(long, value_delimiter = ',')]
    pub case: Vec<usize>,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// Sorters `ringway reorder bench` runs.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum BenchSorters {
    /// `ringway_reorder::Srpic`.
    Fast,
    /// `ringway_reorder::reference::ReferenceSrpic`.
    Reference,
    /// Both, alternating.
    Both,
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
    let variants = analyze(&trace, &opts);
    if a.json {
        let metrics_of = |x: &(
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
                "rd": x.1.rd().iter().map(|(k, variants)| (k.to_string(), *variants)).collect::<std::collections::BTreeMap<_, _>>(),
                "rd0": x.1.rd0(),
                "rbd": x.1.rbd().iter().map(|(k, variants)| (k.to_string(), *variants)).collect::<std::collections::BTreeMap<_, _>>(),
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
            "variants": variants.iter().map(|var| serde_json::json!({
                "order": match var.block { None => "capture".to_string(), Some(b) => format!("srpic_b{b}") },
                "total": metrics_of(&var.total),
                "per_flow": var.flows.iter().map(metrics_of).collect::<Vec<_>>(),
            })).collect::<Vec<_>>(),
        });
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        print!("{}", report(&trace, &opts, &variants));
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

/// What `ringway reorder bench` drives: the fast sorter and the reference.
trait BenchSorter {
    fn push(&mut self, class: Class, item: u32, out: &mut impl FnMut(u32));
    fn flush_all(&mut self, out: &mut impl FnMut(u32));
    fn stats(&self) -> SrpicStats;
}

impl BenchSorter for Srpic<u32> {
    #[inline]
    fn push(&mut self, class: Class, item: u32, out: &mut impl FnMut(u32)) {
        Srpic::push(self, class, item, out)
    }
    fn flush_all(&mut self, out: &mut impl FnMut(u32)) {
        Srpic::flush_all(self, out)
    }
    fn stats(&self) -> SrpicStats {
        Srpic::stats(self)
    }
}

impl BenchSorter for ReferenceSrpic<u32> {
    #[inline]
    fn push(&mut self, class: Class, item: u32, out: &mut impl FnMut(u32)) {
        ReferenceSrpic::push(self, class, item, out)
    }
    fn flush_all(&mut self, out: &mut impl FnMut(u32)) {
        ReferenceSrpic::flush_all(self, out)
    }
    fn stats(&self) -> SrpicStats {
        ReferenceSrpic::stats(self)
    }
}

/// One timed run: every packet of `stream` in receive batches of `batch`,
/// `flush_all` after each; items are the packets' indices. Not inlined, so
/// that `valgrind --tool=callgrind --toggle-collect='*bench_run*'` counts
/// exactly this loop.
#[inline(never)]
fn bench_run<S: BenchSorter>(s: &mut S, stream: &SynthStream, batch: usize) -> u64 {
    let mut sink = 0u64;
    let count = stream.packets.len();
    let mut offset = 0;
    while offset < count {
        let end = (offset + batch).min(count);
        for i in offset..end {
            s.push(stream.class(i), i as u32, &mut |x| {
                sink = sink.wrapping_add(x as u64)
            });
        }
        s.flush_all(&mut |x| sink = sink.wrapping_add(x as u64));
        offset = end;
    }
    sink
}

/// ns/packet of `reps` runs, wall clock and the thread's CPU time (which
/// leaves out the time the thread waited for a CPU on a shared machine),
/// and the last run's counters.
#[derive(Default)]
struct BenchResult {
    wall: Vec<f64>,
    cpu: Vec<f64>,
    stats: SrpicStats,
}

fn median(v: &[f64]) -> Option<f64> {
    let mut v = v.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    v.get(v.len() / 2).copied()
}

impl BenchResult {
    fn time<S: BenchSorter>(&mut self, mut s: S, stream: &SynthStream, batch: usize) {
        let count = stream.packets.len().max(1) as f64;
        let (started, cpu_start) = (Instant::now(), thread_cpu_total());
        black_box(bench_run(&mut s, stream, batch));
        let (elapsed, cpu) = (started.elapsed(), thread_cpu_total() - cpu_start);
        self.wall.push(elapsed.as_nanos() as f64 / count);
        self.cpu.push(cpu.as_nanos() as f64 / count);
        self.stats = s.stats();
    }
    fn median(&self) -> Option<f64> {
        median(&self.wall)
    }
    fn best(&self) -> Option<f64> {
        self.wall.iter().copied().reduce(f64::min)
    }
    fn cpu_median(&self) -> Option<f64> {
        median(&self.cpu)
    }
}

/// One case's results: its label, flows, and the reference and the fast
/// sorter's timings.
type BenchRow = (&'static str, usize, BenchResult, BenchResult);

/// The counters of a case (the fast sorter's, or the reference's when
/// only it ran).
fn counters(r: &BenchRow) -> SrpicStats {
    if r.3.wall.is_empty() {
        r.2.stats
    } else {
        r.3.stats
    }
}

/// `ringway reorder bench`: every case (or those of `--case`) timed, then
/// printed as a table or JSON.
fn run_bench(b: BenchArgs) -> anyhow::Result<()> {
    let mut rows = Vec::new();
    for (ci, &(label, flows, p, d)) in CASES.iter().enumerate() {
        if !b.case.is_empty() && !b.case.contains(&ci) {
            continue;
        }
        let (reference, fast) = bench_case(&b, ci, (flows, p, d))?;
        rows.push((label, flows, reference, fast));
    }
    if b.json {
        print_bench_json(&rows)
    } else {
        print_bench_table(&b, &rows);
        Ok(())
    }
}

/// Case `ci` (`flows` flows, a share `p` of the packets displaced by up
/// to `d`): the reference and the fast sorter timed `--reps` times each,
/// alternating; both must count the same.
fn bench_case(
    b: &BenchArgs,
    ci: usize,
    (flows, p, d): (usize, f64, usize),
) -> anyhow::Result<(BenchResult, BenchResult)> {
    let batch = b.batch.max(1);
    let run_fast = b.sorter != BenchSorters::Reference;
    let run_reference = b.sorter != BenchSorters::Fast;
    // For 1000 flows, reorder within a flow: displacement is counted in
    // packets of the interleaved stream, so scale it by the flow count.
    let stream = synth_stream(flows, b.packets, p, d * flows, 42);
    let cfg = SrpicConfig {
        block_size: b.block,
        ring_size: 1024.max(batch),
        max_flows: flows.max(1024),
        idle_flushes: 64,
    };
    let (mut fast, mut reference) = (BenchResult::default(), BenchResult::default());
    for _ in 0..b.reps.max(1) {
        // A fresh sorter per run (allocated before the clock starts),
        // the two sorters alternating so that both see the same load.
        if run_reference {
            reference.time(
                ReferenceSrpic::<u32>::new(cfg, SeqSpace::U16),
                &stream,
                batch,
            );
        }
        if run_fast {
            fast.time(Srpic::<u32>::new(cfg, SeqSpace::U16), &stream, batch);
        }
    }
    if run_fast && run_reference {
        anyhow::ensure!(
            fast.stats == reference.stats,
            "the sorters' counters differ in case {ci}: {:?} vs {:?}",
            fast.stats,
            reference.stats
        );
    }
    Ok((reference, fast))
}

/// `--json`: one object per case.
fn print_bench_json(rows: &[BenchRow]) -> anyhow::Result<()> {
    let rows_json: Vec<_> = rows
        .iter()
        .map(|r| {
            let stats = counters(r);
            serde_json::json!({"case": r.0, "flows": r.1,
              "fast_ns_per_packet_median": r.3.median(), "fast_ns_per_packet_best": r.3.best(),
              "fast_cpu_ns_per_packet_median": r.3.cpu_median(),
              "reference_ns_per_packet_median": r.2.median(),
              "reference_ns_per_packet_best": r.2.best(),
              "reference_cpu_ns_per_packet_median": r.2.cpu_median(),
              "to_prev": stats.to_prev, "to_after": stats.to_after,
              "block_flushes": stats.block_flushes})
        })
        .collect();
    println!("{}", serde_json::to_string_pretty(&rows_json)?);
    Ok(())
}

/// The table: what was run, then a line per case.
fn print_bench_table(b: &BenchArgs, rows: &[BenchRow]) {
    println!(
        "SRPIC sorter alone: {} packets/run, {} runs per sorter (alternating), batch {} (flush all after each), block {}, items u32",
        b.packets,
        b.reps,
        b.batch.max(1),
        b.block
    );
    println!(
        "input per packet: (flow, seq); the flow's key is copied into a Class at push time. \
         reference = Listing 1 with linked lists (before issue 23), fast = ringway_reorder::Srpic"
    );
    println!(
        "ns/packet: wall clock (median, best of the runs) and the thread's CPU time (median); \
         cpu f/r = fast / reference CPU time"
    );
    println!(
        "{:<20} {:>6} {:>9} {:>7} {:>7} {:>9} {:>7} {:>7} {:>9} {:>7} {:>7}",
        "case",
        "flows",
        "ref wall",
        "best",
        "cpu",
        "fast wall",
        "best",
        "cpu",
        "cpu f/r",
        "prev%",
        "after%"
    );
    let num =
        |x: Option<f64>| x.map_or_else(|| "n/a".to_string(), |rows_json| format!("{rows_json:.1}"));
    for r in rows {
        let stats = counters(r);
        let packets = stats.packets.max(1) as f64;
        let ratio = match (r.3.cpu_median(), r.2.cpu_median()) {
            (Some(f), Some(rf)) => format!("{:.2}", f / rf),
            _ => "n/a".to_string(),
        };
        println!(
            "{:<20} {:>6} {:>9} {:>7} {:>7} {:>9} {:>7} {:>7} {:>9} {:>7.2} {:>7.2}",
            r.0,
            r.1,
            num(r.2.median()),
            num(r.2.best()),
            num(r.2.cpu_median()),
            num(r.3.median()),
            num(r.3.best()),
            num(r.3.cpu_median()),
            ratio,
            100.0 * stats.to_prev as f64 / packets,
            100.0 * stats.to_after as f64 / packets
        );
    }
}
