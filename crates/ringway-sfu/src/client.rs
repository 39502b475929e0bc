//! Client-side logic without I/O: RTP stream generation, control requests
//! and replies, and per-stream sequence tracking (loss, reordering). The
//! latency statistics of a load run live with the load tool
//! (`ringway_load::sfu`).

use crate::wire::{
    self, Control, ErrorCode, MediaType, MsgType, RtpHeader, Selector, RTP_HEADER_LEN,
    SEND_TIME_EXT_LEN,
};

/// Generates one RTP stream (one source SSID, one media type).
#[derive(Clone, Debug)]
pub struct StreamGen {
    /// Source SSID (the SSRC).
    pub ssid: u32,
    /// Media type.
    pub media: MediaType,
    /// Packet size in bytes (at least header + send-time extension).
    pub size: usize,
    /// Sending interval (ns).
    pub interval_ns: u64,
    seq: u16,
    ts: u32,
}

impl StreamGen {
    /// A stream starting at sequence number `first_seq`.
    pub fn new(ssid: u32, media: MediaType, size: usize, interval_ns: u64, first_seq: u16) -> Self {
        StreamGen {
            ssid,
            media,
            size: size.max(RTP_HEADER_LEN + SEND_TIME_EXT_LEN),
            interval_ns,
            seq: first_seq,
            ts: 0,
        }
    }
    /// Write the next packet into `buf` stamped with `send_time` (ns);
    /// returns its length (`None` if `buf` is too small).
    pub fn next_packet(&mut self, buf: &mut [u8], send_time: u64) -> Option<usize> {
        let header = RtpHeader {
            payload_type: self.media.payload_type(),
            marker: false,
            seq: self.seq,
            timestamp: self.ts,
            ssrc: self.ssid,
        };
        let len = wire::write_rtp(buf, &header, Some(send_time), self.size)?;
        self.seq = self.seq.wrapping_add(1);
        let step = self.media.clock_rate() as u64 * self.interval_ns / 1_000_000_000;
        self.ts = self.ts.wrapping_add(step as u32);
        Some(len)
    }
    /// Packets generated so far modulo 2^16 (the next sequence number).
    pub fn next_seq(&self) -> u16 {
        self.seq
    }
}

/// Tracks one received stream's sequence numbers.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct SeqTracker {
    /// Packets received (duplicates included).
    pub received: u64,
    /// Packets that arrived after a higher sequence number (late/out of order).
    pub reordered: u64,
    /// Packets whose sequence number was already seen as the highest (exact repeats of the max).
    pub duplicates: u64,
    first: i64,
    max: i64,
    started: bool,
}

impl SeqTracker {
    /// Record sequence number `seq`.
    pub fn record(&mut self, seq: u16) {
        self.received += 1;
        if !self.started {
            self.started = true;
            self.first = seq as i64;
            self.max = seq as i64;
            return;
        }
        // Extend to the value nearest to the current maximum.
        let base = self.max & !0xffff;
        let mut ext = base | seq as i64;
        if ext - self.max > 0x8000 {
            ext -= 0x1_0000;
        } else if self.max - ext > 0x8000 {
            ext += 0x1_0000;
        }
        match ext.cmp(&self.max) {
            std::cmp::Ordering::Greater => self.max = ext,
            std::cmp::Ordering::Less => {
                self.reordered += 1;
                if ext < self.first {
                    self.first = ext;
                }
            }
            std::cmp::Ordering::Equal => self.duplicates += 1,
        }
    }
    /// Packets expected from first to highest sequence number seen.
    pub fn expected(&self) -> u64 {
        if self.started {
            (self.max - self.first + 1) as u64
        } else {
            0
        }
    }
    /// Expected minus received (never negative).
    pub fn lost(&self) -> u64 {
        self.expected()
            .saturating_sub(self.received - self.duplicates)
    }
}

/// Identity of a registered client.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Session {
    /// Assigned SSID.
    pub ssid: u32,
    /// Token proving ownership of the SSID in control requests.
    pub token: u64,
}

/// A parsed control reply.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Reply {
    /// ACK with (request id, session).
    Ack(u32, Session),
    /// ERROR with (request id, code, ssid).
    Error(u32, Option<ErrorCode>, u32),
    /// CHALLENGE with (request id, cookie): repeat the REGISTER (or send a
    /// JOIN) carrying this cookie.
    Challenge(u32, [u8; wire::COOKIE_LEN]),
}

/// Parse an SFU reply; `None` for anything else.
pub fn parse_reply(data: &[u8]) -> Option<Reply> {
    let control = Control::new_checked(data).ok()?;
    match control.msg_type() {
        MsgType::Ack => Some(Reply::Ack(
            control.request_id(),
            Session {
                ssid: control.ssid(),
                token: control.token(),
            },
        )),
        MsgType::Error => Some(Reply::Error(
            control.request_id(),
            control.error_code(),
            control.ssid(),
        )),
        MsgType::Challenge => Some(Reply::Challenge(control.request_id(), control.cookie()?)),
        _ => None,
    }
}

/// Builds control requests with increasing request ids.
#[derive(Clone, Debug, Default)]
pub struct Requests {
    next: u32,
}

impl Requests {
    fn id(&mut self) -> u32 {
        self.next = self.next.wrapping_add(1);
        self.next
    }
    /// A first REGISTER (no cookie: the SFU answers with a CHALLENGE);
    /// returns (request id, bytes).
    pub fn register(&mut self) -> (u32, Vec<u8>) {
        let id = self.id();
        let mut msg = vec![0u8; wire::CTRL_AUTH_LEN];
        wire::write_register(&mut msg, id).expect("sized");
        (id, msg)
    }
    /// REGISTER echoing the `cookie` of a CHALLENGE.
    pub fn register_with(&mut self, cookie: &[u8; wire::COOKIE_LEN]) -> (u32, Vec<u8>) {
        self.cookie_msg(MsgType::Register, cookie)
    }
    /// A version-2 REGISTER for `room` with an optional join `token`;
    /// `cookie` is zeros on the first try (answered by a CHALLENGE), then
    /// the CHALLENGE's. `None` if the room or token is too long.
    pub fn register_v2(
        &mut self,
        cookie: &[u8; wire::COOKIE_LEN],
        room: &str,
        token: &[u8],
    ) -> Option<(u32, Vec<u8>)> {
        let id = self.id();
        let mut msg = vec![0u8; wire::CTRL_AUTH_LEN + 3 + room.len() + token.len()];
        let len = wire::write_register_v2(&mut msg, id, cookie, room.as_bytes(), token)?;
        msg.truncate(len);
        Some((id, msg))
    }
    /// REBIND of session `s` from a new address: `cookie` zeros on the
    /// first try, then the CHALLENGE's.
    pub fn rebind(&mut self, cookie: &[u8; wire::COOKIE_LEN], s: Session) -> (u32, Vec<u8>) {
        let id = self.id();
        let mut msg = vec![0u8; wire::CTRL_REBIND_LEN];
        wire::write_rebind(&mut msg, id, cookie, s.ssid, s.token).expect("sized");
        (id, msg)
    }
    /// A version-2 KEEPALIVE reporting the echo RTT (µs) measured so far.
    pub fn keepalive_v2(&mut self, s: Session, echo_rtt_us: Option<u32>) -> (u32, Vec<u8>) {
        let id = self.id();
        let mut msg = vec![0u8; wire::CTRL_KEEPALIVE_V2_LEN];
        wire::write_keepalive_v2(&mut msg, id, s.ssid, s.token, echo_rtt_us).expect("sized");
        (id, msg)
    }
    /// JOIN (static room) echoing the `cookie` of a CHALLENGE.
    pub fn join(&mut self, cookie: &[u8; wire::COOKIE_LEN]) -> (u32, Vec<u8>) {
        self.cookie_msg(MsgType::Join, cookie)
    }
    fn cookie_msg(&mut self, ty: MsgType, cookie: &[u8; wire::COOKIE_LEN]) -> (u32, Vec<u8>) {
        let id = self.id();
        let mut msg = vec![0u8; wire::CTRL_AUTH_LEN];
        wire::write_cookie(&mut msg, ty, id, cookie).expect("sized");
        (id, msg)
    }
    /// KEEPALIVE or LEAVE.
    pub fn simple(&mut self, ty: MsgType, s: Session) -> (u32, Vec<u8>) {
        let id = self.id();
        let mut msg = vec![0u8; wire::CTRL_AUTH_LEN];
        wire::write_auth(&mut msg, ty, id, s.ssid, s.token).expect("sized");
        (id, msg)
    }
    /// SUBSCRIBE (or UNSUBSCRIBE when `unsub`) with `sels` (at most 256).
    pub fn subscribe(&mut self, s: Session, sels: &[Selector], unsub: bool) -> (u32, Vec<u8>) {
        let id = self.id();
        let msg_type = if unsub {
            MsgType::Unsubscribe
        } else {
            MsgType::Subscribe
        };
        let mut msg = vec![0u8; wire::CTRL_AUTH_LEN + 2 + sels.len() * wire::SELECTOR_LEN];
        let len = wire::write_subscribe(&mut msg, msg_type, id, s.ssid, s.token, sels)
            .expect("at most MAX_SELECTORS selectors");
        msg.truncate(len);
        (id, msg)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seq_tracker_counts_loss_and_reordering() {
        let mut t = SeqTracker::default();
        for s in [65530u16, 65531, 65533, 65532, 65535, 0, 2, 1] {
            t.record(s);
        }
        // 65530..=2 (across the wrap) is 9 expected, 8 received
        assert_eq!(t.expected(), 9);
        assert_eq!(t.reordered, 2); // 65532 after 65533, 1 after 2
        assert_eq!(t.received, 8);
        assert_eq!(t.lost(), 1); // 65534 missing
        t.record(2);
        assert_eq!((t.duplicates, t.lost()), (1, 1));
    }

    #[test]
    fn requests_and_replies() {
        let mut r = Requests::default();
        let (id, b) = r.register();
        let c = Control::new_checked(&b).unwrap();
        assert_eq!((c.msg_type(), c.request_id()), (MsgType::Register, id));
        let s = Session { ssid: 3, token: 9 };
        let (_, b) = r.subscribe(s, &[Selector::ALL], true);
        assert_eq!(
            Control::new_checked(&b).unwrap().msg_type(),
            MsgType::Unsubscribe
        );
        let mut a = [0u8; 20];
        wire::write_auth(&mut a, MsgType::Ack, 4, 3, 9).unwrap();
        assert_eq!(parse_reply(&a), Some(Reply::Ack(4, s)));
        let cookie = [9u8; wire::COOKIE_LEN];
        wire::write_cookie(&mut a, MsgType::Challenge, 5, &cookie).unwrap();
        assert_eq!(parse_reply(&a), Some(Reply::Challenge(5, cookie)));
        let (id, b) = r.register_with(&cookie);
        let c = Control::new_checked(&b).unwrap();
        assert_eq!((c.msg_type(), c.request_id()), (MsgType::Register, id));
        assert_eq!(c.cookie(), Some(cookie));
        let (_, b) = r.join(&cookie);
        assert_eq!(Control::new_checked(&b).unwrap().msg_type(), MsgType::Join);
    }
}
