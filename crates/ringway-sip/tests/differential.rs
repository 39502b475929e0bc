//! Differential test against the `rsip` crate (test-only oracle): for valid
//! torture messages and generated messages both parsers must agree on the
//! fields a proxy routes by.

use ringway_sip::SipMsg;
use rsip::headers::{ToTypedHeader, UntypedHeader};
use rsip::prelude::HeadersExt;

#[derive(Debug, PartialEq)]
struct Fields {
    request: bool,
    method: Option<String>,
    status: Option<u16>,
    call_id: String,
    cseq: (u32, String),
    branch: Option<String>,
    from_tag: Option<String>,
    to_tag: Option<String>,
}

fn ours(b: &[u8]) -> Option<Fields> {
    let m = SipMsg::parse(b).ok()?;
    let cs = m.cseq()?;
    Some(Fields {
        request: m.is_request(),
        method: m.method().map(|x| x.as_str().to_string()),
        status: m.status(),
        call_id: m.call_id()?.to_string(),
        cseq: (cs.0, cs.1.as_str().to_string()),
        branch: m.top_via()?.branch.map(str::to_string),
        from_tag: m.from_tag().map(str::to_string),
        to_tag: m.to_tag().map(str::to_string),
    })
}

fn theirs(b: &[u8]) -> Option<Fields> {
    let msg = rsip::SipMessage::try_from(b).ok()?;
    let (request, method, status) = match &msg {
        rsip::SipMessage::Request(r) => (true, Some(r.method.to_string()), None),
        rsip::SipMessage::Response(r) => (false, None, Some(r.status_code.code())),
    };
    let cseq = msg.cseq_header().ok()?.typed().ok()?;
    let via = msg.via_header().ok()?.typed().ok()?;
    let from = msg.from_header().ok()?.typed().ok()?;
    let to = msg.to_header().ok()?.typed().ok()?;
    Some(Fields {
        request,
        method,
        status,
        call_id: msg.call_id_header().ok()?.value().trim().to_string(),
        cseq: (cseq.seq, cseq.method.to_string()),
        branch: via.branch().map(|b| b.to_string()),
        from_tag: from.tag().map(|t| t.to_string()),
        to_tag: to.tag().map(|t| t.to_string()),
    })
}

/// Tiny deterministic PRNG (xorshift64*).
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn pick<'a>(&mut self, v: &[&'a str]) -> &'a str {
        v[(self.next() % v.len() as u64) as usize]
    }
    fn token(&mut self, n: usize) -> String {
        const A: &[u8] = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-.";
        (0..n)
            .map(|_| A[(self.next() % A.len() as u64) as usize] as char)
            .collect()
    }
}

/// A generated message in two spellings: with compact/odd-case header
/// names (`.0`, for us) and with canonical long names (`.1`, for rsip, which
/// does not know compact forms).
fn generate(r: &mut Rng) -> (Vec<u8>, Vec<u8>) {
    let is_req = !r.next().is_multiple_of(3);
    let method = r.pick(&[
        "INVITE", "ACK", "BYE", "CANCEL", "OPTIONS", "REGISTER", "INFO", "MESSAGE",
    ]);
    let branch = format!("z9hG4bK{}", r.token(12));
    let mut hdrs: Vec<String> = Vec::new();
    let via_name = r.pick(&["Via", "v", "VIA"]);
    let host = r.pick(&["192.0.2.7", "198.51.100.33", "host.example.com"]);
    let port = if r.next().is_multiple_of(2) {
        ":5062"
    } else {
        ""
    };
    hdrs.push(format!(
        "{via_name}: SIP/2.0/UDP {host}{port};branch={branch}"
    ));
    if r.next().is_multiple_of(2) {
        hdrs.push(format!(
            "Via: SIP/2.0/TCP 198.51.100.{};branch=z9hG4bK{}",
            r.next() % 250,
            r.token(6)
        ));
    }
    let ftag = r.token(8);
    let from_name = r.pick(&["From", "f"]);
    let disp = r.pick(&["", "Alice ", "\"Alice A.\" "]);
    hdrs.push(format!(
        "{from_name}: {disp}<sip:alice@example.com>;tag={ftag}"
    ));
    let to_name = r.pick(&["To", "t"]);
    if is_req && r.next().is_multiple_of(2) {
        hdrs.push(format!("{to_name}: <sip:bob@example.com>"));
    } else {
        hdrs.push(format!(
            "{to_name}: Bob <sip:bob@example.com>;tag={}",
            r.token(6)
        ));
    }
    let cid_name = r.pick(&["Call-ID", "i", "call-id"]);
    hdrs.push(format!("{cid_name}: {}@{}", r.token(16), r.token(5)));
    let seq = r.next() % 100_000;
    hdrs.push(format!("CSeq: {seq} {method}"));
    hdrs.push("Max-Forwards: 70".to_string());
    if r.next().is_multiple_of(2) {
        hdrs.push("Contact: <sip:alice@192.0.2.7:5062>".to_string());
    }
    if r.next().is_multiple_of(3) {
        hdrs.push(format!("X-{}: {}", r.token(5), r.token(10)));
    }
    // shuffle (keep it simple: rotate by a random amount)
    let k = (r.next() % hdrs.len() as u64) as usize;
    hdrs.rotate_left(k);
    let body = if r.next().is_multiple_of(2) {
        "v=0\r\n"
    } else {
        ""
    };
    let start = if is_req {
        format!("{method} sip:bob@example.com SIP/2.0")
    } else {
        let code = r.pick(&[
            "100 Trying",
            "180 Ringing",
            "200 OK",
            "404 Not Found",
            "487 Request Terminated",
        ]);
        format!("SIP/2.0 {code}")
    };
    let compact = format!(
        "{start}\r\n{}\r\nl: {}\r\n\r\n{body}",
        hdrs.join("\r\n"),
        body.len()
    );
    let long: Vec<String> = hdrs
        .iter()
        .map(|h| {
            let (n, v) = h.split_once(": ").unwrap();
            let n = match n {
                "v" | "VIA" => "Via",
                "f" => "From",
                "t" => "To",
                "i" | "call-id" => "Call-ID",
                other => other,
            };
            format!("{n}: {v}")
        })
        .collect();
    let long = format!(
        "{start}\r\n{}\r\nContent-Length: {}\r\n\r\n{body}",
        long.join("\r\n"),
        body.len()
    );
    (compact.into_bytes(), long.into_bytes())
}

#[test]
fn agrees_with_rsip_on_generated_messages() {
    let mut r = Rng(0x1234_5678_9ABC_DEF1);
    for i in 0..500 {
        let (c, m) = generate(&mut r);
        let a =
            ours(&c).unwrap_or_else(|| panic!("#{i} ours failed: {}", String::from_utf8_lossy(&c)));
        let a2 =
            ours(&m).unwrap_or_else(|| panic!("#{i} ours failed: {}", String::from_utf8_lossy(&m)));
        let b = theirs(&m)
            .unwrap_or_else(|| panic!("#{i} rsip failed: {}", String::from_utf8_lossy(&m)));
        assert_eq!(a, a2, "#{i}: compact vs long spelling");
        assert_eq!(a, b, "#{i}: {}", String::from_utf8_lossy(&m));
    }
}

#[test]
fn agrees_with_rsip_on_valid_torture_messages() {
    let Some(dir) = ringway_io::testing::testdata("sip-torture") else {
        return;
    };
    let mut compared = Vec::new();
    let mut rsip_rejected = Vec::new();
    for sub in ["rfc4475", "rfc5118"] {
        let text = std::fs::read_to_string(dir.join(sub).join("MANIFEST.tsv")).unwrap();
        for line in text.lines().skip(1) {
            let cols: Vec<_> = line.split('\t').collect();
            if cols.len() < 3 || !cols[2].starts_with("valid") {
                continue;
            }
            let data = std::fs::read(dir.join(sub).join(cols[0])).unwrap();
            let a = ours(&data).unwrap_or_else(|| panic!("{}: we reject a valid message", cols[0]));
            match theirs(&data) {
                Some(b) => {
                    assert_eq!(a, b, "{}", cols[0]);
                    compared.push(cols[0].to_string());
                }
                None => rsip_rejected.push(cols[0].to_string()),
            }
        }
    }
    eprintln!(
        "compared with rsip: {} files; rsip could not parse {}: {:?}",
        compared.len(),
        rsip_rejected.len(),
        rsip_rejected
    );
    assert!(
        compared.len() >= 10,
        "too few comparable files: {compared:?}"
    );
}
