//! Requests: the entry point, then for a request that matches no
//! transaction the steps overload shedding, validation (16.3), route
//! preprocessing (16.4, 16.6) and target choice, and the dispatch to a
//! local answer, the registrar, or forwarding (stateless or stateful).

use super::branch::{Branch, SIGNATURE_PARAM};
use super::config::Mode;
use super::deferred::StoreCall;
use super::flow_retry::FlowRetry;
use super::flow_token::TokenUse;
use super::names::{failure_status, NameCall};
use super::outcome::{Action, DropReason, MsgLabel, Outcome};
use super::request_context::Request;
use super::routing::{upstream_address, Rejection, RoutePlan, Target};
use super::stats::Counter;
use super::worker::{reply_hop, scratch_for, send, ProxyWorker};
use super::OwnAddress;
use super::Proxy;
use crate::edit::{forward_request, RemoveHeaders, RequestEdits, ViaEdit};
use crate::msg::{Method, SipMsg};
use crate::registrar::StoreQuery;
use crate::relay::{Grant, Refusal};
use crate::transport::Hop;
use crate::uri::host_ip;
use std::borrow::Cow;
use std::io::Write as _;
use std::net::IpAddr;

/// What we answer an OPTIONS for us with.
const OPTIONS_HEADERS: [(&str, &str); 2] = [
    ("Allow", "INVITE, ACK, CANCEL, BYE, OPTIONS, REGISTER"),
    ("Accept", "application/sdp"),
];

impl ProxyWorker<'_> {
    pub(super) fn on_request(
        &mut self,
        now: u64,
        src: Hop,
        msg: &SipMsg<'_>,
        out: &mut dyn FnMut(Hop, &[u8]),
    ) -> Outcome {
        self.stripe.add(Counter::RequestsReceived);
        self.request_outcome(now, src, msg, out)
    }

    /// Handle a parsed request (counted by the caller): match a
    /// transaction, else handle it as new. A deferred request resumes here.
    pub(super) fn request_outcome(
        &mut self,
        now: u64,
        from: Hop,
        msg: &SipMsg<'_>,
        out: &mut dyn FnMut(Hop, &[u8]),
    ) -> Outcome {
        let method = msg.method().unwrap_or(Method::Other(""));
        let label = MsgLabel::of_method(method);
        let upstream = upstream_address(from, msg.top_via().as_ref());
        let request = Request {
            now,
            src: from.addr,
            from,
            upstream,
            reply: reply_hop(from, upstream),
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
    fn new_request(&mut self, request: &Request<'_>, out: &mut dyn FnMut(Hop, &[u8])) -> Action {
        let stateful = match self.admit(request, out) {
            Ok(stateful) => stateful,
            Err(refused) => return refused,
        };
        let proxy = self.proxy();
        if let Some(rejection) = proxy.validate(request.msg, request.keys) {
            return self.reject(request, rejection, out);
        }
        // One pass over the Route values, which also finds a malformed
        // one (the last step of validation).
        let plan = proxy.plan_route(request.msg);
        if plan.malformed_route {
            return self.reject(request, Rejection::MalformedRoute, out);
        }
        if request.method == Method::Ack && proxy.is_ack_for_local_response(request.msg) {
            // The ACK for a non-2xx we generated (a challenge, an error):
            // ours, hop by hop (stateful mode absorbs it in the transaction).
            return Action::Absorbed;
        }
        let target = proxy.choose_target(request, &plan);
        let identity = match self.authorize(request, &plan, &target, out) {
            Ok(identity) => identity,
            Err(refused) => return refused,
        };
        // The AOR's other bindings, for a 430 from an edge proxy.
        let mut flows = None;
        let target = match target {
            Target::Lookup { aor } => {
                let query = StoreQuery::Lookup { aor: aor.clone() };
                match self.store_call(request, query) {
                    StoreCall::Deferred => return Action::Deferred,
                    StoreCall::Answered(Ok(bindings)) => {
                        if stateful {
                            flows = FlowRetry::of(&aor, &bindings);
                        }
                        proxy.binding_target(bindings)
                    }
                    StoreCall::Answered(Err(_)) => {
                        self.stripe.add(Counter::StoreUnavailableLookups);
                        Target::Respond(480, "Temporarily Unavailable - Location Store Unavailable")
                    }
                }
            }
            target => target,
        };
        let mut alternates = Vec::new();
        let target = match target {
            Target::Resolve { query, grant } => {
                let grant = if identity.is_some() {
                    Grant::Authenticated
                } else {
                    grant
                };
                match self.resolve_target(request, query, grant, &mut alternates, out) {
                    Ok(target) => target,
                    Err(action) => return action,
                }
            }
            target => target,
        };
        match target {
            Target::Respond(code, reason) => self.local_final(request, code, reason, &[], out),
            Target::OptionsToUs => self.local_final(request, 200, "OK", &OPTIONS_HEADERS, out),
            Target::Register => self.register(request, identity.as_ref(), out),
            // Resolved above.
            Target::Lookup { .. } | Target::Resolve { .. } => {
                self.local_final(request, 500, "Server Internal Error", &[], out)
            }
            // RFC 5626 5.3: the flow the request must go over is gone.
            Target::Send { to, flow: true, .. } if proxy.flow_gone(to) => {
                self.flow_failed(request, out)
            }
            Target::Send {
                to,
                grant,
                request_uri,
                route_set,
                flow,
            } => {
                let request_uri = request_uri.or(plan.request_uri_edit().map(Cow::Borrowed));
                let route = Forwarding {
                    to,
                    // An authenticated user may call anywhere the policy
                    // lets a request go at all.
                    grant: if identity.is_some() {
                        Grant::Authenticated
                    } else {
                        grant
                    },
                    request_uri: request_uri.as_deref(),
                    route_set: route_set.as_deref(),
                    flow: flow.then_some(to),
                    alternates: &alternates,
                };
                let flows = flows.filter(|_| !flow);
                self.forward(request, route, &plan, (stateful, flows), out)
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
        out: &mut dyn FnMut(Hop, &[u8]),
    ) -> Result<bool, Action> {
        let proxy = self.proxy();
        let method = request.method;
        if self.shedding && method == Method::Invite && request.msg.to_tag().is_none() {
            // Overload reported by the driver: shed new calls first,
            // statelessly (no transaction, no timer G).
            self.stripe.add(Counter::OverloadQueueSheds);
            return Err(self.respond(
                request.msg,
                request.reply,
                503,
                "Service Unavailable",
                &[("Retry-After", "5")],
                out,
            ));
        }
        if proxy.is_draining()
            && !matches!(method, Method::Ack | Method::Cancel)
            && request.msg.to_tag().is_none()
        {
            // Draining: no new work; what is under way goes on.
            self.stripe.add(Counter::DrainRefusals);
            return Err(self.respond(
                request.msg,
                request.reply,
                503,
                "Service Unavailable - Draining",
                &[("Retry-After", "30")],
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
                request.reply,
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
        out: &mut dyn FnMut(Hop, &[u8]),
    ) -> Action {
        let (code, reason) = rejection.status();
        if rejection == Rejection::BadExtension {
            let unsupported: Vec<&str> = request.msg.proxy_require().collect();
            let list = unsupported.join(", ");
            return self.local_final(request, code, reason, &[("Unsupported", &list)], out);
        }
        self.local_final(request, code, reason, &[], out)
    }

    /// Forward `request` to `route.to` with our Via (and Record-Route,
    /// Route and Request-URI edits from `plan` and `route`), keeping a
    /// transaction if `stateful` (with `flows`, the AOR's other bindings a
    /// `430` moves it on to), if the relay policy allows that destination
    /// with `route.grant`.
    fn forward(
        &mut self,
        request: &Request<'_>,
        route: Forwarding<'_>,
        plan: &RoutePlan<'_>,
        (stateful, flows): (bool, Option<FlowRetry>),
        out: &mut dyn FnMut(Hop, &[u8]),
    ) -> Action {
        let proxy = self.proxy();
        let to = route.to;
        let grant = authorised_grant(proxy, request, to, route.grant);
        let relayed = proxy
            .relay
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .check(to.addr, grant);
        if let Err(refusal) = relayed {
            return self.refuse_relay(request, refusal, out);
        }
        let msg = request.msg;
        let dialog_creating = matches!(
            request.method,
            Method::Invite | Method::Subscribe | Method::Refer | Method::Notify
        ) && msg.to_tag().is_none();
        let branch = Branch::new(
            request.keys,
            proxy.upstream_mac(request.keys.transaction, request.upstream),
        );
        let mut ip_text = [0u8; 48];
        let over_connection = request.from.transport.is_reliable();
        let (received, rport) = received_and_rport(request, over_connection, &mut ip_text);
        // Our address on the way out, and on the way in.
        let (Some(egress), Some(ingress)) = (
            proxy.own_address(to.transport),
            proxy.own_address(request.from.transport),
        ) else {
            // Only a driver that hands us a transport we do not listen on.
            return self.drop_datagram(DropReason::ForbiddenDestination);
        };
        let mut rr_text = [0u8; 256];
        let mut rr_inner_text = [0u8; 256];
        let record_route = (proxy.config.record_route && dialog_creating)
            .then(|| proxy.signed_record_route(msg, egress, route.flow, &mut rr_text))
            .filter(|uri| !uri.is_empty());
        // Two transports (or two addresses): a Record-Route for each side,
        // the far side's on top, as Kamailio's rr module does. Each side
        // then reaches us over its own transport, and a request that
        // consumed both leaves by the transport named last.
        let record_route_inner = (record_route.is_some() && !std::ptr::eq(egress, ingress))
            .then(|| proxy.signed_record_route(msg, ingress, None, &mut rr_inner_text))
            .filter(|uri| !uri.is_empty());
        // RFC 5626 5.1 / RFC 3327: a REGISTER we forward (an edge proxy in
        // front of a registrar) gets our Path with the token of the flow
        // it came in on, so that the registrar's requests for the binding
        // come back through us and go out over that flow.
        let path = (request.method == Method::Register
            && super::register::supports(msg, "path")
            && (over_connection || proxy.config.nat))
            .then(|| proxy.path_uri(msg, egress, request.from));
        let edits = RequestEdits {
            via: Some(ViaEdit {
                transport: to.transport.via_token(),
                sent_by: &egress.sent_by,
                branch: branch.as_str(),
                alias: false,
            }),
            max_forwards: true,
            record_route,
            record_route_inner,
            pop_routes: plan.pop_routes,
            request_uri: route.request_uri,
            pop_last_route: plan.from_strict_router,
            received,
            rport,
            add_rport: over_connection,
            strict_next_hop: plan.strict_next_hop.map(|_| plan.request_uri),
            route_set: route.route_set,
            path: path.as_deref(),
            remove: RemoveHeaders {
                // Only a configured next hop (a gateway, a PBX) may assert
                // an identity to us (RFC 3325 trust domain).
                asserted_identity: proxy
                    .config
                    .route_to
                    .is_none_or(|trusted| trusted.ip() != request.src.ip()),
                // Consumed: the next hop must not get our users' digests.
                proxy_authorization_realms: &proxy.realms,
            },
        };
        if stateful {
            return self.forward_stateful(request, (to, route.alternates, flows), &edits, out);
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

    /// A request for a registered flow (a Path or Record-Route flow token,
    /// a binding's connection) whose connection is gone: `430 Flow Failed`
    /// (RFC 5626 5.3; the registrar or the UA then tries another flow), an
    /// ACK (never answered) dropped. Counted either way.
    fn flow_failed(&mut self, request: &Request<'_>, out: &mut dyn FnMut(Hop, &[u8])) -> Action {
        self.stripe.add(Counter::FlowsFailed);
        if request.method == Method::Ack {
            return self.drop_datagram(DropReason::AckNotRoutable);
        }
        self.local_final(request, 430, "Flow Failed", &[], out)
    }

    /// The relay policy refused the next hop: `482` for our own address,
    /// else `403 Not Relaying`; an ACK or a CANCEL (never answered this
    /// way) is dropped and counted.
    fn refuse_relay(
        &mut self,
        request: &Request<'_>,
        refusal: Refusal,
        out: &mut dyn FnMut(Hop, &[u8]),
    ) -> Action {
        if refusal == Refusal::Unsendable {
            return self.drop_datagram(DropReason::ForbiddenDestination);
        }
        self.stripe.add(Counter::RelayRefused);
        if matches!(request.method, Method::Ack | Method::Cancel) {
            return self.drop_datagram(DropReason::NotRelayed);
        }
        let (code, reason) = match refusal {
            Refusal::OwnAddress => (482, "Loop Detected"),
            _ => (403, "Forbidden - Not Relaying"),
        };
        self.local_final(request, code, reason, &[], out)
    }

    /// Answer locally with a final response, statelessly: once, no
    /// transaction and no retransmissions (a retransmitted request is
    /// answered again; the ACK of a non-2xx is recognised by our To-tag
    /// and absorbed), as Kamailio's `sl_send_reply` does. A spoofed
    /// request thus draws one response to its claimed source, never a
    /// timer-G series.
    pub(super) fn local_final(
        &mut self,
        request: &Request<'_>,
        code: u16,
        reason: &str,
        extra_headers: &[(&str, &str)],
        out: &mut dyn FnMut(Hop, &[u8]),
    ) -> Action {
        self.respond(request.msg, request.reply, code, reason, extra_headers, out)
    }
}

impl Proxy {
    /// Our Path URI for a REGISTER that came in on flow `from`, as an
    /// edge proxy (RFC 5626 5.1): `sip:<token>@host:port;lr`, our address
    /// `own` on the side of the registrar, with `;ob` when the REGISTER
    /// asked for outbound (`Supported: outbound` and a Contact with
    /// `reg-id`).
    fn path_uri(&self, msg: &SipMsg<'_>, own: &OwnAddress, from: Hop) -> String {
        let token = self.flow_token(from, TokenUse::Path);
        let host = own
            .record_route_uri
            .strip_prefix("sip:")
            .unwrap_or(&own.record_route_uri);
        let outbound = super::register::supports(msg, "outbound")
            && msg
                .contact()
                .any(|contact| contact.param("reg-id").flatten().is_some());
        let ob = if outbound { ";ob" } else { "" };
        format!("sip:{}@{host}{ob}", token.as_str())
    }

    /// Our Record-Route URI signed for the dialog `msg` creates
    /// (`sip:host:port;lr;rw=<MAC of Call-ID and From tag>`), with the
    /// token of `flow` when it goes towards a registered flow
    /// (`;ob-flow=<token>`), in `buf`.
    pub(super) fn signed_record_route<'b>(
        &self,
        msg: &SipMsg<'_>,
        own: &OwnAddress,
        flow: Option<Hop>,
        buf: &'b mut [u8; 256],
    ) -> &'b str {
        let signature =
            self.route_signature(msg.call_id().unwrap_or(""), msg.from_tag().unwrap_or(""));
        let token = flow.map(|flow| self.flow_token(flow, TokenUse::RecordRoute));
        let (flow_sep, flow_param, flow_eq, flow_text): (&[u8], &[u8], &[u8], &[u8]) = match &token
        {
            Some(token) => (
                b";",
                super::flow_token::FLOW_PARAM.as_bytes(),
                b"=",
                token.as_str().as_bytes(),
            ),
            None => (b"", b"", b"", b""),
        };
        let parts = [
            own.record_route_uri.as_bytes(),
            b";",
            SIGNATURE_PARAM.as_bytes(),
            b"=",
            signature.as_str().as_bytes(),
            flow_sep,
            flow_param,
            flow_eq,
            flow_text,
        ];
        let mut len = 0;
        for part in parts {
            let Some(room) = buf.get_mut(len..len + part.len()) else {
                return "";
            };
            room.copy_from_slice(part);
            len += part.len();
        }
        std::str::from_utf8(&buf[..len]).unwrap_or("")
    }
}

/// Where a forwarded request goes, why it may, and how it is addressed
/// beyond its next hop.
#[derive(Clone, Copy)]
struct Forwarding<'a> {
    /// The next hop.
    to: Hop,
    /// What vouches for it.
    grant: Grant,
    /// A new Request-URI (a binding's contact, a strict-routing fix-up).
    request_uri: Option<&'a str>,
    /// A route set to put on top of the Route headers (a binding's Path).
    route_set: Option<&'a str>,
    /// The registered flow `to` is: our Record-Route towards it carries
    /// its token.
    flow: Option<Hop>,
    /// The next RFC 3263 targets after `to` (stateful failover).
    alternates: &'a [Hop],
}

impl ProxyWorker<'_> {
    /// A next hop given by name: resolved (from the cache, or the request
    /// is parked), every address checked by the relay policy with `grant`;
    /// the first allowed one is the target and the next ones (up to
    /// [`super::MAX_TRIES`] in all) go to `alternates`. A request that could
    /// go nowhere the name resolves to (no grant, relay networks `none`)
    /// takes the default route without a lookup. `Err`: answered or parked.
    fn resolve_target<'m>(
        &mut self,
        request: &Request<'_>,
        query: super::NameQuery,
        grant: Grant,
        alternates: &mut Vec<Hop>,
        out: &mut dyn FnMut(Hop, &[u8]),
    ) -> Result<Target<'m>, Action> {
        let proxy = self.proxy();
        if grant == Grant::None && proxy.relays_nowhere() {
            return Ok(proxy.default_route());
        }
        let transport = query.transport;
        let addresses = match self.name_call(request, query) {
            NameCall::Parked => return Err(Action::Deferred),
            NameCall::Answered(Ok(addresses)) => addresses,
            NameCall::Answered(Err(error)) => {
                let (code, reason, counter) = failure_status(error);
                self.stripe.add(counter);
                if matches!(request.method, Method::Ack | Method::Cancel) {
                    return Err(self.drop_datagram(DropReason::NameNotResolved));
                }
                return Err(self.local_final(request, code, reason, &[], out));
            }
        };
        let mut refused = None;
        {
            let policy = proxy.relay.read().unwrap_or_else(|e| e.into_inner());
            for addr in addresses {
                match policy.check(addr, grant) {
                    Ok(()) if alternates.len() < super::MAX_TRIES => {
                        alternates.push(proxy.hop_over(transport, addr));
                    }
                    Ok(()) => break,
                    Err(refusal) => refused = refused.or(Some(refusal)),
                }
            }
        }
        if alternates.is_empty() {
            return Err(self.refuse_relay(request, refused.unwrap_or(Refusal::NotRelaying), out));
        }
        let to = alternates.remove(0);
        Ok(Target::Send {
            to,
            grant,
            request_uri: None,
            route_set: None,
            flow: false,
        })
    }
}

/// `ip` as text in `buf` (no allocation).
/// `grant`, raised to [`Grant::Authenticated`] for the CANCEL or non-2xx
/// ACK of an authenticated INVITE; an authenticated INVITE's destination
/// is remembered for them.
fn authorised_grant(proxy: &Proxy, request: &Request<'_>, to: Hop, grant: Grant) -> Grant {
    let Some(authorised) = &proxy.authorised else {
        return grant;
    };
    let transaction = request.keys.transaction;
    match request.method {
        Method::Invite if grant == Grant::Authenticated => {
            authorised.remember(transaction, request.upstream, to.addr);
            grant
        }
        // The CANCEL or non-2xx ACK of an authenticated INVITE
        // (same branch, same source) follows it (RFC 3261 16.10).
        Method::Cancel | Method::Ack
            if grant == Grant::None
                && authorised.went_to(transaction, request.upstream, to.addr) =>
        {
            Grant::Authenticated
        }
        _ => grant,
    }
}

/// The `received` and `rport` our top-Via edit writes into the sender's
/// Via (`ip_text` holds the address text).
fn received_and_rport<'t>(
    request: &Request<'_>,
    over_connection: bool,
    ip_text: &'t mut [u8; 48],
) -> (Option<&'t str>, Option<u16>) {
    let top = request.msg.top_via();
    // RFC 3261 18.2.1 / RFC 3581: `received` when the sent-by host is
    // not the source (or the sender wrote one: it is replaced), `rport`
    // filled in (or replaced) with the source port.
    let received = match top
        .as_ref()
        .is_some_and(|via| via.received.is_some() || host_ip(via.host) != Some(request.src.ip()))
    {
        true => format_ip(ip_text, request.src.ip()),
        false => None,
    };
    let rport = top
        .as_ref()
        .filter(|via| via.rport_flag || over_connection)
        .map(|_| request.src.port());
    (received, rport)
}

fn format_ip(buf: &mut [u8; 48], ip: IpAddr) -> Option<&str> {
    let mut cursor = std::io::Cursor::new(&mut buf[..]);
    write!(cursor, "{ip}").ok()?;
    let len = cursor.position() as usize;
    std::str::from_utf8(&buf[..len]).ok()
}
