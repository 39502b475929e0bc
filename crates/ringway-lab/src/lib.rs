//! ringway-lab: load generators, impairment, experiments, scheduler
//! profiles, models and reports.

pub mod impair;
pub mod stats;
pub mod sipload;
