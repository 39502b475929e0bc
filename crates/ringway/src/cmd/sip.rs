//! `ringway sip ...`.

/// `ringway sip` subcommands.
#[derive(clap::Subcommand, Debug)]
pub(crate) enum SipCmd {
    /// Run the SIP proxy (stateless or stateful) and optional registrar.
    Proxy(Box<super::sip_proxy::ProxyArgs>),
    /// Stateless dispatcher in front of several proxies (rendezvous hashing, OPTIONS probes, Path).
    Dispatch(Box<super::sip_dispatch::DispatchArgs>),
    /// Generate SIP call load (UAC and UAS) through a proxy.
    Load(super::sip_load::LoadArgs),
    /// Open many idle TCP or TLS connections to a SIP server and report
    /// its memory per connection and CPU per connection set up.
    Idle(super::sip_idle::IdleArgs),
    /// Resolve a next hop as the proxy and dispatcher do (RFC 3263 NAPTR/SRV/A/AAAA),
    /// optionally many times to measure the lookup cost with a cold or a warm cache.
    Resolve(super::sip_resolve::ResolveArgs),
}

/// Run a `ringway sip` subcommand.
pub(crate) fn run(c: SipCmd) -> anyhow::Result<()> {
    match c {
        SipCmd::Proxy(a) => super::sip_proxy::run(*a),
        SipCmd::Dispatch(a) => super::sip_dispatch::run(*a),
        SipCmd::Load(a) => super::sip_load::run(a),
        SipCmd::Idle(a) => super::sip_idle::run(a),
        SipCmd::Resolve(a) => super::sip_resolve::run(a),
    }
}
