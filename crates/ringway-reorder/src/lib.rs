//! ringway-reorder: the SRPIC sorter ("Sorting Reordered Packets with
//! Interrupt Coalescing"), packet classifiers, RFC 4737 / RFC 5236
//! reordering metrics, and pcap/pcapng parsing from bytes. No I/O.
//!
//! Typical receive loop:
//! ```
//! use ringway_reorder::{classify_rtp, SeqSpace, Srpic, SrpicConfig};
//! let mut s: Srpic<Vec<u8>> = Srpic::new(SrpicConfig::default(), SeqSpace::U16);
//! let mut sent = Vec::new();
//! for pkt in [rtp(2), rtp(1), rtp(3)] {          // one receive batch
//!     s.push(classify_rtp(&pkt), pkt, &mut |p| sent.push(p));
//! }
//! s.flush_all(&mut |p| sent.push(p));             // end of batch
//! let seqs: Vec<u8> = sent.iter().map(|p| p[3]).collect();
//! assert_eq!(seqs, [1, 2, 3]);
//! # fn rtp(seq: u8) -> Vec<u8> { let mut p = vec![0u8; 12]; p[0] = 0x80; p[3] = seq; p }
//! ```
//! (The first packet, 2, starts the sorting block and sets NextExp to 3,
//! so 1 lands on PrevPacketList, which is flushed first.)

#![forbid(unsafe_code)]

pub mod analyze;
pub mod classify;
pub mod key;
pub mod metrics;
pub mod pcap;
pub mod reference;
pub mod seq;
pub mod sorter;
pub mod workload;

pub use classify::{classify_ipv4_tcp, classify_ipv6_tcp, classify_rtp, inspect_ip, Inspect};
pub use key::FlowKey;
pub use seq::{SeqSpace, Unwrapper};
pub use sorter::{Class, FlowSnapshot, Srpic, SrpicConfig, SrpicStats};
