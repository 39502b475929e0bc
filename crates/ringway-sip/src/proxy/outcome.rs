//! What happened to a datagram: metrics labels, drop reasons, actions.

use crate::msg::Method;

/// Message type for metrics labels.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MsgLabel {
    /// INVITE request.
    Invite,
    /// ACK request.
    Ack,
    /// BYE request.
    Bye,
    /// CANCEL request.
    Cancel,
    /// REGISTER request.
    Register,
    /// OPTIONS request.
    Options,
    /// Any other request method.
    OtherRequest,
    /// A response with this exact code (a 200 to BYE is [`MsgLabel::ByeOk`]).
    Response(u16),
    /// The 200 to a BYE, labelled apart from the 200 to INVITE (the
    /// papers' six message types: INVITE, 180, 200, ACK, BYE, 200).
    ByeOk,
    /// Unparseable datagram.
    Malformed,
}

static CODE_TEXT: [[u8; 3]; 600] = {
    let mut t = [[0u8; 3]; 600];
    let mut i = 0;
    while i < 600 {
        let c = i + 100;
        t[i] = [
            b'0' + (c / 100) as u8,
            b'0' + ((c / 10) % 10) as u8,
            b'0' + (c % 10) as u8,
        ];
        i += 1;
    }
    t
};

/// Status codes with a label slot each: 100..=699.
const CODES: usize = 600;

impl MsgLabel {
    /// Number of [`MsgLabel::slot`]s: seven request labels and `malformed`,
    /// one per status code 100..=699, one for responses with a code
    /// outside that range, and one for the 200 to BYE.
    pub const SLOTS: usize = 8 + CODES + 2;

    /// Dense index of this label, for counter arrays.
    pub fn slot(&self) -> usize {
        match *self {
            MsgLabel::Invite => 0,
            MsgLabel::Ack => 1,
            MsgLabel::Bye => 2,
            MsgLabel::Cancel => 3,
            MsgLabel::Register => 4,
            MsgLabel::Options => 5,
            MsgLabel::OtherRequest => 6,
            MsgLabel::Malformed => 7,
            MsgLabel::Response(code) if (100..700).contains(&code) => 8 + (code - 100) as usize,
            MsgLabel::Response(_) => 8 + CODES,
            MsgLabel::ByeOk => 8 + CODES + 1,
        }
    }

    /// The label of a slot (inverse of [`MsgLabel::slot`]; the slot of
    /// out-of-range codes reads as code 0, a slot beyond the last as the last).
    pub fn from_slot(slot: usize) -> MsgLabel {
        match slot {
            0 => MsgLabel::Invite,
            1 => MsgLabel::Ack,
            2 => MsgLabel::Bye,
            3 => MsgLabel::Cancel,
            4 => MsgLabel::Register,
            5 => MsgLabel::Options,
            6 => MsgLabel::OtherRequest,
            7 => MsgLabel::Malformed,
            s if s < 8 + CODES => MsgLabel::Response((s - 8) as u16 + 100),
            s if s == 8 + CODES => MsgLabel::Response(0),
            _ => MsgLabel::ByeOk,
        }
    }

    /// The label of a request with this method.
    pub(crate) fn of_method(method: Method<'_>) -> MsgLabel {
        match method {
            Method::Invite => MsgLabel::Invite,
            Method::Ack => MsgLabel::Ack,
            Method::Bye => MsgLabel::Bye,
            Method::Cancel => MsgLabel::Cancel,
            Method::Register => MsgLabel::Register,
            Method::Options => MsgLabel::Options,
            _ => MsgLabel::OtherRequest,
        }
    }

    /// Label text: `INVITE`, `ACK`, ..., `other`, the 3-digit code for
    /// responses, `200-BYE` for the 200 to BYE, `malformed`.
    pub fn as_str(&self) -> &'static str {
        match self {
            MsgLabel::Invite => "INVITE",
            MsgLabel::Ack => "ACK",
            MsgLabel::Bye => "BYE",
            MsgLabel::Cancel => "CANCEL",
            MsgLabel::Register => "REGISTER",
            MsgLabel::Options => "OPTIONS",
            MsgLabel::OtherRequest => "other",
            MsgLabel::Response(c) if (100..700).contains(c) => {
                std::str::from_utf8(&CODE_TEXT[(*c - 100) as usize]).unwrap_or("response")
            }
            MsgLabel::Response(_) => "response",
            MsgLabel::ByeOk => "200-BYE",
            MsgLabel::Malformed => "malformed",
        }
    }
}

impl std::fmt::Display for MsgLabel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a datagram was dropped.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DropReason {
    /// A response that does not parse.
    MalformedResponse,
    /// A request that does not parse well enough to answer (or an ACK).
    MalformedRequest,
    /// Response whose top Via is not ours.
    ResponseNotOurs,
    /// Response with no usable next Via (name without `received`).
    UnroutableResponse,
    /// Destination is broadcast/multicast/unspecified/port 0.
    ForbiddenDestination,
    /// Transaction table full (non-INVITE requests).
    Overload,
    /// An ACK we could not route or that failed validation.
    AckNotRoutable,
    /// Forwarded message would exceed the datagram limit.
    TooLarge,
    /// Empty datagram / keep-alive.
    KeepAlive,
    /// Its source sent more requests than the flood limit allows.
    Flood,
    /// An ACK or CANCEL whose next hop the relay policy refused.
    NotRelayed,
    /// A request matching a transaction that came from another source than
    /// the transaction's request (not a retransmission: a copy).
    SourceMismatch,
    /// A response we generated would be more than
    /// [`AMPLIFICATION_LIMIT`](crate::proxy::AMPLIFICATION_LIMIT) times
    /// the request's size.
    ReplyTooLarge,
}

/// Every drop reason, in counter-slot order ([`DropReason::index`]).
pub const DROP_REASONS: [DropReason; 13] = [
    DropReason::MalformedResponse,
    DropReason::MalformedRequest,
    DropReason::ResponseNotOurs,
    DropReason::UnroutableResponse,
    DropReason::ForbiddenDestination,
    DropReason::Overload,
    DropReason::AckNotRoutable,
    DropReason::TooLarge,
    DropReason::KeepAlive,
    DropReason::Flood,
    DropReason::NotRelayed,
    DropReason::SourceMismatch,
    DropReason::ReplyTooLarge,
];

impl DropReason {
    /// Metrics label.
    pub fn as_str(&self) -> &'static str {
        match self {
            DropReason::MalformedResponse => "malformed_response",
            DropReason::MalformedRequest => "malformed_request",
            DropReason::ResponseNotOurs => "response_via_not_ours",
            DropReason::UnroutableResponse => "unroutable_response",
            DropReason::ForbiddenDestination => "forbidden_destination",
            DropReason::Overload => "overload",
            DropReason::AckNotRoutable => "ack_not_routable",
            DropReason::TooLarge => "too_large",
            DropReason::KeepAlive => "keepalive",
            DropReason::Flood => "flood",
            DropReason::NotRelayed => "not_relayed",
            DropReason::SourceMismatch => "source_mismatch",
            DropReason::ReplyTooLarge => "reply_too_large",
        }
    }

    /// Dense index of this reason (its position in [`DROP_REASONS`]), for
    /// counter arrays.
    pub fn index(&self) -> usize {
        match self {
            DropReason::MalformedResponse => 0,
            DropReason::MalformedRequest => 1,
            DropReason::ResponseNotOurs => 2,
            DropReason::UnroutableResponse => 3,
            DropReason::ForbiddenDestination => 4,
            DropReason::Overload => 5,
            DropReason::AckNotRoutable => 6,
            DropReason::TooLarge => 7,
            DropReason::KeepAlive => 8,
            DropReason::Flood => 9,
            DropReason::NotRelayed => 10,
            DropReason::SourceMismatch => 11,
            DropReason::ReplyTooLarge => 12,
        }
    }
}

/// What happened to a datagram.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// Sent on to the next hop (`copies` datagrams).
    Forwarded {
        /// Number of copies sent downstream/upstream.
        copies: u32,
    },
    /// We answered with this final (or 200 to CANCEL) status code.
    Responded(u16),
    /// A retransmission (or hop-by-hop message) consumed by a transaction.
    Absorbed,
    /// Dropped and counted.
    Dropped(DropReason),
    /// Waiting for the location store: handed to the driver, which
    /// resumes it ([`ProxyWorker::resume`](crate::proxy::ProxyWorker::resume)).
    Deferred,
}

/// Result of [`ProxyWorker::handle`](crate::proxy::ProxyWorker::handle).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Outcome {
    /// Message type.
    pub label: MsgLabel,
    /// What was done.
    pub action: Action,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_dense_and_invert() {
        for slot in 0..MsgLabel::SLOTS {
            if slot != MsgLabel::Response(0).slot() {
                assert_eq!(MsgLabel::from_slot(slot).slot(), slot);
            }
        }
        assert_eq!(MsgLabel::Response(99).slot(), MsgLabel::SLOTS - 2);
        assert_eq!(MsgLabel::Response(700).slot(), MsgLabel::SLOTS - 2);
        assert_eq!(MsgLabel::ByeOk.slot(), MsgLabel::SLOTS - 1);
        assert_eq!(MsgLabel::from_slot(MsgLabel::SLOTS - 1).as_str(), "200-BYE");
        assert_ne!(MsgLabel::ByeOk.slot(), MsgLabel::Response(200).slot());
        assert_eq!(
            MsgLabel::from_slot(MsgLabel::Response(487).slot()).as_str(),
            "487"
        );
        for (i, reason) in DROP_REASONS.iter().enumerate() {
            assert_eq!(reason.index(), i);
        }
    }
}
