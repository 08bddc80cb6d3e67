//! One benchmark translation session: a speaker's audio streamed to
//! `/v1/realtime/translations` for a set time, the translated audio read as
//! it comes.
//!
//! A session connects (the target's URL names the translations path; the
//! model is `--model`, by default `gpt-realtime-translate`), waits for
//! `session.created`, then sends a `session.input_audio_buffer.append` of
//! one chunk of PCM16 silence every chunk interval, at real time, until the
//! session's length of audio has gone (24 kHz × 100 ms = 4,800 bytes, 6,400
//! base64 characters, a ~6.45 kB frame; 600 appends a minute). A
//! translation client streams its microphone the whole time: there is no
//! commit, no `response.create`, no turn. While it sends, it reads what
//! comes back (`session.output_audio.delta`, transcript deltas); after the
//! last append it waits for the output of every append (bounded by the
//! timeout), then closes. An `error` event or a close fails the session.
//!
//! The append is the one frame the gateway measures on the client's side
//! (`gateway/src/metering/translation.rs`): `type` first, `audio` second,
//! nothing after it, as the official SDK's append event carries them. It is
//! made once per run and shared, so the bench's cost per append is one
//! WebSocket write.
//!
//! Round trip: the simulator answers each append with one output audio
//! delta of the same length, in order, so the time from writing an append
//! to reading the next unanswered delta is that append's round trip through
//! the target (client → upstream → client, with the simulator's encoding of
//! the answer). The difference to direct in the same run is what a relay
//! adds on the two hops. An upstream that does not answer one delta per
//! append gives round trips of no meaning; its deltas are still counted.

use std::collections::VecDeque;

use futures_util::SinkExt;
use patchbay_gateway::event::event_type;
use tokio::time::{Instant, MissedTickBehavior};
use tokio_tungstenite::tungstenite::{Message, Utf8Bytes};

use crate::calls::{CallRecord, CallShape};
use crate::session::{self, error_code, Endpoint, Phase, SessionError, Ws};

/// The translated audio, one delta per append from the simulator.
const OUTPUT_AUDIO_DELTA: &str = "session.output_audio.delta";

/// An append of `audio_b64`: `type` first, then `audio`, as the SDK writes
/// it.
pub fn append_event(audio_b64: &str) -> String {
    format!(r#"{{"type":"session.input_audio_buffer.append","audio":"{audio_b64}"}}"#)
}

/// Runs one translation session against `endpoint`, filling `rec` as it
/// goes (`live`, `close`, `appends_sent`, `audio_deltas`, `round_trip_ns`).
pub async fn run(
    endpoint: &Endpoint,
    shape: &CallShape,
    rec: &mut CallRecord,
) -> Result<(), SessionError> {
    let t0 = Instant::now();
    let mut ws = session::connect(endpoint, t0 + shape.timeout).await?;
    let up = Instant::now();
    let result = stream(&mut ws, shape, rec).await;
    // The close handshake is not session time (it is bounded, and timed apart).
    let closing = Instant::now();
    rec.live = closing - up;
    session::close(&mut ws).await;
    rec.close = closing.elapsed();
    result
}

/// What woke the streaming loop.
enum Step {
    Tick,
    Frame(Result<Utf8Bytes, SessionError>),
}

async fn stream(ws: &mut Ws, shape: &CallShape, rec: &mut CallRecord) -> Result<(), SessionError> {
    session::wait_for(
        ws,
        Instant::now() + shape.timeout,
        Phase::Session,
        |k, _| k == "session.created",
    )
    .await?;
    let append = Utf8Bytes::from(append_event(&shape.audio_b64));
    let appends = shape.chunks_per_length();
    // Write times of the appends whose translated audio has not come yet.
    let mut unanswered: VecDeque<Instant> = VecDeque::new();
    let mut tick = tokio::time::interval(shape.chunk);
    // A late tick delays the rest rather than bursting to catch up, as a
    // microphone's frames come.
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    while rec.appends_sent < appends {
        // Ticks first: the speaker's pace does not wait for the reader.
        let step = tokio::select! {
            biased;
            _ = tick.tick() => Step::Tick,
            r = session::next_text(ws, Instant::now() + shape.timeout, Phase::Turn) => Step::Frame(r),
        };
        match step {
            Step::Tick => {
                ws.send(Message::Text(append.clone()))
                    .await
                    .map_err(|_| SessionError::Send)?;
                unanswered.push_back(Instant::now());
                rec.appends_sent += 1;
            }
            Step::Frame(text) => on_frame(&text?, &mut unanswered, rec)?,
        }
    }
    // The translation of the last appends.
    let deadline = Instant::now() + shape.timeout;
    while !unanswered.is_empty() {
        let text = session::next_text(ws, deadline, Phase::Turn).await?;
        on_frame(&text, &mut unanswered, rec)?;
    }
    Ok(())
}

/// Counts and times an output audio delta; an `error` event fails the
/// session; anything else (transcript deltas) is read past.
fn on_frame(
    text: &str,
    unanswered: &mut VecDeque<Instant>,
    rec: &mut CallRecord,
) -> Result<(), SessionError> {
    // Read the clock first: the frame has arrived.
    let now = Instant::now();
    let kind = event_type(text);
    match kind.as_deref().unwrap_or("") {
        OUTPUT_AUDIO_DELTA => {
            rec.audio_deltas += 1;
            if let Some(sent) = unanswered.pop_front() {
                let ns = now.saturating_duration_since(sent).as_nanos();
                rec.round_trip_ns
                    .push(u64::try_from(ns).unwrap_or(u64::MAX));
            }
            Ok(())
        }
        "error" => Err(SessionError::ErrorEvent {
            phase: Phase::Turn,
            code: error_code(text),
        }),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::calls::chunk_bytes;

    #[test]
    fn a_hundred_ms_chunk_is_4800_bytes_and_6400_base64_characters() {
        let s = CallShape::new(
            Duration::from_secs(60),
            Duration::from_secs(3),
            Duration::from_secs(1),
            Duration::from_millis(100),
            24_000,
            Duration::from_secs(30),
        );
        assert_eq!(chunk_bytes(24_000, s.chunk), 4_800);
        assert_eq!(s.audio_b64.len(), 6_400);
        assert_eq!(s.chunks_per_length(), 600, "a minute of 100 ms chunks");
    }

    #[test]
    fn an_append_is_type_then_audio_and_nothing_else() {
        let e = append_event("AAAA");
        assert_eq!(
            e,
            r#"{"type":"session.input_audio_buffer.append","audio":"AAAA"}"#
        );
        let v: serde_json::Value = serde_json::from_str(&e).unwrap();
        assert_eq!(v["audio"], "AAAA");
    }

    #[test]
    fn each_output_delta_answers_the_oldest_unanswered_append() {
        let mut rec = CallRecord::default();
        let t = Instant::now();
        let mut unanswered = VecDeque::from([t, t]);
        let delta = r#"{"type":"session.output_audio.delta","event_id":"e","delta":"AAAA"}"#;
        let transcript = r#"{"type":"session.output_transcript.delta","delta":"hola "}"#;
        for f in [delta, transcript, delta, delta] {
            on_frame(f, &mut unanswered, &mut rec).unwrap();
        }
        assert_eq!(rec.audio_deltas, 3);
        assert_eq!(
            rec.round_trip_ns.len(),
            2,
            "a delta beyond the appends is not timed"
        );
        assert!(unanswered.is_empty());
        let e = r#"{"type":"error","error":{"code":"insufficient_quota"}}"#;
        assert_eq!(
            on_frame(e, &mut unanswered, &mut rec),
            Err(SessionError::ErrorEvent {
                phase: Phase::Turn,
                code: "insufficient_quota".into()
            })
        );
    }
}
