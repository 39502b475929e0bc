//! `ringway lab srpic-tcp`: SRPIC in front of a real TCP receiver, the
//! SRPIC paper's Section 4 with iperf3.
//!
//! ```text
//!  netns snd: iperf3 -c ─► tun0 (tbf at R) ══fd══► relay ══fd══► tun0 ─► netns rcv: TCP ─► iperf3 -s
//!                          ◄═══════════ reverse path (ACKs, counted) ◄═══════════
//! ```
//!
//! The relay ([`relay`]) is the paper's netem router and the receiver's
//! driver in one: forward delay `N(α, (β·α·k)²)` at the link rate `R`,
//! loss δ, the receiver's interrupt coalescing (the paper's receiver
//! scaled by `k` = 1 Gb/s ÷ R, fixed before the runs from eq. 1–3), SRPIC
//! on or off over the same blocks; the reverse path set separately. The
//! sender's profile ([`hosts::SenderProfile`]: S-Sender or A-Sender) and
//! SACK are sysctls of the sender's namespace. Per run: iperf3
//! throughput, retransmitted segments, duplicate ACKs and SACK blocks the
//! sender received (counted by the relay), `nstat` counters of both
//! namespaces, sender and receiver CPU. [`report`] prints the paper's
//! Tables 4–8 shapes and the block-size sweep (Fig. 2).
//!
//! The host variant, SRPIC as NFQUEUE verdict order (`ringway reorder
//! nfqueue`), is a server: `ringway_server::reorder::nfqueue`.

pub mod calibrate;
pub mod compare;
pub mod hosts;
pub mod recovery;
pub mod relay;
pub mod report;
pub mod wire;

use crate::impair::{scaled_receiver, CoalesceConfig, LossModel, PathConfig, RouterBatching};
use anyhow::Context;
use hosts::{Hosts, IperfResult, SenderProfile};
use relay::{run_tun_relay, Placement, RelayCore, RelayCoreConfig, RelayReport};
use ringway_reorder::SrpicConfig;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Which of the paper's experiments a run belongs to.
#[derive(
    Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
pub enum Table {
    /// Table 4: forward reordering (β varied), no loss, SACK off.
    T4,
    /// Table 5 (and Table 7's CPU): forward loss δ only, 1 stream, SACK on.
    T5,
    /// Table 6: forward reordering β = 0.4 % and loss δ, SACK on.
    T6,
    /// Table 8: reordering and loss on both paths, SACK on.
    T8,
    /// Fig. 2 / eq. 1–3: block sizes against the link rate, no impairment.
    Sweep,
}

impl Table {
    /// Parse "4", "5", "6", "7" (= 5), "8", "sweep".
    pub fn parse(s: &str) -> Option<Table> {
        match s.trim() {
            "4" => Some(Table::T4),
            "5" | "7" => Some(Table::T5),
            "6" => Some(Table::T6),
            "8" => Some(Table::T8),
            "sweep" | "fig2" => Some(Table::Sweep),
            _ => None,
        }
    }
}

/// One cell of the grid (run with SRPIC off and on, `reps` times).
#[derive(Copy, Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Cell {
    /// The experiment.
    pub table: Table,
    /// Sender profile.
    pub sender: SenderProfile,
    /// Parallel streams.
    pub streams: usize,
    /// Forward β (relative delay sd, unscaled; σ = β·α·k).
    pub beta: f64,
    /// Forward loss δ.
    pub delta: f64,
    /// Reverse β (0: fixed delay α).
    pub rev_beta: f64,
    /// Reverse loss.
    pub rev_delta: f64,
    /// SACK enabled.
    pub sack: bool,
    /// Link rate of this cell in Mb/s.
    pub rate_mbps: f64,
}

/// Settings of a grid.
#[derive(Clone, Debug, serde::Serialize)]
pub struct TcpLabConfig {
    /// Emulated link rate in Mb/s (what the machine carries); k = 1000 / rate.
    pub rate_mbps: f64,
    /// Mean one-way delay α in ms, both directions (not scaled).
    pub alpha_ms: f64,
    /// iperf3 seconds per run.
    pub duration_s: f64,
    /// Repetitions per cell and mode.
    pub reps: usize,
    /// SRPIC BlockSize.
    pub block: usize,
    /// SRPIC Ringbuffer_Size (and the receiver's ring).
    pub ring: usize,
    /// Seed of the first repetition (rep r uses seed + r, on and off alike).
    pub seed: u64,
    /// Experiments to run.
    pub tables: Vec<Table>,
    /// Table 4's β values (fractions).
    pub betas: Vec<f64>,
    /// Tables 5, 6, 8's δ values (fractions).
    pub deltas: Vec<f64>,
    /// Stream counts (Tables 4, 6).
    pub streams: Vec<usize>,
    /// Sender profiles.
    pub senders: Vec<SenderProfile>,
    /// Tables 6 and 8's β (fraction; the paper's 0.4 %).
    pub beta_loss: f64,
    /// Link rates of the block-size sweep, as fractions of `rate_mbps`.
    pub sweep: Vec<f64>,
    /// Runs whose relay delivered blocks later than this (p99, µs) are
    /// flagged and left out of the tables.
    pub max_late_us: f64,
    /// TCP timestamps in both namespaces (true: the kernel's default).
    pub timestamps: bool,
    /// Where SRPIC puts a segment sent after those it would overtake
    /// (Listing 1, the relay's oracle, or the TSval-gated departure).
    pub placements: Vec<Placement>,
    /// Scale α by k as well (α' = k·α on both paths, σ = β·α'): the
    /// paper's bandwidth-delay product (430 segments) and σ/RTT at the
    /// lab's rate. Off: α as given (σ is scaled by k either way).
    pub scale_alpha: bool,
    /// **Assumption** (not the paper's stated model): the emulator
    /// router's receive batching at the paper's 1 Gb/s scale (poll period
    /// and per-packet cost; scaled by k in the runs). `None`: off.
    pub router: Option<RouterBatching>,
    /// Run SRPIC off a second time in every block under the label
    /// `off#aa` (the A/A arm: its difference from `off` is the noise
    /// floor the SRPIC effect is judged against).
    pub aa: bool,
    /// A run collapsed when its throughput stayed below this share of the
    /// cell's link rate (%): the bistable N-SRPIC runs of Table 4.
    pub collapse_below_pct: f64,
}

/// The arm label of SRPIC off, the reference.
pub const OFF: &str = "off";
/// The arm label of SRPIC on with Listing 1's placement
/// ([`Placement::arm`] names the others).
pub const ON: &str = "on";

/// One run of the grid as planned: its cell, arm and place in its block.
#[derive(Copy, Clone, Debug, PartialEq)]
pub struct PlannedRun {
    /// The cell.
    pub cell: Cell,
    /// Arm label: [`OFF`], `off#aa` or SRPIC on with a placement
    /// ([`Placement::arm`]).
    pub arm: &'static str,
    /// Repetition (the relay's seed: every arm of a block has the same).
    pub rep: usize,
    /// Block: one (cell, repetition), every arm once.
    pub block: usize,
    /// Position in the block (0: first).
    pub order: usize,
}

impl PlannedRun {
    /// SRPIC's placement in this run (`None`: SRPIC off).
    pub fn srpic(&self) -> Option<Placement> {
        Placement::ALL.into_iter().find(|p| p.arm() == self.arm)
    }

    /// The key a finished run is found by in a state file.
    pub fn key(&self) -> String {
        run_key(&self.cell, self.arm, self.rep)
    }
}

/// The key of a run: cell, arm, repetition.
pub fn run_key(cell: &Cell, arm: &str, rep: usize) -> String {
    format!("{cell:?}/{arm}/{rep}")
}

/// The A/A arm's label.
pub const OFF_AA: &str = "off#aa";

impl TcpLabConfig {
    /// k = 1 Gb/s ÷ emulated rate.
    pub fn k(&self) -> f64 {
        1000.0 / self.rate_mbps
    }

    /// Mean one-way delay of the runs in ms: α, or k·α with `scale_alpha`.
    pub fn alpha_run_ms(&self) -> f64 {
        if self.scale_alpha {
            self.alpha_ms * self.k()
        } else {
            self.alpha_ms
        }
    }

    /// The router batching of the runs (time scaled by k), if modelled.
    pub fn router_scaled(&self) -> Option<RouterBatching> {
        self.router.map(|r| RouterBatching {
            poll_ns: (r.poll_ns as f64 * self.k()) as u64,
            per_packet_ns: (r.per_packet_ns as f64 * self.k()) as u64,
        })
    }

    /// The receiver model of every run (fixed before the runs).
    pub fn receiver(&self) -> CoalesceConfig {
        CoalesceConfig {
            ring: self.ring,
            ..scaled_receiver(self.k())
        }
    }

    /// The arms of a cell's blocks: SRPIC off (and its A/A copy) and on
    /// with each placement; the block-size sweep runs off only.
    pub fn arms(&self, cell: &Cell) -> Vec<&'static str> {
        let mut arms = vec![OFF];
        if cell.table == Table::Sweep {
            return arms;
        }
        if self.aa {
            arms.push(OFF_AA);
        }
        arms.extend(self.placements.iter().map(|p| p.arm()));
        arms
    }

    /// The arm of SRPIC on the paper-shaped tables show (the first
    /// placement's; the comparison shows every placement).
    pub fn primary_arm(&self) -> &'static str {
        self.placements.first().map_or(ON, |p| p.arm())
    }

    /// Every run, in order: per cell and repetition one block running
    /// every arm once, back to back, in the order
    /// [`crate::siplab::design::block_order`] draws from (seed, block):
    /// random but recorded and reproducible, so drifts fall on every arm
    /// alike and SRPIC on never always runs second.
    pub fn plan(&self) -> Vec<PlannedRun> {
        let mut runs = Vec::new();
        let mut block = 0;
        for cell in self.cells() {
            let arms = self.arms(&cell);
            for rep in 0..self.reps.max(1) {
                let order = crate::siplab::design::block_order(self.seed, block as u64, arms.len());
                for (position, &arm) in order.iter().enumerate() {
                    runs.push(PlannedRun {
                        cell,
                        arm: arms[arm],
                        rep,
                        block,
                        order: position,
                    });
                }
                block += 1;
            }
        }
        runs
    }

    /// What a state file of this grid must have been written with: every
    /// setting but the repetitions (more can be added later).
    pub fn fingerprint(&self) -> String {
        let mut settings = serde_json::to_value(self).unwrap_or_default();
        if let Some(map) = settings.as_object_mut() {
            map.remove("reps");
        }
        format!("lab srpic-tcp: {settings}")
    }

    /// Every cell of the grid, in run order.
    pub fn cells(&self) -> Vec<Cell> {
        let mut list = Vec::new();
        let base = Cell {
            table: Table::T4,
            sender: SenderProfile::S,
            streams: 1,
            beta: 0.0,
            delta: 0.0,
            rev_beta: 0.0,
            rev_delta: 0.0,
            sack: false,
            rate_mbps: self.rate_mbps,
        };
        for &t in &self.tables {
            for &sender in &self.senders {
                match t {
                    Table::T4 => {
                        for &streams in &self.streams {
                            for &beta in &self.betas {
                                list.push(Cell {
                                    table: t,
                                    sender,
                                    streams,
                                    beta,
                                    ..base
                                });
                            }
                        }
                    }
                    Table::T5 => {
                        for &delta in &self.deltas {
                            list.push(Cell {
                                table: t,
                                sender,
                                delta,
                                sack: true,
                                ..base
                            });
                        }
                    }
                    Table::T6 => {
                        for &streams in &self.streams {
                            for &delta in &self.deltas {
                                list.push(Cell {
                                    table: t,
                                    sender,
                                    streams,
                                    beta: self.beta_loss,
                                    delta,
                                    sack: true,
                                    ..base
                                });
                            }
                        }
                    }
                    Table::T8 => {
                        for &delta in &self.deltas {
                            list.push(Cell {
                                table: t,
                                sender,
                                beta: self.beta_loss,
                                delta,
                                rev_beta: self.beta_loss,
                                rev_delta: delta,
                                sack: true,
                                ..base
                            });
                        }
                    }
                    Table::Sweep => {}
                }
            }
            if t == Table::Sweep {
                for &f in &self.sweep {
                    list.push(Cell {
                        table: t,
                        sender: SenderProfile::A,
                        sack: true,
                        rate_mbps: self.rate_mbps * f,
                        ..base
                    });
                }
            }
        }
        list
    }

    /// The relay configuration of `cell` with SRPIC on with `placement`
    /// (`None`: off), repetition `rep`.
    pub fn relay(&self, cell: &Cell, placement: Option<Placement>, rep: usize) -> RelayCoreConfig {
        let on = placement.is_some();
        // σ = β·α·k either way; with `scale_alpha` the mean is k·α too.
        let sigma_per_beta = self.alpha_ms * 1e6 * self.k();
        let alpha = self.alpha_run_ms() * 1e6;
        let rate = (cell.rate_mbps * 1e6) as u64;
        let loss = |d: f64| {
            if d > 0.0 {
                LossModel::Uniform(d)
            } else {
                LossModel::None
            }
        };
        let seed = self.seed.wrapping_add(rep as u64).wrapping_mul(2);
        RelayCoreConfig {
            forward: PathConfig {
                rate_bps: rate,
                delay_ns: alpha as u64,
                sigma_ns: (cell.beta * sigma_per_beta) as u64,
                loss: loss(cell.delta),
                seed,
                // The router's buffer: 100 ms of link time (the sender's
                // tbf keeps it nearly empty).
                queue_ns: 100_000_000,
                max_packets: 200_000,
                router: self.router_scaled(),
            },
            reverse: PathConfig {
                rate_bps: rate,
                delay_ns: alpha as u64,
                sigma_ns: (cell.rev_beta * sigma_per_beta) as u64,
                loss: loss(cell.rev_delta),
                seed: seed + 1,
                queue_ns: 100_000_000,
                max_packets: 200_000,
                // ACKs cross the router the other way: a fixed delay as
                // the paper's reverse path (Table 8 adds β there).
                router: None,
            },
            receiver: self.receiver(),
            srpic: on.then_some(SrpicConfig {
                block_size: self.block,
                ring_size: self.ring,
                max_flows: 4096,
                idle_flushes: 64,
            }),
            max_flows: 4096,
            placement: placement.unwrap_or_default(),
        }
    }
}

/// What one run measured.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct RunResult {
    /// The cell.
    pub cell: Cell,
    /// SRPIC on.
    pub srpic: bool,
    /// Arm label: [`OFF`], `off#aa` (the A/A copy of off) or [`ON`].
    pub arm: String,
    /// Repetition.
    pub rep: usize,
    /// Block (one cell and repetition, every arm once).
    pub block: usize,
    /// Position of the run in its block (the randomised order, recorded).
    pub order: usize,
    /// iperf3's numbers.
    pub iperf: IperfResult,
    /// The relay's report.
    pub relay: RelayReport,
    /// `nstat` deltas in the sender namespace.
    pub sender_nstat: BTreeMap<String, u64>,
    /// The sender's recoveries and undos (from `sender_nstat`).
    pub recovery: recovery::Recovery,
    /// `nstat` deltas in the receiver namespace.
    pub receiver_nstat: BTreeMap<String, u64>,
    /// Sender CPU seconds: iperf3 client process + the sender kernel's ACK
    /// path run by the relay's writes.
    #[serde(deserialize_with = "crate::stats::nan_or_f64")]
    pub sender_cpu_s: f64,
    /// Receiver CPU seconds: iperf3 server process + the receiver's driver
    /// (sorting) and kernel receive path run by the relay's writes.
    #[serde(deserialize_with = "crate::stats::nan_or_f64")]
    pub receiver_cpu_s: f64,
    /// Left out of the tables, with the reason.
    pub flagged: Option<String>,
    /// The machine's 1-minute load average when the run started (NaN:
    /// unknown): background load, recorded per run.
    #[serde(deserialize_with = "crate::stats::nan_or_f64")]
    pub loadavg1: f64,
    /// Sysctls of the sender namespace.
    pub sender_sysctls: BTreeMap<String, String>,
}

impl RunResult {
    /// Count per Mb/s, normalised to a 50 s run (the paper's runs):
    /// `count · 50 s / duration / throughput`.
    pub fn per_mbps(&self, count: u64) -> f64 {
        if self.iperf.mbps <= 0.0 || self.iperf.seconds <= 0.0 {
            return f64::NAN;
        }
        count as f64 * 50.0 / self.iperf.seconds / self.iperf.mbps
    }

    /// Count per 50 s of run (the paper's run length): `count · 50 / duration`.
    pub fn per_50s(&self, count: u64) -> f64 {
        if self.iperf.seconds <= 0.0 {
            return f64::NAN;
        }
        count as f64 * 50.0 / self.iperf.seconds
    }

    /// The key of this run ([`PlannedRun::key`]).
    pub fn key(&self) -> String {
        run_key(&self.cell, &self.arm, self.rep)
    }

    /// The run collapsed: its throughput stayed below `below_pct` % of its
    /// cell's link rate.
    pub fn collapsed(&self, below_pct: f64) -> bool {
        self.iperf.mbps < below_pct / 100.0 * self.cell.rate_mbps
    }

    /// Retransmitted segments the sender's kernel counted (TcpRetransSegs).
    pub fn pkts_retrans(&self) -> u64 {
        *self.sender_nstat.get("TcpRetransSegs").unwrap_or(&0)
    }
}

/// Why a run is left out for its relay, if it is: no block delivered, the
/// blocks' or the ACKs' deliveries late past `max_late_us` at p99, one
/// stalled past 100 ms, or the emulated link's queue overflowed.
fn relay_flag(relay: &RelayReport, max_late_us: f64) -> Option<String> {
    let (_, late_p99, late_max) = relay.late_us;
    let ack_late_p99 = relay.ack_late_us.1;
    if late_p99.is_nan() {
        Some("no receive block was delivered".to_string())
    } else if late_p99 > max_late_us {
        Some(format!(
            "relay fell behind: block deliveries p99 {late_p99:.0} µs late (limit {max_late_us:.0})"
        ))
    } else if ack_late_p99 > max_late_us {
        Some(format!(
            "relay fell behind: ACK deliveries p99 {ack_late_p99:.0} µs late (limit {max_late_us:.0})"
        ))
    } else if late_max.max(relay.ack_late_us.2) > 100_000.0 {
        Some(format!(
            "relay stalled: a block or an ACK was delivered {:.0} ms late",
            late_max.max(relay.ack_late_us.2) / 1e3
        ))
    } else if relay.forward.queue_drops + relay.forward.overflow > 0 {
        Some("the emulated link queue overflowed".to_string())
    } else {
        None
    }
}

/// One run: fresh namespaces, the relay, iperf3; everything removed after.
pub fn run_once(c: &TcpLabConfig, planned: &PlannedRun) -> anyhow::Result<RunResult> {
    let (cell, placement, rep) = (&planned.cell, planned.srpic(), planned.rep);
    let loadavg1 = crate::siplab::background::loadavg1().unwrap_or(f64::NAN);
    let on = placement.is_some();
    let hosts = Hosts::create_with(
        (cell.rate_mbps * 1e6) as u64,
        cell.sender,
        cell.sack,
        c.timestamps,
    )?;
    let mut core = RelayCore::new(&c.relay(cell, placement, rep));
    let stop = Arc::new(AtomicBool::new(false));
    let limit = Duration::from_secs_f64(c.duration_s + 40.0);
    let (snd_before, rcv_before) = (
        hosts::nstat(hosts.sender())?,
        hosts::nstat(hosts.receiver())?,
    );
    let result = std::thread::scope(|s| -> anyhow::Result<(String, RelayReport)> {
        let relay = s.spawn(|| {
            run_tun_relay(
                &mut core,
                &hosts.sender_tun,
                &hosts.receiver_tun,
                &stop,
                limit,
            )
        });
        let client = (|| -> anyhow::Result<String> {
            let server = hosts::iperf3_server(hosts.receiver(), 5201)?;
            std::thread::sleep(Duration::from_millis(300));
            let client = hosts::iperf3_client(hosts.sender(), 5201, c.duration_s, cell.streams)?;
            let (out, _) = client.finish(Duration::from_secs_f64(c.duration_s + 30.0));
            let _ = server.finish(Duration::from_secs(3));
            Ok(out)
        })();
        // Let the last ACKs through, then stop the relay.
        std::thread::sleep(Duration::from_millis(100));
        stop.store(true, Ordering::Relaxed);
        let report = relay
            .join()
            .map_err(|_| anyhow::anyhow!("the relay thread panicked"))??;
        Ok((client?, report))
    });
    let (json, relay) = result?;
    let sender_nstat = hosts::delta(&snd_before, &hosts::nstat(hosts.sender())?);
    let receiver_nstat = hosts::delta(&rcv_before, &hosts::nstat(hosts.receiver())?);
    let sender_sysctls = hosts.sender_sysctls.clone();
    drop(hosts);
    let iperf = hosts::parse_iperf3(&json).with_context(|| {
        format!(
            "iperf3 run failed ({} s, {} streams)",
            c.duration_s, cell.streams
        )
    })?;
    if iperf.congestion != "cubic" {
        anyhow::bail!("iperf3 ran {:?}, not CUBIC", iperf.congestion);
    }
    let secs = iperf.seconds.max(c.duration_s);
    let sender_cpu_s = iperf.client_cpu_pct / 100.0 * secs + relay.sender_path_cpu_s;
    let receiver_cpu_s = iperf.server_cpu_pct / 100.0 * secs + relay.receiver_path_cpu_s;
    let flagged = relay_flag(&relay, c.max_late_us);
    Ok(RunResult {
        cell: *cell,
        srpic: on,
        arm: planned.arm.to_string(),
        rep,
        block: planned.block,
        order: planned.order,
        iperf,
        relay,
        recovery: recovery::Recovery::from_nstat(&sender_nstat),
        sender_nstat,
        receiver_nstat,
        sender_cpu_s,
        receiver_cpu_s,
        flagged,
        loadavg1,
        sender_sysctls,
    })
}

/// Every run of [`TcpLabConfig::plan`] but those `done` says are finished
/// (a resumed grid): `finished` gets each new run as it ends (to append it
/// to the state file), `progress` every outcome. Failed runs are reported
/// through `progress` and skipped. Returns the new runs and how many
/// failed.
pub fn run_grid(
    c: &TcpLabConfig,
    done: &dyn Fn(&PlannedRun) -> bool,
    mut finished: impl FnMut(&RunResult) -> anyhow::Result<()>,
    mut progress: impl FnMut(&PlannedRun, &anyhow::Result<RunResult>),
) -> anyhow::Result<(Vec<RunResult>, usize)> {
    let mut results = Vec::new();
    let mut failed = 0;
    for planned in c.plan() {
        if done(&planned) {
            continue;
        }
        let result = run_once(c, &planned);
        progress(&planned, &result);
        match result {
            Ok(result) => {
                finished(&result)?;
                results.push(result);
            }
            Err(_) => failed += 1,
        }
    }
    Ok((results, failed))
}
