//! The generator's messages, rendered from constant pieces.
//!
//! Everything that does not change between calls (addresses, run id,
//! generator index, SDP) is formatted once; a message is then a few slice
//! copies plus the call number. Call numbers go in fixed width (`{n:08}`),
//! so every message of a kind has one length across calls and UDP GSO can
//! send them as one train.

use super::view::{name_addr_uri, Hdr, View};

/// The SDP offer and answer.
pub(crate) const SDP: &str = "v=0\r\no=ringway 1 1 IN IP4 127.0.0.1\r\ns=-\r\nc=IN IP4 127.0.0.1\r\nt=0 0\r\nm=audio 6000 RTP/AVP 0\r\na=rtpmap:0 PCMU/8000\r\n";

/// What an in-dialog request (ACK, BYE) needs of its dialog.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Dialog {
    /// The remote To tag.
    pub to_tag: Vec<u8>,
    /// Route set (name-addr values as received, already reversed for the UAC).
    pub route: Vec<Vec<u8>>,
    /// Remote target (Contact URI of the 200).
    pub target: Vec<u8>,
}

/// Constant pieces of one generator's messages (formatting every message
/// with `write!` was a visible share of the user time).
pub(crate) struct Templates {
    /// `INVITE sip:service@{ruri} SIP/2.0\r\n`.
    invite_line: Vec<u8>,
    /// `ACK sip:service@{ruri} SIP/2.0\r\n`.
    ack_line: Vec<u8>,
    /// `Via: SIP/2.0/UDP {local};branch=z9hG4bK-{run}-{index:03}-` (call number follows).
    via: Vec<u8>,
    /// `From: <sip:ringway@{local}>;tag={index:03}x` (call number follows).
    from: Vec<u8>,
    /// `To: <sip:service@{ruri}>`.
    to: Vec<u8>,
    /// `-{index:03}-{run}@ringway`: the Call-ID after the call number.
    call_id_tail: Vec<u8>,
    /// The INVITE from its CSeq to the end of the SDP body.
    invite_tail: Vec<u8>,
    /// `Contact: <sip:service@{local}>\r\n` of the UAS.
    uas_contact: Vec<u8>,
    /// `Content-Type: application/sdp\r\nContent-Length: ..\r\n\r\n{SDP}`.
    sdp_tail: Vec<u8>,
    /// What follows the branch: `;rport` (and `;oc` with overload control).
    via_tail: &'static [u8],
}

impl Templates {
    /// Pieces for a generator at `local` calling `ruri` (host:port of the
    /// Request-URI), in run `run`, generator number `index`.
    /// With `overload_control`, the Via carries RFC 7339's `oc`.
    pub(crate) fn new(
        local: &str,
        ruri: &str,
        run: &str,
        index: usize,
        overload_control: bool,
    ) -> Templates {
        let sdp_tail = format!(
            "Content-Type: application/sdp\r\nContent-Length: {}\r\n\r\n{SDP}",
            SDP.len()
        );
        Templates {
            invite_line: format!("INVITE sip:service@{ruri} SIP/2.0\r\n").into_bytes(),
            ack_line: format!("ACK sip:service@{ruri} SIP/2.0\r\n").into_bytes(),
            via: format!("Via: SIP/2.0/UDP {local};branch=z9hG4bK-{run}-{index:03}-").into_bytes(),
            from: format!("From: <sip:ringway@{local}>;tag={index:03}x").into_bytes(),
            to: format!("To: <sip:service@{ruri}>").into_bytes(),
            call_id_tail: format!("-{index:03}-{run}@ringway").into_bytes(),
            invite_tail: format!("CSeq: 1 INVITE\r\nContact: <sip:ringway@{local}>\r\n{sdp_tail}")
                .into_bytes(),
            uas_contact: format!("Contact: <sip:service@{local}>\r\n").into_bytes(),
            sdp_tail: sdp_tail.into_bytes(),
            via_tail: if overload_control {
                b";rport;oc\r\nMax-Forwards: 70\r\n"
            } else {
                b";rport\r\nMax-Forwards: 70\r\n"
            },
        }
    }

    /// `Via: ...-{n:08}-{kind};rport\r\nMax-Forwards: 70\r\n`.
    fn push_via(&self, out: &mut Vec<u8>, n: u64, kind: u8) {
        out.extend_from_slice(&self.via);
        push_dec(out, n, 8);
        out.push(b'-');
        out.push(kind);
        out.extend_from_slice(self.via_tail);
    }

    /// `From: ...x{n:08}\r\n`.
    fn push_from(&self, out: &mut Vec<u8>, n: u64) {
        out.extend_from_slice(&self.from);
        push_dec(out, n, 8);
        out.extend_from_slice(b"\r\n");
    }

    /// `Call-ID: {n:08}-{index:03}-{run}@ringway\r\n`.
    fn push_call_id(&self, out: &mut Vec<u8>, n: u64) {
        out.extend_from_slice(b"Call-ID: ");
        push_dec(out, n, 8);
        out.extend_from_slice(&self.call_id_tail);
        out.extend_from_slice(b"\r\n");
    }

    /// Parse one of our own Call-IDs back to its call number.
    pub(crate) fn call_number(&self, call_id: &[u8]) -> Option<u64> {
        let digits = call_id.strip_suffix(self.call_id_tail.as_slice())?;
        if digits.is_empty() || digits.len() > 19 || !digits.iter().all(u8::is_ascii_digit) {
            return None;
        }
        Some(
            digits
                .iter()
                .fold(0u64, |a, &d| a * 10 + u64::from(d - b'0')),
        )
    }

    /// The INVITE of call `n` (the same bytes for every retransmission).
    pub(crate) fn invite(&self, out: &mut Vec<u8>, n: u64) {
        out.clear();
        out.extend_from_slice(&self.invite_line);
        self.push_via(out, n, b'i');
        self.push_from(out, n);
        out.extend_from_slice(&self.to);
        out.extend_from_slice(b"\r\n");
        self.push_call_id(out, n);
        out.extend_from_slice(&self.invite_tail);
    }

    /// ACK of call `n` for a non-2xx final response (RFC 3261 17.1.1.3):
    /// same branch as the INVITE, `to` (the To line of the response).
    pub(crate) fn ack_non2xx(&self, out: &mut Vec<u8>, n: u64, to: &[u8]) {
        out.clear();
        out.extend_from_slice(&self.ack_line);
        self.push_via(out, n, b'i');
        self.push_from(out, n);
        out.extend_from_slice(to);
        out.extend_from_slice(b"\r\n");
        self.push_call_id(out, n);
        out.extend_from_slice(b"CSeq: 1 ACK\r\nContent-Length: 0\r\n\r\n");
    }

    /// In-dialog request `method` (ACK or BYE) of call `n` with CSeq number
    /// `cseq`. RFC 3261 12.2.1.1: loose routing keeps the remote target in
    /// the Request-URI; a `strict` first route becomes the Request-URI and
    /// the remote target goes last in the Route header.
    pub(crate) fn in_dialog(
        &self,
        out: &mut Vec<u8>,
        n: u64,
        method: &str,
        cseq: u32,
        d: &Dialog,
        strict: bool,
    ) {
        out.clear();
        out.extend_from_slice(method.as_bytes());
        out.push(b' ');
        if strict {
            let first_route = name_addr_uri(&d.route[0]);
            let strip = first_route
                .iter()
                .position(|&b| b == b';')
                .unwrap_or(first_route.len());
            out.extend_from_slice(&first_route[..strip]);
        } else {
            out.extend_from_slice(&d.target);
        }
        out.extend_from_slice(b" SIP/2.0\r\n");
        self.push_via(out, n, if method == "ACK" { b'a' } else { b'b' });
        let routes = if strict { &d.route[1..] } else { &d.route[..] };
        if !routes.is_empty() || strict {
            out.extend_from_slice(b"Route: ");
            for (i, r) in routes.iter().enumerate() {
                if i > 0 {
                    out.extend_from_slice(b", ");
                }
                out.extend_from_slice(r);
            }
            if strict {
                if !routes.is_empty() {
                    out.extend_from_slice(b", ");
                }
                out.push(b'<');
                out.extend_from_slice(&d.target);
                out.push(b'>');
            }
            out.extend_from_slice(b"\r\n");
        }
        self.push_from(out, n);
        out.extend_from_slice(&self.to);
        out.extend_from_slice(b";tag=");
        out.extend_from_slice(&d.to_tag);
        out.extend_from_slice(b"\r\n");
        self.push_call_id(out, n);
        out.extend_from_slice(b"CSeq: ");
        push_dec(out, u64::from(cseq), 1);
        out.push(b' ');
        out.extend_from_slice(method.as_bytes());
        out.extend_from_slice(b"\r\nContent-Length: 0\r\n\r\n");
    }

    /// The UAS's response `code reason` to request `v`. A `dialog` response
    /// (to INVITE) copies Record-Route and carries the UAS Contact, and
    /// with 200 the SDP answer.
    pub(crate) fn response(
        &self,
        out: &mut Vec<u8>,
        v: &View<'_>,
        code: u16,
        reason: &str,
        dialog: bool,
    ) {
        let call_id = v.call_id().unwrap_or_default();
        out.clear();
        out.extend_from_slice(b"SIP/2.0 ");
        push_dec(out, u64::from(code), 3);
        out.push(b' ');
        out.extend_from_slice(reason.as_bytes());
        out.extend_from_slice(b"\r\n");
        for line in v.lines(Hdr::Via) {
            out.extend_from_slice(line);
            out.extend_from_slice(b"\r\n");
        }
        if dialog {
            for line in v.lines(Hdr::RecordRoute) {
                out.extend_from_slice(line);
                out.extend_from_slice(b"\r\n");
            }
        }
        for h in [Hdr::From, Hdr::To, Hdr::CallId, Hdr::CSeq] {
            if let Some(line) = v.lines(h).next() {
                out.extend_from_slice(line);
                if h == Hdr::To && v.to_tag().is_none() {
                    out.extend_from_slice(b";tag=");
                    push_hex16(out, to_tag_of(call_id));
                }
                out.extend_from_slice(b"\r\n");
            }
        }
        if dialog {
            out.extend_from_slice(&self.uas_contact);
        }
        if dialog && code == 200 {
            out.extend_from_slice(&self.sdp_tail);
        } else {
            out.extend_from_slice(b"Content-Length: 0\r\n\r\n");
        }
    }
}

/// FNV-1a of the Call-ID: the UAS's To tag.
pub(crate) fn to_tag_of(call_id: &[u8]) -> u64 {
    call_id.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
    })
}

/// Append `n` in decimal, zero-padded to at least `width` digits.
pub(crate) fn push_dec(out: &mut Vec<u8>, mut n: u64, width: usize) {
    let mut buf = [b'0'; 20];
    let mut pos = buf.len();
    loop {
        pos -= 1;
        buf[pos] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    let start = pos.min(buf.len() - width.min(buf.len()));
    out.extend_from_slice(&buf[start..]);
}

/// Append `n` as 16 lowercase hex digits.
fn push_hex16(out: &mut Vec<u8>, n: u64) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    for k in (0..16).rev() {
        out.push(HEX[((n >> (4 * k)) & 0xf) as usize]);
    }
}
