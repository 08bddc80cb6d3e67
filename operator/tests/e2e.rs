//! End-to-end suite against a real cluster; runs only when `PATCHBAY_E2E_KUBECONFIG` names a
//! kubeconfig (kind or k3d: see docs/operator.md), otherwise it says why it skips and passes.
//!
//! It applies `crds/`, creates a throwaway namespace with `examples/secrets.yaml` and `examples/realtimeroute.yaml` (Secrets
//! and route), runs the controller in-process against that namespace and checks: every child
//! exists and is owned by the route, the status, the pool ConfigMap after the Deployment's replica
//! count changes, and that deleting the route leaves no children (owner references at work).
//! The gateway image need not be pullable: pods count in `status.replicas` before they run.

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret, Service};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client, Config, CustomResourceExt, ResourceExt};
use patchbay_operator::crd::RealtimeRoute;
use patchbay_operator::metrics::Metrics;
use patchbay_operator::{controller, Context};
use serde::Deserialize;
use tokio_util::sync::CancellationToken;

const ENV: &str = "PATCHBAY_E2E_KUBECONFIG";
const MANAGER: &str = "patchbay-e2e";
const WAIT: Duration = Duration::from_secs(120);

fn repo(path: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(path)
}

fn yaml_docs(path: &PathBuf) -> Vec<serde_yaml::Value> {
    let text = std::fs::read_to_string(path).expect("manifest");
    serde_yaml::Deserializer::from_str(&text)
        .map(|doc| serde_yaml::Value::deserialize(doc).expect("YAML document"))
        .filter(|doc| !doc.is_null())
        .collect()
}

/// Poll `check` every second until it yields a value or [`WAIT`] passes.
async fn eventually<T, F, Fut>(what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

async fn client_from(path: &str) -> Client {
    let kubeconfig = Kubeconfig::read_from(path).expect("readable kubeconfig");
    let config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .expect("usable kubeconfig");
    Client::try_from(config).expect("client")
}

async fn install_crds(client: &Client) {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for entry in std::fs::read_dir(repo("crds")).expect("crds/") {
        let path = entry.expect("crds/ entry").path();
        for doc in yaml_docs(&path) {
            let crd: CustomResourceDefinition = serde_yaml::from_value(doc).expect("a CRD");
            crds.patch(
                &crd.name_any(),
                &PatchParams::apply(MANAGER).force(),
                &Patch::Apply(&crd),
            )
            .await
            .expect("apply CRD");
        }
    }
    let name = RealtimeRoute::crd_name();
    eventually("the CRD to be established", || async {
        let crd = crds.get(name).await.ok()?;
        let established = crd
            .status?
            .conditions?
            .iter()
            .any(|c| c.type_ == "Established" && c.status == "True");
        established.then_some(())
    })
    .await;
}

async fn apply_example(client: &Client, namespace: &str) -> RealtimeRoute {
    let mut route = None;
    let docs = yaml_docs(&repo("examples/secrets.yaml"))
        .into_iter()
        .chain(yaml_docs(&repo("examples/realtimeroute.yaml")));
    for doc in docs {
        match doc["kind"].as_str() {
            Some("Secret") => {
                let secret: Secret = serde_yaml::from_value(doc).expect("Secret");
                let api: Api<Secret> = Api::namespaced(client.clone(), namespace);
                api.create(&PostParams::default(), &secret)
                    .await
                    .expect("create Secret");
            }
            Some("RealtimeRoute") => {
                let r: RealtimeRoute = serde_yaml::from_value(doc).expect("route");
                let api: Api<RealtimeRoute> = Api::namespaced(client.clone(), namespace);
                route = Some(
                    api.create(&PostParams::default(), &r)
                        .await
                        .expect("create route"),
                );
            }
            other => panic!("unexpected kind {other:?} in the example"),
        }
    }
    route.expect("a route in the example")
}

fn owned_by(
    meta_owner: &[k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference],
    route: &RealtimeRoute,
) -> bool {
    meta_owner
        .iter()
        .any(|o| o.controller == Some(true) && Some(&o.uid) == route.metadata.uid.as_ref())
}

#[tokio::test]
async fn a_route_on_a_real_cluster_gets_its_children_status_pool_resizes_and_cleanup() {
    let Ok(kubeconfig) = std::env::var(ENV) else {
        eprintln!("skipping the end-to-end suite: set {ENV} to a kubeconfig of a throwaway cluster (see docs/operator.md)");
        return;
    };
    let client = client_from(&kubeconfig).await;
    install_crds(&client).await;

    let namespace = format!(
        "patchbay-e2e-{}",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs()
    );
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let ns: Namespace =
        serde_json::from_value(serde_json::json!({"metadata": {"name": namespace}})).unwrap();
    namespaces
        .create(&PostParams::default(), &ns)
        .await
        .expect("create namespace");

    let route = apply_example(&client, &namespace).await;
    let name = route.name_any();
    let peak = route.spec.peak_concurrency;

    let shutdown = CancellationToken::new();
    let ctx = Arc::new(Context::new(
        client.clone(),
        Metrics::default(),
        "patchbay/gateway:0.1.0".into(),
        Some("e2e".into()),
    ));
    let stop = shutdown.clone();
    let controller = tokio::spawn(controller::run(ctx, Some(namespace.clone()), async move {
        stop.cancelled().await
    }));

    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), &namespace);
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &namespace);
    let services: Api<Service> = Api::namespaced(client.clone(), &namespace);
    let hpas: Api<HorizontalPodAutoscaler> = Api::namespaced(client.clone(), &namespace);
    let pdbs: Api<PodDisruptionBudget> = Api::namespaced(client.clone(), &namespace);
    let routes: Api<RealtimeRoute> = Api::namespaced(client.clone(), &namespace);
    let gateway = format!("{name}-gateway");
    let pool = format!("{name}-pool");

    // Children exist and are owned by the route.
    let gateway_cm = eventually("the gateway ConfigMap", || async {
        config_maps.get_opt(&gateway).await.ok().flatten()
    })
    .await;
    assert!(owned_by(gateway_cm.owner_references(), &route));
    assert!(gateway_cm.data.unwrap()["gateway.toml"].contains("[drain]"));
    let deployment = eventually("the Deployment", || async {
        deployments.get_opt(&gateway).await.ok().flatten()
    })
    .await;
    assert!(owned_by(deployment.owner_references(), &route));
    let service = eventually("the Service", || async {
        services.get_opt(&name).await.ok().flatten()
    })
    .await;
    assert!(owned_by(service.owner_references(), &route));
    let hpa = eventually("the HPA", || async {
        hpas.get_opt(&gateway).await.ok().flatten()
    })
    .await;
    assert!(owned_by(hpa.owner_references(), &route));
    let pdb = eventually("the PDB", || async {
        pdbs.get_opt(&gateway).await.ok().flatten()
    })
    .await;
    assert!(owned_by(pdb.owner_references(), &route));

    // Status.
    let status = eventually("the route status", || async {
        let r = routes.get(&name).await.ok()?;
        let status = r.status.clone()?;
        (status.observed_generation == r.metadata.generation).then_some(status)
    })
    .await;
    assert_eq!(
        status.endpoint.as_deref(),
        Some(format!("ws://{name}.{namespace}.svc:8080/v1/realtime").as_str())
    );
    assert!(status.pool_size_per_pod.is_some());
    for type_ in ["Ready", "Progressing", "Degraded"] {
        assert!(
            status.conditions.iter().any(|c| c.type_ == type_),
            "{type_}"
        );
    }
    assert!(status
        .conditions
        .iter()
        .any(|c| c.type_ == "Degraded" && c.status == "False"));

    // Scale the Deployment as an HPA would; the pool ConfigMap follows, the template does not.
    let template_before = deployments
        .get(&gateway)
        .await
        .unwrap()
        .spec
        .unwrap()
        .template;
    let scaled = 4;
    deployments
        .patch_scale(
            &gateway,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"replicas": scaled}})),
        )
        .await
        .expect("scale the Deployment");
    let expected = ((peak + scaled - 1) / scaled).to_string();
    eventually("the pool ConfigMap to follow the replicas", || async {
        let d = deployments.get(&gateway).await.ok()?;
        let observed = d.status?.replicas?;
        let cm = config_maps.get(&pool).await.ok()?;
        let size = cm.data?.get("REALTIME_POOL_SIZE")?.clone();
        (observed == scaled && size == expected).then_some(())
    })
    .await;
    let template_after = deployments
        .get(&gateway)
        .await
        .unwrap()
        .spec
        .unwrap()
        .template;
    assert_eq!(
        template_before, template_after,
        "a scale event never touches the pod template"
    );
    eventually("the status to report the new pool size", || async {
        let status = routes.get(&name).await.ok()?.status?;
        (status.pool_size_per_pod == Some(expected.parse().unwrap())).then_some(())
    })
    .await;

    // Deleting the route leaves no children.
    routes
        .delete(&name, &DeleteParams::default())
        .await
        .expect("delete route");
    eventually("the children to be garbage-collected", || async {
        let gone = config_maps.get_opt(&gateway).await.ok()?.is_none()
            && config_maps.get_opt(&pool).await.ok()?.is_none()
            && deployments.get_opt(&gateway).await.ok()?.is_none()
            && services.get_opt(&name).await.ok()?.is_none()
            && hpas.get_opt(&gateway).await.ok()?.is_none()
            && pdbs.get_opt(&gateway).await.ok()?.is_none();
        gone.then_some(())
    })
    .await;

    shutdown.cancel();
    controller.await.expect("controller stops");
    namespaces
        .delete(&namespace, &DeleteParams::default())
        .await
        .expect("delete namespace");
}
