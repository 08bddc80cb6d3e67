//! The WebSocket endpoints under a GPT-Live session's id, on the calls
//! router (the session's owner is known there): a client's own sideband,
//! `GET /v1/live/sessions/{id}/attach` ([`attach`]), and a WebSocket fork,
//! `GET /v1/live/sessions/{id}/fork` ([`fork`]); the same under `/openai`.
//!
//! Both check, before the `101`: a WebSocket upgrade (else 400
//! `websocket_required`); draining → 503; a Patchbay key (never a client
//! secret: OpenAI's Live takes none) → 401; the session's owner, or a key
//! of its team ([`super::live::owned_route`]) → else 404
//! `session_not_found`, nothing sent upstream.
//!
//! **Attach** (openai-python `resources/live/sideband.py`,
//! `client.live.sideband.connect(session_id=…, graceful_close=…)`): the
//! upstream's own `…/{id}/attach` is dialled with the route's upstream key,
//! with the client's `graceful_close` (the only query parameter forwarded),
//! and its refusal answered as the client's (404 as `session_not_found`,
//! others as a calls refusal, never the upstream's body). Only an attached
//! upstream gets the client its `101`. The two legs are then spliced
//! message by message: each side's frames go to the other as they arrived
//! (a text is never parsed: its bytes are handed on), a close on either
//! side closes the other with the same code, and a drain closes the client
//! with 1001 (the SDK's reconnection attaches again, to another replica).
//! Unlike the Realtime relay this one decodes frames (tokio-tungstenite on
//! both legs): a sideband carries control events and the session's
//! reflected input, not the primary's audio stream, and it is not on the
//! metering path.
//!
//! **Metering.** The client's attach meters nothing: a Live WebRTC session
//! is charged over the gateway's own sideband ([`super::sideband`]), which
//! the upstream keeps open beside any number of client attaches and which
//! sees the same `session.usage.updated` and `session.closed`. Charging
//! here too would charge each second twice. A client's `session.close`
//! sent here ends the session, and the gateway's sideband charges its final
//! figure as for any other end.
//!
//! **Fork** (`resources/live/forks.py`, `client.live.forks.connect(
//! session_id=…)`): a new Live WebSocket session of the parent's model (the
//! route in the parent's owner record), started by the client's
//! `session.start` and admitted for the forking key ([`crate::live`]: its
//! caps, budget and allow-list, before anything is dialled), dialled at the
//! upstream's `…/{id}/fork` and metered as any Live WebSocket session.
//!
//! Both serve every Live id with an owner record: WebRTC Live sessions and
//! their forks ([`super::live`]), and Live WebSocket sessions and their
//! forks, recorded once `session.started` names them
//! ([`super::live_owners`]); with Redis, on any replica.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::rejection::PathRejection;
use axum::extract::{Path, RawQuery, Request, State};
use axum::response::{IntoResponse, Response};
use futures_util::{SinkExt, StreamExt};
use http::{header, HeaderMap, HeaderValue, StatusCode};
use hyper_util::rt::TokioIo;
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::{CloseFrame, Role};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::WebSocketStream;

use crate::access::Origin;
use crate::admission::Refusal;
use crate::auth::KeyEntry;
use crate::client_conn::is_websocket_upgrade;
use crate::gateway::{Gateway, Route};
use crate::live::{Fork, LivePending};
use crate::session::ClientStart;

use super::api::{control_key, refuse_action, CallsState};
use super::live::owned_route;
use super::refusals::{session_not_found, unreachable_refusal, upstream_refusal};
use super::upstream::{self, UpstreamCallError};

/// The query parameters of a client's attach that are forwarded upstream.
const FORWARDED_PARAMS: [&str; 1] = ["graceful_close"];

/// `400 websocket_required`.
pub(super) fn websocket_required() -> Refusal {
    Refusal::new(
        StatusCode::BAD_REQUEST,
        "invalid_request_error",
        "websocket_required",
        "this endpoint only accepts WebSocket upgrades (GET with Upgrade: websocket, version 13)",
    )
}

/// The `101` answering `headers`' handshake.
pub(super) fn switching_protocols(headers: &HeaderMap) -> Response {
    let accept = headers
        .get(header::SEC_WEBSOCKET_KEY)
        .map(|k| derive_accept_key(k.as_bytes()))
        .unwrap_or_default();
    let mut r = StatusCode::SWITCHING_PROTOCOLS.into_response();
    let h = r.headers_mut();
    h.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    h.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
    if let Ok(v) = HeaderValue::from_str(&accept) {
        h.insert(header::SEC_WEBSOCKET_ACCEPT, v);
    }
    r
}

/// The forwarded parameters of a client's query.
fn forwarded(query: Option<&str>) -> Vec<(String, String)> {
    url::form_urlencoded::parse(query.unwrap_or("").as_bytes())
        .filter(|(k, _)| FORWARDED_PARAMS.contains(&k.as_ref()))
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect()
}

/// The client's answer for an upstream attach that failed.
fn attach_refusal(id: &str, e: &UpstreamCallError) -> Refusal {
    match e {
        UpstreamCallError::SidebandRefused(404) => session_not_found(id),
        UpstreamCallError::SidebandRefused(s) => {
            upstream_refusal(StatusCode::from_u16(*s).unwrap_or(StatusCode::BAD_GATEWAY))
        }
        e => unreachable_refusal(e),
    }
}

/// What both WebSocket endpoints of a Live id check first, in this order: a WebSocket upgrade,
/// an id in the path, a gateway not draining, a valid key, and a session that key (or its team)
/// owns. Returns the id, the key and the session's route.
async fn owned_upgrade(
    st: &CallsState,
    path: Result<Path<String>, PathRejection>,
    method: &http::Method,
    headers: &HeaderMap,
) -> Result<(String, KeyEntry, Arc<Route>), Refusal> {
    if !is_websocket_upgrade(method, headers) {
        return Err(websocket_required());
    }
    let Ok(Path(id)) = path else {
        return Err(session_not_found(""));
    };
    if st.gw.sessions.is_draining() {
        return Err(Refusal::draining());
    }
    let key = control_key(&st.gw, headers)?;
    let route = owned_route(st, &key, &id).await?;
    Ok((id, key, route))
}

/// `GET /v1/live/sessions/{id}/attach`.
pub(super) async fn attach(
    State(st): State<CallsState>,
    path: Result<Path<String>, PathRejection>,
    RawQuery(query): RawQuery,
    mut req: Request,
) -> Response {
    let gw = &st.gw;
    let (id, key, route) = match owned_upgrade(&st, path, req.method(), req.headers()).await {
        Ok(owned) => owned,
        Err(r) => return refuse_action(gw, "attach", r),
    };
    let timeout = Duration::from_secs(gw.config.server.upgrade_timeout_secs);
    let max = gw.config.relay.max_message_bytes;
    let params = forwarded(query.as_deref());
    let up = match upstream::sideband_with(&route.config, &id, &params, timeout, max).await {
        Ok(ws) => ws,
        Err(e) => {
            tracing::warn!(live_session_id = %id, error = %e, "client attach: the upstream attach failed");
            return refuse_action(gw, "attach", attach_refusal(&id, &e));
        }
    };
    let on_upgrade = hyper::upgrade::on(&mut req);
    let answer = switching_protocols(req.headers());
    let gw2 = gw.clone();
    gw.tasks.spawn(async move {
        let Ok(Ok(io)) = tokio::time::timeout(timeout, on_upgrade).await else {
            return;
        };
        let config = crate::relay::ws_config(max);
        let client =
            WebSocketStream::from_raw_socket(TokioIo::new(io), Role::Server, Some(config)).await;
        let started = Instant::now();
        tracing::info!(live_session_id = %id, key_id = %key.id, "client attached to a live session");
        let end = splice(&gw2, client, up).await;
        tracing::info!(live_session_id = %id, key_id = %key.id, end,
            duration_ms = started.elapsed().as_millis() as u64, "client attach ended");
    });
    answer
}

/// `GET /v1/live/sessions/{id}/fork`.
pub(super) async fn fork(
    State(st): State<CallsState>,
    path: Result<Path<String>, PathRejection>,
    mut req: Request,
) -> Response {
    let gw = &st.gw;
    let started = tokio::time::Instant::now();
    let (parent, key, route) = match owned_upgrade(&st, path, req.method(), req.headers()).await {
        Ok(owned) => owned,
        Err(r) => return refuse_action(gw, "fork", r),
    };
    let origin = Origin {
        path: req.uri().path().to_string(),
        client: None,
        trace: gw.telemetry.parent(req.headers()),
    };
    let pending = LivePending {
        gateway: gw.clone(),
        key,
        started,
        origin: Box::new(origin),
        fork: Some(Box::new(Fork { parent, route })),
    };
    let on_upgrade = hyper::upgrade::on(&mut req);
    gw.tasks.spawn(pending.run(ClientStart::Hyper(on_upgrade)));
    switching_protocols(req.headers())
}

/// Why a splice ended.
type SpliceEnd = &'static str;

/// Relays messages both ways until either side closes (the other then gets
/// the same close) or the gateway drains (the client gets 1001).
async fn splice<C, U>(gw: &Gateway, client: WebSocketStream<C>, up: WebSocketStream<U>) -> SpliceEnd
where
    C: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
    U: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let (mut ctx, mut crx) = client.split();
    let (mut utx, mut urx) = up.split();
    let end = loop {
        tokio::select! {
            m = crx.next() => match m {
                Some(Ok(Message::Close(f))) => {
                    let _ = utx.send(Message::Close(relayed(f))).await;
                    break "client_closed";
                }
                Some(Ok(m @ (Message::Text(_) | Message::Binary(_)))) => {
                    if utx.send(m).await.is_err() {
                        let _ = ctx.send(Message::Close(Some(close(1011, "upstream gone")))).await;
                        break "upstream_gone";
                    }
                }
                Some(Ok(_)) => {}
                Some(Err(_)) | None => {
                    let _ = utx.send(Message::Close(None)).await;
                    break "client_gone";
                }
            },
            m = urx.next() => match m {
                Some(Ok(Message::Close(f))) => {
                    let _ = ctx.send(Message::Close(relayed(f))).await;
                    break "upstream_closed";
                }
                Some(Ok(m @ (Message::Text(_) | Message::Binary(_)))) => {
                    if ctx.send(m).await.is_err() {
                        let _ = utx.send(Message::Close(None)).await;
                        break "client_gone";
                    }
                }
                Some(Ok(_)) => {}
                Some(Err(_)) | None => {
                    let _ = ctx.send(Message::Close(Some(close(1011, "upstream gone")))).await;
                    break "upstream_gone";
                }
            },
            _ = gw.draining.cancelled() => {
                let _ = ctx.send(Message::Close(Some(close(1001, "server shutting down")))).await;
                let _ = utx.send(Message::Close(None)).await;
                break "shutdown";
            }
        }
    };
    // Each side's close answered, briefly (the handshake's end).
    let _ = tokio::time::timeout(crate::relay::CLOSE_GRACE, async {
        let _ = tokio::join!(
            async { while let Some(Ok(_)) = crx.next().await {} },
            async { while let Some(Ok(_)) = urx.next().await {} },
        );
    })
    .await;
    end
}

fn close(code: u16, reason: &str) -> CloseFrame {
    CloseFrame {
        code: CloseCode::from(code),
        reason: reason.to_string().into(),
    }
}

/// A close relayed to the other leg: its code and reason, except the codes
/// that must not be sent (1005, 1006, 1015), sent as none.
fn relayed(f: Option<CloseFrame>) -> Option<CloseFrame> {
    f.filter(|f| !matches!(u16::from(f.code), 1005 | 1006 | 1015))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_graceful_close_is_forwarded_upstream() {
        assert_eq!(
            forwarded(Some("graceful_close=true&model=x&call_id=y")),
            vec![("graceful_close".to_string(), "true".to_string())]
        );
        assert!(forwarded(None).is_empty());
    }

    #[test]
    fn an_upstream_that_does_not_know_the_session_is_session_not_found() {
        let r = attach_refusal("live_1", &UpstreamCallError::SidebandRefused(404));
        assert_eq!(r.code, "session_not_found");
        let r = attach_refusal("live_1", &UpstreamCallError::SidebandRefused(401));
        assert_eq!(r.status, StatusCode::UNAUTHORIZED);
    }

    #[test]
    fn a_close_is_relayed_unless_its_code_may_not_be_sent() {
        assert_eq!(relayed(Some(close(1006, "x"))), None);
        assert_eq!(
            relayed(Some(close(4000, "x"))).map(|f| u16::from(f.code)),
            Some(4000)
        );
    }
}
