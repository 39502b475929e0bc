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

pub mod edit;
pub mod hash;
pub mod msg;
pub mod proxy;
pub mod registrar;
mod text;
pub mod uri;

pub use edit::{
    build_response, forward_request, forward_response, EditError, RequestEdits, ViaEdit,
};
pub use msg::{HeaderKind, Method, ParseError, SipMsg, Via};
pub use proxy::{Action, DropReason, Mode, MsgLabel, Outcome, Proxy, ProxyConfig, ProxyStats};
pub use registrar::{Binding, LocationStore, MemoryStore, StoreError};
pub use uri::{NameAddr, SipUri};
