//! Leader election through a `coordination.k8s.io/v1` Lease, so that two operator replicas are
//! safe: only the holder runs the controller, the other waits.
//!
//! The protocol is client-go's: the holder renews `renewTime` every [`RETRY_PERIOD`]; a candidate
//! takes the Lease once `renewTime + leaseDurationSeconds` has passed, or at once when it has no
//! holder. Every write is an update carrying the read `resourceVersion`, so two candidates racing
//! for an expired Lease cannot both win: the loser gets a conflict and stays a follower.
//!
//! A holder that cannot renew within [`RENEW_DEADLINE`] stops leading (its controller is shut down
//! and the process exits to be restarted as a candidate) before the Lease can expire for others,
//! since `RENEW_DEADLINE < LEASE_DURATION`. On graceful shutdown the holder releases the Lease so a
//! standby takes over without waiting for expiry.
//!
//! The decision is the pure [`decide`]; the I/O around it is [`LeaderElector`].

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::PostParams;
use kube::{Api, Client};
use tokio_util::sync::CancellationToken;

/// How long a Lease stays valid after its last renewal.
pub const LEASE_DURATION: Duration = Duration::from_secs(15);
/// How long a holder keeps leading while renewals fail.
pub const RENEW_DEADLINE: Duration = Duration::from_secs(10);
/// Period of renewals and acquisition attempts.
pub const RETRY_PERIOD: Duration = Duration::from_secs(2);
/// Bound on one Lease API call.
const CALL_TIMEOUT: Duration = Duration::from_secs(5);

/// What a candidate should do with the Lease as it reads it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Nobody holds it, or the holder's time ran out: take it.
    Take,
    /// We hold it: renew.
    Renew,
    /// Someone else holds a valid Lease.
    Follow { holder: String },
}

/// Decide from the Lease's spec (`None`: no Lease yet).
pub fn decide(spec: Option<&LeaseSpec>, identity: &str, now: Timestamp) -> Decision {
    let Some(spec) = spec else {
        return Decision::Take;
    };
    let holder = spec.holder_identity.as_deref().unwrap_or_default();
    if holder.is_empty() {
        return Decision::Take;
    }
    if holder == identity {
        return Decision::Renew;
    }
    let duration = SignedDuration::from_secs(i64::from(
        spec.lease_duration_seconds
            .unwrap_or(LEASE_DURATION.as_secs() as i32),
    ));
    match spec.renew_time.as_ref().or(spec.acquire_time.as_ref()) {
        Some(MicroTime(renewed)) if *renewed + duration > now => Decision::Follow {
            holder: holder.to_string(),
        },
        _ => Decision::Take,
    }
}

/// The Lease spec after `decision` (which must not be `Follow`).
pub fn next_spec(
    previous: Option<&LeaseSpec>,
    decision: &Decision,
    identity: &str,
    now: Timestamp,
) -> LeaseSpec {
    let previous = previous.cloned().unwrap_or_default();
    let lease_duration_seconds = Some(LEASE_DURATION.as_secs() as i32);
    match decision {
        Decision::Renew => LeaseSpec {
            renew_time: Some(MicroTime(now)),
            lease_duration_seconds,
            ..previous
        },
        Decision::Take | Decision::Follow { .. } => {
            let changed_hands = previous
                .holder_identity
                .as_deref()
                .is_some_and(|h| !h.is_empty() && h != identity);
            LeaseSpec {
                holder_identity: Some(identity.to_string()),
                acquire_time: Some(MicroTime(now)),
                renew_time: Some(MicroTime(now)),
                lease_duration_seconds,
                lease_transitions: Some(
                    previous.lease_transitions.unwrap_or(0) + i32::from(changed_hands),
                ),
                ..previous
            }
        }
    }
}

/// Campaigns for, holds and releases one Lease.
pub struct LeaderElector {
    api: Api<Lease>,
    name: String,
    identity: String,
}

impl LeaderElector {
    pub fn new(client: Client, namespace: &str, name: &str, identity: &str) -> Self {
        Self {
            api: Api::namespaced(client, namespace),
            name: name.to_string(),
            identity: identity.to_string(),
        }
    }

    pub fn identity(&self) -> &str {
        &self.identity
    }

    /// One round: read the Lease and take or renew it if allowed. `Ok(true)`: we lead.
    pub async fn try_acquire_or_renew(&self) -> kube::Result<bool> {
        let now = Timestamp::now();
        let Some(mut lease) = bounded(self.api.get_opt(&self.name)).await? else {
            let decision = Decision::Take;
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(self.name.clone()),
                    ..ObjectMeta::default()
                },
                spec: Some(next_spec(None, &decision, &self.identity, now)),
            };
            return match bounded(self.api.create(&PostParams::default(), &lease)).await {
                Ok(_) => Ok(true),
                Err(kube::Error::Api(s)) if s.is_already_exists() => Ok(false),
                Err(e) => Err(e),
            };
        };
        let decision = decide(lease.spec.as_ref(), &self.identity, now);
        if let Decision::Follow { holder } = &decision {
            tracing::debug!(%holder, "lease held by another replica");
            return Ok(false);
        }
        lease.spec = Some(next_spec(
            lease.spec.as_ref(),
            &decision,
            &self.identity,
            now,
        ));
        // `lease` carries the resourceVersion we read: a concurrent writer makes this a conflict.
        match bounded(self.api.replace(&self.name, &PostParams::default(), &lease)).await {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(s)) if s.is_conflict() => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Wait until we lead. Returns false if `shutdown` came first.
    pub async fn acquire(&self, shutdown: &CancellationToken) -> bool {
        loop {
            match self.try_acquire_or_renew().await {
                Ok(true) => return true,
                Ok(false) => {}
                Err(error) => {
                    tracing::warn!(%error, lease = %self.name, "lease acquisition failed")
                }
            }
            tokio::select! {
                () = tokio::time::sleep(RETRY_PERIOD) => {}
                () = shutdown.cancelled() => return false,
            }
        }
    }

    /// Renew until a renewal fails for longer than [`RENEW_DEADLINE`] or another replica took
    /// over; then return (leadership is lost).
    pub async fn hold(&self) {
        let mut last_renewed = tokio::time::Instant::now();
        loop {
            tokio::time::sleep(RETRY_PERIOD).await;
            match self.try_acquire_or_renew().await {
                Ok(true) => last_renewed = tokio::time::Instant::now(),
                Ok(false) => {
                    tracing::error!(lease = %self.name, "another replica holds the lease");
                    return;
                }
                Err(error) => {
                    tracing::warn!(%error, lease = %self.name, "lease renewal failed");
                    if last_renewed.elapsed() >= RENEW_DEADLINE {
                        tracing::error!(lease = %self.name, "could not renew the lease in time");
                        return;
                    }
                }
            }
        }
    }

    /// Give the Lease up if we hold it, so a standby takes over at once.
    pub async fn release(&self) {
        let result = async {
            let Some(mut lease) = bounded(self.api.get_opt(&self.name)).await? else {
                return Ok(());
            };
            let held = lease
                .spec
                .as_ref()
                .and_then(|s| s.holder_identity.as_deref())
                == Some(self.identity.as_str());
            if held {
                if let Some(spec) = lease.spec.as_mut() {
                    spec.holder_identity = None;
                    spec.lease_duration_seconds = Some(1);
                }
                bounded(self.api.replace(&self.name, &PostParams::default(), &lease)).await?;
            }
            Ok::<_, kube::Error>(())
        }
        .await;
        if let Err(error) = result {
            tracing::warn!(%error, lease = %self.name, "could not release the lease");
        }
    }
}

/// A Lease call under [`CALL_TIMEOUT`]; a timeout becomes a `kube::Error` like any other failure.
async fn bounded<T>(call: impl std::future::Future<Output = kube::Result<T>>) -> kube::Result<T> {
    tokio::time::timeout(CALL_TIMEOUT, call)
        .await
        .unwrap_or_else(|_| {
            Err(kube::Error::Service(
                format!("lease call timed out after {CALL_TIMEOUT:?}").into(),
            ))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: i64) -> Timestamp {
        Timestamp::from_second(1_700_000_000 + secs).unwrap()
    }

    fn held_by(holder: &str, renewed: i64) -> LeaseSpec {
        LeaseSpec {
            holder_identity: Some(holder.into()),
            renew_time: Some(MicroTime(at(renewed))),
            acquire_time: Some(MicroTime(at(0))),
            lease_duration_seconds: Some(15),
            lease_transitions: Some(3),
            ..LeaseSpec::default()
        }
    }

    #[test]
    fn a_missing_or_unheld_lease_is_taken() {
        assert_eq!(decide(None, "a", at(0)), Decision::Take);
        assert_eq!(
            decide(Some(&LeaseSpec::default()), "a", at(0)),
            Decision::Take
        );
        let released = LeaseSpec {
            holder_identity: Some(String::new()),
            ..held_by("b", 0)
        };
        assert_eq!(decide(Some(&released), "a", at(1)), Decision::Take);
    }

    #[test]
    fn the_holder_renews() {
        assert_eq!(
            decide(Some(&held_by("a", 0)), "a", at(100)),
            Decision::Renew
        );
    }

    #[test]
    fn a_valid_lease_of_another_replica_is_followed_until_it_expires() {
        let lease = held_by("b", 10);
        assert_eq!(
            decide(Some(&lease), "a", at(24)),
            Decision::Follow { holder: "b".into() }
        );
        assert_eq!(decide(Some(&lease), "a", at(25)), Decision::Take);
    }

    #[test]
    fn taking_over_counts_a_transition_and_renewing_does_not() {
        let lease = held_by("b", 0);
        let taken = next_spec(Some(&lease), &Decision::Take, "a", at(30));
        assert_eq!(taken.holder_identity.as_deref(), Some("a"));
        assert_eq!(taken.lease_transitions, Some(4));
        assert_eq!(taken.acquire_time, Some(MicroTime(at(30))));
        let renewed = next_spec(Some(&taken), &Decision::Renew, "a", at(32));
        assert_eq!(renewed.lease_transitions, Some(4));
        assert_eq!(renewed.acquire_time, Some(MicroTime(at(30))));
        assert_eq!(renewed.renew_time, Some(MicroTime(at(32))));
        let fresh = next_spec(None, &Decision::Take, "a", at(0));
        assert_eq!(fresh.lease_transitions, Some(0));
        assert_eq!(fresh.lease_duration_seconds, Some(15));
    }

    #[test]
    fn renewals_stop_leading_before_the_lease_expires_for_others() {
        assert!(RENEW_DEADLINE + RETRY_PERIOD < LEASE_DURATION);
    }
}
