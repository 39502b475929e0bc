//! A small HTTP/1.x server for management APIs on loopback: JSON handlers
//! behind a bearer token, bounded per connection by bytes and by an overall
//! deadline (a slow client is cut off, it cannot hold a slot), and by the
//! number of connections served at once.
//!
//! [`parse_request`] is the sans-IO parser (proptested, corpus in
//! `tests/corpus/http`); [`serve`] runs a [`Handler`] on a listener. The
//! handler is a plain function of the request, so the same handlers can
//! later be mounted on another transport (issue 22's management socket).

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Largest request head (request line and headers), bytes.
pub const MAX_HEAD: usize = 8192;
/// Largest request body, bytes.
pub const MAX_BODY: usize = 16384;
/// Most headers in a request.
pub const MAX_HEADERS: usize = 64;
/// Overall time a connection may take to send its request.
pub const REQUEST_DEADLINE: Duration = Duration::from_secs(2);
/// Connections served at once; more are closed at once.
pub const MAX_CONNECTIONS: usize = 8;

/// A parsed request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Request {
    /// Method (`GET`, `POST`, `DELETE`, ...).
    pub method: String,
    /// Path, without the query.
    pub path: String,
    /// Query string (after `?`), if any.
    pub query: Option<String>,
    /// Bearer token of the `Authorization` header, if any.
    pub bearer: Option<String>,
    /// Body (`Content-Length` bytes).
    pub body: Vec<u8>,
}

impl Request {
    /// The value of query parameter `name`.
    pub fn query_param(&self, name: &str) -> Option<&str> {
        self.query
            .as_deref()?
            .split('&')
            .filter_map(|kv| kv.split_once('=').or(Some((kv, ""))))
            .find(|(k, _)| *k == name)
            .map(|(_, v)| v)
    }
}

/// Why a request could not be parsed.
#[derive(Copy, Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum HttpError {
    /// More bytes are needed (the head or body is not complete yet).
    #[error("incomplete request")]
    Incomplete,
    /// Head or body over the bounds.
    #[error("request too large")]
    TooLarge,
    /// Not an HTTP/1.x request.
    #[error("bad request")]
    Bad,
}

/// Parse one request from `buf` (everything received so far).
pub fn parse_request(buf: &[u8]) -> Result<Request, HttpError> {
    let head_end = match find(buf, b"\r\n\r\n") {
        Some(i) => i,
        None if buf.len() > MAX_HEAD => return Err(HttpError::TooLarge),
        None => return Err(HttpError::Incomplete),
    };
    if head_end > MAX_HEAD {
        return Err(HttpError::TooLarge);
    }
    let head = std::str::from_utf8(&buf[..head_end]).map_err(|_| HttpError::Bad)?;
    let mut lines = head.split("\r\n");
    let line = lines.next().ok_or(HttpError::Bad)?;
    let mut parts = line.split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(HttpError::Bad);
    };
    if !matches!(version, "HTTP/1.0" | "HTTP/1.1")
        || method.is_empty()
        || !method.bytes().all(|b| b.is_ascii_uppercase())
        || !target.starts_with('/')
    {
        return Err(HttpError::Bad);
    }
    let (path, query) = match target.split_once('?') {
        Some((p, q)) => (p, Some(q.to_string())),
        None => (target, None),
    };
    let mut bearer = None;
    let mut length = 0usize;
    for (n, h) in lines.enumerate() {
        if n >= MAX_HEADERS {
            return Err(HttpError::TooLarge);
        }
        let (name, value) = h.split_once(':').ok_or(HttpError::Bad)?;
        let value = value.trim();
        if name.eq_ignore_ascii_case("content-length") {
            length = value.parse().map_err(|_| HttpError::Bad)?;
            if length > MAX_BODY {
                return Err(HttpError::TooLarge);
            }
        } else if name.eq_ignore_ascii_case("transfer-encoding") {
            return Err(HttpError::Bad); // no chunked bodies
        } else if name.eq_ignore_ascii_case("authorization") {
            if let Some(token) = value.strip_prefix("Bearer ") {
                bearer = Some(token.trim().to_string());
            }
        }
    }
    let body_start = head_end + 4;
    if buf.len() < body_start + length {
        return Err(HttpError::Incomplete);
    }
    Ok(Request {
        method: method.to_string(),
        path: path.to_string(),
        query,
        bearer,
        body: buf[body_start..body_start + length].to_vec(),
    })
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// A response.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Response {
    /// Status code.
    pub status: u16,
    /// Content type.
    pub content_type: &'static str,
    /// Body.
    pub body: String,
}

impl Response {
    /// A JSON response.
    pub fn json(status: u16, value: &serde_json::Value) -> Response {
        Response {
            status,
            content_type: "application/json",
            body: format!("{value}\n"),
        }
    }
    /// A JSON `{"error": message}` response.
    pub fn error(status: u16, message: &str) -> Response {
        Response::json(status, &serde_json::json!({ "error": message }))
    }
    /// A 200 with Prometheus text exposition.
    pub fn prometheus(body: String) -> Response {
        Response {
            status: 200,
            content_type: "text/plain; version=0.0.4; charset=utf-8",
            body,
        }
    }
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        201 => "Created",
        400 => "Bad Request",
        401 => "Unauthorized",
        404 => "Not Found",
        405 => "Method Not Allowed",
        422 => "Unprocessable Entity",
        501 => "Not Implemented",
        408 => "Request Timeout",
        409 => "Conflict",
        413 => "Payload Too Large",
        503 => "Service Unavailable",
        _ => "Error",
    }
}

/// What answers requests.
pub type Handler = Arc<dyn Fn(&Request) -> Response + Send + Sync>;

/// Constant-time comparison of a presented bearer token with the expected one.
pub fn token_matches(presented: Option<&str>, expected: &str) -> bool {
    let Some(presented) = presented else {
        return false;
    };
    let (presented_bytes, expected_bytes) = (presented.as_bytes(), expected.as_bytes());
    let mut diff = (presented_bytes.len() != expected_bytes.len()) as u8;
    for (i, &b) in expected_bytes.iter().enumerate() {
        diff |= b ^ presented_bytes.get(i).copied().unwrap_or(0);
    }
    diff == 0
}

/// Serve `handler` on `listener` from a thread named `name` until `stop`
/// is set. Each connection gets its own thread (at most
/// [`MAX_CONNECTIONS`]), [`REQUEST_DEADLINE`] to send a request within the
/// bounds, one response, and is closed.
pub fn serve(
    name: &str,
    listener: TcpListener,
    stop: Arc<AtomicBool>,
    handler: Handler,
) -> std::io::Result<std::thread::JoinHandle<()>> {
    listener.set_nonblocking(true)?;
    let accept = move || listener.accept().map(|(stream, _)| stream);
    accept_until_stopped(name, accept, stop, handler)
}

/// A connected stream the server answers on (TCP or Unix).
trait Conn: Read + Write {
    fn set_nonblocking(&self, on: bool) -> std::io::Result<()>;
    fn set_read_timeout(&self, t: Option<Duration>) -> std::io::Result<()>;
    fn set_write_timeout(&self, t: Option<Duration>) -> std::io::Result<()>;
}

macro_rules! conn {
    ($t:ty) => {
        impl Conn for $t {
            fn set_nonblocking(&self, on: bool) -> std::io::Result<()> {
                <$t>::set_nonblocking(self, on)
            }
            fn set_read_timeout(&self, t: Option<Duration>) -> std::io::Result<()> {
                <$t>::set_read_timeout(self, t)
            }
            fn set_write_timeout(&self, t: Option<Duration>) -> std::io::Result<()> {
                <$t>::set_write_timeout(self, t)
            }
        }
    };
}
conn!(TcpStream);
conn!(UnixStream);

/// Serve `handler` on the Unix socket `listener` (a management socket:
/// whoever may open the file may ask; no token) with the same bounds as
/// [`serve`].
pub fn serve_unix(
    name: &str,
    listener: UnixListener,
    stop: Arc<AtomicBool>,
    handler: Handler,
) -> std::io::Result<std::thread::JoinHandle<()>> {
    listener.set_nonblocking(true)?;
    let accept = move || listener.accept().map(|(stream, _)| stream);
    accept_until_stopped(name, accept, stop, handler)
}

/// Take connections from `accept` (non-blocking) on a thread named `name`
/// until `stop` is set, answering each (see [`serve`]).
fn accept_until_stopped<S: Conn + Send + 'static>(
    name: &str,
    accept: impl Fn() -> std::io::Result<S> + Send + 'static,
    stop: Arc<AtomicBool>,
    handler: Handler,
) -> std::io::Result<std::thread::JoinHandle<()>> {
    let busy = Arc::new(AtomicUsize::new(0));
    let thread_name = name.to_string();
    std::thread::Builder::new()
        .name(thread_name.clone())
        .spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                match accept() {
                    Ok(stream) => answer_in_thread(stream, &busy, &handler, &thread_name),
                    Err(e) => pause_after(&e),
                }
            }
        })
}

/// Answer one accepted connection on a thread of its own, unless
/// [`MAX_CONNECTIONS`] are being answered already (then it is closed).
fn answer_in_thread<S: Conn + Send + 'static>(
    stream: S,
    busy: &Arc<AtomicUsize>,
    handler: &Handler,
    thread_name: &str,
) {
    if busy.load(Ordering::Relaxed) >= MAX_CONNECTIONS {
        return; // over the bound: closed at once
    }
    busy.fetch_add(1, Ordering::Relaxed);
    let (count, handler) = (busy.clone(), handler.clone());
    let spawned = std::thread::Builder::new()
        .name(format!("{thread_name}-conn"))
        .spawn(move || {
            let _ = answer(stream, &handler);
            count.fetch_sub(1, Ordering::Relaxed);
        });
    if spawned.is_err() {
        // The closure was dropped unrun: give its place back.
        busy.fetch_sub(1, Ordering::Relaxed);
    }
}

/// After a failed accept: a short nap when nothing was pending, a longer
/// one on a real error (so a broken listener does not spin).
fn pause_after(error: &std::io::Error) {
    if error.kind() == std::io::ErrorKind::WouldBlock {
        std::thread::sleep(Duration::from_millis(10));
    } else {
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn answer(mut s: impl Conn, handler: &Handler) -> std::io::Result<()> {
    s.set_nonblocking(false)?;
    s.set_write_timeout(Some(REQUEST_DEADLINE))?;
    let deadline = Instant::now() + REQUEST_DEADLINE;
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 2048];
    let request = loop {
        match parse_request(&buf) {
            Ok(r) => break Ok(r),
            Err(HttpError::Incomplete) => {}
            Err(e) => break Err(e),
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return write_response(&mut s, &Response::error(408, "request deadline passed"));
        }
        s.set_read_timeout(Some(left))?;
        match s.read(&mut chunk) {
            Ok(0) => return Ok(()),
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                return write_response(&mut s, &Response::error(408, "request deadline passed"));
            }
            Err(e) => return Err(e),
        }
        if buf.len() > MAX_HEAD + MAX_BODY + 4 {
            break Err(HttpError::TooLarge);
        }
    };
    let response = match request {
        Ok(r) => handler(&r),
        Err(HttpError::TooLarge) => Response::error(413, "request too large"),
        Err(_) => Response::error(400, "bad request"),
    };
    write_response(&mut s, &response)
}

fn write_response(s: &mut impl Write, r: &Response) -> std::io::Result<()> {
    let head = format!(
        "HTTP/1.1 {} {}\r\nContent-Type: {}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        r.status,
        reason(r.status),
        r.content_type,
        r.body.len()
    );
    s.write_all(head.as_bytes())?;
    s.write_all(r.body.as_bytes())?;
    s.flush()
}

/// Hands an API request to the thread that owns the state it reads or
/// changes (`owner` names it in the errors) and waits at most `wait` for
/// its answer: 503 when its queue is full, it has stopped, or it is late.
/// `make` builds the request around the reply channel.
pub fn ask_owner<T>(
    owner: &str,
    queue: &std::sync::mpsc::SyncSender<T>,
    wait: std::time::Duration,
    make: impl FnOnce(std::sync::mpsc::SyncSender<Response>) -> T,
) -> Response {
    use std::sync::mpsc::{sync_channel, TrySendError};
    let (reply, answer) = sync_channel(1);
    match queue.try_send(make(reply)) {
        Ok(()) => {}
        Err(TrySendError::Full(_)) => return Response::error(503, &format!("{owner} busy")),
        Err(TrySendError::Disconnected(_)) => {
            return Response::error(503, &format!("{owner} stopped"))
        }
    }
    answer
        .recv_timeout(wait)
        .unwrap_or_else(|_| Response::error(503, &format!("{owner} did not answer")))
}

/// An API over state one thread owns (the SFU engine, the JackTrip hub's
/// UDP thread): what it publishes in `live` answers `GET /metrics` (no
/// token) and `GET /api/stats`; every other `/api/...` request is checked
/// against the bearer token, turned into an operation by `route` and
/// handed to the owner (see [`ask_owner`]).
pub struct OwnedApi<Live, Op, Req> {
    /// Names the owner in the errors (`engine`, `hub`).
    pub owner: &'static str,
    /// The owner's request queue.
    pub queue: std::sync::mpsc::SyncSender<Req>,
    /// How long a request waits for the owner's answer.
    pub wait: Duration,
    /// The counters the owner publishes.
    pub live: Arc<std::sync::Mutex<Live>>,
    /// Prometheus text of the counters.
    pub metrics: fn(&Live) -> String,
    /// The JSON of `GET /api/stats`.
    pub stats: fn(&Live) -> serde_json::Value,
    /// The operation a request asks for, or the error response.
    pub route: fn(&Request) -> Result<Op, Response>,
    /// The request to the owner: the operation and where to answer.
    pub request: fn(Op, std::sync::mpsc::SyncSender<Response>) -> Req,
}

impl<Live, Op, Req> OwnedApi<Live, Op, Req>
where
    Live: Clone + Send + 'static,
    Op: 'static,
    Req: Send + 'static,
{
    /// The handler, behind `token`.
    pub fn handler(self, token: String) -> Handler {
        Arc::new(move |request: &Request| {
            let snapshot = || {
                self.live
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .clone()
            };
            if request.method == "GET" && request.path == "/metrics" {
                return Response::prometheus((self.metrics)(&snapshot()));
            }
            if !token_matches(request.bearer.as_deref(), &token) {
                return Response::error(401, "missing or wrong bearer token");
            }
            if request.method == "GET" && request.path == "/api/stats" {
                return Response::json(200, &(self.stats)(&snapshot()));
            }
            let operation = match (self.route)(request) {
                Ok(operation) => operation,
                Err(response) => return response,
            };
            ask_owner(self.owner, &self.queue, self.wait, |reply| {
                (self.request)(operation, reply)
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn parses_and_bounds() {
        let r = parse_request(
            b"POST /api/rooms/jam?max_clients=4&x HTTP/1.1\r\nHost: a\r\nAuthorization: Bearer s3cret\r\nContent-Length: 2\r\n\r\n{}",
        )
        .unwrap();
        assert_eq!(
            (r.method.as_str(), r.path.as_str()),
            ("POST", "/api/rooms/jam")
        );
        assert_eq!(r.query_param("max_clients"), Some("4"));
        assert_eq!(r.query_param("x"), Some(""));
        assert_eq!(r.bearer.as_deref(), Some("s3cret"));
        assert_eq!(r.body, b"{}");
        assert_eq!(
            parse_request(b"GET / HTTP/1.1\r\n"),
            Err(HttpError::Incomplete)
        );
        assert_eq!(
            parse_request(b"GET / HTTP/1.1\r\nContent-Length: 5\r\n\r\nab"),
            Err(HttpError::Incomplete)
        );
        assert_eq!(
            parse_request(b"GET / HTTP/1.1\r\nContent-Length: 99999999\r\n\r\n"),
            Err(HttpError::TooLarge)
        );
        assert_eq!(
            parse_request(&[b'a'; MAX_HEAD + 1]),
            Err(HttpError::TooLarge)
        );
        assert_eq!(parse_request(b"GET / SPDY\r\n\r\n"), Err(HttpError::Bad));
        assert_eq!(
            parse_request(b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"),
            Err(HttpError::Bad)
        );
        assert!(token_matches(Some("abc"), "abc"));
        assert!(!token_matches(Some("abd"), "abc"));
        assert!(!token_matches(Some("ab"), "abc"));
        assert!(!token_matches(Some("abcd"), "abc"));
        assert!(!token_matches(None, "abc"));
    }

    /// The committed corpus (tests/corpus/http) replays without a panic;
    /// files named `ok-*` parse.
    #[test]
    fn corpus_replays() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/corpus/http");
        let mut n = 0;
        for e in std::fs::read_dir(&dir).expect("corpus present") {
            let path = e.unwrap().path();
            let data = std::fs::read(&path).unwrap();
            let r = parse_request(&data);
            let name = path.file_name().unwrap().to_string_lossy().to_string();
            assert_eq!(name.starts_with("ok-"), r.is_ok(), "{name}: {r:?}");
            n += 1;
        }
        assert!(n >= 5);
    }

    /// A slow client is cut off at the deadline; a request over the bound
    /// gets 413; a normal one is answered.
    #[test]
    fn deadline_and_size_bound_per_connection() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let h = serve(
            "test-admin",
            l,
            stop.clone(),
            Arc::new(|r: &Request| Response::json(200, &serde_json::json!({"path": r.path}))),
        )
        .unwrap();
        let roundtrip = |data: &[u8]| {
            let mut c = TcpStream::connect(addr).unwrap();
            let _ = c.write_all(data);
            let mut r = String::new();
            let _ = c.read_to_string(&mut r);
            r
        };
        assert!(roundtrip(b"GET /x HTTP/1.1\r\n\r\n").contains("{\"path\":\"/x\"}"));
        let big = vec![b'a'; MAX_HEAD + MAX_BODY + 10];
        assert!(roundtrip(&big).starts_with("HTTP/1.1 413"));
        // Slowloris: one byte, then nothing: 408 after the deadline, not later.
        let t = Instant::now();
        let mut c = TcpStream::connect(addr).unwrap();
        c.write_all(b"G").unwrap();
        let mut r = String::new();
        c.read_to_string(&mut r).unwrap();
        assert!(r.starts_with("HTTP/1.1 408"), "{r}");
        assert!(t.elapsed() < REQUEST_DEADLINE + Duration::from_secs(2));
        stop.store(true, Ordering::Relaxed);
        h.join().unwrap();
    }

    proptest! {
        #[test]
        fn parser_never_panics(data in proptest::collection::vec(any::<u8>(), 0..600)) {
            let _ = parse_request(&data);
        }
        #[test]
        fn parser_never_panics_on_near_http(m in "[A-Z]{0,7}", p in "/[ -~]{0,40}", h in "[ -~]{0,60}", body in proptest::collection::vec(any::<u8>(), 0..50)) {
            let mut d = format!("{m} {p} HTTP/1.1\r\n{h}\r\n\r\n").into_bytes();
            d.extend_from_slice(&body);
            let _ = parse_request(&d);
        }
    }
}
