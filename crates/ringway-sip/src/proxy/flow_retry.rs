//! A registrar acting on a `430 Flow Failed` it receives (RFC 5626 7):
//! a request for an AOR went to a binding registered through an edge
//! proxy's Path, and the edge answered that the flow its Path token names
//! is gone. The bindings registered through that Path are removed from the
//! location store (in memory at once; a shared store such as Redis through
//! the driver's store queue, never on the worker), and the request moves
//! on to the AOR's next binding, if one is left, as a new client
//! transaction (our branch with the next `.<try>`, as an RFC 3263 failover
//! does). With none left, the `430` goes upstream as before.
//!
//! Sequential, as the proxy's RFC 3263 failover: one binding at a time, the
//! most recently refreshed first, at most [`super::MAX_TRIES`] in all. Only
//! a `430` moves on (RFC 5626 7: any other final response means the
//! instance answered), and only while nothing went upstream but a
//! provisional-free wait (no provisional received, not cancelled).
//!
//! The request to the next binding is the one forwarded to the failed
//! binding with its Request-URI and its Path's Route values replaced: our
//! Via, Record-Route and Max-Forwards stay. So only a binding reached over
//! the same transport as the failed one is tried (our Via names it), and
//! not one reached over its own registered flow (our Record-Route towards
//! that would carry the flow's token); such a binding gets the next
//! request instead, the failed Path's bindings being gone by then.

use super::branch::set_try;
use super::deferred::{DeferredRequest, StoreAccess};
use super::routing::Target;
use super::stats::Counter;
use super::transaction::{Class, ServerState, Transaction};
use super::worker::ProxyWorker;
use crate::edit::{forward_request, RequestEdits};
use crate::msg::SipMsg;
use crate::registrar::{Binding, StoreQuery};
use crate::transport::Hop;

/// The bindings a request to an AOR may move on to after a `430`, kept
/// with its transaction.
pub(super) struct FlowRetry {
    /// The AOR.
    aor: String,
    /// The Path of the binding the request went to last (its Route values
    /// are on top of the forwarded request).
    path: Vec<String>,
    /// The AOR's other bindings not tried yet, most recently refreshed
    /// first.
    rest: Vec<Binding>,
}

impl FlowRetry {
    /// What a request to `aor` through `bindings` (the store's answer, the
    /// one it goes to first) may move on to: `None` unless the first
    /// binding was registered through a Path (only an edge proxy on a Path
    /// answers `430` for a flow).
    pub(super) fn of(aor: &str, bindings: &[Binding]) -> Option<FlowRetry> {
        let (first, rest) = bindings.split_first()?;
        if first.path.is_empty() {
            return None;
        }
        Some(FlowRetry {
            aor: aor.to_owned(),
            path: first.path.clone(),
            rest: rest
                .iter()
                .take(super::MAX_TRIES.saturating_sub(1))
                .cloned()
                .collect(),
        })
    }

    /// Bytes it holds (counted in its transaction's footprint).
    pub(super) fn bytes(&self) -> usize {
        let strings = |path: &[String]| {
            path.iter()
                .map(|p| p.len() + std::mem::size_of::<String>())
                .sum::<usize>()
        };
        std::mem::size_of::<FlowRetry>()
            + self.aor.len()
            + strings(&self.path)
            + self
                .rest
                .iter()
                .map(|b| {
                    std::mem::size_of::<Binding>()
                        + b.contact.len()
                        + b.call_id.len()
                        + strings(&b.path)
                })
                .sum::<usize>()
    }
}

impl ProxyWorker<'_> {
    /// A `430 Flow Failed` answered `transaction`'s request (current try,
    /// already ACKed for an INVITE): if the request went to a binding
    /// through a Path, that Path's bindings are removed and the request
    /// moves on to the next binding. Returns where it went (`None`: the
    /// `430` goes upstream).
    pub(super) fn on_flow_failed(
        &mut self,
        now: u64,
        transaction: &mut Transaction,
    ) -> Option<Hop> {
        let failover = transaction.failover.as_mut()?;
        let retry = failover.flows.as_mut()?;
        self.stripe.add(Counter::FlowFailuresReceived);
        self.remove_path(now, &retry.aor, &retry.path, transaction.downstream);
        let may_move_on = transaction.class != Class::Cancel
            && transaction.server == ServerState::Proceeding
            && !transaction.cancelled
            && !transaction.cancel_pending;
        if !may_move_on {
            return None;
        }
        let downstream = transaction.downstream?;
        let proxy = self.proxy();
        while !retry.rest.is_empty() {
            let binding = retry.rest.remove(0);
            if binding.path == retry.path {
                // The same flow: removed with it.
                continue;
            }
            let path = binding.path.clone();
            let Target::Send {
                to,
                grant,
                request_uri: Some(contact),
                route_set,
                flow: false,
            } = proxy.binding_target(vec![binding])
            else {
                continue;
            };
            let allowed = proxy
                .relay
                .read()
                .unwrap_or_else(|e| e.into_inner())
                .check(to.addr, grant)
                .is_ok();
            if !allowed || to.transport != downstream.transport {
                continue;
            }
            let tries = failover.tries.checked_add(1)?;
            let forwarded = SipMsg::parse(&transaction.request).ok()?;
            let edits = RequestEdits {
                request_uri: Some(contact.as_ref()),
                pop_routes: retry.path.len(),
                route_set: route_set.as_deref(),
                ..RequestEdits::default()
            };
            let mut request = Vec::with_capacity(transaction.request.len() + 256);
            if forward_request(&forwarded, &edits, &mut request).is_err()
                || !set_try(&mut request, tries)
            {
                continue;
            }
            transaction.request = request;
            failover.tries = tries;
            retry.path = path;
            transaction.start_client(now, to);
            self.stripe.add(Counter::FlowRetries);
            return Some(to);
        }
        None
    }

    /// Remove `aor`'s bindings registered through `path`: at once from a
    /// store on the worker, else through the driver's store queue (a full
    /// queue drops it, counted: the bindings then expire or fail again).
    fn remove_path(&mut self, now: u64, aor: &str, path: &[String], at: Option<Hop>) {
        match &self.proxy().store {
            StoreAccess::Inline(store) => {
                store.remove_path(aor, path, now);
            }
            StoreAccess::Deferred(queue) => {
                let removal = DeferredRequest {
                    query: StoreQuery::RemovePath {
                        aor: aor.to_owned(),
                        path: path.to_vec(),
                    },
                    received: now,
                    src: at.unwrap_or_else(|| Hop::udp(self.proxy().config.local)),
                    datagram: Vec::new(),
                };
                if queue.submit(removal).is_err() {
                    self.stripe.add(Counter::StoreQueueFull);
                }
            }
        }
    }
}
