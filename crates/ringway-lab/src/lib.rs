//! ringway-lab: load generators, impairment, experiments, scheduler
//! profiles, models and reports.

#![forbid(unsafe_code)]

pub mod impair;
pub mod report;
pub mod sched;
pub mod sfulab;
pub mod sfuload;
pub mod siplab;
pub mod sipload;
pub mod srpiclab;
pub mod srpictcp;
pub mod stats;
