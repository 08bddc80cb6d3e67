//! Who holds each child's name: the one place a route claims its children.
//!
//! A forced server-side apply takes over any object of the same name, and the owner reference it
//! adds makes the garbage collector delete that object with the route. So before anything is
//! applied, [`claim_children`] reads every child's metadata (the Deployment comes from the read
//! the reconcile already made) and refuses with [`Error::NameTaken`], naming the object, when one
//! exists that the route does not control. Only objects the route is the *controller* of count as
//! its own; a merely listed owner reference does not.
//!
//! The HPA is the one child that may legitimately be someone else's: a fixed-count route wants no
//! HPA, so a foreign `<name>-gateway` HPA is then left alone (and never deleted), and refused only
//! when the route wants to apply its own.

use std::fmt::Debug;

use k8s_openapi::api::{
    apps::v1::Deployment,
    autoscaling::v2::HorizontalPodAutoscaler,
    core::v1::{ConfigMap, Service, ServiceAccount},
    policy::v1::PodDisruptionBudget,
    rbac::v1::{Role, RoleBinding},
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::{Api, Resource, ResourceExt};
use serde::de::DeserializeOwned;

use crate::build::{gateway_name, pool_name, pool_reader_name, service_name};
use crate::context::Context;
use crate::crd::RealtimeRoute;
use crate::error::{Error, Result};

/// Who holds an object's name: nobody yet, the route (as its controller), or someone else.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Holder {
    Nobody,
    Route,
    Other,
}

/// Who holds an existing object with these owner references (pure).
pub fn holder_of(owners: &[OwnerReference], route_uid: Option<&str>) -> Holder {
    let controlled = route_uid.is_some_and(|uid| {
        owners
            .iter()
            .any(|o| o.controller == Some(true) && o.uid == uid)
    });
    if controlled {
        Holder::Route
    } else {
        Holder::Other
    }
}

/// Reads `name`'s metadata only and tells who holds it.
pub async fn holder<K>(
    ctx: &Context,
    api: &Api<K>,
    name: &str,
    route: &RealtimeRoute,
) -> Result<Holder>
where
    K: k8s_openapi::Resource + Resource<DynamicType = ()> + Clone + Debug + DeserializeOwned,
{
    let existing = ctx
        .call("get", K::KIND, name, api.get_metadata_opt(name))
        .await?;
    Ok(match existing {
        None => Holder::Nobody,
        Some(meta) => holder_of(meta.owner_references(), route.uid().as_deref()),
    })
}

/// What [`claim_children`] found that the apply stage needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Claims {
    /// Who holds `<name>-gateway` among HPAs (deleted only when the route does).
    pub hpa: Holder,
}

/// Refuse a taken name (pure): `Ok` when nobody or the route holds it.
pub fn refuse_taken(kind: &'static str, namespace: &str, name: &str, holder: Holder) -> Result<()> {
    match holder {
        Holder::Nobody | Holder::Route => Ok(()),
        Holder::Other => Err(Error::NameTaken {
            kind,
            namespace: namespace.to_string(),
            name: name.to_string(),
        }),
    }
}

/// Check every child's name before anything is applied; see the module doc. `deployment` is the
/// Deployment as read at the start of the reconcile. `wants_hpa`: the route applies an HPA.
pub async fn claim_children(
    ctx: &Context,
    route: &RealtimeRoute,
    namespace: &str,
    deployment: Option<&Deployment>,
    wants_hpa: bool,
) -> Result<Claims> {
    let client = &ctx.client;
    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
    let services: Api<Service> = Api::namespaced(client.clone(), namespace);
    let hpas: Api<HorizontalPodAutoscaler> = Api::namespaced(client.clone(), namespace);
    let pdbs: Api<PodDisruptionBudget> = Api::namespaced(client.clone(), namespace);
    let gateway = gateway_name(route);
    let uid = route.uid();

    let deployment_holder = match deployment {
        None => Holder::Nobody,
        Some(d) => holder_of(d.owner_references(), uid.as_deref()),
    };
    refuse_taken("Deployment", namespace, &gateway, deployment_holder)?;
    for name in [gateway.clone(), pool_name(route)] {
        let found = holder(ctx, &config_maps, &name, route).await?;
        refuse_taken("ConfigMap", namespace, &name, found)?;
    }
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), namespace);
    let found = holder(ctx, &accounts, &gateway, route).await?;
    refuse_taken("ServiceAccount", namespace, &gateway, found)?;
    let reader = pool_reader_name(route);
    let roles: Api<Role> = Api::namespaced(client.clone(), namespace);
    refuse_taken(
        "Role",
        namespace,
        &reader,
        holder(ctx, &roles, &reader, route).await?,
    )?;
    let bindings: Api<RoleBinding> = Api::namespaced(client.clone(), namespace);
    let found = holder(ctx, &bindings, &reader, route).await?;
    refuse_taken("RoleBinding", namespace, &reader, found)?;
    let service = service_name(route);
    refuse_taken(
        "Service",
        namespace,
        &service,
        holder(ctx, &services, &service, route).await?,
    )?;
    let hpa = holder(ctx, &hpas, &gateway, route).await?;
    if wants_hpa {
        refuse_taken("HorizontalPodAutoscaler", namespace, &gateway, hpa)?;
    }
    refuse_taken(
        "PodDisruptionBudget",
        namespace,
        &gateway,
        holder(ctx, &pdbs, &gateway, route).await?,
    )?;
    Ok(Claims { hpa })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owner(uid: &str, controller: Option<bool>) -> OwnerReference {
        OwnerReference {
            api_version: "patchbay.dev/v1alpha1".into(),
            kind: "RealtimeRoute".into(),
            name: "voice".into(),
            uid: uid.into(),
            controller,
            ..OwnerReference::default()
        }
    }

    #[test]
    fn only_the_routes_controller_reference_makes_an_object_the_routes() {
        let uid = Some("u1");
        assert_eq!(holder_of(&[owner("u1", Some(true))], uid), Holder::Route);
        assert_eq!(
            holder_of(&[owner("u2", Some(true)), owner("u1", Some(true))], uid),
            Holder::Route
        );
        assert_eq!(holder_of(&[], uid), Holder::Other);
        assert_eq!(holder_of(&[owner("u1", None)], uid), Holder::Other);
        assert_eq!(holder_of(&[owner("u1", Some(false))], uid), Holder::Other);
        assert_eq!(holder_of(&[owner("u2", Some(true))], uid), Holder::Other);
        assert_eq!(holder_of(&[owner("u1", Some(true))], None), Holder::Other);
    }

    #[test]
    fn a_taken_name_is_refused_naming_the_object() {
        refuse_taken("ConfigMap", "ns", "voice-pool", Holder::Nobody).unwrap();
        refuse_taken("ConfigMap", "ns", "voice-pool", Holder::Route).unwrap();
        let err = refuse_taken("ConfigMap", "ns", "voice-pool", Holder::Other).unwrap_err();
        assert_eq!(err.reason(), "NameTaken");
        assert!(err
            .to_string()
            .starts_with("ConfigMap ns/voice-pool exists"));
    }
}
