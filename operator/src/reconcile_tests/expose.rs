//! Reconcile tests of `spec.expose` against the mocked API server: the HTTPRoute's claim, the
//! Gateway API discovery, its apply, its parents' verdicts and Gateway addresses in the status,
//! and its deletion when the route stops asking.

use super::*;
use crate::crd::{Expose, ExposureStatus, ParentRef};

const GWAPI: &str = "/apis/gateway.networking.k8s.io/v1";

fn http_route_path() -> String {
    format!("{GWAPI}/namespaces/{NAMESPACE}/httproutes/{ROUTE_NAME}")
}

fn exposed_route() -> RealtimeRoute {
    let mut spec = fixtures::minimal_spec();
    spec.expose = Some(Expose {
        parent_refs: vec![ParentRef {
            name: "public".into(),
            section_name: Some("https".into()),
            ..ParentRef::default()
        }],
        hostnames: vec!["voice.example.com".into()],
        path_prefix: None,
        timeout_seconds: 3600,
    });
    fixtures::route(spec)
}

/// A ready, rolled-out single-pod Deployment as the reconcile's first read returns it.
async fn running(server: &mut ApiServer, route: &RealtimeRoute) {
    let built = desired(route, Some(1));
    let d = deployment_response(&serde_json::to_value(&built.deployment).unwrap(), 1, 1);
    observe(server, Some(&d), &route.spec).await;
}

/// Answer the writes of a running route through the PDB (one ready pod).
async fn applied_through_pdb(server: &mut ApiServer) {
    expect_applied_through_deployment(server, 1, 1).await;
    expect_service_and_pdb(server).await;
}

/// The claim of the HTTPRoute's name: `answer` when it exists; else a 404 as the API server
/// gives it, for a missing object (`installed`) or for a resource it does not serve at all.
async fn expect_http_route_claim(server: &mut ApiServer, answer: Option<Value>, installed: bool) {
    let (_, reply) = server.expect(Method::GET, &http_route_path()).await;
    match (answer, installed) {
        (Some(meta), _) => reply.ok(&meta),
        (None, true) => reply.not_found("httproute"),
        (None, false) => reply.page_not_found(),
    }
}

async fn expect_discovery(server: &mut ApiServer, served: bool) {
    let (_, reply) = server.expect(Method::GET, GWAPI).await;
    if served {
        reply.ok(&json!({
            "kind": "APIResourceList", "apiVersion": "v1", "groupVersion": "gateway.networking.k8s.io/v1",
            "resources": [
                {"name": "gateways", "singularName": "gateway", "namespaced": true, "kind": "Gateway", "verbs": ["get"]},
                {"name": "httproutes", "singularName": "httproute", "namespaced": true, "kind": "HTTPRoute", "verbs": ["get"]}
            ]
        }));
    } else {
        reply.page_not_found();
    }
}

#[tokio::test]
async fn without_the_gateway_api_the_route_is_degraded_and_everything_else_reconciled() {
    let (ctx, mut server, _) = fixtures::mock_context();
    let route = exposed_route();
    let task = tokio::spawn(reconcile(Arc::new(route.clone()), ctx));
    running(&mut server, &route).await;
    // The CRD is absent: the name claim's plain-text 404 counts as a free name.
    expect_http_route_claim(&mut server, None, false).await;
    applied_through_pdb(&mut server).await;
    expect_discovery(&mut server, false).await;
    let (seen, reply) = server.expect(Method::PATCH, &status_path()).await;
    let status = &seen.body["status"];
    assert_eq!(condition(status, "Degraded")["status"], "True");
    assert_eq!(
        condition(status, "Degraded")["reason"],
        "GatewayAPIUnavailable"
    );
    assert!(condition(status, "Degraded")["message"]
        .as_str()
        .unwrap()
        .contains("gateway.networking.k8s.io/v1"));
    assert_eq!(condition(status, "Exposed")["status"], "False");
    assert_eq!(condition(status, "Ready")["status"], "True");
    assert!(status.get("exposure").is_none());
    reply.ok(&patched(&route, &seen.body));
    let action = task.await.unwrap().expect("reconcile succeeds");
    assert_eq!(action, Action::requeue(NOT_READY_RESYNC_INTERVAL));
    server.expect_silence().await;
}

#[tokio::test]
async fn an_exposed_route_applies_its_http_route_and_reports_its_parents_and_urls() {
    let (ctx, mut server, _) = fixtures::mock_context();
    let route = exposed_route();
    let task = tokio::spawn(reconcile(Arc::new(route.clone()), ctx));
    running(&mut server, &route).await;
    expect_http_route_claim(&mut server, None, true).await;
    applied_through_pdb(&mut server).await;
    expect_discovery(&mut server, true).await;
    let (seen, reply) = server
        .expect(Method::PATCH, &format!("{}{APPLY}", http_route_path()))
        .await;
    assert_eq!(seen.body["apiVersion"], "gateway.networking.k8s.io/v1");
    assert_eq!(seen.body["kind"], "HTTPRoute");
    assert_owned(&seen.body);
    assert_eq!(
        seen.body["spec"]["parentRefs"],
        json!([{"name": "public", "sectionName": "https"}])
    );
    assert_eq!(
        seen.body["spec"]["rules"][0]["backendRefs"][0]["name"],
        ROUTE_NAME
    );
    let mut answered = seen.body.clone();
    answered["status"] = json!({"parents": [{
        "parentRef": {"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": "public", "sectionName": "https"},
        "controllerName": "example.com/gateway",
        "conditions": [
            {"type": "Accepted", "status": "True", "reason": "Accepted"},
            {"type": "ResolvedRefs", "status": "True", "reason": "ResolvedRefs"}
        ]
    }]});
    reply.ok(&answered);
    let (_, reply) = server
        .expect(
            Method::GET,
            &format!("{GWAPI}/namespaces/{NAMESPACE}/gateways/public"),
        )
        .await;
    reply.ok(&json!({
        "apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway",
        "metadata": {"name": "public", "namespace": NAMESPACE},
        "spec": {"gatewayClassName": "x", "listeners": [
            {"name": "https", "port": 443, "protocol": "HTTPS"},
            {"name": "web", "port": 80, "protocol": "HTTP"}
        ]},
        "status": {"addresses": [{"type": "IPAddress", "value": "203.0.113.7"}]}
    }));
    let (seen, reply) = server.expect(Method::PATCH, &status_path()).await;
    let status = &seen.body["status"];
    assert_eq!(condition(status, "Exposed")["status"], "True");
    assert_eq!(condition(status, "Degraded")["status"], "False");
    assert_eq!(
        status["exposure"],
        json!({
            "httpRoute": ROUTE_NAME,
            "parents": [{"parent": format!("{NAMESPACE}/public/https"), "accepted": "True", "resolvedRefs": "True"}],
            "urls": ["wss://voice.example.com/v1/realtime"],
        })
    );
    reply.ok(&patched(&route, &seen.body));
    let action = task.await.unwrap().expect("reconcile succeeds");
    assert_eq!(action, Action::requeue(RESYNC_INTERVAL));
    server.expect_silence().await;
}

#[tokio::test]
async fn a_foreign_http_route_of_the_routes_name_is_refused_before_anything_is_applied() {
    let (ctx, mut server, _) = fixtures::mock_context();
    let route = Arc::new(exposed_route());
    let task = tokio::spawn(reconcile(route.clone(), ctx));
    observe(&mut server, None, &route.spec).await;
    expect_http_route_claim(&mut server, Some(metadata(ROUTE_NAME, None)), true).await;
    assert_eq!(
        server.expect_event().await,
        ("Warning".into(), "NameTaken".into())
    );
    let degraded = expect_degraded(&mut server, &route, &status_path(), "NameTaken").await;
    assert!(degraded["message"]
        .as_str()
        .unwrap()
        .contains(&format!("HTTPRoute {NAMESPACE}/{ROUTE_NAME} exists")));
    assert_eq!(task.await.unwrap().unwrap_err().reason(), "NameTaken");
    server.expect_silence().await;
}

#[tokio::test]
async fn a_route_that_stops_asking_deletes_its_http_route() {
    let (ctx, mut server, _) = fixtures::mock_context();
    let mut route = fixtures::route(fixtures::minimal_spec());
    route.status = Some(crate::crd::RealtimeRouteStatus {
        exposure: Some(ExposureStatus {
            http_route: ROUTE_NAME.into(),
            ..ExposureStatus::default()
        }),
        ..crate::crd::RealtimeRouteStatus::default()
    });
    let task = tokio::spawn(reconcile(Arc::new(route.clone()), ctx));
    running(&mut server, &route).await;
    expect_http_route_claim(
        &mut server,
        Some(metadata(ROUTE_NAME, Some(ROUTE_UID))),
        true,
    )
    .await;
    applied_through_pdb(&mut server).await;
    let (_, reply) = server
        .expect(Method::DELETE, &format!("{}?", http_route_path()))
        .await;
    reply.ok(&json!({"kind": "Status", "apiVersion": "v1", "status": "Success"}));
    let (seen, reply) = server.expect(Method::PATCH, &status_path()).await;
    assert!(seen.body["status"].get("exposure").is_none());
    assert!(seen.body["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .all(|c| c["type"] != "Exposed"));
    reply.ok(&patched(&route, &seen.body));
    task.await.unwrap().expect("reconcile succeeds");
    server.expect_silence().await;
}

#[tokio::test]
async fn a_route_never_exposed_reads_no_http_route() {
    // The claim of the HTTPRoute's name is made only while the route is or was exposed: an
    // ordinary route's reconcile is unchanged (the sequences of the other tests).
    let (ctx, mut server, _) = fixtures::mock_context();
    let route = fixtures::route(fixtures::minimal_spec());
    let task = tokio::spawn(reconcile(Arc::new(route.clone()), ctx));
    running(&mut server, &route).await;
    applied_through_pdb(&mut server).await;
    let (seen, reply) = server.expect(Method::PATCH, &status_path()).await;
    reply.ok(&patched(&route, &seen.body));
    task.await.unwrap().expect("reconcile succeeds");
    server.expect_silence().await;
}
