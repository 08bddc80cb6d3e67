//! A simulated Realtime translation session (`GET
//! /v1/realtime/translations?model=…`), as the official SDK's types
//! describe it (openai-python `resources/realtime/translations/` and
//! `types/realtime/realtime_translation_*`):
//! - first `session.created` with the session
//!   (`realtime_translation_session.py`: `id`, `model`, `expires_at`,
//!   `audio.input.{transcription,noise_reduction}`, `audio.output.language`);
//! - `session.input_audio_buffer.append` (base64 24 kHz PCM16 mono,
//!   `realtime_translation_input_audio_buffer_append_event.py`) is answered
//!   with translated audio of the same length (`session.output_audio.delta`
//!   with `format: "pcm16"`, `sample_rate: 24000`, `channels: 1`,
//!   `elapsed_ms`) and a `session.output_transcript.delta`; with input
//!   transcription on, also a `session.input_transcript.delta`;
//! - `session.update` (`realtime_translation_session_update_request.py`:
//!   only `audio`; `model` "cannot be changed with `session.update`") is
//!   answered `session.updated`, an unknown field or a model with an
//!   `error`;
//! - `session.close` is answered `session.closed`, then a close 1000.
//!
//! No event carries usage: OpenAI bills translation by the minute of audio.
//! What the simulated upstream would bill is counted in
//! [`crate::SimStats::translation_input_bytes`] (decoded audio received) and
//! `translation_output_bytes` (audio sent), so tests compare the gateway's
//! measured seconds with it.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use base64::Engine;
use futures_util::StreamExt;
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::WebSocketStream;

use crate::config::SimConfig;
use crate::handle::SimHandle;
use crate::wire::{short_id, SimIo};

/// Bytes per second of the only input format a WebSocket translation
/// session takes: 24 kHz PCM16 mono.
pub const TRANSLATION_BYTES_PER_SEC: u64 = 48_000;
/// The output language of a new session.
const DEFAULT_LANGUAGE: &str = "es";

/// One translation session.
pub(crate) struct Translation {
    config: Arc<SimConfig>,
    handle: SimHandle,
    id: String,
    model: String,
    seq: u64,
    language: String,
    input_transcription: Value,
    noise_reduction: Value,
    /// Decoded input bytes so far (for `elapsed_ms`).
    input_bytes: u64,
}

impl Translation {
    pub(crate) fn new(config: Arc<SimConfig>, handle: SimHandle, model: String) -> Self {
        Self {
            config,
            handle,
            id: format!("sess_{}", short_id()),
            model,
            seq: 0,
            language: DEFAULT_LANGUAGE.into(),
            input_transcription: Value::Null,
            noise_reduction: Value::Null,
            input_bytes: 0,
        }
    }

    fn session_object(&self) -> Value {
        let expires_at = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs())
            + 3600;
        json!({
            "id": self.id,
            "model": self.model,
            "expires_at": expires_at,
            "audio": {
                "input": {"transcription": self.input_transcription, "noise_reduction": self.noise_reduction},
                "output": {"language": self.language},
            },
        })
    }

    async fn send(&mut self, ws: &mut WebSocketStream<SimIo>, kind: &str, rest: Value) -> bool {
        self.seq += 1;
        self.handle
            .send_event(ws, self.config.record, (&self.id, self.seq), kind, &rest)
            .await
    }

    async fn error(
        &mut self,
        ws: &mut WebSocketStream<SimIo>,
        code: &str,
        param: &str,
        message: &str,
        event_id: Option<&str>,
    ) -> bool {
        let error = json!({"error": {"type": "invalid_request_error", "code": code,
            "message": message, "param": param, "event_id": event_id}});
        self.send(ws, "error", error).await
    }

    pub(crate) async fn run(&mut self, mut ws: WebSocketStream<SimIo>) {
        let session = self.session_object();
        if !self
            .send(&mut ws, "session.created", json!({"session": session}))
            .await
        {
            return;
        }
        while let Some(msg) = ws.next().await {
            let text = match msg {
                Ok(Message::Text(t)) => t.to_string(),
                Ok(Message::Close(frame)) => {
                    if let (Some(f), Ok(mut codes)) = (frame, self.handle.stats.close_codes.lock())
                    {
                        codes.push(u16::from(f.code));
                    }
                    let _ = ws.close(None).await;
                    return;
                }
                Ok(_) => continue,
                Err(_) => return,
            };
            if self.config.record {
                if let Ok(mut received) = self.handle.stats.received.lock() {
                    received.push(text.clone());
                }
            }
            let Ok(event) = serde_json::from_str::<Value>(&text) else {
                if !self
                    .error(
                        &mut ws,
                        "invalid_json",
                        "",
                        "The event could not be parsed.",
                        None,
                    )
                    .await
                {
                    return;
                }
                continue;
            };
            let event_id = event
                .get("event_id")
                .and_then(Value::as_str)
                .map(String::from);
            let go_on = match event.get("type").and_then(Value::as_str) {
                Some("session.input_audio_buffer.append") => {
                    self.append(&mut ws, &event, event_id.as_deref()).await
                }
                Some("session.update") => self.update(&mut ws, &event, event_id.as_deref()).await,
                Some("session.close") => {
                    let _ = self.send(&mut ws, "session.closed", json!({})).await;
                    let _ = ws.close(None).await;
                    return;
                }
                _ => {
                    self.error(
                        &mut ws,
                        "invalid_event",
                        "type",
                        "Unknown event type for a translation session.",
                        event_id.as_deref(),
                    )
                    .await
                }
            };
            if !go_on {
                return;
            }
        }
    }

    async fn append(
        &mut self,
        ws: &mut WebSocketStream<SimIo>,
        event: &Value,
        event_id: Option<&str>,
    ) -> bool {
        let audio = event.get("audio").and_then(Value::as_str).unwrap_or("");
        let Ok(bytes) = base64::engine::general_purpose::STANDARD.decode(audio) else {
            return self
                .error(
                    ws,
                    "invalid_value",
                    "audio",
                    "Invalid base64 audio.",
                    event_id,
                )
                .await;
        };
        let n = bytes.len() as u64;
        self.handle
            .stats
            .translation_input_bytes
            .fetch_add(n, Ordering::Relaxed);
        self.input_bytes += n;
        if n == 0 {
            return true;
        }
        let elapsed_ms = self.input_bytes * 1000 / TRANSLATION_BYTES_PER_SEC;
        if !self.input_transcription.is_null()
            && !self
                .send(
                    ws,
                    "session.input_transcript.delta",
                    json!({"delta": "hello "}),
                )
                .await
        {
            return false;
        }
        // Translated audio of the input's length: the simulated model keeps
        // pace with the speaker.
        let delta = base64::engine::general_purpose::STANDARD.encode(vec![0u8; bytes.len()]);
        let out = json!({"delta": delta, "format": "pcm16", "sample_rate": 24000, "channels": 1,
                         "elapsed_ms": elapsed_ms});
        if !self.send(ws, "session.output_audio.delta", out).await {
            return false;
        }
        self.handle
            .stats
            .translation_output_bytes
            .fetch_add(n, Ordering::Relaxed);
        self.send(
            ws,
            "session.output_transcript.delta",
            json!({"delta": "hola "}),
        )
        .await
    }

    async fn update(
        &mut self,
        ws: &mut WebSocketStream<SimIo>,
        event: &Value,
        event_id: Option<&str>,
    ) -> bool {
        let session = event.get("session").cloned().unwrap_or(Value::Null);
        if let Some(unknown) = session
            .as_object()
            .and_then(|s| s.keys().find(|k| k.as_str() != "audio"))
        {
            let param = format!("session.{unknown}");
            let message = if unknown == "model" {
                "The model of a translation session cannot be changed with session.update."
                    .to_string()
            } else {
                format!("Unknown parameter: '{param}'.")
            };
            return self
                .error(ws, "unknown_parameter", &param, &message, event_id)
                .await;
        }
        let audio = session.get("audio");
        if let Some(l) = audio
            .and_then(|a| a.pointer("/output/language"))
            .and_then(Value::as_str)
        {
            self.language = l.to_string();
        }
        if let Some(t) = audio.and_then(|a| a.pointer("/input/transcription")) {
            self.input_transcription = t.clone();
        }
        if let Some(n) = audio.and_then(|a| a.pointer("/input/noise_reduction")) {
            self.noise_reduction = n.clone();
        }
        let session = self.session_object();
        self.send(ws, "session.updated", json!({"session": session}))
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::start;
    use crate::testing::next_json;
    use futures_util::SinkExt;

    #[tokio::test]
    async fn a_translation_session_answers_audio_with_audio_of_its_length_and_counts_what_it_bills()
    {
        let sim = start("127.0.0.1:0".parse().unwrap(), SimConfig::default())
            .await
            .unwrap();
        let mut ws = crate::testing::connect(
            &sim,
            "/v1/realtime/translations?model=gpt-realtime-translate",
        )
        .await;
        let created = next_json(&mut ws).await.unwrap();
        assert_eq!(created["type"], "session.created");
        assert_eq!(created["session"]["model"], "gpt-realtime-translate");
        assert_eq!(created["session"]["audio"]["output"]["language"], "es");

        // 200 ms of audio in, 200 ms of audio out.
        let chunk = base64::engine::general_purpose::STANDARD.encode(vec![1u8; 9600]);
        ws.send(Message::text(
            json!({"type": "session.input_audio_buffer.append", "audio": chunk}).to_string(),
        ))
        .await
        .unwrap();
        let delta = next_json(&mut ws).await.unwrap();
        assert_eq!(delta["type"], "session.output_audio.delta");
        let out = base64::engine::general_purpose::STANDARD
            .decode(delta["delta"].as_str().unwrap())
            .unwrap();
        assert_eq!((out.len(), delta["elapsed_ms"].as_u64()), (9600, Some(200)));
        assert_eq!(
            next_json(&mut ws).await.unwrap()["type"],
            "session.output_transcript.delta"
        );
        assert_eq!(
            sim.stats.translation_input_bytes.load(Ordering::Relaxed),
            9600
        );
        assert_eq!(
            sim.stats.translation_output_bytes.load(Ordering::Relaxed),
            9600
        );

        // The model cannot be changed; the language can.
        ws.send(Message::text(
            json!({"type": "session.update", "event_id": "e1", "session": {"model": "x"}})
                .to_string(),
        ))
        .await
        .unwrap();
        let e = next_json(&mut ws).await.unwrap();
        assert_eq!(
            (&e["type"], &e["error"]["param"]),
            (&json!("error"), &json!("session.model"))
        );
        ws.send(Message::text(
            json!({"type": "session.update", "session": {"audio": {"output": {"language": "fr"}}}})
                .to_string(),
        ))
        .await
        .unwrap();
        let updated = next_json(&mut ws).await.unwrap();
        assert_eq!(updated["session"]["audio"]["output"]["language"], "fr");

        ws.send(Message::text(json!({"type": "session.close"}).to_string()))
            .await
            .unwrap();
        assert_eq!(next_json(&mut ws).await.unwrap()["type"], "session.closed");
        assert!(next_json(&mut ws).await.is_none(), "then the close");
    }
}
