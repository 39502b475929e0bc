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
    /// A response with this exact code.
    Response(u16),
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

impl MsgLabel {
    /// The label of a request with this method.
    pub(super) fn of_method(method: Method<'_>) -> MsgLabel {
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
    /// responses, `malformed`.
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
}

/// Every drop reason, in counter-slot order.
pub(super) const DROP_REASONS: [DropReason; 9] = [
    DropReason::MalformedResponse,
    DropReason::MalformedRequest,
    DropReason::ResponseNotOurs,
    DropReason::UnroutableResponse,
    DropReason::ForbiddenDestination,
    DropReason::Overload,
    DropReason::AckNotRoutable,
    DropReason::TooLarge,
    DropReason::KeepAlive,
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
        }
    }

    /// Counter slot of this reason.
    pub(super) fn index(&self) -> usize {
        DROP_REASONS.iter().position(|d| d == self).unwrap_or(0)
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
}

/// Result of [`ProxyWorker::handle`](crate::proxy::ProxyWorker::handle).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Outcome {
    /// Message type.
    pub label: MsgLabel,
    /// What was done.
    pub action: Action,
}
