//! One benchmark call: a voice call's traffic for a set time, with every
//! frame's transit time through the target.
//!
//! A call connects, waits for `session.created`, then repeats a turn until
//! its length is up:
//! 1. user speech: an `input_audio_buffer.append` of one chunk of PCM16
//!    silence every chunk interval (24 kHz × 20 ms = 960 bytes, 1,280
//!    base64 characters, a ~1.35 kB frame), at real time, for the speech
//!    time; then `input_audio_buffer.commit` and `response.create`;
//! 2. model speech: whatever the upstream streams until `response.done`
//!    (the simulator's `--audio-deltas`, `--audio-delta-bytes`,
//!    `--delta-interval-ms` set its length and pace);
//! 3. silence: nothing on the wire for the silence time (or until the
//!    call's length is up: a long silence makes calls that idle after one
//!    turn, for memory per idle call).
//!
//! Appends go only while the user speaks (a push-to-talk client, or one
//! whose own voice detection sends speech only); a client that streams its
//! microphone all the time would send appends through the model's turn and
//! the silence too.
//!
//! Transit times ([`patchbay_sim::stamp`]): each append's `event_id` carries
//! the time it was written (`CLOCK_REALTIME`, ns); the simulator reports
//! when each arrived in `input_audio_buffer.committed`. Each audio delta's
//! `event_id` carries when the simulator wrote it, read against the time
//! the call reads it. Both clocks are the machine's one clock, so these are
//! transit times; through a relay they include the relay's hop, and the
//! difference to direct in the same run is what the relay adds.

use std::sync::Arc;
use std::time::Duration;

use futures_util::SinkExt;
use patchbay_gateway::event::event_type;
use patchbay_sim::stamp;
use tokio::time::{Instant, MissedTickBehavior};
use tokio_tungstenite::tungstenite::{Message, Utf8Bytes};

use crate::session::{self, error_code, is_audio_delta, Endpoint, Phase, SessionError, Ws};

/// Bytes per sample of PCM16.
const PCM16_BYTES: u64 = 2;
const COMMIT: &str = r#"{"type":"input_audio_buffer.commit"}"#;
const RESPONSE_CREATE: &str = r#"{"type":"response.create"}"#;

/// The shape of every call of a run.
#[derive(Debug, Clone)]
pub struct CallShape {
    /// How long a call lasts: no turn starts after it (the turn under way
    /// finishes).
    pub length: Duration,
    pub speech: Duration,
    pub silence: Duration,
    pub chunk: Duration,
    /// Bytes of PCM16 per chunk.
    pub chunk_bytes: usize,
    /// Bound on connecting and on each wait for the upstream.
    pub timeout: Duration,
    /// The base64 of one chunk of silence, made once.
    pub audio_b64: Arc<str>,
    /// Translation sessions instead of conversations ([`crate::translation`]):
    /// appends for the whole length, no turns.
    pub translation: bool,
}

impl CallShape {
    /// A call of `length` with turns of `speech` in chunks of `chunk` at
    /// `sample_rate` Hz, then `silence` after the model's answer.
    pub fn new(
        length: Duration,
        speech: Duration,
        silence: Duration,
        chunk: Duration,
        sample_rate: u32,
        timeout: Duration,
    ) -> Self {
        use base64::Engine;
        let chunk_bytes = chunk_bytes(sample_rate, chunk);
        let audio_b64 = base64::engine::general_purpose::STANDARD.encode(vec![0u8; chunk_bytes]);
        Self {
            length,
            speech,
            silence,
            chunk,
            chunk_bytes,
            timeout,
            audio_b64: audio_b64.into(),
            translation: false,
        }
    }

    /// Appends over the whole length, for a session that streams all the
    /// time (at least one).
    pub fn chunks_per_length(&self) -> u64 {
        let n = self.length.as_nanos() / self.chunk.as_nanos().max(1);
        u64::try_from(n).unwrap_or(u64::MAX).max(1)
    }

    /// Appends per user turn (at least one).
    pub fn chunks_per_turn(&self) -> u32 {
        let n = self.speech.as_nanos() / self.chunk.as_nanos().max(1);
        u32::try_from(n).unwrap_or(u32::MAX).max(1)
    }
}

/// PCM16 bytes of `chunk` of mono audio at `sample_rate`.
pub fn chunk_bytes(sample_rate: u32, chunk: Duration) -> usize {
    (u64::from(sample_rate) * PCM16_BYTES * chunk.as_micros() as u64 / 1_000_000) as usize
}

/// What one call did.
#[derive(Debug, Clone, Default)]
pub struct CallRecord {
    /// Upgraded to its last turn's end (or its failure): the time the
    /// call was live.
    pub live: Duration,
    /// The close handshake afterwards (bounded by [`session::CLOSE_WAIT`]).
    pub close: Duration,
    /// Turns whose `response.done` arrived.
    pub turns: u32,
    pub appends_sent: u64,
    /// Transit times (ns) of the appends, as the upstream reported them.
    pub up_ns: Vec<u64>,
    /// Transit times (ns) of the audio deltas.
    pub down_ns: Vec<u64>,
    /// Translation: output audio deltas received, and each append's round
    /// trip (ns, written → its translated audio read).
    pub audio_deltas: u64,
    pub round_trip_ns: Vec<u64>,
}

/// Runs one call against `endpoint`, filling `rec` as it goes.
pub async fn run(
    endpoint: &Endpoint,
    shape: &CallShape,
    rec: &mut CallRecord,
) -> Result<(), SessionError> {
    let t0 = Instant::now();
    let mut ws = session::connect(endpoint, t0 + shape.timeout).await?;
    let up = Instant::now();
    let result = turns(&mut ws, shape, up + shape.length, rec).await;
    // The close handshake is not call time (it is bounded, and timed apart).
    let closing = Instant::now();
    rec.live = closing - up;
    session::close(&mut ws).await;
    rec.close = closing.elapsed();
    result
}

async fn turns(
    ws: &mut Ws,
    shape: &CallShape,
    end: Instant,
    rec: &mut CallRecord,
) -> Result<(), SessionError> {
    read_until(
        ws,
        Instant::now() + shape.timeout,
        Phase::Session,
        rec,
        |k| k == "session.created",
    )
    .await?;
    while Instant::now() < end {
        speak(ws, shape, rec).await?;
        ws.send(Message::Text(Utf8Bytes::from_static(COMMIT)))
            .await
            .map_err(|_| SessionError::Send)?;
        ws.send(Message::Text(Utf8Bytes::from_static(RESPONSE_CREATE)))
            .await
            .map_err(|_| SessionError::Send)?;
        read_until(ws, Instant::now() + shape.timeout, Phase::Turn, rec, |k| {
            k == "response.done"
        })
        .await?;
        rec.turns += 1;
        // The silence, up to the call's end (the call stays open, idle).
        let rest = end.saturating_duration_since(Instant::now());
        tokio::time::sleep(shape.silence.min(rest)).await;
    }
    Ok(())
}

/// The user's speech: one stamped append per chunk interval, at real time
/// (a late tick delays the rest rather than bursting to catch up, as a
/// microphone's frames come).
async fn speak(ws: &mut Ws, shape: &CallShape, rec: &mut CallRecord) -> Result<(), SessionError> {
    let mut tick = tokio::time::interval(shape.chunk);
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    for _ in 0..shape.chunks_per_turn() {
        tick.tick().await;
        let text = append_event(&shape.audio_b64, stamp::now_ns());
        ws.send(Message::text(text))
            .await
            .map_err(|_| SessionError::Send)?;
        rec.appends_sent += 1;
    }
    Ok(())
}

/// A stamped `input_audio_buffer.append` (`type` and `event_id` first, so
/// the stamp is among the frame's leading bytes).
pub fn append_event(audio_b64: &str, ns: u64) -> String {
    format!(
        r#"{{"type":"input_audio_buffer.append","event_id":"{}","audio":"{audio_b64}"}}"#,
        stamp::stamped_id("event_pb", ns)
    )
}

/// Reads frames until `done(type)`, by `deadline`, collecting transit
/// times on the way; an `error` event or a close fails the call.
async fn read_until(
    ws: &mut Ws,
    deadline: Instant,
    phase: Phase,
    rec: &mut CallRecord,
    done: impl Fn(&str) -> bool,
) -> Result<(), SessionError> {
    loop {
        let text = session::next_text(ws, deadline, phase).await?;
        // Read the clock first: the frame has arrived.
        let now = stamp::now_ns();
        let kind = event_type(&text);
        let kind = kind.as_deref().unwrap_or("");
        if is_audio_delta(kind) {
            if let Some(sent) = stamp::stamp_of(&text) {
                rec.down_ns.push(now.saturating_sub(sent));
            }
        } else if kind == "input_audio_buffer.committed" {
            rec.up_ns.extend(stamp::transits_of(&text));
        } else if kind == "error" {
            return Err(SessionError::ErrorEvent {
                phase,
                code: error_code(&text),
            });
        }
        if done(kind) {
            return Ok(());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn twenty_ms_at_24_khz_is_960_bytes() {
        assert_eq!(chunk_bytes(24_000, Duration::from_millis(20)), 960);
        assert_eq!(chunk_bytes(16_000, Duration::from_millis(10)), 320);
    }

    #[test]
    fn a_three_second_turn_is_150_chunks() {
        let s = CallShape::new(
            Duration::from_secs(60),
            Duration::from_secs(3),
            Duration::from_secs(1),
            Duration::from_millis(20),
            24_000,
            Duration::from_secs(30),
        );
        assert_eq!(s.chunks_per_turn(), 150);
        assert_eq!(s.audio_b64.len(), 1280);
        let short = CallShape {
            speech: Duration::from_millis(5),
            ..s
        };
        assert_eq!(short.chunks_per_turn(), 1, "at least one append a turn");
    }

    #[test]
    fn an_append_carries_its_stamp_up_front() {
        let e = append_event("AAAA", 42);
        assert_eq!(stamp::stamp_of(&e), Some(42));
        assert!(e.starts_with(r#"{"type":"input_audio_buffer.append","event_id":"#));
        let v: serde_json::Value = serde_json::from_str(&e).unwrap();
        assert_eq!(v["audio"], "AAAA");
    }
}
