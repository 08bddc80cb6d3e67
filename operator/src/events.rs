//! Kubernetes events on the route for what a reconcile changed.
//!
//! [`changes`] decides, from what was there before and what was applied, which events to emit; it
//! is pure so the decisions are tested without an API server. Publishing is best-effort: an event
//! that cannot be written is logged and does not fail the reconcile.

use k8s_openapi::api::apps::v1::Deployment;
use kube::runtime::events::{Event, EventType};
use kube::{Resource, ResourceExt};

use crate::build::{Desired, CONFIG_HASH_ANNOTATION};
use crate::context::Context;
use crate::crd::RealtimeRoute;
use crate::error::Error;
use crate::status::{DEGRADED, PODS_NOT_STARTING};

/// One event to publish on the route.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Change {
    pub warning: bool,
    pub reason: &'static str,
    pub note: String,
}

/// What changed between the observed world and the applied one.
pub fn changes(
    route: &RealtimeRoute,
    before: Option<&Deployment>,
    desired: &Desired,
    hpa_deleted: bool,
    pods_not_starting: Option<&str>,
) -> Vec<Change> {
    let mut out = Vec::new();
    let name = desired.deployment.name_any();
    match before {
        None => out.push(Change {
            warning: false,
            reason: "Created",
            note: format!("created gateway Deployment {name}"),
        }),
        Some(d) => {
            let old_hash = d
                .spec
                .as_ref()
                .and_then(|s| s.template.metadata.as_ref())
                .and_then(|m| m.annotations.as_ref())
                .and_then(|a| a.get(CONFIG_HASH_ANNOTATION));
            if old_hash != Some(&desired.config_hash) {
                out.push(Change {
                    warning: false,
                    reason: "ConfigChanged",
                    note: format!("gateway config changed; rolling Deployment {name}"),
                });
            }
        }
    }
    let old_pool = route.status.as_ref().and_then(|s| s.pool_size_per_pod);
    if let Some(old) = old_pool.filter(|old| *old != desired.pool_size) {
        out.push(Change {
            warning: false,
            reason: "PoolResized",
            note: format!(
                "warm pool per pod resized from {old} to {}",
                desired.pool_size
            ),
        });
    }
    if hpa_deleted {
        out.push(Change {
            warning: false,
            reason: "AutoscalerRemoved",
            note: "replicas.min == replicas.max: deleted the HorizontalPodAutoscaler".into(),
        });
    }
    let degraded = route.condition(DEGRADED).filter(|c| c.status == "True");
    match (degraded, pods_not_starting) {
        (Some(c), Some(why)) if c.reason != PODS_NOT_STARTING => out.push(Change {
            warning: true,
            reason: PODS_NOT_STARTING,
            note: why.to_string(),
        }),
        (None, Some(why)) => out.push(Change {
            warning: true,
            reason: PODS_NOT_STARTING,
            note: why.to_string(),
        }),
        (Some(_), None) => out.push(Change {
            warning: false,
            reason: "Recovered",
            note: "the route's problem is resolved".into(),
        }),
        (Some(_), Some(_)) | (None, None) => {}
    }
    out
}

/// The warning event for a problem that stopped a reconcile.
pub fn problem(error: &Error) -> Change {
    Change {
        warning: true,
        reason: error.reason(),
        note: error.to_string(),
    }
}

/// Publish events on the route; failures are logged, not returned.
pub async fn publish(ctx: &Context, route: &RealtimeRoute, changes: &[Change]) {
    let reference = route.object_ref(&());
    for change in changes {
        let event = Event {
            type_: if change.warning {
                EventType::Warning
            } else {
                EventType::Normal
            },
            reason: change.reason.into(),
            note: Some(change.note.clone()),
            action: "Reconcile".into(),
            secondary: None,
        };
        let name = route.name_any();
        if let Err(error) = ctx
            .call(
                "create",
                "Event",
                &name,
                ctx.recorder.publish(&event, &reference),
            )
            .await
        {
            tracing::warn!(route = %name, reason = change.reason, %error, "could not publish event");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::build::{desired, BuildInput};
    use crate::fixtures;

    fn reasons(changes: &[Change]) -> Vec<&'static str> {
        changes.iter().map(|c| c.reason).collect()
    }

    #[test]
    fn a_first_reconcile_reports_the_creation() {
        let route = fixtures::route(fixtures::minimal_spec());
        let d = desired(&BuildInput {
            route: &route,
            default_image: "img",
            observed_replicas: None,
        });
        assert_eq!(
            reasons(&changes(&route, None, &d, false, None)),
            ["Created"]
        );
    }

    #[test]
    fn a_steady_state_reports_nothing() {
        let mut route = fixtures::route(fixtures::minimal_spec());
        let d = desired(&BuildInput {
            route: &route,
            default_image: "img",
            observed_replicas: None,
        });
        route.status = Some(crate::crd::RealtimeRouteStatus {
            pool_size_per_pod: Some(d.pool_size),
            ..Default::default()
        });
        assert!(changes(&route, Some(&d.deployment), &d, false, None).is_empty());
    }

    #[test]
    fn config_pool_and_autoscaler_changes_are_reported() {
        let mut route = fixtures::route(fixtures::autoscaled_spec());
        let before = desired(&BuildInput {
            route: &route,
            default_image: "img",
            observed_replicas: Some(2),
        });
        route.status = Some(crate::crd::RealtimeRouteStatus {
            pool_size_per_pod: Some(before.pool_size),
            ..Default::default()
        });
        route.spec.drain.wait_seconds = 30;
        let after = desired(&BuildInput {
            route: &route,
            default_image: "img",
            observed_replicas: Some(5),
        });
        assert_eq!(
            reasons(&changes(
                &route,
                Some(&before.deployment),
                &after,
                true,
                None
            )),
            ["ConfigChanged", "PoolResized", "AutoscalerRemoved"]
        );
    }

    #[test]
    fn pods_not_starting_warn_once_and_recover_when_they_start() {
        let mut route = fixtures::route(fixtures::minimal_spec());
        let d = desired(&BuildInput {
            route: &route,
            default_image: "img",
            observed_replicas: None,
        });
        route.status = Some(crate::crd::RealtimeRouteStatus {
            pool_size_per_pod: Some(d.pool_size),
            ..Default::default()
        });
        let why = Some("1 of 1 gateway pods are not starting");
        let steady =
            |route: &RealtimeRoute, why| changes(route, Some(&d.deployment), &d, false, why);
        assert_eq!(reasons(&steady(&route, why)), ["PodsNotStarting"]);
        assert!(steady(&route, why)[0].warning);
        let degraded = |reason: &str| crate::crd::RouteCondition {
            type_: DEGRADED.into(),
            status: "True".into(),
            reason: reason.into(),
            message: String::new(),
            last_transition_time: "t".into(),
            observed_generation: Some(1),
        };
        route.status.as_mut().unwrap().conditions = vec![degraded(PODS_NOT_STARTING)];
        assert!(steady(&route, why).is_empty(), "no repeat while it lasts");
        assert_eq!(reasons(&steady(&route, None)), ["Recovered"]);
        route.status.as_mut().unwrap().conditions = vec![degraded("NameTaken")];
        assert_eq!(reasons(&steady(&route, why)), ["PodsNotStarting"]);
    }
}
