//! `GET /v1/patchbay/usage` on the client listener: the caller's own
//! figures, for a client that wants to see its spend before a budget
//! refuses it (LiteLLM's `/key/info` answers the same question).
//!
//! - **Who asks is who is answered.** The caller is the key presented
//!   (`Authorization: Bearer` or `api-key`, as everywhere on the client
//!   listener), or, for a client secret, the key that minted it
//!   ([`Caller`]). The answer names no other key, and no secret: the key's
//!   digest never leaves the process. Team and route budgets are shared, so
//!   their spend is the whole team's or route's: that is the figure those
//!   budgets enforce.
//! - **The figures are the enforced ones.** Spend and the rate windows
//!   come from the store admission reads, in the same round trip shape
//!   ([`crate::metering::Metering::read_counts`]), so with Redis they are
//!   the fleet's. The budgets listed are the ones admission checks
//!   ([`applicable_budgets`]): the key's, its team's, and the budget of
//!   every route the key may use. A store that does not answer is a 503:
//!   admission fails open, but a reader must not be shown figures the
//!   store did not give.
//! - **Reading counts nothing.** The request is not counted against the
//!   key's rpm, which counts sessions opened (and secrets minted): a
//!   dashboard polling its spend must not lock its own key out of
//!   sessions. The rpm window is read, not incremented.
//! - **Live sessions** are counted across the fleet when the key has a
//!   `max_sessions` and Redis holds its session leases (what the cap
//!   enforces), else in this process (`"counted": "process"`).
//!
//! The arithmetic (windows, remaining amounts, period ends) is the pure
//! [`report`]; the handler only gathers its inputs.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::extract::{FromRequestParts, State};
use axum::http::request::Parts;
use axum::response::Response;
use axum::routing::get;
use axum::Router;
use http::{header, HeaderValue, StatusCode};
use serde::Serialize;

use crate::admission::Refusal;
use crate::auth::{model_allowed, presented_key, KeyEntry, TeamEntry};
use crate::client_secret::is_client_secret;
use crate::config::BudgetPeriod;
use crate::gateway::Gateway;
use crate::http_error::{count_refusal, ApiError};
use crate::metering::{applicable_budgets, estimate};
use crate::store::{
    period_ttl, window_position, AdmitCounts, BudgetKey, Scope, WindowCounts, BUDGET_GRACE, WINDOW,
};

/// The usage route.
pub const USAGE_PATH: &str = "/v1/patchbay/usage";
/// The `object` of the answer.
pub const USAGE_OBJECT: &str = "patchbay.usage";
/// Spend is shown to the nano-dollar, as request-log rows show cost.
const USD_DECIMALS: f64 = 1e9;
/// How long a client is told to wait when the store did not answer.
const STORE_RETRY_AFTER: Duration = Duration::from_secs(1);

/// The usage route, for the client listener's router.
pub fn router(gw: Arc<Gateway>) -> Router {
    Router::new()
        .route(USAGE_PATH, get(usage).fallback(method_not_allowed))
        .with_state(gw)
}

/// The key a usage request is answered for: the presented client key, or
/// the parent of a presented client secret (with the secret's id).
#[derive(Debug, Clone)]
pub struct Caller {
    pub key: KeyEntry,
    pub client_secret_id: Option<String>,
}

impl FromRequestParts<Arc<Gateway>> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut Parts,
        gw: &Arc<Gateway>,
    ) -> Result<Self, Self::Rejection> {
        let keys = gw.keys.get();
        let caller = match presented_key(&parts.headers).key {
            None => Err(Refusal::unauthorized(
                "missing API key: send Authorization: Bearer <key or client secret>, or api-key",
            )),
            Some(secret) if is_client_secret(secret.expose()) => gw
                .client_secrets
                .parent_of(&secret, &keys, SystemTime::now(), "usage")
                .map(|(key, id)| Caller {
                    key,
                    client_secret_id: Some(id),
                }),
            Some(k) => match keys.lookup(&k) {
                Some(e) if !e.disabled => Ok(Caller {
                    key: e.clone(),
                    client_secret_id: None,
                }),
                Some(_) => Err(Refusal::unauthorized("this API key is disabled")),
                None => Err(Refusal::unauthorized("incorrect API key provided")),
            },
        };
        caller.map_err(|r| {
            count_refusal(gw, "", &r);
            ApiError(r)
        })
    }
}

/// `GET /v1/patchbay/usage`.
async fn usage(State(gw): State<Arc<Gateway>>, caller: Caller) -> Result<Response, ApiError> {
    let now = SystemTime::now();
    let key = &caller.key;
    let keys = gw.keys.get();
    let team = key.team.as_deref().and_then(|t| keys.team(t));
    let routes: Vec<RouteBudget<'_>> = gw
        .routes
        .iter()
        .map(|r| RouteBudget {
            model: &r.config.model,
            budget: r.config.budget_usd.map(|b| (b, r.config.budget_period)),
        })
        .collect();
    let budgets = budgets_of(key, team, &routes);
    let counts = gw
        .metering
        .read_counts(key, budgets.iter().map(|(b, _)| b.clone()).collect(), now)
        .await
        .map_err(|_| {
            let r = Refusal::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "server_error",
                "store_unavailable",
                "the usage store did not answer; try again",
            )
            .retry_after(STORE_RETRY_AFTER);
            count_refusal(&gw, "", &r);
            ApiError(r)
        })?;
    let live = live_sessions(&gw, key, now).await;
    let body = report(&Inputs {
        key,
        team,
        client_secret_id: caller.client_secret_id.as_deref(),
        routes: &routes,
        budgets: &budgets,
        counts: &counts,
        live,
        store: gw.metering.store().kind(),
        now,
    });
    let json = serde_json::to_string(&body).unwrap_or_default();
    let mut r = Response::new(axum::body::Body::from(json));
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    // Per-key figures: no shared cache may keep them.
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    Ok(r)
}

/// The key's live sessions: across the fleet when its cap is counted by
/// Redis leases, else in this process (also when Redis does not answer).
async fn live_sessions(gw: &Gateway, key: &KeyEntry, now: SystemTime) -> LiveSessions {
    if let (Some(leases), Some(_)) = (gw.leases.as_ref(), key.max_sessions) {
        match leases.live(&key.id, now).await {
            Ok(live) => {
                return LiveSessions {
                    live,
                    counted: "fleet",
                }
            }
            Err(e) => {
                gw.metrics.store_errors.inc();
                tracing::warn!(error = %e, key_id = %key.id, "cannot count the key's session leases; answering with this process's count");
            }
        }
    }
    LiveSessions {
        live: gw.sessions.key_active(&key.id) as u64,
        counted: "process",
    }
}

async fn method_not_allowed(State(gw): State<Arc<Gateway>>, method: http::Method) -> ApiError {
    let r = Refusal::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "invalid_request_error",
        "method_not_allowed",
        format!("{method} is not allowed here; use GET {USAGE_PATH}"),
    );
    count_refusal(&gw, "", &r);
    ApiError(r)
}

/// A route as the usage answer sees it: its client-facing model and its
/// budget, if it has one.
#[derive(Debug, Clone, Copy)]
pub struct RouteBudget<'a> {
    pub model: &'a str,
    pub budget: Option<(f64, BudgetPeriod)>,
}

/// Every budget admission may check for `key`: the key's, its team's, and
/// the budget of each route it may use, each once, with its limit.
pub fn budgets_of(
    key: &KeyEntry,
    team: Option<&TeamEntry>,
    routes: &[RouteBudget<'_>],
) -> Vec<(BudgetKey, f64)> {
    let mut out = applicable_budgets(key, team, "", None);
    for r in routes.iter().filter(|r| model_allowed(key, team, r.model)) {
        if let Some((limit, period)) = r.budget {
            let b = BudgetKey {
                scope: Scope::Route,
                id: r.model.to_string(),
                period,
            };
            out.push((b, limit));
        }
    }
    out
}

/// What [`report`] is made from.
#[derive(Debug)]
pub struct Inputs<'a> {
    pub key: &'a KeyEntry,
    pub team: Option<&'a TeamEntry>,
    pub client_secret_id: Option<&'a str>,
    pub routes: &'a [RouteBudget<'a>],
    /// [`budgets_of`], in its order.
    pub budgets: &'a [(BudgetKey, f64)],
    /// The store's answer, its budgets in the order of `budgets`.
    pub counts: &'a AdmitCounts,
    pub live: LiveSessions,
    pub store: &'static str,
    pub now: SystemTime,
}

/// The answer's body.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Usage {
    pub object: &'static str,
    pub key_id: String,
    pub team: Option<String>,
    /// The client secret the request was made with (its parent is `key_id`).
    pub client_secret_id: Option<String>,
    pub budgets: Vec<BudgetUsage>,
    pub limits: Limits,
    pub sessions: LiveSessions,
    /// `memory` (this process's counters) or `redis` (the fleet's).
    pub store: &'static str,
    /// RFC 3339, UTC, milliseconds.
    pub as_of: String,
}

/// One budget and its spend in the current period.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BudgetUsage {
    /// `key`, `team` or `route`.
    pub scope: &'static str,
    /// The key id, team id or route model.
    pub id: String,
    pub period: BudgetPeriod,
    /// When the period's spend starts again from zero (UTC); `None` for
    /// `total`.
    pub resets_at: Option<String>,
    pub limit_usd: f64,
    pub spent_usd: f64,
    pub remaining_usd: f64,
    /// Spent ≥ limit: sessions of the key are refused (402) and closed.
    pub exhausted: bool,
}

/// The limits that apply to the key.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Limits {
    pub rpm: Option<WindowUsage>,
    pub tpm: Option<WindowUsage>,
    pub max_sessions: Option<usize>,
    /// Routes the key may open sessions on (its allow-list ∩ its team's ∩
    /// the routes served).
    pub models: Vec<String>,
}

/// A per-minute limit and the sliding window's estimate of the last 60 s.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct WindowUsage {
    pub limit: u64,
    pub used: u64,
    pub remaining: u64,
}

/// The key's live sessions and where they were counted.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct LiveSessions {
    pub live: u64,
    /// `fleet` (every gateway sharing Redis) or `process` (this gateway).
    pub counted: &'static str,
}

/// The answer, from its inputs; no I/O.
pub fn report(i: &Inputs<'_>) -> Usage {
    let (_, into) = window_position(i.now);
    let f = (into.as_secs_f64() / WINDOW.as_secs_f64()).clamp(0.0, 1.0);
    let window = |limit: Option<u64>, w: Option<WindowCounts>| {
        limit.map(|limit| {
            let used = used(w.unwrap_or_default(), f);
            WindowUsage {
                limit,
                used,
                remaining: limit.saturating_sub(used),
            }
        })
    };
    let budgets = i
        .budgets
        .iter()
        .enumerate()
        .map(|(n, (b, limit))| {
            let spent = i.counts.budgets.get(n).copied().unwrap_or(0.0);
            BudgetUsage {
                scope: b.scope.as_str(),
                id: b.id.clone(),
                period: b.period,
                resets_at: period_end(b.period, i.now)
                    .map(|t| humantime::format_rfc3339_seconds(t).to_string()),
                limit_usd: *limit,
                spent_usd: usd(spent),
                remaining_usd: usd((limit - spent).max(0.0)),
                exhausted: spent >= *limit,
            }
        })
        .collect();
    Usage {
        object: USAGE_OBJECT,
        key_id: i.key.id.clone(),
        team: i.key.team.clone(),
        client_secret_id: i.client_secret_id.map(str::to_string),
        budgets,
        limits: Limits {
            rpm: window(i.key.rpm, i.counts.rpm),
            tpm: window(i.key.tpm, i.counts.tpm),
            max_sessions: i.key.max_sessions,
            models: i
                .routes
                .iter()
                .filter(|r| model_allowed(i.key, i.team, r.model))
                .map(|r| r.model.to_string())
                .collect(),
        },
        sessions: i.live,
        store: i.store,
        as_of: humantime::format_rfc3339_millis(i.now).to_string(),
    }
}

/// The window's estimate, whole: rounded up, so `limit − used` is what
/// admission lets through now.
fn used(w: WindowCounts, f: f64) -> u64 {
    // The epsilon keeps float noise (5.000000000000001) from adding one.
    (estimate(w, f) - 1e-9).ceil().max(0.0) as u64
}

fn usd(v: f64) -> f64 {
    (v * USD_DECIMALS).round() / USD_DECIMALS
}

/// The end of the budget period `now` falls in (UTC); `None` for `total`.
fn period_end(period: BudgetPeriod, now: SystemTime) -> Option<SystemTime> {
    let secs = now.duration_since(UNIX_EPOCH).unwrap_or_default().as_secs();
    let left = period_ttl(period, now)?.saturating_sub(BUDGET_GRACE);
    Some(UNIX_EPOCH + Duration::from_secs(secs) + left)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(toml: &str) -> KeyEntry {
        toml::from_str(&format!(
            "id = \"k\"\nsha256 = \"{}\"\n{toml}",
            "ab".repeat(32)
        ))
        .unwrap()
    }

    fn team(toml: &str) -> TeamEntry {
        toml::from_str(&format!("id = \"t\"\n{toml}")).unwrap()
    }

    // 2024-02-29T12:00:30Z: half a minute into the window.
    fn noon() -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(1_709_208_030)
    }

    const ROUTES: [RouteBudget<'static>; 3] = [
        RouteBudget {
            model: "a",
            budget: Some((10.0, BudgetPeriod::Daily)),
        },
        RouteBudget {
            model: "b",
            budget: Some((20.0, BudgetPeriod::Total)),
        },
        RouteBudget {
            model: "c",
            budget: None,
        },
    ];

    fn ids(budgets: &[(BudgetKey, f64)]) -> Vec<String> {
        budgets
            .iter()
            .map(|(b, _)| format!("{}:{}", b.scope.as_str(), b.id))
            .collect()
    }

    #[test]
    fn the_budgets_are_the_keys_its_teams_and_those_of_the_routes_it_may_use() {
        let k = key("team = \"t\"\nbudget_usd = 5.0\nmodels = [\"a\", \"c\"]");
        let t = team("budget_usd = 50.0\nbudget_period = \"monthly\"");
        let b = budgets_of(&k, Some(&t), &ROUTES);
        assert_eq!(ids(&b), ["key:k", "team:t", "route:a"]);
        assert_eq!(b[1].0.period, BudgetPeriod::Monthly);
        assert_eq!(b[2], (b[2].0.clone(), 10.0));
        // No budgets anywhere: none.
        assert!(budgets_of(&key(""), None, &ROUTES[2..]).is_empty());
        // Every route allowed: both route budgets.
        assert_eq!(
            ids(&budgets_of(&key(""), None, &ROUTES)),
            ["route:a", "route:b"]
        );
    }

    #[test]
    fn the_report_shows_spend_remaining_and_windows_without_the_keys_digest() {
        let k = key("team = \"t\"\nbudget_usd = 5.0\nbudget_period = \"daily\"\nrpm = 10\ntpm = 1000\nmax_sessions = 2\nmodels = [\"a\"]");
        let budgets = budgets_of(&k, None, &ROUTES);
        let counts = AdmitCounts {
            rpm: Some(WindowCounts {
                previous: 4,
                current: 3,
            }),
            tpm: Some(WindowCounts {
                previous: 0,
                current: 1500,
            }),
            budgets: vec![1.25, 10.000_000_000_4],
        };
        let u = report(&Inputs {
            key: &k,
            team: None,
            client_secret_id: Some("cs_1"),
            routes: &ROUTES,
            budgets: &budgets,
            counts: &counts,
            live: LiveSessions {
                live: 1,
                counted: "process",
            },
            store: "memory",
            now: noon(),
        });
        assert_eq!(u.key_id, "k");
        assert_eq!(u.team.as_deref(), Some("t"));
        assert_eq!(u.budgets.len(), 2);
        let own = &u.budgets[0];
        assert_eq!((own.scope, own.id.as_str()), ("key", "k"));
        assert_eq!((own.spent_usd, own.remaining_usd), (1.25, 3.75));
        assert!(!own.exhausted);
        assert_eq!(own.resets_at.as_deref(), Some("2024-03-01T00:00:00Z"));
        let route = &u.budgets[1];
        assert_eq!(route.scope, Scope::Route.as_str());
        assert_eq!((route.spent_usd, route.remaining_usd), (10.0, 0.0));
        assert!(route.exhausted);
        // rpm: 4 × ½ + 3 = 5 of 10; tpm over its limit leaves nothing.
        let rpm = u.limits.rpm.unwrap();
        assert_eq!((rpm.limit, rpm.used, rpm.remaining), (10, 5, 5));
        assert_eq!(u.limits.tpm.unwrap().remaining, 0);
        assert_eq!(u.limits.max_sessions, Some(2));
        assert_eq!(u.limits.models, ["a"]);
        assert_eq!(u.as_of, "2024-02-29T12:00:30.000Z");
        let text = serde_json::to_string(&u).unwrap();
        assert!(!text.contains(&"ab".repeat(32)), "{text}");
        assert!(text.contains("\"period\":\"daily\""), "{text}");
    }

    #[test]
    fn a_key_without_limits_reports_none() {
        let k = key("");
        let u = report(&Inputs {
            key: &k,
            team: None,
            client_secret_id: None,
            routes: &[],
            budgets: &[],
            counts: &AdmitCounts::default(),
            live: LiveSessions {
                live: 0,
                counted: "process",
            },
            store: "memory",
            now: noon(),
        });
        assert_eq!(u.limits.rpm, None);
        assert_eq!(u.limits.tpm, None);
        assert!(u.budgets.is_empty());
    }

    #[test]
    fn used_is_the_window_estimate_rounded_up() {
        let w = |previous, current| WindowCounts { previous, current };
        assert_eq!(used(w(0, 0), 0.0), 0);
        assert_eq!(used(w(6, 0), 1.0 / 6.0), 5);
        assert_eq!(used(w(3, 0), 0.5), 2);
        assert_eq!(used(w(10, 2), 1.0), 2);
    }

    #[test]
    fn periods_end_at_the_next_utc_day_or_month() {
        let end =
            |p| period_end(p, noon()).map(|t| humantime::format_rfc3339_seconds(t).to_string());
        assert_eq!(
            end(BudgetPeriod::Daily).as_deref(),
            Some("2024-03-01T00:00:00Z")
        );
        assert_eq!(
            end(BudgetPeriod::Monthly).as_deref(),
            Some("2024-03-01T00:00:00Z")
        );
        assert_eq!(end(BudgetPeriod::Total), None);
        let mid_month = UNIX_EPOCH + Duration::from_secs(1_734_264_000); // 2024-12-15T12:00:00Z
        let t = period_end(BudgetPeriod::Monthly, mid_month).unwrap();
        assert_eq!(
            humantime::format_rfc3339_seconds(t).to_string(),
            "2025-01-01T00:00:00Z"
        );
        let t = period_end(BudgetPeriod::Daily, mid_month).unwrap();
        assert_eq!(
            humantime::format_rfc3339_seconds(t).to_string(),
            "2024-12-16T00:00:00Z"
        );
    }
}
