//! One client session after admission: finish the client's upgrade, get an
//! upstream socket, hand the client the upstream's `session.created` as
//! received, splice, and log the end.
//!
//! The client is upgraded *before* the upstream is dialled (on a connection
//! whose request the gateway read itself, the `101` is the first thing
//! queued on the client leg: it leaves as the dial starts, or in one write
//! with `session.created` on a pool hit). The client's
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

use std::pin::{pin, Pin};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use hyper::upgrade::OnUpgrade;
use hyper_util::rt::TokioIo;
use tokio::time::Instant;
use tokio_util::either::Either;

use crate::admission::Permit;
use crate::auth::KeyEntry;
use crate::client_conn::ClientIo;
use crate::client_secret::apply::{self, ApplyError};
use crate::client_secret::Grant;
use crate::config::Endpoint;
use crate::event::error_event;
use crate::gateway::{Gateway, Route};
use crate::live_records::{LiveOwner, LiveWsSession};
use crate::metering::client_models::{ModelPolicy, SessionTap};
use crate::metering::live::LiveUsage;
use crate::metering::translation::{AudioCounters, TranslationAudio};
use crate::metering::{EndReason, InlineMeter, SessionMeta};
use crate::metrics::{model, FailoverLabels};
use crate::relay::frame::FrameRole;
use crate::relay::leg::{Control, Leg, Side};
use crate::relay::reader::RawFrame;
use crate::relay::{self, Kill, Limits, Tap};
use crate::upstream::dial::{DialError, UpstreamLeg, Warm};
use crate::upstream::failover;

/// Paths a Realtime client may use: OpenAI's, and Azure's two.
pub const REALTIME_PATHS: [&str; 3] = ["/v1/realtime", "/openai/realtime", "/openai/v1/realtime"];
/// Paths a translation client may use (openai-python
/// `resources/realtime/translations/translations.py`: `…/realtime/translations`).
pub const TRANSLATION_PATHS: [&str; 2] = [
    "/v1/realtime/translations",
    "/openai/v1/realtime/translations",
];

/// Paths a GPT-Live client's primary WebSocket may use (openai-python
/// `resources/live/live.py`, `_prepare_url`: `…/live/sessions`).
pub const LIVE_PATHS: [&str; 2] = ["/v1/live/sessions", "/openai/v1/live/sessions"];

/// Whether `path` takes session upgrades (Realtime, translation or Live).
pub fn is_session_path(path: &str) -> bool {
    REALTIME_PATHS.contains(&path)
        || TRANSLATION_PATHS.contains(&path)
        || LIVE_PATHS.contains(&path)
}

/// Client frames held while the upstream is dialled; past either bound the
/// client is not read until the upstream is ready (TCP pushes back), so a
/// session holds at most this much plus one message
/// (`relay.max_message_bytes`) before its upstream exists.
const MAX_PENDING_FRAMES: usize = 64;
const MAX_PENDING_BYTES: usize = 1 << 20;

pub(crate) type ClientSocket = Leg<ClientIo>;

/// How a session gets its client socket.
pub enum ClientStart {
    /// hyper answered the `101`; the socket comes when its upgrade completes.
    Hyper(OnUpgrade),
    /// The gateway read the upgrade request itself
    /// ([`crate::client_conn`]): `response` (the `101`) is the first thing
    /// written, together with the session's first frames when they are ready
    /// at once; `already_read` is what the client sent past its request.
    Raw {
        tcp: tokio::net::TcpStream,
        already_read: Bytes,
        response: Bytes,
    },
    /// Already upgraded (a Live session, whose first frame was read before
    /// its admission: [`crate::live`]).
    Open(Box<ClientSocket>),
}

/// The client's socket once its upgrade is complete; `None` when the
/// upgrade failed or timed out.
pub(crate) async fn open_client(gw: &Gateway, start: ClientStart) -> Option<ClientSocket> {
    let max_message_bytes = gw.config.relay.max_message_bytes;
    match start {
        ClientStart::Hyper(on_upgrade) => {
            let timeout = Duration::from_secs(gw.config.server.upgrade_timeout_secs);
            match tokio::time::timeout(timeout, on_upgrade).await {
                Ok(Ok(u)) => Some(Leg::new(
                    Either::Right(TokioIo::new(u)),
                    &[],
                    Side::Server,
                    max_message_bytes,
                )),
                _ => None,
            }
        }
        ClientStart::Raw {
            tcp,
            already_read,
            response,
        } => {
            let mut leg = Leg::new(
                Either::Left(tcp),
                &already_read,
                Side::Server,
                max_message_bytes,
            );
            // Before any frame: the leg writes its queue in order.
            leg.queue(response);
            Some(leg)
        }
        ClientStart::Open(leg) => Some(*leg),
    }
}

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

/// Ends a session that never started: the `error` event, the close, and the
/// client's close reply read (so the close is not lost to a reset), all
/// within [`relay::CLOSE_GRACE`].
pub(crate) async fn end_before_session(
    client: &mut ClientSocket,
    event: String,
    code: u16,
    reason: &str,
) {
    let _ = tokio::time::timeout(relay::CLOSE_GRACE, async {
        client.queue_text(&event);
        client.close(Some(relay::close(code, reason)), |_| {}).await;
    })
    .await;
}

/// Answers a client that left before its session started (its close, or
/// nothing if the connection is gone), within [`relay::CLOSE_GRACE`].
async fn client_left(client: &mut ClientSocket) {
    let _ = tokio::time::timeout(relay::CLOSE_GRACE, client.close(None, |_| {})).await;
}

/// Closes a client 1001 because the gateway is shutting down before its
/// session started, within [`relay::CLOSE_GRACE`] (a client that stopped
/// reading must not hold the drain).
pub(crate) async fn going_away(client: &mut ClientSocket) {
    let frame = relay::close(relay::code::GOING_AWAY, "server shutting down");
    client.queue_close(Some(frame));
    let _ = tokio::time::timeout(relay::CLOSE_GRACE, client.flush()).await;
}

/// The client's next data frame, its pings answered meanwhile; `None` when
/// it closed, broke the protocol or left.
pub(crate) async fn next_client_data(client: &mut ClientSocket) -> Option<RawFrame> {
    loop {
        let next = std::future::poll_fn(|cx| {
            // Pongs leave while the client is read; a failed write shows
            // up as a failed read.
            let _ = client.poll_flush(cx);
            client.poll_frame(cx)
        })
        .await;
        match next {
            Ok(Some(f)) if f.role == FrameRole::Control => match client.answer(&f) {
                Ok(Control::PingPong) => continue,
                Ok(Control::Close(_)) | Err(_) => return None,
            },
            Ok(Some(f)) => return Some(f),
            Ok(None) | Err(_) => return None,
        }
    }
}

/// Runs `work` while reading (and holding, within [`MAX_PENDING_FRAMES`]
/// and [`MAX_PENDING_BYTES`]) the client's frames.
///
/// `work` is pinned by the caller: taken by value, it would be stored twice
/// in this future (the argument, and the pinned local it is moved into).
/// The dial it runs is part of the session's set-up ([`Session::set_up`]),
/// which is boxed, so neither is part of the future held for the session's
/// life.
async fn hold_client_while<F: std::future::Future>(
    client: &mut ClientSocket,
    mut work: Pin<&mut F>,
    held: &mut Held,
    shutdown: &tokio_util::sync::CancellationToken,
) -> Hold<F::Output> {
    loop {
        tokio::select! {
            r = &mut work => return Hold::Done(r),
            f = next_client_data(client), if held.frames.len() < MAX_PENDING_FRAMES && held.bytes < MAX_PENDING_BYTES => match f {
                Some(f) => {
                    held.bytes += f.bytes.len();
                    held.frames.push(f);
                }
                None => return Hold::ClientLeft,
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
    /// Its path and client, for the access line at its end (boxed: the
    /// session's future stays small).
    pub origin: Box<crate::access::Origin>,
    /// A Live session's start; such a session takes no pooled socket.
    pub live_start: Option<Box<LiveStart>>,
}

/// A Live session's `session.start` as the client sent it (parsed): sent
/// upstream by the dial with the upstream's model, or, for a WebSocket fork
/// of `fork_of`, as sent (a fork inherits its parent's model) to the
/// upstream's `…/{fork_of}/fork`.
#[derive(Debug)]
pub struct LiveStart {
    pub event: serde_json::Value,
    pub fork_of: Option<String>,
}

/// What the set-up hands the splice: the client, the upstream chosen (its
/// index in the route) and its socket, the client frames held meanwhile,
/// the set-up time, and the minted config's texts (for the tracker).
struct Ready {
    client: ClientSocket,
    chosen: usize,
    warm: Warm,
    held: Held,
    setup: Duration,
    applied: Vec<String>,
    /// The model policy of the client's frames ([`SessionTap`]); boxed,
    /// as the session's future holds it for the session's life.
    policy: Box<ModelPolicy>,
}

impl Session {
    pub fn run(mut self, start: ClientStart) -> impl std::future::Future<Output = ()> + Send {
        let gw = self.gateway.clone();
        let shutdown = gw.shutdown.clone();
        let route = self.route.clone();
        // An async block, not an `async fn`: an `async fn`'s arguments are
        // stored twice in its future (as arguments, then as the locals they
        // are moved to), for the session's life.
        async move {
            // Boxed: a session's future is allocated at the size of its largest
            // state and held so for the session's life, and the set-up's
            // locals (the dial and its results, moved between several of them
            // across awaits, the client secret's config) made it 8.3 KB where
            // the splice needs about half; boxed, they are freed once the
            // splice starts.
            // Bound by patterns, not moved out of named structs: a local that
            // is borrowed or partly moved out of keeps its storage in the
            // future's state until its scope ends, and `Ready`, `Warm` and
            // the session's meta (1.4 KB together) were held so, dead, for
            // the session's life.
            let Some(Ready {
                client,
                chosen,
                warm:
                    Warm {
                        leg: upstream_leg,
                        session_created,
                        created_frames,
                        connected_at,
                    },
                held:
                    Held {
                        frames: held_frames,
                        ..
                    },
                setup,
                applied,
                policy,
            }) = Box::pin(self.set_up(start)).await
            else {
                return;
            };
            // Sent to the client by the set-up: empty here.
            drop(created_frames);

            let limits = Limits {
                idle_timeout: Duration::from_secs(gw.config.relay.idle_timeout_secs),
                deadline: session_deadline(
                    self.started,
                    Instant::from_std(connected_at),
                    Duration::from_secs(gw.config.relay.max_session_secs),
                ),
            };
            // A Live session is metered by the cumulative seconds its upstream
            // reports, from its `session.started` on.
            let live = (route.config.endpoint == Endpoint::Live)
                .then(|| Arc::new(LiveUsage::new(std::time::Instant::now())));
            let live_id = live
                .as_ref()
                .and_then(|_| crate::metering::live::started_id(&session_created));
            let (trace, mut tracker, meter, metering_kill) = {
                let upstream = &route.upstreams[chosen];
                let meta = SessionMeta::new(self.id.clone(), &self.key, &route.config)
                    .on_upstream(&upstream.config, &route.config)
                    .with_client_secret(self.client_secret.as_ref().map(|g| g.id.clone()))
                    .for_live_session(live_id.clone())
                    .traced(
                        &gw.telemetry,
                        self.origin.trace,
                        &route.config,
                        &self.params,
                    );
                let trace = meta.trace.clone();
                let (tracker, meter, kill) = gw.metering.start_session(meta);
                (trace, tracker, meter, kill)
            };
            // Its owner, for its attach and forks ([`crate::live_records`]).
            let live_owner = live_id.zip(gw.live_records.get().cloned()).map(|(id, r)| {
                let s = LiveWsSession::new(id, &self.key, &route.config.model, self.started);
                // Boxed: the session's future holds it for the session's life.
                Box::new(LiveOwner::record(r, &gw.tasks, s))
            });
            // A translation session is metered by the audio it carries.
            let audio = (route.config.endpoint == Endpoint::Translations)
                .then(|| Arc::new(AudioCounters::default()));
            let meter = match (&audio, &live) {
                (Some(counters), _) => meter.measuring_audio(counters.clone()),
                (None, Some(usage)) => meter.measuring_live(usage.clone()),
                (None, None) => meter,
            };
            let mut meter = InlineMeter::new(meter);
            tracker.on_upstream_text(&session_created);
            drop(session_created);
            for text in applied {
                tracker.on_upstream_text(&text);
            }
            let (model_end, model_refused) = tokio::sync::oneshot::channel();
            // Boxed: it waits, cold, for the session's whole life (inline, its
            // three waits put the session's future over its bound).
            let kill = Box::pin(async move {
                tokio::select! {
                    k = metering_kill.fired() => k,
                    Ok(k) = model_refused => k,
                    _ = shutdown.cancelled() => Kill {
                        code: 1001,
                        reason: "server shutting down".into(),
                        error_event: None,
                        outcome: "shutdown",
                    },
                }
            });
            // Boxed: the session's future holds it for the session's life.
            let mut tap = Box::new(SessionTap::new(
                &mut tracker,
                policy,
                &gw.metrics,
                &route.config.model,
                &self.id,
                model_end,
            ));
            if let Some(counters) = audio {
                tap.measure(TranslationAudio::new(counters));
            }
            if let Some(usage) = &live {
                tap.measure_live(usage.clone());
            }
            let spliced = {
                let splice = pin!(relay::splice(
                    client,
                    upstream_leg,
                    held_frames,
                    limits,
                    &mut *tap,
                    kill,
                    // The client is gone: its slot and lease go with it, not
                    // with the upstream leg's cancel and close.
                    || self.permit.release(),
                ));
                meter.beside(splice).await
            };
            let reason = EndReason::from_end(&spliced.end);
            if let Some(usage) = &live {
                // Before the tracker finishes: the meter's last row carries it.
                // A Live upstream closes after `session.closed`: the session's
                // normal end, not an upstream failure.
                if usage.closed() && matches!(spliced.end, relay::End::UpstreamClosed(_)) {
                    usage.ended(200, "session_closed");
                } else {
                    usage.ended(reason.status(), reason.as_str());
                }
            }
            tracker.finish(reason);
            meter.finish(&gw.tasks);
            if spliced.end == relay::End::ClientGone {
                gw.metrics
                    .client_disconnects
                    .get_or_create(&model(&self.route.config.model))
                    .inc();
            }
            self.log_end(
                spliced.end.outcome(),
                spliced.client_code,
                spliced.upstream_code,
                Some(setup),
            );
            if let Some(t) = trace {
                t.ended(
                    spliced.end.outcome(),
                    spliced.client_code,
                    spliced.upstream_code,
                );
            }
            if let Some(owner) = live_owner {
                (*owner).retire(&gw.tasks);
            }
        }
    }

    /// Everything before the splice: the client's upgrade, an upstream (a
    /// pool hit, or a dial with failover while the client's frames are
    /// held), its `session.created` to the client, and a client secret's
    /// config. `None` when the session ended here (closed and logged).
    async fn set_up(&self, start: ClientStart) -> Option<Ready> {
        let gw = self.gateway.clone();
        let Some(mut client) = open_client(&gw, start).await else {
            self.log_end("upgrade_failed", None, None, None);
            return None;
        };

        let mut held = Held::default();
        let shutdown = gw.shutdown.clone();
        let route = self.route.clone();
        let balanced = route.balanced();
        let max_failovers = if balanced {
            gw.config.server.max_failovers
        } else {
            0
        };
        // Candidates in order (see `upstream::select`); each gets its own
        // dial deadline, and a retryable failure moves on to the next.
        let mut attempts = 0;
        let mut last: Option<(usize, DialError)> = None;
        let mut chosen: Option<(usize, Warm)> = None;
        for idx in route.plan(std::time::Instant::now()) {
            if attempts > max_failovers {
                break;
            }
            let up = &route.upstreams[idx];
            if balanced && !up.try_dial(std::time::Instant::now()) {
                // Its breaker's probe went to another session meanwhile.
                continue;
            }
            attempts += 1;
            if let Some((from, e)) = &last {
                gw.metrics
                    .upstream_failovers
                    .get_or_create(&FailoverLabels {
                        model: route.config.model.clone(),
                        from: route.upstreams[*from].name().to_string(),
                        to: up.name().to_string(),
                        reason: failover::reason(e).into(),
                    })
                    .inc();
            }
            let pooled = if self.params.is_empty() && self.live_start.is_none() {
                up.pool.take().ok()
            } else {
                None
            };
            let result = match pooled {
                Some(w) => Ok(w),
                None => {
                    let dial_started = Instant::now();
                    let dial = pin!(async {
                        match self.live_start.as_deref() {
                            Some(LiveStart {
                                event,
                                fork_of: Some(parent),
                            }) => {
                                up.upstream
                                    .dial_live(Some(parent), &event.to_string())
                                    .await
                            }
                            Some(LiveStart { event, .. }) => {
                                let model = up.config.upstream_model(&route.config);
                                match crate::metering::live::with_model(event, model) {
                                    Some(text) => up.upstream.dial_live(None, &text).await,
                                    None => Err(DialError::Handshake {
                                        message: "session.start has no session object".into(),
                                    }),
                                }
                            }
                            None => up.upstream.dial_with(&self.params).await,
                        }
                    });
                    let result =
                        match hold_client_while(&mut client, dial, &mut held, &shutdown).await {
                            Hold::Done(r) => r,
                            Hold::ClientLeft => {
                                client_left(&mut client).await;
                                self.log_end("client_left_before_session", None, None, None);
                                return None;
                            }
                            Hold::Shutdown => {
                                going_away(&mut client).await;
                                self.log_end("shutdown", Some(1001), None, None);
                                return None;
                            }
                        };
                    route
                        .meters
                        .dialled(&gw.metrics, &result, dial_started.elapsed());
                    if balanced {
                        let change =
                            failover::report(&up.breaker, &result, std::time::Instant::now());
                        match change {
                            failover::Change::Opened => tracing::warn!(
                                model = %route.config.model, upstream = %up.name(),
                                "upstream circuit opened: no dials go to it until a probe succeeds"
                            ),
                            failover::Change::Closed => tracing::info!(
                                model = %route.config.model, upstream = %up.name(),
                                "upstream circuit closed: its probe succeeded"
                            ),
                            failover::Change::None => {}
                        }
                        if change != failover::Change::None {
                            route.rebalance();
                        }
                    }
                    result
                }
            };
            match result {
                Ok(w) => {
                    chosen = Some((idx, w));
                    break;
                }
                Err(e) => {
                    let verdict = failover::classify(&e);
                    if verdict == failover::Verdict::Trip {
                        tracing::error!(model = %route.config.model, upstream = %up.name(), error = %e,
                            "upstream refused the gateway's key: check the upstream key");
                    }
                    tracing::warn!(session_id = %self.id, model = %route.config.model,
                        upstream = %up.name(), error = %e, "upstream dial failed");
                    last = Some((idx, e));
                    if verdict == failover::Verdict::Final {
                        break;
                    }
                }
            }
        }
        let warm = match chosen {
            Some(c) => Ok(c),
            None => Err(last.map_or(DialError::CircuitOpen, |(_, e)| e)),
        };
        let (chosen, mut warm): (usize, Warm) = match warm {
            Ok(c) => c,
            Err(e) => {
                let (event, code) = dial_error_to_client(&e);
                end_before_session(&mut client, event, code, "upstream unavailable").await;
                self.log_end("dial_failed", Some(code), None, None);
                return None;
            }
        };
        // Bounded like every write before the splice: a fresh socket takes
        // this at once unless the client is gone or stuck.
        // Moved, not cloned: a frame held here would keep its read
        // allocation for the session's whole life once written.
        for frame in std::mem::take(&mut warm.created_frames) {
            client.queue(frame);
        }
        let created = client.flush();
        if !matches!(
            tokio::time::timeout(relay::CLOSE_GRACE, created).await,
            Ok(Ok(()))
        ) {
            self.log_end("client_gone", None, None, None);
            return None;
        }
        let setup = self.started.elapsed();
        self.route
            .meters
            .setup_seconds(&gw.metrics, setup.as_secs_f64());

        let policy = {
            let keys = gw.keys.get();
            let team = self.key.team.as_deref().and_then(|t| keys.team(t));
            let upstream = &route.upstreams[chosen].config;
            // Boxed: the session's future holds it for the session's life.
            Box::new(ModelPolicy::for_session(
                &self.key,
                team,
                &gw.metering,
                &route.config,
                upstream,
            ))
        };
        // A client secret's minted config, applied before any client frame.
        let applied = match &self.client_secret {
            Some(grant) => {
                let applying = self.apply_minted_config(
                    grant,
                    &policy,
                    &mut client,
                    &mut warm.leg,
                    &mut held,
                    setup,
                );
                match applying.await {
                    Some(texts) => texts,
                    None => return None,
                }
            }
            None => Vec::new(),
        };

        Some(Ready {
            client,
            chosen,
            warm,
            held,
            setup,
            applied,
            policy,
        })
    }
    /// Sends a client secret's minted config upstream and waits for
    /// `session.updated` while holding client frames, then gives the client
    /// what the upstream sent meanwhile. Returns its text messages (for the
    /// tracker), or `None` when the session ended here (closed and logged).
    async fn apply_minted_config(
        &self,
        grant: &Grant,
        policy: &ModelPolicy,
        client: &mut ClientSocket,
        upstream: &mut UpstreamLeg,
        held: &mut Held,
        setup: Duration,
    ) -> Option<Vec<String>> {
        let gw = &self.gateway;
        let timeout = Duration::from_secs(gw.config.server.upgrade_timeout_secs);
        let update = grant.session_update(self.route.config.protocol);
        // Checked again now: the key's models or the prices may have
        // changed since the secret was minted.
        if let Err(r) = policy.check(update.as_bytes()) {
            end_before_session(client, r.event(), relay::code::POLICY, "model refused").await;
            let _ = tokio::time::timeout(relay::CLOSE_GRACE, upstream.close(None, |_| {})).await;
            self.log_end(r.code, Some(relay::code::POLICY), None, Some(setup));
            return None;
        }
        let applied = {
            let work = pin!(apply::apply(upstream, update, timeout));
            hold_client_while(client, work, held, &gw.shutdown).await
        };
        let result = match applied {
            Hold::Done(r) => r,
            Hold::ClientLeft => {
                client_left(client).await;
                let _ =
                    tokio::time::timeout(relay::CLOSE_GRACE, upstream.close(None, |_| {})).await;
                self.log_end("client_left_before_session", None, None, Some(setup));
                return None;
            }
            Hold::Shutdown => {
                going_away(client).await;
                let _ =
                    tokio::time::timeout(relay::CLOSE_GRACE, upstream.close(None, |_| {})).await;
                self.log_end("shutdown", Some(1001), None, Some(setup));
                return None;
            }
        };
        let answered = match result {
            Ok(answered) => answered,
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
                let client_leg = end_before_session(
                    client,
                    event,
                    relay::code::INTERNAL,
                    "session config refused",
                );
                let upstream_leg =
                    tokio::time::timeout(relay::CLOSE_GRACE, upstream.close(None, |_| {}));
                let _ = tokio::join!(client_leg, upstream_leg);
                self.log_end("session_config_refused", Some(1011), None, Some(setup));
                return None;
            }
        };
        for frame in answered.frames {
            client.queue(frame);
        }
        if !matches!(
            tokio::time::timeout(relay::CLOSE_GRACE, client.flush()).await,
            Ok(Ok(()))
        ) {
            self.log_end("client_gone", None, None, Some(setup));
            return None;
        }
        Some(answered.texts)
    }

    fn log_end(
        &self,
        outcome: &'static str,
        client_code: Option<u16>,
        upstream_code: Option<u16>,
        setup: Option<Duration>,
    ) {
        self.route
            .meters
            .session_ended(&self.gateway.metrics, outcome);
        let duration_ms = self.started.elapsed().as_millis() as u64;
        let client_secret_id = self.client_secret.as_ref().map(|g| g.id.as_str());
        // One line per session: with the access log on, the session's end
        // line is its access line (under the access target, with the
        // request's path, status and client); a second line per session
        // cost +0.05–0.13 ms of CPU (benchmarks/HISTORY.md).
        if self.gateway.config.server.access_log {
            tracing::info!(
                target: crate::access::TARGET,
                kind = "websocket",
                method = "GET",
                path = %self.origin.path,
                status = 101u16,
                session_id = %self.id,
                key_id = %self.key.id,
                client_secret_id,
                model = %self.route.config.model,
                client = self.origin.client.map(tracing::field::display),
                duration_ms,
                setup_ms = setup.map(millis),
                outcome,
                client_close_code = client_code,
                upstream_close_code = upstream_code,
                "session ended"
            );
        } else {
            tracing::info!(
                session_id = %self.id,
                key_id = %self.key.id,
                client_secret_id,
                model = %self.route.config.model,
                duration_ms,
                setup_ms = setup.map(millis),
                outcome,
                client_close_code = client_code,
                upstream_close_code = upstream_code,
                "session ended"
            );
        }
    }
}

/// When a session reaches `max_session`: counted from whichever started
/// first, the client's session or the upstream's. A warm socket's upstream
/// session began when it was dialled (up to `max_idle_secs` earlier), and
/// OpenAI's clock runs from there: counted from the client's start, at the
/// default 3600 s the upstream expired the session first, ending the turn
/// in flight unbilled, instead of the gateway cancelling and charging it.
fn session_deadline(
    client_started: Instant,
    upstream_started: Instant,
    max_session: Duration,
) -> Instant {
    client_started.min(upstream_started) + max_session
}

/// `d` in milliseconds to the microsecond, as the log line prints it:
/// `0.035`, not the `0.035426000000000006` of `as_secs_f64() * 1000.0`.
fn millis(d: Duration) -> f64 {
    d.as_micros() as f64 / 1000.0
}

/// The `error` event and close code a client gets when its upstream could
/// not be reached. The upstream's own first event, if it sent one, is
/// forwarded as it came, unless it refuses the gateway's own account
/// ([`failover::refuses_the_account`]: it quotes the key, masked, or is
/// about the account's quota): that one is told as a refused key, as a 401
/// is.
pub fn dial_error_to_client(e: &DialError) -> (String, u16) {
    const TRY_AGAIN_LATER: u16 = 1013;
    const INTERNAL: u16 = 1011;
    match e {
        DialError::FirstEvent {
            frame: Some(frame), ..
        } if failover::refuses_the_account(frame) => (
            error_event(
                "server_error",
                "upstream_auth_failed",
                "upstream refused the gateway's account (its key or its quota)",
            ),
            INTERNAL,
        ),
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
        DialError::CircuitOpen => (
            error_event("server_error", "upstream_unavailable", &e.client_message()),
            TRY_AGAIN_LATER,
        ),
        // The gateway's shortage, not the upstream's: busy, try again.
        DialError::OutOfDescriptors => (
            error_event(
                "server_error",
                "server_busy",
                "the gateway is out of connections right now; try again later",
            ),
            TRY_AGAIN_LATER,
        ),
        _ => (
            error_event("server_error", "upstream_unavailable", &e.client_message()),
            INTERNAL,
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Config, RouteConfig};

    #[test]
    fn a_warm_sockets_session_is_timed_from_its_upstream_start() {
        let max = Duration::from_secs(3600);
        let client = Instant::now();
        let warm = client - Duration::from_secs(25);
        assert_eq!(session_deadline(client, warm, max), warm + max);
        // A fresh dial connects after the client's start: the client's.
        let fresh = client + Duration::from_millis(40);
        assert_eq!(session_deadline(client, fresh, max), client + max);
    }

    #[test]
    fn a_gateway_out_of_descriptors_tells_the_client_it_is_busy_not_the_upstream() {
        let (event, code) = dial_error_to_client(&DialError::OutOfDescriptors);
        let v: serde_json::Value = serde_json::from_str(&event).unwrap();
        assert_eq!(v["error"]["code"], "server_busy");
        assert_eq!(code, 1013, "try again later");
        let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        let (event, _) = dial_error_to_client(&DialError::Connect {
            authority: "x:1".into(),
            source: refused,
        });
        assert!(event.contains("upstream_unavailable"), "{event}");
    }

    #[test]
    fn the_log_lines_milliseconds_stop_at_the_microsecond() {
        for (nanos, printed) in [
            (35_426, "0.035"),
            (68_318_455, "68.318"),
            (999, "0"),
            (1_000, "0.001"),
            (250_000_000, "250"),
            (12_345_678_901, "12345.678"),
        ] {
            assert_eq!(millis(Duration::from_nanos(nanos)).to_string(), printed);
        }
    }

    /// A session's future is allocated and moved whole when its task is
    /// spawned, and held for the session's life: it must stay small. It was
    /// 31 KiB when the dial's futures held a 4 KiB read buffer and each
    /// future passed by value was stored twice, twice its size when the
    /// server wrapped it in an `async fn` holding the drain's token, and
    /// 8.3 KB (release build) while the set-up's locals were part of it
    /// rather than boxed ([`Session::set_up`]), and 448 bytes more while
    /// `run` was an `async fn` (its arguments stored twice). It was 5,544
    /// bytes (debug build) while the splice was an `async fn` (its legs
    /// stored twice), the splice's teardown and its watchdog's `select!`
    /// were inline, and the set-up's results (`Ready`, `Warm`) and the
    /// session's meta kept their room after they were moved out of.
    #[tokio::test]
    async fn a_sessions_future_stays_small() {
        let config = Config {
            routes: vec![RouteConfig {
                model: "gpt-realtime".into(),
                upstream_url: "ws://127.0.0.1:9/v1/realtime".into(),
                ..RouteConfig::default()
            }],
            ..Config::default()
        };
        let gateway = Arc::new(Gateway::new(config).expect("gateway"));
        let route = gateway.route("gpt-realtime").cloned().expect("route");
        let key: KeyEntry =
            serde_json::from_value(serde_json::json!({"id": "k", "sha256": "00"})).expect("key");
        let permit = gateway.admit(&key, &route, "s1").await.expect("admitted");
        let session = Session {
            id: "s1".into(),
            gateway: gateway.clone(),
            route,
            key,
            client_secret: None,
            permit,
            params: Vec::new(),
            started: Instant::now(),
            origin: Box::default(),
            live_start: None,
        };
        let mut request = http::Request::new(());
        let run = session.run(ClientStart::Hyper(hyper::upgrade::on(&mut request)));
        let size = std::mem::size_of_val(&run);
        assert!(size <= 2304, "a session's future is {size} bytes");
        // As the server runs it: with the drain's tracker token taken at
        // admission (an `async fn` wrapper stored the session twice).
        let token = tokio_util::task::TaskTracker::new().token();
        let tracked = crate::server::tracked(token, run);
        let tracked_size = std::mem::size_of_val(&tracked);
        assert!(
            tracked_size <= size + 64,
            "a tracked session's future is {tracked_size} bytes, the session's {size}"
        );
    }
}
