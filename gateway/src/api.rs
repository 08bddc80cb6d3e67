//! The client listener's plain HTTP routes, on an axum router:
//! `POST /v1/realtime/client_secrets`, the calls routes
//! ([`crate::calls::api`]) and `GET /v1/patchbay/usage`
//! ([`crate::usage_api`]) merged in, and the answers for everything that
//! is not a WebSocket upgrade of `/v1/realtime` (which stays on the
//! hand-rolled hyper path in `crate::server`, since the relay forwards
//! frames undecoded).
//!
//! - The client key is an extractor ([`ParentKey`]), so no handler can
//!   forget authentication; it refuses client secrets (a secret cannot mint
//!   secrets).
//! - Every error is an [`ApiError`], answered once as OpenAI's error JSON
//!   (`{"error":{"message","type","code","param"}}`, the same shape as an
//!   upgrade refusal) with `Retry-After` when the refusal has one, and
//!   counted in `patchbay_admission_refusals_total{reason}`.
//! - Handlers are thin: validation is [`crate::client_secret::request`],
//!   minting [`crate::client_secret::ClientSecrets`], limits and budgets the
//!   metering admission the upgrade path uses.

use std::sync::Arc;
use std::time::SystemTime;

use axum::body::Body;
use axum::extract::{FromRequestParts, RawQuery, State};
use axum::http::request::Parts;
use axum::response::{IntoResponse, Response};
use axum::routing::{any, post};
use axum::Router;
use http::{header, HeaderValue, StatusCode};

use crate::admission::Refusal;
use crate::auth::{presented_key, KeyEntry};
use crate::body::{body_timeout, read_body, BodyError};
use crate::client_secret::{self, is_client_secret, request};
use crate::config::{Endpoint, Intent};
use crate::gateway::Gateway;
use crate::http_error::{count_refusal, ApiError};
use crate::metering::client_models::ModelPolicy;

/// The mint route (the SDKs call `{base_url}/realtime/client_secrets`).
pub const CLIENT_SECRETS_PATH: &str = "/v1/realtime/client_secrets";
/// The same under Azure's prefix, as the calls and the upgrade paths are.
pub const AZURE_CLIENT_SECRETS_PATH: &str = "/openai/v1/realtime/client_secrets";

/// The translation mint routes (openai-python
/// `resources/realtime/translations/client_secrets.py`).
pub const TRANSLATION_CLIENT_SECRETS_PATHS: [&str; 2] = [
    "/v1/realtime/translations/client_secrets",
    "/openai/v1/realtime/translations/client_secrets",
];

/// The router for the client listener's non-upgrade requests.
pub fn router(gw: Arc<Gateway>) -> Router {
    let mut r = Router::new();
    for path in [CLIENT_SECRETS_PATH, AZURE_CLIENT_SECRETS_PATH] {
        r = r.route(path, post(mint).fallback(method_not_allowed));
    }
    for path in TRANSLATION_CLIENT_SECRETS_PATHS {
        r = r.route(path, post(mint_translation).fallback(method_not_allowed));
    }
    for path in crate::session::REALTIME_PATHS
        .into_iter()
        .chain(crate::session::TRANSLATION_PATHS)
    {
        r = r.route(path, any(websocket_required));
    }
    let cors = cors_layer(&gw.config.server.cors_origins);
    r.fallback(not_found)
        .with_state(gw.clone())
        .merge(crate::usage_api::router(gw.clone()))
        .merge(crate::calls::routes::router(gw))
        .layer(cors)
}

/// CORS for browsers calling from another origin (WebRTC offers): any
/// origin by default, like OpenAI's API (credentials are explicit headers,
/// never cookies), else only `[server] cors_origins`; `Location` exposed so
/// a page can read the call id.
pub fn cors_layer(origins: &[String]) -> tower_http::cors::CorsLayer {
    use tower_http::cors::{AllowHeaders, AllowOrigin, CorsLayer};
    let allow = if origins.is_empty() {
        AllowOrigin::any()
    } else {
        AllowOrigin::list(origins.iter().filter_map(|o| HeaderValue::from_str(o).ok()))
    };
    CorsLayer::new()
        .allow_origin(allow)
        .allow_methods([http::Method::GET, http::Method::POST, http::Method::OPTIONS])
        .allow_headers(AllowHeaders::mirror_request())
        .expose_headers([header::LOCATION])
        .max_age(CORS_MAX_AGE)
}

/// How long a browser may cache a preflight answer.
pub const CORS_MAX_AGE: std::time::Duration = std::time::Duration::from_secs(600);

/// The Patchbay client key a request is authenticated with (`Authorization:
/// Bearer` or `api-key`); never a client secret.
#[derive(Debug, Clone)]
pub struct ParentKey(pub KeyEntry);

impl FromRequestParts<Arc<Gateway>> for ParentKey {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut Parts,
        gw: &Arc<Gateway>,
    ) -> Result<Self, Self::Rejection> {
        let presented = presented_key(&parts.headers);
        let refusal = match presented.key {
            None => (
                "missing_key",
                Refusal::unauthorized(
                    "missing API key: send Authorization: Bearer <key> or api-key",
                ),
            ),
            Some(k) if is_client_secret(k.expose()) => {
                ("minted_by_secret", client_secret::secret_cannot_mint())
            }
            Some(k) => match gw.keys.get().lookup(&k) {
                Some(e) if !e.disabled => return Ok(Self(e.clone())),
                Some(_) => (
                    "key_disabled",
                    Refusal::unauthorized("this API key is disabled"),
                ),
                None => (
                    "invalid_key",
                    Refusal::unauthorized("incorrect API key provided"),
                ),
            },
        };
        gw.client_secrets.count_refusal("mint", refusal.0);
        count_refusal(gw, "", &refusal.1);
        Err(ApiError(refusal.1))
    }
}

/// `POST /v1/realtime/client_secrets`.
async fn mint(
    State(gw): State<Arc<Gateway>>,
    ParentKey(key): ParentKey,
    RawQuery(query): RawQuery,
    body: Body,
) -> Response {
    minted_or_refused(
        &gw,
        mint_inner(&gw, &key, query.as_deref(), body, false).await,
    )
}

/// `POST /v1/realtime/translations/client_secrets`: a secret bound to a
/// translation route.
async fn mint_translation(
    State(gw): State<Arc<Gateway>>,
    ParentKey(key): ParentKey,
    body: Body,
) -> Response {
    minted_or_refused(&gw, mint_inner(&gw, &key, None, body, true).await)
}

fn minted_or_refused(gw: &Gateway, minted: Result<Response, ApiError>) -> Response {
    match minted {
        Ok(r) => r,
        Err(ApiError(refusal)) => {
            gw.client_secrets.count_refusal("mint", refusal.code);
            count_refusal(gw, "", &refusal);
            ApiError(refusal).into_response()
        }
    }
}

async fn mint_inner(
    gw: &Gateway,
    key: &KeyEntry,
    query: Option<&str>,
    body: Body,
    translation: bool,
) -> Result<Response, ApiError> {
    let body = match read_body(gw, body, request::MAX_BODY_BYTES).await {
        Ok(b) => b,
        Err(BodyError::TooLarge) => {
            return Err(Refusal::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "invalid_request_error",
                "request_too_large",
                format!(
                    "the request body is larger than {} bytes (or was cut off)",
                    request::MAX_BODY_BYTES
                ),
            )
            .into())
        }
        Err(BodyError::Slow(after)) => return Err(body_timeout(after).into()),
    };
    let query_model = query.and_then(|q| {
        url::form_urlencoded::parse(q.as_bytes())
            .find(|(k, _)| k == "model")
            .map(|(_, v)| v.into_owned())
            .filter(|m| !m.is_empty())
    });
    let routes_of = |endpoint: Endpoint| -> Vec<&str> {
        gw.routes
            .iter()
            .filter(|r| r.config.endpoint == endpoint)
            .map(|r| r.config.model.as_str())
            .collect()
    };
    let max_ttl = gw.client_secrets.max_ttl_secs();
    let req = if translation {
        request::parse_translation(&body, &routes_of(Endpoint::Translations), max_ttl)?
    } else {
        let routes = routes_of(Endpoint::Realtime);
        let default_model = query_model
            .as_deref()
            .or(routes.first().copied())
            .unwrap_or_default();
        let transcription_route = gw
            .route_for_intent(Intent::Transcription.as_str())
            .map(|r| r.config.model.as_str());
        request::parse(&body, default_model, &routes, transcription_route, max_ttl)?
    };
    let route = gw.route(&req.model).cloned().ok_or_else(|| {
        Refusal::new(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            "model_not_found",
            format!("the model '{}' is not served by this gateway", req.model),
        )
    })?;
    let keys = gw.keys.get();
    let team = key.team.as_deref().and_then(|t| keys.team(t));
    client_secret::parent_key_may_use(key, team, &req.model)?;
    // The models the config names pass the checks a client's own
    // `session.update` gets (and again when the secret connects).
    let upstream = &route.upstreams[0].config;
    ModelPolicy::for_session(key, team, &gw.metering, &route.config, upstream)
        .check(req.as_update().as_bytes())
        .map_err(|r| r.refusal())?;
    // Minting is one request against the key's rpm, refused when a budget
    // of the key, its team or the route is spent.
    gw.metering.admit(key, team, &route.config).await?;
    let minted = gw.client_secrets.mint(key, req, SystemTime::now()).await?;
    let body = serde_json::json!({
        "value": minted.value.expose(),
        "expires_at": minted.expires_at,
        "session": minted.session,
    })
    .to_string();
    let mut r = Response::new(Body::from(body));
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    // The body is a credential: no cache may keep it.
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    Ok(r)
}

async fn websocket_required(State(gw): State<Arc<Gateway>>) -> ApiError {
    let r = Refusal::new(
        StatusCode::BAD_REQUEST,
        "invalid_request_error",
        "websocket_required",
        "this endpoint only accepts WebSocket upgrades (GET with Upgrade: websocket, version 13)",
    );
    count_refusal(&gw, "", &r);
    ApiError(r)
}

async fn method_not_allowed(State(gw): State<Arc<Gateway>>, method: http::Method) -> ApiError {
    let r = Refusal::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "invalid_request_error",
        "method_not_allowed",
        format!("{method} is not allowed here; use POST {CLIENT_SECRETS_PATH}"),
    );
    count_refusal(&gw, "", &r);
    ApiError(r)
}

async fn not_found(State(gw): State<Arc<Gateway>>, uri: http::Uri) -> ApiError {
    let r = not_found_for(uri.path());
    count_refusal(&gw, "", &r);
    ApiError(r)
}

/// The 404 for `path`: a path under OpenAI's Live API that is none of its
/// endpoints is named as not served, with those it serves.
fn not_found_for(path: &str) -> Refusal {
    let live = ["/v1/live/", "/openai/v1/live/"]
        .iter()
        .any(|p| path.starts_with(p));
    if live {
        return Refusal::new(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            "live_endpoint_not_served",
            format!(
                "{path} is not served by this gateway: of OpenAI's Live API it serves the primary WebSocket (GET /v1/live/sessions, the model in session.start), the WebRTC create (POST /v1/live/sessions), POST …/{{id}}/fork, GET …/{{id}}/content, …/{{id}}/accept|hangup|refer|reject and the WebSockets GET …/{{id}}/attach and GET …/{{id}}/fork"
            ),
        );
    }
    Refusal::new(
        StatusCode::NOT_FOUND,
        "invalid_request_error",
        "not_found",
        format!("no route for {path}; use GET /v1/realtime?model=… or POST {CLIENT_SECRETS_PATH}"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn live_endpoints_not_served_say_so_and_others_name_what_is() {
        for p in [
            "/v1/live/realtime",
            "/v1/live/sessions/live_1/attach/more",
            "/openai/v1/live/other",
        ] {
            let r = not_found_for(p);
            assert_eq!(
                (r.status, r.code),
                (StatusCode::NOT_FOUND, "live_endpoint_not_served"),
                "{p}"
            );
            assert!(r.message.contains("GET /v1/live/sessions"), "{}", r.message);
        }
        assert_eq!(not_found_for("/v1/nothing").code, "not_found");
    }
}
