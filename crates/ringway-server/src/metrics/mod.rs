//! Measurements the servers report: latency histograms and their summary
//! ([`LatencySummary`]), Prometheus text exposition ([`PromText`]) and a
//! tiny HTTP server for `GET /metrics` ([`http`]).

mod hist;
pub mod http;
mod process;
mod prom;

pub use hist::{
    compact_latency_histogram, latency_histogram, t975, LatencySummary, LATENCY_MAX_NS,
};
pub use process::process_metrics;
pub use prom::{PromText, BUCKETS_S};
