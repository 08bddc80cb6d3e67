//! Stage 3 of a reconcile: server-side apply of the desired children, in dependency order.
//!
//! ConfigMaps go first (the Deployment's pods mount them), then the pods' ServiceAccount, Role
//! and RoleBinding (they read the pool ConfigMap through it), then the Deployment, the Service, the
//! HPA (which scales the Deployment) and the PDB. Before the ConfigMaps, the Deployment is applied
//! as a dry run (`dryRun=All`: validated and admitted, not stored), so a pod template the API
//! server refuses (a bad `resources`, `tolerations`, `nodeSelector` or image value) stops the
//! reconcile before anything is written. Applied the other way round, `gateway.toml` would carry
//! the new restart settings while the pod template never rolls, and any pod that restarted would
//! run a config its siblings do not. Nor can the Deployment go first: its new pods would start on
//! the old ConfigMap and keep its restart settings. A child the API server refuses as invalid
//! (HTTP 400 or 422) is the spec's problem, not a transient one: [`refused_as_invalid`] turns it
//! into [`Error::InvalidSpec`] with the API server's message. Every apply uses field manager
//! `patchbay-operator` with `force`: the operator is the only writer of the fields it sets, and a
//! conflict with a stray manager should resolve in the route's favour. Fields it does not set
//! (`spec.replicas` under an HPA) stay with whoever owns them.
//!
//! Every child's name was claimed first ([`crate::ownership`]). A child that is no longer desired
//! (the HPA once `replicas.max == min`) is deleted, but only if the route controls it: a
//! same-named object someone else made is left alone.

use std::fmt::Debug;

use k8s_openapi::api::{
    apps::v1::Deployment,
    autoscaling::v2::HorizontalPodAutoscaler,
    core::v1::{ConfigMap, Service, ServiceAccount},
    policy::v1::PodDisruptionBudget,
    rbac::v1::{Role, RoleBinding},
};
use kube::api::{DeleteParams, Patch, PatchParams};
use kube::{Api, Resource, ResourceExt};
use serde::{de::DeserializeOwned, Serialize};

use crate::build::{gateway_name, Desired, MANAGER};
use crate::context::Context;
use crate::crd::RealtimeRoute;
use crate::error::{Error, Result};
use crate::ownership::{Claims, Holder};

/// HTTP codes with which the API server refuses an object as written: `BadRequest` and `Invalid`.
const REFUSED_AS_INVALID: [u16; 2] = [400, 422];

/// What applying changed beyond the objects themselves.
#[derive(Debug)]
pub struct Applied {
    /// The Deployment as the API server returned it.
    pub deployment: Deployment,
    /// An HPA the route no longer wants was deleted.
    pub hpa_deleted: bool,
}

/// The `PatchParams` of every apply.
pub fn apply_params() -> PatchParams {
    PatchParams::apply(MANAGER).force()
}

/// Server-side apply one object.
pub async fn apply_one<K>(ctx: &Context, api: &Api<K>, object: &K) -> Result<K>
where
    K: k8s_openapi::Resource
        + Resource<DynamicType = ()>
        + Clone
        + Debug
        + Serialize
        + DeserializeOwned,
{
    let name = object.name_any();
    ctx.call(
        "apply",
        K::KIND,
        &name,
        api.patch(&name, &apply_params(), &Patch::Apply(object)),
    )
    .await
    .map_err(refused_as_invalid)
}

/// An API error refusing the object as invalid (400, 422) becomes [`Error::InvalidSpec`] naming
/// the object, with the API server's message; every other error is returned as it is.
pub fn refused_as_invalid(error: Error) -> Error {
    if let Error::Api {
        kind, name, source, ..
    } = &error
    {
        if let kube::Error::Api(status) = &**source {
            if REFUSED_AS_INVALID.contains(&status.code) {
                return Error::InvalidSpec(format!(
                    "the API server refused {kind} {name}: {}",
                    status.message
                ));
            }
        }
    }
    error
}

/// Field manager that keeps `spec.replicas` while a fixed-count route becomes autoscaled.
pub const HANDOFF_MANAGER: &str = "patchbay-operator-handoff";

/// The replica count to hand off before an apply without `spec.replicas`: `Some` when the
/// desired Deployment leaves replicas to the HPA but the operator's own apply still owns the field
/// (the route was fixed-count until now). Applying without it would make server-side apply delete
/// the field, and the Deployment would fall back to 1 replica, killing live sessions, until the
/// HPA acted. The Kubernetes-documented hand-over: another manager applies the same value first,
/// so the field keeps an owner and its value.
pub fn replicas_to_hand_off(desired: &Deployment, before: Option<&Deployment>) -> Option<i32> {
    let wants_replicas = desired.spec.as_ref().and_then(|s| s.replicas).is_some();
    let before = before?;
    let current = before.spec.as_ref()?.replicas?;
    let we_own_replicas = before.managed_fields().iter().any(|m| {
        m.manager.as_deref() == Some(MANAGER)
            && m.operation.as_deref() == Some("Apply")
            && m.fields_v1.as_ref().is_some_and(|f| {
                f.0.get("f:spec")
                    .and_then(|s| s.get("f:replicas"))
                    .is_some()
            })
    });
    (!wants_replicas && we_own_replicas).then_some(current)
}

/// Apply every desired child of `route` in dependency order; delete the HPA when not desired.
/// `before` is the Deployment as observed at the start of the reconcile.
pub async fn apply_all(
    ctx: &Context,
    route: &RealtimeRoute,
    namespace: &str,
    desired: &Desired,
    before: Option<&Deployment>,
    claims: Claims,
) -> Result<Applied> {
    // No `..`: a new child kind must be applied here before this compiles.
    let Desired {
        gateway_config,
        pool_config,
        service_account,
        pool_reader_role,
        pool_reader_binding,
        deployment,
        service,
        hpa,
        pdb,
        // Applied after the rest by `exposure::sync`: without the Gateway API it is skipped.
        http_route: _,
        pool_size: _,
        config_hash: _,
    } = desired;
    let client = ctx.client.clone();
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), namespace);
    let name = deployment.name_any();
    ctx.call(
        "dry_run_apply",
        "Deployment",
        &name,
        deployments.patch(&name, &apply_params().dry_run(), &Patch::Apply(deployment)),
    )
    .await
    .map_err(refused_as_invalid)?;
    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
    apply_one(ctx, &config_maps, gateway_config).await?;
    apply_one(ctx, &config_maps, pool_config).await?;
    // The pods' account exists before a pod names it; its grant before a pod watches.
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), namespace);
    apply_one(ctx, &accounts, service_account).await?;
    let roles: Api<Role> = Api::namespaced(client.clone(), namespace);
    apply_one(ctx, &roles, pool_reader_role).await?;
    let bindings: Api<RoleBinding> = Api::namespaced(client.clone(), namespace);
    apply_one(ctx, &bindings, pool_reader_binding).await?;
    if let Some(replicas) = replicas_to_hand_off(deployment, before) {
        let handoff = serde_json::json!({
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": name},
            "spec": {"replicas": replicas},
        });
        ctx.call(
            "apply",
            "Deployment",
            &name,
            deployments.patch(
                &name,
                &PatchParams::apply(HANDOFF_MANAGER),
                &Patch::Apply(&handoff),
            ),
        )
        .await
        .map_err(refused_as_invalid)?;
    }
    let deployment = apply_one(ctx, &deployments, deployment).await?;
    let services: Api<Service> = Api::namespaced(client.clone(), namespace);
    apply_one(ctx, &services, service).await?;
    let hpas: Api<HorizontalPodAutoscaler> = Api::namespaced(client.clone(), namespace);
    let hpa_deleted = match hpa {
        Some(hpa) => {
            apply_one(ctx, &hpas, hpa).await?;
            false
        }
        None => delete_if_owned(ctx, &hpas, &gateway_name(route), claims.hpa).await?,
    };
    let pdbs: Api<PodDisruptionBudget> = Api::namespaced(client, namespace);
    apply_one(ctx, &pdbs, pdb).await?;
    Ok(Applied {
        deployment,
        hpa_deleted,
    })
}

/// Delete `name` if `holder` (as [`crate::ownership::claim_children`] found it) is the route.
/// Returns whether it was deleted.
pub async fn delete_if_owned<K>(
    ctx: &Context,
    api: &Api<K>,
    name: &str,
    holder: Holder,
) -> Result<bool>
where
    K: k8s_openapi::Resource + Resource<DynamicType = ()> + Clone + Debug + DeserializeOwned,
{
    let kind = K::KIND;
    if holder != Holder::Route {
        return Ok(false);
    }
    match ctx
        .call(
            "delete",
            kind,
            name,
            api.delete(name, &DeleteParams::background()),
        )
        .await
    {
        Ok(_) => Ok(true),
        // Gone between the get and the delete: the outcome wanted.
        Err(Error::Api { source, .. }) if matches!(&*source, kube::Error::Api(s) if s.is_not_found()) => {
            Ok(false)
        }
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::apps::v1::DeploymentSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
        FieldsV1, ManagedFieldsEntry, ObjectMeta,
    };

    fn deployment(replicas: Option<i32>, owners: &[(&str, &str, serde_json::Value)]) -> Deployment {
        Deployment {
            metadata: ObjectMeta {
                managed_fields: Some(
                    owners
                        .iter()
                        .map(|(manager, op, fields)| ManagedFieldsEntry {
                            manager: Some(manager.to_string()),
                            operation: Some(op.to_string()),
                            fields_v1: Some(FieldsV1(fields.clone())),
                            ..ManagedFieldsEntry::default()
                        })
                        .collect(),
                ),
                ..ObjectMeta::default()
            },
            spec: Some(DeploymentSpec {
                replicas,
                ..DeploymentSpec::default()
            }),
            ..Deployment::default()
        }
    }

    fn api_error(code: u16) -> Error {
        Error::Api {
            verb: "apply",
            kind: "Deployment",
            name: "voice-gateway".into(),
            source: Box::new(kube::Error::Api(Box::new(kube::core::Status {
                code,
                message: format!("refused with {code}"),
                ..kube::core::Status::default()
            }))),
        }
    }

    #[test]
    fn an_apply_refused_as_invalid_is_the_specs_problem_and_any_other_error_is_not() {
        for code in [400, 422] {
            let error = refused_as_invalid(api_error(code));
            assert_eq!(error.reason(), "InvalidSpec", "{code}");
            assert!(error.is_user_error());
            assert_eq!(
                error.to_string(),
                format!(
                    "invalid spec: the API server refused Deployment voice-gateway: refused with {code}"
                )
            );
        }
        for code in [403, 404, 409, 500, 503] {
            let error = refused_as_invalid(api_error(code));
            assert_eq!(error.reason(), "ApiError", "{code}");
            assert!(!error.is_user_error());
        }
    }

    #[test]
    fn replicas_are_handed_off_only_when_our_apply_owned_them_and_no_longer_sets_them() {
        let ours = (
            "patchbay-operator",
            "Apply",
            serde_json::json!({"f:spec": {"f:replicas": {}}}),
        );
        let hpa = (
            "kube-controller-manager",
            "Update",
            serde_json::json!({"f:spec": {"f:replicas": {}}}),
        );
        let autoscaled = deployment(None, &[]);
        let fixed = deployment(Some(3), &[]);
        // Fixed → autoscaled: hand the current count off.
        assert_eq!(
            replicas_to_hand_off(
                &autoscaled,
                Some(&deployment(Some(4), std::slice::from_ref(&ours)))
            ),
            Some(4)
        );
        // Already autoscaled (the HPA owns the field): nothing to do.
        assert_eq!(
            replicas_to_hand_off(&autoscaled, Some(&deployment(Some(6), &[hpa]))),
            None
        );
        // Still fixed: the apply sets replicas itself.
        assert_eq!(
            replicas_to_hand_off(&fixed, Some(&deployment(Some(4), &[ours]))),
            None
        );
        // Nothing exists yet.
        assert_eq!(replicas_to_hand_off(&autoscaled, None), None);
    }
}
