//! One simulated Realtime session (a WebSocket session or a call's
//! sideband): the client events it answers and the responses it streams,
//! with GA or beta event names. Event shapes follow openai-python's
//! `types/realtime/*.py` (each cited beside the code that builds it).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use futures_util::{FutureExt, SinkExt, StreamExt};
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::{Bytes, Message};
use tokio_tungstenite::WebSocketStream;
use tokio_util::sync::CancellationToken;

use crate::config::{SimConfig, SimFault, AUDIO_TOKENS_PER_DELTA, TEXT_OUTPUT_TOKENS};
use crate::handle::{Command, SimHandle};
use crate::stamp;
use crate::wire::{event_text, event_type, mask_key, short_id, SimIo};

mod response;

/// The `usage` of a `response.done` ([`SimFault::UsageMax`]): every count
/// of openai-python's `types/realtime/realtime_response_usage.py` (and its
/// `input_token_details`/`output_token_details`, cached details included)
/// at 2^64-1.
pub fn usage_max() -> Value {
    let max = u64::MAX;
    json!({
        "total_tokens": max,
        "input_tokens": max,
        "output_tokens": max,
        "input_token_details": {
            "text_tokens": max,
            "audio_tokens": max,
            "image_tokens": max,
            "cached_tokens": max,
            "cached_tokens_details": {"text_tokens": max, "audio_tokens": max, "image_tokens": max}
        },
        "output_token_details": {"text_tokens": max, "audio_tokens": max}
    })
}

/// Deterministic usage of the `n`-th response (1-based) of a session.
pub fn usage_for(n: u64, audio_deltas: usize) -> Value {
    let text_in = 20 + 5 * n;
    let audio_in = 100;
    let cached = if n > 1 { 64 } else { 0 };
    let text_out = TEXT_OUTPUT_TOKENS;
    let audio_out = AUDIO_TOKENS_PER_DELTA * audio_deltas as u64;
    let input = text_in + audio_in;
    let output = text_out + audio_out;
    json!({
        "total_tokens": input + output,
        "input_tokens": input,
        "output_tokens": output,
        "input_token_details": {
            "text_tokens": text_in,
            "audio_tokens": audio_in,
            "image_tokens": 0,
            "cached_tokens": cached,
            "cached_tokens_details": {"text_tokens": 0, "audio_tokens": cached, "image_tokens": 0}
        },
        "output_token_details": {"text_tokens": text_out, "audio_tokens": audio_out}
    })
}

pub(crate) struct Session {
    config: Arc<SimConfig>,
    handle: SimHandle,
    beta: bool,
    /// Opened with `?intent=transcription`.
    pub(crate) transcription: bool,
    id: String,
    seq: u64,
    responses: u64,
    items: u64,
    /// The session's instructions (`session.update` changes them).
    instructions: String,
    /// Input audio transcription (`audio.input.transcription` in GA,
    /// `input_audio_transcription` in beta): null (off) in a realtime
    /// session until a `session.update` sets it; a transcription session
    /// starts with [`TRANSCRIPTION_MODEL`]. A commit is transcribed only
    /// while it is set, as OpenAI's sessions do.
    pub(crate) input_transcription: Value,
    /// Events that arrived while a response was in flight, to handle next.
    deferred: std::collections::VecDeque<String>,
    /// Set on a call's sideband: the call id and its end.
    pub(crate) call: Option<(String, CancellationToken)>,
    /// Transit times (ns) of the stamped appends since the last commit
    /// ([`SimConfig::stamp_frames`]).
    append_transits: Vec<u64>,
    /// The session's tools (`session.update`'s `tools`), as given.
    tools: Vec<Value>,
    /// The session's `output_modalities` (`["audio"]` until updated).
    output_modalities: Vec<String>,
    /// The text of the last conversation item, when it is a user message
    /// (the tool rule of the `response` module).
    last_user_text: Option<String>,
    /// Appended audio since the last commit: server VAD said
    /// `input_audio_buffer.speech_started`.
    speaking: bool,
}

type Ws = WebSocketStream<SimIo>;

enum Flow {
    Continue,
    Stop,
}

/// What interrupted a response in flight.
enum Interrupt {
    Cancel,
    /// Closed by the client (answered) or the connection is gone.
    Ended,
}

impl Session {
    pub(crate) fn new(config: Arc<SimConfig>, handle: SimHandle, beta: bool) -> Self {
        Self {
            config,
            handle,
            beta,
            transcription: false,
            id: format!("sess_{}", short_id()),
            seq: 0,
            responses: 0,
            items: 0,
            instructions: "You are a helpful assistant.".into(),
            input_transcription: Value::Null,
            deferred: std::collections::VecDeque::new(),
            call: None,
            append_transits: Vec::new(),
            tools: Vec::new(),
            output_modalities: vec!["audio".into()],
            last_user_text: None,
            speaking: false,
        }
    }

    /// Records a client's close code and answers the close.
    async fn closed_by_client(&self, ws: &mut Ws, frame: Option<CloseFrame>) {
        if let (Some(f), Ok(mut codes)) = (frame, self.handle.stats.close_codes.lock()) {
            codes.push(u16::from(f.code));
        }
        let _ = ws.close(None).await;
    }

    /// Waits `wait` (zero: only what is readable now) while reading the
    /// client, as a response in flight does: a close or a lost connection
    /// ends the response, `response.cancel` cancels it, other events are
    /// kept for after it.
    async fn watch(&mut self, ws: &mut Ws, wait: Duration, response_id: &str) -> Option<Interrupt> {
        if matches!(self.config.fault, Some(SimFault::FinishResponseBeforeClose)) {
            if !wait.is_zero() {
                tokio::time::sleep(wait).await;
            }
            return None;
        }
        let until = tokio::time::Instant::now() + wait;
        loop {
            let msg = if wait.is_zero() {
                match ws.next().now_or_never() {
                    Some(m) => m,
                    None => return None,
                }
            } else {
                match tokio::time::timeout_at(until, ws.next()).await {
                    Ok(m) => m,
                    Err(_) => return None,
                }
            };
            match msg {
                Some(Ok(Message::Text(text))) => {
                    self.record_received(&text);
                    if event_type(&text).as_deref() == Some("response.cancel") {
                        let target = cancel_target(&text);
                        if let Ok(mut seen) = self.handle.stats.cancels.lock() {
                            seen.push(target.clone());
                        }
                        // A cancel naming another response cancels nothing.
                        match target {
                            Some(id) if id != response_id => {
                                if !self.send(ws, cancel_not_active()).await {
                                    return Some(Interrupt::Ended);
                                }
                                continue;
                            }
                            _ => return Some(Interrupt::Cancel),
                        }
                    }
                    self.deferred.push_back(text.to_string());
                }
                Some(Ok(Message::Close(frame))) => {
                    self.closed_by_client(ws, frame).await;
                    return Some(Interrupt::Ended);
                }
                Some(Ok(Message::Pong(_))) => {
                    self.handle.stats.pongs.fetch_add(1, Ordering::Relaxed);
                }
                Some(Ok(_)) => {}
                Some(Err(_)) | None => return Some(Interrupt::Ended),
            }
        }
    }

    fn record_received(&mut self, text: &str) {
        if self.config.stamp_frames {
            self.note_transit(text);
        }
        if self.config.record {
            if let Ok(mut received) = self.handle.stats.received.lock() {
                received.push(text.to_string());
            }
        }
    }

    /// Keeps the transit time of a stamped `input_audio_buffer.append`,
    /// read as it is received (before it waits behind a response).
    fn note_transit(&mut self, text: &str) {
        let Some(sent) = stamp::stamp_of(text) else {
            return;
        };
        let head = &text[..text.len().min(64)];
        if head.contains("\"input_audio_buffer.append\"")
            && self.append_transits.len() < stamp::MAX_TRANSITS_PER_COMMIT
        {
            self.append_transits
                .push(stamp::now_ns().saturating_sub(sent));
        }
    }

    /// Applies a `session.update`, or gives the error's code, the invalid
    /// field and the message.
    fn update_session(&mut self, text: &str) -> Result<(), (&'static str, &'static str, String)> {
        let v: Value = serde_json::from_str(text).map_err(|_| {
            (
                "invalid_json",
                "",
                "The event could not be parsed.".to_string(),
            )
        })?;
        let Some(session) = v.get("session").and_then(Value::as_object) else {
            return Err((
                "missing_required_parameter",
                "session",
                "Missing required parameter: 'session'.".to_string(),
            ));
        };
        if !self.beta {
            // GA requires the session's type, and it cannot change.
            let own = if self.transcription {
                "transcription"
            } else {
                "realtime"
            };
            match session.get("type") {
                None => {
                    return Err((
                        "missing_required_parameter",
                        "session.type",
                        "Missing required parameter: 'session.type'.".to_string(),
                    ))
                }
                Some(Value::String(t)) if t == own => {}
                Some(other) => {
                    return Err((
                        "invalid_value",
                        "session.type",
                        format!("Invalid value: {other}. Supported values are: '{own}'."),
                    ))
                }
            }
        }
        let transcription = if self.beta {
            session.get("input_audio_transcription")
        } else {
            session
                .get("audio")
                .and_then(|a| a.get("input"))
                .and_then(|i| i.get("transcription"))
        };
        match transcription {
            None => {}
            Some(t @ Value::Null) => self.input_transcription = t.clone(),
            Some(t) if t.get("model").is_some_and(Value::is_string) => {
                self.input_transcription = t.clone()
            }
            Some(_) => {
                return Err((
                    "invalid_value",
                    if self.beta {
                        "session.input_audio_transcription.model"
                    } else {
                        "session.audio.input.transcription.model"
                    },
                    "Invalid value: a transcription needs a model.".to_string(),
                ))
            }
        }
        match session.get("tools") {
            None => {}
            Some(Value::Array(tools)) => self.tools = tools.clone(),
            Some(_) => {
                return Err((
                    "invalid_type",
                    "session.tools",
                    "Invalid type for 'session.tools': expected an array.".to_string(),
                ))
            }
        }
        if let Some(m) = session.get("output_modalities").and_then(Value::as_array) {
            self.output_modalities = m
                .iter()
                .filter_map(Value::as_str)
                .map(String::from)
                .collect();
        }
        match session.get("instructions") {
            None => {}
            Some(Value::String(i)) => self.instructions = i.clone(),
            Some(_) => {
                return Err((
                    "invalid_type",
                    "session.instructions",
                    "Invalid type for 'session.instructions': expected a string.".to_string(),
                ))
            }
        }
        Ok(())
    }

    fn event_id(&mut self) -> String {
        self.seq += 1;
        format!("event_{}_{}", &self.id[5..13], self.seq)
    }

    async fn send(&mut self, ws: &mut Ws, mut event: Value) -> bool {
        // OpenAI writes `type` first, then `event_id`; serde_json's map is
        // sorted, so put those two in front by hand.
        let kind = match event.as_object_mut().and_then(|o| o.remove("type")) {
            Some(Value::String(k)) => k,
            _ => String::new(),
        };
        let rest = event.to_string();
        let mut id = self.event_id();
        // The stamp is read last, after serialising, just before the write.
        if self.config.stamp_frames
            && (kind == "response.output_audio.delta" || kind == "response.audio.delta")
        {
            id = stamp::stamped_id(&id, stamp::now_ns());
        }
        let text = event_text(&kind, &id, &rest);
        if self.config.record {
            if let Ok(mut sent) = self.handle.stats.sent.lock() {
                sent.push(text.clone());
            }
        }
        ws.send(Message::text(text)).await.is_ok()
    }

    pub(crate) async fn run(&mut self, mut ws: Ws) {
        let mut commands = self.handle.commands.subscribe();
        if !self.config.session_delay.is_zero() {
            tokio::time::sleep(self.config.session_delay).await;
        }
        let first_error = match self.config.fault {
            Some(SimFault::ErrorFirst) => {
                Some(("simulated_error", "simulated first-event error".to_string()))
            }
            Some(SimFault::KeyErrorFirst) => {
                let key = self
                    .handle
                    .stats
                    .auth_headers
                    .lock()
                    .ok()
                    .and_then(|k| k.last().cloned())
                    .unwrap_or_default();
                Some(("invalid_api_key", format!(
                    "Incorrect API key provided: {}. You can find your API key at https://platform.openai.com/account/api-keys.",
                    mask_key(&key)
                )))
            }
            _ => None,
        };
        if let Some((code, message)) = first_error {
            let error = json!({"type": "error", "error": {"type": "invalid_request_error",
                "code": code, "message": message, "param": null, "event_id": null}});
            self.send(&mut ws, error).await;
            let _ = ws.close(None).await;
            return;
        }
        let created = match (self.transcription, self.beta) {
            (true, true) => json!({"type": "transcription_session.created",
                                   "session": self.transcription_session_object()}),
            (true, false) => {
                let mut session = self.session_object();
                session["type"] = Value::from("transcription");
                json!({"type": "session.created", "session": session})
            }
            (false, _) => json!({"type": "session.created", "session": self.session_object()}),
        };
        if !self.send(&mut ws, created).await {
            return;
        }
        let call_ended = self
            .call
            .as_ref()
            .map(|(_, t)| t.clone())
            .unwrap_or_default();
        let mut next_turn = tokio::time::Instant::now() + self.config.caller_turn_interval;
        loop {
            if let Some(text) = self.deferred.pop_front() {
                if let Flow::Stop = self.on_event(&mut ws, &text).await {
                    return;
                }
                continue;
            }
            tokio::select! {
                cmd = commands.recv() => match cmd {
                    Ok(Command::Ping) => { let _ = ws.send(Message::Ping(Bytes::from_static(b"sim"))).await; }
                    Ok(Command::Close(code)) => { close(&mut ws, code, "simulator closed the session").await; return; }
                    Ok(Command::Drop) => return,
                    Err(_) => {}
                },
                _ = call_ended.cancelled(), if self.call.is_some() => {
                    close(&mut ws, 1000, "call ended").await;
                    return;
                }
                _ = tokio::time::sleep_until(next_turn), if self.call.is_some() && self.config.caller_turns > 0 => {
                    next_turn = tokio::time::Instant::now() + self.config.caller_turn_interval;
                    let id = self.call.as_ref().map(|(id, _)| id.clone()).unwrap_or_default();
                    if self.handle.stats.calls.take_turn(&id, self.config.caller_turns) {
                        if let Flow::Stop = self.respond(&mut ws, None).await { return; }
                    }
                }
                msg = ws.next() => match msg {
                    Some(Ok(Message::Text(text))) => {
                        self.record_received(&text);
                        if let Flow::Stop = self.on_event(&mut ws, &text).await { return; }
                    }
                    Some(Ok(Message::Close(frame))) => {
                        self.closed_by_client(&mut ws, frame).await;
                        return;
                    }
                    Some(Ok(Message::Pong(_))) => {
                        self.handle.stats.pongs.fetch_add(1, Ordering::Relaxed);
                    }
                    Some(Ok(_)) => {}
                    Some(Err(_)) | None => return,
                },
            }
        }
    }

    fn session_object(&self) -> Value {
        json!({
            "type": "realtime",
            "object": "realtime.session",
            "id": self.id,
            "model": "gpt-realtime",
            "output_modalities": self.output_modalities,
            "instructions": self.instructions,
            "tools": self.tools,
            "tool_choice": "auto",
            "max_output_tokens": "inf",
            "tracing": null,
            "prompt": null,
            "expires_at": 0,
            "audio": {
                "input": {"format": {"type": "audio/pcm", "rate": 24000},
                          "transcription": self.input_transcription,
                          "noise_reduction": null,
                          "turn_detection": {"type": "server_vad", "threshold": 0.5,
                                              "prefix_padding_ms": 300, "silence_duration_ms": 200}},
                "output": {"format": {"type": "audio/pcm", "rate": 24000}, "voice": "alloy", "speed": 1.0}
            },
            "include": null
        })
    }

    /// The beta protocol's transcription session
    /// (`transcription_session.created`).
    fn transcription_session_object(&self) -> Value {
        json!({
            "id": self.id,
            "object": "realtime.transcription_session",
            "modalities": ["text"],
            "input_audio_format": "pcm16",
            "input_audio_transcription": self.input_transcription,
            "turn_detection": {"type": "server_vad", "threshold": 0.5,
                               "prefix_padding_ms": 300, "silence_duration_ms": 500},
            "input_audio_noise_reduction": null,
            "include": null
        })
    }

    /// The item a `conversation.item.create` adds, as the client gave it
    /// (`conversation_item_create_event.py`): its own `id` kept (else
    /// `item_N`), `object` and `status` filled in. A user message's text is
    /// kept for the tool rule of the `response` module.
    fn created_item(&mut self, text: &str) -> Value {
        let v: Value = serde_json::from_str(text).unwrap_or(Value::Null);
        let mut item = match v.get("item") {
            Some(Value::Object(i)) => i.clone(),
            _ => serde_json::Map::new(),
        };
        if !item.get("id").is_some_and(Value::is_string) {
            item.insert("id".into(), Value::from(format!("item_{}", self.items)));
        }
        item.entry("type").or_insert_with(|| Value::from("message"));
        item.insert("object".into(), Value::from("realtime.item"));
        item.insert("status".into(), Value::from("completed"));
        let user_text = (item.get("role").and_then(Value::as_str) == Some("user")).then(|| {
            item.get("content")
                .and_then(Value::as_array)
                .map(|parts| {
                    parts
                        .iter()
                        .filter_map(|p| p.get("text").and_then(Value::as_str))
                        .collect::<Vec<_>>()
                        .join(" ")
                })
                .unwrap_or_default()
        });
        self.last_user_text = user_text;
        Value::Object(item)
    }

    fn name<'a>(&self, ga: &'a str, beta: &'a str) -> &'a str {
        if self.beta {
            beta
        } else {
            ga
        }
    }

    async fn on_event(&mut self, ws: &mut Ws, text: &str) -> Flow {
        let kind = event_type(text);
        let ok = match kind.as_deref() {
            Some("session.update") => match self.update_session(text) {
                Ok(()) => {
                    let session = self.session_object();
                    self.send(ws, json!({"type": "session.updated", "session": session}))
                        .await
                }
                Err((code, param, message)) => {
                    let client_event_id = serde_json::from_str::<Value>(text)
                        .ok()
                        .and_then(|v| v.get("event_id").cloned())
                        .unwrap_or(Value::Null);
                    let error = json!({"type": "error", "error": {"type": "invalid_request_error",
                        "code": code, "message": message,
                        "param": if param.is_empty() { Value::Null } else { Value::String(param.into()) },
                        "event_id": client_event_id}});
                    self.send(ws, error).await
                }
            },
            Some("conversation.item.create") => {
                self.items += 1;
                let item = self.created_item(text);
                let added = self.name("conversation.item.added", "conversation.item.created");
                let ok = self
                    .send(
                        ws,
                        json!({"type": added, "previous_item_id": null, "item": item.clone()}),
                    )
                    .await;
                if ok && !self.beta {
                    self.send(ws, json!({"type": "conversation.item.done", "previous_item_id": null, "item": item}))
                        .await
                } else {
                    ok
                }
            }
            Some("input_audio_buffer.append") if !self.speaking => {
                // Server VAD hears speech in appended audio
                // (`input_audio_buffer_speech_started_event.py`).
                self.speaking = true;
                let item_id = format!("item_{}", self.items + 1);
                self.send(
                    ws,
                    json!({"type": "input_audio_buffer.speech_started",
                    "audio_start_ms": 0, "item_id": item_id}),
                )
                .await
            }
            Some("input_audio_buffer.commit") => {
                self.items += 1;
                let item_id = format!("item_{}", self.items);
                // `input_audio_buffer_speech_stopped_event.py`.
                if std::mem::take(&mut self.speaking)
                    && !self
                        .send(
                            ws,
                            json!({"type": "input_audio_buffer.speech_stopped",
                            "audio_end_ms": 0, "item_id": item_id}),
                        )
                        .await
                {
                    return Flow::Stop;
                }
                self.last_user_text = None;
                let item = json!({"id": item_id, "type": "message", "object": "realtime.item",
                    "status": "completed", "role": "user",
                    "content": [{"type": "input_audio", "transcript": null}]});
                let added = self.name("conversation.item.added", "conversation.item.created");
                let transcribed = !self.input_transcription.is_null();
                let mut committed = json!({"type": "input_audio_buffer.committed", "previous_item_id": null, "item_id": item_id});
                if self.config.stamp_frames {
                    committed[stamp::APPEND_TRANSITS_FIELD] =
                        Value::from(std::mem::take(&mut self.append_transits));
                }
                self.send(ws, committed)
                    .await
                    && self.send(ws, json!({"type": added, "previous_item_id": null, "item": item})).await
                    && (!transcribed || self
                        .send(ws, json!({
                            "type": "conversation.item.input_audio_transcription.completed",
                            "item_id": item_id, "content_index": 0, "transcript": "hello there",
                            // SDK: conversation_item_input_audio_transcription_completed_event.py
                            // (`usage`: the tokens or the duration variant, as configured).
                            "usage": self.config.transcription_usage.json()
                        }))
                        .await)
            }
            Some("response.create") => return self.respond(ws, Some(text)).await,
            Some("response.cancel") => {
                if let Ok(mut seen) = self.handle.stats.cancels.lock() {
                    seen.push(cancel_target(text));
                }
                self.send(ws, cancel_not_active()).await
            }
            Some(_) => true,
            None => {
                let error = json!({"type": "error", "error": {"type": "invalid_request_error",
                    "code": "invalid_json", "message": "The event could not be parsed.",
                    "param": null, "event_id": null}});
                self.send(ws, error).await
            }
        };
        if ok {
            Flow::Continue
        } else {
            Flow::Stop
        }
    }
}

/// The `response_id` a `response.cancel` names, if any.
fn cancel_target(text: &str) -> Option<String> {
    serde_json::from_str::<Value>(text)
        .ok()?
        .get("response_id")?
        .as_str()
        .map(str::to_string)
}

/// OpenAI's answer to a cancel when no such response is in progress.
fn cancel_not_active() -> Value {
    json!({"type": "error", "error": {"type": "invalid_request_error",
        "code": "response_cancel_not_active",
        "message": "Cancellation failed: no active response found",
        "param": null, "event_id": null}})
}

async fn close(ws: &mut Ws, code: u16, reason: &str) {
    let _ = ws
        .close(Some(CloseFrame {
            code: CloseCode::from(code),
            reason: reason.to_string().into(),
        }))
        .await;
    // Drain until the peer answers the close (or goes away).
    let _ = tokio::time::timeout(Duration::from_secs(2), async {
        while let Some(Ok(_)) = ws.next().await {}
    })
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{start, TRANSCRIPTION_MODEL};
    use tokio::net::TcpStream;
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;

    type Client = WebSocketStream<TcpStream>;
    const WAIT: Duration = Duration::from_secs(10);

    /// A response of 50 deltas 20 ms apart: one second in flight.
    async fn slow_sim(fault: Option<SimFault>) -> SimHandle {
        start(
            "127.0.0.1:0".parse().unwrap(),
            SimConfig {
                audio_deltas: 50,
                audio_delta_bytes: 16,
                delta_interval: Duration::from_millis(20),
                fault,
                ..SimConfig::default()
            },
        )
        .await
        .unwrap()
    }

    async fn connect(sim: &SimHandle) -> Client {
        let mut request = format!("{}?model=gpt-realtime", sim.url(false))
            .into_client_request()
            .unwrap();
        request
            .headers_mut()
            .insert("authorization", "Bearer sk-any".parse().unwrap());
        let tcp = TcpStream::connect(sim.addr).await.unwrap();
        let (mut ws, _) = tokio_tungstenite::client_async(request, tcp).await.unwrap();
        assert_eq!(next_type(&mut ws).await.unwrap(), "session.created");
        ws
    }

    /// The next text frame's type and text; `None` at a close or the end.
    async fn next_event(ws: &mut Client) -> Option<(String, String)> {
        loop {
            match tokio::time::timeout(WAIT, ws.next())
                .await
                .expect("in time")
            {
                Some(Ok(Message::Text(t))) => {
                    let kind = event_type(&t).unwrap_or_default();
                    return Some((kind, t.to_string()));
                }
                Some(Ok(Message::Close(_))) | Some(Err(_)) | None => return None,
                Some(Ok(_)) => {}
            }
        }
    }

    async fn next_type(ws: &mut Client) -> Option<String> {
        next_event(ws).await.map(|(k, _)| k)
    }

    async fn send_update(ws: &mut Client, session: Value) {
        let update = json!({"type": "session.update", "event_id": "evt_c1", "session": session});
        ws.send(Message::text(update.to_string())).await.unwrap();
    }

    #[tokio::test]
    async fn session_update_is_kept_and_an_invalid_one_is_an_error_naming_the_field() {
        let sim = start(
            "127.0.0.1:0".parse().unwrap(),
            SimConfig {
                record: true,
                ..SimConfig::default()
            },
        )
        .await
        .unwrap();
        let mut ws = connect(&sim).await;
        send_update(
            &mut ws,
            json!({"type": "realtime", "instructions": "Be brief."}),
        )
        .await;
        let (kind, text) = next_event(&mut ws).await.unwrap();
        assert_eq!(kind, "session.updated");
        let v: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["session"]["instructions"], "Be brief.");
        for (session, code, param) in [
            (
                json!({"type": "transcription"}),
                "invalid_value",
                "session.type",
            ),
            (
                json!({"instructions": "x"}),
                "missing_required_parameter",
                "session.type",
            ),
            (
                json!({"type": "realtime", "instructions": 5}),
                "invalid_type",
                "session.instructions",
            ),
            (
                json!({"type": "realtime", "audio": {"input": {"transcription": {}}}}),
                "invalid_value",
                "session.audio.input.transcription.model",
            ),
            (Value::Null, "missing_required_parameter", "session"),
        ] {
            send_update(&mut ws, session).await;
            let (kind, text) = next_event(&mut ws).await.unwrap();
            assert_eq!(kind, "error", "{text}");
            let v: Value = serde_json::from_str(&text).unwrap();
            assert_eq!(v["error"]["code"], code, "{text}");
            assert_eq!(v["error"]["param"], param, "{text}");
            assert_eq!(v["error"]["event_id"], "evt_c1", "{text}");
        }
        // Unchanged by the refused updates, and kept for the session.
        send_update(&mut ws, json!({"type": "realtime"})).await;
        let (_, text) = next_event(&mut ws).await.unwrap();
        let v: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["session"]["instructions"], "Be brief.");
        assert_eq!(v["session"]["audio"]["input"]["transcription"], Value::Null);
        let received = sim.stats.received.lock().unwrap().clone();
        assert_eq!(received.len(), 7, "{received:?}");
        assert!(received[0].contains("Be brief."), "{received:?}");
        sim.stop();
    }

    async fn send_type(ws: &mut Client, kind: &str) {
        ws.send(Message::text(format!(r#"{{"type":"{kind}"}}"#)))
            .await
            .unwrap();
    }

    async fn until_first_delta(ws: &mut Client) {
        while next_type(ws).await.expect("a delta before the end") != "response.output_audio.delta"
        {
        }
    }

    #[tokio::test]
    async fn cancel_ends_the_response_with_usage_for_what_was_sent() {
        let sim = slow_sim(None).await;
        let mut ws = connect(&sim).await;
        send_type(&mut ws, "response.create").await;
        until_first_delta(&mut ws).await;
        send_type(&mut ws, "response.cancel").await;
        let mut deltas = 1;
        let done = loop {
            let (kind, text) = next_event(&mut ws).await.expect("response.done");
            match kind.as_str() {
                "response.output_audio.delta" => deltas += 1,
                "response.done" => break serde_json::from_str::<Value>(&text).unwrap(),
                _ => {}
            }
        };
        assert_eq!(done["response"]["status"], "cancelled");
        assert!(deltas < 50, "cancelled early: {deltas} deltas");
        assert_eq!(
            done["response"]["usage"]["output_token_details"]["audio_tokens"],
            AUDIO_TOKENS_PER_DELTA * deltas
        );
        // The session goes on.
        send_update(&mut ws, json!({"type": "realtime"})).await;
        assert_eq!(next_type(&mut ws).await.unwrap(), "session.updated");
        sim.stop();
    }

    #[tokio::test]
    async fn a_cancel_for_another_response_or_none_in_flight_is_an_error() {
        let sim = slow_sim(None).await;
        let mut ws = connect(&sim).await;
        send_type(&mut ws, "response.cancel").await;
        let (kind, text) = next_event(&mut ws).await.unwrap();
        assert_eq!(kind, "error");
        assert!(text.contains("response_cancel_not_active"), "{text}");
        send_type(&mut ws, "response.create").await;
        let created = loop {
            let (kind, text) = next_event(&mut ws).await.unwrap();
            if kind == "response.created" {
                break serde_json::from_str::<Value>(&text).unwrap();
            }
        };
        let id = created["response"]["id"].as_str().unwrap().to_string();
        let cancel = |id: &str| {
            Message::text(json!({"type": "response.cancel", "response_id": id}).to_string())
        };
        ws.send(cancel("resp_other")).await.unwrap();
        // The response goes on; the wrong cancel is answered with an error.
        let mut saw_error = false;
        while !saw_error {
            let (kind, _) = next_event(&mut ws).await.unwrap();
            assert_ne!(kind, "response.done");
            saw_error = kind == "error";
        }
        ws.send(cancel(&id)).await.unwrap();
        let done = loop {
            let (kind, text) = next_event(&mut ws).await.unwrap();
            if kind == "response.done" {
                break serde_json::from_str::<Value>(&text).unwrap();
            }
        };
        assert_eq!(done["response"]["status"], "cancelled");
        assert_eq!(
            *sim.stats.cancels.lock().unwrap(),
            vec![None, Some("resp_other".to_string()), Some(id)]
        );
        sim.stop();
    }

    /// Starts a response, closes with `frame` after its first delta, and
    /// returns the event types that still came, and how long the simulator
    /// took to answer the close.
    async fn close_mid_response(
        sim: &SimHandle,
        frame: Option<CloseFrame>,
    ) -> (Vec<String>, Duration) {
        let mut ws = connect(sim).await;
        send_type(&mut ws, "response.create").await;
        until_first_delta(&mut ws).await;
        let started = std::time::Instant::now();
        ws.send(Message::Close(frame)).await.unwrap();
        let mut after_close = Vec::new();
        while let Some(kind) = next_type(&mut ws).await {
            after_close.push(kind);
        }
        (after_close, started.elapsed())
    }

    #[tokio::test]
    async fn a_close_during_a_response_is_answered_at_once() {
        let sim = slow_sim(None).await;
        let frame = CloseFrame {
            code: CloseCode::from(4000),
            reason: "bye".into(),
        };
        let (after_close, took) = close_mid_response(&sim, Some(frame)).await;
        // At most the frames already on their way, never the rest of a
        // one-second response.
        assert!(took < Duration::from_millis(500), "{took:?}");
        assert!(
            !after_close.iter().any(|k| k == "response.done"),
            "{after_close:?}"
        );
        assert_eq!(*sim.stats.close_codes.lock().unwrap(), vec![4000]);
        sim.stop();
    }

    #[tokio::test]
    async fn with_the_fault_a_close_waits_for_the_response_done() {
        let sim = slow_sim(Some(SimFault::FinishResponseBeforeClose)).await;
        let (after_close, _) = close_mid_response(&sim, None).await;
        assert_eq!(
            after_close.last().map(String::as_str),
            Some("response.done")
        );
        sim.stop();
    }

    /// Upgrades go to `…/realtime` and name a model, a deployment or a
    /// call, as the SDKs build them.
    #[tokio::test]
    async fn an_upgrade_elsewhere_or_naming_no_model_is_refused() {
        let sim = slow_sim(None).await;
        let status = |path: &'static str| {
            let addr = sim.addr;
            async move {
                let mut request = format!("ws://{addr}{path}").into_client_request().unwrap();
                request
                    .headers_mut()
                    .insert("authorization", "Bearer sk-any".parse().unwrap());
                let tcp = TcpStream::connect(addr).await.unwrap();
                match tokio_tungstenite::client_async(request, tcp).await {
                    Ok(_) => 101,
                    Err(tokio_tungstenite::tungstenite::Error::Http(r)) => r.status().as_u16(),
                    Err(e) => panic!("{e}"),
                }
            }
        };
        assert_eq!(status("/v1/realtime?model=gpt-realtime").await, 101);
        assert_eq!(
            status("/openai/realtime?api-version=x&deployment=d").await,
            101
        );
        assert_eq!(status("/v1/realtime/?model=gpt-realtime").await, 404);
        assert_eq!(status("/v1/chat?model=gpt-realtime").await, 404);
        assert_eq!(status("/v1/realtime").await, 400);
        assert_eq!(status("/v1/realtime?model=").await, 400);
        sim.stop();
    }

    /// A commit is transcribed (and its usage reported) only while the
    /// session has transcription on, as a `session.update` sets it.
    #[tokio::test]
    async fn a_commit_is_transcribed_only_with_transcription_on() {
        let sim = slow_sim(None).await;
        let mut ws = connect(&sim).await;
        send_type(&mut ws, "input_audio_buffer.commit").await;
        send_type(&mut ws, "conversation.item.create").await;
        let mut kinds = Vec::new();
        while kinds.last().map(String::as_str) != Some("conversation.item.done") {
            kinds.push(next_type(&mut ws).await.expect("events"));
        }
        assert!(
            !kinds.iter().any(|k| k.contains("transcription")),
            "{kinds:?}"
        );
        send_update(
            &mut ws,
            json!({"type": "realtime", "audio": {"input": {"transcription": {"model": TRANSCRIPTION_MODEL}}}}),
        )
        .await;
        let (_, text) = next_event(&mut ws).await.unwrap();
        let v: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(
            v["session"]["audio"]["input"]["transcription"]["model"],
            TRANSCRIPTION_MODEL
        );
        send_type(&mut ws, "input_audio_buffer.commit").await;
        while next_type(&mut ws).await.expect("events")
            != "conversation.item.input_audio_transcription.completed"
        {}
        sim.stop();
    }

    #[tokio::test]
    async fn events_sent_during_a_response_are_answered_after_it_in_order() {
        let sim = slow_sim(None).await;
        let mut ws = connect(&sim).await;
        send_type(&mut ws, "response.create").await;
        send_update(
            &mut ws,
            json!({"type": "realtime", "audio": {"input": {"transcription": {"model": TRANSCRIPTION_MODEL}}}}),
        )
        .await;
        send_type(&mut ws, "input_audio_buffer.commit").await;
        let mut order = Vec::new();
        while order.last().map(String::as_str)
            != Some("conversation.item.input_audio_transcription.completed")
        {
            let kind = next_type(&mut ws).await.expect("events");
            if !kind.contains("delta") {
                order.push(kind);
            }
        }
        let at = |k: &str| order.iter().position(|o| o == k).unwrap();
        assert!(at("response.done") < at("session.updated"), "{order:?}");
        assert!(
            at("session.updated") < at("input_audio_buffer.committed"),
            "{order:?}"
        );
        sim.stop();
    }
}
