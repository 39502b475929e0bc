//! Stateful handling: requests matching transactions, responses, CANCEL.

#![allow(unused_imports)]
use super::*;

impl Proxy {
    // ---------------------------------------------------------------- stateful

    /// Handle a request that matches an existing transaction (or a CANCEL).
    pub(super) fn stateful_existing(
        &self,
        now: u64,
        msg: &SipMsg<'_>,
        method: Method<'_>,
        keys: (u64, u32),
        upstream: SocketAddr,
        out: &mut dyn FnMut(SocketAddr, &[u8]),
    ) -> Option<Action> {
        let class = Class::of(method);
        let key = TransactionKey::new(keys.0, class);
        let mut sh = lock(self.shard(keys.0));
        if let Some(tx) = sh.transactions.get_mut(&key) {
            if method == Method::Cancel && tx.last_response.is_empty() {
                // Our own CANCEL (timer C) is in flight; still answer the
                // UAC's CANCEL with 200 and absorb its retransmissions.
                let tag = Branch::new(
                    Hash64::new(self.secret)
                        .str(msg.call_id().unwrap_or(""))
                        .finish(),
                    0,
                );
                build_response(
                    msg,
                    200,
                    "OK",
                    &[],
                    Some(&tag.as_str()[9..25]),
                    &mut tx.last_response,
                );
                tx.upstream = Some(upstream);
                send(out, upstream, &tx.last_response);
                self.counters.code(200);
                return Some(Action::Responded(200));
            }
            if method == Method::Ack {
                if tx.server == ServerState::Completed {
                    tx.confirm(now);
                    sh.schedule(key);
                    return Some(Action::Absorbed);
                }
                if tx.server == ServerState::Confirmed {
                    self.counters.inc(C::RetransAbsorbed);
                    return Some(Action::Absorbed);
                }
                return None; // end-to-end ACK (2543-style match): forward
            }
            if !tx.last_response.is_empty() {
                if let Some(up) = tx.upstream {
                    send(out, up, &tx.last_response);
                }
            }
            self.counters.inc(C::RetransAbsorbed);
            return Some(Action::Absorbed);
        }
        if method != Method::Cancel {
            return None;
        }
        // CANCEL: find the INVITE it cancels (same branch => same hash).
        let ikey = TransactionKey::new(keys.0, Class::Invite);
        let (invite_pending, invite_calling) = match sh.transactions.get(&ikey) {
            Some(i) => (
                i.client == ClientState::Calling || i.client == ClientState::Proceeding,
                i.client == ClientState::Calling,
            ),
            None => return None, // no context: forward statelessly (16.10)
        };
        drop(sh);
        let a = self.respond(msg, upstream, 200, "OK", &[], out);
        let mut ctx = Transaction::new_cancel(now, Some(upstream));
        let tag = Branch::new(
            Hash64::new(self.secret)
                .str(msg.call_id().unwrap_or(""))
                .finish(),
            0,
        );
        build_response(
            msg,
            200,
            "OK",
            &[],
            Some(&tag.as_str()[9..25]),
            &mut ctx.last_response,
        );
        let mut sh = lock(self.shard(keys.0));
        if let Some(inv) = sh.transactions.get_mut(&ikey) {
            if invite_pending {
                inv.cancelled = true;
                if invite_calling {
                    inv.cancel_pending = true;
                }
            }
        }
        if let Some(inv) = sh
            .transactions
            .get(&ikey)
            .filter(|_| invite_pending && !invite_calling)
        {
            self.start_cancel(now, inv, &mut ctx, out);
        }
        let cancel_key = TransactionKey::new(keys.0, Class::Cancel);
        if sh.transactions.insert(cancel_key, ctx).is_none() {
            self.active.fetch_add(1, Ordering::Relaxed);
            self.counters.inc(C::TxCreated);
        }
        sh.schedule(cancel_key);
        Some(a)
    }

    /// Build and send a CANCEL for `inv` downstream, making `ctx` its client
    /// transaction. Returns whether one was sent.
    pub(super) fn start_cancel(
        &self,
        now: u64,
        inv: &Transaction,
        ctx: &mut Transaction,
        out: &mut dyn FnMut(SocketAddr, &[u8]),
    ) -> bool {
        let (Some(down), Ok(req)) = (inv.downstream, SipMsg::parse(&inv.request)) else {
            return false;
        };
        build_hop_request(&req, "CANCEL", None, &mut ctx.request);
        ctx.start_client(now, down);
        send(out, down, &ctx.request);
        self.counters.inc(C::ReqFwd);
        true
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn forward_stateful(
        &self,
        now: u64,
        msg: &SipMsg<'_>,
        method: Method<'_>,
        keys: (u64, u32),
        upstream: SocketAddr,
        to: SocketAddr,
        edits: &RequestEdits<'_>,
        out: &mut dyn FnMut(SocketAddr, &[u8]),
    ) -> Action {
        let class = Class::of(method);
        let mut tx = Transaction::new(class, Some(upstream));
        // One right-sized allocation each instead of repeated growth.
        tx.request = Vec::with_capacity(msg.as_bytes().len() + 256);
        tx.last_response = Vec::with_capacity(512);
        if let Err(e) = forward_request(msg, edits, &mut tx.request) {
            return self.edit_failed(e);
        }
        if class == Class::Invite {
            build_response(msg, 100, "Trying", &[], None, &mut tx.last_response);
            send(out, upstream, &tx.last_response);
            self.counters.code(100);
        }
        tx.start_client(now, to);
        send(out, to, &tx.request);
        self.counters.inc(C::ReqFwd);
        self.insert_tx(TransactionKey::new(keys.0, class), tx);
        Action::Forwarded { copies: 1 }
    }

    pub(super) fn stateful_response(
        &self,
        now: u64,
        msg: &SipMsg<'_>,
        h: u64,
        class: Class,
        out: &mut dyn FnMut(SocketAddr, &[u8]),
    ) -> Option<Action> {
        let key = TransactionKey::new(h, class);
        let code = msg.status().unwrap_or(0);
        let mut sh = lock(self.shard(h));
        let mut start_cancel = false;
        let action = {
            let tx = sh.transactions.get_mut(&key)?;
            if class == Class::Cancel {
                // Response to our CANCEL: hop-by-hop, never forwarded.
                if code >= 200 {
                    tx.cancel_answered(now);
                }
                Action::Absorbed
            } else if code < 200 {
                start_cancel = tx.client_provisional(now);
                if code == 100 || tx.server != ServerState::Proceeding {
                    // 100 is hop-by-hop (RFC 3261 16.7): consumed, not a
                    // retransmission.
                    if code != 100 {
                        self.counters.inc(C::RetransAbsorbed);
                    }
                    Action::Absorbed
                } else {
                    match (tx.upstream, forward_response(msg, &mut tx.last_response)) {
                        (Some(up), Ok(_)) if sendable(&up) => {
                            send(out, up, &tx.last_response);
                            self.counters.inc(C::RespFwd);
                            Action::Forwarded { copies: 1 }
                        }
                        _ => Action::Dropped(DropReason::UnroutableResponse),
                    }
                }
            } else if tx.client == ClientState::Done {
                // Retransmitted final response.
                if class == Class::Invite && code >= 300 {
                    if let (Some(d), Ok(req)) = (tx.downstream, SipMsg::parse(&tx.request)) {
                        with_scratch(|buf| {
                            build_hop_request(&req, "ACK", Some(msg), buf);
                            send(out, d, buf);
                        });
                    }
                    self.counters.inc(C::RetransAbsorbed);
                    Action::Absorbed
                } else if class == Class::Invite {
                    self.forward_up(tx.upstream, msg, out)
                } else {
                    self.counters.inc(C::RetransAbsorbed);
                    Action::Absorbed
                }
            } else {
                tx.client_final();
                if class == Class::Invite && code >= 300 {
                    if let (Some(d), Ok(req)) = (tx.downstream, SipMsg::parse(&tx.request)) {
                        with_scratch(|buf| {
                            build_hop_request(&req, "ACK", Some(msg), buf);
                            send(out, d, buf);
                        });
                    }
                }
                if tx.server != ServerState::Proceeding {
                    if class == Class::Invite && code < 300 {
                        self.forward_up(tx.upstream, msg, out)
                    } else {
                        Action::Absorbed
                    }
                } else {
                    let a = match (tx.upstream, forward_response(msg, &mut tx.last_response)) {
                        (Some(up), Ok(_)) if sendable(&up) => {
                            send(out, up, &tx.last_response);
                            self.counters.inc(C::RespFwd);
                            Action::Forwarded { copies: 1 }
                        }
                        _ => Action::Dropped(DropReason::UnroutableResponse),
                    };
                    if class == Class::Invite && code < 300 {
                        tx.accept(now);
                    } else {
                        tx.complete(now, code);
                    }
                    a
                }
            }
        };
        if let Action::Dropped(d) = action {
            self.counters.drop(d);
        }
        if start_cancel {
            self.spawn_cancel(&mut sh, now, h, None, out);
        }
        sh.schedule(key);
        Some(action)
    }

    pub(super) fn forward_up(
        &self,
        up: Option<SocketAddr>,
        msg: &SipMsg<'_>,
        out: &mut dyn FnMut(SocketAddr, &[u8]),
    ) -> Action {
        match up {
            Some(up) if sendable(&up) => with_scratch(|buf| match forward_response(msg, buf) {
                Ok(_) => {
                    send(out, up, buf);
                    self.counters.inc(C::RespFwd);
                    Action::Forwarded { copies: 1 }
                }
                Err(_) => Action::Dropped(DropReason::MalformedResponse),
            }),
            _ => Action::Dropped(DropReason::UnroutableResponse),
        }
    }

    /// Send a CANCEL for the INVITE transaction `h` (creating or updating
    /// the CANCEL transaction entry).
    pub(super) fn spawn_cancel(
        &self,
        sh: &mut Shard,
        now: u64,
        h: u64,
        upstream: Option<SocketAddr>,
        out: &mut dyn FnMut(SocketAddr, &[u8]),
    ) {
        let ckey = TransactionKey::new(h, Class::Cancel);
        let mut ctx = sh.transactions.remove(&ckey).unwrap_or_else(|| {
            self.active.fetch_add(1, Ordering::Relaxed);
            self.counters.inc(C::TxCreated);
            Transaction::new_cancel(now, upstream)
        });
        if let Some(inv) = sh.transactions.get(&TransactionKey::new(h, Class::Invite)) {
            self.start_cancel(now, inv, &mut ctx, out);
        }
        sh.transactions.insert(ckey, ctx);
        sh.schedule(ckey);
    }
}

/// Build a hop-by-hop CANCEL or ACK from the request we forwarded (RFC 3261
/// 9.1 / 17.1.1.3): same Request-URI, top Via, Route, Call-ID, From, CSeq
/// number; To from `resp` for ACK.
pub(super) fn build_hop_request(
    req: &SipMsg<'_>,
    method: &str,
    resp: Option<&SipMsg<'_>>,
    out: &mut Vec<u8>,
) {
    out.clear();
    let head = req.head();
    out.extend_from_slice(method.as_bytes());
    out.push(b' ');
    out.extend_from_slice(req.request_uri().unwrap_or("").as_bytes());
    out.extend_from_slice(b" SIP/2.0\r\n");
    if let Some(v) = req.top_via() {
        out.extend_from_slice(b"Via: ");
        out.extend_from_slice(v.raw.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    for h in req.header_positions() {
        let line = &head[h.line_start as usize..h.value_end as usize];
        match h.kind {
            HeaderKind::Route | HeaderKind::From | HeaderKind::CallId => {
                out.extend_from_slice(line.as_bytes());
                out.extend_from_slice(b"\r\n");
            }
            HeaderKind::To => {
                let to_line = resp
                    .and_then(|r| {
                        r.header_positions()
                            .iter()
                            .find(|x| x.kind == HeaderKind::To)
                            .map(|x| &r.head()[x.line_start as usize..x.value_end as usize])
                    })
                    .unwrap_or(line);
                out.extend_from_slice(to_line.as_bytes());
                out.extend_from_slice(b"\r\n");
            }
            _ => {}
        }
    }
    let _ = write!(
        out,
        "CSeq: {} {method}\r\nMax-Forwards: 70\r\nContent-Length: 0\r\n\r\n",
        req.cseq().map_or(0, |c| c.0)
    );
}

/// A response to the original request, built from our forwarded copy by
/// leaving out our own (top) Via.
pub(super) fn build_response_below_top_via(
    req: &SipMsg<'_>,
    code: u16,
    reason: &str,
    out: &mut Vec<u8>,
) {
    let mut tmp = Vec::new();
    build_response(req, code, reason, &[], Some("rw-timeout"), &mut tmp);
    match SipMsg::parse(&tmp) {
        Ok(m) => {
            if forward_response(&m, out).is_err() {
                out.clear();
            }
        }
        Err(_) => out.clear(),
    }
}
