//! `ringway lab ...`.

/// `ringway lab` subcommands.
#[derive(clap::Subcommand, Debug)]
pub(crate) enum LabCmd {
    /// SIP capacity sweeps (rates × workers × repetitions) and the paper-shaped report.
    Sip(super::lab_sip::LabSipArgs),
    /// SFU experiments: clients × rates × backends, CPU and delay, model fits.
    Sfu(super::lab_sfu::LabSfuArgs),
    /// SRPIC in the SFU: reordering seen by subscribers with sorting on and off.
    Srpic(super::lab_srpic::LabSrpicArgs),
    /// SRPIC in front of a real TCP receiver: iperf3 through the TUN relay, Tables 4-8.
    SrpicTcp(super::lab_srpic_tcp::LabSrpicTcpArgs),
    /// UDP impairment relay: Normal delay, loss, coalescing (netem is not in this kernel).
    Impair(super::lab_impair::ImpairArgs),
}

/// Run a `ringway lab` subcommand.
pub(crate) fn run(c: LabCmd) -> anyhow::Result<()> {
    match c {
        LabCmd::Sip(a) => super::lab_sip::run(a),
        LabCmd::Sfu(a) => super::lab_sfu::run(a),
        LabCmd::Srpic(a) => super::lab_srpic::run(a),
        LabCmd::SrpicTcp(a) => super::lab_srpic_tcp::run(a),
        LabCmd::Impair(a) => super::lab_impair::run(a),
    }
}
