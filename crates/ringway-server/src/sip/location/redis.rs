//! [`RedisStore`]: the location store in Redis (or Valkey), for several
//! proxies sharing their registrations.
//!
//! Data model (one AOR, two keys with one hash tag so a script stays legal
//! in Redis Cluster): `rw:loc:{AOR}`, a hash from contact to a JSON
//! binding (Call-ID, CSeq, expiry, refresh order, Path), and `rw:exp:{AOR}`,
//! a sorted set from contact to expiry (ms, Redis time): the per-binding
//! expiry index Redis 7.0 lacks (no HEXPIRE). A REGISTER is one Lua
//! script (`register.lua`) that prunes expired bindings, checks the
//! Call-ID/CSeq ordering and the contact bound, applies the changes and
//! sets both keys to expire with their last binding; a lookup is one script
//! (`lookup.lua`) returning the live bindings: one round trip each. Expiry
//! uses Redis's clock (`TIME`), so proxies with different clocks agree.
//!
//! One synchronous connection, used by one store thread at a time, with
//! connect, read and write timeouts. Any error but a server error reply
//! drops the connection (a late reply must never be read as the answer to
//! the next command); the next query reconnects, no sooner than the
//! backoff (50 ms doubling to 2 s) after a failed attempt, and fails at
//! once before that. A reply of the wrong shape is counted and answered as
//! an unavailable store. Every failure is [`StoreError::Unavailable`]:
//! the core then answers `500` + `Retry-After` or `480`, never a lost
//! binding.

use super::LocationCounters;
use redis::{Script, Value};
use ringway_sip::registrar::{
    Binding, BindingChange, LocationStore, Outbound, Registration, StoreAnswer, StoreError,
};
use ringway_sip::{FlowId, Hop, Transport};
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// First reconnect delay after a failed attempt.
const BACKOFF_MIN: Duration = Duration::from_millis(50);
/// Longest reconnect delay.
const BACKOFF_MAX: Duration = Duration::from_secs(2);

/// Key of an AOR's bindings hash.
pub fn bindings_key(aor: &str) -> String {
    format!("rw:loc:{{{aor}}}")
}

/// Key of an AOR's expiry index.
pub fn expiry_key(aor: &str) -> String {
    format!("rw:exp:{{{aor}}}")
}

/// The connection and its reconnect state.
struct Link {
    connection: Option<redis::Connection>,
    /// No connect attempt before this (after a failed one).
    retry_at: Option<Instant>,
    backoff: Duration,
    /// Connected at least once (later connects count as reconnects).
    connected_before: bool,
}

/// The location store in Redis; see the module documentation.
pub struct RedisStore {
    client: redis::Client,
    /// Only to scrub its secret from error texts ([`super::redact_error`]).
    url: String,
    timeout: Duration,
    link: Mutex<Link>,
    register: Script,
    lookup: Script,
    remove_matching: Script,
    counters: Arc<LocationCounters>,
    /// This process among the proxies sharing the store: a binding's
    /// connection is used only by the proxy that holds it.
    node: u64,
}

/// Why a reply could not be used.
#[derive(Debug)]
struct BadReply(&'static str);

impl RedisStore {
    /// A store for `url` (checked with [`super::parse_redis_url`]) whose
    /// every connect, read and write waits at most `timeout`. Does not
    /// connect yet.
    pub fn new(
        url: &str,
        timeout: Duration,
        counters: Arc<LocationCounters>,
    ) -> Result<RedisStore, String> {
        let client = redis::Client::open(url).map_err(|e| {
            super::redact_error(url, &format!("{}: {e}", super::redact_location(url)))
        })?;
        Ok(RedisStore {
            client,
            url: url.to_string(),
            timeout,
            link: Mutex::new(Link {
                connection: None,
                retry_at: None,
                backoff: BACKOFF_MIN,
                connected_before: false,
            }),
            register: Script::new(include_str!("register.lua")),
            lookup: Script::new(include_str!("lookup.lua")),
            remove_matching: Script::new(include_str!("remove_matching.lua")),
            counters,
            node: crate::host::random_bytes::<8>()
                .map(u64::from_le_bytes)
                .unwrap_or_else(|_| u64::from(std::process::id())),
        })
    }

    /// The same store as process `node` (every store of one proxy process
    /// must say the same node: a binding's connection is used, and removed
    /// when it closes, only by the node that stored it).
    pub fn with_node(mut self, node: u64) -> RedisStore {
        self.node = node;
        self
    }

    /// Connect now (start-up check); the error says why not.
    pub fn ping(&self) -> Result<(), String> {
        self.with_connection(|connection| redis::cmd("PING").query::<String>(connection))
            .map(|_| ())
            .map_err(|_| self.counters.last_error())
    }

    /// Run `command` on the connection (connecting first if needed);
    /// failures counted and mapped to [`StoreError::Unavailable`].
    fn with_connection<T>(
        &self,
        command: impl FnOnce(&mut redis::Connection) -> redis::RedisResult<T>,
    ) -> Result<T, StoreError> {
        let mut link = self.link.lock().unwrap_or_else(PoisonError::into_inner);
        if link.connection.is_none() {
            let now = Instant::now();
            if link.retry_at.is_some_and(|at| now < at) {
                self.counters.add(&self.counters.skipped_backoff);
                return Err(StoreError::Unavailable);
            }
            match self.connect() {
                Ok(connection) => {
                    if link.connected_before {
                        self.counters.add(&self.counters.reconnects);
                    }
                    link.connected_before = true;
                    link.connection = Some(connection);
                    link.retry_at = None;
                    link.backoff = BACKOFF_MIN;
                    self.counters.up.store(true, Ordering::Relaxed);
                }
                Err(e) => {
                    self.counters.add(&self.counters.connect_failures);
                    self.counters
                        .set_last_error(super::redact_error(&self.url, &format!("connect: {e}")));
                    link.retry_at = Some(now + link.backoff);
                    link.backoff = (link.backoff * 2).min(BACKOFF_MAX);
                    self.counters.up.store(false, Ordering::Relaxed);
                    return Err(StoreError::Unavailable);
                }
            }
        }
        let Some(connection) = link.connection.as_mut() else {
            return Err(StoreError::Unavailable);
        };
        match command(connection) {
            Ok(value) => Ok(value),
            Err(e) => {
                let replied = matches!(
                    e.kind(),
                    redis::ErrorKind::Server(_) | redis::ErrorKind::Extension
                );
                let counter = if e.is_timeout() {
                    &self.counters.timeouts
                } else if replied {
                    &self.counters.server_errors
                } else if e.kind() == redis::ErrorKind::Io || e.is_connection_dropped() {
                    &self.counters.io_errors
                } else {
                    // Unparsable or unexpected protocol data.
                    &self.counters.bad_replies
                };
                self.counters.add(counter);
                self.counters.set_last_error(e.to_string());
                if !replied || e.is_timeout() {
                    // The connection may hold a late reply: never reuse it.
                    link.connection = None;
                    self.counters.up.store(false, Ordering::Relaxed);
                }
                Err(StoreError::Unavailable)
            }
        }
    }

    fn connect(&self) -> redis::RedisResult<redis::Connection> {
        let connection = self.client.get_connection_with_timeout(self.timeout)?;
        connection.set_read_timeout(Some(self.timeout))?;
        connection.set_write_timeout(Some(self.timeout))?;
        Ok(connection)
    }

    /// Remove the bindings of `aor` whose stored JSON holds `text`
    /// (`remove_matching.lua`); how many went (0 when Redis is away).
    fn remove_matching(&self, aor: &str, text: String) -> usize {
        let mut invocation = self.remove_matching.prepare_invoke();
        invocation
            .key(bindings_key(aor))
            .key(expiry_key(aor))
            .arg(text);
        match self.with_connection(|connection| invocation.invoke::<i64>(connection)) {
            Ok(removed) => usize::try_from(removed).unwrap_or(0),
            Err(_) => 0,
        }
    }

    /// Turn a script's reply into bindings (expiry in the caller's clock:
    /// `now` plus what is left in Redis's).
    fn answer(&self, reply: Result<Value, StoreError>, now: u64) -> StoreAnswer {
        let reply = reply?;
        match parse_reply(&reply, now, self.node) {
            Ok(answer) => answer,
            Err(BadReply(why)) => {
                self.counters.add(&self.counters.bad_replies);
                self.counters.set_last_error(format!("bad reply: {why}"));
                Err(StoreError::Unavailable)
            }
        }
    }
}

/// A script reply as the bytes Redis sends (RESP), through [`parse_reply`]:
/// `None` when the bytes are not one RESP value, else the answer or why
/// the reply was refused. For the fuzz target
/// (`ringway_server::fuzzing::redis_reply`).
pub(crate) fn parse_resp_reply(
    bytes: &[u8],
    now: u64,
) -> Option<Result<StoreAnswer, &'static str>> {
    let value = redis::parse_redis_value(bytes).ok()?;
    Some(parse_reply(&value, now, 0).map_err(|BadReply(why)| why))
}

/// Parse `{status, now_ms, contact, value, ...}`; connections stored by
/// another node than `node` are left out of the flows.
fn parse_reply(reply: &Value, now: u64, node: u64) -> Result<StoreAnswer, BadReply> {
    let Value::Array(items) = reply else {
        return Err(BadReply("not an array"));
    };
    let (Some(Value::Int(status)), Some(Value::Int(redis_now))) = (items.first(), items.get(1))
    else {
        return Err(BadReply("no status and time"));
    };
    match status {
        0 => {}
        1 => return Ok(Err(StoreError::OutOfOrder)),
        2 => return Ok(Err(StoreError::TooManyContacts)),
        3 => return Err(BadReply("a stored binding cannot be read")),
        _ => return Err(BadReply("unknown status")),
    }
    let pairs = &items[2..];
    if pairs.len() % 2 != 0 {
        return Err(BadReply("odd number of fields"));
    }
    let mut bindings = Vec::with_capacity(pairs.len() / 2);
    for pair in pairs.chunks_exact(2) {
        let (Value::BulkString(contact), Value::BulkString(value)) = (&pair[0], &pair[1]) else {
            return Err(BadReply("a binding is not two strings"));
        };
        let contact =
            String::from_utf8(contact.clone()).map_err(|_| BadReply("contact not UTF-8"))?;
        let stored: StoredBinding =
            serde_json::from_slice(value).map_err(|_| BadReply("binding not JSON of the form"))?;
        let left_ms = stored.e.saturating_sub(*redis_now).max(0) as u64;
        bindings.push((
            stored.u,
            Binding {
                contact,
                expires_at: now.saturating_add(left_ms.saturating_mul(1_000_000)),
                call_id: stored.i,
                cseq: stored.s,
                path: stored.p,
                flow: stored.f.and_then(|flow| flow.hop(node)),
                outbound: stored.o.map(|o| Outbound {
                    instance: o.i,
                    reg_id: o.r,
                }),
            },
        ));
    }
    // Most recently refreshed first.
    bindings.sort_by_key(|entry| std::cmp::Reverse(entry.0));
    Ok(Ok(bindings
        .into_iter()
        .filter(|(_, binding)| binding.expires_at > now)
        .map(|(_, binding)| binding)
        .collect()))
}

/// A binding as `register.lua` stores it.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct StoredBinding {
    /// Call-ID.
    i: String,
    /// CSeq.
    s: u32,
    /// Expiry, ms of Redis time.
    e: i64,
    /// Refresh order.
    u: i64,
    /// Path.
    p: Vec<String>,
    /// The flow the REGISTER came in on (absent: none, or stored by an
    /// older version).
    #[serde(default)]
    f: Option<StoredFlow>,
    /// RFC 5626 instance and reg-id.
    #[serde(default)]
    o: Option<StoredOutbound>,
}

/// A binding's flow as stored: transport, address, and the connection
/// with the node (proxy process) that holds it.
#[derive(serde::Serialize, serde::Deserialize, Debug, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
struct StoredFlow {
    /// Transport.
    t: Transport,
    /// Source address.
    a: SocketAddr,
    /// Connection id (0: none).
    #[serde(default)]
    c: u64,
    /// Node of the connection.
    #[serde(default)]
    n: u64,
}

impl StoredFlow {
    fn of(hop: Hop, node: u64) -> StoredFlow {
        StoredFlow {
            t: hop.transport,
            a: hop.addr,
            c: hop.flow.map_or(0, |f| f.0),
            n: node,
        }
    }

    /// The hop as `node` can use it: its connection only if `node` holds
    /// it (another proxy reaches the address over a connection of its
    /// own, or over UDP from its own socket).
    fn hop(self, node: u64) -> Option<Hop> {
        Some(Hop {
            addr: self.a,
            transport: self.t,
            flow: (self.c != 0 && self.n == node).then_some(FlowId(self.c)),
        })
    }
}

/// RFC 5626 instance and reg-id as stored.
#[derive(serde::Serialize, serde::Deserialize, Debug, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
struct StoredOutbound {
    /// `+sip.instance`.
    i: String,
    /// `reg-id`.
    r: u32,
}

impl LocationStore for RedisStore {
    fn register(&self, registration: &Registration, now: u64) -> StoreAnswer {
        let path = serde_json::to_string(&registration.path).unwrap_or_else(|_| "[]".into());
        let flow = registration
            .flow
            .map(|hop| StoredFlow::of(hop, self.node))
            .and_then(|flow| serde_json::to_string(&flow).ok())
            .unwrap_or_else(|| "null".into());
        let mut invocation = self.register.prepare_invoke();
        invocation
            .key(bindings_key(&registration.aor))
            .key(expiry_key(&registration.aor))
            .arg(&registration.call_id)
            .arg(registration.cseq)
            .arg(registration.max_contacts)
            .arg(path)
            .arg(registration.changes.len())
            .arg(flow);
        for change in &registration.changes {
            match change {
                BindingChange::Bind {
                    contact,
                    expires,
                    outbound,
                } => {
                    let outbound = outbound
                        .as_ref()
                        .map(|o| StoredOutbound {
                            i: o.instance.clone(),
                            r: o.reg_id,
                        })
                        .and_then(|o| serde_json::to_string(&o).ok())
                        .unwrap_or_else(|| "null".into());
                    invocation.arg("b").arg(contact).arg(*expires).arg(outbound)
                }
                BindingChange::Unbind { contact } => {
                    invocation.arg("u").arg(contact).arg(0).arg("null")
                }
                BindingChange::UnbindAll => invocation.arg("*").arg("").arg(0).arg("null"),
            };
        }
        self.counters.add(&self.counters.registers);
        let reply = self.with_connection(|connection| invocation.invoke::<Value>(connection));
        self.answer(reply, now)
    }

    fn lookup(&self, aor: &str, now: u64) -> StoreAnswer {
        let mut invocation = self.lookup.prepare_invoke();
        invocation.key(bindings_key(aor)).key(expiry_key(aor));
        self.counters.add(&self.counters.lookups);
        let reply = self.with_connection(|connection| invocation.invoke::<Value>(connection));
        self.answer(reply, now)
    }

    fn expire(&self, _now: u64) -> usize {
        // Redis expires bindings itself (index + key expiry).
        0
    }

    fn remove_flow(&self, aor: &str, flow: &Hop, _now: u64) -> usize {
        // The flow as register.lua stored it after "f": with this node
        // (transport, address, connection and node; one serializer).
        let Ok(stored) = serde_json::to_string(&StoredFlow::of(*flow, self.node)) else {
            return 0;
        };
        self.remove_matching(aor, format!("\"f\":{stored},"))
    }

    fn remove_path(&self, aor: &str, path: &[String], _now: u64) -> usize {
        // The Path as register.lua stored it after "p": (the same
        // serializer as `register`), followed there by ,"f": so that
        // exactly the bindings of that Path match (not of a longer one).
        let Ok(stored) = serde_json::to_string(path) else {
            return 0;
        };
        self.remove_matching(aor, format!("\"p\":{stored},\"f\":"))
    }

    fn len(&self) -> Option<usize> {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    #[test]
    fn replies_of_the_wrong_shape_are_refused() {
        let ok = Value::Array(vec![
            Value::Int(0),
            Value::Int(1_000),
            bulk("sip:a@192.0.2.1"),
            bulk(r#"{"i":"c","s":2,"e":61000,"u":1,"p":["<sip:192.0.2.9;lr>"]}"#),
            bulk("sip:b@192.0.2.2"),
            bulk(r#"{"i":"c","s":2,"e":31000,"u":2,"p":[]}"#),
        ]);
        let bindings = parse_reply(&ok, 5_000_000_000, 0).unwrap().unwrap();
        assert_eq!(
            bindings[0].contact, "sip:b@192.0.2.2",
            "refreshed last, first"
        );
        assert_eq!(bindings[0].expires_at, 5_000_000_000 + 30_000_000_000);
        assert_eq!(bindings[1].path, ["<sip:192.0.2.9;lr>"]);
        assert!(matches!(
            parse_reply(&Value::Array(vec![Value::Int(1), Value::Int(0)]), 0, 0),
            Ok(Err(StoreError::OutOfOrder))
        ));
        for bad in [
            Value::Okay,
            Value::Array(vec![]),
            Value::Array(vec![bulk("0"), Value::Int(0)]),
            Value::Array(vec![Value::Int(0), Value::Int(0), bulk("sip:a@192.0.2.1")]),
            Value::Array(vec![Value::Int(0), Value::Int(0), bulk("x"), bulk("{")]),
            Value::Array(vec![Value::Int(0), Value::Int(0), bulk("x"), Value::Nil]),
            Value::Array(vec![
                Value::Int(0),
                Value::Int(0),
                bulk("x"),
                bulk(r#"{"i":1}"#),
            ]),
            Value::Array(vec![Value::Int(3), Value::Int(0)]),
            Value::Array(vec![Value::Int(9), Value::Int(0)]),
        ] {
            assert!(parse_reply(&bad, 0, 0).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn flows_and_outbound_are_read_back_and_connections_stay_with_their_node() {
        let value = r#"{"i":"c","s":2,"e":61000,"u":1,"p":[],"f":{"t":"tcp","a":"192.0.2.7:40000","c":65537,"n":7},"o":{"i":"<urn:uuid:1>","r":1}}"#;
        let reply = Value::Array(vec![
            Value::Int(0),
            Value::Int(1_000),
            bulk("sip:a@10.0.0.2"),
            bulk(value),
        ]);
        let mine = parse_reply(&reply, 0, 7).unwrap().unwrap();
        let flow = mine[0].flow.unwrap();
        assert_eq!(flow.transport, Transport::Tcp);
        assert_eq!(flow.addr, "192.0.2.7:40000".parse::<SocketAddr>().unwrap());
        assert_eq!(flow.flow, Some(FlowId(65537)));
        assert_eq!(mine[0].outbound.as_ref().unwrap().reg_id, 1);
        // Another proxy keeps the address, not the connection.
        let theirs = parse_reply(&reply, 0, 8).unwrap().unwrap();
        assert_eq!(theirs[0].flow.unwrap().flow, None);
        // What the store writes reads back the same.
        let hop = Hop::udp("[2001:db8::1]:5060".parse().unwrap());
        let text = serde_json::to_string(&StoredFlow::of(hop, 7)).unwrap();
        let back: StoredFlow = serde_json::from_str(&text).unwrap();
        assert_eq!(back.hop(7), Some(hop));
        // A flow of the wrong form is a bad reply, not a panic.
        let bad = r#"{"i":"c","s":2,"e":61000,"u":1,"p":[],"f":{"t":"sctp","a":"x"}}"#;
        let reply = Value::Array(vec![Value::Int(0), Value::Int(0), bulk("x"), bulk(bad)]);
        assert!(parse_reply(&reply, 0, 7).is_err());
    }

    #[test]
    fn a_reply_of_the_wrong_shape_is_counted_and_answered_unavailable() {
        let counters = Arc::new(LocationCounters::default());
        // Never connects: the replies are handed to the store directly.
        let store = RedisStore::new(
            "redis://127.0.0.1:6379/0",
            Duration::from_millis(10),
            Arc::clone(&counters),
        )
        .unwrap();
        let bad = [
            Value::Okay,
            Value::Nil,
            Value::Int(0),
            Value::Array(vec![Value::Int(0)]),
            Value::Array(vec![
                Value::Int(0),
                Value::Int(0),
                bulk("x"),
                bulk("not json"),
            ]),
        ];
        for reply in &bad {
            assert!(
                matches!(
                    store.answer(Ok(reply.clone()), 0),
                    Err(StoreError::Unavailable)
                ),
                "{reply:?}"
            );
        }
        let counts = counters.snapshot();
        assert_eq!(counts.bad_replies, bad.len() as u64);
        assert!(counters.last_error().starts_with("bad reply: "));
        // A store that did not answer is not a bad reply.
        assert!(matches!(
            store.answer(Err(StoreError::Unavailable), 0),
            Err(StoreError::Unavailable)
        ));
        assert_eq!(counters.snapshot().bad_replies, bad.len() as u64);
    }
}
