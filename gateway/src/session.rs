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
//!
//! A session opened with a client secret has one more step before the
//! splice: its minted config is sent upstream as a `session.update` and the
//! `session.updated` awaited ([`crate::client_secret::apply`]), client
//! frames held the same way meanwhile; the client gets `session.created`,
//! then the `session.updated`. If the upstream refuses the config, the
//! client gets the upstream's `error` event as received and a close 1011.

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
use crate::client_secret::apply::{self, ApplyError};
use crate::client_secret::Grant;
use crate::event::error_event;
use crate::gateway::{Gateway, Route};
use crate::metering::{EndReason, SessionMeta};
use crate::metrics::{model, OutcomeLabels};
use crate::relay::{self, Kill, Limits, Tap};
use crate::upstream::dial::{DialError, UpstreamSocket, Warm};

/// Client frames held while the upstream is dialled; past either bound the
/// client is not read until the upstream is ready (TCP pushes back), so a
/// session holds at most this much plus one message
/// (`relay.max_message_bytes`) before its upstream exists.
const MAX_PENDING_FRAMES: usize = 64;
const MAX_PENDING_BYTES: usize = 1 << 20;

type ClientSocket = WebSocketStream<TokioIo<hyper::upgrade::Upgraded>>;

/// Client frames held until the upstream is ready, and their size.
#[derive(Default)]
struct Held {
    frames: relay::Pending,
    bytes: usize,
}

/// How waiting on something while holding client frames ended.
enum Hold<T> {
    Done(T),
    /// The client closed or failed.
    ClientLeft,
    Shutdown,
}

/// Runs `work` while reading (and holding, within [`MAX_PENDING_FRAMES`]
/// and [`MAX_PENDING_BYTES`]) the client's frames.
async fn hold_client_while<F: std::future::Future>(
    client: &mut ClientSocket,
    work: F,
    held: &mut Held,
    shutdown: &tokio_util::sync::CancellationToken,
) -> Hold<F::Output> {
    tokio::pin!(work);
    loop {
        tokio::select! {
            r = &mut work => return Hold::Done(r),
            msg = client.next(), if held.frames.len() < MAX_PENDING_FRAMES && held.bytes < MAX_PENDING_BYTES => match msg {
                Some(Ok(m @ (Message::Text(_) | Message::Binary(_)))) => {
                    held.bytes += m.len();
                    held.frames.push(m);
                }
                Some(Ok(Message::Close(_))) | Some(Err(_)) | None => return Hold::ClientLeft,
                Some(Ok(_)) => {}
            },
            _ = shutdown.cancelled() => return Hold::Shutdown,
        }
    }
}

pub struct Session {
    pub id: String,
    pub gateway: Arc<Gateway>,
    pub route: Arc<Route>,
    pub key: KeyEntry,
    /// Set when the session was opened with a client secret (`key` is then
    /// its parent).
    pub client_secret: Option<Grant>,
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
        let mut held = Held::default();
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
                let result = match hold_client_while(&mut client, dial, &mut held, &shutdown).await
                {
                    Hold::Done(r) => r,
                    Hold::ClientLeft => {
                        let _ = client.close(None).await;
                        self.log_end("client_left_before_session", None, None, None);
                        return;
                    }
                    Hold::Shutdown => {
                        let _ = client
                            .send(Message::Close(Some(relay::close(
                                1001,
                                "server shutting down",
                            ))))
                            .await;
                        self.log_end("shutdown", Some(1001), None, None);
                        return;
                    }
                };
                gw.metrics
                    .upstream_dial_seconds
                    .get_or_create(&label)
                    .observe(dial_started.elapsed().as_secs_f64());
                result
            }
        };
        let mut warm: Warm = match warm {
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

        // A client secret's minted config, applied before any client frame.
        let applied = match &self.client_secret {
            Some(grant) => {
                let applying =
                    self.apply_minted_config(grant, &mut client, &mut warm.ws, &mut held, setup);
                match applying.await {
                    Some(frames) => frames,
                    None => return,
                }
            }
            None => Vec::new(),
        };

        let limits = Limits {
            idle_timeout: Duration::from_secs(gw.config.relay.idle_timeout_secs),
            deadline,
        };
        let (mut tracker, meter, metering_kill) = gw.metering.start_session(
            SessionMeta::new(self.id.clone(), &self.key, &self.route.config)
                .with_client_secret(self.client_secret.as_ref().map(|g| g.id.clone())),
        );
        gw.tasks.spawn(meter.run());
        tracker.on_upstream_text(&warm.session_created);
        for frame in &applied {
            if let Message::Text(t) = frame {
                tracker.on_upstream_text(t);
            }
        }
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
        let spliced = relay::splice(client, warm.ws, held.frames, limits, &mut tracker, kill).await;
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

    /// Sends a client secret's minted config upstream and waits for
    /// `session.updated` while holding client frames, then gives the client
    /// what the upstream sent meanwhile. Returns those frames (for the
    /// tracker), or `None` when the session ended here (closed and logged).
    async fn apply_minted_config(
        &self,
        grant: &Grant,
        client: &mut ClientSocket,
        upstream: &mut UpstreamSocket,
        held: &mut Held,
        setup: Duration,
    ) -> Option<Vec<Message>> {
        let gw = &self.gateway;
        let timeout = Duration::from_secs(gw.config.server.upgrade_timeout_secs);
        let update = grant.session_update(self.route.config.protocol);
        let work = apply::apply(upstream, update, timeout);
        let result = match hold_client_while(client, work, held, &gw.shutdown).await {
            Hold::Done(r) => r,
            Hold::ClientLeft => {
                let _ = client.close(None).await;
                let _ = tokio::time::timeout(relay::CLOSE_GRACE, upstream.close(None)).await;
                self.log_end("client_left_before_session", None, None, Some(setup));
                return None;
            }
            Hold::Shutdown => {
                let _ = client
                    .send(Message::Close(Some(relay::close(
                        1001,
                        "server shutting down",
                    ))))
                    .await;
                let _ = tokio::time::timeout(relay::CLOSE_GRACE, upstream.close(None)).await;
                self.log_end("shutdown", Some(1001), None, Some(setup));
                return None;
            }
        };
        let frames = match result {
            Ok(frames) => frames,
            Err(e) => {
                tracing::warn!(session_id = %self.id, client_secret_id = %grant.id, error = %e, "minted session config not applied");
                let event = match e {
                    ApplyError::Refused { frame } => frame,
                    other => error_event(
                        "server_error",
                        "session_config_failed",
                        &format!("the minted session config could not be applied: {other}"),
                    ),
                };
                let _ = client.feed(Message::text(event)).await;
                let _ = client
                    .send(Message::Close(Some(relay::close(
                        1011,
                        "session config refused",
                    ))))
                    .await;
                let _ = tokio::time::timeout(relay::CLOSE_GRACE, upstream.close(None)).await;
                let _ = tokio::time::timeout(relay::CLOSE_GRACE, async {
                    while let Some(Ok(_)) = client.next().await {}
                })
                .await;
                self.log_end("session_config_refused", Some(1011), None, Some(setup));
                return None;
            }
        };
        for frame in &frames {
            if client.feed(frame.clone()).await.is_err() {
                self.log_end("client_gone", None, None, Some(setup));
                return None;
            }
        }
        if client.flush().await.is_err() {
            self.log_end("client_gone", None, None, Some(setup));
            return None;
        }
        Some(frames)
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
            client_secret_id = self.client_secret.as_ref().map(|g| g.id.as_str()),
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
