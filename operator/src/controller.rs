//! The RealtimeRoute controller: a staged reconcile and the watch wiring.
//!
//! A reconcile runs four stages (the shape of Stackable's operators):
//!
//! 1. **validate**: the spec is servable ([`crate::validate`]), and no child's name is held by an
//!    object the route does not control ([`crate::ownership`]);
//! 2. **build**: every desired child, by pure functions ([`crate::build`]);
//! 3. **apply**: server-side apply in dependency order, stale children deleted ([`crate::apply`]),
//!    then the Gateway API `HTTPRoute` when the route asks for one ([`crate::exposure`]);
//! 4. **status**: observed generation, counts, endpoint, conditions ([`crate::status`]); when the
//!    Deployment is short of ready pods, why, from the pods' events ([`crate::pods`]).
//!
//! Bad input is a condition, not a crash loop: an unservable spec, a taken name, or a child the API
//! server refuses as invalid (found by a dry run of the Deployment before anything is written,
//! see [`crate::apply`]) sets `Degraded` with the reason, publishes a warning event, leaves the
//! existing children as they are and returns the error, so [`error_policy`] counts it and retries
//! with exponential backoff. The operator cannot read Secrets: a missing one shows as pods that do
//! not start (`Degraded=True/PodsNotStarting`), rechecked every [`NOT_READY_RESYNC_INTERVAL`].
//! Looking into the pods is diagnosis, not reconciliation: when it fails, the reconcile goes on
//! with what the status last said.
//!
//! A route being deleted (`metadata.deletionTimestamp` set, as during a foreground or orphaning
//! delete) is left to the garbage collector: applying its children again would re-add the owner
//! references the collector is removing, or re-create children it just deleted.
//!
//! The controller watches routes and, through `.owns()`, every child kind (only objects labelled
//! `app.kubernetes.io/managed-by=patchbay-operator`), so a Deployment scaled by its HPA triggers a
//! reconcile that resizes the pool ConfigMap. Every route is also re-reconciled every
//! [`RESYNC_INTERVAL`] to repair drift.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::{
    apps::v1::Deployment,
    autoscaling::v2::HorizontalPodAutoscaler,
    core::v1::{ConfigMap, Service},
    policy::v1::PodDisruptionBudget,
};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::{Api, Client, Resource, ResourceExt};

use crate::build::{self, gateway_name, BuildInput, MANAGED_BY_SELECTOR};
use crate::context::Context;
use crate::crd::RealtimeRoute;
use crate::error::{Error, Result};
use crate::status::{self, Observation};
use crate::{apply, events, exposure, ownership, pods, validate};

/// Period of the drift-repairing re-reconcile of a healthy route.
pub const RESYNC_INTERVAL: Duration = Duration::from_secs(300);
/// Period of the re-reconcile while the route's Deployment is short of ready pods.
pub const NOT_READY_RESYNC_INTERVAL: Duration = Duration::from_secs(30);

/// Reconcile one route.
pub async fn reconcile(route: Arc<RealtimeRoute>, ctx: Arc<Context>) -> Result<Action> {
    let _timer = ctx.metrics.reconcile_started();
    let namespace = route.namespace().ok_or(Error::MissingNamespace)?;
    let name = route.name_any();
    if route.metadata.deletion_timestamp.is_some() {
        tracing::debug!(route = %name, %namespace, "being deleted; its children are the garbage collector's");
        return Ok(Action::await_change());
    }
    tracing::debug!(route = %name, %namespace, "reconciling");

    // Observe: the Deployment's replica count sizes the pool, its template hash tells whether the
    // config changed.
    let deployments: Api<Deployment> = Api::namespaced(ctx.client.clone(), &namespace);
    let deployment_name = gateway_name(&route);
    let before = ctx
        .call(
            "get",
            "Deployment",
            &deployment_name,
            deployments.get_opt(&deployment_name),
        )
        .await?;

    // 1. validate, and claim every child's name
    let checked = async {
        validate::check_route(&route)?;
        let wants_hpa = route.spec.replicas.autoscaled();
        let claims =
            ownership::claim_children(&ctx, &route, &namespace, before.as_ref(), wants_hpa).await?;
        // The HTTPRoute's name is looked at only while the route is or was exposed.
        let was_exposed = route.status.as_ref().is_some_and(|s| s.exposure.is_some());
        let http_route = if route.spec.expose.is_some() || was_exposed {
            exposure::claim(&ctx, &route, &namespace).await?
        } else {
            ownership::Holder::Nobody
        };
        if route.spec.expose.is_some() {
            let name = build::http_route_name(&route);
            ownership::refuse_taken("HTTPRoute", &namespace, &name, http_route)?;
        }
        Ok((claims, http_route))
    };
    let (claims, http_route_holder) = match checked.await {
        Ok(claims) => claims,
        Err(problem) => return refuse(&ctx, &route, &namespace, before.as_ref(), problem).await,
    };

    // 2. build
    let observed_replicas = before.as_ref().and_then(replicas_to_size_for);
    let desired = build::desired(&BuildInput {
        route: &route,
        default_image: &ctx.gateway_image,
        observed_replicas,
    });

    // 3. apply
    let applied =
        match apply::apply_all(&ctx, &route, &namespace, &desired, before.as_ref(), claims).await {
            Ok(applied) => applied,
            Err(problem) => {
                return refuse(&ctx, &route, &namespace, before.as_ref(), problem).await;
            }
        };

    // Gateway API exposure, after the rest: without the Gateway API the route still serves.
    let exposure = match exposure::sync(
        &ctx,
        &route,
        &namespace,
        desired.http_route.as_ref(),
        http_route_holder,
    )
    .await
    {
        Ok(exposure) => exposure,
        Err(problem) => return refuse(&ctx, &route, &namespace, before.as_ref(), problem).await,
    };

    // Pods short of ready: say why, if the kubelet did (a missing Secret, an unpullable image, a
    // crash loop, no node to run on).
    let short = pods::short_of_ready(&applied.deployment);
    let pods_not_starting = if short {
        pods::diagnose(&ctx, &route, &namespace).await
    } else {
        None
    };
    let changes = events::changes(
        &route,
        before.as_ref(),
        &desired,
        applied.hpa_deleted,
        pods_not_starting.as_deref(),
    );
    for change in &changes {
        tracing::info!(route = %name, %namespace, reason = change.reason, "{}", change.note);
    }
    events::publish(&ctx, &route, &changes).await;

    // 4. status
    let seen = Observation {
        deployment: Some(&applied.deployment),
        pool_size: Some(desired.pool_size),
        problem: None,
        pods_not_starting: pods_not_starting.as_deref(),
        exposure: Some(&exposure),
    };
    let status = status::compute(&route, &seen, &status::now_rfc3339());
    status::patch(&ctx, &route, &namespace, &status).await?;

    ctx.reset_backoff(&ObjectRef::from_obj(&*route));
    // Pods and Gateway API objects are not watched: look again soon while some pods are not
    // ready or a parent Gateway has not accepted the route.
    let exposure_pending = route.spec.expose.is_some() && !exposure.accepted();
    Ok(Action::requeue(if short || exposure_pending {
        NOT_READY_RESYNC_INTERVAL
    } else {
        RESYNC_INTERVAL
    }))
}

/// End a reconcile that `problem` stopped. A user error (an unservable spec, a taken name, a child
/// the API server refused) is logged, published as a warning event and written to the status as
/// `Degraded`, observed against `before` (the Deployment as it was: nothing of this spec was
/// applied); a transient error is only returned. Either way [`error_policy`] retries.
async fn refuse(
    ctx: &Context,
    route: &RealtimeRoute,
    namespace: &str,
    before: Option<&Deployment>,
    problem: Error,
) -> Result<Action> {
    if problem.is_user_error() {
        let name = route.name_any();
        tracing::warn!(route = %name, %namespace, reason = problem.reason(), "{problem}");
        events::publish(ctx, route, &[events::problem(&problem)]).await;
        let seen = Observation {
            deployment: before,
            pool_size: None,
            problem: Some(&problem),
            pods_not_starting: None,
            exposure: None,
        };
        let status = status::compute(route, &seen, &status::now_rfc3339());
        status::patch(ctx, route, namespace, &status).await?;
    }
    Err(problem)
}

/// Count the failure by reason and retry the route with exponential backoff.
pub fn error_policy(route: Arc<RealtimeRoute>, error: &Error, ctx: Arc<Context>) -> Action {
    ctx.metrics.reconcile_failed(error.reason());
    let delay = ctx.next_backoff(ObjectRef::from_obj(&*route));
    tracing::warn!(
        route = %route.name_any(),
        namespace = route.namespace().unwrap_or_default(),
        reason = error.reason(),
        retry_in = ?delay,
        "reconcile failed: {error}"
    );
    Action::requeue(delay)
}

fn scoped<K>(client: &Client, namespace: Option<&str>) -> Api<K>
where
    K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>,
{
    match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    }
}

/// Run the controller until `shutdown` resolves, then finish in-flight reconciles and return.
///
/// `watch_namespace` limits every watch to one namespace; `None` watches all namespaces.
pub async fn run(
    ctx: Arc<Context>,
    watch_namespace: Option<String>,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) {
    let client = ctx.client.clone();
    let watch_namespace = watch_namespace.as_deref();
    let owned = || watcher::Config::default().labels(MANAGED_BY_SELECTOR);
    let routes: Api<RealtimeRoute> = scoped(&client, watch_namespace);
    Controller::new(routes, watcher::Config::default())
        .owns(scoped::<ConfigMap>(&client, watch_namespace), owned())
        .owns(scoped::<Deployment>(&client, watch_namespace), owned())
        .owns(scoped::<Service>(&client, watch_namespace), owned())
        .owns(
            scoped::<HorizontalPodAutoscaler>(&client, watch_namespace),
            owned(),
        )
        .owns(
            scoped::<PodDisruptionBudget>(&client, watch_namespace),
            owned(),
        )
        .graceful_shutdown_on(shutdown)
        .run(reconcile, error_policy, ctx)
        .for_each(|result| async move {
            match result {
                Ok((route, _)) => tracing::debug!(%route, "reconciled"),
                // Already counted and logged by error_policy.
                Err(kube::runtime::controller::Error::ReconcilerFailed(..)) => {}
                Err(error) => tracing::warn!(%error, "controller"),
            }
        })
        .await;
}

/// Fail fast with a useful message when the CRD is not installed or not readable.
pub async fn check_crd_installed(client: &Client, watch_namespace: Option<&str>) -> Result<()> {
    let routes: Api<RealtimeRoute> = scoped(client, watch_namespace);
    routes
        .list_metadata(&kube::api::ListParams::default().limit(1))
        .await
        .map(|_| ())
        .map_err(|source| Error::Api {
            verb: "list",
            kind: "RealtimeRoute",
            name: String::new(),
            source: Box::new(source),
        })
}

/// The replica count the pools are sized for: the Deployment's desired count
/// (the HPA's choice, or the route's fixed count), not `status.replicas`,
/// which also counts the surge pods of a rollout and would shrink every
/// pool, then grow it back, on each one.
fn replicas_to_size_for(d: &Deployment) -> Option<i32> {
    d.spec
        .as_ref()
        .and_then(|s| s.replicas)
        .or_else(|| d.status.as_ref().and_then(|s| s.replicas))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::apps::v1::{DeploymentSpec, DeploymentStatus};

    #[test]
    fn pools_are_sized_for_the_desired_replicas_not_the_surge() {
        let rolling = Deployment {
            spec: Some(DeploymentSpec {
                replicas: Some(4),
                ..DeploymentSpec::default()
            }),
            status: Some(DeploymentStatus {
                replicas: Some(5),
                ..DeploymentStatus::default()
            }),
            ..Deployment::default()
        };
        assert_eq!(replicas_to_size_for(&rolling), Some(4));
        let no_spec_count = Deployment {
            status: Some(DeploymentStatus {
                replicas: Some(3),
                ..DeploymentStatus::default()
            }),
            ..Deployment::default()
        };
        assert_eq!(replicas_to_size_for(&no_spec_count), Some(3));
    }
}
