//! Digest authentication in the proxy (RFC 3261 22.2, 22.3; RFC 7616;
//! RFC 8760). With `auth` configured:
//!
//! - a REGISTER for our registrar must carry `Authorization` for the realm
//!   (else `401` with one `WWW-Authenticate` per algorithm);
//! - any other request whose From host is one of ours must carry
//!   `Proxy-Authorization` (else `407` with `Proxy-Authenticate`), and its
//!   From user must be the authenticated user;
//! - a request neither from nor to our domains is refused (`403 Not
//!   Relaying`, as Kamailio's default configuration does), so that
//!   changing the From domain does not turn the proxy into an open relay;
//! - never challenged: ACK and CANCEL (they cannot be, RFC 3261 22.1; the
//!   relay policy then decides where they may go), requests inside a
//!   dialog we Record-Routed (To tag and our Route on top carrying our
//!   signature for that dialog), OPTIONS to the proxy itself
//!   (keep-alives), and requests from other domains to ours (incoming
//!   calls).
//!
//! Identities are compared canonically: the From host is ours whatever
//! its port or a trailing dot, users are compared percent-decoded.
//!
//! Verification: credentials for our realm that do not parse get `400`; a
//! digest-uri other than the Request-URI gets `400` (RFC 2617 3.2.2.5);
//! `qop=auth` is required (it carries the `nc` replays are detected by);
//! an unknown algorithm or a nonce that is not ours (another key, another
//! realm, forged) gets a new challenge; an unknown user or a wrong
//! response gets `403`; a correct response with an expired nonce gets a
//! new challenge with `stale=true`; a (nonce, nc) already used by another
//! request gets a new challenge (the same request, byte for byte, from the
//! same source, retransmitted, passes; a copy from elsewhere does not).
//! An unknown user costs the same hashing as a known one (a dummy HA1), so
//! the time to answer does not tell which users exist.

use super::outcome::Action;
use super::request_context::Request;
use super::routing::{RoutePlan, Target};
use super::stats::Counter;
use super::worker::ProxyWorker;
use super::Proxy;
use crate::auth::{
    Algorithm, CredentialStore, Credentials, NonceCheck, NonceKey, ReplayCheck, ReplayTable,
};
use crate::msg::Method;
use crate::transport::Hop;
use crate::uri::SipUri;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, PoisonError, RwLock};

use super::config::AuthConfig;

/// The authentication state shared by all workers: configuration, the
/// nonce key (a reload may replace it), the credential store, the replay
/// table and the last nonce id.
pub(super) struct Authenticator {
    config: AuthConfig,
    key: RwLock<NonceKey>,
    credentials: Option<Arc<dyn CredentialStore>>,
    replays: ReplayTable,
    last_nonce: AtomicU64,
}

impl Authenticator {
    pub(super) fn new(config: AuthConfig) -> Authenticator {
        Authenticator {
            replays: ReplayTable::new(config.replay_capacity),
            key: RwLock::new(config.key.clone()),
            config,
            credentials: None,
            last_nonce: AtomicU64::new(0),
        }
    }

    /// Sign nonces with `key` from now on; nonces of the old key get a new
    /// challenge.
    pub(super) fn set_key(&self, key: NonceKey) {
        *self.key.write().unwrap_or_else(PoisonError::into_inner) = key;
    }

    fn key(&self) -> NonceKey {
        self.key
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The nonce clock at the driver's `now`: `now` shifted by the
    /// configured offset (the wall clock, so proxies sharing a key agree
    /// on a nonce's age).
    fn nonce_time(&self, now: u64) -> u64 {
        now.saturating_add(self.config.nonce_clock_offset)
    }

    /// A new nonce id: the nonce clock, or one above the last id if that
    /// is not below it. Ids grow with time in every proxy, so the replay
    /// table (which forgets the oldest ids first) orders the nonces of
    /// proxies sharing a key as it orders its own, and two proxies' ids
    /// do not collide.
    fn next_nonce_id(&self, time: u64) -> u64 {
        let mut last = self.last_nonce.load(Ordering::Relaxed);
        loop {
            let id = time.max(last.saturating_add(1));
            match self.last_nonce.compare_exchange_weak(
                last,
                id,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return id,
                Err(seen) => last = seen,
            }
        }
    }
}

/// A user whose credentials were verified for this request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Identity {
    /// The digest username.
    pub(super) username: String,
    /// The realm it was verified in.
    pub(super) realm: String,
}

/// Which challenge a request gets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Challenge {
    /// 401 / `Authorization` / `WWW-Authenticate` (registrar).
    Www,
    /// 407 / `Proxy-Authorization` / `Proxy-Authenticate` (proxy).
    Proxy,
}

impl Challenge {
    fn credentials_header(self) -> &'static str {
        match self {
            Challenge::Www => "Authorization",
            Challenge::Proxy => "Proxy-Authorization",
        }
    }

    fn challenge_header(self) -> &'static str {
        match self {
            Challenge::Www => "WWW-Authenticate",
            Challenge::Proxy => "Proxy-Authenticate",
        }
    }

    fn status(self) -> (u16, &'static str) {
        match self {
            Challenge::Www => (401, "Unauthorized"),
            Challenge::Proxy => (407, "Proxy Authentication Required"),
        }
    }
}

/// What verifying credentials came to.
enum Verdict {
    Accepted(Identity),
    /// Challenge (again): `stale` (the nonce expired or was forgotten), or
    /// after a `replay`.
    Challenge {
        stale: bool,
        replay: bool,
    },
    /// Answer with this status.
    Refuse(u16, &'static str),
}

/// A first (or repeated) challenge: no stale nonce, no replay.
const NEW_CHALLENGE: Verdict = Verdict::Challenge {
    stale: false,
    replay: false,
};

/// The first credentials of `request` (in the header `challenge` asks
/// for) whose realm is `realm`; without any, a challenge, or `400` if some
/// credentials were malformed.
fn realm_credentials<'m>(
    request: &Request<'m>,
    challenge: Challenge,
    realm: &str,
) -> Result<Credentials<'m>, Verdict> {
    let mut malformed = false;
    for value in request.msg.header(challenge.credentials_header()) {
        match Credentials::parse(value) {
            Ok(credentials) if credentials.realm == realm => return Ok(credentials),
            Ok(_) => {}
            Err(_) => malformed = true,
        }
    }
    Err(if malformed {
        Verdict::Refuse(400, "Bad Request - Malformed Credentials")
    } else {
        NEW_CHALLENGE
    })
}

impl Proxy {
    /// Use `credentials` for digest authentication (with `auth` configured).
    pub fn set_credentials(&mut self, credentials: Arc<dyn CredentialStore>) {
        if let Some(auth) = &mut self.auth {
            auth.credentials = Some(credentials);
        }
    }

    /// Nonces whose `nc` the replay table tracks.
    pub fn auth_nonces_tracked(&self) -> usize {
        self.auth.as_ref().map_or(0, |auth| auth.replays.len())
    }

    /// Which challenge `request` needs, and in which realm; `Ok(None)`:
    /// none; `Err`: refused outright (not relaying).
    fn auth_requirement(
        &self,
        request: &Request<'_>,
        plan: &RoutePlan<'_>,
        target: &Target<'_>,
        auth: &AuthConfig,
    ) -> Result<Option<(Challenge, String)>, (u16, &'static str)> {
        let msg = request.msg;
        if matches!(request.method, Method::Ack | Method::Cancel)
            || matches!(target, Target::OptionsToUs)
            || plan.signed
        {
            return Ok(None);
        }
        let realm_of = |host: &str| {
            auth.realm
                .clone()
                .unwrap_or_else(|| host.strip_suffix('.').unwrap_or(host).to_ascii_lowercase())
        };
        if matches!(target, Target::Register) {
            let host = msg.to().and_then(|to| to.sip_uri()).map_or("", |u| u.host);
            return Ok(Some((Challenge::Www, realm_of(host))));
        }
        if let Some(from) = msg.from().and_then(|from| from.sip_uri()) {
            if self.is_our_host(from.host) {
                return Ok(Some((Challenge::Proxy, realm_of(from.host))));
            }
        }
        let to_us =
            SipUri::parse(plan.request_uri).is_some_and(|u| self.host_is_ours(u.host, u.port));
        if to_us {
            Ok(None)
        } else {
            Err((403, "Forbidden - Not Relaying"))
        }
    }

    /// Verify the credentials of `request` for `realm`.
    fn verify(
        &self,
        request: &Request<'_>,
        auth: &Authenticator,
        challenge: Challenge,
        realm: &str,
    ) -> Verdict {
        let msg = request.msg;
        let credentials = match realm_credentials(request, challenge, realm) {
            Ok(credentials) => credentials,
            Err(verdict) => return verdict,
        };
        if Some(credentials.uri) != msg.request_uri() {
            return Verdict::Refuse(400, "Bad Request - Digest URI Mismatch");
        }
        let (Some(nc), Some(nc_text), Some(cnonce)) =
            (credentials.nc, credentials.nc_text, credentials.cnonce)
        else {
            return Verdict::Refuse(400, "Bad Request - qop=auth Required");
        };
        let algorithm = credentials
            .algorithm
            .map_or(Some(Algorithm::Md5), Algorithm::from_token)
            .filter(|a| auth.config.algorithms.contains(a));
        let Some(algorithm) = algorithm else {
            return NEW_CHALLENGE;
        };
        let nonce = auth.key().check(
            credentials.nonce,
            realm,
            auth.nonce_time(request.now),
            auth.config.nonce_lifetime,
        );
        let id = match nonce {
            NonceCheck::Invalid => return NEW_CHALLENGE,
            NonceCheck::Fresh { id, .. } | NonceCheck::Stale { id } => id,
        };
        let ha1 = match auth
            .credentials
            .as_ref()
            .map(|store| store.ha1(credentials.username, realm, algorithm))
        {
            Some(Ok(Some(ha1))) => ha1,
            Some(Err(_)) => return Verdict::Refuse(500, "Server Internal Error - Credentials"),
            // Unknown user: the same answer as a wrong password, after the
            // same work (a response computed from a dummy HA1).
            Some(Ok(None)) | None => {
                let dummy = "0".repeat(algorithm.hex_len());
                let expected = algorithm.response(
                    &dummy,
                    credentials.nonce,
                    nc_text,
                    cnonce,
                    request.method.as_str(),
                    credentials.uri,
                );
                std::hint::black_box(expected.matches(credentials.response));
                return Verdict::Refuse(403, "Forbidden");
            }
        };
        let method = request.method.as_str();
        let expected = algorithm.response(
            ha1.as_str(),
            credentials.nonce,
            nc_text,
            cnonce,
            method,
            credentials.uri,
        );
        if !expected.matches(credentials.response) {
            return Verdict::Refuse(403, "Forbidden");
        }
        if matches!(nonce, NonceCheck::Stale { .. }) {
            return Verdict::Challenge {
                stale: true,
                replay: false,
            };
        }
        if let Some(verdict) = self.replay_verdict(request, auth, id, nc) {
            return verdict;
        }
        Verdict::Accepted(Identity {
            username: credentials.username.to_owned(),
            realm: realm.to_owned(),
        })
    }

    /// The answer to credentials that checked out but whose nonce count
    /// `nc` of nonce `id` was seen before: `None` for the first use or a
    /// retransmission, a new challenge for a replay or a forgotten nonce.
    fn replay_verdict(
        &self,
        request: &Request<'_>,
        auth: &Authenticator,
        id: u64,
        nc: u32,
    ) -> Option<Verdict> {
        // A retransmission is the same datagram from the same source: a
        // copy sent from elsewhere (or with another Route) is a replay.
        // Keyed: two datagrams that differ hash alike only by chance, which
        // nobody can aim for without the key.
        let copy = self
            .keys
            .mac(crate::hash::Purpose::Retransmission)
            .u64(request.keys.transaction)
            .addr(request.src)
            .raw(request.msg.as_bytes())
            .finish();
        match auth.replays.check(id, nc, copy) {
            ReplayCheck::New | ReplayCheck::Retransmission => None,
            ReplayCheck::Replay => Some(Verdict::Challenge {
                stale: false,
                replay: true,
            }),
            ReplayCheck::Forgotten => Some(Verdict::Challenge {
                stale: true,
                replay: false,
            }),
        }
    }

    /// The challenge headers (one per algorithm, in preference order).
    fn challenge_headers(
        &self,
        auth: &Authenticator,
        challenge: Challenge,
        realm: &str,
        now: u64,
        stale: bool,
    ) -> Vec<(&'static str, String)> {
        let time = auth.nonce_time(now);
        let id = auth.next_nonce_id(time);
        let nonce = auth.key().issue(time, id, realm);
        let realm = realm.replace(['"', '\\', '\r', '\n'], "");
        auth.config
            .algorithms
            .iter()
            .map(|algorithm| {
                let stale = if stale { ", stale=true" } else { "" };
                (
                    challenge.challenge_header(),
                    format!(
                        "Digest realm=\"{realm}\", nonce=\"{nonce}\", algorithm={algorithm}, qop=\"auth\"{stale}"
                    ),
                )
            })
            .collect()
    }
}

impl ProxyWorker<'_> {
    /// Authenticate `request` (going to `target`) if it needs it.
    /// `Ok(Some(identity))`: verified; `Ok(None)`: no authentication
    /// needed (or configured); `Err(action)`: challenged or refused.
    pub(super) fn authorize(
        &mut self,
        request: &Request<'_>,
        plan: &RoutePlan<'_>,
        target: &Target<'_>,
        out: &mut dyn FnMut(Hop, &[u8]),
    ) -> Result<Option<Identity>, Action> {
        let proxy = self.proxy();
        let Some(auth) = proxy.auth.as_ref() else {
            return Ok(None);
        };
        let (challenge, realm) = match proxy.auth_requirement(request, plan, target, &auth.config) {
            Ok(Some(requirement)) => requirement,
            Ok(None) => return Ok(None),
            Err((code, reason)) => {
                self.stripe.add(Counter::AuthRefused);
                return Err(self.local_final(request, code, reason, &[], out));
            }
        };
        match proxy.verify(request, auth, challenge, &realm) {
            Verdict::Accepted(identity) => {
                if challenge == Challenge::Proxy && !from_user_is(request, &identity.username) {
                    self.stripe.add(Counter::AuthRefused);
                    return Err(self.local_final(
                        request,
                        403,
                        "Forbidden - From Is Not The Authenticated User",
                        &[],
                        out,
                    ));
                }
                self.stripe.add(Counter::AuthAccepted);
                Ok(Some(identity))
            }
            Verdict::Refuse(code, reason) => {
                self.stripe.add(Counter::AuthRefused);
                Err(self.local_final(request, code, reason, &[], out))
            }
            Verdict::Challenge { stale, replay } => {
                if stale {
                    self.stripe.add(Counter::AuthStale);
                }
                if replay {
                    self.stripe.add(Counter::AuthReplays);
                }
                let headers = proxy.challenge_headers(auth, challenge, &realm, request.now, stale);
                let headers: Vec<(&str, &str)> = headers
                    .iter()
                    .map(|(name, value)| (*name, value.as_str()))
                    .collect();
                let (code, reason) = challenge.status();
                Err(self.local_final(request, code, reason, &headers, out))
            }
        }
    }
}

/// Whether the From URI's user part is `username` (percent-decoded).
fn from_user_is(request: &Request<'_>, username: &str) -> bool {
    request
        .msg
        .from()
        .and_then(|from| from.sip_uri())
        .and_then(|uri| uri.user)
        .is_some_and(|user| super::routing::canonical_user(user) == username)
}
