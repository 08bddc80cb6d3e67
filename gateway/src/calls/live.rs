//! GPT-Live WebRTC sessions on the client listener (openai-python
//! `resources/live/live.py` `create`, `resources/live/sessions.py`):
//! `POST /v1/live/sessions` (JSON `{session, transport}`, answered with
//! `LiveCreateResponse`), `POST /v1/live/sessions/{id}/fork`, `GET
//! /v1/live/sessions/{id}/content` (the recording) and
//! `POST /v1/live/sessions/{id}/{accept,hangup,refer,reject}`, the same
//! under `/openai`.
//!
//! A Live WebRTC session is a call like `/v1/realtime/calls`' in all but
//! its wire shapes: the same authentication (a client key; OpenAI's Live
//! takes no ephemeral client secrets, so neither does the gateway), the same
//! admission ([`Gateway::admit`] on the model in `session.model`, before
//! anything goes upstream), the same owners ([`super::ownership`], in
//! Redis too) so that another key gets 404, and the same sideband and
//! hand-over ([`super::sideband`], here `…/{id}/attach`, metered by the
//! cumulative seconds it reports: [`crate::metering::live`]). An ended
//! session's owner is kept ([`super::ownership::Owners::retire`]): its
//! recording and forks are asked for after it ended.
//!
//! A fork is a new session (`types/live/session_fork_params.py`: no model;
//! "the model ... come[s] from the stored session"): its model is the
//! parent's, read from the parent's owner record; it is admitted for the
//! forking key as a create is, owned by it, and metered on its own
//! sideband.
//!
//! The upstream answers a create or fork with a JSON body naming the new
//! session (`types/live/live_create_response.py`: `session.id`,
//! `transport.sdp`); it is relayed as received, and only then are the
//! owner and the sideband created.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use http::{header, StatusCode};
use serde_json::{Map, Value};
use tokio::time::Instant;

use crate::admission::Refusal;
use crate::auth::KeyEntry;
use crate::config::Endpoint;
use crate::gateway::Route;
use crate::http_error::ApiError;

use super::api::{
    act_at, control_key, find_route, owner_of, read_body, refuse, refuse_action, relay_answer,
    start_call, wrong_endpoint, CallsState,
};
use super::ownership::may_act;
use super::refusals::{
    bad_request, route_refusal, session_not_found, unreachable_refusal, upstream_refusal,
};
use super::sideband::Call;
use super::upstream::{self, call_id_from_location};
use super::Transport;

/// The Live sessions collection, OpenAI's path and Azure GA's.
pub const LIVE_SESSIONS_PATHS: [&str; 2] = crate::session::LIVE_PATHS;

/// A create's or fork's body: a JSON object whose `transport` is WebRTC
/// with an offer (`live_create_params.py`, `session_fork_params.py`).
pub fn read_offer(body: &[u8]) -> Result<Map<String, Value>, Refusal> {
    let Ok(Value::Object(req)) = serde_json::from_slice::<Value>(body) else {
        return Err(bad_request(
            "invalid_json",
            "the body must be a JSON object with 'session' and 'transport'",
        ));
    };
    let transport = req.get("transport");
    if transport
        .and_then(|t| t.get("type"))
        .and_then(Value::as_str)
        != Some("webrtc")
    {
        return Err(
            bad_request("invalid_value", "transport.type must be 'webrtc'")
                .with_param("transport.type"),
        );
    }
    if transport
        .and_then(|t| t.get("sdp"))
        .and_then(Value::as_str)
        .is_none()
    {
        return Err(bad_request(
            "missing_required_parameter",
            "missing required parameter: 'transport.sdp'",
        )
        .with_param("transport.sdp"));
    }
    Ok(req)
}

/// A create's model: `session.model`, required.
pub fn session_model(req: &Map<String, Value>) -> Result<String, Refusal> {
    let model = req
        .get("session")
        .and_then(|s| s.get("model"))
        .and_then(Value::as_str)
        .filter(|m| !m.is_empty())
        .map(str::to_string);
    model.ok_or_else(|| {
        bad_request(
            "missing_required_parameter",
            "missing required parameter: 'session.model'",
        )
        .with_param("session.model")
    })
}

/// The new session's id in the upstream's answer (`session.id`), if safe.
fn answered_id(body: &[u8]) -> Option<String> {
    let v: Value = serde_json::from_slice(body).ok()?;
    let id = v.get("session")?.get("id")?.as_str()?;
    (call_id_from_location(id).as_deref() == Some(id)).then(|| id.to_string())
}

/// `POST /v1/live/sessions`.
pub(super) async fn create(
    State(st): State<CallsState>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let gw = &st.gw;
    let started = Instant::now();
    let (key, body) = match key_and_body(gw, &headers, body).await {
        Ok(kb) => kb,
        Err(r) => return refuse(gw, "", r),
    };
    let read = read_offer(&body).and_then(|req| Ok((session_model(&req)?, req)));
    let (model, mut req) = match read {
        Ok(r) => r,
        Err(r) => return refuse(gw, "", r),
    };
    let route = match find_route(gw, &model) {
        Ok(r) => r,
        Err(r) => return refuse(gw, "", r.with_param("session.model")),
    };
    if route.config.endpoint != Endpoint::Live {
        return refuse(gw, &model, wrong_endpoint(&model, route.config.endpoint));
    }
    if let Some(s) = req.get_mut("session").and_then(Value::as_object_mut) {
        s.insert("model".into(), route.config.upstream_model().into());
    }
    let opening = Opening {
        key,
        route,
        started,
        parent: None,
        trace: gw.telemetry.parent(&headers),
    };
    open(&st, opening, req).await
}

/// A session being opened: created, or forked from `parent`.
struct Opening {
    key: KeyEntry,
    route: Arc<Route>,
    started: Instant,
    parent: Option<String>,
    trace: Option<crate::telemetry::context::TraceParent>,
}

/// What every Live POST starts with: a gateway not draining, a valid key, a body within bounds.
async fn key_and_body(
    gw: &crate::gateway::Gateway,
    headers: &HeaderMap,
    body: Body,
) -> Result<(KeyEntry, axum::body::Bytes), Refusal> {
    if gw.sessions.is_draining() {
        return Err(Refusal::draining());
    }
    let key = control_key(gw, headers)?;
    Ok((key, read_body(gw, body).await?))
}

/// Admits, asks the upstream, and on its answer records the owner and
/// attaches the sideband.
async fn open(st: &CallsState, o: Opening, req: Map<String, Value>) -> Response {
    let gw = &st.gw;
    let model = o.route.config.model.clone();
    let url = match &o.parent {
        Some(parent) => upstream::action_url(&o.route.config, parent, "fork"),
        None => upstream::calls_url(&o.route.config),
    };
    let url = match url {
        Ok(u) => u,
        Err(e) => return refuse(gw, &model, route_refusal(&model, &e)),
    };
    let session_id = crate::ids::short_id();
    let permit = match gw.admit(&o.key, &o.route, &session_id).await {
        Ok(p) => p,
        Err(r) => return refuse(gw, &model, r),
    };
    let timeout = Duration::from_secs(gw.config.server.upgrade_timeout_secs);
    let body = Value::Object(req).to_string().into_bytes();
    let answer = match upstream::post(
        &o.route.config,
        &url,
        Some("application/json"),
        body,
        timeout,
    )
    .await
    {
        Ok(a) => a,
        Err(e) => {
            tracing::warn!(model = %model, error = %e, "live session create: upstream unreachable");
            return refuse(gw, &model, unreachable_refusal(&e));
        }
    };
    if !answer.status.is_success() {
        tracing::warn!(model = %model, status = answer.status.as_u16(), "live session create refused upstream");
        let r = match answer.status {
            StatusCode::NOT_FOUND => session_not_found(o.parent.as_deref().unwrap_or("")),
            s => upstream_refusal(s),
        };
        return refuse(gw, &model, r);
    }
    let Some(id) = answered_id(&answer.body) else {
        tracing::warn!(model = %model, "live session create: the upstream answer names no session");
        let r = Refusal::new(
            StatusCode::BAD_GATEWAY,
            "server_error",
            "upstream_bad_answer",
            "the upstream's answer named no session",
        );
        return refuse(gw, &model, r);
    };
    if let Some(parent) = &o.parent {
        tracing::info!(live_session_id = %id, parent = %parent, key_id = %o.key.id, "live session forked");
    }
    let call = Call {
        id,
        session_id,
        transport: Transport::WebRtc,
        key: o.key,
        client_secret_id: None,
        route: o.route,
        permit,
        started: o.started,
        trace: o.trace,
    };
    start_call(st, call).await;
    relay_answer(answer, None)
}

/// The owner's route for `id` (`Err`: the answer, a 404 for anyone else).
pub(super) async fn owned_route(
    st: &CallsState,
    key: &KeyEntry,
    id: &str,
) -> Result<Arc<Route>, Refusal> {
    if call_id_from_location(id).as_deref() != Some(id) {
        return Err(session_not_found(id));
    }
    let owner = owner_of(st, id).await?.filter(|o| may_act(o, key));
    let Some(owner) = owner.filter(|o| !o.accepting) else {
        return Err(session_not_found(id));
    };
    let route = find_route(&st.gw, &owner.model).map_err(|_| session_not_found(id))?;
    if route.config.endpoint != Endpoint::Live {
        return Err(session_not_found(id));
    }
    Ok(route)
}

/// `POST /v1/live/sessions/{id}/fork`.
pub(super) async fn fork(
    State(st): State<CallsState>,
    path: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let gw = &st.gw;
    let started = Instant::now();
    let Ok(Path(parent)) = path else {
        return refuse(
            gw,
            "",
            bad_request("invalid_session_id", "the session id is not valid UTF-8"),
        );
    };
    let (key, body) = match key_and_body(gw, &headers, body).await {
        Ok(kb) => kb,
        Err(r) => return refuse(gw, "", r),
    };
    let route = match owned_route(&st, &key, &parent).await {
        Ok(r) => r,
        Err(r) => return refuse(gw, "", r),
    };
    let req = match read_offer(&body) {
        Ok(req) => req,
        Err(r) => return refuse(gw, &route.config.model, r),
    };
    let opening = Opening {
        key,
        route,
        started,
        parent: Some(parent),
        trace: gw.telemetry.parent(&headers),
    };
    open(&st, opening, req).await
}

/// `GET /v1/live/sessions/{id}/content`: the recording, from the upstream,
/// for the session's owner only, streamed as the upstream sends it (each
/// part within `upgrade_timeout_secs` of the last, at most
/// [`upstream::MAX_RECORDING_BYTES`]).
pub(super) async fn content(
    State(st): State<CallsState>,
    path: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
) -> Response {
    let gw = &st.gw;
    let Ok(Path(id)) = path else {
        return refuse_action(
            gw,
            "content",
            bad_request("invalid_session_id", "the session id is not valid UTF-8"),
        );
    };
    let key = match control_key(gw, &headers) {
        Ok(k) => k,
        Err(r) => return refuse_action(gw, "content", r),
    };
    let route = match owned_route(&st, &key, &id).await {
        Ok(r) => r,
        Err(r) => return refuse_action(gw, "content", r),
    };
    let url = match upstream::action_url(&route.config, &id, "content") {
        Ok(u) => u,
        Err(e) => return refuse_action(gw, "content", route_refusal(&route.config.model, &e)),
    };
    let timeout = Duration::from_secs(gw.config.server.upgrade_timeout_secs);
    match upstream::get_streamed(&route.config, &url, timeout).await {
        Ok(a) if a.status.is_success() => {
            // Relayed as it comes, never held whole.
            let mut r = Response::new(Body::from_stream(a.body));
            for name in [header::CONTENT_TYPE, header::CONTENT_LENGTH] {
                if let Some(v) = a.headers.get(&name) {
                    r.headers_mut().insert(name, v.clone());
                }
            }
            r
        }
        Ok(a) if a.status == StatusCode::NOT_FOUND => {
            ApiError(session_not_found(&id)).into_response()
        }
        Ok(a) => refuse_action(gw, "content", upstream_refusal(a.status)),
        Err(e) => refuse_action(gw, "content", unreachable_refusal(&e)),
    }
}

/// `POST /v1/live/sessions/{id}/{accept,hangup,refer,reject}`.
pub(super) async fn act(
    State(st): State<CallsState>,
    path: Result<Path<(String, String)>, PathRejection>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    act_at(st, Endpoint::Live, path, headers, body).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_create_needs_a_webrtc_offer_and_a_model_and_a_fork_only_the_offer() {
        let ok = br#"{"session":{"model":"gpt-live-1"},"transport":{"type":"webrtc","sdp":"v=0"}}"#;
        let model = read_offer(ok).and_then(|r| session_model(&r));
        assert_eq!(model.ok().as_deref(), Some("gpt-live-1"));
        let code = |b: &[u8], fork: bool| {
            read_offer(b)
                .and_then(|r| {
                    if fork {
                        Ok(String::new())
                    } else {
                        session_model(&r)
                    }
                })
                .err()
                .map(|r| r.code)
        };
        assert_eq!(code(b"[]", false), Some("invalid_json"));
        assert_eq!(
            code(
                br#"{"session":{"model":"m"},"transport":{"type":"sip","sdp":"v=0"}}"#,
                false
            ),
            Some("invalid_value")
        );
        assert_eq!(
            code(
                br#"{"session":{"model":"m"},"transport":{"type":"webrtc"}}"#,
                false
            ),
            Some("missing_required_parameter")
        );
        assert_eq!(
            code(
                br#"{"session":{},"transport":{"type":"webrtc","sdp":"v=0"}}"#,
                false
            ),
            Some("missing_required_parameter")
        );
        assert_eq!(
            code(br#"{"transport":{"type":"webrtc","sdp":"v=0"}}"#, true),
            None
        );
    }

    #[test]
    fn the_new_session_is_read_from_the_answer_only_when_its_id_is_safe() {
        let a = |id: &str| {
            format!(r#"{{"session":{{"id":"{id}"}},"transport":{{"type":"webrtc","sdp":"v=0"}}}}"#)
        };
        assert_eq!(
            answered_id(a("live_1").as_bytes()).as_deref(),
            Some("live_1")
        );
        assert_eq!(answered_id(a("../x").as_bytes()), None);
        assert_eq!(answered_id(b"{}"), None);
    }
}
