//! The transaction model: classes, client/server states, sharded tables.

#![allow(unused_imports)]
use super::*;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(super) enum Class {
    Invite,
    NonInvite,
    Cancel,
}

impl Class {
    pub(super) fn of(m: Method<'_>) -> Class {
        match m {
            Method::Invite | Method::Ack => Class::Invite,
            Method::Cancel => Class::Cancel,
            _ => Class::NonInvite,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum ClientState {
    /// Nothing sent downstream (answered locally).
    None,
    /// Waiting for any response.
    Calling,
    /// Provisional received.
    Proceeding,
    /// Final received (or timed out).
    Done,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum ServerState {
    /// No final response sent upstream yet.
    Proceeding,
    /// Final non-2xx sent (INVITE: waiting for ACK, timer G/H).
    Completed,
    /// 2xx forwarded (INVITE).
    Accepted,
    /// ACK received (INVITE), timer I.
    Confirmed,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Retrans {
    None,
    Downstream,
    Upstream,
}

pub(super) struct Tx {
    pub(super) class: Class,
    pub(super) upstream: Option<SocketAddr>,
    pub(super) downstream: Option<SocketAddr>,
    /// Request as forwarded downstream (for retransmission, CANCEL, ACK).
    pub(super) request: Vec<u8>,
    /// Last response sent upstream (for retransmission).
    pub(super) last_resp: Vec<u8>,
    pub(super) client: ClientState,
    pub(super) server: ServerState,
    pub(super) retrans: Retrans,
    pub(super) retrans_at: u64,
    pub(super) retrans_iv: u64,
    pub(super) timeout_at: u64,
    pub(super) expire_at: u64,
    pub(super) cancel_pending: bool,
    pub(super) cancelled: bool,
    pub(super) gen: u32,
}

impl Tx {
    pub(super) fn new(class: Class, upstream: Option<SocketAddr>) -> Tx {
        Tx {
            class,
            upstream,
            downstream: None,
            request: Vec::new(),
            last_resp: Vec::new(),
            client: ClientState::None,
            server: ServerState::Proceeding,
            retrans: Retrans::None,
            retrans_at: 0,
            retrans_iv: T1,
            timeout_at: 0,
            expire_at: 0,
            cancel_pending: false,
            cancelled: false,
            gen: 0,
        }
    }

    pub(super) fn deadline(&self) -> Option<u64> {
        let r = (self.retrans != Retrans::None).then_some(self.retrans_at);
        [r, nz(self.timeout_at), nz(self.expire_at)]
            .into_iter()
            .flatten()
            .min()
    }
}

pub(super) fn nz(v: u64) -> Option<u64> {
    (v != 0).then_some(v)
}

pub(super) type Key = (u64, Class);

#[derive(Default)]
pub(super) struct Shard {
    pub(super) txs: HashMap<Key, Tx>,
    pub(super) timers: BinaryHeap<Reverse<(u64, u64, Class, u32)>>,
}

impl Shard {
    pub(super) fn schedule(&mut self, key: Key) {
        if let Some(tx) = self.txs.get_mut(&key) {
            tx.gen = tx.gen.wrapping_add(1);
            if let Some(d) = tx.deadline() {
                self.timers.push(Reverse((d, key.0, key.1, tx.gen)));
            }
        }
    }
}

pub(super) const SHARDS: usize = 64;
