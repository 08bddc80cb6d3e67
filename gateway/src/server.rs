//! The HTTP edges: the client listener (`GET /v1/realtime` WebSocket
//! upgrades, and every other request through the axum router of
//! [`crate::api`]) and the admin listener (the axum router of
//! [`crate::admin`]: `/healthz`, `/readyz`, `/metrics`).
//!
//! hyper's HTTP/1 connection builder is used directly for the upgrade path
//! (the relay forwards frames undecoded, which axum's WebSocket extractor
//! would not), and owning the accept loop gives the knobs it needs: a
//! listen backlog of [`LISTEN_BACKLOG`] for connect bursts, `TCP_NODELAY` on
//! every accepted socket, and a header read timeout (`upgrade_timeout_secs`)
//! so half-open upgrades are dropped instead of piling up. Each connection is its own task, so a stalled one never delays
//! another.
//!
//! Checks before the 101, in order: WebSocket handshake (else the request
//! goes to the router, which answers 400 or 404); draining → 503;
//! credential → 401 (a client secret: expired, invalid, parent key disabled
//! or removed, config gone → 401; another model → 403); `?model=` → 400
//! missing (a client secret defaults to its own) / 404 unknown; then
//! admission ([`Gateway::admit`], as the parent key for a client secret:
//! the key's model allow-list 403, session caps, rpm, tpm, budgets,
//! unpriced). Nothing is dialled before
//! all pass.

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http::{header, HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::{TcpListener, TcpSocket};
use tokio::time::Instant;
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;

use crate::admission::Refusal;
use crate::auth::{presented_key, SUBPROTOCOL_REALTIME};
use crate::client_secret::is_client_secret;
use crate::gateway::Gateway;
use crate::metrics::ReasonLabels;
use crate::session::Session;

/// Pending-connection queue length; connect bursts of hundreds of sessions
/// must not overflow it (the kernel caps it at `net.core.somaxconn`).
pub const LISTEN_BACKLOG: u32 = 4096;

/// Paths a Realtime client may use: OpenAI's, and Azure's two.
pub const REALTIME_PATHS: [&str; 3] = ["/v1/realtime", "/openai/realtime", "/openai/v1/realtime"];

type Body = Full<Bytes>;

/// Binds with `SO_REUSEADDR` and a deep backlog.
pub fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(LISTEN_BACKLOG)
}

fn http1(gw: &Gateway) -> hyper::server::conn::http1::Builder {
    let mut b = hyper::server::conn::http1::Builder::new();
    b.timer(TokioTimer::new())
        .header_read_timeout(std::time::Duration::from_secs(
            gw.config.server.upgrade_timeout_secs,
        ))
        .keep_alive(true);
    b
}

pub async fn serve_clients(listener: TcpListener, gw: Arc<Gateway>) {
    let builder = http1(&gw);
    let api = crate::api::router(gw.clone());
    loop {
        // Accepting goes on while draining, so that new upgrades get a clear
        // 503 (and SDKs retry elsewhere) rather than a refused connection.
        let (tcp, _peer) = match listener.accept().await {
            Ok(a) => a,
            Err(e) => {
                // EMFILE and friends: back off briefly rather than spin.
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = tcp.set_nodelay(true);
        let gw = gw.clone();
        let api = api.clone();
        let conn = builder
            .serve_connection(
                TokioIo::new(tcp),
                service_fn(move |req: Request<Incoming>| {
                    let gw = gw.clone();
                    let api = api.clone();
                    async move {
                        if REALTIME_PATHS.contains(&req.uri().path()) && is_websocket_upgrade(&req)
                        {
                            return Ok(handle_client(req, gw).await.map(axum::body::Body::new));
                        }
                        let req = req.map(axum::body::Body::new);
                        tower::ServiceExt::oneshot(api, req).await
                    }
                }),
            )
            .with_upgrades();
        tokio::spawn(async move {
            let _ = conn.await;
        });
    }
}

pub async fn serve_admin(listener: TcpListener, gw: Arc<Gateway>) {
    let builder = http1(&gw);
    let admin = crate::admin::router(gw);
    loop {
        let Ok((tcp, _)) = listener.accept().await else {
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            continue;
        };
        let admin = admin.clone();
        let conn = builder.serve_connection(
            TokioIo::new(tcp),
            service_fn(move |req: Request<Incoming>| {
                let admin = admin.clone();
                tower::ServiceExt::oneshot(admin, req.map(axum::body::Body::new))
            }),
        );
        tokio::spawn(async move {
            let _ = conn.await;
        });
    }
}

fn text(status: StatusCode, body: impl Into<Bytes>) -> Response<Body> {
    let mut r = Response::new(Full::new(body.into()));
    *r.status_mut() = status;
    r
}

fn refuse(gw: &Gateway, model_name: &str, refusal: Refusal) -> Response<Body> {
    count_refusal(gw, model_name, &refusal);
    refusal_response(&refusal)
}

/// Counts a refusal in `patchbay_admission_refusals_total{model,reason}`.
pub fn count_refusal(gw: &Gateway, model_name: &str, refusal: &Refusal) {
    gw.metrics
        .refusals
        .get_or_create(&ReasonLabels {
            model: model_name.into(),
            reason: refusal.code.into(),
        })
        .inc();
}

/// The OpenAI-style JSON answer for a refusal, with `Retry-After` when it
/// has one.
pub fn refusal_response(refusal: &Refusal) -> Response<Body> {
    let mut r = text(refusal.status, refusal.body());
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    if let Some(after) = refusal.retry_after {
        r.headers_mut().insert(
            header::RETRY_AFTER,
            HeaderValue::from(after.as_secs().max(1)),
        );
    }
    r
}

fn is_websocket_upgrade(req: &Request<Incoming>) -> bool {
    let has_token = |name: header::HeaderName, token: &str| {
        req.headers().get_all(name).iter().any(|v| {
            v.to_str()
                .map(|s| s.split(',').any(|t| t.trim().eq_ignore_ascii_case(token)))
                .unwrap_or(false)
        })
    };
    req.method() == Method::GET
        && has_token(header::CONNECTION, "upgrade")
        && has_token(header::UPGRADE, "websocket")
        && req.headers().get(header::SEC_WEBSOCKET_VERSION) == Some(&HeaderValue::from_static("13"))
        && req.headers().contains_key(header::SEC_WEBSOCKET_KEY)
}

/// A WebSocket upgrade of one of [`REALTIME_PATHS`].
async fn handle_client(mut req: Request<Incoming>, gw: Arc<Gateway>) -> Response<Body> {
    let started = Instant::now();
    if gw.sessions.is_draining() {
        return refuse(&gw, "", Refusal::draining());
    }
    let presented = presented_key(req.headers());
    let query = req.uri().query().unwrap_or("");
    let requested_model = url::form_urlencoded::parse(query.as_bytes())
        .find(|(k, _)| k == "model" || k == "deployment")
        .map(|(_, v)| v.into_owned())
        .filter(|m| !m.is_empty());
    let keys = gw.keys.get();
    let (key, grant) = match presented.key.as_ref() {
        None => {
            return refuse(
                &gw,
                "",
                Refusal::unauthorized(
                    "missing API key: send Authorization: Bearer <key>, api-key, or the openai-insecure-api-key subprotocol",
                ),
            )
        }
        Some(secret) if is_client_secret(secret.expose()) => {
            let opened = gw
                .client_secrets
                .open(
                    secret,
                    &keys,
                    requested_model.as_deref(),
                    std::time::SystemTime::now(),
                )
                .await;
            match opened {
                Ok((key, grant)) => (key, Some(grant)),
                Err(r) => return refuse(&gw, "", r),
            }
        }
        Some(k) => match keys.lookup(k) {
            None => return refuse(&gw, "", Refusal::unauthorized("incorrect API key provided")),
            Some(k) if k.disabled => {
                return refuse(&gw, "", Refusal::unauthorized("this API key is disabled"))
            }
            Some(k) => (k.clone(), None),
        },
    };
    let wants_realtime = presented.wants_realtime_subprotocol;
    drop(presented);
    let model_name = requested_model.or_else(|| grant.as_ref().map(|g| g.model.clone()));
    let Some(model_name) = model_name else {
        let r = Refusal::new(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            "missing_model",
            "missing required query parameter: model",
        );
        return refuse(&gw, "", r);
    };
    let Some(route) = gw.route(&model_name).cloned() else {
        let r = Refusal::new(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            "model_not_found",
            format!("the model '{model_name}' is not served by this gateway"),
        );
        return refuse(&gw, "", r);
    };
    let session_id = crate::ids::short_id();
    let permit = match gw.admit(&key, &route, &session_id).await {
        Ok(p) => p,
        Err(r) => return refuse(&gw, &model_name, r),
    };

    let params = crate::upstream::dial::session_params(query);

    // Everything passed: answer 101 and run the session in a tracked task.
    let accept = req
        .headers()
        .get(header::SEC_WEBSOCKET_KEY)
        .map(|k| derive_accept_key(k.as_bytes()))
        .unwrap_or_default();
    let on_upgrade = hyper::upgrade::on(&mut req);
    let session = Session {
        id: session_id,
        gateway: gw.clone(),
        route,
        key,
        client_secret: grant,
        permit,
        params,
        started,
    };
    gw.tasks.spawn(session.run(on_upgrade));

    let mut r = Response::new(Full::new(Bytes::new()));
    *r.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    let h = r.headers_mut();
    h.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    h.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
    if let Ok(v) = HeaderValue::from_str(&accept) {
        h.insert(header::SEC_WEBSOCKET_ACCEPT, v);
    }
    if wants_realtime {
        h.insert(
            header::SEC_WEBSOCKET_PROTOCOL,
            HeaderValue::from_static(SUBPROTOCOL_REALTIME),
        );
    }
    r
}
