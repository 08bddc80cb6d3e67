//! Stage 4 of a reconcile: the route's status.
//!
//! [`compute`] is pure: from the route, what was observed (the Deployment, the pool size) and the
//! problem that stopped the reconcile (if any) it derives `observedGeneration`, the replica counts,
//! the endpoint and three conditions:
//!
//! | type | True when | reasons |
//! |---|---|---|
//! | `Ready` | at least one gateway pod is ready | `GatewayReady`, `NoReadyReplicas` |
//! | `Progressing` | the Deployment is being created or rolled out | `Creating`, `RollingOut`, `RolloutComplete`, `Blocked` |
//! | `Degraded` | the spec cannot be served as written, or its pods cannot start | `InvalidSpec`, `NameTaken`, `PodsNotStarting`, `AsExpected` |
//!
//! A refused spec (`InvalidSpec`, `NameTaken`) is not applied, so it is `Progressing=False/Blocked`
//! whatever runs, and `status.observedGeneration` stays at the last generation that was applied
//! (what the pods run): a client waiting for `observedGeneration == metadata.generation` keeps
//! waiting rather than taking the old pods' readiness for the new spec's. The conditions carry
//! the current generation, as they are judged against it; `Ready` says the pods serve the last
//! applied spec.
//!
//! A condition keeps its `lastTransitionTime` while its `status` stays the same, so an unchanged
//! world yields an identical status and the apply is a no-op (no watch event, no reconcile loop).

use k8s_openapi::api::apps::v1::Deployment;
use kube::api::Patch;
use kube::{Api, Resource, ResourceExt};

use crate::apply::apply_params;
use crate::build::endpoint;
use crate::context::Context;
use crate::crd::{RealtimeRoute, RealtimeRouteStatus, RouteCondition};
use crate::error::{Error, Result};
use crate::exposure::{Exposure, GATEWAY_API_UNAVAILABLE};

pub const READY: &str = "Ready";
pub const PROGRESSING: &str = "Progressing";
pub const DEGRADED: &str = "Degraded";
/// Present only on a route with `spec.expose`: every parent Gateway accepted its `HTTPRoute`.
pub const EXPOSED: &str = "Exposed";
/// `Degraded` reason when the route's pods cannot start (for example a missing Secret).
pub const PODS_NOT_STARTING: &str = "PodsNotStarting";

/// What a reconcile saw and decided.
#[derive(Debug, Default)]
pub struct Observation<'a> {
    /// The gateway Deployment, as last read or applied.
    pub deployment: Option<&'a Deployment>,
    /// The pool size just applied; `None` keeps the previous status value.
    pub pool_size: Option<i32>,
    /// The user error that stopped this reconcile.
    pub problem: Option<&'a Error>,
    /// Why the route's pods do not start ([`crate::pods::not_starting`]), when they do not.
    pub pods_not_starting: Option<&'a str>,
    /// What became of `spec.expose`; `None` when the reconcile stopped before it.
    pub exposure: Option<&'a Exposure>,
}

/// The current time as `metav1.Time` text (RFC 3339, seconds).
pub fn now_rfc3339() -> String {
    k8s_openapi::jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

/// Derive the status; `now` stamps conditions whose status changed.
pub fn compute(route: &RealtimeRoute, seen: &Observation<'_>, now: &str) -> RealtimeRouteStatus {
    let generation = route.metadata.generation;
    let previous = route.status.clone().unwrap_or_default();
    let dep_status = seen
        .deployment
        .and_then(|d| d.status.clone())
        .unwrap_or_default();
    let replicas = dep_status.replicas.unwrap_or(0);
    let ready = dep_status.ready_replicas.unwrap_or(0);

    let condition = |type_: &str, status: bool, reason: &str, message: String| {
        let status = if status { "True" } else { "False" };
        let last_transition_time = previous
            .conditions
            .iter()
            .find(|c| c.type_ == type_ && c.status == status)
            .map(|c| c.last_transition_time.clone())
            .unwrap_or_else(|| now.to_string());
        RouteCondition {
            type_: type_.to_string(),
            status: status.to_string(),
            reason: reason.to_string(),
            message,
            last_transition_time,
            observed_generation: generation,
        }
    };

    // A refused spec is not what the pods run.
    let not_applied = match (seen.problem, generation) {
        (Some(_), Some(generation)) => {
            format!("; they run the last applied spec, not generation {generation}")
        }
        (Some(_), None) => "; they run the last applied spec, not the current one".into(),
        (None, _) => String::new(),
    };
    let ready_condition = if ready > 0 {
        condition(
            READY,
            true,
            "GatewayReady",
            format!("{ready}/{replicas} gateway pods ready{not_applied}"),
        )
    } else {
        condition(
            READY,
            false,
            "NoReadyReplicas",
            "no gateway pod is ready".into(),
        )
    };

    let progressing = match (seen.deployment, seen.problem) {
        (_, Some(_)) => condition(
            PROGRESSING,
            false,
            "Blocked",
            "the current spec is not applied: waiting for its problem to be fixed".into(),
        ),
        (None, None) => condition(PROGRESSING, true, "Creating", "creating the gateway".into()),
        (Some(d), _) if rollout_complete(d) => condition(
            PROGRESSING,
            false,
            "RolloutComplete",
            "the gateway Deployment is up to date".into(),
        ),
        (Some(d), _) => {
            let updated = d
                .status
                .as_ref()
                .and_then(|s| s.updated_replicas)
                .unwrap_or(0);
            condition(
                PROGRESSING,
                true,
                "RollingOut",
                format!("{updated}/{} gateway pods updated", desired_replicas(d)),
            )
        }
    };

    let unavailable = match seen.exposure {
        Some(Exposure::Unavailable(why)) => Some(why.as_str()),
        _ => None,
    };
    let degraded = match (seen.problem, seen.pods_not_starting, unavailable) {
        (Some(problem), _, _) => condition(DEGRADED, true, problem.reason(), problem.to_string()),
        (None, Some(why), _) => condition(DEGRADED, true, PODS_NOT_STARTING, why.to_string()),
        (None, None, Some(why)) => condition(DEGRADED, true, GATEWAY_API_UNAVAILABLE, why.into()),
        (None, None, None) => condition(DEGRADED, false, "AsExpected", String::new()),
    };
    let mut conditions = vec![ready_condition, progressing, degraded];
    let exposed = match (route.spec.expose.is_some(), seen.exposure) {
        (false, _) => None,
        // Stopped before the exposure stage: what was last said.
        (true, None) => previous
            .conditions
            .iter()
            .find(|c| c.type_ == EXPOSED)
            .cloned(),
        (true, Some(Exposure::NotAsked)) => None,
        (true, Some(Exposure::Unavailable(why))) => Some(condition(
            EXPOSED,
            false,
            GATEWAY_API_UNAVAILABLE,
            why.clone(),
        )),
        (true, Some(e @ Exposure::Applied(status))) if e.accepted() => Some(condition(
            EXPOSED,
            true,
            "Accepted",
            format!(
                "every parent accepted HTTPRoute {}; reached at {}",
                status.http_route,
                if status.urls.is_empty() {
                    "no address the Gateways report yet".to_string()
                } else {
                    status.urls.join(", ")
                }
            ),
        )),
        (true, Some(Exposure::Applied(status))) => {
            let first = status
                .parents
                .iter()
                .find(|p| p.accepted != "True" || p.resolved_refs != "True");
            let (reason, message) = match first {
                Some(p) => (
                    if p.reason.is_empty() {
                        "Pending"
                    } else {
                        p.reason.as_str()
                    },
                    format!(
                        "HTTPRoute {} on {}: {}",
                        status.http_route, p.parent, p.message
                    ),
                ),
                None => ("Pending", "no parent reported yet".to_string()),
            };
            Some(condition(EXPOSED, false, reason, message))
        }
    };
    conditions.extend(exposed);
    let exposure = match seen.exposure {
        None => previous.exposure.clone(),
        Some(Exposure::Applied(status)) => Some(status.clone()),
        Some(Exposure::NotAsked | Exposure::Unavailable(_)) => None,
    };

    RealtimeRouteStatus {
        observed_generation: match seen.problem {
            Some(_) => previous.observed_generation,
            None => generation,
        },
        replicas: Some(replicas),
        ready_replicas: Some(ready),
        pool_size_per_pod: seen.pool_size.or(previous.pool_size_per_pod),
        endpoint: Some(endpoint(route)),
        conditions,
        exposure,
        ..RealtimeRouteStatus::default()
    }
}

/// The Deployment's wanted pod count: its `spec.replicas` (the HPA's choice under an HPA).
fn desired_replicas(d: &Deployment) -> i32 {
    d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1)
}

/// The Deployment controller has seen the latest spec and every wanted pod is updated and available.
fn rollout_complete(d: &Deployment) -> bool {
    let Some(status) = &d.status else {
        return false;
    };
    let desired = desired_replicas(d);
    status.observed_generation >= d.metadata.generation
        && status.updated_replicas.unwrap_or(0) >= desired
        && status.available_replicas.unwrap_or(0) >= desired
        && status.replicas.unwrap_or(0) == status.updated_replicas.unwrap_or(0)
}

/// Server-side apply the status subresource.
pub async fn patch(
    ctx: &Context,
    route: &RealtimeRoute,
    namespace: &str,
    status: &RealtimeRouteStatus,
) -> Result<()> {
    let api: Api<RealtimeRoute> = Api::namespaced(ctx.client.clone(), namespace);
    let name = route.name_any();
    let body = serde_json::json!({
        "apiVersion": RealtimeRoute::api_version(&()),
        "kind": RealtimeRoute::kind(&()),
        "status": status,
    });
    ctx.call(
        "patch_status",
        "RealtimeRoute",
        &name,
        api.patch_status(&name, &apply_params(), &Patch::Apply(body)),
    )
    .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures;
    use k8s_openapi::api::apps::v1::{DeploymentSpec, DeploymentStatus};

    fn deployment(
        generation: i64,
        observed: i64,
        replicas: i32,
        updated: i32,
        ready: i32,
    ) -> Deployment {
        let mut d = Deployment {
            spec: Some(DeploymentSpec {
                replicas: Some(replicas),
                ..DeploymentSpec::default()
            }),
            status: Some(DeploymentStatus {
                observed_generation: Some(observed),
                replicas: Some(replicas),
                updated_replicas: Some(updated),
                ready_replicas: Some(ready),
                available_replicas: Some(ready),
                ..DeploymentStatus::default()
            }),
            ..Deployment::default()
        };
        d.metadata.generation = Some(generation);
        d
    }

    fn get<'a>(status: &'a RealtimeRouteStatus, type_: &str) -> &'a RouteCondition {
        status.conditions.iter().find(|c| c.type_ == type_).unwrap()
    }

    #[test]
    fn a_rolled_out_ready_gateway_is_ready_and_not_progressing() {
        let route = fixtures::route(fixtures::minimal_spec());
        let d = deployment(3, 3, 2, 2, 2);
        let seen = Observation {
            deployment: Some(&d),
            pool_size: Some(4),
            problem: None,
            pods_not_starting: None,
            exposure: None,
        };
        let status = compute(&route, &seen, "2025-01-01T00:00:00Z");
        assert_eq!(status.observed_generation, Some(1));
        assert_eq!((status.replicas, status.ready_replicas), (Some(2), Some(2)));
        assert_eq!(status.pool_size_per_pod, Some(4));
        assert_eq!(
            status.endpoint.as_deref(),
            Some("ws://voice.realtime.svc:8080/v1/realtime")
        );
        assert_eq!(get(&status, READY).status, "True");
        assert_eq!(get(&status, PROGRESSING).reason, "RolloutComplete");
        assert_eq!(get(&status, DEGRADED).status, "False");
        assert!(status
            .conditions
            .iter()
            .all(|c| c.observed_generation == Some(1)));
    }

    #[test]
    fn a_new_generation_not_yet_seen_by_the_deployment_is_rolling_out() {
        let route = fixtures::route(fixtures::minimal_spec());
        let d = deployment(4, 3, 2, 1, 2);
        let seen = Observation {
            deployment: Some(&d),
            ..Observation::default()
        };
        let status = compute(&route, &seen, "t");
        assert_eq!(get(&status, PROGRESSING).status, "True");
        assert_eq!(get(&status, PROGRESSING).reason, "RollingOut");
    }

    #[test]
    fn a_spec_problem_is_degraded_with_its_reason_and_blocks_the_rollout() {
        let route = fixtures::route(fixtures::minimal_spec());
        let problem = Error::NameTaken {
            kind: "ConfigMap",
            namespace: "realtime".into(),
            name: "voice-pool".into(),
        };
        let seen = Observation {
            problem: Some(&problem),
            ..Observation::default()
        };
        let status = compute(&route, &seen, "t");
        let degraded = get(&status, DEGRADED);
        assert_eq!(degraded.status, "True");
        assert_eq!(degraded.reason, "NameTaken");
        assert!(degraded.message.contains("realtime/voice-pool"));
        assert_eq!(get(&status, READY).status, "False");
        assert_eq!(get(&status, PROGRESSING).reason, "Blocked");
    }

    #[test]
    fn an_invalid_edit_of_a_running_route_is_blocked_and_not_claimed_as_observed() {
        let mut route = fixtures::route(fixtures::minimal_spec());
        let d = deployment(1, 1, 2, 2, 2);
        let applied = compute(
            &route,
            &Observation {
                deployment: Some(&d),
                pool_size: Some(1),
                ..Observation::default()
            },
            "2025-01-01T00:00:00Z",
        );
        assert_eq!(applied.observed_generation, Some(1));
        route.status = Some(applied);
        // Generation 2 is refused; the Deployment of generation 1 is rolled out and ready.
        route.metadata.generation = Some(2);
        let problem =
            Error::InvalidSpec("gateway.tolerations is not a valid Kubernetes value".into());
        let status = compute(
            &route,
            &Observation {
                deployment: Some(&d),
                pool_size: None,
                problem: Some(&problem),
                pods_not_starting: None,
                exposure: None,
            },
            "2025-01-02T00:00:00Z",
        );
        let progressing = get(&status, PROGRESSING);
        assert_eq!(
            (progressing.status.as_str(), progressing.reason.as_str()),
            ("False", "Blocked")
        );
        assert_eq!(
            status.observed_generation,
            Some(1),
            "the refused generation is not claimed"
        );
        let ready = get(&status, READY);
        assert_eq!(ready.status, "True", "the old pods still serve");
        assert!(
            ready.message.ends_with("not generation 2"),
            "{}",
            ready.message
        );
        assert_eq!(get(&status, DEGRADED).reason, "InvalidSpec");
        assert!(status
            .conditions
            .iter()
            .all(|c| c.observed_generation == Some(2)));
    }

    #[test]
    fn pods_that_cannot_start_are_degraded_with_why() {
        let route = fixtures::route(fixtures::minimal_spec());
        let d = deployment(1, 1, 2, 2, 0);
        let seen = Observation {
            deployment: Some(&d),
            pool_size: Some(1),
            problem: None,
            pods_not_starting: Some("1 of 2 gateway pods are not starting: …"),
            exposure: None,
        };
        let status = compute(&route, &seen, "t");
        let degraded = get(&status, DEGRADED);
        assert_eq!(
            (degraded.status.as_str(), degraded.reason.as_str()),
            ("True", "PodsNotStarting")
        );
        assert!(degraded.message.starts_with("1 of 2 gateway pods"));
    }

    #[test]
    fn an_unchanged_condition_keeps_its_transition_time() {
        let mut route = fixtures::route(fixtures::minimal_spec());
        let d = deployment(1, 1, 1, 1, 1);
        let seen = Observation {
            deployment: Some(&d),
            pool_size: Some(1),
            problem: None,
            pods_not_starting: None,
            exposure: None,
        };
        let first = compute(&route, &seen, "2025-01-01T00:00:00Z");
        route.status = Some(first.clone());
        let second = compute(&route, &seen, "2025-01-02T00:00:00Z");
        assert_eq!(first, second);
        let not_ready = deployment(1, 1, 1, 1, 0);
        let third = compute(
            &route,
            &Observation {
                deployment: Some(&not_ready),
                ..Observation::default()
            },
            "2025-01-03T00:00:00Z",
        );
        assert_eq!(
            get(&third, READY).last_transition_time,
            "2025-01-03T00:00:00Z"
        );
        assert_eq!(
            get(&third, DEGRADED).last_transition_time,
            "2025-01-01T00:00:00Z"
        );
        assert_eq!(
            third.pool_size_per_pod,
            Some(1),
            "kept from the previous status"
        );
    }
}
