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
//! On a WebRTC translation call's sideband
//! (`/v1/realtime/translations?call_id=`, [`crate::calls_api`]) the same
//! session runs with the call's model, but its audio is the call's media
//! tracks, not events: the sideband carries no `session.output_audio.delta`
//! (that event, `realtime_translation_output_audio_delta_event.py`, is the
//! WebSocket transport's audio). The simulated speaker talks on: every
//! `caller_turn_interval` a `session.output_transcript.delta`
//! (`realtime_translation_output_transcript_delta_event.py`: `delta`,
//! `elapsed_ms`), preceded by a `session.input_transcript.delta` when input
//! transcription is on. A hangup ends the session: `session.closed`
//! (`realtime_translation_session_closed_event.py`), then a close 1000; a
//! `session.close` on the sideband ends the call.
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
use tokio_util::sync::CancellationToken;

use crate::config::SimConfig;
use crate::handle::SimHandle;
use crate::wire::{short_id, SimIo};

/// Bytes per second of the only input format a WebSocket translation
/// session takes: 24 kHz PCM16 mono.
pub const TRANSLATION_BYTES_PER_SEC: u64 = 48_000;
/// The output language of a new session.
const DEFAULT_LANGUAGE: &str = "es";
/// The model of a translation call created without a session (its client
/// secret's, which the simulator does not know).
pub const TRANSLATION_MODEL: &str = "gpt-realtime-translate";

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
    /// Set on a translation call's sideband: the call id and its end.
    pub(crate) call: Option<(String, CancellationToken)>,
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
            call: None,
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
        let on_call = self.call.is_some();
        let ended = (self.call.as_ref()).map_or_else(CancellationToken::new, |(_, e)| e.clone());
        let started = tokio::time::Instant::now();
        let mut next_turn = started + self.config.caller_turn_interval;
        loop {
            let msg = tokio::select! {
                msg = ws.next() => msg,
                _ = ended.cancelled(), if on_call => {
                    let _ = self.send(&mut ws, "session.closed", json!({})).await;
                    let _ = ws.close(None).await;
                    return;
                }
                _ = tokio::time::sleep_until(next_turn), if on_call => {
                    next_turn = tokio::time::Instant::now() + self.config.caller_turn_interval;
                    let elapsed_ms = started.elapsed().as_millis() as u64 / 200 * 200;
                    if !self.caller_speaks(&mut ws, elapsed_ms).await {
                        return;
                    }
                    continue;
                }
            };
            let Some(msg) = msg else { return };
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
                    if let Some((id, _)) = &self.call {
                        self.handle.stats.calls.end(id);
                    }
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

    /// The call's speaker said something: its transcript deltas (the audio
    /// is on the call's media tracks).
    async fn caller_speaks(&mut self, ws: &mut WebSocketStream<SimIo>, elapsed_ms: u64) -> bool {
        if !self.input_transcription.is_null()
            && !self
                .send(
                    ws,
                    "session.input_transcript.delta",
                    json!({"delta": "hello ", "elapsed_ms": elapsed_ms}),
                )
                .await
        {
            return false;
        }
        self.send(
            ws,
            "session.output_transcript.delta",
            json!({"delta": "hola ", "elapsed_ms": elapsed_ms}),
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
    use crate::testing::{next_json, Client};
    use futures_util::SinkExt;
    use std::time::Duration;
    use tokio::net::TcpStream;
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;

    /// A POST to the simulator's calls API; the status and the `Location`.
    async fn post(addr: std::net::SocketAddr, path: &str, ct: &str, body: &str) -> (u16, String) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut s = TcpStream::connect(addr).await.unwrap();
        let req = format!(
            "POST {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nAuthorization: Bearer sk-any\r\n\
             Content-Type: {ct}\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        s.write_all(req.as_bytes()).await.unwrap();
        let mut answer = String::new();
        s.read_to_string(&mut answer).await.unwrap();
        let status = answer[9..12].parse().unwrap();
        let location = answer
            .lines()
            .find_map(|l| l.strip_prefix("location: "))
            .unwrap_or("")
            .to_string();
        (status, location)
    }

    async fn sideband(addr: std::net::SocketAddr, path: &str) -> Result<Client, u16> {
        let mut request = format!("ws://{addr}{path}").into_client_request().unwrap();
        request
            .headers_mut()
            .insert("authorization", "Bearer sk-any".parse().unwrap());
        let tcp = TcpStream::connect(addr).await.unwrap();
        match tokio_tungstenite::client_async(request, tcp).await {
            Ok((ws, _)) => Ok(ws),
            Err(tokio_tungstenite::tungstenite::Error::Http(r)) => Err(r.status().as_u16()),
            Err(e) => panic!("{e}"),
        }
    }

    #[tokio::test]
    async fn a_translation_call_has_a_translation_sideband_without_audio_until_its_hangup() {
        let config = SimConfig {
            caller_turn_interval: Duration::from_millis(20),
            ..SimConfig::default()
        };
        let sim = start("127.0.0.1:0".parse().unwrap(), config).await.unwrap();
        const SDP: &str = "v=0\r\nm=audio 9 UDP/TLS/RTP/SAVPF 111\r\na=mid:0\r\n";
        let calls = "/v1/realtime/translations/calls";
        // The translation create request has `model` and `audio`, no `type`.
        let form = |session: Value| {
            format!(
                "--b\r\nContent-Disposition: form-data; name=\"sdp\"\r\n\r\n{SDP}\r\n\
                 --b\r\nContent-Disposition: form-data; name=\"session\"\r\n\r\n{session}\r\n--b--\r\n"
            )
        };
        let ct = "multipart/form-data; boundary=b";
        let typed = form(json!({"type": "realtime", "model": "m"}));
        assert_eq!(post(sim.addr, calls, ct, &typed).await.0, 400);
        let session = form(json!({"model": "gpt-realtime-translate"}));
        let (status, location) = post(sim.addr, calls, ct, &session).await;
        assert_eq!(status, 201);
        let id = location
            .strip_prefix("/v1/realtime/translations/calls/")
            .unwrap();

        // Its sideband is a translation session, at the translation path only.
        let realtime = format!("/v1/realtime?call_id={id}");
        assert_eq!(sideband(sim.addr, &realtime).await.err(), Some(404));
        let path = format!("/v1/realtime/translations?call_id={id}");
        let mut ws = sideband(sim.addr, &path).await.unwrap();
        let created = next_json(&mut ws).await.unwrap();
        assert_eq!(created["type"], "session.created");
        assert_eq!(created["session"]["model"], "gpt-realtime-translate");
        let said = next_json(&mut ws).await.unwrap();
        assert_eq!(said["type"], "session.output_transcript.delta");

        // Only a hangup, at the translation path; then the session closes.
        let wrong = format!("/v1/realtime/calls/{id}/hangup");
        assert_eq!(post(sim.addr, &wrong, "application/json", "").await.0, 404);
        let refer = format!("{calls}/{id}/refer");
        assert_eq!(
            post(sim.addr, &refer, "application/json", "{}").await.0,
            404
        );
        let hangup = format!("{calls}/{id}/hangup");
        assert_eq!(post(sim.addr, &hangup, "application/json", "").await.0, 200);
        let mut kinds = Vec::new();
        while let Some(e) = next_json(&mut ws).await {
            kinds.push(e["type"].as_str().unwrap().to_string());
        }
        assert_eq!(kinds.last().map(String::as_str), Some("session.closed"));
        assert!(
            kinds.iter().all(|k| k != "session.output_audio.delta"),
            "{kinds:?}"
        );
        let billed = sim.stats.calls.connected_secs(id).unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(sim.stats.calls.connected_secs(id), Some(billed), "ended");
        assert!(billed > 0.0);
    }

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
