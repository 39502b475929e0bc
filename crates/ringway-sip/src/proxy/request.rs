//! Requests: the entry point, then for a request that matches no
//! transaction the steps overload shedding, validation (16.3), route
//! preprocessing (16.4, 16.6) and target choice, and the dispatch to a
//! local answer, the registrar, or forwarding (stateless or stateful).

use super::branch::Branch;
use super::config::Mode;
use super::deferred::StoreCall;
use super::outcome::{Action, DropReason, MsgLabel, Outcome};
use super::routing::{sendable, upstream_address, Rejection, RoutePlan, Target};
use super::stats::Counter;
use super::transaction::{Class, Transaction, TransactionKey};
use super::worker::{scratch_for, send, ProxyWorker, Request};
use crate::edit::{forward_request, RequestEdits, ViaEdit};
use crate::msg::{Method, SipMsg};
use crate::registrar::StoreQuery;
use crate::uri::host_ip;
use std::borrow::Cow;
use std::io::Write as _;
use std::net::{IpAddr, SocketAddr};

/// What we answer an OPTIONS for us with.
const OPTIONS_HEADERS: [(&str, &str); 2] = [
    ("Allow", "INVITE, ACK, CANCEL, BYE, OPTIONS, REGISTER"),
    ("Accept", "application/sdp"),
];

impl ProxyWorker<'_> {
    pub(super) fn on_request(
        &mut self,
        now: u64,
        src: SocketAddr,
        msg: &SipMsg<'_>,
        out: &mut dyn FnMut(SocketAddr, &[u8]),
    ) -> Outcome {
        self.stripe.add(Counter::RequestsReceived);
        self.request_outcome(now, src, msg, out)
    }

    /// Handle a parsed request (counted by the caller): match a
    /// transaction, else handle it as new. A deferred request resumes here.
    pub(super) fn request_outcome(
        &mut self,
        now: u64,
        src: SocketAddr,
        msg: &SipMsg<'_>,
        out: &mut dyn FnMut(SocketAddr, &[u8]),
    ) -> Outcome {
        let method = msg.method().unwrap_or(Method::Other(""));
        let label = MsgLabel::of_method(method);
        let request = Request {
            now,
            src,
            upstream: upstream_address(src, msg.top_via().as_ref()),
            msg,
            method,
            keys: self.proxy().request_keys(msg),
        };
        if self.proxy().config.mode == Mode::Stateful {
            if let Some(action) = self.on_transaction_request(&request, out) {
                return Outcome { label, action };
            }
        }
        let action = self.new_request(&request, out);
        Outcome { label, action }
    }

    /// A request that matches no transaction (or any, stateless).
    fn new_request(
        &mut self,
        request: &Request<'_>,
        out: &mut dyn FnMut(SocketAddr, &[u8]),
    ) -> Action {
        let stateful = match self.admit(request, out) {
            Ok(stateful) => stateful,
            Err(refused) => return refused,
        };
        let proxy = self.proxy();
        if let Some(rejection) = proxy.validate(request.msg, request.keys) {
            return self.reject(request, rejection, out);
        }
        if request.method == Method::Ack && proxy.is_ack_for_local_response(request.msg) {
            // The ACK for a non-2xx we generated (a challenge, an error):
            // ours, hop by hop (stateful mode absorbs it in the transaction).
            return Action::Absorbed;
        }
        let plan = proxy.plan_route(request.msg);
        let target = proxy.choose_target(request, &plan);
        let identity = match self.authorize(request, &plan, &target, out) {
            Ok(identity) => identity,
            Err(refused) => return refused,
        };
        let target = match target {
            Target::Lookup { aor } => {
                let query = StoreQuery::Lookup {
                    aor: aor.to_owned(),
                };
                match self.store_call(request, query) {
                    StoreCall::Deferred => return Action::Deferred,
                    StoreCall::Answered(Ok(bindings)) => proxy.binding_target(bindings),
                    StoreCall::Answered(Err(_)) => {
                        self.stripe.add(Counter::StoreUnavailableLookups);
                        Target::Respond(480, "Temporarily Unavailable - Location Store Unavailable")
                    }
                }
            }
            target => target,
        };
        match target {
            Target::Respond(code, reason) => self.local_final(request, code, reason, &[], out),
            Target::OptionsToUs => self.local_final(request, 200, "OK", &OPTIONS_HEADERS, out),
            Target::Register => self.register(request, identity.as_ref(), out),
            // Resolved above.
            Target::Lookup { .. } => {
                self.local_final(request, 500, "Server Internal Error", &[], out)
            }
            Target::Send {
                to,
                request_uri,
                route_set,
            } => {
                let request_uri = request_uri.or(plan.request_uri_edit().map(Cow::Borrowed));
                let route = Forwarding {
                    request_uri: request_uri.as_deref(),
                    route_set: route_set.as_deref(),
                };
                self.forward(request, to, route, &plan, stateful, out)
            }
        }
    }

    /// Overload shedding. `Ok(stateful)`: whether to keep a transaction;
    /// `Err(action)`: refused (503 to an INVITE, else dropped).
    ///
    /// An ACK for a 2xx and a CANCEL that matched no transaction (RFC 3261
    /// 16.10) are forwarded statelessly; the responses to such a CANCEL then
    /// match no client transaction and follow the Via stack (16.7). A client
    /// transaction of class CANCEL is only ever one we generated.
    fn admit(
        &mut self,
        request: &Request<'_>,
        out: &mut dyn FnMut(SocketAddr, &[u8]),
    ) -> Result<bool, Action> {
        let proxy = self.proxy();
        let method = request.method;
        if self.shedding && method == Method::Invite && request.msg.to_tag().is_none() {
            // Overload reported by the driver: shed new calls first,
            // statelessly (no transaction, no timer G).
            self.stripe.add(Counter::OverloadQueueSheds);
            return Err(self.respond(
                request.msg,
                request.upstream,
                503,
                "Service Unavailable",
                &[("Retry-After", "5")],
                out,
            ));
        }
        let stateful = proxy.config.mode == Mode::Stateful
            && method != Method::Ack
            && method != Method::Cancel;
        if !stateful || proxy.transaction_room() {
            return Ok(stateful);
        }
        if matches!(
            method,
            Method::Bye | Method::Prack | Method::Update | Method::Info | Method::Notify
        ) && request.msg.to_tag().is_some()
        {
            // Overload control sheds new work first: a mid-dialog request
            // that ends or continues a call already set up (BYE, PRACK,
            // UPDATE, INFO, NOTIFY with a To tag; never REGISTER, OPTIONS,
            // CANCEL or a re-INVITE) is forwarded statelessly (RFC 3261
            // 16.11; its responses then follow the Via stack without a
            // transaction), so that calls can end and the table can drain.
            self.stripe.add(Counter::OverloadStateless);
            return Ok(false);
        }
        self.stripe.add(Counter::OverloadSheds);
        if method == Method::Invite {
            return Err(self.respond(
                request.msg,
                request.upstream,
                503,
                "Service Unavailable",
                &[("Retry-After", "5")],
                out,
            ));
        }
        Err(self.drop_datagram(DropReason::Overload))
    }

    /// Answer a request that failed validation.
    fn reject(
        &mut self,
        request: &Request<'_>,
        rejection: Rejection,
        out: &mut dyn FnMut(SocketAddr, &[u8]),
    ) -> Action {
        let (code, reason) = rejection.status();
        if rejection == Rejection::BadExtension {
            let unsupported: Vec<&str> = request.msg.proxy_require().collect();
            let list = unsupported.join(", ");
            return self.local_final(request, code, reason, &[("Unsupported", &list)], out);
        }
        self.local_final(request, code, reason, &[], out)
    }

    /// Forward `request` to `to` with our Via (and Record-Route, Route and
    /// Request-URI edits from `plan` and `route`), keeping a transaction if
    /// `stateful`.
    fn forward(
        &mut self,
        request: &Request<'_>,
        to: SocketAddr,
        route: Forwarding<'_>,
        plan: &RoutePlan<'_>,
        stateful: bool,
        out: &mut dyn FnMut(SocketAddr, &[u8]),
    ) -> Action {
        if !sendable(&to) {
            return self.drop_datagram(DropReason::ForbiddenDestination);
        }
        let proxy = self.proxy();
        let msg = request.msg;
        let dialog_creating = matches!(
            request.method,
            Method::Invite | Method::Subscribe | Method::Refer | Method::Notify
        ) && msg.to_tag().is_none();
        let branch = Branch::new(request.keys);
        let mut ip_text = [0u8; 48];
        let received = match top_host_differs(msg, request.src) {
            true => format_ip(&mut ip_text, request.src.ip()),
            false => None,
        };
        let rport = msg
            .top_via()
            .filter(|via| via.rport_flag && via.rport.is_none())
            .map(|_| request.src.port());
        let edits = RequestEdits {
            via: Some(ViaEdit {
                transport: "UDP",
                sent_by: &proxy.sent_by,
                branch: branch.as_str(),
            }),
            max_forwards: true,
            record_route: (proxy.config.record_route && dialog_creating)
                .then_some(proxy.record_route_uri.as_str()),
            pop_route: plan.pop_route,
            request_uri: route.request_uri,
            pop_last_route: plan.from_strict_router,
            received,
            rport,
            strict_next_hop: plan.strict_next_hop.map(|_| plan.request_uri),
            route_set: route.route_set,
            path: None,
        };
        if stateful {
            return self.forward_stateful(request, to, &edits, out);
        }
        let buf = scratch_for(&mut self.scratch, msg.as_bytes().len());
        match forward_request(msg, &edits, buf) {
            Ok(_) => {
                send(out, to, buf);
                self.stripe.add(Counter::RequestsForwarded);
                Action::Forwarded { copies: 1 }
            }
            Err(error) => self.edit_failed(error),
        }
    }

    /// Answer locally with a final response; in stateful mode keep a
    /// transaction so retransmissions and the ACK are absorbed.
    pub(super) fn local_final(
        &mut self,
        request: &Request<'_>,
        code: u16,
        reason: &str,
        extra_headers: &[(&str, &str)],
        out: &mut dyn FnMut(SocketAddr, &[u8]),
    ) -> Action {
        let (msg, method) = (request.msg, request.method);
        let action = self.respond(msg, request.upstream, code, reason, extra_headers, out);
        let proxy = self.proxy();
        if proxy.config.mode == Mode::Stateful
            && method != Method::Ack
            && matches!(action, Action::Responded(_))
            && proxy.transaction_room()
        {
            let class = Class::of(method);
            let mut transaction = Transaction::new(class, Some(request.upstream));
            proxy.build_local_response(
                msg,
                code,
                reason,
                extra_headers,
                &mut transaction.last_response,
            );
            transaction.complete(request.now, code);
            self.insert_transaction(
                TransactionKey::new(request.keys.transaction, class),
                transaction,
            );
        }
        action
    }
}

/// Where a forwarded request is addressed beyond its next hop.
#[derive(Clone, Copy)]
struct Forwarding<'a> {
    /// A new Request-URI (a binding's contact, a strict-routing fix-up).
    request_uri: Option<&'a str>,
    /// A route set to put on top of the Route headers (a binding's Path).
    route_set: Option<&'a str>,
}

/// Whether the top Via's host is not the source IP (so `received` is due).
fn top_host_differs(msg: &SipMsg<'_>, src: SocketAddr) -> bool {
    msg.top_via()
        .is_some_and(|via| host_ip(via.host) != Some(src.ip()))
}

/// `ip` as text in `buf` (no allocation).
fn format_ip(buf: &mut [u8; 48], ip: IpAddr) -> Option<&str> {
    let mut cursor = std::io::Cursor::new(&mut buf[..]);
    write!(cursor, "{ip}").ok()?;
    let len = cursor.position() as usize;
    std::str::from_utf8(&buf[..len]).ok()
}
