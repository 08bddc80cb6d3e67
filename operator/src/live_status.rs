//! A route's live figures in its `status`: sessions, warm pool, spend over the last hour.
//!
//! The deletion-cost rounds ([`crate::deletion_cost`]) already scrape every ready gateway pod's
//! `/metrics` every few seconds; [`Tracker::observe`] turns each round into, per route,
//!
//! - `sessions`, `warmSockets`, `poolTarget` (and `pool` = `warm/target` for `kubectl get`): sums
//!   over the pods that answered;
//! - `spendUSD`: the increase of the pods' `patchbay_cost_usd_total` over the last
//!   [`SPEND_WINDOW`], computed like Prometheus' `increase()`: per pod, the sum of the rises
//!   between consecutive samples, a fall being a restarted counter (the new value is the rise).
//!   Pods that went away keep counting what they were seen to meter until their samples leave the
//!   window. While the operator has watched a route for less than the window (it just started or
//!   became the leader), the window is that long, and `spendWindowSeconds` says so;
//! - `scrapedPods`, `unscrapedPods` (ready pods that did not answer: reported by name, never
//!   counted as zero), `lastScrapeTime`.
//!
//! A route's figures are written (server-side apply of the status subresource under
//! [`FIELD_MANAGER`], so they never clash with the reconcile's own status fields) only when they
//! changed, and at most once per [`MIN_PATCH_INTERVAL`]. Each write is a change of the route,
//! so the controller reconciles it once more (an idempotent pass), at most that often.

use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};

use serde::Serialize;

/// The spend window: an hour.
pub const SPEND_WINDOW: Duration = Duration::from_secs(3600);
/// The least time between two status writes of one route.
pub const MIN_PATCH_INTERVAL: Duration = Duration::from_secs(10);
/// The field manager of these status fields.
pub const FIELD_MANAGER: &str = "patchbay-operator-scrape";

/// What one scrape of a gateway pod says.
#[derive(Clone, Debug, PartialEq)]
pub struct PodFigures {
    /// Live sessions (every route's).
    pub sessions: i64,
    /// Warm sockets and pool targets, summed; `None` when the pod exports no such series.
    pub warm_sockets: Option<i64>,
    pub pool_target: Option<i64>,
    /// The pod's `patchbay_cost_usd_total`, summed over models (a counter: it restarts at 0
    /// with the process).
    pub cost_usd: Option<f64>,
}

/// One ready pod of a round and what its scrape gave (`None`: it did not answer).
#[derive(Clone, Debug)]
pub struct Scraped {
    pub namespace: String,
    /// The route the pod serves (its `app.kubernetes.io/instance` label).
    pub route: String,
    pub pod: String,
    pub figures: Option<PodFigures>,
}

/// The status fields this module owns, as written.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LiveFigures {
    pub sessions: i64,
    pub warm_sockets: i64,
    pub pool_target: i64,
    pub pool: String,
    #[serde(rename = "spendUSD")]
    pub spend_usd: String,
    /// As of the write: its growth alone is no reason to write.
    pub spend_window_seconds: i64,
    pub scraped_pods: i32,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub unscraped_pods: Vec<String>,
    /// Left out of the change test: a new time alone is no reason to write.
    pub last_scrape_time: String,
}

impl LiveFigures {
    /// The same figures, whatever the clock says (the scrape time, the window's growth).
    fn same_as(&self, other: &LiveFigures) -> bool {
        let timeless = |f: &LiveFigures| LiveFigures {
            last_scrape_time: String::new(),
            spend_window_seconds: 0,
            ..f.clone()
        };
        timeless(self) == timeless(other)
    }
}

/// A status write to make: route `namespace/route` gets `figures`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StatusWrite {
    pub namespace: String,
    pub route: String,
    pub figures: LiveFigures,
}

#[derive(Debug, Default)]
struct RouteState {
    /// When this route was first seen.
    since: Option<Instant>,
    /// Per pod, its cost counter samples, oldest first.
    costs: BTreeMap<String, VecDeque<(Instant, f64)>>,
    last_written: Option<(Instant, LiveFigures)>,
}

/// The spend a pod's samples show: Prometheus' `increase()` without extrapolation.
fn increase(samples: &VecDeque<(Instant, f64)>) -> f64 {
    samples
        .iter()
        .zip(samples.iter().skip(1))
        .map(|((_, a), (_, b))| if b >= a { b - a } else { *b })
        .fold(0.0, |a, b| a + b)
}

/// The live-status state of every route, kept across rounds by the leader.
#[derive(Debug, Default)]
pub struct Tracker {
    routes: BTreeMap<(String, String), RouteState>,
}

impl Tracker {
    /// Take one round's scrapes at `now` (`now_text`: the same as RFC 3339) and return the
    /// status writes due.
    pub fn observe(&mut self, now: Instant, now_text: &str, round: &[Scraped]) -> Vec<StatusWrite> {
        let mut by_route: BTreeMap<(String, String), Vec<&Scraped>> = BTreeMap::new();
        // A pod without the route label (not one the operator made) belongs to no route.
        for s in round.iter().filter(|s| !s.route.is_empty()) {
            by_route
                .entry((s.namespace.clone(), s.route.clone()))
                .or_default()
                .push(s);
        }
        let mut writes = Vec::new();
        for (key, pods) in by_route {
            let state = self.routes.entry(key.clone()).or_default();
            let since = *state.since.get_or_insert(now);
            let mut figures = LiveFigures {
                last_scrape_time: now_text.to_string(),
                ..LiveFigures::default()
            };
            for pod in &pods {
                let Some(f) = &pod.figures else {
                    figures.unscraped_pods.push(pod.pod.clone());
                    continue;
                };
                figures.scraped_pods += 1;
                figures.sessions += f.sessions;
                figures.warm_sockets += f.warm_sockets.unwrap_or(0);
                figures.pool_target += f.pool_target.unwrap_or(0);
                if let Some(cost) = f.cost_usd {
                    state
                        .costs
                        .entry(pod.pod.clone())
                        .or_default()
                        .push_back((now, cost));
                }
            }
            figures.unscraped_pods.sort();
            // Keep, per pod, the samples in the window and the last one before it (the base of
            // the first rise); drop pods whose every sample is older.
            let start = now.checked_sub(SPEND_WINDOW);
            state.costs.retain(|_, samples| {
                if let Some(start) = start {
                    while samples.len() > 1 && samples[1].0 <= start {
                        samples.pop_front();
                    }
                    samples.back().is_some_and(|(t, _)| *t > start)
                } else {
                    true
                }
            });
            // A fold from +0.0: an empty `sum()` of floats is -0.0, printed "-0.0000".
            let spend = state.costs.values().map(increase).fold(0.0, |a, b| a + b);
            figures.spend_usd = format!("{spend:.4}");
            figures.spend_window_seconds =
                now.duration_since(since).min(SPEND_WINDOW).as_secs() as i64;
            figures.pool = format!("{}/{}", figures.warm_sockets, figures.pool_target);
            let due = match &state.last_written {
                None => true,
                Some((at, last)) => {
                    !last.same_as(&figures) && now.duration_since(*at) >= MIN_PATCH_INTERVAL
                }
            };
            if due {
                state.last_written = Some((now, figures.clone()));
                writes.push(StatusWrite {
                    namespace: key.0,
                    route: key.1,
                    figures,
                });
            }
        }
        writes
    }

    /// Forget a route that could not be written (deleted): its next sighting starts afresh.
    pub fn forget(&mut self, namespace: &str, route: &str) {
        self.routes
            .remove(&(namespace.to_string(), route.to_string()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(route: &str, pod: &str, sessions: i64, cost: f64) -> Scraped {
        Scraped {
            namespace: "ns".into(),
            route: route.into(),
            pod: pod.into(),
            figures: Some(PodFigures {
                sessions,
                warm_sockets: Some(3),
                pool_target: Some(4),
                cost_usd: Some(cost),
            }),
        }
    }

    fn down(route: &str, name: &str) -> Scraped {
        Scraped {
            figures: None,
            ..pod(route, name, 0, 0.0)
        }
    }

    #[test]
    fn sums_per_route_and_unscraped_pods_are_named_not_counted() {
        let mut t = Tracker::default();
        let now = Instant::now();
        let writes = t.observe(
            now,
            "T0",
            &[
                pod("voice", "a", 2, 1.0),
                pod("voice", "b", 5, 2.0),
                down("voice", "c"),
                pod("other", "x", 1, 0.0),
            ],
        );
        assert_eq!(writes.len(), 2);
        let voice = writes.iter().find(|w| w.route == "voice").unwrap();
        assert_eq!(voice.figures.sessions, 7);
        assert_eq!(
            (voice.figures.warm_sockets, voice.figures.pool_target),
            (6, 8)
        );
        assert_eq!(voice.figures.pool, "6/8");
        assert_eq!(voice.figures.scraped_pods, 2);
        assert_eq!(voice.figures.unscraped_pods, vec!["c".to_string()]);
        assert_eq!(voice.figures.spend_usd, "0.0000");
        assert_eq!(voice.figures.last_scrape_time, "T0");
        let body = serde_json::to_value(&voice.figures).unwrap();
        assert_eq!(body["spendUSD"], "0.0000");
        assert_eq!(body["warmSockets"], 6);
        assert_eq!(body["unscrapedPods"], serde_json::json!(["c"]));
    }

    #[test]
    fn spend_is_the_counters_increase_over_the_window_across_restarts_and_departures() {
        let mut t = Tracker::default();
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        t.observe(at(0), "", &[pod("r", "a", 0, 10.0), pod("r", "b", 0, 1.0)]);
        // a meters 0.5; b restarts (its counter falls to 0.25: all of it is new spend).
        let w = t.observe(
            at(20),
            "",
            &[pod("r", "a", 0, 10.5), pod("r", "b", 0, 0.25)],
        );
        assert_eq!(w[0].figures.spend_usd, "0.7500");
        assert_eq!(w[0].figures.spend_window_seconds, 20);
        // b goes away: what it metered still counts while in the window.
        let w = t.observe(at(40), "", &[pod("r", "a", 1, 11.0)]);
        assert_eq!(w[0].figures.spend_usd, "1.2500");
        // An hour later only a's last hour counts: from its last sample before the window.
        let w = t.observe(at(3640), "", &[pod("r", "a", 1, 12.0)]);
        assert_eq!(w[0].figures.spend_usd, "1.0000");
        assert_eq!(w[0].figures.spend_window_seconds, 3600);
    }

    #[test]
    fn a_route_is_written_only_on_change_and_at_most_every_ten_seconds() {
        let mut t = Tracker::default();
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        assert_eq!(t.observe(at(0), "a", &[pod("r", "a", 1, 0.0)]).len(), 1);
        // Changed, but too soon.
        assert!(t.observe(at(5), "b", &[pod("r", "a", 2, 0.0)]).is_empty());
        // Due, and changed: written.
        let w = t.observe(at(10), "c", &[pod("r", "a", 2, 0.0)]);
        assert_eq!(w.len(), 1);
        assert_eq!(w[0].figures.sessions, 2);
        // Nothing changed but the clock (the scrape time, the window's length): never written.
        assert!(t.observe(at(30), "d", &[pod("r", "a", 2, 0.0)]).is_empty());
        assert!(t
            .observe(at(3700), "e", &[pod("r", "a", 2, 0.0)])
            .is_empty());
        // A pod that stops answering is a change.
        let w = t.observe(at(3710), "f", &[pod("r", "a", 2, 0.0), down("r", "b")]);
        assert_eq!(w[0].figures.unscraped_pods, vec!["b".to_string()]);
    }
}
