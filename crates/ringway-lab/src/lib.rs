//! ringway-lab: load generators, impairment, experiments, scheduler
//! profiles, models and reports.

pub mod impair;
pub mod sfulab;
pub mod srpiclab;
pub mod stats;
pub mod sched;
pub mod siplab;
pub mod sipload;
pub mod report;
