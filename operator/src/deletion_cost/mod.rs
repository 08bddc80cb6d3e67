//! Scale-down removes the idlest gateway pods first.
//!
//! The ReplicaSet controller deletes the pods with the lowest `controller.kubernetes.io/
//! pod-deletion-cost` first when a Deployment scales down, so this keeps that annotation on each
//! ready gateway pod equal to its live sessions: every [`SCRAPE_INTERVAL`] it lists the gateway
//! pods the operator manages, scrapes each ready pod's admin `/metrics` at its pod IP
//! ([`scrape`]), and patches the pods [`decide`] picks, at most [`MAX_PATCHES_PER_SECOND`].
//!
//! Each round also hands what it scraped to [`crate::live_status`], which writes the routes' live
//! figures (sessions, warm pool, spend) into their status.
//!
//! It runs only on the leader, beside the controller. Nothing here is on the reconcile path: a
//! pod that cannot be scraped keeps its cost, and a failed list or patch is counted and retried
//! next round. The list is served from the API server's cache (`resourceVersion=0`), not a
//! quorum read of every gateway pod in the cluster every round. The API server allows the
//! operator only this annotation on these pods (the chart's ValidatingAdmissionPolicy).
//!
//! Caveat: the cost is as fresh as the last round (a few seconds, plus the hysteresis), and it
//! orders only *which* pods go; in `drain.mode: linger` the pods that do go still carry their
//! long calls for `lingerSeconds`.

pub mod decide;
pub mod scrape;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{ListParams, Patch, PatchParams};
use kube::{Api, Resource};
use tokio_util::sync::CancellationToken;

use crate::context::Context;
use crate::crd::RealtimeRoute;
use crate::gateway_config::ADMIN_PORT;
use crate::live_status::{self, Scraped, StatusWrite, Tracker};
use decide::{candidates, plan, COST_ANNOTATION};

/// Period of a round (list, scrape, patch).
pub const SCRAPE_INTERVAL: Duration = Duration::from_secs(5);
/// Upper bound on cost patches per second, across all routes.
pub const MAX_PATCHES_PER_SECOND: u32 = 5;
/// Scrapes in flight at once.
const MAX_CONCURRENT_SCRAPES: usize = 16;
/// The gateway pods the operator manages (every route's).
pub const GATEWAY_POD_SELECTOR: &str =
    "app.kubernetes.io/name=patchbay-gateway,app.kubernetes.io/managed-by=patchbay-operator";

/// Run rounds until `stop`. `watch_namespace`: only that namespace's pods (else all).
pub async fn run(ctx: Arc<Context>, watch_namespace: Option<String>, stop: CancellationToken) {
    let pods: Api<Pod> = match &watch_namespace {
        Some(ns) => Api::namespaced(ctx.client.clone(), ns),
        None => Api::all(ctx.client.clone()),
    };
    let mut live = Tracker::default();
    let mut tick = tokio::time::interval(SCRAPE_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            _ = tick.tick() => {}
        }
        tokio::select! {
            () = stop.cancelled() => return,
            () = round(&ctx, &pods, &mut live) => {}
        }
    }
}

/// The admin port of a pod: its container port named `metrics`, else the gateway's default.
fn admin_port(pod: &Pod) -> u16 {
    pod.spec
        .iter()
        .flat_map(|s| s.containers.iter())
        .flat_map(|c| c.ports.iter().flatten())
        .find(|p| p.name.as_deref() == Some("metrics"))
        .and_then(|p| u16::try_from(p.container_port).ok())
        .unwrap_or(ADMIN_PORT)
}

/// The list of a round: the gateway pods, from the API server's cache (`resourceVersion=0`). A
/// round every few seconds needs no quorum read of every gateway pod in the cluster: a list a
/// moment stale misses at most a pod the next round finds, and the costs are hints.
fn round_list_params() -> ListParams {
    ListParams::default()
        .labels(GATEWAY_POD_SELECTOR)
        .match_any()
}

/// One round: list, scrape, patch the pods' costs, then the routes' live status.
pub async fn round(ctx: &Context, pods: &Api<Pod>, live: &mut Tracker) {
    let listed = match ctx
        .call("list", "Pod", "", pods.list(&round_list_params()))
        .await
    {
        Ok(list) => list.items,
        Err(error) => {
            tracing::warn!(%error, "cannot list gateway pods for their deletion cost");
            return;
        }
    };
    let ports: std::collections::HashMap<(String, String), u16> = listed
        .iter()
        .map(|p| {
            use kube::ResourceExt;
            (
                (p.namespace().unwrap_or_default(), p.name_any()),
                admin_port(p),
            )
        })
        .collect();
    let scraped: Vec<_> = futures::stream::iter(candidates(&listed))
        .map(|pod| {
            let port = ports
                .get(&(pod.namespace.clone(), pod.name.clone()))
                .copied()
                .unwrap_or(ADMIN_PORT);
            async move {
                let figures = match scrape::scrape(SocketAddr::new(pod.ip, port)).await {
                    Ok(figures) => {
                        ctx.metrics.deletion_cost_scrape("success");
                        Some(figures)
                    }
                    Err(error) => {
                        ctx.metrics.deletion_cost_scrape("failure");
                        tracing::debug!(pod = %pod.name, %error, "cannot scrape sessions");
                        None
                    }
                };
                (pod, figures)
            }
        })
        .buffer_unordered(MAX_CONCURRENT_SCRAPES)
        .collect::<Vec<_>>()
        .await;
    let writes = live.observe(
        tokio::time::Instant::now().into_std(),
        &crate::status::now_rfc3339(),
        &scraped
            .iter()
            .map(|(pod, figures)| Scraped {
                namespace: pod.namespace.clone(),
                route: pod.route.clone(),
                pod: pod.name.clone(),
                figures: figures.clone(),
            })
            .collect::<Vec<_>>(),
    );
    let scraped: Vec<_> = scraped
        .into_iter()
        .map(|(pod, figures)| (pod, figures.map(|f| f.sessions)))
        .collect();
    let budget = (MAX_PATCHES_PER_SECOND as u64 * SCRAPE_INTERVAL.as_secs()) as usize;
    let mut pace = tokio::time::interval(Duration::from_secs(1) / MAX_PATCHES_PER_SECOND);
    for patch in plan(&scraped, budget) {
        pace.tick().await;
        let api: Api<Pod> = Api::namespaced(ctx.client.clone(), &patch.namespace);
        let body = serde_json::json!({
            "metadata": {"annotations": {COST_ANNOTATION: patch.cost.to_string()}}
        });
        match ctx
            .call(
                "patch",
                "Pod",
                &patch.name,
                api.patch(&patch.name, &PatchParams::default(), &Patch::Merge(&body)),
            )
            .await
        {
            Ok(_) => {
                tracing::debug!(pod = %patch.name, cost = patch.cost, "pod deletion cost set")
            }
            Err(error) => {
                tracing::warn!(pod = %patch.name, %error, "cannot set the pod deletion cost")
            }
        }
    }
    for write in writes {
        write_live_status(ctx, live, &write).await;
    }
}

/// Apply one route's live figures to its status subresource, under the live status' own field
/// manager.
async fn write_live_status(ctx: &Context, live: &mut Tracker, write: &StatusWrite) {
    let api: Api<RealtimeRoute> = Api::namespaced(ctx.client.clone(), &write.namespace);
    let body = serde_json::json!({
        "apiVersion": RealtimeRoute::api_version(&()),
        "kind": RealtimeRoute::kind(&()),
        "status": write.figures,
    });
    let params = PatchParams::apply(live_status::FIELD_MANAGER).force();
    match ctx
        .call(
            "patch_status",
            "RealtimeRoute",
            &write.route,
            api.patch_status(&write.route, &params, &Patch::Apply(body)),
        )
        .await
    {
        Ok(_) => tracing::debug!(route = %write.route, "live status written"),
        Err(error) => {
            // Most often a route deleted since its pods were listed: start afresh next time.
            live.forget(&write.namespace, &write.route);
            tracing::debug!(route = %write.route, %error, "cannot write the live status");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_selector_names_the_gateway_pods_the_operator_manages() {
        assert!(GATEWAY_POD_SELECTOR.contains(&format!(
            "app.kubernetes.io/name={}",
            crate::build::APP_NAME
        )));
        assert!(GATEWAY_POD_SELECTOR.contains(crate::build::MANAGED_BY_SELECTOR));
    }

    #[tokio::test]
    async fn a_round_lists_the_gateway_pods_from_the_api_servers_cache() {
        let (ctx, mut server, _) = crate::fixtures::mock_context();
        let pods: Api<Pod> = Api::all(ctx.client.clone());
        let task = tokio::spawn(async move { round(&ctx, &pods, &mut Tracker::default()).await });
        let (seen, reply) = server.next().await;
        assert_eq!(
            seen.uri,
            "/api/v1/pods?&labelSelector=app.kubernetes.io%2Fname%3Dpatchbay-gateway%2C\
             app.kubernetes.io%2Fmanaged-by%3Dpatchbay-operator\
             &resourceVersion=0&resourceVersionMatch=NotOlderThan"
        );
        reply.ok(&serde_json::json!({
            "apiVersion": "v1", "kind": "PodList", "metadata": {}, "items": []
        }));
        task.await.unwrap();
        server.expect_silence().await;
    }

    #[test]
    fn the_admin_port_is_the_pods_metrics_port_else_the_default() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "spec": {"containers": [{"name": "gateway", "ports": [
                {"name": "http", "containerPort": 8080},
                {"name": "metrics", "containerPort": 19090}
            ]}]}
        }))
        .unwrap();
        assert_eq!(admin_port(&pod), 19090);
        assert_eq!(admin_port(&Pod::default()), ADMIN_PORT);
    }
}
