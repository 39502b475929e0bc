//! T_sip micro-benchmark (issue 23: parse, edit, branch hashing ≤ 1 µs
//! p50): the proxy core's time per message of the calls `ringway sip
//! load` makes (INVITE, 180, 200, ACK, BYE, 200 with its SDP, Via with
//! `rport`, Record-Routed), as `ringway sip proxy --relay 127.0.0.0/8`
//! sees them: relay policy, signed Record-Route, no flood limit, UDP only.
//! No I/O: each message is one `ProxyWorker::handle` call between two
//! clock readings (the server's T_sip, without the copy into the send
//! batch). Also the cost of a refused call under overload (INVITE
//! answered 503 with the core's shedding on, and its ACK), the driver's
//! peek at each datagram (`peek::is_new_invite`) included.
//!
//! The refused calls go through a proxy of their own, so that the call
//! messages are measured as in normal operation (after a refusal the core
//! peeks at ACKs for the refusal's tag for a while). Then the stages one by
//! one on the same datagrams, each between two clock readings, as a share
//! of the message's whole T_sip p50 (issue 23's profile): the strict parse
//! (`SipMsg::parse`, what the proxy runs), the lazy parse (no grammar check
//! of Via/From/To/Contact/Route/Record-Route values: the difference is the
//! grammar check), the loose parse (line scan, UTF-8, start line: the
//! floor of any parse), the SipHash-2-4 MACs the stateless proxy computes
//! for that message (replayed with the same inputs through the public
//! `KeyRing`: transaction and loop hashes, upstream MAC, Record-Route
//! signature), and the editor (`forward_request` with the proxy's edits /
//! `forward_response`) on an already parsed message. What is left of T_sip
//! (routing, relay policy, counters, the rest of the core) is the whole
//! minus those. The clock's own cost is printed too.
//!
//! `cargo bench -p ringway-sip --bench t_sip` (env: MODE=stateless|stateful,
//! CALLS=20000, ROUNDS=5, PARSE_ALONE=1; 0 leaves the stages out, e.g.
//! under `perf record`). Not a test: timings; run it on a quiet machine
//! and compare builds side by side (the harness uses only the public API,
//! so the same file builds against an older tree with a `KeyRing`).

use ringway_sip::edit::RemoveHeaders;
use ringway_sip::hash::{KeyRing, Purpose};
use ringway_sip::{
    forward_request, forward_response, Mode, Proxy, ProxyConfig, RelayNets, RequestEdits, SipMsg,
    ViaEdit,
};
use std::net::SocketAddr;
use std::time::Instant;

const PROXY: &str = "127.0.0.1:5060";
const UAC: &str = "127.0.0.1:5070";
const UAS: &str = "127.0.0.1:5080";
const SDP: &str = "v=0\r\no=ringway 1 1 IN IP4 127.0.0.1\r\ns=-\r\nc=IN IP4 127.0.0.1\r\nt=0 0\r\nm=audio 6000 RTP/AVP 0\r\na=rtpmap:0 PCMU/8000\r\n";
const KINDS: [&str; 8] = [
    "INVITE",
    "180",
    "200",
    "ACK",
    "BYE",
    "200-BYE",
    "INVITE-503",
    "ACK-503",
];

fn addr(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

/// One call's datagrams as they reach the proxy, with their senders.
struct Call {
    messages: Vec<(SocketAddr, Vec<u8>)>,
}

fn invite(n: u64, kind: char) -> Vec<u8> {
    format!(
        "INVITE sip:service@{UAS} SIP/2.0\r\nVia: SIP/2.0/UDP {UAC};branch=z9hG4bK-run-000-{n:08}-{kind};rport\r\n\
         Max-Forwards: 70\r\nFrom: <sip:ringway@{UAC}>;tag=000x{n:08}\r\nTo: <sip:service@{UAS}>\r\n\
         Call-ID: {n:08}-000-run@ringway\r\nCSeq: 1 INVITE\r\nContact: <sip:ringway@{UAC}>\r\n\
         Content-Type: application/sdp\r\nContent-Length: {}\r\n\r\n{SDP}",
        SDP.len()
    )
    .into_bytes()
}

/// Header lines of `msg` named `name` (any case), in order.
fn headers<'a>(msg: &'a str, name: &str) -> Vec<&'a str> {
    msg.split("\r\n")
        .skip(1)
        .take_while(|l| !l.is_empty())
        .filter(|l| {
            l.split(':')
                .next()
                .is_some_and(|h| h.trim().eq_ignore_ascii_case(name))
        })
        .collect()
}

/// The UAS's answer `status` to the forwarded request `fwd`.
fn answer(fwd: &[u8], status: &str, to_tag: &str, body: bool) -> Vec<u8> {
    let text = String::from_utf8_lossy(fwd);
    let mut out = format!("SIP/2.0 {status}\r\n");
    for name in ["via", "record-route", "from"] {
        for line in headers(&text, name) {
            out.push_str(line);
            out.push_str("\r\n");
        }
    }
    let to = headers(&text, "to")[0];
    if to.contains(";tag=") {
        out.push_str(&format!("{to}\r\n"));
    } else {
        out.push_str(&format!("{to};tag={to_tag}\r\n"));
    }
    for name in ["call-id", "cseq"] {
        out.push_str(headers(&text, name)[0]);
        out.push_str("\r\n");
    }
    out.push_str(&format!("Contact: <sip:service@{UAS}>\r\n"));
    if body {
        out.push_str(&format!(
            "Content-Type: application/sdp\r\nContent-Length: {}\r\n\r\n{SDP}",
            SDP.len()
        ));
    } else {
        out.push_str("Content-Length: 0\r\n\r\n");
    }
    out.into_bytes()
}

/// An in-dialog request of the UAC after the 200 `ok` (its Record-Routes
/// as the route set).
fn in_dialog(ok: &[u8], method: &str, n: u64, cseq: u32, kind: char) -> Vec<u8> {
    let text = String::from_utf8_lossy(ok);
    let mut out = format!(
        "{method} sip:service@{UAS} SIP/2.0\r\nVia: SIP/2.0/UDP {UAC};branch=z9hG4bK-run-000-{n:08}-{kind};rport\r\n\
         Max-Forwards: 70\r\n"
    );
    for rr in headers(&text, "record-route").iter().rev() {
        let value = rr.split_once(':').unwrap().1.trim();
        out.push_str(&format!("Route: {value}\r\n"));
    }
    for name in ["from", "to", "call-id"] {
        out.push_str(headers(&text, name)[0]);
        out.push_str("\r\n");
    }
    out.push_str(&format!(
        "CSeq: {cseq} {method}\r\nContent-Length: 0\r\n\r\n"
    ));
    out.into_bytes()
}

/// Run one message through `proxy` (a throwaway worker) and return what
/// it sent.
fn through(proxy: &Proxy, from: &str, msg: &[u8], shed: bool) -> Vec<(SocketAddr, Vec<u8>)> {
    let mut w = proxy.worker();
    w.set_shedding(shed);
    let mut sent = Vec::new();
    w.handle(1, addr(from), msg, &mut |to, bytes| {
        sent.push((to, bytes.to_vec()))
    });
    sent
}

fn sent_to(sent: &[(SocketAddr, Vec<u8>)], to: &str) -> Vec<u8> {
    sent.iter()
        .rev()
        .find(|(a, b)| *a == addr(to) && !b.starts_with(b"SIP/2.0 100"))
        .unwrap_or_else(|| panic!("nothing sent to {to}: {sent:?}"))
        .1
        .clone()
}

/// Record call `n`'s datagrams on a proxy of its own (so the measured
/// proxy sees each for the first time), and a refused call's.
fn record(config: &ProxyConfig, n: u64) -> (Call, Call) {
    let proxy = Proxy::new(config.clone());
    let inv = invite(n, 'i');
    let fwd = sent_to(&through(&proxy, UAC, &inv, false), UAS);
    let ringing = answer(&fwd, "180 Ringing", "u1", false);
    let ok = answer(&fwd, "200 OK", "u1", true);
    let ok_up = sent_to(&through(&proxy, UAS, &ok, false), UAC);
    let ack = in_dialog(&ok_up, "ACK", n, 1, 'a');
    through(&proxy, UAC, &ack, false);
    let bye = in_dialog(&ok_up, "BYE", n, 2, 'b');
    let bye_fwd = sent_to(&through(&proxy, UAC, &bye, false), UAS);
    let bye_ok = answer(&bye_fwd, "200 OK", "u1", false);
    let call = Call {
        messages: vec![
            (addr(UAC), inv),
            (addr(UAS), ringing),
            (addr(UAS), ok),
            (addr(UAC), ack),
            (addr(UAC), bye),
            (addr(UAS), bye_ok),
        ],
    };
    let refused_inv = invite(n + 1_000_000, 'r');
    let refusal = sent_to(&through(&proxy, UAC, &refused_inv, true), UAC);
    assert!(refusal.starts_with(b"SIP/2.0 503"));
    let text = String::from_utf8_lossy(&refusal);
    let to = headers(&text, "to")[0];
    let ack = format!(
        "ACK sip:service@{UAS} SIP/2.0\r\nVia: SIP/2.0/UDP {UAC};branch=z9hG4bK-run-000-{:08}-r;rport\r\n\
         Max-Forwards: 70\r\nFrom: <sip:ringway@{UAC}>;tag=000x{:08}\r\n{to}\r\n\
         Call-ID: {:08}-000-run@ringway\r\nCSeq: 1 ACK\r\nContent-Length: 0\r\n\r\n",
        n + 1_000_000,
        n + 1_000_000,
        n + 1_000_000
    );
    let refused = Call {
        messages: vec![(addr(UAC), refused_inv), (addr(UAC), ack.into_bytes())],
    };
    (call, refused)
}

fn percentile(sorted: &[u64], p: f64) -> u64 {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn main() {
    let env = |k: &str, d: &str| std::env::var(k).unwrap_or_else(|_| d.to_string());
    let mode = match env("MODE", "stateless").as_str() {
        "stateful" => Mode::Stateful,
        _ => Mode::Stateless,
    };
    let calls: u64 = env("CALLS", "20000").parse().unwrap();
    let rounds: usize = env("ROUNDS", "5").parse().unwrap();
    let config = ProxyConfig {
        mode,
        local: addr(PROXY),
        record_route: true,
        relay: "127.0.0.0/8".parse::<RelayNets>().unwrap(),
        max_transactions: 10_000_000,
        max_transaction_bytes: 1 << 34,
        ..ProxyConfig::default()
    };
    let recorded: Vec<(Call, Call)> = (0..calls).map(|n| record(&config, n)).collect();
    let mut samples: Vec<Vec<u64>> = vec![Vec::new(); KINDS.len()];
    let mut sink = 0usize;
    let mut stages: Vec<Stages> = (0..KINDS.len())
        .map(|kind| Stages::new(KINDS[kind]))
        .collect();
    let keys = KeyRing::from_seed(7);
    for _ in 0..rounds {
        // A fresh proxy per round: in stateful mode every call is new.
        let proxy = Proxy::new(config.clone());
        let mut w = proxy.worker();
        let refusing = Proxy::new(config.clone());
        let mut r = refusing.worker();
        for (call, refused) in &recorded {
            for (kind, (from, msg)) in call.messages.iter().enumerate() {
                let t0 = Instant::now();
                w.handle(2, *from, msg, &mut |_, bytes| sink += bytes.len());
                samples[kind].push(t0.elapsed().as_nanos() as u64);
            }
            for (i, (from, msg)) in refused.messages.iter().enumerate() {
                let t0 = Instant::now();
                // The server's driver peeks at each datagram while it
                // sheds: counted in the refusal's cost.
                r.set_shedding(ringway_sip::peek::is_new_invite(msg));
                r.handle(2, *from, msg, &mut |_, bytes| sink += bytes.len());
                samples[6 + i].push(t0.elapsed().as_nanos() as u64);
                r.set_shedding(false);
            }
        }
        // PARSE_ALONE=0 leaves the stages out (for a profiler).
        if env("PARSE_ALONE", "1") != "0" {
            for (call, _) in &recorded {
                for (kind, (from, msg)) in call.messages.iter().enumerate() {
                    stages[kind].time(*from, msg, &keys, &mut sink);
                }
            }
        }
    }
    println!(
        "T_sip per message, {mode:?}, {calls} calls x {rounds} rounds (ns; {} bytes out)",
        sink
    );
    println!(
        "{:<11} {:>7} {:>7} {:>7} {:>7}",
        "type", "p50", "p90", "p99", "mean"
    );
    let mut call_p50 = 0;
    let mut all: Vec<u64> = Vec::new();
    for (kind, s) in KINDS.iter().zip(samples.iter_mut()) {
        s.sort_unstable();
        let mean = s.iter().sum::<u64>() as f64 / s.len() as f64;
        println!(
            "{kind:<11} {:>7} {:>7} {:>7} {:>7.0}",
            percentile(s, 0.5),
            percentile(s, 0.9),
            percentile(s, 0.99),
            mean
        );
        if !kind.ends_with("503") {
            call_p50 += percentile(s, 0.5);
            all.extend_from_slice(s);
        }
    }
    all.sort_unstable();
    println!(
        "all call messages: p50 {} ns; a call (sum of p50s) {call_p50} ns; a refusal {} ns",
        percentile(&all, 0.5),
        percentile(&samples[6], 0.5) + percentile(&samples[7], 0.5)
    );
    println!(
        "stages, p50 ns and share of the message's T_sip p50 (the rest: routing, policy, \
         counters; clock reading pair {} ns p50, inside every figure)",
        clock_cost()
    );
    println!(
        "{:<11} {:>7} {:>13} {:>13} {:>13} {:>13} {:>13}",
        "type", "T_sip", "parse", "lazy parse", "loose parse", "MACs", "editor"
    );
    for (stage, whole) in stages.iter_mut().zip(&samples) {
        if stage.parse.is_empty() {
            break;
        }
        // (Sorted above.)
        let whole = percentile(whole, 0.5).max(1);
        let cell = |s: &mut Vec<u64>| {
            s.sort_unstable();
            let p50 = percentile(s, 0.5);
            format!("{p50} ({:.0} %)", 100.0 * p50 as f64 / whole as f64)
        };
        println!(
            "{:<11} {whole:>7} {:>13} {:>13} {:>13} {:>13} {:>13}",
            stage.kind,
            cell(&mut stage.parse),
            cell(&mut stage.lazy),
            cell(&mut stage.loose),
            cell(&mut stage.macs),
            cell(&mut stage.editor),
        );
    }
}

/// p50 of an empty interval between two clock readings (ns).
fn clock_cost() -> u64 {
    let mut s: Vec<u64> = (0..100_000)
        .map(|_| {
            let t0 = Instant::now();
            t0.elapsed().as_nanos() as u64
        })
        .collect();
    s.sort_unstable();
    percentile(&s, 0.5)
}

/// One message type's stage timings (ns per message).
struct Stages {
    kind: &'static str,
    parse: Vec<u64>,
    lazy: Vec<u64>,
    loose: Vec<u64>,
    macs: Vec<u64>,
    editor: Vec<u64>,
}

/// Time `f` once (ns); its result goes to `sink`.
fn timed(f: impl FnOnce() -> usize, sink: &mut usize) -> u64 {
    let t0 = Instant::now();
    let out = std::hint::black_box(f());
    let ns = t0.elapsed().as_nanos() as u64;
    *sink += out;
    ns
}

impl Stages {
    fn new(kind: &'static str) -> Stages {
        Stages {
            kind,
            parse: Vec::new(),
            lazy: Vec::new(),
            loose: Vec::new(),
            macs: Vec::new(),
            editor: Vec::new(),
        }
    }

    /// Time each stage once on `msg` (from `from`).
    fn time(&mut self, from: SocketAddr, msg: &[u8], keys: &KeyRing, sink: &mut usize) {
        self.parse
            .push(timed(|| usize::from(SipMsg::parse(msg).is_ok()), sink));
        self.lazy
            .push(timed(|| usize::from(SipMsg::parse_lazy(msg).is_ok()), sink));
        self.loose.push(timed(
            || usize::from(SipMsg::parse_loose(msg).is_ok()),
            sink,
        ));
        let parsed = SipMsg::parse(msg).expect("recorded messages parse");
        self.macs
            .push(timed(|| macs(&parsed, from, keys) as usize & 1, sink));
        let mut out = Vec::with_capacity(msg.len() + 512);
        let edits = proxy_edits(&parsed);
        self.editor.push(timed(
            || match parsed.is_request() {
                true => forward_request(&parsed, &edits, &mut out).unwrap_or(0),
                false => forward_response(&parsed, &mut out).unwrap_or(0),
            },
            sink,
        ));
    }
}

/// Our Record-Route as the proxy writes it (`;rw=` signature of 11
/// characters) and a branch of ours (`z9hG4bKrw` + 16.8.8 hex digits).
const RECORD_ROUTE: &str = "sip:127.0.0.1:5060;lr;rw=AAAAAAAAAAA";
const BRANCH: &str = "z9hG4bKrw0123456789abcdef.01234567.89abcdef";

/// The edits the stateless proxy makes to a request of the call: its Via,
/// Max-Forwards, `rport` filled, its Route popped in a dialog, its
/// Record-Route on the INVITE, asserted identities removed.
fn proxy_edits(msg: &SipMsg<'_>) -> RequestEdits<'static> {
    let in_dialog = msg.to_tag().is_some();
    RequestEdits {
        via: Some(ViaEdit {
            transport: "UDP",
            sent_by: PROXY,
            branch: BRANCH,
            alias: false,
        }),
        max_forwards: true,
        record_route: (!in_dialog).then_some(RECORD_ROUTE),
        pop_routes: usize::from(in_dialog),
        rport: msg.top_via().filter(|v| v.rport_flag).map(|_| 5070),
        remove: RemoveHeaders {
            asserted_identity: true,
            proxy_authorization_realms: &[],
        },
        ..RequestEdits::default()
    }
}

/// The SipHash-2-4 MACs the stateless proxy computes for `msg` from
/// `from`, with the same inputs (`proxy/branch.rs`): a request's
/// transaction and loop hashes, its upstream MAC, and the Record-Route
/// signature (made on an INVITE, checked on an in-dialog request); a
/// response's upstream MAC check.
fn macs(msg: &SipMsg<'_>, from: SocketAddr, keys: &KeyRing) -> u64 {
    let via = msg.top_via().expect("a Via");
    let call_id = msg.call_id().unwrap_or("");
    let from_tag = msg.from_tag().unwrap_or("");
    if !msg.is_request() {
        let next = msg.second_via().and_then(|v| v.response_target());
        return keys
            .mac(Purpose::Upstream)
            .u64(via.branch.map_or(0, |b| b.len() as u64))
            .addr(next.unwrap_or(from))
            .finish();
    }
    let transaction = keys
        .mac(Purpose::Transaction)
        .str(via.branch.unwrap_or(""))
        .str(via.host)
        .u64(u64::from(via.port.unwrap_or(5060)))
        .finish();
    let loop_detect = keys
        .mac(Purpose::LoopDetect)
        .str(msg.request_uri().unwrap_or(""))
        .str(from_tag)
        .str(msg.to_tag().unwrap_or(""))
        .str(call_id)
        .u64(u64::from(msg.cseq().map_or(0, |c| c.0)))
        .finish();
    let upstream = keys
        .mac(Purpose::Upstream)
        .u64(transaction)
        .addr(from)
        .finish();
    let signature = keys
        .mac(Purpose::RecordRoute)
        .str(call_id)
        .str(from_tag)
        .finish();
    transaction ^ loop_detect ^ upstream ^ signature
}
