//! A simulated response, with the event sequence OpenAI sends (openai-python
//! `types/realtime/`, each event's file cited where it is built):
//! `response.created` → `response.output_item.added` →
//! `conversation.item.added` → `response.content_part.added` → deltas →
//! their `…done` → `response.content_part.done` → `response.output_item.done`
//! → `conversation.item.done` → `response.done` with `output` filled. The
//! beta names (`response.audio.delta`, …) and the beta's lack of
//! `conversation.item.added`/`done` are kept for beta sessions.
//!
//! - **Modalities**: audio (`response.output_audio.delta` and its
//!   transcript) unless the response's (or the session's)
//!   `output_modalities` is `["text"]`: then `response.output_text.delta`.
//! - **Metadata**: `response.create`'s `response.metadata` is echoed in
//!   `response.created` and `response.done` (`realtime_response.py`:
//!   `metadata`), as clients match their own responses by it.
//! - **Function calls** ([`ToolRule`]): when the session has function tools
//!   and the conversation's last item is a user message whose text names
//!   one of them, the response is a `function_call` item
//!   (`realtime_conversation_item_function_call.py`) with
//!   `response.function_call_arguments.delta`/`done`
//!   (`response_function_call_arguments_delta_event.py`), its arguments an
//!   object with a value for each required parameter of the tool's schema.
//!   The client answers with a `function_call_output` item and
//!   `response.create`, which gets an ordinary answer.

use std::sync::atomic::Ordering;
use std::time::Duration;

use base64::Engine;
use serde_json::{json, Map, Value};

use super::{Flow, Interrupt, Session, Ws};
use crate::config::SimFault;

/// What a `response.create` asks for (`response_create_event.py`:
/// `response.metadata`, `response.output_modalities`, and
/// `realtime_response_create_params.py`'s `conversation`).
#[derive(Debug, Clone, Default)]
pub(crate) struct Requested {
    pub(crate) metadata: Value,
    pub(crate) output_modalities: Option<Vec<String>>,
    /// `"conversation": "none"`: a response out of band, added to no
    /// conversation.
    pub(crate) out_of_band: bool,
}

impl Requested {
    pub(crate) fn of(text: &str) -> Self {
        let v: Value = serde_json::from_str(text).unwrap_or(Value::Null);
        let r = v.get("response");
        Self {
            metadata: r
                .and_then(|r| r.get("metadata"))
                .cloned()
                .unwrap_or(Value::Null),
            output_modalities: r
                .and_then(|r| r.get("output_modalities"))
                .and_then(Value::as_array)
                .map(|a| {
                    a.iter()
                        .filter_map(Value::as_str)
                        .map(String::from)
                        .collect()
                }),
            out_of_band: r.and_then(|r| r.get("conversation")) == Some(&json!("none")),
        }
    }
}

/// When the simulated model calls a tool: a function tool of the session
/// whose name the last user message's text contains (case-insensitive).
pub(crate) struct ToolRule;

impl ToolRule {
    /// The tool to call, if any.
    pub(crate) fn pick<'a>(tools: &'a [Value], last_user_text: Option<&str>) -> Option<&'a Value> {
        let text = last_user_text?.to_lowercase();
        tools.iter().find(|t| {
            t.get("type").and_then(Value::as_str) == Some("function")
                && t.get("name")
                    .and_then(Value::as_str)
                    .is_some_and(|n| !n.is_empty() && text.contains(&n.to_lowercase()))
        })
    }

    /// Arguments with a value for every required parameter of `tool`'s
    /// JSON schema (a string, number, integer, boolean, array or object
    /// default of its type).
    pub(crate) fn arguments(tool: &Value) -> String {
        let params = tool.get("parameters");
        let props = params
            .and_then(|p| p.get("properties"))
            .and_then(Value::as_object);
        let required: Vec<&str> = params
            .and_then(|p| p.get("required"))
            .and_then(Value::as_array)
            .map(|r| r.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        let mut args = Map::new();
        for name in required {
            let kind = props
                .and_then(|p| p.get(name))
                .and_then(|p| p.get("type"))
                .and_then(Value::as_str)
                .unwrap_or("string");
            let value = match kind {
                "number" | "integer" => json!(1),
                "boolean" => json!(true),
                "array" => json!([]),
                "object" => json!({}),
                _ => json!("sim"),
            };
            args.insert(name.to_string(), value);
        }
        Value::Object(args).to_string()
    }
}

impl Session {
    /// [`SimFault::CreatedBurst`]: `response.created` events (shaped as
    /// openai-python's `ResponseCreatedEvent`) of responses that never
    /// finish, fed and flushed at once.
    async fn created_burst(&mut self, ws: &mut Ws) -> bool {
        use futures_util::SinkExt;
        use tokio_tungstenite::tungstenite::Message;
        let Some(SimFault::CreatedBurst { count }) = self.config.fault else {
            return true;
        };
        for i in 0..count {
            let id = self.event_id();
            let text = format!(
                r#"{{"type":"response.created","event_id":"{id}","response":{{"object":"realtime.response","id":"resp_burst_{i}","status":"in_progress","output":[],"usage":null}}}}"#
            );
            if ws.feed(Message::text(text)).await.is_err() {
                return false;
            }
        }
        ws.flush().await.is_ok()
    }

    /// The usage the `n`-th response reports after `audio_deltas` deltas:
    /// [`super::usage_for`], or [`super::usage_max`] under
    /// [`SimFault::UsageMax`].
    fn usage(&self, n: u64, audio_deltas: usize) -> Value {
        match self.config.fault {
            Some(SimFault::UsageMax) => super::usage_max(),
            _ => super::usage_for(n, audio_deltas),
        }
    }

    /// Sends an output item's `added` events (`response_output_item_added_event.py`,
    /// GA also `conversation_item_added.py`).
    async fn item_added(&mut self, ws: &mut Ws, resp_id: &str, item: &Value) -> bool {
        let ok = self
            .send(
                ws,
                json!({"type": "response.output_item.added", "response_id": resp_id,
                             "output_index": 0, "item": item}),
            )
            .await;
        ok && (self.beta
            || self
                .send(ws, json!({"type": "conversation.item.added", "previous_item_id": null, "item": item}))
                .await)
    }

    /// Sends an output item's `done` events (`response_output_item_done_event.py`,
    /// GA also `conversation_item_done.py`).
    async fn item_done(&mut self, ws: &mut Ws, resp_id: &str, item: &Value) -> bool {
        let ok = self
            .send(
                ws,
                json!({"type": "response.output_item.done", "response_id": resp_id,
                             "output_index": 0, "item": item}),
            )
            .await;
        ok && (self.beta
            || self
                .send(ws, json!({"type": "conversation.item.done", "previous_item_id": null, "item": item}))
                .await)
    }

    /// Answers a `response.create` (`create`: its text; `None` for a
    /// caller's turn on a call).
    pub(super) async fn respond(&mut self, ws: &mut Ws, create: Option<&str>) -> Flow {
        let requested = create.map(Requested::of).unwrap_or_default();
        self.responses += 1;
        let n = self.responses;
        let resp_id = format!("resp_{}_{n}", &self.id[5..13]);
        let item_id = format!("item_out_{n}");
        let text_only = requested
            .output_modalities
            .as_deref()
            .unwrap_or(&self.output_modalities)
            == ["text"];
        let modalities = if text_only {
            json!(["text"])
        } else {
            json!(["audio"])
        };
        let metadata = requested.metadata.clone();
        // `realtime_response.py`: `conversation_id` names the session's
        // default conversation (`conv_…`, one per session here), null for
        // a response out of band.
        let conversation_id = if requested.out_of_band {
            Value::Null
        } else {
            json!(format!("conv_{}", &self.id[5..]))
        };
        let response = |status: &str, output: Value, usage: Value| {
            json!({"object": "realtime.response", "id": resp_id, "status": status,
                   "status_details": null, "output": output, "conversation_id": conversation_id,
                   "output_modalities": modalities, "max_output_tokens": "inf",
                   "audio": {"output": {"format": {"type": "audio/pcm", "rate": 24000}, "voice": "alloy"}},
                   "usage": usage, "metadata": metadata})
        };
        if !self
            .send(ws, json!({"type": "response.created", "response": response("in_progress", json!([]), Value::Null)}))
            .await
        {
            return Flow::Stop;
        }
        if let Some(tool) = ToolRule::pick(&self.tools, self.last_user_text.as_deref()).cloned() {
            return self
                .call_tool(ws, n, &resp_id, &item_id, &tool, response)
                .await;
        }
        let part_kind = if text_only { "text" } else { "audio" };
        let in_progress = json!({"id": item_id, "object": "realtime.item", "type": "message",
            "status": "in_progress", "role": "assistant", "content": []});
        // `response_content_part_added_event.py`.
        let part_added = json!({"type": "response.content_part.added", "response_id": resp_id,
            "item_id": item_id, "output_index": 0, "content_index": 0,
            "part": {"type": part_kind, "text": null, "audio": null, "transcript": null}});
        if !(self.item_added(ws, &resp_id, &in_progress).await && self.send(ws, part_added).await) {
            return Flow::Stop;
        }
        let mut sent = 0;
        let interrupt = 'deltas: {
            if let Some(i) = self.watch(ws, self.config.inference_delay, &resp_id).await {
                break 'deltas Some(i);
            }
            let audio = base64::engine::general_purpose::STANDARD
                .encode(vec![0u8; self.config.audio_delta_bytes]);
            let audio_delta = self.name("response.output_audio.delta", "response.audio.delta");
            let transcript_delta = if text_only {
                self.name("response.output_text.delta", "response.text.delta")
            } else {
                self.name(
                    "response.output_audio_transcript.delta",
                    "response.audio_transcript.delta",
                )
            };
            for i in 0..self.config.audio_deltas {
                if let Some(i) = self.watch(ws, Duration::ZERO, &resp_id).await {
                    break 'deltas Some(i);
                }
                if let Some(SimFault::DropMidResponse { after_deltas }) = self.config.fault {
                    if i == after_deltas {
                        // Drop the TCP connection without a close frame.
                        return Flow::Stop;
                    }
                }
                if !text_only {
                    // `response_audio_delta_event.py`.
                    let delta = json!({"type": audio_delta, "response_id": resp_id, "item_id": item_id,
                        "output_index": 0, "content_index": 0, "delta": audio});
                    if !self.send(ws, delta).await {
                        return Flow::Stop;
                    }
                    self.handle
                        .stats
                        .audio_bytes_sent
                        .fetch_add(audio.len() as u64, Ordering::Relaxed);
                }
                let t = json!({"type": transcript_delta, "response_id": resp_id, "item_id": item_id,
                "output_index": 0, "content_index": 0, "delta": "la "});
                if !self.send(ws, t).await {
                    return Flow::Stop;
                }
                sent += 1;
                if let Some(i) = self.watch(ws, self.config.delta_interval, &resp_id).await {
                    break 'deltas Some(i);
                }
            }
            None
        };
        let audio_deltas = if text_only { 0 } else { sent };
        match interrupt {
            Some(Interrupt::Ended) => return Flow::Stop,
            Some(Interrupt::Cancel) => {
                let usage = self.usage(n, audio_deltas);
                let done = json!({"type": "response.done", "response": response("cancelled", json!([]), usage)});
                return if self.send(ws, done).await {
                    Flow::Continue
                } else {
                    Flow::Stop
                };
            }
            None => {}
        }
        let transcript = "la "
            .repeat(self.config.audio_deltas)
            .trim_end()
            .to_string();
        let part = if text_only {
            json!({"type": "text", "text": transcript})
        } else {
            json!({"type": "audio", "transcript": transcript})
        };
        let content = if text_only {
            json!([{"type": "output_text", "text": transcript}])
        } else {
            json!([{"type": "output_audio", "transcript": transcript}])
        };
        let item = json!({"id": item_id, "object": "realtime.item", "type": "message",
            "status": "completed", "role": "assistant", "content": content});
        let mut ok = true;
        if !text_only {
            let audio_done = self.name("response.output_audio.done", "response.audio.done");
            ok = self
                .send(
                    ws,
                    json!({"type": audio_done, "response_id": resp_id, "item_id": item_id,
                    "output_index": 0, "content_index": 0}),
                )
                .await;
        }
        let text_done = if text_only {
            json!({"type": self.name("response.output_text.done", "response.text.done"),
                "response_id": resp_id, "item_id": item_id, "output_index": 0, "content_index": 0,
                "text": transcript})
        } else {
            json!({"type": self.name("response.output_audio_transcript.done", "response.audio_transcript.done"),
                "response_id": resp_id, "item_id": item_id, "output_index": 0, "content_index": 0,
                "transcript": transcript})
        };
        // `response_done_event.py`.
        let done = json!({"type": "response.done",
            "response": response("completed", json!([item]), self.usage(n, audio_deltas))});
        let twice = matches!(self.config.fault, Some(SimFault::DoneTwice));
        ok = ok
            && self.send(ws, text_done).await
            && self
                .send(
                    ws,
                    json!({"type": "response.content_part.done", "response_id": resp_id,
                    "item_id": item_id, "output_index": 0, "content_index": 0, "part": part}),
                )
                .await
            && self.item_done(ws, &resp_id, &item).await
            && self.created_burst(ws).await
            && self.send(ws, done.clone()).await
            && (!twice || self.send(ws, done).await);
        self.finished(ws, ok).await
    }

    /// A response that calls `tool`.
    async fn call_tool(
        &mut self,
        ws: &mut Ws,
        n: u64,
        resp_id: &str,
        item_id: &str,
        tool: &Value,
        response: impl Fn(&str, Value, Value) -> Value,
    ) -> Flow {
        let name = tool.get("name").and_then(Value::as_str).unwrap_or_default();
        let call_id = format!("call_{}_{n}", &self.id[5..13]);
        let arguments = ToolRule::arguments(tool);
        let item = |status: &str, arguments: &str| {
            json!({"id": item_id, "object": "realtime.item", "type": "function_call",
                   "status": status, "name": name, "call_id": call_id, "arguments": arguments})
        };
        let added = item("in_progress", "");
        if !self.item_added(ws, resp_id, &added).await {
            return Flow::Stop;
        }
        if let Some(i) = self.watch(ws, self.config.inference_delay, resp_id).await {
            return match i {
                Interrupt::Ended => Flow::Stop,
                Interrupt::Cancel => {
                    let done = json!({"type": "response.done", "response": response("cancelled", json!([]), self.usage(n, 0))});
                    if self.send(ws, done).await {
                        Flow::Continue
                    } else {
                        Flow::Stop
                    }
                }
            };
        }
        let done_item = item("completed", &arguments);
        self.last_user_text = None;
        let ok = self
            .send(
                ws,
                json!({"type": "response.function_call_arguments.delta", "response_id": resp_id,
                "item_id": item_id, "output_index": 0, "call_id": call_id, "delta": arguments}),
            )
            .await
            && self
                .send(
                    ws,
                    json!({"type": "response.function_call_arguments.done", "response_id": resp_id,
                    "item_id": item_id, "output_index": 0, "call_id": call_id, "name": name,
                    "arguments": arguments}),
                )
                .await
            && self.item_done(ws, resp_id, &done_item).await
            && self
                .send(
                    ws,
                    json!({"type": "response.done",
                    "response": response("completed", json!([done_item]), self.usage(n, 0))}),
                )
                .await;
        self.finished(ws, ok).await
    }

    /// After a response's last event: counted, and the close of
    /// [`SimFault::CloseAfterResponse`].
    async fn finished(&mut self, ws: &mut Ws, ok: bool) -> Flow {
        if !ok {
            return Flow::Stop;
        }
        self.handle
            .stats
            .responses_done
            .fetch_add(1, Ordering::Relaxed);
        if let Some(SimFault::CloseAfterResponse { code, reason }) = &self.config.fault {
            let (code, reason) = (*code, reason.clone());
            super::close(ws, code, &reason).await;
            return Flow::Stop;
        }
        Flow::Continue
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{start, SimConfig};
    use futures_util::{SinkExt, StreamExt};
    use tokio::net::TcpStream;
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;
    use tokio_tungstenite::tungstenite::Message;
    use tokio_tungstenite::WebSocketStream;

    type Client = WebSocketStream<TcpStream>;

    async fn session() -> Client {
        let sim = start(
            "127.0.0.1:0".parse().unwrap(),
            SimConfig {
                audio_deltas: 2,
                delta_interval: Duration::ZERO,
                ..SimConfig::default()
            },
        )
        .await
        .unwrap();
        let mut request = format!("{}?model=gpt-realtime", sim.url(false))
            .into_client_request()
            .unwrap();
        request
            .headers_mut()
            .insert("authorization", "Bearer sk-any".parse().unwrap());
        let tcp = TcpStream::connect(sim.addr).await.unwrap();
        let (mut ws, _) = tokio_tungstenite::client_async(request, tcp).await.unwrap();
        assert_eq!(next(&mut ws).await["type"], "session.created");
        ws
    }

    async fn next(ws: &mut Client) -> Value {
        loop {
            let msg = tokio::time::timeout(Duration::from_secs(10), ws.next())
                .await
                .unwrap()
                .unwrap()
                .unwrap();
            if let Message::Text(t) = msg {
                return serde_json::from_str(&t).unwrap();
            }
        }
    }

    async fn send(ws: &mut Client, v: Value) {
        ws.send(Message::text(v.to_string())).await.unwrap();
    }

    /// The types of the events up to and including `response.done`.
    async fn until_done(ws: &mut Client) -> Vec<Value> {
        let mut events = Vec::new();
        loop {
            let e = next(ws).await;
            let done = e["type"] == "response.done";
            events.push(e);
            if done {
                return events;
            }
        }
    }

    fn types(events: &[Value]) -> Vec<&str> {
        events.iter().map(|e| e["type"].as_str().unwrap()).collect()
    }

    /// `realtime_response.py`: `conversation_id`.
    #[tokio::test]
    async fn responses_name_the_sessions_conversation_and_none_out_of_band() {
        let mut ws = session().await;
        send(&mut ws, json!({"type": "response.create"})).await;
        let events = until_done(&mut ws).await;
        let conv = events[0]["response"]["conversation_id"].clone();
        assert!(conv.as_str().unwrap().starts_with("conv_"), "{conv}");
        assert_eq!(events.last().unwrap()["response"]["conversation_id"], conv);
        send(
            &mut ws,
            json!({"type": "response.create", "response": {"conversation": "none"}}),
        )
        .await;
        let events = until_done(&mut ws).await;
        assert_eq!(events[0]["response"]["conversation_id"], Value::Null);
        assert_eq!(
            events.last().unwrap()["response"]["conversation_id"],
            Value::Null
        );
        // Another session, another conversation.
        let mut other = session().await;
        send(&mut other, json!({"type": "response.create"})).await;
        assert_ne!(
            until_done(&mut other).await[0]["response"]["conversation_id"],
            conv
        );
    }

    #[tokio::test]
    async fn a_response_sends_openais_sequence_and_echoes_its_metadata() {
        let mut ws = session().await;
        send(
            &mut ws,
            json!({"type": "conversation.item.create", "item": {"id": "my_item_7",
            "type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}}),
        )
        .await;
        assert_eq!(
            next(&mut ws).await["item"]["id"],
            "my_item_7",
            "the client's id kept"
        );
        assert_eq!(next(&mut ws).await["type"], "conversation.item.done");
        send(
            &mut ws,
            json!({"type": "response.create", "response": {"metadata": {"client_event_id": "c9"}}}),
        )
        .await;
        let events = until_done(&mut ws).await;
        assert_eq!(
            types(&events),
            [
                "response.created",
                "response.output_item.added",
                "conversation.item.added",
                "response.content_part.added",
                "response.output_audio.delta",
                "response.output_audio_transcript.delta",
                "response.output_audio.delta",
                "response.output_audio_transcript.delta",
                "response.output_audio.done",
                "response.output_audio_transcript.done",
                "response.content_part.done",
                "response.output_item.done",
                "conversation.item.done",
                "response.done",
            ]
        );
        assert_eq!(events[0]["response"]["metadata"]["client_event_id"], "c9");
        let done = &events[13]["response"];
        assert_eq!(done["metadata"]["client_event_id"], "c9");
        assert_eq!(done["output"][0]["content"][0]["transcript"], "la la");

        send(
            &mut ws,
            json!({"type": "response.create", "response": {"output_modalities": ["text"]}}),
        )
        .await;
        let events = until_done(&mut ws).await;
        assert!(
            types(&events).contains(&"response.output_text.delta"),
            "{:?}",
            types(&events)
        );
        assert!(!types(&events).contains(&"response.output_audio.delta"));
        assert_eq!(
            events.last().unwrap()["response"]["usage"]["output_token_details"]["audio_tokens"],
            0
        );
    }

    #[tokio::test]
    async fn a_tool_named_by_the_user_is_called_and_its_output_answered() {
        let mut ws = session().await;
        send(
            &mut ws,
            json!({"type": "session.update", "session": {"type": "realtime", "tools": [
            {"type": "function", "name": "lookup_order", "parameters": {"type": "object",
             "properties": {"order_id": {"type": "string"}}, "required": ["order_id"]}}]}}),
        )
        .await;
        assert_eq!(
            next(&mut ws).await["session"]["tools"][0]["name"],
            "lookup_order"
        );
        send(&mut ws, json!({"type": "conversation.item.create", "item": {"type": "message",
            "role": "user", "content": [{"type": "input_text", "text": "lookup_order 42 please"}]}})).await;
        next(&mut ws).await;
        next(&mut ws).await;
        send(&mut ws, json!({"type": "response.create"})).await;
        let events = until_done(&mut ws).await;
        assert!(types(&events).contains(&"response.function_call_arguments.delta"));
        let done = events.last().unwrap();
        let call = &done["response"]["output"][0];
        assert_eq!(
            (&call["type"], &call["name"]),
            (&json!("function_call"), &json!("lookup_order"))
        );
        assert_eq!(call["arguments"], r#"{"order_id":"sim"}"#);
        let call_id = call["call_id"].as_str().unwrap().to_string();

        send(
            &mut ws,
            json!({"type": "conversation.item.create", "item": {"type": "function_call_output",
            "call_id": call_id, "output": "{\"status\":\"shipped\"}"}}),
        )
        .await;
        assert_eq!(next(&mut ws).await["item"]["type"], "function_call_output");
        next(&mut ws).await;
        send(&mut ws, json!({"type": "response.create"})).await;
        let events = until_done(&mut ws).await;
        assert_eq!(
            events.last().unwrap()["response"]["output"][0]["type"],
            "message",
            "then an answer"
        );
    }

    #[tokio::test]
    async fn appended_audio_is_heard_as_speech_until_the_commit() {
        let mut ws = session().await;
        for _ in 0..3 {
            send(
                &mut ws,
                json!({"type": "input_audio_buffer.append", "audio": "AAAA"}),
            )
            .await;
        }
        send(&mut ws, json!({"type": "input_audio_buffer.commit"})).await;
        let kinds = [
            next(&mut ws).await,
            next(&mut ws).await,
            next(&mut ws).await,
        ];
        assert_eq!(
            types(&kinds),
            [
                "input_audio_buffer.speech_started",
                "input_audio_buffer.speech_stopped",
                "input_audio_buffer.committed"
            ]
        );
    }

    #[test]
    fn a_tool_is_called_when_the_last_user_text_names_it_with_its_required_arguments() {
        let tools = vec![
            json!({"type": "function", "name": "get_weather", "parameters": {"type": "object",
                "properties": {"city": {"type": "string"}, "days": {"type": "integer"}, "units": {"type": "string"}},
                "required": ["city", "days"]}}),
            json!({"type": "mcp", "name": "lookup"}),
        ];
        assert!(ToolRule::pick(&tools, Some("what is the weather")).is_none());
        let tool = ToolRule::pick(&tools, Some("please call GET_WEATHER for Oslo")).unwrap();
        let args: Value = serde_json::from_str(&ToolRule::arguments(tool)).unwrap();
        assert_eq!(args, json!({"city": "sim", "days": 1}));
        assert!(
            ToolRule::pick(&tools, Some("lookup")).is_none(),
            "only function tools"
        );
        assert!(ToolRule::pick(&tools, None).is_none());
    }

    #[test]
    fn response_create_metadata_and_modalities_are_read() {
        let r = Requested::of(
            r#"{"type":"response.create","response":{"metadata":{"client_event_id":"c1"},"output_modalities":["text"]}}"#,
        );
        assert_eq!(r.metadata, json!({"client_event_id": "c1"}));
        assert_eq!(r.output_modalities, Some(vec!["text".to_string()]));
        let r = Requested::of(r#"{"type":"response.create"}"#);
        assert_eq!((r.metadata, r.output_modalities), (Value::Null, None));
    }
}
