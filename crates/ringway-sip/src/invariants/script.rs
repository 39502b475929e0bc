//! The input language of the proxy and dispatcher fuzz targets: a fuzz
//! input is a script of datagrams from a few peers with time steps, and
//! the peers answer what the core sent them, so a fuzzer reaches
//! transactions, dialogs and authenticated requests it could not forge
//! from raw bytes (branches, To tags and nonces are keyed hashes).
//!
//! Steps are separated by `0xFF` (never in a SIP message). The first byte
//! of a step is its control byte, the rest its payload:
//!
//! - bits 0–1: the sender ([`PEERS`]);
//! - bits 2–4: time to let pass first ([`WAITS`]), then due timers run;
//! - bits 5–6: what is sent ([`StepKind`]);
//! - bit 7: instead of a datagram, the driver reports an ICMP unreachable
//!   for where one of the last datagrams the core sent went (payload byte
//!   0 picks it); the proxy targets only (the dispatcher sends the step's
//!   datagram as without it).

use crate::auth::Algorithm;
use crate::edit::build_response;
use crate::msg::SipMsg;
use std::net::SocketAddr;

/// Senders a step can name: a user agent, the proxy's next hop
/// (`route_to`, or the dispatcher's first proxy), another host, and an
/// IPv6 user agent.
pub(crate) const PEERS: [&str; 4] = [
    "192.0.2.1:5060",
    "192.0.2.20:5060",
    "192.0.2.30:5062",
    "[2001:db8::1]:5060",
];

/// Time a step lets pass before its datagram (ns): nothing, 1 ms, 100 ms,
/// 600 ms (past timer A/E), 4 s (past T2), 33 s (past timer B/F), 65 s
/// (past a short registration), 300 s (past a nonce lifetime).
pub(crate) const WAITS: [u64; 8] = [
    0,
    1_000_000,
    100_000_000,
    600_000_000,
    4_000_000_000,
    33_000_000_000,
    65_000_000_000,
    300_000_000_000,
];

/// The user the scripted peers know the password of.
pub(crate) const USER: (&str, &str, &str) = ("alice", "example.com", "secret");

/// What a step sends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum StepKind {
    /// The payload as it is.
    Raw,
    /// The payload (a request) with digest credentials for [`USER`]
    /// answering the last challenge the core sent (or a made-up nonce),
    /// and a branch of its own (a new transaction).
    WithCredentials,
    /// A response to the last request the core sent, from where it was
    /// sent: status from the first two payload bytes (100–699), the rest
    /// as extra `Name: value` lines (Contact, Record-Route, ...).
    AnswerLast,
    /// One of the last datagrams the core sent (payload byte 0 picks it),
    /// sent back from the address it went to.
    Replay,
}

/// One step of a script.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Step<'a> {
    /// Index into [`PEERS`].
    pub(crate) peer: usize,
    /// Index into [`WAITS`].
    pub(crate) wait: usize,
    /// What is sent.
    pub(crate) kind: StepKind,
    /// The rest of the step.
    pub(crate) payload: &'a [u8],
    /// An ICMP unreachable report rather than a datagram (bit 7).
    pub(crate) unreachable: bool,
}

/// The steps of a fuzz input (empty steps are skipped).
pub(crate) fn steps(data: &[u8]) -> impl Iterator<Item = Step<'_>> {
    data.split(|&b| b == 0xFF).filter_map(|chunk| {
        let (&control, payload) = chunk.split_first()?;
        Some(Step {
            peer: usize::from(control & 3),
            wait: usize::from((control >> 2) & 7),
            kind: match (control >> 5) & 3 {
                0 => StepKind::Raw,
                1 => StepKind::WithCredentials,
                2 => StepKind::AnswerLast,
                _ => StepKind::Replay,
            },
            payload,
            unreachable: control & 0x80 != 0,
        })
    })
}

/// The address of peer `i`.
pub(crate) fn peer(i: usize) -> SocketAddr {
    PEERS[i % PEERS.len()].parse().expect("literal address")
}

/// Datagrams a core sent, kept so that peers can answer them.
const KEPT: usize = 16;

/// What the scripted peers learnt from one core's output.
#[derive(Default)]
pub(crate) struct Peers {
    /// The last datagrams sent (destination, bytes), oldest first.
    sent: Vec<(SocketAddr, Vec<u8>)>,
    /// The last request sent (destination, bytes).
    last_request: Option<(SocketAddr, Vec<u8>)>,
    /// The last challenge: (401 rather than 407, realm, nonce, algorithm).
    challenge: Option<(bool, String, String, Algorithm)>,
    /// Nonce count of the credentials sent.
    nc: u32,
    /// Scratch for built datagrams.
    buf: Vec<u8>,
}

impl Peers {
    /// Remember a datagram the core sent to `to`.
    pub(crate) fn saw(&mut self, to: SocketAddr, bytes: &[u8]) {
        if self.sent.len() == KEPT {
            self.sent.remove(0);
        }
        self.sent.push((to, bytes.to_vec()));
        let Ok(m) = SipMsg::parse(bytes) else {
            return;
        };
        if m.is_request() {
            self.last_request = Some((to, bytes.to_vec()));
        } else if let Some(status @ (401 | 407)) = m.status() {
            let name = if status == 401 {
                "WWW-Authenticate"
            } else {
                "Proxy-Authenticate"
            };
            if let Some(value) = m.header(name).next() {
                let param = |p: &str| challenge_param(value, p).map(str::to_owned);
                if let (Some(realm), Some(nonce)) = (param("realm"), param("nonce")) {
                    let algorithm = challenge_param(value, "algorithm")
                        .and_then(Algorithm::from_token)
                        .unwrap_or(Algorithm::Md5);
                    self.challenge = Some((status == 401, realm, nonce, algorithm));
                }
            }
        }
    }

    /// The datagram of `step` and its source, or `None` when the step
    /// cannot be built (nothing to answer yet).
    pub(crate) fn datagram(&mut self, step: &Step<'_>) -> Option<(SocketAddr, &[u8])> {
        let src = peer(step.peer);
        self.buf.clear();
        match step.kind {
            StepKind::Raw => {
                self.buf.extend_from_slice(step.payload);
                Some((src, &self.buf))
            }
            StepKind::WithCredentials => {
                self.with_credentials(step.payload);
                Some((src, &self.buf))
            }
            StepKind::AnswerLast => {
                let (to, request) = self.last_request.as_ref()?;
                let request = SipMsg::parse(request).ok()?;
                let code = match step.payload {
                    [a, b, ..] => 100 + u16::from_be_bytes([*a, *b]) % 600,
                    _ => 200,
                };
                let extra = String::from_utf8_lossy(step.payload.get(2..).unwrap_or(&[]));
                let headers: Vec<(&str, &str)> = extra
                    .split('\n')
                    .filter_map(|line| line.trim_end_matches('\r').split_once(':'))
                    .collect();
                build_response(
                    &request,
                    code,
                    "Fuzz",
                    &headers,
                    Some("peer"),
                    &mut self.buf,
                );
                Some((*to, &self.buf))
            }
            StepKind::Replay => {
                let pick = usize::from(step.payload.first().copied().unwrap_or(0));
                let (to, bytes) = self.sent.get(pick % self.sent.len().max(1))?;
                Some((*to, bytes))
            }
        }
    }

    /// Where one of the last datagrams the core sent went (`payload` byte
    /// 0 picks it, as for [`StepKind::Replay`]).
    pub(crate) fn destination(&self, payload: &[u8]) -> Option<SocketAddr> {
        let pick = usize::from(payload.first().copied().unwrap_or(0));
        self.sent
            .get(pick % self.sent.len().max(1))
            .map(|(to, _)| *to)
    }

    /// `request` with an `Authorization` or `Proxy-Authorization` line
    /// for [`USER`] after its start line (in `self.buf`).
    fn with_credentials(&mut self, request: &[u8]) {
        let (method, uri) = match SipMsg::parse(request) {
            Ok(m) => {
                let method = m.start_line().split(' ').next().unwrap_or("");
                (method.to_owned(), m.request_uri().unwrap_or("").to_owned())
            }
            Err(_) => (String::new(), String::new()),
        };
        let (www, realm, nonce, algorithm) = self.challenge.clone().unwrap_or_else(|| {
            (
                false,
                USER.1.to_owned(),
                "bm9uY2U".to_owned(),
                Algorithm::Md5,
            )
        });
        self.nc = self.nc.wrapping_add(1);
        let nc = format!("{:08x}", self.nc);
        let ha1 = algorithm.ha1(USER.0, &realm, USER.2);
        let response = algorithm.response(ha1.as_str(), &nonce, &nc, "c0ffee", &method, &uri);
        let line = format!(
            "{}: Digest username=\"{}\", realm=\"{realm}\", nonce=\"{nonce}\", uri=\"{uri}\", \
             response=\"{}\", algorithm={algorithm}, qop=auth, nc={nc}, cnonce=\"c0ffee\"\r\n",
            if www {
                "Authorization"
            } else {
                "Proxy-Authorization"
            },
            USER.0,
            response.as_str(),
        );
        let split = request
            .iter()
            .position(|&b| b == b'\n')
            .map_or(request.len(), |i| i + 1);
        self.buf.extend_from_slice(&request[..split]);
        self.buf.extend_from_slice(line.as_bytes());
        self.buf.extend_from_slice(&request[split..]);
        // A new transaction, as a client answering a challenge makes it
        // (the same branch would be absorbed as a retransmission).
        const MAGIC: &[u8] = b"branch=z9hG4bK";
        if let Some(at) = self.buf.windows(MAGIC.len()).position(|w| w == MAGIC) {
            let tag = format!("{nc}x");
            let at = at + MAGIC.len();
            self.buf.splice(at..at, tag.bytes());
        }
    }
}

/// The value of auth-param `name` in a challenge header value (quotes
/// removed), as a client would read it.
fn challenge_param<'a>(value: &'a str, name: &str) -> Option<&'a str> {
    let rest = value.trim_start().strip_prefix("Digest")?;
    rest.split(',').find_map(|param| {
        let (n, v) = param.split_once('=')?;
        n.trim()
            .eq_ignore_ascii_case(name)
            .then(|| v.trim().trim_matches('"'))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_read_their_control_byte() {
        let s: Vec<_> = steps(b"\x00INVITE\xff\xff\x7fx\xff\x80").collect();
        assert_eq!(s.len(), 3);
        assert_eq!((s[0].peer, s[0].wait, s[0].kind), (0, 0, StepKind::Raw));
        assert_eq!(s[0].payload, b"INVITE");
        assert_eq!((s[1].peer, s[1].wait, s[1].kind), (3, 7, StepKind::Replay));
        assert!(!s[0].unreachable && !s[1].unreachable && s[2].unreachable);
    }

    #[test]
    fn challenge_params_are_read_like_a_client() {
        let v = r#"Digest realm="example.com", nonce="abc", algorithm=SHA-256, qop="auth""#;
        assert_eq!(challenge_param(v, "realm"), Some("example.com"));
        assert_eq!(challenge_param(v, "nonce"), Some("abc"));
        assert_eq!(challenge_param(v, "algorithm"), Some("SHA-256"));
        assert_eq!(challenge_param("Basic realm=x", "realm"), None);
    }
}
