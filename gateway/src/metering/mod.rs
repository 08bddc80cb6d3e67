//! Metering: the response turn is the unit, the store holds the shared
//! counters, and a meter task per session turns closed turns into request-log
//! rows, budget spend and token windows. The full story (flush, overshoot,
//! fail-open, keys and expiry) is in `docs/metering.md`.
//!
//! # Interface for the session path
//!
//! ```text
//! // once per process (inside the runtime), next to the key store:
//! let metering = Metering::with_redis(&config, metrics.clone(), keys.clone(), redis_conn);
//! // config reload:
//! metering.set_prices(new_config.prices.clone());
//!
//! // admission, after the local checks (draining, process cap, key cap):
//! metering.admit(&key, team_entry, &route.config).await?;   // Err(Refusal)
//!
//! // once session.created reached the client:
//! let (mut tracker, meter, kill) =
//!     metering.start_session(SessionMeta::new(&session_id, &key, &route.config));
//! let mut meter = InlineMeter::new(meter);        // in the session's task (or: tasks.spawn(meter.run()))
//! tracker.on_upstream_text(&session_created);     // optional: learns the transcription model
//! let kill = async { tokio::select! { k = kill.fired() => k, _ = shutdown.cancelled() => shutdown_kill } };
//! let spliced = meter.beside(pin!(relay::splice(client, upstream, pending, limits, &mut tracker, kill))).await;
//! tracker.finish(EndReason::from_end(&spliced.end));
//! meter.finish(&tasks);                           // the final flush: here, or on the TaskTracker if the store makes it wait
//! ```
//!
//! Guarantees:
//! - The relay never waits on metering: the tracker only `try_send`s.
//! - No row or spend is lost to a store outage: a write the store did not
//!   confirm waits in the process's [`outbox`] and is replayed in order,
//!   applied exactly once; rows reach stdout through a writer thread
//!   ([`crate::logs`]), never from a runtime thread. The drain calls
//!   [`Metering::settle`].
//! - Admission makes at most one store round trip (two when it refuses
//!   after counting the request, to give it back), bounded by
//!   [`crate::store::CALL_TIMEOUT`]; a failed or slow store admits (fail
//!   open) and counts `patchbay_store_errors_total`.
//! - Refusals, in order: rpm → 429 `rate_limit_exceeded` (+ Retry-After),
//!   tpm window full → 429 (+ Retry-After), a spent budget (key, team,
//!   route) → 402 `insufficient_quota`, an unpriced model under
//!   `unpriced = "block"` → 402. Only admitted sessions count against rpm.
//! - The [`KillSignal`] fires at most once: 1008 with an `insufficient_quota`
//!   error event when a budget is spent (outcome `budget_exhausted`), or 1008
//!   with an `invalid_api_key` error event when the key was removed or
//!   disabled (outcome `key_revoked`).
//!
//! Metrics: `budget_blocks` counts budget refusals and budget kills;
//! `rate_limit_blocks` counts rpm/tpm refusals. The caller's own
//! `admission_refusals{reason}` still counts every refusal it answers.

use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};

use http::StatusCode;
use tokio::sync::{mpsc, watch};

use crate::admission::Refusal;
use crate::auth::{KeyEntry, KeyStore, TeamEntry};
use crate::config::{Config, MeteringConfig, PriceRow, RouteConfig, Unpriced};
use crate::lane::Bounds;
use crate::logs::RequestLog;
use crate::metrics::{model, Metrics};
use crate::relay::Kill;
use crate::store::memory::MemoryStore;
use crate::store::redis::RedisStore;
use crate::store::{
    window_position, AdmitCounts, AdmitQuery, BudgetKey, RpmWindow, Store, StoreError,
    WindowCounts, DEFAULT_PREFIX, WINDOW,
};
use outbox::Outbox;

mod budgets;
pub mod call_time;
pub mod client_models;
pub mod delegated;
pub mod live;
pub mod meter;
pub mod outbox;
pub mod pricing;
mod shared;
pub mod tracker;
pub mod translation;
mod upstream_events;
mod whole;

use budgets::budget_refusal;
pub use budgets::{applicable_budgets, budget_message};
pub use meter::{InlineMeter, MeterTask};
pub use shared::SessionMeta;
pub(crate) use shared::{bounded, error_chain, Shared};
pub use tracker::{
    EndReason, TurnKind, TurnRecord, TurnTracker, OUTCOME_BUDGET_EXHAUSTED, OUTCOME_KEY_REVOKED,
};

/// One per process; cheap to clone.
#[derive(Debug, Clone)]
pub struct Metering {
    shared: Arc<Shared>,
}

/// Fires (at most once) when the meter wants the session closed.
#[derive(Debug, Clone)]
pub struct KillSignal(watch::Receiver<Option<Kill>>);

impl KillSignal {
    /// Resolves with the kill when it fires; never resolves if the meter
    /// ends without firing.
    pub async fn fired(mut self) -> Kill {
        let fired = match self.0.wait_for(Option::is_some).await {
            Ok(k) => k.clone(),
            Err(_) => None,
        };
        match fired {
            Some(k) => k,
            None => std::future::pending().await,
        }
    }

    /// The kill, if it already fired.
    pub fn get(&self) -> Option<Kill> {
        self.0.borrow().clone()
    }
}

impl Metering {
    /// From the gateway config, on the process's shared Redis connection
    /// (`None`: the in-memory store); rows on stdout. Must be called inside
    /// the runtime.
    pub fn with_redis(
        config: &Config,
        metrics: Arc<Metrics>,
        keys: Arc<KeyStore>,
        redis: Option<crate::store::conn::RedisConn>,
    ) -> Self {
        let store: Arc<dyn Store> = match redis {
            Some(conn) => {
                let store = Arc::new(RedisStore::with_conn(conn, DEFAULT_PREFIX));
                tokio::spawn(check_store(store.clone()));
                store
            }
            None => Arc::new(MemoryStore::new()),
        };
        let log = RequestLog::stdout(&metrics);
        Self::with_store(
            config.metering.clone(),
            config.prices.clone(),
            store,
            log,
            metrics,
            keys,
        )
    }

    /// With an explicit store and row sink (tests, embedding). Must be
    /// called inside the runtime (it spawns the outbox's replay task).
    pub fn with_store(
        config: MeteringConfig,
        prices: Vec<PriceRow>,
        store: Arc<dyn Store>,
        log: RequestLog,
        metrics: Arc<Metrics>,
        keys: Arc<KeyStore>,
    ) -> Self {
        let outbox = Outbox::start(store.clone(), Bounds::default(), &metrics);
        Self {
            shared: Arc::new(Shared {
                config: RwLock::new(config),
                prices: RwLock::new(Arc::new(prices)),
                store,
                outbox,
                log,
                metrics,
                keys,
                warned_unpriced: Default::default(),
            }),
        }
    }

    /// Replaces the price table; flushes from now on use it.
    pub fn set_prices(&self, prices: Vec<PriceRow>) {
        let prices = Arc::new(prices);
        match self.shared.prices.write() {
            Ok(mut p) => *p = prices,
            Err(p) => *p.into_inner() = prices,
        }
    }

    pub fn prices(&self) -> Arc<Vec<PriceRow>> {
        self.shared.prices()
    }

    /// Replaces the `[metering]` settings: the unpriced policy applies to the next admission,
    /// the flush interval to sessions that start from now on.
    pub fn set_config(&self, config: MeteringConfig) {
        *self
            .shared
            .config
            .write()
            .unwrap_or_else(|p| p.into_inner()) = config;
    }

    /// The `[metering]` settings as they are now.
    pub fn config(&self) -> MeteringConfig {
        self.shared.config()
    }

    pub fn store(&self) -> &Arc<dyn Store> {
        &self.shared.store
    }

    /// Store writes waiting in the outbox.
    pub fn outbox_len(&self) -> usize {
        self.shared.outbox.len()
    }

    /// Waits until the row writer wrote every queued row and the outbox
    /// replayed every queued write, or `deadline` (the drain's final step).
    /// Returns the rows and writes still waiting (0, 0 when all is out).
    pub async fn settle(&self, deadline: tokio::time::Instant) -> (usize, usize) {
        let (_, _) = tokio::join!(
            self.shared.log.settle(deadline),
            self.shared.outbox.settle(deadline)
        );
        (self.shared.log.pending(), self.shared.outbox.len())
    }

    /// The store-backed admission checks; see the module docs for the order.
    pub async fn admit(
        &self,
        key: &KeyEntry,
        team: Option<&TeamEntry>,
        route: &RouteConfig,
    ) -> Result<(), Refusal> {
        let s = &self.shared;
        let now = SystemTime::now();
        let (minute, into) = window_position(now);
        let budgets = applicable_budgets(
            key,
            team,
            &route.model,
            route.budget_usd.map(|b| (b, route.budget_period)),
        );
        // An intent route's sessions have no response turns: the model
        // they are billed on is the one a frame names, checked there.
        let unpriced = s.config().unpriced == Unpriced::Block
            && route.intent.is_none()
            && !pricing::route_priced(&s.prices(), route);
        let counts = if key.rpm.is_some() || key.tpm.is_some() || !budgets.is_empty() {
            let q = AdmitQuery {
                key_id: key.id.clone(),
                rpm: if key.rpm.is_some() {
                    RpmWindow::Count
                } else {
                    RpmWindow::Skip
                },
                read_tpm: key.tpm.is_some(),
                budgets: budgets.iter().map(|(b, _)| b.clone()).collect(),
                now,
            };
            match bounded(s.store.admit(&q), "admit").await {
                Ok(c) => Some(c),
                Err(e) => {
                    s.store_error(&e, "admission");
                    None
                }
            }
        } else {
            None
        };
        let limits: Vec<f64> = budgets.iter().map(|(_, l)| *l).collect();
        let label = model(&route.model);
        let refusal = match decide(key.rpm, key.tpm, &limits, counts.as_ref(), into, unpriced) {
            Verdict::Admit => return Ok(()),
            Verdict::Rpm { retry_after } => {
                s.metrics.rate_limit_blocks.get_or_create(&label).inc();
                Refusal::new(
                    StatusCode::TOO_MANY_REQUESTS,
                    "requests",
                    "rate_limit_exceeded",
                    format!(
                        "rate limit reached for key '{}' on requests per minute (limit {}); try again in {}s",
                        key.id,
                        key.rpm.unwrap_or(0),
                        retry_after.as_secs()
                    ),
                )
                .retry_after(retry_after)
            }
            Verdict::Tpm { retry_after } => {
                s.metrics.rate_limit_blocks.get_or_create(&label).inc();
                Refusal::new(
                    StatusCode::TOO_MANY_REQUESTS,
                    "tokens",
                    "rate_limit_exceeded",
                    format!(
                        "rate limit reached for key '{}' on tokens per minute (limit {}); try again in {}s",
                        key.id,
                        key.tpm.unwrap_or(0),
                        retry_after.as_secs()
                    ),
                )
                .retry_after(retry_after)
            }
            Verdict::Budget { index } => {
                s.metrics.budget_blocks.get_or_create(&label).inc();
                let (b, limit) = &budgets[index];
                budget_refusal(b, *limit)
            }
            Verdict::Unpriced => Refusal::new(
                StatusCode::PAYMENT_REQUIRED,
                "invalid_request_error",
                "model_not_priced",
                format!(
                    "the model '{}' has no price configured and this gateway refuses unpriced models",
                    route.model
                ),
            ),
        };
        // Only admitted sessions count against rpm: give the request back.
        if counts.as_ref().is_some_and(|c| c.rpm.is_some()) {
            if let Err(e) = bounded(s.store.unadmit(&key.id, minute), "unadmit").await {
                s.store_error(&e, "admission");
            }
        }
        Err(refusal)
    }

    /// What admission reads for `key`, counting nothing: the rpm window
    /// (when the key has an rpm), the tpm window (when it has a tpm) and the
    /// spend of each of `budgets`, in one bounded store round trip (the
    /// usage answer). A failed or slow store is counted in
    /// `patchbay_store_errors_total` and returned: unlike admission, a
    /// reader is not answered with figures the store did not give.
    pub async fn read_counts(
        &self,
        key: &KeyEntry,
        budgets: Vec<BudgetKey>,
        now: SystemTime,
    ) -> Result<AdmitCounts, StoreError> {
        let s = &self.shared;
        let q = AdmitQuery {
            key_id: key.id.clone(),
            rpm: if key.rpm.is_some() {
                RpmWindow::Read
            } else {
                RpmWindow::Skip
            },
            read_tpm: key.tpm.is_some(),
            budgets,
            now,
        };
        if q.rpm == RpmWindow::Skip && !q.read_tpm && q.budgets.is_empty() {
            return Ok(AdmitCounts::default());
        }
        bounded(s.store.admit(&q), "usage").await.inspect_err(|e| {
            s.metrics.store_errors.inc();
            tracing::warn!(store = %s.store.describe(), error = %error_chain(e), key_id = %key.id,
                "store call failed; the usage request is answered 503");
        })
    }

    /// Starts metering a session: the tracker for the relay, the meter task
    /// to spawn, and the signal the relay selects on.
    pub fn start_session(&self, meta: SessionMeta) -> (TurnTracker, MeterTask, KillSignal) {
        let (tx, rx) = mpsc::channel(tracker::CHANNEL_CAPACITY);
        let meters = self.shared.metrics.model_meters(&meta.model);
        let dropped = meters.records_dropped(&self.shared.metrics);
        let (kill_tx, kill_rx) = watch::channel(None);
        let tracker = TurnTracker::new(tx, dropped)
            .counting_duplicates(meters.usage_duplicates(&self.shared.metrics));
        let meter = MeterTask::new(self.shared.clone(), meters, meta, rx, kill_tx);
        (tracker, meter, KillSignal(kill_rx))
    }
}

/// The start-up check of a Redis store: one `PING`, and a clear error when
/// it fails (a wrong `ca_file`, a bad password, an unreachable host). The
/// gateway keeps running either way: admission fails open and writes wait
/// in the outbox, so a store problem never turns into a crash loop.
async fn check_store(store: Arc<RedisStore>) {
    match bounded(store.ping(), "ping").await {
        Ok(()) => tracing::info!(store = %store.describe(), "store answers"),
        Err(e) => tracing::error!(
            store = %store.describe(),
            error = %error_chain(&e),
            "cannot use the store at start (check the URL's host, user and password, and [store] ca_file for rediss://); failing open, writes wait in the outbox"
        ),
    }
}

/// The admission decision over the store's numbers (`None`: the store did
/// not answer, so only local facts count).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Verdict {
    Admit,
    Rpm { retry_after: Duration },
    Tpm { retry_after: Duration },
    Budget { index: usize },
    Unpriced,
}

pub(crate) fn decide(
    rpm: Option<u64>,
    tpm: Option<u64>,
    budget_limits: &[f64],
    counts: Option<&AdmitCounts>,
    into_window: Duration,
    unpriced: bool,
) -> Verdict {
    let f = fraction(into_window);
    if let (Some(limit), Some(w)) = (rpm, counts.and_then(|c| c.rpm)) {
        // `current` includes this request.
        if estimate(w, f) > limit as f64 {
            let before = WindowCounts {
                previous: w.previous,
                current: w.current.saturating_sub(1),
            };
            return Verdict::Rpm {
                retry_after: retry_after(before, limit as f64 - 1.0, f),
            };
        }
    }
    if let (Some(limit), Some(w)) = (tpm, counts.and_then(|c| c.tpm)) {
        if estimate(w, f) >= limit as f64 {
            return Verdict::Tpm {
                retry_after: retry_after(w, limit as f64 - 1.0, f),
            };
        }
    }
    for (index, limit) in budget_limits.iter().enumerate() {
        let spent = counts
            .and_then(|c| c.budgets.get(index).copied())
            .unwrap_or(0.0);
        if spent >= *limit {
            return Verdict::Budget { index };
        }
    }
    if unpriced {
        return Verdict::Unpriced;
    }
    Verdict::Admit
}

fn fraction(into_window: Duration) -> f64 {
    (into_window.as_secs_f64() / WINDOW.as_secs_f64()).clamp(0.0, 1.0)
}

/// Sliding-window estimate of the last 60 s: the previous minute weighted
/// by how much of it still overlaps, plus the current minute.
pub(crate) fn estimate(w: WindowCounts, f: f64) -> f64 {
    w.previous as f64 * (1.0 - f) + w.current as f64
}

/// How long until the estimate falls to `threshold`, with no new traffic;
/// whole seconds, at least 1, at most two windows.
pub(crate) fn retry_after(w: WindowCounts, threshold: f64, f: f64) -> Duration {
    let window = WINDOW.as_secs_f64();
    let (p, c) = (w.previous as f64, w.current as f64);
    let wait = if threshold < 0.0 {
        window
    } else if c <= threshold {
        // Within this window, as the previous minute slides out.
        if p == 0.0 {
            0.0
        } else {
            let g = (1.0 - (threshold - c) / p).clamp(f, 1.0);
            (g - f) * window
        }
    } else {
        // Into the next window, as this one slides out.
        let h = (1.0 - threshold / c).clamp(0.0, 1.0);
        (1.0 - f) * window + h * window
    };
    // The epsilon keeps float noise (10.000000000000002) from adding a second.
    Duration::from_secs(((wait - 1e-6).ceil() as u64).clamp(1, 2 * WINDOW.as_secs()))
}

#[cfg(test)]
mod tests {
    use super::budgets::usd;
    use super::*;
    use crate::config::BudgetPeriod;
    use crate::store::{BudgetKey, Scope};

    fn counts(rpm: Option<(u64, u64)>, tpm: Option<(u64, u64)>, budgets: Vec<f64>) -> AdmitCounts {
        let w = |(previous, current)| WindowCounts { previous, current };
        AdmitCounts {
            rpm: rpm.map(w),
            tpm: tpm.map(w),
            budgets,
        }
    }

    const START: Duration = Duration::ZERO;

    #[test]
    fn rpm_admits_up_to_the_limit_then_refuses_with_retry_after() {
        let c = counts(Some((0, 2)), None, vec![]);
        assert_eq!(
            decide(Some(2), None, &[], Some(&c), START, false),
            Verdict::Admit
        );
        let c = counts(Some((0, 3)), None, vec![]);
        let Verdict::Rpm { retry_after } = decide(Some(2), None, &[], Some(&c), START, false)
        else {
            panic!("not refused");
        };
        // Two requests this minute, none before: room again next minute,
        // once half of this one has slid out.
        assert_eq!(retry_after, Duration::from_secs(90));
    }

    #[test]
    fn rpm_counts_the_previous_minute_by_its_overlap() {
        // 10 s into the minute, 6 last minute: 6 × 5/6 = 5 still count.
        let into = Duration::from_secs(10);
        let c = counts(Some((6, 1)), None, vec![]);
        assert!(matches!(
            decide(Some(5), None, &[], Some(&c), into, false),
            Verdict::Rpm { .. }
        ));
        assert_eq!(
            decide(Some(6), None, &[], Some(&c), into, false),
            Verdict::Admit
        );
        // Room for one more once 6 × (1 − g) ≤ 4, g ≥ 1/3: 10 s from now.
        let w = WindowCounts {
            previous: 6,
            current: 0,
        };
        assert_eq!(retry_after(w, 4.0, 10.0 / 60.0), Duration::from_secs(10));
    }

    #[test]
    fn a_full_tpm_window_refuses_and_a_partial_one_admits() {
        let c = counts(None, Some((0, 999)), vec![]);
        assert_eq!(
            decide(None, Some(1000), &[], Some(&c), START, false),
            Verdict::Admit
        );
        let c = counts(None, Some((0, 1000)), vec![]);
        assert!(matches!(
            decide(None, Some(1000), &[], Some(&c), START, false),
            Verdict::Tpm { .. }
        ));
    }

    #[test]
    fn checks_apply_in_the_documented_order() {
        let all = counts(Some((0, 9)), Some((0, 9)), vec![5.0, 5.0]);
        let d = |rpm, tpm, limits: &[f64], unpriced| {
            decide(rpm, tpm, limits, Some(&all), START, unpriced)
        };
        assert!(matches!(
            d(Some(1), Some(1), &[1.0, 1.0], true),
            Verdict::Rpm { .. }
        ));
        assert!(matches!(
            d(None, Some(1), &[1.0, 1.0], true),
            Verdict::Tpm { .. }
        ));
        assert_eq!(
            d(None, None, &[9.0, 1.0], true),
            Verdict::Budget { index: 1 }
        );
        assert_eq!(d(None, None, &[9.0, 9.0], true), Verdict::Unpriced);
        assert_eq!(d(None, None, &[9.0, 9.0], false), Verdict::Admit);
    }

    #[test]
    fn without_the_store_only_local_facts_refuse() {
        assert_eq!(
            decide(Some(0), Some(0), &[1.0], None, START, false),
            Verdict::Admit
        );
        assert_eq!(
            decide(None, None, &[0.0], None, START, false),
            Verdict::Budget { index: 0 }
        );
        assert_eq!(
            decide(None, None, &[], None, START, true),
            Verdict::Unpriced
        );
    }

    #[test]
    fn retry_after_is_whole_seconds_within_two_windows() {
        let w = |previous, current| WindowCounts { previous, current };
        assert_eq!(retry_after(w(0, 0), 0.0, 0.5), Duration::from_secs(1));
        assert_eq!(retry_after(w(0, 10), -1.0, 0.0), Duration::from_secs(60));
        assert_eq!(
            retry_after(w(1000, 1000), 0.0, 0.0),
            Duration::from_secs(120)
        );
        assert_eq!(retry_after(w(0, 10), 5.0, 0.5), Duration::from_secs(60));
    }

    #[test]
    fn budget_message_names_scope_id_and_limit() {
        let b = BudgetKey {
            scope: Scope::Team,
            id: "support".into(),
            period: BudgetPeriod::Total,
        };
        assert_eq!(
            budget_message(&b, 50.0),
            "budget exceeded for team 'support' (limit $50.00)"
        );
        assert_eq!(usd(0.005), "0.005");
        assert_eq!(usd(12.5), "12.50");
        let daily = BudgetKey {
            period: BudgetPeriod::Daily,
            ..b
        };
        assert_eq!(
            budget_message(&daily, 0.1),
            "budget exceeded for team 'support' (limit $0.10 per day)"
        );
    }
}
