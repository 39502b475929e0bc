//! SIP messages off a byte stream (RFC 3261 18.3): the header ends at the
//! first empty line, the body is exactly Content-Length bytes (which a
//! stream transport must carry). CRLF keep-alives between messages (RFC
//! 5626 4.4.1): a double CRLF is a ping, a single CRLF a pong.
//!
//! Bounded in bytes: a header longer than `max_header_bytes` or a body
//! longer than `max_body_bytes` is an error before it is buffered whole,
//! so a connection holds at most their sum. After an error the stream
//! cannot be resynchronised: the connection is closed.

/// What a stream may carry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameLimits {
    /// Longest start line and header (bytes, up to and including the
    /// empty line).
    pub max_header_bytes: usize,
    /// Longest body (bytes).
    pub max_body_bytes: usize,
}

/// One thing framed off the stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Framed {
    /// A message of this many bytes at the start of
    /// [`Framer::buffered`]; [`Framer::consume`] it once handled.
    Message(usize),
    /// A CRLF CRLF keep-alive ping (consumed): answer with a CRLF pong.
    Ping,
    /// A single CRLF (a pong, or padding; consumed).
    Pong,
}

/// Why the stream cannot go on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FrameError {
    /// No empty line within `max_header_bytes`.
    HeaderTooLarge,
    /// Content-Length above `max_body_bytes`.
    BodyTooLarge,
    /// A header without Content-Length, or with one that is not a number.
    BadContentLength,
    /// The first line is not a SIP request or status line.
    Garbage,
}

impl FrameError {
    /// Metrics label.
    pub fn label(self) -> &'static str {
        match self {
            FrameError::HeaderTooLarge => "header_too_large",
            FrameError::BodyTooLarge => "body_too_large",
            FrameError::BadContentLength => "bad_content_length",
            FrameError::Garbage => "garbage",
        }
    }
}

/// Buffered bytes of one connection and the framing state over them.
#[derive(Debug, Default)]
pub struct Framer {
    buf: Vec<u8>,
}

/// Capacity kept by an idle connection's buffer at most (bytes): a
/// connection that carried one large message does not keep its buffer.
const IDLE_CAPACITY: usize = 4096;

impl Framer {
    /// The bytes received and not yet consumed.
    pub fn buffered(&self) -> &[u8] {
        &self.buf
    }

    /// Whether part of a message is buffered (a header or body begun).
    pub fn in_message(&self) -> bool {
        !self.buf.is_empty()
    }

    /// Bytes of memory held.
    pub fn capacity(&self) -> usize {
        self.buf.capacity()
    }

    /// Append received bytes, unless that makes more than one message's
    /// worth of buffered data.
    pub fn extend(&mut self, data: &[u8], limits: FrameLimits) -> Result<(), FrameError> {
        if self.buf.len() + data.len() > limits.max_header_bytes + limits.max_body_bytes {
            // Only a header that never ends or a body over its bound get
            // here: find which (the header check comes first).
            self.buf
                .extend_from_slice(&data[..data.len().min(limits.max_header_bytes)]);
            return Err(match self.header_end(limits) {
                Err(e) => e,
                Ok(_) => FrameError::BodyTooLarge,
            });
        }
        self.buf.extend_from_slice(data);
        Ok(())
    }

    /// Drop the first `len` bytes (a message handled).
    pub fn consume(&mut self, len: usize) {
        self.buf.drain(..len.min(self.buf.len()));
        if self.buf.is_empty() && self.buf.capacity() > IDLE_CAPACITY {
            self.buf = Vec::new();
        }
    }

    /// The next complete thing in the buffer (`None`: more bytes needed).
    pub fn next(&mut self, limits: FrameLimits) -> Result<Option<Framed>, FrameError> {
        if self.buf.starts_with(b"\r\n\r\n") {
            self.consume(4);
            return Ok(Some(Framed::Ping));
        }
        if self.buf.starts_with(b"\r\n") {
            // `\r\n` then `\r` may yet become a ping.
            if self.buf.len() == 2 || self.buf.len() == 3 && self.buf[2] == b'\r' {
                return Ok(None);
            }
            self.consume(2);
            return Ok(Some(Framed::Pong));
        }
        let Some(header_len) = self.header_end(limits)? else {
            return Ok(None);
        };
        let body_len = content_length(&self.buf[..header_len])?;
        if body_len > limits.max_body_bytes {
            return Err(FrameError::BodyTooLarge);
        }
        let total = header_len + body_len;
        if self.buf.len() < total {
            return Ok(None);
        }
        Ok(Some(Framed::Message(total)))
    }

    /// Length of the header (through the empty line) if it is complete;
    /// errors for a first line that is not SIP and a header too long.
    fn header_end(&self, limits: FrameLimits) -> Result<Option<usize>, FrameError> {
        let window = &self.buf[..self.buf.len().min(limits.max_header_bytes)];
        if let Some(line_end) = memchr::memmem::find(window, b"\r\n") {
            if !is_start_line(&window[..line_end]) {
                return Err(FrameError::Garbage);
            }
        } else if window.len() >= 8 && !could_start_sip(window) {
            return Err(FrameError::Garbage);
        }
        match memchr::memmem::find(window, b"\r\n\r\n") {
            Some(at) => Ok(Some(at + 4)),
            None if self.buf.len() >= limits.max_header_bytes => Err(FrameError::HeaderTooLarge),
            None => Ok(None),
        }
    }
}

/// Whether `line` is a request line (`METHOD uri SIP/2.0`) or a status
/// line (`SIP/2.0 code reason`).
fn is_start_line(line: &[u8]) -> bool {
    if line.len() >= 8 && line[..8].eq_ignore_ascii_case(b"SIP/2.0 ") {
        return true;
    }
    let token_end = line.iter().position(|&b| b == b' ').unwrap_or(0);
    token_end > 0
        && line[..token_end]
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || b"-.!%*_+`'~".contains(b))
        && line.len() >= 8
        && line[line.len() - 8..].eq_ignore_ascii_case(b" SIP/2.0")
}

/// Whether an unfinished first line can still become a SIP one: a status
/// line's `SIP/2.0 `, or a method token and a space.
fn could_start_sip(start: &[u8]) -> bool {
    if start[..8].eq_ignore_ascii_case(b"SIP/2.0 ") {
        return true;
    }
    match start.iter().position(|&b| b == b' ') {
        Some(end) => {
            end > 0
                && start[..end]
                    .iter()
                    .all(|b| b.is_ascii_alphanumeric() || b"-.!%*_+`'~".contains(b))
        }
        // A method token (at most 32 bytes) still being sent.
        None => {
            start.len() <= 32
                && start
                    .iter()
                    .all(|b| b.is_ascii_alphanumeric() || b"-.!%*_+`'~".contains(b))
        }
    }
}

/// The Content-Length of a complete header (`Content-Length` or compact
/// `l`), which a message on a stream must have.
fn content_length(header: &[u8]) -> Result<usize, FrameError> {
    let mut found = None;
    for line in header.split(|&b| b == b'\n').skip(1) {
        let Some(colon) = line.iter().position(|&b| b == b':') else {
            continue;
        };
        let name = line[..colon].trim_ascii();
        if name.eq_ignore_ascii_case(b"content-length") || name.eq_ignore_ascii_case(b"l") {
            let value = line[colon + 1..].trim_ascii();
            if value.is_empty() || value.len() > 9 || !value.iter().all(u8::is_ascii_digit) {
                return Err(FrameError::BadContentLength);
            }
            let n = value
                .iter()
                .fold(0usize, |n, &d| n * 10 + usize::from(d - b'0'));
            if found.is_some_and(|f| f != n) {
                return Err(FrameError::BadContentLength);
            }
            found = Some(n);
        }
    }
    found.ok_or(FrameError::BadContentLength)
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: FrameLimits = FrameLimits {
        max_header_bytes: 1024,
        max_body_bytes: 2048,
    };

    fn msg(body: &str) -> Vec<u8> {
        format!(
            "OPTIONS sip:a@192.0.2.1 SIP/2.0\r\nVia: SIP/2.0/TCP 192.0.2.2;branch=z9hG4bK1\r\n\
             Content-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .into_bytes()
    }

    /// Feed `data` in chunks of `chunk` bytes; the messages and keep-alives framed.
    fn frame(data: &[u8], chunk: usize) -> Result<Vec<Result<Vec<u8>, Framed>>, FrameError> {
        let mut framer = Framer::default();
        let mut out = Vec::new();
        for piece in data.chunks(chunk) {
            framer.extend(piece, LIMITS)?;
            while let Some(framed) = framer.next(LIMITS)? {
                match framed {
                    Framed::Message(len) => {
                        out.push(Ok(framer.buffered()[..len].to_vec()));
                        framer.consume(len);
                    }
                    other => out.push(Err(other)),
                }
            }
        }
        Ok(out)
    }

    #[test]
    fn messages_are_cut_by_content_length_whatever_the_chunking() {
        let mut stream = msg("v=0\r\n");
        stream.extend_from_slice(b"\r\n\r\n");
        stream.extend_from_slice(&msg(""));
        stream.extend_from_slice(b"\r\n");
        stream.extend_from_slice(&msg("hello"));
        for chunk in [1, 2, 3, 7, 64, 4096] {
            let out = frame(&stream, chunk).unwrap();
            assert_eq!(
                out,
                vec![
                    Ok(msg("v=0\r\n")),
                    Err(Framed::Ping),
                    Ok(msg("")),
                    Err(Framed::Pong),
                    Ok(msg("hello"))
                ],
                "chunk {chunk}"
            );
        }
    }

    #[test]
    fn bounds_and_garbage_are_errors() {
        let long = format!(
            "OPTIONS sip:a@b SIP/2.0\r\nX: {}\r\nContent-Length: 0\r\n\r\n",
            "x".repeat(2000)
        );
        assert_eq!(frame(long.as_bytes(), 100), Err(FrameError::HeaderTooLarge));
        assert_eq!(
            frame(long.as_bytes(), 5000),
            Err(FrameError::HeaderTooLarge)
        );
        let big = "OPTIONS sip:a@b SIP/2.0\r\nContent-Length: 4000\r\n\r\n";
        assert_eq!(frame(big.as_bytes(), 10), Err(FrameError::BodyTooLarge));
        let none = "OPTIONS sip:a@b SIP/2.0\r\nVia: x\r\n\r\n";
        assert_eq!(
            frame(none.as_bytes(), 10),
            Err(FrameError::BadContentLength)
        );
        let two = "OPTIONS sip:a@b SIP/2.0\r\nl: 1\r\nContent-Length: 2\r\n\r\nab";
        assert_eq!(frame(two.as_bytes(), 10), Err(FrameError::BadContentLength));
        assert_eq!(
            frame(b"GET / HTTP/1.1\r\n\r\n", 100),
            Err(FrameError::Garbage)
        );
        assert_eq!(
            frame(&[0u8, 1, 2, 3, 4, 5, 6, 7, 8], 9),
            Err(FrameError::Garbage)
        );
        // Found before the line ends.
        assert_eq!(frame(&[b'A'; 40], 40), Err(FrameError::Garbage));
    }

    #[test]
    fn an_idle_connection_keeps_no_large_buffer() {
        let limits = FrameLimits {
            max_header_bytes: 1024,
            max_body_bytes: 64 * 1024,
        };
        let mut framer = Framer::default();
        let body = "x".repeat(20_000);
        framer.extend(&msg(&body), limits).unwrap();
        assert!(framer.capacity() > IDLE_CAPACITY);
        let Some(Framed::Message(len)) = framer.next(limits).unwrap() else {
            panic!("no message");
        };
        framer.consume(len);
        assert_eq!(framer.capacity(), 0);
        assert!(!framer.in_message());
    }
}
