//! The operator's own Prometheus metrics.
//!
//! - `patchbay_operator_reconciles_total`: reconciles started.
//! - `patchbay_operator_reconcile_duration_seconds`: histogram of reconcile wall time.
//! - `patchbay_operator_reconcile_failures_total{reason}`: failed reconciles by [`Error::reason`].
//! - `patchbay_operator_api_calls_total{verb,kind,outcome}`: every API call, `outcome` one of
//!   `success`, `failure`, `timeout` (the Linkerd policy-controller's accounting).
//! - `patchbay_operator_leader`: 1 while this replica holds the lease (or runs without election).
//! - `patchbay_operator_deletion_cost_scrapes_total{outcome}`: gateway `/metrics` scrapes for the
//!   pod deletion cost, `success` or `failure` (the patches are `api_calls{verb="patch",kind="Pod"}`).
//!
//! [`Error::reason`]: crate::error::Error::reason

use std::time::Instant;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::{
    counter::Counter,
    family::Family,
    gauge::Gauge,
    histogram::{exponential_buckets, Histogram},
};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FailureLabels {
    pub reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabels {
    pub outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ApiCallLabels {
    pub verb: &'static str,
    pub kind: &'static str,
    pub outcome: &'static str,
}

/// Handles to every metric; cheap to clone (each is an `Arc` inside).
#[derive(Clone, Debug)]
pub struct Metrics {
    pub reconciles: Counter,
    pub reconcile_duration: Histogram,
    pub failures: Family<FailureLabels, Counter>,
    pub api_calls: Family<ApiCallLabels, Counter>,
    pub leader: Gauge,
    pub deletion_cost_scrapes: Family<OutcomeLabels, Counter>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self {
            reconciles: Counter::default(),
            // 5 ms .. ~41 s
            reconcile_duration: Histogram::new(exponential_buckets(0.005, 2.0, 14)),
            failures: Family::default(),
            api_calls: Family::default(),
            leader: Gauge::default(),
            deletion_cost_scrapes: Family::default(),
        }
    }
}

impl Metrics {
    /// Register every metric under the `patchbay_operator` prefix.
    pub fn register(&self, registry: &mut Registry) {
        let r = registry.sub_registry_with_prefix("patchbay_operator");
        r.register("reconciles", "Reconciles started", self.reconciles.clone());
        r.register(
            "reconcile_duration_seconds",
            "Wall time of a reconcile",
            self.reconcile_duration.clone(),
        );
        r.register(
            "reconcile_failures",
            "Failed reconciles by reason",
            self.failures.clone(),
        );
        r.register(
            "api_calls",
            "Kubernetes API calls by verb, kind and outcome",
            self.api_calls.clone(),
        );
        r.register(
            "leader",
            "1 while this replica is the active controller",
            self.leader.clone(),
        );
        r.register(
            "deletion_cost_scrapes",
            "Gateway /metrics scrapes for the pod deletion cost, by outcome",
            self.deletion_cost_scrapes.clone(),
        );
    }

    pub fn deletion_cost_scrape(&self, outcome: &'static str) {
        self.deletion_cost_scrapes
            .get_or_create(&OutcomeLabels { outcome })
            .inc();
    }

    /// Count a reconcile and time it until the guard drops.
    pub fn reconcile_started(&self) -> ReconcileTimer {
        self.reconciles.inc();
        ReconcileTimer {
            started: Instant::now(),
            histogram: self.reconcile_duration.clone(),
        }
    }

    pub fn reconcile_failed(&self, reason: &'static str) {
        self.failures.get_or_create(&FailureLabels { reason }).inc();
    }

    pub fn api_call(&self, verb: &'static str, kind: &'static str, outcome: &'static str) {
        self.api_calls
            .get_or_create(&ApiCallLabels {
                verb,
                kind,
                outcome,
            })
            .inc();
    }
}

/// Observes the reconcile duration when dropped.
pub struct ReconcileTimer {
    started: Instant,
    histogram: Histogram,
}

impl Drop for ReconcileTimer {
    fn drop(&mut self) {
        self.histogram.observe(self.started.elapsed().as_secs_f64());
    }
}

/// Text exposition of a registry.
pub fn encode(registry: &Registry) -> String {
    let mut out = String::new();
    prometheus_client::encoding::text::encode(&mut out, registry)
        .expect("writing to a String cannot fail");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics_are_exposed_under_the_operator_prefix() {
        let metrics = Metrics::default();
        let mut registry = Registry::default();
        metrics.register(&mut registry);
        drop(metrics.reconcile_started());
        metrics.reconcile_failed("InvalidSpec");
        metrics.api_call("apply", "ConfigMap", "timeout");
        metrics.leader.set(1);
        let text = encode(&registry);
        assert!(text.contains("patchbay_operator_reconciles_total 1"));
        assert!(text.contains("patchbay_operator_reconcile_duration_seconds_count 1"));
        assert!(
            text.contains("patchbay_operator_reconcile_failures_total{reason=\"InvalidSpec\"} 1")
        );
        assert!(text.contains(
            "patchbay_operator_api_calls_total{verb=\"apply\",kind=\"ConfigMap\",outcome=\"timeout\"} 1"
        ));
        assert!(text.contains("patchbay_operator_leader 1"));
    }
}
