//! A phone on one TCP connection, written in the tests: it registers from
//! a chosen local address and answers the calls that come over that
//! connection (its flow, RFC 5626 5.3), as a SIP phone behind a NAT or a
//! firewall does.

use super::header_name;
use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// What the phone counted.
#[derive(Default)]
pub(crate) struct PhoneCounts {
    /// `200` answers to its REGISTERs.
    pub registered: AtomicU64,
    /// INVITEs answered `200`.
    pub answered: AtomicU64,
    /// ACKs received.
    pub acks: AtomicU64,
    /// BYEs answered `200`.
    pub byes: AtomicU64,
}

/// A phone `user`@`domain` on one TCP connection from `local` to the
/// proxy; a thread answers what comes in until it is dropped.
pub(crate) struct TcpPhone {
    writer: Arc<Mutex<TcpStream>>,
    local: SocketAddr,
    user: String,
    domain: String,
    registers: u32,
    /// Its counts (shared with its thread).
    pub counts: Arc<PhoneCounts>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl TcpPhone {
    /// Connect from `local` (address and port: the Contact names it, so
    /// requests to it find this connection) to `proxy`, start answering.
    pub(crate) fn connect(local: SocketAddr, proxy: SocketAddr, user: &str, domain: &str) -> Self {
        let socket = socket2::Socket::new(
            socket2::Domain::for_address(proxy),
            socket2::Type::STREAM,
            Some(socket2::Protocol::TCP),
        )
        .expect("a TCP socket");
        socket.set_reuse_address(true).unwrap();
        socket
            .bind(&local.into())
            .expect("bind the phone's address");
        socket
            .connect_timeout(&proxy.into(), Duration::from_secs(5))
            .expect("the phone connects to the proxy");
        let stream: TcpStream = socket.into();
        stream.set_nodelay(true).unwrap();
        let writer = Arc::new(Mutex::new(stream.try_clone().unwrap()));
        let counts = Arc::new(PhoneCounts::default());
        let stop = Arc::new(AtomicBool::new(false));
        let contact = format!("<sip:{user}@{local};transport=tcp>");
        let thread = {
            let (writer, counts, stop) = (writer.clone(), counts.clone(), stop.clone());
            std::thread::spawn(move || answer(stream, &writer, &counts, &stop, &contact))
        };
        TcpPhone {
            writer,
            local,
            user: user.to_string(),
            domain: domain.to_string(),
            registers: 0,
            counts,
            stop,
            thread: Some(thread),
        }
    }

    /// Send a REGISTER (Expires 600) over the connection and wait
    /// (bounded) for its `200`: whether it came.
    pub(crate) fn register(&mut self, limit: Duration) -> bool {
        self.registers += 1;
        let n = self.registers;
        let (user, domain, local) = (&self.user, &self.domain, self.local);
        let register = format!(
            "REGISTER sip:{domain} SIP/2.0\r\n\
Via: SIP/2.0/TCP {local};branch=z9hG4bKphone{n};rport\r\nMax-Forwards: 70\r\n\
From: <sip:{user}@{domain}>;tag=phone\r\nTo: <sip:{user}@{domain}>\r\n\
Call-ID: phone-{user}-reg\r\nCSeq: {n} REGISTER\r\n\
Contact: <sip:{user}@{local};transport=tcp>\r\nExpires: 600\r\nContent-Length: 0\r\n\r\n"
        );
        let before = self.counts.registered.load(Ordering::Relaxed);
        if self
            .writer
            .lock()
            .unwrap()
            .write_all(register.as_bytes())
            .is_err()
        {
            return false;
        }
        let end = Instant::now() + limit;
        while Instant::now() < end {
            if self.counts.registered.load(Ordering::Relaxed) > before {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }
}

impl Drop for TcpPhone {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The phone's thread: frame what comes (Content-Length), answer INVITE
/// and BYE with `200`, count ACKs and the REGISTERs' `200`s.
fn answer(
    mut stream: TcpStream,
    writer: &Mutex<TcpStream>,
    counts: &PhoneCounts,
    stop: &AtomicBool,
    contact: &str,
) {
    stream
        .set_read_timeout(Some(Duration::from_millis(100)))
        .unwrap();
    let mut buffered: Vec<u8> = Vec::new();
    let mut chunk = [0u8; 16 * 1024];
    while !stop.load(Ordering::Relaxed) {
        match stream.read(&mut chunk) {
            Ok(0) => return,
            Ok(n) => buffered.extend_from_slice(&chunk[..n]),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => continue,
            Err(_) => return,
        }
        while let Some(message) = next_message(&mut buffered) {
            let reply = if message.starts_with("SIP/2.0 200") && cseq_method(&message) == "REGISTER"
            {
                counts.registered.fetch_add(1, Ordering::Relaxed);
                None
            } else if message.starts_with("INVITE ") {
                counts.answered.fetch_add(1, Ordering::Relaxed);
                Some(ok_to(&message, Some(contact)))
            } else if message.starts_with("BYE ") {
                counts.byes.fetch_add(1, Ordering::Relaxed);
                Some(ok_to(&message, None))
            } else {
                if message.starts_with("ACK ") {
                    counts.acks.fetch_add(1, Ordering::Relaxed);
                }
                None
            };
            if let Some(reply) = reply {
                if writer.lock().unwrap().write_all(reply.as_bytes()).is_err() {
                    return;
                }
            }
        }
    }
}

/// Take one whole message off the front of `buffered` (keep-alive CRLFs
/// before it skipped).
fn next_message(buffered: &mut Vec<u8>) -> Option<String> {
    while buffered.starts_with(b"\r\n") {
        buffered.drain(..2);
    }
    let head_end = buffered.windows(4).position(|w| w == b"\r\n\r\n")? + 4;
    let head = String::from_utf8_lossy(&buffered[..head_end]).into_owned();
    let body = head
        .lines()
        .find_map(|line| {
            let (name, value) = line.split_once(':')?;
            let name = name.trim().to_ascii_lowercase();
            (name == "content-length" || name == "l").then(|| value.trim().parse::<usize>().ok())?
        })
        .unwrap_or(0);
    if buffered.len() < head_end + body {
        return None;
    }
    let message = String::from_utf8_lossy(&buffered[..head_end + body]).into_owned();
    buffered.drain(..head_end + body);
    Some(message)
}

/// The method of a message's CSeq.
fn cseq_method(message: &str) -> String {
    message
        .lines()
        .find_map(|line| {
            let (name, value) = line.split_once(':')?;
            name.trim()
                .eq_ignore_ascii_case("cseq")
                .then(|| value.split_whitespace().nth(1).unwrap_or("").to_string())
        })
        .unwrap_or_default()
}

/// `200 OK` to `request`: its Vias, Record-Routes, From, Call-ID and CSeq
/// copied, its To with a tag, and `contact` (a dialog's Contact).
fn ok_to(request: &str, contact: Option<&str>) -> String {
    let head = request.split("\r\n\r\n").next().unwrap_or("");
    let mut reply = String::from("SIP/2.0 200 OK\r\n");
    for line in head.lines().skip(1) {
        let name = header_name(line);
        match name.as_str() {
            "via" | "v" | "record-route" | "from" | "f" | "call-id" | "i" | "cseq" => {
                reply.push_str(line);
                reply.push_str("\r\n");
            }
            "to" | "t" if !line.contains(";tag=") => {
                reply.push_str(&format!("{line};tag=phone\r\n"));
            }
            "to" | "t" => {
                reply.push_str(line);
                reply.push_str("\r\n");
            }
            _ => {}
        }
    }
    if let Some(contact) = contact {
        reply.push_str(&format!("Contact: {contact}\r\n"));
    }
    reply.push_str("Content-Length: 0\r\n\r\n");
    reply
}
