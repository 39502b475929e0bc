//! The location store as the core reaches it: inline (a store that answers
//! at once, [`MemoryStore`](crate::registrar::MemoryStore)), or deferred to
//! the driver (a store that waits on a network, e.g. Redis).
//!
//! Deferred: where the core needs the store (a REGISTER to apply, a
//! binding to look up), it copies the datagram into a [`DeferredRequest`]
//! with its [`StoreQuery`] and hands it to the driver's [`StoreQueue`],
//! which must not block: a full queue refuses the request and the core
//! answers at once as if the store were down (`500` + `Retry-After` to a
//! REGISTER, `480` to a call), counted. The datagram's outcome is then
//! [`Action::Deferred`](super::Action::Deferred). The driver runs the
//! query on a thread of its own (bounded time) and calls
//! [`ProxyWorker::resume`] with the answer: the request is handled again
//! from the transaction match on (nothing counted twice), and the store
//! step takes the answer instead of asking.

use super::outcome::{DropReason, MsgLabel, Outcome};
use super::request_context::Request;
use super::stats::Counter;
use super::worker::ProxyWorker;
use crate::msg::SipMsg;
use crate::registrar::{LocationStore, StoreAnswer, StoreError, StoreQuery};
use crate::transport::Hop;
use std::net::SocketAddr;
use std::sync::Arc;

/// A request waiting for the location store.
#[derive(Clone, Debug)]
pub struct DeferredRequest {
    /// What the store is asked.
    pub query: StoreQuery,
    /// When the request was received (monotonic ns, the worker's clock).
    pub received: u64,
    /// Where it came from.
    pub src: Hop,
    /// The datagram (the request is parsed again on resumption).
    pub datagram: Vec<u8>,
}

/// The driver's queue is full: the request was not taken.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QueueFull;

/// The driver's queue of requests waiting for the store.
pub trait StoreQueue: Send + Sync {
    /// Take `request`, or refuse it when the queue is full. Must not block
    /// (it runs on a worker's datagram loop).
    fn submit(&self, request: DeferredRequest) -> Result<(), QueueFull>;
}

/// How the core reaches its location store.
pub(super) enum StoreAccess {
    /// Called on the worker (answers at once).
    Inline(Arc<dyn LocationStore>),
    /// Handed to the driver's queue.
    Deferred(Arc<dyn StoreQueue>),
}

/// The store step's result.
pub(super) enum StoreCall {
    /// The answer, now.
    Answered(StoreAnswer),
    /// Handed to the driver: the request is resumed later.
    Deferred,
}

impl ProxyWorker<'_> {
    /// Ask the store `query` for `request`: from the resumption's answer,
    /// inline, or by handing the request to the driver.
    pub(super) fn store_call(&mut self, request: &Request<'_>, query: StoreQuery) -> StoreCall {
        if let Some((asked, answer)) = self.resumed_answer.take() {
            // Resumed: never defer twice. The same datagram asks the same
            // question; anything else is answered as a store failure.
            return StoreCall::Answered(if asked == query {
                answer
            } else {
                Err(StoreError::Unavailable)
            });
        }
        if self.resuming {
            return StoreCall::Answered(Err(StoreError::Unavailable));
        }
        match &self.proxy().store {
            StoreAccess::Inline(store) => {
                StoreCall::Answered(query.run(store.as_ref(), request.now))
            }
            StoreAccess::Deferred(queue) => {
                let deferred = DeferredRequest {
                    query,
                    received: request.now,
                    src: request.from,
                    datagram: request.msg.datagram().to_vec(),
                };
                match queue.submit(deferred) {
                    Ok(()) => {
                        self.stripe.add(Counter::StoreDeferred);
                        StoreCall::Deferred
                    }
                    Err(_) => {
                        self.stripe.add(Counter::StoreQueueFull);
                        StoreCall::Answered(Err(StoreError::Unavailable))
                    }
                }
            }
        }
    }

    /// Finish a request the core deferred: `answer` is the store's answer
    /// to its query (or [`StoreError::Unavailable`] when the store could
    /// not answer in time), `now` the current time. Output goes to `out`
    /// as with [`ProxyWorker::handle`]; the outcome is the request's final
    /// one (a stateful retransmission that meanwhile matched a transaction
    /// is absorbed).
    pub fn resume(
        &mut self,
        request: &DeferredRequest,
        answer: StoreAnswer,
        now: u64,
        out: &mut dyn FnMut(SocketAddr, &[u8]),
    ) -> Outcome {
        self.resume_hops(request, answer, now, &mut |hop, bytes| out(hop.addr, bytes))
    }

    /// [`ProxyWorker::resume`] with the hop of every message sent.
    pub fn resume_hops(
        &mut self,
        request: &DeferredRequest,
        answer: StoreAnswer,
        now: u64,
        out: &mut dyn FnMut(Hop, &[u8]),
    ) -> Outcome {
        if request.query.is_removal() {
            // A removal of a failed flow's bindings: no request waits for
            // it (a driver runs it and need not resume it at all).
            return Outcome {
                label: MsgLabel::Response(430),
                action: super::outcome::Action::Absorbed,
            };
        }
        self.resumed_answer = Some((request.query.clone(), answer));
        self.resuming = true;
        let outcome = match SipMsg::parse(&request.datagram) {
            Ok(msg) if msg.is_request() => self.request_outcome(now, request.src, &msg, out),
            // It parsed when it was received: only a driver bug gets here.
            _ => Outcome {
                label: MsgLabel::Malformed,
                action: self.drop_datagram(DropReason::MalformedRequest),
            },
        };
        self.resumed_answer = None;
        self.resuming = false;
        outcome
    }
}
