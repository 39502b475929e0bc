//! ringway-sfu: the pktswitch Selective Forwarding Unit for networked music
//! performance, without I/O.
//!
//! - [`wire`]: zero-copy views and writers for RTP media packets (RFC 3550,
//!   send time in an RFC 8285 one-byte header extension) and the small binary
//!   control protocol (register, subscribe, keepalive, leave).
//! - [`core`]: the forwarding core. Callers feed datagrams with a `now`
//!   timestamp and get back where to send copies (or a control reply).
//! - [`admission`]: return-routability cookies (SipHash-2-4 keyed MAC,
//!   rotating secret) and per-prefix rate limits, without per-address state.
//! - [`jacktrip`]: JackTrip 1.7's packet header and a hub mixer (N−1 mix or
//!   plain forwarding) for JackTrip hub clients.
//! - [`token`]: signed join tokens (JWT, HMAC-SHA256): mint and verify.
//! - [`quality`]: per-stream reception statistics (RFC 3550 loss and
//!   interarrival jitter, reordering, late packets).
//! - [`recording`]: the SFU's recording files (one per source), their
//!   reader, and L16/L24 payloads to WAV through a payload-type map.
//! - [`client`]: client-side logic: RTP stream generation, control requests,
//!   per-stream sequence tracking (loss, reordering).
//!
//! The protocol is documented in `docs/pktswitch.md`.

#![forbid(unsafe_code)]

pub mod admission;
pub mod client;
pub mod core;
pub mod jacktrip;
pub mod quality;
pub mod recording;
pub mod token;
pub mod wire;

pub use crate::core::{
    Action, ClientInfo, DropReason, RoomError, RoomInfo, Sfu, SfuConfig, SfuStats, StreamInfo,
};
pub use wire::{Control, ControlError, MediaType, MsgType, RtpPacket, Selector, WireError};
