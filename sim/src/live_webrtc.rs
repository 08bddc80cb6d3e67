//! Simulated GPT-Live WebRTC sessions: the create, the call control, the
//! recording and forks over HTTP, and the sideband WebSocket, as the
//! official SDK describes them (openai-python `resources/live/live.py`
//! `create`, `resources/live/sessions.py`, `resources/live/sideband.py`,
//! `types/live/`):
//!
//! - `POST /v1/live/sessions` with JSON `{session, transport}`
//!   (`live_create_params.py`: `session.model` required, `transport.type`
//!   always `webrtc`, `transport.sdp` the offer) → 200
//!   `LiveCreateResponse` (`live_create_response.py`: `session.id`,
//!   `transport{type: "webrtc", sdp}` the answer); a missing model or
//!   offer, or another transport type → 400;
//! - `POST /v1/live/sessions/{id}/{accept,hangup,refer,reject}` → 200 with
//!   no body (`sessions.py`: `cast_to=NoneType`), recorded in
//!   [`crate::SimCalls::actions`]; `hangup` and `reject` end the session;
//!   an unknown id → 404;
//! - `GET /v1/live/sessions/{id}/content` → 200 `application/octet-stream`
//!   ([`recording`]; `sessions.py` `download_recording`: binary);
//! - `POST /v1/live/sessions/{id}/fork` (`session_fork_params.py`:
//!   `transport` required, `session` optional overrides) → 200
//!   `SessionForkResponse` (the same shape as the create's), a new session
//!   of the parent's model;
//! - `GET /v1/live/sessions/{id}/attach` (WebSocket, `graceful_close`
//!   optional; `sideband.py`): while the session is up, every
//!   [`crate::LiveSim::usage_interval`] a `session.usage.updated` with the
//!   cumulative seconds since the create (scaled by `time_scale`, whole
//!   seconds, `session_usage.py`); when it ends, `session.closed` with the
//!   final figure (`session_closed_event.py`), then a close 1000.
//!
//! What the simulated upstream bills for a WebRTC session is its final
//! figure (the connected time since the create, scaled, rounded down),
//! added to [`crate::SimStats::live_seconds`] once, when it ends.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use http::{header, HeaderValue, Method, Response, StatusCode};
use http_body_util::Full;
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::WebSocketStream;

use crate::calls::{lock, CallAction, CallKind, CreatedCall, SimCall};
use crate::config::{LiveFault, SimConfig};
use crate::handle::SimHandle;
use crate::wire::{short_id, SimIo};

/// The Live sessions collection, OpenAI's path and Azure GA's.
const COLLECTIONS: [&str; 2] = ["/v1/live/sessions", "/openai/v1/live/sessions"];

/// The simulated recording's length in bytes (silence).
pub const RECORDING_BYTES: usize = 4800;

type Answer = Response<Full<Bytes>>;

fn json_answer(status: StatusCode, body: Value) -> Answer {
    let mut r = Response::new(Full::new(Bytes::from(body.to_string())));
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r
}

fn error(status: StatusCode, code: &str, message: &str) -> Answer {
    json_answer(
        status,
        json!({"error": {"message": message, "type": "invalid_request_error", "code": code, "param": null}}),
    )
}

/// The part of `path` after a Live sessions collection, if it is one.
pub(crate) fn live_rest(path: &str) -> Option<&str> {
    COLLECTIONS.iter().find_map(|c| path.strip_prefix(c))
}

/// The session id of a sideband upgrade path (`…/sessions/{id}/attach`).
pub(crate) fn attach_id(path: &str) -> Option<String> {
    let rest = live_rest(path)?.strip_prefix('/')?;
    let id = rest.strip_suffix("/attach")?;
    (!id.is_empty() && !id.contains('/')).then(|| id.to_string())
}

/// The parent session id of a WebSocket fork path (`…/sessions/{id}/fork`).
pub(crate) fn fork_id(path: &str) -> Option<String> {
    let rest = live_rest(path)?.strip_prefix('/')?;
    let id = rest.strip_suffix("/fork")?;
    (!id.is_empty() && !id.contains('/')).then(|| id.to_string())
}

/// The seconds a session created at `created` bills when it ends at `end`.
fn billed(created: Instant, end: Instant, scale: f64) -> u64 {
    (end.saturating_duration_since(created).as_secs_f64() * scale).floor() as u64
}

/// A request under a Live sessions collection.
pub(crate) fn route(
    method: &Method,
    rest: &str,
    body: &[u8],
    key: String,
    config: &SimConfig,
    handle: &SimHandle,
) -> Answer {
    let rest = rest.trim_matches('/');
    if rest.is_empty() {
        if method != Method::POST {
            return error(
                StatusCode::METHOD_NOT_ALLOWED,
                "method_not_allowed",
                "use POST",
            );
        }
        return create(body, key, None, handle);
    }
    let mut parts = rest.splitn(2, '/');
    let (Some(id), Some(action)) = (parts.next(), parts.next()) else {
        return error(StatusCode::NOT_FOUND, "not_found", "no such route");
    };
    let known = lock(&handle.stats.calls.calls)
        .get(id)
        .filter(|c| c.kind == CallKind::Live)
        .map(|c| c.model.clone());
    let Some(model) = known else {
        return error(
            StatusCode::NOT_FOUND,
            "session_not_found",
            "Live session not found",
        );
    };
    match (method.as_str(), action) {
        ("GET", "content") => {
            let mut r = Response::new(Full::new(Bytes::from(recording())));
            r.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/octet-stream"),
            );
            r
        }
        ("POST", "fork") => create(body, key, Some(model), handle),
        ("POST", "accept" | "hangup" | "refer" | "reject") => {
            if matches!(action, "hangup" | "reject") {
                end(id, config, handle);
            }
            lock(&handle.stats.calls.actions).push(CallAction {
                call_id: id.to_string(),
                action: action.to_string(),
                body: serde_json::from_slice(body).unwrap_or(Value::Null),
                key,
            });
            Response::new(Full::new(Bytes::new()))
        }
        _ => error(StatusCode::NOT_FOUND, "not_found", "no such route"),
    }
}

/// The simulated recording: silence.
pub fn recording() -> Vec<u8> {
    vec![0u8; RECORDING_BYTES]
}

/// Ends a session and bills its final figure, once.
fn end(id: &str, config: &SimConfig, handle: &SimHandle) {
    let mut calls = lock(&handle.stats.calls.calls);
    let Some(c) = calls.get_mut(id) else { return };
    if c.ended_at.is_some() {
        return;
    }
    c.end();
    if c.primary {
        // A WebSocket session: its primary connection sees the end and
        // bills it ([`crate::live`]).
        return;
    }
    let seconds = billed(
        c.created_at,
        c.ended_at.unwrap_or_else(Instant::now),
        config.live.time_scale,
    );
    handle
        .stats
        .live_seconds
        .fetch_add(seconds, Ordering::Relaxed);
}

/// A create (or, with the parent's `model`, a fork): the answer and a new
/// session.
fn create(
    body: &[u8],
    key: String,
    parent_model: Option<Option<String>>,
    handle: &SimHandle,
) -> Answer {
    let Ok(Value::Object(req)) = serde_json::from_slice::<Value>(body) else {
        return error(
            StatusCode::BAD_REQUEST,
            "invalid_json",
            "The body must be a JSON object.",
        );
    };
    let transport = req.get("transport");
    if transport
        .and_then(|t| t.get("type"))
        .and_then(Value::as_str)
        != Some("webrtc")
    {
        return error(
            StatusCode::BAD_REQUEST,
            "invalid_value",
            "transport.type must be 'webrtc'.",
        );
    }
    let Some(sdp) = transport.and_then(|t| t.get("sdp")).and_then(Value::as_str) else {
        return error(
            StatusCode::BAD_REQUEST,
            "missing_required_parameter",
            "Missing required parameter: 'transport.sdp'.",
        );
    };
    let session = req.get("session").cloned();
    let model = match parent_model {
        // A fork's model is the stored session's (`media_session_fork_config_param.py`).
        Some(m) => m,
        None => session
            .as_ref()
            .and_then(|s| s.get("model"))
            .and_then(Value::as_str)
            .map(str::to_string),
    };
    let Some(model) = model.filter(|m| !m.is_empty()) else {
        return error(
            StatusCode::BAD_REQUEST,
            "missing_required_parameter",
            "Missing required parameter: 'session.model'.",
        );
    };
    let id = format!("live_{}", short_id());
    lock(&handle.stats.calls.calls)
        .insert(id.clone(), SimCall::new(CallKind::Live, true, Some(model)));
    lock(&handle.stats.calls.created).push(CreatedCall {
        call_id: id.clone(),
        sdp: sdp.to_string(),
        session,
        key,
    });
    handle.stats.live_sessions.fetch_add(1, Ordering::Relaxed);
    let answer = crate::offer::answer_for(sdp, &id);
    json_answer(
        StatusCode::OK,
        json!({"session": {"id": id}, "transport": {"type": "webrtc", "sdp": answer}}),
    )
}

/// Whether a client event is `session.close`.
fn is_close(text: &str) -> bool {
    serde_json::from_str::<Value>(text)
        .ok()
        .and_then(|v| v.get("type").and_then(Value::as_str).map(str::to_string))
        .as_deref()
        == Some("session.close")
}

/// One sideband of a live session: usage reports until the session ends,
/// then `session.closed` and the close.
pub(crate) async fn sideband(
    mut ws: WebSocketStream<SimIo>,
    id: String,
    config: &SimConfig,
    handle: SimHandle,
) {
    let found = lock(&handle.stats.calls.calls)
        .get(&id)
        .map(|c| (c.ended.clone(), c.created_at));
    let Some((ended, created)) = found else {
        return;
    };
    let period = config.live.usage_interval.max(Duration::from_millis(1));
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut seq = 0;
    let scale = config.live.time_scale;
    loop {
        tokio::select! {
            _ = ended.cancelled() => break,
            _ = tick.tick() => {
                seq += 1;
                let s = billed(created, Instant::now(), scale);
                let usage = json!({"usage": {"seconds": s}});
                if !handle.send_event(&mut ws, config.record, (&id, seq), "session.usage.updated", &usage).await {
                    return;
                }
            }
            msg = ws.next() => match msg {
                Some(Ok(Message::Close(_))) | Some(Err(_)) | None => {
                    let _ = ws.close(None).await;
                    return;
                }
                // `session.close` on a sideband ends the session
                // (`sideband.py`, `session.close`): every sideband then
                // gets `session.closed`.
                Some(Ok(Message::Text(t))) if is_close(&t) => end(&id, config, &handle),
                Some(Ok(_)) => {}
            },
        }
    }
    let end_at = lock(&handle.stats.calls.calls)
        .get(&id)
        .and_then(|c| c.ended_at)
        .unwrap_or_else(Instant::now);
    let closed = json!({"reason": "hangup", "session": {"id": id, "status": "active"},
                        "usage": {"seconds": billed(created, end_at, scale)}});
    seq += 1;
    // [`LiveFault::NoClosed`]: the sideband closes without the final figure.
    if config.live.fault != Some(LiveFault::NoClosed) {
        let _ = handle
            .send_event(
                &mut ws,
                config.record,
                (&id, seq),
                "session.closed",
                &closed,
            )
            .await;
    }
    let _ = ws.close(None).await;
    // Read to the close's answer (bounded), so the close is seen.
    let _ = tokio::time::timeout(Duration::from_secs(1), async {
        while let Some(Ok(m)) = ws.next().await {
            if let Message::Close(_) = m {
                break;
            }
        }
    })
    .await;
    let _ = ws.flush().await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sideband_paths_name_their_session() {
        assert_eq!(
            attach_id("/v1/live/sessions/live_1/attach").as_deref(),
            Some("live_1")
        );
        assert_eq!(
            attach_id("/openai/v1/live/sessions/x/attach").as_deref(),
            Some("x")
        );
        assert_eq!(attach_id("/v1/live/sessions"), None);
        assert_eq!(attach_id("/v1/live/sessions/a/b/attach"), None);
        assert_eq!(
            fork_id("/v1/live/sessions/live_1/fork").as_deref(),
            Some("live_1")
        );
        assert_eq!(fork_id("/v1/live/sessions/live_1/attach"), None);
        assert_eq!(live_rest("/v1/live/sessions/a/hangup"), Some("/a/hangup"));
    }

    #[test]
    fn a_session_bills_its_scaled_connected_time_in_whole_seconds() {
        let t0 = Instant::now();
        assert_eq!(billed(t0, t0 + Duration::from_millis(1_500), 10.0), 15);
        assert_eq!(billed(t0, t0 + Duration::from_millis(999), 1.0), 0);
    }
}
