//! ringway-sip: a sans-IO SIP core.
//!
//! - [`msg`]: zero-copy parser ([`SipMsg`]) validating what a proxy needs.
//! - [`uri`]: SIP URI and name-addr views.
//! - [`edit`]: forwarding edits spliced from slices of the original datagram.
//! - [`proxy`]: stateless/stateful proxy core with registrar ([`Proxy`]).
//! - [`registrar`]: location store trait and bounded in-memory store.
//!
//! Nothing here opens sockets, reads clocks or spawns threads: callers pass
//! `now` (monotonic nanoseconds) and datagrams, and receive datagrams to send.

pub mod msg;
mod text;
pub mod uri;

pub use msg::{HeaderKind, Method, ParseError, SipMsg, Via};
pub use uri::{NameAddr, SipUri};
