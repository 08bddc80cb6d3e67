//! Reconcile tests against a mocked API server: every request the reconciler makes is asserted,
//! in order, with its method, path (including `fieldManager` and `force`) and body.

use std::sync::Arc;
use std::time::Duration;

use http::{Method, StatusCode};
use kube::runtime::controller::Action;
use serde_json::{json, Value};

use crate::controller::{error_policy, reconcile, NOT_READY_RESYNC_INTERVAL, RESYNC_INTERVAL};
use crate::crd::{RealtimeRoute, RealtimeRouteSpec};
use crate::fixtures::{self, ApiServer, NAMESPACE, ROUTE_NAME, ROUTE_UID};
use crate::metrics;

const APPLY: &str = "?&force=true&fieldManager=patchbay-operator";
const DRY_RUN_APPLY: &str = "?&dryRun=All&force=true&fieldManager=patchbay-operator";
/// A list served from the API server's cache.
const ANY_VERSION: &str = "&resourceVersion=0&resourceVersionMatch=NotOlderThan";

fn core(kind: &str, name: &str) -> String {
    format!("/api/v1/namespaces/{NAMESPACE}/{kind}/{name}")
}

fn apps(name: &str) -> String {
    format!("/apis/apps/v1/namespaces/{NAMESPACE}/deployments/{name}")
}

fn rbac_path(kind: &str, name: &str) -> String {
    format!("/apis/rbac.authorization.k8s.io/v1/namespaces/{NAMESPACE}/{kind}/{name}")
}

fn hpa_path(name: &str) -> String {
    format!("/apis/autoscaling/v2/namespaces/{NAMESPACE}/horizontalpodautoscalers/{name}")
}

fn pdb_path(name: &str) -> String {
    format!("/apis/policy/v1/namespaces/{NAMESPACE}/poddisruptionbudgets/{name}")
}

fn status_path() -> String {
    format!(
        "/apis/patchbay.dev/v1alpha1/namespaces/{NAMESPACE}/realtimeroutes/{ROUTE_NAME}/status{APPLY}"
    )
}

fn gw() -> String {
    format!("{ROUTE_NAME}-gateway")
}

/// The children `route` should have, built with the mocked context's default image and pools
/// sized for `observed_replicas`.
fn desired(route: &RealtimeRoute, observed_replicas: Option<i32>) -> crate::build::Desired {
    crate::build::desired(&crate::build::BuildInput {
        route,
        default_image: "patchbay/gateway:test",
        observed_replicas,
    })
}

/// A Deployment as the API server returns it after an apply, with a status.
fn deployment_response(applied: &Value, replicas: i32, ready: i32) -> Value {
    let mut d = applied.clone();
    d["metadata"]["generation"] = json!(1);
    // What the API server holds: the HPA's (or the route's) count.
    d["spec"]["replicas"] = json!(replicas);
    d["status"] = json!({
        "observedGeneration": 1,
        "replicas": replicas,
        "updatedReplicas": replicas,
        "readyReplicas": ready,
        "availableReplicas": ready
    });
    d
}

/// Answer the Deployment read, then the name claims with every other child absent.
async fn observe(server: &mut ApiServer, deployment: Option<&Value>, spec: &RealtimeRouteSpec) {
    observe_with_hpa(server, deployment, spec, None).await;
}

/// [`observe`], with the HPA `<name>-gateway` answered as `hpa` (metadata) when given.
async fn observe_with_hpa(
    server: &mut ApiServer,
    deployment: Option<&Value>,
    spec: &RealtimeRouteSpec,
    hpa: Option<Value>,
) {
    let (_, reply) = server.expect(Method::GET, &apps(&gw())).await;
    match deployment {
        Some(d) => reply.ok(d),
        None => reply.not_found("deployment"),
    }
    // No Secret is read: the spec only names them.
    let _ = spec;
    // Every child's name is free (the Deployment was judged from the read above).
    for path in [
        core("configmaps", &gw()),
        core("configmaps", &format!("{ROUTE_NAME}-pool")),
        core("serviceaccounts", &gw()),
        rbac_path("roles", &format!("{}-pool", gw())),
        rbac_path("rolebindings", &format!("{}-pool", gw())),
        core("services", ROUTE_NAME),
    ] {
        let (_, reply) = server.expect(Method::GET, &path).await;
        reply.not_found("child");
    }
    let (_, reply) = server.expect(Method::GET, &hpa_path(&gw())).await;
    match hpa {
        Some(meta) => reply.ok(&meta),
        None => reply.not_found("hpa"),
    }
    let (_, reply) = server.expect(Method::GET, &pdb_path(&gw())).await;
    reply.not_found("pdb");
}

/// The list of the route's gateway pods, served from the API server's cache.
fn pods_uri() -> String {
    format!(
        "/api/v1/namespaces/{NAMESPACE}/pods?&labelSelector=app.kubernetes.io%2Finstance%3D{ROUTE_NAME}%2Capp.kubernetes.io%2Fname%3Dpatchbay-gateway{ANY_VERSION}"
    )
}

/// Answer the list of the route's gateway pods with `pods`.
async fn expect_pods(server: &mut ApiServer, pods: &[Value]) {
    let (_, reply) = server.expect(Method::GET, &pods_uri()).await;
    reply.ok(&json!({"apiVersion": "v1", "kind": "PodList", "metadata": {}, "items": pods}));
}

/// Answer the list of the namespace's pod events with `list`.
async fn expect_pod_events(server: &mut ApiServer, list: &Value) {
    let (_, reply) = server
        .expect(
            Method::GET,
            &format!(
                "/api/v1/namespaces/{NAMESPACE}/events?&fieldSelector=involvedObject.kind%3DPod{ANY_VERSION}"
            ),
        )
        .await;
    reply.ok(list);
}

/// Answer the dry run of the Deployment's apply, which comes before any write, by echoing it;
/// returns the body.
async fn expect_dry_run(server: &mut ApiServer) -> Value {
    let (seen, reply) = server
        .expect(Method::PATCH, &format!("{}{DRY_RUN_APPLY}", apps(&gw())))
        .await;
    reply.ok(&seen.body);
    seen.body
}

/// Metadata of an object named `name`, controlled by `owner_uid` when given.
fn metadata(name: &str, owner_uid: Option<&str>) -> Value {
    let mut meta = json!({
        "apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata",
        "metadata": {"name": name, "namespace": NAMESPACE}
    });
    if let Some(uid) = owner_uid {
        meta["metadata"]["ownerReferences"] = json!([{
            "apiVersion": "patchbay.dev/v1alpha1", "kind": "RealtimeRoute",
            "name": ROUTE_NAME, "uid": uid, "controller": true
        }]);
    }
    meta
}

/// Answer the status patch of a reconcile that failed for `reason`; returns the `Degraded`
/// condition it set.
async fn expect_degraded(
    server: &mut ApiServer,
    route: &RealtimeRoute,
    path: &str,
    reason: &str,
) -> Value {
    let (seen, reply) = server.expect(Method::PATCH, path).await;
    let degraded = condition(&seen.body["status"], "Degraded").clone();
    assert_eq!(degraded["status"], "True");
    assert_eq!(degraded["reason"], reason);
    reply.ok(&patched(route, &seen.body));
    degraded
}

/// Answer one server-side apply on `path`, echoing the body; returns the body.
async fn expect_apply(server: &mut ApiServer, path: &str) -> Value {
    let (seen, reply) = server
        .expect(Method::PATCH, &format!("{path}{APPLY}"))
        .await;
    reply.ok(&seen.body);
    seen.body
}

/// Answer the applies of the gateway ConfigMap, then of the pool ConfigMap, by echoing them;
/// returns their bodies.
async fn expect_config_maps(server: &mut ApiServer) -> (Value, Value) {
    let config = expect_apply(server, &core("configmaps", &gw())).await;
    let pool = expect_apply(server, &core("configmaps", &format!("{ROUTE_NAME}-pool"))).await;
    // The pods' account and its read access to the pool ConfigMap, before the Deployment.
    let account = expect_apply(server, &core("serviceaccounts", &gw())).await;
    assert_owned(&account);
    let role = expect_apply(server, &rbac_path("roles", &format!("{}-pool", gw()))).await;
    assert_eq!(
        role["rules"],
        json!([{"apiGroups": [""], "resources": ["configmaps"],
                "resourceNames": [format!("{ROUTE_NAME}-pool")], "verbs": ["get", "list", "watch"]}])
    );
    let binding = expect_apply(
        server,
        &rbac_path("rolebindings", &format!("{}-pool", gw())),
    )
    .await;
    assert_eq!(binding["subjects"][0]["name"], gw());
    (config, pool)
}

/// What a reconcile applied up to and including the Deployment.
struct Applied {
    /// The Deployment of the dry run.
    dry_run: Value,
    config: Value,
    pool: Value,
    deployment: Value,
}

/// Answer the writes of an admitted spec up to the Deployment: its dry run, the ConfigMaps, then
/// its apply, answered as a Deployment of `replicas` pods, `ready` of them ready.
async fn expect_applied_through_deployment(
    server: &mut ApiServer,
    replicas: i32,
    ready: i32,
) -> Applied {
    let dry_run = expect_dry_run(server).await;
    let (config, pool) = expect_config_maps(server).await;
    let (seen, reply) = server
        .expect(Method::PATCH, &format!("{}{APPLY}", apps(&gw())))
        .await;
    reply.ok(&deployment_response(&seen.body, replicas, ready));
    Applied {
        dry_run,
        config,
        pool,
        deployment: seen.body,
    }
}

/// Answer the applies that follow the Deployment's for a fixed replica count: the Service, then
/// the PDB, echoing them; returns their bodies.
async fn expect_service_and_pdb(server: &mut ApiServer) -> [Value; 2] {
    [
        expect_apply(server, &core("services", ROUTE_NAME)).await,
        expect_apply(server, &pdb_path(&gw())).await,
    ]
}

/// Answer the applies that follow the Deployment's for an autoscaled route: the Service, the
/// HPA, then the PDB, echoing them; returns their bodies.
async fn expect_service_hpa_and_pdb(server: &mut ApiServer) -> [Value; 3] {
    [
        expect_apply(server, &core("services", ROUTE_NAME)).await,
        expect_apply(server, &hpa_path(&gw())).await,
        expect_apply(server, &pdb_path(&gw())).await,
    ]
}

/// The route as the API server returns it after a status patch.
fn patched(route: &RealtimeRoute, status_patch: &Value) -> Value {
    let mut body = serde_json::to_value(route).unwrap();
    body["status"] = status_patch["status"].clone();
    body
}

fn assert_owned(body: &Value) {
    let owner = &body["metadata"]["ownerReferences"][0];
    assert_eq!(owner["kind"], "RealtimeRoute");
    assert_eq!(owner["uid"], ROUTE_UID);
    assert_eq!(owner["controller"], true);
}

fn condition<'a>(status: &'a Value, type_: &str) -> &'a Value {
    status["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == type_)
        .unwrap()
}

#[tokio::test]
async fn a_new_autoscaled_route_applies_every_child_in_dependency_order_then_its_status() {
    let (ctx, mut server, _) = fixtures::mock_context();
    let route = fixtures::route(fixtures::autoscaled_spec());
    let task = tokio::spawn(reconcile(Arc::new(route.clone()), ctx));

    observe(&mut server, None, &route.spec).await;
    // Nothing is written before the API server has admitted the Deployment.
    let Applied {
        dry_run,
        config,
        pool,
        deployment,
    } = expect_applied_through_deployment(&mut server, 2, 0).await;

    assert_eq!(config["apiVersion"], "v1");
    assert_eq!(config["kind"], "ConfigMap");
    assert!(config["data"]["gateway.toml"]
        .as_str()
        .unwrap()
        .contains("size_file = \"/etc/patchbay/pool/REALTIME_POOL_SIZE\""));
    assert_owned(&config);

    // 500 peak sessions over replicas.min = 2 before any observation.
    assert_eq!(pool["data"], json!({"REALTIME_POOL_SIZE": "250"}));
    assert_owned(&pool);

    assert_eq!(deployment["kind"], "Deployment");
    assert_eq!(
        deployment, dry_run,
        "the Deployment applied is the one dry-run"
    );
    assert!(
        deployment["spec"].get("replicas").is_none(),
        "the HPA owns replicas"
    );
    // Secrets are mounted files, never read by the operator nor versioned on the template.
    let template = &deployment["spec"]["template"];
    assert_eq!(
        template["metadata"]["annotations"]
            .as_object()
            .unwrap()
            .keys()
            .collect::<Vec<_>>(),
        ["patchbay.dev/config-hash"]
    );
    assert!(template["spec"]["containers"][0].get("env").is_none());
    assert_eq!(
        template["spec"]["volumes"][3]["secret"],
        json!({"secretName": "openai", "items": [{"key": "api-key", "path": "api-key"}], "optional": false})
    );
    assert_owned(&deployment);

    let [service, hpa, pdb] = expect_service_hpa_and_pdb(&mut server).await;
    assert_eq!(service["spec"]["ports"][0]["name"], "http");
    assert_owned(&service);

    assert_eq!(hpa["apiVersion"], "autoscaling/v2");
    assert_eq!(hpa["spec"]["minReplicas"], 2);
    assert_eq!(hpa["spec"]["maxReplicas"], 10);
    assert_owned(&hpa);

    assert_eq!(pdb["spec"]["maxUnavailable"], 1);
    assert_owned(&pdb);

    // 0 of 2 ready: the pods are looked at (none yet, so no events are read).
    expect_pods(&mut server, &[]).await;

    assert_eq!(
        server.expect_event().await,
        ("Normal".into(), "Created".into())
    );

    let (seen, reply) = server.expect(Method::PATCH, &status_path()).await;
    assert_eq!(seen.body["apiVersion"], "patchbay.dev/v1alpha1");
    assert_eq!(seen.body["kind"], "RealtimeRoute");
    let status = &seen.body["status"];
    assert_eq!(status["observedGeneration"], 1);
    assert_eq!(status["replicas"], 2);
    assert_eq!(status["readyReplicas"], 0);
    assert_eq!(status["poolSizePerPod"], 250);
    assert_eq!(
        status["endpoint"],
        format!("ws://{ROUTE_NAME}.{NAMESPACE}.svc:8080/v1/realtime")
    );
    assert_eq!(condition(status, "Ready")["status"], "False");
    assert_eq!(condition(status, "Degraded")["status"], "False");
    reply.ok(&patched(&route, &seen.body));

    let action = task.await.unwrap().expect("reconcile succeeds");
    assert_eq!(action, Action::requeue(NOT_READY_RESYNC_INTERVAL));
    server.expect_silence().await;
}

#[tokio::test]
async fn a_fixed_route_sets_replicas_and_deletes_the_hpa_it_owned() {
    let (ctx, mut server, _) = fixtures::mock_context();
    let mut spec = fixtures::autoscaled_spec();
    spec.replicas.max = Some(spec.replicas.min);
    let mut route = fixtures::route(spec);
    route.status = Some(crate::crd::RealtimeRouteStatus {
        pool_size_per_pod: Some(250),
        ..Default::default()
    });
    let existing = deployment_response(
        &serde_json::to_value(&desired(&route, Some(2)).deployment).unwrap(),
        2,
        2,
    );
    let task = tokio::spawn(reconcile(Arc::new(route.clone()), ctx));

    // The stale HPA: read by metadata with the other names, controlled by the route.
    let owned_hpa = metadata(&gw(), Some(ROUTE_UID));
    observe_with_hpa(&mut server, Some(&existing), &route.spec, Some(owned_hpa)).await;
    let applied = expect_applied_through_deployment(&mut server, 2, 2).await;
    assert_eq!(applied.pool["data"]["REALTIME_POOL_SIZE"], "250");
    assert_eq!(applied.deployment["spec"]["replicas"], 2);
    expect_apply(&mut server, &core("services", ROUTE_NAME)).await;

    // Deleted because the route controls it.
    let (seen, reply) = server
        .expect(Method::DELETE, &format!("{}?", hpa_path(&gw())))
        .await;
    assert_eq!(seen.body["propagationPolicy"], "Background");
    reply.ok(&json!({"kind": "Status", "apiVersion": "v1", "status": "Success"}));

    expect_apply(&mut server, &pdb_path(&gw())).await;
    assert_eq!(
        server.expect_event().await,
        ("Normal".into(), "AutoscalerRemoved".into())
    );
    let (seen, reply) = server.expect(Method::PATCH, &status_path()).await;
    assert_eq!(condition(&seen.body["status"], "Ready")["status"], "True");
    assert_eq!(
        condition(&seen.body["status"], "Progressing")["reason"],
        "RolloutComplete"
    );
    reply.ok(&patched(&route, &seen.body));
    task.await.unwrap().expect("reconcile succeeds");
    server.expect_silence().await;
}

#[tokio::test]
async fn an_hpa_the_route_does_not_own_is_left_alone() {
    let (ctx, mut server, _) = fixtures::mock_context();
    let route = fixtures::route(fixtures::minimal_spec());
    let task = tokio::spawn(reconcile(Arc::new(route.clone()), ctx));
    // A fixed-count route wants no HPA, so a foreign one of its name is no reason to refuse.
    let foreign_hpa = metadata(&gw(), None);
    observe_with_hpa(&mut server, None, &route.spec, Some(foreign_hpa)).await;
    expect_dry_run(&mut server).await;
    expect_config_maps(&mut server).await;
    expect_apply(&mut server, &apps(&gw())).await;
    // No DELETE: straight on from the Service to the PDB.
    expect_service_and_pdb(&mut server).await;
    expect_pods(&mut server, &[]).await;
    server.expect_event().await;
    let (seen, reply) = server.expect(Method::PATCH, &status_path()).await;
    reply.ok(&patched(&route, &seen.body));
    task.await.unwrap().expect("reconcile succeeds");
}

#[tokio::test]
async fn a_translations_route_applies_its_endpoint_and_reports_the_translation_path() {
    let (ctx, mut server, _) = fixtures::mock_context();
    let mut spec = fixtures::minimal_spec();
    spec.model = "gpt-realtime-translate".into();
    spec.endpoint = crate::crd::Endpoint::Translations;
    let route = fixtures::route(spec);
    let task = tokio::spawn(reconcile(Arc::new(route.clone()), ctx));
    observe(&mut server, None, &route.spec).await;
    let Applied { config, .. } = expect_applied_through_deployment(&mut server, 1, 0).await;
    let toml = config["data"]["gateway.toml"].as_str().unwrap();
    assert!(toml.contains("endpoint = \"translations\""), "{toml}");
    assert!(
        toml.contains("upstream_url = \"wss://api.openai.com/v1/realtime/translations\""),
        "{toml}"
    );
    expect_service_and_pdb(&mut server).await;
    expect_pods(&mut server, &[]).await;
    server.expect_event().await;
    let (seen, reply) = server.expect(Method::PATCH, &status_path()).await;
    assert_eq!(
        seen.body["status"]["endpoint"],
        format!("ws://{ROUTE_NAME}.{NAMESPACE}.svc:8080/v1/realtime/translations")
    );
    reply.ok(&patched(&route, &seen.body));
    task.await.unwrap().expect("reconcile succeeds");
}

#[tokio::test]
async fn a_scaled_deployment_resizes_only_the_pool_config_map() {
    let (ctx, mut server, _) = fixtures::mock_context();
    let mut route = fixtures::route(fixtures::autoscaled_spec());
    route.status = Some(crate::crd::RealtimeRouteStatus {
        pool_size_per_pod: Some(250),
        ..Default::default()
    });
    let at_two = desired(&route, Some(2));
    // The HPA scaled the Deployment to 5.
    let existing = deployment_response(&serde_json::to_value(&at_two.deployment).unwrap(), 5, 5);
    let task = tokio::spawn(reconcile(Arc::new(route.clone()), ctx));

    observe(&mut server, Some(&existing), &route.spec).await;
    let applied = expect_applied_through_deployment(&mut server, 5, 5).await;
    assert_eq!(
        applied.config,
        serde_json::to_value(&at_two.gateway_config).unwrap()
    );
    assert_eq!(applied.pool["data"]["REALTIME_POOL_SIZE"], "100");
    assert_eq!(
        applied.deployment,
        serde_json::to_value(&at_two.deployment).unwrap(),
        "the pod template is untouched by a scale event"
    );
    expect_service_hpa_and_pdb(&mut server).await;
    assert_eq!(
        server.expect_event().await,
        ("Normal".into(), "PoolResized".into())
    );
    let (seen, reply) = server.expect(Method::PATCH, &status_path()).await;
    assert_eq!(seen.body["status"]["poolSizePerPod"], 100);
    assert_eq!(seen.body["status"]["replicas"], 5);
    reply.ok(&patched(&route, &seen.body));
    let action = task.await.unwrap().expect("reconcile succeeds");
    assert_eq!(action, Action::requeue(RESYNC_INTERVAL), "every pod ready");
    server.expect_silence().await;
}

#[tokio::test]
async fn pods_stuck_on_a_missing_secret_make_the_route_degraded_pods_not_starting() {
    let (ctx, mut server, _) = fixtures::mock_context();
    let route = fixtures::route(fixtures::minimal_spec());
    let build = desired(&route, Some(1));
    let existing = deployment_response(&serde_json::to_value(&build.deployment).unwrap(), 1, 0);
    let task = tokio::spawn(reconcile(Arc::new(route.clone()), ctx));

    observe(&mut server, Some(&existing), &route.spec).await;
    expect_applied_through_deployment(&mut server, 1, 0).await;
    expect_service_and_pdb(&mut server).await;

    // What the kubelet recorded: the pod waits in ContainerCreating, its Secret volume failing.
    let pod: Value =
        serde_json::from_str(include_str!("../testdata/pod-secret-missing.json")).unwrap();
    expect_pods(&mut server, &[pod]).await;
    let events: Value =
        serde_json::from_str(include_str!("../testdata/events-secret-missing.json")).unwrap();
    expect_pod_events(&mut server, &events).await;

    assert_eq!(
        server.expect_event().await,
        ("Warning".into(), "PodsNotStarting".into())
    );
    let degraded = expect_degraded(&mut server, &route, &status_path(), "PodsNotStarting").await;
    let message = degraded["message"].as_str().unwrap();
    assert!(
        message.contains("secret \"openai\" not found")
            && message.contains("realtime/openai key \"api-key\" (upstream.apiKeySecretRef)"),
        "{message}"
    );
    // Not an error: the children are applied; the route is looked at again soon.
    let action = task.await.unwrap().expect("reconcile succeeds");
    assert_eq!(action, Action::requeue(NOT_READY_RESYNC_INTERVAL));
    server.expect_silence().await;
}

#[tokio::test]
async fn an_invalid_spec_is_degraded_with_a_reason_an_event_and_a_backoff() {
    let (ctx, mut server, registry) = fixtures::mock_context();
    let mut route = fixtures::route(fixtures::minimal_spec());
    fixtures::single(&mut route.spec).url = Some("https://api.openai.com/v1/realtime".into());
    let route = Arc::new(route);
    let task = tokio::spawn(reconcile(route.clone(), ctx.clone()));

    let (_, reply) = server.expect(Method::GET, &apps(&gw())).await;
    reply.not_found("deployment");
    assert_eq!(
        server.expect_event().await,
        ("Warning".into(), "InvalidSpec".into())
    );
    let degraded = expect_degraded(&mut server, &route, &status_path(), "InvalidSpec").await;
    assert!(degraded["message"]
        .as_str()
        .unwrap()
        .contains("upstream.url"));

    // No child was applied.
    let error = task
        .await
        .unwrap()
        .expect_err("an invalid spec fails the reconcile");
    server.expect_silence().await;
    assert_eq!(error.reason(), "InvalidSpec");

    assert_eq!(
        error_policy(route.clone(), &error, ctx.clone()),
        Action::requeue(Duration::from_secs(5))
    );
    assert_eq!(
        error_policy(route, &error, ctx),
        Action::requeue(Duration::from_secs(10)),
        "consecutive failures back off"
    );
    let text = metrics::encode(&registry);
    assert!(text.contains("patchbay_operator_reconcile_failures_total{reason=\"InvalidSpec\"} 2"));
}

#[tokio::test]
async fn a_route_name_that_cannot_name_a_service_is_invalid_and_applies_nothing() {
    let (ctx, mut server, _) = fixtures::mock_context();
    let mut route = fixtures::route(fixtures::minimal_spec());
    route.metadata.name = Some("v1.voice".into());
    let route = Arc::new(route);
    let task = tokio::spawn(reconcile(route.clone(), ctx.clone()));

    let (_, reply) = server.expect(Method::GET, &apps("v1.voice-gateway")).await;
    reply.not_found("deployment");
    assert_eq!(
        server.expect_event().await,
        ("Warning".into(), "InvalidSpec".into())
    );
    let status = format!(
        "/apis/patchbay.dev/v1alpha1/namespaces/{NAMESPACE}/realtimeroutes/v1.voice/status{APPLY}"
    );
    let degraded = expect_degraded(&mut server, &route, &status, "InvalidSpec").await;
    assert!(degraded["message"].as_str().unwrap().contains("v1.voice"));
    let error = task.await.unwrap().expect_err("an invalid name fails");
    assert_eq!(error.reason(), "InvalidSpec");
    server.expect_silence().await;
}

/// Reconcile a new autoscaled route whose `taken` child (kind, API path) exists and is
/// controlled by something else: the route is `Degraded=True/NameTaken` naming that object, and
/// nothing is applied.
async fn a_child_name_taken_by_someone_else(kind: &str, name: &str, taken: &str) {
    let (ctx, mut server, _) = fixtures::mock_context();
    let route = Arc::new(fixtures::route(fixtures::autoscaled_spec()));
    let task = tokio::spawn(reconcile(route.clone(), ctx.clone()));
    let foreign = |name: &str| {
        let mut meta = metadata(name, None);
        meta["metadata"]["ownerReferences"] = json!([{
            "apiVersion": "apps/v1", "kind": "Deployment", "name": "someone-else",
            "uid": "00000000-0000-4000-8000-00000000beef", "controller": true
        }]);
        meta
    };

    let (_, reply) = server.expect(Method::GET, &apps(&gw())).await;
    if taken == apps(&gw()) {
        let mut d = foreign(&gw());
        d["apiVersion"] = json!("apps/v1");
        d["kind"] = json!("Deployment");
        reply.ok(&d);
    } else {
        reply.not_found("deployment");
    }
    let claims = [
        core("configmaps", &gw()),
        core("configmaps", &format!("{ROUTE_NAME}-pool")),
        core("serviceaccounts", &gw()),
        rbac_path("roles", &format!("{}-pool", gw())),
        rbac_path("rolebindings", &format!("{}-pool", gw())),
        core("services", ROUTE_NAME),
        hpa_path(&gw()),
        pdb_path(&gw()),
    ];
    for path in claims.iter().filter(|_| taken != apps(&gw())) {
        let (_, reply) = server.expect(Method::GET, path).await;
        if *path == taken {
            reply.ok(&foreign(name));
            break;
        }
        reply.not_found("child");
    }
    assert_eq!(
        server.expect_event().await,
        ("Warning".into(), "NameTaken".into())
    );
    let degraded = expect_degraded(&mut server, &route, &status_path(), "NameTaken").await;
    let message = degraded["message"].as_str().unwrap();
    assert!(
        message.contains(&format!("{kind} {NAMESPACE}/{name} exists")),
        "{message}"
    );
    let error = task.await.unwrap().expect_err("a taken name fails");
    assert_eq!(error.reason(), "NameTaken");
    server.expect_silence().await; // nothing was applied
}

#[tokio::test]
async fn a_service_name_taken_by_someone_else_is_never_taken_over() {
    a_child_name_taken_by_someone_else("Service", ROUTE_NAME, &core("services", ROUTE_NAME)).await;
}

#[tokio::test]
async fn a_gateway_config_map_taken_by_someone_else_is_never_taken_over() {
    a_child_name_taken_by_someone_else("ConfigMap", &gw(), &core("configmaps", &gw())).await;
}

#[tokio::test]
async fn a_pool_config_map_taken_by_someone_else_is_never_taken_over() {
    let pool = format!("{ROUTE_NAME}-pool");
    a_child_name_taken_by_someone_else("ConfigMap", &pool, &core("configmaps", &pool)).await;
}

#[tokio::test]
async fn a_deployment_taken_by_someone_else_is_never_taken_over() {
    a_child_name_taken_by_someone_else("Deployment", &gw(), &apps(&gw())).await;
}

#[tokio::test]
async fn an_hpa_taken_by_someone_else_is_never_taken_over_by_an_autoscaled_route() {
    a_child_name_taken_by_someone_else("HorizontalPodAutoscaler", &gw(), &hpa_path(&gw())).await;
}

#[tokio::test]
async fn a_pdb_taken_by_someone_else_is_never_taken_over() {
    a_child_name_taken_by_someone_else("PodDisruptionBudget", &gw(), &pdb_path(&gw())).await;
}

#[tokio::test]
async fn a_fixed_route_becoming_autoscaled_hands_its_replicas_off_before_dropping_them() {
    let (ctx, mut server, _) = fixtures::mock_context();
    let route = fixtures::route(fixtures::autoscaled_spec());
    // The Deployment as the fixed-count route left it: 4 replicas, owned by our apply.
    let mut fixed_route = route.clone();
    fixed_route.spec.replicas.max = Some(4);
    fixed_route.spec.replicas.min = 4;
    let mut existing = serde_json::to_value(&desired(&fixed_route, Some(4)).deployment).unwrap();
    existing["metadata"]["managedFields"] = json!([{
        "manager": "patchbay-operator", "operation": "Apply", "apiVersion": "apps/v1",
        "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {"f:replicas": {}, "f:template": {}}}
    }]);
    let existing = deployment_response(&existing, 4, 4);
    let task = tokio::spawn(reconcile(Arc::new(route.clone()), ctx));
    observe(&mut server, Some(&existing), &route.spec).await;
    expect_dry_run(&mut server).await;
    expect_config_maps(&mut server).await;

    // First another manager applies the same count, so the field keeps an owner…
    let (seen, reply) = server
        .expect(
            Method::PATCH,
            &format!("{}?&fieldManager=patchbay-operator-handoff", apps(&gw())),
        )
        .await;
    assert_eq!(seen.body["spec"], json!({"replicas": 4}));
    reply.ok(&existing);
    // …then the operator's apply leaves replicas out.
    let (seen, reply) = server
        .expect(Method::PATCH, &format!("{}{APPLY}", apps(&gw())))
        .await;
    assert!(seen.body["spec"].get("replicas").is_none());
    reply.ok(&existing);
    task.abort();
}

#[tokio::test]
async fn an_api_server_that_does_not_answer_times_out_and_is_counted() {
    let (mut ctx, mut server, registry) = fixtures::mock_context();
    Arc::get_mut(&mut ctx).unwrap().api_timeout = Duration::from_millis(50);
    let route: Arc<RealtimeRoute> = Arc::new(fixtures::route(fixtures::minimal_spec()));
    let task = tokio::spawn(reconcile(route, ctx));
    let (_seen, reply) = server.next().await; // never answered
    let error = task.await.unwrap().expect_err("timed out");
    drop(reply);
    assert_eq!(error.reason(), "ApiTimeout");
    let text = metrics::encode(&registry);
    assert!(text.contains(
        "patchbay_operator_api_calls_total{verb=\"get\",kind=\"Deployment\",outcome=\"timeout\"} 1"
    ));
}

#[tokio::test]
async fn an_api_error_fails_the_reconcile_with_its_facts() {
    let (ctx, mut server, _) = fixtures::mock_context();
    let route = fixtures::route(fixtures::minimal_spec());
    let task = tokio::spawn(reconcile(Arc::new(route.clone()), ctx));
    observe(&mut server, None, &route.spec).await;
    expect_dry_run(&mut server).await;
    let (_, reply) = server
        .expect(
            Method::PATCH,
            &format!("{}{APPLY}", core("configmaps", &gw())),
        )
        .await;
    reply.json(
        StatusCode::FORBIDDEN,
        &json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                "message": "configmaps is forbidden", "reason": "Forbidden", "code": 403}),
    );
    let error = task.await.unwrap().expect_err("forbidden");
    assert_eq!(error.reason(), "ApiError");
    assert!(error.to_string().contains("apply ConfigMap voice-gateway"));
    server.expect_silence().await;
}

/// Reconcile `edited` over the children `original` built (all pods ready); returns the applied
/// gateway ConfigMap and Deployment bodies, the events, and the children `original` had.
async fn reconcile_an_edit(
    original: RealtimeRouteSpec,
    edited: RealtimeRouteSpec,
) -> (Value, Value, Vec<(String, String)>, crate::build::Desired) {
    let (ctx, mut server, _) = fixtures::mock_context();
    let mut route = fixtures::route(original);
    let before = desired(&route, Some(2));
    route.status = Some(crate::crd::RealtimeRouteStatus {
        pool_size_per_pod: Some(before.pool_size),
        ..Default::default()
    });
    route.spec = edited;
    let existing = deployment_response(&serde_json::to_value(&before.deployment).unwrap(), 2, 2);
    let task = tokio::spawn(reconcile(Arc::new(route.clone()), ctx));
    observe(&mut server, Some(&existing), &route.spec).await;
    let Applied {
        config, deployment, ..
    } = expect_applied_through_deployment(&mut server, 2, 2).await;
    expect_service_hpa_and_pdb(&mut server).await;
    let mut events = Vec::new();
    loop {
        let (seen, reply) = server.next().await;
        if seen.uri.contains("/events") {
            events.push((
                seen.body["type"].as_str().unwrap_or_default().to_string(),
                seen.body["reason"].as_str().unwrap_or_default().to_string(),
            ));
            reply.ok(&seen.body);
            continue;
        }
        assert_eq!(seen.uri, status_path());
        reply.ok(&patched(&route, &seen.body));
        break;
    }
    task.await.unwrap().expect("reconcile succeeds");
    server.expect_silence().await;
    (config, deployment, events, before)
}

#[tokio::test]
async fn a_price_and_flush_interval_edit_changes_the_config_map_and_not_the_pod_template() {
    let original = fixtures::full_spec();
    let mut edited = original.clone();
    edited.metering.prices[0].audio_output = 80.0;
    edited.metering.flush_seconds = 5;
    let (config, deployment, events, before) = reconcile_an_edit(original, edited).await;
    let toml = config["data"]["gateway.toml"].as_str().unwrap();
    assert!(
        toml.contains("audio_output = 80.0") && toml.contains("flush_secs = 5"),
        "{toml}"
    );
    assert_ne!(
        config,
        serde_json::to_value(&before.gateway_config).unwrap()
    );
    assert_eq!(
        deployment,
        serde_json::to_value(&before.deployment).unwrap(),
        "the pod template (and so every live call) is untouched"
    );
    assert!(events.is_empty(), "no ConfigChanged: {events:?}");
}

#[tokio::test]
async fn an_upstream_url_edit_changes_the_pod_template() {
    let original = fixtures::full_spec();
    let mut edited = original.clone();
    fixtures::single(&mut edited).url = Some("wss://eu.api.openai.com/v1/realtime".into());
    let (config, deployment, events, before) = reconcile_an_edit(original, edited).await;
    assert!(config["data"]["gateway.toml"]
        .as_str()
        .unwrap()
        .contains("wss://eu.api.openai.com/v1/realtime"));
    let hash = |d: &Value| {
        d["spec"]["template"]["metadata"]["annotations"]["patchbay.dev/config-hash"].clone()
    };
    assert_ne!(
        hash(&deployment),
        hash(&serde_json::to_value(&before.deployment).unwrap())
    );
    assert_eq!(
        events,
        [("Normal".to_string(), "ConfigChanged".to_string())]
    );
}

#[tokio::test]
async fn a_listed_route_applies_its_upstreams_and_signing_keys_as_config_and_mounted_files() {
    let (ctx, mut server, _) = fixtures::mock_context();
    let route = fixtures::route(fixtures::two_upstream_spec());
    let task = tokio::spawn(reconcile(Arc::new(route.clone()), ctx));

    observe(&mut server, None, &route.spec).await;
    let Applied {
        config, deployment, ..
    } = expect_applied_through_deployment(&mut server, 2, 0).await;
    let doc: toml::Table =
        toml::from_str(config["data"]["gateway.toml"].as_str().unwrap()).unwrap();
    let ups = doc["routes"][0]["upstreams"].as_array().unwrap();
    let files: Vec<(&str, &str)> = ups
        .iter()
        .map(|u| {
            (
                u["name"].as_str().unwrap(),
                u["api_key_file"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        files,
        [
            ("openai", "/etc/patchbay/upstreams/openai/api-key"),
            ("azure-eastus", "/etc/patchbay/upstreams/azure/key")
        ]
    );
    assert_eq!(
        doc["client_secrets"]["signing_key_files"][0].as_str(),
        Some("/etc/patchbay/signing-keys/current")
    );

    let template = &deployment["spec"]["template"];
    let volumes = template["spec"]["volumes"].as_array().unwrap();
    let secret = |name: &str| {
        volumes
            .iter()
            .find(|v| v["name"] == name)
            .map(|v| v["secret"].clone())
            .unwrap_or_else(|| panic!("volume {name}"))
    };
    assert_eq!(
        secret("upstreams-0"),
        json!({"secretName": "openai", "items": [
            {"key": "api-key", "path": "api-key"}, {"key": "ca.pem", "path": "ca.pem"}
        ], "optional": false})
    );
    assert_eq!(
        secret("upstreams-1"),
        json!({"secretName": "azure", "items": [{"key": "key", "path": "key"}], "optional": false})
    );
    assert_eq!(
        secret("signing-keys"),
        json!({"secretName": "signing", "items": [
            {"key": "current", "path": "current"}, {"key": "previous", "path": "previous"}
        ], "optional": false})
    );
    assert!(volumes.iter().all(|v| v["name"] != "upstream-key"));

    expect_service_hpa_and_pdb(&mut server).await;
    expect_pods(&mut server, &[]).await;
    assert_eq!(
        server.expect_event().await,
        ("Normal".into(), "Created".into())
    );
    let (seen, reply) = server.expect(Method::PATCH, &status_path()).await;
    assert_eq!(
        condition(&seen.body["status"], "Degraded")["status"],
        "False"
    );
    reply.ok(&patched(&route, &seen.body));
    task.await.unwrap().expect("reconcile succeeds");
    server.expect_silence().await;
}

#[tokio::test]
async fn a_route_mixing_upstream_protocols_is_degraded_naming_it_and_applies_nothing() {
    let (ctx, mut server, _) = fixtures::mock_context();
    let mut spec = fixtures::two_upstream_spec();
    spec.upstreams[1].protocol = crate::crd::Protocol::Beta;
    let route = Arc::new(fixtures::route(spec));
    let task = tokio::spawn(reconcile(route.clone(), ctx));

    let (_, reply) = server.expect(Method::GET, &apps(&gw())).await;
    reply.not_found("deployment");
    assert_eq!(
        server.expect_event().await,
        ("Warning".into(), "InvalidSpec".into())
    );
    let degraded = expect_degraded(&mut server, &route, &status_path(), "InvalidSpec").await;
    let message = degraded["message"].as_str().unwrap();
    assert!(
        message.contains("\"gpt-realtime\" mixes protocols"),
        "{message}"
    );
    let error = task.await.unwrap().expect_err("an invalid spec fails");
    assert_eq!(error.reason(), "InvalidSpec");
    server.expect_silence().await;
}

#[tokio::test]
async fn a_route_being_deleted_is_left_to_the_garbage_collector() {
    let (ctx, mut server, _) = fixtures::mock_context();
    let mut route = fixtures::route(fixtures::autoscaled_spec());
    // A foreground (or orphaning) delete: the route lingers while the collector works.
    route.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
        "2026-12-01T10:00:00Z".parse().unwrap(),
    ));
    route.metadata.finalizers = Some(vec!["foregroundDeletion".into()]);
    let task = tokio::spawn(reconcile(Arc::new(route), ctx));
    // No read, no apply, no status: nothing re-adds an owner reference or re-creates a child.
    server.expect_silence().await;
    let action = task.await.unwrap().expect("nothing to do");
    assert_eq!(action, Action::await_change());
}

/// A route whose generation 1 is applied and running (2 of 2 pods ready), edited into
/// generation 2 by `edit`; returns it with the Deployment of generation 1 as the API server
/// holds it.
fn a_running_route_edited(edit: impl FnOnce(&mut RealtimeRouteSpec)) -> (RealtimeRoute, Value) {
    let mut route = fixtures::route(fixtures::full_spec());
    let applied = desired(&route, Some(2));
    route.status = Some(crate::crd::RealtimeRouteStatus {
        observed_generation: Some(1),
        pool_size_per_pod: Some(applied.pool_size),
        ..Default::default()
    });
    route.metadata.generation = Some(2);
    edit(&mut route.spec);
    let existing = deployment_response(&serde_json::to_value(&applied.deployment).unwrap(), 2, 2);
    (route, existing)
}

/// The status patch of a refused generation 2 of a running route: `Degraded=True/InvalidSpec`
/// with a message containing `says`, the rollout `Blocked`, generation 1 still the observed one.
async fn expect_refused_edit(server: &mut ApiServer, route: &RealtimeRoute, says: &str) {
    assert_eq!(
        server.expect_event().await,
        ("Warning".into(), "InvalidSpec".into())
    );
    let (seen, reply) = server.expect(Method::PATCH, &status_path()).await;
    let status = &seen.body["status"];
    let degraded = condition(status, "Degraded");
    assert_eq!(
        (&degraded["status"], &degraded["reason"]),
        (&json!("True"), &json!("InvalidSpec"))
    );
    let message = degraded["message"].as_str().unwrap();
    assert!(message.contains(says), "{message}");
    let progressing = condition(status, "Progressing");
    assert_eq!(
        (&progressing["status"], &progressing["reason"]),
        (&json!("False"), &json!("Blocked")),
        "a refused spec blocks the rollout even though a Deployment exists"
    );
    assert_eq!(
        status["observedGeneration"], 1,
        "generation 2 was not applied"
    );
    assert_eq!(
        condition(status, "Ready")["status"],
        "True",
        "the old pods serve"
    );
    reply.ok(&patched(route, &seen.body));
}

#[tokio::test]
async fn a_deployment_the_api_server_refuses_is_invalid_spec_and_nothing_is_written() {
    let (ctx, mut server, _) = fixtures::mock_context();
    // A restart setting and a toleration the schema (an open object) lets through and the API
    // server refuses.
    let (route, existing) = a_running_route_edited(|spec| {
        fixtures::single(spec).url = Some("wss://eu.api.openai.com/v1/realtime".into());
        spec.gateway.tolerations = Some(crate::crd::Open::new(&vec![
            k8s_openapi::api::core::v1::Toleration {
                key: Some("realtime".into()),
                operator: Some("Sometimes".into()),
                ..Default::default()
            },
        ]));
    });
    let task = tokio::spawn(reconcile(Arc::new(route.clone()), ctx));
    observe(&mut server, Some(&existing), &route.spec).await;

    let (seen, reply) = server
        .expect(Method::PATCH, &format!("{}{DRY_RUN_APPLY}", apps(&gw())))
        .await;
    assert_eq!(
        seen.body["spec"]["template"]["spec"]["tolerations"][0]["operator"],
        "Sometimes"
    );
    let refusal = "Deployment.apps \"voice-gateway\" is invalid: \
                   spec.template.spec.tolerations[0].operator: Unsupported value: \"Sometimes\": \
                   supported values: \"Equal\", \"Exists\"";
    reply.json(
        StatusCode::UNPROCESSABLE_ENTITY,
        &json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                "message": refusal, "reason": "Invalid", "code": 422}),
    );
    // No ConfigMap is written: the new upstream URL never reaches gateway.toml ahead of a pod
    // template that cannot roll.
    expect_refused_edit(
        &mut server,
        &route,
        &format!("the API server refused Deployment voice-gateway: {refusal}"),
    )
    .await;
    let error = task.await.unwrap().expect_err("a refused Deployment fails");
    assert_eq!(error.reason(), "InvalidSpec");
    server.expect_silence().await;
}

#[tokio::test]
async fn a_child_the_api_server_refuses_after_the_dry_run_is_invalid_spec_too() {
    let (ctx, mut server, _) = fixtures::mock_context();
    let route = fixtures::route(fixtures::minimal_spec());
    let task = tokio::spawn(reconcile(Arc::new(route.clone()), ctx));
    observe(&mut server, None, &route.spec).await;
    expect_dry_run(&mut server).await;
    expect_config_maps(&mut server).await;
    let (_, reply) = server
        .expect(Method::PATCH, &format!("{}{APPLY}", apps(&gw())))
        .await;
    reply.json(
        StatusCode::BAD_REQUEST,
        &json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                "message": "invalid image reference", "reason": "BadRequest", "code": 400}),
    );
    assert_eq!(
        server.expect_event().await,
        ("Warning".into(), "InvalidSpec".into())
    );
    let degraded = expect_degraded(&mut server, &route, &status_path(), "InvalidSpec").await;
    assert!(degraded["message"]
        .as_str()
        .unwrap()
        .contains("refused Deployment voice-gateway: invalid image reference"));
    let error = task.await.unwrap().expect_err("refused");
    assert_eq!(error.reason(), "InvalidSpec");
    server.expect_silence().await;
}

#[tokio::test]
async fn a_secret_key_that_would_be_a_path_out_of_the_mount_is_refused_before_any_apply() {
    let (ctx, mut server, _) = fixtures::mock_context();
    let (route, existing) = a_running_route_edited(|spec| {
        fixtures::single(spec).api_key_secret_ref.key = "../k".into();
    });
    let task = tokio::spawn(reconcile(Arc::new(route.clone()), ctx));
    let (_, reply) = server.expect(Method::GET, &apps(&gw())).await;
    reply.ok(&existing);
    expect_refused_edit(
        &mut server,
        &route,
        "upstream.apiKeySecretRef key \"../k\" is not a Secret key",
    )
    .await;
    let error = task.await.unwrap().expect_err("an invalid key fails");
    assert_eq!(error.reason(), "InvalidSpec");
    server.expect_silence().await;
}

#[tokio::test]
async fn a_failed_look_into_the_pods_keeps_the_last_diagnosis_and_the_reconcile_succeeds() {
    let (ctx, mut server, _) = fixtures::mock_context();
    let mut route = fixtures::route(fixtures::minimal_spec());
    let build = desired(&route, Some(1));
    let said = "1 of 1 gateway pods are not starting: pod voice-gateway-x: FailedMount: …";
    route.status = Some(crate::crd::RealtimeRouteStatus {
        observed_generation: Some(1),
        pool_size_per_pod: Some(build.pool_size),
        conditions: vec![crate::crd::RouteCondition {
            type_: "Degraded".into(),
            status: "True".into(),
            reason: "PodsNotStarting".into(),
            message: said.into(),
            last_transition_time: "2026-12-01T10:00:00Z".into(),
            observed_generation: Some(1),
        }],
        ..Default::default()
    });
    let existing = deployment_response(&serde_json::to_value(&build.deployment).unwrap(), 1, 0);
    let task = tokio::spawn(reconcile(Arc::new(route.clone()), ctx));
    observe(&mut server, Some(&existing), &route.spec).await;
    expect_applied_through_deployment(&mut server, 1, 0).await;
    expect_service_and_pdb(&mut server).await;

    let (_, reply) = server.expect(Method::GET, &pods_uri()).await;
    reply.json(
        StatusCode::INTERNAL_SERVER_ERROR,
        &json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                "message": "etcdserver: request timed out", "reason": "InternalError", "code": 500}),
    );
    // No `Recovered` event: not being able to look is not a recovery. The status says what it said.
    let degraded = expect_degraded(&mut server, &route, &status_path(), "PodsNotStarting").await;
    assert_eq!(degraded["message"], said);
    assert_eq!(
        degraded["lastTransitionTime"], "2026-12-01T10:00:00Z",
        "unchanged"
    );
    let action = task
        .await
        .unwrap()
        .expect("the children are applied: the reconcile succeeds");
    assert_eq!(action, Action::requeue(NOT_READY_RESYNC_INTERVAL));
    server.expect_silence().await;
}

/// Reconcile a new route whose spec the operator refuses: `Degraded=True/InvalidSpec` with a
/// message containing `why`, a `Warning` event, and nothing applied.
async fn an_unservable_spec_applies_nothing(spec: RealtimeRouteSpec, why: &str) {
    let (ctx, mut server, _) = fixtures::mock_context();
    let route = Arc::new(fixtures::route(spec));
    let task = tokio::spawn(reconcile(route.clone(), ctx));

    let (_, reply) = server.expect(Method::GET, &apps(&gw())).await;
    reply.not_found("deployment");
    assert_eq!(
        server.expect_event().await,
        ("Warning".into(), "InvalidSpec".into())
    );
    let degraded = expect_degraded(&mut server, &route, &status_path(), "InvalidSpec").await;
    let message = degraded["message"].as_str().unwrap();
    assert!(message.contains(why), "{message}");
    let error = task.await.unwrap().expect_err("an unservable spec fails");
    assert_eq!(error.reason(), "InvalidSpec");
    server.expect_silence().await;
}

#[tokio::test]
async fn a_pod_label_that_would_move_the_pods_out_of_the_selector_is_invalid_and_applies_nothing() {
    let mut spec = fixtures::autoscaled_spec();
    spec.gateway
        .pod_labels
        .insert("app.kubernetes.io/instance".into(), "other".into());
    an_unservable_spec_applies_nothing(
        spec,
        "gateway.podLabels sets \"app.kubernetes.io/instance\"",
    )
    .await;
}

#[tokio::test]
async fn a_price_the_gateway_would_refuse_at_start_is_invalid_and_applies_nothing() {
    let mut spec = fixtures::full_spec();
    spec.metering.prices[0].audio_output = 2e6;
    an_unservable_spec_applies_nothing(spec, "metering.prices[0].audioOutput 2000000").await;
}

#[tokio::test]
async fn pod_overrides_are_applied_on_the_deployments_pod_template() {
    let (ctx, mut server, _) = fixtures::mock_context();
    let route = fixtures::route(fixtures::full_spec());
    let task = tokio::spawn(reconcile(Arc::new(route.clone()), ctx));

    observe(&mut server, None, &route.spec).await;
    let Applied { deployment, .. } = expect_applied_through_deployment(&mut server, 2, 0).await;
    let template = &deployment["spec"]["template"];
    assert_eq!(template["metadata"]["labels"]["team"], "voice");
    assert_eq!(
        template["metadata"]["labels"]["app.kubernetes.io/instance"],
        ROUTE_NAME
    );
    assert_eq!(
        template["metadata"]["annotations"]["prometheus.io/scrape"],
        "true"
    );
    let pod = &template["spec"];
    assert_eq!(pod["imagePullSecrets"], json!([{"name": "regcred"}]));
    assert_eq!(pod["priorityClassName"], "realtime-critical");
    assert_eq!(pod["containers"][0]["imagePullPolicy"], "IfNotPresent");
    assert_eq!(
        pod["topologySpreadConstraints"][0]["labelSelector"]["matchLabels"],
        json!({"app.kubernetes.io/instance": ROUTE_NAME, "app.kubernetes.io/name": "patchbay-gateway"})
    );
    task.abort();
}

mod expose;
