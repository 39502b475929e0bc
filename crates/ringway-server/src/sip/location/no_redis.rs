//! The Redis location store's place when ringway-server is built without
//! its `redis` feature: a type that cannot be made, so the SIP server keeps
//! one code path, and [`super::Location`]'s parser refuses `redis://` URLs at
//! configuration time with the reason.

use super::LocationCounters;
use ringway_sip::registrar::{LocationStore, Registration, StoreAnswer};
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

/// Why there is no Redis store in this build.
pub(super) const NOT_BUILT: &str =
    "this build has no Redis location store (cargo feature `redis` of ringway-server)";

/// Never constructed: [`RedisStore::new`] always fails in this build.
pub struct RedisStore(Infallible);

impl RedisStore {
    /// Fails: the `redis` feature is off.
    pub fn new(
        _url: &str,
        _timeout: Duration,
        _counters: Arc<LocationCounters>,
    ) -> Result<RedisStore, String> {
        Err(NOT_BUILT.to_string())
    }

    /// Unreachable (no value of this type exists).
    pub fn with_node(self, _node: u64) -> RedisStore {
        match self.0 {}
    }

    /// Unreachable (no value of this type exists).
    pub fn ping(&self) -> Result<(), String> {
        match self.0 {}
    }
}

impl LocationStore for RedisStore {
    fn register(&self, _registration: &Registration, _now: u64) -> StoreAnswer {
        match self.0 {}
    }

    fn lookup(&self, _aor: &str, _now: u64) -> StoreAnswer {
        match self.0 {}
    }

    fn expire(&self, _now: u64) -> usize {
        match self.0 {}
    }

    fn len(&self) -> Option<usize> {
        match self.0 {}
    }
}
