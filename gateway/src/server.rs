//! The HTTP edges: the client listener (`GET /v1/realtime` WebSocket
//! upgrades, and every other request through the axum router of
//! [`crate::api`]) and the admin listener (the axum router of
//! [`crate::admin`]: `/healthz`, `/readyz`, `/metrics`).
//!
//! A connection's first request head is read by the gateway itself
//! ([`crate::client_conn`]): a Realtime upgrade is checked and its session
//! gets the bare socket, its `101` written by the session with its first
//! frames; any other first request, a refused upgrade's follow-ups and
//! every later request on a kept-alive connection are served by hyper's
//! HTTP/1 connection (the bytes already read replayed to it). Owning the
//! accept loop gives the knobs a gateway needs: a listen backlog of
//! [`LISTEN_BACKLOG`] for connect bursts, `TCP_NODELAY` on every accepted
//! socket, and a head read timeout (`upgrade_timeout_secs`, the gateway's
//! own read and hyper's) so half-open upgrades are dropped instead of
//! piling up. Each connection is its own task, so a stalled one never
//! delays another.
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

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::FutureExt;
use http::{header, HeaderMap, HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::time::Instant;
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;
use tokio_util::task::task_tracker::TaskTrackerToken;

use crate::admission::Refusal;
use crate::auth::{presented_key, SUBPROTOCOL_REALTIME};
use crate::client_conn::{self, First};
use crate::client_secret::is_client_secret;
use crate::gateway::Gateway;
use crate::metrics::ReasonLabels;
use crate::session::{ClientStart, Session};

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
        tokio::spawn(serve_client(tcp, gw.clone(), builder.clone(), api.clone()));
    }
}

/// One client connection: its first request read here, a Realtime upgrade
/// served without hyper ([`crate::client_conn`]) and its session run in
/// this same task; everything else, and everything after a refused
/// upgrade, served by hyper.
///
/// The session runs here rather than in a task of its own: a spawn costs an
/// allocation, a move of the session's future and a hop through the
/// scheduler per session. What this task holds beside the session stays
/// small: the first request's handling and hyper's connection are boxed, so
/// neither sits in this future's state while the session runs (an earlier
/// attempt that kept them inline cost +6.4 KiB per live session).
async fn serve_client(
    tcp: TcpStream,
    gw: Arc<Gateway>,
    builder: hyper::server::conn::http1::Builder,
    api: axum::Router,
) {
    match Box::pin(first_request(tcp, &gw)).await {
        Next::Session(session) => {
            drop((builder, api, gw));
            session.await;
        }
        Next::Hyper(io) => Box::pin(serve_with_hyper(io, gw, &builder, api)).await,
        Next::Done => {}
    }
}

/// What a connection does after its first request.
enum Next {
    /// An admitted Realtime upgrade: its session, tracked (a drain waits for
    /// it as for any session) and boxed (this future's state holds only the
    /// pointer while it runs).
    Session(Pin<Box<dyn Future<Output = ()> + Send>>),
    /// Everything else: hyper serves the connection (from its first byte, or
    /// after a refused upgrade's answer).
    Hyper(client_conn::Rewind),
    /// The connection is gone.
    Done,
}

/// Reads the first request; answers a Realtime upgrade itself.
async fn first_request(mut tcp: TcpStream, gw: &Arc<Gateway>) -> Next {
    let head_timeout = Duration::from_secs(gw.config.server.upgrade_timeout_secs);
    let first = match tokio::time::timeout(head_timeout, client_conn::read_head(&mut tcp)).await {
        Ok(f) => f,
        Err(_) => return Next::Done,
    };
    // As through hyper: a session's time starts when its request is in.
    let started = Instant::now();
    let replay = match first {
        First::Gone => return Next::Done,
        First::Other(read) => read,
        First::Get {
            head,
            read,
            head_len,
        } if REALTIME_PATHS.contains(&head.path.as_str())
            && is_websocket_upgrade(&Method::GET, &head.headers) =>
        {
            // Tracked from admission on: a drain that starts while the
            // admission waits for Redis waits for this session too.
            let admitting = gw.tasks.token();
            match check_upgrade(gw, &head.query, &head.headers, started).await {
                Ok(accepted) => {
                    let response =
                        client_conn::switching_protocols(&accepted.accept, accepted.subprotocol());
                    let start = ClientStart::Raw {
                        tcp,
                        already_read: read.slice(head_len..),
                        response: response.into(),
                    };
                    return Next::Session(Box::pin(tracked(
                        admitting,
                        accepted.session.run(start),
                    )));
                }
                Err(refusal) => {
                    // A refusal is no session: the drain need not wait for
                    // its answer to a slow client.
                    drop(admitting);
                    let (status, headers, body) = refusal_parts(&refusal);
                    let bytes = client_conn::response(status, &headers, body.as_bytes());
                    let written = tokio::time::timeout(head_timeout, tcp.write_all(&bytes)).await;
                    if !matches!(written, Ok(Ok(()))) {
                        return Next::Done;
                    }
                    // The connection stays open for the client's next
                    // request, as hyper would keep it.
                    read.slice(head_len..)
                }
            }
        }
        // Not an upgrade of a Realtime path: hyper reads it again.
        First::Get { read, .. } => read,
    };
    Next::Hyper(client_conn::Rewind::new(replay, tcp))
}

/// Serves a connection with hyper: Realtime upgrades through
/// [`handle_client`], every other request through the API router.
async fn serve_with_hyper(
    io: client_conn::Rewind,
    gw: Arc<Gateway>,
    builder: &hyper::server::conn::http1::Builder,
    api: axum::Router,
) {
    let conn = builder
        .serve_connection(
            TokioIo::new(io),
            service_fn(move |req: Request<Incoming>| {
                let gw = gw.clone();
                let api = api.clone();
                async move {
                    if REALTIME_PATHS.contains(&req.uri().path())
                        && is_websocket_upgrade(req.method(), req.headers())
                    {
                        return Ok(handle_client(req, gw).await.map(axum::body::Body::new));
                    }
                    let req = req.map(axum::body::Body::new);
                    tower::ServiceExt::oneshot(api, req).await
                }
            }),
        )
        .with_upgrades();
    let _ = conn.await;
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
    let (status, headers, body) = refusal_parts(refusal);
    let mut r = text(status, body);
    *r.headers_mut() = headers;
    r
}

/// A refusal's status, headers and body.
fn refusal_parts(refusal: &Refusal) -> (StatusCode, HeaderMap, String) {
    let mut headers = HeaderMap::new();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    if let Some(after) = refusal.retry_after {
        headers.insert(
            header::RETRY_AFTER,
            HeaderValue::from(after.as_secs().max(1)),
        );
    }
    (refusal.status, headers, refusal.body())
}

/// A WebSocket handshake request (RFC 6455 §4.2.1), by its method and
/// headers.
fn is_websocket_upgrade(method: &Method, headers: &HeaderMap) -> bool {
    let has_token = |name: header::HeaderName, token: &str| {
        headers.get_all(name).iter().any(|v| {
            v.to_str()
                .map(|s| s.split(',').any(|t| t.trim().eq_ignore_ascii_case(token)))
                .unwrap_or(false)
        })
    };
    method == Method::GET
        && has_token(header::CONNECTION, "upgrade")
        && has_token(header::UPGRADE, "websocket")
        && headers.get(header::SEC_WEBSOCKET_VERSION) == Some(&HeaderValue::from_static("13"))
        && headers.contains_key(header::SEC_WEBSOCKET_KEY)
}

/// An upgrade that passed every check: its session, ready to run, and what
/// its `101` says.
struct Accepted {
    session: Session,
    accept: String,
    wants_realtime: bool,
}

impl Accepted {
    fn subprotocol(&self) -> Option<&'static str> {
        self.wants_realtime.then_some(SUBPROTOCOL_REALTIME)
    }
}

/// Runs an admitted session, holding the drain's tracker token taken
/// before its admission until it ends (or is dropped): one token from
/// admission to end. A combinator, not an `async fn`: an `async fn` keeps
/// the future it is given and the future it awaits as two slots of its
/// state, which doubled every session's ~7 KiB (+7.3 KiB of RSS per live
/// session in the many-sessions stage).
pub(crate) fn tracked<F: Future<Output = ()>>(
    admitted: TaskTrackerToken,
    session: F,
) -> impl Future<Output = ()> {
    session.map(move |()| drop(admitted))
}

/// A WebSocket upgrade of one of [`REALTIME_PATHS`] served by hyper (a
/// request after the first on a kept-alive connection).
async fn handle_client(mut req: Request<Incoming>, gw: Arc<Gateway>) -> Response<Body> {
    let started = Instant::now();
    let query = req.uri().query().unwrap_or("");
    // Tracked from admission on, as in `first_request`.
    let admitting = gw.tasks.token();
    let accepted = match check_upgrade(&gw, query, req.headers(), started).await {
        Ok(a) => a,
        Err(r) => return refusal_response(&r),
    };
    let subprotocol = accepted.subprotocol();
    let on_upgrade = hyper::upgrade::on(&mut req);
    tokio::spawn(tracked(
        admitting,
        accepted.session.run(ClientStart::Hyper(on_upgrade)),
    ));

    let mut r = Response::new(Full::new(Bytes::new()));
    *r.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    let h = r.headers_mut();
    h.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    h.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
    if let Ok(v) = HeaderValue::from_str(&accepted.accept) {
        h.insert(header::SEC_WEBSOCKET_ACCEPT, v);
    }
    if let Some(p) = subprotocol {
        h.insert(header::SEC_WEBSOCKET_PROTOCOL, HeaderValue::from_static(p));
    }
    r
}

/// The checks before the 101 (see the module docs), the refusal counted.
async fn check_upgrade(
    gw: &Arc<Gateway>,
    query: &str,
    headers: &HeaderMap,
    started: Instant,
) -> Result<Accepted, Refusal> {
    let (model, result) = admit_upgrade(gw, query, headers, started).await;
    if let Err(r) = &result {
        count_refusal(gw, model.as_deref().unwrap_or(""), r);
    }
    result
}

/// [`check_upgrade`] before counting: the result, and the model label of a
/// refusal (set once the model is known to be served).
async fn admit_upgrade(
    gw: &Arc<Gateway>,
    query: &str,
    headers: &HeaderMap,
    started: Instant,
) -> (Option<String>, Result<Accepted, Refusal>) {
    if gw.sessions.is_draining() {
        return (None, Err(Refusal::draining()));
    }
    let presented = presented_key(headers);
    let requested_model = url::form_urlencoded::parse(query.as_bytes())
        .find(|(k, _)| k == "model" || k == "deployment")
        .map(|(_, v)| v.into_owned())
        .filter(|m| !m.is_empty());
    let keys = gw.keys.get();
    let (key, grant) = match presented.key.as_ref() {
        None => {
            let r = Refusal::unauthorized(
                "missing API key: send Authorization: Bearer <key>, api-key, or the openai-insecure-api-key subprotocol",
            );
            return (None, Err(r));
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
                Err(r) => return (None, Err(r)),
            }
        }
        Some(k) => match keys.lookup(k) {
            None => {
                return (
                    None,
                    Err(Refusal::unauthorized("incorrect API key provided")),
                )
            }
            Some(k) if k.disabled => {
                return (None, Err(Refusal::unauthorized("this API key is disabled")))
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
        return (None, Err(r));
    };
    let Some(route) = gw.route(&model_name).cloned() else {
        let r = Refusal::new(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            "model_not_found",
            format!("the model '{model_name}' is not served by this gateway"),
        );
        return (None, Err(r));
    };
    let session_id = crate::ids::short_id();
    let permit = match gw.admit(&key, &route, &session_id).await {
        Ok(p) => p,
        Err(r) => return (Some(model_name), Err(r)),
    };

    let params = crate::upstream::dial::session_params(query);
    let accept = headers
        .get(header::SEC_WEBSOCKET_KEY)
        .map(|k| derive_accept_key(k.as_bytes()))
        .unwrap_or_default();
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
    (
        None,
        Ok(Accepted {
            session,
            accept,
            wants_realtime,
        }),
    )
}
