//! REGISTER to our registrar (RFC 3261 10.3): the glue between a request
//! and the [`LocationStore`](crate::registrar::LocationStore).

use super::outcome::Action;
use super::worker::{ProxyWorker, Request};
use super::Proxy;
use crate::msg::{parse_delta, SipMsg};
use std::net::SocketAddr;

/// Default registration lifetime when none is requested (s).
pub const DEFAULT_EXPIRES: u32 = 3600;
/// Longest registration accepted (s); longer requests are shortened.
pub const MAX_EXPIRES: u32 = 86400;

const NS_PER_SECOND: u64 = 1_000_000_000;

/// A REGISTER we answer with an error.
struct Refusal {
    code: u16,
    reason: &'static str,
    extra_headers: &'static [(&'static str, &'static str)],
}

impl Refusal {
    const fn new(code: u16, reason: &'static str) -> Refusal {
        Refusal {
            code,
            reason,
            extra_headers: &[],
        }
    }
}

impl ProxyWorker<'_> {
    /// Update the To AOR's bindings and answer 200 listing them all (or
    /// the error).
    pub(super) fn register(
        &mut self,
        request: &Request<'_>,
        out: &mut dyn FnMut(SocketAddr, &[u8]),
    ) -> Action {
        let now = request.now;
        let aor = match self.proxy().update_bindings(request.msg, now) {
            Ok(aor) => aor,
            Err(refusal) => {
                let Refusal {
                    code,
                    reason,
                    extra_headers,
                } = refusal;
                return self.local_final(request, code, reason, extra_headers, out);
            }
        };
        let bindings = self.proxy().store.lookup(&aor, now);
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
    /// Apply a REGISTER's Contacts to the store; returns the AOR (the user
    /// alone at our domain, else `user@host`).
    fn update_bindings(&self, msg: &SipMsg<'_>, now: u64) -> Result<String, Refusal> {
        let to = msg.to().ok_or(Refusal::new(400, "Bad Request - To"))?;
        let to_uri = to
            .sip_uri()
            .ok_or(Refusal::new(404, "Not Found - AOR Not SIP"))?;
        let user = to_uri
            .user
            .ok_or(Refusal::new(404, "Not Found - AOR Has No User"))?;
        let aor: String = if self.host_is_ours(to_uri.host, None) {
            user.to_owned()
        } else {
            format!("{user}@{}", to_uri.host.to_ascii_lowercase())
        };
        let header_expires = msg.expires();
        if msg.contact_star() {
            if header_expires != Some(0) || msg.contact().next().is_some() {
                return Err(Refusal::new(400, "Bad Request - Contact * Needs Expires 0"));
            }
            self.store.remove(&aor, None);
            return Ok(aor);
        }
        for contact in msg.contact() {
            let expires = contact
                .param("expires")
                .flatten()
                .and_then(parse_delta)
                .or(header_expires)
                .unwrap_or(DEFAULT_EXPIRES)
                .min(MAX_EXPIRES);
            if expires == 0 {
                self.store.remove(&aor, Some(contact.uri));
            } else if self
                .store
                .put(&aor, contact.uri, now + u64::from(expires) * NS_PER_SECOND)
                .is_err()
            {
                return Err(Refusal {
                    code: 503,
                    reason: "Service Unavailable - Location Store Full",
                    extra_headers: &[("Retry-After", "60")],
                });
            }
        }
        Ok(aor)
    }
}
