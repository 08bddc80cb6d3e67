//! A GPT-Live session's start on its primary WebSocket (`GET
//! /v1/live/sessions`), up to the point where it is a session like any
//! other ([`Session`]).
//!
//! A Live client names its model in its first event, `session.start`
//! (openai-python `types/live/session_start_event.py`; "do not pass it as a
//! URL query parameter", `session_resource.py`), so the checks before the
//! `101` (draining 503, the credential 401) cannot include the model or the
//! admission. The gateway upgrades, then reads that first event (within
//! `upgrade_timeout_secs`) and decides, still before anything is dialled:
//! - not a `session.start` (or not one whole text message), no
//!   `session.model`, or not JSON: `session_not_started`,
//!   `missing_required_parameter` or `invalid_json`;
//! - a model no route serves: `model_not_found`; a route that is not a Live
//!   route: `wrong_endpoint`;
//! - a Responses delegation to a model outside the key's (or its team's)
//!   `models`: `model_not_allowed` (`param` `session.delegation.responses.model`);
//! - under `unpriced = "block"`, a Responses delegation to a model without
//!   a token price (`session.delegation.responses.model`):
//!   `model_not_priced` ([`delegated::unpriced_start_model`]; its usage is
//!   charged at that model's rates, [`crate::metering::delegated`]);
//! - then [`Gateway::admit`] as for every session (the key's models,
//!   caps, rpm, tpm, budgets, unpriced, fleet leases), its refusal's code.
//!
//! A refusal is an `error` event shaped as Live's (`types/live/error.py`,
//! its `client_event_id`) and a close — 1013 ("try again later") for a
//! refusal that says to retry (429, 503), 1008 for the rest — counted in
//! `patchbay_admission_refusals_total` and written as the upgrade's access
//! line with the refusal's status and code, as a refused upgrade's is. The
//! SDK expects this: "A successful upgrade can still be followed by an
//! admission error" (`resources/live/live.py`).
//!
//! A WebSocket fork (`GET /v1/live/sessions/{id}/fork`, openai-python
//! `resources/live/forks.py`) starts the same way once its parent's owner
//! was checked before the `101` ([`Fork`], by the calls routes): its
//! `session.start` names no model (one that does is `invalid_value`), the
//! route is the parent's, and the admission is the forking key's. It is
//! then a Live WebSocket session like any other, metered the same way.
//!
//! An admitted session is dialled fresh (no pooled socket can carry the
//! start), its `session.start` sent upstream with the route's upstream
//! model, and `session.started` is its first event
//! ([`crate::upstream::dial::Upstream::dial_live`]).

use std::sync::Arc;
use std::time::Duration;

use http::StatusCode;
use serde_json::Value;
use tokio::time::Instant;

use crate::access::{self, Origin};
use crate::admission::Refusal;
use crate::auth::KeyEntry;
use crate::config::Endpoint;
use crate::gateway::{Gateway, Route};
use crate::http_error::count_refusal;
use crate::metering::delegated;
use crate::relay::client_text::unmasked;
use crate::relay::frame::FrameRole;
use crate::session::{
    end_before_session, going_away, next_client_data, open_client, ClientSocket, ClientStart,
    LiveStart, Session,
};

/// A Live upgrade that passed the checks before the `101`.
pub struct LivePending {
    pub gateway: Arc<Gateway>,
    pub key: KeyEntry,
    /// When the upgrade request arrived.
    pub started: Instant,
    pub origin: Box<Origin>,
    /// A WebSocket fork (`GET …/{id}/fork`): the parent and its route.
    pub fork: Option<Box<Fork>>,
}

/// The parent of a WebSocket fork, whose owner the forking key is (checked
/// before the `101`), and the route of its model, which the fork inherits.
#[derive(Debug)]
pub struct Fork {
    pub parent: String,
    pub route: Arc<Route>,
}

/// What the first event asked for.
struct Start {
    event: Value,
    /// The model named (never, for a fork's start).
    model: Option<String>,
    event_id: Option<String>,
}

/// A refusal after the `101`, and the model it concerned (once known).
struct Refused {
    refusal: Refusal,
    model: Option<String>,
    event_id: Option<String>,
}

impl Refused {
    fn new(refusal: Refusal) -> Self {
        Self {
            refusal,
            model: None,
            event_id: None,
        }
    }
}

impl LivePending {
    /// Upgrades, reads `session.start`, admits, and runs the session.
    pub async fn run(self, start: ClientStart) {
        let gw = self.gateway.clone();
        let Some(mut client) = open_client(&gw, start).await else {
            self.line(
                StatusCode::SWITCHING_PROTOCOLS,
                None,
                Some("upgrade_failed"),
            );
            return;
        };
        let timeout = Duration::from_secs(gw.config.server.upgrade_timeout_secs);
        let first = tokio::select! {
            f = tokio::time::timeout(timeout, next_client_data(&mut client)) => f,
            _ = gw.shutdown.cancelled() => {
                going_away(&mut client).await;
                self.line(StatusCode::SWITCHING_PROTOCOLS, None, Some("shutdown"));
                return;
            }
        };
        let first = match first {
            Ok(Some(f)) => f,
            Ok(None) => {
                self.line(
                    StatusCode::SWITCHING_PROTOCOLS,
                    None,
                    Some("client_left_before_session"),
                );
                return;
            }
            Err(_) => {
                let r = Refusal::new(
                    StatusCode::REQUEST_TIMEOUT,
                    "invalid_request_error",
                    "session_not_started",
                    format!(
                        "no session.start within {}s of the upgrade",
                        timeout.as_secs()
                    ),
                );
                self.refuse(&mut client, Refused::new(r)).await;
                return;
            }
        };
        let whole = matches!(
            first.role,
            FrameRole::Data {
                text: true,
                last: true
            }
        );
        let started = if whole {
            read_start(&unmasked(&first), self.fork.is_some())
        } else {
            Err(Box::new(Refused::new(not_started(
                "send session.start first, as one text message",
            ))))
        };
        drop(first);
        let start = match started {
            Ok(s) => s,
            Err(r) => return self.refuse(&mut client, *r).await,
        };
        let session = match self.admit(&start).await {
            Ok(s) => s,
            Err(r) => return self.refuse(&mut client, r).await,
        };
        Box::pin(session.run(ClientStart::Open(Box::new(client)))).await;
    }

    /// The route of the start's model, and the admission.
    async fn admit(&self, start: &Start) -> Result<Session, Refused> {
        let gw = &self.gateway;
        let refused = |refusal: Refusal, model: Option<String>| Refused {
            refusal,
            model,
            event_id: start.event_id.clone(),
        };
        let model = start.model.as_deref().unwrap_or_default();
        let route = match &self.fork {
            Some(f) => Some(f.route.clone()),
            None => gw.route(model).cloned(),
        };
        let Some(route) = route else {
            let r = Refusal::new(
                StatusCode::NOT_FOUND,
                "invalid_request_error",
                "model_not_found",
                format!("the model '{model}' is not served by this gateway"),
            )
            .with_param("session.model");
            return Err(refused(r, None));
        };
        if route.config.endpoint != Endpoint::Live {
            let r = Refusal::new(
                StatusCode::BAD_REQUEST,
                "invalid_request_error",
                "wrong_endpoint",
                format!(
                    "the model '{}' is not a Live model: it is served at {}",
                    route.config.model,
                    route.config.endpoint.openai_path()
                ),
            )
            .with_param("session.model");
            return Err(refused(r, Some(route.config.model.clone())));
        }
        if gw.sessions.is_draining() {
            return Err(refused(Refusal::draining(), None));
        }
        // A model named in a frame is held to the key's allow-list as the session's own is.
        if let Some(m) = delegated::start_model(&start.event) {
            let keys = gw.keys.get();
            let team = self.key.team.as_deref().and_then(|t| keys.team(t));
            if !crate::auth::model_allowed(&self.key, team, m) {
                let r =
                    Refusal::model_not_allowed(m).with_param("session.delegation.responses.model");
                return Err(refused(r, Some(route.config.model.clone())));
            }
        }
        if gw.metering.config().unpriced == crate::config::Unpriced::Block {
            let names: Vec<String> = route
                .config
                .upstream_list()
                .iter()
                .map(|u| u.name.clone())
                .collect();
            let names: Vec<&str> = names.iter().map(String::as_str).collect();
            let prices = gw.metering.prices();
            if let Some(m) = delegated::unpriced_start_model(&start.event, &prices, &names) {
                let r = Refusal::new(
                    StatusCode::PAYMENT_REQUIRED,
                    "invalid_request_error",
                    "model_not_priced",
                    format!("the delegated model '{m}' has no price configured and this gateway refuses unpriced models"),
                )
                .with_param("session.delegation.responses.model");
                return Err(refused(r, Some(route.config.model.clone())));
            }
        }
        let session_id = crate::ids::short_id();
        let permit = gw
            .admit(&self.key, &route, &session_id)
            .await
            .map_err(|r| refused(r, Some(route.config.model.clone())))?;
        Ok(Session {
            id: session_id,
            gateway: gw.clone(),
            route,
            key: self.key.clone(),
            client_secret: None,
            permit,
            params: Vec::new(),
            started: self.started,
            origin: self.origin.clone(),
            live_start: Some(Box::new(LiveStart {
                event: start.event.clone(),
                fork_of: self.fork.as_ref().map(|f| f.parent.clone()),
            })),
        })
    }

    /// Answers a refusal: the `error` event and the close, counted and
    /// logged.
    async fn refuse(&self, client: &mut ClientSocket, r: Refused) {
        let Refused {
            refusal,
            model,
            event_id,
        } = r;
        count_refusal(&self.gateway, model.as_deref().unwrap_or(""), &refusal);
        let code = if matches!(
            refusal.status,
            StatusCode::TOO_MANY_REQUESTS | StatusCode::SERVICE_UNAVAILABLE
        ) {
            crate::relay::code::TRY_AGAIN_LATER
        } else {
            crate::relay::code::POLICY
        };
        let event = error_event(&refusal, event_id.as_deref());
        end_before_session(client, event, code, refusal.code).await;
        let line = access::Line {
            kind: "websocket",
            method: "GET",
            path: &self.origin.path,
            status: refusal.status.as_u16(),
            code: Some(refusal.code),
            outcome: None,
            key_id: Some(&self.key.id),
            model: model.as_deref(),
            client: self.origin.client,
            duration: self.started.elapsed(),
        };
        if self.gateway.config.server.access_log {
            line.emit();
        }
    }

    /// The access line of an upgrade that ended before its session did.
    fn line(&self, status: StatusCode, code: Option<&str>, outcome: Option<&str>) {
        if !self.gateway.config.server.access_log {
            return;
        }
        access::Line {
            kind: "websocket",
            method: "GET",
            path: &self.origin.path,
            status: status.as_u16(),
            code,
            outcome,
            key_id: Some(&self.key.id),
            model: None,
            client: self.origin.client,
            duration: self.started.elapsed(),
        }
        .emit();
    }
}

fn not_started(message: &str) -> Refusal {
    Refusal::new(
        StatusCode::BAD_REQUEST,
        "invalid_request_error",
        "session_not_started",
        message,
    )
}

/// The first event: a `session.start` naming its model, or for a fork
/// (`fork`) naming none (openai-python `fork_session_start_event_param.py`:
/// "do not supply a new model").
fn read_start(text: &[u8], fork: bool) -> Result<Start, Box<Refused>> {
    let Ok(event) = serde_json::from_slice::<Value>(text) else {
        let r = Refusal::new(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            "invalid_json",
            "the first event is not a JSON object: send session.start first",
        );
        return Err(Box::new(Refused::new(r)));
    };
    let event_id = event
        .get("event_id")
        .and_then(Value::as_str)
        .map(str::to_string);
    let with_id = |refusal: Refusal| {
        Box::new(Refused {
            refusal,
            model: None,
            event_id: event_id.clone(),
        })
    };
    if event.get("type").and_then(Value::as_str) != Some("session.start") {
        return Err(with_id(not_started(
            "send session.start first and wait for session.started",
        )));
    }
    let model = event
        .get("session")
        .and_then(|s| s.get("model"))
        .and_then(Value::as_str)
        .filter(|m| !m.is_empty())
        .map(str::to_string);
    match (&model, fork) {
        (None, false) => {
            let r = Refusal::new(
                StatusCode::BAD_REQUEST,
                "invalid_request_error",
                "missing_required_parameter",
                "missing required parameter: 'session.model'",
            )
            .with_param("session.model");
            return Err(with_id(r));
        }
        (Some(_), true) => {
            let r = Refusal::new(
                StatusCode::BAD_REQUEST,
                "invalid_request_error",
                "invalid_value",
                "a fork inherits its parent's model: send session.start without session.model",
            )
            .with_param("session.model");
            return Err(with_id(r));
        }
        _ => {}
    }
    Ok(Start {
        event,
        model,
        event_id,
    })
}

/// A refusal as a Live `error` event (`types/live/error_event.py`).
fn error_event(r: &Refusal, client_event_id: Option<&str>) -> String {
    serde_json::json!({
        "type": "error",
        "event_id": format!("event_patchbay_{}", crate::ids::short_id()),
        "error": {
            "type": r.kind,
            "code": r.code,
            "message": r.message,
            "param": r.param,
            "client_event_id": client_event_id,
        },
        "client_event_id": client_event_id,
    })
    .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_event_must_be_a_session_start_naming_a_model() {
        let s = read_start(
            br#"{"type":"session.start","event_id":"e1","session":{"model":"gpt-live-1"}}"#,
            false,
        )
        .ok()
        .unwrap();
        assert_eq!(
            (s.model.as_deref(), s.event_id.as_deref()),
            (Some("gpt-live-1"), Some("e1"))
        );
        let code = |t: &[u8]| {
            read_start(t, false)
                .err()
                .map(|r| (r.refusal.code, r.event_id))
        };
        assert_eq!(code(b"nope"), Some(("invalid_json", None)));
        assert_eq!(
            code(br#"{"type":"session.update","event_id":"e2","session":{}}"#),
            Some(("session_not_started", Some("e2".into())))
        );
        assert_eq!(
            code(br#"{"type":"session.start","session":{"model":""}}"#),
            Some(("missing_required_parameter", None))
        );
        assert_eq!(
            code(br#"{"type":"session.start","session":{"model":5}}"#),
            Some(("missing_required_parameter", None))
        );
    }

    #[test]
    fn a_forks_first_event_is_a_session_start_naming_no_model() {
        let fork = |t: &[u8]| {
            read_start(t, true)
                .map(|s| s.model)
                .map_err(|r| r.refusal.code)
        };
        assert_eq!(fork(br#"{"type":"session.start","session":{}}"#), Ok(None));
        assert_eq!(
            fork(br#"{"type":"session.start","session":{"model":"gpt-live-1"}}"#),
            Err("invalid_value")
        );
        assert_eq!(
            fork(br#"{"type":"session.update","session":{}}"#),
            Err("session_not_started")
        );
    }

    #[test]
    fn a_refusal_is_a_live_error_event_naming_the_clients_event() {
        let r = Refusal::new(
            StatusCode::PAYMENT_REQUIRED,
            "invalid_request_error",
            "budget_exceeded",
            "spent",
        )
        .with_param("session.model");
        let v: Value = serde_json::from_str(&error_event(&r, Some("e9"))).unwrap();
        assert_eq!(v["type"], "error");
        assert_eq!(v["error"]["code"], "budget_exceeded");
        assert_eq!(v["error"]["param"], "session.model");
        assert_eq!(v["error"]["client_event_id"], "e9");
        assert_eq!(v["client_event_id"], "e9");
    }
}
