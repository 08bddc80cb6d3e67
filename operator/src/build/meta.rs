//! Names, labels and metadata every child of a route shares: the objects'
//! names (`<name>-gateway`, `<name>-pool`, `<name>`), the pod selector, the
//! `app.kubernetes.io/*` labels and the controller owner reference.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::{Resource, ResourceExt};

use crate::crd::RealtimeRoute;

/// Field manager of every apply, and the value of `app.kubernetes.io/managed-by`.
pub const MANAGER: &str = "patchbay-operator";
/// `app.kubernetes.io/name` of the gateway pods and their objects.
pub const APP_NAME: &str = "patchbay-gateway";
/// `app.kubernetes.io/managed-by=patchbay-operator`: the label selector of the operator's watches.
pub const MANAGED_BY_SELECTOR: &str = "app.kubernetes.io/managed-by=patchbay-operator";

/// `<name>-gateway`: the gateway ConfigMap, Deployment, HPA and PDB.
pub fn gateway_name(route: &RealtimeRoute) -> String {
    format!("{}-gateway", route.name_any())
}

/// `<name>-pool`: the pool size ConfigMap.
pub fn pool_name(route: &RealtimeRoute) -> String {
    format!("{}-pool", route.name_any())
}

/// `<name>`: the Service.
pub fn service_name(route: &RealtimeRoute) -> String {
    route.name_any()
}

/// In-cluster WebSocket endpoint of a route: the gateway's path for the route's endpoint
/// (`/v1/realtime`, `/v1/realtime/translations`, `/v1/live/sessions`).
pub fn endpoint(route: &RealtimeRoute) -> String {
    format!(
        "ws://{}.{}.svc:{}{}",
        service_name(route),
        route.namespace().unwrap_or_default(),
        crate::gateway_config::HTTP_PORT,
        route.spec.endpoint.openai_path()
    )
}

/// The labels that select a route's gateway pods.
pub fn selector_labels(route: &RealtimeRoute) -> BTreeMap<String, String> {
    BTreeMap::from([
        ("app.kubernetes.io/name".to_string(), APP_NAME.to_string()),
        ("app.kubernetes.io/instance".to_string(), route.name_any()),
    ])
}

/// The labels of every child object (and the gateway pods).
pub fn labels(route: &RealtimeRoute) -> BTreeMap<String, String> {
    let mut labels = selector_labels(route);
    labels.extend([
        (
            "app.kubernetes.io/component".to_string(),
            "gateway".to_string(),
        ),
        (
            "app.kubernetes.io/part-of".to_string(),
            "patchbay".to_string(),
        ),
        (
            "app.kubernetes.io/managed-by".to_string(),
            MANAGER.to_string(),
        ),
    ]);
    labels
}

/// Metadata of a child: name, namespace, labels and the controller owner reference.
pub fn child_meta(route: &RealtimeRoute, name: String) -> ObjectMeta {
    ObjectMeta {
        name: Some(name),
        namespace: route.namespace(),
        labels: Some(labels(route)),
        owner_references: route.controller_owner_ref(&()).map(|o| vec![o]),
        ..ObjectMeta::default()
    }
}
