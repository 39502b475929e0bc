//! SRPIC drivers outside the SFU: [`nfqueue`] runs the sorter in front of
//! the host's own TCP stack (`ringway reorder nfqueue`), issuing NFQUEUE
//! verdicts in the sorter's output order. (The SFU's SRPIC runs inside its
//! engine, [`crate::sfu`].)

pub mod nfqueue;
