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
    /// A response with this code. Its metrics slot and label text are the
    /// code's own for the codes in [`EXACT_CODES`], else its class
    /// (`1xx`…`6xx`): a peer choosing codes cannot make the metrics grow
    /// (review finding S2).
    Response(u16),
    /// Responses of class `1`…`6` whose code has no slot of its own (what
    /// [`MsgLabel::from_slot`] gives for a class slot).
    ResponseClass(u8),
    /// The 200 to a BYE, labelled apart from the 200 to INVITE (the
    /// papers' six message types: INVITE, 180, 200, ACK, BYE, 200).
    ByeOk,
    /// Unparseable datagram.
    Malformed,
}

/// Status codes with a metrics slot of their own: the responses of the
/// papers' call flow (100, 180, 200; the 200 to BYE is [`MsgLabel::ByeOk`])
/// and the ones an operator tells apart (early media, challenges, timeouts,
/// CANCEL, overload). Every other code counts under its class.
pub const EXACT_CODES: [u16; 11] = [100, 180, 183, 200, 401, 407, 408, 481, 486, 487, 503];

const EXACT_TEXT: [&str; EXACT_CODES.len()] = [
    "100", "180", "183", "200", "401", "407", "408", "481", "486", "487", "503",
];

const CLASS_TEXT: [&str; 6] = ["1xx", "2xx", "3xx", "4xx", "5xx", "6xx"];

/// First response slot: after the seven request labels and `malformed`.
const RESPONSE_BASE: usize = 8;
/// First class slot.
const CLASS_BASE: usize = RESPONSE_BASE + EXACT_CODES.len();
/// The slot of responses with a code outside 100..=699.
const OUT_OF_RANGE: usize = CLASS_BASE + CLASS_TEXT.len();

impl MsgLabel {
    /// Number of [`MsgLabel::slot`]s: seven request labels and `malformed`,
    /// one per code of [`EXACT_CODES`], one per response class 1xx…6xx,
    /// one for responses with a code outside 100..=699, and one for the
    /// 200 to BYE. A fixed number whatever the traffic.
    pub const SLOTS: usize = OUT_OF_RANGE + 2;

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
            MsgLabel::Response(code) => match EXACT_CODES.iter().position(|&c| c == code) {
                Some(i) => RESPONSE_BASE + i,
                None if (100..700).contains(&code) => CLASS_BASE + (code / 100 - 1) as usize,
                None => OUT_OF_RANGE,
            },
            MsgLabel::ResponseClass(class @ 1..=6) => CLASS_BASE + class as usize - 1,
            MsgLabel::ResponseClass(_) => OUT_OF_RANGE,
            MsgLabel::ByeOk => OUT_OF_RANGE + 1,
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
            s if s < CLASS_BASE => MsgLabel::Response(EXACT_CODES[s - RESPONSE_BASE]),
            s if s < OUT_OF_RANGE => MsgLabel::ResponseClass((s - CLASS_BASE + 1) as u8),
            OUT_OF_RANGE => MsgLabel::Response(0),
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
    /// the responses of [`EXACT_CODES`], the class (`4xx`) for other
    /// responses, `response` for a code outside 100..=699, `200-BYE` for
    /// the 200 to BYE, `malformed`. The text of a label is the text of its
    /// slot.
    pub fn as_str(&self) -> &'static str {
        let slot = self.slot();
        match self {
            MsgLabel::Invite => "INVITE",
            MsgLabel::Ack => "ACK",
            MsgLabel::Bye => "BYE",
            MsgLabel::Cancel => "CANCEL",
            MsgLabel::Register => "REGISTER",
            MsgLabel::Options => "OPTIONS",
            MsgLabel::OtherRequest => "other",
            MsgLabel::Response(_) | MsgLabel::ResponseClass(_) => match slot {
                s if s < CLASS_BASE => EXACT_TEXT[s - RESPONSE_BASE],
                s if s < OUT_OF_RANGE => CLASS_TEXT[s - CLASS_BASE],
                _ => "response",
            },
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
    /// An ACK or CANCEL whose next hop's name could not be resolved.
    NameNotResolved,
}

/// Every drop reason, in counter-slot order ([`DropReason::index`]).
pub const DROP_REASONS: [DropReason; 14] = [
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
    DropReason::NameNotResolved,
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
            DropReason::NameNotResolved => "name_not_resolved",
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
            DropReason::NameNotResolved => 13,
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
            assert_eq!(MsgLabel::from_slot(slot).slot(), slot);
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
    }

    #[test]
    fn every_status_code_maps_to_a_fixed_slot() {
        let mut texts = std::collections::BTreeSet::new();
        for code in 0..=u16::MAX {
            let label = MsgLabel::Response(code);
            assert!(label.slot() < MsgLabel::SLOTS);
            assert_eq!(label.as_str(), MsgLabel::from_slot(label.slot()).as_str());
            texts.insert(label.as_str());
        }
        // The exact codes, six classes, one out-of-range label.
        assert_eq!(texts.len(), EXACT_CODES.len() + 6 + 1, "{texts:?}");
        assert_eq!(MsgLabel::Response(180).as_str(), "180");
        assert_eq!(MsgLabel::Response(182).as_str(), "1xx");
        assert_eq!(MsgLabel::Response(699).as_str(), "6xx");
        assert_eq!(
            MsgLabel::Response(302).slot(),
            MsgLabel::ResponseClass(3).slot()
        );
        assert_eq!(MsgLabel::ResponseClass(9).as_str(), "response");
    }

    #[test]
    fn drop_reasons_are_dense() {
        for (i, reason) in DROP_REASONS.iter().enumerate() {
            assert_eq!(reason.index(), i);
        }
    }
}
