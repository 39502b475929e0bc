//! REGISTER to our registrar (RFC 3261 10.3): the rules that depend on
//! the request alone, applied here, and one [`Registration`] handed to the
//! [`LocationStore`](crate::registrar::LocationStore), which applies it
//! atomically with the rules that depend on what is stored (ordering,
//! contacts per AOR: [`apply_registration`](crate::registrar::apply_registration)).
//! A store that cannot answer gets the REGISTER `500` with `Retry-After`.
//!
//! - AOR: `user@domain`, the To user percent-decoded at its canonical
//!   served domain (our IP stands for the first domain): `alice@a.test`
//!   and `alice@b.test` are two AORs. A To domain we do not serve gets
//!   `403` (we are not its registrar).
//! - Owner: with authentication on, only the authenticated user whose name
//!   is the AOR's user part, in the AOR's realm, may change the AOR's
//!   bindings (step 6); anyone else gets `403`. Without authentication
//!   anyone can (documented).
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
//! - Path (RFC 3327 5.3): the REGISTER's Path values are stored with every
//!   binding it sets (requests to the contact are then sent through them)
//!   and echoed in the `200` when the UA lists `path` in Supported.
//! - The `200` lists the AOR's bindings; to an unauthenticated REGISTER
//!   only as many as keep it within
//!   [`AMPLIFICATION_LIMIT`](super::AMPLIFICATION_LIMIT) times the
//!   request's size (a small query must not fetch kilobytes towards a
//!   spoofed source).

use super::auth::Identity;
use super::deferred::StoreCall;
use super::outcome::Action;
use super::request_context::Request;
use super::stats::Counter;
use super::worker::ProxyWorker;
use super::Proxy;
use crate::msg::{parse_delta, SipMsg};
use crate::registrar::{BindingChange, Outbound, Registration, StoreError, StoreQuery};
use crate::text::CommaSplit;
use crate::transport::Hop;

/// Default registration lifetime when none is requested (s).
pub const DEFAULT_EXPIRES: u32 = 3600;
/// Longest registration accepted by default (s); longer requests are shortened.
pub const MAX_EXPIRES: u32 = 86400;
/// `Retry-After` (s) of a `500` to a REGISTER while the location store is
/// unavailable.
pub const STORE_RETRY_AFTER: u32 = 5;

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
            StoreError::OutOfOrder => Refusal::new(400, "Bad Request - CSeq Out Of Order"),
            StoreError::Unavailable => Refusal {
                code: 500,
                reason: "Server Internal Error - Location Store Unavailable",
                extra_headers: vec![("Retry-After", STORE_RETRY_AFTER.to_string())],
            },
        }
    }
}

impl ProxyWorker<'_> {
    /// Update the To AOR's bindings and answer 200 listing them all (or
    /// the error). `identity`: the user authenticated for this request.
    pub(super) fn register(
        &mut self,
        request: &Request<'_>,
        identity: Option<&Identity>,
        out: &mut dyn FnMut(Hop, &[u8]),
    ) -> Action {
        let now = request.now;
        let result = match self
            .proxy()
            .registration(request.msg, request.from, identity)
        {
            Ok(registration) => {
                match self.store_call(request, StoreQuery::Register(registration)) {
                    StoreCall::Deferred => return Action::Deferred,
                    StoreCall::Answered(answer) => answer.map_err(|error| {
                        if error == StoreError::Unavailable {
                            self.stripe.add(Counter::StoreUnavailableRegisters);
                        }
                        Refusal::store(error)
                    }),
                }
            }
            Err(refusal) => Err(refusal),
        };
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
        // RFC 3327 5.3: the Path stored is echoed to a UA that supports it.
        let mut extra: Vec<(&str, String)> = Vec::new();
        if supports(request.msg, "path") {
            extra.extend(path_values(request.msg).map(|hop| ("Path", hop.to_owned())));
        }
        // RFC 5626 5.2 and 6: a REGISTER that asked for outbound is told
        // it got it, and how often to send keepalives on its flow.
        let outbound = supports(request.msg, "outbound")
            && bindings.iter().any(|binding| binding.outbound.is_some());
        if outbound {
            extra.push(("Require", "outbound".to_owned()));
            if let Some(seconds) = self.proxy().config.flow_timer {
                extra.push(("Flow-Timer", seconds.to_string()));
            }
        }
        // What the response holds besides the Contacts is at most the
        // request's size plus the status line, To-tag and Content-Length.
        let request_len = request.msg.as_bytes().len();
        let fixed = request_len
            + 96
            + extra
                .iter()
                .map(|(name, value)| name.len() + value.len() + 4)
                .sum::<usize>();
        let mut budget = match identity {
            Some(_) => usize::MAX,
            None => (super::AMPLIFICATION_LIMIT * request_len).saturating_sub(fixed),
        };
        for binding in &bindings {
            let left = binding
                .expires_at
                .saturating_sub(now)
                .div_ceil(NS_PER_SECOND);
            let value = match &binding.outbound {
                Some(o) => format!(
                    "<{}>;expires={left};+sip.instance=\"{}\";reg-id={}",
                    binding.contact, o.instance, o.reg_id
                ),
                None => format!("<{}>;expires={left}", binding.contact),
            };
            let cost = "Contact: \r\n".len() + value.len();
            if cost > budget {
                break;
            }
            budget -= cost;
            extra.push(("Contact", value));
        }
        let extra: Vec<(&str, &str)> = extra
            .iter()
            .map(|(name, value)| (*name, value.as_str()))
            .collect();
        self.local_final(request, 200, "OK", &extra, out)
    }
}

impl Proxy {
    /// What a REGISTER asks of the store, with the rules that do not
    /// depend on the stored bindings applied (owner, Expires bounds,
    /// `Contact: *`). The AOR is `user@domain` ([`Proxy::aor`]).
    fn registration(
        &self,
        msg: &SipMsg<'_>,
        from: Hop,
        identity: Option<&Identity>,
    ) -> Result<Registration, Refusal> {
        let policy = self.config.registrar_policy;
        let to = msg.to().ok_or(Refusal::new(400, "Bad Request - To"))?;
        let to_uri = to
            .sip_uri()
            .ok_or(Refusal::new(404, "Not Found - AOR Not SIP"))?;
        let user = to_uri
            .user
            .ok_or(Refusal::new(404, "Not Found - AOR Has No User"))?;
        let aor = self
            .aor(user, to_uri.host)
            .ok_or(Refusal::new(403, "Forbidden - Not Our Domain"))?;
        if identity
            .is_some_and(|identity| super::routing::canonical_user(user) != identity.username)
        {
            return Err(Refusal::new(403, "Forbidden - Not The Owner Of This AOR"));
        }
        // Path is stored with every binding: bounded in bytes (review S9).
        if path_values(msg).map(str::len).sum::<usize>() > policy.max_path_bytes {
            return Err(Refusal::new(400, "Bad Request - Path Too Long"));
        }
        let changes = registration_changes(msg, policy, supports(msg, "outbound"))?;
        Ok(Registration {
            aor,
            call_id: msg.call_id().unwrap_or("").to_owned(),
            cseq: msg.cseq().map_or(0, |c| c.0),
            path: path_values(msg).map(str::to_owned).collect(),
            // The flow it came in on: always a connection's; a datagram's
            // source address with NAT handling on when the REGISTER came
            // through a NAT (else requests go to the Contact's address).
            flow: (from.transport.is_reliable() || self.config.nat && behind_nat(from, &changes))
                .then_some(from),
            changes,
            max_contacts: policy.max_contacts,
        })
    }
}

/// Whether a UDP REGISTER from `from` binding `changes` came through a
/// NAT: it asked for RFC 5626 outbound, or a contact it binds does not
/// name the source IP (a name, or another address: the private side of a
/// NAT). A contact at the source IP on another port is the UA's own
/// listening port (or a third party on that host), not a NAT mapping.
fn behind_nat(from: Hop, changes: &[BindingChange]) -> bool {
    changes.iter().any(|change| match change {
        BindingChange::Bind {
            contact, outbound, ..
        } => {
            outbound.is_some()
                || crate::uri::SipUri::parse(contact)
                    .is_none_or(|uri| uri.host_ip() != Some(from.addr.ip()))
        }
        _ => false,
    })
}

/// The Path values of a message, topmost first.
fn path_values<'s, 'm: 's>(msg: &'s SipMsg<'m>) -> impl Iterator<Item = &'m str> + 's {
    msg.header("Path")
        .flat_map(CommaSplit::new)
        .map(str::trim)
        .filter(|hop| !hop.is_empty())
}

/// Whether the request's Supported (or Require) lists option `tag`.
pub(super) fn supports(msg: &SipMsg<'_>, option: &str) -> bool {
    msg.header("Supported")
        .chain(msg.header("Require"))
        .flat_map(CommaSplit::new)
        .any(|tag| tag.trim().eq_ignore_ascii_case(option))
}

/// Longest `+sip.instance` value stored (bytes): a URN of a UUID is 45.
const MAX_INSTANCE_BYTES: usize = 128;

/// A Contact's RFC 5626 `+sip.instance` and `reg-id` (both present and
/// well-formed), else `None`.
fn outbound_of(contact: &crate::uri::NameAddr<'_>) -> Option<Outbound> {
    let instance = contact.param("+sip.instance").flatten()?;
    let instance = instance.trim_matches('"');
    let reg_id = contact.param("reg-id").flatten()?.parse::<u32>().ok()?;
    let sane = !instance.is_empty()
        && instance.len() <= MAX_INSTANCE_BYTES
        && instance
            .bytes()
            .all(|b| b.is_ascii_graphic() && b != b'"' && b != b'\\');
    sane.then(|| Outbound {
        instance: instance.to_owned(),
        reg_id,
    })
}

/// The changes a REGISTER asks for (empty: a query), with the Expires
/// bounds applied.
fn registration_changes(
    msg: &SipMsg<'_>,
    policy: super::config::RegistrarPolicy,
    outbound: bool,
) -> Result<Vec<BindingChange>, Refusal> {
    let header_expires = msg.expires();
    if msg.contact_star() {
        if header_expires != Some(0) || msg.contact().next().is_some() {
            return Err(Refusal::new(400, "Bad Request - Contact * Needs Expires 0"));
        }
        return Ok(vec![BindingChange::UnbindAll]);
    }
    let mut changes: Vec<BindingChange> = Vec::new();
    for contact in msg.contact() {
        let expires = contact
            .param("expires")
            .flatten()
            .and_then(parse_delta)
            .or(header_expires)
            .unwrap_or(policy.default_expires);
        // RFC 3261 10.3 step 6 takes the Contacts in order; a contact
        // listed twice is bound by its first appearance only.
        let duplicate = changes.iter().any(|change| {
            matches!(change, BindingChange::Bind { contact: c, .. } | BindingChange::Unbind { contact: c } if c == contact.uri)
        });
        if duplicate {
            continue;
        }
        // A binding becomes a Request-URI: one that would not parse as
        // one (a control character, a bad scheme) is refused here, not
        // sent on to the callee later.
        if expires != 0 && crate::msg::check_request_uri(contact.uri).is_err() {
            return Err(Refusal::new(400, "Bad Request - Invalid Contact"));
        }
        if expires == 0 {
            changes.push(BindingChange::Unbind {
                contact: contact.uri.to_owned(),
            });
        } else if expires < policy.min_expires {
            // Refuse rather than round up (RFC 3261 10.3 step 6): the UA
            // learns Min-Expires and retries, and our refresh load stays
            // what the operator set.
            return Err(Refusal {
                code: 423,
                reason: "Interval Too Brief",
                extra_headers: vec![("Min-Expires", policy.min_expires.to_string())],
            });
        } else {
            changes.push(BindingChange::Bind {
                contact: contact.uri.to_owned(),
                // Above the maximum: shortened silently, as the RFC allows;
                // the 200's Contact tells the UA what it got.
                expires: expires.min(policy.max_expires),
                outbound: outbound.then(|| outbound_of(&contact)).flatten(),
            });
        }
    }
    Ok(changes)
}
