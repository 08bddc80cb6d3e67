//! One client session after admission: finish the client's upgrade, get an
//! upstream socket, hand the client the upstream's `session.created` as
//! received, splice, and log the end.
//!
//! The client is upgraded *before* the upstream is dialled. The client's
//! handshake then never waits on the upstream (a slow upstream cannot hold
//! half-finished HTTP upgrades open), and every upstream failure reaches the
//! client as an OpenAI-style `error` event that SDKs surface with its
//! message, followed by a close code (1013 when retrying later can help,
//! 1011 otherwise) — a refused upgrade's HTTP body is dropped by most
//! WebSocket clients. Refusals decided locally (auth, model, admission) stay
//! HTTP errors because they are known before the 101. Frames the client sends
//! while the upstream is being dialled are held (bounded) and forwarded right
//! after `session.created`, as the upstream would have seen them.

use std::sync::Arc;
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use hyper::upgrade::OnUpgrade;
use hyper_util::rt::TokioIo;
use tokio::time::Instant;
use tokio_tungstenite::tungstenite::protocol::Role;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::WebSocketStream;

use crate::admission::Permit;
use crate::auth::KeyEntry;
use crate::event::error_event;
use crate::gateway::{Gateway, Route};
use crate::metering::{EndReason, SessionMeta};
use crate::metrics::{model, OutcomeLabels};
use crate::relay::{self, Kill, Limits, Tap};
use crate::upstream::dial::{DialError, Warm};

/// Client frames held while the upstream is dialled; past either bound the
/// client is not read until the upstream is ready (TCP pushes back), so a
/// session holds at most this much plus one message
/// (`relay.max_message_bytes`) before its upstream exists.
const MAX_PENDING_FRAMES: usize = 64;
const MAX_PENDING_BYTES: usize = 1 << 20;

pub struct Session {
    pub id: String,
    pub gateway: Arc<Gateway>,
    pub route: Arc<Route>,
    pub key: KeyEntry,
    pub permit: Permit,
    /// Session-selecting query parameters for the upstream
    /// ([`crate::upstream::dial::session_params`]). A session with any gets a
    /// fresh dial: pooled sockets were dialled without them.
    pub params: Vec<(String, String)>,
    /// When the upgrade request arrived.
    pub started: Instant,
}

impl Session {
    pub async fn run(self, on_upgrade: OnUpgrade) {
        let gw = self.gateway.clone();
        let timeout = Duration::from_secs(gw.config.server.upgrade_timeout_secs);
        let upgraded = match tokio::time::timeout(timeout, on_upgrade).await {
            Ok(Ok(u)) => u,
            _ => {
                self.log_end("upgrade_failed", None, None, None);
                return;
            }
        };
        let ws_config = crate::relay::ws_config(gw.config.relay.max_message_bytes);
        let mut client =
            WebSocketStream::from_raw_socket(TokioIo::new(upgraded), Role::Server, Some(ws_config))
                .await;

        let deadline = self.started + Duration::from_secs(gw.config.relay.max_session_secs);
        let mut pending = Vec::new();
        let mut pending_bytes = 0usize;
        let shutdown = gw.shutdown.clone();
        let label = model(&self.route.config.model);
        let pooled = if self.params.is_empty() {
            self.route.pool.take().ok()
        } else {
            None
        };
        let warm = match pooled {
            Some(w) => Ok(w),
            None => {
                let dial_started = Instant::now();
                let dial = self.route.upstream.dial_with(&self.params);
                tokio::pin!(dial);
                let result = loop {
                    tokio::select! {
                        r = &mut dial => break r,
                        msg = client.next(), if pending.len() < MAX_PENDING_FRAMES && pending_bytes < MAX_PENDING_BYTES => match msg {
                            Some(Ok(m @ (Message::Text(_) | Message::Binary(_)))) => {
                                pending_bytes += m.len();
                                pending.push(m);
                            }
                            Some(Ok(Message::Close(_))) | Some(Err(_)) | None => {
                                let _ = client.close(None).await;
                                self.log_end("client_left_before_session", None, None, None);
                                return;
                            }
                            Some(Ok(_)) => {}
                        },
                        _ = shutdown.cancelled() => {
                            let _ = client.send(Message::Close(Some(relay::close(1001, "server shutting down")))).await;
                            self.log_end("shutdown", Some(1001), None, None);
                            return;
                        }
                    }
                };
                gw.metrics
                    .upstream_dial_seconds
                    .get_or_create(&label)
                    .observe(dial_started.elapsed().as_secs_f64());
                result
            }
        };
        let warm: Warm = match warm {
            Ok(w) => w,
            Err(e) => {
                let (event, code) = dial_error_to_client(&e);
                tracing::warn!(session_id = %self.id, model = %self.route.config.model, error = %e, "upstream dial failed");
                let _ = client.feed(Message::text(event)).await;
                let _ = client
                    .send(Message::Close(Some(relay::close(
                        code,
                        "upstream unavailable",
                    ))))
                    .await;
                let _ = tokio::time::timeout(relay::CLOSE_GRACE, async {
                    while let Some(Ok(_)) = client.next().await {}
                })
                .await;
                self.log_end("dial_failed", Some(code), None, None);
                return;
            }
        };
        if client
            .send(Message::Text(warm.session_created.clone()))
            .await
            .is_err()
        {
            self.log_end("client_gone", None, None, None);
            return;
        }
        let setup = self.started.elapsed();
        gw.metrics
            .session_setup_seconds
            .get_or_create(&label)
            .observe(setup.as_secs_f64());

        let limits = Limits {
            idle_timeout: Duration::from_secs(gw.config.relay.idle_timeout_secs),
            deadline,
        };
        let (mut tracker, meter, metering_kill) = gw.metering.start_session(SessionMeta::new(
            self.id.clone(),
            &self.key,
            &self.route.config,
        ));
        gw.tasks.spawn(meter.run());
        tracker.on_upstream_text(&warm.session_created);
        let kill = async move {
            tokio::select! {
                k = metering_kill.fired() => k,
                _ = shutdown.cancelled() => Kill {
                    code: 1001,
                    reason: "server shutting down".into(),
                    error_event: None,
                    outcome: "shutdown",
                },
            }
        };
        let spliced = relay::splice(client, warm.ws, pending, limits, &mut tracker, kill).await;
        tracker.finish(EndReason::from_end(&spliced.end));
        if spliced.end == relay::End::ClientGone {
            gw.metrics.client_disconnects.get_or_create(&label).inc();
        }
        self.log_end(
            spliced.end.outcome(),
            spliced.client_code,
            spliced.upstream_code,
            Some(setup),
        );
    }

    fn log_end(
        &self,
        outcome: &'static str,
        client_code: Option<u16>,
        upstream_code: Option<u16>,
        setup: Option<Duration>,
    ) {
        self.gateway
            .metrics
            .sessions_total
            .get_or_create(&OutcomeLabels {
                model: self.route.config.model.clone(),
                outcome: outcome.into(),
            })
            .inc();
        tracing::info!(
            session_id = %self.id,
            key_id = %self.key.id,
            model = %self.route.config.model,
            duration_ms = self.started.elapsed().as_millis() as u64,
            setup_ms = setup.map(|d| d.as_secs_f64() * 1000.0),
            outcome,
            client_close_code = client_code,
            upstream_close_code = upstream_code,
            "session ended"
        );
    }
}

/// The `error` event and close code a client gets when its upstream could
/// not be reached. The upstream's own first event, if it sent one, is
/// forwarded as it came.
pub fn dial_error_to_client(e: &DialError) -> (String, u16) {
    const TRY_AGAIN_LATER: u16 = 1013;
    const INTERNAL: u16 = 1011;
    match e {
        DialError::FirstEvent {
            frame: Some(frame), ..
        } => (frame.to_string(), INTERNAL),
        DialError::Refused { status, .. } => {
            let (code, close) = match status {
                401 | 403 => ("upstream_auth_failed", INTERNAL),
                429 => ("upstream_rate_limited", TRY_AGAIN_LATER),
                s if *s >= 500 => ("upstream_unavailable", TRY_AGAIN_LATER),
                _ => ("upstream_refused", INTERNAL),
            };
            (
                error_event("server_error", code, &e.client_message()),
                close,
            )
        }
        DialError::Timeout { .. } => (
            error_event("server_error", "upstream_timeout", &e.client_message()),
            TRY_AGAIN_LATER,
        ),
        _ => (
            error_event("server_error", "upstream_unavailable", &e.client_message()),
            INTERNAL,
        ),
    }
}
