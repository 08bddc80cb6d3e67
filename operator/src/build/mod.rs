//! The desired child objects of a route, built by pure functions.
//!
//! Each child kind has its own builder; [`desired`] calls them all and returns a [`Desired`] that
//! the apply stage destructures field by field (no `..`), so a new kind does not compile until it
//! is applied. Builders take the route, the operator's defaults and what was observed (the
//! Deployment's replica count) and return complete objects ready for server-side apply: the
//! `apiVersion`/`kind` come from the types, every object carries the route's owner reference and
//! the `app.kubernetes.io/*` labels.

mod configmap;
mod deployment;
mod hpa;
mod httproute;
mod meta;
mod pdb;
mod rbac;
mod service;

use k8s_openapi::api::{
    apps::v1::Deployment,
    autoscaling::v2::HorizontalPodAutoscaler,
    core::v1::{ConfigMap, Service, ServiceAccount},
    policy::v1::PodDisruptionBudget,
    rbac::v1::{Role, RoleBinding},
};

pub use configmap::{config_hash, gateway_config_map, pool_config_map};
pub use deployment::{deployment, termination_grace_period_seconds, CONFIG_HASH_ANNOTATION};
pub use hpa::{hpa, SESSIONS_ACTIVE_METRIC};
pub use httproute::{
    gateway_resource, http_route, http_route_name, http_route_resource, EXPOSED_PATHS,
    GATEWAY_API_GROUP, GATEWAY_API_VERSION,
};
pub use meta::{
    child_meta, endpoint, gateway_name, labels, pool_name, selector_labels, service_name, APP_NAME,
    MANAGED_BY_SELECTOR, MANAGER,
};
pub use pdb::pdb;
pub use rbac::{pool_reader_binding, pool_reader_name, pool_reader_role, service_account};
pub use service::service;

use crate::crd::RealtimeRoute;

/// What the builders need besides the route.
#[derive(Clone, Debug)]
pub struct BuildInput<'a> {
    pub route: &'a RealtimeRoute,
    /// Image used when the route does not name one.
    pub default_image: &'a str,
    /// The replica count to size pools for, once the Deployment exists.
    pub observed_replicas: Option<i32>,
}

/// Every child object a route should have, in apply order.
#[derive(Clone, Debug, PartialEq)]
pub struct Desired {
    pub gateway_config: ConfigMap,
    pub pool_config: ConfigMap,
    /// The pods' ServiceAccount and its read access to the pool ConfigMap.
    pub service_account: ServiceAccount,
    pub pool_reader_role: Role,
    pub pool_reader_binding: RoleBinding,
    pub deployment: Deployment,
    pub service: Service,
    /// `None` when the replica count is fixed: an existing HPA is then deleted.
    pub hpa: Option<HorizontalPodAutoscaler>,
    pub pdb: PodDisruptionBudget,
    /// The Gateway API `HTTPRoute` of `spec.expose`; `None`: an owned one is deleted.
    pub http_route: Option<kube::api::DynamicObject>,
    /// The per-pod pool size written to the pool ConfigMap.
    pub pool_size: i32,
    /// Hash of the gateway config, also on the pod template.
    pub config_hash: String,
}

/// Build every desired child of a route. The route must carry a name, namespace and uid (as any
/// route read from the API server does).
pub fn desired(input: &BuildInput<'_>) -> Desired {
    let gateway_config = gateway_config_map(input.route);
    let config_hash = config_hash(&gateway_config);
    let (pool_config, pool_size) = pool_config_map(input.route, input.observed_replicas);
    Desired {
        deployment: deployment(input.route, input.default_image, &config_hash),
        service: service(input.route),
        hpa: hpa(input.route),
        pdb: pdb(input.route),
        service_account: service_account(input.route),
        pool_reader_role: pool_reader_role(input.route),
        pool_reader_binding: pool_reader_binding(input.route),
        http_route: http_route(input.route),
        gateway_config,
        pool_config,
        pool_size,
        config_hash,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn all_metas(d: &Desired) -> Vec<&ObjectMeta> {
        let mut metas = vec![
            &d.gateway_config.metadata,
            &d.pool_config.metadata,
            &d.service_account.metadata,
            &d.pool_reader_role.metadata,
            &d.pool_reader_binding.metadata,
            &d.deployment.metadata,
            &d.service.metadata,
            &d.pdb.metadata,
        ];
        if let Some(hpa) = &d.hpa {
            metas.push(&hpa.metadata);
        }
        metas
    }

    fn build(route: &RealtimeRoute, observed_replicas: Option<i32>) -> Desired {
        desired(&BuildInput {
            route,
            default_image: "img",
            observed_replicas,
        })
    }

    #[test]
    fn every_child_is_owned_by_the_route_and_labelled() {
        let route = fixtures::route(fixtures::autoscaled_spec());
        let d = build(&route, None);
        assert!(d.hpa.is_some());
        for meta in all_metas(&d) {
            let owner = &meta.owner_references.as_ref().unwrap()[0];
            assert_eq!(owner.kind, "RealtimeRoute");
            assert_eq!(owner.api_version, "patchbay.dev/v1alpha1");
            assert_eq!(owner.name, fixtures::ROUTE_NAME);
            assert_eq!(owner.uid, fixtures::ROUTE_UID);
            assert_eq!(owner.controller, Some(true));
            assert_eq!(meta.namespace.as_deref(), Some(fixtures::NAMESPACE));
            let labels = meta.labels.as_ref().unwrap();
            assert_eq!(labels["app.kubernetes.io/managed-by"], MANAGER);
            assert_eq!(labels["app.kubernetes.io/instance"], fixtures::ROUTE_NAME);
        }
    }

    #[test]
    fn the_keys_a_route_may_not_set_on_its_pods_are_exactly_the_operators() {
        use crate::crd::{OPERATOR_ANNOTATION_PREFIX, OPERATOR_POD_LABELS, POD_LABELS_RULE};
        let route = fixtures::route(fixtures::minimal_spec());
        let mut reserved = OPERATOR_POD_LABELS.map(String::from).to_vec();
        reserved.sort();
        assert_eq!(labels(&route).into_keys().collect::<Vec<_>>(), reserved);
        for key in OPERATOR_POD_LABELS {
            assert!(POD_LABELS_RULE.contains(&format!("'{key}'")), "{key}");
        }
        assert!(CONFIG_HASH_ANNOTATION.starts_with(OPERATOR_ANNOTATION_PREFIX));
    }

    #[test]
    fn children_are_named_after_the_route() {
        let route = fixtures::route(fixtures::autoscaled_spec());
        let d = build(&route, None);
        let name = fixtures::ROUTE_NAME;
        assert_eq!(
            d.gateway_config.metadata.name,
            Some(format!("{name}-gateway"))
        );
        assert_eq!(d.pool_config.metadata.name, Some(format!("{name}-pool")));
        assert_eq!(d.deployment.metadata.name, Some(format!("{name}-gateway")));
        assert_eq!(d.service.metadata.name, Some(name.to_string()));
        assert_eq!(
            d.hpa.unwrap().metadata.name,
            Some(format!("{name}-gateway"))
        );
        assert_eq!(d.pdb.metadata.name, Some(format!("{name}-gateway")));
        assert_eq!(
            endpoint(&route),
            format!("ws://{name}.{}.svc:8080/v1/realtime", fixtures::NAMESPACE)
        );
    }

    #[test]
    fn a_translations_route_is_reached_at_the_translation_path() {
        let mut spec = fixtures::minimal_spec();
        spec.endpoint = crate::crd::Endpoint::Translations;
        let route = fixtures::route(spec);
        assert_eq!(
            endpoint(&route),
            format!(
                "ws://{}.{}.svc:8080/v1/realtime/translations",
                fixtures::ROUTE_NAME,
                fixtures::NAMESPACE
            )
        );
    }

    #[test]
    fn a_replica_change_changes_the_pool_config_map_and_nothing_else() {
        let route = fixtures::route(fixtures::autoscaled_spec());
        let at = |observed| build(&route, observed);
        let (before, after) = (at(Some(2)), at(Some(5)));
        assert_ne!(before.pool_config, after.pool_config);
        assert_ne!(before.pool_size, after.pool_size);
        assert_eq!(before.deployment, after.deployment);
        assert_eq!(
            before.deployment.spec.as_ref().unwrap().template,
            after.deployment.spec.as_ref().unwrap().template
        );
        assert_eq!(before.config_hash, after.config_hash);
        assert_eq!(before.gateway_config, after.gateway_config);
        assert_eq!(before.service, after.service);
        assert_eq!(before.hpa, after.hpa);
        assert_eq!(before.pdb, after.pdb);
    }

    /// A named edit of a route's spec.
    type Edit = (&'static str, fn(&mut crate::crd::RealtimeRouteSpec));

    fn template(d: &Desired) -> &k8s_openapi::api::core::v1::PodTemplateSpec {
        &d.deployment.spec.as_ref().unwrap().template
    }

    #[test]
    fn a_restart_setting_change_changes_the_pod_template_hash() {
        let build = |spec| build(&fixtures::route(spec), Some(2));
        let before = build(fixtures::full_spec());
        let hash = |d: &Desired| {
            template(d)
                .metadata
                .as_ref()
                .unwrap()
                .annotations
                .as_ref()
                .unwrap()[CONFIG_HASH_ANNOTATION]
                .clone()
        };
        assert_eq!(hash(&before), before.config_hash);
        let edits: [Edit; 5] = [
            ("upstream url", |s| {
                fixtures::single(s).url = Some("wss://eu.api.openai.com/v1/realtime".into())
            }),
            ("upstream model", |s| {
                fixtures::single(s).model = Some("gpt-realtime-mini".into())
            }),
            ("protocol", |s| {
                fixtures::single(s).protocol = crate::crd::Protocol::Beta
            }),
            ("pool idle", |s| s.pool.max_idle_seconds += 1),
            ("drain wait", |s| s.drain.wait_seconds += 5),
        ];
        for (what, edit) in edits {
            let mut spec = fixtures::full_spec();
            edit(&mut spec);
            let after = build(spec);
            assert_ne!(before.config_hash, after.config_hash, "{what}");
            assert_eq!(hash(&after), after.config_hash, "{what}");
            assert_ne!(template(&before), template(&after), "{what}");
        }
    }

    #[test]
    fn a_live_setting_change_changes_the_config_map_and_never_the_pod_template() {
        let build = |spec| build(&fixtures::route(spec), Some(2));
        let before = build(fixtures::full_spec());
        let edits: [Edit; 3] = [
            ("prices", |s| s.metering.prices[0].audio_output *= 2.0),
            ("flushSeconds", |s| s.metering.flush_seconds = 3),
            ("unpriced", |s| {
                s.metering.unpriced = crate::crd::Unpriced::Allow
            }),
        ];
        for (what, edit) in edits {
            let mut spec = fixtures::full_spec();
            edit(&mut spec);
            let after = build(spec);
            assert_ne!(before.gateway_config, after.gateway_config, "{what}");
            assert_eq!(before.config_hash, after.config_hash, "{what}");
            assert_eq!(before.deployment, after.deployment, "{what}");
        }
    }
}
