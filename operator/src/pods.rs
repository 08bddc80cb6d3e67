//! Why a route's gateway pods do not start, from what the operator can see.
//!
//! The operator never reads Secrets, so it cannot tell that one is missing. The kubelet can: a pod
//! whose Secret volume cannot be mounted stays `ContainerCreating` with `FailedMount` warning
//! events, and a container that cannot start (an image that cannot be pulled, a config it
//! refuses) gets `Failed` events. When the route's Deployment has fewer ready pods than it wants,
//! the reconcile lists the route's pods and the namespace's pod events
//! ([`observe`], read-only), and [`not_starting`] (pure) turns them into the message of
//! `Degraded=True/PodsNotStarting`: which pods, the reason and message of each one's latest such
//! event, and the Secrets the route references (the usual cause), named with their fields.

use k8s_openapi::api::core::v1::{Event, Pod};
use k8s_openapi::jiff::Timestamp;
use kube::api::ListParams;
use kube::{Api, ResourceExt};

use crate::build::selector_labels;
use crate::context::Context;
use crate::crd::RealtimeRoute;
use crate::error::Result;
use crate::validate::secret_refs;

/// Event reasons that say a pod cannot start.
pub const NOT_STARTING_REASONS: [&str; 2] = ["FailedMount", "Failed"];
/// Pods named in the message, at most.
const MAX_PODS_NAMED: usize = 3;
/// Characters kept of one event message.
const MAX_EVENT_MESSAGE_CHARS: usize = 300;

fn is_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// When an event last happened: `lastTimestamp`, else `eventTime`, else its creation.
fn last_seen(event: &Event) -> Option<Timestamp> {
    event
        .last_timestamp
        .as_ref()
        .map(|t| t.0)
        .or_else(|| event.event_time.as_ref().map(|t| t.0))
        .or_else(|| event.metadata.creation_timestamp.as_ref().map(|t| t.0))
}

/// The message of `Degraded=True/PodsNotStarting`, or `None` when no unready pod of the route
/// has a `FailedMount`/`Failed` warning event. `pods` are the route's; `events` may be any in
/// the namespace (they are matched to the pods by name and uid).
pub fn not_starting(route: &RealtimeRoute, pods: &[Pod], events: &[Event]) -> Option<String> {
    let live: Vec<&Pod> = pods
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .collect();
    let mut stuck = Vec::new();
    for pod in live.iter().filter(|p| !is_ready(p)) {
        let name = pod.name_any();
        let uid = pod.uid();
        let latest = events
            .iter()
            .filter(|e| {
                let o = &e.involved_object;
                o.kind.as_deref() == Some("Pod")
                    && o.name.as_deref() == Some(name.as_str())
                    && (o.uid.is_none() || uid.is_none() || o.uid == uid)
                    && e.type_.as_deref() == Some("Warning")
                    && e.reason
                        .as_deref()
                        .is_some_and(|r| NOT_STARTING_REASONS.contains(&r))
            })
            .max_by_key(|e| last_seen(e));
        if let Some(event) = latest {
            let message: String = event
                .message
                .as_deref()
                .unwrap_or_default()
                .chars()
                .take(MAX_EVENT_MESSAGE_CHARS)
                .collect();
            stuck.push(format!(
                "pod {name}: {}: {message}",
                event.reason.as_deref().unwrap_or_default()
            ));
        }
    }
    if stuck.is_empty() {
        return None;
    }
    let count = stuck.len();
    let more = count.saturating_sub(MAX_PODS_NAMED);
    stuck.truncate(MAX_PODS_NAMED);
    let mut message = format!(
        "{count} of {} gateway pods are not starting: {}",
        live.len(),
        stuck.join("; ")
    );
    if more > 0 {
        message.push_str(&format!("; and {more} more"));
    }
    let namespace = route.namespace().unwrap_or_default();
    let secrets: Vec<String> = secret_refs(&route.spec)
        .into_iter()
        .map(|(field, s)| format!("{namespace}/{} key {:?} ({field})", s.name, s.key))
        .collect();
    message.push_str(&format!(
        ". The route mounts Secrets {}: check that each exists with that key.",
        secrets.join(", ")
    ));
    Some(message)
}

/// Whether the Deployment has fewer ready pods than it wants (or no status yet).
pub fn short_of_ready(deployment: &k8s_openapi::api::apps::v1::Deployment) -> bool {
    let wanted = deployment
        .spec
        .as_ref()
        .and_then(|s| s.replicas)
        .or_else(|| deployment.status.as_ref().and_then(|s| s.replicas))
        .unwrap_or(1);
    let ready = deployment
        .status
        .as_ref()
        .and_then(|s| s.ready_replicas)
        .unwrap_or(0);
    ready < wanted
}

/// List the route's pods and, if any is not ready, the namespace's pod events; return the
/// `PodsNotStarting` message, if any.
pub async fn observe(
    ctx: &Context,
    route: &RealtimeRoute,
    namespace: &str,
) -> Result<Option<String>> {
    let selector = selector_labels(route)
        .into_iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",");
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), namespace);
    let pods = ctx
        .call(
            "list",
            "Pod",
            "",
            pods.list(&ListParams::default().labels(&selector)),
        )
        .await?
        .items;
    if pods.iter().all(is_ready) {
        return Ok(None);
    }
    let events: Api<Event> = Api::namespaced(ctx.client.clone(), namespace);
    let events = ctx
        .call(
            "list",
            "Event",
            "",
            events.list(&ListParams::default().fields("involvedObject.kind=Pod")),
        )
        .await?
        .items;
    Ok(not_starting(route, &pods, &events))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures;
    use k8s_openapi::List;

    /// A pod the kubelet reported as `ContainerCreating` because its upstream-key Secret is
    /// missing, and the namespace's events at that time (recorded objects).
    fn recorded() -> (Pod, Vec<Event>) {
        let pod: Pod = serde_json::from_str(include_str!("../testdata/pod-secret-missing.json"))
            .expect("recorded pod");
        let events: List<Event> =
            serde_json::from_str(include_str!("../testdata/events-secret-missing.json"))
                .expect("recorded events");
        (pod, events.items)
    }

    fn ready(mut pod: Pod, name: &str) -> Pod {
        pod.metadata.name = Some(name.into());
        pod.metadata.uid = Some(format!("uid-{name}"));
        for c in pod.status.as_mut().unwrap().conditions.as_mut().unwrap() {
            c.status = "True".into();
        }
        pod
    }

    #[test]
    fn a_pod_stuck_on_a_missing_secret_names_the_mount_failure_and_the_routes_secrets() {
        let route = fixtures::route(fixtures::full_spec());
        let (pod, events) = recorded();
        let healthy = ready(pod.clone(), "voice-gateway-6c8f7b9d54-ok001");
        let message = not_starting(&route, &[pod, healthy], &events).expect("not starting");
        assert!(
            message.starts_with(
                "1 of 2 gateway pods are not starting: pod voice-gateway-6c8f7b9d54-q7x2m: \
                 FailedMount: MountVolume.SetUp failed for volume \"upstream-key\" : secret \"openai\" not found"
            ),
            "{message}"
        );
        for secret in [
            "realtime/openai key \"api-key\" (upstream.apiKeySecretRef)",
            "realtime/voice-keys key \"keys.toml\" (clientKeysSecretRef)",
            "realtime/redis key \"url\" (metering.redisUrlSecretRef)",
        ] {
            assert!(message.contains(secret), "{secret} in {message}");
        }
        // Another app's Failed event in the namespace is not this route's.
        assert!(!message.contains("ImagePullBackOff"), "{message}");
    }

    #[test]
    fn ready_pods_or_pods_without_failure_events_are_not_reported() {
        let route = fixtures::route(fixtures::minimal_spec());
        let (pod, events) = recorded();
        assert_eq!(
            not_starting(&route, &[ready(pod.clone(), "p")], &events),
            None
        );
        // Only the Normal `Scheduled` event: still starting, nothing to report yet.
        let scheduled: Vec<Event> = events
            .iter()
            .filter(|e| e.reason.as_deref() == Some("Scheduled"))
            .cloned()
            .collect();
        assert_eq!(
            not_starting(&route, std::slice::from_ref(&pod), &scheduled),
            None
        );
        assert_eq!(not_starting(&route, &[], &events), None);
    }

    #[test]
    fn an_event_of_an_earlier_pod_of_the_same_name_does_not_count() {
        let route = fixtures::route(fixtures::minimal_spec());
        let (mut pod, events) = recorded();
        pod.metadata.uid = Some("a-newer-pod".into());
        assert_eq!(not_starting(&route, &[pod], &events), None);
    }

    #[test]
    fn the_latest_failure_of_each_pod_is_reported_and_the_list_is_bounded() {
        let route = fixtures::route(fixtures::minimal_spec());
        let (pod, events) = recorded();
        let mut failed_later = events[1].clone();
        failed_later.reason = Some("Failed".into());
        failed_later.message = Some("Error: ErrImagePull".into());
        failed_later.last_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            "2026-12-01T10:05:00Z".parse().unwrap(),
        ));
        let events = [events.clone(), vec![failed_later]].concat();
        let message = not_starting(&route, std::slice::from_ref(&pod), &events).unwrap();
        assert!(message.contains("Failed: Error: ErrImagePull"), "{message}");
        assert!(!message.contains("FailedMount"), "{message}");

        let pods: Vec<Pod> = (0..5)
            .map(|i| {
                let mut p = pod.clone();
                p.metadata.name = Some(format!("p{i}"));
                p.metadata.uid = None;
                p
            })
            .collect();
        let events: Vec<Event> = (0..5)
            .map(|i| {
                let mut e = events[1].clone();
                e.involved_object.name = Some(format!("p{i}"));
                e
            })
            .collect();
        let message = not_starting(&route, &pods, &events).unwrap();
        assert!(
            message.starts_with("5 of 5 gateway pods are not starting"),
            "{message}"
        );
        assert!(message.contains("; and 2 more."), "{message}");
    }

    #[test]
    fn a_deployment_short_of_ready_pods_is_looked_into() {
        let d =
            |replicas: Option<i32>, ready: Option<i32>| -> k8s_openapi::api::apps::v1::Deployment {
                serde_json::from_value(serde_json::json!({
                    "spec": {"replicas": replicas, "selector": {}, "template": {}},
                    "status": {"readyReplicas": ready}
                }))
                .unwrap()
            };
        assert!(short_of_ready(&d(Some(2), Some(1))));
        assert!(short_of_ready(&d(Some(2), None)));
        assert!(!short_of_ready(&d(Some(2), Some(2))));
        assert!(!short_of_ready(&d(Some(0), None)));
    }
}
