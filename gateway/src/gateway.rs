//! The gateway's shared state ([`Gateway`]): routes with their prepared
//! upstreams and pools, the key store, metering, metrics, sessions and the
//! drain's tokens. Everything below the HTTP edges works on it; it knows
//! nothing of listeners or start-up ([`crate::bootstrap`]) or of the files
//! that change it live ([`crate::reload`]).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::admission::{fallback_admits, Permit, Refusal, Sessions};
use crate::auth::{model_allowed, KeyEntry, KeySet, KeyStore};
use crate::client_secret::ClientSecrets;
use crate::config::{Config, RouteConfig, UpstreamConfig};
use crate::metering::Metering;
use crate::metrics::{FailoverLabels, Metrics, ModelMeters, UpstreamLabels};
use crate::store::conn::RedisConn;
use crate::store::leases::{Acquire, Lease, Leases};
use crate::telemetry::export::Drops;
use crate::telemetry::handle::Telemetry;
use crate::upstream::breaker::{Breaker, BreakerConfig};
use crate::upstream::dial::Upstream;
use crate::upstream::pool::{parse_size_file, Pool};
use crate::upstream::select::{self, Candidate, Selector};

/// A configured route, ready to dial, with a warm pool per upstream.
#[derive(Debug)]
pub struct Route {
    pub config: RouteConfig,
    /// The first upstream's dialler and pool: the only ones of a
    /// single-upstream route.
    pub upstream: Arc<Upstream>,
    pub pool: Arc<Pool>,
    /// Every upstream, in config order.
    pub upstreams: Vec<RouteUpstream>,
    selector: Mutex<Selector>,
    /// The route's pool size, split across its serving upstreams.
    pool_size: AtomicUsize,
    metrics: Arc<Metrics>,
    /// The route model's series, looked up once.
    pub meters: Arc<ModelMeters>,
}

/// One upstream of a route.
#[derive(Debug)]
pub struct RouteUpstream {
    pub config: UpstreamConfig,
    pub upstream: Arc<Upstream>,
    pub pool: Arc<Pool>,
    /// Shared by this upstream's session dials and pool refills.
    pub breaker: Arc<Mutex<Breaker>>,
    /// Live settings (a config edit applies them without a restart).
    priority: AtomicU32,
    weight: AtomicU32,
}

impl RouteUpstream {
    pub fn name(&self) -> &str {
        &self.config.name
    }

    pub fn priority(&self) -> u32 {
        self.priority.load(Ordering::Relaxed)
    }

    pub fn weight(&self) -> u32 {
        self.weight.load(Ordering::Relaxed)
    }

    /// A reloaded `priority` and `weight` (the route then rebalances).
    pub fn set_balance(&self, priority: u32, weight: u32) {
        self.priority.store(priority, Ordering::Relaxed);
        self.weight.store(weight, Ordering::Relaxed);
    }

    fn breaker(&self) -> std::sync::MutexGuard<'_, Breaker> {
        self.breaker.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether a session may dial (or take a warm socket of) this upstream
    /// now; takes the breaker's probe when its open time is up.
    pub fn try_dial(&self, now: std::time::Instant) -> bool {
        self.breaker().allow(now)
    }
}

impl Route {
    /// Several upstreams: failover, weights and circuit breakers apply. A
    /// single-upstream route dials its upstream for every session, as its
    /// pool's own backoff already keeps it from being hammered.
    pub fn balanced(&self) -> bool {
        self.upstreams.len() > 1
    }

    /// The order in which one session tries the upstreams (indexes into
    /// `upstreams`): see `upstream::select`. Empty when every breaker is
    /// open.
    pub fn plan(&self, now: std::time::Instant) -> Vec<usize> {
        if !self.balanced() {
            return vec![0];
        }
        let candidates: Vec<Candidate> = self
            .upstreams
            .iter()
            .map(|u| Candidate {
                priority: u.priority(),
                weight: u.weight(),
                available: u.breaker().would_allow(now),
            })
            .collect();
        self.selector
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .plan(&candidates)
    }

    /// Sets the route's pool size and re-splits it.
    pub fn set_pool_size(&self, n: usize) {
        self.pool_size.store(n, Ordering::Release);
        self.rebalance();
    }

    /// Warm sockets the route keeps: none for a Live route, whose socket
    /// is of no use before `session.start` names the model and config.
    pub fn pool_size(&self) -> usize {
        if self.config.endpoint == crate::config::Endpoint::Live {
            return 0;
        }
        self.pool_size.load(Ordering::Acquire)
    }

    /// Splits the pool size across the upstreams that serve now: those of
    /// the best priority whose breakers are closed, by weight. Every other
    /// upstream keeps no warm sockets (a lower priority fills only while the
    /// better ones are open). Also publishes `upstream_circuit_open`.
    pub fn rebalance(&self) {
        let size = self.pool_size();
        if !self.balanced() {
            self.pool.set_target(size);
            return;
        }
        let open: Vec<bool> = self
            .upstreams
            .iter()
            .map(|u| u.breaker().is_open())
            .collect();
        for (u, open) in self.upstreams.iter().zip(&open) {
            self.metrics
                .upstream_circuit_open
                .get_or_create(&UpstreamLabels {
                    model: self.config.model.clone(),
                    upstream: u.config.name.clone(),
                })
                .set(i64::from(*open));
        }
        let candidates: Vec<Candidate> = self
            .upstreams
            .iter()
            .zip(&open)
            .map(|(u, open)| Candidate {
                priority: u.priority(),
                weight: u.weight(),
                available: !open,
            })
            .collect();
        let shares = select::pool_shares(size, &candidates);
        for (u, share) in self.upstreams.iter().zip(shares) {
            u.pool.set_target(share);
        }
    }

    /// Creates the route's series at 0 that exist before any session: the
    /// model's ([`ModelMeters::export_at_zero`]), each pool's dials and
    /// misses, each upstream's `upstream_circuit_open`, and, with several
    /// upstreams, `upstream_failovers` for every pair and reason.
    fn export_at_zero(&self) {
        self.meters.export_at_zero(&self.metrics);
        let model = &self.config.model;
        for u in &self.upstreams {
            u.pool.export_at_zero();
            drop(
                self.metrics
                    .upstream_circuit_open
                    .get_or_create(&UpstreamLabels {
                        model: model.clone(),
                        upstream: u.config.name.clone(),
                    }),
            );
        }
        for from in &self.upstreams {
            for to in self.upstreams.iter().filter(|to| to.name() != from.name()) {
                for reason in crate::upstream::failover::REASONS {
                    drop(
                        self.metrics
                            .upstream_failovers
                            .get_or_create(&FailoverLabels {
                                model: model.clone(),
                                from: from.name().to_string(),
                                to: to.name().to_string(),
                                reason: reason.into(),
                            }),
                    );
                }
            }
        }
    }

    /// Keeps the pool split current with the breakers until `stop`.
    pub async fn watch_health(self: Arc<Self>, stop: CancellationToken) {
        let mut tick = tokio::time::interval(crate::upstream::pool::REPLENISH_TICK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tick.tick() => self.rebalance(),
            }
        }
    }
}

#[derive(Debug)]
pub struct Gateway {
    pub config: Config,
    pub routes: Vec<Arc<Route>>,
    pub keys: Arc<KeyStore>,
    pub metrics: Arc<Metrics>,
    pub metering: Metering,
    pub client_secrets: ClientSecrets,
    /// The Redis connection shared by the store, the leases and the
    /// client-secret configs (`[store]` configured).
    pub redis: Option<RedisConn>,
    pub sessions: Arc<Sessions>,
    /// Fleet-wide session leases for capped keys (Redis configured).
    pub leases: Option<Leases>,
    /// Cancelled when live sessions must close (at once in `close` mode,
    /// after the linger in `linger` mode).
    pub shutdown: CancellationToken,
    /// Cancelled as soon as draining starts: pools close their sockets and
    /// background watchers stop.
    pub draining: CancellationToken,
    /// Every session task, from admission to its last close frame.
    pub tasks: TaskTracker,
    /// OpenTelemetry export (off unless an endpoint is configured).
    pub telemetry: Telemetry,
    /// Whether the size ConfigMap's watch is open and its last value was
    /// applied ([`crate::pool_watch`]): the mounted size file, an older copy
    /// of the same ConfigMap, is then not applied.
    pub pool_size_watched: AtomicBool,
    /// Where Live WebSocket sessions record their owners, set once by the
    /// calls routes ([`crate::live_records`]).
    pub live_records: std::sync::OnceLock<Arc<dyn crate::live_records::LiveRecords>>,
    ready: AtomicBool,
    /// The client listener's accepts fail for want of descriptors.
    accepts_failing: AtomicBool,
}

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("route {model}: {message}")]
    Route { model: String, message: String },
    #[error(transparent)]
    Keys(#[from] crate::auth::KeysError),
    #[error("store: {0}")]
    Store(#[from] crate::store::StoreError),
    #[error("client secrets: {0}")]
    ClientSecrets(String),
    #[error("server.tls_cert_file: {0}")]
    Tls(String),
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
}

impl Gateway {
    pub fn new(config: Config) -> Result<Self, StartError> {
        let timeout = Duration::from_secs(config.server.upgrade_timeout_secs);
        let metrics = Arc::new(Metrics::new());
        let pool_size = initial_pool_size(&config);
        let max_idle = Duration::from_secs(config.pool.max_idle_secs);
        let routes = config
            .routes
            .iter()
            .map(|r| {
                let err = |message| StartError::Route {
                    model: r.model.clone(),
                    message,
                };
                let list = r.upstream_list().into_owned();
                let several = list.len() > 1;
                let pooled = if r.endpoint == crate::config::Endpoint::Live {
                    0
                } else {
                    pool_size
                };
                let shares = initial_shares(&list, pooled);
                let upstreams = list
                    .into_iter()
                    .zip(shares)
                    .map(|(up, share)| {
                        let upstream = Arc::new(
                            Upstream::for_upstream(r, &up, timeout, config.relay.max_message_bytes)
                                .map_err(err)?,
                        );
                        let breaker = Arc::new(Mutex::new(Breaker::new(
                            BreakerConfig::from_server(&config.server),
                        )));
                        let mut pool =
                            Pool::new(upstream.clone(), &r.model, share, max_idle, metrics.clone());
                        if several {
                            pool = pool.with_breaker(&up.name, breaker.clone());
                        }
                        Ok(RouteUpstream {
                            priority: AtomicU32::new(up.priority),
                            weight: AtomicU32::new(up.weight),
                            config: up,
                            upstream,
                            pool: Arc::new(pool),
                            breaker,
                        })
                    })
                    .collect::<Result<Vec<_>, StartError>>()?;
                let route = Route {
                    config: r.clone(),
                    upstream: upstreams[0].upstream.clone(),
                    pool: upstreams[0].pool.clone(),
                    selector: Mutex::new(Selector::new(upstreams.len())),
                    upstreams,
                    pool_size: AtomicUsize::new(pool_size),
                    meters: metrics.model_meters(&r.model),
                    metrics: metrics.clone(),
                };
                // Exported at 0 from the start: an autoscaler or the
                // operator reading a pod that has had no session yet finds
                // the series (a missing one reads as a failed scrape), and a
                // dashboard reads 0 rather than "no data".
                route.export_at_zero();
                route.rebalance();
                Ok(Arc::new(route))
            })
            .collect::<Result<Vec<_>, StartError>>()?;
        let keys = Arc::new(KeyStore::new(load_keys(&config)?));
        // One Redis connection for the store, the leases and the
        // client-secret configs, so a changed URL moves all three.
        let redis = match &config.store.redis_url {
            Some(url) => Some(RedisConn::new(
                url.expose(),
                config.store.ca_file.as_deref(),
            )?),
            None => None,
        };
        let metering = Metering::with_redis(&config, metrics.clone(), keys.clone(), redis.clone());
        let leases = redis
            .clone()
            .map(|conn| Leases::with_conn(conn, crate::store::DEFAULT_PREFIX, metrics.clone()));
        let client_secrets = ClientSecrets::with_redis(&config, metrics.clone(), redis.clone())
            .map_err(StartError::ClientSecrets)?;
        let ready = routes.iter().all(|r| r.pool_size() == 0);
        let telemetry = Telemetry::start(
            config.telemetry_settings.clone(),
            Drops(metrics.telemetry_dropped.clone()),
        );
        Ok(Self {
            config,
            routes,
            keys,
            metrics,
            metering,
            client_secrets,
            redis,
            sessions: Arc::default(),
            leases,
            shutdown: CancellationToken::new(),
            draining: CancellationToken::new(),
            tasks: TaskTracker::new(),
            telemetry,
            pool_size_watched: AtomicBool::new(false),
            live_records: std::sync::OnceLock::new(),
            ready: AtomicBool::new(ready),
            accepts_failing: AtomicBool::new(false),
        })
    }

    /// Every check before the 101, in the order of [`crate::admission`]:
    /// the key's model allow-list (403, before anything is counted),
    /// draining, the process cap, the key's session cap (across the fleet
    /// with Redis: the session takes a lease named `session_id`), then the
    /// store-backed ones (rpm, tpm, budgets, unpriced). The permit, and the
    /// lease it holds, are released if a later check refuses.
    pub async fn admit(
        &self,
        key: &KeyEntry,
        route: &Route,
        session_id: &str,
    ) -> Result<Permit, Refusal> {
        let keys = self.keys.get();
        let team = key.team.as_deref().and_then(|t| keys.team(t));
        if !model_allowed(key, team, &route.config.model) {
            return Err(Refusal::model_not_allowed(&route.config.model));
        }
        let gauge = route.meters.sessions_active(&self.metrics);
        let fleet = self.leases.as_ref().zip(key.max_sessions);
        // With fleet leases the key's cap is checked in Redis below; the
        // process still counts the key's sessions for the fallback.
        let local_cap = if fleet.is_some() {
            None
        } else {
            key.max_sessions
        };
        let mut permit =
            self.sessions
                .admit(self.config.limits.max_sessions, &key.id, local_cap, gauge)?;
        if let Some((leases, cap)) = fleet {
            permit.hold_lease(self.fleet_lease(leases, key, cap, session_id).await?);
        }
        self.metering.admit(key, team, &route.config).await?;
        Ok(permit)
    }

    /// The key's fleet-wide session cap: a lease from Redis, or, when Redis
    /// does not answer, this process's count (fail open). A lease held
    /// without Redis's answer is written by the next renewal tick.
    async fn fleet_lease(
        &self,
        leases: &Leases,
        key: &KeyEntry,
        cap: usize,
        session_id: &str,
    ) -> Result<Lease, Refusal> {
        match leases
            .acquire(&key.id, session_id, cap, std::time::SystemTime::now())
            .await
        {
            Ok(Acquire::Granted { lease, .. }) => Ok(lease),
            Ok(Acquire::Full { .. }) => Err(Refusal::key_session_cap(&key.id, cap, true)),
            Err(e) => {
                self.metrics.store_errors.inc();
                self.metrics.session_lease_fallbacks.inc();
                tracing::warn!(error = %e, key_id = %key.id, "session lease unavailable; counting this process's sessions");
                // Held even when refused: dropping it sends a removal, in
                // case the script ran although its reply was lost.
                let lease = leases.hold(&key.id, session_id);
                if fallback_admits(cap, self.sessions.key_active(&key.id)) {
                    Ok(lease)
                } else {
                    Err(Refusal::key_session_cap(&key.id, cap, false))
                }
            }
        }
    }

    /// Sets every route's pool size (clamped to `[pool] max_size`).
    pub fn set_pool_size(&self, n: usize) {
        let n = n.min(self.config.pool.max_size);
        for r in &self.routes {
            r.set_pool_size(n);
        }
    }

    /// The pool size last set, before a route splits it across its
    /// upstreams (a Live route keeps none whatever it is).
    pub fn pool_size(&self) -> usize {
        self.routes
            .first()
            .map_or(0, |r| r.pool_size.load(Ordering::Acquire))
    }

    pub fn route(&self, model: &str) -> Option<&Arc<Route>> {
        self.routes.iter().find(|r| r.config.model == model)
    }

    /// The route serving sessions of `intent` that name no model
    /// (`?intent=transcription`): the one configured with that intent.
    pub fn route_for_intent(&self, intent: &str) -> Option<&Arc<Route>> {
        self.routes
            .iter()
            .find(|r| r.config.intent.is_some_and(|i| i.as_str() == intent))
    }

    /// Marks the gateway ready (its pools warm, or the warm-up timed out).
    pub fn set_ready(&self) {
        self.ready.store(true, Ordering::Release);
    }

    /// `/readyz`: the pools warmed up, no drain, and client connections
    /// can be accepted.
    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Acquire)
            && !self.sessions.is_draining()
            && !self.accepts_failing.load(Ordering::Acquire)
    }

    /// Whether the client listener's accepts fail for want of descriptors.
    pub fn accepts_failing(&self) -> bool {
        self.accepts_failing.load(Ordering::Acquire)
    }

    /// Records whether the client listener's accepts fail for want of
    /// descriptors; `true` when that changed.
    pub fn set_accepts_failing(&self, failing: bool) -> bool {
        self.accepts_failing.swap(failing, Ordering::AcqRel) != failing
    }
}

/// Each upstream's first pool target: every breaker starts closed, so the
/// best priority serves, split by weight (see [`Route::rebalance`]).
fn initial_shares(list: &[UpstreamConfig], size: usize) -> Vec<usize> {
    let candidates: Vec<Candidate> = list
        .iter()
        .map(|u| Candidate {
            priority: u.priority,
            weight: u.weight,
            available: true,
        })
        .collect();
    select::pool_shares(size, &candidates)
}

/// The configured size, or the size file's when it is present and valid.
fn initial_pool_size(config: &Config) -> usize {
    let from_file = config
        .pool
        .size_file
        .as_deref()
        .and_then(|p| std::fs::read_to_string(p).ok())
        .and_then(|t| parse_size_file(&t).ok());
    from_file
        .unwrap_or(config.pool.size)
        .min(config.pool.max_size)
}

/// The key set from the keys file and/or the master key.
pub fn load_keys(config: &Config) -> Result<KeySet, crate::auth::KeysError> {
    let set = match &config.keys.file {
        Some(path) => KeySet::from_file(path)?,
        None => KeySet::default(),
    };
    Ok(match &config.master_key {
        Some(m) => set.with_master(m),
        None => set,
    })
}
