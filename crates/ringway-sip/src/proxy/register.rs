//! REGISTER handling (the registrar glue).

#![allow(unused_imports)]
use super::*;

/// Default registration lifetime when none is requested (s).
pub const DEFAULT_EXPIRES: u32 = 3600;
/// Longest registration accepted (s); longer requests are shortened.
pub const MAX_EXPIRES: u32 = 86400;

impl Proxy {
    // ---------------------------------------------------------------- registrar

    pub(super) fn register(
        &self,
        now: u64,
        msg: &SipMsg<'_>,
        keys: (u64, u32),
        upstream: SocketAddr,
        out: &mut dyn FnMut(SocketAddr, &[u8]),
    ) -> Action {
        let Some(to) = msg.to() else {
            return self.local_final(now, msg, keys, upstream, 400, "Bad Request - To", &[], out);
        };
        let Some(tu) = to.sip_uri() else {
            return self.local_final(
                now,
                msg,
                keys,
                upstream,
                404,
                "Not Found - AOR Not SIP",
                &[],
                out,
            );
        };
        let Some(user) = tu.user else {
            return self.local_final(
                now,
                msg,
                keys,
                upstream,
                404,
                "Not Found - AOR Has No User",
                &[],
                out,
            );
        };
        let aor: String = if self.host_is_ours(tu.host, None) {
            user.to_owned()
        } else {
            format!("{user}@{}", tu.host.to_ascii_lowercase())
        };
        let hdr_exp = msg.expires();
        if msg.contact_star() {
            if hdr_exp != Some(0) || msg.contact().next().is_some() {
                return self.local_final(
                    now,
                    msg,
                    keys,
                    upstream,
                    400,
                    "Bad Request - Contact * Needs Expires 0",
                    &[],
                    out,
                );
            }
            self.store.remove(&aor, None);
        } else {
            for c in msg.contact() {
                let exp = c
                    .param("expires")
                    .flatten()
                    .and_then(crate::msg::parse_delta)
                    .or(hdr_exp)
                    .unwrap_or(DEFAULT_EXPIRES)
                    .min(MAX_EXPIRES);
                if exp == 0 {
                    self.store.remove(&aor, Some(c.uri));
                } else if self
                    .store
                    .put(&aor, c.uri, now + u64::from(exp) * 1_000_000_000)
                    .is_err()
                {
                    return self.local_final(
                        now,
                        msg,
                        keys,
                        upstream,
                        503,
                        "Service Unavailable - Location Store Full",
                        &[("Retry-After", "60")],
                        out,
                    );
                }
            }
        }
        let bindings = self.store.lookup(&aor, now);
        let contacts: Vec<String> = bindings
            .iter()
            .map(|b| {
                let left = b.expires_at.saturating_sub(now).div_ceil(1_000_000_000);
                format!("<{}>;expires={left}", b.contact)
            })
            .collect();
        let extra: Vec<(&str, &str)> = contacts.iter().map(|c| ("Contact", c.as_str())).collect();
        self.local_final(now, msg, keys, upstream, 200, "OK", &extra, out)
    }
}
