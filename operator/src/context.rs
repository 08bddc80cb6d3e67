//! What every reconcile shares: the client, the event recorder, metrics, the operator's defaults,
//! and per-route failure counts for the error backoff.
//!
//! Every API call goes through [`Context::call`], which bounds it with [`Context::api_timeout`]
//! and counts it by verb, kind and outcome: a hung API server shows up as `timeout`s in metrics
//! and as a retried reconcile, never as a controller stuck forever on one route.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Mutex;
use std::time::Duration;

use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::reflector::ObjectRef;
use kube::Client;

use crate::build::MANAGER;
use crate::crd::RealtimeRoute;
use crate::error::{Error, Result};
use crate::metrics::Metrics;

/// Default bound on one API call.
pub const DEFAULT_API_TIMEOUT: Duration = Duration::from_secs(10);
/// First retry delay after a failed reconcile; doubles per consecutive failure.
pub const BACKOFF_BASE: Duration = Duration::from_secs(5);
/// Longest retry delay after failed reconciles.
pub const BACKOFF_MAX: Duration = Duration::from_secs(300);

pub struct Context {
    pub client: Client,
    pub recorder: Recorder,
    pub metrics: Metrics,
    /// Gateway image for routes that do not name one.
    pub gateway_image: String,
    pub api_timeout: Duration,
    failures: Mutex<HashMap<ObjectRef<RealtimeRoute>, u32>>,
}

impl Context {
    pub fn new(
        client: Client,
        metrics: Metrics,
        gateway_image: String,
        instance: Option<String>,
    ) -> Self {
        let reporter = Reporter {
            controller: MANAGER.into(),
            instance,
        };
        Self {
            recorder: Recorder::new(client.clone(), reporter),
            client,
            metrics,
            gateway_image,
            api_timeout: DEFAULT_API_TIMEOUT,
            failures: Mutex::default(),
        }
    }

    /// Run one API call under the timeout, counting its outcome.
    pub async fn call<T>(
        &self,
        verb: &'static str,
        kind: &'static str,
        name: &str,
        call: impl Future<Output = kube::Result<T>>,
    ) -> Result<T> {
        match tokio::time::timeout(self.api_timeout, call).await {
            Ok(Ok(value)) => {
                self.metrics.api_call(verb, kind, "success");
                Ok(value)
            }
            Ok(Err(source)) => {
                self.metrics.api_call(verb, kind, "failure");
                Err(Error::Api {
                    verb,
                    kind,
                    name: name.to_string(),
                    source: Box::new(source),
                })
            }
            Err(_) => {
                self.metrics.api_call(verb, kind, "timeout");
                Err(Error::Timeout {
                    verb,
                    kind,
                    name: name.to_string(),
                    after: self.api_timeout,
                })
            }
        }
    }

    /// Record one more consecutive failure of a route and return the delay before its retry.
    pub fn next_backoff(&self, route: ObjectRef<RealtimeRoute>) -> Duration {
        let mut failures = self.failures.lock().unwrap_or_else(|e| e.into_inner());
        let count = failures.entry(route).or_insert(0);
        *count = count.saturating_add(1);
        backoff_delay(*count)
    }

    /// Forget a route's failures after a successful reconcile.
    pub fn reset_backoff(&self, route: &ObjectRef<RealtimeRoute>) {
        let mut failures = self.failures.lock().unwrap_or_else(|e| e.into_inner());
        failures.remove(route);
    }
}

/// Delay before the retry after `failures` consecutive failures: 5 s, 10 s, 20 s, … up to 300 s.
pub fn backoff_delay(failures: u32) -> Duration {
    let doublings = failures.saturating_sub(1).min(16);
    BACKOFF_BASE.saturating_mul(1 << doublings).min(BACKOFF_MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_from_five_seconds_up_to_five_minutes() {
        let secs: Vec<u64> = (1..=8).map(|n| backoff_delay(n).as_secs()).collect();
        assert_eq!(secs, [5, 10, 20, 40, 80, 160, 300, 300]);
        assert_eq!(backoff_delay(u32::MAX), BACKOFF_MAX);
    }
}
