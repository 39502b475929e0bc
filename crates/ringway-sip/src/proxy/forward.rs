//! New requests (validation, routing, dispatch, local answers) and stateless response forwarding.

#![allow(unused_imports)]
use super::*;

impl Proxy {
    #[allow(clippy::too_many_arguments)]
    pub(super) fn new_request(
        &self,
        now: u64,
        src: SocketAddr,
        upstream: SocketAddr,
        msg: &SipMsg<'_>,
        method: Method<'_>,
        keys: (u64, u32),
        out: &mut dyn FnMut(SocketAddr, &[u8]),
    ) -> Action {
        // ACK for a 2xx and a CANCEL that matched no transaction (RFC 3261
        // 16.10) are forwarded statelessly; the responses to such a CANCEL
        // then match no client transaction and follow the Via stack (16.7).
        // A client transaction of class CANCEL is only ever one we generated.
        let mut stateful =
            self.cfg.mode == Mode::Stateful && method != Method::Ack && method != Method::Cancel;
        if stateful
            && matches!(
                method,
                Method::Bye | Method::Prack | Method::Update | Method::Info | Method::Notify
            )
            && msg.to_tag().is_some()
            && self.active.load(Ordering::Relaxed) >= self.cfg.max_transactions
        {
            // Overload control sheds new work first: a mid-dialog request
            // that ends or continues a call already set up (BYE, PRACK,
            // UPDATE, INFO, NOTIFY with a To tag; never REGISTER, OPTIONS,
            // CANCEL or a re-INVITE) is forwarded statelessly (RFC 3261
            // 16.11; its responses then follow the Via stack without a
            // transaction), so that calls can end and the table can drain.
            self.counters.inc(C::OverloadStateless);
            stateful = false;
        }
        if stateful && self.active.load(Ordering::Relaxed) >= self.cfg.max_transactions {
            self.counters.inc(C::Overload);
            if method == Method::Invite {
                return self.respond(
                    msg,
                    upstream,
                    503,
                    "Service Unavailable",
                    &[("Retry-After", "5")],
                    out,
                );
            }
            self.counters.drop(DropReason::Overload);
            return Action::Dropped(DropReason::Overload);
        }
        if let Some((code, reason)) = self.validate(msg, keys) {
            if code == 420 {
                let unsupported: Vec<&str> = msg.proxy_require().collect();
                let list = unsupported.join(", ");
                return self.local_final(
                    now,
                    msg,
                    keys,
                    upstream,
                    code,
                    reason,
                    &[("Unsupported", &list)],
                    out,
                );
            }
            return self.local_final(now, msg, keys, upstream, code, reason, &[], out);
        }

        // 16.4 route information preprocessing.
        let route_count = msg.routes().count();
        let ruri = msg.request_uri().unwrap_or("");
        let rsu = msg.request_sip_uri();
        let strict = route_count > 0
            && rsu.is_some_and(|u| {
                u.user.is_none() && u.param("lr").is_some() && self.host_is_ours(u.host, u.port)
            });
        let mut routes_left = route_count - usize::from(strict);
        let eff_ruri: &str = if strict {
            msg.routes().last().map_or(ruri, |r| r.uri)
        } else {
            ruri
        };
        let first_route = msg.routes().next();
        let pop_route = routes_left > 0 && first_route.is_some_and(|r| self.uri_is_us(r.uri));
        if pop_route {
            routes_left -= 1;
        }
        let next_route = if routes_left > 0 {
            msg.routes().nth(usize::from(pop_route))
        } else {
            None
        };

        let target = match next_route {
            Some(r) => match r.sip_uri().and_then(|u| {
                u.host_ip()
                    .map(|ip| SocketAddr::new(ip, u.port.unwrap_or(5060)))
            }) {
                Some(to) => Target::Send { to, ruri: None },
                None => match self.cfg.route_to {
                    Some(to) => Target::Send { to, ruri: None },
                    None => Target::Respond(404, "Not Found"),
                },
            },
            None => {
                let eu = if strict { SipUri::parse(eff_ruri) } else { rsu };
                self.route_by_uri(now, eu, method)
            }
        };
        let ruri_edit: Option<std::borrow::Cow<'_, str>> = if strict {
            Some(std::borrow::Cow::Borrowed(eff_ruri))
        } else {
            None
        };
        // RFC 3261 16.6 step 6: a next hop without `lr` is a strict router;
        // it becomes the Request-URI and the old one goes to the Route end.
        let strict_next = next_route
            .filter(|r| !strict && r.sip_uri().is_some_and(|u| u.param("lr").is_none()))
            .map(|r| r.uri);
        let ruri_edit = match strict_next {
            Some(u) => Some(std::borrow::Cow::Borrowed(u)),
            None => ruri_edit,
        };
        match target {
            Target::Respond(code, reason) => {
                self.local_final(now, msg, keys, upstream, code, reason, &[], out)
            }
            Target::OptionsToUs => self.local_final(
                now,
                msg,
                keys,
                upstream,
                200,
                "OK",
                &[
                    ("Allow", "INVITE, ACK, CANCEL, BYE, OPTIONS, REGISTER"),
                    ("Accept", "application/sdp"),
                ],
                out,
            ),
            Target::Register => self.register(now, msg, keys, upstream, out),
            Target::Send { to, ruri } => {
                if !sendable(&to) {
                    self.counters.drop(DropReason::ForbiddenDestination);
                    return Action::Dropped(DropReason::ForbiddenDestination);
                }
                let new_ruri = ruri.or(ruri_edit);
                let dialog_creating = matches!(
                    method,
                    Method::Invite | Method::Subscribe | Method::Refer | Method::Notify
                ) && msg.to_tag().is_none();
                let branch = Branch::new(keys.0, keys.1);
                let mut ipbuf = [0u8; 48];
                let received = match top_host_differs(msg, src) {
                    true => fmt_ip(&mut ipbuf, src.ip()),
                    false => None,
                };
                let rport = msg
                    .top_via()
                    .filter(|v| v.rport_flag && v.rport.is_none())
                    .map(|_| src.port());
                let edits = RequestEdits {
                    via: Some(ViaEdit {
                        transport: "UDP",
                        sent_by: &self.sent_by,
                        branch: branch.as_str(),
                    }),
                    max_forwards: true,
                    record_route: (self.cfg.record_route && dialog_creating)
                        .then_some(self.rr_uri.as_str()),
                    pop_route,
                    request_uri: new_ruri.as_deref(),
                    pop_last_route: strict,
                    received,
                    rport,
                    strict_next_hop: strict_next.map(|_| eff_ruri),
                };
                if stateful {
                    self.forward_stateful(now, msg, method, keys, upstream, to, &edits, out)
                } else {
                    with_scratch(|buf| match forward_request(msg, &edits, buf) {
                        Ok(_) => {
                            send(out, to, buf);
                            self.counters.inc(C::ReqFwd);
                            Action::Forwarded { copies: 1 }
                        }
                        Err(e) => self.edit_failed(e),
                    })
                }
            }
        }
    }

    pub(super) fn edit_failed(&self, e: EditError) -> Action {
        let d = match e {
            EditError::TooLarge => DropReason::TooLarge,
            _ => DropReason::MalformedRequest,
        };
        self.counters.drop(d);
        Action::Dropped(d)
    }

    /// Answer locally with a final response; in stateful mode keep a
    /// transaction so retransmissions and the ACK are absorbed.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn local_final(
        &self,
        now: u64,
        msg: &SipMsg<'_>,
        keys: (u64, u32),
        upstream: SocketAddr,
        code: u16,
        reason: &str,
        extra: &[(&str, &str)],
        out: &mut dyn FnMut(SocketAddr, &[u8]),
    ) -> Action {
        let method = msg.method().unwrap_or(Method::Other(""));
        let a = self.respond(msg, upstream, code, reason, extra, out);
        if self.cfg.mode == Mode::Stateful
            && method != Method::Ack
            && matches!(a, Action::Responded(_))
            && self.active.load(Ordering::Relaxed) < self.cfg.max_transactions
        {
            let class = Class::of(method);
            let mut tx = Transaction::new(class, Some(upstream));
            let tag = Branch::new(
                Hash64::new(self.secret)
                    .str(msg.call_id().unwrap_or(""))
                    .finish(),
                0,
            );
            build_response(
                msg,
                code,
                reason,
                extra,
                Some(&tag.as_str()[9..25]),
                &mut tx.last_response,
            );
            tx.complete(now, code);
            self.insert_tx(TransactionKey::new(keys.0, class), tx);
        }
        a
    }

    pub(super) fn insert_tx(&self, key: TransactionKey, tx: Transaction) {
        let mut sh = lock(self.shard(key.hash));
        if sh.transactions.insert(key, tx).is_none() {
            self.active.fetch_add(1, Ordering::Relaxed);
            self.counters.inc(C::TxCreated);
        }
        sh.schedule(key);
    }

    // ---------------------------------------------------------------- responses

    pub(super) fn on_response(
        &self,
        now: u64,
        _src: SocketAddr,
        msg: &SipMsg<'_>,
        out: &mut dyn FnMut(SocketAddr, &[u8]),
    ) -> Outcome {
        self.counters.inc(C::RespIn);
        let code = msg.status().unwrap_or(0);
        let label = MsgLabel::Response(code);
        let drop = |d: DropReason| {
            self.counters.drop(d);
            Outcome {
                label,
                action: Action::Dropped(d),
            }
        };
        let Some(top) = msg.top_via() else {
            return drop(DropReason::MalformedResponse);
        };
        if !self.is_our_via(&top) {
            return drop(DropReason::ResponseNotOurs);
        }
        if self.cfg.mode == Mode::Stateful {
            if let Some((h, _)) = top.branch.and_then(parse_branch) {
                let method = msg.cseq().map_or(Method::Other(""), |c| c.1);
                if let Some(a) = self.stateful_response(now, msg, h, Class::of(method), out) {
                    return Outcome { label, action: a };
                }
            }
        }
        let Some(next) = msg.vias().nth(1) else {
            return drop(DropReason::UnroutableResponse);
        };
        let Some(to) = next.response_target() else {
            return drop(DropReason::UnroutableResponse);
        };
        if !sendable(&to) {
            return drop(DropReason::ForbiddenDestination);
        }
        with_scratch(|buf| match forward_response(msg, buf) {
            Ok(_) => {
                send(out, to, buf);
                self.counters.inc(C::RespFwd);
                Outcome {
                    label,
                    action: Action::Forwarded { copies: 1 },
                }
            }
            Err(_) => drop(DropReason::MalformedResponse),
        })
    }
}
