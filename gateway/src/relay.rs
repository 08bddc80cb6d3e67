//! The splice: client ⇄ upstream until one side ends, then one teardown for
//! every cause.
//!
//! Guarantees:
//! - Frame passthrough: a data frame is forwarded as the bytes received,
//!   header and payload ([`leg`], [`reader`]). A client frame is already a
//!   valid masked frame for the upstream, an upstream frame a valid
//!   unmasked frame for the client; nothing is decoded into a message and
//!   encoded again. Frame boundaries come from the headers; a message over
//!   `max_message_bytes` (summed over its fragments) is refused from its
//!   header before its payload is read; client text is validated as UTF-8
//!   across fragments without modifying it; upstream text is trusted.
//! - The [`Tap`] sees each upstream text message, in place (assembled only
//!   when it came in fragments), before its last frame is sent on.
//! - Ping/Pong are hop-by-hop: each leg's pings are answered on that leg,
//!   and any frame counts as activity for the idle timeout.
//! - One task drives both directions. Each wake-up reads every frame that is
//!   ready on both legs, queues them whole (no copy: the queue holds the
//!   read buffers) and writes each queue out in one vectored write, so a
//!   burst costs one write, not one per frame (on loopback most of a
//!   relay's CPU is the kernel's send path). A peer that stops reading
//!   stalls only the direction towards it: past [`HIGH_WATER_BYTES`]
//!   queued, the other leg is not read, and TCP pushes back on its sender.
//! - The gateway's own frames (cancels upstream, error events to the
//!   client) go only between messages: a fragmented message in flight
//!   towards that leg is forwarded to its end first (bounded by
//!   [`CLOSE_GRACE`]); if its sender is gone, a client message is ended
//!   with a last fragment that keeps it valid, and an upstream message cut
//!   short costs the client its error event (the close, a control frame,
//!   may go between fragments).
//! - No lock or atomic per frame: one clock read per wake-up that read
//!   anything, kept in a plain local. One timer (for the idle timeout,
//!   the deadline or the release of an idle session's spare buffers,
//!   whichever is due first: [`RELEASE_IDLE_AFTER`]) and the kill
//!   signal are polled only when one of them woke ([`on_wake`]), not on
//!   each of the pump's wake-ups. Both legs' sockets are read on every
//!   wake-up, as a byte-copying relay does: a read flag per leg (a waker
//!   of its own, so that a frame on one leg did not poll the other's
//!   empty socket) saved instructions but cost CPU time on voice calls
//!   (`benchmarks/HISTORY.md`).
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
//! The client's close never waits on the upstream leg: its connection is
//! closed, TCP included, once its own handshake is done, and the caller is
//! told then (`client_done` of [`splice`]) so that what the client held
//! (its admission slot, its lease) is freed with it. The session task ends
//! after both legs, within 3 × [`CLOSE_GRACE`] (a fragmented message let
//! through to its end first, the cancel's answer, the close), holding
//! only the upstream leg and the tap meanwhile.
//!
//! Close codes: a received close is forwarded with its code and reason;
//! codes that may not be sent on the wire (1005, 1006, 1015) become a bare
//! close or 1011. Oversize messages (`max_message_bytes`) get 1009 on the
//! leg that sent them; a client protocol error 1002 (1007 for invalid UTF-8).

pub mod client_text;
pub mod code;
pub mod end;
pub mod frame;
pub mod leg;
pub(crate) mod on_wake;
#[cfg(test)]
mod passthrough_tests;
pub mod reader;
#[cfg(test)]
pub(crate) mod testing;

use std::future::Future;
use std::task::{Context, Poll};
use std::time::Duration;

use futures_util::stream::{SplitSink, SplitStream};
use futures_util::{SinkExt, StreamExt};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::time::Instant;
use tokio_tungstenite::tungstenite::protocol::{CloseFrame, WebSocketConfig};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::WebSocketStream;

use client_text::{Peek, Verdict};
use end::sendable;
pub use end::{close, teardown, End, Kill, LegClose, Spliced, Teardown};
use frame::{FrameError, FrameRole};
use leg::{Control, Leg, Side};
use on_wake::WakeFlag;
use reader::{RawFrame, ReadError};

/// How long a leg is given to answer our close before the socket is dropped;
/// also the bound on waiting for cancelled responses' `response.done`.
pub const CLOSE_GRACE: Duration = Duration::from_secs(2);
/// Read buffer of a tungstenite WebSocket (a call's sideband), which is
/// also the most tungstenite reads at once. tungstenite's default
/// (128 KiB) cost ~300 KB of memory per idle session when the relay still
/// used it, 16 KiB ~88 KB, 4 KiB ~65 KB. 4 KiB holds every control
/// frame and small delta in one read and a 22 KB audio delta takes a few
/// reads, yet measured in one interleaved run against 16 KiB it used ~3 %
/// *less* CPU: tungstenite zero-fills the buffer's free space up to this
/// size before every read, so a smaller buffer zero-fills less
/// (`benchmarks/README.md`, read-buffer A/B).
pub const READ_BUFFER_BYTES: usize = 4 * 1024;

/// The WebSocket settings of tungstenite connections (a call's sideband).
pub fn ws_config(max_message_bytes: usize) -> WebSocketConfig {
    WebSocketConfig::default()
        .read_buffer_size(READ_BUFFER_BYTES)
        .max_message_size(Some(max_message_bytes))
        .max_frame_size(Some(max_message_bytes))
}

/// Sees upstream text messages on their way to the client, and the end.
pub trait Tap {
    /// Whether the tap can take another upstream message now. While it is
    /// `Pending` (its waker registered) the relay reads no upstream frame:
    /// the tap's backpressure, for records it must not drop.
    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<()> {
        Poll::Ready(())
    }
    fn on_upstream_text(&mut self, _text: &str) {}
    /// A text message as received (the upstream's text is trusted, not
    /// validated, on the relay's path). The default validates it and hands
    /// it to [`Tap::on_upstream_text`]; a tap that can tell from the
    /// leading bytes that it has no use for a message skips that work.
    fn on_upstream_frame(&mut self, text: &[u8]) {
        if let Ok(text) = std::str::from_utf8(text) {
            self.on_upstream_text(text);
        }
    }
    /// Responses the upstream has started and not yet finished, by
    /// `response_id` (`None` when the upstream named none). The teardown
    /// cancels each and waits (bounded) for its `response.done`, which
    /// reports its usage.
    fn responses_in_flight(&self) -> Vec<Option<String>> {
        Vec::new()
    }
    /// The event that asks the upstream to finish one of
    /// [`Tap::responses_in_flight`] (a `response.cancel` by default).
    fn cancel_text(&self, response_id: Option<&str>) -> String {
        cancel_event(response_id)
    }
    /// Called once, when the session starts ending and before anything is
    /// cancelled: the `response.done` events that follow answer the
    /// teardown's cancels.
    fn ending(&mut self, _end: &End) {}
    /// Whether the tap sees client text messages before they are forwarded
    /// ([`client_text`]); when `false` the relay does no work for it.
    fn inspects_client(&self) -> bool {
        false
    }
    /// From the first bytes of a client text message (unmasked, at most
    /// [`client_text::PEEK_BYTES`]), whether the tap must see it whole;
    /// `frame` is the message's first frame as received (masked).
    fn peek_client(&mut self, _leading: &[u8], _frame: &RawFrame) -> Peek {
        Peek::Forward
    }
    /// A whole client text message the tap asked to see: forwarded,
    /// replaced, or dropped with an `error` event for the client.
    fn on_client_text(&mut self, _text: &[u8]) -> Verdict {
        Verdict::Forward
    }
    /// The first frame of a fragmented client text message the tap asked to
    /// see whole (the relay holds no fragments back): `Err(event)` drops the
    /// message and sends the client `event`.
    fn on_client_fragmented(&mut self) -> Result<(), String> {
        Ok(())
    }
}

impl Tap for () {}

#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub idle_timeout: Duration,
    /// Deadline of the whole session (from its start, not the splice's).
    pub deadline: Instant,
}

/// A splice's activity, as its limits judge it.
#[derive(Debug, Default)]
struct Quiet {
    /// The last wake-up that read a frame, in ms from the splice's start.
    last_ms: u64,
    /// The `last_ms` whose quiet released the legs' buffers: once per
    /// quiet spell.
    released_for: Option<u64>,
}

/// What a splice's limits call for at a given time.
#[derive(Debug, PartialEq)]
enum Due {
    End(End),
    /// Let go of the legs' idle buffers ([`RELEASE_IDLE_AFTER`]).
    Release,
    /// Nothing until then.
    At(Instant),
}

impl Limits {
    /// The idle timeout, the deadline or the release of idle buffers,
    /// whichever is due at `now` (the release once per quiet spell), else
    /// when the first of them will be.
    fn due(&self, started: Instant, quiet: &mut Quiet, now: Instant) -> Due {
        let last = started + Duration::from_millis(quiet.last_ms);
        let idle_due = last + self.idle_timeout;
        if now >= self.deadline {
            return Due::End(End::MaxDuration);
        }
        if now >= idle_due {
            return Due::End(End::IdleTimeout);
        }
        let mut at = idle_due.min(self.deadline);
        if quiet.released_for != Some(quiet.last_ms) {
            let release_due = last + RELEASE_IDLE_AFTER;
            if now >= release_due {
                quiet.released_for = Some(quiet.last_ms);
                return Due::Release;
            }
            at = at.min(release_due);
        }
        Due::At(at)
    }
}

/// Data frames the client sent before the upstream was ready (as
/// received), forwarded first (through the tap's client check).
pub type Pending = Vec<RawFrame>;

/// How long a session is quiet (no frame either way) before its legs let
/// go of the buffers they keep only to be quicker with the next frames
/// ([`Leg::release_idle_buffers`]: the reader's spare, up to
/// [`reader::REUSE_MAX_BYTES`] per leg, and the write queue's room). Far
/// longer than the pauses of a call, so a stream of deltas keeps reusing
/// its buffer. While frames flow the shared timer fires once per this
/// interval to re-arm (once per idle timeout, 300 s by default, before it),
/// so the interval is kept long: at 5 s it was twelve more wake-ups per
/// call-minute, each a poll of the whole session.
pub const RELEASE_IDLE_AFTER: Duration = Duration::from_secs(30);

/// Bytes queued per direction before the relay stops reading the sending
/// leg (TCP then pushes back on that peer): what the gateway holds per
/// direction is bounded by this, one frame and the kernel's buffers.
pub const HIGH_WATER_BYTES: usize = 128 * 1024;

/// How far one direction of the pump forwards.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Forward,
    /// Until the open fragmented message has passed, then stop.
    ToBoundary,
    Stopped,
}

/// Both directions of a splice, driven from one task: each poll reads what
/// every leg has ready, queues it whole for the other leg and writes each
/// queue out with one vectored write.
struct Pump<'a, C, U, T> {
    client: Leg<C>,
    upstream: Leg<U>,
    tap: &'a mut T,
    /// Client → upstream.
    up: Mode,
    /// Upstream → client.
    down: Mode,
    client_close: Option<CloseFrame>,
    upstream_close: Option<CloseFrame>,
    /// A frame was read since this was last cleared.
    active: bool,
    /// This pass left work that only another pass does: a read stopped at
    /// [`HIGH_WATER_BYTES`] (no read waker registered), or a frame of the
    /// gateway's own queued on the upstream leg after its flush.
    again: bool,
    /// The client message being read was refused: its frames are dropped
    /// to its last.
    dropping: bool,
    /// Error events for the client that wait for the upstream → client
    /// direction to reach a message boundary.
    client_events: Vec<String>,
}

impl<C, U, T> Pump<'_, C, U, T>
where
    C: AsyncRead + AsyncWrite + Unpin,
    U: AsyncRead + AsyncWrite + Unpin,
    T: Tap,
{
    /// `Ready(Some(end))` when the session ends, `Ready(None)` when both
    /// directions have stopped ([`Mode::ToBoundary`]).
    ///
    /// One pass reads each leg until it has nothing (its read waker is then
    /// registered) and flushes both; another pass follows only when this
    /// one left work behind ([`Pump::again`]), not merely because it read
    /// something: a second pass would only poll both sockets again to find
    /// them empty.
    fn poll(&mut self, cx: &mut Context<'_>) -> Poll<Option<End>> {
        loop {
            let mut progress = false;
            self.again = false;
            if let Some(end) = self.poll_up(cx, &mut progress) {
                return Poll::Ready(Some(end));
            }
            if let Some(end) = self.poll_down(cx, &mut progress) {
                return Poll::Ready(Some(end));
            }
            if self.up == Mode::Stopped && self.down == Mode::Stopped {
                return Poll::Ready(None);
            }
            if !progress || !self.again {
                return Poll::Pending;
            }
        }
    }

    /// Client → upstream. Client pings are answered on the client leg
    /// (written by [`Self::poll_down`]'s flush).
    fn poll_up(&mut self, cx: &mut Context<'_>, progress: &mut bool) -> Option<End> {
        if let Poll::Ready(Err(_)) = self.upstream.poll_flush(cx) {
            return Some(End::UpstreamGone);
        }
        while self.up != Mode::Stopped {
            if self.upstream.queued_bytes() >= HIGH_WATER_BYTES {
                self.again = true;
                break;
            }
            let f = match self.client.poll_frame(cx) {
                Poll::Pending => break,
                Poll::Ready(Ok(Some(f))) => f,
                Poll::Ready(Ok(None)) => return Some(End::ClientGone),
                Poll::Ready(Err(e)) => return Some(client_error(&e)),
            };
            *progress = true;
            self.active = true;
            match f.role {
                FrameRole::Data { last, .. } => {
                    self.forward_client_data(f);
                    if last && self.up == Mode::ToBoundary {
                        self.up = Mode::Stopped;
                    }
                }
                FrameRole::Control => match self.client.answer(&f) {
                    Ok(Control::PingPong) => {}
                    Ok(Control::Close(frame)) => {
                        let code = frame.as_ref().map(|f| u16::from(f.code));
                        self.client_close = sendable(frame);
                        return Some(End::ClientClosed(code));
                    }
                    Err(code) => return Some(End::ClientProtocolError(code)),
                },
            }
        }
        if let Poll::Ready(Err(_)) = self.upstream.poll_flush(cx) {
            return Some(End::UpstreamGone);
        }
        None
    }

    /// Queues a client data frame for the upstream, unless the tap refuses
    /// its message ([`client_text`]): then the message's frames are dropped
    /// and the client gets the tap's error event.
    fn forward_client_data(&mut self, f: RawFrame) {
        let FrameRole::Data { last, .. } = f.role else {
            return;
        };
        let first = f.header.opcode != frame::opcode::CONTINUATION;
        if first {
            // Binary messages too: an upstream might read JSON from either.
            let verdict = if self.tap.inspects_client() {
                self.check_client_text(&f, last)
            } else {
                Verdict::Forward
            };
            self.dropping = verdict != Verdict::Forward;
            match verdict {
                Verdict::Forward => {}
                // A whole message: nothing of it follows.
                Verdict::Replace(text) => self.upstream.queue_text(&text),
                Verdict::Refuse(event) => self.send_client_event(event),
            }
        }
        if !self.dropping {
            self.upstream.queue(f.bytes);
        }
        if last {
            self.dropping = false;
        }
    }

    /// The tap's verdict on the client message `f` starts.
    fn check_client_text(&mut self, f: &RawFrame, last: bool) -> Verdict {
        let mut buf = [0u8; client_text::PEEK_BYTES];
        let leading = client_text::peek(f, &mut buf);
        match self.tap.peek_client(leading, f) {
            Peek::Forward => Verdict::Forward,
            Peek::Whole if last => self.tap.on_client_text(&client_text::unmasked(f)),
            Peek::Whole => match self.tap.on_client_fragmented() {
                Ok(()) => Verdict::Forward,
                Err(event) => Verdict::Refuse(event),
            },
        }
    }

    /// An event of the gateway's own for the client: queued now when no
    /// upstream message is in flight towards it, else after that message.
    fn send_client_event(&mut self, event: String) {
        if self.upstream.at_boundary() {
            self.client.queue_text(&event);
        } else {
            self.client_events.push(event);
        }
    }

    /// Upstream → client; the tap sees each text message before the client
    /// is sent its last frame.
    fn poll_down(&mut self, cx: &mut Context<'_>, progress: &mut bool) -> Option<End> {
        if let Poll::Ready(Err(_)) = self.client.poll_flush(cx) {
            return Some(End::ClientGone);
        }
        while self.down != Mode::Stopped {
            if self.client.queued_bytes() >= HIGH_WATER_BYTES {
                self.again = true;
                break;
            }
            if self.tap.poll_ready(cx).is_pending() {
                break;
            }
            let f = match self.upstream.poll_frame(cx) {
                Poll::Pending => break,
                Poll::Ready(Ok(Some(f))) => f,
                Poll::Ready(Err(ReadError::Frame(FrameError::MessageTooBig { .. }))) => {
                    return Some(End::UpstreamTooBig)
                }
                Poll::Ready(Ok(None) | Err(_)) => return Some(End::UpstreamGone),
            };
            *progress = true;
            self.active = true;
            match f.role {
                FrameRole::Data { last, .. } => {
                    if let Some(text) = self.upstream.text_of(&f) {
                        self.tap.on_upstream_frame(&text);
                    }
                    self.client.queue(f.bytes);
                    if last && !self.client_events.is_empty() {
                        for event in std::mem::take(&mut self.client_events) {
                            self.client.queue_text(&event);
                        }
                    }
                    if last && self.down == Mode::ToBoundary {
                        self.down = Mode::Stopped;
                    }
                }
                FrameRole::Control => match self.upstream.answer(&f) {
                    // A pong may be queued on the upstream leg, whose flush
                    // comes in the next pass.
                    Ok(Control::PingPong) => self.again = true,
                    Ok(Control::Close(frame)) => {
                        let code = frame.as_ref().map(|f| u16::from(f.code));
                        self.upstream_close = sendable(frame);
                        return Some(End::UpstreamClosed(code));
                    }
                    Err(_) => return Some(End::UpstreamGone),
                },
            }
        }
        if let Poll::Ready(Err(_)) = self.client.poll_flush(cx) {
            return Some(End::ClientGone);
        }
        None
    }
}

/// Relays until one side ends, then tears down. `client_done` runs once
/// the client's side is over (its close answered or sent, within
/// [`CLOSE_GRACE`]), just before its connection is dropped: the caller
/// frees what the client held (its admission slot, its lease) while the
/// upstream leg may still be cancelling and metering.
///
/// A function returning an async block rather than an `async fn`: an
/// `async fn` stores its by-value arguments twice in its future (as
/// arguments, then as the locals they are moved to), 624 bytes here, held
/// for the session's life.
pub fn splice<'a, C, U, T, K, D>(
    client: Leg<C>,
    upstream: Leg<U>,
    pending: Pending,
    limits: Limits,
    tap: &'a mut T,
    kill: K,
    client_done: D,
) -> impl Future<Output = Spliced> + 'a
where
    C: AsyncRead + AsyncWrite + Unpin + 'a,
    U: AsyncRead + AsyncWrite + Unpin + 'a,
    T: Tap,
    K: Future<Output = Kill> + 'a,
    D: FnOnce() + 'a,
{
    // Built here, not in the async block: the block then holds the legs
    // once, in the pump, rather than as its arguments and again in a local.
    let mut pump = Pump {
        client,
        upstream,
        tap,
        up: Mode::Forward,
        down: Mode::Forward,
        client_close: None,
        upstream_close: None,
        active: false,
        again: false,
        dropping: false,
        client_events: Vec::new(),
    };
    for f in pending {
        pump.forward_client_data(f);
    }
    async move {
        let end = {
            let started = Instant::now();
            // The idle timeout, the session's deadline and the release of
            // idle buffers share one timer, set for whichever comes first
            // ([`Limits::due`]). The timer and the kill are polled only when
            // one of them woke ([`WakeFlag`]), not on every wake-up of the
            // pump; the activity they judge by is a plain local the pump's
            // poll sets, read only then.
            let mut timer = std::pin::pin!(tokio::time::sleep_until(started));
            let mut kill = std::pin::pin!(kill);
            let mut quiet = Quiet::default();
            let watch = WakeFlag::new();
            // The pump first, then the watchdog (a `poll_fn`, not a
            // `select!`: a `select!` in an async block held a second copy
            // of its futures).
            std::future::poll_fn(|cx| {
                let polled = pump.poll(cx);
                // One clock read per wake-up that read anything, not per
                // frame.
                if std::mem::take(&mut pump.active) {
                    quiet.last_ms = started.elapsed().as_millis() as u64;
                }
                if let Poll::Ready(Some(end)) = polled {
                    return Poll::Ready(end);
                }
                // Both directions forward until the end: never stopped.
                watch.poll(cx, |cx| {
                    loop {
                        match limits.due(started, &mut quiet, Instant::now()) {
                            Due::End(end) => return Poll::Ready(end),
                            Due::Release => {
                                pump.client.release_idle_buffers();
                                pump.upstream.release_idle_buffers();
                            }
                            Due::At(at) => {
                                if timer.is_elapsed() || timer.deadline() != at {
                                    timer.as_mut().reset(at);
                                }
                                if timer.as_mut().poll(cx).is_pending() {
                                    break;
                                }
                            }
                        }
                    }
                    kill.as_mut().poll(cx).map(End::Killed)
                })
            })
            .await
        };

        // Boxed: the teardown's state (the plan, the closes' futures: 1.6 KB)
        // would otherwise size the session's future, held for its whole
        // life, for its last seconds.
        Box::pin(tear_down(pump, end, client_done)).await
    }
}

/// The splice's teardown ([`splice`]): one plan for every cause of `end`.
async fn tear_down<C, U, T, D>(mut pump: Pump<'_, C, U, T>, end: End, client_done: D) -> Spliced
where
    C: AsyncRead + AsyncWrite + Unpin,
    U: AsyncRead + AsyncWrite + Unpin,
    T: Tap,
    D: FnOnce(),
{
    let plan = teardown(&end, pump.client_close.take(), pump.upstream_close.take());
    let received = match &end {
        End::ClientClosed(c) | End::UpstreamClosed(c) => *c,
        _ => None,
    };
    let client_code = plan.client.code(received);
    let upstream_code = plan.upstream.code(received);
    pump.tap.ending(&end);
    let Teardown {
        mut client_event,
        client: client_how,
        upstream: upstream_how,
        upstream_answers,
    } = plan;

    // Frames of the gateway's own go between messages, never inside a
    // fragmented one: a message in flight towards a leg that gets one is
    // forwarded to its end first (bounded), when its sender can still send.
    let cancels = upstream_answers && !pump.tap.responses_in_flight().is_empty();
    let client_sends = matches!(
        end,
        End::IdleTimeout
            | End::MaxDuration
            | End::Killed(_)
            | End::UpstreamClosed(_)
            | End::UpstreamGone
            | End::UpstreamTooBig
    );
    pump.up = if cancels && client_sends && !pump.client.at_boundary() {
        Mode::ToBoundary
    } else {
        Mode::Stopped
    };
    pump.down = if client_event.is_some()
        && upstream_answers
        && client_how != LegClose::Gone
        && !pump.upstream.at_boundary()
    {
        Mode::ToBoundary
    } else {
        Mode::Stopped
    };
    if pump.up == Mode::ToBoundary || pump.down == Mode::ToBoundary {
        let _ = tokio::time::timeout(CLOSE_GRACE, std::future::poll_fn(|cx| pump.poll(cx))).await;
    }
    let Pump {
        mut client,
        mut upstream,
        tap,
        ..
    } = pump;
    // Asked again: the upstream's message just forwarded to its end may
    // have been a `response.created`.
    let cancels = upstream_answers && !tap.responses_in_flight().is_empty();
    if cancels {
        // The client's message could not finish (its sender closed, broke
        // or left): end it with a last fragment that keeps it valid, so the
        // cancel that follows is a message of its own.
        if let Some(rest) = client.completion() {
            upstream.queue_fragment(true, frame::opcode::CONTINUATION, &rest);
        }
    }
    if !upstream.at_boundary() {
        // The upstream's message is cut short: the client gets the close
        // (a control frame may go between fragments), not the event.
        client_event = None;
    }

    // The client leg owns its connection: it is closed (TCP too) as soon
    // as its handshake is done, not when the upstream leg is, so a client
    // waiting for the server to close first (RFC 6455 §7.1.1) is not held
    // by the cancel below.
    let client_leg = async move {
        close_leg(&mut client, client_event, client_how, |_| {}).await;
        client_done();
        drop(client);
    };
    let upstream_leg = async {
        if upstream_answers {
            cancel_in_flight(&mut upstream, tap).await;
        }
        close_leg(&mut upstream, None, upstream_how, |t| {
            tap.on_upstream_frame(t)
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

/// What a read error on the client leg means: an oversize frame or message,
/// a protocol violation (the client can still be told), or a connection
/// that is gone.
fn client_error(e: &ReadError) -> End {
    match e {
        ReadError::Frame(FrameError::MessageTooBig { .. }) => End::ClientTooBig,
        ReadError::Frame(f) => End::ClientProtocolError(f.close_code()),
        // A connection that ended mid-frame is gone, not misbehaving.
        ReadError::Truncated | ReadError::Io(_) => End::ClientGone,
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

/// A connection to the upstream that events can be sent on and read from:
/// a relay [`Leg`], or a call's sideband ([`WsLeg`]).
pub(crate) trait EventLeg {
    /// Sends each text; `false` when the connection is gone.
    async fn send_texts(&mut self, texts: &[String]) -> bool;
    /// Reads the next frame, giving a whole text message to `tap`; `false`
    /// when the connection ended (a close, an error, EOF).
    async fn read_into<T: Tap>(&mut self, tap: &mut T) -> bool;
}

impl<S: AsyncRead + AsyncWrite + Unpin> EventLeg for Leg<S> {
    async fn send_texts(&mut self, texts: &[String]) -> bool {
        for t in texts {
            self.queue_text(t);
        }
        self.flush().await.is_ok()
    }

    async fn read_into<T: Tap>(&mut self, tap: &mut T) -> bool {
        std::future::poll_fn(|cx| tap.poll_ready(cx)).await;
        self.read_text(|t| tap.on_upstream_frame(t)).await
    }
}

/// A tungstenite connection split in halves (a call's sideband).
pub(crate) struct WsLeg<'a, S> {
    pub tx: &'a mut SplitSink<WebSocketStream<S>, Message>,
    pub rx: &'a mut SplitStream<WebSocketStream<S>>,
}

impl<S: AsyncRead + AsyncWrite + Unpin> EventLeg for WsLeg<'_, S> {
    async fn send_texts(&mut self, texts: &[String]) -> bool {
        for t in texts {
            if self.tx.feed(Message::text(t.as_str())).await.is_err() {
                return false;
            }
        }
        self.tx.flush().await.is_ok()
    }

    async fn read_into<T: Tap>(&mut self, tap: &mut T) -> bool {
        std::future::poll_fn(|cx| tap.poll_ready(cx)).await;
        match self.rx.next().await {
            Some(Ok(Message::Text(t))) => {
                tap.on_upstream_text(&t);
                true
            }
            Some(Ok(Message::Close(_))) | Some(Err(_)) | None => false,
            Some(Ok(_)) => true,
        }
    }
}

/// Cancels every response in flight (and any that starts meanwhile) and
/// reads the upstream, through the tap, until none is in flight, at most
/// [`CLOSE_GRACE`]. Without the `response.done` that answers a cancel, the
/// turn would be logged with unknown usage, and a client could end its
/// session just before every `response.done` to spend without being charged.
pub(crate) async fn cancel_in_flight<L: EventLeg, T: Tap>(leg: &mut L, tap: &mut T) {
    let mut cancelled: Vec<Option<String>> = Vec::new();
    let _ = tokio::time::timeout(CLOSE_GRACE, async {
        loop {
            let in_flight = tap.responses_in_flight();
            if in_flight.is_empty() {
                return;
            }
            let fresh: Vec<Option<String>> = in_flight
                .into_iter()
                .filter(|id| !cancelled.contains(id))
                .collect();
            if !fresh.is_empty() {
                let events: Vec<String> = fresh
                    .iter()
                    .map(|id| tap.cancel_text(id.as_deref()))
                    .collect();
                if !leg.send_texts(&events).await {
                    return;
                }
                cancelled.extend(fresh);
            }
            if !leg.read_into(tap).await {
                return;
            }
        }
    })
    .await;
}

/// Closes one leg within [`CLOSE_GRACE`]: sends `event` (if any) and the
/// close, flushes, then reads until the peer's close reply or EOF, passing
/// text messages to `on_text`. Reading the reply matters: closing a socket
/// with unread data makes the kernel send a reset, which can destroy the
/// close frame before the peer reads it. The bound matters as much: a peer
/// that stopped reading would otherwise block the first write forever.
async fn close_leg<S: AsyncRead + AsyncWrite + Unpin>(
    leg: &mut Leg<S>,
    event: Option<String>,
    how: LegClose,
    on_text: impl FnMut(&[u8]),
) {
    let frame = match how {
        LegClose::Gone => return,
        // The peer's close came first and the leg queued its reply when it
        // arrived: once the reply is written the handshake is complete. On
        // the client leg the gateway is the server, which closes the TCP
        // connection first (RFC 6455 §7.1.1); reading on for the client's
        // EOF, while the client waited for ours, held every client-closed
        // session (its socket and task) for the whole CLOSE_GRACE (2 s,
        // found by the calls benchmark). On the upstream leg the gateway
        // is the client, and reads on until the upstream closes, as the
        // RFC has clients do.
        LegClose::Reply if leg.side() == Side::Server => {
            let _ = tokio::time::timeout(CLOSE_GRACE, leg.flush()).await;
            return;
        }
        LegClose::Reply => None,
        LegClose::Send(frame) => frame,
    };
    let _ = tokio::time::timeout(CLOSE_GRACE, async {
        if let Some(event) = event {
            leg.queue_text(&event);
        }
        leg.close(frame, on_text).await;
    })
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;

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

    /// The one timer's schedule: the first of the release of idle buffers
    /// (once per quiet spell), the idle timeout and the deadline.
    #[test]
    fn limits_fall_due_in_order_and_release_once_per_quiet_spell() {
        let started = Instant::now();
        let s = Duration::from_secs;
        let limits = Limits {
            idle_timeout: s(300),
            deadline: started + s(3600),
        };
        let mut quiet = Quiet::default();
        let due = |quiet: &mut Quiet, at: u64| limits.due(started, quiet, started + s(at));
        assert_eq!(due(&mut quiet, 0), Due::At(started + RELEASE_IDLE_AFTER));
        assert_eq!(due(&mut quiet, 30), Due::Release);
        assert_eq!(quiet.released_for, Some(0));
        assert_eq!(
            due(&mut quiet, 30),
            Due::At(started + s(300)),
            "released once"
        );
        // Activity at 100 s: a new quiet spell, released again 30 s later.
        quiet.last_ms = 100_000;
        assert_eq!(due(&mut quiet, 100), Due::At(started + s(130)));
        assert_eq!(due(&mut quiet, 131), Due::Release);
        assert_eq!(due(&mut quiet, 131), Due::At(started + s(400)));
        assert_eq!(due(&mut quiet, 400), Due::End(End::IdleTimeout));
        // The deadline comes first when it is nearer, and ends the session
        // whatever the activity.
        let near = Limits {
            idle_timeout: s(300),
            deadline: started + s(20),
        };
        let mut quiet = Quiet::default();
        assert_eq!(
            near.due(started, &mut quiet, started),
            Due::At(started + s(20))
        );
        quiet.last_ms = 19_999;
        assert_eq!(
            near.due(started, &mut quiet, started + s(20)),
            Due::End(End::MaxDuration)
        );
    }

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
        let big = ReadError::Frame(FrameError::MessageTooBig { size: 9, max: 1 });
        assert_eq!(client_error(&big), End::ClientTooBig);
        let unmasked = ReadError::Frame(FrameError::Unmasked);
        assert_eq!(client_error(&unmasked), End::ClientProtocolError(1002));
        let utf8 = ReadError::Frame(FrameError::InvalidUtf8);
        assert_eq!(client_error(&utf8), End::ClientProtocolError(1007));
        assert_eq!(client_error(&ReadError::Truncated), End::ClientGone);
        let io = ReadError::Io(std::io::Error::from(std::io::ErrorKind::BrokenPipe));
        assert_eq!(client_error(&io), End::ClientGone);
    }
}
