//! The upgrade's checks, in the order OpenAI answers them: path, what the
//! session is for, the key, a session limit, a call's sideband; refusals
//! with OpenAI's status, code and wording.

use std::sync::atomic::Ordering;

use http::StatusCode;
use serde_json::json;
use tokio_tungstenite::tungstenite::handshake::server::{
    Callback, ErrorResponse, Request, Response,
};
use tokio_util::sync::CancellationToken;

use crate::config::{SimConfig, SimFault};
use crate::handle::SimStats;
use crate::wire::mask_key;

/// The upgrade's key check (a `Callback` rather than a closure: the return
/// type is tungstenite's, fixed by the trait).
pub(crate) struct UpgradeCheck<'a> {
    pub(crate) config: &'a SimConfig,
    pub(crate) stats: &'a SimStats,
    pub(crate) beta: &'a mut bool,
    pub(crate) transcription: &'a mut bool,
    /// A translation session (`…/realtime/translations`) and its model.
    pub(crate) translation: &'a mut Option<String>,
    /// A Live session's primary WebSocket (`…/live/sessions`).
    pub(crate) live: &'a mut bool,
    /// A Live WebRTC session's sideband (`…/live/sessions/{id}/attach`).
    pub(crate) live_attach: &'a mut Option<String>,
    /// A WebSocket fork of a Live session (`…/live/sessions/{id}/fork`):
    /// the parent's model, which the fork inherits.
    pub(crate) live_fork: &'a mut Option<String>,
    /// The call a sideband (`?call_id=`) attached to.
    pub(crate) call: &'a mut Option<(String, CancellationToken)>,
    /// Set when the upgrade took a [`SimFault::SessionLimit`] slot.
    pub(crate) slot: &'a mut bool,
}

impl Callback for UpgradeCheck<'_> {
    fn on_request(self, req: &Request, resp: Response) -> Result<Response, ErrorResponse> {
        let header = |n: &str| req.headers().get(n).and_then(|v| v.to_str().ok());
        let key = header("authorization")
            .and_then(|v| v.strip_prefix("Bearer "))
            .or_else(|| header("api-key"))
            .unwrap_or("");
        if let Ok(mut seen) = self.stats.auth_headers.lock() {
            seen.push(key.to_string());
        }
        *self.beta = header("openai-beta") == Some("realtime=v1");
        let query = req.uri().query().unwrap_or("").to_string();
        let params: Vec<(String, String)> = url::form_urlencoded::parse(query.as_bytes())
            .into_owned()
            .collect();
        *self.transcription = params
            .iter()
            .any(|(k, v)| k == "intent" && v == "transcription");
        let call_id = params
            .iter()
            .find(|(k, _)| k == "call_id")
            .map(|(_, v)| v.clone());
        // What the session is for: a model (Azure: a deployment), a call, or
        // a transcription session, which names no model in the URL (SDK:
        // `resources/realtime/realtime.py`, `connect()`: "Transcription
        // sessions use `intent=transcription`"; `model` is left out when
        // omitted).
        let names_what = *self.transcription
            || params.iter().any(|(k, v)| {
                matches!(k.as_str(), "model" | "deployment" | "call_id") && !v.is_empty()
            });
        if let Ok(mut seen) = self.stats.queries.lock() {
            seen.push(query);
        }
        if let Some(SimFault::Refuse { status }) = &self.config.fault {
            return Err(refusal(*status, "simulated refusal"));
        }
        // Where the SDKs connect: `…/realtime` (`/v1/realtime`, Azure's
        // `/openai/realtime` and `/openai/v1/realtime`) naming the model
        // (Azure: the deployment) or, for a call's sideband, the call.
        let model = params
            .iter()
            .find(|(k, _)| k == "model")
            .map(|(_, v)| v.clone())
            .filter(|m| !m.is_empty());
        // Translation sessions have their own endpoint and always name a
        // model (SDK: `resources/realtime/translations/translations.py`,
        // `connect(model=…)`: "The WebSocket URL requires a `model` query
        // parameter"), or, for a translation call's sideband, the call
        // (whose model it takes when it attaches, below).
        // A Live session names its model in `session.start`, never in the
        // URL (SDK: `types/live/session_resource.py`, `model`).
        let live = req.uri().path().ends_with(crate::live::LIVE_PATH_SUFFIX);
        *self.live = live;
        let attach = crate::live_webrtc::attach_id(req.uri().path());
        let fork = crate::live_webrtc::fork_id(req.uri().path());
        let live = live || attach.is_some() || fork.is_some();
        if live {
            // Nothing in the URL to check.
        } else if req.uri().path().ends_with("/realtime/translations") {
            match (model, &call_id) {
                (Some(model), _) => *self.translation = Some(model),
                (None, Some(_)) => *self.translation = Some(String::new()),
                (None, None) => {
                    return Err(refusal(400, "Missing required parameter: 'model'."));
                }
            }
        } else if !req.uri().path().ends_with("/realtime") {
            return Err(refusal_coded(
                404,
                "invalid_url",
                "Invalid URL: no WebSocket endpoint here.",
            ));
        }
        if !names_what && !live {
            return Err(refusal(400, "Missing required parameter: 'model'."));
        }
        if self.stats.refusing.load(Ordering::Relaxed) {
            return Err(refusal(401, "Incorrect API key provided."));
        }
        let known = self.config.keys.is_empty() || self.config.keys.iter().any(|k| k == key);
        if key.is_empty() || !known {
            // OpenAI's wording, with the key masked the way it masks it.
            let message = format!(
                "Incorrect API key provided: {}. You can find your API key at https://platform.openai.com/account/api-keys.",
                mask_key(key)
            );
            return Err(refusal(401, &message));
        }
        if let Some(SimFault::SessionLimit { max }) = &self.config.fault {
            let took = self
                .stats
                .limited
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                    (n < *max).then_some(n + 1)
                });
            if took.is_err() {
                return Err(refusal(429, "Too many concurrent sessions for this key."));
            }
            *self.slot = true;
        }
        if let Some(id) = attach {
            if !self.stats.calls.live_up(&id) {
                return Err(refusal_coded(
                    404,
                    "session_not_found",
                    "Live session not found",
                ));
            }
            *self.live = false;
            *self.live_attach = Some(id);
        }
        if let Some(id) = fork {
            let Some(model) = self.stats.calls.live_model(&id) else {
                return Err(refusal_coded(
                    404,
                    "session_not_found",
                    "Live session not found",
                ));
            };
            *self.live = true;
            *self.live_fork = Some(model);
        }
        if let Some(id) = call_id {
            match self.stats.calls.attach(&id, self.translation.is_some()) {
                Some((ended, model)) => {
                    if let (Some(t), Some(m)) = (self.translation.as_mut(), model) {
                        *t = m;
                    }
                    *self.call = Some((id, ended));
                }
                None => return Err(refusal(404, "call not found")),
            }
        }
        Ok(resp)
    }
}

fn refusal(status: u16, message: &str) -> ErrorResponse {
    let code = match status {
        400 => "missing_required_parameter",
        401 => "invalid_api_key",
        404 => "call_not_found",
        429 => "rate_limit_exceeded",
        _ => "server_error",
    };
    refusal_coded(status, code, message)
}

fn refusal_coded(status: u16, code: &str, message: &str) -> ErrorResponse {
    let body = json!({"error": {"message": message, "type": "invalid_request_error", "code": code, "param": null}});
    let mut resp = http::Response::new(Some(body.to_string()));
    *resp.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    resp.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    if status == 429 {
        resp.headers_mut().insert(
            http::header::RETRY_AFTER,
            http::HeaderValue::from_static("2"),
        );
    }
    resp
}
