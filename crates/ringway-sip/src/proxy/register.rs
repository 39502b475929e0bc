//! REGISTER to our registrar (RFC 3261 10.3): the rules, applied here in
//! the core, and the glue to the [`LocationStore`](crate::registrar::LocationStore)
//! (which only stores, and may fail).
//!
//! - Owner: with authentication on, only the authenticated user whose name
//!   is the AOR's user part may change the AOR's bindings (step 6); anyone
//!   else gets `403`. Without authentication anyone can (documented).
//! - Expires: per contact the `expires` parameter, else the Expires
//!   header, else the default; a non-zero value under `min_expires` gets
//!   `423 Interval Too Brief` with `Min-Expires`; above `max_expires` it is
//!   shortened (step 7).
//! - Ordering (step 7): a contact already bound by a REGISTER with the
//!   same Call-ID and a higher CSeq is out of order: the whole request
//!   fails (`400`), nothing is changed. The same CSeq again is a
//!   retransmission and re-applies the same change (a stateless proxy sees
//!   those). A different Call-ID replaces the binding.
//! - `Contact: *` needs `Expires: 0` and no other Contact (else `400`) and
//!   removes every binding of the AOR, under the same ordering rule.
//! - At most `max_contacts` bindings per AOR: a REGISTER that would bind
//!   more is refused (`403`), nothing is changed.

use super::auth::Identity;
use super::outcome::Action;
use super::worker::{ProxyWorker, Request};
use super::Proxy;
use crate::msg::{parse_delta, SipMsg};
use crate::registrar::{Binding, StoreError};
use std::net::SocketAddr;

/// Default registration lifetime when none is requested (s).
pub const DEFAULT_EXPIRES: u32 = 3600;
/// Longest registration accepted by default (s); longer requests are shortened.
pub const MAX_EXPIRES: u32 = 86400;

const NS_PER_SECOND: u64 = 1_000_000_000;

/// A REGISTER we answer with an error.
struct Refusal {
    code: u16,
    reason: &'static str,
    extra_headers: Vec<(&'static str, String)>,
}

impl Refusal {
    fn new(code: u16, reason: &'static str) -> Refusal {
        Refusal {
            code,
            reason,
            extra_headers: Vec::new(),
        }
    }

    fn store(error: StoreError) -> Refusal {
        match error {
            StoreError::Full => Refusal {
                code: 503,
                reason: "Service Unavailable - Location Store Full",
                extra_headers: vec![("Retry-After", "60".into())],
            },
            StoreError::TooManyContacts => Refusal::new(403, "Forbidden - Too Many Contacts"),
            StoreError::Unavailable => {
                Refusal::new(500, "Server Internal Error - Location Store Unavailable")
            }
        }
    }
}

/// One change a REGISTER makes.
enum Change<'m> {
    /// Bind (or refresh) this contact for this many seconds.
    Bind { contact: &'m str, expires: u32 },
    /// Remove this contact.
    Unbind(&'m str),
    /// Remove every contact (`Contact: *`).
    UnbindAll,
}

impl ProxyWorker<'_> {
    /// Update the To AOR's bindings and answer 200 listing them all (or
    /// the error). `identity`: the user authenticated for this request.
    pub(super) fn register(
        &mut self,
        request: &Request<'_>,
        identity: Option<&Identity>,
        out: &mut dyn FnMut(SocketAddr, &[u8]),
    ) -> Action {
        let now = request.now;
        let proxy = self.proxy();
        let result = proxy
            .update_bindings(request.msg, identity, now)
            .and_then(|aor| proxy.store.lookup(&aor, now).map_err(Refusal::store));
        let bindings = match result {
            Ok(bindings) => bindings,
            Err(refusal) => {
                let headers: Vec<(&str, &str)> = refusal
                    .extra_headers
                    .iter()
                    .map(|(name, value)| (*name, value.as_str()))
                    .collect();
                return self.local_final(request, refusal.code, refusal.reason, &headers, out);
            }
        };
        let contacts: Vec<String> = bindings
            .iter()
            .map(|binding| {
                let left = binding
                    .expires_at
                    .saturating_sub(now)
                    .div_ceil(NS_PER_SECOND);
                format!("<{}>;expires={left}", binding.contact)
            })
            .collect();
        let extra: Vec<(&str, &str)> = contacts
            .iter()
            .map(|contact| ("Contact", contact.as_str()))
            .collect();
        self.local_final(request, 200, "OK", &extra, out)
    }
}

impl Proxy {
    /// Apply a REGISTER to the store under the registrar rules; returns
    /// the AOR (the user alone at our domain, else `user@host`).
    fn update_bindings(
        &self,
        msg: &SipMsg<'_>,
        identity: Option<&Identity>,
        now: u64,
    ) -> Result<String, Refusal> {
        let policy = self.config.registrar_policy;
        let to = msg.to().ok_or(Refusal::new(400, "Bad Request - To"))?;
        let to_uri = to
            .sip_uri()
            .ok_or(Refusal::new(404, "Not Found - AOR Not SIP"))?;
        let user = to_uri
            .user
            .ok_or(Refusal::new(404, "Not Found - AOR Has No User"))?;
        if identity.is_some_and(|identity| identity.username != user) {
            return Err(Refusal::new(403, "Forbidden - Not The Owner Of This AOR"));
        }
        let aor: String = if self.host_is_ours(to_uri.host, None) {
            user.to_owned()
        } else {
            format!("{user}@{}", to_uri.host.to_ascii_lowercase())
        };
        let changes = registration_changes(msg, policy)?;
        if changes.is_empty() {
            return Ok(aor);
        }
        let call_id = msg.call_id().unwrap_or("");
        let cseq = msg.cseq().map_or(0, |c| c.0);
        let existing = self.store.lookup(&aor, now).map_err(Refusal::store)?;
        // Ordering (10.3 step 7): nothing is changed if any change is out
        // of order.
        let out_of_order = |contact: Option<&str>| {
            existing.iter().any(|binding| {
                contact.is_none_or(|c| c == binding.contact)
                    && binding.call_id == call_id
                    && binding.cseq > cseq
            })
        };
        let mut bound_after = existing.len();
        for change in &changes {
            let contact = match change {
                Change::Bind { contact, .. } | Change::Unbind(contact) => Some(*contact),
                Change::UnbindAll => None,
            };
            if out_of_order(contact) {
                return Err(Refusal::new(400, "Bad Request - CSeq Out Of Order"));
            }
            let known = |c: &str| existing.iter().any(|binding| binding.contact == c);
            match change {
                Change::Bind { contact, .. } if !known(contact) => bound_after += 1,
                Change::Unbind(contact) if known(contact) => {
                    bound_after = bound_after.saturating_sub(1)
                }
                Change::UnbindAll => bound_after = 0,
                _ => {}
            }
        }
        if bound_after > policy.max_contacts {
            return Err(Refusal::new(403, "Forbidden - Too Many Contacts"));
        }
        for change in changes {
            match change {
                Change::UnbindAll => self.store.remove(&aor, None),
                Change::Unbind(contact) => self.store.remove(&aor, Some(contact)),
                Change::Bind { contact, expires } => self.store.put(
                    &aor,
                    Binding {
                        contact: contact.to_owned(),
                        expires_at: now + u64::from(expires) * NS_PER_SECOND,
                        call_id: call_id.to_owned(),
                        cseq,
                    },
                ),
            }
            .map_err(Refusal::store)?;
        }
        Ok(aor)
    }
}

/// The changes a REGISTER asks for (empty: a query), with the Expires
/// bounds applied.
fn registration_changes<'m>(
    msg: &SipMsg<'m>,
    policy: super::config::RegistrarPolicy,
) -> Result<Vec<Change<'m>>, Refusal> {
    let header_expires = msg.expires();
    if msg.contact_star() {
        if header_expires != Some(0) || msg.contact().next().is_some() {
            return Err(Refusal::new(400, "Bad Request - Contact * Needs Expires 0"));
        }
        return Ok(vec![Change::UnbindAll]);
    }
    let mut changes: Vec<Change<'m>> = Vec::new();
    for contact in msg.contact() {
        let expires = contact
            .param("expires")
            .flatten()
            .and_then(parse_delta)
            .or(header_expires)
            .unwrap_or(policy.default_expires);
        let duplicate = changes.iter().any(|change| {
            matches!(change, Change::Bind { contact: c, .. } | Change::Unbind(c) if *c == contact.uri)
        });
        if duplicate {
            continue;
        }
        if expires == 0 {
            changes.push(Change::Unbind(contact.uri));
        } else if expires < policy.min_expires {
            return Err(Refusal {
                code: 423,
                reason: "Interval Too Brief",
                extra_headers: vec![("Min-Expires", policy.min_expires.to_string())],
            });
        } else {
            changes.push(Change::Bind {
                contact: contact.uri,
                expires: expires.min(policy.max_expires),
            });
        }
    }
    Ok(changes)
}
