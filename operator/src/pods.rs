//! Why a route's gateway pods do not start, from what the operator can see.
//!
//! The operator never reads Secrets, so it cannot tell that one is missing. The kubelet can: a pod
//! whose Secret volume cannot be mounted stays `ContainerCreating` with `FailedMount` warning
//! events, and a container that cannot start (an image that cannot be pulled) gets `Failed`
//! events. A gateway that exits at start (a config it refuses, a signing key too short) is
//! restarted until its container waits in `CrashLoopBackOff`; its last termination carries the
//! end of its output (the Deployment sets `terminationMessagePolicy: FallbackToLogsOnError`), which
//! is where the gateway prints why. A pod no node can take gets `FailedScheduling` events.
//!
//! When the route's Deployment has fewer ready pods than it wants, the reconcile lists the route's
//! pods and the namespace's pod events ([`observe`], read-only), and [`not_starting`] (pure) turns
//! them into the message of `Degraded=True/PodsNotStarting`: which pods, and for each its crash
//! loop (with the end of its last output) or else the reason and message of its latest such
//! event; for a mount or start failure, also the Secrets the route references (the usual cause),
//! named with their fields.
//!
//! Both lists may be served from the API server's cache (`resourceVersion=0`): a reconcile that
//! looks again within 30 s needs no quorum read of every pod event in the namespace. And this is
//! diagnosis, not reconciliation: [`diagnose`] turns a failed list into a logged warning and keeps
//! what the status last said, so it never fails a reconcile whose children were applied.

use k8s_openapi::api::core::v1::{ContainerStatus, Event, Pod};
use k8s_openapi::jiff::Timestamp;
use kube::api::ListParams;
use kube::{Api, ResourceExt};

use crate::build::selector_labels;
use crate::context::Context;
use crate::crd::RealtimeRoute;
use crate::error::Result;
use crate::status::{DEGRADED, PODS_NOT_STARTING};
use crate::validate::secret_refs;

/// Event reasons that say a pod cannot start.
pub const NOT_STARTING_REASONS: [&str; 3] = ["FailedMount", "Failed", "FailedScheduling"];
/// Of those, the ones a missing Secret or key causes: the message then names the route's Secrets.
const SECRET_REASONS: [&str; 2] = ["FailedMount", "Failed"];
/// The waiting reason of a container the kubelet keeps restarting.
pub const CRASH_LOOP: &str = "CrashLoopBackOff";
/// Pods named in the message, at most.
const MAX_PODS_NAMED: usize = 3;
/// Characters kept of one event message, or of the end of a container's last output.
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

/// The last `max` characters of `text`, trimmed, with `…` where it was cut: the end of a
/// process's output is where it says why it exited.
fn tail(text: &str, max: usize) -> String {
    let text = text.trim();
    let count = text.chars().count();
    if count <= max {
        return text.to_string();
    }
    let kept: String = text.chars().skip(count - max).collect();
    format!("…{kept}")
}

/// A container of `pod` in a crash loop, described: `container gateway exited with code 1: <the end
/// of its last output>`.
fn crash_loop(pod: &Pod) -> Option<String> {
    let statuses = pod.status.as_ref()?.container_statuses.as_ref()?;
    let looping: &ContainerStatus = statuses.iter().find(|c| {
        c.state
            .as_ref()
            .and_then(|s| s.waiting.as_ref())
            .and_then(|w| w.reason.as_deref())
            == Some(CRASH_LOOP)
    })?;
    let mut text = format!("{CRASH_LOOP}: container {}", looping.name);
    if let Some(last) = looping
        .last_state
        .as_ref()
        .and_then(|s| s.terminated.as_ref())
    {
        text.push_str(&format!(" exited with code {}", last.exit_code));
        let said = last
            .message
            .as_deref()
            .filter(|m| !m.trim().is_empty())
            .or(last.reason.as_deref());
        if let Some(said) = said {
            text.push_str(&format!(": {}", tail(said, MAX_EVENT_MESSAGE_CHARS)));
        }
    }
    Some(text)
}

/// The message of `Degraded=True/PodsNotStarting`, or `None` when no unready pod of the route
/// is in a crash loop or has a `FailedMount`, `Failed` or `FailedScheduling` warning event.
/// `pods` are the route's; `events` may be any in the namespace (they are matched to the pods by
/// name and uid).
pub fn not_starting(route: &RealtimeRoute, pods: &[Pod], events: &[Event]) -> Option<String> {
    let live: Vec<&Pod> = pods
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .collect();
    let mut stuck = Vec::new();
    let mut secret_trouble = false;
    for pod in live.iter().filter(|p| !is_ready(p)) {
        let name = pod.name_any();
        if let Some(crash) = crash_loop(pod) {
            stuck.push(format!("pod {name}: {crash}"));
            continue;
        }
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
            let reason = event.reason.as_deref().unwrap_or_default();
            secret_trouble |= SECRET_REASONS.contains(&reason);
            let message: String = event
                .message
                .as_deref()
                .unwrap_or_default()
                .chars()
                .take(MAX_EVENT_MESSAGE_CHARS)
                .collect();
            stuck.push(format!("pod {name}: {reason}: {message}"));
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
    if secret_trouble {
        let namespace = route.namespace().unwrap_or_default();
        let secrets: Vec<String> = secret_refs(&route.spec)
            .into_iter()
            .map(|(field, s)| format!("{namespace}/{} key {:?} ({field})", s.name, s.key))
            .collect();
        message.push_str(&format!(
            ". The route mounts Secrets {}: check that each exists with that key.",
            secrets.join(", ")
        ));
    }
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
/// `PodsNotStarting` message, if any. Both lists may come from the API server's cache.
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
            pods.list(&ListParams::default().labels(&selector).match_any()),
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
            events.list(
                &ListParams::default()
                    .fields("involvedObject.kind=Pod")
                    .match_any(),
            ),
        )
        .await?
        .items;
    Ok(not_starting(route, &pods, &events))
}

/// What the status last said of the route's pods: the `PodsNotStarting` message, if that is why
/// it is `Degraded`.
pub fn last_reported(route: &RealtimeRoute) -> Option<String> {
    route
        .condition(DEGRADED)
        .filter(|c| c.status == "True" && c.reason == PODS_NOT_STARTING)
        .map(|c| c.message.clone())
}

/// [`observe`], best-effort: when a list fails, log it and keep what the status last said
/// ([`last_reported`]), so a diagnosis that cannot be made neither fails the reconcile nor
/// announces a recovery.
pub async fn diagnose(ctx: &Context, route: &RealtimeRoute, namespace: &str) -> Option<String> {
    match observe(ctx, route, namespace).await {
        Ok(found) => found,
        Err(error) => {
            tracing::warn!(
                route = %route.name_any(),
                %namespace,
                %error,
                "cannot look into the gateway pods; keeping the last diagnosis"
            );
            last_reported(route)
        }
    }
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

    /// The recorded pod, its container now waiting in `CrashLoopBackOff` after exiting with
    /// `output` (the end of its logs, as `FallbackToLogsOnError` makes it).
    fn crash_looping(output: &str) -> Pod {
        let (mut pod, _) = recorded();
        let status = pod.status.as_mut().unwrap();
        status.phase = Some("Running".into());
        status.container_statuses = Some(vec![serde_json::from_value(serde_json::json!({
            "name": "gateway", "ready": false, "restartCount": 4, "image": "patchbay/gateway:0.1.0",
            "imageID": "",
            "state": {"waiting": {"reason": "CrashLoopBackOff",
                "message": "back-off 1m20s restarting failed container=gateway"}},
            "lastState": {"terminated": {"exitCode": 2, "reason": "Error", "message": output}}
        }))
        .unwrap()]);
        pod
    }

    #[test]
    fn a_crash_looping_gateway_is_reported_with_the_end_of_its_output() {
        let route = fixtures::route(fixtures::minimal_spec());
        let pod = crash_looping(
            "{\"level\":\"INFO\",\"msg\":\"loading config\"}\n\
             patchbay-gateway: routes[0].model: must not be empty\n",
        );
        // The kubelet's BackOff events say only that it restarts; the pod says why.
        let message = not_starting(&route, &[pod], &[]).expect("not starting");
        assert!(
            message.starts_with(
                "1 of 1 gateway pods are not starting: pod voice-gateway-6c8f7b9d54-q7x2m: \
                 CrashLoopBackOff: container gateway exited with code 2: "
            ),
            "{message}"
        );
        assert!(
            message.ends_with("patchbay-gateway: routes[0].model: must not be empty"),
            "{message}"
        );
        assert!(
            !message.contains("The route mounts Secrets"),
            "a crash loop is not a missing Secret: {message}"
        );
    }

    #[test]
    fn a_long_crash_output_keeps_its_end() {
        let route = fixtures::route(fixtures::minimal_spec());
        let output = format!("{}the reason", "x".repeat(2000));
        let message = not_starting(&route, &[crash_looping(&output)], &[]).unwrap();
        assert!(message.ends_with("xthe reason"), "{message}");
        assert!(message.contains(": …x"), "{message}");
        assert!(message.chars().count() < 500, "bounded: {message}");
        // Without a message, the termination reason.
        let message = not_starting(&route, &[crash_looping("")], &[]).unwrap();
        assert!(message.ends_with("exited with code 2: Error"), "{message}");
    }

    #[test]
    fn a_pod_no_node_can_take_is_reported_with_the_schedulers_reason() {
        let route = fixtures::route(fixtures::full_spec());
        let (mut pod, events) = recorded();
        pod.status.as_mut().unwrap().container_statuses = None;
        let mut unschedulable = events[1].clone();
        unschedulable.reason = Some("FailedScheduling".into());
        unschedulable.message = Some(
            "0/3 nodes are available: 3 node(s) didn't match Pod's node affinity/selector.".into(),
        );
        let message = not_starting(&route, &[pod], &[unschedulable]).expect("not starting");
        assert!(
            message.contains(
                "FailedScheduling: 0/3 nodes are available: 3 node(s) didn't match Pod's node \
                 affinity/selector."
            ),
            "{message}"
        );
        assert!(!message.contains("The route mounts Secrets"), "{message}");
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
