//! `HTTPRoute` `<name>` (`gateway.networking.k8s.io/v1`), when the route asks for Gateway API
//! exposure (`spec.expose`).
//!
//! One rule per OpenAI path family the gateway serves, each to the Service's `http` port:
//! `/v1/realtime` (WebSocket sessions, client secrets, calls, translations), `/v1/live` (GPT-Live)
//! and their Azure-style `/openai/v1/...` twins. `PathPrefix` matches whole path segments, so
//! `/v1/realtime` also takes `/v1/realtime/calls/{id}/hangup` and never `/v1/realtimex`. With
//! `expose.pathPrefix` each family is matched under the prefix and rewritten back to its bare
//! path (`URLRewrite` with `ReplacePrefixMatch`, core in the standard channel), since the gateway
//! serves OpenAI's paths only. Every rule carries `timeouts.request` and
//! `timeouts.backendRequest` of `expose.timeoutSeconds`: a WebSocket session is one request, and
//! implementations' defaults (15 s in some) would cut every session.
//!
//! The Gateway API types are not in `k8s-openapi`, so the object is a [`DynamicObject`] built from
//! JSON; its shape is pinned by the tests below and, in the e2e suite, by the standard-channel
//! CRDs' own schema.

use kube::api::{ApiResource, DynamicObject, GroupVersionKind};
use serde_json::{json, Value};

use super::meta::{child_meta, service_name};
use crate::crd::{Expose, ParentRef, RealtimeRoute};
use crate::gateway_config::HTTP_PORT;

/// API group of the Gateway API.
pub const GATEWAY_API_GROUP: &str = "gateway.networking.k8s.io";
/// The Gateway API version the operator writes and reads (standard channel, v1.0 and later).
pub const GATEWAY_API_VERSION: &str = "v1";

/// The path families the gateway serves, as OpenAI and Azure spell them.
pub const EXPOSED_PATHS: [&str; 4] = [
    "/v1/realtime",
    "/v1/live",
    "/openai/v1/realtime",
    "/openai/v1/live",
];

/// The `HTTPRoute` resource, for [`kube::Api::namespaced_with`].
pub fn http_route_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(GATEWAY_API_GROUP, GATEWAY_API_VERSION, "HTTPRoute"),
        "httproutes",
    )
}

/// The `Gateway` resource.
pub fn gateway_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(GATEWAY_API_GROUP, GATEWAY_API_VERSION, "Gateway"),
        "gateways",
    )
}

/// Name of the route's `HTTPRoute`: the route's own, like its Service.
pub fn http_route_name(route: &RealtimeRoute) -> String {
    service_name(route)
}

/// A Gateway API `ParentReference` as JSON: only the fields the route set (the API server
/// defaults the rest).
fn parent_ref(p: &ParentRef) -> Value {
    let mut v = json!({"name": p.name});
    let fields = [
        ("group", p.group.clone().map(Value::from)),
        ("kind", p.kind.clone().map(Value::from)),
        ("namespace", p.namespace.clone().map(Value::from)),
        ("sectionName", p.section_name.clone().map(Value::from)),
        ("port", p.port.map(Value::from)),
    ];
    for (key, value) in fields {
        if let Some(value) = value {
            v[key] = value;
        }
    }
    v
}

/// A Gateway API `Duration` of whole seconds.
fn duration(seconds: i32) -> String {
    format!("{seconds}s")
}

/// The rules: one per path family under a prefix (each needs its own rewrite), or one rule
/// matching every family without.
fn rules(route: &RealtimeRoute, expose: &Expose) -> Vec<Value> {
    let backend = json!([{
        "kind": "Service",
        "name": service_name(route),
        "port": HTTP_PORT,
    }]);
    let timeouts = json!({
        "request": duration(expose.timeout_seconds),
        "backendRequest": duration(expose.timeout_seconds),
    });
    let matching = |path: String| json!({"path": {"type": "PathPrefix", "value": path}});
    match &expose.path_prefix {
        None => vec![json!({
            "matches": EXPOSED_PATHS.map(|p| matching(p.to_string())),
            "backendRefs": backend,
            "timeouts": timeouts,
        })],
        Some(prefix) => EXPOSED_PATHS
            .map(|p| {
                json!({
                    "matches": [matching(format!("{prefix}{p}"))],
                    "filters": [{
                        "type": "URLRewrite",
                        "urlRewrite": {"path": {"type": "ReplacePrefixMatch", "replacePrefixMatch": p}},
                    }],
                    "backendRefs": backend,
                    "timeouts": timeouts,
                })
            })
            .to_vec(),
    }
}

/// The route's `HTTPRoute`, or `None` when it asks for no exposure.
pub fn http_route(route: &RealtimeRoute) -> Option<DynamicObject> {
    let expose = route.spec.expose.as_ref()?;
    let resource = http_route_resource();
    let mut spec = json!({
        "parentRefs": expose.parent_refs.iter().map(parent_ref).collect::<Vec<_>>(),
        "rules": rules(route, expose),
    });
    if !expose.hostnames.is_empty() {
        spec["hostnames"] = json!(expose.hostnames);
    }
    let mut object =
        DynamicObject::new(&http_route_name(route), &resource).data(json!({ "spec": spec }));
    object.metadata = child_meta(route, http_route_name(route));
    Some(object)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures;

    fn exposed(expose: Expose) -> RealtimeRoute {
        let mut spec = fixtures::minimal_spec();
        spec.expose = Some(expose);
        fixtures::route(spec)
    }

    fn expose() -> Expose {
        Expose {
            parent_refs: vec![ParentRef {
                name: "public".into(),
                namespace: Some("edge".into()),
                section_name: Some("https".into()),
                ..ParentRef::default()
            }],
            hostnames: vec!["voice.example.com".into()],
            path_prefix: None,
            timeout_seconds: crate::crd::DEFAULT_EXPOSE_TIMEOUT_SECONDS,
        }
    }

    #[test]
    fn no_exposure_no_http_route() {
        assert!(http_route(&fixtures::route(fixtures::minimal_spec())).is_none());
    }

    #[test]
    fn the_http_route_sends_every_openai_path_to_the_services_http_port() {
        let route = exposed(expose());
        let object = http_route(&route).unwrap();
        let types = object.types.as_ref().unwrap();
        assert_eq!(types.api_version, "gateway.networking.k8s.io/v1");
        assert_eq!(types.kind, "HTTPRoute");
        assert_eq!(object.metadata.name.as_deref(), Some(fixtures::ROUTE_NAME));
        assert_eq!(
            object.metadata.namespace.as_deref(),
            Some(fixtures::NAMESPACE)
        );
        let owner = &object.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!(
            (owner.kind.as_str(), owner.controller),
            ("RealtimeRoute", Some(true))
        );
        assert_eq!(
            object.data["spec"],
            json!({
                "parentRefs": [{"name": "public", "namespace": "edge", "sectionName": "https"}],
                "hostnames": ["voice.example.com"],
                "rules": [{
                    "matches": [
                        {"path": {"type": "PathPrefix", "value": "/v1/realtime"}},
                        {"path": {"type": "PathPrefix", "value": "/v1/live"}},
                        {"path": {"type": "PathPrefix", "value": "/openai/v1/realtime"}},
                        {"path": {"type": "PathPrefix", "value": "/openai/v1/live"}},
                    ],
                    "backendRefs": [{"kind": "Service", "name": fixtures::ROUTE_NAME, "port": 8080}],
                    "timeouts": {"request": "3600s", "backendRequest": "3600s"},
                }],
            })
        );
    }

    #[test]
    fn under_a_prefix_each_family_is_rewritten_to_its_bare_path() {
        let route = exposed(Expose {
            path_prefix: Some("/voice".into()),
            hostnames: vec![],
            timeout_seconds: 0,
            ..expose()
        });
        let object = http_route(&route).unwrap();
        let rules = object.data["spec"]["rules"].as_array().unwrap();
        assert_eq!(rules.len(), EXPOSED_PATHS.len());
        assert!(object.data["spec"].get("hostnames").is_none());
        for (rule, bare) in rules.iter().zip(EXPOSED_PATHS) {
            assert_eq!(
                rule["matches"],
                json!([{"path": {"type": "PathPrefix", "value": format!("/voice{bare}")}}])
            );
            assert_eq!(
                rule["filters"],
                json!([{"type": "URLRewrite", "urlRewrite": {"path": {
                    "type": "ReplacePrefixMatch", "replacePrefixMatch": bare}}}])
            );
            assert_eq!(
                rule["timeouts"],
                json!({"request": "0s", "backendRequest": "0s"})
            );
        }
    }
}
