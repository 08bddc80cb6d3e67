//! The gateway's shared state and its start-up: routes with their prepared
//! upstreams, the key store, counters, metrics, and the listeners.
//!
//! [`start`] binds both listeners and returns a [`Running`] handle with the
//! bound addresses (tests bind `127.0.0.1:0`), so the same code path serves
//! `serve`, `demo` and the in-process tests.

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
use crate::metrics::{Metrics, ModelMeters, UpstreamLabels};
use crate::store::leases::{Acquire, Lease, Leases};
use crate::store::redis::RedisConn;
use crate::upstream::breaker::Breaker;
use crate::upstream::dial::Upstream;
use crate::upstream::pool::{parse_size_file, Pool};
use crate::upstream::select::{self, Candidate, Selector};
use crate::{server, watch};

/// How often `[pool] size_file` is re-read.
pub const SIZE_FILE_POLL: Duration = Duration::from_secs(2);
/// How often the keys file is checked for changes.
pub const KEYS_FILE_POLL: Duration = Duration::from_secs(2);
/// How often the config file is checked for price edits.
pub const CONFIG_FILE_POLL: Duration = Duration::from_secs(2);

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

    pub fn pool_size(&self) -> usize {
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

    /// Keeps the pool split current with the breakers until `stop`.
    async fn watch_health(self: Arc<Self>, stop: CancellationToken) {
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
    ready: AtomicBool,
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
                let shares = initial_shares(&list, pool_size);
                let upstreams = list
                    .into_iter()
                    .zip(shares)
                    .map(|(up, share)| {
                        let upstream = Arc::new(
                            Upstream::for_upstream(r, &up, timeout, config.relay.max_message_bytes)
                                .map_err(err)?,
                        );
                        let breaker = Arc::new(Mutex::new(Breaker::new(config.server.breaker())));
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
                // the series (a missing one reads as a failed scrape).
                route.meters.sessions_active(&metrics);
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
            ready: AtomicBool::new(ready),
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

    pub fn route(&self, model: &str) -> Option<&Arc<Route>> {
        self.routes.iter().find(|r| r.config.model == model)
    }

    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Acquire) && !self.sessions.is_draining()
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

/// A live-reloaded file: its path (if configured), what it is, how often it
/// is polled, and what a change does.
/// A live-reloaded file: its path, what it is (for log lines), its label in
/// `patchbay_config_reloads_total{file}`, the poll period and how to apply it.
type Watcher = (
    Option<std::path::PathBuf>,
    &'static str,
    &'static str,
    Duration,
    fn(&Gateway, &str) -> Result<(), String>,
);

/// Applies the size file's size when it is valid and differs; a bad value
/// is refused (the watcher logs and counts it).
fn apply_size_file(gw: &Gateway, text: &str) -> Result<(), String> {
    let n = parse_size_file(text)?.min(gw.config.pool.max_size);
    if gw.routes.first().is_some_and(|r| r.pool_size() != n) {
        tracing::info!(size = n, "pool size changed");
        gw.set_pool_size(n);
    }
    Ok(())
}

/// Swaps in the keys file's key set; an invalid file keeps the current one.
fn apply_keys_file(gw: &Gateway, text: &str) -> Result<(), String> {
    let set = KeySet::parse(text)?;
    let set = match &gw.config.master_key {
        Some(m) => set.with_master(m),
        None => set,
    };
    tracing::debug!(keys = set.len(), "keys file loaded");
    gw.keys.replace(set);
    Ok(())
}

/// Applies the live part of the config file ([`crate::config::LiveConfig`]: `[metering]` and
/// `[[prices]]`; the meter reads prices at every flush, the unpriced policy at every admission,
/// the flush interval when a session starts) and the `priority` and `weight` of every
/// `[[routes.upstreams]]` entry. Other sections need a restart; an invalid edit is refused (and
/// counted) and keeps what is loaded.
fn apply_live_config(gw: &Gateway, text: &str) -> Result<(), String> {
    let env: std::collections::BTreeMap<String, String> = std::env::vars().collect();
    let live =
        crate::config::live_from_toml(text, &|k| env.get(k).cloned()).map_err(|e| e.to_string())?;
    let balances = crate::config::balances_from_toml(text).map_err(|e| e.to_string())?;
    if live.prices != *gw.metering.prices() {
        tracing::info!(rows = live.prices.len(), "prices reloaded");
        gw.metering.set_prices(live.prices);
    }
    if live.metering != gw.metering.config() {
        tracing::info!(
            flush_secs = live.metering.flush_secs,
            unpriced = ?live.metering.unpriced,
            "metering settings reloaded"
        );
        gw.metering.set_config(live.metering);
    }
    for route in &gw.routes {
        let mut changed = false;
        for u in &route.upstreams {
            let Some(b) = balances
                .iter()
                .find(|b| b.route == route.config.model && b.upstream == u.name())
            else {
                continue;
            };
            if (b.priority, b.weight) != (u.priority(), u.weight()) {
                u.priority.store(b.priority, Ordering::Relaxed);
                u.weight.store(b.weight, Ordering::Relaxed);
                tracing::info!(model = %route.config.model, upstream = %u.name(),
                    priority = b.priority, weight = b.weight, "upstream balance reloaded");
                changed = true;
            }
        }
        if changed {
            route.rebalance();
        }
    }
    Ok(())
}

/// Polls `path` until draining starts and hands each changed content to
/// `apply`, counted in `patchbay_config_reloads_total{file}`.
fn watch_file(
    gw: &Gateway,
    path: std::path::PathBuf,
    what: &'static str,
    file: &'static str,
    poll: Duration,
    apply: impl FnMut(&str) -> Result<(), String> + Send + 'static,
) {
    let reloads = watch::Reloads {
        file,
        counters: gw.metrics.config_reloads.clone(),
    };
    tokio::spawn(watch::on_change(
        path,
        what,
        poll,
        gw.draining.clone(),
        reloads,
        apply,
    ));
}

/// Points the shared Redis connection at the URL in a changed URL file; an
/// invalid URL keeps the current connection (the error never quotes it).
fn apply_redis_url(conn: &RedisConn, has_ca_file: bool, text: &str) -> Result<(), String> {
    let url = crate::config::checked_redis_url(text, has_ca_file)
        .map_err(|m| format!("store.redis_url_file: {m}"))?;
    // The first read of the file is the URL the process started with.
    if conn.is_for(url.expose()) {
        return Ok(());
    }
    conn.reconnect(url.expose()).map_err(|e| e.to_string())?;
    tracing::info!(store = %conn.endpoint(), "Redis URL changed; the store reconnects there");
    Ok(())
}

/// `/readyz` turns ready once every pool first reached its target, or when
/// the warm-up timeout passes, whichever comes first.
async fn mark_ready_when_warm(gw: Arc<Gateway>) {
    let warm = futures_util::future::join_all(
        gw.routes
            .iter()
            .flat_map(|r| r.upstreams.iter().map(|u| u.pool.wait_warm())),
    );
    let timeout = Duration::from_secs(gw.config.pool.warmup_timeout_secs);
    if tokio::time::timeout(timeout, warm).await.is_err() {
        tracing::warn!(
            timeout_secs = timeout.as_secs(),
            "pool warm-up timed out; ready anyway"
        );
    }
    gw.ready.store(true, Ordering::Release);
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

/// A started gateway.
#[derive(Debug)]
pub struct Running {
    pub gateway: Arc<Gateway>,
    pub addr: SocketAddr,
    pub admin_addr: SocketAddr,
}

/// Binds the client and admin listeners and starts serving.
pub async fn start(config: Config) -> Result<Running, StartError> {
    let gateway = Arc::new(Gateway::new(config)?);
    let bind =
        |addr: SocketAddr| server::bind(addr).map_err(|source| StartError::Bind { addr, source });
    let listener = bind(gateway.config.server.listen)?;
    let admin = bind(gateway.config.server.admin_listen)?;
    let addr = listener.local_addr().map_err(|source| StartError::Bind {
        addr: gateway.config.server.listen,
        source,
    })?;
    let admin_addr = admin.local_addr().map_err(|source| StartError::Bind {
        addr: gateway.config.server.admin_listen,
        source,
    })?;
    if let Some(leases) = &gateway.leases {
        leases.spawn_renewal();
    }
    for route in &gateway.routes {
        for u in &route.upstreams {
            gateway
                .tasks
                .spawn(u.pool.clone().replenish(gateway.draining.clone()));
        }
        if route.balanced() {
            tokio::spawn(route.clone().watch_health(gateway.draining.clone()));
        }
    }
    let watchers: [Watcher; 3] = [
        (
            gateway.config.pool.size_file.clone(),
            "pool size file",
            "pool_size",
            SIZE_FILE_POLL,
            apply_size_file,
        ),
        (
            gateway.config.keys.file.clone(),
            "keys file",
            "keys",
            KEYS_FILE_POLL,
            apply_keys_file,
        ),
        (
            gateway.config.source.clone(),
            "config file",
            "config",
            CONFIG_FILE_POLL,
            apply_live_config,
        ),
    ];
    for (path, what, file, poll, apply) in watchers {
        if let Some(path) = path {
            let gw = gateway.clone();
            watch_file(&gateway, path, what, file, poll, move |text| {
                apply(&gw, text)
            });
        }
    }
    for route in &gateway.routes {
        for u in &route.upstreams {
            let Some(path) = u.config.api_key_file.clone() else {
                continue;
            };
            let (model, key) = (route.config.model.clone(), u.config.api_key.clone());
            watch_file(
                &gateway,
                path,
                "upstream key file",
                "upstream_key",
                KEYS_FILE_POLL,
                move |text| crate::upstream::key::apply_key_file(&model, &key, text),
            );
        }
    }
    // A rotated Redis URL file moves the shared connection (store, leases,
    // client-secret configs, call records) to the new URL; calls fail open
    // meanwhile.
    if let (Some(path), Some(conn)) = (
        gateway.config.store.redis_url_file.clone(),
        gateway.redis.clone(),
    ) {
        let has_ca = gateway.config.store.ca_file.is_some();
        watch_file(
            &gateway,
            path,
            "Redis URL file",
            "redis_url",
            KEYS_FILE_POLL,
            move |text| apply_redis_url(&conn, has_ca, text),
        );
    }
    // Each signing key file is polled; a change to any re-reads them all.
    for path in gateway.client_secrets.signing_key_files() {
        let gw = gateway.clone();
        watch_file(
            &gateway,
            path.clone(),
            "client-secret signing key",
            "signing_key",
            KEYS_FILE_POLL,
            move |_| gw.client_secrets.reload(),
        );
    }
    tokio::spawn(mark_ready_when_warm(gateway.clone()));
    tokio::spawn(server::serve_clients(listener, gateway.clone()));
    tokio::spawn(server::serve_admin(admin, gateway.clone()));
    tracing::info!(%addr, %admin_addr, routes = gateway.routes.len(), "gateway listening");
    Ok(Running {
        gateway,
        addr,
        admin_addr,
    })
}
