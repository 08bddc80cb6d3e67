//! How a splice ends: the causes ([`End`], a [`Kill`] from outside), what
//! each leg saw ([`Spliced`]), and the pure table of what ending does to
//! each leg ([`teardown`]), tested exhaustively in the relay's tests.
//!
//! Kept apart from the splice loop so that the table can be read on its
//! own; it knows nothing of sockets.

use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;

use super::code;

/// A request, from outside the relay, to end the session now.
#[derive(Debug, Clone, PartialEq)]
pub struct Kill {
    /// Close code for the client (1001 shutdown, 1008 policy).
    pub code: u16,
    pub reason: String,
    /// An `error` event sent to the client before the close.
    pub error_event: Option<String>,
    /// Label for `realtime_sessions_total{outcome}`.
    pub outcome: &'static str,
}

/// Why a session ended.
#[derive(Debug, Clone, PartialEq)]
pub enum End {
    /// The client sent a close (its code); it goes upstream after the
    /// cancel.
    ClientClosed(Option<u16>),
    /// The upstream sent a close (its code); it is forwarded to the client.
    UpstreamClosed(Option<u16>),
    /// The client's connection ended without a close handshake.
    ClientGone,
    /// The upstream's connection ended without a close handshake.
    UpstreamGone,
    /// The client sent a frame or message over `max_message_bytes` (found
    /// from its header, before its payload is read).
    ClientTooBig,
    /// The client broke the WebSocket protocol; the close code it gets
    /// (1002, or 1007 for invalid UTF-8 in a text message).
    ClientProtocolError(u16),
    UpstreamTooBig,
    IdleTimeout,
    MaxDuration,
    Killed(Kill),
}

impl End {
    pub fn outcome(&self) -> &'static str {
        match self {
            End::ClientClosed(_) => "client_closed",
            End::UpstreamClosed(_) => "upstream_closed",
            End::ClientGone => "client_gone",
            End::UpstreamGone => "upstream_gone",
            End::ClientTooBig => "client_message_too_big",
            End::ClientProtocolError(_) => "client_protocol_error",
            End::UpstreamTooBig => "upstream_message_too_big",
            End::IdleTimeout => "idle_timeout",
            End::MaxDuration => "max_session_duration",
            End::Killed(k) => k.outcome,
        }
    }
}

/// How the session ended and the close code each leg saw (sent or received).
#[derive(Debug, Clone, PartialEq)]
pub struct Spliced {
    pub end: End,
    pub client_code: Option<u16>,
    pub upstream_code: Option<u16>,
}

/// How one leg is closed.
#[derive(Debug, Clone, PartialEq)]
pub enum LegClose {
    /// The peer closed first and the leg queued the reply: flush it and
    /// read to the end.
    Reply,
    /// Send this close (`None`: a close without a code) and read until the
    /// peer's reply.
    Send(Option<CloseFrame>),
    /// The connection is gone: nothing can be sent.
    Gone,
}

impl LegClose {
    pub(crate) fn code(&self, received: Option<u16>) -> Option<u16> {
        match self {
            LegClose::Reply => received,
            LegClose::Send(f) => f.as_ref().map(|f| u16::from(f.code)),
            LegClose::Gone => None,
        }
    }
}

/// What ending a session does to each leg.
#[derive(Debug, Clone, PartialEq)]
pub struct Teardown {
    /// An `error` event the client gets before its close.
    pub client_event: Option<String>,
    pub client: LegClose,
    pub upstream: LegClose,
    /// The upstream can still be asked to cancel and can still answer: it
    /// neither closed, nor vanished, nor broke the protocol.
    pub upstream_answers: bool,
}

/// The teardown of each cause. `client_close` and `upstream_close` are the
/// close frames received from that side (made sendable), when it closed.
pub fn teardown(
    end: &End,
    client_close: Option<CloseFrame>,
    upstream_close: Option<CloseFrame>,
) -> Teardown {
    use code::*;
    let both = |client: CloseFrame, upstream: CloseFrame| Teardown {
        client_event: None,
        client: LegClose::Send(Some(client)),
        upstream: LegClose::Send(Some(upstream)),
        upstream_answers: true,
    };
    match end {
        End::ClientClosed(_) => Teardown {
            client_event: None,
            client: LegClose::Reply,
            upstream: LegClose::Send(client_close),
            upstream_answers: true,
        },
        End::ClientGone => Teardown {
            client_event: None,
            client: LegClose::Gone,
            upstream: LegClose::Send(Some(close(GOING_AWAY, "client disconnected"))),
            upstream_answers: true,
        },
        End::ClientTooBig => both(
            close(TOO_BIG, "message too big"),
            close(GOING_AWAY, "client closed"),
        ),
        End::ClientProtocolError(c) => both(
            close(*c, "protocol error"),
            close(GOING_AWAY, "client closed"),
        ),
        End::UpstreamClosed(_) => Teardown {
            client_event: None,
            client: LegClose::Send(upstream_close),
            upstream: LegClose::Reply,
            upstream_answers: false,
        },
        End::UpstreamGone => Teardown {
            client_event: None,
            client: LegClose::Send(Some(close(INTERNAL, "upstream connection lost"))),
            upstream: LegClose::Gone,
            upstream_answers: false,
        },
        End::UpstreamTooBig => Teardown {
            client_event: None,
            client: LegClose::Send(Some(close(INTERNAL, "upstream message too big"))),
            upstream: LegClose::Send(Some(close(TOO_BIG, "message too big"))),
            // The rest of the oversize message is still on the wire: nothing
            // after it can be read as frames.
            upstream_answers: false,
        },
        End::IdleTimeout => both(
            close(GOING_AWAY, "idle timeout"),
            close(GOING_AWAY, "idle timeout"),
        ),
        End::MaxDuration => {
            let reason = "maximum session duration";
            Teardown {
                client_event: Some(crate::event::error_event(
                    "invalid_request_error",
                    "session_expired",
                    "the session reached this gateway's maximum duration",
                )),
                ..both(close(GOING_AWAY, reason), close(NORMAL, reason))
            }
        }
        End::Killed(kill) => {
            let upstream = if kill.code == GOING_AWAY {
                GOING_AWAY
            } else {
                NORMAL
            };
            Teardown {
                client_event: kill.error_event.clone(),
                ..both(
                    close(kill.code, &kill.reason),
                    close(upstream, &kill.reason),
                )
            }
        }
    }
}

pub fn close(code: u16, reason: &str) -> CloseFrame {
    CloseFrame {
        code: CloseCode::from(code),
        reason: reason.to_string().into(),
    }
}

/// A received close frame made fit to send on: 1005/1006/1015 may not
/// appear on the wire.
pub(crate) fn sendable(frame: Option<CloseFrame>) -> Option<CloseFrame> {
    match frame {
        Some(f) => match u16::from(f.code) {
            1005 => None,
            1006 | 1015 => Some(close(code::INTERNAL, "upstream connection lost")),
            _ => Some(f),
        },
        None => None,
    }
}
