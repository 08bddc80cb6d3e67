//! The warm pool: upstream sockets that are connected, upgraded and past
//! `session.created`, waiting for a client.
//!
//! The pool is never on the correctness path. [`Pool::take`] does not await
//! anything: it pops the freshest socket, discarding those past their
//! retirement (80–100 % of `max_idle` after `session.created`, spread so a
//! pool filled at once is not retired and redialled at once; the upstream's
//! session clock runs while a socket waits) or no longer alive, and returns
//! `None` on a miss, when the session dials fresh.
//! A warm socket has read exactly one event, `session.created`, kept as
//! received, so a client cannot tell a warm socket from a cold one.
//!
//! Liveness without awaiting: a pooled socket is polled once with a no-op
//! waker. Pending means nothing arrived (alive); Ping/Pong are alive (the pong
//! the leg queues is flushed on the same poll); a text, binary or close
//! frame, an error or EOF mean dead (an upstream `session_expired` error is
//! exactly such a frame). The replenisher does the same check every
//! [`HEALTH_EVERY_TICKS`] ticks (2 s), so pings are answered while a socket
//! waits and dead sockets are reaped before a client could get them.
//!
//! Refill: every `take` wakes the replenisher at once; missing sockets are
//! dialled concurrently (at most [`MAX_DIALS_IN_FLIGHT`] at a time); a
//! [`REPLENISH_TICK`] reaps stale and dead sockets and tops up
//! (`MissedTickBehavior::Skip`). A failed dial backs the pool off
//! exponentially ([`BACKOFF_BASE`], doubling, [`BACKOFF_CAP`], at least the
//! upstream's `Retry-After`); successes decay it, a full pool ends it. Only
//! the first failure of a pass counts, so a bad key costs one pass of dials
//! per backoff period instead of hammering the upstream, and no new dial
//! starts while backing off (see [`Backoff`]).
//!
//! One pool per upstream of a route: an upstream is exactly one (model,
//! upstream key, upstream URL) triple, which is what must not be mixed
//! between clients. With a circuit breaker ([`Pool::with_breaker`]) every
//! pool dial reports to it and no dial starts while it is open (one refill
//! dial may be its probe).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use tokio::sync::Notify;
use tokio::task::JoinSet;
use tokio::time::MissedTickBehavior;
use tokio_util::sync::CancellationToken;

use crate::metrics::{Metrics, ModelMeters, ReasonLabels, ResultLabels, UpstreamLabels};
use crate::relay::frame::FrameRole;
use crate::relay::leg::Control;
use crate::upstream::breaker::Breaker;
use crate::upstream::dial::{DialError, Upstream, Warm};

pub const REPLENISH_TICK: Duration = Duration::from_millis(250);
/// Every how many ticks the pooled sockets are polled for liveness (2 s):
/// often enough to answer an upstream's pings long before it gives up on
/// them, rarely enough that a large idle pool costs next to nothing (each
/// poll registers a waker; 500 sockets polled every tick cost ~3 ms of CPU
/// per second). `take` polls the socket it hands out in any case.
pub const HEALTH_EVERY_TICKS: u64 = 8;
pub const BACKOFF_BASE: Duration = Duration::from_millis(500);
pub const BACKOFF_CAP: Duration = Duration::from_secs(30);
/// Bound on concurrent pool dials per route.
pub const MAX_DIALS_IN_FLIGHT: usize = 1024;
/// How long a discarded socket is given to close politely.
const DISCARD_CLOSE_TIMEOUT: Duration = Duration::from_secs(1);

/// Why `take` found nothing usable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Miss {
    Empty,
    Stale,
    Dead,
}

impl Miss {
    pub const ALL: [Miss; 3] = [Miss::Empty, Miss::Stale, Miss::Dead];

    pub fn label(self) -> &'static str {
        match self {
            Miss::Empty => "empty",
            Miss::Stale => "stale",
            Miss::Dead => "dead",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Health {
    Alive,
    Dead,
}

pub struct Pool {
    upstream: Arc<Upstream>,
    model: String,
    /// The upstream's name (its route's model for single-upstream routes).
    name: String,
    breaker: Option<Arc<Mutex<Breaker>>>,
    max_idle: Duration,
    /// Freshest at the back.
    warm: Mutex<VecDeque<Pooled>>,
    target: AtomicUsize,
    in_flight: AtomicUsize,
    wake: Notify,
    /// Notified whenever the pool reaches its target.
    filled: Notify,
    reached_target_once: AtomicBool,
    metrics: Arc<Metrics>,
    /// The route model's series, looked up once.
    meters: Arc<ModelMeters>,
    /// This upstream's `pool_dials{result="ok"}`, looked up at its first use.
    dials_ok: OnceLock<Counter>,
    gauge: Gauge,
    /// `pool_target_sockets`: the target, as set.
    target_gauge: Gauge,
    tick: Duration,
    /// Current backoff in ms (0 = none), for tests and logs.
    backoff_ms: AtomicU64,
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool")
            .field("model", &self.model)
            .field("target", &self.target())
            .field("warm", &self.len())
            .finish_non_exhaustive()
    }
}

impl Pool {
    pub fn new(
        upstream: Arc<Upstream>,
        model_name: &str,
        target: usize,
        max_idle: Duration,
        metrics: Arc<Metrics>,
    ) -> Self {
        let labels = UpstreamLabels {
            model: model_name.to_string(),
            upstream: model_name.to_string(),
        };
        let gauge = metrics.pool_warm_sockets.get_or_create(&labels).clone();
        let target_gauge = metrics.pool_target_sockets.get_or_create(&labels).clone();
        target_gauge.set(i64::try_from(target).unwrap_or(i64::MAX));
        Self {
            upstream,
            meters: metrics.model_meters(model_name),
            dials_ok: OnceLock::new(),
            model: model_name.to_string(),
            name: model_name.to_string(),
            breaker: None,
            max_idle,
            warm: Mutex::new(VecDeque::new()),
            target: AtomicUsize::new(target),
            in_flight: AtomicUsize::new(0),
            wake: Notify::new(),
            filled: Notify::new(),
            reached_target_once: AtomicBool::new(target == 0),
            metrics,
            gauge,
            target_gauge,
            tick: REPLENISH_TICK,
            backoff_ms: AtomicU64::new(0),
        }
    }

    /// Creates this pool's dial and miss series at 0 (each result of
    /// [`DialError::RESULT_LABELS`] and `ok`, each [`Miss`]), so they are
    /// exported before the first dial or take.
    pub fn export_at_zero(&self) {
        let results = std::iter::once("ok").chain(DialError::RESULT_LABELS);
        for result in results {
            drop(self.metrics.pool_dials.get_or_create(&ResultLabels {
                model: self.model.clone(),
                upstream: self.name.clone(),
                result: result.into(),
            }));
        }
        for miss in Miss::ALL {
            drop(self.metrics.pool_misses.get_or_create(&ReasonLabels {
                model: self.model.clone(),
                reason: miss.label().into(),
            }));
        }
    }

    /// The pool of upstream `name` of a route with several, sharing that
    /// upstream's circuit breaker.
    pub fn with_breaker(mut self, name: &str, breaker: Arc<Mutex<Breaker>>) -> Self {
        // The series `new` made under the route's model are this upstream's
        // no more: left, they would read 0 warm sockets for good.
        let old = UpstreamLabels {
            model: self.model.clone(),
            upstream: self.name.clone(),
        };
        self.metrics.pool_warm_sockets.remove(&old);
        self.metrics.pool_target_sockets.remove(&old);
        let labels = UpstreamLabels {
            model: self.model.clone(),
            upstream: name.to_string(),
        };
        self.gauge = self
            .metrics
            .pool_warm_sockets
            .get_or_create(&labels)
            .clone();
        self.target_gauge = self
            .metrics
            .pool_target_sockets
            .get_or_create(&labels)
            .clone();
        self.target_gauge.set(self.target_gauge_value());
        self.name = name.to_string();
        self.breaker = Some(breaker);
        self
    }

    /// Whether the breaker lets a refill dial go now (takes the probe when
    /// the open time is up).
    fn breaker_allows(&self) -> bool {
        match &self.breaker {
            Some(b) => b
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .allow(Instant::now()),
            None => true,
        }
    }

    /// Replaces [`REPLENISH_TICK`] (tests use a long tick to show that a
    /// `take` alone triggers the refill).
    pub fn with_tick(mut self, tick: Duration) -> Self {
        self.tick = tick;
        self
    }

    /// The current backoff after failed passes (zero when healthy).
    pub fn backoff(&self) -> Duration {
        Duration::from_millis(self.backoff_ms.load(Ordering::Acquire))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<Pooled>> {
        self.warm.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn target(&self) -> usize {
        self.target.load(Ordering::Acquire)
    }

    fn target_gauge_value(&self) -> i64 {
        i64::try_from(self.target()).unwrap_or(i64::MAX)
    }

    /// Changes the target size (and `pool_target_sockets`); the
    /// replenisher grows or shrinks the pool.
    pub fn set_target(&self, n: usize) {
        if self.target.swap(n, Ordering::AcqRel) != n {
            self.wake.notify_one();
        }
        self.target_gauge.set(self.target_gauge_value());
    }

    /// True once the pool has reached its target at least once.
    pub fn warmed_up(&self) -> bool {
        self.reached_target_once.load(Ordering::Acquire)
    }

    /// Resolves once the pool has reached its target at least once.
    pub async fn wait_warm(&self) {
        loop {
            let notified = self.filled.notified();
            if self.warmed_up() {
                return;
            }
            notified.await;
        }
    }

    /// A warm socket, or why there is none. Never awaits; wakes the
    /// replenisher to refill. With a target of 0 the pool is off:
    /// `Err(Miss::Empty)`, no metrics, and no wake-up (nothing to refill; a
    /// new target wakes it by itself), so a session costs the off pool no
    /// task switch.
    pub fn take(&self) -> Result<Warm, Miss> {
        let enabled = self.target() > 0 || !self.is_empty();
        let mut miss = Miss::Empty;
        let mut discarded = Vec::new();
        let found = {
            let mut warm = self.lock();
            let now = Instant::now();
            loop {
                let Some(Pooled {
                    warm: mut w,
                    retire_at,
                }) = warm.pop_back()
                else {
                    break None;
                };
                if now >= retire_at {
                    miss = Miss::Stale;
                    discarded.push(w);
                    continue;
                }
                if check(&mut w) == Health::Dead {
                    miss = Miss::Dead;
                    discarded.push(w);
                    continue;
                }
                break Some(w);
            }
        };
        if enabled {
            self.wake.notify_one();
        }
        self.update_gauge();
        close_in_background(discarded);
        match found {
            Some(w) => {
                self.meters.pool_hit(&self.metrics);
                Ok(w)
            }
            None => {
                if enabled {
                    self.metrics
                        .pool_misses
                        .get_or_create(&ReasonLabels {
                            model: self.model.clone(),
                            reason: miss.label().into(),
                        })
                        .inc();
                }
                Err(miss)
            }
        }
    }

    fn update_gauge(&self) {
        self.gauge.set(self.len() as i64);
    }

    /// Drops stale sockets, dead ones when `poll_health` (see
    /// [`HEALTH_EVERY_TICKS`]) and, past the target, the oldest ones. The
    /// sockets kept stay where they are (a tick used to move every pooled
    /// socket into a new queue and read the clock once per socket).
    fn reap(&self, poll_health: bool) {
        let target = self.target();
        let now = Instant::now();
        let discarded: Vec<Warm> = {
            let mut warm = self.lock();
            let mut out = Vec::new();
            let mut i = 0;
            while i < warm.len() {
                let p = &mut warm[i];
                if now >= p.retire_at || (poll_health && check(&mut p.warm) == Health::Dead) {
                    out.extend(warm.remove(i).map(|p| p.warm));
                } else {
                    i += 1;
                }
            }
            while warm.len() > target {
                out.extend(warm.pop_front().map(|p| p.warm));
            }
            out
        };
        self.update_gauge();
        close_in_background(discarded);
    }

    /// Pools `w`; true when that filled the pool to its target.
    fn push(&self, w: Warm) -> bool {
        let retire_at = w.connected_at + retire_after(self.max_idle, crate::ids::random_u64());
        let full = {
            let mut warm = self.lock();
            warm.push_back(Pooled { warm: w, retire_at });
            warm.len() >= self.target()
        };
        self.update_gauge();
        if full {
            self.reached_target_once.store(true, Ordering::Release);
            self.filled.notify_waiters();
        }
        full
    }

    async fn dial(&self) -> Result<Warm, DialError> {
        let started = Instant::now();
        let result = self.upstream.dial().await;
        self.meters
            .dialled(&self.metrics, &result, started.elapsed());
        if let Some(b) = &self.breaker {
            // The route's health watcher re-splits the pools on its tick.
            let _ = crate::upstream::failover::report(b, &result, Instant::now());
        }
        let labels = |result: &str| ResultLabels {
            model: self.model.clone(),
            upstream: self.name.clone(),
            result: result.into(),
        };
        match &result {
            Ok(_) => self
                .dials_ok
                .get_or_init(|| self.metrics.pool_dials.get_or_create(&labels("ok")).clone())
                .inc(),
            Err(e) => self
                .metrics
                .pool_dials
                .get_or_create(&labels(e.result_label()))
                .inc(),
        };
        result
    }

    /// Keeps the pool at its target until `shutdown`, then closes every
    /// pooled socket.
    pub async fn replenish(self: Arc<Self>, shutdown: CancellationToken) {
        let mut tick = tokio::time::interval(self.tick);
        tick.set_missed_tick_behavior(MissedTickBehavior::Skip);
        // Each dial carries the generation it was started in; see
        // [`Backoff`].
        let mut dials: JoinSet<(u64, Result<Warm, DialError>)> = JoinSet::new();
        let mut backoff = Backoff::default();
        let mut ticks = 0u64;
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => break,
                _ = self.wake.notified() => {}
                _ = tick.tick() => {
                    ticks += 1;
                    self.reap(ticks.is_multiple_of(HEALTH_EVERY_TICKS));
                }
                Some(done) = dials.join_next(), if !dials.is_empty() => {
                    self.in_flight.fetch_sub(1, Ordering::AcqRel);
                    // A dial whose task panicked counts as failed, so a
                    // bug cannot spin the pool without backing off.
                    let done = done.unwrap_or_else(|e| {
                        let message = format!("dial task failed: {e}");
                        (backoff.generation, Err(DialError::Handshake { message }))
                    });
                    match done {
                        (_, Ok(w)) => {
                            let full = self.push(w);
                            backoff.succeeded(full);
                            self.backoff_ms.store(backoff.delay.as_millis() as u64, Ordering::Release);
                        }
                        (g, Err(e)) => {
                            tracing::debug!(model = %self.model, error = %e, "pool dial failed");
                            let now = tokio::time::Instant::now();
                            if let Some(pause) = backoff.failed(g, retry_after(&e), now) {
                                self.backoff_ms.store(backoff.delay.as_millis() as u64, Ordering::Release);
                                tracing::warn!(model = %self.model, error = %e,
                                    backoff_ms = pause.as_millis() as u64, "pool dial failed; backing off");
                            }
                        }
                    }
                }
            }
            if backoff.paused(tokio::time::Instant::now()) {
                continue;
            }
            let have = self.len() + self.in_flight.load(Ordering::Acquire);
            let missing = self.target().saturating_sub(have);
            let room = MAX_DIALS_IN_FLIGHT.saturating_sub(dials.len());
            for _ in 0..missing.min(room) {
                if !self.breaker_allows() {
                    break;
                }
                self.in_flight.fetch_add(1, Ordering::AcqRel);
                let pool = self.clone();
                let generation = backoff.generation;
                dials.spawn(async move { (generation, pool.dial().await) });
            }
        }
        dials.abort_all();
        let all: Vec<Warm> = self.lock().drain(..).map(|p| p.warm).collect();
        self.update_gauge();
        close_all(all).await;
    }
}

/// The refill's backoff. Dials carry the generation (pass) they started
/// in; the first failure of a generation doubles the delay (from
/// [`BACKOFF_BASE`] to [`BACKOFF_CAP`]), pauses the refill for it (or for
/// the upstream's `Retry-After`, when longer, up to the cap) and opens a
/// new generation, so the rest of that pass's failures (dials already in
/// flight) change nothing. A success halves the delay (below the base, or
/// once the pool is full, it is gone) but does not end a pause: an
/// upstream that refuses some dials and takes others (a key at its
/// concurrency limit, whose slots free up as warm sockets are retired) sees
/// one pass of dials per pause, not one after every success.
#[derive(Debug, Default)]
struct Backoff {
    generation: u64,
    delay: Duration,
    until: Option<tokio::time::Instant>,
}

impl Backoff {
    /// A dial succeeded; `full` when the pool is at its target again (the
    /// delay is gone then).
    fn succeeded(&mut self, full: bool) {
        self.delay = if full || self.delay <= BACKOFF_BASE {
            Duration::ZERO
        } else {
            self.delay / 2
        };
    }

    /// A dial of `generation` failed; returns the pause when it starts one.
    fn failed(
        &mut self,
        generation: u64,
        retry_after: Option<Duration>,
        now: tokio::time::Instant,
    ) -> Option<Duration> {
        if generation != self.generation {
            return None;
        }
        self.generation += 1;
        self.delay = (self.delay * 2).clamp(BACKOFF_BASE, BACKOFF_CAP);
        let pause = retry_after.map_or(self.delay, |r| r.clamp(self.delay, BACKOFF_CAP));
        self.until = Some(now + pause);
        Some(pause)
    }

    fn paused(&self, now: tokio::time::Instant) -> bool {
        self.until.is_some_and(|t| now < t)
    }
}

/// A refusal's `Retry-After` in seconds (the HTTP-date form is not used by
/// OpenAI and is ignored).
fn retry_after(e: &DialError) -> Option<Duration> {
    match e {
        DialError::Refused {
            retry_after: Some(v),
            ..
        } => v.trim().parse::<u64>().ok().map(Duration::from_secs),
        _ => None,
    }
}

/// A pooled socket and when it is retired.
struct Pooled {
    warm: Warm,
    retire_at: Instant,
}

/// How long after its `session.created` a warm socket is retired: between
/// 80 % and 100 % of `max_idle`, drawn from `r`. A pool filled at once
/// (at start, after an outage) would otherwise retire every socket at the
/// same tick, miss while all of them are redialled, and dial them all at
/// once again every `max_idle`; spread this way, retirements and their
/// redials spread over a fifth of it.
fn retire_after(max_idle: Duration, r: u64) -> Duration {
    let spread = max_idle / 5;
    max_idle - spread.mul_f64((r % 1024) as f64 / 1024.0)
}

/// Polls a pooled socket without awaiting: see the module doc.
fn check(w: &mut Warm) -> Health {
    let mut cx = Context::from_waker(Waker::noop());
    loop {
        match w.leg.poll_frame(&mut cx) {
            Poll::Pending => break,
            Poll::Ready(Ok(Some(f))) if f.role == FrameRole::Control => match w.leg.answer(&f) {
                Ok(Control::PingPong) => continue,
                Ok(Control::Close(_)) | Err(_) => return Health::Dead,
            },
            Poll::Ready(_) => return Health::Dead,
        }
    }
    // Push out any pong queued.
    match w.leg.poll_flush(&mut cx) {
        Poll::Ready(Err(_)) => Health::Dead,
        _ => Health::Alive,
    }
}

fn close_in_background(sockets: Vec<Warm>) {
    if !sockets.is_empty() {
        tokio::spawn(close_all(sockets));
    }
}

async fn close_all(sockets: Vec<Warm>) {
    let closes = sockets.into_iter().map(|mut w| async move {
        let _ = tokio::time::timeout(DISCARD_CLOSE_TIMEOUT, w.leg.close(None, |_| {})).await;
    });
    futures_util::future::join_all(closes).await;
}

/// Parses a size file: a bare number or a line `REALTIME_POOL_SIZE=N`
/// (comments and blank lines ignored).
pub fn parse_size_file(text: &str) -> Result<usize, String> {
    let mut found = None;
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let value = match line.split_once('=') {
            Some((k, v)) if k.trim() == "REALTIME_POOL_SIZE" => v.trim(),
            Some((k, _)) => return Err(format!("unexpected key {:?}", k.trim())),
            None => line,
        };
        let n = value
            .trim_matches('"')
            .parse::<usize>()
            .map_err(|_| format!("not a whole number: {value:?}"))?;
        if found.replace(n).is_some() {
            return Err("more than one size".into());
        }
    }
    found.ok_or_else(|| "empty".into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::RouteConfig;
    use crate::secret::Secret;
    use patchbay_sim::{self as sim, SimConfig, SimHandle};

    const WAIT: Duration = Duration::from_secs(10);

    async fn sim_and_upstream(config: SimConfig) -> (SimHandle, Arc<Upstream>) {
        let sim = sim::start(([127, 0, 0, 1], 0).into(), config)
            .await
            .unwrap();
        let route = RouteConfig {
            upstream_url: sim.url(false),
            api_key: crate::upstream_key::UpstreamKey::new(Secret::new("sk-test")),
            ..RouteConfig::default()
        };
        let upstream = Upstream::new(&route, Duration::from_secs(5), 1 << 20).unwrap();
        (sim, Arc::new(upstream))
    }

    fn pool(upstream: Arc<Upstream>, target: usize, max_idle: Duration) -> Arc<Pool> {
        Arc::new(Pool::new(
            upstream,
            "m",
            target,
            max_idle,
            Arc::new(Metrics::new()),
        ))
    }

    async fn until(mut f: impl FnMut() -> bool) {
        let deadline = Instant::now() + WAIT;
        while !f() {
            assert!(
                Instant::now() < deadline,
                "condition not met within {WAIT:?}"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    fn misses(p: &Pool, reason: &str) -> u64 {
        p.metrics
            .pool_misses
            .get_or_create(&ReasonLabels {
                model: "m".into(),
                reason: reason.into(),
            })
            .get()
    }

    /// Whether the replenisher has a wake-up waiting (polls `wake` once).
    fn woken(p: &Pool) -> bool {
        let notified = std::pin::pin!(p.wake.notified());
        let mut cx = Context::from_waker(Waker::noop());
        std::future::Future::poll(notified, &mut cx).is_ready()
    }

    #[tokio::test]
    async fn a_take_wakes_the_replenisher_only_when_the_pool_is_on() {
        let (_sim, up) = sim_and_upstream(SimConfig::default()).await;
        let p = pool(up.clone(), 0, WAIT);
        assert!(matches!(p.take(), Err(Miss::Empty)));
        assert!(!woken(&p), "an off pool has nothing to refill");
        p.set_target(1);
        assert!(woken(&p), "a new target wakes it");
        assert!(matches!(p.take(), Err(Miss::Empty)));
        assert!(woken(&p), "a miss of an on pool wakes it to refill");
        // Off again, but still holding a socket: a take hands it out and
        // wakes it (it trims or refills by the target).
        p.set_target(0);
        assert!(woken(&p));
        p.push(up.dial().await.unwrap());
        assert!(p.take().is_ok());
        assert!(woken(&p));
    }

    #[tokio::test]
    async fn stale_socket_is_discarded_not_handed_out() {
        let (_sim, up) = sim_and_upstream(SimConfig::default()).await;
        let p = pool(up.clone(), 0, Duration::from_millis(100));
        p.push(up.dial().await.unwrap());
        tokio::time::sleep(Duration::from_millis(150)).await;
        assert_eq!(p.take().err(), Some(Miss::Stale));
        assert!(p.is_empty());
    }

    #[tokio::test]
    async fn socket_closed_by_the_upstream_while_pooled_is_never_handed_out() {
        let (sim, up) = sim_and_upstream(SimConfig::default()).await;
        let p = pool(up.clone(), 0, Duration::from_secs(30));
        p.push(up.dial().await.unwrap());
        sim.close_all(1001);
        until(|| sim.stats.sessions_active.load(Ordering::Relaxed) == 0).await;
        // The close frame is on its way: wait until it reached the socket.
        until(|| {
            p.lock()
                .iter_mut()
                .all(|p| check(&mut p.warm) == Health::Dead)
        })
        .await;
        assert_eq!(p.len(), 1);
        assert_eq!(p.take().err(), Some(Miss::Dead));
    }

    #[tokio::test]
    async fn pooled_socket_that_received_a_ping_answers_it_and_stays_pooled() {
        let (sim, up) = sim_and_upstream(SimConfig::default()).await;
        let p = pool(up.clone(), 1, Duration::from_secs(30));
        p.push(up.dial().await.unwrap());
        sim.ping_all();
        // Each reap polls the pooled socket: once the ping has arrived, the
        // reap reads it and flushes the pong.
        until(|| {
            p.reap(true);
            sim.stats.pongs.load(Ordering::Relaxed) == 1
        })
        .await;
        assert_eq!(p.len(), 1, "a ping is not a dead socket");
        assert!(p.take().is_ok());
    }

    #[tokio::test]
    async fn a_reap_drops_stale_extra_and_dead_sockets_and_keeps_the_rest_in_order() {
        let (sim, up) = sim_and_upstream(SimConfig::default()).await;
        let p = pool(up.clone(), 10, Duration::from_secs(1));
        // Two that go stale, then three fresh ones (well inside the second).
        p.push(up.dial().await.unwrap());
        p.push(up.dial().await.unwrap());
        tokio::time::sleep(Duration::from_millis(1050)).await;
        for _ in 0..3 {
            p.push(up.dial().await.unwrap());
        }
        let ids = |p: &Pool| {
            p.lock()
                .iter()
                .map(|p| p.warm.connected_at)
                .collect::<Vec<_>>()
        };
        let fresh = ids(&p)[2..].to_vec();
        p.reap(false);
        assert_eq!(ids(&p), fresh, "only the stale ones go");
        // Past the target, the oldest go.
        p.set_target(2);
        p.reap(false);
        assert_eq!(ids(&p), fresh[1..].to_vec());
        // Closed by the upstream: gone at the next reap that polls health.
        sim.close_all(1001);
        until(|| {
            p.reap(true);
            p.is_empty()
        })
        .await;
        until(|| sim.stats.sessions_active.load(Ordering::Relaxed) == 0).await;
    }

    #[tokio::test]
    async fn take_alone_triggers_the_refill() {
        let (sim, up) = sim_and_upstream(SimConfig::default()).await;
        // A tick far longer than the test: only the wake from `take` refills.
        let p = Arc::new(
            Pool::new(
                up,
                "m",
                2,
                Duration::from_secs(30),
                Arc::new(Metrics::new()),
            )
            .with_tick(Duration::from_secs(3600)),
        );
        let stop = CancellationToken::new();
        tokio::spawn(p.clone().replenish(stop.clone()));
        until(|| p.len() == 2).await;
        let _a = p.take().unwrap();
        let _b = p.take().unwrap();
        until(|| p.len() == 2).await;
        assert_eq!(sim.stats.upgrades.load(Ordering::Relaxed), 4);
        assert_eq!(p.backoff(), Duration::ZERO, "a healthy key never backs off");
        stop.cancel();
    }

    #[tokio::test]
    async fn failing_key_backs_off_exponentially_and_resets_on_success() {
        let (sim, up) = sim_and_upstream(SimConfig::default()).await;
        sim.set_refusing(true);
        let p = pool(up, 2, Duration::from_secs(30));
        let stop = CancellationToken::new();
        tokio::spawn(p.clone().replenish(stop.clone()));
        until(|| p.backoff() >= BACKOFF_BASE * 2).await;
        // Two dials per pass; passes are 0.5 s, then 1 s apart: a bounded count.
        let refused = sim.stats.refused.load(Ordering::Relaxed);
        assert!((4..=8).contains(&refused), "{refused} refused dials");
        assert!(p.is_empty());
        sim.set_refusing(false);
        until(|| p.len() == 2).await;
        assert_eq!(p.backoff(), Duration::ZERO);
        stop.cancel();
    }

    /// A key at its upstream's session limit: some dials are taken, the
    /// rest refused with 429 and `Retry-After: 2`. Successes (slots freed
    /// as warm sockets are retired) do not end the pause, and the pause is
    /// the upstream's `Retry-After`: two passes in 3 s, not a pass after
    /// every success.
    #[tokio::test]
    async fn a_partly_refusing_upstream_gets_one_pass_of_dials_per_retry_after() {
        let (sim, up) = sim_and_upstream(SimConfig {
            fault: Some(patchbay_sim::SimFault::SessionLimit { max: 2 }),
            ..SimConfig::default()
        })
        .await;
        let p = pool(up, 4, Duration::from_millis(300));
        let stop = CancellationToken::new();
        tokio::spawn(p.clone().replenish(stop.clone()));
        tokio::time::sleep(Duration::from_secs(3)).await;
        stop.cancel();
        let refused = sim.stats.refused.load(Ordering::Relaxed);
        let taken = sim.stats.upgrades.load(Ordering::Relaxed);
        assert!((2..=4).contains(&refused), "{refused} refused dials");
        assert!((2..=4).contains(&taken), "{taken} dials taken");
    }

    #[tokio::test]
    async fn upstream_whose_first_event_is_an_error_never_enters_the_pool() {
        let (sim, up) = sim_and_upstream(SimConfig {
            fault: Some(patchbay_sim::SimFault::ErrorFirst),
            ..SimConfig::default()
        })
        .await;
        let p = pool(up, 2, Duration::from_secs(30));
        let stop = CancellationToken::new();
        tokio::spawn(p.clone().replenish(stop.clone()));
        until(|| p.backoff() >= BACKOFF_BASE).await;
        assert!(p.is_empty());
        assert!(sim.stats.upgrades.load(Ordering::Relaxed) >= 2);
        let failed = p
            .metrics
            .pool_dials
            .get_or_create(&ResultLabels {
                model: "m".into(),
                upstream: "m".into(),
                result: "bad_first_event".into(),
            })
            .get();
        assert!(failed >= 2, "{failed}");
        assert_eq!(p.take().err(), Some(Miss::Empty));
        assert_eq!(misses(&p, "empty"), 1);
        stop.cancel();
    }

    #[tokio::test]
    async fn shrinking_the_target_closes_the_oldest_sockets() {
        let (sim, up) = sim_and_upstream(SimConfig::default()).await;
        let p = pool(up, 3, Duration::from_secs(30));
        let stop = CancellationToken::new();
        tokio::spawn(p.clone().replenish(stop.clone()));
        until(|| p.len() == 3).await;
        p.set_target(1);
        until(|| p.len() == 1).await;
        until(|| sim.stats.sessions_active.load(Ordering::Relaxed) == 1).await;
        stop.cancel();
        until(|| sim.stats.sessions_active.load(Ordering::Relaxed) == 0).await;
    }

    #[test]
    fn the_backoff_doubles_once_per_pass_decays_on_success_and_keeps_its_pause() {
        let t0 = tokio::time::Instant::now();
        let mut b = Backoff::default();
        assert_eq!(b.failed(0, None, t0), Some(BACKOFF_BASE));
        assert_eq!(b.failed(0, None, t0), None, "the same pass counts once");
        assert_eq!(
            b.failed(1, Some(Duration::from_secs(2)), t0),
            Some(Duration::from_secs(2))
        );
        assert_eq!(b.delay, BACKOFF_BASE * 2);
        b.succeeded(false);
        assert_eq!(b.delay, BACKOFF_BASE);
        assert!(
            b.paused(t0 + Duration::from_millis(1999)),
            "a success ends no pause"
        );
        assert!(!b.paused(t0 + Duration::from_secs(2)));
        b.succeeded(false);
        assert_eq!(b.delay, Duration::ZERO);
        assert_eq!(
            b.failed(2, Some(Duration::from_secs(3600)), t0),
            Some(BACKOFF_CAP)
        );
        b.failed(3, None, t0);
        b.succeeded(true);
        assert_eq!(b.delay, Duration::ZERO, "a full pool ends the backoff");
        let refused = |retry_after: &str| DialError::Refused {
            status: 429,
            retry_after: Some(retry_after.into()),
            body: String::new(),
        };
        assert_eq!(retry_after(&refused(" 7 ")), Some(Duration::from_secs(7)));
        assert_eq!(retry_after(&refused("Wed, 21 Oct 2015 07:28:00 GMT")), None);
    }

    #[tokio::test]
    async fn an_upstream_of_several_exports_its_warm_and_target_sockets_under_its_own_name_only() {
        let (_sim, up) = sim_and_upstream(SimConfig::default()).await;
        let breaker = Arc::new(Mutex::new(Breaker::new(
            crate::upstream::breaker::BreakerConfig::from_server(
                &crate::config::ServerConfig::default(),
            ),
        )));
        let p =
            Pool::new(up, "m", 1, WAIT, Arc::new(Metrics::new())).with_breaker("azure", breaker);
        p.update_gauge();
        let text = p.metrics.encode();
        assert!(
            text.contains("patchbay_pool_warm_sockets{model=\"m\",upstream=\"azure\"} 0"),
            "{text}"
        );
        assert!(!text.contains("upstream=\"m\""), "{text}");
        assert!(
            text.contains("patchbay_pool_target_sockets{model=\"m\",upstream=\"azure\"} 1"),
            "{text}"
        );
        p.set_target(3);
        assert!(
            p.metrics
                .encode()
                .contains("patchbay_pool_target_sockets{model=\"m\",upstream=\"azure\"} 3"),
            "set_target moves the target gauge"
        );
    }

    #[test]
    fn warm_sockets_retire_spread_over_the_last_fifth_of_max_idle() {
        let idle = Duration::from_secs(30);
        assert_eq!(retire_after(idle, 0), idle);
        assert_eq!(retire_after(idle, 512), Duration::from_secs(27));
        assert!(retire_after(idle, 1023) > Duration::from_secs(24));
        let spread: std::collections::HashSet<Duration> = (0..64)
            .map(|_| retire_after(idle, crate::ids::random_u64()))
            .collect();
        assert!(spread.len() > 16, "{} distinct of 64", spread.len());
        assert!(spread
            .iter()
            .all(|d| *d > Duration::from_secs(24) && *d <= idle));
    }

    #[test]
    fn size_file_accepts_a_bare_number_or_the_env_line() {
        assert_eq!(parse_size_file("12\n"), Ok(12));
        assert_eq!(parse_size_file("REALTIME_POOL_SIZE=7"), Ok(7));
        assert_eq!(
            parse_size_file("# pool\nREALTIME_POOL_SIZE = \"3\"\n"),
            Ok(3)
        );
        assert_eq!(parse_size_file("0"), Ok(0));
    }

    #[test]
    fn size_file_rejects_garbage() {
        assert!(parse_size_file("").is_err());
        assert!(parse_size_file("-1").is_err());
        assert!(parse_size_file("ten").is_err());
        assert!(parse_size_file("OTHER=3").is_err());
        assert!(parse_size_file("3\n4").is_err());
    }

    #[test]
    fn miss_labels_are_the_documented_ones() {
        assert_eq!(Miss::Empty.label(), "empty");
        assert_eq!(Miss::Stale.label(), "stale");
        assert_eq!(Miss::Dead.label(), "dead");
    }
}
