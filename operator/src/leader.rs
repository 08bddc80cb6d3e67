//! Leader election through a `coordination.k8s.io/v1` Lease, so that two operator replicas are
//! safe: only the holder runs the controller, the other waits.
//!
//! The protocol is client-go's, and so is its one subtle rule: **a Lease's age is judged on this
//! process's own monotonic clock, never by comparing the holder's `renewTime` with the local
//! wall clock.** A candidate remembers the Lease record it last read (holder, `renewTime`,
//! `resourceVersion`) and the [`Instant`] at which that record last *changed*; the Lease is
//! expired once it has not changed for its `leaseDurationSeconds`. Clock skew between nodes,
//! which with a wall-clock comparison would give two leaders once it exceeds the renew slack,
//! therefore cannot matter ([`Observer`], pure, takes the clock as a parameter).
//!
//! Every write is an update carrying the read `resourceVersion`, so two candidates racing for an
//! expired Lease cannot both win: the loser gets a conflict and stays a follower.
//!
//! The holder renews every [`RETRY_PERIOD`]. Each renewal runs under the deadline
//! `last successful renewal + RENEW_DEADLINE` (a slow API server cannot stretch one attempt past
//! it); when the deadline passes, [`LeaderElector::hold`] returns and the caller stops its
//! controller at once (aborts it, without waiting for in-flight reconciles) and exits. The last
//! successful renewal is timed from when its request was *sent*, so others, who saw it no earlier,
//! cannot take the Lease before `that + LEASE_DURATION`: the `LEASE_DURATION - RENEW_DEADLINE`
//! (5 s) margin is the time the holder has to stop. On graceful shutdown the holder releases the
//! Lease so a standby takes over without waiting for expiry.
//!
//! Caveat shared with client-go: the margin assumes the replicas' monotonic clocks run at about
//! the same *rate* (they need not agree on the time).

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::PostParams;
use kube::{Api, Client};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// How long a Lease stays valid after its record last changed.
pub const LEASE_DURATION: Duration = Duration::from_secs(15);
/// How long a holder keeps leading after its last successful renewal started.
pub const RENEW_DEADLINE: Duration = Duration::from_secs(10);
/// Period of renewals and acquisition attempts.
pub const RETRY_PERIOD: Duration = Duration::from_secs(2);
/// Bound on one Lease API call.
const CALL_TIMEOUT: Duration = Duration::from_secs(5);
const _: () = assert!(
    RENEW_DEADLINE.as_secs() + RETRY_PERIOD.as_secs() < LEASE_DURATION.as_secs(),
    "a holder stops leading before the Lease can expire for others"
);

/// What a candidate should do with the Lease as it reads it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Nobody holds it, or its record has not changed for its duration: take it.
    Take,
    /// We hold it: renew.
    Renew,
    /// Someone else holds a Lease we have seen change within its duration.
    Follow { holder: String },
}

/// The parts of a Lease whose change proves its holder alive.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Record {
    holder: String,
    renew_time: Option<Timestamp>,
    resource_version: Option<String>,
}

/// This process's memory of the Lease: the record it last read and when (on its monotonic clock)
/// that record last changed.
#[derive(Debug, Default)]
pub struct Observer {
    last: Option<(Record, Instant)>,
}

impl Observer {
    /// Note the Lease as read at `now` (`None`: there is none) and decide.
    pub fn decide(&mut self, lease: Option<&Lease>, identity: &str, now: Instant) -> Decision {
        let Some(lease) = lease else {
            self.last = None;
            return Decision::Take;
        };
        let spec = lease.spec.clone().unwrap_or_default();
        let holder = spec.holder_identity.unwrap_or_default();
        let record = Record {
            holder: holder.clone(),
            renew_time: spec.renew_time.map(|MicroTime(t)| t),
            resource_version: lease.metadata.resource_version.clone(),
        };
        let changed_at = match &self.last {
            Some((seen, at)) if *seen == record => *at,
            _ => now,
        };
        self.last = Some((record, changed_at));
        if holder.is_empty() {
            return Decision::Take;
        }
        if holder == identity {
            return Decision::Renew;
        }
        let duration = spec
            .lease_duration_seconds
            .and_then(|s| u64::try_from(s).ok())
            .map_or(LEASE_DURATION, Duration::from_secs);
        if now.saturating_duration_since(changed_at) >= duration {
            Decision::Take
        } else {
            Decision::Follow { holder }
        }
    }
}

/// The Lease spec after `decision` (which must not be `Follow`); `now` is the wall-clock time
/// written into `acquireTime`/`renewTime` (informational: nobody compares it with a clock).
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
    observer: Observer,
    /// When the last successful take or renewal was sent.
    renewed_at: Option<Instant>,
}

impl LeaderElector {
    pub fn new(client: Client, namespace: &str, name: &str, identity: &str) -> Self {
        Self {
            api: Api::namespaced(client, namespace),
            name: name.to_string(),
            identity: identity.to_string(),
            observer: Observer::default(),
            renewed_at: None,
        }
    }

    pub fn identity(&self) -> &str {
        &self.identity
    }

    /// One round: read the Lease and take or renew it if allowed. `Ok(true)`: we lead, and
    /// the round's start is remembered as the last renewal.
    pub async fn try_acquire_or_renew(&mut self) -> kube::Result<bool> {
        let started = Instant::now();
        let won = self.round().await?;
        if won {
            self.renewed_at = Some(started);
        }
        Ok(won)
    }

    async fn round(&mut self) -> kube::Result<bool> {
        let read = bounded(self.api.get_opt(&self.name)).await?;
        let decision = self
            .observer
            .decide(read.as_ref(), &self.identity, Instant::now());
        let now = Timestamp::now();
        let Some(mut lease) = read else {
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
    pub async fn acquire(&mut self, shutdown: &CancellationToken) -> bool {
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

    /// Renew every [`RETRY_PERIOD`] until another replica took over or no renewal succeeded
    /// within [`RENEW_DEADLINE`] of the last one (an attempt still in flight at the deadline is
    /// abandoned); then return: leadership is lost, and the caller must stop reconciling now.
    pub async fn hold(&mut self) {
        let since = *self.renewed_at.get_or_insert_with(Instant::now);
        let mut deadline = since + RENEW_DEADLINE;
        loop {
            tokio::time::sleep_until((Instant::now() + RETRY_PERIOD).min(deadline)).await;
            if Instant::now() >= deadline {
                break;
            }
            match tokio::time::timeout_at(deadline, self.try_acquire_or_renew()).await {
                Ok(Ok(true)) => {
                    if let Some(at) = self.renewed_at {
                        deadline = at + RENEW_DEADLINE;
                    }
                }
                Ok(Ok(false)) => {
                    tracing::error!(lease = %self.name, "another replica holds the lease");
                    return;
                }
                Ok(Err(error)) => {
                    tracing::warn!(%error, lease = %self.name, "lease renewal failed");
                }
                // Still in flight at the deadline: abandoned.
                Err(_) => break,
            }
        }
        tracing::error!(lease = %self.name, deadline = ?RENEW_DEADLINE, "could not renew the lease in time");
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

/// How a term as leader ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Term {
    /// Shut down: the controller finished its in-flight work while the Lease was still renewed;
    /// the caller releases the Lease.
    Stopped,
    /// The Lease was lost: the controller was stopped at once (another replica may lead already).
    Lost,
    /// The controller ended by itself: the caller releases the Lease so another replica leads.
    ControllerEnded,
}

/// Runs a term: `controller` reconciles while `hold` (the elector's [`LeaderElector::hold`])
/// keeps the Lease. On `shutdown` the Lease is still renewed until the controller has finished
/// its in-flight reconciles: dropping the renewal at once let a standby take over while this
/// replica was still applying. Losing the Lease aborts the controller at once, in either phase.
pub async fn term<H: std::future::Future<Output = ()>>(
    hold: H,
    mut controller: tokio::task::JoinHandle<()>,
    shutdown: &CancellationToken,
) -> Term {
    tokio::pin!(hold);
    let ended = tokio::select! {
        () = shutdown.cancelled() => None,
        () = &mut hold => Some(Term::Lost),
        _ = &mut controller => return Term::ControllerEnded,
    };
    if let Some(lost) = ended {
        controller.abort();
        let _ = controller.await;
        return lost;
    }
    tokio::select! {
        _ = &mut controller => Term::Stopped,
        () = &mut hold => {
            controller.abort();
            let _ = controller.await;
            Term::Lost
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::{Request, Response};
    use kube::client::Body;
    use tower_test::mock;

    fn wall(secs: i64) -> Timestamp {
        Timestamp::from_second(1_700_000_000 + secs).unwrap()
    }

    fn lease(holder: &str, renewed: Timestamp, version: &str) -> Lease {
        Lease {
            metadata: ObjectMeta {
                name: Some("patchbay-operator".into()),
                namespace: Some("default".into()),
                resource_version: Some(version.into()),
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(holder.into()),
                renew_time: Some(MicroTime(renewed)),
                acquire_time: Some(MicroTime(wall(0))),
                lease_duration_seconds: Some(15),
                lease_transitions: Some(3),
                ..LeaseSpec::default()
            }),
        }
    }

    fn secs(n: u64) -> Duration {
        Duration::from_secs(n)
    }

    /// A controller that takes `finish` to stop after `stop` is cancelled.
    fn controller(stop: &CancellationToken, finish: Duration) -> tokio::task::JoinHandle<()> {
        let stop = stop.clone();
        tokio::spawn(async move {
            stop.cancelled().await;
            tokio::time::sleep(finish).await;
        })
    }

    #[tokio::test(start_paused = true)]
    async fn on_shutdown_the_lease_is_renewed_until_the_controller_has_stopped() {
        let shutdown = CancellationToken::new();
        let renewals = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
        let counted = renewals.clone();
        let hold = async move {
            loop {
                tokio::time::sleep(RETRY_PERIOD).await;
                counted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
        };
        let c = controller(&shutdown, RETRY_PERIOD * 5 + Duration::from_millis(1));
        let cancel = shutdown.clone();
        tokio::spawn(async move {
            tokio::time::sleep(RETRY_PERIOD * 3 + Duration::from_millis(1)).await;
            cancel.cancel();
        });
        assert_eq!(term(hold, c, &shutdown).await, Term::Stopped);
        // Three renewals before the shutdown, five more while the controller finished.
        assert_eq!(renewals.load(std::sync::atomic::Ordering::Relaxed), 8);
    }

    #[tokio::test(start_paused = true)]
    async fn a_lease_lost_while_finishing_stops_the_controller_at_once() {
        let shutdown = CancellationToken::new();
        shutdown.cancel();
        let c = controller(&shutdown, Duration::from_secs(3600));
        let started = Instant::now();
        let lost = tokio::time::sleep(RETRY_PERIOD);
        assert_eq!(term(lost, c, &shutdown).await, Term::Lost);
        assert_eq!(started.elapsed(), RETRY_PERIOD);
        // And while leading.
        let running = CancellationToken::new();
        let c = controller(&running, Duration::ZERO);
        let lost = tokio::time::sleep(RETRY_PERIOD);
        assert_eq!(term(lost, c, &CancellationToken::new()).await, Term::Lost);
    }

    #[tokio::test(start_paused = true)]
    async fn a_controller_that_ends_by_itself_ends_the_term() {
        let c = tokio::spawn(async {});
        let hold = std::future::pending::<()>();
        assert_eq!(
            term(hold, c, &CancellationToken::new()).await,
            Term::ControllerEnded
        );
    }

    #[test]
    fn a_missing_or_unheld_lease_is_taken() {
        let t0 = Instant::now();
        assert_eq!(Observer::default().decide(None, "a", t0), Decision::Take);
        let mut released = lease("b", wall(0), "1");
        released.spec.as_mut().unwrap().holder_identity = Some(String::new());
        assert_eq!(
            Observer::default().decide(Some(&released), "a", t0),
            Decision::Take
        );
        let mut empty = lease("b", wall(0), "1");
        empty.spec = None;
        assert_eq!(
            Observer::default().decide(Some(&empty), "a", t0),
            Decision::Take
        );
    }

    #[test]
    fn the_holder_renews() {
        let mut observer = Observer::default();
        assert_eq!(
            observer.decide(Some(&lease("a", wall(0), "1")), "a", Instant::now()),
            Decision::Renew
        );
    }

    #[test]
    fn an_unchanged_lease_is_taken_only_after_its_duration_on_the_local_clock() {
        let t0 = Instant::now();
        let mut observer = Observer::default();
        let held = lease("b", wall(10), "7");
        let follow = Decision::Follow { holder: "b".into() };
        // First sight starts the clock, whatever renewTime says.
        assert_eq!(observer.decide(Some(&held), "a", t0), follow);
        assert_eq!(observer.decide(Some(&held), "a", t0 + secs(14)), follow);
        assert_eq!(
            observer.decide(Some(&held), "a", t0 + secs(15)),
            Decision::Take
        );
    }

    #[test]
    fn a_renewal_seen_restarts_the_local_clock() {
        let t0 = Instant::now();
        let mut observer = Observer::default();
        let follow = Decision::Follow { holder: "b".into() };
        assert_eq!(
            observer.decide(Some(&lease("b", wall(0), "1")), "a", t0),
            follow
        );
        // Renewed (new renewTime and resourceVersion) at t0 + 10 s.
        let renewed = lease("b", wall(2), "2");
        assert_eq!(observer.decide(Some(&renewed), "a", t0 + secs(10)), follow);
        assert_eq!(observer.decide(Some(&renewed), "a", t0 + secs(24)), follow);
        assert_eq!(
            observer.decide(Some(&renewed), "a", t0 + secs(25)),
            Decision::Take
        );
        // A write that changed only the resourceVersion counts as a change too.
        let touched = lease("b", wall(2), "3");
        assert_eq!(observer.decide(Some(&touched), "a", t0 + secs(26)), follow);
    }

    #[test]
    fn a_holder_whose_clock_runs_hours_ahead_is_not_followed_past_the_lease_duration() {
        // renewTime an hour in the future: a wall-clock comparison would follow a dead holder
        // for an hour.
        let t0 = Instant::now();
        let mut observer = Observer::default();
        let ahead = lease("b", Timestamp::now() + secs(3600), "1");
        assert!(matches!(
            observer.decide(Some(&ahead), "a", t0),
            Decision::Follow { .. }
        ));
        assert_eq!(
            observer.decide(Some(&ahead), "a", t0 + secs(15)),
            Decision::Take
        );
    }

    #[test]
    fn a_live_holder_whose_clock_runs_behind_is_never_taken_over() {
        // renewTime an hour in the past but renewed every 2 s: a wall-clock comparison would
        // take over at once and give two leaders.
        let t0 = Instant::now();
        let behind = Timestamp::now() - secs(3600);
        let mut observer = Observer::default();
        for round in 0..30u64 {
            let renewed = lease("b", behind + secs(2 * round), &round.to_string());
            assert_eq!(
                observer.decide(Some(&renewed), "a", t0 + secs(2 * round)),
                Decision::Follow { holder: "b".into() },
                "round {round}"
            );
        }
    }

    #[test]
    fn taking_over_counts_a_transition_and_renewing_does_not() {
        let previous = lease("b", wall(0), "1").spec.unwrap();
        let taken = next_spec(Some(&previous), &Decision::Take, "a", wall(30));
        assert_eq!(taken.holder_identity.as_deref(), Some("a"));
        assert_eq!(taken.lease_transitions, Some(4));
        assert_eq!(taken.acquire_time, Some(MicroTime(wall(30))));
        let renewed = next_spec(Some(&taken), &Decision::Renew, "a", wall(32));
        assert_eq!(renewed.lease_transitions, Some(4));
        assert_eq!(renewed.acquire_time, Some(MicroTime(wall(30))));
        assert_eq!(renewed.renew_time, Some(MicroTime(wall(32))));
        let fresh = next_spec(None, &Decision::Take, "a", wall(0));
        assert_eq!(fresh.lease_transitions, Some(0));
        assert_eq!(fresh.lease_duration_seconds, Some(15));
    }

    type Handle = mock::Handle<Request<Body>, Response<Body>>;

    fn elector() -> (LeaderElector, Handle) {
        let (service, handle) = mock::pair::<Request<Body>, Response<Body>>();
        let client = Client::new(service, "default");
        (
            LeaderElector::new(client, "default", "patchbay-operator", "a"),
            handle,
        )
    }

    fn json_response(value: &impl serde::Serialize) -> Response<Body> {
        Response::builder()
            .header("content-type", "application/json")
            .body(Body::from(serde_json::to_vec(value).unwrap()))
            .unwrap()
    }

    #[tokio::test(start_paused = true)]
    async fn a_holder_facing_an_api_server_that_stops_answering_stops_leading_by_the_renew_deadline(
    ) {
        let (mut elector, mut handle) = elector();
        let start = Instant::now();
        elector.renewed_at = Some(start);
        // The API server accepts requests and never answers them.
        let pending = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Some(request) = handle.next_request().await {
                held.push(request);
            }
        });
        elector.hold().await;
        let held_for = Instant::now() - start;
        assert!(
            held_for <= RENEW_DEADLINE,
            "led for {held_for:?} after the last renewal"
        );
        assert!(RENEW_DEADLINE + RETRY_PERIOD < LEASE_DURATION);
        pending.abort();
    }

    #[tokio::test(start_paused = true)]
    async fn the_renew_deadline_runs_from_the_last_successful_renewal() {
        let (mut elector, mut handle) = elector();
        let start = Instant::now();
        elector.renewed_at = Some(start);
        let server = tokio::spawn(async move {
            // One renewal round answered (read, then the update), then silence.
            let (_, send) = handle.next_request().await.unwrap();
            send.send_response(json_response(&lease("a", wall(0), "1")));
            let (request, send) = handle.next_request().await.unwrap();
            assert_eq!(request.method(), http::Method::PUT);
            send.send_response(json_response(&lease("a", wall(2), "2")));
            let renewed = Instant::now();
            let mut held = Vec::new();
            while let Some(request) = handle.next_request().await {
                held.push(request);
            }
            renewed
        });
        elector.hold().await;
        let lost = Instant::now();
        server.abort();
        // The one renewal happened after the first retry period.
        let renewal_sent = elector.renewed_at.unwrap();
        assert!(renewal_sent >= start + RETRY_PERIOD);
        assert!(
            lost > start + RENEW_DEADLINE,
            "kept leading past the first deadline"
        );
        assert!(lost <= renewal_sent + RENEW_DEADLINE);
    }

    #[tokio::test(start_paused = true)]
    async fn a_candidate_takes_a_skewed_dead_lease_after_the_lease_duration_of_its_own_clock() {
        let (mut elector, mut handle) = elector();
        let shutdown = CancellationToken::new();
        let start = Instant::now();
        // The dead holder's renewTime is an hour ahead: it never changes again.
        let dead = lease("b", Timestamp::now() + secs(3600), "41");
        let server = tokio::spawn(async move {
            loop {
                let (request, send) = handle.next_request().await.unwrap();
                if request.method() == http::Method::PUT {
                    let taken_at = Instant::now();
                    send.send_response(json_response(&lease("a", wall(0), "42")));
                    return taken_at;
                }
                send.send_response(json_response(&dead));
            }
        });
        assert!(elector.acquire(&shutdown).await);
        let taken_at = server.await.unwrap();
        let waited = taken_at - start;
        assert!(
            waited >= LEASE_DURATION && waited <= LEASE_DURATION + RETRY_PERIOD,
            "took the lease after {waited:?}"
        );
    }
}
