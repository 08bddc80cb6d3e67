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
//! [`crate::bootstrap::LISTEN_BACKLOG`] for connect bursts, `TCP_NODELAY` on every accepted
//! socket, and a head read timeout (`upgrade_timeout_secs`, the gateway's
//! own read and hyper's) so half-open upgrades are dropped instead of
//! piling up. Each connection is its own task, so a stalled one never
//! delays another.
//!
//! Out of file descriptors, `accept()` fails with `EMFILE`: the loop backs
//! off for [`ACCEPT_BACKOFF`] (the listener stays readable, so an immediate
//! retry would spin) and the gateway reports not ready until an accept can
//! succeed again ([`next_connection`]).
//!
//! An HTTP/2 prior-knowledge preface is answered `505` and closed (hyper's
//! HTTP/1 connection would close it silently).
//!
//! With TLS on the client listener ([`crate::client_tls`]) each connection's
//! handshake comes first (bounded by `upgrade_timeout_secs`), and hyper
//! serves everything after it, upgrades included.
//!
//! Checks before the 101, in order: WebSocket handshake (else the request
//! goes to the router, which answers 400 or 404); draining → 503;
//! credential → 401 (a client secret: expired, invalid, parent key disabled
//! or removed, config gone → 401; another model → 403); `?model=` → 400
//! missing (a client secret defaults to its own) / 404 unknown; a client
//! of the retired beta dialect on a GA route → 400 `beta_protocol_retired`;
//! then admission ([`Gateway::admit`], as the parent key for a client secret:
//! the key's model allow-list 403, session caps, rpm, tpm, budgets,
//! unpriced). Nothing is dialled before
//! all pass.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::FutureExt;
use http::{header, HeaderMap, HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Instant;
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;
use tokio_util::task::task_tracker::TaskTrackerToken;

use crate::access::{self, Origin};
use crate::admission::Refusal;
use crate::auth::{presented_key, SUBPROTOCOL_REALTIME};
use crate::client_conn::{self, is_websocket_upgrade, First};
use crate::client_secret::is_client_secret;
use crate::client_tls::ClientTls;
use crate::config::{Endpoint, Protocol};
use crate::descriptors;
use crate::gateway::Gateway;
use crate::http_error::{count_refusal, refusal_parts, refusal_response};
use crate::live::LivePending;
use crate::session::{ClientStart, Session};

type Body = Full<Bytes>;

fn http1(gw: &Gateway) -> hyper::server::conn::http1::Builder {
    let mut b = hyper::server::conn::http1::Builder::new();
    b.timer(TokioTimer::new())
        .header_read_timeout(std::time::Duration::from_secs(
            gw.config.server.upgrade_timeout_secs,
        ))
        .keep_alive(true);
    b
}

pub async fn serve_clients(listener: TcpListener, gw: Arc<Gateway>, tls: Option<ClientTls>) {
    let builder = http1(&gw);
    let api = crate::api::router(gw.clone());
    loop {
        // Accepting goes on while draining, so that new upgrades get a clear
        // 503 (and SDKs retry elsewhere) rather than a refused connection.
        let tcp = next_connection(&listener, &gw).await;
        let _ = tcp.set_nodelay(true);
        match &tls {
            None => tokio::spawn(serve_client(tcp, gw.clone(), builder.clone(), api.clone())),
            Some(tls) => tokio::spawn(serve_tls_client(
                tcp,
                tls.acceptor.clone(),
                gw.clone(),
                builder.clone(),
                api.clone(),
            )),
        };
    }
}

/// A connection to the TLS listener ([`crate::client_tls`]): the handshake
/// (bounded like a request head), then hyper serves it, upgrades included.
async fn serve_tls_client(
    tcp: TcpStream,
    acceptor: tokio_rustls::TlsAcceptor,
    gw: Arc<Gateway>,
    builder: hyper::server::conn::http1::Builder,
    api: axum::Router,
) {
    let peer = tcp.peer_addr().ok();
    let timeout = Duration::from_secs(gw.config.server.upgrade_timeout_secs);
    match tokio::time::timeout(timeout, acceptor.accept(tcp)).await {
        Ok(Ok(tls)) => Box::pin(serve_with_hyper(tls, peer, gw, &builder, api)).await,
        Ok(Err(e)) => tracing::debug!(error = %e, client = ?peer, "TLS handshake failed"),
        Err(_) => tracing::debug!(client = ?peer, "TLS handshake timed out"),
    }
}

/// How long the accept loops wait after a failed `accept()`.
pub const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);

/// The next client connection.
///
/// A failed accept is retried after [`ACCEPT_BACKOFF`]: the listener stays
/// readable, so an immediate retry would spin. Out of descriptors, the
/// gateway is not ready until an accept can succeed again. Linux fails an
/// `accept()` with `EMFILE` before it looks for a connection, so this
/// happens with none waiting too (the accept right after the one that took
/// the last descriptor); and with none waiting, nothing would wake the
/// loop to find out that descriptors were freed. So while accepts fail the
/// listener is looked at once per back-off: a connection, or none waiting
/// (the kernel found a descriptor before it found no connection), ends the
/// spell.
async fn next_connection(listener: &TcpListener, gw: &Gateway) -> TcpStream {
    loop {
        let result = if gw.accepts_failing() {
            tokio::time::sleep(ACCEPT_BACKOFF).await;
            match listener.accept().now_or_never() {
                Some(r) => r,
                None => {
                    accepts_recovered(gw);
                    continue;
                }
            }
        } else {
            listener.accept().await
        };
        match result {
            Ok((tcp, _peer)) => {
                accepts_recovered(gw);
                return tcp;
            }
            Err(e) if descriptors::is_out_of_descriptors(&e) => {
                gw.metrics.accept_errors.inc();
                if gw.set_accepts_failing(true) {
                    tracing::warn!(
                        error = %e,
                        live_sessions = gw.sessions.active(),
                        "accept failed: out of file descriptors; not ready until accepts succeed again"
                    );
                }
            }
            Err(e) => {
                gw.metrics.accept_errors.inc();
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(ACCEPT_BACKOFF).await;
            }
        }
    }
}

/// Accepts work again (after a spell without descriptors): ready.
fn accepts_recovered(gw: &Gateway) {
    if gw.set_accepts_failing(false) {
        tracing::info!(
            live_sessions = gw.sessions.active(),
            "accepts succeed again: ready"
        );
    }
}

/// One client connection: its first request read here, a Realtime upgrade
/// served without hyper ([`crate::client_conn`]) and its session spawned as
/// a task of its own; everything else, and everything after a refused
/// upgrade, served by hyper.
///
/// The session is a task of its own rather than awaited in this one: its
/// task then holds its future inline, so each of its wake-ups goes from the
/// task straight to the session's state. Awaited here it was boxed behind
/// this future's state (two dependent cache misses per wake-up on a cold
/// task where one will do; a frame of a voice call is one wake-up). The
/// spawn costs an allocation and a hop through the scheduler once per
/// session, and this task's 640 bytes are freed when it returns. The first
/// request's handling and hyper's connection are boxed, so neither sits in
/// this future's state (an earlier attempt that kept them inline cost
/// +6.4 KiB per live session).
async fn serve_client(
    tcp: TcpStream,
    gw: Arc<Gateway>,
    builder: hyper::server::conn::http1::Builder,
    api: axum::Router,
) {
    let peer = tcp.peer_addr().ok();
    match Box::pin(first_request(tcp, peer, &gw)).await {
        Next::Hyper(io) => Box::pin(serve_with_hyper(io, peer, gw, &builder, api)).await,
        Next::Done => {}
    }
}

/// What a connection does after its first request.
enum Next {
    /// Everything else: hyper serves the connection (from its first byte, or
    /// after a refused upgrade's answer).
    Hyper(client_conn::Rewind),
    /// The connection is gone, or its session was spawned.
    Done,
}

/// Reads the first request; answers a Realtime upgrade itself.
async fn first_request(mut tcp: TcpStream, peer: Option<SocketAddr>, gw: &Arc<Gateway>) -> Next {
    let head_timeout = Duration::from_secs(gw.config.server.upgrade_timeout_secs);
    let first = match tokio::time::timeout(head_timeout, client_conn::read_head(&mut tcp)).await {
        Ok(f) => f,
        Err(_) => return Next::Done,
    };
    // As through hyper: a session's time starts when its request is in.
    let started = Instant::now();
    let replay = match first {
        First::Gone => return Next::Done,
        First::Http2 => {
            http2_refused(tcp, peer, gw, head_timeout, started).await;
            return Next::Done;
        }
        First::Other(read) => read,
        First::Get {
            head,
            read,
            head_len,
        } if crate::session::is_session_path(&head.path)
            && is_websocket_upgrade(&Method::GET, &head.headers) =>
        {
            // Tracked from admission on: a drain that starts while the
            // admission waits for Redis waits for this session too.
            let admitting = gw.tasks.token();
            let origin = Origin::new(&head.path, Some(&head.query), peer);
            match check_upgrade(gw, &head.query, &head.headers, started, origin).await {
                Ok(accepted) => {
                    let response =
                        client_conn::switching_protocols(&accepted.accept, accepted.subprotocol());
                    let start = ClientStart::Raw {
                        tcp,
                        already_read: read.slice(head_len..),
                        response: response.into(),
                    };
                    // Tracked: a drain waits for it as for any session.
                    tokio::spawn(tracked(admitting, accepted.session.run(start)));
                    return Next::Done;
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

/// Answers an HTTP/2 prior-knowledge preface with a 505 (hyper's HTTP/1
/// connection would close it silently), then closes: the client's next
/// bytes are HTTP/2 frames no answer can follow.
async fn http2_refused(
    mut tcp: TcpStream,
    peer: Option<SocketAddr>,
    gw: &Gateway,
    within: Duration,
    started: Instant,
) {
    let r = Refusal::new(
        StatusCode::HTTP_VERSION_NOT_SUPPORTED,
        "invalid_request_error",
        "http_version_not_supported",
        "HTTP/2 is not served here: use HTTP/1.1 (WebSocket upgrades and the REST routes)",
    );
    count_refusal(gw, "", &r);
    tracing::info!(status = 505, "HTTP/2 prior-knowledge preface refused");
    if gw.config.server.access_log {
        access::Line {
            kind: "http",
            method: "PRI",
            path: "*",
            status: r.status.as_u16(),
            code: Some(r.code),
            outcome: None,
            key_id: None,
            model: None,
            client: peer,
            duration: started.elapsed(),
        }
        .emit();
    }
    let (status, mut headers, body) = refusal_parts(&r);
    headers.insert(header::CONNECTION, HeaderValue::from_static("close"));
    let bytes = client_conn::response(status, &headers, body.as_bytes());
    let _ = tokio::time::timeout(within, async {
        tcp.write_all(&bytes).await?;
        tcp.shutdown().await
    })
    .await;
    // Closing with the client's frames unread would reset the connection,
    // and a reset can destroy the answer before the client reads it: what
    // the client still sends is read and dropped, briefly.
    let _ = tokio::time::timeout(H2_LINGER, async {
        let mut sink = [0u8; 4096];
        while matches!(tcp.read(&mut sink).await, Ok(n) if n > 0) {}
    })
    .await;
}

/// How long a refused HTTP/2 connection is read (and dropped) after its
/// answer, so the answer is not lost to a reset.
const H2_LINGER: Duration = Duration::from_secs(1);

/// Serves a connection with hyper: Realtime upgrades through
/// [`handle_client`], every other request through the API router.
async fn serve_with_hyper<I>(
    io: I,
    peer: Option<SocketAddr>,
    gw: Arc<Gateway>,
    builder: &hyper::server::conn::http1::Builder,
    api: axum::Router,
) where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let conn = builder
        .serve_connection(
            TokioIo::new(io),
            service_fn(move |req: Request<Incoming>| {
                let gw = gw.clone();
                let api = api.clone();
                async move {
                    if crate::session::is_session_path(req.uri().path())
                        && is_websocket_upgrade(req.method(), req.headers())
                    {
                        return Ok(handle_client(req, peer, gw)
                            .await
                            .map(axum::body::Body::new));
                    }
                    let req = req.map(axum::body::Body::new);
                    if !gw.config.server.access_log {
                        return tower::ServiceExt::oneshot(api, req).await;
                    }
                    let request = crate::http_access::Request::of(&gw, &req, peer);
                    let response = tower::ServiceExt::oneshot(api, req).await;
                    if let Ok(r) = &response {
                        request.answered(r);
                    }
                    response
                }
            }),
        )
        .with_upgrades();
    let _ = conn.await;
}

pub async fn serve_admin(listener: TcpListener, gw: Arc<Gateway>) {
    let builder = http1(&gw);
    let history = Arc::new(crate::status_page::History::default());
    crate::status_page::spawn_sampler(gw.clone(), history.clone());
    let admin = crate::admin::router(gw, history);
    loop {
        let Ok((tcp, _)) = listener.accept().await else {
            tokio::time::sleep(ACCEPT_BACKOFF).await;
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

/// An upgrade that passed every check: its session, ready to run, and what
/// its `101` says.
struct Accepted {
    session: Upgrade,
    accept: String,
    wants_realtime: bool,
}

/// What runs after an accepted upgrade's `101`.
enum Upgrade {
    Session(Box<Session>),
    /// A Live session, admitted once its `session.start` is read.
    Live(LivePending),
}

impl Upgrade {
    fn run(self, start: ClientStart) -> impl Future<Output = ()> {
        match self {
            Upgrade::Session(s) => futures_util::future::Either::Left((*s).run(start)),
            Upgrade::Live(l) => futures_util::future::Either::Right(l.run(start)),
        }
    }
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

/// A WebSocket upgrade of one of [`crate::session::REALTIME_PATHS`] served by hyper (a
/// request after the first on a kept-alive connection).
async fn handle_client(
    mut req: Request<Incoming>,
    peer: Option<SocketAddr>,
    gw: Arc<Gateway>,
) -> Response<Body> {
    let started = Instant::now();
    let query = req.uri().query().unwrap_or("");
    let origin = Origin::new(req.uri().path(), Some(query), peer);
    // Tracked from admission on, as in `first_request`.
    let admitting = gw.tasks.token();
    let accepted = match check_upgrade(&gw, query, req.headers(), started, origin).await {
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

/// The checks before the 101 (see the module docs), the refusal counted
/// and written to the access log.
async fn check_upgrade(
    gw: &Arc<Gateway>,
    query: &str,
    headers: &HeaderMap,
    started: Instant,
    origin: Origin,
) -> Result<Accepted, Refusal> {
    let mut refused = Refused::default();
    let result = admit_upgrade(gw, query, headers, started, origin, &mut refused).await;
    if let Err(r) = &result {
        count_refusal(gw, refused.model.as_deref().unwrap_or(""), r);
        if gw.config.server.access_log {
            access::Line {
                kind: "websocket",
                method: "GET",
                path: &refused.path,
                status: r.status.as_u16(),
                code: Some(r.code),
                outcome: None,
                key_id: refused.key_id.as_deref(),
                model: access::query_model(Some(query)).as_deref(),
                client: refused.client,
                duration: started.elapsed(),
            }
            .emit();
        }
    }
    result
}

/// A translation model is served at the translation path, every other at a
/// Realtime path: 400 naming the right one otherwise.
fn endpoint_matches(path: &str, route: &crate::config::RouteConfig) -> Result<(), Refusal> {
    let path = path.split('?').next().unwrap_or_default();
    let at_translations = crate::session::TRANSLATION_PATHS.contains(&path);
    let translations = route.endpoint == Endpoint::Translations;
    if at_translations == translations {
        return Ok(());
    }
    let right = if translations {
        "/v1/realtime/translations"
    } else {
        "/v1/realtime"
    };
    Err(Refusal::new(
        StatusCode::BAD_REQUEST,
        "invalid_request_error",
        "wrong_endpoint",
        format!(
            "the model '{}' is served at {right}?model={}",
            route.model, route.model
        ),
    )
    .with_param("model"))
}

/// The `intent` a client's query asked for.
fn intent_of(params: &[(String, String)]) -> Option<&str> {
    params
        .iter()
        .find(|(k, _)| k == "intent")
        .map(|(_, v)| v.as_str())
}

/// Why no route serves an upgrade: 400 without a model (and no route for
/// its intent), 404 for a model no route serves.
fn no_route(model: Option<&str>, intent: Option<&str>) -> Refusal {
    match (model, intent) {
        (Some(m), _) => Refusal::new(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            "model_not_found",
            format!("the model '{m}' is not served by this gateway"),
        ),
        (None, Some(i)) => Refusal::new(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            "missing_model",
            format!(
                "no route of this gateway serves intent={i} sessions without a model: connect with ?model=<route>, or configure a route with intent = \"{i}\""
            ),
        )
        .with_param("model"),
        (None, None) => Refusal::new(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            "missing_model",
            "missing required query parameter: model",
        ),
    }
}

/// What a refused upgrade's count and access line need from the checks.
#[derive(Default)]
struct Refused {
    /// The model label: set once the model is known to be served.
    model: Option<String>,
    /// The key's id, once the key is known.
    key_id: Option<String>,
    path: String,
    client: Option<SocketAddr>,
}

/// [`check_upgrade`] before counting; `refused` is filled for a refusal's
/// count and access line.
async fn admit_upgrade(
    gw: &Arc<Gateway>,
    query: &str,
    headers: &HeaderMap,
    started: Instant,
    origin: Origin,
    refused: &mut Refused,
) -> Result<Accepted, Refusal> {
    refused.path = origin.path;
    refused.client = origin.client;
    if gw.sessions.is_draining() {
        return Err(Refusal::draining());
    }
    let presented = presented_key(headers);
    let requested_model = access::query_model(Some(query));
    let keys = gw.keys.get();
    let (key, grant) = match presented.key.as_ref() {
        None => {
            let r = Refusal::unauthorized(
                "missing API key: send Authorization: Bearer <key>, api-key, or the openai-insecure-api-key subprotocol",
            );
            return Err(r);
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
                Err(r) => return Err(r),
            }
        }
        Some(k) => match keys.lookup(k) {
            None => return Err(Refusal::unauthorized("incorrect API key provided")),
            Some(k) if k.disabled => {
                refused.key_id = Some(k.id.clone());
                return Err(Refusal::unauthorized("this API key is disabled"));
            }
            Some(k) => (k.clone(), None),
        },
    };
    let wants_realtime = presented.wants_realtime_subprotocol;
    let speaks_beta = presented.speaks_beta;
    drop(presented);
    let accept = headers
        .get(header::SEC_WEBSOCKET_KEY)
        .map(|k| derive_accept_key(k.as_bytes()))
        .unwrap_or_default();
    let bare_path = refused.path.split('?').next().unwrap_or_default();
    if crate::session::LIVE_PATHS.contains(&bare_path) {
        // The model and the admission come with `session.start`
        // ([`crate::live`]).
        if grant.is_some() {
            refused.key_id = Some(key.id);
            return Err(Refusal::new(
                StatusCode::FORBIDDEN,
                "invalid_request_error",
                "client_secret_not_accepted",
                "OpenAI's Live API takes no client secrets: connect a Live session with an API key",
            ));
        }
        let pending = LivePending {
            gateway: gw.clone(),
            key,
            started,
            origin: Box::new(Origin {
                path: std::mem::take(&mut refused.path),
                client: refused.client,
                trace: gw.telemetry.parent(headers),
            }),
            fork: None,
        };
        return Ok(Accepted {
            session: Upgrade::Live(pending),
            accept,
            wants_realtime,
        });
    }
    let mut params = crate::upstream::dial::session_params(query);
    let model_name = requested_model.or_else(|| grant.as_ref().map(|g| g.model.clone()));
    let route = match &model_name {
        Some(m) => gw.route(m).cloned(),
        None => intent_of(&params).and_then(|i| gw.route_for_intent(i).cloned()),
    };
    let Some(route) = route else {
        refused.key_id = Some(key.id);
        return Err(no_route(model_name.as_deref(), intent_of(&params)));
    };
    if let Some(intent) = route.config.intent {
        // The route's own URL carries its intent: the session can take a
        // pooled socket.
        params.retain(|(k, v)| !(k == "intent" && v == intent.as_str()));
    }
    let model_name = route.config.model.clone();
    if let Err(r) = endpoint_matches(&refused.path, &route.config) {
        refused.key_id = Some(key.id);
        return Err(r);
    }
    if speaks_beta && route.config.protocol == Protocol::Ga {
        refused.key_id = Some(key.id);
        return Err(Refusal::beta_retired(&format!(
            "/v1/realtime?model={}",
            route.config.model
        )));
    }
    let session_id = crate::ids::short_id();
    let permit = match gw.admit(&key, &route, &session_id).await {
        Ok(p) => p,
        Err(r) => {
            refused.model = Some(model_name);
            refused.key_id = Some(key.id);
            return Err(r);
        }
    };

    let session = Session {
        id: session_id,
        gateway: gw.clone(),
        route,
        key,
        client_secret: grant,
        permit,
        params,
        started,
        origin: Box::new(Origin {
            path: std::mem::take(&mut refused.path),
            client: refused.client,
            trace: gw.telemetry.parent(headers),
        }),
        live_start: None,
    };
    Ok(Accepted {
        session: Upgrade::Session(Box::new(session)),
        accept,
        wants_realtime,
    })
}
