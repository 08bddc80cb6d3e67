//! The splice: client ⇄ upstream until one side ends, then one teardown for
//! every cause.
//!
//! Guarantees:
//! - Text and binary frames are forwarded as received (the `Utf8Bytes` /
//!   `Bytes` buffers move, they are never parsed and re-serialised). The
//!   [`Tap`] sees each upstream text frame by reference before it is sent.
//! - Ping/Pong are hop-by-hop: each leg's peer is answered by tungstenite on
//!   that leg, and the frames count as activity for the idle timeout.
//! - Each direction is its own future: a peer that stops reading stalls only
//!   the direction towards it. Frames that are already readable are fed
//!   without a flush and leave together when the reading side has nothing
//!   more at once (one write per burst instead of one per frame: on loopback
//!   most of the relay's CPU is the kernel's send path); tungstenite writes
//!   its buffer out past 128 KiB and then waits for the socket, so what the
//!   gateway holds per direction stays bounded by that buffer, one message
//!   and the kernel's socket buffers, and the kernel's window pushes back on
//!   the sender.
//! - No lock or atomic per frame apart from one relaxed store of the
//!   last-activity time, read by the idle timer.
//!
//! # One end, many causes
//!
//! The splice loop only decides *why* the session ends ([`End`]); one
//! teardown then does what every end needs, in one order ([`teardown`] is
//! the pure table of close codes per cause, tested exhaustively):
//! 1. the tap learns the cause ([`Tap::ending`]), so the rows of responses
//!    cut short carry it;
//! 2. the client leg gets its error event (if the cause has one) and its
//!    close code at once, bounded by [`CLOSE_GRACE`] (a client that stopped
//!    reading cannot hold the session);
//! 3. meanwhile, when the upstream can still answer, every response in flight
//!    is cancelled by its `response_id` (out-of-band responses included, and
//!    responses that start during the cancel), the upstream is read (through
//!    the tap) until their `response.done` arrived or [`CLOSE_GRACE`] passed,
//!    and only then is the upstream closed (another [`CLOSE_GRACE`] at most).
//!    The upstream bills what it generated; its `response.done` is how the
//!    gateway learns how much. Only a vanished upstream, or no
//!    `response.done` within the grace, leaves a turn's usage unknown.
//!
//! The client's close never waits on the upstream leg; the session task
//! ends after both legs, within 2 × [`CLOSE_GRACE`].
//!
//! Close codes: a received close is forwarded with its code and reason;
//! codes that may not be sent on the wire (1005, 1006, 1015) become a bare
//! close or 1011. Oversize messages (`max_message_bytes`) get 1009 on the
//! leg that sent them; a client protocol error 1002 (1007 for invalid UTF-8).

pub mod frame;
pub mod reader;

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use futures_util::stream::{SplitSink, SplitStream};
use futures_util::{FutureExt, SinkExt, StreamExt};
use tokio::time::Instant;
use tokio_tungstenite::tungstenite::error::{CapacityError, ProtocolError};
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::{CloseFrame, WebSocketConfig};
use tokio_tungstenite::tungstenite::{Error as WsError, Message};
use tokio_tungstenite::WebSocketStream;

/// How long a leg is given to answer our close before the socket is dropped;
/// also the bound on waiting for cancelled responses' `response.done`.
pub const CLOSE_GRACE: Duration = Duration::from_secs(2);
/// Read buffer per WebSocket (both legs), which is also the most tungstenite
/// reads at once. tungstenite's default (128 KiB) costs ~300 KB of memory
/// per idle session, 16 KiB ~88 KB, 4 KiB ~65 KB. 4 KiB holds every control
/// frame and small delta in one read and a 22 KB audio delta takes a few
/// reads, yet measured in one interleaved run against 16 KiB it used ~3 %
/// *less* CPU: tungstenite zero-fills the buffer's free space up to this
/// size before every read, so a smaller buffer zero-fills less
/// (`benchmarks/README.md`, read-buffer A/B).
pub const READ_BUFFER_BYTES: usize = 4 * 1024;

/// Close codes the teardown sends.
pub mod code {
    pub const NORMAL: u16 = 1000;
    pub const GOING_AWAY: u16 = 1001;
    pub const PROTOCOL_ERROR: u16 = 1002;
    pub const INVALID_PAYLOAD: u16 = 1007;
    pub const TOO_BIG: u16 = 1009;
    pub const INTERNAL: u16 = 1011;
}

/// The WebSocket settings of both legs.
pub fn ws_config(max_message_bytes: usize) -> WebSocketConfig {
    WebSocketConfig::default()
        .read_buffer_size(READ_BUFFER_BYTES)
        .max_message_size(Some(max_message_bytes))
        .max_frame_size(Some(max_message_bytes))
}

/// Sees upstream text frames on their way to the client, and the end.
pub trait Tap {
    fn on_upstream_text(&mut self, _text: &str) {}
    /// Responses the upstream has started and not yet finished, by
    /// `response_id` (`None` when the upstream named none). The teardown
    /// cancels each and waits (bounded) for its `response.done`, which
    /// reports its usage.
    fn responses_in_flight(&self) -> Vec<Option<String>> {
        Vec::new()
    }
    /// Called once, when the session starts ending and before anything is
    /// cancelled: the `response.done` events that follow answer the
    /// teardown's cancels.
    fn ending(&mut self, _end: &End) {}
}

impl Tap for () {}

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
            End::MaxDuration => "max_duration",
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

#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub idle_timeout: Duration,
    /// Deadline of the whole session (from its start, not the splice's).
    pub deadline: Instant,
}

/// Frames the client sent before the upstream was ready, forwarded first.
pub type Pending = Vec<Message>;

/// How one leg is closed.
#[derive(Debug, Clone, PartialEq)]
pub enum LegClose {
    /// The peer closed first and tungstenite queued the reply: flush it and
    /// read to the end.
    Reply,
    /// Send this close (`None`: a close without a code) and read until the
    /// peer's reply.
    Send(Option<CloseFrame>),
    /// The connection is gone: nothing can be sent.
    Gone,
}

impl LegClose {
    fn code(&self, received: Option<u16>) -> Option<u16> {
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

pub async fn splice<C, U, T, K>(
    client: WebSocketStream<C>,
    upstream: WebSocketStream<U>,
    pending: Pending,
    limits: Limits,
    tap: &mut T,
    kill: K,
) -> Spliced
where
    C: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
    U: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
    T: Tap,
    K: std::future::Future<Output = Kill>,
{
    let (mut c_tx, mut c_rx) = client.split();
    let (mut u_tx, mut u_rx) = upstream.split();
    let started = Instant::now();
    let last_activity_ms = AtomicU64::new(0);
    let mut client_close: Option<CloseFrame> = None;
    let mut upstream_close: Option<CloseFrame> = None;

    let end = {
        let touch = || {
            let ms = started.elapsed().as_millis() as u64;
            last_activity_ms.store(ms, Ordering::Relaxed);
        };
        let client_to_upstream = async {
            for msg in pending {
                if u_tx.send(msg).await.is_err() {
                    return End::UpstreamGone;
                }
            }
            loop {
                let next = match next_or_flush(&mut c_rx, &mut u_tx).await {
                    Some(next) => next,
                    None => return End::UpstreamGone,
                };
                match next {
                    Some(Ok(msg @ (Message::Text(_) | Message::Binary(_)))) => {
                        touch();
                        if u_tx.feed(msg).await.is_err() {
                            return End::UpstreamGone;
                        }
                    }
                    Some(Ok(Message::Ping(_) | Message::Pong(_))) => touch(),
                    Some(Ok(Message::Close(frame))) => {
                        let code = frame.as_ref().map(|f| u16::from(f.code));
                        client_close = sendable(frame);
                        return End::ClientClosed(code);
                    }
                    Some(Ok(Message::Frame(_))) => {}
                    Some(Err(e)) => return client_error(&e),
                    None => return End::ClientGone,
                }
            }
        };
        let upstream_to_client = async {
            loop {
                let next = match next_or_flush(&mut u_rx, &mut c_tx).await {
                    Some(next) => next,
                    None => return End::ClientGone,
                };
                match next {
                    Some(Ok(msg @ (Message::Text(_) | Message::Binary(_)))) => {
                        touch();
                        if let Message::Text(t) = &msg {
                            tap.on_upstream_text(t);
                        }
                        if c_tx.feed(msg).await.is_err() {
                            return End::ClientGone;
                        }
                    }
                    Some(Ok(Message::Ping(_) | Message::Pong(_))) => touch(),
                    Some(Ok(Message::Close(frame))) => {
                        let code = frame.as_ref().map(|f| u16::from(f.code));
                        upstream_close = sendable(frame);
                        return End::UpstreamClosed(code);
                    }
                    Some(Ok(Message::Frame(_))) => {}
                    Some(Err(e)) if too_big(&e) => return End::UpstreamTooBig,
                    Some(Err(_)) | None => return End::UpstreamGone,
                }
            }
        };
        let idle = async {
            loop {
                let last = Duration::from_millis(last_activity_ms.load(Ordering::Relaxed));
                let due = started + last + limits.idle_timeout;
                if Instant::now() >= due {
                    return End::IdleTimeout;
                }
                tokio::time::sleep_until(due).await;
            }
        };
        tokio::select! {
            e = client_to_upstream => e,
            e = upstream_to_client => e,
            e = idle => e,
            _ = tokio::time::sleep_until(limits.deadline) => End::MaxDuration,
            k = kill => End::Killed(k),
        }
    };

    let plan = teardown(&end, client_close, upstream_close);
    let received = match &end {
        End::ClientClosed(c) | End::UpstreamClosed(c) => *c,
        _ => None,
    };
    let client_code = plan.client.code(received);
    let upstream_code = plan.upstream.code(received);
    tap.ending(&end);
    let Teardown {
        client_event,
        client,
        upstream,
        upstream_answers,
    } = plan;
    let client_leg = close_leg(&mut c_tx, &mut c_rx, client_event, client, |_| {});
    let upstream_leg = async {
        if upstream_answers {
            cancel_in_flight(&mut u_tx, &mut u_rx, tap).await;
        }
        close_leg(&mut u_tx, &mut u_rx, None, upstream, |t| {
            tap.on_upstream_text(t)
        })
        .await;
    };
    tokio::join!(client_leg, upstream_leg);
    Spliced {
        end,
        client_code,
        upstream_code,
    }
}

/// The next frame from `rx`. When none is ready at once, `tx` is flushed
/// first: frames that arrive in a burst are fed to `tx` and leave in one
/// write, and nothing waits in the buffer while `rx` is idle. `None` when
/// the flush failed (the peer of `tx` is gone).
async fn next_or_flush<R, W>(
    rx: &mut SplitStream<WebSocketStream<R>>,
    tx: &mut SplitSink<WebSocketStream<W>, Message>,
) -> Option<Option<Result<Message, WsError>>>
where
    R: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
    W: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    if let Some(next) = rx.next().now_or_never() {
        return Some(next);
    }
    tx.flush().await.ok()?;
    Some(rx.next().await)
}

pub fn close(code: u16, reason: &str) -> CloseFrame {
    CloseFrame {
        code: CloseCode::from(code),
        reason: reason.to_string().into(),
    }
}

/// A received close frame made fit to send on: 1005/1006/1015 may not
/// appear on the wire.
fn sendable(frame: Option<CloseFrame>) -> Option<CloseFrame> {
    match frame {
        Some(f) => match u16::from(f.code) {
            1005 => None,
            1006 | 1015 => Some(close(code::INTERNAL, "upstream connection lost")),
            _ => Some(f),
        },
        None => None,
    }
}

fn too_big(e: &WsError) -> bool {
    matches!(e, WsError::Capacity(CapacityError::MessageTooLong { .. }))
}

/// What a read error on the client leg means: an oversize frame or message,
/// a protocol violation (the client can still be told), or a connection
/// that is gone.
fn client_error(e: &WsError) -> End {
    match e {
        e if too_big(e) => End::ClientTooBig,
        WsError::Utf8(_) => End::ClientProtocolError(code::INVALID_PAYLOAD),
        // A peer that vanished mid-handshake is gone, not misbehaving.
        WsError::Protocol(ProtocolError::ResetWithoutClosingHandshake) => End::ClientGone,
        WsError::Protocol(_) | WsError::Capacity(_) => {
            End::ClientProtocolError(code::PROTOCOL_ERROR)
        }
        _ => End::ClientGone,
    }
}

/// `response.cancel` for one response (`None`: the one in progress).
pub fn cancel_event(response_id: Option<&str>) -> String {
    match response_id {
        // `type` first, as OpenAI writes events; the id JSON-escaped.
        Some(id) => format!(
            r#"{{"type":"response.cancel","response_id":{}}}"#,
            serde_json::Value::from(id)
        ),
        None => r#"{"type":"response.cancel"}"#.to_string(),
    }
}

/// Cancels every response in flight (and any that starts meanwhile) and
/// reads the upstream, through the tap, until none is in flight, at most
/// [`CLOSE_GRACE`]. Without the `response.done` that answers a cancel, the
/// turn would be logged with unknown usage, and a client could end its
/// session just before every `response.done` to spend without being charged.
pub async fn cancel_in_flight<U, T>(
    tx: &mut SplitSink<WebSocketStream<U>, Message>,
    rx: &mut SplitStream<WebSocketStream<U>>,
    tap: &mut T,
) where
    U: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
    T: Tap,
{
    let mut cancelled: Vec<Option<String>> = Vec::new();
    let _ = tokio::time::timeout(CLOSE_GRACE, async {
        loop {
            let in_flight = tap.responses_in_flight();
            if in_flight.is_empty() {
                return;
            }
            let mut sent = false;
            for id in in_flight {
                if !cancelled.contains(&id) {
                    if tx
                        .feed(Message::text(cancel_event(id.as_deref())))
                        .await
                        .is_err()
                    {
                        return;
                    }
                    cancelled.push(id);
                    sent = true;
                }
            }
            if sent && tx.flush().await.is_err() {
                return;
            }
            match rx.next().await {
                Some(Ok(Message::Text(t))) => tap.on_upstream_text(&t),
                Some(Ok(Message::Close(_))) | Some(Err(_)) | None => return,
                Some(Ok(_)) => {}
            }
        }
    })
    .await;
}

/// Closes one leg within [`CLOSE_GRACE`]: sends `event` (if any) and the
/// close, flushes, then reads until the peer's close reply or EOF, passing
/// text frames to `on_text`. Reading the reply matters: closing a socket
/// with unread data makes the kernel send a reset, which can destroy the
/// close frame before the peer reads it. The bound matters as much: a peer
/// that stopped reading would otherwise block the first write forever.
async fn close_leg<S>(
    tx: &mut SplitSink<WebSocketStream<S>, Message>,
    rx: &mut SplitStream<WebSocketStream<S>>,
    event: Option<String>,
    how: LegClose,
    mut on_text: impl FnMut(&str),
) where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    if how == LegClose::Gone {
        return;
    }
    let _ = tokio::time::timeout(CLOSE_GRACE, async {
        if let Some(event) = event {
            let _ = tx.feed(Message::text(event)).await;
        }
        match how {
            LegClose::Send(frame) => {
                let _ = tx.send(Message::Close(frame)).await;
            }
            LegClose::Reply | LegClose::Gone => {
                let _ = tx.flush().await;
            }
        }
        while let Some(Ok(msg)) = rx.next().await {
            if let Message::Text(t) = &msg {
                on_text(t);
            }
        }
    })
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kill(code: u16, outcome: &'static str, event: Option<&str>) -> Kill {
        Kill {
            code,
            reason: "why".into(),
            error_event: event.map(str::to_string),
            outcome,
        }
    }

    fn sent(code: u16) -> LegClose {
        LegClose::Send(Some(CloseFrame {
            code: CloseCode::from(code),
            reason: String::new().into(),
        }))
    }

    /// Client code, upstream code, how each leg closes, upstream asked to
    /// cancel.
    type Shape = (Option<u16>, Option<u16>, LegCase, LegCase, bool);

    /// The close codes only (reasons are free text).
    fn codes(t: &Teardown) -> Shape {
        let case = |l: &LegClose| match l {
            LegClose::Reply => LegCase::Reply,
            LegClose::Send(_) => LegCase::Send,
            LegClose::Gone => LegCase::Gone,
        };
        (
            t.client.code(Some(4000)),
            t.upstream.code(Some(4000)),
            case(&t.client),
            case(&t.upstream),
            t.upstream_answers,
        )
    }

    #[derive(Debug, PartialEq)]
    enum LegCase {
        Reply,
        Send,
        Gone,
    }
    use LegCase::*;

    #[test]
    fn every_cause_has_its_close_codes_and_only_a_broken_upstream_is_not_asked_to_cancel() {
        let from_client = Some(close(4000, "bye"));
        let from_upstream = Some(close(4000, "bye"));
        let cases: Vec<(End, Shape)> = vec![
            // The client's own close is answered; the upstream gets it as it came.
            (
                End::ClientClosed(Some(4000)),
                (Some(4000), Some(4000), Reply, Send, true),
            ),
            (End::ClientGone, (None, Some(1001), Gone, Send, true)),
            (
                End::ClientTooBig,
                (Some(1009), Some(1001), Send, Send, true),
            ),
            (
                End::ClientProtocolError(1007),
                (Some(1007), Some(1001), Send, Send, true),
            ),
            (
                End::ClientProtocolError(1002),
                (Some(1002), Some(1001), Send, Send, true),
            ),
            (End::IdleTimeout, (Some(1001), Some(1001), Send, Send, true)),
            (End::MaxDuration, (Some(1001), Some(1000), Send, Send, true)),
            (
                End::Killed(kill(1008, "budget_exhausted", Some("{}"))),
                (Some(1008), Some(1000), Send, Send, true),
            ),
            (
                End::Killed(kill(1008, "key_revoked", Some("{}"))),
                (Some(1008), Some(1000), Send, Send, true),
            ),
            (
                End::Killed(kill(1001, "shutdown", None)),
                (Some(1001), Some(1001), Send, Send, true),
            ),
            // The upstream closed, vanished or broke: nothing to cancel.
            (
                End::UpstreamClosed(Some(4000)),
                (Some(4000), Some(4000), Send, Reply, false),
            ),
            (End::UpstreamGone, (Some(1011), None, Send, Gone, false)),
            (
                End::UpstreamTooBig,
                (Some(1011), Some(1009), Send, Send, false),
            ),
        ];
        for (end, expected) in cases {
            let t = teardown(&end, from_client.clone(), from_upstream.clone());
            assert_eq!(codes(&t), expected, "{end:?}");
        }
        assert_eq!(
            teardown(&End::ClientClosed(None), None, None).upstream,
            LegClose::Send(None),
            "a close without a code goes upstream without one"
        );
        assert_eq!(sent(1000), LegClose::Send(Some(close(1000, ""))));
    }

    #[test]
    fn only_max_duration_and_kills_send_the_client_an_error_event_first() {
        let expired = teardown(&End::MaxDuration, None, None)
            .client_event
            .unwrap();
        assert!(expired.contains("session_expired"), "{expired}");
        let k = kill(1008, "budget_exhausted", Some(r#"{"type":"error"}"#));
        assert_eq!(
            teardown(&End::Killed(k), None, None)
                .client_event
                .as_deref(),
            Some(r#"{"type":"error"}"#)
        );
        for end in [
            End::ClientClosed(None),
            End::ClientGone,
            End::ClientTooBig,
            End::ClientProtocolError(1002),
            End::UpstreamClosed(None),
            End::UpstreamGone,
            End::UpstreamTooBig,
            End::IdleTimeout,
        ] {
            assert_eq!(teardown(&end, None, None).client_event, None, "{end:?}");
        }
    }

    #[test]
    fn a_cancel_names_its_response() {
        assert_eq!(
            cancel_event(Some("resp_1")),
            r#"{"type":"response.cancel","response_id":"resp_1"}"#
        );
        assert_eq!(cancel_event(None), r#"{"type":"response.cancel"}"#);
        let odd = cancel_event(Some("a\"b"));
        let v: serde_json::Value = serde_json::from_str(&odd).unwrap();
        assert_eq!(v["response_id"], "a\"b");
    }

    #[test]
    fn client_read_errors_map_to_their_cause() {
        use tokio_tungstenite::tungstenite::error::CapacityError;
        let big = WsError::Capacity(CapacityError::MessageTooLong {
            size: 9,
            max_size: 1,
        });
        assert_eq!(client_error(&big), End::ClientTooBig);
        let masked = WsError::Protocol(ProtocolError::UnmaskedFrameFromClient);
        assert_eq!(client_error(&masked), End::ClientProtocolError(1002));
        let reset = WsError::Protocol(ProtocolError::ResetWithoutClosingHandshake);
        assert_eq!(client_error(&reset), End::ClientGone);
        assert_eq!(client_error(&WsError::ConnectionClosed), End::ClientGone);
        let io = WsError::Io(std::io::Error::from(std::io::ErrorKind::BrokenPipe));
        assert_eq!(client_error(&io), End::ClientGone);
    }
}
