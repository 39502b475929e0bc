//! Forwarding mode and proxy configuration.

use serde::Serialize;
use std::net::SocketAddr;

/// Forwarding mode (`stateless` / `stateful` in configuration files).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// RFC 3261 16.11 stateless proxy.
    Stateless,
    /// Transaction-stateful proxy (100 Trying, retransmissions, CANCEL, 408).
    Stateful,
}

/// Proxy configuration.
#[derive(Clone, Debug)]
pub struct ProxyConfig {
    /// Stateless or stateful.
    pub mode: Mode,
    /// Our address as put in Via and Record-Route and used for loop
    /// detection. Must be a concrete address (not 0.0.0.0).
    pub local: SocketAddr,
    /// Default next hop for requests with no IP-literal target.
    pub route_to: Option<SocketAddr>,
    /// Act as registrar (REGISTER to our domain, location lookup).
    pub registrar: bool,
    /// Insert Record-Route into dialog-creating requests.
    pub record_route: bool,
    /// Bound on the transaction table (stateful mode).
    pub max_transactions: usize,
    /// Host names we are authoritative for (the local IP is always ours).
    pub domains: Vec<String>,
}

impl Default for ProxyConfig {
    fn default() -> Self {
        ProxyConfig {
            mode: Mode::Stateless,
            local: SocketAddr::from(([127, 0, 0, 1], 5060)),
            route_to: None,
            registrar: false,
            record_route: false,
            max_transactions: 65536,
            domains: Vec::new(),
        }
    }
}
