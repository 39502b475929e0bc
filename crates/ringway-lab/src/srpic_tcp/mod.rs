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
#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
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
#[derive(Copy, Clone, Debug, PartialEq, serde::Serialize)]
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
    pub placement: Placement,
    /// Scale α by k as well (α' = k·α on both paths, σ = β·α'): the
    /// paper's bandwidth-delay product (430 segments) and σ/RTT at the
    /// lab's rate. Off: α as given (σ is scaled by k either way).
    pub scale_alpha: bool,
    /// **Assumption** (not the paper's stated model): the emulator
    /// router's receive batching at the paper's 1 Gb/s scale (poll period
    /// and per-packet cost; scaled by k in the runs). `None`: off.
    pub router: Option<RouterBatching>,
}

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

    /// The relay configuration of `cell` with SRPIC `on`, repetition `rep`.
    pub fn relay(&self, cell: &Cell, on: bool, rep: usize) -> RelayCoreConfig {
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
            placement: self.placement,
        }
    }
}

/// What one run measured.
#[derive(Clone, Debug, serde::Serialize)]
pub struct RunResult {
    /// The cell.
    pub cell: Cell,
    /// SRPIC on.
    pub srpic: bool,
    /// Repetition.
    pub rep: usize,
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
    pub sender_cpu_s: f64,
    /// Receiver CPU seconds: iperf3 server process + the receiver's driver
    /// (sorting) and kernel receive path run by the relay's writes.
    pub receiver_cpu_s: f64,
    /// Left out of the tables, with the reason.
    pub flagged: Option<String>,
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

    /// Retransmitted segments the sender's kernel counted (TcpRetransSegs).
    pub fn pkts_retrans(&self) -> u64 {
        *self.sender_nstat.get("TcpRetransSegs").unwrap_or(&0)
    }
}

/// One run: fresh namespaces, the relay, iperf3; everything removed after.
pub fn run_once(c: &TcpLabConfig, cell: &Cell, on: bool, rep: usize) -> anyhow::Result<RunResult> {
    let hosts = Hosts::create_with(
        (cell.rate_mbps * 1e6) as u64,
        cell.sender,
        cell.sack,
        c.timestamps,
    )?;
    let mut core = RelayCore::new(&c.relay(cell, on, rep));
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
    let (_, late_p99, late_max) = relay.late_us;
    let ack_late_p99 = relay.ack_late_us.1;
    let flagged = if late_p99.is_nan() {
        Some("no receive block was delivered".to_string())
    } else if late_p99 > c.max_late_us {
        Some(format!(
            "relay fell behind: block deliveries p99 {late_p99:.0} µs late (limit {:.0})",
            c.max_late_us
        ))
    } else if ack_late_p99 > c.max_late_us {
        Some(format!(
            "relay fell behind: ACK deliveries p99 {ack_late_p99:.0} µs late (limit {:.0})",
            c.max_late_us
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
    };
    Ok(RunResult {
        cell: *cell,
        srpic: on,
        rep,
        iperf,
        relay,
        recovery: recovery::Recovery::from_nstat(&sender_nstat),
        sender_nstat,
        receiver_nstat,
        sender_cpu_s,
        receiver_cpu_s,
        flagged,
        sender_sysctls,
    })
}

/// Run every cell `reps` times with SRPIC off then on (same seed), calling
/// `progress` after each run. Failed runs are reported through `progress`
/// as errors and skipped.
pub fn run_grid(
    c: &TcpLabConfig,
    mut progress: impl FnMut(&Cell, bool, usize, &anyhow::Result<RunResult>),
) -> Vec<RunResult> {
    let mut results = Vec::new();
    for cell in c.cells() {
        for rep in 0..c.reps.max(1) {
            let modes: &[bool] = if cell.table == Table::Sweep {
                &[false]
            } else {
                &[false, true]
            };
            for &on in modes {
                let result = run_once(c, &cell, on, rep);
                progress(&cell, on, rep, &result);
                if let Ok(result) = result {
                    results.push(result);
                }
            }
        }
    }
    results
}
