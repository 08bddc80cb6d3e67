//! The splice: client ⇄ upstream until one side ends, then a clean close of
//! both legs with the right codes.
//!
//! Guarantees:
//! - Text and binary frames are forwarded as received (the `Utf8Bytes` /
//!   `Bytes` buffers move, they are never parsed and re-serialised). The
//!   [`Tap`] sees each upstream text frame by reference before it is sent.
//! - Ping/Pong are hop-by-hop: each leg's peer is answered by tungstenite on
//!   that leg, and the frames count as activity for the idle timeout.
//! - A Close is forwarded with its code and reason; codes that may not be
//!   sent on the wire (1005, 1006, 1015) become a bare close or 1011.
//! - Each direction is its own future: a peer that stops reading stalls only
//!   the direction towards it. Frames that are already readable are fed
//!   without a flush and leave together when the reading side has nothing
//!   more at once (one write per burst instead of one per frame: on loopback
//!   most of the relay's CPU is the kernel's send path); tungstenite writes
//!   its buffer out past 128 KiB and then waits for the socket, so what the
//!   gateway holds per direction stays bounded by that buffer, one message
//!   and the kernel's socket buffers, and the kernel's window pushes back on
//!   the sender.
//! - Oversize messages (`max_message_bytes`) end the session: the sender gets
//!   1009, the other side 1011 (upstream too big) or 1001 (client too big).
//! - No lock or atomic per frame apart from one relaxed store of the
//!   last-activity time, read by the idle timer.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use futures_util::stream::{SplitSink, SplitStream};
use futures_util::{FutureExt, SinkExt, StreamExt};
use tokio::time::Instant;
use tokio_tungstenite::tungstenite::error::CapacityError;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::{CloseFrame, WebSocketConfig};
use tokio_tungstenite::tungstenite::{Error as WsError, Message};
use tokio_tungstenite::WebSocketStream;

/// How long a leg is given to answer our close before the socket is dropped.
pub const CLOSE_GRACE: Duration = Duration::from_secs(2);
/// Read buffer per WebSocket (both legs). tungstenite's default (128 KiB)
/// costs ~300 KB of memory per idle session; 16 KiB holds every control
/// frame and small delta in one read, and a larger audio delta simply takes
/// a few reads.
pub const READ_BUFFER_BYTES: usize = 16 * 1024;

/// The WebSocket settings of both legs.
pub fn ws_config(max_message_bytes: usize) -> WebSocketConfig {
    WebSocketConfig::default()
        .read_buffer_size(READ_BUFFER_BYTES)
        .max_message_size(Some(max_message_bytes))
        .max_frame_size(Some(max_message_bytes))
}

/// Sees upstream text frames on their way to the client.
pub trait Tap {
    fn on_upstream_text(&mut self, _text: &str) {}
    /// Responses the upstream has started and not yet finished: when the
    /// client leaves with one in flight, the relay cancels it and waits
    /// (bounded) for its `response.done`, which reports its usage.
    fn responses_in_flight(&self) -> usize {
        0
    }
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

#[derive(Debug, Clone, PartialEq)]
pub enum End {
    /// The client sent a close; it was forwarded upstream (after cancelling
    /// a response in flight).
    ClientClosed(Option<u16>),
    /// The upstream sent a close; it was forwarded to the client.
    UpstreamClosed(Option<u16>),
    /// The client's connection ended without a close handshake.
    ClientGone,
    /// The upstream's connection ended without a close handshake.
    UpstreamGone,
    ClientTooBig,
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
                        // Forwarded at the end, once a response in flight
                        // has been cancelled.
                        let code = frame.as_ref().map(|f| u16::from(f.code));
                        client_close = sendable(frame);
                        return End::ClientClosed(code);
                    }
                    Some(Ok(Message::Frame(_))) => {}
                    Some(Err(e)) if too_big(&e) => return End::ClientTooBig,
                    Some(Err(_)) | None => return End::ClientGone,
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
                        let _ = c_tx.send(Message::Close(sendable(frame))).await;
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

    // Each leg's end is bounded by CLOSE_GRACE, error event included: a
    // client that stopped reading must not hold the session open. When the
    // client leaves with a response in flight, the upstream leg first spends
    // up to another CLOSE_GRACE on the cancel (2 × CLOSE_GRACE in all).
    // Upstream text that arrives while its leg closes still reaches the tap,
    // so a `response.done` already on its way is metered.
    let mut upstream_text = |t: &str| tap.on_upstream_text(t);
    let (client_code, upstream_code) = match &end {
        End::ClientClosed(code) => {
            // Tungstenite queued the close reply to the client: flush it.
            // Upstream, a response in flight is cancelled first, then the
            // client's close goes on as it came.
            let upstream = async {
                cancel_in_flight(&mut u_tx, &mut u_rx, tap).await;
                let _ = tokio::time::timeout(
                    CLOSE_GRACE,
                    u_tx.feed(Message::Close(client_close.take())),
                )
                .await;
                finish(&mut u_tx, &mut u_rx, None, None, |t| {
                    tap.on_upstream_text(t)
                })
                .await;
            };
            let upstream = async {
                // Over the bound, the leg is dropped as it is.
                let _ = tokio::time::timeout(2 * CLOSE_GRACE, upstream).await;
            };
            tokio::join!(finish(&mut c_tx, &mut c_rx, None, None, |_| {}), upstream);
            (*code, *code)
        }
        End::UpstreamClosed(code) => {
            // The close went to the client already; tungstenite queued the
            // reply to the upstream. Flush it and let the client answer.
            tokio::join!(
                finish(&mut c_tx, &mut c_rx, None, None, |_| {}),
                finish(&mut u_tx, &mut u_rx, None, None, &mut upstream_text)
            );
            (*code, *code)
        }
        End::ClientGone => {
            cancel_in_flight(&mut u_tx, &mut u_rx, tap).await;
            let frame = close(1001, "client disconnected");
            finish(&mut u_tx, &mut u_rx, None, Some(frame), |t| {
                tap.on_upstream_text(t)
            })
            .await;
            (None, Some(1001))
        }
        End::UpstreamGone => {
            let frame = close(1011, "upstream connection lost");
            finish(&mut c_tx, &mut c_rx, None, Some(frame), |_| {}).await;
            (Some(1011), None)
        }
        End::ClientTooBig => {
            tokio::join!(
                finish(
                    &mut c_tx,
                    &mut c_rx,
                    None,
                    Some(close(1009, "message too big")),
                    |_| {}
                ),
                finish(
                    &mut u_tx,
                    &mut u_rx,
                    None,
                    Some(close(1001, "client closed")),
                    &mut upstream_text
                )
            );
            (Some(1009), Some(1001))
        }
        End::UpstreamTooBig => {
            tokio::join!(
                finish(
                    &mut c_tx,
                    &mut c_rx,
                    None,
                    Some(close(1011, "upstream message too big")),
                    |_| {}
                ),
                finish(
                    &mut u_tx,
                    &mut u_rx,
                    None,
                    Some(close(1009, "message too big")),
                    &mut upstream_text
                )
            );
            (Some(1011), Some(1009))
        }
        End::IdleTimeout => {
            tokio::join!(
                finish(
                    &mut c_tx,
                    &mut c_rx,
                    None,
                    Some(close(1001, "idle timeout")),
                    |_| {}
                ),
                finish(
                    &mut u_tx,
                    &mut u_rx,
                    None,
                    Some(close(1001, "idle timeout")),
                    &mut upstream_text
                )
            );
            (Some(1001), Some(1001))
        }
        End::MaxDuration => {
            let event = crate::event::error_event(
                "invalid_request_error",
                "session_expired",
                "the session reached this gateway's maximum duration",
            );
            let reason = "maximum session duration";
            tokio::join!(
                finish(
                    &mut c_tx,
                    &mut c_rx,
                    Some(event),
                    Some(close(1001, reason)),
                    |_| {}
                ),
                finish(
                    &mut u_tx,
                    &mut u_rx,
                    None,
                    Some(close(1000, reason)),
                    &mut upstream_text
                )
            );
            (Some(1001), Some(1000))
        }
        End::Killed(kill) => {
            let upstream_close = if kill.code == 1001 { 1001 } else { 1000 };
            tokio::join!(
                finish(
                    &mut c_tx,
                    &mut c_rx,
                    kill.error_event.clone(),
                    Some(close(kill.code, &kill.reason)),
                    |_| {}
                ),
                finish(
                    &mut u_tx,
                    &mut u_rx,
                    None,
                    Some(close(upstream_close, &kill.reason)),
                    &mut upstream_text
                )
            );
            (Some(kill.code), Some(upstream_close))
        }
    };
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
            1006 | 1015 => Some(close(1011, "upstream connection lost")),
            _ => Some(f),
        },
        None => None,
    }
}

fn too_big(e: &WsError) -> bool {
    matches!(e, WsError::Capacity(CapacityError::MessageTooLong { .. }))
}

/// `{"type":"response.cancel"}`: ends the response in progress; the upstream
/// answers with its `response.done` (status `cancelled`, usage so far).
const RESPONSE_CANCEL: &str = r#"{"type":"response.cancel"}"#;

/// The client left while a response was in flight: cancel it and read the
/// upstream (through the tap) until no response is in flight, at most
/// [`CLOSE_GRACE`]. The upstream bills what it generated; its
/// `response.done` is how the gateway learns how much. Without it the turn
/// would be logged as cut short with unknown usage, and a client could
/// leave just before every `response.done` to spend without being charged.
async fn cancel_in_flight<U, T>(
    tx: &mut SplitSink<WebSocketStream<U>, Message>,
    rx: &mut SplitStream<WebSocketStream<U>>,
    tap: &mut T,
) where
    U: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
    T: Tap,
{
    if tap.responses_in_flight() == 0 {
        return;
    }
    let _ = tokio::time::timeout(CLOSE_GRACE, async {
        if tx.send(Message::text(RESPONSE_CANCEL)).await.is_err() {
            return;
        }
        while tap.responses_in_flight() > 0 {
            match rx.next().await {
                Some(Ok(Message::Text(t))) => tap.on_upstream_text(&t),
                Some(Ok(Message::Close(_))) | Some(Err(_)) | None => return,
                Some(Ok(_)) => {}
            }
        }
    })
    .await;
}

/// Sends `event` (if any) and our close (if any), flushes, then reads until
/// the peer's close reply or EOF, passing text frames to `on_text`; all of
/// it within [`CLOSE_GRACE`]. Reading the reply matters: closing a socket
/// with unread data makes the kernel send a reset, which can destroy the
/// close frame before the peer reads it. The bound matters as much: a peer
/// that stopped reading would otherwise block the first write forever.
async fn finish<S>(
    tx: &mut SplitSink<WebSocketStream<S>, Message>,
    rx: &mut SplitStream<WebSocketStream<S>>,
    event: Option<String>,
    frame: Option<CloseFrame>,
    mut on_text: impl FnMut(&str),
) where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let _ = tokio::time::timeout(CLOSE_GRACE, async {
        if let Some(event) = event {
            let _ = tx.feed(Message::text(event)).await;
        }
        match frame {
            Some(f) => {
                let _ = tx.send(Message::Close(Some(f))).await;
            }
            None => {
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
