//! A tiny HTTP/1.0 server answering `GET /metrics` with Prometheus text.
//! One connection at a time, bounded request size and time: the whole
//! request must arrive within [`REQUEST_DEADLINE`] and the whole answer
//! leave within [`CONNECTION_DEADLINE`] of the accept, however slowly the
//! client trickles bytes (a slowloris client cannot hold the endpoint;
//! review finding S17).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Largest request head read (bytes); longer requests get 400.
const MAX_REQUEST: usize = 8192;
/// Time from the accept for the whole request head to arrive.
pub const REQUEST_DEADLINE: Duration = Duration::from_secs(2);
/// Time from the accept for the whole exchange, answer included.
pub const CONNECTION_DEADLINE: Duration = Duration::from_secs(5);

/// Check that `addr` may serve metrics: loopback only unless `allow_public`.
pub fn validate_addr(addr: SocketAddr, allow_public: bool) -> Result<(), crate::ServerError> {
    if !addr.ip().is_loopback() && !allow_public {
        return Err(crate::ServerError::Config(format!(
            "metrics address {addr} is not loopback and public metrics are not allowed"
        )));
    }
    Ok(())
}

/// Serve `GET /metrics` on `listener` from a thread named `thread` until
/// `stop` is set; `render` builds the exposition text per request.
pub fn serve(
    thread: &str,
    listener: TcpListener,
    stop: Arc<AtomicBool>,
    render: impl Fn() -> String + Send + 'static,
) -> std::io::Result<std::thread::JoinHandle<()>> {
    listener.set_nonblocking(true)?;
    std::thread::Builder::new()
        .name(thread.into())
        .spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((s, _)) => {
                        if let Err(err) = answer(s, &render) {
                            crate::warn_limited!("metrics: connection error: {err}");
                        }
                    }
                    Err(err) if err.kind() == std::io::ErrorKind::WouldBlock => {
                        std::thread::sleep(Duration::from_millis(20));
                    }
                    Err(err) => {
                        crate::warn_limited!("metrics: accept error: {err}");
                        std::thread::sleep(Duration::from_millis(100));
                    }
                }
            }
        })
}

/// The time left until `deadline`, or a `TimedOut` error.
fn left(deadline: Instant) -> std::io::Result<Duration> {
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            "connection deadline passed",
        ));
    }
    Ok(left)
}

fn answer(mut s: TcpStream, render: &impl Fn() -> String) -> std::io::Result<()> {
    let accepted = Instant::now();
    let request_deadline = accepted + REQUEST_DEADLINE;
    let deadline = accepted + CONNECTION_DEADLINE;
    s.set_nonblocking(false)?;
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") && !buf.windows(2).any(|w| w == b"\n\n") {
        // Each read may only wait for what is left of the whole request's time.
        s.set_read_timeout(Some(left(request_deadline)?))?;
        let read = s.read(&mut chunk)?;
        if read == 0 {
            break;
        }
        buf.extend_from_slice(&chunk[..read]);
        if buf.len() > MAX_REQUEST {
            return respond(
                &mut s,
                deadline,
                "400 Bad Request",
                "text/plain",
                "request too large\n",
            );
        }
    }
    match route(&buf) {
        Route::Metrics => respond(
            &mut s,
            deadline,
            "200 OK",
            "text/plain; version=0.0.4; charset=utf-8",
            &render(),
        ),
        Route::NotFound => respond(
            &mut s,
            deadline,
            "404 Not Found",
            "text/plain",
            "try /metrics\n",
        ),
        Route::BadRequest => respond(
            &mut s,
            deadline,
            "400 Bad Request",
            "text/plain",
            "bad request\n",
        ),
    }
}

/// What a request head asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Route {
    /// `GET /metrics`.
    Metrics,
    /// `GET` of anything else.
    NotFound,
    /// Not a `GET` request line.
    BadRequest,
}

/// Read the request line of `head` (the bytes received, at most
/// [`MAX_REQUEST`] and a bit).
pub(crate) fn route(head: &[u8]) -> Route {
    let line = head.split(|&b| b == b'\n').next().unwrap_or(&[]);
    let line = String::from_utf8_lossy(line);
    let mut parts = line.split_whitespace();
    match (parts.next(), parts.next()) {
        (Some("GET"), Some("/metrics")) => Route::Metrics,
        (Some("GET"), Some(_)) => Route::NotFound,
        _ => Route::BadRequest,
    }
}

fn respond(
    s: &mut TcpStream,
    deadline: Instant,
    status: &str,
    ctype: &str,
    body: &str,
) -> std::io::Result<()> {
    let head = format!(
        "HTTP/1.0 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    for mut bytes in [head.as_bytes(), body.as_bytes()] {
        // Each write may only wait for what is left of the connection's time
        // (a client that does not read cannot hold the endpoint either).
        while !bytes.is_empty() {
            s.set_write_timeout(Some(left(deadline)?))?;
            match s.write(bytes) {
                Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
                Ok(n) => bytes = &bytes[n..],
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }
    s.flush()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serves_metrics_and_404() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let h = serve("test-metrics", l, stop.clone(), || {
            "x_total 1\n".to_string()
        })
        .unwrap();
        let get = |path: &str| {
            let mut c = TcpStream::connect(addr).unwrap();
            write!(c, "GET {path} HTTP/1.0\r\n\r\n").unwrap();
            let mut r = String::new();
            c.read_to_string(&mut r).unwrap();
            r
        };
        let r = get("/metrics");
        assert!(r.starts_with("HTTP/1.0 200 OK"), "{r}");
        assert!(r.ends_with("x_total 1\n"));
        assert!(get("/nope").starts_with("HTTP/1.0 404"));
        stop.store(true, Ordering::Relaxed);
        h.join().unwrap();
        assert!(validate_addr("0.0.0.0:9000".parse().unwrap(), false).is_err());
        assert!(validate_addr("127.0.0.1:9000".parse().unwrap(), false).is_ok());
    }
}
