//! ringway-lab: experiments and their reports (impairment, scheduler
//! profiles, models). The generators they drive are in `ringway-load`.

#![forbid(unsafe_code)]

pub mod checkpoint;
pub mod impair;
pub mod render;
pub mod sched;
pub mod sfulab;
pub mod siplab;
pub mod srpic_sfu;
pub mod srpic_tcp;
pub mod stats;
