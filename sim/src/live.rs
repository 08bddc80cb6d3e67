//! A simulated GPT-Live session on its primary WebSocket (`GET
//! /v1/live/sessions`), as the official SDK's types describe it
//! (openai-python `resources/live/live.py`, `types/live/`):
//! - the URL names no model (`session_resource.py`: the model is "Required
//!   in the session configuration for every transport; do not pass it as a
//!   URL query parameter"); the client's first event is `session.start`
//!   (`session_start_event.py`: "Send this event before other commands and
//!   wait for `session.started`"), with `session.model`
//!   (`session_config_param.py`, required); anything else first, or no
//!   model, is answered with an `error` (`error_event.py`: `error{type,
//!   code, message, param, client_event_id}`) and the session stays
//!   unstarted;
//! - `session.started` carries the resolved session (`session_resource.py`:
//!   `id`, `expires_at`, `model`, `status: "active"`, the config echoed) and
//!   `client_event_id`;
//! - every [`LiveSim::usage_interval`] a `session.usage.updated`
//!   (`session_usage_updated_event.py`) with the **cumulative** billable
//!   seconds so far (`session_usage.py`: "The cumulative billable duration
//!   in whole seconds ... Do not sum values across usage events"): the
//!   session's running time, scaled by [`LiveSim::time_scale`] (so a test
//!   runs a minute of billed time in a second), rounded down;
//! - `session.input_audio.append` (`input_audio_append_event.py`: "Audio
//!   appends have no acknowledgment") is answered with output audio of the
//!   same length (`output_audio_delta_event.py`, primary WebSocket: no
//!   timestamps) and a `session.output_transcript.delta`;
//! - `session.close` (`session_close_event.py`) is answered with
//!   `session.closed` (`session_closed_event.py`: `reason:
//!   "close_requested"`, the final `session`, the final cumulative `usage`),
//!   then a close 1000;
//! - `response.create` in a session with Responses delegation makes one
//!   delegated response ([`crate::live_delegation`]), and is answered with
//!   an `error` in one without;
//! - other events are accepted silently (the simulator keeps no model);
//! - a WebSocket fork (`GET …/sessions/{id}/fork` of a known Live session,
//!   `resources/live/forks.py`) is a new session that inherits the
//!   parent's model: its `session.start` names none (one that does is
//!   answered `invalid_value`);
//! - a started session is known by its id to the rest of the Live API as a
//!   WebRTC one is: sidebands attach to it (`resources/live/sideband.py`),
//!   it is forked over HTTP or WebSocket (`forks.py`), and a sideband's
//!   `session.close` or a `hangup` of its id (`sessions.py`) ends it, the
//!   primary then getting `session.closed` and the close as for its own
//!   `session.close`.
//!
//! What the simulated upstream bills is the final cumulative figure of each
//! session, added to [`crate::SimStats::live_seconds`] when it ends however
//! it ends (a dropped client is billed to the moment it dropped: a
//! connection closing without `session.closed` "does not confirm
//! finalization", `session_closed_event.py`).
//!
//! Faults ([`LiveFault`]) make the usage events unreliable the ways the
//! issue of cumulative usage allows: lost, repeated, out of order, or the
//! session closed without `session.closed`.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tokio::time::Instant;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::WebSocketStream;

#[cfg(test)]
use crate::config::LiveSim;
use crate::config::{LiveFault, SimConfig};
use crate::handle::{Command, SimHandle};
use crate::live_delegation::{delegated_events, delegated_model};
use crate::wire::{short_id, SimIo};

type Ws = WebSocketStream<SimIo>;

/// The path a Live primary WebSocket upgrades at (SDK:
/// `resources/live/live.py`, `_prepare_url`: `…/live/sessions`).
pub const LIVE_PATH_SUFFIX: &str = "/live/sessions";

/// Fires when `ended` is cancelled; never without one.
async fn ended_of(ended: Option<&tokio_util::sync::CancellationToken>) {
    match ended {
        Some(t) => t.cancelled().await,
        None => std::future::pending().await,
    }
}

/// How the session's loop goes on after an event.
enum Flow {
    Go,
    Stop,
}

/// One Live session.
pub(crate) struct Live {
    config: Arc<SimConfig>,
    handle: SimHandle,
    id: String,
    seq: u64,
    /// The started session's configuration (`session.start`'s `session`).
    session: Option<Value>,
    started: Instant,
    /// Usage events written so far (for the faults' schedules).
    reports: u64,
    /// A report held back to be sent after the next one
    /// ([`LiveFault::UsageReordered`]).
    held: Option<u64>,
    /// A WebSocket fork's model, the parent's: its `session.start` names
    /// none (`fork_session_start_event_param.py`: "do not supply a new
    /// model").
    inherited: Option<String>,
    /// Cancelled when the session is ended from elsewhere: a sideband's
    /// `session.close` or a `hangup` of its id.
    ended: Option<tokio_util::sync::CancellationToken>,
}

impl Live {
    pub(crate) fn new(config: Arc<SimConfig>, handle: SimHandle) -> Self {
        Self {
            config,
            handle,
            id: format!("live_{}", short_id()),
            seq: 0,
            session: None,
            started: Instant::now(),
            reports: 0,
            held: None,
            inherited: None,
            ended: None,
        }
    }

    /// A fork of a session of `model` (`None`: not a fork).
    pub(crate) fn forked_from(mut self, model: Option<String>) -> Self {
        self.inherited = model;
        self
    }

    /// The cumulative billed seconds so far, in whole seconds.
    fn seconds(&self) -> u64 {
        if self.session.is_none() {
            return 0;
        }
        (self.started.elapsed().as_secs_f64() * self.config.live.time_scale).floor() as u64
    }

    fn resource(&self) -> Value {
        let mut session = self.session.clone().unwrap_or_else(|| json!({}));
        let expires_at = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs())
            + 3600;
        if let Some(o) = session.as_object_mut() {
            o.insert("id".into(), json!(self.id));
            o.insert("expires_at".into(), json!(expires_at));
            o.insert("status".into(), json!("active"));
        }
        session
    }

    async fn send(&mut self, ws: &mut Ws, kind: &str, rest: Value) -> bool {
        self.seq += 1;
        self.handle
            .send_event(ws, self.config.record, (&self.id, self.seq), kind, &rest)
            .await
    }

    async fn error(
        &mut self,
        ws: &mut Ws,
        code: &str,
        param: Option<&str>,
        message: &str,
        client_event_id: Option<&str>,
    ) -> bool {
        let error = json!({
            "error": {"type": "invalid_request_error", "code": code, "message": message,
                      "param": param, "client_event_id": client_event_id},
            "client_event_id": client_event_id,
        });
        self.send(ws, "error", error).await
    }

    /// The usage event of `seconds`, as the fault in force lets it out.
    async fn report(&mut self, ws: &mut Ws, seconds: u64) -> bool {
        self.reports += 1;
        let fault = self.config.live.fault;
        let mut out: Vec<u64> = match fault {
            // Every other report is lost.
            Some(LiveFault::UsageLost) if self.reports.is_multiple_of(2) => Vec::new(),
            Some(LiveFault::UsageRepeated) => vec![seconds, seconds],
            Some(LiveFault::UsageReordered) => match self.held.take() {
                // The held (older) figure goes out after the newer one.
                Some(older) => vec![seconds, older],
                None => {
                    self.held = Some(seconds);
                    Vec::new()
                }
            },
            _ => vec![seconds],
        };
        for s in out.drain(..) {
            if !self
                .send(
                    ws,
                    "session.usage.updated",
                    json!({"usage": {"seconds": s}}),
                )
                .await
            {
                return false;
            }
        }
        true
    }

    /// Bills the session's final figure (once, when it ends).
    fn bill(&self) -> u64 {
        let seconds = self.seconds();
        self.handle
            .stats
            .live_seconds
            .fetch_add(seconds, Ordering::Relaxed);
        seconds
    }

    pub(crate) async fn run(&mut self, mut ws: Ws) {
        let mut commands = self.handle.commands.subscribe();
        let period = self
            .config
            .live
            .usage_interval
            .max(Duration::from_millis(1));
        let mut tick = tokio::time::interval_at(Instant::now() + period, period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let ended = self.ended.clone();
            let flow = tokio::select! {
                // Ended from a sideband or a hangup: closed as on its own
                // `session.close`, with the final figure.
                _ = ended_of(ended.as_ref()), if self.session.is_some() => {
                    self.close(&mut ws, None).await;
                    Flow::Stop
                }
                _ = tick.tick(), if self.session.is_some() => {
                    let s = self.seconds();
                    if self.report(&mut ws, s).await { Flow::Go } else { Flow::Stop }
                }
                cmd = commands.recv() => match cmd {
                    Ok(Command::Ping) => { let _ = ws.send(Message::Ping(bytes::Bytes::from_static(b"sim"))).await; Flow::Go }
                    Ok(Command::Close(code)) => {
                        let _ = ws.close(Some(CloseFrame { code: CloseCode::from(code), reason: "simulator closed the session".into() })).await;
                        Flow::Stop
                    }
                    Ok(Command::Drop) => Flow::Stop,
                    Err(_) => Flow::Go,
                },
                msg = ws.next() => match msg {
                    Some(Ok(Message::Text(text))) => self.on_event(&mut ws, &text).await,
                    Some(Ok(Message::Close(frame))) => {
                        if let (Some(f), Ok(mut codes)) = (frame, self.handle.stats.close_codes.lock()) {
                            codes.push(u16::from(f.code));
                        }
                        let _ = ws.close(None).await;
                        Flow::Stop
                    }
                    Some(Ok(_)) => Flow::Go,
                    Some(Err(_)) | None => Flow::Stop,
                },
            };
            if let Flow::Stop = flow {
                break;
            }
        }
        if self.session.is_some() {
            self.bill();
        }
        // Its sidebands close with it.
        self.handle.stats.calls.end(&self.id);
    }

    async fn on_event(&mut self, ws: &mut Ws, text: &str) -> Flow {
        if self.config.record {
            if let Ok(mut received) = self.handle.stats.received.lock() {
                received.push(text.to_string());
            }
        }
        let Ok(event) = serde_json::from_str::<Value>(text) else {
            let ok = self
                .error(
                    ws,
                    "invalid_json",
                    None,
                    "The event could not be parsed.",
                    None,
                )
                .await;
            return if ok { Flow::Go } else { Flow::Stop };
        };
        let event_id = event
            .get("event_id")
            .and_then(Value::as_str)
            .map(String::from);
        let event_id = event_id.as_deref();
        let kind = event.get("type").and_then(Value::as_str).unwrap_or("");
        let ok = match (kind, self.session.is_some()) {
            ("session.start", false) => self.start(ws, &event, event_id).await,
            ("session.start", true) => {
                self.error(
                    ws,
                    "session_already_started",
                    None,
                    "This Live session has already started.",
                    event_id,
                )
                .await
            }
            (_, false) => {
                self.error(
                    ws,
                    "session_not_started",
                    None,
                    "Send session.start first and wait for session.started.",
                    event_id,
                )
                .await
            }
            ("session.close", true) => {
                self.close(ws, event_id).await;
                return Flow::Stop;
            }
            ("session.input_audio.append", true) => self.append(ws, &event, event_id).await,
            ("response.create", true) => self.delegate(ws, event_id).await,
            _ => true,
        };
        if ok {
            Flow::Go
        } else {
            Flow::Stop
        }
    }

    async fn start(&mut self, ws: &mut Ws, event: &Value, event_id: Option<&str>) -> bool {
        let mut session = event.get("session").cloned().unwrap_or(Value::Null);
        let model = session.get("model").and_then(Value::as_str).unwrap_or("");
        if let Some(inherited) = &self.inherited {
            if !model.is_empty() {
                return self
                    .error(
                        ws,
                        "invalid_value",
                        Some("session.model"),
                        "A fork inherits its model; do not supply one.",
                        event_id,
                    )
                    .await;
            }
            let Some(o) = session.as_object_mut() else {
                return self
                    .error(
                        ws,
                        "missing_required_parameter",
                        Some("session"),
                        "Missing required parameter: 'session'.",
                        event_id,
                    )
                    .await;
            };
            o.insert("model".into(), json!(inherited));
        } else if model.is_empty() {
            return self
                .error(
                    ws,
                    "missing_required_parameter",
                    Some("session.model"),
                    "Missing required parameter: 'session.model'.",
                    event_id,
                )
                .await;
        }
        let model = session
            .get("model")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        self.session = Some(session);
        self.started = Instant::now();
        self.ended = Some(self.handle.stats.calls.primary_started(&self.id, model));
        self.handle
            .stats
            .live_sessions
            .fetch_add(1, Ordering::Relaxed);
        let started = json!({"session": self.resource(), "client_event_id": event_id});
        self.send(ws, "session.started", started).await
    }

    async fn append(&mut self, ws: &mut Ws, event: &Value, event_id: Option<&str>) -> bool {
        let audio = event.get("audio").and_then(Value::as_str).unwrap_or("");
        let Ok(bytes) = base64::engine::general_purpose::STANDARD.decode(audio) else {
            return self
                .error(
                    ws,
                    "invalid_value",
                    Some("audio"),
                    "Invalid base64 audio.",
                    event_id,
                )
                .await;
        };
        if bytes.is_empty() {
            return true;
        }
        let delta = base64::engine::general_purpose::STANDARD.encode(vec![0u8; bytes.len()]);
        self.send(ws, "session.output_audio.delta", json!({"delta": delta}))
            .await
            && self
                .send(
                    ws,
                    "session.output_transcript.delta",
                    json!({"delta": "hello "}),
                )
                .await
    }

    /// One delegated response, or an error when the session has no
    /// Responses delegation (`response_create_event.py`: "Requires
    /// Responses delegation").
    async fn delegate(&mut self, ws: &mut Ws, event_id: Option<&str>) -> bool {
        let model = self
            .session
            .as_ref()
            .and_then(delegated_model)
            .map(String::from);
        let Some(model) = model else {
            return self
                .error(
                    ws,
                    "invalid_request_error",
                    Some("type"),
                    "response.create requires Responses delegation.",
                    event_id,
                )
                .await;
        };
        let offset_ms = self.started.elapsed().as_millis() as u64;
        let repeat = self.config.live.fault == Some(LiveFault::DelegatedCompletedRepeated);
        for (kind, rest) in delegated_events(&model, offset_ms, event_id, repeat) {
            if !self.send(ws, kind, rest).await {
                return false;
            }
        }
        self.handle
            .stats
            .live_delegated_responses
            .fetch_add(1, Ordering::Relaxed);
        true
    }

    /// `session.closed` with the final usage (unless the fault withholds
    /// it), then the close.
    async fn close(&mut self, ws: &mut Ws, event_id: Option<&str>) {
        let seconds = self.bill();
        let session = self.resource();
        // Billed once: the caller's end-of-run bill is skipped.
        self.session = None;
        if self.config.live.fault != Some(LiveFault::NoClosed) {
            let closed = json!({"reason": "close_requested", "session": session,
                                "usage": {"seconds": seconds}, "client_event_id": event_id});
            let _ = self.send(ws, "session.closed", closed).await;
        }
        let _ = ws.close(None).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::start;
    use crate::testing::{next_json, Client};

    async fn connect(sim: &crate::SimHandle) -> Client {
        crate::testing::connect(sim, "/v1/live/sessions").await
    }

    async fn send(ws: &mut Client, v: Value) {
        ws.send(Message::text(v.to_string())).await.unwrap();
    }

    fn fast(fault: Option<LiveFault>) -> SimConfig {
        SimConfig {
            live: LiveSim {
                usage_interval: Duration::from_millis(20),
                time_scale: 100.0,
                fault,
            },
            ..SimConfig::default()
        }
    }

    #[tokio::test]
    async fn a_live_session_starts_on_session_start_reports_cumulative_seconds_and_closes_with_the_total(
    ) {
        let sim = start("127.0.0.1:0".parse().unwrap(), fast(None))
            .await
            .unwrap();
        let mut ws = connect(&sim).await;
        send(
            &mut ws,
            json!({"type": "session.input_audio.append", "audio": ""}),
        )
        .await;
        let e = next_json(&mut ws).await.unwrap();
        assert_eq!(e["error"]["code"], "session_not_started");
        send(
            &mut ws,
            json!({"type": "session.start", "event_id": "s1", "session": {}}),
        )
        .await;
        let e = next_json(&mut ws).await.unwrap();
        assert_eq!(e["error"]["param"], "session.model");
        send(
            &mut ws,
            json!({"type": "session.start", "event_id": "s2", "session": {"model": "gpt-live-1"}}),
        )
        .await;
        let started = next_json(&mut ws).await.unwrap();
        assert_eq!(started["type"], "session.started");
        assert_eq!(started["client_event_id"], "s2");
        assert_eq!(started["session"]["model"], "gpt-live-1");
        assert_eq!(started["session"]["status"], "active");
        assert!(started["session"]["id"]
            .as_str()
            .unwrap()
            .starts_with("live_"));

        let mut last = 0;
        for _ in 0..3 {
            let u = next_json(&mut ws).await.unwrap();
            assert_eq!(u["type"], "session.usage.updated");
            let s = u["usage"]["seconds"].as_u64().unwrap();
            assert!(s >= last, "cumulative: {s} after {last}");
            last = s;
        }
        assert!(last > 0);
        send(&mut ws, json!({"type": "session.close"})).await;
        let closed = loop {
            let e = next_json(&mut ws).await.unwrap();
            if e["type"] != "session.usage.updated" {
                break e;
            }
        };
        assert_eq!(closed["type"], "session.closed");
        assert_eq!(closed["reason"], "close_requested");
        let total = closed["usage"]["seconds"].as_u64().unwrap();
        assert!(total >= last);
        assert!(next_json(&mut ws).await.is_none(), "then the close");
        assert_eq!(sim.stats.live_seconds.load(Ordering::Relaxed), total);
        assert_eq!(sim.stats.live_sessions.load(Ordering::Relaxed), 1);
    }

    /// Reads usage figures until `n` have arrived.
    async fn figures(ws: &mut Client, n: usize) -> Vec<u64> {
        let mut out = Vec::new();
        while out.len() < n {
            let u = next_json(ws).await.unwrap();
            out.push(u["usage"]["seconds"].as_u64().unwrap());
        }
        out
    }

    #[tokio::test]
    async fn usage_faults_repeat_reorder_lose_and_withhold_the_final_figure() {
        for fault in [
            LiveFault::UsageRepeated,
            LiveFault::UsageReordered,
            LiveFault::UsageLost,
            LiveFault::NoClosed,
        ] {
            let sim = start("127.0.0.1:0".parse().unwrap(), fast(Some(fault)))
                .await
                .unwrap();
            let mut ws = connect(&sim).await;
            send(
                &mut ws,
                json!({"type": "session.start", "session": {"model": "gpt-live-1"}}),
            )
            .await;
            assert_eq!(next_json(&mut ws).await.unwrap()["type"], "session.started");
            let got = figures(&mut ws, 6).await;
            match fault {
                LiveFault::UsageRepeated => {
                    assert!(got.chunks(2).all(|p| p[0] == p[1]), "{got:?}")
                }
                LiveFault::UsageReordered => {
                    assert!(got.chunks(2).all(|p| p[0] >= p[1]), "{got:?}");
                    assert!(got.chunks(2).any(|p| p[0] > p[1]), "{got:?}");
                }
                // Half are lost; the rest still rise.
                LiveFault::UsageLost => assert!(got.windows(2).all(|w| w[1] > w[0]), "{got:?}"),
                LiveFault::NoClosed => {
                    send(&mut ws, json!({"type": "session.close"})).await;
                    while let Some(e) = next_json(&mut ws).await {
                        assert_ne!(e["type"], "session.closed");
                    }
                    assert!(sim.stats.live_seconds.load(Ordering::Relaxed) > 0);
                }
                LiveFault::DelegatedCompletedRepeated => unreachable!("not a usage fault"),
            }
        }
    }

    /// The nested events of a delegated response, skipping usage events.
    async fn nested(ws: &mut Client) -> Value {
        loop {
            let e = next_json(ws).await.unwrap();
            if e["type"] != "session.usage.updated" {
                return e;
            }
        }
    }

    #[tokio::test]
    async fn response_create_delegates_to_the_sessions_responses_model_or_is_refused_without_one() {
        let config = fast(Some(LiveFault::DelegatedCompletedRepeated));
        let sim = start("127.0.0.1:0".parse().unwrap(), config).await.unwrap();
        let mut ws = connect(&sim).await;
        send(
            &mut ws,
            json!({"type": "session.start", "session": {"model": "gpt-live-1",
                   "delegation": {"type": "responses", "responses": {"model": "gpt-5.5"}}}}),
        )
        .await;
        assert_eq!(next_json(&mut ws).await.unwrap()["type"], "session.started");
        send(
            &mut ws,
            json!({"type": "response.create", "event_id": "c1"}),
        )
        .await;
        let created = nested(&mut ws).await;
        assert_eq!(created["type"], "session.delegation.created");
        assert_eq!(created["client_event_id"], "c1");
        let kinds: Vec<Value> = [
            nested(&mut ws).await,
            nested(&mut ws).await,
            nested(&mut ws).await,
        ]
        .into_iter()
        .map(|e| {
            assert_eq!(e["type"], "response.event");
            assert_eq!(e["delegation_id"], created["delegation"]["id"]);
            e["event"]["type"].clone()
        })
        .collect();
        // The fault repeats the completed event.
        assert_eq!(
            kinds,
            [
                "response.created",
                "response.completed",
                "response.completed"
            ]
        );
        assert_eq!(
            sim.stats.live_delegated_responses.load(Ordering::Relaxed),
            1
        );

        let mut ws = connect(&sim).await;
        send(
            &mut ws,
            json!({"type": "session.start", "session": {"model": "gpt-live-1"}}),
        )
        .await;
        assert_eq!(next_json(&mut ws).await.unwrap()["type"], "session.started");
        send(&mut ws, json!({"type": "response.create"})).await;
        assert_eq!(nested(&mut ws).await["type"], "error");
    }
}
