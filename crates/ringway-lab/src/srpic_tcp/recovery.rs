//! The sender's loss recovery and undo, from the kernel's own counters
//! (`nstat` deltas read inside the sender's namespace before and after a
//! run): how many window reductions reordering caused and how many the
//! kernel took back. With SACK off a spurious fast retransmit is a Reno
//! recovery; with TCP timestamps on, Eifel undo (`TCPFullUndo`,
//! `TCPPartialUndo`) takes most of them back, with SACK on DSACK undo
//! does. What is left ([`Recovery::kept`]) is what costs throughput.

use std::collections::BTreeMap;

/// Recovery and undo counts of one run (the sender's `TcpExt` counters).
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Recovery {
    /// Fast recoveries entered without SACK (`TCPRenoRecovery`).
    pub reno_recovery: u64,
    /// Fast recoveries entered with SACK (`TCPSackRecovery`).
    pub sack_recovery: u64,
    /// Fast retransmissions (`TCPFastRetrans`).
    pub fast_retrans: u64,
    /// Recoveries undone in full: timestamps showed every retransmission
    /// was unneeded (`TCPFullUndo`).
    pub full_undo: u64,
    /// Recoveries undone in part (`TCPPartialUndo`).
    pub partial_undo: u64,
    /// Recoveries undone by DSACKs (`TCPDSACKUndo`).
    pub dsack_undo: u64,
    /// Timeouts undone (`TCPLossUndo`).
    pub loss_undo: u64,
    /// Timeouts found spurious by F-RTO (`TCPSpuriousRTOs`).
    pub spurious_rtos: u64,
    /// Retransmission timeouts (`TCPTimeouts`).
    pub timeouts: u64,
    /// Reordering detected with Reno (`TCPRenoReorder`) plus with
    /// timestamps (`TCPTSReorder`) and SACK (`TCPSACKReorder`).
    pub reorder_detected: u64,
}

/// The field of [`Recovery`] a counter adds to.
type Field = fn(&mut Recovery) -> &mut u64;

/// The nstat names read, with their fields.
const FIELDS: &[(&str, Field)] = &[
    ("TcpExtTCPRenoRecovery", |r| &mut r.reno_recovery),
    ("TcpExtTCPSackRecovery", |r| &mut r.sack_recovery),
    ("TcpExtTCPFastRetrans", |r| &mut r.fast_retrans),
    ("TcpExtTCPFullUndo", |r| &mut r.full_undo),
    ("TcpExtTCPPartialUndo", |r| &mut r.partial_undo),
    ("TcpExtTCPDSACKUndo", |r| &mut r.dsack_undo),
    ("TcpExtTCPLossUndo", |r| &mut r.loss_undo),
    ("TcpExtTCPSpuriousRTOs", |r| &mut r.spurious_rtos),
    ("TcpExtTCPTimeouts", |r| &mut r.timeouts),
    ("TcpExtTCPRenoReorder", |r| &mut r.reorder_detected),
    ("TcpExtTCPTSReorder", |r| &mut r.reorder_detected),
    ("TcpExtTCPSACKReorder", |r| &mut r.reorder_detected),
];

impl Recovery {
    /// The counts in `nstat` deltas (a counter the kernel did not report
    /// reads 0: nstat -z reports every counter, so that means none).
    pub fn from_nstat(delta: &BTreeMap<String, u64>) -> Recovery {
        let mut r = Recovery::default();
        for (name, field) in FIELDS {
            *field(&mut r) += delta.get(*name).copied().unwrap_or(0);
        }
        r
    }

    /// Fast recoveries entered, with or without SACK.
    pub fn recoveries(&self) -> u64 {
        self.reno_recovery + self.sack_recovery
    }

    /// Undone recoveries (in full, in part, by DSACK).
    pub fn undone(&self) -> u64 {
        self.full_undo + self.partial_undo + self.dsack_undo
    }

    /// Recoveries whose window reduction stayed: entered minus undone
    /// (0 when more undos than recoveries were counted in the run, as an
    /// undo can complete after the run's last recovery began).
    pub fn kept(&self) -> u64 {
        self.recoveries().saturating_sub(self.undone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recovery_columns_from_known_nstat_deltas() {
        let delta: BTreeMap<String, u64> = [
            ("TcpExtTCPRenoRecovery", 40),
            ("TcpExtTCPSackRecovery", 2),
            ("TcpExtTCPFastRetrans", 45),
            ("TcpExtTCPFullUndo", 25),
            ("TcpExtTCPPartialUndo", 3),
            ("TcpExtTCPDSACKUndo", 1),
            ("TcpExtTCPLossUndo", 4),
            ("TcpExtTCPSpuriousRTOs", 5),
            ("TcpExtTCPTimeouts", 6),
            ("TcpExtTCPRenoReorder", 7),
            ("TcpExtTCPTSReorder", 8),
            ("TcpExtTCPSACKReorder", 9),
            ("TcpRetransSegs", 1000),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        let r = Recovery::from_nstat(&delta);
        assert_eq!(
            r,
            Recovery {
                reno_recovery: 40,
                sack_recovery: 2,
                fast_retrans: 45,
                full_undo: 25,
                partial_undo: 3,
                dsack_undo: 1,
                loss_undo: 4,
                spurious_rtos: 5,
                timeouts: 6,
                reorder_detected: 24,
            }
        );
        assert_eq!((r.recoveries(), r.undone(), r.kept()), (42, 29, 13));
        // More undos than recoveries in a run: none kept, never negative.
        let over = Recovery {
            reno_recovery: 1,
            full_undo: 2,
            ..Default::default()
        };
        assert_eq!(over.kept(), 0);
        assert_eq!(Recovery::from_nstat(&BTreeMap::new()), Recovery::default());
    }
}
