//! The calls routes of the client listener, on axum:
//! `POST /v1/realtime/calls` (WebRTC: create a call from an SDP offer) and
//! `POST /v1/realtime/calls/{call_id}/{accept,hangup,refer,reject}` (SIP and
//! call control), with the same paths under `/openai/v1/realtime/calls`;
//! and for translation routes (`endpoint = "translations"`)
//! `POST /v1/realtime/translations/calls` (WebRTC) and
//! `POST /v1/realtime/translations/calls/{call_id}/hangup`, also under
//! `/openai`. A model is created at its own endpoint's path only (400
//! `wrong_endpoint` naming the other), and a call is controlled at the path
//! it was created at (404 elsewhere). A translation call's upstream session
//! is the translation create request (openai-python
//! `types/realtime/realtime_translation_session_create_request_param.py`:
//! `model`, `audio`; no `type`), and it is billed by its connected time
//! ([`crate::metering::call_time`]).
//!
//! Order for a create: draining → 503; credential (client key or client
//! secret) → 401/403; body (≤ [`offer::MAX_BODY_BYTES`] → 413, type → 415,
//! shape → 400); model (`session.model`, else `?model=`, else the secret's,
//! else 400) → 404 unknown; the route's calls API (beta → 400
//! `unsupported_for_route`); then the admission of a WebSocket session
//! ([`Gateway::admit`]). Nothing is sent upstream before all pass. The
//! upstream's answer is relayed with its status, SDP body and a `Location`
//! on the gateway's own path; a refusal keeps the upstream's status but
//! never its body (it may quote the gateway's key). Only then are the
//! ownership record and the sideband created, so a failure leaves neither.
//!
//! Call control (`hangup`, `refer`, `reject`) needs the key that created or
//! accepted the call, or its team ([`super::ownership`]); anything else is
//! 404. `reject` is also allowed on a SIP call nobody accepted yet (that is
//! how a webhook declines a call). An accept claims its call before it is
//! admitted and asked upstream ([`super::claim`]): a concurrent accept gets
//! `400 call_already_accepted` as a later one does, a concurrent hangup,
//! refer or reject `409 call_accept_in_progress` with `Retry-After`, and
//! neither sends anything upstream.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use axum::body::Body;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, RawQuery, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use http::{header, HeaderValue, StatusCode};
use serde_json::{Map, Value};
use tokio::time::Instant;

use crate::admission::Refusal;
use crate::auth::{presented_key, KeyEntry};
use crate::body::{body_timeout, BodyError};
use crate::client_secret::{is_client_secret, Grant};
use crate::config::Endpoint;
use crate::gateway::{Gateway, Route};
use crate::http_error::{count_refusal, ApiError};
use crate::metrics::ActionRefusalLabels;
use crate::telemetry::context::TraceParent;

use super::claim::{self, Lost};
use super::fleet::{unix_ms, CallFleet, CallRecord, ADOPT_POLL, CLAIM_GRACE};
use super::offer::{self, OfferError};
use super::ownership::{decide, Decision, Owner, Owners};
use super::refusals::{
    bad_request, calls_store_unavailable, held_refusal, not_found, offer_refusal, route_refusal,
    unreachable_refusal, upstream_refusal, upstream_refusal_for,
};
use super::sideband::{self, Call};
use super::upstream::{self, call_id_from_location, upstream_session, Answer};
use super::Transport;

/// The calls collection, OpenAI's path and Azure GA's.
pub const CALLS_PATHS: [&str; 2] = ["/v1/realtime/calls", "/openai/v1/realtime/calls"];
/// The translation calls collection (WebRTC), at the same two prefixes.
pub const TRANSLATION_CALLS_PATHS: [&str; 2] = [
    "/v1/realtime/translations/calls",
    "/openai/v1/realtime/translations/calls",
];

/// The calls collection a route's calls are created and controlled at (a
/// GPT-Live route's WebRTC sessions: its sessions path, not served here).
fn calls_path(endpoint: Endpoint) -> &'static str {
    match endpoint {
        Endpoint::Realtime => CALLS_PATHS[0],
        Endpoint::Translations => TRANSLATION_CALLS_PATHS[0],
        Endpoint::Live => endpoint.openai_path(),
    }
}

/// The state of the calls routes (and of GPT-Live's WebRTC sessions,
/// [`super::live`]).
#[derive(Debug, Clone)]
pub struct CallsState {
    pub gw: Arc<Gateway>,
    pub owners: Arc<Owners>,
    /// Call records and sideband hand-over in Redis, when configured.
    pub fleet: Option<CallFleet>,
}

/// Any method but POST on a calls path: an OpenAI-shaped 405, counted.
pub(super) async fn method_not_allowed(
    State(st): State<CallsState>,
    method: http::Method,
) -> Response {
    let r = Refusal::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "invalid_request_error",
        "method_not_allowed",
        format!("{method} is not allowed here; the calls API takes POST"),
    );
    refuse(&st.gw, "", r)
}

pub(super) fn refuse(gw: &Gateway, model: &str, r: Refusal) -> Response {
    count_refusal(gw, model, &r);
    ApiError(r).into_response()
}

/// The call actions of the calls API.
const ACTIONS: [&str; 4] = ["accept", "hangup", "refer", "reject"];

/// The actions on a call's or Live session's id that admit nothing, as
/// labelled in `patchbay_call_action_refusals_total` (any other: `unknown`).
const LABELLED_ACTIONS: [&str; 6] = ["hangup", "refer", "reject", "attach", "fork", "content"];

/// A refused call action. An accept admits a call, so its refusals are
/// admission refusals; a hangup, refer or reject (and a Live session's
/// attach, WebSocket fork or recording download) admits nothing (a hangup
/// of an unknown call is not a refused admission), so theirs count in
/// `patchbay_call_action_refusals_total` by action and reason (the
/// refusal's code, as every refusal metric's).
pub(super) fn refuse_action(gw: &Gateway, action: &str, r: Refusal) -> Response {
    if action == "accept" {
        return refuse(gw, "", r);
    }
    let action = LABELLED_ACTIONS
        .into_iter()
        .find(|a| *a == action)
        .unwrap_or("unknown");
    gw.metrics
        .call_action_refusals
        .get_or_create(&ActionRefusalLabels {
            action: action.into(),
            reason: r.code.into(),
        })
        .inc();
    ApiError(r).into_response()
}

pub(super) async fn read_body(gw: &Gateway, body: Body) -> Result<Bytes, Refusal> {
    match crate::body::read_body(gw, body, offer::MAX_BODY_BYTES).await {
        Ok(b) => Ok(b),
        Err(BodyError::TooLarge) => Err(offer_refusal(&OfferError::TooLarge)),
        Err(BodyError::Slow(after)) => Err(body_timeout(after)),
    }
}

/// The key a create is authenticated with: a client key, or a client
/// secret (its parent key and grant).
async fn authenticate(
    gw: &Gateway,
    headers: &HeaderMap,
    model: Option<&str>,
) -> Result<(KeyEntry, Option<Grant>), Refusal> {
    let presented = presented_key(headers);
    let keys = gw.keys.get();
    match presented.key.as_ref() {
        None => Err(Refusal::unauthorized(
            "missing API key: send Authorization: Bearer <key or client secret>",
        )),
        Some(secret) if is_client_secret(secret.expose()) => {
            let (k, g) = gw
                .client_secrets
                .open(secret, &keys, model, SystemTime::now())
                .await?;
            Ok((k, Some(g)))
        }
        Some(k) => match keys.lookup(k) {
            None => Err(Refusal::unauthorized("incorrect API key provided")),
            Some(k) if k.disabled => Err(Refusal::unauthorized("this API key is disabled")),
            Some(k) => Ok((k.clone(), None)),
        },
    }
}

fn query_model(query: Option<&str>) -> Option<String> {
    url::form_urlencoded::parse(query.unwrap_or("").as_bytes())
        .find(|(k, _)| k == "model")
        .map(|(_, v)| v.into_owned())
        .filter(|m| !m.is_empty())
}

pub(super) fn find_route(gw: &Gateway, model: &str) -> Result<Arc<Route>, Refusal> {
    gw.route(model).cloned().ok_or_else(|| {
        Refusal::new(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            "model_not_found",
            format!("the model '{model}' is not served by this gateway"),
        )
    })
}

/// A model created at the other endpoint's calls path: 400 naming its own.
pub(super) fn wrong_endpoint(model: &str, endpoint: Endpoint) -> Refusal {
    Refusal::new(
        StatusCode::BAD_REQUEST,
        "invalid_request_error",
        "wrong_endpoint",
        format!("the model '{model}' is served at {}", calls_path(endpoint)),
    )
    .with_param("model")
}

/// `POST /v1/realtime/calls`.
pub(super) async fn create(
    State(st): State<CallsState>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
    body: Body,
) -> Response {
    create_at(st, Endpoint::Realtime, query, headers, body).await
}

/// `POST /v1/realtime/translations/calls`.
pub(super) async fn create_translation(
    State(st): State<CallsState>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
    body: Body,
) -> Response {
    create_at(st, Endpoint::Translations, query, headers, body).await
}

/// A WebRTC call created at `endpoint`'s calls path.
async fn create_at(
    st: CallsState,
    endpoint: Endpoint,
    query: Option<String>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let gw = &st.gw;
    let started = Instant::now();
    if gw.sessions.is_draining() {
        return refuse(gw, "", Refusal::draining());
    }
    let query_model = query_model(query.as_deref());
    let (key, grant) = match authenticate(gw, &headers, query_model.as_deref()).await {
        Ok(a) => a,
        Err(r) => return refuse(gw, "", r),
    };
    let body = match read_body(gw, body).await {
        Ok(b) => b,
        Err(r) => return refuse(gw, "", r),
    };
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok());
    let offer = match offer::parse(content_type, &body) {
        Ok(o) => o,
        Err(e) => return refuse(gw, "", offer_refusal(&e)),
    };
    let session_model = offer
        .session
        .as_ref()
        .and_then(|s| s.get("model"))
        .and_then(Value::as_str)
        .map(str::to_string);
    let Some(model) = session_model
        .or(query_model)
        .or_else(|| grant.as_ref().map(|g| g.model.clone()))
    else {
        let r = bad_request(
            "missing_model",
            "missing model: set session.model or ?model=",
        )
        .with_param("session.model");
        return refuse(gw, "", r);
    };
    if let Some(g) = &grant {
        if g.model != model {
            return refuse(
                gw,
                "",
                crate::client_secret::model_not_allowed(&g.model, &model),
            );
        }
    }
    let route = match find_route(gw, &model) {
        Ok(r) => r,
        Err(r) => return refuse(gw, "", r),
    };
    if route.config.endpoint != endpoint {
        return refuse(gw, &model, wrong_endpoint(&model, route.config.endpoint));
    }
    let url = match upstream::calls_url(&route.config) {
        Ok(u) => u,
        Err(e) => return refuse(gw, &model, route_refusal(&model, &e)),
    };
    let session_id = crate::ids::short_id();
    let permit = match gw.admit(&key, &route, &session_id).await {
        Ok(p) => p,
        Err(r) => return refuse(gw, &model, r),
    };
    let session = upstream_session(
        offer.session,
        grant.as_ref(),
        route.config.upstream_model(),
        endpoint,
    );
    let (ct, form) = offer::encode_multipart(&offer.sdp, Some(&session));
    let timeout = Duration::from_secs(gw.config.server.upgrade_timeout_secs);
    let answer = match upstream::post(&route.config, &url, Some(&ct), form, timeout).await {
        Ok(a) => a,
        Err(e) => {
            tracing::warn!(model = %model, error = %e, "call create: upstream unreachable");
            return refuse(gw, &model, unreachable_refusal(&e));
        }
    };
    if !answer.status.is_success() {
        tracing::warn!(model = %model, status = answer.status.as_u16(), "call create refused upstream");
        return refuse(gw, &model, upstream_refusal(answer.status));
    }
    let Some(call_id) = answer
        .headers
        .get(header::LOCATION)
        .and_then(|v| v.to_str().ok())
        .and_then(call_id_from_location)
    else {
        tracing::warn!(model = %model, "call create: the upstream answer has no usable Location");
        let r = Refusal::new(
            StatusCode::BAD_GATEWAY,
            "server_error",
            "upstream_bad_answer",
            "the upstream's answer named no call",
        );
        return refuse(gw, &model, r);
    };
    start_call(
        &st,
        Call {
            id: call_id.clone(),
            session_id,
            transport: Transport::WebRtc,
            key,
            client_secret_id: grant.map(|g| g.id),
            route,
            permit,
            started,
            trace: gw.telemetry.parent(&headers),
        },
    )
    .await;
    let location = format!("{}/{call_id}", calls_path(endpoint));
    relay_answer(answer, Some(&location))
}

/// Records the call's owner (in Redis too, when configured) and attaches
/// its sideband.
pub(super) async fn start_call(st: &CallsState, call: Call) {
    if let Some(f) = &st.fleet {
        let rec = CallRecord {
            call_id: call.id.clone(),
            key_id: call.key.id.clone(),
            team: call.key.team.clone(),
            model: call.route.config.model.clone(),
            transport: call.transport.as_str().into(),
            client_secret_id: call.client_secret_id.clone(),
            lease_id: call.permit.lease().map(|l| l.id().to_string()),
            started_unix_ms: unix_ms(SystemTime::now())
                .saturating_sub(call.started.elapsed().as_millis() as u64),
            accepting: false,
        };
        let max = Duration::from_secs(st.gw.config.relay.max_session_secs);
        f.register(&call.route.config, &rec, max).await;
    }
    st.owners.settle(
        &call.id,
        Owner {
            key_id: call.key.id.clone(),
            team: call.key.team.clone(),
            model: call.route.config.model.clone(),
            transport: call.transport,
            accepting: false,
        },
    );
    tracing::info!(call_id = %call.id, session_id = %call.session_id, key_id = %call.key.id, transport = call.transport.as_str(), model = %call.route.config.model, "call started");
    st.gw.tasks.spawn(sideband::run(
        st.gw.clone(),
        call,
        st.owners.clone(),
        st.fleet.clone(),
    ));
}

/// The upstream's successful answer: status, body and Content-Type, and the
/// gateway's own `Location`.
pub(super) fn relay_answer(answer: Answer, location: Option<&str>) -> Response {
    let mut r = Response::new(Body::from(answer.body));
    *r.status_mut() = answer.status;
    let h = r.headers_mut();
    if let Some(ct) = answer.headers.get(header::CONTENT_TYPE) {
        h.insert(header::CONTENT_TYPE, ct.clone());
    }
    if let Some(l) = location.and_then(|l| HeaderValue::from_str(l).ok()) {
        h.insert(header::LOCATION, l);
    }
    r
}

/// The Patchbay key a call action is authenticated with; never a client
/// secret (a browser's secret creates its call, the server controls it).
pub(super) fn control_key(gw: &Gateway, headers: &HeaderMap) -> Result<KeyEntry, Refusal> {
    let presented = presented_key(headers);
    match presented.key.as_ref() {
        None => Err(Refusal::unauthorized(
            "missing API key: send Authorization: Bearer <key>",
        )),
        Some(k) if is_client_secret(k.expose()) => Err(Refusal::unauthorized(
            "a client secret cannot control calls; use a Patchbay API key",
        )),
        Some(k) => match gw.keys.get().lookup(k) {
            None => Err(Refusal::unauthorized("incorrect API key provided")),
            Some(k) if k.disabled => Err(Refusal::unauthorized("this API key is disabled")),
            Some(k) => Ok(k.clone()),
        },
    }
}

/// `POST /v1/realtime/calls/{call_id}/{action}`.
pub(super) async fn act(
    State(st): State<CallsState>,
    path: Result<Path<(String, String)>, PathRejection>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    act_at(st, Endpoint::Realtime, path, headers, body).await
}

/// `POST /v1/realtime/translations/calls/{call_id}/hangup`: a WebRTC
/// translation call takes a hangup only (no SIP: nothing to accept, refer
/// or reject).
pub(super) async fn act_translation(
    State(st): State<CallsState>,
    path: Result<Path<(String, String)>, PathRejection>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    if let Ok(Path((_, action))) = &path {
        if action != "hangup" {
            let r = Refusal::new(
                StatusCode::NOT_FOUND,
                "invalid_request_error",
                "not_found",
                format!("unknown translation call action '{action}'; use hangup"),
            );
            return refuse_action(&st.gw, action, r);
        }
    }
    act_at(st, Endpoint::Translations, path, headers, body).await
}

/// A call action at `endpoint`'s calls path.
pub(super) async fn act_at(
    st: CallsState,
    endpoint: Endpoint,
    path: Result<Path<(String, String)>, PathRejection>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let gw = &st.gw;
    let Ok(Path((call_id, action))) = path else {
        return refuse_action(
            gw,
            "unknown",
            bad_request("invalid_call_id", "the call id is not valid UTF-8"),
        );
    };
    let started = Instant::now();
    let key = match control_key(gw, &headers) {
        Ok(k) => k,
        Err(r) => return refuse_action(gw, &action, r),
    };
    if !ACTIONS.contains(&action.as_str()) {
        let r = Refusal::new(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            "not_found",
            format!("unknown call action '{action}'; use accept, hangup, refer or reject"),
        );
        return refuse_action(gw, &action, r);
    }
    if call_id_from_location(&call_id).as_deref() != Some(call_id.as_str()) {
        return refuse_action(gw, &action, not_found(endpoint, &call_id));
    }
    let body = match read_body(gw, body).await {
        Ok(b) => b,
        Err(r) => return refuse_action(gw, &action, r),
    };
    let owner = match owner_of(&st, &call_id).await {
        Ok(o) => o,
        Err(r) => return refuse_action(gw, &action, r),
    };
    match decide(&action, owner.as_ref(), &key) {
        Decision::Accept => {
            let trace = gw.telemetry.parent(&headers);
            let at = Accepting {
                endpoint,
                call_id: &call_id,
                body: &body,
                started,
                trace,
            };
            accept(&st, key, at).await
        }
        Decision::ForwardUnheld => {
            // A call nobody accepted: declined by the webhook; any route with
            // a calls API can carry it.
            let Some(route) = gw
                .routes
                .iter()
                .find(|r| r.config.endpoint == endpoint && upstream::calls_url(&r.config).is_ok())
            else {
                return refuse_action(gw, &action, not_found(endpoint, &call_id));
            };
            forward(gw, &route.clone(), &call_id, &action, &headers, body).await
        }
        Decision::Forward(o) => {
            let route = match find_route(gw, &o.model) {
                Ok(r) => r,
                Err(r) => return refuse_action(gw, &action, r),
            };
            if route.config.endpoint != endpoint {
                // Controlled at the path it was created at only.
                return refuse_action(gw, &action, not_found(endpoint, &call_id));
            }
            let answer = forward(gw, &route, &call_id, &action, &headers, body).await;
            if answer.status().is_success() && ["hangup", "reject"].contains(&action.as_str()) {
                // Ended by the client: its sideband stops at once.
                st.owners.client_ended(&call_id);
            }
            answer
        }
        held => refuse_action(gw, &action, held_refusal(&held, &call_id, endpoint)),
    }
}

/// Who holds `call_id` (a Live session's owner also once it ended, for its
/// recording and forks): from this process, else from the fleet's record.
/// Redis unable to say is a refusal, never taken as nobody's (which would
/// let any key act on it).
pub(super) async fn owner_of(st: &CallsState, call_id: &str) -> Result<Option<Owner>, Refusal> {
    match (st.owners.known(call_id), &st.fleet) {
        (Some(o), _) => Ok(Some(o)),
        (None, Some(f)) => match f.record(call_id).await {
            Ok(rec) => Ok(rec.map(|r| r.owner())),
            Err(_) => Err(calls_store_unavailable()),
        },
        (None, None) => Ok(None),
    }
}

/// Forwards a call action as received (JSON body, or none) with the
/// upstream key, answering with the upstream's status.
async fn forward(
    gw: &Gateway,
    route: &Arc<Route>,
    call_id: &str,
    action: &str,
    headers: &HeaderMap,
    body: Bytes,
) -> Response {
    let model = route.config.model.clone();
    let url = match upstream::action_url(&route.config, call_id, action) {
        Ok(u) => u,
        Err(e) => return refuse_action(gw, action, route_refusal(&model, &e)),
    };
    let ct = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .filter(|_| !body.is_empty());
    let timeout = Duration::from_secs(gw.config.server.upgrade_timeout_secs);
    match upstream::post(&route.config, &url, ct, body.to_vec(), timeout).await {
        Ok(a) if a.status.is_success() => {
            tracing::info!(call_id, action, model = %model, "call action forwarded");
            relay_answer(a, None)
        }
        Ok(a) => refuse_action(
            gw,
            action,
            upstream_refusal_for(route.config.endpoint, call_id, a.status),
        ),
        Err(e) => refuse_action(gw, action, unreachable_refusal(&e)),
    }
}

/// An accept, as received.
struct Accepting<'a> {
    endpoint: Endpoint,
    call_id: &'a str,
    body: &'a [u8],
    started: Instant,
    trace: Option<TraceParent>,
}

/// `accept` of a SIP call: the model from the body (a Live accept's
/// `session.model`, openai-python `types/live/session_accept_params.py`),
/// admitted like a new session, forwarded with the upstream model, then
/// the sideband.
async fn accept(st: &CallsState, key: KeyEntry, at: Accepting<'_>) -> Response {
    let Accepting {
        endpoint,
        call_id,
        body,
        started,
        trace,
    } = at;
    let gw = &st.gw;
    if gw.sessions.is_draining() {
        return refuse(gw, "", Refusal::draining());
    }
    let mut body: Map<String, Value> = match serde_json::from_slice(body) {
        Ok(Value::Object(m)) => m,
        _ => {
            let r = bad_request(
                "invalid_request",
                "the accept body must be a JSON object with 'model'",
            );
            return refuse(gw, "", r);
        }
    };
    let live = endpoint == Endpoint::Live;
    let session = if live {
        body.get_mut("session").and_then(Value::as_object_mut)
    } else {
        Some(&mut body)
    };
    let Some(session) = session else {
        let r = bad_request("missing_session", "missing required parameter: 'session'")
            .with_param("session");
        return refuse(gw, "", r);
    };
    let Some(model) = session
        .get("model")
        .and_then(Value::as_str)
        .map(str::to_string)
    else {
        let param = if live { "session.model" } else { "model" };
        let r = bad_request(
            "missing_model",
            format!("missing required parameter: '{param}'"),
        )
        .with_param(param);
        return refuse(gw, "", r);
    };
    let route = match find_route(gw, &model) {
        Ok(r) => r,
        Err(r) => return refuse(gw, "", r),
    };
    if route.config.endpoint != endpoint {
        return refuse(gw, &model, wrong_endpoint(&model, route.config.endpoint));
    }
    let url = match upstream::action_url(&route.config, call_id, "accept") {
        Ok(u) => u,
        Err(e) => return refuse(gw, &model, route_refusal(&model, &e)),
    };
    let timeout = Duration::from_secs(gw.config.server.upgrade_timeout_secs);
    // Claimed before anything is spent on it: a concurrent accept that
    // loses takes no slot and sends nothing upstream.
    let ttl = timeout + CLAIM_GRACE;
    let claim = match claim::claim(&st.owners, st.fleet.as_ref(), &key, &route, call_id, ttl).await
    {
        Ok(c) => c,
        Err(Lost::Held(d)) => {
            return refuse(gw, &model, held_refusal(&d, call_id, endpoint));
        }
        Err(Lost::StoreUnavailable) => return refuse(gw, &model, calls_store_unavailable()),
    };
    let session_id = crate::ids::short_id();
    let permit = match gw.admit(&key, &route, &session_id).await {
        Ok(p) => p,
        Err(r) => {
            claim.release().await;
            return refuse(gw, &model, r);
        }
    };
    session.insert("model".into(), route.config.upstream_model().into());
    if !live {
        session.entry("type").or_insert_with(|| "realtime".into());
    }
    let body = Value::Object(body).to_string().into_bytes();
    let answer =
        match upstream::post(&route.config, &url, Some("application/json"), body, timeout).await {
            Ok(a) => a,
            Err(e) => {
                hang_up_unanswered(gw, &route, call_id, timeout);
                claim.release().await;
                return refuse(gw, &model, unreachable_refusal(&e));
            }
        };
    if !answer.status.is_success() {
        claim.release().await;
        let r = upstream_refusal_for(endpoint, call_id, answer.status);
        return refuse(gw, &model, r);
    }
    start_call(
        st,
        Call {
            id: call_id.to_string(),
            session_id,
            transport: Transport::Sip,
            key,
            client_secret_id: None,
            route,
            permit,
            started,
            trace,
        },
    )
    .await;
    claim.keep();
    relay_answer(answer, None)
}

/// Hangs up a call whose `accept` got no answer in time (best effort,
/// bounded, in the background): the upstream may have accepted it, and a
/// call the gateway neither meters nor governs must not run on.
fn hang_up_unanswered(gw: &Gateway, route: &Arc<Route>, call_id: &str, timeout: Duration) {
    let (route, call_id) = (route.clone(), call_id.to_string());
    gw.tasks.spawn(async move {
        let result = match upstream::action_url(&route.config, &call_id, "hangup") {
            Ok(url) => upstream::post(&route.config, &url, None, Vec::new(), timeout)
                .await
                .map(|a| a.status),
            Err(e) => Err(e.into()),
        };
        match result {
            Ok(s) if s.is_success() => {
                tracing::warn!(call_id = %call_id, "accept unanswered: the call was hung up")
            }
            Ok(s) => {
                tracing::warn!(call_id = %call_id, status = s.as_u16(), "accept unanswered: the upstream refused the hangup")
            }
            Err(e) => {
                tracing::warn!(call_id = %call_id, error = %e, "accept unanswered: the hangup failed")
            }
        }
    });
}

/// Adopts, every [`ADOPT_POLL`], the calls of this gateway's routes that no
/// replica holds (let go by a draining replica, or held by one that died),
/// until this gateway drains.
pub(super) async fn adopt_loop(st: CallsState) {
    let Some(fleet) = st.fleet.clone() else {
        return;
    };
    // The first look is one period after start: a starting replica has
    // nothing to hand over, and the fleet's calls wait at most a period.
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + ADOPT_POLL, ADOPT_POLL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    loop {
        tokio::select! {
            _ = st.gw.draining.cancelled() => return,
            _ = tick.tick() => {}
        }
        for route in st.gw.routes.clone() {
            if upstream::calls_url(&route.config).is_err() {
                continue;
            }
            for rec in fleet.claim_orphans(&route.config).await {
                adopt(&st, &fleet, &route, rec).await;
            }
        }
    }
}

/// Takes one call over: a session slot (no cap check: the call was admitted
/// once), the key's fleet lease, a new sideband.
async fn adopt(st: &CallsState, fleet: &CallFleet, route: &Arc<Route>, rec: CallRecord) {
    let gw = &st.gw;
    if super::live_owners::never_adopted(fleet, &route.config, &rec).await {
        return;
    }
    if st.owners.get(&rec.call_id).is_some() {
        // Still metered here: its hold lapsed during a Redis outage and this
        // replica claimed it back. One sideband per call.
        return;
    }
    let Some(key) = gw.keys.get().by_id(&rec.key_id).cloned() else {
        // The key is gone: the call is no longer anyone's to meter.
        tracing::warn!(call_id = %rec.call_id, key_id = %rec.key_id, "adopting a call of a removed key: forgotten");
        fleet.forget(&route.config, &rec.call_id).await;
        return;
    };
    let gauge = gw
        .metrics
        .sessions_active
        .get_or_create(&crate::metrics::model(&route.config.model))
        .clone();
    let Ok(mut permit) = gw.sessions.admit(usize::MAX, &key.id, None, gauge) else {
        fleet.release(&rec.call_id).await;
        return;
    };
    if let (Some(leases), Some(id)) = (&gw.leases, &rec.lease_id) {
        permit.hold_lease(leases.adopt(&key.id, id, SystemTime::now()).await);
    }
    let age = Duration::from_millis(unix_ms(SystemTime::now()).saturating_sub(rec.started_unix_ms));
    let now = Instant::now();
    let started = now.checked_sub(age).unwrap_or(now);
    let call = Call {
        id: rec.call_id.clone(),
        session_id: crate::ids::short_id(),
        transport: rec.transport(),
        key,
        client_secret_id: rec.client_secret_id.clone(),
        route: route.clone(),
        permit,
        started,
        // An adopted call's trace context stayed with the replica that
        // took it: its turns here start a trace of their own.
        trace: None,
    };
    tracing::info!(call_id = %call.id, session_id = %call.session_id, key_id = %call.key.id, "call adopted from another replica");
    st.owners.claim(&call.id, rec.owner());
    gw.tasks.spawn(sideband::run(
        gw.clone(),
        call,
        st.owners.clone(),
        st.fleet.clone(),
    ));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_call_id_is_the_last_segment_of_a_safe_location() {
        assert_eq!(
            call_id_from_location("/v1/realtime/calls/rtc_abc").as_deref(),
            Some("rtc_abc")
        );
        assert_eq!(
            call_id_from_location("https://api.openai.com/v1/realtime/calls/rtc_1?x=1").as_deref(),
            Some("rtc_1")
        );
        assert_eq!(call_id_from_location("/v1/realtime/calls/a b"), None);
        assert_eq!(call_id_from_location(""), None);
    }

    #[test]
    fn the_upstream_session_gets_the_upstream_model_and_type() {
        let grant = Grant {
            id: "cs".into(),
            model: "gpt-realtime".into(),
            config: r#"{"instructions":"be brief","model":"gpt-realtime"}"#.into(),
        };
        let s = upstream_session(None, Some(&grant), "up-1", Endpoint::Realtime);
        assert_eq!(s["model"], "up-1");
        assert_eq!(s["type"], "realtime");
        assert_eq!(s["instructions"], "be brief");
        let mut client = Map::new();
        client.insert("voice".into(), "marin".into());
        let s = upstream_session(Some(client), Some(&grant), "up-1", Endpoint::Realtime);
        assert_eq!(s["voice"], "marin");
        assert!(s.get("instructions").is_none());
        let translation = Grant {
            id: "cs".into(),
            model: "gpt-realtime-translate".into(),
            config: r#"{"model":"gpt-realtime-translate","audio":{"output":{"language":"fr"}}}"#
                .into(),
        };
        let s = upstream_session(None, Some(&translation), "up-t", Endpoint::Translations);
        assert_eq!(s["model"], "up-t");
        assert_eq!(s["audio"]["output"]["language"], "fr");
        assert!(s.get("type").is_none(), "a translation session has no type");
    }
}
