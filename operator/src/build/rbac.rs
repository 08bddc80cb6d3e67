//! The gateway pods' own API access: ServiceAccount `<name>-gateway`, bound by RoleBinding
//! `<name>-gateway-pool` to Role `<name>-gateway-pool`, which allows `get`, `list` and `watch`
//! on one object: the route's pool ConfigMap `<name>-pool` (`resourceNames`; a list or watch is
//! authorised only with a `metadata.name` field selector for it).
//!
//! Why the pods get any access at all: the pool ConfigMap reaches a mounted volume only at the
//! kubelet's next sync (60–90 s), so after a scale event every running pod would keep a pool
//! sized for the old replica count for that long. Watching the one ConfigMap through the API
//! server brings the new size in well under a second. The grant reveals nothing the pods do not
//! already mount (one number), writes nothing, and the operator can grant only what it holds
//! itself (RBAC's escalation check), which already includes reading ConfigMaps. The mounted file
//! stays the durable source: a pod that cannot reach the API server keeps its size and learns the
//! new one at the kubelet's sync.

use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::{PolicyRule, Role, RoleBinding, RoleRef, Subject};

use super::meta::{child_meta, gateway_name, pool_name};
use crate::crd::RealtimeRoute;

/// `<name>-gateway-pool`: the Role and its RoleBinding.
pub fn pool_reader_name(route: &RealtimeRoute) -> String {
    format!("{}-pool", gateway_name(route))
}

/// The gateway pods' ServiceAccount, `<name>-gateway`.
pub fn service_account(route: &RealtimeRoute) -> ServiceAccount {
    ServiceAccount {
        metadata: child_meta(route, gateway_name(route)),
        ..ServiceAccount::default()
    }
}

/// Read access to the pool ConfigMap, and nothing else.
pub fn pool_reader_role(route: &RealtimeRoute) -> Role {
    Role {
        metadata: child_meta(route, pool_reader_name(route)),
        rules: Some(vec![PolicyRule {
            api_groups: Some(vec![String::new()]),
            resources: Some(vec!["configmaps".into()]),
            resource_names: Some(vec![pool_name(route)]),
            verbs: vec!["get".into(), "list".into(), "watch".into()],
            ..PolicyRule::default()
        }]),
    }
}

/// Binds [`pool_reader_role`] to [`service_account`].
pub fn pool_reader_binding(route: &RealtimeRoute) -> RoleBinding {
    let namespace = child_meta(route, String::new()).namespace;
    RoleBinding {
        metadata: child_meta(route, pool_reader_name(route)),
        role_ref: RoleRef {
            api_group: "rbac.authorization.k8s.io".into(),
            kind: "Role".into(),
            name: pool_reader_name(route),
        },
        subjects: Some(vec![Subject {
            kind: "ServiceAccount".into(),
            name: gateway_name(route),
            namespace,
            ..Subject::default()
        }]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures;

    #[test]
    fn the_pods_may_read_their_pool_config_map_and_nothing_else() {
        let route = fixtures::route(fixtures::minimal_spec());
        let role = pool_reader_role(&route);
        let rules = role.rules.unwrap();
        assert_eq!(rules.len(), 1);
        assert_eq!(rules[0].api_groups, Some(vec![String::new()]));
        assert_eq!(rules[0].resources, Some(vec!["configmaps".to_string()]));
        assert_eq!(
            rules[0].resource_names,
            Some(vec![format!("{}-pool", fixtures::ROUTE_NAME)])
        );
        assert_eq!(rules[0].verbs, ["get", "list", "watch"]);
        let binding = pool_reader_binding(&route);
        assert_eq!(binding.role_ref.kind, "Role");
        assert_eq!(binding.role_ref.name, role.metadata.name.unwrap());
        let subject = &binding.subjects.unwrap()[0];
        assert_eq!(
            (subject.kind.as_str(), subject.name.as_str()),
            (
                "ServiceAccount",
                service_account(&route).metadata.name.as_deref().unwrap()
            )
        );
        assert_eq!(subject.namespace.as_deref(), Some(fixtures::NAMESPACE));
    }
}
