//! ringway-sip: a sans-IO SIP core.
//!
//! - [`msg`]: zero-copy parser ([`SipMsg`]) validating what a proxy needs.
//! - [`uri`]: SIP URI and name-addr views.
//! - [`edit`]: forwarding edits spliced from slices of the original datagram.
//! - [`proxy`]: stateless/stateful proxy core with registrar ([`Proxy`]).
//! - [`registrar`]: location store trait and bounded in-memory store.
//! - [`dispatch`]: a stateless dispatcher in front of several proxies
//!   (rendezvous hashing, OPTIONS probes, Path).
//!
//! Nothing here opens sockets, reads clocks or spawns threads: callers pass
//! `now` (monotonic nanoseconds) and datagrams, and receive datagrams to send.
//!
//! Driving a [`Proxy`] from an I/O loop: one `Arc<Proxy>` shared by all
//! worker threads, each holding its own [`ProxyWorker`] (scratch buffer and
//! counters) for its lifetime:
//!
//! ```
//! use ringway_sip::{Action, Mode, Proxy, ProxyConfig, ProxyWorker};
//! use std::net::SocketAddr;
//!
//! let proxy = Proxy::new(ProxyConfig {
//!     mode: Mode::Stateful,
//!     local: "192.0.2.10:5060".parse().unwrap(), // concrete address, not 0.0.0.0
//!     route_to: Some("192.0.2.20:5060".parse().unwrap()),
//!     ..ProxyConfig::default()
//! });
//! let invite = b"INVITE sip:bob@192.0.2.10 SIP/2.0\r\n\
//! Via: SIP/2.0/UDP 192.0.2.1:5060;branch=z9hG4bK1\r\n\
//! From: <sip:alice@example.com>;tag=1\r\nTo: <sip:bob@example.com>\r\n\
//! Call-ID: doc1\r\nCSeq: 1 INVITE\r\nMax-Forwards: 70\r\nContent-Length: 0\r\n\r\n";
//! let mut worker: ProxyWorker<'_> = proxy.worker(); // one per thread
//! let mut out: Vec<(SocketAddr, Vec<u8>)> = Vec::new();
//! let now = 0; // monotonic ns from the caller's clock
//! let o = worker.handle(now, "192.0.2.1:5060".parse().unwrap(), invite,
//!                       &mut |to, bytes| out.push((to, bytes.to_vec())));
//! assert_eq!(o.action, Action::Forwarded { copies: 1 });
//! assert_eq!(out.len(), 2); // 100 Trying upstream + the INVITE downstream
//! // Timers: sleep until next_deadline() (None: nothing pending), then call
//! // on_timer with the current time. Registrar expiry is included.
//! let t = proxy.next_deadline().unwrap();
//! worker.on_timer(t, &mut |to, bytes| out.push((to, bytes.to_vec())));
//! assert_eq!(out.len(), 3); // timer A retransmitted the INVITE
//! ```

#![forbid(unsafe_code)]

pub mod auth;
pub mod dispatch;
pub mod edit;
pub mod hash;
pub mod invariants;
pub mod msg;
pub mod overload;
pub mod overload_control;
pub mod peek;
pub mod proxy;
pub mod registrar;
pub mod relay;
mod text;
pub mod transport;
pub mod uri;

pub use edit::{
    build_response, forward_request, forward_response, EditError, RequestEdits, ViaEdit,
};
pub use msg::{HeaderKind, Method, ParseError, SipMsg, Via};
pub use proxy::{
    Action, AuthConfig, DropReason, FloodConfig, Mode, MsgLabel, Outcome, Proxy, ProxyConfig,
    ProxyStats, ProxyWorker, RegistrarPolicy, DEFAULT_MAX_PATH_BYTES,
    DEFAULT_MAX_TRANSACTION_BYTES,
};
pub use registrar::{Binding, LocationStore, MemoryStore, StoreError};
pub use relay::{Grant, RelayNets, RelayPolicy};
pub use transport::{FlowId, FlowState, Hop, Transport, TransportAddr};
pub use uri::{NameAddr, SipUri};
